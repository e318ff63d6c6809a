//! `/dev/char/<major>:<minor>` links for NVIDIA's character devices.
//!
//! runc's systemd cgroup driver (and systemd itself, on `daemon-reload`) resolves a container's
//! device rules through `/dev/char/<major>:<minor>`. udev creates those links for devices it knows,
//! but the NVIDIA nodes are made by the driver's tools with mknod, so the links are missing; after
//! a `systemctl daemon-reload` systemd then drops the devices from running GPU containers' cgroups
//! and NVML fails with "Unknown Error". Creating the links fixes that.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

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

/// Finds the NVIDIA character devices under `dev_root`: `nvidia*` and `nvidia-caps/*`.
pub fn scan(dev_root: &Path) -> std::io::Result<Vec<CharDevice>> {
    let mut found = Vec::new();
    let mut visit = |dir: &Path, prefix: &str| -> std::io::Result<()> {
        let entries = match fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("nvidia") {
                continue;
            }
            let meta = fs::symlink_metadata(entry.path())?;
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
    visit(dev_root, "")?;
    visit(&dev_root.join("nvidia-caps"), "nvidia-caps/")?;
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
        fs::write(dir.path().join("nvidia0"), "not a device").unwrap();
        std::os::unix::fs::symlink("/dev/null", dir.path().join("nvidia1")).unwrap();
        assert!(scan(dir.path()).unwrap().is_empty());
        assert!(scan(&dir.path().join("missing")).unwrap().is_empty());
    }
}
