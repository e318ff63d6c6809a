//! A non-Rust caller: python3 ctypes (`tests/ctypes_check.py`) reads every preset through the library
//! with struct layouts declared on the python side. Needs `python3` and root (device nodes).

mod common;

use std::path::Path;
use std::process::Command;

use common::{Fixture, lib_path};

#[test]
#[ignore = "needs root"]
fn python_ctypes_reads_every_preset() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ctypes_check.py");
    let lib = lib_path();
    for name in nvinject_simnode::presets::NAMES {
        let fx = Fixture::preset(name);
        let out = Command::new("python3")
            .arg(&script)
            .arg(&lib)
            .arg(&fx.node_path)
            .env(nvinject_simnode::description::NODE_ENV, &fx.node_path)
            .output()
            .expect("run python3 (install it: apt-get install python3)");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: ctypes_check failed:\n{stdout}\n{stderr}");
        let gpus = fx.node.gpus.len();
        let migs: usize = fx
            .node
            .gpus
            .iter()
            .filter_map(|g| g.mig.as_ref().filter(|m| m.enabled))
            .map(|m| m.gpu_instances.iter().map(|gi| gi.compute_instances.len()).sum::<usize>())
            .sum();
        let expected = format!("ok {name}: {gpus} GPUs, {migs} MIG devices");
        assert!(stdout.contains(&expected), "{name}: want `{expected}`, got:\n{stdout}");
    }
}
