//! containerd's `imports`: which files an entry names, with each version's path rules.
//!
//! Both 1.x and 2.x expand an entry containing `*` with Go's `filepath.Glob` and join a relative
//! plain entry to the importing file's directory. They differ for relative globs: 1.x matches
//! them against containerd's working directory (`/` under systemd), 2.x against the importing
//! file's directory. The installer therefore always writes an absolute path.

use super::version::ContainerdVersion;

/// What one `imports` entry names, as containerd would resolve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportTarget {
    /// One file (absolute, cleaned).
    File(String),
    /// Every file matching an absolute glob pattern (cleaned).
    Glob(String),
}

/// Resolves an `imports` entry of the file at `parent` (an absolute host path).
pub fn resolve(entry: &str, parent: &str, containerd: &ContainerdVersion) -> ImportTarget {
    let is_glob = entry.contains('*');
    let relative_base = if is_glob && !containerd.resolves_relative_globs_from_config_dir() {
        // containerd 1.x: relative globs are matched from its working directory, which is `/`
        // for the systemd unit containerd ships.
        "/".to_owned()
    } else {
        parent_dir(parent)
    };
    let absolute =
        if entry.starts_with('/') { clean(entry) } else { clean(&format!("{relative_base}/{entry}")) };
    if is_glob { ImportTarget::Glob(absolute) } else { ImportTarget::File(absolute) }
}

impl ImportTarget {
    /// Whether this entry makes containerd load `path` (absolute, cleaned).
    pub fn covers(&self, path: &str) -> bool {
        match self {
            ImportTarget::File(file) => file == path,
            ImportTarget::Glob(pattern) => glob_match(pattern, path),
        }
    }
}

/// The directory of an absolute path (`/etc/containerd/config.toml` -> `/etc/containerd`).
pub fn parent_dir(path: &str) -> String {
    match path.rfind('/') {
        Some(0) | None => "/".to_owned(),
        Some(i) => path[..i].to_owned(),
    }
}

/// Lexical path cleaning like Go's `filepath.Clean` for absolute paths: drops `.`, empty
/// components and resolves `..` without touching the file system.
pub fn clean(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Go `filepath.Match` semantics on whole paths: `*` and `?` never cross `/`, `[...]` classes
/// with ranges and `^`/`!` negation, `\` escapes.
pub fn glob_match(pattern: &str, path: &str) -> bool {
    let pattern_parts: Vec<&str> = pattern.split('/').collect();
    let path_parts: Vec<&str> = path.split('/').collect();
    pattern_parts.len() == path_parts.len()
        && pattern_parts.iter().zip(&path_parts).all(|(p, s)| component_match(p, s))
}

/// Matches one path component against one pattern component.
pub fn component_match(pattern: &str, name: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let name: Vec<char> = name.chars().collect();
    match_from(&pattern, &name)
}

fn match_from(pattern: &[char], name: &[char]) -> bool {
    match pattern.first() {
        None => name.is_empty(),
        Some('*') => (0..=name.len()).any(|skip| match_from(&pattern[1..], &name[skip..])),
        Some('?') => !name.is_empty() && match_from(&pattern[1..], &name[1..]),
        Some('[') => match (name.first(), class_match(&pattern[1..], name.first().copied())) {
            (Some(_), Some((true, used))) => match_from(&pattern[1 + used..], &name[1..]),
            _ => false,
        },
        Some('\\') if pattern.len() > 1 => {
            name.first() == Some(&pattern[1]) && match_from(&pattern[2..], &name[1..])
        }
        Some(c) => name.first() == Some(c) && match_from(&pattern[1..], &name[1..]),
    }
}

/// Matches a `[...]` class (pattern starts after `[`); returns (matched, chars consumed incl. `]`).
fn class_match(pattern: &[char], c: Option<char>) -> Option<(bool, usize)> {
    let c = c?;
    let mut i = 0;
    let negated = matches!(pattern.first(), Some('^') | Some('!'));
    if negated {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    while i < pattern.len() {
        if pattern[i] == ']' && !first {
            return Some((matched != negated, i + 1));
        }
        first = false;
        let lo = pattern[i];
        if i + 2 < pattern.len() && pattern[i + 1] == '-' && pattern[i + 2] != ']' {
            if lo <= c && c <= pattern[i + 2] {
                matched = true;
            }
            i += 3;
        } else {
            if lo == c {
                matched = true;
            }
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_plain_entries_join_the_config_dir() {
        let v1 = ContainerdVersion::new(1, 6, 20);
        assert_eq!(
            resolve("conf.d/99-nvinject.toml", "/etc/containerd/config.toml", &v1),
            ImportTarget::File("/etc/containerd/conf.d/99-nvinject.toml".into())
        );
        assert_eq!(
            resolve("/etc/containerd/./conf.d//x.toml", "/etc/containerd/config.toml", &v1),
            ImportTarget::File("/etc/containerd/conf.d/x.toml".into())
        );
    }

    #[test]
    fn relative_globs_differ_between_1x_and_2x() {
        let cfg = "/etc/containerd/config.toml";
        assert_eq!(
            resolve("conf.d/*.toml", cfg, &ContainerdVersion::new(1, 7, 20)),
            ImportTarget::Glob("/conf.d/*.toml".into())
        );
        assert_eq!(
            resolve("conf.d/*.toml", cfg, &ContainerdVersion::new(2, 1, 0)),
            ImportTarget::Glob("/etc/containerd/conf.d/*.toml".into())
        );
    }

    #[test]
    fn globs_follow_go_filepath_match() {
        assert!(glob_match("/etc/containerd/conf.d/*.toml", "/etc/containerd/conf.d/99-nvinject.toml"));
        assert!(!glob_match("/etc/containerd/conf.d/*.toml", "/etc/containerd/conf.d/sub/x.toml"));
        assert!(!glob_match("/etc/containerd/*.toml", "/etc/containerd/conf.d/x.toml"));
        assert!(glob_match("/etc/*/conf.d/9?-*.toml", "/etc/containerd/conf.d/99-nvinject.toml"));
        assert!(glob_match("/x/[0-9]*.toml", "/x/99-a.toml"));
        assert!(!glob_match("/x/[!0-9]*.toml", "/x/99-a.toml"));
        assert!(glob_match("/x/\\*.toml", "/x/*.toml"));
        assert!(!glob_match("/x/\\*.toml", "/x/a.toml"));
    }

    #[test]
    fn cleaning_handles_dots() {
        assert_eq!(clean("/a/b/../c/./d/"), "/a/c/d");
        assert_eq!(clean("/.."), "/");
        assert_eq!(parent_dir("/config.toml"), "/");
    }
}
