//! One node of a many-node test cluster, run by its own process (`nvinject-cluster-node`) in mount and
//! network namespaces of its own: a kubelet hard-codes host paths (`/var/lib/kubelet`,
//! `/run/containerd`, ...) and ports, so two nodes cannot share one namespace. The test's process
//! (the parent, where the control plane runs) starts the agent under `unshare --mount --net`; the
//! agent wires its network to the parent's bridge, lays out the node ([`crate::prepare_node`]) with
//! the shared paths the DaemonSets name (the host root, the simulated node) shadowed by its own,
//! starts containerd and the kubelet, and then answers on stdin/stdout in JSON lines until told to
//! stop (or its stdin closes), when it drains the node and exits.
//!
//! Protocol: the spec arrives as the one argument (a JSON file, [`AgentSpec`]); the agent prints
//! `{"event":"started",...}` once the kubelet is healthy, then reads commands (`xid <gpu> <xid>`,
//! `stop`), and prints
//! `{"event":"stopped",...}` before it exits. Anything else it prints goes to its log.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nvinject_image_tool::image::BuiltImage;
use nvinject_node_harness::kubelet::KubeletError;
use nvinject_node_harness::namespace::Inside;
use nvinject_node_harness::process;
use serde_json::{Value, json};

use crate::net::ip;
use crate::{NodeSpec, artifacts::cluster_artifacts, prepare_node};

/// What the parent tells an agent (written to a file, read by the agent).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSpec {
    /// The node's name.
    pub name: String,
    /// Its address on the parent's bridge.
    pub address: String,
    /// The bridge's prefix length.
    pub prefix: u8,
    /// The parent's address on the bridge (the API server's, and the default route).
    pub gateway: String,
    /// The bridge in the parent's network namespace.
    pub bridge: String,
    /// The parent's PID (its network namespace gets the veth's other end and the pod route).
    pub parent_pid: u32,
    /// Labels the kubelet registers with.
    pub labels: Vec<(String, String)>,
    /// The kubelet's kubeconfig.
    pub kubeconfig: PathBuf,
    /// Images imported into its containerd.
    pub images: Vec<BuiltImage>,
    /// The node's own directory for its simulated node, shadowing `shared_sim_dir`.
    pub sim_dir: PathBuf,
    /// The simulated node's preset, built by the agent at `shared_sim_dir` (where its NVML and
    /// device nodes then say they are); `None`: a node without GPUs.
    pub sim_preset: Option<String>,
    /// `nvinject-simnode`.
    pub simnode: PathBuf,
    /// The path the DaemonSets name for the simulated node (the same on every node).
    pub shared_sim_dir: PathBuf,
    /// The node's own host root directory, shadowing `shared_host_root`.
    pub host_root_dir: PathBuf,
    /// The path the installer DaemonSet's `host-root` volume names (the same on every node).
    pub shared_host_root: PathBuf,
    /// Its pods' subnet.
    pub pod_subnet: String,
    /// How long after an exit its containerd is started again.
    pub containerd_restart_after: Duration,
}

impl AgentSpec {
    /// As JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name, "address": self.address, "prefix": self.prefix, "gateway": self.gateway,
            "bridge": self.bridge, "parent_pid": self.parent_pid,
            "labels": self.labels.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
            "kubeconfig": self.kubeconfig,
            "images": self.images.iter().map(|i| json!({ "tar": i.tar, "name": i.name })).collect::<Vec<_>>(),
            "sim_dir": self.sim_dir, "sim_preset": self.sim_preset, "simnode": self.simnode,
            "shared_sim_dir": self.shared_sim_dir,
            "host_root_dir": self.host_root_dir, "shared_host_root": self.shared_host_root,
            "pod_subnet": self.pod_subnet,
            "containerd_restart_after_ms": self.containerd_restart_after.as_millis() as u64,
        })
    }

    /// From JSON; the first missing or mistyped field is named.
    pub fn from_json(v: &Value) -> Result<Self, String> {
        let s = |k: &str| v[k].as_str().map(str::to_owned).ok_or_else(|| format!("field `{k}`: a string"));
        let p = |k: &str| s(k).map(PathBuf::from);
        let labels = v["labels"]
            .as_array()
            .ok_or("field `labels`: a list")?
            .iter()
            .map(|l| match (l[0].as_str(), l[1].as_str()) {
                (Some(k), Some(v)) => Ok((k.to_owned(), v.to_owned())),
                _ => Err(format!("field `labels`: [key, value] pairs, got {l}")),
            })
            .collect::<Result<_, _>>()?;
        let images = v["images"]
            .as_array()
            .ok_or("field `images`: a list")?
            .iter()
            .map(|i| match (i["tar"].as_str(), i["name"].as_str()) {
                (Some(t), Some(n)) => Ok(BuiltImage { tar: t.into(), name: n.into() }),
                _ => Err(format!("field `images`: {{tar, name}} objects, got {i}")),
            })
            .collect::<Result<_, _>>()?;
        Ok(AgentSpec {
            name: s("name")?,
            address: s("address")?,
            prefix: v["prefix"].as_u64().and_then(|p| u8::try_from(p).ok()).ok_or("field `prefix`: 0-32")?,
            gateway: s("gateway")?,
            bridge: s("bridge")?,
            parent_pid: v["parent_pid"]
                .as_u64()
                .and_then(|p| u32::try_from(p).ok())
                .ok_or("field `parent_pid`")?,
            labels,
            kubeconfig: p("kubeconfig")?,
            images,
            sim_dir: p("sim_dir")?,
            sim_preset: match &v["sim_preset"] {
                Value::Null => None,
                Value::String(p) => Some(p.clone()),
                other => return Err(format!("field `sim_preset`: a string or null, got {other}")),
            },
            simnode: p("simnode")?,
            shared_sim_dir: p("shared_sim_dir")?,
            host_root_dir: p("host_root_dir")?,
            shared_host_root: p("shared_host_root")?,
            pod_subnet: s("pod_subnet")?,
            containerd_restart_after: Duration::from_millis(
                v["containerd_restart_after_ms"]
                    .as_u64()
                    .ok_or("field `containerd_restart_after_ms`: milliseconds")?,
            ),
        })
    }

    /// The veth end left in the parent's namespace (on its bridge); at most 15 bytes.
    pub fn parent_link(&self) -> String {
        let last = self.address.rsplit('.').next().unwrap_or("0");
        format!("nvi-node{last}")
    }
}

/// `ip` in the parent's network namespace.
fn parent_ip(spec: &AgentSpec, args: &[&str]) -> Result<(), KubeletError> {
    let netns = format!("--net=/proc/{}/ns/net", spec.parent_pid);
    process::run(Command::new("nsenter").arg(netns).arg("ip").args(args))?;
    Ok(())
}

/// The node's network: a veth pair whose parent end joins the bridge, the address and the default
/// route on this end, forwarding on (pods reach the API server through the node), and the parent's
/// route to this node's pods. The pair and the route go when this namespace goes.
fn wire_network(spec: &AgentSpec) -> Result<(), KubeletError> {
    let link = spec.parent_link();
    ip(&[
        "link",
        "add",
        "eth0",
        "type",
        "veth",
        "peer",
        "name",
        &link,
        "netns",
        &spec.parent_pid.to_string(),
    ])?;
    ip(&["addr", "add", &format!("{}/{}", spec.address, spec.prefix), "dev", "eth0"])?;
    ip(&["link", "set", "eth0", "up"])?;
    ip(&["route", "add", "default", "via", &spec.gateway])?;
    // This namespace's own forwarding switch (net.* sysctls are per network namespace).
    let forward = Path::new("/proc/sys/net/ipv4/ip_forward");
    std::fs::write(forward, "1").map_err(|source| KubeletError::Io {
        op: "write",
        path: forward.into(),
        source,
    })?;
    parent_ip(spec, &["link", "set", &link, "master", &spec.bridge, "up"])?;
    parent_ip(spec, &["route", "add", &spec.pod_subnet, "via", &spec.address])?;
    Ok(())
}

fn emit(event: Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{event}");
    let _ = out.flush();
}

/// The agent's body: `spec_file` holds an [`AgentSpec`]. Returns once the node is drained.
pub fn run(spec_file: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(spec_file).map_err(|e| format!("{}: {e}", spec_file.display()))?;
    let value: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", spec_file.display()))?;
    let spec = AgentSpec::from_json(&value).map_err(|e| format!("{}: {e}", spec_file.display()))?;
    let inside = Inside::enter().map_err(|e| e.to_string())?;
    let started = Instant::now();
    wire_network(&spec).map_err(|e| e.to_string())?;
    let artifacts = cluster_artifacts().map_err(|e| e.to_string())?;
    // The DaemonSets name one host root and one simulated node for every node: here they are this
    // node's own.
    for dir in [&spec.host_root_dir, &spec.sim_dir] {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    inside.shadow(&spec.shared_sim_dir, &spec.sim_dir).map_err(|e| e.to_string())?;
    if let Some(preset) = &spec.sim_preset {
        let mut build = Command::new(&spec.simnode);
        build.args(["build", "--preset", preset, "--out"]).arg(&spec.shared_sim_dir);
        process::run(&mut build).map_err(|e| e.to_string())?;
    }
    // The host root is made at the shared path, over this node's own directory: its files land in
    // that directory, its bind mounts exist in this namespace only.
    inside.shadow(&spec.shared_host_root, &spec.host_root_dir).map_err(|e| e.to_string())?;
    let node_spec = NodeSpec {
        name: spec.name.clone(),
        address: spec.address.clone(),
        labels: spec.labels.clone(),
        kubeconfig: spec.kubeconfig.clone(),
        images: spec.images.clone(),
        sim_dir: spec.shared_sim_dir.clone(),
        pod_subnet: spec.pod_subnet.clone(),
        host_root_dir: spec.shared_host_root.clone(),
        containerd_restart_after: spec.containerd_restart_after,
    };
    let (prepared, mut host_root) =
        prepare_node(&inside, &artifacts, &node_spec).map_err(|e| e.to_string())?;
    let kubelet_starting = started.elapsed();
    let node = prepared.start().map_err(|e| e.to_string())?;
    emit(json!({
        "event": "started",
        "name": spec.name,
        "containerd_pid": node.containerd_pid(),
        "layout_ms": kubelet_starting.as_millis() as u64,
        "ready_ms": started.elapsed().as_millis() as u64,
    }));
    // Commands until `stop` or the parent goes (stdin closed).
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["stop"] => break,
            // An XID on one of this node's simulated GPUs (the simulated node's files are this
            // namespace's).
            ["xid", gpu, xid] => {
                let mut inject = Command::new(&spec.simnode);
                inject.args(["xid", "--node"]).arg(spec.shared_sim_dir.join("node.json"));
                inject.args(["--gpu", gpu, "--xid", xid]);
                let result = process::run(&mut inject).map(|_| ()).map_err(|e| e.to_string());
                emit(json!({ "event": "xid", "ok": result.is_ok(), "error": result.err() }));
            }
            _ => emit(json!({ "event": "error", "message": format!("unknown command {line:?}") })),
        }
    }
    let report = node.shutdown().map_err(|e| e.to_string())?;
    host_root.unmount().map_err(|e| e.to_string())?;
    emit(json!({
        "event": "stopped",
        "name": spec.name,
        "pods_removed": report.pods_removed,
        "cgroups_removed": report.cgroups_removed,
        "killed_in_cgroups": report.killed_in_cgroups,
    }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_goes_through_json_and_a_bad_one_names_its_field() {
        let spec = AgentSpec {
            name: "gpu-a".into(),
            address: "10.77.0.11".into(),
            prefix: 24,
            gateway: "10.77.0.254".into(),
            bridge: "nvi-br0".into(),
            parent_pid: 42,
            labels: vec![("nvidia.com/gpu.present".into(), "true".into())],
            kubeconfig: "/w/kubelet-gpu-a.kubeconfig".into(),
            images: vec![BuiltImage { tar: "/w/i.tar".into(), name: "localhost/i:1".into() }],
            sim_dir: "/w/nodes/gpu-a/sim".into(),
            sim_preset: Some("h100x8".into()),
            simnode: "/t/nvinject-simnode".into(),
            shared_sim_dir: "/w/sim".into(),
            host_root_dir: "/w/nodes/gpu-a/host-root".into(),
            shared_host_root: "/w/host-root".into(),
            pod_subnet: "10.88.11.0/24".into(),
            containerd_restart_after: Duration::from_secs(5),
        };
        assert_eq!(AgentSpec::from_json(&spec.to_json()).unwrap(), spec);
        assert_eq!(spec.parent_link(), "nvi-node11");
        let mut bad = spec.to_json();
        bad["prefix"] = json!("24");
        assert!(AgentSpec::from_json(&bad).unwrap_err().contains("prefix"));
    }
}
