//! File operations inside a directory tree that someone else controls (a container's root
//! filesystem, an installer's `--host-root`), which can never leave that tree.
//!
//! Every path is resolved by the kernel with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`:
//! `..` stops at the root, symlinks (absolute or relative) are followed as if the root were `/`, and
//! `/proc/<pid>/root`-style magic links are refused, so an image that ships `/etc -> /host-etc`,
//! `lib -> ../../../../` or `/etc -> /proc/1/root/etc` gets its reads and writes inside its own tree,
//! never on the host. Final components are created with `*at` calls relative to an already-resolved
//! directory and never follow a symlink. Files are opened `O_NONBLOCK` and checked to be regular
//! before a byte is read, so a FIFO, a device node or a socket in the tree can neither block the
//! caller nor feed it endless data. Everything created gets the mode the caller names, whatever the
//! umask.

use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{Mode, mkdirat};
use nix::unistd::UnlinkatFlags;

/// A failed operation inside a root.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path} in {root}: {source}")]
pub struct RootError {
    /// What was being done: `open`, `read`, `list`, `mkdir`, `symlink`, `write`, ...
    pub op: &'static str,
    /// The path inside the root.
    pub path: String,
    /// The root on the host.
    pub root: String,
    /// What the kernel said, or why the file was refused.
    pub source: io::Error,
}

impl RootError {
    /// The kind of the underlying error (`NotFound` for a missing file).
    pub fn kind(&self) -> io::ErrorKind {
        self.source.kind()
    }
}

/// The most dangling symlinks [`Root::mkdir_all`] follows for one path (the kernel's own limit).
pub const MAX_LINK_HOPS: usize = 40;

/// The most entries [`Root::read_dir`] lists in one directory.
pub const MAX_DIR_ENTRIES: usize = 1 << 20;

/// An open root directory: every path given to its methods is absolute inside it.
#[derive(Debug)]
pub struct Root {
    path: PathBuf,
    fd: OwnedFd,
}

/// The type of a directory entry itself (symlinks not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryType {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A FIFO, socket, block or character device.
    Other,
}

/// What [`Root::symlink`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkOutcome {
    /// The link was made.
    Created,
    /// A link with the same target was already there.
    AlreadyThere,
    /// Something else is at the link's path; it was left alone.
    Occupied {
        /// What is there (a symlink's target, or "a file or directory").
        existing: String,
    },
}

/// Directories one batch of calls on a [`Root`] has made or resolved, by the path they were asked
/// for, so that a batch (the hook's mounts, its links) opens each directory once instead of once
/// per entry: over a driver's ~80 files that was about 180 system calls of the hook's ~1,300.
///
/// An entry stays right while nothing outside the batch changes the tree, which holds for the hook:
/// it runs before the container's first process exists, and nothing it does moves a directory.
/// Making a file, a link or a directory never changes what an existing directory path resolves to;
/// a directory bind mount can (it covers a tree), so whoever makes one calls
/// [`ParentDirs::forget`]. What each directory is (procfs, sysfs, ...) is remembered with it.
#[derive(Debug, Default)]
pub struct ParentDirs {
    dirs: std::collections::HashMap<PathBuf, CachedDir>,
    /// The first empty file [`crate::mount`] made as a mountpoint in this batch: later file
    /// mountpoints are hard links to it where the kernel allows.
    pub(crate) mountpoint_file: Option<OwnedFd>,
}

#[derive(Debug)]
pub(crate) struct CachedDir {
    pub(crate) dir: ResolvedDir,
    /// The file-system check [`crate::mount`] makes on a mountpoint's directory, once.
    pub(crate) fs_kind: Option<Option<&'static str>>,
}

impl ParentDirs {
    /// `path`, made (parents `mode`) and resolved inside `root` by [`Root::mkdir_all`] the first
    /// time it is asked for.
    pub fn made(&mut self, root: &Root, path: &Path, mode: u32) -> Result<&ResolvedDir, RootError> {
        Ok(&self.entry_and_mountpoint_file(root, path, mode)?.0.dir)
    }

    /// [`ParentDirs::made`]'s entry (with its file-system check), and the batch's mountpoint file.
    pub(crate) fn entry_and_mountpoint_file(
        &mut self,
        root: &Root,
        path: &Path,
        mode: u32,
    ) -> Result<(&mut CachedDir, &mut Option<OwnedFd>), RootError> {
        use std::collections::hash_map::Entry;
        let cached = match self.dirs.entry(path.to_owned()) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(CachedDir { dir: root.mkdir_all(path, mode)?, fs_kind: None }),
        };
        Ok((cached, &mut self.mountpoint_file))
    }

    /// Drops every directory (after something that may change what a directory path resolves to).
    pub fn forget(&mut self) {
        self.dirs.clear();
    }
}

/// A directory resolved inside a root, usable by path-based code through `/proc/self/fd`.
///
/// [`ResolvedDir::proc_path`] names the directory the kernel resolved, not a path that could be
/// re-resolved differently later, so path-based writers (such as [`crate::write_atomic`]) given
/// `proc_path().join(name)` stay inside the root even if a component is swapped for a symlink
/// afterwards.
#[derive(Debug)]
pub struct ResolvedDir {
    fd: OwnedFd,
}

impl ResolvedDir {
    /// `/proc/self/fd/<n>`: the resolved directory, for path-based calls in this process.
    pub fn proc_path(&self) -> PathBuf {
        proc_fd(&self.fd)
    }
}

impl AsFd for ResolvedDir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn refused(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("is {what}, not a regular file; refusing to read it"))
}

/// The file type in words, for refusals.
fn describe(meta: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_symlink() {
        "a symlink"
    } else {
        "not a regular file"
    }
}

impl Root {
    /// Opens the root directory `path` (a host path; symlinks in it are the caller's to trust).
    pub fn open(path: &Path) -> Result<Root, RootError> {
        let fd = nix::fcntl::open(path, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| RootError {
                op: "open",
                path: "/".into(),
                root: path.display().to_string(),
                source: e.into(),
            })?;
        Ok(Root { path: path.to_owned(), fd })
    }

    /// The root's host path, as given to [`Root::open`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The host path of `path` inside the root, without resolving anything (for messages).
    pub fn display_path(&self, path: &Path) -> PathBuf {
        self.path.join(relative(path))
    }

    fn err(&self, op: &'static str, path: &Path, e: impl Into<io::Error>) -> RootError {
        RootError {
            op,
            path: path.display().to_string(),
            root: self.path.display().to_string(),
            source: explain_loop(e.into()),
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

    /// `path` resolved inside the root with `flags` (for this crate's other modules).
    pub(crate) fn resolve_fd(&self, path: &Path, flags: OFlag) -> nix::Result<OwnedFd> {
        self.resolve(path, flags, Mode::empty())
    }

    /// Opens the regular file `path` for reading, following symlinks inside the root. Anything
    /// else (FIFO, device, socket, directory) is refused before it is read; the open itself never
    /// blocks.
    pub fn open_regular(&self, path: &Path) -> Result<(File, Metadata), RootError> {
        let fd = self
            .resolve(path, OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY, Mode::empty())
            .map_err(|e| self.err("open", path, e))?;
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| self.err("stat", path, e))?;
        if !meta.is_file() {
            return Err(self.err("open", path, refused(describe(&meta))));
        }
        Ok((file, meta))
    }

    /// Reads the regular file `path` whole; a file larger than `limit` bytes is refused.
    pub fn read_regular(&self, path: &Path, limit: u64) -> Result<Vec<u8>, RootError> {
        let (file, meta) = self.open_regular(path)?;
        let too_big = || {
            self.err(
                "read",
                path,
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("is larger than the {limit}-byte limit for this file; refusing to read it"),
                ),
            )
        };
        if meta.len() > limit {
            return Err(too_big());
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        // Bounded even if the file grows while it is read.
        file.take(limit + 1).read_to_end(&mut bytes).map_err(|e| self.err("read", path, e))?;
        if bytes.len() as u64 > limit {
            return Err(too_big());
        }
        Ok(bytes)
    }

    /// [`Root::read_regular`], with `None` when the file (or a directory above it) does not exist.
    pub fn read_optional(&self, path: &Path, limit: u64) -> Result<Option<Vec<u8>>, RootError> {
        match self.read_regular(path, limit) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            other => other.map(Some),
        }
    }

    /// The metadata of `path` itself (a final symlink is not followed); `None` if missing.
    pub fn symlink_metadata(&self, path: &Path) -> Result<Option<Metadata>, RootError> {
        match self.resolve(path, OFlag::O_PATH | OFlag::O_NOFOLLOW, Mode::empty()) {
            Ok(fd) => File::from(fd).metadata().map(Some).map_err(|e| self.err("stat", path, e)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(self.err("stat", path, e)),
        }
    }

    /// The metadata of what `path` leads to, following symlinks inside the root; `None` if missing
    /// (including a dangling symlink).
    pub fn metadata(&self, path: &Path) -> Result<Option<Metadata>, RootError> {
        match self.resolve(path, OFlag::O_PATH, Mode::empty()) {
            Ok(fd) => File::from(fd).metadata().map(Some).map_err(|e| self.err("stat", path, e)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(self.err("stat", path, e)),
        }
    }

    /// The target of the symlink `path`, as written in the link.
    pub fn read_link(&self, path: &Path) -> Result<PathBuf, RootError> {
        let fd = self
            .resolve(path, OFlag::O_PATH | OFlag::O_NOFOLLOW, Mode::empty())
            .map_err(|e| self.err("open", path, e))?;
        nix::fcntl::readlinkat(fd.as_fd(), "").map(PathBuf::from).map_err(|e| self.err("readlink", path, e))
    }

    /// Where `path` leads inside the root once every symlink is followed (an absolute path inside
    /// the root, like `realpath` run with the root as `/`).
    pub fn canonicalize(&self, path: &Path) -> Result<PathBuf, RootError> {
        let fd =
            self.resolve(path, OFlag::O_PATH, Mode::empty()).map_err(|e| self.err("resolve", path, e))?;
        let host = fd_path(&fd).map_err(|e| self.err("resolve", path, e))?;
        let root = fd_path(&self.fd).map_err(|e| self.err("resolve", Path::new("/"), e))?;
        let inside = host.strip_prefix(&root).map_err(|_| {
            self.err(
                "resolve",
                path,
                io::Error::other(format!("resolved to {} outside the root", host.display())),
            )
        })?;
        Ok(Path::new("/").join(inside))
    }

    /// Whether directory `path` exists inside the root (following symlinks inside it).
    pub fn dir_exists(&self, path: &Path) -> bool {
        self.resolve(path, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty()).is_ok()
    }

    /// The directory `path`, resolved inside the root (it must exist).
    pub fn open_dir(&self, path: &Path) -> Result<ResolvedDir, RootError> {
        self.resolve(path, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())
            .map(|fd| ResolvedDir { fd })
            .map_err(|e| self.err("open directory", path, e))
    }

    /// The entries of directory `path` (following symlinks inside the root to reach it), sorted by
    /// name, each with its own type (a symlink entry is reported as [`EntryType::Symlink`]); at
    /// most [`MAX_DIR_ENTRIES`] of them.
    pub fn read_dir(&self, path: &Path) -> Result<Vec<(OsString, EntryType)>, RootError> {
        self.read_dir_at_most(path, MAX_DIR_ENTRIES)
    }

    /// [`Root::read_dir`] with a caller's cap: a directory with more than `limit` entries is refused
    /// (kind `FileTooLarge`) as soon as the listing passes it, so a hostile tree with millions of
    /// names costs no more memory than `limit` entries.
    pub fn read_dir_at_most(
        &self,
        path: &Path,
        limit: usize,
    ) -> Result<Vec<(OsString, EntryType)>, RootError> {
        use std::os::unix::ffi::OsStrExt;
        let fd = self
            .resolve(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty())
            .map_err(|e| self.err("list", path, e))?;
        let mut dir = nix::dir::Dir::from_fd(fd).map_err(|e| self.err("list", path, e))?;
        let dir_fd = dir.as_raw_fd();
        let mut out = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(|e| self.err("list", path, e))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let kind = match entry.file_type() {
                Some(nix::dir::Type::File) => EntryType::File,
                Some(nix::dir::Type::Directory) => EntryType::Dir,
                Some(nix::dir::Type::Symlink) => EntryType::Symlink,
                Some(_) => EntryType::Other,
                // Some file systems leave d_type unset: ask for the entry's own type.
                None => {
                    // SAFETY: `dir_fd` stays open for the loop (owned by `dir`).
                    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(dir_fd) };
                    match nix::sys::stat::fstatat(
                        borrowed,
                        entry.file_name(),
                        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                    ) {
                        Ok(st) => match st.st_mode & nix::libc::S_IFMT {
                            nix::libc::S_IFREG => EntryType::File,
                            nix::libc::S_IFDIR => EntryType::Dir,
                            nix::libc::S_IFLNK => EntryType::Symlink,
                            _ => EntryType::Other,
                        },
                        Err(Errno::ENOENT) => continue,
                        Err(e) => {
                            return Err(self.err("stat", &Path::new(path).join(OsStr::from_bytes(name)), e));
                        }
                    }
                }
            };
            if out.len() == limit {
                let why = format!("more than {limit} entries; a directory this large is refused");
                return Err(self.err("list", path, io::Error::new(io::ErrorKind::FileTooLarge, why)));
            }
            out.push((OsStr::from_bytes(name).to_owned(), kind));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Opens directory `path` inside the root, creating missing components with exactly `mode`
    /// (the umask does not reduce it; existing directories keep theirs).
    ///
    /// A component that is a symlink to a missing directory gets that directory made where the
    /// link leads inside the root (as runc makes mountpoints), at most [`MAX_LINK_HOPS`] links
    /// deep; the link itself is never replaced.
    pub fn mkdir_all(&self, path: &Path, mode: u32) -> Result<ResolvedDir, RootError> {
        let open_root = || {
            self.resolve(Path::new("/"), OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())
                .map_err(|e| self.err("open", Path::new("/"), e))
        };
        // Most calls name a directory that is already there: one lookup then.
        if let Ok(fd) = self.resolve(path, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty()) {
            return Ok(ResolvedDir { fd });
        }
        let mut current = open_root()?;
        let mut so_far = PathBuf::from("/");
        let mut pending: std::collections::VecDeque<OsString> = components(path).into();
        let mut hops = 0;
        while let Some(name) = pending.pop_front() {
            let mut created = false;
            if name == ".." {
                // Kept for the kernel to resolve (in the root: `..` of the root is the root).
                so_far.push("..");
            } else {
                so_far.push(&name);
                match mkdirat(current.as_fd(), name.as_os_str(), Mode::from_bits_truncate(mode)) {
                    Ok(()) => created = true,
                    Err(Errno::EEXIST) => {}
                    Err(e) => return Err(self.err("mkdir", &so_far, e)),
                }
            }
            // Resolve the whole prefix again from the root so a symlink component is followed
            // inside the root, never outside. A directory made now is opened for reading: its fd
            // can then be fchmod'ed directly.
            let open_as = if created { OFlag::O_RDONLY } else { OFlag::O_PATH };
            match self.resolve(&so_far, open_as | OFlag::O_DIRECTORY, Mode::empty()) {
                Ok(fd) => current = fd,
                Err(Errno::ENOENT) if !created && name != ".." => {
                    // A dangling symlink (anything else would have resolved): continue along its
                    // target, relative to the link's directory or to the root.
                    let target = nix::fcntl::readlinkat(current.as_fd(), name.as_os_str())
                        .map_err(|_| self.err("open directory", &so_far, Errno::ENOENT))?;
                    hops += 1;
                    if hops > MAX_LINK_HOPS {
                        return Err(self.err("open directory", &so_far, Errno::ELOOP));
                    }
                    so_far.pop();
                    let target = Path::new(&target);
                    if target.is_absolute() {
                        so_far = PathBuf::from("/");
                        current = open_root()?;
                    }
                    for c in components(target).into_iter().rev() {
                        pending.push_front(c);
                    }
                    continue;
                }
                Err(e) => return Err(self.err("open directory", &so_far, e)),
            }
            if created {
                // mkdir applied the umask; the caller asked for exactly `mode`. Changed only when
                // the umask took bits away: on overlayfs a chmod is a metadata write of its own.
                let made = nix::sys::stat::fstat(&current).map_err(|e| self.err("stat", &so_far, e))?;
                if made.st_mode & 0o7777 != mode & 0o7777 {
                    nix::sys::stat::fchmod(&current, Mode::from_bits_truncate(mode))
                        .map_err(|e| self.err("chmod", &so_far, e))?;
                }
            }
        }
        Ok(ResolvedDir { fd: current })
    }

    /// Makes the symlink `link` -> `target` inside the root (missing parents created 0755).
    /// Whatever already occupies `link` is left alone and reported.
    pub fn symlink(&self, target: &Path, link: &Path) -> Result<LinkOutcome, RootError> {
        self.symlink_in(&mut ParentDirs::default(), target, link)
    }

    /// [`Root::symlink`], taking the link's directory from `dirs` when an earlier call of the same
    /// batch already made or resolved it (one `symlinkat` per link then).
    pub fn symlink_in(
        &self,
        dirs: &mut ParentDirs,
        target: &Path,
        link: &Path,
    ) -> Result<LinkOutcome, RootError> {
        let (parent, name) =
            split(link).ok_or_else(|| self.err("symlink", link, io::ErrorKind::InvalidInput))?;
        let dir = dirs.made(self, &parent, 0o755)?;
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

    /// Points `link` at `target`, replacing a symlink or regular file already there (atomically,
    /// through a temp link and a rename; a directory in the way is an error). Parents must exist.
    pub fn replace_symlink(&self, target: &Path, link: &Path) -> Result<(), RootError> {
        let (parent, name) =
            split(link).ok_or_else(|| self.err("symlink", link, io::ErrorKind::InvalidInput))?;
        let dir = self.open_dir(&parent)?;
        let temp = temp_name(name);
        clear_temp(&dir, &temp).map_err(|e| self.err("remove stale temp link for", link, e))?;
        nix::unistd::symlinkat(target, dir.as_fd(), temp.as_os_str())
            .map_err(|e| self.err("symlink", link, e))?;
        nix::fcntl::renameat(dir.as_fd(), temp.as_os_str(), dir.as_fd(), name).map_err(|e| {
            let _ = nix::unistd::unlinkat(dir.as_fd(), temp.as_os_str(), UnlinkatFlags::NoRemoveDir);
            self.err("rename", link, e)
        })
    }

    /// Replaces the file `path` inside the root with `bytes`, mode exactly `mode` (its directory
    /// must exist). Written through a temp file and a rename within that directory.
    ///
    /// The temp name is in the tree owner's hands too: whatever is there (a symlink, a FIFO that
    /// would block the open, a device node that would be written to) is removed, and the temp file
    /// is created with `O_EXCL | O_NOFOLLOW`, so only a fresh regular file of ours is ever written.
    pub fn write_file(&self, path: &Path, bytes: &[u8], mode: u32) -> Result<(), RootError> {
        let (parent, name) =
            split(path).ok_or_else(|| self.err("write", path, io::ErrorKind::InvalidInput))?;
        let dir = self.open_dir(&parent)?;
        let temp = temp_name(name);
        clear_temp(&dir, &temp).map_err(|e| self.err("remove stale temp file for", path, e))?;
        let fd = nix::fcntl::openat(
            dir.as_fd(),
            temp.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )
        .map_err(|e| self.err("create", path, e))?;
        let mut file = File::from(fd);
        let result = file
            .set_permissions(std::fs::Permissions::from_mode(mode))
            .and_then(|()| file.write_all(bytes))
            .map_err(|e| self.err("write", path, e))
            .and_then(|()| {
                nix::fcntl::renameat(dir.as_fd(), temp.as_os_str(), dir.as_fd(), name)
                    .map_err(|e| self.err("rename", path, e))
            });
        if result.is_err() {
            let _ = nix::unistd::unlinkat(dir.as_fd(), temp.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
        result
    }

    /// Removes the file or symlink `path` (never a directory); false if it was not there.
    pub fn remove_file(&self, path: &Path) -> Result<bool, RootError> {
        let (parent, name) =
            split(path).ok_or_else(|| self.err("remove", path, io::ErrorKind::InvalidInput))?;
        let dir = match self.open_dir(&parent) {
            Ok(dir) => dir,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        match nix::unistd::unlinkat(dir.as_fd(), name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(self.err("remove", path, e)),
        }
    }
}

/// ELOOP from a lookup here mostly means a `/proc/<pid>/root`-style link on the way (refused by
/// `RESOLVE_NO_MAGICLINKS`: it leads out of the root), which "Too many levels of symbolic links"
/// does not tell whoever reads the error; say so and what to fix. The kind is kept.
pub(crate) fn explain_loop(e: io::Error) -> io::Error {
    if e.raw_os_error() != Some(Errno::ELOOP as i32) {
        return e;
    }
    io::Error::new(
        e.kind(),
        "a symlink on the way is a /proc magic link (such as /proc/1/root, which leads out of the \
         root) or symlinks loop (ELOOP); refusing to follow it: make that link point inside the root",
    )
}

fn temp_name(name: &OsStr) -> OsString {
    let mut temp = OsString::from(".");
    temp.push(name);
    temp.push(".nvinject.tmp");
    temp
}

fn clear_temp(dir: &ResolvedDir, temp: &OsStr) -> nix::Result<()> {
    match nix::unistd::unlinkat(dir.as_fd(), temp, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e),
    }
}

/// `/proc/self/fd/<n>`: the file `fd` names, for path-based calls in this process.
pub(crate) fn proc_fd(fd: &impl AsRawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

fn fd_path(fd: &OwnedFd) -> io::Result<PathBuf> {
    std::fs::read_link(proc_fd(fd))
}

/// The names and `..`s of `path`, in order (`/` and `.` dropped).
fn components(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

/// `path` without its leading `/` (and without `.`/`..` handling: the kernel does that in-root).
fn relative(path: &Path) -> PathBuf {
    path.components().filter(|c| !matches!(c, Component::RootDir | Component::Prefix(_))).collect()
}

/// Parent directory and final name; `None` for `/` or a path ending in `..`.
pub(crate) fn split(path: &Path) -> Option<(PathBuf, &OsStr)> {
    let name = path.file_name()?;
    let parent = path.parent().map(Path::to_owned).unwrap_or_else(|| PathBuf::from("/"));
    Some((parent, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{MetadataExt, symlink};

    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("rootfs");
        let outside = dir.path().join("outside");
        fs::create_dir_all(root.join("usr/lib/x86_64-linux-gnu")).unwrap();
        fs::create_dir_all(&outside).unwrap();
        (dir, root, outside)
    }

    fn mknod_fifo(path: &Path) {
        nix::unistd::mkfifo(path, Mode::from_bits_truncate(0o644)).unwrap();
    }

    #[test]
    fn symlinks_are_created_with_parents_and_are_idempotent() {
        let (_d, root, _) = setup();
        let r = Root::open(&root).unwrap();
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
        r.replace_symlink(Path::new("other"), link).unwrap();
        assert_eq!(
            fs::read_link(root.join("usr/lib/x86_64-linux-gnu/libcuda.so")).unwrap(),
            Path::new("other")
        );
        r.symlink(Path::new("/usr/bin/nvidia-smi"), Path::new("/new/dir/deep/smi")).unwrap();
        assert!(root.join("new/dir/deep").is_dir());
        r.symlink(Path::new("t"), Path::new("/new/../up/link")).unwrap();
        assert!(fs::symlink_metadata(root.join("up/link")).is_ok());
        assert!(!root.join("new/up").exists());
        r.symlink(Path::new("t"), Path::new("/../../top-link")).unwrap();
        assert!(fs::symlink_metadata(root.join("top-link")).is_ok());
    }

    #[test]
    fn symlinks_and_magic_links_in_the_tree_resolve_inside_the_root() {
        let (_d, root, outside) = setup();
        fs::write(outside.join("secret"), b"host").unwrap();
        symlink("usr/lib", root.join("lib")).unwrap();
        symlink(&outside, root.join("etc")).unwrap();
        symlink("../../../../../../..", root.join("lib64")).unwrap();
        // A magic link out: /proc/1/root is the host's / for a process in the host's mount namespace.
        symlink(format!("/proc/self/root{}", outside.display()), root.join("var")).unwrap();
        symlink("/proc/self/root", root.join("hostroot")).unwrap();
        let r = Root::open(&root).unwrap();
        r.symlink(Path::new("libcuda.so.1"), Path::new("/lib/x86_64-linux-gnu/libcuda.so")).unwrap();
        assert!(fs::symlink_metadata(root.join("usr/lib/x86_64-linux-gnu/libcuda.so")).is_ok());
        // /etc leads (inside the root) to a directory that is not there: it is made there.
        r.symlink(Path::new("x"), Path::new("/etc/ld.so.conf.d/link")).unwrap();
        let inside = root.join(outside.strip_prefix("/").unwrap()).join("ld.so.conf.d/link");
        assert!(fs::symlink_metadata(&inside).unwrap().file_type().is_symlink());
        r.symlink(Path::new("y"), Path::new("/lib64/escape")).unwrap();
        assert!(fs::symlink_metadata(root.join("escape")).is_ok(), "`..` stops at the root");
        // Reads never reach the host either way.
        assert_eq!(r.read_optional(Path::new("/etc/secret"), 100).unwrap(), None);
        assert!(r.read_regular(Path::new("/var/secret"), 100).is_err());
        assert!(r.read_regular(Path::new("/hostroot/etc/hostname"), 100).is_err());
        assert!(r.read_dir(Path::new("/hostroot")).is_err());
        assert!(r.write_file(Path::new("/var/x"), b"x", 0o644).is_err());
        assert!(
            r.write_file(Path::new("/lib64/absent/x"), b"x", 0o644).is_err(),
            "no /absent inside the root"
        );
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 1, "nothing may be created outside the root");
        assert_eq!(
            r.canonicalize(Path::new("/lib/x86_64-linux-gnu")).unwrap(),
            Path::new("/usr/lib/x86_64-linux-gnu")
        );
        assert_eq!(r.canonicalize(Path::new("/lib64")).unwrap(), Path::new("/"));
        assert_eq!(r.read_link(Path::new("/lib")).unwrap(), Path::new("usr/lib"));
    }

    #[test]
    #[ignore = "needs root"]
    fn a_refused_magic_link_or_loop_is_explained() {
        nvinject_test_support::require_root("mknod");
        let (_d, root, _) = setup();
        symlink("/loop-b", root.join("loop-a")).unwrap();
        symlink("/loop-a", root.join("loop-b")).unwrap();
        let r = Root::open(&root).unwrap();
        let eloop = io::Error::from_raw_os_error(Errno::ELOOP as i32).kind();
        let mut errs = vec![r.read_dir(Path::new("/loop-a")).unwrap_err()];
        // The real magic link, where this test may mount: the host's /proc inside the root.
        fs::create_dir(root.join("proc")).unwrap();
        let mounted = nix::mount::mount(
            Some(Path::new("/proc")),
            &root.join("proc"),
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .is_ok();
        if mounted {
            /// Unmounts on drop, whether the test passes or not.
            struct Unmount(PathBuf);
            impl Drop for Unmount {
                fn drop(&mut self) {
                    let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
                }
            }
            let _unmount = Unmount(root.join("proc"));
            symlink("/proc/self/root/etc", root.join("etc")).unwrap();
            errs.push(r.write_file(Path::new("/etc/ld.so.cache"), b"x", 0o644).unwrap_err());
        }
        assert_eq!(errs.len(), 2, "this test runs as root (CI does) to mount /proc in the root");
        for err in errs {
            assert_eq!(err.kind(), eloop, "{err}");
            assert!(err.to_string().contains("/proc magic link"), "the refusal says why: {err}");
        }
    }

    #[test]
    #[ignore = "needs root"]
    fn reads_refuse_what_is_not_a_regular_file_and_never_block() {
        nvinject_test_support::require_root("mknod");
        let (_d, root, _) = setup();
        let r = Root::open(&root).unwrap();
        mknod_fifo(&root.join("fifo"));
        symlink("/fifo", root.join("to-fifo")).unwrap();
        for p in ["/fifo", "/to-fifo", "/usr"] {
            let err = r.read_regular(Path::new(p), 1 << 20).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{p}: {err}");
            assert!(err.to_string().contains("not a regular file"), "{err}");
        }
        nix::sys::stat::mknod(
            &root.join("zero"),
            nix::sys::stat::SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(1, 5),
        )
        .expect("mknod (the tests run as root)");
        let err = r.read_regular(Path::new("/zero"), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("a character device"), "{err}");
        fs::write(root.join("big"), vec![b'x'; 1000]).unwrap();
        let err = r.read_regular(Path::new("/big"), 999).unwrap_err();
        assert!(err.to_string().contains("999-byte limit"), "{err}");
        assert_eq!(r.read_regular(Path::new("/big"), 1000).unwrap().len(), 1000);
        symlink("/nowhere", root.join("dangling")).unwrap();
        assert_eq!(r.read_optional(Path::new("/dangling"), 10).unwrap(), None);
        assert!(r.metadata(Path::new("/dangling")).unwrap().is_none());
        assert!(r.symlink_metadata(Path::new("/dangling")).unwrap().unwrap().file_type().is_symlink());
        let listed = r.read_dir(Path::new("/")).unwrap();
        let kinds: Vec<_> = listed.iter().map(|(n, k)| (n.to_str().unwrap(), *k)).collect();
        assert!(kinds.contains(&("fifo", EntryType::Other)));
        assert!(kinds.contains(&("dangling", EntryType::Symlink)));
        assert!(kinds.contains(&("usr", EntryType::Dir)));
        assert!(kinds.contains(&("big", EntryType::File)));
    }

    #[test]
    fn a_listing_past_its_cap_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        for i in 0..10 {
            fs::write(tmp.path().join(format!("f{i}")), "").unwrap();
        }
        let r = Root::open(tmp.path()).unwrap();
        assert_eq!(r.read_dir_at_most(Path::new("/"), 10).unwrap().len(), 10);
        let err = r.read_dir_at_most(Path::new("/"), 9).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
        assert!(err.to_string().contains("more than 9 entries"), "{err}");
    }

    #[test]
    fn writes_stay_inside_and_never_write_through_what_is_at_the_temp_name() {
        let (_d, root, outside) = setup();
        let conf_d = root.join("etc/ld.so.conf.d");
        fs::create_dir_all(&conf_d).unwrap();
        let temp = conf_d.join(".00-nvinject.conf.nvinject.tmp");
        let r = Root::open(&root).unwrap();
        let dropin = Path::new("/etc/ld.so.conf.d/00-nvinject.conf");

        let victim = outside.join("victim");
        fs::write(&victim, b"host data").unwrap();
        symlink(&victim, &temp).unwrap();
        r.write_file(dropin, b"/usr/lib\n", 0o644).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"host data");
        assert_eq!(fs::read(conf_d.join("00-nvinject.conf")).unwrap(), b"/usr/lib\n");

        mknod_fifo(&temp);
        r.write_file(dropin, b"/usr/lib64\n", 0o600).unwrap();
        let written = fs::symlink_metadata(conf_d.join("00-nvinject.conf")).unwrap();
        assert!(written.file_type().is_file(), "{:?}", written.file_type());
        assert_eq!(written.mode() & 0o7777, 0o600);
        assert!(fs::symlink_metadata(&temp).is_err(), "no temp file left");
        let err = r.write_file(Path::new("/nope/x.conf"), b"", 0o644).unwrap_err();
        assert!(err.to_string().contains("/nope"), "{err}");
        assert!(r.remove_file(dropin).unwrap());
        assert!(!r.remove_file(dropin).unwrap());
        assert!(!r.remove_file(Path::new("/nope/x")).unwrap());
    }

    #[test]
    fn modes_are_exact_whatever_the_umask() {
        let (_d, root, _) = setup();
        let r = Root::open(&root).unwrap();
        let old = nix::sys::stat::umask(Mode::from_bits_truncate(0o077));
        let made = r
            .mkdir_all(Path::new("/a/b"), 0o755)
            .and_then(|_| r.write_file(Path::new("/a/b/f"), b"x", 0o644));
        nix::sys::stat::umask(Mode::from_bits_truncate(0o000));
        let open = r.mkdir_all(Path::new("/c"), 0o700);
        nix::sys::stat::umask(old);
        made.unwrap();
        let open_dir = open.unwrap();
        assert!(open_dir.proc_path().starts_with("/proc/self/fd"));
        for (p, mode) in [("a", 0o755), ("a/b", 0o755), ("a/b/f", 0o644), ("c", 0o700)] {
            assert_eq!(fs::metadata(root.join(p)).unwrap().mode() & 0o7777, mode, "{p}");
        }
        // Path-based code given a resolved directory stays in it.
        fs::write(open_dir.proc_path().join("through-proc"), b"y").unwrap();
        assert!(root.join("c/through-proc").is_file());
    }

    #[test]
    fn missing_dirs_behind_dangling_links_are_made_inside_the_root() {
        let (_d, root, outside) = setup();
        let r = Root::open(&root).unwrap();
        fs::create_dir_all(root.join("usr")).unwrap();
        // Absolute, relative and `..`-laden links to directories that do not exist yet, and a
        // chain of two; each must end up created inside the root, the outside dir untouched.
        symlink(&outside, root.join("usr/abs")).unwrap();
        symlink("../../../../made/rel", root.join("usr/rel")).unwrap();
        symlink("/usr/chain2", root.join("usr/chain1")).unwrap();
        symlink("../deep/end", root.join("usr/chain2")).unwrap();
        for (path, made) in [
            ("/usr/abs/lib", format!("{}/lib", outside.strip_prefix("/").unwrap().display())),
            ("/usr/rel/lib", "made/rel/lib".to_owned()),
            ("/usr/chain1/lib", "deep/end/lib".to_owned()),
        ] {
            r.mkdir_all(Path::new(path), 0o755).unwrap();
            assert!(root.join(&made).is_dir(), "{path}: {made} not made");
        }
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0, "a directory appeared outside the root");
        // A loop is refused (bounded), not followed forever.
        symlink("/usr/loop-b", root.join("usr/loop-a")).unwrap();
        symlink("/usr/loop-a", root.join("usr/loop-b")).unwrap();
        let err = r.mkdir_all(Path::new("/usr/loop-a/x"), 0o755).unwrap_err();
        assert!(err.to_string().contains("/usr/loop"), "{err}");
    }
}
