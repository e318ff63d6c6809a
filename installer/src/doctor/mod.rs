//! `doctor`: the "driver -> runtime -> plugin -> container" debug loop as one command.
//!
//! Phases run in order; each prints one line, OK or FAIL with the fix, and a phase whose
//! prerequisite failed is SKIPped (its result would only repeat the first failure):
//! 1. driver: the kernel module is loaded and NVML answers with the same driver version;
//! 2. cdi: our spec is present, valid, and fresh (driver version and inventory digest match);
//! 3. containerd: its config has our runtime (with CDI annotations, without pod annotations), the
//!    shim it names exists, and the running containerd has loaded it;
//! 4. device-plugin: the kubelet's registration socket and our plugin's socket answer, and the
//!    kubelet's checkpoint lists the resource;
//! 5. container: a pod with the `nvidia` handler and a CDI annotation runs a command that sees a GPU.
//!
//! The services (NVML, containerd, CRI) are behind [`DoctorEnv`]; files are read through the host
//! root.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nvinject_gpu::Inventory;

use crate::containerd::{self, ContainerdVersion, plan::CDI_ANNOTATIONS, plan::SHIM_RUNTIME_TYPE};
use crate::error::Result;
use crate::install::{SHIM_BINARY, Settings};
use crate::paths::{FILE_LIMIT, HostDir, HostRoot, host_join};
use crate::service::Containerd;

/// `doctor` flags (besides the host flags shared with install).
#[derive(Debug, Clone, clap::Args)]
pub struct DoctorArgs {
    /// The kubelet's device plugin directory (holds kubelet.sock and the plugins' sockets).
    #[arg(long, default_value = "/var/lib/kubelet/device-plugins", env = "NVINJECT_DEVICE_PLUGIN_DIR")]
    pub device_plugin_dir: String,
    /// The extended resource the device plugin registers.
    #[arg(long, default_value = "nvidia.com/gpu")]
    pub resource: String,
    /// Image for the test container; it needs a C library (nvidia-smi comes from the driver).
    /// Without it, the container phase is skipped.
    #[arg(long, env = "NVINJECT_TEST_IMAGE")]
    pub test_image: Option<String>,
    /// Command the test container runs; it must exit 0 when it sees a GPU.
    #[arg(long, num_args = 1.., default_values = ["nvidia-smi", "-L"])]
    pub test_command: Vec<String>,
    /// CDI device the test container asks for.
    #[arg(long, default_value = "nvidia.com/gpu=all")]
    pub test_device: String,
    /// Phases to skip (driver, cdi, containerd, device-plugin, container).
    #[arg(long, value_delimiter = ',')]
    pub skip: Vec<String>,
}

impl Default for DoctorArgs {
    fn default() -> Self {
        DoctorArgs {
            device_plugin_dir: "/var/lib/kubelet/device-plugins".into(),
            resource: "nvidia.com/gpu".into(),
            test_image: None,
            test_command: vec!["nvidia-smi".into(), "-L".into()],
            test_device: "nvidia.com/gpu=all".into(),
            skip: Vec::new(),
        }
    }
}

/// A phase's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Works.
    Ok,
    /// Broken; the line carries the fix.
    Fail,
    /// Not checked (asked to skip, or an earlier phase it needs failed).
    Skip,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// Phase name.
    pub phase: &'static str,
    /// Verdict.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do (failures only).
    pub fix: Option<String>,
}

impl Line {
    fn ok(phase: &'static str, detail: impl Into<String>) -> Line {
        Line { phase, status: Status::Ok, detail: detail.into(), fix: None }
    }
    fn fail(phase: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Line {
        Line { phase, status: Status::Fail, detail: detail.into(), fix: Some(fix.into()) }
    }
    fn skip(phase: &'static str, detail: impl Into<String>) -> Line {
        Line { phase, status: Status::Skip, detail: detail.into(), fix: None }
    }
}

/// What the test container phase runs.
#[derive(Debug, Clone)]
pub struct TestContainer {
    /// Runtime handler.
    pub handler: String,
    /// Image.
    pub image: String,
    /// Command.
    pub command: Vec<String>,
    /// Container annotations (the CDI request).
    pub annotations: BTreeMap<String, String>,
}

/// The services doctor asks.
pub trait DoctorEnv {
    /// NVML's inventory, loading `library` (or the dynamic linker's).
    fn inventory(&self, library: Option<&Path>) -> std::result::Result<Inventory, String>;
    /// The running containerd's version.
    fn containerd_version(&self) -> std::result::Result<ContainerdVersion, String>;
    /// The runtimes the running containerd's CRI plugin loaded: handler -> (type, path).
    fn cri_runtimes(&self) -> std::result::Result<BTreeMap<String, (String, String)>, String>;
    /// Runs the test container to completion: (exit code, output).
    fn run_container(&self, request: &TestContainer) -> std::result::Result<(i32, String), String>;
}

/// Runs every phase and returns the lines.
pub fn check(settings: &Settings, args: &DoctorArgs, env: &dyn DoctorEnv) -> Vec<Line> {
    let root = &settings.host_root;
    let mut lines = Vec::new();
    let skipped = |phase: &str| args.skip.iter().any(|s| s == phase);

    // 1. driver
    let mut inventory = None;
    let mut module_version = None;
    if skipped("driver") {
        lines.push(Line::skip("driver", "skipped (--skip)"));
    } else {
        let version_file = host_join(&settings.sys_root, "module/nvidia/version");
        match read_host(root, &version_file).map(|t| t.lines().next().unwrap_or("").trim().to_owned()) {
            None => lines.push(Line::fail(
                "driver",
                format!("{version_file} is missing: the nvidia kernel module is not loaded"),
                "load the driver (modprobe nvidia, or wait for the driver container); check --sys-root",
            )),
            Some(module) => {
                match nvml_library(settings).and_then(|lib| env.inventory(lib.as_deref())) {
                    Err(e) => lines.push(Line::fail(
                        "driver",
                        format!("module {module} loaded, but NVML failed: {e}"),
                        "install the driver's user-space libraries matching the module, or point --driver-root / \
                         --nvml-lib at them",
                    )),
                    Ok(inv) if inv.driver.version != module => lines.push(Line::fail(
                        "driver",
                        format!("module {module} but NVML library {}", inv.driver.version),
                        "the loaded module and the libraries differ (driver upgraded without reboot): reboot or \
                         reload the nvidia module",
                    )),
                    Ok(inv) => {
                        let names: Vec<&str> = inv.gpus.iter().map(|g| g.name.as_str()).collect();
                        let first = names.first().copied().unwrap_or("none");
                        lines.push(Line::ok(
                            "driver",
                            format!("module {module} loaded; NVML answers: {} GPU(s) ({first})", inv.gpus.len()),
                        ));
                        inventory = Some(inv);
                    }
                }
                module_version = Some(module);
            }
        }
    }

    // 2. cdi
    let spec_path = settings.spec_path();
    if skipped("cdi") {
        lines.push(Line::skip("cdi", "skipped (--skip)"));
    } else {
        lines.push(check_spec(root, &spec_path, module_version.as_deref(), inventory.as_ref()));
    }

    // 3. containerd
    let containerd_ok = if skipped("containerd") {
        lines.push(Line::skip("containerd", "skipped (--skip)"));
        true
    } else {
        let line = check_containerd(settings, env);
        let ok = line.status == Status::Ok;
        lines.push(line);
        ok
    };

    // 4. device plugin
    if skipped("device-plugin") {
        lines.push(Line::skip("device-plugin", "skipped (--skip)"));
    } else {
        lines.push(check_plugin(root, args));
    }

    // 5. container
    let earlier_failed = lines.iter().any(|l| l.status == Status::Fail && l.phase != "device-plugin");
    if skipped("container") {
        lines.push(Line::skip("container", "skipped (--skip)"));
    } else if !containerd_ok || earlier_failed {
        lines.push(Line::skip("container", "skipped: fix the failures above first"));
    } else {
        match &args.test_image {
            None => lines.push(Line::skip(
                "container",
                "no --test-image: pass an image with a C library to run `nvidia-smi -L` in a GPU container",
            )),
            Some(image) => {
                let request = TestContainer {
                    handler: settings.handler.clone(),
                    image: image.clone(),
                    command: args.test_command.clone(),
                    annotations: BTreeMap::from([(
                        "cdi.k8s.io/nvinject-doctor".to_owned(),
                        args.test_device.clone(),
                    )]),
                };
                lines.push(match env.run_container(&request) {
                    Ok((0, output)) => Line::ok(
                        "container",
                        format!(
                            "handler {} with {}: `{}` printed: {}",
                            settings.handler,
                            args.test_device,
                            args.test_command.join(" "),
                            output.lines().next().unwrap_or("").trim()
                        ),
                    ),
                    Ok((code, output)) => Line::fail(
                        "container",
                        format!(
                            "`{}` exited {code}: {}",
                            args.test_command.join(" "),
                            output.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
                        ),
                        "read the shim's log (runtime.log-file in /etc/nvinject/config.toml) and containerd's journal",
                    ),
                    // containerd's own CDI refuses at CreateContainer, naming the device.
                    Err(e) if e.contains("CDI device injection failed") || e.contains("unresolvable CDI devices") => {
                        Line::fail(
                            "container",
                            format!("containerd's own CDI could not resolve {}: {e}", args.test_device),
                            format!(
                                "containerd reads CDI specs itself: make sure {} is in its cdi_spec_dirs and holds \
                                 a current spec (nvinject-cdi generate, or reinstall)",
                                settings.cdi_dir
                            ),
                        )
                    }
                    Err(e) => Line::fail(
                        "container",
                        format!("the test container did not run: {e}"),
                        "check that the image exists on the node (or can be pulled) and containerd's journal",
                    ),
                });
            }
        }
    }
    lines
}

/// The text of a regular file under the host root (resolved inside it, bounded, never blocking on
/// a FIFO); `None` when it is missing or cannot be read as text.
fn read_host(root: &HostRoot, host_path: &str) -> Option<String> {
    read_host_checked(root, host_path).ok().flatten()
}

/// [`read_host`], saying why a file that is there cannot be read (a FIFO, a device, too large, a
/// link that leads out of the host root, not UTF-8).
fn read_host_checked(root: &HostRoot, host_path: &str) -> std::result::Result<Option<String>, String> {
    match root.read(host_path, FILE_LIMIT).map_err(|e| e.to_string())? {
        None => Ok(None),
        Some(b) => String::from_utf8(b).map(Some).map_err(|_| format!("{host_path} is not UTF-8 text")),
    }
}

/// The NVML library to load: `--nvml-lib`, else found under the driver root; either way located
/// inside the host root, so the loader is never handed a path a link sends out of it.
fn nvml_library(settings: &Settings) -> std::result::Result<Option<PathBuf>, String> {
    let root = &settings.host_root;
    if let Some(lib) = &settings.nvml_lib {
        return root.locate(lib).map(Some).map_err(|e| e.to_string());
    }
    let driver = root.locate(&settings.driver_root).map_err(|e| e.to_string())?;
    Ok(nvinject_cdi_gen::driver::locate_nvml(&driver, &nvinject_cdi_gen::driver::default_library_dirs()))
}

fn check_spec(root: &HostRoot, spec_path: &str, module: Option<&str>, inventory: Option<&Inventory>) -> Line {
    let fix = "run `nvinject-installer install` (or `nvinject-cdi generate`) to write a current spec";
    let text = match read_host_checked(root, spec_path) {
        Ok(Some(text)) => text,
        Ok(None) => return Line::fail("cdi", format!("{spec_path} is missing"), fix),
        Err(e) => return Line::fail("cdi", format!("{spec_path} cannot be read: {e}"), fix),
    };
    let spec: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return Line::fail("cdi", format!("{spec_path} is not valid JSON: {e}"), fix),
    };
    let annotation = |key: &str| spec["annotations"][key].as_str().map(str::to_owned);
    let devices = spec["devices"].as_array().map_or(0, Vec::len);
    let spec_driver = annotation(nvinject_cdi_gen::build::ANNOTATION_DRIVER_VERSION);
    if let (Some(module), Some(spec_driver)) = (module, &spec_driver)
        && module != spec_driver
    {
        return Line::fail(
            "cdi",
            format!("{spec_path} was generated for driver {spec_driver}, the loaded driver is {module}"),
            fix,
        );
    }
    if let Some(inv) = inventory {
        let digest = nvinject_cdi_gen::inventory_digest(inv);
        if annotation(nvinject_cdi_gen::build::ANNOTATION_INVENTORY_DIGEST).as_deref()
            != Some(digest.as_str())
        {
            return Line::fail(
                "cdi",
                format!("{spec_path} does not match the GPUs NVML reports (GPUs or MIG layout changed)"),
                fix,
            );
        }
    }
    Line::ok(
        "cdi",
        format!(
            "{spec_path}: {devices} device(s), driver {}{}",
            spec_driver.as_deref().unwrap_or("?"),
            if inventory.is_some() { ", matches NVML's inventory" } else { "" }
        ),
    )
}

fn check_containerd(settings: &Settings, env: &dyn DoctorEnv) -> Line {
    let root = &settings.host_root;
    let version = match env.containerd_version() {
        Ok(v) => v,
        Err(e) => {
            return Line::fail(
                "containerd",
                format!("containerd does not answer: {e}"),
                "start containerd (systemctl start containerd) or pass --containerd-socket",
            );
        }
    };
    // Read everything containerd reads, our drop-in included.
    let sources = match crate::install::read_sources(root, &settings.containerd_config, "", &version) {
        Ok(s) => s,
        Err(e) => return Line::fail("containerd", e.to_string(), "fix the file named above"),
    };
    let runtime = match containerd::effective_runtime(&sources, &version, &settings.handler) {
        Ok(Some(r)) => r,
        Ok(None) => {
            return Line::fail(
                "containerd",
                format!(
                    "{} (and its imports) define no runtime `{}`",
                    settings.containerd_config, settings.handler
                ),
                "run `nvinject-installer install`",
            );
        }
        Err(e) => return Line::fail("containerd", e.to_string(), "fix the file named above"),
    };
    if !runtime.container_annotations.iter().any(|a| a == CDI_ANNOTATIONS) {
        return Line::fail(
            "containerd",
            format!(
                "runtime `{}` ({}) does not pass {CDI_ANNOTATIONS} annotations",
                settings.handler, runtime.defined_in
            ),
            "run `nvinject-installer install` to rewrite the runtime entry",
        );
    }
    if !runtime.pod_annotations.is_empty() {
        return Line::fail(
            "containerd",
            format!(
                "runtime `{}` ({}) passes pod annotations {:?}: a pod could request devices it was not allocated",
                settings.handler, runtime.defined_in, runtime.pod_annotations
            ),
            "remove pod_annotations from that runtime",
        );
    }
    let shim = match (runtime.runtime_type.as_deref(), runtime.runtime_path.as_deref()) {
        (_, Some(path)) if !path.is_empty() => {
            if !version.honours_runtime_path() {
                return Line::fail(
                    "containerd",
                    format!(
                        "runtime `{}` relies on runtime_path, which containerd {version} ignores",
                        settings.handler
                    ),
                    "run `nvinject-installer install` again (it detects the version) or upgrade containerd",
                );
            }
            PathBuf::from(path)
        }
        (Some(SHIM_RUNTIME_TYPE), _) => {
            let dirs = [
                settings.shim_link_dir.as_str(),
                "/usr/local/sbin",
                "/usr/local/bin",
                "/usr/sbin",
                "/usr/bin",
                "/sbin",
                "/bin",
            ];
            match dirs.iter().map(|d| host_join(d, SHIM_BINARY)).find(|p| is_executable(root, p)) {
                Some(p) => PathBuf::from(p),
                None => {
                    return Line::fail(
                        "containerd",
                        format!("{SHIM_BINARY} is not on containerd's PATH ({})", dirs.join(":")),
                        "run `nvinject-installer install` (it links the shim into --shim-link-dir)",
                    );
                }
            }
        }
        (other, _) => {
            return Line::fail(
                "containerd",
                format!(
                    "runtime `{}` has runtime_type {:?} and no runtime_path: not nvinject's",
                    settings.handler, other
                ),
                "run `nvinject-installer install`",
            );
        }
    };
    let shim_host = shim.to_string_lossy().into_owned();
    if !is_executable(root, &shim_host) {
        return Line::fail(
            "containerd",
            format!(
                "the shim {shim_host} named by runtime `{}` is missing or not executable",
                settings.handler
            ),
            "run `nvinject-installer install` to copy the binaries",
        );
    }
    // With containerd's own CDI on, it resolves the annotations before the shim: the spec must be
    // in a directory it reads, on this version's defaults and config.
    let cdi = match containerd::effective_cdi(&sources, &version) {
        Ok(c) => c,
        Err(e) => return Line::fail("containerd", e.to_string(), "fix the file named above"),
    };
    if crate::cdi::containerd_reads(root, &settings.cdi_dir, cdi.as_ref()) == Some(false)
        && let Some(cdi) = &cdi
    {
        let (detail, fix) = crate::cdi::unread_dir_message(&settings.cdi_dir, &version.to_string(), cdi);
        return Line::fail("containerd", detail, fix);
    }
    let cdi_note = match cdi.as_ref().filter(|c| c.enabled) {
        Some(_) => format!("; containerd's own CDI is on and reads {}", settings.cdi_dir),
        None => String::new(),
    };
    match env.cri_runtimes() {
        Ok(loaded) if loaded.contains_key(&settings.handler) => Line::ok(
            "containerd",
            format!(
                "containerd {version} runs handler `{}` with {shim_host} (from {}){cdi_note}",
                settings.handler, runtime.defined_in
            ),
        ),
        Ok(_) => Line::fail(
            "containerd",
            format!(
                "the config has runtime `{}` but the running containerd has not loaded it",
                settings.handler
            ),
            "restart containerd (systemctl restart containerd)",
        ),
        Err(e) => Line::fail(
            "containerd",
            format!("cannot ask containerd's CRI plugin which runtimes it loaded: {e}"),
            "make sure the CRI plugin is enabled (not in disabled_plugins)",
        ),
    }
}

/// Whether the host path is an executable regular file, following links inside the host root.
fn is_executable(root: &HostRoot, host_path: &str) -> bool {
    root.metadata(host_path)
        .ok()
        .flatten()
        .is_some_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether a listener answers on the host socket, located inside the host root.
fn socket_answers(root: &HostRoot, host_path: &str) -> bool {
    root.locate(host_path).is_ok_and(|p| std::os::unix::net::UnixStream::connect(p).is_ok())
}

fn check_plugin(root: &HostRoot, args: &DoctorArgs) -> Line {
    let dir = &args.device_plugin_dir;
    let kubelet = host_join(dir, "kubelet.sock");
    if !socket_answers(root, &kubelet) {
        return Line::fail(
            "device-plugin",
            format!("{kubelet} does not answer: the kubelet is not running here"),
            "start the kubelet, or pass --device-plugin-dir",
        );
    }
    let sockets: Vec<String> = root
        .read_dir(dir)
        .ok()
        .flatten()
        .unwrap_or_default()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|n| n.starts_with("nvinject-") && n.ends_with(".sock"))
        .collect();
    let answering: Vec<&String> =
        sockets.iter().filter(|n| socket_answers(root, &host_join(dir, n))).collect();
    if answering.is_empty() {
        return Line::fail(
            "device-plugin",
            format!("no nvinject device plugin socket answers in {dir}"),
            "check the device plugin pod: kubectl -n nvinject-system logs ds/nvinject-device-plugin",
        );
    }
    let checkpoint = host_join(dir, "kubelet_internal_checkpoint");
    let registered = read_host(root, &checkpoint)
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .map(|v| v["Data"]["RegisteredDevices"][&args.resource].as_array().map_or(0, Vec::len));
    match registered {
        Some(0) | None => Line::fail(
            "device-plugin",
            format!(
                "plugin socket {} answers, but the kubelet's checkpoint lists no {}",
                answering[0], args.resource
            ),
            "check the plugin's registration in its log and the kubelet's log",
        ),
        Some(n) => Line::ok(
            "device-plugin",
            format!("{} registered with {n} device(s) ({})", args.resource, answering[0]),
        ),
    }
}

/// Prints the lines; returns whether no phase failed.
pub fn print(lines: &[Line], out: &mut dyn Write) -> std::io::Result<bool> {
    for line in lines {
        let status = match line.status {
            Status::Ok => "OK  ",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
        };
        writeln!(out, "{status} {:<14} {}", line.phase, line.detail)?;
        if let Some(fix) = &line.fix {
            writeln!(out, "     {:<14} fix: {fix}", "")?;
        }
    }
    Ok(!lines.iter().any(|l| l.status == Status::Fail))
}

/// The real services: NVML through `nvinject-gpu`, containerd's version API and CRI.
pub struct HostEnv<'a> {
    /// containerd (version).
    pub containerd: &'a dyn Containerd,
    /// containerd's socket, a host path (CRI is served on the same socket), located inside the
    /// host root at each use.
    pub socket: String,
    /// Host root (the test container's log directory is a host path).
    pub host_root: HostRoot,
}

impl DoctorEnv for HostEnv<'_> {
    fn inventory(&self, library: Option<&Path>) -> std::result::Result<Inventory, String> {
        nvinject_gpu::discover(library).map_err(|e| e.to_string())
    }

    fn containerd_version(&self) -> std::result::Result<ContainerdVersion, String> {
        self.socket()
            .and_then(|s| crate::service::version_over_socket(&s))
            .and_then(|v| ContainerdVersion::parse(&v).map_err(|e| e.to_string()))
            .or_else(|_| self.containerd.version().map_err(|e| e.to_string()))
    }

    fn cri_runtimes(&self) -> std::result::Result<BTreeMap<String, (String, String)>, String> {
        crate::cri::loaded_runtimes(&self.socket()?)
    }

    fn run_container(&self, request: &TestContainer) -> std::result::Result<(i32, String), String> {
        let socket = self.socket()?;
        let logs = LogDir::create(&self.host_root, "/tmp").map_err(|e| e.to_string())?;
        crate::cri::run_test_container(&socket, request, &logs.host, &logs.dir.join(""))
    }
}

impl HostEnv<'_> {
    fn socket(&self) -> std::result::Result<PathBuf, String> {
        self.host_root.locate(&self.socket).map_err(|e| e.to_string())
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
            .map_err(|e| crate::error::Error::io("create", root.shown(&host))(e.into()))?;
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

/// `doctor`: checks, prints, and returns whether everything passed.
pub fn run(
    settings: &Settings,
    containerd: &crate::service::HostContainerd,
    args: &DoctorArgs,
    out: &mut dyn Write,
) -> Result<bool> {
    let env =
        HostEnv { containerd, socket: containerd.socket.clone(), host_root: settings.host_root.clone() };
    let lines = check(settings, args, &env);
    print(&lines, out).map_err(crate::error::Error::io("write", "stdout"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::fs;
    use std::os::unix::net::UnixListener;

    struct FakeEnv {
        inventory: std::result::Result<Inventory, String>,
        loaded: Vec<String>,
        container: std::result::Result<(i32, String), String>,
        ran: RefCell<Vec<TestContainer>>,
        version: ContainerdVersion,
    }

    impl DoctorEnv for FakeEnv {
        fn inventory(&self, _: Option<&Path>) -> std::result::Result<Inventory, String> {
            self.inventory.clone()
        }
        fn containerd_version(&self) -> std::result::Result<ContainerdVersion, String> {
            Ok(self.version.clone())
        }
        fn cri_runtimes(&self) -> std::result::Result<BTreeMap<String, (String, String)>, String> {
            Ok(self
                .loaded
                .iter()
                .map(|h| (h.clone(), ("io.containerd.runc.v2".into(), String::new())))
                .collect())
        }
        fn run_container(&self, request: &TestContainer) -> std::result::Result<(i32, String), String> {
            self.ran.borrow_mut().push(request.clone());
            self.container.clone()
        }
    }

    fn inventory(version: &str) -> Inventory {
        serde_json::from_value(serde_json::json!({
            "driver": {"version": version, "cuda": {"major": 12, "minor": 4}, "nvml_version": format!("12.{version}")},
            "gpus": [], "topology": []
        }))
        .unwrap()
    }

    /// A healthy node: driver loaded, spec fresh, runtime configured and loaded, plugin registered.
    struct Node {
        dir: tempfile::TempDir,
        _listeners: Vec<UnixListener>,
    }

    fn healthy_node(spec_driver: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let write = |rel: &str, text: &str| {
            let p = root.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        };
        write("sys/module/nvidia/version", "550.54.15\n");
        let digest = nvinject_cdi_gen::inventory_digest(&inventory("550.54.15"));
        write(
            "var/run/cdi/nvidia.com-gpu.json",
            &serde_json::json!({
                "cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
                "annotations": {"nvinject.io/driver-version": spec_driver, "nvinject.io/inventory-digest": digest},
                "devices": [{"name": "all", "containerEdits": {}}]
            })
            .to_string(),
        );
        write(
            "etc/containerd/config.toml",
            "version = 2\nimports = [\"/etc/containerd/conf.d/99-nvinject.toml\"]\n",
        );
        write(
            "etc/containerd/conf.d/99-nvinject.toml",
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\nruntime_type = \
             \"io.containerd.runc.v2\"\nruntime_path = \"/usr/local/nvinject/bin/containerd-shim-nvinject-v2\"\n\
             container_annotations = [\"cdi.k8s.io/*\"]\n",
        );
        write("usr/local/nvinject/bin/containerd-shim-nvinject-v2", "#!/bin/sh\n");
        // The library `settings` names: doctor locates it inside the host root before NVML.
        write("usr/lib/libnvidia-ml.so.1", "");
        fs::set_permissions(
            root.join("usr/local/nvinject/bin/containerd-shim-nvinject-v2"),
            fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        let plugins = root.join("var/lib/kubelet/device-plugins");
        fs::create_dir_all(&plugins).unwrap();
        let listeners = vec![
            UnixListener::bind(plugins.join("kubelet.sock")).unwrap(),
            UnixListener::bind(plugins.join("nvinject-gpu.sock")).unwrap(),
        ];
        write(
            "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint",
            r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-1","GPU-2"]}},"Checksum":1}"#,
        );
        Node { dir, _listeners: listeners }
    }

    fn settings(node: &Node) -> Settings {
        let mut s = Settings::defaults(HostRoot::new(node.dir.path()), PathBuf::from("/unused"));
        s.nvml_lib = Some("/usr/lib/libnvidia-ml.so.1".into());
        s
    }

    fn env(container: std::result::Result<(i32, String), String>) -> FakeEnv {
        FakeEnv {
            inventory: Ok(inventory("550.54.15")),
            loaded: vec!["runc".into(), "nvidia".into()],
            container,
            ran: RefCell::new(Vec::new()),
            version: ContainerdVersion::new(1, 7, 20),
        }
    }

    fn containerd_line(lines: &[Line]) -> &Line {
        lines.iter().find(|l| l.phase == "containerd").unwrap()
    }

    #[test]
    fn with_containerds_own_cdi_on_the_spec_dir_must_be_one_it_reads() {
        let node = healthy_node("550.54.15");
        let mut env = env(Ok((0, "GPU 0: x\n".into())));
        // 2.x: CDI on by default, default dirs include /var/run/cdi.
        env.version = ContainerdVersion::new(2, 1, 9);
        let lines = check(&settings(&node), &args(), &env);
        let line = containerd_line(&lines);
        assert_eq!(line.status, Status::Ok, "{line:?}");
        assert!(line.detail.contains("own CDI is on"), "{line:?}");

        let mut s = settings(&node);
        s.cdi_dir = "/opt/cdi".into();
        let lines = check(&s, &args(), &env);
        let line = containerd_line(&lines);
        assert_eq!(line.status, Status::Fail, "{line:?}");
        assert!(line.detail.contains("/opt/cdi") && line.detail.contains("its default"), "{line:?}");
        assert!(line.fix.as_deref().unwrap_or_default().contains("--cdi-dir=/etc/cdi"), "{line:?}");
        assert_eq!(lines.last().unwrap().status, Status::Skip, "the container phase waits");

        // 1.7: CDI off by default, any dir serves (the shim resolves) ...
        env.version = ContainerdVersion::new(1, 7, 20);
        assert_eq!(containerd_line(&check(&s, &args(), &env)).status, Status::Ok);
        // ... unless the config turns it on.
        fs::write(
            node.dir.path().join("etc/containerd/config.toml"),
            "version = 2\nimports = [\"/etc/containerd/conf.d/99-nvinject.toml\"]\n\
             [plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = true\ncdi_spec_dirs = [\"/etc/cdi\"]\n",
        )
        .unwrap();
        // 1.x: the drop-in's CRI section replaces the main file's; put the setting in the drop-in.
        let drop_in = node.dir.path().join("etc/containerd/conf.d/99-nvinject.toml");
        let text = fs::read_to_string(&drop_in).unwrap();
        fs::write(
            &drop_in,
            text.replace(
                "version = 2\n",
                "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = true\ncdi_spec_dirs = [\"/etc/cdi\"]\n",
            ),
        )
        .unwrap();
        let lines = check(&settings(&node), &args(), &env);
        let line = containerd_line(&lines);
        assert_eq!(line.status, Status::Fail, "{line:?}");
        assert!(line.detail.contains("99-nvinject.toml") && line.detail.contains("/var/run/cdi"), "{line:?}");
    }

    #[test]
    fn a_container_refused_by_containerds_cdi_points_at_the_spec_dirs_not_the_image() {
        let node = healthy_node("550.54.15");
        let env = env(Err(
            "CreateContainer: CDI device injection failed: unresolvable CDI devices nvidia.com/gpu=all"
                .into(),
        ));
        let lines = check(&settings(&node), &args(), &env);
        let line = lines.last().unwrap();
        assert_eq!((line.phase, line.status), ("container", Status::Fail), "{line:?}");
        let fix = line.fix.as_deref().unwrap_or_default();
        assert!(fix.contains("cdi_spec_dirs") && !fix.contains("image exists"), "{line:?}");
    }

    fn statuses(lines: &[Line]) -> Vec<(&'static str, Status)> {
        lines.iter().map(|l| (l.phase, l.status)).collect()
    }

    fn args() -> DoctorArgs {
        DoctorArgs { test_image: Some("busybox".into()), ..DoctorArgs::default() }
    }

    #[test]
    fn a_healthy_node_passes_every_phase() {
        let node = healthy_node("550.54.15");
        let env = env(Ok((0, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n".into())));
        let lines = check(&settings(&node), &args(), &env);
        assert_eq!(
            statuses(&lines),
            vec![
                ("driver", Status::Ok),
                ("cdi", Status::Ok),
                ("containerd", Status::Ok),
                ("device-plugin", Status::Ok),
                ("container", Status::Ok)
            ],
            "{lines:#?}"
        );
        let ran = env.ran.borrow();
        assert_eq!(ran[0].handler, "nvidia");
        assert_eq!(ran[0].annotations["cdi.k8s.io/nvinject-doctor"], "nvidia.com/gpu=all");
        assert!(lines[4].detail.contains("GPU 0: NVIDIA H100"));
        let mut out = Vec::new();
        assert!(print(&lines, &mut out).unwrap());
        assert!(String::from_utf8(out).unwrap().starts_with("OK   driver"));
    }

    #[test]
    fn a_stale_spec_fails_with_the_fix_and_the_container_phase_waits() {
        let node = healthy_node("535.104.05");
        let env = env(Ok((0, String::new())));
        let lines = check(&settings(&node), &args(), &env);
        let cdi = &lines[1];
        assert_eq!(cdi.status, Status::Fail);
        assert!(cdi.detail.contains("535.104.05") && cdi.detail.contains("550.54.15"), "{}", cdi.detail);
        assert!(cdi.fix.as_deref().unwrap().contains("nvinject-installer install"));
        assert_eq!(lines[4].status, Status::Skip);
        assert!(env.ran.borrow().is_empty(), "ran a container although an earlier phase failed");
        let mut out = Vec::new();
        assert!(!print(&lines, &mut out).unwrap());
    }

    #[test]
    fn a_runtime_containerd_has_not_loaded_asks_for_a_restart() {
        let node = healthy_node("550.54.15");
        let mut env = env(Ok((0, String::new())));
        env.loaded = vec!["runc".into()];
        let lines = check(&settings(&node), &args(), &env);
        assert_eq!(lines[2].status, Status::Fail);
        assert!(lines[2].fix.as_deref().unwrap().contains("restart containerd"), "{:?}", lines[2]);
    }

    #[test]
    fn pod_annotations_on_the_runtime_fail() {
        let node = healthy_node("550.54.15");
        let drop_in = node.dir.path().join("etc/containerd/conf.d/99-nvinject.toml");
        let text = fs::read_to_string(&drop_in).unwrap() + "pod_annotations = [\"cdi.k8s.io/*\"]\n";
        fs::write(&drop_in, text).unwrap();
        let lines = check(&settings(&node), &args(), &env(Ok((0, String::new()))));
        assert_eq!(lines[2].status, Status::Fail);
        assert!(lines[2].detail.contains("pod annotations"), "{:?}", lines[2]);
    }

    #[test]
    fn no_driver_fails_first_and_names_the_file() {
        let node = healthy_node("550.54.15");
        fs::remove_file(node.dir.path().join("sys/module/nvidia/version")).unwrap();
        let lines = check(&settings(&node), &args(), &env(Ok((0, String::new()))));
        assert_eq!(lines[0].status, Status::Fail);
        assert!(lines[0].detail.contains("/sys/module/nvidia/version"), "{:?}", lines[0]);
        assert_eq!(lines[4].status, Status::Skip);
    }

    #[test]
    fn a_container_without_a_gpu_fails_with_its_output() {
        let node = healthy_node("550.54.15");
        let env =
            env(Ok((9, "NVIDIA-SMI has failed because it couldn't communicate with the driver\n".into())));
        let lines = check(&settings(&node), &args(), &env);
        assert_eq!(lines[4].status, Status::Fail);
        assert!(lines[4].detail.contains("exited 9") && lines[4].detail.contains("couldn't communicate"));
    }

    #[test]
    fn a_missing_kubelet_fails_the_plugin_phase_only() {
        let node = healthy_node("550.54.15");
        let mut a = args();
        a.device_plugin_dir = "/nowhere".into();
        let lines = check(&settings(&node), &a, &env(Ok((0, "GPU 0".into()))));
        assert_eq!(lines[3].status, Status::Fail);
        assert_eq!(lines[4].status, Status::Ok, "the container phase does not need the kubelet");
    }
}
