//! [`KubeletError`], in a module of its own so that the node's parts (daemons, cgroups, the node
//! itself) can return it without depending on the parent module that declares them.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::HarnessError;
use crate::namespace::NsError;

/// What went wrong on a test node.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// A file-system operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A command could not be run, or failed.
    #[error("{command}: {detail}")]
    Command {
        /// The command line.
        command: String,
        /// How it failed.
        detail: String,
    },
    /// An external build or download the tests need is not in the cache. Tests never build or fetch
    /// it themselves (no Go and no network inside `cargo test`): `./x setup` does, keyed by its inputs.
    #[error(
        "{what} is not built: run `./x setup` (or `bash {}` alone) before the tests; `./x test` does \
         both. `{} --check` found no fresh build in $NVINJECT_CACHE{}",
        script.display(),
        script.display(),
        if detail.is_empty() { String::new() } else { format!(" ({detail})") }
    )]
    NotBuilt {
        /// What is missing, in words.
        what: &'static str,
        /// The script that builds it.
        script: PathBuf,
        /// What `--check` printed, if anything.
        detail: String,
    },
    /// A daemon exited while it was being waited on.
    #[error("{daemon} exited ({status}); its log ends with:\n{log}")]
    Exited {
        /// Which daemon.
        daemon: String,
        /// Its exit status.
        status: String,
        /// The end of its log.
        log: String,
    },
    /// Something did not happen in time.
    #[error("timed out after {waited:?} waiting for {what}{}", if detail.is_empty() { String::new() } else { format!(" (last error: {detail})") })]
    Timeout {
        /// What was awaited.
        what: String,
        /// For how long.
        waited: Duration,
        /// The last error seen while polling, if any.
        detail: String,
    },
    /// Setting up the namespace failed.
    #[error(transparent)]
    Ns(#[from] NsError),
    /// The containerd harness failed, or a CRI call.
    #[error(transparent)]
    Harness(#[from] HarnessError),
    /// Another error, with a daemon's log or other context appended.
    #[error("{source}\n--- {context}")]
    WithContext {
        /// The error.
        source: Box<KubeletError>,
        /// The added context.
        context: String,
    },
}

impl KubeletError {
    /// Appends `context` (a log tail) to the error.
    pub fn with_context(self, context: String) -> Self {
        KubeletError::WithContext { source: Box::new(self), context }
    }
}
