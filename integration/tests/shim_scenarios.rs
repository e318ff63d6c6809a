//! Issue 4's scenarios on real parts: a private containerd (Debian 12's 1.6 by default;
//! `NVINJECT_CONTAINERD=1.7` or `2.1`, and `NVINJECT_CONTAINERD_CDI=on|off`, pick another build, see
//! `nvinject_node_harness::containerd`) and runc from Debian, our shim and hook as containerd runs them, the probe reporting from inside each container, on the simulated
//! 8-GPU node (and the MIG preset for scenario 5). Needs root (CI runs as root).
//!
//! The tests run one at a time (they share two CPU cores and the host's `/run/containerd/s`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use nvinject_image_tool::image;
use nvinject_node_harness::cri::{ContainerRequest, CriClient};
use nvinject_node_harness::node::{
    GpuNode, NodeOptions, RUNC_RUNTIME, RunOptions, parse_report, report_devices,
};
use nvinject_node_harness::{mounts, process};
use serde_json::Value;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn node(preset: &str) -> GpuNode {
    GpuNode::start(&NodeOptions { preset: preset.into(), ..Default::default() })
        .unwrap_or_else(|e| panic!("node setup: {e}"))
}

/// GPU device nodes (`/dev/nvidiaN`) the container has, with what open() said.
fn gpu_nodes(report: &Value) -> Vec<(String, String)> {
    report_devices(report)
        .into_iter()
        .filter(|(p, _)| {
            p.strip_prefix("/dev/nvidia")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|(p, (open, _))| (p, open))
        .collect()
}

fn smi_lines(report: &Value) -> Vec<String> {
    report["nvidia_smi"]["lines"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l.as_str().map(str::to_owned))
        .collect()
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

fn annotation(value: &str) -> Vec<(String, String)> {
    vec![("cdi.k8s.io/test".into(), value.into())]
}

/// The containerd under test is the one selected, and the output says which (CI runs this file once
/// per version).
#[test]
#[ignore = "needs root"]
fn s0_the_selected_containerd_is_the_one_running() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = node("h100x8");
    let build = &node.containerd.build;
    let version = node.containerd.server_version().unwrap();
    println!("shim scenarios on {} (server {version})", build.label());
    let (major, minor) = build.version;
    assert!(version.starts_with(&format!("{major}.{minor}.")), "{} runs {version}", build.label());
}

#[test]
#[ignore = "needs root"]
fn s1_annotation_gives_exactly_the_requested_gpu_with_libraries_and_ld_cache() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = node("h100x8");
    let run = node
        .run("s1", &RunOptions { annotations: annotation("nvidia.com/gpu=1"), ..Default::default() })
        .unwrap();
    assert_eq!(run.status, 0, "{}", run.stderr);
    let report = run.report();

    // Exactly GPU 1, allowed by the device cgroup (ENXIO: allowed, no driver behind it).
    assert_eq!(gpu_nodes(report), [("/dev/nvidia1".to_owned(), "ENXIO".to_owned())]);
    let devices = report_devices(report);
    for control in ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] {
        assert_eq!(devices.get(control).map(|d| d.0.as_str()), Some("ENXIO"), "{control}: {devices:?}");
    }
    // The libraries are there and in the updated ld cache; NVML loads by SONAME.
    for lib in ["libnvidia-ml.so.1", "libcuda.so.1"] {
        assert!(ldconfig_has(report, lib), "{lib} not in ldconfig -p: {}", report["ldconfig"]);
    }
    assert!(report["ld_so_conf_d"].as_array().unwrap().iter().any(|n| n == "00-nvinject.conf"));
    assert_eq!(report["nvml"]["dlopen"], "ok", "{}", report["nvml"]);
    // The nvidia-smi stand-in inside lists exactly GPU 1.
    let smi = smi_lines(report);
    assert_eq!(smi.len(), 1, "{smi:?}");
    assert!(smi[0].contains(&node.gpu_uuid(1)), "{smi:?}");

    let line = create_line(&node, "s1");
    assert_eq!(line["requested"], "nvidia.com/gpu=1");
    assert_eq!(line["injected"], "nvidia.com/gpu=1");
    assert!(line["source"].as_str().unwrap().starts_with("annotations"), "{line}");
    node.assert_no_leftovers(&["s1"]);
}

#[test]
#[ignore = "needs root"]
fn s2_env_requests_are_honoured_for_privileged_containers_only() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = node("h100x8");
    let env = vec![("NVIDIA_VISIBLE_DEVICES".to_owned(), "2".to_owned())];
    let privileged = node
        .run("s2-priv", &RunOptions { env: env.clone(), privileged: true, ..Default::default() })
        .unwrap();
    assert_eq!(privileged.status, 0, "{}", privileged.stderr);
    assert_eq!(gpu_nodes(privileged.report()), [("/dev/nvidia2".to_owned(), "ENXIO".to_owned())]);
    // The spec's common edits replace the request with `void`, as NVIDIA's specs do, so no other
    // layer (a legacy hook) acts on it again.
    assert_eq!(privileged.report()["environ"]["NVIDIA_VISIBLE_DEVICES"], "void");
    assert_eq!(create_line(&node, "s2-priv")["source"], "NVIDIA_VISIBLE_DEVICES");

    let plain = node.run("s2-unpriv", &RunOptions { env, ..Default::default() }).unwrap();
    assert_eq!(plain.status, 0, "{}", plain.stderr);
    assert!(gpu_nodes(plain.report()).is_empty(), "{:?}", gpu_nodes(plain.report()));
    assert!(smi_lines(plain.report()).is_empty());
    let line = create_line(&node, "s2-unpriv");
    assert_eq!(line["injected"], "");
    assert!(line["ignored"].as_str().unwrap().contains("not privileged"), "{line}");
    node.assert_no_leftovers(&["s2-priv", "s2-unpriv"]);
}

#[test]
#[ignore = "needs root"]
fn s3_volume_mount_requests_name_devices_by_uuid() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    // Volume-mount requests are off by default (as NVIDIA's toolkit); this scenario turns them on.
    let node = GpuNode::start(&NodeOptions {
        config_extra: "[requests]\naccept-nvidia-visible-devices-as-volume-mounts = true\n".into(),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("node setup: {e}"));
    let uuid = node.gpu_uuid(3);
    let mount =
        format!("type=bind,src=/dev/null,dst=/var/run/nvidia-container-devices/{uuid},options=rbind:ro");
    let run = node.run("s3", &RunOptions { mounts: vec![mount], ..Default::default() }).unwrap();
    assert_eq!(run.status, 0, "{}", run.stderr);
    assert_eq!(gpu_nodes(run.report()), [("/dev/nvidia3".to_owned(), "ENXIO".to_owned())]);
    let smi = smi_lines(run.report());
    assert!(smi.len() == 1 && smi[0].contains(&uuid), "{smi:?}");
    assert_eq!(create_line(&node, "s3")["source"], "volume-mounts");
    node.assert_no_leftovers(&["s3"]);
}

#[test]
#[ignore = "needs root"]
fn s4_all_gives_every_gpu() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = node("h100x8");
    let run = node
        .run("s4", &RunOptions { annotations: annotation("nvidia.com/gpu=all"), ..Default::default() })
        .unwrap();
    assert_eq!(run.status, 0, "{}", run.stderr);
    let gpus = gpu_nodes(run.report());
    assert_eq!(gpus.len(), 8, "{gpus:?}");
    assert!(gpus.iter().all(|(_, open)| open == "ENXIO"), "{gpus:?}");
    let smi = smi_lines(run.report());
    assert_eq!(smi.len(), 8, "{smi:?}");
    for i in 0..8 {
        assert!(smi.iter().any(|l| l.contains(&node.gpu_uuid(i))), "GPU {i} missing from {smi:?}");
    }
    node.assert_no_leftovers(&["s4"]);
}

#[test]
#[ignore = "needs root"]
fn s5_a_mig_device_brings_its_parent_gpu_and_capability_nodes() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = node("a100-mig");
    // GPU 0 is in MIG mode; ask for its MIG device 1 by index name.
    let run = node
        .run("s5", &RunOptions { annotations: annotation("nvidia.com/gpu=0:1"), ..Default::default() })
        .unwrap();
    assert_eq!(run.status, 0, "{}", run.stderr);
    let report = run.report();
    assert_eq!(gpu_nodes(report), [("/dev/nvidia0".to_owned(), "ENXIO".to_owned())], "the parent GPU only");
    let caps: Vec<String> =
        report_devices(report).into_keys().filter(|p| p.starts_with("/dev/nvidia-caps/")).collect();
    assert_eq!(caps.len(), 2, "one GI and one CI capability node: {caps:?}");
    let smi = smi_lines(report);
    assert!(smi.iter().any(|l| l.contains("MIG-")), "nvidia-smi shows the MIG device: {smi:?}");
    let line = create_line(&node, "s5");
    assert_eq!(line["injected"], "nvidia.com/gpu=0:1");
    node.assert_no_leftovers(&["s5"]);
}

#[test]
#[ignore = "needs root"]
fn s6_an_unresolvable_device_fails_clearly_and_leaves_nothing_behind() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = node("h100x8");
    let spec_before = std::fs::read(&node.spec_path).unwrap();
    let run = node
        .run("s6", &RunOptions { annotations: annotation("nvidia.com/gpu=9"), ..Default::default() })
        .unwrap();
    assert_ne!(run.status, 0);
    // ctr shows the device, the specs searched and the spec dirs.
    for needle in ["nvidia.com/gpu=9", "no device `9`", &node.cdi_dir.to_string_lossy(), "nvinject"] {
        assert!(run.stderr.contains(needle), "`{needle}` missing from ctr's error: {}", run.stderr);
    }
    assert!(run.report.is_none());
    node.assert_no_leftovers(&["s6", "s6-other", "s6-bad"]);
    // No half-written files: the spec dir holds exactly the spec, unchanged; no bundle survives.
    let names: Vec<_> = std::fs::read_dir(&node.cdi_dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, [node.spec_path.file_name().unwrap()]);
    assert_eq!(std::fs::read(&node.spec_path).unwrap(), spec_before);
    let bundles =
        node.containerd.state.join("io.containerd.runtime.v2.task").join(&node.containerd.namespace);
    assert!(
        std::fs::read_dir(&bundles).map(|d| d.count()).unwrap_or(0) == 0,
        "bundle left in {}",
        bundles.display()
    );
    let line = node.shim_log_for("s6");
    assert!(line.iter().any(|l| l["message"] == "container create refused"), "{line:?}");

    // A broken spec file of another vendor does not break ours, and a malformed one of ours is named.
    std::fs::write(
        node.cdi_dir.join("other-vendor.yaml"),
        "cdiVersion: 0.5.0\nkind: other.com/x\ndevices: [oops\n",
    )
    .unwrap();
    let ok = node
        .run("s6-other", &RunOptions { annotations: annotation("nvidia.com/gpu=0"), ..Default::default() })
        .unwrap();
    assert_eq!(ok.status, 0, "{}", ok.stderr);
    std::fs::write(
        &node.spec_path,
        b"{ \"cdiVersion\": \"0.6.0\", \"kind\": \"nvidia.com/gpu\", \"devices\": 7 }",
    )
    .unwrap();
    let bad = node
        .run("s6-bad", &RunOptions { annotations: annotation("nvidia.com/gpu=0"), ..Default::default() })
        .unwrap();
    assert_ne!(bad.status, 0);
    assert!(bad.stderr.contains("nvidia.com-gpu.json"), "the malformed spec is named: {}", bad.stderr);
    node.assert_no_leftovers(&["s6", "s6-other", "s6-bad"]);
}

#[test]
#[ignore = "needs root"]
fn s8_a_container_without_requests_is_exactly_what_runc_gives() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = node("h100x8");
    let ours = node.run("s8-ours", &RunOptions::default()).unwrap();
    let runc =
        node.run("s8-runc", &RunOptions { runtime: RUNC_RUNTIME.into(), ..Default::default() }).unwrap();
    assert_eq!((ours.status, runc.status), (0, 0), "{} / {}", ours.stderr, runc.stderr);
    let (a, b) = (ours.report(), runc.report());
    assert_eq!(a["devices"], b["devices"]);
    assert_eq!(a["environ"], b["environ"]);
    assert_eq!(a["ldconfig"], b["ldconfig"]);
    assert_eq!(a["ld_so_conf_d"], b["ld_so_conf_d"]);
    assert_eq!(a["nvml"], b["nvml"]);
    let targets = |r: &Value| -> Vec<String> {
        r["mounts"].as_array().unwrap().iter().map(|m| m["target"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(targets(a), targets(b));
    let line = create_line(&node, "s8-ours");
    assert_eq!(line["wrote"], false, "config.json must not be rewritten: {line}");
    node.assert_no_leftovers(&["s8-ours", "s8-runc"]);
}

/// Scenario 7: a CRI pod (runtime handler `nvidia`) with two containers asking for different GPUs,
/// both served by one proxy, the sandbox untouched; then a Create sent straight to the proxy's
/// socket over ttrpc, without any `start`, as containerd 2.x sends every container after the first.
#[test]
#[ignore = "needs root"]
fn s7_a_cri_pod_shares_one_proxy_and_a_direct_ttrpc_create_is_injected() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node =
        GpuNode::start(&NodeOptions { cri: true, ..Default::default() }).unwrap_or_else(|e| panic!("{e}"));
    let mut cri = CriClient::connect(&node.containerd.socket).unwrap();
    let parent = node.containerd.cgroup_parent();
    let pod = cri
        .run_pod("gpupod", "nvidia", &node.base().join("pod-logs"), &parent, HashMap::new())
        .unwrap_or_else(|e| panic!("{e}\ncontainerd log:\n{}", node.containerd.log_tail(40)));
    let mut ids = Vec::new();
    for (name, gpu) in [("first", 1), ("second", 2)] {
        let req = ContainerRequest {
            name: name.into(),
            image: nvinject_node_harness::node::PROBE_IMAGE.into(),
            command: vec![nvinject_node_harness::node::PROBE_PATH.into(), "report".into()],
            annotations: HashMap::from([(
                "cdi.k8s.io/nvinject-device-plugin_x".to_owned(),
                format!("nvidia.com/gpu={}", node.gpu_uuid(gpu)),
            )]),
            ..Default::default()
        };
        let id = cri
            .create_container(&pod, &req)
            .unwrap_or_else(|e| panic!("{e}\n{}", node.containerd.log_tail(40)));
        cri.start_container(&id).unwrap();
        assert_eq!(cri.wait_exited(&id, Duration::from_secs(60)).unwrap(), 0);
        let report = parse_report(&cri.logs(&pod, name))
            .unwrap_or_else(|| panic!("no report in {}", cri.logs(&pod, name)));
        assert_eq!(gpu_nodes(&report), [(format!("/dev/nvidia{gpu}"), "ENXIO".to_owned())], "{name}");
        let smi = smi_lines(&report);
        assert!(smi.len() == 1 && smi[0].contains(&node.gpu_uuid(gpu)), "{name}: {smi:?}");
        // containerd's own CDI (2.x's default) resolves the annotation before the shim sees the
        // container: the shim finds the edits there and adds nothing twice.
        let line = create_line(&node, &id);
        if node.containerd.build.cdi {
            assert_eq!(line["already_present"], format!("nvidia.com/gpu={}", node.gpu_uuid(gpu)), "{line}");
        } else {
            assert_eq!(line["injected"], format!("nvidia.com/gpu={}", node.gpu_uuid(gpu)), "{line}");
        }
        ids.push(id);
    }
    // A container asking for a device the node does not have fails with a reason naming it: with
    // containerd's CDI on, at CreateContainer (containerd resolves it); off, at StartContainer
    // (where containerd sends the task Create) with the shim's reason. The pod keeps working.
    let bad = ContainerRequest {
        name: "bad".into(),
        image: nvinject_node_harness::node::PROBE_IMAGE.into(),
        command: vec![nvinject_node_harness::node::PROBE_PATH.into(), "report".into()],
        annotations: HashMap::from([("cdi.k8s.io/x".to_owned(), "nvidia.com/gpu=42".to_owned())]),
        ..Default::default()
    };
    if node.containerd.build.cdi {
        let err = cri.create_container(&pod, &bad).unwrap_err().to_string();
        assert!(err.contains("nvidia.com/gpu=42") && err.contains("unresolvable CDI devices"), "{err}");
    } else {
        let bad_id = cri.create_container(&pod, &bad).unwrap();
        let err = cri.start_container(&bad_id).unwrap_err().to_string();
        assert!(
            err.contains("nvidia.com/gpu=42") && err.contains(&node.cdi_dir.to_string_lossy().into_owned()),
            "{err}"
        );
    }

    // One proxy serves the whole pod.
    let proxies: Vec<_> = node
        .containerd
        .shim_processes()
        .into_iter()
        .filter(|p| p.argv.iter().any(|a| a == "proxy"))
        .collect();
    assert_eq!(proxies.len(), 1, "{proxies:?}");
    let proxy_socket = proxies[0].argv.iter().skip_while(|a| *a != "--listen").nth(1).cloned().unwrap();
    // The sandbox was left alone.
    let sandbox_line = node.shim_log_for(&pod.id);
    assert!(sandbox_line.iter().any(|l| l["source"] == "sandbox" && l["wrote"] == false), "{sandbox_line:?}");
    let sandbox_bundle = node.containerd.state.join("io.containerd.runtime.v2.task/k8s.io").join(&pod.id);
    let sandbox_spec: Value =
        serde_json::from_slice(&std::fs::read(sandbox_bundle.join("config.json")).unwrap()).unwrap();
    assert!(!sandbox_spec.to_string().contains("/dev/nvidia"), "the sandbox must get no GPU");

    direct_ttrpc_create(&node, &proxy_socket, &sandbox_spec);

    cri.remove_pod(&pod).unwrap();
    let gone = process::wait_for("the pod's shims to exit", Duration::from_secs(15), || {
        node.containerd.shim_processes().is_empty().then_some(())
    });
    assert!(gone.is_ok(), "left: {:?}", node.containerd.shim_processes());
    for socket in node.containerd.shim_sockets("k8s.io", &pod.id) {
        assert!(!socket.exists(), "{} left behind", socket.display());
    }
    assert!(mounts::mounts_under(&node.containerd.state).is_empty());
}

/// Creates, starts and waits for a container through the proxy's ttrpc socket directly.
fn direct_ttrpc_create(node: &GpuNode, proxy_socket: &str, sandbox_spec: &Value) {
    use containerd_shim_protos::api::{CreateTaskRequest, DeleteRequest, StartRequest, WaitRequest};
    use protobuf::Message;

    let id = "direct-ttrpc";
    let bundle = node.base().join("direct-bundle");
    let rootfs = bundle.join("rootfs");
    std::fs::create_dir_all(&bundle).unwrap();
    let spec = image::ImageSpec {
        name: "direct".into(),
        programs: vec![nvinject_simnode::artifacts::artifact("nvinject-integration", "nvinject-probe")],
        cmd: vec![],
        env: vec![],
    };
    image::assemble_root(&spec, &rootfs).unwrap();
    let mut config = sandbox_spec.clone();
    config["root"] = serde_json::json!({"path": rootfs, "readonly": false});
    config["process"]["args"] = serde_json::json!([nvinject_node_harness::node::PROBE_PATH, "report"]);
    config["process"]["terminal"] = Value::Bool(false);
    let annotations = config["annotations"].as_object_mut().unwrap();
    annotations.insert("io.kubernetes.cri.container-type".into(), "container".into());
    annotations.insert("cdi.k8s.io/direct".into(), "nvidia.com/gpu=5".into());
    config["linux"]["cgroupsPath"] = Value::String(format!("{}/{id}", node.containerd.cgroup_parent()));
    std::fs::write(bundle.join("config.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    let out = node.base().join("direct.out");

    let client = ttrpc::Client::connect(proxy_socket).unwrap();
    // containerd 2.x's runc shim serves the task API as v3 only (same messages).
    let service =
        if node.containerd.build.is_v2() { "containerd.task.v3.Task" } else { "containerd.task.v2.Task" };
    let call = |method: &str, payload: Vec<u8>| -> Vec<u8> {
        let req = ttrpc::proto::Request {
            service: service.into(),
            method: method.into(),
            payload,
            timeout_nano: Duration::from_secs(60).as_nanos() as i64,
            ..Default::default()
        };
        client.request(req).unwrap_or_else(|e| panic!("{method}: {e}")).payload
    };
    let create = CreateTaskRequest {
        id: id.into(),
        bundle: bundle.to_string_lossy().into_owned(),
        stdout: format!("file://{}", out.display()),
        stderr: format!("file://{}", out.display()),
        ..Default::default()
    };
    call("Create", create.write_to_bytes().unwrap());
    call("Start", StartRequest { id: id.into(), ..Default::default() }.write_to_bytes().unwrap());
    call("Wait", WaitRequest { id: id.into(), ..Default::default() }.write_to_bytes().unwrap());
    call("Delete", DeleteRequest { id: id.into(), ..Default::default() }.write_to_bytes().unwrap());

    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let report = parse_report(&text).unwrap_or_else(|| panic!("no report from the direct container: {text}"));
    assert_eq!(gpu_nodes(&report), [("/dev/nvidia5".to_owned(), "ENXIO".to_owned())]);
    assert!(smi_lines(&report).iter().any(|l| l.contains(&node.gpu_uuid(5))));
    assert_eq!(create_line(node, id)["injected"], "nvidia.com/gpu=5");
}

/// A driver upgrade: the node's driver changes under an existing spec. The next GPU container finds
/// the spec stale (its `nvinject.io/driver-version` is not the loaded driver's), the shim
/// regenerates it by running the `nvinject-cdi` beside it (real discovery through the simulated
/// NVML, in that child process, not the proxy), and the container gets the new driver's libraries.
#[test]
#[ignore = "needs root"]
fn s9_a_stale_spec_is_regenerated_after_a_driver_upgrade() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = node("h100x8");
    let old: Value = serde_json::from_slice(&std::fs::read(&node.spec_path).unwrap()).unwrap();
    assert_eq!(old["annotations"]["nvinject.io/driver-version"], "550.54.15");

    upgrade_driver(&node, "555.42.02");

    let run = node
        .run("s9", &RunOptions { annotations: annotation("nvidia.com/gpu=1"), ..Default::default() })
        .unwrap();
    assert_eq!(run.status, 0, "{}", run.stderr);
    let report = run.report();
    assert!(
        ldconfig_has(report, "libnvidia-glcore.so.555.42.02"),
        "new driver's libraries: {}",
        report["ldconfig"]
    );
    assert!(!ldconfig_has(report, "550.54.15"), "no old driver library may be there");
    let mounted = report["mounts"].to_string();
    assert!(mounted.contains("libnvidia-ml.so.555.42.02") && !mounted.contains("550.54.15"), "{mounted}");
    assert_eq!(gpu_nodes(report), [("/dev/nvidia1".to_owned(), "ENXIO".to_owned())]);
    let new: Value = serde_json::from_slice(&std::fs::read(&node.spec_path).unwrap()).unwrap();
    assert_eq!(new["annotations"]["nvinject.io/driver-version"], "555.42.02");
    let line = create_line(&node, "s9");
    assert!(line["regenerated"].as_str().unwrap().contains("nvidia.com-gpu.json"), "{line}");

    // Fresh now: the next container does not regenerate.
    let again = node
        .run("s9-again", &RunOptions { annotations: annotation("nvidia.com/gpu=2"), ..Default::default() })
        .unwrap();
    assert_eq!(again.status, 0, "{}", again.stderr);
    assert_eq!(create_line(&node, "s9-again")["regenerated"], "[]");
    node.assert_no_leftovers(&["s9", "s9-again"]);
}

/// A driver upgrade: the same node with driver `version` (it starts with 550.54.15), rebuilt in place.
fn upgrade_driver(node: &GpuNode, version: &str) {
    let simnode = nvinject_simnode::artifacts::simnode_bin("nvinject-simnode");
    let out =
        process::run(std::process::Command::new(&simnode).args(["describe", "--preset", "h100x8"])).unwrap();
    let mut description: Value = serde_json::from_slice(&out.stdout).unwrap();
    description["driver"]["version"] = Value::String(version.into());
    let desc_path = node.base().join("upgraded.json");
    std::fs::write(&desc_path, serde_json::to_vec(&description).unwrap()).unwrap();
    process::run(
        std::process::Command::new(&simnode)
            .arg("build")
            .arg("--node")
            .arg(&desc_path)
            .arg("--out")
            .arg(&node.sim)
            .arg("--force"),
    )
    .unwrap();
}

/// Self-healing where containerd's own CDI resolves the annotation (2.x's default) before the shim
/// could regenerate: the device plugin checks the spec against the loaded driver before it
/// answers Allocate (`nvinject_device_plugin::freshness`, the very code its Allocate runs, over the
/// node's roots and the real `nvinject-cdi`), so the spec containerd reads for the next GPU
/// container is the new driver's. Through CRI (`ctr run` bypasses containerd's CDI), on every
/// version: with CDI off the shim finds the spec fresh and injects it. With CDI on, a control
/// container started without the check shows that containerd alone would not heal.
#[test]
#[ignore = "needs root"]
fn s11_after_a_driver_upgrade_the_next_cri_container_gets_the_new_driver_with_no_human_step() {
    nvinject_test_support::require_root("containerd and runc");
    use nvinject_device_plugin::freshness::{GenerateRoots, Outcome, SpecFreshness, generate_args};
    let _s = serial();
    let node =
        GpuNode::start(&NodeOptions { cri: true, ..Default::default() }).unwrap_or_else(|e| panic!("{e}"));
    let (proc_root, sys_root) = (node.sim.join("host/proc"), node.sim.join("host/sys"));
    let hook = node.bin_dir.join("nvinject-hook");
    let freshness = SpecFreshness::new(
        node.spec_path.clone(),
        sys_root.clone(),
        proc_root.clone(),
        nvinject_simnode::artifacts::artifact("nvinject-cdi-gen", "nvinject-cdi"),
        generate_args(&GenerateRoots {
            spec: &node.spec_path,
            driver_root: &node.driver_root,
            container_driver_root: None,
            dev_root: &node.dev_root,
            proc_root: &proc_root,
            sys_root: &sys_root,
            hook: &hook,
            mps_pipe_dir: None,
            hook_timeout_secs: nvinject_cdi::nvinject::DEFAULT_HOOK_TIMEOUT_SECS,
        }),
    );
    let mut cri = CriClient::connect(&node.containerd.socket).unwrap();
    let pod = cri
        .run_pod(
            "healpod",
            "nvidia",
            &node.base().join("pod-logs"),
            &node.containerd.cgroup_parent(),
            HashMap::new(),
        )
        .unwrap_or_else(|e| panic!("{e}\ncontainerd log:\n{}", node.containerd.log_tail(40)));
    // What the plugin does before it answers the Allocate for this container (`check`), then the
    // container through CRI: its report and id, or why it did not run.
    let mut gpu_container =
        |name: &str, gpu: usize, check: bool| -> Result<(Value, String, Option<Outcome>), String> {
            let checked = check.then(|| freshness.ensure_fresh().unwrap_or_else(|e| panic!("{name}: {e}")));
            let req = ContainerRequest {
                name: name.into(),
                image: nvinject_node_harness::node::PROBE_IMAGE.into(),
                command: vec![nvinject_node_harness::node::PROBE_PATH.into(), "report".into()],
                annotations: HashMap::from([(
                    "cdi.k8s.io/nvinject-device-plugin_heal".to_owned(),
                    format!("nvidia.com/gpu={}", node.gpu_uuid(gpu)),
                )]),
                ..Default::default()
            };
            let id = cri.create_container(&pod, &req).map_err(|e| e.to_string())?;
            cri.start_container(&id).map_err(|e| e.to_string())?;
            let code = cri.wait_exited(&id, Duration::from_secs(60)).map_err(|e| e.to_string())?;
            let logs = cri.logs(&pod, name);
            println!("{name} on {}: plugin check {checked:?}, exit {code}", node.containerd.build.label());
            Ok((parse_report(&logs).ok_or(format!("exit {code}, no report: {logs}"))?, id, checked))
        };
    let ran = |r: Result<(Value, String, Option<Outcome>), String>| {
        r.unwrap_or_else(|e| panic!("{e}\n{}", node.containerd.log_tail(40)))
    };

    let (before, _, _) = ran(gpu_container("before", 1, true));
    assert!(before["mounts"].to_string().contains("libnvidia-ml.so.550.54.15"), "{}", before["mounts"]);

    upgrade_driver(&node, "555.42.02");
    let mut old = "550.54.15";
    let mut new = "555.42.02";
    if node.containerd.build.cdi {
        // The control: without the check, containerd resolves the stale spec itself and this
        // container does not get the new driver (it fails on the old driver's missing files, or
        // runs with them). Our shim, seeing the stale spec behind containerd's edits, regenerates
        // it for the next container: too late for this one.
        match gpu_container("unchecked", 3, false) {
            Err(e) => assert!(e.contains(old), "{e}"),
            Ok((report, _, _)) => {
                assert!(
                    !report["mounts"].to_string().contains(new),
                    "containerd read a fresh spec by itself?"
                )
            }
        }
        // So the plugin's check gets its own upgrade to catch.
        upgrade_driver(&node, "560.35.03");
        (old, new) = (new, "560.35.03");
    }
    let (after, id, checked) = ran(gpu_container("after", 2, true));
    assert_eq!(
        checked,
        Some(Outcome::Regenerated { from: old.into(), to: new.into() }),
        "the plugin's check"
    );
    let mounted = after["mounts"].to_string();
    assert!(
        mounted.contains(&format!("libnvidia-ml.so.{new}"))
            && !mounted.contains(old)
            && !mounted.contains("550.54.15"),
        "{mounted}"
    );
    assert!(ldconfig_has(&after, &format!("libnvidia-glcore.so.{new}")), "{}", after["ldconfig"]);
    assert_eq!(gpu_nodes(&after), [("/dev/nvidia2".to_owned(), "ENXIO".to_owned())]);
    let spec: Value = serde_json::from_slice(&std::fs::read(&node.spec_path).unwrap()).unwrap();
    assert_eq!(spec["annotations"]["nvinject.io/driver-version"], new);
    // The plugin's check regenerated it (printed above as `Regenerated`); who applied the new spec:
    // containerd itself when its CDI is on, else our shim, which found it fresh and did not
    // regenerate again.
    let line = create_line(&node, &id);
    let name = format!("nvidia.com/gpu={}", node.gpu_uuid(2));
    if node.containerd.build.cdi {
        assert_eq!(line["already_present"], name, "{line}");
    } else {
        assert_eq!(line["injected"], name, "{line}");
    }
    assert_eq!(line["regenerated"], "[]", "{line}");
    // The next check finds the spec fresh: one regeneration per driver change.
    assert_eq!(freshness.ensure_fresh().unwrap(), Outcome::Fresh);
    cri.remove_pod(&pod).unwrap();
}

/// The injected mounts of a report, in the order the kernel lists them: target, options,
/// propagation fields and file system type.
fn injected_mounts(report: &Value, spec: &Value) -> Vec<(String, String, String, String)> {
    let targets: Vec<&str> = spec["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["containerPath"].as_str().unwrap())
        .collect();
    report["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| {
            // The probe image is usr-merged: /lib/firmware/... is listed as /usr/lib/firmware/...
            let target = m["target"].as_str().unwrap();
            targets.iter().any(|t| *t == target || target.strip_prefix("/usr") == Some(t))
        })
        .map(|m| {
            let field = |k: &str| m[k].as_str().unwrap().to_owned();
            (field("target"), field("options"), field("propagation"), field("fstype"))
        })
        .collect()
}

/// `[runtime] one-hook-run` (the default) hands the injected bind mounts and the spec's two
/// `nvinject-hook` runs to one `inject` run, whose ld.so.cache is built from the image's own; the
/// container must be exactly what it is when runc makes each mount and runs each hook: the same
/// mount table (order, options, propagation), the same `ldconfig -p`, the same links, NVML loading.
#[test]
#[ignore = "needs root"]
fn s10_one_hook_run_gives_the_same_container_as_runc_and_two_hooks() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = node("h100x8");
    let spec: Value = serde_json::from_slice(&std::fs::read(&node.spec_path).unwrap()).unwrap();
    let request = RunOptions { annotations: annotation("nvidia.com/gpu=0"), ..Default::default() };

    let by_hook = node.run("s10-hook", &request).unwrap();
    assert_eq!(by_hook.status, 0, "{}", by_hook.stderr);
    let line = create_line(&node, "s10-hook");
    let spec_mounts = spec["containerEdits"]["mounts"].as_array().unwrap().len();
    assert_eq!(line["mounts_in_hook"], spec_mounts, "every injected mount goes to the hook: {line}");
    // create-symlinks, enable-cuda-compat, update-ldcache, disable-device-node-modification,
    // update-application-profile: one hook process.
    assert_eq!(line["hooks_merged"], 5, "{line}");

    // The same container with the mounts left to runc (the proxy reads its config per start).
    node.set_one_hook_run(false).unwrap();
    assert!(std::fs::read_to_string(&node.config_path).unwrap().contains("one-hook-run = false"));
    let by_runc = node.run("s10-runc", &request).unwrap();
    assert_eq!(by_runc.status, 0, "{}", by_runc.stderr);
    let runc_line = create_line(&node, "s10-runc");
    assert_eq!(
        (&runc_line["mounts_in_hook"], &runc_line["hooks_merged"]),
        (&Value::from(0), &Value::from(0))
    );

    let hook_mounts = injected_mounts(by_hook.report(), &spec);
    let runc_mounts = injected_mounts(by_runc.report(), &spec);
    assert_eq!(hook_mounts.len(), spec_mounts, "{hook_mounts:#?}");
    assert_eq!(hook_mounts, runc_mounts);
    // Nothing else differs either: the whole mount table, in order.
    assert_eq!(by_hook.report()["mounts"], by_runc.report()["mounts"]);
    // The incremental cache lists what the full scan lists, in the same order.
    assert_eq!(by_hook.report()["ldconfig"], by_runc.report()["ldconfig"]);
    assert!(ldconfig_has(by_hook.report(), "libcuda.so.1"), "{}", by_hook.report()["ldconfig"]);
    assert_eq!(by_hook.report()["ld_so_conf_d"], by_runc.report()["ld_so_conf_d"]);
    // What the spec asks (ro, nosuid, nodev; rprivate: no peer group) is what both made.
    let (target, options, propagation, _) = hook_mounts.iter().find(|m| m.0.contains("libcuda.so")).unwrap();
    for flag in ["ro", "nosuid", "nodev"] {
        assert!(options.split(',').any(|o| o == flag), "{target}: {options}");
    }
    assert!(!propagation.contains("shared:") && !propagation.contains("master:"), "{target}: {propagation}");
    // And the library behind the mount works.
    assert_eq!(by_hook.report()["nvml"]["dlopen"], "ok", "{}", by_hook.report()["nvml"]);
    node.assert_no_leftovers(&["s10-hook", "s10-runc"]);
}

/// The proxy of group `id` (its `--listen` is that group's proxy socket), if running.
fn proxy_of(node: &GpuNode, id: &str) -> Option<process::ProcessInfo> {
    let [_, socket] = node.containerd.shim_sockets(&node.containerd.namespace, id);
    let listen = format!("unix://{}", socket.display());
    node.containerd.shim_processes().into_iter().find(|p| {
        p.argv.iter().any(|a| a == "proxy") && p.argv.windows(2).any(|w| w[0] == "--listen" && w[1] == listen)
    })
}

/// Issue 32: the proxy's socket in containerd's socket folder goes with the proxy, whichever way it
/// ends: with the task (containerd deletes it and shuts the runc shim down), and on a SIGTERM sent
/// to the proxy's PID while its container runs.
#[test]
#[ignore = "needs root"]
fn s12_the_proxy_socket_goes_with_the_proxy_on_every_exit() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = node("h100x8");
    let run = node
        .run("s12-done", &RunOptions { annotations: annotation("nvidia.com/gpu=0"), ..Default::default() })
        .unwrap();
    assert_eq!(run.status, 0, "{}", run.stderr);
    node.assert_no_leftovers(&["s12-done"]);

    // A running container; its proxy gets SIGTERM.
    let id = "s12-term";
    let mut cmd = node.containerd.ctr();
    cmd.args(["run", "-d", "--runtime", nvinject_node_harness::node::NVINJECT_RUNTIME, "--annotation"])
        .arg("cdi.k8s.io/test=nvidia.com/gpu=0")
        .args([
            nvinject_node_harness::node::PROBE_IMAGE,
            id,
            nvinject_node_harness::node::PROBE_PATH,
            "pause",
        ]);
    process::run(&mut cmd).unwrap();
    let [_, socket] = node.containerd.shim_sockets(&node.containerd.namespace, id);
    let proxy = process::wait_for("the proxy to run", Duration::from_secs(10), || proxy_of(&node, id))
        .unwrap_or_else(|e| panic!("{e}: {:?}", node.containerd.shim_processes()));
    assert!(socket.exists(), "{} missing while the proxy runs", socket.display());
    let runc_shims: Vec<i32> =
        node.containerd.shim_processes().iter().filter(|p| p.pid != proxy.pid).map(|p| p.pid).collect();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(proxy.pid), nix::sys::signal::Signal::SIGTERM).unwrap();
    let gone = process::wait_for("the proxy to exit on SIGTERM", Duration::from_secs(10), || {
        (!process::alive(proxy.pid)).then_some(())
    });
    assert!(gone.is_ok(), "proxy {} still running after SIGTERM", proxy.pid);
    assert!(!socket.exists(), "{} left behind by the proxy's SIGTERM exit", socket.display());

    // containerd lost the proxy, as if the shim had died: it kills and deletes the container. The
    // runc shim itself stays, idle (nobody is left to send it Shutdown): stopped here by its PID.
    node.containerd.remove_all_containers();
    for pid in runc_shims {
        process::stop_pid(pid, Duration::from_secs(5));
    }
    node.assert_no_leftovers(&["s12-done", id]);
}

/// Issue 32: a Create that containerd's client gives up on while runc still runs it (here `ctr`
/// killed while a createContainer hook holds the Create) leaves no proxy behind once containerd has
/// cleaned up. containerd 1.6 gives up on its Delete after 5 s, sends Shutdown and closes the
/// connection: a proxy that only followed the runc shim stayed, next to a runc shim that stayed too
/// (checked with such a build, 2026-12-06).
#[test]
#[ignore = "needs root"]
fn s13_an_abandoned_create_leaves_no_proxy_behind() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = node("h100x8");
    // Another vendor's spec whose createContainer hook sleeps: the Create stays in runc meanwhile.
    let hold = "12.5";
    std::fs::write(
        node.cdi_dir.join("example.com-hold.json"),
        serde_json::json!({
            "cdiVersion": "0.6.0", "kind": "example.com/hold",
            "devices": [{"name": "create", "containerEdits": {"hooks": [
                {"hookName": "createContainer", "path": "/bin/sleep", "args": ["sleep", hold]}
            ]}}]
        })
        .to_string(),
    )
    .unwrap();
    let id = "s13";
    let mut cmd = node.containerd.ctr();
    cmd.args(["run", "--rm", "--runtime", nvinject_node_harness::node::NVINJECT_RUNTIME, "--annotation"])
        .arg("cdi.k8s.io/test=example.com/hold=create")
        .args([
            nvinject_node_harness::node::PROBE_IMAGE,
            id,
            nvinject_node_harness::node::PROBE_PATH,
            "report",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut ctr = cmd.spawn().unwrap();
    let hook = process::wait_for("the createContainer hook to run", Duration::from_secs(20), || {
        process::find_processes(hold).into_iter().find(|p| p.argv == ["sleep", hold])
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", node.containerd.log_tail(30)));
    let proxy = proxy_of(&node, id).expect("the proxy serves the Create");
    let shims: Vec<i32> = node.containerd.shim_processes().iter().map(|p| p.pid).collect();
    let runc_shim = node
        .containerd
        .shim_processes()
        .into_iter()
        .find(|p| p.argv[0].ends_with("containerd-shim-runc-v2"))
        .expect("the runc shim runs the Create");

    // The client gives up mid-Create.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(ctr.id() as i32), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    let _ = ctr.wait();
    // containerd's own cleanup of the failed Create (a Delete and a Shutdown, each with its own
    // timeout) runs; then the proxy has nothing left to serve.
    let gone = process::wait_for("the proxy to exit", Duration::from_secs(30), || {
        (!process::alive(proxy.pid)).then_some(())
    });
    // Whatever happened, the hook is done before anything is cleaned up.
    let _ = process::wait_for("the hook to finish", Duration::from_secs(30), || {
        (!process::alive(hook.pid)).then_some(())
    });
    let leaked: Vec<i32> = shims.iter().copied().filter(|p| process::alive(*p)).collect();
    println!(
        "after the abandoned Create, of {shims:?} (runc shim {}) still running: {leaked:?}",
        runc_shim.pid
    );
    let [_, socket] = node.containerd.shim_sockets(&node.containerd.namespace, id);
    let socket_left = socket.exists();
    // The test's own cleanup before asserting: whatever containerd left (a runc shim that took the
    // container after containerd gave up on it), by the PIDs recorded above.
    node.containerd.remove_all_containers();
    for pid in &leaked {
        process::stop_pid(*pid, Duration::from_secs(5));
    }
    let _ = std::process::Command::new("runc")
        .args([
            "--root",
            &format!("/run/containerd/runc/{}", node.containerd.namespace),
            "delete",
            "--force",
            id,
        ])
        .output();
    assert!(gone.is_ok(), "proxy {} still running after the abandoned Create: {:?}", proxy.pid, proxy.argv);
    assert!(!socket_left, "{} left behind", socket.display());
}

/// Issue 32: text from the pod reaches containerd and the shim's log escaped and cut: a 70 KB
/// annotation key and a device name with a line break and a terminal escape.
#[test]
#[ignore = "needs root"]
fn s14_hostile_keys_and_device_names_are_escaped_and_cut_in_errors_and_logs() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = node("h100x8");
    let key = format!("cdi.k8s.io/{}", "k".repeat(70_000));
    let run = node
        .run(
            "s14",
            &RunOptions {
                annotations: vec![(key, "nvidia.com/gpu=0\n\x1b[31mred".into())],
                ..Default::default()
            },
        )
        .unwrap();
    assert_ne!(run.status, 0, "the device name is invalid: {}", run.stdout);
    let stderr = &run.stderr;
    assert!(!stderr.contains('\x1b'), "raw escape reached ctr: {stderr:?}");
    assert!(stderr.contains("gpu=0\\n\\u{1b}[31mred"), "{stderr}");
    assert!(stderr.contains("...[truncated: 70011 bytes in all]"), "{stderr}");
    assert!(stderr.len() < 4096, "{} bytes from ctr", stderr.len());

    let refused: Vec<String> = std::fs::read_to_string(&node.shim_log)
        .unwrap()
        .lines()
        .filter(|l| l.contains("container create refused") && l.contains("\"s14\""))
        .map(str::to_owned)
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].len() < 4096, "the log line is {} bytes", refused[0].len());
    let line: Value = serde_json::from_str(&refused[0]).unwrap();
    let error = line["error"].as_str().unwrap();
    assert!(!error.contains('\x1b') && !error.contains('\n'), "{error:?}");
    assert!(error.contains("...[truncated: 70011 bytes in all]"), "{error}");
    node.assert_no_leftovers(&["s14"]);
}
