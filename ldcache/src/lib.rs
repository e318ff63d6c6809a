//! Builds a root's `/etc/ld.so.cache` and the SONAME links glibc's `ldconfig -r ROOT DIR...` would
//! make, without running any program.
//!
//! [`plan`] follows ldconfig (glibc 2.36, elf/ldconfig.c and elf/cache.c): the directories are the
//! extra ones (ldconfig's command-line folders, first), those of `/etc/ld.so.conf` with its
//! includes, then the builtin system directories; a directory reached twice (same device and inode)
//! counts once, under its first name. In each, files named `lib*.so*` or `ld-*.so*` that are ELF
//! shared objects for a known machine are grouped by SONAME, the newest name winning (files over
//! links, then [`format::libcmp`]); the cache lists `<dir>/<soname>` for each, sorted as the loader
//! binary-searches it. Every file access goes through [`Root`] (openat2 `RESOLVE_IN_ROOT |
//! RESOLVE_NO_MAGICLINKS`), so no symlink, `..` or `/proc` path in the image leads outside it.
//!
//! The builtin directories follow the root's glibc layout ([`Layout::detect`]): Debian-family
//! multiarch, or `lib64` (Fedora, RHEL, SUSE). The oracles: `tests/oracle.rs` (trees of this
//! host's libraries against `ldconfig -r`) and `tests/distro_oracle.rs` (Debian bullseye, bookworm
//! and trixie trees with the simulated driver injected, against each tree's own ldconfig and
//! loader).
//!
//! `glibc-hwcaps/<name>/` subdirectories (glibc 2.33+) are listed as ldconfig lists them: right
//! after their parent, each library as a second entry for its SONAME ahead of the plain one, under
//! the file's own name and with no link made there, with `1 << 62 | isa_level << 32 | index` in its
//! hwcap field (the x86 ISA level the ELF says it needs; the index into the extension section of
//! the used names, sorted), every name found in the string table. A loader before 2.33 ignores
//! such entries (bullseye's would list them in `ldconfig -p`, its own ldconfig would not write
//! them).
//!
//! The scan runs as root over an image's files at every container start, so its cost is bounded
//! whatever the image holds (issue 32): the ELF reader bounds each file ([`elf`]), each file
//! (device and inode) is read once per run however many names lead to it, and a run that goes past
//! [`Options::work_budget`] ([`ScanWork::units`]) stops with [`LdCacheError::WorkBudget`].
//!
//! Not modelled: legacy hwcap and platform subdirectories (`tls`, `haswell`, ...; skipped: the
//! loader still finds those libraries through the main directory, and glibc 2.37 dropped them),
//! the per-entry minimum kernel version that ldconfig before 2.36 records (we write 0, as 2.36+
//! does), and removal of dangling `*.so.*` links (ldconfig deletes them; we leave them).

use std::collections::{BTreeSet, HashMap};
use std::fs::{File, Metadata};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nvinject_fsio::root::{EntryType, Root, RootError};

mod conf;
pub mod elf;
mod error;
pub mod format;
#[cfg(test)]
#[path = "../tests/support/synth_elf.rs"]
pub(crate) mod synth_elf;
mod work;

pub use error::LdCacheError;
pub use format::{Entry, host_arch_flags, parse};
pub use work::{DEFAULT_WORK_BUDGET, LISTED_UNITS, PATH_UNITS, READ_UNITS, ScanWork};

/// The cache file inside a root.
pub const CACHE_PATH: &str = "/etc/ld.so.cache";
/// The configuration ldconfig reads inside a root.
pub const CONF_PATH: &str = "/etc/ld.so.conf";
/// The generator string written into our caches.
pub const GENERATOR: &str = concat!("nvinject-ldcache ", env!("CARGO_PKG_VERSION"));

/// The directories ldconfig always scans after its configuration, for a Debian-family glibc
/// (multiarch: `SLIBDIR` and `LIBDIR` are `/lib/<triple>` and `/usr/lib/<triple>`, and Debian's
/// ldconfig adds `/lib` and `/usr/lib` after them).
#[cfg(target_arch = "x86_64")]
pub const SYSTEM_DIRS: &[&str] = &["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib"];
/// The directories ldconfig always scans after its configuration (Debian family).
#[cfg(target_arch = "aarch64")]
pub const SYSTEM_DIRS: &[&str] =
    &["/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib", "/usr/lib"];
/// The directories ldconfig always scans after its configuration (Debian family).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub const SYSTEM_DIRS: &[&str] = &["/lib", "/usr/lib"];

/// The same for an upstream-configured 64-bit glibc (Fedora, RHEL and their rebuilds, openSUSE,
/// Arch's `lib64` links): `SLIBDIR=/lib64`, `LIBDIR=/usr/lib64`, each expanded by the
/// architecture's `add_system_dir` (glibc `sysdeps/unix/sysv/linux/<arch>/dl-cache.h`), which
/// scans `.../lib` and then every multilib sibling of it.
#[cfg(target_arch = "x86_64")]
pub const LIB64_SYSTEM_DIRS: &[&str] =
    &["/lib", "/lib64", "/libx32", "/usr/lib", "/usr/lib64", "/usr/libx32"];
/// The same for an upstream-configured 64-bit glibc (aarch64: `lib64` and `libilp32` siblings).
#[cfg(target_arch = "aarch64")]
pub const LIB64_SYSTEM_DIRS: &[&str] =
    &["/lib", "/lib64", "/libilp32", "/usr/lib", "/usr/lib64", "/usr/libilp32"];
/// The same for an upstream-configured 64-bit glibc (no multilib expansion known here).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub const LIB64_SYSTEM_DIRS: &[&str] = &["/lib64", "/usr/lib64"];

/// How the root's glibc was configured, which decides its ldconfig's builtin directories. The
/// ldconfig that would run is the image's own, so the layout is read from where the image's C
/// library is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Debian, Ubuntu and derivatives: [`SYSTEM_DIRS`].
    Multiarch,
    /// Fedora, RHEL, SUSE and upstream defaults: [`LIB64_SYSTEM_DIRS`].
    Lib64,
}

impl Layout {
    /// The builtin directories, in ldconfig's order.
    pub fn system_dirs(self) -> &'static [&'static str] {
        match self {
            Layout::Multiarch => SYSTEM_DIRS,
            Layout::Lib64 => LIB64_SYSTEM_DIRS,
        }
    }

    /// The layout of `root`: multiarch when `libc.so.6` is in a multiarch directory (or nowhere
    /// known: the default), `lib64` when it is only in `/lib64` or `/usr/lib64`. A Debian tree has
    /// `/lib64` too, holding only the loader's link, so the multiarch check comes first.
    pub fn detect(root: &Root) -> Layout {
        let has_libc = |dir: &str| root.metadata(Path::new(&join(dir, "libc.so.6"))).ok().flatten().is_some();
        let multiarch = SYSTEM_DIRS.iter().filter(|d| d.matches('/').count() > 1).any(|d| has_libc(d));
        if !multiarch && ["/lib64", "/usr/lib64"].iter().any(|d| has_libc(d)) {
            Layout::Lib64
        } else {
            Layout::Multiarch
        }
    }
}

/// Limits against hostile images (far above any distribution's).
pub const MAX_DIRS: usize = 1024;
/// Entries listed in one directory.
pub const MAX_DIR_ENTRIES: usize = 1 << 16;
/// Cache entries in all.
pub const MAX_ENTRIES: usize = 1 << 18;
/// The largest image `ld.so.cache` [`plan_incremental`] builds on (a distribution's is tens of
/// KiB); a larger one gets the full scan, with its own limits.
pub const MAX_CACHE_BYTES: u64 = 16 << 20;

/// What to add to the image's own configuration, and how much work the scan may do.
#[derive(Debug, Clone)]
pub struct Options {
    /// Folders scanned before everything else, absolute inside the root: the image's CUDA
    /// forward-compatibility directory when its libraries are to take precedence over the
    /// injected driver. Their entries come first among entries of the same SONAME, and the loader
    /// takes the first such entry it finds (see [`format::sort_entries`]). Each is scanned whole,
    /// by [`plan_incremental`] too.
    pub first_dirs: Vec<PathBuf>,
    /// Injected folders, absolute inside the root; scanned next, as ldconfig's command-line
    /// folders are.
    pub extra_dirs: Vec<PathBuf>,
    /// The work the scan may do, in [`ScanWork::units`], before it stops with
    /// [`LdCacheError::WorkBudget`]: [`DEFAULT_WORK_BUDGET`] by default, hundreds of times what a
    /// distribution's full scan costs.
    pub work_budget: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options { first_dirs: Vec::new(), extra_dirs: Vec::new(), work_budget: DEFAULT_WORK_BUDGET }
    }
}

/// One run: the root, the work done against the budget, and what each file read gave.
struct Scan<'a> {
    root: &'a Root,
    budget: u64,
    work: ScanWork,
    /// Each file is read once per run, by device and inode: the links and other names that lead
    /// to it reuse what it gave.
    inspected: HashMap<(u64, u64), Option<elf::Library>>,
}

impl<'a> Scan<'a> {
    fn new(root: &'a Root, options: &Options) -> Self {
        Scan { root, budget: options.work_budget, work: ScanWork::default(), inspected: HashMap::new() }
    }

    /// An error once the work done passes the budget, naming the folder being scanned.
    fn within_budget(&self, dir: &str) -> Result<(), LdCacheError> {
        if self.work.units() <= self.budget {
            return Ok(());
        }
        Err(LdCacheError::WorkBudget { dir: dir.to_owned(), budget: self.budget, work: self.work })
    }

    /// What the open file `path` is as a library, read once per device and inode.
    fn library(&mut self, path: &str, file: &File, meta: &Metadata) -> Option<elf::Library> {
        let id = (meta.dev(), meta.ino());
        if let Some(known) = self.inspected.get(&id) {
            return known.clone();
        }
        let got = elf::examine(file, meta.len());
        self.work.add_file(&got.work);
        if let Some(limit) = got.over_limit {
            tracing::warn!(
                file = path,
                %limit,
                "not taken as a library: it goes past a limit of the ELF reader that no real library comes near"
            );
        }
        self.inspected.insert(id, got.library.clone());
        got.library
    }

    /// `Root::metadata`, counted.
    fn metadata(&mut self, path: &str) -> Result<Option<Metadata>, RootError> {
        self.work.paths_resolved += 1;
        self.root.metadata(Path::new(path))
    }
}

/// What to write: the cache bytes (for [`CACHE_PATH`]) and the links to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// The complete new-format cache.
    pub cache: Vec<u8>,
    /// SONAME links ldconfig would create (or replace, when a symlink of that name is dangling or
    /// points elsewhere).
    pub links: Vec<Link>,
}

/// One SONAME link.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Link {
    /// Absolute inside the root: `<dir>/<soname>`.
    pub path: PathBuf,
    /// The file name in that directory the link points to.
    pub target: PathBuf,
}

/// One library kept in a directory (ldconfig's `dlib_entry`).
struct Dlib {
    name: String,
    soname: String,
    flag: i32,
    is_link: bool,
    isa_level: u32,
}

struct Dir {
    path: String,
    /// Device and inode: how ldconfig tells directories apart.
    id: (u64, u64),
    flag: i32,
    /// For `<dir>/glibc-hwcaps/<name>`: `name`.
    hwcaps: Option<String>,
}

/// The subdirectory the loader looks in for libraries built for a newer ISA level (glibc 2.33+).
const GLIBC_HWCAPS: &str = "glibc-hwcaps";

/// Whether ldconfig looks at a directory entry of this name at all.
fn looks_like_dso(name: &[u8]) -> bool {
    let has_so = name.windows(3).any(|w| w == b".so");
    (name.starts_with(b"lib") || name.starts_with(b"ld-")) && has_so && !is_prelink_temp(name)
}

fn is_prelink_temp(name: &[u8]) -> bool {
    const T: &[u8] = b".#prelink#";
    // `.#prelink#` itself, or `.#prelink#.XXXXXX` (mkstemp's six characters).
    name.ends_with(T)
        || (name.len() >= T.len() + 7 && name[name.len() - T.len() - 7..].starts_with(b".#prelink#."))
}

fn join(dir: &str, name: &str) -> String {
    format!("{dir}/{name}")
}

fn not_found(e: &RootError) -> bool {
    e.kind() == std::io::ErrorKind::NotFound
}

/// Plans the cache and links for `root` (the container's rootfs): a full scan of every library
/// directory, as ldconfig does.
pub fn plan(root: &Root, options: &Options) -> Result<Update, LdCacheError> {
    plan_with_work(root, options).map(|(update, _)| update)
}

/// [`plan`], with what the scan did.
pub fn plan_with_work(root: &Root, options: &Options) -> Result<(Update, ScanWork), LdCacheError> {
    let mut scan = Scan::new(root, options);
    let update = full_scan(&mut scan, options)?;
    tracing::debug!(work = ?scan.work, "full scan done");
    Ok((update, scan.work))
}

fn full_scan(scan: &mut Scan<'_>, options: &Options) -> Result<Update, LdCacheError> {
    let (dirs, hwcaps_seen) = library_dirs(scan, options)?;
    let mut entries = Vec::new();
    let mut links = Vec::new();
    for dir in &dirs {
        search_dir(scan, dir, &|_| true, &mut entries, &mut links)?;
        if entries.len() > MAX_ENTRIES {
            return Err(LdCacheError::TooMany { what: "libraries in the cache", limit: MAX_ENTRIES });
        }
    }
    finish(entries, &hwcaps_seen, links)
}

/// [`plan`]'s result for a root whose own `/etc/ld.so.cache` is current, at the cost of reading
/// only the `injected` files (absolute inside the root) and their namesakes, instead of every
/// library of the image.
///
/// The image's entries are kept, each under the name [`plan`] would list its directory by (a
/// directory reached under two names, as `/lib/<triple>` and `/usr/lib/<triple>` are in a
/// usr-merged image, is listed under the first in the scan order, which the injected folders
/// lead), and in that directory order; in each injected folder the files whose names begin like
/// an injected library's (`libcuda.so` for `libcuda.so.550.54.15`) are scanned as [`plan`] scans
/// them, replacing the image's entries for the SONAMEs found, with the SONAME links made there.
/// Entries of directories no longer configured are dropped. Whenever that cannot give
/// [`plan`]'s answer it does the full scan instead: no cache, one that does not parse, one with
/// glibc-hwcaps or legacy hwcap entries, or nothing injected. What it knowingly does not redo is
/// the rest of the image's own state: libraries of the image its cache does not list (a stale
/// cache stays as stale as it was) and SONAME links missing outside the injected files.
pub fn plan_incremental(
    root: &Root,
    options: &Options,
    injected: &[PathBuf],
) -> Result<Update, LdCacheError> {
    plan_incremental_with_work(root, options, injected).map(|(update, _)| update)
}

/// [`plan_incremental`], with what the scan did.
pub fn plan_incremental_with_work(
    root: &Root,
    options: &Options,
    injected: &[PathBuf],
) -> Result<(Update, ScanWork), LdCacheError> {
    let mut scan = Scan::new(root, options);
    let update = incremental_scan(&mut scan, options, injected)?;
    tracing::debug!(work = ?scan.work, "scan done");
    Ok((update, scan.work))
}

fn incremental_scan(
    scan: &mut Scan<'_>,
    options: &Options,
    injected: &[PathBuf],
) -> Result<Update, LdCacheError> {
    let root = scan.root;
    let full = |scan: &mut Scan<'_>, why: &str| {
        tracing::debug!(why, "full scan");
        full_scan(scan, options)
    };
    // The injected libraries by folder: which file-name stems to scan there.
    let mut stems: HashMap<String, BTreeSet<String>> = HashMap::new();
    for file in injected {
        let (Some(dir), Some(name)) =
            (file.parent().and_then(Path::to_str), file.file_name().and_then(|n| n.to_str()))
        else {
            continue;
        };
        if !options.extra_dirs.iter().any(|d| d.as_os_str() == dir) || !looks_like_dso(name.as_bytes()) {
            continue;
        }
        if let Some(at) = name.find(".so") {
            stems.entry(dir.to_owned()).or_default().insert(name[..at + 3].to_owned());
        }
    }
    if stems.is_empty() {
        return full(scan, "no injected library");
    }
    // The folders put first are the image's own (its cache may not list them at all): each is
    // scanned whole, whatever was injected.
    let first: BTreeSet<&str> = options.first_dirs.iter().filter_map(|d| d.to_str()).collect();
    scan.work.paths_resolved += 1;
    let image_cache = match root.read_optional(Path::new(CACHE_PATH), MAX_CACHE_BYTES) {
        Ok(Some(bytes)) => {
            scan.work.reads += 1;
            scan.work.bytes_read += bytes.len() as u64;
            bytes
        }
        Ok(None) => return full(scan, "the image has no ld.so.cache"),
        Err(e) => {
            tracing::debug!(error = %e, "image ld.so.cache unreadable");
            return full(scan, "the image's ld.so.cache is unreadable");
        }
    };
    let image_entries = match parse(&image_cache) {
        Ok(entries) => entries,
        Err(_) => return full(scan, "the image's ld.so.cache does not parse"),
    };
    if image_entries.iter().any(|e| e.hwcap != 0) {
        return full(scan, "the image's ld.so.cache has hwcap entries");
    }
    if image_entries.len() > MAX_ENTRIES {
        return Err(LdCacheError::TooMany { what: "libraries in the cache", limit: MAX_ENTRIES });
    }
    let (dirs, hwcaps_seen) = library_dirs(scan, options)?;
    if dirs.iter().any(|d| d.hwcaps.is_some()) {
        return full(scan, "the image has glibc-hwcaps directories");
    }
    // Which of `dirs` each image entry's directory is (by device and inode, as ldconfig
    // deduplicates), looked up once per distinct directory name.
    let mut dir_index: HashMap<(u64, u64), usize> = HashMap::new();
    let mut index_of_name: HashMap<&str, usize> = HashMap::new();
    for (i, d) in dirs.iter().enumerate() {
        dir_index.entry(d.id).or_insert(i);
        index_of_name.entry(d.path.as_str()).or_insert(i);
    }
    let mut by_name: HashMap<String, Option<usize>> = HashMap::new();
    let mut kept: Vec<Vec<Entry>> = vec![Vec::new(); dirs.len()];
    for entry in image_entries {
        let Some((parent, file)) = entry.path.rsplit_once('/') else { continue };
        // Each distinct directory costs a stat: a cache naming more than ldconfig could have
        // scanned was not written by it.
        if !by_name.contains_key(parent) && by_name.len() >= MAX_DIRS {
            return full(scan, "the image's ld.so.cache names too many directories");
        }
        let index = *by_name.entry(parent.to_owned()).or_insert_with(|| {
            // A name the scan lists is that directory; any other is told apart by a stat.
            if let Some(&i) = index_of_name.get(parent) {
                return Some(i);
            }
            let parent = if parent.is_empty() { "/" } else { parent };
            scan.metadata(parent).ok().flatten().and_then(|m| dir_index.get(&(m.dev(), m.ino())).copied())
        });
        if let Some(i) = index {
            let path = join(&dirs[i].path, file);
            kept[i].push(Entry { path, ..entry });
        }
    }
    let mut entries = Vec::new();
    let mut links = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let whole = first.contains(dir.path.as_str());
        let dir_stems = match stems.get(&dir.path) {
            Some(s) => Some(s),
            None if whole => None,
            None => {
                entries.extend(kept[i].drain(..).map(|e| (e, None)));
                continue;
            }
        };
        let mut scanned = Vec::new();
        search_dir(
            scan,
            dir,
            &|name| whole || dir_stems.is_some_and(|st| st.iter().any(|s| name.starts_with(s.as_str()))),
            &mut scanned,
            &mut links,
        )?;
        let found: BTreeSet<String> = scanned.iter().map(|(e, _)| e.key.clone()).collect();
        entries.extend(scanned);
        entries.extend(kept[i].drain(..).filter(|e| !found.contains(&e.key)).map(|e| (e, None)));
    }
    finish(entries, &hwcaps_seen, links)
}

/// The directories ldconfig scans, in order, deduplicated (with the glibc-hwcaps subdirectory
/// names seen on the way).
fn library_dirs(
    scan: &mut Scan<'_>,
    options: &Options,
) -> Result<(Vec<Dir>, BTreeSet<String>), LdCacheError> {
    let root = scan.root;
    let mut lines = Vec::new();
    for d in options.first_dirs.iter().chain(&options.extra_dirs) {
        let s = d.to_str().ok_or_else(|| LdCacheError::Conf {
            file: "<extra folders>".into(),
            line: 0,
            message: format!("{} is not UTF-8; name injected folders in UTF-8", d.display()),
        })?;
        if !s.starts_with('/') {
            return Err(LdCacheError::Conf {
                file: "<extra folders>".into(),
                line: 0,
                message: format!("{s} is relative; give injected folders as absolute paths inside the root"),
            });
        }
        lines.push(conf::dir_line(s));
    }
    let mut reader = conf::ConfReader::new(root);
    reader.read(Path::new(CONF_PATH))?;
    lines.append(&mut reader.dirs);
    let layout = Layout::detect(root);
    tracing::debug!(?layout, "builtin library directories");
    lines.extend(layout.system_dirs().iter().map(|d| conf::dir_line(d)));

    // add_dir_1 / add_single_dir: existing paths only, one per (dev, inode), first name kept,
    // the later line's type flag winning.
    let mut dirs: Vec<Dir> = Vec::new();
    let mut seen: HashMap<(u64, u64), usize> = HashMap::new();
    // Every glibc-hwcaps subdirectory name found: ldconfig puts each in the string table.
    let mut hwcaps_seen: BTreeSet<String> = BTreeSet::new();
    let mut ids: HashMap<String, Option<(u64, u64)>> = HashMap::new();
    for line in lines {
        if !line.path.starts_with('/') {
            tracing::warn!(dir = %line.path, "relative ld.so.conf directory ignored");
            continue;
        }
        // The same name often comes from several sources (an injected folder also in ld.so.conf,
        // a builtin directory also configured): one stat per name.
        let id = *ids.entry(line.path.clone()).or_insert_with(|| match scan.metadata(&line.path) {
            Ok(Some(m)) => Some((m.dev(), m.ino())),
            Ok(None) => None,
            Err(e) => {
                tracing::debug!(error = %e, "ld.so.conf directory skipped");
                None
            }
        });
        let Some(id) = id else { continue };
        let dir = Dir { path: line.path, id, flag: line.flag, hwcaps: None };
        if add_single_dir(&mut dirs, &mut seen, dir)? {
            add_hwcaps_subdirs(scan, &mut dirs, &mut seen, &mut hwcaps_seen)?;
        }
    }

    Ok((dirs, hwcaps_seen))
}

/// The cache of `entries` (in scan order) and the links, as one [`Update`].
fn finish(
    entries: Vec<(Entry, Option<String>)>,
    hwcaps_seen: &BTreeSet<String>,
    links: Vec<Link>,
) -> Result<Update, LdCacheError> {
    // The hwcaps section lists the subdirectory names that hold a library, sorted; an entry's hwcap
    // field is the extension bit, the library's ISA level and its name's index there.
    let mut used: Vec<String> = entries.iter().filter_map(|(_, h)| h.clone()).collect();
    used.sort();
    used.dedup();
    let mut entries: Vec<Entry> = entries
        .into_iter()
        .map(|(mut e, h)| {
            if let Some(h) = h {
                let index = used.binary_search(&h).expect("every used name is listed") as u64;
                e.hwcap |= format::HWCAP_EXTENSION | index;
            }
            e
        })
        .collect();
    format::sort_entries(&mut entries);
    let hwcaps_seen: Vec<&str> = hwcaps_seen.iter().map(String::as_str).collect();
    let used: Vec<&str> = used.iter().map(String::as_str).collect();
    let cache = format::encode_with_hwcaps(&entries, GENERATOR, &hwcaps_seen, &used)?;
    Ok(Update { cache, links })
}

/// ldconfig's `add_single_dir`: adds `dir` unless its (device, inode) is listed already, in which
/// case the listed one takes its flag. True when added.
fn add_single_dir(
    dirs: &mut Vec<Dir>,
    seen: &mut HashMap<(u64, u64), usize>,
    dir: Dir,
) -> Result<bool, LdCacheError> {
    let id = dir.id;
    if let Some(&i) = seen.get(&id) {
        dirs[i].flag = dir.flag;
        return Ok(false);
    }
    if dirs.len() >= MAX_DIRS {
        return Err(LdCacheError::TooMany { what: "library directories", limit: MAX_DIRS });
    }
    seen.insert(id, dirs.len());
    dirs.push(dir);
    Ok(true)
}

/// ldconfig's `add_glibc_hwcaps_subdirectories` for the directory just added: each directory
/// (or link to one) in `<dir>/glibc-hwcaps` that is not hidden and has no `:` in its name,
/// right after its parent, under the parent's name as configured.
fn add_hwcaps_subdirs(
    scan: &mut Scan<'_>,
    dirs: &mut Vec<Dir>,
    seen: &mut HashMap<(u64, u64), usize>,
    hwcaps_seen: &mut BTreeSet<String>,
) -> Result<(), LdCacheError> {
    let parent = dirs.last().expect("a directory was just added");
    let (parent_path, flag) = (parent.path.clone(), parent.flag);
    let base = join(&parent_path, GLIBC_HWCAPS);
    scan.work.paths_resolved += 1;
    let listing = match scan.root.read_dir_at_most(Path::new(&base), MAX_DIR_ENTRIES) {
        Ok(listing) => listing,
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
            return Err(LdCacheError::TooMany {
                what: "entries in one library directory",
                limit: MAX_DIR_ENTRIES,
            });
        }
        Err(_) => return Ok(()),
    };
    scan.work.names_listed += listing.len() as u64;
    scan.within_budget(&base)?;
    for (name, ty) in listing {
        let Some(name) = name.to_str() else { continue };
        if name.starts_with('.') || name.contains(':') || ty == EntryType::File {
            continue;
        }
        let path = join(&base, name);
        let meta = scan.metadata(&path);
        scan.within_budget(&base)?;
        let Ok(Some(meta)) = meta else { continue };
        if !meta.is_dir() {
            continue;
        }
        if hwcaps_seen.insert(name.to_owned()) && hwcaps_seen.len() > MAX_DIRS {
            return Err(LdCacheError::TooMany { what: "glibc-hwcaps subdirectory names", limit: MAX_DIRS });
        }
        let dir = Dir { path, id: (meta.dev(), meta.ino()), flag, hwcaps: Some(name.to_owned()) };
        add_single_dir(dirs, seen, dir)?;
    }
    Ok(())
}

/// ldconfig's `search_dir` for one directory (no legacy hwcap subdirectories). Entries of a
/// glibc-hwcaps subdirectory come with its name. Only the names `wanted` says are read.
fn search_dir(
    scan: &mut Scan<'_>,
    dir: &Dir,
    wanted: &dyn Fn(&str) -> bool,
    entries: &mut Vec<(Entry, Option<String>)>,
    links: &mut Vec<Link>,
) -> Result<(), LdCacheError> {
    let root = scan.root;
    scan.work.paths_resolved += 1;
    let listing = match root.read_dir_at_most(Path::new(&dir.path), MAX_DIR_ENTRIES) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
            return Err(LdCacheError::TooMany {
                what: "entries in one library directory",
                limit: MAX_DIR_ENTRIES,
            });
        }
        Err(e) => {
            // ldconfig: "Can't open directory", and on.
            tracing::debug!(error = %e, "library directory skipped");
            return Ok(());
        }
    };
    scan.work.names_listed += listing.len() as u64;
    scan.within_budget(&dir.path)?;
    let mut dlibs: Vec<Dlib> = Vec::new();
    let mut by_soname: HashMap<String, usize> = HashMap::new();
    for (name, ty) in listing {
        if !matches!(ty, EntryType::File | EntryType::Symlink) || !looks_like_dso(name.as_bytes()) {
            continue;
        }
        let Some(name) = name.to_str().map(str::to_owned) else { continue };
        if !wanted(&name) {
            continue;
        }
        let file = join(&dir.path, &name);
        let mut is_link = ty == EntryType::Symlink;
        // Symlinks are followed inside the root; dangling ones, directories and devices are not
        // libraries. open_regular never blocks on a FIFO.
        scan.work.paths_resolved += 1;
        let opened = root.open_regular(Path::new(&file));
        let lib = match opened {
            Ok((f, meta)) => scan.library(&file, &f, &meta),
            Err(e) => {
                if !not_found(&e) {
                    tracing::debug!(error = %e, "not a library file");
                }
                None
            }
        };
        scan.within_budget(&dir.path)?;
        let Some(lib) = lib else { continue };
        let mut soname = lib.soname.unwrap_or_else(|| name.clone());
        // A SONAME is a file name: one with a `/` (or `.`, `..`, empty) would make the link land
        // elsewhere than the directory. ldconfig does not check; no real library has one.
        if soname.is_empty() || soname == "." || soname == ".." || soname.contains('/') {
            tracing::warn!(file, soname, "SONAME is not a file name; library skipped");
            continue;
        }
        if is_link && name != soname {
            // A link not named after the SONAME (nor the `.so` development link for it) is a
            // library in its own right.
            let dev_link = name.ends_with(".so") && soname.starts_with(&name);
            if !dev_link {
                is_link = false;
            }
        }
        if is_link {
            soname = name.clone();
        }
        let mut flag = lib.flags;
        if flag == format::FLAG_ELF
            && (dir.flag == format::FLAG_ELF_LIBC5 || dir.flag == format::FLAG_ELF_LIBC6)
        {
            flag = dir.flag;
        }
        match by_soname.get(&soname) {
            Some(&i) => {
                let old = &mut dlibs[i];
                if (!is_link && old.is_link)
                    || (is_link == old.is_link && format::libcmp(old.name.as_bytes(), name.as_bytes()) < 0)
                {
                    // The first one's flag stays, as in ldconfig.
                    old.name = name;
                    old.is_link = is_link;
                    old.isa_level = lib.isa_level;
                }
            }
            None => {
                by_soname.insert(soname.clone(), dlibs.len());
                dlibs.push(Dlib { name, soname, flag, is_link, isa_level: lib.isa_level });
            }
        }
    }
    // ldconfig keeps its list newest-first.
    for d in dlibs.into_iter().rev() {
        // In a glibc-hwcaps subdirectory ldconfig makes no links and lists the file itself.
        let file = if dir.hwcaps.is_some() {
            &d.name
        } else {
            if !d.is_link
                && let Some(link) = link_needed(scan, &dir.path, &d.name, &d.soname)
            {
                links.push(link);
            }
            scan.within_budget(&dir.path)?;
            &d.soname
        };
        // The ISA level goes into bits 32.. of a glibc-hwcaps entry's hwcap (the index is added
        // once every subdirectory is known).
        let hwcap = if dir.hwcaps.is_some() { u64::from(d.isa_level) << 32 } else { 0 };
        let entry = Entry { key: d.soname.clone(), path: join(&dir.path, file), flags: d.flag, hwcap };
        entries.push((entry, dir.hwcaps.clone()));
    }
    Ok(())
}

/// ldconfig's `create_links`: a link `<dir>/<soname> -> <name>` unless that path already leads to
/// the same file, or is something other than a symlink.
fn link_needed(scan: &mut Scan<'_>, dir: &str, name: &str, soname: &str) -> Option<Link> {
    let so_path = join(dir, soname);
    let lib_path = join(dir, name);
    let mut ident = |p: &str| scan.metadata(p).ok().flatten().map(|m| (m.dev(), m.ino()));
    if let Some(so) = ident(&so_path)
        && Some(so) == ident(&lib_path)
    {
        return None;
    }
    scan.work.paths_resolved += 1;
    match scan.root.symlink_metadata(Path::new(&so_path)) {
        Ok(None) => {}
        Ok(Some(m)) if m.file_type().is_symlink() => {}
        Ok(Some(_)) => {
            tracing::warn!(path = so_path, "is not a symbolic link; SONAME link not made");
            return None;
        }
        Err(e) => {
            tracing::warn!(error = %e, "SONAME link not made");
            return None;
        }
    }
    Some(Link { path: PathBuf::from(so_path), target: PathBuf::from(name) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::process::Command;

    const EM_X86_64: u16 = 62;

    fn put(root: &Path, path: &str, bytes: &[u8]) {
        let p = root.join(path.trim_start_matches('/'));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, bytes).unwrap();
    }

    fn so(soname: &str) -> Vec<u8> {
        elf::tests::tiny_so(Some(soname), EM_X86_64, true)
    }

    fn plan_at(root: &Path, extra: &[&str]) -> Result<Update, LdCacheError> {
        plan(
            &Root::open(root).unwrap(),
            &Options { extra_dirs: extra.iter().map(PathBuf::from).collect(), ..Default::default() },
        )
    }

    fn keys(u: &Update) -> Vec<String> {
        parse(&u.cache).unwrap().into_iter().map(|e| format!("{} {}", e.key, e.path)).collect()
    }

    /// Unmounts on drop, panicking test or not.
    struct Mount(PathBuf);
    impl Drop for Mount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }

    #[test]
    fn a_plain_tree_gets_its_links_and_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        put(r, "/usr/lib/libfoo.so.1.2.3", &so("libfoo.so.1"));
        put(r, "/usr/lib/libfoo.so.1.2.0", &so("libfoo.so.1"));
        put(r, "/usr/lib/libbar.so", &elf::tests::tiny_so(None, EM_X86_64, true));
        let u = plan_at(r, &[]).unwrap();
        assert_eq!(keys(&u), ["libfoo.so.1 /usr/lib/libfoo.so.1", "libbar.so /usr/lib/libbar.so"]);
        assert_eq!(u.links, [Link { path: "/usr/lib/libfoo.so.1".into(), target: "libfoo.so.1.2.3".into() }]);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn an_rpm_layout_gets_lib64_builtin_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        // Fedora: merged /usr, /lib and /lib64 links into it, no ld.so.conf lines for either.
        symlink("usr/lib", r.join("lib")).unwrap();
        symlink("usr/lib64", r.join("lib64")).unwrap();
        put(r, "/usr/lib64/libc.so.6", &so("libc.so.6"));
        put(r, "/usr/lib64/libz.so.1.2.13", &so("libz.so.1"));
        put(r, "/usr/lib/libold32.so.1", &so("libold32.so.1"));
        put(r, "/usr/libx32/libx.so.1", &so("libx.so.1"));
        put(r, "/usr/lib/x86_64-linux-gnu/libnot.so.1", &so("libnot.so.1"));
        put(r, "/etc/ld.so.conf", b"include ld.so.conf.d/*.conf\n");
        assert_eq!(Layout::detect(&Root::open(r).unwrap()), Layout::Lib64);
        let u = plan_at(r, &[]).unwrap();
        // Each directory under the first of its names in /lib, /lib64, /libx32, /usr/lib, ...
        assert_eq!(
            keys(&u),
            [
                "libz.so.1 /lib64/libz.so.1",
                "libx.so.1 /usr/libx32/libx.so.1",
                "libold32.so.1 /lib/libold32.so.1",
                "libc.so.6 /lib64/libc.so.6"
            ]
        );
        assert_eq!(u.links, [Link { path: "/lib64/libz.so.1".into(), target: "libz.so.1.2.13".into() }]);

        // A Debian tree has /lib64 too, for the loader's link only: it stays multiarch.
        let d = tmp.path().join("debian");
        put(&d, "/usr/lib/x86_64-linux-gnu/libc.so.6", &so("libc.so.6"));
        put(&d, "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", &so("ld-linux-x86-64.so.2"));
        symlink("usr/lib", d.join("lib")).unwrap();
        fs::create_dir_all(d.join("lib64")).unwrap();
        symlink("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", d.join("lib64/ld-linux-x86-64.so.2")).unwrap();
        // Even with a libc.so.6 in /lib64 as well (multiarch decides).
        put(&d, "/lib64/libc.so.6", &so("libc.so.6"));
        assert_eq!(Layout::detect(&Root::open(&d).unwrap()), Layout::Multiarch);
        let u = plan_at(&d, &[]).unwrap();
        assert!(keys(&u).iter().all(|k| !k.contains("/lib64/")), "{:?}", keys(&u));

        // Nothing to tell by: multiarch, as before.
        let e = tmp.path().join("empty");
        fs::create_dir_all(&e).unwrap();
        assert_eq!(Layout::detect(&Root::open(&e).unwrap()), Layout::Multiarch);
    }

    #[test]
    fn nothing_outside_the_root_is_read() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        let out = outside.to_str().unwrap().to_owned();
        put(&outside, "/lib/liboutside.so.1", &so("liboutside.so.1"));
        put(&outside, "/etc/ld.so.conf", format!("{out}/lib\n").as_bytes());
        put(&outside, "/etc/ld.so.conf.d/x.conf", format!("{out}/lib\n").as_bytes());

        // The root's /etc is a link out, absolute and relative.
        for target in [format!("{out}/etc"), "../../../../../../../../outside/etc".into()] {
            let r = tmp.path().join("r1");
            let _ = fs::remove_dir_all(&r);
            put(&r, "/usr/lib/libin.so.1", &so("libin.so.1"));
            symlink(&target, r.join("etc")).unwrap();
            let u = plan_at(&r, &[]).unwrap();
            assert_eq!(keys(&u), ["libin.so.1 /usr/lib/libin.so.1"], "/etc -> {target}");
        }

        // Lines, includes and library links that name the outside through /proc or `..`, with the
        // real /proc mounted in the root when this test may mount.
        let r = tmp.path().join("r2");
        fs::create_dir_all(r.join("proc")).unwrap();
        let _mount = Command::new("mount")
            .args(["--bind", "/proc"])
            .arg(r.join("proc"))
            .status()
            .is_ok_and(|s| s.success())
            .then(|| Mount(r.join("proc")));
        put(
            &r,
            "/etc/ld.so.conf",
            format!(
                "include /proc/self/root{out}/etc/*.conf\ninclude ../../../../../../..{out}/etc/ld.so.conf\n\
                 /proc/1/root{out}/lib\n/proc/self/cwd\n{out}/lib\n/../../../../../../..{out}/lib\n/usr/lib\n"
            )
            .as_bytes(),
        );
        put(&r, "/usr/lib/libin.so.1", &so("libin.so.1"));
        symlink(format!("/proc/1/root{out}/lib/liboutside.so.1"), r.join("usr/lib/libproc.so.1")).unwrap();
        symlink(format!("../../../../../../../..{out}/lib/liboutside.so.1"), r.join("usr/lib/libdots.so.1"))
            .unwrap();
        symlink(format!("/proc/1/root{out}/lib"), r.join("lib")).unwrap();
        let u = plan_at(&r, &[&format!("/proc/self/root{out}/lib")]).unwrap();
        assert_eq!(keys(&u), ["libin.so.1 /usr/lib/libin.so.1"]);
        assert!(u.links.is_empty(), "{:?}", u.links);
    }

    #[test]
    fn fifos_do_not_block_and_are_not_libraries() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        put(r, "/usr/lib/libin.so.1", &so("libin.so.1"));
        fs::create_dir_all(r.join("etc")).unwrap();
        for p in ["usr/lib/libfifo.so.1", "etc/ld.so.conf"] {
            assert!(Command::new("mkfifo").arg(r.join(p)).status().unwrap().success());
        }
        symlink("libfifo.so.1", r.join("usr/lib/libfifolink.so.2")).unwrap();
        let u = plan_at(r, &[]).unwrap();
        assert_eq!(keys(&u), ["libin.so.1 /usr/lib/libin.so.1"]);
    }

    #[test]
    fn include_loops_and_huge_files_fail_with_the_file_named() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        put(r, "/etc/ld.so.conf", b"include /etc/ld.so.conf.d/*.conf\n");
        put(r, "/etc/ld.so.conf.d/loop.conf", b"include loop.conf\n");
        let e = plan_at(r, &[]).unwrap_err().to_string();
        assert!(e.starts_with("/etc/ld.so.conf.d/loop.conf line 1: ") && e.contains("include loop"), "{e}");

        put(r, "/etc/ld.so.conf.d/loop.conf", &vec![b'/'; conf::MAX_CONF_BYTES as usize + 1]);
        let e = plan_at(r, &[]).unwrap_err().to_string();
        assert!(e.contains("loop.conf") && e.contains("limit"), "{e}");

        for i in 0..conf::MAX_CONF_FILES + 1 {
            put(r, &format!("/etc/ld.so.conf.d/{i:04}.conf"), b"/usr/lib\n");
        }
        fs::remove_file(r.join("etc/ld.so.conf.d/loop.conf")).unwrap();
        let e = plan_at(r, &[]).unwrap_err();
        assert!(matches!(e, LdCacheError::TooMany { .. }), "{e}");
    }

    #[test]
    fn an_include_loop_names_the_file_and_line_that_close_it_not_a_drop_in_read_on_the_way() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        // As the hook leaves an image: its drop-ins first in the listing, the image's loop after.
        put(r, "/etc/ld.so.conf", b"include /etc/ld.so.conf.d/*.conf\n");
        put(r, "/etc/ld.so.conf.d/00-compat-nvinject.conf", b"/usr/local/cuda/compat\n");
        put(r, "/etc/ld.so.conf.d/00-nvinject.conf", b"/usr/lib/x86_64-linux-gnu\n");
        put(r, "/etc/ld.so.conf.d/zz-image.conf", b"# the image's\n/opt/lib\ninclude ../ld.so.conf\n");
        let e = plan_at(r, &[]).unwrap_err();
        match &e {
            LdCacheError::Conf { file, line, message } => {
                assert_eq!((file.as_str(), *line), ("/etc/ld.so.conf.d/zz-image.conf", 3), "{e}");
                assert!(message.contains("include loop"), "{e}");
                assert!(
                    message.contains("/etc/ld.so.conf -> /etc/ld.so.conf.d/zz-image.conf -> /etc/ld.so.conf.d/../ld.so.conf"),
                    "{e}"
                );
            }
            other => panic!("expected a Conf error, got {other:?}"),
        }
        assert!(!e.to_string().contains("nvinject.conf"), "{e}");

        // A nest too deep without a loop: named at the include that goes one level too far.
        put(r, "/etc/ld.so.conf.d/zz-image.conf", b"include /etc/deep/1.conf\n");
        for i in 1..=conf::MAX_INCLUDE_DEPTH + 2 {
            put(r, &format!("/etc/deep/{i}.conf"), format!("include {}.conf\n", i + 1).as_bytes());
        }
        let e = plan_at(r, &[]).unwrap_err().to_string();
        let last = conf::MAX_INCLUDE_DEPTH - 1;
        assert!(
            e.starts_with(&format!(
                "/etc/deep/{last}.conf line 1: including /etc/deep/{}.conf nests",
                last + 1
            )),
            "{e}"
        );

        // The same file included twice, not from itself, is no loop.
        put(r, "/etc/ld.so.conf.d/zz-image.conf", b"include /etc/twice.conf\ninclude /etc/twice.conf\n");
        put(r, "/etc/twice.conf", b"/opt/lib\n");
        assert!(plan_at(r, &[]).is_ok());
    }

    #[test]
    fn a_soname_that_is_not_a_file_name_is_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        put(r, "/usr/lib/libevil.so.1", &so("../../etc/evil"));
        put(r, "/usr/lib/libdot.so.1", &so(".."));
        put(r, "/usr/lib/libin.so.1", &so("libin.so.1"));
        let u = plan_at(r, &[]).unwrap();
        assert_eq!(keys(&u), ["libin.so.1 /usr/lib/libin.so.1"]);
        assert!(u.links.is_empty());
    }

    #[test]
    fn relative_extra_folders_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let e = plan_at(tmp.path(), &["usr/lib"]).unwrap_err().to_string();
        assert!(e.contains("usr/lib") && e.contains("absolute"), "{e}");
    }

    #[test]
    fn dso_names() {
        for (n, want) in [
            ("libc.so.6", true),
            ("ld-linux-x86-64.so.2", true),
            ("libfoo.so", true),
            ("libfoo.a", false),
            ("foo.so.1", false),
            ("libfoo.so.1.#prelink#", false),
            ("libfoo.so.1.#prelink#.AbCdEf", false),
        ] {
            assert_eq!(looks_like_dso(n.as_bytes()), want, "{n}");
        }
    }

    /// An image as its own ldconfig left it: libraries in the multiarch directory (reached as
    /// `/lib/<triple>` too, usr-merged), one in a configured directory, and its cache.
    fn image_with_cache() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        put(root, "/usr/lib/x86_64-linux-gnu/libz.so.1.2.13", &so("libz.so.1"));
        symlink("libz.so.1.2.13", root.join("usr/lib/x86_64-linux-gnu/libz.so.1")).unwrap();
        put(root, "/usr/lib/x86_64-linux-gnu/libc.so.6", &so("libc.so.6"));
        symlink("usr/lib", root.join("lib")).unwrap();
        put(root, "/opt/img/libimg.so.3", &so("libimg.so.3"));
        put(root, "/etc/ld.so.conf", b"/opt/img\n");
        let image = plan_at(root, &[]).unwrap();
        for link in &image.links {
            symlink(&link.target, root.join(link.path.strip_prefix("/").unwrap())).unwrap();
        }
        put(root, CACHE_PATH, &image.cache);
        dir
    }

    /// The driver as the CDI spec's mounts leave it: versioned files (their SONAME links are the
    /// cache builder's to make), one with a namesake the image already has.
    fn inject_driver(root: &Path) -> Vec<PathBuf> {
        let files = [
            ("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", "libcuda.so.1"),
            ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15", "libnvidia-ml.so.1"),
            ("/usr/lib/nvidia/libnvidia-ptxjitcompiler.so.550.54.15", "libnvidia-ptxjitcompiler.so.1"),
        ];
        for (path, soname) in files {
            put(root, path, &so(soname));
        }
        // Not libraries: skipped as ldconfig skips them.
        put(root, "/usr/lib/x86_64-linux-gnu/nvidia.icd", b"{}");
        let mut injected: Vec<PathBuf> = files.iter().map(|(p, _)| PathBuf::from(p)).collect();
        injected.push("/usr/lib/x86_64-linux-gnu/nvidia.icd".into());
        injected
    }

    fn plan_incremental_at(
        root: &Path,
        extra: &[&str],
        injected: &[PathBuf],
    ) -> Result<Update, LdCacheError> {
        let options = Options { extra_dirs: extra.iter().map(PathBuf::from).collect(), ..Default::default() };
        plan_incremental(&Root::open(root).unwrap(), &options, injected)
    }

    #[test]
    fn incremental_equals_a_full_scan_over_a_current_image_cache() {
        let dir = image_with_cache();
        let root = dir.path();
        let injected = inject_driver(root);
        let folders = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/nvidia"];
        let full = plan_at(root, &folders).unwrap();
        let incremental = plan_incremental_at(root, &folders, &injected).unwrap();
        assert_eq!(parse(&incremental.cache).unwrap(), parse(&full.cache).unwrap());
        assert_eq!(incremental, full, "cache bytes and links");
        // The image's usr-merged entries moved to the folder's name, as the full scan lists them.
        let entries = parse(&full.cache).unwrap();
        assert!(entries.iter().any(|e| e.path == "/usr/lib/x86_64-linux-gnu/libz.so.1"), "{entries:?}");
        assert!(entries.iter().any(|e| e.path == "/opt/img/libimg.so.3"));
        let mut links: Vec<_> = full.links.iter().map(|l| l.path.display().to_string()).collect();
        links.sort();
        assert_eq!(
            links,
            [
                "/usr/lib/nvidia/libnvidia-ptxjitcompiler.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
            ]
        );
    }

    #[test]
    fn incremental_reads_only_the_injected_files_and_their_namesakes() {
        let dir = image_with_cache();
        let root = dir.path();
        let injected = inject_driver(root);
        // A library of the image its cache does not list (a stale cache): the full scan finds it,
        // the incremental one keeps the image's view. A namesake of an injected library is scanned.
        put(root, "/usr/lib/x86_64-linux-gnu/libstale.so.9", &so("libstale.so.9"));
        put(root, "/usr/lib/x86_64-linux-gnu/libcuda.so.1.0-image", &so("libcuda.so.1"));
        let folders = ["/usr/lib/x86_64-linux-gnu"];
        let full = keys(&plan_at(root, &folders).unwrap());
        let incremental = keys(&plan_incremental_at(root, &folders, &injected).unwrap());
        let stale = |k: &String| k.starts_with("libstale.so.9 ");
        assert!(full.iter().any(stale) && !incremental.iter().any(stale), "{full:?} {incremental:?}");
        let without_stale: Vec<String> = full.into_iter().filter(|k| !stale(k)).collect();
        assert_eq!(incremental, without_stale);
    }

    #[test]
    fn incremental_falls_back_to_the_full_scan_when_it_cannot_be_exact() {
        let dir = image_with_cache();
        let root = dir.path();
        let injected = inject_driver(root);
        let folders = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/nvidia"];
        // A stale library makes the two differ, so each fallback shows as the full result.
        put(root, "/usr/lib/x86_64-linux-gnu/libstale.so.9", &so("libstale.so.9"));
        let full = plan_at(root, &folders).unwrap();
        assert_eq!(plan_incremental_at(root, &folders, &[]).unwrap(), full, "nothing injected");
        for cache in [b"not a cache".to_vec(), Vec::new()] {
            put(root, CACHE_PATH, &cache);
            assert_eq!(plan_incremental_at(root, &folders, &injected).unwrap(), full);
        }
        fs::remove_file(root.join("etc/ld.so.cache")).unwrap();
        assert_eq!(plan_incremental_at(root, &folders, &injected).unwrap(), full, "no cache");
        let hwcap = format::encode(
            &[Entry {
                key: "libz.so.1".into(),
                path: "/usr/lib/x86_64-linux-gnu/libz.so.1".into(),
                flags: 0x0303,
                hwcap: 1,
            }],
            "test",
        )
        .unwrap();
        put(root, CACHE_PATH, &hwcap);
        assert_eq!(plan_incremental_at(root, &folders, &injected).unwrap(), full, "hwcap entries");
        // Hostile caches: one naming more directories than ldconfig could scan, one too large.
        let many: Vec<Entry> = (0..=MAX_DIRS)
            .map(|i| Entry {
                key: format!("libx{i}.so.1"),
                path: format!("/d{i}/libx{i}.so.1"),
                flags: 0x0303,
                hwcap: 0,
            })
            .collect();
        put(root, CACHE_PATH, &format::encode(&many, "test").unwrap());
        assert_eq!(plan_incremental_at(root, &folders, &injected).unwrap(), full, "too many directories");
        let mut huge = format::encode(&many[..1], "test").unwrap();
        huge.resize(MAX_CACHE_BYTES as usize + 1, 0);
        put(root, CACHE_PATH, &huge);
        assert_eq!(plan_incremental_at(root, &folders, &injected).unwrap(), full, "too large");
    }

    /// An image shipping CUDA forward-compatibility libraries, the driver injected beside its own.
    fn image_with_compat() -> (tempfile::TempDir, Vec<PathBuf>) {
        let dir = image_with_cache();
        let root = dir.path();
        let injected = inject_driver(root);
        put(root, "/usr/local/cuda-12.6/compat/libcuda.so.560.35.03", &so("libcuda.so.1"));
        put(
            root,
            "/usr/local/cuda-12.6/compat/libnvidia-ptxjitcompiler.so.560.35.03",
            &so("libnvidia-ptxjitcompiler.so.1"),
        );
        (dir, injected)
    }

    fn entries_for(u: &Update, key: &str) -> Vec<String> {
        parse(&u.cache).unwrap().into_iter().filter(|e| e.key == key).map(|e| e.path).collect()
    }

    #[test]
    fn first_dirs_lead_among_entries_of_the_same_name_full_and_incremental() {
        let (dir, injected) = image_with_compat();
        let root = dir.path();
        let compat = "/usr/local/cuda-12.6/compat";
        let options = Options {
            first_dirs: vec![compat.into()],
            extra_dirs: vec!["/usr/lib/x86_64-linux-gnu".into(), "/usr/lib/nvidia".into()],
            ..Default::default()
        };
        let r = Root::open(root).unwrap();
        let full = plan(&r, &options).unwrap();
        // Both libcuda.so.1 are listed; the compat one first, which is the one the loader takes.
        assert_eq!(
            entries_for(&full, "libcuda.so.1"),
            [format!("{compat}/libcuda.so.1"), "/usr/lib/x86_64-linux-gnu/libcuda.so.1".to_owned()]
        );
        assert_eq!(
            entries_for(&full, "libnvidia-ptxjitcompiler.so.1"),
            [
                format!("{compat}/libnvidia-ptxjitcompiler.so.1"),
                "/usr/lib/nvidia/libnvidia-ptxjitcompiler.so.1".to_owned()
            ]
        );
        assert!(full.links.contains(&Link {
            path: format!("{compat}/libcuda.so.1").into(),
            target: "libcuda.so.560.35.03".into()
        }));
        // The image's cache does not list the compat folder: the incremental plan scans it whole
        // and gives the same bytes.
        let incremental = plan_incremental(&r, &options, &injected).unwrap();
        assert_eq!(incremental, full);
        // Without it (the host driver is as new): the injected driver's entry only.
        let plain = Options { first_dirs: Vec::new(), ..options.clone() };
        let without = plan_incremental(&r, &plain, &injected).unwrap();
        assert_eq!(entries_for(&without, "libcuda.so.1"), ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"]);
        assert_eq!(without, plan(&r, &plain).unwrap());
    }

    #[test]
    fn a_first_dir_also_listed_later_counts_once_in_first_place() {
        let (dir, injected) = image_with_compat();
        let root = dir.path();
        // The image's ld.so.conf names it too (under another name, through a symlink): scanned
        // once, first.
        symlink("cuda-12.6", root.join("usr/local/cuda")).unwrap();
        put(root, "/etc/ld.so.conf", b"/opt/img\n/usr/local/cuda/compat\n");
        let options = Options {
            first_dirs: vec!["/usr/local/cuda-12.6/compat".into()],
            extra_dirs: vec!["/usr/lib/x86_64-linux-gnu".into(), "/usr/lib/nvidia".into()],
            ..Default::default()
        };
        let r = Root::open(root).unwrap();
        let full = plan(&r, &options).unwrap();
        assert_eq!(
            entries_for(&full, "libcuda.so.1"),
            ["/usr/local/cuda-12.6/compat/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"]
        );
        assert_eq!(plan_incremental(&r, &options, &injected).unwrap(), full);
        // A first dir given relative is refused, as extra folders are.
        let bad = Options { first_dirs: vec!["usr/local/cuda/compat".into()], ..Default::default() };
        assert!(matches!(plan(&r, &bad), Err(LdCacheError::Conf { .. })));
    }

    use crate::synth_elf;

    fn plan_counted(root: &Path, extra: &[&str], budget: u64) -> Result<(Update, ScanWork), LdCacheError> {
        let options = Options {
            extra_dirs: extra.iter().map(PathBuf::from).collect(),
            work_budget: budget,
            ..Default::default()
        };
        plan_with_work(&Root::open(root).unwrap(), &options)
    }

    #[test]
    fn every_name_of_one_file_reuses_one_reading() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        put(r, "/usr/lib/libfoo.so.1.2.3", &so("libfoo.so.1"));
        let dir = r.join("usr/lib");
        symlink("libfoo.so.1.2.3", dir.join("libfoo.so")).unwrap();
        for i in 0..40 {
            symlink("libfoo.so.1.2.3", dir.join(format!("libfoo.so.1.2.3.link{i}"))).unwrap();
            fs::hard_link(dir.join("libfoo.so.1.2.3"), dir.join(format!("libfoo.so.1.2.3.hard{i}"))).unwrap();
        }
        let (u, work) = plan_counted(r, &[], DEFAULT_WORK_BUDGET).unwrap();
        assert_eq!(keys(&u), ["libfoo.so.1 /usr/lib/libfoo.so.1", "libfoo.so /usr/lib/libfoo.so"]);
        assert_eq!(work.files_inspected, 1, "{work}");
        // Each name is still opened: 82 names, and the directories' and link's stats.
        assert!(work.paths_resolved >= 82, "{work}");
    }

    /// Issue 32: the bomb (16,383 `DT_NEEDED` naming one 4,095-byte string), links to it, and no
    /// ld.so.cache in the image, so the hook's incremental plan scans everything. It used to cost
    /// about 5 s of CPU per name.
    #[test]
    fn the_issue_bomb_and_its_links_cost_one_bounded_reading() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        let lib = r.join("usr/lib/x86_64-linux-gnu");
        put(r, "/usr/lib/x86_64-linux-gnu/libbomb.so", &synth_elf::needed_bomb(16_383, 4_095, None));
        // Within the entry limit, with a SONAME: a library, read once.
        let near = synth_elf::needed_bomb(elf::MAX_DYNAMIC_ENTRIES - 3, 4_095, Some("libnear.so.1"));
        put(r, "/usr/lib/x86_64-linux-gnu/libnear.so.1.0", &near);
        for i in 0..100 {
            symlink("libbomb.so", lib.join(format!("libbomb.so.{i}"))).unwrap();
            symlink("libnear.so.1.0", lib.join(format!("libnear.so.1.0.{i}"))).unwrap();
        }
        let injected = inject_driver(r);
        let options = Options {
            extra_dirs: vec!["/usr/lib/x86_64-linux-gnu".into(), "/usr/lib/nvidia".into()],
            ..Default::default()
        };
        let (u, work) = plan_incremental_with_work(&Root::open(r).unwrap(), &options, &injected).unwrap();
        let found = keys(&u);
        assert!(
            found.contains(&"libnear.so.1 /usr/lib/x86_64-linux-gnu/libnear.so.1".to_owned()),
            "{found:?}"
        );
        assert!(found.iter().all(|k| !k.contains("bomb")), "{found:?}");
        // The two of them and the three driver libraries, each read once; the two large ones
        // cost their dynamic arrays and one window of their name each.
        assert_eq!(work.files_inspected, 5, "{work}");
        let per_bomb =
            64 + 2 * 56 + elf::MAX_DYNAMIC_ENTRIES as u64 * 16 + 3 * 256 + elf::MAX_NAME as u64 + 1;
        assert!(work.bytes_read <= 2 * per_bomb + 3 * 1024, "{work}");
        assert!(work.units() < DEFAULT_WORK_BUDGET / 1000, "{work}");
    }

    /// An image that is all libraries: `n` distinct small ones in `dir`.
    fn many_libraries(root: &Path, dir: &str, n: usize) {
        for i in 0..n {
            put(root, &format!("{dir}/libmany{i}.so.1"), &so(&format!("libmany{i}.so.1")));
        }
    }

    #[test]
    fn the_work_budget_ends_the_scan_naming_the_folder_and_what_to_do() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        many_libraries(r, "/usr/lib/nvidia", 50);
        let (_, work) = plan_counted(r, &["/usr/lib/nvidia"], DEFAULT_WORK_BUDGET).unwrap();
        assert_eq!(work.files_inspected, 50);
        let budget = work.units() / 2;
        let e = plan_counted(r, &["/usr/lib/nvidia"], budget).unwrap_err();
        let LdCacheError::WorkBudget { dir, budget: b, work: spent } = &e else { panic!("{e}") };
        assert_eq!((dir.as_str(), *b), ("/usr/lib/nvidia", budget));
        // Stopped within one name's work of the budget.
        let one_name = PATH_UNITS * 2 + READ_UNITS * 8 + 8 * 1024;
        assert!(spent.units() > budget && spent.units() <= budget + one_name, "{spent}");
        let message = e.to_string();
        for part in
            ["scanning /usr/lib/nvidia", &format!("budget of {budget} units"), "ld.so.cache", "ldconfig"]
        {
            assert!(message.contains(part), "{part:?} in {message}");
        }
    }

    #[test]
    fn files_each_just_under_the_reader_limits_spend_the_budget_not_more() {
        // The next attack: every file as costly as the reader allows (distinct 4 KB names, each
        // its own window), all distinct files. Each stays within the per-file byte limit; the
        // budget bounds how many are read.
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        let heavy = synth_elf::distinct_long_names(50, elf::MAX_NAME - 1);
        for i in 0..20 {
            put(r, &format!("/opt/heavy/libheavy{i}.so"), &heavy);
        }
        let (_, work) = plan_counted(r, &["/opt/heavy"], DEFAULT_WORK_BUDGET).unwrap();
        assert_eq!(work.files_inspected, 20);
        let per_file = work.bytes_read / 20;
        assert!(per_file > elf::MAX_FILE_BYTES / 2 && per_file <= elf::MAX_FILE_BYTES, "{work}");
        let budget = 5 * per_file;
        let Err(LdCacheError::WorkBudget { work: spent, .. }) = plan_counted(r, &["/opt/heavy"], budget)
        else {
            panic!("the budget holds")
        };
        assert!(spent.files_inspected <= 5 && spent.units() <= budget + per_file + 1_000_000, "{spent}");
    }

    #[test]
    fn names_in_glibc_hwcaps_folders_count_against_the_budget() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        put(r, "/usr/lib/libin.so.1", &so("libin.so.1"));
        let hwcaps = r.join("usr/lib/glibc-hwcaps");
        fs::create_dir_all(&hwcaps).unwrap();
        for i in 0..200 {
            symlink("/nowhere", hwcaps.join(format!("x86-64-v{i}"))).unwrap();
        }
        let (u, work) = plan_counted(r, &[], DEFAULT_WORK_BUDGET).unwrap();
        assert_eq!(keys(&u), ["libin.so.1 /usr/lib/libin.so.1"]);
        assert!(work.names_listed >= 200 && work.paths_resolved >= 200, "{work}");
        let e = plan_counted(r, &[], 100 * PATH_UNITS).unwrap_err();
        assert!(matches!(&e, LdCacheError::WorkBudget { dir, .. } if dir == "/usr/lib/glibc-hwcaps"), "{e}");
    }
}
