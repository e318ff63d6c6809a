//! The per-cluster tier of nvinject's integration tests: a Kubernetes control plane and the nodes
//! joined to it, for the tests that roll out `deploy/` as an operator would. A one-node cluster
//! (this module: [`Cluster`]), many nodes each run by its own agent process ([`fleet`], [`agent`],
//! the `nvinject-cluster-node` binary), the control plane's daemons ([`control_plane`]), its
//! certificates ([`pki`]), the nodes' network ([`net`]) and the cached Kubernetes builds it runs
//! ([`artifacts`]).
//!
//! Boundary: everything per node (containerd, the kubelet node, the simulated GPU node, namespaces,
//! process and mount bookkeeping) is `nvinject-node-harness`'s, which this crate builds on; it adds
//! only what exists once per cluster and the wiring of nodes into it. nvinject's image is built by
//! `nvinject-image-tool`, as `./x image` builds it.
//!
//! The one-node cluster: the control plane ([`control_plane`]: etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler) and the test node of [`nvinject_node_harness::kubelet`]
//! (containerd and the kubelet, now joined to the API server), inside an isolated test's mount and
//! network namespaces ([`nvinject_node_harness::namespace::isolated`]). The kubelet and control
//! plane are v1.20.2, built once from Debian 12's source package by
//! `integration/kubelet/build-kubelet.sh`; etcd, kubectl and the CNI plugins are Debian 12's
//! packages unpacked into the cache by `integration/kubelet/fetch-cluster-debs.sh`.
//!
//! What it must never do: touch the host's `/etc`, `/var/lib/kubelet`, network or sysctls. The node's
//! address is a veth pair made inside the test's network namespace ([`net`]); pods get addresses
//! from a bridge there. nvinject's installer DaemonSet mounts "the host's `/`", which inside the test is
//! still the real host's tree, so the cluster gives it a host root of its own ([`NodeHostRoot`]): a
//! directory holding bind mounts of exactly the node directories the test made, at their host paths.
//! Every daemon is stopped by its PID, in [`Cluster::stop`] and [`StoppedCluster::finish`] or on drop.

pub mod agent;
pub mod artifacts;
pub mod control_plane;
pub mod fleet;
pub mod net;
pub mod pki;

use std::fs;
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nvinject_image_tool::image::BuiltImage;
use nvinject_node_harness::kubelet::node::NodeDirs;
use nvinject_node_harness::kubelet::{
    ApiServerLink, KubeNode, KubeletError, NodeOptions, PreparedNode, ShutdownReport, wait_for,
};
use nvinject_node_harness::mounts;
use nvinject_node_harness::namespace::Inside;
use nvinject_node_harness::process;
use serde_json::{Value, json};

pub use artifacts::{ClusterArtifacts, cluster_artifacts, fetch_debs_script};
use control_plane::ControlPlane;
use net::NodeNetwork;

/// The label nvinject's DaemonSets and RuntimeClass select GPU nodes by.
pub const GPU_NODE_LABEL: (&str, &str) = ("nvidia.com/gpu.present", "true");
/// The node's address, on the veth pair inside the test's network namespace.
pub const NODE_IP: &str = "10.77.0.1";
/// The pod network (the bridge's subnet; its first address is the bridge's).
pub const POD_SUBNET: &str = "10.88.0.0/24";
/// The CNI bridge's name.
pub const CNI_BRIDGE: &str = "nvinject-cni0";
/// How long after an exit the node's containerd is started again: containerd's own systemd unit
/// (`Restart=always`, `RestartSec=5`), which the installer DaemonSet's signal restart relies on.
pub const CONTAINERD_RESTART_DELAY: Duration = Duration::from_secs(5);

/// The CNI configuration: a bridge inside the test's network namespace with host-local addresses kept
/// in `ipam_dir` (not the host's `/var/lib/cni`), no masquerading (nothing leaves the namespace).
pub fn cni_config(ipam_dir: &Path, subnet: &str) -> Value {
    json!({
        "cniVersion": "0.4.0",
        "name": "nvinject-test",
        "plugins": [{
            "type": "bridge",
            "bridge": CNI_BRIDGE,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{ "subnet": subnet }]],
                "routes": [{ "dst": "0.0.0.0/0" }],
                "dataDir": ipam_dir,
            },
        }],
    })
}

/// The paths of the simulated node that nvinject's components are pointed at (host paths).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimRoots {
    /// The simulated node's directory (bind-mounted at the same path where a component needs it).
    pub dir: PathBuf,
    /// Its driver root.
    pub driver_root: PathBuf,
    /// Its dev root (`<dev root>/dev/nvidia*`).
    pub dev_root: PathBuf,
    /// Its proc root.
    pub proc_root: PathBuf,
    /// Its sys root.
    pub sys_root: PathBuf,
}

impl SimRoots {
    /// The roots of the simulated node built in `dir` (`nvinject-simnode build --out <dir>`).
    pub fn of(dir: &Path) -> Self {
        SimRoots {
            driver_root: dir.join("driver"),
            dev_root: dir.join("host"),
            proc_root: dir.join("host/proc"),
            sys_root: dir.join("host/sys"),
            dir: dir.to_path_buf(),
        }
    }
}

/// The host paths nvinject's installer writes or reads, bound into the node's host root from the test
/// directories that shadow them (so the installer pod, containerd and the kubelet see the same files).
pub const HOST_ROOT_BINDS: &[&str] = &[
    "/etc/containerd",
    "/etc/nvinject",
    "/etc/cdi",
    "/var/run/cdi",
    "/usr/local/nvinject",
    "/var/lib/nvinject",
    "/run/containerd",
];

/// A host root of the node's own for the installer DaemonSet (its `hostPath: /`): a directory with
/// bind mounts of the node's shadowed directories ([`HOST_ROOT_BINDS`]), the simulated node at its own
/// path, and containerd's binary; `/var/run` is a link to `/run` as on Debian. The installer's other
/// writes (`/run/nvinject`, the shim link in `/usr/local/bin`) land in plain directories of it.
#[derive(Debug)]
pub struct NodeHostRoot {
    root: PathBuf,
    mounts: Vec<PathBuf>,
}

/// `root` joined with the absolute host path `host`, `/var/run` read as `/run`.
pub fn in_root(root: &Path, host: &Path) -> PathBuf {
    let host =
        host.strip_prefix("/var/run").map(|rest| Path::new("/run").join(rest)).unwrap_or(host.to_path_buf());
    let rel: PathBuf = host.components().filter(|c| matches!(c, Component::Normal(_))).collect();
    root.join(rel)
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> KubeletError + use<> {
    let path = path.to_path_buf();
    move |source| KubeletError::Io { op, path, source }
}

impl NodeHostRoot {
    /// Makes the host root at `root` for the node laid out in `dirs`, with `sim_dir` and `containerd`
    /// (the binary) bound in at their own paths.
    pub fn create(
        root: &Path,
        dirs: &NodeDirs,
        sim_dir: &Path,
        containerd: &Path,
    ) -> Result<Self, KubeletError> {
        let mut hr = NodeHostRoot { root: root.to_path_buf(), mounts: Vec::new() };
        for d in ["run/nvinject", "usr/local/bin", "usr/bin", "var", "tmp"] {
            let p = root.join(d);
            fs::create_dir_all(&p).map_err(io("create", &p))?;
        }
        let var_run = root.join("var/run");
        std::os::unix::fs::symlink("../run", &var_run).map_err(io("symlink", &var_run))?;
        for host in HOST_ROOT_BINDS {
            hr.bind(&dirs.shadow_of(host), &in_root(root, Path::new(host)), true)?;
        }
        hr.bind(sim_dir, &in_root(root, sim_dir), true)?;
        hr.bind(containerd, &in_root(root, containerd), false)?;
        Ok(hr)
    }

    fn bind(&mut self, source: &Path, target: &Path, dir: bool) -> Result<(), KubeletError> {
        if dir {
            fs::create_dir_all(target).map_err(io("create", target))?;
        } else {
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent).map_err(io("create", parent))?;
            }
            fs::write(target, b"").map_err(io("create", target))?;
        }
        mount(Some(source), target, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(|e| {
            KubeletError::Io {
                op: "bind-mount",
                path: target.to_path_buf(),
                source: std::io::Error::other(format!("from {}: {e}", source.display())),
            }
        })?;
        self.mounts.push(target.to_path_buf());
        Ok(())
    }

    /// The host root's path (what the DaemonSet's `host-root` volume points at).
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Unmounts every bind, newest first; fails naming the first that would not go.
    pub fn unmount(&mut self) -> Result<(), KubeletError> {
        while let Some(target) = self.mounts.pop() {
            umount2(&target, MntFlags::empty()).map_err(|e| KubeletError::Io {
                op: "unmount",
                path: target.clone(),
                source: std::io::Error::other(e.to_string()),
            })?;
        }
        Ok(())
    }
}

impl Drop for NodeHostRoot {
    fn drop(&mut self) {
        while let Some(target) = self.mounts.pop() {
            let _ = umount2(&target, MntFlags::MNT_DETACH);
        }
    }
}

/// The installer's environment as the test overlay sets it (the DaemonSet's other variables stay).
pub fn installer_root_env(sim: &SimRoots) -> Vec<(String, String)> {
    let s = |p: &Path| p.to_string_lossy().into_owned();
    vec![
        ("NVINJECT_DRIVER_ROOT".into(), s(&sim.driver_root)),
        ("NVINJECT_DEV_ROOT".into(), s(&sim.dev_root)),
        ("NVINJECT_PROC_ROOT".into(), s(&sim.proc_root)),
        ("NVINJECT_SYS_ROOT".into(), s(&sim.sys_root)),
    ]
}

/// The device plugin's root variables as the test overlay sets them, and the API server's address:
/// the test cluster runs no kube-proxy, so the `kubernetes` Service's ClusterIP the kubelet puts in
/// `KUBERNETES_SERVICE_HOST` leads nowhere; the plugin (which labels its Node) is pointed at the
/// API server itself, as kube-proxy would forward it.
pub fn plugin_root_env(sim: &SimRoots, api_host: &str) -> Vec<(String, String)> {
    let s = |p: &Path| p.to_string_lossy().into_owned();
    vec![
        ("NVIDIA_DRIVER_ROOT".into(), s(&sim.driver_root)),
        ("NVIDIA_DEV_ROOT".into(), s(&sim.dev_root)),
        ("NVINJECT_PROC_ROOT".into(), s(&sim.proc_root)),
        ("NVINJECT_SYS_ROOT".into(), s(&sim.sys_root)),
        ("KUBERNETES_SERVICE_HOST".into(), api_host.into()),
        ("KUBERNETES_SERVICE_PORT".into(), control_plane::APISERVER_PORT.to_string()),
    ]
}

/// `to` as a path relative to the directory `from` (both absolute): kustomize 1.20 refuses an absolute
/// base.
pub fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let normal = |p: &Path| -> Vec<std::ffi::OsString> {
        p.components()
            .filter_map(|c| if let Component::Normal(n) = c { Some(n.to_owned()) } else { None })
            .collect()
    };
    let (from, to) = (normal(from), normal(to));
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut rel = PathBuf::new();
    for _ in common..from.len() {
        rel.push("..");
    }
    for part in &to[common..] {
        rel.push(part);
    }
    rel
}

/// The files of a kustomize overlay of `base` (the real `deploy/`) for a simulated node: it only points
/// roots elsewhere. The installer's host root becomes `host_root`; the plugin's driver root the simulated
/// driver root and its `/run` the host root's; both DaemonSets' root variables name the simulated node,
/// which both see read-only at its own path (as a real node's /dev, /proc and /sys are where its NVML
/// looks). Kustomize 1.20 (kubectl's) lists the base under `bases:`, relative to the overlay's directory
/// `dir`. Returns (file name, contents).
pub fn test_overlay(
    dir: &Path,
    base: &Path,
    host_root: &Path,
    sim: &SimRoots,
    api_host: &str,
) -> Vec<(String, String)> {
    let sim_volume =
        json!({ "name": "simulated-node", "hostPath": { "path": sim.dir, "type": "Directory" } });
    let sim_mount = json!({ "name": "simulated-node", "mountPath": sim.dir, "readOnly": true });
    let env = |vars: Vec<(String, String)>| -> Value {
        vars.into_iter().map(|(name, value)| json!({ "name": name, "value": value })).collect()
    };
    let installer = json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": { "name": "nvinject-installer", "namespace": "nvinject-system" },
        "spec": { "template": { "spec": {
            "containers": [{ "name": "installer", "env": env(installer_root_env(sim)), "volumeMounts": [sim_mount] }],
            "volumes": [
                { "name": "host-root", "hostPath": { "path": host_root, "type": "Directory" } },
                sim_volume,
            ],
        }}},
    });
    let plugin = json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": { "name": "nvinject-device-plugin", "namespace": "nvinject-system" },
        "spec": { "template": { "spec": {
            "containers": [{ "name": "device-plugin", "env": env(plugin_root_env(sim, api_host)), "volumeMounts": [sim_mount] }],
            "volumes": [
                { "name": "driver-root", "hostPath": { "path": sim.driver_root, "type": "Directory" } },
                { "name": "host-run", "hostPath": { "path": in_root(host_root, Path::new("/run")), "type": "Directory" } },
                sim_volume,
            ],
        }}},
    });
    let kustomization = format!(
        "# A test overlay of nvinject's deploy/: roots pointed at the simulated node and the node's own host root.\n\
         apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nbases:\n- {}\n\
         patchesStrategicMerge:\n- installer-roots.json\n- device-plugin-roots.json\n",
        relative_path(dir, base).display()
    );
    let pretty = |v: &Value| serde_json::to_string_pretty(v).expect("JSON values serialise");
    vec![
        ("kustomization.yaml".into(), kustomization),
        ("installer-roots.json".into(), pretty(&installer)),
        ("device-plugin-roots.json".into(), pretty(&plugin)),
    ]
}

/// A cluster whose control plane runs and whose node is laid out (host root, containerd's config) but
/// whose containerd and kubelet are not started yet: the moment to install nvinject on the node the way
/// its installer would, before containerd first starts.
#[derive(Debug)]
pub struct PreparedCluster {
    control: ControlPlane,
    node: PreparedNode,
    host_root: NodeHostRoot,
    network: NodeNetwork,
}

/// A running cluster: control plane, one node, its network and host root.
#[derive(Debug)]
pub struct Cluster {
    // Dropped in this order: the control plane first (the node's drop kills every process left in
    // the namespace), then the node, its host root and its network.
    control: Option<ControlPlane>,
    node: Option<KubeNode>,
    host_root: NodeHostRoot,
    network: NodeNetwork,
}

/// What [`Cluster::stop`] and [`StoppedCluster::finish`] did and found.
#[derive(Debug, Clone, Default)]
pub struct ClusterShutdown {
    /// The node's drain.
    pub node: ShutdownReport,
    /// The control plane's daemons stopped, `(pid, name)`.
    pub control_plane: Vec<(u32, String)>,
    /// Network interfaces in the namespace afterwards (only `lo` should be).
    pub interfaces: Vec<String>,
}

/// Options for a test cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The node's name.
    pub node_name: String,
    /// Images imported into the node's containerd besides the pause image.
    pub images: Vec<BuiltImage>,
    /// The simulated node's directory (bound into the host root at its own path).
    pub sim_dir: PathBuf,
}

/// Adds to the overlay in `dir` (made by [`test_overlay`]) a patch of the device plugin's ConfigMap:
/// the `config.yaml` of deploy/ (`base`) passed through `edit`, as an operator's kustomize overlay
/// would change a setting (the MIG strategy).
pub fn patch_plugin_config(
    dir: &Path,
    base: &Path,
    edit: impl Fn(&str) -> String,
) -> Result<(), KubeletError> {
    let source = base.join("device-plugin-config.yaml");
    let text = fs::read_to_string(&source).map_err(io("read", &source))?;
    let Some(embedded) = text.split("config.yaml: |\n").nth(1) else {
        return Err(KubeletError::Command {
            command: format!("read {}", source.display()),
            detail: "no `config.yaml: |` block".into(),
        });
    };
    let config: String = embedded
        .lines()
        .take_while(|l| l.starts_with("    ") || l.is_empty())
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect();
    let patch = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": "nvinject-device-plugin", "namespace": "nvinject-system" },
        "data": { "config.yaml": edit(&config) },
    });
    let file = dir.join("device-plugin-config.json");
    fs::write(&file, serde_json::to_string_pretty(&patch).expect("JSON values serialise"))
        .map_err(io("write", &file))?;
    let kustomization = dir.join("kustomization.yaml");
    let text = fs::read_to_string(&kustomization).map_err(io("read", &kustomization))?;
    fs::write(&kustomization, format!("{text}- device-plugin-config.json\n"))
        .map_err(io("write", &kustomization))
}

/// One node of a test cluster: its name and address, how it joins, what it runs.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// The node's name.
    pub name: String,
    /// Its address (the kubelet's `--node-ip`).
    pub address: String,
    /// The labels it registers with (`--node-labels`).
    pub labels: Vec<(String, String)>,
    /// Its kubelet's kubeconfig (`system:node:<name>`).
    pub kubeconfig: PathBuf,
    /// Images imported into its containerd besides the pause image.
    pub images: Vec<BuiltImage>,
    /// The simulated node's directory, bound into the host root at its own path.
    pub sim_dir: PathBuf,
    /// Its pods' subnet (the CNI bridge's).
    pub pod_subnet: String,
    /// Where its host root is made.
    pub host_root_dir: PathBuf,
    /// How long after an exit its containerd is started again ([`CONTAINERD_RESTART_DELAY`], the
    /// systemd unit's; zero stands for an installer that restarts it through systemd).
    pub containerd_restart_after: Duration,
}

/// Lays out a node in this mount namespace: its directories and shadows (containerd's supervised by a
/// restart delay, as its systemd unit would), the CNI config, `/run/netns`, and its host root; its
/// daemons are not started yet.
pub fn prepare_node(
    inside: &Inside,
    artifacts: &ClusterArtifacts,
    spec: &NodeSpec,
) -> Result<(PreparedNode, NodeHostRoot), KubeletError> {
    let node_options = NodeOptions {
        node_name: spec.name.clone(),
        // containerd 1.6 finds shims on its PATH: the installer's link goes to the host root's
        // /usr/local/bin, the node's.
        containerd_path_prepend: vec![in_root(&spec.host_root_dir, Path::new("/usr/local/bin"))],
        images: spec.images.clone(),
        cni_bin_dir: artifacts.cni_bin_dir.clone(),
        api: Some(ApiServerLink {
            kubeconfig: spec.kubeconfig.clone(),
            node_ip: spec.address.clone(),
            node_labels: spec.labels.clone(),
        }),
        containerd_restart_after: Some(spec.containerd_restart_after),
    };
    let node = PreparedNode::new(inside, &artifacts.kubelet, node_options)?;
    // Where containerd's CRI mounts pod network namespaces (the host's /run/netns otherwise).
    let netns = node.dirs().root.join("run-netns");
    fs::create_dir_all(&netns).map_err(io("create", &netns))?;
    inside.shadow(Path::new("/run/netns"), &netns)?;
    let ipam = node.dirs().root.join("cni-ipam");
    fs::create_dir_all(&ipam).map_err(io("create", &ipam))?;
    let conflist = Path::new("/etc/cni/net.d/10-nvinject-test.conflist");
    let config = cni_config(&ipam, &spec.pod_subnet);
    fs::write(conflist, serde_json::to_string_pretty(&config).expect("JSON values serialise"))
        .map_err(io("write", conflist))?;
    let containerd = which("containerd")?;
    let host_root = NodeHostRoot::create(&spec.host_root_dir, node.dirs(), &spec.sim_dir, &containerd)?;
    Ok((node, host_root))
}

impl PreparedCluster {
    /// Inside an isolated test: the node's network, its directories and host root, the CNI config, the
    /// certificates and the running control plane (its files in `<work>/control-plane`).
    pub fn new(
        inside: &Inside,
        artifacts: &ClusterArtifacts,
        options: ClusterOptions,
    ) -> Result<Self, KubeletError> {
        let network = NodeNetwork::create("nvinject-node", "nvinject-peer", NODE_IP, 24)?;
        let dir = inside.work().join("control-plane");
        let (control, creds) = ControlPlane::start(artifacts, &dir, NODE_IP, &options.node_name)?;
        let spec = NodeSpec {
            name: options.node_name.clone(),
            address: NODE_IP.into(),
            labels: vec![(GPU_NODE_LABEL.0.into(), GPU_NODE_LABEL.1.into())],
            kubeconfig: creds.kubelet.clone(),
            images: options.images.clone(),
            sim_dir: options.sim_dir.clone(),
            pod_subnet: POD_SUBNET.into(),
            host_root_dir: inside.work().join("host-root"),
            containerd_restart_after: CONTAINERD_RESTART_DELAY,
        };
        let (node, host_root) = prepare_node(inside, artifacts, &spec)?;
        Ok(PreparedCluster { control, node, host_root, network })
    }

    /// The node's host root.
    pub fn host_root(&self) -> &Path {
        self.host_root.path()
    }

    /// The control plane.
    pub fn control_plane(&self) -> &ControlPlane {
        &self.control
    }

    /// Starts containerd and the kubelet; returns once the node is Ready at the API server.
    pub fn start(self) -> Result<Cluster, KubeletError> {
        let mut cluster = Cluster {
            control: Some(self.control),
            node: None,
            host_root: self.host_root,
            network: self.network,
        };
        let node = self.node.start()?;
        let name = node.name().to_owned();
        cluster.node = Some(node);
        cluster.wait_node_ready(&name, Duration::from_secs(120))?;
        Ok(cluster)
    }
}

fn which(program: &str) -> Result<PathBuf, KubeletError> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| KubeletError::Command { command: program.into(), detail: "not found on PATH".into() })
}

/// Waits until node `name` reports Ready to the API server (failing as soon as a control-plane
/// component exits).
pub fn wait_node_ready(
    control: &mut ControlPlane,
    name: &str,
    timeout: Duration,
) -> Result<Value, KubeletError> {
    let started = Instant::now();
    let node = wait_for(&format!("node {name} to be Ready"), timeout, Duration::from_millis(250), || {
        control.check_running()?;
        let Ok(node) = control.get_json(&["node", name]) else { return Ok(None) };
        Ok(condition(&node, "Ready").is_some_and(|c| c["status"] == "True").then_some(node))
    })?;
    tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, node = name, "node Ready");
    Ok(node)
}

/// The condition `type` of a node or pod object (`status.conditions`), if reported.
pub fn condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == kind)
}

impl Cluster {
    /// `kubectl` with the admin kubeconfig.
    pub fn kubectl(&self) -> Command {
        self.control.as_ref().expect("the control plane runs until shutdown").kubectl()
    }

    /// Runs kubectl with `args`; its stdout, or an error with its stderr.
    pub fn kubectl_out(&self, args: &[&str]) -> Result<String, KubeletError> {
        self.control.as_ref().expect("the control plane runs until shutdown").kubectl_out(args)
    }

    /// `kubectl get <args> -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> Result<Value, KubeletError> {
        self.control.as_ref().expect("the control plane runs until shutdown").get_json(args)
    }

    /// `kubectl apply -f -` with `manifest` (JSON).
    pub fn apply(&self, manifest: &Value) -> Result<String, KubeletError> {
        self.control.as_ref().expect("the control plane runs until shutdown").apply(manifest)
    }

    /// The node.
    pub fn node(&self) -> &KubeNode {
        self.node.as_ref().expect("the node runs until shutdown")
    }

    /// The node, mutably (CRI calls).
    pub fn node_mut(&mut self) -> &mut KubeNode {
        self.node.as_mut().expect("the node runs until shutdown")
    }

    /// The control plane.
    pub fn control_plane(&mut self) -> &mut ControlPlane {
        self.control.as_mut().expect("the control plane runs until shutdown")
    }

    /// The node's host root (what the installer DaemonSet sees as `/`).
    pub fn host_root(&self) -> &Path {
        self.host_root.path()
    }

    /// Waits until node `name` reports Ready to the API server.
    pub fn wait_node_ready(&mut self, name: &str, timeout: Duration) -> Result<Value, KubeletError> {
        let control = self.control.as_mut().expect("the control plane runs until shutdown");
        let node = wait_node_ready(control, name, timeout);
        node.map_err(|e| e.with_context(format!("kubelet log:\n{}", self.node().log_tail("kubelet", 25))))
    }

    /// Stops the control plane, then drains and stops the node (its kubelet's cgroups emptied and
    /// removed); checks that no process and no mount of the node's daemons is left. The host root
    /// and the network stay for [`StoppedCluster::finish`] (an uninstall on the node needs the first).
    pub fn stop(mut self) -> Result<StoppedCluster, KubeletError> {
        let mut report = ClusterShutdown::default();
        if let Some(mut control) = self.control.take() {
            report.control_plane = control.pids();
            control.stop();
        }
        if let Some(node) = self.node.take() {
            let root = node.dirs().root.clone();
            report.node = node.shutdown()?;
            let left = mounts_left(&root);
            if !left.is_empty() {
                return Err(KubeletError::Command {
                    command: "cluster shutdown".into(),
                    detail: format!("mounts left by the node's daemons: {left:?}"),
                });
            }
        }
        let Cluster { host_root, network, .. } = self;
        Ok(StoppedCluster { report, host_root, network })
    }
}

/// A cluster whose daemons are stopped; its node's host root and network remain.
#[derive(Debug)]
pub struct StoppedCluster {
    report: ClusterShutdown,
    host_root: NodeHostRoot,
    network: NodeNetwork,
}

impl StoppedCluster {
    /// The node's host root, still mounted.
    pub fn host_root(&self) -> &Path {
        self.host_root.path()
    }

    /// Unmounts the host root's binds and removes the node's links (the veth pair, the CNI bridge);
    /// checks that nothing is mounted below the host root and no interface but `lo` is left.
    pub fn finish(mut self) -> Result<ClusterShutdown, KubeletError> {
        self.host_root.unmount()?;
        let left = mounts::mounts_under(self.host_root.path());
        if !left.is_empty() {
            return Err(KubeletError::Command {
                command: "cluster shutdown".into(),
                detail: format!(
                    "mounts left below the host root {}: {left:?}",
                    self.host_root.path().display()
                ),
            });
        }
        self.network.remove()?;
        // The bridge plugin made the CNI bridge for the first pod; it outlives the pods.
        if net::interfaces()?.iter().any(|i| i == CNI_BRIDGE) {
            process::run(Command::new("ip").args(["link", "del", CNI_BRIDGE]))?;
        }
        self.report.interfaces = net::interfaces()?;
        if self.report.interfaces != ["lo"] {
            return Err(KubeletError::Command {
                command: "cluster shutdown".into(),
                detail: format!("network interfaces left in the namespace: {:?}", self.report.interfaces),
            });
        }
        Ok(self.report.clone())
    }
}

/// Host paths where the node's daemons mount things (pod volumes, container root file systems,
/// network namespaces), each shadowed by a test directory: what is mounted below them must be gone
/// once the node is down (the shadow itself stays until the namespace ends).
pub const DAEMON_MOUNT_DIRS: &[&str] = &[
    "/run/containerd",
    "/var/lib/containerd",
    "/var/lib/kubelet/device-plugins",
    "/var/log/pods",
    "/run/netns",
];

/// Mounts at or below the node's directory `node_root`, and strictly below [`DAEMON_MOUNT_DIRS`].
pub fn mounts_left(node_root: &Path) -> Vec<PathBuf> {
    let mut left = mounts::mounts_under(node_root);
    for dir in DAEMON_MOUNT_DIRS {
        left.extend(mounts::mounts_under(Path::new(dir)).into_iter().filter(|m| m != Path::new(dir)));
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim() -> SimRoots {
        SimRoots {
            dir: "/w/sim".into(),
            driver_root: "/w/sim/driver".into(),
            dev_root: "/w/sim/host".into(),
            proc_root: "/w/sim/host/proc".into(),
            sys_root: "/w/sim/host/sys".into(),
        }
    }

    #[test]
    fn host_paths_land_inside_the_root_and_var_run_is_run() {
        assert_eq!(
            in_root(Path::new("/w/root"), Path::new("/etc/containerd")),
            Path::new("/w/root/etc/containerd")
        );
        assert_eq!(in_root(Path::new("/w/root"), Path::new("/var/run/cdi")), Path::new("/w/root/run/cdi"));
        assert_eq!(in_root(Path::new("/w/root"), Path::new("/../etc")), Path::new("/w/root/etc"));
    }

    #[test]
    fn the_overlay_keeps_the_base_and_only_points_roots_elsewhere() {
        let files = test_overlay(
            Path::new("/w/overlay"),
            Path::new("/src/deploy"),
            Path::new("/w/host-root"),
            &sim(),
            NODE_IP,
        );
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["kustomization.yaml", "installer-roots.json", "device-plugin-roots.json"]);
        assert!(files[0].1.contains("bases:\n- ../../src/deploy\n"), "{}", files[0].1);
        let installer: Value = serde_json::from_str(&files[1].1).unwrap();
        let spec = &installer["spec"]["template"]["spec"];
        assert_eq!(spec["volumes"][0]["hostPath"]["path"], "/w/host-root");
        let c = &spec["containers"][0];
        assert_eq!(c["name"], "installer");
        // Only roots: every variable set is one of the root variables, with a simulated-node path.
        for var in c["env"].as_array().unwrap() {
            assert!(var["name"].as_str().unwrap().ends_with("_ROOT"), "{var}");
            assert!(var["value"].as_str().unwrap().starts_with("/w/sim/"), "{var}");
        }
        assert!(
            c.get("image").is_none() && c.get("command").is_none(),
            "the image and command stay deploy/'s"
        );
        let plugin: Value = serde_json::from_str(&files[2].1).unwrap();
        let volumes = &plugin["spec"]["template"]["spec"]["volumes"];
        assert_eq!(volumes[0]["hostPath"]["path"], "/w/sim/driver");
        assert_eq!(volumes[1]["hostPath"]["path"], "/w/host-root/run");
        assert_eq!(plugin["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["readOnly"], true);
        let env = &plugin["spec"]["template"]["spec"]["containers"][0]["env"];
        let api = env.as_array().unwrap().iter().find(|v| v["name"] == "KUBERNETES_SERVICE_HOST").unwrap();
        assert_eq!(api["value"], NODE_IP, "no kube-proxy here: the plugin is pointed at the API server");
    }

    #[test]
    fn relative_paths_climb_to_the_common_ancestor() {
        assert_eq!(
            relative_path(Path::new("/tmp/w/overlay"), Path::new("/src/deploy")),
            Path::new("../../../src/deploy")
        );
        assert_eq!(relative_path(Path::new("/a/b"), Path::new("/a/c")), Path::new("../c"));
        assert_eq!(relative_path(Path::new("/a"), Path::new("/a/b")), Path::new("b"));
    }

    #[test]
    fn the_cni_bridge_keeps_its_addresses_in_the_test_dir() {
        let c = cni_config(Path::new("/w/ipam"), POD_SUBNET);
        let bridge = &c["plugins"][0];
        assert_eq!(bridge["type"], "bridge");
        assert_eq!(bridge["ipMasq"], false);
        assert_eq!(bridge["ipam"]["dataDir"], "/w/ipam");
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], POD_SUBNET);
    }

    #[test]
    fn conditions_are_found_by_type() {
        let node = json!({ "status": { "conditions": [{ "type": "MemoryPressure", "status": "False" }, { "type": "Ready", "status": "True" }] } });
        assert_eq!(condition(&node, "Ready").unwrap()["status"], "True");
        assert!(condition(&node, "DiskPressure").is_none());
    }

    #[test]
    fn the_fetch_script_is_where_the_harness_looks() {
        assert!(fetch_debs_script().is_file(), "{} missing", fetch_debs_script().display());
    }
}
