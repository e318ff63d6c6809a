//! Issue 12 item 1 on real parts: a node whose CDI spec directory holds only the spec NVIDIA's
//! nvidia-ctk 1.20 wrote for it (no `type` on any device node, no `minor` where it is 0) starts a
//! container asking for `nvidia.com/gpu=0` through our shim, private containerd and runc, and the
//! probe reports from inside what it got; the same with only its management-mode spec
//! (`--mode=management`, derived from its source) and `nvidia.com/gpu=all`. Needs root (CI runs
//! as root).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;

use nvinject_node_harness::node::{GpuNode, NodeOptions, RunOptions, report_devices};
use serde_json::Value;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// nvidia-ctk's recorded h100x8 spec with this node's roots in place of its placeholders, its
/// hooks as NVIDIA wrote them: they run `/usr/bin/nvidia-cdi-hook` (create-symlinks,
/// enable-cuda-compat, update-ldcache, disable-device-node-modification,
/// update-application-profile), which this node does not have. The shim runs them with
/// nvinject-hook, which implements each (logged).
fn nvidia_spec(node: &GpuNode) -> Value {
    nvidia_golden(node, "nvidia-ctk-1.20.0/h100x8.json")
}

/// The golden `name` (under `cdi/tests/golden`) with this node's roots in place of its
/// placeholders; its hooks run NVIDIA's `/usr/bin/nvidia-cdi-hook`, which this node does not have.
fn nvidia_golden(node: &GpuNode, name: &str) -> Value {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cdi/tests/golden").join(name);
    let text = std::fs::read_to_string(&golden).unwrap_or_else(|e| panic!("{}: {e}", golden.display()));
    let text = text
        .replace("@DRIVER_ROOT@", node.driver_root.to_str().unwrap())
        .replace("@DEV_ROOT@", node.dev_root.to_str().unwrap());
    let spec: Value = serde_json::from_str(&text).unwrap();
    let hooks = spec["containerEdits"]["hooks"].as_array().expect("the golden has hooks");
    assert!(hooks.iter().all(|h| h["path"] == "/usr/bin/nvidia-cdi-hook"), "{hooks:?}");
    assert!(!Path::new("/usr/bin/nvidia-cdi-hook").exists(), "this test needs a node without NVIDIA's hook");
    spec
}

/// What NVIDIA's spec's hooks became, as the shim logs it.
const TRANSLATED: &str = "create-symlinks=translated,create-symlinks=translated,enable-cuda-compat=translated,\
update-ldcache=translated,disable-device-node-modification=translated,update-application-profile=translated";

#[test]
#[ignore = "needs root"]
fn a_node_with_only_nvidia_ctks_spec_starts_a_gpu_container() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = GpuNode::start(&NodeOptions::default()).unwrap_or_else(|e| panic!("node setup: {e}"));
    let spec = nvidia_spec(&node);
    only_nvidia_spec(&node, &spec);

    let run = node.run("nv0", &request("nvidia.com/gpu=0")).unwrap();
    assert_eq!(run.status, 0, "stdout: {} stderr: {}", run.stdout, run.stderr);
    let report = run.report();

    // GPU 0 only, with its real numbers (minor 0, which the spec leaves out), allowed by the
    // device cgroup (ENXIO: allowed, no driver behind it on the simulated node).
    let devices = report_devices(report);
    let gpus: Vec<_> = devices
        .iter()
        .filter(|(p, _)| {
            p.strip_prefix("/dev/nvidia")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|(p, (open, minor))| (p.as_str(), open.as_str(), *minor))
        .collect();
    assert_eq!(gpus, [("/dev/nvidia0", "ENXIO", 0)]);
    for (control, minor) in [
        ("/dev/nvidiactl", 255),
        ("/dev/nvidia-modeset", 254),
        ("/dev/nvidia-uvm", 0),
        ("/dev/nvidia-uvm-tools", 1),
    ] {
        assert_eq!(
            devices.get(control).map(|(open, m)| (open.as_str(), *m)),
            Some(("ENXIO", minor)),
            "{control}: {devices:?}"
        );
    }

    // Every file NVIDIA's spec mounts is mounted where it says (by nvinject-hook's one run, which
    // NVIDIA's translated hooks fold into).
    let wanted = assert_spec_mounts_mounted(&spec, report);
    assert!(wanted.iter().any(|m| m.ends_with("libnvidia-ml.so.550.54.15")), "{wanted:?}");
    assert!(wanted.iter().any(|m| m.ends_with("libcuda.so.550.54.15")), "{wanted:?}");
    assert_eq!(report["environ"]["NVIDIA_VISIBLE_DEVICES"], "void");
    assert_eq!(report["environ"]["NVIDIA_CTK_LIBCUDA_DIR"], "/usr/lib/x86_64-linux-gnu");
    assert_hooks_did_their_work("nv0", report, &[node.gpu_uuid(0)], Some("0x1"));

    let lines = create_lines(&node, "nv0");
    assert_eq!(lines[0]["injected"], "nvidia.com/gpu=0");
    assert_eq!(lines[0]["nvidia_hooks"], TRANSLATED, "{}", lines[0]);
    // The six translated runs (two create-symlinks) became one, with the mounts.
    assert_eq!(lines[0]["hooks_merged"], 6, "{}", lines[0]);
    let moved = lines[0]["mounts_in_hook"].as_u64().unwrap_or(0) as usize;
    assert!(moved > 0 && moved <= wanted.len(), "{}", lines[0]);

    // The same without folding: each translated run is its own nvinject-hook process, in NVIDIA's
    // order, and the container gets the same.
    node.set_one_hook_run(false).unwrap();
    let run = node.run("nv-sep", &request("nvidia.com/gpu=0")).unwrap();
    assert_eq!(run.status, 0, "stdout: {} stderr: {}", run.stdout, run.stderr);
    assert_hooks_did_their_work("nv-sep", run.report(), &[node.gpu_uuid(0)], Some("0x1"));
    let lines = create_lines(&node, "nv-sep");
    assert_eq!(lines[0]["nvidia_hooks"], TRANSLATED);
    assert_eq!((lines[0]["hooks_merged"].as_u64(), lines[0]["mounts_in_hook"].as_u64()), (Some(0), Some(0)));
    node.set_one_hook_run(true).unwrap();

    // The links NVIDIA's create-symlinks runs asked for are in the container, made by nvinject-hook.
    let links = node
        .run(
            "nv-links",
            &RunOptions {
                command: vec![
                    "/bin/readlink".into(),
                    "/usr/lib/x86_64-linux-gnu/libcuda.so".into(),
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                    "/usr/lib/x86_64-linux-gnu/gbm/nvidia-drm_gbm.so".into(),
                ],
                ..request("nvidia.com/gpu=0")
            },
        )
        .unwrap();
    assert_eq!(links.status, 0, "{} {}", links.stdout, links.stderr);
    let targets: Vec<&str> = links.stdout.lines().collect();
    assert_eq!(targets, ["libcuda.so.1", "libcuda.so.550.54.15", "../libnvidia-allocator.so.1"]);

    // A hook NVIDIA's hook has and nvinject-hook does not (nvidia-ctk's older `chmod`), with
    // NVIDIA's binary installed at its path: left to it, and runc runs it. (A stand-in binary at
    // a path of the node's own: the host's /usr/bin is not the test's to touch.)
    let stand_in = node.bin_dir.join("nvidia-cdi-hook");
    std::fs::write(&stand_in, "#!/bin/sh\necho nvidia-cdi-hook-ran \"$@\" >&2\nexit 3\n").unwrap();
    std::fs::set_permissions(&stand_in, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut kept = spec.clone();
    kept["containerEdits"]["hooks"] = serde_json::json!([{"hookName": "createContainer",
        "path": stand_in.to_str().unwrap(), "args": ["nvidia-cdi-hook", "chmod", "--mode", "755", "--path", "/dev/dri"]}]);
    std::fs::write(node.cdi_dir.join("nvidia.json"), serde_json::to_vec_pretty(&kept).unwrap()).unwrap();
    let hooked = node.run("nv-kept", &request("nvidia.com/gpu=0")).unwrap();
    assert_ne!(hooked.status, 0, "the stand-in fails the start, which shows it ran");
    assert!(hooked.stderr.contains("nvidia-cdi-hook-ran chmod"), "{}", hooked.stderr);
    assert_eq!(create_lines(&node, "nv-kept")[0]["nvidia_hooks"], "chmod=kept");
    std::fs::remove_file(&stand_in).unwrap();

    // A host path that is a symlink (here to the real node) is refused, naming the spec file,
    // the device node and the fix; nothing starts.
    let link = node.dev_root.join("dev/nvidia1-link");
    std::os::unix::fs::symlink("nvidia1", &link).unwrap();
    let mut linked = spec.clone();
    let gpu1 = linked["devices"].as_array_mut().unwrap().iter_mut().find(|d| d["name"] == "1").unwrap();
    gpu1["containerEdits"]["deviceNodes"][0]["hostPath"] = link.to_str().unwrap().into();
    std::fs::write(node.cdi_dir.join("nvidia.json"), serde_json::to_vec_pretty(&linked).unwrap()).unwrap();
    let refused = node.run("nv-link", &request("nvidia.com/gpu=1")).unwrap();
    assert_ne!(refused.status, 0);
    assert!(refused.report.is_none());
    let spec_file = node.cdi_dir.join("nvidia.json");
    for needle in [
        spec_file.to_str().unwrap(),
        "device node /dev/nvidia1",
        "is a symlink",
        "point hostPath at the device node",
    ] {
        assert!(refused.stderr.contains(needle), "`{needle}` missing from ctr's error: {}", refused.stderr);
    }
    std::fs::remove_file(&link).unwrap();
    node.assert_no_leftovers(&["nv0", "nv-sep", "nv-links", "nv-kept", "nv-link"]);
}

/// Makes `spec` the only spec in the node's spec dir, as `nvidia.json`, and points the shim at
/// the node's dev root and nvinject-hook.
fn only_nvidia_spec(node: &GpuNode, spec: &Value) {
    // The shim's `[regenerate] dev-root` names the dev root (NVIDIA's spec records none), so the
    // spec's host paths, which lie under it, are looked up inside it. The shim reads its config
    // at every start.
    let config = std::fs::read_to_string(&node.config_path).unwrap();
    // `hook-path` names the nvinject-hook that runs NVIDIA's hooks (the installer writes it).
    let config = config.replacen(
        "[regenerate]\n",
        &format!(
            "[regenerate]\ndev-root = {}\nhook-path = {}\n",
            toml_str(node.dev_root.to_str().unwrap()),
            toml_str(node.bin_dir.join("nvinject-hook").to_str().unwrap())
        ),
        1,
    );
    std::fs::write(&node.config_path, config).unwrap();

    std::fs::remove_file(&node.spec_path).unwrap();
    std::fs::write(node.cdi_dir.join("nvidia.json"), serde_json::to_vec_pretty(spec).unwrap()).unwrap();
    let files: Vec<_> = std::fs::read_dir(&node.cdi_dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(files, ["nvidia.json"], "only NVIDIA's spec is in the spec dir");
}

/// What NVIDIA's management spec's hooks became: its driver runs only (no graphics links, no
/// application profile).
const TRANSLATED_MANAGEMENT: &str = "create-symlinks=translated,enable-cuda-compat=translated,\
update-ldcache=translated,disable-device-node-modification=translated";

/// nvidia-ctk's management mode writes one device, `all`, with every NVIDIA device node of the
/// node (the MIG `config` and `monitor` capabilities too) and the driver's files as common edits;
/// with only that spec on the node, a container asking for `nvidia.com/gpu=all` gets every node,
/// every file the spec mounts, and NVML inside sees every GPU.
#[test]
#[ignore = "needs root"]
fn a_node_with_only_nvidia_ctks_management_spec_starts_a_container_with_every_device() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = GpuNode::start(&NodeOptions::default()).unwrap_or_else(|e| panic!("node setup: {e}"));
    let spec = nvidia_golden(&node, "nvidia-ctk-1.20.0-derived/h100x8-management.json");
    let names: Vec<&str> =
        spec["devices"].as_array().unwrap().iter().filter_map(|d| d["name"].as_str()).collect();
    assert_eq!(names, ["all"]);
    only_nvidia_spec(&node, &spec);

    let run = node.run("mgmt", &request("nvidia.com/gpu=all")).unwrap();
    assert_eq!(run.status, 0, "stdout: {} stderr: {}", run.stdout, run.stderr);
    let report = run.report();

    // Every node the spec lists, with the host's minor, allowed by the device cgroup (ENXIO:
    // allowed, no driver behind it on the simulated node), and nothing else of NVIDIA's.
    let wanted: BTreeMap<String, u64> = spec["devices"][0]["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["path"].as_str().unwrap().to_owned(), n["minor"].as_u64().unwrap_or(0)))
        .collect();
    assert!(
        wanted.contains_key("/dev/nvidia7") && wanted.contains_key("/dev/nvidia-caps/nvidia-cap1"),
        "{wanted:?}"
    );
    let devices = report_devices(report);
    let got: BTreeMap<String, u64> = devices
        .iter()
        .filter(|(p, _)| p.starts_with("/dev/nvidia"))
        .map(|(p, (open, minor))| {
            assert_eq!(open, "ENXIO", "{p}: {devices:?}");
            (p.clone(), *minor)
        })
        .collect();
    assert_eq!(got, wanted);

    assert_spec_mounts_mounted(&spec, report);
    assert_eq!(report["environ"]["NVIDIA_VISIBLE_DEVICES"], "void");
    let uuids: Vec<String> = (0..node.gpu_count()).map(|i| node.gpu_uuid(i)).collect();
    assert_eq!(uuids.len(), 8);
    // Management mode has no update-application-profile run (nvidia-ctk adds it only to the
    // common edits of its nvml mode): no profile.
    assert_hooks_did_their_work("mgmt", report, &uuids, None);

    let lines = create_lines(&node, "mgmt");
    assert_eq!(lines[0]["injected"], "nvidia.com/gpu=all");
    assert_eq!(lines[0]["nvidia_hooks"], TRANSLATED_MANAGEMENT, "{}", lines[0]);
    assert!(lines[0]["hooks_merged"].as_u64().unwrap_or(0) > 0, "{}", lines[0]);
    node.assert_no_leftovers(&["mgmt"]);
}

fn request(device: &str) -> RunOptions {
    RunOptions { annotations: vec![("cdi.k8s.io/test".into(), device.into())], ..Default::default() }
}

/// A TOML basic string: JSON's string quoting is a subset of it.
fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

fn create_lines(node: &GpuNode, id: &str) -> Vec<Value> {
    let lines: Vec<Value> =
        node.shim_log_for(id).into_iter().filter(|l| l["message"] == "container create").collect();
    assert_eq!(lines.len(), 1, "{id}: {lines:?}");
    lines
}

/// The loader cache NVIDIA's update-ldcache run asked for: the driver's libraries under their
/// SONAMEs, in the mounted folder, loadable (NVML initialises and lists `uuids`); and the compat
/// run left nothing (the probe image has no compat libraries).
/// Every container path of the spec's common mounts is mounted in the container the probe reported
/// on; those paths.
fn assert_spec_mounts_mounted(spec: &Value, report: &Value) -> BTreeSet<String> {
    let wanted: BTreeSet<String> = spec["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["containerPath"].as_str().unwrap().to_owned())
        .collect();
    let mounted: BTreeSet<String> = report["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["target"].as_str().unwrap())
        // The probe image is usr-merged: /lib/... is listed as /usr/lib/...
        .flat_map(|t| [t.to_owned(), t.strip_prefix("/usr").unwrap_or(t).to_owned()])
        .collect();
    let missing: Vec<_> = wanted.difference(&mounted).collect();
    assert!(missing.is_empty(), "not mounted: {missing:?}");
    wanted
}

fn assert_hooks_did_their_work(id: &str, report: &Value, uuids: &[String], profile_mask: Option<&str>) {
    let ldconfig: Vec<&str> =
        report["ldconfig"]["lines"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for soname in ["libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1"] {
        let want = format!("=> /usr/lib/x86_64-linux-gnu/{soname}");
        assert!(
            ldconfig.iter().any(|l| l.trim_start().starts_with(&format!("{soname} ")) && l.ends_with(&want)),
            "{id}: {soname} not in the cache: {ldconfig:?}"
        );
    }
    let conf_d: Vec<&str> =
        report["ld_so_conf_d"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(!conf_d.iter().any(|f| f.starts_with("00-compat")), "{id}: {conf_d:?}");
    assert_eq!(report["nvml"]["dlopen"], "ok", "{id}: {}", report["nvml"]);
    assert_eq!(report["nvml"]["uuids"], serde_json::json!(uuids), "{id}: {}", report["nvml"]);
    // update-application-profile (when the spec runs it): EGL/Vulkan limited to the container's
    // GPUs (bit N for minor N), as NVIDIA's hook writes it.
    let want = profile_mask.map(|mask| {
        let text = format!(
            r#"{{"profiles":[{{"name":"_container_","settings":["EGLVisibleDGPUDevices",{mask}]}}],"rules":[{{"pattern":[],"profile":"_container_"}}]}}"#
        );
        serde_json::json!({ "text": text, "mode": "444" })
    });
    assert_eq!(report["application_profile"], want.unwrap_or(Value::Null), "{id}");
}
