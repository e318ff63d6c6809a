//! The description's data types and [`FieldProblem`], apart from loading and validation: the MIG
//! module checks descriptions against its tables with them, and validation (in `description`)
//! calls that check, so these types sit below both.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A whole simulated node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeDescription {
    /// Short name for logs and `nvidia-smi` headers (the preset name for presets).
    pub name: String,
    /// The (simulated) kernel driver and user-space versions.
    pub driver: DriverDescription,
    /// GPUs in PCI bus order: the position in this list is the NVML index on an unrestricted host.
    pub gpus: Vec<GpuDescription>,
    /// NVLink connections between GPUs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlinks: Vec<NvLinkDescription>,
    /// Root under which the node's device nodes live (`<dev_root>/dev/nvidia0`). Filled in by
    /// `nvinject-simnode build`; when absent, or when it does not exist (inside a container), the
    /// simulated NVML uses `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev_root: Option<PathBuf>,
    /// Append-only file through which tests inject XID events (see the simnvml README).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events_file: Option<PathBuf>,
}

/// Driver and CUDA versions, and whether the kernel module is loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriverDescription {
    /// Driver version as `nvidia-smi` prints it, e.g. `550.54.15`.
    pub version: String,
    /// CUDA driver API version as NVML encodes it: 1000 * major + 10 * minor (12040 = 12.4).
    pub cuda_version: i32,
    /// When false, `nvmlInit` fails with `NVML_ERROR_DRIVER_NOT_LOADED`.
    #[serde(default = "yes")]
    pub loaded: bool,
    /// NVIDIA's separately packaged components installed beside the driver, of the same version
    /// (`["imex"]`); their files are added to the driver root. None by default, as the driver
    /// alone installs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<DriverPackage>,
}

/// A component NVIDIA ships in its own package, not in the driver's `.run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriverPackage {
    /// `nvidia-imex-<branch>`: the IMEX daemon `nvidia-imex` and its control tool
    /// `nvidia-imex-ctl` in `/usr/bin`.
    Imex,
}

fn yes() -> bool {
    true
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuDescription {
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// `GPU-` followed by a lower-case 8-4-4-4-12 UUID.
    pub uuid: String,
    /// PCI bus id in NVML's form: `00000000:18:00.0` (8 hex digit domain).
    pub pci_bus_id: String,
    /// PCI device id in NVML's layout: `device << 16 | vendor` (0x233010DE for H100 SXM).
    pub pci_device_id: u32,
    /// PCI subsystem id in the same layout.
    pub pci_subsystem_id: u32,
    /// Minor number of `/dev/nvidia<minor>`.
    pub minor: u32,
    /// Total framebuffer memory in MiB.
    pub memory_mib: u64,
    /// CUDA compute capability `[major, minor]`.
    pub compute_capability: [i32; 2],
    /// GPU architecture.
    pub architecture: Architecture,
    /// NUMA node of the GPU's PCI root, if the platform has NUMA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// GPUs that share a PCIe switch report `NVML_TOPOLOGY_SINGLE` to each other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_switch: Option<u32>,
    /// Board serial number.
    pub serial: String,
    /// Streaming multiprocessors on the whole GPU.
    pub multiprocessor_count: u32,
    /// Current readings, returned as-is by the sensor queries.
    #[serde(default)]
    pub telemetry: Telemetry,
    /// MIG capability and configuration; absent for GPUs that cannot do MIG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigDescription>,
}

/// Sensor readings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Telemetry {
    /// Core temperature in degrees Celsius.
    pub temperature_c: u32,
    /// Board power draw in milliwatts.
    pub power_mw: u32,
    /// GPU utilisation in percent.
    pub gpu_util_percent: u32,
    /// Memory controller utilisation in percent.
    pub memory_util_percent: u32,
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry { temperature_c: 34, power_mw: 70_000, gpu_util_percent: 0, memory_util_percent: 0 }
    }
}

/// GPU architectures NVML reports (`nvmlDeviceArchitecture_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Kepler (2).
    Kepler,
    /// Maxwell (3).
    Maxwell,
    /// Pascal (4).
    Pascal,
    /// Volta (5).
    Volta,
    /// Turing (6).
    Turing,
    /// Ampere (7).
    Ampere,
    /// Ada Lovelace (8).
    Ada,
    /// Hopper (9).
    Hopper,
    /// Blackwell (10).
    Blackwell,
}

impl Architecture {
    /// The `NVML_DEVICE_ARCH_*` value.
    pub fn nvml_value(self) -> u32 {
        match self {
            Architecture::Kepler => 2,
            Architecture::Maxwell => 3,
            Architecture::Pascal => 4,
            Architecture::Volta => 5,
            Architecture::Turing => 6,
            Architecture::Ampere => 7,
            Architecture::Ada => 8,
            Architecture::Hopper => 9,
            Architecture::Blackwell => 10,
        }
    }
}

/// MIG state of a MIG-capable GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigDescription {
    /// Current MIG mode (pending mode is reported equal to it).
    pub enabled: bool,
    /// GPU instances; must be empty when MIG is disabled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_instances: Vec<GpuInstanceDescription>,
}

/// A MIG GPU instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuInstanceDescription {
    /// GPU instance id as the driver assigns it.
    pub id: u32,
    /// Profile name as `nvidia-smi mig -lgip` prints it, e.g. `3g.40gb`.
    pub profile: String,
    /// First memory slice of the placement.
    pub placement_start: u32,
    /// Compute instances inside this GPU instance; each is one MIG device.
    pub compute_instances: Vec<ComputeInstanceDescription>,
}

/// A MIG compute instance: what NVML and CUDA call a MIG device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComputeInstanceDescription {
    /// Compute instance id within its GPU instance.
    pub id: u32,
    /// Compute profile: the GPU instance's own profile name for a full-size CI, or `Nc.<gi profile>`.
    pub profile: String,
    /// `MIG-` followed by an 8-4-4-4-12 UUID.
    pub uuid: String,
}

/// `links` NVLink links between two GPUs (indices into [`NodeDescription::gpus`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvLinkDescription {
    /// The two GPUs, by position in the description.
    pub gpus: [usize; 2],
    /// Number of links between them.
    pub links: u32,
}

/// A semantic problem found by [`NodeDescription::validate`], before a file name is attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldProblem {
    /// Path of the field, e.g. `gpus[2].minor`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for FieldProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "field `{}`: {}", self.field, self.message)
    }
}
