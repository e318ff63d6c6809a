//! A native reader for glibc's `ld.so.cache`, the dynamic linker's index of libraries.
//!
//! The cache tells where a driver root keeps libraries outside the usual directories (Debian's
//! `nvidia/current`, distribution-specific paths), without running `ldconfig -p`. Two layouts exist
//! and both are read: the old `ld.so-1.7.0` one (possibly followed by a new one, which is then
//! preferred), and the `glibc-ld.so.cache1.1` one that glibc 2.32+ writes alone.
//!
//! Old layout: magic (11 bytes, padded to 12), `u32` count, entries of `{i32 flags, u32 key,
//! u32 value}`, then the string table; offsets count from the string table.
//! New layout: magic `glibc-ld.so.cache` + `1.1` (20 bytes), `u32` count, `u32` string table length,
//! `u8` flags, 3 padding bytes, `u32` extension offset, 3 unused `u32`s (48 bytes), then entries of
//! `{i32 flags, u32 key, u32 value, u32 osversion, u64 hwcap}`; offsets count from the new header.

const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const OLD_HEADER: usize = 16;
const OLD_ENTRY: usize = 12;
const NEW_HEADER: usize = 48;
const NEW_ENTRY: usize = 24;

/// `flags & FLAG_TYPE_MASK` for libraries linked against glibc.
const FLAG_ELF_LIBC6: i32 = 0x0003;
const FLAG_TYPE_MASK: i32 = 0x00ff;
const FLAG_ARCH_MASK: i32 = 0xff00;

/// The architecture bits of 64-bit libraries for the machine this runs on.
pub fn host_arch_flags() -> Option<i32> {
    match std::env::consts::ARCH {
        "x86_64" => Some(0x0300),
        "aarch64" => Some(0x0a00),
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
}

impl Entry {
    /// True for a glibc library built for the architecture whose flag bits are `arch`.
    pub fn is_arch(&self, arch: i32) -> bool {
        self.flags & FLAG_TYPE_MASK == FLAG_ELF_LIBC6 && self.flags & FLAG_ARCH_MASK == arch
    }
}

/// Why a cache could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LdCacheError {
    /// Neither known magic at the start of the file.
    #[error("not an ld.so.cache (unknown magic); regenerate it with `ldconfig -r <driver root>`")]
    BadMagic,
    /// The file ends before the structure it announces.
    #[error(
        "truncated at byte {offset} (file is {len} bytes); regenerate it with `ldconfig -r <driver root>`"
    )]
    Truncated {
        /// Where the missing data should have been.
        offset: usize,
        /// File size.
        len: usize,
    },
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, LdCacheError> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or(LdCacheError::Truncated { offset: at, len: b.len() })
}

fn str_at(b: &[u8], at: usize) -> Result<String, LdCacheError> {
    let rest = b.get(at..).ok_or(LdCacheError::Truncated { offset: at, len: b.len() })?;
    let end =
        rest.iter().position(|&c| c == 0).ok_or(LdCacheError::Truncated { offset: b.len(), len: b.len() })?;
    Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
}

/// Parses a whole cache file, in the file's order. Little-endian layouts only (x86-64, aarch64,
/// ppc64le): a driver root is read on the machine it serves.
pub fn parse(bytes: &[u8]) -> Result<Vec<Entry>, LdCacheError> {
    if bytes.starts_with(NEW_MAGIC) {
        return parse_new(bytes, 0);
    }
    if !bytes.starts_with(OLD_MAGIC) {
        return Err(LdCacheError::BadMagic);
    }
    let count = u32_at(bytes, 12)? as usize;
    let strings = OLD_HEADER
        .checked_add(count.checked_mul(OLD_ENTRY).ok_or(LdCacheError::BadMagic)?)
        .ok_or(LdCacheError::BadMagic)?;
    if strings > bytes.len() {
        return Err(LdCacheError::Truncated { offset: strings, len: bytes.len() });
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
        let key = str_at(bytes, strings + u32_at(bytes, at + 4)? as usize)?;
        let path = str_at(bytes, strings + u32_at(bytes, at + 8)? as usize)?;
        out.push(Entry { key, path, flags });
    }
    Ok(out)
}

fn parse_new(bytes: &[u8], base: usize) -> Result<Vec<Entry>, LdCacheError> {
    let count = u32_at(bytes, base + 20)? as usize;
    let end = count
        .checked_mul(NEW_ENTRY)
        .and_then(|n| n.checked_add(base + NEW_HEADER))
        .ok_or(LdCacheError::Truncated { offset: usize::MAX, len: bytes.len() })?;
    if end > bytes.len() {
        return Err(LdCacheError::Truncated { offset: end, len: bytes.len() });
    }
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let at = base + NEW_HEADER + i * NEW_ENTRY;
        let flags = u32_at(bytes, at)? as i32;
        let key = str_at(bytes, base + u32_at(bytes, at + 4)? as usize)?;
        let path = str_at(bytes, base + u32_at(bytes, at + 8)? as usize)?;
        out.push(Entry { key, path, flags });
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const X86_64: i32 = 0x0303;
    const I386: i32 = 0x0003;

    fn entries() -> Vec<(i32, &'static str, &'static str)> {
        vec![
            (X86_64, "libcuda.so.1", "/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1"),
            (I386, "libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1"),
            (X86_64, "libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
        ]
    }

    /// Builds a new-format cache as glibc 2.32+ `ldconfig` writes it.
    pub(crate) fn new_format(entries: &[(i32, &str, &str)]) -> Vec<u8> {
        let mut strings = Vec::new();
        let mut offsets = Vec::new();
        let table_start = NEW_HEADER + entries.len() * NEW_ENTRY;
        for (_, key, path) in entries {
            let k = table_start + strings.len();
            strings.extend_from_slice(key.as_bytes());
            strings.push(0);
            let p = table_start + strings.len();
            strings.extend_from_slice(path.as_bytes());
            strings.push(0);
            offsets.push((k as u32, p as u32));
        }
        let mut out = Vec::new();
        out.extend_from_slice(NEW_MAGIC);
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        out.extend_from_slice(&[2, 0, 0, 0]);
        out.extend_from_slice(&[0; 16]);
        for ((flags, _, _), (k, p)) in entries.iter().zip(&offsets) {
            out.extend_from_slice(&flags.to_le_bytes());
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(&p.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&0u64.to_le_bytes());
        }
        out.extend_from_slice(&strings);
        out
    }

    /// Builds an old-format cache (glibc < 2.32 `ldconfig -c old`).
    fn old_format(entries: &[(i32, &str, &str)]) -> Vec<u8> {
        let mut strings = Vec::new();
        let mut offsets = Vec::new();
        for (_, key, path) in entries {
            let k = strings.len();
            strings.extend_from_slice(key.as_bytes());
            strings.push(0);
            let p = strings.len();
            strings.extend_from_slice(path.as_bytes());
            strings.push(0);
            offsets.push((k as u32, p as u32));
        }
        let mut out = Vec::new();
        out.extend_from_slice(OLD_MAGIC);
        out.push(0);
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for ((flags, _, _), (k, p)) in entries.iter().zip(&offsets) {
            out.extend_from_slice(&flags.to_le_bytes());
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(&p.to_le_bytes());
        }
        out.extend_from_slice(&strings);
        out
    }

    fn expected() -> Vec<Entry> {
        entries().into_iter().map(|(flags, k, p)| Entry { key: k.into(), path: p.into(), flags }).collect()
    }

    #[test]
    fn reads_the_new_format() {
        assert_eq!(parse(&new_format(&entries())).unwrap(), expected());
    }

    #[test]
    fn reads_the_old_format() {
        assert_eq!(parse(&old_format(&entries())).unwrap(), expected());
    }

    #[test]
    fn prefers_a_new_cache_embedded_after_the_old_one() {
        // glibc's "compat" layout: old header and entries, then the new cache at the next 8-byte
        // boundary; strings follow the new entries (old offsets count from the old entries' end).
        let mut bytes = old_format(&[(X86_64, "libold.so.1", "/old/libold.so.1")]);
        bytes.truncate(OLD_HEADER + OLD_ENTRY);
        while !bytes.len().is_multiple_of(8) {
            bytes.push(0);
        }
        bytes.extend_from_slice(&new_format(&entries()));
        assert_eq!(parse(&bytes).unwrap(), expected());
    }

    #[test]
    fn reads_this_hosts_cache_as_ldconfig_does() {
        // The real glibc cache of this machine, against `ldconfig -p`'s own count and entries.
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
        let x86: Vec<_> = expected().into_iter().filter(|e| e.is_arch(0x0300)).collect();
        assert_eq!(x86.len(), 2);
        assert!(x86.iter().all(|e| !e.path.contains("i386")));
    }

    #[test]
    fn rejects_garbage_and_truncation() {
        assert_eq!(parse(b"hello world, not a cache"), Err(LdCacheError::BadMagic));
        let mut bytes = new_format(&entries());
        bytes.truncate(60);
        assert!(matches!(parse(&bytes), Err(LdCacheError::Truncated { .. })));
        let mut bytes = new_format(&entries());
        bytes.pop(); // drops the final NUL of the last string
        assert!(matches!(parse(&bytes), Err(LdCacheError::Truncated { .. })));
    }
}
