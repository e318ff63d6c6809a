//! The node description: what the simulated node has, in one JSON file.
//!
//! The same file is read by the simulated NVML library (at `nvmlInit`) and by the tree builder, so
//! both always agree on GPUs, minors and UUIDs. Loading reports the file and the field that failed
//! (`gpus[1].uuid`), because a developer editing a description by hand needs to know where.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

pub use crate::schema::{
    Architecture, ComputeInstanceDescription, DriverDescription, DriverPackage, FieldProblem, GpuDescription,
    GpuInstanceDescription, MigDescription, NodeDescription, NvLinkDescription, Telemetry,
};

/// Environment variable naming the node description file. Checked first by the simulated NVML.
pub const NODE_ENV: &str = "NVINJECT_SIM_NODE";

/// Where the simulated NVML looks when neither [`NODE_ENV`] nor an embedded description gives one.
pub const DEFAULT_NODE_PATH: &str = "/etc/nvinject-sim/node.json";

/// NVML's `NVML_NVLINK_MAX_LINKS`: link numbers a GPU can have.
pub const MAX_NVLINKS_PER_GPU: u32 = 18;

/// Why a description could not be used; always names the file and the field.
#[derive(Debug, thiserror::Error)]
pub enum DescriptionError {
    /// The file could not be read.
    #[error("{path}: cannot read node description: {source}")]
    Read {
        /// File that failed.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The JSON is malformed or a field has the wrong type.
    #[error("{path}: field `{field}`: {message}")]
    Parse {
        /// File that failed.
        path: PathBuf,
        /// JSON path of the field, e.g. `gpus[1].uuid`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// The JSON parses but describes an impossible node.
    #[error("{path}: field `{field}`: {message}")]
    Invalid {
        /// File that failed.
        path: PathBuf,
        /// Path of the offending field.
        field: String,
        /// What is wrong and how to fix it.
        message: String,
    },
}

impl NodeDescription {
    /// Reads and validates a description file.
    pub fn load(path: &Path) -> Result<Self, DescriptionError> {
        let bytes =
            std::fs::read(path).map_err(|source| DescriptionError::Read { path: path.to_owned(), source })?;
        Self::from_slice(&bytes, path)
    }

    /// Parses and validates description bytes; `origin` names them in errors.
    pub fn from_slice(bytes: &[u8], origin: &Path) -> Result<Self, DescriptionError> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let node: NodeDescription =
            serde_path_to_error::deserialize(&mut de).map_err(|e| DescriptionError::Parse {
                path: origin.to_owned(),
                field: match e.path().to_string() {
                    p if p == "." => "(top level)".to_owned(),
                    p => p,
                },
                message: e.inner().to_string(),
            })?;
        node.validate().map_err(|p| DescriptionError::Invalid {
            path: origin.to_owned(),
            field: p.field,
            message: p.message,
        })?;
        Ok(node)
    }

    /// Serialises the description as pretty JSON (stable field order).
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("a description always serialises");
        s.push('\n');
        s
    }

    /// Checks what serde cannot: unique identities, well-formed ids, consistent MIG and NVLink data.
    pub fn validate(&self) -> Result<(), FieldProblem> {
        let problem = |field: String, message: String| Err(FieldProblem { field, message });
        if self.driver.version.split('.').count() < 2
            || !self.driver.version.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        {
            return problem(
                "driver.version".into(),
                format!("`{}` is not a driver version such as `550.54.15`", self.driver.version),
            );
        }
        if self.driver.cuda_version < 1000 {
            return problem(
                "driver.cuda_version".into(),
                format!(
                    "{} is not NVML's encoding (1000*major + 10*minor, e.g. 12040)",
                    self.driver.cuda_version
                ),
            );
        }
        let mut uuids = BTreeSet::new();
        let mut minors = BTreeSet::new();
        let mut buses = BTreeSet::new();
        for (i, gpu) in self.gpus.iter().enumerate() {
            let at = |f: &str| format!("gpus[{i}].{f}");
            if !is_uuid_with_prefix(&gpu.uuid, "GPU-") {
                return problem(at("uuid"), format!("`{}` is not `GPU-` + an 8-4-4-4-12 hex UUID", gpu.uuid));
            }
            if !uuids.insert(gpu.uuid.to_ascii_lowercase()) {
                return problem(at("uuid"), format!("`{}` is used by another GPU", gpu.uuid));
            }
            if !is_nvml_bus_id(&gpu.pci_bus_id) {
                return problem(
                    at("pci_bus_id"),
                    format!("`{}` is not NVML's form `00000000:18:00.0`", gpu.pci_bus_id),
                );
            }
            if !buses.insert(gpu.pci_bus_id.to_ascii_lowercase()) {
                return problem(at("pci_bus_id"), format!("`{}` is used by another GPU", gpu.pci_bus_id));
            }
            // 254 and 255 are nvidia-modeset and nvidiactl.
            if gpu.minor >= 254 {
                return problem(at("minor"), format!("{} is reserved; GPU minors are 0..=253", gpu.minor));
            }
            if !minors.insert(gpu.minor) {
                return problem(at("minor"), format!("{} is used by another GPU", gpu.minor));
            }
            if gpu.pci_device_id & 0xffff != 0x10de {
                return problem(
                    at("pci_device_id"),
                    format!("{:#010x} does not end in NVIDIA's vendor id 10de", gpu.pci_device_id),
                );
            }
            if let Some(mig) = &gpu.mig {
                if !mig.enabled && !mig.gpu_instances.is_empty() {
                    return problem(at("mig.gpu_instances"), "GPU instances need `mig.enabled: true`".into());
                }
                let mut gi_ids = BTreeSet::new();
                for (g, gi) in mig.gpu_instances.iter().enumerate() {
                    let gat = |f: &str| format!("gpus[{i}].mig.gpu_instances[{g}].{f}");
                    if !gi_ids.insert(gi.id) {
                        return problem(gat("id"), format!("GPU instance id {} is used twice", gi.id));
                    }
                    let mut ci_ids = BTreeSet::new();
                    for (c, ci) in gi.compute_instances.iter().enumerate() {
                        let cat =
                            |f: &str| format!("gpus[{i}].mig.gpu_instances[{g}].compute_instances[{c}].{f}");
                        if !ci_ids.insert(ci.id) {
                            return problem(
                                cat("id"),
                                format!("compute instance id {} is used twice", ci.id),
                            );
                        }
                        if !is_uuid_with_prefix(&ci.uuid, "MIG-") {
                            return problem(
                                cat("uuid"),
                                format!("`{}` is not `MIG-` + an 8-4-4-4-12 hex UUID", ci.uuid),
                            );
                        }
                        if !uuids.insert(ci.uuid.to_ascii_lowercase()) {
                            return problem(cat("uuid"), format!("`{}` is used by another device", ci.uuid));
                        }
                    }
                }
            }
        }
        for (l, link) in self.nvlinks.iter().enumerate() {
            for g in link.gpus {
                if g >= self.gpus.len() {
                    return problem(
                        format!("nvlinks[{l}].gpus"),
                        format!("GPU {g} does not exist; the node has {} GPUs", self.gpus.len()),
                    );
                }
            }
            if link.gpus[0] == link.gpus[1] {
                return problem(format!("nvlinks[{l}].gpus"), "a GPU cannot be linked to itself".into());
            }
            if link.links == 0 {
                return problem(format!("nvlinks[{l}].links"), "must be at least 1".into());
            }
        }
        // NVML numbers links 0..NVML_NVLINK_MAX_LINKS per GPU; a real A100 has 12, an H100 18.
        for gpu in 0..self.gpus.len() {
            let total: u32 = self.nvlinks.iter().filter(|l| l.gpus.contains(&gpu)).map(|l| l.links).sum();
            if total > MAX_NVLINKS_PER_GPU {
                let first = self.nvlinks.iter().position(|l| l.gpus.contains(&gpu)).unwrap_or(0);
                return problem(
                    format!("nvlinks[{first}].links"),
                    format!(
                        "GPU {gpu} would have {total} NVLink links; NVML numbers at most {MAX_NVLINKS_PER_GPU} per GPU"
                    ),
                );
            }
        }
        crate::mig::check_profiles(self)
    }
}

/// True for `<prefix>xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (hex digits).
pub fn is_uuid_with_prefix(s: &str, prefix: &str) -> bool {
    let Some(rest) = s.strip_prefix(prefix) else { return false };
    let groups: Vec<&str> = rest.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// True for NVML's bus id form `DDDDDDDD:BB:DD.F`.
pub fn is_nvml_bus_id(s: &str) -> bool {
    let b = s.as_bytes();
    let hex = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_hexdigit);
    b.len() == 16
        && hex(0..8)
        && b[8] == b':'
        && hex(9..11)
        && b[11] == b':'
        && hex(12..14)
        && b[14] == b'.'
        && hex(15..16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(json: &str) -> Result<NodeDescription, DescriptionError> {
        NodeDescription::from_slice(json.as_bytes(), Path::new("/x/node.json"))
    }

    #[test]
    fn every_preset_is_valid_and_round_trips() {
        for name in crate::presets::NAMES {
            let node = crate::presets::preset(name).unwrap();
            let again = load(&node.to_json()).unwrap();
            assert_eq!(node, again, "{name}");
        }
    }

    #[test]
    fn type_error_names_file_and_field() {
        let mut v: serde_json::Value =
            serde_json::from_str(&crate::presets::preset("h100x8").unwrap().to_json()).unwrap();
        v["gpus"][1]["minor"] = serde_json::json!("one");
        let err = load(&v.to_string()).unwrap_err().to_string();
        assert!(err.starts_with("/x/node.json: field `gpus[1].minor`"), "{err}");
    }

    #[test]
    fn duplicate_uuid_is_named() {
        let mut node = crate::presets::preset("h100x8").unwrap();
        node.gpus[3].uuid = node.gpus[0].uuid.clone();
        let err = load(&node.to_json()).unwrap_err().to_string();
        assert!(err.contains("gpus[3].uuid") && err.contains("used by another GPU"), "{err}");
    }

    #[test]
    fn too_many_nvlinks_are_named() {
        let mut node = crate::presets::preset("a100-mig").unwrap();
        node.nvlinks[0].links = 12;
        let err = load(&node.to_json()).unwrap_err().to_string();
        assert!(
            err.contains("nvlinks[0].links") && err.contains("GPU 0 would have 20 NVLink links"),
            "{err}"
        );
    }

    #[test]
    fn unknown_field_is_rejected() {
        let err = load(r#"{"name":"x","driver":{"version":"1.2","cuda_version":12000},"gpus":[],"gpu":1}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `gpu`"), "{err}");
    }

    #[test]
    fn bus_id_and_uuid_forms() {
        assert!(is_nvml_bus_id("00000000:18:00.0"));
        assert!(!is_nvml_bus_id("0000:18:00.0"));
        assert!(is_uuid_with_prefix("GPU-12345678-1234-1234-1234-123456789abc", "GPU-"));
        assert!(!is_uuid_with_prefix("GPU-12345678-1234-1234-1234-123456789ab", "GPU-"));
    }
}
