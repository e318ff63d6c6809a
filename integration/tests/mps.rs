//! Issues 12 and 32 on real parts: an MPS client in a GPU container reaches the host's MPS
//! control daemon through the pipe directory the spec's `mps` device mounts, and a GPU container
//! not given that device neither sees the folder nor can touch it. The host side is
//! [`nvinject_node_harness::mps::MpsDaemon`]: the files NVIDIA's daemon keeps in its
//! `CUDA_MPS_PIPE_DIRECTORY` (the `control` and `control_privileged` seqpacket sockets, the `log`
//! FIFO, the lock and PID files), owned by root, in the simulated node's `tmp/nvidia-mps`, with a
//! thread answering. The container (our shim, a private containerd and runc, one GPU) runs the
//! client's part as uid 1000 with the image's own `sh`, `stat` and `nvinject-probe mps-client` (a
//! seqpacket connect/send/receive: a minimal image has no socat), then, as root (an unprivileged
//! container's root, as in issue 32), `nvinject-probe mps-tamper` on the host folder's path (remove
//! `control`, link `/etc/shadow` there, make a FIFO, write a file), then the probe's report. The
//! positive control runs the same request against the spec layout before issue 32 (the folder in
//! the common edits) and sees every tampering step land in the host folder. Needs root (CI runs
//! as root).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use nvinject_node_harness::mps::{self, MpsDaemon, Received, Seen};
use nvinject_node_harness::node::{GpuNode, NodeOptions, PROBE_PATH, RunOptions, RunResult};
use nvinject_node_harness::process;
use serde_json::Value;

/// The client's part, as uid 1000. `CUDA_MPS_PIPE_DIRECTORY` unset means the default folder, as
/// for CUDA. Each result is a `NVINJECT-MPS <key> <value>` line.
const CLIENT: &str = r#"
dir="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
echo "NVINJECT-MPS uid $(id -u)"
echo "NVINJECT-MPS dir $dir"
if [ -e "$MPS_HOST_DIR" ]; then echo "NVINJECT-MPS host-dir present"; else echo "NVINJECT-MPS host-dir absent"; fi
for f in "$dir"/*; do [ -e "$f" ] && stat -c "NVINJECT-MPS file %n %F %a %u" "$f"; done
if echo "client-log $MPS_TOKEN" > "$dir/log"; then echo "NVINJECT-MPS log written"; else echo "NVINJECT-MPS log failed"; fi
/usr/local/bin/nvinject-probe mps-client "$dir/control" "get_server_list $MPS_TOKEN"
/usr/local/bin/nvinject-probe mps-client "$dir/control_privileged" "get_server_list $MPS_TOKEN"
"$dir/exec-check" 2>/dev/null; echo "NVINJECT-MPS exec $?"
/bin/true; echo "NVINJECT-MPS exec-control $?"
"#;

const CLIENT_UID: u32 = 1000;

/// The spec's MPS device, as `nvinject-cdi --mps-pipe-dir` names it.
const MPS_DEVICE: &str = "nvidia.com/gpu=mps";

/// What the container does after the client's part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AsRoot {
    /// Only the report.
    Report,
    /// Issue 32's attack on the host folder's path, then the report.
    TamperThenReport,
}

/// Something the container cannot guess: it must come through the pipes.
fn nonce(what: &str) -> String {
    let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    format!("{what}-{:x}-{:x}", std::process::id(), t.as_nanos())
}

/// Runs the client's part (as uid 1000), then `as_root`, in one container given `devices` (CDI
/// names, comma-separated, in the annotation the device plugin would write).
fn run_client(
    node: &GpuNode,
    id: &str,
    devices: &str,
    token: &str,
    pipe_dir: &Path,
    as_root: AsRoot,
) -> (BTreeMap<String, Vec<String>>, Value) {
    let root_part = match as_root {
        AsRoot::Report => "\"$0\" report",
        AsRoot::TamperThenReport => "\"$0\" mps-tamper \"$MPS_HOST_DIR\"; \"$0\" report",
    };
    let options = RunOptions {
        annotations: vec![("cdi.k8s.io/mps".into(), devices.into())],
        env: vec![
            ("MPS_TOKEN".into(), token.into()),
            ("MPS_HOST_DIR".into(), pipe_dir.to_string_lossy().into_owned()),
        ],
        command: vec![
            "/bin/sh".into(),
            "-c".into(),
            format!("\"$0\" as-user {CLIENT_UID} /bin/sh -c \"$1\"; {root_part}"),
            PROBE_PATH.into(),
            CLIENT.into(),
        ],
        ..Default::default()
    };
    let out: RunResult = node
        .run(id, &options)
        .unwrap_or_else(|e| panic!("{id}: {e}\nshim log:\n{}", process::log_tail(&node.shim_log, 20)));
    assert_eq!(out.status, 0, "{id}: {} {}", out.stdout, out.stderr);
    let mut lines: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in out.stdout.lines().filter_map(|l| l.trim().strip_prefix("NVINJECT-MPS ")) {
        let (key, value) = line.split_once(' ').unwrap_or((line, ""));
        lines.entry(key.to_owned()).or_default().push(value.to_owned());
    }
    eprintln!("{id}: {lines:?}");
    (lines, out.report().clone())
}

/// What the host folder holds: each entry's type, mode, owner, size and link target.
fn snapshot(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            let t = m.file_type();
            let kind = if t.is_symlink() {
                format!("link->{}", std::fs::read_link(e.path()).unwrap().display())
            } else if t.is_socket() {
                "socket".into()
            } else if t.is_fifo() {
                "fifo".into()
            } else if t.is_dir() {
                "dir".into()
            } else {
                "file".into()
            };
            let size = if t.is_file() { m.len() } else { 0 };
            (
                e.file_name().to_string_lossy().into_owned(),
                format!("{kind} {:o} uid={} size={size}", m.mode() & 0o7777, m.uid()),
            )
        })
        .collect()
}

/// Rewrites the node's spec the way specs were before issue 32: the `mps` device's mount and
/// variable in the common edits, which every GPU container gets.
fn to_old_layout(node: &GpuNode) {
    let mut spec: Value = serde_json::from_slice(&std::fs::read(&node.spec_path).unwrap()).unwrap();
    let devices = spec["devices"].as_array_mut().unwrap();
    let at = devices.iter().position(|d| d["name"] == "mps").expect("the spec has the mps device");
    let mps = devices.remove(at);
    for key in ["mounts", "env"] {
        let add = mps["containerEdits"][key].as_array().unwrap().clone();
        spec["containerEdits"][key].as_array_mut().unwrap().extend(add);
    }
    std::fs::write(&node.spec_path, serde_json::to_vec(&spec).unwrap()).unwrap();
}

fn one<'a>(lines: &'a BTreeMap<String, Vec<String>>, key: &str) -> &'a str {
    match lines.get(key).map(Vec::as_slice) {
        Some([v]) => v,
        other => panic!("`{key}`: expected one line, got {other:?} in {lines:?}"),
    }
}

/// Where the spec mounts `dir` and sets `CUDA_MPS_*`: (common mount, common env, names of the
/// devices whose edits mount it, those devices' env).
fn spec_mps(node: &GpuNode, dir: &Path) -> (Option<Value>, Vec<String>, Vec<String>, Vec<String>) {
    let spec: Value = serde_json::from_slice(&std::fs::read(&node.spec_path).unwrap()).unwrap();
    let dir = dir.to_string_lossy();
    let mount = |edits: &Value| {
        edits["mounts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["hostPath"].as_str() == Some(&*dir))
            .cloned()
    };
    let env = |edits: &Value| -> Vec<String> {
        edits["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter(|e| e.starts_with("CUDA_MPS"))
            .map(str::to_owned)
            .collect()
    };
    let devices = spec["devices"].as_array().unwrap();
    let holders = devices.iter().filter(|d| mount(&d["containerEdits"]).is_some());
    let device_env = devices.iter().flat_map(|d| env(&d["containerEdits"])).collect();
    (
        mount(&spec["containerEdits"]),
        env(&spec["containerEdits"]),
        holders.filter_map(|d| d["name"].as_str().map(str::to_owned)).collect(),
        device_env,
    )
}

/// The container's mount at `dir` (`/proc/self/mountinfo` options), if any.
fn mounted_at(report: &Value, dir: &Path) -> Option<String> {
    report["mounts"]
        .as_array()?
        .iter()
        .find(|m| m["target"].as_str() == Some(&*dir.to_string_lossy()))
        .and_then(|m| m["options"].as_str().map(str::to_owned))
}

fn start_daemon(dir: &Path) -> MpsDaemon {
    // What a daemon answers depends on the request and the caller; the nonce proves the answer
    // came from this side.
    let server = nonce("server");
    let answer = move |r: &Received| format!("{server} {} for uid {}", r.message, r.uid);
    MpsDaemon::start(dir, Box::new(answer)).unwrap_or_else(|e| panic!("MPS stand-in: {e}"))
}

/// What a container that cannot see the folder reports: CUDA's default folder, nothing there, no
/// variable, no mount, and (when it tried) every tampering step failing for want of the path.
fn assert_folder_unseen(id: &str, lines: &BTreeMap<String, Vec<String>>, report: &Value, pipe_dir: &Path) {
    assert_eq!(one(lines, "uid"), "1000", "{id}");
    assert_eq!(one(lines, "dir"), "/tmp/nvidia-mps", "{id}: no CUDA_MPS_PIPE_DIRECTORY: CUDA's default");
    assert_eq!(one(lines, "host-dir"), "absent", "{id}");
    assert!(!lines.contains_key("file"), "{id}: the default pipe folder is empty: {lines:?}");
    assert_eq!(one(lines, "log"), "failed", "{id}");
    assert_eq!(lines["/tmp/nvidia-mps/control"], ["connect=ENOENT"], "{id}: {lines:?}");
    assert!(report["environ"].get("CUDA_MPS_PIPE_DIRECTORY").is_none(), "{id}: {}", report["environ"]);
    assert!(mounted_at(report, pipe_dir).is_none(), "{id}: {}", report["mounts"]);
}

#[test]
#[ignore = "needs root"]
fn only_containers_given_the_mps_device_reach_the_daemon() {
    nvinject_test_support::require_root("containerd and runc");
    let node = GpuNode::start(&NodeOptions::default()).unwrap_or_else(|e| panic!("node setup: {e}"));
    // Where a host daemon started with the defaults keeps its pipes; root's, as the daemon runs.
    let pipe_dir = node.driver_root.join("tmp/nvidia-mps");
    let meta = std::fs::metadata(&pipe_dir).unwrap();
    assert!(meta.is_dir(), "{}", pipe_dir.display());
    assert_eq!(meta.uid(), 0, "the pipe dir is root's");
    let dir = pipe_dir.to_string_lossy().into_owned();

    // 1. The node's spec was generated without --mps-pipe-dir: no MPS anywhere in it, the daemon
    //    is up on the host and the container cannot see it.
    let (mount, env, holders, device_env) = spec_mps(&node, &pipe_dir);
    assert!(
        mount.is_none() && env.is_empty() && holders.is_empty() && device_env.is_empty(),
        "MPS in a spec made without --mps-pipe-dir: {mount:?} {env:?} {holders:?} {device_env:?}"
    );
    let daemon = start_daemon(&pipe_dir);
    let (lines, report) =
        run_client(&node, "mps-off", "nvidia.com/gpu=0", &nonce("off"), &pipe_dir, AsRoot::Report);
    let seen: Seen = daemon.stop();
    assert_folder_unseen("mps-off", &lines, &report, &pipe_dir);
    assert!(seen.received.is_empty() && seen.log.is_empty(), "the daemon heard from the container: {seen:?}");

    // 2. With --mps-pipe-dir: the `mps` device mounts it read-write but nosuid, nodev, noexec,
    //    and names it; the common edits, which every GPU container gets, do neither.
    node.regenerate_spec(&[OsStr::new("--mps-pipe-dir"), pipe_dir.as_os_str()]).unwrap();
    let (mount, env, holders, device_env) = spec_mps(&node, &pipe_dir);
    assert!(mount.is_none() && env.is_empty(), "MPS in the common edits: {mount:?} {env:?}");
    assert_eq!(holders, ["mps"]);
    assert_eq!(device_env, [format!("CUDA_MPS_PIPE_DIRECTORY={dir}")]);
    let spec: Value = serde_json::from_slice(&std::fs::read(&node.spec_path).unwrap()).unwrap();
    let device = spec["devices"].as_array().unwrap().iter().find(|d| d["name"] == "mps").unwrap();
    let mount = &device["containerEdits"]["mounts"][0];
    assert_eq!(mount["containerPath"].as_str(), Some(dir.as_str()), "at the same path");
    let options: Vec<&str> = mount["options"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for want in ["rw", "nosuid", "nodev", "noexec"] {
        assert!(options.contains(&want), "{want} not in {options:?}");
    }

    // 3. A container given GPU 0 and the MPS device (what the device plugin hands an MPS-shared
    //    replica) is the daemon's client.
    let daemon = start_daemon(&pipe_dir);
    // A program the client may try to run from the pipe dir: noexec must stop it.
    std::fs::copy("/bin/true", pipe_dir.join("exec-check")).unwrap();
    let token = nonce("on");
    let given = format!("nvidia.com/gpu=0,{MPS_DEVICE}");
    let (lines, report) = run_client(&node, "mps-on", &given, &token, &pipe_dir, AsRoot::Report);

    // 4. A container given GPU 0 alone, on the same node, same spec, same running daemon: it does
    //    not see the folder and its root cannot touch it.
    let before = snapshot(&pipe_dir);
    let (denied, denied_report) = run_client(
        &node,
        "mps-denied",
        "nvidia.com/gpu=0",
        &nonce("denied"),
        &pipe_dir,
        AsRoot::TamperThenReport,
    );
    let after = snapshot(&pipe_dir);
    let seen = daemon.stop();
    eprintln!("daemon saw: {seen:?}");
    std::fs::remove_file(pipe_dir.join("exec-check")).unwrap();

    assert_folder_unseen("mps-denied", &denied, &denied_report, &pipe_dir);
    for step in ["unlink", "symlink", "mkfifo", "write"] {
        assert_eq!(one(&denied, &format!("tamper-{step}")), "ENOENT", "{step}: {denied:?}");
    }
    assert_eq!(after, before, "the host's MPS folder changed under a container not given the MPS device");
    for name in [mps::CONTROL, mps::CONTROL_PRIVILEGED, mps::LOG_FIFO, mps::CONTROL_LOCK, mps::PID_FILE] {
        assert!(before.contains_key(name), "{name} not in {before:?}");
    }
    assert!(before[mps::CONTROL].starts_with("socket "), "{before:?}");

    // 3, checked: the client's files, FIFO and socket, as before issue 32.
    assert_eq!(one(&lines, "uid"), "1000");
    assert_eq!(one(&lines, "dir"), dir);
    assert_eq!(one(&lines, "host-dir"), "present");
    // The daemon's files, as the client sees them through the mount: root's, types and modes kept.
    let files: Vec<&String> = lines.get("file").into_iter().flatten().collect();
    for (name, kind, mode) in [
        (mps::CONTROL, "socket", "666"),
        (mps::CONTROL_PRIVILEGED, "socket", "755"),
        (mps::LOG_FIFO, "fifo", "777"),
        (mps::CONTROL_LOCK, "regular empty file", "666"),
    ] {
        let want = format!("{dir}/{name} {kind} {mode} 0");
        assert!(files.iter().any(|f| **f == want), "{want} not in {files:?}");
    }
    // Client -> daemon through the FIFO; nothing from the denied container.
    assert_eq!(one(&lines, "log"), "written");
    assert_eq!(seen.log, format!("client-log {token}\n"));
    // Client <-> daemon through the control socket: the daemon got the client's request from
    // uid 1000 and the client got the daemon's answer; one request in all.
    let request = format!("get_server_list {token}");
    let control: Vec<&Received> = seen.received.iter().filter(|r| r.socket == mps::CONTROL).collect();
    assert_eq!(control.len(), 1, "{seen:?}");
    assert_eq!((control[0].uid, control[0].message.as_str()), (CLIENT_UID, request.as_str()));
    assert!(control[0].pid > 0 && control[0].pid as u32 != std::process::id());
    let reply = lines[&format!("{dir}/{}", mps::CONTROL)].clone();
    assert_eq!(reply.len(), 1, "{reply:?}");
    let answer = reply[0].strip_prefix("reply=").unwrap_or_else(|| panic!("no answer: {reply:?}"));
    assert!(
        answer.starts_with("server-") && answer.ends_with(&format!(" {request} for uid {CLIENT_UID}")),
        "{answer}"
    );
    // The privileged socket stays root's, as on the host.
    assert_eq!(lines[&format!("{dir}/{}", mps::CONTROL_PRIVILEGED)], ["connect=EACCES"]);
    assert!(!seen.received.iter().any(|r| r.socket == mps::CONTROL_PRIVILEGED), "{seen:?}");
    // noexec holds (a program elsewhere in the image runs).
    assert_eq!(one(&lines, "exec"), "126");
    assert_eq!(one(&lines, "exec-control"), "0");
    // What the kernel says about the mount, from inside.
    let options =
        mounted_at(&report, &pipe_dir).unwrap_or_else(|| panic!("{dir} not mounted: {}", report["mounts"]));
    let options: Vec<&str> = options.split(',').collect();
    for want in ["rw", "nosuid", "nodev", "noexec"] {
        assert!(options.contains(&want), "{want} not in the container's mount options {options:?}");
    }
    assert_eq!(report["environ"]["CUDA_MPS_PIPE_DIRECTORY"].as_str(), Some(dir.as_str()));

    // 5. The MPS device alone (no GPU) is refused at Create, naming it; the folder is untouched.
    let daemon = start_daemon(&pipe_dir);
    let before = snapshot(&pipe_dir);
    let alone = node
        .run(
            "mps-alone",
            &RunOptions {
                annotations: vec![("cdi.k8s.io/mps".into(), MPS_DEVICE.into())],
                command: vec![PROBE_PATH.into(), "mps-tamper".into(), dir.clone()],
                ..Default::default()
            },
        )
        .unwrap();
    assert_ne!(alone.status, 0, "the MPS device alone was given: {}", alone.stdout);
    assert!(!alone.stdout.contains("tamper-"), "the container ran: {}", alone.stdout);
    let why = format!("{}{}", alone.stderr, process::log_tail(&node.shim_log, 20));
    assert!(why.contains(MPS_DEVICE) && why.contains("without a GPU"), "{why}");
    assert_eq!(snapshot(&pipe_dir), before);

    // 6. Positive control: the layout before issue 32 (the folder in the common edits) gives the
    //    very request of step 4 the folder, and its root's tampering lands on the host: the
    //    checks above can fail.
    to_old_layout(&node);
    let (exposed, exposed_report) = run_client(
        &node,
        "mps-old-layout",
        "nvidia.com/gpu=0",
        &nonce("old"),
        &pipe_dir,
        AsRoot::TamperThenReport,
    );
    let after = snapshot(&pipe_dir);
    let seen = daemon.stop();
    assert_eq!(one(&exposed, "host-dir"), "present", "{exposed:?}");
    assert_eq!(exposed_report["environ"]["CUDA_MPS_PIPE_DIRECTORY"].as_str(), Some(dir.as_str()));
    assert_eq!(one(&exposed, "log"), "written");
    assert!(
        !seen.log.is_empty() && !seen.received.is_empty(),
        "the old layout's container reached the daemon: {seen:?}"
    );
    for step in ["unlink", "symlink", "mkfifo", "write"] {
        assert_eq!(one(&exposed, &format!("tamper-{step}")), "ok", "{step}: {exposed:?}");
    }
    assert_ne!(after, before);
    assert_eq!(after[mps::CONTROL].split(' ').next(), Some("link->/etc/shadow"), "{after:?}");
    assert!(after["planted-fifo"].starts_with("fifo "), "{after:?}");
    assert!(
        after["planted-file"].starts_with("file ") && after["planted-file"].contains("uid=0"),
        "{after:?}"
    );
    for planted in ["planted-fifo", "planted-file"] {
        std::fs::remove_file(pipe_dir.join(planted)).unwrap();
    }
    node.regenerate_spec(&[OsStr::new("--mps-pipe-dir"), pipe_dir.as_os_str()]).unwrap();

    node.assert_no_leftovers(&["mps-off", "mps-on", "mps-denied", "mps-alone", "mps-old-layout"]);
}
