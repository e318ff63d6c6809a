//! `update-application-profile`: the driver's application profile in the container names the GPUs
//! the container was given, so EGL and Vulkan there enumerate only those.
//!
//! The driver's EGL and Vulkan paths list every GPU of the host through `/dev/nvidiactl`, whatever
//! `/dev/nvidia<N>` nodes the container has; an application profile setting
//! (`EGLVisibleDGPUDevices`, a bit mask of GPU minor numbers) restricts them. NVIDIA's toolkit
//! (1.19+) writes that profile from the `/dev/nvidia<N>` character devices the container ended up
//! with; this does the same, with every path resolved inside the rootfs, so a container started
//! through nvinject's spec or NVIDIA's sees the same file.

use std::ffi::OsStr;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use nvinject_fsio::root::{EntryType, Root};

use crate::HookError;

/// The folder the driver reads application profiles from (`/etc/nvidia` is one of its search
/// places), made `0555` when missing, as NVIDIA's hook makes it.
pub const PROFILE_DIR: &str = "/etc/nvidia/nvidia-application-profiles-rc.d";

/// The profile file, `0444`, replaced whole.
pub const PROFILE_FILE: &str = "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf";

/// The mask has one bit per minor number: minors from 64 up cannot be named.
const MASK_BITS: u32 = u64::BITS;

/// Whether a `/dev` entry's name is a GPU's, `nvidia<digits>` (`nvidiactl`, `nvidia-uvm`,
/// `nvidia-caps` and the rest are not GPUs). Only a character device of that name counts.
pub fn is_gpu_node_name(name: &OsStr) -> bool {
    let digits = name.to_str().and_then(|n| n.strip_prefix("nvidia"));
    digits.is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

/// The `EGLVisibleDGPUDevices` mask of `minors`, and the minors it cannot hold (64 and up).
pub fn visible_mask(minors: impl IntoIterator<Item = u32>) -> (u64, Vec<u32>) {
    let mut mask = 0u64;
    let mut dropped = Vec::new();
    for minor in minors {
        if minor < MASK_BITS {
            mask |= 1 << minor;
        } else {
            dropped.push(minor);
        }
    }
    (mask, dropped)
}

/// The profile file's text for `mask`: the driver's application-profile format, which takes hex
/// numbers (the form NVIDIA's hook writes, so either tool's file reads the same).
pub fn profile_text(mask: u64) -> String {
    format!(
        r#"{{"profiles":[{{"name":"_container_","settings":["EGLVisibleDGPUDevices",0x{mask:x}]}}],"rules":[{{"pattern":[],"profile":"_container_"}}]}}"#
    )
}

/// What [`update_application_profile`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The profile was written with this mask.
    Written {
        /// The `EGLVisibleDGPUDevices` mask.
        mask: u64,
    },
    /// The container has no GPU device node whose minor the mask can hold: nothing written.
    NoGpus,
}

/// The Linux minor number of a device number (glibc's `gnu_dev_minor`).
fn minor_of(rdev: u64) -> u32 {
    // Truncation is the encoding: the minor's low 8 bits at 0..8, its high 12 bits at 20..32.
    ((rdev & 0xff) | ((rdev >> 12) & 0xf_ff00)) as u32
}

/// Writes [`PROFILE_FILE`] in the container root for the `/dev/nvidia<N>` character devices it
/// has; nothing when it has none.
pub fn update_application_profile(root: &Root) -> Result<Outcome, HookError> {
    let dev = Path::new("/dev");
    if !root.dir_exists(dev) {
        return Ok(Outcome::NoGpus);
    }
    let mut minors = Vec::new();
    for (name, kind) in root.read_dir(dev)? {
        // Only entries that are not files, directories or links can be devices: stat just those.
        if kind != EntryType::Other || !is_gpu_node_name(&name) {
            continue;
        }
        let Some(meta) = root.symlink_metadata(&dev.join(&name))? else { continue };
        if meta.file_type().is_char_device() {
            // The minor is the device's, whatever its name says.
            minors.push(minor_of(meta.rdev()));
        }
    }
    let (mask, dropped) = visible_mask(minors);
    if !dropped.is_empty() {
        tracing::warn!(?dropped, "GPU minor numbers from 64 up cannot be named in EGLVisibleDGPUDevices");
    }
    if mask == 0 {
        return Ok(Outcome::NoGpus);
    }
    root.mkdir_all(Path::new(PROFILE_DIR), 0o555)?;
    root.write_file(Path::new(PROFILE_FILE), profile_text(mask).as_bytes(), 0o444)?;
    Ok(Outcome::Written { mask })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_nvidia_and_digits_name_a_gpu() {
        for gpu in ["nvidia0", "nvidia12"] {
            assert!(is_gpu_node_name(OsStr::new(gpu)), "{gpu}");
        }
        for other in [
            "nvidiactl",
            "nvidia-uvm",
            "nvidia-uvm-tools",
            "nvidia-modeset",
            "nvidia-caps",
            "nvidia",
            "nvidia1a",
            "null",
        ] {
            assert!(!is_gpu_node_name(OsStr::new(other)), "{other}");
        }
    }

    #[test]
    fn the_mask_has_a_bit_per_minor_and_drops_what_it_cannot_hold() {
        assert_eq!(visible_mask([]), (0, vec![]));
        assert_eq!(visible_mask([0]), (0x1, vec![]));
        assert_eq!(visible_mask([1, 3]), (0xa, vec![]));
        assert_eq!(visible_mask([63, 64, 255]), (1 << 63, vec![64, 255]));
    }

    #[test]
    fn the_text_is_the_drivers_profile_format() {
        assert_eq!(
            profile_text(0xa),
            r#"{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",0xa]}],"rules":[{"pattern":[],"profile":"_container_"}]}"#
        );
    }

    #[test]
    fn minors_decode_as_glibc_does() {
        // makedev(195, 7) and makedev(244, 300) as glibc encodes them.
        let makedev = |major: u64, minor: u64| {
            (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12) | ((major & !0xfff) << 32)
        };
        assert_eq!(minor_of(makedev(195, 7)), 7);
        assert_eq!(minor_of(makedev(244, 300)), 300);
        assert_eq!(minor_of(makedev(4095, 1_048_575)), 1_048_575);
    }

    #[test]
    fn a_root_without_gpu_nodes_gets_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let rootfs = dir.path().join("root");
        std::fs::create_dir_all(rootfs.join("dev")).unwrap();
        // A regular file with a GPU's name is not a device.
        std::fs::write(rootfs.join("dev/nvidia0"), "").unwrap();
        let root = Root::open(&rootfs).unwrap();
        assert_eq!(update_application_profile(&root).unwrap(), Outcome::NoGpus);
        assert!(!rootfs.join("etc").exists());
        std::fs::remove_dir_all(rootfs.join("dev")).unwrap();
        assert_eq!(update_application_profile(&root).unwrap(), Outcome::NoGpus);
    }
}
