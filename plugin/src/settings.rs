//! What the plugin runs with: [`Settings`], and the setting values the policy modules
//! (`resources`, `allocate`, `preferred`, `labels`) switch on.
//!
//! These values live here rather than in the modules that use them because [`Settings`] holds
//! them and those modules take [`Settings`]: here they are below both, so no module depends on
//! one that depends on it. Settings are built by [`crate::config`] (file, environment, flags);
//! this module only says what they are. Pure.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use nvinject_cdi::Kind;
use serde::{Deserialize, Serialize};

use crate::health::HealthPolicy;
use crate::resource_name::ResourceName;

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

/// Time-slicing, resolved; also the shape of `sharing.mps` (NVIDIA's config gives both the same
/// `resources[].name/rename/replicas`, `renameByDefault` and `failRequestsGreaterThanOne`).
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
    /// Driver root as the host sees it: where NVML is looked up when no library path is given
    /// (unless `container_driver_root` is set), and the prefix of a regenerated spec's host paths.
    pub driver_root: PathBuf,
    /// Where the driver root is mounted for this process when it runs in a container (NVIDIA's
    /// `CONTAINER_DRIVER_ROOT`); `None`: at `driver_root` itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_driver_root: Option<PathBuf>,
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
    /// Key prefix of the CDI annotation, `<DNS subdomain>/` (checked by the rule the shim's
    /// prefixes follow, `nvinject_cdi::nvinject::check_annotation_prefix`).
    pub cdi_annotation_prefix: String,
    /// CDI kind of the device names.
    pub cdi_kind: Kind,
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
    /// MPS sharing, when configured (never with `time_slicing`): replicas as time-slicing makes
    /// them, and a container given any of them also gets the spec's MPS device (the daemon's pipe
    /// folder), which no other container gets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mps: Option<TimeSlicing>,
    /// The node's MPS pipe directory as the host sees it (the `--mps-pipe-dir` the CDI spec was
    /// generated with): required by `mps`, and passed on when the plugin regenerates the spec.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mps_pipe_dir: Option<PathBuf>,
    /// Health checking.
    pub health: HealthPolicy,
}

impl Settings {
    /// Where this process finds the driver root's files.
    pub fn driver_root_here(&self) -> &Path {
        self.container_driver_root.as_deref().unwrap_or(&self.driver_root)
    }

    /// The directory the kubelet expects plugin sockets in.
    pub fn plugin_dir(&self) -> &Path {
        self.kubelet_socket.parent().unwrap_or(Path::new("/"))
    }
}

/// Parses a CDI kind (`vendor/class`) with CDI's own rules, the ones the shim applies to every
/// name it is handed: the one parser for `cdiKind` in the file, the flag and the environment.
pub fn parse_cdi_kind(s: &str) -> Result<Kind, String> {
    s.parse::<Kind>()
        .map_err(|e| format!("`{s}` is not a CDI kind: write vendor/class, e.g. nvidia.com/gpu ({e})"))
}
