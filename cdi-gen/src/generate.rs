//! The whole pipeline: discover (NVML, driver root, dev root) once, then build the spec.
//!
//! NVML sits behind [`InventorySource`] so the pipeline can be driven by a fixed inventory; the
//! file-system edges take their roots from [`GenerateOptions`].

use std::path::{Path, PathBuf};

use nvinject_cdi::{Spec, validate};
use nvinject_gpu::{Inventory, NvmlError};

use crate::build::{BuildError, Source, SpecChoices, SpecOptions, build_spec};
use crate::driver::{self, default_library_dirs, locate_nvml};
use crate::root::Root;
use crate::{devices, generator_name};

/// Where the GPU list comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// GPUs and MIG devices through NVML.
    Nvml,
    /// No NVML: every NVIDIA device node as one `all` device (for management containers, or when
    /// NVML cannot run).
    Management,
}

/// The NVML edge: gives the inventory.
pub trait InventorySource {
    /// Loads NVML from `library` (the dynamic linker's search when `None`) and reads the inventory.
    fn inventory(&self, library: Option<&Path>) -> Result<Inventory, NvmlError>;
}

/// The real NVML, through `nvinject_gpu::discover`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Nvml;

impl InventorySource for Nvml {
    fn inventory(&self, library: Option<&Path>) -> Result<Inventory, NvmlError> {
        nvinject_gpu::discover(library)
    }
}

/// Everything `generate` needs: roots, discovery and spec options.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// NVML or management mode.
    pub mode: Mode,
    /// The driver root: library, binary, firmware, IPC and config files.
    pub driver_root: Root,
    /// The dev root: `<dev root>/dev/nvidia*`.
    pub dev_root: Root,
    /// Where `devices` and `driver/nvidia-caps/mig-minors` are (this process's view).
    pub proc_root: PathBuf,
    /// Where `module/nvidia/version` is (this process's view).
    pub sys_root: PathBuf,
    /// Library folders inside the driver root, searched in order before the ld.so.cache.
    pub library_dirs: Vec<String>,
    /// NVML library to load; by default `libnvidia-ml.so.1` from the driver root, else the
    /// dynamic linker's.
    pub nvml_lib: Option<PathBuf>,
    /// Kind, naming, hook path, device selection, hooks.
    pub spec: SpecChoices,
}

impl GenerateOptions {
    /// Options with nvidia-ctk's defaults for everything but the roots and the hook path: NVML
    /// mode, the default library folders, kind `nvidia.com/gpu`, index and uuid names, an `all`
    /// device, every device, every hook.
    pub fn new(
        driver_root: Root,
        dev_root: Root,
        proc_root: PathBuf,
        sys_root: PathBuf,
        hook_path: String,
    ) -> Self {
        GenerateOptions {
            mode: Mode::Nvml,
            driver_root,
            dev_root,
            proc_root,
            sys_root,
            library_dirs: default_library_dirs(),
            nvml_lib: None,
            spec: SpecChoices::new(hook_path),
        }
    }
}

/// Why no spec was generated.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// NVML could not be loaded or queried (the message names the library tried).
    #[error(transparent)]
    Nvml(#[from] NvmlError),
    /// Management mode found no driver version.
    #[error(
        "NVIDIA driver version not found: none of {} is readable and no libcuda.so.<version> is in the \
         driver root's library folders; is the nvidia kernel module loaded? Check --sys-root, \
         --proc-root and --driver-root",
        looked.join(", ")
    )]
    DriverVersion {
        /// Files read.
        looked: Vec<String>,
    },
    /// The spec could not be built.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// Our own output failed validation: a bug.
    #[error("the generated spec is invalid, which is a bug in nvinject-cdi (please report it): {0}")]
    Invalid(String),
}

/// Discovers and builds the spec.
pub fn generate(opts: &GenerateOptions, nvml: &dyn InventorySource) -> Result<Spec, GenerateError> {
    let inventory;
    let management_version;
    let (source, version) = match opts.mode {
        Mode::Nvml => {
            let library =
                opts.nvml_lib.clone().or_else(|| locate_nvml(&opts.driver_root.lookup, &opts.library_dirs));
            tracing::debug!(library = ?library, "loading NVML");
            inventory = nvml.inventory(library.as_deref())?;
            (Source::Nvml(&inventory), inventory.driver.version.as_str())
        }
        Mode::Management => {
            management_version = match devices::read_driver_version(&opts.sys_root, &opts.proc_root) {
                Ok((version, from)) => {
                    tracing::debug!(version, from, "driver version read");
                    version
                }
                Err(looked) => driver::libcuda_version(&opts.driver_root.lookup, &opts.library_dirs)
                    .ok_or(GenerateError::DriverVersion { looked })?,
            };
            (Source::Management { driver_version: &management_version }, management_version.as_str())
        }
    };
    let files = driver::scan(&opts.driver_root.lookup, version, &opts.library_dirs);
    let dev = devices::scan(&opts.dev_root.lookup, &opts.proc_root);
    let spec_opts = SpecOptions {
        choices: opts.spec.clone(),
        host_driver_root: opts.driver_root.host_display(),
        host_dev_root: opts.dev_root.host_display(),
        generator: generator_name(),
    };
    let spec = build_spec(source, &files, &dev, &spec_opts)?;
    let problems = validate(&spec);
    if !problems.is_empty() {
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        return Err(GenerateError::Invalid(text.join("; ")));
    }
    tracing::info!(
        cdi_version = %spec.cdi_version, devices = spec.devices.len(), libraries = files.libraries.len(),
        driver = version, "CDI spec generated"
    );
    Ok(spec)
}
