//! Issue 12 item 2 on real parts: CUDA forward compatibility. Images that ship
//! `/usr/local/cuda/compat/libcuda.so.<version>` (an ELF with the SONAME `libcuda.so.1`, as CUDA's
//! compat package installs it) run through our shim, private containerd and runc on the simulated
//! node (driver 550.54.15), whose spec (written by `nvinject-cdi generate`) carries
//! `enable-cuda-compat --host-driver-version=550.54.15`. The container's own `ldconfig -p` (the
//! cache in the order the loader searches it) shows which `libcuda.so.1` a program gets. Both
//! `[runtime] one-hook-run` modes. Needs root (CI runs as root).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use nvinject_image_tool::image::ImageSpec;
use nvinject_node_harness::attack::{self, CtrRun, ImageFile};
use nvinject_node_harness::node::{GpuNode, NodeOptions, PROBE_PATH, parse_report};
use nvinject_node_harness::process;
use serde_json::Value;

static SERIAL: Mutex<()> = Mutex::new(());

const RUN_WAIT: Duration = Duration::from_secs(120);
const HOST_LIBCUDA: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";
const COMPAT: &str = "/usr/local/cuda/compat";

/// Imports an image with the probe and compat libraries of `version`; returns its name.
fn compat_image(node: &GpuNode, version: &str) -> String {
    let machine = nvinject_simnode::elf::Machine::host().expect("a supported host");
    let name = format!("docker.io/nvinject/compat-{}:latest", version.replace('.', "-"));
    let spec = ImageSpec {
        name: name.clone(),
        programs: vec![nvinject_simnode::artifacts::artifact("nvinject-integration", "nvinject-probe")],
        cmd: vec![PROBE_PATH.into(), "report".into()],
        env: vec!["PATH=/usr/local/bin:/usr/bin:/bin".into()],
    };
    let lib = |soname: &str, file: &str| ImageFile {
        path: PathBuf::from(format!("{COMPAT}/{file}.{version}")),
        content: nvinject_simnode::elf::shared_object(machine, soname),
        mode: 0o755,
    };
    let files = [
        lib("libcuda.so.1", "libcuda.so"),
        lib("libnvidia-ptxjitcompiler.so.1", "libnvidia-ptxjitcompiler.so"),
    ];
    let tar = node.base().join(format!("compat-{version}.tar"));
    let built = attack::build_image(&spec, &files, &tar).unwrap_or_else(|e| panic!("image {name}: {e}"));
    node.containerd.import(&built).unwrap();
    std::fs::remove_file(&tar).ok();
    name
}

/// What the container's `ldconfig -p` lists for `libcuda.so.1`, in order, and its ld.so.conf.d.
fn run(node: &GpuNode, id: &str, image: &str) -> (Vec<String>, Vec<String>, Value) {
    let r = CtrRun { image: image.into(), devices: "nvidia.com/gpu=0".into(), env: vec![], command: vec![] };
    let out = attack::ctr_run(node, id, &r, RUN_WAIT)
        .unwrap_or_else(|e| panic!("{id}: {e}\nshim log:\n{}", process::log_tail(&node.shim_log, 20)));
    assert_eq!(out.status, 0, "{id}: {} {}", out.stdout, out.stderr);
    let report = parse_report(&out.stdout).unwrap_or_else(|| panic!("{id}: no report: {}", out.stdout));
    let libcuda: Vec<String> = report["ldconfig"]["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|l| l.trim_start().starts_with("libcuda.so.1 "))
        .filter_map(|l| l.rsplit_once("=> ").map(|(_, p)| p.trim().to_owned()))
        .collect();
    let conf_d: Vec<String> = report["ld_so_conf_d"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    let create = node
        .shim_log_for(id)
        .into_iter()
        .find(|l| l["message"] == "container create")
        .unwrap_or_else(|| panic!("{id}: no create line"));
    (libcuda, conf_d, create)
}

#[test]
#[ignore = "needs root"]
fn newer_compat_libraries_come_first_and_older_ones_do_not() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let node = GpuNode::start(&NodeOptions::default()).unwrap_or_else(|e| panic!("node setup: {e}"));
    let spec: Value = serde_json::from_slice(&std::fs::read(&node.spec_path).unwrap()).unwrap();
    let hooks = spec["containerEdits"]["hooks"].as_array().unwrap();
    let subs: Vec<&str> = hooks.iter().filter_map(|h| h["args"][1].as_str()).collect();
    assert_eq!(
        subs,
        [
            "create-symlinks",
            "enable-cuda-compat",
            "update-ldcache",
            "disable-device-node-modification",
            "update-application-profile"
        ],
        "{hooks:?}"
    );
    assert_eq!(hooks[1]["args"][2], "--host-driver-version=550.54.15");

    let newer = compat_image(&node, "560.35.03");
    let older = compat_image(&node, "535.183.01");
    // Same branch as the host, newer build: NVIDIA's rule without an ELF note compares majors.
    let same_major = compat_image(&node, "550.90.07");
    let compat_libcuda = format!("{COMPAT}/libcuda.so.1");
    let mut ids = Vec::new();
    for one_run in [true, false] {
        node.set_one_hook_run(one_run).unwrap();
        let tag = if one_run { "one" } else { "sep" };

        let id = format!("compat-new-{tag}");
        let (libcuda, conf_d, create) = run(&node, &id, &newer);
        assert_eq!(libcuda, [compat_libcuda.clone(), HOST_LIBCUDA.to_owned()], "{id}: compat first");
        assert!(conf_d.iter().any(|f| f == "00-compat-nvinject.conf"), "{id}: {conf_d:?}");
        // One process for the links, the decision, the cache, the params cover and the profile, or
        // each run on its own.
        assert_eq!(create["hooks_merged"], if one_run { 5 } else { 0 }, "{id}: {create}");
        ids.push(id);

        for (what, image) in [("old", &older), ("same", &same_major)] {
            let id = format!("compat-{what}-{tag}");
            let (libcuda, conf_d, _) = run(&node, &id, image);
            assert_eq!(libcuda, [HOST_LIBCUDA], "{id}: the host driver's only");
            assert!(!conf_d.iter().any(|f| f.starts_with("00-compat")), "{id}: {conf_d:?}");
            ids.push(id);
        }
    }
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    node.assert_no_leftovers(&ids);
}
