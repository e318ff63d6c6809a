//! Device nodes under a dev root, and the proc files that number the ones not created yet.
//!
//! Scanned once into a [`DevTree`]: every `/dev/nvidia*` and `/dev/nvidia-caps/*` node with its
//! type, numbers and mode (from `stat`), the `/dev/dri` nodes and `by-path` links, the character
//! device majors from `<proc root>/devices` and the MIG capability minors from
//! `<proc root>/driver/nvidia-caps/mig-minors` (parsed by their owner,
//! [`nvinject_gpu::devnodes::MigMinors`], which also says which nodes a device needs and how the
//! driver numbers them). The spec builder then never touches the host.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use nvinject_gpu::devnodes::MigMinors;

use crate::root::join;

/// Character or block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeType {
    /// A character device (`c`).
    Char,
    /// A block device (`b`).
    Block,
}

impl NodeType {
    /// The CDI/OCI spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeType::Char => "c",
            NodeType::Block => "b",
        }
    }
}

/// A device node as `stat` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeInfo {
    /// Char or block.
    pub node_type: NodeType,
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
    /// Permission bits (`0o666`).
    pub mode: u32,
}

/// Device nodes and numbering found under a dev root and proc root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DevTree {
    /// Nodes by path inside the dev root (`/dev/nvidia0`, `/dev/nvidia-caps/nvidia-cap21`,
    /// `/dev/dri/card1`).
    pub nodes: BTreeMap<String, NodeInfo>,
    /// `/dev/dri/by-path/*` links and their targets as written (`../card1`).
    pub links: BTreeMap<String, String>,
    /// Character device majors by driver name, from `<proc root>/devices`.
    pub char_majors: BTreeMap<String, u32>,
    /// MIG capability minors, from `mig-minors`.
    pub mig_minors: MigMinors,
}

/// Parses `/proc/devices`: the `Character devices:` section, `major name` per line.
pub fn parse_proc_devices(text: &str) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    let mut in_char = false;
    for line in text.lines() {
        let line = line.trim();
        if line.ends_with(':') {
            in_char = line == "Character devices:";
            continue;
        }
        if in_char
            && let Some((major, name)) = line.split_once(char::is_whitespace)
            && let Ok(major) = major.trim().parse()
        {
            out.entry(name.trim().to_owned()).or_insert(major);
        }
    }
    out
}

fn node_info(path: &Path) -> Option<NodeInfo> {
    let meta = fs::metadata(path).ok()?;
    let ft = meta.file_type();
    let node_type = if ft.is_char_device() {
        NodeType::Char
    } else if ft.is_block_device() {
        NodeType::Block
    } else {
        return None;
    };
    let rdev = meta.rdev();
    Some(NodeInfo {
        node_type,
        major: libc::major(rdev),
        minor: libc::minor(rdev),
        mode: meta.mode() & 0o7777,
    })
}

/// Scans `<dev_root>/dev` and the proc files. Missing directories and files give empty parts.
pub fn scan(dev_root: &Path, proc_root: &Path) -> DevTree {
    let mut tree = DevTree::default();
    let dev = join(dev_root, "/dev");
    for (dir, keep) in [
        ("/dev", (|n: &str| n.starts_with("nvidia")) as fn(&str) -> bool),
        ("/dev/nvidia-caps", |n: &str| n.starts_with("nvidia-cap")),
        ("/dev/dri", |n: &str| n.starts_with("card") || n.starts_with("renderD")),
    ] {
        let Ok(read) = fs::read_dir(join(dev_root, dir)) else { continue };
        for entry in read.flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
            if keep(&name)
                && let Some(info) = node_info(&entry.path())
            {
                tree.nodes.insert(format!("{dir}/{name}"), info);
            }
        }
    }
    if let Ok(read) = fs::read_dir(dev.join("dri/by-path")) {
        for entry in read.flatten() {
            if let (Some(name), Ok(target)) = (entry.file_name().to_str(), fs::read_link(entry.path())) {
                tree.links.insert(format!("/dev/dri/by-path/{name}"), target.to_string_lossy().into_owned());
            }
        }
    }
    if let Ok(text) = fs::read_to_string(join(proc_root, "/devices")) {
        tree.char_majors = parse_proc_devices(&text);
    }
    if let Ok(text) = fs::read_to_string(join(proc_root, "/driver/nvidia-caps/mig-minors")) {
        tree.mig_minors = MigMinors::parse(&text);
    }
    tracing::debug!(
        nodes = tree.nodes.len(), dri_links = tree.links.len(), mig_minors = tree.mig_minors.access.len(),
        dev_root = %dev_root.display(), "device nodes scanned"
    );
    tree
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_devices_character_section_only() {
        let text = "Character devices:\n  1 mem\n195 nvidia-frontend\n195 nvidia\n235 nvidia-caps\n510 nvidia-uvm\n\nBlock devices:\n  8 sd\n259 blkext\n";
        let majors = parse_proc_devices(text);
        assert_eq!(majors.get("nvidia-uvm"), Some(&510));
        assert_eq!(majors.get("nvidia-caps"), Some(&235));
        assert_eq!(majors.get("nvidia-frontend"), Some(&195));
        assert_eq!(majors.get("sd"), None);
    }

    #[test]
    #[ignore = "needs root"]
    fn scans_real_device_nodes() {
        nvinject_test_support::require_root("mknod for the simulated node");
        // Real nodes need mknod (root); the node's numbers come back from stat.
        let tmp = tempfile::tempdir().unwrap();
        let dev = tmp.path().join("dev");
        fs::create_dir_all(dev.join("dri/by-path")).unwrap();
        let mk = |p: &Path, major: u32, minor: u32| {
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: `c` is a valid NUL-terminated path; mknod only reads it.
            let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(major, minor)) };
            assert_eq!(
                rc,
                0,
                "mknod {}: {} (these tests run as root)",
                p.display(),
                std::io::Error::last_os_error()
            );
            // mknod applies the umask; set the mode the test expects.
            fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        };
        mk(&dev.join("nvidia0"), 195, 0);
        mk(&dev.join("nvidiactl"), 195, 255);
        mk(&dev.join("dri/card1"), 226, 1);
        fs::write(dev.join("nvidia-not-a-node"), b"").unwrap();
        std::os::unix::fs::symlink("../card1", dev.join("dri/by-path/pci-0000:18:00.0-card")).unwrap();
        let tree = scan(tmp.path(), &tmp.path().join("proc"));
        let info = NodeInfo { node_type: NodeType::Char, major: 195, minor: 255, mode: 0o666 };
        assert_eq!(tree.nodes.get("/dev/nvidiactl"), Some(&info));
        assert_eq!(tree.nodes.get("/dev/dri/card1").map(|n| (n.major, n.minor)), Some((226, 1)));
        assert_eq!(tree.nodes.len(), 3);
        assert_eq!(tree.links["/dev/dri/by-path/pci-0000:18:00.0-card"], "../card1");
    }
}
