//! cdi-gen: turns what a node has (GPUs through NVML, the driver's files under a driver root) into a
//! complete, deterministic CDI spec for kind `nvidia.com/gpu`, written atomically.
//!
//! Boundary: discovery is the only I/O and happens once, up front; building the spec is a pure
//! function of the discovered inventory. It never edits container specs.
//!
//! Not built yet: tracked by the cdi-gen issue.
