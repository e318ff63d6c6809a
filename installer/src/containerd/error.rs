//! Why a containerd configuration cannot be planned: [`PlanError`], each variant naming the file
//! and what to change.

use super::version::ContainerdVersion;

/// Why a containerd configuration cannot be planned; each names the file and what to change.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The file is not valid TOML.
    #[error("{path}: not valid TOML: {message}; fix the file (containerd would not start with it either)")]
    Parse {
        /// Host path of the file.
        path: String,
        /// Parser message with line and column.
        message: String,
    },
    /// The `version` header is not 1, 2 or 3.
    #[error("{path}: field `version` is {found}; containerd config versions are 1, 2 and 3")]
    UnknownVersion {
        /// Host path of the file.
        path: String,
        /// The value found, as written.
        found: String,
    },
    /// The config declares a version this containerd cannot read.
    #[error(
        "{path}: `version = {config}` needs containerd 2.x, but containerd is {containerd}; \
         use a version 2 config or upgrade containerd"
    )]
    VersionTooNew {
        /// Host path of the file.
        path: String,
        /// The config version.
        config: u8,
        /// The installed containerd.
        containerd: ContainerdVersion,
    },
    /// A key that must be a table holds something else.
    #[error("{path}: `{key}` must be a table, found {found}; fix that key")]
    NotATable {
        /// Host path of the file.
        path: String,
        /// Dotted key path.
        key: String,
        /// TOML type found.
        found: &'static str,
    },
    /// `imports` is not an array of strings.
    #[error("{path}: `imports` must be an array of file paths (strings); fix that key")]
    BadImports {
        /// Host path of the file.
        path: String,
    },
    /// containerd 1.x replaces a whole plugin section with the last imported one, and a file it
    /// loads after our drop-in defines the CRI section: our runtime would never be loaded.
    #[error(
        "{path} defines the CRI plugin section and containerd {containerd} loads it after nvinject's drop-in \
         {drop_in}; containerd 1.x keeps only the last file's section, so the runtime would be dropped. Move \
         that file's CRI settings into {main} (the drop-in repeats them), or make containerd load the file \
         before the drop-in"
    )]
    DropInOverridden {
        /// Host path of the file loaded after the drop-in.
        path: String,
        /// Host path of our drop-in.
        drop_in: String,
        /// Host path of the main config file.
        main: String,
        /// The installed containerd.
        containerd: ContainerdVersion,
    },
    /// containerd 2.x merges sections key by key, so an existing runtime of the same name would
    /// leak its settings (for example another runtime's `BinaryName`) into ours.
    #[error(
        "{path}: runtime `{handler}` is already defined in `{table}`; containerd {containerd} would merge \
         its settings into nvinject's. Remove that table (left by another GPU runtime installer?) or \
         install under another handler with --handler"
    )]
    HandlerDefined {
        /// Host path of the file defining it.
        path: String,
        /// The dotted table path.
        table: String,
        /// The handler name.
        handler: String,
        /// The installed containerd.
        containerd: ContainerdVersion,
    },
}
