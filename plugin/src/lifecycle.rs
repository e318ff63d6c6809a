//! Serving a resource's socket and keeping it registered with the kubelet.
//!
//! For each resource: bind `<dir>/nvinject-<name>.sock` (replacing a stale file), serve, register
//! through `<dir>/kubelet.sock` with backoff while the kubelet is absent, then watch both files.
//! When our socket disappears or is replaced (the kubelet clears the directory when it
//! restarts) the server is restarted on a fresh socket and registered again; when `kubelet.sock`
//! is re-created the plugin registers again. On shutdown the socket is removed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::api;
use crate::health::HealthSnapshot;
use crate::service::{PluginService, ResourceContext, options};
use crate::transport::{self, FileIdentity};

/// Timing of the supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How often the two socket files are checked.
    pub poll: Duration,
    /// First retry delay while the kubelet is absent or refuses; doubles up to `max_backoff`.
    pub first_backoff: Duration,
    /// Longest retry delay.
    pub max_backoff: Duration,
    /// Limit on one registration call.
    pub register_timeout: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            poll: Duration::from_millis(500),
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            register_timeout: Duration::from_secs(5),
        }
    }
}

/// Registers `resource_name`, served on the socket file `endpoint`, with the kubelet at `kubelet_socket`.
pub async fn register(
    kubelet_socket: &Path,
    endpoint: &str,
    resource_name: &str,
    timeout: Duration,
) -> Result<(), String> {
    let call = async {
        let channel =
            transport::connect(kubelet_socket, timeout).await.map_err(|e| format!("connect: {e}"))?;
        let mut client = api::registration_client::RegistrationClient::new(channel);
        let request = api::RegisterRequest {
            version: api::VERSION.to_owned(),
            endpoint: endpoint.to_owned(),
            resource_name: resource_name.to_owned(),
            options: Some(options()),
        };
        client.register(request).await.map_err(|s| format!("kubelet refused: {}", s.message()))?;
        Ok(())
    };
    tokio::time::timeout(timeout, call).await.map_err(|_| format!("no answer within {timeout:?}"))?
}

/// Serves one resource until `shutdown` turns true, then removes its socket.
pub async fn run_resource(
    ctx: Arc<ResourceContext>,
    health: watch::Receiver<HealthSnapshot>,
    kubelet_socket: PathBuf,
    timing: Timing,
    mut shutdown: watch::Receiver<bool>,
) {
    let dir = kubelet_socket.parent().unwrap_or(Path::new("/")).to_path_buf();
    let endpoint = ctx.resource.socket_name();
    let socket = dir.join(&endpoint);
    let name = ctx.resource.name.to_string();
    let mut bind_backoff = timing.first_backoff;
    let mut ours: Option<FileIdentity> = None;
    'generation: while !*shutdown.borrow() {
        let listener = match transport::bind(&socket) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(resource = name, socket = %socket.display(), error = %e, "cannot create socket; retrying");
                if sleep_or_shutdown(bind_backoff, &mut shutdown).await {
                    break;
                }
                bind_backoff = (bind_backoff * 2).min(timing.max_backoff);
                continue;
            }
        };
        // The identity is what tells our socket from a re-created one; without it (the file
        // vanished right after bind) this generation could never notice a replacement.
        ours = transport::identity(&socket);
        if ours.is_none() {
            tracing::warn!(resource = name, socket = %socket.display(), "socket vanished right after bind; retrying");
            drop(listener);
            if sleep_or_shutdown(bind_backoff, &mut shutdown).await {
                break;
            }
            bind_backoff = (bind_backoff * 2).min(timing.max_backoff);
            continue;
        }
        bind_backoff = timing.first_backoff;
        let (stop_tx, stop_rx) = watch::channel(false);
        let service = PluginService::new(ctx.clone(), health.clone(), stop_rx.clone());
        let mut stop_server = stop_rx.clone();
        let server = tokio::spawn(tonic::transport::Server::builder().serve_with_incoming_shutdown(
            api::device_plugin_server::DevicePluginServer::new(service),
            transport::incoming(listener, &name),
            async move {
                let _ = stop_server.wait_for(|s| *s).await;
            },
        ));
        tracing::info!(resource = name, socket = %socket.display(), "serving");

        let mut registered: Option<FileIdentity> = None;
        let mut backoff = timing.first_backoff;
        let mut waiting_logged = false;
        loop {
            if transport::identity(&socket) != ours {
                tracing::warn!(resource = name, socket = %socket.display(), "socket removed or replaced; serving again");
                break;
            }
            let kubelet = transport::identity(&kubelet_socket);
            let mut pause = timing.poll;
            if kubelet.is_some() && kubelet != registered {
                match register(&kubelet_socket, &endpoint, &name, timing.register_timeout).await {
                    Ok(()) => {
                        tracing::info!(resource = name, endpoint, "registered with the kubelet");
                        ctx.metrics.registration(&name);
                        registered = kubelet;
                        backoff = timing.first_backoff;
                        waiting_logged = false;
                    }
                    Err(e) => {
                        tracing::warn!(resource = name, error = e, retry_in = ?backoff, "registration failed");
                        pause = backoff;
                        backoff = (backoff * 2).min(timing.max_backoff);
                    }
                }
            } else if kubelet.is_none() && !waiting_logged {
                tracing::info!(kubelet_socket = %kubelet_socket.display(), "waiting for the kubelet");
                waiting_logged = true;
            }
            if sleep_or_shutdown(pause, &mut shutdown).await {
                stop_generation(stop_tx, server).await;
                break 'generation;
            }
        }
        stop_generation(stop_tx, server).await;
    }
    // Remove the socket only if it is still the one we created.
    if ours.is_some() && transport::identity(&socket) == ours {
        let _ = std::fs::remove_file(&socket);
    }
    tracing::info!(resource = name, "stopped");
}

async fn stop_generation(
    stop: watch::Sender<bool>,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
) {
    let _ = stop.send(true);
    let abort = server.abort_handle();
    // Streams end on `stop`; a client that hangs on to a connection must not hold us up.
    if tokio::time::timeout(Duration::from_secs(2), server).await.is_err() {
        abort.abort();
    }
}

/// Sleeps `d`; true when shutdown was requested meanwhile.
async fn sleep_or_shutdown(d: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    let requested = tokio::select! {
        _ = tokio::time::sleep(d) => false,
        r = shutdown.wait_for(|s| *s) => r.is_ok(),
    };
    requested || *shutdown.borrow()
}

/// Removes `nvinject-*.sock` files in `dir` that are not in `keep`: sockets of resources a
/// previous run served and this one does not. Other files are never touched.
pub fn remove_stale_sockets(dir: &Path, keep: &[String]) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("nvinject-")
            && name.ends_with(".sock")
            && !keep.contains(&name)
            && std::fs::remove_file(e.path()).is_ok()
        {
            removed.push(e.path());
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_sockets_of_other_resources_are_removed_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["nvinject-gpu.sock", "nvinject-mig-1g.10gb.sock", "kubelet.sock", "nvidia-gpu.sock"] {
            std::fs::write(dir.path().join(f), "").unwrap();
        }
        let removed = remove_stale_sockets(dir.path(), &["nvinject-gpu.sock".to_owned()]);
        assert_eq!(removed, vec![dir.path().join("nvinject-mig-1g.10gb.sock")]);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, vec!["kubelet.sock", "nvidia-gpu.sock", "nvinject-gpu.sock"]);
    }
}
