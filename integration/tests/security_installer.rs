//! Issue 11, installer side: the real `nvinject-installer` binary run against a temporary host
//! root `H` holding a Debian-style containerd config, once per attack on the host root. Each
//! attack plants links, FIFOs or devices inside `H`; the installer must stay inside `H` (a decoy
//! tree outside `H` keeps its bytes and gets nothing new), must fail fast where it cannot read a
//! source, and must then leave `H` byte-identical.
//!
//! No containerd runs: the version is given (`--containerd-version`) and restarts are off. Needs
//! root (mknod, mount of a private procfs inside `H`). Run by hand:
//! `cargo test -p nvinject-integration --test security_installer -- --nocapture`.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use nvinject_node_harness::process;
use nvinject_simnode::artifacts::{artifact, static_shim};

const CONFIG: &str = "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n\n[plugins]\n  \
                      [plugins.\"io.containerd.grpc.v1.cri\"]\n    sandbox_image = \"registry.k8s.io/pause:3.9\"\n    \
                      [plugins.\"io.containerd.grpc.v1.cri\".cni]\n      bin_dir = \"/usr/lib/cni\"\n      \
                      conf_dir = \"/etc/cni/net.d\"\n";

const SECRET: &str =
    "# decoy outside the host root: never read, never written\n[secret]\ntoken = \"s3cr3t\"\n";

/// The installer image's binaries, copied once per test.
fn image_bin(t: &Path) -> PathBuf {
    let dir = t.join("image-bin");
    fs::create_dir_all(&dir).unwrap();
    for (from, file) in [
        (artifact("nvinject-installer", "nvinject-installer"), "nvinject-installer"),
        (static_shim(), "containerd-shim-nvinject-v2"),
        (artifact("nvinject-shim", "nvinject-hook"), "nvinject-hook"),
        (artifact("nvinject-cdi-gen", "nvinject-cdi"), "nvinject-cdi"),
    ] {
        fs::copy(from, dir.join(file)).unwrap();
    }
    dir
}

/// A temporary host: `host/` is the host root, `outside/` the decoy tree on the installer's own
/// file system (what a link out of the root would reach).
struct Case {
    dir: tempfile::TempDir,
    bin: PathBuf,
}

impl Case {
    fn new() -> Case {
        process::ensure_root().unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::Builder::new().prefix("nvinject-secinst-").tempdir().unwrap();
        let t = dir.path();
        let bin = image_bin(t);
        let h = t.join("host");
        for d in ["etc/containerd/conf.d", "run", "usr/local/bin", "var/lib"] {
            fs::create_dir_all(h.join(d)).unwrap();
        }
        fs::write(h.join("etc/containerd/config.toml"), CONFIG).unwrap();
        let outside = t.join("outside");
        fs::create_dir_all(outside.join("managed")).unwrap();
        fs::write(outside.join("secret.toml"), SECRET).unwrap();
        fs::write(outside.join("managed/config.toml"), SECRET).unwrap();
        Case { dir, bin }
    }

    fn host(&self) -> PathBuf {
        self.dir.path().join("host")
    }

    fn h(&self, rel: &str) -> PathBuf {
        self.host().join(rel.trim_start_matches('/'))
    }

    fn outside(&self) -> PathBuf {
        self.dir.path().join("outside")
    }

    /// Runs `nvinject-installer install` under `umask`, killed if it runs over 60 s (a FIFO
    /// that blocks it would).
    fn install(&self, umask: u32) -> Output {
        self.run("install", umask)
    }

    /// [`Case::install`] in a private mount namespace whose `/etc` is a copy of this machine's
    /// on a tmpfs: what the installer writes to the real `/etc` (it must not) is lost with it.
    fn install_with_scratch_etc(&self, umask: u32) -> Output {
        let scratch = self.dir.path().join("scratch-etc");
        let prelude = format!(
            "mkdir -p {s} && mount -t tmpfs nvinject-test {s} && cp -a /etc/. {s}/ && mount --bind {s} /etc && ",
            s = scratch.display()
        );
        self.run_with(
            "unshare",
            &["--mount", "--propagation", "private", "sh", "-c"],
            &prelude,
            "install",
            umask,
        )
    }

    fn run(&self, command: &str, umask: u32) -> Output {
        self.run_with("sh", &["-c"], "", command, umask)
    }

    fn run_with(&self, program: &str, args: &[&str], prelude: &str, command: &str, umask: u32) -> Output {
        let script = format!("{prelude}umask {umask:03o}; exec \"$0\" \"$@\"");
        let mut child = Command::new(program)
            .args(args)
            .arg(script)
            .arg(self.bin.join("nvinject-installer"))
            .arg(command)
            .arg(format!("--host-root={}", self.host().display()))
            .arg(format!("--source-dir={}", self.bin.display()))
            .args([
                "--containerd-version=1.6.20",
                "--restart-mode=none",
                "--skip-cdi-spec",
                "--no-dev-char-links",
            ])
            .args(["--lock-timeout=5"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!("the installer hung (killed after 60 s): {}", String::from_utf8_lossy(&out.stderr));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        println!(
            "$ nvinject-installer {command}\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

/// Every path under `root` with its kind, mode and content (files), target (links); the host
/// lock is left out on purpose (it stays, see installer/src/lock.rs).
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if rel == "run/nvinject-installer.lock" || rel.starts_with("proc/") {
                continue;
            }
            let meta = fs::symlink_metadata(&path).unwrap();
            let mode = meta.mode() & 0o7777;
            if meta.file_type().is_symlink() {
                out.insert(rel, format!("-> {}", fs::read_link(&path).unwrap().display()));
            } else if meta.is_dir() {
                out.insert(rel.clone(), format!("dir {mode:o}"));
                walk(root, &path, out);
            } else if meta.is_file() {
                out.insert(rel, format!("{mode:o} {}", String::from_utf8_lossy(&fs::read(&path).unwrap())));
            } else {
                out.insert(rel, format!("special {mode:o} {:?} {}", meta.file_type(), meta.rdev()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The decoy tree is as it was made: same files, same bytes, nothing added.
fn assert_outside_untouched(case: &Case) {
    let snap = snapshot(&case.outside());
    let expected: BTreeMap<String, String> = [
        ("managed".to_owned(), "dir 755".to_owned()),
        ("managed/config.toml".to_owned(), format!("644 {SECRET}")),
        ("secret.toml".to_owned(), format!("644 {SECRET}")),
    ]
    .into();
    assert_eq!(snap, expected, "the host outside the host root changed");
}

/// No file under the host root carries the decoy's content (nothing was copied in).
fn assert_no_secret_inside(case: &Case) {
    for (path, value) in snapshot(&case.host()) {
        assert!(
            !value.contains("s3cr3t") || path.ends_with("managed/config.toml"),
            "{path} has the decoy's bytes"
        );
    }
}

/// The install failed, named `needle`, and changed nothing under the host root.
fn assert_refused(case: &Case, before: &BTreeMap<String, String>, out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "install should have failed: {stderr}");
    assert!(stderr.contains(needle), "the error should say {needle:?}: {stderr}");
    assert_eq!(&snapshot(&case.host()), before, "the host root changed although install failed");
    assert_outside_untouched(case);
    assert_no_secret_inside(case);
}

fn ok(out: &Output) {
    assert!(out.status.success(), "install failed: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
#[ignore = "needs root"]
fn a_config_linked_to_an_absolute_path_is_read_and_written_inside_the_root() {
    nvinject_test_support::require_root("containerd and runc");
    let case = Case::new();
    let abs = case.outside().join("managed/config.toml");
    // The operator's config lives at the same absolute path inside H: that is what the link means.
    let inside = case.h(&abs.to_string_lossy());
    fs::create_dir_all(inside.parent().unwrap()).unwrap();
    fs::write(&inside, CONFIG).unwrap();
    fs::remove_file(case.h("etc/containerd/config.toml")).unwrap();
    symlink(&abs, case.h("etc/containerd/config.toml")).unwrap();
    ok(&case.install(0o022));
    assert_outside_untouched(&case);
    assert_eq!(fs::read_link(case.h("etc/containerd/config.toml")).unwrap(), abs, "the link stays a link");
    // containerd 1.6 with a conf.d glob: the drop-in is loaded by the glob; the config inside H
    // is the one read (a 1.6 drop-in repeats its CRI section).
    let drop_in = fs::read_to_string(case.h("etc/containerd/conf.d/99-nvinject.toml")).unwrap();
    assert!(drop_in.contains("registry.k8s.io/pause:3.9"), "{drop_in}");
    assert!(!drop_in.contains("s3cr3t"));
    ok(&case.run("uninstall", 0o022));
    assert_eq!(fs::read_to_string(&inside).unwrap(), CONFIG);
    assert_outside_untouched(&case);
}

#[test]
#[ignore = "needs root"]
fn conf_d_entries_linked_to_devices_and_foreign_files_fail_fast_with_nothing_changed() {
    nvinject_test_support::require_root("containerd and runc");
    let case = Case::new();
    // Inside H, /dev/zero is a real character device: refused, never read.
    fs::create_dir_all(case.h("dev")).unwrap();
    nix::sys::stat::mknod(
        &case.h("dev/zero"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 5),
    )
    .unwrap();
    symlink("/dev/zero", case.h("etc/containerd/conf.d/00-zero.toml")).unwrap();
    let before = snapshot(&case.host());
    let out = case.install(0o022);
    assert_refused(&case, &before, &out, "a character device");
    fs::remove_file(case.h("etc/containerd/conf.d/00-zero.toml")).unwrap();

    // A foreign file on the installer's own file system: inside H the link dangles.
    symlink(case.outside().join("secret.toml"), case.h("etc/containerd/conf.d/10-foreign.toml")).unwrap();
    let before = snapshot(&case.host());
    let out = case.install(0o022);
    assert_refused(&case, &before, &out, "10-foreign.toml");
    fs::remove_file(case.h("etc/containerd/conf.d/10-foreign.toml")).unwrap();

    // `..` climbing past the root stops at it.
    let up = format!("../../../../../../../../..{}", case.outside().join("secret.toml").display());
    symlink(&up, case.h("etc/containerd/conf.d/20-up.toml")).unwrap();
    let before = snapshot(&case.host());
    let out = case.install(0o022);
    assert_refused(&case, &before, &out, "20-up.toml");
}

#[test]
#[ignore = "needs root"]
fn a_dangling_conf_d_link_fails_install_with_the_host_root_byte_identical() {
    nvinject_test_support::require_root("containerd and runc");
    let case = Case::new();
    symlink("/etc/containerd/gone.toml", case.h("etc/containerd/conf.d/50-gone.toml")).unwrap();
    let before = snapshot(&case.host());
    let out = case.install(0o022);
    assert_refused(&case, &before, &out, "link to a missing file");
    assert!(!case.h("usr/local/nvinject").exists(), "no binary may be written");
}

#[test]
#[ignore = "needs root"]
fn a_fifo_import_fails_fast_and_releases_the_lock() {
    nvinject_test_support::require_root("containerd and runc");
    let case = Case::new();
    let text = CONFIG.replace(
        "imports = [\"/etc/containerd/conf.d/*.toml\"]",
        "imports = [\"/etc/containerd/extra.toml\", \"/etc/containerd/conf.d/*.toml\"]",
    );
    fs::write(case.h("etc/containerd/config.toml"), &text).unwrap();
    nix::unistd::mkfifo(
        &case.h("etc/containerd/extra.toml"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let before = snapshot(&case.host());
    let out = case.install(0o022);
    assert_refused(&case, &before, &out, "a FIFO");
    // The lock was released: the next run gets past it (and fails on the FIFO again, not the lock).
    let again = case.install(0o022);
    assert!(!String::from_utf8_lossy(&again.stderr).contains("holds"), "{again:?}");
    // A FIFO glob entry too.
    fs::write(case.h("etc/containerd/config.toml"), CONFIG).unwrap();
    fs::rename(case.h("etc/containerd/extra.toml"), case.h("etc/containerd/conf.d/30-fifo.toml")).unwrap();
    let before = snapshot(&case.host());
    let out = case.install(0o022);
    assert_refused(&case, &before, &out, "a FIFO");
}

/// A private procfs mounted at `H/proc` (as `/host/proc` is in the DaemonSet), unmounted on drop.
struct ProcMount(PathBuf);

impl Drop for ProcMount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
#[ignore = "needs root"]
fn proc_magic_links_inside_the_root_are_refused() {
    nvinject_test_support::require_root("containerd and runc");
    let case = Case::new();
    fs::create_dir_all(case.h("proc")).unwrap();
    nix::mount::mount(
        Some("proc"),
        &case.h("proc"),
        Some("proc"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .expect("mount proc");
    let _proc = ProcMount(case.h("proc"));
    let magic = format!("/proc/self/root{}", case.outside().join("secret.toml").display());
    symlink(&magic, case.h("etc/containerd/conf.d/40-magic.toml")).unwrap();
    let before = snapshot(&case.host());
    let out = case.install(0o022);
    assert_refused(&case, &before, &out, "40-magic.toml");
    fs::remove_file(case.h("etc/containerd/conf.d/40-magic.toml")).unwrap();

    // The main config through a magic link: refused for reading and so never written.
    fs::remove_file(case.h("etc/containerd/config.toml")).unwrap();
    let magic = format!("/proc/1/root{}", case.outside().join("managed/config.toml").display());
    symlink(&magic, case.h("etc/containerd/config.toml")).unwrap();
    let before = snapshot(&case.host());
    let out = case.install(0o022);
    assert_refused(&case, &before, &out, "config.toml");
}

#[test]
#[ignore = "needs root"]
fn a_parent_directory_linked_out_of_the_root_stays_inside_it() {
    nvinject_test_support::require_root("containerd and runc");
    let case = Case::new();
    let host_etc = fs::read_dir("/etc/containerd").ok().map(|_| snapshot(Path::new("/etc/containerd")));
    fs::remove_dir_all(case.h("etc")).unwrap();
    symlink("/etc", case.h("etc")).unwrap();
    // In a private mount namespace with a scratch tmpfs over the installer's /etc: a build that
    // follows the link out of H (as builds before issue 11 did) writes there, not into this
    // machine's /etc, and the test still fails for it (the install succeeds).
    let out = case.install_with_scratch_etc(0o022);
    // Inside H, /etc names H/etc itself: a loop the kernel refuses; the real /etc is never used.
    assert!(!out.status.success(), "{out:?}");
    assert_eq!(
        fs::read_dir("/etc/containerd").ok().map(|_| snapshot(Path::new("/etc/containerd"))),
        host_etc
    );
    assert!(!Path::new("/etc/containerd/conf.d/99-nvinject.toml").exists() || host_etc.is_some());
    assert_outside_untouched(&case);

    // H/etc -> the decoy tree's path: inside H that path does not exist, so nothing is read from
    // the decoy and everything made is made inside H.
    fs::remove_file(case.h("etc")).unwrap();
    symlink(case.outside(), case.h("etc")).unwrap();
    let _ = case.install(0o022);
    assert_outside_untouched(&case);
    assert_no_secret_inside(&case);
}

#[test]
#[ignore = "needs root"]
fn links_at_the_state_and_backup_paths_are_refused() {
    nvinject_test_support::require_root("containerd and runc");
    let case = Case::new();
    fs::create_dir_all(case.h("var/lib/nvinject")).unwrap();
    symlink(case.outside(), case.h("var/lib/nvinject/installer")).unwrap();
    let before = snapshot(&case.host());
    let out = case.install(0o022);
    assert_refused(&case, &before, &out, "symbolic link");
    fs::remove_file(case.h("var/lib/nvinject/installer")).unwrap();

    fs::create_dir_all(case.h("var/lib/nvinject/installer")).unwrap();
    symlink("/etc/containerd", case.h("var/lib/nvinject/installer/backup")).unwrap();
    let before = snapshot(&case.host());
    let out = case.install(0o022);
    assert_refused(&case, &before, &out, "symbolic link");
    fs::remove_file(case.h("var/lib/nvinject/installer/backup")).unwrap();

    symlink(case.outside().join("secret.toml"), case.h("var/lib/nvinject/installer/state.json")).unwrap();
    let before = snapshot(&case.host());
    let out = case.install(0o022);
    assert_refused(&case, &before, &out, "symbolic link");
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

#[test]
#[ignore = "needs root"]
fn modes_are_exact_under_umask_000_and_077() {
    nvinject_test_support::require_root("containerd and runc");
    for umask in [0o000, 0o077] {
        let case = Case::new();
        fs::remove_dir(case.h("etc/containerd/conf.d")).unwrap();
        // Without an imports entry the main config changes, so it gets a backup.
        let plain = CONFIG.replace("imports = [\"/etc/containerd/conf.d/*.toml\"]\n", "");
        fs::write(case.h("etc/containerd/config.toml"), &plain).unwrap();
        ok(&case.install(umask));
        for (path, want) in [
            ("usr/local/nvinject", 0o755),
            ("usr/local/nvinject/bin", 0o755),
            ("usr/local/nvinject/bin/nvinject-hook", 0o755),
            ("usr/local/nvinject/bin/containerd-shim-nvinject-v2", 0o755),
            ("etc/nvinject", 0o755),
            ("etc/nvinject/config.toml", 0o644),
            ("etc/containerd/conf.d", 0o755),
            ("etc/containerd/conf.d/99-nvinject.toml", 0o644),
            ("etc/containerd/config.toml", 0o644),
            ("var/lib/nvinject", 0o700),
            ("var/lib/nvinject/installer", 0o700),
            ("var/lib/nvinject/installer/state.json", 0o600),
            ("var/lib/nvinject/installer/backup", 0o700),
            ("run/nvinject-installer.lock", 0o600),
        ] {
            assert_eq!(mode(&case.h(path)), want, "{path} under umask {umask:03o}");
        }
        let backups: Vec<_> = fs::read_dir(case.h("var/lib/nvinject/installer/backup")).unwrap().collect();
        assert!(!backups.is_empty());
        for b in backups {
            assert_eq!(mode(&b.unwrap().path()), 0o600);
        }
        ok(&case.run("uninstall", umask));
        assert_eq!(fs::read_to_string(case.h("etc/containerd/config.toml")).unwrap(), plain);
        assert_outside_untouched(&case);
    }
}
