//! [`Layout`]: where each part of a simulated node goes. Its own module because both the planner
//! (`plan`) and the builder (`build`) read it, and the planner must not depend on the builder that
//! calls it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::elf::Machine;

/// File in the output directory that marks it as a simulated node (and lists its roots).
pub const MARKER: &str = ".nvinject-simnode";

/// Where each part of the node goes. All paths are absolute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// The output directory (`node.json`, `env`, `xid-events`).
    pub out: PathBuf,
    /// The driver root (`usr/lib/<triple>`, `usr/bin`, `etc`, `run`).
    pub driver_root: PathBuf,
    /// The dev root (`dev/nvidia0`, ...).
    pub dev_root: PathBuf,
    /// The proc root (`driver/nvidia/version`, `devices`, ...).
    pub proc_root: PathBuf,
    /// The sys root (`module/nvidia/version`, `bus/pci/devices`).
    pub sys_root: PathBuf,
}

impl Layout {
    /// The default layout under `out`: `driver/`, and `host/` as dev root with `host/proc` and
    /// `host/sys` beside `host/dev`.
    pub fn new(out: &Path) -> Layout {
        Layout::with_roots(out, None, None, None, None)
    }

    /// The default layout with some roots moved elsewhere. The proc and sys roots default to
    /// `<dev root>/proc` and `<dev root>/sys`, so the dev root reads like a host's `/`.
    pub fn with_roots(
        out: &Path,
        driver_root: Option<&Path>,
        dev_root: Option<&Path>,
        proc_root: Option<&Path>,
        sys_root: Option<&Path>,
    ) -> Layout {
        let dev_root = dev_root.map_or_else(|| out.join("host"), Path::to_owned);
        Layout {
            out: out.to_owned(),
            driver_root: driver_root.map_or_else(|| out.join("driver"), Path::to_owned),
            proc_root: proc_root.map_or_else(|| dev_root.join("proc"), Path::to_owned),
            sys_root: sys_root.map_or_else(|| dev_root.join("sys"), Path::to_owned),
            dev_root,
        }
    }

    /// `node.json`: the description with its paths filled in.
    pub fn node_file(&self) -> PathBuf {
        self.out.join("node.json")
    }

    /// The XID control file.
    pub fn events_file(&self) -> PathBuf {
        self.out.join("xid-events")
    }

    /// Shell lines to source.
    pub fn env_file(&self) -> PathBuf {
        self.out.join("env")
    }

    /// The marker file.
    pub fn marker_file(&self) -> PathBuf {
        self.out.join(MARKER)
    }

    /// The driver's library directory, `usr/lib/<triple>`.
    pub fn lib_dir(&self, machine: Machine) -> PathBuf {
        self.driver_root.join("usr/lib").join(machine.multiarch_triple())
    }

    /// The driver's program directory, `usr/bin`.
    pub fn bin_dir(&self) -> PathBuf {
        self.driver_root.join("usr/bin")
    }

    pub(super) fn roots(&self) -> [&Path; 4] {
        [&self.driver_root, &self.dev_root, &self.proc_root, &self.sys_root]
    }
}
