//! `nvinject-cdi generate` as a child process: its command line as a type ([`GenerateInvocation`])
//! and one bounded run of it ([`run_generator`]).
//!
//! The shim (regenerating a stale spec at Create) and the device plugin (before Allocate answers)
//! both run the generator rather than link it, so NVML and the driver walk stay in a short-lived
//! process. They build its argv here, so a flag is spelled once; `cdi-gen/tests/invocation.rs` feeds
//! [`GenerateInvocation::to_args`] to the binary's real parser, so a renamed flag fails a test.

use std::ffi::OsString;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::codec::Format;
use crate::name::Kind;

/// The stderr bytes kept while draining: enough for the last lines, bounded whatever it writes.
const STDERR_KEPT_BYTES: usize = 16 * 1024;

/// The stderr lines kept for a message: the generator's error is the last.
const STDERR_LINES: usize = 5;

/// One `nvinject-cdi [--log-level L] generate ...` command line: every root and choice the caller
/// makes, given explicitly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerateInvocation {
    /// `--log-level` (error, warn, info, debug, trace), before the subcommand; `None`: the
    /// generator's default.
    pub log_level: Option<String>,
    /// `--driver-root`: the driver root as the host sees it.
    pub driver_root: PathBuf,
    /// `--driver-root-ctr-path`: where the driver root is mounted for the generator, when that
    /// differs.
    pub driver_root_ctr_path: Option<PathBuf>,
    /// `--dev-root`: the root of `dev/nvidia*` as the host sees it.
    pub dev_root: PathBuf,
    /// `--proc-root`: where the generator reads `devices` and the MIG minors.
    pub proc_root: PathBuf,
    /// `--sys-root`: where the generator reads `module/nvidia/version`.
    pub sys_root: PathBuf,
    /// `--hook-path`: the host path of `nvinject-hook` written into the spec.
    pub hook_path: PathBuf,
    /// `--nvml-lib`: the NVML library to load; `None`: the generator finds it.
    pub nvml_lib: Option<PathBuf>,
    /// `--mps-pipe-dir`: the MPS pipe directory the spec mounts; `None`: no MPS.
    pub mps_pipe_dir: Option<PathBuf>,
    /// `--hook-timeout-secs`: the OCI timeout of the spec's hook runs; `None`: the generator's
    /// default ([`super::DEFAULT_HOOK_TIMEOUT_SECS`]).
    pub hook_timeout_secs: Option<u32>,
    /// `--output`: the spec file, written atomically.
    pub output: PathBuf,
    /// `--vendor` and `--class`; `None`: the generator's default ([`super::DEFAULT_KIND`]).
    pub kind: Option<Kind>,
    /// `--format`.
    pub format: Format,
}

impl GenerateInvocation {
    /// The arguments after the program, in a fixed order.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        if let Some(level) = &self.log_level {
            args.extend(["--log-level".into(), level.into()]);
        }
        args.push("generate".into());
        let mut flag = |name: &str, value: &Path| {
            args.push(name.into());
            args.push(value.into());
        };
        flag("--driver-root", &self.driver_root);
        if let Some(ctr) = &self.driver_root_ctr_path {
            flag("--driver-root-ctr-path", ctr);
        }
        flag("--dev-root", &self.dev_root);
        flag("--proc-root", &self.proc_root);
        flag("--sys-root", &self.sys_root);
        flag("--hook-path", &self.hook_path);
        if let Some(lib) = &self.nvml_lib {
            flag("--nvml-lib", lib);
        }
        if let Some(dir) = &self.mps_pipe_dir {
            flag("--mps-pipe-dir", dir);
        }
        if let Some(secs) = self.hook_timeout_secs {
            flag("--hook-timeout-secs", Path::new(&secs.to_string()));
        }
        flag("--output", &self.output);
        if let Some(kind) = &self.kind {
            args.extend(["--vendor".into(), kind.vendor().into(), "--class".into(), kind.class().into()]);
        }
        args.extend(["--format".into(), self.format.extension().into()]);
        args
    }
}

/// The generator did not write a fresh spec.
#[derive(Debug, thiserror::Error)]
pub enum GeneratorError {
    /// It could not be started (not installed, or not executable). Each caller adds its own fix
    /// (the key or flag that names the program).
    #[error("cannot run {}: {source}", program.display())]
    Start {
        /// The generator binary.
        program: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// Its exit could not be waited for.
    #[error("cannot wait for {}: {source}", program.display())]
    Wait {
        /// The generator binary.
        program: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// It ran past the bound and was killed: a caller must not hang on it.
    #[error("{} generate did not finish within {} s and was killed; {stderr}", program.display(), after.as_secs())]
    TimedOut {
        /// The generator binary.
        program: PathBuf,
        /// The bound.
        after: Duration,
        /// The end of what it wrote on stderr.
        stderr: StderrTail,
    },
    /// It exited with an error.
    #[error("{} generate failed ({status}); {stderr}", program.display())]
    Failed {
        /// The generator binary.
        program: PathBuf,
        /// How it exited.
        status: ExitStatus,
        /// The end of what it wrote on stderr (its error is the last line).
        stderr: StderrTail,
    },
}

/// The last lines a generator wrote on stderr, for a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StderrTail(pub String);

impl StderrTail {
    /// The last non-empty lines of `bytes`, trimmed and joined with ` | `.
    pub fn from_bytes(bytes: &[u8]) -> StderrTail {
        let text = String::from_utf8_lossy(bytes);
        let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        StderrTail(lines[lines.len().saturating_sub(STDERR_LINES)..].join(" | "))
    }
}

impl fmt::Display for StderrTail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() { f.write_str("nothing on stderr") } else { write!(f, "stderr: {}", self.0) }
    }
}

/// Runs `program args` to completion within `timeout`, killing it past the bound. Its stderr is
/// drained (a full pipe would stall it) and its last lines kept for the error; stdin and stdout
/// are null.
pub fn run_generator(program: &Path, args: &[OsString], timeout: Duration) -> Result<(), GeneratorError> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| GeneratorError::Start { program: program.to_owned(), source })?;
    let stderr = child.stderr.take();
    let (sender, kept) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut kept, mut buf) = (Vec::new(), [0u8; 4096]);
        if let Some(mut stderr) = stderr {
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > STDERR_KEPT_BYTES {
                    kept.drain(..kept.len() - STDERR_KEPT_BYTES);
                }
            }
        }
        let _ = sender.send(kept);
    });
    let started = Instant::now();
    // `None`: it ran past the bound and was killed.
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(source) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(GeneratorError::Wait { program: program.to_owned(), source });
            }
        }
    };
    // Bounded too: a process the generator left behind could hold its stderr open.
    let stderr = StderrTail::from_bytes(&kept.recv_timeout(Duration::from_secs(1)).unwrap_or_default());
    match status {
        Some(status) if status.success() => Ok(()),
        Some(status) => Err(GeneratorError::Failed { program: program.to_owned(), status, stderr }),
        None => Err(GeneratorError::TimedOut { program: program.to_owned(), after: timeout, stderr }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invocation() -> GenerateInvocation {
        GenerateInvocation {
            log_level: None,
            driver_root: "/run/nvidia/driver".into(),
            driver_root_ctr_path: None,
            dev_root: "/".into(),
            proc_root: "/proc".into(),
            sys_root: "/sys".into(),
            hook_path: "/usr/local/nvinject/bin/nvinject-hook".into(),
            nvml_lib: None,
            mps_pipe_dir: None,
            hook_timeout_secs: None,
            output: "/var/run/cdi/nvidia.com-gpu.json".into(),
            kind: None,
            format: Format::Json,
        }
    }

    fn text(args: &[OsString]) -> String {
        args.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn optional_flags_are_left_out_when_unset_and_in_place_when_set() {
        assert_eq!(
            text(&invocation().to_args()),
            "generate --driver-root /run/nvidia/driver --dev-root / --proc-root /proc --sys-root /sys \
             --hook-path /usr/local/nvinject/bin/nvinject-hook --output /var/run/cdi/nvidia.com-gpu.json \
             --format json"
        );
        let full = GenerateInvocation {
            log_level: Some("warn".into()),
            driver_root_ctr_path: Some("/driver-root".into()),
            nvml_lib: Some("/lib/libnvidia-ml.so.1".into()),
            mps_pipe_dir: Some("/run/nvidia/mps".into()),
            hook_timeout_secs: Some(45),
            kind: Some("example.com/gpu".parse().unwrap()),
            format: Format::Yaml,
            ..invocation()
        };
        assert_eq!(
            text(&full.to_args()),
            "--log-level warn generate --driver-root /run/nvidia/driver --driver-root-ctr-path /driver-root \
             --dev-root / --proc-root /proc --sys-root /sys --hook-path /usr/local/nvinject/bin/nvinject-hook \
             --nvml-lib /lib/libnvidia-ml.so.1 --mps-pipe-dir /run/nvidia/mps --hook-timeout-secs 45 \
             --output /var/run/cdi/nvidia.com-gpu.json --vendor example.com --class gpu --format yaml"
        );
    }

    #[test]
    fn the_stderr_tail_keeps_the_last_non_empty_lines() {
        let tail = StderrTail::from_bytes(b"a\n\nb\n c \nd\ne\nf\n\n");
        assert_eq!(tail.to_string(), "stderr: b | c | d | e | f");
        assert_eq!(StderrTail::from_bytes(b"\n \n").to_string(), "nothing on stderr");
    }
}
