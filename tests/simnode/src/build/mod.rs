//! `nvinject-simnode build`: lays out a simulated node from a description.
//!
//! The tree (see tests/simnode/README.md for the map) is planned by the pure [`plan::plan`] and
//! created by [`build`], whose only privileged operations (`mknod`, socket binding, `ldconfig -r`)
//! go through the [`System`] trait; [`HostSystem`] is the real one.
//!
//! Safety rules: the builder writes only under the roots it is given, refuses to build into a
//! non-empty directory it did not make (marked by [`MARKER`]), and with `force` wipes only
//! directories that carry its marker or that the marker records as its own.

pub mod devices;
pub mod driver;
mod layout;
pub mod plan;
pub mod procfs;

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::description::NodeDescription;
use crate::elf::{self, Machine};
use crate::embed;

pub use devices::Majors;
pub use layout::{Layout, MARKER};
pub use plan::Entry;

/// SONAME the simulated NVML must carry.
pub const NVML_SONAME: &str = "libnvidia-ml.so.1";

/// Everything [`build`] needs besides the description.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Where the node goes.
    pub layout: Layout,
    /// Architecture of the stub libraries.
    pub machine: Machine,
    /// The simulated NVML library (`libnvidia_ml.so` as cargo builds it).
    pub nvml_lib: PathBuf,
    /// The `nvidia-smi` stand-in binary.
    pub smi_bin: PathBuf,
    /// The host's `/proc/devices`, to choose majors nothing else uses.
    pub host_proc_devices: PathBuf,
    /// Wipe and rebuild an existing simulated node.
    pub force: bool,
}

/// Why a build failed. Every variant names the path involved.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A file-system operation failed.
    #[error("{path}: cannot {op}: {source}")]
    Io {
        /// Path involved.
        path: PathBuf,
        /// What was being done (`create directory`, `write`, ...).
        op: &'static str,
        /// Underlying error.
        source: io::Error,
    },
    /// `mknod(2)` was refused.
    #[error("{path}: cannot create device nodes: mknod needs root (CAP_MKNOD); run the build as root")]
    MknodDenied {
        /// The device node that could not be made.
        path: PathBuf,
    },
    /// The output directory holds something else.
    #[error(
        "{path}: refusing to build here: the directory is not empty and is not a simulated node (no {MARKER}); \
         choose a new or empty directory"
    )]
    NotASimNode {
        /// The output directory.
        path: PathBuf,
    },
    /// The output directory already holds a node and `force` was not given.
    #[error("{path}: already holds a simulated node; pass --force to wipe and rebuild it")]
    AlreadyBuilt {
        /// The output directory.
        path: PathBuf,
    },
    /// A root outside the output directory is not empty and was not made by an earlier build.
    #[error("{path}: refusing to use as a root: it is not empty and was not made by nvinject-simnode build")]
    RootNotEmpty {
        /// The root.
        path: PathBuf,
    },
    /// A path given as a root or output is relative.
    #[error("{path}: must be an absolute path")]
    RelativePath {
        /// The path.
        path: PathBuf,
    },
    /// The simulated NVML library is missing or is not the right library.
    #[error(
        "{path}: not usable as the simulated NVML: {problem}; build it with `cargo build -p nvinject-simnvml` or pass --nvml-lib"
    )]
    NvmlLib {
        /// The library file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The `nvidia-smi` stand-in is missing.
    #[error(
        "{path}: the nvidia-smi stand-in is missing: {source}; build it with `cargo build -p nvinject-simnode`"
    )]
    SmiBin {
        /// Expected path.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// No free dynamic major is left for `nvidia-uvm` or `nvidia-caps`.
    #[error("{path}: no free character-device major in 234..=254 or 500..=511 for nvidia-uvm/nvidia-caps")]
    NoFreeMajor {
        /// The host's `/proc/devices`.
        path: PathBuf,
    },
    /// The description cannot be laid out.
    #[error("node description: field `{field}`: {message}")]
    Description {
        /// Field path.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// `ldconfig` could not be found.
    #[error(
        "{root}: cannot make etc/ld.so.cache: ldconfig not found in PATH, /sbin or /usr/sbin (Debian package libc-bin)"
    )]
    LdconfigMissing {
        /// The driver root.
        root: PathBuf,
    },
    /// `ldconfig -r` failed.
    #[error("{root}: `ldconfig -r` failed ({status}); it needs root to chroot: {stderr}")]
    LdconfigFailed {
        /// The driver root.
        root: PathBuf,
        /// Exit status.
        status: String,
        /// What ldconfig printed.
        stderr: String,
    },
}

fn io_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> BuildError + 'a {
    move |source| BuildError::Io { path: path.to_owned(), op, source }
}

/// The operations that need privileges or leave the file system: one narrow edge, so tests can
/// inject a refusal.
pub trait System {
    /// Creates a character device node (`mknod(2)` with `S_IFCHR`).
    fn mknod_char(&self, path: &Path, major: u32, minor: u32, mode: u32) -> io::Result<()>;
    /// Creates a unix socket file at `path` (binds a listener and closes it).
    fn bind_socket(&self, path: &Path) -> io::Result<()>;
    /// Runs `ldconfig -r root`.
    fn ldconfig(&self, root: &Path) -> Result<(), BuildError>;
}

/// The real system.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostSystem;

impl System for HostSystem {
    fn mknod_char(&self, path: &Path, major: u32, minor: u32, mode: u32) -> io::Result<()> {
        use nix::sys::stat::{Mode, SFlag, makedev, mknod};
        let dev = makedev(major.into(), minor.into());
        mknod(path, SFlag::S_IFCHR, Mode::from_bits_truncate(mode), dev).map_err(io::Error::from)
    }

    fn bind_socket(&self, path: &Path) -> io::Result<()> {
        use std::os::unix::net::UnixListener;
        match UnixListener::bind(path) {
            Ok(_) => Ok(()),
            // sun_path holds 108 bytes; a deep output directory is reached through the directory's
            // file descriptor instead.
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                use std::os::unix::fs::OpenOptionsExt;
                use std::os::unix::io::AsRawFd;
                let parent = path.parent().ok_or(e)?;
                let name = path.file_name().ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
                let dir = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
                    .open(parent)?;
                let short = Path::new("/proc/self/fd").join(dir.as_raw_fd().to_string()).join(name);
                UnixListener::bind(short).map(drop)
            }
            Err(e) => Err(e),
        }
    }

    fn ldconfig(&self, root: &Path) -> Result<(), BuildError> {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join("ldconfig")).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .chain([PathBuf::from("/sbin/ldconfig"), PathBuf::from("/usr/sbin/ldconfig")])
            .find(|p| p.is_file());
        let Some(ldconfig) = found else { return Err(BuildError::LdconfigMissing { root: root.to_owned() }) };
        let out = Command::new(&ldconfig).arg("-r").arg(root).output().map_err(|source| BuildError::Io {
            path: ldconfig.clone(),
            op: "run",
            source,
        })?;
        if out.status.success() {
            return Ok(());
        }
        Err(BuildError::LdconfigFailed {
            root: root.to_owned(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// The result of a build.
#[derive(Debug, Clone)]
pub struct BuiltNode {
    /// Where everything went.
    pub layout: Layout,
    /// The description as written to `node.json` (paths filled in).
    pub node: NodeDescription,
    /// The dynamic majors chosen.
    pub majors: Majors,
}

/// What the marker records, so that `--force` knows which outside roots are its own.
#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    node: String,
    layout: Layout,
}

/// Builds the simulated node described by `node` into `opts.layout`.
pub fn build(node: &NodeDescription, opts: &BuildOptions, sys: &dyn System) -> Result<BuiltNode, BuildError> {
    let layout = &opts.layout;
    for path in [&layout.out as &Path].into_iter().chain(layout.roots()) {
        if !path.is_absolute() {
            return Err(BuildError::RelativePath { path: path.to_owned() });
        }
    }
    node.validate()
        .map_err(|p| BuildError::Description { field: p.field.clone(), message: p.message.clone() })?;

    // Read every input before touching the output, so a bad input leaves nothing behind.
    let host_devices = std::fs::read_to_string(&opts.host_proc_devices)
        .map_err(io_err(&opts.host_proc_devices, "read the host's device list"))?;
    let majors = devices::choose_majors(&host_devices)
        .ok_or_else(|| BuildError::NoFreeMajor { path: opts.host_proc_devices.clone() })?;
    let nvml_image = read_nvml(&opts.nvml_lib)?;
    std::fs::metadata(&opts.smi_bin)
        .map_err(|source| BuildError::SmiBin { path: opts.smi_bin.clone(), source })?;

    let mut node = node.clone();
    node.dev_root = Some(layout.dev_root.clone());
    node.events_file = Some(layout.events_file());
    let input = plan::PlanInput {
        node: &node,
        layout,
        machine: opts.machine,
        majors,
        nvml_image: &nvml_image,
        smi_bin: &opts.smi_bin,
    };
    let entries = plan::plan(&input);

    prepare(layout, opts.force)?;
    let marker = Marker { node: node.name.clone(), layout: layout.clone() };
    let marker_json = serde_json::to_vec_pretty(&marker).expect("marker serialises");
    write_file(&layout.marker_file(), &marker_json, 0o644)?;
    for entry in &entries {
        apply(entry, sys)?;
    }
    sys.ldconfig(&layout.driver_root)?;
    tracing::info!(
        node = %node.name,
        out = %layout.out.display(),
        gpus = node.gpus.len(),
        entries = entries.len(),
        uvm_major = majors.uvm,
        caps_major = majors.caps,
        "built simulated node"
    );
    Ok(BuiltNode { layout: layout.clone(), node, majors })
}

/// Reads the simulated NVML, checks its SONAME and strips any description an earlier build embedded.
fn read_nvml(path: &Path) -> Result<Vec<u8>, BuildError> {
    let problem = |problem: String| BuildError::NvmlLib { path: path.to_owned(), problem };
    let bytes = std::fs::read(path).map_err(|e| problem(format!("cannot read it: {e}")))?;
    let summary = elf::read_soname(&bytes).map_err(|e| problem(e.to_string()))?;
    if summary.soname.as_deref() != Some(NVML_SONAME) {
        return Err(problem(format!(
            "its SONAME is {}, not {NVML_SONAME}",
            summary.soname.as_deref().unwrap_or("missing")
        )));
    }
    Ok(match embed::split(&bytes) {
        Some((image, _)) => image.to_vec(),
        None => bytes,
    })
}

enum DirState {
    Missing,
    Empty,
    SimNode(Option<Layout>),
    Foreign,
}

fn dir_state(path: &Path) -> Result<DirState, BuildError> {
    let mut entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(DirState::Missing),
        Err(e) => return Err(io_err(path, "read directory")(e)),
    };
    if entries.next().is_none() {
        return Ok(DirState::Empty);
    }
    match std::fs::read(path.join(MARKER)) {
        Ok(bytes) => Ok(DirState::SimNode(serde_json::from_slice::<Marker>(&bytes).ok().map(|m| m.layout))),
        Err(_) => Ok(DirState::Foreign),
    }
}

/// Makes sure the output and every root are new, empty, or (with `force`) our own and wiped.
fn prepare(layout: &Layout, force: bool) -> Result<(), BuildError> {
    match dir_state(&layout.out)? {
        DirState::Missing | DirState::Empty => {}
        DirState::Foreign => return Err(BuildError::NotASimNode { path: layout.out.clone() }),
        DirState::SimNode(_) if !force => return Err(BuildError::AlreadyBuilt { path: layout.out.clone() }),
        DirState::SimNode(previous) => {
            // Roots an earlier build put outside the output directory are ours to wipe too.
            for root in previous.iter().flat_map(|p| p.roots()) {
                if !root.starts_with(&layout.out) && root.is_absolute() && root.components().count() > 2 {
                    remove_tree(root)?;
                }
            }
            remove_tree(&layout.out)?;
        }
    }
    for root in layout.roots() {
        if root.starts_with(&layout.out) {
            continue;
        }
        match dir_state(root)? {
            DirState::Missing | DirState::Empty => {}
            _ => return Err(BuildError::RootNotEmpty { path: root.to_owned() }),
        }
    }
    create_dir(&layout.out, 0o755)
}

fn remove_tree(path: &Path) -> Result<(), BuildError> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(path, "remove")(e)),
        _ => Ok(()),
    }
}

fn create_dir(path: &Path, mode: u32) -> Result<(), BuildError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
        .map_err(io_err(path, "create directory"))?;
    // Set explicitly: the umask must not decide the tree's modes.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io_err(path, "set mode of"))
}

fn create_parent(path: &Path) -> Result<(), BuildError> {
    match path.parent() {
        Some(parent) if !parent.is_dir() => create_dir(parent, 0o755),
        _ => Ok(()),
    }
}

/// Writes through a temporary file in the same directory and renames it into place, so that no
/// reader ever sees a half-written file.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), BuildError> {
    create_parent(path)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, bytes).map_err(io_err(&tmp, "write"))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
        .map_err(io_err(&tmp, "set mode of"))?;
    std::fs::rename(&tmp, path).map_err(io_err(path, "rename into place"))
}

fn apply(entry: &Entry, sys: &dyn System) -> Result<(), BuildError> {
    match entry {
        Entry::Dir { path, mode } => create_dir(path, *mode),
        Entry::File { path, bytes, mode } => write_file(path, bytes, *mode),
        Entry::Copy { from, path, mode } => {
            let bytes = std::fs::read(from).map_err(io_err(from, "read"))?;
            write_file(path, &bytes, *mode)
        }
        Entry::Symlink { path, target } => {
            create_parent(path)?;
            std::os::unix::fs::symlink(target, path).map_err(io_err(path, "create symlink"))
        }
        Entry::CharDevice { path, major, minor, mode } => {
            create_parent(path)?;
            sys.mknod_char(path, *major, *minor, *mode).map_err(|e| match e.raw_os_error() {
                Some(libc::EPERM) | Some(libc::EACCES) => BuildError::MknodDenied { path: path.clone() },
                _ => BuildError::Io { path: path.clone(), op: "create device node", source: e },
            })?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode))
                .map_err(io_err(path, "set mode of"))
        }
        Entry::Socket { path } => {
            create_parent(path)?;
            sys.bind_socket(path).map_err(io_err(path, "bind unix socket"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Makes regular files instead of devices and sockets, or refuses `mknod` like an
    /// unprivileged process.
    struct FakeSystem {
        refuse_mknod: bool,
        mknods: RefCell<Vec<(PathBuf, u32, u32)>>,
    }

    impl System for FakeSystem {
        fn mknod_char(&self, path: &Path, major: u32, minor: u32, _mode: u32) -> io::Result<()> {
            if self.refuse_mknod {
                return Err(io::Error::from_raw_os_error(libc::EPERM));
            }
            self.mknods.borrow_mut().push((path.to_owned(), major, minor));
            std::fs::write(path, b"")
        }
        fn bind_socket(&self, path: &Path) -> io::Result<()> {
            std::fs::write(path, b"")
        }
        fn ldconfig(&self, _root: &Path) -> Result<(), BuildError> {
            Ok(())
        }
    }

    fn options(dir: &Path) -> BuildOptions {
        let nvml = dir.join("libnvidia_ml.so");
        std::fs::write(&nvml, elf::shared_object(Machine::X86_64, NVML_SONAME)).unwrap();
        let smi = dir.join("nvidia-smi");
        std::fs::write(&smi, b"#!/bin/true\n").unwrap();
        let devices = dir.join("devices");
        std::fs::write(&devices, "Character devices:\n  1 mem\n\nBlock devices:\n").unwrap();
        BuildOptions {
            layout: Layout::new(&dir.join("out")),
            machine: Machine::X86_64,
            nvml_lib: nvml,
            smi_bin: smi,
            host_proc_devices: devices,
            force: false,
        }
    }

    fn fake(refuse_mknod: bool) -> FakeSystem {
        FakeSystem { refuse_mknod, mknods: RefCell::new(Vec::new()) }
    }

    #[test]
    fn refused_mknod_names_the_node_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let opts = options(dir.path());
        let node = crate::presets::preset("single").unwrap();
        let err = build(&node, &opts, &fake(true)).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, BuildError::MknodDenied { .. }));
        assert!(text.contains("cannot create device nodes: mknod needs root (CAP_MKNOD)"), "{text}");
        assert!(text.starts_with(&dir.path().join("out/host/dev/nvidia0").display().to_string()), "{text}");
    }

    #[test]
    fn force_rebuilds_our_own_directory_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = options(dir.path());
        let node = crate::presets::preset("single").unwrap();
        let sys = fake(false);
        build(&node, &opts, &sys).unwrap();
        assert_eq!(sys.mknods.borrow()[0], (dir.path().join("out/host/dev/nvidia0"), 195, 0));
        assert!(matches!(build(&node, &opts, &sys), Err(BuildError::AlreadyBuilt { .. })));
        opts.force = true;
        build(&node, &opts, &sys).unwrap();

        // A directory with someone else's files is never wiped, even with force.
        let foreign = dir.path().join("foreign");
        std::fs::create_dir(&foreign).unwrap();
        std::fs::write(foreign.join("precious"), b"keep").unwrap();
        opts.layout = Layout::new(&foreign);
        assert!(matches!(build(&node, &opts, &sys), Err(BuildError::NotASimNode { .. })));
        assert_eq!(std::fs::read(foreign.join("precious")).unwrap(), b"keep");
    }

    #[test]
    fn outside_roots_must_be_empty_unless_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = options(dir.path());
        let driver = dir.path().join("elsewhere/driver");
        std::fs::create_dir_all(&driver).unwrap();
        std::fs::write(driver.join("x"), b"").unwrap();
        opts.layout = Layout::with_roots(&dir.path().join("out"), Some(&driver), None, None, None);
        let node = crate::presets::preset("single").unwrap();
        assert!(matches!(build(&node, &opts, &fake(false)), Err(BuildError::RootNotEmpty { .. })));
        std::fs::remove_file(driver.join("x")).unwrap();
        build(&node, &opts, &fake(false)).unwrap();
        assert!(driver.join("usr/lib/x86_64-linux-gnu/libcuda.so.1").exists());
        // Rebuilding with force wipes the recorded outside root too (it is not empty any more).
        opts.force = true;
        build(&node, &opts, &fake(false)).unwrap();
    }

    #[test]
    fn a_library_with_the_wrong_soname_is_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let opts = options(dir.path());
        std::fs::write(&opts.nvml_lib, elf::shared_object(Machine::X86_64, "libfoo.so.1")).unwrap();
        let err = build(&crate::presets::preset("single").unwrap(), &opts, &fake(false)).unwrap_err();
        assert!(err.to_string().contains("its SONAME is libfoo.so.1, not libnvidia-ml.so.1"), "{err}");
        assert!(!opts.layout.out.exists());
    }
}
