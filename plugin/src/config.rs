//! Configuration: NVIDIA's device plugin config file (version `v1`), then environment, then flags.
//!
//! An operator's existing `config.yaml` for NVIDIA's plugin keeps working: the same keys
//! (`flags.migStrategy`, `flags.plugin.deviceListStrategy`, `sharing.timeSlicing.resources[]`, ...)
//! mean the same things. Keys NVIDIA's plugin has but nvinject does not act on are accepted and
//! reported once ([`ResolvedConfig::ignored`]); keys nobody knows are refused with their path, as
//! are values that would change behaviour we cannot deliver (MPS, GDS).
//!
//! Precedence is flag > environment > file > default. The binary turns flags and environment
//! into one [`Overrides`] value (clap gives a flag priority over its environment variable), and
//! [`resolve`] lays it over the file. Everything here is a pure function of its inputs.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use nvinject_cdi::yaml::{YamlLimits, from_yaml};
use serde::{Deserialize, Serialize};

/// The only config file version there is.
pub const CONFIG_VERSION: &str = "v1";

/// Why a configuration was refused. Every variant says where (file or source, field) and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: cannot read config file: {source}")]
    Read {
        /// The config file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A field is missing, has the wrong type, is unknown, or has a value that is not allowed.
    #[error("{origin}: field `{field}`: {message}")]
    Field {
        /// Where the value came from: the config file path, or the flag/environment variable.
        origin: String,
        /// Path of the field, e.g. `sharing.timeSlicing.resources[0].replicas`.
        field: String,
        /// What is wrong and how to fix it.
        message: String,
    },
}

impl ConfigError {
    fn field(origin: impl Into<String>, field: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Field { origin: origin.into(), field: field.into(), message: message.into() }
    }
}

/// How MIG devices are advertised (NVIDIA's `--mig-strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MigStrategy {
    /// Every GPU is `nvidia.com/gpu`, MIG mode or not; MIG devices are not advertised.
    #[default]
    None,
    /// Every GPU has MIG enabled with one profile; the MIG devices are `nvidia.com/gpu`.
    Single,
    /// Whole GPUs are `nvidia.com/gpu`; MIG devices are `nvidia.com/mig-<profile>`.
    Mixed,
}

/// How Allocate tells the runtime which devices a container gets (NVIDIA's `--device-list-strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceListStrategy {
    /// `NVIDIA_VISIBLE_DEVICES=<ids>`.
    Envvar,
    /// `/dev/null` mounted at `/var/run/nvidia-container-devices/<id>` per device.
    VolumeMounts,
    /// A `cdi.k8s.io/...` annotation naming the CDI devices (read by the shim or containerd).
    CdiAnnotations,
    /// The CRI `CDIDevices` field (containerd 1.7+ with CDI enabled injects them).
    CdiCri,
}

impl FromStr for DeviceListStrategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.trim() {
            "envvar" => DeviceListStrategy::Envvar,
            "volume-mounts" => DeviceListStrategy::VolumeMounts,
            "cdi-annotations" => DeviceListStrategy::CdiAnnotations,
            "cdi-cri" => DeviceListStrategy::CdiCri,
            other => {
                return Err(format!(
                    "unknown device list strategy `{other}`: expected envvar, volume-mounts, cdi-annotations \
                     or cdi-cri"
                ));
            }
        })
    }
}

/// Which identifier `envvar` and `volume-mounts` pass to the runtime (NVIDIA's `--device-id-strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceIdStrategy {
    /// `GPU-...` / `MIG-...`.
    #[default]
    Uuid,
    /// `0`, `0:1`.
    Index,
}

/// How GetPreferredAllocation picks among replicas of time-sliced GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplicaPolicy {
    /// Spread over the GPUs with the fewest replicas in use (NVIDIA's behaviour).
    #[default]
    Distributed,
    /// Fill the GPUs already in use first, keeping other GPUs free.
    Packed,
}

/// A Go-style duration (`30s`, `5m`, `1h30m`, `0`), the form NVIDIA's config uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct GoDuration(pub Duration);

impl FromStr for GoDuration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}` is not a duration: write e.g. 30s, 5m or 1h30m");
        let s = s.trim();
        if s == "0" {
            return Ok(GoDuration(Duration::ZERO));
        }
        let mut rest = s;
        let mut total = Duration::ZERO;
        if rest.is_empty() {
            return Err(bad());
        }
        while !rest.is_empty() {
            let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
            if digits == 0 {
                return Err(bad());
            }
            let number: f64 = rest[..digits].parse().map_err(|_| bad())?;
            rest = &rest[digits..];
            let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
            let nanos_per_unit: f64 = match &rest[..unit_len] {
                "ns" => 1.0,
                "us" | "µs" => 1e3,
                "ms" => 1e6,
                "s" => 1e9,
                "m" => 60e9,
                "h" => 3600e9,
                _ => return Err(bad()),
            };
            rest = &rest[unit_len..];
            total += Duration::from_nanos((number * nanos_per_unit).round() as u64);
        }
        Ok(GoDuration(total))
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.subsec_nanos() == 0 {
            let s = d.as_secs();
            if s == 0 {
                return f.write_str("0s");
            }
            let (h, m, s) = (s / 3600, (s % 3600) / 60, s % 60);
            if h > 0 {
                write!(f, "{h}h")?;
            }
            if m > 0 {
                write!(f, "{m}m")?;
            }
            if s > 0 {
                write!(f, "{s}s")?;
            }
            Ok(())
        } else {
            write!(f, "{}ms", d.as_millis())
        }
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for GoDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A string or a list of strings (NVIDIA accepts both for `deviceListStrategy`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// `deviceListStrategy: envvar`
    One(String),
    /// `deviceListStrategy: [envvar, cdi-annotations]`
    Many(Vec<String>),
}

/// `criticalXIDs`: `all`, or the only XIDs that mark a GPU unhealthy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CriticalXidsFile {
    /// The word `all`.
    Word(String),
    /// An explicit list.
    List(Vec<u64>),
}

/// The config file as written; every key optional. Field names are NVIDIA's.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConfigFile {
    /// Must be `v1` when present.
    pub version: Option<String>,
    /// Settings that also exist as flags.
    #[serde(default)]
    pub flags: FileFlags,
    /// NVIDIA's resource renaming patterns; NVIDIA ignores them too.
    pub resources: Option<serde_json::Value>,
    /// Time-slicing (and MPS, which is refused).
    #[serde(default)]
    pub sharing: FileSharing,
    /// XID health checking.
    #[serde(default)]
    pub health: FileHealth,
    /// IMEX channels: accepted and ignored.
    pub imex: Option<serde_json::Value>,
}

/// `flags:`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileFlags {
    /// `none`, `single` or `mixed`.
    pub mig_strategy: Option<MigStrategy>,
    /// Exit when NVML or the resource plan fails at start (else wait, serving nothing).
    pub fail_on_init_error: Option<bool>,
    /// Where the driver is installed (`/` or e.g. `/run/nvidia/driver`); NVML is looked up there.
    pub nvidia_driver_root: Option<PathBuf>,
    /// Host root of the device nodes handed out in DeviceSpecs; defaults to the driver root.
    pub nvidia_dev_root: Option<PathBuf>,
    /// GPUDirect Storage: only `false` is accepted.
    pub gds_enabled: Option<bool>,
    /// MOFED: only `false` is accepted.
    pub mofed_enabled: Option<bool>,
    /// Accepted and ignored (NVIDIA: restart the plugin on an unhealthy device).
    pub restart_on_device_unhealthy: Option<serde_json::Value>,
    /// Accepted and ignored (NVIDIA: device discovery strategy, always NVML here).
    pub device_discovery_strategy: Option<serde_json::Value>,
    /// Accepted and ignored (GPU feature discovery settings; labels come from `featuresFile`).
    pub gfd: Option<serde_json::Value>,
    /// Plugin settings.
    #[serde(default)]
    pub plugin: FilePluginFlags,
}

/// `flags.plugin:`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FilePluginFlags {
    /// Also answer Allocate with DeviceSpecs (device nodes for the kubelet to add).
    pub pass_device_specs: Option<bool>,
    /// One strategy or a list.
    pub device_list_strategy: Option<OneOrMany>,
    /// `uuid` or `index`.
    #[serde(rename = "deviceIDStrategy")]
    pub device_id_strategy: Option<DeviceIdStrategy>,
    /// Annotation key prefix for `cdi-annotations`, `cdi.k8s.io/` by default.
    pub cdi_annotation_prefix: Option<String>,
    /// Accepted and ignored: nvinject's CDI spec comes from `nvinject-cdi`.
    #[serde(rename = "nvidiaCTKPath")]
    pub nvidia_ctk_path: Option<serde_json::Value>,
    /// Accepted and ignored.
    #[serde(rename = "nvidiaCDIHookPath")]
    pub nvidia_cdi_hook_path: Option<serde_json::Value>,
    /// Accepted and ignored.
    pub container_driver_root: Option<serde_json::Value>,
    /// nvinject: the kubelet's registration socket; plugin sockets are created next to it.
    pub kubelet_socket: Option<PathBuf>,
    /// nvinject: path of `libnvidia-ml.so.1` (default: found under the driver root).
    pub nvml_library: Option<PathBuf>,
    /// nvinject: proc root for `driver/nvidia-caps/mig-minors` (MIG DeviceSpecs).
    pub proc_root: Option<PathBuf>,
    /// nvinject: CDI kind of the names handed out (`nvidia.com/gpu`).
    pub cdi_kind: Option<String>,
    /// nvinject: NFD features file for node labels; empty string disables.
    pub features_file: Option<String>,
    /// nvinject: `host:port` (or a bare port, bound to 127.0.0.1) for `/metrics`; empty disables.
    pub metrics_address: Option<String>,
}

/// `sharing:`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileSharing {
    /// Time-slicing replicas.
    pub time_slicing: Option<FileTimeSlicing>,
    /// MPS: refused when it asks for replicas.
    pub mps: Option<serde_json::Value>,
}

/// `sharing.timeSlicing:`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileTimeSlicing {
    /// Advertise `<name>.shared` unless a resource says `rename`.
    #[serde(default)]
    pub rename_by_default: bool,
    /// Refuse a container asking for more than one replica.
    #[serde(default)]
    pub fail_requests_greater_than_one: bool,
    /// nvinject: `distributed` (default) or `packed`, for GetPreferredAllocation.
    pub strategy: Option<String>,
    /// The resources to replicate.
    #[serde(default)]
    pub resources: Vec<FileReplicaResource>,
}

/// One entry of `sharing.timeSlicing.resources`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileReplicaResource {
    /// Resource to replicate: `nvidia.com/gpu` or `nvidia.com/mig-<profile>` (prefix optional).
    pub name: String,
    /// Advertise the replicas under this name instead.
    pub rename: Option<String>,
    /// Replicas per device, at least 1.
    pub replicas: i64,
    /// Which devices: only `all` is supported (as in NVIDIA's plugin today).
    pub devices: Option<serde_json::Value>,
}

/// `health:`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileHealth {
    /// Turn XID health checking off.
    pub disabled: Option<bool>,
    /// NVML event types to watch; only `EventTypeXidCriticalError` has an effect.
    pub event_types: Option<Vec<String>>,
    /// XIDs that never mark a GPU unhealthy; replaces the default list.
    #[serde(rename = "ignoredXIDs")]
    pub ignored_xids: Option<Vec<u64>>,
    /// `all` (default) or the only XIDs that mark a GPU unhealthy.
    #[serde(rename = "criticalXIDs")]
    pub critical_xids: Option<CriticalXidsFile>,
    /// nvinject: quiet time after the last critical XID before the GPU is Healthy again; `0` never.
    pub recovery_period: Option<GoDuration>,
}

/// XIDs that report an application's fault, not the GPU's, after NVIDIA's XID catalog. A GPU
/// stays Healthy when only these occur.
pub const DEFAULT_IGNORED_XIDS: &[u64] = &[
    13,  // Graphics engine exception: a bad kernel (out-of-range access, illegal instruction).
    31,  // GPU memory page fault: an application touched memory it does not own.
    43,  // GPU stopped processing: the faulting context was killed; others continue.
    45,  // Preemptive cleanup after one of the above or a killed process.
    68,  // Video processor (NVDEC/NVENC) exception caused by the stream fed to it.
    94,  // Contained ECC error: the row was isolated, only the application touching it failed.
    109, // Context switch timeout: an application hogged the engine.
];

/// The default quiet period before a GPU that reported a critical XID is Healthy again.
pub const DEFAULT_RECOVERY_PERIOD: Duration = Duration::from_secs(300);

/// Which XIDs count, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthPolicy {
    /// No health checking at all.
    pub disabled: bool,
    /// Never critical.
    pub ignored_xids: BTreeSet<u64>,
    /// `None` = every XID not ignored is critical; else only these.
    pub critical_xids: Option<BTreeSet<u64>>,
    /// Quiet time before recovery; `None` = a GPU stays Unhealthy until the plugin restarts.
    pub recovery_period: Option<GoDuration>,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        HealthPolicy {
            disabled: false,
            ignored_xids: DEFAULT_IGNORED_XIDS.iter().copied().collect(),
            critical_xids: None,
            recovery_period: Some(GoDuration(DEFAULT_RECOVERY_PERIOD)),
        }
    }
}

impl HealthPolicy {
    /// True when `xid` marks a GPU unhealthy. An unknown XID (NVML's 999) is critical.
    pub fn is_critical(&self, xid: u64) -> bool {
        if self.disabled || self.ignored_xids.contains(&xid) {
            return false;
        }
        match &self.critical_xids {
            None => true,
            Some(set) => set.contains(&xid),
        }
    }
}

/// An extended resource name: `nvidia.com/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct ResourceName(String);

/// The domain every resource name lives in.
pub const RESOURCE_DOMAIN: &str = "nvidia.com";

impl ResourceName {
    /// Accepts `gpu` or `nvidia.com/gpu`; the part after the domain must be a DNS label-like name
    /// (letters, digits, `-`, `_`, `.`, starting and ending alphanumeric, at most 63 characters).
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let short = match s.split_once('/') {
            Some((domain, short)) if domain == RESOURCE_DOMAIN => short,
            Some((domain, _)) => {
                return Err(format!("resource `{s}` is outside the `{RESOURCE_DOMAIN}` domain (`{domain}`)"));
            }
            None => s,
        };
        let ok_chars = short.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        let ok_ends = short.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && short.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
        if short.is_empty() || short.len() > 63 || !ok_chars || !ok_ends {
            return Err(format!(
                "resource name `{s}` is not valid: use letters, digits, '-', '_' or '.', starting and ending \
                 with a letter or digit, at most 63 characters"
            ));
        }
        Ok(ResourceName(format!("{RESOURCE_DOMAIN}/{short}")))
    }

    /// The full name, `nvidia.com/gpu`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The part after `nvidia.com/`: names the plugin's socket.
    pub fn short(&self) -> &str {
        &self.0[RESOURCE_DOMAIN.len() + 1..]
    }

    /// `<name>.shared`, the name replicas get under `renameByDefault`.
    pub fn shared(&self) -> ResourceName {
        ResourceName(format!("{}.shared", self.0))
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One resolved time-slicing entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplicatedResource {
    /// The resource whose devices are replicated.
    pub name: ResourceName,
    /// The name the replicas are advertised under.
    pub advertised_as: ResourceName,
    /// Replicas per device.
    pub replicas: u32,
}

/// Time-slicing, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimeSlicing {
    /// Refuse a container asking for more than one replica.
    pub fail_requests_greater_than_one: bool,
    /// How preferred allocation picks replicas.
    pub policy: ReplicaPolicy,
    /// What is replicated.
    pub resources: Vec<ReplicatedResource>,
}

/// Everything the plugin runs with: defaults, then the file, then environment and flags.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// MIG strategy.
    pub mig_strategy: MigStrategy,
    /// Exit on a start-up failure instead of waiting.
    pub fail_on_init_error: bool,
    /// Driver root (where NVML is looked up when no library path is given).
    pub driver_root: PathBuf,
    /// Host root of device nodes for DeviceSpecs.
    pub dev_root: PathBuf,
    /// Proc root (`/proc`), read for MIG capability minors.
    pub proc_root: PathBuf,
    /// Answer Allocate with DeviceSpecs too.
    pub pass_device_specs: bool,
    /// One or more strategies, in the order given, without repeats.
    pub device_list_strategies: Vec<DeviceListStrategy>,
    /// Identifier passed by `envvar` and `volume-mounts`.
    pub device_id_strategy: DeviceIdStrategy,
    /// Key prefix of the CDI annotation.
    pub cdi_annotation_prefix: String,
    /// CDI kind of the device names.
    pub cdi_kind: String,
    /// The kubelet's registration socket; plugin sockets go in the same directory.
    pub kubelet_socket: PathBuf,
    /// NVML library to load; `None` = the dynamic linker's choice.
    pub nvml_library: Option<PathBuf>,
    /// NFD features file; `None` = no labels written.
    pub features_file: Option<PathBuf>,
    /// Address of `/metrics`; `None` = no metrics endpoint.
    pub metrics_address: Option<SocketAddr>,
    /// Time-slicing, when configured.
    pub time_slicing: Option<TimeSlicing>,
    /// Health checking.
    pub health: HealthPolicy,
}

impl Settings {
    /// The directory the kubelet expects plugin sockets in.
    pub fn plugin_dir(&self) -> &Path {
        self.kubelet_socket.parent().unwrap_or(Path::new("/"))
    }
}

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
    pub cdi_kind: Option<String>,
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
}

/// Settings resolved, plus the keys that were accepted but have no effect (to log once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedConfig {
    /// What the plugin runs with.
    pub settings: Settings,
    /// Paths of accepted-but-ignored keys, e.g. `flags.gfd`.
    pub ignored: Vec<String>,
}

/// The largest config file read; NVIDIA-style configs are a few KB.
pub const MAX_CONFIG_BYTES: usize = 1024 * 1024;
/// The deepest nesting (sequences and mappings, flow or block) a config may use.
pub const MAX_CONFIG_NESTING: usize = 64;
/// YAML aliases (and anchors) a config may use; more is how an alias bomb multiplies a small file.
pub const MAX_CONFIG_ALIASES: usize = 64;
/// YAML nodes in a config, aliases replayed: a few KB of config has a few hundred.
pub const MAX_CONFIG_NODES: usize = MAX_CONFIG_BYTES / 8;

/// The limits a config is read under. `resources`, `imex` and `flags.gfd` take any YAML, so for
/// those the parser's budget, not the types, bounds what hostile text costs.
const YAML_LIMITS: YamlLimits = YamlLimits {
    bytes: MAX_CONFIG_BYTES,
    nesting: MAX_CONFIG_NESTING,
    aliases: MAX_CONFIG_ALIASES,
    nodes: MAX_CONFIG_NODES,
    what: "a device-plugin config",
};

/// Parses a config file's text (YAML or JSON). `origin` names the file in errors. Text over
/// [`MAX_CONFIG_BYTES`] is refused unparsed; over [`MAX_CONFIG_NESTING`], [`MAX_CONFIG_ALIASES`]
/// or [`MAX_CONFIG_NODES`] where the parser meets the breach.
pub fn parse_file(text: &str, origin: &Path) -> Result<ConfigFile, ConfigError> {
    let src = origin.display().to_string();
    if text.trim().is_empty() {
        return Ok(ConfigFile::default());
    }
    if text.len() > MAX_CONFIG_BYTES {
        return Err(ConfigError::field(
            src,
            "(document)",
            format!("{} bytes, over the {MAX_CONFIG_BYTES}-byte limit for a config file", text.len()),
        ));
    }
    let file: ConfigFile = from_yaml(text.as_bytes(), &YAML_LIMITS).map_err(|e| {
        let message = match e.line {
            Some(line) => format!("{} at line {line}", e.message),
            None => e.message,
        };
        let field = if e.field.is_empty() { "(document)".to_owned() } else { e.field };
        ConfigError::field(src.clone(), field, message)
    })?;
    if let Some(v) = &file.version
        && v != CONFIG_VERSION
    {
        return Err(ConfigError::field(
            src,
            "version",
            format!("unknown config version `{v}`: the only version is `{CONFIG_VERSION}`"),
        ));
    }
    Ok(file)
}

/// Reads and parses a config file.
pub fn load_file(path: &Path) -> Result<ConfigFile, ConfigError> {
    use std::io::Read as _;
    let read_err = |source| ConfigError::Read { path: path.to_path_buf(), source };
    // Bounded, so a huge file (or a symlink to /dev/zero) costs one capped read.
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(read_err)?
        .take(MAX_CONFIG_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(read_err)?;
    parse_file(&text, path)
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
        (plugin.nvidia_ctk_path.is_some(), "flags.plugin.nvidiaCTKPath"),
        (plugin.nvidia_cdi_hook_path.is_some(), "flags.plugin.nvidiaCDIHookPath"),
        (plugin.container_driver_root.is_some(), "flags.plugin.containerDriverRoot"),
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
    if let Some(mps) = &file.sharing.mps
        && !mps.is_null()
    {
        return Err(err(
            "sharing.mps",
            "MPS sharing is not supported by nvinject: use sharing.timeSlicing instead".into(),
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
        .unwrap_or_else(|| "cdi.k8s.io/".to_owned());
    if !cdi_annotation_prefix.ends_with('/') || cdi_annotation_prefix.len() < 2 {
        return Err(err(
            "flags.plugin.cdiAnnotationPrefix",
            format!("`{cdi_annotation_prefix}` must be a domain followed by '/', e.g. cdi.k8s.io/"),
        ));
    }
    let cdi_kind = pick(&overrides.cdi_kind, &plugin.cdi_kind)
        .unwrap_or_else(|| nvinject_gpu::naming::DEFAULT_KIND.to_owned());
    if !valid_cdi_kind(&cdi_kind) {
        return Err(err(
            "flags.plugin.cdiKind",
            format!("`{cdi_kind}` is not a CDI kind: write vendor/class, e.g. nvidia.com/gpu"),
        ));
    }

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
        Some(ts) => resolve_time_slicing(ts, origin)?,
    };

    let health = resolve_health(&file.health, overrides, origin)?;

    let settings = Settings {
        mig_strategy: overrides.mig_strategy.or(flags.mig_strategy).unwrap_or_default(),
        fail_on_init_error: overrides.fail_on_init_error.or(flags.fail_on_init_error).unwrap_or(true),
        nvml_library: pick(&overrides.nvml_library, &plugin.nvml_library),
        proc_root: pick(&overrides.proc_root, &plugin.proc_root)
            .unwrap_or_else(|| defaults.proc_root.clone()),
        pass_device_specs: overrides.pass_device_specs.or(plugin.pass_device_specs).unwrap_or(false),
        device_id_strategy: overrides.device_id_strategy.or(plugin.device_id_strategy).unwrap_or_default(),
        driver_root,
        dev_root,
        device_list_strategies,
        cdi_annotation_prefix,
        cdi_kind,
        kubelet_socket,
        features_file,
        metrics_address,
        time_slicing,
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

fn valid_cdi_kind(kind: &str) -> bool {
    let Some((vendor, class)) = kind.split_once('/') else { return false };
    let label = |s: &str, extra: &[u8]| {
        !s.is_empty()
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
            && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
    };
    label(vendor, b"-.") && label(class, b"-_.")
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

fn resolve_time_slicing(ts: &FileTimeSlicing, origin: &str) -> Result<Option<TimeSlicing>, ConfigError> {
    let err = |field: String, msg: String| ConfigError::field(origin, field, msg);
    let policy = match ts.strategy.as_deref().map(str::trim) {
        None | Some("") | Some("distributed") => ReplicaPolicy::Distributed,
        Some("packed") => ReplicaPolicy::Packed,
        Some(other) => {
            return Err(err(
                "sharing.timeSlicing.strategy".into(),
                format!("unknown strategy `{other}`: expected distributed or packed"),
            ));
        }
    };
    if ts.resources.is_empty() {
        return Err(err(
            "sharing.timeSlicing.resources".into(),
            "no resources listed: add e.g. `- name: nvidia.com/gpu` with `replicas: 4`, or remove timeSlicing"
                .into(),
        ));
    }
    let mut resources: Vec<ReplicatedResource> = Vec::new();
    for (i, r) in ts.resources.iter().enumerate() {
        let at = |f: &str| format!("sharing.timeSlicing.resources[{i}].{f}");
        let name = ResourceName::parse(&r.name).map_err(|m| err(at("name"), m))?;
        if r.replicas < 1 || r.replicas > 1024 {
            return Err(err(
                at("replicas"),
                format!("{} replicas: give a number from 1 to 1024", r.replicas),
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
    Ok(Some(TimeSlicing {
        fail_requests_greater_than_one: ts.fail_requests_greater_than_one,
        policy,
        resources,
    }))
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
    fn hostile_config_text_is_refused_by_the_parser_limits_with_the_file() {
        // `resources`, `imex` and `flags.gfd` take any YAML, so only the parser's budget stops these.
        let deep = format!("version: v1\nresources: {}\n", "[".repeat(100_000));
        let deep_map = format!("imex: {}\n", "{a: ".repeat(100_000));
        let block: String = "resources:\n".to_owned()
            + &(0..80).map(|i| format!("{}k{i}:\n", " ".repeat(2 * (i + 1)))).collect::<String>();
        let dashes = format!("flags:\n  gfd:\n    {}x\n", "- ".repeat(100_000));
        let bomb = "resources:\n  a: &a [x,x,x,x,x,x,x,x,x]\n".to_owned()
            + &(b'b'..=b'z')
                .map(|c| {
                    format!(
                        "  {}: &{} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n",
                        c as char,
                        c as char,
                        p = (c - 1) as char
                    )
                })
                .collect::<String>();
        // 60 aliases (under the alias cap) of a 64 KB string: 3.8 MB of text from 65 KB.
        let scalar_bomb =
            format!("resources:\n  a: &s \"{}\"\n  b: [{}]\n", "A".repeat(65_536), "*s, ".repeat(60));
        let flood = format!("resources: [{}a]\n", "a,".repeat(MAX_CONFIG_NODES + 10));
        let two_docs = "version: v1\n---\nversion: v1\n";
        let huge = "#".repeat(MAX_CONFIG_BYTES + 1);
        for (text, field, needle) in [
            (deep.as_str(), "resources", "nesting deeper than 64"),
            (deep_map.as_str(), "imex", "nesting deeper than 64"),
            (block.as_str(), "resources", "nesting deeper than 64"),
            (dashes.as_str(), "flags.gfd", "nesting deeper than 64"),
            (bomb.as_str(), "resources", "YAML aliases"),
            (scalar_bomb.as_str(), "resources", "byte limit once aliases are expanded"),
            (flood.as_str(), "resources", "YAML nodes"),
            (two_docs, "(document)", "one YAML document"),
            (huge.as_str(), "(document)", "byte limit"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("/etc/cfg.yaml: field `{field}")) && e.contains(needle),
                "{e}\n{}",
                &text[..text.len().min(200)]
            );
        }
        // Quoted brackets are not nesting; a few aliases are fine.
        parse("version: v1\nflags:\n  migStrategy: \"none\"\n# [[[[[\nresources: [&a \"[[\", *a]\n").unwrap();
    }

    #[test]
    fn an_empty_key_is_named_as_such() {
        for text in ["? \n", "?\n", "version: v1\n? \n", "flags:\n  ? \n", "\"\": 1\n"] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains("an empty key"), "{text:?}: {e}");
            assert!(!e.contains("``"), "{text:?}: {e}");
        }
        let e = parse("? \n").unwrap_err().to_string();
        assert!(e.starts_with("/etc/cfg.yaml: field `(document)`: an empty key at top level"), "{e}");
        let e = parse("flags:\n  ? \n").unwrap_err().to_string();
        assert!(e.starts_with("/etc/cfg.yaml: field `flags`: an empty key in `flags`"), "{e}");
    }

    #[test]
    fn defaults_without_a_file() {
        let r = resolve(&ConfigFile::default(), "(none)", &Overrides::default(), &defaults()).unwrap();
        let s = r.settings;
        assert_eq!(s.mig_strategy, MigStrategy::None);
        assert!(s.fail_on_init_error);
        assert_eq!(s.device_list_strategies, vec![DeviceListStrategy::CdiAnnotations]);
        assert_eq!(s.cdi_annotation_prefix, "cdi.k8s.io/");
        assert_eq!(s.cdi_kind, "nvidia.com/gpu");
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
                "timeSlicing",
            ),
            ("version: v2\n", "version", "v1"),
            ("health:\n  criticalXIDs: some\n", "health.criticalXIDs", "all"),
            ("health:\n  ignoredXIDs: [79]\n  criticalXIDs: [79]\n", "health.criticalXIDs", "79"),
            ("health:\n  recoveryPeriod: soon\n", "health.recoveryPeriod", "duration"),
            ("flags:\n  gdsEnabled: true\n", "flags.gdsEnabled", "not supported"),
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
    fn go_durations() {
        for (s, secs) in
            [("30s", 30.0), ("5m", 300.0), ("1h30m", 5400.0), ("1.5s", 1.5), ("250ms", 0.25), ("0", 0.0)]
        {
            assert_eq!(s.parse::<GoDuration>().unwrap().0.as_secs_f64(), secs, "{s}");
        }
        for s in ["", "5", "m", "5 m", "5d", "-1s"] {
            assert!(s.parse::<GoDuration>().is_err(), "{s}");
        }
        assert_eq!(GoDuration(Duration::from_secs(5400)).to_string(), "1h30m");
        assert_eq!(GoDuration(Duration::from_millis(1500)).to_string(), "1500ms");
    }

    #[test]
    fn metrics_address_defaults_to_loopback() {
        assert_eq!(parse_metrics_address("9402").unwrap().to_string(), "127.0.0.1:9402");
        assert_eq!(parse_metrics_address(":9402").unwrap().to_string(), "127.0.0.1:9402");
        assert_eq!(parse_metrics_address("0.0.0.0:80").unwrap().to_string(), "0.0.0.0:80");
        assert!(parse_metrics_address("localhost").is_err());
    }

    #[test]
    fn resource_names() {
        assert_eq!(ResourceName::parse("gpu").unwrap().as_str(), "nvidia.com/gpu");
        assert_eq!(ResourceName::parse("nvidia.com/mig-1g.10gb").unwrap().short(), "mig-1g.10gb");
        assert!(ResourceName::parse("nvidia.com/").is_err());
        assert!(ResourceName::parse("gpu-").is_err());
        assert!(ResourceName::parse("a/b/c").is_err());
    }
}
