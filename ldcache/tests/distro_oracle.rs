//! The update-ldcache oracle on real distribution trees (issue 11): Debian rootfs tarballs made by
//! `ldcache/scripts/make-rootfs.sh` (`./x setup` runs it), with the simulated driver's libraries
//! injected as the CDI spec injects them (the versioned files mounted into a folder, the `.so`
//! development links made by create-symlinks), then the cache built twice on two identical copies:
//! - by `nvinject-hook update-ldcache --folder F` (the static hook, as runc runs it: OCI state on
//!   stdin, the root from the bundle's config.json), which runs no program;
//! - by the rootfs's **own** `ldconfig` (`chroot COPY /sbin/ldconfig F`, after the same
//!   ld.so.conf.d drop-in the hook writes).
//!
//! Compared: the SONAME links each made (and removed), the cache entries and, for glibc 2.33+, the
//! cache bytes (once the generator strings are swapped), `ldconfig -p` of both caches as the rootfs's own ldconfig prints them, and a real `dlopen` inside
//! each rootfs (chroot) of every SONAME in the cache and of the driver libraries, printing every
//! object the loader mapped. Needs root (chroot), gcc and the tarballs; fails, never skips, without
//! them. x86-64 only (the probe's symbol versions and the multiarch paths are x86-64's).
#![cfg(target_arch = "x86_64")]

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use nvinject_ldcache::format::{generator, with_generator};
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
/// `name<TAB>ok<TAB>path the loader chose<TAB> every object mapped, in load order` or
/// `name<TAB>error<TAB>dlerror`. It uses only functions every x86-64 glibc has had since 2.2.5 and
/// no `memcpy` (2.14) or data symbols, and is linked against stubs that define just those
/// versions (see [`probe`]), so the same binary runs on bullseye's glibc 2.31 as on trixie's 2.41.
const PROBE_C: &str = r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
static char buf[65536];
static size_t used;
static void put(const char *s) { size_t n = strlen(s); if (used + n < sizeof buf) { for (size_t k = 0; k < n; k++) buf[used++] = s[k]; } }
static void flush(void) { size_t off = 0; while (off < used) { ssize_t w = write(1, buf + off, used - off); if (w <= 0) break; off += (size_t)w; } used = 0; }
static int show(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size; (void)data;
    if (info->dlpi_name && info->dlpi_name[0]) { put(" "); put(info->dlpi_name); }
    return 0;
}
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            void *h = dlopen(argv[i], RTLD_LAZY | RTLD_LOCAL);
            put(argv[i]);
            if (!h) { put("\terror\t"); put(dlerror()); put("\n"); flush(); _exit(0); }
            /* glibc's handle is the object's link_map. */
            const char *name = ((struct link_map *)h)->l_name;
            put("\tok\t"); put(name ? name : "?"); put("\t");
            dl_iterate_phdr(show, NULL);
            put("\n"); flush(); _exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status)) { char m[64]; snprintf(m, sizeof m, "\tcrashed\t%d\n", status); put(argv[i]); put(m); flush(); }
    }
    return 0;
}
"#;

/// Link-time stand-ins for libc.so.6 and libdl.so.2 whose only symbol version is GLIBC_2.2.5, so
/// the probe's references carry that version (the host's libc would give it 2.34's).
const STUB_LIBC: &str = "void __libc_start_main(void) {}\nvoid snprintf(void) {}\nvoid write(void) {}\n\
void fork(void) {}\nvoid waitpid(void) {}\nvoid _exit(void) {}\nvoid strlen(void) {}\nvoid dl_iterate_phdr(void) {}\n";
const STUB_LIBDL: &str = "void dlopen(void) {}\nvoid dlerror(void) {}\n";

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

/// The simulated driver's library folder, built under `tmp`.
fn driver_libs(tmp: &Path) -> PathBuf {
    let out = tmp.join("node");
    run(Command::new(simnode_bin("nvinject-simnode"))
        .args(["build", "--preset", "h100x8", "--out"])
        .arg(&out));
    out.join("driver/usr/lib/x86_64-linux-gnu")
}

/// The dlopen probe, built under `tmp` with the host's gcc.
fn probe(tmp: &Path) -> PathBuf {
    let dir = tmp.join("probe");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("v.map"), "GLIBC_2.2.5 { global: *; };\n").unwrap();
    for (soname, link, src) in [("libc.so.6", "libc.so", STUB_LIBC), ("libdl.so.2", "libdl.so", STUB_LIBDL)] {
        let c = dir.join(format!("{link}.c"));
        fs::write(&c, src).unwrap();
        run(Command::new("gcc")
            .args(["-w", "-fno-builtin", "-shared", "-fPIC", "-nostdlib", "-Wl,--version-script=v.map"])
            .arg(format!("-Wl,-soname,{soname}"))
            .arg("-o")
            .arg(dir.join(soname))
            .arg(&c)
            .current_dir(&dir));
        symlink(soname, dir.join(link)).unwrap();
    }
    fs::write(dir.join("probe.c"), PROBE_C).unwrap();
    let bin = dir.join("nvinject-dlopen-probe");
    run(Command::new("gcc")
        .args(["-O0", "-fno-builtin", "-fno-stack-protector", "-nodefaultlibs", "-o"])
        .arg(&bin)
        .arg(dir.join("probe.c"))
        .arg("-L")
        .arg(&dir)
        .args(["-lc", "-ldl"]));
    bin
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

/// `glibc-hwcaps/x86-64-v2` and `x86-64-v3` copies of the tree's libz and libzstd, and an empty
/// `x86-64-v4`, in its multiarch directory.
fn plant_hwcaps(root: &Path) {
    let dir = inside(root, MULTIARCH);
    for (sub, stem) in
        [("x86-64-v3", "libz.so.1."), ("x86-64-v2", "libzstd.so.1."), ("x86-64-v2", "libz.so.1.")]
    {
        let file = fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with(stem) && e.file_type().unwrap().is_file())
            .unwrap_or_else(|| panic!("no {stem}* file in {}", dir.display()));
        let to = dir.join("glibc-hwcaps").join(sub);
        fs::create_dir_all(&to).unwrap();
        fs::copy(file.path(), to.join(file.file_name())).unwrap();
    }
    fs::create_dir_all(dir.join("glibc-hwcaps/x86-64-v4")).unwrap();
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
    let tarball = tarball(suite);
    let tmp = tempfile::Builder::new().prefix("nvinject-ldcache-distro-").tempdir().unwrap();
    let libs = driver_libs(tmp.path());
    let probe = probe(tmp.path());
    let (libs, probe) = (libs.as_path(), probe.as_path());
    let (ours, theirs) = (tmp.path().join("ours"), tmp.path().join("theirs"));
    // glibc 2.33+ trees also get glibc-hwcaps copies of two of their own libraries, as packages
    // that ship optimised builds lay them out (2.31 has no such directories).
    let hwcaps = suite != "bullseye";
    for root in [&ours, &theirs] {
        unpack(&tarball, root);
        inject(root, libs, folder);
        fs::copy(probe, inside(root, "/nvinject-dlopen-probe")).unwrap();
        if hwcaps {
            plant_hwcaps(root);
        }
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
    // ldconfig also deletes dangling `*.so.*` links, which the hook does not: none may be there.
    let gone = |root: &Path| pristine.difference(&symlinks(root)).cloned().collect::<BTreeSet<_>>();
    assert_eq!(gone(&ours), gone(&theirs), "{suite}: links removed (hook left, ldconfig right)");
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
    // glibc before 2.36 records the minimum kernel of a library's ABI note (`OS ABI: Linux
    // 3.2.0`, glibc's own libraries) and its loader skips an entry needing a newer kernel than
    // the running one; we write 0 (no minimum), as 2.36+ does. That annotation is the only
    // difference allowed, and only for such a suite.
    let old_glibc = suite == "bullseye";
    let abi_notes = their_list.iter().filter(|l| l.contains(", OS ABI: ")).count();
    let their_list: Vec<String> =
        if old_glibc { their_list.iter().map(|l| strip_os_abi(l)).collect() } else { their_list };
    assert_eq!(
        our_list, their_list,
        "{suite}: `ldconfig -p` of the hook's cache (left) and ldconfig's (right)"
    );
    // glibc before 2.33 prints no generator line at all.
    assert!(our_gen.contains("nvinject-ldcache") || old_glibc, "{suite}: {our_gen:?}");
    assert!(our_list.iter().all(|l| !l.contains(", OS ABI: ")));
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
        // Found in the folder: loaded, or (the simulated NVML is built against this host's newer
        // glibc) found there and refused for a symbol version it needs.
        let path = format!("{folder}/{soname}");
        let loaded = format!("{soname}\tok\t{path}\t");
        let too_new = format!("(required by {path})");
        assert!(
            ol.iter().any(|l| l.starts_with(&loaded)
                || (l.starts_with(&format!("{soname}\terror\t"))
                    && l.contains("version `GLIBC_")
                    && l.ends_with(&too_new))),
            "{suite}: {soname} not loaded from {folder}:\n{our_dl}"
        );
    }
    let loaded = ol.iter().filter(|l| l.split('\t').nth(1) == Some("ok")).count();
    let hwcaps_entries = our_list.iter().filter(|l| l.contains("hwcap: ")).count();
    assert_eq!(
        hwcaps_entries,
        if hwcaps { 3 } else { 0 },
        "{suite}: glibc-hwcaps entries:\n{}",
        our_list.join("\n")
    );
    for l in ol.iter().filter(|l| l.split('\t').nth(1) != Some("ok")) {
        eprintln!("{suite}: not loadable with either cache (same result): {l}");
    }
    eprintln!(
        "{suite} ({folder}): {} cache entries ({hwcaps_entries} glibc-hwcaps), {} links made, ldconfig -p identical ({} lines), \
         dlopen identical ({loaded}/{} loaded), cache bytes {}; ldconfig's generator: {their_gen:?}; \
         OS ABI notes in ldconfig's listing (ignored): {abi_notes}",
        a.len(),
        our_links.len(),
        our_list.len(),
        names.len(),
        match bytes_match(&our_cache, &their_cache) {
            Some(true) => "identical but for the generator",
            Some(false) => "DIFFER",
            None => "not compared (glibc 2.31 lays out osversion and strings differently)",
        },
    );
    // glibc 2.33+ writes what we write, byte for byte but for the generator string. 2.31 writes
    // no extensions, an osversion per entry and its strings in entry order: only the entries
    // (above) can match there.
    if old_glibc {
        assert_eq!(bytes_match(&our_cache, &their_cache), None, "{suite}: ldconfig wrote a generator");
    } else {
        assert_eq!(
            bytes_match(&our_cache, &their_cache),
            Some(true),
            "{suite}: cache bytes differ beyond the generator string"
        );
    }
}

/// `ldconfig -p`'s line without its `, OS ABI: Linux X.Y.Z` part.
fn strip_os_abi(line: &str) -> String {
    match line.find(", OS ABI: ") {
        Some(at) => {
            let end = line[at..].find(')').map_or(line.len(), |e| at + e);
            format!("{}{}", &line[..at], &line[end..])
        }
        None => line.to_owned(),
    }
}

/// (key, flags, path) of each entry, in cache order.
fn entries(bytes: &[u8]) -> Vec<(String, i32, String)> {
    let parsed = parse(bytes).unwrap_or_else(|e| panic!("unreadable cache: {e}"));
    parsed.into_iter().map(|e| (e.key, e.flags, e.path)).collect()
}

/// Ours, re-encoded with ldconfig's generator string, is ldconfig's file byte for byte.
/// `None` when ldconfig's file has no generator string (glibc before 2.33).
fn bytes_match(ours: &[u8], theirs: &[u8]) -> Option<bool> {
    let ldconfig_generator = generator(theirs)?;
    Some(with_generator(ours, &ldconfig_generator).expect("our cache ends with its generator") == theirs)
}

#[test]
fn os_abi_annotations_are_stripped_exactly() {
    assert_eq!(
        strip_os_abi(
            "\tlibutil.so.1 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libutil.so.1"
        ),
        "\tlibutil.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libutil.so.1"
    );
    assert_eq!(
        strip_os_abi("\tlibz.so.1 (libc6,x86-64) => /lib/libz.so.1"),
        "\tlibz.so.1 (libc6,x86-64) => /lib/libz.so.1"
    );
}

#[test]
fn every_suite_has_a_test() {
    let have: BTreeSet<String> = ["bookworm", "trixie", "bullseye"].into_iter().map(str::to_owned).collect();
    assert_eq!(
        suites().into_iter().collect::<BTreeSet<_>>(),
        have,
        "add a test per suite make-rootfs.sh builds"
    );
}

#[test]
#[ignore = "needs root"]
fn bookworm_multiarch_folder() {
    nvinject_test_support::require_root("chroot, and unpacking the rootfs with its owners");
    compare_suite("bookworm", MULTIARCH);
}

#[test]
#[ignore = "needs root"]
fn bookworm_own_folder() {
    nvinject_test_support::require_root("chroot, and unpacking the rootfs with its owners");
    compare_suite("bookworm", OWN_FOLDER);
}

#[test]
#[ignore = "needs root"]
fn trixie_multiarch_folder() {
    nvinject_test_support::require_root("chroot, and unpacking the rootfs with its owners");
    compare_suite("trixie", MULTIARCH);
}

#[test]
#[ignore = "needs root"]
fn trixie_own_folder() {
    nvinject_test_support::require_root("chroot, and unpacking the rootfs with its owners");
    compare_suite("trixie", OWN_FOLDER);
}

#[test]
#[ignore = "needs root"]
fn bullseye_multiarch_folder() {
    nvinject_test_support::require_root("chroot, and unpacking the rootfs with its owners");
    compare_suite("bullseye", MULTIARCH);
}

#[test]
#[ignore = "needs root"]
fn bullseye_own_folder() {
    nvinject_test_support::require_root("chroot, and unpacking the rootfs with its owners");
    compare_suite("bullseye", OWN_FOLDER);
}

/// The hook's incremental cache ([`nvinject_ldcache::plan_incremental`], what it builds when the
/// shim tells it which files it mounted) against its full scan ([`nvinject_ldcache::plan`], the
/// ldconfig equivalent `compare_suite` checks), on a real tree whose own cache is current (its
/// ldconfig run first, as at image build). They must agree byte for byte, cache and links. The
/// incremental plan is made while the tree's libz is moved away (its cache still lists it, and the
/// incremental plan reads that, not the directory), and the full scan once it is back: they can
/// only agree if the incremental path was taken, which a full scan without libz shows.
fn incremental_matches_full(suite: &str, folder: &str) {
    use nvinject_fsio::root::Root;
    use nvinject_ldcache::{Options, plan, plan_incremental};
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::Builder::new().prefix("nvinject-ldcache-incr-").tempdir().unwrap();
    let libs = driver_libs(tmp.path());
    let root = tmp.path().join("tree");
    unpack(&tarball(suite), &root);
    chroot(&root, &["/sbin/ldconfig"]);
    inject(&root, &libs, folder);
    let mut injected: Vec<PathBuf> = fs::read_dir(&libs)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| Path::new(folder).join(e.file_name()))
        .collect();
    injected.extend(DEV_LINKS.iter().map(|(link, _)| Path::new(folder).join(link)));
    // As the hook does first.
    fs::write(inside(&root, "/etc/ld.so.conf.d/00-nvinject.conf"), format!("{folder}\n")).unwrap();
    // Usr-merged trees have it in /usr/lib/<triple>, bullseye in /lib/<triple>.
    let has_libz = |d: &PathBuf| {
        fs::read_dir(d).is_ok_and(|mut r| r.any(|e| e.is_ok_and(|e| e.file_name() == "libz.so.1")))
    };
    let lib_dir = [inside(&root, MULTIARCH), inside(&root, "/lib/x86_64-linux-gnu")]
        .into_iter()
        .find(has_libz)
        .unwrap_or_else(|| panic!("{suite}: no libz.so.1 in either multiarch directory"));
    let away = tmp.path().join("away");
    fs::create_dir_all(&away).unwrap();
    let libz: Vec<_> = fs::read_dir(&lib_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("libz.so.1"))
        .collect();
    for n in &libz {
        fs::rename(lib_dir.join(n), away.join(n)).unwrap();
    }

    let options = Options { extra_dirs: vec![PathBuf::from(folder)], ..Default::default() };
    let tree = Root::open(&root).unwrap();
    let incremental = plan_incremental(&tree, &options, &injected).unwrap();
    let without_libz = plan(&tree, &options).unwrap();
    assert!(incremental.cache != without_libz.cache, "{suite}: the incremental path was not taken");
    for n in &libz {
        fs::rename(away.join(n), lib_dir.join(n)).unwrap();
    }
    let full = plan(&tree, &options).unwrap();
    assert_eq!(parse(&incremental.cache).unwrap(), parse(&full.cache).unwrap(), "{suite} {folder}: entries");
    assert_eq!(incremental.links, full.links, "{suite} {folder}: links");
    assert!(incremental.cache == full.cache, "{suite} {folder}: cache bytes differ");
    eprintln!(
        "{suite} ({folder}): incremental = full scan: {} entries, {} links",
        parse(&full.cache).unwrap().len(),
        full.links.len()
    );
}

#[test]
#[ignore = "needs root"]
fn bookworm_incremental() {
    nvinject_test_support::require_root("chroot, and unpacking the rootfs with its owners");
    incremental_matches_full("bookworm", MULTIARCH);
    incremental_matches_full("bookworm", OWN_FOLDER);
}

#[test]
#[ignore = "needs root"]
fn trixie_incremental() {
    nvinject_test_support::require_root("chroot, and unpacking the rootfs with its owners");
    incremental_matches_full("trixie", MULTIARCH);
    incremental_matches_full("trixie", OWN_FOLDER);
}

#[test]
#[ignore = "needs root"]
fn bullseye_incremental() {
    nvinject_test_support::require_root("chroot, and unpacking the rootfs with its owners");
    incremental_matches_full("bullseye", MULTIARCH);
    incremental_matches_full("bullseye", OWN_FOLDER);
}
