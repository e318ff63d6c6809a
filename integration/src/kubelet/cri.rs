//! A small blocking CRI (v1) client over containerd's unix socket, for what a node test asks: which pod
//! sandboxes and containers exist (found by the labels the kubelet sets), their state, and removing them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    Container, ContainerFilter, ContainerState, ContainerStatus, ContainerStatusRequest,
    ListContainersRequest, ListPodSandboxRequest, PodSandbox, PodSandboxFilter, PodSandboxState,
    RemovePodSandboxRequest, StatusRequest, StopPodSandboxRequest, VersionRequest,
};
use tonic::transport::Channel;

use super::KubeletError;

/// Label the kubelet puts on sandboxes and containers: the pod's name (for static pods, `<name>-<node>`).
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// Label the kubelet puts on sandboxes and containers: the pod's namespace.
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Label the kubelet puts on containers: the container's name in the pod spec.
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";

/// A connected CRI client with its own single-threaded runtime, so tests stay synchronous.
#[derive(Debug)]
pub struct Cri {
    socket: PathBuf,
    rt: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
}

impl Cri {
    /// Connects to the CRI runtime service on `socket`.
    pub fn connect(socket: &Path) -> Result<Self, KubeletError> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|source| {
            KubeletError::Io { op: "start a tokio runtime for", path: socket.to_path_buf(), source }
        })?;
        let channel = rt.block_on(crate::cri::unix_channel(socket)).map_err(|e| KubeletError::Cri {
            call: "connect",
            socket: socket.to_path_buf(),
            detail: e.to_string(),
        })?;
        Ok(Cri { socket: socket.to_path_buf(), rt, client: RuntimeServiceClient::new(channel) })
    }

    fn err(&self, call: &'static str, status: tonic::Status) -> KubeletError {
        KubeletError::Cri {
            call,
            socket: self.socket.clone(),
            detail: format!("{}: {}", status.code(), status.message()),
        }
    }

    /// The runtime's name and version (`containerd 1.6.20~ds1`).
    pub fn version(&mut self) -> Result<String, KubeletError> {
        let mut c = self.client.clone();
        let r = self
            .rt
            .block_on(c.version(VersionRequest { version: "v1".into() }))
            .map_err(|s| self.err("Version", s))?
            .into_inner();
        Ok(format!("{} {}", r.runtime_name, r.runtime_version))
    }

    /// The runtime's conditions (`RuntimeReady`, `NetworkReady`) and whether each holds.
    pub fn conditions(&mut self) -> Result<Vec<(String, bool)>, KubeletError> {
        let mut c = self.client.clone();
        let r = self
            .rt
            .block_on(c.status(StatusRequest { verbose: false }))
            .map_err(|s| self.err("Status", s))?
            .into_inner();
        Ok(r.status
            .map(|s| s.conditions.into_iter().map(|c| (c.r#type, c.status)).collect())
            .unwrap_or_default())
    }

    /// Pod sandboxes carrying all of `labels`.
    pub fn pods(&mut self, labels: &[(&str, &str)]) -> Result<Vec<PodSandbox>, KubeletError> {
        let filter = PodSandboxFilter { label_selector: selector(labels), ..Default::default() };
        let mut c = self.client.clone();
        let r = self
            .rt
            .block_on(c.list_pod_sandbox(ListPodSandboxRequest { filter: Some(filter) }))
            .map_err(|s| self.err("ListPodSandbox", s))?;
        Ok(r.into_inner().items)
    }

    /// Containers carrying all of `labels`.
    pub fn containers(&mut self, labels: &[(&str, &str)]) -> Result<Vec<Container>, KubeletError> {
        let filter = ContainerFilter { label_selector: selector(labels), ..Default::default() };
        let mut c = self.client.clone();
        let r = self
            .rt
            .block_on(c.list_containers(ListContainersRequest { filter: Some(filter) }))
            .map_err(|s| self.err("ListContainers", s))?;
        Ok(r.into_inner().containers)
    }

    /// The status of one container, with the runtime's verbose info (containerd puts the OCI spec and
    /// the PID there).
    pub fn container_status(
        &mut self,
        id: &str,
    ) -> Result<(Option<ContainerStatus>, HashMap<String, String>), KubeletError> {
        let mut c = self.client.clone();
        let r = self
            .rt
            .block_on(
                c.container_status(ContainerStatusRequest { container_id: id.to_owned(), verbose: true }),
            )
            .map_err(|s| self.err("ContainerStatus", s))?
            .into_inner();
        Ok((r.status, r.info))
    }

    /// Stops and removes every pod sandbox (and so its containers). Returns how many there were.
    pub fn remove_all_pods(&mut self) -> Result<usize, KubeletError> {
        let pods = self.pods(&[])?;
        for pod in &pods {
            let mut c = self.client.clone();
            self.rt
                .block_on(c.stop_pod_sandbox(StopPodSandboxRequest { pod_sandbox_id: pod.id.clone() }))
                .map_err(|s| self.err("StopPodSandbox", s))?;
            let mut c = self.client.clone();
            self.rt
                .block_on(c.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: pod.id.clone() }))
                .map_err(|s| self.err("RemovePodSandbox", s))?;
        }
        Ok(pods.len())
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

/// The container's name in its pod spec.
pub fn container_name(c: &Container) -> &str {
    c.metadata.as_ref().map_or("", |m| m.name.as_str())
}
