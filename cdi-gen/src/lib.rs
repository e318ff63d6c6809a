//! cdi-gen: turns what a node has (GPUs through NVML, the driver's files under a driver root, the
//! device nodes under a dev root) into a complete, deterministic CDI spec for kind `nvidia.com/gpu`,
//! written atomically. The binary `nvinject-cdi` (generate, list, validate) is a thin layer on it;
//! the installer calls [`generate()`] in-process, while the shim and the device plugin run the binary
//! (`nvinject_cdi::nvinject::GenerateInvocation`) to regenerate a stale spec, so NVML stays out of them.
//!
//! Boundary: discovery ([`driver::scan`], [`devices::scan`], NVML through [`InventorySource`]) is
//! the only I/O and happens once, up front, into owned values; [`build::build_spec`] is a pure
//! function of them. This crate never edits container specs, never loads NVML except through
//! `nvinject-gpu`, and never leaves a partially written spec file.

pub mod build;
pub mod cli;
pub mod devices;
pub mod driver;
pub mod generate;
pub mod ldcache;
pub mod naming;
pub mod root;
pub mod write;

pub use build::{BuildError, SpecChoices, SpecOptions, build_spec, inventory_digest};
pub use generate::{GenerateError, GenerateOptions, InventorySource, Mode, Nvml, generate, generator_name};
pub use naming::qualified_name;
pub use root::Root;
pub use write::{WriteError, write_spec};
