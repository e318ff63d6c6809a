//! What one scan costs, and the budget that bounds it (issue 32).
//!
//! The hook scans the image's library folders as root at every container start, so the image
//! decides how much there is to read. The ELF reader bounds each file ([`crate::elf`]), and each
//! file is read once per run however many names lead to it; what is left is the number of names
//! and files, which the folder and directory limits allow to be large (1,024 folders of 65,536
//! names). [`ScanWork::units`] weighs everything a scan does on one scale, and
//! [`crate::Options::work_budget`] ends a scan that goes past it with
//! [`crate::LdCacheError::WorkBudget`], naming the folder it was in.
//!
//! One unit is about the time of copying one byte out of the page cache. The weights come from
//! `benches/scan_cost.rs` (release build, a two-core shared VM): resolving a path inside the root
//! (`openat2` with its links, `fstat`, `close`) took about 12 us (65,535 links in 0.79 s) and is
//! charged [`PATH_UNITS`]; a `pread` about 1.5 us, [`READ_UNITS`]; listing one directory entry
//! about 0.8 us (65,535 names in 52 ms), [`LISTED_UNITS`]. Every tree measured then ran at 0.2 to
//! 0.45 ns per unit.
//!
//! Real images, full scans (no ld.so.cache; the hook's incremental plan costs less): the Debian
//! bullseye, bookworm and trixie trees of `scripts/make-rootfs.sh` (with libstdc++, libssl and
//! libcurl: 90 to 94 library files, 171 to 196 names) cost 13.7 to 14.6 M units, about 2 ms, or
//! 75,000 units per library name. [`DEFAULT_WORK_BUDGET`], 2^33 (8.6 G) units, is 587 times the
//! largest, which an image would reach with some 115,000 library names in its folders; and it
//! stops the costliest hostile shape measured (links to one file, in folder after folder) after
//! 3.8 s and 229,376 names. Before issue 32 each of those names cost 0.4 to 0.56 s of reading in
//! a release build (4.8 s in a debug one), and folders of them, days.

use std::fmt;

/// What reading one file cost, for the scan's work budget ([`crate::Options::work_budget`]); the ELF reader
/// ([`crate::elf`]) fills it in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileWork {
    /// Reads made (each one `pread`).
    pub reads: u64,
    /// Bytes read, at most [`crate::elf::MAX_FILE_BYTES`].
    pub bytes_read: u64,
    /// Program headers, dynamic entries and name lookups looked at.
    pub entries_examined: u64,
}

/// Units charged per path resolved in the root: an open (`openat2`, `fstat`, `close`, following
/// the links on the way) or a stat.
pub const PATH_UNITS: u64 = 32 << 10;
/// Units charged per read of a file (one `pread`), besides its bytes.
pub const READ_UNITS: u64 = 4 << 10;
/// Units charged per directory entry listed.
pub const LISTED_UNITS: u64 = 4 << 10;
/// The work a scan may do by default: 2^33 (8.6 G) units, 587 times a full scan of a Debian tree
/// (13.7 to 14.6 M units), which a hostile image spends in about 4 s of the hook's time (release
/// build). The measurements: `src/work.rs` and the crate's README.
pub const DEFAULT_WORK_BUDGET: u64 = 1 << 33;

/// What a scan did, counted as it goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanWork {
    /// Directory entries listed in library folders and their glibc-hwcaps subfolders.
    pub names_listed: u64,
    /// Paths resolved inside the root: each candidate library name opened, each stat.
    pub paths_resolved: u64,
    /// Distinct files (device and inode) read by the ELF reader.
    pub files_inspected: u64,
    /// Reads of those files (and of the image's `ld.so.cache`).
    pub reads: u64,
    /// Bytes read from them.
    pub bytes_read: u64,
    /// Program headers, dynamic entries and names the ELF reader looked at.
    pub entries_examined: u64,
}

impl ScanWork {
    /// The work on one scale, as the budget counts it: bytes and entries one unit each, paths
    /// resolved [`PATH_UNITS`], reads [`READ_UNITS`], names listed [`LISTED_UNITS`].
    pub fn units(&self) -> u64 {
        self.bytes_read
            .saturating_add(self.entries_examined)
            .saturating_add(PATH_UNITS.saturating_mul(self.paths_resolved))
            .saturating_add(READ_UNITS.saturating_mul(self.reads))
            .saturating_add(LISTED_UNITS.saturating_mul(self.names_listed))
    }

    /// Adds what reading one file cost.
    pub(crate) fn add_file(&mut self, file: &FileWork) {
        self.files_inspected += 1;
        self.reads += file.reads;
        self.bytes_read += file.bytes_read;
        self.entries_examined += file.entries_examined;
    }
}

impl fmt::Display for ScanWork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} units: {} names listed, {} paths resolved, {} files inspected, {} reads, {} bytes read, \
             {} entries examined",
            self.units(),
            self.names_listed,
            self.paths_resolved,
            self.files_inspected,
            self.reads,
            self.bytes_read,
            self.entries_examined
        )
    }
}
