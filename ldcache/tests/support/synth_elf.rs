//! Small ELF shared objects built in memory, for the unit tests (`src/elf.rs`, `src/lib.rs`) and
//! the benches (`benches/`), which include this file with `#[path]`: a header, two program
//! headers (`PT_LOAD` mapping the whole file at [`LOAD_VADDR`], `PT_DYNAMIC`), the string table,
//! then the dynamic array, entries exactly as given. Nothing is checked, so hostile shapes are as
//! easy to make as real ones.
#![allow(dead_code)]

/// `DT_NULL`: ends the dynamic array.
pub const DT_NULL: u64 = 0;
/// `DT_NEEDED`: a library this one needs (string table offset).
pub const DT_NEEDED: u64 = 1;
/// `DT_STRTAB`: the string table's address.
pub const DT_STRTAB: u64 = 5;
/// `DT_SONAME`: the library's own name (string table offset).
pub const DT_SONAME: u64 = 14;
/// `e_machine` of x86-64.
pub const EM_X86_64: u16 = 62;
/// `e_machine` of i386.
pub const EM_386: u16 = 3;
/// Where the `PT_LOAD` segment maps file offset 0.
pub const LOAD_VADDR: u64 = 0x1000;

/// A shared object to build.
pub struct SharedObject {
    /// `e_machine`.
    pub machine: u16,
    /// ELFCLASS64 when true, ELFCLASS32 otherwise.
    pub is64: bool,
    /// The string table's bytes.
    pub strings: Vec<u8>,
    /// The dynamic array, in order; no `DT_NULL` is added.
    pub dynamic: Vec<(u64, u64)>,
    /// More segments, after the dynamic array, each at a multiple of its alignment:
    /// `(p_type, bytes, p_align)` (`PT_INTERP`, `PT_GNU_PROPERTY`).
    pub segments: Vec<(u32, Vec<u8>, u64)>,
}

impl SharedObject {
    /// An x86-64 object with `strings` and the dynamic array `dynamic(strtab_vaddr)`.
    pub fn x86_64(strings: &[u8], dynamic: impl FnOnce(u64) -> Vec<(u64, u64)>) -> SharedObject {
        let mut so = SharedObject {
            machine: EM_X86_64,
            is64: true,
            strings: strings.to_vec(),
            dynamic: Vec::new(),
            segments: Vec::new(),
        };
        so.dynamic = dynamic(so.strtab_vaddr());
        so
    }

    fn sizes(&self) -> (u64, u64, u64) {
        if self.is64 { (64, 56, 16) } else { (52, 32, 8) }
    }

    /// The file offset of the string table.
    pub fn strtab_offset(&self) -> u64 {
        let (eh, ph, _) = self.sizes();
        eh + (2 + self.segments.len() as u64) * ph
    }

    /// The string table's address, the value `DT_STRTAB` holds.
    pub fn strtab_vaddr(&self) -> u64 {
        LOAD_VADDR + self.strtab_offset()
    }

    /// The address of the dynamic array.
    pub fn dynamic_vaddr(&self) -> u64 {
        LOAD_VADDR + self.dynamic_offset()
    }

    /// The file offset of the dynamic array.
    pub fn dynamic_offset(&self) -> u64 {
        self.strtab_offset() + self.strings.len() as u64
    }

    /// The file's bytes.
    pub fn build(&self) -> Vec<u8> {
        let (eh, ph, dynsz) = self.sizes();
        let is64 = self.is64;
        let word = |b: &mut Vec<u8>, v: u64| {
            if is64 {
                b.extend_from_slice(&v.to_le_bytes())
            } else {
                b.extend_from_slice(&(v as u32).to_le_bytes())
            }
        };
        let dyn_off = self.dynamic_offset();
        let dyn_size = self.dynamic.len() as u64 * dynsz;
        let mut phdrs = vec![(1u32, 0, 0, 8), (2u32, dyn_off, dyn_size, 8)];
        let mut at = dyn_off + dyn_size;
        for (ty, bytes, align) in &self.segments {
            at = at.next_multiple_of((*align).max(1));
            phdrs.push((*ty, at, bytes.len() as u64, *align));
            at += bytes.len() as u64;
        }
        let total = at;
        phdrs[0].2 = total;
        let mut b = vec![0u8; eh as usize];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = if is64 { 2 } else { 1 };
        b[5] = 1;
        b[6] = 1;
        b[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
        b[18..20].copy_from_slice(&self.machine.to_le_bytes());
        if is64 {
            b[32..40].copy_from_slice(&eh.to_le_bytes());
            b[54..56].copy_from_slice(&(ph as u16).to_le_bytes());
            b[56..58].copy_from_slice(&(phdrs.len() as u16).to_le_bytes());
        } else {
            b[28..32].copy_from_slice(&(eh as u32).to_le_bytes());
            b[42..44].copy_from_slice(&(ph as u16).to_le_bytes());
            b[44..46].copy_from_slice(&(phdrs.len() as u16).to_le_bytes());
        }
        for (ty, off, size, align) in phdrs {
            let vaddr = LOAD_VADDR + off;
            b.extend_from_slice(&ty.to_le_bytes());
            if is64 {
                b.extend_from_slice(&0u32.to_le_bytes());
                for v in [off, vaddr, vaddr, size, size, align] {
                    word(&mut b, v);
                }
            } else {
                for v in [off, vaddr, vaddr, size, size, 0, align] {
                    word(&mut b, v);
                }
            }
        }
        b.extend_from_slice(&self.strings);
        for &(tag, val) in &self.dynamic {
            word(&mut b, tag);
            word(&mut b, val);
        }
        for (_, bytes, align) in &self.segments {
            b.resize((b.len() as u64).next_multiple_of((*align).max(1)) as usize, 0);
            b.extend_from_slice(bytes);
        }
        assert_eq!(b.len() as u64, total);
        b
    }
}

/// The object from issue 32: `needed` `DT_NEEDED` entries all naming one string of `name_len`
/// bytes (`A`s), a `DT_SONAME` when given, then `DT_NULL` (16,383 entries of a 4,095-byte name
/// keep within every limit the reader had before the issue).
pub fn needed_bomb(needed: usize, name_len: usize, soname: Option<&str>) -> Vec<u8> {
    let mut strings = vec![0u8];
    strings.extend(std::iter::repeat_n(b'A', name_len));
    strings.push(0);
    let soname_at = strings.len() as u64;
    if let Some(s) = soname {
        strings.extend_from_slice(s.as_bytes());
        strings.push(0);
    }
    SharedObject::x86_64(&strings, |strtab| {
        let mut d = vec![(DT_STRTAB, strtab)];
        d.extend(std::iter::repeat_n((DT_NEEDED, 1), needed));
        if soname.is_some() {
            d.push((DT_SONAME, soname_at));
        }
        d.push((DT_NULL, 0));
        d
    })
    .build()
}

/// A file as costly as the reader allows per name: `names` distinct `DT_NEEDED` strings of
/// `name_len` bytes each (`A`s), each in a read window of its own, then `DT_NULL`.
pub fn distinct_long_names(names: usize, name_len: usize) -> Vec<u8> {
    let mut strings = vec![0u8];
    let mut at = Vec::new();
    for _ in 0..names {
        at.push(strings.len() as u64);
        strings.extend(std::iter::repeat_n(b'A', name_len));
        strings.push(0);
    }
    SharedObject::x86_64(&strings, |strtab| {
        let mut d = vec![(DT_STRTAB, strtab)];
        d.extend(at.iter().map(|&a| (DT_NEEDED, a)));
        d.push((DT_NULL, 0));
        d
    })
    .build()
}

/// A plain x86-64 library: `DT_NEEDED libc.so.6` and its SONAME.
pub fn plain_library(soname: &str) -> Vec<u8> {
    let mut strings = b"\0libc.so.6\0".to_vec();
    let at = strings.len() as u64;
    strings.extend_from_slice(soname.as_bytes());
    strings.push(0);
    SharedObject::x86_64(&strings, |strtab| {
        vec![(DT_STRTAB, strtab), (DT_NEEDED, 1), (DT_SONAME, at), (DT_NULL, 0)]
    })
    .build()
}
