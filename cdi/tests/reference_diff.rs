//! Differential tests: nvinject's CDI registry and `apply_edits` against the CDI reference library
//! for Rust (cdi-rs, crates.io `container-device-interface`, which applies edits to an
//! `oci_spec::runtime::Spec`), on the same spec directories, OCI base configs and device requests.
//!
//! Inputs: the spec corpus (cdi-gen's goldens, nvidia-ctk 1.20's specs, and hand-written
//! specs in the CDI examples' style for the edits the goldens never use) crossed with OCI base
//! configs (empty; runc-like; colliding env, mounts, devices and hooks; a non-root user; process and
//! linux absent; sections explicitly null). Each device is requested alone, then all of a spec's
//! devices at once. Both sides resolve the names through their own registry of the same directory.
//!
//! Comparable form ([`facets`]): only the OCI fields CDI edits write, each normalized as documented
//! there. The rest is left out on purpose: cdi-rs round-trips the config through a typed model
//! (adding its defaults, dropping unknown fields), and nvinject's own unit tests pin that untouched
//! fields survive byte for byte.
//!
//! Differences by design or from known cdi-rs bugs are the [`Known`] list: each is an adjustment of
//! cdi-rs's output that turns it into what nvinject does, applied only where its condition holds.
//! Anything left after the adjustments fails, and so does a listed difference that no input shows
//! any more (the list stays true). Nothing here reads the host: nvidia-ctk's specs leave device
//! `type` and minor 0 out, and both libraries would `stat` the host path to fill them, so the test
//! completes those nodes in the spec text first (filling is `nvinject_cdi::fill`'s job, tested
//! against nvidia-ctk's specs as root in `nvidia_specs.rs`).
//!
//! What cdi-rs cannot do here: it has no API to apply edits without its cache (its
//! `ContainerEdits::apply` is public but takes its own edit model, built only from spec files), so
//! every request goes through `Cache::inject_devices`; and its registry error for a conflict is a
//! whole-cache `refresh` error, not a per-device one, so conflicts are compared by outcome only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use container_device_interface::cache::Cache;
use container_device_interface::spec_dirs::with_spec_dirs;
use nvinject_cdi::apply::apply_edits;
use nvinject_cdi::{ContainerEdits, HOOK_ENV, QualifiedName, Registry};
use oci_spec::runtime as oci;
use serde_json::{Value, json};

/// A difference between nvinject and cdi-rs that the test accepts, each with why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Known {
    /// cdi-rs fills an absent `process` with oci-spec's `Process::default()` (its `PATH` and `TERM`
    /// come first in the env) and an absent `mounts` with one `Mount::default()`; nvinject creates
    /// only the lists the edits write into, and never invents a mount. By design: a shim must not
    /// add settings the runtime's config did not have.
    DefaultSections,
    /// cdi-rs's spec generator starts with an empty env index, so an edit `NAME=value` whose NAME
    /// the base config already has is appended (a duplicate) instead of replacing it. The Go
    /// reference indexes the existing env first and replaces in place, as nvinject does. cdi-rs bug.
    EnvAppendedNotReplaced,
    /// cdi-rs never sorts mounts; the Go reference stable-sorts them by destination depth so that
    /// parents are mounted before children, as nvinject does. cdi-rs bug.
    MountsNotSortedByDepth,
    /// A hook with no `env` gets nvinject's minimal `HOOK_ENV`; cdi-rs leaves it unset, so runc hands
    /// the hook the container's environment (loader variables included). By design (security).
    HookEnvUnset,
    /// A hook with `env: []`: nvinject's spec model does not tell an empty env from an absent one,
    /// so it gets `HOOK_ENV` too; cdi-rs keeps the empty list (runc then runs the hook with an empty
    /// environment). Harmless by design: the hook gets only a fixed `PATH`, never the container's.
    HookEnvEmpty,
    /// oci-spec's `LinuxDevice` has non-optional major/minor, so a FIFO gets `major: 0, minor: 0`;
    /// nvinject writes no numbers for a FIFO (the runtime spec ignores them for `p`). Same effect.
    FifoNumbers,
    /// Two files of one directory define the device: nvinject and the Go reference refuse it;
    /// cdi-rs's `refresh` removes conflicts from the map it then replaces, so the first file scanned
    /// wins. cdi-rs bug.
    ConflictStillResolves,
    /// A spec file that does not parse: nvinject and the Go reference set it aside and keep the
    /// other files' devices; cdi-rs's scan stops at it and the cache stays empty. cdi-rs bug.
    BrokenFileHidesAll,
    /// Specs in a subdirectory of a spec dir: nvinject and the Go reference skip subdirectories;
    /// cdi-rs walks into them. cdi-rs bug.
    SubdirectoryScanned,
}

/// The known differences the apply corpus must show (each at least once).
const APPLY_KNOWN: [Known; 6] = [
    Known::DefaultSections,
    Known::EnvAppendedNotReplaced,
    Known::MountsNotSortedByDepth,
    Known::HookEnvUnset,
    Known::HookEnvEmpty,
    Known::FifoNumbers,
];

/// One spec file of the corpus: its file name and text.
struct Fixture {
    file: String,
    text: String,
}

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// cdi-gen's goldens, read in place so they stay byte-identical and current.
fn cdi_gen_goldens() -> Vec<Fixture> {
    ["single.yaml", "h100x8.yaml", "a100-mig.yaml"]
        .into_iter()
        .map(|f| {
            let path = manifest().join("../cdi-gen/tests/golden").join(f);
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            Fixture { file: format!("cdi-gen-{f}"), text }
        })
        .collect()
}

/// nvidia-ctk's recorded specs, and its management-mode specs derived from its source, with the
/// placeholders replaced and their device nodes completed (`type: c`, minor 0 where left out;
/// every node in them is a char device), so neither side looks at the host.
fn nvidia_ctk_specs() -> Vec<Fixture> {
    [
        ("nvidia-ctk-1.20.0", "h100x8.json"),
        ("nvidia-ctk-1.20.0", "a100-mig.json"),
        ("nvidia-ctk-1.20.0", "h100x8-graphics.json"),
        ("nvidia-ctk-1.20.0-derived", "h100x8-management.json"),
        ("nvidia-ctk-1.20.0-derived", "a100-mig-management.json"),
    ]
    .into_iter()
    .map(|(dir, f)| {
        let path = manifest().join("tests/golden").join(dir).join(f);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let text = text.replace("@DRIVER_ROOT@", "/driver").replace("@DEV_ROOT@", "");
        let mut spec: Value = serde_json::from_str(&text).unwrap();
        let complete = |edits: &mut Value| {
            for node in edits.get_mut("deviceNodes").and_then(Value::as_array_mut).into_iter().flatten() {
                let node = node.as_object_mut().unwrap();
                node.entry("type").or_insert(json!("c"));
                node.entry("minor").or_insert(json!(0));
            }
        };
        complete(&mut spec["containerEdits"]);
        for device in spec["devices"].as_array_mut().unwrap() {
            complete(&mut device["containerEdits"]);
        }
        Fixture { file: format!("nvidia-ctk-{f}"), text: serde_json::to_string(&spec).unwrap() }
    })
    .collect()
}

/// Hand-written specs for the edits the goldens do not use: hooks without env, intelRdt, net
/// devices, additional gids, block and FIFO nodes, `none` and empty permissions, node owners,
/// typed mounts, and mounts whose depth order differs from their order in the spec.
fn examples() -> Vec<Fixture> {
    let full = json!({
        "cdiVersion": "1.1.0", "kind": "vendor.com/device",
        "containerEdits": {
            "env": ["FOO=CDI_SPEC", "BAR=BARVALUE1"],
            "deviceNodes": [{"path": "/dev/vendorctl", "type": "c", "major": 10, "minor": 200, "uid": 1000, "gid": 1000}],
            "mounts": [
                {"hostPath": "/opt/vendor/lib/deep/libx.so", "containerPath": "/usr/lib/vendor/deep/libx.so", "options": ["ro", "bind"]},
                {"hostPath": "/opt/vendor/lib", "containerPath": "/usr/lib/vendor", "type": "bind", "options": ["ro", "rbind"]},
                {"hostPath": "/bin/vendorBin", "containerPath": "/bin/vendorBin"}
            ],
            "hooks": [
                {"hookName": "createContainer", "path": "/bin/vendor-hook", "args": ["vendor-hook", "setup"]},
                {"hookName": "startContainer", "path": "/usr/bin/ldconfig", "env": ["A=1"], "timeout": 5},
                {"hookName": "prestart", "path": "/bin/legacy-hook"}
            ],
            "additionalGids": [0, 44, 44, 107],
            "intelRdt": {"closID": "gpu", "schemata": ["L3:0=f"], "enableMonitoring": true},
            "netDevices": [{"hostInterfaceName": "ib0", "name": "net1"}]
        },
        "devices": [
            {"name": "block", "containerEdits": {
                "deviceNodes": [{"path": "/dev/vdisk", "type": "b", "major": 8, "minor": 16, "permissions": "r"}],
                "env": ["FOO=DEVICE"]}},
            {"name": "fifo", "containerEdits": {"deviceNodes": [{"path": "/dev/vpipe", "type": "p", "fileMode": 384}]}},
            {"name": "locked", "containerEdits": {
                "deviceNodes": [{"path": "/dev/vlock", "type": "c", "major": 240, "minor": 1, "permissions": "none"},
                                {"path": "/dev/vopen", "type": "c", "major": 240, "minor": 2, "permissions": ""}]}},
            {"name": "rebind", "containerEdits": {
                "mounts": [{"hostPath": "/other/vendorBin", "containerPath": "/bin/vendorBin", "options": ["ro"]}],
                "hooks": [{"hookName": "createRuntime", "path": "/bin/net-hook", "env": []}],
                "netDevices": [{"hostInterfaceName": "ib1", "name": "net2"}]}}
        ]
    });
    let minimal = json!({
        "cdiVersion": "0.3.0", "kind": "example.com/card",
        "devices": [{"name": "card0", "containerEdits": {
            "deviceNodes": [{"path": "/dev/card0", "type": "c", "major": 226, "minor": 0, "fileMode": 432}],
            "env": ["PATH=/vendor/bin"]}}]
    });
    vec![
        Fixture { file: "example-full.json".into(), text: serde_json::to_string_pretty(&full).unwrap() },
        Fixture {
            file: "example-minimal.json".into(),
            text: serde_json::to_string_pretty(&minimal).unwrap(),
        },
    ]
}

/// The OCI base configs each request is applied to, by label.
fn bases() -> Vec<(&'static str, Value)> {
    let runc_mounts = json!([
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm"},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["ro"]}
    ]);
    vec![
        ("empty", json!({"ociVersion": "1.2.0"})),
        (
            "runc-like",
            json!({
                "ociVersion": "1.2.0",
                "process": {"user": {"uid": 0, "gid": 0}, "args": ["sh"], "cwd": "/",
                            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=xterm"]},
                "root": {"path": "rootfs"},
                "mounts": runc_mounts,
                "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]},
                          "namespaces": [{"type": "pid"}, {"type": "mount"}]}
            }),
        ),
        (
            "colliding",
            json!({
                "ociVersion": "1.2.0",
                "process": {"user": {"uid": 0, "gid": 0, "additionalGids": [44]}, "args": ["sh"], "cwd": "/",
                            "env": ["NVIDIA_VISIBLE_DEVICES=all", "FOO=base", "PATH=/bin", "KEEP=1"]},
                "mounts": [
                    {"destination": "/usr/bin/nvidia-smi", "source": "/somewhere/nvidia-smi", "options": ["bind"]},
                    {"destination": "/bin/vendorBin", "source": "/old/vendorBin", "options": ["bind"]},
                    {"destination": "/run/nvidia-persistenced/socket", "source": "/old/socket", "options": ["bind"]},
                    {"destination": "/proc", "type": "proc", "source": "proc"}
                ],
                "hooks": {"createContainer": [{"path": "/bin/existing-hook", "args": ["existing-hook"]}],
                          "prestart": [{"path": "/bin/old-prestart"}]},
                "linux": {
                    "devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 99},
                                {"path": "/dev/vendorctl", "type": "c", "major": 1, "minor": 1},
                                {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}],
                    "resources": {"devices": [{"allow": false, "access": "rwm"},
                                              {"allow": true, "type": "c", "major": 10, "minor": 229, "access": "rwm"}]},
                    "netDevices": {"eth9": {"name": "eth9"}}
                }
            }),
        ),
        (
            "non-root-user",
            json!({
                "ociVersion": "1.2.0",
                "process": {"user": {"uid": 1000, "gid": 1001}, "args": ["sh"], "cwd": "/", "env": []},
                "mounts": [],
                "linux": {}
            }),
        ),
        (
            "process-and-linux-absent",
            json!({"ociVersion": "1.2.0", "root": {"path": "rootfs"}, "mounts": runc_mounts}),
        ),
        (
            "sections-null",
            json!({"ociVersion": "1.2.0", "process": null, "mounts": null, "hooks": null, "linux": null}),
        ),
    ]
}

/// What a request gave: the comparable form, or a refusal (its message, for the report only).
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Applied(BTreeMap<&'static str, Value>),
    Refused(String),
}

impl Outcome {
    fn refused(&self) -> bool {
        matches!(self, Outcome::Refused(_))
    }
}

/// nvinject's side, as the shim builds it: resolve each name, the spec's common edits once per
/// spec file, then the device's; apply to the base config.
fn apply_ours(registry: &Registry, base: &Value, names: &[String]) -> Outcome {
    let mut edits = ContainerEdits::default();
    let mut specs_seen: BTreeSet<PathBuf> = BTreeSet::new();
    for name in names {
        let q: QualifiedName = name.parse().unwrap();
        let resolved = match registry.resolve(&q) {
            Ok(r) => r,
            Err(e) => return Outcome::Refused(e.to_string()),
        };
        if specs_seen.insert(resolved.path.to_owned()) {
            edits.append(&resolved.spec.container_edits);
        }
        edits.append(&resolved.device.container_edits);
    }
    let mut oci = base.clone();
    match apply_edits(&mut oci, &edits) {
        Ok(()) => Outcome::Applied(facets(&oci)),
        Err(e) => Outcome::Refused(e.to_string()),
    }
}

/// A cdi-rs cache over `dirs` (lowest priority first), refreshed once. A refresh error (a conflict,
/// a broken file) is kept aside: cdi-rs still answers from what it loaded.
fn reference_cache(dirs: &[&Path]) -> Cache {
    let dirs: Vec<&str> = dirs.iter().map(|d| d.to_str().unwrap()).collect();
    let mut cache = Cache::default();
    with_spec_dirs(&dirs)(&mut cache);
    let _refresh_error = cache.refresh().err().map(|e| e.to_string());
    cache
}

/// cdi-rs's side: the base config through oci-spec's typed model, `inject_devices`, back to JSON,
/// then the known differences turned into nvinject's behaviour (recorded in `seen`).
fn apply_theirs(cache: &mut Cache, base: &Value, names: &[String], seen: &mut BTreeSet<Known>) -> Outcome {
    let mut spec: oci::Spec =
        serde_json::from_value(base.clone()).unwrap_or_else(|e| panic!("oci-spec rejects the base: {e}"));
    if let Err(e) = cache.inject_devices(Some(&mut spec), names.to_vec()) {
        return Outcome::Refused(e.to_string());
    }
    let mut applied = serde_json::to_value(&spec).unwrap();
    for known in adjust(base, &mut applied) {
        seen.insert(known);
    }
    Outcome::Applied(facets(&applied))
}

/// Number of path components of a mount destination (`/` is 0), as the depth sort counts them.
fn depth(destination: &str) -> usize {
    destination.split('/').filter(|c| !c.is_empty() && *c != ".").count()
}

fn absent(base: &Value, key: &str) -> bool {
    base.get(key).is_none_or(Value::is_null)
}

fn env_name(entry: &str) -> &str {
    entry.split_once('=').map_or(entry, |(n, _)| n)
}

/// Rewrites cdi-rs's output where a [`Known`] difference applies; returns those that did.
fn adjust(base: &Value, theirs: &mut Value) -> Vec<Known> {
    let mut fired = Vec::new();
    if absent(base, "process")
        && let Some(env) = theirs.pointer_mut("/process/env").and_then(Value::as_array_mut)
    {
        let defaults = oci::Process::default().env().clone().unwrap_or_default();
        let defaults: Vec<Value> = defaults.into_iter().map(Value::from).collect();
        if env.starts_with(&defaults) {
            env.drain(..defaults.len());
            fired.push(Known::DefaultSections);
        }
    }
    if absent(base, "mounts")
        && let Some(mounts) = theirs.get_mut("mounts").and_then(Value::as_array_mut)
    {
        let default = serde_json::to_value(oci::Mount::default()).unwrap();
        if mounts.first() == Some(&default) {
            mounts.remove(0);
            fired.push(Known::DefaultSections);
        }
    }
    if let Some(env) = theirs.pointer_mut("/process/env").and_then(Value::as_array_mut) {
        // A later entry with an earlier entry's name takes that entry's slot, as a replacement would.
        let mut out: Vec<Value> = Vec::new();
        for entry in env.drain(..) {
            let name = env_name(entry.as_str().unwrap()).to_owned();
            match out.iter_mut().find(|e| env_name(e.as_str().unwrap()) == name) {
                Some(slot) => {
                    *slot = entry;
                    fired.push(Known::EnvAppendedNotReplaced);
                }
                None => out.push(entry),
            }
        }
        *env = out;
    }
    let base_mounts = base.get("mounts").cloned().filter(|m| !m.is_null()).unwrap_or(json!([]));
    // Only when the edits changed the mounts: with no mount edits nobody sorts.
    if let Some(mounts) = theirs.get_mut("mounts").and_then(Value::as_array_mut)
        && Some(&*mounts) != base_mounts.as_array()
    {
        let before = mounts.clone();
        mounts.sort_by_key(|m| m["destination"].as_str().map(depth).unwrap_or(0));
        if *mounts != before {
            fired.push(Known::MountsNotSortedByDepth);
        }
    }
    if let Some(hooks) = theirs.get_mut("hooks").and_then(Value::as_object_mut) {
        for (point, list) in hooks.iter_mut() {
            // The base config's own hooks are left as they are, by both.
            let from_base =
                base.pointer(&format!("/hooks/{point}")).and_then(Value::as_array).map_or(0, Vec::len);
            let Some(list) = list.as_array_mut() else { continue };
            for hook in list.iter_mut().skip(from_base) {
                let hook = hook.as_object_mut().unwrap();
                match hook.get("env") {
                    None => fired.push(Known::HookEnvUnset),
                    Some(env) if env == &json!([]) => fired.push(Known::HookEnvEmpty),
                    Some(_) => continue,
                }
                hook.insert("env".into(), json!(HOOK_ENV));
            }
        }
    }
    if let Some(devices) = theirs.pointer_mut("/linux/devices").and_then(Value::as_array_mut) {
        for dev in devices.iter_mut().filter_map(Value::as_object_mut) {
            if dev.get("type") == Some(&json!("p")) && dev.get("major") == Some(&json!(0)) {
                dev.remove("major");
                dev.remove("minor");
                fired.push(Known::FifoNumbers);
            }
        }
    }
    fired
}

/// The comparable form: the OCI fields CDI edits write, one entry each. Normalizations:
/// - an absent or null list is the empty list, an absent object the empty object (nvinject creates
///   a section only when an edit writes into it; cdi-rs sometimes creates it empty);
/// - `linux.devices` sorted by path: each entry makes one node, and the runtime creates them
///   independently, so their order means nothing (the same-path replacement rule is still
///   compared: a duplicate path would show);
/// - `linux.resources.devices`, `mounts`, each hook point's list and `process.env` keep their
///   order: later cgroup rules override earlier ones, parents mount before children, hooks run
///   in order, and env order is what the process sees;
/// - hook points with an empty list are dropped (oci-spec writes `[]` for a point it initialized);
/// - a hook's or mount's empty `args`/`options` list is the absent one (same meaning to runc);
/// - `linux.netDevices` and `linux.intelRdt` are objects, compared as maps (key order is not
///   semantic; oci-spec keeps net devices in a `HashMap`).
fn facets(oci: &Value) -> BTreeMap<&'static str, Value> {
    let list = |pointer: &str| oci.pointer(pointer).filter(|v| !v.is_null()).cloned().unwrap_or(json!([]));
    let object = |pointer: &str| oci.pointer(pointer).filter(|v| !v.is_null()).cloned().unwrap_or(json!({}));
    let drop_empty = |mut v: Value, key: &str| {
        for item in v.as_array_mut().into_iter().flatten() {
            if let Some(item) = item.as_object_mut()
                && item.get(key).is_some_and(|a| a.as_array().is_some_and(Vec::is_empty))
            {
                item.remove(key);
            }
        }
        v
    };
    let mut devices = list("/linux/devices");
    if let Some(d) = devices.as_array_mut() {
        d.sort_by(|a, b| a["path"].as_str().cmp(&b["path"].as_str()));
    }
    let mut hooks = serde_json::Map::new();
    for (point, list) in object("/hooks").as_object().into_iter().flatten() {
        if list.as_array().is_some_and(|l| !l.is_empty()) {
            hooks.insert(point.clone(), drop_empty(list.clone(), "args"));
        }
    }
    BTreeMap::from([
        ("process.env", list("/process/env")),
        ("process.user.additionalGids", list("/process/user/additionalGids")),
        ("linux.devices", devices),
        ("linux.resources.devices", list("/linux/resources/devices")),
        ("mounts", drop_empty(list("/mounts"), "options")),
        ("hooks", Value::Object(hooks)),
        ("linux.intelRdt", object("/linux/intelRdt")),
        ("linux.netDevices", object("/linux/netDevices")),
    ])
}

/// The facets where two outcomes differ, with both values, for a failure message.
fn compare(ours: &Outcome, theirs: &Outcome) -> Vec<String> {
    match (ours, theirs) {
        (Outcome::Applied(a), Outcome::Applied(b)) => a
            .iter()
            .filter(|(facet, value)| b.get(*facet) != Some(*value))
            .map(|(facet, value)| format!("{facet}:\n  nvinject: {value}\n  cdi-rs:   {}", b[facet]))
            .collect(),
        (a, b) if a.refused() && b.refused() => Vec::new(),
        (a, b) => vec![format!("outcome:\n  nvinject: {a:?}\n  cdi-rs:   {b:?}")],
    }
}

/// Writes `files` (name, text) into a new directory under `root`.
fn spec_dir(root: &Path, dir: &str, files: &[(&str, &str)]) -> PathBuf {
    let path = root.join(dir);
    std::fs::create_dir_all(&path).unwrap();
    for (name, text) in files {
        std::fs::write(path.join(name), text).unwrap();
    }
    path
}

#[test]
fn apply_matches_the_reference_on_every_spec_base_and_request() {
    let tmp = tempfile::tempdir().unwrap();
    let mut fixtures = cdi_gen_goldens();
    fixtures.extend(nvidia_ctk_specs());
    fixtures.extend(examples());
    let mut seen = BTreeSet::new();
    let mut failures = Vec::new();
    let mut cases = 0;
    for (i, fixture) in fixtures.iter().enumerate() {
        let dir = spec_dir(tmp.path(), &format!("d{i}"), &[(&fixture.file, &fixture.text)]);
        let registry = Registry::scan(&[&dir]);
        assert!(registry.errors().is_empty(), "{}: {:?}", fixture.file, registry.errors());
        let mut cache = reference_cache(&[&dir]);
        let names: Vec<String> = registry.devices().into_iter().map(|d| d.name).collect();
        assert!(!names.is_empty(), "{}", fixture.file);
        assert_eq!(cache.list_devices(), names, "{}: both registries list the same devices", fixture.file);
        let mut requests: Vec<Vec<String>> = names.iter().map(|n| vec![n.clone()]).collect();
        requests.push(names.clone());
        for (label, base) in bases() {
            for request in &requests {
                cases += 1;
                let ours = apply_ours(&registry, &base, request);
                let theirs = apply_theirs(&mut cache, &base, request, &mut seen);
                assert!(!ours.refused(), "{} {label} {request:?}: {ours:?}", fixture.file);
                let diff = compare(&ours, &theirs);
                if !diff.is_empty() {
                    failures.push(format!("{} on {label}, {request:?}:\n{}", fixture.file, diff.join("\n")));
                }
            }
        }
    }
    assert!(cases > 500, "the corpus shrank: {cases} cases");
    assert!(
        failures.is_empty(),
        "{} of {cases} cases differ from cdi-rs beyond the known differences; first:\n{}",
        failures.len(),
        failures.iter().take(3).cloned().collect::<Vec<_>>().join("\n\n")
    );
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), APPLY_KNOWN, "a listed difference no longer shows");
}

/// A registry scenario: spec dirs (lowest priority first) of files, a request, and the known
/// difference its outcome shows (if any).
struct RegistryCase {
    label: &'static str,
    dirs: Vec<Vec<(&'static str, String)>>,
    request: &'static str,
    known: Option<Known>,
}

fn tagged_spec(names: &[&str], tag: &str) -> String {
    let devices: Vec<Value> = names
        .iter()
        .map(|n| {
            json!({"name": n, "containerEdits": {"env": [format!("FROM={tag}")],
            "deviceNodes": [{"path": format!("/dev/v{n}"), "type": "c", "major": 240, "minor": 1}]}})
        })
        .collect();
    serde_json::to_string(&json!({"cdiVersion": "0.5.0", "kind": "vendor.com/device", "devices": devices}))
        .unwrap()
}

fn registry_cases() -> Vec<RegistryCase> {
    let other_vendor = r#"{"cdiVersion":"0.5.0","kind":"other.com/x","devices":[{"name":"0","containerEdits":{"env":["X=1"]}}]}"#;
    vec![
        RegistryCase {
            label: "a later directory wins",
            dirs: vec![
                vec![("a.json", tagged_spec(&["0", "1"], "etc"))],
                vec![("b.json", tagged_spec(&["0"], "run"))],
            ],
            request: "vendor.com/device=0",
            known: None,
        },
        RegistryCase {
            label: "a device only in the lower directory still resolves",
            dirs: vec![
                vec![("a.json", tagged_spec(&["0", "1"], "etc"))],
                vec![("b.json", tagged_spec(&["0"], "run"))],
            ],
            request: "vendor.com/device=1",
            known: None,
        },
        RegistryCase {
            label: "a missing directory is skipped",
            dirs: vec![vec![("a.json", tagged_spec(&["0"], "etc"))], vec![]],
            request: "vendor.com/device=0",
            known: None,
        },
        RegistryCase {
            label: "an unknown device is refused",
            dirs: vec![vec![("a.json", tagged_spec(&["0"], "etc"))]],
            request: "vendor.com/device=9",
            known: None,
        },
        RegistryCase {
            label: "two files of one directory conflict",
            dirs: vec![vec![("a.json", tagged_spec(&["0"], "a")), ("b.json", tagged_spec(&["0"], "b"))]],
            request: "vendor.com/device=0",
            known: Some(Known::ConflictStillResolves),
        },
        RegistryCase {
            label: "a conflict in a lower directory is shadowed by a later one",
            dirs: vec![
                vec![("a.json", tagged_spec(&["0"], "a")), ("b.json", tagged_spec(&["0"], "b"))],
                vec![("c.json", tagged_spec(&["0"], "run"))],
            ],
            request: "vendor.com/device=0",
            known: None,
        },
        RegistryCase {
            label: "a conflict on another device leaves this one alone",
            dirs: vec![vec![("a.json", tagged_spec(&["0", "1"], "a")), ("b.json", tagged_spec(&["1"], "b"))]],
            request: "vendor.com/device=0",
            known: None,
        },
        RegistryCase {
            label: "a broken file beside a good one",
            dirs: vec![vec![
                ("a-broken.json", "{ not json".to_owned()),
                ("b.json", tagged_spec(&["0"], "ok")),
            ]],
            request: "vendor.com/device=0",
            known: Some(Known::BrokenFileHidesAll),
        },
        RegistryCase {
            label: "a spec in a subdirectory",
            dirs: vec![vec![
                ("sub/a.json", tagged_spec(&["0"], "sub")),
                ("other.json", other_vendor.to_owned()),
            ]],
            request: "vendor.com/device=0",
            known: Some(Known::SubdirectoryScanned),
        },
    ]
}

#[test]
fn registry_priority_and_conflicts_match_the_reference() {
    let base = bases().into_iter().find(|(l, _)| *l == "runc-like").unwrap().1;
    let mut failures = Vec::new();
    for case in registry_cases() {
        let tmp = tempfile::tempdir().unwrap();
        let mut dirs = Vec::new();
        for (i, files) in case.dirs.iter().enumerate() {
            let dir = tmp.path().join(format!("prio{i}"));
            // An empty file list stands for a directory that does not exist.
            for (name, text) in files {
                let path = dir.join(name);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, text).unwrap();
            }
            dirs.push(dir);
        }
        let dir_refs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
        let registry = Registry::scan(&dir_refs);
        let mut cache = reference_cache(&dir_refs);
        let request = vec![case.request.to_owned()];
        let ours = apply_ours(&registry, &base, &request);
        let theirs = apply_theirs(&mut cache, &base, &request, &mut BTreeSet::new());
        let diff = compare(&ours, &theirs);
        match (case.known, diff.is_empty()) {
            (None, true) | (Some(_), false) => {}
            (None, false) => failures.push(format!("{}:\n{}", case.label, diff.join("\n"))),
            (Some(k), true) => failures.push(format!("{}: {k:?} is listed but no longer shows", case.label)),
        }
        // The listed differences are all "nvinject refuses, cdi-rs resolves" or the reverse.
        if let Some(k) = case.known {
            let nvinject_refuses = matches!(k, Known::ConflictStillResolves | Known::SubdirectoryScanned);
            assert_eq!(ours.refused(), nvinject_refuses, "{}: {ours:?}", case.label);
            assert_eq!(theirs.refused(), !nvinject_refuses, "{}: {theirs:?}", case.label);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The comparison can fail: a changed value, a device missing, a refusal on one side only, and a
/// real hook difference next to a known one all show, facet by facet.
#[test]
fn the_comparison_reports_differences() {
    let tmp = tempfile::tempdir().unwrap();
    let fixture = &examples()[0];
    let dir = spec_dir(tmp.path(), "d", &[(&fixture.file, &fixture.text)]);
    let registry = Registry::scan(&[&dir]);
    let mut cache = reference_cache(&[&dir]);
    let base = bases().into_iter().find(|(l, _)| *l == "colliding").unwrap().1;
    let request = vec!["vendor.com/device=block".to_owned()];
    let ours = apply_ours(&registry, &base, &request);
    let mut seen = BTreeSet::new();
    let theirs = apply_theirs(&mut cache, &base, &request, &mut seen);
    assert_eq!(compare(&ours, &theirs), Vec::<String>::new());
    assert!(seen.contains(&Known::HookEnvUnset) && seen.contains(&Known::EnvAppendedNotReplaced));

    let facets_of = |o: &Outcome| match o {
        Outcome::Applied(f) => f.clone(),
        Outcome::Refused(e) => panic!("{e}"),
    };
    let mut changed = facets_of(&ours);
    changed.get_mut("linux.devices").unwrap()[0]["minor"] = json!(17);
    let diff = compare(&Outcome::Applied(changed), &theirs);
    assert_eq!(diff.len(), 1, "{diff:?}");
    assert!(diff[0].starts_with("linux.devices:"), "{diff:?}");

    let mut fewer = facets_of(&ours);
    fewer.get_mut("linux.resources.devices").unwrap().as_array_mut().unwrap().pop();
    assert!(compare(&Outcome::Applied(fewer), &theirs)[0].starts_with("linux.resources.devices:"));

    assert_eq!(compare(&Outcome::Refused("no".into()), &theirs).len(), 1);
    assert!(compare(&Outcome::Refused("a".into()), &Outcome::Refused("b".into())).is_empty());

    // The hook-env adjustment fills only a missing env; a different path still differs.
    let mut theirs_hooked = json!({"hooks": {"prestart": [{"path": "/bin/other"}]}});
    let ours_hooked = json!({"hooks": {"prestart": [{"path": "/bin/legacy-hook", "env": HOOK_ENV}]}});
    assert_eq!(adjust(&json!({}), &mut theirs_hooked), [Known::HookEnvUnset]);
    let diff = compare(&Outcome::Applied(facets(&ours_hooked)), &Outcome::Applied(facets(&theirs_hooked)));
    assert_eq!(diff.len(), 1, "{diff:?}");
    assert!(diff[0].starts_with("hooks:") && diff[0].contains("/bin/other"), "{diff:?}");
}
