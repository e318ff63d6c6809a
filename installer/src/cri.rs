//! The CRI calls `doctor` makes on containerd's socket: which runtimes the running CRI plugin
//! loaded, and one short-lived test pod ([`TestContainer`]). Adapters only: no decisions here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatusRequest, CreateContainerRequest,
    ImageSpec, ImageStatusRequest, LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode,
    NamespaceOption, PodSandboxConfig, PodSandboxMetadata, PullImageRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, StartContainerRequest, StatusRequest, StopPodSandboxRequest,
};
use tonic::transport::{Channel, Endpoint};

/// What the test container phase runs.
#[derive(Debug, Clone)]
pub struct TestContainer {
    /// Runtime handler.
    pub handler: String,
    /// Image.
    pub image: String,
    /// Command.
    pub command: Vec<String>,
    /// Container annotations (the CDI request).
    pub annotations: BTreeMap<String, String>,
}

/// Why a CRI call did not give an answer. The messages are what `doctor` prints after its own
/// words, so each names the call and carries containerd's message as it came.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// The client's async runtime could not be started.
    #[error("{0}")]
    Runtime(#[source] std::io::Error),
    /// The socket path does not make an endpoint.
    #[error("{0}")]
    Endpoint(#[source] tonic::transport::Error),
    /// Nothing answered on the socket.
    #[error("connect {}: {source}", socket.display())]
    Connect {
        /// The socket, located inside the host root.
        socket: PathBuf,
        /// What the transport said.
        source: tonic::transport::Error,
    },
    /// The verbose `Status` call was refused.
    #[error("{}", .0.message())]
    Status(tonic::Status),
    /// The CRI status carries no `config` entry.
    #[error("CRI status has no config")]
    NoConfig,
    /// The CRI status's `config` is not JSON.
    #[error("{0}")]
    ConfigJson(#[source] serde_json::Error),
    /// The CRI config has no `containerd.runtimes` table.
    #[error("CRI config lists no runtimes")]
    NoRuntimes,
    /// The image is not on the node and cannot be pulled.
    #[error("cannot pull {image}: {}", status.message())]
    Pull {
        /// The image.
        image: String,
        /// containerd's answer.
        status: tonic::Status,
    },
    /// The pod sandbox was refused.
    #[error("RunPodSandbox with handler {handler}: {}", status.message())]
    RunPodSandbox {
        /// The runtime handler asked for.
        handler: String,
        /// containerd's answer.
        status: tonic::Status,
    },
    /// Another call of the test pod's life was refused.
    #[error("{call}: {}", status.message())]
    Call {
        /// The CRI method (`ImageStatus`, `CreateContainer`, `StartContainer`, `ContainerStatus`).
        call: &'static str,
        /// containerd's answer.
        status: tonic::Status,
    },
    /// The test container was still running at the deadline.
    #[error("the test container did not exit within 60 s")]
    Timeout,
}

impl CriError {
    /// containerd's own message, for the errors that carry one.
    pub fn status_message(&self) -> Option<&str> {
        match self {
            CriError::Status(status)
            | CriError::Pull { status, .. }
            | CriError::RunPodSandbox { status, .. }
            | CriError::Call { status, .. } => Some(status.message()),
            _ => None,
        }
    }
}

type Clients = (RuntimeServiceClient<Channel>, ImageServiceClient<Channel>);

fn runtime() -> Result<tokio::runtime::Runtime, CriError> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(CriError::Runtime)
}

async fn connect(socket: &Path) -> Result<Clients, CriError> {
    let channel = Endpoint::from_shared(format!("unix://{}", socket.display()))
        .map_err(CriError::Endpoint)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|source| CriError::Connect { socket: socket.to_owned(), source })?;
    Ok((RuntimeServiceClient::new(channel.clone()), ImageServiceClient::new(channel)))
}

/// The runtimes the running CRI plugin loaded (`Status` with `verbose`): handler -> (type, path).
pub fn loaded_runtimes(socket: &Path) -> Result<BTreeMap<String, (String, String)>, CriError> {
    runtime()?.block_on(async {
        let (mut rt, _) = connect(socket).await?;
        let status = rt.status(StatusRequest { verbose: true }).await.map_err(CriError::Status)?.into_inner();
        let config = status.info.get("config").ok_or(CriError::NoConfig)?;
        let config: serde_json::Value = serde_json::from_str(config).map_err(CriError::ConfigJson)?;
        let runtimes = config["containerd"]["runtimes"].as_object().ok_or(CriError::NoRuntimes)?;
        Ok(runtimes
            .iter()
            .map(|(name, r)| {
                let s = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
                (name.clone(), (s("runtimeType"), s("runtimePath")))
            })
            .collect())
    })
}

/// Runs `request` in a fresh host-network pod and returns (exit code, output). The pod is removed
/// afterwards, whatever happened.
///
/// containerd writes the container's log under `log_dir_host` (a host path, an existing directory
/// the caller created and removes: see `doctor::probe::LogDir`); the doctor reads it at `log_dir_local`
/// (the same directory, resolved inside the host root).
pub fn run_test_container(
    socket: &Path,
    request: &TestContainer,
    log_dir_host: &str,
    log_dir_local: &Path,
) -> Result<(i32, String), CriError> {
    runtime()?.block_on(run_pod(socket, request, log_dir_host, log_dir_local))
}

async fn run_pod(
    socket: &Path,
    request: &TestContainer,
    log_dir_host: &str,
    log_dir: &Path,
) -> Result<(i32, String), CriError> {
    let (mut rt, mut images) = connect(socket).await?;
    let spec = ImageSpec { image: request.image.clone(), ..Default::default() };
    let present = images
        .image_status(ImageStatusRequest { image: Some(spec.clone()), verbose: false })
        .await
        .map_err(|status| CriError::Call { call: "ImageStatus", status })?
        .into_inner()
        .image
        .is_some();
    if !present {
        images
            .pull_image(PullImageRequest { image: Some(spec.clone()), ..Default::default() })
            .await
            .map_err(|status| CriError::Pull { image: request.image.clone(), status })?;
    }
    let uid = format!("nvinject-doctor-{}", std::process::id());
    let host_network = Some(NamespaceOption { network: NamespaceMode::Node as i32, ..Default::default() });
    let config = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: uid.clone(),
            uid: uid.clone(),
            namespace: "nvinject-doctor".into(),
            attempt: 0,
        }),
        log_directory: log_dir_host.to_owned(),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: host_network,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let pod_id = rt
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: request.handler.clone(),
        })
        .await
        .map_err(|status| CriError::RunPodSandbox { handler: request.handler.clone(), status })?
        .into_inner()
        .pod_sandbox_id;
    let outcome = run_in_pod(&mut rt, &pod_id, &config, request, log_dir).await;
    let _ = rt.stop_pod_sandbox(StopPodSandboxRequest { pod_sandbox_id: pod_id.clone() }).await;
    let _ = rt.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: pod_id }).await;
    outcome
}

async fn run_in_pod(
    rt: &mut RuntimeServiceClient<Channel>,
    pod_id: &str,
    pod: &PodSandboxConfig,
    request: &TestContainer,
    log_dir: &Path,
) -> Result<(i32, String), CriError> {
    let config = ContainerConfig {
        metadata: Some(ContainerMetadata { name: "gpu-test".into(), attempt: 0 }),
        image: Some(ImageSpec { image: request.image.clone(), ..Default::default() }),
        command: request.command.clone(),
        annotations: request.annotations.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        log_path: "gpu-test.log".into(),
        ..Default::default()
    };
    let id = rt
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod_id.to_owned(),
            config: Some(config),
            sandbox_config: Some(pod.clone()),
        })
        .await
        .map_err(|status| CriError::Call { call: "CreateContainer", status })?
        .into_inner()
        .container_id;
    rt.start_container(StartContainerRequest { container_id: id.clone() })
        .await
        .map_err(|status| CriError::Call { call: "StartContainer", status })?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let exit = loop {
        let status = rt
            .container_status(ContainerStatusRequest { container_id: id.clone(), verbose: false })
            .await
            .map_err(|status| CriError::Call { call: "ContainerStatus", status })?
            .into_inner()
            .status;
        if let Some(s) = status.filter(|s| s.state == ContainerState::ContainerExited as i32) {
            break s.exit_code;
        }
        if Instant::now() >= deadline {
            return Err(CriError::Timeout);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    Ok((exit, read_cri_log(&log_dir.join("gpu-test.log"))))
}

/// The messages of a CRI log file (`<time> <stream> <P|F> <message>` lines).
pub fn read_cri_log(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = String::new();
    for line in text.lines() {
        let mut parts = line.splitn(4, ' ');
        let (_, _, tag, message) = (parts.next(), parts.next(), parts.next(), parts.next().unwrap_or(""));
        out.push_str(message);
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
    fn errors_read_as_before_they_were_typed() {
        let status = || tonic::Status::unknown("boom");
        let cases = [
            (CriError::Status(status()), "boom"),
            (CriError::NoConfig, "CRI status has no config"),
            (CriError::NoRuntimes, "CRI config lists no runtimes"),
            (CriError::Pull { image: "busybox".into(), status: status() }, "cannot pull busybox: boom"),
            (
                CriError::RunPodSandbox { handler: "nvidia".into(), status: status() },
                "RunPodSandbox with handler nvidia: boom",
            ),
            (CriError::Call { call: "CreateContainer", status: status() }, "CreateContainer: boom"),
            (CriError::Timeout, "the test container did not exit within 60 s"),
        ];
        for (error, text) in cases {
            assert_eq!(error.to_string(), text);
            let carries = error.status_message().is_some();
            assert_eq!(carries, text.ends_with("boom"), "{error:?}");
        }
    }

    #[test]
    fn cri_log_lines_are_joined_without_prefixes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.log");
        std::fs::write(
            &path,
            "2024-01-01T00:00:00Z stdout P GPU 0: NVIDIA \n2024-01-01T00:00:00Z stdout F H100 (UUID: GPU-1)\n",
        )
        .unwrap();
        assert_eq!(read_cri_log(&path), "GPU 0: NVIDIA H100 (UUID: GPU-1)\n");
    }
}
