//! The ELF reader as it was before issue 32 (commit f677d3d, `src/elf.rs`), kept as it was but
//! for its name (`inspect_before`) and the types it now imports (`ReadAt`, `Library`): the
//! reference the new reader is compared with (unit tests) and measured against (benches). It reads
//! byte by byte through a page cache searched linearly and reads every name whole. Include it with
//! `#[path]` in a module whose parent has `ReadAt`, `Library` and the `FLAG_*` constants in scope.
#![allow(dead_code, clippy::all)]

use super::{
    FLAG_AARCH64_LIB64, FLAG_ELF, FLAG_ELF_LIBC5, FLAG_ELF_LIBC6, FLAG_X8664_LIB64, FLAG_X8664_LIBX32,
    Library, ReadAt,
};

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
/// Caps against hostile files: no real library comes near them.
const MAX_PHDRS: usize = 1024;
const MAX_DYNAMIC_ENTRIES: usize = 16 * 1024;
const MAX_NAME: usize = 4096;

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

const PAGE: u64 = 4096;
/// Pages kept per file: header, program headers, dynamic section and strings fit in a few.
const MAX_PAGES: usize = 64;

/// Reads a file through a small page cache, so the many small fields cost a few `pread`s.
struct Reader<'a, R: ReadAt + ?Sized> {
    file: &'a R,
    len: u64,
    is64: bool,
    pages: std::cell::RefCell<Vec<(u64, Vec<u8>)>>,
}

impl<R: ReadAt + ?Sized> Reader<'_, R> {
    fn byte(&self, at: u64) -> Option<u8> {
        if at >= self.len {
            return None;
        }
        let page = at / PAGE;
        let mut pages = self.pages.borrow_mut();
        if let Some((_, b)) = pages.iter().find(|(p, _)| *p == page) {
            return b.get((at % PAGE) as usize).copied();
        }
        let start = page * PAGE;
        let mut b = vec![0; (self.len - start).min(PAGE) as usize];
        self.file.read_exact_at(&mut b, start)?;
        let v = b.get((at % PAGE) as usize).copied();
        if pages.len() >= MAX_PAGES {
            pages.remove(0);
        }
        pages.push((page, b));
        v
    }
    fn bytes<const N: usize>(&self, at: u64) -> Option<[u8; N]> {
        if at.checked_add(N as u64)? > self.len {
            return None;
        }
        let mut b = [0; N];
        for (i, c) in b.iter_mut().enumerate() {
            *c = self.byte(at + i as u64)?;
        }
        Some(b)
    }
    fn u16(&self, at: u64) -> Option<u16> {
        self.bytes::<2>(at).map(u16::from_le_bytes)
    }
    fn u32(&self, at: u64) -> Option<u32> {
        self.bytes::<4>(at).map(u32::from_le_bytes)
    }
    fn u64(&self, at: u64) -> Option<u64> {
        self.bytes::<8>(at).map(u64::from_le_bytes)
    }
    /// A word of the file's class (`Elf32_Addr`/`Elf64_Addr`-sized).
    fn word(&self, at: u64) -> Option<u64> {
        if self.is64 { self.u64(at) } else { self.u32(at).map(u64::from) }
    }
    /// A NUL-terminated string starting at `at`, at most [`MAX_NAME`] bytes.
    fn cstr(&self, at: u64) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        for i in 0..=MAX_NAME as u64 {
            match self.byte(at.checked_add(i)?)? {
                0 => return Some(out),
                c => out.push(c),
            }
        }
        None
    }
}

/// Reads what ldconfig would from a file of `len` bytes; `None` if ldconfig would skip it.
pub fn inspect_before<R: ReadAt + ?Sized>(file: &R, len: u64) -> Option<Library> {
    // ldconfig skips files smaller than an ELF header.
    let mut r = Reader { file, len, is64: false, pages: Default::default() };
    let ident = r.bytes::<16>(0)?;
    if len < 64 || &ident[..4] != b"\x7fELF" || ident[5] != 1 {
        return None;
    }
    r.is64 = match ident[4] {
        1 => false,
        2 => true,
        _ => return None,
    };
    if r.u16(16)? != ET_DYN {
        return None;
    }
    let machine = r.u16(18)?;
    let file_flag = match (machine, r.is64) {
        (EM_X86_64, true) => Some(FLAG_X8664_LIB64 | FLAG_ELF_LIBC6),
        (EM_X86_64, false) => Some(FLAG_X8664_LIBX32 | FLAG_ELF_LIBC6),
        (EM_AARCH64, true) => Some(FLAG_AARCH64_LIB64 | FLAG_ELF_LIBC6),
        (EM_386, false) => None,
        _ => return None,
    };
    let (phoff, phnum, phsize) = if r.is64 {
        (r.u64(32)?, r.u16(56)? as usize, 56u64)
    } else {
        (u64::from(r.u32(28)?), r.u16(44)? as usize, 32u64)
    };
    let mut flag = FLAG_ELF;
    let mut loadaddr: Option<u64> = None;
    let mut dynamic: Option<(u64, u64)> = None;
    let mut isa_level = 0;
    for i in 0..phnum.min(MAX_PHDRS) as u64 {
        let ph = phoff.checked_add(i * phsize)?;
        let p_type = r.u32(ph)?;
        let (offset, vaddr, filesz) = if r.is64 {
            (r.u64(ph + 8)?, r.u64(ph + 16)?, r.u64(ph + 32)?)
        } else {
            (u64::from(r.u32(ph + 4)?), u64::from(r.u32(ph + 8)?), u64::from(r.u32(ph + 16)?))
        };
        match p_type {
            PT_LOAD if loadaddr.is_none() => loadaddr = Some(vaddr.wrapping_sub(offset)),
            PT_DYNAMIC => dynamic = Some((offset, filesz)),
            PT_GNU_PROPERTY if matches!(machine, EM_X86_64 | EM_386) => {
                let align = if r.is64 { r.u64(ph + 48)? } else { u64::from(r.u32(ph + 28)?) };
                isa_level = x86_isa_level(&r, offset, filesz, align).unwrap_or(0);
            }
            PT_INTERP => {
                let interp = r.cstr(offset)?;
                if let Some(&(_, f)) = INTERPRETERS.iter().find(|(name, _)| *name == interp.as_slice()) {
                    flag = f;
                }
            }
            _ => {}
        }
    }
    let (dyn_off, dyn_size) = dynamic?;
    if dyn_size == 0 {
        return None;
    }
    let step = if r.is64 { 16 } else { 8 };
    let entry = |i: usize| -> Option<(u64, u64)> {
        let at = dyn_off.checked_add(i as u64 * step)?;
        Some((r.word(at)?, r.word(at + step / 2)?))
    };
    let mut strtab = None;
    for i in 0..MAX_DYNAMIC_ENTRIES {
        let (tag, val) = entry(i)?;
        if tag == DT_NULL {
            break;
        }
        if tag == DT_STRTAB {
            strtab = Some(val.wrapping_sub(loadaddr.unwrap_or(0)));
            break;
        }
    }
    let strtab = strtab?;
    let mut soname = None;
    for i in 0..MAX_DYNAMIC_ENTRIES {
        let (tag, val) = entry(i)?;
        if tag == DT_NULL {
            break;
        }
        if tag != DT_NEEDED && tag != DT_SONAME {
            continue;
        }
        let name = r.cstr(strtab.checked_add(val)?)?;
        if tag == DT_NEEDED {
            if flag == FLAG_ELF
                && let Some(&(_, f)) = KNOWN_LIBS.iter().find(|(n, _)| *n == name.as_slice())
            {
                flag = f;
            }
        } else {
            soname = Some(String::from_utf8_lossy(&name).into_owned());
        }
        if soname.is_some() && flag != FLAG_ELF {
            break;
        }
    }
    Some(Library { flags: file_flag.unwrap_or(flag), soname, isa_level })
}

/// The ISA level in a `PT_GNU_PROPERTY` segment: the highest bit of the first
/// `GNU_PROPERTY_X86_ISA_1_NEEDED` word (glibc's `read_gnu_property` for x86). Notes and
/// properties are 8-byte aligned in 64-bit objects and 4-byte in 32-bit ones; a segment with
/// another alignment is ignored, as ldconfig ignores it.
fn x86_isa_level<R: ReadAt + ?Sized>(r: &Reader<'_, R>, offset: u64, size: u64, align: u64) -> Option<u32> {
    let want = if r.is64 { 8 } else { 4 };
    if align != want {
        return None;
    }
    let end = offset.checked_add(size.min(MAX_PROPERTY_BYTES))?;
    let mut note = offset;
    while note.checked_add(12)? <= end {
        let (namesz, descsz, ty) = (u64::from(r.u32(note)?), u64::from(r.u32(note + 4)?), r.u32(note + 8)?);
        // ELF_NOTE_DESC_OFFSET / ELF_NOTE_NEXT_OFFSET: the header and name, then the descriptor,
        // each padded to the alignment.
        let desc = note.checked_add((12 + namesz).next_multiple_of(want))?;
        let next = desc.checked_add(descsz)?.next_multiple_of(want);
        if next > end {
            return None;
        }
        if ty == NT_GNU_PROPERTY_TYPE_0 && namesz == 4 && r.bytes::<4>(note + 12)? == *b"GNU\0" {
            let mut p = desc;
            while p + 8 <= desc + descsz {
                let (pr_type, datasz) = (r.u32(p)?, u64::from(r.u32(p + 4)?));
                if pr_type == GNU_PROPERTY_X86_ISA_1_NEEDED {
                    if datasz != 4 {
                        return None;
                    }
                    let isa_1 = r.u32(p + 8)?;
                    return Some(if isa_1 == 0 { 0 } else { 31 - isa_1.leading_zeros() });
                }
                p = (p + 8).checked_add(datasz.next_multiple_of(want))?;
            }
        }
        note = next;
    }
    None
}
