//! Install and uninstall, step by step.
//!
//! Every input is read and every plan made before the first write, so a bad containerd config or
//! a missing binary fails with nothing changed. Then the steps run in an order that keeps the host
//! consistent at every instant: binaries before the config that names them, the drop-in before
//! the `imports` entry that loads it (containerd refuses to start on an import of a missing
//! file), and on uninstall the reverse. containerd is restarted only when its files changed (or a
//! killed earlier run left a restart owed), then the installer waits until it answers.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use std::time::Duration;

use crate::containerd::imports::parent_dir;
use crate::containerd::{
    self, ConfigSources, ContainerdVersion, EffectiveCdi, MainChange, Plan, RuntimeMode, RuntimeRequest,
};
use crate::devchar;
use crate::error::{Error, Result};
use crate::foreign_specs;
use crate::fsx::{self, FaultHook};
use crate::lock::HostLock;
use crate::paths::{CONFIG_LIMIT, HostRoot, host_join};
use crate::service::{Containerd, Restarted};
use crate::state::{Change, Ledger, LinkOutcome, Role};

/// The shim binary containerd starts.
pub const SHIM_BINARY: &str = "containerd-shim-nvinject-v2";

/// The binaries installed into `<install dir>/bin`, and whether each is required.
pub const BINARIES: &[(&str, bool)] = &[
    (SHIM_BINARY, true),
    (nvinject_cdi::nvinject::HOOK_PROGRAM, true),
    // The shim regenerates a stale or missing spec by running it (beside itself), so a node
    // without it could not heal after a driver upgrade.
    ("nvinject-cdi", true),
    ("nvinject-device-plugin", false),
    ("nvinject-installer", false),
];

/// Mode of every directory the installer creates on the host (exact, whatever the umask): the
/// binaries, configs and specs in them are read by containerd, the shim and the plugin, and
/// written only by root. The state directory is narrower ([`crate::state::STATE_DIR_MODE`]).
pub const DIR_MODE: u32 = 0o755;

/// The CDI spec file the installer owns (JSON: the fastest for the shim to parse).
pub const SPEC_FILE: &str = nvinject_cdi::nvinject::SPEC_FILE_NAME;

/// Everything install and uninstall need to know; every path is a host path.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where the host's `/` is reachable.
    pub host_root: HostRoot,
    /// Install prefix (`/usr/local/nvinject`); binaries go to `<prefix>/bin`.
    pub install_dir: String,
    /// Where the binaries to install are (a local path, not under the host root).
    pub source_dir: PathBuf,
    /// containerd's main config file.
    pub containerd_config: String,
    /// Directory of our drop-in (default: `conf.d` next to the main config).
    pub drop_in_dir: String,
    /// Runtime handler and RuntimeClass handler name.
    pub handler: String,
    /// Make the handler containerd's default runtime.
    pub set_as_default: bool,
    /// `/etc/nvinject/config.toml`.
    pub runtime_config: String,
    /// Where CDI specs go (`/var/run/cdi`).
    pub cdi_dir: String,
    /// Driver root on the host (`/`, or `/run/nvidia/driver` with a driver container).
    pub driver_root: String,
    /// Dev root on the host: device nodes are `<dev root>/dev/nvidia*` (`/`).
    pub dev_root: String,
    /// Proc root on the host (`/proc`).
    pub proc_root: String,
    /// Sys root on the host (`/sys`).
    pub sys_root: String,
    /// NVML library to load (host path); default: found under the driver root.
    pub nvml_lib: Option<String>,
    /// The MPS control daemon's pipe directory (host path), when the node runs MPS; `None`: no MPS.
    pub mps_pipe_dir: Option<String>,
    /// Where the shim is linked onto containerd's `PATH` when containerd ignores `runtime_path`.
    pub shim_link_dir: String,
    /// The installer's state directory.
    pub state_dir: String,
    /// The host lock file.
    pub lock_file: String,
    /// How long to wait for another installer.
    pub lock_wait: Duration,
    /// Whether to create `/dev/char` links.
    pub dev_char_links: bool,
    /// Writes `[requests] accept-nvidia-visible-devices-as-volume-mounts = true` into the runtime
    /// config: needed when the device plugin uses the volume-mounts device-list strategy, and off
    /// by default (as in NVIDIA's toolkit) because any pod can ask for such a mount.
    pub accept_volume_mounts: bool,
}

impl Settings {
    /// Defaults for a host mounted at `host_root`.
    pub fn defaults(host_root: HostRoot, source_dir: PathBuf) -> Settings {
        Settings {
            host_root,
            install_dir: "/usr/local/nvinject".into(),
            source_dir,
            containerd_config: "/etc/containerd/config.toml".into(),
            drop_in_dir: "/etc/containerd/conf.d".into(),
            handler: "nvidia".into(),
            set_as_default: false,
            runtime_config: "/etc/nvinject/config.toml".into(),
            cdi_dir: "/var/run/cdi".into(),
            driver_root: "/".into(),
            dev_root: "/".into(),
            proc_root: "/proc".into(),
            sys_root: "/sys".into(),
            nvml_lib: None,
            mps_pipe_dir: None,
            shim_link_dir: "/usr/local/bin".into(),
            state_dir: "/var/lib/nvinject/installer".into(),
            lock_file: "/run/nvinject-installer.lock".into(),
            lock_wait: Duration::from_secs(120),
            dev_char_links: true,
            accept_volume_mounts: false,
        }
    }

    /// `<install dir>/bin`.
    pub fn bin_dir(&self) -> String {
        host_join(&self.install_dir, "bin")
    }

    /// Host path of the shim.
    pub fn shim_path(&self) -> String {
        host_join(&self.bin_dir(), SHIM_BINARY)
    }

    /// Host path of the OCI hook.
    pub fn hook_path(&self) -> String {
        host_join(&self.bin_dir(), nvinject_cdi::nvinject::HOOK_PROGRAM)
    }

    /// Host path of our drop-in.
    pub fn drop_in_path(&self) -> String {
        host_join(&self.drop_in_dir, "99-nvinject.toml")
    }

    /// Host path of the CDI spec.
    pub fn spec_path(&self) -> String {
        host_join(&self.cdi_dir, SPEC_FILE)
    }
}

// The spec seam lives with its production implementation; re-exported here because an install
// is where callers meet it.
pub use crate::cdi::{SpecGenerator, SpecRequest};

/// Produces `/etc/nvinject/config.toml` (the shim's config type in production).
pub trait RuntimeConfigWriter {
    /// The file's content for these settings.
    fn render(&self, settings: &Settings, mode: RuntimeMode) -> Result<String>;
}

/// What an install did.
#[derive(Debug, Clone)]
pub struct InstallReport {
    /// The containerd found.
    pub containerd: ContainerdVersion,
    /// How containerd starts the shim.
    pub mode: RuntimeMode,
    /// Host paths written this run.
    pub written: Vec<String>,
    /// Whether containerd was restarted (or would have been, with restart mode `none`).
    pub restart: Option<Restarted>,
    /// Things the operator should know.
    pub warnings: Vec<String>,
}

/// What an uninstall did.
#[derive(Debug, Clone)]
pub struct UninstallReport {
    /// Host paths restored to their original bytes.
    pub restored: Vec<String>,
    /// Host paths removed.
    pub removed: Vec<String>,
    /// Host paths left as they are (changed by someone since).
    pub kept: Vec<(String, String)>,
    /// Whether containerd was restarted.
    pub restart: Option<Restarted>,
    /// Things the operator should know.
    pub warnings: Vec<String>,
}

/// The installer with its edges.
pub struct Installer<'a> {
    /// Settings.
    pub settings: Settings,
    /// containerd (version, restart).
    pub containerd: &'a dyn Containerd,
    /// CDI spec source; `None` skips the spec.
    pub spec: Option<&'a dyn SpecGenerator>,
    /// Runtime config renderer.
    pub runtime_config: &'a dyn RuntimeConfigWriter,
    /// Fault-injection hook (inert in production).
    pub hook: &'a FaultHook,
}

/// Everything read and computed before the first write.
struct Prepared {
    containerd: ContainerdVersion,
    plan: Plan,
    binaries: Vec<(String, Vec<u8>)>,
    runtime_config: String,
    spec: Option<Vec<u8>>,
    links: Vec<devchar::CharLink>,
    /// The file the main config path finally names (it may be a link an operator keeps).
    main_file: String,
    /// Mode of a new drop-in: no wider than the main file's.
    drop_in_mode: u32,
    /// `/etc/nvinject/config.toml` as found.
    runtime_config_current: Option<Vec<u8>>,
    /// Our drop-in as found.
    drop_in_current: Option<Vec<u8>>,
    warnings: Vec<String>,
}

impl Installer<'_> {
    fn lock(&self) -> Result<HostLock> {
        HostLock::acquire(&self.settings.host_root, &self.settings.lock_file, self.settings.lock_wait)
    }

    fn prepare(&self, ledger: &Ledger<'_>) -> Result<Prepared> {
        let s = &self.settings;
        let containerd = self.containerd.version()?;
        let mut sources = read_sources(&s.host_root, &s.containerd_config, &s.drop_in_path(), &containerd)?;
        // An earlier install with another drop-in path left its import in the main file: drop it
        // (its file is removed at the end of this run).
        let on_disk = sources.main.clone();
        for old in ledger.paths_with_role(Role::DropIn) {
            if old == s.drop_in_path() {
                continue;
            }
            if let Some(text) = &sources.main
                && let Some(stripped) = containerd::remove_import(&s.containerd_config, text, &old)?
            {
                sources.main = Some(stripped);
            }
        }
        let request = RuntimeRequest {
            handler: s.handler.clone(),
            shim_path: s.shim_path(),
            set_as_default: s.set_as_default,
            drop_in_path: s.drop_in_path(),
        };
        let mut plan = containerd::plan(&sources, &containerd, &request)?;
        if plan.main == MainChange::Unchanged && sources.main != on_disk {
            plan.main = MainChange::Update(sources.main.clone().unwrap_or_default());
        }
        let mut warnings = plan.warnings.clone();
        // containerd's own CDI (2.x's default) resolves the annotations before our shim: it must
        // read the directory the spec goes to.
        let cdi = containerd::effective_cdi(&sources, &containerd)?;
        if crate::cdi::containerd_reads(&s.host_root, &s.cdi_dir, cdi.as_ref()) == Some(false)
            && let Some(cdi) = &cdi
        {
            let (detail, fix) = crate::cdi::unread_dir_message(&s.cdi_dir, &containerd.to_string(), cdi);
            warnings.push(format!("{detail}: {fix}"));
        }

        let mut binaries = Vec::new();
        for (name, required) in BINARIES {
            let path = s.source_dir.join(name);
            match fs::read(&path) {
                Ok(bytes) => binaries.push((host_join(&s.bin_dir(), name), bytes)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                    warnings.push(format!("{} not found: not installed", path.display()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Error::MissingBinary { path });
                }
                Err(e) => return Err(Error::io("read", path)(e)),
            }
        }
        let runtime_config = self.runtime_config.render(s, plan.mode)?;
        let spec = match self.spec {
            Some(generator) => Some(generator.generate(&SpecRequest {
                host_root: s.host_root.clone(),
                driver_root: s.driver_root.clone(),
                dev_root: s.dev_root.clone(),
                proc_root: s.proc_root.clone(),
                sys_root: s.sys_root.clone(),
                nvml_lib: s.nvml_lib.clone(),
                hook_path: s.hook_path(),
                mps_pipe_dir: s.mps_pipe_dir.clone(),
            })?),
            None => None,
        };
        if plan.mode == RuntimeMode::ShimType {
            // Checked before anything is written, so a conflict leaves the host untouched.
            let link = host_join(&s.shim_link_dir, SHIM_BINARY);
            if s.host_root.symlink_metadata(&link)?.is_some() && ledger.entry(&link).is_none() {
                let target = s.host_root.read_link(&link)?;
                if target.as_deref() != Some(s.shim_path().as_str()) {
                    return Err(shim_link_taken(s.host_root.shown(&link)));
                }
            }
        }
        let links = if s.dev_char_links {
            devchar::plan_links(&devchar::scan(&s.host_root, &host_join(&s.dev_root, "dev"))?)
        } else {
            Vec::new()
        };
        // Writing renames a new file over the old one; through a link that would replace the
        // operator's link with a copy, so the file the link names is written instead.
        let main_file = s.host_root.follow_links(&s.containerd_config)?;
        if main_file != s.containerd_config {
            tracing::info!(config = %s.containerd_config, file = %main_file, "containerd config is a link: editing its target");
        }
        // On containerd 1.x the drop-in repeats the CRI section, registry credentials included: it
        // must not be readable by more users than the main file.
        let drop_in_mode =
            s.host_root.metadata(&main_file)?.map_or(0o644, |m| m.permissions().mode() & 0o644);
        // Read now, so an unreadable one fails before the first write.
        let runtime_config_current = s.host_root.read(&s.runtime_config, CONFIG_LIMIT)?;
        let drop_in_current = s.host_root.read(&s.drop_in_path(), CONFIG_LIMIT)?;
        // Another tool's spec defining our devices breaks them (same directory) or takes them over
        // (a directory read later). Said, never fatal: every other device still works, and the
        // operator may be removing NVIDIA's pieces in the same rollout.
        if let Some(spec) = &spec {
            let shim_config = runtime_config_current
                .as_deref()
                .and_then(|b| std::str::from_utf8(b).ok())
                .unwrap_or(&runtime_config);
            warnings.extend(foreign_spec_warnings(s, spec, shim_config, cdi.as_ref()));
        }
        Ok(Prepared {
            containerd,
            plan,
            binaries,
            runtime_config,
            spec,
            links,
            main_file,
            drop_in_mode,
            runtime_config_current,
            drop_in_current,
            warnings,
        })
    }

    /// Installs (or converges an existing install). Idempotent: a second run writes nothing and
    /// restarts nothing.
    pub fn install(&self) -> Result<InstallReport> {
        let _lock = self.lock()?;
        let s = &self.settings;
        let mut ledger = Ledger::load(&s.host_root, &s.state_dir, self.hook)?;
        let prepared = self.prepare(&ledger)?;
        let mut warnings = prepared.warnings;
        let mut written = Vec::new();
        fn record(written: &mut Vec<String>, path: &str, change: Change) {
            if change == Change::Written {
                written.push(path.to_owned());
            }
        }

        ledger.ensure_dir(&s.bin_dir(), DIR_MODE)?;
        for (path, bytes) in &prepared.binaries {
            record(&mut written, path, ledger.write_file(path, bytes, 0o755, Role::Binary)?);
        }

        let config_path = &s.runtime_config;
        let current = prepared.runtime_config_current.as_deref().map(fsx::sha256_hex);
        let recorded = ledger.entry(config_path);
        if current.is_some() && recorded.is_none() {
            ledger.keep(config_path);
            warnings.push(format!(
                "{config_path} exists and was not written by the installer: kept as it is (delete it to get the \
                 installer's)"
            ));
        } else if current.is_some() && recorded.is_some_and(|e| current != e.after && current != e.before) {
            ledger.keep(config_path);
            warnings.push(format!("{config_path} was edited since install: kept as it is"));
        } else {
            ledger.ensure_dir(&parent_dir(config_path), DIR_MODE)?;
            record(
                &mut written,
                config_path,
                ledger.write_file(
                    config_path,
                    prepared.runtime_config.as_bytes(),
                    0o644,
                    Role::RuntimeConfig,
                )?,
            );
        }

        if let Some(spec) = &prepared.spec {
            ledger.ensure_dir(&s.cdi_dir, DIR_MODE)?;
            let path = s.spec_path();
            record(&mut written, &path, ledger.write_file(&path, spec, 0o644, Role::CdiSpec)?);
        }

        if !prepared.links.is_empty() {
            ledger.ensure_dir(&host_join(&s.dev_root, "dev/char"), DIR_MODE)?;
        }
        for link in &prepared.links {
            let path = host_join(&host_join(&s.dev_root, "dev"), &link.link);
            match ledger.symlink(&path, &link.target, Role::DevCharLink)? {
                LinkOutcome::Created => written.push(path),
                LinkOutcome::Present => {}
                // udev or systemd made one already: theirs is as good as ours.
                LinkOutcome::Occupied(_) => {}
            }
        }

        if prepared.plan.mode == RuntimeMode::ShimType {
            ledger.ensure_dir(&s.shim_link_dir, DIR_MODE)?;
            let path = host_join(&s.shim_link_dir, SHIM_BINARY);
            match ledger.symlink(&path, &s.shim_path(), Role::ShimLink)? {
                LinkOutcome::Created => written.push(path),
                LinkOutcome::Present => {}
                LinkOutcome::Occupied(_) => return Err(shim_link_taken(s.host_root.shown(&path))),
            }
        }

        // containerd's files: drop-in first, then the import that loads it.
        let drop_in = s.drop_in_path();
        let drop_in_changes = prepared.drop_in_current.as_deref() != Some(prepared.plan.drop_in.as_bytes());
        let main_changes = !matches!(prepared.plan.main, MainChange::Unchanged);
        if drop_in_changes || main_changes {
            ledger.set_restart_pending(true)?;
        }
        ledger.ensure_dir(&s.drop_in_dir, DIR_MODE)?;
        record(
            &mut written,
            &drop_in,
            ledger.write_file(
                &drop_in,
                prepared.plan.drop_in.as_bytes(),
                prepared.drop_in_mode,
                Role::DropIn,
            )?,
        );
        let main_file = &prepared.main_file;
        match &prepared.plan.main {
            MainChange::Unchanged => ledger.keep(main_file),
            MainChange::Update(text) | MainChange::Create(text) => {
                ledger.ensure_dir(&parent_dir(main_file), DIR_MODE)?;
                record(
                    &mut written,
                    main_file,
                    ledger.write_file(main_file, text.as_bytes(), 0o644, Role::ContainerdMain)?,
                );
            }
        }
        // Leftovers of an earlier install with other settings (another drop-in dir, ...).
        if ledger.drop_untouched(&mut warnings)? {
            ledger.set_restart_pending(true)?;
        }

        let restart = if ledger.state().restart_pending {
            let restarted = self.containerd.restart()?;
            if restarted == Restarted::Skipped {
                warnings.push(
                    "containerd's configuration changed but --restart-mode is none: restart containerd to load the \
                     `nvidia` runtime"
                        .to_owned(),
                );
            }
            ledger.set_restart_pending(false)?;
            Some(restarted)
        } else {
            None
        };
        for w in &warnings {
            tracing::warn!(warning = %w, "install");
        }
        Ok(InstallReport {
            containerd: prepared.containerd,
            mode: prepared.plan.mode,
            written,
            restart,
            warnings,
        })
    }

    /// Removes what install did: restores the original bytes of every file it changed that
    /// nobody changed since, removes its own files, and restarts containerd if its files changed.
    pub fn uninstall(&self) -> Result<UninstallReport> {
        let lock = self.lock()?;
        let s = &self.settings;
        let mut ledger = Ledger::load(&s.host_root, &s.state_dir, self.hook)?;
        let mut warnings = Vec::new();
        let drop_in = s.drop_in_path();
        let main_path = s.containerd_config.clone();
        let strip = move |text: &str| -> Result<Option<String>> {
            Ok(containerd::remove_import(&main_path, text, &drop_in)?)
        };
        // Write-ahead, like install: a kill after the files changed still owes containerd a restart.
        let was_pending = ledger.state().restart_pending;
        if ledger.touches_containerd() {
            ledger.set_restart_pending(true)?;
        }
        let undo = ledger.uninstall(&strip, &mut warnings)?;
        let restart = if undo.containerd_changed || was_pending {
            let restarted = self.containerd.restart()?;
            if restarted == Restarted::Skipped {
                warnings.push(
                    "containerd's configuration changed but --restart-mode is none: restart containerd to drop the \
                     runtime"
                        .to_owned(),
                );
            }
            Some(restarted)
        } else {
            None
        };
        ledger.finish()?;
        // Last: nothing of nvinject stays on the host, its lock file included.
        lock.remove()?;
        for w in &warnings {
            tracing::warn!(warning = %w, "uninstall");
        }
        Ok(UninstallReport {
            restored: undo.restored,
            removed: undo.removed,
            kept: undo.kept,
            restart,
            warnings,
        })
    }
}

/// Install's warnings about specs of other tools that define the devices of `spec` (ours, about
/// to be written) where the shim (configured by `shim_config`) or containerd's CDI would see them.
fn foreign_spec_warnings(
    s: &Settings,
    spec: &[u8],
    shim_config: &str,
    cdi: Option<&EffectiveCdi>,
) -> Vec<String> {
    let our_spec = s.spec_path();
    let Some((kind, names)) = foreign_specs::our_devices(spec, &our_spec) else { return Vec::new() };
    let mut readers = vec![foreign_specs::shim_reader(
        Some(shim_config),
        Path::new(&s.runtime_config),
        crate::runtime_config::shim_spec_dirs(s),
    )];
    readers.extend(foreign_specs::containerd_reader(cdi));
    let scan = foreign_specs::scan(&s.host_root, &our_spec, &readers);
    foreign_specs::warnings(&foreign_specs::find(&kind, &names, &scan), &our_spec)
}

/// Something not ours is where the shim link goes (checked before the first write, and again
/// when the link is placed).
fn shim_link_taken(path: PathBuf) -> Error {
    Error::NotOurs {
        path,
        fix: "remove it, or pass --shim-link-dir with another directory on containerd's PATH",
    }
}

/// Reads containerd's main config and the files it imports (transitively, in load order),
/// skipping `drop_in`.
pub fn read_sources(
    root: &HostRoot,
    main_path: &str,
    drop_in: &str,
    containerd: &ContainerdVersion,
) -> Result<ConfigSources> {
    let main = match root.read(main_path, CONFIG_LIMIT)? {
        None => None,
        Some(bytes) => Some(String::from_utf8(bytes).map_err(|_| {
            Error::Plan(containerd::PlanError::Parse {
                path: main_path.to_owned(),
                message: "not UTF-8 text".into(),
            })
        })?),
    };
    let mut sources = ConfigSources {
        main_path: main_path.to_owned(),
        main: main.clone(),
        imported: Vec::new(),
        imported_before_drop_in: 0,
    };
    let mut loaded = vec![main_path.to_owned()];
    let mut pending: Vec<(String, String)> =
        main.map(|t| vec![(main_path.to_owned(), t)]).unwrap_or_default();
    // Where containerd will load the drop-in: files are read in load order (breadth first, as
    // containerd does), so that is the number read when an entry names it.
    let mut drop_in_at: Option<usize> = None;
    while !pending.is_empty() {
        let (path, text) = pending.remove(0);
        for target in containerd::plan::import_targets(&path, &text, containerd)? {
            let files = match &target {
                containerd::imports::ImportTarget::File(f) => vec![f.clone()],
                containerd::imports::ImportTarget::Glob(pattern) => {
                    let mut files = expand_glob(root, pattern)?;
                    // On a first install the drop-in does not exist yet; the glob will match it.
                    if !drop_in.is_empty() && target.covers(drop_in) && !files.iter().any(|f| f == drop_in) {
                        let at = files.iter().position(|f| f.as_str() > drop_in).unwrap_or(files.len());
                        files.insert(at, drop_in.to_owned());
                    }
                    files
                }
            };
            for file in files {
                if file == drop_in {
                    drop_in_at.get_or_insert(sources.imported.len());
                    continue;
                }
                if loaded.contains(&file) {
                    continue;
                }
                loaded.push(file.clone());
                // containerd fails on a missing plain import; that is the operator's to fix, and
                // planning around it is still right, so only note it. A glob entry exists by
                // definition: one that cannot be read (a dangling link) would make containerd fail
                // to start, so nothing is changed.
                // A refusal (a directory, FIFO or device, an oversized file: `imports = [""]` names
                // the config's own directory) names the importing file and its entry too.
                let read = root.read(&file, CONFIG_LIMIT).map_err(|e| Error::Source {
                    path: root.shown(&path),
                    message: format!(
                        "`imports` entry {} names a file that cannot be read: {e}",
                        target_text(&target)
                    ),
                })?;
                let Some(bytes) = read else {
                    if matches!(target, containerd::imports::ImportTarget::Glob(_)) {
                        return Err(Error::Source {
                            path: root.shown(&file),
                            message: format!(
                                "matches containerd's import {} but is a link to a missing file (containerd \
                                 would fail to load it): remove the link or restore its target",
                                target_text(&target)
                            ),
                        });
                    }
                    tracing::warn!(file = %file, "imported containerd config file does not exist");
                    continue;
                };
                // Strict, like the main file: a lossy copy would put replacement characters into
                // the drop-in, which repeats the CRI section on containerd 1.x.
                let text = String::from_utf8(bytes).map_err(|_| {
                    Error::Plan(containerd::PlanError::Parse {
                        path: file.clone(),
                        message: "not UTF-8 text".into(),
                    })
                })?;
                sources.imported.push(containerd::SourceFile { path: file.clone(), text: text.clone() });
                pending.push((file, text));
            }
        }
        if path == main_path {
            // Not imported yet: the entry we add goes after the main file's others.
            drop_in_at.get_or_insert(sources.imported.len());
        }
    }
    sources.imported_before_drop_in = drop_in_at.unwrap_or(sources.imported.len());
    Ok(sources)
}

fn target_text(target: &containerd::imports::ImportTarget) -> &str {
    match target {
        containerd::imports::ImportTarget::File(f) | containerd::imports::ImportTarget::Glob(f) => f,
    }
}

/// Expands an absolute glob pattern on the host, sorted like Go's `filepath.Glob` (which, like
/// containerd, lists entries without following them: a dangling link matches). Every directory is
/// listed inside the host root.
fn expand_glob(root: &HostRoot, pattern: &str) -> Result<Vec<String>> {
    let mut matches = vec!["/".to_owned()];
    for component in pattern.split('/').filter(|c| !c.is_empty()) {
        let mut next = Vec::new();
        for base in &matches {
            let has_meta = component.contains(['*', '?', '[']);
            if !has_meta {
                let candidate = host_join(base, component);
                if root.symlink_metadata(&candidate)?.is_some() {
                    next.push(candidate);
                }
                continue;
            }
            // A base that is missing or not a directory matches nothing, as in Go.
            let entries = match root.read_dir(base) {
                Ok(Some(entries)) => entries,
                Ok(None) => continue,
                Err(Error::HostFile { source, .. })
                    if source.source.raw_os_error() == Some(nix::errno::Errno::ENOTDIR as i32) =>
                {
                    continue;
                }
                Err(e) => return Err(e),
            };
            for (name, _) in entries {
                if containerd::imports::component_match(component, &name) {
                    next.push(host_join(base, &name));
                }
            }
        }
        matches = next;
    }
    Ok(matches)
}
