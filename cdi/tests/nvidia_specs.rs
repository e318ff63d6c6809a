//! The golden corpus of specs nvinject must accept as other tools write them: nvidia-ctk 1.20's
//! (`tests/golden/nvidia-ctk-1.20.0`, recorded on our simulated node, see its README; its
//! management mode in `tests/golden/nvidia-ctk-1.20.0-derived`, derived from its source), the
//! reproduction of issue 12, and specs in the style of the CDI project's examples for every
//! cdiVersion from 0.3.0 to the newest. For each: `nvinject-cdi validate` accepts it, the registry
//! resolves every device, and completing its device nodes from the host (`fill`) gives the OCI
//! device entries and cgroup rules nvinject's own spec gives for the same device.
//!
//! Needs root (`nvinject-simnode build` and `mknod` make real device nodes), as cdi-gen's tests do:
//! marked `#[ignore = "needs root"]` (CONTRIBUTING.md).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use nvinject_cdi::apply::apply_edits;
use nvinject_cdi::fill::fill_from_host;
use nvinject_cdi::{ContainerEdits, QualifiedName, Registry, Spec, load_file, validate};
use nvinject_simnode::artifacts::{artifact, simnode_bin};
use serde_json::{Value, json};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/nvidia-ctk-1.20.0")
}

fn cli() -> PathBuf {
    artifact("nvinject-cdi-gen", "nvinject-cdi")
}

/// A simulated node in a temporary directory, with nvinject's own spec generated for it.
struct Node {
    tmp: tempfile::TempDir,
}

impl Node {
    fn build(preset: &str) -> Node {
        let tmp = tempfile::tempdir().unwrap();
        let out = Command::new(simnode_bin("nvinject-simnode"))
            .args(["build", "--preset", preset, "--out"])
            .arg(tmp.path().join("node"))
            .output()
            .unwrap();
        assert!(out.status.success(), "simnode build: {}", String::from_utf8_lossy(&out.stderr));
        let node = Node { tmp };
        for dir in ["ours", "theirs"] {
            std::fs::create_dir_all(node.tmp.path().join(dir)).unwrap();
        }
        let out = Command::new(cli())
            .arg("generate")
            .arg("--driver-root")
            .arg(node.driver())
            .arg("--dev-root")
            .arg(node.dev())
            .arg("--proc-root")
            .arg(node.dev().join("proc"))
            .arg("--sys-root")
            .arg(node.dev().join("sys"))
            .args(["--format", "json", "--output"])
            .arg(node.ours())
            .output()
            .unwrap();
        assert!(out.status.success(), "generate: {}", String::from_utf8_lossy(&out.stderr));
        node
    }
    fn driver(&self) -> PathBuf {
        self.tmp.path().join("node/driver")
    }
    fn dev(&self) -> PathBuf {
        self.tmp.path().join("node/host")
    }
    fn ours(&self) -> PathBuf {
        self.tmp.path().join("ours/nvidia.com-gpu.json")
    }
    /// `text` with the golden's placeholders replaced by this node's roots.
    fn filled(&self, text: &str) -> String {
        text.replace("@DRIVER_ROOT@", self.driver().to_str().unwrap())
            .replace("@DEV_ROOT@", self.dev().to_str().unwrap())
    }
    /// Writes `text`, [`Node::filled`], into the directory of NVIDIA's specs.
    fn install(&self, name: &str, text: &str) -> PathBuf {
        let path = self.tmp.path().join("theirs").join(name);
        std::fs::write(&path, self.filled(text)).unwrap();
        path
    }
}

fn validate_cli(path: &Path) {
    let out = Command::new(cli()).arg("validate").arg(path).output().unwrap();
    assert!(
        out.status.success(),
        "nvinject-cdi validate {}: {}{}",
        path.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What a container asking for `device` gets, as the shim builds it: the spec's common edits,
/// the device's, completed from the host (inside `dev_root`), applied to a bare OCI spec. Returns
/// `linux.devices` by path and the allow rules as (type, major, minor) -> access.
type Applied = (BTreeMap<String, Value>, BTreeMap<(String, i64, i64), String>);

fn applied(spec_file: &Path, spec: &Spec, device: &str, dev_root: Option<&Path>) -> Applied {
    let mut edits = ContainerEdits::default();
    edits.append(&spec.container_edits);
    edits.append(&spec.device(device).unwrap_or_else(|| panic!("no device {device}")).container_edits);
    fill_from_host(&mut edits.device_nodes, spec_file, dev_root).unwrap_or_else(|e| panic!("{e}"));
    let mut oci = json!({"ociVersion": "1.2.0", "process": {"user": {"uid": 0, "gid": 0}},
                         "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}}});
    apply_edits(&mut oci, &edits).unwrap();
    let devices = oci["linux"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["path"].as_str().unwrap().to_owned(), d.clone()))
        .collect();
    let rules = oci["linux"]["resources"]["devices"].as_array().unwrap()[1..]
        .iter()
        .map(|r| {
            let key = (
                r["type"].as_str().unwrap().to_owned(),
                r["major"].as_i64().unwrap(),
                r["minor"].as_i64().unwrap(),
            );
            (key, r["access"].as_str().unwrap().to_owned())
        })
        .collect();
    (devices, rules)
}

/// Every device of the spec at `path` resolves through a registry of its directory.
fn resolves_all(path: &Path, spec: &Spec) {
    let registry = Registry::scan(&[path.parent().unwrap()]);
    assert!(
        registry.errors().is_empty(),
        "{:?}",
        registry.errors().iter().map(|e| e.to_string()).collect::<Vec<_>>()
    );
    for device in &spec.devices {
        let name: QualifiedName = format!("{}={}", spec.kind, device.name).parse().unwrap();
        let resolved = registry.resolve(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(resolved.path, path);
    }
}

/// nvidia-ctk's spec for `preset` against nvinject's on the same simulated node; `reshape` may
/// turn it into another tool's spec first.
fn nvidia_ctk_golden(preset: &str, golden: &str) {
    nvidia_golden_as(preset, golden, |_| {});
}

fn nvidia_golden_as(preset: &str, golden: &str, reshape: fn(&mut Value)) {
    let node = Node::build(preset);
    let mut spec: Value =
        serde_json::from_str(&std::fs::read_to_string(golden_dir().join(golden)).unwrap()).unwrap();
    reshape(&mut spec);
    let theirs_path = node.install("nvidia.json", &serde_json::to_string_pretty(&spec).unwrap());
    validate_cli(&theirs_path);
    let theirs = load_file(&theirs_path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(validate(&theirs), []);
    resolves_all(&theirs_path, &theirs);
    // The goldens really are in the shape this is about.
    let nodes: Vec<_> = theirs
        .devices
        .iter()
        .flat_map(|d| &d.container_edits.device_nodes)
        .chain(&theirs.container_edits.device_nodes)
        .collect();
    assert!(nodes.iter().all(|n| n.device_type.is_none()), "nvidia-ctk writes no type");
    assert!(nodes.iter().any(|n| n.minor.is_none()), "nvidia-ctk writes no minor 0");

    let ours = load_file(&node.ours()).unwrap();
    let our_names: Vec<&str> = ours.devices.iter().map(|d| d.name.as_str()).collect();
    let dev_root = node.dev();
    for device in &theirs.devices {
        assert!(
            our_names.contains(&device.name.as_str()),
            "{preset}: nvinject has no device {}",
            device.name
        );
        // NVIDIA's spec has no dev-root record: the shim falls back to its `[regenerate] dev-root`;
        // it is the same with none (the host paths are absolute), which the integration test runs.
        let (their_devs, their_rules) = applied(&theirs_path, &theirs, &device.name, Some(&dev_root));
        assert_eq!(
            (their_devs.clone(), their_rules.clone()),
            applied(&theirs_path, &theirs, &device.name, None),
            "{preset} {}: dev root given or not",
            device.name
        );
        let (our_devs, our_rules) = applied(&node.ours(), &ours, &device.name, Some(&dev_root));
        assert_eq!(their_devs, our_devs, "{preset} {}: OCI device entries", device.name);
        assert_eq!(
            their_rules.keys().collect::<Vec<_>>(),
            our_rules.keys().collect::<Vec<_>>(),
            "{preset} {}: cgroup rules",
            device.name
        );
        // Access is each spec's own word: NVIDIA writes rwm, nvinject rw (containers never mknod).
        assert!(their_rules.values().all(|a| a == "rwm"), "{their_rules:?}");
        assert!(our_rules.values().all(|a| a == "rw"), "{our_rules:?}");
    }
}

#[test]
#[ignore = "needs root"]
fn nvidia_ctk_h100x8_spec_matches_ours() {
    nvinject_test_support::require_root("mknod for the simulated node");
    nvidia_ctk_golden("h100x8", "h100x8.json");
}

#[test]
#[ignore = "needs root"]
fn nvidia_ctk_a100_mig_spec_matches_ours() {
    nvinject_test_support::require_root("mknod for the simulated node");
    nvidia_ctk_golden("a100-mig", "a100-mig.json");
}

#[test]
#[ignore = "needs root"]
fn nvidia_ctk_h100x8_graphics_spec_matches_ours() {
    nvinject_test_support::require_root("mknod for the simulated node");
    nvidia_ctk_golden("h100x8", "h100x8-graphics.json");
}

fn derived_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/nvidia-ctk-1.20.0-derived")
}

/// The OCI device entry a container gets for the host device node `host` (its numbers and
/// permission bits as the host has them) at `path`.
fn host_entry(host: &Path, path: &str) -> Value {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::symlink_metadata(host).unwrap_or_else(|e| panic!("{}: {e}", host.display()));
    let rdev = meta.rdev();
    json!({"path": path, "type": "c", "major": libc::major(rdev), "minor": libc::minor(rdev),
           "fileMode": meta.permissions().mode() & 0o777})
}

/// nvidia-ctk's management mode (`--mode=management`; derived from its source, not recorded: see
/// `tests/golden/nvidia-ctk-1.20.0-derived/README.md`) on the node of `preset`: one device `all`
/// with every NVIDIA device node, the driver's files as common edits. `validate` accepts it, the
/// registry resolves `nvidia.com/gpu=all`, and a container asking for it gets every device node
/// nvinject's `all` gives, as nvinject gives it, plus the MIG `config` and `monitor` capabilities
/// (what management containers need for `nvidia-smi mig`), as the host has them.
fn nvidia_ctk_management(preset: &str, golden: &str) {
    let node = Node::build(preset);
    let text = std::fs::read_to_string(derived_dir().join(golden)).unwrap();
    let theirs_path = node.install("nvidia.json", &text);
    validate_cli(&theirs_path);
    let theirs = load_file(&theirs_path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(validate(&theirs), []);
    resolves_all(&theirs_path, &theirs);
    let names: Vec<&str> = theirs.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["all"], "management mode writes one device");
    let nodes = &theirs.devices[0].container_edits.device_nodes;
    assert!(theirs.container_edits.device_nodes.is_empty(), "every node is in `all`");
    assert!(nodes.iter().all(|n| n.device_type.is_none()), "nvidia-ctk writes no type");
    assert!(nodes.iter().any(|n| n.minor.is_none()), "nvidia-ctk writes no minor 0");

    let dev_root = node.dev();
    let (their_devs, their_rules) = applied(&theirs_path, &theirs, "all", Some(&dev_root));
    assert_eq!(
        (their_devs.clone(), their_rules.clone()),
        applied(&theirs_path, &theirs, "all", None),
        "{preset}: dev root given or not"
    );
    let ours = load_file(&node.ours()).unwrap();
    let (our_devs, our_rules) = applied(&node.ours(), &ours, "all", Some(&dev_root));
    for (path, entry) in &our_devs {
        assert_eq!(their_devs.get(path), Some(entry), "{preset}: {path}");
    }
    let extra: BTreeMap<String, Value> = their_devs
        .iter()
        .filter(|(p, _)| !our_devs.contains_key(*p))
        .map(|(p, v)| (p.clone(), v.clone()))
        .collect();
    let want: BTreeMap<String, Value> = ["nvidia-cap1", "nvidia-cap2"]
        .iter()
        .map(|n| {
            let path = format!("/dev/nvidia-caps/{n}");
            let entry = host_entry(&dev_root.join(&path[1..]), &path);
            (path, entry)
        })
        .collect();
    assert_eq!(extra, want, "{preset}: what management mode adds to nvinject's `all`");
    assert!(our_rules.keys().all(|k| their_rules.contains_key(k)), "{preset}: {their_rules:?}");
    assert_eq!(their_rules.len(), our_rules.len() + want.len(), "{preset}: {their_rules:?}");
    assert!(their_rules.values().all(|a| a == "rwm"), "{their_rules:?}");

    // The common edits are the driver discoverer's alone: every mount is one the recorded
    // full-GPU spec of the same node has, and the graphics and application-profile runs are gone.
    let recorded_path = node.tmp.path().join(format!("{preset}.json"));
    let recorded_text = std::fs::read_to_string(golden_dir().join(format!("{preset}.json"))).unwrap();
    std::fs::write(&recorded_path, node.filled(&recorded_text)).unwrap();
    let recorded = load_file(&recorded_path).unwrap();
    for mount in &theirs.container_edits.mounts {
        assert!(recorded.container_edits.mounts.contains(mount), "{preset}: {mount:?}");
    }
    assert!(theirs.container_edits.mounts.iter().any(|m| m.container_path.ends_with("libcuda.so.550.54.15")));
    let runs: Vec<&str> = theirs.container_edits.hooks.iter().map(|h| h.args[1].as_str()).collect();
    assert_eq!(
        runs,
        ["create-symlinks", "enable-cuda-compat", "update-ldcache", "disable-device-node-modification"]
    );
}

#[test]
#[ignore = "needs root"]
fn nvidia_ctk_h100x8_management_spec_gives_every_node() {
    nvinject_test_support::require_root("mknod for the simulated node");
    nvidia_ctk_management("h100x8", "h100x8-management.json");
}

#[test]
#[ignore = "needs root"]
fn nvidia_ctk_a100_mig_management_spec_gives_every_node() {
    nvinject_test_support::require_root("mknod for the simulated node");
    nvidia_ctk_management("a100-mig", "a100-mig-management.json");
}

/// NVIDIA's device plugin writes its transient spec in /var/run/cdi with the same library as
/// nvidia-ctk, under its own kind and with the GPUs named by UUID (its default device-id strategy).
/// Derived from the recorded nvidia-ctk spec, not recorded from the plugin itself.
#[test]
#[ignore = "needs root"]
fn a_device_plugin_style_spec_matches_ours() {
    nvinject_test_support::require_root("mknod for the simulated node");
    nvidia_golden_as("h100x8", "h100x8.json", |spec| {
        spec["kind"] = json!("k8s.device-plugin.nvidia.com/gpu");
        spec["devices"].as_array_mut().unwrap().retain(|d| d["name"].as_str().unwrap().starts_with("GPU-"));
        assert_eq!(spec["devices"].as_array().unwrap().len(), 8);
    });
}

/// Issue 12 item 1, verbatim: `validate` exits 0 and the registry lists `nvidia.com/gpu=0`; on a
/// node whose `/dev/nvidia0` is the simulated one (hostPath rewritten to it, as the spec would be
/// written there), the container gets what nvinject's spec gives it.
#[test]
#[ignore = "needs root"]
fn the_issue_12_reproduction_is_accepted_and_applied() {
    nvinject_test_support::require_root("mknod for the simulated node");
    const REPRO: &str = r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"0","containerEdits":{"deviceNodes":
[{"path":"/dev/nvidia0","hostPath":"/dev/nvidia0","major":195,"fileMode":438,"permissions":"rwm"}]}}],
"containerEdits":{"env":["NVIDIA_VISIBLE_DEVICES=void"]}}"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("repro.json");
    std::fs::write(&path, REPRO).unwrap();
    let spec = load_file(&path).unwrap_or_else(|e| panic!("{e}"));
    resolves_all(&path, &spec);
    let out = Command::new(cli()).args(["list", "--spec-dir"]).arg(dir.path()).output().unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && listed.contains("nvidia.com/gpu=0"),
        "{listed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    validate_cli(&path);

    let node = Node::build("h100x8");
    let rewritten =
        node.install("repro.json", &REPRO.replace(r#""hostPath":"/dev"#, r#""hostPath":"@DEV_ROOT@/dev"#));
    let theirs = load_file(&rewritten).unwrap();
    let ours = load_file(&node.ours()).unwrap();
    let (devs, rules) = applied(&rewritten, &theirs, "0", Some(&node.dev()));
    let (our_devs, our_rules) = applied(&node.ours(), &ours, "0", Some(&node.dev()));
    assert_eq!(devs["/dev/nvidia0"], our_devs["/dev/nvidia0"]);
    assert_eq!(rules[&("c".to_owned(), 195, 0)], "rwm");
    assert!(our_rules.contains_key(&("c".to_owned(), 195, 0)));
}

/// A device file for the CDI-example-style specs: `/dev/null`, `/dev/zero` and `/dev/full` are
/// char devices 1:3, 1:5 and 1:7 on every Linux host, so specs older than 0.5.0 (no `hostPath`)
/// can leave their numbers out and still be completed here.
fn host_null() -> Value {
    json!({"path": "/dev/card-null", "type": "c", "major": 1, "minor": 3, "fileMode": 0o666})
}

/// Specs in the style of the CDI project's examples (`schema/testdata/good`, SPEC.md), one per
/// cdiVersion, each using what that version added, with device nodes left as incomplete as the
/// CDI spec allows.
/// One corpus entry: a label (its cdiVersion), the spec, and the OCI device entries it must give.
type Example = (String, Value, Vec<(&'static str, Value)>);

fn cdi_examples(vendor_root: &Path) -> Vec<Example> {
    let card = |n: u32| format!("{}/dev/card{n}", vendor_root.display());
    let complete = |path: &str, minor: i64| json!({"path": path, "type": "c", "major": 1, "minor": minor, "fileMode": 0o666});
    let base = |version: &str, name: &str, nodes: Value| {
        json!({"cdiVersion": version, "kind": "vendor.com/device",
               "devices": [{"name": name, "containerEdits": {"deviceNodes": nodes}}],
               "containerEdits": {"env": ["FOO=CDI_SPEC", "BAR=BARVALUE1"],
                   "deviceNodes": [{"path": "/dev/zero", "uid": 1000, "gid": 1000}],
                   "mounts": [{"hostPath": "/bin/vendorBin", "containerPath": "/bin/vendorBin"}],
                   "hooks": [{"hookName": "createContainer", "path": "/bin/vendor-hook"},
                             {"hookName": "startContainer", "path": "/usr/bin/ldconfig"}]}})
    };
    let mut out = Vec::new();
    // 0.3.0: the CDI project's minimal.json shape, on host devices (no hostPath before 0.5.0).
    out.push((
        "0.3.0".to_owned(),
        base("0.3.0", "myDevice", json!([{"path": "/dev/null"}, {"path": "/dev/full", "type": "c"}])),
        vec![("/dev/null", complete("/dev/null", 3)), ("/dev/full", complete("/dev/full", 7))],
    ));
    let mut v040 = base("0.4.0", "myDevice", json!([{"path": "/dev/null", "permissions": "rw"}]));
    v040["containerEdits"]["mounts"][0]["type"] = json!("bind");
    out.push(("0.4.0".to_owned(), v040, vec![("/dev/null", complete("/dev/null", 3))]));
    // 0.5.0 and later: spec-example.json's vendor root, with nodes made there by the test.
    for version in ["0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"] {
        let nodes = json!([{"hostPath": card(1), "path": "/dev/card1"}, {"hostPath": card(2), "path": "/dev/card2", "major": 226, "minor": 2}]);
        let mut spec = base(version, "0", nodes);
        if version >= "0.6.0" {
            spec["annotations"] = json!({"vendor.com/generated-by": "hand"});
            spec["devices"][0]["annotations"] = json!({"vendor.com/card": "1"});
        }
        if version >= "0.7.0" {
            spec["containerEdits"]["additionalGids"] = json!([44]);
        }
        if version == "0.7.0" {
            spec["containerEdits"]["intelRdt"] = json!({"closID": "gpu", "enableCMT": true});
        }
        if version == "1.1.0" {
            spec["containerEdits"]["intelRdt"] =
                json!({"closID": "gpu", "schemata": ["L3:0=f"], "enableMonitoring": true});
        }
        out.push((
            version.to_owned(),
            spec,
            vec![
                (
                    "/dev/card1",
                    json!({"path": "/dev/card1", "type": "c", "major": 226, "minor": 1, "fileMode": 0o660}),
                ),
                (
                    "/dev/card2",
                    json!({"path": "/dev/card2", "type": "c", "major": 226, "minor": 2, "fileMode": 0o666}),
                ),
            ],
        ));
    }
    // Complete nodes stay exactly as written whatever the host has.
    out.push((
        "1.1.0 complete".to_owned(),
        base("1.1.0", "full", json!([host_null()])),
        vec![("/dev/card-null", host_null())],
    ));
    out
}

fn mknod(path: &Path, mode: u32, major: u32, minor: u32) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | mode, libc::makedev(major, minor)) }, 0);
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
}

#[test]
#[ignore = "needs root"]
fn cdi_example_specs_of_every_version_are_accepted_and_completed() {
    nvinject_test_support::require_root("mknod");
    let tmp = tempfile::tempdir().unwrap();
    let vendor_root = tmp.path().join("vendorroot");
    std::fs::create_dir_all(vendor_root.join("dev")).unwrap();
    mknod(&vendor_root.join("dev/card1"), 0o660, 226, 1);
    mknod(&vendor_root.join("dev/card2"), 0o666, 226, 2);
    let mut versions = Vec::new();
    for (i, (version, spec, want)) in cdi_examples(&vendor_root).into_iter().enumerate() {
        let dir = tmp.path().join(format!("specs{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vendor.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        validate_cli(&path);
        let parsed = load_file(&path).unwrap_or_else(|e| panic!("{version}: {e}"));
        resolves_all(&path, &parsed);
        versions.push(parsed.cdi_version.clone());
        let (devices, rules) = applied(&path, &parsed, &parsed.devices[0].name, Some(&vendor_root));
        for (node, entry) in want {
            assert_eq!(devices[node], entry, "{version}: {node}");
            let key = (
                entry["type"].as_str().unwrap().to_owned(),
                entry["major"].as_i64().unwrap(),
                entry["minor"].as_i64().unwrap(),
            );
            assert!(rules.contains_key(&key), "{version}: {node} has a cgroup rule");
        }
        assert_eq!(
            devices["/dev/zero"],
            json!({"path": "/dev/zero", "type": "c", "major": 1, "minor": 5, "fileMode": 0o666, "uid": 1000, "gid": 1000}),
            "{version}: the common node from the host's /dev/zero"
        );
    }
    let known: Vec<String> = nvinject_cdi::CdiVersion::KNOWN
        .iter()
        .map(ToString::to_string)
        .filter(|v| v.as_str() >= "0.3.0")
        .collect();
    versions.dedup();
    assert_eq!(versions, known, "every cdiVersion from 0.3.0 to the newest is in the corpus");
}
