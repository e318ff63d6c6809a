//! What doctor observed on the node, as plain values: the probes ([`super::probe`]) build them,
//! the phases ([`super::phases`]) judge them. Nothing here does I/O. A probe that got no answer
//! is a fact too: [`ProbeError`].

use std::collections::BTreeMap;

use nvinject_gpu::{Inventory, NvmlError};

use crate::containerd::{ConfigSources, ContainerdVersion};
use crate::cri::CriError;
use crate::error::Error;

/// Why a probe got no answer. Each message is what `doctor` prints after its own words.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// NVML could not be loaded or queried.
    #[error(transparent)]
    Nvml(#[from] NvmlError),
    /// A path cannot be reached inside the host root (a link out of it, a FIFO, too large, ...).
    #[error(transparent)]
    Host(Box<Error>),
    /// A file that should be text is not UTF-8.
    #[error("{0} is not UTF-8 text")]
    NotText(String),
    /// containerd's version could not be told, over its socket or from its binary.
    #[error(transparent)]
    Containerd(Box<Error>),
    /// A CRI call on containerd's socket failed.
    #[error(transparent)]
    Cri(#[from] CriError),
    /// The test container's log directory could not be created.
    #[error(transparent)]
    LogDir(Box<Error>),
}

// Every host-root operation's error is a path under the root that cannot be used.
impl From<Error> for ProbeError {
    fn from(e: Error) -> ProbeError {
        ProbeError::Host(Box::new(e))
    }
}

/// The runtimes the running containerd's CRI plugin loaded: handler -> (type, path).
pub type LoadedRuntimes = BTreeMap<String, (String, String)>;

/// Everything observed, phase by phase; `None` where a phase was skipped or not yet reached.
#[derive(Debug, Default)]
pub struct NodeFacts {
    /// The driver phase's observations.
    pub driver: Option<DriverFacts>,
    /// The CDI spec phase's observations.
    pub spec: Option<SpecFacts>,
    /// The containerd phase's observations.
    pub containerd: Option<ContainerdFacts>,
    /// The device plugin phase's observations.
    pub plugin: Option<PluginFacts>,
}

/// The kernel module and NVML.
#[derive(Debug)]
pub enum DriverFacts {
    /// The module version file is missing or cannot be read as text: no module loaded.
    NoModule {
        /// The file (host path), `<sys root>/module/nvidia/version`.
        version_file: String,
    },
    /// A module is loaded; NVML was asked.
    Loaded {
        /// The module's version, the file's first line.
        module: String,
        /// What NVML answered.
        nvml: Result<Inventory, ProbeError>,
    },
}

impl DriverFacts {
    /// The loaded module's version.
    pub fn module(&self) -> Option<&str> {
        match self {
            DriverFacts::NoModule { .. } => None,
            DriverFacts::Loaded { module, .. } => Some(module),
        }
    }

    /// NVML's inventory when it answered with the loaded module's version: the one the spec must
    /// match.
    pub fn matching_inventory(&self) -> Option<&Inventory> {
        match self {
            DriverFacts::Loaded { module, nvml: Ok(inv) } if &inv.driver.version == module => Some(inv),
            _ => None,
        }
    }
}

/// nvinject's CDI spec file.
#[derive(Debug)]
pub struct SpecFacts {
    /// Host path of the spec.
    pub path: String,
    /// Its text; `Ok(None)` when it is missing.
    pub text: Result<Option<String>, ProbeError>,
    /// Why the shim would not trust it (owner or mode of it or a folder above); `None` when it
    /// passes the spec-trust check or is missing.
    pub untrusted: Option<nvinject_cdi::UntrustedError>,
    /// Other tools' spec files where they matter to ours: its directory, and those read after it
    /// ([`crate::foreign_specs`]).
    pub foreign: crate::foreign_specs::Scan,
}

/// containerd: the running daemon and the files it loaded.
#[derive(Debug)]
pub enum ContainerdFacts {
    /// Neither its socket nor its binary told its version.
    Silent(ProbeError),
    /// It answered.
    Answered {
        /// The running containerd's version.
        version: ContainerdVersion,
        /// What its configuration says, or why the files cannot be read.
        config: crate::Result<ContainerdConfigFacts>,
    },
}

/// containerd's configuration files and what they point at.
#[derive(Debug)]
pub struct ContainerdConfigFacts {
    /// The files, our drop-in included, in load order.
    pub sources: ConfigSources,
    /// Whether each host path where our runtime's shim may be is an executable file.
    pub executable: BTreeMap<String, bool>,
    /// When containerd's own CDI is on, whether it reads the spec directory; `None` when its CDI
    /// is off (or the files do not say).
    pub reads_cdi_dir: Option<bool>,
    /// The runtimes the CRI plugin loaded.
    pub loaded: Result<LoadedRuntimes, ProbeError>,
}

/// The kubelet's device plugin directory.
#[derive(Debug)]
pub struct PluginFacts {
    /// Host path of the kubelet's registration socket.
    pub kubelet: String,
    /// Whether it answers.
    pub kubelet_answers: bool,
    /// The names of our plugin sockets (`nvinject-*.sock`) that answer, in directory order.
    pub answering: Vec<String>,
    /// The kubelet's checkpoint file, when it is there and text.
    pub checkpoint: Option<String>,
}
