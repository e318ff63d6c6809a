//! The other `nvinject-simnode` commands, and the build refused without CAP_MKNOD.
//! Needs root and `setpriv` (util-linux).

mod common;

use std::process::Command;

use common::{build_preset, run_build, simnode, stub_nvml, text};
use nvinject_simnode::events::XidEvent;
use nvinject_simnode::presets;

#[test]
#[ignore = "needs root"]
fn build_without_cap_mknod_names_the_node_and_the_fix() {
    nvinject_test_support::require_root("mknod, and dropping CAP_MKNOD");
    let dir = tempfile::tempdir().unwrap();
    let nvml = stub_nvml(dir.path());
    let out = dir.path().join("node");
    // Root without CAP_MKNOD: dropping it from the bounding set removes it from the child's
    // permitted and effective sets at exec.
    let output = Command::new("setpriv")
        .args(["--bounding-set", "-mknod", "--"])
        .arg(simnode())
        .args(["build", "--preset", "single", "--out"])
        .arg(&out)
        .arg("--nvml-lib")
        .arg(&nvml)
        .output()
        .expect("setpriv (util-linux) is needed for this test");
    let (_, stderr) = text(&output);
    assert!(!output.status.success(), "the build succeeded without CAP_MKNOD");
    let node = out.join("host/dev/nvidia0");
    assert!(
        stderr.contains(&format!(
            "{}: cannot create device nodes: mknod needs root (CAP_MKNOD)",
            node.display()
        )),
        "{stderr}"
    );
    assert!(!node.exists());

    // The partial tree is the builder's own: --force with the capability rebuilds it.
    let out_arg = out.to_str().unwrap();
    let again =
        run_build(&["--preset", "single", "--out", out_arg, "--nvml-lib", nvml.to_str().unwrap(), "--force"]);
    assert!(again.status.success(), "{}", text(&again).1);
    assert!(node.exists());
}

fn events(path: &std::path::Path) -> Vec<XidEvent> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| XidEvent::parse_line(l).expect("event line"))
        .collect()
}

#[test]
#[ignore = "needs root"]
fn xid_appends_events_for_gpus_and_mig_instances() {
    nvinject_test_support::require_root("mknod, and dropping CAP_MKNOD");
    let dir = tempfile::tempdir().unwrap();
    let nvml = stub_nvml(dir.path());
    let out = dir.path().join("node");
    build_preset("a100-mig", &out, &nvml);
    let node = out.join("node.json");
    let preset = presets::preset("a100-mig").unwrap();
    let xid = |args: &[&str]| {
        Command::new(simnode()).arg("xid").arg("--node").arg(&node).args(args).output().unwrap()
    };

    let by_index = xid(&["--gpu", "3", "--xid", "79"]);
    assert!(by_index.status.success(), "{}", text(&by_index).1);
    let uuid = preset.gpus[0].uuid.to_uppercase(); // UUIDs match case-insensitively
    let by_uuid = xid(&["--gpu", &uuid, "--xid", "13", "--gi", "2", "--ci", "0"]);
    assert!(by_uuid.status.success(), "{}", text(&by_uuid).1);
    assert_eq!(
        events(&out.join("xid-events")),
        vec![
            XidEvent {
                uuid: preset.gpus[3].uuid.clone(),
                xid: 79,
                gpu_instance_id: None,
                compute_instance_id: None
            },
            XidEvent {
                uuid: preset.gpus[0].uuid.clone(),
                xid: 13,
                gpu_instance_id: Some(2),
                compute_instance_id: Some(0)
            },
        ]
    );

    // Wrong targets are refused with the file and the reason, and append nothing.
    for (args, needle) in [
        (&["--gpu", "4", "--xid", "79"][..], "the node has 4 GPUs"),
        (&["--gpu", "GPU-00000000-0000-0000-0000-000000000000", "--xid", "79"][..], "no GPU has this UUID"),
        (&["--gpu", "2", "--xid", "13", "--gi", "1"][..], "no MIG GPU instance with this id"),
        (&["--gpu", "0", "--xid", "13", "--gi", "2", "--ci", "5"][..], "has no such compute instance"),
    ] {
        let refused = xid(args);
        assert!(!refused.status.success(), "{args:?}");
        let stderr = text(&refused).1;
        assert!(
            stderr.contains(&node.display().to_string()) && stderr.contains(needle),
            "{args:?}: {stderr}"
        );
    }
    assert_eq!(events(&out.join("xid-events")).len(), 2);
}

#[test]
fn describe_and_presets() {
    let described = Command::new(simnode()).args(["describe", "--preset", "h100x8"]).output().unwrap();
    assert!(described.status.success());
    assert_eq!(text(&described).0, presets::preset_json("h100x8").unwrap());

    let unknown = Command::new(simnode()).args(["describe", "--preset", "h200x16"]).output().unwrap();
    assert!(!unknown.status.success());
    assert!(
        text(&unknown).1.contains("unknown preset `h200x16`; presets: single, h100x8"),
        "{}",
        text(&unknown).1
    );

    let listed = Command::new(simnode()).arg("presets").output().unwrap();
    let listing = text(&listed).0;
    assert_eq!(listing.lines().count(), presets::NAMES.len());
    assert!(
        listing.lines().any(|l| l.starts_with("h100x8") && l.contains("8 x NVIDIA H100 80GB HBM3")),
        "{listing}"
    );
    assert!(listing.lines().any(|l| l.starts_with("a100-mig") && l.contains("11 MIG devices")), "{listing}");
}
