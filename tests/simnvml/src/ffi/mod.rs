//! The exported NVML functions: thin adapters from C arguments to the [`crate::node`] model.
//!
//! Contract shared by every function here, as in NVML: pointers are null or valid for the access the
//! NVML documentation describes (out-pointers for one write of the named type, string buffers for
//! `length` bytes, input strings NUL-terminated). Null out-pointers answer
//! `NVML_ERROR_INVALID_ARGUMENT`, handles not issued by this library likewise; nothing the caller
//! passes is dereferenced before those checks. Every body runs under [`guard`], so a panic becomes
//! `NVML_ERROR_UNKNOWN` instead of unwinding into C.

#![allow(non_snake_case)]

mod device;
mod events;
mod mig;
mod system;
mod topology;

use std::ffi::{CStr, c_char, c_uint};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use nvml_wrapper_sys::bindings as sys;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlPciInfo_t, nvmlReturn_t};

use crate::node::{Node, Object};
use crate::state;

type Ret = nvmlReturn_t;

const SUCCESS: Ret = sys::nvmlReturn_enum_NVML_SUCCESS;
const INVALID_ARGUMENT: Ret = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: Ret = sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const NOT_FOUND: Ret = sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const INSUFFICIENT_SIZE: Ret = sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const TIMEOUT: Ret = sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT;
const UNKNOWN: Ret = sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN;
const ARGUMENT_VERSION_MISMATCH: Ret = sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;

/// Runs an exported function's body: `Ok` is `NVML_SUCCESS`, a panic is `NVML_ERROR_UNKNOWN`.
fn guard(body: impl FnOnce() -> Result<(), Ret>) -> Ret {
    match std::panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => UNKNOWN,
    }
}

/// NVML's versioned-struct tag: `sizeof(struct) | version << 24`.
const fn struct_version<T>(version: u32) -> u32 {
    std::mem::size_of::<T>() as u32 | (version << 24)
}

/// Fails with `NVML_ERROR_INVALID_ARGUMENT` for a null pointer.
fn non_null<T>(p: *mut T) -> Result<*mut T, Ret> {
    if p.is_null() { Err(INVALID_ARGUMENT) } else { Ok(p) }
}

/// Writes one value through an out-pointer.
///
/// # Safety
/// `p` is null or valid for one write of `T`.
unsafe fn put<T>(p: *mut T, value: T) -> Result<(), Ret> {
    let p = non_null(p)?;
    // SAFETY: non-null, and the caller guarantees it is valid for a write of T.
    unsafe { p.write(value) };
    Ok(())
}

/// Copies `s` and a NUL into a caller's buffer of `length` bytes.
///
/// # Safety
/// `buf` is null or valid for `length` bytes of writes.
unsafe fn put_str(buf: *mut c_char, length: c_uint, s: &str) -> Result<(), Ret> {
    let buf = non_null(buf)?;
    let bytes = s.as_bytes();
    if (length as usize) < bytes.len() + 1 {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: the buffer holds `length` >= len + 1 bytes and cannot overlap our own string.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), bytes.len());
        buf.add(bytes.len()).write(0);
    }
    Ok(())
}

/// Reads a caller's NUL-terminated input string.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string that stays valid for the call.
unsafe fn get_str<'a>(p: *const c_char) -> Result<&'a str, Ret> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| INVALID_ARGUMENT)
}

/// Fills a fixed `char[N]` field, truncating and always NUL-terminating.
fn fill(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = *b as c_char;
    }
    if let Some(end) = dst.get_mut(n) {
        *end = 0;
    }
}

/// A device handle resolved: a whole GPU or a MIG device (both NVML indices).
#[derive(Debug, Clone, Copy)]
enum Dev {
    Gpu(usize),
    Mig(usize, usize),
}

impl Dev {
    /// The GPU itself, or the MIG device's parent.
    fn gpu(self) -> usize {
        match self {
            Dev::Gpu(g) | Dev::Mig(g, _) => g,
        }
    }
}

/// The initialised node and what `device` is in it.
fn device(device: nvmlDevice_t) -> Result<(Arc<Node>, Dev), Ret> {
    let node = state::node()?;
    let dev = match node.resolve(device as usize) {
        Some(Object::Gpu { gpu }) => Dev::Gpu(gpu),
        Some(Object::Mig { gpu, mig }) => Dev::Mig(gpu, mig),
        _ => return Err(INVALID_ARGUMENT),
    };
    Ok((node, dev))
}

/// The initialised node and the whole GPU `device` is; MIG handles answer `NVML_ERROR_NOT_SUPPORTED`,
/// as NVML does for queries that only make sense for a physical GPU.
fn gpu(handle: nvmlDevice_t) -> Result<(Arc<Node>, usize), Ret> {
    match device(handle)? {
        (node, Dev::Gpu(g)) => Ok((node, g)),
        (_, Dev::Mig(..)) => Err(NOT_SUPPORTED),
    }
}

/// PCI numbers parsed from a bus id in any of NVML's accepted forms:
/// `DDDDDDDD:BB:DD.F`, `DDDD:BB:DD.F` or `BB:DD.F` (hex, any case).
fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let parts: Vec<&str> = s.trim().split(':').collect();
    let (domain, bus, rest) = match parts.as_slice() {
        [d, b, r] => (u32::from_str_radix(d, 16).ok()?, *b, *r),
        [b, r] => (0, *b, *r),
        _ => return None,
    };
    let (dev, func) = rest.split_once('.')?;
    let hex = |v: &str, max: u32| u32::from_str_radix(v, 16).ok().filter(|&n| n <= max);
    Some((domain, hex(bus, 0xff)?, hex(dev, 0x1f)?, hex(func, 0x7)?))
}

/// NVML's PCI info for a described GPU (bus ids re-rendered in NVML's upper-case formats).
fn pci_info(gpu: &nvinject_simnode::description::GpuDescription) -> nvmlPciInfo_t {
    // Validation guarantees the form; a zero address is the harmless fallback.
    let (domain, bus, dev, func) = parse_bus_id(&gpu.pci_bus_id).unwrap_or_default();
    // SAFETY: nvmlPciInfo_t is plain integers and char arrays, for which all-zero is valid.
    let mut info: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
    info.domain = domain;
    info.bus = bus;
    info.device = dev;
    info.pciDeviceId = gpu.pci_device_id;
    info.pciSubSystemId = gpu.pci_subsystem_id;
    fill(&mut info.busIdLegacy, &format!("{domain:04X}:{bus:02X}:{dev:02X}.{func:X}"));
    fill(&mut info.busId, &format!("{domain:08X}:{bus:02X}:{dev:02X}.{func:X}"));
    info
}

/// The PCI info layout of `nvmlDeviceGetPciInfo` and `_v2` (before the 32-byte bus id).
#[repr(C)]
#[derive(Clone, Copy)]
struct PciInfoLegacy {
    bus_id: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    reserved: [c_uint; 4],
}

fn pci_info_legacy(info: &nvmlPciInfo_t) -> PciInfoLegacy {
    PciInfoLegacy {
        bus_id: info.busIdLegacy,
        domain: info.domain,
        bus: info.bus,
        device: info.device,
        pci_device_id: info.pciDeviceId,
        pci_sub_system_id: info.pciSubSystemId,
        reserved: [0; 4],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_id_forms() {
        assert_eq!(parse_bus_id("00000000:18:00.0"), Some((0, 0x18, 0, 0)));
        assert_eq!(parse_bus_id("0001:AB:1f.7"), Some((1, 0xab, 0x1f, 7)));
        assert_eq!(parse_bus_id("db:00.0"), Some((0, 0xdb, 0, 0)));
        assert_eq!(parse_bus_id("db:00"), None);
        assert_eq!(parse_bus_id("x:y:z.w"), None);
    }

    #[test]
    fn strings_into_buffers() {
        let mut buf = [1 as c_char; 4];
        // SAFETY: buf is 4 bytes.
        assert_eq!(unsafe { put_str(buf.as_mut_ptr(), 4, "abcd") }, Err(INSUFFICIENT_SIZE));
        assert_eq!(unsafe { put_str(buf.as_mut_ptr(), 4, "abc") }, Ok(()));
        assert_eq!(buf, [97, 98, 99, 0]);
        let mut field = [1 as c_char; 3];
        fill(&mut field, "wxyz");
        assert_eq!(field, [119, 120, 0]);
    }

    #[test]
    fn versions_match_nvml_macros() {
        // nvmlMemory_v2 from nvml.h: sizeof(nvmlMemory_v2_t) | 2 << 24, sizeof == 40.
        assert_eq!(struct_version::<sys::nvmlMemory_v2_t>(2), 40 | 2 << 24);
        assert_eq!(std::mem::size_of::<PciInfoLegacy>(), 52);
    }

    #[test]
    fn panics_become_unknown() {
        assert_eq!(guard(|| panic!("boom")), UNKNOWN);
        assert_eq!(guard(|| Err(NOT_FOUND)), NOT_FOUND);
    }
}
