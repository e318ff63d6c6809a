//! Private mount and network namespaces for tests that run node daemons (containerd, the kubelet, the
//! device plugin), so that the host is left as it was.
//!
//! A test calls [`isolated`] with its own name. Outside, that re-runs the same test binary, filtered to
//! that one test, under `unshare --mount --net --propagation private`, streams its output, waits, and
//! then checks from the host's side that nothing was left behind: no process in the test's mount
//! namespace, no mount naming its work directory, no cgroup of its name, watched host paths and sysctls
//! unchanged. Inside (the re-run, recognised by an environment variable and a mount namespace that differs
//! from PID 1's), the test body runs with an [`Inside`] handle that can make host paths show test
//! directories ([`Inside::shadow`]) without creating anything on the host. Every mount made there lives
//! only in that namespace and disappears with it.
//!
//! Why a re-run rather than `setns` from the test: a multi-threaded process (every libtest binary) cannot
//! change its mount namespace, and running the whole body inside lets it use any other harness unchanged.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::mount::{MsFlags, mount};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::mounts::unescape_mountinfo;

/// Set in the re-run's environment to the name of the test that should run its body.
pub const TEST_ENV: &str = "NVINJECT_ISOLATED_TEST";
/// Set in the re-run's environment to the work directory the outer side made for it.
pub const DIR_ENV: &str = "NVINJECT_ISOLATED_DIR";
/// Set by a process that runs a part of an isolated test in namespaces of its own (a node agent):
/// the cgroup name that part uses, instead of its work directory's name.
pub const CGROUP_ENV: &str = "NVINJECT_ISOLATED_CGROUP";
/// Set (to 1) to keep the work directory after a passing run, for a look at the logs.
pub const KEEP_ENV: &str = "NVINJECT_KEEP_WORK";

/// Host paths that node daemons are known to create when not told otherwise; each must look the same
/// (absent, or the same entries) after an isolated test as before it.
pub const WATCHED_HOST_PATHS: &[&str] = &[
    // The kubelet's.
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/etc/kubernetes",
    "/usr/libexec/kubernetes",
    // containerd's and CNI's.
    "/etc/containerd",
    "/run/containerd",
    "/run/netns",
    "/var/lib/containerd",
    "/opt/containerd",
    "/var/lib/cni",
    "/etc/cni",
    "/opt/cni",
    // nvinject's installer, runtime and device plugin.
    "/etc/nvinject",
    "/usr/local/nvinject",
    "/usr/local/bin/containerd-shim-nvinject-v2",
    "/run/cdi",
    "/etc/cdi",
    "/var/lib/nvinject",
    "/run/nvinject",
    "/run/nvinject-installer.lock",
    "/dev/char",
    // The control plane's defaults (the cluster test gives each a directory of its own).
    "/run/kubernetes",
    "/var/lib/etcd",
];

/// The sysctls the kubelet (1.20, `setupKernelTunables`) rewrites when they differ from what it wants.
pub const KUBELET_SYSCTLS: &[&str] = &[
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// What went wrong setting up or checking an isolated test.
#[derive(Debug, thiserror::Error)]
pub enum NsError {
    /// A file-system operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A mount(2) call failed.
    #[error("mount {what} on {}: {source}", target.display())]
    Mount {
        /// What was mounted (source path or file-system type).
        what: String,
        /// Where.
        target: PathBuf,
        /// The OS error.
        source: nix::Error,
    },
    /// A command could not be run, or failed.
    #[error("{command}: {detail}")]
    Command {
        /// The command line.
        command: String,
        /// How it failed.
        detail: String,
    },
    /// The environment says "inside" but this process shares PID 1's mount namespace.
    #[error(
        "{TEST_ENV} is set but this process is in the host's mount namespace: run the test normally, \
         it re-runs itself under unshare"
    )]
    NotIsolated,
    /// The re-run did not finish in time; everything in its namespace was killed.
    #[error("the isolated run of {test} did not finish within {timeout:?}; killed PIDs {killed:?}")]
    Timeout {
        /// The test.
        test: String,
        /// The limit.
        timeout: Duration,
        /// The processes of its namespace that were killed.
        killed: Vec<i32>,
    },
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> NsError + use<> {
    let path = path.to_path_buf();
    move |source| NsError::Io { op, path, source }
}

/// The identity of a mount namespace, as `/proc/<pid>/ns/mnt` reads (`mnt:[4026531841]`).
pub fn mount_ns_of(pid: &str) -> Option<String> {
    fs::read_link(format!("/proc/{pid}/ns/mnt")).ok().map(|p| p.to_string_lossy().into_owned())
}

/// Every process whose mount namespace is `ns`, with its command name.
pub fn processes_in_mount_ns(ns: &str) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else { return found };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if mount_ns_of(&pid.to_string()).as_deref() == Some(ns) {
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            found.push((pid, comm.trim().to_owned()));
        }
    }
    found
}

/// What the host looked like before an isolated run, to compare with after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSnapshot {
    /// For each watched path: `None` when absent, else the sorted names of its entries (empty for files).
    pub paths: BTreeMap<String, Option<Vec<String>>>,
    /// For each sysctl in [`KUBELET_SYSCTLS`]: its value.
    pub sysctls: BTreeMap<String, String>,
}

impl HostSnapshot {
    /// Reads the watched paths and the kubelet's sysctls.
    pub fn take() -> Self {
        let paths = WATCHED_HOST_PATHS
            .iter()
            .map(|p| {
                let listing = match fs::read_dir(p) {
                    Ok(rd) => {
                        let mut names: Vec<String> =
                            rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
                        names.sort();
                        Some(names)
                    }
                    Err(_) if Path::new(p).exists() => Some(Vec::new()),
                    Err(_) => None,
                };
                ((*p).to_owned(), listing)
            })
            .collect();
        let sysctls = KUBELET_SYSCTLS
            .iter()
            .map(|s| {
                let value = fs::read_to_string(Path::new("/proc/sys").join(s)).unwrap_or_default();
                ((*s).to_owned(), value.trim().to_owned())
            })
            .collect();
        HostSnapshot { paths, sysctls }
    }

    /// One line per difference from `before`, saying what changed.
    pub fn differences(before: &HostSnapshot, after: &HostSnapshot) -> Vec<String> {
        let mut out = Vec::new();
        for (path, was) in &before.paths {
            let now = after.paths.get(path).cloned().flatten();
            if was.as_ref() != now.as_ref() {
                out.push(format!("host path {path} changed: before {was:?}, after {now:?}"));
            }
        }
        for (name, was) in &before.sysctls {
            let now = after.sysctls.get(name).map(String::as_str).unwrap_or("");
            if was != now {
                out.push(format!("sysctl {name} changed: before {was}, after {now}"));
            }
        }
        out
    }
}

/// Cgroup hierarchies mounted on this host: (mount point, file-system type, super options).
pub fn cgroup_mounts() -> Vec<(PathBuf, String, String)> {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    parse_cgroup_mounts(&text)
}

/// Parses `/proc/self/mountinfo` text for cgroup and cgroup2 mounts (pure, for tests).
pub fn parse_cgroup_mounts(mountinfo: &str) -> Vec<(PathBuf, String, String)> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let Some(mount_point) = left.split(' ').nth(4) else { continue };
        let mut r = right.split(' ');
        let (Some(fstype), Some(_source), Some(opts)) = (r.next(), r.next(), r.next()) else { continue };
        if fstype == "cgroup" || fstype == "cgroup2" {
            out.push((PathBuf::from(unescape_mountinfo(mount_point)), fstype.to_owned(), opts.to_owned()));
        }
    }
    out
}

/// The result of an isolated run as seen from outside.
#[derive(Debug)]
pub struct Outcome {
    /// Whether the re-run's test passed (exit status 0).
    pub passed: bool,
    /// Its exit status, as text.
    pub status: String,
    /// Everything found left behind (processes, mounts, cgroups, host paths, sysctls, files).
    pub leftovers: Vec<String>,
    /// The work directory (removed unless the run failed or [`KEEP_ENV`] is set).
    pub work: PathBuf,
    /// How long the re-run took, start to exit.
    pub wall: Duration,
}

/// Runs the body of test `test` inside private namespaces (when called inside the re-run) or arranges the
/// re-run and checks the host afterwards (when called from the test harness). Panics, as a test should,
/// on failure or on anything left behind, with what and where. `test` is the test's name as libtest
/// knows it (`module::name` for a test inside a module), since the re-run selects it with `--exact`.
pub fn isolated(test: &str, timeout: Duration, body: impl FnOnce(&Inside)) {
    if let Some(inside) = inside(test) {
        let guards = inside
            .guard_watched_paths()
            .unwrap_or_else(|e| panic!("cannot guard the watched host paths for {test}: {e}"));
        // The guards are checked even when the body panics: a failing test may well be the one that
        // wrote where it should not.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&inside)));
        inside.report_guards(&guards);
        if let Err(panic) = result {
            std::panic::resume_unwind(panic);
        }
        return;
    }
    let outcome = run_outside(test, timeout).unwrap_or_else(|e| panic!("isolated run of {test}: {e}"));
    println!("isolated run of {test}: {} in {:.1?}", outcome.status, outcome.wall);
    assert!(
        outcome.passed,
        "{test} failed inside its namespaces ({}); its output is above; work directory kept at {}",
        outcome.status,
        outcome.work.display()
    );
    assert!(
        outcome.leftovers.is_empty(),
        "{test} left things behind:\n  {}\n(work directory {})",
        outcome.leftovers.join("\n  "),
        outcome.work.display()
    );
}

/// `Some` when this process is the isolated re-run of `test` (then in its own namespaces, with the
/// loopback up); `None` in the ordinary test run. Panics when the environment claims a re-run that the
/// namespaces contradict.
pub fn inside(test: &str) -> Option<Inside> {
    if std::env::var(TEST_ENV).as_deref() != Ok(test) {
        return None;
    }
    Some(Inside::enter().unwrap_or_else(|e| panic!("cannot start the isolated body of {test}: {e}")))
}

/// The outside half of [`isolated`]: re-runs `test` under unshare, waits at most `timeout`, and reports
/// what it left behind.
pub fn run_outside(test: &str, timeout: Duration) -> Result<Outcome, NsError> {
    let exe = std::env::current_exe().map_err(io("locate the test binary", Path::new("/proc/self/exe")))?;
    let work = std::env::temp_dir().join(format!("nvinject-{}-{}", short_name(test), std::process::id()));
    if work.exists() {
        fs::remove_dir_all(&work).map_err(io("remove stale work dir", &work))?;
    }
    fs::create_dir_all(&work).map_err(io("create work dir", &work))?;
    let before = HostSnapshot::take();

    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--net", "--propagation", "private", "--"])
        .arg(&exe)
        // The test is root-only, so marked ignored (CONTRIBUTING.md): the re-run must include it.
        .args([test, "--exact", "--include-ignored", "--nocapture", "--test-threads=1"])
        .env(TEST_ENV, test)
        .env(DIR_ENV, &work)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|e| NsError::Command {
        command: "unshare --mount --net".into(),
        detail: format!("{e} (is util-linux installed?)"),
    })?;
    // Forward through print! so libtest's capture keeps the re-run's output with this test's.
    let out = child.stdout.take().map(|s| std::thread::spawn(move || forward(s)));
    let err = child.stderr.take().map(|s| std::thread::spawn(move || forward(s)));

    let ns_file = work.join("mount-ns");
    let status = loop {
        if let Some(status) = child.try_wait().map_err(io("wait for", &exe))? {
            break status;
        }
        if started.elapsed() > timeout {
            let ns = fs::read_to_string(&ns_file).unwrap_or_default();
            let mut killed = Vec::new();
            if !ns.is_empty() {
                for (pid, _) in processes_in_mount_ns(ns.trim()) {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                    killed.push(pid);
                }
            }
            let _ = child.kill();
            let _ = child.wait();
            // Killed, the body could not remove its cgroups: do it here (they are empty now).
            std::thread::sleep(Duration::from_millis(200));
            remove_cgroup_tree(&cgroup_name_for(&work));
            return Err(NsError::Timeout { test: test.to_owned(), timeout, killed });
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let wall = started.elapsed();

    let mut leftovers = Vec::new();
    match fs::read_to_string(&ns_file) {
        Ok(ns) => {
            let ns = ns.trim();
            // The namespace outlives its last process only through a bind mount of its nsfs file; none
            // is made, so a live process is the only way to leave it behind.
            for (pid, comm) in processes_in_mount_ns(ns) {
                leftovers
                    .push(format!("process {pid} ({comm}) still running in the test's mount namespace {ns}"));
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        Err(_) if status.success() => leftovers.push(format!("{} was never written", ns_file.display())),
        Err(_) => {}
    }
    // Only now: a leaked process may hold the output pipes open until it is killed above.
    for t in [out, err].into_iter().flatten() {
        let _ = t.join();
    }
    let work_str = work.to_string_lossy().into_owned();
    if let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") {
        for line in mountinfo.lines().filter(|l| l.contains(&work_str)) {
            leftovers.push(format!("host mount left: {line}"));
        }
    }
    let cgroup_name = cgroup_name_for(&work);
    for (mount_point, _, _) in cgroup_mounts() {
        let dir = mount_point.join(&cgroup_name);
        if dir.exists() {
            leftovers.push(format!("cgroup left: {}", dir.display()));
        }
    }
    // Reported above; removed now so that a failing test does not leave the host dirty.
    for failure in remove_cgroup_tree(&cgroup_name) {
        leftovers.push(failure);
    }
    leftovers.extend(HostSnapshot::differences(&before, &HostSnapshot::take()));
    leftovers.extend(guard_leftovers(&work));

    let passed = status.success();
    let keep = !passed || std::env::var(KEEP_ENV).as_deref() == Ok("1");
    if !keep && leftovers.is_empty() {
        // A busy mount or an undeletable file would show up here.
        if let Err(e) = fs::remove_dir_all(&work) {
            leftovers.push(format!("cannot remove the work dir {}: {e}", work.display()));
        }
    }
    Ok(Outcome { passed, status: status.to_string(), leftovers, work, wall })
}

fn forward(stream: impl std::io::Read) {
    for line in BufReader::new(stream).lines() {
        match line {
            Ok(line) => println!("{line}"),
            Err(_) => break,
        }
    }
}

/// Test names can be long paths (`module::test`); keep the last part for file and cgroup names.
fn short_name(test: &str) -> String {
    let last = test.rsplit("::").next().unwrap_or(test);
    last.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).take(40).collect()
}

/// `dir` and every directory below it, children before their parent (the order `rmdir` needs);
/// empty when `dir` is not a directory.
pub fn dirs_deepest_first(dir: &Path) -> Vec<PathBuf> {
    fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(entries) = fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    collect(&e.path(), out);
                }
            }
        }
        out.push(dir.to_path_buf());
    }
    let mut out = Vec::new();
    if dir.is_dir() {
        collect(dir, &mut out);
    }
    out
}

/// Removes `/<name>` (leading `/` optional) and everything below it in every cgroup hierarchy,
/// deepest first; returns what could not be removed (a cgroup still holding a process). An empty
/// name removes nothing: it would mean every hierarchy's root.
pub fn remove_cgroup_tree(name: &str) -> Vec<String> {
    let name = name.trim_start_matches('/');
    let mut failures = Vec::new();
    if name.is_empty() {
        return failures;
    }
    for (mount_point, _, _) in cgroup_mounts() {
        for dir in dirs_deepest_first(&mount_point.join(name)) {
            if let Err(e) = fs::remove_dir(&dir) {
                failures.push(format!("cannot remove cgroup {}: {e}", dir.display()));
            }
        }
    }
    failures
}

/// The cgroup name an isolated test uses (under every hierarchy's root): the work dir's name, so the
/// outer side can check it is gone.
pub fn cgroup_name_for(work: &Path) -> String {
    work.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "nvinject-isolated".into())
}

/// The inside of an isolated test: private mount and network namespaces, and a work directory.
#[derive(Debug)]
pub struct Inside {
    work: PathBuf,
    mirrors: AtomicUsize,
    /// Paths this process created inside mirrors (for [`Inside::shadow`]), which the guard check expects.
    created: Mutex<BTreeSet<PathBuf>>,
}

/// How one of [`WATCHED_HOST_PATHS`] is guarded during an isolated body, so that a write to it lands
/// where the check can see it whether or not the path already exists on this machine (a warm machine
/// has what earlier runs created; a fresh one does not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guard {
    /// Present on the host: covered by an empty directory (or file) of the work directory, which the
    /// outer side finds still empty after the run ([`guard_leftovers`]).
    Masked {
        /// The watched host path.
        host: PathBuf,
        /// The work-directory entry mounted over it.
        mask: PathBuf,
    },
    /// Absent on the host: its nearest existing ancestor shows a mirror (here only), so whatever is
    /// created lands in this namespace; at the end of the body it must not exist beyond what
    /// [`Inside::shadow`] made ([`Inside::report_guards`]).
    Absent {
        /// The watched host path.
        host: PathBuf,
    },
}

/// Where the guards keep their masks and report, under the work directory.
const GUARDS_DIR: &str = "guards";
/// The inside's report of watched paths created in this namespace (one line each).
const GUARD_REPORT: &str = "absent-paths-created";

impl Inside {
    /// Checks that this process really is in its own mount namespace, records that namespace for the
    /// outer side's leak check, and brings the loopback interface up.
    pub fn enter() -> Result<Self, NsError> {
        let work = PathBuf::from(std::env::var_os(DIR_ENV).ok_or(NsError::NotIsolated)?);
        let mine = mount_ns_of("self").ok_or(NsError::NotIsolated)?;
        if Some(&mine) == mount_ns_of("1").as_ref() {
            return Err(NsError::NotIsolated);
        }
        let ns_file = work.join("mount-ns");
        fs::write(&ns_file, &mine).map_err(io("write", &ns_file))?;
        run(Command::new("ip").args(["link", "set", "lo", "up"]))?;
        Ok(Inside { work, mirrors: AtomicUsize::new(0), created: Mutex::new(BTreeSet::new()) })
    }

    /// Guards every path of [`WATCHED_HOST_PATHS`] for the body of an isolated test (see [`Guard`]).
    /// A watched path that is a symlink is left as it is (the host snapshot still compares it).
    pub fn guard_watched_paths(&self) -> Result<Vec<Guard>, NsError> {
        let masks = self.work.join(GUARDS_DIR).join("masks");
        fs::create_dir_all(&masks).map_err(io("create", &masks))?;
        let mut guards = Vec::new();
        for host in WATCHED_HOST_PATHS.iter().map(Path::new) {
            match fs::symlink_metadata(host) {
                Ok(meta) if meta.file_type().is_symlink() => {}
                Ok(meta) => {
                    let mask = masks.join(host.to_string_lossy().trim_start_matches('/').replace('/', "_"));
                    if meta.is_dir() {
                        fs::create_dir(&mask).map_err(io("create", &mask))?;
                    } else {
                        fs::write(&mask, b"").map_err(io("create", &mask))?;
                    }
                    fs::set_permissions(&mask, meta.permissions()).map_err(io("chmod", &mask))?;
                    let record = mask.with_extension("of");
                    fs::write(&record, host.as_os_str().as_encoded_bytes()).map_err(io("write", &record))?;
                    bind(&mask, host, false)?;
                    guards.push(Guard::Masked { host: host.to_path_buf(), mask });
                }
                Err(_) => {
                    self.mirror_nearest_ancestor(host)?;
                    guards.push(Guard::Absent { host: host.to_path_buf() });
                }
            }
        }
        Ok(guards)
    }

    /// Checks the [`Guard::Absent`] paths at the end of the body and writes what it finds for the outer
    /// side, which reports it with the other leftovers. Masks need no report: the outer side reads them.
    pub fn report_guards(&self, guards: &[Guard]) {
        let created = self.created.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mount_points = mount_points();
        let mut lines = Vec::new();
        for guard in guards {
            if let Guard::Absent { host } = guard {
                unexpected_entries(host, &created, &mount_points, &mut lines);
            }
        }
        let report = self.work.join(GUARDS_DIR).join(GUARD_REPORT);
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        if let Err(e) = fs::write(&report, text) {
            eprintln!("cannot write the guard report {}: {e}", report.display());
        }
    }

    /// Makes the nearest existing ancestor of `path` a mirror, unless it is one already.
    fn mirror_nearest_ancestor(&self, path: &Path) -> Result<(), NsError> {
        let ancestor = nearest_existing_ancestor(path);
        if is_mirror(ancestor) { Ok(()) } else { self.mirror(ancestor).map(|_| ()) }
    }

    /// The work directory: everything the test writes goes here.
    pub fn work(&self) -> &Path {
        &self.work
    }

    /// The cgroup name to use under each hierarchy (checked by the outer side).
    pub fn cgroup_name(&self) -> String {
        std::env::var(CGROUP_ENV)
            .ok()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| cgroup_name_for(&self.work))
    }

    /// Makes `path` show `source` (a directory or file) in this mount namespace. When `path` does not
    /// exist on the host, its nearest existing ancestor is replaced (here only) by a mirror: a tmpfs
    /// holding bind mounts of each original entry plus the new one, so nothing is created on the host.
    pub fn shadow(&self, path: &Path, source: &Path) -> Result<(), NsError> {
        assert!(path.is_absolute(), "shadow needs an absolute path, got {}", path.display());
        let src_meta = fs::metadata(source).map_err(io("stat", source))?;
        if !path.exists() {
            self.materialize(path, src_meta.is_dir())?;
        }
        bind(source, path, false)
    }

    /// Shadows the file `path` with a file in the work dir holding `contents` (for sysctls a daemon rewrites).
    pub fn shadow_file(&self, path: &Path, contents: &str) -> Result<PathBuf, NsError> {
        let name: String = path.to_string_lossy().trim_start_matches('/').replace('/', "_");
        let dir = self.work.join("shadowed-files");
        fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        let file = dir.join(name);
        fs::write(&file, contents).map_err(io("write", &file))?;
        self.shadow(path, &file)?;
        Ok(file)
    }

    /// Shadows each of the kubelet's sysctls with a file holding its current value; returns the files.
    pub fn shadow_kubelet_sysctls(&self) -> Result<Vec<(String, PathBuf)>, NsError> {
        let mut files = Vec::new();
        for name in KUBELET_SYSCTLS {
            let path = Path::new("/proc/sys").join(name);
            let value = fs::read_to_string(&path).map_err(io("read", &path))?;
            files.push(((*name).to_owned(), self.shadow_file(&path, &value)?));
        }
        Ok(files)
    }

    /// Creates `path` (and missing parents) inside a mirror of its nearest existing ancestor.
    fn materialize(&self, path: &Path, dir: bool) -> Result<(), NsError> {
        let found = nearest_existing_ancestor(path);
        let rel = path.strip_prefix(found).expect("ancestor is a prefix of path");
        // Through its real path: /var/run/cdi is made as /run/cdi, and recorded so.
        let ancestor = &fs::canonicalize(found).map_err(io("resolve", found))?;
        let path = &ancestor.join(rel);
        let made = if is_mirror(ancestor) {
            // Already a tmpfs of ours: plain creation stays in this namespace.
            create_missing(path, dir)?
        } else {
            let staging = self.mirror(ancestor)?;
            let made = create_missing(&staging.join(rel), dir)?;
            made.iter()
                .map(|p| ancestor.join(p.strip_prefix(&staging).expect("made below staging")))
                .collect()
        };
        self.created.lock().unwrap_or_else(|e| e.into_inner()).extend(made);
        Ok(())
    }

    /// Covers the existing directory `ancestor` (here only) with a tmpfs holding bind mounts of each of
    /// its entries; returns the tmpfs's staging path (it shows the same tmpfs as `ancestor` does, without
    /// the mounts made on `ancestor`'s paths later).
    fn mirror(&self, ancestor: &Path) -> Result<PathBuf, NsError> {
        let n = self.mirrors.fetch_add(1, Ordering::Relaxed);
        let staging = self.work.join("mirrors").join(n.to_string());
        fs::create_dir_all(&staging).map_err(io("create", &staging))?;
        mount(Some(mirror_source().as_str()), &staging, Some("tmpfs"), MsFlags::empty(), Some("mode=755"))
            .map_err(|source| NsError::Mount { what: "tmpfs".into(), target: staging.clone(), source })?;
        let meta = fs::metadata(ancestor).map_err(io("stat", ancestor))?;
        fs::set_permissions(&staging, meta.permissions()).map_err(io("chmod", &staging))?;
        for entry in fs::read_dir(ancestor).map_err(io("list", ancestor))?.flatten() {
            let original = entry.path();
            let copy = staging.join(entry.file_name());
            let ft = entry.file_type().map_err(io("stat", &original))?;
            if ft.is_symlink() {
                let target = fs::read_link(&original).map_err(io("readlink", &original))?;
                std::os::unix::fs::symlink(&target, &copy).map_err(io("symlink", &copy))?;
                continue;
            }
            if ft.is_dir() {
                fs::create_dir(&copy).map_err(io("create", &copy))?;
            } else if ft.is_file()
                || ft.is_socket()
                || ft.is_fifo()
                || ft.is_char_device()
                || ft.is_block_device()
            {
                fs::write(&copy, b"").map_err(io("create", &copy))?;
            }
            bind(&original, &copy, true)?;
        }
        bind(&staging, ancestor, true)?;
        fs::write(self.work.join("mirrors").join(format!("{n}.of")), ancestor.as_os_str().as_encoded_bytes())
            .map_err(io("write", &self.work))?;
        Ok(staging)
    }
}

/// The nearest ancestor of `path` that exists (`/` at worst).
fn nearest_existing_ancestor(path: &Path) -> &Path {
    let mut ancestor = path.parent().unwrap_or(Path::new("/"));
    while !ancestor.exists() {
        ancestor = ancestor.parent().unwrap_or(Path::new("/"));
    }
    ancestor
}

/// Every mount point of this mount namespace.
fn mount_points() -> BTreeSet<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines().filter_map(|l| l.split(' ').nth(4)).map(|mp| PathBuf::from(unescape_mountinfo(mp))).collect()
}

/// Adds a line to `out` for `path` (when it exists and this process did not create it) or for each
/// entry below it that it did not create; a mount point the test made ([`Inside::shadow`]) ends the
/// walk there, since what lies below is the test's own directory.
fn unexpected_entries(
    path: &Path,
    created: &BTreeSet<PathBuf>,
    mount_points: &BTreeSet<PathBuf>,
    out: &mut Vec<String>,
) {
    let Ok(meta) = fs::symlink_metadata(path) else { return };
    if !created.contains(path) {
        let what = if meta.is_dir() {
            let mut names: Vec<String> = fs::read_dir(path)
                .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
                .unwrap_or_default();
            names.sort();
            format!("a directory holding {names:?}")
        } else {
            format!("a file of {} bytes", meta.len())
        };
        out.push(format!(
            "host path {} was created during the test ({what}): on a host without it, the test would \
             have written there; give the daemon a directory of the test's",
            path.display()
        ));
        return;
    }
    if !meta.is_dir() || mount_points.contains(path) {
        return;
    }
    for entry in fs::read_dir(path).into_iter().flatten().flatten() {
        unexpected_entries(&entry.path(), created, mount_points, out);
    }
}

/// What the guards of the isolated run in `work` caught: masks that are no longer empty, and the
/// inside's report of absent paths that were created.
pub fn guard_leftovers(work: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let guards = work.join(GUARDS_DIR);
    let masks = guards.join("masks");
    for entry in fs::read_dir(&masks).into_iter().flatten().flatten() {
        let mask = entry.path();
        if mask.extension().is_some_and(|e| e == "of") {
            continue;
        }
        let host = fs::read_to_string(mask.with_extension("of")).unwrap_or_default();
        let written = match fs::symlink_metadata(&mask) {
            Ok(m) if m.is_dir() => {
                let mut names: Vec<String> = fs::read_dir(&mask)
                    .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
                    .unwrap_or_default();
                names.sort();
                (!names.is_empty()).then(|| format!("entries {names:?} were made in it"))
            }
            Ok(m) => (m.len() > 0).then(|| format!("{} bytes were written to it", m.len())),
            Err(e) => Some(format!("its mask {} is gone ({e})", mask.display())),
        };
        if let Some(written) = written {
            out.push(format!(
                "host path {host} was written during the test ({written}; the test saw an empty stand-in \
                 at {}): give the daemon a directory of the test's",
                mask.display()
            ));
        }
    }
    let report = guards.join(GUARD_REPORT);
    match fs::read_to_string(&report) {
        Ok(text) => out.extend(text.lines().map(str::to_owned)),
        // No report and no masks dir: the body never started guarding (it failed before, and says so).
        Err(_) if !masks.exists() => {}
        Err(e) => out.push(format!("the guard report {} cannot be read: {e}", report.display())),
    }
    out
}

/// The source name of this process's mirror mounts. Per process: a node agent, started in namespaces
/// of its own below an isolated test's, sees the test's mirrors too (the same tmpfs), and what it
/// makes must go into mirrors of its own, not into the test's where the test's guards would find it.
fn mirror_source() -> String {
    format!("nvinject-mirror-{}", std::process::id())
}

/// True when `dir` sits on one of this process's mirror tmpfs mounts (see [`mirror_source`]).
fn is_mirror(dir: &Path) -> bool {
    let Ok(dir_meta) = fs::metadata(dir) else { return false };
    let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") else { return false };
    let marker = format!(" - tmpfs {} ", mirror_source());
    mountinfo.lines().filter(|l| l.contains(&marker)).any(|l| {
        l.split(' ')
            .nth(4)
            .and_then(|mp| fs::metadata(unescape_mountinfo(mp)).ok())
            .is_some_and(|m| m.dev() == dir_meta.dev())
    })
}

/// Creates `path` (a directory or an empty file) and its missing parents; returns what it created.
fn create_missing(path: &Path, dir: bool) -> Result<Vec<PathBuf>, NsError> {
    let made: Vec<PathBuf> =
        path.ancestors().take_while(|p| fs::symlink_metadata(p).is_err()).map(Path::to_path_buf).collect();
    if dir {
        fs::create_dir_all(path).map_err(io("create", path))?;
    } else {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io("create", parent))?;
        }
        fs::write(path, b"").map_err(io("create", path))?;
    }
    Ok(made)
}

fn bind(source: &Path, target: &Path, recursive: bool) -> Result<(), NsError> {
    let flags = if recursive { MsFlags::MS_BIND | MsFlags::MS_REC } else { MsFlags::MS_BIND };
    mount(Some(source), target, None::<&str>, flags, None::<&str>).map_err(|e| NsError::Mount {
        what: source.display().to_string(),
        target: target.to_path_buf(),
        source: e,
    })
}

fn run(cmd: &mut Command) -> Result<(), NsError> {
    let line = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| NsError::Command { command: line.clone(), detail: e.to_string() })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NsError::Command {
            command: line,
            detail: format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cgroup_v1_and_v2_mounts_and_ignores_others() {
        let text = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
";
        let mounts = parse_cgroup_mounts(text);
        let points: Vec<_> = mounts.iter().map(|(p, t, _)| (p.to_str().unwrap(), t.as_str())).collect();
        assert_eq!(
            points,
            [
                ("/sys/fs/cgroup/cpu", "cgroup"),
                ("/sys/fs/cgroup/systemd", "cgroup"),
                ("/sys/fs/cgroup/unified", "cgroup2")
            ]
        );
    }

    #[test]
    fn reports_each_changed_path_and_sysctl() {
        let mut before = HostSnapshot { paths: BTreeMap::new(), sysctls: BTreeMap::new() };
        before.paths.insert("/var/lib/kubelet".into(), None);
        before.paths.insert("/run/netns".into(), Some(vec!["a".into()]));
        before.sysctls.insert("kernel/panic".into(), "0".into());
        let mut after = before.clone();
        assert!(HostSnapshot::differences(&before, &after).is_empty());
        after.paths.insert("/var/lib/kubelet".into(), Some(vec!["device-plugins".into()]));
        after.sysctls.insert("kernel/panic".into(), "10".into());
        let diffs = HostSnapshot::differences(&before, &after);
        assert_eq!(diffs.len(), 2, "{diffs:?}");
        assert!(diffs[0].contains("/var/lib/kubelet") && diffs[0].contains("device-plugins"));
        assert!(diffs[1].contains("kernel/panic") && diffs[1].contains("after 10"));
    }

    #[test]
    fn directories_come_before_their_parent_and_files_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(root.join("a/b")).unwrap();
        fs::create_dir_all(root.join("c")).unwrap();
        fs::write(root.join("a/file"), "").unwrap();
        let dirs = dirs_deepest_first(&root);
        let pos = |rel: &str| {
            dirs.iter().position(|d| *d == root.join(rel)).unwrap_or_else(|| panic!("{rel}: {dirs:?}"))
        };
        assert_eq!(dirs.len(), 4, "{dirs:?}");
        assert!(pos("a/b") < pos("a") && pos("a") < pos("") && pos("c") < pos(""), "{dirs:?}");
        assert!(dirs_deepest_first(&root.join("a/file")).is_empty());
        assert!(dirs_deepest_first(&root.join("missing")).is_empty());
    }

    #[test]
    fn a_created_watched_path_is_reported_unless_the_test_made_it_and_a_shadow_ends_the_walk() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // What a test made for its shadows: kubelet/ and the mount point kubelet/device-plugins.
        fs::create_dir_all(root.join("kubelet/device-plugins/inside-the-shadow")).unwrap();
        let created: BTreeSet<PathBuf> =
            [root.join("kubelet"), root.join("kubelet/device-plugins")].into_iter().collect();
        let mounts: BTreeSet<PathBuf> = [root.join("kubelet/device-plugins")].into_iter().collect();
        let mut out = Vec::new();
        unexpected_entries(&root.join("kubelet"), &created, &mounts, &mut out);
        unexpected_entries(&root.join("absent"), &created, &mounts, &mut out);
        assert!(out.is_empty(), "{out:?}");

        // A daemon's write next to the shadow, and a whole watched path nobody made.
        fs::create_dir_all(root.join("kubelet/pods")).unwrap();
        fs::create_dir_all(root.join("libexec-kubernetes/kubelet-plugins")).unwrap();
        unexpected_entries(&root.join("kubelet"), &created, &mounts, &mut out);
        unexpected_entries(&root.join("libexec-kubernetes"), &created, &mounts, &mut out);
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(out[0].contains("kubelet/pods was created"), "{}", out[0]);
        assert!(out[1].contains("libexec-kubernetes was created") && out[1].contains("kubelet-plugins"));
    }

    #[test]
    fn masks_written_to_and_the_inside_report_become_leftovers() {
        let work = tempfile::tempdir().unwrap();
        let masks = work.path().join(GUARDS_DIR).join("masks");
        fs::create_dir_all(masks.join("usr_libexec_kubernetes")).unwrap();
        fs::write(masks.join("usr_libexec_kubernetes.of"), "/usr/libexec/kubernetes").unwrap();
        fs::write(masks.join("run_lock"), "").unwrap();
        fs::write(masks.join("run_lock.of"), "/run/lock").unwrap();
        fs::write(work.path().join(GUARDS_DIR).join(GUARD_REPORT), "").unwrap();
        assert!(guard_leftovers(work.path()).is_empty());

        fs::create_dir(masks.join("usr_libexec_kubernetes/kubelet-plugins")).unwrap();
        fs::write(masks.join("run_lock"), "123").unwrap();
        fs::write(work.path().join(GUARDS_DIR).join(GUARD_REPORT), "host path /etc/cni was created\n")
            .unwrap();
        let found = guard_leftovers(work.path());
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found.iter().any(|l| l.contains("/usr/libexec/kubernetes") && l.contains("kubelet-plugins")));
        assert!(found.iter().any(|l| l.contains("/run/lock") && l.contains("3 bytes")));
        assert!(found.iter().any(|l| l == "host path /etc/cni was created"));
    }

    #[test]
    fn short_names_are_safe_for_paths_and_cgroups() {
        assert_eq!(short_name("e2e::kubelet_runs_pod"), "kubelet-runs-pod");
        assert_eq!(cgroup_name_for(Path::new("/tmp/nvinject-x-12")), "nvinject-x-12");
    }
}
