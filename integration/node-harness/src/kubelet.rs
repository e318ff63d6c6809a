//! A real kubelet (1.20.2, built from Debian 12's source package by `integration/kubelet/build-kubelet.sh`
//! and cached) running standalone on a test node: static pods from a manifest dir, containerd's CRI as
//! its runtime, no API server. Used inside an isolated test ([`crate::namespace::isolated`]), so its
//! hard-coded host paths and sysctls are shadowed by test directories and the host is untouched.
//!
//! [`kubelet_artifacts`] finds the kubelet and the pause image that `./x setup` built; [`PreparedNode`] and
//! [`KubeNode`] bring up containerd, the kubelet and other daemons and take them down by PID.

mod artifacts;
pub mod cgroup;
pub mod config;
pub mod daemon;
mod error;
pub mod node;
pub mod supervisor;

pub use artifacts::{KubeletArtifacts, build_script, cached_path, kubelet_artifacts, parse_stamp};
pub use config::{ApiServerLink, KubeletSettings, PodContainer, StaticPod};
pub use error::KubeletError;
pub use node::{KubeNode, NodeDirs, NodeOptions, PreparedNode, RunningContainer, ShutdownReport, wait_for};
