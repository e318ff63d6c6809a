//! Container start cost of `containerd-shim-nvinject-v2`, measured on real parts (needs root):
//!
//! ```text
//! sudo cargo bench -p nvinject-integration --bench shim_start      # NVINJECT_BENCH_RUNS=20 by default
//! ```
//!
//! On the simulated 8-GPU node, one private containerd (Debian 12's 1.6, or the build
//! `NVINJECT_CONTAINERD=1.7|2.1` selects, see `nvinject_node_harness::containerd`; its version is
//! printed first) and one image, `ctr run --rm` wall time
//! (container create, start, exit, delete) for, interleaved:
//! - `runc`: containerd's runc shim alone (`io.containerd.runc.v2`);
//! - `nvinject`: our runtime, no device requested (the proxy's own overhead);
//! - `nvinject+gpu`: our runtime, one GPU requested, as it runs by default (`[runtime]
//!   one-hook-run`): the injected bind mounts and the spec's two hook runs done by one
//!   `nvinject-hook inject` process, the cache built from the image's own;
//! - `nvinject+gpu, runc mounts`: the same with `one-hook-run = false`: runc making each mount and
//!   running each hook, the cache built by a full scan (how every GPU container started before).
//!
//! Then where the GPU case's extra time goes: the same request against copies of the spec under
//! other kinds (no hooks and no mounts; no hooks, so runc makes the mounts; only the
//! `create-symlinks` hook, only the `update-ldcache` hook, either taking the mounts into its run),
//! interleaved with runc; the shim's own time per container from its log lines (read config.json,
//! resolve and apply, write); and the proxy's memory per pod (RSS and PSS of the proxy process while
//! a container runs, next to the runc shim's); and the hook's own run against the OCI `timeout` the
//! spec gives it (the spec pointed at a wrapper that times the real hook). Figures are printed;
//! nothing is asserted.
//!
//! To measure another build's binaries with this same harness (before/after comparisons), point
//! `NVINJECT_ARTIFACTS_DIR` at that build's profile directory (see `nvinject_simnode::artifacts`).
//! `NVINJECT_BENCH_SAMPLES=<file>` appends every sample as a tab-separated `label phase series ms`
//! line (label: `NVINJECT_BENCH_LABEL`, default `run`; phase: `main` or `breakdown`), so several
//! runs can be pooled.

use std::io::Write;
use std::time::{Duration, Instant};

use nvinject_node_harness::node::{GpuNode, NodeOptions, PROBE_IMAGE, PROBE_PATH, RUNC_RUNTIME, RunOptions};
use nvinject_node_harness::process;
use serde_json::Value;

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

/// The 1-minute load average: the machine is shared, so every table says how busy it was.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// `NVINJECT_BENCH_SAMPLES`: where raw samples are appended (`label phase series ms`, tab-separated:
/// series names hold commas), if anywhere.
struct SampleLog {
    label: String,
    file: Option<std::fs::File>,
}

impl SampleLog {
    fn from_env() -> SampleLog {
        let label = std::env::var("NVINJECT_BENCH_LABEL").unwrap_or_else(|_| "run".into());
        let file = std::env::var_os("NVINJECT_BENCH_SAMPLES").map(|p| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)
                .unwrap_or_else(|e| panic!("NVINJECT_BENCH_SAMPLES={}: {e}", p.to_string_lossy()))
        });
        SampleLog { label, file }
    }
    fn write(&mut self, phase: &str, series: &[&Series]) {
        let Some(file) = &mut self.file else { return };
        for s in series {
            for v in &s.samples {
                writeln!(file, "{}\t{phase}\t{}\t{v:.3}", self.label, s.name)
                    .expect("write NVINJECT_BENCH_SAMPLES");
            }
        }
    }
}

/// Prints a table of `series` (median, mean, p10, p90, max) and, against `base`, the ratios of
/// medians and of p90s.
fn print_table(series: &[&Series], base: &Series) {
    println!(
        "{:<26} {:>9} {:>9} {:>9} {:>9} {:>9} {:>13} {:>10}",
        "series", "median ms", "mean ms", "p10 ms", "p90 ms", "max ms", "median/runc", "p90/runc"
    );
    let base_sorted = base.sorted();
    for s in series {
        let sorted = s.sorted();
        println!(
            "{:<26} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>13.3} {:>10.3}",
            s.name,
            s.median(),
            s.mean(),
            percentile(&sorted, 0.1),
            percentile(&sorted, 0.9),
            sorted.last().copied().unwrap_or(f64::NAN),
            s.median() / base.median(),
            percentile(&sorted, 0.9) / percentile(&base_sorted, 0.9),
        );
    }
}

/// Which hooks (by subcommand) a spec variant keeps.
type KeepHook = fn(&str) -> bool;

/// A copy of the spec under kind `kind`, keeping only the hooks `keep` accepts (by subcommand:
/// the hook's second argument, `create-symlinks` or `update-ldcache`).
fn spec_variant(spec: &Value, kind: &str, keep: impl Fn(&str) -> bool) -> Value {
    let mut spec = spec.clone();
    spec["kind"] = Value::String(kind.into());
    let subcommand = |h: &Value| h["args"].get(1).and_then(Value::as_str).unwrap_or("").to_owned();
    filter_hooks(spec.get_mut("containerEdits"), &subcommand, &keep);
    // Device-level hooks too (nvinject-cdi puts them at the spec level today).
    if let Some(devices) = spec.get_mut("devices").and_then(Value::as_array_mut) {
        for d in devices {
            filter_hooks(d.get_mut("containerEdits"), &subcommand, &keep);
        }
    }
    spec
}

fn filter_hooks(
    edits: Option<&mut Value>,
    subcommand: &impl Fn(&Value) -> String,
    keep: &impl Fn(&str) -> bool,
) {
    let Some(obj) = edits.and_then(Value::as_object_mut) else { return };
    if let Some(hooks) = obj.get_mut("hooks").and_then(Value::as_array_mut) {
        hooks.retain(|h| keep(&subcommand(h)));
        if hooks.is_empty() {
            obj.remove("hooks");
        }
    }
}

/// A copy of the spec under kind `kind` with no mounts and no hooks (devices and env only).
fn spec_without_mounts_or_hooks(spec: &Value, kind: &str) -> Value {
    let mut spec = spec_variant(spec, kind, |_| false);
    let strip = |edits: Option<&mut Value>| {
        if let Some(obj) = edits.and_then(Value::as_object_mut) {
            obj.remove("mounts");
        }
    };
    strip(spec.get_mut("containerEdits"));
    if let Some(devices) = spec.get_mut("devices").and_then(Value::as_array_mut) {
        for d in devices {
            strip(d.get_mut("containerEdits"));
        }
    }
    spec
}

fn pss_kib(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    text.lines().find_map(|l| l.strip_prefix("Pss:")).and_then(|v| v.split_whitespace().next()?.parse().ok())
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let runs: usize = std::env::var("NVINJECT_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    if let Err(e) = process::ensure_root() {
        eprintln!("shim_start bench: {e}");
        std::process::exit(1);
    }
    match std::env::var_os(nvinject_simnode::artifacts::ARTIFACTS_DIR_ENV) {
        Some(dir) if !dir.is_empty() => {
            println!("binaries: {} (NVINJECT_ARTIFACTS_DIR)", dir.to_string_lossy())
        }
        _ => println!("binaries: this build"),
    }
    // Info level while timing: at debug, every `start` also writes a timing line (measured below).
    let node = GpuNode::start(&NodeOptions { log_level: "info".into(), ..Default::default() })
        .unwrap_or_else(|e| panic!("node setup: {e}"));
    // `ctr run` goes around containerd's CRI, so its own CDI (2.x) plays no part in these figures.
    println!(
        "containerd: {} (server {})",
        node.containerd.build.label(),
        node.containerd.server_version().unwrap_or_else(|_| "?".into())
    );
    let exit0 = vec![PROBE_PATH.to_owned(), "exit".to_owned(), "0".to_owned()];
    let gpu1 = vec![("cdi.k8s.io/bench".into(), "nvidia.com/gpu=1".into())];
    // (name, run, one-hook-run)
    let variants: [(&'static str, RunOptions, bool); 4] = [
        (
            "runc",
            RunOptions { runtime: RUNC_RUNTIME.into(), command: exit0.clone(), ..Default::default() },
            true,
        ),
        ("nvinject", RunOptions { command: exit0.clone(), ..Default::default() }, true),
        (
            "nvinject+gpu",
            RunOptions { command: exit0.clone(), annotations: gpu1.clone(), ..Default::default() },
            true,
        ),
        (
            "nvinject+gpu, runc mounts",
            RunOptions { command: exit0.clone(), annotations: gpu1.clone(), ..Default::default() },
            false,
        ),
    ];
    let mut series: Vec<Series> =
        variants.iter().map(|(name, _, _)| Series { name, samples: Vec::new() }).collect();

    // Warm up page cache, snapshotter and binaries.
    for (i, (_, opts, in_hook)) in variants.iter().enumerate() {
        node.set_one_hook_run(*in_hook).expect("config");
        for w in 0..2 {
            let r = node.run(&format!("warm-{i}-{w}"), opts).expect("warm-up run");
            assert_eq!(r.status, 0, "warm-up failed: {}", r.stderr);
        }
    }
    let mut samples = SampleLog::from_env();
    let load_before = loadavg();
    for round in 0..runs {
        for (i, (name, opts, in_hook)) in variants.iter().enumerate() {
            node.set_one_hook_run(*in_hook).expect("config");
            let id = format!("b-{i}-{round}");
            let t = Instant::now();
            let r = node.run(&id, opts).expect("run");
            let dt = t.elapsed().as_secs_f64() * 1000.0;
            assert_eq!(r.status, 0, "{name} run {round} failed: {}", r.stderr);
            series[i].samples.push(dt);
        }
    }

    let load_after = loadavg();
    node.set_one_hook_run(true).expect("config");
    samples.write("main", &[&series[0], &series[1], &series[2], &series[3]]);
    println!(
        "\n== container start wall time: `ctr run --rm` (create, start, exit, delete), {runs} runs each, interleaved \
         (load average {load_before} before, {load_after} after) =="
    );
    print_table(&[&series[0], &series[1], &series[2], &series[3]], &series[0]);
    let base = series[0].median();
    println!(
        "ratio nvinject/runc (no device, the proxy alone): {:.3} (median), {:.3} (mean)",
        series[1].median() / base,
        series[1].mean() / series[0].mean()
    );
    let p90 = |s: &Series| percentile(&s.sorted(), 0.9);
    println!(
        "RATIO nvinject+gpu/runc (1 GPU: injection + CDI hooks): {:.3} (median), {:.3} (p90), {:.3} (mean)   [goal <= 1.15]",
        series[2].median() / base,
        p90(&series[2]) / p90(&series[0]),
        series[2].mean() / series[0].mean()
    );
    println!(
        "ratio with runc making the mounts (one-hook-run = false, as before): {:.3} (median), {:.3} (p90), {:.3} (mean)",
        series[3].median() / base,
        p90(&series[3]) / p90(&series[0]),
        series[3].mean() / series[0].mean()
    );

    // Where the GPU case's extra time goes: the same request against copies of the spec under
    // other kinds, each keeping some of the hooks, interleaved with runc and the full spec. Written
    // only now, so the runs above read the one spec a node has.
    let spec: Value = serde_json::from_slice(&std::fs::read(&node.spec_path).expect("spec")).expect("json");
    let hooks: Vec<String> = spec["containerEdits"]["hooks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| h["args"].get(1).and_then(Value::as_str).unwrap_or("?").to_owned())
        .collect();
    println!("\nthe spec's hooks: {}", if hooks.is_empty() { "none".to_owned() } else { hooks.join(", ") });
    // Without nvinject hooks in a spec the shim has no hook to give mounts to: runc makes them.
    let breakdown: [(&'static str, &str, KeepHook); 3] = [
        ("gpu, no hooks (runc mounts)", "nvinject-bench.example/nohooks", |_| false),
        ("gpu, create-symlinks only", "nvinject-bench.example/symlinks", |h| h == "create-symlinks"),
        ("gpu, update-ldcache only", "nvinject-bench.example/ldcache", |h| h == "update-ldcache"),
    ];
    let bare_kind = "nvinject-bench.example/bare";
    let bare_file = node.cdi_dir.join("nvinject-bench.example-bare.json");
    std::fs::write(
        &bare_file,
        serde_json::to_vec(&spec_without_mounts_or_hooks(&spec, bare_kind)).expect("json"),
    )
    .expect("write spec variant");
    let mut phase2: Vec<(Series, RunOptions)> = vec![
        (Series { name: "runc", samples: Vec::new() }, variants[0].1.clone()),
        (Series { name: "gpu, all hooks", samples: Vec::new() }, variants[2].1.clone()),
        (
            Series { name: "gpu, no mounts, no hooks", samples: Vec::new() },
            RunOptions {
                command: exit0.clone(),
                annotations: vec![("cdi.k8s.io/bench".into(), format!("{bare_kind}=1"))],
                ..Default::default()
            },
        ),
    ];
    for (name, kind, keep) in breakdown {
        let file = node.cdi_dir.join(format!("{}.json", kind.replace('/', "-")));
        std::fs::write(&file, serde_json::to_vec(&spec_variant(&spec, kind, keep)).expect("json"))
            .expect("write spec variant");
        let opts = RunOptions {
            command: exit0.clone(),
            annotations: vec![("cdi.k8s.io/bench".into(), format!("{kind}=1"))],
            ..Default::default()
        };
        phase2.push((Series { name, samples: Vec::new() }, opts));
    }
    for (i, (_, opts)) in phase2.iter().enumerate() {
        let r = node.run(&format!("warm-nh-{i}"), opts).expect("warm-up run");
        assert_eq!(r.status, 0, "warm-up failed: {}", r.stderr);
    }
    let load_before = loadavg();
    for round in 0..runs {
        for (i, (s, opts)) in phase2.iter_mut().enumerate() {
            let t = Instant::now();
            let r = node.run(&format!("nh-{i}-{round}"), opts).expect("run");
            assert_eq!(r.status, 0, "{} run {round} failed: {}", s.name, r.stderr);
            s.samples.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    let load_after = loadavg();
    let phase2: Vec<&Series> = phase2.iter().map(|(s, _)| s).collect();
    samples.write("breakdown", &phase2);
    println!(
        "\n== where the GPU case's time goes: the same request with some hooks removed (copies of the spec \
         under other kinds), {runs} runs each, interleaved (load average {load_before} before, {load_after} after) =="
    );
    print_table(&phase2, phase2[0]);
    let bare = phase2[2].median();
    println!(
        "median cost over runc: devices and env only (proxy, edits, runc making the device nodes) {:+.1} ms; \
         over that: runc making the mounts {:+.1} ms; one hook run making the mounts, links and cache {:+.1} ms \
         (mounts and links only {:+.1} ms, mounts and cache only {:+.1} ms)",
        bare - phase2[0].median(),
        phase2[3].median() - bare,
        phase2[1].median() - bare,
        phase2[4].median() - bare,
        phase2[5].median() - bare,
    );

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

    hook_run_against_its_timeout(&node, runs);

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

/// The hook's own run (`nvinject-hook inject`, as runc runs it for a 1-GPU container) against the
/// OCI `timeout` the spec gives it: the spec is regenerated with `--hook-path` at a wrapper that
/// times the real hook (the wrapper's own shell is outside the figure) and logs nanoseconds.
fn hook_run_against_its_timeout(node: &GpuNode, runs: usize) {
    let dir = node.base().join("timed-hook");
    std::fs::create_dir_all(&dir).expect("timed-hook dir");
    let log = dir.join("ns.log");
    let wrapper = dir.join("nvinject-hook");
    let real = node.bin_dir.join("nvinject-hook");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nt0=$(date +%s%N)\n'{}' \"$@\"\nrc=$?\nt1=$(date +%s%N)\necho $((t1 - t0)) >> '{}'\nexit $rc\n",
            real.display(),
            log.display()
        ),
    )
    .expect("wrapper");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    nvinject_node_harness::node::generate_spec_with(&node.roots, &wrapper, &node.spec_path, &[])
        .expect("spec with the timing wrapper");
    let spec: Value = serde_json::from_slice(&std::fs::read(&node.spec_path).expect("spec")).expect("json");
    let timeout_s = spec["containerEdits"]["hooks"][0]["timeout"].as_f64().unwrap_or(f64::NAN);
    let opts = RunOptions {
        command: vec![PROBE_PATH.to_owned(), "exit".to_owned(), "0".to_owned()],
        annotations: vec![("cdi.k8s.io/bench".into(), "nvidia.com/gpu=1".into())],
        ..Default::default()
    };
    for round in 0..runs + 2 {
        let r = node.run(&format!("timed-{round}"), &opts).expect("run");
        assert_eq!(r.status, 0, "timed run {round} failed: {}", r.stderr);
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    // The first two runs warm the page cache for the wrapper.
    let mut ms: Vec<f64> =
        text.lines().skip(2).filter_map(|l| l.trim().parse::<f64>().ok()).map(|ns| ns / 1e6).collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    let worst = ms.last().copied().unwrap_or(f64::NAN);
    println!("\n== the hook's own run against its OCI timeout ({} runs of a 1-GPU container) ==", ms.len());
    println!(
        "hook run: median {:.1} ms, p90 {:.1} ms, max {:.1} ms; spec timeout {timeout_s} s = {:.0}x the slowest run",
        percentile(&ms, 0.5),
        percentile(&ms, 0.9),
        worst,
        timeout_s * 1000.0 / worst
    );
    nvinject_node_harness::node::generate_spec(&node.roots, &real, &node.spec_path).expect("spec back");
}
