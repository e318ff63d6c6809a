//! The one error type of this crate: which file, which step, what the OS said, and what to do.

use std::io;
use std::path::{Path, PathBuf};

/// A failed write, symlink replacement or stale-temp cleanup.
///
/// The message names the target file (not the temp file, which the user never asked for), the step
/// that failed and, for the errors a user can act on, a hint: `cannot write /etc/cdi/nvidia.yaml:
/// create temporary file failed: Permission denied (os error 13) (this user may not write there: ...)`.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {}: {step} failed: {source}{}", path.display(), hint(source))]
pub struct WriteError {
    /// The file being replaced.
    pub path: PathBuf,
    /// The step that failed, in words: `create directory`, `create temporary file`, `write`,
    /// `chown`, `chmod`, `fsync`, `rename`, ... (stable: callers use it as an operation name).
    pub step: &'static str,
    /// What the OS said.
    pub source: io::Error,
}

impl WriteError {
    pub(crate) fn new(path: &Path, step: &'static str, source: io::Error) -> Self {
        WriteError { path: path.to_owned(), step, source }
    }
}

/// What a user can do about the errors that have a usual cause; empty for the others.
fn hint(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::PermissionDenied => {
            " (this user may not write there: run as root, or choose a directory this user owns)"
        }
        io::ErrorKind::ReadOnlyFilesystem => {
            " (the file system is mounted read-only: remount it read-write, or choose another directory)"
        }
        io::ErrorKind::NotADirectory => " (a path component is a file, not a directory)",
        io::ErrorKind::NotFound => " (the directory does not exist: create it first)",
        io::ErrorKind::IsADirectory => {
            " (a directory has the file's name: remove it, or choose another file name)"
        }
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => {
            " (the file system is full: free some space and retry)"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_path_step_and_a_hint() {
        let err = WriteError::new(
            Path::new("/etc/cdi/nvidia.yaml"),
            "create temporary file",
            io::Error::from_raw_os_error(libc_erofs()),
        );
        let text = err.to_string();
        assert!(
            text.starts_with("cannot write /etc/cdi/nvidia.yaml: create temporary file failed: "),
            "{text}"
        );
        assert!(
            text.ends_with(
                "(the file system is mounted read-only: remount it read-write, or choose another directory)"
            ),
            "{text}"
        );
    }

    #[test]
    fn errors_without_a_usual_cause_get_no_hint() {
        let err = WriteError::new(Path::new("f"), "write", io::Error::other("disk on fire"));
        assert_eq!(err.to_string(), "cannot write f: write failed: disk on fire");
    }

    /// EROFS, spelled through nix so the test does not hard-code the number.
    fn libc_erofs() -> i32 {
        nix::errno::Errno::EROFS as i32
    }
}
