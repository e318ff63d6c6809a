//! The host probes: everything doctor learns about the node goes through [`DoctorEnv`], and the
//! functions here turn its answers into [`super::facts`]. The phases never touch the host.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nvinject_cdi::trust::{self, Owners, Stat, UntrustedError};
use nvinject_gpu::Inventory;

use super::args::DoctorArgs;
use super::facts::{
    ContainerdConfigFacts, ContainerdFacts, DriverFacts, LoadedRuntimes, PluginFacts, ProbeError, SpecFacts,
};
use super::phases;
use crate::containerd::{self, ConfigSources, ContainerdVersion, EffectiveCdi};
use crate::cri::TestContainer;
use crate::error::{Error, Result};
use crate::foreign_specs::{self, Reader, Scan};
use crate::paths::{FILE_LIMIT, HostDir, HostRoot, host_join};
use crate::service::Containerd;
use crate::settings::Settings;

/// What doctor asks of the node: its files (through the host root) and its services (NVML,
/// containerd, CRI). [`HostEnv`] is the real one; tests give fakes for the services and a temp
/// host root for the files.
pub trait DoctorEnv {
    /// The node's files, read inside the host root.
    fn files(&self) -> &HostFiles;
    /// NVML's inventory, loading `library` (or the dynamic linker's).
    fn inventory(&self, library: Option<&Path>) -> std::result::Result<Inventory, ProbeError>;
    /// The running containerd's version.
    fn containerd_version(&self) -> std::result::Result<ContainerdVersion, ProbeError>;
    /// The runtimes the running containerd's CRI plugin loaded.
    fn cri_runtimes(&self) -> std::result::Result<LoadedRuntimes, ProbeError>;
    /// Runs the test container to completion: (exit code, output).
    fn run_container(&self, request: &TestContainer) -> std::result::Result<(i32, String), ProbeError>;
}

/// Read-only probes of files and sockets under a host root: every path is resolved inside it
/// (links followed there, never out), reads are bounded and never block on a FIFO.
#[derive(Debug, Clone)]
pub struct HostFiles {
    root: HostRoot,
}

impl HostFiles {
    /// Probes under `root`.
    pub fn new(root: HostRoot) -> HostFiles {
        HostFiles { root }
    }

    /// The text of a regular file; `Ok(None)` when it is missing, an error saying why a file that
    /// is there cannot be read (a FIFO, a device, too large, a link out of the root, not UTF-8).
    pub fn text(&self, host_path: &str) -> std::result::Result<Option<String>, ProbeError> {
        match self.root.read(host_path, FILE_LIMIT)? {
            None => Ok(None),
            Some(b) => String::from_utf8(b).map(Some).map_err(|_| ProbeError::NotText(host_path.to_owned())),
        }
    }

    /// Whether the host path is an executable regular file.
    pub fn is_executable(&self, host_path: &str) -> bool {
        self.root
            .metadata(host_path)
            .ok()
            .flatten()
            .is_some_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }

    /// Whether a listener answers on the host socket.
    pub fn socket_answers(&self, host_path: &str) -> bool {
        self.root.locate(host_path).is_ok_and(|p| std::os::unix::net::UnixStream::connect(p).is_ok())
    }

    /// The names in a host directory; none when it cannot be read.
    pub fn names_in(&self, host_dir: &str) -> Vec<String> {
        let entries = self.root.read_dir(host_dir).ok().flatten().unwrap_or_default();
        entries.into_iter().map(|(name, _)| name).collect()
    }

    /// containerd's config files as it loads them, from `main_path` through its imports.
    pub fn containerd_sources(&self, main_path: &str, version: &ContainerdVersion) -> Result<ConfigSources> {
        crate::containerd_files::read_sources(&self.root, main_path, "", version)
    }

    /// When containerd's own CDI is on, whether it reads specs from `cdi_dir` (links on the way
    /// followed inside the root); `None` when its CDI is off or absent.
    pub fn containerd_reads(&self, cdi_dir: &str, cdi: Option<&EffectiveCdi>) -> Option<bool> {
        crate::cdi::containerd_reads(&self.root, cdi_dir, cdi)
    }

    /// Other tools' spec files where they matter to `our_spec` for `readers`, read inside the
    /// host root ([`foreign_specs::scan`]).
    pub fn foreign_specs(&self, our_spec: &str, readers: &[Reader]) -> Scan {
        foreign_specs::scan(&self.root, our_spec, readers)
    }

    /// The spec-trust verdict on the spec file `host_path` as the shim reaches it
    /// ([`nvinject_cdi::trust`]): the file, its folder and every folder above it, as written and as
    /// resolved, all inside the host root; `None` when it passes or is missing (which the phase
    /// reports itself). Owner names come from the host's `/etc/passwd`.
    pub fn spec_trust(&self, host_path: &str, owners: &Owners) -> Option<UntrustedError> {
        let spec = Path::new(host_path);
        let file = self.root.metadata(host_path).ok().flatten()?;
        let dir = spec.parent()?;
        let resolved = self.root.open().ok()?.canonicalize(dir).ok()?;
        let mut folders = Vec::new();
        for (d, role) in trust::folders_of(dir, &resolved) {
            match self.root.metadata(&d.to_string_lossy()) {
                Ok(Some(m)) => folders.push((d, role, Stat::from(&m))),
                Ok(None) => return None,
                Err(e) => {
                    return Some(UntrustedError::Stat {
                        spec: spec.to_owned(),
                        what: d,
                        message: e.to_string(),
                    });
                }
            }
        }
        let verdict = trust::judge_chain(spec, &Stat::from(&file), &folders, owners).err()?;
        let passwd = self.text("/etc/passwd").ok().flatten().unwrap_or_default();
        Some(verdict.with_names_from(&passwd))
    }

    /// The NVML library to load: `--nvml-lib`, else found under the driver root; either way
    /// located inside the host root, so the loader is never handed a path a link sends out of it.
    pub fn nvml_library(&self, settings: &Settings) -> std::result::Result<Option<PathBuf>, ProbeError> {
        if let Some(lib) = &settings.nvml_lib {
            return Ok(Some(self.root.locate(lib)?));
        }
        let driver = self.root.locate(&settings.driver_root)?;
        Ok(nvinject_cdi_gen::driver::locate_nvml(&driver, &nvinject_cdi_gen::driver::default_library_dirs()))
    }
}

/// The kernel module's version file, then NVML when a module is loaded.
pub fn driver(settings: &Settings, env: &dyn DoctorEnv) -> DriverFacts {
    let version_file = host_join(&settings.sys_root, "module/nvidia/version");
    let module = env
        .files()
        .text(&version_file)
        .ok()
        .flatten()
        .map(|t| t.lines().next().unwrap_or("").trim().to_owned());
    match module {
        None => DriverFacts::NoModule { version_file },
        Some(module) => {
            let nvml = env.files().nvml_library(settings).and_then(|lib| env.inventory(lib.as_deref()));
            DriverFacts::Loaded { module, nvml }
        }
    }
}

/// nvinject's spec file, and other tools' specs where they would matter to it.
pub fn spec(settings: &Settings, env: &dyn DoctorEnv) -> SpecFacts {
    let path = settings.spec_path();
    let text = env.files().text(&path);
    // The shim and the device plugin run as root: what they would refuse, doctor reports.
    let untrusted = env.files().spec_trust(&path, &Owners::this_process());
    let foreign = env.files().foreign_specs(&path, &cdi_readers(settings, env));
    SpecFacts { path, text, untrusted, foreign }
}

/// Who resolves CDI names on this node: the shim (the spec dirs of its config file) and, when it
/// is on, containerd's own CDI. A containerd that does not answer, or whose files cannot be read,
/// counts as having none (its phase says why).
fn cdi_readers(settings: &Settings, env: &dyn DoctorEnv) -> Vec<Reader> {
    let config = env.files().text(&settings.runtime_config).ok().flatten();
    let mut readers = vec![foreign_specs::shim_reader(
        config.as_deref(),
        Path::new(&settings.runtime_config),
        crate::runtime_config::shim_spec_dirs(settings),
    )];
    let cdi = env.containerd_version().ok().and_then(|version| {
        let sources = env.files().containerd_sources(&settings.containerd_config, &version).ok()?;
        containerd::effective_cdi(&sources, &version).ok().flatten()
    });
    readers.extend(foreign_specs::containerd_reader(cdi.as_ref()));
    readers
}

/// containerd's version, then its config, the shim our runtime entry names and what its CRI
/// plugin loaded.
pub fn containerd(settings: &Settings, env: &dyn DoctorEnv) -> ContainerdFacts {
    let version = match env.containerd_version() {
        Ok(v) => v,
        Err(e) => return ContainerdFacts::Silent(e),
    };
    let config = env.files().containerd_sources(&settings.containerd_config, &version).map(|sources| {
        let mut executable = BTreeMap::new();
        let mut reads_cdi_dir = None;
        // Where to look follows from the files; a file that does not parse is the phase's finding.
        if let Ok(Some(runtime)) = containerd::effective_runtime(&sources, &version, &settings.handler) {
            for path in phases::ShimLookup::of(settings, &runtime).candidates() {
                let found = env.files().is_executable(&path);
                executable.insert(path, found);
            }
        }
        if let Ok(cdi) = containerd::effective_cdi(&sources, &version) {
            reads_cdi_dir = env.files().containerd_reads(&settings.cdi_dir, cdi.as_ref());
        }
        ContainerdConfigFacts { sources, executable, reads_cdi_dir, loaded: env.cri_runtimes() }
    });
    ContainerdFacts::Answered { version, config }
}

/// The kubelet's registration socket, our plugin sockets and the kubelet's checkpoint.
pub fn plugin(args: &DoctorArgs, env: &dyn DoctorEnv) -> PluginFacts {
    let dir = &args.device_plugin_dir;
    let kubelet = host_join(dir, "kubelet.sock");
    let kubelet_answers = env.files().socket_answers(&kubelet);
    let mut facts = PluginFacts { kubelet, kubelet_answers, answering: Vec::new(), checkpoint: None };
    if !kubelet_answers {
        return facts;
    }
    facts.answering = env
        .files()
        .names_in(dir)
        .into_iter()
        .filter(|n| n.starts_with("nvinject-") && n.ends_with(".sock"))
        .filter(|n| env.files().socket_answers(&host_join(dir, n)))
        .collect();
    facts.checkpoint = env.files().text(&host_join(dir, "kubelet_internal_checkpoint")).ok().flatten();
    facts
}

/// The real services: NVML through `nvinject-gpu`, containerd's version API and CRI.
pub struct HostEnv<'a> {
    /// containerd (version).
    pub containerd: &'a dyn Containerd,
    /// containerd's socket, a host path (CRI is served on the same socket), located inside the
    /// host root at each use.
    pub socket: String,
    /// The host's files (the test container's log directory is a host path too).
    pub files: HostFiles,
}

impl DoctorEnv for HostEnv<'_> {
    fn files(&self) -> &HostFiles {
        &self.files
    }

    fn inventory(&self, library: Option<&Path>) -> std::result::Result<Inventory, ProbeError> {
        Ok(nvinject_gpu::discover(library)?)
    }

    fn containerd_version(&self) -> std::result::Result<ContainerdVersion, ProbeError> {
        let over_socket = self
            .socket()
            .map_err(|e| e.to_string())
            .and_then(|s| crate::service::version_over_socket(&s))
            .and_then(|v| ContainerdVersion::parse(&v).map_err(|e| e.to_string()));
        // The socket's answer when it gives one; else the binary's, whose error is the one shown.
        over_socket.or_else(|_| self.containerd.version().map_err(|e| ProbeError::Containerd(Box::new(e))))
    }

    fn cri_runtimes(&self) -> std::result::Result<LoadedRuntimes, ProbeError> {
        Ok(crate::cri::loaded_runtimes(&self.socket()?)?)
    }

    fn run_container(&self, request: &TestContainer) -> std::result::Result<(i32, String), ProbeError> {
        let socket = self.socket()?;
        let logs = LogDir::create(&self.files.root, "/tmp").map_err(|e| ProbeError::LogDir(Box::new(e)))?;
        Ok(crate::cri::run_test_container(&socket, request, &logs.host, &logs.dir.join(""))?)
    }
}

impl HostEnv<'_> {
    fn socket(&self) -> std::result::Result<PathBuf, ProbeError> {
        Ok(self.files.root.locate(&self.socket)?)
    }
}

/// The test container's log directory: a new directory (mode 0700, an unguessable name, created
/// exclusively) in the host's `/tmp`. containerd writes the log there as root following the path
/// on the host, so the directory must be ours: a name another user could have created first
/// (a link to `/etc`, say) would let them choose where root writes. Removed on drop.
pub struct LogDir {
    /// Host path (what containerd is told).
    pub host: String,
    /// The directory, resolved inside the host root (what the doctor reads).
    pub dir: HostDir,
    root: HostRoot,
}

impl LogDir {
    /// Creates it under the host directory `parent`.
    pub fn create(root: &HostRoot, parent: &str) -> Result<LogDir> {
        use std::hash::{BuildHasher, Hasher};
        let parent_dir = root.dir(parent)?;
        // RandomState is seeded from the OS's randomness: unguessable without a new dependency.
        let token = std::collections::hash_map::RandomState::new().build_hasher().finish();
        let name = format!("nvinject-doctor-{}-{token:016x}", std::process::id());
        let host = host_join(parent, &name);
        let mode = nix::sys::stat::Mode::from_bits_truncate(0o700);
        // mkdirat fails on anything already there, a link included; the umask can only narrow 0700.
        nix::sys::stat::mkdirat(&parent_dir, name.as_str(), mode)
            .map_err(|e| Error::io("create", root.shown(&host))(e.into()))?;
        let dir = root.dir(&host)?;
        Ok(LogDir { host, dir, root: root.clone() })
    }
}

impl Drop for LogDir {
    fn drop(&mut self) {
        // Only files are written here (the container's log); remove them, then the directory.
        if let Ok(Some(entries)) = self.root.read_dir(&self.host) {
            for (name, _) in entries {
                let _ =
                    nix::unistd::unlinkat(&self.dir, name.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
            }
        }
        let _ = self.root.remove_dir(&self.host);
    }
}
