//! Test harness: a simulated node, the kubelet simulator and the plugin, each a real process.
//!
//! Every process is started by the harness and stopped by PID on drop; sockets and node trees
//! live in a temporary directory. Needs root (the node builder makes device nodes with mknod).

#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// How long a test waits for something that normally takes milliseconds before failing.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Environment variables the plugin reads; cleared so the test runner's environment cannot leak in.
const PLUGIN_ENV: &[&str] = &[
    "CONFIG_FILE",
    "MIG_STRATEGY",
    "FAIL_ON_INIT_ERROR",
    "NVIDIA_DRIVER_ROOT",
    "CONTAINER_DRIVER_ROOT",
    "NVIDIA_DEV_ROOT",
    "PASS_DEVICE_SPECS",
    "DEVICE_LIST_STRATEGY",
    "DEVICE_ID_STRATEGY",
    "CDI_ANNOTATION_PREFIX",
    "KUBELET_SOCKET",
    "DP_DISABLE_HEALTHCHECKS",
    "NVINJECT_PROC_ROOT",
    "NVINJECT_CDI_KIND",
    "NVINJECT_NVML_LIB",
    "NVINJECT_FEATURES_FILE",
    "NVINJECT_METRICS_ADDRESS",
    "NVINJECT_HEALTH_RECOVERY_PERIOD",
    "NVINJECT_SOCKET_POLL",
    "NVINJECT_SIM_NODE",
    "NVINJECT_CDI_SPEC",
    "NVINJECT_CDI_GENERATOR",
    "NVINJECT_CDI_HOOK_PATH",
    "NVINJECT_SYS_ROOT",
    "NVINJECT_DRIVER_WATCH_INTERVAL",
    "NVINJECT_INSTALLER_READY_FILE",
    "NVINJECT_LOG",
    "RUST_LOG",
];

/// A simulated node built from a preset (or a description file) in a temporary directory.
pub struct Node {
    pub tmp: tempfile::TempDir,
    pub out: PathBuf,
    pub description: Value,
}

impl Node {
    /// `nvinject-simnode build --preset <preset>`.
    pub fn preset(preset: &str) -> Node {
        Self::build(&["--preset", preset])
    }

    /// `nvinject-simnode build --node <file>` for a description given as JSON.
    pub fn from_description(desc: &Value) -> Node {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("desc.json");
        std::fs::write(&file, serde_json::to_vec_pretty(desc).unwrap()).unwrap();
        Self::build_in(tmp, &["--node", file.to_str().unwrap()])
    }

    fn build(args: &[&str]) -> Node {
        Self::build_in(tempfile::tempdir().unwrap(), args)
    }

    fn build_in(tmp: tempfile::TempDir, args: &[&str]) -> Node {
        let out = tmp.path().join("node");
        let status = Command::new(simnode())
            .arg("build")
            .args(args)
            .arg("--out")
            .arg(&out)
            .arg("--nvml-lib")
            .arg(nvinject_simnode::artifacts::sim_nvml_lib())
            .status()
            .expect("run nvinject-simnode");
        assert!(status.success(), "nvinject-simnode build {args:?} failed (needs root)");
        let description = serde_json::from_slice(&std::fs::read(out.join("node.json")).unwrap()).unwrap();
        Node { tmp, out, description }
    }

    /// A preset's description, to edit and build with [`Node::from_description`].
    pub fn describe(preset: &str) -> Value {
        let out = Command::new(simnode()).args(["describe", "--preset", preset]).output().unwrap();
        assert!(out.status.success());
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub fn node_json(&self) -> PathBuf {
        self.out.join("node.json")
    }
    pub fn driver_root(&self) -> PathBuf {
        self.out.join("driver")
    }
    pub fn dev_root(&self) -> PathBuf {
        self.out.join("host")
    }
    pub fn proc_root(&self) -> PathBuf {
        self.out.join("host/proc")
    }

    /// Writes this node's CDI spec to `out` with the real `nvinject-cdi generate` (the format
    /// from the extension, the default hook path), as the installer does.
    #[allow(dead_code)] // not every test binary generates a spec
    pub fn generate_spec(&self, out: &Path) {
        let cdi = nvinject_simnode::artifacts::artifact("nvinject-cdi-gen", "nvinject-cdi");
        let result = Command::new(cdi)
            .arg("generate")
            .arg("--output")
            .arg(out)
            .arg("--driver-root")
            .arg(self.driver_root())
            .arg("--dev-root")
            .arg(self.dev_root())
            .arg("--proc-root")
            .arg(self.proc_root())
            .arg("--sys-root")
            .arg(self.out.join("host/sys"))
            .env("NVINJECT_SIM_NODE", self.node_json())
            .output()
            .unwrap();
        assert!(
            result.status.success(),
            "nvinject-cdi generate failed: {}",
            String::from_utf8_lossy(&result.stderr)
        );
    }

    /// UUID of GPU `i` (position in the description).
    pub fn uuid(&self, i: usize) -> String {
        self.description["gpus"][i]["uuid"].as_str().unwrap().to_owned()
    }

    /// MIG UUIDs of GPU `i`, in description order: `(gpu instance id, compute instance id, profile, uuid)`.
    pub fn mig_devices(&self, i: usize) -> Vec<(u64, u64, String, String)> {
        let mut out = Vec::new();
        for gi in self.description["gpus"][i]["mig"]["gpu_instances"].as_array().into_iter().flatten() {
            for ci in gi["compute_instances"].as_array().unwrap() {
                out.push((
                    gi["id"].as_u64().unwrap(),
                    ci["id"].as_u64().unwrap(),
                    ci["profile"].as_str().unwrap().to_owned(),
                    ci["uuid"].as_str().unwrap().to_owned(),
                ));
            }
        }
        out
    }

    /// `nvinject-simnode xid --node ... --gpu <gpu> --xid <xid> [--gi --ci]`.
    pub fn xid(&self, gpu: usize, xid: u64, instance: Option<(u64, u64)>) {
        let mut cmd = Command::new(simnode());
        cmd.args(["xid", "--node"]).arg(self.node_json()).args([
            "--gpu",
            &gpu.to_string(),
            "--xid",
            &xid.to_string(),
        ]);
        if let Some((gi, ci)) = instance {
            cmd.args(["--gi", &gi.to_string(), "--ci", &ci.to_string()]);
        }
        assert!(cmd.status().unwrap().success(), "xid injection failed");
    }
}

pub fn simnode() -> PathBuf {
    nvinject_simnode::artifacts::simnode_bin("nvinject-simnode")
}

/// Lines read from a child's stdout on a thread.
fn line_reader(out: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Collects a child's stderr into a string (and echoes it for failing tests).
fn collect(out: impl Read + Send + 'static, tag: &'static str) -> Arc<Mutex<String>> {
    let buf = Arc::new(Mutex::new(String::new()));
    let b = buf.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            eprintln!("[{tag}] {line}");
            let mut g = b.lock().unwrap();
            g.push_str(&line);
            g.push('\n');
        }
    });
    buf
}

/// The kubelet simulator process.
pub struct Kubelet {
    pub dir: PathBuf,
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    events: VecDeque<Value>,
    next_id: u64,
}

impl Kubelet {
    /// Starts `kubelet-sim --dir <dir>` and waits until it serves kubelet.sock.
    pub fn start(dir: &Path) -> Kubelet {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kubelet-sim"))
            .arg("--dir")
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start kubelet-sim");
        let stdin = child.stdin.take().unwrap();
        let lines = line_reader(child.stdout.take().unwrap());
        let mut k =
            Kubelet { dir: dir.to_path_buf(), child, stdin, lines, events: VecDeque::new(), next_id: 1 };
        k.wait_event("ready", |_| true);
        k
    }

    fn next_line(&mut self, deadline: Instant) -> Option<Value> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(line) => {
                Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("kubelet-sim said `{line}`: {e}")))
            }
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => panic!("kubelet-sim exited"),
        }
    }

    /// Sends a command and waits for its reply: `Ok(value)` or `Err({code, message})`.
    pub fn call(&mut self, mut cmd: Value) -> Result<Value, Value> {
        let id = self.next_id;
        self.next_id += 1;
        cmd["id"] = json!(id);
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        let deadline = Instant::now() + PATIENCE;
        loop {
            let v = self.next_line(deadline).unwrap_or_else(|| panic!("no reply to {cmd}"));
            if v.get("reply").and_then(Value::as_u64) == Some(id) {
                return match v.get("ok") {
                    Some(ok) => Ok(ok.clone()),
                    None => Err(v["error"].clone()),
                };
            }
            if v.get("event").is_some() {
                self.events.push_back(v);
            }
        }
    }

    /// Waits for (and consumes) the first event named `name` that satisfies `pred`; earlier
    /// events that do not match are kept for later waits.
    pub fn wait_event(&mut self, name: &str, pred: impl Fn(&Value) -> bool) -> Value {
        self.try_wait_event(name, PATIENCE, pred).unwrap_or_else(|| panic!("no `{name}` event"))
    }

    /// Like [`Kubelet::wait_event`], `None` after `timeout`.
    pub fn try_wait_event(
        &mut self,
        name: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        let matches = |v: &Value| v["event"] == name && pred(v);
        if let Some(pos) = self.events.iter().position(matches) {
            return self.events.remove(pos);
        }
        let deadline = Instant::now() + timeout;
        while let Some(v) = self.next_line(deadline) {
            if matches(&v) {
                return Some(v);
            }
            if v.get("event").is_some() {
                self.events.push_back(v);
            }
        }
        None
    }

    /// Waits for the registration of `resource`.
    pub fn registered(&mut self, resource: &str) -> Value {
        self.wait_event("registered", |v| v["resource"] == resource)
    }

    /// Waits for a device list of `resource` satisfying `pred`.
    pub fn devices(&mut self, resource: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let v = self.wait_event("devices", |v| {
            v["resource"] == resource && pred(v["devices"].as_array().map(Vec::as_slice).unwrap_or(&[]))
        });
        v["devices"].as_array().unwrap().clone()
    }

    pub fn allocate(&mut self, resource: &str, containers: Value) -> Result<Value, Value> {
        self.call(json!({"op": "allocate", "resource": resource, "containers": containers}))
    }

    pub fn preferred(
        &mut self,
        resource: &str,
        available: &[String],
        must: &[String],
        size: i32,
    ) -> Result<Vec<String>, Value> {
        let r = self.call(json!({"op": "preferred", "resource": resource,
            "containers": [{"available": available, "must_include": must, "size": size}]}))?;
        Ok(serde_json::from_value(r["containers"][0].clone()).unwrap())
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The plugin process.
pub struct Plugin {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

/// Arguments that point the plugin at a node and a kubelet directory, with short timings.
pub fn plugin_args(node: &Node, kubelet_dir: &Path) -> Vec<String> {
    vec![
        "--kubelet-socket".into(),
        kubelet_dir.join("kubelet.sock").display().to_string(),
        "--nvidia-driver-root".into(),
        node.driver_root().display().to_string(),
        "--nvidia-dev-root".into(),
        node.dev_root().display().to_string(),
        "--proc-root".into(),
        node.proc_root().display().to_string(),
        "--features-file".into(),
        node.tmp.path().join("features.d/nvinject").display().to_string(),
        "--socket-poll".into(),
        "100ms".into(),
        "--health-recovery-period".into(),
        "1s".into(),
    ]
}

impl Plugin {
    /// Starts the plugin with `args` and `env` (and nothing inherited that it reads).
    pub fn start(node: Option<&Node>, args: &[String], env: &[(&str, &str)]) -> Plugin {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_nvinject-device-plugin"));
        for k in PLUGIN_ENV {
            cmd.env_remove(k);
        }
        if let Some(n) = node {
            cmd.env("NVINJECT_SIM_NODE", n.node_json());
        }
        cmd.env("RUST_LOG", "info");
        cmd.args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start nvinject-device-plugin");
        let stderr = collect(child.stderr.take().unwrap(), "plugin");
        Plugin { child, stderr }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Still running?
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits for the process to exit (bounded), then lets the stderr reader finish.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(50));
                return s;
            }
            assert!(Instant::now() < deadline, "plugin did not exit; stderr:\n{}", self.stderr());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGTERM and waits for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        // SAFETY: kill(2) on the PID of a child we started and have not reaped.
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        self.wait_exit()
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        if self.running() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The kubelet's device plugin directory for a test (and the NFD directory next to it).
pub fn kubelet_dir(node: &Node) -> PathBuf {
    let dir = node.tmp.path().join("device-plugins");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(node.tmp.path().join("features.d")).unwrap();
    dir
}

/// Ids of a device list.
pub fn ids(devices: &[Value]) -> Vec<String> {
    devices.iter().map(|d| d["id"].as_str().unwrap().to_owned()).collect()
}

/// Health of the device `id` in a device list.
pub fn health_of(devices: &[Value], id: &str) -> String {
    devices
        .iter()
        .find(|d| d["id"] == id)
        .map(|d| d["health"].as_str().unwrap().to_owned())
        .unwrap_or_default()
}
