//! File operations inside a container's root filesystem that can never escape it.
//!
//! Every path is resolved by the kernel with `openat2(RESOLVE_IN_ROOT)`: `..` stops at the root and
//! symlinks (absolute or relative) are followed as if the root were `/`, so an image that ships
//! `/etc -> /host-etc` or `lib -> ../../../../` gets its writes inside its own tree, never on the
//! host. Final components are created with `*at` calls relative to an already-resolved directory
//! and never follow a symlink.

use std::ffi::OsStr;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{Mode, mkdirat};

/// A failed operation inside the container root.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path} in container root {root}: {source}")]
pub struct RootError {
    /// What was being done.
    pub op: &'static str,
    /// The path inside the container.
    pub path: String,
    /// The root on the host.
    pub root: String,
    /// What the kernel said.
    pub source: io::Error,
}

/// An open container root.
#[derive(Debug)]
pub struct ContainerRoot {
    path: PathBuf,
    fd: OwnedFd,
}

/// What [`ContainerRoot::symlink`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkOutcome {
    /// The link was made.
    Created,
    /// A link with the same target was already there.
    AlreadyThere,
    /// Something else is at the link's path; it was left alone.
    Occupied {
        /// What is there (a symlink's target, or "a file/directory").
        existing: String,
    },
}

impl ContainerRoot {
    /// Opens the root directory `path` (a host path).
    pub fn open(path: &Path) -> Result<ContainerRoot, RootError> {
        let fd = nix::fcntl::open(path, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| RootError {
                op: "open",
                path: "/".into(),
                root: path.display().to_string(),
                source: e.into(),
            })?;
        Ok(ContainerRoot { path: path.to_owned(), fd })
    }

    /// The root's host path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, op: &'static str, path: &Path, e: impl Into<io::Error>) -> RootError {
        RootError {
            op,
            path: path.display().to_string(),
            root: self.path.display().to_string(),
            source: e.into(),
        }
    }

    fn resolve(&self, path: &Path, flags: OFlag, mode: Mode) -> nix::Result<OwnedFd> {
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .mode(mode)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let relative = relative(path);
        let relative: &Path = if relative.as_os_str().is_empty() { Path::new(".") } else { &relative };
        loop {
            match openat2(self.fd.as_fd(), relative, how) {
                // openat2 asks callers to retry when a concurrent rename raced the lookup.
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => continue,
                other => return other,
            }
        }
    }

    /// Opens directory `path` inside the root, creating missing components (mode 0755).
    pub fn mkdir_all(&self, path: &Path) -> Result<OwnedFd, RootError> {
        let mut current = self
            .resolve(Path::new("/"), OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())
            .map_err(|e| self.err("open", Path::new("/"), e))?;
        let mut so_far = PathBuf::from("/");
        for component in relative(path).components() {
            match component {
                Component::Normal(name) => {
                    so_far.push(name);
                    match mkdirat(current.as_fd(), name, Mode::from_bits_truncate(0o755)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(self.err("mkdir", &so_far, e)),
                    }
                }
                // Kept for the kernel to resolve (in the root: `..` of the root is the root).
                Component::ParentDir => so_far.push(".."),
                _ => continue,
            }
            // Resolve the whole prefix again from the root so a symlink component is followed
            // inside the root, never outside.
            current = self
                .resolve(&so_far, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())
                .map_err(|e| self.err("open directory", &so_far, e))?;
        }
        Ok(current)
    }

    /// Makes the symlink `link` -> `target` inside the root (parents created as needed).
    pub fn symlink(&self, target: &Path, link: &Path) -> Result<LinkOutcome, RootError> {
        let (parent, name) =
            split(link).ok_or_else(|| self.err("symlink", link, io::ErrorKind::InvalidInput))?;
        let dir = self.mkdir_all(&parent)?;
        match nix::unistd::symlinkat(target, dir.as_fd(), name) {
            Ok(()) => Ok(LinkOutcome::Created),
            Err(Errno::EEXIST) => match nix::fcntl::readlinkat(dir.as_fd(), name) {
                Ok(existing) if Path::new(&existing) == target => Ok(LinkOutcome::AlreadyThere),
                Ok(existing) => {
                    Ok(LinkOutcome::Occupied { existing: existing.to_string_lossy().into_owned() })
                }
                Err(_) => Ok(LinkOutcome::Occupied { existing: "a file or directory".into() }),
            },
            Err(e) => Err(self.err("symlink", link, e)),
        }
    }

    /// Whether directory `path` exists inside the root (following symlinks inside it).
    pub fn dir_exists(&self, path: &Path) -> bool {
        self.resolve(path, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty()).is_ok()
    }

    /// Replaces the regular file `path` inside the root with `bytes` (its directory must exist).
    /// Written through a temp file and a rename within that directory.
    ///
    /// The temp name is in the image's hands too: whatever is there (a symlink, a FIFO that would
    /// block the open, a device node that would be written to) is removed, and the temp file is
    /// created with `O_EXCL`, so only a fresh regular file of ours is ever written.
    pub fn write_file(&self, path: &Path, bytes: &[u8], mode: u32) -> Result<(), RootError> {
        let (parent, name) =
            split(path).ok_or_else(|| self.err("write", path, io::ErrorKind::InvalidInput))?;
        let dir = self
            .resolve(&parent, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())
            .map_err(|e| self.err("open directory", &parent, e))?;
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(".nvinject.tmp");
        let temp = temp_name.as_os_str();
        match nix::unistd::unlinkat(dir.as_fd(), temp, nix::unistd::UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(self.err("remove stale temp file for", path, e)),
        }
        let fd = nix::fcntl::openat(
            dir.as_fd(),
            temp,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )
        .map_err(|e| self.err("create", path, e))?;
        let mut file = std::fs::File::from(fd);
        let result = file.write_all(bytes).map_err(|e| self.err("write", path, e)).and_then(|()| {
            nix::fcntl::renameat(dir.as_fd(), temp, dir.as_fd(), name)
                .map_err(|e| self.err("rename", path, e))
        });
        if result.is_err() {
            let _ = nix::unistd::unlinkat(dir.as_fd(), temp, nix::unistd::UnlinkatFlags::NoRemoveDir);
        }
        result
    }
}

/// `path` without its leading `/` (and without `.`/`..` handling: the kernel does that in-root).
fn relative(path: &Path) -> PathBuf {
    path.components().filter(|c| !matches!(c, Component::RootDir | Component::Prefix(_))).collect()
}

/// Parent directory and final name; `None` for `/` or a path ending in `..`.
fn split(path: &Path) -> Option<(PathBuf, &OsStr)> {
    let name = path.file_name()?;
    let parent = path.parent().map(Path::to_owned).unwrap_or_else(|| PathBuf::from("/"));
    Some((parent, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("rootfs");
        let outside = dir.path().join("outside");
        fs::create_dir_all(root.join("usr/lib/x86_64-linux-gnu")).unwrap();
        fs::create_dir_all(&outside).unwrap();
        (dir, root, outside)
    }

    #[test]
    fn symlinks_are_created_with_parents_and_are_idempotent() {
        let (_d, root, _) = setup();
        let r = ContainerRoot::open(&root).unwrap();
        let link = Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so");
        assert_eq!(r.symlink(Path::new("libcuda.so.1"), link).unwrap(), LinkOutcome::Created);
        assert_eq!(
            fs::read_link(root.join("usr/lib/x86_64-linux-gnu/libcuda.so")).unwrap(),
            Path::new("libcuda.so.1")
        );
        assert_eq!(r.symlink(Path::new("libcuda.so.1"), link).unwrap(), LinkOutcome::AlreadyThere);
        assert_eq!(
            r.symlink(Path::new("other"), link).unwrap(),
            LinkOutcome::Occupied { existing: "libcuda.so.1".into() }
        );
        r.symlink(Path::new("/usr/bin/nvidia-smi"), Path::new("/new/dir/deep/smi")).unwrap();
        assert!(root.join("new/dir/deep").is_dir());
        // `..` means the parent, as in any path, and never leaves the root.
        r.symlink(Path::new("t"), Path::new("/new/../up/link")).unwrap();
        assert!(fs::symlink_metadata(root.join("up/link")).is_ok());
        assert!(!root.join("new/up").exists());
        r.symlink(Path::new("t"), Path::new("/../../top-link")).unwrap();
        assert!(fs::symlink_metadata(root.join("top-link")).is_ok());
    }

    #[test]
    fn symlinks_in_the_image_resolve_inside_the_root() {
        let (_d, root, outside) = setup();
        // Merged /usr (lib -> usr/lib), an absolute link to a host path, and a climb out with "..".
        symlink("usr/lib", root.join("lib")).unwrap();
        symlink(&outside, root.join("etc")).unwrap();
        symlink("../../../../../../..", root.join("lib64")).unwrap();
        let r = ContainerRoot::open(&root).unwrap();
        r.symlink(Path::new("libcuda.so.1"), Path::new("/lib/x86_64-linux-gnu/libcuda.so")).unwrap();
        assert!(fs::symlink_metadata(root.join("usr/lib/x86_64-linux-gnu/libcuda.so")).is_ok());
        // /etc re-rooted is <root>/<outside path>, which does not exist: refused, not followed out.
        let err = r.symlink(Path::new("x"), Path::new("/etc/ld.so.conf.d/link")).unwrap_err();
        assert!(err.to_string().contains("/etc"), "{err}");
        r.symlink(Path::new("y"), Path::new("/lib64/escape")).unwrap();
        assert!(fs::symlink_metadata(root.join("escape")).is_ok(), "`..` stops at the root");
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0, "nothing may be created outside the root");
    }

    #[test]
    fn writes_stay_inside_and_never_write_through_what_the_image_put_at_the_temp_name() {
        let (_d, root, outside) = setup();
        let conf_d = root.join("etc/ld.so.conf.d");
        fs::create_dir_all(&conf_d).unwrap();
        let temp = conf_d.join(".00-nvinject.conf.nvinject.tmp");
        let r = ContainerRoot::open(&root).unwrap();
        let dropin = Path::new("/etc/ld.so.conf.d/00-nvinject.conf");

        // A symlink to a host file: replaced, the host file untouched.
        let victim = outside.join("victim");
        fs::write(&victim, b"host data").unwrap();
        symlink(&victim, &temp).unwrap();
        r.write_file(dropin, b"/usr/lib\n", 0o644).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"host data");
        assert_eq!(fs::read(conf_d.join("00-nvinject.conf")).unwrap(), b"/usr/lib\n");

        // A device node (here /dev/null's numbers; an image can ship any): never opened, and what
        // lands at the final name is a regular file with the content.
        let dev_null = nix::sys::stat::makedev(1, 3);
        nix::sys::stat::mknod(
            &temp,
            nix::sys::stat::SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            dev_null,
        )
        .expect("mknod (the tests run as root)");
        r.write_file(dropin, b"/usr/lib64\n", 0o644).unwrap();
        let written = fs::symlink_metadata(conf_d.join("00-nvinject.conf")).unwrap();
        assert!(written.file_type().is_file(), "{:?}", written.file_type());
        assert_eq!(fs::read(conf_d.join("00-nvinject.conf")).unwrap(), b"/usr/lib64\n");
        assert!(fs::symlink_metadata(&temp).is_err(), "no temp file left");

        assert!(r.dir_exists(Path::new("/etc/ld.so.conf.d")));
        assert!(!r.dir_exists(Path::new("/nope")));
        // A missing directory is an error naming the file, not a write elsewhere.
        let err = r.write_file(Path::new("/nope/x.conf"), b"", 0o644).unwrap_err();
        assert!(err.to_string().contains("/nope"), "{err}");
    }
}
