//! The precedence merge: flags and environment ([`Overrides`]) over the file ([`ConfigFile`])
//! over the binary's [`Defaults`], validated into [`Settings`]. Pure: a function of its inputs.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use nvinject_cdi::Kind;
use nvinject_cdi::nvinject::{CDI_ANNOTATION_PREFIX, check_annotation_prefix};

use super::error::ConfigError;
use super::file::{ConfigFile, CriticalXidsFile, FileHealth, FileTimeSlicing, OneOrMany};
use crate::duration::GoDuration;
use crate::health::HealthPolicy;
use crate::resource_name::ResourceName;
use crate::settings::{
    DeviceIdStrategy, DeviceListStrategy, MigStrategy, ReplicaPolicy, ReplicatedResource, Settings,
    TimeSlicing,
};

/// Host paths the binary supplies as defaults (paths are parameters, never constants in the library).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defaults {
    /// `/`.
    pub driver_root: PathBuf,
    /// `/proc`.
    pub proc_root: PathBuf,
    /// `/var/lib/kubelet/device-plugins/kubelet.sock`.
    pub kubelet_socket: PathBuf,
    /// `/etc/kubernetes/node-feature-discovery/features.d/nvinject`.
    pub features_file: PathBuf,
}

/// Values from flags and the environment (flag already preferred over environment by the caller).
/// `None` = not given; the file or the default applies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--mig-strategy` / `MIG_STRATEGY`.
    pub mig_strategy: Option<MigStrategy>,
    /// `--fail-on-init-error` / `FAIL_ON_INIT_ERROR`.
    pub fail_on_init_error: Option<bool>,
    /// `--nvidia-driver-root` / `NVIDIA_DRIVER_ROOT`.
    pub driver_root: Option<PathBuf>,
    /// `--container-driver-root` / `CONTAINER_DRIVER_ROOT`.
    pub container_driver_root: Option<PathBuf>,
    /// `--nvidia-dev-root` / `NVIDIA_DEV_ROOT`.
    pub dev_root: Option<PathBuf>,
    /// `--proc-root` / `NVINJECT_PROC_ROOT`.
    pub proc_root: Option<PathBuf>,
    /// `--pass-device-specs` / `PASS_DEVICE_SPECS`.
    pub pass_device_specs: Option<bool>,
    /// `--device-list-strategy` / `DEVICE_LIST_STRATEGY` (comma-separated).
    pub device_list_strategies: Option<Vec<DeviceListStrategy>>,
    /// `--device-id-strategy` / `DEVICE_ID_STRATEGY`.
    pub device_id_strategy: Option<DeviceIdStrategy>,
    /// `--cdi-annotation-prefix` / `CDI_ANNOTATION_PREFIX`.
    pub cdi_annotation_prefix: Option<String>,
    /// `--cdi-kind` / `NVINJECT_CDI_KIND`.
    pub cdi_kind: Option<Kind>,
    /// `--kubelet-socket` / `KUBELET_SOCKET`.
    pub kubelet_socket: Option<PathBuf>,
    /// `--nvml-lib` / `NVINJECT_NVML_LIB`.
    pub nvml_library: Option<PathBuf>,
    /// `--features-file` / `NVINJECT_FEATURES_FILE`; empty disables.
    pub features_file: Option<String>,
    /// `--metrics-address` / `NVINJECT_METRICS_ADDRESS`; empty disables.
    pub metrics_address: Option<String>,
    /// `DP_DISABLE_HEALTHCHECKS` as NVIDIA's plugin reads it: `all`/`xids`, or extra XIDs to ignore.
    pub disable_healthchecks: Option<String>,
    /// `--health-recovery-period` / `NVINJECT_HEALTH_RECOVERY_PERIOD`.
    pub recovery_period: Option<GoDuration>,
    /// `--mps-pipe-dir` / `NVINJECT_MPS_PIPE_DIR`; empty: none.
    pub mps_pipe_dir: Option<PathBuf>,
}

/// Settings resolved, plus the keys that were accepted but have no effect (to log once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedConfig {
    /// What the plugin runs with.
    pub settings: Settings,
    /// Paths of accepted-but-ignored keys, e.g. `flags.gfd`.
    pub ignored: Vec<String>,
}

/// Lays `overrides` over `file` over `defaults` and validates the result. `origin` names the file
/// in errors (`(none)` when there is no file).
pub fn resolve(
    file: &ConfigFile,
    origin: &str,
    overrides: &Overrides,
    defaults: &Defaults,
) -> Result<ResolvedConfig, ConfigError> {
    let mut ignored = Vec::new();
    let flags = &file.flags;
    let plugin = &flags.plugin;
    let err = |field: &str, msg: String| ConfigError::field(origin, field, msg);

    for (present, path) in [
        (file.resources.is_some(), "resources"),
        (file.imex.is_some(), "imex"),
        (flags.restart_on_device_unhealthy.is_some(), "flags.restartOnDeviceUnhealthy"),
        (flags.device_discovery_strategy.is_some(), "flags.deviceDiscoveryStrategy"),
        (flags.gfd.is_some(), "flags.gfd"),
        (flags.mps_root.is_some(), "flags.mpsRoot"),
        (plugin.nvidia_ctk_path.is_some(), "flags.plugin.nvidiaCTKPath"),
        (plugin.nvidia_cdi_hook_path.is_some(), "flags.plugin.nvidiaCDIHookPath"),
        (file.health.event_types.is_some(), "health.eventTypes"),
    ] {
        if present {
            ignored.push(path.to_owned());
        }
    }
    if flags.gds_enabled == Some(true) {
        return Err(err(
            "flags.gdsEnabled",
            "GPUDirect Storage injection is not supported by nvinject: remove the key or set it to false"
                .into(),
        ));
    }
    if flags.mofed_enabled == Some(true) {
        return Err(err(
            "flags.mofedEnabled",
            "MOFED injection is not supported by nvinject: remove the key or set it to false".into(),
        ));
    }
    if let Some(types) = &file.health.event_types {
        for (i, t) in types.iter().enumerate() {
            if !["EventTypeXidCriticalError", "EventTypeDoubleBitEccError", "EventTypeSingleBitEccError"]
                .contains(&t.as_str())
            {
                return Err(err(
                    &format!("health.eventTypes[{i}]"),
                    format!(
                        "unknown event type `{t}`: expected EventTypeXidCriticalError, \
                         EventTypeDoubleBitEccError or EventTypeSingleBitEccError"
                    ),
                ));
            }
        }
    }

    let driver_root = pick(&overrides.driver_root, &flags.nvidia_driver_root)
        .unwrap_or_else(|| defaults.driver_root.clone());
    let container_driver_root = pick(&overrides.container_driver_root, &plugin.container_driver_root)
        .filter(|p| !p.as_os_str().is_empty());
    let dev_root = pick(&overrides.dev_root, &flags.nvidia_dev_root).unwrap_or_else(|| driver_root.clone());

    let device_list_strategies = match (&overrides.device_list_strategies, &plugin.device_list_strategy) {
        (Some(list), _) => list.clone(),
        (None, Some(spec)) => {
            let words: Vec<&String> = match spec {
                OneOrMany::One(s) => vec![s],
                OneOrMany::Many(v) => v.iter().collect(),
            };
            let mut out = Vec::new();
            for (i, word) in words.iter().enumerate() {
                let field = match spec {
                    OneOrMany::One(_) => "flags.plugin.deviceListStrategy".to_owned(),
                    OneOrMany::Many(_) => format!("flags.plugin.deviceListStrategy[{i}]"),
                };
                // A string may itself be comma-separated, as the environment variable is.
                for part in word.split(',').filter(|p| !p.trim().is_empty()) {
                    out.push(part.parse().map_err(|m| err(&field, m))?);
                }
            }
            out
        }
        (None, None) => vec![DeviceListStrategy::CdiAnnotations],
    };
    let device_list_strategies = dedup_keep_order(device_list_strategies);
    if device_list_strategies.is_empty() {
        return Err(err(
            "flags.plugin.deviceListStrategy",
            "no device list strategy given: use one or more of envvar, volume-mounts, cdi-annotations, cdi-cri"
                .into(),
        ));
    }

    let cdi_annotation_prefix = pick(&overrides.cdi_annotation_prefix, &plugin.cdi_annotation_prefix)
        .unwrap_or_else(|| CDI_ANNOTATION_PREFIX.to_owned());
    // The shim's rule for the prefixes it reads, so every key written here is one it reads.
    check_annotation_prefix(&cdi_annotation_prefix)
        .map_err(|e| err("flags.plugin.cdiAnnotationPrefix", e.to_string()))?;
    // Flag and file values were parsed with CDI's rules where they were read.
    let cdi_kind =
        pick(&overrides.cdi_kind, &plugin.cdi_kind).unwrap_or_else(nvinject_cdi::nvinject::default_kind);

    let kubelet_socket = pick(&overrides.kubelet_socket, &plugin.kubelet_socket)
        .unwrap_or_else(|| defaults.kubelet_socket.clone());
    if kubelet_socket.file_name().is_none() || kubelet_socket.parent().is_none() {
        return Err(err(
            "flags.plugin.kubeletSocket",
            format!("`{}` must be the path of a socket file", kubelet_socket.display()),
        ));
    }

    let features_file = match pick(&overrides.features_file, &plugin.features_file) {
        None => Some(defaults.features_file.clone()),
        Some(s) if s.trim().is_empty() => None,
        Some(s) => Some(PathBuf::from(s)),
    };
    let metrics_address = match pick(&overrides.metrics_address, &plugin.metrics_address) {
        None => None,
        Some(s) if s.trim().is_empty() => None,
        Some(s) => Some(parse_metrics_address(&s).map_err(|m| err("flags.plugin.metricsAddress", m))?),
    };

    let time_slicing = match &file.sharing.time_slicing {
        None => None,
        Some(ts) => Some(resolve_replicas(ts, Strategy::TimeSlicing, origin)?),
    };
    let mig_strategy = overrides.mig_strategy.or(flags.mig_strategy).unwrap_or_default();
    let mps_pipe_dir =
        pick(&overrides.mps_pipe_dir, &plugin.mps_pipe_dir).filter(|p| !p.as_os_str().is_empty());
    if let Some(dir) = &mps_pipe_dir
        && !dir.is_absolute()
    {
        return Err(err(
            "flags.plugin.mpsPipeDir",
            format!(
                "`{}` is not an absolute path: give the MPS pipe directory as the host sees it, e.g. /run/nvidia/mps",
                dir.display()
            ),
        ));
    }
    let mps = match &file.sharing.mps {
        None => None,
        Some(m) => {
            let mps = resolve_replicas(m, Strategy::Mps, origin)?;
            if time_slicing.is_some() {
                return Err(err(
                    "sharing.mps",
                    "sharing.mps and sharing.timeSlicing are both set: a node shares its GPUs one way; \
                     remove one of them"
                        .into(),
                ));
            }
            if mps_pipe_dir.is_none() {
                return Err(err(
                    "sharing.mps",
                    "MPS sharing needs this node's MPS control daemon: set flags.plugin.mpsPipeDir (or \
                     --mps-pipe-dir, NVINJECT_MPS_PIPE_DIR) to its CUDA_MPS_PIPE_DIRECTORY, the directory \
                     the CDI spec is generated with (nvinject-cdi --mps-pipe-dir, nvinject-installer \
                     --mps-pipe-dir); or share with sharing.timeSlicing instead"
                        .into(),
                ));
            }
            if mig_strategy == MigStrategy::Mixed {
                return Err(err(
                    "sharing.mps",
                    "MPS sharing cannot be used with migStrategy mixed (as in NVIDIA's plugin): MIG devices \
                     are not MPS-shared; use migStrategy none, or sharing.timeSlicing"
                        .into(),
                ));
            }
            Some(mps)
        }
    };

    let health = resolve_health(&file.health, overrides, origin)?;

    let settings = Settings {
        mig_strategy,
        fail_on_init_error: overrides.fail_on_init_error.or(flags.fail_on_init_error).unwrap_or(true),
        nvml_library: pick(&overrides.nvml_library, &plugin.nvml_library),
        proc_root: pick(&overrides.proc_root, &plugin.proc_root)
            .unwrap_or_else(|| defaults.proc_root.clone()),
        pass_device_specs: overrides.pass_device_specs.or(plugin.pass_device_specs).unwrap_or(false),
        device_id_strategy: overrides.device_id_strategy.or(plugin.device_id_strategy).unwrap_or_default(),
        driver_root,
        container_driver_root,
        dev_root,
        device_list_strategies,
        cdi_annotation_prefix,
        cdi_kind,
        kubelet_socket,
        features_file,
        metrics_address,
        time_slicing,
        mps,
        mps_pipe_dir,
        health,
    };
    Ok(ResolvedConfig { settings, ignored })
}

fn pick<T: Clone>(over: &Option<T>, file: &Option<T>) -> Option<T> {
    over.clone().or_else(|| file.clone())
}

fn dedup_keep_order<T: PartialEq>(v: Vec<T>) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(v.len());
    for x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

/// `host:port`, or a bare port (`9402`, `:9402`) which binds to 127.0.0.1: the endpoint is for
/// a local scraper unless the operator says otherwise.
pub fn parse_metrics_address(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    let port_only = s.strip_prefix(':').unwrap_or(s);
    if let Ok(port) = port_only.parse::<u16>() {
        return Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
    }
    s.parse::<SocketAddr>()
        .map_err(|_| format!("`{s}` is not an address: write host:port (e.g. 127.0.0.1:9402) or a port"))
}

/// Which `sharing` section a replica list is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    TimeSlicing,
    Mps,
}

/// The most clients one MPS server takes on a Volta or later GPU (NVIDIA's plugin refuses more
/// replicas than this).
pub const MAX_MPS_REPLICAS: i64 = 48;

/// `sharing.timeSlicing` or `sharing.mps`: the same keys, checked the same way; MPS also caps the
/// replicas at [`MAX_MPS_REPLICAS`], takes no MIG resource, and refuses more than one replica per
/// container unless told otherwise (NVIDIA's defaults).
fn resolve_replicas(ts: &FileTimeSlicing, which: Strategy, origin: &str) -> Result<TimeSlicing, ConfigError> {
    let err = |field: String, msg: String| ConfigError::field(origin, field, msg);
    let (key, word) = match which {
        Strategy::TimeSlicing => ("sharing.timeSlicing", "timeSlicing"),
        Strategy::Mps => ("sharing.mps", "mps"),
    };
    let policy = match ts.strategy.as_deref().map(str::trim) {
        None | Some("") | Some("distributed") => ReplicaPolicy::Distributed,
        Some("packed") => ReplicaPolicy::Packed,
        Some(other) => {
            return Err(err(
                format!("{key}.strategy"),
                format!("unknown strategy `{other}`: expected distributed or packed"),
            ));
        }
    };
    if ts.resources.is_empty() {
        return Err(err(
            format!("{key}.resources"),
            format!(
                "no resources listed: add e.g. `- name: nvidia.com/gpu` with `replicas: 4`, or remove {word}"
            ),
        ));
    }
    let max = if which == Strategy::Mps { MAX_MPS_REPLICAS } else { 1024 };
    let mut resources: Vec<ReplicatedResource> = Vec::new();
    for (i, r) in ts.resources.iter().enumerate() {
        let at = |f: &str| format!("{key}.resources[{i}].{f}");
        let name = ResourceName::parse(&r.name).map_err(|m| err(at("name"), m))?;
        if which == Strategy::Mps && name.short().starts_with("mig-") {
            return Err(err(
                at("name"),
                format!("`{name}` is a MIG resource: MIG devices are not MPS-shared; share nvidia.com/gpu"),
            ));
        }
        if r.replicas < 1 || r.replicas > max {
            let why = if which == Strategy::Mps { " (an MPS server takes at most 48 clients)" } else { "" };
            return Err(err(
                at("replicas"),
                format!("{} replicas: give a number from 1 to {max}{why}", r.replicas),
            ));
        }
        match &r.devices {
            None => {}
            Some(serde_json::Value::String(s)) if s == "all" => {}
            Some(_) => {
                return Err(err(
                    at("devices"),
                    "only `all` is supported: every device of the resource is replicated".into(),
                ));
            }
        }
        let advertised_as = match r.rename.as_deref().map(str::trim) {
            Some(rn) if !rn.is_empty() => ResourceName::parse(rn).map_err(|m| err(at("rename"), m))?,
            _ if ts.rename_by_default => name.shared(),
            _ => name.clone(),
        };
        if resources.iter().any(|x| x.name == name) {
            return Err(err(at("name"), format!("`{name}` is listed twice")));
        }
        if let Some(other) = resources.iter().find(|x| x.advertised_as == advertised_as) {
            return Err(err(
                at("rename"),
                format!("`{advertised_as}` is already the name of the replicas of `{}`", other.name),
            ));
        }
        resources.push(ReplicatedResource { name, advertised_as, replicas: r.replicas as u32 });
    }
    Ok(TimeSlicing {
        fail_requests_greater_than_one: ts.fail_requests_greater_than_one.unwrap_or(which == Strategy::Mps),
        policy,
        resources,
    })
}

fn resolve_health(h: &FileHealth, over: &Overrides, origin: &str) -> Result<HealthPolicy, ConfigError> {
    let mut policy = HealthPolicy::default();
    if let Some(d) = h.disabled {
        policy.disabled = d;
    }
    if let Some(list) = &h.ignored_xids {
        policy.ignored_xids = list.iter().copied().collect();
    }
    match &h.critical_xids {
        None => {}
        Some(CriticalXidsFile::Word(w)) if w.eq_ignore_ascii_case("all") => policy.critical_xids = None,
        Some(CriticalXidsFile::Word(w)) => {
            return Err(ConfigError::field(
                origin,
                "health.criticalXIDs",
                format!("`{w}` is not valid: write `all` or a list of XID numbers"),
            ));
        }
        Some(CriticalXidsFile::List(list)) => {
            let set: BTreeSet<u64> = list.iter().copied().collect();
            if let Some(x) = set.intersection(&policy.ignored_xids).next() {
                return Err(ConfigError::field(
                    origin,
                    "health.criticalXIDs",
                    format!("XID {x} is both critical and ignored: remove it from one of the lists"),
                ));
            }
            policy.critical_xids = Some(set);
        }
    }
    if let Some(p) = over.recovery_period.or(h.recovery_period) {
        policy.recovery_period = (p.0 > Duration::ZERO).then_some(p);
    }
    if let Some(env) = &over.disable_healthchecks {
        apply_disable_healthchecks(&mut policy, env)?;
    }
    Ok(policy)
}

/// `DP_DISABLE_HEALTHCHECKS` as NVIDIA's plugin reads it: `all` or `xids` turn XID checks off;
/// otherwise a comma-separated list of extra XIDs to ignore. Garbage is refused, not skipped.
fn apply_disable_healthchecks(policy: &mut HealthPolicy, value: &str) -> Result<(), ConfigError> {
    let v = value.trim().to_ascii_lowercase();
    if v.is_empty() {
        return Ok(());
    }
    if v == "all" || v.split(',').any(|p| p.trim() == "xids") {
        policy.disabled = true;
        return Ok(());
    }
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let xid: u64 = part.parse().map_err(|_| {
            ConfigError::field(
                "environment",
                "DP_DISABLE_HEALTHCHECKS",
                format!("`{part}` is not an XID: give `all`, `xids` or comma-separated XID numbers"),
            )
        })?;
        policy.ignored_xids.insert(xid);
    }
    Ok(())
}

/// Parses a comma-separated `--device-list-strategy` value.
pub fn parse_strategy_list(s: &str) -> Result<Vec<DeviceListStrategy>, String> {
    s.split(',').filter(|p| !p.trim().is_empty()).map(str::parse).collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::file::{ConfigFile, parse_file};
    use super::*;

    fn defaults() -> Defaults {
        Defaults {
            driver_root: "/".into(),
            proc_root: "/proc".into(),
            kubelet_socket: "/k/kubelet.sock".into(),
            features_file: "/nfd/nvinject".into(),
        }
    }

    fn parse(text: &str) -> Result<ConfigFile, ConfigError> {
        parse_file(text, Path::new("/etc/cfg.yaml"))
    }

    fn resolve_text(text: &str, over: &Overrides) -> Result<ResolvedConfig, ConfigError> {
        resolve(&parse(text)?, "/etc/cfg.yaml", over, &defaults())
    }

    #[test]
    fn nvidia_time_slicing_config_is_understood() {
        let text = r#"
version: v1
flags:
  migStrategy: "mixed"
  failOnInitError: true
  nvidiaDriverRoot: "/run/nvidia/driver"
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: envvar
    deviceIDStrategy: index
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
    - name: mig-1g.10gb
      replicas: 2
      rename: small
"#;
        let r = resolve_text(text, &Overrides::default()).unwrap();
        let s = r.settings;
        assert_eq!(s.mig_strategy, MigStrategy::Mixed);
        assert_eq!(s.driver_root, PathBuf::from("/run/nvidia/driver"));
        assert_eq!(s.dev_root, PathBuf::from("/run/nvidia/driver"), "dev root follows the driver root");
        assert!(s.pass_device_specs);
        assert_eq!(s.device_list_strategies, vec![DeviceListStrategy::Envvar]);
        assert_eq!(s.device_id_strategy, DeviceIdStrategy::Index);
        let ts = s.time_slicing.unwrap();
        assert!(ts.fail_requests_greater_than_one);
        assert_eq!(ts.resources[0].advertised_as.as_str(), "nvidia.com/gpu.shared");
        assert_eq!(ts.resources[0].replicas, 4);
        assert_eq!(ts.resources[1].name.as_str(), "nvidia.com/mig-1g.10gb");
        assert_eq!(ts.resources[1].advertised_as.as_str(), "nvidia.com/small");
    }

    #[test]
    fn defaults_without_a_file() {
        let r = resolve(&ConfigFile::default(), "(none)", &Overrides::default(), &defaults()).unwrap();
        let s = r.settings;
        assert_eq!(s.mig_strategy, MigStrategy::None);
        assert!(s.fail_on_init_error);
        assert_eq!(s.device_list_strategies, vec![DeviceListStrategy::CdiAnnotations]);
        assert_eq!(s.cdi_annotation_prefix, "cdi.k8s.io/");
        assert_eq!(s.cdi_kind.as_str(), "nvidia.com/gpu");
        assert_eq!(s.plugin_dir(), Path::new("/k"));
        assert_eq!(s.features_file, Some(PathBuf::from("/nfd/nvinject")));
        assert_eq!(s.metrics_address, None);
        assert!(s.health.is_critical(79));
        for xid in [13, 31, 43, 45, 68, 94] {
            assert!(!s.health.is_critical(xid), "XID {xid} is an application error");
        }
        assert_eq!(s.health.recovery_period, Some(GoDuration(Duration::from_secs(300))));
    }

    #[test]
    fn overrides_beat_the_file() {
        let text =
            "flags:\n  migStrategy: single\n  plugin:\n    deviceListStrategy: [envvar, volume-mounts]\n";
        let over = Overrides {
            mig_strategy: Some(MigStrategy::Mixed),
            device_list_strategies: Some(vec![DeviceListStrategy::CdiCri]),
            ..Default::default()
        };
        let s = resolve_text(text, &over).unwrap().settings;
        assert_eq!(s.mig_strategy, MigStrategy::Mixed);
        assert_eq!(s.device_list_strategies, vec![DeviceListStrategy::CdiCri]);
        let s = resolve_text(text, &Overrides::default()).unwrap().settings;
        assert_eq!(s.mig_strategy, MigStrategy::Single);
        assert_eq!(
            s.device_list_strategies,
            vec![DeviceListStrategy::Envvar, DeviceListStrategy::VolumeMounts]
        );
    }

    #[test]
    fn errors_name_the_file_and_field() {
        let cases: &[(&str, &str, &str)] = &[
            ("flags:\n  migStrategy: half\n", "flags.migStrategy", "half"),
            (
                "flags:\n  plugin:\n    deviceListStrategy: [envvar, carrier-pigeon]\n",
                "deviceListStrategy[1]",
                "carrier-pigeon",
            ),
            ("flags:\n  colour: blue\n", "flags", "colour"),
            (
                "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 0\n",
                "resources[0].replicas",
                "1 to 1024",
            ),
            (
                "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n",
                "resources[0]",
                "replicas",
            ),
            (
                "sharing:\n  timeSlicing:\n    resources:\n    - name: example.com/gpu\n      replicas: 2\n",
                "resources[0].name",
                "domain",
            ),
            (
                "sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 2\n      devices: [0, 1]\n",
                "resources[0].devices",
                "all",
            ),
            (
                "sharing:\n  timeSlicing:\n    resources: []\n",
                "sharing.timeSlicing.resources",
                "no resources",
            ),
            (
                "sharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: 2\n",
                "sharing.mps",
                "set flags.plugin.mpsPipeDir",
            ),
            ("version: v2\n", "version", "v1"),
            ("health:\n  criticalXIDs: some\n", "health.criticalXIDs", "all"),
            ("health:\n  ignoredXIDs: [79]\n  criticalXIDs: [79]\n", "health.criticalXIDs", "79"),
            ("health:\n  recoveryPeriod: soon\n", "health.recoveryPeriod", "duration"),
            ("flags:\n  gdsEnabled: true\n", "flags.gdsEnabled", "not supported"),
            (
                "flags:\n  plugin:\n    cdiAnnotationPrefix: cdi.k8s.io\n",
                "flags.plugin.cdiAnnotationPrefix",
                "e.g. cdi.k8s.io/",
            ),
            (
                "flags:\n  plugin:\n    cdiAnnotationPrefix: cdi_k8s.io/\n",
                "flags.plugin.cdiAnnotationPrefix",
                "not a DNS subdomain",
            ),
            ("flags:\n  plugin:\n    metricsAddress: everywhere\n", "metricsAddress", "host:port"),
            ("flags: [\n", "flags", "a mapping"),
            // The scanner fails before the key is handed over: the path stops at its parent.
            ("version: v1\nflags:\n  migStrategy: 'unterminated\n", "flags", "line 3"),
        ];
        for (text, field, needle) in cases {
            let e = resolve_text(text, &Overrides::default()).expect_err(text).to_string();
            assert!(e.starts_with("/etc/cfg.yaml: field `"), "{e}");
            assert!(e.contains(field), "`{e}` should name `{field}`");
            assert!(e.contains(needle), "`{e}` should say `{needle}`");
        }
    }

    const MPS: &str = "version: v1\nflags:\n  plugin:\n    mpsPipeDir: /run/nvidia/mps\nsharing:\n  mps:\n";

    #[test]
    fn nvidia_mps_config_is_understood_with_the_node_s_pipe_dir() {
        let text = format!(
            "{MPS}    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 10\n"
        );
        let s = resolve_text(&text, &Overrides::default()).unwrap().settings;
        assert_eq!(s.mps_pipe_dir, Some(PathBuf::from("/run/nvidia/mps")));
        assert_eq!(s.time_slicing, None);
        let mps = s.mps.unwrap();
        assert!(mps.fail_requests_greater_than_one, "NVIDIA's MPS default: one replica per container");
        assert_eq!(mps.resources[0].advertised_as.as_str(), "nvidia.com/gpu.shared");
        assert_eq!(mps.resources[0].replicas, 10);

        // Explicitly relaxed; not renamed; the pipe dir from the flag or environment instead.
        let text = "sharing:\n  mps:\n    failRequestsGreaterThanOne: false\n    resources:\n    - name: gpu\n      replicas: 48\n";
        let over = Overrides { mps_pipe_dir: Some("/run/mps".into()), ..Default::default() };
        let s = resolve_text(text, &over).unwrap().settings;
        let mps = s.mps.unwrap();
        assert!(!mps.fail_requests_greater_than_one);
        assert_eq!(mps.resources[0].advertised_as.as_str(), "nvidia.com/gpu");
        assert_eq!(s.mps_pipe_dir, Some(PathBuf::from("/run/mps")));
        // The flag beats the file.
        let text = format!("{MPS}    resources:\n    - name: gpu\n      replicas: 2\n");
        assert_eq!(
            resolve_text(&text, &over).unwrap().settings.mps_pipe_dir,
            Some(PathBuf::from("/run/mps"))
        );

        // Time-slicing's default stays: more than one replica per container is allowed.
        let text = "sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 2\n";
        let s = resolve_text(text, &Overrides::default()).unwrap().settings;
        assert!(!s.time_slicing.unwrap().fail_requests_greater_than_one);
        assert_eq!(s.mps, None);
        // `mps: null` (a Helm default) is no MPS, and needs no pipe dir.
        let s = resolve_text("sharing:\n  mps: null\n", &Overrides::default()).unwrap().settings;
        assert_eq!((s.mps, s.mps_pipe_dir), (None, None));
        // NVIDIA's mpsRoot (its own daemons' root) is accepted and reported as not acted on.
        let r = resolve_text("flags:\n  mpsRoot: /run/nvidia/mps\n", &Overrides::default()).unwrap();
        assert_eq!(r.ignored, ["flags.mpsRoot"]);
    }

    #[test]
    fn mps_refusals_name_the_key_and_the_fix() {
        let one = "    resources:\n    - name: gpu\n      replicas: 2\n";
        let cases: Vec<(String, Overrides, &str, &[&str])> = vec![
            (
                format!("sharing:\n  mps:\n{one}"),
                Overrides::default(),
                "sharing.mps",
                &[
                    "MPS sharing needs this node's MPS control daemon",
                    "flags.plugin.mpsPipeDir",
                    "NVINJECT_MPS_PIPE_DIR",
                    "nvinject-cdi --mps-pipe-dir",
                ],
            ),
            (
                format!("sharing:\n  mps:\n{one}"),
                Overrides { mps_pipe_dir: Some("".into()), ..Default::default() },
                "sharing.mps",
                &["flags.plugin.mpsPipeDir"],
            ),
            (
                format!("{MPS}{one}  timeSlicing:\n{one}"),
                Overrides::default(),
                "sharing.mps",
                &["both set", "remove one"],
            ),
            (
                format!("{MPS}{one}"),
                Overrides { mig_strategy: Some(MigStrategy::Mixed), ..Default::default() },
                "sharing.mps",
                &["migStrategy mixed", "migStrategy none"],
            ),
            (
                format!("{MPS}    resources:\n    - name: mig-1g.10gb\n      replicas: 2\n"),
                Overrides::default(),
                "sharing.mps.resources[0].name",
                &["MIG resource", "share nvidia.com/gpu"],
            ),
            (
                format!("{MPS}    resources:\n    - name: gpu\n      replicas: 49\n"),
                Overrides::default(),
                "sharing.mps.resources[0].replicas",
                &["from 1 to 48", "at most 48 clients"],
            ),
            (
                format!("{MPS}    resources: []\n"),
                Overrides::default(),
                "sharing.mps.resources",
                &["remove mps"],
            ),
            (
                format!("sharing:\n  mps:\n{one}"),
                Overrides { mps_pipe_dir: Some("run/mps".into()), ..Default::default() },
                "flags.plugin.mpsPipeDir",
                &["not an absolute path"],
            ),
        ];
        for (text, over, field, needles) in cases {
            let e = resolve_text(&text, &over).expect_err(&text).to_string();
            assert!(e.starts_with(&format!("/etc/cfg.yaml: field `{field}`: ")), "{e}\n{text}");
            for n in needles {
                assert!(e.contains(n), "`{e}` should say `{n}`");
            }
        }
    }

    #[test]
    fn nvidia_keys_we_do_not_act_on_are_reported_not_refused() {
        let text = "flags:\n  gfd:\n    oneshot: true\n  plugin:\n    nvidiaCTKPath: /usr/bin/nvidia-ctk\nresources:\n  gpus: []\n";
        let r = resolve_text(text, &Overrides::default()).unwrap();
        assert_eq!(r.ignored, vec!["resources", "flags.gfd", "flags.plugin.nvidiaCTKPath"]);
    }

    #[test]
    fn health_settings_and_nvidia_environment_variable() {
        let text = "health:\n  ignoredXIDs: [13]\n  recoveryPeriod: 1m30s\n";
        let s = resolve_text(text, &Overrides::default()).unwrap().settings;
        assert!(s.health.is_critical(31), "the file's list replaces the defaults");
        assert!(!s.health.is_critical(13));
        assert_eq!(s.health.recovery_period, Some(GoDuration(Duration::from_secs(90))));

        let over = Overrides { disable_healthchecks: Some("48, 79".into()), ..Default::default() };
        let s = resolve_text("", &over).unwrap().settings;
        assert!(!s.health.is_critical(79));
        assert!(!s.health.is_critical(13), "defaults kept");
        let over = Overrides { disable_healthchecks: Some("xids".into()), ..Default::default() };
        assert!(resolve_text("", &over).unwrap().settings.health.disabled);
        let over = Overrides { disable_healthchecks: Some("79,lots".into()), ..Default::default() };
        let e = resolve_text("", &over).unwrap_err().to_string();
        assert!(e.contains("DP_DISABLE_HEALTHCHECKS") && e.contains("lots"), "{e}");

        let s = resolve_text("health:\n  recoveryPeriod: \"0\"\n", &Overrides::default()).unwrap().settings;
        assert_eq!(s.health.recovery_period, None, "0 means never recover");
        let s = resolve_text("health:\n  criticalXIDs: [48, 79]\n", &Overrides::default()).unwrap().settings;
        assert!(s.health.is_critical(48) && !s.health.is_critical(74));
    }

    #[test]
    fn metrics_address_defaults_to_loopback() {
        assert_eq!(parse_metrics_address("9402").unwrap().to_string(), "127.0.0.1:9402");
        assert_eq!(parse_metrics_address(":9402").unwrap().to_string(), "127.0.0.1:9402");
        assert_eq!(parse_metrics_address("0.0.0.0:80").unwrap().to_string(), "0.0.0.0:80");
        assert!(parse_metrics_address("localhost").is_err());
    }
}
