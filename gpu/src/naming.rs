//! Device names: the one naming function shared by the CDI spec generator and the device plugin.
//!
//! A CDI device is addressed as `<kind>=<name>` (`nvidia.com/gpu=0`). cdi-gen writes one device per
//! strategy asked for; the device plugin answers Allocate with a name from the same function
//! (`nvinject_cdi_gen::qualified_name`, which joins the kind to [`DeviceRef::name`] on the CDI
//! side), so a name the plugin hands out always exists in the spec. The strategies and their spellings are
//! those of NVIDIA's `nvidia-ctk cdi generate --device-name-strategy`, so workloads carry over.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::model::{Gpu, Inventory, MigDevice};

/// How a device is named inside its CDI kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NamingStrategy {
    /// NVML index: `0`; a MIG device `<parent index>:<mig index>` (`0:1`).
    Index,
    /// The device UUID: `GPU-...` or `MIG-...`. Stable across reboots and index changes.
    Uuid,
    /// Type and index: `gpu0`, `mig0:1`.
    TypeIndex,
}

impl NamingStrategy {
    /// All strategies, in the order cdi-gen lists them.
    pub const ALL: [NamingStrategy; 3] =
        [NamingStrategy::Index, NamingStrategy::Uuid, NamingStrategy::TypeIndex];

    /// The flag spelling (`index`, `uuid`, `type-index`).
    pub fn as_str(self) -> &'static str {
        match self {
            NamingStrategy::Index => "index",
            NamingStrategy::Uuid => "uuid",
            NamingStrategy::TypeIndex => "type-index",
        }
    }
}

impl fmt::Display for NamingStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error for an unknown strategy name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown device name strategy `{0}`: expected index, uuid or type-index")]
pub struct UnknownStrategy(pub String);

impl FromStr for NamingStrategy {
    type Err = UnknownStrategy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|n| n.as_str() == s).ok_or_else(|| UnknownStrategy(s.to_owned()))
    }
}

/// A device that can be named: a whole GPU or a MIG device of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceRef<'a> {
    /// A whole GPU.
    Gpu(&'a Gpu),
    /// A MIG device and its parent GPU.
    Mig(&'a Gpu, &'a MigDevice),
}

impl<'a> DeviceRef<'a> {
    /// The device's name under `strategy`.
    pub fn name(&self, strategy: NamingStrategy) -> String {
        match (self, strategy) {
            (DeviceRef::Gpu(g), NamingStrategy::Index) => g.index.to_string(),
            (DeviceRef::Gpu(g), NamingStrategy::Uuid) => g.uuid.to_string(),
            (DeviceRef::Gpu(g), NamingStrategy::TypeIndex) => format!("gpu{}", g.index),
            (DeviceRef::Mig(g, m), NamingStrategy::Index) => format!("{}:{}", g.index, m.index),
            (DeviceRef::Mig(_, m), NamingStrategy::Uuid) => m.uuid.to_string(),
            (DeviceRef::Mig(g, m), NamingStrategy::TypeIndex) => format!("mig{}:{}", g.index, m.index),
        }
    }

    /// The GPU that owns the device (itself for a whole GPU).
    pub fn gpu(&self) -> &'a Gpu {
        match self {
            DeviceRef::Gpu(g) | DeviceRef::Mig(g, _) => g,
        }
    }

    /// The device's UUID.
    pub fn uuid(&self) -> &'a str {
        match self {
            DeviceRef::Gpu(g) => g.uuid.as_str(),
            DeviceRef::Mig(_, m) => m.uuid.as_str(),
        }
    }
}

impl Inventory {
    /// Every nameable device: each GPU without MIG enabled, and each MIG device of the others.
    /// A MIG-enabled GPU is not itself a device a container can be given.
    pub fn devices(&self) -> impl Iterator<Item = DeviceRef<'_>> {
        self.gpus.iter().flat_map(|g| {
            let whole = (g.mig_enabled != Some(true)).then_some(DeviceRef::Gpu(g));
            whole.into_iter().chain(g.mig_devices.iter().map(move |m| DeviceRef::Mig(g, m)))
        })
    }

    /// Finds a device by any name any strategy gives it (`1`, `1:0`, `gpu1`, `mig1:0`, a UUID).
    pub fn find_device(&self, name: &str) -> Option<DeviceRef<'_>> {
        let all = || {
            self.gpus
                .iter()
                .map(DeviceRef::Gpu)
                .chain(self.gpus.iter().flat_map(|g| g.mig_devices.iter().map(move |m| DeviceRef::Mig(g, m))))
        };
        all().find(|d| NamingStrategy::ALL.iter().any(|s| d.name(*s) == name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::*;

    fn gpu(index: u32, mig: Vec<MigDevice>) -> Gpu {
        crate::model::test_a100(index, index + 4, mig)
    }

    fn inventory() -> Inventory {
        let mig = MigDevice {
            index: 0,
            uuid: DeviceUuid("MIG-11111111-2222-3333-4444-555555555555".into()),
            gpu_instance_id: 2,
            compute_instance_id: 0,
            profile: MigProfile::from_attributes(3, 3, 40192, 81920 << 20),
        };
        Inventory {
            driver: DriverInfo {
                version: "550.54.15".into(),
                cuda: CudaVersion::from_nvml(12040),
                nvml_version: "12.550.54.15".into(),
            },
            gpus: vec![gpu(0, vec![]), gpu(1, vec![mig])],
            topology: vec![],
        }
    }

    #[test]
    fn names_follow_nvidia_ctk_strategies() {
        let inv = inventory();
        let names: Vec<Vec<String>> = inv
            .devices()
            .map(|d| NamingStrategy::ALL.iter().map(|s| format!("nvidia.com/gpu={}", d.name(*s))).collect())
            .collect();
        assert_eq!(
            names,
            vec![
                vec![
                    "nvidia.com/gpu=0".to_string(),
                    "nvidia.com/gpu=GPU-00000000-0000-0000-0000-000000000000".into(),
                    "nvidia.com/gpu=gpu0".into(),
                ],
                vec![
                    "nvidia.com/gpu=1:0".to_string(),
                    "nvidia.com/gpu=MIG-11111111-2222-3333-4444-555555555555".into(),
                    "nvidia.com/gpu=mig1:0".into(),
                ],
            ]
        );
    }

    #[test]
    fn mig_enabled_gpu_is_not_a_device_but_can_be_found() {
        let inv = inventory();
        assert!(inv.devices().all(|d| !matches!(d, DeviceRef::Gpu(g) if g.index == 1)));
        assert_eq!(
            inv.find_device("gpu1").map(|d| d.uuid()),
            Some("GPU-00000001-0000-0000-0000-000000000000")
        );
        assert_eq!(
            inv.find_device("1:0").map(|d| d.uuid()),
            Some("MIG-11111111-2222-3333-4444-555555555555")
        );
        assert!(inv.find_device("7").is_none());
    }

    #[test]
    fn strategy_spellings_round_trip() {
        for s in NamingStrategy::ALL {
            assert_eq!(s.as_str().parse::<NamingStrategy>().unwrap(), s);
        }
        assert!("by-uuid".parse::<NamingStrategy>().unwrap_err().to_string().contains("type-index"));
    }
}
