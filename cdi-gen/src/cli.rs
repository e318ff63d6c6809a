//! `nvinject-cdi`'s command line (clap), in the library so a test can run the real parser on what
//! `nvinject_cdi::nvinject::GenerateInvocation` writes (`tests/invocation.rs`): the shim and the
//! device plugin run `nvinject-cdi generate` with it, so a renamed flag fails that test.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use nvinject_cdi::nvinject::{
    DEFAULT_CLASS, DEFAULT_HOOK_PATH, DEFAULT_HOOK_TIMEOUT_SECS, DEFAULT_VENDOR, HOOK_TIMEOUT_SECS_RANGE,
    HookKind,
};
use nvinject_gpu::NamingStrategy;
use tracing::level_filters::LevelFilter;

/// The command line: a global log level and a subcommand.
#[derive(Parser)]
#[command(
    name = "nvinject-cdi",
    version,
    about = "Generate, list and validate CDI specs for NVIDIA GPUs",
    long_about = None
)]
pub struct Cli {
    /// Log level on stderr: error, warn, info, debug or trace.
    #[arg(long, global = true, default_value = "info")]
    pub log_level: LevelFilter,
    // What to do (a doc comment here would become clap help text).
    #[allow(missing_docs)]
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand)]
pub enum Command {
    /// Discover GPUs and driver files and write a CDI spec.
    Generate(Box<GenerateArgs>),
    /// List the devices the CDI spec directories provide.
    List(ListArgs),
    /// Check CDI spec files against the schema and CDI's rules.
    Validate(ValidateArgs),
}

/// `--format`. Its variants carry no doc comments: clap would print them as help text.
#[allow(missing_docs)]
#[derive(Clone, Copy, ValueEnum)]
pub enum FormatArg {
    Yaml,
    Json,
}

/// `--mode`.
#[derive(Clone, Copy, ValueEnum)]
pub enum ModeArg {
    /// GPUs and MIG devices through NVML.
    Nvml,
    /// No NVML: every NVIDIA device node as one `all` device.
    Management,
}

/// `generate`'s flags.
#[derive(Args)]
pub struct GenerateArgs {
    /// File to write (atomically); the extension (.json, .yaml, .yml) picks the format. Stdout if absent.
    #[arg(long, alias = "output-file")]
    pub output: Option<PathBuf>,
    /// Output format; overrides the one implied by --output. Default yaml.
    #[arg(long, value_enum)]
    pub format: Option<FormatArg>,
    /// Discovery mode.
    #[arg(long, alias = "discovery-mode", value_enum, default_value = "nvml")]
    pub mode: ModeArg,
    /// The driver root as the host sees it: where driver files are, and the prefix of every host
    /// path written into the spec.
    #[arg(long, default_value = "/")]
    pub driver_root: PathBuf,
    /// Where the driver root is mounted for this process, when that differs from --driver-root
    /// (running in a container). Files are looked up here and written as under --driver-root.
    #[arg(long, alias = "container-driver-root")]
    pub driver_root_ctr_path: Option<PathBuf>,
    /// The root under which `dev/nvidia*` are, as the host sees it. Default: the driver root.
    #[arg(long)]
    pub dev_root: Option<PathBuf>,
    /// Where the dev root is mounted for this process, when that differs from --dev-root.
    #[arg(long)]
    pub dev_root_ctr_path: Option<PathBuf>,
    /// Where this process reads `devices` and `driver/nvidia-caps/mig-minors`.
    #[arg(long, default_value = "/proc")]
    pub proc_root: PathBuf,
    /// Where this process reads `module/nvidia/version`.
    #[arg(long, default_value = "/sys")]
    pub sys_root: PathBuf,
    /// A library folder inside the driver root, searched before the defaults (repeatable).
    #[arg(long = "library-search-path", value_name = "DIR")]
    pub library_search_paths: Vec<String>,
    /// The NVML library to load. Default: libnvidia-ml.so.1 from the driver root, else the
    /// dynamic linker's.
    #[arg(long)]
    pub nvml_lib: Option<PathBuf>,
    /// How devices are named: index, uuid or type-index (repeatable). Default: index and uuid.
    #[arg(long = "device-name-strategy", value_name = "STRATEGY")]
    pub device_name_strategies: Vec<NamingStrategy>,
    /// CDI vendor.
    #[arg(long, alias = "cdi-vendor", default_value = DEFAULT_VENDOR)]
    pub vendor: String,
    /// CDI class.
    #[arg(long, alias = "cdi-class", default_value = DEFAULT_CLASS)]
    pub class: String,
    /// Absolute host path of nvinject-hook, written into the spec's hooks.
    #[arg(long, alias = "nvidia-cdi-hook-path", default_value = DEFAULT_HOOK_PATH)]
    pub hook_path: String,
    /// Leave out the `all` device.
    #[arg(long)]
    pub no_all_device: bool,
    /// Only these devices, comma-separated, by any name (0, 0:1, gpu0, GPU-..., MIG-...).
    #[arg(long, alias = "device-id", value_delimiter = ',', value_name = "IDS")]
    pub device_ids: Option<Vec<String>>,
    /// Leave out a hook: create-symlinks, update-ldcache, enable-cuda-compat,
    /// disable-device-node-modification or update-application-profile (repeatable).
    #[arg(long = "disable-hook", value_name = "NAME")]
    pub disabled_hooks: Vec<HookKind>,
    /// The OCI `timeout` of each hook run, in seconds (1 to 3600): runc kills a hook still running
    /// after it and fails the container's start.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_HOOK_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u32).range(i64::from(*HOOK_TIMEOUT_SECS_RANGE.start())..=i64::from(*HOOK_TIMEOUT_SECS_RANGE.end())))]
    pub hook_timeout_secs: u32,
    /// The MPS control daemon's pipe directory (its CUDA_MPS_PIPE_DIRECTORY), as the host sees it,
    /// when this node runs MPS: the spec gets an `mps` device mounting it writable, with
    /// CUDA_MPS_PIPE_DIRECTORY set to it, for containers given that device (never the common
    /// edits). Without it, nothing of MPS is in the spec.
    #[arg(long, value_name = "DIR")]
    pub mps_pipe_dir: Option<PathBuf>,
    /// Where --mps-pipe-dir is mounted for this process, when that differs (running in a container).
    #[arg(long, value_name = "DIR")]
    pub mps_pipe_dir_ctr_path: Option<PathBuf>,
}

/// `list`'s flags.
#[derive(Args)]
pub struct ListArgs {
    /// A CDI spec directory, lowest priority first (repeatable). Default: /etc/cdi then /var/run/cdi.
    #[arg(long = "spec-dir", value_name = "DIR")]
    pub spec_dirs: Vec<PathBuf>,
}

/// `validate`'s arguments.
#[derive(Args)]
pub struct ValidateArgs {
    /// Spec files to check.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Pass a spec that fails the trust check (not owned by root, writable by others, or in a
    /// folder others may change) with a warning, as a shim with `[cdi] accept-untrusted-specs =
    /// true` uses it. Without it such a spec fails, as the shim refuses it by default.
    #[arg(long)]
    pub accept_untrusted: bool,
}
