//! containerd configuration: detect what is there, plan the smallest change that adds our
//! runtime, and undo it. Everything here is a pure function of TOML text and versions; reading the
//! files from the host is [`crate::containerd_files`]'s job.
//!
//! Data flows one way through the modules: [`version`] and [`config_version`] (which containerd,
//! which config format) -> [`imports`] (what an `imports` entry covers) -> [`effective`] (the
//! files parsed, and the configuration containerd will run with) -> [`plan`] (the change). This
//! module only declares them and re-exports what callers use.

pub mod config_version;
pub mod effective;
pub mod error;
pub mod imports;
pub mod plan;
pub mod version;

pub use config_version::ConfigVersion;
pub use effective::{
    ConfigSources, EffectiveCdi, EffectiveRuntime, SourceFile, effective_cdi, effective_runtime,
    import_targets,
};
pub use error::PlanError;
pub use plan::{MainChange, Plan, RuntimeMode, RuntimeRequest, plan, remove_import};
pub use version::{ContainerdVersion, VersionParseError};
