//! Kill -9 at every point of install and uninstall, through the real binary on a simulated GPU
//! node (the CDI spec comes from the simulated NVML through the cdi-gen library).
//!
//! The test hook `NVINJECT_INSTALLER_FAULT_AFTER=N` makes the installer SIGKILL itself at its N-th
//! fault point (every atomic write has two: temp file written, renamed into place; every removal
//! one). For each N, on a fresh host root:
//! - after the kill, containerd's configuration parses (checked with the real `containerd config
//!   dump`, which also fails on an import of a missing file), and every file we own parses;
//! - a second, uninterrupted run converges to exactly the tree a clean install produces;
//! - uninstall then restores the original tree byte for byte.
//!
//! Needs root (the simulated node's device nodes are made with mknod) and Debian's containerd.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use nvinject_simnode::artifacts::simnode_bin;

const BIN: &str = env!("CARGO_BIN_EXE_nvinject-installer");
const DROP_IN: &str = "/etc/containerd/conf.d/99-nvinject.toml";
const DEBIAN_CONFIG: &str = "version = 2\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    \
                             [plugins.\"io.containerd.grpc.v1.cri\".cni]\n      bin_dir = \"/usr/lib/cni\"\n      \
                             conf_dir = \"/etc/cni/net.d\"\n";

/// A fresh host root with a simulated node under `/sim` and no `conf.d` yet.
fn host(src: &Path) -> (tempfile::TempDir, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::create_dir_all(root.join("etc/containerd")).unwrap();
    fs::create_dir_all(root.join("run")).unwrap();
    fs::create_dir_all(root.join("usr/local/bin")).unwrap();
    // No /var/lib: the state directory's parents are made by the install and must go with it.
    fs::create_dir_all(root.join("var")).unwrap();
    // As on Debian: an absolute link, which the installer must resolve inside the host root.
    std::os::unix::fs::symlink("/run", root.join("var/run")).unwrap();
    fs::write(root.join("etc/containerd/config.toml"), DEBIAN_CONFIG).unwrap();
    let out = Command::new(simnode_bin("nvinject-simnode"))
        .args(["build", "--preset", "single", "--out"])
        .arg(root.join("sim"))
        .output()
        .unwrap();
    assert!(out.status.success(), "simnode build: {}", String::from_utf8_lossy(&out.stderr));
    let args = vec![
        format!("--host-root={}", root.display()),
        format!("--source-dir={}", src.display()),
        "--containerd-version=1.6.20".into(),
        "--restart-mode=none".into(),
        "--driver-root=/sim/driver".into(),
        "--dev-root=/sim/host".into(),
        "--proc-root=/sim/host/proc".into(),
        "--sys-root=/sim/host/sys".into(),
        "--lock-timeout=5".into(),
    ];
    (dir, args)
}

fn installer(command: &str, args: &[String], fault: Option<u64>) -> std::process::ExitStatus {
    let mut cmd = Command::new(BIN);
    cmd.arg("--log-level=error").arg(command).args(args);
    match fault {
        Some(n) => cmd.env("NVINJECT_INSTALLER_FAULT_AFTER", n.to_string()),
        None => cmd.env_remove("NVINJECT_INSTALLER_FAULT_AFTER"),
    };
    let out = cmd.output().unwrap();
    if fault.is_none() {
        assert!(out.status.success(), "{command}: {}", String::from_utf8_lossy(&out.stderr));
    }
    out.status
}

/// The host tree outside the simulated node (whose build output names the temp dir), plus the
/// `/dev/char` links we make inside it. The lock file stays by design.
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if rel == "run/nvinject-installer.lock"
                || (rel.starts_with("sim") && !rel.starts_with("sim/host/dev"))
            {
                if rel == "sim" || rel == "sim/host" {
                    walk(root, &path, out);
                }
                continue;
            }
            let meta = fs::symlink_metadata(&path).unwrap();
            if meta.file_type().is_symlink() {
                out.insert(rel, format!("-> {}", fs::read_link(&path).unwrap().display()));
            } else if meta.is_dir() {
                out.insert(rel.clone(), "dir".into());
                walk(root, &path, out);
            } else if meta.is_file() {
                out.insert(rel, String::from_utf8_lossy(&fs::read(&path).unwrap()).into_owned());
            } else {
                out.insert(rel, "device".into());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The paths whose content differs between two snapshots, with both sides (shortened).
fn diff(actual: &BTreeMap<String, String>, expected: &BTreeMap<String, String>) -> String {
    let short = |v: Option<&String>| v.map_or("<absent>".to_owned(), |v| v.chars().take(300).collect());
    let keys: std::collections::BTreeSet<&String> = actual.keys().chain(expected.keys()).collect();
    keys.into_iter()
        .filter(|k| actual.get(*k) != expected.get(*k))
        .map(|k| {
            format!("{k}:\n  now:      {}\n  expected: {}", short(actual.get(k)), short(expected.get(k)))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// containerd 1.6 loads the main file and whatever it imports (relocated under `root`).
fn containerd_parses(root: &Path) -> Result<(), String> {
    let main = fs::read_to_string(root.join("etc/containerd/config.toml")).map_err(|e| e.to_string())?;
    let relocated = main.replace(DROP_IN, &root.join(DROP_IN.trim_start_matches('/')).to_string_lossy());
    let scratch = root.join("containerd-check.toml");
    fs::write(&scratch, relocated).unwrap();
    let out = Command::new("containerd")
        .arg("--config")
        .arg(&scratch)
        .args(["config", "dump"])
        .output()
        .expect("containerd is not installed: apt-get install containerd");
    fs::remove_file(&scratch).unwrap();
    if out.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&out.stderr).into_owned()) }
}

/// Every file the installer owns that exists parses as what it is.
fn own_files_parse(root: &Path) -> Result<(), String> {
    let check = |rel: &str, parse: &dyn Fn(&str) -> Result<(), String>| -> Result<(), String> {
        match fs::read_to_string(root.join(rel)) {
            Ok(text) => parse(&text).map_err(|e| format!("{rel}: {e}")),
            Err(_) => Ok(()),
        }
    };
    let toml = |t: &str| toml::from_str::<toml::Table>(t).map(|_| ()).map_err(|e| e.to_string());
    let json = |t: &str| serde_json::from_str::<serde_json::Value>(t).map(|_| ()).map_err(|e| e.to_string());
    check(DROP_IN.trim_start_matches('/'), &toml)?;
    check("etc/nvinject/config.toml", &toml)?;
    check("run/cdi/nvidia.com-gpu.json", &json)?;
    check("var/lib/nvinject/installer/state.json", &json)
}

fn fake_binaries() -> tempfile::TempDir {
    let src = tempfile::tempdir().unwrap();
    common::write_binaries(src.path(), |name| format!("#!/bin/sh\necho {name}\n").into_bytes());
    src
}

/// Fails with the differences when `root`'s tree is not `expected`.
fn assert_tree(root: &Path, expected: &BTreeMap<String, String>, what: &str) {
    let now = snapshot(root);
    assert!(now == *expected, "{what}:\n{}", diff(&now, expected));
}

/// After a kill at fault point `n`: containerd still loads its config and our files parse.
fn configs_parse_after_kill(root: &Path, n: u64) {
    containerd_parses(root)
        .unwrap_or_else(|e| panic!("killed at point {n}: containerd cannot load its config: {e}"));
    own_files_parse(root).unwrap_or_else(|e| panic!("killed at point {n}: {e}"));
}

fn reference(src: &Path) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let (dir, args) = host(src);
    let original = snapshot(dir.path());
    installer("install", &args, None);
    let installed = snapshot(dir.path());
    assert!(
        installed.contains_key("run/cdi/nvidia.com-gpu.json"),
        "no CDI spec written under the host's /run"
    );
    assert!(installed.contains_key("sim/host/dev/char/195:0"), "no /dev/char link written");
    installer("uninstall", &args, None);
    assert_tree(dir.path(), &original, "a clean install + uninstall does not restore the host");
    (original, installed)
}

fn killed(status: std::process::ExitStatus) -> bool {
    status.signal() == Some(libc::SIGKILL)
}

#[test]
#[ignore = "needs root"]
fn a_kill_at_any_point_of_install_leaves_parseable_configs_and_a_rerun_converges() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let src = fake_binaries();
    let (original, installed) = reference(src.path());
    let mut points = 0;
    for n in 1..=500 {
        let (dir, args) = host(src.path());
        let root = dir.path();
        let status = installer("install", &args, Some(n));
        if !killed(status) {
            assert!(status.success(), "install with fault point {n} failed: {status}");
            break;
        }
        points = n;
        configs_parse_after_kill(root, n);
        installer("install", &args, None);
        assert_tree(root, &installed, &format!("killed at point {n}: the rerun did not converge"));
        installer("uninstall", &args, None);
        assert_tree(root, &original, &format!("killed at point {n}: uninstall did not restore the host"));
    }
    assert!(points >= 20, "only {points} fault points in an install: is the hook wired?");
    println!("install: killed at each of {points} fault points");
}

#[test]
#[ignore = "needs root"]
fn a_kill_at_any_point_of_uninstall_leaves_parseable_configs_and_a_rerun_finishes() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let src = fake_binaries();
    let (original, _) = reference(src.path());
    let mut points = 0;
    for n in 1..=500 {
        let (dir, args) = host(src.path());
        let root = dir.path();
        installer("install", &args, None);
        let status = installer("uninstall", &args, Some(n));
        if !killed(status) {
            assert!(status.success(), "uninstall with fault point {n} failed: {status}");
            break;
        }
        points = n;
        configs_parse_after_kill(root, n);
        installer("uninstall", &args, None);
        assert_tree(
            root,
            &original,
            &format!("killed at point {n}: the second uninstall did not restore the host"),
        );
    }
    assert!(points >= 10, "only {points} fault points in an uninstall: is the hook wired?");
    println!("uninstall: killed at each of {points} fault points");
}
