//! The node harness's error type: what was being done, on which path or command, and what came back.

use std::path::PathBuf;

/// A harness step that failed.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
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
    /// A command could not be run or exited unsuccessfully.
    #[error("`{command}` failed ({status}): {output}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status, or why it did not run.
        status: String,
        /// Its stderr (and stdout when relevant).
        output: String,
    },
    /// Something did not happen in time.
    #[error("timed out after {seconds}s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long we waited.
        seconds: u64,
    },
    /// A CRI call failed.
    #[error("CRI {call} on {} failed: {message}", socket.display())]
    Cri {
        /// The RPC.
        call: &'static str,
        /// The runtime's socket.
        socket: PathBuf,
        /// The status code and message, or the transport error.
        message: String,
    },
    /// A precondition of the harness is missing (a binary, root, a kernel feature).
    #[error("missing prerequisite: {0}")]
    Prerequisite(String),
    /// A test image could not be built (`nvinject-image-tool`'s error, as it said it).
    #[error(transparent)]
    Image(#[from] nvinject_image_tool::ImageError),
}

/// The harness's result type.
pub type Result<T, E = HarnessError> = std::result::Result<T, E>;

/// Builds the `Io` variant; for `map_err`.
pub fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> HarnessError {
    let path = path.into();
    move |source| HarnessError::Io { op, path, source }
}
