//! The dev root's character devices, and the device numbers they share with `/proc/devices`.
//!
//! Numbers as the NVIDIA driver uses them: major 195 for the GPUs (minor = the GPU's minor),
//! `nvidiactl` (255) and `nvidia-modeset` (254); dynamic majors for `nvidia-uvm` (minors 0 and 1:
//! `nvidia-uvm`, `nvidia-uvm-tools`) and `nvidia-caps` (minors from `mig-minors`); 226 for DRM.
//! Modes as the driver and udev set them: 0666 for `nvidia*` (the driver's default
//! `DeviceFileMode: 438`), 0400 for the MIG `config` capability, 0444 for `monitor` and the GPU /
//! compute instance `access` capabilities, 0660 for `dri/card*`, 0666 for `dri/renderD*`.
//!
//! The dynamic majors are chosen so that they mean nothing else on the host: opening a node whose
//! major no driver registered fails with ENXIO, which is what the simulated NVML counts as "present,
//! no kernel driver behind it". A major that belongs to another host driver would open that driver.

use std::collections::{BTreeMap, BTreeSet};

use crate::description::{Architecture, GpuDescription, NodeDescription};
use crate::mig;

/// Major number of the NVIDIA GPU, control and modeset devices.
pub const NVIDIA_MAJOR: u32 = 195;
/// Minor of `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u32 = 255;
/// Minor of `/dev/nvidia-modeset`.
pub const MODESET_MINOR: u32 = 254;
/// Major number of DRM devices.
pub const DRM_MAJOR: u32 = 226;
/// First minor of DRM render nodes (`renderD128`).
pub const DRM_RENDER_BASE: u32 = 128;

/// Dynamic majors of the simulated node, shared by its device nodes and its `/proc/devices`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Majors {
    /// Major of `nvidia-uvm` and `nvidia-uvm-tools`.
    pub uvm: u32,
    /// Major of the `nvidia-caps` capability devices.
    pub caps: u32,
}

/// Parses the `Character devices:` section of a `/proc/devices` text into name -> major.
fn char_devices(proc_devices: &str) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let mut in_chars = false;
    for line in proc_devices.lines() {
        let line = line.trim();
        if line.ends_with(':') {
            in_chars = line == "Character devices:";
            continue;
        }
        // A blank line ends a section.
        if line.is_empty() || !in_chars {
            in_chars &= !line.is_empty();
            continue;
        }
        if let Some((major, name)) = line.split_once(' ')
            && let Ok(major) = major.parse::<u32>()
        {
            out.push((major, name.trim().to_owned()));
        }
    }
    out
}

/// Candidate dynamic majors, in the order the kernel hands them out (254 down to 234, then the
/// extended range; we stop at 500 to stay clear of low extended majors some distributions pin).
fn candidates() -> impl Iterator<Item = u32> {
    (234..=254).rev().chain((500..=511).rev())
}

/// Chooses the `nvidia-caps` and `nvidia-uvm` majors from the host's `/proc/devices`.
///
/// A host that already has the NVIDIA driver keeps its own majors (the nodes then mean the same
/// thing as the host's). Otherwise each gets the highest free candidate. `None` when no candidate
/// is free.
pub fn choose_majors(host_proc_devices: &str) -> Option<Majors> {
    let devices = char_devices(host_proc_devices);
    let used: BTreeSet<u32> = devices.iter().map(|(m, _)| *m).collect();
    let existing = |name: &str| devices.iter().find(|(_, n)| n == name).map(|(m, _)| *m);
    let mut taken = used.clone();
    let mut pick = |name: &str| -> Option<u32> {
        if let Some(m) = existing(name) {
            return Some(m);
        }
        let m = candidates().find(|m| !taken.contains(m))?;
        taken.insert(m);
        Some(m)
    };
    // The kernel module registers nvidia-caps when it loads, before nvidia-uvm loads.
    let caps = pick("nvidia-caps")?;
    let uvm = pick("nvidia-uvm")?;
    Some(Majors { uvm, caps })
}

/// The simulated `/proc/devices`: a typical host's list plus the NVIDIA driver's lines, in the
/// kernel's format (`%3d %s`, majors ascending), under the driver 550 names (`nvidia`, `nvidiactl`;
/// older drivers said `nvidia-frontend`).
pub fn render_proc_devices(majors: &Majors, with_drm: bool) -> String {
    let mut chars: Vec<(u32, &str)> = vec![
        (1, "mem"),
        (4, "/dev/vc/0"),
        (4, "tty"),
        (4, "ttyS"),
        (5, "/dev/tty"),
        (5, "/dev/console"),
        (5, "/dev/ptmx"),
        (7, "vcs"),
        (10, "misc"),
        (13, "input"),
        (128, "ptm"),
        (136, "pts"),
        (NVIDIA_MAJOR, "nvidia"),
        (NVIDIA_MAJOR, "nvidiactl"),
        (majors.caps, "nvidia-caps"),
        (majors.uvm, "nvidia-uvm"),
    ];
    if with_drm {
        chars.push((DRM_MAJOR, "drm"));
    }
    chars.sort_by_key(|(m, _)| *m); // stable: keeps nvidia before nvidiactl
    let mut out = String::from("Character devices:\n");
    for (m, name) in chars {
        out.push_str(&format!("{m:>3} {name}\n"));
    }
    out.push_str("\nBlock devices:\n  7 loop\n  8 sd\n 11 sr\n259 blkext\n");
    out
}

/// One character device under the dev root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CharDevice {
    /// Path relative to the dev root, e.g. `dev/nvidia0`.
    pub path: String,
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
    /// Permission bits.
    pub mode: u32,
}

/// The builder's display rule (the description has no display field): GPUs of the Ada
/// architecture (the `single` preset's L4) are display-capable and get DRM nodes; data-center
/// boards (Ampere A100, Hopper H100) do not, as on a node where `nvidia-drm` does not claim them.
pub fn has_display(gpu: &GpuDescription) -> bool {
    gpu.architecture == Architecture::Ada
}

/// Every character device of the node, in a fixed order.
pub fn char_devices_for(node: &NodeDescription, majors: &Majors) -> Vec<CharDevice> {
    let dev = |path: String, major, minor, mode| CharDevice { path, major, minor, mode };
    let mut out = Vec::new();
    for gpu in &node.gpus {
        out.push(dev(format!("dev/nvidia{}", gpu.minor), NVIDIA_MAJOR, gpu.minor, 0o666));
    }
    out.push(dev("dev/nvidiactl".into(), NVIDIA_MAJOR, NVIDIACTL_MINOR, 0o666));
    out.push(dev("dev/nvidia-modeset".into(), NVIDIA_MAJOR, MODESET_MINOR, 0o666));
    out.push(dev("dev/nvidia-uvm".into(), majors.uvm, 0, 0o666));
    out.push(dev("dev/nvidia-uvm-tools".into(), majors.uvm, 1, 0o666));
    if node.gpus.iter().any(|g| g.mig.is_some()) {
        let cap =
            |minor: u32, mode| dev(format!("dev/nvidia-caps/nvidia-cap{minor}"), majors.caps, minor, mode);
        out.push(cap(mig::CONFIG_MINOR, 0o400));
        out.push(cap(mig::MONITOR_MINOR, 0o444));
        for access in mig_access(node) {
            out.push(cap(access.minor, 0o444));
        }
    }
    for (n, _gpu) in node.gpus.iter().filter(|g| has_display(g)).enumerate() {
        let n = n as u32;
        out.push(dev(format!("dev/dri/card{n}"), DRM_MAJOR, n, 0o660));
        out.push(dev(
            format!("dev/dri/renderD{}", DRM_RENDER_BASE + n),
            DRM_MAJOR,
            DRM_RENDER_BASE + n,
            0o666,
        ));
    }
    out
}

/// `dev/dri/by-path` links: `(link path relative to the dev root, target)`.
pub fn dri_by_path(node: &NodeDescription) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (n, gpu) in node.gpus.iter().filter(|g| has_display(g)).enumerate() {
        let bus = linux_bus_id(&gpu.pci_bus_id);
        out.push((format!("dev/dri/by-path/pci-{bus}-card"), format!("../card{n}")));
        out.push((
            format!("dev/dri/by-path/pci-{bus}-render"),
            format!("../renderD{}", DRM_RENDER_BASE + n as u32),
        ));
    }
    out
}

/// One MIG access capability of a GPU or compute instance in the description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigAccess {
    /// Name in `mig-minors` and under `capabilities/`, e.g. `gpu0/gi2/ci0/access`.
    pub name: String,
    /// Its minor.
    pub minor: u32,
}

/// The GPU-instance and compute-instance access capabilities of every MIG instance, in
/// description order (each GI's access before its CIs'). Expects a validated description, whose
/// instance ids lie within the driver's table.
pub fn mig_access(node: &NodeDescription) -> Vec<MigAccess> {
    let mut out = Vec::new();
    for gpu in &node.gpus {
        let Some(mig) = &gpu.mig else { continue };
        let m = gpu.minor;
        for gi in &mig.gpu_instances {
            let minor = mig::gpu_instance_access_minor(m, gi.id);
            out.push(MigAccess { name: format!("gpu{m}/gi{}/access", gi.id), minor });
            for ci in &gi.compute_instances {
                out.push(MigAccess {
                    name: format!("gpu{m}/gi{}/ci{}/access", gi.id, ci.id),
                    minor: mig::compute_instance_access_minor(m, gi.id, ci.id),
                });
            }
        }
    }
    out
}

/// GPU minors the `mig-minors` file covers: the driver's 32, or more if the node has higher minors.
pub fn mig_minors_gpu_count(node: &NodeDescription) -> u32 {
    node.gpus.iter().map(|g| g.minor + 1).max().unwrap_or(0).max(mig::MIG_CAPABLE_GPU_MINORS)
}

/// NVML's bus id (`00000000:4E:00.0`) in the kernel's form (`0000:4e:00.0`).
pub fn linux_bus_id(nvml_bus_id: &str) -> String {
    nvml_bus_id.get(4..).unwrap_or(nvml_bus_id).to_ascii_lowercase()
}

/// Majors per name in a `/proc/devices` text (test helper and consistency checks).
pub fn parse_char_majors(proc_devices: &str) -> BTreeMap<String, u32> {
    char_devices(proc_devices).into_iter().map(|(m, n)| (n, m)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str = "Character devices:\n  1 mem\n 10 misc\n245 hidraw\n246 macvtap\n254 ndctl\n\n\
                        Block devices:\n 253 zram\n 252 virtblk\n";

    #[test]
    fn majors_avoid_the_hosts_and_block_numbers_do_not_count() {
        let m = choose_majors(HOST).unwrap();
        assert_eq!(m, Majors { caps: 253, uvm: 252 });
    }

    #[test]
    fn a_host_with_the_driver_keeps_its_majors() {
        let host = "Character devices:\n195 nvidia\n237 nvidia-caps\n510 nvidia-uvm\n";
        assert_eq!(choose_majors(host), Some(Majors { caps: 237, uvm: 510 }));
    }

    #[test]
    fn extended_range_when_the_low_one_is_full() {
        let mut host = String::from("Character devices:\n");
        for m in 234..=254 {
            host.push_str(&format!("{m} x{m}\n"));
        }
        assert_eq!(choose_majors(&host), Some(Majors { caps: 511, uvm: 510 }));
        for m in 500..=511 {
            host.push_str(&format!("{m} x{m}\n"));
        }
        assert_eq!(choose_majors(&host), None);
    }

    #[test]
    fn proc_devices_round_trips_through_the_parser() {
        let majors = Majors { caps: 244, uvm: 243 };
        let text = render_proc_devices(&majors, true);
        let parsed = parse_char_majors(&text);
        assert_eq!(parsed["nvidia"], 195);
        assert_eq!(parsed["nvidiactl"], 195);
        assert_eq!(parsed["nvidia-caps"], 244);
        assert_eq!(parsed["nvidia-uvm"], 243);
        assert_eq!(parsed["drm"], 226);
        assert!(text.contains("\n195 nvidia\n195 nvidiactl\n"));
        // Block majors stay out of the character list.
        assert!(!parsed.contains_key("loop"));
        // Choosing again on a host that looks like the simulated one keeps the same numbers.
        assert_eq!(choose_majors(&text), Some(majors));
    }

    #[test]
    fn mig_access_follows_the_description() {
        let node = crate::presets::preset("a100-mig").unwrap();
        let access = mig_access(&node);
        // GPU 0: 4 GIs with one CI each; GPU 1: 7 GIs with one CI each.
        assert_eq!(access.len(), 2 * (4 + 7));
        assert_eq!(access[0], MigAccess { name: "gpu0/gi2/access".into(), minor: 3 + 2 * 9 });
        assert_eq!(access[1], MigAccess { name: "gpu0/gi2/ci0/access".into(), minor: 3 + 2 * 9 + 1 });
        assert_eq!(mig_minors_gpu_count(&node), 32);
    }

    #[test]
    fn display_rule_and_bus_ids() {
        let single = crate::presets::preset("single").unwrap();
        let majors = Majors { caps: 244, uvm: 243 };
        let devs = char_devices_for(&single, &majors);
        let card = devs.iter().find(|d| d.path == "dev/dri/card0").unwrap();
        assert_eq!((card.major, card.minor, card.mode), (226, 0, 0o660));
        assert!(devs.iter().any(|d| d.path == "dev/dri/renderD128" && d.minor == 128));
        assert_eq!(
            dri_by_path(&single),
            vec![
                ("dev/dri/by-path/pci-0000:01:00.0-card".into(), "../card0".into()),
                ("dev/dri/by-path/pci-0000:01:00.0-render".into(), "../renderD128".into()),
            ]
        );
        // No MIG-capable GPU: no nvidia-caps directory at all.
        assert!(!devs.iter().any(|d| d.path.starts_with("dev/nvidia-caps")));
        let h100 = crate::presets::preset("h100x8").unwrap();
        let devs = char_devices_for(&h100, &majors);
        assert!(!devs.iter().any(|d| d.path.starts_with("dev/dri")));
        assert_eq!(linux_bus_id("00000000:4E:00.0"), "0000:4e:00.0");
    }
}
