//! File operations the installer relies on: atomic replace, hashing, and the fault-injection
//! test hook.
//!
//! Every file others read (containerd's config, our drop-in, the CDI spec, binaries) is written
//! to a temp file in the same directory, synced, and renamed over the target (`nvinject-fsio`),
//! so a reader or a kill -9 at any moment sees either the old or the new bytes, never a mix.

use std::fs;
use std::path::Path;

use nvinject_fsio::{Durability, WriteError, WriteOptions};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::paths::{HostRoot, split};

/// Environment variable of the fault-injection test hook: `N` makes the installer kill itself
/// with SIGKILL at its N-th fault point (each atomic write has two: temp file written, and
/// renamed into place). Tests use it to prove that a kill at any point leaves every config file
/// parseable and that the next run converges. Never set it in production.
pub const FAULT_ENV: &str = "NVINJECT_INSTALLER_FAULT_AFTER";

/// The fault-injection hook (see [`FAULT_ENV`]); inert unless configured.
#[derive(Debug, Default)]
pub struct FaultHook {
    kill_at: Option<u64>,
    seen: std::sync::atomic::AtomicU64,
}

impl FaultHook {
    /// A hook that never fires.
    pub fn none() -> Self {
        Self::default()
    }

    /// A hook that kills the process at point `n` (1-based).
    pub fn kill_at(n: u64) -> Self {
        Self { kill_at: Some(n), ..Self::default() }
    }

    /// Reads [`FAULT_ENV`]; inert when unset or not a number.
    pub fn from_env() -> Self {
        match std::env::var(FAULT_ENV).ok().and_then(|v| v.parse().ok()) {
            Some(n) => Self::kill_at(n),
            None => Self::none(),
        }
    }

    /// Marks a fault point; kills the process with SIGKILL if it is the configured one.
    pub fn point(&self, what: &str, path: &Path) {
        let n = self.seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if self.kill_at == Some(n) {
            eprintln!("{FAULT_ENV}: killing the installer at fault point {n} ({what} {})", path.display());
            // SIGKILL, like `kill -9`: no destructors, no flushing, nothing cleaned up.
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
    }

    /// How many points were passed (for tests that enumerate them).
    pub fn points_seen(&self) -> u64 {
        self.seen.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads a file; `None` when it does not exist.
pub fn read_opt(path: &Path) -> Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("read", path)(e)),
    }
}

/// Replaces `path` with `bytes` atomically, durably (file and directory flushed), with the two
/// fault points (`temp written`, `renamed`). An existing file keeps its mode and owner; a new one
/// gets `mode`. Temp files of earlier runs killed mid-write are removed first (we hold the host
/// lock, so no other installer is writing them).
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32, hook: &FaultHook) -> Result<()> {
    remove_stale_temps(path);
    let options = WriteOptions::new(mode).keep_existing_mode_and_owner(true);
    nvinject_fsio::write_atomic_with(path, bytes, &options, &mut |step, p| hook.point(step.label(), p))
        .map_err(write_error)
}

/// Points `path` at `target` atomically, with the same two fault points as [`write_atomic`]
/// (temp symlink made, renamed into place).
pub fn symlink_atomic(target: &str, path: &Path, hook: &FaultHook) -> Result<()> {
    remove_stale_temps(path);
    nvinject_fsio::symlink_atomic(Path::new(target), path, Durability::None, &mut |step, p| {
        hook.point(step.label(), p)
    })
    .map_err(write_error)
}

/// Removes temp files of `path` left by a run killed between writing and renaming them. Best
/// effort: a leftover is hidden and harmless, and the write that follows reports real trouble.
pub fn remove_stale_temps(path: &Path) {
    if let Err(error) = nvinject_fsio::remove_stale_temps(path) {
        tracing::warn!(path = %path.display(), %error, "cannot remove stale temporary files");
    }
}

fn write_error(e: WriteError) -> Error {
    Error::Io { op: e.step, path: e.path, source: e.source }
}

/// [`write_atomic`] of the host path `host_path`, in its directory resolved inside `root` (which
/// must exist): a link on the way is followed inside the root, never in the installer's own file
/// system, and a link at the final name is replaced, never written through.
pub fn write_in(root: &HostRoot, host_path: &str, bytes: &[u8], mode: u32, hook: &FaultHook) -> Result<()> {
    let (parent, name) = split(host_path);
    let dir = root.dir(&parent)?;
    let target = dir.join(&name);
    // Only a regular file's mode and owner are kept: a link's would be its target's, which may
    // lie outside the root.
    let keep = root.symlink_metadata(host_path)?.is_some_and(|m| m.file_type().is_file());
    remove_stale_temps(&target);
    let options = WriteOptions::new(mode).keep_existing_mode_and_owner(keep);
    nvinject_fsio::write_atomic_with(&target, bytes, &options, &mut |step, _| {
        hook.point(step.label(), &root.shown(host_path))
    })
    .map_err(|e| Error::Io { op: e.step, path: root.shown(host_path), source: e.source })
}

/// [`symlink_atomic`] of the host path `host_path`, in its directory resolved inside `root`.
pub fn symlink_in(root: &HostRoot, target: &str, host_path: &str, hook: &FaultHook) -> Result<()> {
    let (parent, name) = split(host_path);
    let dir = root.dir(&parent)?;
    let link = dir.join(&name);
    remove_stale_temps(&link);
    nvinject_fsio::symlink_atomic(Path::new(target), &link, Durability::None, &mut |step, _| {
        hook.point(step.label(), &root.shown(host_path))
    })
    .map_err(|e| Error::Io { op: e.step, path: root.shown(host_path), source: e.source })
}

/// Removes the file or link `host_path` (resolved inside `root`) if present.
pub fn remove_in(root: &HostRoot, host_path: &str, hook: &FaultHook) -> Result<bool> {
    let (parent, name) = split(host_path);
    let dir = match root.dir(&parent) {
        Ok(dir) => dir,
        Err(Error::HostFile { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(false);
        }
        Err(e) => return Err(e),
    };
    let shown = root.shown(host_path);
    remove_stale_temps(&dir.join(&name));
    match fs::remove_file(dir.join(&name)) {
        Ok(()) => {
            let _ = nvinject_fsio::sync_parent_dir(&dir.join(&name));
            hook.point("removed", &shown);
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("remove", shown)(e)),
    }
}

/// Removes a file if present; a missing file is fine.
pub fn remove_file(path: &Path, hook: &FaultHook) -> Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => {
            // Makes the removal durable: without it a power cut can bring the old name back.
            // Best effort, as the file is gone either way.
            let _ = nvinject_fsio::sync_parent_dir(path);
            hook.point("removed", path);
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("remove", path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn atomic_write_replaces_content_and_keeps_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let hook = FaultHook::none();
        write_atomic(&path, b"new", 0o644, &hook).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(names(dir.path()), ["config.toml"], "temp file left behind");
        assert_eq!(hook.points_seen(), 2, "a write has two fault points");
    }

    #[test]
    fn symlinks_are_replaced_with_two_fault_points() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("195:0");
        let hook = FaultHook::none();
        symlink_atomic("../nvidia0", &link, &hook).unwrap();
        symlink_atomic("../nvidia1", &link, &hook).unwrap();
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("../nvidia1"));
        assert_eq!(names(dir.path()), ["195:0"]);
        assert_eq!(hook.points_seen(), 4);
    }

    #[test]
    fn a_failed_write_names_the_file_and_step() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing/config.toml");
        let err = write_atomic(&path, b"x", 0o644, &FaultHook::none()).unwrap_err();
        assert!(
            matches!(&err, Error::Io { op: "create temporary file", path: p, .. } if *p == path),
            "{err:?}"
        );
    }

    #[test]
    fn new_files_get_the_requested_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shim");
        write_atomic(&path, b"#!", 0o755, &FaultHook::none()).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o755);
    }

    #[test]
    fn sha256_matches_a_known_vector() {
        assert_eq!(sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
