//! The project's NVML layer against the simulated node: every preset's GPUs, MIG tree, NVLink map,
//! PCIe topology and versions read back through nvml-wrapper, which dlopens the simulated
//! `libnvidia-ml.so.1` from a built driver root. Needs root (the node's device nodes are made with
//! mknod).

use std::path::{Path, PathBuf};
use std::process::Command;

use nvinject_gpu::{Inventory, PciBusId, TopologyLevel, discover};
use nvinject_simnode::NodeDescription;
use nvinject_simnode::artifacts::simnode_bin;
use nvinject_simnode::presets;

/// Builds `preset` into a temp dir; returns the dir guard and the driver root's NVML library path.
fn build_node(preset: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("node");
    let status = Command::new(simnode_bin("nvinject-simnode"))
        .args(["build", "--preset", preset, "--out"])
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success(), "nvinject-simnode build --preset {preset} failed");
    let lib = out.join("driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
    assert!(lib.exists(), "{} missing", lib.display());
    (dir, lib)
}

fn read(lib: &Path) -> Inventory {
    discover(Some(lib)).unwrap_or_else(|e| panic!("discovery through {} failed: {e}", lib.display()))
}

/// Expected PCIe level between two GPUs of a description (the simulated topology rule).
fn expected_level(node: &NodeDescription, a: usize, b: usize) -> TopologyLevel {
    let (ga, gb) = (&node.gpus[a], &node.gpus[b]);
    if ga.pcie_switch.is_some() && ga.pcie_switch == gb.pcie_switch {
        TopologyLevel::Single
    } else if ga.numa_node == gb.numa_node {
        TopologyLevel::Node
    } else {
        TopologyLevel::System
    }
}

/// Builds `name`, checks everything NVML reads back against its description, and returns the
/// inventory for preset-specific checks.
fn check_preset(name: &str) -> Inventory {
    let node = presets::preset(name).unwrap();
    let (_dir, lib) = build_node(name);
    let inv = read(&lib);

    assert_eq!(inv.driver.version, node.driver.version, "{name}: driver version");
    assert_eq!(
        inv.driver.cuda.major * 1000 + inv.driver.cuda.minor * 10,
        node.driver.cuda_version as u32,
        "{name}: CUDA version"
    );
    assert!(inv.driver.nvml_version.ends_with(&node.driver.version), "{name}: {}", inv.driver.nvml_version);
    assert_eq!(inv.gpus.len(), node.gpus.len(), "{name}: GPU count");

    for (i, (gpu, want)) in inv.gpus.iter().zip(&node.gpus).enumerate() {
        let at = format!("{name} gpu {i}");
        assert_eq!(gpu.index, i as u32, "{at}");
        assert_eq!(gpu.uuid.as_str(), want.uuid, "{at}");
        assert_eq!(gpu.name, want.name, "{at}");
        assert_eq!(gpu.minor, want.minor, "{at}");
        assert_eq!(gpu.pci_bus_id, PciBusId::parse(&want.pci_bus_id).unwrap(), "{at}");
        assert_eq!(gpu.memory_bytes, want.memory_mib << 20, "{at}");
        assert_eq!(
            [gpu.compute_capability.major as i32, gpu.compute_capability.minor as i32],
            want.compute_capability,
            "{at}"
        );
        let arch = serde_json::to_value(want.architecture).unwrap();
        assert_eq!(gpu.architecture, arch.as_str().unwrap(), "{at}");
        assert_eq!(gpu.numa_node, want.numa_node, "{at}");
        assert_eq!(gpu.mig_enabled, want.mig.as_ref().map(|m| m.enabled), "{at}");

        // MIG tree: every compute instance is one MIG device, with its GI/CI ids and profile name.
        let want_migs: Vec<(u32, u32, &str, &str)> = want
            .mig
            .iter()
            .flat_map(|m| &m.gpu_instances)
            .flat_map(|gi| {
                gi.compute_instances
                    .iter()
                    .map(move |ci| (gi.id, ci.id, ci.profile.as_str(), ci.uuid.as_str()))
            })
            .collect();
        let got_migs: Vec<(u32, u32, String, &str)> = gpu
            .mig_devices
            .iter()
            .map(|m| (m.gpu_instance_id, m.compute_instance_id, m.profile.name(), m.uuid.as_str()))
            .collect();
        assert_eq!(
            got_migs.iter().map(|(g, c, p, u)| (*g, *c, p.as_str(), *u)).collect::<Vec<_>>(),
            want_migs,
            "{at}: MIG devices"
        );

        // NVLink map: per peer, as many active links as the description gives the pair.
        for (j, peer) in node.gpus.iter().enumerate() {
            let want_links: u32 =
                node.nvlinks.iter().filter(|l| l.gpus == [i, j] || l.gpus == [j, i]).map(|l| l.links).sum();
            assert_eq!(
                inv.nvlinks_between(i as u32, j as u32) as u32,
                want_links,
                "{at}: links to GPU {j} ({})",
                peer.uuid
            );
        }
    }

    for a in 0..node.gpus.len() {
        for b in a + 1..node.gpus.len() {
            assert_eq!(
                inv.topology_level(a as u32, b as u32),
                Some(expected_level(&node, a, b)),
                "{name}: topology {a}-{b}"
            );
        }
    }
    inv
}

#[test]
#[ignore = "needs root"]
fn single_reads_back() {
    nvinject_test_support::require_root("mknod for the simulated node");
    assert_eq!(check_preset("single").gpus.len(), 1);
}

#[test]
#[ignore = "needs root"]
fn h100x8_reads_back_with_all_pairs_nvlinked() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let inv = check_preset("h100x8");
    assert!(inv.gpus.iter().all(|g| g.nvlinks.len() == 14), "7 peers x 2 links each");
}

#[test]
#[ignore = "needs root"]
fn islands_reads_back_with_two_islands() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let inv = check_preset("islands");
    assert_eq!(inv.nvlinks_between(0, 3), 4);
    assert_eq!(inv.nvlinks_between(3, 4), 0, "no NVLink across islands");
}

#[test]
#[ignore = "needs root"]
fn a100_mig_reads_back_mig_tree() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let inv = check_preset("a100-mig");
    let names: Vec<String> = inv.gpus[0].mig_devices.iter().map(|m| m.profile.name()).collect();
    assert_eq!(names, ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]);
    assert_eq!(inv.gpus[1].mig_devices.len(), 7);
    assert!(inv.gpus[2].mig_devices.is_empty() && inv.gpus[2].mig_enabled == Some(false));
    // Devices a container can be given: 4 + 7 MIG devices and the two whole GPUs.
    assert_eq!(inv.devices().count(), 13);
}

#[test]
#[ignore = "needs root"]
fn removed_device_node_hides_the_gpu() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let (dir, lib) = build_node("h100x8");
    std::fs::remove_file(dir.path().join("node/host/dev/nvidia3")).unwrap();
    let inv = read(&lib);
    assert_eq!(inv.gpus.len(), 7);
    let node = presets::preset("h100x8").unwrap();
    assert!(inv.gpus.iter().all(|g| g.uuid.as_str() != node.gpus[3].uuid), "GPU 3 must be gone");
    assert_eq!(inv.gpus[3].uuid.as_str(), node.gpus[4].uuid, "indices close up like the real NVML");
}

#[test]
fn missing_library_is_a_load_error_naming_the_path() {
    let err = discover(Some(Path::new("/nonexistent/libnvidia-ml.so.1"))).unwrap_err().to_string();
    assert!(
        err.contains("cannot load NVML from /nonexistent/libnvidia-ml.so.1")
            && err.contains("Is the NVIDIA driver installed"),
        "{err}"
    );
}

#[test]
#[ignore = "needs root"]
fn driver_not_loaded_is_reported_as_such() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let dir = tempfile::tempdir().unwrap();
    let mut node = presets::preset("single").unwrap();
    node.driver.loaded = false;
    let file = dir.path().join("node.json");
    std::fs::write(&file, node.to_json()).unwrap();
    let out = dir.path().join("node");
    let status = Command::new(simnode_bin("nvinject-simnode"))
        .arg("build")
        .arg("--node")
        .arg(&file)
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let err = discover(Some(&out.join("driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"))).unwrap_err();
    assert!(matches!(err, nvinject_gpu::NvmlError::DriverNotLoaded { .. }), "{err}");
}
