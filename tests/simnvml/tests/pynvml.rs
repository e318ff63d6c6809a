//! NVIDIA's own NVML bindings for Python (`nvidia-ml-py`, from the tools virtualenv that `./x setup`
//! makes) read every preset through the simulated library, found by its SONAME the way pynvml finds
//! the real one. Needs root (device nodes).

mod common;

use std::path::Path;
use std::process::Command;

use common::{Fixture, lib_path};

#[test]
#[ignore = "needs root"]
fn nvidia_ml_py_reads_every_preset() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let python = nvinject_simnode::artifacts::tools_python();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pynvml_check.py");
    // A library directory holding only libnvidia-ml.so.1, as a driver install has it.
    let libdir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(lib_path(), libdir.path().join("libnvidia-ml.so.1")).unwrap();
    for name in nvinject_simnode::presets::NAMES {
        let fx = Fixture::preset(name);
        let out = Command::new(&python)
            .arg(&script)
            .arg(&fx.node_path)
            .env(nvinject_simnode::description::NODE_ENV, &fx.node_path)
            .env("LD_LIBRARY_PATH", libdir.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: pynvml_check failed:\n{stdout}\n{stderr}");
        assert!(stdout.starts_with(&format!("ok {name}: {} GPUs", fx.node.gpus.len())), "{name}: {stdout}");
    }
}
