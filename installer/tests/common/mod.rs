//! Helpers shared by the installer's integration tests and its benchmark: a fake containerd
//! service, the binaries an installer image carries, and the containerd config fixtures.

#![allow(dead_code)] // each test crate uses a different subset

use std::cell::Cell;
use std::fs;
use std::path::{Path, PathBuf};

use nvinject_installer::containerd::ContainerdVersion;
use nvinject_installer::install::BINARIES;
use nvinject_installer::service::{Containerd, Restarted};
use serde::Deserialize;

/// containerd at a fixed version; restarts are only counted.
pub struct FakeContainerd {
    pub version: ContainerdVersion,
    pub restarts: Cell<u32>,
}

impl FakeContainerd {
    /// `version` as `containerd --version` prints it (or just the number).
    pub fn new(version: &str) -> Self {
        FakeContainerd { version: ContainerdVersion::parse(version).unwrap(), restarts: Cell::new(0) }
    }
}

impl Containerd for FakeContainerd {
    fn version(&self) -> nvinject_installer::Result<ContainerdVersion> {
        Ok(self.version.clone())
    }
    fn restart(&self) -> nvinject_installer::Result<Restarted> {
        self.restarts.set(self.restarts.get() + 1);
        Ok(Restarted::Yes)
    }
}

/// Writes every binary the installer copies into `dir` (which must exist), each with `content(name)`.
pub fn write_binaries(dir: &Path, content: impl Fn(&str) -> Vec<u8>) {
    for (name, _) in BINARIES {
        fs::write(dir.join(name), content(name)).unwrap();
    }
}

/// A fixture's `case.toml`: the containerd version and the request (see `tests/fixtures/`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub containerd: String,
    #[serde(default = "default_handler")]
    pub handler: String,
    #[serde(default)]
    pub set_as_default: bool,
    #[serde(default = "default_main")]
    pub main_path: String,
    #[serde(default = "default_drop_in")]
    pub drop_in_path: String,
    #[serde(default = "default_shim")]
    pub shim_path: String,
    /// Expected runtime mode: "runtime-path" or "shim-type".
    pub mode: Option<String>,
    /// Substrings that must each appear in one warning; no other warnings allowed.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// When set, planning (and so installing) must fail with an error containing this text.
    pub error: Option<String>,
    /// Whether the drop-in directory exists before install (planning does not depend on it).
    #[serde(default = "yes")]
    pub drop_in_dir_exists: bool,
    /// Files the main config imports, in containerd's load order.
    #[serde(default)]
    pub imported: Vec<Imported>,
}

/// One imported file of a fixture.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Imported {
    /// Its host path.
    pub path: String,
    /// The fixture file with its content.
    pub file: String,
    /// containerd loads this file after our drop-in (the files before it must say false).
    #[serde(default)]
    pub after_drop_in: bool,
}

fn default_handler() -> String {
    "nvidia".into()
}
fn default_main() -> String {
    "/etc/containerd/config.toml".into()
}
fn default_drop_in() -> String {
    "/etc/containerd/conf.d/99-nvinject.toml".into()
}
fn default_shim() -> String {
    "/usr/local/nvinject/bin/containerd-shim-nvinject-v2".into()
}
fn yes() -> bool {
    true
}

impl Case {
    /// Reads `<dir>/case.toml`.
    pub fn read(dir: &Path) -> Case {
        let path = dir.join("case.toml");
        toml::from_str(&fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }
}

/// `tests/fixtures`.
pub fn fixtures_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Every fixture directory (one with a `case.toml`), sorted.
pub fn fixture_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(fixtures_root())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("case.toml").exists())
        .collect();
    dirs.sort();
    dirs
}
