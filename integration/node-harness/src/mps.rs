//! A stand-in for NVIDIA's MPS control daemon (`nvidia-cuda-mps-control -d`), as far as its pipe
//! directory goes: the files the real daemon makes in `CUDA_MPS_PIPE_DIRECTORY`, with their
//! types and modes, and a daemon side that answers the clients that connect.
//!
//! What a running daemon keeps there (NVIDIA's MPS documentation: "named pipes and UNIX domain
//! sockets"; `ls -l` and `lsof` of a running 5xx daemon): `control`, a listening `SOCK_SEQPACKET`
//! socket, mode 0666, which every client connects to; `control_privileged`, the same for
//! administrative commands, mode 0755 (root only); `control_lock`, a lock file, 0666; `log`, a
//! FIFO the server writes its log into and the daemon reads, 0777; `nvidia-cuda-mps-control.pid`.
//! The stand-in makes the same files (as whoever runs the test: root) and serves both sockets
//! from a thread until dropped; [`MpsDaemon::stop`] says what it was sent.

use std::fs;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use nix::sys::socket::{self as so, AddressFamily, Backlog, MsgFlags, SockFlag, SockType, UnixAddr, sockopt};

use crate::error::{HarnessError, Result, io};

/// The socket every MPS client connects to.
pub const CONTROL: &str = "control";
/// The socket for administrative commands, root's only.
pub const CONTROL_PRIVILEGED: &str = "control_privileged";
/// The daemon's lock file.
pub const CONTROL_LOCK: &str = "control_lock";
/// The FIFO the server logs into.
pub const LOG_FIFO: &str = "log";
/// The daemon's PID file.
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";

/// One message a client sent, as the daemon side saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// [`CONTROL`] or [`CONTROL_PRIVILEGED`].
    pub socket: &'static str,
    /// The client's uid (`SO_PEERCRED`).
    pub uid: u32,
    /// The client's pid, in the daemon's PID namespace.
    pub pid: i32,
    /// What it sent.
    pub message: String,
}

/// What the daemon side saw by the time it stopped.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Messages on the sockets, in order.
    pub received: Vec<Received>,
    /// What was written into the log FIFO.
    pub log: String,
}

/// The stand-in; stops its thread and removes the files it made when dropped.
pub struct MpsDaemon {
    dir: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    received: Arc<Mutex<Vec<Received>>>,
    log: OwnedFd,
}

/// The daemon side's answer to a message, from what it received.
pub type Answer = Box<dyn Fn(&Received) -> String + Send>;

/// [`io`] for the calls made through `nix`.
fn nix_err(op: &'static str, path: &Path) -> impl FnOnce(nix::errno::Errno) -> HarnessError {
    let path = path.to_owned();
    move |e| HarnessError::Io { op, path, source: std::io::Error::from(e) }
}

fn listener(dir: &Path, name: &str, mode: u32) -> Result<OwnedFd> {
    let path = dir.join(name);
    let fd = so::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(nix_err("make a socket for", &path))?;
    let addr = UnixAddr::new(&path).map_err(nix_err("address", &path))?;
    so::bind(fd.as_raw_fd(), &addr).map_err(nix_err("bind", &path))?;
    so::listen(&fd, Backlog::new(8).expect("a small backlog")).map_err(nix_err("listen on", &path))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(mode)).map_err(io("chmod", &path))?;
    Ok(fd)
}

impl MpsDaemon {
    /// Makes the daemon's files in `dir` (an existing directory) and starts answering: each
    /// message on either socket gets `answer`'s text back.
    pub fn start(dir: &Path, answer: Answer) -> Result<MpsDaemon> {
        let control = listener(dir, CONTROL, 0o666)?;
        let privileged = listener(dir, CONTROL_PRIVILEGED, 0o755)?;
        let lock = dir.join(CONTROL_LOCK);
        fs::write(&lock, b"").map_err(io("write", &lock))?;
        fs::set_permissions(&lock, fs::Permissions::from_mode(0o666)).map_err(io("chmod", &lock))?;
        let pid = dir.join(PID_FILE);
        fs::write(&pid, format!("{}\n", std::process::id())).map_err(io("write", &pid))?;
        fs::set_permissions(&pid, fs::Permissions::from_mode(0o666)).map_err(io("chmod", &pid))?;
        let fifo = dir.join(LOG_FIFO);
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o777))
            .map_err(nix_err("mkfifo", &fifo))?;
        fs::set_permissions(&fifo, fs::Permissions::from_mode(0o777)).map_err(io("chmod", &fifo))?;
        // Read and write ends in one descriptor, as the daemon holds both: writers never block
        // or get EPIPE, and what they wrote waits in the pipe until read.
        let log: OwnedFd = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .map_err(io("open", &fifo))?
            .into();

        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, received) = (stop.clone(), received.clone());
            std::thread::spawn(move || {
                serve(&[(CONTROL, control), (CONTROL_PRIVILEGED, privileged)], &stop, &received, &answer)
            })
        };
        Ok(MpsDaemon { dir: dir.to_owned(), stop, thread: Some(thread), received, log })
    }

    /// Stops answering and says what arrived on the sockets and in the log FIFO.
    pub fn stop(mut self) -> Seen {
        self.halt();
        let mut log = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = nix::unistd::read(self.log.as_fd(), &mut buf) {
            if n == 0 {
                break;
            }
            log.extend_from_slice(&buf[..n]);
        }
        let received = self.received.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Seen { received, log: String::from_utf8_lossy(&log).into_owned() }
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MpsDaemon {
    fn drop(&mut self) {
        self.halt();
        for name in [CONTROL, CONTROL_PRIVILEGED, CONTROL_LOCK, LOG_FIFO, PID_FILE] {
            let _ = fs::remove_file(self.dir.join(name));
        }
    }
}

/// Accepts on the (non-blocking) listeners until `stop`; one message per connection, one answer
/// back.
fn serve(
    listeners: &[(&'static str, OwnedFd)],
    stop: &AtomicBool,
    received: &Mutex<Vec<Received>>,
    answer: &Answer,
) {
    while !stop.load(Ordering::SeqCst) {
        let mut idle = true;
        for (name, fd) in listeners {
            let Ok(raw) = so::accept4(fd.as_raw_fd(), SockFlag::SOCK_CLOEXEC) else { continue };
            idle = false;
            // SAFETY: accept4 returned a new descriptor that nothing else owns.
            let conn = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
            if let Some(message) = exchange(name, &conn, answer) {
                received.lock().unwrap_or_else(|e| e.into_inner()).push(message);
            }
        }
        if idle {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// Reads one message from a client (waiting up to 10 s for it) and sends the answer.
fn exchange(socket: &'static str, conn: &OwnedFd, answer: &Answer) -> Option<Received> {
    let cred = so::getsockopt(conn, sockopt::PeerCredentials).ok()?;
    let limit = nix::sys::time::TimeVal::new(10, 0);
    so::setsockopt(conn, sockopt::ReceiveTimeout, &limit).ok()?;
    let mut buf = [0u8; 4096];
    let n = so::recv(conn.as_raw_fd(), &mut buf, MsgFlags::empty()).ok()?;
    let got = Received {
        socket,
        uid: cred.uid(),
        pid: cred.pid(),
        message: String::from_utf8_lossy(&buf[..n]).into_owned(),
    };
    let reply = answer(&got);
    let _ = so::send(conn.as_raw_fd(), reply.as_bytes(), MsgFlags::MSG_NOSIGNAL);
    Some(got)
}
