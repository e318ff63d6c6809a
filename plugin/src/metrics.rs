//! Counters and the optional `/metrics` endpoint (Prometheus text format 0.0.4).
//!
//! Counting is a few map updates under a mutex; rendering is a pure function of the counters and
//! the device list. The HTTP side is deliberately tiny (one request per connection, `GET /metrics`
//! only) so the plugin carries no HTTP framework.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[derive(Debug, Default)]
struct Counters {
    allocations: BTreeMap<String, u64>,
    allocation_errors: BTreeMap<String, u64>,
    registrations: BTreeMap<String, u64>,
    xids: BTreeMap<(String, String), u64>,
    event_wait_errors: u64,
}

/// Plugin-wide counters, shared by the gRPC services and the health loop.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Counters>,
}

/// Devices of one resource by health, for the gauge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceHealthCount {
    /// Resource name.
    pub resource: String,
    /// Healthy devices (as advertised, replicas counted).
    pub healthy: usize,
    /// Unhealthy devices.
    pub unhealthy: usize,
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Counters) -> R) -> R {
        // A panic while counting cannot leave the maps inconsistent; keep going with them.
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    /// A container allocation answered (`ok`) or refused.
    pub fn allocation(&self, resource: &str, ok: bool, containers: u64) {
        self.with(|c| {
            let map = if ok { &mut c.allocations } else { &mut c.allocation_errors };
            *map.entry(resource.to_owned()).or_default() += containers;
        });
    }

    /// A successful registration with the kubelet.
    pub fn registration(&self, resource: &str) {
        self.with(|c| *c.registrations.entry(resource.to_owned()).or_default() += 1);
    }

    /// An XID seen on `gpu` (`unknown` when NVML did not name one).
    pub fn xid(&self, gpu: &str, xid: Option<u64>) {
        let x = xid.map_or_else(|| "unknown".to_owned(), |x| x.to_string());
        self.with(|c| *c.xids.entry((gpu.to_owned(), x)).or_default() += 1);
    }

    /// NVML's event wait failed.
    pub fn event_wait_error(&self) {
        self.with(|c| c.event_wait_errors += 1);
    }

    /// Successful registrations of `resource` so far.
    pub fn registrations_of(&self, resource: &str) -> u64 {
        self.with(|c| c.registrations.get(resource).copied().unwrap_or(0))
    }

    /// The exposition text.
    pub fn render(&self, devices: &[ResourceHealthCount]) -> String {
        self.with(|c| render(c, devices))
    }
}

fn render(c: &Counters, devices: &[ResourceHealthCount]) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, u64)>| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in rows {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    };
    let mut rows = Vec::new();
    for d in devices {
        rows.push((format!("{{resource=\"{}\",health=\"Healthy\"}}", esc(&d.resource)), d.healthy as u64));
        rows.push((
            format!("{{resource=\"{}\",health=\"Unhealthy\"}}", esc(&d.resource)),
            d.unhealthy as u64,
        ));
    }
    family("nvinject_device_plugin_devices", "gauge", "Devices advertised to the kubelet, by health.", rows);
    let by_resource = |m: &BTreeMap<String, u64>| {
        m.iter().map(|(r, v)| (format!("{{resource=\"{}\"}}", esc(r)), *v)).collect()
    };
    family(
        "nvinject_device_plugin_allocations_total",
        "counter",
        "Container allocations answered.",
        by_resource(&c.allocations),
    );
    family(
        "nvinject_device_plugin_allocation_errors_total",
        "counter",
        "Container allocations refused.",
        by_resource(&c.allocation_errors),
    );
    family(
        "nvinject_device_plugin_registrations_total",
        "counter",
        "Successful registrations with the kubelet.",
        by_resource(&c.registrations),
    );
    family(
        "nvinject_device_plugin_xid_events_total",
        "counter",
        "XID events seen, critical or not.",
        c.xids.iter().map(|((g, x), v)| (format!("{{gpu=\"{}\",xid=\"{}\"}}", esc(g), esc(x)), *v)).collect(),
    );
    family(
        "nvinject_device_plugin_event_wait_errors_total",
        "counter",
        "Failed NVML event waits (retried).",
        vec![(String::new(), c.event_wait_errors)],
    );
    out
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Serves `GET /metrics` on `listener` until the task is dropped. `body` renders the page.
pub async fn serve(listener: TcpListener, body: impl Fn() -> String + Send + Sync + 'static) {
    let body = std::sync::Arc::new(body);
    loop {
        let mut stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, typically: retrying at once would spin on the
                // single-threaded runtime the gRPC services share.
                tracing::warn!(error = %e, "cannot accept a /metrics connection; pausing");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let body = body.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let mut n = 0;
            // Read the request head (bounded); a client that sends nothing is dropped after 5 s.
            let read = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                while n < buf.len() {
                    match stream.read(&mut buf[n..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(k) => n += k,
                    }
                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            })
            .await;
            if read.is_err() {
                return;
            }
            let head = String::from_utf8_lossy(&buf[..n]);
            let first = head.lines().next().unwrap_or("");
            let mut parts = first.split_whitespace();
            let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let response = if method == "GET" && (path == "/metrics" || path.starts_with("/metrics?")) {
                let text = body();
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                )
            } else {
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned()
            };
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_gauges() {
        let m = Metrics::default();
        m.allocation("nvidia.com/gpu", true, 2);
        m.allocation("nvidia.com/gpu", false, 1);
        m.registration("nvidia.com/gpu");
        m.xid("GPU-1", Some(79));
        m.xid("GPU-1", Some(79));
        m.xid("GPU-1", None);
        m.event_wait_error();
        let text =
            m.render(&[ResourceHealthCount { resource: "nvidia.com/gpu".into(), healthy: 7, unhealthy: 1 }]);
        for line in [
            "nvinject_device_plugin_devices{resource=\"nvidia.com/gpu\",health=\"Healthy\"} 7",
            "nvinject_device_plugin_devices{resource=\"nvidia.com/gpu\",health=\"Unhealthy\"} 1",
            "nvinject_device_plugin_allocations_total{resource=\"nvidia.com/gpu\"} 2",
            "nvinject_device_plugin_allocation_errors_total{resource=\"nvidia.com/gpu\"} 1",
            "nvinject_device_plugin_registrations_total{resource=\"nvidia.com/gpu\"} 1",
            "nvinject_device_plugin_xid_events_total{gpu=\"GPU-1\",xid=\"79\"} 2",
            "nvinject_device_plugin_xid_events_total{gpu=\"GPU-1\",xid=\"unknown\"} 1",
            "nvinject_device_plugin_event_wait_errors_total 1",
            "# TYPE nvinject_device_plugin_xid_events_total counter",
        ] {
            assert!(text.lines().any(|l| l == line), "missing `{line}` in\n{text}");
        }
        assert_eq!(m.registrations_of("nvidia.com/gpu"), 1);
    }

    #[tokio::test]
    async fn serves_metrics_over_http_on_loopback() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, || "up 1\n".to_owned()));
        let get = |path: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let ok = get("/metrics").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK") && ok.ends_with("\r\n\r\nup 1\n"), "{ok}");
        assert!(get("/other").await.starts_with("HTTP/1.1 404"));
        server.abort();
    }
}
