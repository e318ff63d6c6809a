//! What a full scan costs (issue 32): the work counters ([`ScanWork`]) and the time of `plan`
//! on a normal tree and on the trees an attacker would build, with their ratios; the real
//! Debian trees of `scripts/make-rootfs.sh` when their tarballs are there (what the default work
//! budget is set against); and the ELF reader before issue 32 against today's on the issue's
//! file. Prints figures; asserts nothing about time.
//!
//! `cargo bench -p nvinject-ldcache --bench scan_cost` (release); `-- --quick` skips the
//! 65,536-name tree and the Debian trees.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nvinject_fsio::root::Root;
use nvinject_ldcache::elf::{Library, ReadAt};
use nvinject_ldcache::format::{
    FLAG_AARCH64_LIB64, FLAG_ELF, FLAG_ELF_LIBC5, FLAG_ELF_LIBC6, FLAG_X8664_LIB64, FLAG_X8664_LIBX32,
};
use nvinject_ldcache::{DEFAULT_WORK_BUDGET, Options, ScanWork, elf, plan_with_work};

#[path = "../tests/support/elf_before_issue32.rs"]
mod before;
#[path = "../tests/support/synth_elf.rs"]
mod synth_elf;

const LIB: &str = "usr/lib/x86_64-linux-gnu";

fn put(root: &Path, path: &str, bytes: &[u8]) {
    let p = root.join(path);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, bytes).unwrap();
}

/// A Debian-shaped root: `/lib -> usr/lib`, the multiarch folder.
fn debian_root() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir_all(tmp.path().join(LIB)).unwrap();
    symlink("usr/lib", tmp.path().join("lib")).unwrap();
    tmp
}

/// 300 libraries, each with its SONAME link and development link, as a distribution has them.
fn normal_tree() -> tempfile::TempDir {
    let tmp = debian_root();
    let dir = tmp.path().join(LIB);
    for i in 0..300 {
        let soname = format!("libn{i}.so.1");
        put(tmp.path(), &format!("{LIB}/libn{i}.so.1.0.0"), &synth_elf::plain_library(&soname));
        symlink(format!("libn{i}.so.1.0.0"), dir.join(&soname)).unwrap();
        symlink(&soname, dir.join(format!("libn{i}.so"))).unwrap();
    }
    tmp
}

/// The file and `links` links to it, no ld.so.cache.
fn bomb_tree(bomb: &[u8], links: usize) -> tempfile::TempDir {
    let tmp = debian_root();
    put(tmp.path(), &format!("{LIB}/libbomb.so"), bomb);
    for i in 0..links {
        symlink("libbomb.so", tmp.path().join(LIB).join(format!("libbomb.so.{i}"))).unwrap();
    }
    tmp
}

/// `n` distinct files, each as costly as the reader allows: 60 distinct 4 KB names.
fn heavy_tree(n: usize) -> tempfile::TempDir {
    let tmp = debian_root();
    let heavy = synth_elf::distinct_long_names(60, elf::MAX_NAME - 1);
    for i in 0..n {
        put(tmp.path(), &format!("{LIB}/libheavy{i}.so"), &heavy);
    }
    tmp
}

/// `n` names that are not libraries (empty files named `x<i>`), in one folder.
fn unlisted_tree(n: usize) -> tempfile::TempDir {
    let tmp = debian_root();
    for i in 0..n {
        fs::File::create(tmp.path().join(LIB).join(format!("x{i}"))).unwrap();
    }
    tmp
}

/// Folders of links to the file, in `ld.so.conf`, until the default budget is spent:
/// the time it bounds a hostile image to. The work and time up to the budget error.
fn until_the_budget(bomb: &[u8]) -> (ScanWork, Duration, usize) {
    let tmp = bomb_tree(bomb, 0);
    let per_folder = 65_535;
    let folders = (DEFAULT_WORK_BUDGET / (nvinject_ldcache::PATH_UNITS * per_folder as u64)) as usize + 1;
    let mut conf = String::new();
    for f in 0..folders {
        let dir = tmp.path().join(format!("opt/f{f}"));
        fs::create_dir_all(&dir).unwrap();
        for i in 0..per_folder {
            symlink(format!("/{LIB}/libbomb.so"), dir.join(format!("libbomb.so.{i}"))).unwrap();
        }
        conf.push_str(&format!("/opt/f{f}\n"));
    }
    put(tmp.path(), "etc/ld.so.conf", conf.as_bytes());
    let r = Root::open(tmp.path()).unwrap();
    let start = Instant::now();
    let e = plan_with_work(&r, &Options::default()).unwrap_err();
    let time = start.elapsed();
    let nvinject_ldcache::LdCacheError::WorkBudget { work, .. } = e else { panic!("{e}") };
    (work, time, folders * per_folder)
}

/// The work and the median time of `runs` full scans of `root` (as the hook's, the multiarch
/// folder given as the injected one).
fn scan(root: &Path, runs: usize) -> (ScanWork, Duration) {
    let r = Root::open(root).unwrap();
    let options = Options { extra_dirs: vec![PathBuf::from(format!("/{LIB}"))], ..Default::default() };
    let mut times = Vec::new();
    let mut work = ScanWork::default();
    for _ in 0..runs {
        let start = Instant::now();
        let (_, w) = plan_with_work(&r, &options).unwrap();
        times.push(start.elapsed());
        work = w;
    }
    times.sort();
    (work, times[times.len() / 2])
}

fn row(name: &str, work: &ScanWork, time: Duration, normal: Option<(&ScanWork, Duration)>) {
    let ratio = normal.map_or(String::new(), |(n, t)| {
        format!(
            "  x{:.2} units, x{:.2} time",
            work.units() as f64 / n.units() as f64,
            time.as_secs_f64() / t.as_secs_f64()
        )
    });
    println!(
        "{name:<44} {:>12} units {:>6} files {:>6} opened {:>10} bytes {:>9.3} ms{ratio}",
        work.units(),
        work.files_inspected,
        work.paths_resolved,
        work.bytes_read,
        time.as_secs_f64() * 1e3
    );
}

/// Each tarball of `scripts/make-rootfs.sh` found, extracted.
fn debian_trees() -> Vec<(String, tempfile::TempDir)> {
    let cache = std::env::var_os("NVINJECT_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/nvinject")))
        .map(|c| c.join("rootfs"));
    let Some(Ok(listing)) = cache.map(fs::read_dir) else { return Vec::new() };
    let mut tarballs: Vec<PathBuf> =
        listing.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "tar")).collect();
    tarballs.sort();
    let mut out = Vec::new();
    for tarball in tarballs {
        let tmp = tempfile::tempdir().unwrap();
        let ok = Command::new("tar")
            .args(["--numeric-owner", "-xf"])
            .arg(&tarball)
            .arg("-C")
            .arg(tmp.path())
            .status()
            .is_ok_and(|s| s.success());
        let name = tarball.file_stem().unwrap().to_string_lossy().into_owned();
        if ok {
            out.push((name, tmp));
        } else {
            println!("{name}: could not extract {}", tarball.display());
        }
    }
    out
}

/// A file whose reads are counted.
struct Counted<'a>(&'a [u8], std::cell::Cell<u64>);

impl ReadAt for Counted<'_> {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Option<()> {
        self.1.set(self.1.get() + buf.len() as u64);
        self.0.read_exact_at(buf, offset)
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    println!(
        "work units: bytes read + entries examined + {} per path resolved + {} per read + {} per name \
         listed; default budget {}",
        nvinject_ldcache::PATH_UNITS,
        nvinject_ldcache::READ_UNITS,
        nvinject_ldcache::LISTED_UNITS,
        DEFAULT_WORK_BUDGET
    );

    // The reader alone, before and after, on the file (16,383 DT_NEEDED naming one
    // 4,095-byte string): the old scan read it once per name.
    let bomb = synth_elf::needed_bomb(16_383, 4_095, None);
    let old = Counted(&bomb, Default::default());
    let start = Instant::now();
    let got = before::inspect_before(&old, bomb.len() as u64);
    let old_time = start.elapsed();
    let runs = 1000;
    let start = Instant::now();
    let mut new = elf::examine(bomb.as_slice(), bomb.len() as u64);
    for _ in 1..runs {
        new = elf::examine(bomb.as_slice(), bomb.len() as u64);
    }
    let new_time = start.elapsed() / runs;
    println!("issue 32 file, {} bytes, read once:", bomb.len());
    println!(
        "  before: {:>10.3} ms, {} bytes read, library: {}",
        old_time.as_secs_f64() * 1e3,
        old.1.get(),
        got.is_some()
    );
    println!(
        "  after:  {:>10.3} ms, {} bytes read in {} reads, {} entries examined, over limit: {:?}",
        new_time.as_secs_f64() * 1e3,
        new.work.bytes_read,
        new.work.reads,
        new.work.entries_examined,
        new.over_limit
    );
    println!("  ratio before/after time: {:.0}", old_time.as_secs_f64() / new_time.as_secs_f64());
    let near = synth_elf::needed_bomb(elf::MAX_DYNAMIC_ENTRIES - 3, 4_095, Some("libnear.so.1"));
    let start = Instant::now();
    let _ = before::inspect_before(near.as_slice(), near.len() as u64);
    let old_near = start.elapsed();
    let start = Instant::now();
    let got = elf::examine(near.as_slice(), near.len() as u64);
    let new_near = start.elapsed();
    println!(
        "the same within the entry limit ({} DT_NEEDED and a SONAME): before {:.3} ms, after {:.3} ms \
         ({} bytes read)",
        elf::MAX_DYNAMIC_ENTRIES - 3,
        old_near.as_secs_f64() * 1e3,
        new_near.as_secs_f64() * 1e3,
        got.work.bytes_read
    );

    println!();
    let normal = normal_tree();
    let (nw, nt) = scan(normal.path(), 11);
    row("normal: 300 libraries, 900 names", &nw, nt, None);
    let n = Some((&nw, nt));
    let t = bomb_tree(&bomb, 10);
    let (w, d) = scan(t.path(), 11);
    row("issue 32 file + 10 links", &w, d, n);
    let t = bomb_tree(&near, 10);
    let (w, d) = scan(t.path(), 11);
    row("within the entry limit + 10 links", &w, d, n);
    let t = heavy_tree(300);
    let (w, d) = scan(t.path(), 3);
    row("300 distinct files at the per-file limit", &w, d, n);
    if !quick {
        let t = bomb_tree(&bomb, 65_535);
        let (w, d) = scan(t.path(), 3);
        row("issue 32 file + 65,535 links (folder limit)", &w, d, n);
        drop(t);
        let t = unlisted_tree(65_535);
        let (w, d) = scan(t.path(), 3);
        row("65,535 names, none a library", &w, d, n);
        drop(t);
        let (w, d, names) = until_the_budget(&bomb);
        row(&format!("links in folders until the budget ({names})"), &w, d, n);
        println!();
        for (name, tree) in debian_trees() {
            let (w, d) = scan(tree.path(), 5);
            row(&name, &w, d, n);
            println!("  {w}; default budget / this: {:.0}", DEFAULT_WORK_BUDGET as f64 / w.units() as f64);
        }
    }
}
