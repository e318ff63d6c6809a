//! The update-ldcache oracle on real distribution trees (issue 11): Debian rootfs tarballs made by
//! `ldcache/scripts/make-rootfs.sh` (`./x setup` runs it), with the simulated driver's libraries
//! injected as the CDI spec injects them (the versioned files mounted into a folder, the `.so`
//! development links made by create-symlinks), then the cache built twice on two identical copies:
//! - by `nvinject-hook update-ldcache --folder F` (the static hook, as runc runs it: OCI state on
//!   stdin, the root from the bundle's config.json), which runs no program;
//! - by the rootfs's **own** `ldconfig` (`chroot COPY /sbin/ldconfig F`, after the same
//!   ld.so.conf.d drop-in the hook writes).
//!
//! Compared: the SONAME links each made, the cache bytes (once the generator strings are swapped),
//! `ldconfig -p` of both caches as the rootfs's own ldconfig prints them, and a real `dlopen` inside
//! each rootfs (chroot) of every SONAME in the cache and of the driver libraries, printing every
//! object the loader mapped. Needs root (chroot), gcc and the tarballs; fails, never skips, without
//! them.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

use nvinject_ldcache::format::{encode, generator};
use nvinject_ldcache::parse;
use nvinject_simnode::artifacts::{simnode_bin, static_hook};

/// The driver's library folder in the container, as nvinject-cdi's specs name it (the host's).
const MULTIARCH: &str = "/usr/lib/x86_64-linux-gnu";
/// A folder of its own, as some installers use: not in any ld.so.conf of the image.
const OWN_FOLDER: &str = "/usr/local/nvidia/lib64";
/// Development links the CDI spec's create-symlinks hook makes (target = SONAME).
const DEV_LINKS: &[(&str, &str)] =
    &[("libcuda.so", "libcuda.so.1"), ("libnvidia-ml.so", "libnvidia-ml.so.1")];
/// Driver SONAMEs the container must resolve to the injected folder.
const DRIVER_SONAMES: &[&str] =
    &["libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1", "libnvidia-nvvm.so.4"];

/// A fork per name, so a library whose constructor misbehaves cannot hide the others; each line:
/// `name<TAB>ok<TAB>objects the loader has mapped, in load order` or `name<TAB>error<TAB>dlerror`.
const PROBE_C: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int show(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size; (void)data;
    if (info->dlpi_name && info->dlpi_name[0]) printf(" %s", info->dlpi_name);
    return 0;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            void *h = dlopen(argv[i], RTLD_LAZY | RTLD_LOCAL);
            if (!h) { printf("%s\terror\t%s\n", argv[i], dlerror()); fflush(stdout); _exit(0); }
            struct link_map *map = NULL;
            dlinfo(h, RTLD_DI_LINKMAP, &map);
            printf("%s\tok\t%s\t", argv[i], map && map->l_name ? map->l_name : "?");
            dl_iterate_phdr(show, NULL);
            printf("\n");
            fflush(stdout);
            _exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status)) printf("%s\tcrashed\t%d\n", argv[i], status);
    }
    return 0;
}
"#;

static SERIAL: Mutex<()> = Mutex::new(());

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The suite's tarball; missing means `./x setup` was not run (or had no network).
fn tarball(suite: &str) -> PathBuf {
    let script = workspace().join("ldcache/scripts/make-rootfs.sh");
    let path = PathBuf::from(run(Command::new("bash").arg(&script).args(["--path", suite])).trim());
    assert!(
        path.is_file(),
        "{} is missing: run `./x setup` (it runs {} {suite}, which needs network once)",
        path.display(),
        script.display()
    );
    path
}

fn suites() -> Vec<String> {
    let script = workspace().join("ldcache/scripts/make-rootfs.sh");
    run(Command::new("bash").arg(script).arg("--suites")).lines().map(str::to_owned).collect()
}

/// The simulated driver's library folder (built once per process).
fn driver_libs(tmp: &Path) -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = tmp.join("node");
        run(Command::new(simnode_bin("nvinject-simnode"))
            .args(["build", "--preset", "h100x8", "--out"])
            .arg(&out));
        let dir = out.join("driver/usr/lib/x86_64-linux-gnu");
        // Kept past this test's temp dir: the first caller's dir lives as long as the test binary
        // needs it (tests here run one at a time).
        let keep = std::env::temp_dir().join(format!("nvinject-ldcache-distro-{}", std::process::id()));
        let _ = fs::remove_dir_all(&keep);
        run(Command::new("cp").arg("-a").arg(&dir).arg(&keep));
        keep
    })
}

fn probe(tmp: &Path) -> &'static Path {
    static PROBE: OnceLock<PathBuf> = OnceLock::new();
    PROBE.get_or_init(|| {
        let src = tmp.join("probe.c");
        fs::write(&src, PROBE_C).unwrap();
        let bin = std::env::temp_dir().join(format!("nvinject-ldcache-probe-{}", std::process::id()));
        run(Command::new("gcc").args(["-O1", "-o"]).arg(&bin).arg(&src).arg("-ldl"));
        bin
    })
}

fn unpack(tarball: &Path, at: &Path) {
    fs::create_dir_all(at).unwrap();
    run(Command::new("tar").args(["--numeric-owner", "-xpf"]).arg(tarball).arg("-C").arg(at));
}

fn inside(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// What the CDI spec's mounts and create-symlinks hook leave in the container: the driver's
/// regular files (not its SONAME links: making those is update-ldcache's job) and the dev links.
fn inject(root: &Path, libs: &Path, folder: &str) {
    let dest = inside(root, folder);
    fs::create_dir_all(&dest).unwrap();
    for e in fs::read_dir(libs).unwrap().flatten() {
        if e.file_type().unwrap().is_file() {
            fs::copy(e.path(), dest.join(e.file_name())).unwrap();
        }
    }
    for (link, target) in DEV_LINKS {
        let _ = fs::remove_file(dest.join(link));
        symlink(target, dest.join(link)).unwrap();
    }
}

fn run_hook(root: &Path, bundle: &Path, folder: &str) {
    fs::create_dir_all(bundle).unwrap();
    let config = serde_json::json!({"ociVersion": "1.0.2", "root": {"path": root}});
    fs::write(bundle.join("config.json"), config.to_string()).unwrap();
    let state = serde_json::json!({"ociVersion": "1.0.2", "id": "ldcache-distro", "status": "creating",
        "pid": std::process::id(), "bundle": bundle});
    let mut child = Command::new(static_hook())
        .args(["update-ldcache", "--folder", folder])
        .current_dir(root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(state.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "nvinject-hook update-ldcache: {}", String::from_utf8_lossy(&out.stderr));
}

/// Every symlink in the tree (path inside it, target), to see which links a cache builder made.
fn symlinks(root: &Path) -> BTreeSet<(PathBuf, PathBuf)> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let t = e.file_type().unwrap();
            if t.is_symlink() {
                let at = Path::new("/").join(e.path().strip_prefix(root).unwrap());
                out.insert((at, fs::read_link(e.path()).unwrap()));
            } else if t.is_dir() {
                stack.push(e.path());
            }
        }
    }
    out
}

fn chroot(root: &Path, args: &[&str]) -> String {
    run(Command::new("chroot").arg(root).args(args).env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"))
}

/// `ldconfig -p` by the root's own ldconfig, without the generator line (which names the writer).
fn listing(root: &Path) -> (Vec<String>, String) {
    let text = chroot(root, &["/sbin/ldconfig", "-p"]);
    let (generated, lines): (Vec<&str>, Vec<&str>) =
        text.lines().partition(|l| l.starts_with("Cache generated by:"));
    (lines.into_iter().map(str::to_owned).collect(), generated.join(""))
}

fn compare_suite(suite: &str, folder: &str) {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    assert!(is_root(), "this test needs root (chroot, and unpacking the rootfs with its owners)");
    let tarball = tarball(suite);
    let tmp = tempfile::Builder::new().prefix("nvinject-ldcache-distro-").tempdir().unwrap();
    let libs = driver_libs(tmp.path());
    let probe = probe(tmp.path());
    let (ours, theirs) = (tmp.path().join("ours"), tmp.path().join("theirs"));
    for root in [&ours, &theirs] {
        unpack(&tarball, root);
        inject(root, libs, folder);
        fs::copy(probe, inside(root, "/nvinject-dlopen-probe")).unwrap();
    }
    let pristine = symlinks(&ours);
    assert_eq!(pristine, symlinks(&theirs));

    run_hook(&ours, &tmp.path().join("bundle"), folder);
    // The same drop-in, so the rootfs's ldconfig sees the configuration our cache was made from.
    let dropin = "/etc/ld.so.conf.d/00-nvinject.conf";
    assert!(inside(&ours, dropin).is_file(), "the hook writes {dropin} in a Debian tree");
    fs::copy(inside(&ours, dropin), inside(&theirs, dropin)).unwrap();
    chroot(&theirs, &["/sbin/ldconfig", folder]);

    // The SONAME links: the same ones, and at least the driver's.
    let made = |root: &Path| symlinks(root).difference(&pristine).cloned().collect::<BTreeSet<_>>();
    let (our_links, their_links) = (made(&ours), made(&theirs));
    assert_eq!(our_links, their_links, "{suite}: SONAME links made (hook left, ldconfig right)");
    for soname in DRIVER_SONAMES {
        assert!(
            our_links.iter().any(|(p, _)| p == &Path::new(folder).join(soname)),
            "{suite}: no {soname} link made in {folder}: {our_links:?}"
        );
    }

    // The caches: same entries, same bytes but for the generator string.
    let our_cache = fs::read(inside(&ours, "/etc/ld.so.cache")).unwrap();
    let their_cache = fs::read(inside(&theirs, "/etc/ld.so.cache")).unwrap();
    let (a, b) = (entries(&our_cache), entries(&their_cache));
    assert_eq!(a, b, "{suite}: cache entries (hook left, ldconfig right)");

    // What the rootfs's own ldconfig reads back from each cache.
    let ((our_list, our_gen), (their_list, their_gen)) = (listing(&ours), listing(&theirs));
    assert_eq!(
        our_list, their_list,
        "{suite}: `ldconfig -p` of the hook's cache (left) and ldconfig's (right)"
    );
    assert!(our_gen.contains("nvinject-ldcache"), "{suite}: {our_gen:?}");
    for soname in DRIVER_SONAMES {
        let want = format!("{folder}/{soname}");
        assert!(
            our_list.iter().any(|l| l.trim_start().starts_with(soname) && l.ends_with(&want)),
            "{suite}: {soname} => {want} not in `ldconfig -p`:\n{}",
            our_list.join("\n")
        );
    }

    // A real dlopen of every SONAME in the cache (and the driver's) inside each root.
    let mut names: Vec<String> = a.iter().map(|(key, _, _)| key.clone()).collect();
    names.extend(DRIVER_SONAMES.iter().map(|s| s.to_string()));
    names.sort();
    names.dedup();
    let mut args = vec!["/nvinject-dlopen-probe"];
    args.extend(names.iter().map(String::as_str));
    let (our_dl, their_dl) = (chroot(&ours, &args), chroot(&theirs, &args));
    assert_eq!(our_dl.lines().count(), names.len(), "{suite}: one probe line per name:\n{our_dl}");
    let (ol, tl): (Vec<&str>, Vec<&str>) = (our_dl.lines().collect(), their_dl.lines().collect());
    for (o, t) in ol.iter().zip(&tl) {
        assert_eq!(o, t, "{suite}: dlopen with the hook's cache (left) and ldconfig's (right)");
    }
    assert_eq!(ol.len(), tl.len());
    for soname in DRIVER_SONAMES {
        let want = format!("{soname}\tok\t{folder}/{soname}\t");
        assert!(
            ol.iter().any(|l| l.starts_with(&want)),
            "{suite}: {soname} not loaded from {folder}:\n{our_dl}"
        );
    }
    let loaded = ol.iter().filter(|l| l.split('\t').nth(1) == Some("ok")).count();
    for l in ol.iter().filter(|l| l.split('\t').nth(1) != Some("ok")) {
        eprintln!("{suite}: not loadable with either cache (same result): {l}");
    }
    eprintln!(
        "{suite} ({folder}): {} cache entries, {} links made, ldconfig -p identical ({} lines), \
         dlopen identical ({loaded}/{} loaded), cache bytes {}; ldconfig's generator: {their_gen:?}",
        a.len(),
        our_links.len(),
        our_list.len(),
        names.len(),
        if bytes_match(&our_cache, &their_cache) { "identical but for the generator" } else { "DIFFER" },
    );
    assert!(bytes_match(&our_cache, &their_cache), "{suite}: cache bytes differ beyond the generator string");
}

/// (key, flags, path) of each entry, in cache order.
fn entries(bytes: &[u8]) -> Vec<(String, i32, String)> {
    let parsed = parse(bytes).unwrap_or_else(|e| panic!("unreadable cache: {e}"));
    assert!(parsed.iter().all(|e| e.hwcap == 0), "a distribution tree with hwcap entries: compare them too");
    parsed.into_iter().map(|e| (e.key, e.flags, e.path)).collect()
}

/// Ours, re-encoded with ldconfig's generator string, is ldconfig's file byte for byte.
fn bytes_match(ours: &[u8], theirs: &[u8]) -> bool {
    let ldconfig_generator = generator(theirs).expect("ldconfig writes a generator");
    encode(&parse(ours).unwrap(), &ldconfig_generator).unwrap() == theirs
}

fn is_root() -> bool {
    // /proc/self belongs to the effective user.
    fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

#[test]
fn every_suite_has_a_test() {
    let have: BTreeSet<String> = ["bookworm", "trixie"].into_iter().map(str::to_owned).collect();
    assert_eq!(
        suites().into_iter().collect::<BTreeSet<_>>(),
        have,
        "add a test per suite make-rootfs.sh builds"
    );
}

#[test]
fn bookworm_multiarch_folder() {
    compare_suite("bookworm", MULTIARCH);
}

#[test]
fn bookworm_own_folder() {
    compare_suite("bookworm", OWN_FOLDER);
}

#[test]
fn trixie_multiarch_folder() {
    compare_suite("trixie", MULTIARCH);
}

#[test]
fn trixie_own_folder() {
    compare_suite("trixie", OWN_FOLDER);
}
