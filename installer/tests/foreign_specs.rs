//! A node moving from NVIDIA's toolkit with NVIDIA's spec still beside ours: install warns (the
//! file, the devices that clash, the fix) and succeeds; `doctor` fails its cdi phase with the fix
//! and passes once the file is gone or moved to a directory read before ours. Hostile files in the
//! spec directory (links out of the host root, a FIFO, a file over the size limit, a file that is
//! not a spec) are reported as not checked and neither fail nor hang install or doctor.
//!
//! On a temporary host root: install through the library with a fake containerd and a fixed spec
//! (cdi-gen's h100x8 golden, as JSON); doctor through the binary, for its exit status. NVIDIA's
//! spec is nvidia-ctk 1.20's recording for the same node.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{FakeContainerd, write_binaries};
use nvinject_cdi::Format;
use nvinject_installer::fsx::FaultHook;
use nvinject_installer::install::{InstallReport, Installer, Settings, SpecGenerator, SpecRequest};
use nvinject_installer::paths::{FILE_LIMIT, HostRoot};
use nvinject_installer::runtime_config::ShimConfig;

const BIN: &str = env!("CARGO_BIN_EXE_nvinject-installer");

/// The longest install or doctor may take here; far beyond what either needs, so only a hang
/// (a blocking open of a FIFO, an endless read) reaches it.
const HANG: Duration = Duration::from_secs(120);

const DEBIAN_CONFIG: &str = "version = 2\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    \
                             [plugins.\"io.containerd.grpc.v1.cri\".cni]\n      bin_dir = \"/usr/lib/cni\"\n";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// nvinject's spec for the simulated h100x8 node (cdi-gen's golden), as the installer writes it.
fn our_spec() -> Vec<u8> {
    let path = repo("cdi-gen/tests/golden/h100x8.yaml");
    let spec = nvinject_cdi::codec::parse(&fs::read(&path).unwrap(), Format::Yaml, &path).unwrap();
    nvinject_cdi::codec::to_string(&spec, Format::Json).into_bytes()
}

/// nvidia-ctk 1.20's spec for the same node, its roots the host's `/`.
fn nvidia_spec() -> String {
    let text = fs::read_to_string(repo("cdi/tests/golden/nvidia-ctk-1.20.0/h100x8.json")).unwrap();
    text.replace("@DRIVER_ROOT@", "").replace("@DEV_ROOT@", "")
}

/// The device names of NVIDIA's spec, qualified.
fn nvidia_devices() -> Vec<String> {
    let spec: serde_json::Value = serde_json::from_str(&nvidia_spec()).unwrap();
    let mut names: Vec<String> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| format!("nvidia.com/gpu={}", d["name"].as_str().unwrap()))
        .collect();
    names.sort();
    names
}

struct FixedSpec(Vec<u8>);

impl SpecGenerator for FixedSpec {
    fn generate(&self, _: &SpecRequest) -> nvinject_installer::Result<Vec<u8>> {
        Ok(self.0.clone())
    }
}

/// A temporary host (`host/`), the installer image's binaries (`src/`), and beside them a tree the
/// installer must never read (`outside/`).
struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new(containerd_config: &str) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("host");
        for d in ["etc/containerd/conf.d", "run", "usr/local/bin", "var/lib", "var/run/cdi", "etc/cdi"] {
            fs::create_dir_all(host.join(d)).unwrap();
        }
        fs::write(host.join("etc/containerd/config.toml"), containerd_config).unwrap();
        fs::create_dir_all(dir.path().join("src")).unwrap();
        write_binaries(&dir.path().join("src"), |name| format!("#!/bin/sh\n# {name}\n").into_bytes());
        fs::create_dir_all(dir.path().join("outside")).unwrap();
        Host { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("host")
    }

    fn path(&self, host_path: &str) -> PathBuf {
        self.root().join(host_path.trim_start_matches('/'))
    }

    fn outside(&self) -> PathBuf {
        self.dir.path().join("outside")
    }

    fn settings(&self) -> Settings {
        let mut s = Settings::defaults(HostRoot::new(self.root()), self.dir.path().join("src"));
        s.lock_wait = Duration::from_millis(300);
        s
    }

    /// Installs in another thread, so that a hang fails the test instead of stalling it.
    fn install(&self, containerd: &str) -> InstallReport {
        let (settings, containerd) = (self.settings(), containerd.to_owned());
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let (containerd, spec, hook) =
                (FakeContainerd::new(&containerd), FixedSpec(our_spec()), FaultHook::none());
            let installer = Installer {
                settings,
                containerd: &containerd,
                spec: Some(&spec),
                runtime_config: &ShimConfig,
                hook: &hook,
            };
            let _ = tx.send(installer.install().map_err(|e| e.to_string()));
        });
        rx.recv_timeout(HANG).expect("install hung").unwrap_or_else(|e| panic!("install failed: {e}"))
    }

    /// `nvinject-installer doctor` with only its cdi phase, killed if it hangs.
    fn doctor(&self, containerd: &str) -> Output {
        let mut child = Command::new(BIN)
            .args([
                "doctor",
                "--skip",
                "driver,containerd,device-plugin,container",
                "--containerd-version",
                containerd,
            ])
            .arg("--host-root")
            .arg(self.root())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > HANG {
                let _ = child.kill();
                panic!("doctor hung");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        child.wait_with_output().unwrap()
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn nvidias_spec_beside_ours_is_a_warning_for_install_and_a_failure_for_doctor() {
    let host = Host::new(DEBIAN_CONFIG);
    fs::write(host.path("/var/run/cdi/nvidia.yaml"), nvidia_spec()).unwrap();
    let report = host.install("1.7.20");
    assert!(host.path("/var/run/cdi/nvidia.com-gpu.json").is_file(), "install went on and wrote our spec");

    // One warning, naming the file, the devices both define, what that does, and the fix.
    let clashes: Vec<&String> = report.warnings.iter().filter(|w| w.contains("nvidia.yaml")).collect();
    assert_eq!(clashes.len(), 1, "{:#?}", report.warnings);
    let devices = nvidia_devices();
    assert!(devices.len() > 8, "{devices:?}");
    let warning = clashes[0];
    for needle in [
        format!(
            "/var/run/cdi/nvidia.yaml defines {} and {} more, ",
            devices[..8].join(", "),
            devices.len() - 8
        ),
        "nvinject's spec /var/run/cdi/nvidia.com-gpu.json defines too, in the same directory".to_owned(),
        "CDI resolves none of them".to_owned(),
        "fix: delete /var/run/cdi/nvidia.yaml".to_owned(),
        "systemctl disable --now nvidia-cdi-refresh.path nvidia-cdi-refresh.service".to_owned(),
    ] {
        assert!(warning.contains(&needle), "`{needle}` missing from: {warning}");
    }

    let out = host.doctor("1.7.20");
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("FAIL cdi") && text.contains("/var/run/cdi/nvidia.yaml defines nvidia.com/gpu=0"),
        "{text}"
    );
    assert!(text.contains("fix: delete /var/run/cdi/nvidia.yaml and turn off what writes it"), "{text}");

    // Kept in /etc/cdi, read before /var/run/cdi, it is harmless: ours wins.
    fs::rename(host.path("/var/run/cdi/nvidia.yaml"), host.path("/etc/cdi/nvidia.yaml")).unwrap();
    let out = host.doctor("1.7.20");
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).contains("OK   cdi"), "{}", stdout(&out));
    let report = host.install("1.7.20");
    assert!(!report.warnings.iter().any(|w| w.contains("nvidia.yaml")), "{:#?}", report.warnings);
}

/// containerd 2.x's own CDI reads its `cdi_spec_dirs` in order: one that lists `/etc/cdi` after
/// `/var/run/cdi` hands NVIDIA's definitions out instead of ours.
#[test]
fn a_spec_in_a_directory_containerd_reads_after_ours_takes_our_devices_over() {
    let config = DEBIAN_CONFIG.replace(
        "[plugins.\"io.containerd.grpc.v1.cri\"]\n",
        "[plugins.\"io.containerd.grpc.v1.cri\"]\n    cdi_spec_dirs = [\"/var/run/cdi\", \"/etc/cdi\"]\n",
    );
    assert!(config.contains("cdi_spec_dirs"));
    let host = Host::new(&config);
    fs::write(host.path("/etc/cdi/nvidia.yaml"), nvidia_spec()).unwrap();
    let report = host.install("2.1.0");
    let clashes: Vec<&String> = report.warnings.iter().filter(|w| w.contains("nvidia.yaml")).collect();
    assert_eq!(clashes.len(), 1, "{:#?}", report.warnings);
    assert!(
        clashes[0].contains("/etc/cdi/nvidia.yaml defines nvidia.com/gpu=0")
            && clashes[0].contains("in a directory containerd's CDI reads after nvinject's")
            && clashes[0].contains("come from /etc/cdi/nvidia.yaml instead of nvinject's spec"),
        "{}",
        clashes[0]
    );
    let out = host.doctor("2.1.0");
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("containerd's CDI reads after nvinject's"), "{}", stdout(&out));
    // containerd 1.7 leaves CDI to our shim, which reads /var/run/cdi last: no clash.
    assert_eq!(host.doctor("1.7.20").status.code(), Some(0));
}

#[test]
fn hostile_files_in_the_spec_dir_are_reported_and_skipped_without_hanging() {
    let host = Host::new(DEBIAN_CONFIG);
    // A clashing spec outside the host root: reaching it would show as a clash.
    let outside = host.outside().join("nvidia.json");
    fs::write(&outside, nvidia_spec()).unwrap();
    let cdi = host.path("/var/run/cdi");
    std::os::unix::fs::symlink(&outside, cdi.join("absolute.json")).unwrap();
    std::os::unix::fs::symlink("../../../../outside/nvidia.json", cdi.join("dotdot.json")).unwrap();
    std::os::unix::fs::symlink(
        Path::new("/proc/self/root").join(outside.strip_prefix("/").unwrap()),
        cdi.join("magic.json"),
    )
    .unwrap();
    let status = Command::new("mkfifo").arg(cdi.join("fifo.yaml")).status().unwrap();
    assert!(status.success());
    // Sparse: over the limit without taking the space.
    fs::File::create(cdi.join("huge.json")).unwrap().set_len(FILE_LIMIT + 1).unwrap();
    fs::write(cdi.join("broken.yaml"), "kind: nvidia.com/gpu\ndevices: [\n").unwrap();

    let report = host.install("1.7.20");
    assert!(
        !report.warnings.iter().any(|w| w.contains(" defines ")),
        "read outside the root: {:#?}",
        report.warnings
    );
    for (name, why) in [
        ("absolute.json", "link to nothing inside the host root"),
        ("dotdot.json", "link to nothing inside the host root"),
        ("magic.json", "link to nothing inside the host root"),
        ("fifo.yaml", "FIFO"),
        ("huge.json", "limit"),
        ("broken.yaml", "not a valid CDI spec"),
    ] {
        let prefix =
            format!("/var/run/cdi/{name}: not checked for CDI devices that clash with nvinject's spec: ");
        let warning = report.warnings.iter().find(|w| w.starts_with(&prefix));
        assert!(warning.is_some_and(|w| w.contains(why)), "{name} ({why}): {:#?}", report.warnings);
    }

    let out = host.doctor("1.7.20");
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("OK   cdi")
            && text.contains("not checked for clashing devices: /var/run/cdi/fifo.yaml"),
        "{text}"
    );
}
