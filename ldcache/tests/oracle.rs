//! The oracle: trees made of this host's real ELF libraries, planned by us and then handed to the
//! real `ldconfig -r`; both caches must list the same (key, flags, path, hwcap) in the same order,
//! be byte-identical once our generator string is swapped for ldconfig's, and ldconfig must create
//! exactly the SONAME links we planned.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use nvinject_fsio::root::Root;
use nvinject_ldcache::format::{self, generator};
use nvinject_ldcache::{Link, Options, Update, parse, plan};

const HOST_LIBS: &str = "/lib/x86_64-linux-gnu";

fn host(name: &str) -> PathBuf {
    Path::new(HOST_LIBS).join(name)
}

fn put(root: &Path, path: &str, bytes: &[u8]) {
    let p = root.join(path.trim_start_matches('/'));
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, bytes).unwrap();
}

fn copy(root: &Path, from: &Path, to: &str) {
    let p = root.join(to.trim_start_matches('/'));
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    if fs::hard_link(from, &p).is_err() {
        fs::copy(from, &p).unwrap();
    }
}

fn link(root: &Path, target: &str, at: &str) {
    let p = root.join(at.trim_start_matches('/'));
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    symlink(target, p).unwrap();
}

/// Every symlink under `dir`, as (path inside the root, target).
fn symlinks(root: &Path) -> BTreeSet<(PathBuf, PathBuf)> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let t = e.file_type().unwrap();
            let inside = Path::new("/").join(e.path().strip_prefix(root).unwrap());
            if t.is_symlink() {
                out.insert((inside, fs::read_link(e.path()).unwrap()));
            } else if t.is_dir() {
                stack.push(e.path());
            }
        }
    }
    out
}

/// Plans `root`, runs the real ldconfig on it, and compares.
fn compare_with_ldconfig(root: &Path, extra: &[&str]) -> Update {
    let options = Options { extra_dirs: extra.iter().map(PathBuf::from).collect(), ..Default::default() };
    let ours = plan(&Root::open(root).unwrap(), &options).expect("plan");
    let before = symlinks(root);
    let out = Command::new("ldconfig").arg("-r").arg(root).args(extra).output().expect("ldconfig runs");
    assert!(out.status.success(), "ldconfig: {}", String::from_utf8_lossy(&out.stderr));
    let theirs = fs::read(root.join("etc/ld.so.cache")).unwrap();

    let (a, b) = (parse(&ours.cache).unwrap(), parse(&theirs).unwrap());
    let show = |v: &[format::Entry]| {
        v.iter().map(|e| format!("{:#06x} {} => {}", e.flags, e.key, e.path)).collect::<Vec<_>>()
    };
    assert_eq!(show(&a), show(&b), "entries differ (ours left, ldconfig right)");
    let differ: Vec<_> = a.iter().zip(&b).filter(|(x, y)| x != y).collect();
    assert!(differ.is_empty(), "entries differ (ours, ldconfig's): {differ:#x?}");
    let swapped =
        format::with_generator(&ours.cache, &generator(&theirs).expect("ldconfig writes a generator"))
            .unwrap();
    assert!(swapped == theirs, "same entries, but the bytes differ from ldconfig's");

    let created: BTreeSet<Link> = symlinks(root)
        .difference(&before)
        .map(|(path, target)| Link { path: path.clone(), target: target.clone() })
        .collect();
    // Our links name the directory as configured; ldconfig's land in the directory it resolves.
    let planned: BTreeSet<Link> = ours
        .links
        .iter()
        .map(|l| Link {
            path: Root::open(root)
                .unwrap()
                .canonicalize(l.path.parent().unwrap())
                .unwrap()
                .join(l.path.file_name().unwrap()),
            target: l.target.clone(),
        })
        .collect();
    assert_eq!(planned, created, "SONAME links: ours left, ldconfig right");
    ours
}

/// A merged-/usr Debian-like tree: real libraries under versioned names, dev links, a directory
/// reached twice, an include glob, comments, a `hwcap` line, trailing slashes.
fn debian_like(root: &Path) {
    link(root, "usr/lib", "/lib");
    link(root, "usr/lib64", "/lib64");
    let lib = "/usr/lib/x86_64-linux-gnu";
    for name in
        ["libc.so.6", "libm.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2", "libdl.so.2", "libpthread.so.0"]
    {
        copy(root, &host(name), &format!("{lib}/{name}"));
    }
    copy(root, &host("libz.so.1.2.13"), &format!("{lib}/libz.so.1.2.13"));
    copy(root, &host("libz.so.1.2.13"), &format!("{lib}/libz.so.1.2.11")); // older: loses
    link(root, "libz.so.1.2.13", &format!("{lib}/libz.so")); // dev link, no SONAME link yet
    copy(root, &host("libcrypt.so.1.1.0"), &format!("{lib}/libcrypt.so.1.1.0"));
    link(root, "libcrypt.so.1.1.0", &format!("{lib}/libcrypt.so.1")); // already right
    link(root, "libcrypt.so.1", &format!("{lib}/libcrypt.so")); // dev link through a link
    copy(root, &host("libstdc++.so.6.0.30"), &format!("{lib}/libstdc++.so.6.0.30"));
    link(root, "libstdc++.so.6.0.29", &format!("{lib}/libstdc++.so.6")); // stale: replaced
    link(root, "nothing-here", &format!("{lib}/libgone.so")); // dangling, not `.so.`
    put(root, &format!("{lib}/libc.so"), b"/* GNU ld script */\nGROUP ( libc.so.6 )\n");
    put(root, &format!("{lib}/libempty.so.1"), b"");
    put(root, &format!("{lib}/README.so.txt"), b"not a library name");
    copy(root, &host("libm.so.6"), &format!("{lib}/notalib.so.6"));
    fs::create_dir_all(root.join("usr/lib/x86_64-linux-gnu/libdir.so.1")).unwrap();
    // A second folder with its own copy of a SONAME: both listed, this one first.
    copy(root, &host("libz.so.1.2.13"), "/opt/first/libz.so.1.2.13");
    copy(root, &host("libgcc_s.so.1"), "/usr/local/lib/libgcc_s.so.1");
    put(
        root,
        "/etc/ld.so.conf",
        b"# the usual\ninclude /etc/ld.so.conf.d/*.conf\n\n  /opt/first/  # trailing slash and comment\nhwcap 0 nosegneg\n/usr/lib/x86_64-linux-gnu\n/nonexistent\n",
    );
    put(root, "/etc/ld.so.conf.d/libc.conf", b"/usr/local/lib\n");
    put(
        root,
        "/etc/ld.so.conf.d/x86_64-linux-gnu.conf",
        b"/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n",
    );
    put(root, "/etc/ld.so.conf.d/.hidden.conf", b"/opt/hidden\n");
    copy(root, &host("libz.so.1.2.13"), "/opt/hidden/libz.so.1.2.13");
    put(root, "/etc/ld.so.conf.d/zz.conf.disabled", b"/opt/hidden\n");
}

#[test]
fn matches_ldconfig_on_a_debian_like_tree() {
    if !Path::new(HOST_LIBS).is_dir() {
        eprintln!("skipped: no {HOST_LIBS}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    debian_like(tmp.path());
    let update = compare_with_ldconfig(tmp.path(), &[]);
    let entries = parse(&update.cache).unwrap();
    // Sanity on what the comparison covered.
    assert!(entries.iter().any(|e| e.key == "libz.so.1" && e.path == "/opt/first/libz.so.1"));
    assert!(entries.iter().any(|e| e.key == "libz.so" && e.path == "/lib/x86_64-linux-gnu/libz.so"));
    assert!(!entries.iter().any(|e| e.path.contains("hidden") || e.key.contains("empty")));
    assert!(update.links.iter().any(|l| l.target == Path::new("libstdc++.so.6.0.30")));
}

#[test]
fn matches_ldconfig_with_injected_folders() {
    if !Path::new(HOST_LIBS).is_dir() {
        eprintln!("skipped: no {HOST_LIBS}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    debian_like(tmp.path());
    // Injected folders come first, so their libz wins the lookup.
    copy(tmp.path(), &host("libz.so.1.2.13"), "/usr/lib/x86_64-linux-gnu/nvidia/libz.so.1.2.13");
    copy(tmp.path(), &host("libm.so.6"), "/usr/lib/x86_64-linux-gnu/nvidia/libnvidia-fake.so.550.54.15");
    let update = compare_with_ldconfig(tmp.path(), &["/usr/lib/x86_64-linux-gnu/nvidia", "/opt/first/"]);
    let entries = parse(&update.cache).unwrap();
    let first = entries.iter().find(|e| e.key == "libz.so.1").unwrap();
    assert_eq!(first.path, "/usr/lib/x86_64-linux-gnu/nvidia/libz.so.1");
}

#[test]
fn matches_ldconfig_on_this_hosts_whole_library_dir() {
    if !Path::new(HOST_LIBS).is_dir() {
        eprintln!("skipped: no {HOST_LIBS}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path();
    link(r, "usr/lib", "/lib");
    fs::create_dir_all(r.join("usr/lib/x86_64-linux-gnu")).unwrap();
    for e in fs::read_dir(HOST_LIBS).unwrap().flatten() {
        let name = e.file_name().into_string().unwrap();
        let t = e.file_type().unwrap();
        let at = format!("/usr/lib/x86_64-linux-gnu/{name}");
        if t.is_symlink() {
            link(r, fs::read_link(e.path()).unwrap().to_str().unwrap(), &at);
        } else if t.is_file() {
            copy(r, &e.path(), &at);
        }
    }
    put(r, "/etc/ld.so.conf", b"include /etc/ld.so.conf.d/*.conf\n");
    put(r, "/etc/ld.so.conf.d/x86_64-linux-gnu.conf", b"/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n");
    let update = compare_with_ldconfig(r, &[]);
    assert!(parse(&update.cache).unwrap().len() > 50);
}

/// glibc-hwcaps subdirectories (ldconfig 2.33+): entries ahead of the plain ones with the
/// extension bit and section index, the file's own name, no links there, the names in the string
/// table (even unused ones) and the section; hidden names, names with `:`, files and dangling
/// links are not subdirectories; a link to a subdirectory is one.
#[test]
#[ignore = "needs root"]
fn matches_ldconfig_with_glibc_hwcaps_subdirectories() {
    nvinject_test_support::require_root("chroot, and unpacking the rootfs with its owners");
    if !Path::new(HOST_LIBS).is_dir() {
        eprintln!("skipped: no {HOST_LIBS}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path();
    debian_like(r);
    let lib = "/usr/lib/x86_64-linux-gnu";
    let hw = format!("{lib}/glibc-hwcaps");
    copy(r, &host("libz.so.1.2.13"), &format!("{hw}/x86-64-v3/libz.so.1.2.13"));
    copy(r, &host("libz.so.1.2.13"), &format!("{hw}/x86-64-v2/libz.so.1.2.13"));
    copy(r, &host("libz.so.1.2.13"), &format!("{hw}/x86-64-v2/libz.so.1.2.11")); // older: loses
    copy(r, &host("libcrypt.so.1.1.0"), &format!("{hw}/x86-64-v2/libcrypt.so.1.1.0"));
    link(r, "libcrypt.so.1.1.0", &format!("{hw}/x86-64-v2/libcrypt.so.1"));
    copy(r, &host("libgcc_s.so.1"), &format!("{hw}/.hidden/libgcc_s.so.1"));
    copy(r, &host("libgcc_s.so.1"), &format!("{hw}/a:b/libgcc_s.so.1"));
    fs::create_dir_all(r.join(format!("{hw}/x86-64-v4").trim_start_matches('/'))).unwrap(); // unused
    put(r, &format!("{hw}/notadir"), b"");
    link(r, "nowhere", &format!("{hw}/dangling"));
    copy(r, &host("libm.so.6"), "/opt/elsewhere/libm.so.6");
    link(r, "/opt/elsewhere", &format!("{hw}/zz-linked"));
    // An injected folder with its own subdirectory, and a second root-level folder.
    copy(
        r,
        &host("libstdc++.so.6.0.30"),
        "/usr/local/nvidia/lib64/glibc-hwcaps/x86-64-v3/libstdc++.so.6.0.30",
    );
    copy(r, &host("libstdc++.so.6.0.30"), "/usr/local/nvidia/lib64/libstdc++.so.6.0.30");
    copy(r, &host("libz.so.1.2.13"), "/opt/first/glibc-hwcaps/x86-64-v3/libz.so.1.2.13");
    // Libraries that declare the ISA level they need (GNU_PROPERTY_X86_ISA_1_NEEDED), as
    // glibc-hwcaps builds do: ldconfig records it in bits 32.. of the entry's hwcap.
    let src = r.join("isa.c");
    fs::write(&src, "int isa_probe(void) { return 1; }\n").unwrap();
    for (level, at) in [
        ("x86-64-v3", format!("{hw}/x86-64-v3/libisa.so.1.0")),
        ("x86-64-v2", format!("{hw}/x86-64-v2/libisa.so.1.0")),
        ("x86-64-v4", "/usr/local/nvidia/lib64/glibc-hwcaps/x86-64-v4/libisa.so.1.0".to_owned()),
        ("", format!("{lib}/libisa.so.1.0")),
    ] {
        let out = r.join(at.trim_start_matches('/'));
        fs::create_dir_all(out.parent().unwrap()).unwrap();
        let status = Command::new("gcc")
            .args(["-shared", "-fPIC", "-Wl,-soname,libisa.so.1"])
            .args((!level.is_empty()).then(|| format!("-Wl,-z,{level}")))
            .arg("-o")
            .arg(&out)
            .arg(&src)
            .status()
            .expect("gcc runs");
        assert!(status.success(), "gcc -z {level}");
    }
    fs::remove_file(&src).unwrap();
    let update = compare_with_ldconfig(r, &["/usr/local/nvidia/lib64"]);
    let entries = parse(&update.cache).unwrap();
    let isa = |dir: &str| {
        entries
            .iter()
            .find(|e| e.path.ends_with(&format!("/glibc-hwcaps/{dir}/libisa.so.1.0")))
            .map(|e| (e.hwcap >> 32) & 0x3ff)
    };
    assert_eq!((isa("x86-64-v2"), isa("x86-64-v3"), isa("x86-64-v4")), (Some(1), Some(2), Some(3)));
    let hw_entries: Vec<_> = entries.iter().filter(|e| format::is_hwcaps_entry(e.hwcap)).collect();
    assert!(hw_entries.len() >= 5, "{hw_entries:?}");
    assert!(entries.iter().any(|e| e.path.ends_with("/glibc-hwcaps/zz-linked/libm.so.6")), "{entries:?}");
    assert!(!entries.iter().any(|e| e.path.contains("hidden") || e.path.contains("a:b")));
}
