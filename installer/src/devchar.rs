//! `/dev/char/<major>:<minor>` links for NVIDIA's character devices.
//!
//! runc's systemd cgroup driver (and systemd itself, on `daemon-reload`) resolves a container's
//! device rules through `/dev/char/<major>:<minor>`. udev creates those links for devices it knows,
//! but the NVIDIA nodes are made by the driver's tools with mknod, so the links are missing; after
//! a `systemctl daemon-reload` systemd then drops the devices from running GPU containers' cgroups
//! and NVML fails with "Unknown Error". Creating the links fixes that.

use std::os::unix::fs::{FileTypeExt, MetadataExt};

use nvinject_fsio::root::EntryType;

use crate::error::Result;
use crate::paths::{HostRoot, host_join};

/// One NVIDIA character device under the dev root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CharDevice {
    /// Path relative to the dev root (`nvidia0`, `nvidia-caps/nvidia-cap1`).
    pub name: String,
    /// Device major number.
    pub major: u64,
    /// Device minor number.
    pub minor: u64,
}

/// A link to create: `char/<major>:<minor>` (relative to the dev root) -> `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CharLink {
    /// Link path relative to the dev root.
    pub link: String,
    /// Relative link target (`../nvidia0`), so it resolves on the host and inside containers.
    pub target: String,
}

/// The links for `devices`, sorted by link name.
pub fn plan_links(devices: &[CharDevice]) -> Vec<CharLink> {
    let mut links: Vec<CharLink> = devices
        .iter()
        .map(|d| CharLink { link: format!("char/{}:{}", d.major, d.minor), target: format!("../{}", d.name) })
        .collect();
    links.sort_by(|a, b| a.link.cmp(&b.link));
    links.dedup_by(|a, b| a.link == b.link);
    links
}

/// Finds the NVIDIA character devices in the host directory `dev_dir` (`<dev root>/dev`):
/// `nvidia*` and `nvidia-caps/*`. Everything is resolved inside the host root: a `dev` or
/// `nvidia-caps` that is a link is followed there, never into the installer's own `/dev`, and an
/// entry that is a link is not a device (a link's target is not what the kernel named).
pub fn scan(root: &HostRoot, dev_dir: &str) -> Result<Vec<CharDevice>> {
    let mut found = Vec::new();
    let mut visit = |dir: &str, prefix: &str| -> Result<()> {
        let Some(entries) = root.read_dir(dir)? else { return Ok(()) };
        for (name, kind) in entries {
            // Character devices are listed as `Other`; files, directories and links never count.
            if !name.starts_with("nvidia") || kind != EntryType::Other {
                continue;
            }
            let path = host_join(dir, &name);
            let Some(meta) = root.symlink_metadata(&path)? else { continue };
            if meta.file_type().is_char_device() {
                let rdev = meta.rdev();
                found.push(CharDevice {
                    name: format!("{prefix}{name}"),
                    major: nix::sys::stat::major(rdev),
                    minor: nix::sys::stat::minor(rdev),
                });
            }
        }
        Ok(())
    };
    visit(dev_dir, "")?;
    visit(&host_join(dev_dir, "nvidia-caps"), "nvidia-caps/")?;
    found.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_point_back_relative_to_char() {
        let devices = vec![
            CharDevice { name: "nvidia1".into(), major: 195, minor: 1 },
            CharDevice { name: "nvidiactl".into(), major: 195, minor: 255 },
            CharDevice { name: "nvidia-caps/nvidia-cap1".into(), major: 237, minor: 1 },
        ];
        let links = plan_links(&devices);
        assert_eq!(
            links,
            vec![
                CharLink { link: "char/195:1".into(), target: "../nvidia1".into() },
                CharLink { link: "char/195:255".into(), target: "../nvidiactl".into() },
                CharLink { link: "char/237:1".into(), target: "../nvidia-caps/nvidia-cap1".into() },
            ]
        );
    }

    #[test]
    fn scan_ignores_regular_files_and_other_devices() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("dev")).unwrap();
        std::fs::write(dir.path().join("dev/nvidia0"), "not a device").unwrap();
        std::os::unix::fs::symlink("/dev/null", dir.path().join("dev/nvidia1")).unwrap();
        let root = HostRoot::new(dir.path());
        assert!(scan(&root, "/dev").unwrap().is_empty());
        assert!(scan(&root, "/missing").unwrap().is_empty());
    }
}
