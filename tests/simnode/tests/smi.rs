//! The `nvidia-smi` stand-in run from a built driver root, answering through the real simulated
//! NVML (`libnvidia_ml.so` from tests/simnvml) found by glibc through `LD_LIBRARY_PATH`, with no
//! `NVINJECT_SIM_NODE`: the library finds its node in the description embedded in its own file.
//! Needs root (the build makes device nodes).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{build_preset, host, run_build, text};
use nvinject_simnode::artifacts::sim_nvml_lib;
use nvinject_simnode::description::GpuDescription;
use nvinject_simnode::presets;

/// Runs the driver root's `nvidia-smi` the way a user on that node would.
fn smi(out: &Path, args: &[&str]) -> Output {
    let driver = out.join("driver");
    Command::new(driver.join("usr/bin/nvidia-smi"))
        .args(args)
        .env_remove("NVINJECT_SIM_NODE")
        .env("LD_LIBRARY_PATH", driver.join("usr/lib").join(host().multiarch_triple()))
        .output()
        .expect("run nvidia-smi")
}

fn built(preset: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(preset);
    build_preset(preset, &out, &sim_nvml_lib());
    (dir, out)
}

/// The `-L` lines of these GPUs, numbered from 0 as NVML numbers the visible ones.
fn gpu_lines<'a>(gpus: impl IntoIterator<Item = &'a GpuDescription>) -> Vec<String> {
    gpus.into_iter().enumerate().map(|(i, g)| format!("GPU {i}: {} (UUID: {})", g.name, g.uuid)).collect()
}

#[test]
#[ignore = "needs root"]
fn list_prints_one_line_per_gpu_on_h100x8() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let (_dir, out) = built("h100x8");
    let output = smi(&out, &["-L"]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "nvidia-smi -L failed: {stdout}{stderr}");
    let lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 8, "{stdout}");
    assert_eq!(lines, gpu_lines(&presets::preset("h100x8").unwrap().gpus));
}

#[test]
#[ignore = "needs root"]
fn removing_a_device_node_hides_that_gpu() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let (_dir, out) = built("h100x8");
    std::fs::remove_file(out.join("host/dev/nvidia3")).unwrap();
    let output = smi(&out, &["-L"]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stdout}{stderr}");
    let node = presets::preset("h100x8").unwrap();
    let expected = gpu_lines(node.gpus.iter().filter(|g| g.minor != 3));
    assert_eq!(stdout.lines().collect::<Vec<_>>(), expected);
}

#[test]
#[ignore = "needs root"]
fn list_shows_mig_devices_under_their_gpu() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let (_dir, out) = built("a100-mig");
    let output = smi(&out, &["-L"]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stdout}{stderr}");
    let node = presets::preset("a100-mig").unwrap();
    let mut expected = Vec::new();
    for (i, gpu) in node.gpus.iter().enumerate() {
        expected.push(format!("GPU {i}: {} (UUID: {})", gpu.name, gpu.uuid));
        let mig = gpu.mig.as_ref().filter(|m| m.enabled);
        let devices = mig.iter().flat_map(|m| &m.gpu_instances).flat_map(|gi| &gi.compute_instances);
        for (m, ci) in devices.enumerate() {
            expected.push(format!("  MIG {:<11} Device {m:>2}: (UUID: {})", ci.profile, ci.uuid));
        }
    }
    assert_eq!(stdout.lines().collect::<Vec<_>>(), expected);
    // Spot check against the real tool's spacing, independent of the formatting above.
    assert!(
        stdout.contains("\n  MIG 3g.40gb     Device  0: (UUID: MIG-51269d0d-6413-7a11-78a8-27c4a05a9563)\n")
    );
}

#[test]
#[ignore = "needs root"]
fn query_gpu_csv() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let (_dir, out) = built("h100x8");
    let fields = "--query-gpu=index,uuid,name,pci.bus_id,memory.total,minor_number";
    let output = smi(&out, &[fields, "--format=csv"]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stdout}{stderr}");
    let node = presets::preset("h100x8").unwrap();
    let mut expected = vec!["index, uuid, name, pci.bus_id, memory.total [MiB], minor_number".to_owned()];
    for (i, g) in node.gpus.iter().enumerate() {
        expected.push(format!(
            "{i}, {}, {}, {}, {} MiB, {}",
            g.uuid, g.name, g.pci_bus_id, g.memory_mib, g.minor
        ));
    }
    assert_eq!(stdout.lines().collect::<Vec<_>>(), expected);

    let output = smi(&out, &["--query-gpu=uuid,memory.total", "--format=csv,noheader,nounits", "-i", "2"]);
    assert_eq!(text(&output).0, format!("{}, {}\n", node.gpus[2].uuid, node.gpus[2].memory_mib));
}

#[test]
#[ignore = "needs root"]
fn summary_table_shows_versions_and_every_gpu() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let (_dir, out) = built("a100-mig");
    let output = smi(&out, &[]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("NVIDIA-SMI 550.54.15") && stdout.contains("CUDA Version: 12.4"), "{stdout}");
    for gpu in &presets::preset("a100-mig").unwrap().gpus {
        assert!(stdout.contains(&gpu.pci_bus_id), "{} missing:\n{stdout}", gpu.pci_bus_id);
    }
    assert_eq!(stdout.matches("Enabled").count(), 2, "{stdout}");
}

#[test]
#[ignore = "needs root"]
fn driver_not_loaded_prints_the_real_message() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let dir = tempfile::tempdir().unwrap();
    let mut node = presets::preset("single").unwrap();
    node.driver.loaded = false;
    let file = dir.path().join("unloaded.json");
    std::fs::write(&file, node.to_json()).unwrap();
    let out = dir.path().join("node");
    let output = run_build(&[
        "--node",
        file.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--nvml-lib",
        sim_nvml_lib().to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", text(&output).1);
    let output = smi(&out, &["-L"]);
    assert_eq!(
        text(&output).0,
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest \
         NVIDIA driver is installed and running.\n"
    );
    assert_eq!(output.status.code(), Some(9));
}
