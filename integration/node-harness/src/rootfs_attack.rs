//! Rootfs-escape attacks on the OCI hook, for `tests/security_hook.rs`: a decoy directory standing
//! for the host files an image must never reach, a snapshot of it precise enough to show any write
//! (contents, mtimes, ctimes, inodes, modes, link targets, new or vanished entries), containers run
//! with `ctr run --rootfs` (so the hostile tree is exactly what the test planted) through our
//! runtime with a bounded wait, and the old hook's behaviour (`ldconfig -r ROOT`, a chroot, run
//! while PID 1 of the container's PID namespace is still in the host root) as the positive control
//! that shows each route out is real.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::{Result, io};
use crate::node::{GpuNode, NVINJECT_RUNTIME, PROBE_PATH, parse_report};
use crate::process;

/// Where the simulated driver's libraries are mounted in a container (and the image's own live).
pub const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";
/// The decoy library's SONAME; its file is `libnvdecoy.so.1.0` and the SONAME link is missing, so
/// any ldconfig-like pass over the decoy's `lib/` creates `libnvdecoy.so.1` there.
pub const DECOY_SONAME: &str = "libnvdecoy.so.1";
/// The decoy library's file name.
pub const DECOY_LIB: &str = "libnvdecoy.so.1.0";

/// What one entry looked like; any write, rename, chmod, chown, truncation or relink changes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryState {
    /// `file`, `dir`, `symlink`, `fifo`, `socket`, `char`, `block`.
    pub kind: &'static str,
    /// Mode bits with the type.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// Modification time (seconds, nanoseconds).
    pub mtime: (i64, i64),
    /// Status-change time (seconds, nanoseconds): changes on chmod, chown, link and rename too.
    pub ctime: (i64, i64),
    /// Device and inode: a replaced file is another inode.
    pub id: (u64, u64),
    /// Hard link count.
    pub nlink: u64,
    /// A symlink's target.
    pub link: Option<PathBuf>,
    /// A regular file's SHA-256.
    pub sha256: Option<String>,
}

fn kind(t: &fs::FileType) -> &'static str {
    if t.is_symlink() {
        "symlink"
    } else if t.is_dir() {
        "dir"
    } else if t.is_file() {
        "file"
    } else if t.is_fifo() {
        "fifo"
    } else if t.is_socket() {
        "socket"
    } else if t.is_char_device() {
        "char"
    } else {
        "block"
    }
}

fn entry_state(path: &Path) -> Result<EntryState> {
    let meta = fs::symlink_metadata(path).map_err(io("stat", path))?;
    let t = meta.file_type();
    let link = if t.is_symlink() { Some(fs::read_link(path).map_err(io("readlink", path))?) } else { None };
    // Only regular files are read (a FIFO would block the snapshot itself).
    let sha256 = if t.is_file() {
        let bytes = fs::read(path).map_err(io("read", path))?;
        Some(Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect())
    } else {
        None
    };
    Ok(EntryState {
        kind: kind(&t),
        mode: meta.mode(),
        uid: meta.uid(),
        gid: meta.gid(),
        size: meta.size(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
        ctime: (meta.ctime(), meta.ctime_nsec()),
        id: (meta.dev(), meta.ino()),
        nlink: meta.nlink(),
        link,
        sha256,
    })
}

/// One entry that differs: its path, before and after (`None` where missing on that side).
pub type Difference = (PathBuf, Option<EntryState>, Option<EntryState>);

/// Every entry under a directory (the directory itself included, symlinks not followed).
#[derive(Debug, Clone)]
pub struct TreeSnapshot {
    root: PathBuf,
    entries: BTreeMap<PathBuf, EntryState>,
}

impl TreeSnapshot {
    /// Records `dir` and everything below it.
    pub fn take(dir: &Path) -> Result<TreeSnapshot> {
        let mut entries = BTreeMap::new();
        let mut stack = vec![dir.to_owned()];
        while let Some(path) = stack.pop() {
            let state = entry_state(&path)?;
            if state.kind == "dir" {
                for child in fs::read_dir(&path).map_err(io("list", &path))? {
                    stack.push(child.map_err(io("list", &path))?.path());
                }
            }
            entries.insert(path, state);
        }
        Ok(TreeSnapshot { root: dir.to_owned(), entries })
    }

    /// Number of entries recorded.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing was recorded (never, for an existing directory).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries that differ now from the snapshot: `(path, before, after)`, `None` where the entry
    /// is missing on that side.
    pub fn diff(&self) -> Result<Vec<Difference>> {
        let now = TreeSnapshot::take(&self.root)?;
        let mut out = Vec::new();
        for (path, before) in &self.entries {
            let after = now.entries.get(path);
            if after != Some(before) {
                out.push((path.clone(), Some(before.clone()), after.cloned()));
            }
        }
        for (path, after) in &now.entries {
            if !self.entries.contains_key(path) {
                out.push((path.clone(), None, Some(after.clone())));
            }
        }
        Ok(out)
    }

    /// What differs now from the snapshot, one line per entry (empty: nothing changed).
    pub fn changes(&self) -> Result<Vec<String>> {
        Ok(self
            .diff()?
            .into_iter()
            .map(|(path, before, after)| match (before, after) {
                (Some(_), None) => format!("{} vanished", path.display()),
                (None, Some(a)) => format!("{} appeared: {a:?}", path.display()),
                (b, a) => format!("{} changed: {b:?} -> {a:?}", path.display()),
            })
            .collect())
    }
}

/// A directory outside every rootfs holding what an escaping hook would hit: a cache, an
/// `ld.so.conf` (with an include and a directory line that lead back into the decoy through
/// `/proc/1/root`), a library whose SONAME link is missing, a symlink and a plain file.
#[derive(Debug, Clone)]
pub struct Decoy {
    /// The decoy's host path.
    pub dir: PathBuf,
}

impl Decoy {
    /// Makes the decoy at `dir` (which must not exist), copying the library `so` (with SONAME
    /// [`DECOY_SONAME`]) in as `lib/`[`DECOY_LIB`].
    pub fn plant(dir: &Path, so: &Path) -> Result<Decoy> {
        let d = Decoy { dir: dir.to_owned() };
        for sub in ["lib", "ld.so.conf.d"] {
            fs::create_dir_all(dir.join(sub)).map_err(io("create", dir.join(sub)))?;
        }
        let write = |rel: &str, text: String| {
            let p = dir.join(rel);
            fs::write(&p, text).map_err(io("write", p))
        };
        write("ld.so.cache", "decoy: the host's ld.so.cache, never to be replaced\n".into())?;
        write("ld.so.conf", format!("include {}/ld.so.conf.d/*.conf\n", d.via_proc()))?;
        write("ld.so.conf.d/host.conf", format!("{}/lib\n", d.via_proc()))?;
        write("victim", "decoy: a host file, never to be written\n".into())?;
        fs::copy(so, dir.join("lib").join(DECOY_LIB)).map_err(io("copy", so))?;
        let link = dir.join("lib/libnvdecoy.so");
        std::os::unix::fs::symlink(DECOY_LIB, &link).map_err(io("symlink", &link))?;
        Ok(d)
    }

    /// `/proc/1/root<dir>`: the decoy as a process whose PID 1 is still in the host root sees it.
    pub fn via_proc(&self) -> String {
        format!("/proc/1/root{}", self.dir.display())
    }

    /// `/proc/self/root<dir>`.
    pub fn via_proc_self(&self) -> String {
        format!("/proc/self/root{}", self.dir.display())
    }

    /// `../` repeated enough to climb out of any rootfs, then the decoy's host path.
    pub fn via_dots(&self) -> String {
        format!("{}{}", "../".repeat(24).trim_end_matches('/'), self.dir.display())
    }

    /// The snapshot to compare against after the attack.
    pub fn snapshot(&self) -> Result<TreeSnapshot> {
        TreeSnapshot::take(&self.dir)
    }

    /// Whether the SONAME link an ldconfig pass would make now exists in the decoy.
    pub fn soname_link_made(&self) -> bool {
        fs::symlink_metadata(self.dir.join("lib").join(DECOY_SONAME)).is_ok()
    }
}

/// Builds a shared object with `soname` at `out` with the host's C compiler.
pub fn shared_object(out: &Path, soname: &str) -> Result<()> {
    let src = out.with_extension("c");
    fs::write(&src, "int nvinject_decoy(void) { return 42; }\n").map_err(io("write", &src))?;
    process::run(
        Command::new("gcc")
            .args(["-shared", "-fPIC", "-nostdlib", &format!("-Wl,-soname,{soname}"), "-o"])
            .arg(out)
            .arg(&src),
    )?;
    Ok(())
}

/// Copies a whole tree (ownership, modes, links and times kept).
pub fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    process::run(Command::new("cp").arg("-a").arg(from).arg(to))?;
    Ok(())
}

/// Replaces `path` (a file, link or whole directory) with a symlink to `target`.
pub fn replace_with_symlink(path: &Path, target: &str) -> Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path).map_err(io("remove", path))?,
        Ok(_) => fs::remove_file(path).map_err(io("remove", path))?,
        Err(_) => {}
    }
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(io("create", parent))?;
    }
    std::os::unix::fs::symlink(target, path).map_err(io("symlink", path))
}

/// What a bounded run gave back.
#[derive(Debug, Clone)]
pub struct BoundedRun {
    /// The exit code (`None`: killed by a signal, or by us at the deadline).
    pub status: Option<i32>,
    /// Whether it was still running at the deadline (and was then killed).
    pub timed_out: bool,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
    /// The probe's report, when it printed one.
    pub report: Option<Value>,
}

impl BoundedRun {
    /// Whether it exited 0.
    pub fn ok(&self) -> bool {
        self.status == Some(0)
    }
}

/// Runs `cmd` with stdout and stderr into files under `logs` (named `name`), waiting at most
/// `timeout`; at the deadline it is killed (by its PID) and `on_timeout` cleans up after it.
fn bounded(
    cmd: &mut Command,
    logs: &Path,
    name: &str,
    timeout: Duration,
    on_timeout: impl FnOnce(),
) -> Result<BoundedRun> {
    let run = process::run_with_deadline(cmd, logs, name, timeout, on_timeout)?;
    Ok(BoundedRun {
        status: run.status,
        timed_out: run.timed_out,
        report: parse_report(&run.stdout),
        stdout: run.stdout,
        stderr: run.stderr,
    })
}

/// Runs the probe's report in a container whose root is the host directory `rootfs`
/// (`ctr run --rm --rootfs`), through our runtime with `device` (e.g. `nvidia.com/gpu=0`)
/// requested by annotation, waiting at most `timeout`. At the deadline `ctr`, any hook still
/// running from the node's private bin directory and the container are stopped.
pub fn run_in_rootfs(
    node: &GpuNode,
    id: &str,
    rootfs: &Path,
    device: &str,
    timeout: Duration,
) -> Result<BoundedRun> {
    let mut cmd = node.containerd.ctr();
    cmd.args(["run", "--rm", "--runtime", NVINJECT_RUNTIME])
        .arg("--annotation")
        .arg(format!("cdi.k8s.io/security={device}"))
        .arg("--rootfs")
        .arg(rootfs)
        .arg(id)
        .args([PROBE_PATH, "report"]);
    let bin = node.bin_dir.to_string_lossy().into_owned();
    bounded(&mut cmd, &node.base().join("runs"), id, timeout, || {
        // Only processes started from this node's private bin directory: its hooks.
        for p in process::find_processes(&bin) {
            process::stop_pid(p.pid, Duration::from_secs(2));
        }
        node.containerd.remove_all_containers();
    })
}

/// Runs the shell `script` (with `$1` = `rootfs`) the way a createContainer hook runs: under a
/// process that is PID 1 of a fresh PID namespace and stays in the host root (as `runc init` is),
/// with that namespace's procfs mounted at `ROOTFS/proc` (as runc mounts it before the hooks), so
/// `/proc/1/root` there leads to the host's `/`. The mount lives in a private mount namespace and
/// goes with it; the whole namespace is killed at the deadline (`unshare --kill-child`).
pub fn runc_like(
    rootfs: &Path,
    script: &str,
    logs: &Path,
    name: &str,
    timeout: Duration,
) -> Result<BoundedRun> {
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--pid", "--fork", "--kill-child", "--propagation", "private", "--"])
        .args(["/bin/sh", "-c"])
        // The script runs in a child (`rc=$?` keeps the shell from exec'ing it): the shell must
        // stay PID 1, in the host root, even when the script chroots.
        .arg(format!("mount -t proc proc \"$1/proc\" || exit 99; {script}; rc=$?; exit $rc"))
        .arg("sh")
        .arg(rootfs);
    bounded(&mut cmd, logs, name, timeout, || {})
}

/// What the old hook did, as the positive control: the host's `ldconfig -r ROOTFS` (only a
/// chroot), run [`runc_like`].
pub fn old_hook_ldconfig(rootfs: &Path, logs: &Path, name: &str, timeout: Duration) -> Result<BoundedRun> {
    runc_like(rootfs, "/sbin/ldconfig -r \"$1\"", logs, name, timeout)
}

/// How a path-walking program sees a rootfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Walk {
    /// Chrooted into it, as `ldconfig -r` is: absolute links resolve from the rootfs, whose
    /// `/proc` is the container's procfs.
    Chroot,
    /// From the runtime's root, joining the rootfs path and the path inside (as a hook that
    /// joins paths and uses plain file calls would).
    Joined,
}

/// `stat -L` of `path` (absolute inside `rootfs`, resolved by the kernel as any path-walking
/// program would, per `walk`) [`runc_like`]: `Some((dev, inode))` of what it leads to.
pub fn runc_like_identity(
    rootfs: &Path,
    path: &str,
    walk: Walk,
    logs: &Path,
    name: &str,
) -> Result<Option<(u64, u64)>> {
    let quoted = shell_quote(path.trim_start_matches('/'));
    let script = match walk {
        Walk::Chroot => format!("chroot \"$1\" /bin/stat -L -c '%d %i' /{quoted}"),
        Walk::Joined => format!("stat -L -c '%d %i' \"$1\"/{quoted}"),
    };
    let run = runc_like(rootfs, &script, logs, name, Duration::from_secs(30))?;
    let mut words = run.stdout.split_whitespace().map(|w| w.parse::<u64>().ok());
    Ok(match (words.next().flatten(), words.next().flatten()) {
        (Some(dev), Some(ino)) if run.ok() => Some((dev, ino)),
        _ => None,
    })
}

/// `(dev, inode)` of a host path, following links.
pub fn identity(path: &Path) -> Option<(u64, u64)> {
    fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}
