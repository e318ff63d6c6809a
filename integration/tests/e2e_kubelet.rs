//! End to end with a real kubelet (issue 7): the standalone kubelet 1.20 (built from Debian's source
//! package and cached, see integration/kubelet/build-kubelet.sh) drives containerd through CRI on a node
//! that lives in private mount and network namespaces, so the host keeps its /var/lib/kubelet,
//! /var/log/pods, /run/containerd and sysctls. Needs root, containerd, runc, util-linux and iproute2;
//! a missing one fails the test with the fix, it never skips.
//!
//! Run by hand: `cargo test -p nvinject-integration --test e2e_kubelet -- --nocapture` (see
//! integration/README.md, "End to end with a real kubelet", for what each step prints).

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nvinject_node_harness::kubelet::node::CONTAINERD_CONFIG;
use nvinject_node_harness::kubelet::{
    self, KubeNode, KubeletArtifacts, NodeOptions, PreparedNode, StaticPod,
};
use nvinject_node_harness::namespace::{self, isolated};
use nvinject_node_harness::node::{PROBE_IMAGE, PROBE_PATH, parse_report, probe_image, report_devices};
use nvinject_simnode::artifacts::{artifact, simnode_bin, static_hook, static_shim};
use nvinject_simnode::description::NodeDescription;
use serde_json::Value;

/// How long one isolated run may take before everything in its namespace is killed.
const RUN_LIMIT: Duration = Duration::from_secs(15 * 60);

/// The kubelet and pause image, built outside the namespaces (the build needs the network; inside,
/// the cached result is found in milliseconds).
fn artifacts() -> KubeletArtifacts {
    let started = Instant::now();
    let a = kubelet::kubelet_artifacts().unwrap_or_else(|e| panic!("{e}"));
    let stamp = |k: &str| a.stamp.iter().find(|(key, _)| key == k).map_or("?", |(_, v)| v.as_str());
    println!(
        "kubelet {} ({}), built with {} in {} s (peak {} MiB); found in {:.1?}",
        stamp("kubelet-version"),
        a.kubelet.display(),
        stamp("go-version"),
        stamp("build-seconds"),
        stamp("compile-peak-tree-rss-mib"),
        started.elapsed()
    );
    a
}

/// The values the kubelet 1.20 writes into the sysctls it manages.
const KUBELET_SYSCTL_VALUES: &[(&str, &str)] = &[
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// Phase 1 of issue 7: the node harness itself, with plain runc (containerd's default runtime). A static
/// pod runs, CRI shows its container running, the manifest is removed and the kubelet stops and then
/// garbage-collects it; the namespace holds the kubelet's sysctl writes; nothing is left afterwards
/// (checked from the host's side by `isolated`).
#[test]
#[ignore = "needs root"]
fn kubelet_runs_a_static_pod_with_runc() {
    nvinject_test_support::require_root("namespaces, containerd and the kubelet");
    let artifacts = artifacts();
    isolated("kubelet_runs_a_static_pod_with_runc", RUN_LIMIT, |inside| {
        let test_started = Instant::now();
        let prepared =
            PreparedNode::new(inside, &artifacts, NodeOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        let t = Instant::now();
        let mut node = prepared.start().unwrap_or_else(|e| panic!("{e}"));
        println!(
            "containerd and kubelet up in {:.2?}; runtime {}",
            t.elapsed(),
            node.cri().version().unwrap()
        );

        // The kubelet's sysctl writes landed in the namespace's shadow files.
        for (name, file) in node.sysctl_files() {
            let want = KUBELET_SYSCTL_VALUES.iter().find(|(n, _)| n == name).map(|(_, v)| *v).unwrap();
            let got = fs::read_to_string(file).unwrap();
            assert_eq!(
                got.trim(),
                want,
                "sysctl {name}: the kubelet's value should be in {}",
                file.display()
            );
        }

        let pod = StaticPod::single("plain", &artifacts.pause_image, &[]);
        let since = node.add_static_pod(&pod).unwrap();
        let running =
            node.wait_running(&pod, "main", since, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"));
        println!("pod {}: manifest -> container running in {:.3?}", pod.name, running.after);

        // What CRI says about it: runc ran it (default handler), image and sandbox as the kubelet asked.
        let full_name = pod.full_name(node.name());
        let sandboxes = node.cri().pods(&[("io.kubernetes.pod.name", &full_name)]).unwrap();
        assert_eq!(sandboxes.len(), 1, "one sandbox for the pod: {sandboxes:?}");
        assert_eq!(sandboxes[0].id, running.pod_sandbox_id);
        assert_eq!(sandboxes[0].runtime_handler, "", "containerd's default runtime (runc) ran the sandbox");
        let (status, info) = node.cri().container_status(&running.id).unwrap();
        let status = status.expect("container status");
        assert!(status.image.as_ref().is_some_and(|i| i.image.contains("pause")), "{status:?}");
        let info: serde_json::Value =
            serde_json::from_str(info.get("info").map_or("{}", String::as_str)).unwrap();
        assert_eq!(info["runtimeType"], "io.containerd.runc.v2", "containerd's runc v2 shim ran it");

        node.remove_static_pod(&pod).unwrap();
        let stopped = node.wait_stopped(&pod, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"));
        println!(
            "pod {}: manifest removed -> stopped, and unchanged for {:?}, after {stopped:.2?}",
            pod.name,
            kubelet::node::STOP_QUIET
        );
        let removed = node.wait_removed(&pod, Duration::from_secs(150)).unwrap_or_else(|e| panic!("{e}"));
        println!("pod {}: garbage-collected by the kubelet {removed:.1?} after it stopped", pod.name);

        let report = node.shutdown().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(report.pods_removed, 0, "the kubelet removed its pod itself");
        assert!(report.cgroups_removed >= 10, "the kubelet's QoS cgroups were made and removed: {report:?}");
        println!("teardown: {report:?}; whole run {:.1?}", test_started.elapsed());
    });
}

/// The isolation the node tests rely on, tested on its own: inside, a shadowed kubelet path is usable
/// and lands in the test's directory, not on the host; a process and a cgroup deliberately left behind
/// are reported by the outer side (which kills the process), and the work dir is kept for a look.
#[test]
#[ignore = "needs root"]
fn isolation_reports_what_a_test_leaves_behind() {
    nvinject_test_support::require_root("namespaces, containerd and the kubelet");
    const NAME: &str = "isolation_reports_what_a_test_leaves_behind";
    let host_kubelet_dir = Path::new("/var/lib/kubelet/device-plugins");
    if let Some(inside) = namespace::inside(NAME) {
        let dir = inside.work().join("device-plugins");
        fs::create_dir_all(&dir).unwrap();
        inside.shadow(host_kubelet_dir, &dir).unwrap();
        fs::write(host_kubelet_dir.join("marker"), "written through the shadow").unwrap();
        assert!(dir.join("marker").is_file(), "the write landed in the test's directory");
        // Left behind on purpose: a process in the namespace and a cgroup of the test's name.
        let child = Command::new("sleep").arg("300").spawn().unwrap();
        fs::write(inside.work().join("leaked-pid"), child.id().to_string()).unwrap();
        std::mem::forget(child);
        let (mount_point, _, _) = namespace::cgroup_mounts().into_iter().next().expect("a cgroup hierarchy");
        fs::create_dir(mount_point.join(inside.cgroup_name())).unwrap();
        return;
    }
    let existed_before = host_kubelet_dir.exists();
    let outcome = namespace::run_outside(NAME, Duration::from_secs(120)).unwrap_or_else(|e| panic!("{e}"));
    assert!(outcome.passed, "the inside half failed: {}", outcome.status);
    let pid = fs::read_to_string(outcome.work.join("leaked-pid")).unwrap();
    let left = outcome.leftovers.join("\n");
    assert!(
        left.contains(&format!("process {pid} (sleep) still running")),
        "leaked process not reported:\n{left}"
    );
    assert!(left.contains("cgroup left: "), "leaked cgroup not reported:\n{left}");
    assert!(!left.contains("host path"), "the shadow must not touch the host:\n{left}");
    assert_eq!(host_kubelet_dir.exists(), existed_before, "{} on the host", host_kubelet_dir.display());
    // The outer side killed the process (by PID) and removed the cgroup; the work dir it kept goes now.
    let proc_dir = Path::new("/proc").join(pid.trim());
    let deadline = Instant::now() + Duration::from_secs(10);
    while proc_dir.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!proc_dir.exists(), "leaked process {pid} still alive after the outer side killed it");
    let name = namespace::cgroup_name_for(&outcome.work);
    for (mount_point, _, _) in namespace::cgroup_mounts() {
        assert!(!mount_point.join(&name).exists(), "cgroup {name} still in {}", mount_point.display());
    }
    fs::remove_dir_all(&outcome.work).unwrap();
}

/// The resource our device plugin serves and the kubelet allocates.
const GPU: &str = "nvidia.com/gpu";
/// How long after the last XID the plugin offers a GPU again (its `--health-recovery-period`).
const RECOVERY: Duration = Duration::from_secs(10);

/// Every binary the installer installs and the test runs, built (or found fresh) by cargo.
fn nvinject_binaries() -> Vec<PathBuf> {
    vec![
        static_shim(),
        static_hook(),
        artifact("nvinject-cdi-gen", "nvinject-cdi"),
        artifact("nvinject-device-plugin", "nvinject-device-plugin"),
        artifact("nvinject-installer", "nvinject-installer"),
        artifact("nvinject-integration", "nvinject-probe"),
        simnode_bin("nvinject-simnode"),
        nvinject_simnode::artifacts::sim_nvml_lib(),
    ]
}

/// The simulated 8-GPU node, as the tests see it.
struct SimNode {
    dir: PathBuf,
    description: NodeDescription,
}

impl SimNode {
    fn build(dir: &Path) -> SimNode {
        run(Command::new(simnode_bin("nvinject-simnode"))
            .args(["build", "--preset", "h100x8", "--out"])
            .arg(dir));
        let description = serde_json::from_str(&fs::read_to_string(dir.join("node.json")).unwrap()).unwrap();
        SimNode { dir: dir.to_path_buf(), description }
    }
    fn driver_root(&self) -> PathBuf {
        self.dir.join("driver")
    }
    fn dev_root(&self) -> PathBuf {
        self.dir.join("host")
    }
    fn minor_of(&self, uuid: &str) -> u32 {
        self.description.gpus.iter().find(|g| g.uuid == uuid).unwrap_or_else(|| panic!("no GPU {uuid}")).minor
    }
    fn uuids(&self) -> BTreeSet<String> {
        self.description.gpus.iter().map(|g| g.uuid.clone()).collect()
    }
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{text}", out.status);
    text
}

/// The directory the installer copies binaries from: the ones the test built, with the static
/// hook (the workspace build's `target/<profile>/nvinject-hook` is dynamic and refuses to run).
fn installer_source(sim: &SimNode) -> PathBuf {
    let dir = sim.dir.join("installer-source");
    if !dir.is_dir() {
        fs::create_dir_all(&dir).unwrap();
        for bin in nvinject_binaries() {
            fs::copy(&bin, dir.join(bin.file_name().unwrap())).unwrap();
        }
    }
    dir
}

/// The installer's command line for this node: host root `/` (the namespace shadows every default
/// path it writes), the simulated node's roots, the `nvidia` handler as containerd's default (a
/// standalone kubelet has no RuntimeClass to read), no restart (containerd starts after it).
fn installer(action: &str, sim: &SimNode, shim_link: &Path) -> Command {
    let mut cmd = Command::new(artifact("nvinject-installer", "nvinject-installer"));
    let host = sim.dev_root();
    cmd.arg(action)
        .arg("--source-dir")
        .arg(installer_source(sim))
        .arg("--driver-root")
        .arg(sim.driver_root())
        .arg("--dev-root")
        .arg(&host)
        .arg("--proc-root")
        .arg(host.join("proc"))
        .arg("--sys-root")
        .arg(host.join("sys"))
        .arg("--shim-link-dir")
        .arg(shim_link)
        .args(["--set-as-default", "--restart-mode", "none"])
        // /dev/char is the host's devtmpfs, and the simulated node's devices are not there.
        .arg("--no-dev-char-links");
    cmd
}

/// A pod whose one container `main` runs the probe image: it reports what it sees, then pauses. Every
/// pod of a run has its own name: the kubelet derives a static pod's UID from its manifest, and a
/// reused UID would find the old allocation in the kubelet's checkpoint.
fn probe_pod(name: &str, gpus: usize) -> StaticPod {
    let script = format!("{PROBE_PATH} report; exec {PROBE_PATH} pause");
    let pod = StaticPod::single(name, PROBE_IMAGE, &["/bin/sh", "-c", &script]);
    if gpus == 0 { pod } else { pod.with_limit(GPU, &gpus.to_string()) }
}

/// A pod that was admitted and runs: its UID, the GPUs the kubelet allocated, the probe's report.
struct Admitted {
    pod: StaticPod,
    uid: String,
    gpus: Vec<String>,
    report: Value,
}

/// Adds `pod`, waits for its container to run, reads the allocation and the probe's report, and
/// prints "manifest -> running" for it.
fn admit(node: &mut KubeNode, pod: StaticPod, timings: &mut Vec<(String, Duration)>) -> Admitted {
    let since = node.add_static_pod(&pod).unwrap();
    let running =
        node.wait_running(&pod, "main", since, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"));
    timings.push((pod.name.clone(), running.after));
    let gpus = node.allocated(&running.pod_uid, GPU).unwrap();
    let report =
        kubelet::wait_for("the probe's report", Duration::from_secs(20), Duration::from_millis(50), || {
            Ok(parse_report(&node.container_output(&pod, &running.pod_uid, "main")))
        })
        .unwrap_or_else(|e| panic!("pod {}: {e}", pod.name));
    println!("pod {}: manifest -> container running in {:.3?}; allocated {gpus:?}", pod.name, running.after);
    Admitted { pod, uid: running.pod_uid, gpus, report }
}

/// Adds `pod` and expects the kubelet's admission to refuse it (not enough free healthy GPUs).
fn refused(node: &mut KubeNode, pod: StaticPod) -> String {
    node.add_static_pod(&pod).unwrap();
    let status = kubelet::wait_for(
        "the kubelet's admission verdict",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || Ok(node.kubelet_pod_status(&pod)?.filter(|s| s["phase"] == "Failed")),
    )
    .unwrap_or_else(|e| panic!("pod {} asking for more GPUs than are free: {e}", pod.name));
    assert_eq!(status["reason"], "UnexpectedAdmissionError", "{status}");
    let full = pod.full_name(node.name());
    assert!(
        node.cri().pods(&[("io.kubernetes.pod.name", &full)]).unwrap().is_empty(),
        "no sandbox for a refused pod"
    );
    node.remove_static_pod(&pod).unwrap();
    let message = status["message"].as_str().unwrap_or_default().to_owned();
    println!("pod {}: refused by admission: {message}", pod.name);
    message
}

fn remove(node: &mut KubeNode, pod: &StaticPod) {
    node.remove_static_pod(pod).unwrap();
    node.wait_stopped(pod, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"));
}

/// What a container given exactly `uuid` must see: that GPU and no other, through NVML and the
/// `nvidia-smi` stand-in; its device node (allowed by the device cgroup), the control nodes; the
/// driver's libraries mounted and in the ld cache.
fn assert_sees_exactly(report: &Value, sim: &SimNode, uuid: &str) {
    let smi: Vec<&str> =
        report["nvidia_smi"]["lines"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let listed: Vec<&&str> = smi.iter().filter(|l| l.starts_with("GPU ")).collect();
    assert_eq!(listed.len(), 1, "nvidia-smi -L lists one GPU: {smi:?}");
    assert!(listed[0].contains(uuid), "nvidia-smi lists the allocated GPU {uuid}: {smi:?}");
    assert_eq!(report["nvml"]["uuids"], serde_json::json!([uuid]), "NVML inside: {}", report["nvml"]);
    let devices = report_devices(report);
    let own = format!("/dev/nvidia{}", sim.minor_of(uuid));
    let (open, _) = devices.get(&own).unwrap_or_else(|| panic!("{own} missing: {devices:?}"));
    assert_ne!(open, "EPERM", "the device cgroup allows {own}");
    for control in ["/dev/nvidiactl", "/dev/nvidia-uvm"] {
        assert!(devices.contains_key(control), "{control} missing: {devices:?}");
    }
    let gpu_nodes: Vec<&String> = devices
        .keys()
        .filter(|p| p.strip_prefix("/dev/nvidia").is_some_and(|n| n.parse::<u32>().is_ok()))
        .collect();
    assert_eq!(gpu_nodes, [&own], "only the allocated GPU's node");
    let version = &sim.description.driver.version;
    let ml = format!("libnvidia-ml.so.{version}");
    let mounted = report["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m["target"].as_str().is_some_and(|t| t.ends_with(&ml)));
    assert!(mounted, "{ml} is mounted");
    let ldconfig = report["ldconfig"]["lines"].as_array().into_iter().flatten().filter_map(Value::as_str);
    assert!(ldconfig.clone().any(|l| l.contains("libnvidia-ml.so.1")), "ld cache lists libnvidia-ml.so.1");
}

/// What a container that asked for nothing must see: no NVIDIA device, library, tool or variable.
fn assert_sees_no_gpu(report: &Value) {
    let devices = report_devices(report);
    assert!(devices.is_empty(), "no NVIDIA device nodes: {devices:?}");
    let nvidia_mounts: Vec<&Value> = report["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["target"].as_str().is_some_and(|t| t.contains("nvidia")))
        .collect();
    assert!(nvidia_mounts.is_empty(), "no NVIDIA mounts: {nvidia_mounts:?}");
    assert!(report["nvidia_smi"].is_null(), "no nvidia-smi: {}", report["nvidia_smi"]);
    assert!(
        report["nvml"]["dlopen"].as_str().is_some_and(|s| s != "ok"),
        "libnvidia-ml.so.1 does not load: {}",
        report["nvml"]
    );
    let env: Vec<&String> = report["environ"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.keys())
        .filter(|k| k.starts_with("NVIDIA_"))
        .collect();
    assert!(env.is_empty(), "no NVIDIA_ variables: {env:?}");
}

/// Waits until the kubelet's healthy set for GPUs satisfies `want`.
fn wait_healthy(
    node: &KubeNode,
    what: &str,
    timeout: Duration,
    want: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    kubelet::wait_for(what, timeout, Duration::from_millis(100), || {
        let healthy = node.healthy(GPU).unwrap_or_default();
        Ok(want(&healthy).then_some(healthy))
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e}\nthe kubelet on the device plugin:\n{}\nplugin log:\n{}",
            kubelet_device_plugin_lines(node),
            node.log_tail("device-plugin", 20)
        )
    })
}

/// The kubelet's log lines about device plugins (registration, ListAndWatch, health), for failures.
fn kubelet_device_plugin_lines(node: &KubeNode) -> String {
    let log = node.log_tail("kubelet", 5000);
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| {
            ["device plugin", "Device Plugin", "listAndWatch", "endpoint.go", "became unhealthy"]
                .iter()
                .any(|k| l.contains(k))
        })
        .collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}

/// Issue 7: a GPU pod goes from manifest through the kubelet, our device plugin, CRI, containerd
/// (configured by our installer) and our shim to a container that sees exactly its GPU; the six checks.
#[test]
#[ignore = "needs root"]
fn gpu_pods_through_kubelet_device_plugin_and_shim() {
    nvinject_test_support::require_root("namespaces, containerd and the kubelet");
    let artifacts = artifacts();
    let binaries = nvinject_binaries();
    isolated("gpu_pods_through_kubelet_device_plugin_and_shim", RUN_LIMIT, |inside| {
        let test_started = Instant::now();
        let mut timings: Vec<(String, Duration)> = Vec::new();
        let work = inside.work();
        let sim = SimNode::build(&work.join("sim"));
        println!(
            "simulated node: {} GPUs ({}), driver {}",
            sim.description.gpus.len(),
            sim.description.name,
            sim.description.driver.version
        );
        let probe = probe_image(&work.join("probe.tar")).unwrap_or_else(|e| panic!("{e}"));

        // The node, configured by our installer before containerd starts (as after a reboot).
        let (prepared, shim_link, original_config) =
            node_for_the_installer(inside, &artifacts, "gpu-node", probe);
        let t = Instant::now();
        let out = run(&mut installer("install", &sim, &shim_link));
        println!("installer: install in {:.2?}\n{}", t.elapsed(), out.trim_end());
        assert_ne!(
            fs::read(CONTAINERD_CONFIG).unwrap(),
            original_config,
            "the installer configured containerd"
        );
        assert!(Path::new("/var/run/cdi/nvidia.com-gpu.json").is_file(), "the installer wrote the CDI spec");
        let t = Instant::now();
        let mut node = prepared.start().unwrap_or_else(|e| panic!("{e}"));
        println!("containerd and kubelet up in {:.2?}", t.elapsed());

        // Our device plugin, with its defaults but for the simulated node's roots.
        let mut plugin = Command::new(&binaries[3]);
        plugin
            .arg("--nvidia-driver-root")
            .arg(sim.driver_root())
            .arg("--nvidia-dev-root")
            .arg(sim.dev_root())
            .arg("--proc-root")
            .arg(sim.dev_root().join("proc"))
            .arg("--health-recovery-period")
            .arg(format!("{}s", RECOVERY.as_secs()));
        let t = Instant::now();
        node.start_daemon("device-plugin", plugin).unwrap();
        let all =
            wait_healthy(&node, "the plugin to register 8 healthy GPUs", Duration::from_secs(30), |h| {
                h.len() == 8
            });
        assert_eq!(
            all.iter().cloned().collect::<BTreeSet<_>>(),
            sim.uuids(),
            "the kubelet holds every GPU of the node"
        );
        println!("device plugin registered {} GPUs with the kubelet in {:.2?}", all.len(), t.elapsed());

        // 1. One GPU: the container sees exactly the GPU the plugin allocated.
        let a = admit(&mut node, probe_pod("gpu-a", 1), &mut timings);
        assert_eq!(a.gpus.len(), 1);
        assert_sees_exactly(&a.report, &sim, &a.gpus[0]);
        println!("check 1 ok: pod gpu-a sees exactly {} (device node, libraries, ld cache)", a.gpus[0]);

        // 2. A second pod gets another GPU; more GPUs than are free is refused at admission.
        let b = admit(&mut node, probe_pod("gpu-b", 1), &mut timings);
        assert_sees_exactly(&b.report, &sim, &b.gpus[0]);
        assert_ne!(a.gpus, b.gpus, "two pods, two GPUs");
        let message = refused(&mut node, probe_pod("too-many", 7));
        assert!(message.contains(GPU), "{message}");
        println!("check 2 ok: gpu-b got {}, a 7-GPU pod was refused with 6 free", b.gpus[0]);

        // 3. No GPU asked, none given, though the pod runs through our runtime (the default handler).
        let plain = admit(&mut node, probe_pod("no-gpu", 0), &mut timings);
        assert!(plain.gpus.is_empty());
        assert_sees_no_gpu(&plain.report);
        let full = plain.pod.full_name(node.name());
        let id = node.cri().containers(&[("io.kubernetes.pod.name", &full)]).unwrap()[0].id.clone();
        let (_, info) = node.cri().container_status(&id).unwrap();
        let info: Value = serde_json::from_str(info.get("info").map_or("{}", String::as_str)).unwrap();
        assert_eq!(info["runtimeType"], "io.containerd.nvinject.v2", "the pod ran through our shim");
        println!(
            "check 3 ok: pod no-gpu ran through {} and got no NVIDIA device, library or variable",
            info["runtimeType"]
        );

        // 4. The kubelet restarts: the plugin registers again and a new pod still gets a GPU.
        let socket = node.dirs().device_plugins().join("nvinject-gpu.sock");
        // Inode numbers are reused at once on ext4: a re-created socket is told apart by its ctime too.
        let identity = |m: &fs::Metadata| (m.ino(), m.ctime(), m.ctime_nsec());
        let before = identity(&fs::metadata(&socket).unwrap());
        // The restarted kubelet reads its old checkpoint (8 devices) but admits against an empty
        // healthy set until the plugin's ListAndWatch arrives, and that update rewrites the checkpoint:
        // so wait for a rewrite after the restart, not just for 8 devices in the file.
        let checkpoint = node.dirs().device_plugins().join(kubelet::node::CHECKPOINT_FILE);
        let checkpoint_before = identity(&fs::metadata(&checkpoint).unwrap());
        let restart = node.restart_kubelet().unwrap_or_else(|e| panic!("{e}"));
        kubelet::wait_for(
            "the plugin's socket to be served again",
            Duration::from_secs(30),
            Duration::from_millis(50),
            || Ok(fs::metadata(&socket).ok().filter(|m| identity(m) != before)),
        )
        .unwrap_or_else(|e| panic!("{e}\nplugin log:\n{}", node.log_tail("device-plugin", 20)));
        wait_healthy(&node, "the re-registered plugin's 8 GPUs", Duration::from_secs(30), |h| {
            h.len() == 8 && fs::metadata(&checkpoint).is_ok_and(|m| identity(&m) != checkpoint_before)
        });
        let c = admit(&mut node, probe_pod("gpu-c", 1), &mut timings);
        assert!(
            !a.gpus.contains(&c.gpus[0]) && !b.gpus.contains(&c.gpus[0]),
            "gpu-c got a free GPU: {:?}",
            c.gpus
        );
        assert_sees_exactly(&c.report, &sim, &c.gpus[0]);
        println!(
            "check 4 ok: kubelet restarted in {restart:.2?}, plugin re-registered, gpu-c got {}",
            c.gpus[0]
        );

        // 5. An XID on gpu-a's GPU: Unhealthy, not given to a new pod even once free, then offered again.
        let hit = a.gpus[0].clone();
        run(Command::new(&binaries[6])
            .arg("xid")
            .arg("--node")
            .arg(sim.dir.join("node.json"))
            .args(["--gpu", &hit, "--xid", "79"]));
        let t = Instant::now();
        wait_healthy(&node, "the XID-hit GPU to be reported Unhealthy", Duration::from_secs(30), |h| {
            !h.contains(&hit)
        });
        println!("XID 79 on {hit}: Unhealthy at the kubelet after {:.2?}", t.elapsed());
        remove(&mut node, &a.pod);
        // 6 GPUs free (b and c hold two), one of them unhealthy.
        refused(&mut node, probe_pod("six-with-one-sick", 6));
        let five = admit(&mut node, probe_pod("five", 5), &mut timings);
        assert!(!five.gpus.contains(&hit), "the unhealthy GPU was given out: {:?}", five.gpus);
        remove(&mut node, &five.pod);
        wait_healthy(&node, "the GPU to be Healthy after the quiet period", RECOVERY * 6, |h| {
            h.contains(&hit)
        });
        println!("{hit}: Healthy again after {:.1?} (recovery period {RECOVERY:?})", t.elapsed());
        let six = admit(&mut node, probe_pod("six", 6), &mut timings);
        assert!(six.gpus.contains(&hit), "the recovered GPU is offered again: {:?}", six.gpus);
        println!(
            "check 5 ok: {hit} Unhealthy after the XID, skipped while unhealthy, allocated again after recovery"
        );

        // 6. Teardown: drain the node, uninstall, and nothing is left (the outer side checks the host).
        let t = Instant::now();
        let report = node.shutdown().unwrap_or_else(|e| panic!("{e}"));
        let out = run(&mut installer("uninstall", &sim, &shim_link));
        println!("installer: uninstall\n{}", out.trim_end());
        assert_eq!(
            fs::read(CONTAINERD_CONFIG).unwrap(),
            original_config,
            "uninstall restored containerd's config"
        );
        println!("check 6: node drained in {:.2?}: {report:?}", t.elapsed());
        println!("manifest -> container running, per pod:");
        for (pod, d) in &timings {
            println!("  {pod:<8} {:>7.3} s", d.as_secs_f64());
        }
        println!("whole run inside the namespaces: {:.1?}", test_started.elapsed());
    });
}

/// A node named `name` whose containerd the installer is to configure before it starts (as after a
/// reboot): the shim-link folder on containerd's `PATH`, the probe image, and containerd's config
/// as it was before the installer.
fn node_for_the_installer(
    inside: &namespace::Inside,
    artifacts: &KubeletArtifacts,
    name: &str,
    probe: nvinject_image_tool::image::BuiltImage,
) -> (PreparedNode, PathBuf, Vec<u8>) {
    let shim_link = inside.work().join("shim-link");
    fs::create_dir_all(&shim_link).unwrap();
    let options = NodeOptions {
        node_name: name.into(),
        containerd_path_prepend: vec![shim_link.clone()],
        images: vec![probe],
        ..NodeOptions::default()
    };
    let prepared = PreparedNode::new(inside, artifacts, options).unwrap_or_else(|e| panic!("{e}"));
    let original_config = fs::read(CONTAINERD_CONFIG).unwrap();
    (prepared, shim_link, original_config)
}

/// Issue 32 through a real kubelet: on a node whose spec was installed with `--mps-pipe-dir` and
/// whose device plugin shares `nvidia.com/gpu` with `sharing.mps`, a pod given a replica gets the
/// spec's MPS device (the daemon's pipe folder and `CUDA_MPS_PIPE_DIRECTORY`) and reaches the
/// daemon; a pod without a GPU, through the same runtime, sees neither and does not reach it.
#[test]
#[ignore = "needs root"]
fn mps_shared_pods_get_the_mps_device_through_the_kubelet() {
    nvinject_test_support::require_root("namespaces, containerd and the kubelet");
    let artifacts = artifacts();
    let binaries = nvinject_binaries();
    isolated("mps_shared_pods_get_the_mps_device_through_the_kubelet", RUN_LIMIT, |inside| {
        let work = inside.work();
        let sim = SimNode::build(&work.join("sim"));
        let pipe_dir = sim.driver_root().join("tmp/nvidia-mps");
        let dir = pipe_dir.to_string_lossy().into_owned();
        let probe = probe_image(&work.join("probe.tar")).unwrap_or_else(|e| panic!("{e}"));
        let (prepared, shim_link, original_config) =
            node_for_the_installer(inside, &artifacts, "mps-node", probe);
        run(installer("install", &sim, &shim_link).arg("--mps-pipe-dir").arg(&pipe_dir));
        let spec: Value =
            serde_json::from_slice(&fs::read("/var/run/cdi/nvidia.com-gpu.json").unwrap()).unwrap();
        let mps = spec["devices"].as_array().unwrap().iter().find(|d| d["name"] == "mps");
        assert!(mps.is_some(), "the installed spec has the mps device");
        assert!(!spec["containerEdits"].to_string().contains(&dir), "the folder is not in the common edits");
        let mut node = prepared.start().unwrap_or_else(|e| panic!("{e}"));

        let config = work.join("plugin.yaml");
        fs::write(
            &config,
            "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
        )
        .unwrap();
        let mut plugin = Command::new(&binaries[3]);
        plugin
            .arg("--nvidia-driver-root")
            .arg(sim.driver_root())
            .arg("--nvidia-dev-root")
            .arg(sim.dev_root())
            .arg("--proc-root")
            .arg(sim.dev_root().join("proc"))
            .arg("--config-file")
            .arg(&config)
            .arg("--mps-pipe-dir")
            .arg(&pipe_dir);
        node.start_daemon("device-plugin", plugin).unwrap();
        wait_healthy(&node, "the plugin to register 16 MPS replicas", Duration::from_secs(30), |h| {
            h.len() == 16
        });

        let token = |pod: &str| format!("hello-from-{pod}-{}", std::process::id());
        let server = format!("server-{}", std::process::id());
        let answer = {
            let server = server.clone();
            move |r: &nvinject_node_harness::mps::Received| format!("{server} {}", r.message)
        };
        let daemon = nvinject_node_harness::mps::MpsDaemon::start(&pipe_dir, Box::new(answer)).unwrap();
        let pod = |name: &str, gpus: usize| {
            let script = format!(
                "{PROBE_PATH} mps-client \"${{CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}}/control\" {}; \
                 {PROBE_PATH} report; exec {PROBE_PATH} pause",
                token(name)
            );
            let p = StaticPod::single(name, PROBE_IMAGE, &["/bin/sh", "-c", &script]);
            if gpus == 0 { p } else { p.with_limit(GPU, &gpus.to_string()) }
        };
        let mut timings = Vec::new();
        let client = admit(&mut node, pod("mps-client", 1), &mut timings);
        let plain = admit(&mut node, pod("mps-no-gpu", 0), &mut timings);
        let seen = daemon.stop();
        println!("daemon saw: {seen:?}");

        assert_eq!(client.gpus.len(), 1);
        assert!(client.gpus[0].contains("::"), "an MPS replica: {:?}", client.gpus);
        assert_eq!(client.report["environ"]["CUDA_MPS_PIPE_DIRECTORY"].as_str(), Some(dir.as_str()));
        let mounted = |r: &Value| {
            r["mounts"].as_array().into_iter().flatten().any(|m| m["target"].as_str() == Some(dir.as_str()))
        };
        assert!(mounted(&client.report), "{dir} not mounted in the MPS client: {}", client.report["mounts"]);
        let messages: Vec<&str> = seen.received.iter().map(|r| r.message.as_str()).collect();
        assert_eq!(messages, [token("mps-client")], "only the MPS client reached the daemon");
        let output = node.container_output(&client.pod, &client.uid, "main");
        assert!(output.contains(&format!("reply={server} {}", token("mps-client"))), "{output}");

        assert!(plain.gpus.is_empty());
        assert!(
            plain.report["environ"].get("CUDA_MPS_PIPE_DIRECTORY").is_none(),
            "{}",
            plain.report["environ"]
        );
        assert!(!mounted(&plain.report), "{dir} mounted without a GPU: {}", plain.report["mounts"]);
        println!(
            "MPS: {} got the mps device and reached the daemon; the pod without a GPU did not",
            client.pod.name
        );

        node.shutdown().unwrap_or_else(|e| panic!("{e}"));
        run(&mut installer("uninstall", &sim, &shim_link));
        assert_eq!(
            fs::read(CONTAINERD_CONFIG).unwrap(),
            original_config,
            "uninstall restored containerd's config"
        );
    });
}
