//! One installer per host: an exclusive `flock` on a file in the host's `/run`.
//!
//! The lock lives on the host (through the host root), so two installer pods, an installer pod
//! and an operator running `nvinject-installer` by hand, or a `run` that has not finished its
//! uninstall yet, all exclude each other. `flock` is released by the kernel when the holder dies,
//! so a killed installer never leaves the host locked.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::error::{Error, Result};

/// A held host lock; released on drop.
#[derive(Debug)]
pub struct HostLock {
    _lock: Flock<File>,
}

impl HostLock {
    /// Takes the lock at `path`, waiting up to `timeout` for another holder to finish.
    pub fn acquire(path: &Path, timeout: Duration) -> Result<HostLock> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(Error::io("create directory", dir))?;
        }
        let deadline = Instant::now() + timeout;
        let mut logged = false;
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(Error::io("open lock file", path))?;
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(mut lock) => {
                    // Who holds it, for the message another installer prints.
                    let _ = lock.set_len(0);
                    let _ = lock.rewind();
                    let _ = writeln!(lock, "pid {}", std::process::id());
                    return Ok(HostLock { _lock: lock });
                }
                Err((mut file, Errno::EWOULDBLOCK)) => {
                    let mut holder = String::new();
                    let _ = file.read_to_string(&mut holder);
                    let holder = holder.trim().to_owned();
                    if Instant::now() >= deadline {
                        return Err(Error::Locked { path: path.to_owned(), holder });
                    }
                    if !logged {
                        tracing::info!(lock = %path.display(), holder = %holder, "waiting for another installer");
                        logged = true;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err((_, errno)) => {
                    return Err(Error::io("lock", path)(std::io::Error::from(errno)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_times_out_and_names_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/lock");
        let first = HostLock::acquire(&path, Duration::ZERO).unwrap();
        let err = HostLock::acquire(&path, Duration::from_millis(300)).unwrap_err();
        let message = err.to_string();
        assert!(message.contains(&format!("pid {}", std::process::id())), "{message}");
        drop(first);
        HostLock::acquire(&path, Duration::ZERO).unwrap();
    }
}
