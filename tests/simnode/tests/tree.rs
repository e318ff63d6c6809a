//! Every preset built by the real binary, checked file by file: libraries and their SONAMEs in
//! `ld.so.cache`, device nodes (type, major, minor, mode) against the simulated `proc/devices` and
//! `mig-minors`, proc/sys files, sockets, the env file; determinism; `--force`.
//! Needs root (mknod, `ldconfig -r`).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{build_preset, host, run_build, stub_nvml, text};
use nvinject_simnode::NodeDescription;
use nvinject_simnode::build::devices::parse_char_majors;
use nvinject_simnode::build::driver::{BINARIES, IMEX_BINARIES, LIBRARIES, SonameKind};
use nvinject_simnode::{elf, embed, presets};

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Asserts that `path` is a character device `major:minor` with permission bits `mode`.
fn assert_char(path: &Path, major: u32, minor: u32, mode: u32) {
    let meta = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(meta.file_type().is_char_device(), "{} is not a character device", path.display());
    let rdev = meta.rdev();
    let got = (nix::sys::stat::major(rdev) as u32, nix::sys::stat::minor(rdev) as u32, meta.mode() & 0o7777);
    assert_eq!(got, (major, minor, mode), "{}: (major, minor, mode)", path.display());
}

/// `mig-minors` as name -> minor.
fn mig_minors(proc_root: &Path) -> BTreeMap<String, u32> {
    read(&proc_root.join("driver/nvidia-caps/mig-minors"))
        .lines()
        .map(|l| {
            let (name, minor) = l.split_once(' ').unwrap_or_else(|| panic!("bad mig-minors line `{l}`"));
            (name.to_owned(), minor.parse().unwrap())
        })
        .collect()
}

fn check_tree(preset: &str, nvml: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(preset);
    build_preset(preset, &out, nvml);
    let expected = presets::preset(preset).unwrap();
    let version = &expected.driver.version;
    let (driver, dev, proc_root, sys) =
        (out.join("driver"), out.join("host"), out.join("host/proc"), out.join("host/sys"));

    // node.json: the preset, with its paths filled in.
    let node = NodeDescription::load(&out.join("node.json")).unwrap();
    assert_eq!(node.gpus, expected.gpus, "{preset}");
    assert_eq!(node.dev_root.as_deref(), Some(dev.as_path()));
    assert_eq!(node.events_file.as_deref(), Some(out.join("xid-events").as_path()));
    assert_eq!(std::fs::metadata(out.join("xid-events")).unwrap().len(), 0);

    // Libraries, SONAMEs, links; NVML carries node.json.
    let triple = host().multiarch_triple();
    let lib_dir = driver.join("usr/lib").join(triple);
    let cache =
        Command::new("ldconfig").arg("-p").arg("-C").arg(driver.join("etc/ld.so.cache")).output().unwrap();
    let cache = String::from_utf8(cache.stdout).unwrap();
    for lib in LIBRARIES {
        let file = lib.file_name(version);
        let soname = lib.soname(version);
        let bytes = std::fs::read(lib_dir.join(&file)).unwrap_or_else(|e| panic!("{preset}: {file}: {e}"));
        let summary = elf::read_soname(&bytes).unwrap();
        assert_eq!(summary.soname.as_deref(), Some(soname.as_str()), "{file}");
        assert_eq!(summary.machine, host().elf_machine(), "{file}");
        if let SonameKind::Major(_) = lib.soname {
            assert_eq!(std::fs::read_link(lib_dir.join(&soname)).unwrap(), Path::new(&file));
        }
        if lib.dev_link {
            assert_eq!(
                std::fs::read_link(lib_dir.join(format!("{}.so", lib.stem))).unwrap(),
                Path::new(&soname)
            );
        }
        let line = format!("\t{soname} ({}) => /usr/lib/{triple}/{soname}", host().ldconfig_label());
        assert!(cache.lines().any(|l| l == line), "{preset}: ld.so.cache lacks `{line}`:\n{cache}");
    }
    let nvml_file = std::fs::read(lib_dir.join(format!("libnvidia-ml.so.{version}"))).unwrap();
    let (_, json) = embed::split(&nvml_file).expect("description embedded in libnvidia-ml");
    assert_eq!(json, std::fs::read(out.join("node.json")).unwrap().as_slice());

    // Programs: executable; the stubs say what they are.
    for name in BINARIES {
        let meta = std::fs::metadata(driver.join("usr/bin").join(name)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o755, "{name}");
    }
    let stub = Command::new(driver.join("usr/bin/nvidia-cuda-mps-control")).output().unwrap();
    assert!(stub.status.success());
    assert!(text(&stub).0.starts_with("nvidia-cuda-mps-control: stand-in"), "{}", text(&stub).0);
    // No preset lists a separate package: the driver alone.
    for name in IMEX_BINARIES {
        assert!(!driver.join("usr/bin").join(name).exists(), "{preset}: {name} without nvidia-imex");
    }

    // Firmware, config files, ld.so.conf, IPC.
    for fw in ["gsp_ga10x.bin", "gsp_tu10x.bin"] {
        assert!(driver.join("lib/firmware/nvidia").join(version).join(fw).is_file(), "{fw}");
    }
    for json in [
        "usr/share/vulkan/icd.d/nvidia_icd.json",
        "usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
        "usr/share/glvnd/egl_vendor.d/10_nvidia.json",
        "usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
        "usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
    ] {
        serde_json::from_str::<serde_json::Value>(&read(&driver.join(json)))
            .unwrap_or_else(|e| panic!("{json}: {e}"));
    }
    assert_eq!(read(&driver.join("etc/OpenCL/vendors/nvidia.icd")), "libnvidia-opencl.so.1\n");
    assert!(driver.join("usr/share/nvidia/nvoptix.bin").is_file());
    assert!(
        read(&driver.join(format!("etc/ld.so.conf.d/{triple}.conf")))
            .contains(&format!("/usr/lib/{triple}\n"))
    );
    for daemon in ["nvidia-persistenced", "nvidia-fabricmanager"] {
        let meta = std::fs::symlink_metadata(driver.join("run").join(daemon).join("socket")).unwrap();
        assert!(meta.file_type().is_socket(), "{daemon} socket");
    }
    assert_eq!(std::fs::read_link(driver.join("var/run")).unwrap(), Path::new("../run"));
    assert!(driver.join("tmp/nvidia-mps").is_dir());

    // Graphics, video and display pieces: VDPAU (outside the ld cache), the GBM backend link,
    // Xorg modules; each a loadable stub with its SONAME.
    let vdpau = lib_dir.join(format!("vdpau/libvdpau_nvidia.so.{version}"));
    let summary = elf::read_soname(&std::fs::read(&vdpau).unwrap()).unwrap();
    assert_eq!(summary.soname.as_deref(), Some("libvdpau_nvidia.so.1"));
    assert!(!cache.contains("libvdpau_nvidia"), "VDPAU's driver is opened by path, not from the cache");
    assert_eq!(
        std::fs::read_link(lib_dir.join("gbm/nvidia-drm_gbm.so")).unwrap(),
        Path::new("../libnvidia-allocator.so.1")
    );
    assert!(lib_dir.join("gbm/nvidia-drm_gbm.so").is_file(), "the GBM link resolves");
    let xorg = driver.join("usr/lib/xorg/modules");
    for (module, soname) in [
        ("drivers/nvidia_drv.so".to_owned(), "nvidia_drv.so".to_owned()),
        (format!("extensions/libglxserver_nvidia.so.{version}"), format!("libglxserver_nvidia.so.{version}")),
    ] {
        let summary = elf::read_soname(&std::fs::read(xorg.join(&module)).unwrap()).unwrap();
        assert_eq!(summary.soname.as_deref(), Some(soname.as_str()), "{module}");
    }
    assert!(xorg.join("extensions/libglxserver_nvidia.so").is_file());

    // Device nodes against the simulated /proc/devices.
    let majors = parse_char_majors(&read(&proc_root.join("devices")));
    assert_eq!((majors["nvidia"], majors["nvidiactl"]), (195, 195));
    let (uvm, caps) = (majors["nvidia-uvm"], majors["nvidia-caps"]);
    assert_ne!(uvm, caps);
    for gpu in &expected.gpus {
        assert_char(&dev.join(format!("dev/nvidia{}", gpu.minor)), 195, gpu.minor, 0o666);
    }
    assert_char(&dev.join("dev/nvidiactl"), 195, 255, 0o666);
    assert_char(&dev.join("dev/nvidia-modeset"), 195, 254, 0o666);
    assert_char(&dev.join("dev/nvidia-uvm"), uvm, 0, 0o666);
    assert_char(&dev.join("dev/nvidia-uvm-tools"), uvm, 1, 0o666);

    // MIG capabilities: nodes, proc capability files and mig-minors agree with the description.
    let minors = mig_minors(&proc_root);
    assert_eq!((minors["config"], minors["monitor"]), (1, 2));
    assert_eq!(minors["gpu0/gi2/access"], 21, "the driver's numbering: 3 + 9 per GPU instance");
    let caps_dir = dev.join("dev/nvidia-caps");
    if expected.gpus.iter().any(|g| g.mig.is_some()) {
        assert_char(&caps_dir.join("nvidia-cap1"), caps, 1, 0o400);
        assert_char(&caps_dir.join("nvidia-cap2"), caps, 2, 0o444);
        let mut expected_nodes: BTreeSet<String> = ["nvidia-cap1".into(), "nvidia-cap2".into()].into();
        for gpu in &expected.gpus {
            for gi in gpu.mig.iter().flat_map(|m| &m.gpu_instances) {
                let mut names = vec![format!("gpu{}/gi{}/access", gpu.minor, gi.id)];
                names.extend(
                    gi.compute_instances
                        .iter()
                        .map(|ci| format!("gpu{}/gi{}/ci{}/access", gpu.minor, gi.id, ci.id)),
                );
                for name in names {
                    let minor = minors[&name];
                    assert_char(&caps_dir.join(format!("nvidia-cap{minor}")), caps, minor, 0o444);
                    expected_nodes.insert(format!("nvidia-cap{minor}"));
                    let (g, rest) = name.split_once('/').unwrap();
                    let cap_file =
                        proc_root.join("driver/nvidia/capabilities").join(g).join("mig").join(rest);
                    assert!(
                        read(&cap_file)
                            .starts_with(&format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\n"))
                    );
                }
            }
        }
        let present: BTreeSet<String> = std::fs::read_dir(&caps_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(present, expected_nodes, "{preset}: dev/nvidia-caps");
    } else {
        assert!(!caps_dir.exists(), "{preset}: no MIG-capable GPU, no nvidia-caps");
    }

    // DRM nodes for display GPUs only (the L4 of `single`).
    if preset == "single" {
        assert_char(&dev.join("dev/dri/card0"), 226, 0, 0o660);
        assert_char(&dev.join("dev/dri/renderD128"), 226, 128, 0o666);
        let by_path = dev.join("dev/dri/by-path/pci-0000:01:00.0-render");
        assert_eq!(std::fs::read_link(&by_path).unwrap(), Path::new("../renderD128"));
        assert!(std::fs::metadata(&by_path).unwrap().file_type().is_char_device(), "link resolves");
        assert_eq!(majors["drm"], 226);
    } else {
        assert!(!dev.join("dev/dri").exists(), "{preset}: data-center GPUs get no DRM nodes");
    }

    // proc and sys files.
    let version_file = read(&proc_root.join("driver/nvidia/version"));
    assert!(version_file.starts_with(&format!(
        "NVRM version: NVIDIA UNIX {} Kernel Module  {version}  ",
        std::env::consts::ARCH
    )));
    for gpu in &expected.gpus {
        let bus = gpu.pci_bus_id[4..].to_ascii_lowercase();
        let info = read(&proc_root.join("driver/nvidia/gpus").join(&bus).join("information"));
        assert!(info.contains(&format!("GPU UUID: \t {}\n", gpu.uuid)), "{info}");
        assert!(info.contains(&format!("Device Minor: \t {}\n", gpu.minor)), "{info}");
        assert!(info.contains(&format!("Bus Location: \t {bus}\n")), "{info}");
        let numa = gpu.numa_node.map_or("-1".into(), |n| n.to_string());
        assert_eq!(read(&sys.join("bus/pci/devices").join(&bus).join("numa_node")), format!("{numa}\n"));
    }
    assert_eq!(read(&sys.join("module/nvidia/version")), format!("{version}\n"));

    // The env file points a shell at this node.
    let env = out.join("env");
    let shell = Command::new("sh")
        .arg("-c")
        .arg(r#". "$1" && printf '%s\n%s\n%s\n' "$NVINJECT_SIM_NODE" "$LD_LIBRARY_PATH" "$NVINJECT_SIM_DEV_ROOT""#)
        .arg("sh")
        .arg(&env)
        .env("LD_LIBRARY_PATH", "/elsewhere")
        .output()
        .unwrap();
    let lines: Vec<String> = text(&shell).0.lines().map(str::to_owned).collect();
    assert_eq!(
        lines,
        vec![
            out.join("node.json").display().to_string(),
            format!("{}:/elsewhere", lib_dir.display()),
            dev.display().to_string()
        ]
    );
}

#[test]
#[ignore = "needs root"]
fn every_preset_builds_into_the_documented_tree() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let dir = tempfile::tempdir().unwrap();
    let nvml = stub_nvml(dir.path());
    for preset in presets::NAMES {
        check_tree(preset, &nvml);
    }
}

/// A description listing the `nvidia-imex` package gets its programs, each a working stub; nothing
/// else of the driver root changes.
#[test]
#[ignore = "needs root"]
fn the_imex_package_adds_its_programs() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let dir = tempfile::tempdir().unwrap();
    let nvml = stub_nvml(dir.path());
    let mut node = presets::preset("h100x8").unwrap();
    node.driver.packages = vec![nvinject_simnode::description::DriverPackage::Imex];
    let file = dir.path().join("imex.json");
    std::fs::write(&file, node.to_json()).unwrap();
    let (with, without) = (dir.path().join("imex"), dir.path().join("plain"));
    let output = run_build(&[
        "--node",
        file.to_str().unwrap(),
        "--out",
        with.to_str().unwrap(),
        "--nvml-lib",
        nvml.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", text(&output).1);
    build_preset("h100x8", &without, &nvml);
    for name in IMEX_BINARIES {
        let path = with.join("driver/usr/bin").join(name);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o755, "{name}");
        let run = Command::new(&path).output().unwrap();
        assert!(run.status.success() && text(&run).0.starts_with(&format!("{name}: stand-in")), "{run:?}");
    }
    let (mut a, b) = (snapshot(&with.join("driver")), snapshot(&without.join("driver")));
    for name in IMEX_BINARIES {
        assert!(a.remove(&PathBuf::from("usr/bin").join(name)).is_some(), "{name}");
    }
    assert_eq!(a, b, "the package changed more than its programs");
}

/// What a tree holds, path by path, for comparing two builds.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_owned();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let mode = meta.mode() & 0o7777;
            let ft = meta.file_type();
            let what = if ft.is_dir() {
                stack.push(path.clone());
                format!("dir {mode:o}")
            } else if ft.is_symlink() {
                format!("link {}", std::fs::read_link(&path).unwrap().display())
            } else if ft.is_char_device() {
                format!(
                    "char {}:{} {mode:o}",
                    nix::sys::stat::major(meta.rdev()),
                    nix::sys::stat::minor(meta.rdev())
                )
            } else if ft.is_socket() {
                "socket".into()
            } else {
                let name = rel.file_name().unwrap().to_string_lossy();
                // These hold the build's absolute paths, by design.
                if ["node.json", "env", ".nvinject-simnode"].contains(&name.as_ref())
                    || name.starts_with("libnvidia-ml.so.")
                {
                    format!("file {mode:o} (paths)")
                } else {
                    format!("file {mode:o} {:?}", std::fs::read(&path).unwrap())
                }
            };
            out.insert(rel, what);
        }
    }
    out
}

#[test]
#[ignore = "needs root"]
fn same_preset_same_tree() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let dir = tempfile::tempdir().unwrap();
    let nvml = stub_nvml(dir.path());
    let (a, b) = (dir.path().join("a"), dir.path().join("b-with-a-longer-name"));
    build_preset("a100-mig", &a, &nvml);
    build_preset("a100-mig", &b, &nvml);
    let (sa, sb) = (snapshot(&a), snapshot(&b));
    assert!(sa.len() > 100, "suspiciously small tree: {} entries", sa.len());
    for (path, what) in &sa {
        assert_eq!(Some(what), sb.get(path), "{} differs between two builds", path.display());
    }
    assert_eq!(sa.len(), sb.len());
}

#[test]
#[ignore = "needs root"]
fn force_rebuilds_only_a_simulated_node() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let dir = tempfile::tempdir().unwrap();
    let nvml = stub_nvml(dir.path());
    let out = dir.path().join("node");
    build_preset("single", &out, &nvml);
    std::fs::write(out.join("host/dev/stray"), b"left by a test").unwrap();
    let (out_arg, nvml_arg) = (out.to_str().unwrap(), nvml.to_str().unwrap());

    let again = run_build(&["--preset", "h100x8", "--out", out_arg, "--nvml-lib", nvml_arg]);
    assert!(!again.status.success());
    assert!(text(&again).1.contains("already holds a simulated node; pass --force"), "{}", text(&again).1);
    assert!(!out.join("host/dev/nvidia7").exists());

    let forced = run_build(&["--preset", "h100x8", "--out", out_arg, "--nvml-lib", nvml_arg, "--force"]);
    assert!(forced.status.success(), "{}", text(&forced).1);
    assert!(out.join("host/dev/nvidia7").exists());
    assert!(!out.join("host/dev/stray").exists(), "--force wipes the old tree");
    assert!(!out.join("host/dev/dri").exists(), "nothing of the old preset is left");

    let foreign = dir.path().join("home");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), b"mine").unwrap();
    let refused = run_build(&[
        "--preset",
        "single",
        "--out",
        foreign.to_str().unwrap(),
        "--nvml-lib",
        nvml_arg,
        "--force",
    ]);
    assert!(!refused.status.success());
    assert!(text(&refused).1.contains("is not a simulated node"), "{}", text(&refused).1);
    assert_eq!(std::fs::read(foreign.join("notes.txt")).unwrap(), b"mine");
}

#[test]
#[ignore = "needs root"]
fn roots_can_be_placed_elsewhere() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let dir = tempfile::tempdir().unwrap();
    let nvml = stub_nvml(dir.path());
    let (out, drv, devr) = (dir.path().join("out"), dir.path().join("drv"), dir.path().join("hostroot"));
    let output = run_build(&[
        "--preset",
        "h100x8",
        "--out",
        out.to_str().unwrap(),
        "--driver-root",
        drv.to_str().unwrap(),
        "--dev-root",
        devr.to_str().unwrap(),
        "--nvml-lib",
        nvml.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", text(&output).1);
    let node = NodeDescription::load(&out.join("node.json")).unwrap();
    assert_eq!(node.dev_root.as_deref(), Some(devr.as_path()));
    assert!(drv.join("etc/ld.so.cache").is_file());
    assert_char(&devr.join("dev/nvidia0"), 195, 0, 0o666);
    assert!(devr.join("proc/driver/nvidia/version").is_file(), "proc root defaults to <dev root>/proc");
    assert!(!out.join("driver").exists() && !out.join("host").exists());
}
