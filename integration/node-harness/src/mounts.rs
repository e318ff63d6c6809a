//! Mounts under a test's private directories: listing them (to prove nothing leaked) and removing
//! them (cleanup), deepest first.

use std::path::{Path, PathBuf};

/// Mount points at or below `dir`, as /proc/self/mountinfo lists them (octal escapes decoded).
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// Decodes a /proc/self/mountinfo path field: the kernel writes space, tab, newline and backslash
/// as three-digit octal escapes (`\040`). A value over 255 is not one of those and becomes `?`.
pub fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b))
        {
            let v = u32::from(bytes[i + 1] - b'0') * 64
                + u32::from(bytes[i + 2] - b'0') * 8
                + u32::from(bytes[i + 3] - b'0');
            out.push(u8::try_from(v).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Unmounts everything at or below `dir` (lazily, deepest first). Returns what it unmounted.
pub fn unmount_under(dir: &Path) -> Vec<PathBuf> {
    let mut done = Vec::new();
    // Stacked mounts appear once per layer; repeat until nothing is left (bounded).
    for _ in 0..8 {
        let mut points = mounts_under(dir);
        if points.is_empty() {
            break;
        }
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for p in points {
            if nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH).is_ok() {
                done.push(p);
            }
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape_mountinfo(r"/x\134y"), r"/x\y");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        // Not an escape the kernel writes: decoded without overflowing, never a panic.
        assert_eq!(unescape_mountinfo(r"/a\777"), "/a?");
        assert_eq!(unescape_mountinfo(r"/end\04"), r"/end\04");
    }

    #[test]
    fn the_root_mount_is_listed_under_slash() {
        assert!(mounts_under(Path::new("/")).contains(&PathBuf::from("/")));
        assert!(mounts_under(Path::new("/nonexistent-nvinject")).is_empty());
    }
}
