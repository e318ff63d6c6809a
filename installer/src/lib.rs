//! The installer: puts nvinject's binaries, config and CDI spec on a host, teaches containerd the
//! `nvidia` runtime through a drop-in, renders the Kubernetes manifests, and diagnoses a node
//! (`doctor`). Uninstall restores what it changed.
//!
//! Not built yet: tracked by the installer issue.
