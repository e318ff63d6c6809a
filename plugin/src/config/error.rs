//! The one error type of configuration loading: every refusal names its origin and field.

use std::path::PathBuf;

/// Why a configuration was refused. Every variant says where (file or source, field) and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: cannot read config file: {source}")]
    Read {
        /// The config file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A field is missing, has the wrong type, is unknown, or has a value that is not allowed.
    #[error("{origin}: field `{field}`: {message}")]
    Field {
        /// Where the value came from: the config file path, or the flag/environment variable.
        origin: String,
        /// Path of the field, e.g. `sharing.timeSlicing.resources[0].replicas`.
        field: String,
        /// What is wrong and how to fix it.
        message: String,
    },
}

impl ConfigError {
    pub(super) fn field(
        origin: impl Into<String>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ConfigError::Field { origin: origin.into(), field: field.into(), message: message.into() }
    }
}
