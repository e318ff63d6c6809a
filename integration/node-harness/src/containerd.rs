//! A private containerd for one test: its own root, state, socket, config and log, started by PID
//! and stopped by PID, with every shim it started found and stopped, and every mount it made
//! removed.
//!
//! Which containerd runs is [`ContainerdBuild::selected`]: Debian 12's 1.6 (the system package) by
//! default, or `NVINJECT_CONTAINERD=1.7` / `2.1` (Debian's trixie and sid builds, which
//! `integration/scripts/fetch-containerd.sh` unpacks into the cache). Each gets a config in its own
//! schema (version 2, or 3 with `io.containerd.cri.v1.*` for 2.x).
//!
//! It never reads or writes the host's `/etc/containerd`. Shared host paths containerd and runc
//! insist on (`/run/containerd/s/<hash>` shim sockets, `/run/containerd/runc/<namespace>`) are
//! keyed by this instance's socket path or namespace, so they never collide with anyone else's.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use nvinject_image_tool::image::BuiltImage;

use crate::error::{HarnessError, Result, io};
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
    /// The directories containerd's own CDI reads (`cdi_spec_dirs`), when its CDI is on. Empty:
    /// none of the host's (`/etc/cdi`, `/var/run/cdi` are never read by a test containerd).
    pub cdi_spec_dirs: Vec<PathBuf>,
}

/// The environment variable that picks the containerd build (`1.6`, `1.7`, `2.1`, ...).
pub const VERSION_ENV: &str = "NVINJECT_CONTAINERD";
/// The environment variable that turns containerd's own CDI (`enable_cdi`) `on` or `off`; unset,
/// each version's default (off before 2.0, on from 2.0).
pub const CDI_ENV: &str = "NVINJECT_CONTAINERD_CDI";
/// The environment variable naming a directory with `containerd`, `containerd-shim-runc-v2` and
/// `ctr` for a version this project does not fetch (a build from source, say).
pub const BIN_DIR_ENV: &str = "NVINJECT_CONTAINERD_BIN_DIR";

/// One containerd build: where its binaries are, which config schema it reads, whether its own
/// CDI is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerdBuild {
    /// `(major, minor)`, e.g. `(2, 1)`.
    pub version: (u32, u32),
    /// The directory holding `containerd`, `containerd-shim-runc-v2` and `ctr`.
    pub bin_dir: PathBuf,
    /// containerd's CRI `enable_cdi`.
    pub cdi: bool,
}

impl ContainerdBuild {
    /// The build named by [`VERSION_ENV`] (default `1.6`), [`CDI_ENV`] and [`BIN_DIR_ENV`], resolved
    /// once per process.
    pub fn selected() -> Result<&'static ContainerdBuild> {
        static SELECTED: OnceLock<std::result::Result<ContainerdBuild, String>> = OnceLock::new();
        SELECTED
            .get_or_init(|| {
                let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
                ContainerdBuild::resolve(
                    get(VERSION_ENV).as_deref().unwrap_or("1.6"),
                    get(CDI_ENV).as_deref(),
                    get(BIN_DIR_ENV).map(PathBuf::from),
                )
                .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| HarnessError::Prerequisite(e.clone()))
    }

    /// The build for `version` (`major.minor`), CDI `on`/`off` (`None`: the version's default),
    /// binaries from `bin_dir` or, without it, Debian 12's `/usr/bin` for 1.6 and the fetched tree
    /// for the versions `fetch-containerd.sh` knows.
    pub fn resolve(version: &str, cdi: Option<&str>, bin_dir: Option<PathBuf>) -> Result<ContainerdBuild> {
        let parsed = parse_version(version).ok_or_else(|| {
            HarnessError::Prerequisite(format!(
                "{VERSION_ENV}={version:?}: expected MAJOR.MINOR, e.g. 1.6, 1.7, 2.1"
            ))
        })?;
        let cdi = match cdi {
            None => parsed.0 >= 2,
            Some("on" | "true" | "1") => true,
            Some("off" | "false" | "0") => false,
            Some(other) => {
                return Err(HarnessError::Prerequisite(format!("{CDI_ENV}={other:?}: expected on or off")));
            }
        };
        let bin_dir = match bin_dir {
            Some(dir) => dir,
            None if parsed == (1, 6) => PathBuf::from("/usr/bin"),
            None => fetched_tree(version)?.join("usr/bin"),
        };
        for bin in ["containerd", "containerd-shim-runc-v2", "ctr"] {
            let path = bin_dir.join(bin);
            let fix = if parsed == (1, 6) {
                "apt-get install containerd (./x setup does)".to_owned()
            } else {
                format!(
                    "run `bash integration/scripts/fetch-containerd.sh {version}` (./x setup does), or set {BIN_DIR_ENV}"
                )
            };
            process::require_file(&path, &format!("containerd {version}: {fix}"))?;
        }
        Ok(ContainerdBuild { version: parsed, bin_dir, cdi })
    }

    /// `containerd 2.1 (CDI on)`: what test output names.
    pub fn label(&self) -> String {
        format!(
            "containerd {}.{} (CDI {})",
            self.version.0,
            self.version.1,
            if self.cdi { "on" } else { "off" }
        )
    }

    /// The daemon binary.
    pub fn containerd(&self) -> PathBuf {
        self.bin_dir.join("containerd")
    }

    /// The `ctr` binary.
    pub fn ctr(&self) -> PathBuf {
        self.bin_dir.join("ctr")
    }

    /// containerd 2.x: config `version = 3`, the CRI split into `io.containerd.cri.v1.*`.
    pub fn is_v2(&self) -> bool {
        self.version.0 >= 2
    }

    /// `PATH` for containerd (and the shims it starts): `prepend`, then this build's directory
    /// (its `containerd-shim-runc-v2`, which our shim delegates to), then the system's.
    pub fn path_env(&self, prepend: &[PathBuf]) -> Result<std::ffi::OsString> {
        let mut path: Vec<PathBuf> = prepend.to_vec();
        path.push(self.bin_dir.clone());
        path.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
        for standard in ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
            path.push(PathBuf::from(standard));
        }
        std::env::join_paths(path).map_err(|e| HarnessError::Prerequisite(e.to_string()))
    }

    /// The CRI part of a config for this build: sandbox image, no AppArmor, the OOM score rule,
    /// CNI dirs, runc as the default runtime, `runtimes` (`(handler, TOML body)`), and CDI as
    /// [`ContainerdBuild::cdi`] says with `cdi_spec_dirs`. `p` renders a path under the base dir.
    pub fn cri_config(
        &self,
        sandbox_image: &str,
        cni_bin: &str,
        cni_conf: &str,
        runtimes: &[(String, String)],
        cdi_spec_dirs: &[PathBuf],
    ) -> String {
        let dirs: Vec<String> = cdi_spec_dirs.iter().map(|d| toml_str(&d.to_string_lossy())).collect();
        // 1.6 has no CDI of its own.
        let cdi = if self.version >= (1, 7) {
            format!("  enable_cdi = {}\n  cdi_spec_dirs = [{}]\n", self.cdi, dirs.join(", "))
        } else {
            String::new()
        };
        let mut text = String::new();
        let runtimes_table = if self.is_v2() {
            let images = "plugins.\"io.containerd.cri.v1.images\"";
            text.push_str(&format!(
                "\n[{images}]\n  snapshotter = \"overlayfs\"\n[{images}.pinned_images]\n  sandbox = {}\n",
                toml_str(sandbox_image)
            ));
            let rt = "plugins.\"io.containerd.cri.v1.runtime\"";
            text.push_str(&format!(
                "\n[{rt}]\n  restrict_oom_score_adj = true\n  disable_apparmor = true\n{cdi}\
                 [{rt}.cni]\n  bin_dirs = [{cni_bin}]\n  conf_dir = {cni_conf}\n",
            ));
            format!("{rt}.containerd")
        } else {
            let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
            text.push_str(&format!(
                "\n[{cri}]\n  sandbox_image = {}\n  restrict_oom_score_adj = true\n  disable_apparmor = true\n{cdi}\
                 [{cri}.cni]\n  bin_dir = {cni_bin}\n  conf_dir = {cni_conf}\n",
                toml_str(sandbox_image),
            ));
            format!("{cri}.containerd")
        };
        let snapshotter = if self.is_v2() { "" } else { "  snapshotter = \"overlayfs\"\n" };
        text.push_str(&format!(
            "[{runtimes_table}]\n  default_runtime_name = \"runc\"\n{snapshotter}\
             [{runtimes_table}.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n"
        ));
        for (name, body) in runtimes {
            text.push_str(&format!("[{runtimes_table}.runtimes.{name}]\n{body}\n"));
        }
        text
    }

    /// The plugins a `ctr`-only containerd disables (CRI), and NRI on 2.x (on by default there, it
    /// would listen on the host's `/var/run/nri/nri.sock`).
    pub fn top_level_config(&self, cri: bool) -> String {
        let mut disabled: Vec<&str> = Vec::new();
        if !cri {
            disabled.push("io.containerd.grpc.v1.cri");
            if self.is_v2() {
                disabled.extend(["io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"]);
            }
        }
        if self.version >= (1, 7) {
            disabled.push("io.containerd.nri.v1.nri");
        }
        if disabled.is_empty() {
            return String::new();
        }
        let names: Vec<String> = disabled.iter().map(|d| toml_str(d)).collect();
        format!("disabled_plugins = [{}]\n", names.join(", "))
    }

    /// The config schema's `version`.
    pub fn config_version(&self) -> u32 {
        if self.is_v2() { 3 } else { 2 }
    }
}

/// `"2.1"` -> `(2, 1)`.
fn parse_version(v: &str) -> Option<(u32, u32)> {
    let (major, minor) = v.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The cache tree `fetch-containerd.sh` unpacks `version` into (made or not).
fn fetched_tree(version: &str) -> Result<PathBuf> {
    let script = crate::artifacts::setup_script("scripts/fetch-containerd.sh");
    let out = process::run(Command::new("bash").arg(&script).arg("--path").arg(version))?;
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
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
    /// The build running.
    pub build: ContainerdBuild,
    pid: u32,
    cri: bool,
    child: Option<Child>,
}

/// `s` as a TOML basic string (JSON's escaping is valid TOML).
pub(crate) fn toml_str(s: &str) -> String {
    serde_json::to_string(s).expect("string")
}

/// `ctr --address <socket> --namespace <namespace>`, ready for more arguments.
/// The selected build's `ctr` ([`ContainerdBuild::selected`]; Debian's when that is misconfigured,
/// which [`Containerd::start`] reports first).
pub fn ctr_command(socket: &Path, namespace: &str) -> Command {
    let ctr = ContainerdBuild::selected().map(ContainerdBuild::ctr).unwrap_or_else(|_| "/usr/bin/ctr".into());
    let mut cmd = Command::new(ctr);
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
        process::ensure_root()?;
        let build = ContainerdBuild::selected()?.clone();
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
        fs::write(&config, Self::config_text(&build, &base, options)).map_err(io("write", &config))?;

        let log_file = fs::File::create(&log).map_err(io("create", &log))?;
        let mut cmd = Command::new(build.containerd());
        process::as_node_service(&mut cmd)
            .arg("--config")
            .arg(&config)
            .env("PATH", build.path_env(&options.path_prepend)?)
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
            build,
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

    fn config_text(build: &ContainerdBuild, base: &Path, options: &ContainerdOptions) -> String {
        let p = |rel: &str| toml_str(&base.join(rel).to_string_lossy());
        // Top-level keys first: in TOML they cannot follow a table.
        let mut text =
            format!("version = {}\nroot = {}\nstate = {}\n", build.config_version(), p("root"), p("state"));
        text.push_str(&build.top_level_config(options.cri));
        text.push_str(&format!(
            "\n[grpc]\n  address = {}\n\n[debug]\n  level = \"debug\"\n\n[plugins.\"io.containerd.internal.v1.opt\"]\n  path = {}\n",
            p("containerd.sock"),
            p("opt"),
        ));
        if options.cri {
            text.push_str(&build.cri_config(
                &options.sandbox_image,
                &p("cni-bin"),
                &p("cni-conf"),
                &options.cri_runtimes,
                &options.cdi_spec_dirs,
            ));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A build for `version` whose binaries are empty files in a temp dir (nothing is run).
    fn build(version: &str, cdi: Option<&str>) -> (tempfile::TempDir, Result<ContainerdBuild>) {
        let dir = tempfile::tempdir().unwrap();
        for bin in ["containerd", "containerd-shim-runc-v2", "ctr"] {
            fs::write(dir.path().join(bin), "").unwrap();
        }
        let b = ContainerdBuild::resolve(version, cdi, Some(dir.path().to_owned()));
        (dir, b)
    }

    fn options(cri: bool) -> ContainerdOptions {
        ContainerdOptions {
            cri,
            sandbox_image: "img".into(),
            cri_runtimes: vec![("nvidia".into(), "  runtime_type = \"x\"\n".into())],
            cdi_spec_dirs: vec![PathBuf::from("/t/cdi")],
            ..Default::default()
        }
    }

    #[test]
    fn versions_and_cdi_switches_parse_or_name_the_variable() {
        let (_d, b) = build("2.1", None);
        let b = b.unwrap();
        assert_eq!((b.version, b.cdi, b.config_version()), ((2, 1), true, 3));
        assert_eq!(b.label(), "containerd 2.1 (CDI on)");
        let (_d, b) = build("1.7", None);
        assert!(!b.unwrap().cdi, "1.x: CDI off by default");
        let (_d, b) = build("2.1", Some("off"));
        assert!(!b.unwrap().cdi);
        let (_d, b) = build("two", None);
        assert!(b.unwrap_err().to_string().contains(VERSION_ENV));
        let (_d, b) = build("2.1", Some("maybe"));
        assert!(b.unwrap_err().to_string().contains(CDI_ENV));
        let empty = tempfile::tempdir().unwrap();
        let e = ContainerdBuild::resolve("2.1", None, Some(empty.path().to_owned())).unwrap_err().to_string();
        assert!(e.contains("containerd 2.1") && e.contains(BIN_DIR_ENV), "{e}");
    }

    #[test]
    fn each_version_gets_its_own_schema() {
        let base = Path::new("/t");
        let (_d, v2) = build("2.1", None);
        let text = Containerd::config_text(&v2.unwrap(), base, &options(true));
        let parsed: toml::Table = text.parse().unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(parsed["version"].as_integer(), Some(3));
        let plugins = parsed["plugins"].as_table().unwrap();
        let runtime = plugins["io.containerd.cri.v1.runtime"].as_table().unwrap();
        assert_eq!(runtime["enable_cdi"].as_bool(), Some(true));
        assert_eq!(runtime["cdi_spec_dirs"].as_array().unwrap()[0].as_str(), Some("/t/cdi"));
        assert!(runtime["containerd"]["runtimes"]["nvidia"].is_table(), "{text}");
        assert_eq!(plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"].as_str(), Some("img"));
        assert!(!plugins.contains_key("io.containerd.grpc.v1.cri"), "{text}");
        let disabled: Vec<&str> =
            parsed["disabled_plugins"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
        assert_eq!(disabled, ["io.containerd.nri.v1.nri"], "NRI would listen on the host's socket");

        // ctr only: every CRI plugin of 2.x off.
        let (_d, v2) = build("2.1", None);
        let text = Containerd::config_text(&v2.unwrap(), base, &options(false));
        let parsed: toml::Table = text.parse().unwrap();
        let disabled: Vec<&str> =
            parsed["disabled_plugins"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
        assert!(
            disabled.contains(&"io.containerd.cri.v1.runtime")
                && disabled.contains(&"io.containerd.grpc.v1.cri")
        );

        // 1.6: version 2, the grpc CRI plugin, no CDI keys (it has no CDI), no NRI to disable.
        let (_d, v16) = build("1.6", None);
        let text = Containerd::config_text(&v16.unwrap(), base, &options(true));
        let parsed: toml::Table = text.parse().unwrap();
        assert_eq!(parsed["version"].as_integer(), Some(2));
        let cri = parsed["plugins"]["io.containerd.grpc.v1.cri"].as_table().unwrap();
        assert!(!cri.contains_key("enable_cdi") && !parsed.contains_key("disabled_plugins"), "{text}");
        assert_eq!(cri["sandbox_image"].as_str(), Some("img"));
    }
}
