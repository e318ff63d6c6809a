//! Reads a shared library's `DT_SONAME` from its ELF dynamic section.
//!
//! The SONAME is the name programs link against (`libcuda.so.1`); the container needs a link by
//! that name to each versioned library file (`libcuda.so.550.54.15`). Reading it from the file
//! itself works even where the driver root lacks the links. Only the few bytes needed are read
//! (header, program headers, dynamic section, one string), so a 100 MB library costs the same as a
//! stub.

use std::io;

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: u64 = 0;
const DT_STRTAB: u64 = 5;
const DT_SONAME: u64 = 14;
/// No real dynamic section is near this large; a bound keeps corrupt files from causing big reads.
const MAX_DYNAMIC: u64 = 64 * 1024;
const MAX_PHDRS: u64 = 256;

/// Random access to a file's bytes (`FileExt::read_at` for files; slices in tests).
pub trait ReadAt {
    /// Reads up to `len` bytes at `offset`; fewer at end of file.
    fn read_at(&self, offset: u64, len: usize) -> io::Result<Vec<u8>>;
}

impl ReadAt for [u8] {
    fn read_at(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(self.len());
        Ok(self[start..start.saturating_add(len).min(self.len())].to_vec())
    }
}

impl ReadAt for std::fs::File {
    fn read_at(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0; len];
        let mut filled = 0;
        while filled < len {
            let at = offset.saturating_add(filled as u64);
            match std::os::unix::fs::FileExt::read_at(self, &mut buf[filled..], at) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        buf.truncate(filled);
        Ok(buf)
    }
}

struct Layout {
    is64: bool,
    little: bool,
}

impl Layout {
    fn uint(&self, b: &[u8], at: usize, size: usize) -> Option<u64> {
        let s = b.get(at..at + size)?;
        let mut v = 0u64;
        for i in 0..size {
            let byte = if self.little { s[size - 1 - i] } else { s[i] };
            v = (v << 8) | u64::from(byte);
        }
        Some(v)
    }

    fn word(&self, b: &[u8], at: usize) -> Option<u64> {
        self.uint(b, at, if self.is64 { 8 } else { 4 })
    }
}

/// The library's SONAME; `Ok(None)` for a valid ELF file without one (or any file that is not ELF).
pub fn soname(file: &(impl ReadAt + ?Sized)) -> io::Result<Option<String>> {
    let head = file.read_at(0, 64)?;
    if head.len() < 52 || &head[..4] != b"\x7fELF" {
        return Ok(None);
    }
    let l = Layout { is64: head[4] == 2, little: head[5] == 1 };
    let (phoff, phentsize, phnum) = if l.is64 {
        (l.uint(&head, 32, 8), l.uint(&head, 54, 2), l.uint(&head, 56, 2))
    } else {
        (l.uint(&head, 28, 4), l.uint(&head, 42, 2), l.uint(&head, 44, 2))
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (phoff, phentsize, phnum) else { return Ok(None) };
    if phnum > MAX_PHDRS || phentsize < if l.is64 { 56 } else { 32 } {
        return Ok(None);
    }
    let phdrs = file.read_at(phoff, (phentsize * phnum) as usize)?;
    // (vaddr, offset, filesz) of loadable segments, to map the string table's address to the file.
    let mut loads = Vec::new();
    let mut dynamic = None;
    for i in 0..phnum as usize {
        let at = i * phentsize as usize;
        let Some(p_type) = l.uint(&phdrs, at, 4) else { break };
        let (offset, vaddr, filesz) = if l.is64 {
            (l.uint(&phdrs, at + 8, 8), l.uint(&phdrs, at + 16, 8), l.uint(&phdrs, at + 32, 8))
        } else {
            (l.uint(&phdrs, at + 4, 4), l.uint(&phdrs, at + 8, 4), l.uint(&phdrs, at + 16, 4))
        };
        let (Some(offset), Some(vaddr), Some(filesz)) = (offset, vaddr, filesz) else { break };
        match p_type as u32 {
            PT_LOAD => loads.push((vaddr, offset, filesz)),
            PT_DYNAMIC => dynamic = Some((offset, filesz.min(MAX_DYNAMIC))),
            _ => {}
        }
    }
    let Some((dyn_off, dyn_size)) = dynamic else { return Ok(None) };
    let dyns = file.read_at(dyn_off, dyn_size as usize)?;
    let entry = if l.is64 { 16 } else { 8 };
    let (mut strtab, mut name) = (None, None);
    for at in (0..dyns.len() / entry).map(|i| i * entry) {
        let (Some(tag), Some(val)) = (l.word(&dyns, at), l.word(&dyns, at + entry / 2)) else { break };
        match tag {
            DT_NULL => break,
            DT_STRTAB => strtab = Some(val),
            DT_SONAME => name = Some(val),
            _ => {}
        }
    }
    let (Some(strtab), Some(name)) = (strtab, name) else { return Ok(None) };
    // Every figure below comes from the file: a corrupt one must give "no SONAME", not an overflow.
    let Some(&(vaddr, offset, _)) = loads.iter().find(|(v, _, size)| strtab >= *v && strtab - v < *size)
    else {
        return Ok(None);
    };
    let Some(at) = (strtab - vaddr).checked_add(offset).and_then(|a| a.checked_add(name)) else {
        return Ok(None);
    };
    let bytes = file.read_at(at, 256)?;
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    Ok((end > 0).then(|| String::from_utf8_lossy(&bytes[..end]).into_owned()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal 64-bit little-endian shared object: header, PT_LOAD + PT_DYNAMIC, a dynamic
    /// section with DT_STRTAB/DT_SONAME, and a string table at a virtual address different from
    /// its file offset (as real libraries have).
    pub(crate) fn tiny_so(soname: &str) -> Vec<u8> {
        const VBASE: u64 = 0x40_0000;
        let phoff = 64u64;
        let dyn_off = phoff + 2 * 56;
        let str_off = dyn_off + 3 * 16;
        let mut strtab = vec![0u8];
        strtab.extend_from_slice(soname.as_bytes());
        strtab.push(0);
        let total = str_off + strtab.len() as u64;

        let mut b = Vec::new();
        b.extend_from_slice(b"\x7fELF");
        b.extend_from_slice(&[2, 1, 1, 0]);
        b.extend_from_slice(&[0; 8]);
        b.extend_from_slice(&3u16.to_le_bytes()); // ET_DYN
        b.extend_from_slice(&62u16.to_le_bytes()); // x86-64
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes()); // entry
        b.extend_from_slice(&phoff.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes()); // shoff
        b.extend_from_slice(&0u32.to_le_bytes()); // flags
        b.extend_from_slice(&64u16.to_le_bytes()); // ehsize
        b.extend_from_slice(&56u16.to_le_bytes()); // phentsize
        b.extend_from_slice(&2u16.to_le_bytes()); // phnum
        b.extend_from_slice(&[0; 6]); // shentsize, shnum, shstrndx
        let phdr = |b: &mut Vec<u8>, t: u32, off: u64, vaddr: u64, size: u64| {
            b.extend_from_slice(&t.to_le_bytes());
            b.extend_from_slice(&4u32.to_le_bytes());
            b.extend_from_slice(&off.to_le_bytes());
            b.extend_from_slice(&vaddr.to_le_bytes());
            b.extend_from_slice(&vaddr.to_le_bytes());
            b.extend_from_slice(&size.to_le_bytes());
            b.extend_from_slice(&size.to_le_bytes());
            b.extend_from_slice(&8u64.to_le_bytes());
        };
        phdr(&mut b, PT_LOAD, 0, VBASE, total);
        phdr(&mut b, PT_DYNAMIC, dyn_off, VBASE + dyn_off, 3 * 16);
        for (tag, val) in [(DT_STRTAB, VBASE + str_off), (DT_SONAME, 1), (DT_NULL, 0)] {
            b.extend_from_slice(&tag.to_le_bytes());
            b.extend_from_slice(&val.to_le_bytes());
        }
        b.extend_from_slice(&strtab);
        b
    }

    #[test]
    fn reads_the_soname_of_a_built_object() {
        assert_eq!(soname(tiny_so("libcuda.so.1").as_slice()).unwrap().as_deref(), Some("libcuda.so.1"));
    }

    #[test]
    fn non_elf_and_truncated_files_have_no_soname() {
        assert_eq!(soname(b"just text".as_slice()).unwrap(), None);
        let mut b = tiny_so("libx.so.1");
        b.truncate(150);
        assert_eq!(soname(b.as_slice()).unwrap(), None);
    }

    #[test]
    fn corrupt_sizes_and_offsets_do_not_overflow() {
        // PT_LOAD p_filesz (program header 0, byte 32) at its maximum: the address test must not wrap.
        let mut b = tiny_so("libcuda.so.1");
        b[64 + 32..64 + 40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(soname(b.as_slice()).unwrap().as_deref(), Some("libcuda.so.1"));
        // DT_SONAME's string offset (second dynamic entry's value) at its maximum.
        let mut b = tiny_so("libcuda.so.1");
        let soname_val = 64 + 2 * 56 + 16 + 8;
        b[soname_val..soname_val + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(soname(b.as_slice()).unwrap(), None);
    }

    #[test]
    fn reads_the_soname_of_the_hosts_libc() {
        // A real library built by a real toolchain.
        let candidates =
            ["/lib/x86_64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6", "/lib64/libc.so.6"];
        let path =
            candidates.iter().find(|p| std::path::Path::new(p).exists()).expect("a glibc on this host");
        let file = std::fs::File::open(path).unwrap();
        assert_eq!(soname(&file).unwrap().as_deref(), Some("libc.so.6"));
    }
}
