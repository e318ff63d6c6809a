//! The per-process NVML state: the reference-counted init, the enumerated node, event sets and the
//! last error.
//!
//! One mutex guards it, held only briefly: calls take a shared [`Arc`] of the node (or an event set)
//! and release the lock before doing any work, so a thread blocked in `nvmlEventSetWait_v2` never
//! stalls queries on other threads.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard};

use nvml_wrapper_sys::bindings as sys;
use nvml_wrapper_sys::bindings::nvmlReturn_t;

use crate::devfs::RealDevFs;
use crate::events::EventSet;
use crate::node::Node;
use crate::source::{self, Lookup, RealFiles};

/// Prefix of the stderr line written when a description is unusable.
pub const STDERR_PREFIX: &str = "libnvidia-ml.so.1 (nvinject simulated)";

struct Lib {
    refcount: u32,
    node: Option<Arc<Node>>,
    /// Handle values handed out so far; reused by later inits so handles stay small in number.
    handle_pool: Vec<usize>,
    event_sets: BTreeMap<usize, Arc<EventSet>>,
    last_error: String,
}

static LIB: Mutex<Lib> = Mutex::new(Lib {
    refcount: 0,
    node: None,
    handle_pool: Vec::new(),
    event_sets: BTreeMap::new(),
    last_error: String::new(),
});

fn lib() -> MutexGuard<'static, Lib> {
    // A panic while holding the lock leaves the state consistent (every update is a single
    // assignment), so a poisoned lock is still usable.
    LIB.lock().unwrap_or_else(|e| e.into_inner())
}

/// `nvmlInit*`: the first call reads the description and enumerates; later calls only count.
pub fn init() -> nvmlReturn_t {
    let mut lib = lib();
    if lib.refcount > 0 {
        lib.refcount += 1;
        return sys::nvmlReturn_enum_NVML_SUCCESS;
    }
    let own = source::own_library_path();
    let (description, origin) =
        match source::lookup(source::env_value().as_deref(), own.as_deref(), &RealFiles) {
            Lookup::Found { node, origin } => (node, origin),
            Lookup::Absent(text) => {
                lib.last_error = text;
                return sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
            }
            Lookup::Invalid(e) => return fail(&mut lib, e.to_string()),
        };
    if !description.driver.loaded {
        lib.last_error = format!(
            "{}: field `driver.loaded` is false: the node's kernel driver is not loaded",
            origin.display()
        );
        return sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
    }
    let Lib { handle_pool, .. } = &mut *lib;
    let mut used = 0;
    let mut alloc = || {
        if used == handle_pool.len() {
            // Deliberately leaked: a handle must stay a valid, unique address for the process's life.
            handle_pool.push(Box::into_raw(Box::new(0u64)) as usize);
        }
        used += 1;
        handle_pool[used - 1]
    };
    match Node::build(description, &origin, &RealDevFs, &mut alloc) {
        Ok(node) => {
            lib.node = Some(Arc::new(node));
            lib.refcount = 1;
            lib.last_error.clear();
            sys::nvmlReturn_enum_NVML_SUCCESS
        }
        Err(e) => fail(&mut lib, e.to_string()),
    }
}

/// Records an unusable description and says so once on stderr, as the library's only output.
fn fail(lib: &mut Lib, message: String) -> nvmlReturn_t {
    // stderr may be closed; the message is still kept for nvinjectSimGetLastError.
    let _ = writeln!(std::io::stderr(), "{STDERR_PREFIX}: {message}");
    lib.last_error = message;
    sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN
}

/// `nvmlShutdown`: drops the node when the last init is undone.
pub fn shutdown() -> nvmlReturn_t {
    let mut lib = lib();
    if lib.refcount == 0 {
        return sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
    }
    lib.refcount -= 1;
    if lib.refcount == 0 {
        lib.node = None;
        lib.event_sets.clear();
    }
    sys::nvmlReturn_enum_NVML_SUCCESS
}

/// The node, or `NVML_ERROR_UNINITIALIZED`.
pub fn node() -> Result<Arc<Node>, nvmlReturn_t> {
    lib().node.clone().ok_or(sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED)
}

/// What an unsimulated function answers.
pub fn unsupported() -> nvmlReturn_t {
    let initialized = std::panic::catch_unwind(|| lib().refcount > 0).unwrap_or(false);
    if initialized {
        sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
    } else {
        sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
    }
}

/// Why the last `nvmlInit` failed; empty after a successful one.
pub fn last_error() -> String {
    lib().last_error.clone()
}

/// Creates an event set reading the node's control file from its current end; returns its handle.
pub fn create_event_set() -> Result<usize, nvmlReturn_t> {
    let mut lib = lib();
    let node = lib.node.clone().ok_or(sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED)?;
    let set = Arc::new(EventSet::new(node.description.events_file.as_deref()));
    let handle = Arc::as_ptr(&set) as usize;
    lib.event_sets.insert(handle, set);
    Ok(handle)
}

/// The event set behind `handle` and the node it reports on.
pub fn event_set(handle: usize) -> Result<(Arc<EventSet>, Arc<Node>), nvmlReturn_t> {
    let lib = lib();
    let node = lib.node.clone().ok_or(sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED)?;
    let set = lib.event_sets.get(&handle).cloned().ok_or(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
    Ok((set, node))
}

/// Frees an event set; a thread still waiting on it finishes its wait undisturbed.
pub fn free_event_set(handle: usize) -> Result<(), nvmlReturn_t> {
    let mut lib = lib();
    if lib.refcount == 0 {
        return Err(sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED);
    }
    lib.event_sets.remove(&handle).map(drop).ok_or(sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)
}
