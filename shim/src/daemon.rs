//! The long-running proxy process: serve the socket `start` handed over, and leave when the inner
//! shim does (containerd then sees our connections close, exactly as if the runc shim had exited),
//! or when containerd is done with it ([`crate::proxy::Usage::done`], checked every
//! [`IDLE_CHECK`]).
//!
//! Every way out removes the proxy's socket file from containerd's socket directory: the inner
//! shim's exit, containerd being done, SIGTERM, SIGINT or SIGHUP ([`exit_on_signals`]), and an
//! error or a panic of the main thread ([`SocketGuard`]). Only SIGKILL leaves it, and the next
//! `start` for the same shim replaces a socket nobody answers on.

use std::io::{self, Read};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::address::ShimAddress;
use crate::proxy::{CreateGate, Proxy, Usage};

/// How often the proxy checks, while containerd holds no connection to it, whether containerd is
/// done with it.
pub const IDLE_CHECK: Duration = Duration::from_secs(1);

/// The signals that end the proxy cleanly.
const EXIT_SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// Removes the proxy's socket file when dropped: what `proxy` holds from the moment the socket is
/// its own, so an error return or a panic of the main thread removes it too.
pub struct SocketGuard(pub ShimAddress);

impl Drop for SocketGuard {
    fn drop(&mut self) {
        remove_socket(&self.0);
    }
}

fn remove_socket(own: &ShimAddress) {
    if let Err(e) = own.remove() {
        tracing::warn!(socket = %own, error = %e, "cannot remove the proxy socket");
    }
}

/// Removes the socket file at `own` and ends the process with `code`.
pub fn exit_removing(own: &ShimAddress, code: i32) -> ! {
    remove_socket(own);
    std::process::exit(code)
}

/// Ends the process through [`exit_removing`] on SIGTERM, SIGINT or SIGHUP. Call it before any
/// other thread starts: the signals are blocked in the calling thread, so in every thread started
/// after it, and taken by one thread of their own with `sigwait` (which may log and remove a file,
/// where a signal handler may not). Child processes get the default mask back (std resets it).
pub fn exit_on_signals(own: &ShimAddress) -> io::Result<()> {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before any other use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, exclusively borrowed sigset_t; the signal numbers are valid.
    unsafe {
        libc::sigemptyset(&mut set);
        for signal in EXIT_SIGNALS {
            libc::sigaddset(&mut set, signal);
        }
    }
    // SAFETY: blocks the signals of a valid set in this thread; the old mask is not wanted.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    let own = own.clone();
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        let mut signal: libc::c_int = 0;
        // SAFETY: `set` was initialised above and `signal` is a valid out-pointer; sigwait only
        // returns one of the signals in the set (or an error, for which we wait again).
        while unsafe { libc::sigwait(&set, &mut signal) } != 0 {}
        tracing::info!(signal, "signal received; proxy exiting");
        exit_removing(&own, 0)
    })?;
    Ok(())
}

/// Blocks until the inner shim at `inner` is gone.
///
/// The proxy holds one idle connection to the shim: the shim never writes on it, and the kernel
/// closes it when the shim exits. When it closes, the shim is gone if its socket no longer accepts
/// connections; otherwise (the shim only dropped an idle client) the watch starts again. This needs
/// no PID (runc's shim does not publish one) and cannot mistake a recycled PID for the shim.
pub fn wait_until_gone(inner: &ShimAddress) {
    loop {
        let Ok(mut watch) = inner.connect() else { return };
        let mut buf = [0u8; 256];
        loop {
            match watch.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        // Bounded re-arm rate should a shim ever drop idle clients on purpose.
        std::thread::sleep(Duration::from_millis(20));
        tracing::debug!(inner = %inner, "watch connection closed; checking whether the runc shim is still there");
    }
}

/// Serves `listener` (bound at `own`) for the inner shim at `inner` until the inner shim is gone or
/// containerd is done with the proxy started for the container at `bundle`, then removes the
/// socket and exits the process.
pub fn run(
    listener: UnixListener,
    own: ShimAddress,
    inner: ShimAddress,
    gate: Arc<dyn CreateGate>,
    bundle: Option<PathBuf>,
) -> io::Result<()> {
    let watched = inner.clone();
    let own_socket = own.clone();
    std::thread::Builder::new().name("inner-watch".into()).spawn(move || {
        wait_until_gone(&watched);
        tracing::info!(inner = %watched, "runc shim exited; proxy exiting");
        exit_removing(&own_socket, 0)
    })?;
    // After containerd gave up on a Create that runc was still running, the runc shim can stay
    // with a container containerd no longer knows: nothing is left to serve then.
    let usage = Usage::new(bundle);
    let watched = Arc::clone(&usage);
    let own_socket = own.clone();
    std::thread::Builder::new().name("idle-watch".into()).spawn(move || {
        loop {
            std::thread::sleep(IDLE_CHECK);
            if watched.done(Path::exists) {
                tracing::info!("containerd holds no connection and removed every bundle; proxy exiting");
                exit_removing(&own_socket, 0)
            }
        }
    })?;
    tracing::info!(listen = %own, inner = %inner, "proxy serving");
    Proxy::new(inner, gate, usage).serve(&listener)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn the_watch_ends_when_the_shim_goes_and_survives_dropped_idle_clients() {
        let dir = tempfile::tempdir().unwrap();
        let addr = ShimAddress { abstract_socket: false, path: dir.path().join("inner") };
        let listener = addr.bind().unwrap();
        let watched = addr.clone();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            wait_until_gone(&watched);
            done_tx.send(Instant::now()).unwrap();
        });
        // The "shim" drops its first idle client but keeps listening: the watch must go on.
        let (first, _) = listener.accept().unwrap();
        drop(first);
        let (_second, _) = listener.accept().unwrap();
        assert!(done_rx.recv_timeout(Duration::from_millis(300)).is_err(), "a dropped client is not an exit");
        // The "shim" exits: listener and connections close.
        let exited = Instant::now();
        drop(_second);
        drop(listener);
        let seen = done_rx.recv_timeout(Duration::from_secs(5)).expect("the watch must notice the exit");
        assert!(seen >= exited);
    }
}
