//! The installer's state file, as values: every change it made on the host ([`Entry`]: the path,
//! what it is for, the hash of what was there before and of what was written) and whether
//! containerd still owes a restart ([`State`]). Serialized as `state.json`; no I/O here.

use serde::{Deserialize, Serialize};

use crate::paths::{BINARY_LIMIT, CONFIG_LIMIT, FILE_LIMIT};

/// Current state file format.
pub const FORMAT: u32 = 1;

/// What an entry is, which decides how uninstall treats a file changed by someone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// containerd's main config: on conflict our `imports` entry is removed surgically.
    ContainerdMain,
    /// Our drop-in: removed on uninstall whatever its content.
    DropIn,
    /// A binary in our install directory: ours, removed on uninstall.
    Binary,
    /// `/etc/nvinject/config.toml`: kept if an operator edited it.
    RuntimeConfig,
    /// The generated CDI spec.
    CdiSpec,
    /// `/dev/char/<major>:<minor>` link to an NVIDIA device node.
    DevCharLink,
    /// `containerd-shim-nvinject-v2` on containerd's `PATH` (containerd without `runtime_path`).
    ShimLink,
    /// A directory we created.
    Dir,
}

impl Role {
    /// The largest file of this role read back from the host.
    pub fn read_limit(self) -> u64 {
        match self {
            Role::Binary => BINARY_LIMIT,
            Role::CdiSpec => FILE_LIMIT,
            _ => CONFIG_LIMIT,
        }
    }

    /// Whether the entry is one of containerd's files: changing it owes containerd a restart.
    pub fn is_containerds(self) -> bool {
        matches!(self, Role::ContainerdMain | Role::DropIn)
    }

    /// Whether an existing file is backed up before we replace it.
    pub fn backs_up(self) -> bool {
        matches!(self, Role::ContainerdMain | Role::RuntimeConfig | Role::CdiSpec)
    }
}

/// What kind of file-system object an entry describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A regular file (hashes are SHA-256 of the content).
    File,
    /// A directory.
    Dir,
    /// A symbolic link (`after` is the link target).
    Symlink,
}

/// One change on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Host path (without the host-root prefix).
    pub path: String,
    /// File, directory or link.
    pub kind: Kind,
    /// What the entry is for.
    pub role: Role,
    /// SHA-256 of the content before our first change; `None` if the path did not exist.
    pub before: Option<String>,
    /// SHA-256 of what we wrote (link target for links).
    pub after: Option<String>,
    /// File name, in the state directory's `backup/`, of the original bytes.
    pub backup: Option<String>,
}

impl Entry {
    /// Whether the file belongs to nvinject outright, so uninstall removes it even if it changed
    /// since: our drop-in and binaries, and a CDI spec we created (the shim may have regenerated
    /// it after a driver upgrade).
    pub fn owned(&self) -> bool {
        matches!(self.role, Role::DropIn | Role::Binary)
            || (self.role == Role::CdiSpec && self.before.is_none())
    }
}

/// The whole state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    /// Format version.
    pub format: u32,
    /// Changes, in the order they were first made.
    pub entries: Vec<Entry>,
    /// containerd's effective config changed and containerd has not been restarted since: a
    /// run killed after writing the config must still restart it next time.
    #[serde(default)]
    pub restart_pending: bool,
    /// Parents of the state directory that the first save created (`/var/lib` on a bare host
    /// root), outermost first: removed again, when empty, after a complete uninstall. They appear
    /// on the host together with the state file that records them (the ledger's first save).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub created_parents: Vec<String>,
}

impl Default for State {
    fn default() -> Self {
        State { format: FORMAT, entries: Vec::new(), restart_pending: false, created_parents: Vec::new() }
    }
}
