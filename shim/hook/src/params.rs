//! `disable-device-node-modification`: the container's view of the driver's
//! `ModifyDeviceFiles` parameter.
//!
//! With `ModifyDeviceFiles: 1` (the driver's default) the CUDA user-space library, when it finds a
//! device node missing or with other permissions, creates or fixes it itself; in a container that
//! is both pointless (the runtime chose the nodes) and a way to reach devices it was not given.
//! NVIDIA's toolkit hides the parameter from containers; so do we: the container reads a private,
//! read-only copy of the host's file with the value set to 0, mounted over its own
//! `/proc/driver/nvidia/params` ([`nvinject_fsio::root::Root::cover_file`]). The host's file is
//! never changed.

use std::path::Path;

use nvinject_fsio::mount::Covered;
use nvinject_fsio::root::Root;

use crate::HookError;

/// The driver's parameters, as the host (and the hook, before pivot_root) sees them.
pub const HOST_PARAMS: &str = "/proc/driver/nvidia/params";

/// Where the container sees them.
pub const CONTAINER_PARAMS: &str = "/proc/driver/nvidia/params";

/// The largest params file read (the driver's is about 1 KB).
const PARAMS_LIMIT: u64 = 64 << 10;

/// The params text with `ModifyDeviceFiles: 1` turned into `0`, or `None` when nothing needs
/// hiding (the value is 0 already, or the line is missing or has another value).
pub fn without_device_node_modification(params: &str) -> Option<String> {
    let mut changed = false;
    let mut out = String::with_capacity(params.len());
    for line in params.lines() {
        match line {
            "ModifyDeviceFiles: 0" => return None,
            "ModifyDeviceFiles: 1" => {
                out.push_str("ModifyDeviceFiles: 0");
                changed = true;
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    changed.then_some(out)
}

/// What [`disable_device_node_modification`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The container now reads `ModifyDeviceFiles: 0`.
    Hidden,
    /// The host has no params file (no NVIDIA driver loaded): nothing to hide.
    NoDriverParams,
    /// The host's value is 0 already (or absent): the container reads it as it is.
    AlreadyOff,
    /// The container's `/proc` has no such file (a procfs without the driver's entries).
    NotInContainer,
    /// The kernel lacks the mount API the private copy needs (Linux < 5.12): left as it is.
    KernelTooOld,
}

/// Covers the container's `/proc/driver/nvidia/params` with the host's `params_file` where it
/// says `ModifyDeviceFiles: 1`, with that value set to 0.
pub fn disable_device_node_modification(root: &Root, params_file: &Path) -> Result<Outcome, HookError> {
    let text = match read_limited(params_file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Outcome::NoDriverParams),
        Err(e) => return Err(HookError::Params { path: params_file.to_owned(), message: e.to_string() }),
    };
    let Some(hidden) = without_device_node_modification(&text) else { return Ok(Outcome::AlreadyOff) };
    match root.cover_file(Path::new(CONTAINER_PARAMS), hidden.as_bytes()) {
        Ok(Covered::Yes) => Ok(Outcome::Hidden),
        Ok(Covered::Missing) => Ok(Outcome::NotInContainer),
        Err(e) if e.error.kind() == std::io::ErrorKind::Unsupported => {
            tracing::warn!(error = %e, "cannot hide ModifyDeviceFiles from the container: this kernel lacks the mount API of Linux 5.12");
            Ok(Outcome::KernelTooOld)
        }
        Err(e) => Err(e.into()),
    }
}

fn read_limited(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?.take(PARAMS_LIMIT).read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARAMS: &str =
        "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n";

    #[test]
    fn only_a_one_becomes_a_zero_and_everything_else_is_kept() {
        assert_eq!(
            without_device_node_modification(PARAMS).as_deref(),
            Some("ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 0\nDeviceFileUID: 0\n")
        );
        assert_eq!(without_device_node_modification(&PARAMS.replace(": 1\nDevice", ": 0\nDevice")), None);
        assert_eq!(without_device_node_modification("RmLogonRC: 1\n"), None, "no such line: nothing to hide");
        assert_eq!(
            without_device_node_modification("ModifyDeviceFiles: 2\n"),
            None,
            "an unknown value is left"
        );
        assert_eq!(without_device_node_modification(""), None);
        // A last line without a newline gets one, as the driver writes every line.
        assert_eq!(
            without_device_node_modification("ModifyDeviceFiles: 1").as_deref(),
            Some("ModifyDeviceFiles: 0\n")
        );
    }

    #[test]
    fn a_host_without_the_file_or_with_the_value_off_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("root")).unwrap();
        let root = Root::open(&dir.path().join("root")).unwrap();
        let missing = dir.path().join("params");
        assert_eq!(disable_device_node_modification(&root, &missing).unwrap(), Outcome::NoDriverParams);
        std::fs::write(&missing, PARAMS.replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0")).unwrap();
        assert_eq!(disable_device_node_modification(&root, &missing).unwrap(), Outcome::AlreadyOff);
        // Needs hiding, but the container root has no such file: nothing is made there.
        std::fs::write(&missing, PARAMS).unwrap();
        assert_eq!(disable_device_node_modification(&root, &missing).unwrap(), Outcome::NotInContainer);
        assert!(!dir.path().join("root/proc").exists());
    }
}
