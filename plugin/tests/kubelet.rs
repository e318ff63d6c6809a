//! The plugin against the kubelet simulator on a simulated node: real processes, real gRPC over
//! unix sockets, NVML loaded from the simulated driver root. Needs root (the node has real device
//! nodes).

mod common;

use std::time::Duration;

use common::{Kubelet, Node, Plugin, health_of, ids, kubelet_dir, plugin_args};
use serde_json::{Value, json};

fn start(node: &Node, extra: &[&str]) -> (Kubelet, Plugin) {
    let dir = kubelet_dir(node);
    let kubelet = Kubelet::start(&dir);
    let mut args = plugin_args(node, &dir);
    args.extend(extra.iter().map(|s| s.to_string()));
    let plugin = Plugin::start(Some(node), &args, &[]);
    (kubelet, plugin)
}

fn annotation(c: &Value) -> (String, String) {
    let map = c["annotations"].as_object().unwrap();
    assert_eq!(map.len(), 1, "one CDI annotation: {c}");
    let (k, v) = map.iter().next().unwrap();
    (k.clone(), v.as_str().unwrap().to_owned())
}

#[test]
#[ignore = "needs root"]
fn registers_lists_every_gpu_with_numa_and_writes_labels() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::preset("h100x8");
    let (mut k, mut plugin) = start(&node, &[]);
    let reg = k.registered("nvidia.com/gpu");
    assert_eq!(reg["version"], "v1beta1");
    assert_eq!(reg["endpoint"], "nvinject-gpu.sock");
    assert_eq!(
        reg["options"],
        json!({"pre_start_required": false, "get_preferred_allocation_available": true})
    );

    let devices = k.devices("nvidia.com/gpu", |d| !d.is_empty());
    let want: Vec<String> = (0..8).map(|i| node.uuid(i)).collect();
    assert_eq!(ids(&devices), want);
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d["health"], "Healthy");
        let numa = node.description["gpus"][i]["numa_node"].as_u64().unwrap();
        assert_eq!(d["numa"], json!([numa]), "GPU {i} carries its NUMA node");
    }
    let opts = k.call(json!({"op": "options", "resource": "nvidia.com/gpu"})).unwrap();
    assert_eq!(opts["get_preferred_allocation_available"], true);

    let labels = std::fs::read_to_string(node.tmp.path().join("features.d/nvinject")).unwrap();
    for line in [
        "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count=8",
        "nvidia.com/gpu.family=hopper",
        "nvidia.com/cuda.driver.major=550",
        "nvidia.com/mig.strategy=none",
        "nvidia.com/gpu.sharing-strategy=none",
    ] {
        assert!(labels.lines().any(|l| l == line), "missing `{line}` in\n{labels}");
    }
    assert!(plugin.terminate().success());
}

#[test]
#[ignore = "needs root"]
fn allocate_in_every_device_list_strategy() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::preset("h100x8");
    let (u1, u3) = (node.uuid(1), node.uuid(3));
    let request = json!([[u3, u1]]);

    let (mut k, mut p) = start(&node, &[]);
    k.registered("nvidia.com/gpu");
    let r = k.allocate("nvidia.com/gpu", request.clone()).unwrap();
    let c = &r["containers"][0];
    let (key, value) = annotation(c);
    assert!(key.starts_with("cdi.k8s.io/nvinject-device-plugin_"), "{key}");
    assert_eq!(value, format!("nvidia.com/gpu={u3},nvidia.com/gpu={u1}"));
    assert_eq!(c["envs"], json!({"NVIDIA_VISIBLE_DEVICES": "void"}));
    assert_eq!(c["devices"], json!([]));
    p.terminate();
    drop(k);

    let (mut k, mut p) = start(&node, &["--device-list-strategy", "cdi-cri"]);
    k.registered("nvidia.com/gpu");
    let c = k.allocate("nvidia.com/gpu", request.clone()).unwrap()["containers"][0].clone();
    assert_eq!(c["cdi_devices"], json!([format!("nvidia.com/gpu={u3}"), format!("nvidia.com/gpu={u1}")]));
    assert_eq!(c["annotations"], json!({}));
    p.terminate();
    drop(k);

    let (mut k, mut p) = start(&node, &["--device-list-strategy", "volume-mounts"]);
    k.registered("nvidia.com/gpu");
    let c = k.allocate("nvidia.com/gpu", request.clone()).unwrap()["containers"][0].clone();
    assert_eq!(c["envs"], json!({"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}));
    assert_eq!(
        c["mounts"],
        json!([
            {"container_path": format!("/var/run/nvidia-container-devices/{u3}"), "host_path": "/dev/null", "read_only": false},
            {"container_path": format!("/var/run/nvidia-container-devices/{u1}"), "host_path": "/dev/null", "read_only": false},
        ])
    );
    p.terminate();
    drop(k);

    let (mut k, mut p) = start(
        &node,
        &["--device-list-strategy", "envvar", "--device-id-strategy", "index", "--pass-device-specs"],
    );
    k.registered("nvidia.com/gpu");
    let c = k.allocate("nvidia.com/gpu", request.clone()).unwrap()["containers"][0].clone();
    assert_eq!(c["envs"], json!({"NVIDIA_VISIBLE_DEVICES": "3,1"}));
    let dev = node.dev_root();
    let specs: Vec<(String, String)> = c["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["container_path"].as_str().unwrap().into(), d["host_path"].as_str().unwrap().into()))
        .collect();
    let minor = |i: usize| node.description["gpus"][i]["minor"].as_u64().unwrap();
    for path in
        ["/dev/nvidiactl".to_string(), format!("/dev/nvidia{}", minor(3)), format!("/dev/nvidia{}", minor(1))]
    {
        let host = format!("{}{path}", dev.display());
        assert!(specs.contains(&(path.clone(), host)), "{path} in {specs:?}");
    }
    assert!(c["devices"].as_array().unwrap().iter().all(|d| d["permissions"] == "rw"));
    p.terminate();
}

#[test]
#[ignore = "needs root"]
fn preferred_allocation_follows_nvlink_then_pcie() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::preset("h100x8");
    let (mut k, _p) = start(&node, &[]);
    k.registered("nvidia.com/gpu");
    let all: Vec<String> = (0..8).map(|i| node.uuid(i)).collect();
    let u = |v: &[usize]| v.iter().map(|&i| node.uuid(i)).collect::<Vec<_>>();
    // Every pair is NVLinked equally: PCIe decides. GPUs 0/1 share a switch; 0-3 a NUMA node.
    assert_eq!(k.preferred("nvidia.com/gpu", &all, &[], 2).unwrap(), u(&[0, 1]));
    assert_eq!(k.preferred("nvidia.com/gpu", &all, &[], 4).unwrap(), u(&[0, 1, 2, 3]));
    assert_eq!(k.preferred("nvidia.com/gpu", &all, &u(&[5]), 2).unwrap(), u(&[4, 5]));
    assert_eq!(k.preferred("nvidia.com/gpu", &u(&[0, 3, 4, 6, 7]), &[], 2).unwrap(), u(&[6, 7]));

    let islands = Node::preset("islands");
    let (mut k, _p) = start(&islands, &[]);
    k.registered("nvidia.com/gpu");
    let all: Vec<String> = (0..8).map(|i| islands.uuid(i)).collect();
    let u = |v: &[usize]| v.iter().map(|&i| islands.uuid(i)).collect::<Vec<_>>();
    assert_eq!(k.preferred("nvidia.com/gpu", &all, &[], 4).unwrap(), u(&[0, 1, 2, 3]));
    assert_eq!(k.preferred("nvidia.com/gpu", &all, &u(&[6]), 4).unwrap(), u(&[4, 5, 6, 7]));
    assert_eq!(k.preferred("nvidia.com/gpu", &u(&[0, 1, 4, 5, 6]), &[], 3).unwrap(), u(&[4, 5, 6]));
    // Deterministic: the same question gets the same answer.
    for _ in 0..3 {
        assert_eq!(k.preferred("nvidia.com/gpu", &all, &[], 4).unwrap(), u(&[0, 1, 2, 3]));
    }
}

#[test]
#[ignore = "needs root"]
fn mig_mixed_on_a100_mig() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::preset("a100-mig");
    let (mut k, _p) = start(&node, &["--mig-strategy", "mixed", "--pass-device-specs"]);
    let mut expected: Vec<(String, Vec<String>)> =
        vec![("nvidia.com/gpu".into(), vec![node.uuid(2), node.uuid(3)])];
    for gpu in 0..2 {
        for (_, _, profile, uuid) in node.mig_devices(gpu) {
            let name = format!("nvidia.com/mig-{profile}");
            match expected.iter_mut().find(|(n, _)| *n == name) {
                Some((_, v)) => v.push(uuid),
                None => expected.push((name, vec![uuid])),
            }
        }
    }
    assert_eq!(expected.len(), 4, "gpu, 1g.10gb, 2g.20gb, 3g.40gb");
    for (name, want) in &expected {
        let reg = k.registered(name);
        assert_eq!(reg["endpoint"], format!("nvinject-{}.sock", name.trim_start_matches("nvidia.com/")));
        let devices = k.devices(name, |d| !d.is_empty());
        assert_eq!(&ids(&devices), want, "{name}");
    }

    let (gi, ci, profile, uuid) = node.mig_devices(1)[2].clone();
    let resource = format!("nvidia.com/mig-{profile}");
    let c = k.allocate(&resource, json!([[uuid]])).unwrap()["containers"][0].clone();
    assert_eq!(annotation(&c).1, format!("nvidia.com/gpu={uuid}"));
    let paths: Vec<&str> =
        c["devices"].as_array().unwrap().iter().map(|d| d["container_path"].as_str().unwrap()).collect();
    let caps = paths.iter().filter(|p| p.starts_with("/dev/nvidia-caps/nvidia-cap")).count();
    assert_eq!(caps, 2, "GI and CI access nodes: {paths:?}");
    assert!(paths.contains(&format!("/dev/nvidia{}", node.description["gpus"][1]["minor"]).as_str()));

    // An XID inside one MIG instance takes only that MIG device out.
    node.xid(1, 79, Some((gi, ci)));
    let devices = k.devices(&resource, |d| d.iter().any(|x| x["health"] == "Unhealthy"));
    let sick: Vec<String> = devices
        .iter()
        .filter(|d| d["health"] == "Unhealthy")
        .map(|d| d["id"].as_str().unwrap().into())
        .collect();
    assert_eq!(sick, vec![uuid]);
}

#[test]
#[ignore = "needs root"]
fn mig_single_needs_one_profile_everywhere() {
    nvinject_test_support::require_root("mknod for the simulated node");
    // The preset mixes profiles and whole GPUs: refused, saying why and what to do.
    let node = Node::preset("a100-mig");
    let dir = kubelet_dir(&node);
    let mut args = plugin_args(&node, &dir);
    args.extend(["--mig-strategy".to_string(), "single".to_string()]);
    let mut p = Plugin::start(Some(&node), &args, &[]);
    let status = p.wait_exit();
    assert!(!status.success());
    let err = p.stderr();
    assert!(
        err.contains("mig-strategy single")
            && err.contains(&node.uuid(2))
            && err.contains("--mig-strategy mixed"),
        "{err}"
    );

    // With failOnInitError=false it stays up, serving nothing, and stops cleanly.
    let mut p = Plugin::start(Some(&node), &args, &[("FAIL_ON_INIT_ERROR", "false")]);
    let deadline = std::time::Instant::now() + common::PATIENCE;
    while !p.stderr().contains("serving nothing") {
        assert!(std::time::Instant::now() < deadline && p.running(), "{}", p.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(p.terminate().success());

    // A node whose only GPU is carved into seven 1g.10gb devices: single works.
    let mut desc = Node::describe("a100-mig");
    let gpu1 = desc["gpus"][1].clone();
    desc["gpus"] = json!([gpu1]);
    desc["nvlinks"] = json!([]);
    let uniform = Node::from_description(&desc);
    let (mut k, _p) = start(&uniform, &["--mig-strategy", "single"]);
    k.registered("nvidia.com/gpu");
    let devices = k.devices("nvidia.com/gpu", |d| !d.is_empty());
    let want: Vec<String> = uniform.mig_devices(0).into_iter().map(|m| m.3).collect();
    assert_eq!(want.len(), 7);
    assert_eq!(ids(&devices), want);
    let labels = std::fs::read_to_string(uniform.tmp.path().join("features.d/nvinject")).unwrap();
    assert!(labels.contains("nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB-MIG-1g.10gb\n"), "{labels}");
    assert!(labels.contains("nvidia.com/gpu.count=7\n"), "{labels}");
}

#[test]
#[ignore = "needs root"]
fn time_slicing_replicas() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::preset("h100x8");
    let config = node.tmp.path().join("config.yaml");
    std::fs::write(
        &config,
        "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    failRequestsGreaterThanOne: true\n    \
         resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
    )
    .unwrap();
    let (mut k, mut p) = start(&node, &["--config-file", config.to_str().unwrap()]);
    let reg = k.registered("nvidia.com/gpu.shared");
    assert_eq!(reg["endpoint"], "nvinject-gpu.shared.sock");
    let devices = k.devices("nvidia.com/gpu.shared", |d| !d.is_empty());
    assert_eq!(devices.len(), 32);
    assert_eq!(devices[5]["id"], format!("{}::1", node.uuid(1)));

    let u2 = node.uuid(2);
    let c =
        k.allocate("nvidia.com/gpu.shared", json!([[format!("{u2}::3")]])).unwrap()["containers"][0].clone();
    assert_eq!(annotation(&c).1, format!("nvidia.com/gpu={u2}"));
    let e =
        k.allocate("nvidia.com/gpu.shared", json!([[format!("{u2}::3"), format!("{u2}::0")]])).unwrap_err();
    assert_eq!(e["code"], "InvalidArgument");
    assert!(e["message"].as_str().unwrap().contains("failRequestsGreaterThanOne"), "{e}");

    // Distributed: GPU 0 has two replicas in use, so the idle GPUs 1 and 2 come first.
    let all = ids(&devices);
    let avail: Vec<String> = all
        .iter()
        .filter(|id| {
            !id.ends_with(&format!("{}::0", node.uuid(0))) && !id.ends_with(&format!("{}::1", node.uuid(0)))
        })
        .cloned()
        .collect();
    let got = k.preferred("nvidia.com/gpu.shared", &avail, &[], 2).unwrap();
    assert_eq!(got, vec![format!("{}::0", node.uuid(1)), format!("{}::0", node.uuid(2))]);
    p.terminate();
    drop(k);

    // Same name, packed: fill GPU 0 first; labels say the product is shared.
    std::fs::write(
        &config,
        "version: v1\nsharing:\n  timeSlicing:\n    strategy: packed\n    resources:\n    - name: gpu\n      replicas: 2\n",
    )
    .unwrap();
    let (mut k, _p) = start(&node, &["--config-file", config.to_str().unwrap()]);
    k.registered("nvidia.com/gpu");
    let devices = k.devices("nvidia.com/gpu", |d| !d.is_empty());
    assert_eq!(devices.len(), 16);
    let avail: Vec<String> =
        ids(&devices).into_iter().filter(|id| *id != format!("{}::0", node.uuid(0))).collect();
    let got = k.preferred("nvidia.com/gpu", &avail, &[], 2).unwrap();
    assert_eq!(got, vec![format!("{}::1", node.uuid(0)), format!("{}::0", node.uuid(1))]);
    let labels = std::fs::read_to_string(node.tmp.path().join("features.d/nvinject")).unwrap();
    assert!(labels.contains("nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3-SHARED\n"), "{labels}");
    assert!(
        labels.contains("nvidia.com/gpu.replicas=2\n")
            && labels.contains("nvidia.com/gpu.sharing-strategy=time-slicing\n")
    );
}

#[test]
#[ignore = "needs root"]
fn mps_replicas_come_with_the_mps_device_and_exclusive_gpus_never_do() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::preset("h100x8");
    let config = node.tmp.path().join("config.yaml");
    std::fs::write(
        &config,
        "version: v1\nflags:\n  plugin:\n    mpsPipeDir: /run/nvidia/mps\n    deviceListStrategy: [cdi-annotations, cdi-cri]\n\
         sharing:\n  mps:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
    )
    .unwrap();
    let (mut k, mut p) = start(&node, &["--config-file", config.to_str().unwrap()]);
    k.registered("nvidia.com/gpu.shared");
    let devices = k.devices("nvidia.com/gpu.shared", |d| !d.is_empty());
    assert_eq!(devices.len(), 32);
    let (u1, u2) = (node.uuid(1), node.uuid(2));
    let c =
        k.allocate("nvidia.com/gpu.shared", json!([[format!("{u2}::3")]])).unwrap()["containers"][0].clone();
    let want = format!("nvidia.com/gpu={u2},nvidia.com/gpu=mps");
    assert_eq!(annotation(&c).1, want);
    assert_eq!(c["cdi_devices"], json!([format!("nvidia.com/gpu={u2}"), "nvidia.com/gpu=mps"]), "{c}");
    // NVIDIA's MPS default: one replica per container.
    let e =
        k.allocate("nvidia.com/gpu.shared", json!([[format!("{u2}::3"), format!("{u1}::0")]])).unwrap_err();
    assert_eq!(e["code"], "InvalidArgument");
    let labels = std::fs::read_to_string(node.tmp.path().join("features.d/nvinject")).unwrap();
    assert!(labels.contains("nvidia.com/gpu.sharing-strategy=mps\n"), "{labels}");
    assert!(labels.contains("nvidia.com/gpu.replicas=4\n"), "{labels}");
    p.terminate();
    drop(k);

    // The same node time-sliced, and exclusive: never the MPS device.
    for sharing in ["sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 2\n", ""] {
        std::fs::write(
            &config,
            format!("version: v1\nflags:\n  plugin:\n    mpsPipeDir: /run/nvidia/mps\n{sharing}"),
        )
        .unwrap();
        let (mut k, mut p) = start(&node, &["--config-file", config.to_str().unwrap()]);
        k.registered("nvidia.com/gpu");
        let devices = k.devices("nvidia.com/gpu", |d| !d.is_empty());
        let id = ids(&devices)[5].clone();
        let c = k.allocate("nvidia.com/gpu", json!([[id]])).unwrap()["containers"][0].clone();
        let (_, names) = annotation(&c);
        assert!(names.starts_with("nvidia.com/gpu=GPU-") && !names.contains("mps"), "{sharing}: {names}");
        p.terminate();
    }
}

#[test]
#[ignore = "needs root"]
fn kubelet_restart_and_absence() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::preset("single");
    let dir = kubelet_dir(&node);
    // The plugin starts first: it waits for the kubelet, retrying with backoff.
    let mut p = Plugin::start(Some(&node), &plugin_args(&node, &dir), &[]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(p.running());
    let mut k = Kubelet::start(&dir);
    k.registered("nvidia.com/gpu");
    k.devices("nvidia.com/gpu", |d| d.len() == 1);

    // A restarting kubelet clears the directory (our socket too) and re-creates kubelet.sock.
    k.call(json!({"op": "restart"})).unwrap();
    k.registered("nvidia.com/gpu");
    let devices = k.devices("nvidia.com/gpu", |d| d.len() == 1);
    assert_eq!(devices[0]["id"], node.uuid(0));
    assert!(dir.join("nvinject-gpu.sock").exists());
    let c = k.allocate("nvidia.com/gpu", json!([[node.uuid(0)]])).unwrap();
    assert_eq!(annotation(&c["containers"][0]).1, format!("nvidia.com/gpu={}", node.uuid(0)));

    // kubelet.sock re-created without clearing the directory: registered again too.
    k.call(json!({"op": "stop"})).unwrap();
    k.call(json!({"op": "start"})).unwrap();
    k.registered("nvidia.com/gpu");

    // Our socket removed behind our back: served again and registered again.
    std::fs::remove_file(dir.join("nvinject-gpu.sock")).unwrap();
    k.registered("nvidia.com/gpu");
    k.devices("nvidia.com/gpu", |d| d.len() == 1);
    assert!(k.allocate("nvidia.com/gpu", json!([[node.uuid(0)]])).is_ok());
    assert!(p.terminate().success());
}

#[test]
#[ignore = "needs root"]
fn stale_sockets_and_sigterm() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::preset("single");
    let dir = kubelet_dir(&node);
    std::fs::write(dir.join("nvinject-gpu.sock"), "left by a crashed run").unwrap();
    std::fs::write(dir.join("nvinject-mig-1g.10gb.sock"), "a resource no longer served").unwrap();
    std::fs::write(dir.join("other-vendor.sock"), "not ours").unwrap();
    let (mut k, mut p) = {
        let k = Kubelet::start(&dir);
        (k, Plugin::start(Some(&node), &plugin_args(&node, &dir), &[]))
    };
    k.registered("nvidia.com/gpu");
    assert!(
        k.allocate("nvidia.com/gpu", json!([[node.uuid(0)]])).is_ok(),
        "the stale file was replaced by a live socket"
    );
    assert!(!dir.join("nvinject-mig-1g.10gb.sock").exists());
    assert!(dir.join("other-vendor.sock").exists());
    let status = p.terminate();
    assert!(status.success(), "SIGTERM is a clean exit: {status:?}");
    assert!(!dir.join("nvinject-gpu.sock").exists(), "socket removed on shutdown");
    k.wait_event("stream_ended", |v| v["resource"] == "nvidia.com/gpu");
}

#[test]
#[ignore = "needs root"]
fn xid_makes_a_gpu_unhealthy_then_healthy_again() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::preset("h100x8");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (mut k, _p) = start(&node, &["--metrics-address", &port.to_string()]);
    k.registered("nvidia.com/gpu");
    k.devices("nvidia.com/gpu", |d| d.len() == 8);
    let (u1, u2) = (node.uuid(1), node.uuid(2));

    // 13 is an application error (ignored); 79 (fallen off the bus) is not. Events arrive in order,
    // so the first update after both shows only GPU 1 down.
    node.xid(2, 13, None);
    node.xid(1, 79, None);
    let down = k.devices("nvidia.com/gpu", |d| d.iter().any(|x| x["health"] == "Unhealthy"));
    assert_eq!(health_of(&down, &u1), "Unhealthy");
    assert_eq!(down.iter().filter(|d| d["health"] == "Unhealthy").count(), 1, "{down:?}");
    assert_eq!(health_of(&down, &u2), "Healthy");

    let metrics = http_get(port, "/metrics");
    assert!(
        metrics.contains(&format!("nvinject_device_plugin_xid_events_total{{gpu=\"{u1}\",xid=\"79\"}} 1")),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("nvinject_device_plugin_xid_events_total{{gpu=\"{u2}\",xid=\"13\"}} 1"))
    );
    assert!(
        metrics
            .contains("nvinject_device_plugin_devices{resource=\"nvidia.com/gpu\",health=\"Unhealthy\"} 1")
    );

    // After the quiet period (1 s here) with the GPU answering NVML, it is Healthy again.
    let up = k.devices("nvidia.com/gpu", |d| d.iter().all(|x| x["health"] == "Healthy"));
    assert_eq!(up.len(), 8);
    let metrics = http_get(port, "/metrics");
    assert!(
        metrics.contains("nvinject_device_plugin_devices{resource=\"nvidia.com/gpu\",health=\"Healthy\"} 8"),
        "{metrics}"
    );
}

fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

#[test]
#[ignore = "needs root"]
fn hundred_concurrent_allocates() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::preset("h100x8");
    let (mut k, _p) = start(&node, &[]);
    k.registered("nvidia.com/gpu");
    let req = json!([[node.uuid(4), node.uuid(5)], [node.uuid(6)]]);
    let single = k.allocate("nvidia.com/gpu", req.clone()).unwrap();
    let r = k
        .call(json!({"op": "allocate_many", "resource": "nvidia.com/gpu", "containers": req, "count": 100, "concurrency": 100}))
        .unwrap();
    assert_eq!(r["succeeded"], 100, "{r}");
    assert_eq!(r["errors"], json!([]));
    // Every answer is the same, and the same as a lone call's.
    assert_eq!(r["distinct_responses"], json!([single]));
}

#[test]
#[ignore = "needs root"]
fn malformed_requests_are_refused_and_serving_goes_on() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::preset("h100x8");
    let (mut k, mut p) = start(&node, &[]);
    k.registered("nvidia.com/gpu");
    let r = "nvidia.com/gpu";
    let u0 = node.uuid(0);

    let e = k.allocate(r, json!([[u0, "GPU-not-here", "7"]])).unwrap_err();
    assert_eq!(e["code"], "InvalidArgument");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("GPU-not-here") && msg.contains("\"7\"") && !msg.contains(&u0), "{msg}");
    assert_eq!(k.allocate(r, json!([[]])).unwrap_err()["code"], "InvalidArgument");
    assert_eq!(k.allocate(r, json!([[u0, u0]])).unwrap_err()["code"], "InvalidArgument");

    let all: Vec<String> = (0..8).map(|i| node.uuid(i)).collect();
    let e = k.preferred(r, &all, &[], 9).unwrap_err();
    assert_eq!(e["code"], "InvalidArgument");
    let e = k.preferred(r, &all[..2], &all[5..6], 2).unwrap_err();
    assert!(e["message"].as_str().unwrap().contains(&all[5]), "{e}");
    let e = k.preferred(r, &all, &[], -1).unwrap_err();
    assert_eq!(e["code"], "InvalidArgument");

    // Bytes that are not a protobuf message at all.
    let e = k
        .call(json!({"op": "raw", "resource": r, "method": "Allocate", "bytes_hex": "ffffffffffffffffff"}))
        .unwrap_err();
    assert_eq!(e["code"], "Internal", "{e}");
    assert!(e["message"].as_str().unwrap().contains("decode"), "{e}");
    let e =
        k.call(json!({"op": "raw", "resource": r, "method": "NoSuchMethod", "bytes_hex": ""})).unwrap_err();
    assert_eq!(e["code"], "Unimplemented");

    // Still serving, still healthy.
    assert!(k.allocate(r, json!([[u0]])).is_ok());
    assert!(p.running());
    assert!(p.terminate().success());
}

#[test]
fn malformed_configs_are_refused_naming_file_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |yaml: &str, extra: &[&str], env: &[(&str, &str)]| -> (bool, String) {
        let file = tmp.path().join("config.yaml");
        std::fs::write(&file, yaml).unwrap();
        let mut args: Vec<String> =
            vec!["--config-file".into(), file.display().to_string(), "--print-config".into()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut p = Plugin::start(None, &args, env);
        let ok = p.wait_exit().success();
        (ok, p.stderr())
    };
    let file = tmp.path().join("config.yaml").display().to_string();
    for (yaml, field) in [
        ("version: v1\nflags:\n  migStrategy: half\n", "flags.migStrategy"),
        (
            "version: v1\nflags:\n  plugin:\n    deviceListStrategy: telepathy\n",
            "flags.plugin.deviceListStrategy",
        ),
        (
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 0\n",
            "sharing.timeSlicing.resources[0].replicas",
        ),
        (
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 2\n      colour: red\n",
            "sharing.timeSlicing.resources[0]",
        ),
        ("version: v3\n", "version"),
        ("flags: [\n", "flags"),
        // MPS without the node's pipe directory: the key, and the fix.
        (
            "version: v1\nsharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: 2\n",
            "sharing.mps",
        ),
    ] {
        let (ok, err) = run(yaml, &[], &[]);
        assert!(!ok, "{yaml} accepted");
        assert!(err.contains(&file) && err.contains(&format!("field `{field}")), "{yaml}: {err}");
    }
    let (ok, err) = run("", &[], &[("DP_DISABLE_HEALTHCHECKS", "79,often")]);
    assert!(!ok && err.contains("DP_DISABLE_HEALTHCHECKS") && err.contains("often"), "{err}");
    let (ok, err) = run("", &[], &[("MIG_STRATEGY", "half")]);
    assert!(!ok && err.contains("--mig-strategy") && err.contains("half"), "{err}");
    let (ok, err) = run("", &["--socket-poll", "0"], &[]);
    assert!(!ok && err.contains("--socket-poll") && err.contains("positive"), "{err}");
}

#[test]
fn flags_beat_environment_beat_file() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("config.yaml");
    std::fs::write(&file, "version: v1\nflags:\n  migStrategy: single\n  plugin:\n    deviceListStrategy: envvar\n    passDeviceSpecs: true\n")
        .unwrap();
    let print = |extra: &[&str], env: &[(&str, &str)]| -> Value {
        let mut args = vec!["--config-file".to_string(), file.display().to_string(), "--print-config".into()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_nvinject-device-plugin"))
            .args(&args)
            .env_remove("MIG_STRATEGY")
            .env_remove("DEVICE_LIST_STRATEGY")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let v = print(&[], &[]);
    assert_eq!(
        (v["migStrategy"].as_str(), v["deviceListStrategies"].clone()),
        (Some("single"), json!(["envvar"]))
    );
    let v = print(&[], &[("MIG_STRATEGY", "mixed"), ("DEVICE_LIST_STRATEGY", "cdi-cri,volume-mounts")]);
    assert_eq!(v["migStrategy"], "mixed");
    assert_eq!(v["deviceListStrategies"], json!(["cdi-cri", "volume-mounts"]));
    assert_eq!(v["passDeviceSpecs"], true, "untouched keys keep the file's value");
    let v = print(&["--mig-strategy", "none", "--pass-device-specs=false"], &[("MIG_STRATEGY", "mixed")]);
    assert_eq!(v["migStrategy"], "none");
    assert_eq!(v["passDeviceSpecs"], false);
}

#[test]
#[ignore = "needs root"]
fn sighup_restarts_with_the_config_re_read() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::preset("single");
    let config = node.tmp.path().join("config.yaml");
    let shared = "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: gpu\n      replicas: 3\n";
    std::fs::write(&config, shared).unwrap();
    let (mut k, mut p) = start(&node, &["--config-file", config.to_str().unwrap()]);
    k.registered("nvidia.com/gpu.shared");
    assert_eq!(k.devices("nvidia.com/gpu.shared", |d| !d.is_empty()).len(), 3);

    std::fs::write(&config, "version: v1\n").unwrap();
    // SAFETY: kill(2) on the PID of the plugin this test started.
    unsafe { libc::kill(p.pid(), libc::SIGHUP) };
    k.registered("nvidia.com/gpu");
    assert_eq!(ids(&k.devices("nvidia.com/gpu", |d| !d.is_empty())), vec![node.uuid(0)]);
    let dir = kubelet_dir(&node);
    assert!(!dir.join("nvinject-gpu.shared.sock").exists(), "the old resource's socket is gone");
    assert!(p.running(), "same process, started over");
    assert!(p.terminate().success());
}

/// An operator edits the plugin's ConfigMap: the kubelet swaps the mounted file (a rename), the
/// plugin notices within its watch interval and starts over with the new configuration, with no
/// SIGHUP and no config-manager sidecar; an edit that does not load is reported, naming the file,
/// and the plugin keeps serving the configuration it has.
#[test]
#[ignore = "needs root"]
fn an_edited_config_file_restarts_the_plugin_and_a_bad_edit_is_ignored() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::preset("single");
    let config = node.tmp.path().join("config.yaml");
    let swap = |text: &str| {
        let next = node.tmp.path().join("config.yaml.next");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, &config).unwrap();
    };
    swap("version: v1\n");
    let (mut k, mut p) =
        start(&node, &["--config-file", config.to_str().unwrap(), "--config-watch-interval", "200ms"]);
    k.registered("nvidia.com/gpu");
    assert_eq!(ids(&k.devices("nvidia.com/gpu", |d| !d.is_empty())), vec![node.uuid(0)]);

    swap(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
    );
    k.registered("nvidia.com/gpu");
    let devices = k.devices("nvidia.com/gpu", |d| d.len() == 4);
    assert_eq!(devices[3]["id"], format!("{}::3", node.uuid(0)));
    assert!(p.running(), "same process, started over");
    assert!(p.stderr().contains("config file changed: restarting with it"), "{}", p.stderr());

    // A bad edit: reported once with the file's name, the four replicas stay served.
    swap(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 0\n",
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !p.stderr().contains("does not load") {
        assert!(std::time::Instant::now() < deadline, "the bad edit is reported:\n{}", p.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(600));
    let log = p.stderr();
    let reported: Vec<&str> = log.lines().filter(|l| l.contains("does not load")).collect();
    assert_eq!(reported.len(), 1, "reported once, not every interval:\n{log}");
    assert!(reported[0].contains(config.to_str().unwrap()), "names the file: {}", reported[0]);
    assert_eq!(log.matches("config file changed: restarting").count(), 1, "no restart for it:\n{log}");
    let c = k.allocate("nvidia.com/gpu", json!([[format!("{}::2", node.uuid(0))]])).unwrap();
    assert_eq!(annotation(&c["containers"][0]).1, format!("nvidia.com/gpu={}", node.uuid(0)));
    assert!(p.terminate().success());
}
