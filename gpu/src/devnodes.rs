//! The NVIDIA driver's device nodes: which ones a container needs (the control nodes, a GPU's node,
//! a MIG device's capability nodes), their paths, how the driver numbers them, and the driver's
//! table of MIG capability minors (`<proc root>/driver/nvidia-caps/mig-minors`).
//!
//! One owner for these facts, so the CDI spec cdi-gen writes and the DeviceSpecs the device plugin
//! returns name the same nodes. Pure: callers read the dev root, `/proc/devices` and `mig-minors`
//! themselves and hand the text or numbers in. Paths are container paths (`/dev/nvidia0`); on the
//! host a node is the same path under the dev root.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use crate::model::{Gpu, MigDevice};
use crate::naming::DeviceRef;

/// Major number of the GPU nodes and `/dev/nvidiactl` (`nvidia-frontend`), fixed by the driver.
pub const NVIDIA_MAJOR: u32 = 195;
/// Minor of `/dev/nvidiactl`.
pub const CTL_MINOR: u32 = 255;
/// The `/proc/devices` name of the UVM module, whose major the kernel assigns when it loads.
pub const UVM_DRIVER: &str = "nvidia-uvm";
/// The `/proc/devices` name of the capability nodes' driver, whose major the kernel assigns.
pub const CAPS_DRIVER: &str = "nvidia-caps";

/// Mode of the GPU and control nodes as the driver's tools (`nvidia-modprobe`) create them.
const NODE_MODE: u32 = 0o666;
/// Mode of a MIG access capability node (`DeviceFileMode` of the capability, read-only).
const CAP_MODE: u32 = 0o444;

/// How a node is numbered when it is not on the host (yet): the driver makes some nodes only on
/// first use, and a complete spec must describe them anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numbering {
    /// Major and minor fixed by the driver.
    Fixed {
        /// Major number.
        major: u32,
        /// Minor number.
        minor: u32,
    },
    /// A fixed minor under the major `/proc/devices` lists for `driver` (assigned at module load).
    ProcDevices {
        /// The driver's name in `/proc/devices`' character section.
        driver: &'static str,
        /// Minor number.
        minor: u32,
    },
    /// Exists only while an optional module is loaded: described only when seen, never invented.
    OnlyWhenPresent,
}

impl Numbering {
    /// `(major, minor)` given the character device majors of `/proc/devices` by driver name;
    /// `None` when they cannot be known from that.
    pub fn numbers(self, char_majors: &BTreeMap<String, u32>) -> Option<(u32, u32)> {
        match self {
            Numbering::Fixed { major, minor } => Some((major, minor)),
            Numbering::ProcDevices { driver, minor } => char_majors.get(driver).map(|&major| (major, minor)),
            Numbering::OnlyWhenPresent => None,
        }
    }
}

/// A character device node of the NVIDIA driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverNode {
    /// Path in the container (`/dev/nvidia0`); on the host, the same path under the dev root.
    pub path: Cow<'static, str>,
    /// How it is numbered when it is not on the host.
    pub numbering: Numbering,
    /// The file mode the driver's tools create it with (`0o666`; `0o444` for a capability node).
    pub mode: u32,
}

/// The driver's control nodes, which every CUDA process opens, in the order they are handed out:
/// in every GPU container, so in no single device. `nvidia-uvm` numbers its nodes under a major
/// assigned at load; `nvidia-modeset` exists only while its module is loaded.
pub const CONTROL_NODES: [DriverNode; 4] = [
    DriverNode {
        path: Cow::Borrowed("/dev/nvidiactl"),
        numbering: Numbering::Fixed { major: NVIDIA_MAJOR, minor: CTL_MINOR },
        mode: NODE_MODE,
    },
    DriverNode {
        path: Cow::Borrowed("/dev/nvidia-uvm"),
        numbering: Numbering::ProcDevices { driver: UVM_DRIVER, minor: 0 },
        mode: NODE_MODE,
    },
    DriverNode {
        path: Cow::Borrowed("/dev/nvidia-uvm-tools"),
        numbering: Numbering::ProcDevices { driver: UVM_DRIVER, minor: 1 },
        mode: NODE_MODE,
    },
    DriverNode {
        path: Cow::Borrowed("/dev/nvidia-modeset"),
        numbering: Numbering::OnlyWhenPresent,
        mode: NODE_MODE,
    },
];

/// Whether `path` (a container path) is one of [`CONTROL_NODES`].
pub fn is_control_node(path: &str) -> bool {
    CONTROL_NODES.iter().any(|n| n.path == path)
}

/// The node of the GPU whose device minor is `minor`: `/dev/nvidia<minor>`.
pub fn gpu_node(minor: u32) -> DriverNode {
    DriverNode {
        path: Cow::Owned(format!("/dev/nvidia{minor}")),
        numbering: Numbering::Fixed { major: NVIDIA_MAJOR, minor },
        mode: NODE_MODE,
    }
}

/// The node of the capability whose minor is `minor` (from [`MigMinors`]):
/// `/dev/nvidia-caps/nvidia-cap<minor>`.
pub fn cap_node(minor: u32) -> DriverNode {
    DriverNode {
        path: Cow::Owned(format!("/dev/nvidia-caps/nvidia-cap{minor}")),
        numbering: Numbering::ProcDevices { driver: CAPS_DRIVER, minor },
        mode: CAP_MODE,
    }
}

/// The driver nodes `device` needs, its GPU's node first: a whole GPU has only that; a MIG device
/// adds the nodes of its GPU-instance and compute-instance access capabilities, in that order, with
/// the minors from `minors`.
pub fn device_nodes(device: DeviceRef<'_>, minors: &MigMinors) -> Result<Vec<DriverNode>, MissingMigCap> {
    let gpu = device.gpu();
    let mut nodes = vec![gpu_node(gpu.minor)];
    if let DeviceRef::Mig(g, m) = device {
        for cap in MigCap::access_of(g, m) {
            nodes.push(cap_node(minors.minor(cap).ok_or(MissingMigCap(cap))?));
        }
    }
    Ok(nodes)
}

/// A MIG access capability the driver's table does not list (the MIG device was made after the
/// table was read, or `nvidia-caps` is not loaded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no `{0}` in the driver's mig-minors table")]
pub struct MissingMigCap(pub MigCap);

/// A MIG access capability as `mig-minors` names it: `gpu<minor>/gi<id>/access` for a GPU
/// instance, `gpu<minor>/gi<id>/ci<id>/access` for a compute instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MigCap {
    /// Minor number of the parent GPU (not its NVML index).
    pub gpu_minor: u32,
    /// GPU instance id.
    pub gi: u32,
    /// Compute instance id; `None` for the GPU instance's own capability.
    pub ci: Option<u32>,
}

impl MigCap {
    /// The two capabilities a MIG device of `gpu` is reached through: its GPU instance's, then its
    /// compute instance's.
    pub fn access_of(gpu: &Gpu, mig: &MigDevice) -> [MigCap; 2] {
        let gi = MigCap { gpu_minor: gpu.minor, gi: mig.gpu_instance_id, ci: None };
        [gi, MigCap { ci: Some(mig.compute_instance_id), ..gi }]
    }

    /// Parses `gpu0/gi2/access` or `gpu0/gi2/ci0/access`; `None` for anything else (`config`).
    pub fn parse(name: &str) -> Option<MigCap> {
        let mut parts = name.split('/');
        let num = |p: Option<&str>, prefix: &str| p?.strip_prefix(prefix)?.parse::<u32>().ok();
        let gpu_minor = num(parts.next(), "gpu")?;
        let gi = num(parts.next(), "gi")?;
        let (ci, last) = match parts.next()? {
            "access" => (None, None),
            p => (Some(num(Some(p), "ci")?), parts.next()),
        };
        if ci.is_some() && last != Some("access") || parts.next().is_some() {
            return None;
        }
        Some(MigCap { gpu_minor, gi, ci })
    }
}

impl fmt::Display for MigCap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ci {
            Some(ci) => write!(f, "gpu{}/gi{}/ci{ci}/access", self.gpu_minor, self.gi),
            None => write!(f, "gpu{}/gi{}/access", self.gpu_minor, self.gi),
        }
    }
}

/// The driver's table of MIG capability minors, `<proc root>/driver/nvidia-caps/mig-minors`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigMinors {
    /// Minors of the GPU-instance and compute-instance access capabilities.
    pub access: BTreeMap<MigCap, u32>,
    /// Minor of `config` (reconfiguring MIG, for `nvidia-smi`), when listed; its node exists from
    /// module load and no container is given it.
    pub config: Option<u32>,
    /// Minor of `monitor` (reading every instance's state), when listed; likewise never given.
    pub monitor: Option<u32>,
}

impl MigMinors {
    /// Parses the table: `<name> <minor>` per line (`gpu0/gi2/ci0/access 22`). The driver lists
    /// every possible instance of every possible GPU (4322 lines), so nothing is allocated per
    /// line; a line that does not fit is skipped.
    pub fn parse(text: &str) -> Self {
        let mut table = MigMinors::default();
        for line in text.lines() {
            let Some((name, minor)) = line.trim().split_once(char::is_whitespace) else { continue };
            let Ok(minor) = minor.trim().parse::<u32>() else { continue };
            match name {
                "config" => table.config = Some(minor),
                "monitor" => table.monitor = Some(minor),
                name => {
                    if let Some(cap) = MigCap::parse(name) {
                        table.access.insert(cap, minor);
                    }
                }
            }
        }
        table
    }

    /// The minor of the access capability `cap`.
    pub fn minor(&self, cap: MigCap) -> Option<u32> {
        self.access.get(&cap).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DeviceUuid, MigProfile};

    fn gpu(minor: u32, mig: Vec<MigDevice>) -> Gpu {
        crate::model::test_a100(0, minor, mig)
    }

    fn mig(gi: u32, ci: u32) -> MigDevice {
        MigDevice {
            index: 0,
            uuid: DeviceUuid("MIG-11111111-2222-3333-4444-555555555555".into()),
            gpu_instance_id: gi,
            compute_instance_id: ci,
            profile: MigProfile::from_attributes(3, 3, 40192, 81920 << 20),
        }
    }

    fn paths(nodes: &[DriverNode]) -> Vec<&str> {
        nodes.iter().map(|n| n.path.as_ref()).collect()
    }

    #[test]
    fn control_nodes_and_their_numbers() {
        assert_eq!(
            paths(&CONTROL_NODES),
            ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
        );
        let majors: BTreeMap<String, u32> = [(UVM_DRIVER.to_owned(), 510)].into();
        let numbers: Vec<Option<(u32, u32)>> =
            CONTROL_NODES.iter().map(|n| n.numbering.numbers(&majors)).collect();
        assert_eq!(numbers, [Some((195, 255)), Some((510, 0)), Some((510, 1)), None]);
        // Without the uvm major only nvidiactl can be described.
        let numbers: Vec<bool> =
            CONTROL_NODES.iter().map(|n| n.numbering.numbers(&BTreeMap::new()).is_some()).collect();
        assert_eq!(numbers, [true, false, false, false]);
        assert!(CONTROL_NODES.iter().all(|n| n.mode == 0o666));
        assert!(is_control_node("/dev/nvidia-modeset") && !is_control_node("/dev/nvidia0"));
    }

    #[test]
    fn gpu_and_capability_nodes() {
        let g = gpu_node(3);
        assert_eq!(
            (g.path.as_ref(), g.numbering.numbers(&BTreeMap::new()), g.mode),
            ("/dev/nvidia3", Some((195, 3)), 0o666)
        );
        let c = cap_node(21);
        assert_eq!(c.path, "/dev/nvidia-caps/nvidia-cap21");
        assert_eq!(c.numbering, Numbering::ProcDevices { driver: "nvidia-caps", minor: 21 });
        assert_eq!(c.mode, 0o444);
    }

    /// The head of a real `mig-minors` (driver 550), with two lines that do not fit.
    const MIG_MINORS: &str = "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n\
         gpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\nbogus\ngpu0/gi3/access x\n";

    #[test]
    fn parses_mig_minors() {
        let m = MigMinors::parse(MIG_MINORS);
        assert_eq!((m.config, m.monitor), (Some(1), Some(2)));
        assert_eq!(m.access.len(), 4);
        assert_eq!(m.minor(MigCap { gpu_minor: 0, gi: 2, ci: Some(0) }), Some(22));
        assert_eq!(m.minor(MigCap { gpu_minor: 0, gi: 2, ci: None }), Some(21));
        assert_eq!(m.minor(MigCap { gpu_minor: 0, gi: 3, ci: None }), None, "a minor that is not a number");
        assert_eq!(MigMinors::parse(""), MigMinors::default());
        for name in ["gpu0/gi2/access", "gpu12/gi14/ci7/access"] {
            assert_eq!(MigCap::parse(name).unwrap().to_string(), name);
        }
        for bad in ["config", "gpu0/gi2", "gpu0/gi2/ci0", "gpu0/gi2/access/x", "gpux/gi2/access"] {
            assert_eq!(MigCap::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn mig_nodes_come_from_the_minor_table() {
        let minors = MigMinors::parse(MIG_MINORS);
        let whole = gpu(0, vec![]);
        assert_eq!(
            paths(&device_nodes(DeviceRef::Gpu(&whole), &MigMinors::default()).unwrap()),
            ["/dev/nvidia0"]
        );
        let parent = gpu(0, vec![mig(2, 0), mig(3, 0)]);
        let nodes = device_nodes(DeviceRef::Mig(&parent, &parent.mig_devices[0]), &minors).unwrap();
        assert_eq!(
            paths(&nodes),
            ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"]
        );
        let missing = device_nodes(DeviceRef::Mig(&parent, &parent.mig_devices[1]), &minors).unwrap_err();
        assert_eq!(missing.0.to_string(), "gpu0/gi3/access");
        assert_eq!(missing.to_string(), "no `gpu0/gi3/access` in the driver's mig-minors table");
    }
}
