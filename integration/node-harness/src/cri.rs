//! A small CRI client (the kubelet's side of containerd's CRI plugin) over the real gRPC unix socket,
//! with blocking wrappers so tests read top to bottom. It plays the kubelet (run a pod, create and
//! start containers) for the tests that have none, and watches what a real kubelet did (pods and
//! containers found by the labels it sets, their state) on a test node.
//!
//! Pods use the host network, so no CNI plugin is needed; container logs go to a directory the test
//! owns and are read back in CRI's log format.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    Container, ContainerConfig, ContainerFilter, ContainerMetadata, ContainerState, ContainerStatus,
    ContainerStatusRequest, CreateContainerRequest, ImageSpec, KeyValue, LinuxContainerConfig,
    LinuxContainerSecurityContext, LinuxPodSandboxConfig, LinuxSandboxSecurityContext, ListContainersRequest,
    ListPodSandboxRequest, NamespaceMode, NamespaceOption, PodSandbox, PodSandboxConfig, PodSandboxFilter,
    PodSandboxMetadata, PodSandboxState, RemovePodSandboxRequest, RunPodSandboxRequest,
    StartContainerRequest, StatusRequest, StopPodSandboxRequest, VersionRequest,
};
use tonic::transport::{Channel, Endpoint};

use crate::error::{HarnessError, Result};
use crate::process;

/// Label the kubelet puts on sandboxes and containers: the pod's name (for static pods, `<name>-<node>`).
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// Label the kubelet puts on containers: the container's name in the pod spec.
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";

/// A connected CRI client with its own single-threaded runtime, so tests stay synchronous.
#[derive(Debug)]
pub struct CriClient {
    socket: PathBuf,
    rt: tokio::runtime::Runtime,
    runtime: RuntimeServiceClient<Channel>,
}

/// A running pod sandbox.
#[derive(Debug, Clone)]
pub struct Pod {
    /// Sandbox id.
    pub id: String,
    /// The config it was created with (CreateContainer needs it again).
    pub config: PodSandboxConfig,
    /// Where its container logs go.
    pub log_dir: PathBuf,
}

/// A container to create in a pod.
#[derive(Debug, Clone, Default)]
pub struct ContainerRequest {
    /// Container name (also its log file name).
    pub name: String,
    /// Image reference.
    pub image: String,
    /// Command (replaces the image's entrypoint/cmd when set).
    pub command: Vec<String>,
    /// Container annotations (passed to the runtime only if the handler lists them in
    /// `container_annotations`).
    pub annotations: HashMap<String, String>,
    /// Environment.
    pub env: Vec<(String, String)>,
    /// Privileged container.
    pub privileged: bool,
}

/// A gRPC channel to the unix socket at `socket` (tonic dials `unix://` URIs itself).
async fn unix_channel(socket: &Path) -> std::result::Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(format!("unix://{}", socket.display()))?.connect().await
}

fn cri_err(call: &'static str, socket: &Path) -> impl FnOnce(tonic::Status) -> HarnessError + use<> {
    let socket = socket.to_path_buf();
    move |s| HarnessError::Cri { call, socket, message: format!("{}: {}", s.code(), s.message()) }
}

/// Host network (the test nodes have no CNI), for a pod and each of its containers.
fn host_network() -> Option<NamespaceOption> {
    Some(NamespaceOption { network: NamespaceMode::Node as i32, ..Default::default() })
}

impl CriClient {
    /// Connects to containerd's CRI endpoint at `socket`.
    pub fn connect(socket: &Path) -> Result<CriClient> {
        let failed =
            |message: String| HarnessError::Cri { call: "connect", socket: socket.to_path_buf(), message };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| failed(e.to_string()))?;
        let channel = rt.block_on(unix_channel(socket)).map_err(|e| failed(e.to_string()))?;
        Ok(CriClient { socket: socket.to_path_buf(), rt, runtime: RuntimeServiceClient::new(channel) })
    }

    /// The runtime's name and version (`containerd 1.6.20~ds1`).
    pub fn version(&mut self) -> Result<String> {
        let req = VersionRequest { version: "v1".into() };
        let r = self.rt.block_on(self.runtime.version(req)).map_err(cri_err("Version", &self.socket))?;
        let r = r.into_inner();
        Ok(format!("{} {}", r.runtime_name, r.runtime_version))
    }

    /// The runtime's conditions (`RuntimeReady`, `NetworkReady`) and whether each holds.
    pub fn conditions(&mut self) -> Result<Vec<(String, bool)>> {
        let req = StatusRequest { verbose: false };
        let r = self.rt.block_on(self.runtime.status(req)).map_err(cri_err("Status", &self.socket))?;
        Ok(r.into_inner()
            .status
            .map(|s| s.conditions.into_iter().map(|c| (c.r#type, c.status)).collect())
            .unwrap_or_default())
    }

    /// Starts a host-network pod sandbox with `runtime_handler` (empty: the default runtime), its
    /// cgroups under `cgroup_parent` (e.g. [`crate::containerd::Containerd::cgroup_parent`]).
    pub fn run_pod(
        &mut self,
        name: &str,
        runtime_handler: &str,
        log_root: &Path,
        cgroup_parent: &str,
        annotations: HashMap<String, String>,
    ) -> Result<Pod> {
        let uid = format!("{name}-uid");
        let log_dir = log_root.join(format!("default_{name}_{uid}"));
        std::fs::create_dir_all(&log_dir).map_err(crate::error::io("create", &log_dir))?;
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid,
                namespace: "default".into(),
                attempt: 0,
            }),
            hostname: String::new(),
            log_directory: log_dir.to_string_lossy().into_owned(),
            annotations,
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: cgroup_parent.into(),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: host_network(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let req =
            RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: runtime_handler.into() };
        let resp = self
            .rt
            .block_on(self.runtime.run_pod_sandbox(req))
            .map_err(cri_err("RunPodSandbox", &self.socket))?;
        Ok(Pod { id: resp.into_inner().pod_sandbox_id, config, log_dir })
    }

    /// Creates a container in `pod`.
    pub fn create_container(&mut self, pod: &Pod, request: &ContainerRequest) -> Result<String> {
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata { name: request.name.clone(), attempt: 0 }),
            image: Some(ImageSpec { image: request.image.clone(), ..Default::default() }),
            command: request.command.clone(),
            envs: request.env.iter().map(|(k, v)| KeyValue { key: k.clone(), value: v.clone() }).collect(),
            annotations: request.annotations.clone(),
            log_path: format!("{}.log", request.name),
            linux: Some(LinuxContainerConfig {
                security_context: Some(LinuxContainerSecurityContext {
                    privileged: request.privileged,
                    namespace_options: host_network(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let req = CreateContainerRequest {
            pod_sandbox_id: pod.id.clone(),
            config: Some(config),
            sandbox_config: Some(pod.config.clone()),
        };
        let resp = self
            .rt
            .block_on(self.runtime.create_container(req))
            .map_err(cri_err("CreateContainer", &self.socket))?;
        Ok(resp.into_inner().container_id)
    }

    /// Starts a created container.
    pub fn start_container(&mut self, id: &str) -> Result<()> {
        let req = StartContainerRequest { container_id: id.into() };
        self.rt
            .block_on(self.runtime.start_container(req))
            .map_err(cri_err("StartContainer", &self.socket))?;
        Ok(())
    }

    /// Waits until the container has exited; returns its exit code.
    pub fn wait_exited(&mut self, id: &str, timeout: Duration) -> Result<i32> {
        process::wait_for(&format!("container {id} to exit"), timeout, || {
            let req = ContainerStatusRequest { container_id: id.into(), verbose: false };
            let status = self.rt.block_on(self.runtime.container_status(req)).ok()?.into_inner().status?;
            (status.state == ContainerState::ContainerExited as i32).then_some(status.exit_code)
        })
    }

    /// Pod sandboxes carrying all of `labels`.
    pub fn pods(&mut self, labels: &[(&str, &str)]) -> Result<Vec<PodSandbox>> {
        let filter = PodSandboxFilter { label_selector: selector(labels), ..Default::default() };
        let req = ListPodSandboxRequest { filter: Some(filter) };
        let r = self
            .rt
            .block_on(self.runtime.list_pod_sandbox(req))
            .map_err(cri_err("ListPodSandbox", &self.socket))?;
        Ok(r.into_inner().items)
    }

    /// Containers carrying all of `labels`.
    pub fn containers(&mut self, labels: &[(&str, &str)]) -> Result<Vec<Container>> {
        let filter = ContainerFilter { label_selector: selector(labels), ..Default::default() };
        let req = ListContainersRequest { filter: Some(filter) };
        let r = self
            .rt
            .block_on(self.runtime.list_containers(req))
            .map_err(cri_err("ListContainers", &self.socket))?;
        Ok(r.into_inner().containers)
    }

    /// The status of one container, with the runtime's verbose info (containerd puts the OCI spec and
    /// the PID there).
    pub fn container_status(
        &mut self,
        id: &str,
    ) -> Result<(Option<ContainerStatus>, HashMap<String, String>)> {
        let req = ContainerStatusRequest { container_id: id.to_owned(), verbose: true };
        let r = self
            .rt
            .block_on(self.runtime.container_status(req))
            .map_err(cri_err("ContainerStatus", &self.socket))?
            .into_inner();
        Ok((r.status, r.info))
    }

    /// The message lines a container wrote to stdout/stderr (CRI log prefixes stripped).
    pub fn logs(&self, pod: &Pod, name: &str) -> String {
        parse_cri_log(&std::fs::read_to_string(pod.log_dir.join(format!("{name}.log"))).unwrap_or_default())
    }

    /// Stops and removes the pod (and its containers).
    pub fn remove_pod(&mut self, pod: &Pod) -> Result<()> {
        self.remove_pod_sandbox(&pod.id)
    }

    /// Stops and removes every pod sandbox (and so its containers). Returns how many there were.
    pub fn remove_all_pods(&mut self) -> Result<usize> {
        let pods = self.pods(&[])?;
        for pod in &pods {
            self.remove_pod_sandbox(&pod.id)?;
        }
        Ok(pods.len())
    }

    fn remove_pod_sandbox(&mut self, id: &str) -> Result<()> {
        let stop = StopPodSandboxRequest { pod_sandbox_id: id.to_owned() };
        self.rt
            .block_on(self.runtime.stop_pod_sandbox(stop))
            .map_err(cri_err("StopPodSandbox", &self.socket))?;
        let remove = RemovePodSandboxRequest { pod_sandbox_id: id.to_owned() };
        self.rt
            .block_on(self.runtime.remove_pod_sandbox(remove))
            .map_err(cri_err("RemovePodSandbox", &self.socket))?;
        Ok(())
    }
}

fn selector(labels: &[(&str, &str)]) -> HashMap<String, String> {
    labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// Whether a CRI container is running.
pub fn is_running(c: &Container) -> bool {
    c.state == ContainerState::ContainerRunning as i32
}

/// Whether a pod sandbox is ready (its pause container runs).
pub fn is_ready(p: &PodSandbox) -> bool {
    p.state == PodSandboxState::SandboxReady as i32
}

/// The messages of a CRI log file (`<time> <stream> <P|F> <message>` per line), partial (`P`) lines
/// joined to the line they continue.
pub fn parse_cri_log(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut parts = line.splitn(4, ' ');
        let (_, _, tag, msg) = (parts.next(), parts.next(), parts.next(), parts.next().unwrap_or(""));
        out.push_str(msg);
        if tag != Some("P") {
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_log_partial_lines_are_joined_and_framing_removed() {
        let log = "2026-01-01T00:00:00.1Z stdout P NVINJECT-PROBE {\"a\":\n\
                   2026-01-01T00:00:00.2Z stdout F 1}\n\
                   2026-01-01T00:00:00.3Z stderr F second line\n";
        assert_eq!(parse_cri_log(log), "NVINJECT-PROBE {\"a\":1}\nsecond line\n");
    }
}
