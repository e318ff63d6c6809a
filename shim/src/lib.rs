//! The container-start path: `containerd-shim-nvinject-v2`, a task-API proxy in front of containerd's
//! runc shim that applies CDI edits at each container's Create, and `nvinject-hook`, the OCI hook that
//! CDI specs call (symlinks, ld cache).
//!
//! Not built yet: tracked by the shim issue.
