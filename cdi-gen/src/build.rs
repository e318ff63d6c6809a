//! Building the CDI spec: a pure function of what discovery found and the options.
//!
//! Layout of the spec (the same kind of spec `nvidia-ctk cdi generate` writes, so workloads and
//! annotations carry over):
//! - one device per GPU (without MIG) and per MIG device, once per naming strategy: the GPU's
//!   `/dev/nvidia<minor>` and its `/dev/dri` nodes (with a hook recreating the `by-path` links), or
//!   for a MIG device the parent's node plus its GPU-instance and compute-instance capability nodes;
//! - an `all` device with the union of those;
//! - with `--mps-pipe-dir` only, an `mps` device ([`MPS_DEVICE`]): the MPS control daemon's pipe
//!   folder (read-write, `nosuid,nodev,noexec`) and `CUDA_MPS_PIPE_DIRECTORY`, for the containers
//!   the device plugin gives an MPS-shared GPU; never in the common edits;
//! - common edits: `NVIDIA_VISIBLE_DEVICES=void` (so a legacy hook in the image does nothing), the
//!   control nodes, every driver library, utility, firmware file, IPC endpoint and config file as a
//!   read-only bind mount, a hook creating SONAME and development links, and a hook updating the
//!   container's ld cache with the library folders;
//! - annotations recording the driver version, a digest of the inventory and the roots used, so a
//!   stale spec can be detected and regenerated the same way;
//! - the lowest `cdiVersion` that can express the content.
//!
//! Every device node carries type, major, minor, file mode and cgroup permissions, so applying the
//! spec never needs to stat the host.

use std::collections::BTreeMap;

use nvinject_cdi::nvinject::{
    ANNOTATION_DEV_ROOT, ANNOTATION_DRIVER_ROOT, ANNOTATION_DRIVER_VERSION, ANNOTATION_GENERATED_BY,
    ANNOTATION_INVENTORY_DIGEST, CudaCompat, HookCommand, HookInvocation, HookKind, HookLink, MPS_DEVICE,
};
use nvinject_cdi::{
    ContainerEdits, Device, DeviceNode, DeviceType, Hook, Kind, Mount, Spec, minimum_version,
};
use nvinject_gpu::devnodes::{self, CONTROL_NODES, DriverNode, Numbering};
use nvinject_gpu::{DeviceRef, Inventory, NamingStrategy};
use sha2::{Digest, Sha256};

use crate::devices::{DevTree, NodeInfo, NodeType};
use crate::driver::DriverFiles;
use crate::root::join;

/// Name of the device holding every device.
pub const ALL_DEVICE: &str = "all";

/// Mount options of driver files: read-only, no device files or setuid, private.
pub const FILE_MOUNT_OPTIONS: [&str; 5] = ["ro", "nosuid", "nodev", "rbind", "rprivate"];
/// Mount options of IPC endpoints: as files, and nothing there may be executed.
pub const IPC_MOUNT_OPTIONS: [&str; 6] = ["ro", "nosuid", "nodev", "rbind", "rprivate", "noexec"];
/// Mount options of the MPS pipe directory: MPS clients open its pipes for writing (and the
/// daemon's protocol creates files there), so it is writable; still no device files, setuid or
/// executables.
pub const MPS_MOUNT_OPTIONS: [&str; 6] = ["rw", "nosuid", "nodev", "rbind", "rprivate", "noexec"];
/// The variable CUDA's MPS clients read to find the control daemon's pipes.
pub const MPS_PIPE_ENV: &str = "CUDA_MPS_PIPE_DIRECTORY";

/// Cgroup permissions given to every device node.
pub const NODE_PERMISSIONS: &str = "rw";

/// Libraries without which no GPU container works; their absence is an error.
pub const REQUIRED_LIBRARIES: [&str; 2] = ["libcuda", "libnvidia-ml"];

/// Development links made next to libraries when the library is present: (library stem, link
/// name). Programs built against the driver (`-lcuda`) and GLVND's indirect GLX need them.
const DEV_LINKS: [(&str, &str); 4] = [
    ("libcuda", "libcuda.so"),
    ("libnvidia-opticalflow", "libnvidia-opticalflow.so"),
    ("libGLX_nvidia", "libGLX_indirect.so.0"),
    // The Vulkan ICD opens it by this name.
    ("libnvidia-vulkan-producer", "libnvidia-vulkan-producer.so"),
];

/// What the spec lists as devices.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// GPUs and MIG devices as NVML reported them.
    Nvml(&'a Inventory),
    /// No NVML: every NVIDIA device node as one `all` device.
    Management {
        /// Driver version, from the kernel module.
        driver_version: &'a str,
    },
}

/// What the operator chooses about the spec (flags of `nvinject-cdi generate`).
#[derive(Debug, Clone)]
pub struct SpecChoices {
    /// `vendor/class`, normally `nvidia.com/gpu`.
    pub kind: Kind,
    /// Naming strategies; each device appears once per strategy (duplicates ignored).
    pub naming: Vec<NamingStrategy>,
    /// Absolute host path of `nvinject-hook`.
    pub hook_path: String,
    /// Whether to add the `all` device.
    pub all_device: bool,
    /// Only these devices (any name any strategy gives them); `None` for all.
    pub device_ids: Option<Vec<String>>,
    /// Hooks to leave out.
    pub disabled_hooks: Vec<HookKind>,
    /// The OCI `timeout` of each hook run, in seconds; `None`: runc waits for ever.
    pub hook_timeout_secs: Option<u32>,
}

impl SpecChoices {
    /// nvidia-ctk's defaults: kind `nvidia.com/gpu`, index and uuid names, an `all` device,
    /// every device, every hook; and nvinject's hook timeout.
    pub fn new(hook_path: String) -> Self {
        SpecChoices {
            kind: nvinject_cdi::nvinject::default_kind(),
            naming: vec![NamingStrategy::Index, NamingStrategy::Uuid],
            hook_path,
            all_device: true,
            device_ids: None,
            disabled_hooks: Vec::new(),
            hook_timeout_secs: Some(nvinject_cdi::nvinject::DEFAULT_HOOK_TIMEOUT_SECS),
        }
    }
}

/// Everything that shapes the spec: the operator's choices plus what discovery decided.
#[derive(Debug, Clone)]
pub struct SpecOptions {
    /// The operator's choices.
    pub choices: SpecChoices,
    /// The driver root as the host sees it: prefix of every mount's host path.
    pub host_driver_root: String,
    /// The dev root as the host sees it: prefix of every device node's host path.
    pub host_dev_root: String,
    /// Written to the `generated-by` annotation.
    pub generator: String,
    /// The MPS control daemon's pipe directory as the host sees it, when the operator configured
    /// MPS (checked to be a directory by discovery): the [`MPS_DEVICE`] device mounts it writable
    /// at the same path, with [`MPS_PIPE_ENV`] naming it; the common edits never do.
    pub mps_pipe_dir: Option<String>,
}

/// Why a spec cannot be built. Each says what is missing and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// A required library is not in the driver root.
    #[error(
        "driver library {library} not found under driver root {driver_root}: searched {}{}; \
         check --driver-root, or add the library's folder with --library-search-path",
        if searched.is_empty() { "no existing library folder".to_owned() } else { searched.join(", ") },
        if *ld_cache { " and the folders in its etc/ld.so.cache" } else { " (the root has no readable etc/ld.so.cache)" }
    )]
    MissingLibrary {
        /// File name looked for, e.g. `libcuda.so.550.54.15`.
        library: String,
        /// Folders searched, inside the root.
        searched: Vec<String>,
        /// Host driver root.
        driver_root: String,
        /// Whether an ld.so.cache was read.
        ld_cache: bool,
    },
    /// A `--device-ids` entry names no device.
    #[error("--device-ids: no device `{id}` on this node; devices are: {}", known.join(", "))]
    UnknownDeviceId {
        /// The id given.
        id: String,
        /// Index names of the devices there are.
        known: Vec<String>,
    },
    /// A `--device-ids` entry names a GPU in MIG mode.
    #[error("--device-ids: GPU `{id}` is in MIG mode and cannot be given whole; name its MIG devices: {}", mig.join(", "))]
    MigParent {
        /// The id given.
        id: String,
        /// Its MIG devices' index names.
        mig: Vec<String>,
    },
    /// A MIG device's capability minor is missing from `mig-minors`.
    #[error(
        "MIG device {uuid}: no `{entry}` in <proc root>/driver/nvidia-caps/mig-minors; is the nvidia-caps \
         support of the driver loaded, and is --proc-root right?"
    )]
    MigMinor {
        /// The MIG device.
        uuid: String,
        /// The missing line's name, e.g. `gpu0/gi2/access`.
        entry: String,
    },
    /// A capability node is missing and its major is unknown.
    #[error(
        "{path} does not exist and <proc root>/devices lists no nvidia-caps major to describe it; \
         create the nodes (nvidia-modprobe -f -M) or check --dev-root and --proc-root"
    )]
    CapsMajor {
        /// The node's path.
        path: String,
    },
    /// Nothing to put in the spec.
    #[error("{0}")]
    NoDevices(String),
    /// A GPU device already has the MPS device's name.
    #[error(
        "a GPU device of this node is named `{MPS_DEVICE}`, the name of the MPS device --mps-pipe-dir adds; \
         leave out --mps-pipe-dir, or check what NVML reports as the device's UUID"
    )]
    MpsNameTaken,
    /// An option that management mode cannot honour.
    #[error("{0} cannot be used with --mode management, which writes only the `all` device")]
    NotInManagementMode(&'static str),
}

/// A sha256 (hex) over what the spec's devices depend on: the driver version, each GPU's index,
/// minor, UUID and MIG mode, each MIG device's UUID and instance ids.
pub fn inventory_digest(inventory: &Inventory) -> String {
    let mut text = format!("driver {}\n", inventory.driver.version);
    for g in &inventory.gpus {
        text.push_str(&format!("gpu {} {} {} mig={:?}\n", g.index, g.minor, g.uuid, g.mig_enabled));
        for m in &g.mig_devices {
            text.push_str(&format!(
                "mig {}:{} {} gi={} ci={}\n",
                g.index, m.index, m.uuid, m.gpu_instance_id, m.compute_instance_id
            ));
        }
    }
    hex_sha256(text.as_bytes())
}

fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A device's nodes, and its `/dev/dri/by-path` links as (target, link).
type NodesAndLinks = (Vec<DeviceNode>, Vec<(String, String)>);

struct Builder<'a> {
    dev: &'a DevTree,
    opts: &'a SpecOptions,
}

impl Builder<'_> {
    fn host_dev(&self, path: &str) -> Option<String> {
        let host = join(self.opts.host_dev_root.as_ref(), path).to_string_lossy().into_owned();
        (host != path).then_some(host)
    }

    /// The node at `path` as stat saw it, else as `fallback` describes it, else `None`.
    fn node(&self, path: &str, fallback: Option<NodeInfo>) -> Option<DeviceNode> {
        let info = self.dev.nodes.get(path).copied().or(fallback)?;
        Some(DeviceNode {
            path: path.to_owned(),
            host_path: self.host_dev(path),
            device_type: Some(match info.node_type {
                NodeType::Char => DeviceType::Char,
                NodeType::Block => DeviceType::Block,
            }),
            major: Some(i64::from(info.major)),
            minor: Some(i64::from(info.minor)),
            file_mode: Some(info.mode),
            permissions: Some(NODE_PERMISSIONS.to_owned()),
            uid: None,
            gid: None,
        })
    }

    fn char_node(major: u32, minor: u32, mode: u32) -> NodeInfo {
        NodeInfo { node_type: NodeType::Char, major, minor, mode }
    }

    /// The spec's run of `command`, unless that hook is disabled.
    fn hook(&self, command: HookCommand) -> Option<Hook> {
        let kind = command.subcommand().kind().expect("cdi-gen writes only spec hooks");
        if self.opts.choices.disabled_hooks.contains(&kind) {
            return None;
        }
        let argv0 = self.opts.choices.hook_path.rsplit('/').next().unwrap_or(&self.opts.choices.hook_path);
        let run = HookInvocation { argv0: argv0.to_owned(), ..HookInvocation::new(command) };
        Some(Hook {
            hook_name: "createContainer".into(),
            path: self.opts.choices.hook_path.clone(),
            args: run.to_args(),
            // Explicit, so runc never hands the hook the container's environment.
            env: nvinject_cdi::minimal_hook_env(),
            timeout: self.opts.choices.hook_timeout_secs.map(i64::from),
        })
    }

    /// The driver's node as stat saw it, else as the driver numbers it (with the majors of
    /// `<proc root>/devices`), else `None`.
    fn driver_node(&self, node: &DriverNode) -> Option<DeviceNode> {
        let fallback = node
            .numbering
            .numbers(&self.dev.char_majors)
            .map(|(major, minor)| Self::char_node(major, minor, node.mode));
        self.node(&node.path, fallback)
    }

    /// The device's edits and its `/dev/dri/by-path` links (target, link).
    fn device_edits(&self, device: DeviceRef<'_>) -> Result<NodesAndLinks, BuildError> {
        // The GPU's node, and a MIG device's capability nodes: the nodes the plugin names too.
        let driver_nodes = devnodes::device_nodes(device, &self.dev.mig_minors).map_err(|missing| {
            BuildError::MigMinor { uuid: device.uuid().to_owned(), entry: missing.0.to_string() }
        })?;
        let mut nodes = Vec::with_capacity(driver_nodes.len() + 2);
        for node in &driver_nodes {
            // Only a capability node's numbers can be unknown: its major is assigned at load.
            nodes.push(
                self.driver_node(node)
                    .ok_or_else(|| BuildError::CapsMajor { path: node.path.to_string() })?,
            );
        }
        let mut links = Vec::new();
        if let DeviceRef::Gpu(g) = device {
            for suffix in ["card", "render"] {
                let link = format!("/dev/dri/by-path/pci-{}-{suffix}", g.pci_bus_id);
                let Some(target) = self.dev.links.get(&link) else { continue };
                let node_path = resolve_dri(&link, target);
                if let Some(node) = self.node(&node_path, None) {
                    nodes.push(node);
                    links.push((target.clone(), link));
                }
            }
        }
        Ok((nodes, links))
    }

    fn control_nodes(&self) -> Vec<DeviceNode> {
        CONTROL_NODES
            .iter()
            .filter_map(|control| {
                let node = self.driver_node(control);
                // nvidia-modeset is there only while its module is loaded: its absence is normal.
                if node.is_none() && control.numbering != Numbering::OnlyWhenPresent {
                    tracing::warn!(
                        path = %control.path,
                        "control device node not found and not numbered in <proc root>/devices; left out"
                    );
                }
                node
            })
            .collect()
    }

    fn common_edits(&self, files: &DriverFiles, driver_version: &str) -> ContainerEdits {
        let root = self.opts.host_driver_root.as_ref();
        let mount = |path: &str, options: &[&str]| Mount {
            host_path: join(root, path).to_string_lossy().into_owned(),
            container_path: path.to_owned(),
            mount_type: None,
            options: options.iter().map(|o| (*o).to_owned()).collect(),
        };
        let mut mounts: Vec<Mount> = Vec::new();
        mounts.extend(files.libraries.iter().map(|l| mount(&l.path, &FILE_MOUNT_OPTIONS)));
        mounts.extend(files.binaries.iter().map(|p| mount(p, &FILE_MOUNT_OPTIONS)));
        mounts.extend(files.firmware.iter().map(|p| mount(p, &FILE_MOUNT_OPTIONS)));
        mounts.extend(files.ipc.iter().map(|i| mount(&i.path, &IPC_MOUNT_OPTIONS)));
        mounts.extend(files.configs.iter().map(|p| Mount {
            container_path: crate::driver::config_container_path(p),
            ..mount(p, &FILE_MOUNT_OPTIONS)
        }));
        mounts.extend(files.xorg.iter().map(|p| mount(p, &FILE_MOUNT_OPTIONS)));
        // The MPS pipe folder is never here: it is the MPS device's (see `mps_device`).
        let env = vec!["NVIDIA_VISIBLE_DEVICES=void".to_owned()];

        let mut links: BTreeMap<String, String> = BTreeMap::new();
        for lib in &files.libraries {
            if let Some(soname) = lib.soname.as_deref().filter(|s| *s != lib.file_name()) {
                links.insert(format!("{}/{soname}", lib.dir()), lib.file_name().to_owned());
            }
        }
        for (stem, link_name) in DEV_LINKS {
            if let Some(lib) = files.library(stem) {
                let target = lib.soname.clone().unwrap_or_else(|| lib.file_name().to_owned());
                links.entry(format!("{}/{link_name}", lib.dir())).or_insert(target);
            }
        }
        for (link, target) in &files.links {
            links.entry(link.clone()).or_insert_with(|| target.clone());
        }
        let mut folders: Vec<String> = files.libraries.iter().map(|l| l.dir().to_owned()).collect();
        folders.sort();
        folders.dedup();

        let links: Vec<HookLink> =
            links.into_iter().map(|(link, target)| HookLink { target, link }).collect();
        let hooks = [
            self.links_hook(links),
            // Between the links and the cache, as nvidia-ctk orders them: the hook decides whether
            // the image's CUDA compat libraries come first, and the cache is built that way.
            (!driver_version.is_empty())
                .then(|| {
                    let compat = CudaCompat {
                        host_driver_version: Some(driver_version.to_owned()),
                        ..Default::default()
                    };
                    self.hook(HookCommand::EnableCudaCompat { compat })
                })
                .flatten(),
            (!folders.is_empty())
                .then(|| self.hook(HookCommand::UpdateLdcache { folders, ldconfig_path: None }))
                .flatten(),
            // Last, as nvidia-ctk orders them; the shim folds every run into one `inject` run.
            self.hook(HookCommand::DisableDeviceNodeModification),
            self.hook(HookCommand::UpdateApplicationProfile),
        ];
        ContainerEdits {
            env,
            device_nodes: self.control_nodes(),
            hooks: hooks.into_iter().flatten().collect(),
            mounts,
            ..Default::default()
        }
    }

    /// The MPS device, when the operator configured MPS: the daemon's pipe folder, read-write at
    /// the same path, and the variable naming it. A device of its own, not common edits, so that
    /// only containers handed it (the GPUs of an MPS-shared resource) can reach the daemon.
    fn mps_device(&self) -> Option<Device> {
        let dir = self.opts.mps_pipe_dir.as_ref()?;
        let mount = Mount {
            host_path: dir.clone(),
            container_path: dir.clone(),
            mount_type: None,
            options: MPS_MOUNT_OPTIONS.iter().map(|o| (*o).to_owned()).collect(),
        };
        Some(Device {
            name: MPS_DEVICE.to_owned(),
            annotations: Default::default(),
            container_edits: ContainerEdits {
                env: vec![format!("{MPS_PIPE_ENV}={dir}")],
                mounts: vec![mount],
                ..Default::default()
            },
        })
    }

    fn edits_with_links(&self, nodes: Vec<DeviceNode>, links: &[(String, String)]) -> ContainerEdits {
        let links =
            links.iter().map(|(target, link)| HookLink { target: target.clone(), link: link.clone() });
        let hook = self.links_hook(links.collect());
        ContainerEdits { device_nodes: nodes, hooks: hook.into_iter().collect(), ..Default::default() }
    }

    /// A create-symlinks run, when there are links.
    fn links_hook(&self, links: Vec<HookLink>) -> Option<Hook> {
        (!links.is_empty()).then(|| self.hook(HookCommand::CreateSymlinks { links })).flatten()
    }
}

/// `/dev/dri/by-path/x` + `../card1` = `/dev/dri/card1`.
fn resolve_dri(link: &str, target: &str) -> String {
    if target.starts_with('/') {
        return target.to_owned();
    }
    let mut parts: Vec<&str> = link.split('/').filter(|p| !p.is_empty()).collect();
    parts.pop();
    for t in target.split('/') {
        match t {
            ".." => {
                parts.pop();
            }
            "." | "" => {}
            t => parts.push(t),
        }
    }
    format!("/{}", parts.join("/"))
}

fn check_libraries(files: &DriverFiles, opts: &SpecOptions) -> Result<(), BuildError> {
    for stem in REQUIRED_LIBRARIES {
        if files.library(stem).is_none() {
            return Err(BuildError::MissingLibrary {
                library: format!("{stem}.so.{}", files.version),
                searched: files.searched.clone(),
                driver_root: opts.host_driver_root.clone(),
                ld_cache: files.ld_cache_read,
            });
        }
    }
    Ok(())
}

fn select<'i>(inventory: &'i Inventory, ids: Option<&[String]>) -> Result<Vec<DeviceRef<'i>>, BuildError> {
    let all: Vec<DeviceRef<'i>> = inventory.devices().collect();
    let Some(ids) = ids else { return Ok(all) };
    let mut wanted = Vec::new();
    for id in ids {
        let found = inventory.find_device(id).ok_or_else(|| BuildError::UnknownDeviceId {
            id: id.clone(),
            known: all.iter().map(|d| d.name(NamingStrategy::Index)).collect(),
        })?;
        if let DeviceRef::Gpu(g) = found
            && g.mig_enabled == Some(true)
        {
            return Err(BuildError::MigParent {
                id: id.clone(),
                mig: g.mig_devices.iter().map(|m| DeviceRef::Mig(g, m).name(NamingStrategy::Index)).collect(),
            });
        }
        wanted.push(found.uuid());
    }
    Ok(all.into_iter().filter(|d| wanted.contains(&d.uuid())).collect())
}

/// Builds the spec. Pure: the same inputs always give the same spec.
pub fn build_spec(
    source: Source<'_>,
    files: &DriverFiles,
    dev: &DevTree,
    opts: &SpecOptions,
) -> Result<Spec, BuildError> {
    check_libraries(files, opts)?;
    let b = Builder { dev, opts };
    let mut devices = Vec::new();
    let mut all_nodes: Vec<DeviceNode> = Vec::new();
    let mut all_links: Vec<(String, String)> = Vec::new();
    let mut add_to_all = |nodes: &[DeviceNode], links: &[(String, String)]| {
        for n in nodes {
            if !all_nodes.iter().any(|a| a.path == n.path) {
                all_nodes.push(n.clone());
            }
        }
        all_links.extend(links.iter().cloned());
    };
    let (driver_version, digest) = match source {
        Source::Nvml(inventory) => {
            let mut naming: Vec<NamingStrategy> = Vec::new();
            for s in &opts.choices.naming {
                if !naming.contains(s) {
                    naming.push(*s);
                }
            }
            for device in select(inventory, opts.choices.device_ids.as_deref())? {
                let (nodes, links) = b.device_edits(device)?;
                for strategy in &naming {
                    devices.push(Device {
                        name: device.name(*strategy),
                        annotations: Default::default(),
                        container_edits: b.edits_with_links(nodes.clone(), &links),
                    });
                }
                add_to_all(&nodes, &links);
            }
            if all_nodes.is_empty() {
                return Err(BuildError::NoDevices(
                    "NVML reports no usable GPU on this node (are the /dev/nvidia* nodes there and accessible?)".into(),
                ));
            }
            (inventory.driver.version.as_str(), inventory_digest(inventory))
        }
        Source::Management { driver_version } => {
            if !opts.choices.all_device {
                return Err(BuildError::NotInManagementMode("--no-all-device"));
            }
            if opts.choices.device_ids.is_some() {
                return Err(BuildError::NotInManagementMode("--device-ids"));
            }
            let nodes: Vec<DeviceNode> = dev
                .nodes
                .keys()
                .filter(|p| p.starts_with("/dev/nvidia") && !devnodes::is_control_node(p))
                .filter_map(|p| b.node(p, None))
                .collect();
            if nodes.is_empty() {
                return Err(BuildError::NoDevices(
                    "no /dev/nvidia* device nodes under the dev root; check --dev-root".into(),
                ));
            }
            let mut text = format!("driver {driver_version}\n");
            for n in &nodes {
                text.push_str(&format!("{} {:?}:{:?}\n", n.path, n.major, n.minor));
            }
            add_to_all(&nodes, &[]);
            (driver_version, hex_sha256(text.as_bytes()))
        }
    };
    if opts.choices.all_device {
        let edits = b.edits_with_links(all_nodes, &all_links);
        devices.push(Device {
            name: ALL_DEVICE.into(),
            annotations: Default::default(),
            container_edits: edits,
        });
    }
    if let Some(mps) = b.mps_device() {
        // No GPU is named `mps` (indices, UUIDs, `gpuN`, `migN:M`, `all`); refused, not
        // shadowed, should NVML ever report such a UUID.
        if devices.iter().any(|d| d.name == mps.name) {
            return Err(BuildError::MpsNameTaken);
        }
        devices.push(mps);
    }
    let annotations = [
        (ANNOTATION_DRIVER_VERSION, driver_version.to_owned()),
        (ANNOTATION_INVENTORY_DIGEST, digest),
        (ANNOTATION_GENERATED_BY, opts.generator.clone()),
        (ANNOTATION_DRIVER_ROOT, opts.host_driver_root.clone()),
        (ANNOTATION_DEV_ROOT, opts.host_dev_root.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: opts.choices.kind.clone(),
        annotations,
        devices,
        container_edits: b.common_edits(files, driver_version),
    };
    spec.cdi_version = minimum_version(&spec).to_string();
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{Ipc, IpcKind, Library};
    use nvinject_cdi::validate;
    use nvinject_gpu::{
        ComputeCapability, CudaVersion, DeviceUuid, DriverInfo, Gpu, MigCap, MigDevice, MigMinors,
        MigProfile, PciBusId,
    };

    const VER: &str = "550.54.15";
    const LIB: &str = "/usr/lib/x86_64-linux-gnu";

    fn gpu(index: u32, minor: u32, mig: Vec<MigDevice>) -> Gpu {
        Gpu {
            index,
            minor,
            uuid: DeviceUuid(format!("GPU-{index}{index}{index}{index}0000-1111-2222-3333-444444444444")),
            name: "NVIDIA A100-SXM4-80GB".into(),
            pci_bus_id: PciBusId::parse(&format!("0000:{:02x}:00.0", 0x18 + index)).unwrap(),
            memory_bytes: 80 << 30,
            compute_capability: ComputeCapability { major: 8, minor: 0 },
            architecture: "ampere".into(),
            numa_node: Some(0),
            mig_enabled: Some(!mig.is_empty()),
            mig_devices: mig,
            nvlinks: vec![],
        }
    }

    fn mig(index: u32, gi: u32) -> MigDevice {
        MigDevice {
            index,
            uuid: DeviceUuid(format!("MIG-{index}{gi}000000-1111-2222-3333-444444444444")),
            gpu_instance_id: gi,
            compute_instance_id: 0,
            profile: MigProfile::from_attributes(3, 3, 40192, 81920 << 20),
        }
    }

    /// GPU 0 whole (minor 0, with DRM nodes), GPU 1 in MIG mode with two MIG devices (minor 1).
    fn inventory() -> Inventory {
        Inventory {
            driver: DriverInfo {
                version: VER.into(),
                cuda: CudaVersion::from_nvml(12040),
                nvml_version: "12.550.54.15".into(),
            },
            gpus: vec![gpu(0, 0, vec![]), gpu(1, 1, vec![mig(0, 2), mig(1, 9)])],
            topology: vec![],
        }
    }

    fn lib(name: &str, soname: Option<&str>) -> Library {
        Library { path: format!("{LIB}/{name}"), soname: soname.map(Into::into) }
    }

    fn files() -> DriverFiles {
        DriverFiles {
            version: VER.into(),
            libraries: vec![
                lib("libGLX_nvidia.so.550.54.15", Some("libGLX_nvidia.so.0")),
                lib("libcuda.so.550.54.15", Some("libcuda.so.1")),
                lib("libnvidia-glcore.so.550.54.15", Some("libnvidia-glcore.so.550.54.15")),
                lib("libnvidia-ml.so.550.54.15", Some("libnvidia-ml.so.1")),
                Library { path: "/usr/lib64/extra/libnvidia-tls.so.550.54.15".into(), soname: None },
            ],
            binaries: vec!["/usr/bin/nvidia-smi".into()],
            firmware: vec![format!("/lib/firmware/nvidia/{VER}/gsp_ga10x.bin")],
            ipc: vec![Ipc { path: "/run/nvidia-persistenced/socket".into(), kind: IpcKind::Socket }],
            configs: vec!["/etc/OpenCL/vendors/nvidia.icd".into()],
            xorg: vec![],
            links: vec![],
            searched: vec![LIB.into()],
            ld_cache_read: true,
        }
    }

    fn char(major: u32, minor: u32, mode: u32) -> NodeInfo {
        NodeInfo { node_type: NodeType::Char, major, minor, mode }
    }

    fn dev() -> DevTree {
        let mut t = DevTree::default();
        for (path, info) in [
            ("/dev/nvidia0", char(195, 0, 0o666)),
            ("/dev/nvidia1", char(195, 1, 0o666)),
            ("/dev/nvidiactl", char(195, 255, 0o666)),
            ("/dev/nvidia-uvm", char(510, 0, 0o666)),
            ("/dev/nvidia-caps/nvidia-cap21", char(235, 21, 0o444)),
            ("/dev/nvidia-caps/nvidia-cap22", char(235, 22, 0o444)),
            ("/dev/dri/card1", char(226, 1, 0o660)),
            ("/dev/dri/renderD129", char(226, 129, 0o666)),
        ] {
            t.nodes.insert(path.into(), info);
        }
        t.links.insert("/dev/dri/by-path/pci-0000:18:00.0-card".into(), "../card1".into());
        t.links.insert("/dev/dri/by-path/pci-0000:18:00.0-render".into(), "../renderD129".into());
        t.char_majors = [("nvidia-uvm".to_owned(), 510), ("nvidia-caps".to_owned(), 235)].into();
        // GI 2's nodes exist; GI 9's are not created yet and get numbered from mig-minors and
        // proc/devices.
        t.mig_minors = MigMinors::parse(
            "gpu1/gi2/access 21\ngpu1/gi2/ci0/access 22\ngpu1/gi9/access 210\ngpu1/gi9/ci0/access 211\n",
        );
        t
    }

    fn opts() -> SpecOptions {
        SpecOptions {
            choices: SpecChoices::new(nvinject_cdi::nvinject::DEFAULT_HOOK_PATH.into()),
            host_driver_root: "/".into(),
            host_dev_root: "/".into(),
            generator: "nvinject-cdi test".into(),
            mps_pipe_dir: None,
        }
    }

    fn names(spec: &Spec) -> Vec<&str> {
        spec.devices.iter().map(|d| d.name.as_str()).collect()
    }

    fn node_paths(edits: &ContainerEdits) -> Vec<&str> {
        edits.device_nodes.iter().map(|n| n.path.as_str()).collect()
    }

    #[test]
    fn devices_are_named_by_every_strategy_with_an_all_device() {
        let spec = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &opts()).unwrap();
        assert_eq!(
            names(&spec),
            [
                "0",
                "GPU-00000000-1111-2222-3333-444444444444",
                "1:0",
                "MIG-02000000-1111-2222-3333-444444444444",
                "1:1",
                "MIG-19000000-1111-2222-3333-444444444444",
                "all"
            ]
        );
        assert_eq!(validate(&spec), vec![]);
        assert_eq!(spec.cdi_version, "0.6.0", "annotations need 0.6.0");

        let mut o = opts();
        o.choices.naming = vec![NamingStrategy::TypeIndex, NamingStrategy::TypeIndex];
        o.choices.all_device = false;
        let spec = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &o).unwrap();
        assert_eq!(names(&spec), ["gpu0", "mig1:0", "mig1:1"]);
    }

    #[test]
    fn a_gpu_gets_its_node_and_drm_nodes_with_by_path_links() {
        let spec = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &opts()).unwrap();
        let gpu0 = &spec.device("0").unwrap().container_edits;
        assert_eq!(node_paths(gpu0), ["/dev/nvidia0", "/dev/dri/card1", "/dev/dri/renderD129"]);
        let n = &gpu0.device_nodes[1];
        assert_eq!(
            (
                n.device_type.map(DeviceType::as_str),
                n.major,
                n.minor,
                n.file_mode,
                n.permissions.as_deref(),
                &n.host_path
            ),
            (Some("c"), Some(226), Some(1), Some(0o660), Some("rw"), &None)
        );
        assert_eq!(
            gpu0.hooks[0].args,
            [
                "nvinject-hook",
                "create-symlinks",
                "--link",
                "../card1::/dev/dri/by-path/pci-0000:18:00.0-card",
                "--link",
                "../renderD129::/dev/dri/by-path/pci-0000:18:00.0-render"
            ]
        );
    }

    #[test]
    fn a_mig_device_gets_its_parent_and_capability_nodes() {
        let spec = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &opts()).unwrap();
        let m0 = &spec.device("1:0").unwrap().container_edits;
        assert_eq!(
            node_paths(m0),
            ["/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"]
        );
        assert!(m0.hooks.is_empty());
        // Nodes not created yet are numbered from mig-minors and the caps major.
        let m1 = &spec.device("1:1").unwrap().container_edits;
        let cap = &m1.device_nodes[2];
        assert_eq!(
            (cap.path.as_str(), cap.major, cap.minor, cap.file_mode),
            ("/dev/nvidia-caps/nvidia-cap211", Some(235), Some(211), Some(0o444))
        );
        // The MIG-enabled GPU itself is not a device; `all` holds every node once.
        assert!(spec.device("1").is_none());
        let all = &spec.device("all").unwrap().container_edits;
        assert_eq!(
            node_paths(all),
            [
                "/dev/nvidia0",
                "/dev/dri/card1",
                "/dev/dri/renderD129",
                "/dev/nvidia1",
                "/dev/nvidia-caps/nvidia-cap21",
                "/dev/nvidia-caps/nvidia-cap22",
                "/dev/nvidia-caps/nvidia-cap210",
                "/dev/nvidia-caps/nvidia-cap211"
            ]
        );
    }

    #[test]
    fn common_edits_carry_control_nodes_files_and_hooks() {
        let spec = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &opts()).unwrap();
        let c = &spec.container_edits;
        assert_eq!(c.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
        // uvm-tools is numbered from proc/devices; modeset is absent and not invented.
        assert_eq!(node_paths(c), ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]);
        assert_eq!((c.device_nodes[2].major, c.device_nodes[2].minor), (Some(510), Some(1)));
        let mounts: Vec<(&str, &str, usize)> = c
            .mounts
            .iter()
            .map(|m| (m.host_path.as_str(), m.container_path.as_str(), m.options.len()))
            .collect();
        assert_eq!(mounts.len(), 9);
        assert_eq!(
            mounts[1],
            (
                "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
                5
            )
        );
        assert_eq!(mounts[7].1, "/run/nvidia-persistenced/socket");
        assert_eq!(c.mounts[7].options.last().map(String::as_str), Some("noexec"));
        assert_eq!(c.mounts[0].options, FILE_MOUNT_OPTIONS);
        assert_eq!(
            c.hooks[0].args,
            [
                "nvinject-hook",
                "create-symlinks",
                "--link",
                "libGLX_nvidia.so.0::/usr/lib/x86_64-linux-gnu/libGLX_indirect.so.0",
                "--link",
                "libGLX_nvidia.so.550.54.15::/usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.0",
                "--link",
                "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
                "--link",
                "libcuda.so.550.54.15::/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "--link",
                "libnvidia-ml.so.550.54.15::/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            ]
        );
        assert_eq!(
            c.hooks[1].args,
            ["nvinject-hook", "enable-cuda-compat", "--host-driver-version=550.54.15"]
        );
        assert_eq!(
            c.hooks[2].args,
            [
                "nvinject-hook",
                "update-ldcache",
                "--folder",
                "/usr/lib/x86_64-linux-gnu",
                "--folder",
                "/usr/lib64/extra"
            ]
        );
        assert!(
            c.hooks.iter().all(
                |h| h.hook_name == "createContainer" && h.path == "/usr/local/nvinject/bin/nvinject-hook"
            )
        );
        assert_eq!(spec.annotations[ANNOTATION_DRIVER_VERSION], VER);
        assert_eq!(spec.annotations[ANNOTATION_INVENTORY_DIGEST], inventory_digest(&inventory()));
        assert_eq!(spec.annotations[ANNOTATION_GENERATED_BY], "nvinject-cdi test");
    }

    /// Every mount and env of the spec, common and per device, naming the MPS folder.
    fn mps_edits<'s>(edits: &'s ContainerEdits, dir: &str) -> (Vec<&'s Mount>, Vec<&'s String>) {
        let mounts = edits.mounts.iter().filter(|m| m.host_path == dir || m.container_path == dir).collect();
        let env = edits.env.iter().filter(|e| e.starts_with("CUDA_MPS")).collect();
        (mounts, env)
    }

    #[test]
    fn mps_is_its_own_device_and_never_in_the_common_edits() {
        let spec = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &opts()).unwrap();
        let c = &spec.container_edits;
        // Not configured: no writable mount at all, no MPS device.
        assert!(c.mounts.iter().all(|m| m.options.iter().any(|o| o == "ro")), "{:?}", c.mounts);
        assert!(!c.env.iter().any(|e| e.starts_with("CUDA_MPS")), "{:?}", c.env);
        assert!(!names(&spec).contains(&"mps"), "{:?}", names(&spec));
        let without = spec;

        let mut o = opts();
        o.mps_pipe_dir = Some("/run/nvidia/mps".into());
        let spec = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &o).unwrap();
        // The common edits, which every GPU container gets, are exactly those without MPS.
        assert_eq!(spec.container_edits, without.container_edits);
        assert_eq!(mps_edits(&spec.container_edits, "/run/nvidia/mps"), (vec![], vec![]));
        // Only the last device, `mps`, holds the folder; the GPU and `all` devices are unchanged.
        let (last, gpus) = spec.devices.split_last().unwrap();
        assert_eq!(gpus, &without.devices[..]);
        assert_eq!(last.name, "mps");
        assert_eq!(last.name, MPS_DEVICE);
        for d in gpus {
            assert_eq!(mps_edits(&d.container_edits, "/run/nvidia/mps"), (vec![], vec![]), "{}", d.name);
        }
        let e = &last.container_edits;
        assert_eq!(e.mounts.len(), 1);
        assert_eq!(e.mounts[0].host_path, "/run/nvidia/mps");
        assert_eq!(e.mounts[0].container_path, "/run/nvidia/mps");
        assert_eq!(e.mounts[0].options, ["rw", "nosuid", "nodev", "rbind", "rprivate", "noexec"]);
        assert_eq!(e.env, ["CUDA_MPS_PIPE_DIRECTORY=/run/nvidia/mps"]);
        assert!(e.device_nodes.is_empty() && e.hooks.is_empty());
        // A host path, not one inside the driver root.
        o.host_driver_root = "/run/nvidia/driver".into();
        let spec = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &o).unwrap();
        let mps = spec.devices.iter().find(|d| d.name == "mps").unwrap();
        assert_eq!(mps.container_edits.mounts[0].host_path, "/run/nvidia/mps");
        assert_eq!(validate(&spec), vec![]);
        // Management mode (an `all` device only) gets it too, still not in the common edits.
        let spec = build_spec(Source::Management { driver_version: VER }, &files(), &dev(), &o).unwrap();
        assert_eq!(names(&spec), ["all", "mps"]);
        assert_eq!(mps_edits(&spec.container_edits, "/run/nvidia/mps"), (vec![], vec![]));
    }

    #[test]
    fn no_gpu_name_is_the_mps_device_s() {
        // Every strategy's name of every device, MIG included, and `all`: none is `mps`.
        let mut o = opts();
        o.choices.naming = NamingStrategy::ALL.to_vec();
        o.mps_pipe_dir = Some("/run/nvidia/mps".into());
        let spec = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &o).unwrap();
        assert_eq!(names(&spec).iter().filter(|n| **n == MPS_DEVICE).count(), 1, "{:?}", names(&spec));
        // A UUID NVML reports as `mps` is refused, not shadowed.
        let mut inv = inventory();
        inv.gpus[0].uuid = DeviceUuid(MPS_DEVICE.into());
        let e = build_spec(Source::Nvml(&inv), &files(), &dev(), &o).unwrap_err();
        assert_eq!(e, BuildError::MpsNameTaken);
        assert!(e.to_string().contains("--mps-pipe-dir"), "{e}");
    }

    #[test]
    fn display_pieces_are_mounted_and_linked_and_vulkan_goes_under_etc() {
        let mut f = files();
        f.libraries.push(lib("libnvidia-allocator.so.550.54.15", Some("libnvidia-allocator.so.1")));
        f.libraries.push(lib(
            "libnvidia-vulkan-producer.so.550.54.15",
            Some("libnvidia-vulkan-producer.so.550.54.15"),
        ));
        f.libraries.push(Library {
            path: format!("{LIB}/vdpau/libvdpau_nvidia.so.550.54.15"),
            soname: Some("libvdpau_nvidia.so.1".into()),
        });
        f.libraries.sort();
        f.configs.push("/usr/share/vulkan/icd.d/nvidia_icd.json".into());
        f.xorg = vec![
            "/usr/lib/xorg/modules/drivers/nvidia_drv.so".into(),
            "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.550.54.15".into(),
        ];
        f.links = vec![
            (format!("{LIB}/gbm/nvidia-drm_gbm.so"), "../libnvidia-allocator.so.1".into()),
            (
                "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so".into(),
                "libglxserver_nvidia.so.550.54.15".into(),
            ),
        ];
        let spec = build_spec(Source::Nvml(&inventory()), &f, &dev(), &opts()).unwrap();
        let c = &spec.container_edits;
        let mount_of = |ctr: &str| c.mounts.iter().find(|m| m.container_path == ctr);
        let icd = mount_of("/etc/vulkan/icd.d/nvidia_icd.json").expect("ICD under /etc/vulkan");
        assert_eq!(icd.host_path, "/usr/share/vulkan/icd.d/nvidia_icd.json");
        for ctr in [
            "/usr/lib/xorg/modules/drivers/nvidia_drv.so",
            "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.550.54.15",
            "/usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.550.54.15",
        ] {
            assert_eq!(
                mount_of(ctr).map(|m| m.options.clone()),
                Some(FILE_MOUNT_OPTIONS.map(String::from).to_vec())
            );
        }
        let hook = |name: &str| &c.hooks.iter().find(|h| h.args[1] == name).expect("hook present").args;
        let links = hook("create-symlinks");
        for pair in [
            "../libnvidia-allocator.so.1::/usr/lib/x86_64-linux-gnu/gbm/nvidia-drm_gbm.so",
            "libglxserver_nvidia.so.550.54.15::/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so",
            "libnvidia-vulkan-producer.so.550.54.15::/usr/lib/x86_64-linux-gnu/libnvidia-vulkan-producer.so",
            "libvdpau_nvidia.so.550.54.15::/usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.1",
        ] {
            assert!(links.iter().any(|a| a == pair), "{pair} missing from {links:?}");
        }
        // VDPAU's folder is a loader folder; Xorg's module folders are not.
        let folders = hook("update-ldcache");
        assert!(folders.iter().any(|a| a == "/usr/lib/x86_64-linux-gnu/vdpau"), "{folders:?}");
        assert!(!folders.iter().any(|a| a.contains("xorg")), "{folders:?}");
    }

    #[test]
    fn host_roots_prefix_host_paths_only() {
        let mut o = opts();
        o.host_driver_root = "/run/nvidia/driver".into();
        o.host_dev_root = "/run/nvidia/driver".into();
        let spec = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &o).unwrap();
        let m = &spec.container_edits.mounts[1];
        assert_eq!(m.host_path, "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15");
        assert_eq!(m.container_path, "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15");
        let n = &spec.device("0").unwrap().container_edits.device_nodes[0];
        assert_eq!(
            (n.path.as_str(), n.host_path.as_deref()),
            ("/dev/nvidia0", Some("/run/nvidia/driver/dev/nvidia0"))
        );
        assert_eq!(spec.annotations[ANNOTATION_DRIVER_ROOT], "/run/nvidia/driver");
    }

    #[test]
    fn hooks_can_be_disabled() {
        let mut o = opts();
        let subs = |spec: &nvinject_cdi::Spec| -> Vec<String> {
            spec.container_edits.hooks.iter().map(|h| h.args[1].clone()).collect()
        };
        let spec = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &o).unwrap();
        assert_eq!(
            subs(&spec),
            [
                "create-symlinks",
                "enable-cuda-compat",
                "update-ldcache",
                "disable-device-node-modification",
                "update-application-profile"
            ]
        );
        o.choices.disabled_hooks = HookKind::ALL.to_vec();
        let spec = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &o).unwrap();
        assert!(spec.container_edits.hooks.is_empty());
        assert!(spec.devices.iter().all(|d| d.container_edits.hooks.is_empty()));
        o.choices.disabled_hooks =
            vec!["update-ldcache".parse().unwrap(), "enable-cuda-compat".parse().unwrap()];
        let spec = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &o).unwrap();
        assert_eq!(
            subs(&spec),
            ["create-symlinks", "disable-device-node-modification", "update-application-profile"]
        );
        o.choices.disabled_hooks = vec![
            "disable-device-node-modification".parse().unwrap(),
            "update-application-profile".parse().unwrap(),
        ];
        let spec = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &o).unwrap();
        assert_eq!(subs(&spec), ["create-symlinks", "enable-cuda-compat", "update-ldcache"]);
        assert!("ldcache".parse::<HookKind>().unwrap_err().to_string().contains(
            "create-symlinks, update-ldcache, enable-cuda-compat, disable-device-node-modification or \
             update-application-profile"
        ));
    }

    #[test]
    fn device_ids_select_devices_by_any_name() {
        let mut o = opts();
        o.choices.device_ids = Some(vec!["MIG-19000000-1111-2222-3333-444444444444".into(), "gpu0".into()]);
        let spec = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &o).unwrap();
        assert_eq!(
            names(&spec),
            [
                "0",
                "GPU-00000000-1111-2222-3333-444444444444",
                "1:1",
                "MIG-19000000-1111-2222-3333-444444444444",
                "all"
            ]
        );
        assert!(
            !node_paths(&spec.device("all").unwrap().container_edits)
                .contains(&"/dev/nvidia-caps/nvidia-cap21")
        );

        o.choices.device_ids = Some(vec!["7".into()]);
        let err = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &o).unwrap_err().to_string();
        assert_eq!(err, "--device-ids: no device `7` on this node; devices are: 0, 1:0, 1:1");
        o.choices.device_ids = Some(vec!["1".into()]);
        let err = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &o).unwrap_err().to_string();
        assert!(err.contains("GPU `1` is in MIG mode") && err.contains("1:0, 1:1"), "{err}");
    }

    #[test]
    fn missing_pieces_are_explained() {
        let mut f = files();
        f.libraries.retain(|l| !l.path.contains("libcuda"));
        let err = build_spec(Source::Nvml(&inventory()), &f, &dev(), &opts()).unwrap_err().to_string();
        assert!(err.starts_with("driver library libcuda.so.550.54.15 not found under driver root /: searched /usr/lib/x86_64-linux-gnu and the folders in its etc/ld.so.cache"), "{err}");

        let mut d = dev();
        d.mig_minors.access.remove(&MigCap::parse("gpu1/gi9/ci0/access").unwrap());
        let err = build_spec(Source::Nvml(&inventory()), &files(), &d, &opts()).unwrap_err().to_string();
        assert!(err.contains("MIG-19000000-1111-2222-3333-444444444444: no `gpu1/gi9/ci0/access`"), "{err}");

        let mut d = dev();
        d.char_majors.remove("nvidia-caps");
        let err = build_spec(Source::Nvml(&inventory()), &files(), &d, &opts()).unwrap_err().to_string();
        assert!(err.contains("/dev/nvidia-caps/nvidia-cap210 does not exist"), "{err}");

        let empty = Inventory { gpus: vec![], ..inventory() };
        let err = build_spec(Source::Nvml(&empty), &files(), &dev(), &opts()).unwrap_err().to_string();
        assert!(err.contains("no usable GPU"), "{err}");
    }

    #[test]
    fn management_mode_puts_every_node_in_all() {
        let spec = build_spec(Source::Management { driver_version: VER }, &files(), &dev(), &opts()).unwrap();
        assert_eq!(names(&spec), ["all"]);
        assert_eq!(
            node_paths(&spec.devices[0].container_edits),
            [
                "/dev/nvidia-caps/nvidia-cap21",
                "/dev/nvidia-caps/nvidia-cap22",
                "/dev/nvidia0",
                "/dev/nvidia1"
            ]
        );
        assert_eq!(
            node_paths(&spec.container_edits),
            ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        );
        assert_eq!(validate(&spec), vec![]);
        let mut o = opts();
        o.choices.all_device = false;
        let err = build_spec(Source::Management { driver_version: VER }, &files(), &dev(), &o).unwrap_err();
        assert_eq!(err, BuildError::NotInManagementMode("--no-all-device"));
    }

    #[test]
    fn same_inputs_same_spec() {
        let a = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &opts()).unwrap();
        let b = build_spec(Source::Nvml(&inventory()), &files(), &dev(), &opts()).unwrap();
        assert_eq!(a, b);
        let mut other = inventory();
        other.gpus[1].mig_devices[1].gpu_instance_id = 10;
        assert_ne!(inventory_digest(&other), inventory_digest(&inventory()));
    }
}
