//! The long-running proxy process: serve the socket `start` handed over, and leave when the inner
//! shim does (containerd then sees our connections close, exactly as if the runc shim had exited).

use std::io::{self, Read};
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::Duration;

use crate::address::ShimAddress;
use crate::proxy::{CreateGate, Proxy};

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

/// Serves `listener` (bound at `own`) for the inner shim at `inner` until the inner shim is gone,
/// then removes the socket and exits the process.
pub fn run(
    listener: UnixListener,
    own: ShimAddress,
    inner: ShimAddress,
    gate: Arc<dyn CreateGate>,
) -> io::Result<()> {
    let watched = inner.clone();
    let own_socket = own.clone();
    std::thread::Builder::new().name("inner-watch".into()).spawn(move || {
        wait_until_gone(&watched);
        tracing::info!(inner = %watched, "runc shim exited; proxy exiting");
        let _ = own_socket.remove();
        std::process::exit(0);
    })?;
    tracing::info!(listen = %own, inner = %inner, "proxy serving");
    Proxy::new(inner, gate).serve(&listener)
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
