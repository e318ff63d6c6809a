//! A long-running process a test started (containerd, the kubelet, the device plugin): its output goes to
//! a log file, its PID is recorded, and it is stopped by that PID (SIGTERM, then SIGKILL) and reaped.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::error::KubeletError;

/// A started daemon. Dropping it stops it (a test that panics still cleans up).
#[derive(Debug)]
pub struct Daemon {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Daemon {
    /// Starts `cmd` with stdin closed and stdout/stderr appended to `log`; appends `<pid> <name>` to
    /// `pid_file` so an outer watchdog can find it.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path, pid_file: &Path) -> Result<Self, KubeletError> {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|source| KubeletError::Io { op: "open log", path: log.to_path_buf(), source })?;
        let err = out.try_clone().map_err(|source| KubeletError::Io {
            op: "dup log",
            path: log.to_path_buf(),
            source,
        })?;
        let child = cmd.stdin(Stdio::null()).stdout(out).stderr(err).spawn().map_err(|e| {
            KubeletError::Command { command: format!("{cmd:?}"), detail: format!("cannot start {name}: {e}") }
        })?;
        // Owned from here on: if recording the PID fails, dropping `daemon` stops the process.
        let daemon = Daemon { name: name.to_owned(), child: Some(child), log: log.to_path_buf() };
        let pid = daemon.pid();
        let mut pids = OpenOptions::new()
            .create(true)
            .append(true)
            .open(pid_file)
            .map_err(|source| KubeletError::Io { op: "open", path: pid_file.to_path_buf(), source })?;
        writeln!(pids, "{pid} {name}").map_err(|source| KubeletError::Io {
            op: "write",
            path: pid_file.to_path_buf(),
            source,
        })?;
        tracing::info!(daemon = name, pid, log = %log.display(), "started");
        Ok(daemon)
    }

    /// The process ID (0 once stopped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The daemon's name, as given to [`Daemon::spawn`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// `Some(status)` when the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// The last `lines` lines of the log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        crate::process::log_tail(&self.log, lines)
    }

    /// Sends SIGTERM, waits up to `grace`, then SIGKILL; reaps the process. Returns how it ended.
    pub fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        let pid = Pid::from_raw(child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                tracing::info!(daemon = %self.name, pid = pid.as_raw(), %status, "stopped");
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::warn!(daemon = %self.name, pid = pid.as_raw(), "no exit after SIGTERM; sending SIGKILL");
        let _ = kill(pid, Signal::SIGKILL);
        child.wait().ok()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

// Beside `Daemon` rather than with the error, so that the error module needs nothing of this one.
impl KubeletError {
    /// Appends the end of `daemon`'s log, unless the error already carries it.
    pub fn with_log(self, daemon: &Daemon) -> Self {
        match self {
            e @ KubeletError::Exited { .. } => e,
            e => e.with_context(format!(
                "{} log ({}):\n{}",
                daemon.name(),
                daemon.log().display(),
                daemon.log_tail(25)
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_whose_pid_cannot_be_recorded_is_stopped_not_left_running() {
        let dir = tempfile::tempdir().unwrap();
        // A duration no other process on the machine has on its command line.
        let marker = format!("3000.{}", std::process::id());
        let mut cmd = Command::new("sleep");
        cmd.arg(&marker);
        let no_dir = dir.path().join("missing/pids");
        let err = Daemon::spawn("sleeper", cmd, &dir.path().join("sleeper.log"), &no_dir).unwrap_err();
        assert!(err.to_string().contains("missing/pids"), "{err}");
        let left = crate::process::find_processes(&marker);
        for p in &left {
            crate::process::stop_pid(p.pid, Duration::from_secs(1));
        }
        assert!(left.is_empty(), "the started process was left running: {left:?}");
    }
}
