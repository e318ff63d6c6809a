//! A private containerd for one test: its own root, state, socket, config and log, started by PID
//! and stopped by PID, with every shim it started found and stopped, and every mount it made
//! removed.
//!
//! It never reads or writes the host's `/etc/containerd`. Shared host paths containerd and runc
//! insist on (`/run/containerd/s/<hash>` shim sockets, `/run/containerd/runc/<namespace>`) are
//! keyed by this instance's socket path or namespace, so they never collide with anyone else's.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::error::{HarnessError, Result, io};
use crate::image::BuiltImage;
use crate::process::{self, ProcessInfo};
use crate::{mounts, namespace};

/// How to start containerd.
#[derive(Debug, Clone, Default)]
pub struct ContainerdOptions {
    /// Directories put first in containerd's `PATH` (where it finds shim binaries such as
    /// `containerd-shim-nvinject-v2`; containerd 1.6 looks shims up in `PATH`).
    pub path_prepend: Vec<PathBuf>,
    /// Extra environment for containerd (and so for every shim it starts).
    pub env: Vec<(String, String)>,
    /// Enable the CRI plugin (off: faster start for `ctr`-only tests).
    pub cri: bool,
    /// CRI sandbox (pause) image reference, when `cri`.
    pub sandbox_image: String,
    /// Extra CRI runtimes: `(handler name, TOML body of its table)`.
    pub cri_runtimes: Vec<(String, String)>,
}

/// A running private containerd.
#[derive(Debug)]
pub struct Containerd {
    base: PathBuf,
    /// The gRPC socket.
    pub socket: PathBuf,
    /// containerd's root directory.
    pub root: PathBuf,
    /// containerd's state directory (bundles live here).
    pub state: PathBuf,
    /// The config file it was started with.
    pub config: PathBuf,
    /// Its stdout/stderr log.
    pub log: PathBuf,
    /// The namespace `ctr` commands use.
    pub namespace: String,
    pid: u32,
    cri: bool,
    child: Option<Child>,
}

/// `s` as a TOML basic string (JSON's escaping is valid TOML).
pub(crate) fn toml_str(s: &str) -> String {
    serde_json::to_string(s).expect("string")
}

/// `ctr --address <socket> --namespace <namespace>`, ready for more arguments.
pub fn ctr_command(socket: &Path, namespace: &str) -> Command {
    let mut cmd = Command::new("/usr/bin/ctr");
    cmd.arg("--address").arg(socket).arg("--namespace").arg(namespace);
    cmd
}

/// Kills and removes every task and container in each of `namespaces` of the containerd at
/// `socket` (best effort, errors ignored: for cleanup).
pub fn remove_all_containers(socket: &Path, namespaces: &[&str]) {
    for ns in namespaces {
        let Ok(out) = ctr_command(socket, ns).args(["containers", "list", "-q"]).output() else { continue };
        for id in String::from_utf8_lossy(&out.stdout).lines().map(str::trim).filter(|l| !l.is_empty()) {
            let _ = ctr_command(socket, ns).args(["tasks", "kill", "-s", "SIGKILL", id]).output();
            std::thread::sleep(Duration::from_millis(100));
            let _ = ctr_command(socket, ns).args(["tasks", "delete", "-f", id]).output();
            let _ = ctr_command(socket, ns).args(["containers", "delete", id]).output();
        }
    }
}

impl Containerd {
    /// Writes a config under `base` (which must exist and be private to the test) and starts
    /// containerd, waiting until it answers.
    pub fn start(base: &Path, options: &ContainerdOptions) -> Result<Containerd> {
        process::require_root()?;
        process::require_file(Path::new("/usr/bin/containerd"), "install Debian's containerd package")?;
        let base = base.to_owned();
        let root = base.join("root");
        let state = base.join("state");
        let socket = base.join("containerd.sock");
        let config = base.join("config.toml");
        let log = base.join("containerd.log");
        for dir in [
            &root,
            &state,
            &base.join("cni-bin"),
            &base.join("cni-conf"),
            &base.join("opt"),
            &base.join("pod-logs"),
        ] {
            fs::create_dir_all(dir).map_err(io("create", dir))?;
        }
        fs::write(&config, Self::config_text(&base, options)).map_err(io("write", &config))?;

        let mut path: Vec<PathBuf> = options.path_prepend.clone();
        path.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
        for standard in ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
            path.push(PathBuf::from(standard));
        }
        let log_file = fs::File::create(&log).map_err(io("create", &log))?;
        let mut cmd = Command::new("/usr/bin/containerd");
        cmd.arg("--config")
            .arg(&config)
            .env("PATH", std::env::join_paths(path).map_err(|e| HarnessError::Prerequisite(e.to_string()))?)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().map_err(io("dup", &log))?)
            .stderr(log_file);
        for (k, v) in &options.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().map_err(io("start containerd with", &config))?;
        static INSTANCES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = INSTANCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let namespace = format!("nvt-{}-{n}", std::process::id());
        let pid = child.id();
        let mut me = Containerd {
            base,
            socket,
            root,
            state,
            config,
            log,
            namespace,
            pid,
            cri: options.cri,
            child: Some(child),
        };
        let ready = process::wait_for("containerd to answer", Duration::from_secs(30), || {
            let out = me.ctr().arg("version").output().ok()?;
            out.status.success().then_some(())
        });
        if let Err(e) = ready {
            let log = fs::read_to_string(&me.log).unwrap_or_default();
            me.stop();
            return Err(HarnessError::Command {
                command: "containerd".into(),
                status: e.to_string(),
                output: log.lines().rev().take(20).collect::<Vec<_>>().join("\n"),
            });
        }
        Ok(me)
    }

    fn config_text(base: &Path, options: &ContainerdOptions) -> String {
        let p = |rel: &str| toml_str(&base.join(rel).to_string_lossy());
        // Top-level keys first: in TOML they cannot follow a table.
        let mut text = format!("version = 2\nroot = {}\nstate = {}\n", p("root"), p("state"));
        if !options.cri {
            text.push_str("disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n");
        }
        text.push_str(&format!(
            "\n[grpc]\n  address = {}\n\n[debug]\n  level = \"debug\"\n\n[plugins.\"io.containerd.internal.v1.opt\"]\n  path = {}\n",
            p("containerd.sock"),
            p("opt"),
        ));
        if options.cri {
            let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
            text.push_str(&format!(
                "\n[{cri}]\n  sandbox_image = {}\n  restrict_oom_score_adj = true\n  disable_apparmor = true\n\
                 [{cri}.cni]\n  bin_dir = {}\n  conf_dir = {}\n\
                 [{cri}.containerd]\n  default_runtime_name = \"runc\"\n  snapshotter = \"overlayfs\"\n\
                 [{cri}.containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n",
                toml_str(&options.sandbox_image),
                p("cni-bin"),
                p("cni-conf"),
            ));
            for (name, body) in &options.cri_runtimes {
                text.push_str(&format!("[{cri}.containerd.runtimes.{name}]\n{body}\n"));
            }
        }
        text
    }

    /// containerd's PID.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `ctr --address <sock> --namespace <ns>`, ready for more arguments.
    pub fn ctr(&self) -> Command {
        ctr_command(&self.socket, &self.namespace)
    }

    /// Imports an image archive (and unpacks it for the default snapshotter).
    pub fn import(&self, image: &BuiltImage) -> Result<()> {
        self.import_into(image, &self.namespace)
    }

    /// Imports an image into another namespace (CRI uses `k8s.io`).
    pub fn import_into(&self, image: &BuiltImage, namespace: &str) -> Result<()> {
        process::run(ctr_command(&self.socket, namespace).args(["images", "import"]).arg(&image.tar))?;
        Ok(())
    }

    /// The tail of containerd's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        process::log_tail(&self.log, lines)
    }

    /// Processes attributable to this instance besides containerd itself: shims (their command
    /// line carries our socket path) and nvinject proxies (they carry a bundle path under our
    /// state directory).
    pub fn shim_processes(&self) -> Vec<ProcessInfo> {
        let own = self.pid as i32;
        let mut found = process::find_processes(&self.socket.to_string_lossy());
        found.extend(process::find_processes(&self.state.to_string_lossy()));
        found.sort_by_key(|p| p.pid);
        found.dedup_by_key(|p| p.pid);
        found.retain(|p| p.pid != own);
        found
    }

    /// The server's version as `ctr version` reports it (e.g. `1.6.20~ds1`).
    pub fn server_version(&self) -> Result<String> {
        let out = process::run(self.ctr().arg("version"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let server = text.split("Server:").nth(1).unwrap_or_default();
        Ok(server
            .lines()
            .find_map(|l| l.trim().strip_prefix("Version:"))
            .unwrap_or("unknown")
            .trim()
            .to_owned())
    }

    /// The socket files a shim for group `id` (a container id, or a pod's sandbox id) uses: the runc
    /// shim's (`/run/containerd/s/<sha256(address/namespace/id)>`, as containerd 1.6 names it) and
    /// our proxy's next to it.
    pub fn shim_sockets(&self, namespace: &str, id: &str) -> [PathBuf; 2] {
        use sha2::{Digest, Sha256};
        let key = format!("{}/{namespace}/{id}", self.socket.display());
        let hex: String = Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        let runc = Path::new("/run/containerd/s").join(&hex);
        [runc, Path::new("/run/containerd/s").join(format!("{hex}.nvinject"))]
    }

    /// Removes every task and container in the `ctr` namespace and CRI's `k8s.io` (best effort).
    pub fn remove_all_containers(&self) {
        remove_all_containers(&self.socket, &[self.namespace.as_str(), "k8s.io"]);
    }

    /// Stops everything this instance started: containers, then containerd (SIGTERM, then
    /// SIGKILL), then any shim still running, then mounts under its directories. Idempotent.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        if process::alive(child.id() as i32) {
            self.remove_all_containers();
        }
        let pid = child.id() as i32;
        process::stop_pid(pid, Duration::from_secs(10));
        let _ = child.wait();
        // Shims outlive containerd by design; ours must not outlive the test.
        for shim in self.shim_processes() {
            process::stop_pid(shim.pid, Duration::from_secs(2));
        }
        mounts::unmount_under(&self.base);
        // runc keeps per-namespace state and cgroups named after the namespace; once the
        // containers are gone they are empty directories. rmdir only: never remove anything in use.
        let _ = fs::remove_dir(Path::new("/run/containerd/runc").join(&self.namespace));
        if self.cri {
            let _ = fs::remove_dir("/run/containerd/runc/k8s.io");
        }
        namespace::remove_cgroup_tree(&self.cgroup_parent());
        self.child = None;
    }

    /// The cgroup parent this instance's containers use (`ctr` puts them under `/<namespace>`;
    /// pods get it as their `cgroup_parent`), removed again on stop.
    pub fn cgroup_parent(&self) -> String {
        format!("/{}", self.namespace)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop();
    }
}
