//! Issue 11, reproduction 2 ("ldconfig escapes through /proc") and the variants a reviewer would
//! try next, on real parts: a private containerd 1.6, runc and our runtime on the simulated 8-GPU
//! node, each container asking for a GPU, so both hooks of the generated spec (`create-symlinks`
//! and `update-ldcache`) run as runc runs them (createContainer: after the mounts, before
//! pivot_root, with PID 1 of the container's PID namespace still in the host root).
//!
//! Every case plants a hostile tree in a host directory used as the container's root
//! (`ctr run --rootfs`) that points at a decoy directory (`Decoy`: a cache, an `ld.so.conf`, a
//! library whose SONAME link is missing, a link, a file) outside it, then asserts:
//! - nothing in the decoy changed (contents, mtimes, ctimes, inodes, modes, link targets) and
//!   nothing appeared in it;
//! - the container either started with a correct cache (the probe's `ldconfig -p` lists the
//!   injected driver libraries and the image's glibc, never the decoy's library, and NVML loads
//!   by SONAME) or failed with an error from `nvinject-hook` naming what is wrong, as decided per
//!   case below; never a hang (every wait is bounded);
//! - a positive control shows the route out is real: the old hook's `ldconfig -r ROOTFS` run the
//!   way runc runs a hook writes into a second decoy, or a path-walking program run that way
//!   reaches the decoy through the planted path.
//!
//! Needs root and gcc (CI has both). Run: `cargo test -p nvinject-integration --test security_hook`.

use std::fs;
use std::io::Read;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use nvinject_image_tool::image::{self, ImageSpec};
use nvinject_node_harness::node::{GpuNode, NodeOptions, PROBE_IMAGE};
use nvinject_node_harness::rootfs_attack::{
    self as attack, BoundedRun, DECOY_LIB, DECOY_SONAME, Decoy, LIB_DIR, TreeSnapshot, Walk,
};
use nvinject_node_harness::{mounts, process};
use nvinject_simnode::artifacts::artifact;
use serde_json::Value;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Generous bound for one container start on a loaded machine; a hook that hangs is killed there.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// The device every container asks for.
const DEVICE: &str = "nvidia.com/gpu=0";

/// A plant: changes a copy of the template rootfs to attack `decoy`.
type Plant<'a> = &'a dyn Fn(&Path, &Decoy);

/// One node and one template rootfs (the probe image's tree), shared by the cases of a test.
struct Bench {
    node: GpuNode,
    template: PathBuf,
    so: PathBuf,
}

/// What one attack left.
struct Attack {
    name: String,
    run: BoundedRun,
    rootfs: PathBuf,
    decoy: Decoy,
    before: TreeSnapshot,
}

impl Bench {
    fn new() -> Bench {
        process::ensure_root().unwrap_or_else(|e| panic!("{e}"));
        let node = GpuNode::start(&NodeOptions::default()).unwrap_or_else(|e| panic!("node setup: {e}"));
        let template = node.base().join("template");
        let spec = ImageSpec {
            name: PROBE_IMAGE.into(),
            programs: vec![artifact("nvinject-integration", "nvinject-probe")],
            cmd: vec![],
            env: vec![],
        };
        image::assemble_root(&spec, &template).unwrap_or_else(|e| panic!("template rootfs: {e}"));
        let so = node.base().join(DECOY_LIB);
        attack::shared_object(&so, DECOY_SONAME).unwrap_or_else(|e| panic!("decoy library: {e}"));
        Bench { node, template, so }
    }

    fn case_dir(&self, name: &str) -> PathBuf {
        self.node.base().join("cases").join(name)
    }

    /// A fresh decoy and a copy of `template` with `plant` applied to attack it.
    fn prepare(&self, name: &str, template: &Path, plant: Plant) -> (PathBuf, Decoy) {
        let dir = self.case_dir(name);
        fs::create_dir_all(&dir).unwrap();
        let decoy = Decoy::plant(&dir.join("decoy"), &self.so).unwrap();
        let rootfs = dir.join("rootfs");
        attack::copy_tree(template, &rootfs).unwrap();
        plant(&rootfs, &decoy);
        (rootfs, decoy)
    }

    /// Plants the attack and starts a GPU container on it through our runtime.
    fn attack(&self, name: &str, plant: Plant) -> Attack {
        self.attack_on(name, &self.template, plant)
    }

    fn attack_on(&self, name: &str, template: &Path, plant: Plant) -> Attack {
        let (rootfs, decoy) = self.prepare(name, template, plant);
        let before = decoy.snapshot().unwrap();
        let run = attack::run_in_rootfs(&self.node, name, &rootfs, DEVICE, RUN_TIMEOUT).unwrap();
        println!(
            "== {name}: exit {:?}{}\n{}",
            run.status,
            if run.timed_out { " (killed at the deadline)" } else { "" },
            run.stderr.trim()
        );
        let a = Attack { name: name.into(), run, rootfs, decoy, before };
        assert!(!a.run.timed_out, "{name}: the container start hung (killed after {RUN_TIMEOUT:?})");
        a.assert_decoy_unchanged();
        assert_clean(&self.node, name);
        a
    }

    /// Control: the old hook (`ldconfig -r`, run as runc runs a hook) on the same plant, against a
    /// decoy of its own, changes that decoy. Returns what changed.
    fn control_ldconfig(&self, name: &str, template: &Path, plant: Plant) -> Vec<String> {
        let control = format!("{name}-control");
        let (rootfs, decoy) = self.prepare(&control, template, plant);
        let before = decoy.snapshot().unwrap();
        let run =
            attack::old_hook_ldconfig(&rootfs, &self.case_dir(&control), "ldconfig", RUN_TIMEOUT).unwrap();
        assert!(!run.timed_out, "{control}: ldconfig hung");
        let changes = before.changes().unwrap();
        assert!(
            !changes.is_empty(),
            "{control}: the old hook's ldconfig -r left the decoy alone, so this route is not real \
             (exit {:?}: {})",
            run.status,
            run.stderr
        );
        println!("== {control}: ldconfig -r changed the decoy:\n  {}", changes.join("\n  "));
        changes
    }

    /// Control: a program that resolves `path` (inside the planted rootfs) as the kernel does for
    /// any path walk, run as runc runs a hook, reaches `decoy_path` (relative to the decoy).
    /// Links through `/proc/1/root` are walked chrooted (as ldconfig -r walks), the others joined.
    fn control_reaches(&self, name: &str, template: &Path, plant: Plant, path: &str, decoy_path: &str) {
        let control = format!("{name}-control");
        let (rootfs, decoy) = self.prepare(&control, template, plant);
        let want = attack::identity(&decoy.dir.join(decoy_path));
        assert!(want.is_some(), "{control}: the decoy has no {decoy_path}");
        let walk = if name.contains("proc1") { Walk::Chroot } else { Walk::Joined };
        let got = attack::runc_like_identity(&rootfs, path, walk, &self.case_dir(&control), "stat").unwrap();
        assert_eq!(
            got, want,
            "{control}: {path} in the planted rootfs does not lead to the decoy's {decoy_path}, so this \
             route is not real"
        );
    }
}

impl Attack {
    fn assert_decoy_unchanged(&self) {
        let changes = self.before.changes().unwrap();
        assert!(
            changes.is_empty(),
            "{}: the hook changed the host's decoy:\n{}",
            self.name,
            changes.join("\n")
        );
        assert!(!self.decoy.soname_link_made(), "{}: a SONAME link appeared in the decoy", self.name);
    }

    fn report(&self) -> &Value {
        self.run.report.as_ref().unwrap_or_else(|| {
            panic!(
                "{}: no probe report (exit {:?}): stdout: {} stderr: {}",
                self.name, self.run.status, self.run.stdout, self.run.stderr
            )
        })
    }

    fn ldconfig_lines(&self) -> Vec<String> {
        self.report()["ldconfig"]["lines"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l.as_str().map(str::to_owned))
            .collect()
    }

    /// The container ran, and its loader's cache is right: the injected driver libraries under
    /// their SONAMEs in the injected folder, the image's glibc, nothing of the decoy's; NVML loads.
    fn assert_started_with_correct_cache(&self) {
        let name = &self.name;
        if !self.run.ok() {
            // What the hook wrote, listed by the host's ldconfig, to show why the loader failed.
            let cache = self.rootfs.join("etc/ld.so.cache");
            let listing =
                std::process::Command::new("/sbin/ldconfig").arg("-p").arg("-C").arg(&cache).output();
            let listing =
                listing.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
            panic!(
                "{name}: expected the container to start: {}\n{}:\n{listing}",
                self.run.stderr,
                cache.display()
            );
        }
        let lines = self.ldconfig_lines();
        for lib in ["libcuda.so.1", "libnvidia-ml.so.1"] {
            let want = format!("=> {LIB_DIR}/{lib}");
            assert!(
                lines.iter().any(|l| l.trim_start().starts_with(lib) && l.ends_with(&want)),
                "{name}: {lib} {want} missing from the container's ldconfig -p: {lines:#?}"
            );
        }
        assert!(lines.iter().any(|l| l.trim_start().starts_with("libc.so.6 ")), "{name}: {lines:#?}");
        assert!(
            !lines.iter().any(|l| l.contains("nvdecoy")),
            "{name}: the decoy's library is cached: {lines:#?}"
        );
        // The cache the container's loader reads is the one the hook wrote.
        assert!(
            lines.iter().any(|l| l.starts_with("Cache generated by: nvinject-ldcache")),
            "{name}: the container's cache is not the hook's: {lines:#?}"
        );
        assert_eq!(self.report()["nvml"]["dlopen"], "ok", "{name}: {}", self.report()["nvml"]);
    }

    /// `path` (host path walk from the rootfs, which has no link on the way) is a regular file.
    fn assert_regular_in_rootfs(&self, path: &str) {
        let meta = fs::symlink_metadata(self.rootfs.join(path.trim_start_matches('/')));
        assert!(meta.is_ok_and(|m| m.is_file()), "{}: {path} is not a regular file in the rootfs", self.name);
    }

    /// The container did not start, and the hook said why, naming each of `needles`.
    fn assert_failed_clearly(&self, needles: &[&str]) {
        let name = &self.name;
        assert!(!self.run.ok(), "{name}: expected the start to fail; it ran: {}", self.run.stdout);
        assert!(self.run.report.is_none(), "{name}: the probe ran");
        let err = &self.run.stderr;
        assert!(err.contains("nvinject-hook"), "{name}: the failure is not the hook's: {err}");
        for n in needles {
            assert!(err.contains(n), "{name}: `{n}` missing from the error: {err}");
        }
        // Said once: the hook does not repeat each cause after its own message.
        let said = err.rsplit("nvinject-hook: ").next().unwrap_or_default();
        let head: String = said.chars().take(40).collect();
        assert_eq!(said.matches(&head).count(), 1, "{name}: the hook's message repeats itself: {said}");
    }

    /// Temp files of the atomic writes are gone from `dir` (inside the rootfs).
    fn assert_no_temp_left(&self, dir: &str) {
        let dir = self.rootfs.join(dir.trim_start_matches('/'));
        let temps: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".nvinject.tmp"))
            .collect();
        assert!(temps.is_empty(), "{}: temp files left in {}: {temps:?}", self.name, dir.display());
    }
}

/// No task, container, shim or mount of this node survives a case.
fn assert_clean(node: &GpuNode, case: &str) {
    let gone = process::wait_for("shims of finished containers to exit", Duration::from_secs(20), || {
        node.containerd.shim_processes().is_empty().then_some(())
    });
    assert!(gone.is_ok(), "{case}: shim processes left: {:?}", node.containerd.shim_processes());
    assert!(
        process::find_processes(&node.bin_dir.to_string_lossy()).is_empty(),
        "{case}: a hook process is still running"
    );
    assert!(mounts::mounts_under(&node.containerd.state).is_empty(), "{case}: mounts left");
    assert!(mounts::mounts_under(node.base()).is_empty(), "{case}: mounts left under the cases");
    for what in ["tasks", "containers"] {
        let out = process::run(node.containerd.ctr().args([what, "list", "-q"])).unwrap();
        assert!(String::from_utf8_lossy(&out.stdout).trim().is_empty(), "{case}: {what} left");
    }
}

fn put(rootfs: &Path, path: &str, text: &str) {
    let p = rootfs.join(path.trim_start_matches('/'));
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
}

fn link(rootfs: &Path, path: &str, target: &str) {
    attack::replace_with_symlink(&rootfs.join(path.trim_start_matches('/')), target).unwrap();
}

/// Reproduction 2, first half: `/etc` itself, or the files in it the hook reads and writes, link
/// out of the rootfs.
#[test]
#[ignore = "needs root"]
fn etc_and_the_files_in_it_linked_out_of_the_rootfs_reach_nothing_on_the_host() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let b = Bench::new();
    let t = b.template.clone();

    // `/etc -> /proc/1/root<decoy>`: the issue's reproduction. The old hook replaced the decoy's
    // ld.so.cache. The container has no /etc of its own to hold a cache: it must not start.
    let plant: Plant = &|r, d| link(r, "/etc", &d.via_proc());
    let changed = b.control_ldconfig("etc-proc1", &t, plant);
    assert!(changed.iter().any(|c| c.contains("ld.so.cache")), "{changed:?}");
    b.attack("etc-proc1", plant).assert_failed_clearly(&["/etc", "/proc magic link"]);

    // The same through /proc/self/root: a path walk in the runtime's root reaches the decoy.
    let plant: Plant = &|r, d| link(r, "/etc", &d.via_proc_self());
    b.control_reaches("etc-proc-self", &t, plant, "/etc/ld.so.cache", "ld.so.cache");
    b.attack("etc-proc-self", plant).assert_failed_clearly(&["/etc", "/proc magic link"]);

    // An absolute host path, and `..` climbing: a path walk in the runtime's root reaches the
    // decoy, but inside the rootfs they name a directory of the rootfs (runc makes it for the
    // spec's /etc/OpenCL mount), and the cache is written there: the container works.
    let cases: [(&str, Plant); 2] = [
        ("etc-absolute", &|r, d| link(r, "/etc", &d.dir.to_string_lossy())),
        ("etc-dots", &|r, d| link(r, "/etc", &d.via_dots())),
    ];
    for (name, plant) in cases {
        b.control_reaches(name, &t, plant, "/etc/ld.so.cache", "ld.so.cache");
        let a = b.attack(name, plant);
        a.assert_started_with_correct_cache();
        a.assert_regular_in_rootfs(&format!("{}/ld.so.cache", a.decoy.dir.display()));
    }

    // The cache file itself links out: it is replaced inside the rootfs by an atomic rename, the
    // link is never followed, and the container gets a correct cache.
    let cases: [(&str, Plant); 3] = [
        ("cache-proc1", &|r, d| link(r, "/etc/ld.so.cache", &format!("{}/ld.so.cache", d.via_proc()))),
        ("cache-dots", &|r, d| link(r, "/etc/ld.so.cache", &format!("{}/ld.so.cache", d.via_dots()))),
        ("cache-absolute", &|r, d| link(r, "/etc/ld.so.cache", &d.dir.join("ld.so.cache").to_string_lossy())),
    ];
    for (name, plant) in cases {
        b.control_reaches(name, &t, plant, "/etc/ld.so.cache", "ld.so.cache");
        let a = b.attack(name, plant);
        a.assert_started_with_correct_cache();
        a.assert_regular_in_rootfs("/etc/ld.so.cache");
        a.assert_no_temp_left("/etc");
    }

    // ld.so.conf, or its conf.d, links to the decoy's (whose lines name the decoy's library dir
    // through /proc/1/root): the old hook's ldconfig made a SONAME link in the decoy. They are
    // unreadable inside the rootfs, so the cache holds the injected and system folders only, and
    // the drop-in is not written through the link.
    let cases: [(&str, Plant); 2] = [
        ("conf-proc1", &|r, d| link(r, "/etc/ld.so.conf", &format!("{}/ld.so.conf", d.via_proc()))),
        ("conf-d-proc1", &|r, d| link(r, "/etc/ld.so.conf.d", &format!("{}/ld.so.conf.d", d.via_proc()))),
    ];
    for (name, plant) in cases {
        let changed = b.control_ldconfig(name, &t, plant);
        assert!(changed.iter().any(|c| c.contains(DECOY_SONAME)), "{name}: {changed:?}");
        b.attack(name, plant).assert_started_with_correct_cache();
    }
    let plant: Plant = &|r, d| link(r, "/etc/ld.so.conf.d", &format!("{}/ld.so.conf.d", d.via_proc_self()));
    b.control_reaches("conf-d-proc-self", &t, plant, "/etc/ld.so.conf.d/host.conf", "ld.so.conf.d/host.conf");
    b.attack("conf-d-proc-self", plant).assert_started_with_correct_cache();
    let plant: Plant = &|r, d| link(r, "/etc/ld.so.conf.d", &format!("{}/ld.so.conf.d", d.via_dots()));
    b.control_reaches("conf-d-dots", &t, plant, "/etc/ld.so.conf.d/host.conf", "ld.so.conf.d/host.conf");
    b.attack("conf-d-dots", plant).assert_started_with_correct_cache();
}

/// Reproduction 2, second half: `ld.so.conf` lines and includes naming host directories (through
/// /proc or `..`), where the decoy's library lacks its SONAME link. No link may appear there; the
/// cache must not list the decoy's library.
#[test]
#[ignore = "needs root"]
fn conf_lines_and_includes_naming_host_dirs_create_no_links_there() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let b = Bench::new();
    let t = b.template.clone();
    let base_conf = "include /etc/ld.so.conf.d/*.conf\n";

    let cases: [(&str, Plant); 4] = [
        ("line-proc1", &|r, d| put(r, "/etc/ld.so.conf", &format!("{base_conf}{}/lib\n", d.via_proc()))),
        ("conf-d-line-proc1", &|r, d| {
            put(r, "/etc/ld.so.conf.d/evil.conf", &format!("{}/lib\n", d.via_proc()))
        }),
        ("include-proc1", &|r, d| {
            put(r, "/etc/ld.so.conf", &format!("{base_conf}include {}/ld.so.conf.d/*.conf\n", d.via_proc()))
        }),
        ("include-proc1-file", &|r, d| {
            put(r, "/etc/ld.so.conf.d/evil.conf", &format!("include {}/ld.so.conf\n", d.via_proc()))
        }),
    ];
    for (name, plant) in cases {
        let changed = b.control_ldconfig(name, &t, plant);
        assert!(changed.iter().any(|c| c.contains(DECOY_SONAME)), "{name}: {changed:?}");
        b.attack(name, plant).assert_started_with_correct_cache();
    }

    // /proc/self/root and `..` in a line: a path walk in the runtime's root reaches the decoy's
    // library dir (ldconfig's chroot happens to stop these two; a hook that joined paths would not).
    type Line = fn(&Decoy) -> String;
    let cases: [(&str, Line); 2] = [
        ("line-proc-self", |d| format!("{}/lib", d.via_proc_self())),
        ("line-dots", |d| format!("/{}/lib", d.via_dots())),
    ];
    for (name, line) in cases {
        let plant = |r: &Path, d: &Decoy| put(r, "/etc/ld.so.conf", &format!("{base_conf}{}\n", line(d)));
        let control = format!("{name}-control");
        let (rootfs, decoy) = b.prepare(&control, &t, &plant);
        let got =
            attack::runc_like_identity(&rootfs, &line(&decoy), Walk::Joined, &b.case_dir(&control), "stat")
                .unwrap();
        assert_eq!(
            got,
            attack::identity(&decoy.dir.join("lib")),
            "{control}: the line does not reach the decoy"
        );
        b.attack(name, &plant).assert_started_with_correct_cache();
    }
}

/// The image's copy of the template with its own libraries moved out of the injected folder (to
/// `/usr/lib/image`, listed in its ld.so.conf.d), so that folder can be made a link out while the
/// image's programs still run.
fn relocated_template(b: &Bench) -> PathBuf {
    let t = b.node.base().join("template-relocated");
    attack::copy_tree(&b.template, &t).unwrap();
    let from = t.join(LIB_DIR.trim_start_matches('/'));
    let to = t.join("usr/lib/image");
    fs::rename(&from, &to).unwrap();
    fs::create_dir(&from).unwrap();
    put(&t, "/etc/ld.so.conf.d/image.conf", "/usr/lib/image\n");
    process::run(std::process::Command::new("/sbin/ldconfig").arg("-r").arg(&t)).unwrap();
    t
}

/// Reproduction 2's class applied to the injected folders: the directory where the driver
/// libraries get mounted, and the SONAME links and ld.so.cache entries made for them, links out.
#[test]
#[ignore = "needs root"]
fn injected_library_folders_linked_out_of_the_rootfs_reach_nothing_on_the_host() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let b = Bench::new();
    let t = relocated_template(&b);

    // A magic link out: runc mounts the libraries inside the rootfs (its own in-root
    // resolution), and the hook cannot make the folder's links or list it inside the rootfs:
    // the start fails, naming the folder.
    let plant: Plant = &|r, d| link(r, LIB_DIR, &format!("{}/lib", d.via_proc()));
    let changed = b.control_ldconfig("libdir-proc1", &t, plant);
    assert!(changed.iter().any(|c| c.contains(DECOY_SONAME)), "{changed:?}");
    b.attack_on("libdir-proc1", &t, plant).assert_failed_clearly(&[LIB_DIR, "/proc magic link"]);
    let plant: Plant = &|r, d| link(r, LIB_DIR, &format!("{}/lib", d.via_proc_self()));
    b.control_reaches(
        "libdir-proc-self",
        &t,
        plant,
        &format!("{LIB_DIR}/{DECOY_LIB}"),
        &format!("lib/{DECOY_LIB}"),
    );
    b.attack_on("libdir-proc-self", &t, plant).assert_failed_clearly(&[LIB_DIR, "/proc magic link"]);

    // A plain link (absolute or `..`): inside the rootfs it names a directory of the rootfs, where
    // runc mounts the libraries and the hook makes the links; the container works.
    let cases: [(&str, Plant); 2] = [
        ("libdir-absolute", &|r, d| link(r, LIB_DIR, &d.dir.join("lib").to_string_lossy())),
        ("libdir-dots", &|r, d| link(r, LIB_DIR, &format!("{}/lib", d.via_dots()))),
    ];
    for (name, plant) in cases {
        b.control_reaches(name, &t, plant, &format!("{LIB_DIR}/{DECOY_LIB}"), &format!("lib/{DECOY_LIB}"));
        let a = b.attack_on(name, &t, plant);
        a.assert_started_with_correct_cache();
        let inside = a.rootfs.join(a.decoy.dir.strip_prefix("/").unwrap()).join("lib/libcuda.so.1");
        assert!(fs::symlink_metadata(&inside).is_ok(), "{name}: the SONAME link is not in the rootfs");
    }
}

/// The files the hook reads are not regular, or are built to hang it, exhaust its memory or loop.
#[test]
#[ignore = "needs root"]
fn hostile_conf_files_neither_hang_nor_exhaust_the_hook() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let b = Bench::new();
    let t = b.template.clone();
    let mkfifo = |p: &Path| nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();

    // A FIFO as ld.so.conf: the old hook's ldconfig blocks on it for ever (the control kills it at
    // a bound); the hook opens it non-blocking, skips it and the container starts.
    let plant: Plant = &|r, _| {
        fs::remove_file(r.join("etc/ld.so.conf")).unwrap();
        mkfifo(&r.join("etc/ld.so.conf"));
    };
    let (rootfs, _) = b.prepare("conf-fifo-control", &t, plant);
    let run = attack::old_hook_ldconfig(
        &rootfs,
        &b.case_dir("conf-fifo-control"),
        "ldconfig",
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(run.timed_out, "the control's ldconfig did not block on the FIFO: {run:?}");
    b.attack("conf-fifo", plant).assert_started_with_correct_cache();
    let plant: Plant = &|r, _| mkfifo(&r.join("etc/ld.so.conf.d/fifo.conf"));
    let (rootfs, _) = b.prepare("conf-d-fifo-control", &t, plant);
    let run = attack::old_hook_ldconfig(
        &rootfs,
        &b.case_dir("conf-d-fifo-control"),
        "ldconfig",
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(run.timed_out, "the control's ldconfig did not block on the included FIFO: {run:?}");
    b.attack("conf-d-fifo", plant).assert_started_with_correct_cache();

    // ld.so.conf -> /dev/zero: a path-walking reader gets endless bytes; the hook refuses a device.
    let plant: Plant = &|r, _| link(r, "/etc/ld.so.conf", "/dev/zero");
    let (rootfs, _) = b.prepare("conf-dev-zero-control", &t, plant);
    let mut endless = Vec::new();
    fs::File::open(rootfs.join("etc/ld.so.conf")).unwrap().take(64 << 20).read_to_end(&mut endless).unwrap();
    assert_eq!(endless.len(), 64 << 20, "the control read an end in /dev/zero");
    b.attack("conf-dev-zero", plant).assert_started_with_correct_cache();

    // A 100 MB ld.so.conf (sparse: 100 MB to read, nothing on disk): refused before it is read,
    // with the file and the limit named.
    let plant: Plant = &|r, _| {
        fs::OpenOptions::new().write(true).open(r.join("etc/ld.so.conf")).unwrap().set_len(100 << 20).unwrap()
    };
    let (rootfs, _) = b.prepare("conf-100mb-control", &t, plant);
    assert_eq!(fs::metadata(rootfs.join("etc/ld.so.conf")).unwrap().len(), 100 << 20);
    b.attack("conf-100mb", plant).assert_failed_clearly(&["/etc/ld.so.conf", "limit"]);

    // An include loop: a.conf includes b.conf includes a.conf. Refused at the include that closes
    // it, named.
    let plant: Plant = &|r, _| {
        put(r, "/etc/ld.so.conf.d/a.conf", "include b.conf\n");
        put(r, "/etc/ld.so.conf.d/b.conf", "include /etc/ld.so.conf.d/a.conf\n");
    };
    // ldconfig follows it until it runs out of file descriptors.
    let (rootfs, _) = b.prepare("include-loop-control", &t, plant);
    let run =
        attack::old_hook_ldconfig(&rootfs, &b.case_dir("include-loop-control"), "ldconfig", RUN_TIMEOUT)
            .unwrap();
    assert!(run.stderr.contains("Too many open files"), "the control's ldconfig: {run:?}");
    // Named at the file and line that close the loop, with the chain (not the hook's drop-in).
    b.attack("include-loop", plant).assert_failed_clearly(&[
        "/etc/ld.so.conf.d/b.conf line 1",
        "include loop (/etc/ld.so.conf.d/a.conf -> /etc/ld.so.conf.d/b.conf -> /etc/ld.so.conf.d/a.conf)",
    ]);

    // 10k include lines of a glob that matches: stopped at the file-count limit, named.
    let plant: Plant =
        &|r, _| put(r, "/etc/ld.so.conf", &"include /etc/ld.so.conf.d/*.conf\n".repeat(10_000));
    b.attack("10k-includes", plant).assert_failed_clearly(&["ld.so.conf files"]);
    // 10k globs that match nothing: cheap, and the container starts.
    let plant: Plant = &|r, _| {
        let text: String = (0..10_000).map(|i| format!("include /etc/ld.so.conf.d/*.none{i}\n")).collect();
        put(r, "/etc/ld.so.conf", &text);
    };
    b.attack("10k-empty-globs", plant).assert_started_with_correct_cache();
    // 10k files matched by one glob: stopped at the limit, named.
    let plant: Plant = &|r, _| {
        for i in 0..10_000 {
            put(r, &format!("/etc/ld.so.conf.d/{i:05}.conf"), "/usr/lib\n");
        }
    };
    b.attack("10k-conf-files", plant).assert_failed_clearly(&["paths matched by an ld.so.conf include"]);
    // A glob over the whole tree.
    let plant: Plant = &|r, _| put(r, "/etc/ld.so.conf", "include /*/*/*/*/*/*/*/*\n");
    b.attack("tree-glob", plant).assert_failed_clearly(&["ld.so.conf include"]);

    // A procfs file that claims to be regular and empty but reads on for gigabytes (at hook time
    // the rootfs's /proc is the container's procfs): the hook's bounded read stops, either at the
    // kernel's EINVAL for a read size pagemap does not take (the file is then skipped, as an
    // unreadable one, and the container starts) or at the size limit (named). Both are bounded.
    let plant: Plant = &|r, _| link(r, "/etc/ld.so.conf", "/proc/self/pagemap");
    let (size, mut endless) = (fs::metadata("/proc/self/pagemap").unwrap().len(), Vec::new());
    fs::File::open("/proc/self/pagemap").unwrap().take(64 << 20).read_to_end(&mut endless).unwrap();
    assert_eq!((size, endless.len()), (0, 64 << 20), "the control: pagemap is not an endless empty file");
    let a = b.attack("conf-pagemap", plant);
    if a.run.ok() {
        a.assert_started_with_correct_cache();
    } else {
        a.assert_failed_clearly(&["/etc/ld.so.conf", "limit"]);
    }

    // ld.so.conf.d a symlink loop: neither listed nor written into; the container starts.
    let plant: Plant = &|r, _| {
        link(r, "/etc/ld.so.conf.d", "/etc/ld.so.conf.d.b");
        link(r, "/etc/ld.so.conf.d.b", "/etc/ld.so.conf.d");
    };
    b.attack("conf-d-link-loop", plant).assert_started_with_correct_cache();
}

/// A reviewer's next tries on the files the hook writes: the cache a directory, the temp names
/// of the atomic writes pre-made as links out, a hard link to a host file, the SONAME links and
/// mount points links out.
#[test]
#[ignore = "needs root"]
fn the_files_the_hook_writes_cannot_be_turned_into_writes_outside() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let b = Bench::new();
    let t = b.template.clone();

    // /etc/ld.so.cache a directory (holding a link out): the rename fails, named; no temp left.
    let plant: Plant = &|r, d| {
        let cache = r.join("etc/ld.so.cache");
        fs::remove_file(&cache).unwrap();
        fs::create_dir(&cache).unwrap();
        symlink(format!("{}/victim", d.via_proc()), cache.join("x")).unwrap();
    };
    b.control_reaches("cache-is-dir-proc1", &t, plant, "/etc/ld.so.cache/x", "victim");
    let a = b.attack("cache-is-dir", plant);
    a.assert_failed_clearly(&["/etc/ld.so.cache"]);
    a.assert_no_temp_left("/etc");

    // The temp names the hook writes through, and ldconfig's `ld.so.cache~`, pre-made as links to
    // a host file: the link is removed (or left alone) and never written through.
    let cases: [(&str, &str, &str); 4] = [
        ("cache-temp-proc1", "/etc/.ld.so.cache.nvinject.tmp", "proc1"),
        ("cache-temp-absolute", "/etc/.ld.so.cache.nvinject.tmp", "absolute"),
        ("cache-tilde-proc1", "/etc/ld.so.cache~", "proc1"),
        ("dropin-temp-proc1", "/etc/ld.so.conf.d/.00-nvinject.conf.nvinject.tmp", "proc1"),
    ];
    for (name, path, how) in cases {
        let plant = move |r: &Path, d: &Decoy| {
            let target = match how {
                "proc1" => format!("{}/victim", d.via_proc()),
                _ => d.dir.join("victim").to_string_lossy().into_owned(),
            };
            link(r, path, &target);
        };
        b.control_reaches(name, &t, &plant, path, "victim");
        let a = b.attack(name, &plant);
        a.assert_started_with_correct_cache();
        a.assert_no_temp_left("/etc");
        a.assert_no_temp_left("/etc/ld.so.conf.d");
    }

    // The temp names as a FIFO (a plain open would block) or a SONAME link's temp name as a link
    // out: removed, never opened; the container starts. As a directory: the stale temp cannot
    // be cleared, and the start fails naming the file.
    let mkfifo = |p: &Path| nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let plant: Plant = &|r, _| mkfifo(&r.join("etc/.ld.so.cache.nvinject.tmp"));
    let a = b.attack("cache-temp-fifo", plant);
    a.assert_started_with_correct_cache();
    a.assert_no_temp_left("/etc");
    // (The SONAME link is stale too, so the hook replaces it through that temp name.)
    let plant: Plant = &|r, d| {
        let temp = format!("{LIB_DIR}/.libcuda.so.1.nvinject.tmp");
        link(r, &temp, &format!("{}/victim", d.via_proc()));
        link(r, &format!("{LIB_DIR}/libcuda.so.1"), "libcuda.so.0-stale");
    };
    let a = b.attack("soname-temp-proc1", plant);
    a.assert_started_with_correct_cache();
    a.assert_no_temp_left(LIB_DIR);
    let plant: Plant = &|r, _| fs::create_dir(r.join("etc/.ld.so.cache.nvinject.tmp")).unwrap();
    b.attack("cache-temp-dir", plant).assert_failed_clearly(&["/etc/ld.so.cache"]);

    // The drop-in itself a link out: replaced inside the rootfs.
    let plant: Plant =
        &|r, d| link(r, "/etc/ld.so.conf.d/00-nvinject.conf", &format!("{}/victim", d.via_proc()));
    b.control_reaches("dropin-proc1", &t, plant, "/etc/ld.so.conf.d/00-nvinject.conf", "victim");
    let a = b.attack("dropin-proc1", plant);
    a.assert_started_with_correct_cache();
    a.assert_regular_in_rootfs("/etc/ld.so.conf.d/00-nvinject.conf");

    // /etc/ld.so.cache a hard link to a host file (possible wherever the rootfs shares a file
    // system with the host): an in-place write would change the host file; the hook's rename
    // only drops the rootfs's name for it. Contents, mtime and inode stay; only the link count
    // (and so ctime) drops back.
    let plant: Plant = &|r, d| {
        fs::remove_file(r.join("etc/ld.so.cache")).unwrap();
        fs::hard_link(d.dir.join("ld.so.cache"), r.join("etc/ld.so.cache")).unwrap();
    };
    let (rootfs, decoy) = b.prepare("cache-hardlink", &t, plant);
    assert_eq!(
        attack::identity(&rootfs.join("etc/ld.so.cache")),
        attack::identity(&decoy.dir.join("ld.so.cache"))
    );
    let before = decoy.snapshot().unwrap();
    let run = attack::run_in_rootfs(&b.node, "cache-hardlink", &rootfs, DEVICE, RUN_TIMEOUT).unwrap();
    let a = Attack { name: "cache-hardlink".into(), run, rootfs, decoy, before };
    assert!(!a.run.timed_out);
    a.assert_started_with_correct_cache();
    for (path, was, now) in a.before.diff().unwrap() {
        let (was, now) =
            (was.expect("nothing vanished"), now.unwrap_or_else(|| panic!("{} appeared", path.display())));
        assert_eq!(
            path,
            a.decoy.dir.join("ld.so.cache"),
            "only the hard-linked file's link count may change"
        );
        assert_eq!((was.nlink, now.nlink), (2, 1));
        assert_eq!(
            (&was.sha256, was.mtime, was.id),
            (&now.sha256, now.mtime, now.id),
            "the host file was written"
        );
    }
    assert_clean(&b.node, "cache-hardlink");

    // The SONAME link the hooks make for the driver library pre-made as a link out: replaced
    // inside the rootfs, and the library loads.
    let plant: Plant =
        &|r, d| link(r, &format!("{LIB_DIR}/libcuda.so.1"), &format!("{}/victim", d.via_proc()));
    b.control_reaches("soname-link-proc1", &t, plant, &format!("{LIB_DIR}/libcuda.so.1"), "victim");
    let a = b.attack("soname-link-proc1", plant);
    a.assert_started_with_correct_cache();
    assert_eq!(
        fs::read_link(a.rootfs.join(LIB_DIR.trim_start_matches('/')).join("libcuda.so.1")).unwrap(),
        Path::new("libcuda.so.550.54.15")
    );

    // ... or a hard link to a host file: left alone (it is not a symlink), never written.
    let plant: Plant = &|r, d| {
        fs::hard_link(d.dir.join("victim"), r.join(LIB_DIR.trim_start_matches('/')).join("libcuda.so.1"))
            .unwrap()
    };
    let (rootfs, decoy) = b.prepare("soname-link-hardlink-control", &t, plant);
    let so_link = format!("{LIB_DIR}/libcuda.so.1");
    let so_link = so_link.trim_start_matches('/');
    assert_eq!(attack::identity(&rootfs.join(so_link)), attack::identity(&decoy.dir.join("victim")));
    let a = b.attack("soname-link-hardlink", plant);
    assert!(a.run.ok(), "{}", a.run.stderr);
    assert_eq!(attack::identity(&a.rootfs.join(so_link)), attack::identity(&a.decoy.dir.join("victim")));

    // A link create-symlinks makes (the `.so` development link) pre-made as a dangling link out
    // to a name the host does not have: a program that creates the file by path would create it
    // on the host (the control does, in its own decoy); the hook leaves the link as it is and
    // creates nothing through it.
    let plant: Plant =
        &|r, d| link(r, &format!("{LIB_DIR}/libcuda.so"), &format!("{}/created", d.via_proc()));
    let (rootfs, decoy) = b.prepare("dangling-dev-link-proc1-control", &t, plant);
    let script = format!("chroot \"$1\" /bin/sh -c ': > {LIB_DIR}/libcuda.so'");
    let dir = b.case_dir("dangling-dev-link-proc1-control");
    let run = attack::runc_like(&rootfs, &script, &dir, "create", RUN_TIMEOUT).unwrap();
    assert!(decoy.dir.join("created").is_file(), "the control created nothing through the link: {run:?}");
    let a = b.attack("dangling-dev-link-proc1", plant);
    a.assert_started_with_correct_cache();
    let dev_link = a.rootfs.join(LIB_DIR.trim_start_matches('/')).join("libcuda.so");
    assert_eq!(fs::read_link(dev_link).unwrap(), Path::new(&format!("{}/created", a.decoy.via_proc())));

    // Mount points of the spec pre-made as magic links out (a binary's, a library's): the hook
    // that makes the injected mounts resolves each mountpoint inside the rootfs and refuses a
    // /proc magic link on the way, so the start fails naming the mountpoint, and nothing is
    // mounted or created in the decoy (checked by `attack`).
    let plant: Plant = &|r, d| link(r, "/usr/bin/nvidia-smi", &format!("{}/victim", d.via_proc()));
    b.control_reaches("mount-bin-proc1", &t, plant, "/usr/bin/nvidia-smi", "victim");
    let a = b.attack("mount-bin-proc1", plant);
    a.assert_failed_clearly(&["/usr/bin/nvidia-smi", "/proc magic link"]);
    let plant: Plant =
        &|r, d| link(r, &format!("{LIB_DIR}/libnvidia-ml.so.550.54.15"), &format!("{}/victim", d.via_proc()));
    let lib = format!("{LIB_DIR}/libnvidia-ml.so.550.54.15");
    b.control_reaches("mount-lib-proc1", &t, plant, &lib, "victim");
    let a = b.attack("mount-lib-proc1", plant);
    a.assert_failed_clearly(&[&lib, "/proc magic link"]);
    // The same plant with a plain link out (absolute): followed inside the rootfs, where the
    // library is mounted, cached and loads; nothing appears in the decoy.
    let plant: Plant = &|r, d| {
        link(r, &format!("{LIB_DIR}/libnvidia-ml.so.550.54.15"), &d.dir.join("victim").to_string_lossy())
    };
    let a = b.attack("mount-lib-absolute", plant);
    a.assert_started_with_correct_cache();
    let inside = a.rootfs.join(a.decoy.dir.strip_prefix("/").unwrap()).join("victim");
    assert!(inside.is_file(), "the mountpoint was not made inside the rootfs");
    let lines = a.ldconfig_lines();
    assert!(lines.iter().any(|l| l.trim_start().starts_with("libcuda.so.1 ")), "{lines:#?}");
}

/// The synthetic ELF files of the ldcache tests and benches (one builder for every hostile shape).
#[path = "../../ldcache/tests/support/synth_elf.rs"]
mod synth_elf;

/// Names of the library files the hook reads in `folder` of `rootfs`: `count` symbolic links
/// `libl<i>.so.1` to `target` (a path inside the rootfs).
fn links_to(rootfs: &Path, folder: &str, count: usize, target: &str) {
    let dir = rootfs.join(folder.trim_start_matches('/'));
    fs::create_dir_all(&dir).unwrap();
    for i in 0..count {
        symlink(target, dir.join(format!("libl{i}.so.1"))).unwrap();
    }
}

/// Library folders the image's ld.so.conf lists: `/bomb0` .. `/bomb<n-1>`.
fn bomb_folders(n: usize) -> Vec<String> {
    (0..n).map(|k| format!("/bomb{k}")).collect()
}

/// An image that makes the scan as costly per name as it can: `folders` folders of 65,535 links
/// each (just under the per-folder cap) to one small library, each link the last of a chain of
/// `chain` links (the kernel follows each chain on every open), listed by ld.so.conf, and no
/// ld.so.cache (so the hook scans every folder, as for an image without one).
fn plant_link_folders(r: &Path, folders: usize, chain: usize) {
    fs::remove_file(r.join("etc/ld.so.cache")).ok();
    put(r, "/target/libt.so.1", "");
    fs::write(r.join("target/libt.so.1"), synth_elf::plain_library("libt.so.1")).unwrap();
    let mut target = "/target/libt.so.1".to_owned();
    for c in 0..chain {
        let hop = format!("/chain/hop{c}");
        put(r, &hop, "");
        link(r, &hop, &target);
        target = hop;
    }
    let dirs = bomb_folders(folders);
    for d in &dirs {
        links_to(r, d, 65_535, &target);
    }
    put(r, "/etc/ld.so.conf", &(dirs.join("\n") + "\n"));
}

/// Issue 32, item 1, through real containerd: images built to keep the root hook busy end within
/// the hook's work budget (or, past it, at the spec's OCI `timeout`), hold up no other container,
/// and leave nothing running.
/// - `needed-bomb`: the issue's file (16,383 `DT_NEEDED` entries naming one 4,095-byte string,
///   within every limit the reader had) and 10 links to it, no ld.so.cache: before the fix about
///   5 s of CPU per name (debug build); now each file is read once, within its byte cap, and the
///   container starts with a correct cache.
/// - `link-folders`: the next attack on the per-file caps: many cheap names (5 folders of 65,535
///   links to one library). Each name costs an open, so the scan stops at the work budget, naming
///   the folder it was in, and the container does not start.
/// - `link-chains`: the next attack on the budget's per-open charge: each name the end of a chain
///   of 38 links (two short of the kernel's limit), so each open costs the kernel far more than the budget charges. Stopped by the
///   budget or, if that were too slow, by runc at the spec's `timeout`; either way it ends.
/// - `hook-timeout`: the same image with the spec's `--hook-timeout-secs 1`: runc kills the hook
///   at the timeout and fails the start (the timeout reaches runc and is enforced there).
/// - While `link-folders` is being refused, a plain GPU container started next to it runs to the
///   end: the slow start holds no lock another start needs.
#[test]
#[ignore = "needs root"]
fn images_built_to_keep_the_hook_busy_end_within_its_budget_and_hold_up_nothing() {
    nvinject_test_support::require_root("containerd and runc");
    let _s = serial();
    let b = Bench::new();
    let spec = fs::read_to_string(&b.node.spec_path).unwrap();
    let timeouts: Vec<i64> = serde_json::from_str::<Value>(&spec).unwrap()["containerEdits"]["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["timeout"].as_i64().unwrap_or(0))
        .collect();
    assert!(
        !timeouts.is_empty()
            && timeouts.iter().all(|&t| t == i64::from(nvinject_cdi::nvinject::DEFAULT_HOOK_TIMEOUT_SECS)),
        "every generated hook carries the default timeout: {timeouts:?}"
    );

    // The issue's file, past the reader's entry cap (skipped as no library, as a file ldconfig
    // cannot read is), and the costliest file still within every cap (read, and cached), each
    // with 10 links to it.
    let bomb = synth_elf::needed_bomb(16_383, 4_095, Some("libbomb.so.1"));
    assert!(bomb.len() > 200_000, "the issue's 274 KB file: {} bytes", bomb.len());
    let near =
        synth_elf::needed_bomb(nvinject_ldcache::elf::MAX_DYNAMIC_ENTRIES - 3, 4_095, Some("libnear.so.1"));
    let plant: Plant = &|r, _| {
        fs::remove_file(r.join("etc/ld.so.cache")).ok();
        let dir = r.join(LIB_DIR.trim_start_matches('/'));
        for (file, bytes, stem) in
            [("libbomb.so.1.0", &bomb, "libbomb"), ("libnear.so.1.0", &near, "libnear")]
        {
            fs::write(dir.join(file), bytes).unwrap();
            for i in 0..10 {
                symlink(file, dir.join(format!("{stem}{i}.so.1"))).unwrap();
            }
        }
    };
    let started = std::time::Instant::now();
    let a = b.attack("needed-bomb", plant);
    println!("needed-bomb: container start and run took {:?}", started.elapsed());
    a.assert_started_with_correct_cache();
    assert!(
        a.ldconfig_lines().iter().any(|l| l.trim_start().starts_with("libnear.so.1 ")),
        "the costliest readable file was scanned (its SONAME is cached): {:#?}",
        a.ldconfig_lines()
    );

    // A plain container started while the costly one is being refused finishes first and fine.
    let plain_rootfs = b.case_dir("beside").join("rootfs");
    fs::create_dir_all(b.case_dir("beside")).unwrap();
    attack::copy_tree(&b.template, &plain_rootfs).unwrap();
    let plant: Plant = &|r, _| plant_link_folders(r, 5, 0);
    let (rootfs, decoy) = b.prepare("link-folders", &b.template, plant);
    let before = decoy.snapshot().unwrap();
    let (costly, beside) = std::thread::scope(|s| {
        let costly = s.spawn(|| {
            let run = attack::run_in_rootfs(&b.node, "link-folders", &rootfs, DEVICE, RUN_TIMEOUT).unwrap();
            (run, std::time::Instant::now())
        });
        // Once the costly start is under way (its hook is running).
        let bin = b.node.bin_dir.to_string_lossy().into_owned();
        process::wait_for("the costly start's hook", RUN_TIMEOUT, || {
            (!process::find_processes(&bin).is_empty()).then_some(())
        })
        .unwrap();
        let hook_seen = std::time::Instant::now();
        let beside = attack::run_in_rootfs(&b.node, "beside", &plain_rootfs, DEVICE, RUN_TIMEOUT).unwrap();
        let beside_done = std::time::Instant::now();
        let (run, costly_done) = costly.join().unwrap();
        println!(
            "link-folders: refused {:?} after its hook was seen; the plain container beside it ran in {:?}",
            costly_done - hook_seen,
            beside_done - hook_seen
        );
        ((run, costly_done), (beside, beside_done))
    });
    let (costly, costly_done) = costly;
    let (beside, beside_done) = beside;
    assert!(!costly.timed_out, "link-folders: the start hung (killed after {RUN_TIMEOUT:?})");
    assert!(beside.ok() && beside.report.is_some(), "the container beside did not run: {}", beside.stderr);
    assert!(beside_done < costly_done, "the plain container waited for the costly one to be refused");
    let a = Attack { name: "link-folders".into(), run: costly, rootfs, decoy, before };
    a.assert_decoy_unchanged();
    a.assert_failed_clearly(&["work budget", "/bomb"]);
    assert_clean(&b.node, "link-folders");

    let plant: Plant = &|r, _| plant_link_folders(r, 4, 38);
    let started = std::time::Instant::now();
    let a = b.attack("link-chains", plant);
    println!("link-chains: planted and refused in {:?}", started.elapsed());
    assert!(!a.run.ok() && a.run.report.is_none(), "link-chains: the container started");
    let err = &a.run.stderr;
    assert!(err.contains("work budget") || err.contains("timeout"), "link-chains: {err}");

    // The spec's timeout is enforced by runc: 1 s is far less than the scan above needs.
    b.node.regenerate_spec(&["--hook-timeout-secs".as_ref(), "1".as_ref()]).unwrap();
    let plant: Plant = &|r, _| plant_link_folders(r, 5, 0);
    let started = std::time::Instant::now();
    let a = b.attack("hook-timeout", plant);
    println!("hook-timeout: planted and refused in {:?}", started.elapsed());
    let err = &a.run.stderr;
    assert!(!a.run.ok() && a.run.report.is_none(), "hook-timeout: the container started");
    assert!(
        err.contains("timeout") && !err.contains("work budget"),
        "hook-timeout: not runc's timeout: {err}"
    );
    b.node.regenerate_spec(&[]).unwrap();
}
