//! NVIDIA's device plugin config file (version `v1`) as written: the serde schema, every key
//! optional, field names NVIDIA's, and the bounded reader. Keys NVIDIA's plugin has but nvinject
//! does not act on are kept here as untyped values so that [`super::resolve()`] can report them;
//! unknown keys are refused by the schema with their path. Pure, except [`load_file`].

use std::path::{Path, PathBuf};

use nvinject_cdi::Kind;
use nvinject_cdi::yaml::{YamlLimits, from_yaml};
use serde::{Deserialize, Serialize};

use super::error::ConfigError;
use crate::duration::GoDuration;
use crate::settings::{DeviceIdStrategy, MigStrategy, parse_cdi_kind};

/// The only config file version there is.
pub const CONFIG_VERSION: &str = "v1";

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
    /// Time-slicing or MPS.
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
    /// Accepted and ignored: NVIDIA's root for the MPS daemons its own DaemonSet starts; nvinject
    /// uses the operator's daemon at `flags.plugin.mpsPipeDir`.
    pub mps_root: Option<serde_json::Value>,
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
    /// Where the driver root (`nvidiaDriverRoot`, as the host sees it) is mounted for the plugin,
    /// when it runs in a container: NVML is loaded from here and a regenerated CDI spec still
    /// names the host's paths.
    pub container_driver_root: Option<PathBuf>,
    /// nvinject: the kubelet's registration socket; plugin sockets are created next to it.
    pub kubelet_socket: Option<PathBuf>,
    /// nvinject: path of `libnvidia-ml.so.1` (default: found under the driver root).
    pub nvml_library: Option<PathBuf>,
    /// nvinject: proc root for `driver/nvidia-caps/mig-minors` (MIG DeviceSpecs).
    pub proc_root: Option<PathBuf>,
    /// nvinject: CDI kind of the names handed out (`nvidia.com/gpu`).
    #[serde(default, deserialize_with = "deserialize_kind")]
    pub cdi_kind: Option<Kind>,
    /// nvinject: NFD features file for node labels; empty string disables.
    pub features_file: Option<String>,
    /// nvinject: `host:port` (or a bare port, bound to 127.0.0.1) for `/metrics`; empty disables.
    pub metrics_address: Option<String>,
    /// nvinject: the node's MPS control daemon's pipe directory as the host sees it (the
    /// `--mps-pipe-dir` the CDI spec is generated with); `sharing.mps` needs it.
    pub mps_pipe_dir: Option<PathBuf>,
}

/// `sharing:`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileSharing {
    /// Time-slicing replicas.
    pub time_slicing: Option<FileTimeSlicing>,
    /// MPS replicas: the same keys as `timeSlicing`; `null` is no MPS.
    pub mps: Option<FileTimeSlicing>,
}

/// `sharing.timeSlicing:` and `sharing.mps:`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileTimeSlicing {
    /// Advertise `<name>.shared` unless a resource says `rename`.
    #[serde(default)]
    pub rename_by_default: bool,
    /// Refuse a container asking for more than one replica; unset: no for time-slicing, yes for
    /// MPS (NVIDIA's defaults).
    pub fail_requests_greater_than_one: Option<bool>,
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

/// `flags.plugin.cdiKind`, checked by CDI's rules while the file is read, so a refusal names the
/// file and the field.
fn deserialize_kind<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Kind>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(|s| parse_cdi_kind(&s).map_err(serde::de::Error::custom))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConfigFile, ConfigError> {
        parse_file(text, Path::new("/etc/cfg.yaml"))
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
}
