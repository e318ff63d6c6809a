//! The container-start path: `containerd-shim-nvinject-v2`, a task-API proxy in front of containerd's
//! runc shim that applies CDI edits at each container's Create. The OCI hook that CDI specs call
//! (`nvinject-hook`) is its own crate, `shim/hook`, built statically.
//!
//! Boundary: the proxy forwards every task-API call unchanged except Create, for which it rewrites
//! the bundle's `config.json` (atomically) before forwarding; the runc shim does all container work.
//! It must never alter a container that requested no device, never leave a half-written file, and
//! never panic on input from containerd, a spec file or a container image.

pub mod address;
pub mod capabilities;
pub mod config;
pub mod daemon;
pub mod frame;
pub mod freshness;
pub mod inject;
pub mod inner;
pub mod mount_hook;
pub mod proxy;
pub mod regenerate;
pub mod reply;
pub mod request;
pub mod start;
