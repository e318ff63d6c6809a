//! `nvinject-installer run`, the DaemonSet mode, as a real process: it retries a failing install
//! until it succeeds, reports readiness (the `probe` subcommand), and uninstalls on SIGTERM,
//! leaving the host as it found it.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_nvinject-installer");
const CONFIG: &str = "version = 2\n# the operator's comment\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"overlayfs\"\n";

fn tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if rel == "run/nvinject-installer.lock" {
                continue;
            }
            let meta = fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
                out.insert(rel, b"dir".to_vec());
            } else if meta.file_type().is_symlink() {
                out.insert(rel, fs::read_link(&path).unwrap().to_string_lossy().as_bytes().to_vec());
            } else {
                out.insert(rel, fs::read(&path).unwrap());
            }
        }
    }
    out
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `run` process; killed by PID if the test fails before it exits, so a failed assertion does
/// not leave an installer waiting for SIGTERM forever.
struct RunProcess(Option<Child>);

impl Drop for RunProcess {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut()
            && child.try_wait().ok().flatten().is_none()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn probe(ready: &Path) -> bool {
    Command::new(BIN).arg("probe").arg("--ready-file").arg(ready).status().unwrap().success()
}

#[test]
fn run_retries_until_installed_reports_ready_and_uninstalls_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host");
    for d in ["etc/containerd", "run", "usr/local/bin", "var/lib"] {
        fs::create_dir_all(host.join(d)).unwrap();
    }
    fs::write(host.join("etc/containerd/config.toml"), CONFIG).unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    // The hook is missing at first: the install fails and `run` retries.
    fs::write(src.join("containerd-shim-nvinject-v2"), "#!/bin/sh\n").unwrap();
    fs::write(src.join("nvinject-cdi"), "#!/bin/sh\n").unwrap();
    let original = tree(&host);
    let ready = dir.path().join("ready");

    let mut run = RunProcess(Some(
        Command::new(BIN)
            .args([
                "--log-level=info",
                "run",
                "--containerd-version=1.7.20",
                "--restart-mode=none",
                "--skip-cdi-spec",
            ])
            .arg(format!("--host-root={}", host.display()))
            .arg(format!("--source-dir={}", src.display()))
            .arg(format!("--ready-file={}", ready.display()))
            .arg("--retry-interval=1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let child = run.0.as_mut().unwrap();

    std::thread::sleep(Duration::from_millis(1500));
    assert!(child.try_wait().unwrap().is_none(), "run exited instead of retrying");
    assert!(!probe(&ready), "ready before the install succeeded");
    assert_eq!(tree(&host), original, "a failed install attempt changed the host");

    fs::write(src.join("nvinject-hook"), "#!/bin/sh\n").unwrap();
    wait_until("the retried install to succeed", Duration::from_secs(30), || probe(&ready));
    let drop_in = host.join("etc/containerd/conf.d/99-nvinject.toml");
    assert!(drop_in.exists());
    assert!(
        fs::read_to_string(host.join("etc/containerd/config.toml")).unwrap().contains("99-nvinject.toml")
    );

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let out = run.0.take().unwrap().wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "run exited with {}: {stderr}", out.status);
    assert!(stderr.contains("install failed"), "the failed attempt was not logged: {stderr}");
    assert!(!ready.exists(), "the ready file outlived the pod");
    assert_eq!(tree(&host), original, "SIGTERM did not uninstall back to the original host");
}
