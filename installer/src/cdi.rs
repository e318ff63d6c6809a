//! The CDI spec through the cdi-gen library, with host-path rebasing: files are found through
//! the host root, and the spec names them by their host paths.

use std::path::PathBuf;

use nvinject_cdi::codec::Format;
use nvinject_cdi_gen::{GenerateOptions, Nvml, Root, generate};

use crate::error::{Error, Result};
use crate::install::{SpecGenerator, SpecRequest};

/// The production spec generator (NVML + driver root + dev root).
#[derive(Debug, Clone, Copy, Default)]
pub struct CdiGen;

impl SpecGenerator for CdiGen {
    fn generate(&self, r: &SpecRequest) -> Result<Vec<u8>> {
        // cdi-gen resolves paths inside each root it is given; the roots themselves are located
        // inside the host root first, so a link there cannot hand it the installer's own tree.
        let root = |host: &str| -> Result<Root> {
            Ok(Root { lookup: r.host_root.locate(host)?, host: PathBuf::from(host) })
        };
        let mut opts = GenerateOptions::new(
            root(&r.driver_root)?,
            root(&r.dev_root)?,
            r.host_root.locate(&r.proc_root)?,
            r.host_root.locate(&r.sys_root)?,
            r.hook_path.clone(),
        );
        opts.nvml_lib = r.nvml_lib.as_ref().map(|p| r.host_root.locate(p)).transpose()?;
        opts.mps_pipe_dir = r.mps_pipe_dir.as_deref().map(root).transpose()?;
        let spec = generate(&opts, &Nvml).map_err(|e| Error::Cdi(e.to_string()))?;
        Ok(nvinject_cdi::codec::to_string(&spec, Format::Json).into_bytes())
    }
}
