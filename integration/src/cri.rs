//! A small CRI client (the kubelet's side of containerd's CRI plugin) over the real gRPC unix socket,
//! with blocking wrappers so tests read top to bottom.
//!
//! Pods use the host network, so no CNI plugin is needed; container logs go to a directory the test
//! owns and are read back in CRI's log format.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatusRequest, CreateContainerRequest,
    ImageSpec, KeyValue, LinuxContainerConfig, LinuxContainerSecurityContext, LinuxPodSandboxConfig,
    LinuxSandboxSecurityContext, ListContainersRequest, NamespaceMode, NamespaceOption, PodSandboxConfig,
    PodSandboxMetadata, RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest,
    StopPodSandboxRequest,
};
use tonic::transport::{Channel, Endpoint};

use crate::error::{HarnessError, Result};
use crate::process;

/// A connected CRI client.
pub struct CriClient {
    rt: tokio::runtime::Runtime,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
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
pub(crate) async fn unix_channel(socket: &Path) -> std::result::Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(format!("unix://{}", socket.display()))?.connect().await
}

fn cri_err(call: &'static str) -> impl FnOnce(tonic::Status) -> HarnessError {
    move |s| HarnessError::Cri { call, message: s.message().to_owned() }
}

impl CriClient {
    /// Connects to containerd's CRI endpoint at `socket`.
    pub fn connect(socket: &Path) -> Result<CriClient> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| HarnessError::Cri { call: "connect", message: e.to_string() })?;
        let channel = rt
            .block_on(unix_channel(socket))
            .map_err(|e| HarnessError::Cri { call: "connect", message: e.to_string() })?;
        Ok(CriClient {
            rt,
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        })
    }

    /// Whether the image is known to the CRI plugin (imported into `k8s.io`).
    pub fn has_image(&mut self, image: &str) -> Result<bool> {
        let req = k8s_cri::v1::ImageStatusRequest {
            image: Some(ImageSpec { image: image.into(), ..Default::default() }),
            verbose: false,
        };
        let resp = self.rt.block_on(self.images.image_status(req)).map_err(cri_err("ImageStatus"))?;
        Ok(resp.into_inner().image.is_some())
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
                    namespace_options: Some(NamespaceOption {
                        network: NamespaceMode::Node as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let req =
            RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: runtime_handler.into() };
        let resp = self.rt.block_on(self.runtime.run_pod_sandbox(req)).map_err(cri_err("RunPodSandbox"))?;
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
                    namespace_options: Some(NamespaceOption {
                        network: NamespaceMode::Node as i32,
                        ..Default::default()
                    }),
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
        let resp =
            self.rt.block_on(self.runtime.create_container(req)).map_err(cri_err("CreateContainer"))?;
        Ok(resp.into_inner().container_id)
    }

    /// Starts a created container.
    pub fn start_container(&mut self, id: &str) -> Result<()> {
        let req = StartContainerRequest { container_id: id.into() };
        self.rt.block_on(self.runtime.start_container(req)).map_err(cri_err("StartContainer"))?;
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

    /// Ids of the containers in `pod` (sandbox excluded, as CRI lists them).
    pub fn containers_in(&mut self, pod: &Pod) -> Result<Vec<String>> {
        let filter = k8s_cri::v1::ContainerFilter { pod_sandbox_id: pod.id.clone(), ..Default::default() };
        let req = ListContainersRequest { filter: Some(filter) };
        let resp = self.rt.block_on(self.runtime.list_containers(req)).map_err(cri_err("ListContainers"))?;
        Ok(resp.into_inner().containers.into_iter().map(|c| c.id).collect())
    }

    /// The message lines a container wrote to stdout/stderr (CRI log prefixes stripped).
    pub fn logs(&self, pod: &Pod, name: &str) -> String {
        parse_cri_log(&std::fs::read_to_string(pod.log_dir.join(format!("{name}.log"))).unwrap_or_default())
    }

    /// Stops and removes the pod (and its containers).
    pub fn remove_pod(&mut self, pod: &Pod) -> Result<()> {
        self.rt
            .block_on(self.runtime.stop_pod_sandbox(StopPodSandboxRequest { pod_sandbox_id: pod.id.clone() }))
            .map_err(cri_err("StopPodSandbox"))?;
        self.rt
            .block_on(
                self.runtime.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: pod.id.clone() }),
            )
            .map_err(cri_err("RemovePodSandbox"))?;
        Ok(())
    }
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
