//! glibc's `ld.so.cache`, read with `nvinject-ldcache` (the crate that also writes it for the
//! hook). The cache tells where a driver root keeps libraries outside the usual directories
//! (Debian's `nvidia/current`, distribution-specific paths), without running `ldconfig -p`.

pub use nvinject_ldcache::{Entry, LdCacheError, host_arch_flags, parse};

#[cfg(test)]
pub(crate) mod tests {
    use nvinject_ldcache::format::{Entry, encode};

    /// A new-format cache as glibc 2.32+ `ldconfig` writes it, entries in the order given.
    pub(crate) fn new_format(entries: &[(i32, &str, &str)]) -> Vec<u8> {
        let entries: Vec<Entry> = entries
            .iter()
            .map(|&(flags, key, path)| Entry { key: key.into(), path: path.into(), flags, hwcap: 0 })
            .collect();
        encode(&entries, "test").unwrap()
    }
}
