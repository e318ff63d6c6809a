//! The XID control file: how a test injects an XID into the simulated NVML.
//!
//! The file named by [`crate::NodeDescription::events_file`] is append-only, one JSON object per
//! line ([`XidEvent`]). Writers append a whole line with one `write(2)` on an `O_APPEND` descriptor,
//! so concurrent writers never interleave. Each NVML event set remembers the file length when it
//! was created and reports only lines appended after that, for the devices registered with it.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// One injected XID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XidEvent {
    /// UUID of the physical GPU (`GPU-...`).
    pub uuid: String,
    /// The XID number (e.g. 79: GPU fallen off the bus; 13: graphics engine exception).
    pub xid: u64,
    /// For an XID inside a MIG instance: its GPU instance id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance_id: Option<u32>,
    /// For an XID inside a MIG instance: its compute instance id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_instance_id: Option<u32>,
}

impl XidEvent {
    /// Parses one line of the control file; `None` for a line that is not an event (ignored).
    pub fn parse_line(line: &str) -> Option<Self> {
        serde_json::from_str(line.trim()).ok()
    }
}

/// Appends `event` to the control file at `path`, creating it if needed.
pub fn inject(path: &Path, event: &XidEvent) -> std::io::Result<()> {
    let mut line = serde_json::to_string(event).map_err(std::io::Error::other)?;
    line.push('\n');
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    // One write call: O_APPEND makes it atomic with respect to other appenders.
    f.write_all(line.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inject_appends_parseable_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("xid-events");
        let a = XidEvent { uuid: "GPU-1".into(), xid: 79, gpu_instance_id: None, compute_instance_id: None };
        let b = XidEvent {
            uuid: "GPU-2".into(),
            xid: 13,
            gpu_instance_id: Some(1),
            compute_instance_id: Some(0),
        };
        inject(&path, &a).unwrap();
        inject(&path, &b).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let parsed: Vec<_> = text.lines().filter_map(XidEvent::parse_line).collect();
        assert_eq!(parsed, vec![a, b]);
    }
}
