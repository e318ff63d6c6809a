//! Helpers shared by the integration tests: run the real `nvinject-simnode` binary.

#![allow(dead_code)] // each test crate uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nvinject_simnode::elf::{Machine, shared_object};

/// The `nvinject-simnode` binary, built by cargo if needed.
pub fn simnode() -> PathBuf {
    nvinject_simnode::artifacts::simnode_bin("nvinject-simnode")
}

pub fn host() -> Machine {
    Machine::host().expect("tests run on x86_64 or aarch64")
}

/// A stub standing in for the simulated NVML where a test checks the tree, not NVML's answers:
/// it has the right SONAME, so the builder accepts it.
pub fn stub_nvml(dir: &Path) -> PathBuf {
    let path = dir.join("libnvidia_ml.so");
    std::fs::write(&path, shared_object(host(), "libnvidia-ml.so.1")).unwrap();
    path
}

/// Runs `nvinject-simnode build` with `args` and returns its output.
pub fn run_build(args: &[&str]) -> Output {
    Command::new(simnode()).arg("build").args(args).output().expect("run nvinject-simnode")
}

/// Builds `preset` into `out` with `nvml` as the simulated NVML, and fails the test if that fails.
pub fn build_preset(preset: &str, out: &Path, nvml: &Path) {
    let out_arg = out.to_str().unwrap();
    let output = run_build(&["--preset", preset, "--out", out_arg, "--nvml-lib", nvml.to_str().unwrap()]);
    assert!(
        output.status.success(),
        "build of {preset} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

pub fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
