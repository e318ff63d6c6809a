//! Filling the device-node fields a CDI spec may leave out (`type`, `major`, `minor`, `fileMode`)
//! from the host's device file, so [`crate::apply::apply_edits`] gets complete nodes.
//!
//! This is the one place the crate looks at the host, and it is kept apart from applying: the
//! rules ([`fill_missing_info`]) are pure and take a `stat` callback; [`HostDevices`] is the OS
//! edge that answers it. The rules are the CDI reference library's (`fillMissingInfo` in
//! `pkg/cdi/container-edits.go`), which containerd and podman use:
//! - a node is *minimally specified* when it has a type and a major number other than 0, or is a
//!   FIFO (`p`). Such a node needs nothing from the host; only a missing `fileMode` is taken from
//!   the host file if it exists, and a missing `minor` is 0 (Go's zero value, which is why
//!   nvidia-ctk writes no `minor` for minor 0);
//! - any other node must have a host device file (`hostPath`, else `path`): a missing `type` is
//!   its type, a given `type` must match it, a missing (or 0) `major` takes major and minor from
//!   its `st_rdev`, and a missing `fileMode` its permission bits.
//!
//! Where this differs from the reference library, it is stricter or says more, never looser:
//! - the host file is looked at itself, never through a final symlink (the reference `lstat`s
//!   too), and a host file that is not a char or block device or FIFO is refused even for a
//!   minimally specified node (the reference ignores it there): the spec names a device file
//!   another tool wrote, and taking a mode from something else would be silent;
//! - only a *missing* host file is ignored for a minimally specified node; a permission error or a
//!   symlink loop is reported;
//! - type `u` (unbuffered char) matches a char device: the kernel has only one char device file
//!   type (the reference compares the letters and refuses `u` without numbers);
//! - a node whose type was left out but that gives numbers is refused when the host file is a
//!   FIFO (FIFOs have no numbers; validation refuses `p` with numbers for the same reason).

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use nvinject_fsio::root::Root;

use crate::spec::{DeviceNode, DeviceType};

/// What a `stat` of a host device file says: `st_mode` (file type and permission bits) and
/// `st_rdev` (the device number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostStat {
    /// `st_mode`.
    pub mode: u32,
    /// `st_rdev`.
    pub rdev: u64,
}

/// A device node that cannot be completed from the host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CDI spec {}: device node {path} (host file {host_path}): {message}", spec_file.display())]
pub struct FillError {
    /// The spec file the node comes from.
    pub spec_file: PathBuf,
    /// The node's container path.
    pub path: String,
    /// The host file looked at (`hostPath`, else `path`).
    pub host_path: String,
    /// What is wrong and what would fix it.
    pub message: String,
}

/// Whether `node` has a type and a device number (or is a FIFO), so the host is not needed for them.
fn minimally_specified(node: &DeviceNode) -> bool {
    match node.device_type {
        Some(DeviceType::Fifo) => true,
        Some(_) => node.major.is_some_and(|m| m != 0),
        None => false,
    }
}

/// Whether completing `node` needs a look at the host at all.
pub fn needs_host(node: &DeviceNode) -> bool {
    node.file_mode.is_none() || !minimally_specified(node)
}

/// The file type of `mode` as a device node type letter, or its name in words when it is not a
/// device or FIFO.
fn host_type(mode: u32) -> Result<DeviceType, &'static str> {
    match mode & libc::S_IFMT {
        libc::S_IFCHR => Ok(DeviceType::Char),
        libc::S_IFBLK => Ok(DeviceType::Block),
        libc::S_IFIFO => Ok(DeviceType::Fifo),
        libc::S_IFLNK => Err("a symlink"),
        libc::S_IFDIR => Err("a directory"),
        libc::S_IFREG => Err("a regular file"),
        libc::S_IFSOCK => Err("a socket"),
        _ => Err("not a device file"),
    }
}

fn type_words(t: DeviceType) -> &'static str {
    match t {
        DeviceType::Char => "a character device",
        DeviceType::Unbuffered => "an unbuffered character device",
        DeviceType::Block => "a block device",
        DeviceType::Fifo => "a FIFO",
    }
}

/// Completes every node in `nodes` that lacks `type`, `major`, `minor` or `fileMode`, asking
/// `stat` about its host file (a host path) only when it must (see the module docs). `spec_file`
/// is named in errors. On error, nodes before the failing one may have been completed.
pub fn fill_missing_info(
    nodes: &mut [DeviceNode],
    spec_file: &Path,
    stat: &mut dyn FnMut(&str) -> io::Result<HostStat>,
) -> Result<(), FillError> {
    for node in nodes {
        fill_node(node, stat).map_err(|message| FillError {
            spec_file: spec_file.to_owned(),
            path: node.path.clone(),
            host_path: node.host_path().to_owned(),
            message,
        })?;
    }
    Ok(())
}

fn fill_node(
    node: &mut DeviceNode,
    stat: &mut dyn FnMut(&str) -> io::Result<HostStat>,
) -> Result<(), String> {
    let minimal = minimally_specified(node);
    if needs_host(node) {
        let host = match stat(node.host_path()) {
            Ok(host) => Some(host),
            Err(e) if minimal && e.kind() == io::ErrorKind::NotFound => None,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err("there is no such file on the host, and the spec leaves out the type or major \
                     number that would be read from it: load the driver so the device exists, fix \
                     hostPath, or give type and major in the spec"
                    .into());
            }
            Err(e) => return Err(format!("cannot stat it: {e}")),
        };
        if let Some(host) = host {
            let actual = host_type(host.mode).map_err(|what| {
                format!(
                    "is {what}, not a character or block device or FIFO; refusing to take device \
                     information from it: point hostPath at the device node itself"
                )
            })?;
            if node.file_mode.is_none() {
                node.file_mode = Some(host.mode & 0o7777);
            }
            if !minimal {
                complete_from(node, actual, host.rdev)?;
            }
        }
    }
    if node.device_type != Some(DeviceType::Fifo) && node.minor.is_none() {
        node.minor = Some(0);
    }
    Ok(())
}

/// Type and numbers of a node that is not minimally specified, from its host file of type `actual`.
fn complete_from(node: &mut DeviceNode, actual: DeviceType, rdev: u64) -> Result<(), String> {
    let declared = *node.device_type.get_or_insert(actual);
    let matches = match declared {
        DeviceType::Unbuffered => actual == DeviceType::Char,
        t => t == actual,
    };
    if !matches {
        return Err(format!(
            "the spec says type {declared} ({}) but the host file is {}: fix type or hostPath",
            type_words(declared),
            type_words(actual)
        ));
    }
    if actual == DeviceType::Fifo {
        if node.major.is_some() || node.minor.is_some() {
            return Err("the host file is a FIFO, which has no major/minor numbers, but the spec gives \
                        them: drop major and minor, or point hostPath at the device node"
                .into());
        }
        return Ok(());
    }
    if node.major.is_none_or(|m| m == 0) {
        node.major = Some(i64::from(libc::major(rdev)));
        node.minor = Some(i64::from(libc::minor(rdev)));
    }
    Ok(())
}

/// The host's device files, looked up safely: the OS edge of [`fill_missing_info`].
///
/// A `hostPath` is a host path, as CDI defines it and as both `nvidia-ctk cdi generate --dev-root`
/// and `nvinject-cdi generate --dev-root` write it (`<dev root>/dev/nvidia0`): the dev root is never
/// prepended to it. When the path lies under the dev root, the part below the dev root is resolved
/// inside it, so `..` and symlinks on the way (absolute or relative) cannot lead out of it; any
/// other path is resolved from `/`, as the reference library resolves it. Either way the final
/// component is looked at itself, never followed.
#[derive(Debug)]
pub struct HostDevices {
    dev_root: Option<Root>,
    host: Option<Root>,
}

impl HostDevices {
    /// Device lookups for a spec whose dev root is `dev_root` (`None` or `/`: the host's `/`).
    /// Nothing is opened until a node needs the host.
    pub fn new(dev_root: Option<&Path>) -> io::Result<HostDevices> {
        let dev_root = match dev_root {
            Some(root) if root.components().any(|c| !matches!(c, Component::RootDir)) => {
                if !root.is_absolute() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("dev root {} is not an absolute path", root.display()),
                    ));
                }
                Some(Root::open(root).map_err(|e| io::Error::new(e.kind(), e.to_string()))?)
            }
            _ => None,
        };
        Ok(HostDevices { dev_root, host: None })
    }

    /// `st_mode` and `st_rdev` of the host file `host_path` itself (see the type's docs);
    /// `NotFound` when it does not exist.
    pub fn stat(&mut self, host_path: &str) -> io::Result<HostStat> {
        let path = Path::new(host_path);
        if !path.is_absolute() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the host path is not absolute"));
        }
        let below = self.dev_root.as_ref().and_then(|root| path.strip_prefix(root.path()).ok());
        let (root, inside) = match (&self.dev_root, below) {
            (Some(root), Some(below)) => (root, Path::new("/").join(below)),
            _ => {
                if self.host.is_none() {
                    let host =
                        Root::open(Path::new("/")).map_err(|e| io::Error::new(e.kind(), e.to_string()))?;
                    self.host = Some(host);
                }
                (self.host.as_ref().expect("opened above"), path.to_owned())
            }
        };
        match root.symlink_metadata(&inside) {
            Ok(Some(meta)) => Ok(HostStat { mode: meta.mode(), rdev: meta.rdev() }),
            Ok(None) => Err(io::Error::new(io::ErrorKind::NotFound, "no such file")),
            Err(e) => Err(e.source),
        }
    }
}

/// [`fill_missing_info`] against the host's files (see [`HostDevices`]), opening the dev root only
/// when a node needs the host. `dev_root` is where the spec's device files live (`None`: `/`).
pub fn fill_from_host(
    nodes: &mut [DeviceNode],
    spec_file: &Path,
    dev_root: Option<&Path>,
) -> Result<(), FillError> {
    if !nodes.iter().any(needs_host) {
        // Still normalise the minor a minimally specified node may leave out.
        return fill_missing_info(nodes, spec_file, &mut |_| unreachable_stat());
    }
    let mut host = HostDevices::new(dev_root).map_err(|e| {
        let first = nodes.iter().find(|n| needs_host(n));
        FillError {
            spec_file: spec_file.to_owned(),
            path: first.map(|n| n.path.clone()).unwrap_or_default(),
            host_path: first.map(|n| n.host_path().to_owned()).unwrap_or_default(),
            message: format!(
                "cannot open the dev root {}: {e}: check the spec's nvinject.io/dev-root annotation \
                 or the shim's [regenerate] dev-root",
                dev_root.map(|d| d.display().to_string()).unwrap_or_default()
            ),
        }
    })?;
    fill_missing_info(nodes, spec_file, &mut |p| host.stat(p))
}

fn unreachable_stat() -> io::Result<HostStat> {
    Err(io::Error::other("no node needs the host"))
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;

    use super::*;

    const CHR: u32 = libc::S_IFCHR | 0o666;

    fn rdev(major: u32, minor: u32) -> u64 {
        libc::makedev(major, minor)
    }

    /// nvidia-ctk's shape: no type, and no minor when it is 0.
    fn ctk(path: &str, major: i64, minor: Option<i64>) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            host_path: Some(format!("/sim{path}")),
            major: Some(major),
            minor,
            file_mode: Some(0o666),
            permissions: Some("rwm".into()),
            ..Default::default()
        }
    }

    fn fill_with(
        node: DeviceNode,
        host: io::Result<HostStat>,
    ) -> (Result<DeviceNode, FillError>, Vec<String>) {
        let mut asked = Vec::new();
        let mut host = Some(host);
        let mut nodes = [node];
        let result = fill_missing_info(&mut nodes, Path::new("/etc/cdi/nvidia.json"), &mut |p| {
            asked.push(p.to_owned());
            host.take().expect("stat asked once")
        });
        let [node] = nodes;
        (result.map(|()| node), asked)
    }

    #[test]
    fn nvidia_ctk_nodes_get_the_host_type_and_keep_their_numbers() {
        let (node, asked) =
            fill_with(ctk("/dev/nvidia0", 195, None), Ok(HostStat { mode: CHR, rdev: rdev(195, 0) }));
        let node = node.unwrap();
        assert_eq!(asked, ["/sim/dev/nvidia0"], "the host path, as written, is what is looked at");
        assert_eq!(
            (node.device_type.map(DeviceType::as_str), node.major, node.minor, node.file_mode),
            (Some("c"), Some(195), Some(0), Some(0o666))
        );
        // As the reference library: a given major is kept (with minor 0 when left out), even if
        // the host file's number differs.
        let (node, _) =
            fill_with(ctk("/dev/nvidia3", 195, Some(3)), Ok(HostStat { mode: CHR, rdev: rdev(195, 9) }));
        assert_eq!(node.unwrap().minor, Some(3));
    }

    #[test]
    fn missing_numbers_and_mode_come_from_the_host_file() {
        let bare = DeviceNode { path: "/dev/nvidia-uvm".into(), ..Default::default() };
        let (node, asked) =
            fill_with(bare.clone(), Ok(HostStat { mode: libc::S_IFCHR | 0o640, rdev: rdev(243, 1) }));
        let node = node.unwrap();
        assert_eq!(asked, ["/dev/nvidia-uvm"], "no hostPath: path is the host path");
        assert_eq!(
            (node.device_type.map(DeviceType::as_str), node.major, node.minor, node.file_mode),
            (Some("c"), Some(243), Some(1), Some(0o640))
        );
        // A type without numbers, and a minor without a major (the reference takes both numbers).
        for (t, minor) in [(Some("c"), None), (Some("u"), None), (None, Some(7)), (Some("c"), Some(0))] {
            let mut n = bare.clone();
            (n.device_type, n.minor) = (t.map(|t: &str| t.parse().unwrap()), minor);
            let (node, _) = fill_with(n, Ok(HostStat { mode: CHR, rdev: rdev(4000, 1_000_000) }));
            let node = node.unwrap();
            assert_eq!((node.major, node.minor), (Some(4000), Some(1_000_000)), "{t:?} {minor:?}");
            assert_eq!(node.device_type.map(DeviceType::as_str), Some(t.unwrap_or("c")), "u stays u");
        }
        let (node, _) =
            fill_with(bare.clone(), Ok(HostStat { mode: libc::S_IFBLK | 0o660, rdev: rdev(8, 16) }));
        assert_eq!(node.unwrap().device_type.map(DeviceType::as_str), Some("b"));
        let (node, _) = fill_with(bare, Ok(HostStat { mode: libc::S_IFIFO | 0o600, rdev: 0 }));
        let node = node.unwrap();
        assert_eq!(
            (node.device_type.map(DeviceType::as_str), node.major, node.minor),
            (Some("p"), None, None)
        );
    }

    #[test]
    fn complete_nodes_never_ask_the_host() {
        let mut complete = ctk("/dev/nvidia0", 195, Some(0));
        complete.device_type = Some(DeviceType::Char);
        let mut fifo = DeviceNode {
            path: "/dev/pipe".into(),
            device_type: Some(DeviceType::Fifo),
            ..Default::default()
        };
        fifo.file_mode = Some(0o600);
        let mut no_minor = complete.clone();
        no_minor.minor = None;
        for node in [complete, fifo, no_minor] {
            let mut nodes = [node.clone()];
            fill_missing_info(&mut nodes, Path::new("s.json"), &mut |p| panic!("stat({p}) for {node:?}"))
                .unwrap();
            let expect_minor =
                if node.device_type.map(DeviceType::as_str) == Some("p") { None } else { Some(0) };
            assert_eq!(nodes[0].minor, expect_minor);
        }
    }

    #[test]
    fn a_minimally_specified_node_takes_only_its_mode_and_may_be_absent() {
        let mut node = ctk("/dev/nvidia0", 195, None);
        (node.device_type, node.file_mode) = (Some(DeviceType::Char), None);
        let (filled, _) =
            fill_with(node.clone(), Ok(HostStat { mode: libc::S_IFCHR | 0o600, rdev: rdev(1, 1) }));
        let filled = filled.unwrap();
        assert_eq!((filled.major, filled.minor, filled.file_mode), (Some(195), Some(0), Some(0o600)));
        let (filled, _) = fill_with(node.clone(), Err(io::ErrorKind::NotFound.into()));
        assert_eq!(filled.unwrap().file_mode, None, "absent host file: nothing to take, nothing wrong");
        // Anything but absence is reported, as is a host file that is no device.
        let (e, _) = fill_with(node.clone(), Err(io::ErrorKind::PermissionDenied.into()));
        assert!(e.unwrap_err().message.contains("cannot stat it"));
        let (e, _) = fill_with(node, Ok(HostStat { mode: libc::S_IFREG | 0o644, rdev: 0 }));
        assert!(e.unwrap_err().message.contains("is a regular file"));
    }

    #[test]
    fn refusals_name_the_spec_file_the_device_and_the_fix() {
        let bare = DeviceNode {
            path: "/dev/nvidia0".into(),
            host_path: Some("/h/dev/nvidia0".into()),
            ..Default::default()
        };
        let cases: Vec<(DeviceNode, io::Result<HostStat>, &str)> = vec![
            (
                bare.clone(),
                Err(io::ErrorKind::NotFound.into()),
                "load the driver so the device exists, fix hostPath",
            ),
            (ctk("/dev/nvidia0", 195, None), Err(io::ErrorKind::NotFound.into()), "give type and major"),
            (bare.clone(), Ok(HostStat { mode: libc::S_IFLNK | 0o777, rdev: 0 }), "is a symlink"),
            (bare.clone(), Ok(HostStat { mode: libc::S_IFDIR | 0o755, rdev: 0 }), "is a directory"),
            (bare.clone(), Ok(HostStat { mode: libc::S_IFSOCK | 0o755, rdev: 0 }), "is a socket"),
            (
                DeviceNode { device_type: Some(DeviceType::Block), ..bare.clone() },
                Ok(HostStat { mode: CHR, rdev: rdev(195, 0) }),
                "says type b (a block device) but the host file is a character device: fix type or hostPath",
            ),
            (
                DeviceNode { device_type: Some(DeviceType::Unbuffered), ..bare.clone() },
                Ok(HostStat { mode: libc::S_IFBLK, rdev: rdev(8, 0) }),
                "type u",
            ),
            (
                DeviceNode { device_type: Some(DeviceType::Char), ..bare.clone() },
                Ok(HostStat { mode: libc::S_IFIFO, rdev: 0 }),
                "but the host file is a FIFO",
            ),
            (
                ctk("/dev/nvidia0", 195, None),
                Ok(HostStat { mode: libc::S_IFIFO, rdev: 0 }),
                "drop major and minor",
            ),
        ];
        for (node, host, fix) in cases {
            let (e, _) = fill_with(node.clone(), host);
            let e = e.expect_err(fix);
            let text = e.to_string();
            assert!(
                text.starts_with("CDI spec /etc/cdi/nvidia.json: device node /dev/nvidia0 (host file "),
                "{text}"
            );
            assert!(text.contains(fix), "{text} lacks {fix}");
        }
    }

    #[test]
    fn a_missing_dev_root_matters_only_to_nodes_that_need_the_host() {
        let gone = Path::new("/nonexistent/nvinject-dev-root");
        let mut complete = ctk("/dev/nvidia0", 195, None);
        complete.device_type = Some(DeviceType::Char);
        let mut nodes = vec![complete];
        fill_from_host(&mut nodes, Path::new("/etc/cdi/a.json"), Some(gone)).unwrap();
        assert_eq!(nodes[0].minor, Some(0));
        let mut nodes = vec![ctk("/dev/nvidia0", 195, None)];
        let e = fill_from_host(&mut nodes, Path::new("/etc/cdi/a.json"), Some(gone)).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("/etc/cdi/a.json") && text.contains("cannot open the dev root"), "{text}");
        assert!(text.contains("[regenerate] dev-root"), "{text}");
    }

    fn mknod(path: &Path, mode: u32, dev: u64) {
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mknod only reads it.
        assert_eq!(
            unsafe { libc::mknod(c.as_ptr(), mode, dev) },
            0,
            "mknod {}: {}",
            path.display(),
            io::Error::last_os_error()
        );
        // The umask applies to mknod; the test wants exactly `mode`'s bits.
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode & 0o7777)).unwrap();
    }

    #[test]
    #[ignore = "needs root"]
    fn host_devices_look_at_the_file_itself_inside_the_dev_root() {
        nvinject_test_support::require_root("mknod");
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("host");
        std::fs::create_dir_all(root.join("dev/char")).unwrap();
        mknod(&root.join("dev/nvidia0"), libc::S_IFCHR | 0o666, rdev(195, 0));
        mknod(&root.join("dev/nvidia-uvm-tools"), libc::S_IFCHR | 0o640, rdev(243, 1));
        mknod(&root.join("dev/fifo"), libc::S_IFIFO | 0o600, 0);
        std::os::unix::fs::symlink("../nvidia0", root.join("dev/char/195:0")).unwrap();
        std::fs::write(root.join("dev/regular"), b"").unwrap();
        // `escape/...` leads to the host's `/` if followed outside the root (where /dev/null is a
        // char device); inside the root it leads back to the root, where there is no dev/null.
        std::os::unix::fs::symlink("/", root.join("escape")).unwrap();
        std::os::unix::fs::symlink("../../../../../../../../..", root.join("dotdot")).unwrap();

        let host = |p: PathBuf| p.to_string_lossy().into_owned();
        let mut devices = HostDevices::new(Some(&root)).unwrap();
        let st = devices.stat(&host(root.join("dev/nvidia-uvm-tools"))).unwrap();
        assert_eq!((st.mode, libc::major(st.rdev), libc::minor(st.rdev)), (libc::S_IFCHR | 0o640, 243, 1));
        assert_eq!(devices.stat(&host(root.join("dev/fifo"))).unwrap().mode & libc::S_IFMT, libc::S_IFIFO);
        let link = devices.stat(&host(root.join("dev/char/195:0"))).unwrap();
        assert_eq!(link.mode & libc::S_IFMT, libc::S_IFLNK, "a final symlink is not followed");
        for escape in ["escape/dev/null", "dotdot/dev/null", "dev/../../../../../../dev/null"] {
            let e = devices.stat(&host(root.join(escape))).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotFound, "{escape} must stay in the dev root");
        }

        // The whole step, as the shim runs it, on nvidia-ctk-shaped nodes.
        let mut nodes = vec![
            DeviceNode {
                path: "/dev/nvidia0".into(),
                host_path: Some(host(root.join("dev/nvidia0"))),
                major: Some(195),
                ..Default::default()
            },
            DeviceNode {
                path: "/dev/nvidia-uvm-tools".into(),
                host_path: Some(host(root.join("dev/nvidia-uvm-tools"))),
                ..Default::default()
            },
        ];
        fill_from_host(&mut nodes, Path::new("/etc/cdi/nvidia.json"), Some(&root)).unwrap();
        let got: Vec<_> = nodes
            .iter()
            .map(|n| (n.device_type.map(DeviceType::as_str), n.major, n.minor, n.file_mode))
            .collect();
        assert_eq!(
            got,
            [(Some("c"), Some(195), Some(0), Some(0o666)), (Some("c"), Some(243), Some(1), Some(0o640))]
        );

        for (path, fix) in [
            ("dev/char/195:0", "is a symlink"),
            ("dev/regular", "is a regular file"),
            ("escape/dev/null", "no such file"),
        ] {
            let mut nodes = vec![DeviceNode {
                path: "/dev/x".into(),
                host_path: Some(host(root.join(path))),
                ..Default::default()
            }];
            let e = fill_from_host(&mut nodes, Path::new("/etc/cdi/x.json"), Some(&root)).unwrap_err();
            assert!(e.to_string().contains(fix) && e.to_string().contains("/etc/cdi/x.json"), "{e}");
        }

        // A path outside the dev root is the host's own, looked up from `/` (the reference's rule).
        let st = HostDevices::new(Some(&root)).unwrap().stat("/dev/null").unwrap();
        assert_eq!(
            (st.mode & libc::S_IFMT, libc::major(st.rdev), libc::minor(st.rdev)),
            (libc::S_IFCHR, 1, 3)
        );
        let st = HostDevices::new(None).unwrap().stat("/dev/null").unwrap();
        assert_eq!(st.mode & libc::S_IFMT, libc::S_IFCHR);
        assert!(HostDevices::new(Some(Path::new("relative"))).is_err());
        // A /proc magic link on the way (another process's root) is refused, not followed.
        let e = HostDevices::new(None).unwrap().stat("/proc/self/root/dev/null").unwrap_err();
        assert_ne!(e.kind(), io::ErrorKind::NotFound, "{e}");
        let mut nodes = vec![DeviceNode {
            path: "/dev/x".into(),
            host_path: Some("/proc/self/root/dev/null".into()),
            ..Default::default()
        }];
        let e = fill_from_host(&mut nodes, Path::new("/etc/cdi/x.json"), None).unwrap_err();
        assert!(e.message.contains("cannot stat it"), "{e}");
    }
}
