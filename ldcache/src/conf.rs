//! `ld.so.conf` as ldconfig reads it: `#` comments, `include PATTERN...` (globs; relative patterns
//! name files next to the including one), `hwcap` lines (ignored, as glibc 2.37+ does), and one
//! directory per other line (`DIR=TYPE` legacy suffix honoured). Every file and listing goes
//! through [`Root`], so an include of `/proc/...` or `../..` reads only inside the root.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nvinject_fsio::root::{EntryType, Root};

use crate::error::LdCacheError;
use crate::format::{FLAG_ELF_LIBC5, FLAG_ELF_LIBC6};

/// Limits for hostile images.
pub(crate) const MAX_CONF_BYTES: u64 = 1 << 20;
pub(crate) const MAX_CONF_FILES: usize = 256;
pub(crate) const MAX_INCLUDE_DEPTH: usize = 8;
pub(crate) const MAX_DIR_LINES: usize = 4096;
const MAX_GLOB_LISTING: usize = 4096;

/// A directory line: the path as written (trailing slashes and blanks trimmed) and its forced
/// library type (`FLAG_ANY` = 0 unless `=libc6` / `=libc5`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DirLine {
    pub path: String,
    pub flag: i32,
}

/// Parses one directory line as ldconfig's `add_dir_1` does.
pub(crate) fn dir_line(line: &str) -> DirLine {
    let (path, flag) = match line.split_once('=') {
        Some((p, ty)) => (
            p,
            match ty {
                "libc6" => FLAG_ELF_LIBC6,
                "libc5" => FLAG_ELF_LIBC5,
                _ => {
                    tracing::warn!(line, "unknown library type after `=`; ignored");
                    0
                }
            },
        ),
        None => (line, 0),
    };
    let mut path = path.trim_end_matches(|c: char| c.is_ascii_whitespace());
    while path.len() > 1 && path.ends_with('/') {
        path = &path[..path.len() - 1];
    }
    DirLine { path: path.to_owned(), flag }
}

pub(crate) struct ConfReader<'a> {
    root: &'a Root,
    pub dirs: Vec<DirLine>,
    files: usize,
    /// The files being read, outermost first, with their (device, inode) when known: an include
    /// of one of them closes a loop.
    open: Vec<(PathBuf, Option<(u64, u64)>)>,
}

/// An include line: the file (as the image sees it) and its 1-based line number.
type IncludedBy<'p> = Option<(&'p Path, usize)>;

impl<'a> ConfReader<'a> {
    pub fn new(root: &'a Root) -> Self {
        ConfReader { root, dirs: Vec::new(), files: 0, open: Vec::new() }
    }

    /// Reads `file` (missing: nothing), following includes up to [`MAX_INCLUDE_DEPTH`]. An include
    /// loop or too deep a nest is reported against the include line that closes it.
    pub fn read(&mut self, file: &Path) -> Result<(), LdCacheError> {
        self.read_included(file, None)
    }

    fn read_included(&mut self, file: &Path, by: IncludedBy<'_>) -> Result<(), LdCacheError> {
        let at_include = |message: String| match by {
            Some((including, line)) => {
                LdCacheError::Conf { file: including.display().to_string(), line, message }
            }
            None => LdCacheError::Conf { file: file.display().to_string(), line: 0, message },
        };
        if self.open.len() > MAX_INCLUDE_DEPTH {
            return Err(at_include(format!(
                "including {} nests ld.so.conf files deeper than {MAX_INCLUDE_DEPTH}; flatten the includes",
                file.display()
            )));
        }
        self.files += 1;
        if self.files > MAX_CONF_FILES {
            return Err(LdCacheError::TooMany {
                what: "ld.so.conf files read (with includes)",
                limit: MAX_CONF_FILES,
            });
        }
        let bytes = match self.root.read_regular(file, MAX_CONF_BYTES) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            // ldconfig warns and goes on for an unreadable file; so do we, unless it is too big
            // (that is an attack on our memory, worth failing loudly).
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => return Err(LdCacheError::Root(e)),
            Err(e) => {
                tracing::warn!(error = %e, "ld.so.conf file skipped");
                return Ok(());
            }
        };
        // Same file by identity, not by name: `ld.so.conf.d/../ld.so.conf` or a link closes a loop
        // as surely as the file's own name.
        let id = self.root.metadata(file).ok().flatten().map(|m| (m.dev(), m.ino()));
        if let Some(first) = self.open.iter().position(|(path, open)| match (open, id) {
            (Some(open), Some(id)) => *open == id,
            _ => path == file,
        }) {
            let chain: Vec<String> = self.open[first..]
                .iter()
                .map(|(p, _)| p.display().to_string())
                .chain([file.display().to_string()])
                .collect();
            return Err(at_include(format!(
                "includes {}, which is already being read: an include loop ({}); remove one of these includes",
                file.display(),
                chain.join(" -> ")
            )));
        }
        self.open.push((file.to_owned(), id));
        let text = String::from_utf8_lossy(&bytes);
        for (n, raw) in text.split('\n').enumerate() {
            let line = raw.split('#').next().unwrap_or("");
            let line = line.trim_start_matches(|c: char| c.is_ascii_whitespace());
            if line.is_empty() {
                continue;
            }
            let word_is = |w: &str| {
                line.len() > w.len()
                    && line[..w.len()].eq_ignore_ascii_case(w)
                    && matches!(line.as_bytes()[w.len()], b' ' | b'\t')
            };
            if line.starts_with("include") && word_is("include") {
                for pattern in line[8..].split([' ', '\t']).filter(|p| !p.is_empty()) {
                    let pattern = pattern.trim_end_matches('\r');
                    let full = if pattern.starts_with('/') {
                        PathBuf::from(pattern)
                    } else {
                        file.parent().unwrap_or(Path::new("/")).join(pattern)
                    };
                    for found in glob(self.root, &full)? {
                        self.read_included(&found, Some((file, n + 1)))?;
                    }
                }
            } else if word_is("hwcap") {
                tracing::debug!(file = %file.display(), line = n + 1, "hwcap line ignored");
            } else {
                if self.dirs.len() >= MAX_DIR_LINES {
                    return Err(LdCacheError::TooMany {
                        what: "ld.so.conf directory lines",
                        limit: MAX_DIR_LINES,
                    });
                }
                self.dirs.push(dir_line(line));
            }
        }
        self.open.pop();
        Ok(())
    }
}

/// `fnmatch` without flags beyond glob's defaults: `*`, `?`, `[...]` (ranges, `!`/`^`), `\`
/// escapes; a leading `.` must be matched literally.
pub(crate) fn fnmatch(pattern: &[u8], name: &[u8]) -> bool {
    if name.first() == Some(&b'.') && pattern.first() != Some(&b'.') {
        return false;
    }
    fn class(p: &[u8], c: u8) -> Option<(bool, usize)> {
        // Returns (matched, length of the class in p, from after '[').
        let mut i = 0;
        let negate = matches!(p.first(), Some(b'!') | Some(b'^'));
        if negate {
            i += 1;
        }
        let mut matched = false;
        let mut first = true;
        loop {
            let lo = *p.get(i)?;
            if lo == b']' && !first {
                return Some((matched != negate, i + 1));
            }
            first = false;
            if p.get(i + 1) == Some(&b'-') && p.get(i + 2).is_some_and(|&h| h != b']') {
                let hi = p[i + 2];
                matched |= lo <= c && c <= hi;
                i += 3;
            } else {
                matched |= lo == c;
                i += 1;
            }
        }
    }
    /// Matches one pattern element at `p[pi..]` against byte `c`: Some(element length) on a match.
    fn one(p: &[u8], pi: usize, c: u8) -> Option<usize> {
        match p[pi] {
            b'?' => Some(1),
            b'[' => match class(&p[pi + 1..], c) {
                Some((true, len)) => Some(1 + len),
                Some((false, _)) => None,
                None => (c == b'[').then_some(1), // an unclosed '[' is a literal
            },
            b'\\' if pi + 1 < p.len() => (p[pi + 1] == c).then_some(2),
            lit => (lit == c).then_some(1),
        }
    }
    // The classic single-backtrack wildcard match: O(pattern * name) whatever the pattern.
    let p = pattern;
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < name.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi + 1, ni));
            pi += 1;
        } else if let Some(len) = (pi < p.len()).then(|| one(p, pi, name[ni])).flatten() {
            pi += len;
            ni += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

fn has_magic(s: &[u8]) -> bool {
    s.iter().any(|c| matches!(c, b'*' | b'?' | b'['))
}

/// `glob(3)` over the root: the existing paths matching `pattern`, sorted by bytes.
pub(crate) fn glob(root: &Root, pattern: &Path) -> Result<Vec<PathBuf>, LdCacheError> {
    use std::os::unix::ffi::OsStrExt;
    let mut found = vec![PathBuf::from("/")];
    let parts: Vec<&[u8]> =
        pattern.as_os_str().as_bytes().split(|&c| c == b'/').filter(|p| !p.is_empty()).collect();
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let mut next = Vec::new();
        for base in &found {
            if !has_magic(part) {
                next.push(base.join(std::ffi::OsStr::from_bytes(part)));
                continue;
            }
            let Ok(listing) = root.read_dir(base) else { continue };
            for (name, ty) in listing.into_iter().take(MAX_GLOB_LISTING) {
                if fnmatch(part, name.as_bytes())
                    && (last || ty == EntryType::Dir || ty == EntryType::Symlink)
                {
                    next.push(base.join(name));
                }
            }
            if next.len() > MAX_CONF_FILES {
                return Err(LdCacheError::TooMany {
                    what: "paths matched by an ld.so.conf include",
                    limit: MAX_CONF_FILES,
                });
            }
        }
        found = next;
    }
    found.retain(|p| root.symlink_metadata(p).ok().flatten().is_some());
    found.sort_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnmatch_basics() {
        for (p, n, want) in [
            ("*.conf", "a.conf", true),
            ("*.conf", ".hidden.conf", false),
            (".*.conf", ".hidden.conf", true),
            ("*.conf", "a.conf.bak", false),
            ("a?c", "abc", true),
            ("[a-c]x", "bx", true),
            ("[!a-c]x", "bx", false),
            ("[^a]x", "zx", true),
            ("\\*", "*", true),
            ("[", "[", true),
            (
                "**********************************************b",
                "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                false,
            ),
        ] {
            assert_eq!(fnmatch(p.as_bytes(), n.as_bytes()), want, "{p} {n}");
        }
    }

    #[test]
    fn dir_lines_trim_like_ldconfig() {
        assert_eq!(dir_line("/usr/lib/// ").path, "/usr/lib");
        assert_eq!(dir_line("/").path, "/");
        assert_eq!(dir_line("/opt/x=libc6"), DirLine { path: "/opt/x".into(), flag: FLAG_ELF_LIBC6 });
        assert_eq!(dir_line("/opt/x=bogus").flag, 0);
    }
}
