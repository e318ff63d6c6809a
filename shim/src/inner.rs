//! Talking to the inner runc shim: running its binary, and the one task-API call the proxy makes on
//! its own account (`Shutdown`, to clean up after a failed start).

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::os::fd::IntoRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use containerd_shim_protos::api::ShutdownRequest;
use protobuf::Message;
use ttrpc::proto::Request;

use crate::address::ShimAddress;
use crate::proxy::TASK_SERVICES;

/// Failures while driving the inner shim.
#[derive(Debug, thiserror::Error)]
pub enum InnerError {
    /// The configured delegate cannot be found.
    #[error(
        "runc shim {name:?} not found in PATH ({path}); install containerd's runc shim or set runtime.delegate in the nvinject config"
    )]
    DelegateNotFound {
        /// The configured name.
        name: PathBuf,
        /// The PATH searched.
        path: String,
    },
    /// The delegate could not be run.
    #[error("cannot run {path}: {source}")]
    Spawn {
        /// The delegate binary.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// A ttrpc call to the inner shim failed.
    #[error("{method} on the runc shim at {address} failed: {message}")]
    Call {
        /// The method called.
        method: &'static str,
        /// The inner shim's address.
        address: String,
        /// The ttrpc error.
        message: String,
    },
}

/// Finds the delegate like containerd finds shims: a name with a `/` is a path, anything else is
/// searched in `path_env`.
pub fn resolve_delegate(name: &Path, path_env: Option<&OsStr>) -> Result<PathBuf, InnerError> {
    if name.components().count() > 1 || name.is_absolute() {
        return Ok(name.to_owned());
    }
    let search = path_env.unwrap_or_else(|| OsStr::new("/usr/local/bin:/usr/bin:/bin"));
    for dir in std::env::split_paths(search) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(InnerError::DelegateNotFound { name: name.to_owned(), path: search.to_string_lossy().into_owned() })
}

/// What the inner shim's `start` printed and how it ended.
#[derive(Debug)]
pub struct InnerStart {
    /// Its stdout (the address answer on success, the error text on failure).
    pub stdout: Vec<u8>,
    /// Its exit status.
    pub status: ExitStatus,
}

/// Runs the delegate with exactly our arguments and `stdin`, our environment and working directory.
/// Its stderr goes straight to ours, so containerd sees its messages unchanged.
pub fn run_start(delegate: &Path, args: &[OsString], stdin: &[u8]) -> Result<InnerStart, InnerError> {
    let spawn_err = |source| InnerError::Spawn { path: delegate.to_owned(), source };
    let mut child = Command::new(delegate)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(spawn_err)?;
    let mut pipe = child.stdin.take().ok_or_else(|| spawn_err(io::Error::other("no stdin pipe")))?;
    // The payload is small (runtime options or bootstrap params) but write from a thread anyway so a
    // shim that prints before reading cannot deadlock us.
    let input = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&input);
    });
    let output = child.wait_with_output().map_err(spawn_err)?;
    let _ = writer.join();
    Ok(InnerStart { stdout: output.stdout, status: output.status })
}

/// Calls one task-API method on the inner shim, trying the v2 service name first (containerd 1.x
/// runc shims only register v2) and then v3.
fn call(
    address: &ShimAddress,
    method: &'static str,
    payload: Vec<u8>,
    timeout: Duration,
) -> Result<Vec<u8>, InnerError> {
    let fail = |message: String| InnerError::Call { method, address: address.to_string(), message };
    let mut last = String::new();
    for service in TASK_SERVICES {
        let stream = address.connect().map_err(|e| fail(e.to_string()))?;
        let client = ttrpc::Client::new(stream.into_raw_fd()).map_err(|e| fail(e.to_string()))?;
        let request = Request {
            service: service.to_owned(),
            method: method.to_owned(),
            payload: payload.clone(),
            timeout_nano: i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX),
            ..Default::default()
        };
        match client.request(request) {
            Ok(response) => return Ok(response.payload),
            Err(e) => last = e.to_string(),
        }
    }
    Err(fail(last))
}

/// Asks the inner shim to exit if it serves no container any more (what containerd does after a
/// failed start). Best effort: a shim that already left is fine.
pub fn shutdown(address: &ShimAddress, id: &str) -> Result<(), InnerError> {
    let payload =
        ShutdownRequest { id: id.to_owned(), ..Default::default() }.write_to_bytes().unwrap_or_default();
    match call(address, "Shutdown", payload, Duration::from_secs(5)) {
        Ok(_) => Ok(()),
        // The shim exits while answering, so the connection may close before the reply.
        Err(InnerError::Call { message, .. }) if message.to_lowercase().contains("closed") => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delegates_are_found_like_containerd_finds_shims() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("containerd-shim-runc-v2");
        std::fs::write(&bin, b"").unwrap();
        let path = std::env::join_paths([Path::new("/nonexistent"), dir.path()]).unwrap();
        assert_eq!(resolve_delegate(Path::new("containerd-shim-runc-v2"), Some(&path)).unwrap(), bin);
        assert_eq!(
            resolve_delegate(Path::new("/opt/x/shim"), Some(&path)).unwrap(),
            PathBuf::from("/opt/x/shim")
        );
        let err =
            resolve_delegate(Path::new("containerd-shim-missing"), Some(&path)).unwrap_err().to_string();
        assert!(err.contains("containerd-shim-missing") && err.contains("runtime.delegate"), "{err}");
    }

    #[test]
    fn start_passes_arguments_and_stdin_through_and_captures_stdout() {
        // A stand-in delegate: /bin/sh running a script that echoes its arguments and its stdin.
        let args: Vec<OsString> = ["-c", "printf '%s|' \"$@\"; cat; exit 3", "sh", "-id", "c1", "start"]
            .iter()
            .map(OsString::from)
            .collect();
        let out = run_start(Path::new("/bin/sh"), &args, b"\x00opts\xff").unwrap();
        assert_eq!(out.stdout, b"-id|c1|start|\x00opts\xff");
        assert_eq!(out.status.code(), Some(3));
    }
}
