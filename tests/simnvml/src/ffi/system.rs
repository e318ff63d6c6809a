//! Init, shutdown, error strings and system-wide versions.

use std::ffi::{CStr, c_char, c_int, c_uint};

use super::{Ret, guard, put, put_str};
use crate::state;

/// `nvmlInit_v2`: reference-counted init; the first reads the node description.
#[unsafe(no_mangle)]
extern "C" fn nvmlInit_v2() -> Ret {
    guard(|| match state::init() {
        super::SUCCESS => Ok(()),
        code => Err(code),
    })
}

/// `nvmlInit`: the pre-v2 entry point, same behaviour.
#[unsafe(no_mangle)]
extern "C" fn nvmlInit() -> Ret {
    nvmlInit_v2()
}

/// `nvmlInitWithFlags`: `NVML_INIT_FLAG_NO_GPUS` and `_NO_ATTACH` change nothing here, because init
/// already succeeds without GPUs and attaches to none.
#[unsafe(no_mangle)]
extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    nvmlInit_v2()
}

/// `nvmlShutdown`: undoes one init.
#[unsafe(no_mangle)]
extern "C" fn nvmlShutdown() -> Ret {
    guard(|| match state::shutdown() {
        super::SUCCESS => Ok(()),
        code => Err(code),
    })
}

/// NVML's text for a return code. Codes 0..=20 and 999 are the strings NVIDIA's own fallback table
/// (DCGM's `nvml_error_strings.h`) gives; later codes use the wording NVML prints for them.
pub(super) fn error_string(code: Ret) -> &'static CStr {
    match code {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt Request Issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires reset",
        17 => c"GPU access blocked by the operating system",
        18 => c"Driver/library version mismatch",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        22 => c"The requested vgpu operation is not available on target device, because ECC is enabled",
        23 => c"Insufficient Resources",
        24 => c"Frequency not supported",
        25 => c"Argument version mismatch",
        26 => c"Deprecated",
        27 => c"Not Ready",
        28 => c"GPU not found",
        29 => c"Invalid state",
        30 => c"Reset type not supported",
        _ => c"Unknown Error",
    }
}

/// `nvmlErrorString`: a static string, valid without init.
#[unsafe(no_mangle)]
extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    std::panic::catch_unwind(|| error_string(result)).unwrap_or(c"Unknown Error").as_ptr()
}

/// `nvmlSystemGetDriverVersion`: the description's `driver.version`.
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    guard(|| {
        let node = state::node()?;
        // SAFETY: buffer contract of the caller.
        unsafe { put_str(version, length, &node.description.driver.version) }
    })
}

/// `nvmlSystemGetNVMLVersion`: `<CUDA major>.<driver version>`, NVML's own format (`12.550.54.15`).
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    guard(|| {
        let node = state::node()?;
        let driver = &node.description.driver;
        let text = format!("{}.{}", driver.cuda_version / 1000, driver.version);
        // SAFETY: buffer contract of the caller.
        unsafe { put_str(version, length, &text) }
    })
}

/// `nvmlSystemGetCudaDriverVersion_v2`: `driver.cuda_version` (1000 * major + 10 * minor).
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(cuda_driver_version: *mut c_int) -> Ret {
    guard(|| {
        let node = state::node()?;
        // SAFETY: out-pointer contract of the caller.
        unsafe { put(cuda_driver_version, node.description.driver.cuda_version) }
    })
}

/// `nvmlSystemGetCudaDriverVersion`: same as `_v2` (both read the driver's CUDA version).
///
/// # Safety
/// See the module contract in `ffi`.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(cuda_driver_version: *mut c_int) -> Ret {
    // SAFETY: same contract.
    unsafe { nvmlSystemGetCudaDriverVersion_v2(cuda_driver_version) }
}

/// `nvinjectSimGetLastError`: why the last `nvmlInit` failed (the text also written to stderr for a
/// malformed description); an empty string after a successful init. Valid without init.
///
/// Returns `NVML_ERROR_INSUFFICIENT_SIZE` when `len` cannot hold the message and its NUL.
///
/// # Safety
/// `buf` is null or valid for `len` bytes of writes.
#[unsafe(no_mangle)]
unsafe extern "C" fn nvinjectSimGetLastError(buf: *mut c_char, len: c_uint) -> Ret {
    guard(|| {
        let message = state::last_error();
        // SAFETY: buffer contract of the caller.
        unsafe { put_str(buf, len, &message) }
    })
}

#[cfg(test)]
mod tests {
    use nvml_wrapper_sys::bindings as sys;

    use super::*;

    #[test]
    fn error_strings() {
        assert_eq!(error_string(sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED), c"Driver Not Loaded");
        assert_eq!(error_string(sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN), c"Unknown Error");
        assert_eq!(error_string(12345), c"Unknown Error");
        // SAFETY: nvmlErrorString returns a static NUL-terminated string.
        let s = unsafe { CStr::from_ptr(nvmlErrorString(sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED)) };
        assert_eq!(s, c"Not Supported");
    }
}
