//! What the hook-binary tests share: a bundle on disk and the OCI state runc would hand the hook.

use std::fs;
use std::path::{Path, PathBuf};

/// A bundle under `dir` whose config.json names the empty rootfs `<dir>/bundle/rootfs`; that
/// rootfs and the OCI state file naming the bundle.
pub fn bundle(dir: &Path) -> (PathBuf, PathBuf) {
    let rootfs = dir.join("bundle/rootfs");
    fs::create_dir_all(&rootfs).unwrap();
    fs::write(dir.join("bundle/config.json"), r#"{"root":{"path":"rootfs"}}"#).unwrap();
    let state = dir.join("state.json");
    fs::write(
        &state,
        format!(r#"{{"ociVersion":"1.0.2","id":"c1","pid":1,"bundle":"{}"}}"#, dir.join("bundle").display()),
    )
    .unwrap();
    (rootfs, state)
}
