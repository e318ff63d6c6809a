//! `kubelet-sim`: a kubelet stand-in for tests and benchmarks (never installed).
//!
//! It does what the kubelet's device manager does over real gRPC on unix sockets: serves
//! `Registration` on `<dir>/kubelet.sock` to any gRPC client (through the plugin's `:authority`
//! adapter, so grpc-go plugins such as NVIDIA's register too), validates registrations, connects
//! back to each plugin, follows ListAndWatch and calls Allocate / GetPreferredAllocation when
//! told to. It is driven by JSON lines on stdin (`{"id":1,"op":"allocate",...}`) and reports on
//! stdout: replies (`{"reply":1,"ok":...}` / `{"reply":1,"error":{"code","message"}}`) and
//! events (`{"event":"registered",...}`, `{"event":"devices",...}`).
//!
//! Ops: `allocate`, `preferred`, `options`, `allocate_many` (concurrent calls with latency
//! figures), `raw` (arbitrary bytes as a request message), `restart` (clear the directory and
//! re-create kubelet.sock, as a restarting kubelet does), `stop`, `start`, `shutdown`.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow};
use clap::Parser;
use prost::bytes::{Buf, BufMut};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use nvinject_device_plugin::api;
use nvinject_device_plugin::transport;

#[derive(Debug, Parser)]
#[command(name = "kubelet-sim")]
struct Cli {
    /// Device plugin directory: kubelet.sock is served here, plugin sockets are found here.
    #[arg(long)]
    dir: PathBuf,
}

fn emit(v: Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

/// A registered plugin, as the kubelet keeps it.
#[derive(Clone)]
struct Plugin {
    channel: Channel,
    generation: u64,
}

#[derive(Default)]
struct State {
    plugins: HashMap<String, Plugin>,
    generation: u64,
}

type Shared = Arc<Mutex<State>>;

struct RegistrationService {
    dir: PathBuf,
    state: Shared,
}

fn valid_resource_name(name: &str) -> bool {
    match name.split_once('/') {
        Some((domain, short)) => {
            !domain.is_empty()
                && !short.is_empty()
                && !domain.ends_with("kubernetes.io")
                && short.len() <= 63
                && short.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        }
        None => false,
    }
}

#[tonic::async_trait]
impl api::registration_server::Registration for RegistrationService {
    async fn register(&self, request: Request<api::RegisterRequest>) -> Result<Response<api::Empty>, Status> {
        let r = request.into_inner();
        let reject = |why: String| {
            emit(json!({"event": "register_rejected", "resource": r.resource_name, "reason": why}));
            Err(Status::invalid_argument(why))
        };
        if r.version != api::VERSION {
            return reject(format!("unsupported version {}", r.version));
        }
        if !valid_resource_name(&r.resource_name) {
            return reject(format!("invalid resource name {}", r.resource_name));
        }
        if r.endpoint.is_empty() || r.endpoint.contains('/') {
            return reject(format!("endpoint {} is not a file name in the plugin directory", r.endpoint));
        }
        let opts = r.options.unwrap_or_default();
        emit(json!({
            "event": "registered",
            "resource": r.resource_name,
            "endpoint": r.endpoint,
            "version": r.version,
            "options": {
                "pre_start_required": opts.pre_start_required,
                "get_preferred_allocation_available": opts.get_preferred_allocation_available,
            },
            "at_unix_ns": now_ns().to_string(),
        }));
        // Like the kubelet: answer the registration, then connect back and follow the plugin.
        let socket = self.dir.join(&r.endpoint);
        let state = self.state.clone();
        let resource = r.resource_name.clone();
        tokio::spawn(async move {
            let channel = match transport::connect(&socket, Duration::from_secs(5)).await {
                Ok(c) => c,
                Err(e) => {
                    emit(json!({"event": "connect_failed", "resource": resource, "error": e.to_string()}));
                    return;
                }
            };
            let generation = {
                let mut s = state.lock().unwrap();
                s.generation += 1;
                let g = s.generation;
                s.plugins.insert(resource.clone(), Plugin { channel: channel.clone(), generation: g });
                g
            };
            follow(channel, resource, generation, state).await;
        });
        Ok(Response::new(api::Empty {}))
    }
}

async fn follow(channel: Channel, resource: String, generation: u64, state: Shared) {
    let mut client = api::device_plugin_client::DevicePluginClient::new(channel);
    let mut stream = match client.list_and_watch(api::Empty {}).await {
        Ok(r) => r.into_inner(),
        Err(e) => {
            emit(json!({"event": "stream_ended", "resource": resource, "error": e.message()}));
            return;
        }
    };
    let mut seq = 0u64;
    loop {
        match stream.message().await {
            Ok(Some(msg)) => {
                // A newer registration of the same resource replaces this stream.
                if state.lock().unwrap().plugins.get(&resource).map(|p| p.generation) != Some(generation) {
                    return;
                }
                seq += 1;
                let devices: Vec<Value> = msg
                    .devices
                    .iter()
                    .map(|d| {
                        let numa: Vec<i64> = d
                            .topology
                            .as_ref()
                            .map(|t| t.nodes.iter().map(|n| n.id).collect())
                            .unwrap_or_default();
                        json!({"id": d.id, "health": d.health, "numa": numa})
                    })
                    .collect();
                emit(json!({
                    "event": "devices", "resource": resource, "seq": seq, "generation": generation,
                    "at_unix_ns": now_ns().to_string(), "devices": devices,
                }));
            }
            Ok(None) => {
                emit(json!({"event": "stream_ended", "resource": resource, "generation": generation}));
                return;
            }
            Err(e) => {
                emit(
                    json!({"event": "stream_ended", "resource": resource, "generation": generation, "error": e.message()}),
                );
                return;
            }
        }
    }
}

/// The registration server; dropping `stop` ends it.
struct Server {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

async fn start_server(dir: &Path, state: Shared) -> Result<Server> {
    let socket = dir.join("kubelet.sock");
    let listener = transport::bind(&socket).with_context(|| format!("bind {}", socket.display()))?;
    let (stop, stopped) = oneshot::channel::<()>();
    let svc = RegistrationService { dir: dir.to_path_buf(), state };
    let task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .serve_with_incoming_shutdown(
                api::registration_server::RegistrationServer::new(svc),
                // The plugin's own adapter: grpc-go clients (NVIDIA's device plugin, kubelets
                // before 1.26) send the socket path as `:authority`, which h2 alone refuses.
                transport::incoming(listener, "kubelet-sim registration"),
                async {
                    let _ = stopped.await;
                },
            )
            .await;
    });
    Ok(Server { stop: Some(stop), task })
}

async fn stop_server(server: &mut Option<Server>, dir: &Path) {
    if let Some(mut s) = server.take() {
        if let Some(stop) = s.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), &mut s.task).await;
        s.task.abort();
    }
    let _ = std::fs::remove_file(dir.join("kubelet.sock"));
}

#[derive(Debug, Deserialize)]
struct Command {
    #[serde(default)]
    id: u64,
    op: String,
    #[serde(default)]
    resource: String,
    #[serde(default)]
    containers: Value,
    #[serde(default)]
    count: usize,
    #[serde(default)]
    concurrency: usize,
    #[serde(default)]
    method: String,
    #[serde(default)]
    bytes_hex: String,
}

fn status_json(s: &Status) -> Value {
    json!({"code": format!("{:?}", s.code()), "message": s.message()})
}

fn allocate_json(r: &api::AllocateResponse) -> Value {
    let containers: Vec<Value> = r
        .container_responses
        .iter()
        .map(|c| {
            json!({
                "envs": c.envs,
                "annotations": c.annotations,
                "mounts": c.mounts.iter().map(|m| json!({"container_path": m.container_path, "host_path": m.host_path, "read_only": m.read_only})).collect::<Vec<_>>(),
                "devices": c.devices.iter().map(|d| json!({"container_path": d.container_path, "host_path": d.host_path, "permissions": d.permissions})).collect::<Vec<_>>(),
                "cdi_devices": c.cdi_devices.iter().map(|d| d.name.clone()).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({"containers": containers})
}

fn allocate_request(containers: &Value) -> Result<api::AllocateRequest> {
    let lists: Vec<Vec<String>> =
        serde_json::from_value(containers.clone()).context("containers: [[ids]]")?;
    Ok(api::AllocateRequest {
        container_requests: lists
            .into_iter()
            .map(|devices_ids| api::ContainerAllocateRequest { devices_ids })
            .collect(),
    })
}

#[derive(Debug, Deserialize)]
struct PreferredSpec {
    #[serde(default)]
    available: Vec<String>,
    #[serde(default)]
    must_include: Vec<String>,
    size: i32,
}

/// Passes request bytes through untouched, for malformed-request tests.
#[derive(Debug, Clone, Default)]
struct RawCodec;
struct RawEncoder;
struct RawDecoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

fn unhex(s: &str) -> Result<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return Err(anyhow!("odd number of hex digits"));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| anyhow!("{e}")))
        .collect()
}

fn percentile(sorted: &[u128], p: f64) -> u128 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

async fn run_op(cmd: &Command, state: &Shared) -> Result<Value, Value> {
    let plugin = || {
        state.lock().unwrap().plugins.get(&cmd.resource).cloned().ok_or_else(|| {
            json!({"code": "NotRegistered", "message": format!("no plugin registered for {}", cmd.resource)})
        })
    };
    let bad = |e: anyhow::Error| json!({"code": "BadCommand", "message": format!("{e:#}")});
    match cmd.op.as_str() {
        "options" => {
            let mut c = api::device_plugin_client::DevicePluginClient::new(plugin()?.channel);
            let o =
                c.get_device_plugin_options(api::Empty {}).await.map_err(|s| status_json(&s))?.into_inner();
            Ok(
                json!({"pre_start_required": o.pre_start_required, "get_preferred_allocation_available": o.get_preferred_allocation_available}),
            )
        }
        "allocate" => {
            let req = allocate_request(&cmd.containers).map_err(bad)?;
            let mut c = api::device_plugin_client::DevicePluginClient::new(plugin()?.channel);
            let r = c.allocate(req).await.map_err(|s| status_json(&s))?.into_inner();
            Ok(allocate_json(&r))
        }
        "preferred" => {
            let specs: Vec<PreferredSpec> = serde_json::from_value(cmd.containers.clone())
                .context("containers: [{available, must_include, size}]")
                .map_err(bad)?;
            let req = api::PreferredAllocationRequest {
                container_requests: specs
                    .into_iter()
                    .map(|s| api::ContainerPreferredAllocationRequest {
                        available_device_i_ds: s.available,
                        must_include_device_i_ds: s.must_include,
                        allocation_size: s.size,
                    })
                    .collect(),
            };
            let mut c = api::device_plugin_client::DevicePluginClient::new(plugin()?.channel);
            let r = c.get_preferred_allocation(req).await.map_err(|s| status_json(&s))?.into_inner();
            let lists: Vec<Vec<String>> = r.container_responses.into_iter().map(|c| c.device_i_ds).collect();
            Ok(json!({"containers": lists}))
        }
        "allocate_many" => {
            let req = allocate_request(&cmd.containers).map_err(bad)?;
            let channel = plugin()?.channel;
            let count = cmd.count.max(1);
            let concurrency = cmd.concurrency.clamp(1, count);
            let sem = Arc::new(tokio::sync::Semaphore::new(concurrency));
            let mut tasks = Vec::with_capacity(count);
            let wall = Instant::now();
            for _ in 0..count {
                let sem = sem.clone();
                let req = req.clone();
                let mut c = api::device_plugin_client::DevicePluginClient::new(channel.clone());
                tasks.push(tokio::spawn(async move {
                    let _permit = sem.acquire().await;
                    let t = Instant::now();
                    let r = c.allocate(req).await;
                    (
                        t.elapsed().as_nanos(),
                        r.map(|r| allocate_json(&r.into_inner())).map_err(|s| status_json(&s)),
                    )
                }));
            }
            let mut latencies = Vec::with_capacity(count);
            let mut distinct: Vec<Value> = Vec::new();
            let mut errors: Vec<Value> = Vec::new();
            for t in tasks {
                let (ns, r) = t.await.map_err(|e| json!({"code": "Join", "message": e.to_string()}))?;
                latencies.push(ns);
                match r {
                    Ok(v) if !distinct.contains(&v) => distinct.push(v),
                    Ok(_) => {}
                    Err(e) => errors.push(e),
                }
            }
            let wall_ns = wall.elapsed().as_nanos();
            latencies.sort_unstable();
            Ok(json!({
                "count": count, "succeeded": count - errors.len(), "errors": errors,
                "distinct_responses": distinct,
                "p50_ns": percentile(&latencies, 50.0).to_string(),
                "p99_ns": percentile(&latencies, 99.0).to_string(),
                "max_ns": latencies.last().copied().unwrap_or(0).to_string(),
                "wall_ns": wall_ns.to_string(),
            }))
        }
        "raw" => {
            let bytes = unhex(&cmd.bytes_hex).map_err(bad)?;
            let path = format!("/v1beta1.DevicePlugin/{}", cmd.method);
            let path =
                tonic::codegen::http::uri::PathAndQuery::try_from(path).map_err(|e| bad(anyhow!("{e}")))?;
            let mut grpc = tonic::client::Grpc::new(plugin()?.channel);
            grpc.ready().await.map_err(|e| json!({"code": "Unavailable", "message": e.to_string()}))?;
            let r: Response<Vec<u8>> =
                grpc.unary(Request::new(bytes), path, RawCodec).await.map_err(|s| status_json(&s))?;
            Ok(json!({"bytes": r.into_inner().len()}))
        }
        other => Err(json!({"code": "BadCommand", "message": format!("unknown op {other}")})),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    std::fs::create_dir_all(&cli.dir).with_context(|| format!("create {}", cli.dir.display()))?;
    let state: Shared = Arc::default();
    let mut server = Some(start_server(&cli.dir, state.clone()).await?);
    emit(json!({"event": "ready", "socket": cli.dir.join("kubelet.sock")}));

    // Stdin is read on a plain thread (tokio's stdin needs a feature the workspace leaves off).
    let (line_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if line_tx.send(line).is_err() {
                break;
            }
        }
    });
    while let Some(line) = lines.recv().await {
        if line.trim().is_empty() {
            continue;
        }
        let cmd: Command = match serde_json::from_str(&line) {
            Ok(c) => c,
            Err(e) => {
                emit(json!({"reply": null, "error": {"code": "BadCommand", "message": e.to_string()}}));
                continue;
            }
        };
        let id = cmd.id;
        match cmd.op.as_str() {
            "shutdown" => {
                stop_server(&mut server, &cli.dir).await;
                emit(json!({"reply": id, "ok": {}}));
                return Ok(());
            }
            "stop" => {
                stop_server(&mut server, &cli.dir).await;
                state.lock().unwrap().plugins.clear();
                emit(json!({"reply": id, "ok": {}}));
            }
            "start" | "restart" => {
                stop_server(&mut server, &cli.dir).await;
                state.lock().unwrap().plugins.clear();
                if cmd.op == "restart" {
                    // A starting kubelet clears its device plugin directory: plugins must notice
                    // and come back.
                    for e in std::fs::read_dir(&cli.dir)?.flatten() {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
                match start_server(&cli.dir, state.clone()).await {
                    Ok(s) => {
                        server = Some(s);
                        emit(json!({"reply": id, "ok": {}}));
                    }
                    Err(e) => {
                        emit(json!({"reply": id, "error": {"code": "Start", "message": format!("{e:#}")}}))
                    }
                }
            }
            _ => {
                // Calls run concurrently so a slow one never blocks the next command.
                let state = state.clone();
                tokio::spawn(async move {
                    match run_op(&cmd, &state).await {
                        Ok(v) => emit(json!({"reply": id, "ok": v})),
                        Err(e) => emit(json!({"reply": id, "error": e})),
                    }
                });
            }
        }
    }
    stop_server(&mut server, &cli.dir).await;
    Ok(())
}
