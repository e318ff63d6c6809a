//! The real [`Regenerate`]: runs `nvinject-cdi generate`, the binary the installer and the device
//! plugin run, with the roots the spec recorded.
//!
//! A separate process, so the proxy, which lives as long as its pod, never loads NVML or walks
//! the driver's files: those stay in a short-lived generator that exits when the spec is written
//! (atomically, by the generator). The wait is bounded; a generator that hangs is killed and the
//! Create fails naming it.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nvinject_cdi::Format;
use nvinject_cdi::nvinject::{GenerateInvocation, run_generator};

use crate::freshness::{GeneratorError, Regenerate, RegenerateRequest};

/// How long one regeneration may take before it is killed. A Create waits for it, and kubelet
/// gives a Create two minutes (`--runtime-request-timeout`): this leaves it time to fail clearly.
/// NVML discovery on a large node takes seconds.
pub const GENERATE_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `program generate ...` for each request.
#[derive(Debug, Clone)]
pub struct CdiGenCommand {
    /// The `nvinject-cdi` binary: `[regenerate] generator`, else the one beside the shim.
    pub program: PathBuf,
    /// `[regenerate] proc-root`: where the generator reads `devices` and the MIG minors.
    pub proc_root: PathBuf,
    /// `[regenerate] sys-root`: where the generator reads `module/nvidia/version`.
    pub sys_root: PathBuf,
    /// `[regenerate] mps-pipe-dir`: the MPS pipe directory regenerated specs mount, if any.
    pub mps_pipe_dir: Option<PathBuf>,
    /// `[regenerate] hook-timeout-secs`: the OCI timeout of the regenerated spec's hook runs.
    pub hook_timeout_secs: u32,
    /// How long a run may take ([`GENERATE_TIMEOUT`] outside tests).
    pub timeout: Duration,
}

impl CdiGenCommand {
    /// The generator's command line for `request`: every root and choice given explicitly, so
    /// the spec is the one the generator's library would make from the same request (the
    /// generator's own defaults never enter).
    pub fn invocation(&self, request: &RegenerateRequest) -> GenerateInvocation {
        GenerateInvocation {
            // Only warnings and the error on stderr: that is what a failed Create shows.
            log_level: Some("warn".into()),
            driver_root: request.driver_root.clone(),
            driver_root_ctr_path: None,
            dev_root: request.dev_root.clone(),
            proc_root: self.proc_root.clone(),
            sys_root: self.sys_root.clone(),
            hook_path: request.hook_path.clone(),
            nvml_lib: request.nvml_lib.clone(),
            mps_pipe_dir: self.mps_pipe_dir.clone(),
            hook_timeout_secs: Some(self.hook_timeout_secs),
            output: request.spec_path.clone(),
            kind: Some(request.kind.clone()),
            format: Format::from_path(&request.spec_path).unwrap_or(Format::Yaml),
        }
    }

    /// The arguments after the program for `request` ([`CdiGenCommand::invocation`]).
    pub fn args(&self, request: &RegenerateRequest) -> Vec<OsString> {
        self.invocation(request).to_args()
    }
}

impl Regenerate for CdiGenCommand {
    fn regenerate(&self, request: &RegenerateRequest) -> Result<(), GeneratorError> {
        let started = Instant::now();
        run_generator(&self.program, &self.args(request), self.timeout)?;
        tracing::debug!(
            generator = %self.program.display(),
            spec = %request.spec_path.display(),
            ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "generator finished"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    fn request(spec: &Path) -> RegenerateRequest {
        RegenerateRequest {
            spec_path: spec.to_owned(),
            kind: "example.com/gpu".parse().unwrap(),
            driver_root: "/run/nvidia/driver".into(),
            dev_root: "/".into(),
            nvml_lib: Some("/run/nvidia/driver/lib/libnvidia-ml.so.1".into()),
            hook_path: "/opt/nvinject/bin/nvinject-hook".into(),
            stale_version: "550.54.15".into(),
            loaded_version: "555.42.02".into(),
        }
    }

    /// A generator script in a temp dir, and a command running it.
    fn generator(script: &str, timeout: Duration) -> (tempfile::TempDir, CdiGenCommand) {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("nvinject-cdi");
        fs::write(&program, format!("#!/bin/sh\n{script}\n")).unwrap();
        fs::set_permissions(&program, fs::Permissions::from_mode(0o755)).unwrap();
        let command = CdiGenCommand {
            program,
            proc_root: "/host/proc".into(),
            sys_root: "/host/sys".into(),
            mps_pipe_dir: Some("/run/nvidia/mps".into()),
            hook_timeout_secs: 12,
            timeout,
        };
        (dir, command)
    }

    #[test]
    fn every_choice_is_passed_as_a_flag_of_generate() {
        let (dir, command) = generator(r#"printf '%s\n' "$@" > "$(dirname "$0")/args""#, GENERATE_TIMEOUT);
        let spec = dir.path().join("example.com-gpu.json");
        command.regenerate(&request(&spec)).unwrap();
        let args = fs::read_to_string(dir.path().join("args")).unwrap();
        let want = [
            "--log-level",
            "warn",
            "generate",
            "--driver-root",
            "/run/nvidia/driver",
            "--dev-root",
            "/",
            "--proc-root",
            "/host/proc",
            "--sys-root",
            "/host/sys",
            "--hook-path",
            "/opt/nvinject/bin/nvinject-hook",
            "--nvml-lib",
            "/run/nvidia/driver/lib/libnvidia-ml.so.1",
            "--mps-pipe-dir",
            "/run/nvidia/mps",
            "--hook-timeout-secs",
            "12",
            "--output",
            &spec.display().to_string(),
            "--vendor",
            "example.com",
            "--class",
            "gpu",
            "--format",
            "json",
        ];
        assert_eq!(args.lines().collect::<Vec<_>>(), want);
        // A .yaml spec (or one with no known extension) is written as YAML.
        let yaml = command.args(&request(Path::new("/etc/cdi/x.yaml")));
        assert_eq!(yaml[yaml.len() - 2..], ["--format".into(), OsString::from("yaml")]);
    }

    #[test]
    fn a_failing_generator_is_named_with_its_exit_and_last_stderr_lines() {
        let (_dir, command) = generator(
            "for i in 1 2 3 4 5 6; do echo \"noise $i\" >&2; done\necho 'nvinject-cdi: error: NVML not loadable' >&2\nexit 3",
            GENERATE_TIMEOUT,
        );
        let e = command.regenerate(&request(Path::new("/x.json"))).unwrap_err();
        assert!(matches!(e, GeneratorError::Failed { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!(
                "{} generate failed (exit status: 3); stderr: noise 3 | noise 4 | noise 5 | noise 6 | nvinject-cdi: error: NVML not loadable",
                command.program.display()
            )
        );
    }

    #[test]
    fn a_hanging_generator_is_killed_at_the_bound() {
        let (_dir, command) = generator("echo starting >&2\nexec sleep 600", Duration::from_millis(200));
        let e = command.regenerate(&request(Path::new("/x.json"))).unwrap_err();
        assert!(matches!(e, GeneratorError::TimedOut { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains(&command.program.display().to_string())
                && text.contains("was killed")
                && text.ends_with("stderr: starting"),
            "{text}"
        );
    }

    #[test]
    fn a_missing_generator_says_where_it_was_looked_for_and_what_to_do() {
        let command = CdiGenCommand {
            program: "/nonexistent/nvinject-cdi".into(),
            proc_root: "/proc".into(),
            sys_root: "/sys".into(),
            mps_pipe_dir: None,
            hook_timeout_secs: nvinject_cdi::nvinject::DEFAULT_HOOK_TIMEOUT_SECS,
            timeout: GENERATE_TIMEOUT,
        };
        let e = command.regenerate(&request(Path::new("/x.json"))).unwrap_err();
        assert!(matches!(e, GeneratorError::Start { .. }), "{e:?}");
        // The message a failed Create carries (the shim adds its fix to the shared error).
        let text = crate::freshness::RegenerateError::from(e).to_string();
        assert!(
            text.contains("/nonexistent/nvinject-cdi") && text.contains("[regenerate] generator"),
            "{text}"
        );
        // A quiet failure still reads as a sentence.
        let (_dir, quiet) = generator("exit 1", GENERATE_TIMEOUT);
        let text = quiet.regenerate(&request(Path::new("/x.json"))).unwrap_err().to_string();
        assert!(text.ends_with("(exit status: 1); nothing on stderr"), "{text}");
    }
}
