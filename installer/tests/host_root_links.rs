//! Hostile links in the host root, for every caller that hands a host path to another program or
//! the kernel: containerd's socket and binary, the roots given to cdi-gen, the `/dev/char` scan
//! and `doctor`'s probes. Each link kind an attacker would try: an absolute link out of the root, a
//! `..` chain past it, and a `/proc/self/root` (magic) link. In every case the installer must
//! either refuse or stay inside the root; the file outside is planted so that reaching it shows.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;
use nvinject_gpu::{Inventory, NvmlError};
use nvinject_installer::cdi::CdiGen;
use nvinject_installer::containerd::ContainerdVersion;
use nvinject_installer::cri::{CriError, TestContainer};
use nvinject_installer::devchar;
use nvinject_installer::doctor::facts::LoadedRuntimes;
use nvinject_installer::doctor::{DoctorArgs, DoctorEnv, HostFiles, LogDir, ProbeError, Status, check};
use nvinject_installer::install::{Settings, SpecGenerator, SpecRequest};
use nvinject_installer::paths::HostRoot;
use nvinject_installer::service::{Containerd, HostContainerd, RestartMode};

/// A host root and, beside it, an "outside" tree the installer must never reach.
struct Trees {
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

impl Trees {
    fn new() -> Trees {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("host");
        let outside = dir.path().join("outside");
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(&outside).unwrap();
        Trees { _dir: dir, root, outside }
    }

    fn host(&self) -> HostRoot {
        HostRoot::new(&self.root)
    }

    fn mkdir(&self, rel: &str) {
        fs::create_dir_all(self.root.join(rel)).unwrap();
    }

    fn link(&self, rel: &str, target: impl AsRef<Path>) {
        let at = self.root.join(rel);
        fs::create_dir_all(at.parent().unwrap()).unwrap();
        symlink(target, at).unwrap();
    }

    /// The three ways out, each pointing at `outside/<rel>`, for a link at depth `depth` in the
    /// root: absolute, a `..` chain (one more `..` than needed, and the root's own name), and
    /// through `/proc/self/root`.
    fn escapes(&self, rel: &str, depth: usize) -> Vec<(&'static str, PathBuf)> {
        let absolute = self.outside.join(rel);
        let dotdot = PathBuf::from("../".repeat(depth + 4)).join(absolute.strip_prefix("/").unwrap());
        let parent_chain = PathBuf::from("../".repeat(depth + 1)).join("outside").join(rel);
        let magic = Path::new("/proc/self/root").join(absolute.strip_prefix("/").unwrap());
        vec![("absolute", absolute), ("dotdot", dotdot), ("parent-chain", parent_chain), ("magic", magic)]
    }
}

/// A path `locate` returns always lies inside the root, whatever the links.
#[test]
fn locate_never_returns_a_path_outside_the_root() {
    let t = Trees::new();
    fs::write(t.outside.join("secret"), "outside").unwrap();
    t.mkdir("etc");
    for (kind, target) in t.escapes("secret", 1) {
        let link = format!("etc/{kind}");
        t.link(&link, &target);
        match t.host().locate(&format!("/{link}")) {
            Ok(p) => panic!("{kind} link {} located at {}", target.display(), p.display()),
            Err(e) => assert!(e.to_string().contains(&link), "{kind}: error does not name the link: {e}"),
        }
    }
    // The same link kinds pointing back inside are followed inside.
    fs::write(t.root.join("etc/inside"), "in").unwrap();
    t.link("var/abs", "/etc/inside");
    t.link("var/rel", "../../../../etc/inside");
    for link in ["/var/abs", "/var/rel"] {
        assert_eq!(t.host().locate(link).unwrap(), t.root.join("etc/inside"), "{link}");
    }
}

/// With the host as root (`--host-root /`), a magic link is still refused: `/proc/self/root`
/// would otherwise lead wherever the installer's own root is, which is not the host's in a
/// container.
#[test]
fn a_magic_link_is_refused_even_with_the_host_as_root() {
    let t = Trees::new();
    fs::write(t.outside.join("f"), "x").unwrap();
    let link = t.root.join("magic");
    symlink(Path::new("/proc/self/root").join(t.outside.strip_prefix("/").unwrap()), &link).unwrap();
    let e = HostRoot::new("/").locate(&format!("{}/f", link.display())).unwrap_err();
    assert!(e.to_string().contains("magic"), "{e}");
}

fn host_containerd(root: HostRoot, mode: RestartMode) -> HostContainerd {
    HostContainerd {
        host_root: root,
        socket: "/run/containerd/containerd.sock".into(),
        binary: "/usr/bin/containerd".into(),
        mode,
        // Ignored by default: if the check below failed and this reached our own process, the
        // test would still end and report it.
        signal: Signal::SIGWINCH,
        unit: "containerd".into(),
        systemctl: PathBuf::from("/nonexistent/systemctl"),
        version_override: None,
        wait: Duration::from_millis(200),
    }
}

/// A socket outside the root, reached through a link in it, is never connected to: restart mode
/// `signal` would otherwise signal whatever process serves it.
#[test]
fn containerd_socket_links_out_of_the_root_are_not_followed() {
    for kind in ["absolute", "dotdot", "parent-chain", "magic"] {
        let t = Trees::new();
        let _listener = UnixListener::bind(t.outside.join("containerd.sock")).unwrap();
        let (_, target) = t.escapes("containerd.sock", 2).into_iter().find(|(k, _)| *k == kind).unwrap();
        t.link("run/containerd/containerd.sock", &target);
        let c = host_containerd(t.host(), RestartMode::Signal);
        assert!(c.socket_path().is_err(), "{kind}: located {:?}", c.socket_path());
        let message = c.restart().unwrap_err().to_string();
        assert!(message.contains("cannot find the process serving"), "{kind}: {message}");
    }
}

#[test]
fn containerd_socket_links_inside_the_root_are_followed_there() {
    let t = Trees::new();
    // Debian's /var/run -> /run, absolute: it means the host's /run.
    t.mkdir("run/containerd");
    t.link("var/run", "/run");
    let _listener = UnixListener::bind(t.root.join("run/containerd/containerd.sock")).unwrap();
    let mut c = host_containerd(t.host(), RestartMode::Signal);
    c.socket = "/var/run/containerd/containerd.sock".into();
    assert_eq!(c.socket_path().unwrap(), t.root.join("run/containerd/containerd.sock"));
    assert_eq!(
        nvinject_installer::service::socket_peer_pid(&c.socket_path().unwrap()).unwrap(),
        std::process::id() as i32
    );
}

fn version_script(path: &Path, version: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, format!("#!/bin/sh\necho 'containerd github.com/containerd/containerd {version} abc'\n"))
        .unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// `containerd --version` runs the host's binary: a link out of the root is not run.
#[test]
fn containerd_binary_links_out_of_the_root_are_not_run() {
    let t = Trees::new();
    version_script(&t.outside.join("containerd"), "9.9.9");
    for (kind, target) in t.escapes("containerd", 2) {
        let link = format!("usr/bin/{kind}");
        t.link(&link, &target);
        let mut c = host_containerd(t.host(), RestartMode::None);
        c.binary = format!("/{link}");
        match c.version() {
            Ok(v) => panic!("{kind}: ran {} and got {v}", target.display()),
            Err(e) => assert!(e.to_string().contains(&link), "{kind}: {e}"),
        }
    }
    // A link inside the root is followed there.
    version_script(&t.root.join("opt/containerd/bin/containerd"), "1.7.20");
    t.link("usr/bin/containerd", "/opt/containerd/bin/containerd");
    let c = host_containerd(t.host(), RestartMode::None);
    assert_eq!(c.version().unwrap(), ContainerdVersion::parse("1.7.20").unwrap());
}

/// The roots cdi-gen gets are located inside the host root first: a driver, dev, proc or sys root
/// that links out fails there, naming it, before NVML or any file under it is touched.
#[test]
fn cdi_gen_roots_linking_out_are_refused() {
    let t = Trees::new();
    for dir in ["driver", "dev", "proc", "sys"] {
        fs::create_dir_all(t.outside.join(dir)).unwrap();
        t.mkdir(dir);
    }
    fs::write(t.outside.join("libnvidia-ml.so.1"), "").unwrap();
    t.mkdir("links");
    let request = |field: &str, value: &str| {
        let mut r = SpecRequest {
            host_root: t.host(),
            driver_root: "/driver".into(),
            dev_root: "/dev".into(),
            proc_root: "/proc".into(),
            sys_root: "/sys".into(),
            nvml_lib: None,
            hook_path: "/usr/local/nvinject/bin/nvinject-hook".into(),
            mps_pipe_dir: None,
            hook_timeout_secs: 30,
        };
        match field {
            "driver" => r.driver_root = value.into(),
            "dev" => r.dev_root = value.into(),
            "proc" => r.proc_root = value.into(),
            "sys" => r.sys_root = value.into(),
            "mps" => r.mps_pipe_dir = Some(value.into()),
            _ => r.nvml_lib = Some(value.into()),
        }
        r
    };
    t.mkdir("mps");
    fs::create_dir_all(t.outside.join("mps")).unwrap();
    for field in ["driver", "dev", "proc", "sys", "nvml", "mps"] {
        let rel = if field == "nvml" { "libnvidia-ml.so.1" } else { field };
        for (kind, target) in t.escapes(rel, 1) {
            let link = format!("links/{field}-{kind}");
            t.link(&link, &target);
            let e = CdiGen.generate(&request(field, &format!("/{link}"))).unwrap_err().to_string();
            assert!(e.contains(&link), "{field} {kind}: not refused at the link: {e}");
        }
    }
}

fn char_device(path: &Path, major: u64, minor: u64) {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    mknod(path, SFlag::S_IFCHR, Mode::from_bits_truncate(0o600), makedev(major, minor)).unwrap();
}

/// The `/dev/char` scan lists the host's devices, not the installer's or an attacker's.
#[test]
#[ignore = "needs root"]
fn devchar_scan_stays_inside_the_root() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let t = Trees::new();
    char_device(&t.outside.join("dev/nvidia7"), 195, 7);
    char_device(&t.outside.join("dev/nvidia-caps/nvidia-cap9"), 237, 9);
    char_device(&t.root.join("dev/nvidia0"), 195, 0);
    char_device(&t.root.join("dev/nvidia-caps/nvidia-cap1"), 237, 1);
    fn found(t: &Trees, dir: &str) -> Vec<(String, u64, u64)> {
        devchar::scan(&t.host(), dir).unwrap().into_iter().map(|d| (d.name, d.major, d.minor)).collect()
    }
    assert_eq!(
        found(&t, "/dev"),
        [("nvidia-caps/nvidia-cap1".to_owned(), 237, 1), ("nvidia0".to_owned(), 195, 0)]
    );
    // A dev root that links out finds nothing (it is empty inside the root).
    for (kind, target) in t.escapes("dev", 1) {
        let link = format!("roots/{kind}");
        t.link(&link, &target);
        assert!(found(&t, &format!("/{link}")).is_empty(), "{kind}: scanned {}", target.display());
    }
    // Entries that are links (to a device outside or inside) are not devices of this root; an
    // `nvidia-caps` that links out lists nothing.
    let t = Trees::new();
    char_device(&t.outside.join("dev/nvidia7"), 195, 7);
    char_device(&t.outside.join("dev/nvidia-caps/nvidia-cap9"), 237, 9);
    char_device(&t.root.join("dev/nvidia0"), 195, 0);
    t.link("dev/nvidia5", t.outside.join("dev/nvidia7"));
    t.link("dev/nvidia6", "/dev/nvidia0");
    t.link("dev/nvidia-caps", "../../outside/dev/nvidia-caps");
    assert_eq!(found(&t, "/dev"), [("nvidia0".to_owned(), 195, 0)]);
}

/// Services faked; the files are the real probes over the test's host root (what is tested).
struct FakeEnv(HostFiles);

impl FakeEnv {
    fn new(settings: &Settings) -> FakeEnv {
        FakeEnv(HostFiles::new(settings.host_root.clone()))
    }
}

impl DoctorEnv for FakeEnv {
    fn files(&self) -> &HostFiles {
        &self.0
    }
    fn inventory(&self, _: Option<&Path>) -> Result<Inventory, ProbeError> {
        Err(NvmlError::DriverNotLoaded { library: "not asked in these tests".into() }.into())
    }
    fn containerd_version(&self) -> Result<ContainerdVersion, ProbeError> {
        Ok(ContainerdVersion::new(1, 7, 20))
    }
    fn cri_runtimes(&self) -> Result<LoadedRuntimes, ProbeError> {
        Ok(LoadedRuntimes::from([("nvidia".to_owned(), ("io.containerd.runc.v2".to_owned(), String::new()))]))
    }
    fn run_container(&self, _: &TestContainer) -> Result<(i32, String), ProbeError> {
        Err(CriError::Timeout.into())
    }
}

fn doctor(t: &Trees, only: &str, adjust: impl FnOnce(&mut Settings)) -> (Status, String) {
    let mut s = Settings::defaults(t.host(), PathBuf::from("/unused"));
    adjust(&mut s);
    let phases = ["driver", "cdi", "containerd", "device-plugin", "container"];
    let args = DoctorArgs {
        skip: phases.iter().filter(|p| **p != only).map(|p| (*p).to_owned()).collect(),
        ..DoctorArgs::default()
    };
    let lines = check(&s, &args, &FakeEnv::new(&s));
    let line = lines.into_iter().find(|l| l.phase == only).unwrap();
    (line.status, line.detail)
}

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

/// `doctor` reads the driver version, the spec, the containerd config, the shim and the plugin
/// sockets inside the host root; links out of it make each phase fail as if the file were absent.
#[test]
fn doctor_probes_do_not_follow_links_out_of_the_root() {
    let t = Trees::new();
    write(&t.outside.join("sys/module/nvidia/version"), "550.54.15\n");
    write(&t.outside.join("spec.json"), r#"{"cdiVersion":"0.6.0","kind":"nvidia.com/gpu","devices":[]}"#);
    version_script(&t.outside.join("shim"), "0");
    fs::create_dir_all(t.outside.join("plugins")).unwrap();
    let _kubelet = UnixListener::bind(t.outside.join("plugins/kubelet.sock")).unwrap();
    let _plugin = UnixListener::bind(t.outside.join("plugins/nvinject-gpu.sock")).unwrap();
    write(
        &t.outside.join("plugins/kubelet_internal_checkpoint"),
        r#"{"Data":{"RegisteredDevices":{"nvidia.com/gpu":["GPU-1"]}}}"#,
    );

    for ((kind, sys), (_, spec)) in t.escapes("sys", 1).into_iter().zip(t.escapes("spec.json", 1)) {
        // driver: the module version file through a sys root that links out.
        let link = format!("links/sys-{kind}");
        t.link(&link, &sys);
        let (status, detail) = doctor(&t, "driver", |s| s.sys_root = format!("/{link}"));
        assert_eq!(status, Status::Fail, "{kind}: {detail}");
        assert!(detail.contains("missing"), "{kind}: {detail}");

        // cdi: the spec file itself is a link out.
        let cdi_dir = format!("/cdi-{kind}");
        t.link(&format!("cdi-{kind}/nvidia.com-gpu.json"), &spec);
        let (status, detail) = doctor(&t, "cdi", |s| s.cdi_dir = cdi_dir.clone());
        assert_eq!(status, Status::Fail, "{kind}: {detail}");
        assert!(detail.contains("missing"), "{kind}: {detail}");
    }

    // device-plugin: the plugin directory links out (absolute and magic; a `..` chain is the
    // same lookup).
    for (kind, target) in t.escapes("plugins", 1) {
        let link = format!("dp/{kind}");
        t.link(&link, &target);
        let phases = ["driver", "cdi", "containerd", "container"];
        let s_dir = DoctorArgs {
            device_plugin_dir: format!("/{link}"),
            skip: phases.iter().map(|p| (*p).to_owned()).collect(),
            ..DoctorArgs::default()
        };
        let s = Settings::defaults(t.host(), PathBuf::from("/unused"));
        let line =
            check(&s, &s_dir, &FakeEnv::new(&s)).into_iter().find(|l| l.phase == "device-plugin").unwrap();
        assert_eq!(line.status, Status::Fail, "{kind}: {}", line.detail);
        assert!(line.detail.contains("does not answer"), "{kind}: {}", line.detail);
    }

    // containerd: the runtime's shim is a link to an executable outside the root.
    for kind in ["absolute", "dotdot", "parent-chain", "magic"] {
        let t2 = Trees::new();
        version_script(&t2.outside.join("shim"), "0");
        let (_, target) = t2.escapes("shim", 4).into_iter().find(|(k, _)| *k == kind).unwrap();
        write(
            &t2.root.join("etc/containerd/config.toml"),
            "version = 2\nimports = [\"/etc/containerd/conf.d/99-nvinject.toml\"]\n",
        );
        write(
            &t2.root.join("etc/containerd/conf.d/99-nvinject.toml"),
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\nruntime_type = \
             \"io.containerd.runc.v2\"\nruntime_path = \"/usr/local/nvinject/bin/containerd-shim-nvinject-v2\"\n\
             container_annotations = [\"cdi.k8s.io/*\"]\n",
        );
        t2.link("usr/local/nvinject/bin/containerd-shim-nvinject-v2", &target);
        let (status, detail) = doctor(&t2, "containerd", |_| {});
        assert_eq!(status, Status::Fail, "{kind}: {detail}");
        assert!(detail.contains("missing or not executable"), "{kind}: {detail}");
        // The same shim inside the root passes (so the failure above is the link's).
        fs::remove_file(t2.root.join("usr/local/nvinject/bin/containerd-shim-nvinject-v2")).unwrap();
        version_script(&t2.root.join("opt/shim"), "0");
        t2.link("usr/local/nvinject/bin/containerd-shim-nvinject-v2", "/opt/shim");
        let (status, detail) = doctor(&t2, "containerd", |_| {});
        assert_eq!(status, Status::Ok, "{kind}: {detail}");
    }
}

/// The test container's log directory is created fresh, 0700, inside the host root's /tmp, and
/// removed with what containerd wrote; a /tmp that links out is refused.
#[test]
fn doctor_log_dir_is_private_and_inside_the_root() {
    let t = Trees::new();
    t.mkdir("tmp");
    fs::set_permissions(t.root.join("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
    let logs = LogDir::create(&t.host(), "/tmp").unwrap();
    let local = t.root.join(logs.host.trim_start_matches('/'));
    let meta = fs::symlink_metadata(&local).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o700);
    fs::write(logs.dir.join("gpu-test.log"), "log").unwrap();
    assert_eq!(fs::read_to_string(local.join("gpu-test.log")).unwrap(), "log");
    let other = LogDir::create(&t.host(), "/tmp").unwrap();
    assert_ne!(other.host, logs.host, "two log directories share a name");
    drop(logs);
    assert!(!local.exists(), "log directory left behind");

    for (kind, target) in t.escapes("tmp", 1) {
        fs::create_dir_all(t.outside.join("tmp")).unwrap();
        let link = format!("links/tmp-{kind}");
        t.link(&link, &target);
        assert!(LogDir::create(&t.host(), &format!("/{link}")).is_err(), "{kind}");
        assert_eq!(fs::read_dir(t.outside.join("tmp")).unwrap().count(), 0, "{kind}: wrote outside");
    }
}

/// Special files where doctor expects a small text file: a FIFO (which would block a plain read
/// forever) and a character device with `/dev/zero`'s numbers (endless) are refused at once, and
/// the phase fails as if the file were missing.
#[test]
#[ignore = "needs root"]
fn doctor_refuses_fifos_and_devices_without_blocking() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let t = Trees::new();
    char_device(&t.root.join("sys/module/nvidia/version"), 1, 5);
    t.mkdir("var/run/cdi");
    nix::unistd::mkfifo(
        &t.root.join("var/run/cdi/nvidia.com-gpu.json"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let (status, detail) = doctor(&t, "driver", |_| {});
    assert_eq!(status, Status::Fail, "{detail}");
    assert!(detail.contains("missing"), "{detail}");
    let (status, detail) = doctor(&t, "cdi", |_| {});
    assert_eq!(status, Status::Fail, "{detail}");
    assert!(detail.contains("cannot be read") && detail.contains("FIFO"), "{detail}");
}
