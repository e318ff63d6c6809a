//! MIG facts the simulated node must get right: the driver's profile tables and capability minors.
//!
//! Two consumers share this module so that they cannot disagree:
//! - the simulated NVML answers profile queries (`nvmlDeviceGetGpuInstanceProfileInfo`, ...) and
//!   decides MIG-device visibility from the capability nodes;
//! - the tree builder writes `/proc/driver/nvidia-caps/mig-minors` ([`mig_minors_file`]) and makes
//!   `/dev/nvidia-caps/nvidia-cap<minor>` nodes from it.
//!
//! # Profile tables
//! The figures are what `nvidia-smi mig -lgip` / `-lgipp` print on real A100 and H100 boards
//! (R515..R570 drivers): the unique profile id (`ID` column), the `NVML_GPU_INSTANCE_PROFILE_*`
//! index the id belongs to, instance count, memory in MiB, SM / copy-engine / decoder / encoder /
//! JPEG / OFA counts and the placement starts on the 8-slice memory axis. Memory sizes move a little
//! between driver branches; the names do not, because NVIDIA derives a profile's `Ngb` figure from its
//! share of the whole GPU in eighths ([`profile_memory_gb`]), not from rounding its MiB.
//!
//! # Capability minors
//! The driver numbers MIG access capabilities statically (verified against the `mig-minors` excerpts
//! in NVIDIA's driver documentation and its container toolkit: `gpu0/gi0/access 3`,
//! `gpu0/gi0/ci0/access 4`, `gpu3/gi3/ci3/access 439`, `gpu31/gi14/ci7/access 4322`): `config` is 1,
//! `monitor` is 2, then for each GPU minor `g` in 0..32, GPU instance `i` in 0..15 and compute
//! instance `c` in 0..8, `gpu<g>/gi<i>/access` followed by its eight `gpu<g>/gi<i>/ci<c>/access`
//! lines, counting up from 3. That is 9 minors per GPU instance and 135 per GPU.

use std::fmt::Write as _;

use crate::schema::{FieldProblem, GpuDescription, NodeDescription};

/// Minor of the `config` capability (`/dev/nvidia-caps/nvidia-cap1`).
pub const CONFIG_MINOR: u32 = 1;
/// Minor of the `monitor` capability (`/dev/nvidia-caps/nvidia-cap2`).
pub const MONITOR_MINOR: u32 = 2;
/// GPU instance ids the driver reserves capability minors for: `gi0` ..= `gi14`.
pub const GPU_INSTANCES_PER_GPU: u32 = 15;
/// Compute instance ids per GPU instance: `ci0` ..= `ci7`.
pub const COMPUTE_INSTANCES_PER_GPU_INSTANCE: u32 = 8;
/// GPU minors covered by the driver's `mig-minors` file: `gpu0` ..= `gpu31`.
pub const MIG_CAPABLE_GPU_MINORS: u32 = 32;

const MINORS_PER_GPU_INSTANCE: u32 = 1 + COMPUTE_INSTANCES_PER_GPU_INSTANCE;
const MINORS_PER_GPU: u32 = GPU_INSTANCES_PER_GPU * MINORS_PER_GPU_INSTANCE;
const FIRST_GPU_INSTANCE_MINOR: u32 = 3;

/// Minor of `gpu<gpu_minor>/gi<gpu_instance>/access`.
pub fn gpu_instance_access_minor(gpu_minor: u32, gpu_instance: u32) -> u32 {
    FIRST_GPU_INSTANCE_MINOR + gpu_minor * MINORS_PER_GPU + gpu_instance * MINORS_PER_GPU_INSTANCE
}

/// Minor of `gpu<gpu_minor>/gi<gpu_instance>/ci<compute_instance>/access`.
pub fn compute_instance_access_minor(gpu_minor: u32, gpu_instance: u32, compute_instance: u32) -> u32 {
    gpu_instance_access_minor(gpu_minor, gpu_instance) + 1 + compute_instance
}

/// The text of `/proc/driver/nvidia-caps/mig-minors` covering GPU minors `0..gpu_count`.
///
/// The real driver always lists [`MIG_CAPABLE_GPU_MINORS`] GPUs whatever is installed; pass that for a
/// faithful copy, or fewer for a short file in tests.
pub fn mig_minors_file(gpu_count: u32) -> String {
    let mut out = format!("config {CONFIG_MINOR}\nmonitor {MONITOR_MINOR}\n");
    for g in 0..gpu_count {
        for i in 0..GPU_INSTANCES_PER_GPU {
            // Writing to a String cannot fail.
            let _ = writeln!(out, "gpu{g}/gi{i}/access {}", gpu_instance_access_minor(g, i));
            for c in 0..COMPUTE_INSTANCES_PER_GPU_INSTANCE {
                let _ = writeln!(out, "gpu{g}/gi{i}/ci{c}/access {}", compute_instance_access_minor(g, i, c));
            }
        }
    }
    out
}

/// One GPU instance profile of a GPU model, as `nvidia-smi mig -lgip` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuInstanceProfile {
    /// Short name, e.g. `3g.40gb` or `1g.10gb+me` (NVML's own name field adds the `MIG ` prefix).
    pub name: &'static str,
    /// The `NVML_GPU_INSTANCE_PROFILE_*` index a caller passes to `nvmlDeviceGetGpuInstanceProfileInfo`.
    pub index: u32,
    /// The unique profile id (`ID` column of `-lgip`, `profileId` of `nvmlGpuInstanceInfo_t`).
    pub id: u32,
    /// Compute slices (the `Ng` of the name; `gpuInstanceSliceCount` of a MIG device's attributes).
    pub slices: u32,
    /// Memory slices on the 8-slice axis: the placement size.
    pub memory_slices: u32,
    /// How many instances of this profile fit on an empty GPU.
    pub instance_count: u32,
    /// Valid placement starts on the memory axis (`-lgipp`).
    pub placements: &'static [u32],
    /// Framebuffer memory of an instance in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Copy engines.
    pub copy_engines: u32,
    /// Video decoders.
    pub decoders: u32,
    /// Video encoders.
    pub encoders: u32,
    /// JPEG engines.
    pub jpegs: u32,
    /// Optical-flow accelerators.
    pub ofas: u32,
}

/// A compute instance profile inside a GPU instance profile (`nvidia-smi mig -lcip`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComputeInstanceProfile {
    /// Name: the GPU instance profile's own name for a full-size compute instance, else `Nc.<gi name>`.
    pub name: String,
    /// The `NVML_COMPUTE_INSTANCE_PROFILE_*` index, which is also the profile id `-lcip` shows.
    pub index: u32,
    /// Compute slices.
    pub slices: u32,
    /// How many fit in an empty GPU instance.
    pub instance_count: u32,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
}

/// A MIG-capable GPU model and its profile table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigModel {
    /// Product name as NVML reports it.
    pub name: &'static str,
    /// PCI device ids (upper half of NVML's `pciDeviceId`) of the boards with this table.
    pub pci_device_ids: &'static [u16],
    /// Whole-GPU framebuffer in MiB, the base of the profile names' GB figures.
    pub memory_mib: u64,
    /// Most MIG devices (compute instances) the GPU can hold.
    pub max_mig_devices: u32,
    /// Profiles in `-lgip` order.
    pub profiles: &'static [GpuInstanceProfile],
}

impl MigModel {
    /// The profile with this short name (`3g.40gb`).
    pub fn profile_by_name(&self, name: &str) -> Option<&'static GpuInstanceProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// The profile at this `NVML_GPU_INSTANCE_PROFILE_*` index.
    pub fn profile_by_index(&self, index: u32) -> Option<&'static GpuInstanceProfile> {
        self.profiles.iter().find(|p| p.index == index)
    }

    /// The profile with this unique id.
    pub fn profile_by_id(&self, id: u32) -> Option<&'static GpuInstanceProfile> {
        self.profiles.iter().find(|p| p.id == id)
    }

    /// SMs of one compute slice: what a `1c.` compute instance gets.
    pub fn multiprocessors_per_slice(&self) -> u32 {
        self.profiles.iter().find(|p| p.slices == 1).map_or(0, |p| p.multiprocessors)
    }

    /// The full-GPU profile (`7g.*`), whose engine counts are the whole GPU's.
    pub fn full_profile(&self) -> Option<&'static GpuInstanceProfile> {
        self.profiles.iter().max_by_key(|p| (p.slices, p.memory_slices))
    }

    /// Compute instance profiles a GPU instance of `gi` can hold, smallest first.
    pub fn compute_profiles(&self, gi: &GpuInstanceProfile) -> Vec<ComputeInstanceProfile> {
        COMPUTE_SLICE_INDEX
            .iter()
            .filter(|&&(slices, _)| {
                slices <= gi.slices && (slices == gi.slices || allowed_split(gi.slices, slices))
            })
            .map(|&(slices, index)| ComputeInstanceProfile {
                name: if slices == gi.slices { gi.name.to_owned() } else { format!("{slices}c.{}", gi.name) },
                index,
                slices,
                instance_count: gi.slices / slices,
                multiprocessors: if slices == gi.slices {
                    gi.multiprocessors
                } else {
                    slices * self.multiprocessors_per_slice()
                },
            })
            .collect()
    }
}

/// `(compute slices, NVML_COMPUTE_INSTANCE_PROFILE_* index)`.
const COMPUTE_SLICE_INDEX: [(u32, u32); 5] = [(1, 0), (2, 1), (3, 2), (4, 3), (7, 4)];

/// Partial compute instances the driver offers: `-lcip` lists 1c/2c/3c/4c for a 7g instance,
/// 1c/2c for a 4g one, 1c/2c for 3g, 1c for 2g.
fn allowed_split(gi_slices: u32, ci_slices: u32) -> bool {
    match gi_slices {
        7 => matches!(ci_slices, 1..=4),
        4 | 3 => matches!(ci_slices, 1 | 2),
        2 => ci_slices == 1,
        _ => false,
    }
}

/// The `Ngb` figure of a profile name, as NVIDIA's go-nvlib derives it: the instance's share of the
/// GPU rounded up to eighths, times the GPU's memory in whole GiB, rounded.
pub fn profile_memory_gb(gpu_memory_mib: u64, profile_memory_mib: u64) -> u64 {
    if gpu_memory_mib == 0 {
        return profile_memory_mib.div_ceil(1024);
    }
    let eighths = (8 * profile_memory_mib).div_ceil(gpu_memory_mib);
    let gpu_gb = gpu_memory_mib.div_ceil(1024);
    (eighths * gpu_gb + 4) / 8
}

const P1: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const P2: &[u32] = &[0, 2, 4];
const P2_REV: &[u32] = &[0, 2, 4, 6];
const P3: &[u32] = &[0, 4];
const P4: &[u32] = &[0];
const P7: &[u32] = &[0];

#[allow(clippy::too_many_arguments)]
const fn gip(
    name: &'static str,
    index: u32,
    id: u32,
    slices: u32,
    memory_slices: u32,
    instance_count: u32,
    placements: &'static [u32],
    memory_mib: u64,
    engines: [u32; 6],
) -> GpuInstanceProfile {
    let [multiprocessors, copy_engines, decoders, encoders, jpegs, ofas] = engines;
    GpuInstanceProfile {
        name,
        index,
        id,
        slices,
        memory_slices,
        instance_count,
        placements,
        memory_mib,
        multiprocessors,
        copy_engines,
        decoders,
        encoders,
        jpegs,
        ofas,
    }
}

// NVML_GPU_INSTANCE_PROFILE_* indices.
const I1: u32 = 0;
const I2: u32 = 1;
const I3: u32 = 2;
const I4: u32 = 3;
const I7: u32 = 4;
const I1_ME: u32 = 7; // 1_SLICE_REV1: one slice with all media engines
const I1_2M: u32 = 9; // 1_SLICE_REV2: one compute slice, two memory slices

// Engines: [SM, CE, DEC, ENC, JPEG, OFA].
const A100_40GB: &[GpuInstanceProfile] = &[
    gip("1g.5gb", I1, 19, 1, 1, 7, P1, 4864, [14, 1, 0, 0, 0, 0]),
    gip("1g.5gb+me", I1_ME, 20, 1, 1, 1, P1, 4864, [14, 1, 1, 0, 1, 1]),
    gip("1g.10gb", I1_2M, 15, 1, 2, 4, P2_REV, 9856, [14, 1, 1, 0, 0, 0]),
    gip("2g.10gb", I2, 14, 2, 2, 3, P2, 9856, [28, 2, 1, 0, 0, 0]),
    gip("3g.20gb", I3, 9, 3, 4, 2, P3, 19968, [42, 3, 2, 0, 0, 0]),
    gip("4g.20gb", I4, 5, 4, 4, 1, P4, 19968, [56, 4, 2, 0, 0, 0]),
    gip("7g.40gb", I7, 0, 7, 8, 1, P7, 40192, [98, 7, 5, 0, 1, 1]),
];

const A100_80GB: &[GpuInstanceProfile] = &[
    gip("1g.10gb", I1, 19, 1, 1, 7, P1, 9728, [14, 1, 0, 0, 0, 0]),
    gip("1g.10gb+me", I1_ME, 20, 1, 1, 1, P1, 9728, [14, 1, 1, 0, 1, 1]),
    gip("1g.20gb", I1_2M, 15, 1, 2, 4, P2_REV, 19968, [14, 1, 1, 0, 0, 0]),
    gip("2g.20gb", I2, 14, 2, 2, 3, P2, 19968, [28, 2, 1, 0, 0, 0]),
    gip("3g.40gb", I3, 9, 3, 4, 2, P3, 40192, [42, 3, 2, 0, 0, 0]),
    gip("4g.40gb", I4, 5, 4, 4, 1, P4, 40192, [56, 4, 2, 0, 0, 0]),
    gip("7g.80gb", I7, 0, 7, 8, 1, P7, 80896, [98, 7, 5, 0, 1, 1]),
];

const H100_SXM_80GB: &[GpuInstanceProfile] = &[
    gip("1g.10gb", I1, 19, 1, 1, 7, P1, 9984, [16, 1, 1, 0, 1, 0]),
    gip("1g.10gb+me", I1_ME, 20, 1, 1, 1, P1, 9984, [16, 1, 1, 0, 1, 1]),
    gip("1g.20gb", I1_2M, 15, 1, 2, 4, P2_REV, 20096, [26, 1, 1, 0, 1, 0]),
    gip("2g.20gb", I2, 14, 2, 2, 3, P2, 20096, [32, 2, 2, 0, 2, 0]),
    gip("3g.40gb", I3, 9, 3, 4, 2, P3, 40448, [60, 3, 3, 0, 3, 0]),
    gip("4g.40gb", I4, 5, 4, 4, 1, P4, 40448, [64, 4, 4, 0, 4, 0]),
    gip("7g.80gb", I7, 0, 7, 8, 1, P7, 81152, [132, 8, 7, 0, 7, 1]),
];

const H100_PCIE_80GB: &[GpuInstanceProfile] = &[
    gip("1g.10gb", I1, 19, 1, 1, 7, P1, 9984, [14, 1, 1, 0, 1, 0]),
    gip("1g.10gb+me", I1_ME, 20, 1, 1, 1, P1, 9984, [14, 1, 1, 0, 1, 1]),
    gip("1g.20gb", I1_2M, 15, 1, 2, 4, P2_REV, 20096, [14, 1, 1, 0, 1, 0]),
    gip("2g.20gb", I2, 14, 2, 2, 3, P2, 20096, [30, 2, 2, 0, 2, 0]),
    gip("3g.40gb", I3, 9, 3, 4, 2, P3, 40448, [46, 3, 3, 0, 3, 0]),
    gip("4g.40gb", I4, 5, 4, 4, 1, P4, 40448, [62, 4, 4, 0, 4, 0]),
    gip("7g.80gb", I7, 0, 7, 8, 1, P7, 81152, [114, 8, 7, 0, 7, 1]),
];

/// Every GPU model with a profile table.
pub const MODELS: &[MigModel] = &[
    MigModel {
        name: "NVIDIA A100-SXM4-40GB",
        pci_device_ids: &[0x20b0, 0x20f1],
        memory_mib: 40960,
        max_mig_devices: 7,
        profiles: A100_40GB,
    },
    MigModel {
        name: "NVIDIA A100-SXM4-80GB",
        pci_device_ids: &[0x20b2, 0x20b5],
        memory_mib: 81920,
        max_mig_devices: 7,
        profiles: A100_80GB,
    },
    MigModel {
        name: "NVIDIA H100 80GB HBM3",
        pci_device_ids: &[0x2330],
        memory_mib: 81559,
        max_mig_devices: 7,
        profiles: H100_SXM_80GB,
    },
    MigModel {
        name: "NVIDIA H100 PCIe",
        pci_device_ids: &[0x2331],
        memory_mib: 81559,
        max_mig_devices: 7,
        profiles: H100_PCIE_80GB,
    },
];

/// The profile table for a GPU, by the device half of its PCI id.
pub fn model_for(gpu: &GpuDescription) -> Option<&'static MigModel> {
    let device = (gpu.pci_device_id >> 16) as u16;
    MODELS.iter().find(|m| m.pci_device_ids.contains(&device))
}

fn known_models() -> String {
    MODELS
        .iter()
        .map(|m| {
            let ids: Vec<String> = m.pci_device_ids.iter().map(|d| format!("{d:#06x}")).collect();
            format!("{} ({})", m.name, ids.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Checks every GPU's MIG layout against its model's table: profile names, placements, ids within the
/// driver's capability range, compute instance profiles and slice budgets.
pub fn check_profiles(node: &NodeDescription) -> Result<(), FieldProblem> {
    let problem = |field: String, message: String| Err(FieldProblem { field, message });
    for (i, gpu) in node.gpus.iter().enumerate() {
        let Some(mig) = &gpu.mig else { continue };
        if mig.gpu_instances.is_empty() {
            continue;
        }
        let Some(model) = model_for(gpu) else {
            return problem(
                format!("gpus[{i}].mig.gpu_instances"),
                format!(
                    "no MIG profile table for PCI device {:#06x}; MIG instances can be described for: {}",
                    gpu.pci_device_id >> 16,
                    known_models()
                ),
            );
        };
        if gpu.minor >= MIG_CAPABLE_GPU_MINORS {
            return problem(
                format!("gpus[{i}].minor"),
                format!(
                    "{} has no MIG capability minors; the driver covers GPU minors 0..={}",
                    gpu.minor,
                    MIG_CAPABLE_GPU_MINORS - 1
                ),
            );
        }
        let mut used: Vec<(u32, u32, usize)> = Vec::new();
        for (g, gi) in mig.gpu_instances.iter().enumerate() {
            let at = |f: &str| format!("gpus[{i}].mig.gpu_instances[{g}].{f}");
            let Some(profile) = model.profile_by_name(&gi.profile) else {
                let valid: Vec<&str> = model.profiles.iter().map(|p| p.name).collect();
                return problem(
                    at("profile"),
                    format!(
                        "`{}` is not a profile of {}; valid: {}",
                        gi.profile,
                        model.name,
                        valid.join(", ")
                    ),
                );
            };
            if gi.id >= GPU_INSTANCES_PER_GPU {
                return problem(
                    at("id"),
                    format!(
                        "{} is out of range; GPU instance ids are 0..={}",
                        gi.id,
                        GPU_INSTANCES_PER_GPU - 1
                    ),
                );
            }
            if !profile.placements.contains(&gi.placement_start) {
                return problem(
                    at("placement_start"),
                    format!(
                        "{} is not a placement of `{}`; valid starts: {:?}",
                        gi.placement_start, profile.name, profile.placements
                    ),
                );
            }
            let (start, end) = (gi.placement_start, gi.placement_start + profile.memory_slices);
            if let Some(&(s, e, other)) = used.iter().find(|&&(s, e, _)| start < e && s < end) {
                return problem(
                    at("placement_start"),
                    format!(
                        "memory slices {start}..{end} overlap gpu_instances[{other}] (slices {s}..{e}); \
                         move one of them"
                    ),
                );
            }
            used.push((start, end, g));
            let same = mig.gpu_instances[..=g].iter().filter(|o| o.profile == gi.profile).count() as u32;
            if same > profile.instance_count {
                return problem(
                    at("profile"),
                    format!(
                        "{} can hold at most {} `{}` instance(s)",
                        model.name, profile.instance_count, profile.name
                    ),
                );
            }
            let compute = model.compute_profiles(profile);
            let mut slices = 0;
            for (c, ci) in gi.compute_instances.iter().enumerate() {
                let cat = |f: &str| format!("gpus[{i}].mig.gpu_instances[{g}].compute_instances[{c}].{f}");
                if ci.id >= COMPUTE_INSTANCES_PER_GPU_INSTANCE {
                    return problem(
                        cat("id"),
                        format!(
                            "{} is out of range; compute instance ids are 0..={}",
                            ci.id,
                            COMPUTE_INSTANCES_PER_GPU_INSTANCE - 1
                        ),
                    );
                }
                let Some(cp) = compute.iter().find(|p| p.name == ci.profile) else {
                    let valid: Vec<&str> = compute.iter().map(|p| p.name.as_str()).collect();
                    return problem(
                        cat("profile"),
                        format!(
                            "`{}` is not a compute profile of `{}`; valid: {}",
                            ci.profile,
                            profile.name,
                            valid.join(", ")
                        ),
                    );
                };
                slices += cp.slices;
            }
            if slices > profile.slices {
                return problem(
                    at("compute_instances"),
                    format!(
                        "compute instances use {slices} compute slices; `{}` has {}",
                        profile.name, profile.slices
                    ),
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minors_match_the_drivers_published_examples() {
        assert_eq!(gpu_instance_access_minor(0, 0), 3);
        assert_eq!(compute_instance_access_minor(0, 0, 0), 4);
        assert_eq!(compute_instance_access_minor(0, 0, 2), 6);
        assert_eq!(compute_instance_access_minor(3, 3, 3), 439);
        assert_eq!(compute_instance_access_minor(6, 11, 7), 920);
        assert_eq!(compute_instance_access_minor(31, 14, 7), 4322);
        // From a real H100 node: GPU 2's GI 2 and GPU 3's GI 1.
        assert_eq!(gpu_instance_access_minor(2, 2), 291);
        assert_eq!(gpu_instance_access_minor(3, 1), 417);
    }

    #[test]
    fn minors_file_is_dense_and_agrees_with_the_formula() {
        let text = mig_minors_file(MIG_CAPABLE_GPU_MINORS);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "config 1");
        assert_eq!(lines[1], "monitor 2");
        assert_eq!(lines[2], "gpu0/gi0/access 3");
        assert_eq!(lines[3], "gpu0/gi0/ci0/access 4");
        assert_eq!(lines.last(), Some(&"gpu31/gi14/ci7/access 4322"));
        for (n, line) in lines.iter().enumerate() {
            let minor: usize = line.rsplit(' ').next().unwrap().parse().unwrap();
            assert_eq!(minor, n + 1, "{line}");
        }
    }

    #[test]
    fn every_profile_name_follows_from_its_memory_and_slices() {
        for model in MODELS {
            for p in model.profiles {
                let base = p.name.split('+').next().unwrap();
                let expected =
                    format!("{}g.{}gb", p.slices, profile_memory_gb(model.memory_mib, p.memory_mib));
                assert_eq!(base, expected, "{} {}", model.name, p.name);
                assert!(p.placements.iter().all(|s| s + p.memory_slices <= 8), "{} {}", model.name, p.name);
                // `+me` profiles have seven placements but one instance: there is one set of media engines.
                assert!(p.placements.len() as u32 >= p.instance_count, "{} {}", model.name, p.name);
            }
            let ids: std::collections::BTreeSet<u32> = model.profiles.iter().map(|p| p.id).collect();
            assert_eq!(ids.len(), model.profiles.len(), "{}: duplicate profile ids", model.name);
        }
    }

    #[test]
    fn a100_80gb_ids_are_the_ones_nvidia_smi_shows() {
        let m = MODELS.iter().find(|m| m.name == "NVIDIA A100-SXM4-80GB").unwrap();
        let ids: Vec<(&str, u32)> = m.profiles.iter().map(|p| (p.name, p.id)).collect();
        assert_eq!(
            ids,
            [
                ("1g.10gb", 19),
                ("1g.10gb+me", 20),
                ("1g.20gb", 15),
                ("2g.20gb", 14),
                ("3g.40gb", 9),
                ("4g.40gb", 5),
                ("7g.80gb", 0)
            ]
        );
    }

    #[test]
    fn compute_profiles_of_a_3g_instance() {
        let m = MODELS.iter().find(|m| m.name == "NVIDIA A100-SXM4-80GB").unwrap();
        let cps = m.compute_profiles(m.profile_by_name("3g.40gb").unwrap());
        let view: Vec<(&str, u32, u32, u32)> =
            cps.iter().map(|c| (c.name.as_str(), c.index, c.instance_count, c.multiprocessors)).collect();
        assert_eq!(view, [("1c.3g.40gb", 0, 3, 14), ("2c.3g.40gb", 1, 1, 28), ("3g.40gb", 2, 1, 42)]);
    }

    fn mig_node() -> NodeDescription {
        crate::presets::preset("a100-mig").unwrap()
    }

    fn check(node: &NodeDescription) -> Result<(), String> {
        check_profiles(node).map_err(|p| p.to_string())
    }

    #[test]
    fn shipped_presets_pass() {
        for name in crate::presets::NAMES {
            assert_eq!(check(&crate::presets::preset(name).unwrap()), Ok(()), "{name}");
        }
    }

    #[test]
    fn a_profile_the_model_lacks_is_named_with_the_valid_ones() {
        let mut node = mig_node();
        node.gpus[0].mig.as_mut().unwrap().gpu_instances[1].profile = "2g.10gb".into();
        let err = check(&node).unwrap_err();
        assert!(err.starts_with("field `gpus[0].mig.gpu_instances[1].profile`"), "{err}");
        assert!(
            err.contains("valid: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"),
            "{err}"
        );
    }

    #[test]
    fn overlapping_placements_are_rejected() {
        let mut node = mig_node();
        node.gpus[0].mig.as_mut().unwrap().gpu_instances[2].placement_start = 5;
        let err = check(&node).unwrap_err();
        assert!(err.contains("gpu_instances[2].placement_start"), "{err}");
        assert!(err.contains("overlap gpu_instances[0]"), "{err}");
    }

    #[test]
    fn a_placement_the_profile_cannot_have_is_rejected() {
        let mut node = mig_node();
        node.gpus[0].mig.as_mut().unwrap().gpu_instances[0].placement_start = 2;
        let err = check(&node).unwrap_err();
        assert!(err.contains("gpu_instances[0].placement_start") && err.contains("[0, 4]"), "{err}");
    }

    #[test]
    fn compute_profiles_and_budgets_are_checked() {
        let mut node = mig_node();
        let gi = &mut node.gpus[0].mig.as_mut().unwrap().gpu_instances[0];
        gi.compute_instances[0].profile = "4c.3g.40gb".into();
        let err = check(&node).unwrap_err();
        assert!(
            err.contains("compute_instances[0].profile") && err.contains("1c.3g.40gb, 2c.3g.40gb"),
            "{err}"
        );

        let mut node = mig_node();
        let gi = &mut node.gpus[0].mig.as_mut().unwrap().gpu_instances[0];
        let mut extra = gi.compute_instances[0].clone();
        extra.id = 1;
        extra.uuid = "MIG-00000000-0000-0000-0000-000000000001".into();
        gi.compute_instances.push(extra);
        let err = check(&node).unwrap_err();
        assert!(err.contains("compute instances use 6 compute slices"), "{err}");
    }

    #[test]
    fn more_instances_than_the_profile_allows_are_rejected() {
        let mut node = mig_node();
        let gis = &mut node.gpus[0].mig.as_mut().unwrap().gpu_instances;
        gis[2].profile = "1g.10gb+me".into();
        gis[2].compute_instances[0].profile = "1g.10gb+me".into();
        assert_eq!(check(&node), Ok(()));
        let gis = &mut node.gpus[0].mig.as_mut().unwrap().gpu_instances;
        gis[3].profile = "1g.10gb+me".into();
        gis[3].compute_instances[0].profile = "1g.10gb+me".into();
        let err = check(&node).unwrap_err();
        assert!(err.contains("gpu_instances[3].profile") && err.contains("at most 1 `1g.10gb+me`"), "{err}");
    }

    #[test]
    fn unknown_model_with_instances_is_rejected() {
        let mut node = mig_node();
        node.gpus[0].pci_device_id = 0x1234_10de;
        let err = check(&node).unwrap_err();
        assert!(err.contains("no MIG profile table for PCI device 0x1234"), "{err}");
    }

    #[test]
    fn validate_reports_the_profile_problem() {
        let mut node = mig_node();
        node.gpus[1].mig.as_mut().unwrap().gpu_instances[0].profile = "1g.5gb".into();
        let err = node.validate().unwrap_err();
        assert_eq!(err.field, "gpus[1].mig.gpu_instances[0].profile");
    }
}
