//! Integration tests on real parts: a private containerd and runc from Debian, the kubelet, and the
//! simulated GPU node. Only the simulated node stands in for hardware.
//!
//! This library is the harness those tests share: a private containerd started and stopped by PID
//! ([`containerd`]), test images built from host binaries ([`image`]), a CRI client ([`cri`]),
//! nvinject's own image ([`release_image`]), process and mount bookkeeping for cleanup and leak
//! checks ([`process`], [`mounts`]), the nvinject pieces wired together on a simulated node
//! ([`node`]), the MPS control daemon's pipe directory played from the host ([`mps`]); a kubelet
//! node ([`kubelet`]) and a one-node cluster around it ([`cluster`]) inside a test's own namespaces
//! ([`namespace`]). It must never touch the host's containerd configuration, stop a process it did
//! not start, or leave a mount behind.

pub mod attack;
pub mod cluster;
pub mod containerd;
pub mod cri;
pub mod error;
pub mod image;
pub mod kubelet;
pub mod mounts;
pub mod mps;
pub mod namespace;
pub mod node;
pub mod process;
pub mod release_image;
pub mod rootfs_attack;

pub use error::{HarnessError, Result};
