//! Device plugin figures on the simulated h100x8 node, measured through the kubelet simulator:
//! idle RSS, Allocate latency (1000 sequential calls, and 100 concurrent), and the time from an
//! XID being written to the node's event file to the kubelet receiving the ListAndWatch update.
//! Then the same sequential Allocates from a client that sends the socket path as `:authority`
//! (kubelets before 1.26: every request goes through the authority rewrite), and the rewriter's
//! own cost per request in-process. Goals (issue 5): RSS <= 8 MiB, Allocate p99 < 1 ms, XID to
//! update < 100 ms. Prints; asserts nothing about time. Needs root (the simulated node has real
//! device nodes).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../h2-authority/tests/h2wire/mod.rs"]
mod h2wire;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Kubelet, Node, Plugin, kubelet_dir, plugin_args};
use h2wire::{
    DATA, END_HEADERS, END_STREAM, HEADERS, RawClient, frame, grpc_go_first_block, grpc_go_next_block,
    grpc_message,
};
use nvinject_device_plugin::api;
use nvinject_h2_authority::AuthorityRewriter;
use nvinject_simnode::events::{XidEvent, inject};
use prost::Message;
use serde_json::json;

/// The header block of request `i` on a connection, as grpc-go sends it: the first adds its
/// fields to the dynamic table (the authority Huffman-coded), the following refer to them by
/// index, with the path Huffman-coded, as h2 sends it.
fn request_block(i: u32, path: &str, authority: &str) -> Vec<u8> {
    if i == 0 { grpc_go_first_block(path, authority, true) } else { grpc_go_next_block(path, true) }
}

/// Sequential Allocates with the socket path as authority, on one connection: sorted latencies.
fn old_kubelet_allocates(socket: &std::path::Path, uuid: &str, count: u32) -> Vec<f64> {
    let path = "/v1beta1.DevicePlugin/Allocate";
    let body = grpc_message(
        &api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest { devices_ids: vec![uuid.to_owned()] }],
        }
        .encode_to_vec(),
    );
    let mut c = RawClient::connect(socket);
    let mut ms = Vec::new();
    for i in 0..count {
        let stream = 2 * i + 1;
        let block = request_block(i, path, socket.to_str().unwrap());
        let t = Instant::now();
        c.request(stream, &block, &body);
        let seen = c.wait(stream, Duration::from_secs(10), |s| s.ended || s.reset.is_some());
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(seen.header("grpc-status"), Some("0"), "{seen:?}");
        c.streams.remove(&stream);
    }
    ms.sort_by(f64::total_cmp);
    ms
}

/// The rewriter alone: ns per request for a connection of `count` Allocate requests.
fn rewriter_ns_per_request(authority: &str, count: u32) -> f64 {
    let path = "/v1beta1.DevicePlugin/Allocate";
    let mut input = h2wire::PREFACE.to_vec();
    for i in 0..count {
        let block = request_block(i, path, authority);
        input.extend(frame(HEADERS, END_HEADERS, 2 * i + 1, &block));
        input.extend(frame(DATA, END_STREAM, 2 * i + 1, &grpc_message(&[0x0a, 0x2a, 0x0a, 0x28])));
    }
    let mut best = f64::MAX;
    for _ in 0..5 {
        let mut r = AuthorityRewriter::new();
        let mut out = Vec::with_capacity(input.len() * 2);
        let t = Instant::now();
        // Read-sized chunks, as from a socket.
        for chunk in input.chunks(8192) {
            r.feed(chunk, &mut out);
        }
        best = best.min(t.elapsed().as_nanos() as f64 / f64::from(count));
        std::hint::black_box(&out);
    }
    best
}

fn status_kib(pid: i32, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn ns(v: &serde_json::Value) -> f64 {
    v.as_str().and_then(|s| s.parse::<f64>().ok()).unwrap_or(f64::NAN)
}

fn main() {
    // `cargo bench` passes --bench; nothing to filter.
    let node = Node::preset("h100x8");
    let dir = kubelet_dir(&node);
    let mut k = Kubelet::start(&dir);
    let mut args = plugin_args(&node, &dir);
    args.extend(["--health-recovery-period".into(), "200ms".into(), "--log".into(), "warn".into()]);
    let plugin = Plugin::start(Some(&node), &args, &[("RUST_LOG", "warn")]);
    k.registered("nvidia.com/gpu");
    k.devices("nvidia.com/gpu", |d| d.len() == 8);
    let pid = plugin.pid();
    let binary =
        std::fs::metadata(env!("CARGO_BIN_EXE_nvinject-device-plugin")).map(|m| m.len()).unwrap_or(0);

    std::thread::sleep(Duration::from_secs(2));
    let idle_rss = status_kib(pid, "VmRSS:");
    // PSS splits shared pages (libc, ...) among the processes mapping them.
    let idle_pss = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("Pss:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    let idle_anon = status_kib(pid, "RssAnon:");

    let u0 = node.uuid(0);
    let seq = k
        .call(json!({"op": "allocate_many", "resource": "nvidia.com/gpu", "containers": [[u0]], "count": 1000, "concurrency": 1}))
        .unwrap();
    assert_eq!(seq["succeeded"], 1000, "{seq}");
    let conc = k
        .call(json!({"op": "allocate_many", "resource": "nvidia.com/gpu", "containers": [[u0]], "count": 1000, "concurrency": 100}))
        .unwrap();
    assert_eq!(conc["succeeded"], 1000, "{conc}");

    let events = node.out.join("xid-events");
    let mut xid_ms = Vec::new();
    for round in 0..24 {
        let gpu = round % 8;
        let uuid = node.uuid(gpu);
        let t0 = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as f64;
        inject(
            &events,
            &XidEvent { uuid: uuid.clone(), xid: 79, gpu_instance_id: None, compute_instance_id: None },
        )
        .unwrap();
        let ev = k.wait_event("devices", |v| {
            v["devices"].as_array().unwrap().iter().any(|d| d["id"] == uuid && d["health"] == "Unhealthy")
        });
        xid_ms.push((ns(&ev["at_unix_ns"]) - t0) / 1e6);
        // Wait out the recovery, so every round starts from a healthy node.
        k.devices("nvidia.com/gpu", |d| d.iter().all(|x| x["health"] == "Healthy"));
    }
    let rss_after = status_kib(pid, "VmRSS:");
    let hwm = status_kib(pid, "VmHWM:");
    xid_ms.sort_by(f64::total_cmp);
    let pct = |v: &[f64], p: f64| v[(((p / 100.0) * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];

    println!("nvinject-device-plugin on h100x8 (simulated NVML), kubelet simulator over unix sockets");
    println!("  binary size                         {:>10.2} MiB", binary as f64 / 1048576.0);
    println!(
        "  idle RSS                            {:>10.2} MiB   (goal <= 8 MiB)",
        idle_rss as f64 / 1024.0
    );
    println!(
        "  idle PSS / anonymous                {:>10.2} / {:.2} MiB",
        idle_pss as f64 / 1024.0,
        idle_anon as f64 / 1024.0
    );
    println!(
        "  RSS after the runs below / peak     {:>10.2} / {:.2} MiB",
        rss_after as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    println!(
        "  Allocate, 1000 sequential: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms   (goal p99 < 1 ms)",
        ns(&seq["p50_ns"]) / 1e6,
        ns(&seq["p99_ns"]) / 1e6,
        ns(&seq["max_ns"]) / 1e6
    );
    println!(
        "  Allocate, 1000 at 100 concurrent: p50 {:.3} ms, p99 {:.3} ms, {:.0} calls/s",
        ns(&conc["p50_ns"]) / 1e6,
        ns(&conc["p99_ns"]) / 1e6,
        1000.0 / (ns(&conc["wall_ns"]) / 1e9)
    );
    println!(
        "  XID -> ListAndWatch update, {} rounds: p50 {:.1} ms, max {:.1} ms   (goal < 100 ms)",
        xid_ms.len(),
        pct(&xid_ms, 50.0),
        xid_ms.last().unwrap()
    );

    let socket = dir.join("nvinject-gpu.sock");
    let old = old_kubelet_allocates(&socket, &u0, 1000);
    println!(
        "  Allocate, 1000 sequential, socket path as :authority (kubelet < 1.26): p50 {:.3} ms, p99 {:.3} ms",
        pct(&old, 50.0),
        pct(&old, 99.0)
    );
    println!(
        "  authority rewriter alone, per request (release): {:.0} ns rewriting, {:.0} ns passing a valid one",
        rewriter_ns_per_request(socket.to_str().unwrap(), 10_000),
        rewriter_ns_per_request("localhost", 10_000)
    );
    let rss_end = status_kib(pid, "VmRSS:");
    println!("  RSS at the end                      {:>10.2} MiB", rss_end as f64 / 1024.0);
    drop(plugin);
}
