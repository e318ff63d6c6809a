//! The per-node tier of nvinject's integration tests: one node's real parts, started, watched and
//! taken down by a test. A private containerd started and stopped by PID ([`containerd`]), a CRI
//! client ([`cri`]), process and mount bookkeeping for cleanup and leak checks ([`process`],
//! [`mounts`]), the nvinject pieces wired together on a simulated GPU node with the probe image that
//! runs in each container ([`node`]), the MPS control daemon's pipe directory played from the host
//! ([`mps`]), hostile images and checks for the security suites ([`attack`], [`rootfs_attack`]), a
//! real kubelet node ([`kubelet`]) inside a test's own mount and network namespaces
//! ([`namespace`]), and where this workspace build's binaries and setup scripts are ([`artifacts`]).
//! Test images are OCI archives written by `nvinject-image-tool`'s [`nvinject_image_tool::image`].
//!
//! Boundary: one node. A control plane, many nodes and their agents are the cluster tier's
//! (`nvinject-cluster-harness`, which builds on this crate); what runs inside a container is the
//! probe's (`nvinject-integration`). It must never touch the host's containerd configuration, stop
//! a process it did not start, or leave a mount behind.

pub mod artifacts;
pub mod attack;
pub mod containerd;
pub mod cri;
pub mod error;
pub mod kubelet;
pub mod mounts;
pub mod mps;
pub mod namespace;
pub mod node;
pub mod process;
pub mod rootfs_attack;

pub use error::{HarnessError, Result};
