//! Our `plan()` (which includes encoding the cache) against `ldconfig -r` on the same tree: a
//! Debian-like root with this host's `/lib/x86_64-linux-gnu` libraries copied in. Prints figures.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nvinject_fsio::root::Root;
use nvinject_ldcache::{Options, plan};

fn time<F: FnMut()>(runs: u32, mut f: F) -> Duration {
    f(); // warm the page cache and allocator
    let start = Instant::now();
    for _ in 0..runs {
        f();
    }
    start.elapsed() / runs
}

fn main() {
    let host = Path::new("/lib/x86_64-linux-gnu");
    if !host.is_dir() {
        eprintln!("no {} on this machine; nothing to measure", host.display());
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let lib = tmp.path().join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::create_dir_all(tmp.path().join("etc/ld.so.conf.d")).unwrap();
    std::os::unix::fs::symlink("usr/lib", tmp.path().join("lib")).unwrap();
    std::fs::write(tmp.path().join("etc/ld.so.conf"), "include /etc/ld.so.conf.d/*.conf\n").unwrap();
    std::fs::write(
        tmp.path().join("etc/ld.so.conf.d/x86_64-linux-gnu.conf"),
        "/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n",
    )
    .unwrap();
    let mut files = 0;
    for e in std::fs::read_dir(host).unwrap().flatten() {
        let name = e.file_name();
        let Some(n) = name.to_str() else { continue };
        if !n.starts_with("lib") || !n.contains(".so") {
            continue;
        }
        let meta = std::fs::symlink_metadata(e.path()).unwrap();
        if meta.file_type().is_symlink() {
            let _ = std::os::unix::fs::symlink(std::fs::read_link(e.path()).unwrap(), lib.join(n));
        } else if meta.is_file() && std::fs::copy(e.path(), lib.join(n)).is_ok() {
            files += 1;
        }
    }
    let root = Root::open(tmp.path()).unwrap();
    let options = Options::default();
    let ours = time(20, || {
        let u = plan(&root, &options).unwrap();
        assert!(!u.cache.is_empty());
    });
    let theirs = time(5, || {
        let st = Command::new("ldconfig").arg("-r").arg(tmp.path()).arg("-X").status().unwrap();
        assert!(st.success());
    });
    let entries = nvinject_ldcache::parse(&plan(&root, &options).unwrap().cache).unwrap().len();
    println!("tree: {files} library files, {entries} cache entries");
    println!("nvinject-ldcache plan()+encode: {:>9.3} ms", ours.as_secs_f64() * 1e3);
    println!("ldconfig -r -X (fork+exec):      {:>9.3} ms", theirs.as_secs_f64() * 1e3);
    println!("ratio ldconfig / ours:           {:>9.2}", theirs.as_secs_f64() / ours.as_secs_f64());
}
