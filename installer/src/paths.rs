//! Host paths and the host root.
//!
//! Every path the installer writes into configuration (containerd's config, the CDI spec,
//! `/etc/nvinject/config.toml`) is a *host* path: what containerd and the shim will see. The
//! installer itself may run in a container with the host mounted at `/host`; [`HostRoot`] maps a
//! host path to where the installer reaches it.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use crate::containerd::imports::{clean, parent_dir};

/// Where the host's `/` is mounted for this process (`/` on the host, `/host` in the DaemonSet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoot(PathBuf);

impl HostRoot {
    /// A host root at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        HostRoot(path.into())
    }

    /// The host root itself.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Whether the installer runs directly on the host.
    pub fn is_host(&self) -> bool {
        self.0 == Path::new("/")
    }

    /// Where the installer reaches the host path `host_path` (absolute, as on the host).
    ///
    /// Symbolic links in the directories leading to it are followed *inside* the host root, as
    /// the host would: Debian's `/var/run -> /run` is absolute, so a plain join would send
    /// `/host/var/run/cdi` into the installer container's own `/run`. The last component is not
    /// followed: the caller may want the link itself (to replace, read or remove it).
    pub fn resolve(&self, host_path: &str) -> PathBuf {
        let components: Vec<&str> = host_path.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
        let Some((last, parents)) = components.split_last() else { return self.0.clone() };
        if self.is_host() {
            return PathBuf::from(host_path);
        }
        let mut resolved: Vec<String> = Vec::new();
        let mut queue: VecDeque<String> = parents.iter().map(|c| (*c).to_owned()).collect();
        let mut hops = 0;
        while let Some(c) = queue.pop_front() {
            if c == ".." {
                resolved.pop();
                continue;
            }
            let candidate = self.0.join(resolved.join("/")).join(&c);
            match std::fs::read_link(&candidate) {
                // Linux's MAXSYMLINKS; past it, the join is left as it is and the I/O fails.
                Ok(target) if hops < 40 => {
                    hops += 1;
                    let target = target.to_string_lossy().into_owned();
                    if target.starts_with('/') {
                        resolved.clear();
                    }
                    let mut next: VecDeque<String> =
                        target.split('/').filter(|t| !t.is_empty() && *t != ".").map(str::to_owned).collect();
                    next.extend(queue);
                    queue = next;
                }
                _ => resolved.push(c),
            }
        }
        let mut out = self.0.join(resolved.join("/"));
        if *last == ".." {
            out.pop();
        } else {
            out.push(last);
        }
        out
    }

    /// The host path of the file `host_path` finally names: symbolic links in its last component
    /// are followed too (inside the host root, at most 40 hops, as Linux allows). `host_path`
    /// itself, cleaned, when it is not a link. Used for files we replace by renaming over them,
    /// which would otherwise turn an operator's link into a regular file.
    pub fn follow_links(&self, host_path: &str) -> String {
        let mut current = clean(host_path);
        for _ in 0..40 {
            let Ok(target) = std::fs::read_link(self.resolve(&current)) else { break };
            let target = target.to_string_lossy();
            current = if target.starts_with('/') {
                clean(&target)
            } else {
                clean(&format!("{}/{target}", parent_dir(&current)))
            };
        }
        current
    }
}

/// Joins a host directory and a file name into a host path.
pub fn host_join(dir: &str, name: &str) -> String {
    format!("{}/{}", dir.trim_end_matches('/'), name.trim_start_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_host_paths_under_the_root() {
        let root = HostRoot::new("/host");
        assert_eq!(
            root.resolve("/etc/containerd/config.toml"),
            PathBuf::from("/host/etc/containerd/config.toml")
        );
        assert_eq!(HostRoot::new("/").resolve("/etc/x"), PathBuf::from("/etc/x"));
        assert_eq!(
            host_join("/usr/local/nvinject/bin/", "nvinject-hook"),
            "/usr/local/nvinject/bin/nvinject-hook"
        );
    }

    #[test]
    fn absolute_symlinks_resolve_inside_the_host_root() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("run")).unwrap();
        std::fs::create_dir_all(dir.path().join("var")).unwrap();
        std::os::unix::fs::symlink("/run", dir.path().join("var/run")).unwrap();
        std::os::unix::fs::symlink("../run/x", dir.path().join("var/rel")).unwrap();
        let root = HostRoot::new(dir.path());
        assert_eq!(
            root.resolve("/var/run/cdi/nvidia.com-gpu.json"),
            dir.path().join("run/cdi/nvidia.com-gpu.json")
        );
        assert_eq!(root.resolve("/var/rel/y"), dir.path().join("run/x/y"));
        // The last component is never followed.
        assert_eq!(root.resolve("/var/run"), dir.path().join("var/run"));
    }

    #[test]
    fn follow_links_names_the_file_a_link_chain_ends_at() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc/containerd")).unwrap();
        std::fs::create_dir_all(dir.path().join("srv/managed")).unwrap();
        std::os::unix::fs::symlink("/srv/managed/a.toml", dir.path().join("etc/containerd/config.toml"))
            .unwrap();
        std::os::unix::fs::symlink("../managed/../managed/b.toml", dir.path().join("srv/managed/a.toml"))
            .unwrap();
        let root = HostRoot::new(dir.path());
        assert_eq!(root.follow_links("/etc/containerd/config.toml"), "/srv/managed/b.toml");
        assert_eq!(root.follow_links("/etc/containerd/./other.toml"), "/etc/containerd/other.toml");
        std::os::unix::fs::symlink("loop", dir.path().join("etc/loop")).unwrap();
        assert_eq!(root.follow_links("/etc/loop"), "/etc/loop", "a loop ends after 40 hops");
    }
}
