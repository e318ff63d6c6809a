//! `nvinject-installer`: install, uninstall, run (the DaemonSet mode), manifests and doctor.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use nix::sys::signal::Signal;
use nvinject_installer::containerd::ContainerdVersion;
use nvinject_installer::fsx::FaultHook;
use nvinject_installer::install::{InstallReport, Installer, SpecGenerator, UninstallReport};
use nvinject_installer::paths::HostRoot;
use nvinject_installer::runtime_config::ShimConfig;
use nvinject_installer::service::{HostContainerd, RestartMode, Restarted};
use nvinject_installer::settings::Settings;
use nvinject_installer::{cdi, doctor, manifests};

#[derive(Parser, Debug)]
#[command(
    name = "nvinject-installer",
    version,
    about = "Makes a containerd node GPU-ready with nvinject, and undoes it"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text", env = "NVINJECT_LOG_FORMAT")]
    log_format: LogFormat,
    /// Log level (error, warn, info, debug, trace) or a tracing filter.
    #[arg(long, global = true, default_value = "info", env = "NVINJECT_LOG_LEVEL")]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Install (or converge): binaries, runtime config, CDI spec, /dev/char links, containerd runtime.
    Install(HostArgs),
    /// Undo what install did, restoring every file it changed that nobody changed since.
    Uninstall(HostArgs),
    /// DaemonSet mode: install (retrying until it succeeds), wait for SIGTERM, uninstall.
    Run(RunArgs),
    /// Print (or write) the Kubernetes manifests: DaemonSets, RuntimeClass, ConfigMap, RBAC.
    Manifests(manifests::ManifestArgs),
    /// Check a node phase by phase: driver, CDI spec, containerd, device plugin, a test container.
    Doctor(DoctorCommand),
    /// Exit 0 once `run` finished installing (the DaemonSet's readiness probe).
    Probe(ProbeArgs),
}

#[derive(Args, Debug)]
struct ProbeArgs {
    /// The file `run` creates after a successful install.
    #[arg(long, default_value = "/run/nvinject/ready")]
    ready_file: PathBuf,
}

#[derive(Args, Debug, Clone)]
struct HostArgs {
    /// Where the host's `/` is mounted (`/host` in the DaemonSet). Every other path is a host path.
    #[arg(long, default_value = "/", env = "NVINJECT_HOST_ROOT")]
    host_root: PathBuf,
    /// Install prefix on the host; binaries go to <dir>/bin.
    #[arg(long, default_value = "/usr/local/nvinject", env = "NVINJECT_INSTALL_DIR")]
    install_dir: String,
    /// Directory holding the binaries to install (default: this executable's directory).
    #[arg(long, env = "NVINJECT_SOURCE_DIR")]
    source_dir: Option<PathBuf>,
    /// containerd's main config file.
    #[arg(long, default_value = "/etc/containerd/config.toml", env = "NVINJECT_CONTAINERD_CONFIG")]
    containerd_config: String,
    /// Directory for nvinject's drop-in (default: conf.d next to the main config).
    #[arg(long, env = "NVINJECT_DROP_IN_DIR")]
    drop_in_dir: Option<String>,
    /// containerd's gRPC socket.
    #[arg(long, default_value = "/run/containerd/containerd.sock", env = "NVINJECT_CONTAINERD_SOCKET")]
    containerd_socket: String,
    /// The containerd binary, run with --version when the socket does not answer.
    #[arg(long, default_value = "/usr/bin/containerd", env = "NVINJECT_CONTAINERD_BINARY")]
    containerd_binary: String,
    /// The containerd version, instead of asking containerd (for example 1.7.20).
    #[arg(long, env = "NVINJECT_CONTAINERD_VERSION")]
    containerd_version: Option<String>,
    /// The containerd systemd unit (restart mode systemd).
    #[arg(long, default_value = "containerd", env = "NVINJECT_CONTAINERD_UNIT")]
    containerd_unit: String,
    /// Runtime handler name, also the RuntimeClass handler.
    #[arg(long, alias = "runtime-class", default_value = "nvidia", env = "NVINJECT_HANDLER")]
    handler: String,
    /// Make the handler containerd's default runtime.
    #[arg(long, env = "NVINJECT_SET_AS_DEFAULT")]
    set_as_default: bool,
    /// How containerd is restarted after its configuration changed.
    #[arg(long, value_enum, default_value = "systemd", env = "NVINJECT_RESTART_MODE")]
    restart_mode: RestartMode,
    /// Signal for restart mode `signal`.
    #[arg(long, default_value = "SIGHUP", env = "NVINJECT_RESTART_SIGNAL")]
    restart_signal: Signal,
    /// Seconds to wait for containerd to answer after a restart.
    #[arg(long, default_value_t = 60, env = "NVINJECT_RESTART_TIMEOUT")]
    restart_timeout: u64,
    /// Driver root on the host (`/run/nvidia/driver` with a driver container).
    #[arg(long, default_value = "/", env = "NVINJECT_DRIVER_ROOT")]
    driver_root: String,
    /// Dev root on the host: device nodes are <dev root>/dev/nvidia*.
    #[arg(long, default_value = "/", env = "NVINJECT_DEV_ROOT")]
    dev_root: String,
    /// proc on the host.
    #[arg(long, default_value = "/proc", env = "NVINJECT_PROC_ROOT")]
    proc_root: String,
    /// sys on the host.
    #[arg(long, default_value = "/sys", env = "NVINJECT_SYS_ROOT")]
    sys_root: String,
    /// NVML library on the host (default: libnvidia-ml.so.1 under the driver root).
    #[arg(long, env = "NVINJECT_NVML_LIB")]
    nvml_lib: Option<String>,
    /// The MPS control daemon's pipe directory on the host, when the node runs MPS: the spec's
    /// `mps` device mounts it writable, with CUDA_MPS_PIPE_DIRECTORY, into the containers given
    /// that device (the device plugin's MPS-shared GPUs), never into every GPU container
    /// (default: no MPS).
    #[arg(long, env = "NVINJECT_MPS_PIPE_DIR")]
    mps_pipe_dir: Option<String>,
    /// The OCI timeout of each hook run the spec carries, in seconds (1 to 3600): runc kills a hook
    /// still running after it and fails the container's start. Also what the shim regenerates with.
    #[arg(long, env = "NVINJECT_HOOK_TIMEOUT_SECS", default_value_t = nvinject_cdi::nvinject::DEFAULT_HOOK_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u32).range(1..=3600))]
    hook_timeout_secs: u32,
    /// CDI spec directory on the host.
    #[arg(long, default_value = "/var/run/cdi", env = "NVINJECT_CDI_DIR")]
    cdi_dir: String,
    /// Do not generate the CDI spec (it is managed elsewhere).
    #[arg(long, env = "NVINJECT_SKIP_CDI_SPEC")]
    skip_cdi_spec: bool,
    /// Do not create /dev/char links for the NVIDIA devices.
    #[arg(long, env = "NVINJECT_NO_DEV_CHAR_LINKS")]
    no_dev_char_links: bool,
    /// The runtime configuration file on the host.
    #[arg(long, default_value = "/etc/nvinject/config.toml", env = "NVINJECT_RUNTIME_CONFIG")]
    runtime_config: String,
    /// A directory on containerd's PATH, for the shim link containerd < 1.6.21 / 1.7.1 needs.
    #[arg(long, default_value = "/usr/local/bin", env = "NVINJECT_SHIM_LINK_DIR")]
    shim_link_dir: String,
    /// The installer's state (what it changed, original bytes) on the host.
    #[arg(long, default_value = "/var/lib/nvinject/installer", env = "NVINJECT_STATE_DIR")]
    state_dir: String,
    /// The host lock file (one installer per host).
    #[arg(long, default_value = "/run/nvinject-installer.lock", env = "NVINJECT_LOCK_FILE")]
    lock_file: String,
    /// Let the shim honour `/dev/null` volume mounts at /var/run/nvidia-container-devices/<id>
    /// (the device plugin's volume-mounts strategy) from any container: writes
    /// `accept-nvidia-visible-devices-as-volume-mounts = true` into the runtime config. Off by
    /// default, as in NVIDIA's toolkit: any pod can ask for such a mount, bypassing the scheduler.
    #[arg(long, env = "ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS")]
    accept_nvidia_visible_devices_as_volume_mounts: bool,
    /// Seconds to wait for another installer holding the lock.
    #[arg(long, default_value_t = 120, env = "NVINJECT_LOCK_TIMEOUT")]
    lock_timeout: u64,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    host: HostArgs,
    /// File created once the install succeeded (the DaemonSet's readiness probe checks it).
    #[arg(long, default_value = "/run/nvinject/ready", env = "NVINJECT_READY_FILE")]
    ready_file: PathBuf,
    /// Seconds between install attempts while one fails (driver not loaded yet, ...).
    #[arg(long, default_value_t = 15, env = "NVINJECT_RETRY_INTERVAL")]
    retry_interval: u64,
    /// Leave the install in place on SIGTERM (for upgrades that replace the pod immediately).
    #[arg(long, env = "NVINJECT_NO_UNINSTALL")]
    no_uninstall: bool,
}

#[derive(Args, Debug)]
struct DoctorCommand {
    #[command(flatten)]
    host: HostArgs,
    #[command(flatten)]
    doctor: doctor::DoctorArgs,
}

impl HostArgs {
    fn settings(&self) -> Result<Settings> {
        let source_dir = match &self.source_dir {
            Some(d) => d.clone(),
            None => std::env::current_exe()
                .context("cannot find this executable's directory; pass --source-dir")?
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default(),
        };
        let mut s = Settings::defaults(HostRoot::new(&self.host_root), source_dir);
        s.install_dir = self.install_dir.clone();
        s.containerd_config = self.containerd_config.clone();
        s.drop_in_dir = match &self.drop_in_dir {
            Some(d) => d.clone(),
            None => {
                let dir = Path::new(&self.containerd_config).parent().unwrap_or(Path::new("/"));
                dir.join("conf.d").to_string_lossy().into_owned()
            }
        };
        s.handler = self.handler.clone();
        s.set_as_default = self.set_as_default;
        s.runtime_config = self.runtime_config.clone();
        s.cdi_dir = self.cdi_dir.clone();
        s.driver_root = self.driver_root.clone();
        s.dev_root = self.dev_root.clone();
        s.proc_root = self.proc_root.clone();
        s.sys_root = self.sys_root.clone();
        s.nvml_lib = self.nvml_lib.clone();
        s.mps_pipe_dir = self.mps_pipe_dir.clone();
        s.hook_timeout_secs = self.hook_timeout_secs;
        s.shim_link_dir = self.shim_link_dir.clone();
        s.state_dir = self.state_dir.clone();
        s.lock_file = self.lock_file.clone();
        s.lock_wait = Duration::from_secs(self.lock_timeout);
        s.dev_char_links = !self.no_dev_char_links;
        s.accept_volume_mounts = self.accept_nvidia_visible_devices_as_volume_mounts;
        for (flag, value) in [
            ("--install-dir", &s.install_dir),
            ("--containerd-config", &s.containerd_config),
            ("--drop-in-dir", &s.drop_in_dir),
            ("--runtime-config", &s.runtime_config),
            ("--cdi-dir", &s.cdi_dir),
            ("--driver-root", &s.driver_root),
            ("--dev-root", &s.dev_root),
            ("--state-dir", &s.state_dir),
            ("--shim-link-dir", &s.shim_link_dir),
            ("--proc-root", &s.proc_root),
            ("--sys-root", &s.sys_root),
            ("--lock-file", &s.lock_file),
        ] {
            if !value.starts_with('/') {
                bail!("{flag} {value:?}: host paths must be absolute");
            }
        }
        if !manifests::is_dns_label(&s.handler) {
            // It becomes a containerd runtime name and a RuntimeClass handler, which Kubernetes
            // requires to be a DNS label.
            bail!(
                "--handler {:?}: use a DNS label (lower-case letters, digits and '-', at most 63, e.g. nvidia)",
                s.handler
            );
        }
        Ok(s)
    }

    fn containerd(&self) -> Result<HostContainerd> {
        let root = HostRoot::new(&self.host_root);
        let version_override = self
            .containerd_version
            .as_deref()
            .map(ContainerdVersion::parse)
            .transpose()
            .context("--containerd-version")?;
        Ok(HostContainerd {
            socket: self.containerd_socket.clone(),
            binary: self.containerd_binary.clone(),
            host_root: root,
            mode: self.restart_mode,
            signal: self.restart_signal,
            unit: self.containerd_unit.clone(),
            systemctl: PathBuf::from("systemctl"),
            version_override,
            wait: Duration::from_secs(self.restart_timeout),
        })
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, &cli.log_level);
    match dispatch(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nvinject-installer: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn dispatch(command: Command) -> Result<ExitCode> {
    match command {
        Command::Install(args) => {
            let report = with_installer(&args, |i| Ok(i.install()?))?;
            print_install(&report);
            Ok(ExitCode::SUCCESS)
        }
        Command::Uninstall(args) => {
            let report = with_installer(&args, |i| Ok(i.uninstall()?))?;
            print_uninstall(&report);
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(args) => run(&args),
        Command::Manifests(args) => {
            manifests::run(&args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Doctor(args) => {
            let settings = args.host.settings()?;
            let containerd = args.host.containerd()?;
            let ok = doctor::run(&settings, &containerd, &args.doctor, &mut std::io::stdout())?;
            Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Probe(args) => {
            Ok(if args.ready_file.exists() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
    }
}

fn with_installer<T>(args: &HostArgs, f: impl FnOnce(&Installer<'_>) -> Result<T>) -> Result<T> {
    let settings = args.settings()?;
    let containerd = args.containerd()?;
    let hook = FaultHook::from_env();
    let generator = cdi::CdiGen;
    let spec: Option<&dyn SpecGenerator> = if args.skip_cdi_spec { None } else { Some(&generator) };
    let installer =
        Installer { settings, containerd: &containerd, spec, runtime_config: &ShimConfig, hook: &hook };
    f(&installer)
}

fn print_install(report: &InstallReport) {
    println!("containerd {} ({:?} mode)", report.containerd, report.mode);
    if report.written.is_empty() {
        println!("nothing changed");
    }
    for path in &report.written {
        println!("wrote {path}");
    }
    print_restart_and_warnings(report.restart, &report.warnings);
}

fn print_restart_and_warnings(restart: Option<Restarted>, warnings: &[String]) {
    match restart {
        Some(Restarted::Yes) => println!("containerd restarted and answering"),
        Some(Restarted::Skipped) => {
            println!("containerd NOT restarted (--restart-mode none): restart it yourself")
        }
        None => println!("containerd not restarted: its configuration did not change"),
    }
    for w in warnings {
        println!("warning: {w}");
    }
}

fn print_uninstall(report: &UninstallReport) {
    for path in &report.restored {
        println!("restored {path}");
    }
    for path in &report.removed {
        println!("removed {path}");
    }
    for (path, why) in &report.kept {
        println!("kept {path} ({why})");
    }
    print_restart_and_warnings(report.restart, &report.warnings);
}

/// Set by the SIGTERM/SIGINT handler.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn install_stop_handler() -> Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, sigaction};
    let action = SigAction::new(SigHandler::Handler(on_stop_signal), SaFlags::SA_RESTART, SigSet::empty());
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe, and replaces
        // no handler another part of this program relies on.
        unsafe { sigaction(signal, &action) }.with_context(|| format!("cannot handle {signal}"))?;
    }
    Ok(())
}

/// Sleeps up to `d`, returning early (true) when SIGTERM/SIGINT arrived.
fn sleep_or_stop(d: Duration) -> bool {
    let deadline = Instant::now() + d;
    while Instant::now() < deadline {
        if STOP.load(Ordering::SeqCst) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    STOP.load(Ordering::SeqCst)
}

fn run(args: &RunArgs) -> Result<ExitCode> {
    install_stop_handler()?;
    let _ = std::fs::remove_file(&args.ready_file);
    let mut installed = false;
    while !STOP.load(Ordering::SeqCst) {
        match with_installer(&args.host, |i| Ok(i.install()?)) {
            Ok(report) => {
                print_install(&report);
                installed = true;
                break;
            }
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), retry_in_s = args.retry_interval, "install failed");
                if sleep_or_stop(Duration::from_secs(args.retry_interval)) {
                    break;
                }
            }
        }
    }
    if installed {
        if let Some(dir) = args.ready_file.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        std::fs::write(&args.ready_file, b"ready\n")
            .with_context(|| format!("cannot write {}", args.ready_file.display()))?;
        tracing::info!(ready_file = %args.ready_file.display(), "installed; waiting for SIGTERM");
        while !sleep_or_stop(Duration::from_secs(3600)) {}
    }
    let _ = std::fs::remove_file(&args.ready_file);
    if args.no_uninstall {
        tracing::info!("stopping without uninstall (--no-uninstall)");
        return Ok(ExitCode::SUCCESS);
    }
    // Also after a failed install: it may have left part of its changes.
    tracing::info!("stopping: uninstalling");
    let report = with_installer(&args.host, |i| Ok(i.uninstall()?))?;
    print_uninstall(&report);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_and_defaults_become_host_settings() {
        let cli = Cli::try_parse_from([
            "nvinject-installer",
            "install",
            "--host-root=/host",
            "--containerd-config=/etc/k3s/containerd/config.toml",
            "--source-dir=/opt/nvinject",
        ])
        .unwrap();
        let Command::Install(args) = cli.command else { panic!("not install") };
        let s = args.settings().unwrap();
        assert_eq!(s.drop_in_dir, "/etc/k3s/containerd/conf.d");
        assert_eq!(s.drop_in_path(), "/etc/k3s/containerd/conf.d/99-nvinject.toml");
        assert_eq!(
            s.host_root.shown(&s.shim_path()),
            PathBuf::from("/host/usr/local/nvinject/bin/containerd-shim-nvinject-v2")
        );
        assert!(!s.accept_volume_mounts, "volume mounts are off unless asked for");
        let cli = Cli::try_parse_from([
            "nvinject-installer",
            "install",
            "--accept-nvidia-visible-devices-as-volume-mounts",
        ])
        .unwrap();
        let Command::Install(args) = cli.command else { panic!("not install") };
        assert!(args.settings().unwrap().accept_volume_mounts);
        let relative =
            Cli::try_parse_from(["nvinject-installer", "install", "--cdi-dir=var/run/cdi"]).unwrap();
        let Command::Install(args) = relative.command else { panic!("not install") };
        assert!(args.settings().unwrap_err().to_string().contains("--cdi-dir"));
        for bad in ["", "Nvidia", "nv idia", "nvidia.", "-nvidia", "nvidia]"] {
            let cli =
                Cli::try_parse_from(["nvinject-installer", "install", &format!("--handler={bad}")]).unwrap();
            let Command::Install(args) = cli.command else { panic!("not install") };
            assert!(args.settings().unwrap_err().to_string().contains("--handler"), "{bad:?} accepted");
        }
    }
}
