//! Running commands, finding processes by what they were started with, and stopping them by PID.
//!
//! Tests only ever stop processes they can attribute to themselves: a PID they spawned, or a process
//! whose command line names one of their private directories or sockets (the shims their private
//! containerd started). Never by program name.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::error::{HarnessError, Result};

/// Gives `cmd` (containerd, which starts the shims, runc and the hooks) the environment a service
/// manager would, not the test runner's: cargo puts its target directories and the toolchain's
/// libraries on `LD_LIBRARY_PATH` for tests and benches, and the loader of every dynamically linked
/// program containerd starts would first search them all (~170 failed opens per start of a shim),
/// which no node does and which would skew what the benchmarks measure.
///
/// Its signals start at their defaults too, as a service manager starts a unit: a test run under
/// `nohup` (or any parent that ignores SIGHUP) would otherwise hand containerd an ignored SIGHUP,
/// which Go keeps ignored, and the installer's signal restart would wait for an exit that never
/// comes. (`std` already clears the signal mask and SIGPIPE's disposition.)
pub fn as_node_service(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: only `signal(2)`, async-signal-safe, runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGQUIT] {
                if libc::signal(sig, libc::SIG_DFL) == libc::SIG_ERR {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.env_remove("LD_LIBRARY_PATH")
}

/// Runs `cmd` to completion; fails with its stderr when it exits non-zero.
pub fn run(cmd: &mut Command) -> Result<Output> {
    let output = output(cmd)?;
    if !output.status.success() {
        return Err(command_error(cmd, &output));
    }
    Ok(output)
}

/// Runs `cmd` to completion and returns its output whatever the exit status.
pub fn output(cmd: &mut Command) -> Result<Output> {
    cmd.output().map_err(|e| HarnessError::Command {
        command: describe(cmd),
        status: "not started".into(),
        output: e.to_string(),
    })
}

/// The error for a command that ran and failed.
pub fn command_error(cmd: &Command, output: &Output) -> HarnessError {
    HarnessError::Command {
        command: describe(cmd),
        status: output.status.to_string(),
        output: nvinject_image_tool::command::failure_text(output),
    }
}

/// A command line as text, for messages.
pub use nvinject_image_tool::command::describe;

/// A running process as seen in /proc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Its PID.
    pub pid: i32,
    /// Its parent's PID.
    pub ppid: i32,
    /// argv, NUL-separated in /proc, here split.
    pub argv: Vec<String>,
    /// Resident set size in KiB (VmRSS).
    pub rss_kib: u64,
}

/// Every live process whose command line contains `needle` (zombies and kernel threads excluded).
pub fn find_processes(needle: &str) -> Vec<ProcessInfo> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut found = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if pid == std::process::id() as i32 {
            continue;
        }
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else { continue };
        if raw.is_empty() {
            continue;
        }
        let argv: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if !argv.iter().any(|a| a.contains(needle)) {
            continue;
        }
        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().next().unwrap_or("").to_owned())
        };
        if field("State:").is_some_and(|s| s == "Z") {
            continue;
        }
        found.push(ProcessInfo {
            pid,
            ppid: field("PPid:").and_then(|v| v.parse().ok()).unwrap_or(0),
            argv,
            rss_kib: field("VmRSS:").and_then(|v| v.parse().ok()).unwrap_or(0),
        });
    }
    found.sort_by_key(|p| p.pid);
    found
}

/// Whether `pid` is alive (and not a zombie).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(status) => !status.lines().any(|l| l.starts_with("State:") && l.contains('Z')),
        Err(_) => false,
    }
}

/// Sends SIGTERM to `pid`, waits up to `grace`, then SIGKILL. Returns when it is gone.
pub fn stop_pid(pid: i32, grace: Duration) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    if !alive(pid) {
        return;
    }
    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if alive(pid) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Polls `check` every 20 ms until it returns `Some`, or fails after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(HarnessError::Timeout { what: what.to_owned(), seconds: timeout.as_secs() });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last `lines` lines of a file, for failure messages (empty when unreadable).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Fails unless running as root (the real-parts tests need it; CI runs as root).
pub fn ensure_root() -> Result<()> {
    if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err(HarnessError::Prerequisite("these tests start containerd and runc and must run as root".into()))
    }
}

/// Fails unless `program` exists.
pub fn require_file(program: &Path, hint: &str) -> Result<()> {
    if program.exists() {
        Ok(())
    } else {
        Err(HarnessError::Prerequisite(format!("{} not found: {hint}", program.display())))
    }
}

/// What [`run_with_deadline`] saw.
#[derive(Debug)]
pub struct Deadlined {
    /// The exit code (`None`: killed by a signal, or by us at the deadline).
    pub status: Option<i32>,
    /// Whether it was still running at the deadline (and was then killed by PID).
    pub timed_out: bool,
    /// The path its stderr went to.
    pub stderr_path: std::path::PathBuf,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

/// Runs `cmd` with stdin closed and stdout/stderr into `<dir>/<name>.out` and `.err` (files, so a
/// chatty child never blocks on a pipe), waiting at most `timeout`; at the deadline it is stopped
/// by its PID and `on_timeout` runs (to clean up what it left).
pub fn run_with_deadline(
    cmd: &mut Command,
    dir: &Path,
    name: &str,
    timeout: Duration,
    on_timeout: impl FnOnce(),
) -> Result<Deadlined> {
    use crate::error::io;
    use std::process::Stdio;
    std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    let (out_path, err_path) = (dir.join(format!("{name}.out")), dir.join(format!("{name}.err")));
    let out = std::fs::File::create(&out_path).map_err(io("create", &out_path))?;
    let err = std::fs::File::create(&err_path).map_err(io("create", &err_path))?;
    let mut child = cmd.stdin(Stdio::null()).stdout(out).stderr(err).spawn().map_err(|e| {
        HarnessError::Command { command: describe(cmd), status: "not started".into(), output: e.to_string() }
    })?;
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        if let Some(s) = child.try_wait().map_err(io("wait for", &out_path))? {
            break s.code();
        }
        if Instant::now() >= deadline {
            timed_out = true;
            stop_pid(child.id() as i32, Duration::from_secs(2));
            let _ = child.wait();
            on_timeout();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    Ok(Deadlined { status, timed_out, stderr_path: err_path, stdout, stderr })
}
