//! PCIe topology and NVLink.
//!
//! Link numbers come from the description's `nvlinks` (see [`crate::node::assign_links`]). A GPU with
//! no links at all answers `NVML_ERROR_NOT_SUPPORTED`, like a board without NVLink; on one with links,
//! numbers below `NVML_NVLINK_MAX_LINKS` that are not connected read as disabled, and numbers at or
//! above it are invalid arguments. MIG handles stand for their parent GPU here.

use std::ffi::c_uint;
use std::sync::Arc;

use nvml_wrapper_sys::bindings as sys;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlEnableState_t, nvmlGpuTopologyLevel_t, nvmlIntNvLinkDeviceType_t,
    nvmlNvLinkCapability_t, nvmlPciInfo_t,
};

use super::{
    INVALID_ARGUMENT, NOT_SUPPORTED, PciInfoLegacy, Ret, guard, non_null, pci_info, pci_info_legacy, put,
};
use crate::node::{MAX_LINKS, Node};

/// The physical GPU behind a device handle.
fn physical(device: nvmlDevice_t) -> Result<(Arc<Node>, usize), Ret> {
    let (node, dev) = super::device(device)?;
    Ok((node, dev.gpu()))
}

/// The description index of the GPU at the far end of `link`, or `None` for an unconnected link.
fn peer(node: &Node, g: usize, link: c_uint) -> Result<Option<usize>, Ret> {
    let links = &node.links[node.gpus[g].desc];
    if links.is_empty() {
        return Err(NOT_SUPPORTED);
    }
    if link as usize >= MAX_LINKS {
        return Err(INVALID_ARGUMENT);
    }
    Ok(links.get(link as usize).copied())
}

/// `nvmlDeviceGetTopologyCommonAncestor`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    device1: nvmlDevice_t,
    device2: nvmlDevice_t,
    path_info: *mut nvmlGpuTopologyLevel_t,
) -> Ret {
    guard(|| {
        let (node, a) = physical(device1)?;
        let (_, b) = physical(device2)?;
        // SAFETY: out-pointer contract.
        unsafe { put(path_info, node.common_ancestor(a, b)) }
    })
}

/// `nvmlDeviceGetTopologyNearestGpus`: the other GPUs whose common ancestor is at `level` or closer.
/// A `*count` of zero asks for the number; otherwise up to `*count` handles are written.
///
/// # Safety
/// See the module contract in `ffi`; `device_array` is valid for `*count` writes.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetTopologyNearestGpus(
    device: nvmlDevice_t,
    level: nvmlGpuTopologyLevel_t,
    count: *mut c_uint,
    device_array: *mut nvmlDevice_t,
) -> Ret {
    guard(|| {
        let (node, g) = physical(device)?;
        let count = non_null(count)?;
        let near: Vec<usize> = (0..node.gpus.len())
            .filter(|&o| o != g && node.common_ancestor(g, o) <= level)
            .map(|o| node.gpus[o].handle)
            .collect();
        // SAFETY: checked non-null; in/out count per the contract.
        let capacity = unsafe { *count } as usize;
        if capacity == 0 {
            // SAFETY: as above.
            return unsafe { put(count, near.len() as c_uint) };
        }
        let device_array = non_null(device_array)?;
        let written = near.len().min(capacity);
        for (i, h) in near.iter().take(written).enumerate() {
            // SAFETY: i < capacity, the caller's array size.
            unsafe { device_array.add(i).write(*h as nvmlDevice_t) };
        }
        // SAFETY: as above.
        unsafe { put(count, written as c_uint) }
    })
}

/// `nvmlDeviceGetNvLinkState`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    is_active: *mut nvmlEnableState_t,
) -> Ret {
    guard(|| {
        let (node, g) = physical(device)?;
        let state = match peer(&node, g, link)? {
            Some(_) => sys::nvmlEnableState_enum_NVML_FEATURE_ENABLED,
            None => sys::nvmlEnableState_enum_NVML_FEATURE_DISABLED,
        };
        // SAFETY: out-pointer contract.
        unsafe { put(is_active, state) }
    })
}

/// `nvmlDeviceGetNvLinkCapability`: an active GPU-to-GPU link offers P2P and P2P atomics (and is
/// valid); system-memory access and SLI bridges are not part of the simulation.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetNvLinkCapability(
    device: nvmlDevice_t,
    link: c_uint,
    capability: nvmlNvLinkCapability_t,
    cap_result: *mut c_uint,
) -> Ret {
    guard(|| {
        let (node, g) = physical(device)?;
        let active = peer(&node, g, link)?.is_some();
        if capability >= sys::nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_COUNT {
            return Err(INVALID_ARGUMENT);
        }
        let offered = matches!(
            capability,
            sys::nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_P2P_SUPPORTED
                | sys::nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_P2P_ATOMICS
                | sys::nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_VALID
        );
        // SAFETY: out-pointer contract.
        unsafe { put(cap_result, c_uint::from(active && offered)) }
    })
}

/// The PCI info of the GPU at the far end of an active link.
fn remote_pci(device: nvmlDevice_t, link: c_uint) -> Result<nvmlPciInfo_t, Ret> {
    let (node, g) = physical(device)?;
    let far = peer(&node, g, link)?.ok_or(NOT_SUPPORTED)?;
    Ok(pci_info(&node.description.gpus[far]))
}

/// `nvmlDeviceGetNvLinkRemotePciInfo_v2`: the peer GPU's PCI info (even when this process cannot see
/// the peer, as the hardware link still exists); an unconnected link answers
/// `NVML_ERROR_NOT_SUPPORTED`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nvmlDevice_t,
    link: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> Ret {
    guard(|| {
        let info = remote_pci(device, link)?;
        // SAFETY: out-pointer contract.
        unsafe { put(pci, info) }
    })
}

/// `nvmlDeviceGetNvLinkRemotePciInfo`: the legacy PCI layout.
///
/// # Safety
/// `pci` is null or valid for a write of the 52-byte legacy `nvmlPciInfo_t`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo(
    device: nvmlDevice_t,
    link: c_uint,
    pci: *mut PciInfoLegacy,
) -> Ret {
    guard(|| {
        let info = remote_pci(device, link)?;
        // SAFETY: out-pointer contract (legacy layout).
        unsafe { put(pci, pci_info_legacy(&info)) }
    })
}

/// `nvmlDeviceGetNvLinkRemoteDeviceType`: links here always end at a GPU.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: nvmlDevice_t,
    link: c_uint,
    device_type: *mut nvmlIntNvLinkDeviceType_t,
) -> Ret {
    guard(|| {
        let (node, g) = physical(device)?;
        peer(&node, g, link)?.ok_or(NOT_SUPPORTED)?;
        // SAFETY: out-pointer contract.
        unsafe { put(device_type, sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU) }
    })
}
