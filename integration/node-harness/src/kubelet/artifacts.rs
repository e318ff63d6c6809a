//! The kubelet's build, found in the cache where `./x setup` left it: [`KubeletArtifacts`] (the
//! kubelet, the pause image, the build stamp), and [`cached_path`], the look-up every cached build
//! (the control plane's and the cluster's Debian packages too) goes through.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::error::KubeletError;

/// The kubelet and the pause image, as built by `integration/kubelet/build-kubelet.sh`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletArtifacts {
    /// The kubelet binary.
    pub kubelet: PathBuf,
    /// The pause image's OCI archive.
    pub pause_tar: PathBuf,
    /// The pause image's name (`localhost/nvinject/pause:3.4`).
    pub pause_image: String,
    /// The build stamp's `key=value` lines (versions, build time, peak memory).
    pub stamp: Vec<(String, String)>,
}

/// The build script, in this crate's source tree.
pub fn build_script() -> PathBuf {
    crate::artifacts::setup_script("kubelet/build-kubelet.sh")
}

/// Finds the cached kubelet and pause image (`build-kubelet.sh --check`: no network, no Go). A missing
/// or stale build is an error naming the command that makes it, not a skip and not a build from inside
/// a test (a four-minute Go build with network access has no place in `cargo test`).
pub fn kubelet_artifacts() -> Result<KubeletArtifacts, KubeletError> {
    let script = build_script();
    let out = cached_path(&script, "the kubelet and control plane (Kubernetes 1.20.2 from Debian's source)")?;
    let kubelet = PathBuf::from(out);
    let dir = kubelet.parent().unwrap_or(Path::new("/")).to_path_buf();
    let stamp_path = dir.join("kubelet.stamp");
    let stamp_text = std::fs::read_to_string(&stamp_path).map_err(|source| KubeletError::Io {
        op: "read",
        path: stamp_path.clone(),
        source,
    })?;
    let stamp = parse_stamp(&stamp_text);
    let pause_image =
        stamp.iter().find(|(k, _)| k == "pause-image").map(|(_, v)| v.clone()).ok_or_else(|| {
            KubeletError::Command {
                command: stamp_path.display().to_string(),
                detail: "no pause-image line".into(),
            }
        })?;
    Ok(KubeletArtifacts { kubelet, pause_tar: dir.join("pause.tar"), pause_image, stamp })
}

/// Runs `bash <script> --check` (the cache scripts' look-up mode: prints the cached path when fresh,
/// else exits 1 without building or fetching) and returns what it printed.
pub fn cached_path(script: &Path, what: &'static str) -> Result<String, KubeletError> {
    let out = Command::new("bash").arg(script).arg("--check").output().map_err(|e| {
        KubeletError::Command { command: format!("bash {} --check", script.display()), detail: e.to_string() }
    })?;
    let printed = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || printed.is_empty() {
        return Err(KubeletError::NotBuilt {
            what,
            script: script.to_path_buf(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(printed)
}

/// Parses the stamp's `key=value` lines.
pub fn parse_stamp(text: &str) -> Vec<(String, String)> {
    text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_lines_become_pairs_and_values_keep_equals_signs() {
        let s = parse_stamp("kubelet-version=v1.20.2\nsource=kubernetes 1.20.5 from x=y\nnot a pair\n");
        assert_eq!(
            s,
            [
                ("kubelet-version".to_owned(), "v1.20.2".to_owned()),
                ("source".to_owned(), "kubernetes 1.20.5 from x=y".to_owned())
            ]
        );
    }

    #[test]
    fn the_build_script_is_where_the_harness_looks() {
        assert!(build_script().is_file(), "{} missing", build_script().display());
    }

    #[test]
    fn a_missing_build_fails_at_once_naming_the_command_that_makes_it() {
        let dir = tempfile::tempdir().unwrap();
        // A cache script whose --check finds nothing (and which would fail loudly if asked to build).
        let script = dir.path().join("build-thing.sh");
        std::fs::write(&script, "[[ $1 == --check ]] || { echo BUILDING >&2; exit 9; }\nexit 1\n").unwrap();
        let err = cached_path(&script, "the thing").unwrap_err().to_string();
        assert!(err.starts_with("the thing is not built: run `./x setup`"), "{err}");
        assert!(err.contains(&format!("bash {}", script.display())), "{err}");
        // (The message itself says "not built": the marker is what the build branch would print.)
        assert!(!err.contains("BUILDING"), "the script was asked to build: {err}");
    }
}
