//! Writing a spec file atomically: a reader (containerd, the shim) sees the old file or the new
//! one, never a partial one, even if this process dies mid-write. The replacement itself is
//! `nvinject-fsio`'s; this module states how specs are written.
//!
//! The data is flushed before the rename, but the directory is not fsynced after it: the data is
//! on disk before the new name exists, so after a crash the name points at the old complete spec
//! or the new complete one, never at a partial file. Making the rename itself durable would add a
//! second disk flush (4 ms measured on the development VM's disk) for nothing a reader can
//! observe; the shim regenerates a stale spec.

use std::path::Path;

use nvinject_cdi::{Format, Spec};
use nvinject_fsio::{Durability, WriteOptions};

pub use nvinject_fsio::WriteError;

/// File mode of written specs: world-readable, as runtimes running as other users must read them.
pub const SPEC_MODE: u32 = 0o644;

/// How specs are written: [`SPEC_MODE`], data flushed (see the module docs for why not the
/// directory), the spec directory created if missing.
pub const SPEC_WRITE: WriteOptions =
    WriteOptions::new(SPEC_MODE).durability(Durability::File).create_dirs(true);

/// Writes `spec` to `path` in `format`, atomically, creating the directory if needed.
pub fn write_spec(path: &Path, spec: &Spec, format: Format) -> Result<(), WriteError> {
    nvinject_fsio::write_atomic(path, nvinject_cdi::codec::to_string(spec, format).as_bytes(), &SPEC_WRITE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    fn spec(kind: &str) -> Spec {
        Spec {
            cdi_version: "0.6.0".into(),
            kind: kind.parse().unwrap(),
            annotations: Default::default(),
            devices: Vec::new(),
            container_edits: Default::default(),
        }
    }

    #[test]
    fn writes_creates_directories_and_replaces() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("cdi/nvidia.yaml");
        write_spec(&path, &spec("nvidia.com/gpu"), Format::Yaml).unwrap();
        write_spec(&path, &spec("nvidia.com/other"), Format::Yaml).unwrap();
        assert!(fs::read_to_string(&path).unwrap().contains("nvidia.com/other"));
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, SPEC_MODE);
        let names: Vec<_> =
            fs::read_dir(tmp.path().join("cdi")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["nvidia.yaml"], "no temporary file is left behind");
    }

    #[test]
    fn a_failed_write_leaves_the_target_and_no_temporary_file() {
        let tmp = tempfile::tempdir().unwrap();
        // The target is a non-empty directory: rename must fail after the temp file was written.
        let target = tmp.path().join("spec.json");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("keep"), b"x").unwrap();
        let err = write_spec(&target, &spec("nvidia.com/gpu"), Format::Json).unwrap_err();
        assert_eq!(err.step, "rename");
        assert!(err.to_string().starts_with(&format!("cannot write {}: rename failed", target.display())));
        assert!(target.join("keep").exists());
        let names: Vec<_> = fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["spec.json"]);
    }

    #[test]
    fn an_unusable_directory_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("file"), b"").unwrap();
        let err = write_spec(&tmp.path().join("file/nvidia.yaml"), &spec("nvidia.com/gpu"), Format::Yaml)
            .unwrap_err();
        assert_eq!(err.step, "create directory");
        assert!(err.to_string().contains("file exists and is not a directory"), "{err}");
    }
}
