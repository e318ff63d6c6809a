//! The CDI spec as serde types, field for field as the CDI specification (up to 1.1.0) defines it.
//!
//! Optional fields are skipped when empty so written specs are minimal, and maps are `BTreeMap`s so
//! the same value always serializes to the same bytes. Unknown fields are rejected when parsing: a
//! misspelt key in a hand-edited spec is a mistake the user wants to hear about.
//!
//! Device-level `containerEdits` is required by the CDI schema and is therefore always written,
//! as `{}` when empty.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::name::Kind;

/// A whole CDI spec file: one vendor/class (`kind`) and the devices it provides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    /// The CDI version the content conforms to, e.g. `0.6.0`; see [`crate::version`].
    pub cdi_version: String,
    /// `vendor/class`, e.g. `nvidia.com/gpu`; a malformed kind fails parsing at this field.
    pub kind: Kind,
    /// Free-form key/value data about the spec (needs cdiVersion >= 0.6.0).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The devices a container can ask for, by name.
    pub devices: Vec<Device>,
    /// Edits applied once to a container that gets any device of this spec.
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

impl Spec {
    /// The device called `name` (unqualified: `0`, not `nvidia.com/gpu=0`).
    pub fn device(&self, name: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.name == name)
    }
}

/// One requestable device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    /// The name used after `=` in a qualified device name.
    pub name: String,
    /// Free-form key/value data about the device (needs cdiVersion >= 0.6.0).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Edits applied to a container that gets this device.
    pub container_edits: ContainerEdits,
}

/// Changes to make to a container's OCI spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    /// `NAME=value` entries appended to the process environment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes to create in the container and allow in its device cgroup.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// Host network interfaces to move into the container (cdiVersion >= 1.1.0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub net_devices: Vec<NetDevice>,
    /// OCI hooks to add.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    /// Mounts to add.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// Intel RDT (resctrl) settings (cdiVersion >= 0.7.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intel_rdt: Option<IntelRdt>,
    /// Supplementary group ids for the container process; 0 is ignored (cdiVersion >= 0.7.0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_gids: Vec<u32>,
}

impl ContainerEdits {
    /// True when applying these edits would change nothing.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.net_devices.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
            && self.intel_rdt.is_none()
            && self.additional_gids.is_empty()
    }

    /// Appends `other`'s edits after these (Intel RDT: `other` wins when both set it).
    pub fn append(&mut self, other: &ContainerEdits) {
        self.env.extend(other.env.iter().cloned());
        self.device_nodes.extend(other.device_nodes.iter().cloned());
        self.net_devices.extend(other.net_devices.iter().cloned());
        self.hooks.extend(other.hooks.iter().cloned());
        self.mounts.extend(other.mounts.iter().cloned());
        if other.intel_rdt.is_some() {
            self.intel_rdt.clone_from(&other.intel_rdt);
        }
        self.additional_gids.extend(other.additional_gids.iter().copied());
    }
}

/// A device node to expose in the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    /// Path inside the container.
    pub path: String,
    /// Path on the host when it differs from `path` (cdiVersion >= 0.5.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// `c` (char), `b` (block), `u` (unbuffered char) or `p` (FIFO).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub device_type: Option<DeviceType>,
    /// Major number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Minor number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// Permission bits of the node created in the container (e.g. `0o666`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Device cgroup access: any of `r`, `w`, `m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    /// Owner of the node inside the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Group of the node inside the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

impl DeviceNode {
    /// The host path: `hostPath` when set, else `path`.
    pub fn host_path(&self) -> &str {
        self.host_path.as_deref().unwrap_or(&self.path)
    }
}

/// A device node's type, as CDI and OCI spell it: one letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// `b`: a block device.
    Block,
    /// `c`: a character device.
    Char,
    /// `u`: an unbuffered character device.
    Unbuffered,
    /// `p`: a FIFO; it has no major/minor numbers.
    Fifo,
}

impl DeviceType {
    /// Every type, in the order messages list them.
    pub const ALL: [DeviceType; 4] =
        [DeviceType::Block, DeviceType::Char, DeviceType::Unbuffered, DeviceType::Fifo];

    /// The letter.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceType::Block => "b",
            DeviceType::Char => "c",
            DeviceType::Unbuffered => "u",
            DeviceType::Fifo => "p",
        }
    }

    /// Whether the device cgroup knows it (char and block devices get an allow rule).
    pub fn has_cgroup_rule(self) -> bool {
        matches!(self, DeviceType::Char | DeviceType::Block)
    }
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `type` that is not one of the four letters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("device type `{0}` is not one of b, c, u, p")]
pub struct UnknownDeviceType(pub String);

impl FromStr for DeviceType {
    type Err = UnknownDeviceType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|t| t.as_str() == s).ok_or_else(|| UnknownDeviceType(s.to_owned()))
    }
}

impl Serialize for DeviceType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for DeviceType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::name::from_str_de(d)
    }
}

/// A mount to add to the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Destination inside the container.
    pub container_path: String,
    /// Filesystem type (cdiVersion >= 0.4.0); bind mounts need none.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub mount_type: Option<String>,
    /// OCI mount options, e.g. `ro`, `nosuid`, `rbind`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// The whole environment of every hook nvinject writes, and of any applied hook whose spec sets
/// none. A hook without `env` gets the container's environment from runc (image `LD_PRELOAD`,
/// `LD_LIBRARY_PATH`, `LD_AUDIT`, `GCONV_PATH`, ...), and the dynamic loader acts on it as uid 0
/// on the host before the hook's `main` can clear anything; so hooks get a fixed `PATH` and nothing else.
pub const HOOK_ENV: [&str; 1] = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"];

/// [`HOOK_ENV`] as owned strings, for a [`Hook::env`].
pub fn minimal_hook_env() -> Vec<String> {
    HOOK_ENV.iter().map(|s| (*s).to_owned()).collect()
}

/// An OCI hook to add.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hook {
    /// The OCI hook point: `createContainer`, `createRuntime`, `startContainer`, `poststart`,
    /// `poststop` or (deprecated) `prestart`.
    pub hook_name: String,
    /// Absolute path of the executable, in the runtime's namespace.
    pub path: String,
    /// argv, including argv\[0\].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment of the hook process, `NAME=value`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Seconds before the runtime kills the hook; must be > 0 when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// Intel RDT (resctrl) settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntelRdt {
    /// Class of service (resctrl group) name.
    #[serde(default, rename = "closID", skip_serializing_if = "Option::is_none")]
    pub clos_id: Option<String>,
    /// L3 cache allocation schema.
    #[serde(default, rename = "l3CacheSchema", skip_serializing_if = "Option::is_none")]
    pub l3_cache_schema: Option<String>,
    /// Memory bandwidth allocation schema.
    #[serde(default, rename = "memBwSchema", skip_serializing_if = "Option::is_none")]
    pub mem_bw_schema: Option<String>,
    /// Schemata lines (cdiVersion >= 1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schemata: Option<Vec<String>>,
    /// Enable resctrl monitoring (cdiVersion >= 1.1.0).
    #[serde(default, rename = "enableMonitoring", skip_serializing_if = "Option::is_none")]
    pub enable_monitoring: Option<bool>,
    /// Cache monitoring (before 1.1.0 only).
    #[serde(default, rename = "enableCMT", skip_serializing_if = "Option::is_none")]
    pub enable_cmt: Option<bool>,
    /// Memory bandwidth monitoring (before 1.1.0 only).
    #[serde(default, rename = "enableMBM", skip_serializing_if = "Option::is_none")]
    pub enable_mbm: Option<bool>,
}

/// A host network interface moved into the container (cdiVersion >= 1.1.0).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetDevice {
    /// Interface name on the host.
    pub host_interface_name: String,
    /// Interface name inside the container.
    pub name: String,
}

/// Test fixture shared by the crate's unit tests: a device named `name` holding `/dev/nvidia0`
/// with every field a complete spec needs.
#[cfg(test)]
pub(crate) fn gpu0_device(name: &str) -> Device {
    Device {
        name: name.into(),
        container_edits: ContainerEdits {
            device_nodes: vec![DeviceNode {
                path: "/dev/nvidia0".into(),
                device_type: Some(DeviceType::Char),
                major: Some(195),
                minor: Some(0),
                file_mode: Some(0o666),
                permissions: Some("rw".into()),
                ..Default::default()
            }],
            ..Default::default()
        },
        ..Default::default()
    }
}
