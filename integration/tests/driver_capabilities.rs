//! `NVIDIA_DRIVER_CAPABILITIES` on real parts: a private containerd and runc, our shim and hook,
//! the probe reporting from inside each container, on the simulated 8-GPU node. Requests by
//! `NVIDIA_VISIBLE_DEVICES` (privileged containers: the default policy honours the env only
//! there) get the driver files of the capabilities they ask for, as NVIDIA's legacy runtime gives
//! them; a CDI request (annotation) gets the whole spec whatever the variable says. Needs root.
//!
//! The tests run one at a time (they share the host's CPU cores and `/run/containerd/s`).

use std::sync::Mutex;

use nvinject_node_harness::node::{GpuNode, NodeOptions, RunOptions, RunResult, report_devices};
use serde_json::Value;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn node() -> GpuNode {
    GpuNode::start(&NodeOptions { preset: "h100x8".into(), ..Default::default() })
        .unwrap_or_else(|e| panic!("node setup: {e}"))
}

/// Runs a privileged container asking for GPU 3 by env, plus `extra` env.
fn run_env(node: &GpuNode, id: &str, extra: &[(&str, &str)]) -> RunResult {
    let mut env = vec![("NVIDIA_VISIBLE_DEVICES".to_owned(), "3".to_owned())];
    env.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    node.run(id, &RunOptions { env, privileged: true, ..Default::default() }).unwrap()
}

/// The container paths of the spec's common mounts.
fn spec_mounts(node: &GpuNode) -> Vec<String> {
    let spec: Value = serde_json::from_slice(&std::fs::read(&node.spec_path).unwrap()).unwrap();
    spec["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["containerPath"].as_str().unwrap().to_owned())
        .collect()
}

/// The spec's mounts the container has (the probe image is usr-merged: `/lib/...` shows as
/// `/usr/lib/...`).
fn mounted(report: &Value, spec: &[String]) -> Vec<String> {
    let targets: Vec<&str> =
        report["mounts"].as_array().unwrap().iter().filter_map(|m| m["target"].as_str()).collect();
    spec.iter()
        .filter(|p| targets.iter().any(|t| t == p || t.strip_prefix("/usr") == Some(p.as_str())))
        .cloned()
        .collect()
}

fn has_file(mounted: &[String], prefix: &str) -> bool {
    mounted.iter().any(|p| p.rsplit('/').next().is_some_and(|f| f.starts_with(prefix)))
}

fn ldconfig_has(report: &Value, lib: &str) -> bool {
    report["ldconfig"]["lines"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|l| l.as_str().is_some_and(|s| s.contains(lib)))
}

fn create_line(node: &GpuNode, id: &str) -> Value {
    let lines: Vec<Value> =
        node.shim_log_for(id).into_iter().filter(|l| l["message"] == "container create").collect();
    assert_eq!(lines.len(), 1, "exactly one log line per container: {lines:?}");
    lines[0].clone()
}

/// The container has GPU 3 (allowed by the cgroup: ENXIO, no driver behind it) and the control
/// nodes, whatever the capabilities.
fn assert_devices(report: &Value) {
    let devices = report_devices(report);
    for node in ["/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm"] {
        assert_eq!(devices.get(node).map(|d| d.0.as_str()), Some("ENXIO"), "{node}: {devices:?}");
    }
}

#[test]
#[ignore = "needs root"]
fn driver_capabilities_select_the_injected_files_of_env_requests() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = node();
    let spec = spec_mounts(&node);
    assert!(has_file(&spec, "libGLX_nvidia.so") && has_file(&spec, "libcuda.so"), "{spec:?}");

    // utility: nvidia-smi and NVML, nothing of CUDA.
    let run = run_env(&node, "caps-utility", &[("NVIDIA_DRIVER_CAPABILITIES", "utility")]);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let report = run.report();
    let files = mounted(report, &spec);
    assert!(files.iter().any(|p| p == "/usr/bin/nvidia-smi"), "{files:?}");
    assert!(has_file(&files, "libnvidia-ml.so"), "{files:?}");
    for absent in ["libcuda.so", "nvidia-cuda-mps-server", "libGLX_nvidia.so", "libnvcuvid.so"] {
        assert!(!has_file(&files, absent), "{absent} injected for utility: {files:?}");
    }
    assert!(ldconfig_has(report, "libnvidia-ml.so.1"), "{}", report["ldconfig"]);
    assert!(!ldconfig_has(report, "libcuda.so"), "{}", report["ldconfig"]);
    // The application profile is graphics' (EGL/Vulkan): not written for utility.
    assert_eq!(report["application_profile"], Value::Null);
    assert_eq!(report["nvml"]["dlopen"], "ok", "{}", report["nvml"]);
    let smi = report["nvidia_smi"]["lines"].as_array().cloned().unwrap_or_default();
    assert_eq!(smi.len(), 1, "{smi:?}");
    assert!(smi[0].as_str().unwrap().contains(&node.gpu_uuid(3)), "{smi:?}");
    assert_devices(report);
    let line = create_line(&node, "caps-utility");
    assert_eq!(line["capabilities"], "utility", "{line}");
    assert!(line["left_out"].as_u64().unwrap() > 0, "{line}");

    // compute,utility: CUDA too, still no graphics.
    let run = run_env(&node, "caps-compute", &[("NVIDIA_DRIVER_CAPABILITIES", "compute,utility")]);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let files = mounted(run.report(), &spec);
    for present in [
        "libcuda.so",
        "libnvidia-ml.so",
        "nvidia-smi",
        "nvidia-cuda-mps-server",
        "libnvidia-ptxjitcompiler.so",
    ] {
        assert!(has_file(&files, present), "{present} missing for compute,utility: {files:?}");
    }
    assert!(!has_file(&files, "libGLX_nvidia.so"), "{files:?}");
    assert!(ldconfig_has(run.report(), "libcuda.so.1"), "{}", run.report()["ldconfig"]);
    assert_devices(run.report());

    // Unset: NVIDIA's default, utility,compute.
    let run = run_env(&node, "caps-unset", &[]);
    assert_eq!(run.status, 0, "{}", run.stderr);
    assert_eq!(mounted(run.report(), &spec), files, "unset is compute,utility");
    assert_eq!(create_line(&node, "caps-unset")["capabilities"], "compute,utility (default)");

    // all: every file of the spec.
    let run = run_env(&node, "caps-all", &[("NVIDIA_DRIVER_CAPABILITIES", "all")]);
    assert_eq!(run.status, 0, "{}", run.stderr);
    assert_eq!(mounted(run.report(), &spec), spec);
    assert_eq!(create_line(&node, "caps-all")["left_out"], 0);
    // With graphics, the application profile names GPU 3 only (minor 3: bit 3).
    let profile = run.report()["application_profile"]["text"].as_str().unwrap_or_default();
    assert!(profile.contains(r#"["EGLVisibleDGPUDevices",0x8]"#), "{}", run.report()["application_profile"]);
    assert_devices(run.report());

    node.assert_no_leftovers(&["caps-utility", "caps-compute", "caps-unset", "caps-all"]);
}

#[test]
#[ignore = "needs root"]
fn cdi_requests_ignore_the_variable_and_unknown_capabilities_fail_clearly() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = node();
    let spec = spec_mounts(&node);

    // An annotation is a CDI request: the whole spec, as NVIDIA's cdi mode gives it.
    let env = vec![("NVIDIA_DRIVER_CAPABILITIES".to_owned(), "utility".to_owned())];
    let annotations = vec![("cdi.k8s.io/test".to_owned(), "nvidia.com/gpu=3".to_owned())];
    let run = node.run("caps-cdi", &RunOptions { env, annotations, ..Default::default() }).unwrap();
    assert_eq!(run.status, 0, "{}", run.stderr);
    assert_eq!(mounted(run.report(), &spec), spec);
    assert_eq!(create_line(&node, "caps-cdi")["capabilities"], "");

    // A name NVIDIA's hook refuses: the container does not start, and ctr says why.
    let run = run_env(&node, "caps-bad", &[("NVIDIA_DRIVER_CAPABILITIES", "compute,gpu")]);
    assert_ne!(run.status, 0);
    assert!(run.report.is_none());
    for needle in ["unknown driver capability \"gpu\"", "NVIDIA_DRIVER_CAPABILITIES", "nvinject"] {
        assert!(run.stderr.contains(needle), "`{needle}` missing from ctr's error: {}", run.stderr);
    }
    assert!(node.shim_log_for("caps-bad").iter().any(|l| l["message"] == "container create refused"));
    node.assert_no_leftovers(&["caps-cdi", "caps-bad"]);
}

/// Volume-mount requests and (where the policy accepts them) unprivileged env requests are legacy
/// requests too: `video` brings compute's files and no utility, `graphics` no CUDA.
#[test]
#[ignore = "needs root"]
fn volume_mounts_and_accepted_unprivileged_env_follow_the_variable() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = GpuNode::start(&NodeOptions {
        preset: "h100x8".into(),
        config_extra: "[requests]\naccept-nvidia-visible-devices-as-volume-mounts = true\n\
                       accept-env-unprivileged = true\n"
            .into(),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("node setup: {e}"));
    let spec = spec_mounts(&node);

    let uuid = node.gpu_uuid(3);
    let mount =
        format!("type=bind,src=/dev/null,dst=/var/run/nvidia-container-devices/{uuid},options=rbind:ro");
    let env = vec![("NVIDIA_DRIVER_CAPABILITIES".to_owned(), "video".to_owned())];
    let run = node.run("caps-video", &RunOptions { mounts: vec![mount], env, ..Default::default() }).unwrap();
    assert_eq!(run.status, 0, "{}", run.stderr);
    let files = mounted(run.report(), &spec);
    for present in ["libnvcuvid.so", "libnvidia-encode.so", "libcuda.so"] {
        assert!(has_file(&files, present), "{present} missing for video: {files:?}");
    }
    for absent in ["nvidia-smi", "libnvidia-ml.so", "libGLX_nvidia.so"] {
        assert!(!has_file(&files, absent), "{absent} injected for video: {files:?}");
    }
    assert!(run.report()["nvidia_smi"].is_null(), "{}", run.report()["nvidia_smi"]);
    assert_devices(run.report());
    let line = create_line(&node, "caps-video");
    assert_eq!(
        (line["source"].as_str(), line["capabilities"].as_str()),
        (Some("volume-mounts"), Some("video"))
    );

    let env = vec![
        ("NVIDIA_VISIBLE_DEVICES".to_owned(), "3".to_owned()),
        ("NVIDIA_DRIVER_CAPABILITIES".to_owned(), "graphics".to_owned()),
    ];
    let run = node.run("caps-graphics", &RunOptions { env, ..Default::default() }).unwrap();
    assert_eq!(run.status, 0, "{}", run.stderr);
    let files = mounted(run.report(), &spec);
    for present in ["libGLX_nvidia.so", "libEGL_nvidia.so", "libnvidia-glcore.so", "nvidia_icd.json"] {
        assert!(has_file(&files, present), "{present} missing for graphics: {files:?}");
    }
    for absent in ["libcuda.so", "nvidia-smi", "libnvcuvid.so"] {
        assert!(!has_file(&files, absent), "{absent} injected for graphics: {files:?}");
    }
    assert!(ldconfig_has(run.report(), "libGLX_nvidia.so.0"), "{}", run.report()["ldconfig"]);
    assert_devices(run.report());
    node.assert_no_leftovers(&["caps-video", "caps-graphics"]);
}
