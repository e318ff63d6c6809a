//! `containerd-shim-nvinject-v2`: the containerd runtime `io.containerd.nvinject.v2`.
//!
//! containerd runs it with its usual shim flags and an action: `start` (we start the runc shim and
//! put our proxy in front of it), `delete` and `-info` (handed to the runc shim binary by exec, so
//! the bytes containerd reads are the runc shim's own). `proxy` is our internal action: the detached
//! process `start` leaves running.

use std::ffi::OsString;
use std::io::{IsTerminal, Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Parser;
use nvinject_fsio::escape::escape_within;
use nvinject_shim::address::ShimAddress;
use nvinject_shim::config::Config;
use nvinject_shim::config::RuntimeConfig;
use nvinject_shim::freshness::{Edges, LockDir, ModuleVersion};
use nvinject_shim::inject::Injector;
use nvinject_shim::regenerate::{CdiGenCommand, GENERATE_TIMEOUT};
use nvinject_shim::start::{self, StartOutcome, StartRequest};
use nvinject_shim::{daemon, inner};

/// The longest error message `start` prints for containerd (anything longer is cut, with its length).
const MESSAGE_LIMIT: usize = 8192;

fn main() {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let code =
        if args.first().is_some_and(|a| a == "proxy") { run_proxy(&args) } else { run_shim_action(&args) };
    std::process::exit(code);
}

/// The actions containerd invokes. Errors go to stderr, which containerd shows.
fn run_shim_action(args: &[OsString]) -> i32 {
    match shim_action(args) {
        Ok(code) => code,
        Err(e) => {
            // containerd shows this text to people and logs it: escaped, never raw.
            eprintln!("containerd-shim-nvinject-v2: {}", escape_within(&format!("{e:#}"), MESSAGE_LIMIT));
            1
        }
    }
}

fn shim_action(args: &[OsString]) -> anyhow::Result<i32> {
    let flags = containerd_shim::parse(args).map_err(|e| anyhow::anyhow!("{e}"))?;
    if flags.version {
        println!("containerd-shim-nvinject-v2 {}", env!("CARGO_PKG_VERSION"));
        return Ok(0);
    }
    let config_path = Config::default_path();
    let (config, config_err) = match Config::load(&config_path) {
        Ok(c) => (c, None),
        Err(e) => (Config::default(), Some(e)),
    };
    let delegate = inner::resolve_delegate(&config.runtime.delegate, std::env::var_os("PATH").as_deref())?;
    if flags.info || flags.action == "delete" {
        // Cleanup must work even with a broken config file: warn (containerd logs delete's stderr
        // as warnings) and use the default delegate.
        if let Some(e) = config_err {
            eprintln!("containerd-shim-nvinject-v2: warning: {e}; using the default runc shim");
        }
        let err = std::process::Command::new(&delegate).args(args).exec();
        bail!("cannot run {}: {err}", delegate.display());
    }
    if flags.action != "start" {
        bail!("unknown action {:?} (containerd uses start and delete)", flags.action);
    }
    if let Some(e) = config_err {
        return Err(e.into());
    }
    let mut stdin = Vec::new();
    if !std::io::stdin().is_terminal() {
        std::io::stdin().read_to_end(&mut stdin).context("reading stdin")?;
    }
    let bundle = std::env::current_dir().context("finding the bundle directory")?;
    let exe = std::env::current_exe().context("finding our own executable")?;
    let t0 = std::time::Instant::now();
    let outcome = start::start(&StartRequest {
        delegate: &delegate,
        args,
        stdin: &stdin,
        bundle: &bundle,
        id: &flags.id,
        namespace: &flags.namespace,
        proxy_exe: &exe,
        config_path: &config_path,
    })?;
    let mut stdout = std::io::stdout().lock();
    match outcome {
        StartOutcome::InnerFailed { stdout: text, code } => {
            stdout.write_all(&text)?;
            Ok(code)
        }
        StartOutcome::Answer { stdout: text, proxy, started_proxy, inner_us } => {
            stdout.write_all(&text)?;
            stdout.flush()?;
            drop(stdout);
            if config.runtime.log_file.is_some() && config.runtime.log_level == "debug" {
                // Only to the file: stdout and stderr belong to containerd's protocol.
                let total_us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
                init_logging(&config.runtime, None, &flags.namespace);
                tracing::debug!(id = %flags.id, proxy, started_proxy, inner_us, total_us, "shim start");
            }
            Ok(0)
        }
    }
}

/// Flags of the internal `proxy` action (set by `start`, not by people).
#[derive(Parser, Debug)]
#[command(name = "containerd-shim-nvinject-v2 proxy")]
struct ProxyArgs {
    /// The runc shim's ttrpc address.
    #[arg(long)]
    inner: String,
    /// Our own address.
    #[arg(long)]
    listen: String,
    /// The inherited descriptor of the listening socket bound at `--listen`.
    #[arg(long)]
    listen_fd: i32,
    /// The nvinject configuration file.
    #[arg(long)]
    config: PathBuf,
    /// containerd namespace, for logs.
    #[arg(long, default_value = "")]
    namespace: String,
    /// The bundle of the container whose start created this proxy (its `log` fifo is containerd's
    /// shim log).
    #[arg(long)]
    bundle: Option<PathBuf>,
}

fn run_proxy(args: &[OsString]) -> i32 {
    let t0 = std::time::Instant::now();
    // `start` spawned us in the bundle directory; a long-lived proxy must not keep it busy.
    if let Err(e) = std::env::set_current_dir("/") {
        eprintln!("containerd-shim-nvinject-v2 proxy: cannot change to /: {e}");
        return 1;
    }
    let parsed = match ProxyArgs::try_parse_from(args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    // stderr is /dev/null here: everything worth knowing goes to the log.
    let config = Config::load(&parsed.config);
    let log_config = config.as_ref().map(|c| c.runtime.clone()).unwrap_or_default();
    init_logging(&log_config, parsed.bundle.as_deref().map(|b| b.join("log")).as_deref(), &parsed.namespace);
    // stderr is /dev/null: panics must reach the log to be seen at all.
    std::panic::set_hook(Box::new(|info| tracing::error!(panic = %info, "proxy panic")));
    match proxy(parsed, config, t0) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "proxy failed");
            1
        }
    }
}

fn proxy(
    args: ProxyArgs,
    config: Result<Config, nvinject_shim::config::ConfigError>,
    t0: std::time::Instant,
) -> anyhow::Result<()> {
    check_listener(args.listen_fd)?;
    // SAFETY: `start` passes the listening socket by number and nothing else in this process uses
    // that descriptor (checked above to be an open socket); we take sole ownership of it, once.
    let listener = unsafe { UnixListener::from_raw_fd(args.listen_fd) };
    let own = ShimAddress::parse(&args.listen)?;
    // The socket file is ours from here: every way out removes it (an error or panic here through
    // the guard; signals, the runc shim's exit and containerd's leaving through `daemon`).
    let _socket = daemon::SocketGuard(own.clone());
    daemon::exit_on_signals(&own)?;
    let inner = ShimAddress::parse(&args.inner)?;
    let config = config?;
    let regen = &config.regenerate;
    let edges = Edges {
        driver: Box::new(ModuleVersion {
            sys_root: regen.sys_root.clone(),
            proc_root: regen.proc_root.clone(),
        }),
        locks: Box::new(LockDir::new(regen)),
        regenerator: Box::new(CdiGenCommand {
            program: regen.generator.clone().unwrap_or_else(default_generator),
            proc_root: regen.proc_root.clone(),
            sys_root: regen.sys_root.clone(),
            mps_pipe_dir: regen.mps_pipe_dir.clone(),
            hook_timeout_secs: regen.hook_timeout_secs,
            timeout: GENERATE_TIMEOUT,
        }),
    };
    let gate = Injector::new(&config, edges);
    tracing::debug!(
        init_us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX),
        "proxy initialised"
    );
    daemon::run(listener, own, inner, Arc::new(gate), args.bundle)?;
    Ok(())
}

/// `nvinject-cdi` beside this executable, where the installer puts both; else a `PATH` lookup.
fn default_generator() -> PathBuf {
    let exe = std::env::current_exe().ok();
    match exe.as_deref().and_then(Path::parent) {
        Some(dir) => dir.join("nvinject-cdi"),
        None => PathBuf::from("nvinject-cdi"),
    }
}

/// Fails unless `fd` is an open socket (the proxy must not adopt some other descriptor).
fn check_listener(fd: i32) -> anyhow::Result<()> {
    // SAFETY: fstat on an integer descriptor into a zeroed stat buffer we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `st` is a valid, exclusively borrowed buffer for the call.
    if fd < 3 || unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        bail!("--listen-fd {fd} is not an inherited socket");
    }
    // SAFETY: fcntl with integer arguments on the descriptor just checked.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    Ok(())
}

/// Log lines go to containerd's shim log (the bundle's `log` fifo, which containerd copies into its
/// own log) and, when configured, to a file; both get JSON lines.
fn init_logging(config: &RuntimeConfig, fifo: Option<&Path>, namespace: &str) {
    use std::fs::OpenOptions;
    use std::os::unix::fs::OpenOptionsExt;

    let mut sinks: Vec<std::fs::File> = Vec::new();
    if let Some(fifo) = fifo {
        // Non-blocking: if containerd stops reading, log lines are dropped rather than the proxy
        // stalling on a full pipe.
        if let Ok(f) = OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(fifo) {
            sinks.push(f);
        }
    }
    if let Some(file) = &config.log_file {
        if let Some(dir) = file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if let Ok(f) = OpenOptions::new().create(true).append(true).open(file) {
            sinks.push(f);
        }
    }
    let writer = Fanout(Arc::new(sinks));
    // nvinject_cdi too: a spec file set aside (malformed, over a parser limit) is reported there,
    // and is otherwise invisible while other files still resolve the device.
    let filter = tracing_subscriber::EnvFilter::new(format!(
        "nvinject_shim={0},containerd_shim_nvinject_v2={0},nvinject_cdi={0}",
        config.log_level
    ));
    let _ = tracing_subscriber::fmt()
        .with_ansi(false)
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_target(false)
        .with_env_filter(filter)
        .with_writer(move || writer.clone())
        .try_init();
    tracing::debug!(namespace, "logging initialised");
}

/// Writes each log line to every sink; a failing sink is skipped.
#[derive(Clone)]
struct Fanout(Arc<Vec<std::fs::File>>);

impl Write for Fanout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for mut sink in self.0.iter() {
            let _ = sink.write_all(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
