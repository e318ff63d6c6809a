//! A daemon kept running the way systemd keeps containerd's own unit running (`Restart=always`,
//! `RestartSec=5`, `KillMode=process`): when the process exits, whatever the reason, a new one is
//! started after the restart delay; nothing else is killed (containers and their shims stay). This is
//! what an installer's signal restart relies on: it sends containerd SIGHUP, which ends it, and waits
//! for the supervisor's new process to answer.
//!
//! Without a restart delay the daemon is only held, and an exit stays an exit (the standalone tests'
//! nodes: a containerd that dies there is a failure to report).

use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::daemon::Daemon;
use super::error::KubeletError;

/// Starts the daemon again (same command, same log, PID recorded).
pub type Respawn = Box<dyn FnMut() -> Result<Daemon, KubeletError> + Send>;

/// One exit the supervisor saw, and what it did about it.
#[derive(Debug, Clone)]
pub struct DaemonExit {
    /// The process that exited.
    pub pid: u32,
    /// How it ended (`signal: 1 (SIGHUP)` for an installer's signal restart).
    pub status: String,
    /// When the supervisor noticed the exit (it checks every [`POLL`]).
    pub at: Instant,
    /// The process started in its place, once started.
    pub restarted: Option<(u32, Instant)>,
    /// Why no process could be started in its place.
    pub restart_error: Option<String>,
}

/// How often the supervisor checks whether the daemon exited.
pub const POLL: Duration = Duration::from_millis(20);

/// A daemon, restarted after every exit when a restart delay is given. Stopping it stops the
/// supervision first, then the process (by PID).
pub struct Supervised {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    daemon: Mutex<Option<Daemon>>,
    exits: Mutex<Vec<DaemonExit>>,
    stopping: AtomicBool,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not hide the daemon from the stop that cleans up after it.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl std::fmt::Debug for Supervised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervised")
            .field("pid", &self.pid())
            .field("exits", &self.exits().len())
            .field("supervising", &self.thread.is_some())
            .finish()
    }
}

impl Supervised {
    /// Holds `first`; with `restart_after`, a thread starts a new process through `respawn` that long
    /// after each exit.
    pub fn new(first: Daemon, restart_after: Option<Duration>, respawn: Respawn) -> Self {
        let shared = Arc::new(Shared {
            daemon: Mutex::new(Some(first)),
            exits: Mutex::new(Vec::new()),
            stopping: AtomicBool::new(false),
        });
        let thread = restart_after.map(|delay| {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("daemon-supervisor".into())
                .spawn(move || supervise(&shared, delay, respawn))
                .expect("a thread can be started")
        });
        Supervised { shared, thread }
    }

    /// The PID of the process now running (0 between an exit and its restart).
    pub fn pid(&self) -> u32 {
        locked(&self.shared.daemon).as_ref().map_or(0, Daemon::pid)
    }

    /// `Some(status)` when the process has exited (and, when supervised, not been restarted yet).
    pub fn exited(&self) -> Option<ExitStatus> {
        locked(&self.shared.daemon).as_mut().and_then(Daemon::exited)
    }

    /// The last `lines` lines of the daemon's log.
    pub fn log_tail(&self, lines: usize) -> String {
        locked(&self.shared.daemon).as_ref().map(|d| d.log_tail(lines)).unwrap_or_default()
    }

    /// Every exit seen so far, oldest first.
    pub fn exits(&self) -> Vec<DaemonExit> {
        locked(&self.shared.exits).clone()
    }

    /// Ends the supervision, then stops the process (SIGTERM, `grace`, SIGKILL).
    pub fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.shared.stopping.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let daemon = locked(&self.shared.daemon).take();
        daemon.and_then(|mut d| d.stop(grace))
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

fn supervise(shared: &Shared, delay: Duration, mut respawn: Respawn) {
    while !shared.stopping.load(Ordering::SeqCst) {
        let exit = {
            let mut daemon = locked(&shared.daemon);
            match daemon.as_mut() {
                Some(d) => d.exited().map(|status| (d.pid(), status)),
                None => None,
            }
        };
        let Some((pid, status)) = exit else {
            std::thread::sleep(POLL);
            continue;
        };
        // The exited process is reaped; the slot stays empty until the restart.
        *locked(&shared.daemon) = None;
        tracing::info!(pid, %status, restart_in = ?delay, "supervised daemon exited");
        let index = {
            let mut exits = locked(&shared.exits);
            exits.push(DaemonExit {
                pid,
                status: status.to_string(),
                at: Instant::now(),
                restarted: None,
                restart_error: None,
            });
            exits.len() - 1
        };
        let until = Instant::now() + delay;
        while Instant::now() < until {
            if shared.stopping.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(POLL);
        }
        match respawn() {
            Ok(d) => {
                let started = (d.pid(), Instant::now());
                *locked(&shared.daemon) = Some(d);
                locked(&shared.exits)[index].restarted = Some(started);
            }
            Err(e) => {
                // As systemd gives up after its start limit: the test sees the error and fails.
                tracing::error!(error = %e, "cannot restart the supervised daemon");
                locked(&shared.exits)[index].restart_error = Some(e.to_string());
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    fn sleeper(dir: &std::path::Path, seconds: &str) -> Daemon {
        let mut cmd = Command::new("sleep");
        cmd.arg(seconds);
        Daemon::spawn("sleep", cmd, &dir.join("sleep.log"), &dir.join("pids")).unwrap()
    }

    fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn an_exit_is_followed_by_a_new_process_after_the_delay() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        let first = sleeper(&d, "0.1");
        let first_pid = first.pid();
        let respawn: Respawn = Box::new(move || Ok(sleeper(&d, "30")));
        let mut s = Supervised::new(first, Some(Duration::from_millis(300)), respawn);
        wait_until("the restart", || s.exits().first().is_some_and(|e| e.restarted.is_some()));
        let exit = &s.exits()[0];
        assert_eq!(exit.pid, first_pid);
        let (new_pid, at) = exit.restarted.unwrap();
        assert_ne!(new_pid, first_pid);
        assert_eq!(s.pid(), new_pid);
        assert!(at.duration_since(exit.at) >= Duration::from_millis(300), "restarted only after the delay");
        assert!(s.stop(Duration::from_secs(5)).is_some(), "the new process is stopped");
        assert_eq!(s.exits().len(), 1, "stopping is not an exit to restart after");
    }

    #[test]
    fn without_a_delay_an_exit_stays_an_exit() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        let respawn: Respawn = Box::new(|| panic!("not supervised: never restarted"));
        let s = Supervised::new(sleeper(&d, "0.05"), None, respawn);
        wait_until("the exit", || s.exited().is_some());
        assert!(s.exits().is_empty());
    }
}
