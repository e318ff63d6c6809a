//! One installer per host: an exclusive `flock` on a file in the host's `/run`.
//!
//! The lock lives on the host (through the host root), so two installer pods, an installer pod
//! and an operator running `nvinject-installer` by hand, or a `run` that has not finished its
//! uninstall yet, all exclude each other. `flock` is released by the kernel when the holder dies,
//! so a killed installer never leaves the host locked.
//!
//! Another user must not be able to hold the installer off: the lock file is root-only (0600, so
//! nobody else can open it to `flock` it) in a directory only root may write (so nobody else can
//! replace it), and a link, FIFO or device at its path is refused without blocking. A lock held
//! anyway (a stuck installer) is waited on for a bounded time, then reported with its holder.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use nix::fcntl::Flock;
use nvinject_fsio::lock::{self as fsio_lock, LockError};

use crate::error::{Error, Result};
use crate::paths::{HostRoot, split};

/// Mode of the lock file: only root may open it.
pub const LOCK_MODE: u32 = fsio_lock::LOCK_FILE_MODE;
/// Mode of a lock directory the installer creates.
pub const LOCK_DIR_MODE: u32 = 0o700;

/// A held host lock; released on drop (its file stays), or by [`HostLock::remove`].
#[derive(Debug)]
pub struct HostLock {
    lock: Flock<File>,
    dir: crate::paths::HostDir,
    name: String,
    shown: std::path::PathBuf,
}

fn refuse(path: &Path, message: impl Into<String>) -> Error {
    Error::Lock { path: path.to_owned(), message: message.into() }
}

impl HostLock {
    /// Takes the lock at the host path `host_path` (resolved inside `root`), waiting up to
    /// `timeout` for another holder to finish.
    pub fn acquire(root: &HostRoot, host_path: &str, timeout: Duration) -> Result<HostLock> {
        let shown = root.shown(host_path);
        let (parent, name) = split(host_path);
        if root.metadata(&parent)?.is_none() {
            root.open()?
                .mkdir_all(std::path::Path::new(&parent), LOCK_DIR_MODE)
                .map_err(Error::host(root.shown(&parent)))?;
        }
        let dir = root.dir(&parent)?;
        let dir_meta = std::fs::metadata(dir.join("")).map_err(Error::io("inspect", root.shown(&parent)))?;
        let me = nix::unistd::geteuid().as_raw();
        if dir_meta.uid() != me || dir_meta.mode() & 0o022 != 0 {
            return Err(refuse(
                &shown,
                format!(
                    "its directory {} is owned by uid {} with mode {:o}: another user could replace the lock; \
                     keep it in a directory only root may write (such as /run), or pass --lock-file",
                    root.shown(&parent).display(),
                    dir_meta.uid(),
                    dir_meta.mode() & 0o7777
                ),
            ));
        }
        let remove = "(the installer creates the lock itself)";
        let mut lock = fsio_lock::acquire(
            dir_fd(&dir),
            std::ffi::OsStr::new(name.as_str()),
            timeout,
            Duration::from_millis(100),
            &mut |file| {
                let holder = read_holder(file);
                tracing::info!(lock = %shown.display(), holder = %holder, "waiting for another installer");
            },
        )
        .map_err(|e| match e {
            LockError::Symlink => refuse(&shown, format!("is a symbolic link; remove it {remove}")),
            LockError::NotRegular => refuse(&shown, format!("is not a regular file; remove it {remove}")),
            LockError::NotOwned { uid } => {
                refuse(&shown, format!("is owned by uid {uid}, not root: remove it {remove}"))
            }
            e @ LockError::HardLinked { .. } => refuse(&shown, format!("{e}; remove it {remove}")),
            LockError::Held { mut file, .. } => {
                Error::Locked { path: shown.clone(), holder: read_holder(&mut file) }
            }
            LockError::Io { step: "open", source } => Error::io("open lock file", &shown)(source),
            LockError::Io { step: "stat", source } => Error::io("inspect", &shown)(source),
            LockError::Io { step: "chmod", source } => Error::io("chmod", &shown)(source),
            LockError::Io { source, .. } => Error::io("lock", &shown)(source),
        })?;
        // Who holds it, for the message another installer prints.
        let _ = lock.set_len(0);
        let _ = lock.rewind();
        let _ = writeln!(lock, "pid {}", std::process::id());
        Ok(HostLock { lock, dir, name, shown })
    }

    /// Removes the lock file and releases the lock: the last step of an uninstall, which leaves
    /// nothing of nvinject on the host. Another installer waiting meanwhile takes the lock under
    /// its name again (`nvinject_fsio::lock::acquire`).
    pub fn remove(self) -> Result<()> {
        let HostLock { lock, dir, name, shown } = self;
        fsio_lock::remove(lock, dir_fd(&dir), std::ffi::OsStr::new(&name)).map_err(|e| match e {
            LockError::Io { source, .. } => Error::io("remove lock file", &shown)(source),
            e => refuse(&shown, e.to_string()),
        })
    }
}

/// What the holder recorded in the lock file (`pid N`).
fn read_holder(file: &mut File) -> String {
    let mut holder = String::new();
    let _ = file.rewind();
    let _ = file.take(256).read_to_string(&mut holder);
    holder.trim().to_owned()
}

fn dir_fd(dir: &crate::paths::HostDir) -> std::os::fd::BorrowedFd<'_> {
    dir.as_fd()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::stat::Mode;
    use std::os::unix::fs::{PermissionsExt, symlink};
    use std::process::Command;

    fn root() -> (tempfile::TempDir, HostRoot) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("run")).unwrap();
        std::fs::set_permissions(dir.path().join("run"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = HostRoot::new(dir.path());
        (dir, root)
    }

    #[test]
    fn a_second_holder_times_out_and_names_the_first() {
        let (_dir, root) = root();
        let first = HostLock::acquire(&root, "/run/lock", Duration::ZERO).unwrap();
        let err = HostLock::acquire(&root, "/run/lock", Duration::from_millis(300)).unwrap_err();
        let message = err.to_string();
        assert!(message.contains(&format!("pid {}", std::process::id())), "{message}");
        assert!(message.contains("/run/lock"), "{message}");
        drop(first);
        HostLock::acquire(&root, "/run/lock", Duration::ZERO).unwrap();
    }

    #[test]
    #[ignore = "needs root"]
    fn the_lock_is_root_only_and_a_missing_directory_is_made_root_only() {
        nvinject_test_support::require_root("chown to root");
        let (dir, root) = root();
        let old = nix::sys::stat::umask(Mode::from_bits_truncate(0o000));
        let lock = HostLock::acquire(&root, "/run/nvinject/lock", Duration::ZERO);
        nix::sys::stat::umask(old);
        let _lock = lock.unwrap();
        let mode = |p: &str| std::fs::metadata(dir.path().join(p)).unwrap().mode() & 0o7777;
        assert_eq!(mode("run/nvinject"), LOCK_DIR_MODE);
        assert_eq!(mode("run/nvinject/lock"), LOCK_MODE);
        // An unprivileged user can neither open it to hold it, nor reach it at all.
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "flock", "-n"])
            .arg(dir.path().join("run/nvinject/lock"))
            .arg("true")
            .output()
            .expect("setpriv (util-linux)");
        assert!(!out.status.success(), "nobody could open the lock: {out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("Permission denied"), "{out:?}");
    }

    #[test]
    fn an_older_world_readable_lock_is_narrowed() {
        let (dir, root) = root();
        let path = dir.path().join("run/lock");
        std::fs::write(&path, "").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let _lock = HostLock::acquire(&root, "/run/lock", Duration::ZERO).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, LOCK_MODE);
    }

    #[test]
    fn links_fifos_and_shared_directories_are_refused_without_blocking() {
        let (dir, root) = root();
        let outside = tempfile::tempdir().unwrap();
        let decoy = outside.path().join("decoy");
        std::fs::write(&decoy, "host").unwrap();
        symlink(&decoy, dir.path().join("run/link")).unwrap();
        let err = HostLock::acquire(&root, "/run/link", Duration::ZERO).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert_eq!(std::fs::read_to_string(&decoy).unwrap(), "host");
        nix::unistd::mkfifo(&dir.path().join("run/fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        let err = HostLock::acquire(&root, "/run/fifo", Duration::ZERO).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        std::fs::create_dir(dir.path().join("tmp")).unwrap();
        std::fs::set_permissions(dir.path().join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let err = HostLock::acquire(&root, "/tmp/lock", Duration::ZERO).unwrap_err();
        assert!(err.to_string().contains("another user could replace the lock"), "{err}");
        assert!(!dir.path().join("tmp/lock").exists());
        // A parent link out of the root is followed inside it: the lock is made there.
        symlink(outside.path(), dir.path().join("var")).unwrap();
        let lock = HostLock::acquire(&root, "/var/lock", Duration::ZERO).unwrap();
        assert!(dir.path().join(outside.path().strip_prefix("/").unwrap()).join("lock").is_file());
        drop(lock);
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1, "nothing created outside the root");
    }
}
