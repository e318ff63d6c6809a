//! A cluster of many nodes: the control plane in the test's namespaces, on a bridge, and each node
//! run by its own agent process ([`crate::agent`]) in namespaces of its own, joined one after
//! another. The harness for issue 15's multi-node test and join bench.
//!
//! Addresses: the bridge carries the API server at [`API_ADDRESS`]; node `i` (1-based, in join
//! order) is `10.77.0.<10+i>` with pods in `10.88.<10+i>.0/24`. Nothing leaves the test's network
//! namespace and the nodes' own.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use nvinject_image_tool::image::BuiltImage;
use nvinject_node_harness::kubelet::KubeletError;
use nvinject_node_harness::namespace::{CGROUP_ENV, DIR_ENV, Inside, cgroup_name_for, mount_ns_of};
use nvinject_node_harness::process;
use nvinject_simnode::artifacts::artifact;
use serde_json::Value;

use crate::ClusterArtifacts;
use crate::agent::AgentSpec;
use crate::control_plane::ControlPlane;
use crate::net::ip;

/// The bridge in the test's network namespace the nodes join.
pub const BRIDGE: &str = "nvi-br0";
/// The API server's address, on the bridge.
pub const API_ADDRESS: &str = "10.77.0.254";

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> KubeletError + use<> {
    let path = path.to_path_buf();
    move |source| KubeletError::Io { op, path, source }
}

/// What a node brings to the cluster.
#[derive(Debug, Clone)]
pub struct JoinSpec {
    /// The node's name.
    pub name: String,
    /// The labels it registers with (the GPU nodes: `nvidia.com/gpu.present=true`).
    pub labels: Vec<(String, String)>,
    /// Images imported into its containerd.
    pub images: Vec<BuiltImage>,
    /// Its simulated node's preset (built by its agent); `None`: no GPU.
    pub preset: Option<String>,
    /// `nvinject-simnode`.
    pub simnode: PathBuf,
    /// How long after an exit its containerd is started again (`crate::CONTAINERD_RESTART_DELAY`
    /// models containerd's systemd unit).
    pub containerd_restart_after: Duration,
}

/// A node agent and what it reported.
#[derive(Debug)]
struct Agent {
    child: Child,
    stdin: Option<ChildStdin>,
    events: Receiver<Value>,
    log: PathBuf,
    sim_dir: PathBuf,
    cgroup: String,
}

/// A joined node.
#[derive(Debug, Clone)]
pub struct Joined {
    /// When the join began (the agent was started).
    pub began: Instant,
    /// From the start to the kubelet being healthy (containerd up, images imported).
    pub kubelet_healthy: Duration,
    /// The node's address.
    pub address: String,
}

/// A control plane and the nodes joined to it.
#[derive(Debug)]
pub struct Fleet {
    dir: PathBuf,
    tag: String,
    control: Option<ControlPlane>,
    agents: BTreeMap<String, Agent>,
    joined: usize,
    bridge_up: bool,
    shared_sim_dir: PathBuf,
    shared_host_root: PathBuf,
}

impl Fleet {
    /// The bridge, then the control plane on it; files under `<work>/fleet`.
    pub fn start(inside: &Inside, artifacts: &ClusterArtifacts) -> Result<Self, KubeletError> {
        Fleet::start_in(inside, artifacts, "")
    }

    /// [`Fleet::start`] with `tag` (a few characters) in its directory's and its nodes' names, for
    /// several fleets one after another in one test.
    pub fn start_in(inside: &Inside, artifacts: &ClusterArtifacts, tag: &str) -> Result<Self, KubeletError> {
        let dir = inside.work().join(format!("fleet{tag}"));
        std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        ip(&["link", "add", BRIDGE, "type", "bridge"])?;
        let mut fleet = Fleet {
            shared_sim_dir: inside.work().join("sim"),
            shared_host_root: inside.work().join("host-root"),
            dir: dir.clone(),
            tag: tag.to_owned(),
            control: None,
            agents: BTreeMap::new(),
            joined: 0,
            bridge_up: true,
        };
        for d in [&fleet.shared_sim_dir, &fleet.shared_host_root] {
            std::fs::create_dir_all(d).map_err(io("create", d))?;
        }
        ip(&["addr", "add", &format!("{API_ADDRESS}/24"), "dev", BRIDGE])?;
        ip(&["link", "set", BRIDGE, "up"])?;
        // The control plane's own first node name is unused: nodes get kubeconfigs as they join.
        let (control, _) = ControlPlane::start(artifacts, &dir.join("control-plane"), API_ADDRESS, "unused")?;
        fleet.control = Some(control);
        Ok(fleet)
    }

    /// The path every node shows its own simulated node at (what the DaemonSets' overlay names).
    pub fn shared_sim_dir(&self) -> &Path {
        &self.shared_sim_dir
    }

    /// The path every node shows its own host root at (the installer's `host-root` volume).
    pub fn shared_host_root(&self) -> &Path {
        &self.shared_host_root
    }

    /// The control plane.
    pub fn control(&mut self) -> &mut ControlPlane {
        self.control.as_mut().expect("the control plane runs until stop")
    }

    /// `kubectl get <args> -o json`.
    pub fn get_json(&self, args: &[&str]) -> Result<Value, KubeletError> {
        self.control.as_ref().expect("the control plane runs until stop").get_json(args)
    }

    /// Starts an agent for `spec` and waits until its kubelet is healthy (it registers on its own).
    pub fn join(&mut self, spec: &JoinSpec) -> Result<Joined, KubeletError> {
        self.joined += 1;
        let n = 10 + self.joined;
        let address = format!("10.77.0.{n}");
        let node_dir = self.dir.join("nodes").join(format!("{}-{}", spec.name, self.joined));
        std::fs::create_dir_all(&node_dir).map_err(io("create", &node_dir))?;
        let kubeconfig = self.control().node_kubeconfig(&spec.name)?;
        let agent_spec = AgentSpec {
            name: spec.name.clone(),
            address: address.clone(),
            prefix: 24,
            gateway: API_ADDRESS.into(),
            bridge: BRIDGE.into(),
            parent_pid: std::process::id(),
            labels: spec.labels.clone(),
            kubeconfig,
            images: spec.images.clone(),
            sim_dir: node_dir.join("sim"),
            sim_preset: spec.preset.clone(),
            simnode: spec.simnode.clone(),
            shared_sim_dir: self.shared_sim_dir.clone(),
            host_root_dir: node_dir.join("host-root"),
            shared_host_root: self.shared_host_root.clone(),
            pod_subnet: format!("10.88.{n}.0/24"),
            containerd_restart_after: spec.containerd_restart_after,
        };
        let spec_file = node_dir.join("agent.json");
        std::fs::write(&spec_file, agent_spec.to_json().to_string()).map_err(io("write", &spec_file))?;
        // The agent's work directory, short: the kubelet's root dir is below it and its pod-resources
        // socket must fit a unix socket path (107 bytes). Its cgroup is named after the test's.
        let work = self.dir.parent().unwrap_or(&self.dir).join(format!("{}n{}", self.tag, self.joined));
        let cgroup = format!("{}-{}n{}", inside_cgroup(&self.dir), self.tag, self.joined);
        std::fs::create_dir_all(&work).map_err(io("create", &work))?;
        let log = node_dir.join("agent.log");
        let err = std::fs::File::create(&log).map_err(io("create", &log))?;
        let began = Instant::now();
        let mut child = Command::new("unshare")
            .args(["--mount", "--net", "--propagation", "private", "--"])
            .arg(agent_binary())
            .arg(&spec_file)
            .env(DIR_ENV, &work)
            .env(CGROUP_ENV, &cgroup)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .map_err(|e| KubeletError::Command {
                command: "unshare nvinject-cluster-node".into(),
                detail: e.to_string(),
            })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && tx.send(v).is_err()
                {
                    return;
                }
            }
        });
        let mut agent =
            Agent { child, stdin, events: rx, log: log.clone(), sim_dir: node_dir.join("sim"), cgroup };
        let started = agent.wait_event("started", Duration::from_secs(180));
        self.agents.insert(spec.name.clone(), agent);
        started?;
        Ok(Joined { began, kubelet_healthy: began.elapsed(), address })
    }

    /// Stops node `name`'s agent (its kubelet, pods and containerd drained, its namespaces gone) and
    /// returns what it reported; the Node object stays until deleted.
    pub fn leave(&mut self, name: &str) -> Result<Value, KubeletError> {
        let mut agent = self.agents.remove(name).ok_or_else(|| KubeletError::Command {
            command: format!("leave {name}"),
            detail: "no such node".into(),
        })?;
        agent.stop(Duration::from_secs(120))
    }

    /// Waits until node `name` is Ready at the API server.
    pub fn wait_ready(&mut self, name: &str, timeout: Duration) -> Result<Value, KubeletError> {
        crate::wait_node_ready(self.control(), name, timeout)
    }

    /// Node `name`'s simulated node as this process sees it (its `node.json`, for UUIDs and names).
    pub fn sim_dir(&self, name: &str) -> Option<&Path> {
        self.agents.get(name).map(|a| a.sim_dir.as_path())
    }

    /// Injects XID `xid` on GPU `gpu` of node `name` (through its agent, in its namespaces).
    pub fn xid(&mut self, name: &str, gpu: u32, xid: u64) -> Result<(), KubeletError> {
        let agent = self.agents.get_mut(name).ok_or_else(|| KubeletError::Command {
            command: format!("xid on {name}"),
            detail: "no such node".into(),
        })?;
        if let Some(stdin) = agent.stdin.as_mut() {
            writeln!(stdin, "xid {gpu} {xid}").map_err(io("write to agent", &agent.log))?;
        }
        let answer = agent.wait_event("xid", Duration::from_secs(30))?;
        if answer["ok"] != true {
            return Err(KubeletError::Command {
                command: format!("xid on {name}"),
                detail: answer["error"].to_string(),
            });
        }
        Ok(())
    }

    /// The memory node `name` holds, in bytes: the resident sets of the processes in its agent's mount
    /// namespace (the agent, containerd, the kubelet, the shims) and in its cgroups (its pods).
    /// Pages shared between nodes (the binaries' text) count once per node.
    pub fn node_memory(&self, name: &str) -> Option<u64> {
        let agent = self.agents.get(name)?;
        let ns = mount_ns_of(&agent.child.id().to_string())?;
        let mut total = 0;
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let pid = entry.file_name().to_string_lossy().into_owned();
            if !pid.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            let mine = mount_ns_of(&pid).as_ref() == Some(&ns)
                || cgroups.lines().any(|l| l.contains(&format!("/{}/", agent.cgroup)));
            if mine {
                total += resident_bytes(&pid);
            }
        }
        Some(total)
    }

    /// The last lines of node `name`'s agent log (its daemons' start-up and errors).
    pub fn agent_log(&self, name: &str, lines: usize) -> String {
        self.agents.get(name).map(|a| process::log_tail(&a.log, lines)).unwrap_or_default()
    }

    /// Stops every node, then the control plane, then removes the bridge.
    pub fn stop(mut self) -> Result<Vec<Value>, KubeletError> {
        let mut reports = Vec::new();
        let names: Vec<String> = self.agents.keys().cloned().collect();
        for name in names {
            reports.push(self.leave(&name)?);
        }
        if let Some(mut c) = self.control.take() {
            c.stop();
        }
        ip(&["link", "del", BRIDGE])?;
        self.bridge_up = false;
        Ok(reports)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for (_, mut agent) in std::mem::take(&mut self.agents) {
            let _ = agent.stop(Duration::from_secs(60));
        }
        if let Some(mut c) = self.control.take() {
            c.stop();
        }
        if self.bridge_up {
            let _ = ip(&["link", "del", BRIDGE]);
        }
    }
}

impl Agent {
    fn wait_event(&mut self, event: &str, timeout: Duration) -> Result<Value, KubeletError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(v) if v["event"] == event => return Ok(v),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.try_wait().ok().flatten();
                    return Err(KubeletError::Command {
                        command: "nvinject-cluster-node".into(),
                        detail: format!(
                            "no `{event}` after {timeout:?} (agent {}); its log:\n{}",
                            status.map_or("running".to_owned(), |s| s.to_string()),
                            process::log_tail(&self.log, 30)
                        ),
                    });
                }
            }
        }
    }

    /// Asks the agent to drain its node, waits for its report and its exit.
    fn stop(&mut self, timeout: Duration) -> Result<Value, KubeletError> {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = writeln!(stdin, "stop");
        }
        let report = self.wait_event("stopped", timeout);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        report
    }
}

/// `VmRSS` of process `pid`, in bytes (0 once it is gone).
fn resident_bytes(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// The test's cgroup name (its work directory's), from the fleet's directory below it.
fn inside_cgroup(fleet_dir: &Path) -> String {
    cgroup_name_for(fleet_dir.parent().unwrap_or(fleet_dir))
}

/// The agent binary (`nvinject-cluster-node`, this crate's), found or built fresh by package like
/// every other binary the tests run ([`nvinject_simnode::artifacts::artifact`]; a test crate's
/// `cargo test` builds only its own package's binaries, not this one). Under
/// `NVINJECT_ARTIFACTS_DIR` it is that build's agent, as the probe is that build's probe.
fn agent_binary() -> PathBuf {
    artifact(env!("CARGO_PKG_NAME"), "nvinject-cluster-node")
}
