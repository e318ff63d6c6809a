//! `doctor`: the "driver -> runtime -> plugin -> container" debug loop as one command.
//!
//! Phases ([`Phase`]) run in order; each prints one line, OK or FAIL with the fix, and a phase
//! whose prerequisite failed is SKIPped (its result would only repeat the first failure):
//! 1. driver: the kernel module is loaded and NVML answers with the same driver version;
//! 2. cdi: our spec is present, valid, and fresh (driver version and inventory digest match);
//! 3. containerd: its config has our runtime (with CDI annotations, without pod annotations), the
//!    shim it names exists, and the running containerd has loaded it;
//! 4. device-plugin: the kubelet's registration socket and our plugin's socket answer, and the
//!    kubelet's checkpoint lists the resource;
//! 5. container: a pod with the `nvidia` handler and a CDI annotation runs a command that sees a GPU.
//!
//! Three parts, data flowing one way: [`probe`] asks the node, only through [`DoctorEnv`] (files
//! under the host root, NVML, containerd, CRI), and records what it saw as [`facts`]; [`phases`]
//! judges those facts, purely; [`report`] prints the lines.

pub mod args;
pub mod facts;
pub mod phases;
pub mod probe;
pub mod report;

use std::io::Write;

pub use args::DoctorArgs;
pub use facts::{NodeFacts, ProbeError};
pub use probe::{DoctorEnv, HostEnv, HostFiles, LogDir};
pub use report::{Line, Phase, Status, print};

use crate::error::Result;
use crate::settings::Settings;

/// Runs every phase and returns the lines: each phase probes the node, then is judged on what
/// it found.
pub fn check(settings: &Settings, args: &DoctorArgs, env: &dyn DoctorEnv) -> Vec<Line> {
    let mut facts = NodeFacts::default();
    let mut lines: Vec<Line> = Vec::new();
    for phase in Phase::ALL {
        if args.skips(phase) {
            lines.push(Line::skip(phase, "skipped (--skip)"));
            continue;
        }
        let line = match phase {
            Phase::Driver => phases::driver(facts.driver.insert(probe::driver(settings, env))),
            Phase::Cdi => phases::spec(facts.spec.insert(probe::spec(settings, env)), facts.driver.as_ref()),
            Phase::Containerd => {
                phases::containerd(settings, facts.containerd.insert(probe::containerd(settings, env)))
            }
            Phase::DevicePlugin => phases::plugin(args, facts.plugin.insert(probe::plugin(args, env))),
            // Runs a container only when every phase it needs passed.
            Phase::Container => match phases::test_container(settings, args, &lines) {
                Ok(request) => phases::container(settings, args, &env.run_container(&request)),
                Err(skipped) => skipped,
            },
        };
        lines.push(line);
    }
    lines
}

/// `doctor`: checks, prints, and returns whether everything passed.
pub fn run(
    settings: &Settings,
    containerd: &crate::service::HostContainerd,
    args: &DoctorArgs,
    out: &mut dyn Write,
) -> Result<bool> {
    let env = HostEnv {
        containerd,
        socket: containerd.socket.clone(),
        files: HostFiles::new(settings.host_root.clone()),
    };
    let lines = check(settings, args, &env);
    print(&lines, out).map_err(crate::error::Error::io("write", "stdout"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::containerd::ContainerdVersion;
    use crate::cri::{CriError, TestContainer};
    use crate::paths::HostRoot;
    use facts::LoadedRuntimes;
    use nvinject_gpu::Inventory;
    use std::cell::RefCell;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixListener;
    use std::path::{Path, PathBuf};

    type Outcome = std::result::Result<(i32, String), ProbeError>;

    /// Services faked; files are the test node's, a temp host root.
    struct FakeEnv {
        files: HostFiles,
        inventory: Inventory,
        loaded: Vec<String>,
        // A function, so that each run gets its own answer (errors are not Clone).
        container: Box<dyn Fn() -> Outcome>,
        ran: RefCell<Vec<TestContainer>>,
        version: ContainerdVersion,
    }

    impl DoctorEnv for FakeEnv {
        fn files(&self) -> &HostFiles {
            &self.files
        }
        fn inventory(&self, _: Option<&Path>) -> std::result::Result<Inventory, ProbeError> {
            Ok(self.inventory.clone())
        }
        fn containerd_version(&self) -> std::result::Result<ContainerdVersion, ProbeError> {
            Ok(self.version.clone())
        }
        fn cri_runtimes(&self) -> std::result::Result<LoadedRuntimes, ProbeError> {
            Ok(self
                .loaded
                .iter()
                .map(|h| (h.clone(), ("io.containerd.runc.v2".into(), String::new())))
                .collect())
        }
        fn run_container(&self, request: &TestContainer) -> Outcome {
            self.ran.borrow_mut().push(request.clone());
            (self.container)()
        }
    }

    fn inventory(version: &str) -> Inventory {
        serde_json::from_value(serde_json::json!({
            "driver": {"version": version, "cuda": {"major": 12, "minor": 4}, "nvml_version": format!("12.{version}")},
            "gpus": [], "topology": []
        }))
        .unwrap()
    }

    /// A healthy node: driver loaded, spec fresh, runtime configured and loaded, plugin registered.
    struct Node {
        dir: tempfile::TempDir,
        _listeners: Vec<UnixListener>,
    }

    fn healthy_node(spec_driver: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let write = |rel: &str, text: &str| {
            let p = root.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        };
        write("sys/module/nvidia/version", "550.54.15\n");
        let digest = nvinject_cdi_gen::inventory_digest(&inventory("550.54.15"));
        write(
            "var/run/cdi/nvidia.com-gpu.json",
            &serde_json::json!({
                "cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
                "annotations": {"nvinject.io/driver-version": spec_driver, "nvinject.io/inventory-digest": digest},
                "devices": [{"name": "all", "containerEdits": {}}]
            })
            .to_string(),
        );
        write(
            "etc/containerd/config.toml",
            "version = 2\nimports = [\"/etc/containerd/conf.d/99-nvinject.toml\"]\n",
        );
        write(
            "etc/containerd/conf.d/99-nvinject.toml",
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\nruntime_type = \
             \"io.containerd.runc.v2\"\nruntime_path = \"/usr/local/nvinject/bin/containerd-shim-nvinject-v2\"\n\
             container_annotations = [\"cdi.k8s.io/*\"]\n",
        );
        write("usr/local/nvinject/bin/containerd-shim-nvinject-v2", "#!/bin/sh\n");
        // The library `settings` names: doctor locates it inside the host root before NVML.
        write("usr/lib/libnvidia-ml.so.1", "");
        fs::set_permissions(
            root.join("usr/local/nvinject/bin/containerd-shim-nvinject-v2"),
            fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        let plugins = root.join("var/lib/kubelet/device-plugins");
        fs::create_dir_all(&plugins).unwrap();
        let listeners = vec![
            UnixListener::bind(plugins.join("kubelet.sock")).unwrap(),
            UnixListener::bind(plugins.join("nvinject-gpu.sock")).unwrap(),
        ];
        write(
            "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint",
            r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-1","GPU-2"]}},"Checksum":1}"#,
        );
        Node { dir, _listeners: listeners }
    }

    fn settings(node: &Node) -> Settings {
        let mut s = Settings::defaults(HostRoot::new(node.dir.path()), PathBuf::from("/unused"));
        s.nvml_lib = Some("/usr/lib/libnvidia-ml.so.1".into());
        s
    }

    fn env(node: &Node, container: impl Fn() -> Outcome + 'static) -> FakeEnv {
        FakeEnv {
            files: HostFiles::new(HostRoot::new(node.dir.path())),
            inventory: inventory("550.54.15"),
            loaded: vec!["runc".into(), "nvidia".into()],
            container: Box::new(container),
            ran: RefCell::new(Vec::new()),
            version: ContainerdVersion::new(1, 7, 20),
        }
    }

    fn containerd_line(lines: &[Line]) -> &Line {
        lines.iter().find(|l| l.phase == "containerd").unwrap()
    }

    #[test]
    fn with_containerds_own_cdi_on_the_spec_dir_must_be_one_it_reads() {
        let node = healthy_node("550.54.15");
        let mut env = env(&node, || Ok((0, "GPU 0: x\n".into())));
        // 2.x: CDI on by default, default dirs include /var/run/cdi.
        env.version = ContainerdVersion::new(2, 1, 9);
        let lines = check(&settings(&node), &args(), &env);
        let line = containerd_line(&lines);
        assert_eq!(line.status, Status::Ok, "{line:?}");
        assert!(line.detail.contains("own CDI is on"), "{line:?}");

        let mut s = settings(&node);
        s.cdi_dir = "/opt/cdi".into();
        let lines = check(&s, &args(), &env);
        let line = containerd_line(&lines);
        assert_eq!(line.status, Status::Fail, "{line:?}");
        assert!(line.detail.contains("/opt/cdi") && line.detail.contains("its default"), "{line:?}");
        assert!(line.fix.as_deref().unwrap_or_default().contains("--cdi-dir=/etc/cdi"), "{line:?}");
        assert_eq!(lines.last().unwrap().status, Status::Skip, "the container phase waits");

        // 1.7: CDI off by default, any dir serves (the shim resolves) ...
        env.version = ContainerdVersion::new(1, 7, 20);
        assert_eq!(containerd_line(&check(&s, &args(), &env)).status, Status::Ok);
        // ... unless the config turns it on.
        fs::write(
            node.dir.path().join("etc/containerd/config.toml"),
            "version = 2\nimports = [\"/etc/containerd/conf.d/99-nvinject.toml\"]\n\
             [plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = true\ncdi_spec_dirs = [\"/etc/cdi\"]\n",
        )
        .unwrap();
        // 1.x: the drop-in's CRI section replaces the main file's; put the setting in the drop-in.
        let drop_in = node.dir.path().join("etc/containerd/conf.d/99-nvinject.toml");
        let text = fs::read_to_string(&drop_in).unwrap();
        fs::write(
            &drop_in,
            text.replace(
                "version = 2\n",
                "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = true\ncdi_spec_dirs = [\"/etc/cdi\"]\n",
            ),
        )
        .unwrap();
        let lines = check(&settings(&node), &args(), &env);
        let line = containerd_line(&lines);
        assert_eq!(line.status, Status::Fail, "{line:?}");
        assert!(line.detail.contains("99-nvinject.toml") && line.detail.contains("/var/run/cdi"), "{line:?}");
    }

    #[test]
    fn a_container_refused_by_containerds_cdi_points_at_the_spec_dirs_not_the_image() {
        let node = healthy_node("550.54.15");
        let env = env(&node, || {
            Err(ProbeError::Cri(CriError::Call {
                call: "CreateContainer",
                status: tonic::Status::unknown(
                    "CDI device injection failed: unresolvable CDI devices nvidia.com/gpu=all",
                ),
            }))
        });
        let lines = check(&settings(&node), &args(), &env);
        let line = lines.last().unwrap();
        assert_eq!((line.phase, line.status), (Phase::Container, Status::Fail), "{line:?}");
        assert!(line.detail.contains("CreateContainer: CDI device injection failed"), "{line:?}");
        let fix = line.fix.as_deref().unwrap_or_default();
        assert!(fix.contains("cdi_spec_dirs") && !fix.contains("image exists"), "{line:?}");
    }

    fn statuses(lines: &[Line]) -> Vec<(&'static str, Status)> {
        lines.iter().map(|l| (l.phase.name(), l.status)).collect()
    }

    fn args() -> DoctorArgs {
        DoctorArgs { test_image: Some("busybox".into()), ..DoctorArgs::default() }
    }

    #[test]
    fn a_healthy_node_passes_every_phase() {
        let node = healthy_node("550.54.15");
        let env = env(&node, || Ok((0, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n".into())));
        let lines = check(&settings(&node), &args(), &env);
        assert_eq!(
            statuses(&lines),
            vec![
                ("driver", Status::Ok),
                ("cdi", Status::Ok),
                ("containerd", Status::Ok),
                ("device-plugin", Status::Ok),
                ("container", Status::Ok)
            ],
            "{lines:#?}"
        );
        let ran = env.ran.borrow();
        assert_eq!(ran[0].handler, "nvidia");
        assert_eq!(ran[0].annotations["cdi.k8s.io/nvinject-doctor"], "nvidia.com/gpu=all");
        assert!(lines[4].detail.contains("GPU 0: NVIDIA H100"));
        let mut out = Vec::new();
        assert!(print(&lines, &mut out).unwrap());
        assert!(String::from_utf8(out).unwrap().starts_with("OK   driver"));
    }

    #[test]
    fn a_stale_spec_fails_with_the_fix_and_the_container_phase_waits() {
        let node = healthy_node("535.104.05");
        let env = env(&node, || Ok((0, String::new())));
        let lines = check(&settings(&node), &args(), &env);
        let cdi = &lines[1];
        assert_eq!(cdi.status, Status::Fail);
        assert!(cdi.detail.contains("535.104.05") && cdi.detail.contains("550.54.15"), "{}", cdi.detail);
        assert!(cdi.fix.as_deref().unwrap().contains("nvinject-installer install"));
        assert_eq!(lines[4].status, Status::Skip);
        assert!(env.ran.borrow().is_empty(), "ran a container although an earlier phase failed");
        let mut out = Vec::new();
        assert!(!print(&lines, &mut out).unwrap());
    }

    #[test]
    fn a_spec_the_shim_would_not_trust_fails_with_the_fix() {
        let node = healthy_node("550.54.15");
        let root = node.dir.path();
        let cdi_line =
            || check(&settings(&node), &args(), &env(&node, || Ok((0, "GPU 0".into()))))[1].clone();
        // Whatever the umask: the layout the installer makes.
        for (rel, mode) in [("var/run/cdi", 0o755), ("var/run", 0o755), ("var", 0o755)] {
            fs::set_permissions(root.join(rel), fs::Permissions::from_mode(mode)).unwrap();
        }
        let spec = root.join("var/run/cdi/nvidia.com-gpu.json");
        fs::set_permissions(&spec, fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(cdi_line().status, Status::Ok, "control: {:?}", cdi_line());

        fs::set_permissions(&spec, fs::Permissions::from_mode(0o666)).unwrap();
        let line = cdi_line();
        assert_eq!(line.status, Status::Fail);
        assert!(
            line.detail.contains("untrusted CDI spec /var/run/cdi/nvidia.com-gpu.json")
                && line.detail.contains("0666"),
            "{line:?}"
        );
        assert_eq!(line.fix.as_deref(), Some("chmod go-w /var/run/cdi/nvidia.com-gpu.json"));

        fs::set_permissions(&spec, fs::Permissions::from_mode(0o644)).unwrap();
        fs::set_permissions(root.join("var/run/cdi"), fs::Permissions::from_mode(0o1777)).unwrap();
        let line = cdi_line();
        assert_eq!(line.status, Status::Fail);
        assert!(line.detail.contains("its folder /var/run/cdi") && line.detail.contains("1777"), "{line:?}");
        assert_eq!(line.fix.as_deref(), Some("chmod go-w /var/run/cdi"));
        // Sticky above the spec folder is allowed (as /tmp).
        fs::set_permissions(root.join("var/run/cdi"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(root.join("var/run"), fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(cdi_line().status, Status::Ok, "{:?}", cdi_line());
        fs::set_permissions(root.join("var"), fs::Permissions::from_mode(0o777)).unwrap();
        let line = cdi_line();
        assert!(line.detail.contains("the folder above it /var ") && line.status == Status::Fail, "{line:?}");
    }

    #[test]
    fn a_runtime_containerd_has_not_loaded_asks_for_a_restart() {
        let node = healthy_node("550.54.15");
        let mut env = env(&node, || Ok((0, String::new())));
        env.loaded = vec!["runc".into()];
        let lines = check(&settings(&node), &args(), &env);
        assert_eq!(lines[2].status, Status::Fail);
        assert!(lines[2].fix.as_deref().unwrap().contains("restart containerd"), "{:?}", lines[2]);
    }

    #[test]
    fn pod_annotations_on_the_runtime_fail() {
        let node = healthy_node("550.54.15");
        let drop_in = node.dir.path().join("etc/containerd/conf.d/99-nvinject.toml");
        let text = fs::read_to_string(&drop_in).unwrap() + "pod_annotations = [\"cdi.k8s.io/*\"]\n";
        fs::write(&drop_in, text).unwrap();
        let lines = check(&settings(&node), &args(), &env(&node, || Ok((0, String::new()))));
        assert_eq!(lines[2].status, Status::Fail);
        assert!(lines[2].detail.contains("pod annotations"), "{:?}", lines[2]);
    }

    #[test]
    fn no_driver_fails_first_and_names_the_file() {
        let node = healthy_node("550.54.15");
        fs::remove_file(node.dir.path().join("sys/module/nvidia/version")).unwrap();
        let lines = check(&settings(&node), &args(), &env(&node, || Ok((0, String::new()))));
        assert_eq!(lines[0].status, Status::Fail);
        assert!(lines[0].detail.contains("/sys/module/nvidia/version"), "{:?}", lines[0]);
        assert_eq!(lines[4].status, Status::Skip);
    }

    #[test]
    fn a_container_without_a_gpu_fails_with_its_output() {
        let node = healthy_node("550.54.15");
        let env = env(&node, || {
            Ok((9, "NVIDIA-SMI has failed because it couldn't communicate with the driver\n".into()))
        });
        let lines = check(&settings(&node), &args(), &env);
        assert_eq!(lines[4].status, Status::Fail);
        assert!(lines[4].detail.contains("exited 9") && lines[4].detail.contains("couldn't communicate"));
    }

    #[test]
    fn a_missing_kubelet_fails_the_plugin_phase_only() {
        let node = healthy_node("550.54.15");
        let mut a = args();
        a.device_plugin_dir = "/nowhere".into();
        let lines = check(&settings(&node), &a, &env(&node, || Ok((0, "GPU 0".into()))));
        assert_eq!(lines[3].status, Status::Fail);
        assert_eq!(lines[4].status, Status::Ok, "the container phase does not need the kubelet");
    }
}
