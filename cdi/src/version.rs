//! CDI versions and the lowest version a spec's content needs.
//!
//! Writers should declare the lowest version their content needs: runtimes only load specs whose
//! version they know, and containerd releases lag behind the CDI spec. What each version added, from
//! the specification's changelog:
//! - 0.4.0: `type` on mounts;
//! - 0.5.0: `hostPath` on device nodes; device names starting with a non-letter;
//! - 0.6.0: spec and device `annotations`; dots in the class part of `kind`;
//! - 0.7.0: `intelRdt`; `additionalGids`;
//! - 0.8.0, 1.0.0: no content change;
//! - 1.1.0: `netDevices`; `intelRdt.schemata` and `intelRdt.enableMonitoring` (which replace
//!   `enableCMT`/`enableMBM`).

use std::fmt;
use std::str::FromStr;

use crate::spec::{ContainerEdits, Spec};

/// A released CDI specification version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CdiVersion {
    major: u8,
    minor: u8,
}

impl CdiVersion {
    /// 0.3.0, the earliest version runtimes still accept; the floor of [`minimum_version`].
    pub const V0_3_0: CdiVersion = CdiVersion { major: 0, minor: 3 };
    /// 0.4.0: mount `type`.
    pub const V0_4_0: CdiVersion = CdiVersion { major: 0, minor: 4 };
    /// 0.5.0: device node `hostPath`, device names starting with a digit.
    pub const V0_5_0: CdiVersion = CdiVersion { major: 0, minor: 5 };
    /// 0.6.0: annotations, dots in the class.
    pub const V0_6_0: CdiVersion = CdiVersion { major: 0, minor: 6 };
    /// 0.7.0: Intel RDT, additional GIDs.
    pub const V0_7_0: CdiVersion = CdiVersion { major: 0, minor: 7 };
    /// 1.1.0: network devices, Intel RDT schemata/monitoring.
    pub const V1_1_0: CdiVersion = CdiVersion { major: 1, minor: 1 };
    /// The newest version this crate knows.
    pub const LATEST: CdiVersion = CdiVersion::V1_1_0;

    /// Every released version, oldest first.
    pub const KNOWN: [CdiVersion; 10] = [
        CdiVersion { major: 0, minor: 1 },
        CdiVersion { major: 0, minor: 2 },
        CdiVersion::V0_3_0,
        CdiVersion::V0_4_0,
        CdiVersion::V0_5_0,
        CdiVersion::V0_6_0,
        CdiVersion::V0_7_0,
        CdiVersion { major: 0, minor: 8 },
        CdiVersion { major: 1, minor: 0 },
        CdiVersion::V1_1_0,
    ];
}

impl fmt::Display for CdiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.0", self.major, self.minor)
    }
}

/// A `cdiVersion` that is not a released CDI version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a released CDI version (known: 0.1.0 to 1.1.0, e.g. 0.6.0)")]
pub struct UnknownVersion(pub String);

impl FromStr for CdiVersion {
    type Err = UnknownVersion;

    /// Accepts `0.6.0` and `v0.6.0`, as the reference implementation does.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.strip_prefix('v').unwrap_or(s);
        CdiVersion::KNOWN
            .iter()
            .find(|v| v.to_string() == text)
            .copied()
            .ok_or_else(|| UnknownVersion(s.to_owned()))
    }
}

/// One piece of content that needs a version above the floor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The version the content needs.
    pub version: CdiVersion,
    /// Field path of the content, e.g. `devices[0].containerEdits.deviceNodes[1].hostPath`.
    pub field: String,
    /// What the content is, e.g. `device node hostPath`.
    pub feature: &'static str,
}

/// The lowest `cdiVersion` that can express `spec`.
pub fn minimum_version(spec: &Spec) -> CdiVersion {
    requirements(spec).iter().map(|r| r.version).max().unwrap_or(CdiVersion::V0_3_0)
}

/// Every piece of content in `spec` that needs more than 0.3.0, in document order.
pub fn requirements(spec: &Spec) -> Vec<Requirement> {
    let mut out = Vec::new();
    let mut need = |version, field: String, feature| out.push(Requirement { version, field, feature });
    if spec.kind.class().contains('.') {
        need(CdiVersion::V0_6_0, "kind".into(), "a dot in the class name");
    }
    if !spec.annotations.is_empty() {
        need(CdiVersion::V0_6_0, "annotations".into(), "spec annotations");
    }
    for (i, device) in spec.devices.iter().enumerate() {
        if device.name.starts_with(|c: char| !c.is_ascii_alphabetic()) {
            need(
                CdiVersion::V0_5_0,
                format!("devices[{i}].name"),
                "a device name not starting with a letter",
            );
        }
        if !device.annotations.is_empty() {
            need(CdiVersion::V0_6_0, format!("devices[{i}].annotations"), "device annotations");
        }
        edit_requirements(&device.container_edits, &format!("devices[{i}].containerEdits"), &mut need);
    }
    edit_requirements(&spec.container_edits, "containerEdits", &mut need);
    out
}

fn edit_requirements(
    edits: &ContainerEdits,
    at: &str,
    need: &mut impl FnMut(CdiVersion, String, &'static str),
) {
    for (i, node) in edits.device_nodes.iter().enumerate() {
        if node.host_path.as_deref().is_some_and(|p| !p.is_empty()) {
            need(CdiVersion::V0_5_0, format!("{at}.deviceNodes[{i}].hostPath"), "device node hostPath");
        }
    }
    for (i, mount) in edits.mounts.iter().enumerate() {
        if mount.mount_type.as_deref().is_some_and(|t| !t.is_empty()) {
            need(CdiVersion::V0_4_0, format!("{at}.mounts[{i}].type"), "mount type");
        }
    }
    if let Some(rdt) = &edits.intel_rdt {
        need(CdiVersion::V0_7_0, format!("{at}.intelRdt"), "intelRdt");
        if rdt.schemata.is_some() {
            need(CdiVersion::V1_1_0, format!("{at}.intelRdt.schemata"), "intelRdt schemata");
        }
        if rdt.enable_monitoring.is_some() {
            need(CdiVersion::V1_1_0, format!("{at}.intelRdt.enableMonitoring"), "intelRdt enableMonitoring");
        }
    }
    if !edits.additional_gids.is_empty() {
        need(CdiVersion::V0_7_0, format!("{at}.additionalGids"), "additionalGids");
    }
    if !edits.net_devices.is_empty() {
        need(CdiVersion::V1_1_0, format!("{at}.netDevices"), "netDevices");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Device, DeviceNode, IntelRdt, Mount, NetDevice};

    fn spec(name: &str, edits: ContainerEdits) -> Spec {
        Spec {
            cdi_version: "0.3.0".into(),
            kind: "vendor.com/dev".parse().unwrap(),
            devices: vec![Device { name: name.into(), container_edits: edits, ..Default::default() }],
            annotations: Default::default(),
            container_edits: Default::default(),
        }
    }

    fn node(host_path: Option<&str>) -> DeviceNode {
        DeviceNode { path: "/dev/x".into(), host_path: host_path.map(Into::into), ..Default::default() }
    }

    #[test]
    fn each_versions_additions_raise_the_minimum() {
        let plain = ContainerEdits { device_nodes: vec![node(None)], ..Default::default() };
        assert_eq!(minimum_version(&spec("dev0", plain.clone())), CdiVersion::V0_3_0);

        let typed_mount = ContainerEdits {
            mounts: vec![Mount {
                host_path: "tmpfs".into(),
                container_path: "/x".into(),
                mount_type: Some("tmpfs".into()),
                options: vec![],
            }],
            ..Default::default()
        };
        assert_eq!(minimum_version(&spec("dev0", typed_mount)), CdiVersion::V0_4_0);

        assert_eq!(minimum_version(&spec("0", plain.clone())), CdiVersion::V0_5_0);
        let host_path =
            ContainerEdits { device_nodes: vec![node(Some("/host/dev/x"))], ..Default::default() };
        assert_eq!(minimum_version(&spec("dev0", host_path)), CdiVersion::V0_5_0);

        let mut annotated = spec("dev0", plain.clone());
        annotated.annotations.insert("a.io/b".into(), "c".into());
        assert_eq!(minimum_version(&annotated), CdiVersion::V0_6_0);
        let mut dotted = spec("dev0", plain.clone());
        dotted.kind = "vendor.com/dev.x".parse().unwrap();
        assert_eq!(minimum_version(&dotted), CdiVersion::V0_6_0);

        let gids = ContainerEdits { additional_gids: vec![44], ..plain.clone() };
        assert_eq!(minimum_version(&spec("dev0", gids)), CdiVersion::V0_7_0);
        let rdt = ContainerEdits {
            intel_rdt: Some(IntelRdt { clos_id: Some("g".into()), ..Default::default() }),
            ..plain.clone()
        };
        assert_eq!(minimum_version(&spec("dev0", rdt)), CdiVersion::V0_7_0);

        let net = ContainerEdits {
            net_devices: vec![NetDevice { host_interface_name: "eth1".into(), name: "net0".into() }],
            ..plain.clone()
        };
        assert_eq!(minimum_version(&spec("dev0", net)), CdiVersion::V1_1_0);
        let schemata = ContainerEdits {
            intel_rdt: Some(IntelRdt { schemata: Some(vec![]), ..Default::default() }),
            ..plain
        };
        let s = spec("dev0", schemata);
        assert_eq!(minimum_version(&s), CdiVersion::V1_1_0);
        assert_eq!(requirements(&s).last().unwrap().field, "devices[0].containerEdits.intelRdt.schemata");
    }

    #[test]
    fn versions_parse_and_print() {
        assert_eq!("0.6.0".parse::<CdiVersion>().unwrap(), CdiVersion::V0_6_0);
        assert_eq!("v1.1.0".parse::<CdiVersion>().unwrap(), CdiVersion::V1_1_0);
        assert_eq!(CdiVersion::V0_5_0.to_string(), "0.5.0");
        assert!("0.5.1".parse::<CdiVersion>().unwrap_err().to_string().contains("not a released"));
        assert!(CdiVersion::V0_5_0 < CdiVersion::V0_6_0 && CdiVersion::V0_7_0 < CdiVersion::LATEST);
    }
}
