//! Discovery through NVML: the only I/O in this crate.
//!
//! [`discover`] loads `libnvidia-ml.so.1` (from the path given, else the dynamic linker's search),
//! reads every visible GPU once into an [`Inventory`] and unloads the library. Callers that keep
//! NVML open (the device plugin waits for XID events) use [`open`] and [`read_inventory`].

use std::ffi::OsStr;
use std::path::Path;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TopologyLevel as NvmlTopologyLevel;
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_SUCCESS;

use crate::model::{
    ComputeCapability, CudaVersion, DeviceUuid, DriverInfo, Gpu, Inventory, MigDevice, MigProfile, NvLink,
    PciBusId, TopologyLevel,
};

/// The library name NVML users load; the dynamic linker resolves it.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// NVML's upper bound on NVLink links per GPU (`NVML_NVLINK_MAX_LINKS`).
const NVLINK_MAX_LINKS: u32 = 18;

/// Why NVML could not be used or queried. Every variant names the library or device involved.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// The library could not be loaded or lacks its entry points.
    // No command-line flags here: each binary that can work around this adds its own hint.
    #[error(
        "cannot load NVML from {library}: {source}. Is the NVIDIA driver installed, and is that its \
         libnvidia-ml.so.1?"
    )]
    Load {
        /// Path or name that was tried.
        library: String,
        /// What the loader said.
        source: WrapperError,
    },
    /// The library loaded but the kernel driver is not there.
    #[error(
        "NVML ({library}) reports the NVIDIA kernel driver is not loaded: load it (modprobe nvidia) or check \
         the driver container"
    )]
    DriverNotLoaded {
        /// Path or name of the library.
        library: String,
    },
    /// A query failed.
    #[error("NVML query {query} failed{}: {source}", device.map(|d| format!(" for GPU {d}")).unwrap_or_default())]
    Query {
        /// The NVML call, e.g. `nvmlDeviceGetUUID`.
        query: &'static str,
        /// NVML index of the GPU involved, if any.
        device: Option<u32>,
        /// NVML's error.
        source: WrapperError,
    },
    /// A query answered something that is not valid for its type.
    #[error("NVML query {query} for GPU {device} returned `{value}`, which is not valid")]
    BadValue {
        /// The NVML call.
        query: &'static str,
        /// NVML index of the GPU.
        device: u32,
        /// What it returned.
        value: String,
    },
}

/// Loads NVML from `library` (a path) or, when `None`, by name through the dynamic linker.
pub fn open(library: Option<&Path>) -> Result<Nvml, NvmlError> {
    let name = library.map(|p| p.display().to_string()).unwrap_or_else(|| DEFAULT_LIBRARY.to_owned());
    let mut builder = Nvml::builder();
    let path_os = library.map(Path::as_os_str).unwrap_or(OsStr::new(DEFAULT_LIBRARY));
    builder.lib_path(path_os);
    builder.init().map_err(|source| match source {
        WrapperError::DriverNotLoaded => NvmlError::DriverNotLoaded { library: name.clone() },
        source => NvmlError::Load { library: name.clone(), source },
    })
}

/// Loads NVML, reads the inventory and unloads NVML.
pub fn discover(library: Option<&Path>) -> Result<Inventory, NvmlError> {
    let nvml = open(library)?;
    let inventory = read_inventory(&nvml)?;
    tracing::debug!(gpus = inventory.gpus.len(), driver = %inventory.driver.version, "NVML discovery done");
    Ok(inventory)
}

/// Reads everything the model holds from an open NVML.
pub fn read_inventory(nvml: &Nvml) -> Result<Inventory, NvmlError> {
    let q =
        |query: &'static str, device: Option<u32>| move |source| NvmlError::Query { query, device, source };
    let driver = DriverInfo {
        version: nvml.sys_driver_version().map_err(q("nvmlSystemGetDriverVersion", None))?,
        cuda: CudaVersion::from_nvml(
            nvml.sys_cuda_driver_version().map_err(q("nvmlSystemGetCudaDriverVersion_v2", None))?,
        ),
        nvml_version: nvml.sys_nvml_version().map_err(q("nvmlSystemGetNVMLVersion", None))?,
    };
    let count = nvml.device_count().map_err(q("nvmlDeviceGetCount_v2", None))?;
    let mut gpus = Vec::with_capacity(count as usize);
    let mut handles = Vec::with_capacity(count as usize);
    for index in 0..count {
        let device = nvml.device_by_index(index).map_err(q("nvmlDeviceGetHandleByIndex_v2", Some(index)))?;
        gpus.push(read_gpu(nvml, &device, index)?);
        handles.push(device);
    }
    let mut topology = Vec::new();
    for a in 0..handles.len() {
        for b in a + 1..handles.len() {
            let level = match nvml.topology_common_ancestor(&handles[a], &handles[b]) {
                Ok(level) => level_from_nvml(level),
                // Some platforms (and vGPU) cannot say; treat the pair as far apart.
                Err(WrapperError::NotSupported) => TopologyLevel::System,
                Err(e) => return Err(q("nvmlDeviceGetTopologyCommonAncestor", Some(a as u32))(e)),
            };
            topology.push((a as u32, b as u32, level));
        }
    }
    Ok(Inventory { driver, gpus, topology })
}

fn read_gpu(nvml: &Nvml, device: &nvml_wrapper::Device<'_>, index: u32) -> Result<Gpu, NvmlError> {
    let q = |query: &'static str| move |source| NvmlError::Query { query, device: Some(index), source };
    let pci = device.pci_info().map_err(q("nvmlDeviceGetPciInfo_v3"))?;
    let pci_bus_id = PciBusId::parse(&pci.bus_id).ok_or(NvmlError::BadValue {
        query: "nvmlDeviceGetPciInfo_v3",
        device: index,
        value: pci.bus_id.clone(),
    })?;
    let memory_bytes = device.memory_info().map_err(q("nvmlDeviceGetMemoryInfo_v2"))?.total;
    let cc = device.cuda_compute_capability().map_err(q("nvmlDeviceGetCudaComputeCapability"))?;
    let architecture = match device.architecture() {
        Ok(DeviceArchitecture::Unknown) | Err(WrapperError::NotSupported) => "unknown".to_owned(),
        Ok(arch) => format!("{arch:?}").to_ascii_lowercase(),
        Err(e) => return Err(q("nvmlDeviceGetArchitecture")(e)),
    };
    let numa_node = optional(device.numa_node_id()).map_err(q("nvmlDeviceGetNumaNodeId"))?;
    let mig_enabled =
        optional(device.mig_mode()).map_err(q("nvmlDeviceGetMigMode"))?.map(|mode| mode.current == 1);
    let mig_devices = if mig_enabled == Some(true) {
        read_mig_devices(nvml, device, index, memory_bytes)?
    } else {
        Vec::new()
    };
    let mut nvlinks = Vec::new();
    for link in 0..NVLINK_MAX_LINKS {
        let wrapper = device.link_wrapper_for(link);
        match wrapper.is_active() {
            Ok(true) => {
                let remote = wrapper.remote_pci_info().map_err(q("nvmlDeviceGetNvLinkRemotePciInfo_v2"))?;
                if let Some(peer) = PciBusId::parse(&remote.bus_id) {
                    nvlinks.push(NvLink { link, peer });
                }
            }
            Ok(false) => {}
            // No NVLink on this GPU, or past its last link.
            Err(WrapperError::NotSupported | WrapperError::InvalidArg) => break,
            Err(e) => return Err(q("nvmlDeviceGetNvLinkState")(e)),
        }
    }
    Ok(Gpu {
        index,
        minor: device.minor_number().map_err(q("nvmlDeviceGetMinorNumber"))?,
        uuid: DeviceUuid(device.uuid().map_err(q("nvmlDeviceGetUUID"))?),
        name: device.name().map_err(q("nvmlDeviceGetName"))?,
        pci_bus_id,
        memory_bytes,
        compute_capability: ComputeCapability {
            major: cc.major.max(0) as u32,
            minor: cc.minor.max(0) as u32,
        },
        architecture,
        numa_node,
        mig_enabled,
        mig_devices,
        nvlinks,
    })
}

fn read_mig_devices(
    nvml: &Nvml,
    parent: &nvml_wrapper::Device<'_>,
    index: u32,
    parent_bytes: u64,
) -> Result<Vec<MigDevice>, NvmlError> {
    let q = |query: &'static str| move |source| NvmlError::Query { query, device: Some(index), source };
    let max = parent.mig_device_count().map_err(q("nvmlDeviceGetMaxMigDeviceCount"))?;
    let mut out = Vec::new();
    for mig_index in 0..max {
        let mig = match parent.mig_device_by_index(mig_index) {
            Ok(m) => m,
            // Empty slots (and MIG devices this process may not use) are simply absent.
            Err(WrapperError::NotFound | WrapperError::NoPermission) => continue,
            Err(e) => return Err(q("nvmlDeviceGetMigDeviceHandleByIndex")(e)),
        };
        let attrs = mig.attributes().map_err(q("nvmlDeviceGetAttributes_v2"))?;
        // SAFETY: `mig` is a live handle from this `nvml`, which outlives the calls.
        let handle = unsafe { mig.handle() };
        let gpu_instance_id =
            raw_id(nvml, handle, Id::GpuInstance).map_err(q("nvmlDeviceGetGpuInstanceId"))?;
        let compute_instance_id =
            raw_id(nvml, handle, Id::ComputeInstance).map_err(q("nvmlDeviceGetComputeInstanceId"))?;
        out.push(MigDevice {
            index: mig_index,
            uuid: DeviceUuid(mig.uuid().map_err(q("nvmlDeviceGetUUID"))?),
            gpu_instance_id,
            compute_instance_id,
            profile: MigProfile::from_attributes(
                attrs.gpu_instance_slice_count,
                attrs.compute_instance_slice_count,
                attrs.memory_size_mb,
                parent_bytes,
            ),
        });
    }
    Ok(out)
}

enum Id {
    GpuInstance,
    ComputeInstance,
}

/// GPU/compute instance id of a MIG handle; nvml-wrapper has no wrapper for these two calls.
fn raw_id(
    nvml: &Nvml,
    handle: nvml_wrapper_sys::bindings::nvmlDevice_t,
    which: Id,
) -> Result<u32, WrapperError> {
    let lib = nvml.lib();
    let mut id: std::os::raw::c_uint = 0;
    // SAFETY: the functions take a device handle and an out-pointer to a c_uint, per nvml.h; the
    // handle is live and `id` outlives the call. A missing symbol is reported, not called.
    let ret = unsafe {
        match which {
            Id::GpuInstance => match lib.nvmlDeviceGetGpuInstanceId.as_ref() {
                Ok(f) => f(handle, &mut id),
                Err(_) => return Err(WrapperError::FunctionNotFound),
            },
            Id::ComputeInstance => match lib.nvmlDeviceGetComputeInstanceId.as_ref() {
                Ok(f) => f(handle, &mut id),
                Err(_) => return Err(WrapperError::FunctionNotFound),
            },
        }
    };
    if ret == nvmlReturn_enum_NVML_SUCCESS { Ok(id) } else { Err(WrapperError::from(ret)) }
}

/// `NotSupported` (the GPU has no such feature) becomes `None`.
fn optional<T>(r: Result<T, WrapperError>) -> Result<Option<T>, WrapperError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(WrapperError::NotSupported | WrapperError::FunctionNotFound) => Ok(None),
        Err(e) => Err(e),
    }
}

fn level_from_nvml(level: NvmlTopologyLevel) -> TopologyLevel {
    match level {
        NvmlTopologyLevel::Internal => TopologyLevel::Internal,
        NvmlTopologyLevel::Single => TopologyLevel::Single,
        NvmlTopologyLevel::Multiple => TopologyLevel::Multiple,
        NvmlTopologyLevel::HostBridge => TopologyLevel::HostBridge,
        NvmlTopologyLevel::Node => TopologyLevel::Node,
        NvmlTopologyLevel::System => TopologyLevel::System,
    }
}
