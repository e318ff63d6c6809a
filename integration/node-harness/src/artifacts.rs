//! Where the harness finds what it runs from this workspace: the probe every test container runs,
//! this build's nvinject binaries as the release image packs them, and the scripts `./x setup`
//! runs to build or fetch what the tests need from outside (containerd builds, the kubelet).
//!
//! Binaries are found or built by package through [`nvinject_simnode::artifacts`], so
//! `NVINJECT_ARTIFACTS_DIR` (another build's profile directory) applies to them as to every other
//! binary the tests run.

use std::path::{Path, PathBuf};

use nvinject_simnode::artifacts::artifact;

use crate::error::{HarnessError, Result};

/// The package whose binary `nvinject-probe` is: the test crate above this harness, which holds
/// what runs inside a container. Found by package at run time (a workspace build), not linked.
pub const PROBE_PACKAGE: &str = "nvinject-integration";

/// `nvinject-probe`, built fresh: what the probe image ([`crate::node::probe_image`]) carries.
pub fn probe() -> PathBuf {
    artifact(PROBE_PACKAGE, "nvinject-probe")
}

/// A script `./x setup` runs, by its path under `integration/` (`scripts/fetch-containerd.sh`,
/// `kubelet/build-kubelet.sh`, `kubelet/fetch-cluster-debs.sh`): the scripts stay there, beside
/// the harness crates that read what they leave in the cache.
pub fn setup_script(relative: &str) -> PathBuf {
    // This crate is `integration/node-harness`.
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir.parent().unwrap_or(crate_dir).join(relative)
}

/// The directory of this workspace build's installer, with the device plugin and `nvinject-cdi`
/// beside it (cargo builds them side by side; a build where they are not is refused), found or
/// built through [`nvinject_simnode::artifacts`]: the `bin_dir` tests pack into the release image
/// ([`nvinject_image_tool::release_image::ReleaseInputs::bin_dir`]). (The shim and the hook the
/// image takes are the static build's, beside the hook: see
/// [`nvinject_image_tool::release_image::ReleaseInputs::hook`].)
pub fn this_build_bin_dir() -> Result<PathBuf> {
    let installer = artifact("nvinject-installer", "nvinject-installer");
    let bin_dir = installer.parent().unwrap_or(Path::new("/")).to_owned();
    for (package, file) in
        [("nvinject-device-plugin", "nvinject-device-plugin"), ("nvinject-cdi-gen", "nvinject-cdi")]
    {
        let found = artifact(package, file);
        if found.parent() != Some(bin_dir.as_path()) {
            return Err(HarnessError::Prerequisite(format!(
                "{} is not built beside the installer in {}",
                found.display(),
                bin_dir.display()
            )));
        }
    }
    Ok(bin_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_scripts_resolve_under_integration() {
        for script in
            ["scripts/fetch-containerd.sh", "kubelet/build-kubelet.sh", "kubelet/fetch-cluster-debs.sh"]
        {
            let path = setup_script(script);
            assert!(path.is_file(), "{} exists", path.display());
            assert!(path.ends_with(Path::new("integration").join(script)), "{}", path.display());
        }
    }
}
