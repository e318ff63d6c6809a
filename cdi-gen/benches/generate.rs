//! Wall time and peak memory of whole `nvinject-cdi generate` processes on simulated nodes.
//!
//! `cargo bench -p nvinject-cdi-gen` (release build). For the 8-GPU and the MIG presets it builds
//! the node once (`nvinject-simnode build`, needs root), then runs `nvinject-cdi generate` N times
//! (NVINJECT_BENCH_RUNS, default 200, after 10 warm-up runs) writing a JSON spec, as the installer
//! does, and prints the median and p90 wall time and the peak RSS from `wait4`'s rusage. The spec is
//! written twice over: to tmpfs (`/dev/shm`, like `/var/run/cdi` on a node) and to a disk-backed
//! temporary directory, where the fsync of the atomic write costs what the disk makes it cost. The
//! goal from the issue is under 5 ms and 8 MiB per run; nothing here asserts on it.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::{build_node, cdi_bin, generate_command, percentile};

/// One finished run: wall time and peak resident set size in KiB.
// The child is reaped by `wait4`, not `Child::wait`, because only `wait4` returns its rusage.
#[allow(clippy::zombie_processes)]
fn run_once(cmd: &mut Command) -> (Duration, i64) {
    let start = Instant::now();
    let child = cmd.spawn().expect("spawn nvinject-cdi");
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `child` is our unwaited child, `status` and `usage` are valid for writes; the Child
    // is never waited on through std afterwards.
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    let elapsed = start.elapsed();
    assert_eq!(pid, child.id() as libc::pid_t, "wait4: {}", std::io::Error::last_os_error());
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "nvinject-cdi generate failed ({status})"
    );
    (elapsed, usage.ru_maxrss)
}

fn main() {
    // `cargo bench` passes --bench; any other argument is a filter on the preset name.
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let runs: usize = std::env::var("NVINJECT_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let cdi = cdi_bin();
    println!("nvinject-cdi generate, whole process, {runs} runs after 10 warm-up ({})", cdi.display());
    // Other work on the machine shows in the medians; the load says how much there was.
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at start: {}", load.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
    for preset in ["h100x8", "a100-mig"] {
        if !filter.is_empty() && !filter.iter().any(|f| preset.contains(f.as_str())) {
            continue;
        }
        let tmp = tempfile::tempdir().expect("temp dir");
        let node = tmp.path().join("node");
        build_node(preset, &node);
        let shm = Path::new("/dev/shm");
        let tmpfs = shm.is_dir().then(|| tempfile::tempdir_in(shm).expect("temp dir in /dev/shm"));
        let mut targets = vec![("disk", tmp.path().join("out/nvidia.com-gpu.json"))];
        if let Some(t) = &tmpfs {
            targets.insert(0, ("tmpfs", t.path().join("nvidia.com-gpu.json")));
        }
        for (label, out) in targets {
            let mut cmd = generate_command(&cdi, &node, &out);
            for _ in 0..10 {
                run_once(&mut cmd);
            }
            let mut times = Vec::with_capacity(runs);
            let mut peak_kib = 0;
            for _ in 0..runs {
                let (t, rss) = run_once(&mut cmd);
                times.push(t);
                peak_kib = peak_kib.max(rss);
            }
            times.sort();
            let spec_bytes = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
            println!(
                "{preset:>9} -> {label:<5}: median {:.2} ms  p90 {:.2} ms  min {:.2} ms  peak RSS {:.1} MiB  (spec {} bytes)",
                percentile(&times, 0.5).as_secs_f64() * 1e3,
                percentile(&times, 0.9).as_secs_f64() * 1e3,
                times[0].as_secs_f64() * 1e3,
                peak_kib as f64 / 1024.0,
                spec_bytes
            );
        }
    }
}
