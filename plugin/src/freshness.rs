//! Keeps the CDI spec fresh *before* containerd reads it.
//!
//! containerd 2.x (and 1.7 with `enable_cdi = true`) resolves the `cdi.k8s.io/` annotations this
//! plugin hands out itself, in its CRI plugin, before our shim sees the container: the shim then
//! finds the edits already applied and its own stale-spec regeneration never runs. After a driver
//! upgrade containerd would inject the old driver's paths (or fail the container when the spec is
//! missing). So the plugin, which every GPU container's request passes through first, checks the
//! spec against the loaded driver before it answers Allocate and regenerates it with `nvinject-cdi`
//! when it is stale or missing; a periodic watch does the same between requests, so a spec is stale
//! at most one watch interval even for containers that do not pass through Allocate again (a pod's
//! restarted containers).
//!
//! Staleness is decided exactly as the shim decides it: the spec's `nvinject.io/driver-version`
//! annotation against the loaded module's version (`<sys>/module/nvidia/version`, else the NVRM
//! line under `<proc>`, read by cdi-gen's own function). The spec is written by `nvinject-cdi`
//! atomically (temp file and rename), so containerd, the shim and this plugin never see half a
//! spec, and two regenerations racing (plugin and shim) both write the same complete file.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nvinject_cdi::Format;
use nvinject_cdi::nvinject::{ANNOTATION_DRIVER_VERSION, GenerateInvocation, GeneratorError, run_generator};
use nvinject_cdi::trust::Role;

/// How long one regeneration may take before it is killed and the check fails.
pub const GENERATE_TIMEOUT: Duration = Duration::from_secs(120);

/// A check that could not make the spec fresh.
#[derive(Debug, thiserror::Error)]
pub enum FreshnessError {
    /// `nvinject-cdi` could not be started, failed, or timed out.
    #[error(
        "CDI spec {} is {why} (loaded driver {loaded}) and `{command}` failed: {message}; fix the generator's \
         error above, or regenerate by hand with nvinject-cdi generate",
        spec.display()
    )]
    Generate {
        /// The spec.
        spec: PathBuf,
        /// `stale (driver X)` or `missing`.
        why: String,
        /// The loaded driver's version.
        loaded: String,
        /// The command line.
        command: String,
        /// What went wrong.
        message: String,
    },
    /// The spec needs writing but its owner, the installer, is not ready (see
    /// [`SpecFreshness::written_only_while`]).
    #[error(
        "CDI spec {} is {why} (loaded driver {loaded}) and is not regenerated while {} is missing: the \
         spec is nvinject-installer's until it has finished on this node; check that the installer is \
         running there (its log names what it is waiting for)",
        spec.display(),
        ready_file.display()
    )]
    InstallerNotReady {
        /// The spec.
        spec: PathBuf,
        /// `stale (driver X)` or `missing or unreadable`.
        why: String,
        /// The loaded driver's version.
        loaded: String,
        /// The installer's ready file.
        ready_file: PathBuf,
    },
    /// The spec (or its folder) fails the spec-trust check ([`nvinject_cdi::trust`]) even after
    /// regeneration: the shim would refuse it, so it is not handed out.
    #[error("{error}")]
    Untrusted {
        /// Names the file or folder, its owner and mode, and the fix.
        error: nvinject_cdi::UntrustedError,
    },
    /// The generator ran but the spec is still not for the loaded driver.
    #[error(
        "CDI spec {} still records driver {found:?} after regeneration, but driver {loaded} is loaded: check \
         that --cdi-generator writes --cdi-spec and reads the same sys/proc roots",
        spec.display()
    )]
    StillStale {
        /// The spec.
        spec: PathBuf,
        /// What it records now.
        found: String,
        /// The loaded driver's version.
        loaded: String,
    },
}

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The spec is for the loaded driver.
    Fresh,
    /// It was stale (`from`: the version it recorded; empty when it was missing) and was regenerated.
    Regenerated {
        /// The version the old spec recorded (`""`: there was none).
        from: String,
        /// The loaded driver's version, which the new spec records.
        to: String,
    },
    /// No driver version could be read (module not loaded): nothing to compare with.
    NoDriver,
}

/// What identifies the spec file and driver last found fresh: a check that sees the same skips
/// reading and parsing the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    loaded: String,
    file: FileIdentity,
}

/// Device, inode, modification time, size and change time (a chmod or chown changes the last).
type FileIdentity = (u64, u64, i64, i64, u64, i64, i64);

/// The spec to keep fresh and how to regenerate it.
#[derive(Debug)]
pub struct SpecFreshness {
    spec: PathBuf,
    sys_root: PathBuf,
    proc_root: PathBuf,
    program: PathBuf,
    args: Vec<OsString>,
    ready_file: Option<PathBuf>,
    last: Mutex<Option<Seen>>,
}

/// Where a regenerated spec's files are, for [`generate_args`].
#[derive(Debug, Clone, Copy)]
pub struct GenerateRoots<'a> {
    /// The spec to write.
    pub spec: &'a Path,
    /// The driver root as the host sees it (the spec's host paths start here).
    pub driver_root: &'a Path,
    /// Where that root is mounted for this process, when it differs.
    pub container_driver_root: Option<&'a Path>,
    /// The root of `dev/nvidia*`.
    pub dev_root: &'a Path,
    /// Where `devices` and `driver/nvidia-caps` are read.
    pub proc_root: &'a Path,
    /// Where `module/nvidia/version` is read.
    pub sys_root: &'a Path,
    /// The hook path the spec names.
    pub hook: &'a Path,
    /// The node's MPS pipe directory (host path), when MPS is configured: the regenerated spec
    /// keeps its `mps` device, which the plugin hands out with MPS-shared GPUs.
    pub mps_pipe_dir: Option<&'a Path>,
    /// The OCI timeout of the spec's hook runs, in seconds.
    pub hook_timeout_secs: u32,
}

/// `nvinject-cdi generate`'s arguments for a spec over these roots, in JSON, of the default kind,
/// through the generator's one command-line type.
pub fn generate_args(roots: &GenerateRoots<'_>) -> Vec<OsString> {
    GenerateInvocation {
        log_level: None,
        driver_root: roots.driver_root.to_owned(),
        driver_root_ctr_path: roots.container_driver_root.map(Path::to_owned),
        dev_root: roots.dev_root.to_owned(),
        proc_root: roots.proc_root.to_owned(),
        sys_root: roots.sys_root.to_owned(),
        hook_path: roots.hook.to_owned(),
        nvml_lib: None,
        mps_pipe_dir: roots.mps_pipe_dir.map(Path::to_owned),
        hook_timeout_secs: Some(roots.hook_timeout_secs),
        output: roots.spec.to_owned(),
        kind: None,
        format: Format::Json,
    }
    .to_args()
}

impl SpecFreshness {
    /// Keeps `spec` fresh against the driver under `sys_root`/`proc_root`, regenerating with
    /// `program args...`.
    pub fn new(
        spec: PathBuf,
        sys_root: PathBuf,
        proc_root: PathBuf,
        program: PathBuf,
        args: Vec<OsString>,
    ) -> Self {
        SpecFreshness { spec, sys_root, proc_root, program, args, ready_file: None, last: Mutex::new(None) }
    }

    /// Writes the spec only while `ready_file` exists (`None` or empty: always). The installer
    /// creates the spec and records it as its own; a spec this plugin wrote before the installer's
    /// first run would look like one that was there before, which the installer keeps at
    /// uninstall. Until then a spec that is missing or stale is reported, never handed out.
    pub fn written_only_while(mut self, ready_file: Option<PathBuf>) -> Self {
        self.ready_file = ready_file.filter(|p| !p.as_os_str().is_empty());
        self
    }

    /// The spec kept fresh.
    pub fn spec(&self) -> &Path {
        &self.spec
    }

    /// Makes sure the spec is for the loaded driver, regenerating it when it is stale or missing.
    /// Concurrent callers wait for one another: one regeneration serves them all.
    pub fn ensure_fresh(&self) -> Result<Outcome, FreshnessError> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let Ok((loaded, _)) = nvinject_cdi::nvinject::read_driver_version(&self.sys_root, &self.proc_root)
        else {
            *last = None;
            return Ok(Outcome::NoDriver);
        };
        // The spec's folders first, every time (a few stats): a chmod of a folder changes nothing
        // the file's identity shows, and a folder others may change stays so whatever is written
        // in it, so there is nothing to regenerate.
        if let Some(dir) = self.spec.parent()
            && dir.exists()
            && let Err(error) =
                nvinject_cdi::trust::check_dirs(&self.spec, dir, &nvinject_cdi::Owners::this_process())
        {
            *last = None;
            return Err(FreshnessError::Untrusted { error: error.with_host_names() });
        }
        let file = self.identity();
        if let (Some(seen), Some(file)) = (last.as_ref(), file)
            && seen.loaded == loaded
            && seen.file == file
        {
            return Ok(Outcome::Fresh);
        }
        // What is read back goes through the same trust check as the shim's: an untrusted spec is
        // regenerated (the generator renames a root-owned 0644 file over it), never handed out.
        let (recorded, untrusted) = match self.recorded_version() {
            Ok(v) => (v, None),
            Err(e) => (None, Some(e)),
        };
        if recorded.as_deref() == Some(loaded.as_str()) {
            *last = file.map(|file| Seen { loaded, file });
            return Ok(Outcome::Fresh);
        }
        *last = None;
        // A folder changed since the check above: as there, nothing to regenerate.
        if let Some(error) = untrusted
            .as_ref()
            .filter(|e| !matches!(e, nvinject_cdi::UntrustedError::Untrusted { role: Role::File, .. }))
        {
            return Err(FreshnessError::Untrusted { error: error.clone() });
        }
        let why = match (&recorded, &untrusted) {
            (_, Some(e)) => format!("untrusted ({e})"),
            (Some(v), None) => format!("stale (driver {v})"),
            (None, None) => "missing or unreadable".to_owned(),
        };
        if let Some(ready) = self.ready_file.as_ref().filter(|r| !r.exists()) {
            return Err(FreshnessError::InstallerNotReady {
                spec: self.spec.clone(),
                why,
                loaded,
                ready_file: ready.clone(),
            });
        }
        tracing::info!(spec = %self.spec.display(), %why, loaded, "regenerating the CDI spec before containerd reads it");
        self.run_generator().map_err(|message| FreshnessError::Generate {
            spec: self.spec.clone(),
            why: why.clone(),
            loaded: loaded.clone(),
            command: self.command_line(),
            message,
        })?;
        let now = self.recorded_version().map_err(|error| FreshnessError::Untrusted { error })?;
        if now.as_deref() != Some(loaded.as_str()) {
            return Err(FreshnessError::StillStale {
                spec: self.spec.clone(),
                found: now.unwrap_or_default(),
                loaded,
            });
        }
        *last = self.identity().map(|file| Seen { loaded: loaded.clone(), file });
        tracing::info!(spec = %self.spec.display(), from = recorded.as_deref().unwrap_or(""), to = loaded, "CDI spec regenerated");
        Ok(Outcome::Regenerated { from: recorded.unwrap_or_default(), to: loaded })
    }

    /// A rename over the spec changes the inode; a chmod or chown its change time.
    fn identity(&self) -> Option<FileIdentity> {
        let m = std::fs::metadata(&self.spec).ok()?;
        Some((m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.size(), m.ctime(), m.ctime_nsec()))
    }

    /// The driver version the spec records; `Ok(None)` when it is missing, unreadable or has none;
    /// `Err` when it fails the spec-trust check.
    fn recorded_version(&self) -> Result<Option<String>, nvinject_cdi::UntrustedError> {
        match nvinject_cdi::load_trusted_file(&self.spec, &nvinject_cdi::Owners::this_process(), false) {
            Ok((spec, _)) => Ok(spec.annotations.get(ANNOTATION_DRIVER_VERSION).cloned()),
            Err(nvinject_cdi::SpecError::Untrusted(e)) => Err(e),
            Err(_) => Ok(None),
        }
    }

    fn command_line(&self) -> String {
        std::iter::once(self.program.as_os_str())
            .chain(self.args.iter().map(OsString::as_os_str))
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Runs the generator to completion (bounded by [`GENERATE_TIMEOUT`]); `Err` carries the
    /// reason and the tail of its stderr, in this plugin's words.
    fn run_generator(&self) -> Result<(), String> {
        run_generator(&self.program, &self.args, GENERATE_TIMEOUT).map_err(|e| match e {
            GeneratorError::Start { source, .. } => format!("cannot start it: {source}"),
            GeneratorError::Wait { source, .. } => format!("cannot wait for it: {source}"),
            GeneratorError::TimedOut { after, .. } => format!("timed out after {} s", after.as_secs()),
            GeneratorError::Failed { status, stderr, .. } => format!("{status}: {}", stderr.0),
        })
    }

    /// Checks every `interval` until `stop` is set (the driver-version watch between Allocates).
    pub fn watch(&self, interval: Duration, stop: &std::sync::atomic::AtomicBool) {
        use std::sync::atomic::Ordering;
        while !stop.load(Ordering::Relaxed) {
            if let Err(e) = self.ensure_fresh() {
                tracing::error!(error = %e, "CDI spec watch");
            }
            let until = Instant::now() + interval;
            while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100).min(interval));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A node with a driver version file, a spec recording `spec_driver`, and a fake generator
    /// that writes a spec for the version in the module file and counts its runs.
    struct Fixture {
        dir: tempfile::TempDir,
        freshness: SpecFreshness,
    }

    fn spec_text(version: &str) -> String {
        serde_json::json!({
            "cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
            "annotations": {ANNOTATION_DRIVER_VERSION: version},
            "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}]
        })
        .to_string()
    }

    fn fixture(loaded: &str, spec_driver: Option<&str>, script: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("sys/module/nvidia")).unwrap();
        fs::write(root.join("sys/module/nvidia/version"), format!("{loaded}\n")).unwrap();
        fs::create_dir_all(root.join("cdi")).unwrap();
        if let Some(v) = spec_driver {
            fs::write(root.join("cdi/nvidia.com-gpu.json"), spec_text(v)).unwrap();
        }
        let gen_path = root.join("gen.sh");
        fs::write(&gen_path, format!("#!/bin/sh\necho run >> {}/runs\n{script}\n", root.display())).unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&gen_path, fs::Permissions::from_mode(0o755)).unwrap();
        let freshness = SpecFreshness::new(
            root.join("cdi/nvidia.com-gpu.json"),
            root.join("sys"),
            root.join("proc"),
            gen_path,
            vec![root.join("sys/module/nvidia/version").into(), root.join("cdi/nvidia.com-gpu.json").into()],
        );
        Fixture { dir, freshness }
    }

    /// A generator writing a spec for the loaded version ($1: version file, $2: spec), atomically.
    const GOOD: &str = r#"v=$(cat "$1"); printf '{"cdiVersion":"0.6.0","kind":"nvidia.com/gpu","annotations":{"nvinject.io/driver-version":"%s"},"devices":[{"name":"0","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia0"}]}}]}' "$v" > "$2.tmp" && mv "$2.tmp" "$2""#;

    fn runs(f: &Fixture) -> usize {
        fs::read_to_string(f.dir.path().join("runs")).map(|t| t.lines().count()).unwrap_or(0)
    }

    fn recorded(f: &Fixture) -> String {
        let spec = nvinject_cdi::load_file(f.freshness.spec()).unwrap();
        spec.annotations[ANNOTATION_DRIVER_VERSION].clone()
    }

    #[test]
    fn a_fresh_spec_is_left_alone_and_not_reread() {
        let f = fixture("550.54.15", Some("550.54.15"), GOOD);
        assert_eq!(f.freshness.ensure_fresh().unwrap(), Outcome::Fresh);
        assert_eq!(f.freshness.ensure_fresh().unwrap(), Outcome::Fresh);
        assert_eq!(runs(&f), 0);
    }

    #[test]
    fn a_driver_upgrade_regenerates_once_then_the_spec_is_fresh() {
        let f = fixture("550.54.15", Some("550.54.15"), GOOD);
        assert_eq!(f.freshness.ensure_fresh().unwrap(), Outcome::Fresh);
        fs::write(f.dir.path().join("sys/module/nvidia/version"), "555.42.02\n").unwrap();
        assert_eq!(
            f.freshness.ensure_fresh().unwrap(),
            Outcome::Regenerated { from: "550.54.15".into(), to: "555.42.02".into() }
        );
        assert_eq!(recorded(&f), "555.42.02");
        assert_eq!(f.freshness.ensure_fresh().unwrap(), Outcome::Fresh);
        assert_eq!(runs(&f), 1);
    }

    #[test]
    fn a_missing_spec_is_generated() {
        let f = fixture("550.54.15", None, GOOD);
        assert_eq!(
            f.freshness.ensure_fresh().unwrap(),
            Outcome::Regenerated { from: String::new(), to: "550.54.15".into() }
        );
        assert_eq!(recorded(&f), "550.54.15");
    }

    #[test]
    fn an_untrusted_spec_is_never_read_back_as_fresh() {
        use std::os::unix::fs::PermissionsExt;
        let f = fixture("550.54.15", Some("550.54.15"), GOOD);
        assert_eq!(f.freshness.ensure_fresh().unwrap(), Outcome::Fresh);
        // Made writable by others (a chmod keeps inode and mtime): regenerated, which renames a
        // file of ours over it.
        let spec = f.freshness.spec().to_owned();
        fs::set_permissions(&spec, fs::Permissions::from_mode(0o666)).unwrap();
        assert!(matches!(f.freshness.ensure_fresh().unwrap(), Outcome::Regenerated { .. }));
        assert_eq!(fs::metadata(&spec).unwrap().permissions().mode() & 0o002, 0);
        assert_eq!(runs(&f), 1);
        // A folder others may write: refused naming it and the fix, without running the generator.
        let dir = spec.parent().unwrap();
        fs::set_permissions(dir, fs::Permissions::from_mode(0o777)).unwrap();
        let e = f.freshness.ensure_fresh().unwrap_err();
        assert!(matches!(e, FreshnessError::Untrusted { .. }), "{e}");
        let text = e.to_string();
        assert!(text.contains(&format!("its folder {}", dir.display())) && text.contains("0777"), "{text}");
        assert!(text.contains(&format!("chmod go-w {}", dir.display())), "{text}");
        assert_eq!(runs(&f), 1);
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(f.freshness.ensure_fresh().unwrap(), Outcome::Fresh);
    }

    #[test]
    fn a_spec_replaced_behind_our_back_is_checked_again() {
        let f = fixture("550.54.15", Some("550.54.15"), GOOD);
        assert_eq!(f.freshness.ensure_fresh().unwrap(), Outcome::Fresh);
        // Someone restores an old spec (a backup, config management): a new inode, rechecked.
        let spec = f.freshness.spec().to_owned();
        fs::write(spec.with_extension("old"), spec_text("535.1.1")).unwrap();
        fs::rename(spec.with_extension("old"), &spec).unwrap();
        assert!(matches!(f.freshness.ensure_fresh().unwrap(), Outcome::Regenerated { .. }));
        assert_eq!(recorded(&f), "550.54.15");
    }

    #[test]
    fn a_failing_generator_is_an_error_naming_the_spec_versions_and_its_output() {
        let f = fixture("555.42.02", Some("550.54.15"), "echo 'no NVML here' >&2; exit 3");
        let e = f.freshness.ensure_fresh().unwrap_err().to_string();
        assert!(
            e.contains("nvidia.com-gpu.json") && e.contains("550.54.15") && e.contains("555.42.02"),
            "{e}"
        );
        assert!(e.contains("no NVML here"), "{e}");
        // The old spec is still there, untouched, and the next check tries again.
        assert_eq!(recorded(&f), "550.54.15");
        assert!(f.freshness.ensure_fresh().is_err());
        assert_eq!(runs(&f), 2);
    }

    #[test]
    fn a_generator_that_writes_nothing_new_is_caught() {
        let f = fixture("555.42.02", Some("550.54.15"), "exit 0");
        let e = f.freshness.ensure_fresh().unwrap_err();
        assert!(matches!(e, FreshnessError::StillStale { .. }), "{e}");
    }

    #[test]
    fn no_driver_loaded_means_nothing_to_compare() {
        let f = fixture("550.54.15", Some("550.54.15"), GOOD);
        fs::remove_file(f.dir.path().join("sys/module/nvidia/version")).unwrap();
        assert_eq!(f.freshness.ensure_fresh().unwrap(), Outcome::NoDriver);
        assert_eq!(runs(&f), 0);
    }

    fn roots(container_driver_root: Option<&Path>) -> String {
        let a = generate_args(&GenerateRoots {
            spec: Path::new("/var/run/cdi/nvidia.com-gpu.json"),
            driver_root: Path::new("/run/nvidia/driver"),
            container_driver_root,
            dev_root: Path::new("/"),
            proc_root: Path::new("/proc"),
            sys_root: Path::new("/sys"),
            hook: Path::new("/usr/local/nvinject/bin/nvinject-hook"),
            mps_pipe_dir: None,
            hook_timeout_secs: 30,
        });
        let text: Vec<String> = a.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        text.join(" ")
    }

    #[test]
    fn the_mps_pipe_dir_is_passed_on_so_the_mps_device_survives_regeneration() {
        let a = generate_args(&GenerateRoots {
            spec: Path::new("/var/run/cdi/nvidia.com-gpu.json"),
            driver_root: Path::new("/"),
            container_driver_root: None,
            dev_root: Path::new("/"),
            proc_root: Path::new("/proc"),
            sys_root: Path::new("/sys"),
            hook: Path::new("/usr/local/nvinject/bin/nvinject-hook"),
            mps_pipe_dir: Some(Path::new("/run/nvidia/mps")),
            hook_timeout_secs: 30,
        });
        let text: Vec<String> = a.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        assert!(text.join(" ").contains("--mps-pipe-dir /run/nvidia/mps"), "{text:?}");
        assert!(!roots(None).contains("--mps-pipe-dir"), "none unless MPS is configured");
    }

    #[test]
    fn generate_args_name_every_root_and_the_spec() {
        let joined = roots(None);
        assert!(
            joined.starts_with("generate --driver-root /run/nvidia/driver --dev-root / --proc-root /proc"),
            "{joined}"
        );
        assert!(!joined.contains("--driver-root-ctr-path"), "{joined}");
        assert!(joined.contains("--hook-timeout-secs 30"), "{joined}");
        assert!(
            joined.contains("--output /var/run/cdi/nvidia.com-gpu.json") && joined.ends_with("--format json")
        );
    }

    #[test]
    fn in_a_container_the_generator_reads_the_mount_and_writes_host_paths() {
        let joined = roots(Some(Path::new("/driver-root")));
        assert!(
            joined.contains("--driver-root /run/nvidia/driver")
                && joined.contains("--driver-root-ctr-path /driver-root"),
            "{joined}"
        );
    }

    #[test]
    fn until_the_installer_is_ready_a_missing_or_stale_spec_is_reported_not_written() {
        let f = fixture("550.54.15", None, GOOD);
        let ready = f.dir.path().join("ready");
        let freshness = SpecFreshness::new(
            f.freshness.spec.clone(),
            f.freshness.sys_root.clone(),
            f.freshness.proc_root.clone(),
            f.freshness.program.clone(),
            f.freshness.args.clone(),
        )
        .written_only_while(Some(ready.clone()));
        let e = freshness.ensure_fresh().unwrap_err();
        assert!(matches!(e, FreshnessError::InstallerNotReady { .. }), "{e}");
        let message = e.to_string();
        assert!(
            message.contains("ready") && message.contains("missing") && message.contains("550.54.15"),
            "{message}"
        );
        assert!(!freshness.spec().exists(), "nothing written before the installer's first run");
        assert_eq!(runs(&f), 0);

        fs::write(&ready, "ready\n").unwrap();
        assert_eq!(
            freshness.ensure_fresh().unwrap(),
            Outcome::Regenerated { from: String::new(), to: "550.54.15".into() }
        );
        // The installer stopped (its ready file gone): a fresh spec still serves, a stale one is
        // reported and left alone.
        fs::remove_file(&ready).unwrap();
        assert_eq!(freshness.ensure_fresh().unwrap(), Outcome::Fresh);
        fs::write(f.dir.path().join("sys/module/nvidia/version"), "555.42.02\n").unwrap();
        assert!(matches!(freshness.ensure_fresh().unwrap_err(), FreshnessError::InstallerNotReady { .. }));
        assert_eq!(recorded(&f), "550.54.15");
    }
}
