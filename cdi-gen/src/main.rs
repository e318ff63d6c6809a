//! `nvinject-cdi`: generate, list and validate CDI specs for NVIDIA GPUs.
//!
//! Flags follow `nvidia-ctk cdi` where the two overlap, so an operator's scripts carry over. Exit
//! codes: 0 success, 1 failure (the error is printed on stderr), 2 bad command line.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Parser;
use nvinject_cdi::{Format, Kind, Owners, Registry, SpecError, load_trusted_file};
use nvinject_cdi_gen::cli::{Cli, Command, FormatArg, GenerateArgs, ListArgs, ModeArg, ValidateArgs};
use nvinject_cdi_gen::{GenerateError, GenerateOptions, Mode, Nvml, Root, generate, write_spec};
use nvinject_gpu::NvmlError;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_max_level(cli.log_level)
        .with_target(false)
        .init();
    let result = match cli.command {
        Command::Generate(args) => run_generate(*args),
        Command::List(args) => run_list(args),
        Command::Validate(args) => run_validate(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nvinject-cdi: error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, leaving out causes its message already quotes (our
/// library errors name their OS error themselves).
fn error_chain(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
    }
    text
}

/// Writes `text` to stdout. A reader that went away (`nvinject-cdi list | head -1`) is not a failure,
/// as for other command-line tools; any other write error is.
fn print_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("cannot write to stdout"),
        _ => Ok(()),
    }
}

/// The library's NVML errors say what failed and why; the flags that work around it belong to this
/// command, so the hint is added here.
fn with_flag_hint(e: GenerateError) -> anyhow::Error {
    let hint = match &e {
        GenerateError::Nvml(NvmlError::Load { .. }) => {
            "point at the library with --nvml-lib, or use --mode management to work without NVML"
        }
        GenerateError::Nvml(NvmlError::DriverNotLoaded { .. }) => "--mode management works without it",
        _ => return e.into(),
    };
    anyhow::anyhow!("{e}; {hint}")
}

fn root(host: &Path, ctr: Option<&Path>) -> anyhow::Result<Root> {
    if !host.is_absolute() {
        bail!("root {} must be an absolute path", host.display());
    }
    Ok(Root { lookup: ctr.unwrap_or(host).to_owned(), host: host.to_owned() })
}

fn output_format(args: &GenerateArgs) -> Format {
    let from_name = args.output.as_deref().and_then(Format::from_path);
    if let Some(path) = &args.output
        && from_name.is_none()
    {
        tracing::warn!(path = %path.display(), "CDI runtimes only read .json, .yaml and .yml files from spec directories");
    }
    match (args.format, from_name) {
        (Some(f), implied) => {
            let f = match f {
                FormatArg::Json => Format::Json,
                FormatArg::Yaml => Format::Yaml,
            };
            if implied.is_some_and(|i| i != f) {
                tracing::warn!(
                    format = f.extension(),
                    "--format differs from the format the output file name implies"
                );
            }
            f
        }
        (None, Some(implied)) => implied,
        (None, None) => Format::Yaml,
    }
}

fn run_generate(args: GenerateArgs) -> anyhow::Result<ExitCode> {
    let driver_root = root(&args.driver_root, args.driver_root_ctr_path.as_deref())?;
    let dev_root = match (&args.dev_root, &args.dev_root_ctr_path) {
        (Some(host), ctr) => root(host, ctr.as_deref())?,
        (None, Some(_)) => bail!("--dev-root-ctr-path needs --dev-root"),
        (None, None) => driver_root.clone(),
    };
    if !args.hook_path.starts_with('/') {
        bail!("--hook-path {} must be absolute: runtimes run hooks by absolute path", args.hook_path);
    }
    let kind = Kind::new(&args.vendor, &args.class).context("invalid --vendor/--class")?;
    let format = output_format(&args);
    let mut opts = GenerateOptions::new(driver_root, dev_root, args.proc_root, args.sys_root, args.hook_path);
    opts.mode = match args.mode {
        ModeArg::Nvml => Mode::Nvml,
        ModeArg::Management => Mode::Management,
    };
    let mut dirs = args.library_search_paths;
    if let Some(bad) = dirs.iter().find(|d| !d.starts_with('/')) {
        bail!(
            "--library-search-path {bad} must be absolute (a folder inside the driver root, e.g. /usr/lib64)"
        );
    }
    dirs.append(&mut opts.library_dirs);
    opts.library_dirs = dirs;
    opts.nvml_lib = args.nvml_lib;
    opts.spec.kind = kind;
    if !args.device_name_strategies.is_empty() {
        opts.spec.naming = args.device_name_strategies;
    }
    opts.spec.all_device = !args.no_all_device;
    opts.spec.device_ids = args.device_ids;
    opts.spec.disabled_hooks = args.disabled_hooks;
    opts.spec.hook_timeout_secs = Some(args.hook_timeout_secs);
    opts.mps_pipe_dir = match (&args.mps_pipe_dir, &args.mps_pipe_dir_ctr_path) {
        (Some(host), ctr) => {
            if !host.is_absolute() {
                bail!("--mps-pipe-dir {} must be an absolute path", host.display());
            }
            Some(Root { lookup: ctr.clone().unwrap_or_else(|| host.clone()), host: host.clone() })
        }
        (None, Some(_)) => bail!("--mps-pipe-dir-ctr-path needs --mps-pipe-dir"),
        (None, None) => None,
    };

    let spec = generate(&opts, &Nvml).map_err(with_flag_hint)?;
    match &args.output {
        Some(path) => {
            write_spec(path, &spec, format)?;
            tracing::info!(path = %path.display(), cdi_version = %spec.cdi_version, "CDI spec written");
        }
        None => {
            use std::io::Write;
            let text = nvinject_cdi::codec::to_string(&spec, format);
            std::io::stdout().lock().write_all(text.as_bytes()).context("cannot write the spec to stdout")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn run_list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let dirs: Vec<PathBuf> = if args.spec_dirs.is_empty() {
        nvinject_cdi::DEFAULT_SPEC_DIRS.iter().map(PathBuf::from).collect()
    } else {
        args.spec_dirs
    };
    let registry = Registry::scan(&dirs);
    let devices = registry.devices();
    for error in registry.errors() {
        tracing::warn!("{error}");
    }
    // A device two files of one directory define is no device at all: every runtime refuses it.
    let conflicts = registry.conflicts();
    for conflict in &conflicts {
        tracing::error!("{conflict}");
    }
    tracing::info!(devices = devices.len(), conflicts = conflicts.len(), dirs = ?dirs, "CDI devices found");
    let mut out = String::new();
    for d in &devices {
        out.push_str(&d.name);
        out.push('\n');
    }
    print_stdout(&out)?;
    Ok(if conflicts.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn run_validate(args: ValidateArgs) -> anyhow::Result<ExitCode> {
    use std::fmt::Write as _;
    let mut failed = false;
    let mut out = String::new();
    // The same trust check the shim's registry makes: a spec it would refuse fails here too.
    let owners = Owners::this_process();
    // Writing to a String cannot fail.
    for path in &args.files {
        match load_trusted_file(path, &owners, args.accept_untrusted) {
            Ok((spec, untrusted)) => {
                let _ = writeln!(
                    out,
                    "{}: ok (cdiVersion {}, kind {}, {} devices)",
                    path.display(),
                    spec.cdi_version,
                    spec.kind,
                    spec.devices.len()
                );
                if let Some(untrusted) = untrusted {
                    tracing::warn!("accepted (--accept-untrusted): {untrusted}");
                }
            }
            Err(SpecError::Invalid { path, problems }) => {
                failed = true;
                for p in problems {
                    let _ = writeln!(out, "{}: {p}", path.display());
                }
            }
            Err(e) => {
                failed = true;
                let _ = writeln!(out, "{e}");
            }
        }
    }
    print_stdout(&out)?;
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
