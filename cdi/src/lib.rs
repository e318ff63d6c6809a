//! CDI (Container Device Interface) for nvinject: the spec model, its validation, the registry of
//! spec files in the CDI spec directories, and the application of a device's container edits to an
//! OCI runtime spec.
//!
//! Boundary: pure data handling plus reading spec files. It never discovers hardware (that is
//! `nvinject-gpu` and `nvinject-cdi-gen`) and never talks to containerd (that is the shim).
//!
//! Not built yet: tracked by the cdi-gen and shim issues.
