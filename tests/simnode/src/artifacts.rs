//! Finding the workspace's own build outputs from tests and tools.
//!
//! Tests drive real binaries (the simulated NVML, `nvidia-smi` stand-in, shim, hook) as separate
//! processes, so they need those files built and fresh. [`artifact`] asks cargo to build the package
//! (a no-op when up to date; cargo releases its build lock before running tests, so this is safe from
//! inside `cargo test`) and returns the path in the same target directory and profile as the caller. The hook and
//! the shim are the exception: [`static_hook`] and [`static_shim`] build them statically, in their own cargo
//! invocation.
//!
//! # Running the tests against another build
//!
//! A test that passes proves little until it has been seen to fail against the code it guards
//! against. With [`ARTIFACTS_DIR_ENV`] (`NVINJECT_ARTIFACTS_DIR`) set to another build's profile
//! directory (an absolute path such as `/work/old/target/debug`), every function here returns the
//! file of that name from that directory instead, and builds nothing: the tests of this tree then
//! drive that build's installer, shim, hook, `nvinject-cdi` and simulated node. Build that tree
//! first (`cargo build --workspace --all-targets` there). For example:
//!
//! ```text
//! NVINJECT_ARTIFACTS_DIR=/work/old/target/debug \
//!     cargo test -p nvinject-integration --test security_installer
//! ```
//!
//! [`static_hook`] under the override returns `<dir>/nvinject-hook`, which for a build from before
//! the hook was static is the (dynamic) hook that build shipped: exactly what a can-fail run
//! wants, but not a static binary, so tests asserting that it is static fail against it, as they
//! should. For a newer build that file is the dynamic hook that refuses to run; point
//! [`ARTIFACTS_HOOK_ENV`] (`NVINJECT_ARTIFACTS_HOOK`) at its static one
//! (`<target>/<HOOK_TARGET>/<profile>/nvinject-hook`) instead.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, Once};

/// Names another build's profile directory whose binaries every function here returns instead of
/// this build's (see the module documentation). Unset or empty: this build's, built on demand.
pub const ARTIFACTS_DIR_ENV: &str = "NVINJECT_ARTIFACTS_DIR";

/// Under [`ARTIFACTS_DIR_ENV`], the hook binary [`static_hook`] returns instead of
/// `<dir>/nvinject-hook` (a newer build's static hook lives outside its profile directory).
pub const ARTIFACTS_HOOK_ENV: &str = "NVINJECT_ARTIFACTS_HOOK";

/// The override directory, when [`ARTIFACTS_DIR_ENV`] is set (announced once per process, so a
/// test log says which binaries it ran).
fn artifacts_override() -> Option<PathBuf> {
    let dir = override_dir(std::env::var_os(ARTIFACTS_DIR_ENV))?;
    static ANNOUNCE: Once = Once::new();
    ANNOUNCE.call_once(|| {
        eprintln!("nvinject artifacts: using the binaries in {} ({ARTIFACTS_DIR_ENV})", dir.display())
    });
    Some(dir)
}

/// Validates the value of [`ARTIFACTS_DIR_ENV`]: absolute (tests run with the package as cwd, so
/// a relative path would silently mean something else) and an existing directory.
fn override_dir(value: Option<OsString>) -> Option<PathBuf> {
    let dir = PathBuf::from(value.filter(|v| !v.is_empty())?);
    assert!(
        dir.is_absolute(),
        "{ARTIFACTS_DIR_ENV}={} is relative: give the absolute path of the other build's profile directory \
         (e.g. /work/old/target/debug)",
        dir.display()
    );
    assert!(
        dir.is_dir(),
        "{ARTIFACTS_DIR_ENV}={} is not a directory: build that tree (`cargo build --workspace --all-targets`) \
         or unset {ARTIFACTS_DIR_ENV}",
        dir.display()
    );
    Some(dir)
}

/// `<dir>/<file>` under the override; panics with the fix when that build lacks it.
fn override_artifact(dir: &Path, file: &str) -> PathBuf {
    let path = dir.join(file);
    assert!(
        path.is_file(),
        "{} is missing: {ARTIFACTS_DIR_ENV} names a build without it; build it there \
         (`cargo build --workspace --all-targets`) or unset {ARTIFACTS_DIR_ENV}",
        path.display()
    );
    path
}

/// The hook under the override: [`ARTIFACTS_HOOK_ENV`] when set, else `<dir>/nvinject-hook`.
fn override_hook(dir: &Path, hook: Option<OsString>) -> PathBuf {
    match hook.filter(|v| !v.is_empty()) {
        Some(hook) => {
            let hook = PathBuf::from(hook);
            assert!(
                hook.is_absolute() && hook.is_file(),
                "{ARTIFACTS_HOOK_ENV}={} is not an absolute path to a file: name the other build's hook binary",
                hook.display()
            );
            hook
        }
        None => override_artifact(dir, "nvinject-hook"),
    }
}

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
///
/// Under [`ARTIFACTS_DIR_ENV`]: that directory's `file`, nothing built.
pub fn artifact(package: &str, file: &str) -> PathBuf {
    if let Some(dir) = artifacts_override() {
        return override_artifact(&dir, file);
    }
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
    // What cargo sets for the running test (its package's manifest dir, name, version, ...) must not
    // reach this build: a build script that watches one of them (ring's watches CARGO_MANIFEST_DIR
    // and OUT_DIR)
    // would see it change and rebuild, and relink the very test binary running (then gone from
    // under `/proc/self/exe`, which isolated tests re-execute).
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if CARGO_TEST_ENV.contains(&key.as_ref()) || key.starts_with("CARGO_PKG_") {
            cmd.env_remove(key.as_ref());
        }
    }
    let status = cmd.status().unwrap_or_else(|e| panic!("cannot run {}: {e}", cargo.display()));
    assert!(status.success(), "building {package} with cargo failed (see the compiler output above)");
}

/// The variables cargo sets for a test process beside `CARGO_PKG_*` (none is set for a build run
/// from a shell, as `./x` runs it): `OUT_DIR` too, for a package with a build script.
const CARGO_TEST_ENV: &[&str] = &[
    "OUT_DIR",
    "CARGO_MANIFEST_DIR",
    "CARGO_MANIFEST_PATH",
    "CARGO_CRATE_NAME",
    "CARGO_BIN_NAME",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "CARGO_RUSTC_CURRENT_DIR",
];

/// The target triple the static hook is built for: this host's (glibc; only x86_64 and aarch64
/// Linux are expected).
#[cfg(target_arch = "x86_64")]
pub const HOOK_TARGET: &str = "x86_64-unknown-linux-gnu";
/// The target triple the static hook is built for: this host's.
#[cfg(target_arch = "aarch64")]
pub const HOOK_TARGET: &str = "aarch64-unknown-linux-gnu";

/// The binaries built statically, in their own cargo invocation (see [`static_hook`]): the hook
/// (it must have no dynamic loader) and the shim (it starts three times per container: `start`,
/// its proxy and `delete`; without the loader's work each start is cheaper).
pub const STATIC_BINARIES: [(&str, &str); 2] =
    [("nvinject-hook", "nvinject-hook"), ("nvinject-shim", "containerd-shim-nvinject-v2")];

/// `nvinject-hook` built statically (no dynamic loader, see the `nvinject-hook` crate), fresh (once
/// per process), at `<target>/<HOOK_TARGET>/<profile>/nvinject-hook`.
///
/// cargo applies `crt-static` per target, not per binary, so the [`STATIC_BINARIES`] have their own
/// invocation: `--target` keeps host build scripts and proc-macros dynamic and puts its outputs in
/// their own directory, leaving the `<target>/<profile>` fingerprints of every other build
/// untouched. `RUSTFLAGS` is removed for it because it would take precedence over the per-target
/// flags. The `nvinject-hook` in `<target>/<profile>` (from a plain workspace build) refuses to run.
///
/// Under [`ARTIFACTS_DIR_ENV`]: the other build's hook, which need not be static (see the module
/// documentation); nothing built.
pub fn static_hook() -> PathBuf {
    if let Some(dir) = artifacts_override() {
        return override_hook(&dir, std::env::var_os(ARTIFACTS_HOOK_ENV));
    }
    static_build_dir().join("nvinject-hook")
}

/// `containerd-shim-nvinject-v2` built statically beside [`static_hook`]: what the image ships and
/// the tests and benchmarks run. (The dynamic one a workspace build makes in `<target>/<profile>`
/// works the same, only each start pays the dynamic loader.)
///
/// Under [`ARTIFACTS_DIR_ENV`]: that build's `containerd-shim-nvinject-v2`; nothing built.
pub fn static_shim() -> PathBuf {
    if let Some(dir) = artifacts_override() {
        return override_artifact(&dir, "containerd-shim-nvinject-v2");
    }
    static_build_dir().join("containerd-shim-nvinject-v2")
}

/// `<target>/<HOOK_TARGET>/<profile>` with the [`STATIC_BINARIES`] built fresh (once per process).
fn static_build_dir() -> PathBuf {
    static BUILT: Mutex<bool> = Mutex::new(false);
    let dir = profile_dir();
    let release = dir.file_name().is_some_and(|n| n == "release");
    let target_dir = dir.parent().expect("the profile directory has a parent").to_path_buf();
    let profile = if release { "release" } else { "debug" };
    let out = target_dir.join(HOOK_TARGET).join(profile);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !*built {
        if let Some(cargo) = std::env::var_os("CARGO") {
            let mut cmd = static_build_command(Path::new(&cargo), release);
            cmd.env("CARGO_TARGET_DIR", &target_dir);
            let status =
                cmd.status().unwrap_or_else(|e| panic!("cannot run {}: {e}", Path::new(&cargo).display()));
            assert!(
                status.success(),
                "building the static nvinject-hook and shim failed (see the compiler output above)"
            );
        }
        *built = true;
    }
    for (_, file) in STATIC_BINARIES {
        let path = out.join(file);
        assert!(
            path.exists(),
            "{} is missing: run `./x build-hook` (or `{}`)",
            path.display(),
            static_build_shell_command(release)
        );
    }
    out
}

/// The cargo command that builds the [`STATIC_BINARIES`] (what [`static_hook`], [`static_shim`] and `./x` run).
pub fn static_build_command(cargo: &Path, release: bool) -> Command {
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "--locked", "--target", HOOK_TARGET]);
    for (package, bin) in STATIC_BINARIES {
        cmd.args(["-p", package, "--bin", bin]);
    }
    if release {
        cmd.arg("--release");
    }
    cmd.env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env(hook_rustflags_var(), "-C target-feature=+crt-static");
    cmd
}

/// `CARGO_TARGET_<TRIPLE>_RUSTFLAGS` for [`HOOK_TARGET`].
fn hook_rustflags_var() -> String {
    format!("CARGO_TARGET_{}_RUSTFLAGS", HOOK_TARGET.to_uppercase().replace('-', "_"))
}

fn static_build_shell_command(release: bool) -> String {
    let selection: Vec<String> = STATIC_BINARIES.iter().map(|(p, b)| format!("-p {p} --bin {b}")).collect();
    format!(
        "env -u RUSTFLAGS {}=\"-C target-feature=+crt-static\" cargo build {} --target {HOOK_TARGET}{}",
        hook_rustflags_var(),
        selection.join(" "),
        if release { " --release" } else { "" }
    )
}

/// The simulated NVML library as cargo builds it (`libnvidia_ml.so`, SONAME `libnvidia-ml.so.1`).
pub fn sim_nvml_lib() -> PathBuf {
    artifact("nvinject-simnvml", "libnvidia_ml.so")
}

/// A binary of the simulated node package (`nvinject-simnode`, `nvidia-smi`). The simulated NVML
/// is made fresh first: `nvinject-simnode build` copies it from beside itself, and a release build
/// (benchmarks) builds package by package, so nothing else would.
pub fn simnode_bin(name: &str) -> PathBuf {
    sim_nvml_lib();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_unset_or_empty_means_this_build() {
        assert_eq!(override_dir(None), None);
        assert_eq!(override_dir(Some(OsString::new())), None);
    }

    #[test]
    fn override_names_the_other_builds_files() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("nvinject-installer"), b"old").unwrap();
        std::fs::write(t.path().join("nvinject-hook"), b"old hook").unwrap();
        let dir = override_dir(Some(t.path().into())).unwrap();
        assert_eq!(override_artifact(&dir, "nvinject-installer"), t.path().join("nvinject-installer"));
        assert_eq!(override_hook(&dir, None), t.path().join("nvinject-hook"));
        assert_eq!(override_hook(&dir, Some(OsString::new())), t.path().join("nvinject-hook"));
        let other = t.path().join("static-hook");
        std::fs::write(&other, b"static").unwrap();
        assert_eq!(override_hook(&dir, Some(other.clone().into())), other);
    }

    #[test]
    #[should_panic(expected = "is relative")]
    fn override_must_be_absolute() {
        override_dir(Some("target/debug".into()));
    }

    #[test]
    #[should_panic(expected = "is not a directory")]
    fn override_must_exist() {
        let t = tempfile::tempdir().unwrap();
        override_dir(Some(t.path().join("nope").into()));
    }

    #[test]
    #[should_panic(expected = "nvinject-cdi is missing")]
    fn override_without_the_file_names_it() {
        let t = tempfile::tempdir().unwrap();
        override_artifact(t.path(), "nvinject-cdi");
    }

    #[test]
    #[should_panic(expected = "NVINJECT_ARTIFACTS_HOOK")]
    fn override_hook_must_exist() {
        let t = tempfile::tempdir().unwrap();
        override_hook(t.path(), Some(t.path().join("nope").into()));
    }
}
