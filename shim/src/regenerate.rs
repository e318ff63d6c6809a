//! Regenerating a stale spec through the cdi-gen library, with the roots the spec recorded.

use std::path::{Path, PathBuf};

use nvinject_cdi::Format;
use nvinject_cdi::nvinject::DEFAULT_HOOK_PATH;
use nvinject_cdi_gen::{GenerateOptions, Nvml, Root, generate, write_spec};

use crate::inject::{Regenerate, RegenerateRequest};

/// The real [`Regenerate`]: NVML discovery and an atomic write by `nvinject-cdi-gen`.
#[derive(Debug, Clone)]
pub struct CdiGenRegenerator {
    /// Where `devices` and `driver/nvidia-caps/mig-minors` are read.
    pub proc_root: PathBuf,
    /// Where `module/nvidia/version` is read.
    pub sys_root: PathBuf,
    /// `regenerate.mps-pipe-dir`: the MPS pipe directory regenerated specs mount, if any.
    pub mps_pipe_dir: Option<PathBuf>,
}

impl Regenerate for CdiGenRegenerator {
    fn regenerate(&self, request: &RegenerateRequest) -> Result<(), String> {
        let driver_root = request.driver_root.clone().unwrap_or_else(|| PathBuf::from("/"));
        let dev_root = request.dev_root.clone().unwrap_or_else(|| PathBuf::from("/"));
        let hook = request.hook_path.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_HOOK_PATH));
        let mut options = GenerateOptions::new(
            Root::same(driver_root),
            Root::same(dev_root),
            self.proc_root.clone(),
            self.sys_root.clone(),
            hook.to_string_lossy().into_owned(),
        );
        options.spec.kind = request.kind.parse().map_err(|e| format!("kind {:?}: {e}", request.kind))?;
        options.nvml_lib = request.nvml_lib.clone();
        options.mps_pipe_dir = self.mps_pipe_dir.clone().map(Root::same);
        let spec = generate(&options, &Nvml).map_err(|e| e.to_string())?;
        let format = Format::from_path(&request.spec_path).unwrap_or(Format::Yaml);
        write_spec(&request.spec_path, &spec, format).map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// The hook path a spec's hooks use (the first one), to keep it when regenerating.
pub fn hook_path_of(spec: &nvinject_cdi::Spec) -> Option<PathBuf> {
    spec.container_edits
        .hooks
        .iter()
        .chain(spec.devices.iter().flat_map(|d| d.container_edits.hooks.iter()))
        .map(|h| Path::new(&h.path).to_owned())
        .next()
}
