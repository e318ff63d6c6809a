//! Container start cost of `containerd-shim-nvinject-v2`, measured on real parts (needs root):
//!
//! ```text
//! sudo cargo bench -p nvinject-integration --bench shim_start      # NVINJECT_BENCH_RUNS=20 by default
//! ```
//!
//! On the simulated 8-GPU node, one private containerd 1.6 and one image, `ctr run --rm` wall time
//! (container create, start, exit, delete) for, interleaved:
//! - `runc`: containerd's runc shim alone (`io.containerd.runc.v2`);
//! - `nvinject`: our runtime, no device requested (the proxy's own overhead);
//! - `nvinject+gpu`: our runtime, one GPU requested (injection, plus the CDI hooks runc runs).
//!
//! Then the shim's own time per container from its log lines (read config.json, resolve and apply,
//! write), and the proxy's memory per pod (RSS and PSS of the proxy process while a container runs,
//! next to the runc shim's). Figures are printed; nothing is asserted.

use std::time::{Duration, Instant};

use nvinject_integration::node::{GpuNode, NodeOptions, PROBE_IMAGE, PROBE_PATH, RUNC_RUNTIME, RunOptions};
use nvinject_integration::process;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

struct Series {
    name: &'static str,
    samples: Vec<f64>,
}

impl Series {
    fn sorted(&self) -> Vec<f64> {
        let mut s = self.samples.clone();
        s.sort_by(|a, b| a.total_cmp(b));
        s
    }
    fn median(&self) -> f64 {
        percentile(&self.sorted(), 0.5)
    }
    fn mean(&self) -> f64 {
        self.samples.iter().sum::<f64>() / self.samples.len().max(1) as f64
    }
}

fn pss_kib(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    text.lines().find_map(|l| l.strip_prefix("Pss:")).and_then(|v| v.split_whitespace().next()?.parse().ok())
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let runs: usize = std::env::var("NVINJECT_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    if let Err(e) = process::require_root() {
        eprintln!("shim_start bench: {e}");
        std::process::exit(1);
    }
    // Info level while timing: at debug, every `start` also writes a timing line (measured below).
    let node = GpuNode::start(&NodeOptions { log_level: "info".into(), ..Default::default() })
        .unwrap_or_else(|e| panic!("node setup: {e}"));
    let exit0 = vec![PROBE_PATH.to_owned(), "exit".to_owned(), "0".to_owned()];
    let variants: [(&'static str, RunOptions); 3] = [
        ("runc", RunOptions { runtime: RUNC_RUNTIME.into(), command: exit0.clone(), ..Default::default() }),
        ("nvinject", RunOptions { command: exit0.clone(), ..Default::default() }),
        (
            "nvinject+gpu",
            RunOptions {
                command: exit0.clone(),
                annotations: vec![("cdi.k8s.io/bench".into(), "nvidia.com/gpu=1".into())],
                ..Default::default()
            },
        ),
    ];
    let mut series: Vec<Series> =
        variants.iter().map(|(name, _)| Series { name, samples: Vec::new() }).collect();

    // Warm up page cache, snapshotter and binaries.
    for (i, (_, opts)) in variants.iter().enumerate() {
        for w in 0..2 {
            let r = node.run(&format!("warm-{i}-{w}"), opts).expect("warm-up run");
            assert_eq!(r.status, 0, "warm-up failed: {}", r.stderr);
        }
    }
    for round in 0..runs {
        for (i, (name, opts)) in variants.iter().enumerate() {
            let id = format!("b-{i}-{round}");
            let t = Instant::now();
            let r = node.run(&id, opts).expect("run");
            let dt = t.elapsed().as_secs_f64() * 1000.0;
            assert_eq!(r.status, 0, "{name} run {round} failed: {}", r.stderr);
            series[i].samples.push(dt);
        }
    }

    println!(
        "\n== container start wall time: `ctr run --rm` (create, start, exit, delete), {runs} runs each, interleaved =="
    );
    println!(
        "{:<14} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "runtime", "median ms", "mean ms", "p10 ms", "p90 ms", "max ms"
    );
    for s in &series {
        let sorted = s.sorted();
        println!(
            "{:<14} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            s.name,
            s.median(),
            s.mean(),
            percentile(&sorted, 0.1),
            percentile(&sorted, 0.9),
            sorted.last().copied().unwrap_or(f64::NAN)
        );
    }
    let base = series[0].median();
    println!(
        "ratio nvinject/runc (no device, the proxy alone): {:.3} (median), {:.3} (mean)",
        series[1].median() / base,
        series[1].mean() / series[0].mean()
    );
    println!(
        "ratio nvinject+gpu/runc (1 GPU: injection + CDI hooks): {:.3} (median), {:.3} (mean)",
        series[2].median() / base,
        series[2].mean() / series[0].mean()
    );

    // Where the GPU case's extra time goes: the same GPU request with the spec's hooks removed
    // (no nvinject-hook runs; device nodes, mounts and env still injected), against runc again.
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&node.spec_path).expect("spec")).expect("json");
    if let Some(edits) = spec["containerEdits"].as_object_mut() {
        edits.remove("hooks");
    }
    std::fs::write(&node.spec_path, serde_json::to_vec(&spec).expect("json")).expect("write spec");
    let mut no_hooks = Series { name: "nvinject+gpu, no hooks", samples: Vec::new() };
    let mut runc_again = Series { name: "runc", samples: Vec::new() };
    for round in 0..runs {
        for (tag, series, opts) in
            [("runc", &mut runc_again, &variants[0].1), ("gpu", &mut no_hooks, &variants[2].1)]
        {
            let t = Instant::now();
            let r = node.run(&format!("nh-{tag}-{round}"), opts).expect("run");
            assert_eq!(r.status, 0, "{}", r.stderr);
            series.samples.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    println!(
        "\n== the GPU case without the CDI hooks (same request, hooks removed from the spec), {runs} runs each =="
    );
    for s in [&runc_again, &no_hooks] {
        let sorted = s.sorted();
        println!("{:<24} median {:>7.1} ms   p90 {:>7.1} ms", s.name, s.median(), percentile(&sorted, 0.9));
    }
    println!("ratio (no hooks)/runc: {:.3} (median)", no_hooks.median() / runc_again.median());

    // The shim's own work per container, from its log lines.
    let mut read = Vec::new();
    let mut inject = Vec::new();
    let mut write = Vec::new();
    let mut total = Vec::new();
    for round in 0..runs {
        for line in node.shim_log_for(&format!("b-2-{round}")) {
            if line["message"] == "container create" {
                let (r, i, w) = (
                    line["read_us"].as_f64().unwrap_or(0.0),
                    line["inject_us"].as_f64().unwrap_or(0.0),
                    line["write_us"].as_f64().unwrap_or(0.0),
                );
                read.push(r);
                inject.push(i);
                write.push(w);
                total.push(r + i + w);
            }
        }
    }
    for v in [&mut read, &mut inject, &mut write, &mut total] {
        v.sort_by(|a, b| a.total_cmp(b));
    }
    println!("\n== shim's own time per GPU container (from its log lines, {} samples) ==", total.len());
    println!("{:<28} {:>10} {:>10}", "step", "median us", "p90 us");
    for (name, v) in [
        ("read+parse config.json", &read),
        ("resolve+apply CDI edits", &inject),
        ("serialize+write (rename)", &write),
        ("total", &total),
    ] {
        println!("{:<28} {:>10.0} {:>10.0}", name, percentile(v, 0.5), percentile(v, 0.9));
    }

    // What `start` adds: our start's total time minus the runc shim's own start inside it (logged
    // at debug level, so switch the config to debug for these runs; it is read at every start).
    let config = std::fs::read_to_string(&node.config_path).expect("config");
    std::fs::write(&node.config_path, config.replace("log-level = \"info\"", "log-level = \"debug\""))
        .expect("config");
    for round in 0..runs {
        let r = node.run(&format!("st-{round}"), &variants[1].1).expect("run");
        assert_eq!(r.status, 0, "{}", r.stderr);
    }
    let mut extra = Vec::new();
    let mut inner = Vec::new();
    for round in 0..runs {
        for line in node.shim_log_for(&format!("st-{round}")) {
            if line["message"] == "shim start" {
                let (t, i) =
                    (line["total_us"].as_f64().unwrap_or(0.0), line["inner_us"].as_f64().unwrap_or(0.0));
                extra.push(t - i);
                inner.push(i);
            }
        }
    }
    extra.sort_by(|a, b| a.total_cmp(b));
    inner.sort_by(|a, b| a.total_cmp(b));
    println!("\n== `start` (no device, {} samples) ==", extra.len());
    println!(
        "runc shim's own start inside ours: median {:.0} us, p90 {:.0} us",
        percentile(&inner, 0.5),
        percentile(&inner, 0.9)
    );
    println!(
        "added by ours (proxy socket, spawn, answer): median {:.0} us, p90 {:.0} us",
        percentile(&extra, 0.5),
        percentile(&extra, 0.9)
    );

    // Memory per pod: a long-running GPU container, then its proxy's and its runc shim's memory.
    let mut cmd = node.containerd.ctr();
    cmd.args([
        "run",
        "-d",
        "--runtime",
        "io.containerd.nvinject.v2",
        "--annotation",
        "cdi.k8s.io/bench=nvidia.com/gpu=0",
        PROBE_IMAGE,
        "rss",
        PROBE_PATH,
        "pause",
    ]);
    process::run(&mut cmd).expect("detached container");
    std::thread::sleep(Duration::from_millis(500));
    let shims = node.containerd.shim_processes();
    println!("\n== memory per pod (one running GPU container) ==");
    for p in &shims {
        let role = if p.argv.iter().any(|a| a == "proxy") { "nvinject proxy" } else { "runc shim (inner)" };
        println!(
            "{:<20} pid {:<8} RSS {:>6} KiB   PSS {:>6} KiB",
            role,
            p.pid,
            p.rss_kib,
            pss_kib(p.pid).unwrap_or(0)
        );
    }
    let _ = node.containerd.ctr().args(["tasks", "kill", "-s", "SIGKILL", "rss"]).output();
    std::thread::sleep(Duration::from_millis(300));
    let _ = node.containerd.ctr().args(["tasks", "delete", "-f", "rss"]).output();
    let _ = node.containerd.ctr().args(["containers", "delete", "rss"]).output();
    drop(node);
}
