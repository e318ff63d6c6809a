//! `nvinject-hook disable-device-node-modification`, the real static binary, in a private mount
//! namespace (`unshare --mount --propagation private`, so nothing it mounts outlives the test): the
//! container's `/proc/driver/nvidia/params` (here a plain file in the rootfs, as the simulated
//! node's containers have no driver entries in their procfs) reads `ModifyDeviceFiles: 0` with
//! the rest of the host's file, read-only; the file underneath and the host's are unchanged; a
//! rootfs whose `/proc` is a symlink to a host directory gets nothing covered there. Needs root.

use std::fs;
use std::path::Path;
use std::process::Command;

use nvinject_simnode::artifacts::static_hook;

const HOST_PARAMS: &str =
    "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\nDeviceFileUID: 0\nHostOnly: 7\n";
const IMAGE_PARAMS: &str = "ModifyDeviceFiles: 1\nImageOnly: 1\n";

mod common;

/// The OCI state of [`common::bundle`]'s bundle (its rootfs is `<dir>/bundle/rootfs`).
fn bundle(dir: &Path) -> std::path::PathBuf {
    common::bundle(dir).1
}

/// The two runs that cover the file: the spec's own, and the shim's merged `inject` run.
const RUNS: [&str; 2] = ["disable-device-node-modification", "inject --disable-device-node-modification"];

/// Runs the hook and then `after` (a shell snippet, `$T` the container's params file) in one
/// private mount namespace; their output.
fn in_namespace(dir: &Path, state: &Path, host_params: &Path, after: &str) -> std::process::Output {
    in_namespace_with(RUNS[0], dir, state, host_params, after)
}

/// [`in_namespace`] with the hook's subcommand and switches given.
fn in_namespace_with(
    run: &str,
    dir: &Path,
    state: &Path,
    host_params: &Path,
    after: &str,
) -> std::process::Output {
    // Without root `unshare --mount` fails, and the assertions below show its message.
    let target = dir.join("bundle/rootfs/proc/driver/nvidia/params");
    let script = format!("\"$HOOK\" {run} --params-file \"$HOST\" < \"$STATE\" || exit 9; {after}");
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env("HOOK", static_hook())
        .env("HOST", host_params)
        .env("STATE", state)
        .env("T", &target)
        .output()
        .unwrap()
}

#[test]
#[ignore = "needs root"]
fn the_container_reads_modify_device_files_0_read_only_and_nothing_else_changes() {
    nvinject_test_support::require_root("mknod and mounts in a rootfs");
    for run in RUNS {
        covered_read_only_by(run);
    }
}

fn covered_read_only_by(run: &str) {
    let dir = tempfile::tempdir().unwrap();
    let state = bundle(dir.path());
    let host = dir.path().join("host-params");
    fs::write(&host, HOST_PARAMS).unwrap();
    let target = dir.path().join("bundle/rootfs/proc/driver/nvidia/params");
    fs::create_dir_all(target.parent().unwrap()).unwrap();
    fs::write(&target, IMAGE_PARAMS).unwrap();

    let out = in_namespace_with(
        run,
        dir.path(),
        &state,
        &host,
        r#"cat "$T"; echo ---; if echo x >> "$T" 2>/dev/null; then echo writable; else echo read-only; fi; grep -c " $T " /proc/self/mountinfo"#,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{run}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let (seen, rest) = stdout.split_once("---\n").unwrap();
    assert_eq!(seen, HOST_PARAMS.replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0"), "{run}");
    let mut rest = rest.lines();
    assert_eq!(rest.next(), Some("read-only"), "{stdout}");
    assert_eq!(rest.next(), Some("1"), "one mount over the file: {stdout}");

    // Outside the namespace: the rootfs's file and the host's are as they were, nothing added.
    assert_eq!(fs::read_to_string(&target).unwrap(), IMAGE_PARAMS);
    assert_eq!(fs::read_to_string(&host).unwrap(), HOST_PARAMS);
    let entries: Vec<_> =
        fs::read_dir(dir.path().join("bundle/rootfs")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(entries, ["proc"], "nothing is left in the rootfs");
}

#[test]
#[ignore = "needs root"]
fn a_host_value_of_0_or_a_container_without_the_file_changes_nothing() {
    nvinject_test_support::require_root("mknod and mounts in a rootfs");
    let dir = tempfile::tempdir().unwrap();
    let state = bundle(dir.path());
    let host = dir.path().join("host-params");
    fs::write(&host, HOST_PARAMS.replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0")).unwrap();
    let target = dir.path().join("bundle/rootfs/proc/driver/nvidia/params");
    fs::create_dir_all(target.parent().unwrap()).unwrap();
    fs::write(&target, IMAGE_PARAMS).unwrap();
    let out =
        in_namespace(dir.path(), &state, &host, r#"cat "$T"; grep -c " $T " /proc/self/mountinfo || true"#);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout, format!("{IMAGE_PARAMS}0\n"), "already 0 on the host: nothing mounted");

    // Needs hiding, but the container has no such file: nothing is made or mounted.
    fs::write(&host, HOST_PARAMS).unwrap();
    fs::remove_dir_all(dir.path().join("bundle/rootfs/proc")).unwrap();
    let out = in_namespace(dir.path(), &state, &host, "grep -c nvidia /proc/self/mountinfo || true");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0\n");
    assert!(!dir.path().join("bundle/rootfs/proc").exists());
}

#[test]
#[ignore = "needs root"]
fn an_image_proc_link_to_a_host_directory_is_resolved_inside_the_rootfs() {
    nvinject_test_support::require_root("mknod and mounts in a rootfs");
    let dir = tempfile::tempdir().unwrap();
    let state = bundle(dir.path());
    let host = dir.path().join("host-params");
    fs::write(&host, HOST_PARAMS).unwrap();
    // A host directory with a params file, and the image's /proc pointing at its absolute path.
    let outside = dir.path().join("outside");
    fs::create_dir_all(outside.join("driver/nvidia")).unwrap();
    fs::write(outside.join("driver/nvidia/params"), "ModifyDeviceFiles: 1\n").unwrap();
    std::os::unix::fs::symlink(&outside, dir.path().join("bundle/rootfs/proc")).unwrap();
    let out = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "\"$HOOK\" disable-device-node-modification --params-file \"$HOST\" < \"$STATE\" || exit 9; \
             cat \"$OUTSIDE/driver/nvidia/params\"; grep -c \" $OUTSIDE/driver/nvidia/params \" /proc/self/mountinfo || true",
        ])
        .env("HOOK", static_hook())
        .env("HOST", &host)
        .env("STATE", &state)
        .env("OUTSIDE", &outside)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "ModifyDeviceFiles: 1\n0\n",
        "the host directory the link names is not covered"
    );
}
