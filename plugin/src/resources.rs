//! The resource plan: which extended resources the node advertises and which devices each holds.
//!
//! [`plan`] is a pure function of the inventory, the settings and two facts read from the host at
//! start (MIG capability minors, control nodes present). It applies the MIG strategy, then
//! time-slicing, and names every device with the one naming function cdi-gen also uses, so an
//! Allocate answer always names a device the CDI spec has; a device's nodes for DeviceSpecs come
//! from the same owner as the spec's ([`nvinject_gpu::devnodes`]).

use std::collections::{BTreeMap, HashMap};

use nvinject_cdi::{Kind, NameError, QualifiedName};
use nvinject_cdi_gen::qualified_name;
use nvinject_gpu::devnodes::{self, MigMinors};
use nvinject_gpu::{DeviceRef, Gpu, Inventory, MigProfile, NamingStrategy, TopologyLevel};

use crate::resource_name::ResourceName;
use crate::settings::{MigStrategy, ReplicaPolicy, Settings};

/// Separates a device id from its replica number: `GPU-...::2` (NVIDIA's form).
pub const REPLICA_SEPARATOR: &str = "::";

/// Why no plan could be made. Each message names the GPUs involved and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The configured CDI kind, or a device's CDI name under it, breaks CDI's naming rules.
    #[error("invalid CDI name: {0}")]
    CdiName(#[from] NameError),
    /// `single` needs every GPU in MIG mode.
    #[error(
        "mig-strategy single needs every GPU in MIG mode, but GPUs {disabled:?} are not while GPUs {enabled:?} \
         are: enable MIG on all GPUs, or use --mig-strategy mixed"
    )]
    SingleNeedsAllMig {
        /// GPUs in MIG mode (index and UUID).
        enabled: Vec<String>,
        /// GPUs not in MIG mode.
        disabled: Vec<String>,
    },
    /// `single` needs one MIG profile everywhere.
    #[error(
        "mig-strategy single needs one MIG profile on every GPU, but the node has {profiles:?}: \
         repartition the GPUs with one profile, or use --mig-strategy mixed"
    )]
    SingleNeedsOneProfile {
        /// `<gpu index>: <profile>` for each MIG device.
        profiles: Vec<String>,
    },
    /// A GPU in MIG mode has no MIG devices.
    #[error(
        "GPU {gpu} is in MIG mode but has no MIG devices: create them (nvidia-smi mig -cgi <profiles> -C) or \
         disable MIG on it"
    )]
    MigWithoutDevices {
        /// Index and UUID.
        gpu: String,
    },
    /// DeviceSpecs were asked for and a MIG capability is missing from the driver's table.
    #[error(
        "cannot pass DeviceSpecs for MIG device {device}: capability `{capability}` is not in \
         <proc root>/driver/nvidia-caps/mig-minors; check --proc-root, or turn pass-device-specs off"
    )]
    MigCapabilityMissing {
        /// The MIG device UUID.
        device: String,
        /// The missing capability name.
        capability: String,
    },
    /// Two resources ended up with the same name (a `rename` collides).
    #[error(
        "two resources are named {name}: change sharing.timeSlicing.resources[].rename so replicas and whole \
         devices differ"
    )]
    DuplicateResource {
        /// The name.
        name: String,
    },
    /// `sharing.mps` names a resource whose devices are MIG devices (`migStrategy: single`).
    #[error(
        "sharing.mps: the devices of {name} are MIG devices ({device}, ...), which are not MPS-shared (as in \
         NVIDIA's plugin): use migStrategy none, or sharing.timeSlicing"
    )]
    MpsOnMig {
        /// The resource.
        name: String,
        /// One of its MIG devices.
        device: String,
    },
}

/// The device a kubelet id stands for: a whole GPU or a MIG device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `GPU-...` or `MIG-...`.
    pub uuid: String,
    /// UUID of the physical GPU (XID events name it).
    pub gpu_uuid: String,
    /// NVML index of the physical GPU.
    pub gpu_index: u32,
    /// MIG placement, for a MIG device.
    pub mig: Option<MigTarget>,
    /// Index name (`0`, `0:1`), for `device-id-strategy index`.
    pub index_name: String,
    /// Qualified CDI name, `nvidia.com/gpu=GPU-...` (uuid naming, as the contract says).
    pub cdi_name: QualifiedName,
    /// NUMA node of the physical GPU.
    pub numa_node: Option<u32>,
    /// Device nodes specific to this device (container paths); empty when DeviceSpecs are off.
    pub device_nodes: Vec<String>,
}

/// Where a MIG device sits in its GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigTarget {
    /// GPU instance id.
    pub gpu_instance_id: u32,
    /// Compute instance id.
    pub compute_instance_id: u32,
    /// Profile (`1g.10gb`): names the resource, shapes the node labels.
    pub profile: MigProfile,
}

/// One device as the kubelet sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdvertisedDevice {
    /// The kubelet's id: the UUID, or `<uuid>::<n>` for a replica.
    pub id: String,
    /// Index into [`Resource::targets`].
    pub target: usize,
    /// Replica number of a time-sliced device.
    pub replica: Option<u32>,
}

/// How a resource's replicas share their device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharingStrategy {
    /// `sharing.timeSlicing`: the containers take turns; nothing else is given.
    TimeSlicing,
    /// `sharing.mps`: the containers are clients of the node's MPS control daemon, and each gets
    /// the spec's MPS device (the daemon's pipe folder) with its GPU.
    Mps,
}

impl SharingStrategy {
    /// The config section that sets it up.
    pub fn config_key(self) -> &'static str {
        match self {
            SharingStrategy::TimeSlicing => "sharing.timeSlicing",
            SharingStrategy::Mps => "sharing.mps",
        }
    }

    /// The value of NVIDIA's `nvidia.com/gpu.sharing-strategy` label.
    pub fn label(self) -> &'static str {
        match self {
            SharingStrategy::TimeSlicing => "time-slicing",
            SharingStrategy::Mps => "mps",
        }
    }
}

/// Replicas (time-slicing or MPS) applied to a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sharing {
    /// Time-slicing or MPS.
    pub strategy: SharingStrategy,
    /// Replicas per device.
    pub replicas: u32,
    /// Refuse containers asking for more than one.
    pub fail_requests_greater_than_one: bool,
    /// Preferred-allocation policy.
    pub policy: ReplicaPolicy,
}

/// One extended resource, served by one plugin socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// `nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`, `nvidia.com/gpu.shared`, ...
    pub name: ResourceName,
    /// The distinct devices behind the resource.
    pub targets: Vec<Target>,
    /// What the kubelet is told, in a stable order.
    pub devices: Vec<AdvertisedDevice>,
    /// Set when the devices are time-sliced replicas.
    pub sharing: Option<Sharing>,
    by_id: HashMap<String, usize>,
}

impl Resource {
    fn new(name: ResourceName, targets: Vec<Target>, sharing: Option<Sharing>) -> Self {
        let devices: Vec<AdvertisedDevice> = match &sharing {
            None => targets
                .iter()
                .enumerate()
                .map(|(i, t)| AdvertisedDevice { id: t.uuid.clone(), target: i, replica: None })
                .collect(),
            Some(s) => targets
                .iter()
                .enumerate()
                .flat_map(|(i, t)| {
                    (0..s.replicas).map(move |r| AdvertisedDevice {
                        id: format!("{}{REPLICA_SEPARATOR}{r}", t.uuid),
                        target: i,
                        replica: Some(r),
                    })
                })
                .collect(),
        };
        let by_id = devices.iter().enumerate().map(|(i, d)| (d.id.clone(), i)).collect();
        Resource { name, targets, devices, sharing, by_id }
    }

    /// The advertised device with kubelet id `id`.
    pub fn device(&self, id: &str) -> Option<&AdvertisedDevice> {
        self.by_id.get(id).map(|i| &self.devices[*i])
    }

    /// The target behind an advertised device.
    pub fn target_of(&self, device: &AdvertisedDevice) -> &Target {
        &self.targets[device.target]
    }

    /// The socket file name this resource is served on: `nvinject-<short name>.sock`.
    pub fn socket_name(&self) -> String {
        format!("nvinject-{}.sock", self.name.short())
    }
}

/// NVLink and PCIe distances between GPUs, by NVML index.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Topology {
    n: usize,
    links: Vec<u32>,
    level: Vec<u8>,
}

impl Topology {
    /// Builds the matrices from the inventory; pairs NVML could not place count as `System`.
    pub fn from_inventory(inv: &Inventory) -> Self {
        let n = inv.gpus.iter().map(|g| g.index as usize + 1).max().unwrap_or(0);
        let mut t =
            Topology { n, links: vec![0; n * n], level: vec![level_rank(TopologyLevel::System); n * n] };
        for a in &inv.gpus {
            for b in &inv.gpus {
                let (i, j) = (a.index as usize, b.index as usize);
                // Count both directions and keep the larger, in case one side's report is partial.
                let links = inv.nvlinks_between(a.index, b.index).max(inv.nvlinks_between(b.index, a.index));
                t.links[i * n + j] = links as u32;
                let level = inv.topology_level(a.index, b.index).unwrap_or(TopologyLevel::System);
                t.level[i * n + j] = level_rank(level);
            }
        }
        t
    }

    /// NVLink links between GPUs `a` and `b`.
    pub fn links(&self, a: u32, b: u32) -> u32 {
        self.at(&self.links, a, b).unwrap_or(0)
    }

    /// PCIe distance rank between GPUs `a` and `b`: 0 (same board) to 5 (across NUMA nodes).
    pub fn distance(&self, a: u32, b: u32) -> u8 {
        self.at(&self.level, a, b).unwrap_or(level_rank(TopologyLevel::System))
    }

    fn at<T: Copy>(&self, m: &[T], a: u32, b: u32) -> Option<T> {
        let (a, b) = (a as usize, b as usize);
        (a < self.n && b < self.n).then(|| m[a * self.n + b])
    }
}

fn level_rank(l: TopologyLevel) -> u8 {
    match l {
        TopologyLevel::Internal => 0,
        TopologyLevel::Single => 1,
        TopologyLevel::Multiple => 2,
        TopologyLevel::HostBridge => 3,
        TopologyLevel::Node => 4,
        TopologyLevel::System => 5,
    }
}

/// Facts read from the host once at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// The driver's MIG capability minors, when readable.
    pub mig_minors: Option<MigMinors>,
    /// Control nodes that exist under the dev root (container paths), in [`devnodes::CONTROL_NODES`]
    /// order.
    pub control_nodes: Vec<String>,
}

/// Everything the plugin serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Resources with at least one device, by name.
    pub resources: Vec<Resource>,
    /// GPU distances for preferred allocation.
    pub topology: Topology,
    /// Control nodes for DeviceSpecs.
    pub control_nodes: Vec<String>,
    /// Things an operator should know that do not stop the plugin.
    pub warnings: Vec<String>,
}

fn gpu_label(g: &Gpu) -> String {
    format!("{} ({})", g.index, g.uuid)
}

/// Builds the plan. Pure: same inputs, same plan.
pub fn plan(inv: &Inventory, settings: &Settings, facts: &HostFacts) -> Result<Plan, PlanError> {
    let mut warnings = Vec::new();
    let want_nodes = settings.pass_device_specs;
    let kind: &Kind = &settings.cdi_kind;
    let make = |d: DeviceRef<'_>| -> Result<Target, PlanError> { target(d, kind, want_nodes, facts) };
    let gpu_resource = ResourceName::parse("gpu").expect("constant is valid");

    let mut groups: BTreeMap<ResourceName, Vec<Target>> = BTreeMap::new();
    let mig_enabled = |g: &Gpu| g.mig_enabled == Some(true);
    let strategy = match settings.mig_strategy {
        MigStrategy::Single if !inv.gpus.iter().any(mig_enabled) => {
            warnings.push("mig-strategy single: no GPU is in MIG mode, advertising whole GPUs".to_owned());
            MigStrategy::None
        }
        s => s,
    };
    match strategy {
        MigStrategy::None => {
            for g in &inv.gpus {
                if mig_enabled(g) {
                    // The CDI spec has no whole-GPU device for a GPU in MIG mode (CUDA could not
                    // use it anyway), so advertising it would hand out a name that does not exist.
                    warnings.push(format!(
                        "GPU {} is in MIG mode: not advertised with mig-strategy none; use --mig-strategy \
                         mixed (or single) to advertise its MIG devices",
                        gpu_label(g)
                    ));
                    continue;
                }
                groups.entry(gpu_resource.clone()).or_default().push(make(DeviceRef::Gpu(g))?);
            }
        }
        MigStrategy::Single => {
            let (enabled, disabled): (Vec<&Gpu>, Vec<&Gpu>) = inv.gpus.iter().partition(|g| mig_enabled(g));
            if !disabled.is_empty() {
                return Err(PlanError::SingleNeedsAllMig {
                    enabled: enabled.iter().map(|g| gpu_label(g)).collect(),
                    disabled: disabled.iter().map(|g| gpu_label(g)).collect(),
                });
            }
            if let Some(g) = enabled.iter().find(|g| g.mig_devices.is_empty()) {
                return Err(PlanError::MigWithoutDevices { gpu: gpu_label(g) });
            }
            let mut profiles: Vec<String> = Vec::new();
            for g in &enabled {
                for m in &g.mig_devices {
                    profiles.push(format!("{}: {}", g.index, m.profile.name()));
                }
            }
            let first = enabled[0].mig_devices[0].profile.name();
            if enabled.iter().flat_map(|g| &g.mig_devices).any(|m| m.profile.name() != first) {
                profiles.dedup();
                return Err(PlanError::SingleNeedsOneProfile { profiles });
            }
            for g in &enabled {
                for m in &g.mig_devices {
                    groups.entry(gpu_resource.clone()).or_default().push(make(DeviceRef::Mig(g, m))?);
                }
            }
        }
        MigStrategy::Mixed => {
            for g in &inv.gpus {
                if !mig_enabled(g) {
                    groups.entry(gpu_resource.clone()).or_default().push(make(DeviceRef::Gpu(g))?);
                    continue;
                }
                if g.mig_devices.is_empty() {
                    warnings.push(format!(
                        "GPU {} is in MIG mode without MIG devices: it is not advertised until MIG devices \
                         exist and the plugin restarts",
                        gpu_label(g)
                    ));
                }
                for m in &g.mig_devices {
                    let name = ResourceName::parse(&format!("mig-{}", m.profile.name()))
                        .expect("profile names are valid resource names");
                    groups.entry(name).or_default().push(make(DeviceRef::Mig(g, m))?);
                }
            }
        }
    }

    let mut resources: Vec<Resource> = Vec::new();
    // The config never sets both (refused where it is resolved).
    let replicated = [
        (SharingStrategy::TimeSlicing, "sharing.timeSlicing", &settings.time_slicing),
        (SharingStrategy::Mps, "sharing.mps", &settings.mps),
    ];
    for (strategy, key, ts) in replicated {
        let Some(ts) = ts else { continue };
        for r in &ts.resources {
            match groups.remove(&r.name) {
                None => warnings
                    .push(format!("{key}: this node has no `{}` resource, nothing to replicate", r.name)),
                Some(targets) => {
                    if strategy == SharingStrategy::Mps
                        && let Some(t) = targets.iter().find(|t| t.mig.is_some())
                    {
                        return Err(PlanError::MpsOnMig { name: r.name.to_string(), device: t.uuid.clone() });
                    }
                    let sharing = Sharing {
                        strategy,
                        replicas: r.replicas,
                        fail_requests_greater_than_one: ts.fail_requests_greater_than_one,
                        policy: ts.policy,
                    };
                    resources.push(Resource::new(r.advertised_as.clone(), targets, Some(sharing)));
                }
            }
        }
    }
    for (name, targets) in groups {
        resources.push(Resource::new(name, targets, None));
    }
    resources.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = resources.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(PlanError::DuplicateResource { name: w[0].name.to_string() });
    }
    Ok(Plan {
        resources,
        topology: Topology::from_inventory(inv),
        control_nodes: facts.control_nodes.clone(),
        warnings,
    })
}

fn target(d: DeviceRef<'_>, kind: &Kind, want_nodes: bool, facts: &HostFacts) -> Result<Target, PlanError> {
    let g = d.gpu();
    let device_nodes = if want_nodes {
        let empty = MigMinors::default();
        let minors = facts.mig_minors.as_ref().unwrap_or(&empty);
        let nodes = devnodes::device_nodes(d, minors).map_err(|missing| PlanError::MigCapabilityMissing {
            device: d.uuid().to_owned(),
            capability: missing.0.to_string(),
        })?;
        nodes.into_iter().map(|n| n.path.into_owned()).collect()
    } else {
        vec![]
    };
    let mig = match d {
        DeviceRef::Gpu(_) => None,
        DeviceRef::Mig(_, m) => Some(MigTarget {
            gpu_instance_id: m.gpu_instance_id,
            compute_instance_id: m.compute_instance_id,
            profile: m.profile.clone(),
        }),
    };
    Ok(Target {
        uuid: d.uuid().to_owned(),
        gpu_uuid: g.uuid.to_string(),
        gpu_index: g.index,
        mig,
        index_name: d.name(NamingStrategy::Index),
        cdi_name: qualified_name(kind, d, NamingStrategy::Uuid)?,
        numa_node: g.numa_node,
        device_nodes,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::{Defaults, Overrides, resolve};
    use crate::settings::{ReplicatedResource, TimeSlicing};
    use nvinject_gpu::*;

    pub(crate) fn gpu(index: u32, numa: u32, mig: &[(u32, u32, &str)]) -> Gpu {
        let mig_devices = mig
            .iter()
            .enumerate()
            .map(|(i, (gi, ci, size))| {
                let (slices, mb) = match *size {
                    "1g" => (1, 9856),
                    "2g" => (2, 19968),
                    _ => (3, 40192),
                };
                MigDevice {
                    index: i as u32,
                    uuid: DeviceUuid(format!("MIG-{index}{i}000000-0000-0000-0000-000000000000")),
                    gpu_instance_id: *gi,
                    compute_instance_id: *ci,
                    profile: MigProfile::from_attributes(slices, slices, mb, 81920 << 20),
                }
            })
            .collect::<Vec<_>>();
        Gpu {
            index,
            minor: index,
            uuid: DeviceUuid(format!("GPU-{index}0000000-0000-0000-0000-000000000000")),
            name: "NVIDIA A100-SXM4-80GB".into(),
            pci_bus_id: PciBusId::parse(&format!("0000:{:02x}:00.0", 0x10 + index)).unwrap(),
            memory_bytes: 81920 << 20,
            compute_capability: ComputeCapability { major: 8, minor: 0 },
            architecture: "ampere".into(),
            numa_node: Some(numa),
            mig_enabled: Some(!mig.is_empty()),
            mig_devices,
            nvlinks: vec![],
        }
    }

    /// `n` GPUs; `islands` = groups linked all-to-all with 4 links; PCIe switch pairs (0,1), (2,3)...
    pub(crate) fn inventory(gpus: Vec<Gpu>, islands: &[&[u32]]) -> Inventory {
        let mut gpus = gpus;
        let ids: Vec<PciBusId> = gpus.iter().map(|g| g.pci_bus_id.clone()).collect();
        for island in islands {
            for &a in *island {
                for &b in *island {
                    if a != b {
                        for _ in 0..4 {
                            let link = gpus[a as usize].nvlinks.len() as u32;
                            gpus[a as usize].nvlinks.push(NvLink { link, peer: ids[b as usize].clone() });
                        }
                    }
                }
            }
        }
        let mut topology = Vec::new();
        for a in 0..gpus.len() as u32 {
            for b in a + 1..gpus.len() as u32 {
                let level = if a / 2 == b / 2 {
                    TopologyLevel::Single
                } else if gpus[a as usize].numa_node == gpus[b as usize].numa_node {
                    TopologyLevel::Node
                } else {
                    TopologyLevel::System
                };
                topology.push((a, b, level));
            }
        }
        Inventory {
            driver: DriverInfo {
                version: "550.54.15".into(),
                cuda: CudaVersion::from_nvml(12040),
                nvml_version: "12.550.54.15".into(),
            },
            gpus,
            topology,
        }
    }

    pub(crate) fn settings() -> Settings {
        let d = Defaults {
            driver_root: "/".into(),
            proc_root: "/proc".into(),
            kubelet_socket: "/k/kubelet.sock".into(),
            features_file: "/f".into(),
        };
        resolve(&Default::default(), "(none)", &Overrides::default(), &d).unwrap().settings
    }

    /// Time-slicing of `nvidia.com/gpu`: `replicas` per GPU, advertised as `advertised_as`.
    pub(crate) fn gpu_time_slicing(
        advertised_as: &str,
        replicas: u32,
        policy: ReplicaPolicy,
    ) -> Option<TimeSlicing> {
        Some(TimeSlicing {
            fail_requests_greater_than_one: false,
            policy,
            resources: vec![ReplicatedResource {
                name: ResourceName::parse("gpu").unwrap(),
                advertised_as: ResourceName::parse(advertised_as).unwrap(),
                replicas,
            }],
        })
    }

    pub(crate) fn mig_node() -> Inventory {
        inventory(
            vec![
                gpu(0, 0, &[(2, 0, "3g"), (3, 0, "2g"), (9, 0, "1g"), (10, 0, "1g")]),
                gpu(1, 0, &[(7, 0, "1g"), (8, 0, "1g")]),
                gpu(2, 1, &[]),
                gpu(3, 1, &[]),
            ],
            &[&[0, 1, 2, 3]],
        )
    }

    fn names(p: &Plan) -> Vec<(String, usize)> {
        p.resources.iter().map(|r| (r.name.to_string(), r.devices.len())).collect()
    }

    #[test]
    fn none_strategy_advertises_whole_gpus_not_in_mig_mode() {
        let inv = inventory(vec![gpu(0, 0, &[]), gpu(1, 1, &[])], &[]);
        let p = plan(&inv, &settings(), &HostFacts::default()).unwrap();
        assert_eq!(names(&p), vec![("nvidia.com/gpu".to_string(), 2)]);
        let r = &p.resources[0];
        assert_eq!(r.devices[0].id, "GPU-00000000-0000-0000-0000-000000000000");
        assert_eq!(
            r.targets[0].cdi_name.to_string(),
            "nvidia.com/gpu=GPU-00000000-0000-0000-0000-000000000000"
        );
        assert_eq!(r.targets[1].numa_node, Some(1));
        assert_eq!(r.socket_name(), "nvinject-gpu.sock");
        assert!(p.warnings.is_empty());

        let p = plan(&mig_node(), &settings(), &HostFacts::default()).unwrap();
        assert_eq!(names(&p), vec![("nvidia.com/gpu".to_string(), 2)], "GPUs 0 and 1 are in MIG mode");
        assert_eq!(p.resources[0].targets[0].gpu_index, 2);
        assert_eq!(p.warnings.len(), 2);
        assert!(p.warnings[0].contains("--mig-strategy"), "{}", p.warnings[0]);
    }

    #[test]
    fn mixed_strategy_splits_by_profile() {
        let mut s = settings();
        s.mig_strategy = MigStrategy::Mixed;
        let p = plan(&mig_node(), &s, &HostFacts::default()).unwrap();
        assert_eq!(
            names(&p),
            vec![
                ("nvidia.com/gpu".to_string(), 2),
                ("nvidia.com/mig-1g.10gb".to_string(), 4),
                ("nvidia.com/mig-2g.20gb".to_string(), 1),
                ("nvidia.com/mig-3g.40gb".to_string(), 1),
            ]
        );
        let small = &p.resources[1];
        let t = small.target_of(&small.devices[2]);
        assert_eq!(t.index_name, "1:0");
        assert_eq!(t.gpu_uuid, "GPU-10000000-0000-0000-0000-000000000000");
        assert_eq!(t.cdi_name.to_string(), format!("nvidia.com/gpu={}", t.uuid));
        assert_eq!(t.mig.as_ref().unwrap().gpu_instance_id, 7);
        assert_eq!(small.socket_name(), "nvinject-mig-1g.10gb.sock");
    }

    #[test]
    fn single_strategy_needs_uniform_mig() {
        let mut s = settings();
        s.mig_strategy = MigStrategy::Single;
        let e = plan(&mig_node(), &s, &HostFacts::default()).unwrap_err().to_string();
        assert!(e.contains("GPUs [\"2 (GPU-2") && e.contains("--mig-strategy mixed"), "{e}");

        let two_profiles = inventory(vec![gpu(0, 0, &[(1, 0, "1g")]), gpu(1, 0, &[(2, 0, "2g")])], &[]);
        let e = plan(&two_profiles, &s, &HostFacts::default()).unwrap_err().to_string();
        assert!(e.contains("0: 1g.10gb") && e.contains("1: 2g.20gb"), "{e}");

        let uniform =
            inventory(vec![gpu(0, 0, &[(1, 0, "1g"), (2, 0, "1g")]), gpu(1, 0, &[(3, 0, "1g")])], &[]);
        let p = plan(&uniform, &s, &HostFacts::default()).unwrap();
        assert_eq!(names(&p), vec![("nvidia.com/gpu".to_string(), 3)]);
        assert!(p.resources[0].devices[0].id.starts_with("MIG-"));

        let none_in_mig = inventory(vec![gpu(0, 0, &[])], &[]);
        let p = plan(&none_in_mig, &s, &HostFacts::default()).unwrap();
        assert_eq!(names(&p), vec![("nvidia.com/gpu".to_string(), 1)]);
        assert_eq!(p.warnings.len(), 1);
    }

    #[test]
    fn mps_replicates_like_time_slicing_and_is_marked_mps() {
        let inv = inventory(vec![gpu(0, 0, &[]), gpu(1, 1, &[])], &[]);
        let mut s = settings();
        s.mps = gpu_time_slicing("gpu.shared", 3, ReplicaPolicy::Distributed);
        let p = plan(&inv, &s, &HostFacts::default()).unwrap();
        assert_eq!(names(&p), vec![("nvidia.com/gpu.shared".to_string(), 6)]);
        let sharing = p.resources[0].sharing.as_ref().unwrap();
        assert_eq!((sharing.strategy, sharing.replicas), (SharingStrategy::Mps, 3));
        assert_eq!(p.resources[0].devices[4].id, "GPU-10000000-0000-0000-0000-000000000000::1");

        s.time_slicing = s.mps.take();
        let p = plan(&inv, &s, &HostFacts::default()).unwrap();
        assert_eq!(p.resources[0].sharing.as_ref().unwrap().strategy, SharingStrategy::TimeSlicing);
    }

    #[test]
    fn mps_refuses_mig_devices() {
        // migStrategy single makes `nvidia.com/gpu` MIG devices: NVIDIA's plugin refuses MPS there.
        let uniform = inventory(vec![gpu(0, 0, &[(1, 0, "1g"), (2, 0, "1g")])], &[]);
        let mut s = settings();
        s.mig_strategy = MigStrategy::Single;
        s.mps = gpu_time_slicing("gpu", 2, ReplicaPolicy::Distributed);
        let e = plan(&uniform, &s, &HostFacts::default()).unwrap_err();
        assert!(matches!(e, PlanError::MpsOnMig { ref name, .. } if name == "nvidia.com/gpu"), "{e}");
        assert!(e.to_string().contains("migStrategy none"), "{e}");
    }

    #[test]
    fn time_slicing_replicates_and_renames() {
        let mut s = settings();
        s.time_slicing = gpu_time_slicing("gpu.shared", 3, ReplicaPolicy::Distributed);
        let inv = inventory(vec![gpu(0, 0, &[]), gpu(1, 0, &[])], &[]);
        let p = plan(&inv, &s, &HostFacts::default()).unwrap();
        assert_eq!(names(&p), vec![("nvidia.com/gpu.shared".to_string(), 6)]);
        let r = &p.resources[0];
        assert_eq!(r.devices[4].id, "GPU-10000000-0000-0000-0000-000000000000::1");
        assert_eq!(r.device("GPU-10000000-0000-0000-0000-000000000000::1").unwrap().target, 1);
        assert_eq!(r.socket_name(), "nvinject-gpu.shared.sock");
    }

    #[test]
    fn device_nodes_when_device_specs_are_on() {
        let mut s = settings();
        s.mig_strategy = MigStrategy::Mixed;
        s.pass_device_specs = true;
        let e = plan(&mig_node(), &s, &HostFacts::default()).unwrap_err();
        assert!(matches!(e, PlanError::MigCapabilityMissing { .. }), "{e}");
        let mut table = String::new();
        for (gpu, gis) in [(0, vec![2, 3, 9, 10]), (1, vec![7, 8])] {
            for gi in gis {
                table.push_str(&format!("gpu{gpu}/gi{gi}/access {}\n", 100 + gi));
                table.push_str(&format!("gpu{gpu}/gi{gi}/ci0/access {}\n", 200 + gi));
            }
        }
        let facts = HostFacts { mig_minors: Some(MigMinors::parse(&table)), control_nodes: vec![] };
        let p = plan(&mig_node(), &s, &facts).unwrap();
        let big = &p.resources[3];
        assert_eq!(
            big.targets[0].device_nodes,
            vec!["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap102", "/dev/nvidia-caps/nvidia-cap202"]
        );
        assert_eq!(p.resources[0].targets[0].device_nodes, vec!["/dev/nvidia2"]);
    }

    #[test]
    fn topology_matrices() {
        let inv = inventory((0..8).map(|i| gpu(i, i / 4, &[])).collect(), &[&[0, 1, 2, 3], &[4, 5, 6, 7]]);
        let t = Topology::from_inventory(&inv);
        assert_eq!(t.links(0, 3), 4);
        assert_eq!(t.links(3, 4), 0);
        assert_eq!(t.distance(0, 1), 1);
        assert_eq!(t.distance(0, 2), 4);
        assert_eq!(t.distance(0, 7), 5);
        assert_eq!(t.distance(0, 0), 0);
        assert_eq!(t.links(0, 99), 0);
    }
}
