//! NVML event sets fed by the XID control file (format: `nvinject_simnode::events`).
//!
//! An event set remembers the control file's length when it is created and reports only lines
//! appended later, for GPUs registered with it. Waiting polls the file's length every
//! [`POLL_INTERVAL`], so an injected XID is seen within a few milliseconds, and reads only the new
//! bytes. Each set has its own cursor and lock: a thread blocked in `nvmlEventSetWait_v2` holds no
//! lock that other NVML calls need.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nvinject_simnode::events::XidEvent;
use nvml_wrapper_sys::bindings as sys;

use crate::node::{Node, Object};

/// How often a waiting event set looks at the control file.
pub const POLL_INTERVAL: Duration = Duration::from_millis(4);

/// NVML's "no instance" value for `gpuInstanceId` / `computeInstanceId` of a whole-GPU event.
pub const NO_INSTANCE: u32 = 0xFFFF_FFFF;

/// Event types a GPU reports as supported: what NVIDIA's device plugin registers for health.
pub const SUPPORTED_TYPES: u64 = (sys::nvmlEventTypeXidCriticalError
    | sys::nvmlEventTypeSingleBitEccError
    | sys::nvmlEventTypeDoubleBitEccError) as u64;

/// Reads complete lines appended to the control file since the last read.
#[derive(Debug, Default)]
pub struct XidCursor {
    offset: u64,
    partial: Vec<u8>,
}

impl XidCursor {
    /// A cursor that will report what is appended after `offset` bytes.
    pub fn at(offset: u64) -> Self {
        XidCursor { offset, partial: Vec::new() }
    }

    /// A cursor at the current end of `path` (0 when it does not exist yet).
    pub fn at_end(path: &Path) -> Self {
        Self::at(std::fs::metadata(path).map(|m| m.len()).unwrap_or(0))
    }

    /// Consumes bytes that follow the cursor; returns the events of every line they complete.
    /// Lines that are not events are skipped, as the control file's format says.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<XidEvent> {
        self.offset += bytes.len() as u64;
        self.partial.extend_from_slice(bytes);
        let Some(last_newline) = self.partial.iter().rposition(|&b| b == b'\n') else { return Vec::new() };
        let complete: Vec<u8> = self.partial.drain(..=last_newline).collect();
        String::from_utf8_lossy(&complete).lines().filter_map(XidEvent::parse_line).collect()
    }

    /// Reads whatever was appended to `path` since the last call.
    pub fn poll(&mut self, path: &Path) -> io::Result<Vec<XidEvent>> {
        let len = match std::fs::metadata(path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        if len < self.offset {
            // Truncated or replaced: start over from its beginning.
            *self = Self::at(0);
        }
        if len == self.offset {
            return Ok(Vec::new());
        }
        let mut file = File::open(path)?;
        file.seek(SeekFrom::Start(self.offset))?;
        let mut bytes = Vec::new();
        file.take(len - self.offset).read_to_end(&mut bytes)?;
        Ok(self.feed(&bytes))
    }
}

/// One event as `nvmlEventData_t` carries it; `gpu` is the NVML index of the reporting GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// NVML index of the GPU.
    pub gpu: usize,
    /// `nvmlEventType*` bit.
    pub event_type: u64,
    /// The XID.
    pub data: u64,
    /// GPU instance id, or [`NO_INSTANCE`].
    pub gpu_instance_id: u32,
    /// Compute instance id, or [`NO_INSTANCE`].
    pub compute_instance_id: u32,
}

/// An NVML event set.
#[derive(Debug)]
pub struct EventSet {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    cursor: XidCursor,
    /// NVML GPU index -> registered event mask.
    registered: BTreeMap<usize, u64>,
    pending: VecDeque<Event>,
}

impl EventSet {
    /// A set that reports events appended to `file` from now on.
    pub fn new(file: Option<&Path>) -> Self {
        let cursor = file.map(XidCursor::at_end).unwrap_or_default();
        EventSet {
            inner: Mutex::new(Inner { cursor, registered: BTreeMap::new(), pending: VecDeque::new() }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `mask` to the events reported for GPU `gpu`.
    pub fn register(&self, gpu: usize, mask: u64) {
        *self.lock().registered.entry(gpu).or_default() |= mask;
    }

    /// The next event without waiting, reading the control file once.
    pub fn try_next(&self, node: &Node) -> Option<Event> {
        let mut inner = self.lock();
        if let Some(e) = inner.pending.pop_front() {
            return Some(e);
        }
        let file = node.description.events_file.as_deref()?;
        // An unreadable control file reads as "no events yet"; the next poll tries again.
        let fresh = inner.cursor.poll(file).unwrap_or_default();
        for xid in fresh {
            if let Some(event) = to_event(node, &inner.registered, &xid) {
                inner.pending.push_back(event);
            }
        }
        inner.pending.pop_front()
    }

    /// The next event, waiting up to `timeout`; `None` when none came.
    pub fn wait(&self, node: &Node, timeout: Duration) -> Option<Event> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.try_next(node) {
                return Some(e);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            std::thread::sleep(POLL_INTERVAL.min(deadline - now));
        }
    }
}

/// The event an XID line means for this set, if it names a registered GPU (or one of its MIG devices).
fn to_event(node: &Node, registered: &BTreeMap<usize, u64>, xid: &XidEvent) -> Option<Event> {
    let xid_bit = sys::nvmlEventTypeXidCriticalError as u64;
    let (gpu, gi, ci) = match node.find_uuid(&xid.uuid)? {
        Object::Gpu { gpu } => (gpu, xid.gpu_instance_id, xid.compute_instance_id),
        Object::Mig { gpu, mig } => {
            let m = node.gpus[gpu].mig_devices[mig];
            (gpu, Some(node.gi_desc(gpu, m.gi).id), Some(node.ci_desc(gpu, m.gi, m.ci).id))
        }
        _ => return None,
    };
    if registered.get(&gpu).copied().unwrap_or(0) & xid_bit == 0 {
        return None;
    }
    Some(Event {
        gpu,
        event_type: xid_bit,
        data: xid.xid,
        gpu_instance_id: gi.unwrap_or(NO_INSTANCE),
        compute_instance_id: ci.unwrap_or(NO_INSTANCE),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_returns_only_complete_lines() {
        let mut c = XidCursor::at(0);
        assert!(c.feed(br#"{"uuid":"GPU-1","xid":79}"#).is_empty());
        let events = c.feed(b"\nnot json\n{\"uuid\":\"GPU-2\",");
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].xid, 79);
        let events = c.feed(b"\"xid\":13}\n");
        assert_eq!(events[0].uuid, "GPU-2");
    }

    #[test]
    fn poll_reads_appends_and_survives_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("xid");
        let mut c = XidCursor::at_end(&path);
        assert!(c.poll(&path).unwrap().is_empty());
        let ev = XidEvent { uuid: "GPU-1".into(), xid: 48, gpu_instance_id: None, compute_instance_id: None };
        nvinject_simnode::events::inject(&path, &ev).unwrap();
        assert_eq!(c.poll(&path).unwrap(), vec![ev.clone()]);
        assert!(c.poll(&path).unwrap().is_empty());
        std::fs::write(&path, b"").unwrap();
        assert!(c.poll(&path).unwrap().is_empty());
        nvinject_simnode::events::inject(&path, &ev).unwrap();
        assert_eq!(c.poll(&path).unwrap(), vec![ev]);
    }
}
