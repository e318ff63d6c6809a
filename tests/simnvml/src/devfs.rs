//! The device-node edge: may this process use `/dev/nvidia<minor>` and the MIG capability nodes?
//!
//! The real NVML opens the device nodes to talk to the kernel driver, so a GPU whose node the process
//! cannot open does not exist for it. The simulation asks the same question the same way: open the
//! node read-write. On a machine without the NVIDIA kernel module a permitted node fails with `ENXIO`
//! (no driver behind the major number): that counts as usable. `EPERM` (device cgroup denies it, as in
//! a container not given the GPU), `EACCES` and `ENOENT` count as absent.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Answers visibility questions about device nodes; [`RealDevFs`] asks the kernel, tests use fakes.
pub trait DevFs {
    /// True when this process may use the node at `path` (see the module doc for what counts).
    fn usable(&self, path: &Path) -> bool;
    /// True when `path` is an existing directory.
    fn is_dir(&self, path: &Path) -> bool;
}

/// What an `open(O_RDWR)` of a device node means for visibility.
pub fn usable_after_open(result: Result<(), i32>) -> bool {
    match result {
        Ok(()) => true,
        // A node with no driver behind it: the usual case on a machine without NVIDIA hardware.
        Err(errno) => errno == libc::ENXIO,
    }
}

/// The kernel's answer, through `open(2)`.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealDevFs;

impl DevFs for RealDevFs {
    fn usable(&self, path: &Path) -> bool {
        let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else { return false };
        // O_NONBLOCK: never wait on a device; O_NOCTTY: never acquire a terminal by accident.
        let flags = libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY;
        // SAFETY: `c_path` is a NUL-terminated string that outlives the call.
        let fd = unsafe { libc::open(c_path.as_ptr(), flags) };
        if fd >= 0 {
            // SAFETY: `fd` was just returned by open and is closed exactly once.
            unsafe { libc::close(fd) };
            return true;
        }
        usable_after_open(Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)))
    }

    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }
}

/// Where the node's device nodes are: the description's `dev_root` when that directory exists here,
/// else `/` (inside a container the host's dev root path is absent and the container's `/dev` is right).
pub fn dev_root(described: Option<&Path>, fs: &dyn DevFs) -> PathBuf {
    match described {
        Some(root) if fs.is_dir(root) => root.to_path_buf(),
        _ => PathBuf::from("/"),
    }
}

/// `<dev root>/dev/nvidia<minor>`.
pub fn gpu_node(dev_root: &Path, minor: u32) -> PathBuf {
    dev_root.join(format!("dev/nvidia{minor}"))
}

/// `<dev root>/dev/nvidia-caps`.
pub fn caps_dir(dev_root: &Path) -> PathBuf {
    dev_root.join("dev/nvidia-caps")
}

/// `<dev root>/dev/nvidia-caps/nvidia-cap<minor>`.
pub fn cap_node(dev_root: &Path, minor: u32) -> PathBuf {
    caps_dir(dev_root).join(format!("nvidia-cap{minor}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enxio_counts_as_present_and_denials_as_absent() {
        assert!(usable_after_open(Ok(())));
        assert!(usable_after_open(Err(libc::ENXIO)));
        assert!(!usable_after_open(Err(libc::EPERM)));
        assert!(!usable_after_open(Err(libc::EACCES)));
        assert!(!usable_after_open(Err(libc::ENOENT)));
    }

    #[test]
    fn real_devfs_on_plain_files_and_missing_paths() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nvidia0");
        std::fs::write(&file, b"").unwrap();
        assert!(RealDevFs.usable(&file));
        assert!(!RealDevFs.usable(&dir.path().join("nvidia1")));
        assert_eq!(dev_root(Some(dir.path()), &RealDevFs), dir.path());
        assert_eq!(dev_root(Some(&dir.path().join("absent")), &RealDevFs), Path::new("/"));
        assert_eq!(dev_root(None, &RealDevFs), Path::new("/"));
    }

    #[test]
    fn node_paths() {
        let root = Path::new("/r");
        assert_eq!(gpu_node(root, 3), Path::new("/r/dev/nvidia3"));
        assert_eq!(cap_node(root, 439), Path::new("/r/dev/nvidia-caps/nvidia-cap439"));
    }
}
