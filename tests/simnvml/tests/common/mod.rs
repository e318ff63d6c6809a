//! Shared test fixtures: a node description in a temp dir with a dev root of real device nodes, and
//! child processes that load the simulated library (its NVML state is per process, so every test
//! that calls `nvmlInit` runs in a fresh child and no state leaks between tests).
//!
//! A test function plays both roles: run normally it builds the fixture and re-executes this test
//! binary filtered to itself with [`CHILD_ENV`] set; in the child it loads the library and asserts.

#![allow(dead_code)]

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nvinject_simnode::description::{NODE_ENV, NodeDescription};
use nvinject_simnode::presets;

/// Set in child processes; holds nothing but its presence.
pub const CHILD_ENV: &str = "SIMNVML_TEST_CHILD";
/// The library path, passed from parent to child.
pub const LIB_ENV: &str = "SIMNVML_TEST_LIB";
/// Major number of `/dev/nvidia*`.
pub const NVIDIA_MAJOR: u32 = 195;
/// Major used for `nvidia-caps` nodes in tests: unregistered here, so opening one gives `ENXIO`
/// exactly as an unbacked real capability node does.
pub const CAPS_MAJOR: u32 = 511;

/// True in the child process.
pub fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// The simulated library: built by cargo in the parent, handed down to children.
pub fn lib_path() -> PathBuf {
    match std::env::var_os(LIB_ENV) {
        Some(p) => PathBuf::from(p),
        None => nvinject_simnode::artifacts::sim_nvml_lib(),
    }
}

/// The description the child was started with.
pub fn child_description() -> NodeDescription {
    let path = std::env::var_os(NODE_ENV).expect("child started without NVINJECT_SIM_NODE");
    NodeDescription::load(Path::new(&path)).expect("child description")
}

/// A description written to a temp dir, with its own dev root and XID control file.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub node: NodeDescription,
    pub node_path: PathBuf,
    pub dev_root: PathBuf,
    pub events_file: PathBuf,
}

impl Fixture {
    /// `preset` with a fresh dev root holding a `/dev/nvidia<minor>` node (195:minor) per GPU.
    pub fn preset(name: &str) -> Fixture {
        Self::new(presets::preset(name).unwrap_or_else(|| panic!("no preset {name}")))
    }

    /// `node` with a fresh dev root holding a node per GPU.
    pub fn new(mut node: NodeDescription) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let dev_root = dir.path().join("devroot");
        std::fs::create_dir_all(dev_root.join("dev")).unwrap();
        let events_file = dir.path().join("xid-events");
        node.dev_root = Some(dev_root.clone());
        node.events_file = Some(events_file.clone());
        let node_path = dir.path().join("node.json");
        std::fs::write(&node_path, node.to_json()).unwrap();
        let fixture = Fixture { dir, node, node_path, dev_root, events_file };
        for gpu in &fixture.node.gpus {
            fixture.mknod(&format!("dev/nvidia{}", gpu.minor), NVIDIA_MAJOR, gpu.minor);
        }
        fixture
    }

    /// Makes a character device `<dev root>/<rel>`.
    pub fn mknod(&self, rel: &str, major: u32, minor: u32) {
        let path = self.dev_root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: c_path is a valid NUL-terminated path.
        let rc = unsafe { libc::mknod(c_path.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(major, minor)) };
        assert_eq!(
            rc,
            0,
            "mknod {} {major}:{minor}: {} (these tests make real device nodes and need root)",
            path.display(),
            std::io::Error::last_os_error()
        );
    }

    /// Rewrites the description file (after changing `self.node`).
    pub fn rewrite(&self) {
        std::fs::write(&self.node_path, self.node.to_json()).unwrap();
    }

    /// Runs test `name` of this binary in a child with `NVINJECT_SIM_NODE` pointing here.
    pub fn run_child(&self, name: &str, extra_env: &[(&str, &OsStr)]) -> Output {
        let mut env: Vec<(&str, &OsStr)> = vec![(NODE_ENV, self.node_path.as_os_str())];
        env.extend_from_slice(extra_env);
        run_child(name, &env)
    }
}

/// Re-executes this test binary running only test `name`, with `env`; asserts the child ran that one
/// test and it passed, and returns its output.
pub fn run_child(name: &str, env: &[(&str, &OsStr)]) -> Output {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    // The test is root-only, so marked ignored (CONTRIBUTING.md): the child must include it.
    cmd.args([name, "--exact", "--include-ignored", "--nocapture", "--test-threads=1"]);
    cmd.env_remove(NODE_ENV).env(CHILD_ENV, "1");
    if !env.iter().any(|(k, _)| *k == LIB_ENV) {
        cmd.env(LIB_ENV, lib_path());
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("spawn child test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success()
            && stdout.contains(&format!("test {name} ..."))
            && stdout.contains("test result: ok. 1 passed"),
        "child `{name}` failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    out
}

/// Joins values for an env var list.
pub fn join(items: &[String]) -> OsString {
    OsString::from(items.join(","))
}

/// Splits an env var list set by [`join`].
pub fn env_list(var: &str) -> Vec<String> {
    let v = std::env::var(var).unwrap_or_else(|_| panic!("{var} not set"));
    if v.is_empty() { Vec::new() } else { v.split(',').map(str::to_owned).collect() }
}
