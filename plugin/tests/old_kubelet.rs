//! Kubelets before 1.26 send the plugin socket's path as HTTP/2 `:authority`. A client that does
//! exactly that (raw HTTP/2 written by `h2wire`, header blocks encoded as grpc-go encodes them)
//! is answered by the plugin; the same requests to a bare tonic server are reset with
//! PROTOCOL_ERROR, and answered once that server's connections go through the plugin's
//! `transport::incoming`. grpc-go plugins (NVIDIA's) register the same way: kubelet-sim takes
//! their registration through that adapter. Real gRPC over unix sockets; the plugin test needs
//! root (the simulated node has real device nodes).

mod common;
#[path = "../h2-authority/tests/h2wire/mod.rs"]
mod h2wire;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Kubelet, Node, PATIENCE, Plugin, kubelet_dir, plugin_args};
use h2wire::{
    PROTOCOL_ERROR, RawClient, StreamSeen, grpc_go_first_block, grpc_go_next_block, grpc_message,
    grpc_messages,
};
use nvinject_device_plugin::api;
use prost::Message;

fn wait_for_socket(path: &Path) {
    let deadline = Instant::now() + PATIENCE;
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn first_message(seen: &StreamSeen) -> Option<Vec<u8>> {
    grpc_messages(&seen.data).into_iter().next()
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
#[ignore = "needs root"]
fn plugin_answers_a_kubelet_that_sends_its_socket_path_as_authority() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::preset("h100x8");
    let dir = kubelet_dir(&node);
    // No kubelet: the plugin serves its socket and keeps retrying registration meanwhile.
    let mut plugin = Plugin::start(
        Some(&node),
        &plugin_args(&node, &dir),
        &[("RUST_LOG", "info,nvinject_device_plugin::transport=debug")],
    );
    let socket = dir.join("nvinject-gpu.sock");
    wait_for_socket(&socket);

    let mut c = RawClient::connect(&socket);
    c.request(
        1,
        &grpc_go_first_block("/v1beta1.DevicePlugin/ListAndWatch", path_str(&socket), true),
        &grpc_message(&[]),
    );
    let seen = c.wait(1, PATIENCE, |s| first_message(s).is_some() || s.reset.is_some());
    assert_eq!(seen.reset, None, "stream reset; plugin log:\n{}", plugin.stderr());
    assert_eq!(seen.header(":status"), Some("200"));
    let list = api::ListAndWatchResponse::decode(&first_message(&seen).unwrap()[..]).unwrap();
    let ids: Vec<&str> = list.devices.iter().map(|d| d.id.as_str()).collect();
    let want: Vec<String> = (0..8).map(|i| node.uuid(i)).collect();
    assert_eq!(ids, want);
    assert!(list.devices.iter().all(|d| d.health == api::HEALTHY));

    // The second request names the authority only by its dynamic table index.
    let request = api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest { devices_ids: vec![node.uuid(2)] }],
    };
    c.request(
        3,
        &grpc_go_next_block("/v1beta1.DevicePlugin/Allocate", false),
        &grpc_message(&request.encode_to_vec()),
    );
    let seen = c.wait(3, PATIENCE, |s| s.ended || s.reset.is_some());
    assert_eq!(seen.reset, None);
    assert_eq!(seen.header("grpc-status"), Some("0"), "{seen:?}");
    let answer = api::AllocateResponse::decode(&first_message(&seen).unwrap()[..]).unwrap();
    let annotations = &answer.container_responses[0].annotations;
    assert_eq!(annotations.len(), 1);
    let (key, value) = annotations.iter().next().unwrap();
    assert!(key.starts_with("cdi.k8s.io/nvinject-device-plugin_"), "{key}");
    assert_eq!(value, &format!("nvidia.com/gpu={}", node.uuid(2)));
    assert_eq!(c.goaway, None);
    drop(c);

    assert!(plugin.terminate().success());
    let log = plugin.stderr();
    let line = log.lines().find(|l| l.contains("replacing it on this connection")).unwrap_or_else(|| {
        panic!("no debug line about the rewrite in the plugin's log:\n{log}");
    });
    assert!(line.contains(path_str(&socket)) && line.contains("nvidia.com/gpu"), "{line}");
    assert_eq!(log.matches("replacing it on this connection").count(), 1, "once per connection:\n{log}");
}

/// A minimal plugin service: one device, a fixed Allocate answer.
#[derive(Clone)]
struct OneDevice;

#[tonic::async_trait]
impl api::device_plugin_server::DevicePlugin for OneDevice {
    async fn get_device_plugin_options(
        &self,
        _: tonic::Request<api::Empty>,
    ) -> Result<tonic::Response<api::DevicePluginOptions>, tonic::Status> {
        Ok(tonic::Response::new(api::DevicePluginOptions::default()))
    }

    type ListAndWatchStream =
        tokio_stream::Iter<std::vec::IntoIter<Result<api::ListAndWatchResponse, tonic::Status>>>;

    async fn list_and_watch(
        &self,
        _: tonic::Request<api::Empty>,
    ) -> Result<tonic::Response<Self::ListAndWatchStream>, tonic::Status> {
        let device = api::Device { id: "dev-0".into(), health: api::HEALTHY.into(), topology: None };
        Ok(tonic::Response::new(tokio_stream::iter(vec![Ok(api::ListAndWatchResponse {
            devices: vec![device],
        })])))
    }

    async fn get_preferred_allocation(
        &self,
        _: tonic::Request<api::PreferredAllocationRequest>,
    ) -> Result<tonic::Response<api::PreferredAllocationResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }

    async fn allocate(
        &self,
        request: tonic::Request<api::AllocateRequest>,
    ) -> Result<tonic::Response<api::AllocateResponse>, tonic::Status> {
        let n = request.into_inner().container_requests.len();
        Ok(tonic::Response::new(api::AllocateResponse {
            container_responses: vec![api::ContainerAllocateResponse::default(); n],
        }))
    }

    async fn pre_start_container(
        &self,
        _: tonic::Request<api::PreStartContainerRequest>,
    ) -> Result<tonic::Response<api::PreStartContainerResponse>, tonic::Status> {
        Ok(tonic::Response::new(api::PreStartContainerResponse {}))
    }
}

/// ListAndWatch then Allocate with the socket path as authority; what each stream got.
fn old_kubelet_calls(socket: &Path) -> (StreamSeen, StreamSeen) {
    let mut c = RawClient::connect(socket);
    c.request(
        1,
        &grpc_go_first_block("/v1beta1.DevicePlugin/ListAndWatch", path_str(socket), true),
        &grpc_message(&[]),
    );
    let first = c.wait(1, PATIENCE, |s| s.ended || s.reset.is_some());
    let request = api::AllocateRequest { container_requests: vec![api::ContainerAllocateRequest::default()] };
    c.request(
        3,
        &grpc_go_next_block("/v1beta1.DevicePlugin/Allocate", false),
        &grpc_message(&request.encode_to_vec()),
    );
    let second = c.wait(3, PATIENCE, |s| s.ended || s.reset.is_some());
    (first, second)
}

#[test]
fn bare_tonic_resets_the_old_kubelet_and_the_plugin_transport_lets_it_in() {
    let tmp = tempfile::tempdir().unwrap();
    let bare: PathBuf = tmp.path().join("bare.sock");
    let fixed: PathBuf = tmp.path().join("fixed.sock");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let service = || api::device_plugin_server::DevicePluginServer::new(OneDevice);
    let listener = tokio::net::UnixListener::bind(&bare).unwrap();
    rt.spawn(
        tonic::transport::Server::builder()
            .serve_with_incoming(service(), tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let listener = tokio::net::UnixListener::bind(&fixed).unwrap();
    rt.spawn(tonic::transport::Server::builder().serve_with_incoming(
        service(),
        nvinject_device_plugin::transport::incoming(listener, "example.com/dev"),
    ));

    // Without the adapter: h2 refuses the authority and resets both streams.
    let (first, second) = old_kubelet_calls(&bare);
    for (what, s) in [("ListAndWatch", &first), ("Allocate", &second)] {
        assert_eq!(s.reset, Some(PROTOCOL_ERROR), "{what} on the bare server: {s:?}");
        assert!(s.headers.is_empty() && s.data.is_empty(), "{what}: {s:?}");
    }

    // The same bytes through the plugin's transport: answered.
    let (first, second) = old_kubelet_calls(&fixed);
    assert_eq!(first.reset, None, "{first:?}");
    assert_eq!(first.header("grpc-status"), Some("0"), "{first:?}");
    let list = api::ListAndWatchResponse::decode(&first_message(&first).unwrap()[..]).unwrap();
    assert_eq!(list.devices[0].id, "dev-0");
    assert_eq!(second.header("grpc-status"), Some("0"), "{second:?}");
    let answer = api::AllocateResponse::decode(&first_message(&second).unwrap()[..]).unwrap();
    assert_eq!(answer.container_responses.len(), 1);

    // A well-behaved client (tonic's, `localhost` as authority) is served through it as before.
    let options = rt.block_on(async {
        let channel =
            nvinject_device_plugin::transport::connect(&fixed, Duration::from_secs(5)).await.unwrap();
        api::device_plugin_client::DevicePluginClient::new(channel)
            .get_device_plugin_options(api::Empty {})
            .await
            .unwrap()
            .into_inner()
    });
    assert_eq!(options, api::DevicePluginOptions::default());
}

/// NVIDIA's device plugin (grpc-go) registers with the socket path as `:authority`: kubelet-sim
/// answers it, connects back and lists the plugin's devices.
#[test]
fn kubelet_sim_takes_a_registration_that_sends_its_socket_path_as_authority() {
    let tmp = tempfile::tempdir().unwrap();
    let mut kubelet = Kubelet::start(tmp.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    // A plugin that only serves (grpc-go plugins accept tonic's `localhost` when called back).
    let listener = tokio::net::UnixListener::bind(tmp.path().join("one.sock")).unwrap();
    rt.spawn(tonic::transport::Server::builder().serve_with_incoming(
        api::device_plugin_server::DevicePluginServer::new(OneDevice),
        tokio_stream::wrappers::UnixListenerStream::new(listener),
    ));

    let kubelet_sock = tmp.path().join("kubelet.sock");
    let request = api::RegisterRequest {
        version: api::VERSION.into(),
        endpoint: "one.sock".into(),
        resource_name: "example.com/dev".into(),
        options: Some(api::DevicePluginOptions {
            get_preferred_allocation_available: true,
            ..Default::default()
        }),
    };
    let mut c = RawClient::connect(&kubelet_sock);
    c.request(
        1,
        &grpc_go_first_block("/v1beta1.Registration/Register", path_str(&kubelet_sock), true),
        &grpc_message(&request.encode_to_vec()),
    );
    let seen = c.wait(1, PATIENCE, |s| s.ended || s.reset.is_some());
    assert_eq!(seen.reset, None, "kubelet-sim reset the registration: {seen:?}");
    assert_eq!(seen.header(":status"), Some("200"), "{seen:?}");
    assert_eq!(seen.header("grpc-status"), Some("0"), "{seen:?}");

    let registered = kubelet.registered("example.com/dev");
    assert_eq!(registered["endpoint"], "one.sock");
    assert_eq!(registered["options"]["get_preferred_allocation_available"], true);
    let devices = kubelet.devices("example.com/dev", |d| !d.is_empty());
    assert_eq!(devices[0]["id"], "dev-0");
    assert_eq!(devices[0]["health"], api::HEALTHY);

    // A second registration on the same connection names the authority by table index only.
    let again = api::RegisterRequest { resource_name: "example.com/other".into(), ..request };
    c.request(
        3,
        &grpc_go_next_block("/v1beta1.Registration/Register", false),
        &grpc_message(&again.encode_to_vec()),
    );
    let seen = c.wait(3, PATIENCE, |s| s.ended || s.reset.is_some());
    assert_eq!(seen.header("grpc-status"), Some("0"), "{seen:?}");
    assert_eq!(kubelet.devices("example.com/other", |d| !d.is_empty())[0]["id"], "dev-0");
}
