//! Bind mounts into a root someone else controls (a container's rootfs before `pivot_root`).
//!
//! The mountpoint is resolved (and, when missing, created) inside the root exactly as
//! [`Root`]'s other operations are, and the mount is attached to the **file descriptor** of that
//! resolved mountpoint, never to a path that could be resolved again differently: a symlink in the
//! image can move the mountpoint around inside the image, never onto the host. A mountpoint on
//! procfs or sysfs (an image symlink into the container's own `/proc` or `/sys`) is refused, as
//! runc refuses mounts over those.
//!
//! The source is a host path the caller trusts (it comes from a root-owned CDI spec).
//!
//! Where the kernel has the mount API of Linux 5.12 (`open_tree`, `mount_setattr`, `move_mount`)
//! the source is cloned, given its flags while still detached and attached in three calls; older
//! kernels get `mount(2)` on `/proc/self/fd/<mountpoint>` plus a remount, as runc does.

use std::ffi::CString;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::libc;
use nix::mount::MsFlags;
use nix::sys::stat::Mode;

use crate::root::{ParentDirs, Root, proc_fd, split};

/// Mount propagation to give the new mount (the `rprivate`, `rslave`, ... mount options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    /// `private`: no events in or out.
    Private,
    /// `slave`: events from the source's peers come in, none go out.
    Slave,
    /// `shared`: events go both ways.
    Shared,
    /// `unbindable`: private, and cannot be bind-mounted again.
    Unbindable,
}

impl Propagation {
    fn ms_flag(self) -> MsFlags {
        match self {
            Propagation::Private => MsFlags::MS_PRIVATE,
            Propagation::Slave => MsFlags::MS_SLAVE,
            Propagation::Shared => MsFlags::MS_SHARED,
            Propagation::Unbindable => MsFlags::MS_UNBINDABLE,
        }
    }
}

/// How to bind-mount: the meaning of an OCI bind mount's options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BindOptions {
    /// `rbind`: mounts below the source come along.
    pub recursive: bool,
    /// `ro`.
    pub read_only: bool,
    /// `nosuid`.
    pub nosuid: bool,
    /// `nodev`.
    pub nodev: bool,
    /// `noexec`.
    pub noexec: bool,
    /// Propagation, when one was named; applied to the whole new tree when `recursive_propagation`.
    pub propagation: Option<Propagation>,
    /// `rprivate` (and the other `r` forms) rather than `private`.
    pub recursive_propagation: bool,
}

/// Which kernel interface [`Root::bind_mount`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountApi {
    /// `open_tree` + `mount_setattr` + `move_mount`, falling back to [`MountApi::Classic`] where
    /// the kernel lacks them (ENOSYS).
    Auto,
    /// `mount(2)` on `/proc/self/fd/<n>` and a remount for the flags.
    Classic,
}

/// A bind mount that could not be made.
#[derive(Debug, thiserror::Error)]
#[error("bind mount {} -> {destination} in {root}: {step}: {error}", source_path.display())]
pub struct BindError {
    /// The host path being mounted.
    pub source_path: PathBuf,
    /// The mountpoint, inside the root.
    pub destination: String,
    /// The root on the host.
    pub root: String,
    /// What was being done.
    pub step: &'static str,
    /// What the kernel said, or why it was refused.
    pub error: io::Error,
}

// From <linux/mount.h>; the libc crate has the syscall numbers but not yet these.
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

impl BindOptions {
    fn attr_bits(&self) -> u64 {
        let mut bits = 0;
        for (on, bit) in [
            (self.read_only, MOUNT_ATTR_RDONLY),
            (self.nosuid, MOUNT_ATTR_NOSUID),
            (self.nodev, MOUNT_ATTR_NODEV),
            (self.noexec, MOUNT_ATTR_NOEXEC),
        ] {
            if on {
                bits |= bit;
            }
        }
        bits
    }

    fn ms_flags(&self) -> MsFlags {
        let mut flags = MsFlags::empty();
        flags.set(MsFlags::MS_RDONLY, self.read_only);
        flags.set(MsFlags::MS_NOSUID, self.nosuid);
        flags.set(MsFlags::MS_NODEV, self.nodev);
        flags.set(MsFlags::MS_NOEXEC, self.noexec);
        flags
    }
}

fn open_tree(source: &Path, recursive: bool) -> Result<OwnedFd, Errno> {
    let path = CString::new(source.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    let mut flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: a plain syscall with a valid NUL-terminated path; the returned fd is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

fn mount_setattr(tree: &OwnedFd, recursive: bool, attr: &MountAttr) -> Result<(), Errno> {
    let mut flags = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: `attr` is a live `struct mount_attr` of the size passed; the path is an empty C string.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            flags,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc < 0 { Err(Errno::last()) } else { Ok(()) }
}

/// Where a bind mount goes.
enum MountTarget {
    /// An open mountpoint (one the image has, or a file made just now, with the fd that made it).
    Open(OwnedFd),
    /// `name` in `dir` (a duplicate of the batch's directory fd), which this batch made a moment
    /// ago (a hard link or a directory): moved onto by name instead of being opened first. It is
    /// one component in a directory already resolved inside the root, and `move_mount` without
    /// `MOVE_MOUNT_T_SYMLINKS` does not follow a symlink there.
    Made { dir: OwnedFd, name: CString },
}

impl MountTarget {
    /// The mountpoint as an fd (`O_PATH`), for the calls that take one.
    fn into_fd(self) -> nix::Result<OwnedFd> {
        match self {
            MountTarget::Open(fd) => Ok(fd),
            MountTarget::Made { dir, name } => nix::fcntl::openat(
                &dir,
                name.as_c_str(),
                OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            ),
        }
    }
}

fn move_mount(tree: &OwnedFd, target: &MountTarget) -> Result<(), Errno> {
    let (to_fd, to_path, flags) = match target {
        MountTarget::Open(fd) => (fd.as_raw_fd(), c"", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH),
        MountTarget::Made { dir, name } => (dir.as_raw_fd(), name.as_c_str(), MOVE_MOUNT_F_EMPTY_PATH),
    };
    // SAFETY: both fds are open for the call; the paths are NUL-terminated C strings.
    let rc = unsafe {
        libc::syscall(libc::SYS_move_mount, tree.as_raw_fd(), c"".as_ptr(), to_fd, to_path.as_ptr(), flags)
    };
    if rc < 0 { Err(Errno::last()) } else { Ok(()) }
}

// From <linux/mount.h>, for a private tmpfs made without a mountpoint.
const FSOPEN_CLOEXEC: libc::c_uint = 0x1;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 0x1;

/// Takes ownership of a file descriptor a syscall returned, or its error.
fn owned_fd(rc: libc::c_long) -> Result<OwnedFd, Errno> {
    if rc < 0 {
        return Err(Errno::last());
    }
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as libc::c_int) })
}

/// A tmpfs that is mounted nowhere (`fsopen` + `fsmount`): what is written into it is reachable
/// only through the returned fd and the mounts cloned from it.
fn detached_tmpfs(size: usize) -> Result<OwnedFd, (&'static str, Errno)> {
    // SAFETY: plain syscalls with NUL-terminated strings; returned fds are owned at once.
    let fs = owned_fd(unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC) })
        .map_err(|e| ("fsopen tmpfs", e))?;
    let size = CString::new(size.to_string()).expect("digits");
    for (key, value) in [(c"size", size.as_c_str()), (c"mode", c"0755")] {
        // SAFETY: as above; `fs` is open for the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                FSCONFIG_SET_STRING,
                key.as_ptr(),
                value.as_ptr(),
                0,
            )
        };
        if rc < 0 {
            return Err(("fsconfig", Errno::last()));
        }
    }
    // SAFETY: as above.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if rc < 0 {
        return Err(("fsconfig create", Errno::last()));
    }
    let attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
    // SAFETY: as above.
    owned_fd(unsafe {
        libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, attrs as libc::c_uint)
    })
    .map_err(|e| ("fsmount", e))
}

/// What [`Root::cover_file`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Covered {
    /// The file now shows the given contents, read-only.
    Yes,
    /// There is no such file in the root: nothing to cover.
    Missing,
}

impl Root {
    /// Covers the existing regular file `destination` (resolved inside the root) with a private,
    /// read-only, `nosuid,nodev,noexec` file holding `contents`, so that processes in this mount
    /// namespace read `contents` there. Unlike [`Root::bind_mount`] this may cover a file on the
    /// container's procfs: that is what it is for (`/proc/driver/nvidia/params`), and the source
    /// is ours, never a host path.
    ///
    /// The file lives on a tmpfs that is mounted nowhere, so nothing is left in the container or
    /// on the host but the one mount. It needs the mount API of Linux 5.12 (`fsopen`,
    /// `open_tree`, `mount_setattr`, `move_mount`): on an older kernel the error's `error` is
    /// `ENOSYS`.
    pub fn cover_file(&self, destination: &Path, contents: &[u8]) -> Result<Covered, BindError> {
        let fail = |step: &'static str, error: io::Error| BindError {
            source_path: PathBuf::from("(private tmpfs)"),
            destination: destination.display().to_string(),
            root: self.path().display().to_string(),
            step,
            error,
        };
        let target = match self.resolve_fd(destination, OFlag::O_PATH) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(Covered::Missing),
            Err(e) => return Err(fail("open the file to cover", crate::root::explain_loop(e.into()))),
        };
        let meta = std::fs::metadata(proc_fd(&target)).map_err(|e| fail("stat the file to cover", e))?;
        if !meta.is_file() {
            let why = "not a regular file; only a file is covered";
            return Err(fail("stat the file to cover", io::Error::new(io::ErrorKind::InvalidInput, why)));
        }
        let errno = |(step, e): (&'static str, Errno)| fail(step, e.into());
        let tmpfs = detached_tmpfs(contents.len().max(4096)).map_err(errno)?;
        let flags = OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC;
        let file = nix::fcntl::openat(&tmpfs, "contents", flags, Mode::from_bits_truncate(0o444))
            .map_err(|e| fail("create the covering file", e.into()))?;
        std::io::Write::write_all(&mut std::fs::File::from(file), contents)
            .map_err(|e| fail("write the covering file", e))?;
        let clone_flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
        // SAFETY: `tmpfs` is open for the call and the path is a NUL-terminated C string.
        let tree = owned_fd(unsafe {
            libc::syscall(libc::SYS_open_tree, tmpfs.as_raw_fd(), c"contents".as_ptr(), clone_flags)
        })
        .map_err(|e| fail("open_tree", e.into()))?;
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        mount_setattr(&tree, false, &attr).map_err(|e| fail("mount_setattr", e.into()))?;
        move_mount(&tree, &MountTarget::Open(target)).map_err(|e| fail("move_mount", e.into()))?;
        Ok(Covered::Yes)
    }
}

/// A new file mountpoint `name` in `at` as a hard link to the batch's first one (`file`): a link
/// adds a directory entry where a new file also takes an inode, which on ext4 under overlayfs
/// costs about twice as much, and the ~50 a driver needs are freed as one inode when the
/// container's layer goes. `None` when there is no such file or the kernel refuses the link
/// (another mount: `EXDEV`; no `CAP_DAC_READ_SEARCH`): the caller makes a file instead. `EEXIST`
/// is returned as is (something is already there).
fn link_mountpoint(file: Option<&OwnedFd>, at: BorrowedFd<'_>, name: &OsStr) -> Option<nix::Result<()>> {
    let file = file?;
    match nix::unistd::linkat(file, c"", at, name, nix::fcntl::AtFlags::AT_EMPTY_PATH) {
        Ok(()) => Some(Ok(())),
        Err(Errno::EEXIST) => Some(Err(Errno::EEXIST)),
        Err(_) => None,
    }
}

/// `name` in `at`, made just now, as a [`MountTarget::Made`].
fn made_target(at: BorrowedFd<'_>, name: &OsStr) -> nix::Result<MountTarget> {
    let dir =
        at.try_clone_to_owned().map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EBADF)))?;
    let name = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
    Ok(MountTarget::Made { dir, name })
}

/// Whether `fd` is on a file system no bind mount may cover or make mountpoints in (the
/// container's procfs, sysfs or cgroup file system).
fn forbidden_fs(fd: &impl AsFd) -> io::Result<Option<&'static str>> {
    use nix::sys::statfs::{CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC, PROC_SUPER_MAGIC, SYSFS_MAGIC};
    let fs = nix::sys::statfs::fstatfs(fd)?;
    Ok(match fs.filesystem_type() {
        PROC_SUPER_MAGIC => Some("procfs"),
        SYSFS_MAGIC => Some("sysfs"),
        CGROUP_SUPER_MAGIC | CGROUP2_SUPER_MAGIC => Some("cgroup file system"),
        _ => None,
    })
}

impl Root {
    /// Bind-mounts the host path `source` at `destination` inside the root, creating the
    /// mountpoint (a directory for a directory source, else an empty file, parents 0755) when it
    /// is missing. Symlinks on the way to the mountpoint are followed inside the root (what a
    /// dangling one names is made there); a mountpoint of the wrong type, on (or in a directory on)
    /// procfs, sysfs or cgroupfs, or behind a `/proc` magic link or a loop of links is refused.
    pub fn bind_mount(
        &self,
        source: &Path,
        destination: &Path,
        options: &BindOptions,
        api: MountApi,
    ) -> Result<MountApi, BindError> {
        self.bind_mount_in(&mut ParentDirs::default(), source, destination, options, api)
    }

    /// [`Root::bind_mount`] as one of a batch: mountpoint directories come from `dirs` when an
    /// earlier mount of the batch made or resolved them, and a directory mount makes `dirs` forget
    /// them all (it may cover one).
    pub fn bind_mount_in(
        &self,
        dirs: &mut ParentDirs,
        source: &Path,
        destination: &Path,
        options: &BindOptions,
        api: MountApi,
    ) -> Result<MountApi, BindError> {
        let fail = |step: &'static str, error: io::Error| BindError {
            source_path: source.to_owned(),
            destination: destination.display().to_string(),
            root: self.path().display().to_string(),
            step,
            error,
        };
        let source_meta = std::fs::metadata(source).map_err(|e| fail("stat the source", e))?;
        let (target, made) = self
            .mountpoint(dirs, destination, source_meta.is_dir())
            .map_err(|e| fail("mountpoint", crate::root::explain_loop(e)))?;
        // A mountpoint made just now is of the right type, in a directory already checked not to
        // be procfs, sysfs or cgroupfs; one that was there is checked itself.
        if let MountTarget::Open(existing) = &target
            && !made
        {
            let target_meta =
                std::fs::metadata(proc_fd(existing)).map_err(|e| fail("stat the mountpoint", e))?;
            if target_meta.is_dir() != source_meta.is_dir() {
                let why = if source_meta.is_dir() {
                    "the source is a directory but the mountpoint in the image is not"
                } else {
                    "the source is not a directory but the mountpoint in the image is one"
                };
                return Err(fail("mountpoint", io::Error::new(io::ErrorKind::InvalidInput, why)));
            }
            if let Some(fs) = forbidden_fs(existing).map_err(|e| fail("statfs the mountpoint", e))? {
                let why = format!("resolves onto the container's {fs}; refusing to mount over it");
                return Err(fail("mountpoint", io::Error::new(io::ErrorKind::PermissionDenied, why)));
            }
        }
        if source_meta.is_dir() {
            dirs.forget();
        }
        if api == MountApi::Auto {
            match self.bind_new_api(source, &target, options) {
                Ok(()) => return Ok(MountApi::Auto),
                Err((_, Errno::ENOSYS)) => {}
                Err((step, e)) => return Err(fail(step, e.into())),
            }
        }
        let target = target.into_fd().map_err(|e| fail("open the mountpoint", e.into()))?;
        self.bind_classic(source, destination, &target, options).map_err(|(step, e)| fail(step, e.into()))?;
        Ok(MountApi::Classic)
    }

    /// The mountpoint `destination`, and whether it was made now (when missing). A
    /// symlink there is followed inside the root, and a dangling one gets its target made, as
    /// runc does.
    fn mountpoint(
        &self,
        dirs: &mut ParentDirs,
        destination: &Path,
        dir: bool,
    ) -> io::Result<(MountTarget, bool)> {
        let mut destination = destination.to_owned();
        for _ in 0..=crate::root::MAX_LINK_HOPS {
            let (parent, name) = split(&destination).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "a mountpoint must be an absolute path below /")
            })?;
            let (cached, mountpoint_file) = dirs
                .entry_and_mountpoint_file(self, &parent, 0o755)
                .map_err(|e| io::Error::new(e.kind(), format!("{} {}: {}", e.op, e.path, e.source)))?;
            let fs_kind = match cached.fs_kind {
                Some(kind) => kind,
                None => *cached.fs_kind.insert(forbidden_fs(&cached.dir)?),
            };
            let parent_dir = &cached.dir;
            let at = parent_dir.as_fd();
            if let Some(fs) = fs_kind {
                let why =
                    format!("its directory resolves onto the container's {fs}; refusing to mount there");
                return Err(io::Error::new(io::ErrorKind::PermissionDenied, why));
            }
            // Made first (the usual case: the image has no such file), never through a symlink.
            let made = if dir {
                nix::sys::stat::mkdirat(at, name, Mode::from_bits_truncate(0o755))
                    .and_then(|()| made_target(at, name))
            } else if let Some(linked) = link_mountpoint(mountpoint_file.as_ref(), at, name) {
                linked.and_then(|()| made_target(at, name))
            } else {
                // The fd of the new file is itself the mountpoint: nothing is opened again.
                let flags =
                    OFlag::O_RDONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
                let made = nix::fcntl::openat(at, name, flags, Mode::from_bits_truncate(0o644));
                if let (Ok(fd), None) = (&made, &mountpoint_file) {
                    *mountpoint_file = fd.try_clone().ok();
                }
                made.map(MountTarget::Open)
            };
            match made {
                Ok(target) => return Ok((target, true)),
                Err(Errno::EEXIST) => {}
                Err(e) => return Err(e.into()),
            }
            let fd = nix::fcntl::openat(
                at,
                name,
                OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )?;
            if !std::fs::symlink_metadata(proc_fd(&fd))?.file_type().is_symlink() {
                return Ok((MountTarget::Open(fd), false));
            }
            // The image put a symlink here: follow it inside the root.
            let whole = parent.join(name);
            match self.resolve_fd(&whole, OFlag::O_PATH) {
                Ok(fd) => return Ok((MountTarget::Open(fd), false)),
                Err(Errno::ENOENT) => {
                    let target = nix::fcntl::readlinkat(at, name)?;
                    destination = parent.join(target);
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(Errno::ELOOP.into())
    }

    fn bind_new_api(
        &self,
        source: &Path,
        target: &MountTarget,
        options: &BindOptions,
    ) -> Result<(), (&'static str, Errno)> {
        let tree = open_tree(source, options.recursive).map_err(|e| ("open_tree", e))?;
        let bits = options.attr_bits();
        if bits != 0 {
            let attr = MountAttr { attr_set: bits, attr_clr: 0, propagation: 0, userns_fd: 0 };
            mount_setattr(&tree, options.recursive, &attr).map_err(|e| ("mount_setattr", e))?;
        }
        move_mount(&tree, target).map_err(|e| ("move_mount", e))?;
        if let Some(propagation) = options.propagation {
            // Set once attached: a clone of a shared mount joins its peer group, and only an
            // attached mount's propagation says what reaches it from the host.
            // `c_ulong` is `u32` on 32-bit targets.
            #[allow(clippy::unnecessary_cast)]
            let attr = MountAttr {
                attr_set: 0,
                attr_clr: 0,
                propagation: propagation.ms_flag().bits() as u64,
                userns_fd: 0,
            };
            match mount_setattr(&tree, options.recursive_propagation, &attr) {
                Ok(()) => {}
                // Attached already (kernel 5.2-5.11 has open_tree and move_mount but not
                // mount_setattr): set it the classic way, on the new mount.
                Err(Errno::ENOSYS) => {
                    let mut flags = propagation.ms_flag();
                    flags.set(MsFlags::MS_REC, options.recursive_propagation);
                    nix::mount::mount(None::<&str>, &proc_fd(&tree), None::<&str>, flags, None::<&str>)
                        .map_err(|e| ("set propagation", e))?;
                }
                Err(e) => return Err(("mount_setattr", e)),
            }
        }
        Ok(())
    }

    fn bind_classic(
        &self,
        source: &Path,
        destination: &Path,
        target: &OwnedFd,
        options: &BindOptions,
    ) -> Result<(), (&'static str, Errno)> {
        let mut flags = MsFlags::MS_BIND;
        flags.set(MsFlags::MS_REC, options.recursive);
        nix::mount::mount(Some(source), &proc_fd(target), None::<&str>, flags, None::<&str>)
            .map_err(|e| ("mount", e))?;
        // The fd still names the covered mountpoint; resolving the path again (inside the root)
        // reaches the new mount's root, which is what the remount must change.
        let mounted = self.resolve_fd(destination, OFlag::O_PATH).map_err(|e| ("open the new mount", e))?;
        let attrs = options.ms_flags();
        if !attrs.is_empty() {
            let remount = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | attrs;
            nix::mount::mount(None::<&str>, &proc_fd(&mounted), None::<&str>, remount, None::<&str>)
                .map_err(|e| ("remount", e))?;
        }
        if let Some(propagation) = options.propagation {
            let mut flags = propagation.ms_flag();
            flags.set(MsFlags::MS_REC, options.recursive_propagation);
            nix::mount::mount(None::<&str>, &proc_fd(&mounted), None::<&str>, flags, None::<&str>)
                .map_err(|e| ("set propagation", e))?;
        }
        Ok(())
    }
}

impl BindOptions {
    /// The bind options an OCI mount's `options` list asks for, or the first option this cannot
    /// honour (anything but `bind`/`rbind`, `ro`/`rw`, `[no]suid`, `[no]dev`, `[no]exec` and the
    /// propagation words). A list without `bind` or `rbind` is not a bind mount (`None`).
    pub fn from_oci_options<S: AsRef<str>>(options: &[S]) -> Result<Option<BindOptions>, String> {
        let mut out = BindOptions::default();
        let mut bind = false;
        for option in options {
            let option = option.as_ref();
            match option {
                "bind" => bind = true,
                "rbind" => (bind, out.recursive) = (true, true),
                "ro" | "rw" => out.read_only = option == "ro",
                "nosuid" | "suid" => out.nosuid = option == "nosuid",
                "nodev" | "dev" => out.nodev = option == "nodev",
                "noexec" | "exec" => out.noexec = option == "noexec",
                _ => {
                    // `r<word>` is the recursive form of each propagation word.
                    let (word, recursive) = match option.strip_prefix('r') {
                        Some(rest @ ("private" | "slave" | "shared" | "unbindable")) => (rest, true),
                        _ => (option, false),
                    };
                    out.propagation = Some(match word {
                        "private" => Propagation::Private,
                        "slave" => Propagation::Slave,
                        "shared" => Propagation::Shared,
                        "unbindable" => Propagation::Unbindable,
                        other => return Err(other.to_owned()),
                    });
                    out.recursive_propagation = recursive;
                }
            }
        }
        Ok(bind.then_some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oci_options_map_to_bind_options() {
        let cdi =
            BindOptions::from_oci_options(&["ro", "nosuid", "nodev", "rbind", "rprivate"]).unwrap().unwrap();
        assert_eq!(
            cdi,
            BindOptions {
                recursive: true,
                read_only: true,
                nosuid: true,
                nodev: true,
                noexec: false,
                propagation: Some(Propagation::Private),
                recursive_propagation: true,
            }
        );
        assert_eq!(cdi.attr_bits(), MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
        assert_eq!(cdi.ms_flags(), MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV);
        // Later words win, as in mount(8); `bind` alone is not recursive.
        let socket =
            BindOptions::from_oci_options(&["bind", "ro", "rw", "noexec", "slave"]).unwrap().unwrap();
        assert!(!socket.recursive && !socket.read_only && socket.noexec);
        assert_eq!((socket.propagation, socket.recursive_propagation), (Some(Propagation::Slave), false));
        assert_eq!(BindOptions::from_oci_options(&["ro", "nosuid"]).unwrap(), None);
        assert_eq!(BindOptions::from_oci_options(&["rbind", "idmap"]).unwrap_err(), "idmap");
        assert_eq!(BindOptions::from_oci_options(&["rbind", "relatime"]).unwrap_err(), "relatime");
    }
}
