//! Minimal ELF64 shared objects: the stub driver libraries of the simulated driver root.
//!
//! A real driver root holds dozens of NVIDIA libraries that tools find by file name, by SONAME
//! (through `ldconfig` and `ld.so.cache`) and by `dlopen`. The stubs written here are real,
//! loadable shared objects with the right SONAME and nothing else: an ELF header, one read-write
//! `PT_LOAD` covering the image, a `PT_DYNAMIC` with `DT_SONAME`, `DT_STRTAB`, `DT_SYMTAB`,
//! `DT_STRSZ`, `DT_SYMENT` and `DT_HASH`, a `PT_GNU_STACK` (so glibc never tries to make the stack
//! executable), a symbol table holding only the null symbol, and section headers so that tools
//! reading sections (`readelf`, Go's `debug/elf`) see the same thing the loader does.
//!
//! [`read_soname`] reads the SONAME back from any ELF64 little-endian shared object (stub or real),
//! which the builder uses to check that the simulated NVML it installs really is
//! `libnvidia-ml.so.1`.

use std::fmt;

/// CPU architectures the stubs can be written for (the ones glibc-based NVIDIA drivers ship for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Machine {
    /// x86-64 (`EM_X86_64`).
    X86_64,
    /// 64-bit Arm (`EM_AARCH64`).
    Aarch64,
}

impl Machine {
    /// The architecture this program was compiled for, if stubs can be written for it.
    pub fn host() -> Option<Machine> {
        match std::env::consts::ARCH {
            "x86_64" => Some(Machine::X86_64),
            "aarch64" => Some(Machine::Aarch64),
            _ => None,
        }
    }

    /// The `e_machine` value.
    pub fn elf_machine(self) -> u16 {
        match self {
            Machine::X86_64 => 62,
            Machine::Aarch64 => 183,
        }
    }

    /// The Debian multiarch triple: the library directory is `usr/lib/<triple>`.
    pub fn multiarch_triple(self) -> &'static str {
        match self {
            Machine::X86_64 => "x86_64-linux-gnu",
            Machine::Aarch64 => "aarch64-linux-gnu",
        }
    }

    /// How `ldconfig -p` labels a library of this architecture (`libc6,x86-64`).
    pub fn ldconfig_label(self) -> &'static str {
        match self {
            Machine::X86_64 => "libc6,x86-64",
            Machine::Aarch64 => "libc6,AArch64",
        }
    }

    /// Segment alignment: the largest page size the architecture's kernels use, because glibc
    /// refuses a `PT_LOAD` whose alignment is not a multiple of the running page size.
    fn segment_align(self) -> u64 {
        match self {
            Machine::X86_64 => 0x1000,
            Machine::Aarch64 => 0x1_0000,
        }
    }
}

const EHDR_SIZE: usize = 64;
const PHDR_SIZE: usize = 56;
const SHDR_SIZE: usize = 64;
const SYM_SIZE: usize = 24;
const DYN_SIZE: usize = 16;

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_GNU_STACK: u32 = 0x6474_e551;
const PF_W: u32 = 2;
const PF_R: u32 = 4;

const SHT_STRTAB: u32 = 3;
const SHT_HASH: u32 = 5;
const SHT_DYNAMIC: u32 = 6;
const SHT_DYNSYM: u32 = 11;
const SHF_WRITE: u64 = 1;
const SHF_ALLOC: u64 = 2;

const DT_NULL: u64 = 0;
const DT_HASH: u64 = 4;
const DT_STRTAB: u64 = 5;
const DT_SYMTAB: u64 = 6;
const DT_STRSZ: u64 = 10;
const DT_SYMENT: u64 = 11;
const DT_SONAME: u64 = 14;

/// Little-endian byte sink with the few primitives an ELF image needs.
struct Image(Vec<u8>);

impl Image {
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn pad_to(&mut self, offset: usize) {
        debug_assert!(self.0.len() <= offset);
        self.0.resize(offset, 0);
    }
    fn phdr(&mut self, kind: u32, flags: u32, offset: u64, size: u64, align: u64) {
        self.u32(kind);
        self.u32(flags);
        self.u64(offset); // p_offset
        self.u64(offset); // p_vaddr: the image is mapped at its file offsets
        self.u64(offset); // p_paddr
        self.u64(size); // p_filesz
        self.u64(size); // p_memsz
        self.u64(align);
    }
    #[allow(clippy::too_many_arguments)] // mirrors the Elf64_Shdr fields one to one
    fn shdr(
        &mut self,
        name: u32,
        kind: u32,
        flags: u64,
        addr: u64,
        offset: u64,
        size: u64,
        link: u32,
        info: u32,
        align: u64,
        entsize: u64,
    ) {
        self.u32(name);
        self.u32(kind);
        self.u64(flags);
        self.u64(addr);
        self.u64(offset);
        self.u64(size);
        self.u32(link);
        self.u32(info);
        self.u64(align);
        self.u64(entsize);
    }
}

fn align8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// Writes a loadable shared object for `machine` whose SONAME is `soname`.
///
/// The result is deterministic: the same arguments always give the same bytes.
pub fn shared_object(machine: Machine, soname: &str) -> Vec<u8> {
    const PHNUM: usize = 3;
    const SHNUM: usize = 6;
    const DYN_COUNT: usize = 7;

    let hash_off = EHDR_SIZE + PHNUM * PHDR_SIZE;
    let hash_size = 4 * 4; // nbucket, nchain, bucket[0], chain[0]
    let dynsym_off = align8(hash_off + hash_size);
    let dynstr_off = dynsym_off + SYM_SIZE;
    // Index 0 is the empty string every string table starts with; the SONAME follows it.
    let mut dynstr = vec![0u8];
    let soname_index = dynstr.len() as u64;
    dynstr.extend_from_slice(soname.as_bytes());
    dynstr.push(0);
    let dynamic_off = align8(dynstr_off + dynstr.len());
    let dynamic_size = DYN_COUNT * DYN_SIZE;
    let load_end = dynamic_off + dynamic_size;

    let section_names = [".hash", ".dynsym", ".dynstr", ".dynamic", ".shstrtab"];
    let mut shstrtab = vec![0u8];
    let mut name_index = Vec::new();
    for name in section_names {
        name_index.push(shstrtab.len() as u32);
        shstrtab.extend_from_slice(name.as_bytes());
        shstrtab.push(0);
    }
    let shstrtab_off = load_end;
    let shdr_off = align8(shstrtab_off + shstrtab.len());
    let total = shdr_off + SHNUM * SHDR_SIZE;

    let mut img = Image(Vec::with_capacity(total));
    // e_ident: magic, ELFCLASS64, ELFDATA2LSB, EV_CURRENT, ELFOSABI_SYSV, ABI version 0.
    img.0.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0]);
    img.pad_to(16);
    img.u16(3); // ET_DYN
    img.u16(machine.elf_machine());
    img.u32(1); // e_version
    img.u64(0); // e_entry
    img.u64(EHDR_SIZE as u64); // e_phoff
    img.u64(shdr_off as u64); // e_shoff
    img.u32(0); // e_flags
    img.u16(EHDR_SIZE as u16);
    img.u16(PHDR_SIZE as u16);
    img.u16(PHNUM as u16);
    img.u16(SHDR_SIZE as u16);
    img.u16(SHNUM as u16);
    img.u16(SHNUM as u16 - 1); // e_shstrndx: .shstrtab is last

    // Writable because glibc before 2.35 relocates the dynamic section in place.
    img.phdr(PT_LOAD, PF_R | PF_W, 0, load_end as u64, machine.segment_align());
    img.phdr(PT_DYNAMIC, PF_R | PF_W, dynamic_off as u64, dynamic_size as u64, 8);
    img.phdr(PT_GNU_STACK, PF_R | PF_W, 0, 0, 16);

    // .hash: one bucket, one chain entry (the null symbol), both empty.
    img.pad_to(hash_off);
    for v in [1, 1, 0, 0] {
        img.u32(v);
    }
    // .dynsym: only the null symbol, all zeros.
    img.pad_to(dynstr_off);
    img.0.extend_from_slice(&dynstr);
    img.pad_to(dynamic_off);
    for (tag, val) in [
        (DT_SONAME, soname_index),
        (DT_HASH, hash_off as u64),
        (DT_STRTAB, dynstr_off as u64),
        (DT_SYMTAB, dynsym_off as u64),
        (DT_STRSZ, dynstr.len() as u64),
        (DT_SYMENT, SYM_SIZE as u64),
        (DT_NULL, 0),
    ] {
        img.u64(tag);
        img.u64(val);
    }
    img.0.extend_from_slice(&shstrtab);
    img.pad_to(shdr_off);

    img.0.extend_from_slice(&[0u8; SHDR_SIZE]); // SHN_UNDEF
    let (h, s, d) = (hash_off as u64, dynsym_off as u64, dynstr_off as u64);
    img.shdr(name_index[0], SHT_HASH, SHF_ALLOC, h, h, hash_size as u64, 2, 0, 8, 4);
    img.shdr(name_index[1], SHT_DYNSYM, SHF_ALLOC, s, s, SYM_SIZE as u64, 3, 1, 8, SYM_SIZE as u64);
    img.shdr(name_index[2], SHT_STRTAB, SHF_ALLOC, d, d, dynstr.len() as u64, 0, 0, 1, 0);
    let dy = dynamic_off as u64;
    let flags = SHF_ALLOC | SHF_WRITE;
    img.shdr(name_index[3], SHT_DYNAMIC, flags, dy, dy, dynamic_size as u64, 3, 0, 8, DYN_SIZE as u64);
    let st = shstrtab_off as u64;
    img.shdr(name_index[4], SHT_STRTAB, 0, 0, st, shstrtab.len() as u64, 0, 0, 1, 0);
    debug_assert_eq!(img.0.len(), total);
    img.0
}

/// Why [`read_soname`] could not read a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElfError {
    /// The bytes do not start with the ELF magic.
    NotElf,
    /// Not a 64-bit little-endian object.
    Unsupported,
    /// A header or table points outside the file.
    Truncated(&'static str),
}

impl fmt::Display for ElfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ElfError::NotElf => write!(f, "not an ELF file"),
            ElfError::Unsupported => write!(f, "not a 64-bit little-endian ELF file"),
            ElfError::Truncated(what) => write!(f, "ELF {what} lies outside the file"),
        }
    }
}

impl std::error::Error for ElfError {}

/// What [`read_soname`] learns from a shared object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfSummary {
    /// `e_machine` (62 for x86-64).
    pub machine: u16,
    /// `DT_SONAME`, if the object has one.
    pub soname: Option<String>,
}

fn rd<const N: usize>(b: &[u8], at: usize, what: &'static str) -> Result<[u8; N], ElfError> {
    let end = at.checked_add(N).ok_or(ElfError::Truncated(what))?;
    b.get(at..end).and_then(|s| s.try_into().ok()).ok_or(ElfError::Truncated(what))
}

/// `base + index * stride`, or `Truncated` when a corrupt header makes it overflow.
fn at_index(base: usize, index: usize, stride: usize, what: &'static str) -> Result<usize, ElfError> {
    index.checked_mul(stride).and_then(|n| n.checked_add(base)).ok_or(ElfError::Truncated(what))
}
fn rd16(b: &[u8], at: usize, what: &'static str) -> Result<u16, ElfError> {
    rd::<2>(b, at, what).map(u16::from_le_bytes)
}
fn rd32(b: &[u8], at: usize, what: &'static str) -> Result<u32, ElfError> {
    rd::<4>(b, at, what).map(u32::from_le_bytes)
}
fn rd64(b: &[u8], at: usize, what: &'static str) -> Result<u64, ElfError> {
    rd::<8>(b, at, what).map(u64::from_le_bytes)
}

/// Reads the machine and SONAME of an ELF64 little-endian object through its program headers,
/// the way the dynamic loader and `ldconfig` do. Trailing bytes after the image are ignored.
pub fn read_soname(bytes: &[u8]) -> Result<ElfSummary, ElfError> {
    if bytes.len() < 4 || &bytes[..4] != b"\x7fELF" {
        return Err(ElfError::NotElf);
    }
    if bytes.get(4) != Some(&2) || bytes.get(5) != Some(&1) {
        return Err(ElfError::Unsupported);
    }
    let machine = rd16(bytes, 18, "header")?;
    let phoff = rd64(bytes, 32, "header")? as usize;
    let phentsize = rd16(bytes, 54, "header")? as usize;
    let phnum = rd16(bytes, 56, "header")? as usize;

    // (vaddr, offset, filesz) of each PT_LOAD, to turn addresses into file offsets.
    let mut loads = Vec::new();
    let mut dynamic = None;
    for i in 0..phnum {
        let at = at_index(phoff, i, phentsize, "program header")?;
        let kind = rd32(bytes, at, "program header")?;
        let offset = rd64(bytes, at + 8, "program header")?;
        let vaddr = rd64(bytes, at + 16, "program header")?;
        let filesz = rd64(bytes, at + 32, "program header")?;
        match kind {
            PT_LOAD => loads.push((vaddr, offset, filesz)),
            PT_DYNAMIC => dynamic = Some((offset as usize, filesz as usize)),
            _ => {}
        }
    }
    let Some((dyn_off, dyn_size)) = dynamic else { return Ok(ElfSummary { machine, soname: None }) };
    let mut strtab = None;
    let mut soname_at = None;
    for i in 0..dyn_size / DYN_SIZE {
        let at = at_index(dyn_off, i, DYN_SIZE, "dynamic section")?;
        let tag = rd64(bytes, at, "dynamic section")?;
        let val = rd64(bytes, at_index(at, 1, 8, "dynamic section")?, "dynamic section")?;
        match tag {
            DT_NULL => break,
            DT_STRTAB => strtab = Some(val),
            DT_SONAME => soname_at = Some(val),
            _ => {}
        }
    }
    let (Some(strtab), Some(soname_at)) = (strtab, soname_at) else {
        return Ok(ElfSummary { machine, soname: None });
    };
    let strtab_off = loads
        .iter()
        .find(|(vaddr, _, filesz)| strtab >= *vaddr && strtab - vaddr < *filesz)
        .and_then(|(vaddr, offset, _)| (strtab - vaddr).checked_add(*offset))
        .ok_or(ElfError::Truncated("string table"))?;
    let start = strtab_off.checked_add(soname_at).ok_or(ElfError::Truncated("SONAME"))?;
    let tail =
        usize::try_from(start).ok().and_then(|s| bytes.get(s..)).ok_or(ElfError::Truncated("SONAME"))?;
    let end = tail.iter().position(|&b| b == 0).ok_or(ElfError::Truncated("SONAME"))?;
    Ok(ElfSummary { machine, soname: Some(String::from_utf8_lossy(&tail[..end]).into_owned()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stub_reads_back_its_soname_and_machine() {
        for machine in [Machine::X86_64, Machine::Aarch64] {
            let so = shared_object(machine, "libcuda.so.1");
            let summary = read_soname(&so).unwrap();
            assert_eq!(summary.machine, machine.elf_machine());
            assert_eq!(summary.soname.as_deref(), Some("libcuda.so.1"));
        }
    }

    #[test]
    fn stub_is_deterministic_and_trailer_is_ignored() {
        let a = shared_object(Machine::X86_64, "libnvidia-nvvm.so.4");
        assert_eq!(a, shared_object(Machine::X86_64, "libnvidia-nvvm.so.4"));
        let with_trailer = crate::embed::append(&a, b"{}");
        assert_eq!(read_soname(&with_trailer).unwrap().soname.as_deref(), Some("libnvidia-nvvm.so.4"));
    }

    #[test]
    fn garbage_is_rejected_with_a_reason() {
        assert_eq!(read_soname(b"#!/bin/sh\n"), Err(ElfError::NotElf));
        let mut so = shared_object(Machine::X86_64, "x.so.1");
        so[4] = 1; // ELFCLASS32
        assert_eq!(read_soname(&so), Err(ElfError::Unsupported));
        let so = shared_object(Machine::X86_64, "x.so.1");
        assert!(matches!(read_soname(&so[..100]), Err(ElfError::Truncated(_))));
        // Header offsets and sizes at their maximum are reported, not overflowed.
        let mut so = shared_object(Machine::X86_64, "x.so.1");
        so[32..40].copy_from_slice(&u64::MAX.to_le_bytes()); // e_phoff
        assert!(matches!(read_soname(&so), Err(ElfError::Truncated(_))));
        let mut so = shared_object(Machine::X86_64, "x.so.1");
        so[EHDR_SIZE + 32..EHDR_SIZE + 40].copy_from_slice(&u64::MAX.to_le_bytes()); // PT_LOAD p_filesz
        assert_eq!(read_soname(&so).unwrap().soname.as_deref(), Some("x.so.1"));
    }
}
