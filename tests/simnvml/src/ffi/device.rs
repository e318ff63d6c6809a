//! Device enumeration and per-device facts.
//!
//! MIG device handles answer what belongs to the MIG device (name, UUID, memory, attributes) and,
//! for hardware facts shared with the parent (PCI info, compute capability, architecture, brand,
//! NUMA node), the parent's values; index, minor number, serial and sensor readings are the
//! physical GPU's alone and answer `NVML_ERROR_NOT_SUPPORTED`.

use std::ffi::{c_char, c_int, c_uint};

use nvinject_simnode::description::GpuDescription;
use nvml_wrapper_sys::bindings as sys;
use nvml_wrapper_sys::bindings::{
    nvmlBrandType_t, nvmlDevice_t, nvmlDeviceArchitecture_t, nvmlDeviceAttributes_t, nvmlMemory_t,
    nvmlMemory_v2_t, nvmlPciInfo_t, nvmlProcessInfo_t, nvmlTemperatureSensors_t, nvmlUtilization_t,
};

use super::{
    ARGUMENT_VERSION_MISMATCH, Dev, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED, PciInfoLegacy, Ret, get_str,
    gpu, guard, non_null, parse_bus_id, pci_info, pci_info_legacy, put, put_str, struct_version,
};
use crate::node::{Node, Object};
use crate::state;

const MIB: u64 = 1 << 20;

/// `nvmlDeviceGetCount_v2`: GPUs this process may use.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) -> Ret {
    guard(|| {
        let node = state::node()?;
        // SAFETY: out-pointer contract.
        unsafe { put(device_count, node.gpus.len() as c_uint) }
    })
}

/// `nvmlDeviceGetCount`: same as `_v2`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetCount(device_count: *mut c_uint) -> Ret {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetCount_v2(device_count) }
}

/// `nvmlDeviceGetHandleByIndex_v2`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) -> Ret {
    guard(|| {
        let node = state::node()?;
        let g = node.gpus.get(index as usize).ok_or(INVALID_ARGUMENT)?;
        // SAFETY: out-pointer contract.
        unsafe { put(device, g.handle as nvmlDevice_t) }
    })
}

/// `nvmlDeviceGetHandleByIndex`: same as `_v2`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut nvmlDevice_t) -> Ret {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

fn handle_of(node: &Node, object: Object) -> usize {
    match object {
        Object::Gpu { gpu } => node.gpus[gpu].handle,
        Object::Mig { gpu, mig } => node.gpus[gpu].mig_devices[mig].handle,
        Object::GpuInstance { gpu, gi } => node.gpus[gpu].instances[gi].handle,
        Object::ComputeInstance { gpu, gi, ci } => node.gpus[gpu].instances[gi].compute[ci].handle,
    }
}

/// `nvmlDeviceGetHandleByUUID`: a GPU UUID gives the GPU, a `MIG-` UUID the MIG device.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) -> Ret {
    guard(|| {
        let node = state::node()?;
        // SAFETY: input string contract.
        let uuid = unsafe { get_str(uuid) }?;
        let device = non_null(device)?;
        let object = node.find_uuid(uuid).ok_or(NOT_FOUND)?;
        // SAFETY: checked non-null; out-pointer contract.
        unsafe { put(device, handle_of(&node, object) as nvmlDevice_t) }
    })
}

/// `nvmlDeviceGetHandleBySerial`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetHandleBySerial(serial: *const c_char, device: *mut nvmlDevice_t) -> Ret {
    guard(|| {
        let node = state::node()?;
        // SAFETY: input string contract.
        let serial = unsafe { get_str(serial) }?;
        let device = non_null(device)?;
        let g = (0..node.gpus.len()).find(|&g| node.gpu_desc(g).serial == serial).ok_or(NOT_FOUND)?;
        // SAFETY: out-pointer contract.
        unsafe { put(device, node.gpus[g].handle as nvmlDevice_t) }
    })
}

/// `nvmlDeviceGetHandleByPciBusId_v2`: accepts `DDDDDDDD:BB:DD.F`, `DDDD:BB:DD.F` and `BB:DD.F`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pci_bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> Ret {
    guard(|| {
        let node = state::node()?;
        // SAFETY: input string contract.
        let wanted = parse_bus_id(unsafe { get_str(pci_bus_id) }?).ok_or(INVALID_ARGUMENT)?;
        let device = non_null(device)?;
        let g = (0..node.gpus.len())
            .find(|&g| parse_bus_id(&node.gpu_desc(g).pci_bus_id) == Some(wanted))
            .ok_or(NOT_FOUND)?;
        // SAFETY: out-pointer contract.
        unsafe { put(device, node.gpus[g].handle as nvmlDevice_t) }
    })
}

/// `nvmlDeviceGetHandleByPciBusId`: same as `_v2`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    pci_bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> Ret {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id, device) }
}

/// `nvmlDeviceGetIndex`: the NVML index (GPUs only).
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> Ret {
    guard(|| {
        let (_, g) = gpu(device)?;
        // SAFETY: out-pointer contract.
        unsafe { put(index, g as c_uint) }
    })
}

/// The name NVML gives a device: the product name, or `<product> MIG <profile>` for a MIG device.
fn device_name(node: &Node, dev: Dev) -> String {
    match dev {
        Dev::Gpu(g) => node.gpu_desc(g).name.clone(),
        Dev::Mig(g, m) => {
            let mig = node.gpus[g].mig_devices[m];
            format!("{} MIG {}", node.gpu_desc(g).name, node.ci_desc(g, mig.gi, mig.ci).profile)
        }
    }
}

/// `nvmlDeviceGetName`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) -> Ret {
    guard(|| {
        let (node, dev) = super::device(device)?;
        // SAFETY: buffer contract.
        unsafe { put_str(name, length, &device_name(&node, dev)) }
    })
}

/// `nvmlDeviceGetUUID`: `GPU-...` or `MIG-...`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) -> Ret {
    guard(|| {
        let (node, dev) = super::device(device)?;
        let text = match dev {
            Dev::Gpu(g) => &node.gpu_desc(g).uuid,
            Dev::Mig(g, m) => {
                let mig = node.gpus[g].mig_devices[m];
                &node.ci_desc(g, mig.gi, mig.ci).uuid
            }
        };
        // SAFETY: buffer contract.
        unsafe { put_str(uuid, length, text) }
    })
}

/// `nvmlDeviceGetSerial`: the board serial (GPUs only).
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetSerial(device: nvmlDevice_t, serial: *mut c_char, length: c_uint) -> Ret {
    guard(|| {
        let (node, g) = gpu(device)?;
        // SAFETY: buffer contract.
        unsafe { put_str(serial, length, &node.gpu_desc(g).serial) }
    })
}

/// `nvmlDeviceGetMinorNumber`: `N` of `/dev/nvidiaN` (GPUs only).
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetMinorNumber(device: nvmlDevice_t, minor_number: *mut c_uint) -> Ret {
    guard(|| {
        let (node, g) = gpu(device)?;
        // SAFETY: out-pointer contract.
        unsafe { put(minor_number, node.gpu_desc(g).minor) }
    })
}

/// `nvmlDeviceGetPciInfo_v3`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> Ret {
    guard(|| {
        let (node, dev) = super::device(device)?;
        // SAFETY: out-pointer contract.
        unsafe { put(pci, pci_info(node.gpu_desc(dev.gpu()))) }
    })
}

/// `nvmlDeviceGetPciInfo_v2`: the pre-v3 layout with the 16-byte bus id.
///
/// # Safety
/// `pci` is null or valid for a write of the 52-byte legacy `nvmlPciInfo_t`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(device: nvmlDevice_t, pci: *mut PciInfoLegacy) -> Ret {
    guard(|| {
        let (node, dev) = super::device(device)?;
        // SAFETY: out-pointer contract (legacy layout).
        unsafe { put(pci, pci_info_legacy(&pci_info(node.gpu_desc(dev.gpu())))) }
    })
}

/// `nvmlDeviceGetPciInfo`: same layout as `_v2`.
///
/// # Safety
/// As for `nvmlDeviceGetPciInfo_v2`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetPciInfo(device: nvmlDevice_t, pci: *mut PciInfoLegacy) -> Ret {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetPciInfo_v2(device, pci) }
}

/// Framebuffer of a device in bytes: the GPU's, or the MIG device's GPU instance profile.
fn memory_bytes(node: &Node, dev: Dev) -> u64 {
    match dev {
        Dev::Gpu(g) => node.gpu_desc(g).memory_mib * MIB,
        Dev::Mig(g, m) => node.gpus[g].instances[node.gpus[g].mig_devices[m].gi].profile.memory_mib * MIB,
    }
}

/// `nvmlDeviceGetMemoryInfo`: nothing runs on a simulated GPU, so all of it is free.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> Ret {
    guard(|| {
        let (node, dev) = super::device(device)?;
        let total = memory_bytes(&node, dev);
        // SAFETY: out-pointer contract.
        unsafe { put(memory, nvmlMemory_t { total, free: total, used: 0 }) }
    })
}

/// `nvmlDeviceGetMemoryInfo_v2`: checks `version` like NVML (`nvmlMemory_v2`), then fills the rest.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) -> Ret {
    guard(|| {
        let (node, dev) = super::device(device)?;
        let memory = non_null(memory)?;
        // SAFETY: non-null and valid for reads and writes of nvmlMemory_v2_t per the contract.
        let version = unsafe { (*memory).version };
        if version != struct_version::<nvmlMemory_v2_t>(2) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let total = memory_bytes(&node, dev);
        // SAFETY: as above.
        unsafe { put(memory, nvmlMemory_v2_t { version, total, reserved: 0, free: total, used: 0 }) }
    })
}

/// `nvmlDeviceGetCudaComputeCapability`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> Ret {
    guard(|| {
        let (node, dev) = super::device(device)?;
        let (major, minor) = (non_null(major)?, non_null(minor)?);
        let [ma, mi] = node.gpu_desc(dev.gpu()).compute_capability;
        // SAFETY: both checked non-null; out-pointer contract.
        unsafe {
            put(major, ma)?;
            put(minor, mi)
        }
    })
}

/// `nvmlDeviceGetArchitecture`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: nvmlDevice_t,
    arch: *mut nvmlDeviceArchitecture_t,
) -> Ret {
    guard(|| {
        let (node, dev) = super::device(device)?;
        // SAFETY: out-pointer contract.
        unsafe { put(arch, node.gpu_desc(dev.gpu()).architecture.nvml_value()) }
    })
}

/// `nvmlDeviceGetBrand`: `NVML_BRAND_NVIDIA`, what current drivers report for data-centre and
/// professional boards alike.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetBrand(device: nvmlDevice_t, brand: *mut nvmlBrandType_t) -> Ret {
    guard(|| {
        super::device(device)?;
        // SAFETY: out-pointer contract.
        unsafe { put(brand, sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA) }
    })
}

/// Attributes of a whole GPU: its SMs and memory; engine and slice counts from the full MIG profile
/// when the model has a table (zero otherwise, as the description does not carry them).
fn gpu_attributes(node: &Node, g: usize) -> nvmlDeviceAttributes_t {
    let desc: &GpuDescription = node.gpu_desc(g);
    let full = node.gpus[g].model.and_then(|m| m.full_profile());
    nvmlDeviceAttributes_t {
        multiprocessorCount: desc.multiprocessor_count,
        sharedCopyEngineCount: full.map_or(0, |p| p.copy_engines),
        sharedDecoderCount: full.map_or(0, |p| p.decoders),
        sharedEncoderCount: full.map_or(0, |p| p.encoders),
        sharedJpegCount: full.map_or(0, |p| p.jpegs),
        sharedOfaCount: full.map_or(0, |p| p.ofas),
        gpuInstanceSliceCount: full.map_or(0, |p| p.slices),
        computeInstanceSliceCount: full.map_or(0, |p| p.slices),
        memorySizeMB: desc.memory_mib,
    }
}

/// Attributes of a MIG device: its compute instance's SMs and slices, its GPU instance's engines and
/// memory.
fn mig_attributes(node: &Node, g: usize, m: usize) -> nvmlDeviceAttributes_t {
    let mig = node.gpus[g].mig_devices[m];
    let gi = &node.gpus[g].instances[mig.gi];
    let ci = &gi.compute[mig.ci];
    nvmlDeviceAttributes_t {
        multiprocessorCount: ci.profile.multiprocessors,
        sharedCopyEngineCount: gi.profile.copy_engines,
        sharedDecoderCount: gi.profile.decoders,
        sharedEncoderCount: gi.profile.encoders,
        sharedJpegCount: gi.profile.jpegs,
        sharedOfaCount: gi.profile.ofas,
        gpuInstanceSliceCount: gi.profile.slices,
        computeInstanceSliceCount: ci.profile.slices,
        memorySizeMB: gi.profile.memory_mib,
    }
}

/// `nvmlDeviceGetAttributes_v2`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> Ret {
    guard(|| {
        let (node, dev) = super::device(device)?;
        let value = match dev {
            Dev::Gpu(g) => gpu_attributes(&node, g),
            Dev::Mig(g, m) => mig_attributes(&node, g, m),
        };
        // SAFETY: out-pointer contract.
        unsafe { put(attributes, value) }
    })
}

/// `nvmlDeviceGetAttributes`: same layout and answer as `_v2`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetAttributes(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> Ret {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetAttributes_v2(device, attributes) }
}

/// `nvmlDeviceGetNumaNodeId`: `NVML_ERROR_NOT_SUPPORTED` when the description gives no NUMA node.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetNumaNodeId(device: nvmlDevice_t, numa: *mut c_uint) -> Ret {
    guard(|| {
        let (node, dev) = super::device(device)?;
        let id = node.gpu_desc(dev.gpu()).numa_node.ok_or(NOT_SUPPORTED)?;
        // SAFETY: out-pointer contract.
        unsafe { put(numa, id) }
    })
}

/// `nvmlDeviceGetTemperature`: the description's reading for `NVML_TEMPERATURE_GPU`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> Ret {
    guard(|| {
        let (node, g) = gpu(device)?;
        if sensor != sys::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: out-pointer contract.
        unsafe { put(temp, node.gpu_desc(g).telemetry.temperature_c) }
    })
}

/// `nvmlDeviceGetUtilizationRates`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> Ret {
    guard(|| {
        let (node, g) = gpu(device)?;
        let t = &node.gpu_desc(g).telemetry;
        // SAFETY: out-pointer contract.
        unsafe {
            put(utilization, nvmlUtilization_t { gpu: t.gpu_util_percent, memory: t.memory_util_percent })
        }
    })
}

/// `nvmlDeviceGetPowerUsage`: milliwatts.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetPowerUsage(device: nvmlDevice_t, power: *mut c_uint) -> Ret {
    guard(|| {
        let (node, g) = gpu(device)?;
        // SAFETY: out-pointer contract.
        unsafe { put(power, node.gpu_desc(g).telemetry.power_mw) }
    })
}

/// The running-process queries: no process ever runs on a simulated GPU, so the list is empty.
///
/// # Safety
/// `info_count` is null or valid for reads and writes; `infos` is never touched.
unsafe fn no_processes(device: nvmlDevice_t, info_count: *mut c_uint) -> Ret {
    guard(|| {
        super::device(device)?;
        // SAFETY: out-pointer contract.
        unsafe { put(info_count, 0) }
    })
}

macro_rules! empty_process_lists {
    ($($name:ident),*) => {$(
        #[doc = concat!("`", stringify!($name), "`: an empty list (nothing runs on a simulated GPU).")]
        ///
        /// # Safety
        /// See the module contract in `ffi`.
        #[unsafe(no_mangle)]
        unsafe extern "C" fn $name(device: nvmlDevice_t, info_count: *mut c_uint, _infos: *mut nvmlProcessInfo_t) -> Ret {
            // SAFETY: same contract.
            unsafe { no_processes(device, info_count) }
        }
    )*};
}

empty_process_lists!(
    nvmlDeviceGetComputeRunningProcesses,
    nvmlDeviceGetComputeRunningProcesses_v2,
    nvmlDeviceGetComputeRunningProcesses_v3,
    nvmlDeviceGetGraphicsRunningProcesses,
    nvmlDeviceGetGraphicsRunningProcesses_v2,
    nvmlDeviceGetGraphicsRunningProcesses_v3
);
