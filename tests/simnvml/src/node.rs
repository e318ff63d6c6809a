//! The pure model: a description plus what this process may open, turned into NVML's object graph.
//!
//! Built once per `nvmlInit` and then only read. GPUs appear in description order, numbered from 0
//! over the visible ones (so a container given only the description's GPU 1 sees it as NVML index 0),
//! MIG devices likewise per GPU. Every object gets a handle: an opaque address handed out by the
//! caller-supplied allocator and looked up in a table, never dereferenced, so a stale or forged handle
//! is answered with `NVML_ERROR_INVALID_ARGUMENT` instead of a crash.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use nvinject_simnode::description::{
    ComputeInstanceDescription, DescriptionError, GpuDescription, GpuInstanceDescription, NodeDescription,
};
use nvinject_simnode::mig::{self, ComputeInstanceProfile, GpuInstanceProfile, MigModel};
use nvml_wrapper_sys::bindings as sys;

use crate::devfs::{self, DevFs};

/// NVML's `NVML_NVLINK_MAX_LINKS`: link numbers at or above it are invalid arguments.
pub const MAX_LINKS: usize = sys::NVML_NVLINK_MAX_LINKS as usize;

/// What a handle refers to. Indices are positions in [`Node::gpus`] and the vectors below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Object {
    /// A physical GPU (`nvmlDevice_t`).
    Gpu {
        /// NVML index.
        gpu: usize,
    },
    /// A MIG device (`nvmlDevice_t` of a compute instance).
    Mig {
        /// NVML index of the parent GPU.
        gpu: usize,
        /// MIG device index under the parent.
        mig: usize,
    },
    /// A GPU instance (`nvmlGpuInstance_t`).
    GpuInstance {
        /// NVML index of the parent GPU.
        gpu: usize,
        /// Position in [`Gpu::instances`].
        gi: usize,
    },
    /// A compute instance (`nvmlComputeInstance_t`).
    ComputeInstance {
        /// NVML index of the parent GPU.
        gpu: usize,
        /// Position in [`Gpu::instances`].
        gi: usize,
        /// Position in [`GpuInstance::compute`].
        ci: usize,
    },
}

/// The enumerated node for one `nvmlInit`.
#[derive(Debug)]
pub struct Node {
    /// The description it was built from.
    pub description: NodeDescription,
    /// Where the description came from, for messages.
    pub origin: PathBuf,
    /// The dev root the visibility checks used.
    pub dev_root: PathBuf,
    /// Visible GPUs in NVML index order.
    pub gpus: Vec<Gpu>,
    /// Per description GPU: link number -> description index of the peer.
    pub links: Vec<Vec<usize>>,
    objects: HashMap<usize, Object>,
}

/// A visible GPU.
#[derive(Debug)]
pub struct Gpu {
    /// Position in the description's `gpus`.
    pub desc: usize,
    /// Its handle.
    pub handle: usize,
    /// Its MIG profile table, when the model has one.
    pub model: Option<&'static MigModel>,
    /// Visible GPU instances, in description order.
    pub instances: Vec<GpuInstance>,
    /// Visible MIG devices (compute instances), in description order.
    pub mig_devices: Vec<MigDevice>,
}

impl Gpu {
    /// MIG device indices NVML offers with MIG on: the model's maximum, or the visible devices when
    /// there are more (or no table); indices past the visible devices are empty slots.
    pub fn mig_device_slots(&self) -> usize {
        let visible = self.mig_devices.len();
        self.model.map_or(visible, |m| (m.max_mig_devices as usize).max(visible))
    }
}

/// A visible GPU instance.
#[derive(Debug)]
pub struct GpuInstance {
    /// Position in the description's `gpu_instances`.
    pub desc: usize,
    /// Its handle.
    pub handle: usize,
    /// Its profile.
    pub profile: &'static GpuInstanceProfile,
    /// Visible compute instances, in description order.
    pub compute: Vec<ComputeInstance>,
}

/// A visible compute instance.
#[derive(Debug)]
pub struct ComputeInstance {
    /// Position in the description's `compute_instances`.
    pub desc: usize,
    /// Its handle.
    pub handle: usize,
    /// Its compute profile.
    pub profile: ComputeInstanceProfile,
    /// First compute slice inside the GPU instance (description order packs them from 0).
    pub placement_start: u32,
    /// Index of the MIG device it forms.
    pub mig_device: usize,
}

/// A visible MIG device: the compute instance at `instances[gi].compute[ci]`.
#[derive(Debug, Clone, Copy)]
pub struct MigDevice {
    /// Position in [`Gpu::instances`].
    pub gi: usize,
    /// Position in [`GpuInstance::compute`].
    pub ci: usize,
    /// The MIG device's `nvmlDevice_t`.
    pub handle: usize,
}

impl Node {
    /// Enumerates `description` as this process sees it through `fs`; `alloc` hands out handle values.
    ///
    /// Fails only for descriptions NVML could not represent (more NVLink links on a GPU than NVML has
    /// link numbers), naming `origin` and the field.
    pub fn build(
        description: NodeDescription,
        origin: &Path,
        fs: &dyn DevFs,
        alloc: &mut dyn FnMut() -> usize,
    ) -> Result<Node, DescriptionError> {
        let links = assign_links(&description, origin)?;
        let dev_root = devfs::dev_root(description.dev_root.as_deref(), fs);
        let caps_checked = fs.is_dir(&devfs::caps_dir(&dev_root));
        let mut objects = HashMap::new();
        let mut gpus = Vec::new();
        for (desc, gpu) in description.gpus.iter().enumerate() {
            if !fs.usable(&devfs::gpu_node(&dev_root, gpu.minor)) {
                continue;
            }
            let index = gpus.len();
            let handle = alloc();
            objects.insert(handle, Object::Gpu { gpu: index });
            let model = mig::model_for(gpu);
            let mut instances = Vec::new();
            let mut mig_devices = Vec::new();
            let enabled = gpu.mig.as_ref().filter(|m| m.enabled);
            for (gi_desc, gi) in
                enabled.map(|m| m.gpu_instances.as_slice()).unwrap_or_default().iter().enumerate()
            {
                let Some(profile) = model.and_then(|m| m.profile_by_name(&gi.profile)) else {
                    // NodeDescription::validate rejects this; kept as an error rather than a panic.
                    return Err(DescriptionError::Invalid {
                        path: origin.to_owned(),
                        field: format!("gpus[{desc}].mig.gpu_instances[{gi_desc}].profile"),
                        message: format!("`{}` is not a MIG profile of this GPU model", gi.profile),
                    });
                };
                let usable = |minor: u32| !caps_checked || fs.usable(&devfs::cap_node(&dev_root, minor));
                if !usable(mig::gpu_instance_access_minor(gpu.minor, gi.id)) {
                    continue;
                }
                let gi_pos = instances.len();
                let gi_handle = alloc();
                objects.insert(gi_handle, Object::GpuInstance { gpu: index, gi: gi_pos });
                let compute_profiles = model.map(|m| m.compute_profiles(profile)).unwrap_or_default();
                let mut compute = Vec::new();
                let mut next_slice = 0;
                for (ci_desc, ci) in gi.compute_instances.iter().enumerate() {
                    let Some(cp) = compute_profiles.iter().find(|p| p.name == ci.profile) else {
                        return Err(DescriptionError::Invalid {
                            path: origin.to_owned(),
                            field: format!(
                                "gpus[{desc}].mig.gpu_instances[{gi_desc}].compute_instances[{ci_desc}].profile"
                            ),
                            message: format!("`{}` is not a compute profile of `{}`", ci.profile, gi.profile),
                        });
                    };
                    let placement_start = next_slice;
                    next_slice += cp.slices;
                    if !usable(mig::compute_instance_access_minor(gpu.minor, gi.id, ci.id)) {
                        continue;
                    }
                    let ci_pos = compute.len();
                    let ci_handle = alloc();
                    objects.insert(ci_handle, Object::ComputeInstance { gpu: index, gi: gi_pos, ci: ci_pos });
                    let mig_handle = alloc();
                    objects.insert(mig_handle, Object::Mig { gpu: index, mig: mig_devices.len() });
                    compute.push(ComputeInstance {
                        desc: ci_desc,
                        handle: ci_handle,
                        profile: cp.clone(),
                        placement_start,
                        mig_device: mig_devices.len(),
                    });
                    mig_devices.push(MigDevice { gi: gi_pos, ci: ci_pos, handle: mig_handle });
                }
                instances.push(GpuInstance { desc: gi_desc, handle: gi_handle, profile, compute });
            }
            gpus.push(Gpu { desc, handle, model, instances, mig_devices });
        }
        Ok(Node { description, origin: origin.to_owned(), dev_root, gpus, links, objects })
    }

    /// What `handle` refers to, if it is one of this node's.
    pub fn resolve(&self, handle: usize) -> Option<Object> {
        self.objects.get(&handle).copied()
    }

    /// The description of a visible GPU.
    pub fn gpu_desc(&self, gpu: usize) -> &GpuDescription {
        &self.description.gpus[self.gpus[gpu].desc]
    }

    /// The description of a visible GPU instance.
    pub fn gi_desc(&self, gpu: usize, gi: usize) -> &GpuInstanceDescription {
        let instances =
            &self.gpu_desc(gpu).mig.as_ref().expect("visible GPU instances imply MIG").gpu_instances;
        &instances[self.gpus[gpu].instances[gi].desc]
    }

    /// The description of a visible compute instance.
    pub fn ci_desc(&self, gpu: usize, gi: usize, ci: usize) -> &ComputeInstanceDescription {
        &self.gi_desc(gpu, gi).compute_instances[self.gpus[gpu].instances[gi].compute[ci].desc]
    }

    /// NVML index of the visible GPU at description position `desc`.
    pub fn gpu_by_desc(&self, desc: usize) -> Option<usize> {
        self.gpus.iter().position(|g| g.desc == desc)
    }

    /// The visible GPU or MIG device with this UUID (compared case-insensitively, as NVML does).
    pub fn find_uuid(&self, uuid: &str) -> Option<Object> {
        for (gpu, g) in self.gpus.iter().enumerate() {
            if self.gpu_desc(gpu).uuid.eq_ignore_ascii_case(uuid) {
                return Some(Object::Gpu { gpu });
            }
            for (mig, m) in g.mig_devices.iter().enumerate() {
                if self.ci_desc(gpu, m.gi, m.ci).uuid.eq_ignore_ascii_case(uuid) {
                    return Some(Object::Mig { gpu, mig });
                }
            }
        }
        None
    }

    /// The `NVML_TOPOLOGY_*` level between two visible GPUs.
    pub fn common_ancestor(&self, a: usize, b: usize) -> u32 {
        topology_level(self.gpu_desc(a), self.gpu_desc(b), a == b)
    }
}

/// The closest common PCIe ancestor of two GPUs, as `nvmlDeviceGetTopologyCommonAncestor` reports it.
///
/// GPUs sharing a PCIe switch are `SINGLE`. Otherwise GPUs on one NUMA node are `NODE`, not
/// `HOSTBRIDGE`: HGX boards hang each switch off its own CPU root port, so two GPUs on one socket
/// meet only at the socket's interconnect between host bridges, which is how `nvidia-smi topo -m`
/// shows them on DGX/HGX A100 and H100 (`NODE` within a socket, `SYS` across). Different NUMA nodes
/// are `SYSTEM`. A platform without NUMA (both nodes absent) counts as one node.
pub fn topology_level(a: &GpuDescription, b: &GpuDescription, same_gpu: bool) -> u32 {
    if same_gpu {
        sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_INTERNAL
    } else if a.pcie_switch.is_some() && a.pcie_switch == b.pcie_switch {
        sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_SINGLE
    } else if a.numa_node == b.numa_node {
        sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE
    } else {
        sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM
    }
}

/// Link numbers per GPU: each `nvlinks` entry, in order, takes the next `links` numbers on both GPUs.
pub fn assign_links(node: &NodeDescription, origin: &Path) -> Result<Vec<Vec<usize>>, DescriptionError> {
    let mut links = vec![Vec::new(); node.gpus.len()];
    for (l, link) in node.nvlinks.iter().enumerate() {
        let [a, b] = link.gpus;
        for (me, peer) in [(a, b), (b, a)] {
            let Some(mine) = links.get_mut(me) else { continue };
            mine.extend(std::iter::repeat_n(peer, link.links as usize));
            if mine.len() > MAX_LINKS {
                return Err(DescriptionError::Invalid {
                    path: origin.to_owned(),
                    field: format!("nvlinks[{l}].links"),
                    message: format!(
                        "GPU {me} would have {} NVLink links; NVML numbers at most {MAX_LINKS} per GPU \
                         (an A100 has 12, an H100 18): lower the link counts of this GPU's pairs",
                        mine.len()
                    ),
                });
            }
        }
    }
    Ok(links)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use nvinject_simnode::presets::preset;

    use super::*;

    /// Device nodes present in a set; everything else absent.
    struct FakeDevFs {
        usable: BTreeSet<PathBuf>,
        dirs: BTreeSet<PathBuf>,
    }

    impl FakeDevFs {
        fn new(root: &str) -> Self {
            FakeDevFs { usable: BTreeSet::new(), dirs: [PathBuf::from(root)].into() }
        }
        fn with_gpus(mut self, minors: &[u32]) -> Self {
            for m in minors {
                self.usable.insert(devfs::gpu_node(Path::new("/r"), *m));
            }
            self
        }
    }

    impl DevFs for FakeDevFs {
        fn usable(&self, path: &Path) -> bool {
            self.usable.contains(path)
        }
        fn is_dir(&self, path: &Path) -> bool {
            self.dirs.contains(path)
        }
    }

    fn build(name: &str, fs: &FakeDevFs) -> Node {
        let mut node = preset(name).unwrap();
        node.dev_root = Some(PathBuf::from("/r"));
        let mut next = 0x1000;
        Node::build(node, Path::new("/x/node.json"), fs, &mut || {
            next += 16;
            next
        })
        .unwrap()
    }

    #[test]
    fn only_openable_gpus_are_enumerated_in_description_order() {
        let node = build("h100x8", &FakeDevFs::new("/r").with_gpus(&[1, 4, 6]));
        let descs: Vec<usize> = node.gpus.iter().map(|g| g.desc).collect();
        assert_eq!(descs, [1, 4, 6]);
        assert_eq!(node.gpu_by_desc(4), Some(1));
        assert_eq!(node.resolve(node.gpus[2].handle), Some(Object::Gpu { gpu: 2 }));
        assert_eq!(node.resolve(12345), None);
    }

    #[test]
    fn missing_dev_root_falls_back_to_slash() {
        let mut fs = FakeDevFs::new("/elsewhere");
        fs.usable.insert(PathBuf::from("/dev/nvidia0"));
        let node = build("single", &fs);
        assert_eq!(node.dev_root, Path::new("/"));
        assert_eq!(node.gpus.len(), 1);
    }

    #[test]
    fn mig_devices_follow_the_description_without_caps_dir() {
        let node = build("a100-mig", &FakeDevFs::new("/r").with_gpus(&[0, 1, 2, 3]));
        assert_eq!(node.gpus[0].mig_devices.len(), 4);
        assert_eq!(node.gpus[1].mig_devices.len(), 7);
        assert_eq!(node.gpus[2].mig_devices.len(), 0);
        let m = node.gpus[0].mig_devices[1];
        assert_eq!(node.ci_desc(0, m.gi, m.ci).uuid, "MIG-bfd4953f-e0d8-3ccf-f48a-7a04dc269448");
        assert_eq!(node.gpus[0].instances[0].profile.id, 9);
        assert_eq!(node.resolve(m.handle), Some(Object::Mig { gpu: 0, mig: 1 }));
        assert_eq!(
            node.find_uuid("mig-bfd4953f-e0d8-3ccf-f48a-7a04dc269448"),
            Some(Object::Mig { gpu: 0, mig: 1 })
        );
    }

    #[test]
    fn caps_dir_restricts_mig_devices_to_openable_capabilities() {
        let mut fs = FakeDevFs::new("/r").with_gpus(&[1]);
        fs.dirs.insert(PathBuf::from("/r/dev/nvidia-caps"));
        // GPU 1's instance id 9 (its third) and that instance's compute instance 0.
        for minor in [mig::gpu_instance_access_minor(1, 9), mig::compute_instance_access_minor(1, 9, 0)] {
            fs.usable.insert(devfs::cap_node(Path::new("/r"), minor));
        }
        // GPU instance 10 without its compute instance: the instance shows, no MIG device does.
        fs.usable.insert(devfs::cap_node(Path::new("/r"), mig::gpu_instance_access_minor(1, 10)));
        let node = build("a100-mig", &fs);
        assert_eq!(node.gpus.len(), 1);
        let gpu = &node.gpus[0];
        assert_eq!(gpu.instances.len(), 2);
        assert_eq!(gpu.mig_devices.len(), 1);
        assert_eq!(node.ci_desc(0, 0, 0).uuid, "MIG-06db3909-49a6-863d-bb6e-1b83da9288fd");
    }

    #[test]
    fn links_are_numbered_in_description_order() {
        let node = build("islands", &FakeDevFs::new("/r"));
        assert_eq!(node.links[0], [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]);
        assert_eq!(node.links[4][..4], [5, 5, 5, 5]);
        assert!(node.links[7].iter().all(|&p| (4..7).contains(&p)));
    }

    #[test]
    fn too_many_links_name_the_field() {
        let mut node = preset("islands").unwrap();
        node.nvlinks[2].links = 11;
        let err = assign_links(&node, Path::new("/x/node.json")).unwrap_err().to_string();
        assert!(err.starts_with("/x/node.json: field `nvlinks[2].links`: GPU 0 would have 19"), "{err}");
    }

    #[test]
    fn description_and_nvml_agree_on_the_link_limit() {
        // NodeDescription::validate rejects what assign_links would; both must use NVML's limit.
        assert_eq!(MAX_LINKS, nvinject_simnode::description::MAX_NVLINKS_PER_GPU as usize);
    }

    #[test]
    fn topology_levels() {
        let node = preset("h100x8").unwrap();
        let g = &node.gpus;
        assert_eq!(topology_level(&g[0], &g[0], true), sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_INTERNAL);
        assert_eq!(topology_level(&g[0], &g[1], false), sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_SINGLE);
        assert_eq!(topology_level(&g[0], &g[2], false), sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE);
        assert_eq!(topology_level(&g[0], &g[7], false), sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM);
    }
}
