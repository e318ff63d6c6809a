//! The simulated GPU node: the only stand-in in nvinject's tests.
//!
//! A node is described in a JSON file ([`NodeDescription`]): its GPUs, MIG instances, NVLink links and
//! driver. Two things are made from a description, both at the level real software sees:
//! - the simulated NVML (`tests/simnvml`, a `libnvidia-ml.so.1` with NVML's C ABI) answers from it;
//! - `nvinject-simnode build` lays out a driver root, a dev root with real character devices and the
//!   proc/sys files a loaded driver exposes.
//!
//! This crate must never be a dependency of production code: nothing outside `tests/` and
//! `integration/` may know that the node is simulated.

pub mod artifacts;
pub mod build;
pub mod description;
pub mod elf;
pub mod embed;
pub mod events;
pub mod mig;
pub mod presets;
// The description's types, apart from its loading and checks, so that `mig` (which `description`
// calls to check MIG layouts) can use them without a cycle; public through `description`.
mod schema;

pub use description::{DescriptionError, NodeDescription};
