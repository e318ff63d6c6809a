//! glibc's `ld.so.cache`: the reader (both layouts) and the writer (the new layout only, the one
//! glibc 2.32+ writes and every loader since 2.32 reads first).
//!
//! Old layout: magic (11 bytes, padded to 12), `u32` count, entries of `{i32 flags, u32 key,
//! u32 value}`, then the string table; offsets count from the string table.
//! New layout: magic `glibc-ld.so.cache` + `1.1` (20 bytes), `u32` count, `u32` string table length,
//! `u8` flags (2: little-endian), 3 padding bytes, `u32` extension offset, 3 unused `u32`s (48
//! bytes), then entries of `{i32 flags, u32 key, u32 value, u32 osversion, u64 hwcap}`, the string
//! table, and the extension directory at the next 4-byte boundary; offsets count from the header.
//!
//! The loader binary-searches the entries with [`libcmp`], so the writer keeps ldconfig's order:
//! keys descending under `libcmp`, then flags descending, then the order entries were found.

use crate::error::LdCacheError;

const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const OLD_HEADER: usize = 16;
const OLD_ENTRY: usize = 12;
const NEW_HEADER: usize = 48;
const NEW_ENTRY: usize = 24;
/// `cache_file_new_flags_endian_little`: the loader checks it matches its own byte order.
const ENDIAN_LITTLE: u8 = 2;
/// `cache_extension_magic`, `(uint32_t) -358342284`.
const EXTENSION_MAGIC: u32 = 0xeaa4_2174;
/// `cache_extension_tag_generator`: a free-form string naming the writer.
const TAG_GENERATOR: u32 = 0;
/// `cache_extension_tag_glibc_hwcaps`: `u32` string offsets of the glibc-hwcaps subdirectory
/// names, sorted.
const TAG_GLIBC_HWCAPS: u32 = 1;
/// ldconfig sizes the extension directory for every tag it knows (`cache_extension_count`),
/// whether present or not, when it places the data after it.
const EXTENSION_TAGS: usize = 2;
/// `DL_CACHE_HWCAP_EXTENSION`: the entry's low 32 hwcap bits index the glibc-hwcaps section
/// (bits 32..42 hold the library's ISA level).
pub const HWCAP_EXTENSION: u64 = 1 << 62;
const HWCAP_ISA_LEVEL_MASK: u64 = (1 << 10) - 1;

/// `FLAG_ELF`: an ELF library whose C library could not be told.
pub const FLAG_ELF: i32 = 0x0001;
/// `FLAG_ELF_LIBC5`.
pub const FLAG_ELF_LIBC5: i32 = 0x0002;
/// `FLAG_ELF_LIBC6`: linked against glibc.
pub const FLAG_ELF_LIBC6: i32 = 0x0003;
/// `FLAG_X8664_LIB64`: x86-64.
pub const FLAG_X8664_LIB64: i32 = 0x0300;
/// `FLAG_X8664_LIBX32`: x32.
pub const FLAG_X8664_LIBX32: i32 = 0x0800;
/// `FLAG_AARCH64_LIB64`.
pub const FLAG_AARCH64_LIB64: i32 = 0x0a00;
const FLAG_TYPE_MASK: i32 = 0x00ff;
const FLAG_ARCH_MASK: i32 = 0xff00;

/// The architecture bits of 64-bit libraries for the machine this runs on.
pub fn host_arch_flags() -> Option<i32> {
    match std::env::consts::ARCH {
        "x86_64" => Some(FLAG_X8664_LIB64),
        "aarch64" => Some(FLAG_AARCH64_LIB64),
        "powerpc64" => Some(0x0500),
        _ => None,
    }
}

/// One library the cache knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The lookup key: the library's SONAME, e.g. `libcuda.so.1`.
    pub key: String,
    /// Where it is, e.g. `/usr/lib/x86_64-linux-gnu/libcuda.so.1` (inside the root the cache
    /// belongs to).
    pub path: String,
    /// glibc's flags: library type in the low byte, architecture in the high byte.
    pub flags: i32,
    /// The hardware-capability word (0 for libraries outside `glibc-hwcaps` subdirectories).
    pub hwcap: u64,
}

impl Entry {
    /// True for a glibc library built for the architecture whose flag bits are `arch`.
    pub fn is_arch(&self, arch: i32) -> bool {
        self.flags & FLAG_TYPE_MASK == FLAG_ELF_LIBC6 && self.flags & FLAG_ARCH_MASK == arch
    }
}

/// glibc's `_dl_cache_libcmp`: runs of digits compare as numbers, a digit sorts after any other
/// byte, other bytes compare as C `char`. The loader searches with it, so the writer must sort
/// with exactly it (including `int` wrap-around on absurdly long digit runs, and `char`
/// signedness, which is the target's).
pub fn libcmp(a: &[u8], b: &[u8]) -> i32 {
    let at = |s: &[u8], i: usize| s.get(i).copied().unwrap_or(0);
    let chr = |c: u8| c as std::ffi::c_char as i32;
    let (mut i, mut j) = (0, 0);
    while at(a, i) != 0 {
        let (c1, c2) = (at(a, i), at(b, j));
        if c1.is_ascii_digit() {
            if !c2.is_ascii_digit() {
                return 1;
            }
            let mut v1: i32 = 0;
            while at(a, i).is_ascii_digit() {
                v1 = v1.wrapping_mul(10).wrapping_add(i32::from(at(a, i) - b'0'));
                i += 1;
            }
            let mut v2: i32 = 0;
            while at(b, j).is_ascii_digit() {
                v2 = v2.wrapping_mul(10).wrapping_add(i32::from(at(b, j) - b'0'));
                j += 1;
            }
            if v1 != v2 {
                return v1.wrapping_sub(v2);
            }
        } else if c2.is_ascii_digit() {
            return -1;
        } else if c1 != c2 {
            return chr(c1) - chr(c2);
        } else {
            i += 1;
            j += 1;
        }
    }
    chr(at(a, i)) - chr(at(b, j))
}

/// glibc's `dl_cache_hwcap_extension`: the entry belongs to a glibc-hwcaps subdirectory.
pub fn is_hwcaps_entry(hwcap: u64) -> bool {
    ((hwcap >> 32) & !HWCAP_ISA_LEVEL_MASK) == (HWCAP_EXTENSION >> 32)
}

/// ldconfig's `compare` for two entries (negative: `a` goes first): keys descending, flags
/// descending, glibc-hwcaps entries first and by subdirectory name (their section indices follow
/// name order), then legacy hwcap entries by bit count and value.
fn compare(a: &Entry, b: &Entry) -> i32 {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let res = libcmp(b.key.as_bytes(), a.key.as_bytes());
    if res != 0 {
        return res;
    }
    let descending = |x: std::cmp::Ordering| match x {
        Less => 1,
        Greater => -1,
        Equal => 0,
    };
    let flags = descending(a.flags.cmp(&b.flags));
    if flags != 0 {
        return flags;
    }
    match (is_hwcaps_entry(a.hwcap), is_hwcaps_entry(b.hwcap)) {
        (true, false) => -1,
        (false, true) => 1,
        (true, true) => match (a.hwcap as u32).cmp(&(b.hwcap as u32)) {
            Less => -1,
            Greater => 1,
            Equal => 0,
        },
        (false, false) => {
            let bits = descending(a.hwcap.count_ones().cmp(&b.hwcap.count_ones()));
            if bits != 0 { bits } else { descending(a.hwcap.cmp(&b.hwcap)) }
        }
    }
}

/// Puts entries (given in the order they were found) in the cache's order. ldconfig inserts each
/// entry after every entry that does not compare greater; a stable merge sort gives the same order
/// and, unlike `slice::sort_by`, never panics should `libcmp` wrap around and stop being a total
/// order on hostile names.
///
/// Among entries of one SONAME the loader takes the first usable one: `search_cache` in
/// elf/dl-cache.c binary-searches for a matching key, walks back to the first entry with that key
/// and then forward, returning the first whose flags (and hwcap, for glibc-hwcaps entries) suit
/// the process. So for two plain entries of the same name and flags, the one found first in the
/// scan order (an earlier directory) is the one loaded.
pub fn sort_entries(entries: &mut Vec<Entry>) {
    fn merge_sort(v: Vec<Entry>) -> Vec<Entry> {
        if v.len() <= 1 {
            return v;
        }
        let mut left = v;
        let right = left.split_off(left.len() / 2);
        let (left, right) = (merge_sort(left), merge_sort(right));
        let mut out = Vec::with_capacity(left.len() + right.len());
        let (mut l, mut r) = (left.into_iter().peekable(), right.into_iter().peekable());
        while let (Some(a), Some(b)) = (l.peek(), r.peek()) {
            // Ties keep the earlier (left) one first: stability.
            if compare(a, b) <= 0 {
                out.push(l.next().unwrap());
            } else {
                out.push(r.next().unwrap());
            }
        }
        out.extend(l);
        out.extend(r);
        out
    }
    *entries = merge_sort(std::mem::take(entries));
}

/// The string table as glibc's `stringtable_finalize` lays it out: each distinct string once,
/// sorted by its reversed bytes in descending order, a string that ends the previous one shares
/// its tail. Returns the table and each input string's offset in it.
fn string_table(strings: &[&str]) -> (Vec<u8>, std::collections::HashMap<String, u32>) {
    let mut unique: Vec<&str> = strings.to_vec();
    unique.sort_unstable();
    unique.dedup();
    unique.sort_unstable_by(|a, b| b.bytes().rev().cmp(a.bytes().rev()));
    let mut offsets = std::collections::HashMap::with_capacity(unique.len());
    let mut table = Vec::new();
    let mut previous: Option<(&str, usize)> = None;
    for s in unique {
        let offset = match previous {
            Some((p, at)) if p.ends_with(s) => at + p.len() - s.len(),
            _ => {
                let at = table.len();
                table.extend_from_slice(s.as_bytes());
                table.push(0);
                at
            }
        };
        offsets.insert(s.to_owned(), offset as u32);
        previous = Some((s, offset));
    }
    (table, offsets)
}

/// Encodes `entries` (already in cache order, see [`sort_entries`]) as a new-format cache whose
/// generator extension names `generator`. Fails only past the format's 32-bit offsets.
pub fn encode(entries: &[Entry], generator: &str) -> Result<Vec<u8>, LdCacheError> {
    encode_with_hwcaps(entries, generator, &[], &[])
}

/// [`encode`] for a cache with glibc-hwcaps entries: `seen` are all the subdirectory names found
/// (ldconfig puts each in the string table), `used` the sorted names that hold a library (the
/// hwcaps section; an entry's index is its name's position there).
pub fn encode_with_hwcaps(
    entries: &[Entry],
    generator: &str,
    seen: &[&str],
    used: &[&str],
) -> Result<Vec<u8>, LdCacheError> {
    let too_big = || LdCacheError::TooMany { what: "bytes in the cache", limit: u32::MAX as usize };
    let mut strings = Vec::with_capacity(entries.len() * 2 + seen.len() + used.len());
    for e in entries {
        strings.push(e.key.as_str());
        strings.push(e.path.as_str());
    }
    strings.extend_from_slice(seen);
    strings.extend_from_slice(used);
    let (table, offsets) = string_table(&strings);
    let table_start = NEW_HEADER + entries.len() * NEW_ENTRY;
    let extension = (table_start + table.len()).next_multiple_of(4);
    let sections = 1 + usize::from(!used.is_empty());
    let hwcaps_at = extension + 8 + EXTENSION_TAGS * 16;
    let generator_at = if used.is_empty() { extension + 8 + 16 } else { hwcaps_at + 4 * used.len() };
    let total = generator_at + generator.len();
    let total32 = u32::try_from(total).map_err(|_| too_big())?;
    let u32le = |out: &mut Vec<u8>, v: u32| out.extend_from_slice(&v.to_le_bytes());
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(NEW_MAGIC);
    u32le(&mut out, entries.len() as u32);
    u32le(&mut out, table.len() as u32);
    out.extend_from_slice(&[ENDIAN_LITTLE, 0, 0, 0]);
    u32le(&mut out, extension as u32);
    out.extend_from_slice(&[0; 12]);
    for e in entries {
        out.extend_from_slice(&e.flags.to_le_bytes());
        u32le(&mut out, table_start as u32 + offsets[e.key.as_str()]);
        u32le(&mut out, table_start as u32 + offsets[e.path.as_str()]);
        u32le(&mut out, 0);
        out.extend_from_slice(&e.hwcap.to_le_bytes());
    }
    out.extend_from_slice(&table);
    out.resize(extension, 0);
    u32le(&mut out, EXTENSION_MAGIC);
    u32le(&mut out, sections as u32);
    u32le(&mut out, TAG_GENERATOR);
    u32le(&mut out, 0);
    u32le(&mut out, generator_at as u32);
    u32le(&mut out, generator.len() as u32);
    if !used.is_empty() {
        u32le(&mut out, TAG_GLIBC_HWCAPS);
        u32le(&mut out, 0);
        u32le(&mut out, hwcaps_at as u32);
        u32le(&mut out, 4 * used.len() as u32);
        for name in used {
            u32le(&mut out, table_start as u32 + offsets[*name]);
        }
    }
    out.extend_from_slice(generator.as_bytes());
    debug_assert_eq!(out.len() as u32, total32);
    Ok(out)
}

fn truncated(offset: usize, len: usize) -> LdCacheError {
    LdCacheError::Truncated { offset, len }
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, LdCacheError> {
    at.checked_add(4)
        .and_then(|end| b.get(at..end))
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or(truncated(at, b.len()))
}

fn u64_at(b: &[u8], at: usize) -> Result<u64, LdCacheError> {
    Ok(u64::from(u32_at(b, at)?) | (u64::from(u32_at(b, at + 4)?) << 32))
}

fn str_at(b: &[u8], at: usize) -> Result<String, LdCacheError> {
    let rest = b.get(at..).ok_or(truncated(at, b.len()))?;
    let end = rest.iter().position(|&c| c == 0).ok_or(truncated(b.len(), b.len()))?;
    Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
}

/// Parses a whole cache file, in the file's order. Little-endian layouts only (x86-64, aarch64,
/// ppc64le): a root is read on the machine it serves.
pub fn parse(bytes: &[u8]) -> Result<Vec<Entry>, LdCacheError> {
    if bytes.starts_with(NEW_MAGIC) {
        return parse_new(bytes, 0);
    }
    if !bytes.starts_with(OLD_MAGIC) {
        return Err(LdCacheError::BadMagic);
    }
    let count = u32_at(bytes, 12)? as usize;
    let strings = count
        .checked_mul(OLD_ENTRY)
        .and_then(|n| n.checked_add(OLD_HEADER))
        .ok_or(truncated(usize::MAX, bytes.len()))?;
    if strings > bytes.len() {
        return Err(truncated(strings, bytes.len()));
    }
    // A new-format cache may follow the old entries, aligned to 8 bytes; it is more complete.
    let aligned = strings.next_multiple_of(8);
    for start in [strings, aligned] {
        if bytes.get(start..).is_some_and(|b| b.starts_with(NEW_MAGIC)) {
            return parse_new(bytes, start);
        }
    }
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let at = OLD_HEADER + i * OLD_ENTRY;
        let flags = u32_at(bytes, at)? as i32;
        let key = str_at(bytes, strings.saturating_add(u32_at(bytes, at + 4)? as usize))?;
        let path = str_at(bytes, strings.saturating_add(u32_at(bytes, at + 8)? as usize))?;
        out.push(Entry { key, path, flags, hwcap: 0 });
    }
    Ok(out)
}

fn parse_new(bytes: &[u8], base: usize) -> Result<Vec<Entry>, LdCacheError> {
    let count = u32_at(bytes, base + 20)? as usize;
    let end = count
        .checked_mul(NEW_ENTRY)
        .and_then(|n| n.checked_add(base + NEW_HEADER))
        .ok_or(truncated(usize::MAX, bytes.len()))?;
    if end > bytes.len() {
        return Err(truncated(end, bytes.len()));
    }
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let at = base + NEW_HEADER + i * NEW_ENTRY;
        let flags = u32_at(bytes, at)? as i32;
        let key = str_at(bytes, base.saturating_add(u32_at(bytes, at + 4)? as usize))?;
        let path = str_at(bytes, base.saturating_add(u32_at(bytes, at + 8)? as usize))?;
        let hwcap = u64_at(bytes, at + 16)?;
        out.push(Entry { key, path, flags, hwcap });
    }
    Ok(out)
}

/// Where a new-format cache keeps its generator string: the extension slot naming it, and the
/// string's offset and size.
fn generator_slot(bytes: &[u8]) -> Option<(usize, usize, usize)> {
    if !bytes.starts_with(NEW_MAGIC) {
        return None;
    }
    let ext = u32_at(bytes, 32).ok()? as usize;
    if ext == 0 || u32_at(bytes, ext).ok()? != EXTENSION_MAGIC {
        return None;
    }
    let count = u32_at(bytes, ext + 4).ok()? as usize;
    let slot = (0..count.min(64))
        .map(|i| ext + 8 + i * 16)
        .find(|&s| u32_at(bytes, s).ok() == Some(TAG_GENERATOR))?;
    Some((slot, u32_at(bytes, slot + 8).ok()? as usize, u32_at(bytes, slot + 12).ok()? as usize))
}

/// `bytes` with its generator string replaced by `generator`, when the generator is the file's
/// last part (as ldconfig and [`encode`] write it). For comparing caches of different writers.
pub fn with_generator(bytes: &[u8], generator: &str) -> Option<Vec<u8>> {
    let (slot, off, size) = generator_slot(bytes)?;
    if off.checked_add(size)? != bytes.len() {
        return None;
    }
    let mut out = bytes[..off].to_vec();
    out[slot + 12..slot + 16].copy_from_slice(&u32::try_from(generator.len()).ok()?.to_le_bytes());
    out.extend_from_slice(generator.as_bytes());
    Some(out)
}

/// The generator string of a new-format cache (`ldconfig (GNU libc) 2.36`, ours), if it has one.
pub fn generator(bytes: &[u8]) -> Option<String> {
    let (_, off, size) = generator_slot(bytes)?;
    bytes.get(off..off.checked_add(size)?).map(|b| String::from_utf8_lossy(b).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const X86_64: i32 = 0x0303;
    const I386: i32 = 0x0003;

    fn entry(flags: i32, key: &str, path: &str) -> Entry {
        Entry { key: key.into(), path: path.into(), flags, hwcap: 0 }
    }

    fn entries() -> Vec<Entry> {
        vec![
            entry(X86_64, "libcuda.so.1", "/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1"),
            entry(I386, "libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1"),
            entry(X86_64, "libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
        ]
    }

    /// An old-format cache (glibc < 2.32 `ldconfig -c old`), written by hand.
    fn old_format(entries: &[Entry]) -> Vec<u8> {
        let mut strings = Vec::new();
        let mut offsets = Vec::new();
        for e in entries {
            let k = strings.len();
            strings.extend_from_slice(e.key.as_bytes());
            strings.push(0);
            let p = strings.len();
            strings.extend_from_slice(e.path.as_bytes());
            strings.push(0);
            offsets.push((k as u32, p as u32));
        }
        let mut out = Vec::new();
        out.extend_from_slice(OLD_MAGIC);
        out.push(0);
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for (e, (k, p)) in entries.iter().zip(&offsets) {
            out.extend_from_slice(&e.flags.to_le_bytes());
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(&p.to_le_bytes());
        }
        out.extend_from_slice(&strings);
        out
    }

    #[test]
    fn round_trips_the_new_format() {
        let bytes = encode(&entries(), "test").unwrap();
        assert_eq!(parse(&bytes).unwrap(), entries());
        assert_eq!(generator(&bytes).as_deref(), Some("test"));
    }

    #[test]
    fn header_fields_are_where_the_loader_reads_them() {
        let bytes = encode(&entries(), "g").unwrap();
        assert_eq!(&bytes[..20], NEW_MAGIC);
        assert_eq!(u32_at(&bytes, 20).unwrap(), 3);
        let strings = u32_at(&bytes, 24).unwrap() as usize;
        assert_eq!(bytes[28], ENDIAN_LITTLE);
        let ext = u32_at(&bytes, 32).unwrap() as usize;
        assert_eq!(ext % 4, 0);
        assert!(
            ext >= NEW_HEADER + 3 * NEW_ENTRY + strings && ext < NEW_HEADER + 3 * NEW_ENTRY + strings + 4
        );
        assert_eq!(bytes.len(), ext + 24 + 1);
    }

    #[test]
    fn shares_suffixes_in_the_string_table() {
        // Each key is the tail of its path: stored once, inside the path.
        let bytes = encode(&entries(), "").unwrap();
        let strings = u32_at(&bytes, 24).unwrap() as usize;
        let unshared: usize = [
            "/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1",
            "/usr/lib/i386-linux-gnu/libcuda.so.1",
            "/lib/x86_64-linux-gnu/libc.so.6",
        ]
        .iter()
        .map(|s| s.len() + 1)
        .sum();
        assert_eq!(strings, unshared);
        let key = u32_at(&bytes, NEW_HEADER + 4).unwrap();
        let path = u32_at(&bytes, NEW_HEADER + 8).unwrap();
        assert!(key > path);
    }

    #[test]
    fn libcmp_compares_numbers_as_numbers() {
        use std::cmp::Ordering::*;
        let cases = [
            ("libfoo.so.10", "libfoo.so.9", Greater),
            ("libfoo.so.1", "libfoo.so.1", Equal),
            ("libfoo.so.01", "libfoo.so.1", Equal),
            ("libfoo.so.1.2", "libfoo.so.1", Greater),
            ("libfoo.so", "libfoo.so.1", Less),
            ("libfoo2.so", "libfoo.so", Greater), // a digit sorts after '.'
            ("liba.so", "libb.so", Less),
            ("libz.so.1", "libc.so.6", Greater),
        ];
        for (a, b, want) in cases {
            assert_eq!(libcmp(a.as_bytes(), b.as_bytes()).cmp(&0), want, "{a} vs {b}");
            assert_eq!(libcmp(b.as_bytes(), a.as_bytes()).cmp(&0), want.reverse(), "{b} vs {a}");
        }
        // Wraps like C's int instead of panicking.
        let _ = libcmp(b"lib99999999999999999999.so", b"lib1.so");
    }

    #[test]
    fn sorts_like_ldconfig() {
        let mut v = vec![
            entry(I386, "libc.so.6", "/a/libc.so.6"),
            entry(X86_64, "libm.so.6", "/a/libm.so.6"),
            entry(X86_64, "libc.so.6", "/a/libc.so.6"),
            entry(X86_64, "libc.so.6", "/b/libc.so.6"),
            entry(X86_64, "libfoo.so.10", "/a/libfoo.so.10"),
            entry(X86_64, "libfoo.so.9", "/a/libfoo.so.9"),
        ];
        sort_entries(&mut v);
        let got: Vec<(&str, &str)> = v.iter().map(|e| (e.key.as_str(), e.path.as_str())).collect();
        assert_eq!(
            got,
            [
                ("libm.so.6", "/a/libm.so.6"),
                ("libfoo.so.10", "/a/libfoo.so.10"),
                ("libfoo.so.9", "/a/libfoo.so.9"),
                ("libc.so.6", "/a/libc.so.6"), // x86-64 (0x303) before i386 (0x3), found order kept
                ("libc.so.6", "/b/libc.so.6"),
                ("libc.so.6", "/a/libc.so.6"),
            ]
        );
        assert_eq!(v[5].flags, I386);
    }

    #[test]
    fn reads_the_old_format() {
        assert_eq!(parse(&old_format(&entries())).unwrap(), entries());
    }

    #[test]
    fn prefers_a_new_cache_embedded_after_the_old_one() {
        let mut bytes = old_format(&[entry(X86_64, "libold.so.1", "/old/libold.so.1")]);
        bytes.truncate(OLD_HEADER + OLD_ENTRY);
        while !bytes.len().is_multiple_of(8) {
            bytes.push(0);
        }
        // Offsets of an embedded cache count from its own header.
        let new = encode(&entries(), "").unwrap();
        bytes.extend_from_slice(&new);
        assert_eq!(parse(&bytes).unwrap(), entries());
    }

    #[test]
    fn reads_this_hosts_cache_as_ldconfig_does() {
        let bytes = std::fs::read("/etc/ld.so.cache").expect("this host has an ld.so.cache");
        let entries = parse(&bytes).unwrap();
        let out = std::process::Command::new("ldconfig").arg("-p").output().expect("ldconfig runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let count: usize = text.split_whitespace().next().unwrap().parse().unwrap();
        assert_eq!(entries.len(), count);
        let libc =
            entries.iter().find(|e| e.key == "libc.so.6" && host_arch_flags().is_some_and(|a| e.is_arch(a)));
        let libc = libc.expect("libc.so.6 for this architecture");
        assert!(
            text.contains(&format!("libc.so.6 (libc6,x86-64) => {}", libc.path))
                || !cfg!(target_arch = "x86_64")
        );
    }

    #[test]
    fn filters_by_architecture() {
        let x86: Vec<_> = entries().into_iter().filter(|e| e.is_arch(FLAG_X8664_LIB64)).collect();
        assert_eq!(x86.len(), 2);
        assert!(x86.iter().all(|e| !e.path.contains("i386")));
    }

    #[test]
    fn rejects_garbage_and_truncation() {
        assert!(matches!(parse(b"hello world, not a cache"), Err(LdCacheError::BadMagic)));
        let mut bytes = encode(&entries(), "").unwrap();
        bytes.truncate(60);
        assert!(matches!(parse(&bytes), Err(LdCacheError::Truncated { .. })));
        // A count that overflows, and an offset past the end.
        let mut bytes = encode(&entries(), "").unwrap();
        bytes[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(parse(&bytes), Err(LdCacheError::Truncated { .. })));
        let mut bytes = encode(&entries(), "").unwrap();
        bytes[NEW_HEADER + 4..NEW_HEADER + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(parse(&bytes), Err(LdCacheError::Truncated { .. })));
    }
}
