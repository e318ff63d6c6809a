//! Notices that the config file changed under a running plugin: a ConfigMap edited by the operator
//! (the kubelet swaps the mounted file's `..data` link on its sync), e.g. time-slicing replicas or
//! the MIG strategy. NVIDIA needs a config-manager sidecar and a SIGHUP for this; here the plugin
//! checks the file's bytes on an interval itself. What a change leads to is the caller's choice:
//! the binary validates the new file and restarts from scratch only when it loads, so a bad edit
//! is reported and the plugin keeps serving what it served.
//!
//! Pure: the caller reads the file and hands over its bytes ([`read`] is the small edge).

use std::path::Path;

/// What one look at the file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigObservation {
    /// Same bytes as the ones the plugin runs with (or as the last rejected ones).
    Unchanged,
    /// New bytes: validate them, then restart with them or [`ConfigWatch::reject`] them.
    Changed,
    /// The file cannot be read now (the kubelet's swap is not atomic for every reader): look again
    /// later; the plugin keeps its configuration.
    Unreadable(String),
}

/// The bytes the plugin started with, and the last ones found invalid.
#[derive(Debug, Clone)]
pub struct ConfigWatch {
    running: Vec<u8>,
    rejected: Option<Vec<u8>>,
}

impl ConfigWatch {
    /// Watches for changes from `running`, the bytes the configuration was loaded from.
    pub fn new(running: Vec<u8>) -> Self {
        ConfigWatch { running, rejected: None }
    }

    /// Compares what the file holds now with the running and the last rejected bytes.
    pub fn observe(&self, now: &std::io::Result<Vec<u8>>) -> ConfigObservation {
        match now {
            Err(e) => ConfigObservation::Unreadable(e.to_string()),
            Ok(bytes) if *bytes == self.running || self.rejected.as_ref() == Some(bytes) => {
                ConfigObservation::Unchanged
            }
            Ok(_) => ConfigObservation::Changed,
        }
    }

    /// Remembers `bytes` as invalid, so the same bad edit is reported once, not every interval.
    pub fn reject(&mut self, bytes: Vec<u8>) {
        self.rejected = Some(bytes);
    }
}

/// The file's bytes, at most `limit` of them (a config is small; a huge file is rejected later by
/// the loader's own size check, with its name).
pub fn read(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(limit).read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_new_bytes_are_a_change_and_a_rejected_edit_is_reported_once() {
        let mut w = ConfigWatch::new(b"version: v1\n".to_vec());
        assert_eq!(w.observe(&Ok(b"version: v1\n".to_vec())), ConfigObservation::Unchanged);
        let edit =
            b"version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}\n";
        assert_eq!(w.observe(&Ok(edit.to_vec())), ConfigObservation::Changed);
        w.reject(edit.to_vec());
        assert_eq!(w.observe(&Ok(edit.to_vec())), ConfigObservation::Unchanged, "reported once");
        assert_eq!(w.observe(&Ok(b"version: v1\n# fixed\n".to_vec())), ConfigObservation::Changed);
        assert_eq!(w.observe(&Ok(b"version: v1\n".to_vec())), ConfigObservation::Unchanged, "edited back");
    }

    #[test]
    fn an_unreadable_file_is_not_a_change() {
        let w = ConfigWatch::new(b"x".to_vec());
        let gone = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        assert!(matches!(w.observe(&Err(gone)), ConfigObservation::Unreadable(m) if m.contains("gone")));
    }

    #[test]
    fn reads_stop_at_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, vec![b'a'; 100]).unwrap();
        assert_eq!(read(&path, 10).unwrap().len(), 10);
        assert!(read(&dir.path().join("missing"), 10).is_err());
    }
}
