//! What happens at a container's Create: read the bundle's `config.json`, work out the requested
//! devices, make the nvinject specs they come from fresh (`crate::freshness`), resolve them in the
//! CDI spec directories, apply their edits, and write `config.json` back atomically, all before the
//! runc shim sees the Create.
//!
//! Nothing is written unless every requested device resolved and every edit applied, so a refused
//! Create leaves the bundle exactly as containerd wrote it. Each container gets one log line:
//! its id, what it asked for and through which source, what was injected, every hook it got that
//! is not nvinject's own (`foreign_hooks`), and the time spent.
//!
//! Spec files go through the spec-trust check ([`nvinject_cdi::trust`]) in the registry: an
//! untrusted one is set aside (a Create that needs it is refused naming it and the fix), or with
//! `[cdi] accept-untrusted-specs` used and logged at warn at each use.

use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use containerd_shim_protos::api::CreateTaskRequest;
use nvinject_cdi::apply::{apply_edits, has_device_node};
use nvinject_cdi::nvinject::{ANNOTATION_DEV_ROOT, ANNOTATION_GENERATED_BY, DEFAULT_HOOK_PATH, HOOK_PROGRAM};
use nvinject_cdi::trust::{Owners, TrustPolicy};
use nvinject_cdi::{ContainerEdits, Hook, QualifiedName, Registry, ResolveError};
use nvinject_fsio::escape::escape_within;
use nvinject_fsio::{Durability, WriteOptions};
use serde_json::Value;
use ttrpc::proto::Code;

use crate::capabilities::{self, CapabilityError};
use crate::config::{Config, DriverCapabilities};
use crate::freshness::{Edges, Freshness, FreshnessError};
use crate::proxy::{CreateGate, Rejection};
use crate::request::{self, Policy, Resolution};

/// Why a Create is refused.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// The bundle's config.json cannot be read or parsed.
    #[error("cannot read the container's OCI spec {path}: {error}")]
    ReadSpec {
        /// The config.json.
        path: PathBuf,
        /// What went wrong.
        error: ReadSpecError,
    },
    /// A request names something that cannot be a CDI device.
    #[error(transparent)]
    Request(#[from] request::RequestError),
    /// `NVIDIA_DRIVER_CAPABILITIES` of a legacy (env or volume-mount) request names no capability.
    #[error(transparent)]
    Capabilities(#[from] CapabilityError),
    /// A requested device is not in any spec.
    #[error("{error} (requested by {requested_by}; CDI spec dirs searched: {dirs})")]
    Unresolvable {
        /// The registry's explanation (names the device, files and broken specs).
        error: Box<ResolveError>,
        /// The request source.
        requested_by: request::Source,
        /// The spec directories.
        dirs: DirList,
    },
    /// A stale (or missing) spec could not be regenerated; names the spec, both driver versions
    /// and the cause.
    #[error(transparent)]
    Regenerate(#[from] FreshnessError),
    /// A device node the spec leaves incomplete cannot be completed from the host device file.
    #[error("cannot complete the device nodes of {device} from the host: {error}")]
    HostDevice {
        /// The requested device.
        device: String,
        /// The spec file, node and fix.
        error: nvinject_cdi::fill::FillError,
    },
    /// The edits do not fit the container's spec.
    #[error("cannot apply the CDI edits of {devices} to {path}: {error}")]
    Apply {
        /// The config.json.
        path: PathBuf,
        /// The devices being applied.
        devices: String,
        /// What did not fit.
        error: nvinject_cdi::apply::ApplyError,
    },
    /// The updated config.json could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The config.json.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
}

impl InjectError {
    /// The ttrpc status containerd gets: the one place errors map to wire codes.
    pub fn code(&self) -> Code {
        match self {
            InjectError::Request(_) | InjectError::Capabilities(_) => Code::INVALID_ARGUMENT,
            InjectError::Unresolvable { .. }
            | InjectError::Regenerate(_)
            | InjectError::HostDevice { .. }
            | InjectError::Apply { .. } => Code::FAILED_PRECONDITION,
            InjectError::ReadSpec { .. } | InjectError::Write { .. } => Code::INTERNAL,
        }
    }
}

/// Why config.json could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadSpecError {
    /// Opening or reading it failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// It is not JSON.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// Spec directories in a message.
#[derive(Debug, Clone)]
pub struct DirList(pub Vec<PathBuf>);

impl fmt::Display for DirList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list: Vec<String> = self.0.iter().map(|d| d.display().to_string()).collect();
        f.write_str(&list.join(", "))
    }
}

/// What was done for one container (the log line's content).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outcome {
    /// The request source, empty when nothing was requested.
    pub source: String,
    /// Requested devices.
    pub requested: Vec<String>,
    /// Devices whose edits were applied.
    pub injected: Vec<String>,
    /// Devices skipped because their device nodes were already in the spec.
    pub already_present: Vec<String>,
    /// Requests present but not honoured, with reasons.
    pub ignored: Vec<String>,
    /// The driver capabilities applied (legacy requests only; empty: the spec as it is).
    pub capabilities: String,
    /// Mounts, links, ld-cache folders and hooks the capabilities left out.
    pub left_out: Vec<String>,
    /// Files and hooks kept because the capability table does not know them.
    pub unclassified: Vec<String>,
    /// Spec files regenerated on the way.
    pub regenerated: Vec<PathBuf>,
    /// Injected bind mounts handed to the one `nvinject-hook` run instead of runc.
    pub mounts_in_hook: usize,
    /// The spec's `nvinject-hook` runs merged into that one run.
    pub hooks_merged: usize,
    /// What was done with each hook run of NVIDIA's hook in the edits (`sub=translated|kept|dropped`).
    pub nvidia_hooks: Vec<String>,
    /// Hooks the container got that are not nvinject's own hook (`<spec file>: <path> <point>`,
    /// escaped): another tool's, or NVIDIA's kept, or ours named by an untrusted spec.
    pub foreign_hooks: Vec<String>,
    /// Untrusted spec files used (only with `[cdi] accept-untrusted-specs`), with why.
    pub untrusted_specs: Vec<String>,
    /// Whether config.json was rewritten.
    pub wrote: bool,
    /// Microseconds reading and parsing config.json.
    pub read_us: u64,
    /// Microseconds resolving and applying.
    pub inject_us: u64,
    /// Microseconds serializing and writing config.json.
    pub write_us: u64,
}

/// The [`CreateGate`] that injects CDI devices.
pub struct Injector {
    policy: Policy,
    spec_dirs: Vec<PathBuf>,
    freshness: Freshness,
    // `[regenerate] dev-root`: where incomplete device nodes are looked up when the spec records none.
    dev_root: Option<PathBuf>,
    // `[regenerate] hook-path`: the hook NVIDIA's hook runs are translated to.
    hook_path: Option<PathBuf>,
    one_hook_run: bool,
    // `[regenerate] hook-timeout-secs`: the OCI timeout of a hook run the shim writes itself.
    hook_timeout_secs: u32,
    honour_driver_capabilities: bool,
    // Kept between Creates: unchanged spec files are not parsed again.
    registry: Mutex<Registry>,
}

impl Injector {
    /// An injector for `config`; stale specs are made fresh through `edges` (its regenerator is
    /// used only when `[regenerate] enabled`).
    pub fn new(config: &Config, edges: Edges) -> Injector {
        let policy = Policy {
            default_kind: config.cdi.default_kind.clone(),
            annotation_prefixes: config.cdi.annotation_prefixes.clone(),
            accept_env_unprivileged: config.requests.accept_env_unprivileged,
            accept_volume_mounts: config.requests.accept_volume_mounts,
        };
        Injector {
            freshness: Freshness::new(&config.regenerate, policy.default_kind.clone(), edges),
            policy,
            spec_dirs: config.cdi.spec_dirs.clone(),
            dev_root: config.regenerate.dev_root.clone(),
            hook_path: config.regenerate.hook_path.clone(),
            one_hook_run: config.runtime.one_hook_run,
            hook_timeout_secs: config.regenerate.hook_timeout_secs,
            honour_driver_capabilities: config.requests.driver_capabilities == DriverCapabilities::Honour,
            registry: Mutex::new(Registry::scan_with(
                &config.cdi.spec_dirs,
                TrustPolicy {
                    owners: Owners::this_process(),
                    accept_untrusted: config.cdi.accept_untrusted_specs,
                },
            )),
        }
    }

    /// Prepares the bundle at `bundle`: injects what its `config.json` asks for, or leaves it as it is.
    pub fn inject(&self, bundle: &Path) -> Result<Outcome, InjectError> {
        let path = bundle.join("config.json");
        let t0 = Instant::now();
        let read_err = |error: ReadSpecError| InjectError::ReadSpec { path: path.clone(), error };
        let (bytes, mode) = read_with_mode(&path).map_err(|e| read_err(e.into()))?;
        let mut oci: Value = serde_json::from_slice(&bytes).map_err(|e| read_err(e.into()))?;
        let mut outcome = Outcome { read_us: micros(t0), ..Default::default() };

        let t1 = Instant::now();
        let resolution = request::resolve(&oci, &self.policy)?;
        // Read before anything is resolved: a bad value refuses the Create with nothing done.
        let requested_caps = if self.honour_driver_capabilities && resolution.honours_driver_capabilities() {
            let env = oci.pointer("/process/env").and_then(Value::as_array);
            Some(capabilities::from_env(env.into_iter().flatten().filter_map(Value::as_str))?)
        } else {
            None
        };
        let (source, names, ignored) = match resolution {
            Resolution::Sandbox => {
                outcome.source = "sandbox".into();
                return Ok(outcome);
            }
            Resolution::Nothing { ignored } => {
                outcome.ignored = describe_ignored(&ignored);
                return Ok(outcome);
            }
            Resolution::Devices { source, names, ignored, .. } => (source, names, ignored),
        };
        outcome.source = source.to_string();
        outcome.requested = names.iter().map(ToString::to_string).collect();
        outcome.ignored = describe_ignored(&ignored);

        let edits = {
            // Regeneration runs the generator for seconds: never under the registry lock, which
            // every Create of this pod takes. The spec lock orders regenerations instead.
            let loaded = self.freshness.loaded_version();
            outcome.regenerated.extend(self.freshness.create_missing(loaded.as_deref())?);
            let mut registry = self.registry();
            registry.refresh();
            if let Some(loaded) = &loaded {
                let stale = self.freshness.to_regenerate(&registry, &names, loaded);
                if !stale.is_empty() {
                    drop(registry);
                    outcome.regenerated.extend(self.freshness.regenerate(stale, loaded)?);
                    registry = self.registry();
                    // A regenerated spec that no longer has a requested device is reported by resolution.
                    registry.refresh();
                }
            }
            self.collect_edits(&registry, &names, &source, &oci, &mut outcome)?
        };
        let (mut edits, origins) = edits;
        if outcome.injected.is_empty() {
            outcome.inject_us = micros(t1);
            return Ok(outcome);
        }
        let hook_path = crate::nvidia_hooks::hook_path_for_nvidia(&edits.hooks, self.hook_path.as_deref());
        outcome.nvidia_hooks =
            crate::nvidia_hooks::translate_nvidia_hooks(&mut edits.hooks, &hook_path, &|p| {
                Path::new(p).exists()
            })
            .iter()
            .map(ToString::to_string)
            .collect();
        // After the translation, which may hand NVIDIA's runs to whichever nvinject-hook the
        // edits name, and before folding, which merges our runs.
        outcome.foreign_hooks = origins.foreign(&edits.hooks, self.hook_path.as_deref());
        if let Some(requested) = requested_caps {
            // Only removes: what stays is always the spec's own.
            let filtered = capabilities::filter_edits(&mut edits, requested.capabilities);
            outcome.capabilities = requested.to_string();
            outcome.left_out = filtered.left_out;
            outcome.unclassified = filtered.unclassified;
            if !outcome.unclassified.is_empty() {
                tracing::warn!(
                    unclassified = %outcome.unclassified.join(","),
                    "files the driver-capability table does not know are injected whatever NVIDIA_DRIVER_CAPABILITIES says"
                );
            }
        }
        apply_edits(&mut oci, &edits).map_err(|error| InjectError::Apply {
            path: path.clone(),
            devices: outcome.injected.join(","),
            error,
        })?;
        if self.one_hook_run
            && let Some(hook_path) = crate::nvidia_hooks::nvinject_hook_path(&edits.hooks)
        {
            let folded = crate::mount_hook::fold_into_one_run(
                &mut oci,
                &edits.mounts,
                hook_path,
                self.hook_timeout_secs,
            );
            outcome.mounts_in_hook = folded.mounts;
            outcome.hooks_merged = folded.hooks_merged;
        }
        outcome.inject_us = micros(t1);

        let t2 = Instant::now();
        let write_err = |source| InjectError::Write { path: path.clone(), source };
        let text = serde_json::to_vec(&oci).map_err(|e| write_err(std::io::Error::other(e)))?;
        // No fsync: config.json lives in containerd's bundle directory, which does not outlive a
        // reboot (containerd's state dir is on tmpfs on a normal host), and the rename alone gives
        // runc atomicity. An fsync would add a disk flush to every container start for nothing.
        let options = WriteOptions::new(mode).durability(Durability::None);
        nvinject_fsio::write_atomic(&path, &text, &options).map_err(|e| write_err(e.source))?;
        outcome.wrote = true;
        outcome.write_us = micros(t2);
        Ok(outcome)
    }

    /// The spec registry, shared by this proxy's Creates (a panic in another Create leaves it
    /// usable: it is refreshed before every use).
    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Resolves every requested device and gathers the edits to apply: each spec's common edits
    /// once, then each device's, skipping devices already in the container.
    fn collect_edits(
        &self,
        registry: &Registry,
        names: &[QualifiedName],
        source: &request::Source,
        oci: &Value,
        outcome: &mut Outcome,
    ) -> Result<(ContainerEdits, HookOrigins), InjectError> {
        let mut edits = ContainerEdits::default();
        let mut origins = HookOrigins::default();
        let mut specs_applied: BTreeSet<PathBuf> = BTreeSet::new();
        for name in names {
            let resolved = registry.resolve(name).map_err(|error| InjectError::Unresolvable {
                error: Box::new(error),
                requested_by: source.clone(),
                dirs: DirList(self.spec_dirs.clone()),
            })?;
            let nodes = &resolved.device.container_edits.device_nodes;
            if !nodes.is_empty() && nodes.iter().all(|n| has_device_node(oci, &n.path)) {
                outcome.already_present.push(name.to_string());
                continue;
            }
            // Nodes the spec leaves incomplete (nvidia-ctk writes no `type`, and no `minor` when it
            // is 0) are completed from the host device file before applying, as the CDI reference
            // library does; complete nodes (nvinject's own) never touch the host. Device files are
            // looked up inside the spec's dev root (its annotation, else `[regenerate] dev-root`).
            let first_new = edits.device_nodes.len();
            if specs_applied.insert(resolved.path.to_owned()) {
                if let Some(untrusted) = resolved.untrusted {
                    // The host chose to accept such files; every use says so, loudly.
                    tracing::warn!(
                        device = %name,
                        spec = %resolved.path.display(),
                        untrusted = %untrusted,
                        "UNTRUSTED CDI spec used because [cdi] accept-untrusted-specs = true: its hooks run as root"
                    );
                    outcome.untrusted_specs.push(untrusted.to_string());
                }
                edits.append(&resolved.spec.container_edits);
                origins.add(&resolved, &resolved.spec.container_edits.hooks);
            }
            edits.append(&resolved.device.container_edits);
            origins.add(&resolved, &resolved.device.container_edits.hooks);
            let dev_root = resolved
                .spec
                .annotations
                .get(ANNOTATION_DEV_ROOT)
                .map(PathBuf::from)
                .or_else(|| self.dev_root.clone());
            nvinject_cdi::fill::fill_from_host(
                &mut edits.device_nodes[first_new..],
                resolved.path,
                dev_root.as_deref(),
            )
            .map_err(|error| InjectError::HostDevice { device: name.to_string(), error })?;
            outcome.injected.push(name.to_string());
        }
        Ok((edits, origins))
    }
}

/// Where the edits' hooks came from, to tell nvinject's own hook runs from everyone else's.
#[derive(Debug, Default)]
struct HookOrigins {
    /// Each hook as a spec wrote it, with the spec file.
    hooks: Vec<(Hook, PathBuf)>,
    /// Paths of nvinject-hook that trusted specs nvinject-cdi wrote run.
    ours: BTreeSet<String>,
}

/// Most foreign hooks named on the create log line; the rest are counted.
const FOREIGN_HOOKS_SHOWN: usize = 16;

impl HookOrigins {
    fn add(&mut self, resolved: &nvinject_cdi::Resolved<'_>, hooks: &[Hook]) {
        let ours =
            resolved.untrusted.is_none() && resolved.spec.annotations.contains_key(ANNOTATION_GENERATED_BY);
        for hook in hooks {
            if ours && Path::new(&hook.path).file_name().is_some_and(|f| f == HOOK_PROGRAM) {
                self.ours.insert(hook.path.clone());
            }
            self.hooks.push((hook.clone(), resolved.path.to_owned()));
        }
    }

    /// Each of `hooks` (the edits as they will be applied) that does not run nvinject's own hook
    /// (one of our specs names it, or `[regenerate] hook-path`, or the installer's path), as
    /// `<spec file>: <path> <point>`, escaped; at most [`FOREIGN_HOOKS_SHOWN`].
    fn foreign(&self, hooks: &[Hook], configured: Option<&Path>) -> Vec<String> {
        let is_ours = |h: &Hook| {
            self.ours.contains(&h.path)
                || h.path == DEFAULT_HOOK_PATH
                || configured.is_some_and(|c| Path::new(&h.path) == c)
        };
        let foreign: Vec<&Hook> = hooks.iter().filter(|h| !is_ours(h)).collect();
        let mut shown: Vec<String> = foreign
            .iter()
            .take(FOREIGN_HOOKS_SHOWN)
            .map(|h| {
                // A hook the NVIDIA translation rewrote is no longer equal to what a spec wrote.
                let from = self
                    .hooks
                    .iter()
                    .find(|(o, _)| o == *h)
                    .or_else(|| {
                        self.hooks.iter().find(|(o, _)| o.hook_name == h.hook_name && o.path == h.path)
                    })
                    .map_or_else(|| "NVIDIA hook translated".to_owned(), |(_, p)| p.display().to_string());
                format!(
                    "{}: {} {}",
                    nvinject_fsio::escape::escape(&from),
                    nvinject_fsio::escape::escape(&h.path),
                    nvinject_fsio::escape::escape_within(&h.hook_name, 32)
                )
            })
            .collect();
        if foreign.len() > FOREIGN_HOOKS_SHOWN {
            shown.push(format!("... {} more", foreign.len() - FOREIGN_HOOKS_SHOWN));
        }
        shown
    }
}

impl CreateGate for Injector {
    fn before_create(&self, request: &CreateTaskRequest) -> Result<(), Rejection> {
        let result = self.inject(Path::new(&request.bundle));
        match &result {
            Ok(o) => tracing::info!(
                id = %request.id,
                source = %o.source,
                requested = %o.requested.join(","),
                injected = %o.injected.join(","),
                already_present = %o.already_present.join(","),
                ignored = %o.ignored.join("; "),
                capabilities = %o.capabilities,
                left_out = o.left_out.len(),
                regenerated = ?o.regenerated,
                mounts_in_hook = o.mounts_in_hook,
                hooks_merged = o.hooks_merged,
                nvidia_hooks = %o.nvidia_hooks.join(","),
                foreign_hooks = %o.foreign_hooks.join("; "),
                untrusted_specs = o.untrusted_specs.len(),
                wrote = o.wrote,
                read_us = o.read_us,
                inject_us = o.inject_us,
                write_us = o.write_us,
                "container create"
            ),
            Err(e) => tracing::error!(id = %request.id, error = %e, "container create refused"),
        }
        result.map(|_| ()).map_err(|e| Rejection {
            code: e.code(),
            // Backstop for text from the pod or image deeper in the error (its own fields are
            // escaped where they are formatted): containerd shows and logs this as it is.
            message: format!("nvinject: container {}: {}", request.id, escape_within(&e.to_string(), 8192)),
        })
    }
}

/// The file's bytes and permission bits, from one open (the rewrite keeps the mode).
fn read_with_mode(path: &Path) -> std::io::Result<(Vec<u8>, u32)> {
    use std::io::Read;
    let mut file = fs::File::open(path)?;
    let meta = file.metadata()?;
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.read_to_end(&mut bytes)?;
    Ok((bytes, meta.permissions().mode() & 0o7777))
}

fn describe_ignored(ignored: &[request::Ignored]) -> Vec<String> {
    ignored.iter().map(|i| format!("{}: {}", i.source, i.reason)).collect()
}

fn micros(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::freshness::{
        GeneratorError, LockDir, ModuleVersion, Regenerate, RegenerateRequest, StderrTail,
    };
    use nvinject_cdi::nvinject::ANNOTATION_DRIVER_VERSION;
    use serde_json::json;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn spec_json(version: &str, gpus: &[(u32, &str)]) -> Value {
        let devices: Vec<Value> = gpus
            .iter()
            .map(|(i, _)| {
                json!({"name": i.to_string(), "containerEdits": {"deviceNodes": [
                    {"path": format!("/dev/nvidia{i}"), "type": "c", "major": 195, "minor": i, "fileMode": 438}]}})
            })
            .chain(gpus.iter().map(|(i, uuid)| {
                json!({"name": uuid, "containerEdits": {"deviceNodes": [
                    {"path": format!("/dev/nvidia{i}"), "type": "c", "major": 195, "minor": i, "fileMode": 438}]}})
            }))
            .collect();
        json!({
            "cdiVersion": "0.6.0",
            "kind": "nvidia.com/gpu",
            "annotations": {"nvinject.io/driver-version": version, "nvinject.io/driver-root": "/drv"},
            "devices": devices,
            "containerEdits": {
                "env": ["NVIDIA_VISIBLE_DEVICES=void"],
                "deviceNodes": [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255, "fileMode": 438}],
                "mounts": [{"hostPath": "/drv/usr/lib/libcuda.so.1", "containerPath": "/usr/lib/libcuda.so.1", "options": ["ro", "bind"]}],
                "hooks": [{"hookName": "createContainer", "path": "/opt/hook", "args": ["nvinject-hook", "update-ldcache"]}]
            }
        })
    }

    struct Fixture {
        dir: tempfile::TempDir,
        config: Config,
    }

    impl Fixture {
        fn new() -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            for d in ["cdi", "bundle", "sys/module/nvidia"] {
                fs::create_dir_all(dir.path().join(d)).unwrap();
            }
            fs::write(dir.path().join("sys/module/nvidia/version"), "550.54.15\n").unwrap();
            let mut config = Config::default();
            config.cdi.spec_dirs = vec![dir.path().join("cdi")];
            config.regenerate.sys_root = dir.path().join("sys");
            config.regenerate.lock_dir = dir.path().join("locks");
            Fixture { dir, config }
        }
        fn spec_path(&self) -> PathBuf {
            self.dir.path().join("cdi/nvidia.com-gpu.json")
        }
        fn write_spec(&self, version: &str) {
            fs::write(
                self.spec_path(),
                serde_json::to_vec(&spec_json(version, &[(0, "GPU-aaa"), (1, "GPU-bbb")])).unwrap(),
            )
            .unwrap();
        }
        fn bundle(&self) -> PathBuf {
            self.dir.path().join("bundle")
        }
        fn write_oci(&self, oci: &Value) -> Vec<u8> {
            let bytes = serde_json::to_vec(oci).unwrap();
            fs::write(self.bundle().join("config.json"), &bytes).unwrap();
            bytes
        }
        fn read_oci(&self) -> Value {
            serde_json::from_slice(&fs::read(self.bundle().join("config.json")).unwrap()).unwrap()
        }
    }

    /// Writes a fresh spec for the loaded version; counts calls; can be told to fail.
    struct FakeRegen {
        calls: Arc<AtomicUsize>,
        fail: bool,
    }

    impl Regenerate for FakeRegen {
        fn regenerate(&self, request: &RegenerateRequest) -> Result<(), GeneratorError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.fail {
                return Err(GeneratorError::Failed {
                    program: "/opt/nvinject-cdi".into(),
                    status: std::os::unix::process::ExitStatusExt::from_raw(256),
                    stderr: StderrTail("NVML not loadable".into()),
                });
            }
            let spec = spec_json(&request.loaded_version, &[(0, "GPU-aaa"), (1, "GPU-bbb"), (2, "GPU-ccc")]);
            let bytes = serde_json::to_vec(&spec).unwrap();
            nvinject_fsio::write_atomic(&request.spec_path, &bytes, &WriteOptions::new(0o644)).unwrap();
            Ok(())
        }
    }

    /// The injector over the fixture's roots: the module version file under its sys root, the spec
    /// locks in its temp dir, and the fake regenerator.
    fn injector(f: &Fixture, fail: bool) -> (Injector, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let edges = Edges {
            driver: Box::new(ModuleVersion {
                sys_root: f.config.regenerate.sys_root.clone(),
                proc_root: f.config.regenerate.proc_root.clone(),
            }),
            locks: Box::new(LockDir::new(&f.config.regenerate)),
            regenerator: Box::new(FakeRegen { calls: calls.clone(), fail }),
        };
        (Injector::new(&f.config, edges), calls)
    }

    fn oci_with(annotations: Value) -> Value {
        json!({"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"], "args": ["sh"]},
               "root": {"path": "rootfs"}, "annotations": annotations, "x-unknown": {"kept": true},
               "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}}})
    }

    #[test]
    fn a_request_is_resolved_applied_and_written_keeping_unknown_fields() {
        let f = Fixture::new();
        f.write_spec("550.54.15");
        f.write_oci(&oci_with(json!({"cdi.k8s.io/a": "nvidia.com/gpu=1"})));
        let (inj, calls) = injector(&f, false);
        let out = inj.inject(&f.bundle()).unwrap();
        assert_eq!(out.injected, ["nvidia.com/gpu=1"]);
        assert!(out.wrote);
        assert_eq!(calls.load(Ordering::SeqCst), 0, "a fresh spec is not regenerated");
        let oci = f.read_oci();
        let paths: Vec<&str> =
            oci["linux"]["devices"].as_array().unwrap().iter().map(|d| d["path"].as_str().unwrap()).collect();
        assert_eq!(paths, ["/dev/nvidiactl", "/dev/nvidia1"]);
        assert_eq!(oci["mounts"][0]["destination"], "/usr/lib/libcuda.so.1");
        assert_eq!(oci["hooks"]["createContainer"][0]["path"], "/opt/hook");
        assert_eq!(oci["x-unknown"], json!({"kept": true}));
        assert_eq!(oci["process"]["env"], json!(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"]));
        // Only config.json in the bundle: no temp file left.
        assert_eq!(fs::read_dir(f.bundle()).unwrap().count(), 1);
    }

    /// Our spec (nvinject-cdi's annotation, its hook named nvinject-hook) with another tool's hook
    /// on GPU 1, at `mode`.
    fn write_spec_with_foreign_hook(f: &Fixture, mode: u32) {
        let mut spec = spec_json("550.54.15", &[(0, "GPU-aaa"), (1, "GPU-bbb")]);
        spec["annotations"]["nvinject.io/generated-by"] = json!("nvinject-cdi 0.1.0");
        spec["containerEdits"]["hooks"][0]["path"] = json!("/opt/nvinject/nvinject-hook");
        spec["devices"][1]["containerEdits"]["hooks"] =
            json!([{"hookName": "startContainer", "path": "/usr/bin/other\nhook", "args": ["x"]}]);
        fs::write(f.spec_path(), serde_json::to_vec(&spec).unwrap()).unwrap();
        fs::set_permissions(f.spec_path(), fs::Permissions::from_mode(mode)).unwrap();
        fs::set_permissions(f.dir.path().join("cdi"), fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn hooks_nvinject_did_not_write_are_named_and_untrusted_specs_are_refused_or_reported() {
        let f = Fixture::new();
        write_spec_with_foreign_hook(&f, 0o644);
        f.write_oci(&oci_with(json!({"cdi.k8s.io/a": "nvidia.com/gpu=0,nvidia.com/gpu=1"})));
        let (inj, _) = injector(&f, false);
        let out = inj.inject(&f.bundle()).unwrap();
        let spec = f.spec_path().display().to_string();
        // Escaped: a line break in a spec cannot forge a log line.
        assert_eq!(out.foreign_hooks, [format!("{spec}: /usr/bin/other\\nhook startContainer")]);
        assert!(out.untrusted_specs.is_empty());

        // Writable by others: set aside, and the Create refused naming the file, its mode and the fix.
        write_spec_with_foreign_hook(&f, 0o666);
        f.write_oci(&oci_with(json!({"cdi.k8s.io/a": "nvidia.com/gpu=0"})));
        let err = inj.inject(&f.bundle()).unwrap_err();
        assert_eq!(err.code(), Code::FAILED_PRECONDITION);
        let text = err.to_string();
        assert!(text.contains(&format!("untrusted CDI spec {spec}: the file is owned by")), "{text}");
        assert!(text.contains("mode 0666") && text.contains(&format!("fix: `chmod go-w {spec}`")), "{text}");

        // Accepted by the host's choice: used, reported, and its nvinject-hook no longer counts as ours.
        let mut config = f.config.clone();
        config.cdi.accept_untrusted_specs = true;
        let g = Fixture { dir: f.dir, config };
        let (inj, _) = injector(&g, false);
        let out = inj.inject(&g.bundle()).unwrap();
        assert_eq!(out.injected, ["nvidia.com/gpu=0"]);
        assert!(
            out.untrusted_specs.len() == 1 && out.untrusted_specs[0].contains("0666"),
            "{:?}",
            out.untrusted_specs
        );
        assert_eq!(out.foreign_hooks, [format!("{spec}: /opt/nvinject/nvinject-hook createContainer")]);
    }

    #[test]
    fn two_devices_of_one_spec_get_its_common_edits_once() {
        let f = Fixture::new();
        f.write_spec("550.54.15");
        f.write_oci(&oci_with(json!({"cdi.k8s.io/a": "nvidia.com/gpu=0,nvidia.com/gpu=GPU-bbb"})));
        let (inj, _) = injector(&f, false);
        inj.inject(&f.bundle()).unwrap();
        let oci = f.read_oci();
        assert_eq!(oci["linux"]["devices"].as_array().unwrap().len(), 3);
        assert_eq!(oci["mounts"].as_array().unwrap().len(), 1);
        assert_eq!(oci["hooks"]["createContainer"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn no_request_and_sandboxes_leave_the_file_byte_for_byte() {
        let f = Fixture::new();
        f.write_spec("550.54.15");
        let (inj, _) = injector(&f, false);
        for oci in [
            oci_with(json!({})),
            oci_with(
                json!({"io.kubernetes.cri.container-type": "sandbox", "cdi.k8s.io/a": "nvidia.com/gpu=1"}),
            ),
        ] {
            let before = f.write_oci(&oci);
            let out = inj.inject(&f.bundle()).unwrap();
            assert!(!out.wrote && out.injected.is_empty());
            assert_eq!(fs::read(f.bundle().join("config.json")).unwrap(), before);
        }
    }

    #[test]
    fn devices_already_in_the_spec_are_not_added_twice() {
        let f = Fixture::new();
        f.write_spec("550.54.15");
        let mut oci = oci_with(json!({"cdi.k8s.io/a": "nvidia.com/gpu=0,nvidia.com/gpu=1"}));
        oci["linux"]["devices"] = json!([{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]);
        f.write_oci(&oci);
        let (inj, _) = injector(&f, false);
        let out = inj.inject(&f.bundle()).unwrap();
        assert_eq!(out.already_present, ["nvidia.com/gpu=0"]);
        assert_eq!(out.injected, ["nvidia.com/gpu=1"]);
        let count = f.read_oci()["linux"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["path"] == "/dev/nvidia0")
            .count();
        assert_eq!(count, 1);
    }

    #[test]
    fn unresolvable_devices_are_refused_naming_device_and_dirs_and_change_nothing() {
        let f = Fixture::new();
        f.write_spec("550.54.15");
        let before = f.write_oci(&oci_with(json!({"cdi.k8s.io/a": "nvidia.com/gpu=1,nvidia.com/gpu=9"})));
        let (inj, _) = injector(&f, false);
        let e = inj.inject(&f.bundle()).unwrap_err();
        assert_eq!(e.code(), Code::FAILED_PRECONDITION);
        let text = e.to_string();
        assert!(
            text.contains("nvidia.com/gpu=9")
                && text.contains(&f.dir.path().join("cdi").display().to_string()),
            "{text}"
        );
        assert!(text.contains("annotations cdi.k8s.io/a"), "{text}");
        assert_eq!(fs::read(f.bundle().join("config.json")).unwrap(), before);

        let rejection = inj
            .before_create(&CreateTaskRequest {
                id: "c9".into(),
                bundle: f.bundle().to_string_lossy().into_owned(),
                ..Default::default()
            })
            .unwrap_err();
        assert!(
            rejection.message.starts_with("nvinject: container c9: unresolvable CDI device nvidia.com/gpu=9"),
            "{}",
            rejection.message
        );
    }

    #[test]
    fn a_stale_spec_is_regenerated_once_then_used() {
        let f = Fixture::new();
        f.write_spec("535.104.05");
        f.write_oci(&oci_with(json!({"cdi.k8s.io/a": "nvidia.com/gpu=2"})));
        let (inj, calls) = injector(&f, false);
        let out = inj.inject(&f.bundle()).unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(out.regenerated, [f.spec_path()]);
        assert_eq!(out.injected, ["nvidia.com/gpu=2"], "GPU 2 exists only in the regenerated spec");
        let spec = nvinject_cdi::load_file(&f.spec_path()).unwrap();
        assert_eq!(spec.annotations[ANNOTATION_DRIVER_VERSION], "550.54.15");
        // Fresh now: the next container does not regenerate.
        f.write_oci(&oci_with(json!({"cdi.k8s.io/a": "nvidia.com/gpu=0"})));
        inj.inject(&f.bundle()).unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_failed_regeneration_fails_the_container_saying_why() {
        let f = Fixture::new();
        f.write_spec("535.104.05");
        let before = f.write_oci(&oci_with(json!({"cdi.k8s.io/a": "nvidia.com/gpu=0"})));
        let (inj, _) = injector(&f, true);
        let text = inj.inject(&f.bundle()).unwrap_err().to_string();
        assert!(
            text.contains("535.104.05") && text.contains("550.54.15") && text.contains("NVML not loadable"),
            "{text}"
        );
        assert_eq!(fs::read(f.bundle().join("config.json")).unwrap(), before);
    }

    #[test]
    fn with_regeneration_off_a_stale_spec_is_used_as_it_is() {
        let mut f = Fixture::new();
        f.config.regenerate.enabled = false;
        f.write_spec("535.104.05");
        f.write_oci(&oci_with(json!({"cdi.k8s.io/a": "nvidia.com/gpu=0"})));
        let (inj, calls) = injector(&f, false);
        assert_eq!(inj.inject(&f.bundle()).unwrap().injected, ["nvidia.com/gpu=0"]);
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_missing_spec_path_is_generated_on_first_request() {
        let mut f = Fixture::new();
        f.config.regenerate.spec_path = Some(f.spec_path());
        f.write_oci(&oci_with(json!({"cdi.k8s.io/a": "nvidia.com/gpu=1"})));
        let (inj, calls) = injector(&f, false);
        let out = inj.inject(&f.bundle()).unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(out.injected, ["nvidia.com/gpu=1"]);
    }

    #[test]
    fn unreadable_bundles_and_bad_names_map_to_distinct_codes() {
        let f = Fixture::new();
        let (inj, _) = injector(&f, false);
        let e = inj.inject(&f.dir.path().join("nope")).unwrap_err();
        assert_eq!(e.code(), Code::INTERNAL);
        assert!(e.to_string().contains("config.json"));
        assert!(matches!(e, InjectError::ReadSpec { error: ReadSpecError::Io(_), .. }), "{e:?}");
        fs::write(f.bundle().join("config.json"), b"{not json").unwrap();
        let e = inj.inject(&f.bundle()).unwrap_err();
        assert_eq!(e.code(), Code::INTERNAL);
        assert!(matches!(e, InjectError::ReadSpec { error: ReadSpecError::Json(_), .. }), "{e:?}");
        assert!(e.to_string().starts_with("cannot read the container's OCI spec "), "{e}");
        f.write_oci(&oci_with(json!({"cdi.k8s.io/a": "nvidia.com/gpu=bad name"})));
        assert_eq!(inj.inject(&f.bundle()).unwrap_err().code(), Code::INVALID_ARGUMENT);
    }

    /// A spec with a utility library and a compute library, linked and cached.
    fn write_two_library_spec(f: &Fixture) {
        let mut spec = spec_json("550.54.15", &[(0, "GPU-aaa"), (1, "GPU-bbb")]);
        spec["containerEdits"]["mounts"] = json!([
            {"hostPath": "/drv/usr/lib/libcuda.so.550.54.15", "containerPath": "/usr/lib/libcuda.so.550.54.15", "options": ["ro", "bind"]},
            {"hostPath": "/drv/usr/lib/libnvidia-ml.so.550.54.15", "containerPath": "/usr/lib/libnvidia-ml.so.550.54.15", "options": ["ro", "bind"]},
            {"hostPath": "/drv/usr/bin/nvidia-smi", "containerPath": "/usr/bin/nvidia-smi", "options": ["ro", "bind"]}
        ]);
        spec["containerEdits"]["hooks"] = json!([
            {"hookName": "createContainer", "path": "/opt/nvinject-hook", "args": ["nvinject-hook", "create-symlinks",
                "--link", "libcuda.so.550.54.15::/usr/lib/libcuda.so.1", "--link", "libnvidia-ml.so.550.54.15::/usr/lib/libnvidia-ml.so.1"]},
            {"hookName": "createContainer", "path": "/opt/nvinject-hook", "args": ["nvinject-hook", "update-ldcache", "--folder", "/usr/lib"]}
        ]);
        fs::write(f.spec_path(), serde_json::to_vec(&spec).unwrap()).unwrap();
    }

    fn privileged_oci(env: &[&str], annotations: Value) -> Value {
        let mut oci = oci_with(annotations);
        let mut all = vec!["PATH=/bin"];
        all.extend_from_slice(env);
        oci["process"]["env"] = json!(all);
        oci["process"]["capabilities"] = json!({"bounding": ["CAP_SYS_ADMIN"]});
        oci
    }

    fn destinations(oci: &Value) -> Vec<String> {
        oci["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["destination"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn legacy_requests_get_only_the_files_of_their_driver_capabilities() {
        let mut f = Fixture::new();
        f.config.runtime.one_hook_run = false;
        write_two_library_spec(&f);
        let (inj, _) = injector(&f, false);
        let all =
            ["/usr/lib/libcuda.so.550.54.15", "/usr/lib/libnvidia-ml.so.550.54.15", "/usr/bin/nvidia-smi"];
        for (env, want, shown) in [
            (vec!["NVIDIA_DRIVER_CAPABILITIES=utility"], &all[1..], "utility"),
            (vec!["NVIDIA_DRIVER_CAPABILITIES=compute"], &all[..1], "compute"),
            (vec![], &all[..], "compute,utility (default)"),
            (vec!["NVIDIA_DRIVER_CAPABILITIES=all"], &all[..], "all"),
            (vec!["CUDA_VERSION=9.0"], &all[..], "all (legacy CUDA image)"),
        ] {
            let mut e = vec!["NVIDIA_VISIBLE_DEVICES=1"];
            e.extend(env.iter().copied());
            f.write_oci(&privileged_oci(&e, json!({})));
            let out = inj.inject(&f.bundle()).unwrap();
            assert_eq!(out.capabilities, shown, "{env:?}");
            let oci = f.read_oci();
            assert_eq!(destinations(&oci), want, "{env:?}");
            let paths: Vec<&str> = oci["linux"]["devices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["path"].as_str().unwrap())
                .collect();
            assert_eq!(paths, ["/dev/nvidiactl", "/dev/nvidia1"], "device nodes whatever the capabilities");
            assert!(out.unclassified.is_empty(), "{:?}", out.unclassified);
        }
        f.write_oci(&privileged_oci(
            &["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility"],
            json!({}),
        ));
        let out = inj.inject(&f.bundle()).unwrap();
        assert_eq!(out.left_out, ["/usr/lib/libcuda.so.550.54.15", "/usr/lib/libcuda.so.1"]);
        let hooks = &f.read_oci()["hooks"]["createContainer"];
        assert_eq!(
            hooks[0]["args"],
            json!([
                "nvinject-hook",
                "create-symlinks",
                "--link",
                "libnvidia-ml.so.550.54.15::/usr/lib/libnvidia-ml.so.1"
            ])
        );
        assert_eq!(hooks[1]["args"], json!(["nvinject-hook", "update-ldcache", "--folder", "/usr/lib"]));
    }

    #[test]
    fn driver_capabilities_ignore_gives_legacy_requests_the_whole_spec() {
        let mut f = Fixture::new();
        f.config.runtime.one_hook_run = false;
        f.config.requests.driver_capabilities = DriverCapabilities::Ignore;
        write_two_library_spec(&f);
        let (inj, _) = injector(&f, false);
        // Not read at all, as NVIDIA's jit-cdi mode: a narrow, an unset and a bad value alike.
        for env in
            [vec!["NVIDIA_DRIVER_CAPABILITIES=utility"], vec![], vec!["NVIDIA_DRIVER_CAPABILITIES=bogus"]]
        {
            let mut e = vec!["NVIDIA_VISIBLE_DEVICES=1"];
            e.extend(env.iter().copied());
            f.write_oci(&privileged_oci(&e, json!({})));
            let out = inj.inject(&f.bundle()).unwrap_or_else(|e| panic!("{env:?}: {e}"));
            assert_eq!(out.capabilities, "", "{env:?}");
            assert_eq!(destinations(&f.read_oci()).len(), 3, "{env:?}");
        }
    }

    #[test]
    fn cdi_requests_get_the_whole_spec_whatever_the_capabilities() {
        let mut f = Fixture::new();
        f.config.runtime.one_hook_run = false;
        write_two_library_spec(&f);
        let (inj, _) = injector(&f, false);
        for oci in [
            privileged_oci(
                &["NVIDIA_DRIVER_CAPABILITIES=utility"],
                json!({"cdi.k8s.io/a": "nvidia.com/gpu=1"}),
            ),
            privileged_oci(
                &["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1", "NVIDIA_DRIVER_CAPABILITIES=utility"],
                json!({}),
            ),
            // A bad value on the CDI path is not read at all, as NVIDIA's cdi mode does not.
            privileged_oci(
                &["NVIDIA_DRIVER_CAPABILITIES=bogus"],
                json!({"cdi.k8s.io/a": "nvidia.com/gpu=1"}),
            ),
        ] {
            f.write_oci(&oci);
            let out = inj.inject(&f.bundle()).unwrap();
            assert_eq!(out.capabilities, "");
            assert_eq!(destinations(&f.read_oci()).len(), 3);
        }
    }

    #[test]
    fn a_bad_capability_refuses_the_create_and_writes_nothing() {
        let f = Fixture::new();
        write_two_library_spec(&f);
        let (inj, _) = injector(&f, false);
        let before = f.write_oci(&privileged_oci(
            &["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,\u{1b}[2Jgpu"],
            json!({}),
        ));
        let e = inj.inject(&f.bundle()).unwrap_err();
        assert_eq!(e.code(), Code::INVALID_ARGUMENT);
        assert!(e.to_string().contains("unknown driver capability"), "{e}");
        assert_eq!(fs::read(f.bundle().join("config.json")).unwrap(), before);
        // An unprivileged container's env is not a request, so its capabilities are not read.
        let mut oci =
            privileged_oci(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=bogus"], json!({}));
        oci["process"]["capabilities"] = json!({"bounding": []});
        f.write_oci(&oci);
        assert!(!inj.inject(&f.bundle()).unwrap().wrote);
    }

    /// A spec as nvidia-ctk writes it (no `type`; no `minor` for minor 0), its device files under a
    /// dev root that `[regenerate] dev-root` names: the nodes are completed from those files.
    #[test]
    #[ignore = "needs root"]
    fn nvidia_ctk_specs_are_completed_from_the_dev_root_or_refused_naming_the_file() {
        nvinject_test_support::require_root("mknod");
        let f = Fixture::new();
        let dev_root = f.dir.path().join("host");
        fs::create_dir_all(dev_root.join("dev")).unwrap();
        for (name, minor) in [("nvidia0", 0), ("nvidiactl", 255)] {
            let c = std::ffi::CString::new(dev_root.join("dev").join(name).to_str().unwrap()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(195, minor)) };
            assert_eq!(rc, 0, "mknod: {}", std::io::Error::last_os_error());
        }
        fs::write(dev_root.join("dev/nvidia1"), b"not a device").unwrap();
        let host = |name: &str| dev_root.join("dev").join(name).display().to_string();
        let spec = json!({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
            "devices": [
                {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": host("nvidia0"), "major": 195, "fileMode": 438, "permissions": "rwm"}]}},
                {"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1", "hostPath": host("nvidia1")}]}}],
            "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
                "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": host("nvidiactl")}]}});
        fs::write(f.spec_path(), serde_json::to_vec(&spec).unwrap()).unwrap();
        let mut f = f;
        f.config.regenerate.dev_root = Some(dev_root.clone());

        f.write_oci(&oci_with(json!({"cdi.k8s.io/a": "nvidia.com/gpu=0"})));
        let (inj, _) = injector(&f, false);
        assert_eq!(inj.inject(&f.bundle()).unwrap().injected, ["nvidia.com/gpu=0"]);
        let oci = f.read_oci();
        assert_eq!(
            oci["linux"]["devices"],
            json!([{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255, "fileMode": 0o600},
                   {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 438}])
        );
        assert_eq!(
            oci["linux"]["resources"]["devices"][2],
            json!({"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rwm"})
        );

        let before = f.write_oci(&oci_with(json!({"cdi.k8s.io/a": "nvidia.com/gpu=1"})));
        let e = inj.inject(&f.bundle()).unwrap_err();
        assert_eq!(e.code(), Code::FAILED_PRECONDITION);
        let text = e.to_string();
        for part in [
            "nvidia.com/gpu=1",
            &f.spec_path().display().to_string(),
            "device node /dev/nvidia1",
            "is a regular file",
            "point hostPath at the device node",
        ] {
            assert!(text.contains(part), "{text} lacks {part}");
        }
        assert_eq!(
            fs::read(f.bundle().join("config.json")).unwrap(),
            before,
            "a refused Create writes nothing"
        );
    }
}
