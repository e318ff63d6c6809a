//! The installer against a real containerd (issue 6; Debian 12's 1.6 by default, the build
//! `NVINJECT_CONTAINERD` / `NVINJECT_CONTAINERD_CDI` select otherwise, issue 13): install into a temporary tree on this
//! host, with a Debian-style containerd config, while that containerd runs under a supervisor (as
//! systemd would run it); the installer restarts it by signal, a pod with handler `nvidia` gets a
//! GPU of the simulated node through CRI, `doctor` passes, a second install changes nothing and
//! restarts nothing, and uninstall restores the config byte for byte and the handler is gone.
//!
//! Only private paths are used (config, sockets, state, install dir, CDI dir all under one temp
//! directory); the host's /etc/containerd is never read or written. Needs root, Debian's
//! containerd and runc. Run by hand: `cargo test -p nvinject-integration --test installer -- --nocapture`.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nvinject_node_harness::containerd::{ContainerdBuild, ctr_command, remove_all_containers};
use nvinject_node_harness::cri::{ContainerRequest, CriClient};
use nvinject_node_harness::node::{PROBE_IMAGE, PROBE_PATH, parse_report, probe_image, report_devices};
use nvinject_node_harness::{mounts, namespace, process};
use nvinject_simnode::artifacts::{artifact, simnode_bin, static_hook, static_shim};
use serde_json::Value;

/// containerd under a supervisor that starts it again whenever it exits, like systemd's
/// `Restart=always`: the installer's `signal` restart mode relies on that.
struct Supervised {
    stop: Arc<AtomicBool>,
    pid: Arc<AtomicI32>,
    starts: Arc<AtomicU32>,
    child: Arc<Mutex<Option<Child>>>,
    thread: Option<JoinHandle<()>>,
    socket: PathBuf,
    base: PathBuf,
}

impl Supervised {
    fn start(
        config: &Path,
        base: &Path,
        socket: &Path,
        path_prepend: &Path,
        nvinject_config: &Path,
    ) -> Supervised {
        let stop = Arc::new(AtomicBool::new(false));
        let pid = Arc::new(AtomicI32::new(0));
        let starts = Arc::new(AtomicU32::new(0));
        let child: Arc<Mutex<Option<Child>>> = Arc::new(Mutex::new(None));
        let build = ContainerdBuild::selected().unwrap_or_else(|e| panic!("{e}"));
        // The build's own directory after the shim links: its containerd-shim-runc-v2.
        let path = build.path_env(&[path_prepend.to_owned()]).unwrap();
        let containerd = build.containerd();
        let (config, log) = (config.to_owned(), base.join("containerd.log"));
        let nvinject_config = nvinject_config.to_owned();
        let thread = {
            let (stop, pid, starts, child) = (stop.clone(), pid.clone(), starts.clone(), child.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let log_file = fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
                    let mut service = Command::new(&containerd);
                    // Signals at their defaults, as systemd starts a unit (see `as_node_service`).
                    nvinject_node_harness::process::as_node_service(&mut service);
                    let spawned = service
                        .arg("--config")
                        .arg(&config)
                        .env("PATH", &path)
                        .env("NVINJECT_CONFIG", &nvinject_config)
                        .stdin(Stdio::null())
                        .stdout(log_file.try_clone().unwrap())
                        .stderr(log_file)
                        .spawn()
                        .expect("start containerd");
                    pid.store(spawned.id() as i32, Ordering::SeqCst);
                    starts.fetch_add(1, Ordering::SeqCst);
                    *child.lock().unwrap() = Some(spawned);
                    // Poll so `stop` can take the child away while we wait.
                    loop {
                        let mut guard = child.lock().unwrap();
                        match guard.as_mut().map(|c| c.try_wait()) {
                            Some(Ok(Some(_))) | None => {
                                *guard = None;
                                break;
                            }
                            _ => {}
                        }
                        drop(guard);
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        };
        let me = Supervised {
            stop,
            pid,
            starts,
            child,
            thread: Some(thread),
            socket: socket.to_owned(),
            base: base.to_owned(),
        };
        me.wait_answering();
        me
    }

    fn wait_answering(&self) {
        let socket = self.socket.clone();
        process::wait_for("containerd to answer", Duration::from_secs(60), || {
            let out = ctr_command(&socket, "default").arg("version").output().ok()?;
            out.status.success().then_some(())
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", self.log_tail()));
    }

    fn pid(&self) -> i32 {
        self.pid.load(Ordering::SeqCst)
    }

    fn starts(&self) -> u32 {
        self.starts.load(Ordering::SeqCst)
    }

    fn log_tail(&self) -> String {
        process::log_tail(&self.base.join("containerd.log"), 30)
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Remove what CRI left, then containerd (by the PID we started), then its shims (their
        // command lines name our socket), then mounts under our directory.
        remove_all_containers(&self.socket, &["k8s.io"]);
        // The supervisor may have started containerd again just before it saw `stop`: keep taking
        // whatever child it holds until the thread is done, then join it.
        if let Some(t) = self.thread.take() {
            while !t.is_finished() {
                let child = self.child.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(mut child) = child {
                    process::stop_pid(child.id() as i32, Duration::from_secs(10));
                    let _ = child.wait();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = t.join();
        }
        // runc shims name our socket on their command line; nvinject proxies name a bundle under
        // our state directory.
        let mut shims = process::find_processes(&self.socket.to_string_lossy());
        shims.extend(process::find_processes(&self.base.to_string_lossy()));
        for shim in shims {
            process::stop_pid(shim.pid, Duration::from_secs(2));
        }
        mounts::unmount_under(&self.base);
    }
}

fn containerd_config(build: &ContainerdBuild, t: &Path) -> String {
    let p = |rel: &str| serde_json::to_string(&t.join(rel).to_string_lossy()).unwrap();
    let pause = serde_json::to_string(PROBE_IMAGE).unwrap();
    let head = format!(
        "version = {}\nroot = {}\nstate = {}\n{}\n[grpc]\n  address = {}\n\n[plugins]\n  \
         [plugins.\"io.containerd.internal.v1.opt\"]\n    path = {}\n",
        build.config_version(),
        p("containerd/root"),
        p("containerd/state"),
        build.top_level_config(true),
        p("containerd/containerd.sock"),
        p("containerd/opt"),
    );
    if build.version == (1, 6) {
        // Debian 12's /etc/containerd/config.toml (version 2, CRI with CNI paths, opt plugin), with
        // this test's private directories, socket and pause image.
        return format!(
            "{head}  [plugins.\"io.containerd.grpc.v1.cri\"]\n    sandbox_image = {pause}\n    restrict_oom_score_adj = true\n    \
             disable_apparmor = true\n    [plugins.\"io.containerd.grpc.v1.cri\".cni]\n      bin_dir = {cni_bin}\n      \
             conf_dir = {cni_conf}\n",
            cni_bin = p("containerd/cni-bin"),
            cni_conf = p("containerd/cni-conf"),
        );
    }
    // Newer versions: their own schema, and with containerd's CDI on, the spec dir the install
    // writes is the one it reads.
    format!(
        "{head}{}",
        build.cri_config(
            PROBE_IMAGE,
            &p("containerd/cni-bin"),
            &p("containerd/cni-conf"),
            &[],
            &[t.join("var/run/cdi")]
        )
    )
}

fn run_installer(installer: &Path, command: &str, args: &[String]) -> Output {
    let out = Command::new(installer).arg(command).args(args).output().unwrap();
    println!(
        "$ nvinject-installer {command}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// One GPU pod through CRI with handler `nvidia`; returns the probe's report.
fn gpu_pod(
    cri: &mut CriClient,
    t: &Path,
    cgroup_parent: &str,
    uuid: &str,
    name: &str,
) -> Result<Value, String> {
    let pod = cri
        .run_pod(name, "nvidia", &t.join("pod-logs"), cgroup_parent, HashMap::new())
        .map_err(|e| e.to_string())?;
    let request = ContainerRequest {
        name: "probe".into(),
        image: PROBE_IMAGE.into(),
        command: vec![PROBE_PATH.into(), "report".into()],
        annotations: HashMap::from([(
            "cdi.k8s.io/nvinject-device-plugin_test".to_owned(),
            format!("nvidia.com/gpu={uuid}"),
        )]),
        ..Default::default()
    };
    let result = (|| {
        let id = cri.create_container(&pod, &request).map_err(|e| e.to_string())?;
        cri.start_container(&id).map_err(|e| e.to_string())?;
        let code = cri.wait_exited(&id, Duration::from_secs(60)).map_err(|e| e.to_string())?;
        let logs = cri.logs(&pod, "probe");
        if code != 0 {
            return Err(format!("probe exited {code}: {logs}"));
        }
        parse_report(&logs).ok_or(format!("no probe report in {logs}"))
    })();
    let _ = cri.remove_pod(&pod);
    result
}

#[test]
#[ignore = "needs root"]
fn installer_makes_a_real_containerd_gpu_ready_and_uninstall_restores_it() {
    nvinject_test_support::require_root("containerd and runc");
    process::ensure_root().unwrap_or_else(|e| panic!("{e}"));
    let build = ContainerdBuild::selected().unwrap_or_else(|e| panic!("{e}"));
    println!("installer integration on {}", build.label());
    let dir = tempfile::Builder::new().prefix("nvinject-inst-").tempdir().unwrap();
    let t = dir.path();
    let cgroup_parent = format!("/nvinject-inst-{}", std::process::id());
    // Declared before containerd's supervisor, so dropped after it: on a failed assertion too.
    let _cgroups = CgroupCleanup(cgroup_parent.clone());

    // The simulated node, the binaries the installer image would carry, the pod image.
    let out = Command::new(simnode_bin("nvinject-simnode"))
        .args(["build", "--preset", "h100x8", "--out"])
        .arg(t.join("node"))
        .output()
        .unwrap();
    assert!(out.status.success(), "simnode: {}", String::from_utf8_lossy(&out.stderr));
    let description: Value = serde_json::from_slice(&fs::read(t.join("node/node.json")).unwrap()).unwrap();
    let uuid = description["gpus"][1]["uuid"].as_str().unwrap().to_owned();
    // The installer image's binaries, copied once: a rebuild in the shared target directory during
    // the test must not look like a new release to the second install.
    let image_bin = t.join("image-bin");
    fs::create_dir_all(&image_bin).unwrap();
    for (from, file) in [
        (artifact("nvinject-installer", "nvinject-installer"), "nvinject-installer"),
        (static_shim(), "containerd-shim-nvinject-v2"),
        (static_hook(), "nvinject-hook"),
        (artifact("nvinject-cdi-gen", "nvinject-cdi"), "nvinject-cdi"),
    ] {
        fs::copy(from, image_bin.join(file)).unwrap();
    }
    let installer = image_bin.join("nvinject-installer");
    let image = probe_image(&t.join("probe.tar")).unwrap();

    let config_path = t.join("etc/containerd/config.toml");
    fs::create_dir_all(config_path.parent().unwrap()).unwrap();
    for d in ["containerd/cni-bin", "containerd/cni-conf", "usr/local/bin", "run", "var/lib"] {
        fs::create_dir_all(t.join(d)).unwrap();
    }
    let original = containerd_config(build, t);
    fs::write(&config_path, &original).unwrap();
    let socket = t.join("containerd/containerd.sock");
    let supervised = Supervised::start(
        &config_path,
        &t.join("containerd"),
        &socket,
        &t.join("usr/local/bin"),
        &t.join("etc/nvinject/config.toml"),
    );
    process::run(ctr_command(&socket, "k8s.io").args(["images", "import"]).arg(&image.tar)).unwrap();
    let mut cri = CriClient::connect(&socket).unwrap();

    // Before: containerd has no `nvidia` handler.
    let before = gpu_pod(&mut cri, t, &cgroup_parent, &uuid, "before").unwrap_err();
    assert!(before.contains("nvidia"), "unexpected failure before install: {before}");

    let p = |rel: &str| t.join(rel).to_string_lossy().into_owned();
    let args = vec![
        "--host-root=/".to_owned(),
        format!("--source-dir={}", image_bin.display()),
        format!("--install-dir={}", p("usr/local/nvinject")),
        format!("--containerd-config={}", p("etc/containerd/config.toml")),
        format!("--containerd-socket={}", socket.display()),
        "--restart-mode=signal".into(),
        format!("--driver-root={}", p("node/driver")),
        format!("--dev-root={}", p("node/host")),
        format!("--proc-root={}", p("node/host/proc")),
        format!("--sys-root={}", p("node/host/sys")),
        format!("--cdi-dir={}", p("var/run/cdi")),
        format!("--runtime-config={}", p("etc/nvinject/config.toml")),
        format!("--shim-link-dir={}", p("usr/local/bin")),
        format!("--state-dir={}", p("var/lib/nvinject/installer")),
        format!("--lock-file={}", p("run/nvinject-installer.lock")),
    ];

    // Install: the version is detected over its socket (1.6.20 ignores `runtime_path`, so our
    // runtime type; 1.7 and 2.x take runc's type with `runtime_path`), the config changes (2.x: a
    // `version = 3` drop-in), containerd is restarted by SIGHUP through its supervisor and answers
    // again.
    let pid_before = supervised.pid();
    let out = run_installer(&installer, "install", &args);
    assert!(
        out.status.success(),
        "install failed\nstdout: {}\nstderr: {}\ncontainerd: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        supervised.log_tail()
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let (major, minor) = build.version;
    let mode = if build.version == (1, 6) { "ShimType" } else { "RuntimePath" };
    assert!(stdout.contains(&format!("containerd {major}.{minor}.")) && stdout.contains(mode), "{stdout}");
    assert!(stdout.contains("containerd restarted and answering"), "{stdout}");
    assert_ne!(supervised.pid(), pid_before, "containerd was not restarted");
    assert_eq!(supervised.starts(), 2);
    let drop_in = t.join("etc/containerd/conf.d/99-nvinject.toml");
    assert!(fs::read_to_string(&config_path).unwrap().contains(&drop_in.to_string_lossy().into_owned()));
    if build.is_v2() {
        let text = fs::read_to_string(&drop_in).unwrap();
        assert!(text.contains("version = 3") && text.contains("io.containerd.cri.v1.runtime"), "{text}");
    }

    // A pod with handler `nvidia` asking for GPU 1 by CDI annotation sees exactly that GPU.
    let mut cri = CriClient::connect(&socket).unwrap();
    let report = gpu_pod(&mut cri, t, &cgroup_parent, &uuid, "gpu")
        .unwrap_or_else(|e| panic!("{e}\n{}", supervised.log_tail()));
    let devices = report_devices(&report);
    let gpus: Vec<&String> = devices
        .keys()
        .filter(|p| p.strip_prefix("/dev/nvidia").is_some_and(|n| n.parse::<u32>().is_ok()))
        .collect();
    assert_eq!(gpus, ["/dev/nvidia1"], "{devices:?}");
    assert_eq!(report["nvml"]["count"], 1, "{}", report["nvml"]);
    assert_eq!(report["nvml"]["uuids"][0], Value::String(uuid.clone()), "{}", report["nvml"]);
    let smi = report["nvidia_smi"]["lines"].as_array().cloned().unwrap_or_default();
    assert!(smi.len() == 1 && smi[0].as_str().unwrap().contains(&uuid), "{smi:?}");

    // doctor: every phase but the kubelet's passes, the last one by running a GPU pod itself.
    let mut doctor_args = args.clone();
    doctor_args.extend([format!("--test-image={PROBE_IMAGE}"), "--skip=device-plugin".into()]);
    let out = run_installer(&installer, "doctor", &doctor_args);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "doctor failed:\n{report}");
    for phase in ["driver", "cdi", "containerd", "container"] {
        assert!(
            report.lines().any(|l| l.starts_with("OK") && l.contains(phase)),
            "{phase} not OK:\n{report}"
        );
    }

    // With containerd's own CDI on, a spec dir it does not read is caught by doctor, pointing at
    // cdi_spec_dirs (not at the image).
    if build.cdi {
        let mut wrong = doctor_args.clone();
        for a in wrong.iter_mut().filter(|a| a.starts_with("--cdi-dir=")) {
            *a = format!("--cdi-dir={}", p("opt/cdi"));
        }
        let out = run_installer(&installer, "doctor", &wrong);
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "doctor passed with a dir containerd does not read:\n{report}");
        assert!(
            report
                .lines()
                .any(|l| l.starts_with("FAIL") && l.contains("containerd") && l.contains("cdi_spec_dirs")),
            "{report}"
        );
    }

    // A second install changes nothing and restarts nothing.
    let pid_installed = supervised.pid();
    let out = run_installer(&installer, "install", &args);
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("nothing changed") && stdout.contains("not restarted"), "{stdout}");
    assert_eq!(supervised.pid(), pid_installed);
    assert_eq!(supervised.starts(), 2);

    // An earlier shim kept its regeneration lock beside the spec: uninstall takes it with the spec,
    // so the CDI directories the install created go too.
    fs::write(t.join("var/run/cdi/nvidia.com-gpu.json.lock"), "").unwrap();
    // Uninstall: the config is restored byte for byte, our files are gone, containerd restarted.
    let out = run_installer(&installer, "uninstall", &args);
    assert!(out.status.success(), "uninstall failed\n{}", supervised.log_tail());
    assert_eq!(fs::read_to_string(&config_path).unwrap(), original, "config not restored byte for byte");
    assert!(!t.join("etc/containerd/conf.d").exists(), "the drop-in directory the install created is left");
    for gone in [
        "usr/local/nvinject",
        "usr/local/bin/containerd-shim-nvinject-v2",
        "var/run/cdi",
        "var/run",
        "etc/nvinject",
        "var/lib/nvinject",
        "node/host/dev/char",
    ] {
        assert!(fs::symlink_metadata(t.join(gone)).is_err(), "{gone} is left after uninstall");
    }
    assert_eq!(supervised.starts(), 3, "containerd was not restarted by uninstall");
    supervised.wait_answering();
    let mut cri = CriClient::connect(&socket).unwrap();
    let after = gpu_pod(&mut cri, t, &cgroup_parent, &uuid, "after").unwrap_err();
    assert!(after.contains("nvidia"), "the nvidia handler still works after uninstall: {after}");

    drop(cri);
    drop(supervised);
    assert!(mounts::mounts_under(t).is_empty(), "mounts left under {}", t.display());
}

/// Removes the pods' cgroup parent (empty once containerd and the shims are gone) when dropped.
struct CgroupCleanup(String);

impl Drop for CgroupCleanup {
    fn drop(&mut self) {
        namespace::remove_cgroup_tree(&self.0);
    }
}
