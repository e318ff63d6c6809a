//! Issue 11's runtime attack classes, through a real containerd 1.6, our runtime
//! (`io.containerd.nvinject.v2`) and runc on the simulated GPU node: each test plays the attacker,
//! asserts the harm did not happen, and carries a positive control showing the same payload does
//! harm where the defence is absent, so the test can fail. Needs root, gcc and libc6-dev.
//!
//! - [`image_env_never_reaches_a_root_hook`]: reproduction 1 (CVE-2025-23266 class: image env and
//!   image files reaching the root hooks), with the other loader variables and `PATH`;
//! - [`the_spec_lock_cannot_be_held_or_hijacked_by_others`]: reproduction 5 (lock DoS);
//! - [`hostile_spec_files_cost_nothing_and_are_named`]: reproduction 6 (parser cost), for files of
//!   other vendors and of our own kind;
//! - [`untrusted_specs_never_run_their_hooks_and_foreign_hooks_are_named`]: issue 32 item 2 (spec
//!   trust): a spec others may write, one owned by `nobody`, one dropped by `nobody` into a spec
//!   folder anyone may write; and the create log naming another tool's hooks.
//!
//! Every wait is bounded, so a hang fails the test; no test asserts on wall time. The tests run one
//! at a time (two CPU cores, and the host's `/run/containerd/s`).

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use nvinject_image_tool::image::ImageSpec;
use nvinject_node_harness::attack::{self, Bounded, Check, CtrRun, ImageFile, Payloads};
use nvinject_node_harness::node::{GpuNode, NodeOptions, PROBE_IMAGE};
use nvinject_node_harness::process;
use serde_json::Value;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Upper bound for one `ctr run` (a hang fails the test; a normal run takes seconds).
const RUN_WAIT: Duration = Duration::from_secs(120);
/// Upper bound for shims to go after a container.
const SHIM_WAIT: Duration = Duration::from_secs(20);
const GPU0: &str = "nvidia.com/gpu=0";
const NOBODY: u32 = 65534;

fn node(options: &NodeOptions) -> GpuNode {
    GpuNode::start(options).unwrap_or_else(|e| panic!("node setup: {e}"))
}

fn run(node: &GpuNode, id: &str, r: &CtrRun) -> Bounded {
    attack::ctr_run(node, id, r, RUN_WAIT)
        .unwrap_or_else(|e| panic!("{id}: {e}\nshim log:\n{}", process::log_tail(&node.shim_log, 20)))
}

fn check_of(id: &str, out: &Bounded) -> Check {
    assert_eq!(out.status, 0, "{id}: ctr failed: {}\n{}", out.stderr, out.stdout);
    attack::parse_check(&out.stdout)
        .unwrap_or_else(|| panic!("{id}: no check line: {} / {}", out.stdout, out.stderr))
}

fn assert_no_shims(node: &GpuNode, what: &str) {
    let left = attack::shims_left(node, SHIM_WAIT);
    assert!(left.is_empty(), "{what}: shims or proxies left: {left:?}");
}

fn sh(script: &str) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), script.into()]
}

// ---------------------------------------------------------------------------------------------
// 1. Image env reaching a root hook
// ---------------------------------------------------------------------------------------------

/// The attacker's files, laid out as in the image (relative to its root), so the host-side controls
/// can use the very same `/proc/self/cwd/...` values with their working directory set to this tree,
/// as a hook's is the container rootfs.
fn evil_tree(p: &Payloads) -> Vec<ImageFile> {
    let evil = |path: &str| ImageFile::copy(path, &p.evil_so).unwrap();
    let pwn = format!(
        "#!/bin/sh\necho ran > {}/pwned-path 2>/dev/null\necho ran > ./pwned-path 2>/dev/null\nexit 0\n",
        p.marker_dir.display()
    );
    vec![
        ImageFile::copy("/check", &p.check).unwrap(),
        evil("/usr/local/bin/evil.so"),
        // An LD_LIBRARY_PATH directory whose libgcc_s.so.1 (what a dynamic Rust hook loads) is ours,
        ImageFile::copy("/evil-gcc/victim", &p.victim).unwrap(),
        evil("/evil-gcc/libgcc_s.so.1"),
        // and one whose libc.so.6 is.
        evil("/evil-libc/libc.so.6"),
        evil("/gconv/evil.so"),
        ImageFile::text(
            "/gconv/gconv-modules",
            "module EVIL// INTERNAL evil 1\nmodule INTERNAL EVIL// evil 1\n",
            0o644,
        ),
        // Found through an image-controlled PATH.
        ImageFile::text("/usr/local/bin/nvinject-pwn", &pwn, 0o755),
        // And at the root, for `PATH=/proc/self/cwd`, also under the name of the program
        // update-ldcache used to run.
        ImageFile::text("/nvinject-pwn", &pwn, 0o755),
        ImageFile::text("/ldconfig", &pwn, 0o755),
    ]
}

fn lay_out(tree: &[ImageFile], root: &Path) {
    for f in tree {
        let dest = root.join(f.path.strip_prefix("/").unwrap());
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        fs::write(&dest, &f.content).unwrap();
        fs::set_permissions(&dest, fs::Permissions::from_mode(f.mode)).unwrap();
    }
}

const CWD_PRELOAD: &str = "LD_PRELOAD=/proc/self/cwd/usr/local/bin/evil.so";
const CWD_AUDIT: &str = "LD_AUDIT=/proc/self/cwd/usr/local/bin/evil.so";
const CWD_GCC: &str = "LD_LIBRARY_PATH=/proc/self/cwd/evil-gcc";
const CWD_LIBC: &str = "LD_LIBRARY_PATH=/proc/self/cwd/evil-libc";
const CWD_GCONV: &str = "GCONV_PATH=/proc/self/cwd/gconv";
const CWD_PATH: &str = "PATH=/proc/self/cwd/usr/local/bin:/usr/bin:/bin";
const CWD_ROOT_PATH: &str = "PATH=/proc/self/cwd";

/// A host program run the way runc runs a hook (root, working directory the attacker's tree, only
/// `env`); returns the marker files it left, and its stderr for messages.
fn host_control(p: &Payloads, tree: &Path, env: &str, program: &[String]) -> (Vec<String>, String) {
    attack::clear_markers(&p.marker_dir);
    let (key, value) = env.split_once('=').unwrap();
    let mut cmd = Command::new(&program[0]);
    cmd.args(&program[1..]).env_clear().env(key, value).current_dir(tree);
    let out = attack::run_bounded(&mut cmd, Duration::from_secs(30), tree, "control").unwrap();
    let found = attack::markers(&p.marker_dir);
    attack::clear_markers(&p.marker_dir);
    (found, out.stderr)
}

/// Executable names a container's own processes may leave in its `/` (the image may run its own
/// code in itself); a hook's name there, or any marker on the host, is the escape.
const CONTAINER_PROGRAMS: [&str; 5] = ["sh", "dash", "true", "victim", "path"];

fn assert_contained(p: &Payloads, id: &str, check: &Check) {
    let host = attack::markers(&p.marker_dir);
    assert!(host.is_empty(), "{id}: image code ran on the host: {host:?}");
    assert!(check.gpu0, "{id}: the container did not get its GPU: {check:?}");
    assert!(check.ldconf, "{id}: update-ldcache did not run: {check:?}");
    for name in &check.pwned {
        assert!(CONTAINER_PROGRAMS.contains(&name.as_str()), "{id}: `{name}` ran image code in the rootfs");
    }
}

#[test]
#[ignore = "needs root"]
fn image_env_never_reaches_a_root_hook() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = node(&NodeOptions::default());
    let work = node.base().join("attack");
    let p = attack::build_payloads(&work.join("payloads"), &work.join("markers")).unwrap();
    let tree = evil_tree(&p);
    let host_tree = work.join("tree");
    lay_out(&tree, &host_tree);

    // Positive controls: every payload does run code as root on the host when a dynamic program
    // gets the value with the attacker's tree as its working directory, as a hook would.
    let victim = host_tree.join("evil-gcc/victim").to_string_lossy().into_owned();
    let abs = format!("LD_PRELOAD={}", p.evil_so.display());
    let cases: [(&str, Vec<&str>, &str); 7] = [
        (CWD_PRELOAD, vec!["/bin/true"], "pwned-true"),
        (&abs, vec!["/bin/true"], "pwned-true"),
        (CWD_AUDIT, vec!["/bin/true"], "pwned-true"),
        (CWD_GCC, vec![&victim], "pwned-victim"),
        (CWD_GCONV, vec!["/usr/bin/iconv", "-f", "EVIL", "-t", "UTF-8", "/dev/null"], "pwned-iconv"),
        (CWD_PATH, vec!["/bin/sh", "-c", "nvinject-pwn"], "pwned-path"),
        (CWD_ROOT_PATH, vec!["/bin/sh", "-c", "ldconfig"], "pwned-path"),
    ];
    for (env, program, marker) in &cases {
        let program: Vec<String> = program.iter().map(|s| (*s).to_owned()).collect();
        let (found, stderr) = host_control(&p, &host_tree, env, &program);
        assert_eq!(found, [*marker], "control {env} {program:?}: {stderr}");
    }

    let image = |name: &str, env: Vec<String>, extra: &[ImageFile]| {
        let spec = ImageSpec { name: name.into(), programs: vec![], cmd: vec!["/check".into()], env };
        let tar = work.join(format!("{}.tar", name.replace(['/', ':'], "_")));
        let built = attack::build_image(&spec, &[tree.as_slice(), extra].concat(), &tar).unwrap();
        node.containerd.import(&built).unwrap();
    };
    let evil = "docker.io/nvinject/evil:latest";
    image(evil, vec!["PATH=/usr/local/bin:/usr/bin:/bin".into()], &[]);

    // --env: each variable, with a command that shows it is live inside the container.
    let then_check = |pre: &str| sh(&format!("{pre}; exec /check"));
    let env_cases: Vec<(&str, String, Vec<String>, Option<&str>)> = vec![
        ("e-preload", CWD_PRELOAD.into(), then_check("/bin/true"), Some("true")),
        ("e-preload-abs", abs.clone(), then_check("/bin/true"), None),
        // Inside the container glibc refuses this audit path ("cannot be loaded as audit interface"),
        // so only the host control shows this payload live.
        ("e-audit", CWD_AUDIT.into(), then_check("/bin/true"), None),
        ("e-libgcc", CWD_GCC.into(), then_check("/evil-gcc/victim"), Some("victim")),
        // Every dynamic program breaks on that libc, so the static checker alone.
        ("e-libc", CWD_LIBC.into(), vec!["/check".into()], None),
        ("e-gconv", CWD_GCONV.into(), then_check("/bin/true"), None),
        ("e-path", CWD_PATH.into(), then_check("nvinject-pwn"), Some("path")),
        ("e-path-root", CWD_ROOT_PATH.into(), then_check("ldconfig"), Some("path")),
    ];
    for (id, env, command, live) in &env_cases {
        attack::clear_markers(&p.marker_dir);
        let r = CtrRun {
            image: evil.into(),
            devices: GPU0.into(),
            env: vec![env.clone()],
            command: command.clone(),
        };
        let out = run(&node, id, &r);
        let check = check_of(id, &out);
        assert_contained(&p, id, &check);
        if let Some(live) = live {
            assert!(
                check.pwned.iter().any(|n| n == live),
                "{id}: {env} was not live in the container: {check:?}; stderr: {}",
                out.stderr
            );
        }
    }

    // The same variables in the image config's Env (not --env).
    let in_image = "docker.io/nvinject/evil-env:latest";
    image(in_image, vec![CWD_PRELOAD.into(), CWD_AUDIT.into(), CWD_GCONV.into(), CWD_PATH.into()], &[]);
    let libpath = "docker.io/nvinject/evil-libpath:latest";
    image(libpath, vec![format!("{CWD_LIBC}:/proc/self/cwd/evil-gcc")], &[]);
    let r = CtrRun {
        image: in_image.into(),
        devices: GPU0.into(),
        env: vec![],
        command: then_check("/bin/true; nvinject-pwn"),
    };
    let check = check_of("i-env", &run(&node, "i-env", &r));
    assert_contained(&p, "i-env", &check);
    assert!(
        check.pwned.contains(&"true".to_owned()) && check.pwned.contains(&"path".to_owned()),
        "{check:?}"
    );
    let r = CtrRun { image: libpath.into(), devices: GPU0.into(), env: vec![], command: vec![] };
    assert_contained(&p, "i-libpath", &check_of("i-libpath", &run(&node, "i-libpath", &r)));
    // An image /etc/ld.so.preload: every dynamic program in the container loads it (the control);
    // a hook, still in the host's root before pivot_root, never reads the image's.
    let preload_file = "docker.io/nvinject/evil-preload-file:latest";
    let listing = ImageFile::text("/etc/ld.so.preload", "/usr/local/bin/evil.so\n", 0o644);
    image(preload_file, vec!["PATH=/usr/local/bin:/usr/bin:/bin".into()], &[listing]);
    let r = CtrRun {
        image: preload_file.into(),
        devices: GPU0.into(),
        env: vec![],
        command: then_check("/bin/true"),
    };
    let check = check_of("i-preload-file", &run(&node, "i-preload-file", &r));
    assert_contained(&p, "i-preload-file", &check);
    assert!(check.pwned.contains(&"true".to_owned()), "the image's ld.so.preload was not live: {check:?}");

    // Another tool's spec whose hooks set no env: the container's env must not reach them (cdi's
    // apply gives them a fixed PATH only). The same hooks given the attacker's values explicitly do
    // run image code on the host through runc: the positive controls.
    let hook = |point: &str, path: &str, args: &[&str], env: Option<&str>| {
        let mut h = serde_json::json!({"hookName": point, "path": path});
        if !args.is_empty() {
            h["args"] = serde_json::json!(args);
        }
        if let Some(e) = env {
            h["env"] = serde_json::json!([e]);
        }
        h
    };
    // Every hook point runc knows: createContainer hooks run before pivot_root with the rootfs as
    // their working directory; the others run in the runtime's or the container's root.
    const POINTS: [&str; 6] =
        ["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"];
    let at_every_point = |path: &str, args: &[&str]| -> Vec<Value> {
        POINTS.iter().map(|point| hook(point, path, args, None)).collect()
    };
    let pwn_args = ["sh", "-c", "nvinject-pwn 2>/dev/null || true"];
    let devices: [(&str, Vec<Value>); 4] = [
        ("preload", at_every_point("/bin/true", &[])),
        ("path", at_every_point("/bin/sh", &pwn_args)),
        ("preload-set", vec![hook("createContainer", "/bin/true", &[], Some(CWD_PRELOAD))]),
        ("path-set", vec![hook("createContainer", "/bin/sh", &pwn_args, Some(CWD_PATH))]),
    ];
    let other = serde_json::json!({
        "cdiVersion": "0.6.0",
        "kind": "example.com/dev",
        "devices": devices
            .iter()
            .map(|(name, hooks)| serde_json::json!({"name": name, "containerEdits": {"hooks": hooks}}))
            .collect::<Vec<_>>(),
    });
    fs::write(node.cdi_dir.join("example.com-dev.json"), serde_json::to_vec(&other).unwrap()).unwrap();
    for (id, device, env) in [("o-preload", "preload", CWD_PRELOAD), ("o-path", "path", CWD_PATH)] {
        attack::clear_markers(&p.marker_dir);
        let r = CtrRun {
            image: evil.into(),
            devices: format!("{GPU0},example.com/dev={device}"),
            env: vec![env.into()],
            command: vec!["/check".into()],
        };
        assert_contained(&p, id, &check_of(id, &run(&node, id, &r)));
    }
    for (id, device, marker) in
        [("o-preload-set", "preload-set", "pwned-true"), ("o-path-set", "path-set", "pwned-path")]
    {
        attack::clear_markers(&p.marker_dir);
        let r = CtrRun {
            image: evil.into(),
            devices: format!("{GPU0},example.com/dev={device}"),
            env: vec![],
            command: vec!["/check".into()],
        };
        let check = check_of(id, &run(&node, id, &r));
        assert_eq!(attack::markers(&p.marker_dir), [marker], "{id}: the positive control did not fire");
        assert!(check.gpu0, "{id}: {check:?}");
    }
    attack::clear_markers(&p.marker_dir);
    assert_no_shims(&node, "after the env attacks");
}

// ---------------------------------------------------------------------------------------------
// 2. Lock DoS
// ---------------------------------------------------------------------------------------------

/// Marks the node's spec as written for another driver, so the next GPU Create regenerates it
/// under the spec lock.
fn make_stale(node: &GpuNode) {
    let mut spec: Value = serde_json::from_slice(&fs::read(&node.spec_path).unwrap()).unwrap();
    spec["annotations"]["nvinject.io/driver-version"] = Value::String("1.0.0-stale".into());
    fs::write(&node.spec_path, serde_json::to_vec(&spec).unwrap()).unwrap();
}

fn regenerated(node: &GpuNode) -> bool {
    let spec: Value = serde_json::from_slice(&fs::read(&node.spec_path).unwrap()).unwrap();
    spec["annotations"]["nvinject.io/driver-version"] != "1.0.0-stale"
}

/// `flock -n <path> /bin/true` as `nobody`.
fn nobody_flock(path: &Path, scratch: &Path) -> Bounded {
    let mut cmd = Command::new("/usr/bin/flock");
    cmd.arg("-n").arg(path).arg("/bin/true").uid(NOBODY).gid(NOBODY);
    attack::run_bounded(&mut cmd, Duration::from_secs(30), scratch, "nobody-flock").unwrap()
}

fn gpu_run(node: &GpuNode, id: &str) -> Bounded {
    let r = CtrRun {
        image: PROBE_IMAGE.into(),
        devices: GPU0.into(),
        env: vec![],
        command: vec!["/bin/true".into()],
    };
    run(node, id, &r)
}

/// A GPU Create with a stale spec that must be refused, naming `needle` and `also`; nothing may be
/// left behind.
fn assert_refused(node: &GpuNode, id: &str, needles: &[&str]) {
    make_stale(node);
    let out = gpu_run(node, id);
    assert_ne!(out.status, 0, "{id}: the container started: {}", out.stdout);
    for needle in needles {
        assert!(out.stderr.contains(needle), "{id}: `{needle}` missing from ctr's error: {}", out.stderr);
    }
    assert!(!regenerated(node), "{id}: the spec was regenerated without the lock");
    assert_no_shims(node, id);
    let listed = process::run(node.containerd.ctr().args(["containers", "list", "-q"])).unwrap();
    if String::from_utf8_lossy(&listed.stdout).lines().any(|l| l.trim() == id) {
        process::run(node.containerd.ctr().args(["containers", "delete", id])).unwrap();
    }
    let tasks = process::run(node.containerd.ctr().args(["tasks", "list", "-q"])).unwrap();
    assert!(String::from_utf8_lossy(&tasks.stdout).trim().is_empty(), "{id}: tasks left");
}

fn assert_starts(node: &GpuNode, id: &str) {
    make_stale(node);
    let out = gpu_run(node, id);
    assert_eq!(out.status, 0, "{id}: {}", out.stderr);
    assert!(regenerated(node), "{id}: the stale spec was not regenerated");
    assert_no_shims(node, id);
}

#[test]
#[ignore = "needs root"]
fn the_spec_lock_cannot_be_held_or_hijacked_by_others() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    // A lock directory whose parent anyone may enter, so only its own modes keep `nobody` out.
    let parent = tempfile::Builder::new().prefix("nvinject-locks-").tempdir_in("/tmp").unwrap();
    fs::set_permissions(parent.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let lock_dir = parent.path().join("locks");
    let node = node(&NodeOptions {
        lock_dir: Some(lock_dir.clone()),
        config_extra: "lock-timeout-secs = 2\n".into(),
        ..Default::default()
    });
    let name = format!("{}.lock", node.spec_path.to_string_lossy().trim_start_matches('/').replace('/', "_"));
    let lock = lock_dir.join(&name);
    let lock_text = lock.to_string_lossy().into_owned();
    let dir_text = lock_dir.to_string_lossy().into_owned();

    assert_starts(&node, "l-first");
    let dir_meta = fs::symlink_metadata(&lock_dir).unwrap();
    assert!(dir_meta.is_dir() && dir_meta.uid() == 0 && dir_meta.mode() & 0o7777 == 0o700, "{dir_meta:?}");
    let meta = fs::symlink_metadata(&lock).unwrap();
    assert!(meta.is_file() && meta.uid() == 0 && meta.mode() & 0o7777 == 0o600, "{meta:?}");

    // (a) `nobody` can neither take the lock nor the directory. Control: the same command takes a
    // lock laid out as before the fix (0644 in a world-readable directory).
    for target in [&lock, &lock_dir] {
        let out = nobody_flock(target, node.base());
        assert!(out.status != 0 && out.stderr.contains("Permission denied"), "{}: {out:?}", target.display());
    }
    let open = parent.path().join("old-layout.lock");
    fs::write(&open, "").unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o644)).unwrap();
    let out = nobody_flock(&open, node.base());
    assert_eq!(out.status, 0, "control: nobody takes an 0644 lock: {out:?}");

    // (b) Held by someone else (here root itself): the Create fails after the configured wait,
    // naming the lock, with nothing left behind; released, the next GPU container starts.
    let file = fs::OpenOptions::new().read(true).write(true).open(&lock).unwrap();
    let held = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).unwrap();
    assert_refused(&node, "l-held", &[&lock_text, "lock-timeout-secs"]);
    drop(held);
    assert_starts(&node, "l-released");

    // Planted lock files: never followed, opened without blocking, refused by name.
    let decoy = parent.path().join("decoy");
    fs::write(&decoy, "decoy").unwrap();
    fs::set_permissions(&decoy, fs::Permissions::from_mode(0o644)).unwrap();
    fs::remove_file(&lock).unwrap();
    std::os::unix::fs::symlink(&decoy, &lock).unwrap();
    assert_refused(&node, "l-symlink", &[&lock_text, "symlink is refused"]);
    assert_eq!(fs::read(&decoy).unwrap(), b"decoy");
    assert_eq!(fs::metadata(&decoy).unwrap().mode() & 0o7777, 0o644, "the link target's mode was changed");
    fs::remove_file(&lock).unwrap();
    nix::unistd::mkfifo(&lock, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    assert_refused(&node, "l-fifo", &[&lock_text, "not a regular file"]);
    fs::remove_file(&lock).unwrap();
    fs::write(&lock, "").unwrap();
    std::os::unix::fs::chown(&lock, Some(NOBODY), Some(NOBODY)).unwrap();
    assert_refused(&node, "l-foreign-file", &[&lock_text, "owned by us"]);
    fs::remove_file(&lock).unwrap();

    // Planted lock directories: another user's, or a link to one, is refused; one of ours left
    // loose (0777, an old 0666 lock in it) is narrowed before use.
    fs::remove_dir(&lock_dir).unwrap();
    fs::create_dir(&lock_dir).unwrap();
    std::os::unix::fs::chown(&lock_dir, Some(NOBODY), Some(NOBODY)).unwrap();
    assert_refused(&node, "l-foreign-dir", &[&dir_text, "owned by uid 0"]);
    fs::remove_dir(&lock_dir).unwrap();
    let elsewhere = parent.path().join("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &lock_dir).unwrap();
    assert_refused(&node, "l-dir-link", &[&dir_text, "real directory"]);
    assert!(attack::markers(&elsewhere).is_empty(), "a lock was made through the link");
    fs::remove_file(&lock_dir).unwrap();
    fs::create_dir(&lock_dir).unwrap();
    fs::set_permissions(&lock_dir, fs::Permissions::from_mode(0o777)).unwrap();
    fs::write(&lock, "").unwrap();
    fs::set_permissions(&lock, fs::Permissions::from_mode(0o666)).unwrap();
    assert_starts(&node, "l-narrowed");
    assert_eq!(fs::metadata(&lock_dir).unwrap().mode() & 0o7777, 0o700);
    assert_eq!(fs::metadata(&lock).unwrap().mode() & 0o7777, 0o600);
    let out = nobody_flock(&lock, node.base());
    assert!(out.status != 0 && out.stderr.contains("Permission denied"), "{out:?}");
}

// ---------------------------------------------------------------------------------------------
// 3. Hostile spec files
// ---------------------------------------------------------------------------------------------

fn deep_yaml(kind: &str) -> String {
    format!("cdiVersion: 0.5.0\nkind: {kind}\ndevices: {}\n", "[".repeat(100_000))
}

/// A 4 KiB string anchored once and aliased until the file is 400 KB (about 400 MB once expanded).
/// A typed spec refuses a billion-laughs tree of nested sequences at its first wrong type already;
/// string aliases in a list of strings are well-typed, so only the alias budget stops them.
fn alias_bomb(kind: &str) -> String {
    let mut s = format!(
        "cdiVersion: 0.5.0\nkind: {kind}\nannotations:\n  a0: &a0 \"{}\"\ncontainerEdits:\n  env: [",
        "x".repeat(4096)
    );
    while s.len() < 400 * 1024 {
        s.push_str("*a0, ");
    }
    s.push_str("*a0]\ndevices: []\n");
    s
}

fn gpu_check(node: &GpuNode, id: &str) -> Bounded {
    let r = CtrRun {
        image: PROBE_IMAGE.into(),
        devices: GPU0.into(),
        env: vec![],
        command: sh("test -c /dev/nvidia0 && echo GPU-OK"),
    };
    run(node, id, &r)
}

#[test]
#[ignore = "needs root"]
fn hostile_spec_files_cost_nothing_and_are_named() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let node = node(&NodeOptions::default());
    let dir = node.cdi_dir.clone();
    let at = |name: &str| -> PathBuf { dir.join(name) };

    // (a) Other vendors' files: skipped by the kind peek or refused by the limits, never parsed at
    // length; our GPU still comes.
    fs::write(at("other-deep.yaml"), deep_yaml("other.com/x")).unwrap();
    fs::write(at("other-bomb.yaml"), alias_bomb("other.com/x")).unwrap();
    // No `kind:` at column 0, so the peek cannot tell and the full (bounded) parse must.
    fs::write(
        at("other-flow.yaml"),
        format!("{{cdiVersion: 0.5.0, kind: other.com/x, devices: {}", "[".repeat(100_000)),
    )
    .unwrap();
    fs::write(
        at("other-deep.json"),
        format!("{{\"cdiVersion\":\"0.5.0\",\"kind\":\"other.com/x\",\"devices\":{}", "[".repeat(100_000)),
    )
    .unwrap();
    let out = gpu_check(&node, "y-other");
    assert!(out.status == 0 && out.stdout.contains("GPU-OK"), "y-other: {out:?}");
    // Control: the files are there and are read: asking for their kind names each with its limit.
    let r = CtrRun {
        image: PROBE_IMAGE.into(),
        devices: "other.com/x=0".into(),
        env: vec![],
        command: vec!["/bin/true".into()],
    };
    let out = run(&node, "y-other-kind", &r);
    assert_ne!(out.status, 0, "{out:?}");
    for (file, why) in [
        ("other-deep.yaml", "nesting"),
        ("other-bomb.yaml", "aliases"),
        ("other-flow.yaml", "nesting"),
        ("other-deep.json", "invalid type"),
    ] {
        let line = out.stderr.split("; ").find(|part| part.contains(file));
        assert!(line.is_some_and(|l| l.contains(why)), "{file} ({why}) not named: {}", out.stderr);
    }

    // (b) Files of our own kind next to our spec: the registry sets each aside (documented: a bad
    // file never hides other files' devices), logs it, and names it when resolution fails.
    let kind = "nvidia.com/gpu";
    fs::write(at("zz-deep.yaml"), deep_yaml(kind)).unwrap();
    fs::write(at("zz-bomb.yaml"), alias_bomb(kind)).unwrap();
    let mut big = format!("cdiVersion: 0.5.0\nkind: {kind}\ndevices: []\n");
    big.push_str(&format!("# {}\n", "x".repeat(5 * 1024 * 1024)));
    fs::write(at("zz-big.yaml"), big).unwrap();
    nix::unistd::mkfifo(&at("zz-fifo.yaml"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    std::os::unix::fs::symlink("/dev/zero", at("zz-zero.yaml")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", at("zz-zero.json")).unwrap();
    let out = gpu_check(&node, "y-ours");
    assert!(out.status == 0 && out.stdout.contains("GPU-OK"), "y-ours: {out:?}");
    let log = fs::read_to_string(&node.shim_log).unwrap();
    for file in ["zz-deep.yaml", "zz-bomb.yaml", "zz-big.yaml"] {
        assert!(
            log.lines().any(|l| l.contains("CDI spec rejected") && l.contains(file)),
            "{file} not logged as rejected:\n{}",
            process::log_tail(&node.shim_log, 20)
        );
    }
    let r = CtrRun {
        image: PROBE_IMAGE.into(),
        devices: "nvidia.com/gpu=99".into(),
        env: vec![],
        command: vec!["/bin/true".into()],
    };
    let out = run(&node, "y-ours-missing", &r);
    assert_ne!(out.status, 0, "{out:?}");
    for (file, why) in [("zz-deep.yaml", "nesting"), ("zz-bomb.yaml", "aliases"), ("zz-big.yaml", "limit")] {
        let line = out.stderr.split("; ").find(|part| part.contains(file));
        assert!(line.is_some_and(|l| l.contains(why)), "{file} ({why}) not named: {}", out.stderr);
    }

    // Our own spec replaced by a hostile one: the GPU Create fails naming it, without hanging.
    fs::write(
        &node.spec_path,
        format!("{{\"cdiVersion\":\"0.5.0\",\"kind\":\"{kind}\",\"devices\":{}", "[".repeat(100_000)),
    )
    .unwrap();
    let out = gpu_check(&node, "y-spec");
    assert_ne!(out.status, 0, "{out:?}");
    let line = out.stderr.split("; ").find(|part| part.contains("nvidia.com-gpu.json"));
    // A typed read meets the wrong type at the second `[`; either refusal is bounded.
    assert!(
        line.is_some_and(|l| l.contains("nesting") || l.contains("invalid type")),
        "the hostile spec is not named: {}",
        out.stderr
    );
    assert_no_shims(&node, "after the hostile specs");
}

// ---------------------------------------------------------------------------------------------
// 4. Spec trust
// ---------------------------------------------------------------------------------------------

/// A root-owned script that records on the host that it ran (as root), as a spec hook's payload.
struct Payload {
    dir: tempfile::TempDir,
    script: PathBuf,
}

impl Payload {
    fn new() -> Payload {
        // Under a folder anyone may enter, so `nobody` can drop a spec next to it (see (c)).
        let dir = tempfile::Builder::new().prefix("nvinject-trust-").tempdir_in("/tmp").unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let script = dir.path().join("payload.sh");
        fs::write(&script, "#!/bin/sh\nid -u > \"$1\"\n").unwrap();
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        Payload { dir, script }
    }

    fn marker(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("ran-{name}"))
    }

    /// A CDI hook running the payload on the host (createRuntime: in the runtime's namespace),
    /// leaving `ran-<name>`.
    fn hook(&self, name: &str) -> Value {
        serde_json::json!({
            "hookName": "createRuntime",
            "path": self.script.to_string_lossy(),
            "args": ["payload", self.marker(name).to_string_lossy()],
        })
    }

    /// Whether the hook `name` ran, as root; clears the marker.
    fn ran(&self, name: &str) -> bool {
        let marker = self.marker(name);
        let ran = fs::read_to_string(&marker).is_ok_and(|t| t.trim() == "0");
        let _ = fs::remove_file(&marker);
        ran
    }
}

/// Rewrites the node's `[cdi]` section: its spec folders (lowest priority first) and the switch.
fn set_cdi(node: &GpuNode, dirs: &[&Path], accept_untrusted: bool) {
    let config = fs::read_to_string(&node.config_path).unwrap();
    let dirs: Vec<String> = dirs.iter().map(|d| format!("{:?}", d.to_string_lossy())).collect();
    let kept: String = config
        .lines()
        .filter(|l| !l.starts_with("spec-dirs") && !l.starts_with("accept-untrusted-specs"))
        .map(|l| format!("{l}\n"))
        .collect();
    let cdi =
        format!("[cdi]\nspec-dirs = [{}]\naccept-untrusted-specs = {accept_untrusted}\n", dirs.join(", "));
    fs::write(&node.config_path, kept.replacen("[cdi]\n", &cdi, 1)).unwrap();
}

fn devices_run(node: &GpuNode, id: &str, devices: &str) -> Bounded {
    let r = CtrRun {
        image: PROBE_IMAGE.into(),
        devices: devices.into(),
        env: vec![],
        command: vec!["/bin/true".into()],
    };
    run(node, id, &r)
}

/// A GPU container that must be refused naming each of `needles`, leaving nothing behind.
fn assert_refused_naming(node: &GpuNode, id: &str, devices: &str, needles: &[&str]) {
    let out = devices_run(node, id, devices);
    assert_ne!(out.status, 0, "{id}: the container started: {}", out.stdout);
    for needle in needles {
        assert!(out.stderr.contains(needle), "{id}: `{needle}` missing from ctr's error: {}", out.stderr);
    }
    assert_no_shims(node, id);
}

/// `nvinject-cdi validate FILE` must fail naming each of `needles`.
fn assert_validate_refuses(node: &GpuNode, file: &Path, needles: &[&str]) {
    let out = Command::new(node.bin_dir.join("nvinject-cdi")).arg("validate").arg(file).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "validate {}: {stdout}", file.display());
    for needle in needles {
        assert!(stdout.contains(needle), "validate: `{needle}` missing: {stdout}");
    }
}

#[test]
#[ignore = "needs root"]
fn untrusted_specs_never_run_their_hooks_and_foreign_hooks_are_named() {
    nvinject_test_support::require_root("containerd, runc and chown");
    let _s = serial();
    let node = node(&NodeOptions::default());
    let payload = Payload::new();
    let spec_path = node.spec_path.clone();
    let spec_text = spec_path.to_string_lossy().into_owned();

    // Our own spec, carrying a payload hook, as root wrote it.
    let mut ours: Value = serde_json::from_slice(&fs::read(&spec_path).unwrap()).unwrap();
    let hooks = ours["containerEdits"]["hooks"].as_array_mut().unwrap();
    hooks.push(payload.hook("ours"));
    fs::write(&spec_path, serde_json::to_vec(&ours).unwrap()).unwrap();
    fs::set_permissions(&spec_path, fs::Permissions::from_mode(0o644)).unwrap();
    let out = devices_run(&node, "t-control", GPU0);
    assert_eq!(out.status, 0, "t-control: {}", out.stderr);
    assert!(payload.ran("ours"), "control: a trusted spec's hook runs (the route is real)");

    // (a) Our spec made writable by others: refused naming the file, mode and fix; the hook did
    // not run. Control: a host that accepts untrusted specs runs it, and says so at warn.
    fs::set_permissions(&spec_path, fs::Permissions::from_mode(0o666)).unwrap();
    assert_refused_naming(
        &node,
        "t-0666",
        GPU0,
        &[&format!("untrusted CDI spec {spec_text}"), "mode 0666", &format!("chmod go-w {spec_text}")],
    );
    assert!(!payload.ran("ours"), "t-0666: the untrusted spec's hook ran");
    assert_validate_refuses(&node, &spec_path, &["mode 0666", &format!("chmod go-w {spec_text}")]);
    set_cdi(&node, &[&node.cdi_dir], true);
    let out = devices_run(&node, "t-0666-accepted", GPU0);
    assert_eq!(out.status, 0, "t-0666-accepted: {}", out.stderr);
    assert!(payload.ran("ours"), "control: accepted, the same spec's hook runs");
    let log = fs::read_to_string(&node.shim_log).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("UNTRUSTED CDI spec used") && l.contains(&spec_text) && l.contains("0666")),
        "the accepted untrusted spec was not logged:\n{}",
        process::log_tail(&node.shim_log, 20)
    );
    set_cdi(&node, &[&node.cdi_dir], false);

    // (b) Owned by `nobody`, mode 0644: refused naming the owner and the fix. Control: root's again,
    // its hook runs.
    fs::set_permissions(&spec_path, fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::chown(&spec_path, Some(NOBODY), Some(NOBODY)).unwrap();
    let fix = format!("chown root:root {spec_text} && chmod 0644 {spec_text}");
    assert_refused_naming(&node, "t-nobody", GPU0, &["owned by uid 65534", "mode 0644", &fix]);
    assert!(!payload.ran("ours"), "t-nobody: the untrusted spec's hook ran");
    assert_validate_refuses(&node, &spec_path, &["owned by uid 65534", &fix]);
    std::os::unix::fs::chown(&spec_path, Some(0), Some(0)).unwrap();
    let out = devices_run(&node, "t-root-again", GPU0);
    assert_eq!(out.status, 0, "t-root-again: {}", out.stderr);
    assert!(payload.ran("ours"), "control: root's spec's hook runs");
    // Our spec without the payload from here on.
    let hooks = ours["containerEdits"]["hooks"].as_array_mut().unwrap();
    hooks.pop();
    fs::write(&spec_path, serde_json::to_vec(&ours).unwrap()).unwrap();

    // (c) A higher-priority spec folder anyone may write, and `nobody` drops a spec into it that
    // would take over GPU 0 (and defines one more device). Non-sticky and sticky alike: set aside,
    // GPU 0 comes from our spec, the dropped hook never runs; asking for the dropped device names
    // the folder and the fix. Control: accepted, the dropped spec wins and its hook runs.
    let drop = payload.dir.path().join("drop");
    fs::create_dir(&drop).unwrap();
    fs::set_permissions(&drop, fs::Permissions::from_mode(0o777)).unwrap();
    let mut evil = serde_json::json!({
        "cdiVersion": ours["cdiVersion"],
        "kind": "nvidia.com/gpu",
        "devices": [ours["devices"][0].clone(), ours["devices"][0].clone()],
        "containerEdits": {"hooks": [payload.hook("dropped")]},
    });
    evil["devices"][1]["name"] = Value::String("evil".into());
    let staged = payload.dir.path().join("staged.json");
    fs::write(&staged, serde_json::to_vec(&evil).unwrap()).unwrap();
    fs::set_permissions(&staged, fs::Permissions::from_mode(0o644)).unwrap();
    let dropped = drop.join("evil.json");
    let mut cp = Command::new("/bin/cp");
    cp.arg(&staged).arg(&dropped).uid(NOBODY).gid(NOBODY);
    let out = attack::run_bounded(&mut cp, Duration::from_secs(30), node.base(), "nobody-cp").unwrap();
    assert_eq!(out.status, 0, "nobody drops a spec: {out:?}");
    assert_eq!(fs::metadata(&dropped).unwrap().uid(), NOBODY);
    set_cdi(&node, &[&node.cdi_dir, &drop], false);
    let drop_text = drop.to_string_lossy().into_owned();
    for mode in [0o777, 0o1777] {
        fs::set_permissions(&drop, fs::Permissions::from_mode(mode)).unwrap();
        let id = format!("t-drop-{mode:o}");
        let out = devices_run(&node, &id, GPU0);
        assert_eq!(out.status, 0, "{id}: our GPU 0 must still come: {}", out.stderr);
        assert!(!payload.ran("dropped"), "{id}: the dropped spec's hook ran");
        assert_refused_naming(
            &node,
            &format!("{id}-evil"),
            "nvidia.com/gpu=evil",
            &[
                &format!("untrusted CDI spec {}", dropped.display()),
                &format!("its folder {drop_text} is owned by uid 0 (root) with mode {mode:04o}"),
                &format!("chmod go-w {drop_text}"),
            ],
        );
        assert_validate_refuses(&node, &dropped, &[&format!("its folder {drop_text}")]);
    }
    set_cdi(&node, &[&node.cdi_dir, &drop], true);
    let out = devices_run(&node, "t-drop-accepted", GPU0);
    assert_eq!(out.status, 0, "t-drop-accepted: {}", out.stderr);
    assert!(payload.ran("dropped"), "control: accepted, the dropped spec takes over GPU 0 and its hook runs");
    set_cdi(&node, &[&node.cdi_dir], false);

    // Another tool's trusted spec: used, and its hook is named on the create log line, ours not.
    let other = node.cdi_dir.join("other.com-x.json");
    let other_spec = serde_json::json!({
        "cdiVersion": "0.6.0",
        "kind": "other.com/x",
        "devices": [{"name": "a", "containerEdits": {"env": ["OTHER=1"]}}],
        "containerEdits": {"hooks": [payload.hook("other")]},
    });
    fs::write(&other, serde_json::to_vec(&other_spec).unwrap()).unwrap();
    fs::set_permissions(&other, fs::Permissions::from_mode(0o644)).unwrap();
    let out = devices_run(&node, "t-foreign", &format!("{GPU0},other.com/x=a"));
    assert_eq!(out.status, 0, "t-foreign: {}", out.stderr);
    assert!(payload.ran("other"), "the other tool's hook runs");
    let create = node
        .shim_log_for("t-foreign")
        .into_iter()
        .find(|l| l["message"] == "container create")
        .unwrap_or_else(|| panic!("no create line:\n{}", process::log_tail(&node.shim_log, 20)));
    let foreign = create["foreign_hooks"].as_str().unwrap_or_default();
    assert_eq!(
        foreign,
        format!("{}: {} createRuntime", other.display(), payload.script.display()),
        "create line: {create}"
    );
    // Control: the line does carry our own hooks' runs; they are just not foreign.
    assert!(ours["containerEdits"]["hooks"].as_array().is_some_and(|h| !h.is_empty()));
    let control =
        node.shim_log_for("t-control").into_iter().find(|l| l["message"] == "container create").unwrap();
    assert_eq!(
        control["foreign_hooks"].as_str().unwrap_or_default(),
        format!("{spec_text}: {} createRuntime", payload.script.display()),
        "with the payload in our spec, that hook (not nvinject-hook) is named: {control}"
    );
    assert_no_shims(&node, "after the trust checks");
}
