//! The image builder's error type: what was being done, on which path or command, and what came back.

use std::path::PathBuf;

/// An image build step that failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A file-system operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A command (`ldd`, `ldconfig`, `tar`, `strip`, an installer) could not be run or exited
    /// unsuccessfully.
    #[error("`{command}` failed ({status}): {output}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status, or why it did not run.
        status: String,
        /// Its stderr (and stdout when relevant).
        output: String,
    },
    /// An input the image needs is missing or unfit: a binary not built, a dynamically linked hook
    /// or shim, a library `ldd` cannot find, an installer whose manifests name no single image.
    /// The message says what to do.
    #[error("missing prerequisite: {0}")]
    Prerequisite(String),
}

/// The image builder's result type.
pub type Result<T, E = ImageError> = std::result::Result<T, E>;

/// Builds the `Io` variant; for `map_err`.
pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ImageError {
    let path = path.into();
    move |source| ImageError::Io { op, path, source }
}
