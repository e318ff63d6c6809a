//! A lock file another user can neither hold nor swap: the one mechanism behind the shim's spec lock
//! and the installer's host lock.
//!
//! The file is opened in a directory the caller has already vetted (each caller has its own rule
//! for the directory), `O_NOFOLLOW | O_NONBLOCK`, so a symlink is refused and a FIFO or device never
//! blocks the open; it must be a regular file owned by this user and is narrowed to 0600 (an older
//! 0644 lock included), so nobody else can open it to `flock` it. The `flock` is then polled until a
//! deadline, so a lock held anyway fails the caller instead of hanging it. The kernel releases it
//! when the holder dies.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;

/// Mode of every lock file: only its owner may open it.
pub const LOCK_FILE_MODE: u32 = 0o600;

/// A held lock; released when dropped. Reads and writes go to the lock file (a holder may record
/// itself there).
pub type FileLock = Flock<File>;

/// Why a lock was not taken. Callers word the message (each names its own config keys and fixes).
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// A symbolic link is at the lock's name.
    #[error("is a symbolic link")]
    Symlink,
    /// Something other than a regular file is at the lock's name.
    #[error("is not a regular file")]
    NotRegular,
    /// The lock file has other hard links: it may be another file linked in by whoever could write
    /// the directory, and taking it would chmod that file.
    #[error("has {links} hard links (a lock file has one)")]
    HardLinked {
        /// Its link count.
        links: u64,
    },
    /// The lock file belongs to another user.
    #[error("is owned by uid {uid}")]
    NotOwned {
        /// Its owner.
        uid: u32,
    },
    /// Still held by another process when the wait ran out.
    #[error("still held after {waited:?}")]
    Held {
        /// How long it was waited on.
        waited: Duration,
        /// The open lock file, so the caller can read what the holder recorded there.
        file: File,
    },
    /// A system call failed.
    #[error("{step}: {source}")]
    Io {
        /// `open`, `stat`, `chmod` or `flock`.
        step: &'static str,
        /// What the kernel said.
        source: std::io::Error,
    },
}

fn io(step: &'static str) -> impl Fn(std::io::Error) -> LockError {
    move |source| LockError::Io { step, source }
}

/// Opens (creating, 0600) the lock file `name` in the directory `dir` and takes an exclusive
/// `flock`, polling every `poll` until `timeout` has passed. `on_wait` runs once, the first time the
/// lock is found held, with the open file (to read who holds it).
///
/// A file its last holder removed ([`remove`]) is not the lock any more: once locked, the name is
/// checked to still lead to the locked file, and opened again when it does not, so two processes
/// never both hold "the" lock through an old and a new file.
pub fn acquire(
    dir: impl AsFd,
    name: &OsStr,
    timeout: Duration,
    poll: Duration,
    on_wait: &mut dyn FnMut(&mut File),
) -> Result<FileLock, LockError> {
    let dir = dir.as_fd();
    let started = Instant::now();
    let mut waited = false;
    loop {
        let mut file = open_checked(dir, name)?;
        let lock = loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => break lock,
                Err((mut f, Errno::EWOULDBLOCK | Errno::EINTR)) => {
                    if started.elapsed() >= timeout {
                        return Err(LockError::Held { waited: started.elapsed(), file: f });
                    }
                    if !waited {
                        on_wait(&mut f);
                        waited = true;
                    }
                    std::thread::sleep(poll);
                    file = f;
                }
                Err((_, errno)) => return Err(LockError::Io { step: "flock", source: errno.into() }),
            }
        };
        if still_named(dir, name, &lock)? {
            return Ok(lock);
        }
        // Removed (or replaced by its holder) while we waited: take the lock under its name now.
    }
}

/// Removes the held lock's file, then releases the lock: what a holder that leaves nothing behind
/// does last (the installer's uninstall). A process waiting on the removed file opens the name
/// again once it gets it (see [`acquire`]).
pub fn remove(lock: FileLock, dir: impl AsFd, name: &OsStr) -> Result<(), LockError> {
    if still_named(dir.as_fd(), name, &lock)? {
        nix::unistd::unlinkat(dir.as_fd(), name, nix::unistd::UnlinkatFlags::NoRemoveDir)
            .map_err(|e| LockError::Io { step: "unlink", source: e.into() })?;
    }
    drop(lock);
    Ok(())
}

/// `name` in `dir` opened as a lock file: no link followed, no blocking open, a regular file of this
/// user with one link, narrowed to [`LOCK_FILE_MODE`].
fn open_checked(dir: std::os::fd::BorrowedFd<'_>, name: &OsStr) -> Result<File, LockError> {
    let fd = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDWR
            | OFlag::O_CREAT
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(LOCK_FILE_MODE),
    )
    .map_err(|e| match e {
        Errno::ELOOP => LockError::Symlink,
        e => LockError::Io { step: "open", source: e.into() },
    })?;
    let file = File::from(fd);
    let meta = file.metadata().map_err(io("stat"))?;
    if !meta.is_file() {
        return Err(LockError::NotRegular);
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(LockError::NotOwned { uid: meta.uid() });
    }
    if meta.nlink() != 1 {
        return Err(LockError::HardLinked { links: meta.nlink() });
    }
    if meta.mode() & 0o7777 != LOCK_FILE_MODE {
        // Also undoes the umask-free creation mode of an older lock (0644).
        file.set_permissions(std::fs::Permissions::from_mode(LOCK_FILE_MODE)).map_err(io("chmod"))?;
    }
    Ok(file)
}

/// Whether `name` in `dir` is still the file `lock` holds.
fn still_named(dir: std::os::fd::BorrowedFd<'_>, name: &OsStr, lock: &FileLock) -> Result<bool, LockError> {
    let held = lock.metadata().map_err(io("stat"))?;
    match nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(st.st_dev == held.dev() && st.st_ino == held.ino()),
        Err(Errno::ENOENT) => Ok(false),
        Err(e) => Err(LockError::Io { step: "stat", source: e.into() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn dir() -> (tempfile::TempDir, File) {
        let tmp = tempfile::tempdir().unwrap();
        let fd = File::open(tmp.path()).unwrap();
        (tmp, fd)
    }

    #[test]
    fn a_second_holder_waits_then_fails_and_gets_it_once_released() {
        let (tmp, d) = dir();
        let name = OsStr::new("x.lock");
        let first = acquire(&d, name, Duration::ZERO, Duration::from_millis(1), &mut |_| {}).unwrap();
        assert_eq!(fs::metadata(tmp.path().join("x.lock")).unwrap().mode() & 0o7777, LOCK_FILE_MODE);
        let mut waits = 0;
        let err = acquire(&d, name, Duration::from_millis(30), Duration::from_millis(5), &mut |_| waits += 1)
            .unwrap_err();
        assert!(matches!(err, LockError::Held { .. }), "{err}");
        assert_eq!(waits, 1, "on_wait runs once");
        drop(first);
        acquire(&d, name, Duration::ZERO, Duration::from_millis(1), &mut |_| {}).unwrap();
    }

    #[test]
    fn links_fifos_and_loose_modes_are_handled_without_blocking() {
        let (tmp, d) = dir();
        let decoy = tmp.path().join("decoy");
        fs::write(&decoy, "x").unwrap();
        std::os::unix::fs::symlink(&decoy, tmp.path().join("l.lock")).unwrap();
        let err = acquire(&d, OsStr::new("l.lock"), Duration::ZERO, Duration::ZERO, &mut |_| {}).unwrap_err();
        assert!(matches!(err, LockError::Symlink), "{err}");
        nix::unistd::mkfifo(&tmp.path().join("f.lock"), Mode::from_bits_truncate(0o600)).unwrap();
        let err = acquire(&d, OsStr::new("f.lock"), Duration::ZERO, Duration::ZERO, &mut |_| {}).unwrap_err();
        assert!(matches!(err, LockError::NotRegular), "{err}");
        let old = tmp.path().join("o.lock");
        fs::write(&old, "").unwrap();
        fs::set_permissions(&old, fs::Permissions::from_mode(0o644)).unwrap();
        acquire(&d, OsStr::new("o.lock"), Duration::ZERO, Duration::ZERO, &mut |_| {}).unwrap();
        assert_eq!(fs::metadata(&old).unwrap().mode() & 0o7777, LOCK_FILE_MODE);
        assert_eq!(fs::read(&decoy).unwrap(), b"x");
    }

    #[test]
    fn a_hard_linked_lock_file_is_refused_and_left_as_it_is() {
        let (tmp, d) = dir();
        let other = tmp.path().join("other-root-file");
        fs::write(&other, "keep").unwrap();
        fs::set_permissions(&other, fs::Permissions::from_mode(0o644)).unwrap();
        fs::hard_link(&other, tmp.path().join("h.lock")).unwrap();
        let err = acquire(&d, OsStr::new("h.lock"), Duration::ZERO, Duration::ZERO, &mut |_| {}).unwrap_err();
        assert!(matches!(err, LockError::HardLinked { links: 2 }), "{err}");
        assert_eq!(fs::metadata(&other).unwrap().mode() & 0o7777, 0o644, "not chmod-ed");
    }

    #[test]
    fn a_removed_lock_is_taken_again_under_its_name_by_whoever_waited() {
        let (tmp, d) = dir();
        let name = OsStr::new("r.lock");
        let first = acquire(&d, name, Duration::ZERO, Duration::from_millis(1), &mut |_| {}).unwrap();
        let path = tmp.path().join("r.lock");
        // A waiter opens the old file, then the holder removes it and lets go.
        let waiter = std::thread::scope(|scope| {
            let d2 = d.try_clone().unwrap();
            let (opened_tx, opened_rx) = std::sync::mpsc::channel();
            let waiter = scope.spawn(move || {
                acquire(&d2, name, Duration::from_secs(10), Duration::from_millis(5), &mut |_| {
                    opened_tx.send(()).unwrap();
                })
                .unwrap()
            });
            opened_rx.recv().unwrap();
            remove(first, &d, name).unwrap();
            waiter.join().unwrap()
        });
        // (The new file may reuse the removed one's inode number: what tells them apart is that the
        // one the waiter holds is linked under the name.)
        let now = fs::metadata(&path).expect("the waiter made the lock file again");
        let held = waiter.metadata().unwrap();
        assert_eq!(held.nlink(), 1, "it holds a file that is linked, not the removed one");
        assert_eq!(held.ino(), now.ino());
        let err = acquire(&d, name, Duration::ZERO, Duration::ZERO, &mut |_| {}).unwrap_err();
        assert!(matches!(err, LockError::Held { .. }), "the new file is the lock: {err}");
        remove(waiter, &d, name).unwrap();
        assert!(!path.exists(), "nothing left behind");
    }
}
