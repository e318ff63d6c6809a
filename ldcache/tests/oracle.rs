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
    let options = Options { extra_dirs: extra.iter().map(PathBuf::from).collect() };
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
    assert_eq!(a, b);
    let reencoded = format::encode(&a, &generator(&theirs).expect("ldconfig writes a generator")).unwrap();
    assert!(reencoded == theirs, "same entries, but the bytes differ from ldconfig's");

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
