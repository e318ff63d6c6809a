//! The `start` action: start the inner runc shim, then put the proxy in front of it.
//!
//! containerd runs `<shim> [flags] start` in the bundle directory and reads the shim's address from
//! stdout (see [`crate::reply`] for the forms). We run the runc shim's own `start` with the same
//! arguments, environment, working directory and stdin, so it behaves exactly as if containerd had
//! run it (including grouping a pod's containers onto one shim). Then either a proxy already
//! serves that runc shim (a later container of the same pod) and we answer its address, or we
//! claim the proxy socket, hand it to a new detached proxy process, and answer that.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::address::{AddressError, Claim, ShimAddress};
use crate::inner::{self, InnerError};
use crate::reply::{ReplyError, StartReply};

/// Everything `start` needs, gathered by the binary from its arguments and environment.
#[derive(Debug)]
pub struct StartRequest<'a> {
    /// The runc shim binary.
    pub delegate: &'a Path,
    /// Our command-line arguments after the program name, passed through verbatim.
    pub args: &'a [OsString],
    /// Everything containerd wrote to our stdin.
    pub stdin: &'a [u8],
    /// The bundle directory (our working directory).
    pub bundle: &'a Path,
    /// The container id (`-id`).
    pub id: &'a str,
    /// The containerd namespace (`-namespace`), for logs.
    pub namespace: &'a str,
    /// Our own executable, re-run as the proxy.
    pub proxy_exe: &'a Path,
    /// The configuration file the proxy should load.
    pub config_path: &'a Path,
}

/// How `start` ended when nothing went wrong on our side.
#[derive(Debug, PartialEq, Eq)]
pub enum StartOutcome {
    /// The runc shim's own `start` failed: relay its output and exit code to containerd.
    InnerFailed {
        /// What it printed on stdout.
        stdout: Vec<u8>,
        /// Its exit code (1 if it was killed by a signal).
        code: i32,
    },
    /// Print these bytes on stdout and exit 0.
    Answer {
        /// The rewritten answer.
        stdout: Vec<u8>,
        /// The proxy's address.
        proxy: String,
        /// Whether this call started the proxy (false: joined the pod's existing one).
        started_proxy: bool,
        /// Microseconds the runc shim's own `start` took.
        inner_us: u64,
    },
}

/// Failures of `start` after (or while) the runc shim started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Running or calling the runc shim failed.
    #[error(transparent)]
    Inner(#[from] InnerError),
    /// The runc shim's answer is not understood.
    #[error(transparent)]
    Reply(#[from] ReplyError),
    /// The runc shim's address cannot host a proxy next to it.
    #[error(transparent)]
    Address(#[from] AddressError),
    /// The proxy socket cannot be claimed.
    #[error("cannot listen on {address}: {source}")]
    Listen {
        /// The proxy address.
        address: String,
        /// What the OS said.
        source: io::Error,
    },
    /// The proxy process could not be started.
    #[error("cannot start the nvinject proxy {exe}: {source}")]
    SpawnProxy {
        /// Our executable.
        exe: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
}

/// Runs `start` (see the module docs).
pub fn start(request: &StartRequest<'_>) -> Result<StartOutcome, StartError> {
    let t0 = std::time::Instant::now();
    let inner_start = inner::run_start(request.delegate, request.args, request.stdin)?;
    let inner_us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
    if !inner_start.status.success() {
        return Ok(StartOutcome::InnerFailed {
            stdout: inner_start.stdout,
            code: inner_start.status.code().unwrap_or(1),
        });
    }
    let reply = StartReply::parse(&inner_start.stdout)?;
    let inner_address = ShimAddress::parse(reply.address())?;
    // From here on the runc shim runs but containerd does not know it: on failure, stop it.
    match front(request, &reply, &inner_address, inner_us) {
        Ok(outcome) => Ok(outcome),
        Err(e) => {
            if let Err(shutdown) = inner::shutdown(&inner_address, request.id) {
                tracing::warn!(error = %shutdown, "could not stop the runc shim after a failed start");
            }
            Err(e)
        }
    }
}

fn front(
    request: &StartRequest<'_>,
    reply: &StartReply,
    inner: &ShimAddress,
    inner_us: u64,
) -> Result<StartOutcome, StartError> {
    let proxy = inner.proxy_address()?;
    let listen_err = |source| StartError::Listen { address: proxy.to_string(), source };
    let started_proxy = match proxy.bind_or_join().map_err(listen_err)? {
        Claim::Existing => false,
        Claim::New(listener) => {
            spawn_proxy(request, inner, &proxy, &listener)?;
            true
        }
    };
    let proxy_text = proxy.to_string();
    Ok(StartOutcome::Answer {
        stdout: reply.clone().with_address(&proxy_text).encode(),
        proxy: proxy_text,
        started_proxy,
        inner_us,
    })
}

fn spawn_proxy(
    request: &StartRequest<'_>,
    inner: &ShimAddress,
    proxy: &ShimAddress,
    listener: &UnixListener,
) -> Result<(), StartError> {
    let listen_fd = listener.as_raw_fd();
    // The listening socket crosses exec by number: clear close-on-exec on it (this process is
    // single-threaded here, so nothing else can inherit it). No pre-exec hook and no working
    // directory are set, which lets std use posix_spawn (vfork-like) instead of fork: measurably
    // faster on a busy node. (std changes directory through a glibc extension it looks up at run
    // time, which a static binary cannot; the proxy leaves the bundle directory itself.)
    set_cloexec(listen_fd, false)
        .map_err(|source| StartError::SpawnProxy { exe: request.proxy_exe.to_owned(), source })?;
    let mut command = Command::new(request.proxy_exe);
    command
        .arg("proxy")
        .arg("--inner")
        .arg(inner.to_string())
        .arg("--listen")
        .arg(proxy.to_string())
        .arg("--listen-fd")
        .arg(listen_fd.to_string())
        .arg("--config")
        .arg(request.config_path)
        .arg("--namespace")
        .arg(request.namespace)
        .arg("--bundle")
        .arg(request.bundle)
        // The proxy outlives this process: it must not hold containerd's pipes (containerd waits
        // for them to close), keep the bundle directory busy (it changes to `/` first thing), or
        // get containerd's process-group signals (the runc shim detaches the same way).
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let spawned = command.spawn();
    let _ = set_cloexec(listen_fd, true);
    spawned.map_err(|source| StartError::SpawnProxy { exe: request.proxy_exe.to_owned(), source })?;
    Ok(())
}

fn set_cloexec(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor this process owns (the listener), with integer arguments only.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETFD, if on { libc::FD_CLOEXEC } else { 0 }) };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}
