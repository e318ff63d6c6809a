//! The long-running proxy process: serve the socket `start` handed over, and leave when the inner
//! shim does (containerd then sees our connections close, exactly as if the runc shim had exited).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::sync::Arc;

use crate::address::ShimAddress;
use crate::proxy::{CreateGate, Proxy};

/// Blocks until process `pid` has exited. Returns at once if it is already gone.
///
/// Uses a pidfd, so a recycled PID can never be mistaken for the shim.
pub fn wait_for_exit(pid: u32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: pidfd_open takes a pid and flags by value and returns a new fd or -1; no memory is shared.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if raw < 0 {
        let err = io::Error::last_os_error();
        return if err.raw_os_error() == Some(libc::ESRCH) { Ok(()) } else { Err(err) };
    }
    // SAFETY: the syscall just returned this fd to us and nothing else owns it.
    let pidfd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
    loop {
        let mut pollfd = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: pollfd is a valid, exclusively borrowed array of one element for the call's duration.
        let n = unsafe { libc::poll(&mut pollfd, 1, -1) };
        if n > 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Serves `listener` (bound at `own`) for the inner shim at `inner` until process `inner_pid`
/// exits, then removes the socket and exits the process.
pub fn run(
    listener: UnixListener,
    own: ShimAddress,
    inner: ShimAddress,
    inner_pid: u32,
    gate: Arc<dyn CreateGate>,
) -> io::Result<()> {
    let watched = own.clone();
    std::thread::Builder::new().name("inner-watch".into()).spawn(move || {
        if let Err(e) = wait_for_exit(inner_pid) {
            tracing::error!(inner_pid, error = %e, "cannot watch the runc shim; exiting");
        }
        tracing::info!(inner_pid, "runc shim exited; proxy exiting");
        let _ = watched.remove();
        std::process::exit(0);
    })?;
    tracing::info!(listen = %own, inner = %inner, inner_pid, "proxy serving");
    Proxy::new(inner, gate).serve(&listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_a_process_and_returns_for_a_gone_one() {
        let mut child = std::process::Command::new("/bin/sleep").arg("0.2").spawn().unwrap();
        let pid = child.id();
        let waiter = std::thread::spawn(move || wait_for_exit(pid));
        // Reap it so the pidfd reports exit (a zombie has exited too; either way poll fires).
        child.wait().unwrap();
        waiter.join().unwrap().unwrap();
        wait_for_exit(pid).unwrap();
    }
}
