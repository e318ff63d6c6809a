//! A Kubernetes node in a test, laid out as a real one: containerd with its default paths
//! (`/etc/containerd/config.toml`, `/var/lib/containerd`, `/run/containerd/containerd.sock`), the
//! standalone kubelet, nvinject's install paths (`/etc/nvinject`, `/usr/local/nvinject`, `/var/run/cdi`)
//! and any extra daemons (the device plugin). It runs inside an isolated test's namespaces
//! ([`crate::namespace::Inside`]), where each of those host paths is shadowed by a directory of the
//! test, so an installer can run with its defaults against it and the host is untouched. Everything is
//! stopped by PID on [`KubeNode::shutdown`] (or on drop).

use std::ffi::OsString;
use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use nvinject_image_tool::image::BuiltImage;
use serde_json::Value;

use super::artifacts::KubeletArtifacts;
use super::cgroup::CgroupRoot;
use super::config::{ApiServerLink, KubeletSettings, StaticPod, containerd_node_config};
use super::daemon::Daemon;
use super::error::KubeletError;
use super::supervisor::{DaemonExit, Respawn, Supervised};
use crate::containerd::ctr_command;
use crate::cri::{self, CriClient, LABEL_CONTAINER_NAME, LABEL_POD_NAME, parse_cri_log};
use crate::namespace::{Inside, mount_ns_of, processes_in_mount_ns};
use crate::process;

/// containerd's default socket (under `/run/containerd`, shadowed).
pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
/// containerd's default configuration file (in `/etc/containerd`, shadowed).
pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
/// The file in the device-plugin dir where the kubelet keeps allocations and healthy devices.
pub const CHECKPOINT_FILE: &str = "kubelet_internal_checkpoint";

/// How long a removed pod must stay stopped, unchanged, before [`KubeNode::wait_stopped`] trusts it:
/// longer than the kubelet's 2 s housekeeping period.
pub const STOP_QUIET: Duration = Duration::from_millis(2500);

/// The host paths a node test shadows, each with the name of the directory under the node's root
/// that stands in for it. The kubelet 1.20 hard-codes the first three; containerd 1.6 puts shim
/// sockets and runc state under `/run/containerd` whatever its configured state dir; the rest are the
/// default paths of containerd, CNI and nvinject's installer, runtime and device plugin.
pub const SHADOWED: &[(&str, &str)] = &[
    ("/var/lib/kubelet/device-plugins", "device-plugins"),
    ("/var/log/pods", "log-pods"),
    ("/var/log/containers", "log-containers"),
    ("/run/containerd", "run-containerd"),
    ("/var/lib/containerd", "var-lib-containerd"),
    ("/etc/containerd", "etc-containerd"),
    ("/etc/cni/net.d", "etc-cni-net.d"),
    // libcni's cache (`results/`), which containerd's CRI does not let a config move.
    ("/var/lib/cni", "var-lib-cni"),
    ("/etc/nvinject", "etc-nvinject"),
    ("/usr/local/nvinject", "usr-local-nvinject"),
    ("/var/run/cdi", "run-cdi"),
    ("/etc/cdi", "etc-cdi"),
    ("/var/lib/nvinject", "var-lib-nvinject"),
    ("/etc/kubernetes", "etc-kubernetes"),
];

/// The directories of a test node, all under one root.
#[derive(Debug, Clone)]
pub struct NodeDirs {
    /// The node's root (inside the isolated test's work dir).
    pub root: PathBuf,
    /// The kubelet's `--root-dir`.
    pub kubelet_root: PathBuf,
    /// The static pod manifests the kubelet watches.
    pub manifests: PathBuf,
    /// Where manifests are written before being moved into `manifests` (the kubelet may read a
    /// half-written file).
    pub staging: PathBuf,
    /// The kubelet's flexvolume plugin dir.
    pub volume_plugins: PathBuf,
    /// Daemon logs.
    pub logs: PathBuf,
    /// `<pid> <name>` of every daemon started.
    pub pid_file: PathBuf,
}

impl NodeDirs {
    fn new(root: &Path) -> Self {
        NodeDirs {
            root: root.to_path_buf(),
            kubelet_root: root.join("kubelet"),
            manifests: root.join("manifests"),
            staging: root.join("manifests.staging"),
            volume_plugins: root.join("volume-plugins"),
            logs: root.join("logs"),
            pid_file: root.join("pids"),
        }
    }

    /// The test directory shadowing host path `host` (one of [`SHADOWED`]).
    pub fn shadow_of(&self, host: &str) -> PathBuf {
        let (_, name) =
            SHADOWED.iter().find(|(h, _)| *h == host).unwrap_or_else(|| panic!("{host} is not shadowed"));
        self.root.join(name)
    }

    /// The device-plugin directory (the kubelet's socket, plugin sockets, the checkpoint).
    pub fn device_plugins(&self) -> PathBuf {
        self.shadow_of("/var/lib/kubelet/device-plugins")
    }

    /// The pod log directory (`<namespace>_<pod>_<uid>/<container>/<n>.log`).
    pub fn pod_logs(&self) -> PathBuf {
        self.shadow_of("/var/log/pods")
    }
}

/// Options for a test node.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// The node name.
    pub node_name: String,
    /// Directories put first in containerd's `PATH` (where containerd 1.6 finds shim binaries).
    pub containerd_path_prepend: Vec<PathBuf>,
    /// Images to import into containerd's `k8s.io` namespace besides the pause image.
    pub images: Vec<BuiltImage>,
    /// Where containerd's CRI finds CNI plugins.
    pub cni_bin_dir: PathBuf,
    /// The API server the kubelet joins (`None`: standalone).
    pub api: Option<ApiServerLink>,
    /// Restart containerd this long after it exits, as its systemd unit does (`Restart=always`,
    /// `RestartSec=5`): what an installer's signal restart needs. `None`: an exit stays an exit.
    pub containerd_restart_after: Option<Duration>,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            node_name: "nvinject-node".into(),
            containerd_path_prepend: Vec::new(),
            images: Vec::new(),
            cni_bin_dir: PathBuf::from("/usr/lib/cni"),
            api: None,
            containerd_restart_after: None,
        }
    }
}

/// A node whose directories, shadows, cgroup and configuration files exist but whose daemons are not
/// started yet: the moment an installer configures it.
#[derive(Debug)]
pub struct PreparedNode {
    dirs: NodeDirs,
    settings: KubeletSettings,
    artifacts: KubeletArtifacts,
    options: NodeOptions,
    cgroup: CgroupRoot,
    sysctl_files: Vec<(String, PathBuf)>,
}

/// A running test node.
#[derive(Debug)]
pub struct KubeNode {
    dirs: NodeDirs,
    settings: KubeletSettings,
    artifacts: KubeletArtifacts,
    options: NodeOptions,
    sysctl_files: Vec<(String, PathBuf)>,
    // Stopped in this order: the kubelet, the extras, containerd; the cgroup goes last.
    kubelet: Option<Daemon>,
    extras: Vec<Daemon>,
    containerd: Option<Supervised>,
    /// Connected to the containerd with this PID (reconnected after a restart).
    cri: Option<(u32, CriClient)>,
    cgroup: Option<CgroupRoot>,
}

/// A container found running.
#[derive(Debug, Clone)]
pub struct RunningContainer {
    /// Its CRI id.
    pub id: String,
    /// Its pod sandbox's CRI id.
    pub pod_sandbox_id: String,
    /// Its pod's UID (the kubelet's checkpoint is keyed by it).
    pub pod_uid: String,
    /// From the manifest landing in the manifest dir to the runtime reporting it running.
    pub after: Duration,
}

/// What [`KubeNode::shutdown`] did.
#[derive(Debug, Clone, Default)]
pub struct ShutdownReport {
    /// Pod sandboxes still present when the kubelet stopped, removed through CRI.
    pub pods_removed: usize,
    /// Cgroup directories removed (the kubelet's QoS tree and the root, in every hierarchy).
    pub cgroups_removed: usize,
    /// Processes found in the kubelet's cgroups after every daemon stopped, killed before the
    /// cgroups were removed (none when the runtime cleaned up after itself).
    pub killed_in_cgroups: Vec<i32>,
    /// What was still mounted below the kubelet's root dir once it stopped (the kubelet makes its
    /// root a shared bind mount of itself), unmounted here.
    pub unmounted: Vec<PathBuf>,
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> KubeletError + use<> {
    let path = path.to_path_buf();
    move |source| KubeletError::Io { op, path, source }
}

/// Polls `probe` every `every` until it gives `Some`, or fails with `what` after `timeout`.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Result<Option<T>, KubeletError>,
) -> Result<T, KubeletError> {
    let deadline = Instant::now() + timeout;
    let mut last_err = String::new();
    loop {
        match probe() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = e.to_string(),
        }
        if Instant::now() >= deadline {
            return Err(KubeletError::Timeout { what: what.to_owned(), waited: timeout, detail: last_err });
        }
        std::thread::sleep(every);
    }
}

impl PreparedNode {
    /// Makes the node's directories under `<work>/node`, shadows [`SHADOWED`] and the kubelet's sysctls
    /// with them (inside the namespace only), creates the cgroup root and writes the kubelet's config and
    /// containerd's `/etc/containerd/config.toml`.
    pub fn new(
        inside: &Inside,
        artifacts: &KubeletArtifacts,
        options: NodeOptions,
    ) -> Result<Self, KubeletError> {
        let dirs = NodeDirs::new(&inside.work().join("node"));
        for d in [&dirs.kubelet_root, &dirs.manifests, &dirs.staging, &dirs.volume_plugins, &dirs.logs] {
            fs::create_dir_all(d).map_err(io("create", d))?;
        }
        for (host, name) in SHADOWED {
            let dir = dirs.root.join(name);
            fs::create_dir_all(&dir).map_err(io("create", &dir))?;
            inside.shadow(Path::new(host), &dir)?;
        }
        let sysctl_files = inside.shadow_kubelet_sysctls()?;
        let cgroup = CgroupRoot::create(&inside.cgroup_name())?;
        let settings = KubeletSettings {
            node_name: options.node_name.clone(),
            root_dir: dirs.kubelet_root.clone(),
            config_file: dirs.root.join("kubelet-config.json"),
            manifest_dir: dirs.manifests.clone(),
            cgroup_root: cgroup.kubelet_path(),
            cri_socket: PathBuf::from(CONTAINERD_SOCKET),
            volume_plugin_dir: dirs.volume_plugins.clone(),
            pause_image: artifacts.pause_image.clone(),
            port: 10250,
            healthz_port: 10248,
            read_only_port: 10255,
            api: options.api.clone(),
        };
        let config = serde_json::to_string_pretty(&settings.config()).expect("JSON values serialise");
        fs::write(&settings.config_file, config).map_err(io("write", &settings.config_file))?;
        let containerd_config = Path::new(CONTAINERD_CONFIG);
        fs::write(containerd_config, containerd_node_config(&artifacts.pause_image, &options.cni_bin_dir))
            .map_err(io("write", containerd_config))?;
        Ok(PreparedNode { dirs, settings, artifacts: artifacts.clone(), options, cgroup, sysctl_files })
    }

    /// The node's directories.
    pub fn dirs(&self) -> &NodeDirs {
        &self.dirs
    }

    /// Starts containerd, imports the pause image and the options' images, and starts the kubelet;
    /// returns once the kubelet is healthy and its device-plugin socket is up.
    pub fn start(self) -> Result<KubeNode, KubeletError> {
        let mut node = KubeNode {
            dirs: self.dirs,
            settings: self.settings,
            artifacts: self.artifacts,
            options: self.options,
            sysctl_files: self.sysctl_files,
            kubelet: None,
            extras: Vec::new(),
            containerd: None,
            cri: None,
            cgroup: Some(self.cgroup),
        };
        node.start_containerd()?;
        let pause =
            BuiltImage { tar: node.artifacts.pause_tar.clone(), name: node.artifacts.pause_image.clone() };
        for image in std::iter::once(&pause).chain(&node.options.images.clone()) {
            node.import_image(image)?;
        }
        node.start_kubelet()?;
        Ok(node)
    }
}

impl KubeNode {
    /// The node's directories.
    pub fn dirs(&self) -> &NodeDirs {
        &self.dirs
    }

    /// The node name.
    pub fn name(&self) -> &str {
        &self.settings.node_name
    }

    /// The CRI client (connected to this node's containerd).
    pub fn cri(&mut self) -> &mut CriClient {
        self.connected_cri().unwrap_or_else(|e| panic!("containerd is running: {e}"))
    }

    /// The CRI client, connected again when containerd was restarted since the last call.
    fn connected_cri(&mut self) -> Result<&mut CriClient, KubeletError> {
        let pid = self.containerd.as_ref().map_or(0, Supervised::pid);
        if self.cri.as_ref().is_none_or(|(connected, _)| *connected != pid) {
            self.cri = None;
            let client = CriClient::connect(Path::new(CONTAINERD_SOCKET))?;
            self.cri = Some((pid, client));
        }
        Ok(&mut self.cri.as_mut().expect("just connected").1)
    }

    /// Whether containerd answers CRI with its runtime ready (false while it is down or starting).
    pub fn containerd_ready(&mut self) -> bool {
        let Ok(cri) = self.connected_cri() else { return false };
        cri.conditions().is_ok_and(|conditions| conditions.iter().any(|(t, ok)| t == "RuntimeReady" && *ok))
    }

    /// containerd's PID now (0 while it is down between an exit and its restart).
    pub fn containerd_pid(&self) -> u32 {
        self.containerd.as_ref().map_or(0, Supervised::pid)
    }

    /// Every exit of containerd seen so far, with the restart that followed (with
    /// [`NodeOptions::containerd_restart_after`]).
    pub fn containerd_exits(&self) -> Vec<DaemonExit> {
        self.containerd.as_ref().map(Supervised::exits).unwrap_or_default()
    }

    /// The files shadowing the kubelet's sysctls, with the sysctl each stands for.
    pub fn sysctl_files(&self) -> &[(String, PathBuf)] {
        &self.sysctl_files
    }

    fn start_containerd(&mut self) -> Result<(), KubeletError> {
        let mut path: Vec<PathBuf> = self.options.containerd_path_prepend.clone();
        path.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
        let path: OsString = std::env::join_paths(path).map_err(|e| KubeletError::Command {
            command: "containerd".into(),
            detail: format!("PATH: {e}"),
        })?;
        let (log, pid_file) = (self.dirs.logs.join("containerd.log"), self.dirs.pid_file.clone());
        // No flags: the default config file, root, state and socket, as on a node.
        let spawn = move || {
            let mut cmd = Command::new("containerd");
            crate::process::as_node_service(&mut cmd).env("PATH", &path);
            Daemon::spawn("containerd", cmd, &log, &pid_file)
        };
        let mut d = spawn()?;
        let started = Instant::now();
        let socket = Path::new(CONTAINERD_SOCKET);
        let cri = wait_for(
            "containerd's CRI to be ready",
            Duration::from_secs(30),
            Duration::from_millis(50),
            || {
                if let Some(status) = d.exited() {
                    return Err(KubeletError::Exited {
                        daemon: "containerd".into(),
                        status: status.to_string(),
                        log: d.log_tail(20),
                    });
                }
                if !socket.exists() {
                    return Ok(None);
                }
                let mut cri = CriClient::connect(socket)?;
                let ready = cri.conditions()?.iter().any(|(t, ok)| t == "RuntimeReady" && *ok);
                Ok(ready.then_some(cri))
            },
        )
        .map_err(|e| e.with_log(&d))?;
        let pid = d.pid();
        tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, pid, "containerd ready");
        let respawn: Respawn = Box::new(spawn);
        self.containerd = Some(Supervised::new(d, self.options.containerd_restart_after, respawn));
        self.cri = Some((pid, cri));
        Ok(())
    }

    /// Imports an image archive into containerd's `k8s.io` namespace (the one CRI uses).
    pub fn import_image(&self, image: &BuiltImage) -> Result<(), KubeletError> {
        let mut cmd = ctr_command(Path::new(CONTAINERD_SOCKET), "k8s.io");
        process::run(cmd.args(["images", "import"]).arg(&image.tar))?;
        Ok(())
    }

    fn start_kubelet(&mut self) -> Result<(), KubeletError> {
        let mut cmd = Command::new(&self.artifacts.kubelet);
        cmd.args(self.settings.args());
        // Not on AWS: without this the kubelet's credential provider probes EC2's metadata address
        // for about 6 s before it starts.
        cmd.env("AWS_EC2_METADATA_DISABLED", "true");
        let mut d = Daemon::spawn("kubelet", cmd, &self.dirs.logs.join("kubelet.log"), &self.dirs.pid_file)?;
        let socket = self.dirs.device_plugins().join("kubelet.sock");
        let port = self.settings.healthz_port;
        let started = Instant::now();
        wait_for("the kubelet to be healthy", Duration::from_secs(60), Duration::from_millis(50), || {
            if let Some(status) = d.exited() {
                return Err(KubeletError::Exited {
                    daemon: "kubelet".into(),
                    status: status.to_string(),
                    log: d.log_tail(30),
                });
            }
            Ok((socket.exists() && http_get(port, "/healthz").is_ok_and(|b| b == "ok")).then_some(()))
        })
        .map_err(|e| e.with_log(&d))?;
        tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, pid = d.pid(), "kubelet healthy");
        self.kubelet = Some(d);
        Ok(())
    }

    /// Stops the kubelet (SIGTERM) and starts it again with the same settings; returns once healthy.
    /// Its pods keep running meanwhile, as on a real node.
    pub fn restart_kubelet(&mut self) -> Result<Duration, KubeletError> {
        let started = Instant::now();
        if let Some(mut d) = self.kubelet.take() {
            d.stop(Duration::from_secs(10));
        }
        self.start_kubelet()?;
        Ok(started.elapsed())
    }

    /// Starts another daemon on this node (the device plugin), logging to `logs/<name>.log`; it is
    /// stopped before containerd at shutdown.
    pub fn start_daemon(&mut self, name: &str, cmd: Command) -> Result<&mut Daemon, KubeletError> {
        let d = Daemon::spawn(name, cmd, &self.dirs.logs.join(format!("{name}.log")), &self.dirs.pid_file)?;
        self.extras.push(d);
        Ok(self.extras.last_mut().expect("just pushed"))
    }

    /// Writes `pod`'s manifest to the staging dir and moves it into the manifest dir; returns the moment
    /// it landed (the start of "manifest to running").
    pub fn add_static_pod(&self, pod: &StaticPod) -> Result<Instant, KubeletError> {
        let file = format!("{}.json", pod.name);
        let staged = self.dirs.staging.join(&file);
        let text = serde_json::to_string_pretty(&pod.manifest()).expect("JSON values serialise");
        fs::write(&staged, text).map_err(io("write", &staged))?;
        let target = self.dirs.manifests.join(&file);
        fs::rename(&staged, &target).map_err(io("move into the manifest dir", &target))?;
        Ok(Instant::now())
    }

    /// Removes `pod`'s manifest; the kubelet then stops the pod.
    pub fn remove_static_pod(&self, pod: &StaticPod) -> Result<(), KubeletError> {
        let target = self.dirs.manifests.join(format!("{}.json", pod.name));
        fs::remove_file(&target).map_err(io("remove", &target))
    }

    /// Waits until `pod`'s container `container` is running; `since` is when its manifest landed.
    pub fn wait_running(
        &mut self,
        pod: &StaticPod,
        container: &str,
        since: Instant,
        timeout: Duration,
    ) -> Result<RunningContainer, KubeletError> {
        let full = pod.full_name(&self.settings.node_name);
        let what = format!("container {container} of pod {full} to run");
        let cri = self.connected_cri()?;
        let found = wait_for(&what, timeout, Duration::from_millis(10), || {
            let list = cri.containers(&[(LABEL_POD_NAME, &full), (LABEL_CONTAINER_NAME, container)])?;
            Ok(list.into_iter().find(cri::is_running))
        });
        let c = match found {
            Ok(c) => c,
            Err(e) => return Err(e.with_context(format!("kubelet log:\n{}", self.log_tail("kubelet", 25)))),
        };
        let after = since.elapsed();
        Ok(RunningContainer {
            pod_uid: c.labels.get("io.kubernetes.pod.uid").cloned().unwrap_or_default(),
            id: c.id,
            pod_sandbox_id: c.pod_sandbox_id,
            after,
        })
    }

    /// Waits until no container of `pod` runs, none of its sandboxes is ready, and nothing about it
    /// changes for [`STOP_QUIET`] (what the kubelet does when a manifest goes away).
    ///
    /// Why the quiet period: a pod worker still holding the removed pod may create a new sandbox for it
    /// once (seen ~0.6 s after the removal), and kubelet 1.20 re-allocates its devices then without a
    /// lock shared with admission: a GPU pod admitted at that moment can crash the kubelet ("assignment
    /// to entry in nil map" in devicemanager). The kubelet's housekeeping (every 2 s) kills such a
    /// sandbox, so a state that holds longer than that is final.
    pub fn wait_stopped(&mut self, pod: &StaticPod, timeout: Duration) -> Result<Duration, KubeletError> {
        let full = pod.full_name(&self.settings.node_name);
        let started = Instant::now();
        let cri = self.connected_cri()?;
        let mut quiet: Option<(Instant, usize, usize)> = None;
        wait_for(&format!("pod {full} to stop"), timeout, Duration::from_millis(50), || {
            let containers = cri.containers(&[(LABEL_POD_NAME, &full)])?;
            let sandboxes = cri.pods(&[(LABEL_POD_NAME, &full)])?;
            if containers.iter().any(cri::is_running) || sandboxes.iter().any(cri::is_ready) {
                quiet = None;
                return Ok(None);
            }
            let counts = (containers.len(), sandboxes.len());
            match quiet {
                Some((since, c, s)) if (c, s) == counts => Ok((since.elapsed() >= STOP_QUIET).then_some(())),
                _ => {
                    quiet = Some((Instant::now(), counts.0, counts.1));
                    Ok(None)
                }
            }
        })?;
        Ok(started.elapsed())
    }

    /// Waits until the kubelet's garbage collection has removed every sandbox and container of `pod`
    /// from the runtime (it runs once a minute).
    pub fn wait_removed(&mut self, pod: &StaticPod, timeout: Duration) -> Result<Duration, KubeletError> {
        let full = pod.full_name(&self.settings.node_name);
        let started = Instant::now();
        let cri = self.connected_cri()?;
        wait_for(
            &format!("pod {full} to be garbage-collected"),
            timeout,
            Duration::from_millis(250),
            || {
                let left = cri.containers(&[(LABEL_POD_NAME, &full)])?.len()
                    + cri.pods(&[(LABEL_POD_NAME, &full)])?.len();
                Ok((left == 0).then_some(()))
            },
        )?;
        Ok(started.elapsed())
    }

    /// The pods the kubelet knows, with their status (its read-only `/pods`): how a test sees that
    /// admission refused a pod (`status.phase` Failed, `status.reason` UnexpectedAdmissionError).
    pub fn kubelet_pods(&self) -> Result<Value, KubeletError> {
        let body = http_get(self.settings.read_only_port, "/pods")?;
        serde_json::from_str(&body).map_err(|e| KubeletError::Command {
            command: format!("GET http://127.0.0.1:{}/pods", self.settings.read_only_port),
            detail: format!("not JSON: {e}"),
        })
    }

    /// The status of static pod `pod` as the kubelet reports it (None until it has one).
    pub fn kubelet_pod_status(&self, pod: &StaticPod) -> Result<Option<Value>, KubeletError> {
        let full = pod.full_name(&self.settings.node_name);
        let pods = self.kubelet_pods()?;
        let found =
            pods["items"].as_array().into_iter().flatten().find(|p| p["metadata"]["name"] == full.as_str());
        Ok(found.map(|p| p["status"].clone()))
    }

    /// The kubelet's device-manager checkpoint (allocations per pod UID, healthy devices per resource).
    pub fn checkpoint(&self) -> Result<Value, KubeletError> {
        let path = self.dirs.device_plugins().join(CHECKPOINT_FILE);
        let text = fs::read_to_string(&path).map_err(io("read", &path))?;
        serde_json::from_str(&text).map_err(|e| KubeletError::Command {
            command: format!("parse {}", path.display()),
            detail: e.to_string(),
        })
    }

    /// The device ids the kubelet allocated to `pod_uid` for `resource` (from its checkpoint), sorted.
    pub fn allocated(&self, pod_uid: &str, resource: &str) -> Result<Vec<String>, KubeletError> {
        let cp = self.checkpoint()?;
        let mut ids: Vec<String> = cp["Data"]["PodDeviceEntries"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["PodUID"] == pod_uid && e["ResourceName"] == resource)
            .flat_map(|e| e["DeviceIDs"].as_object().into_iter().flat_map(|m| m.values()))
            .flat_map(|ids| ids.as_array().into_iter().flatten())
            .filter_map(|id| id.as_str().map(str::to_owned))
            .collect();
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    /// The devices of `resource` the kubelet holds healthy (its checkpoint's `RegisteredDevices`, which
    /// it rewrites on every ListAndWatch update), sorted.
    pub fn healthy(&self, resource: &str) -> Result<Vec<String>, KubeletError> {
        let cp = self.checkpoint()?;
        let mut ids: Vec<String> = cp["Data"]["RegisteredDevices"][resource]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|id| id.as_str().map(str::to_owned))
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// What container `container` of `pod` (UID `uid`) wrote, from the kubelet's pod log
    /// (`/var/log/pods/<namespace>_<pod>_<uid>/<container>/0.log`), CRI log framing removed and
    /// partial lines joined.
    pub fn container_output(&self, pod: &StaticPod, uid: &str, container: &str) -> String {
        let dir = format!("{}_{}_{uid}", pod.namespace, pod.full_name(&self.settings.node_name));
        let path = self.dirs.pod_logs().join(dir).join(container).join("0.log");
        parse_cri_log(&fs::read_to_string(path).unwrap_or_default())
    }

    /// The last `lines` lines of the log of daemon `name` (`containerd`, `kubelet`, an extra).
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        process::log_tail(&self.dirs.logs.join(format!("{name}.log")), lines)
    }

    /// Stops everything, in the order a node is drained: the kubelet, then each pod through CRI (so
    /// containers and their shims exit), then the extra daemons and containerd; then checks that no
    /// process is left in the namespace but this one and removes the cgroups. Stops by PID only.
    pub fn shutdown(mut self) -> Result<ShutdownReport, KubeletError> {
        let mut report = ShutdownReport::default();
        if let Some(mut d) = self.kubelet.take() {
            d.stop(Duration::from_secs(10));
        }
        if self.containerd.as_ref().is_some_and(|c| c.exited().is_none()) {
            report.pods_removed = self.connected_cri()?.remove_all_pods()?;
        }
        for mut d in self.extras.drain(..).rev() {
            d.stop(Duration::from_secs(10));
        }
        self.cri = None;
        if let Some(mut d) = self.containerd.take() {
            d.stop(Duration::from_secs(10));
        }
        let stray = stray_processes();
        if !stray.is_empty() {
            for (pid, _) in &stray {
                let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
            }
            return Err(KubeletError::Command {
                command: "node shutdown".into(),
                detail: format!("processes left after every daemon stopped (killed now): {stray:?}"),
            });
        }
        if let Some(mut cg) = self.cgroup.take() {
            report.killed_in_cgroups = cg.kill_remaining();
            report.cgroups_removed = cg.tree().len();
            cg.remove(Duration::from_secs(10))?;
        }
        report.unmounted = crate::mounts::unmount_under(&self.dirs.kubelet_root);
        Ok(report)
    }
}

impl Drop for KubeNode {
    fn drop(&mut self) {
        // After a failure: the same order as shutdown, errors ignored; what is left the outer check
        // reports, and stray processes are killed so the cgroups can go.
        if let Some(mut d) = self.kubelet.take() {
            d.stop(Duration::from_secs(5));
        }
        if let Ok(cri) = self.connected_cri() {
            let _ = cri.remove_all_pods();
        }
        for mut d in self.extras.drain(..).rev() {
            d.stop(Duration::from_secs(5));
        }
        if let Some(mut d) = self.containerd.take() {
            d.stop(Duration::from_secs(5));
        }
        for (pid, _) in stray_processes() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        if let Some(cg) = self.cgroup.as_ref() {
            cg.kill_remaining();
        }
    }
}

/// Processes in this mount namespace other than this one (and its threads): shims or containers that
/// outlived their daemons.
fn stray_processes() -> Vec<(i32, String)> {
    let me = std::process::id() as i32;
    let Some(ns) = mount_ns_of("self") else { return Vec::new() };
    processes_in_mount_ns(&ns).into_iter().filter(|(pid, _)| *pid != me).collect()
}

/// A plain HTTP/1.0 GET on 127.0.0.1 (the kubelet's health and read-only ports); returns the body.
pub fn http_get(port: u16, path: &str) -> Result<String, KubeletError> {
    let err = |detail: String| KubeletError::Command {
        command: format!("GET http://127.0.0.1:{port}{path}"),
        detail,
    };
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| err(e.to_string()))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| err(e.to_string()))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(|e| err(e.to_string()))?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).map_err(|e| err(e.to_string()))?;
    let (head, body) = resp.split_once("\r\n\r\n").ok_or_else(|| err(format!("no HTTP body in {resp:?}")))?;
    if !(head.starts_with("HTTP/1.") && head.split(' ').nth(1).is_some_and(|c| c == "200")) {
        return Err(err(head.lines().next().unwrap_or("").to_owned()));
    }
    Ok(body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shadowed_path_has_its_own_directory() {
        let mut names: Vec<&str> = SHADOWED.iter().map(|(_, n)| *n).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), SHADOWED.len());
        assert!(SHADOWED.iter().all(|(h, _)| h.starts_with('/')));
        let dirs = NodeDirs::new(Path::new("/w/node"));
        assert_eq!(dirs.device_plugins(), Path::new("/w/node/device-plugins"));
    }
}
