//! `nvinject-demo`: the README's first command, end to end in one process.
//!
//! On a machine without NVIDIA hardware it builds the simulated 8-GPU node; on a host with a loaded
//! NVIDIA driver (`/proc/driver/nvidia/version` exists) it uses the real driver. Then: generate the
//! CDI spec with `nvinject-cdi`, start a private containerd (own root, state and socket) that
//! finds `containerd-shim-nvinject-v2` in its PATH, run one container through our runtime asking
//! for two GPUs, print what the container sees from inside, and clean everything up.
//!
//! ```text
//! sudo cargo run -p nvinject-integration --bin nvinject-demo [-- --gpus 0,1 --preset h100x8]
//! ```

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};
use nvinject_node_harness::node::{GpuNode, NodeOptions, RunOptions, report_devices};
use serde_json::Value;

fn main() {
    if let Err(e) = run() {
        eprintln!("nvinject-demo: {e:#}");
        std::process::exit(1);
    }
}

fn arg_value(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn run() -> anyhow::Result<()> {
    let gpus = arg_value("--gpus").unwrap_or_else(|| "0,1".into());
    let preset = arg_value("--preset").unwrap_or_else(|| "h100x8".into());
    let real = Path::new("/proc/driver/nvidia/version").exists();
    let started = Instant::now();

    println!("== nvinject demo ==");
    if real {
        let version = std::fs::read_to_string("/proc/driver/nvidia/version").unwrap_or_default();
        println!("1. NVIDIA driver found: {}", version.lines().next().unwrap_or("").trim());
    } else {
        println!(
            "1. no NVIDIA driver here: building the simulated node `{preset}` (device nodes, driver files)"
        );
    }
    let node =
        GpuNode::start(&NodeOptions { preset: preset.clone(), real_driver: real, ..Default::default() })
            .context("setting up the node and a private containerd")?;
    if !real {
        println!("   simulated node {}: {} GPUs", node.sim.display(), node.gpu_count());
    }
    let spec = nvinject_cdi::load_file(&node.spec_path)?;
    let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
    println!(
        "2. nvinject-cdi generate -> {} ({} devices: {})",
        node.spec_path.display(),
        names.len(),
        names.join(" ")
    );
    println!(
        "3. private containerd {} running (pid {}, socket {}), runtime io.containerd.nvinject.v2 -> {}",
        node.containerd.server_version().unwrap_or_else(|_| "?".into()),
        node.containerd.pid(),
        node.containerd.socket.display(),
        node.bin_dir.join("containerd-shim-nvinject-v2").display()
    );

    let request: Vec<String> = gpus.split(',').map(|g| format!("nvidia.com/gpu={}", g.trim())).collect();
    let request = request.join(",");
    println!("4. ctr run --runtime io.containerd.nvinject.v2 --annotation cdi.k8s.io/demo={request} probe");
    let t = Instant::now();
    let result = node.run(
        "nvinject-demo",
        &RunOptions { annotations: vec![("cdi.k8s.io/demo".into(), request.clone())], ..Default::default() },
    )?;
    let took = t.elapsed();
    if result.status != 0 || result.report.is_none() {
        bail!("the container failed (exit {}): {}{}", result.status, result.stderr, result.stdout);
    }
    let report = result.report();
    println!("   container ran in {:.0} ms; from inside it sees:", took.as_secs_f64() * 1000.0);
    for (path, (open, minor)) in report_devices(report) {
        println!("     {path:<28} minor {minor:<4} open(): {open}");
    }
    let smi: Vec<&str> =
        report["nvidia_smi"]["lines"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    println!("   nvidia-smi -L:");
    for line in &smi {
        println!("     {line}");
    }
    let libs: Vec<&str> = report["ldconfig"]["lines"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|l| l.contains("nvidia") || l.contains("cuda"))
        .collect();
    println!("   ldconfig -p lists {} driver libraries, e.g.:", libs.len());
    for line in libs.iter().take(4) {
        println!("     {}", line.trim());
    }
    println!("   dlopen(\"libnvidia-ml.so.1\"): {}", summarize_nvml(&report["nvml"]));
    if let Some(line) =
        node.shim_log_for("nvinject-demo").into_iter().find(|l| l["message"] == "container create")
    {
        println!(
            "   shim log: source={} injected={} (read {} us, inject {} us, write {} us)",
            line["source"], line["injected"], line["read_us"], line["inject_us"], line["write_us"]
        );
    }
    drop(node);
    println!(
        "5. cleaned up: containerd and its shims stopped by PID, mounts removed, temp dir deleted ({:.1} s total)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn summarize_nvml(nvml: &Value) -> String {
    match (nvml["dlopen"].as_str(), nvml["count"].as_u64()) {
        (Some("ok"), Some(n)) => format!("ok, nvmlInit ok, {n} GPUs: {}", nvml["uuids"]),
        (Some("ok"), None) => format!("ok, but {nvml}"),
        (Some(err), _) => err.to_owned(),
        _ => nvml.to_string(),
    }
}
