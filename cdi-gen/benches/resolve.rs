//! What the shim pays per container start to resolve a device: `Registry::scan` of the spec
//! directories plus `resolve`, in process, on the spec `nvinject-cdi generate` writes for the MIG
//! preset (JSON, in the second directory, as the installer writes it) next to another vendor's
//! YAML spec in the first. Prints median and p90; asserts nothing about time.

use std::hint::black_box;
use std::time::{Duration, Instant};

use nvinject_cdi::{QualifiedName, Registry};

mod common;

use common::{build_node, cdi_bin, generate_command, percentile};

const OTHER_VENDOR: &str = "cdiVersion: 0.5.0\nkind: vendor.example/nic\ndevices:\n- name: eth1\n  containerEdits:\n    env: [NIC=1]\n";

fn report(label: &str, mut times: Vec<Duration>) {
    times.sort();
    let at = |p: f64| percentile(&times, p).as_secs_f64() * 1e6;
    println!("{label:<44} median {:>7.1} us  p90 {:>7.1} us", at(0.5), at(0.9));
}

fn main() {
    let runs: usize = std::env::var("NVINJECT_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(500);
    let tmp = tempfile::tempdir().expect("temp dir");
    let node = tmp.path().join("node");
    build_node("a100-mig", &node);
    let (etc, run) = (tmp.path().join("etc-cdi"), tmp.path().join("run-cdi"));
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::write(etc.join("vendor.example-nic.yaml"), OTHER_VENDOR).unwrap();
    let generated = generate_command(&cdi_bin(), &node, &run.join("nvidia.com-gpu.json"))
        .status()
        .expect("run nvinject-cdi");
    assert!(generated.success());
    let dirs = [etc, run];
    let name: QualifiedName = "nvidia.com/gpu=1:3".parse().unwrap();
    println!(
        "CDI registry, {runs} runs, a100-mig spec ({} bytes JSON)",
        std::fs::metadata(dirs[1].join("nvidia.com-gpu.json")).unwrap().len()
    );

    let mut cold = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        let registry = Registry::scan(&dirs);
        black_box(registry.resolve(&name).expect("resolves"));
        cold.push(start.elapsed());
    }
    report("scan + resolve (fresh registry)", cold);

    let mut registry = Registry::scan(&dirs);
    registry.resolve(&name).unwrap();
    let mut warm = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        registry.refresh();
        black_box(registry.resolve(&name).expect("resolves"));
        warm.push(start.elapsed());
    }
    report("refresh + resolve (files unchanged, cached)", warm);
}
