//! Issue 12 item 1 on real parts: a node whose CDI spec directory holds only the spec NVIDIA's
//! nvidia-ctk 1.20 wrote for it (no `type` on any device node, no `minor` where it is 0) starts a
//! container asking for `nvidia.com/gpu=0` through our shim, private containerd and runc, and the
//! probe reports from inside what it got. Needs root (CI runs as root).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;

use nvinject_integration::node::{GpuNode, NodeOptions, RunOptions, report_devices};
use serde_json::Value;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// nvidia-ctk's recorded h100x8 spec with this node's roots in place of its placeholders.
///
/// Its hooks are dropped. They all run `/usr/bin/nvidia-cdi-hook` (create-symlinks, update-ldcache,
/// enable-cuda-compat, ...), which this node does not have, and runc fails a start whose hook
/// binary is missing: that is what NVIDIA's own runtime does too, so a node moving from NVIDIA's
/// toolkit keeps nvidia-cdi-hook installed for as long as it keeps NVIDIA's specs. What this test
/// is about is that nvinject reads and applies the spec: device nodes completed from the host,
/// control nodes, mounts, env. A stub hook would only show that runc runs a hook.
fn nvidia_spec(node: &GpuNode) -> Value {
    let golden =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../cdi/tests/golden/nvidia-ctk-1.20.0/h100x8.json");
    let text = std::fs::read_to_string(&golden).unwrap_or_else(|e| panic!("{}: {e}", golden.display()));
    let text = text
        .replace("@DRIVER_ROOT@", node.driver_root.to_str().unwrap())
        .replace("@DEV_ROOT@", node.dev_root.to_str().unwrap());
    let mut spec: Value = serde_json::from_str(&text).unwrap();
    let hooks = spec["containerEdits"].as_object_mut().unwrap().remove("hooks");
    assert!(
        hooks.is_some_and(|h| h.as_array().is_some_and(|a| !a.is_empty())),
        "the golden has hooks to drop"
    );
    spec
}

#[test]
fn a_node_with_only_nvidia_ctks_spec_starts_a_gpu_container() {
    let _s = serial();
    let node = GpuNode::start(&NodeOptions::default()).unwrap_or_else(|e| panic!("node setup: {e}"));
    // The shim's `[regenerate] dev-root` names the dev root (NVIDIA's spec records none), so the
    // spec's host paths, which lie under it, are looked up inside it. The shim reads its config
    // at every start.
    let config = std::fs::read_to_string(&node.config_path).unwrap();
    let config = config.replacen(
        "[regenerate]\n",
        &format!("[regenerate]\ndev-root = {}\n", toml_str(node.dev_root.to_str().unwrap())),
        1,
    );
    std::fs::write(&node.config_path, config).unwrap();

    let spec = nvidia_spec(&node);
    std::fs::remove_file(&node.spec_path).unwrap();
    std::fs::write(node.cdi_dir.join("nvidia.json"), serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    let files: Vec<_> = std::fs::read_dir(&node.cdi_dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(files, ["nvidia.json"], "only NVIDIA's spec is in the spec dir");

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

    // Every file NVIDIA's spec mounts is mounted where it says (runc makes the mounts: the spec
    // has no nvinject-hook to fold them into).
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
    assert!(wanted.iter().any(|m| m.ends_with("libnvidia-ml.so.550.54.15")), "{wanted:?}");
    assert!(wanted.iter().any(|m| m.ends_with("libcuda.so.550.54.15")), "{wanted:?}");
    assert_eq!(report["environ"]["NVIDIA_VISIBLE_DEVICES"], "void");
    assert_eq!(report["environ"]["NVIDIA_CTK_LIBCUDA_DIR"], "/usr/lib/x86_64-linux-gnu");

    let lines: Vec<Value> =
        node.shim_log_for("nv0").into_iter().filter(|l| l["message"] == "container create").collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["injected"], "nvidia.com/gpu=0");
    assert_eq!(lines[0]["mounts_in_hook"], 0, "{}", lines[0]);

    // With NVIDIA's hooks kept and no nvidia-cdi-hook on the node, the shim applies the spec and
    // runc refuses the start naming the missing hook, as it does under NVIDIA's own runtime.
    let mut with_hooks = spec.clone();
    with_hooks["containerEdits"]["hooks"] = serde_json::json!([{"hookName": "createContainer",
        "path": "/usr/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "update-ldcache"]}]);
    std::fs::write(node.cdi_dir.join("nvidia.json"), serde_json::to_vec_pretty(&with_hooks).unwrap())
        .unwrap();
    let hooked = node.run("nv-hooks", &request("nvidia.com/gpu=0")).unwrap();
    assert_ne!(hooked.status, 0);
    assert!(hooked.stderr.contains("nvidia-cdi-hook"), "runc names the missing hook: {}", hooked.stderr);
    assert!(
        node.shim_log_for("nv-hooks")
            .iter()
            .any(|l| l["message"] == "container create" && l["injected"] == "nvidia.com/gpu=0"),
        "the shim applied the spec; runc refused the hook"
    );

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
    node.assert_no_leftovers(&["nv0", "nv-hooks", "nv-link"]);
}

fn request(device: &str) -> RunOptions {
    RunOptions { annotations: vec![("cdi.k8s.io/test".into(), device.into())], ..Default::default() }
}

/// A TOML basic string: JSON's string quoting is a subset of it.
fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}
