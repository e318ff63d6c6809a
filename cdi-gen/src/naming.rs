//! The CDI names of discovered devices: the one function both cdi-gen's spec and the device
//! plugin's Allocate answers name devices with, so a name the plugin hands out exists in the spec.
//!
//! It lives here, not in `nvinject-gpu`: the data flows discover -> model -> CDI, and a CDI name
//! is the CDI side's view of a device. The GPU crate names a device within its kind
//! ([`DeviceRef::name`]) and never depends on the CDI crate; this crate, which already joins the
//! two, makes the typed [`QualifiedName`].

use nvinject_cdi::{Kind, NameError, QualifiedName};
use nvinject_gpu::{DeviceRef, NamingStrategy};

/// `<kind>=<name under strategy>`; an error only when the device's name breaks CDI's rules (a
/// UUID NVML reported with characters CDI does not allow).
pub fn qualified_name(
    kind: &Kind,
    device: DeviceRef<'_>,
    strategy: NamingStrategy,
) -> Result<QualifiedName, NameError> {
    QualifiedName::new(kind.clone(), &device.name(strategy))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvinject_gpu::{ComputeCapability, DeviceUuid, Gpu, PciBusId};

    #[test]
    fn names_are_the_kind_and_the_strategy_s_name() {
        let gpu = Gpu {
            index: 3,
            minor: 3,
            uuid: DeviceUuid("GPU-00000003-0000-0000-0000-000000000000".into()),
            name: "NVIDIA H100".into(),
            pci_bus_id: PciBusId::parse("0000:03:00.0").unwrap(),
            memory_bytes: 80 << 30,
            compute_capability: ComputeCapability { major: 9, minor: 0 },
            architecture: "hopper".into(),
            numa_node: None,
            mig_enabled: None,
            mig_devices: vec![],
            nvlinks: vec![],
        };
        let kind = nvinject_cdi::nvinject::default_kind();
        let names: Vec<String> = NamingStrategy::ALL
            .iter()
            .map(|s| qualified_name(&kind, DeviceRef::Gpu(&gpu), *s).unwrap().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "nvidia.com/gpu=3",
                "nvidia.com/gpu=GPU-00000003-0000-0000-0000-000000000000",
                "nvidia.com/gpu=gpu3"
            ]
        );
    }
}
