//! Keeping nvinject's CDI specs fresh for a Create: which spec files are stale, the spec lock that
//! lets one process per node regenerate each, and the request handed to the regenerator.
//!
//! A spec is stale when `nvinject-cdi` wrote it for another driver than the loaded one
//! (`nvinject.io/driver-version` against the kernel module's version, read as every other reader
//! reads it: [`nvinject_cdi::nvinject::read_driver_version`]). Specs without the annotation
//! (hand-written, other vendors) are never stale. The loaded version, the lock and the regenerator
//! are narrow traits ([`LoadedDriver`], [`SpecLocks`], [`Regenerate`]) so the policy is tested with
//! fakes; the real regenerator runs the `nvinject-cdi` binary (`crate::regenerate`), so the proxy
//! never loads NVML itself.
//!
//! The Create pipeline (`crate::inject`) uses this module; this module knows nothing of it.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nvinject_cdi::nvinject::{
    ANNOTATION_DEV_ROOT, ANNOTATION_DRIVER_ROOT, ANNOTATION_DRIVER_VERSION, DEFAULT_HOOK_PATH,
};
use nvinject_cdi::{Kind, QualifiedName, Registry, ResolveError, Spec};

/// The regenerator's error and its stderr tail, owned by the generator's contract in `nvinject_cdi`.
pub use nvinject_cdi::nvinject::{GeneratorError, StderrTail};

use crate::config::RegenerateConfig;

/// The loaded driver's version, the edge the staleness rule reads.
pub trait LoadedDriver: Send + Sync {
    /// The loaded kernel module's version; `None` when no module information is there (nothing to
    /// compare a spec with).
    fn version(&self) -> Option<String>;
}

/// The real [`LoadedDriver`]: `<sys-root>/module/nvidia/version`, else the NVRM line under the proc
/// root, the files cdi-gen and the device plugin read too, so all agree on what is stale.
#[derive(Debug, Clone)]
pub struct ModuleVersion {
    /// `[regenerate] sys-root`.
    pub sys_root: PathBuf,
    /// `[regenerate] proc-root`.
    pub proc_root: PathBuf,
}

impl LoadedDriver for ModuleVersion {
    fn version(&self) -> Option<String> {
        nvinject_cdi::nvinject::read_driver_version(&self.sys_root, &self.proc_root)
            .ok()
            .map(|(version, _)| version)
    }
}

/// A held spec lock; dropping it releases the lock.
pub type LockGuard = Box<dyn Send>;

/// The node-wide lock around one spec's regeneration: every proxy on the node may find the same
/// stale spec at once, and only one must regenerate it.
pub trait SpecLocks: Send + Sync {
    /// Takes the lock for `spec`, waiting a bounded time.
    fn lock(&self, spec: &Path) -> Result<LockGuard, LockError>;
}

/// Everything needed to regenerate one spec file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegenerateRequest {
    /// The spec file to replace (atomically); its extension picks the format.
    pub spec_path: PathBuf,
    /// The spec's kind.
    pub kind: Kind,
    /// Driver root: the spec's own record, else `[regenerate] driver-root`, else `/`.
    pub driver_root: PathBuf,
    /// Dev root: the spec's own record, else `[regenerate] dev-root`, else `/`.
    pub dev_root: PathBuf,
    /// `[regenerate] nvml-lib`, when configured.
    pub nvml_lib: Option<PathBuf>,
    /// Hook path written into the spec: `[regenerate] hook-path`, else the spec's own, else the
    /// installer's.
    pub hook_path: PathBuf,
    /// The driver version the spec was made for (empty: there was no spec).
    pub stale_version: String,
    /// The driver version now loaded.
    pub loaded_version: String,
}

/// Writes a fresh spec. The real one runs `nvinject-cdi generate`; tests use their own.
pub trait Regenerate: Send + Sync {
    /// Writes a fresh spec at `request.spec_path`, atomically.
    fn regenerate(&self, request: &RegenerateRequest) -> Result<(), GeneratorError>;
}

/// Why a stale or missing spec was not regenerated.
#[derive(Debug, thiserror::Error)]
pub enum RegenerateError {
    /// The spec lock could not be taken.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The generator failed; a generator that could not be started gets the shim's fix.
    #[error("{0}{fix}", fix = start_fix(.0))]
    Generator(#[from] GeneratorError),
}

/// What to do when the shim cannot start the generator (the shared error names only the program).
fn start_fix(error: &GeneratorError) -> &'static str {
    match error {
        GeneratorError::Start { .. } => {
            "; install nvinject-cdi beside the shim or name it in [regenerate] generator"
        }
        _ => "",
    }
}

/// A spec the Create needs could not be made fresh; the Create fails with this.
#[derive(Debug, thiserror::Error)]
#[error(
    "CDI spec {} was generated for driver {stale} but driver {loaded} is loaded, and regenerating it failed: {error}",
    path.display()
)]
pub struct FreshnessError {
    /// The stale (or missing) spec.
    pub path: PathBuf,
    /// Its recorded driver version (`(missing)` when there was no file).
    pub stale: String,
    /// The loaded driver's version.
    pub loaded: String,
    /// What went wrong (boxed: it is the rare path, and a `Result` carrying it stays small).
    pub error: Box<RegenerateError>,
}

/// The edges [`Freshness`] works through.
pub struct Edges {
    /// Reads the loaded driver's version.
    pub driver: Box<dyn LoadedDriver>,
    /// The node-wide spec locks.
    pub locks: Box<dyn SpecLocks>,
    /// Writes fresh specs; used only when `[regenerate] enabled`.
    pub regenerator: Box<dyn Regenerate>,
}

/// A spec found stale by [`Freshness::to_regenerate`], to hand to [`Freshness::regenerate`].
#[derive(Debug, Clone)]
pub struct StaleSpec {
    path: PathBuf,
    spec: Spec,
}

/// The staleness policy and regeneration for one proxy.
pub struct Freshness {
    config: RegenerateConfig,
    default_kind: Kind,
    driver: Box<dyn LoadedDriver>,
    locks: Box<dyn SpecLocks>,
    regenerator: Option<Box<dyn Regenerate>>,
}

impl Freshness {
    /// The policy of `config`; `default_kind` is the kind a missing `spec-path` is generated with.
    pub fn new(config: &RegenerateConfig, default_kind: Kind, edges: Edges) -> Freshness {
        Freshness {
            config: config.clone(),
            default_kind,
            driver: edges.driver,
            locks: edges.locks,
            regenerator: config.enabled.then_some(edges.regenerator),
        }
    }

    /// The loaded driver's version, read once per Create.
    pub fn loaded_version(&self) -> Option<String> {
        self.driver.version()
    }

    /// Generates `[regenerate] spec-path` when it is configured and missing (a node whose
    /// `/var/run/cdi` was emptied by a reboot). Returns it when generated.
    pub fn create_missing(&self, loaded: Option<&str>) -> Result<Option<PathBuf>, FreshnessError> {
        let (Some(regenerator), Some(path)) = (&self.regenerator, &self.config.spec_path) else {
            return Ok(None);
        };
        if path.exists() {
            return Ok(None);
        }
        let loaded = loaded.unwrap_or_default();
        let fail = |error: RegenerateError| FreshnessError {
            path: path.clone(),
            stale: "(missing)".into(),
            loaded: loaded.to_owned(),
            error: Box::new(error),
        };
        let _lock = self.locks.lock(path).map_err(|e| fail(e.into()))?;
        if path.exists() {
            return Ok(None);
        }
        let request = RegenerateRequest {
            spec_path: path.clone(),
            kind: self.default_kind.clone(),
            driver_root: root_or_slash(None, self.config.driver_root.as_ref()),
            dev_root: root_or_slash(None, self.config.dev_root.as_ref()),
            nvml_lib: self.config.nvml_lib.clone(),
            hook_path: self.config.hook_path.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_HOOK_PATH)),
            stale_version: String::new(),
            loaded_version: loaded.to_owned(),
        };
        regenerator.regenerate(&request).map_err(|e| fail(e.into()))?;
        tracing::info!(spec = %path.display(), "generated missing CDI spec");
        Ok(Some(path.clone()))
    }

    /// The nvinject specs that a requested device lives in and whose recorded driver version is
    /// not `loaded`. With `[regenerate]` off they are used as they are, with a warning, and none
    /// is returned. Cheap (the registry's parsed specs, plus a parse of the specs of a kind that
    /// lack a requested device), so it runs under the caller's registry lock.
    pub fn to_regenerate(
        &self,
        registry: &Registry,
        names: &[QualifiedName],
        loaded: &str,
    ) -> Vec<StaleSpec> {
        // The specs the requested devices come from; for a device no spec has (yet), every spec
        // of its kind: a regenerated spec may have it (a GPU added with the new driver).
        let mut candidates: BTreeSet<PathBuf> = BTreeSet::new();
        let mut stale: Vec<StaleSpec> = Vec::new();
        for name in names {
            match registry.resolve(name) {
                Ok(r) => {
                    if candidates.insert(r.path.to_owned()) && spec_is_stale(r.spec, loaded) {
                        stale.push(StaleSpec { path: r.path.to_owned(), spec: r.spec.clone() });
                    }
                }
                Err(ResolveError::UnknownDevice { files, .. }) => {
                    for file in files {
                        if candidates.insert(file.clone())
                            && let Ok(spec) = nvinject_cdi::load_file(&file)
                            && spec_is_stale(&spec, loaded)
                        {
                            stale.push(StaleSpec { path: file, spec });
                        }
                    }
                }
                Err(_) => {}
            }
        }
        if self.regenerator.is_none() {
            for StaleSpec { path, spec } in &stale {
                tracing::warn!(spec = %path.display(), recorded = spec.annotations.get(ANNOTATION_DRIVER_VERSION).map(String::as_str),
                    loaded = %loaded, "CDI spec is stale and [regenerate] is disabled; using it as it is");
            }
            return Vec::new();
        }
        stale
    }

    /// Regenerates each spec of `stale`, under its spec lock, unless another process did while
    /// this one waited for the lock. Returns the files regenerated. Runs the generator: call it
    /// holding no lock that other Creates wait for.
    pub fn regenerate(&self, stale: Vec<StaleSpec>, loaded: &str) -> Result<Vec<PathBuf>, FreshnessError> {
        let Some(regenerator) = &self.regenerator else {
            return Ok(Vec::new());
        };
        let mut done = Vec::new();
        for StaleSpec { path, spec } in stale {
            let recorded = spec.annotations.get(ANNOTATION_DRIVER_VERSION).cloned().unwrap_or_default();
            let fail = |error: RegenerateError| FreshnessError {
                path: path.clone(),
                stale: recorded.clone(),
                loaded: loaded.to_owned(),
                error: Box::new(error),
            };
            let request = RegenerateRequest {
                spec_path: path.clone(),
                kind: spec.kind.clone(),
                driver_root: root_or_slash(
                    spec.annotations.get(ANNOTATION_DRIVER_ROOT),
                    self.config.driver_root.as_ref(),
                ),
                dev_root: root_or_slash(
                    spec.annotations.get(ANNOTATION_DEV_ROOT),
                    self.config.dev_root.as_ref(),
                ),
                nvml_lib: self.config.nvml_lib.clone(),
                hook_path: self
                    .config
                    .hook_path
                    .clone()
                    .or_else(|| hook_path_of(&spec))
                    .unwrap_or_else(|| PathBuf::from(DEFAULT_HOOK_PATH)),
                stale_version: recorded.clone(),
                loaded_version: loaded.to_owned(),
            };
            // Whoever gets the lock second re-reads the file and finds it fresh.
            let _lock = self.locks.lock(&path).map_err(|e| fail(e.into()))?;
            let still_stale =
                nvinject_cdi::load_file(&path).map(|s| spec_is_stale(&s, loaded)).unwrap_or(true);
            if still_stale {
                regenerator.regenerate(&request).map_err(|e| fail(e.into()))?;
                tracing::info!(spec = %path.display(), from = %recorded, to = %loaded, "regenerated stale CDI spec");
                if nvinject_cdi::load_file(&path).is_ok_and(|s| spec_is_stale(&s, loaded)) {
                    // NVML and the kernel module disagree about the version (a half-finished
                    // driver upgrade): the fresh spec is the best there is; say so.
                    tracing::warn!(spec = %path.display(), loaded = %loaded,
                        "the regenerated spec still records another driver version than the loaded module's");
                }
                done.push(path);
            }
        }
        Ok(done)
    }
}

/// A spec is stale when nvinject wrote it for another driver version. Specs without the
/// annotation (hand-written, other vendors) are never stale.
pub fn spec_is_stale(spec: &Spec, loaded: &str) -> bool {
    spec.annotations.get(ANNOTATION_DRIVER_VERSION).is_some_and(|v| v != loaded)
}

/// The hook path a spec's hooks use (the first one), to keep it when regenerating.
pub fn hook_path_of(spec: &Spec) -> Option<PathBuf> {
    spec.container_edits
        .hooks
        .iter()
        .chain(spec.devices.iter().flat_map(|d| d.container_edits.hooks.iter()))
        .map(|h| Path::new(&h.path).to_owned())
        .next()
}

/// The spec's recorded root, else the configured one, else `/`.
fn root_or_slash(recorded: Option<&String>, configured: Option<&PathBuf>) -> PathBuf {
    recorded.map(PathBuf::from).or_else(|| configured.cloned()).unwrap_or_else(|| PathBuf::from("/"))
}

/// The real [`SpecLocks`]: an exclusive `flock` on `<lock-dir>/<spec path, `/` as `_`>.lock`.
///
/// The file is 0600 in a 0700 directory owned by us (modes set with fchmod, so the umask does not
/// matter) so no other user can open it, let alone hold it; a symlink or non-regular file at its
/// path is refused; and the wait is bounded so a held lock fails the Create instead of hanging it.
#[derive(Debug, Clone)]
pub struct LockDir {
    /// `[regenerate] lock-dir`.
    pub dir: PathBuf,
    /// `[regenerate] lock-timeout-secs`.
    pub timeout_secs: u64,
}

/// The spec lock could not be taken.
#[derive(Debug, thiserror::Error)]
#[error("spec lock {}: {message}", path.display())]
pub struct LockError {
    /// The lock file or directory.
    pub path: PathBuf,
    /// What is wrong and what to do.
    pub message: String,
}

impl LockDir {
    /// `[regenerate] lock-dir` and `lock-timeout-secs` of `config`.
    pub fn new(config: &RegenerateConfig) -> LockDir {
        LockDir { dir: config.lock_dir.clone(), timeout_secs: config.lock_timeout_secs }
    }
}

impl SpecLocks for LockDir {
    fn lock(&self, spec: &Path) -> Result<LockGuard, LockError> {
        use nvinject_fsio::lock::LockError as Refused;
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        let dir = &self.dir;
        let name = format!("{}.lock", spec.to_string_lossy().trim_start_matches('/').replace('/', "_"));
        let path = dir.join(name);
        let err = |p: &Path, message: String| LockError { path: p.to_path_buf(), message };
        if let Err(e) = fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
            return Err(err(dir, format!("cannot create the lock directory: {e}")));
        }
        let meta = fs::symlink_metadata(dir).map_err(|e| err(dir, e.to_string()))?;
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if !meta.is_dir() || meta.uid() != euid {
            return Err(err(
                dir,
                format!(
                    "the lock directory must be a real directory owned by uid {euid}; remove it or set [regenerate] lock-dir"
                ),
            ));
        }
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(|e| err(dir, e.to_string()))?;
        let dir_file = fs::File::open(dir).map_err(|e| err(dir, e.to_string()))?;
        let name = path.file_name().unwrap_or_default();
        let timeout = Duration::from_secs(self.timeout_secs);
        let poll = Duration::from_millis(20);
        match nvinject_fsio::lock::acquire(&dir_file, name, timeout, poll, &mut |_| {}) {
            Ok(lock) => Ok(Box::new(lock)),
            Err(Refused::Symlink) => Err(err(
                &path,
                format!(
                    "cannot open (a symlink is refused): {}; remove it",
                    std::io::Error::from_raw_os_error(libc::ELOOP)
                ),
            )),
            Err(Refused::Io { step: "open", source }) => {
                Err(err(&path, format!("cannot open (a symlink is refused): {source}; remove it")))
            }
            Err(Refused::NotRegular | Refused::NotOwned { .. }) => {
                Err(err(&path, "not a regular file owned by us; remove it".into()))
            }
            Err(e @ Refused::HardLinked { .. }) => Err(err(&path, format!("{e}; remove it"))),
            Err(Refused::Io { step: "flock", source }) => Err(err(&path, format!("flock: {source}"))),
            Err(Refused::Io { source, .. }) => Err(err(&path, source.to_string())),
            Err(Refused::Held { .. }) => Err(err(
                &path,
                format!(
                    "still held by another process after {} s ([regenerate] lock-timeout-secs); \
                     find it with `fuser {}` and stop it, then retry",
                    self.timeout_secs,
                    path.display()
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;
    use std::sync::{Arc, Mutex};

    fn lock_dir(dir: &Path, secs: u64) -> LockDir {
        LockDir { dir: dir.join("locks"), timeout_secs: secs }
    }

    #[test]
    fn the_spec_lock_is_root_only_whatever_the_umask() {
        let tmp = tempfile::tempdir().unwrap();
        // SAFETY: umask only changes this process's creation mask; restored below.
        let old = unsafe { libc::umask(0) };
        let lock = lock_dir(tmp.path(), 1).lock(Path::new("/var/run/cdi/x.json"));
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        drop(lock.unwrap());
        let dir = tmp.path().join("locks");
        assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o7777, 0o700);
        let file = dir.join("var_run_cdi_x.json.lock");
        assert_eq!(fs::metadata(&file).unwrap().permissions().mode() & 0o7777, 0o600);
    }

    #[test]
    fn a_symlinked_lock_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let locks = lock_dir(tmp.path(), 1);
        fs::create_dir_all(&locks.dir).unwrap();
        let target = tmp.path().join("elsewhere");
        fs::write(&target, "").unwrap();
        std::os::unix::fs::symlink(&target, locks.dir.join("s.json.lock")).unwrap();
        let err = locks.lock(Path::new("/s.json")).err().unwrap();
        assert!(err.to_string().contains("s.json.lock"), "{err}");
    }

    #[test]
    fn a_held_lock_fails_after_the_timeout_naming_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let locks = lock_dir(tmp.path(), 0);
        let held = locks.lock(Path::new("/h.json")).unwrap();
        let err = locks.lock(Path::new("/h.json")).err().unwrap();
        assert!(
            err.to_string().contains("h.json.lock") && err.to_string().contains("lock-timeout-secs"),
            "{err}"
        );
        drop(held);
        locks.lock(Path::new("/h.json")).unwrap();
    }

    #[test]
    fn the_module_version_is_read_under_the_configured_roots() {
        let tmp = tempfile::tempdir().unwrap();
        let driver = ModuleVersion { sys_root: tmp.path().join("sys"), proc_root: tmp.path().join("proc") };
        assert_eq!(driver.version(), None, "no module: nothing to compare with");
        fs::create_dir_all(tmp.path().join("sys/module/nvidia")).unwrap();
        fs::write(tmp.path().join("sys/module/nvidia/version"), "550.54.15\n").unwrap();
        assert_eq!(driver.version().as_deref(), Some("550.54.15"));
    }

    /// A loaded driver of a fixed version.
    struct Loaded(Option<&'static str>);

    impl LoadedDriver for Loaded {
        fn version(&self) -> Option<String> {
            self.0.map(str::to_owned)
        }
    }

    /// Records which specs were locked; refuses when told to.
    #[derive(Clone, Default)]
    struct FakeLocks {
        taken: Arc<Mutex<Vec<PathBuf>>>,
        refuse: bool,
    }

    impl SpecLocks for FakeLocks {
        fn lock(&self, spec: &Path) -> Result<LockGuard, LockError> {
            if self.refuse {
                return Err(LockError { path: "/locks/x.lock".into(), message: "held".into() });
            }
            self.taken.lock().unwrap().push(spec.to_owned());
            Ok(Box::new(()))
        }
    }

    /// Records requests and writes a spec for the loaded version, or fails.
    #[derive(Clone, Default)]
    struct FakeRegen {
        requests: Arc<Mutex<Vec<RegenerateRequest>>>,
        fail: bool,
    }

    impl Regenerate for FakeRegen {
        fn regenerate(&self, request: &RegenerateRequest) -> Result<(), GeneratorError> {
            self.requests.lock().unwrap().push(request.clone());
            if self.fail {
                return Err(GeneratorError::Failed {
                    program: "/opt/nvinject-cdi".into(),
                    status: ExitStatus::from_raw(256),
                    stderr: StderrTail("nvinject-cdi: error: NVML not loadable".into()),
                });
            }
            fs::write(&request.spec_path, spec_text(&request.loaded_version, &json!({}))).unwrap();
            Ok(())
        }
    }

    fn spec_text(version: &str, extra_annotations: &serde_json::Value) -> String {
        let mut annotations = json!({"nvinject.io/driver-version": version});
        annotations.as_object_mut().unwrap().extend(extra_annotations.as_object().unwrap().clone());
        json!({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "annotations": annotations,
            "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]}}],
            "containerEdits": {"hooks": [{"hookName": "createContainer", "path": "/opt/own-hook", "args": ["nvinject-hook", "update-ldcache"]}]}})
        .to_string()
    }

    struct Setup {
        dir: tempfile::TempDir,
        config: RegenerateConfig,
        locks: FakeLocks,
        regen: FakeRegen,
    }

    impl Setup {
        fn new() -> Setup {
            let dir = tempfile::tempdir().unwrap();
            fs::create_dir_all(dir.path().join("cdi")).unwrap();
            Setup {
                dir,
                config: RegenerateConfig::default(),
                locks: FakeLocks::default(),
                regen: FakeRegen::default(),
            }
        }
        fn spec(&self) -> PathBuf {
            self.dir.path().join("cdi/nvidia.com-gpu.json")
        }
        fn freshness(&self) -> Freshness {
            Freshness::new(
                &self.config,
                "nvidia.com/gpu".parse().unwrap(),
                Edges {
                    driver: Box::new(Loaded(Some("555.42.02"))),
                    locks: Box::new(self.locks.clone()),
                    regenerator: Box::new(self.regen.clone()),
                },
            )
        }
        fn registry(&self) -> Registry {
            Registry::scan(&[self.dir.path().join("cdi")])
        }
        fn requests(&self) -> Vec<RegenerateRequest> {
            self.regen.requests.lock().unwrap().clone()
        }
    }

    fn gpu(name: &str) -> Vec<QualifiedName> {
        vec![format!("nvidia.com/gpu={name}").parse().unwrap()]
    }

    #[test]
    fn a_stale_spec_is_regenerated_with_its_recorded_roots_and_hook_under_its_lock() {
        let s = Setup::new();
        fs::write(
            s.spec(),
            spec_text(
                "550.54.15",
                &json!({"nvinject.io/driver-root": "/run/nvidia/driver", "nvinject.io/dev-root": "/host"}),
            ),
        )
        .unwrap();
        let f = s.freshness();
        let loaded = f.loaded_version().unwrap();
        let stale = f.to_regenerate(&s.registry(), &gpu("0"), &loaded);
        assert_eq!(f.regenerate(stale, &loaded).unwrap(), [s.spec()]);
        assert_eq!(
            s.requests(),
            [RegenerateRequest {
                spec_path: s.spec(),
                kind: "nvidia.com/gpu".parse().unwrap(),
                driver_root: "/run/nvidia/driver".into(),
                dev_root: "/host".into(),
                nvml_lib: None,
                hook_path: "/opt/own-hook".into(),
                stale_version: "550.54.15".into(),
                loaded_version: "555.42.02".into(),
            }]
        );
        assert_eq!(*s.locks.taken.lock().unwrap(), [s.spec()]);
        // Fresh now: nothing to do.
        assert!(f.to_regenerate(&s.registry(), &gpu("0"), &loaded).is_empty());
    }

    #[test]
    fn the_config_fills_what_the_spec_does_not_record_and_its_hook_path_wins() {
        let mut s = Setup::new();
        fs::write(s.spec(), spec_text("550.54.15", &json!({}))).unwrap();
        s.config.driver_root = Some("/drv".into());
        s.config.hook_path = Some("/usr/bin/nvinject-hook".into());
        s.config.nvml_lib = Some("/drv/libnvidia-ml.so.1".into());
        let f = s.freshness();
        let stale = f.to_regenerate(&s.registry(), &gpu("0"), "555.42.02");
        f.regenerate(stale, "555.42.02").unwrap();
        let r = &s.requests()[0];
        assert_eq!(
            (r.driver_root.as_path(), r.dev_root.as_path(), r.hook_path.as_path(), r.nvml_lib.as_deref()),
            (
                Path::new("/drv"),
                Path::new("/"),
                Path::new("/usr/bin/nvinject-hook"),
                Some(Path::new("/drv/libnvidia-ml.so.1"))
            )
        );
    }

    #[test]
    fn a_spec_another_process_regenerated_while_this_one_waited_is_left_alone() {
        let s = Setup::new();
        fs::write(s.spec(), spec_text("550.54.15", &json!({}))).unwrap();
        let f = s.freshness();
        let stale = f.to_regenerate(&s.registry(), &gpu("0"), "555.42.02");
        assert_eq!(stale.len(), 1);
        fs::write(s.spec(), spec_text("555.42.02", &json!({}))).unwrap();
        assert!(f.regenerate(stale, "555.42.02").unwrap().is_empty());
        assert!(s.requests().is_empty());
    }

    #[test]
    fn a_device_no_spec_has_looks_at_every_spec_of_its_kind() {
        let s = Setup::new();
        fs::write(s.spec(), spec_text("550.54.15", &json!({}))).unwrap();
        let f = s.freshness();
        assert_eq!(f.to_regenerate(&s.registry(), &gpu("7"), "555.42.02").len(), 1);
    }

    #[test]
    fn unannotated_and_fresh_specs_are_never_stale_and_disabled_regeneration_uses_them() {
        let mut s = Setup::new();
        let unannotated = json!({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
            "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}]});
        fs::write(s.spec(), unannotated.to_string()).unwrap();
        assert!(s.freshness().to_regenerate(&s.registry(), &gpu("0"), "555.42.02").is_empty());
        fs::write(s.spec(), spec_text("550.54.15", &json!({}))).unwrap();
        s.config.enabled = false;
        let f = s.freshness();
        let stale = f.to_regenerate(&s.registry(), &gpu("0"), "555.42.02");
        assert!(stale.is_empty(), "[regenerate] enabled = false uses the stale spec");
        assert!(f.create_missing(Some("555.42.02")).unwrap().is_none());
        assert!(s.requests().is_empty());
    }

    #[test]
    fn failures_name_the_spec_both_versions_and_the_cause() {
        let mut s = Setup::new();
        fs::write(s.spec(), spec_text("550.54.15", &json!({}))).unwrap();
        s.regen.fail = true;
        let f = s.freshness();
        let stale = f.to_regenerate(&s.registry(), &gpu("0"), "555.42.02");
        let e = f.regenerate(stale.clone(), "555.42.02").unwrap_err();
        assert!(matches!(*e.error, RegenerateError::Generator(GeneratorError::Failed { .. })), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!(
                "CDI spec {} was generated for driver 550.54.15 but driver 555.42.02 is loaded, and regenerating \
                 it failed: /opt/nvinject-cdi generate failed (exit status: 1); stderr: nvinject-cdi: error: NVML not loadable",
                s.spec().display()
            )
        );
        assert_eq!(s.requests().len(), 1);
        s.regen.fail = false;
        s.locks.refuse = true;
        let e = s.freshness().regenerate(stale, "555.42.02").unwrap_err();
        assert!(matches!(*e.error, RegenerateError::Lock(_)), "{e:?}");
        assert!(e.to_string().ends_with("regenerating it failed: spec lock /locks/x.lock: held"), "{e}");
        assert_eq!(s.requests().len(), 1, "nothing runs without the lock");
    }

    #[test]
    fn a_missing_spec_path_is_generated_with_the_default_kind_once() {
        let mut s = Setup::new();
        s.config.spec_path = Some(s.spec());
        let f = s.freshness();
        assert_eq!(f.create_missing(Some("555.42.02")).unwrap(), Some(s.spec()));
        assert_eq!(f.create_missing(Some("555.42.02")).unwrap(), None, "present now");
        let r = s.requests();
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].kind.to_string(), r[0].hook_path.as_path(), r[0].stale_version.as_str()),
            ("nvidia.com/gpu".to_owned(), Path::new(DEFAULT_HOOK_PATH), "")
        );
        s.regen.fail = true;
        fs::remove_file(s.spec()).unwrap();
        let e = s.freshness().create_missing(None).unwrap_err();
        assert!(e.to_string().contains("was generated for driver (missing) but driver  is loaded"), "{e}");
    }
}
