//! Finding the workspace's own build outputs from tests and tools.
//!
//! Tests drive real binaries (the simulated NVML, `nvidia-smi` stand-in, shim, hook) as separate
//! processes, so they need those files built and fresh. [`artifact`] asks cargo to build the package
//! (a no-op when up to date; cargo releases its build lock before running tests, so this is safe from
//! inside `cargo test`) and returns the path in the same target directory and profile as the caller.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The profile directory (`<target>/debug` or `<target>/release`) the running executable belongs to.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("executable has a parent").to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps" || n == "examples") {
        dir.pop();
    }
    dir
}

/// Makes sure `package`'s outputs are built and fresh (once per process) and returns
/// `<profile dir>/<file>`.
///
/// In a debug build this runs `cargo build --workspace --all-targets`, exactly what `./x test` runs
/// before the tests, so under `./x test` it is a no-op. Building one package with `-p` would unify
/// dependency features differently and recompile half the dependency tree in every test binary that
/// asks. Release builds (benchmarks) build just the package.
///
/// Panics with the command to run when the file cannot be produced: in a test, that is the message
/// a developer needs.
pub fn artifact(package: &str, file: &str) -> PathBuf {
    static BUILT: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let dir = profile_dir();
    let path = dir.join(file);
    let release = dir.file_name().is_some_and(|n| n == "release");
    // One workspace build covers every package; release builds go package by package.
    let key = if release { package } else { "--workspace" };
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !built.contains(key) {
        if let Some(cargo) = std::env::var_os("CARGO") {
            build(Path::new(&cargo), package, &dir, release);
        }
        built.insert(key.to_owned());
    }
    assert!(path.exists(), "{} is missing: run `cargo build -p {package}`", path.display());
    path
}

fn build(cargo: &Path, package: &str, profile_dir: &Path, release: bool) {
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet"]);
    if release {
        cmd.args(["--release", "-p", package]);
    } else {
        cmd.args(["--workspace", "--all-targets"]);
    }
    if let Some(target) = profile_dir.parent() {
        cmd.env("CARGO_TARGET_DIR", target);
    }
    let status = cmd.status().unwrap_or_else(|e| panic!("cannot run {}: {e}", cargo.display()));
    assert!(status.success(), "building {package} with cargo failed (see the compiler output above)");
}

/// The simulated NVML library as cargo builds it (`libnvidia_ml.so`, SONAME `libnvidia-ml.so.1`).
pub fn sim_nvml_lib() -> PathBuf {
    artifact("nvinject-simnvml", "libnvidia_ml.so")
}

/// A binary of the simulated node package (`nvinject-simnode`, `nvidia-smi`).
pub fn simnode_bin(name: &str) -> PathBuf {
    artifact("nvinject-simnode", name)
}

/// The project's tools virtualenv (`./x setup` makes it): `$NVINJECT_CACHE/venv`, where
/// `NVINJECT_CACHE` defaults to `~/.cache/nvinject`. It holds the PyPI packages tests use, such as
/// NVIDIA's own NVML bindings (`nvidia-ml-py`).
pub fn tools_venv() -> PathBuf {
    let cache = std::env::var_os("NVINJECT_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
        home.join(".cache/nvinject")
    });
    cache.join("venv")
}

/// The tools virtualenv's python; panics with the fix when `./x setup` has not made it.
pub fn tools_python() -> PathBuf {
    let python = tools_venv().join("bin/python3");
    assert!(
        python.exists(),
        "{} is missing: run `./x setup` (it creates the tools virtualenv)",
        python.display()
    );
    python
}
