//! The whole pipeline: discover (NVML, driver root, dev root) once, then build the spec.
//!
//! NVML sits behind [`InventorySource`] so the pipeline can be driven by a fixed inventory; the
//! file-system edges take their roots from [`GenerateOptions`].

use std::path::{Path, PathBuf};

use nvinject_cdi::{Spec, validate};
use nvinject_gpu::{Inventory, NvmlError};

use crate::build::{BuildError, Source, SpecChoices, SpecOptions, build_spec};
use crate::devices;
use crate::driver::{self, default_library_dirs, locate_nvml};
use crate::root::Root;

/// `nvinject-cdi <version>`, the `nvinject.io/generated-by` annotation.
pub fn generator_name() -> String {
    format!("nvinject-cdi {}", env!("CARGO_PKG_VERSION"))
}

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
    /// The MPS control daemon's pipe directory, when the node runs MPS (`CUDA_MPS_PIPE_DIRECTORY`
    /// of `nvidia-cuda-mps-control -d`): the spec's `mps` device mounts it writable, with the
    /// same variable, into the containers given that device (the device plugin gives it with the
    /// GPUs of an MPS-shared resource); never into every GPU container. `None` (the default): no
    /// MPS pieces at all.
    pub mps_pipe_dir: Option<Root>,
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
            mps_pipe_dir: None,
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
    /// The configured MPS pipe directory cannot be used.
    #[error(
        "MPS pipe directory {host}{}: {problem}; start the MPS control daemon with \
         CUDA_MPS_PIPE_DIRECTORY={host} first (nvidia-cuda-mps-control -d), or give the directory it \
         uses (--mps-pipe-dir, or regenerate.mps-pipe-dir in /etc/nvinject/config.toml)",
        if lookup == host { String::new() } else { format!(" (looked up at {lookup})") }
    )]
    MpsPipeDir {
        /// The directory as the host and the spec name it.
        host: String,
        /// Where this process looked.
        lookup: String,
        /// What is wrong with it.
        problem: String,
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
            management_version =
                match nvinject_cdi::nvinject::read_driver_version(&opts.sys_root, &opts.proc_root) {
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
    let mps_pipe_dir = opts.mps_pipe_dir.as_ref().map(check_mps_pipe_dir).transpose()?;
    let files = driver::scan(&opts.driver_root.lookup, version, &opts.library_dirs);
    let dev = devices::scan(&opts.dev_root.lookup, &opts.proc_root);
    let spec_opts = SpecOptions {
        choices: opts.spec.clone(),
        host_driver_root: opts.driver_root.host_display(),
        host_dev_root: opts.dev_root.host_display(),
        generator: generator_name(),
        mps_pipe_dir,
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

/// The MPS pipe directory's host path, once it is known to be an existing directory (links
/// followed, as the bind mount will follow them).
fn check_mps_pipe_dir(dir: &Root) -> Result<String, GenerateError> {
    let host = dir.host_display();
    let problem = |problem: String| GenerateError::MpsPipeDir {
        host: host.clone(),
        lookup: dir.lookup.to_string_lossy().into_owned(),
        problem,
    };
    if !dir.host.is_absolute() {
        return Err(problem("not an absolute path".into()));
    }
    if dir.host.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        return Err(problem("`..` is not allowed in it".into()));
    }
    match std::fs::metadata(&dir.lookup) {
        // A writable `/` in every container would hand out the host.
        Ok(meta) if meta.is_dir() && host.trim_end_matches('/').is_empty() => {
            Err(problem("the root directory cannot be shared with containers".into()))
        }
        Ok(meta) if meta.is_dir() => Ok(host.trim_end_matches('/').to_owned()),
        Ok(_) => Err(problem("not a directory".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(problem("does not exist".into())),
        Err(e) => Err(problem(format!("cannot be read: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(dir: Root) -> String {
        check_mps_pipe_dir(&dir).unwrap_err().to_string()
    }

    #[test]
    fn the_mps_pipe_dir_must_be_an_existing_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("mps");
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(check_mps_pipe_dir(&Root::same(&dir)).unwrap(), dir.to_string_lossy());
        // Seen elsewhere by this process: checked there, named as the host names it.
        let host = Root { lookup: dir.clone(), host: "/run/nvidia/mps/".into() };
        assert_eq!(check_mps_pipe_dir(&host).unwrap(), "/run/nvidia/mps");

        let missing = message(Root::same(tmp.path().join("absent")));
        assert!(missing.contains("absent: does not exist; start the MPS control daemon"), "{missing}");
        assert!(missing.contains("regenerate.mps-pipe-dir"), "{missing}");
        let file = tmp.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(message(Root::same(&file)).contains("file: not a directory"));
        let elsewhere = message(Root { lookup: tmp.path().join("absent"), host: "/run/nvidia/mps".into() });
        assert!(elsewhere.starts_with("MPS pipe directory /run/nvidia/mps (looked up at "), "{elsewhere}");
        assert!(message(Root::same("relative/mps")).contains("not an absolute path"));
        assert!(message(Root::same("/tmp/../etc")).contains("`..` is not allowed"));
        assert!(message(Root::same("/")).contains("the root directory cannot be shared"));
        // A link to a directory is followed, as the bind mount follows it.
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(check_mps_pipe_dir(&Root::same(&link)).is_ok());
    }
}
