//! Issue 15's number, measured: how long a GPU node takes from joining to being usable, as the fleet
//! grows. For each fleet size N (`NVINJECT_FLEET_SIZES`, default `1,2,4`): a fresh control plane,
//! deploy/ applied, then N simulated h100x8 nodes joined one after another, each its own kubelet and
//! containerd in namespaces of its own (`cluster::fleet`). Printed per node: seconds from the join's
//! start to the kubelet healthy, and from the kubelet healthy to the node Ready, to
//! `allocatable nvidia.com/gpu` > 0 and to the GPU labels on the Node object; the memory each node
//! holds (its daemons and pods, RSS); and the human steps (none: every node converges on its own).
//! No assertion on time: this prints.
//!
//! `sudo cargo bench -p nvinject-integration --bench fleet_join` (root: namespaces, mknod, cgroups).

use std::path::Path;
use std::time::{Duration, Instant};

use nvinject_cluster_harness::fleet::{API_ADDRESS, Fleet, JoinSpec};
use nvinject_cluster_harness::{
    CONTAINERD_RESTART_DELAY, GPU_NODE_LABEL, SimRoots, cluster_artifacts, test_overlay,
};
use nvinject_image_tool::release_image;
use nvinject_node_harness::artifacts;
use nvinject_node_harness::namespace::isolated;
use nvinject_simnode::artifacts::{simnode_bin, static_hook};

const GPU: &str = "nvidia.com/gpu";

/// One node's milestones, seconds.
struct NodeFigures {
    kubelet: f64,
    ready: f64,
    allocatable: f64,
    labels: f64,
    rss_mib: f64,
}

fn sizes() -> Vec<usize> {
    let spec = std::env::var("NVINJECT_FLEET_SIZES").unwrap_or_else(|_| "1,2,4".into());
    spec.split(',').filter_map(|s| s.trim().parse().ok()).filter(|n| *n > 0).collect()
}

/// The containerd restart delay (`NVINJECT_FLEET_RESTART_DELAY_S`): 5 s as containerd's systemd unit
/// after the installer's default signal restart; 0 for a restart through systemd (`--restart-mode
/// systemd`), which starts it again at once.
fn restart_delay() -> Duration {
    let s = std::env::var("NVINJECT_FLEET_RESTART_DELAY_S").ok().and_then(|v| v.parse::<f64>().ok());
    s.map_or(CONTAINERD_RESTART_DELAY, Duration::from_secs_f64)
}

fn main() {
    let sizes = sizes();
    let restart_delay = restart_delay();
    let artifacts = cluster_artifacts().unwrap_or_else(|e| panic!("{e}"));
    let bin_dir = artifacts::this_build_bin_dir().unwrap_or_else(|e| panic!("{e}"));
    let installer = bin_dir.join("nvinject-installer");
    let image_name = release_image::manifests_image(&installer).unwrap_or_else(|e| panic!("{e}"));
    let simnode = simnode_bin("nvinject-simnode");
    let hook = static_hook();
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy").canonicalize().unwrap();
    isolated("fleet_join", Duration::from_secs(60 * 60), |inside| {
        let work = inside.work();
        // The image deploy/ names, from this build's binaries without their debug info.
        let release = release_image::build_stripped(&bin_dir, &hook, &image_name, work)
            .unwrap_or_else(|e| panic!("{e}"));

        let mut results: Vec<(usize, Vec<NodeFigures>)> = Vec::new();
        for (round, &n) in sizes.iter().enumerate() {
            let mut fleet = Fleet::start_in(inside, &artifacts, &format!("fleet-{round}"))
                .unwrap_or_else(|e| panic!("{e}"));
            let overlay = work.join(format!("overlay-{round}"));
            std::fs::create_dir_all(&overlay).unwrap();
            let sim = SimRoots::of(fleet.shared_sim_dir());
            for (file, text) in test_overlay(&overlay, &deploy, fleet.shared_host_root(), &sim, API_ADDRESS) {
                std::fs::write(overlay.join(file), text).unwrap();
            }
            fleet
                .control()
                .kubectl_out(&["apply", "-k", &overlay.to_string_lossy()])
                .unwrap_or_else(|e| panic!("{e}"));
            let mut figures = Vec::new();
            for i in 0..n {
                let name = format!("gpu-{i}");
                let joined = fleet
                    .join(&JoinSpec {
                        name: name.clone(),
                        labels: vec![(GPU_NODE_LABEL.0.into(), GPU_NODE_LABEL.1.into())],
                        images: vec![release.image.clone()],
                        preset: Some("h100x8".into()),
                        simnode: simnode.clone(),
                        containerd_restart_after: restart_delay,
                    })
                    .unwrap_or_else(|e| panic!("{e}"));
                let healthy = joined.began + joined.kubelet_healthy;
                let (mut ready, mut allocatable, mut labels) = (None, None, None);
                let deadline = Instant::now() + Duration::from_secs(300);
                while ready.is_none() || allocatable.is_none() || labels.is_none() {
                    assert!(
                        Instant::now() < deadline,
                        "node {name} did not converge:\n{}",
                        fleet.agent_log(&name, 30)
                    );
                    if let Ok(node) = fleet.get_json(&["node", &name]) {
                        let now = Instant::now();
                        let is_ready = node["status"]["conditions"]
                            .as_array()
                            .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
                        if ready.is_none() && is_ready {
                            ready = Some(now);
                        }
                        let gpus =
                            node["status"]["allocatable"][GPU].as_str().and_then(|s| s.parse::<u32>().ok());
                        if allocatable.is_none() && gpus.is_some_and(|g| g > 0) {
                            allocatable = Some(now);
                        }
                        if labels.is_none()
                            && node["metadata"]["labels"].get("nvidia.com/gpu.product").is_some()
                        {
                            labels = Some(now);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                let after = |t: Option<Instant>| t.expect("seen").duration_since(healthy).as_secs_f64();
                let rss = fleet.node_memory(&name).unwrap_or(0) as f64 / 1048576.0;
                let f = NodeFigures {
                    kubelet: joined.kubelet_healthy.as_secs_f64(),
                    ready: after(ready),
                    allocatable: after(allocatable),
                    labels: after(labels),
                    rss_mib: rss,
                };
                println!(
                    "N={n} node {name}: join->kubelet healthy {:.1} s; then Ready {:.1} s, allocatable>0 {:.1} s, labels {:.1} s; {:.0} MiB",
                    f.kubelet, f.ready, f.allocatable, f.labels, f.rss_mib
                );
                figures.push(f);
            }
            fleet.stop().unwrap_or_else(|e| panic!("{e}"));
            results.push((n, figures));
        }

        println!();
        println!(
            "fleet join curve (seconds after each node's kubelet reported healthy; h100x8 nodes; 2 cores):"
        );
        println!(
            "  {:>3} {:>5} {:>10} {:>8} {:>16} {:>10} {:>10} {:>12}",
            "N", "node", "join->kub", "Ready", "allocatable>0", "labels", "RSS MiB", "human steps"
        );
        for (n, figures) in &results {
            for (i, f) in figures.iter().enumerate() {
                println!(
                    "  {n:>3} {i:>5} {:>10.1} {:>8.1} {:>16.1} {:>10.1} {:>10.0} {:>12}",
                    f.kubelet, f.ready, f.allocatable, f.labels, f.rss_mib, 0
                );
            }
            let mean = |g: fn(&NodeFigures) -> f64| figures.iter().map(g).sum::<f64>() / figures.len() as f64;
            println!(
                "  {n:>3} {:>5} {:>10.1} {:>8.1} {:>16.1} {:>10.1} {:>10.0} {:>12}",
                "mean",
                mean(|f| f.kubelet),
                mean(|f| f.ready),
                mean(|f| f.allocatable),
                mean(|f| f.labels),
                mean(|f| f.rss_mib),
                0
            );
        }
    });
}
