//! `--cdi-spec`: the plugin binary keeps the spec containerd's own CDI reads fresh. Before it
//! answers Allocate it generates a missing spec and regenerates one whose driver version is not
//! the loaded driver's (the simulated node rebuilt with another driver, in place), with the real
//! `nvinject-cdi`; the driver-version watch does it with no Allocate; a generator that fails makes
//! Allocate `UNAVAILABLE` with the reason. As the DaemonSet runs it (the installer's ready file,
//! the host's driver root mounted elsewhere), it registers only once the installer is ready,
//! writes nothing before, and the spec it writes names the host's paths. Real processes on
//! simulated nodes; needs root.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Kubelet, Node, Plugin, kubelet_dir, plugin_args, simnode};
use serde_json::{Value, json};

fn recorded_driver(spec: &Path) -> Option<String> {
    let v: Value = serde_json::from_slice(&std::fs::read(spec).ok()?).ok()?;
    v["annotations"]["nvinject.io/driver-version"].as_str().map(str::to_owned)
}

/// The same node with driver `version`, rebuilt in place.
fn upgrade(node: &Node, version: &str) {
    let mut desc = node.description.clone();
    desc["driver"]["version"] = Value::String(version.into());
    let file = node.tmp.path().join("upgraded.json");
    std::fs::write(&file, serde_json::to_vec(&desc).unwrap()).unwrap();
    let status = Command::new(simnode())
        .args(["build", "--force", "--node"])
        .arg(&file)
        .arg("--out")
        .arg(&node.out)
        .arg("--nvml-lib")
        .arg(nvinject_simnode::artifacts::sim_nvml_lib())
        .status()
        .unwrap();
    assert!(status.success());
}

fn start(node: &Node, generator: &Path, watch: &str) -> (Kubelet, Plugin, std::path::PathBuf) {
    start_with(node, generator, watch, &[])
}

fn start_with(
    node: &Node,
    generator: &Path,
    watch: &str,
    extra: &[(&str, String)],
) -> (Kubelet, Plugin, std::path::PathBuf) {
    let dir = kubelet_dir(node);
    let kubelet = Kubelet::start(&dir);
    let spec = node.tmp.path().join("cdi/nvidia.com-gpu.json");
    std::fs::create_dir_all(spec.parent().unwrap()).unwrap();
    let mut args = plugin_args(node, &dir);
    for (flag, value) in [
        ("--cdi-spec", spec.display().to_string()),
        ("--cdi-generator", generator.display().to_string()),
        ("--cdi-hook-path", "/usr/local/nvinject/bin/nvinject-hook".into()),
        ("--sys-root", node.out.join("host/sys").display().to_string()),
        ("--driver-watch-interval", watch.into()),
    ] {
        args.extend([flag.to_owned(), value]);
    }
    for (flag, value) in extra {
        args.extend([(*flag).to_owned(), value.clone()]);
    }
    let plugin = Plugin::start(Some(node), &args, &[]);
    (kubelet, plugin, spec)
}

#[test]
#[ignore = "needs root"]
fn allocate_answers_only_with_a_spec_for_the_loaded_driver() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::preset("h100x8");
    let cdi = nvinject_simnode::artifacts::artifact("nvinject-cdi-gen", "nvinject-cdi");
    // A long watch interval: what happens here is Allocate's own check.
    let (mut k, plugin, spec) = start(&node, &cdi, "1h");
    k.registered("nvidia.com/gpu");
    let request = json!([[node.uuid(1)]]);

    // The watch's first round (at start) or the first Allocate generates the missing spec.
    k.allocate("nvidia.com/gpu", request.clone()).unwrap_or_else(|e| panic!("{e}\n{}", plugin.stderr()));
    assert_eq!(recorded_driver(&spec).as_deref(), Some("550.54.15"), "{}", plugin.stderr());

    upgrade(&node, "555.42.02");
    k.allocate("nvidia.com/gpu", request.clone()).unwrap_or_else(|e| panic!("{e}\n{}", plugin.stderr()));
    assert_eq!(recorded_driver(&spec).as_deref(), Some("555.42.02"), "{}", plugin.stderr());
    let text = std::fs::read_to_string(&spec).unwrap();
    assert!(text.contains("libnvidia-ml.so.555.42.02") && !text.contains("550.54.15"));
    assert!(plugin.stderr().contains("CDI spec regenerated"), "{}", plugin.stderr());
}

#[test]
#[ignore = "needs root"]
fn the_watch_heals_without_an_allocate_and_a_failing_generator_refuses_allocate() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::preset("h100x8");
    let cdi = nvinject_simnode::artifacts::artifact("nvinject-cdi-gen", "nvinject-cdi");
    let (mut k, plugin, spec) = start(&node, &cdi, "200ms");
    k.registered("nvidia.com/gpu");
    let wait_for = |version: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while recorded_driver(&spec).as_deref() != Some(version) {
            assert!(Instant::now() < deadline, "spec not {version}: {}", plugin.stderr());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_for("550.54.15");
    upgrade(&node, "555.42.02");
    wait_for("555.42.02");
    drop(k);
    drop(plugin);

    // A generator that fails: Allocate is refused, naming the spec and the generator's reason.
    let broken = node.tmp.path().join("broken-gen");
    std::fs::write(&broken, "#!/bin/sh\necho 'cannot open NVML' >&2\nexit 7\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o755)).unwrap();
    upgrade(&node, "560.35.03");
    let (mut k, plugin, spec) = start(&node, &broken, "1h");
    k.registered("nvidia.com/gpu");
    let e = k.allocate("nvidia.com/gpu", json!([[node.uuid(0)]])).unwrap_err();
    assert_eq!(e["code"], "Unavailable", "{e}");
    let message = e.to_string();
    assert!(
        message.contains("nvidia.com-gpu.json")
            && message.contains("560.35.03")
            && message.contains("cannot open NVML"),
        "{message}"
    );
    assert_eq!(recorded_driver(&spec).as_deref(), Some("555.42.02"), "the old spec is left as it was");
    drop(plugin);
}

/// Waits until the plugin's log has `needle`.
fn logged(plugin: &Plugin, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !plugin.stderr().contains(needle) {
        assert!(Instant::now() < deadline, "no `{needle}` in the log: {}", plugin.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "needs root"]
fn before_the_installer_is_ready_the_plugin_neither_registers_nor_writes_the_spec() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::preset("h100x8");
    let cdi = nvinject_simnode::artifacts::artifact("nvinject-cdi-gen", "nvinject-cdi");
    let ready = node.tmp.path().join("run/nvinject/ready");
    let ready_flag = [("--installer-ready-file", ready.display().to_string())];
    let (mut k, plugin, spec) = start_with(&node, &cdi, "100ms", &ready_flag);
    logged(&plugin, "waiting for nvinject-installer to finish on this node");
    // Several watch intervals and socket polls go by: still nothing registered, nothing written.
    assert!(
        k.try_wait_event("registered", Duration::from_secs(1), |_| true).is_none(),
        "{}",
        plugin.stderr()
    );
    assert!(!spec.exists(), "the spec is the installer's to create: {}", plugin.stderr());

    // The installer is done (it wrote the spec, then the ready file).
    node.generate_spec(&spec);
    std::fs::create_dir_all(ready.parent().unwrap()).unwrap();
    std::fs::write(&ready, "ready\n").unwrap();
    k.registered("nvidia.com/gpu");
    k.allocate("nvidia.com/gpu", json!([[node.uuid(0)]]))
        .unwrap_or_else(|e| panic!("{e}\n{}", plugin.stderr()));

    // While the installer runs, a driver upgrade is healed.
    upgrade(&node, "555.42.02");
    k.allocate("nvidia.com/gpu", json!([[node.uuid(0)]]))
        .unwrap_or_else(|e| panic!("{e}\n{}", plugin.stderr()));
    assert_eq!(recorded_driver(&spec).as_deref(), Some("555.42.02"));

    // The installer stopping (ready file gone, about to uninstall): a stale spec is refused and
    // left for the uninstall, never rewritten behind it.
    std::fs::remove_file(&ready).unwrap();
    upgrade(&node, "560.35.03");
    let e = k.allocate("nvidia.com/gpu", json!([[node.uuid(0)]])).unwrap_err();
    assert_eq!(e["code"], "Unavailable", "{e}");
    assert!(e.to_string().contains("ready"), "{e}");
    assert_eq!(recorded_driver(&spec).as_deref(), Some("555.42.02"));
}

#[test]
#[ignore = "needs root"]
fn in_a_container_the_spec_names_the_hosts_driver_root_not_the_mount() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::preset("h100x8");
    let cdi = nvinject_simnode::artifacts::artifact("nvinject-cdi-gen", "nvinject-cdi");
    // As the DaemonSet: the host's driver root is /run/nvidia/driver, mounted here elsewhere.
    let mount = node.driver_root().display().to_string();
    let (mut k, plugin, spec) = start_with(
        &node,
        &cdi,
        "1h",
        &[("--container-driver-root", mount.clone()), ("--nvidia-driver-root", "/run/nvidia/driver".into())],
    );
    k.registered("nvidia.com/gpu");
    k.allocate("nvidia.com/gpu", json!([[node.uuid(0)]]))
        .unwrap_or_else(|e| panic!("{e}\n{}", plugin.stderr()));
    let text = std::fs::read_to_string(&spec).unwrap();
    assert!(
        text.contains("\"hostPath\": \"/run/nvidia/driver/") && text.contains("libnvidia-ml.so.550.54.15"),
        "{text}"
    );
    assert!(!text.contains(&mount), "the mount point leaked into the spec: {text}");
}
