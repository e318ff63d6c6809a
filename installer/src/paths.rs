//! Host paths and the host root.
//!
//! Every path the installer writes into configuration (containerd's config, the CDI spec,
//! `/etc/nvinject/config.toml`) is a *host* path: what containerd and the shim will see. The
//! installer itself may run in a container with the host mounted at `/host`; [`HostRoot`] maps a
//! host path to where the installer reaches it.

use std::fs::Metadata;
use std::path::{Path, PathBuf};

use nvinject_fsio::root::{EntryType, ResolvedDir, Root};

use crate::containerd::imports::{clean, parent_dir};
use crate::error::{Error, Result};

/// Largest configuration file read under the host root (containerd's config and imports, our
/// drop-in, `/etc/nvinject/config.toml`, the state file): real ones are a few KB.
pub const CONFIG_LIMIT: u64 = 4 << 20;
/// Largest CDI spec or backup read under the host root.
pub const FILE_LIMIT: u64 = 64 << 20;
/// Largest installed binary read back under the host root.
pub const BINARY_LIMIT: u64 = 1 << 30;

/// A directory resolved inside the host root, for path-based writers (`/proc/self/fd/N`).
#[derive(Debug)]
pub struct HostDir {
    dir: ResolvedDir,
    host: String,
}

impl std::os::fd::AsFd for HostDir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.dir.as_fd()
    }
}

impl HostDir {
    /// The path of `name` in this directory, valid while `self` lives.
    pub fn join(&self, name: &str) -> PathBuf {
        self.dir.proc_path().join(name)
    }

    /// The host path of the directory.
    pub fn host_path(&self) -> &str {
        &self.host
    }
}

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

    /// The root, opened for operations resolved inside it.
    pub fn open(&self) -> Result<Root> {
        Root::open(&self.0).map_err(Error::host(&self.0))
    }

    /// `host_path` with the host root in front, unresolved: how messages name a file.
    pub fn shown(&self, host_path: &str) -> PathBuf {
        self.0.join(host_path.trim_start_matches('/'))
    }

    /// Reads the regular file `host_path`, resolved inside the root; `None` when missing. A FIFO,
    /// device, socket or directory is refused without blocking, as is a file over `limit` bytes.
    pub fn read(&self, host_path: &str, limit: u64) -> Result<Option<Vec<u8>>> {
        self.open()?.read_optional(Path::new(host_path), limit).map_err(Error::host(self.shown(host_path)))
    }

    /// The metadata of `host_path` itself (a final link not followed); `None` when missing.
    pub fn symlink_metadata(&self, host_path: &str) -> Result<Option<Metadata>> {
        self.open()?.symlink_metadata(Path::new(host_path)).map_err(Error::host(self.shown(host_path)))
    }

    /// The metadata of what `host_path` leads to inside the root; `None` when missing or dangling.
    pub fn metadata(&self, host_path: &str) -> Result<Option<Metadata>> {
        self.open()?.metadata(Path::new(host_path)).map_err(Error::host(self.shown(host_path)))
    }

    /// The target of the link `host_path`; `None` when it is missing or not a link.
    pub fn read_link(&self, host_path: &str) -> Result<Option<String>> {
        match self.symlink_metadata(host_path)? {
            Some(m) if m.file_type().is_symlink() => self
                .open()?
                .read_link(Path::new(host_path))
                .map(|t| Some(t.to_string_lossy().into_owned()))
                .map_err(Error::host(self.shown(host_path))),
            _ => Ok(None),
        }
    }

    /// The entries of directory `host_dir` (sorted, each with its own type); `None` when missing.
    pub fn read_dir(&self, host_dir: &str) -> Result<Option<Vec<(String, EntryType)>>> {
        match self.open()?.read_dir(Path::new(host_dir)) {
            Ok(entries) => {
                Ok(Some(entries.into_iter().map(|(n, t)| (n.to_string_lossy().into_owned(), t)).collect()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::host(self.shown(host_dir))(e)),
        }
    }

    /// The existing directory `host_dir`, resolved inside the root.
    pub fn dir(&self, host_dir: &str) -> Result<HostDir> {
        let dir = self.open()?.open_dir(Path::new(host_dir)).map_err(Error::host(self.shown(host_dir)))?;
        Ok(HostDir { dir, host: host_dir.to_owned() })
    }

    /// Creates the directory `host_dir` (its parent must exist) with exactly `mode`; false if
    /// something was there already.
    pub fn mkdir(&self, host_dir: &str, mode: u32) -> Result<bool> {
        let existed = self.symlink_metadata(host_dir)?.is_some();
        self.open()?.mkdir_all(Path::new(host_dir), mode).map_err(Error::host(self.shown(host_dir)))?;
        Ok(!existed)
    }

    /// Removes the empty directory `host_dir`; false when it is missing or not empty.
    pub fn remove_dir(&self, host_dir: &str) -> Result<bool> {
        let (parent, name) = split(host_dir);
        let Ok(dir) = self.dir(&parent) else { return Ok(false) };
        match nix::unistd::unlinkat(
            std::os::fd::AsFd::as_fd(&dir.dir),
            name.as_str(),
            nix::unistd::UnlinkatFlags::RemoveDir,
        ) {
            Ok(()) => Ok(true),
            Err(_) => Ok(false),
        }
    }

    /// Where this process reaches the existing host path `host_path` for handing it to another
    /// program or the kernel (a socket to connect to, a binary to run, a directory or library for
    /// cdi-gen and NVML), which cannot be given a root to resolve in.
    ///
    /// Every symbolic link on the way, the last component's too, is followed by the kernel
    /// *inside* the host root (`openat2` with `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`): an
    /// absolute link (Debian's `/var/run -> /run`) means the host's `/run`, never the installer
    /// container's; a `..` chain stops at the root; a `/proc/self/root` link is refused. The path
    /// returned has no links left in it, so the consumer's own lookup finds the same file; only
    /// someone who can rename directories on that path (root on the host) could race it.
    pub fn locate(&self, host_path: &str) -> Result<PathBuf> {
        let inside =
            self.open()?.canonicalize(Path::new(host_path)).map_err(Error::host(self.shown(host_path)))?;
        Ok(self.0.join(inside.strip_prefix("/").unwrap_or(&inside)))
    }

    /// The host path of the file `host_path` finally names: symbolic links in its last component
    /// are followed too (inside the host root, at most 40 hops, as Linux allows). `host_path`
    /// itself, cleaned, when it is not a link. Used for files we replace by renaming over them,
    /// which would otherwise turn an operator's link into a regular file.
    pub fn follow_links(&self, host_path: &str) -> Result<String> {
        let mut current = clean(host_path);
        for _ in 0..40 {
            let Some(target) = self.read_link(&current)? else { break };
            current = if target.starts_with('/') {
                clean(&target)
            } else {
                clean(&format!("{}/{target}", parent_dir(&current)))
            };
        }
        Ok(current)
    }
}

/// A host path's parent directory and final name.
pub fn split(host_path: &str) -> (String, String) {
    let cleaned = clean(host_path);
    let parent = parent_dir(&cleaned);
    let name = cleaned.rsplit('/').next().unwrap_or_default().to_owned();
    (parent, name)
}

/// Joins a host directory and a file name into a host path.
pub fn host_join(dir: &str, name: &str) -> String {
    format!("{}/{}", dir.trim_end_matches('/'), name.trim_start_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_host_paths_under_the_root() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc/containerd")).unwrap();
        std::fs::write(dir.path().join("etc/containerd/config.toml"), "").unwrap();
        let root = HostRoot::new(dir.path());
        assert_eq!(
            root.locate("/etc/containerd/config.toml").unwrap(),
            dir.path().join("etc/containerd/config.toml")
        );
        assert_eq!(root.locate("/").unwrap(), dir.path().to_path_buf());
        assert!(root.locate("/etc/missing").is_err(), "a missing path cannot be located");
        assert_eq!(HostRoot::new("/").locate("/etc").unwrap(), PathBuf::from("/etc"));
        assert_eq!(
            host_join("/usr/local/nvinject/bin/", "nvinject-hook"),
            "/usr/local/nvinject/bin/nvinject-hook"
        );
    }

    #[test]
    fn absolute_symlinks_locate_inside_the_host_root() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("run/cdi")).unwrap();
        std::fs::create_dir_all(dir.path().join("run/x/y")).unwrap();
        std::fs::create_dir_all(dir.path().join("var")).unwrap();
        std::os::unix::fs::symlink("/run", dir.path().join("var/run")).unwrap();
        std::os::unix::fs::symlink("../run/x", dir.path().join("var/rel")).unwrap();
        let root = HostRoot::new(dir.path());
        assert_eq!(root.locate("/var/run/cdi").unwrap(), dir.path().join("run/cdi"));
        assert_eq!(root.locate("/var/rel/y").unwrap(), dir.path().join("run/x/y"));
        // The last component is followed too: the result has no link left.
        assert_eq!(root.locate("/var/run").unwrap(), dir.path().join("run"));
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
        assert_eq!(root.follow_links("/etc/containerd/config.toml").unwrap(), "/srv/managed/b.toml");
        assert_eq!(root.follow_links("/etc/containerd/./other.toml").unwrap(), "/etc/containerd/other.toml");
        std::os::unix::fs::symlink("loop", dir.path().join("etc/loop")).unwrap();
        assert_eq!(root.follow_links("/etc/loop").unwrap(), "/etc/loop", "a loop ends after 40 hops");
    }
}
