//! A real cluster (issue 14): the control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler 1.20) and a simulated GPU node (containerd, supervised as its systemd unit would be,
//! and the kubelet joined to the API server) inside the test's own mount and network namespaces;
//! nvinject's image (the one `deploy/` names, packed from this build's debug binaries by the code
//! `./x image` uses) imported into the node's containerd; the real `deploy/` rolled out with
//! `kubectl apply -k` through a test overlay that only points roots at the simulated node and the
//! node's own host root. Then the article's day-1 and day-2 checks, asserted on what kubectl and the
//! containers print: the installer pod restarting the live containerd under running pods, allocatable,
//! gpu-smoke, ResourceQuota, taint, time-slicing through the plugin's ConfigMap, removal by deleting
//! the installer DaemonSet; and on a second node variant (a100-mig, `migStrategy: mixed`) the MIG
//! names and the article's MIG trap. Needs root, containerd, runc, openssl, util-linux and iproute2;
//! the first run builds the control plane (see integration/kubelet/build-kubelet.sh) and fetches
//! Debian's etcd, kubectl and CNI plugins.
//!
//! Run by hand: `cargo test -p nvinject-integration --test cluster -- --nocapture`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nvinject_cluster_harness::fleet::{API_ADDRESS, Fleet, JoinSpec};
use nvinject_cluster_harness::{
    self as cluster, CONTAINERD_RESTART_DELAY, Cluster, ClusterArtifacts, ClusterOptions, GPU_NODE_LABEL,
    PreparedCluster, SimRoots, condition, test_overlay,
};
use nvinject_image_tool::image::{self, ImageSpec};
use nvinject_image_tool::release_image;
use nvinject_node_harness::artifacts;
use nvinject_node_harness::containerd::ctr_command;
use nvinject_node_harness::kubelet::node::{CONTAINERD_CONFIG, CONTAINERD_SOCKET};
use nvinject_node_harness::kubelet::{self, KubeletError};
use nvinject_node_harness::namespace::{Inside, isolated};
use nvinject_simnode::artifacts::{simnode_bin, static_hook};
use serde_json::{Value, json};

/// One cluster at a time: two on two cores would slow each other past their waits.
static ONE_CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// How long one isolated run may take before everything in its namespace is killed.
const RUN_LIMIT: Duration = Duration::from_secs(20 * 60);
/// The resource our device plugin advertises.
const GPU: &str = "nvidia.com/gpu";
/// The GPU node's name.
const NODE: &str = "gpu-node";
/// The article's gpu-smoke image, replaced by a local one carrying the simulated driver's nvidia-smi.
const SMOKE_IMAGE: &str = "localhost/nvinject/gpu-smoke:1";
/// nvinject's namespace in deploy/.
const NAMESPACE: &str = "nvinject-system";
/// containerd's name for our runtime.
const NVINJECT_RUNTIME: &str = "io.containerd.nvinject.v2";

fn artifacts() -> ClusterArtifacts {
    let started = Instant::now();
    let a = cluster::cluster_artifacts().unwrap_or_else(|e| panic!("{e}"));
    let stamp = |k: &str| a.kubelet.stamp.iter().find(|(key, _)| key == k).map_or("?", |(_, v)| v.as_str());
    println!(
        "kubelet and control plane {} ({}), built with {} in {} s (compile {} s, peak {} MiB); etcd, kubectl, CNI from {}; found in {:.1?}",
        stamp("kubelet-version"),
        a.kube_apiserver.parent().unwrap().display(),
        stamp("go-version"),
        stamp("build-seconds"),
        stamp("compile-seconds"),
        stamp("compile-peak-tree-rss-mib"),
        a.etcd.parent().unwrap().parent().unwrap().parent().unwrap().display(),
        started.elapsed()
    );
    a
}

/// What every cluster test starts from: the control plane's artifacts, this build's binaries, the
/// image name deploy/ uses, deploy/ itself, and the one-cluster-at-a-time lock (held while it lives).
struct Setup {
    artifacts: ClusterArtifacts,
    bins: Binaries,
    image_name: String,
    deploy: PathBuf,
    _one: std::sync::MutexGuard<'static, ()>,
}

fn setup() -> Setup {
    let artifacts = artifacts();
    let bins = Binaries::find();
    let image_name = release_image::manifests_image(&bins.installer).unwrap_or_else(|e| panic!("{e}"));
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy").canonicalize().unwrap();
    let _one = ONE_CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    Setup { artifacts, bins, image_name, deploy, _one }
}

/// This build's binaries, found (or built) by cargo outside the namespaces.
struct Binaries {
    installer: PathBuf,
    hook: PathBuf,
    simnode: PathBuf,
    /// The directory the installer copies from when run on the node before containerd starts (the
    /// same files the image carries).
    bin_dir: PathBuf,
}

impl Binaries {
    fn find() -> Self {
        let bin_dir = artifacts::this_build_bin_dir().unwrap_or_else(|e| panic!("{e}"));
        let installer = bin_dir.join("nvinject-installer");
        Binaries { installer, hook: static_hook(), simnode: simnode_bin("nvinject-simnode"), bin_dir }
    }
}

/// nvinject's image under the name deploy/ uses, from this build's debug binaries with their debug
/// info stripped (`release_image::stripped_copies`), and the gpu-smoke image carrying `nvidia_smi`,
/// the simulated driver's.
fn images(
    bins: &Binaries,
    image_name: &str,
    work: &Path,
    nvidia_smi: &Path,
) -> (release_image::ReleaseImage, image::BuiltImage) {
    let t = Instant::now();
    let release = release_image::build_stripped(&bins.bin_dir, &bins.hook, image_name, work)
        .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "image {} {} ({:.0} MiB, debug binaries without debug info) built in {:.1?}",
        release.image.name,
        release.digest,
        release.size as f64 / 1048576.0,
        t.elapsed()
    );
    let smoke = image::build(
        &ImageSpec {
            name: SMOKE_IMAGE.into(),
            programs: vec![nvidia_smi.to_path_buf()],
            cmd: vec!["nvidia-smi".into()],
            env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
        },
        &work.join("gpu-smoke.tar"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    (release, smoke)
}

/// A cluster ready to start: the simulated node, nvinject's image, and the overlay of deploy/.
struct Staged {
    sim: SimRoots,
    release: release_image::ReleaseImage,
    prepared: PreparedCluster,
    overlay: PathBuf,
}

/// Builds the simulated node `preset`, nvinject's image under the name deploy/ uses and the gpu-smoke
/// image, lays out the cluster (control plane running, node not started) and writes the test overlay.
fn stage(
    inside: &Inside,
    artifacts: &ClusterArtifacts,
    bins: &Binaries,
    image_name: &str,
    deploy: &Path,
    preset: &str,
) -> Staged {
    let work = inside.work();
    let sim_dir = work.join("sim");
    run(Command::new(&bins.simnode).args(["build", "--preset", preset, "--out"]).arg(&sim_dir));
    let sim = SimRoots::of(&sim_dir);
    let (release, smoke) = images(bins, image_name, work, &sim.driver_root.join("usr/bin/nvidia-smi"));
    let options =
        ClusterOptions { node_name: NODE.into(), images: vec![release.image.clone(), smoke], sim_dir };
    let prepared = PreparedCluster::new(inside, artifacts, options).unwrap_or_else(|e| panic!("{e}"));
    let overlay = work.join("overlay");
    fs::create_dir_all(&overlay).unwrap();
    for (file, text) in test_overlay(&overlay, deploy, prepared.host_root(), &sim, cluster::NODE_IP) {
        fs::write(overlay.join(file), text).unwrap();
    }
    Staged { sim, release, prepared, overlay }
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{text}", out.status);
    text
}

fn wait<T>(
    what: &str,
    timeout: Duration,
    cluster: &mut Cluster,
    mut probe: impl FnMut(&mut Cluster) -> Option<T>,
) -> T {
    kubelet::wait_for(what, timeout, Duration::from_millis(250), || {
        cluster.control_plane().check_running()?;
        Ok(probe(cluster))
    })
    .unwrap_or_else(|e: KubeletError| {
        panic!(
            "{e}\nnvinject pods:\n{}\nkubelet log:\n{}",
            cluster.kubectl_out(&["get", "pods", "-A", "-o", "wide"]).unwrap_or_default(),
            cluster.node().log_tail("kubelet", 20)
        )
    })
}

/// The article's gpu-smoke pod (`runtimeClassName: nvidia`, `nvidia-smi -L`), with or without the limit.
fn smoke_pod(name: &str, gpus: Option<u32>) -> Value {
    smoke_pod_of(name, GPU, gpus)
}

/// [`smoke_pod`] asking for `resource` (a MIG name).
fn smoke_pod_of(name: &str, resource: &str, count: Option<u32>) -> Value {
    let mut container = json!({
        "name": "cuda",
        "image": SMOKE_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["nvidia-smi", "-L"],
    });
    if let Some(n) = count {
        container["resources"] = json!({ "limits": { resource: n.to_string() } });
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "restartPolicy": "Never",
            "runtimeClassName": "nvidia",
            // It needs no API access (and the test's pods mount nothing but their image).
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        },
    })
}

/// A completed smoke pod: its phase, log, UID, the GPUs the kubelet allocated, the runtime containerd ran it with.
struct Smoke {
    phase: String,
    log: String,
    gpus: Vec<String>,
    runtime: String,
    took: Duration,
}

fn run_smoke(cluster: &mut Cluster, name: &str, gpus: Option<u32>) -> Smoke {
    run_smoke_of(cluster, name, GPU, gpus)
}

/// [`run_smoke`] asking for `resource`.
fn run_smoke_of(cluster: &mut Cluster, name: &str, resource: &str, count: Option<u32>) -> Smoke {
    let pod = smoke_pod_of(name, resource, count);
    let started = Instant::now();
    // The namespace's default ServiceAccount is the controller-manager's to make: retried until it is.
    let applied = kubelet::wait_for(
        &format!("pod {name} to be accepted"),
        Duration::from_secs(60),
        Duration::from_millis(500),
        || Ok(cluster.apply(&pod).ok()),
    );
    applied.unwrap_or_else(|e| panic!("{e}: {:?}", cluster.apply(&pod).err()));
    let done = wait(&format!("pod {name} to complete"), Duration::from_secs(120), cluster, |c| {
        let p = c.get_json(&["pod", name]).ok()?;
        matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")).then_some(p)
    });
    let took = started.elapsed();
    let phase = done["status"]["phase"].as_str().unwrap_or_default().to_owned();
    let log = cluster.kubectl_out(&["logs", name]).unwrap_or_else(|e| panic!("{e}"));
    let uid = done["metadata"]["uid"].as_str().unwrap().to_owned();
    let gpus = cluster.node().allocated(&uid, resource).unwrap_or_else(|e| panic!("{e}"));
    let id = done["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|s| s.strip_prefix("containerd://"))
        .unwrap_or_else(|| panic!("pod {name} reports no containerd container: {}", done["status"]))
        .to_owned();
    let info = run(ctr_command(Path::new(CONTAINERD_SOCKET), "k8s.io").args(["containers", "info", &id]));
    let info: Value = serde_json::from_str(&info).unwrap_or_else(|e| panic!("ctr c info {id}: {e}: {info}"));
    let runtime = info["Runtime"]["Name"].as_str().unwrap_or_default().to_owned();
    println!(
        "pod {name}: {phase} in {took:.2?}, allocated {gpus:?}, runtime {runtime}; log: {:?}",
        log.trim()
    );
    Smoke { phase, log, gpus, runtime, took }
}

/// A pod in `namespace` that holds `gpus` GPUs and sleeps.
fn sleeper(namespace: &str, name: &str, gpus: u32) -> Value {
    let mut pod = smoke_pod(name, Some(gpus));
    pod["metadata"]["namespace"] = json!(namespace);
    pod["spec"]["containers"][0]["command"] = json!(["sleep", "600"]);
    pod
}

/// The article's time-slicing sketch, appended to the plugin's config: 4 replicas per GPU.
const TIME_SLICING: &str =
    "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n";

/// A pod with no GPU and no runtime class (containerd's default runtime) that sleeps.
fn plain_pod(name: &str) -> Value {
    let mut pod = sleeper("default", name, 0);
    let spec = pod["spec"].as_object_mut().unwrap();
    spec.remove("runtimeClassName");
    spec["containers"][0].as_object_mut().unwrap().remove("resources");
    pod
}

/// Creates [`plain_pod`] `name` and waits until it runs.
fn run_plain(cluster: &mut Cluster, name: &str) -> Value {
    let pod = plain_pod(name);
    kubelet::wait_for(
        &format!("pod {name} to be accepted"),
        Duration::from_secs(60),
        Duration::from_millis(500),
        || Ok(cluster.apply(&pod).ok()),
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}", cluster.apply(&pod).err()));
    wait(&format!("pod {name} to run"), Duration::from_secs(120), cluster, |c| {
        let p = c.get_json(&["pod", name]).ok()?;
        (p["status"]["phase"] == "Running").then_some(p)
    })
}

/// Every path below the node's host root with its kind (`d`, `f`, `l`), sorted; containerd's own
/// run directory (sockets, shims' state) and the simulated node bound in at `sim` are left out.
fn host_root_tree(root: &Path, sim: &Path) -> Vec<String> {
    let sim = nvinject_cluster_harness::in_root(root, sim);
    let walk_root = root;
    fn walk(root: &Path, skip: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let entry = entry.unwrap();
            let path = entry.path();
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if rel == "run/containerd" || path == skip {
                continue;
            }
            let kind = entry.file_type().unwrap();
            let tag = if kind.is_symlink() {
                'l'
            } else if kind.is_dir() {
                'd'
            } else {
                'f'
            };
            out.push(format!("{tag} {rel}"));
            if kind.is_dir() && !kind.is_symlink() {
                walk(root, skip, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(walk_root, &sim, walk_root, &mut out);
    out.sort();
    out
}

/// The annotation listing the labels nvinject set on a Node.
const MANAGED_LABELS: &str = "nvinject.io/managed-labels";

/// Waits until node [`NODE`] carries every `(label, value)`; returns its `nvidia.com/` labels.
fn wait_labels(cluster: &mut Cluster, expected: &[(&str, String)]) -> serde_json::Map<String, Value> {
    wait("the GPU labels on the Node object", Duration::from_secs(120), cluster, |c| {
        let node = c.get_json(&["node", NODE]).ok()?;
        let labels = node["metadata"]["labels"].as_object()?.clone();
        let all = expected.iter().all(|(k, v)| labels.get(*k).and_then(Value::as_str) == Some(v.as_str()));
        all.then(|| labels.into_iter().filter(|(k, _)| k.starts_with("nvidia.com/")).collect())
    })
}

/// A command's stdout, whatever its exit status (`kubectl auth can-i` exits 1 for "no").
fn process_output(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn gpu_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.starts_with("GPU ")).collect()
}

/// Issue 14: the control plane and a simulated GPU node come up; `kubectl apply -k` of deploy/
/// (through the test overlay) brings both DaemonSets to 1/1 Ready with nvinject's own image, the node
/// advertises 8 GPUs, the gpu-smoke pod sees exactly the GPU the plugin allocated through our shim, and
/// the same pod without the limit sees none; a GPU quota refuses the 9th GPU; on a tainted node our
/// DaemonSets still run and only tolerating pods are scheduled; teardown leaves nothing behind.
#[test]
#[ignore = "needs root"]
fn deploy_rolls_out_on_a_cluster_and_the_gpu_smoke_pod_gets_its_gpu() {
    nvinject_test_support::require_root("namespaces, containerd and a control plane");
    const NAME: &str = "deploy_rolls_out_on_a_cluster_and_the_gpu_smoke_pod_gets_its_gpu";
    let Setup { artifacts, bins, image_name, deploy, _one } = setup();
    isolated(NAME, RUN_LIMIT, |inside| {
        let test_started = Instant::now();
        let mut steps: Vec<(&str, Duration)> = Vec::new();
        // Bring-up: network, control plane, the node with plain containerd (as the node's image ships
        // it, supervised as its systemd unit would be), node Ready. nvinject is not on it yet.
        let t = Instant::now();
        let Staged { sim, release, prepared, overlay } =
            stage(inside, &artifacts, &bins, &image_name, &deploy, "h100x8");
        let sim_dir = sim.dir.clone();
        let host_root = prepared.host_root().to_path_buf();
        let original_config = fs::read(CONTAINERD_CONFIG).unwrap();
        let mut cluster = prepared.start().unwrap_or_else(|e| panic!("{e}"));
        let original_tree = host_root_tree(&host_root, &sim_dir);
        steps.push(("bring-up (images, control plane, node Ready)", t.elapsed()));
        println!("bring-up: control plane and node {NODE} Ready in {:.1?}", t.elapsed());
        let version: Value =
            serde_json::from_str(&cluster.kubectl_out(&["version", "-o", "json"]).unwrap()).unwrap();
        assert_eq!(version["serverVersion"]["gitVersion"], "v1.20.2", "the API server's version: {version}");
        assert_eq!(version["clientVersion"]["gitVersion"], "v1.20.2", "kubectl's version: {version}");

        // A pod running before nvinject arrives: it must outlive the installer's containerd restart.
        let before = run_plain(&mut cluster, "running-before");

        // kubectl apply -k: the installer pod configures containerd and restarts it (SIGHUP, deploy/'s
        // signal mode); the supervisor starts it again after its delay, as systemd would.
        let t = Instant::now();
        println!("{}", cluster.kubectl_out(&["apply", "-k", &overlay.to_string_lossy()]).unwrap().trim_end());
        let exit = wait("the installer to restart containerd", Duration::from_secs(180), &mut cluster, |c| {
            c.node().containerd_exits().first().cloned()
        });
        println!("containerd (pid {}) ended by the installer pod: {}", exit.pid, exit.status);
        assert!(exit.status.contains("SIGHUP"), "the installer's signal restart: {}", exit.status);
        // A pod created while containerd is down: it starts once containerd is back.
        cluster.apply(&plain_pod("created-during-restart")).unwrap();
        let applied = Instant::now();
        let down_when_applied =
            cluster.node().containerd_exits()[0].restarted.is_none_or(|(_, at)| at > applied);
        assert!(down_when_applied, "the pod was created inside the restart window");
        let back = wait("containerd to answer again", Duration::from_secs(60), &mut cluster, |c| {
            c.node_mut().containerd_ready().then(Instant::now)
        });
        let window = back.duration_since(exit.at);
        steps.push(("installer's containerd restart: down -> CRI ready", window));
        println!("containerd down for {window:.1?} (restart delay {CONTAINERD_RESTART_DELAY:?})");
        let daemonsets =
            wait("both DaemonSets to be 1/1 Ready", Duration::from_secs(180), &mut cluster, |c| {
                let list = c.get_json(&["daemonsets", "-n", NAMESPACE]).ok()?;
                let items = list["items"].as_array()?.clone();
                let ready = items.len() == 2
                    && items.iter().all(|d| {
                        d["status"]["desiredNumberScheduled"] == 1 && d["status"]["numberReady"] == 1
                    });
                ready.then_some(items)
            });
        let ds_ready = t.elapsed();
        println!("both DaemonSets 1/1 Ready {ds_ready:.1?} after apply");
        for d in &daemonsets {
            let image = &d["spec"]["template"]["spec"]["containers"][0]["image"];
            assert_eq!(image, image_name.as_str(), "{} runs the image deploy/ names", d["metadata"]["name"]);
        }
        let pods = cluster.get_json(&["pods", "-n", NAMESPACE]).unwrap();
        for p in pods["items"].as_array().unwrap() {
            let status = &p["status"]["containerStatuses"][0];
            assert_eq!(status["ready"], true, "{}", p["metadata"]["name"]);
            assert_eq!(status["restartCount"], 0, "no restart loop: {}", p["status"]);
            assert!(
                status["image"].as_str().is_some_and(|i| i.ends_with(&image_name)),
                "the pod runs the image deploy/ names: {status}"
            );
        }
        // The installer pod configured containerd, restarted it once, and lived through it.
        let installer_log =
            cluster.kubectl_out(&["logs", "-n", NAMESPACE, "daemonset/nvinject-installer"]).unwrap();
        assert!(
            installer_log.contains("containerd restarted and answering"),
            "the installer pod restarted containerd:\n{installer_log}"
        );
        assert_eq!(cluster.node().containerd_exits().len(), 1, "containerd restarted once");
        // The pod from before runs on, untouched; the one created during the restart runs too.
        let still = cluster.get_json(&["pod", "running-before"]).unwrap();
        let status = &still["status"]["containerStatuses"][0];
        assert_eq!(still["status"]["phase"], "Running", "{}", still["status"]);
        assert_eq!(
            status["containerID"], before["status"]["containerStatuses"][0]["containerID"],
            "{status}"
        );
        assert_eq!(status["restartCount"], 0, "{status}");
        let during =
            wait("the pod created during the restart to run", Duration::from_secs(120), &mut cluster, |c| {
                let p = c.get_json(&["pod", "created-during-restart"]).ok()?;
                (p["status"]["phase"] == "Running").then_some(p)
            });
        assert_eq!(during["status"]["containerStatuses"][0]["restartCount"], 0, "{}", during["status"]);
        let stuck = cluster.kubectl_out(&["get", "pods", "-A", "--no-headers"]).unwrap();
        assert!(
            !stuck.contains("ContainerCreating") && !stuck.contains("Terminating"),
            "no pod stuck after the restart:\n{stuck}"
        );
        // The name deploy/ uses is the image this test built and imported.
        let images = run(ctr_command(Path::new(CONTAINERD_SOCKET), "k8s.io").args(["images", "ls"]));
        assert!(
            images.lines().any(|l| l.starts_with(&format!("{image_name} ")) && l.contains(&release.digest)),
            "containerd resolves {image_name} to {}:\n{images}",
            release.digest
        );

        // allocatable nvidia.com/gpu, as the article's jq reads it.
        let allocatable =
            wait("allocatable nvidia.com/gpu to be 8", Duration::from_secs(120), &mut cluster, |c| {
                let nodes = c.get_json(&["nodes"]).ok()?;
                let node = nodes["items"].as_array()?.iter().find(|n| n["metadata"]["name"] == NODE)?.clone();
                let n = node["status"]["allocatable"][GPU].as_str()?.to_owned();
                (n == "8").then_some(n)
            });
        let gpus_visible = t.elapsed();
        steps.push(("apply -> DaemonSets 1/1 Ready", ds_ready));
        steps.push(("apply -> allocatable nvidia.com/gpu = 8", gpus_visible));
        println!("node {NODE}: allocatable {GPU} = {allocatable}, {gpus_visible:.1?} after apply");
        let node = cluster.get_json(&["node", NODE]).unwrap();
        assert_eq!(condition(&node, "Ready").unwrap()["status"], "True");

        // The GPU labels on the Node object, with NVIDIA's GPU feature discovery names and values,
        // set by the plugin through the API with a role that allows nothing but reading and
        // patching nodes.
        let description: Value =
            serde_json::from_str(&fs::read_to_string(sim_dir.join("node.json")).unwrap()).unwrap();
        let gpu0 = &description["gpus"][0];
        let driver = description["driver"]["version"].as_str().unwrap().to_owned();
        let mut driver_parts = driver.split('.');
        let cuda = description["driver"]["cuda_version"].as_u64().unwrap();
        let expected = [
            ("nvidia.com/gpu.present", "true".to_owned()),
            ("nvidia.com/gpu.product", gpu0["name"].as_str().unwrap().replace(' ', "-")),
            ("nvidia.com/gpu.count", "8".to_owned()),
            ("nvidia.com/gpu.memory", gpu0["memory_mib"].to_string()),
            ("nvidia.com/gpu.compute.major", gpu0["compute_capability"][0].to_string()),
            ("nvidia.com/gpu.compute.minor", gpu0["compute_capability"][1].to_string()),
            ("nvidia.com/gpu.family", gpu0["architecture"].as_str().unwrap().to_owned()),
            ("nvidia.com/cuda.driver.major", driver_parts.next().unwrap().to_owned()),
            ("nvidia.com/cuda.driver.minor", driver_parts.next().unwrap().to_owned()),
            ("nvidia.com/cuda.driver.rev", driver_parts.next().unwrap().to_owned()),
            ("nvidia.com/cuda.runtime.major", (cuda / 1000).to_string()),
            ("nvidia.com/cuda.runtime.minor", (cuda % 1000 / 10).to_string()),
            ("nvidia.com/mig.strategy", "none".to_owned()),
            ("nvidia.com/gpu.replicas", "1".to_owned()),
            ("nvidia.com/gpu.sharing-strategy", "none".to_owned()),
        ];
        let t = Instant::now();
        let labels = wait_labels(&mut cluster, &expected);
        println!(
            "GPU labels on the Node object {:.1?} after allocatable: {} nvidia.com labels",
            t.elapsed(),
            labels.len()
        );
        let node = cluster.get_json(&["node", NODE]).unwrap();
        let managed = node["metadata"]["annotations"][MANAGED_LABELS].as_str().unwrap_or_default().to_owned();
        for (key, _) in &expected[1..] {
            assert!(managed.split(',').any(|k| k == *key), "{key} is recorded as nvinject's: {managed}");
        }
        assert!(!managed.contains("gpu.present"), "gpu.present came with the node and stays: {managed}");
        let plugin_sa = format!("system:serviceaccount:{NAMESPACE}:nvinject-device-plugin");
        let installer_sa = format!("system:serviceaccount:{NAMESPACE}:nvinject-installer");
        for (who, verb, resource, allowed) in [
            (&plugin_sa, "patch", "nodes", "yes"),
            (&plugin_sa, "get", "nodes", "yes"),
            (&plugin_sa, "delete", "nodes", "no"),
            (&plugin_sa, "update", "nodes/status", "no"),
            (&plugin_sa, "get", "pods", "no"),
            (&plugin_sa, "get", "secrets", "no"),
            (&installer_sa, "patch", "nodes", "no"),
        ] {
            let out = process_output(cluster.kubectl().args(["auth", "can-i", verb, resource, "--as", who]));
            assert_eq!(out.trim(), allowed, "{who} {verb} {resource}");
        }

        // gpu-smoke: exactly the GPU the plugin allocated, through our shim.
        let one = run_smoke(&mut cluster, "gpu-smoke", Some(1));
        assert_eq!(one.phase, "Succeeded", "gpu-smoke: {}", one.log);
        assert_eq!(one.gpus.len(), 1, "the kubelet allocated one GPU: {:?}", one.gpus);
        let listed = gpu_lines(&one.log);
        assert_eq!(listed.len(), 1, "nvidia-smi -L lists exactly one GPU: {}", one.log);
        assert!(listed[0].contains(&one.gpus[0]), "it is the allocated {}: {}", one.gpus[0], listed[0]);
        assert_eq!(one.runtime, NVINJECT_RUNTIME, "gpu-smoke ran through containerd-shim-nvinject-v2");
        steps.push(("gpu-smoke: apply -> Succeeded", one.took));

        // The same pod without the limit: no GPU, though it runs through our runtime too.
        let none = run_smoke(&mut cluster, "gpu-smoke-no-limit", None);
        assert!(none.gpus.is_empty(), "nothing allocated: {:?}", none.gpus);
        assert!(gpu_lines(&none.log).is_empty(), "no GPU listed without the limit: {}", none.log);
        assert_eq!(none.phase, "Failed", "nvidia-smi finds no driver without the limit: {}", none.log);
        assert_eq!(none.runtime, NVINJECT_RUNTIME, "the pod without the limit ran through our runtime too");
        steps.push(("gpu-smoke without limit: apply -> Failed", none.took));

        // The article's ResourceQuota: 8 GPUs in namespace `research`; a pod holding all 8 runs, the
        // 9th GPU is refused by the API server.
        let t = Instant::now();
        cluster.kubectl_out(&["create", "namespace", "research"]).unwrap();
        cluster
            .apply(&json!({
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": { "name": "gpu-quota", "namespace": "research" },
                "spec": { "hard": { "requests.nvidia.com/gpu": "8", "limits.nvidia.com/gpu": "8" } },
            }))
            .unwrap();
        let eight = sleeper("research", "eight-gpus", 8);
        kubelet::wait_for(
            "pod research/eight-gpus to be accepted",
            Duration::from_secs(60),
            Duration::from_millis(500),
            || Ok(cluster.apply(&eight).ok()),
        )
        .unwrap_or_else(|e| panic!("{e}: {:?}", cluster.apply(&eight).err()));
        let running = wait("pod research/eight-gpus to run", Duration::from_secs(120), &mut cluster, |c| {
            let p = c.get_json(&["pod", "-n", "research", "eight-gpus"]).ok()?;
            (p["status"]["phase"] == "Running").then_some(p)
        });
        let uid = running["metadata"]["uid"].as_str().unwrap();
        let held = cluster.node().allocated(uid, GPU).unwrap();
        assert_eq!(held.len(), 8, "the pod holds all eight GPUs: {held:?}");
        // The quota controller recounts usage from its own cache: a recount that ran before that cache
        // held the pod writes `used: 0` over what admission counted, until the pod's event corrects it.
        // Only a settled count makes the 9th GPU's refusal a fact about the quota, not about timing.
        wait("quota research/gpu-quota to count the 8 GPUs", Duration::from_secs(60), &mut cluster, |c| {
            let q = c.get_json(&["resourcequota", "-n", "research", "gpu-quota"]).ok()?;
            (q["status"]["used"]["requests.nvidia.com/gpu"] == "8").then_some(())
        });
        let ninth =
            cluster.apply(&sleeper("research", "ninth-gpu", 1)).expect_err("the 9th GPU must be refused");
        let message = ninth.to_string();
        assert!(
            message.contains("exceeded quota: gpu-quota") && message.contains("nvidia.com/gpu"),
            "the quota refuses the 9th GPU: {message}"
        );
        let quota = cluster.get_json(&["resourcequota", "-n", "research", "gpu-quota"]).unwrap();
        assert_eq!(quota["status"]["used"]["requests.nvidia.com/gpu"], "8", "{}", quota["status"]);
        steps.push(("ResourceQuota: 8 held, 9th refused", t.elapsed()));
        let refusal = message.find("exceeded quota").map_or(message.as_str(), |i| &message[i..]);
        println!(
            "ResourceQuota gpu-quota: 8 GPUs held by research/eight-gpus, the 9th refused: {}",
            refusal.trim()
        );
        cluster.kubectl_out(&["delete", "pod", "-n", "research", "eight-gpus", "--wait=true"]).unwrap();

        // The article's taint: our DaemonSets tolerate it (a deleted plugin pod comes back, Ready, and
        // the GPUs with it); a GPU pod without the toleration stays Pending with the scheduler's
        // reason; the RuntimeClass `nvidia` carries the toleration, so a pod selecting it runs.
        let t = Instant::now();
        cluster.kubectl_out(&["taint", "nodes", NODE, "nvidia.com/gpu=present:NoSchedule"]).unwrap();
        let plugin_selector = "app.kubernetes.io/name=nvinject-device-plugin";
        let old = cluster.get_json(&["pods", "-n", NAMESPACE, "-l", plugin_selector]).unwrap();
        let old_uid = old["items"][0]["metadata"]["uid"].as_str().unwrap().to_owned();
        cluster
            .kubectl_out(&["delete", "pods", "-n", NAMESPACE, "-l", plugin_selector, "--wait=true"])
            .unwrap();
        wait(
            "the device plugin pod to be back and Ready on the tainted node",
            Duration::from_secs(120),
            &mut cluster,
            |c| {
                let pods = c.get_json(&["pods", "-n", NAMESPACE, "-l", plugin_selector]).ok()?;
                let p = pods["items"].as_array()?.first()?.clone();
                let ready = p["metadata"]["uid"] != old_uid.as_str()
                    && condition(&p, "Ready").is_some_and(|r| r["status"] == "True");
                ready.then_some(())
            },
        );
        wait("allocatable nvidia.com/gpu to be 8 again", Duration::from_secs(120), &mut cluster, |c| {
            let node = c.get_json(&["node", NODE]).ok()?;
            (node["status"]["allocatable"][GPU] == "8").then_some(())
        });
        let mut untolerated = smoke_pod("no-toleration", Some(1));
        untolerated["spec"].as_object_mut().unwrap().remove("runtimeClassName");
        cluster.apply(&untolerated).unwrap();
        let pending = wait(
            "the scheduler's verdict on pod no-toleration",
            Duration::from_secs(60),
            &mut cluster,
            |c| {
                let p = c.get_json(&["pod", "no-toleration"]).ok()?;
                let scheduled = condition(&p, "PodScheduled")?.clone();
                (scheduled["status"] == "False").then_some((p, scheduled))
            },
        );
        let (pod, scheduled) = pending;
        assert_eq!(pod["status"]["phase"], "Pending", "{}", pod["status"]);
        assert_eq!(scheduled["reason"], "Unschedulable", "{scheduled}");
        let why = scheduled["message"].as_str().unwrap_or_default().to_owned();
        assert!(why.contains("taint {nvidia.com/gpu: present}"), "the scheduler names the taint: {why}");
        let tolerated = run_smoke(&mut cluster, "gpu-smoke-tainted", Some(1));
        assert_eq!(
            tolerated.phase, "Succeeded",
            "RuntimeClass nvidia carries the toleration: {}",
            tolerated.log
        );
        assert_eq!(gpu_lines(&tolerated.log).len(), 1, "{}", tolerated.log);
        steps.push(("taint: plugin back, Pending verdict, smoke pod", t.elapsed()));
        println!(
            "tainted node: plugin pod recreated and Ready, pod without toleration Pending ({why}), RuntimeClass pod Succeeded"
        );

        // The article's time-slicing ConfigMap (replicas 4), applied to the plugin's config: the plugin
        // sees the kubelet refresh its file and starts over; allocatable becomes 32 on the same node
        // object, and a pod gets a replica of one GPU.
        let t = Instant::now();
        let node_uid = cluster.get_json(&["node", NODE]).unwrap()["metadata"]["uid"].clone();
        let mut config = cluster.get_json(&["configmap", "-n", NAMESPACE, "nvinject-device-plugin"]).unwrap();
        let text = config["data"]["config.yaml"].as_str().unwrap().to_owned();
        config["data"]["config.yaml"] = json!(format!("{text}{TIME_SLICING}"));
        cluster.apply(&config).unwrap();
        wait("allocatable nvidia.com/gpu to be 32", Duration::from_secs(180), &mut cluster, |c| {
            let node = c.get_json(&["node", NODE]).ok()?;
            (node["status"]["allocatable"][GPU] == "32").then_some(())
        });
        let sliced = t.elapsed();
        steps.push(("time-slicing ConfigMap -> allocatable 32", sliced));
        let node = cluster.get_json(&["node", NODE]).unwrap();
        assert_eq!(node["metadata"]["uid"], node_uid, "the same node object");
        assert_eq!(node["metadata"]["labels"][GPU_NODE_LABEL.0], GPU_NODE_LABEL.1);
        let plugin = cluster.get_json(&["pods", "-n", NAMESPACE, "-l", plugin_selector]).unwrap();
        let plugin_status = &plugin["items"][0]["status"]["containerStatuses"][0];
        assert_eq!(plugin_status["restartCount"], 0, "the plugin started over in its pod: {plugin_status}");
        let plugin_log =
            cluster.kubectl_out(&["logs", "-n", NAMESPACE, "daemonset/nvinject-device-plugin"]).unwrap();
        assert!(plugin_log.contains("config file changed: restarting with it"), "{plugin_log}");
        println!(
            "time-slicing: allocatable {GPU} 8 -> 32 in {sliced:.1?}, same node, plugin restarted in place"
        );
        let shared = run_smoke(&mut cluster, "gpu-smoke-shared", Some(1));
        let product = format!("{}-SHARED", expected[1].1);
        wait_labels(
            &mut cluster,
            &[
                ("nvidia.com/gpu.replicas", "4".to_owned()),
                ("nvidia.com/gpu.product", product),
                ("nvidia.com/gpu.sharing-strategy", "time-slicing".to_owned()),
            ],
        );
        assert_eq!(shared.phase, "Succeeded", "{}", shared.log);
        assert_eq!(shared.gpus.len(), 1, "{:?}", shared.gpus);
        let (gpu, replica) = shared.gpus[0].split_once("::").expect("a replica id, GPU::n");
        assert!(replica.parse::<u32>().is_ok_and(|r| r < 4), "replica {replica} of 4");
        let listed = gpu_lines(&shared.log);
        assert!(listed.len() == 1 && listed[0].contains(gpu), "the replica's GPU {gpu}: {}", shared.log);

        // The driver goes away (its NVML library gone from the driver root): the plugin, restarted,
        // cannot start and removes every label it set from the Node object; `gpu.present`, which
        // came with the node, stays, and so do the DaemonSets.
        let t = Instant::now();
        let nvml = sim.driver_root.join("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
        let hidden = sim.driver_root.join("usr/lib/x86_64-linux-gnu/.libnvidia-ml.so.1.gone");
        fs::rename(&nvml, &hidden).unwrap();
        cluster
            .kubectl_out(&["delete", "pods", "-n", NAMESPACE, "-l", plugin_selector, "--wait=true"])
            .unwrap();
        let left =
            wait("nvinject's labels to leave the Node object", Duration::from_secs(120), &mut cluster, |c| {
                let node = c.get_json(&["node", NODE]).ok()?;
                let labels = node["metadata"]["labels"].as_object()?.clone();
                let ours = labels
                    .keys()
                    .filter(|k| k.starts_with("nvidia.com/") && *k != "nvidia.com/gpu.present")
                    .count();
                (ours == 0).then_some(labels)
            });
        assert_eq!(left["nvidia.com/gpu.present"], "true", "{left:?}");
        let node = cluster.get_json(&["node", NODE]).unwrap();
        assert!(node["metadata"]["annotations"].get(MANAGED_LABELS).is_none(), "{}", node["metadata"]);
        steps.push(("driver gone -> labels removed", t.elapsed()));
        fs::rename(&hidden, &nvml).unwrap();
        println!(
            "driver gone: nvinject's labels removed from the Node in {:.1?}, gpu.present kept",
            t.elapsed()
        );

        // Deleting the installer DaemonSet restores the node: its pod uninstalls on SIGTERM, restarts
        // containerd once more, and goes; the config is byte-identical and nothing of nvinject is left.
        let t = Instant::now();
        cluster.kubectl_out(&["delete", "daemonset", "-n", NAMESPACE, "nvinject-installer"]).unwrap();
        let installer_selector = "app.kubernetes.io/name=nvinject-installer";
        wait("the installer pod to be gone", Duration::from_secs(180), &mut cluster, |c| {
            let pods = c.get_json(&["pods", "-n", NAMESPACE, "-l", installer_selector]).ok()?;
            pods["items"].as_array()?.is_empty().then_some(())
        });
        wait("containerd to answer after the uninstall", Duration::from_secs(60), &mut cluster, |c| {
            c.node_mut().containerd_ready().then_some(())
        });
        steps.push(("delete installer DaemonSet -> node restored", t.elapsed()));
        let exits = cluster.node().containerd_exits();
        assert_eq!(exits.len(), 2, "the uninstall restarted containerd once: {exits:?}");
        assert!(exits[1].status.contains("SIGHUP"), "{exits:?}");
        assert_eq!(
            fs::read(CONTAINERD_CONFIG).unwrap(),
            original_config,
            "containerd's config, byte for byte"
        );
        let tree = host_root_tree(&host_root, &sim_dir);
        let added: Vec<&String> = tree.iter().filter(|p| !original_tree.contains(p)).collect();
        let removed: Vec<&String> = original_tree.iter().filter(|p| !tree.contains(p)).collect();
        assert!(
            added.is_empty() && removed.is_empty(),
            "the host root is as before nvinject: left behind {added:?}, missing {removed:?}"
        );
        let node = cluster.get_json(&["node", NODE]).unwrap();
        assert_eq!(condition(&node, "Ready").unwrap()["status"], "True");
        let still = cluster.get_json(&["pod", "running-before"]).unwrap();
        assert_eq!(still["status"]["containerStatuses"][0]["restartCount"], 0, "{}", still["status"]);
        println!("installer DaemonSet deleted: node restored in {:.1?}", t.elapsed());

        // Teardown: every daemon by PID, the kubelet's cgroups emptied and removed, the host root's
        // binds unmounted, links removed.
        let t = Instant::now();
        let stopped = cluster.stop().unwrap_or_else(|e| panic!("{e}"));
        let report = stopped.finish().unwrap_or_else(|e| panic!("{e}"));
        assert!(
            report.node.killed_in_cgroups.is_empty(),
            "processes outlived containerd in the kubelet's cgroups (killed): {:?}",
            report.node.killed_in_cgroups
        );
        assert!(report.node.cgroups_removed > 0, "the kubelet's cgroups were made and removed: {report:?}");
        assert_eq!(
            report.control_plane.len(),
            4,
            "etcd, API server, controller-manager, scheduler: {report:?}"
        );
        println!("teardown in {:.1?}: {report:?}", t.elapsed());
        println!("wall time per step:");
        for (step, d) in &steps {
            println!("  {step:<48} {:>7.1} s", d.as_secs_f64());
        }
        println!("whole run inside the namespaces: {:.1?}", test_started.elapsed());
    });
}

/// The article's MIG trap, on a second node variant: the a100-mig simulated node (GPUs 0 and 1 carved
/// into MIG slices, 2 and 3 whole) with `migStrategy: mixed` set in the plugin's ConfigMap by a
/// kustomize patch, as an operator would. The node advertises the MIG names beside the two whole
/// GPUs; a pod asking for `nvidia.com/gpu: 1` gets a whole GPU, never a MIG slice, and a pod asking for
/// `nvidia.com/mig-1g.10gb: 1` gets exactly one slice.
#[test]
#[ignore = "needs root"]
fn mig_mixed_node_advertises_mig_names_and_a_gpu_request_gets_no_slice() {
    nvinject_test_support::require_root("namespaces, containerd and a control plane");
    const NAME: &str = "mig_mixed_node_advertises_mig_names_and_a_gpu_request_gets_no_slice";
    let Setup { artifacts, bins, image_name, deploy, _one } = setup();
    isolated(NAME, RUN_LIMIT, |inside| {
        let started = Instant::now();
        let Staged { sim, prepared, overlay, .. } =
            stage(inside, &artifacts, &bins, &image_name, &deploy, "a100-mig");
        let description: Value =
            serde_json::from_str(&fs::read_to_string(sim.dir.join("node.json")).unwrap()).unwrap();
        let uuid = |i: usize| description["gpus"][i]["uuid"].as_str().unwrap().to_owned();
        // The operator's own patch: deploy/'s plugin config with the MIG strategy changed.
        cluster::patch_plugin_config(&overlay, &deploy, |c| {
            c.replace("migStrategy: none", "migStrategy: mixed")
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let mut cluster = prepared.start().unwrap_or_else(|e| panic!("{e}"));
        println!("bring-up: control plane and a100-mig node Ready in {:.1?}", started.elapsed());
        let t = Instant::now();
        cluster.kubectl_out(&["apply", "-k", &overlay.to_string_lossy()]).unwrap();
        let want = [
            (GPU, "2"),
            ("nvidia.com/mig-1g.10gb", "9"),
            ("nvidia.com/mig-2g.20gb", "1"),
            ("nvidia.com/mig-3g.40gb", "1"),
        ];
        let allocatable = wait("the MIG names in allocatable", Duration::from_secs(240), &mut cluster, |c| {
            let node = c.get_json(&["node", NODE]).ok()?;
            let a = node["status"]["allocatable"].clone();
            want.iter().all(|(name, n)| a[*name] == *n).then_some(a)
        });
        println!("a100-mig, migStrategy mixed: allocatable {allocatable} {:.1?} after apply", t.elapsed());
        let mig_names: Vec<&String> =
            allocatable.as_object().unwrap().keys().filter(|k| k.starts_with("nvidia.com/")).collect();
        assert_eq!(mig_names.len(), want.len(), "exactly the names a mixed node advertises: {allocatable}");

        // The trap: `nvidia.com/gpu: 1` is one of the whole GPUs (2 or 3), not a slice.
        let whole = run_smoke(&mut cluster, "gpu-on-mig-node", Some(1));
        assert_eq!(whole.phase, "Succeeded", "{}", whole.log);
        assert_eq!(whole.gpus.len(), 1, "{:?}", whole.gpus);
        assert!([uuid(2), uuid(3)].contains(&whole.gpus[0]), "a whole GPU: {:?}", whole.gpus);
        let listed = gpu_lines(&whole.log);
        assert!(listed.len() == 1 && listed[0].contains(&whole.gpus[0]), "{}", whole.log);
        assert!(!whole.log.contains("MIG"), "no MIG device visible: {}", whole.log);

        // The MIG name gets one slice of a carved GPU.
        let slice = run_smoke_of(&mut cluster, "mig-slice", "nvidia.com/mig-1g.10gb", Some(1));
        assert_eq!(slice.phase, "Succeeded", "{}", slice.log);
        assert_eq!(slice.gpus.len(), 1, "{:?}", slice.gpus);
        assert!(slice.gpus[0].starts_with("MIG-"), "a MIG device: {:?}", slice.gpus);
        let migs: Vec<&str> = slice.log.lines().filter(|l| l.trim_start().starts_with("MIG ")).collect();
        assert_eq!(migs.len(), 1, "nvidia-smi -L lists one MIG device: {}", slice.log);
        assert!(migs[0].contains(&slice.gpus[0]) && migs[0].contains("1g.10gb"), "{}", slice.log);
        assert_eq!(slice.runtime, NVINJECT_RUNTIME);

        let stopped = cluster.stop().unwrap_or_else(|e| panic!("{e}"));
        let report = stopped.finish().unwrap_or_else(|e| panic!("{e}"));
        assert!(report.node.killed_in_cgroups.is_empty(), "{report:?}");
        println!("whole run inside the namespaces: {:.1?}", started.elapsed());
    });
}

/// A node the fleet test joins: its name, the simulated preset (none: no GPU) and what the API must
/// show once it converged.
struct FleetNode {
    name: &'static str,
    preset: Option<&'static str>,
    /// `(resource, count)` in allocatable.
    allocatable: &'static [(&'static str, &'static str)],
}

const FLEET: &[FleetNode] = &[
    FleetNode { name: "gpu-h100", preset: Some("h100x8"), allocatable: &[(GPU, "8")] },
    FleetNode {
        name: "gpu-a100",
        preset: Some("a100-mig"),
        allocatable: &[
            (GPU, "2"),
            ("nvidia.com/mig-1g.10gb", "9"),
            ("nvidia.com/mig-2g.20gb", "1"),
            ("nvidia.com/mig-3g.40gb", "1"),
        ],
    },
    FleetNode { name: "gpu-l4", preset: Some("single"), allocatable: &[(GPU, "1")] },
    FleetNode { name: "cpu-only", preset: None, allocatable: &[] },
];

/// Per node: seconds from its agent's start (its kubelet about to start) to each milestone.
#[derive(Debug, Default, Clone)]
struct Convergence {
    kubelet_healthy: f64,
    ready: f64,
    allocatable: Option<f64>,
    labels: Option<f64>,
}

/// Waits, on the fleet, until `probe` answers (or panics with the nvinject pods and the node's log).
fn fleet_wait<T>(
    what: &str,
    timeout: Duration,
    fleet: &mut Fleet,
    node: &str,
    mut probe: impl FnMut(&mut Fleet) -> Option<T>,
) -> T {
    kubelet::wait_for(what, timeout, Duration::from_millis(250), || {
        fleet.control().check_running()?;
        Ok(probe(fleet))
    })
    .unwrap_or_else(|e: KubeletError| {
        panic!(
            "{e}\npods:\n{}\nagent log of {node}:\n{}",
            fleet.control().kubectl_out(&["get", "pods", "-A", "-o", "wide"]).unwrap_or_default(),
            fleet.agent_log(node, 30)
        )
    })
}

/// Joins `spec` and waits until it converged: Ready, and for a GPU node its allocatable and its
/// product label; returns the times from the join's start.
fn join_and_converge(fleet: &mut Fleet, spec: &JoinSpec, want: &[(&str, &str)]) -> Convergence {
    let joined = fleet.join(spec).unwrap_or_else(|e| panic!("{e}"));
    let name = spec.name.clone();
    let since = |t: Instant| t.duration_since(joined.began).as_secs_f64();
    let mut c = Convergence { kubelet_healthy: joined.kubelet_healthy.as_secs_f64(), ..Default::default() };
    fleet
        .wait_ready(&name, Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e}\n{}", fleet.agent_log(&name, 30)));
    c.ready = joined.began.elapsed().as_secs_f64();
    if want.is_empty() {
        return c;
    }
    let (mut allocatable, mut labelled) = (None, None);
    fleet_wait(&format!("node {name} to converge"), Duration::from_secs(240), fleet, &name, |f| {
        let node = f.get_json(&["node", &name]).ok()?;
        let a = &node["status"]["allocatable"];
        if allocatable.is_none() && want.iter().all(|(r, n)| a[*r] == *n) {
            allocatable = Some(Instant::now());
        }
        if labelled.is_none() && node["metadata"]["labels"].get("nvidia.com/gpu.product").is_some() {
            labelled = Some(Instant::now());
        }
        (allocatable.is_some() && labelled.is_some()).then_some(())
    });
    c.allocatable = allocatable.map(since);
    c.labels = labelled.map(since);
    c
}

/// Runs a gpu-smoke pod on the fleet (`extra` merged into its spec) and returns its node and log.
fn fleet_smoke(fleet: &mut Fleet, name: &str, resource: &str, count: u32, extra: Value) -> (String, String) {
    let mut pod = smoke_pod_of(name, resource, Some(count));
    for (k, v) in extra.as_object().unwrap() {
        pod["spec"][k] = v.clone();
    }
    fleet.control().apply(&pod).unwrap_or_else(|e| panic!("{e}"));
    let done = fleet_wait(&format!("pod {name} to complete"), Duration::from_secs(120), fleet, "", |f| {
        let p = f.get_json(&["pod", name]).ok()?;
        matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")).then_some(p)
    });
    let log = fleet.control().kubectl_out(&["logs", name]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(done["status"]["phase"], "Succeeded", "pod {name}: {log}");
    (done["spec"]["nodeName"].as_str().unwrap_or_default().to_owned(), log)
}

/// Issue 15: one control plane and four nodes, each its own kubelet and containerd in namespaces of
/// its own (an agent process per node): h100x8, a100-mig (`migStrategy: mixed`), a single L4, and
/// one without GPUs. deploy/ is applied first; the nodes join one after another, the GPU nodes with
/// the label their node pool gives them (`nvidia.com/gpu.present=true`), and converge with no
/// step: installer done, plugin registered, allocatable and the GPU labels on each Node object.
/// Then placement by label and by resource, an XID taking a GPU out of the API's allocatable and
/// the scheduler going elsewhere, and a node removed and joined again.
#[test]
#[ignore = "needs root"]
fn gpu_nodes_join_one_after_another_and_converge_with_zero_steps() {
    nvinject_test_support::require_root("namespaces, containerd and a control plane");
    const NAME: &str = "gpu_nodes_join_one_after_another_and_converge_with_zero_steps";
    let Setup { artifacts, bins, image_name, deploy, _one } = setup();
    isolated(NAME, RUN_LIMIT, |inside| {
        let started = Instant::now();
        let work = inside.work();
        // Each agent builds its node's simulated GPUs where the DaemonSets look for them; this
        // one only lends the gpu-smoke image its nvidia-smi.
        let smoke_sim = work.join("smoke-sim");
        run(Command::new(&bins.simnode).args(["build", "--preset", "single", "--out"]).arg(&smoke_sim));
        let (release, smoke) = images(&bins, &image_name, work, &smoke_sim.join("driver/usr/bin/nvidia-smi"));

        let mut fleet = Fleet::start(inside, &artifacts).unwrap_or_else(|e| panic!("{e}"));
        let sim = SimRoots::of(fleet.shared_sim_dir());
        let overlay = work.join("overlay");
        fs::create_dir_all(&overlay).unwrap();
        for (file, text) in test_overlay(&overlay, &deploy, fleet.shared_host_root(), &sim, API_ADDRESS) {
            fs::write(overlay.join(file), text).unwrap();
        }
        cluster::patch_plugin_config(&overlay, &deploy, |c| {
            c.replace("migStrategy: none", "migStrategy: mixed")
        })
        .unwrap_or_else(|e| panic!("{e}"));
        // deploy/ first: the nodes that join find their DaemonSets waiting.
        let applied = fleet.control().kubectl_out(&["apply", "-k", &overlay.to_string_lossy()]);
        applied.unwrap_or_else(|e| panic!("{e}"));
        println!("control plane up and deploy/ applied in {:.1?}", started.elapsed());

        let join = |n: &FleetNode| JoinSpec {
            name: n.name.into(),
            labels: if n.preset.is_some() {
                vec![(GPU_NODE_LABEL.0.into(), GPU_NODE_LABEL.1.into())]
            } else {
                Vec::new()
            },
            images: vec![release.image.clone(), smoke.clone()],
            preset: n.preset.map(str::to_owned),
            simnode: bins.simnode.clone(),
            containerd_restart_after: CONTAINERD_RESTART_DELAY,
        };
        let mut times = Vec::new();
        for n in FLEET {
            let c = join_and_converge(&mut fleet, &join(n), n.allocatable);
            println!("node {} joined: {c:?}", n.name);
            times.push((n.name, c));
        }

        // Every GPU node: the installer done (its pod ready), the plugin registered (allocatable),
        // the labels of its own GPUs; the node without GPUs: no nvinject pod, no nvidia.com label.
        let pods = fleet.get_json(&["pods", "-n", NAMESPACE]).unwrap();
        let on = |node: &str| -> Vec<String> {
            pods["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p["spec"]["nodeName"] == node)
                .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
                .collect()
        };
        for n in FLEET {
            let node = fleet.get_json(&["node", n.name]).unwrap();
            let labels = node["metadata"]["labels"].as_object().unwrap();
            let ours: Vec<&String> = labels.keys().filter(|k| k.starts_with("nvidia.com/")).collect();
            if n.preset.is_none() {
                assert!(on(n.name).is_empty(), "no nvinject pod on {}: {:?}", n.name, on(n.name));
                assert!(ours.is_empty(), "no GPU label on {}: {ours:?}", n.name);
                continue;
            }
            assert_eq!(on(n.name).len(), 2, "installer and plugin on {}: {:?}", n.name, on(n.name));
            let sim = fleet.sim_dir(n.name).unwrap();
            let description: Value =
                serde_json::from_str(&fs::read_to_string(sim.join("node.json")).unwrap()).unwrap();
            let product = description["gpus"][0]["name"].as_str().unwrap().replace(' ', "-");
            assert_eq!(labels["nvidia.com/gpu.product"], product.as_str(), "{}", n.name);
            assert_eq!(labels["nvidia.com/mig.strategy"], "mixed", "{}", n.name);
            for (resource, count) in n.allocatable {
                let key = format!("{}.count", resource.trim_start_matches("nvidia.com/"));
                assert_eq!(labels[&format!("nvidia.com/{key}")], *count, "{} {key}", n.name);
            }
        }
        let a100_product =
            fleet.get_json(&["node", "gpu-a100"]).unwrap()["metadata"]["labels"]["nvidia.com/gpu.product"]
                .as_str()
                .unwrap()
                .to_owned();

        // Placement: by the product label, by a MIG name, by a count only one node has.
        let by_label = json!({ "nodeSelector": { "nvidia.com/gpu.product": a100_product } });
        let (node, log) = fleet_smoke(&mut fleet, "wants-an-a100", GPU, 1, by_label);
        assert_eq!(node, "gpu-a100");
        assert!(gpu_lines(&log).len() == 1 && log.contains("A100"), "it sees an A100: {log}");
        let (node, log) = fleet_smoke(&mut fleet, "wants-a-slice", "nvidia.com/mig-1g.10gb", 1, json!({}));
        assert_eq!(node, "gpu-a100");
        assert!(log.contains("MIG 1g.10gb"), "{log}");
        let (node, log) = fleet_smoke(&mut fleet, "wants-eight", GPU, 8, json!({}));
        assert_eq!(node, "gpu-h100");
        assert_eq!(gpu_lines(&log).len(), 8, "{log}");

        // An XID on the L4 node's only GPU: its allocatable drops by one in the API, and a pod that
        // prefers that node goes elsewhere.
        let l4 = FLEET.iter().position(|n| n.name == "gpu-l4").unwrap();
        let t = Instant::now();
        fleet.xid("gpu-l4", 0, 79).unwrap_or_else(|e| panic!("{e}"));
        fleet_wait(
            "gpu-l4's allocatable to drop to 0",
            Duration::from_secs(120),
            &mut fleet,
            "gpu-l4",
            |f| {
                let node = f.get_json(&["node", "gpu-l4"]).ok()?;
                (node["status"]["allocatable"][GPU] == "0").then_some(())
            },
        );
        println!("XID 79 on gpu-l4: allocatable 1 -> 0 in the API in {:.1?}", t.elapsed());
        let prefer_l4 = json!({ "affinity": { "nodeAffinity": { "preferredDuringSchedulingIgnoredDuringExecution": [
            { "weight": 100, "preference": { "matchExpressions": [
                { "key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-l4"] } ] } } ] } } });
        let (node, _) = fleet_smoke(&mut fleet, "prefers-the-l4", GPU, 1, prefer_l4);
        assert_ne!(node, "gpu-l4", "the unhealthy GPU is not offered");

        // The L4 node leaves (kubelet stopped, Node deleted) and joins again with a healthy GPU.
        let t = Instant::now();
        let report = fleet.leave("gpu-l4").unwrap_or_else(|e| panic!("{e}"));
        fleet.control().kubectl_out(&["delete", "node", "gpu-l4"]).unwrap();
        assert_eq!(report["killed_in_cgroups"], json!([]), "{report}");
        let again = join_and_converge(&mut fleet, &join(&FLEET[l4]), FLEET[l4].allocatable);
        println!("gpu-l4 removed and joined again in {:.1?}: {again:?}", t.elapsed());
        times.push(("gpu-l4 (again)", again));

        println!("join -> milestone, seconds:");
        println!("  {:<16} {:>8} {:>8} {:>12} {:>8}", "node", "kubelet", "Ready", "allocatable", "labels");
        for (name, c) in &times {
            let opt = |v: Option<f64>| v.map_or("-".to_owned(), |s| format!("{s:.1}"));
            println!(
                "  {name:<16} {:>8.1} {:>8.1} {:>12} {:>8}",
                c.kubelet_healthy,
                c.ready,
                opt(c.allocatable),
                opt(c.labels)
            );
        }
        println!("human steps per node after its kubelet starts: 0");
        let reports = fleet.stop().unwrap_or_else(|e| panic!("{e}"));
        for r in &reports {
            assert_eq!(r["killed_in_cgroups"], json!([]), "{r}");
        }
        println!("whole run inside the namespaces: {:.1?}", started.elapsed());
    });
}
