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

use crate::containerd::imports::parent_dir;
use crate::containerd::{
    self, ContainerdVersion, EffectiveCdi, MainChange, Plan, RuntimeMode, RuntimeRequest,
};
use crate::containerd_files::read_sources;
use crate::devchar;
use crate::error::{Error, Result};
use crate::foreign_specs;
use crate::fsx::{self, FaultHook};
use crate::lock::HostLock;
use crate::paths::{CONFIG_LIMIT, host_join};
use crate::runtime_config::shim_spec_dirs;
use crate::service::{Containerd, Restarted};
use crate::settings::SHIM_BINARY;
use crate::state::{Change, Ledger, LinkOutcome, Role};

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

// An install's input and seams live in their own modules (each seam with its production
// implementation); re-exported here because an install is where callers meet them.
pub use crate::cdi::{SpecGenerator, SpecRequest};
pub use crate::runtime_config::RuntimeConfigWriter;
pub use crate::settings::Settings;

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
                hook_timeout_secs: s.hook_timeout_secs,
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
    let mut readers =
        vec![foreign_specs::shim_reader(Some(shim_config), Path::new(&s.runtime_config), shim_spec_dirs(s))];
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
