//! nvinject-fsio: the one way nvinject replaces a file that other programs read (containerd's
//! config and our drop-in, CDI specs, a container's config.json, node labels, installer state):
//! the bytes go to a hidden temp file in the same directory and are renamed over the target, so a
//! reader, a crash or a `kill -9` at any moment finds the old file or the new one, never half of one.
//!
//! [`root`] is the other half: reading and writing inside a tree someone else controls (a
//! container's rootfs, an installer's host root) without ever leaving it; [`mount`] bind-mounts
//! into such a tree the same way. [`escape`] is the one way any nvinject binary shows text someone
//! else wrote (names, keys, image paths) in a log line or an error message.
//!
//! Boundary: this crate does the file-system calls of a replacement and nothing else. How durable
//! a write is, which mode it gets, whether directories are made and whether an existing file keeps
//! its mode and owner are the caller's choice ([`WriteOptions`]), because the callers differ on
//! purpose: the shim writes on the container-start hot path to tmpfs and flushes nothing; the
//! installer flushes the file and its directory. It never decides what to write, never leaves a
//! temp file behind on an error it returns, and never removes a temp file a live writer may still
//! rename ([`remove_stale_temps`]).

mod error;
pub mod escape;
pub mod lock;
pub mod mount;
pub mod root;
mod temp;
mod write;

pub use error::WriteError;
pub use temp::remove_stale_temps;
pub use write::{
    Durability, WriteOptions, WriteStep, symlink_atomic, sync_parent_dir, write_atomic, write_atomic_with,
};
