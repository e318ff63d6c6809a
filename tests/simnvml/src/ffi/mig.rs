//! MIG: mode, MIG device handles, GPU and compute instances and their profiles.
//!
//! Profile queries take the `NVML_GPU_INSTANCE_PROFILE_*` / `NVML_COMPUTE_INSTANCE_PROFILE_*` index;
//! instance lists and placements take the unique profile id the info struct returns, as in NVML.
//! Tables come from `nvinject_simnode::mig`; the placements of existing instances from the description.

use std::ffi::c_uint;
use std::sync::Arc;

use nvinject_simnode::mig::{ComputeInstanceProfile, GpuInstanceProfile, MigModel};
use nvml_wrapper_sys::bindings as sys;
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstancePlacement_t,
    nvmlComputeInstanceProfileInfo_t, nvmlComputeInstanceProfileInfo_v2_t,
    nvmlComputeInstanceProfileInfo_v3_t, nvmlDevice_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_t, nvmlGpuInstanceProfileInfo_v2_t,
    nvmlGpuInstanceProfileInfo_v3_t,
};

use super::{
    ARGUMENT_VERSION_MISMATCH, Dev, INSUFFICIENT_SIZE, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED, Ret, fill,
    gpu, guard, non_null, put, struct_version,
};
use crate::node::{Node, Object};
use crate::state;

/// A whole-GPU handle; MIG management calls answer a MIG device handle with
/// `NVML_ERROR_INVALID_ARGUMENT`.
fn parent_gpu(device: nvmlDevice_t) -> Result<(Arc<Node>, usize), Ret> {
    gpu(device).map_err(|e| if e == NOT_SUPPORTED { INVALID_ARGUMENT } else { e })
}

/// Whether the description turns MIG mode on for visible GPU `g`.
fn mig_on(node: &Node, g: usize) -> bool {
    node.gpu_desc(g).mig.as_ref().is_some_and(|m| m.enabled)
}

/// A GPU handle whose model has a MIG table.
fn mig_gpu(device: nvmlDevice_t) -> Result<(Arc<Node>, usize, &'static MigModel), Ret> {
    let (node, g) = parent_gpu(device)?;
    if node.gpu_desc(g).mig.is_none() {
        return Err(NOT_SUPPORTED);
    }
    let model = node.gpus[g].model.ok_or(NOT_SUPPORTED)?;
    Ok((node, g, model))
}

/// Like [`mig_gpu`], and MIG mode is on.
fn mig_enabled_gpu(device: nvmlDevice_t) -> Result<(Arc<Node>, usize, &'static MigModel), Ret> {
    let (node, g, model) = mig_gpu(device)?;
    if !mig_on(&node, g) {
        return Err(NOT_SUPPORTED);
    }
    Ok((node, g, model))
}

/// An `nvmlGpuInstanceProfileInfo*_t` of any version, filled from a [`GpuInstanceProfile`]: the
/// fields every version shares, then the version's own fields given in braces.
macro_rules! gpu_instance_profile_info {
    ($info:ident, $profile:expr, { $($own:tt)* }) => {{
        let p: &GpuInstanceProfile = $profile;
        $info {
            id: p.id,
            sliceCount: p.slices,
            instanceCount: p.instance_count,
            multiprocessorCount: p.multiprocessors,
            copyEngineCount: p.copy_engines,
            decoderCount: p.decoders,
            encoderCount: p.encoders,
            jpegCount: p.jpegs,
            ofaCount: p.ofas,
            memorySizeMB: p.memory_mib,
            $($own)*
        }
    }};
}

/// An `nvmlComputeInstanceProfileInfo*_t` of any version, filled from a compute profile and the
/// [`GpuInstanceProfile`] whose engines it shares, then the version's own fields given in braces.
macro_rules! compute_instance_profile_info {
    ($info:ident, $compute:expr, $gpu_instance:expr, { $($own:tt)* }) => {{
        let (cp, gp): (&ComputeInstanceProfile, &GpuInstanceProfile) = ($compute, $gpu_instance);
        $info {
            id: cp.index,
            sliceCount: cp.slices,
            instanceCount: cp.instance_count,
            multiprocessorCount: cp.multiprocessors,
            sharedCopyEngineCount: gp.copy_engines,
            sharedDecoderCount: gp.decoders,
            sharedEncoderCount: gp.encoders,
            sharedJpegCount: gp.jpegs,
            sharedOfaCount: gp.ofas,
            $($own)*
        }
    }};
}

fn resolve_gi(handle: nvmlGpuInstance_t) -> Result<(Arc<Node>, usize, usize), Ret> {
    let node = state::node()?;
    match node.resolve(handle as usize) {
        Some(Object::GpuInstance { gpu, gi }) => Ok((node, gpu, gi)),
        _ => Err(INVALID_ARGUMENT),
    }
}

fn resolve_ci(handle: nvmlComputeInstance_t) -> Result<(Arc<Node>, usize, usize, usize), Ret> {
    let node = state::node()?;
    match node.resolve(handle as usize) {
        Some(Object::ComputeInstance { gpu, gi, ci }) => Ok((node, gpu, gi, ci)),
        _ => Err(INVALID_ARGUMENT),
    }
}

/// `nvmlDeviceGetMigMode`: current and pending mode are both the description's `mig.enabled`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    guard(|| {
        let (node, g) = gpu(device)?;
        let mig = node.gpu_desc(g).mig.as_ref().ok_or(NOT_SUPPORTED)?;
        let (current, pending) = (non_null(current)?, non_null(pending)?);
        let mode = if mig.enabled { sys::NVML_DEVICE_MIG_ENABLE } else { sys::NVML_DEVICE_MIG_DISABLE };
        // SAFETY: both checked non-null; out-pointer contract.
        unsafe {
            put(current, mode)?;
            put(pending, mode)
        }
    })
}

/// `nvmlDeviceGetMaxMigDeviceCount`: the model's maximum with MIG on, zero with MIG off or absent.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(device: nvmlDevice_t, count: *mut c_uint) -> Ret {
    guard(|| {
        let (node, g) = gpu(device)?;
        let max = if mig_on(&node, g) { node.gpus[g].mig_device_slots() as c_uint } else { 0 };
        // SAFETY: out-pointer contract.
        unsafe { put(count, max) }
    })
}

/// `nvmlDeviceGetMigDeviceHandleByIndex`: visible MIG devices at 0..n, `NVML_ERROR_NOT_FOUND` for
/// empty slots below the maximum.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig_device: *mut nvmlDevice_t,
) -> Ret {
    guard(|| {
        let (node, g) = parent_gpu(device)?;
        if !mig_on(&node, g) {
            return Err(NOT_SUPPORTED);
        }
        let mig_device = non_null(mig_device)?;
        match node.gpus[g].mig_devices.get(index as usize) {
            // SAFETY: out-pointer contract.
            Some(m) => unsafe { put(mig_device, m.handle as nvmlDevice_t) },
            None if (index as usize) < node.gpus[g].mig_device_slots() => Err(NOT_FOUND),
            None => Err(INVALID_ARGUMENT),
        }
    })
}

/// `nvmlDeviceIsMigDeviceHandle`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(device: nvmlDevice_t, is_mig_device: *mut c_uint) -> Ret {
    guard(|| {
        let (_, dev) = super::device(device)?;
        // SAFETY: out-pointer contract.
        unsafe { put(is_mig_device, matches!(dev, Dev::Mig(..)) as c_uint) }
    })
}

/// `nvmlDeviceGetDeviceHandleFromMigDeviceHandle`: the parent GPU.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> Ret {
    guard(|| match super::device(mig_device)? {
        // SAFETY: out-pointer contract.
        (node, Dev::Mig(g, _)) => unsafe { put(device, node.gpus[g].handle as nvmlDevice_t) },
        (_, Dev::Gpu(_)) => Err(INVALID_ARGUMENT),
    })
}

/// `nvmlDeviceGetGpuInstanceId`: a MIG device's GPU instance id.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(device: nvmlDevice_t, id: *mut c_uint) -> Ret {
    guard(|| match super::device(device)? {
        (node, Dev::Mig(g, m)) => {
            let gi = node.gpus[g].mig_devices[m].gi;
            // SAFETY: out-pointer contract.
            unsafe { put(id, node.gi_desc(g, gi).id) }
        }
        (_, Dev::Gpu(_)) => Err(NOT_SUPPORTED),
    })
}

/// `nvmlDeviceGetComputeInstanceId`: a MIG device's compute instance id.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(device: nvmlDevice_t, id: *mut c_uint) -> Ret {
    guard(|| match super::device(device)? {
        (node, Dev::Mig(g, m)) => {
            let mig = node.gpus[g].mig_devices[m];
            // SAFETY: out-pointer contract.
            unsafe { put(id, node.ci_desc(g, mig.gi, mig.ci).id) }
        }
        (_, Dev::Gpu(_)) => Err(NOT_SUPPORTED),
    })
}

/// `nvmlDeviceGetGpuInstanceById`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> Ret {
    guard(|| {
        let (node, g, _) = mig_enabled_gpu(device)?;
        let gpu_instance = non_null(gpu_instance)?;
        let gi =
            (0..node.gpus[g].instances.len()).find(|&gi| node.gi_desc(g, gi).id == id).ok_or(NOT_FOUND)?;
        // SAFETY: out-pointer contract.
        unsafe { put(gpu_instance, node.gpus[g].instances[gi].handle as nvmlGpuInstance_t) }
    })
}

/// `nvmlDeviceGetGpuInstances`: the visible instances of one profile (by unique id). The caller's
/// array holds the profile's `instanceCount` entries, as NVML documents.
///
/// # Safety
/// See the module contract in `ffi`; `gpu_instances` is valid for `instanceCount` writes.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profile_id: c_uint,
    gpu_instances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> Ret {
    guard(|| {
        let (node, g, model) = mig_enabled_gpu(device)?;
        let (gpu_instances, count) = (non_null(gpu_instances)?, non_null(count)?);
        let profile = model.profile_by_id(profile_id).ok_or(INVALID_ARGUMENT)?;
        let handles: Vec<usize> = node.gpus[g]
            .instances
            .iter()
            .filter(|gi| gi.profile.id == profile.id)
            .map(|gi| gi.handle)
            .take(profile.instance_count as usize)
            .collect();
        for (i, h) in handles.iter().enumerate() {
            // SAFETY: i < instanceCount, the documented capacity of the caller's array.
            unsafe { gpu_instances.add(i).write(*h as nvmlGpuInstance_t) };
        }
        // SAFETY: checked non-null; out-pointer contract.
        unsafe { put(count, handles.len() as c_uint) }
    })
}

fn profile_at(model: &MigModel, index: c_uint) -> Result<&'static GpuInstanceProfile, Ret> {
    if index >= sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
        return Err(INVALID_ARGUMENT);
    }
    model.profile_by_index(index).ok_or(NOT_SUPPORTED)
}

/// `nvmlDeviceGetGpuInstanceProfileInfo`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> Ret {
    guard(|| {
        let (_, _, model) = mig_gpu(device)?;
        let p = profile_at(model, profile)?;
        let value = gpu_instance_profile_info!(nvmlGpuInstanceProfileInfo_t, p, { isP2pSupported: 0 });
        // SAFETY: out-pointer contract.
        unsafe { put(info, value) }
    })
}

/// `nvmlDeviceGetGpuInstanceProfileInfoV`: accepts the v2 and v3 structs, told apart by `version`.
///
/// # Safety
/// `info` is null or valid for reads and writes of the struct its `version` names.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> Ret {
    guard(|| {
        let (_, _, model) = mig_gpu(device)?;
        let info = non_null(info)?;
        // SAFETY: every version starts with the version field.
        let version = unsafe { (*info).version };
        let p = profile_at(model, profile)?;
        // SAFETY: all-zero is valid for these plain-data structs.
        let mut name = unsafe { std::mem::zeroed::<nvmlGpuInstanceProfileInfo_v2_t>() }.name;
        fill(&mut name, &format!("MIG {}", p.name));
        if version == struct_version::<nvmlGpuInstanceProfileInfo_v2_t>(2) {
            let value = gpu_instance_profile_info!(nvmlGpuInstanceProfileInfo_v2_t, p, {
                version,
                isP2pSupported: 0,
                name,
            });
            // SAFETY: the caller declared a v2 struct.
            unsafe { put(info, value) }
        } else if version == struct_version::<nvmlGpuInstanceProfileInfo_v3_t>(3) {
            let value = gpu_instance_profile_info!(nvmlGpuInstanceProfileInfo_v3_t, p, {
                version,
                name,
                capabilities: 0,
            });
            // SAFETY: the caller declared a v3 struct.
            unsafe { put(info.cast::<nvmlGpuInstanceProfileInfo_v3_t>(), value) }
        } else {
            Err(ARGUMENT_VERSION_MISMATCH)
        }
    })
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`: every placement of a profile (by unique id),
/// whether or not it is free. A null `placements` asks for the count.
///
/// # Safety
/// See the module contract in `ffi`; `placements` is valid for `*count` writes.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> Ret {
    guard(|| {
        let (_, _, model) = mig_gpu(device)?;
        let count = non_null(count)?;
        let p = model.profile_by_id(profile_id).ok_or(INVALID_ARGUMENT)?;
        let n = p.placements.len() as c_uint;
        if placements.is_null() {
            // SAFETY: checked non-null.
            return unsafe { put(count, n) };
        }
        // SAFETY: checked non-null; the caller's count is its capacity.
        if unsafe { *count } < n {
            // SAFETY: as above.
            unsafe { put(count, n) }?;
            return Err(INSUFFICIENT_SIZE);
        }
        for (i, &start) in p.placements.iter().enumerate() {
            let value = nvmlGpuInstancePlacement_t { start, size: p.memory_slices };
            // SAFETY: i < n <= capacity.
            unsafe { placements.add(i).write(value) };
        }
        // SAFETY: as above.
        unsafe { put(count, n) }
    })
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements`: same as `_v2`.
///
/// # Safety
/// As for `_v2`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> Ret {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profile_id, placements, count) }
}

/// `nvmlDeviceGetGpuInstanceRemainingCapacity`: how many more instances of a profile fit next to the
/// described ones (free placements, taken greedily, within the profile's and the GPU's limits).
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(
    device: nvmlDevice_t,
    profile_id: c_uint,
    count: *mut c_uint,
) -> Ret {
    guard(|| {
        let (node, g, model) = mig_enabled_gpu(device)?;
        let p = model.profile_by_id(profile_id).ok_or(INVALID_ARGUMENT)?;
        let existing = &node.gpu_desc(g).mig.as_ref().ok_or(NOT_SUPPORTED)?.gpu_instances;
        let mut taken: Vec<(u32, u32)> = Vec::new();
        let mut compute_used = 0;
        let mut same = 0;
        for gi in existing {
            if let Some(q) = model.profile_by_name(&gi.profile) {
                taken.push((gi.placement_start, gi.placement_start + q.memory_slices));
                compute_used += q.slices;
                same += u32::from(q.id == p.id);
            }
        }
        let compute_total = model.full_profile().map_or(0, |f| f.slices);
        let mut fits = 0;
        for &start in p.placements {
            let range = (start, start + p.memory_slices);
            if taken.iter().all(|&(s, e)| range.1 <= s || e <= range.0) {
                taken.push(range);
                fits += 1;
            }
        }
        let by_compute = compute_total.saturating_sub(compute_used) / p.slices.max(1);
        let by_count = p.instance_count.saturating_sub(same);
        // SAFETY: out-pointer contract.
        unsafe { put(count, fits.min(by_compute).min(by_count)) }
    })
}

/// `nvmlGpuInstanceGetInfo`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gpu_instance: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> Ret {
    guard(|| {
        let (node, g, gi) = resolve_gi(gpu_instance)?;
        let instance = &node.gpus[g].instances[gi];
        let value = nvmlGpuInstanceInfo_t {
            device: node.gpus[g].handle as nvmlDevice_t,
            id: node.gi_desc(g, gi).id,
            profileId: instance.profile.id,
            placement: nvmlGpuInstancePlacement_t {
                start: node.gi_desc(g, gi).placement_start,
                size: instance.profile.memory_slices,
            },
        };
        // SAFETY: out-pointer contract.
        unsafe { put(info, value) }
    })
}

/// `nvmlGpuInstanceGetComputeInstanceById`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gpu_instance: nvmlGpuInstance_t,
    id: c_uint,
    compute_instance: *mut nvmlComputeInstance_t,
) -> Ret {
    guard(|| {
        let (node, g, gi) = resolve_gi(gpu_instance)?;
        let compute_instance = non_null(compute_instance)?;
        let cis = &node.gpus[g].instances[gi].compute;
        let ci = (0..cis.len()).find(|&ci| node.ci_desc(g, gi, ci).id == id).ok_or(NOT_FOUND)?;
        // SAFETY: out-pointer contract.
        unsafe { put(compute_instance, cis[ci].handle as nvmlComputeInstance_t) }
    })
}

/// `nvmlGpuInstanceGetComputeInstances`: the visible compute instances of one compute profile (by
/// id); the caller's array holds that profile's `instanceCount` entries.
///
/// # Safety
/// See the module contract in `ffi`; `compute_instances` is valid for `instanceCount` writes.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute_instances: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> Ret {
    guard(|| {
        let (node, g, gi) = resolve_gi(gpu_instance)?;
        let (compute_instances, count) = (non_null(compute_instances)?, non_null(count)?);
        let instance = &node.gpus[g].instances[gi];
        let profile = compute_profiles(&node, g, gi)
            .into_iter()
            .find(|p| p.index == profile_id)
            .ok_or(INVALID_ARGUMENT)?;
        let handles: Vec<usize> = instance
            .compute
            .iter()
            .filter(|ci| ci.profile.index == profile.index)
            .map(|ci| ci.handle)
            .take(profile.instance_count as usize)
            .collect();
        for (i, h) in handles.iter().enumerate() {
            // SAFETY: i < instanceCount, the documented capacity of the caller's array.
            unsafe { compute_instances.add(i).write(*h as nvmlComputeInstance_t) };
        }
        // SAFETY: checked non-null.
        unsafe { put(count, handles.len() as c_uint) }
    })
}

fn compute_profiles(node: &Node, g: usize, gi: usize) -> Vec<ComputeInstanceProfile> {
    let instance = &node.gpus[g].instances[gi];
    node.gpus[g].model.map(|m| m.compute_profiles(instance.profile)).unwrap_or_default()
}

fn compute_profile_at(
    node: &Node,
    g: usize,
    gi: usize,
    profile: c_uint,
    eng_profile: c_uint,
) -> Result<ComputeInstanceProfile, Ret> {
    if profile >= sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT
        || eng_profile >= sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT
    {
        return Err(INVALID_ARGUMENT);
    }
    compute_profiles(node, g, gi).into_iter().find(|p| p.index == profile).ok_or(NOT_SUPPORTED)
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfo`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gpu_instance: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> Ret {
    guard(|| {
        let (node, g, gi) = resolve_gi(gpu_instance)?;
        let cp = compute_profile_at(&node, g, gi, profile, eng_profile)?;
        let gp = node.gpus[g].instances[gi].profile;
        let value = compute_instance_profile_info!(nvmlComputeInstanceProfileInfo_t, &cp, gp, {});
        // SAFETY: out-pointer contract.
        unsafe { put(info, value) }
    })
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfoV`: accepts the v2 and v3 structs.
///
/// # Safety
/// `info` is null or valid for reads and writes of the struct its `version` names.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    gpu_instance: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_v2_t,
) -> Ret {
    guard(|| {
        let (node, g, gi) = resolve_gi(gpu_instance)?;
        let info = non_null(info)?;
        // SAFETY: every version starts with the version field.
        let version = unsafe { (*info).version };
        let cp = compute_profile_at(&node, g, gi, profile, eng_profile)?;
        let gp = node.gpus[g].instances[gi].profile;
        // SAFETY: all-zero is valid for this plain-data struct.
        let mut name = unsafe { std::mem::zeroed::<nvmlComputeInstanceProfileInfo_v2_t>() }.name;
        fill(&mut name, &format!("MIG {}", cp.name));
        if version == struct_version::<nvmlComputeInstanceProfileInfo_v2_t>(2) {
            let value = compute_instance_profile_info!(nvmlComputeInstanceProfileInfo_v2_t, &cp, gp, { version, name });
            // SAFETY: the caller declared a v2 struct.
            unsafe { put(info, value) }
        } else if version == struct_version::<nvmlComputeInstanceProfileInfo_v3_t>(3) {
            let value = compute_instance_profile_info!(nvmlComputeInstanceProfileInfo_v3_t, &cp, gp, {
                version,
                name,
                capabilities: 0,
            });
            // SAFETY: the caller declared a v3 struct.
            unsafe { put(info.cast::<nvmlComputeInstanceProfileInfo_v3_t>(), value) }
        } else {
            Err(ARGUMENT_VERSION_MISMATCH)
        }
    })
}

/// `nvmlGpuInstanceGetComputeInstanceRemainingCapacity`: compute slices left in the instance, in units
/// of the profile, within the profile's instance count.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    count: *mut c_uint,
) -> Ret {
    guard(|| {
        let (node, g, gi) = resolve_gi(gpu_instance)?;
        let profiles = compute_profiles(&node, g, gi);
        let p = profiles.iter().find(|p| p.index == profile_id).ok_or(INVALID_ARGUMENT)?;
        let described = &node.gi_desc(g, gi).compute_instances;
        let used: u32 = described
            .iter()
            .filter_map(|ci| profiles.iter().find(|q| q.name == ci.profile))
            .map(|q| q.slices)
            .sum();
        let same = described.iter().filter(|ci| ci.profile == p.name).count() as u32;
        let free = node.gpus[g].instances[gi].profile.slices.saturating_sub(used) / p.slices.max(1);
        // SAFETY: out-pointer contract.
        unsafe { put(count, free.min(p.instance_count.saturating_sub(same))) }
    })
}

fn compute_info(node: &Node, g: usize, gi: usize, ci: usize) -> nvmlComputeInstanceInfo_t {
    let c = &node.gpus[g].instances[gi].compute[ci];
    nvmlComputeInstanceInfo_t {
        device: node.gpus[g].handle as nvmlDevice_t,
        gpuInstance: node.gpus[g].instances[gi].handle as nvmlGpuInstance_t,
        id: node.ci_desc(g, gi, ci).id,
        profileId: c.profile.index,
        placement: nvmlComputeInstancePlacement_t { start: c.placement_start, size: c.profile.slices },
    }
}

/// `nvmlComputeInstanceGetInfo_v2`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    compute_instance: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> Ret {
    guard(|| {
        let (node, g, gi, ci) = resolve_ci(compute_instance)?;
        // SAFETY: out-pointer contract.
        unsafe { put(info, compute_info(&node, g, gi, ci)) }
    })
}

/// The first `nvmlComputeInstanceInfo_t`, before `placement` was added.
#[repr(C)]
struct ComputeInstanceInfoV1 {
    device: nvmlDevice_t,
    gpu_instance: nvmlGpuInstance_t,
    id: c_uint,
    profile_id: c_uint,
}

/// `nvmlComputeInstanceGetInfo`: the v1 struct, without placement.
///
/// # Safety
/// `info` is null or valid for a write of the v1 struct (24 bytes on 64-bit).
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlComputeInstanceGetInfo(
    compute_instance: nvmlComputeInstance_t,
    info: *mut ComputeInstanceInfoV1,
) -> Ret {
    guard(|| {
        let (node, g, gi, ci) = resolve_ci(compute_instance)?;
        let full = compute_info(&node, g, gi, ci);
        let value = ComputeInstanceInfoV1 {
            device: full.device,
            gpu_instance: full.gpuInstance,
            id: full.id,
            profile_id: full.profileId,
        };
        // SAFETY: out-pointer contract (v1 layout).
        unsafe { put(info, value) }
    })
}
