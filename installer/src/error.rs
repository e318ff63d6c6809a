//! The installer's error type: every variant names the file, key or service involved and what
//! to do about it.

use std::path::PathBuf;

use crate::containerd::{PlanError, VersionParseError};

/// Why an install, uninstall or check step failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file-system operation failed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// What we tried (`read`, `write`, `rename`, ...).
        op: &'static str,
        /// The path involved (as seen by the installer, host-root prefix included).
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A file or directory under the host root is not what the installer may read or write (a
    /// FIFO, device or directory where a file belongs, too large, or unreachable inside the root).
    #[error("{path}: {source}; {fix}")]
    HostFile {
        /// The host path, with the host root (as the operator sees it).
        path: PathBuf,
        /// What was refused, resolved inside the host root.
        source: nvinject_fsio::root::RootError,
        /// What to do.
        fix: &'static str,
    },
    /// containerd's configuration cannot be planned.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The installed containerd version cannot be told.
    #[error(transparent)]
    Version(#[from] VersionParseError),
    /// The installer's state file is unreadable.
    #[error(
        "{path}: installer state is not readable ({message}); if no nvinject install is present, delete the \
         file and run again"
    )]
    State {
        /// The state file.
        path: PathBuf,
        /// Parser message.
        message: String,
    },
    /// Another installer holds the host lock.
    #[error(
        "another nvinject-installer holds {path} ({holder}); wait for it to finish, or stop it (kubectl \
         delete pod) if it is stuck"
    )]
    Locked {
        /// The lock file.
        path: PathBuf,
        /// What the lock file says about its holder.
        holder: String,
    },
    /// A containerd config source cannot be read, so nothing can be planned (and nothing was
    /// changed).
    #[error("{path}: {message}; nothing was changed")]
    Source {
        /// The file, with the host root.
        path: PathBuf,
        /// What is wrong and what to do.
        message: String,
    },
    /// The host lock cannot be used safely.
    #[error("host lock {path}: {message}")]
    Lock {
        /// The lock file, with the host root.
        path: PathBuf,
        /// What is wrong and what to do.
        message: String,
    },
    /// A file we need to create exists and is not ours.
    #[error("{path} exists and was not written by nvinject-installer: {fix}")]
    NotOurs {
        /// The path.
        path: PathBuf,
        /// What to do.
        fix: &'static str,
    },
    /// A binary to install is missing from the source directory.
    #[error("{path} is missing: the installer image must carry every nvinject binary (or pass --source-dir)")]
    MissingBinary {
        /// The expected source path.
        path: PathBuf,
    },
    /// Restarting containerd failed.
    #[error("restarting containerd ({mode}) failed: {message}")]
    Restart {
        /// The restart mode.
        mode: &'static str,
        /// What went wrong and what to check.
        message: String,
    },
    /// containerd did not answer on its socket in time.
    #[error(
        "containerd did not answer on {socket} within {waited_s}s ({last_error}); check `journalctl -u \
         containerd` (a config error shows there) and the --containerd-socket flag"
    )]
    NotAnswering {
        /// The socket path.
        socket: PathBuf,
        /// How long we waited.
        waited_s: u64,
        /// The last connection error.
        last_error: String,
    },
    /// The CDI spec could not be generated (NVML, the driver root, or the spec's own checks).
    #[error("CDI spec: {0}")]
    Cdi(#[from] nvinject_cdi_gen::GenerateError),
    /// The manifests cannot be rendered.
    #[error("manifests: {0}")]
    Manifest(String),
    /// `/etc/nvinject/config.toml` cannot be produced.
    #[error("runtime config {path}: {message}")]
    RuntimeConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl Error {
    /// Wraps an I/O error with the operation and path.
    pub fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { op, path, source }
    }
}

impl Error {
    /// Wraps an error of an operation resolved inside the host root, with the fix for its kind.
    pub fn host(path: impl Into<PathBuf>) -> impl FnOnce(nvinject_fsio::root::RootError) -> Error {
        let path = path.into();
        move |source| {
            let fix = match source.kind() {
                std::io::ErrorKind::InvalidInput => {
                    "replace it with a regular file (or remove it): the installer reads only regular files under \
                     --host-root and never follows a link out of it"
                }
                std::io::ErrorKind::InvalidData => {
                    "it is far larger than such a file can be: check what it is"
                }
                std::io::ErrorKind::NotFound => {
                    "a link on the way names a missing path inside --host-root: fix or remove the link"
                }
                std::io::ErrorKind::PermissionDenied => "run the installer as root",
                _ => {
                    "links under --host-root are followed inside it and /proc magic links are refused: make the \
                     path a plain file or directory inside the host root"
                }
            };
            Error::HostFile { path, source, fix }
        }
    }
}

/// The installer's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
