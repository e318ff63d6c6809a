//! The device model: what a node has, as plain owned values.
//!
//! Built once by [`crate::nvml::discover`] (or by hand in tests), then only read. Everything derives
//! `Serialize`/`Deserialize` so an inventory can be printed, cached or used as a test fixture.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Everything discovery learned about a node's GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    /// Driver and CUDA versions.
    pub driver: DriverInfo,
    /// GPUs visible to this process, in NVML index order.
    pub gpus: Vec<Gpu>,
    /// PCIe distance between every pair of GPUs (`a < b`, by index), closest first by [`TopologyLevel`].
    pub topology: Vec<(u32, u32, TopologyLevel)>,
}

impl Inventory {
    /// The GPU with NVML index `index`.
    pub fn gpu(&self, index: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.index == index)
    }

    /// The PCIe topology level between two GPUs (by index); `Internal` for a GPU and itself.
    pub fn topology_level(&self, a: u32, b: u32) -> Option<TopologyLevel> {
        if a == b {
            return Some(TopologyLevel::Internal);
        }
        let (lo, hi) = if a < b { (a, b) } else { (b, a) };
        self.topology.iter().find(|(x, y, _)| *x == lo && *y == hi).map(|(_, _, l)| *l)
    }

    /// Number of active NVLink links from GPU `a` to GPU `b` (by index).
    pub fn nvlinks_between(&self, a: u32, b: u32) -> usize {
        match (self.gpu(a), self.gpu(b)) {
            (Some(ga), Some(gb)) => ga.nvlinks.iter().filter(|l| l.peer == gb.pci_bus_id).count(),
            _ => 0,
        }
    }
}

/// Driver-level versions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverInfo {
    /// Kernel driver version, e.g. `550.54.15`: the suffix of every driver library file name.
    pub version: String,
    /// Highest CUDA version the driver supports.
    pub cuda: CudaVersion,
    /// NVML library version, e.g. `12.550.54.15`.
    pub nvml_version: String,
}

/// A CUDA version as `major.minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CudaVersion {
    /// Major version (12 for 12.4).
    pub major: u32,
    /// Minor version (4 for 12.4).
    pub minor: u32,
}

impl CudaVersion {
    /// Decodes NVML's integer form (`1000 * major + 10 * minor`).
    pub fn from_nvml(v: i32) -> Self {
        let v = v.max(0) as u32;
        CudaVersion { major: v / 1000, minor: (v % 1000) / 10 }
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A device UUID as NVML prints it: `GPU-...` for a GPU, `MIG-...` for a MIG device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DeviceUuid(pub String);

impl DeviceUuid {
    /// The UUID text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DeviceUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A PCI address in the kernel's (sysfs) form: lower case, 4-digit domain, `0000:18:00.0`.
///
/// NVML reports an 8-digit domain (`00000000:18:00.0`); [`PciBusId::parse`] accepts both so ids from
/// NVML, sysfs and `/dev/dri/by-path` compare equal.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PciBusId(String);

impl PciBusId {
    /// Normalises `DDDD[DDDD]:BB:DD.F` (any case); `None` when it is not a PCI address.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim().trim_end_matches('\0').to_ascii_lowercase();
        let (domain, rest) = s.split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (dev, func) = rest.split_once('.')?;
        let hex =
            |p: &str, max: usize| !p.is_empty() && p.len() <= max && p.bytes().all(|b| b.is_ascii_hexdigit());
        if !(hex(domain, 8) && hex(bus, 2) && hex(dev, 2) && hex(func, 1)) {
            return None;
        }
        let domain = u32::from_str_radix(domain, 16).ok()?;
        if domain > 0xffff {
            return None;
        }
        Some(PciBusId(format!("{domain:04x}:{bus:0>2}:{dev:0>2}.{func}")))
    }

    /// The sysfs form, e.g. `0000:18:00.0`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PciBusId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// CUDA compute capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ComputeCapability {
    /// Major (9 for Hopper).
    pub major: u32,
    /// Minor.
    pub minor: u32,
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// NVML index (position among the GPUs this process can see).
    pub index: u32,
    /// Minor number of the GPU's device node, `/dev/nvidia<minor>`.
    pub minor: u32,
    /// `GPU-...` UUID.
    pub uuid: DeviceUuid,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// PCI address.
    pub pci_bus_id: PciBusId,
    /// Total framebuffer memory in bytes.
    pub memory_bytes: u64,
    /// CUDA compute capability.
    pub compute_capability: ComputeCapability,
    /// Architecture family in lower case (`hopper`, `ampere`, ...), `unknown` when NVML cannot say.
    pub architecture: String,
    /// NUMA node of the GPU, when the platform reports one.
    pub numa_node: Option<u32>,
    /// MIG mode: `None` when the GPU cannot do MIG, else whether it is enabled.
    pub mig_enabled: Option<bool>,
    /// MIG devices (compute instances) when MIG is enabled, in NVML order.
    pub mig_devices: Vec<MigDevice>,
    /// Active NVLink links, by link number.
    pub nvlinks: Vec<NvLink>,
}

/// A MIG device: one compute instance inside a GPU instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigDevice {
    /// Position among its parent's MIG devices (`nvmlDeviceGetMigDeviceHandleByIndex`).
    pub index: u32,
    /// `MIG-...` UUID.
    pub uuid: DeviceUuid,
    /// GPU instance id (selects `/dev/nvidia-caps` GI access node).
    pub gpu_instance_id: u32,
    /// Compute instance id within the GPU instance.
    pub compute_instance_id: u32,
    /// Profile, which names the MIG resource (`nvidia.com/mig-1g.10gb`).
    pub profile: MigProfile,
}

/// The shape of a MIG device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MigProfile {
    /// GPU instance slices (the `N` of `Ng`).
    pub gpu_slices: u32,
    /// Compute instance slices; equal to `gpu_slices` for a full-size compute instance.
    pub compute_slices: u32,
    /// Memory in GB as the profile name states it (the `M` of `M`gb).
    pub memory_gb: u64,
    /// Memory of the instance in bytes.
    pub memory_bytes: u64,
}

impl MigProfile {
    /// Builds a profile from NVML's device attributes the way NVIDIA's tools name it: the instance's
    /// share of the parent's memory, rounded up to eighths, times the parent's memory in whole GB.
    pub fn from_attributes(gpu_slices: u32, compute_slices: u32, memory_mb: u64, parent_bytes: u64) -> Self {
        const GIB: u64 = 1 << 30;
        let memory_bytes = memory_mb * (1 << 20);
        let memory_gb = if parent_bytes == 0 {
            memory_mb.div_ceil(1024)
        } else {
            // Integer form of round(ceil(8 * share) / 8 * parent_gb), exact for all real profiles.
            let eighths = (8 * memory_bytes).div_ceil(parent_bytes);
            let parent_gb = parent_bytes.div_ceil(GIB);
            (eighths * parent_gb + 4) / 8
        };
        MigProfile { gpu_slices, compute_slices, memory_gb, memory_bytes }
    }

    /// The profile name: `3g.40gb`, or `1c.3g.40gb` for a partial compute instance.
    pub fn name(&self) -> String {
        if self.compute_slices == self.gpu_slices {
            format!("{}g.{}gb", self.gpu_slices, self.memory_gb)
        } else {
            format!("{}c.{}g.{}gb", self.compute_slices, self.gpu_slices, self.memory_gb)
        }
    }
}

/// An active NVLink link to another GPU (or NVSwitch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLink {
    /// Link number on this GPU.
    pub link: u32,
    /// PCI address of the device at the other end.
    pub peer: PciBusId,
}

/// How far apart two GPUs are on PCIe, closest first (NVML's `nvmlGpuTopologyLevel_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopologyLevel {
    /// The same GPU (or two GPUs on one board).
    Internal,
    /// Behind one PCIe switch (`PIX`).
    Single,
    /// Behind several PCIe switches, no host bridge (`PXB`).
    Multiple,
    /// Through one host bridge (`PHB`).
    HostBridge,
    /// Through host bridges within a NUMA node (`NODE`).
    Node,
    /// Across NUMA nodes (`SYS`).
    System,
}

/// An A100 80GB as the unit tests of this crate describe one: `index` and `minor` as given, a UUID and
/// PCI address derived from `index`, MIG enabled when `mig` has devices.
#[cfg(test)]
pub(crate) fn test_a100(index: u32, minor: u32, mig: Vec<MigDevice>) -> Gpu {
    Gpu {
        index,
        minor,
        uuid: DeviceUuid(format!("GPU-0000000{index}-0000-0000-0000-000000000000")),
        name: "NVIDIA A100-SXM4-80GB".into(),
        pci_bus_id: PciBusId::parse(&format!("0000:0{index}:00.0")).unwrap(),
        memory_bytes: 80 << 30,
        compute_capability: ComputeCapability { major: 8, minor: 0 },
        architecture: "ampere".into(),
        numa_node: None,
        mig_enabled: Some(!mig.is_empty()),
        mig_devices: mig,
        nvlinks: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_bus_ids_from_nvml_and_sysfs_compare_equal() {
        let a = PciBusId::parse("00000000:1A:00.0").unwrap();
        let b = PciBusId::parse("0000:1a:00.0").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.as_str(), "0000:1a:00.0");
        assert_eq!(PciBusId::parse("00000000:18:00.0\0\0").unwrap().as_str(), "0000:18:00.0");
        assert!(PciBusId::parse("garbage").is_none());
        assert!(PciBusId::parse("123456789:18:00.0").is_none());
    }

    #[test]
    fn mig_profile_names_match_nvidia_tools() {
        const MIB: u64 = 1 << 20;
        // A100 80GB (81920 MiB) and H100 80GB (81559 MiB) profile memory sizes in MiB.
        let a100 = 81920 * MIB;
        let h100 = 81559 * MIB;
        for (g, c, mb, parent, want) in [
            (1, 1, 9856, a100, "1g.10gb"),
            (1, 1, 19968, a100, "1g.20gb"),
            (2, 2, 19968, a100, "2g.20gb"),
            (3, 3, 40192, a100, "3g.40gb"),
            (4, 4, 40192, a100, "4g.40gb"),
            (7, 7, 80384, a100, "7g.80gb"),
            (3, 1, 40192, a100, "1c.3g.40gb"),
            (1, 1, 9984, h100, "1g.10gb"),
            (7, 7, 80896, h100, "7g.80gb"),
        ] {
            assert_eq!(MigProfile::from_attributes(g, c, mb, parent).name(), want, "{mb} MiB of {parent}");
        }
        // A100 40GB: 1g.5gb.
        assert_eq!(MigProfile::from_attributes(1, 1, 4864, 40960 * MIB).name(), "1g.5gb");
    }

    #[test]
    fn cuda_version_decodes_nvml_integer() {
        assert_eq!(CudaVersion::from_nvml(12040).to_string(), "12.4");
        assert_eq!(CudaVersion::from_nvml(11080).to_string(), "11.8");
    }
}
