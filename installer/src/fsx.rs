//! File operations the installer relies on: atomic replace, hashing, and the fault-injection
//! test hook.
//!
//! Every file others read (containerd's config, our drop-in, the CDI spec, binaries) is written
//! to a temp file in the same directory, synced, and renamed over the target, so a reader or a
//! kill -9 at any moment sees either the old or the new bytes, never a mix.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

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

/// The temp file used to replace `path`: hidden, in the same directory (same file system, so the
/// rename is atomic), with a fixed name so a run killed mid-write leaves at most one, which the
/// next write reuses.
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.nvinject-tmp"))
}

/// Reads a file; `None` when it does not exist.
pub fn read_opt(path: &Path) -> Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("read", path)(e)),
    }
}

/// Replaces `path` with `bytes` atomically. An existing file keeps its mode and owner; a new one
/// gets `mode`.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32, hook: &FaultHook) -> Result<()> {
    let tmp = temp_path(path);
    let existing = fs::metadata(path).ok();
    let mode = existing.as_ref().map(|m| m.permissions().mode() & 0o7777).unwrap_or(mode);
    // A leftover temp file from a killed run may have other permissions: start fresh.
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(Error::io("create", &tmp))?;
    file.write_all(bytes).map_err(Error::io("write", &tmp))?;
    // The umask may have masked bits off at creation.
    file.set_permissions(fs::Permissions::from_mode(mode)).map_err(Error::io("chmod", &tmp))?;
    if let Some(meta) = &existing {
        std::os::unix::fs::fchown(&file, Some(meta.uid()), Some(meta.gid()))
            .map_err(Error::io("chown", &tmp))?;
    }
    file.sync_all().map_err(Error::io("sync", &tmp))?;
    drop(file);
    hook.point("temp written", path);
    fs::rename(&tmp, path).map_err(Error::io("rename into place", path))?;
    sync_dir(path);
    hook.point("renamed", path);
    Ok(())
}

/// Removes a file if present; a missing file is fine.
pub fn remove_file(path: &Path, hook: &FaultHook) -> Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => {
            sync_dir(path);
            hook.point("removed", path);
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("remove", path)(e)),
    }
}

/// Makes the rename or removal durable: without it a power cut can bring the old name back.
fn sync_dir(path: &Path) {
    if let Some(dir) = path.parent()
        && let Ok(d) = fs::File::open(dir)
    {
        let _ = d.sync_all();
    }
}

/// Creates `dir` and any missing parents; returns the directories it created, outermost first
/// (so uninstall can remove exactly those).
pub fn create_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(d) = cur {
        if d.exists() {
            break;
        }
        missing.push(d.to_path_buf());
        cur = d.parent();
    }
    missing.reverse();
    for d in &missing {
        match fs::create_dir(d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io("create directory", d)(e)),
        }
    }
    Ok(missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_content_and_keeps_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        write_atomic(&path, b"new", 0o644, &FaultHook::none()).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(!temp_path(&path).exists(), "temp file left behind");
    }

    #[test]
    fn new_files_get_the_requested_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shim");
        write_atomic(&path, b"#!", 0o755, &FaultHook::none()).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o755);
    }

    #[test]
    fn create_dirs_reports_only_what_it_created() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("a/b/c");
        let created = create_dirs(&target).unwrap();
        assert_eq!(created, vec![dir.path().join("a"), dir.path().join("a/b"), target.clone()]);
        assert!(create_dirs(&target).unwrap().is_empty());
    }

    #[test]
    fn sha256_matches_a_known_vector() {
        assert_eq!(sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
