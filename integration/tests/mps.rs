//! Issue 12 on real parts: an MPS client in a GPU container reaches the host's MPS control daemon
//! through the pipe directory the spec mounts, and only when the spec was generated with
//! `--mps-pipe-dir`. The host side is [`nvinject_node_harness::mps::MpsDaemon`]: the files NVIDIA's
//! daemon keeps in its `CUDA_MPS_PIPE_DIRECTORY` (the `control` and `control_privileged`
//! seqpacket sockets, the `log` FIFO, the lock and PID files), owned by root, in the simulated
//! node's `tmp/nvidia-mps`, with a thread answering. The container (our shim, a private
//! containerd and runc, one GPU) runs the client's part as uid 1000 with the image's own `sh`,
//! `stat` and `nvinject-probe mps-client` (a seqpacket connect/send/receive: a minimal image has no
//! socat), then the probe's report as root. Needs root (CI runs as root).

use std::collections::BTreeMap;
use std::ffi::OsStr;
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

/// Something the container cannot guess: it must come through the pipes.
fn nonce(what: &str) -> String {
    let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    format!("{what}-{:x}-{:x}", std::process::id(), t.as_nanos())
}

/// Runs the client's part (as uid 1000) and the report (as root) in one container given GPU 0.
fn run_client(
    node: &GpuNode,
    id: &str,
    token: &str,
    pipe_dir: &Path,
) -> (BTreeMap<String, Vec<String>>, Value) {
    let options = RunOptions {
        annotations: vec![("cdi.k8s.io/mps".into(), "nvidia.com/gpu=0".into())],
        env: vec![
            ("MPS_TOKEN".into(), token.into()),
            ("MPS_HOST_DIR".into(), pipe_dir.to_string_lossy().into_owned()),
        ],
        command: vec![
            "/bin/sh".into(),
            "-c".into(),
            format!("\"$0\" as-user {CLIENT_UID} /bin/sh -c \"$1\"; \"$0\" report"),
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

fn one<'a>(lines: &'a BTreeMap<String, Vec<String>>, key: &str) -> &'a str {
    match lines.get(key).map(Vec::as_slice) {
        Some([v]) => v,
        other => panic!("`{key}`: expected one line, got {other:?} in {lines:?}"),
    }
}

/// The spec's common mount of `dir` and its `CUDA_MPS_PIPE_DIRECTORY`, if any.
fn spec_mps(node: &GpuNode, dir: &Path) -> (Option<Value>, Vec<String>) {
    let spec: Value = serde_json::from_slice(&std::fs::read(&node.spec_path).unwrap()).unwrap();
    let edits = &spec["containerEdits"];
    let mount = edits["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["hostPath"].as_str() == Some(&*dir.to_string_lossy()))
        .cloned();
    let env = edits["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|e| e.starts_with("CUDA_MPS"))
        .map(str::to_owned)
        .collect();
    (mount, env)
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

#[test]
#[ignore = "needs root"]
fn an_mps_client_reaches_the_daemon_only_where_the_pipe_dir_is_configured() {
    nvinject_test_support::require_root("containerd and runc");
    let node = GpuNode::start(&NodeOptions::default()).unwrap_or_else(|e| panic!("node setup: {e}"));
    // Where a host daemon started with the defaults keeps its pipes; root's, as the daemon runs.
    let pipe_dir = node.driver_root.join("tmp/nvidia-mps");
    let meta = std::fs::metadata(&pipe_dir).unwrap();
    assert!(meta.is_dir(), "{}", pipe_dir.display());
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 0, "the pipe dir is root's");

    // 1. The node's spec was generated without --mps-pipe-dir: the daemon is up on the host and
    //    the container cannot see it.
    let (mount, env) = spec_mps(&node, &pipe_dir);
    assert!(
        mount.is_none() && env.is_empty(),
        "MPS in a spec made without --mps-pipe-dir: {mount:?} {env:?}"
    );
    let daemon = start_daemon(&pipe_dir);
    let token = nonce("off");
    let (lines, report) = run_client(&node, "mps-off", &token, &pipe_dir);
    let seen: Seen = daemon.stop();
    assert_eq!(one(&lines, "uid"), "1000");
    assert_eq!(one(&lines, "dir"), "/tmp/nvidia-mps", "no CUDA_MPS_PIPE_DIRECTORY: CUDA's default");
    assert_eq!(one(&lines, "host-dir"), "absent");
    assert!(!lines.contains_key("file"), "the default pipe folder is empty: {lines:?}");
    assert_eq!(one(&lines, "log"), "failed");
    assert_eq!(lines["/tmp/nvidia-mps/control"], ["connect=ENOENT"], "{lines:?}");
    assert!(report["environ"].get("CUDA_MPS_PIPE_DIRECTORY").is_none(), "{}", report["environ"]);
    assert!(mounted_at(&report, &pipe_dir).is_none());
    assert!(seen.received.is_empty() && seen.log.is_empty(), "the daemon heard from the container: {seen:?}");

    // 2. With --mps-pipe-dir: mounted read-write but nosuid, nodev, noexec, and named.
    node.regenerate_spec(&[OsStr::new("--mps-pipe-dir"), pipe_dir.as_os_str()]).unwrap();
    let (mount, env) = spec_mps(&node, &pipe_dir);
    let mount = mount.expect("the spec mounts the pipe dir");
    assert_eq!(mount["containerPath"].as_str(), Some(&*pipe_dir.to_string_lossy()), "at the same path");
    let options: Vec<&str> = mount["options"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for want in ["rw", "nosuid", "nodev", "noexec"] {
        assert!(options.contains(&want), "{want} not in {options:?}");
    }
    assert_eq!(env, [format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe_dir.display())]);

    let daemon = start_daemon(&pipe_dir);
    // A program the client may try to run from the pipe dir: noexec must stop it.
    std::fs::copy("/bin/true", pipe_dir.join("exec-check")).unwrap();
    let token = nonce("on");
    let (lines, report) = run_client(&node, "mps-on", &token, &pipe_dir);
    let seen = daemon.stop();
    eprintln!("daemon saw: {seen:?}");
    std::fs::remove_file(pipe_dir.join("exec-check")).unwrap();
    let dir = pipe_dir.to_string_lossy().into_owned();
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
    // Client -> daemon through the FIFO.
    assert_eq!(one(&lines, "log"), "written");
    assert_eq!(seen.log, format!("client-log {token}\n"));
    // Client <-> daemon through the control socket: the daemon got the client's request from
    // uid 1000 and the client got the daemon's answer.
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

    node.assert_no_leftovers(&["mps-off", "mps-on"]);
}
