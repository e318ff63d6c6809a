//! What both benches do before measuring: build a simulated node and point `nvinject-cdi generate`
//! at it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nvinject_simnode::artifacts::{artifact, sim_nvml_lib, simnode_bin};

/// Builds `preset` at `out` with `nvinject-simnode build` (needs root), after making sure the
/// simulated NVML is built.
pub fn build_node(preset: &str, out: &Path) {
    sim_nvml_lib();
    let built = Command::new(simnode_bin("nvinject-simnode"))
        .args(["build", "--preset", preset, "--out"])
        .arg(out)
        .stdout(Stdio::null())
        .status()
        .expect("run nvinject-simnode");
    assert!(built.success(), "nvinject-simnode build --preset {preset} failed (needs root)");
}

/// The `nvinject-cdi` binary.
pub fn cdi_bin() -> PathBuf {
    artifact("nvinject-cdi-gen", "nvinject-cdi")
}

/// `nvinject-cdi generate` on the node built at `node`, writing `output`, quiet.
pub fn generate_command(cdi: &Path, node: &Path, output: &Path) -> Command {
    let mut cmd = Command::new(cdi);
    cmd.arg("generate")
        .arg("--driver-root")
        .arg(node.join("driver"))
        .arg("--dev-root")
        .arg(node.join("host"))
        .arg("--proc-root")
        .arg(node.join("host/proc"))
        .arg("--sys-root")
        .arg(node.join("host/sys"))
        .arg("--output")
        .arg(output)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

/// The value at fraction `p` (0.5 for the median) of sorted durations.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}
