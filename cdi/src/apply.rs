//! Applying CDI container edits to an OCI runtime spec (`config.json`).
//!
//! The OCI spec is handled as a `serde_json::Value`, not a typed struct: the runtime spec keeps
//! growing, and a round trip through a typed model would drop fields it does not know (and change
//! their order). Only the paths edits touch are read or created; everything else is kept as it was.
//!
//! The semantics are the CDI reference library's, which containerd and podman use, so a container
//! looks the same whichever of them injected its devices:
//! - env `NAME=value` replaces an existing `NAME=` entry in place, else is appended;
//! - a device node replaces any node at the same path, gets the container user's uid/gid when the
//!   spec sets none, and char/block nodes get a device-cgroup allow rule (`rwm` unless the spec says);
//! - a mount replaces any mount at the same destination, and afterwards all mounts are stably
//!   sorted by destination depth so parents are mounted before their children;
//! - hooks are appended under their hook point; additional gids are added once each (0 ignored);
//! - unlike the reference library, a hook without `env` gets [`HOOK_ENV`] instead of nothing:
//!   runc hands a hook with no `env` the container's environment, so an image's loader variables
//!   (`LD_PRELOAD`, ...) would run image code as root on the host in a hook another tool's spec
//!   declared. A hook that sets `env` keeps exactly its own.
//!
//! Applying never looks at the host: device nodes must be complete (type, and major/minor unless a
//! FIFO). A spec may leave those out; [`crate::fill`] completes them from the host device file
//! first, at the OS edge, and a node still incomplete here is an error, not a reason to `stat`.

use serde_json::{Map, Value, json};

use crate::spec::{ContainerEdits, DeviceNode, DeviceType, HOOK_ENV, Hook, Mount};

/// The OCI spec has a value of the wrong type where an edit must go, or an edit is incomplete.
/// Each message starts with where: an OCI field path (`linux.devices`) or the CDI edit
/// (`deviceNodes[/dev/nvidia0]`); [`ApplyError::field`] gives that part alone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The OCI spec is not a JSON object at all.
    #[error("(root): the OCI spec is not a JSON object")]
    NotAnObject,
    /// A value on the path an edit writes through has the wrong JSON type.
    #[error("{field}: must be {expected}, found {found}")]
    WrongType {
        /// The OCI field path, e.g. `process.env`.
        field: String,
        /// What it must be: `an object` or `an array`.
        expected: &'static str,
        /// What it is: `a string`, `a number`, ...
        found: &'static str,
    },
    /// A container an edit writes into could not be made (the shapes were checked first, so
    /// this means a path was written twice in conflicting ways).
    #[error("{field}: must be {expected}")]
    NotContainer {
        /// The OCI field path (`(root)` for the top).
        field: String,
        /// `an object` or `an array`.
        expected: &'static str,
    },
    /// An edit was given no OCI path to write to (a bug in this module, reported rather than a panic).
    #[error("(root): empty path")]
    EmptyPath,
    /// The Intel RDT edit could not be turned into JSON.
    #[error("intelRdt: {0}")]
    IntelRdt(String),
    /// A device node has no `type`.
    #[error("deviceNodes[{path}]: has no type; complete it from the host device first (nvinject_cdi::fill)")]
    NodeWithoutType {
        /// The node's container path.
        path: String,
    },
    /// A char, block or unbuffered node has no major or minor number.
    #[error(
        "deviceNodes[{path}]: has no major/minor number; complete it from the host device first (nvinject_cdi::fill)"
    )]
    NodeWithoutNumbers {
        /// The node's container path.
        path: String,
    },
}

impl ApplyError {
    /// Where the error is: the OCI field path or the CDI edit, as the message starts.
    pub fn field(&self) -> String {
        match self {
            ApplyError::NotAnObject | ApplyError::EmptyPath => "(root)".into(),
            ApplyError::WrongType { field, .. } | ApplyError::NotContainer { field, .. } => field.clone(),
            ApplyError::IntelRdt(_) => "intelRdt".into(),
            ApplyError::NodeWithoutType { path } | ApplyError::NodeWithoutNumbers { path } => {
                format!("deviceNodes[{path}]")
            }
        }
    }
}

fn not_container(path: &[&str], expected: &'static str) -> ApplyError {
    ApplyError::NotContainer { field: path.join("."), expected }
}

/// Applies `edits` to the OCI spec `oci` (see the module docs for the rules).
pub fn apply_edits(oci: &mut Value, edits: &ContainerEdits) -> Result<(), ApplyError> {
    // Check everything that can fail on the edits themselves first, so a failure leaves `oci` as is.
    for node in &edits.device_nodes {
        oci_device(node, (None, None))?;
    }
    if !oci.is_object() {
        return Err(ApplyError::NotAnObject);
    }
    check_shapes(oci, edits)?;

    if !edits.env.is_empty() {
        let env = array_at(oci, &["process", "env"])?;
        for entry in &edits.env {
            set_env(env, entry);
        }
    }
    if !edits.device_nodes.is_empty() {
        let user = process_user(oci);
        for node in &edits.device_nodes {
            add_device(oci, node, user)?;
        }
    }
    if !edits.mounts.is_empty() {
        let mounts = array_at(oci, &["mounts"])?;
        for mount in &edits.mounts {
            mounts.retain(|m| {
                m.get("destination").and_then(Value::as_str) != Some(mount.container_path.as_str())
            });
            mounts.push(oci_mount(mount));
        }
        // Stable: among mounts of equal depth the original order (and so the later-wins rule) stays.
        mounts.sort_by_key(|m| m.get("destination").and_then(Value::as_str).map(depth).unwrap_or(0));
    }
    for hook in &edits.hooks {
        array_at(oci, &["hooks", hook.hook_name.as_str()])?.push(oci_hook(hook));
    }
    let gids: Vec<u32> = edits.additional_gids.iter().copied().filter(|g| *g != 0).collect();
    if !gids.is_empty() {
        let list = array_at(oci, &["process", "user", "additionalGids"])?;
        for gid in gids {
            if !list.iter().any(|g| g.as_u64() == Some(u64::from(gid))) {
                list.push(json!(gid));
            }
        }
    }
    if let Some(rdt) = &edits.intel_rdt {
        let value = serde_json::to_value(rdt).map_err(|e| ApplyError::IntelRdt(e.to_string()))?;
        object_at(oci, &["linux"])?.insert("intelRdt".to_owned(), value);
    }
    if !edits.net_devices.is_empty() {
        let net = object_at(oci, &["linux", "netDevices"])?;
        for dev in &edits.net_devices {
            net.insert(dev.host_interface_name.clone(), json!({ "name": dev.name }));
        }
    }
    Ok(())
}

/// Whether the OCI spec already has a device node at `path` (containerd's own CDI support, or a
/// `--device`, may have put it there).
pub fn has_device_node(oci: &Value, path: &str) -> bool {
    oci.pointer("/linux/devices")
        .and_then(Value::as_array)
        .is_some_and(|devs| devs.iter().any(|d| d.get("path").and_then(Value::as_str) == Some(path)))
}

/// Number of path components of a mount destination: `/` is 0, `/a/b` is 2.
fn depth(destination: &str) -> usize {
    destination.split('/').filter(|c| !c.is_empty() && *c != ".").count()
}

/// Fails before any change when a path edits must write through holds a non-object/non-array.
fn check_shapes(oci: &Value, edits: &ContainerEdits) -> Result<(), ApplyError> {
    let mut arrays: Vec<Vec<&str>> = Vec::new();
    if !edits.env.is_empty() {
        arrays.push(vec!["process", "env"]);
    }
    if !edits.device_nodes.is_empty() {
        arrays.push(vec!["linux", "devices"]);
        arrays.push(vec!["linux", "resources", "devices"]);
    }
    if !edits.mounts.is_empty() {
        arrays.push(vec!["mounts"]);
    }
    for hook in &edits.hooks {
        arrays.push(vec!["hooks", hook.hook_name.as_str()]);
    }
    if edits.additional_gids.iter().any(|g| *g != 0) {
        arrays.push(vec!["process", "user", "additionalGids"]);
    }
    if !edits.net_devices.is_empty() {
        check_path(oci, &["linux", "netDevices"], Value::is_object, "an object")?;
    }
    if edits.intel_rdt.is_some() {
        check_path(oci, &["linux"], Value::is_object, "an object")?;
    }
    for path in arrays {
        check_path(oci, &path, Value::is_array, "an array")?;
    }
    Ok(())
}

fn check_path(
    oci: &Value,
    path: &[&str],
    ok: fn(&Value) -> bool,
    what: &'static str,
) -> Result<(), ApplyError> {
    let mut at = oci;
    for (i, key) in path.iter().enumerate() {
        let Some(next) = at.get(*key).filter(|v| !v.is_null()) else {
            return Ok(());
        };
        let last = i + 1 == path.len();
        let good = if last { ok(next) } else { next.is_object() };
        if !good {
            let expected = if last { what } else { "an object" };
            return Err(ApplyError::WrongType {
                field: path[..=i].join("."),
                expected,
                found: kind_of(next),
            });
        }
        at = next;
    }
    Ok(())
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The object at `path`, creating empty objects along the way (null counts as absent).
fn object_at<'a>(oci: &'a mut Value, path: &[&str]) -> Result<&'a mut Map<String, Value>, ApplyError> {
    let mut at = oci;
    for (i, key) in path.iter().enumerate() {
        let map = at.as_object_mut().ok_or_else(|| not_container(&path[..i], "an object"))?;
        let slot = map.entry((*key).to_owned()).or_insert_with(|| json!({}));
        if slot.is_null() {
            *slot = json!({});
        }
        at = slot;
    }
    at.as_object_mut().ok_or_else(|| not_container(path, "an object"))
}

/// The array at `path`, creating it (and its parents) when absent.
fn array_at<'a>(oci: &'a mut Value, path: &[&str]) -> Result<&'a mut Vec<Value>, ApplyError> {
    let (last, parents) = path.split_last().ok_or(ApplyError::EmptyPath)?;
    let parent = object_at(oci, parents)?;
    let slot = parent.entry((*last).to_owned()).or_insert_with(|| json!([]));
    if slot.is_null() {
        *slot = json!([]);
    }
    slot.as_array_mut().ok_or_else(|| not_container(path, "an array"))
}

fn set_env(env: &mut Vec<Value>, entry: &str) {
    let name = entry.split_once('=').map_or(entry, |(n, _)| n);
    let existing =
        env.iter_mut().find(|e| e.as_str().is_some_and(|s| s.split_once('=').map_or(s, |(n, _)| n) == name));
    match existing {
        Some(slot) => *slot = json!(entry),
        None => env.push(json!(entry)),
    }
}

fn process_user(oci: &Value) -> (Option<u32>, Option<u32>) {
    let read = |key: &str| {
        oci.pointer(&format!("/process/user/{key}"))
            .and_then(Value::as_u64)
            .and_then(|v| u32::try_from(v).ok())
            .filter(|v| *v > 0)
    };
    (read("uid"), read("gid"))
}

/// The OCI `linux.devices` entry for a CDI node; the container user's ids fill in unset uid/gid.
fn oci_device(node: &DeviceNode, user: (Option<u32>, Option<u32>)) -> Result<Map<String, Value>, ApplyError> {
    let device_type =
        node.device_type.ok_or_else(|| ApplyError::NodeWithoutType { path: node.path.clone() })?;
    let mut dev = Map::new();
    dev.insert("path".into(), json!(node.path));
    dev.insert("type".into(), json!(device_type.as_str()));
    if device_type != DeviceType::Fifo {
        let (Some(major), Some(minor)) = (node.major, node.minor) else {
            return Err(ApplyError::NodeWithoutNumbers { path: node.path.clone() });
        };
        dev.insert("major".into(), json!(major));
        dev.insert("minor".into(), json!(minor));
    }
    if let Some(mode) = node.file_mode {
        dev.insert("fileMode".into(), json!(mode));
    }
    if let Some(uid) = node.uid.or(user.0) {
        dev.insert("uid".into(), json!(uid));
    }
    if let Some(gid) = node.gid.or(user.1) {
        dev.insert("gid".into(), json!(gid));
    }
    Ok(dev)
}

fn add_device(
    oci: &mut Value,
    node: &DeviceNode,
    user: (Option<u32>, Option<u32>),
) -> Result<(), ApplyError> {
    let dev = oci_device(node, user)?;
    let devices = array_at(oci, &["linux", "devices"])?;
    devices.retain(|d| d.get("path").and_then(Value::as_str) != Some(node.path.as_str()));
    devices.push(Value::Object(dev));
    if let Some(device_type) = node.device_type.filter(|t| t.has_cgroup_rule()) {
        // Unset or empty means all access; `none` asks for a rule with none (the CDI spec's words).
        let access = match node.permissions.as_deref() {
            None | Some("") => "rwm",
            Some(crate::validate::NO_PERMISSIONS) => "",
            Some(p) => p,
        };
        array_at(oci, &["linux", "resources", "devices"])?.push(json!({
            "allow": true,
            "type": device_type.as_str(),
            "major": node.major,
            "minor": node.minor,
            "access": access,
        }));
    }
    Ok(())
}

fn oci_mount(mount: &Mount) -> Value {
    let mut m = Map::new();
    m.insert("destination".into(), json!(mount.container_path));
    if let Some(t) = &mount.mount_type {
        m.insert("type".into(), json!(t));
    }
    m.insert("source".into(), json!(mount.host_path));
    if !mount.options.is_empty() {
        m.insert("options".into(), json!(mount.options));
    }
    Value::Object(m)
}

fn oci_hook(hook: &Hook) -> Value {
    let mut h = Map::new();
    h.insert("path".into(), json!(hook.path));
    if !hook.args.is_empty() {
        h.insert("args".into(), json!(hook.args));
    }
    if hook.env.is_empty() {
        h.insert("env".into(), json!(HOOK_ENV));
    } else {
        h.insert("env".into(), json!(hook.env));
    }
    if let Some(t) = hook.timeout {
        h.insert("timeout".into(), json!(t));
    }
    Value::Object(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{IntelRdt, NetDevice};

    fn node(path: &str, minor: i64) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            device_type: Some(DeviceType::Char),
            major: Some(195),
            minor: Some(minor),
            file_mode: Some(0o666),
            ..Default::default()
        }
    }

    fn base() -> Value {
        json!({
            "ociVersion": "1.0.2-dev",
            "process": {"user": {"uid": 0, "gid": 0}, "env": ["PATH=/bin", "NVIDIA_DRIVER_CAPABILITIES=compute"],
                        "args": ["sh"], "futureProcessField": {"x": 1}},
            "root": {"path": "rootfs"},
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
                {"destination": "/dev/shm", "type": "tmpfs", "source": "shm"}
            ],
            "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}, "namespaces": [{"type": "pid"}]},
            "someFutureField": [1, 2, 3]
        })
    }

    #[test]
    fn device_nodes_get_cgroup_rules_and_replace_same_path() {
        let mut oci = base();
        let mut first = node("/dev/nvidia0", 0);
        first.minor = Some(99);
        let edits = ContainerEdits {
            device_nodes: vec![first, node("/dev/nvidia0", 0), node("/dev/nvidiactl", 255)],
            ..Default::default()
        };
        apply_edits(&mut oci, &edits).unwrap();
        let devices = oci["linux"]["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 2, "same path replaced, not duplicated: {devices:?}");
        assert_eq!(
            devices[0],
            json!({"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 0o666})
        );
        let rules = oci["linux"]["resources"]["devices"].as_array().unwrap();
        assert_eq!(rules[0], json!({"allow": false, "access": "rwm"}), "the deny-all rule stays first");
        assert!(
            rules.contains(&json!({"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rwm"}))
        );
        assert!(
            rules.contains(&json!({"allow": true, "type": "c", "major": 195, "minor": 255, "access": "rwm"}))
        );
        assert!(has_device_node(&oci, "/dev/nvidiactl"));
        assert!(!has_device_node(&oci, "/dev/nvidia1"));
    }

    #[test]
    fn non_root_users_own_injected_nodes_unless_the_spec_says() {
        let mut oci = base();
        oci["process"]["user"] = json!({"uid": 1000, "gid": 1001});
        let mut owned = node("/dev/nvidia1", 1);
        owned.uid = Some(5);
        owned.permissions = Some("rw".into());
        apply_edits(
            &mut oci,
            &ContainerEdits { device_nodes: vec![node("/dev/nvidia0", 0), owned], ..Default::default() },
        )
        .unwrap();
        assert_eq!(oci["linux"]["devices"][0]["uid"], json!(1000));
        assert_eq!(oci["linux"]["devices"][0]["gid"], json!(1001));
        assert_eq!(oci["linux"]["devices"][1]["uid"], json!(5));
        assert_eq!(oci["linux"]["resources"]["devices"][2]["access"], json!("rw"));
    }

    #[test]
    fn permissions_none_gives_a_rule_with_no_access() {
        let mut oci = base();
        let mut none = node("/dev/nvidia0", 0);
        none.permissions = Some("none".into());
        apply_edits(&mut oci, &ContainerEdits { device_nodes: vec![none], ..Default::default() }).unwrap();
        assert_eq!(
            oci["linux"]["resources"]["devices"][1],
            json!({"allow": true, "type": "c", "major": 195, "minor": 0, "access": ""})
        );
    }

    #[test]
    fn env_replaces_by_name_and_appends_new_names() {
        let mut oci = base();
        let edits = ContainerEdits {
            env: vec!["NVIDIA_DRIVER_CAPABILITIES=all".into(), "NVIDIA_VISIBLE_DEVICES=void".into()],
            ..Default::default()
        };
        apply_edits(&mut oci, &edits).unwrap();
        assert_eq!(
            oci["process"]["env"],
            json!(["PATH=/bin", "NVIDIA_DRIVER_CAPABILITIES=all", "NVIDIA_VISIBLE_DEVICES=void"])
        );
    }

    #[test]
    fn mounts_replace_same_destination_and_sort_by_depth() {
        let mut oci = base();
        let m = |host: &str, ctr: &str| Mount {
            host_path: host.into(),
            container_path: ctr.into(),
            options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "bind".into()],
            ..Default::default()
        };
        let edits = ContainerEdits {
            mounts: vec![
                m("/drv/usr/lib/x86_64-linux-gnu/libcuda.so.550", "/usr/lib/x86_64-linux-gnu/libcuda.so.550"),
                m("/drv/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi"),
                m("/new-shm", "/dev/shm"),
            ],
            ..Default::default()
        };
        apply_edits(&mut oci, &edits).unwrap();
        let dests: Vec<&str> =
            oci["mounts"].as_array().unwrap().iter().map(|m| m["destination"].as_str().unwrap()).collect();
        assert_eq!(
            dests,
            ["/proc", "/dev", "/dev/shm", "/usr/bin/nvidia-smi", "/usr/lib/x86_64-linux-gnu/libcuda.so.550"]
        );
        let shm = &oci["mounts"][2];
        assert_eq!(shm["source"], json!("/new-shm"));
        assert_eq!(
            oci["mounts"][3],
            json!({"destination": "/usr/bin/nvidia-smi", "source": "/drv/usr/bin/nvidia-smi",
            "options": ["ro", "nosuid", "nodev", "bind"]})
        );
    }

    fn bare_hook(env: Vec<String>) -> ContainerEdits {
        ContainerEdits {
            hooks: vec![Hook {
                hook_name: "createRuntime".into(),
                path: "/opt/other/hook".into(),
                args: vec!["hook".into()],
                env,
                timeout: None,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_hook_without_env_gets_the_minimal_env_not_the_containers() {
        let mut oci = base();
        oci["process"]["env"] = json!(["LD_PRELOAD=/proc/self/cwd/evil.so", "PATH=/bin"]);
        apply_edits(&mut oci, &bare_hook(vec![])).unwrap();
        let env = &oci["hooks"]["createRuntime"][0]["env"];
        assert_eq!(env, &json!(HOOK_ENV));
        assert!(!env.to_string().contains("LD_"), "{env}");
    }

    #[test]
    fn a_hook_with_its_own_env_keeps_exactly_it() {
        let mut oci = base();
        apply_edits(&mut oci, &bare_hook(vec!["A=1".into()])).unwrap();
        assert_eq!(oci["hooks"]["createRuntime"][0]["env"], json!(["A=1"]));
    }

    #[test]
    fn hooks_gids_rdt_and_net_devices_land_where_runc_reads_them() {
        let mut oci = base();
        let edits = ContainerEdits {
            hooks: vec![Hook {
                hook_name: "createContainer".into(),
                path: "/usr/local/nvinject/bin/nvinject-hook".into(),
                args: vec![
                    "nvinject-hook".into(),
                    "update-ldcache".into(),
                    "--folder".into(),
                    "/usr/lib/x86_64-linux-gnu".into(),
                ],
                env: vec![],
                timeout: Some(10),
            }],
            additional_gids: vec![0, 44, 44],
            intel_rdt: Some(IntelRdt { clos_id: Some("gpu".into()), ..Default::default() }),
            net_devices: vec![NetDevice { host_interface_name: "ib0".into(), name: "net1".into() }],
            ..Default::default()
        };
        apply_edits(&mut oci, &edits).unwrap();
        assert_eq!(oci["hooks"]["createContainer"][0]["args"][1], json!("update-ldcache"));
        assert_eq!(oci["hooks"]["createContainer"][0]["timeout"], json!(10));
        assert_eq!(oci["process"]["user"]["additionalGids"], json!([44]));
        assert_eq!(oci["linux"]["intelRdt"], json!({"closID": "gpu"}));
        assert_eq!(oci["linux"]["netDevices"], json!({"ib0": {"name": "net1"}}));
    }

    #[test]
    fn fields_the_edits_do_not_touch_survive_in_order() {
        let mut oci = base();
        let before = oci.clone();
        apply_edits(
            &mut oci,
            &ContainerEdits { device_nodes: vec![node("/dev/nvidia0", 0)], ..Default::default() },
        )
        .unwrap();
        assert_eq!(oci["someFutureField"], before["someFutureField"]);
        assert_eq!(oci["process"], before["process"]);
        assert_eq!(oci["mounts"], before["mounts"]);
        let keys: Vec<&String> = oci.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["ociVersion", "process", "root", "mounts", "linux", "someFutureField"]);
        // Empty edits change nothing at all.
        let mut again = before.clone();
        apply_edits(&mut again, &ContainerEdits::default()).unwrap();
        assert_eq!(again, before);
    }

    #[test]
    fn wrong_shapes_and_incomplete_nodes_fail_without_changing_anything() {
        let mut oci = base();
        oci["process"]["env"] = json!("PATH=/bin");
        let before = oci.clone();
        let edits = ContainerEdits {
            env: vec!["A=1".into()],
            device_nodes: vec![node("/dev/nvidia0", 0)],
            ..Default::default()
        };
        let e = apply_edits(&mut oci, &edits).unwrap_err();
        assert_eq!(e.field(), "process.env");
        assert!(e.to_string().contains("array") && e.to_string().contains("string"), "{e}");
        assert_eq!(oci, before);

        let mut oci = base();
        let incomplete = DeviceNode { path: "/dev/nvidia9".into(), ..Default::default() };
        let e = apply_edits(
            &mut oci,
            &ContainerEdits { env: vec!["A=1".into()], device_nodes: vec![incomplete], ..Default::default() },
        )
        .unwrap_err();
        assert!(e.field().contains("/dev/nvidia9") && e.to_string().contains("type"), "{e}");
        assert_eq!(oci, base());
    }

    #[test]
    fn absent_and_null_sections_are_created() {
        let mut oci = json!({"ociVersion": "1.0.2", "linux": null});
        let edits = ContainerEdits {
            env: vec!["A=1".into()],
            device_nodes: vec![node("/dev/nvidia0", 0)],
            ..Default::default()
        };
        apply_edits(&mut oci, &edits).unwrap();
        assert_eq!(oci["process"]["env"], json!(["A=1"]));
        assert_eq!(oci["linux"]["devices"][0]["path"], json!("/dev/nvidia0"));
        assert_eq!(oci["linux"]["resources"]["devices"][0]["minor"], json!(0));
    }
}
