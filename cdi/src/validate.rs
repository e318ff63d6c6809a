//! Semantic checks on a parsed spec: everything the CDI specification requires beyond types.
//!
//! [`validate`] returns every problem at once, each with its field path, so a user fixes a spec in
//! one pass. A spec with problems is refused by the registry, as containerd refuses it.

use std::collections::HashMap;
use std::fmt;

use crate::name::validate_device_name;
use crate::spec::{ContainerEdits, DeviceType, Spec};
use crate::version::{CdiVersion, requirements};

/// OCI hook points a CDI hook may name.
pub const HOOK_NAMES: [&str; 6] =
    ["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"];

/// The `permissions` value that asks for a device cgroup rule with no access (the CDI spec's
/// `none`: the node is created, but the container may not open it).
pub const NO_PERMISSIONS: &str = "none";

/// Linux device numbers: 12 bits of major, 20 of minor (`MINORBITS` in the kernel); larger values
/// would be silently truncated by `makedev`/mknod into some other device.
pub const MAJOR_MAX: i64 = (1 << 12) - 1;
/// The largest Linux minor number; see [`MAJOR_MAX`].
pub const MINOR_MAX: i64 = (1 << 20) - 1;

/// Kubernetes' limit on the total size of annotations, which CDI adopts.
pub const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;

/// One thing wrong with a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Field path, e.g. `devices[1].containerEdits.hooks[0].path`.
    pub field: String,
    /// What is wrong and what would be right.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "field `{}`: {}", self.field, self.message)
    }
}

struct Problems(Vec<Problem>);

impl Problems {
    fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem { field: field.into(), message: message.into() });
    }
}

/// Every rule `spec` breaks; empty when it is valid.
pub fn validate(spec: &Spec) -> Vec<Problem> {
    let mut p = Problems(Vec::new());
    // `kind` and device-node `type` are typed: a malformed one already failed parsing at its field.
    check_version(spec, &mut p);
    check_annotations(&spec.annotations, "annotations", &mut p);
    if spec.devices.is_empty() {
        p.add("devices", "a spec needs at least one device");
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, device) in spec.devices.iter().enumerate() {
        let at = format!("devices[{i}]");
        if let Err(e) = validate_device_name(&device.name) {
            p.add(format!("{at}.name"), e.to_string());
        }
        if let Some(first) = seen.insert(&device.name, i) {
            p.add(
                format!("{at}.name"),
                format!(
                    "duplicate device name `{}` (also devices[{first}]): names must be unique",
                    device.name
                ),
            );
        }
        check_annotations(&device.annotations, &format!("{at}.annotations"), &mut p);
        if device.container_edits.is_empty() {
            p.add(
                format!("{at}.containerEdits"),
                "a device needs at least one edit (a device node, mount, ...)",
            );
        }
        check_edits(&device.container_edits, &format!("{at}.containerEdits"), &mut p);
    }
    check_edits(&spec.container_edits, "containerEdits", &mut p);
    p.0
}

fn check_version(spec: &Spec, p: &mut Problems) {
    let declared = match spec.cdi_version.parse::<CdiVersion>() {
        Ok(v) => v,
        Err(e) => return p.add("cdiVersion", e.to_string()),
    };
    for req in requirements(spec).into_iter().filter(|r| r.version > declared) {
        p.add(
            req.field,
            format!(
                "{} needs cdiVersion {} or later, but the spec declares {}: raise cdiVersion",
                req.feature, req.version, spec.cdi_version
            ),
        );
    }
    if declared >= CdiVersion::V1_1_0 {
        let all = std::iter::once(("containerEdits".to_owned(), &spec.container_edits)).chain(
            spec.devices
                .iter()
                .enumerate()
                .map(|(i, d)| (format!("devices[{i}].containerEdits"), &d.container_edits)),
        );
        for (at, edits) in all {
            if let Some(rdt) = &edits.intel_rdt {
                if rdt.enable_cmt.is_some() {
                    p.add(
                        format!("{at}.intelRdt.enableCMT"),
                        "removed in cdiVersion 1.1.0: use enableMonitoring",
                    );
                }
                if rdt.enable_mbm.is_some() {
                    p.add(
                        format!("{at}.intelRdt.enableMBM"),
                        "removed in cdiVersion 1.1.0: use enableMonitoring",
                    );
                }
            }
        }
    }
}

fn check_env(env: &[String], at: &str, p: &mut Problems) {
    for (i, entry) in env.iter().enumerate() {
        if entry.split_once('=').is_none_or(|(name, _)| name.is_empty()) {
            p.add(format!("{at}[{i}]"), format!("`{entry}` is not of the form NAME=value"));
        }
    }
}

fn check_absolute(path: &str, field: String, what: &str, p: &mut Problems) {
    if path.is_empty() {
        p.add(field, format!("{what} is empty"));
    } else if !path.starts_with('/') {
        p.add(field, format!("{what} `{path}` is not absolute: paths in a CDI spec must start with /"));
    }
}

fn check_edits(edits: &ContainerEdits, at: &str, p: &mut Problems) {
    check_env(&edits.env, &format!("{at}.env"), p);
    for (i, node) in edits.device_nodes.iter().enumerate() {
        let at = format!("{at}.deviceNodes[{i}]");
        check_absolute(&node.path, format!("{at}.path"), "device path", p);
        if let Some(host) = &node.host_path {
            check_absolute(host, format!("{at}.hostPath"), "device host path", p);
        }
        for (field, number, max) in [("major", node.major, MAJOR_MAX), ("minor", node.minor, MINOR_MAX)] {
            match number {
                Some(n) if n < 0 => {
                    p.add(format!("{at}.{field}"), format!("{field} number must not be negative"))
                }
                Some(n) if n > max => p.add(
                    format!("{at}.{field}"),
                    format!("{field} number {n} is out of range: Linux {field} numbers are 0..={max}"),
                ),
                _ => {}
            }
        }
        // `type`, `major`, `minor` and `fileMode` may each be left out: the runtime fills them
        // from the host device file when it applies the spec (`crate::fill`), as the reference
        // library does and as nvidia-ctk relies on (it writes no `type`, and no `minor` when it is
        // 0). Only a FIFO can never carry numbers.
        if node.device_type == Some(DeviceType::Fifo) && (node.major.is_some() || node.minor.is_some()) {
            p.add(
                format!("{at}.type"),
                "a FIFO (type p) has no major/minor numbers: drop them, or use type b, c or u",
            );
        }
        if let Some(perms) = &node.permissions
            && perms != NO_PERMISSIONS
            && let Some(c) = perms.chars().find(|c| !matches!(c, 'r' | 'w' | 'm'))
        {
            p.add(
                format!("{at}.permissions"),
                format!(
                    "permissions `{perms}` contain `{c}`: use any of r (read), w (write), m (mknod), \
                     or `{NO_PERMISSIONS}` for an empty cgroup rule"
                ),
            );
        }
        if node.file_mode.is_some_and(|m| m > 0o7777) {
            p.add(format!("{at}.fileMode"), "fileMode holds permission bits only (at most 0o7777)");
        }
    }
    for (i, mount) in edits.mounts.iter().enumerate() {
        let at = format!("{at}.mounts[{i}]");
        check_absolute(&mount.container_path, format!("{at}.containerPath"), "mount container path", p);
        let is_bind = mount.options.iter().any(|o| o == "bind" || o == "rbind")
            || mount.mount_type.as_deref().is_none_or(|t| t.is_empty() || t == "bind" || t == "none");
        if is_bind {
            check_absolute(&mount.host_path, format!("{at}.hostPath"), "bind mount host path", p);
        } else if mount.host_path.is_empty() {
            p.add(format!("{at}.hostPath"), "mount source is empty");
        }
    }
    for (i, hook) in edits.hooks.iter().enumerate() {
        let at = format!("{at}.hooks[{i}]");
        if !HOOK_NAMES.contains(&hook.hook_name.as_str()) {
            p.add(
                format!("{at}.hookName"),
                format!("unknown hook name `{}`: use one of {}", hook.hook_name, HOOK_NAMES.join(", ")),
            );
        }
        check_absolute(&hook.path, format!("{at}.path"), "hook path", p);
        check_env(&hook.env, &format!("{at}.env"), p);
        if hook.timeout.is_some_and(|t| t <= 0) {
            p.add(format!("{at}.timeout"), "timeout must be greater than zero seconds (or left out)");
        }
    }
    if let Some(clos) = edits.intel_rdt.as_ref().and_then(|r| r.clos_id.as_deref())
        && (clos.len() >= 4096 || clos == "." || clos == ".." || clos.contains(['/', '\n']))
    {
        p.add(format!("{at}.intelRdt.closID"), format!("`{clos}` is not a valid resctrl group name"));
    }
    let mut hosts = HashMap::new();
    let mut names = HashMap::new();
    for (i, dev) in edits.net_devices.iter().enumerate() {
        let at = format!("{at}.netDevices[{i}]");
        for (field, value, seen) in
            [("hostInterfaceName", &dev.host_interface_name, &mut hosts), ("name", &dev.name, &mut names)]
        {
            if value.is_empty() {
                p.add(format!("{at}.{field}"), "interface name is empty");
            } else if let Some(first) = seen.insert(value.as_str(), i) {
                p.add(
                    format!("{at}.{field}"),
                    format!("duplicate interface `{value}` (also netDevices[{first}])"),
                );
            }
        }
    }
}

/// Annotation keys follow Kubernetes' rules: an optional DNS subdomain prefix and `/`, then a name
/// of at most 63 letters, digits, `-`, `_`, `.`, starting and ending with a letter or digit. Like
/// Kubernetes' own annotation check, the prefix is lower-cased before it is checked, so `Vendor.io/x`
/// is accepted where `vendor_io/x` is not.
fn check_annotations(annotations: &std::collections::BTreeMap<String, String>, at: &str, p: &mut Problems) {
    let mut total = 0;
    for (key, value) in annotations {
        total += key.len() + value.len();
        if let Some(why) = annotation_key_problem(key) {
            p.add(format!("{at}.{key}"), format!("annotation key `{key}` {why}"));
        }
    }
    if total > ANNOTATIONS_MAX_BYTES {
        p.add(at, format!("annotations total {total} bytes; the limit is {ANNOTATIONS_MAX_BYTES}"));
    }
}

/// True for a DNS subdomain as Kubernetes checks the prefix of an annotation or label key (RFC 1123:
/// dot-separated labels of 1 to 63 letters, digits and '-', not starting or ending with '-', at most
/// 253 characters), case ignored as the API server lowers keys first. The one rule for both the
/// annotation keys of a spec and nvinject's annotation prefixes ([`crate::nvinject::check_annotation_prefix`]).
pub fn is_dns_subdomain(s: &str) -> bool {
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    !s.is_empty() && s.len() <= 253 && s.split('.').all(label_ok)
}

fn annotation_key_problem(key: &str) -> Option<&'static str> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if prefix.is_some_and(|p| !is_dns_subdomain(p)) {
        return Some("has a prefix that is not a DNS subdomain (letters, digits, '-' and '.' only)");
    }
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if name.is_empty() || name.len() > 63 {
        return Some("needs a name part of 1 to 63 characters after the prefix");
    }
    if !edge_ok(name.chars().next())
        || !edge_ok(name.chars().last())
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Some("must use letters, digits, '-', '_', '.' and start and end with a letter or digit");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Hook, Mount};

    fn valid() -> Spec {
        Spec {
            cdi_version: "0.6.0".into(),
            kind: "nvidia.com/gpu".parse().unwrap(),
            devices: vec![crate::spec::gpu0_device("0")],
            container_edits: ContainerEdits {
                mounts: vec![Mount {
                    host_path: "/usr/lib/libcuda.so.1".into(),
                    container_path: "/usr/lib/libcuda.so.1".into(),
                    options: vec!["ro".into(), "rbind".into()],
                    ..Default::default()
                }],
                hooks: vec![Hook {
                    hook_name: "createContainer".into(),
                    path: "/usr/local/nvinject/bin/nvinject-hook".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
            annotations: [("nvinject.io/driver-version".to_owned(), "550.54.15".to_owned())].into(),
        }
    }

    #[test]
    fn the_largest_linux_device_numbers_are_accepted() {
        let mut spec = valid();
        let node = &mut spec.devices[0].container_edits.device_nodes[0];
        node.major = Some(MAJOR_MAX);
        node.minor = Some(MINOR_MAX);
        assert_eq!(validate(&spec), []);
    }

    #[test]
    fn a_valid_spec_has_no_problems() {
        assert_eq!(validate(&valid()), vec![]);
    }

    /// Each mutation breaks exactly one rule; the problem names that field.
    #[test]
    fn each_broken_rule_is_reported_at_its_field() {
        type Mutation = fn(&mut Spec);
        let cases: Vec<(Mutation, &str, &str)> = vec![
            (|s| s.cdi_version = "0.9.0".into(), "cdiVersion", "not a released CDI version"),
            (|s| s.cdi_version = "0.5.0".into(), "annotations", "needs cdiVersion 0.6.0"),
            (|s| s.devices.clear(), "devices", "at least one device"),
            (|s| s.devices[0].name = "gpu 0".into(), "devices[0].name", "contains ` `"),
            (
                |s| s.devices.push(s.devices[0].clone()),
                "devices[1].name",
                "duplicate device name `0` (also devices[0])",
            ),
            (
                |s| s.devices[0].container_edits = ContainerEdits::default(),
                "devices[0].containerEdits",
                "at least one edit",
            ),
            (
                |s| s.devices[0].container_edits.device_nodes[0].path = "dev/nvidia0".into(),
                "devices[0].containerEdits.deviceNodes[0].path",
                "not absolute",
            ),
            (
                |s| s.devices[0].container_edits.device_nodes[0].permissions = Some("rwx".into()),
                "devices[0].containerEdits.deviceNodes[0].permissions",
                "contain `x`",
            ),
            (
                |s| s.devices[0].container_edits.device_nodes[0].major = Some(1 << 40),
                "devices[0].containerEdits.deviceNodes[0].major",
                "major number 1099511627776 is out of range: Linux major numbers are 0..=4095",
            ),
            (
                |s| s.devices[0].container_edits.device_nodes[0].major = Some(4096),
                "devices[0].containerEdits.deviceNodes[0].major",
                "out of range",
            ),
            (
                |s| s.devices[0].container_edits.device_nodes[0].minor = Some(1 << 20),
                "devices[0].containerEdits.deviceNodes[0].minor",
                "minor number 1048576 is out of range: Linux minor numbers are 0..=1048575",
            ),
            (
                |s| s.devices[0].container_edits.device_nodes[0].device_type = Some(DeviceType::Fifo),
                "devices[0].containerEdits.deviceNodes[0].type",
                "a FIFO (type p) has no major/minor numbers",
            ),
            (
                |s| {
                    let node = &mut s.devices[0].container_edits.device_nodes[0];
                    (node.device_type, node.major) = (Some(DeviceType::Fifo), None);
                },
                "devices[0].containerEdits.deviceNodes[0].type",
                "drop them, or use type b, c or u",
            ),
            (
                |s| s.devices[0].container_edits.device_nodes[0].permissions = Some("nones".into()),
                "devices[0].containerEdits.deviceNodes[0].permissions",
                "or `none` for an empty cgroup rule",
            ),
            (
                |s| s.devices[0].container_edits.device_nodes[0].file_mode = Some(0o20666),
                "devices[0].containerEdits.deviceNodes[0].fileMode",
                "permission bits only",
            ),
            (
                |s| s.devices[0].container_edits.device_nodes[0].host_path = Some("dev/nvidia0".into()),
                "devices[0].containerEdits.deviceNodes[0].hostPath",
                "not absolute",
            ),
            (
                |s| s.devices[0].container_edits.device_nodes[0].minor = Some(-1),
                "devices[0].containerEdits.deviceNodes[0].minor",
                "must not be negative",
            ),
            (
                |s| s.container_edits.mounts[0].host_path = "libcuda.so.1".into(),
                "containerEdits.mounts[0].hostPath",
                "not absolute",
            ),
            (
                |s| s.container_edits.mounts[0].container_path = String::new(),
                "containerEdits.mounts[0].containerPath",
                "is empty",
            ),
            (
                |s| s.container_edits.hooks[0].hook_name = "create".into(),
                "containerEdits.hooks[0].hookName",
                "unknown hook name",
            ),
            (
                |s| s.container_edits.hooks[0].path = "nvinject-hook".into(),
                "containerEdits.hooks[0].path",
                "not absolute",
            ),
            (
                |s| s.container_edits.hooks[0].timeout = Some(0),
                "containerEdits.hooks[0].timeout",
                "greater than zero",
            ),
            (|s| s.container_edits.env.push("NOVALUE".into()), "containerEdits.env[0]", "NAME=value"),
            (
                |s| {
                    s.annotations.insert("Bad_Prefix.io/x".into(), "v".into());
                },
                "annotations.Bad_Prefix.io/x",
                "not a DNS subdomain",
            ),
        ];
        for (mutate, field, message) in cases {
            let mut spec = valid();
            mutate(&mut spec);
            let problems = validate(&spec);
            assert_eq!(problems.len(), 1, "{field}: {problems:?}");
            assert_eq!(problems[0].field, field);
            assert!(
                problems[0].message.contains(message),
                "{field}: `{}` lacks `{message}`",
                problems[0].message
            );
        }
    }

    /// The CDI spec makes `type`, `major`, `minor` and `fileMode` optional (the runtime fills them
    /// from the host device); nvidia-ctk 1.20 writes no `type` and no `minor` when it is 0.
    #[test]
    fn device_nodes_may_leave_out_type_numbers_and_mode() {
        type Mutation = fn(&mut crate::spec::DeviceNode);
        let cases: Vec<(&str, Mutation)> = vec![
            ("no type (nvidia-ctk)", |n| n.device_type = None),
            ("no type, no minor (nvidia-ctk for minor 0)", |n| (n.device_type, n.minor) = (None, None)),
            ("type only", |n| (n.major, n.minor, n.file_mode) = (None, None, None)),
            ("path only", |n| (n.device_type, n.major, n.minor, n.file_mode) = (None, None, None, None)),
            ("minor without major", |n| n.major = None),
            ("major without minor", |n| n.minor = None),
            ("a FIFO without numbers", |n| {
                (n.device_type, n.major, n.minor) = (Some(DeviceType::Fifo), None, None)
            }),
            ("unbuffered char", |n| n.device_type = Some(DeviceType::Unbuffered)),
            ("permissions none", |n| n.permissions = Some(NO_PERMISSIONS.into())),
            ("permissions empty", |n| n.permissions = Some(String::new())),
        ];
        for (what, mutate) in cases {
            let mut spec = valid();
            mutate(&mut spec.devices[0].container_edits.device_nodes[0]);
            assert_eq!(validate(&spec), [], "{what}");
        }
    }

    #[test]
    fn non_bind_mounts_may_name_a_filesystem_source() {
        let mut spec = valid();
        spec.cdi_version = "0.6.0".into();
        spec.container_edits.mounts[0] = Mount {
            host_path: "tmpfs".into(),
            container_path: "/scratch".into(),
            mount_type: Some("tmpfs".into()),
            options: vec!["size=1m".into()],
        };
        assert_eq!(validate(&spec), vec![]);
    }
}
