//! `nvinject-simnode`: builds simulated GPU nodes and drives them (XID injection, presets).
//!
//! See tests/simnode/README.md for the layout it builds and how to use it by hand.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use nvinject_simnode::NodeDescription;
use nvinject_simnode::build::{self, BuildOptions, HostSystem, Layout};
use nvinject_simnode::elf::Machine;
use nvinject_simnode::events::{self, XidEvent};
use nvinject_simnode::presets;

#[derive(Parser)]
#[command(name = "nvinject-simnode", about = "Simulated GPU node for nvinject's tests")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Lay out a driver root, a dev root with real device nodes, and proc/sys files for a node.
    Build(BuildArgs),
    /// Append an XID event for a GPU (or a MIG instance) to the node's XID control file.
    Xid(XidArgs),
    /// Print a preset's node description (JSON).
    Describe {
        /// Preset name (see `presets`).
        #[arg(long)]
        preset: String,
    },
    /// List the presets.
    Presets,
}

#[derive(Args)]
#[command(group = clap::ArgGroup::new("source").required(true).args(["preset", "node"]))]
struct BuildArgs {
    /// Preset to build (see `presets`).
    #[arg(long)]
    preset: Option<String>,
    /// Node description file to build.
    #[arg(long)]
    node: Option<PathBuf>,
    /// Output directory (node.json, env, xid-events; default home of every root).
    #[arg(long)]
    out: PathBuf,
    /// Driver root [default: OUT/driver].
    #[arg(long)]
    driver_root: Option<PathBuf>,
    /// Dev root [default: OUT/host].
    #[arg(long)]
    dev_root: Option<PathBuf>,
    /// Proc root [default: DEV_ROOT/proc].
    #[arg(long)]
    proc_root: Option<PathBuf>,
    /// Sys root [default: DEV_ROOT/sys].
    #[arg(long)]
    sys_root: Option<PathBuf>,
    /// Simulated NVML library [default: libnvidia_ml.so next to this program].
    #[arg(long)]
    nvml_lib: Option<PathBuf>,
    /// nvidia-smi stand-in [default: nvidia-smi next to this program].
    #[arg(long)]
    smi_bin: Option<PathBuf>,
    /// The host's device list, read to pick free majors for nvidia-uvm and nvidia-caps.
    #[arg(long, default_value = "/proc/devices")]
    host_proc_devices: PathBuf,
    /// Wipe and rebuild OUT if it already holds a simulated node.
    #[arg(long)]
    force: bool,
}

#[derive(Args)]
struct XidArgs {
    /// The node's node.json (written by `build`).
    #[arg(long)]
    node: PathBuf,
    /// GPU by position in the description or by UUID.
    #[arg(long)]
    gpu: String,
    /// XID number (e.g. 79: fallen off the bus, 48: double-bit ECC error).
    #[arg(long)]
    xid: u64,
    /// GPU instance id, for an XID inside a MIG instance.
    #[arg(long)]
    gi: Option<u32>,
    /// Compute instance id (needs --gi).
    #[arg(long, requires = "gi")]
    ci: Option<u32>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Build(args) => build_node(args),
        Command::Xid(args) => inject(args),
        Command::Describe { preset } => describe(&preset),
        Command::Presets => {
            list_presets();
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvinject-simnode: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("{}: cannot make the path absolute", path.display()))
}

fn beside_this_program(file: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate this program")?;
    Ok(exe.parent().unwrap_or(Path::new("/")).join(file))
}

fn unknown_preset(name: &str) -> anyhow::Error {
    anyhow::anyhow!("unknown preset `{name}`; presets: {}", presets::NAMES.join(", "))
}

fn build_node(args: BuildArgs) -> anyhow::Result<()> {
    let node = match (&args.preset, &args.node) {
        (Some(name), _) => presets::preset(name).ok_or_else(|| unknown_preset(name))?,
        (None, Some(file)) => NodeDescription::load(file)?,
        (None, None) => bail!("give --preset NAME or --node FILE"),
    };
    let opt_abs = |p: &Option<PathBuf>| p.as_deref().map(absolute).transpose();
    let out = absolute(&args.out)?;
    let layout = Layout::with_roots(
        &out,
        opt_abs(&args.driver_root)?.as_deref(),
        opt_abs(&args.dev_root)?.as_deref(),
        opt_abs(&args.proc_root)?.as_deref(),
        opt_abs(&args.sys_root)?.as_deref(),
    );
    let machine =
        Machine::host().context("stub libraries can only be written for x86_64 and aarch64 hosts")?;
    let opts = BuildOptions {
        layout,
        machine,
        nvml_lib: match args.nvml_lib {
            Some(p) => absolute(&p)?,
            None => beside_this_program("libnvidia_ml.so")?,
        },
        smi_bin: match args.smi_bin {
            Some(p) => absolute(&p)?,
            None => beside_this_program("nvidia-smi")?,
        },
        host_proc_devices: args.host_proc_devices,
        force: args.force,
    };
    let built = build::build(&node, &opts, &HostSystem)?;
    let l = &built.layout;
    println!(
        "built simulated node `{}` ({} GPUs) in {}",
        built.node.name,
        built.node.gpus.len(),
        l.out.display()
    );
    println!("  node description  {}", l.node_file().display());
    println!("  driver root       {}", l.driver_root.display());
    println!(
        "  dev root          {} (nvidia-uvm major {}, nvidia-caps major {})",
        l.dev_root.display(),
        built.majors.uvm,
        built.majors.caps
    );
    println!("  proc root         {}", l.proc_root.display());
    println!("  sys root          {}", l.sys_root.display());
    println!("  XID control file  {}", l.events_file().display());
    println!("use it: . {} && nvidia-smi -L", l.env_file().display());
    Ok(())
}

fn inject(args: XidArgs) -> anyhow::Result<()> {
    let node = NodeDescription::load(&args.node)?;
    let (index, gpu) = match args.gpu.parse::<usize>() {
        Ok(i) => node.gpus.get(i).map(|g| (i, g)).with_context(|| {
            format!(
                "{}: --gpu {i}: the node has {} GPUs; give a position below that or a GPU's UUID",
                args.node.display(),
                node.gpus.len()
            )
        })?,
        Err(_) => {
            node.gpus.iter().enumerate().find(|(_, g)| g.uuid.eq_ignore_ascii_case(&args.gpu)).with_context(
                || format!("{}: --gpu {}: no GPU has this UUID", args.node.display(), args.gpu),
            )?
        }
    };
    if let Some(gi) = args.gi {
        let instances = gpu.mig.as_ref().map(|m| m.gpu_instances.as_slice()).unwrap_or_default();
        let Some(instance) = instances.iter().find(|i| i.id == gi) else {
            bail!("{}: --gi {gi}: GPU {index} has no MIG GPU instance with this id", args.node.display());
        };
        if let Some(ci) = args.ci
            && !instance.compute_instances.iter().any(|c| c.id == ci)
        {
            bail!(
                "{}: --ci {ci}: GPU instance {gi} of GPU {index} has no such compute instance",
                args.node.display()
            );
        }
    }
    let file = node.events_file.as_deref().with_context(|| {
        format!(
            "{}: field `events_file` is not set; build the node with `nvinject-simnode build` or add the field",
            args.node.display()
        )
    })?;
    let event = XidEvent {
        uuid: gpu.uuid.clone(),
        xid: args.xid,
        gpu_instance_id: args.gi,
        compute_instance_id: args.ci,
    };
    events::inject(file, &event).with_context(|| format!("{}: cannot append the event", file.display()))?;
    println!("XID {} for GPU {index} ({}) appended to {}", args.xid, gpu.uuid, file.display());
    Ok(())
}

fn describe(name: &str) -> anyhow::Result<()> {
    let json = presets::preset_json(name).ok_or_else(|| unknown_preset(name))?;
    print!("{json}");
    Ok(())
}

fn list_presets() {
    for name in presets::NAMES {
        let node = presets::preset(name).expect("NAMES lists shipped presets");
        let migs: usize = node
            .gpus
            .iter()
            .filter_map(|g| g.mig.as_ref())
            .flat_map(|m| &m.gpu_instances)
            .map(|gi| gi.compute_instances.len())
            .sum();
        let model = node.gpus.first().map_or("no GPU", |g| g.name.as_str());
        println!(
            "{name:<10} {} x {model}, {migs} MIG devices, {} NVLink pairs",
            node.gpus.len(),
            node.nvlinks.len()
        );
    }
}
