//! Scanning a driver root, once, into [`DriverFiles`]: libraries, binaries, firmware, IPC sockets,
//! graphics/compute config files and the display pieces (Xorg modules, the GBM backend link).
//!
//! Libraries are every `*.so.<driver version>` file in the search directories, then in every other
//! directory the driver root's `etc/ld.so.cache` lists for this machine's architecture (which is how
//! libraries in distribution-specific places are found). Every path is resolved inside the root
//! (see [`crate::root::resolve_in_root`]), so a file reachable through several links appears once,
//! under its real path. Each graphics, video and display piece is injected only when the root has
//! it; what is looked for follows what `nvidia-ctk cdi generate` 1.20 injects.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use crate::ldcache;
use crate::root::{join, resolve_in_root, resolve_with_metadata};

/// Library directories searched by default, inside the driver root, before the ld.so.cache.
pub fn default_library_dirs() -> Vec<String> {
    let triplet = format!("{}-linux-gnu", std::env::consts::ARCH);
    vec![
        "/usr/lib64".into(),
        format!("/usr/lib/{triplet}"),
        format!("/usr/lib/{triplet}/nvidia/current"),
        "/lib64".into(),
        format!("/lib/{triplet}"),
        "/usr/lib".into(),
        "/lib".into(),
    ]
}

/// Binary directories searched, inside the driver root.
pub const BINARY_DIRS: [&str; 5] = ["/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"];

/// The driver's utilities a container gets; the IMEX daemon and its control tool come from their
/// own package (`nvidia-imex-<branch>`), where a node has it.
pub const BINARIES: [&str; 8] = [
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-xconfig",
    "nvidia-imex",
    "nvidia-imex-ctl",
];

/// Where GSP firmware lives, inside the driver root; `<version>` is appended.
pub const FIRMWARE_DIRS: [&str; 2] = ["/lib/firmware/nvidia", "/usr/lib/firmware/nvidia"];

/// IPC endpoints of the driver's daemons, inside the driver root. The MPS pipe directory is not
/// one of them: it is mounted (writable) only where the operator configures MPS
/// (`--mps-pipe-dir`), never found by looking.
pub const IPC_PATHS: [&str; 4] = [
    "/run/nvidia-persistenced/socket",
    "/var/run/nvidia-persistenced/socket",
    "/run/nvidia-fabricmanager/socket",
    "/var/run/nvidia-fabricmanager/socket",
];

/// Graphics, Vulkan, EGL, OpenCL, OptiX and Xorg config files, inside the driver root. Vulkan's
/// files are mounted under `/etc/vulkan` in the container wherever the host keeps them (see
/// [`config_container_path`]).
pub const CONFIG_FILES: [&str; 22] = [
    "/etc/vulkan/icd.d/nvidia_icd.json",
    "/usr/share/vulkan/icd.d/nvidia_icd.json",
    "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
    "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
    "/etc/glvnd/egl_vendor.d/10_nvidia.json",
    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    "/etc/egl/egl_external_platform.d/10_nvidia_wayland.json",
    "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
    "/etc/egl/egl_external_platform.d/15_nvidia_gbm.json",
    "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
    "/etc/egl/egl_external_platform.d/20_nvidia_xcb.json",
    "/usr/share/egl/egl_external_platform.d/20_nvidia_xcb.json",
    "/etc/egl/egl_external_platform.d/20_nvidia_xlib.json",
    "/usr/share/egl/egl_external_platform.d/20_nvidia_xlib.json",
    "/etc/OpenCL/vendors/nvidia.icd",
    "/usr/share/nvidia/nvoptix.bin",
    "/etc/X11/xorg.conf.d/10-nvidia.conf",
    "/usr/share/X11/xorg.conf.d/10-nvidia.conf",
    "/etc/X11/xorg.conf.d/nvidia-drm-outputclass.conf",
    "/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf",
    "/etc/vulkan/icd.d/nvidia_layers.json",
    "/usr/share/vulkan/icd.d/nvidia_layers.json",
];

/// Where a config file found at `path` (inside the driver root) is mounted in the container.
/// Vulkan's ICD and layer manifests go under `/etc/vulkan`, which the Vulkan loader reads before
/// `/usr/share/vulkan`, as nvidia-ctk puts them: an image's own `/etc/vulkan/icd.d/nvidia_icd.json`
/// (a common Dockerfile line) is then replaced by the host's rather than loaded beside it.
/// Everything else keeps its path.
pub fn config_container_path(path: &str) -> String {
    match path.strip_prefix("/usr/share/vulkan/") {
        Some(rest) => format!("/etc/vulkan/{rest}"),
        None => path.to_owned(),
    }
}

/// The VDPAU driver's folder under a library folder (`<lib>/vdpau/libvdpau_nvidia.so.<version>`),
/// and the driver's file stem there. Other vendors' VDPAU drivers in that folder are not ours.
pub const VDPAU_DIR: &str = "vdpau";
/// See [`VDPAU_DIR`].
pub const VDPAU_STEM: &str = "libvdpau_nvidia";

/// GBM's backend: `<lib>/gbm/nvidia-drm_gbm.so`, a link to the allocator library in `<lib>`.
pub const GBM_BACKEND: &str = "gbm/nvidia-drm_gbm.so";
/// The library [`GBM_BACKEND`] points at.
pub const GBM_ALLOCATOR: &str = "libnvidia-allocator";

/// Xorg module folders, inside the driver root: upstream's and distributions' places.
pub fn xorg_module_dirs() -> Vec<String> {
    let triplet = format!("{}-linux-gnu", std::env::consts::ARCH);
    vec![
        "/usr/lib/xorg/modules".into(),
        "/usr/lib64/xorg/modules".into(),
        format!("/usr/lib/{triplet}/xorg/modules"),
    ]
}

/// The Xorg driver, under an Xorg module folder.
pub const XORG_DRIVER: &str = "drivers/nvidia_drv.so";
/// Where the GLX server module (`libglxserver_nvidia.so.<version>`) may be, under an Xorg module
/// folder: upstream's `.run` and Fedora use `extensions/`, some packagings `nvidia/extensions/`.
pub const XORG_GLX_DIRS: [&str; 2] = ["extensions", "nvidia/extensions"];

/// Graphics libraries the driver ships with their own version numbers (`libnvidia-egl-gbm.so.1.1.1`)
/// rather than the driver's; the EGL platform config files name them, so they go with the driver.
pub const OWN_VERSION_LIBRARIES: [&str; 4] =
    ["libnvidia-egl-gbm", "libnvidia-egl-wayland", "libnvidia-egl-xcb", "libnvidia-egl-xlib"];

/// Libraries of the driver whose file name carries no version but their SONAME's number
/// (`libnvidia-nvvm70.so.4`, the older NVVM that drivers from 575 ship beside the current one;
/// nvidia-ctk looks for `libnvidia-nvvm70.so.*`).
pub const UNVERSIONED_LIBRARIES: [&str; 1] = ["libnvidia-nvvm70"];

/// The ld.so.cache of a root, inside it.
pub const LD_CACHE: &str = "/etc/ld.so.cache";

/// A driver library.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Library {
    /// Real path inside the driver root, e.g. `/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15`.
    pub path: String,
    /// DT_SONAME, e.g. `libcuda.so.1`; `None` when the file has none.
    pub soname: Option<String>,
}

impl Library {
    /// The file name.
    pub fn file_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }

    /// The directory, inside the driver root.
    pub fn dir(&self) -> &str {
        self.path.rsplit_once('/').map(|(d, _)| if d.is_empty() { "/" } else { d }).unwrap_or("/")
    }
}

/// What kind of IPC endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpcKind {
    /// A unix socket (persistenced, fabricmanager).
    Socket,
    /// A directory where a socket was expected (a daemon that keeps its socket in a folder).
    Directory,
}

/// An IPC endpoint found in the driver root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipc {
    /// Real path inside the driver root.
    pub path: String,
    /// Socket or directory.
    pub kind: IpcKind,
}

/// Everything found in a driver root: an owned value the spec builder computes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverFiles {
    /// The driver version the libraries were matched against.
    pub version: String,
    /// `*.so.<version>` libraries, [`OWN_VERSION_LIBRARIES`] and [`UNVERSIONED_LIBRARIES`], sorted
    /// by path.
    pub libraries: Vec<Library>,
    /// Driver utilities, in [`BINARIES`] order.
    pub binaries: Vec<String>,
    /// GSP firmware files, sorted.
    pub firmware: Vec<String>,
    /// Daemon sockets (the MPS pipe directory is not looked for: see [`IPC_PATHS`]).
    pub ipc: Vec<Ipc>,
    /// Config files, in [`CONFIG_FILES`] order, one per container path
    /// ([`config_container_path`]).
    pub configs: Vec<String>,
    /// Xorg modules (`nvidia_drv.so`, `libglxserver_nvidia.so.<version>`): mounted, but not
    /// library folders for the ld cache, and no SONAME links.
    pub xorg: Vec<String>,
    /// Links the container needs beside the mounted files, as (link, target), sorted by link:
    /// the GBM backend and the GLX server module's unversioned name.
    pub links: Vec<(String, String)>,
    /// Library directories searched (resolved, inside the root), for error messages.
    pub searched: Vec<String>,
    /// Whether an ld.so.cache was found and read.
    pub ld_cache_read: bool,
}

impl DriverFiles {
    /// The library whose file name is `<stem>.so.<version>` (stem like `libcuda`).
    pub fn library(&self, stem: &str) -> Option<&Library> {
        let want = format!("{stem}.so.{}", self.version);
        self.libraries.iter().find(|l| l.file_name() == want)
    }
}

/// Scans `root` (this process's view of the driver root) for the files of driver `version`.
/// `library_dirs` are searched in order, then the root's ld.so.cache. Missing files are not errors
/// here: the spec builder decides what is required.
pub fn scan(root: &Path, version: &str, library_dirs: &[String]) -> DriverFiles {
    let mut files = DriverFiles { version: version.to_owned(), ..Default::default() };
    let suffix = format!(".so.{version}");
    let mut dirs_done = BTreeSet::new();
    // Sorted by path, each once however many folders or links reach it.
    let mut found = BTreeSet::new();
    for dir in library_dirs {
        scan_library_dir(root, dir, &suffix, &mut dirs_done, &mut found);
    }
    // The cache folders' scan below adds to dirs_done; VDPAU is looked for in every library folder
    // afterwards.
    match fs::read(join(root, LD_CACHE)) {
        Ok(bytes) => match ldcache::parse(&bytes) {
            Ok(entries) => {
                files.ld_cache_read = true;
                let arch = ldcache::host_arch_flags();
                let mut cache_dirs = Vec::new();
                for entry in entries.iter().filter(|e| arch.is_some_and(|a| e.is_arch(a))) {
                    if let Some((dir, _)) = entry.path.rsplit_once('/')
                        && !cache_dirs.iter().any(|d| d == dir)
                    {
                        cache_dirs.push(dir.to_owned());
                    }
                }
                tracing::debug!(entries = entries.len(), dirs = cache_dirs.len(), "ld.so.cache read");
                for dir in &cache_dirs {
                    scan_library_dir(root, dir, &suffix, &mut dirs_done, &mut found);
                }
            }
            Err(error) => tracing::warn!(
                path = %join(root, LD_CACHE).display(), %error,
                "ignoring unreadable ld.so.cache; libraries are found through the search paths only"
            ),
        },
        Err(error) => {
            tracing::debug!(path = %join(root, LD_CACHE).display(), %error, "no ld.so.cache in the driver root")
        }
    }
    let library_folders: Vec<String> = dirs_done.iter().cloned().collect();
    for dir in &library_folders {
        let vdpau = format!("{}/{VDPAU_DIR}", dir.trim_end_matches('/'));
        let Ok(real) = resolve_in_root(root, &vdpau) else { continue };
        let Ok(read) = fs::read_dir(join(root, &real)) else { continue };
        let want = format!("{VDPAU_STEM}{suffix}");
        found.extend(
            read.flatten()
                .filter(|e| e.file_name().to_str() == Some(want.as_str()))
                .filter_map(|e| entry_file(root, &real, &e)),
        );
    }
    files.libraries = found
        .into_iter()
        .map(|path: String| {
            let soname = read_soname(&join(root, &path));
            Library { path, soname }
        })
        .collect();
    files.searched = dirs_done.into_iter().collect();

    for name in BINARIES {
        let hit = BINARY_DIRS.iter().find_map(|dir| resolve_file(root, &format!("{dir}/{name}")));
        if let Some(path) = hit {
            files.binaries.push(path);
        } else {
            tracing::debug!(binary = name, root = %root.display(), "driver utility not found");
        }
    }

    // With a merged /usr both folders are one: each is listed once.
    let firmware_dirs: BTreeSet<String> = FIRMWARE_DIRS
        .iter()
        .filter_map(|base| resolve_in_root(root, &format!("{base}/{version}")).ok())
        .collect();
    let mut firmware = BTreeSet::new();
    for dir in firmware_dirs {
        let Ok(read) = fs::read_dir(join(root, &dir)) else { continue };
        firmware.extend(read.flatten().filter_map(|entry| entry_file(root, &dir, &entry)));
    }
    files.firmware = firmware.into_iter().collect();

    for candidate in IPC_PATHS {
        let Ok((path, meta)) = resolve_with_metadata(root, candidate) else { continue };
        let kind = if meta.is_dir() { IpcKind::Directory } else { IpcKind::Socket };
        if !files.ipc.iter().any(|i| i.path == path) {
            files.ipc.push(Ipc { path, kind });
        }
    }

    for candidate in CONFIG_FILES {
        if let Some(path) = resolve_file(root, candidate)
            && !files.configs.iter().any(|c| config_container_path(c) == config_container_path(&path))
        {
            files.configs.push(path);
        }
    }

    scan_display(root, version, &mut files);
    tracing::debug!(
        libraries = files.libraries.len(),
        binaries = files.binaries.len(),
        firmware = files.firmware.len(),
        ipc = files.ipc.len(),
        configs = files.configs.len(),
        "driver root scanned"
    );
    files
}

/// The Xorg modules and the links that go with them and with the allocator library.
fn scan_display(root: &Path, version: &str, files: &mut DriverFiles) {
    let mut links = BTreeSet::new();
    // GBM's backend, next to the allocator library, when the root has one (file or link).
    if let Some(allocator) = files.library(GBM_ALLOCATOR)
        && let Some(soname) = allocator.soname.as_deref()
    {
        let backend = format!("{}/{GBM_BACKEND}", allocator.dir().trim_end_matches('/'));
        let (folder, name) = backend.rsplit_once('/').expect("the backend path has a folder");
        // The folder resolved inside the root; the entry itself only lstat'ed (a link is expected).
        if let Ok(real) = resolve_in_root(root, folder)
            && fs::symlink_metadata(join(root, &format!("{real}/{name}"))).is_ok()
        {
            links.insert((backend, format!("../{soname}")));
        }
    }
    let glx = format!("libglxserver_nvidia.so.{version}");
    for dir in xorg_module_dirs() {
        if let Some(path) = resolve_file(root, &format!("{dir}/{XORG_DRIVER}"))
            && !files.xorg.contains(&path)
        {
            files.xorg.push(path);
        }
        for sub in XORG_GLX_DIRS {
            let Some(path) = resolve_file(root, &format!("{dir}/{sub}/{glx}")) else { continue };
            if files.xorg.contains(&path) {
                continue;
            }
            // Xorg loads the module by its unversioned name.
            let folder = path.rsplit_once('/').map_or("", |(d, _)| d);
            links.insert((format!("{folder}/libglxserver_nvidia.so"), glx.clone()));
            files.xorg.push(path);
        }
    }
    files.links = links.into_iter().collect();
}

/// The real path of a regular file inside the root, or `None`.
fn resolve_file(root: &Path, inner: &str) -> Option<String> {
    let (path, meta) = resolve_with_metadata(root, inner).ok()?;
    meta.is_file().then_some(path)
}

/// The real path of a regular file listed in `real_dir` (a directory already resolved inside the
/// root), or `None`. The directory entry says what it is: only a symlinked entry needs resolving.
fn entry_file(root: &Path, real_dir: &str, entry: &fs::DirEntry) -> Option<String> {
    let name = entry.file_name();
    let inner = format!("{}/{}", real_dir.trim_end_matches('/'), name.to_str()?);
    match entry.file_type().ok()? {
        t if t.is_file() => Some(inner),
        t if t.is_symlink() => resolve_file(root, &inner),
        _ => None,
    }
}

fn scan_library_dir(
    root: &Path,
    dir: &str,
    suffix: &str,
    dirs_done: &mut BTreeSet<String>,
    found: &mut BTreeSet<String>,
) {
    let Ok(real) = resolve_in_root(root, dir) else { return };
    if !dirs_done.insert(real.clone()) {
        return;
    }
    let Ok(read) = fs::read_dir(join(root, &real)) else { return };
    for entry in read.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.ends_with(suffix) && !has_own_version(name) && !is_unversioned_library(name) {
            continue;
        }
        found.extend(entry_file(root, &real, &entry));
    }
}

/// `libnvidia-egl-gbm.so.1.1.1`: one of [`OWN_VERSION_LIBRARIES`] with a full `x.y.z` version (the
/// file itself, not its `.so.1` link).
fn has_own_version(name: &str) -> bool {
    OWN_VERSION_LIBRARIES.iter().any(|stem| {
        name.strip_prefix(stem).and_then(|rest| rest.strip_prefix(".so.")).is_some_and(|v| {
            v.split('.').count() >= 3
                && v.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
    })
}

/// `libnvidia-nvvm70.so.4`: one of [`UNVERSIONED_LIBRARIES`] followed by numbers only.
fn is_unversioned_library(name: &str) -> bool {
    UNVERSIONED_LIBRARIES.iter().any(|stem| {
        name.strip_prefix(stem)
            .and_then(|rest| rest.strip_prefix(".so."))
            .is_some_and(|v| v.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())))
    })
}

/// The library's SONAME, read with the same ELF reader the hook's cache builder uses.
fn read_soname(path: &Path) -> Option<String> {
    let result = fs::File::open(path).and_then(|f| f.metadata().map(|m| (f, m.len())));
    match result {
        Ok((file, len)) => nvinject_ldcache::elf::inspect(&file, len).and_then(|lib| lib.soname),
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "cannot read the library's SONAME; no SONAME link is made");
            None
        }
    }
}

/// Finds `libnvidia-ml.so.1` in a driver root: the search directories, then the ld.so.cache.
/// Returns this process's path to it.
pub fn locate_nvml(root: &Path, library_dirs: &[String]) -> Option<std::path::PathBuf> {
    const NVML: &str = "libnvidia-ml.so.1";
    for dir in library_dirs {
        if let Some(path) = resolve_file(root, &format!("{dir}/{NVML}")) {
            return Some(join(root, &path));
        }
    }
    let entries = ldcache::parse(&fs::read(join(root, LD_CACHE)).ok()?).ok()?;
    let arch = ldcache::host_arch_flags()?;
    entries
        .iter()
        .filter(|e| e.key == NVML && e.is_arch(arch))
        .find_map(|e| resolve_file(root, &e.path))
        .map(|p| join(root, &p))
}

/// The driver version from a `libcuda.so.<version>` file name in the library folders: the last
/// resort when the kernel module's version files are not readable. Where an upgrade left several,
/// the newest (compared number by number, so `535.104.05` is newer than `535.54.03`).
pub fn libcuda_version(root: &Path, library_dirs: &[String]) -> Option<String> {
    for dir in library_dirs {
        let Ok(real) = resolve_in_root(root, dir) else { continue };
        let Ok(read) = fs::read_dir(join(root, &real)) else { continue };
        let newest = read
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_owned();
                let v = name.strip_prefix("libcuda.so.")?;
                let number =
                    |p: &str| p.bytes().all(|b| b.is_ascii_digit()).then(|| p.parse::<u64>().ok())?;
                let parts: Option<Vec<u64>> = v.split('.').map(number).collect();
                parts.filter(|p| p.len() >= 2).map(|p| (p, v.to_owned()))
            })
            .max();
        if let Some((_, v)) = newest {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    const VER: &str = "550.54.15";

    /// A loadable shared object with this SONAME, for the host's machine (the simulated node's).
    fn tiny_so(soname: &str) -> Vec<u8> {
        let machine = nvinject_simnode::elf::Machine::host().expect("a machine the simulated node supports");
        nvinject_simnode::elf::shared_object(machine, soname)
    }

    fn put(root: &Path, inner: &str, bytes: &[u8]) {
        let p = join(root, inner);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, bytes).unwrap();
    }

    #[test]
    fn finds_libraries_through_search_paths_and_the_ld_cache() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        let lib = "/usr/lib/x86_64-linux-gnu";
        put(r, &format!("{lib}/libcuda.so.{VER}"), &tiny_so("libcuda.so.1"));
        put(r, &format!("{lib}/libnvidia-ml.so.{VER}"), &tiny_so("libnvidia-ml.so.1"));
        put(r, &format!("{lib}/libnvidia-ml.so.470.1.2"), b"old driver"); // other version: ignored
        put(r, &format!("{lib}/libc.so.6"), b"not ours");
        put(r, &format!("{lib}/libnvidia-egl-gbm.so.1.1.1"), &tiny_so("libnvidia-egl-gbm.so.1"));
        symlink("libnvidia-egl-gbm.so.1.1.1", join(r, &format!("{lib}/libnvidia-egl-gbm.so.1"))).unwrap();
        symlink("usr/lib", r.join("lib")).unwrap(); // merged /usr: must not double-count
        // A distribution-specific directory known only to the cache.
        let odd = "/opt/vendor/nvidia";
        put(
            r,
            &format!("{odd}/libnvidia-ptxjitcompiler.so.{VER}"),
            &tiny_so("libnvidia-ptxjitcompiler.so.1"),
        );
        symlink(
            format!("libnvidia-ptxjitcompiler.so.{VER}"),
            join(r, &format!("{odd}/libnvidia-ptxjitcompiler.so.1")),
        )
        .unwrap();
        let arch = ldcache::host_arch_flags().unwrap() | 0x3;
        put(
            r,
            LD_CACHE,
            &ldcache::tests::new_format(&[
                (arch, "libnvidia-ptxjitcompiler.so.1", "/opt/vendor/nvidia/libnvidia-ptxjitcompiler.so.1"),
                (0x0003, "libcuda.so.1", "/opt/i386/libcuda.so.1"),
            ]),
        );
        put(r, &format!("/opt/i386/libcuda.so.{VER}"), b"32-bit: not for this machine");

        let dirs = vec![lib.to_owned(), "/lib/x86_64-linux-gnu".to_owned(), "/nonexistent".to_owned()];
        let files = scan(r, VER, &dirs);
        let got: Vec<(&str, Option<&str>)> =
            files.libraries.iter().map(|l| (l.path.as_str(), l.soname.as_deref())).collect();
        assert_eq!(
            got,
            [
                (
                    "/opt/vendor/nvidia/libnvidia-ptxjitcompiler.so.550.54.15",
                    Some("libnvidia-ptxjitcompiler.so.1")
                ),
                ("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", Some("libcuda.so.1")),
                ("/usr/lib/x86_64-linux-gnu/libnvidia-egl-gbm.so.1.1.1", Some("libnvidia-egl-gbm.so.1")),
                ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15", Some("libnvidia-ml.so.1")),
            ]
        );
        assert!(files.ld_cache_read);
        assert_eq!(files.searched, ["/opt/vendor/nvidia", "/usr/lib/x86_64-linux-gnu"]);
        assert_eq!(files.library("libcuda").unwrap().dir(), lib);
    }

    #[test]
    fn a_root_without_ld_cache_uses_the_search_paths() {
        let tmp = tempfile::tempdir().unwrap();
        put(tmp.path(), &format!("/usr/lib64/libcuda.so.{VER}"), b"");
        let files = scan(tmp.path(), VER, &default_library_dirs());
        assert!(!files.ld_cache_read);
        assert_eq!(files.libraries.len(), 1);
        assert_eq!(files.libraries[0].soname, None);
    }

    #[test]
    fn finds_binaries_firmware_ipc_and_configs() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        put(r, "/usr/bin/nvidia-smi", b"#!");
        put(r, "/usr/sbin/nvidia-persistenced", b"#!");
        symlink("usr/bin", r.join("bin")).unwrap();
        put(r, &format!("/lib/firmware/nvidia/{VER}/gsp_tu10x.bin"), b"fw");
        put(r, &format!("/lib/firmware/nvidia/{VER}/gsp_ga10x.bin"), b"fw");
        put(r, "/lib/firmware/nvidia/470.1.2/gsp_old.bin", b"fw");
        put(r, "/run/nvidia-persistenced/socket", b"");
        fs::create_dir_all(r.join("var")).unwrap();
        symlink("../run", r.join("var/run")).unwrap();
        fs::create_dir_all(r.join("tmp/nvidia-mps")).unwrap();
        put(r, "/etc/vulkan/icd.d/nvidia_icd.json", b"{}");
        put(r, "/usr/share/glvnd/egl_vendor.d/10_nvidia.json", b"{}");
        put(r, "/etc/OpenCL/vendors/nvidia.icd", b"libnvidia-opencl.so.1");

        let files = scan(r, VER, &[]);
        assert_eq!(files.binaries, ["/usr/bin/nvidia-smi", "/usr/sbin/nvidia-persistenced"]);
        assert_eq!(
            files.firmware,
            [
                format!("/lib/firmware/nvidia/{VER}/gsp_ga10x.bin"),
                format!("/lib/firmware/nvidia/{VER}/gsp_tu10x.bin")
            ]
        );
        // The MPS pipe directory is there but not configured: not an IPC endpoint to mount.
        assert_eq!(
            files.ipc,
            [Ipc { path: "/run/nvidia-persistenced/socket".into(), kind: IpcKind::Socket }]
        );
        assert_eq!(
            files.configs,
            [
                "/etc/vulkan/icd.d/nvidia_icd.json",
                "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
                "/etc/OpenCL/vendors/nvidia.icd"
            ]
        );
    }

    /// What nvidia-ctk 1.20 looks for beyond a 550 driver (`pkg/nvcdi/driver-nvml.go`: the IMEX
    /// programs among the driver's binaries, `libnvidia-nvvm70.so.*` through the driver library
    /// locator, i.e. the library folders and the ld.so.cache): found where a newer driver or the
    /// IMEX package put them, and only the real file of each.
    #[test]
    fn finds_imex_programs_and_the_legacy_nvvm() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        let lib = "/usr/lib/x86_64-linux-gnu";
        let dirs = vec![lib.to_owned()];
        put(r, &format!("{lib}/libcuda.so.{VER}"), &tiny_so("libcuda.so.1"));
        let bare = scan(r, VER, &dirs);
        assert!(bare.binaries.is_empty() && bare.libraries.len() == 1);

        put(r, "/usr/bin/nvidia-imex", b"#!");
        put(r, "/usr/bin/nvidia-imex-ctl", b"#!");
        put(r, &format!("{lib}/libnvidia-nvvm70.so.4"), &tiny_so("libnvidia-nvvm70.so.4"));
        symlink("libnvidia-nvvm70.so.4", join(r, &format!("{lib}/libnvidia-nvvm70.so"))).unwrap();
        put(r, &format!("{lib}/libnvidia-nvvm70.so.4.bak"), b"not a library name");
        put(r, &format!("{lib}/libnvidia-nvvm700.so.4"), b"another name");
        let files = scan(r, VER, &dirs);
        assert_eq!(files.binaries, ["/usr/bin/nvidia-imex", "/usr/bin/nvidia-imex-ctl"]);
        let libs: Vec<(&str, Option<&str>)> =
            files.libraries.iter().map(|l| (l.file_name(), l.soname.as_deref())).collect();
        assert_eq!(
            libs,
            [
                ("libcuda.so.550.54.15", Some("libcuda.so.1")),
                ("libnvidia-nvvm70.so.4", Some("libnvidia-nvvm70.so.4"))
            ]
        );
        assert!(is_unversioned_library("libnvidia-nvvm70.so.4.0.1"));
        assert!(!is_unversioned_library("libnvidia-nvvm70.so."));
        assert!(!is_unversioned_library("libnvidia-nvvm70.so"));
    }

    #[test]
    fn finds_vdpau_gbm_and_xorg_pieces_only_where_the_root_has_them() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        let lib = "/usr/lib/x86_64-linux-gnu";
        let dirs = vec![lib.to_owned()];
        put(r, &format!("{lib}/libcuda.so.{VER}"), &tiny_so("libcuda.so.1"));
        put(r, &format!("{lib}/libnvidia-allocator.so.{VER}"), &tiny_so("libnvidia-allocator.so.1"));
        // Nothing graphics-specific yet: no VDPAU, no links, no Xorg modules.
        let bare = scan(r, VER, &dirs);
        assert!(bare.xorg.is_empty() && bare.links.is_empty());
        assert!(!bare.libraries.iter().any(|l| l.path.contains("vdpau")));

        put(r, &format!("{lib}/vdpau/libvdpau_nvidia.so.{VER}"), &tiny_so("libvdpau_nvidia.so.1"));
        put(r, &format!("{lib}/vdpau/libvdpau_va_gl.so.{VER}"), b"another vendor's: not ours");
        fs::create_dir_all(join(r, &format!("{lib}/gbm"))).unwrap();
        symlink("../libnvidia-allocator.so.1", join(r, &format!("{lib}/gbm/nvidia-drm_gbm.so"))).unwrap();
        put(r, "/usr/lib/xorg/modules/drivers/nvidia_drv.so", &tiny_so("nvidia_drv.so"));
        put(r, &format!("/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{VER}"), b"glx");
        put(r, "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.470.1.2", b"old driver's");
        // lib64 is the same folder: found once.
        symlink("lib", r.join("usr/lib64")).unwrap();
        put(r, "/usr/share/vulkan/icd.d/nvidia_icd.json", b"{}");
        put(r, "/etc/vulkan/icd.d/nvidia_icd.json", b"{}"); // the /etc one is mounted there
        put(r, "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json", b"{}");
        put(r, "/usr/share/egl/egl_external_platform.d/20_nvidia_xcb.json", b"{}");

        let files = scan(r, VER, &dirs);
        let vdpau = files.libraries.iter().find(|l| l.path.contains("vdpau")).expect("VDPAU found");
        assert_eq!(
            (vdpau.path.as_str(), vdpau.soname.as_deref(), vdpau.dir()),
            (
                "/usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.550.54.15",
                Some("libvdpau_nvidia.so.1"),
                "/usr/lib/x86_64-linux-gnu/vdpau"
            )
        );
        assert!(!files.libraries.iter().any(|l| l.path.contains("va_gl")));
        assert_eq!(
            files.xorg,
            [
                "/usr/lib/xorg/modules/drivers/nvidia_drv.so",
                "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.550.54.15"
            ]
        );
        assert_eq!(
            files.links,
            [
                (
                    "/usr/lib/x86_64-linux-gnu/gbm/nvidia-drm_gbm.so".to_owned(),
                    "../libnvidia-allocator.so.1".to_owned()
                ),
                (
                    "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so".to_owned(),
                    "libglxserver_nvidia.so.550.54.15".to_owned()
                ),
            ]
        );
        assert_eq!(
            files.configs,
            [
                "/etc/vulkan/icd.d/nvidia_icd.json",
                "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
                "/usr/share/egl/egl_external_platform.d/20_nvidia_xcb.json"
            ]
        );
        assert_eq!(
            config_container_path("/usr/share/vulkan/implicit_layer.d/nvidia_layers.json"),
            "/etc/vulkan/implicit_layer.d/nvidia_layers.json"
        );
        assert_eq!(
            config_container_path("/usr/share/glvnd/egl_vendor.d/10_nvidia.json"),
            "/usr/share/glvnd/egl_vendor.d/10_nvidia.json"
        );
    }

    #[test]
    fn the_gbm_link_is_looked_for_inside_the_root_only() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let r = tmp.path();
        let lib = "/usr/lib/x86_64-linux-gnu";
        put(r, &format!("{lib}/libcuda.so.{VER}"), &tiny_so("libcuda.so.1"));
        put(r, &format!("{lib}/libnvidia-allocator.so.{VER}"), &tiny_so("libnvidia-allocator.so.1"));
        // `gbm` points at this machine's absolute path; inside the root that is a missing folder.
        fs::write(outside.path().join("nvidia-drm_gbm.so"), b"").unwrap();
        symlink(outside.path(), join(r, &format!("{lib}/gbm"))).unwrap();
        assert!(scan(r, VER, &[lib.to_owned()]).links.is_empty());
        // Without the allocator library there is nothing for the link to point at.
        fs::remove_file(join(r, &format!("{lib}/gbm"))).unwrap();
        fs::create_dir_all(join(r, &format!("{lib}/gbm"))).unwrap();
        symlink("../libnvidia-allocator.so.1", join(r, &format!("{lib}/gbm/nvidia-drm_gbm.so"))).unwrap();
        assert_eq!(scan(r, VER, &[lib.to_owned()]).links.len(), 1);
        fs::remove_file(join(r, &format!("{lib}/libnvidia-allocator.so.{VER}"))).unwrap();
        assert!(scan(r, VER, &[lib.to_owned()]).links.is_empty());
    }

    #[test]
    fn vdpau_and_xorg_folders_linking_out_of_the_root_are_not_followed_there() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let r = tmp.path();
        let lib = "/usr/lib/x86_64-linux-gnu";
        put(r, &format!("{lib}/libcuda.so.{VER}"), &tiny_so("libcuda.so.1"));
        // This machine's files, reached by absolute links and by `..` chains.
        fs::write(outside.path().join(format!("libvdpau_nvidia.so.{VER}")), tiny_so("x")).unwrap();
        fs::create_dir_all(outside.path().join("drivers")).unwrap();
        fs::write(outside.path().join("drivers/nvidia_drv.so"), b"").unwrap();
        symlink(outside.path(), join(r, &format!("{lib}/vdpau"))).unwrap();
        fs::create_dir_all(r.join("usr/lib/xorg")).unwrap();
        let dotdot =
            format!("{}{}", "../".repeat(12), outside.path().display().to_string().trim_start_matches('/'));
        symlink(&dotdot, r.join("usr/lib/xorg/modules")).unwrap();
        let files = scan(r, VER, &[lib.to_owned()]);
        assert_eq!(files.libraries.len(), 1, "{:?}", files.libraries);
        assert!(files.xorg.is_empty(), "{:?}", files.xorg);
    }

    #[test]
    fn reads_the_version_off_libcuda() {
        let tmp = tempfile::tempdir().unwrap();
        put(tmp.path(), &format!("/usr/lib64/libcuda.so.{VER}"), b"");
        put(tmp.path(), "/usr/lib64/libcuda.so.1", b"");
        put(tmp.path(), "/usr/lib64/libcuda.so.550.9.1", b""); // older, though it sorts later as text
        put(tmp.path(), "/usr/lib64/libcuda.so.550.54.x", b"");
        assert_eq!(libcuda_version(tmp.path(), &default_library_dirs()).as_deref(), Some(VER));
    }

    #[test]
    fn locates_nvml_in_the_root() {
        let tmp = tempfile::tempdir().unwrap();
        put(tmp.path(), &format!("/usr/lib64/libnvidia-ml.so.{VER}"), b"");
        symlink(format!("libnvidia-ml.so.{VER}"), tmp.path().join("usr/lib64/libnvidia-ml.so.1")).unwrap();
        let found = locate_nvml(tmp.path(), &default_library_dirs()).unwrap();
        assert_eq!(found, tmp.path().join(format!("usr/lib64/libnvidia-ml.so.{VER}")));
        assert_eq!(locate_nvml(Path::new("/nonexistent"), &default_library_dirs()), None);
    }
}
