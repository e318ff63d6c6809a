//! The installer: makes a host GPU-ready for containerd and undoes it. It copies nvinject's
//! binaries, writes `/etc/nvinject/config.toml` and the CDI spec, adds the `nvidia` runtime to
//! containerd through a drop-in, renders the Kubernetes manifests and diagnoses a node (`doctor`).
//!
//! Boundary: the host is reached only through a host root (`/` or `/host` in the DaemonSet) and
//! small edges behind traits; the containerd change is planned as a pure function of TOML text
//! ([`containerd::plan`]). It must never leave a file half-written (every write is temp + rename),
//! never restart containerd when the effective configuration did not change, and never remove
//! or rewrite a file someone else changed since we wrote it. `doctor` only reads: it asks the node
//! through [`doctor::DoctorEnv`] and judges what it saw with pure functions.

pub mod cdi;
pub mod containerd;
pub mod containerd_files;
pub mod cri;
pub mod devchar;
pub mod doctor;
pub mod error;
pub mod foreign_specs;
pub mod fsx;
pub mod install;
pub mod lock;
pub mod manifests;
pub mod paths;
pub mod runtime_config;
pub mod service;
pub mod settings;
pub mod state;

pub use error::{Error, Result};
