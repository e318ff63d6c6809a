//! What ldconfig reads from a library file: its cache flags (from the ELF class and machine, and
//! for i386 from its interpreter and `DT_NEEDED`) and its `DT_SONAME`.
//!
//! Mirrors glibc's `process_elf_file` (x86 and aarch64 variants): a file that is not a
//! little-endian ELF shared object for a known machine, or has no dynamic section or string table,
//! is not a library. Every offset comes from the file and is bounds-checked.
//!
//! The hook runs this as root over files the image chose, at every container start (issue 32), so
//! what one file may cost is bounded whatever it says. Each part is read once, into a buffer: the
//! header, the program headers, the dynamic array up to `DT_NULL`, and a window of the file at
//! each distinct name offset (the string table is never read whole: libLLVM's is 3 MB). Where each
//! name ends is found once per window, so a thousand `DT_NEEDED` entries naming one 4 KB string
//! cost one read of it and a thousand lookups, and comparing a name with `libc.so.6` compares
//! lengths (known from the window's NULs) and then at most 9 bytes, never the whole name. A file that would need more than [`MAX_PROGRAM_HEADERS`],
//! [`MAX_DYNAMIC_ENTRIES`] or [`MAX_FILE_BYTES`] is not taken as a library, and
//! [`Inspection::over_limit`] says which limit.
//!
//! The limits against what real libraries have. A `readelf`-like script over 882 distinct
//! library files (296 in the Debian bullseye, bookworm and trixie trees of
//! `scripts/make-rootfs.sh`, with libstdc++, libssl and libcurl; 586 on a Debian 12 development
//! host: `/usr/lib` with libLLVM-15, Mesa and the JDK's, and Rust toolchains' libLLVM) found at
//! most 15 program headers, 46 dynamic entries with `DT_NULL` (816 bytes), 20 `DT_NEEDED`, names
//! of at most 58 bytes, one `PT_INTERP`, and names spread over up to 3.2 MB of string table
//! (libLLVM-15). This reader read at most 3,887 bytes, in 11 reads, of any of the 796 of them it
//! was run on (the host's by `real_libraries_read_as_before`, the trees' and the toolchains' by a
//! one-off run of the same comparison), each giving what the reader before issue 32 gave. The limits are 17, 22 and 67 times those maxima, and leave
//! room for a library with a thousand `DT_NEEDED`.

use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt;

pub use crate::work::FileWork;

use crate::format::{
    FLAG_AARCH64_LIB64, FLAG_ELF, FLAG_ELF_LIBC5, FLAG_ELF_LIBC6, FLAG_X8664_LIB64, FLAG_X8664_LIBX32,
};

/// The reader before issue 32: the reference the tests compare this one with.
#[cfg(test)]
#[path = "../tests/support/elf_before_issue32.rs"]
mod before;

const ET_DYN: u16 = 3;
const EM_386: u16 = 3;
const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
/// `PT_GNU_PROPERTY`: the `NT_GNU_PROPERTY_TYPE_0` note, where x86 objects say which ISA level
/// they need.
const PT_GNU_PROPERTY: u32 = 0x6474_e553;
const NT_GNU_PROPERTY_TYPE_0: u32 = 5;
const GNU_PROPERTY_X86_ISA_1_NEEDED: u32 = 0xc000_8002;
/// Bytes of property notes read at most (real ones are a few dozen).
const MAX_PROPERTY_BYTES: u64 = 4096;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_SONAME: u64 = 14;

/// Program headers a file may have (real libraries: at most 15).
pub const MAX_PROGRAM_HEADERS: usize = 256;
/// Dynamic entries read, `DT_NULL` included (real libraries: at most 46). ldconfig stops reading
/// where it has the SONAME and the C library; an array that needs reading past this many entries
/// makes the file not a library.
pub const MAX_DYNAMIC_ENTRIES: usize = 1024;
/// Bytes read from one file, every part together (real libraries: at most 3,887).
pub const MAX_FILE_BYTES: u64 = 256 << 10;
/// The longest name (SONAME, `DT_NEEDED`, interpreter) read, its NUL not counted: a file with a
/// longer one, or one the file's end cuts, is not a library (as before issue 32; glibc's
/// `check_ptr` would take it).
pub const MAX_NAME: usize = 4096;
/// Bytes read first at each name offset: every real name ends within them (at most 58 bytes
/// measured); the offsets of names that do not are read again, [`MAX_NAME`] + 1 bytes each.
const NAME_WINDOW: u64 = 256;
/// Dynamic array bytes read first when the segment says less (real arrays: 30 to 50 entries, 816
/// bytes at most), then twice as many each time until `DT_NULL`.
const FIRST_DYNAMIC_BYTES: u64 = 1024;

/// `known_libs`: a `DT_NEEDED` on one of these tells an i386 library's C library.
const KNOWN_LIBS: &[(&[u8], i32)] = &[
    (b"libc.so.6", FLAG_ELF_LIBC6),
    (b"libm.so.6", FLAG_ELF_LIBC6),
    (b"libc.so.5", FLAG_ELF_LIBC5),
    (b"libm.so.5", FLAG_ELF_LIBC5),
];
/// `interpreters`: so does the program interpreter.
const INTERPRETERS: &[(&[u8], i32)] = &[
    (b"/lib/ld-linux.so.1", FLAG_ELF_LIBC5),
    (b"/lib/ld-linux.so.2", FLAG_ELF_LIBC6),
    (b"/lib64/ld-linux-x86-64.so.2", FLAG_ELF_LIBC6),
    (b"/libx32/ld-linux-x32.so.2", FLAG_ELF_LIBC6),
];

/// What the cache records of one library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Library {
    /// Cache flags (type and architecture).
    pub flags: i32,
    /// `DT_SONAME`, when the library has one.
    pub soname: Option<String>,
    /// x86 ISA level it needs (`GNU_PROPERTY_X86_ISA_1_NEEDED`: 0 baseline, 1 x86-64-v2, 2 v3,
    /// 3 v4), which ldconfig records for glibc-hwcaps entries; 0 elsewhere.
    pub isa_level: u32,
}

/// A per-file limit of the reader, which a file went past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// More than [`MAX_PROGRAM_HEADERS`] program headers.
    ProgramHeaders,
    /// Entries past [`MAX_DYNAMIC_ENTRIES`] to read: no `DT_NULL` within them, where ldconfig
    /// would read on.
    DynamicEntries,
    /// More than [`MAX_FILE_BYTES`] to read.
    Bytes,
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::ProgramHeaders => write!(f, "more than {MAX_PROGRAM_HEADERS} program headers"),
            Limit::DynamicEntries => write!(f, "more than {MAX_DYNAMIC_ENTRIES} dynamic entries to read"),
            Limit::Bytes => write!(f, "more than {MAX_FILE_BYTES} bytes to read"),
        }
    }
}

/// What [`examine`] made of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    /// The library, or `None` when ldconfig would skip the file or it went past a limit.
    pub library: Option<Library>,
    /// The limit the file went past, if it did (no real library comes near them).
    pub over_limit: Option<Limit>,
    /// What reading it cost.
    pub work: FileWork,
}

/// Random access to a file's bytes.
pub trait ReadAt {
    /// Fills `buf` from `offset`; `None` if the file ends first or the read fails.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Option<()>;
}

impl ReadAt for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Option<()> {
        FileExt::read_exact_at(self, buf, offset).ok()
    }
}

impl ReadAt for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Option<()> {
        let start = usize::try_from(offset).ok()?;
        buf.copy_from_slice(self.get(start..start.checked_add(buf.len())?)?);
        Some(())
    }
}

/// Why reading a file stopped short of a [`Library`].
enum Stop {
    /// ldconfig would skip it.
    NotLibrary,
    /// It went past a limit.
    Over(Limit),
}

type Step<T> = Result<T, Stop>;

/// The bytes of a file from `start` (fewer than asked where the file ends).
struct Buf {
    start: u64,
    bytes: Vec<u8>,
}

impl Buf {
    fn end(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }
    fn slice(&self, at: u64, n: usize) -> Option<&[u8]> {
        let i = usize::try_from(at.checked_sub(self.start)?).ok()?;
        self.bytes.get(i..i.checked_add(n)?)
    }
    fn array<const N: usize>(&self, at: u64) -> Option<[u8; N]> {
        self.slice(at, N)?.try_into().ok()
    }
    fn u16(&self, at: u64) -> Option<u16> {
        self.array(at).map(u16::from_le_bytes)
    }
    fn u32(&self, at: u64) -> Option<u32> {
        self.array(at).map(u32::from_le_bytes)
    }
    fn u64(&self, at: u64) -> Option<u64> {
        self.array(at).map(u64::from_le_bytes)
    }
    /// A word of the file's class (`Elf32_Addr`/`Elf64_Addr`-sized).
    fn word(&self, at: u64, is64: bool) -> Option<u64> {
        if is64 { self.u64(at) } else { self.u32(at).map(u64::from) }
    }
}

/// Reads parts of a file of `len` bytes (as `fstat` said when it was opened: a file that grows
/// meanwhile is read no further), counting what it reads.
struct Reader<'a, R: ReadAt + ?Sized> {
    file: &'a R,
    len: u64,
    work: FileWork,
}

impl<R: ReadAt + ?Sized> Reader<'_, R> {
    /// Bytes `at..at + n`, fewer where the file ends first.
    fn read(&mut self, at: u64, n: u64) -> Step<Buf> {
        let n = n.min(self.len.saturating_sub(at));
        if n == 0 {
            return Ok(Buf { start: at, bytes: Vec::new() });
        }
        if self.work.bytes_read + n > MAX_FILE_BYTES {
            return Err(Stop::Over(Limit::Bytes));
        }
        let mut bytes = vec![0; n as usize];
        self.work.reads += 1;
        self.work.bytes_read += n;
        self.file.read_exact_at(&mut bytes, at).ok_or(Stop::NotLibrary)?;
        Ok(Buf { start: at, bytes })
    }
}

/// Windows of a file at name offsets, each read once, with where its NULs are.
struct Names {
    /// Disjoint, by offset: the first round's windows ([`NAME_WINDOW`] bytes at each offset),
    /// then the second's ([`MAX_NAME`] + 1 bytes at each offset the first left open).
    rounds: [Vec<Window>; 2],
    len: u64,
}

struct Window {
    buf: Buf,
    /// Offsets of the NULs in `buf`, from its start, ascending.
    nuls: Vec<u32>,
}

/// A name's fate in one window.
enum Found {
    /// The name's offsets in the file.
    Name(u64, u64),
    /// No NUL within [`MAX_NAME`] + 1 bytes, or before the file ends.
    Unterminated,
    /// The window ends first.
    Open,
}

impl Window {
    fn find(&self, at: u64, len: u64) -> Found {
        let end = at.saturating_add(MAX_NAME as u64 + 1).min(len);
        let from = at - self.buf.start;
        let k = self.nuls.partition_point(|&n| u64::from(n) < from);
        match self.nuls.get(k) {
            Some(&n) if self.buf.start + u64::from(n) < end => Found::Name(at, self.buf.start + u64::from(n)),
            Some(_) => Found::Unterminated,
            None if self.buf.end() >= end => Found::Unterminated,
            None => Found::Open,
        }
    }
}

impl Names {
    /// Reads the windows for names at `offsets` (sorted, distinct).
    fn load<R: ReadAt + ?Sized>(r: &mut Reader<'_, R>, offsets: &[u64]) -> Step<Names> {
        let first = windows(r, offsets, NAME_WINDOW)?;
        let open: Vec<u64> = offsets
            .iter()
            .copied()
            .filter(|&at| matches!(window_at(&first, at).map(|w| w.find(at, r.len)), Some(Found::Open)))
            .collect();
        let second = windows(r, &open, MAX_NAME as u64 + 1)?;
        Ok(Names { rounds: [first, second], len: r.len })
    }

    /// The name at `at`, a loaded offset; `None` when outside the file or unterminated.
    fn get(&self, at: u64) -> Option<&[u8]> {
        for round in &self.rounds {
            let Some(w) = window_at(round, at) else { continue };
            match w.find(at, self.len) {
                Found::Name(start, end) => return w.buf.slice(start, (end - start) as usize),
                Found::Unterminated => return None,
                Found::Open => continue,
            }
        }
        None
    }
}

fn window_at(windows: &[Window], at: u64) -> Option<&Window> {
    let i = windows.partition_point(|w| w.buf.start <= at).checked_sub(1)?;
    Some(&windows[i]).filter(|w| at < w.buf.end())
}

/// One read per run of overlapping `[at, at + size)` (sorted `offsets`, clipped to the file).
fn windows<R: ReadAt + ?Sized>(r: &mut Reader<'_, R>, offsets: &[u64], size: u64) -> Step<Vec<Window>> {
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for &at in offsets.iter().filter(|&&at| at < r.len) {
        let end = at.saturating_add(size).min(r.len);
        match spans.last_mut() {
            Some(last) if at <= last.1 => last.1 = last.1.max(end),
            _ => spans.push((at, end)),
        }
    }
    let mut out = Vec::with_capacity(spans.len());
    for (start, end) in spans {
        let buf = r.read(start, end - start)?;
        let nuls = buf.bytes.iter().enumerate().filter(|(_, b)| **b == 0).map(|(i, _)| i as u32).collect();
        out.push(Window { buf, nuls });
    }
    Ok(out)
}

/// How the dynamic array read ended.
#[derive(Clone, Copy)]
enum End {
    /// At `DT_NULL`.
    Null,
    /// At the file's end.
    Eof,
    /// At [`MAX_DYNAMIC_ENTRIES`].
    Cap,
}

impl End {
    /// Why a walk that needed entries past the end stops.
    fn stop(self) -> Stop {
        match self {
            End::Null | End::Eof => Stop::NotLibrary,
            End::Cap => Stop::Over(Limit::DynamicEntries),
        }
    }
}

/// The dynamic array at `off` up to `DT_NULL` (not included), in reads of growing size.
fn dynamic_entries<R: ReadAt + ?Sized>(
    r: &mut Reader<'_, R>,
    off: u64,
    size: u64,
    is64: bool,
) -> Step<(Vec<(u64, u64)>, End)> {
    let step: u64 = if is64 { 16 } else { 8 };
    let cap = MAX_DYNAMIC_ENTRIES as u64 * step;
    let mut want = size.min(cap).next_multiple_of(step).clamp(FIRST_DYNAMIC_BYTES, cap);
    let mut entries = Vec::new();
    let mut at = off;
    loop {
        let room = cap - entries.len() as u64 * step;
        if room == 0 {
            return Ok((entries, End::Cap));
        }
        let n = want.min(room);
        let buf = r.read(at, n)?;
        for e in 0..buf.bytes.len() as u64 / step {
            let e = at + e * step;
            // Whole entries of the buffer: always there.
            let (tag, val) = (buf.word(e, is64), buf.word(e + step / 2, is64));
            let (tag, val) = (tag.ok_or(Stop::NotLibrary)?, val.ok_or(Stop::NotLibrary)?);
            r.work.entries_examined += 1;
            if tag == DT_NULL {
                return Ok((entries, End::Null));
            }
            entries.push((tag, val));
        }
        if (buf.bytes.len() as u64) < n {
            return Ok((entries, End::Eof));
        }
        at += n;
        want = n * 2;
    }
}

/// Reads what ldconfig would from a file of `len` bytes; `None` if ldconfig would skip it (or it
/// goes past a limit of this reader: see [`examine`]).
pub fn inspect<R: ReadAt + ?Sized>(file: &R, len: u64) -> Option<Library> {
    examine(file, len).library
}

/// [`inspect`], saying also what reading the file cost and which limit, if any, it went past.
pub fn examine<R: ReadAt + ?Sized>(file: &R, len: u64) -> Inspection {
    let mut r = Reader { file, len, work: FileWork::default() };
    let (library, over_limit) = match read_library(&mut r) {
        Ok(lib) => (Some(lib), None),
        Err(Stop::NotLibrary) => (None, None),
        Err(Stop::Over(limit)) => (None, Some(limit)),
    };
    Inspection { library, over_limit, work: r.work }
}

fn read_library<R: ReadAt + ?Sized>(r: &mut Reader<'_, R>) -> Step<Library> {
    use Stop::NotLibrary;
    // ldconfig skips files smaller than an ELF header.
    if r.len < 64 {
        return Err(NotLibrary);
    }
    let header = r.read(0, 64)?;
    let ident = header.array::<16>(0).ok_or(NotLibrary)?;
    if &ident[..4] != b"\x7fELF" || ident[5] != 1 {
        return Err(NotLibrary);
    }
    let is64 = match ident[4] {
        1 => false,
        2 => true,
        _ => return Err(NotLibrary),
    };
    let h16 = |at| header.u16(at).ok_or(NotLibrary);
    if h16(16)? != ET_DYN {
        return Err(NotLibrary);
    }
    let machine = h16(18)?;
    let file_flag = match (machine, is64) {
        (EM_X86_64, true) => Some(FLAG_X8664_LIB64 | FLAG_ELF_LIBC6),
        (EM_X86_64, false) => Some(FLAG_X8664_LIBX32 | FLAG_ELF_LIBC6),
        (EM_AARCH64, true) => Some(FLAG_AARCH64_LIB64 | FLAG_ELF_LIBC6),
        (EM_386, false) => None,
        _ => return Err(NotLibrary),
    };
    let (phoff, phnum, phsize) = if is64 {
        (header.u64(32).ok_or(NotLibrary)?, h16(56)?, 56u64)
    } else {
        (u64::from(header.u32(28).ok_or(NotLibrary)?), h16(44)?, 32u64)
    };
    if usize::from(phnum) > MAX_PROGRAM_HEADERS {
        return Err(Stop::Over(Limit::ProgramHeaders));
    }
    let phdrs = r.read(phoff, u64::from(phnum) * phsize)?;
    let mut loadaddr: Option<u64> = None;
    let mut dynamic: Option<(u64, u64)> = None;
    let mut property: Option<(u64, u64, u64)> = None;
    let mut interpreters = Vec::new();
    for i in 0..u64::from(phnum) {
        r.work.entries_examined += 1;
        let ph = phoff.checked_add(i * phsize).ok_or(NotLibrary)?;
        let u32_at = |at: u64| phdrs.u32(at).ok_or(NotLibrary);
        let word = |at: u64| phdrs.word(at, is64).ok_or(NotLibrary);
        let p_type = u32_at(ph)?;
        let (offset, vaddr, filesz) = if is64 {
            (word(ph + 8)?, word(ph + 16)?, word(ph + 32)?)
        } else {
            (word(ph + 4)?, word(ph + 8)?, word(ph + 16)?)
        };
        match p_type {
            PT_LOAD if loadaddr.is_none() => loadaddr = Some(vaddr.wrapping_sub(offset)),
            PT_DYNAMIC => dynamic = Some((offset, filesz)),
            // Each one sets the level; the last one's stands.
            PT_GNU_PROPERTY if matches!(machine, EM_X86_64 | EM_386) => {
                let align = if is64 { word(ph + 48)? } else { word(ph + 28)? };
                property = Some((offset, filesz, align));
            }
            PT_INTERP => interpreters.push(offset),
            _ => {}
        }
    }
    let isa_level = match property {
        Some((offset, size, align)) => x86_isa_level(r, offset, size, align, is64)?,
        None => 0,
    };
    // Every interpreter must be a name; the last one known sets the flag.
    let mut flag = FLAG_ELF;
    if !interpreters.is_empty() {
        let mut offsets = interpreters.clone();
        offsets.sort_unstable();
        offsets.dedup();
        let names = Names::load(r, &offsets)?;
        for at in interpreters {
            r.work.entries_examined += 1;
            let interp = names.get(at).ok_or(NotLibrary)?;
            if let Some(&(_, f)) = INTERPRETERS.iter().find(|(name, _)| *name == interp) {
                flag = f;
            }
        }
    }
    let (dyn_off, dyn_size) = dynamic.ok_or(NotLibrary)?;
    if dyn_size == 0 {
        return Err(NotLibrary);
    }
    let (entries, end) = dynamic_entries(r, dyn_off, dyn_size, is64)?;
    let strtab = match entries.iter().find(|(tag, _)| *tag == DT_STRTAB) {
        Some(&(_, val)) => val.wrapping_sub(loadaddr.unwrap_or(0)),
        None => return Err(end.stop()),
    };
    let is_name = |tag: u64| tag == DT_NEEDED || tag == DT_SONAME;
    let mut offsets: Vec<u64> = entries
        .iter()
        .filter(|(tag, _)| is_name(*tag))
        .filter_map(|(_, val)| strtab.checked_add(*val))
        .collect();
    offsets.sort_unstable();
    offsets.dedup();
    let names = Names::load(r, &offsets)?;
    let mut soname: Option<&[u8]> = None;
    for &(tag, val) in entries.iter().filter(|(tag, _)| is_name(*tag)) {
        r.work.entries_examined += 1;
        let name = names.get(strtab.checked_add(val).ok_or(NotLibrary)?).ok_or(NotLibrary)?;
        if tag == DT_NEEDED {
            // Slice equality compares the lengths first: a long name costs no more than a short one.
            if flag == FLAG_ELF
                && let Some(&(_, f)) = KNOWN_LIBS.iter().find(|(n, _)| *n == name)
            {
                flag = f;
            }
        } else {
            soname = Some(name);
        }
        // ldconfig stops reading here.
        if soname.is_some() && flag != FLAG_ELF {
            return Ok(library(file_flag.unwrap_or(flag), soname, isa_level));
        }
    }
    match end {
        End::Null => Ok(library(file_flag.unwrap_or(flag), soname, isa_level)),
        End::Eof | End::Cap => Err(end.stop()),
    }
}

fn library(flags: i32, soname: Option<&[u8]>, isa_level: u32) -> Library {
    Library { flags, soname: soname.map(|s| String::from_utf8_lossy(s).into_owned()), isa_level }
}

/// The ISA level in a `PT_GNU_PROPERTY` segment: the highest bit of the first
/// `GNU_PROPERTY_X86_ISA_1_NEEDED` word (glibc's `read_gnu_property` for x86); 0 when there is
/// none or the notes are malformed. Notes and properties are 8-byte aligned in 64-bit objects and
/// 4-byte in 32-bit ones; a segment with another alignment is ignored, as ldconfig ignores it.
fn x86_isa_level<R: ReadAt + ?Sized>(
    r: &mut Reader<'_, R>,
    offset: u64,
    size: u64,
    align: u64,
    is64: bool,
) -> Step<u32> {
    let want = if is64 { 8 } else { 4 };
    let Some(end) = offset.checked_add(size.min(MAX_PROPERTY_BYTES)) else { return Ok(0) };
    if align != want {
        return Ok(0);
    }
    // The notes, and the 4 bytes past them the ISA word's read may reach.
    let notes = match r.read(offset, end - offset + 4) {
        Ok(buf) => buf,
        Err(Stop::NotLibrary) => return Ok(0),
        Err(over) => return Err(over),
    };
    Ok(isa_level_in(&notes, offset, end, want).unwrap_or(0))
}

fn isa_level_in(notes: &Buf, offset: u64, end: u64, want: u64) -> Option<u32> {
    let mut note = offset;
    while note.checked_add(12)? <= end {
        let (namesz, descsz, ty) =
            (u64::from(notes.u32(note)?), u64::from(notes.u32(note + 4)?), notes.u32(note + 8)?);
        // ELF_NOTE_DESC_OFFSET / ELF_NOTE_NEXT_OFFSET: the header and name, then the descriptor,
        // each padded to the alignment.
        let desc = note.checked_add((12 + namesz).next_multiple_of(want))?;
        let next = desc.checked_add(descsz)?.next_multiple_of(want);
        if next > end {
            return None;
        }
        if ty == NT_GNU_PROPERTY_TYPE_0 && namesz == 4 && notes.array::<4>(note + 12)? == *b"GNU\0" {
            let mut p = desc;
            while p + 8 <= desc + descsz {
                let (pr_type, datasz) = (notes.u32(p)?, u64::from(notes.u32(p + 4)?));
                if pr_type == GNU_PROPERTY_X86_ISA_1_NEEDED {
                    if datasz != 4 {
                        return None;
                    }
                    let isa_1 = notes.u32(p + 8)?;
                    return Some(if isa_1 == 0 { 0 } else { 31 - isa_1.leading_zeros() });
                }
                p = (p + 8).checked_add(datasz.next_multiple_of(want))?;
            }
        }
        note = next;
    }
    None
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal 64-bit x86-64 shared object: one PT_LOAD, one PT_DYNAMIC with DT_STRTAB,
    /// DT_NEEDED libc.so.6 and (if given) DT_SONAME.
    pub(crate) fn tiny_so(soname: Option<&str>, machine: u16, is64: bool) -> Vec<u8> {
        let mut strtab = b"\0libc.so.6\0".to_vec();
        let soname_at = strtab.len() as u64;
        if let Some(s) = soname {
            strtab.extend_from_slice(s.as_bytes());
            strtab.push(0);
        }
        let (eh, ph, dynsz) = if is64 { (64u64, 56u64, 16u64) } else { (52, 32, 8) };
        let dyn_off = eh + 2 * ph;
        let mut dynamic = vec![(DT_STRTAB, 0u64), (DT_NEEDED, 1)];
        if soname.is_some() {
            dynamic.push((DT_SONAME, soname_at));
        }
        dynamic.push((DT_NULL, 0));
        let str_off = dyn_off + dynamic.len() as u64 * dynsz;
        dynamic[0].1 = str_off + 0x1000; // a vaddr: the load segment maps offset 0 at 0x1000
        let mut b = vec![0u8; eh as usize];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = if is64 { 2 } else { 1 };
        b[5] = 1;
        b[6] = 1;
        b[16..18].copy_from_slice(&ET_DYN.to_le_bytes());
        b[18..20].copy_from_slice(&machine.to_le_bytes());
        let word = |b: &mut Vec<u8>, v: u64| {
            if is64 {
                b.extend_from_slice(&v.to_le_bytes())
            } else {
                b.extend_from_slice(&(v as u32).to_le_bytes())
            }
        };
        if is64 {
            b[32..40].copy_from_slice(&eh.to_le_bytes());
            b[54..56].copy_from_slice(&(ph as u16).to_le_bytes());
            b[56..58].copy_from_slice(&2u16.to_le_bytes());
        } else {
            b[28..32].copy_from_slice(&(eh as u32).to_le_bytes());
            b[42..44].copy_from_slice(&(ph as u16).to_le_bytes());
            b[44..46].copy_from_slice(&2u16.to_le_bytes());
        }
        let total = str_off + strtab.len() as u64;
        for (ty, off, vaddr, size) in
            [(PT_LOAD, 0, 0x1000, total), (PT_DYNAMIC, dyn_off, dyn_off + 0x1000, total - dyn_off)]
        {
            b.extend_from_slice(&ty.to_le_bytes());
            if is64 {
                b.extend_from_slice(&0u32.to_le_bytes());
                for v in [off, vaddr, vaddr, size, size, 8] {
                    word(&mut b, v);
                }
            } else {
                for v in [off, vaddr, vaddr, size, size, 0, 4] {
                    word(&mut b, v);
                }
            }
        }
        for (tag, val) in dynamic {
            word(&mut b, tag);
            word(&mut b, val);
        }
        b.extend_from_slice(&strtab);
        assert_eq!(b.len() as u64, total);
        b
    }

    #[test]
    fn reads_soname_and_flags() {
        let so = tiny_so(Some("libfoo.so.1"), EM_X86_64, true);
        let lib = inspect(so.as_slice(), so.len() as u64).unwrap();
        assert_eq!(lib, Library { flags: 0x0303, soname: Some("libfoo.so.1".into()), isa_level: 0 });
        let so = tiny_so(None, EM_X86_64, true);
        assert_eq!(inspect(so.as_slice(), so.len() as u64).unwrap().soname, None);
    }

    #[test]
    fn i386_flags_come_from_needed_libraries() {
        let so = tiny_so(Some("libfoo.so.1"), EM_386, false);
        assert_eq!(inspect(so.as_slice(), so.len() as u64).unwrap().flags, FLAG_ELF_LIBC6);
        let so = tiny_so(Some("libfoo.so.1"), EM_X86_64, false);
        assert_eq!(inspect(so.as_slice(), so.len() as u64).unwrap().flags, 0x0803);
    }

    #[test]
    fn skips_what_ldconfig_skips() {
        let so = tiny_so(Some("libfoo.so.1"), 40 /* EM_ARM */, true);
        assert_eq!(inspect(so.as_slice(), so.len() as u64), None);
        let mut exec = tiny_so(Some("libfoo.so.1"), EM_X86_64, true);
        exec[16] = 2; // ET_EXEC
        assert_eq!(inspect(exec.as_slice(), exec.len() as u64), None);
        assert_eq!(inspect(&b"/* GNU ld script */ GROUP ( libc.so.6 )"[..], 39), None);
        assert_eq!(inspect(&[][..], 0), None);
    }

    #[test]
    fn survives_every_truncation_and_hostile_offsets() {
        let so = tiny_so(Some("libfoo.so.1"), EM_X86_64, true);
        for n in 0..so.len() {
            let _ = inspect(&so[..n], n as u64);
        }
        for at in 0..so.len() {
            let mut bad = so.clone();
            bad[at] = 0xff;
            let _ = inspect(bad.as_slice(), bad.len() as u64);
        }
        // A length claim larger than the bytes: reads fail cleanly.
        assert_eq!(inspect(&so[..70], 1 << 40), None);
    }

    use crate::synth_elf::{self as synth, SharedObject};
    use std::cell::Cell;

    /// A file's bytes that counts what is read of them.
    struct Counting<'a> {
        bytes: &'a [u8],
        served: Cell<u64>,
        furthest: Cell<u64>,
    }

    impl<'a> Counting<'a> {
        fn new(bytes: &'a [u8]) -> Self {
            Counting { bytes, served: Cell::new(0), furthest: Cell::new(0) }
        }
    }

    impl ReadAt for Counting<'_> {
        fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Option<()> {
            self.bytes.read_exact_at(buf, offset)?;
            self.served.set(self.served.get() + buf.len() as u64);
            self.furthest.set(self.furthest.get().max(offset + buf.len() as u64));
            Some(())
        }
    }

    /// Reads `bytes` through a counter; checks the counters [`examine`] keeps are the truth.
    fn examine_counted(bytes: &[u8]) -> Inspection {
        let file = Counting::new(bytes);
        let got = examine(&file, bytes.len() as u64);
        assert_eq!(got.work.bytes_read, file.served.get(), "bytes_read counts what was read");
        assert!(got.work.bytes_read <= MAX_FILE_BYTES);
        assert_eq!(
            got.library,
            before::inspect_before(bytes, bytes.len() as u64).filter(|_| got.over_limit.is_none())
        );
        got
    }

    fn i386(mut so: SharedObject) -> SharedObject {
        so.machine = EM_386;
        so.is64 = false;
        so.dynamic[0].1 = so.strtab_vaddr();
        so
    }

    /// A program interpreter segment and an x86 ISA-level note (x86-64-v3 needed).
    fn with_interp_and_property(mut so: SharedObject, interp: &[u8]) -> SharedObject {
        let mut note = Vec::new();
        for v in [4u32, 16, NT_GNU_PROPERTY_TYPE_0] {
            note.extend_from_slice(&v.to_le_bytes());
        }
        note.extend_from_slice(b"GNU\0");
        for v in [GNU_PROPERTY_X86_ISA_1_NEEDED, 4, 0b100, 0] {
            note.extend_from_slice(&v.to_le_bytes());
        }
        let align = if so.is64 { 8 } else { 4 };
        so.segments = vec![(PT_INTERP, interp.to_vec(), 1), (PT_GNU_PROPERTY, note, align)];
        so.dynamic[0].1 = so.strtab_vaddr();
        so
    }

    /// Objects of every shape the reader handles.
    fn shapes() -> Vec<(&'static str, Vec<u8>)> {
        let plain = || {
            SharedObject::x86_64(b"\0libc.so.6\0libfoo.so.1\0", |s| {
                vec![(DT_STRTAB, s), (DT_NEEDED, 1), (DT_SONAME, 11), (DT_NULL, 0)]
            })
        };
        let mut out = vec![
            ("x86-64", tiny_so(Some("libfoo.so.1"), EM_X86_64, true)),
            ("x32", tiny_so(Some("libfoo.so.1"), EM_X86_64, false)),
            ("i386", tiny_so(Some("libfoo.so.1"), EM_386, false)),
            ("aarch64", tiny_so(None, EM_AARCH64, true)),
            (
                "interp and property",
                with_interp_and_property(plain(), b"/lib64/ld-linux-x86-64.so.2\0").build(),
            ),
            ("i386 interp", with_interp_and_property(i386(plain()), b"/lib/ld-linux.so.2\0").build()),
            ("needed bomb, small", synth::needed_bomb(6, 300, Some("libbomb.so.1"))),
        ];
        let mut i386_bomb =
            i386(SharedObject::x86_64(&[b"\0".as_slice(), &[b'l'; 300], b"\0libc.so.6\0"].concat(), |s| {
                let mut d = vec![(DT_STRTAB, s)];
                d.extend([(DT_NEEDED, 1), (DT_NEEDED, 2), (DT_NEEDED, 302)]);
                d.push((DT_NULL, 0));
                d
            }));
        i386_bomb.dynamic[0].1 = i386_bomb.strtab_vaddr();
        out.push(("i386 names", i386_bomb.build()));
        out
    }

    #[test]
    fn reads_as_before_on_every_truncation_and_byte_change() {
        for (what, so) in shapes() {
            let lib = examine_counted(&so);
            assert!(lib.library.is_some(), "{what}");
            for n in 0..so.len() {
                examine_counted(&so[..n]);
            }
            for at in 0..so.len() {
                for v in [0x00, 0x01, 0x02, 0x10, 0x7f, 0x80, 0xff] {
                    let mut bad = so.clone();
                    bad[at] = v;
                    examine_counted(&bad);
                }
            }
        }
    }

    #[test]
    fn interpreters_and_notes_as_before() {
        let (_, so) = shapes().remove(4);
        assert_eq!(
            inspect(so.as_slice(), so.len() as u64),
            Some(Library { flags: 0x0303, soname: Some("libfoo.so.1".into()), isa_level: 2 })
        );
        let (_, so) = shapes().remove(5);
        let lib = inspect(so.as_slice(), so.len() as u64).unwrap();
        assert_eq!((lib.flags, lib.isa_level), (FLAG_ELF_LIBC6, 2));
    }

    /// Issue 32's file: 16,383 `DT_NEEDED` all naming one 4,095-byte string. The reader before
    /// read 16,383 names of 4 KB, byte by byte (about 5 s of CPU in a debug build).
    #[test]
    fn the_issue_bomb_costs_a_bounded_read_of_its_dynamic_array() {
        let bomb = synth::needed_bomb(16_383, 4_095, None);
        let got = examine_counted(&bomb);
        assert_eq!(got.over_limit, Some(Limit::DynamicEntries));
        // The header, the program headers, the array up to the limit, one window of the name.
        let array = MAX_DYNAMIC_ENTRIES as u64 * 16;
        let names = NAME_WINDOW + MAX_NAME as u64 + 1;
        assert!(got.work.bytes_read <= 64 + 2 * 56 + array + names, "{:?}", got.work);
        assert!(got.work.reads <= 5, "{:?}", got.work);
        assert!(got.work.entries_examined <= 2 + 2 * MAX_DYNAMIC_ENTRIES as u64, "{:?}", got.work);
        // With a SONAME, as many as the entry limit allows: each name is read once.
        // (DT_STRTAB, the DT_NEEDED, DT_SONAME and DT_NULL: as many entries as the limit.)
        let bomb = synth::needed_bomb(MAX_DYNAMIC_ENTRIES - 3, 4_095, Some("libbomb.so.1"));
        let got = examine_counted(&bomb);
        assert_eq!(got.library.unwrap().soname.as_deref(), Some("libbomb.so.1"));
        let array = MAX_DYNAMIC_ENTRIES as u64 * 16;
        let names = 2 * NAME_WINDOW + MAX_NAME as u64 + 1;
        assert!(got.work.bytes_read <= 64 + 2 * 56 + array + names, "{:?}", got.work);
        assert!(got.work.reads <= 6, "{:?}", got.work);
    }

    #[test]
    fn a_name_is_read_once_however_many_entries_name_it_and_compared_by_its_first_bytes() {
        // i386, so every DT_NEEDED is compared with the known C libraries.
        let long = [b"\0".as_slice(), b"libc.so.6", &[b'x'; 4000], b"\0"].concat();
        let so = i386(SharedObject::x86_64(&long, |s| {
            let mut d = vec![(DT_STRTAB, s)];
            d.extend(std::iter::repeat_n((DT_NEEDED, 1), 1000));
            d.push((DT_NULL, 0));
            d
        }));
        let got = examine_counted(&so.build());
        // Starts like libc.so.6 but is not it.
        assert_eq!(got.library.unwrap().flags, FLAG_ELF);
        assert!(
            got.work.bytes_read <= 64 + 2 * 32 + 1002 * 8 + NAME_WINDOW + MAX_NAME as u64 + 1,
            "{:?}",
            got.work
        );
        // Names of exactly the longest length are names; one byte more makes the file not a
        // library, as before.
        for (len, ok) in [(MAX_NAME, true), (MAX_NAME + 1, false)] {
            let bomb = synth::needed_bomb(3, len, Some("libbomb.so.1"));
            assert_eq!(examine_counted(&bomb).library.is_some(), ok, "{len}");
        }
    }

    #[test]
    fn many_distinct_long_names_stop_at_the_byte_limit() {
        // Each name 4 KB long at its own offset: every one needs its own window.
        let names = 1000;
        let mut strings = vec![0u8];
        let mut at = Vec::new();
        for _ in 0..names {
            at.push(strings.len() as u64);
            strings.extend_from_slice(&[b'A'; MAX_NAME - 1]);
            strings.push(0);
        }
        let so = SharedObject::x86_64(&strings, |s| {
            let mut d = vec![(DT_STRTAB, s)];
            d.extend(at.iter().map(|&a| (DT_NEEDED, a)));
            d.push((DT_NULL, 0));
            d
        });
        let got = examine_counted(&so.build());
        assert_eq!(got.over_limit, Some(Limit::Bytes));
        assert!(got.work.bytes_read <= MAX_FILE_BYTES);
        // Just under the limit, the file is the library it was.
        let fits = (MAX_FILE_BYTES - 64 - 112 - 1024) / (MAX_NAME as u64 + 1 + NAME_WINDOW) - 4;
        let so = SharedObject::x86_64(&strings, |s| {
            let mut d = vec![(DT_STRTAB, s)];
            d.extend(at.iter().take(fits as usize).map(|&a| (DT_NEEDED, a)));
            d.push((DT_NULL, 0));
            d
        });
        let got = examine_counted(&so.build());
        assert!(got.library.is_some() && got.work.bytes_read > MAX_FILE_BYTES / 2, "{:?}", got.work);
    }

    #[test]
    fn a_huge_dynamic_segment_is_read_to_the_entry_limit_only() {
        let so = SharedObject::x86_64(b"\0libx.so\0", |s| {
            let mut d = vec![(DT_STRTAB, s)];
            d.extend(std::iter::repeat_n((DT_NEEDED, 1), 100_000));
            d
        });
        let got = examine_counted(&so.build());
        assert_eq!(got.over_limit, Some(Limit::DynamicEntries));
        assert!(
            got.work.bytes_read <= 64 + 112 + MAX_DYNAMIC_ENTRIES as u64 * 16 + NAME_WINDOW,
            "{:?}",
            got.work
        );
        // A segment size far beyond the file: the array is read to the file's end.
        let mut so = SharedObject::x86_64(b"\0libx.so\0", |s| vec![(DT_STRTAB, s), (DT_NEEDED, 1)]).build();
        so[64 + 56 + 32..64 + 56 + 40].copy_from_slice(&u64::MAX.to_le_bytes());
        let got = examine_counted(&so);
        assert_eq!((got.library, got.over_limit), (None, None));
        assert!(got.work.reads <= 4 && got.work.bytes_read <= 2 * so.len() as u64, "{:?}", got.work);
    }

    #[test]
    fn a_string_table_beyond_the_file_reads_no_names() {
        for strtab in [1 << 40, u64::MAX - 2] {
            let so = SharedObject::x86_64(b"\0libx.so.1\0", |_| {
                vec![(DT_STRTAB, strtab), (DT_NEEDED, 1), (DT_SONAME, 1), (DT_NULL, 0)]
            });
            let got = examine_counted(&so.build());
            assert_eq!((got.library, got.over_limit), (None, None));
            assert_eq!(got.work.reads, 3, "header, program headers, dynamic array: {:?}", got.work);
        }
    }

    #[test]
    fn a_string_table_inside_the_dynamic_array_is_read_as_before() {
        // DT_STRTAB names the dynamic array itself; names point into its entries.
        let mut so = SharedObject::x86_64(b"\0", |_| Vec::new());
        let at = so.dynamic_vaddr();
        so.dynamic = (0..200).map(|i| (DT_NEEDED, i * 3)).collect();
        so.dynamic.insert(0, (DT_STRTAB, at));
        so.dynamic.push((DT_SONAME, 2));
        so.dynamic.push((DT_NULL, 0));
        let got = examine_counted(&so.build());
        assert!(got.work.reads <= 6, "{:?}", got.work);
    }

    /// A file that keeps growing as it is read: a header, then `DT_NEEDED` entries forever.
    struct Endless {
        head: Vec<u8>,
        served: Cell<u64>,
    }

    impl ReadAt for Endless {
        fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Option<()> {
            let entry = &self.head[self.head.len() - 16..];
            for (i, b) in buf.iter_mut().enumerate() {
                let at = offset + i as u64;
                *b = match self.head.get(at as usize) {
                    Some(&b) => b,
                    None => entry[((at - self.head.len() as u64) % 16) as usize],
                };
            }
            self.served.set(self.served.get() + buf.len() as u64);
            Some(())
        }
    }

    #[test]
    fn a_file_that_grows_while_read_is_read_no_further_than_its_length() {
        let so = SharedObject::x86_64(b"\0libx.so\0", |s| vec![(DT_STRTAB, s), (DT_NEEDED, 1)]).build();
        // Read with the length fstat gave: nothing past it.
        let mut longer = so.clone();
        longer.extend_from_slice(&synth::needed_bomb(100, 4000, None));
        let file = Counting::new(&longer);
        let got = examine(&file, so.len() as u64);
        assert_eq!((got.library, got.over_limit), (None, None));
        assert!(file.furthest.get() <= so.len() as u64);
        // Endless, whatever length it claims: the limits hold.
        for len in [1 << 30, u64::MAX] {
            let file = Endless { head: so.clone(), served: Cell::new(0) };
            let got = examine(&file, len);
            assert_eq!(got.over_limit, Some(Limit::DynamicEntries));
            assert_eq!(got.work.bytes_read, file.served.get());
            assert!(got.work.bytes_read <= 64 + 112 + MAX_DYNAMIC_ENTRIES as u64 * 16 + NAME_WINDOW);
        }
    }

    #[test]
    fn many_interpreters_and_notes_stop_at_the_byte_limit() {
        // 250 interpreters, each a distinct 4 KB unterminated run; as many property notes.
        let mut so =
            SharedObject::x86_64(b"\0libx.so.1\0", |s| vec![(DT_STRTAB, s), (DT_SONAME, 1), (DT_NULL, 0)]);
        so.segments = (0..250)
            .map(|i| {
                if i % 2 == 0 {
                    (PT_INTERP, vec![b'/'; 4200], 1)
                } else {
                    (PT_GNU_PROPERTY, vec![0; 4200], 8)
                }
            })
            .collect();
        so.dynamic[0].1 = so.strtab_vaddr();
        let got = examine_counted(&so.build());
        assert_eq!(got.over_limit, Some(Limit::Bytes));
        // Too many program headers: nothing past the ELF header is read.
        let mut many = tiny_so(Some("libfoo.so.1"), EM_X86_64, true);
        many[56..58].copy_from_slice(&u16::MAX.to_le_bytes());
        let got = examine_counted(&many);
        assert_eq!((got.over_limit, got.work.bytes_read), (Some(Limit::ProgramHeaders), 64));
    }

    /// This host's libraries read as the reader before issue 32 read them, each within a small
    /// share of the limits. (A host without these folders compares nothing.)
    #[test]
    fn real_libraries_read_as_before() {
        use std::os::unix::fs::MetadataExt;
        let mut seen = std::collections::HashSet::new();
        let (mut files, mut most) = (0, FileWork::default());
        for dir in ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/usr/lib"]
        {
            let Ok(listing) = std::fs::read_dir(dir) else { continue };
            for entry in listing.flatten() {
                let name = entry.file_name();
                let name = name.as_encoded_bytes();
                if !(name.starts_with(b"lib") || name.starts_with(b"ld-"))
                    || !name.windows(3).any(|w| w == b".so")
                {
                    continue;
                }
                let Ok(file) = File::open(entry.path()) else { continue };
                let Ok(meta) = file.metadata() else { continue };
                if !meta.is_file() || !seen.insert((meta.dev(), meta.ino())) {
                    continue;
                }
                let got = examine(&file, meta.len());
                assert_eq!(got.over_limit, None, "{}", entry.path().display());
                assert_eq!(
                    got.library,
                    before::inspect_before(&file, meta.len()),
                    "{}",
                    entry.path().display()
                );
                files += 1;
                most.bytes_read = most.bytes_read.max(got.work.bytes_read);
                most.reads = most.reads.max(got.work.reads);
                most.entries_examined = most.entries_examined.max(got.work.entries_examined);
            }
        }
        eprintln!("{files} library files; most work for one: {most:?}");
        assert!(most.bytes_read <= MAX_FILE_BYTES / 16, "{most:?}");
    }
}
