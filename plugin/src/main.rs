//! `nvinject-device-plugin`: the kubelet device plugin daemon.
//!
//! Reads the configuration (file < environment < flags), discovers GPUs once through NVML, plans
//! the resources, writes node labels, then serves each resource to the kubelet and watches XID
//! events until SIGTERM/SIGINT (clean exit) or SIGHUP (clean stop, then the program starts over).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use clap::Parser;
use tokio::sync::watch;

use nvinject_cdi::Kind;
use nvinject_device_plugin::config::{self, ConfigFile, Defaults, MAX_CONFIG_BYTES, Overrides};
use nvinject_device_plugin::config_watch::{self, ConfigObservation, ConfigWatch};
use nvinject_device_plugin::duration::GoDuration;
use nvinject_device_plugin::events::{LoopConfig, NvmlXidSource, SystemClock, run_health_loop};
use nvinject_device_plugin::freshness::{self, SpecFreshness};
use nvinject_device_plugin::health::{HealthSnapshot, HealthTracker, TrackedDevice};
use nvinject_device_plugin::labels;
use nvinject_device_plugin::lifecycle::{Timing, remove_stale_sockets, run_resource};
use nvinject_device_plugin::metrics::Metrics;
use nvinject_device_plugin::node_object::{self, Published};
use nvinject_device_plugin::resources::{HostFacts, Plan, plan};
use nvinject_device_plugin::service::{ResourceContext, health_count};
use nvinject_device_plugin::settings::{
    DeviceIdStrategy, DeviceListStrategy, MigStrategy, Settings, parse_cdi_kind,
};
use nvinject_fsio::{Durability, WriteOptions};
use nvinject_gpu::devnodes::{CONTROL_NODES, MigMinors};

/// Kubernetes device plugin for NVIDIA GPUs. Flags override environment variables, which override
/// the config file (NVIDIA's device plugin config format, version v1).
#[derive(Debug, Clone, Parser)]
#[command(name = "nvinject-device-plugin", version, args_override_self = true)]
struct Cli {
    /// Config file (YAML or JSON, NVIDIA's `version: v1` format).
    #[arg(long, env = "CONFIG_FILE")]
    config_file: Option<PathBuf>,
    /// How MIG devices are advertised: none, single or mixed.
    #[arg(long, env = "MIG_STRATEGY")]
    mig_strategy: Option<MigStrategyArg>,
    /// Exit when NVML or the resource plan fails at start, instead of waiting.
    #[arg(long, env = "FAIL_ON_INIT_ERROR", num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    fail_on_init_error: Option<bool>,
    /// Driver root as the host sees it ('/' or e.g. /run/nvidia/driver); NVML is looked up under
    /// it unless --container-driver-root is set.
    #[arg(long, env = "NVIDIA_DRIVER_ROOT")]
    nvidia_driver_root: Option<PathBuf>,
    /// Where the driver root is mounted for the plugin when it runs in a container (e.g.
    /// /driver-root): NVML and driver files are read here, a regenerated spec names host paths.
    #[arg(long, env = "CONTAINER_DRIVER_ROOT")]
    container_driver_root: Option<PathBuf>,
    /// Host root of the device nodes passed as DeviceSpecs (default: the driver root).
    #[arg(long, env = "NVIDIA_DEV_ROOT")]
    nvidia_dev_root: Option<PathBuf>,
    /// Proc root, for the MIG capability minors.
    #[arg(long, env = "NVINJECT_PROC_ROOT")]
    proc_root: Option<PathBuf>,
    /// Also answer Allocate with DeviceSpecs.
    #[arg(long, env = "PASS_DEVICE_SPECS", num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pass_device_specs: Option<bool>,
    /// Comma-separated: envvar, volume-mounts, cdi-annotations, cdi-cri.
    #[arg(long, env = "DEVICE_LIST_STRATEGY", value_parser = parse_strategies)]
    device_list_strategy: Option<StrategyList>,
    /// Ids passed by envvar and volume-mounts: uuid or index.
    #[arg(long, env = "DEVICE_ID_STRATEGY")]
    device_id_strategy: Option<DeviceIdArg>,
    /// Key prefix of the CDI annotation.
    #[arg(long, env = "CDI_ANNOTATION_PREFIX")]
    cdi_annotation_prefix: Option<String>,
    /// CDI kind of the device names handed out.
    #[arg(long, env = "NVINJECT_CDI_KIND", value_parser = parse_cdi_kind)]
    cdi_kind: Option<Kind>,
    /// The kubelet's registration socket; plugin sockets are created in the same directory.
    #[arg(long, env = "KUBELET_SOCKET")]
    kubelet_socket: Option<PathBuf>,
    /// Path of libnvidia-ml.so.1 (default: under the driver root, else the dynamic linker's).
    #[arg(long, env = "NVINJECT_NVML_LIB")]
    nvml_lib: Option<PathBuf>,
    /// NFD features file for node labels; empty to disable.
    #[arg(long, env = "NVINJECT_FEATURES_FILE")]
    features_file: Option<String>,
    /// Serve /metrics on host:port (a bare port binds 127.0.0.1); empty to disable.
    #[arg(long, env = "NVINJECT_METRICS_ADDRESS")]
    metrics_address: Option<String>,
    /// Quiet time after the last critical XID before a GPU is Healthy again (Go duration; 0 = never).
    #[arg(long, env = "NVINJECT_HEALTH_RECOVERY_PERIOD")]
    health_recovery_period: Option<GoDuration>,
    /// The node's MPS control daemon's pipe directory as the host sees it (the CDI spec's
    /// --mps-pipe-dir): needed by sharing.mps, and passed on when the spec is regenerated.
    #[arg(long, env = "NVINJECT_MPS_PIPE_DIR")]
    mps_pipe_dir: Option<PathBuf>,
    /// How often the plugin checks its socket and kubelet.sock (Go duration, above 0).
    #[arg(long, env = "NVINJECT_SOCKET_POLL", default_value = "500ms")]
    socket_poll: GoDuration,
    /// Log filter: a level, or per-target directives such as `info,nvinject_device_plugin=debug`;
    /// RUST_LOG also works.
    #[arg(long, env = "NVINJECT_LOG", default_value = "info")]
    log: String,
    /// Print the resolved configuration as JSON and exit.
    #[arg(long)]
    print_config: bool,
    /// The CDI spec to keep fresh for containerd's own CDI (containerd 2.x's default): checked
    /// against the loaded driver before every Allocate and every --driver-watch-interval, and
    /// regenerated with --cdi-generator when stale or missing. Empty: no checks.
    #[arg(long, env = "NVINJECT_CDI_SPEC")]
    cdi_spec: Option<PathBuf>,
    /// `nvinject-cdi`, run as `generate --driver-root ... --output <cdi-spec>` to regenerate.
    #[arg(long, env = "NVINJECT_CDI_GENERATOR", default_value = "/usr/local/nvinject/bin/nvinject-cdi")]
    cdi_generator: PathBuf,
    /// The hook path the regenerated spec names.
    #[arg(long, env = "NVINJECT_CDI_HOOK_PATH", default_value = nvinject_cdi::nvinject::DEFAULT_HOOK_PATH)]
    cdi_hook_path: PathBuf,
    /// The OCI timeout of the regenerated spec's hook runs, in seconds (1 to 3600): the same value
    /// as the installer's --hook-timeout-secs, so a spec keeps it whoever regenerates it.
    #[arg(long, env = "NVINJECT_CDI_HOOK_TIMEOUT_SECS", default_value_t = nvinject_cdi::nvinject::DEFAULT_HOOK_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u32).range(1..=3600))]
    cdi_hook_timeout_secs: u32,
    /// Sys root, where the loaded driver's version is read (`module/nvidia/version`).
    #[arg(long, env = "NVINJECT_SYS_ROOT", default_value = "/sys")]
    sys_root: PathBuf,
    /// The installer's ready file (`nvinject-installer run --ready-file`), when an installer owns
    /// the spec: the plugin registers with the kubelet only once it exists, and regenerates
    /// --cdi-spec only while it exists (a spec the plugin made first would look like the host's own
    /// to the installer, which would then keep it at uninstall).
    #[arg(long, env = "NVINJECT_INSTALLER_READY_FILE")]
    installer_ready_file: Option<PathBuf>,
    /// How often the spec is checked between Allocates (Go duration, above 0).
    #[arg(long, env = "NVINJECT_DRIVER_WATCH_INTERVAL", default_value = "10s")]
    driver_watch_interval: GoDuration,
    /// This node's name (the DaemonSet passes `spec.nodeName`): the GPU labels are also set on its
    /// Node object through the API server, and removed there when the GPUs or the driver go.
    /// Empty: no API calls (the features file only).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// How often --config-file is checked for an edit (an updated ConfigMap); a new configuration
    /// that loads restarts the plugin with it, one that does not is logged and ignored (Go
    /// duration; 0 = only on SIGHUP).
    #[arg(long, env = "NVINJECT_CONFIG_WATCH_INTERVAL", default_value = "5s")]
    config_watch_interval: GoDuration,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum MigStrategyArg {
    None,
    Single,
    Mixed,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum DeviceIdArg {
    Uuid,
    Index,
}

#[derive(Debug, Clone)]
struct StrategyList(Vec<DeviceListStrategy>);

fn parse_strategies(s: &str) -> Result<StrategyList, String> {
    config::parse_strategy_list(s).map(StrategyList)
}

impl Cli {
    fn overrides(&self) -> Overrides {
        Overrides {
            mig_strategy: self.mig_strategy.map(|m| match m {
                MigStrategyArg::None => MigStrategy::None,
                MigStrategyArg::Single => MigStrategy::Single,
                MigStrategyArg::Mixed => MigStrategy::Mixed,
            }),
            fail_on_init_error: self.fail_on_init_error,
            driver_root: self.nvidia_driver_root.clone(),
            container_driver_root: self.container_driver_root.clone(),
            dev_root: self.nvidia_dev_root.clone(),
            proc_root: self.proc_root.clone(),
            pass_device_specs: self.pass_device_specs,
            device_list_strategies: self.device_list_strategy.clone().map(|l| l.0),
            device_id_strategy: self.device_id_strategy.map(|d| match d {
                DeviceIdArg::Uuid => DeviceIdStrategy::Uuid,
                DeviceIdArg::Index => DeviceIdStrategy::Index,
            }),
            cdi_annotation_prefix: self.cdi_annotation_prefix.clone(),
            cdi_kind: self.cdi_kind.clone(),
            kubelet_socket: self.kubelet_socket.clone(),
            nvml_library: self.nvml_lib.clone(),
            features_file: self.features_file.clone(),
            metrics_address: self.metrics_address.clone(),
            disable_healthchecks: std::env::var("DP_DISABLE_HEALTHCHECKS").ok(),
            recovery_period: self.health_recovery_period,
            mps_pipe_dir: self.mps_pipe_dir.clone(),
        }
    }
}

fn defaults() -> Defaults {
    Defaults {
        driver_root: PathBuf::from("/"),
        proc_root: PathBuf::from("/proc"),
        kubelet_socket: PathBuf::from("/var/lib/kubelet/device-plugins/kubelet.sock"),
        features_file: PathBuf::from("/etc/kubernetes/node-feature-discovery/features.d/nvinject"),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| cli.log.clone());
    // `Targets` takes the usual `info,target=debug` directives without pulling in a regex engine
    // (the env-filter one costs ~1 MiB of binary and resident text).
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let targets: tracing_subscriber::filter::Targets = filter.parse().unwrap_or_else(|e| {
        eprintln!("nvinject-device-plugin: log filter `{filter}` is not valid ({e}); using info");
        tracing_subscriber::filter::Targets::new().with_default(tracing::Level::INFO)
    });
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_target(false),
        )
        .with(targets)
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvinject-device-plugin: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn load_settings(cli: &Cli) -> Result<Settings> {
    let (file, origin) = match &cli.config_file {
        Some(path) => (config::load_file(path)?, path.display().to_string()),
        None => (ConfigFile::default(), "(no config file)".to_owned()),
    };
    let resolved = config::resolve(&file, &origin, &cli.overrides(), &defaults())?;
    for key in &resolved.ignored {
        tracing::warn!(file = origin, key, "config key is accepted for compatibility but has no effect");
    }
    Ok(resolved.settings)
}

/// libnvidia-ml.so.1: the configured path, else under a non-/ driver root, else the linker's choice.
fn nvml_library(settings: &Settings) -> Option<PathBuf> {
    if let Some(p) = &settings.nvml_library {
        return Some(p.clone());
    }
    let root = settings.driver_root_here();
    if root == Path::new("/") {
        return None;
    }
    ["usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib/aarch64-linux-gnu", "usr/lib", "lib64", "lib"]
        .iter()
        .map(|d| root.join(d).join(nvinject_gpu::nvml::DEFAULT_LIBRARY))
        .find(|p| p.exists())
}

fn host_facts(settings: &Settings) -> HostFacts {
    let minors_path = settings.proc_root.join("driver/nvidia-caps/mig-minors");
    let mig_minors = std::fs::read_to_string(&minors_path).ok().map(|t| MigMinors::parse(&t));
    let control_nodes = CONTROL_NODES
        .iter()
        .filter(|n| settings.dev_root.join(n.path.trim_start_matches('/')).exists())
        .map(|n| n.path.to_string())
        .collect();
    HostFacts { mig_minors, control_nodes }
}

fn run(cli: Cli) -> Result<()> {
    if cli.socket_poll.0.is_zero() {
        // Zero would check the socket files in a loop without pause.
        anyhow::bail!("--socket-poll (NVINJECT_SOCKET_POLL) is 0: give a positive interval such as 500ms");
    }
    // The bytes the settings come from, read first: an edit racing the load is seen as a change.
    let running = cli.config_file.as_deref().map(|p| config_watch::read(p, MAX_CONFIG_BYTES as u64 + 1));
    let settings = load_settings(&cli)?;
    let mut reload = Reload::new(&cli, running);
    if cli.print_config {
        println!("{}", serde_json::to_string_pretty(&settings)?);
        return Ok(());
    }
    tracing::info!(config = %serde_json::to_string(&settings)?, "starting");

    let library = nvml_library(&settings);
    let started =
        nvinject_gpu::nvml::open(library.as_deref()).map_err(anyhow::Error::from).and_then(|nvml| {
            let inventory = nvinject_gpu::nvml::read_inventory(&nvml)?;
            let plan = plan(&inventory, &settings, &host_facts(&settings))?;
            Ok((nvml, inventory, plan))
        });
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (nvml, inventory, plan) = match started {
        Ok(x) => x,
        Err(e) if settings.fail_on_init_error => {
            // No GPU or no driver: the Node must not keep advertising what it no longer has.
            unlabel_node(&runtime, &cli);
            return Err(e.context("start-up failed"));
        }
        Err(e) => {
            unlabel_node(&runtime, &cli);
            // NVIDIA's behaviour with failOnInitError=false: stay up, serve nothing, so a node
            // without GPUs (or with a broken driver) does not crash-loop the DaemonSet.
            tracing::error!(error = format!("{e:#}"), "start-up failed; serving nothing until stopped");
            let signal = runtime.block_on(wait_for_signal(&mut reload))?;
            return finish(signal);
        }
    };
    for w in &plan.warnings {
        tracing::warn!(warning = w.as_str(), "resource plan");
    }
    write_labels(&settings, &inventory, &plan);
    if let Some(node) = node_name(&cli) {
        runtime.spawn(label_node(node, labels::node_object_labels(&inventory, &plan, &settings)));
    }
    let freshness = spec_freshness(&cli, &settings)?;
    if let Some(ready) = cli.installer_ready_file.as_ref().filter(|p| !p.as_os_str().is_empty())
        && let Some(signal) = runtime.block_on(wait_for_installer(ready, &mut reload))?
    {
        return finish(signal);
    }
    let signal = runtime.block_on(serve(settings, nvml, plan, cli.socket_poll, freshness, &mut reload))?;
    drop(runtime);
    finish(signal)
}

/// The spec check, when `--cdi-spec` is set: over the plugin's driver, dev and proc roots.
fn spec_freshness(
    cli: &Cli,
    settings: &Settings,
) -> Result<Option<(Arc<SpecFreshness>, std::time::Duration)>> {
    let Some(spec) = cli.cdi_spec.as_ref().filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(None);
    };
    if cli.driver_watch_interval.0.is_zero() {
        anyhow::bail!(
            "--driver-watch-interval (NVINJECT_DRIVER_WATCH_INTERVAL) is 0: give a positive interval such as 10s"
        );
    }
    let args = freshness::generate_args(&freshness::GenerateRoots {
        spec,
        driver_root: &settings.driver_root,
        container_driver_root: settings.container_driver_root.as_deref(),
        dev_root: &settings.dev_root,
        proc_root: &settings.proc_root,
        sys_root: &cli.sys_root,
        hook: &cli.cdi_hook_path,
        mps_pipe_dir: settings.mps_pipe_dir.as_deref(),
        hook_timeout_secs: cli.cdi_hook_timeout_secs,
    });
    let f = SpecFreshness::new(
        spec.clone(),
        cli.sys_root.clone(),
        settings.proc_root.clone(),
        cli.cdi_generator.clone(),
        args,
    )
    .written_only_while(cli.installer_ready_file.clone());
    tracing::info!(spec = %spec.display(), generator = %cli.cdi_generator.display(), "keeping the CDI spec fresh");
    Ok(Some((Arc::new(f), cli.driver_watch_interval.0)))
}

/// After a clean stop: exit, or on SIGHUP start again from scratch (config re-read, GPUs
/// rediscovered), as NVIDIA's plugin does for its config manager.
fn finish(signal: Stop) -> Result<()> {
    match signal {
        Stop::Exit => Ok(()),
        Stop::Restart => {
            use std::os::unix::process::CommandExt;
            let exe = std::env::current_exe().context("cannot find this program to restart it")?;
            tracing::info!(program = %exe.display(), "restarting");
            let err = std::process::Command::new(&exe).args(std::env::args_os().skip(1)).exec();
            Err(anyhow::Error::from(err).context(format!("cannot restart {}", exe.display())))
        }
    }
}

/// `--node-name`, unless empty.
fn node_name(cli: &Cli) -> Option<String> {
    cli.node_name.clone().filter(|n| !n.is_empty())
}

/// Sets `desired` as nvinject's labels on the Node object, retrying with backoff (the API server
/// may be away, the RBAC not applied yet) until it succeeds; serving does not wait for it.
async fn label_node(node: String, desired: std::collections::BTreeMap<String, String>) {
    let mut backoff = std::time::Duration::from_secs(1);
    loop {
        let published = async {
            let client = node_object::client().await?;
            node_object::publish(&client, &node, &desired).await
        };
        match published.await {
            Ok(Published::Unchanged) => {
                tracing::info!(
                    node,
                    labels = desired.len(),
                    "the Node object already carries the GPU labels"
                );
                return;
            }
            Ok(Published::Patched { set, removed }) => {
                tracing::info!(node, set = set.len(), removed = ?removed, "GPU labels set on the Node object");
                return;
            }
            Err(e) => {
                tracing::warn!(node, error = %e, retry_in = ?backoff, "cannot label the Node object yet")
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(std::time::Duration::from_secs(30));
    }
}

/// Removes nvinject's labels from the Node object (start-up found no GPU or no driver), trying for
/// at most 15 s so a crash-looping plugin still exits.
fn unlabel_node(runtime: &tokio::runtime::Runtime, cli: &Cli) {
    if let Some(node) = node_name(cli) {
        // The timer is made inside the runtime (a tokio timer needs one).
        let removal = runtime.block_on(async {
            tokio::time::timeout(
                std::time::Duration::from_secs(15),
                label_node(node.clone(), std::collections::BTreeMap::new()),
            )
            .await
        });
        if removal.is_err() {
            tracing::error!(node, "could not remove the GPU labels from the Node object");
        }
    }
}

/// How node labels are written: world-readable for node-feature-discovery, data flushed so a
/// crash leaves the old labels or the new ones, in NFD's existing features directory.
const LABELS_WRITE: WriteOptions = WriteOptions::new(0o644).durability(Durability::File);

fn write_labels(settings: &Settings, inventory: &nvinject_gpu::Inventory, plan: &Plan) {
    let Some(path) = &settings.features_file else { return };
    let text = labels::render(&labels::node_labels(inventory, plan, settings));
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() && !dir.is_dir() => {
            tracing::info!(dir = %dir.display(), "NFD features directory absent: node labels not written");
        }
        _ => match nvinject_fsio::write_atomic(path, text.as_bytes(), &LABELS_WRITE) {
            Ok(()) => tracing::info!(file = %path.display(), "node labels written"),
            Err(e) => tracing::error!(file = %path.display(), error = %e, "cannot write node labels"),
        },
    }
}

async fn serve(
    settings: Settings,
    nvml: nvml_wrapper::Nvml,
    plan: Plan,
    poll: GoDuration,
    freshness: Option<(Arc<SpecFreshness>, std::time::Duration)>,
    reload: &mut Reload,
) -> Result<Stop> {
    let settings = Arc::new(settings);
    let metrics = Arc::new(Metrics::default());
    let tracked: Vec<TrackedDevice> = plan
        .resources
        .iter()
        .flat_map(|r| r.targets.iter())
        .map(|t| TrackedDevice {
            uuid: t.uuid.clone(),
            gpu_uuid: t.gpu_uuid.clone(),
            mig: t.mig.as_ref().map(|m| (m.gpu_instance_id, m.compute_instance_id)),
        })
        .collect();
    let mut tracker = HealthTracker::new(settings.health.clone(), tracked);
    let (health_tx, health_rx) = watch::channel(HealthSnapshot::default());
    let stop_health = Arc::new(AtomicBool::new(false));

    if settings.health.disabled {
        tracing::warn!("XID health checks are disabled");
    } else if !plan.resources.is_empty() {
        let gpus = tracker.gpus();
        let metrics = metrics.clone();
        let stop = stop_health.clone();
        std::thread::Builder::new()
            .name("nvml-events".into())
            .spawn(move || {
                // Registering for events can fail transiently (driver busy): retry with backoff.
                let mut backoff = std::time::Duration::from_millis(100);
                let mut source = loop {
                    match NvmlXidSource::open(&nvml, &gpus) {
                        Ok(s) => break s,
                        Err(e) => {
                            tracing::error!(error = %e, retry_in = ?backoff, "cannot watch XID events yet");
                            metrics.event_wait_error();
                        }
                    }
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(std::time::Duration::from_secs(30));
                };
                let mut publish = |s: HealthSnapshot| {
                    let _ = health_tx.send(s);
                };
                run_health_loop(
                    &mut source,
                    &mut tracker,
                    &SystemClock,
                    &metrics,
                    &stop,
                    &mut publish,
                    LoopConfig::default(),
                );
            })
            .context("cannot start the NVML event thread")?;
    }

    let dir = settings.plugin_dir().to_path_buf();
    let keep: Vec<String> = plan.resources.iter().map(|r| r.socket_name()).collect();
    for removed in remove_stale_sockets(&dir, &keep) {
        tracing::info!(socket = %removed.display(), "removed socket of a resource no longer served");
    }
    if plan.resources.is_empty() {
        tracing::warn!("no devices to advertise; waiting until stopped");
    }

    // The driver-version watch: a driver upgraded between Allocates is noticed within one interval,
    // also for containers that do not pass through Allocate again (restarts in a running pod).
    if let Some((f, interval)) = &freshness {
        let (f, interval, stop) = (f.clone(), *interval, stop_health.clone());
        std::thread::Builder::new()
            .name("cdi-spec-watch".into())
            .spawn(move || f.watch(interval, &stop))
            .context("cannot start the CDI spec watch thread")?;
    }
    let freshness = freshness.map(|(f, _)| f);
    let control_nodes = Arc::new(plan.control_nodes);
    let topology = Arc::new(plan.topology);
    let contexts: Vec<Arc<ResourceContext>> = plan
        .resources
        .into_iter()
        .map(|resource| {
            Arc::new(ResourceContext {
                resource,
                settings: settings.clone(),
                control_nodes: control_nodes.clone(),
                topology: topology.clone(),
                metrics: metrics.clone(),
                freshness: freshness.clone(),
            })
        })
        .collect();

    let metrics_task = match settings.metrics_address {
        None => None,
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen for /metrics on {addr}"))?;
            tracing::info!(%addr, "serving /metrics");
            let contexts = contexts.clone();
            let health = health_rx.clone();
            let metrics = metrics.clone();
            Some(tokio::spawn(nvinject_device_plugin::metrics::serve(listener, move || {
                let snapshot = health.borrow().clone();
                let counts: Vec<_> = contexts.iter().map(|c| health_count(&c.resource, &snapshot)).collect();
                metrics.render(&counts)
            })))
        }
    };

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let timing = Timing { poll: poll.0, ..Timing::default() };
    let mut tasks = Vec::new();
    for ctx in contexts {
        tasks.push(tokio::spawn(run_resource(
            ctx,
            health_rx.clone(),
            settings.kubelet_socket.clone(),
            timing,
            shutdown_rx.clone(),
        )));
    }

    let signal = wait_for_signal(reload).await?;
    let _ = shutdown_tx.send(true);
    stop_health.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    if let Some(t) = metrics_task {
        t.abort();
    }
    tracing::info!("stopped");
    Ok(signal)
}

/// Waits until the installer's ready file exists (the runtime is installed and the spec written):
/// before that, GPUs advertised to the kubelet would be scheduled onto a node that cannot start
/// them. `Some` when a signal came first.
async fn wait_for_installer(ready: &Path, reload: &mut Reload) -> Result<Option<Stop>> {
    let poll = async {
        let mut waited = std::time::Duration::ZERO;
        let step = std::time::Duration::from_millis(500);
        while !ready.exists() {
            if waited.as_secs().is_multiple_of(60) && waited.subsec_millis() == 0 {
                tracing::info!(
                    ready_file = %ready.display(),
                    waited_s = waited.as_secs(),
                    "waiting for nvinject-installer to finish on this node before registering"
                );
            }
            tokio::time::sleep(step).await;
            waited += step;
        }
        tracing::info!(ready_file = %ready.display(), "the installer is ready");
    };
    tokio::select! {
        () = poll => Ok(None),
        signal = wait_for_signal(reload) => signal.map(Some),
    }
}

/// What a signal (or an edited config file) asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// SIGTERM / SIGINT.
    Exit,
    /// SIGHUP, or a config file edited into a new configuration that loads.
    Restart,
}

/// The config-file watch: the file, how often to look, and the configuration it must load into
/// before the plugin restarts with it.
struct Reload {
    cli: Cli,
    watch: Option<(PathBuf, ConfigWatch, std::time::Duration)>,
}

impl Reload {
    /// Watches `--config-file` when one is given and the interval is not 0; `running` holds the
    /// bytes read just before the settings were loaded.
    fn new(cli: &Cli, running: Option<std::io::Result<Vec<u8>>>) -> Self {
        let interval = cli.config_watch_interval.0;
        let watch = match (&cli.config_file, running) {
            (Some(path), Some(Ok(bytes))) if !interval.is_zero() => {
                Some((path.clone(), ConfigWatch::new(bytes), interval))
            }
            _ => None,
        };
        Reload { cli: cli.clone(), watch }
    }

    /// Resolves once the config file holds a new configuration that loads; never without a watch.
    async fn changed(&mut self) -> Stop {
        let Some((path, watch, interval)) = &mut self.watch else { return std::future::pending().await };
        loop {
            tokio::time::sleep(*interval).await;
            let now = config_watch::read(path, MAX_CONFIG_BYTES as u64 + 1);
            match watch.observe(&now) {
                ConfigObservation::Unchanged => {}
                ConfigObservation::Unreadable(error) => {
                    tracing::debug!(file = %path.display(), error, "config file not readable now; looking again later");
                }
                ConfigObservation::Changed => match load_settings(&self.cli) {
                    Ok(_) => {
                        tracing::info!(file = %path.display(), "config file changed: restarting with it");
                        return Stop::Restart;
                    }
                    Err(e) => {
                        tracing::error!(
                            file = %path.display(),
                            error = format!("{e:#}"),
                            "config file changed but does not load: still serving the previous configuration"
                        );
                        if let Ok(bytes) = now {
                            watch.reject(bytes);
                        }
                    }
                },
            }
        }
    }
}

async fn wait_for_signal(reload: &mut Reload) -> Result<Stop> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let mut hup = signal(SignalKind::hangup()).context("cannot watch SIGHUP")?;
    Ok(tokio::select! {
        _ = term.recv() => { tracing::info!("SIGTERM: shutting down"); Stop::Exit }
        _ = int.recv() => { tracing::info!("SIGINT: shutting down"); Stop::Exit }
        _ = hup.recv() => { tracing::info!("SIGHUP: restarting with the configuration re-read"); Stop::Restart }
        stop = reload.changed() => stop,
    })
}
