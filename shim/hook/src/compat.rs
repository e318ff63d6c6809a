//! CUDA forward compatibility: NVIDIA's `enable-cuda-compat` hook, with its semantics
//! (nvidia-container-toolkit v1.18-v1.20, `cmd/nvidia-cdi-hook/cudacompat`).
//!
//! An image built for a newer CUDA than the host driver supports ships the newer driver's user-space
//! libraries in `/usr/local/cuda/compat` (`libcuda.so.<version>` and friends). When they are newer
//! than the host's driver, they must be what the container's loader finds first; when they are not,
//! the host's. NVIDIA decides with one file, the only regular (not symlink) file in that folder
//! matching `libcuda.so.*.*`, no decision (no-op) when there are none or several:
//! - with its ELF note `.note.cuda.fwd_compatibility` (owner `NVIDIA Corporation`, a JSON
//!   description listing the driver branches it supports as `Driver`): used when the host driver's
//!   major version is listed and the compat version is greater than the host's, comparing the whole
//!   version (`560.35.03 > 560.28.03`). Given only the host's CUDA version, the note's
//!   `CUDA Version` must be greater;
//! - without a note: used when the compat major version is greater than the host's (`560 > 550`;
//!   `550.90.07` on a `550.54.15` host is not used).
//!
//! NVIDIA's hook then writes `/etc/ld.so.conf.d/00-compat-<uuid>.conf` naming the folder, which its
//! ldconfig run (update-ldcache, next) scans before its own `00-nvcr-*.conf` of driver folders. Ours
//! writes [`COMPAT_DROPIN`] (kept for an `ldconfig` the container runs later) and hands the folder
//! to the cache writer as a first folder ([`nvinject_ldcache::Options::first_dirs`]): scanned
//! before the injected driver, so its entries lead and the loader takes them.
//!
//! Everything here is the image's: the folder is resolved inside the root (a symlink in it leads
//! at most to another folder of the image, and the resolved path is what is recorded), only regular
//! files are read, through [`Root`], and at most [`MAX_NOTE_BYTES`] of a note.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nvinject_fsio::root::{EntryType, Root};

use crate::HookError;

/// Where NVIDIA's hook looks by default (`--cuda-compat-container-root`).
pub const COMPAT_DIR: &str = "/usr/local/cuda/compat";
/// The ld.so.conf.d drop-in naming the compat folder. Sorts before [`crate::LDCONF_DROPIN`] and
/// the distribution's own files, as NVIDIA's `00-compat-*.conf` does.
pub const COMPAT_DROPIN: &str = "/etc/ld.so.conf.d/00-compat-nvinject.conf";
/// The most bytes of the ELF note read.
pub const MAX_NOTE_BYTES: u64 = 64 << 10;
const NOTE_SECTION: &str = ".note.cuda.fwd_compatibility";
const NOTE_OWNER: &str = "NVIDIA Corporation";

/// What `enable-cuda-compat` is given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompatArgs {
    /// `--host-driver-version`.
    pub host_driver_version: Option<String>,
    /// `--host-cuda-version`.
    pub host_cuda_version: Option<String>,
    /// `--cuda-compat-container-root` (default [`COMPAT_DIR`]).
    pub container_root: Option<PathBuf>,
}

/// A driver or CUDA version: up to three numeric parts (missing ones are 0), compared part by
/// part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u64, pub u64, pub u64);

impl Version {
    /// Parses `550.54.15`, `560`, `12.6`, `v12.6.1`: one to three dot-separated decimal numbers,
    /// as the semver parser NVIDIA's hook uses reads a driver version (leading zeros allowed).
    /// Anything else (`560.35.03.01`, `560.x`, `""`, a prerelease suffix) is `None`.
    pub fn parse(s: &str) -> Option<Version> {
        let s = s.strip_prefix('v').unwrap_or(s);
        let mut parts = [0u64; 3];
        for (n, part) in s.split('.').enumerate() {
            if n == 3 || part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            parts[n] = part.parse().ok()?;
        }
        Some(Version(parts[0], parts[1], parts[2]))
    }

    /// The major version.
    pub fn major(self) -> u64 {
        self.0
    }
}

/// What the compat library's ELF note says (the part the decision uses).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
pub struct CompatNote {
    /// Driver branches (major versions) these compat libraries support.
    #[serde(rename = "Driver", default)]
    pub driver: Vec<i64>,
    /// The CUDA version they provide.
    #[serde(rename = "CUDA Version", default)]
    pub cuda_version: String,
}

/// The version in a compat library's file name: `560.35.03` for `libcuda.so.560.35.03`; `None`
/// for names NVIDIA's `libcuda.so.*.*` does not match (`libcuda.so.1`, `libcuda.so`).
pub fn compat_file_version(name: &str) -> Option<&str> {
    name.strip_prefix("libcuda.so.").filter(|rest| rest.contains('.'))
}

/// Whether compat libraries of `compat_version` (from the file name) are to be used on a host
/// with these versions: NVIDIA's decision (module documentation). Pure.
pub fn use_compat(
    compat_version: &str,
    host_driver: Option<&str>,
    host_cuda: Option<&str>,
    note: Option<&CompatNote>,
) -> bool {
    let compat = Version::parse(compat_version);
    let host = host_driver.and_then(Version::parse);
    let cuda = host_cuda.and_then(Version::parse);
    if let Some(note) = note {
        let (Some(compat), Some(host)) = (compat, host) else {
            return match (cuda, Version::parse(&note.cuda_version)) {
                (Some(host_cuda), Some(image_cuda)) => image_cuda > host_cuda,
                _ => false,
            };
        };
        return note.driver.iter().any(|&d| u64::try_from(d).ok() == Some(host.major())) && compat > host;
    }
    // Without a note, a host CUDA version alone decides nothing.
    if host_cuda.is_some_and(|c| !c.is_empty()) {
        return false;
    }
    matches!((compat, host), (Some(compat), Some(host)) if compat.major() > host.major())
}

/// Why the compat folder is or is not used (logged with the decision).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Use this folder (absolute inside the root, symlinks resolved) first.
    Use {
        /// The folder.
        dir: PathBuf,
        /// The library that decided.
        library: String,
    },
    /// Not used, for this reason.
    Skip(String),
}

/// Decides for the container root: finds the one compat library, reads its note, compares.
pub fn decide(root: &Root, args: &CompatArgs) -> Result<Decision, HookError> {
    let skip = |why: String| Ok(Decision::Skip(why));
    let host_driver = args.host_driver_version.as_deref().filter(|v| !v.is_empty());
    let host_cuda = args.host_cuda_version.as_deref().filter(|v| !v.is_empty());
    if host_driver.is_none() && host_cuda.is_none() {
        return skip("no host driver or CUDA version given".into());
    }
    let wanted = args.container_root.as_deref().unwrap_or(Path::new(COMPAT_DIR));
    if !wanted.is_absolute() {
        return Err(HookError::BadCompatRoot(wanted.display().to_string()));
    }
    if !root.dir_exists(wanted) {
        return skip(format!("{} is not a directory in the image", wanted.display()));
    }
    let dir = root.canonicalize(wanted)?;
    let candidates: Vec<String> = root
        .read_dir(&dir)?
        .into_iter()
        .filter(|(_, ty)| *ty == EntryType::File)
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| compat_file_version(name).is_some())
        .collect();
    let library = match candidates.as_slice() {
        [] => return skip(format!("no libcuda.so.*.* file in {}", dir.display())),
        [one] => one.clone(),
        several => return skip(format!("several compat libraries in {}: {several:?}", dir.display())),
    };
    let path = dir.join(&library);
    let (file, meta) = root.open_regular(&path)?;
    let note = read_note(&file, meta.len());
    let version = compat_file_version(&library).expect("filtered above");
    if use_compat(version, host_driver, host_cuda, note.as_ref()) {
        Ok(Decision::Use { dir, library })
    } else {
        skip(format!(
            "{} is not newer than the host driver {} (ELF note: {})",
            path.display(),
            host_driver.or(host_cuda).unwrap_or(""),
            if note.is_some() { "read" } else { "none" }
        ))
    }
}

/// Decides, logs, and keeps [`COMPAT_DROPIN`] in step: written naming the folder when used,
/// removed when not (so a drop-in the image shipped under that name is not taken as a decision).
/// Returns the folder to scan first.
pub fn enable(root: &Root, args: &CompatArgs) -> Result<Option<PathBuf>, HookError> {
    match decide(root, args)? {
        Decision::Use { dir, library } => {
            tracing::info!(compat_dir = %dir.display(), library, "CUDA compat libraries take precedence");
            root.mkdir_all(Path::new("/etc/ld.so.conf.d"), 0o755)?;
            let text = format!(
                "# Written by nvinject-hook: CUDA forward-compatibility libraries newer than the host driver.\n{}\n",
                dir.display()
            );
            root.write_file(Path::new(COMPAT_DROPIN), text.as_bytes(), 0o644)?;
            Ok(Some(dir))
        }
        Decision::Skip(why) => {
            tracing::debug!(why, "CUDA compat libraries not used");
            // Whatever the image put under that name (a directory, say) does not fail the start:
            // a later update-ldcache run reads only a regular file there.
            match root.remove_file(Path::new(COMPAT_DROPIN)) {
                Ok(true) => {
                    tracing::warn!(
                        file = COMPAT_DROPIN,
                        "removed a compat drop-in this run did not decide on"
                    )
                }
                Ok(false) => {}
                Err(error) => tracing::warn!(file = COMPAT_DROPIN, %error, "left the image's file in place"),
            }
            Ok(None)
        }
    }
}

/// The folders [`COMPAT_DROPIN`] names, for an `update-ldcache` run after a separate
/// `enable-cuda-compat` run: absolute lines only, at most a few.
pub fn folders_from_dropin(root: &Root) -> Result<Vec<PathBuf>, HookError> {
    let bytes = match root.read_optional(Path::new(COMPAT_DROPIN), 4096) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Ok(Vec::new()),
        Err(error) => {
            // Not a regular file of a few lines: not one enable-cuda-compat wrote.
            tracing::warn!(file = COMPAT_DROPIN, %error, "compat drop-in ignored");
            return Ok(Vec::new());
        }
    };
    Ok(String::from_utf8_lossy(&bytes)
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('/'))
        .take(4)
        .map(PathBuf::from)
        .collect())
}

/// Reads `.note.cuda.fwd_compatibility` from a little-endian ELF64 file of `len` bytes; `None`
/// when there is none or anything about it is malformed (then the major-version rule decides, as
/// in NVIDIA's hook).
pub fn read_note(file: &File, len: u64) -> Option<CompatNote> {
    let at = |offset: u64, size: usize| -> Option<Vec<u8>> {
        if offset.checked_add(size as u64)? > len {
            return None;
        }
        let mut buf = vec![0; size];
        file.read_exact_at(&mut buf, offset).ok()?;
        Some(buf)
    };
    parse_note(&|offset, size| at(offset, size))
}

fn le16(b: &[u8], i: usize) -> u64 {
    u64::from(u16::from_le_bytes([b[i], b[i + 1]]))
}
fn le32(b: &[u8], i: usize) -> u64 {
    u64::from(u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes")))
}
fn le64(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

/// [`read_note`] over any byte source (`read(offset, size)`).
fn parse_note(read: &dyn Fn(u64, usize) -> Option<Vec<u8>>) -> Option<CompatNote> {
    const SHT_NOTE: u64 = 7;
    let ehdr = read(0, 64)?;
    // ELF64, little-endian: the only builds of libcuda (x86_64, aarch64).
    if &ehdr[..4] != b"\x7fELF" || ehdr[4] != 2 || ehdr[5] != 1 {
        return None;
    }
    let (shoff, shentsize, shnum, shstrndx) =
        (le64(&ehdr, 0x28), le16(&ehdr, 0x3a), le16(&ehdr, 0x3c), le16(&ehdr, 0x3e));
    if shentsize != 64 || shnum == 0 || shstrndx >= shnum {
        return None;
    }
    let section = |i: u64| read(shoff.checked_add(i.checked_mul(64)?)?, 64);
    let strtab = section(shstrndx)?;
    let (str_off, str_size) = (le64(&strtab, 0x18), le64(&strtab, 0x20).min(MAX_NOTE_BYTES));
    let names = read(str_off, usize::try_from(str_size).ok()?)?;
    for i in 0..shnum {
        let sh = section(i)?;
        let name_at = usize::try_from(le32(&sh, 0)).ok()?;
        let name = names.get(name_at..)?.split(|&b| b == 0).next()?;
        if le32(&sh, 4) != SHT_NOTE || name != NOTE_SECTION.as_bytes() {
            continue;
        }
        let (offset, size, align) = (le64(&sh, 0x18), le64(&sh, 0x20), le64(&sh, 0x30).max(1));
        if !(12..=MAX_NOTE_BYTES).contains(&size) || !align.is_power_of_two() {
            return None;
        }
        let data = read(offset, size as usize)?;
        let (namesz, descsz) = (le32(&data, 0), le32(&data, 4));
        if namesz == 0 || descsz == 0 {
            return None;
        }
        let round = |n: u64| n.checked_add(align - 1).map(|v| v & !(align - 1));
        let name_end = 12usize.checked_add(usize::try_from(namesz).ok()?)?.min(data.len());
        let owner = String::from_utf8_lossy(&data[12..name_end]);
        if owner.trim_matches('\0') != NOTE_OWNER {
            return None;
        }
        let desc_start = 12usize.checked_add(usize::try_from(round(namesz)?).ok()?)?;
        let desc_end = desc_start.checked_add(usize::try_from(descsz).ok()?)?.min(data.len());
        let desc = data.get(desc_start..desc_end)?;
        let desc: Vec<u8> = desc.iter().copied().filter(|&b| b != 0).collect();
        return serde_json::from_slice(&desc).ok();
    }
    None
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn versions_parse_as_nvidias_semver_reads_driver_versions() {
        assert_eq!(Version::parse("550.54.15"), Some(Version(550, 54, 15)));
        assert_eq!(Version::parse("560.35.03"), Some(Version(560, 35, 3)));
        assert_eq!(Version::parse("560"), Some(Version(560, 0, 0)));
        assert_eq!(Version::parse("v12.6"), Some(Version(12, 6, 0)));
        for bad in ["", ".", "560.", ".560", "560.35.03.01", "560.x", "560.35-beta", " 560", "abc", "5 60"] {
            assert_eq!(Version::parse(bad), None, "{bad:?}");
        }
        assert!(Version(560, 35, 3) > Version(560, 28, 3));
        assert!(Version(550, 100, 0) > Version(550, 54, 15), "numeric, not text, order");
    }

    #[test]
    fn file_names_match_as_nvidias_glob_does() {
        assert_eq!(compat_file_version("libcuda.so.560.35.03"), Some("560.35.03"));
        assert_eq!(compat_file_version("libcuda.so.560.x"), Some("560.x"), "matched, then unparsable");
        for no in ["libcuda.so.1", "libcuda.so", "libcuda.so.", "libcudart.so.12.6", "xlibcuda.so.560.35"] {
            assert_eq!(compat_file_version(no), None, "{no}");
        }
    }

    #[test]
    fn without_a_note_the_major_version_decides() {
        let host = Some("550.54.15");
        assert!(use_compat("560.35.03", host, None, None));
        assert!(!use_compat("550.90.07", host, None, None), "same major, newer: not used");
        assert!(!use_compat("550.54.15", host, None, None), "equal");
        assert!(!use_compat("535.183.01", host, None, None), "older");
        assert!(!use_compat("560.x", host, None, None), "unparsable compat version");
        assert!(!use_compat("560.35.03", Some("garbage"), None, None), "unparsable host version");
        assert!(!use_compat("560.35.03", None, None, None));
        assert!(!use_compat("560.35.03", None, Some("12.4"), None), "a CUDA version needs the note");
        assert!(!use_compat("560.35.03", host, Some("12.4"), None));
    }

    #[test]
    fn with_a_note_the_host_branch_must_be_listed_and_the_whole_version_newer() {
        let note = CompatNote { driver: vec![535, 550, 560], cuda_version: "12.6".into() };
        assert!(use_compat("560.35.03", Some("550.54.15"), None, Some(&note)));
        assert!(use_compat("560.35.03", Some("560.28.03"), None, Some(&note)), "same branch, newer");
        assert!(!use_compat("560.35.03", Some("560.35.03"), None, Some(&note)), "equal");
        assert!(!use_compat("560.35.03", Some("565.57.01"), None, Some(&note)), "newer host");
        assert!(!use_compat("560.35.03", Some("470.256.02"), None, Some(&note)), "branch not listed");
        assert!(!use_compat("560.35.03", Some("x"), None, Some(&note)));
        // Only the host CUDA version: the note's CUDA version must be greater.
        assert!(use_compat("560.35.03", None, Some("12.4"), Some(&note)));
        assert!(!use_compat("560.35.03", None, Some("12.6"), Some(&note)));
        assert!(!use_compat("560.35.03", None, Some("12.8"), Some(&note)));
        let no_cuda = CompatNote { driver: vec![550], cuda_version: String::new() };
        assert!(!use_compat("560.35.03", None, Some("12.4"), Some(&no_cuda)));
    }

    /// A little-endian ELF64 with one section named `section` of type `sh_type` holding a note
    /// (`owner`, `desc`), plus the section-name table.
    pub(crate) fn elf_with_note(section: &str, sh_type: u32, owner: &str, desc: &[u8]) -> Vec<u8> {
        let align4 = |n: usize| (n + 3) & !3;
        let mut note = Vec::new();
        note.extend((owner.len() as u32 + 1).to_le_bytes());
        note.extend((desc.len() as u32).to_le_bytes());
        note.extend(1u32.to_le_bytes());
        note.extend(owner.as_bytes());
        note.push(0);
        note.resize(align4(note.len()), 0);
        note.extend(desc);
        note.resize(align4(note.len()), 0);
        let names = format!("\0{section}\0.shstrtab\0").into_bytes();
        let note_off = 64;
        let names_off = note_off + note.len();
        let shoff = align4(names_off + names.len()) + 4;
        let mut f = vec![0u8; shoff];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 2;
        f[5] = 1;
        f[6] = 1;
        f[0x10..0x12].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
        f[0x12..0x14].copy_from_slice(&62u16.to_le_bytes());
        f[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        f[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        f[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        f[0x3e..0x40].copy_from_slice(&2u16.to_le_bytes());
        f[note_off..note_off + note.len()].copy_from_slice(&note);
        f[names_off..names_off + names.len()].copy_from_slice(&names);
        let sh = |name: u32, ty: u32, off: usize, size: usize, align: u64| {
            let mut s = vec![0u8; 64];
            s[0..4].copy_from_slice(&name.to_le_bytes());
            s[4..8].copy_from_slice(&ty.to_le_bytes());
            s[0x18..0x20].copy_from_slice(&(off as u64).to_le_bytes());
            s[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
            s[0x30..0x38].copy_from_slice(&align.to_le_bytes());
            s
        };
        f.extend(vec![0u8; 64]); // SHN_UNDEF
        f.extend(sh(1, sh_type, note_off, note.len(), 4));
        f.extend(sh(section.len() as u32 + 2, 3, names_off, names.len(), 1));
        f
    }

    fn note_of(bytes: &[u8]) -> Option<CompatNote> {
        let read = |offset: u64, size: usize| {
            let start = usize::try_from(offset).ok()?;
            bytes.get(start..start.checked_add(size)?).map(<[u8]>::to_vec)
        };
        parse_note(&read)
    }

    #[test]
    fn the_note_is_read_and_anything_malformed_is_no_note() {
        let desc = br#"{"Format":1,"CUDA Version":"12.6","Driver":[535,550,560],"Device":[]}"#;
        let elf = elf_with_note(NOTE_SECTION, 7, NOTE_OWNER, desc);
        assert_eq!(
            note_of(&elf),
            Some(CompatNote { driver: vec![535, 550, 560], cuda_version: "12.6".into() })
        );
        assert_eq!(note_of(&elf_with_note(NOTE_SECTION, 7, "Someone Else", desc)), None, "owner");
        assert_eq!(note_of(&elf_with_note(".note.other", 7, NOTE_OWNER, desc)), None, "section name");
        assert_eq!(note_of(&elf_with_note(NOTE_SECTION, 1, NOTE_OWNER, desc)), None, "not SHT_NOTE");
        assert_eq!(note_of(&elf_with_note(NOTE_SECTION, 7, NOTE_OWNER, b"{not json")), None);
        // Truncated anywhere, or section offsets pointing past the end: no note, no panic.
        for cut in [0, 10, 64, 100, elf.len() - 1] {
            assert_eq!(note_of(&elf[..cut]), None, "cut at {cut}");
        }
        let mut far = elf.clone();
        far[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(note_of(&far), None);
        let mut huge = elf.clone();
        let shoff = u64::from_le_bytes(elf[0x28..0x30].try_into().unwrap()) as usize;
        huge[shoff + 64 + 0x20..shoff + 64 + 0x28].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(note_of(&huge), None, "a note size past the limit");
    }

    fn lib(soname: &str) -> Vec<u8> {
        let machine = nvinject_simnode::elf::Machine::host().expect("a supported host");
        nvinject_simnode::elf::shared_object(machine, soname)
    }

    fn put(root: &Path, path: &str, bytes: &[u8]) {
        let p = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }

    fn args(host: &str) -> CompatArgs {
        CompatArgs { host_driver_version: Some(host.into()), ..Default::default() }
    }

    #[test]
    fn the_one_regular_compat_library_decides_inside_the_root() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        let root = Root::open(r).unwrap();
        let skipped = |a: &CompatArgs| matches!(decide(&root, a).unwrap(), Decision::Skip(_));
        assert!(skipped(&args("550.54.15")), "no compat folder");
        // The usual CUDA image: /usr/local/cuda -> cuda-12.6, the compat library with its links.
        put(r, "/usr/local/cuda-12.6/compat/libcuda.so.560.35.03", &lib("libcuda.so.1"));
        std::os::unix::fs::symlink("libcuda.so.560.35.03", r.join("usr/local/cuda-12.6/compat/libcuda.so.1"))
            .unwrap();
        std::os::unix::fs::symlink("cuda-12.6", r.join("usr/local/cuda")).unwrap();
        let used = Decision::Use {
            dir: "/usr/local/cuda-12.6/compat".into(),
            library: "libcuda.so.560.35.03".into(),
        };
        assert_eq!(decide(&root, &args("550.54.15")).unwrap(), used, "the resolved folder is recorded");
        assert!(skipped(&args("560.28.03")), "same major");
        assert!(skipped(&args("560.35.03")), "equal");
        assert!(skipped(&args("570.86.10")), "older than the host");
        assert!(skipped(&CompatArgs::default()), "no host version");
        // A symlink named like a versioned library is not a candidate (NVIDIA's glob takes regular
        // files only), so it neither counts nor decides.
        std::os::unix::fs::symlink(
            "libcuda.so.560.35.03",
            r.join("usr/local/cuda-12.6/compat/libcuda.so.999.1"),
        )
        .unwrap();
        assert_eq!(decide(&root, &args("550.54.15")).unwrap(), used);
        // Two regular candidates: NVIDIA makes no choice, nor do we.
        put(r, "/usr/local/cuda-12.6/compat/libcuda.so.565.57.01", &lib("libcuda.so.1"));
        assert!(skipped(&args("550.54.15")));
        std::fs::remove_file(r.join("usr/local/cuda-12.6/compat/libcuda.so.565.57.01")).unwrap();
        // A malformed version in the one candidate: not used.
        std::fs::rename(
            r.join("usr/local/cuda-12.6/compat/libcuda.so.560.35.03"),
            r.join("usr/local/cuda-12.6/compat/libcuda.so.560.x"),
        )
        .unwrap();
        assert!(skipped(&args("550.54.15")));
        // --cuda-compat-container-root must be absolute.
        let relative =
            CompatArgs { container_root: Some("usr/local/cuda/compat".into()), ..args("550.54.15") };
        assert!(matches!(decide(&root, &relative), Err(HookError::BadCompatRoot(_))));
    }

    #[test]
    fn links_in_the_image_pointing_outside_stay_inside_the_root() {
        // The compat folder is an absolute link to a host path that really holds a newer
        // library: resolution inside the root finds nothing there, and nothing on the host is read.
        let host = tempfile::tempdir().unwrap();
        put(host.path(), "/compat/libcuda.so.999.1.1", &lib("libcuda.so.1"));
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        std::fs::create_dir_all(r.join("usr/local/cuda")).unwrap();
        std::os::unix::fs::symlink(host.path().join("compat"), r.join("usr/local/cuda/compat")).unwrap();
        let root = Root::open(r).unwrap();
        assert!(matches!(decide(&root, &args("550.54.15")).unwrap(), Decision::Skip(_)));
        // `..` climbs stop at the root too.
        std::fs::remove_file(r.join("usr/local/cuda/compat")).unwrap();
        let ups = "../".repeat(40) + host.path().join("compat").to_str().unwrap().trim_start_matches('/');
        std::os::unix::fs::symlink(&ups, r.join("usr/local/cuda/compat")).unwrap();
        assert!(matches!(decide(&root, &args("550.54.15")).unwrap(), Decision::Skip(_)));
        // A candidate that is a link to a host file is not a regular file: not read.
        std::fs::remove_file(r.join("usr/local/cuda/compat")).unwrap();
        std::fs::create_dir_all(r.join("usr/local/cuda/compat")).unwrap();
        std::os::unix::fs::symlink(
            host.path().join("compat/libcuda.so.999.1.1"),
            r.join("usr/local/cuda/compat/libcuda.so.999.1.1"),
        )
        .unwrap();
        assert!(matches!(decide(&root, &args("550.54.15")).unwrap(), Decision::Skip(_)));
        // A FIFO under the name: not a regular file either, and nothing blocks.
        let fifo = r.join("usr/local/cuda/compat/libcuda.so.998.1.1");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        assert!(matches!(decide(&root, &args("550.54.15")).unwrap(), Decision::Skip(_)));
    }

    #[test]
    fn enable_keeps_the_dropin_in_step_with_the_decision() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        put(r, "/usr/local/cuda/compat/libcuda.so.560.35.03", &lib("libcuda.so.1"));
        let root = Root::open(r).unwrap();
        assert_eq!(enable(&root, &args("550.54.15")).unwrap(), Some(PathBuf::from("/usr/local/cuda/compat")));
        let text = std::fs::read_to_string(r.join(COMPAT_DROPIN.trim_start_matches('/'))).unwrap();
        assert!(text.lines().any(|l| l == "/usr/local/cuda/compat"), "{text}");
        assert_eq!(folders_from_dropin(&root).unwrap(), [PathBuf::from("/usr/local/cuda/compat")]);
        // A newer host: the drop-in (ours, or one the image shipped under our name) goes.
        assert_eq!(enable(&root, &args("565.57.01")).unwrap(), None);
        assert!(!r.join(COMPAT_DROPIN.trim_start_matches('/')).exists());
        assert!(folders_from_dropin(&root).unwrap().is_empty());
        // The note overrides the major rule: a branch it does not list keeps the host's.
        let desc = br#"{"CUDA Version":"12.6","Driver":[560]}"#;
        put(
            r,
            "/usr/local/cuda/compat/libcuda.so.560.35.03",
            &elf_with_note(NOTE_SECTION, 7, NOTE_OWNER, desc),
        );
        assert_eq!(enable(&root, &args("550.54.15")).unwrap(), None, "550 is not a listed branch");
        assert_eq!(enable(&root, &args("560.28.03")).unwrap(), Some(PathBuf::from("/usr/local/cuda/compat")));
        // A directory or a FIFO under the drop-in's name: no decision read from it, no failure,
        // nothing blocks.
        let dropin = r.join(COMPAT_DROPIN.trim_start_matches('/'));
        std::fs::remove_file(&dropin).unwrap();
        std::fs::create_dir(&dropin).unwrap();
        assert!(folders_from_dropin(&root).unwrap().is_empty());
        assert_eq!(enable(&root, &args("565.57.01")).unwrap(), None);
        std::fs::remove_dir(&dropin).unwrap();
        assert!(std::process::Command::new("mkfifo").arg(&dropin).status().unwrap().success());
        assert!(folders_from_dropin(&root).unwrap().is_empty());
    }
}
