//! Event sets: XIDs injected through the node's control file (see [`crate::events`]).

use std::ffi::{c_uint, c_ulonglong};
use std::time::Duration;

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t};

use super::{INVALID_ARGUMENT, NOT_SUPPORTED, Ret, TIMEOUT, gpu, guard, non_null, put};
use crate::events::{Event, SUPPORTED_TYPES};
use crate::state;

/// `nvmlDeviceGetSupportedEventTypes`: XID critical errors and single/double-bit ECC errors.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    event_types: *mut c_ulonglong,
) -> Ret {
    guard(|| {
        gpu(device)?;
        // SAFETY: out-pointer contract.
        unsafe { put(event_types, SUPPORTED_TYPES) }
    })
}

/// `nvmlEventSetCreate`: a set that reports what is injected from now on.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> Ret {
    guard(|| {
        state::node()?;
        let set = non_null(set)?;
        let handle = state::create_event_set()?;
        // SAFETY: out-pointer contract.
        unsafe { put(set, handle as nvmlEventSet_t) }
    })
}

/// `nvmlDeviceRegisterEvents`: GPUs only; asking for an unsupported type is `NVML_ERROR_NOT_SUPPORTED`.
#[unsafe(no_mangle)]
extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    event_types: c_ulonglong,
    set: nvmlEventSet_t,
) -> Ret {
    guard(|| {
        let (_, g) = gpu(device)?;
        let (set, _) = state::event_set(set as usize)?;
        if event_types & !SUPPORTED_TYPES != 0 {
            return Err(NOT_SUPPORTED);
        }
        set.register(g, event_types);
        Ok(())
    })
}

/// Waits on a set and converts the event for the caller's struct.
fn wait(set: nvmlEventSet_t, timeout_ms: c_uint) -> Result<(Event, nvmlDevice_t), Ret> {
    let (set, node) = state::event_set(set as usize)?;
    let event = set.wait(&node, Duration::from_millis(u64::from(timeout_ms))).ok_or(TIMEOUT)?;
    Ok((event, node.gpus[event.gpu].handle as nvmlDevice_t))
}

/// `nvmlEventSetWait_v2`: the next event for a registered GPU, waiting up to `timeoutms`; an
/// injected XID is returned within a few milliseconds of its line being appended.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeoutms: c_uint,
) -> Ret {
    guard(|| {
        let data = non_null(data)?;
        let (event, device) = wait(set, timeoutms)?;
        let value = nvmlEventData_t {
            device,
            eventType: event.event_type,
            eventData: event.data,
            gpuInstanceId: event.gpu_instance_id,
            computeInstanceId: event.compute_instance_id,
        };
        // SAFETY: out-pointer contract.
        unsafe { put(data, value) }
    })
}

/// The first `nvmlEventData_t`, before the MIG instance ids were added.
#[repr(C)]
struct EventDataV1 {
    device: nvmlDevice_t,
    event_type: c_ulonglong,
    event_data: c_ulonglong,
}

/// `nvmlEventSetWait`: as `_v2`, filling the v1 struct.
///
/// # Safety
/// `data` is null or valid for a write of the v1 struct (24 bytes on 64-bit).
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlEventSetWait(set: nvmlEventSet_t, data: *mut EventDataV1, timeoutms: c_uint) -> Ret {
    guard(|| {
        let data = non_null(data)?;
        let (event, device) = wait(set, timeoutms)?;
        // SAFETY: out-pointer contract (v1 layout).
        unsafe { put(data, EventDataV1 { device, event_type: event.event_type, event_data: event.data }) }
    })
}

/// `nvmlEventSetFree`.
#[unsafe(no_mangle)]
extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> Ret {
    guard(|| {
        if set.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        state::free_event_set(set as usize)
    })
}
