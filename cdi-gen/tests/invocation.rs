//! The generator's command line as the shim and the device plugin write it
//! (`nvinject_cdi::nvinject::GenerateInvocation`) against `nvinject-cdi`'s real parser: a flag
//! renamed or dropped on either side fails here, not on a node at the first stale spec.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::Parser;
use nvinject_cdi::Format;
use nvinject_cdi::nvinject::{DEFAULT_CLASS, DEFAULT_HOOK_TIMEOUT_SECS, DEFAULT_VENDOR, GenerateInvocation};
use nvinject_cdi_gen::cli::{Cli, Command, FormatArg, GenerateArgs};
use tracing::level_filters::LevelFilter;

/// The plugin's shape: no optional flag, default kind, JSON.
fn plain() -> GenerateInvocation {
    GenerateInvocation {
        log_level: None,
        driver_root: "/run/nvidia/driver".into(),
        driver_root_ctr_path: None,
        dev_root: "/host".into(),
        proc_root: "/host/proc".into(),
        sys_root: "/host/sys".into(),
        hook_path: "/usr/local/nvinject/bin/nvinject-hook".into(),
        nvml_lib: None,
        mps_pipe_dir: None,
        hook_timeout_secs: None,
        output: "/var/run/cdi/nvidia.com-gpu.json".into(),
        kind: None,
        format: Format::Json,
    }
}

/// The shim's shape and more: every optional flag set, another kind, YAML.
fn full() -> GenerateInvocation {
    GenerateInvocation {
        log_level: Some("warn".into()),
        driver_root_ctr_path: Some("/driver-root".into()),
        nvml_lib: Some("/run/nvidia/driver/lib/libnvidia-ml.so.1".into()),
        mps_pipe_dir: Some("/run/nvidia/mps".into()),
        hook_timeout_secs: Some(7),
        kind: Some("example.com/gpu-x".parse().unwrap()),
        format: Format::Yaml,
        output: "/etc/cdi/example.com-gpu.yaml".into(),
        ..plain()
    }
}

/// `nvinject-cdi <invocation>` through the binary's parser.
fn parse(invocation: &GenerateInvocation) -> (LevelFilter, GenerateArgs) {
    let argv = std::iter::once(OsString::from("nvinject-cdi")).chain(invocation.to_args());
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{invocation:?} does not parse: {e}"));
    let Command::Generate(args) = cli.command else { panic!("{invocation:?} is not `generate`") };
    (cli.log_level, *args)
}

/// Every field of `invocation` is what the generator reads from its flags.
fn assert_read_back(invocation: &GenerateInvocation) {
    let (level, g) = parse(invocation);
    let want_level = invocation.log_level.as_deref().unwrap_or("info").parse::<LevelFilter>().unwrap();
    assert_eq!(level, want_level);
    assert_eq!(g.driver_root, invocation.driver_root);
    assert_eq!(g.driver_root_ctr_path, invocation.driver_root_ctr_path);
    assert_eq!(g.dev_root.as_deref(), Some(invocation.dev_root.as_path()));
    assert_eq!(g.dev_root_ctr_path, None);
    assert_eq!(g.proc_root, invocation.proc_root);
    assert_eq!(g.sys_root, invocation.sys_root);
    assert_eq!(Path::new(&g.hook_path), invocation.hook_path);
    assert_eq!(g.nvml_lib, invocation.nvml_lib);
    assert_eq!(g.mps_pipe_dir, invocation.mps_pipe_dir);
    assert_eq!(g.mps_pipe_dir_ctr_path, None);
    assert_eq!(g.hook_timeout_secs, invocation.hook_timeout_secs.unwrap_or(DEFAULT_HOOK_TIMEOUT_SECS));
    assert_eq!(g.output.as_deref(), Some(invocation.output.as_path()));
    let (vendor, class) = match &invocation.kind {
        Some(kind) => (kind.vendor(), kind.class()),
        None => (DEFAULT_VENDOR, DEFAULT_CLASS),
    };
    assert_eq!((g.vendor.as_str(), g.class.as_str()), (vendor, class));
    let format = match g.format {
        Some(FormatArg::Json) => Some(Format::Json),
        Some(FormatArg::Yaml) => Some(Format::Yaml),
        None => None,
    };
    assert_eq!(format, Some(invocation.format));
    // Nothing the invocation does not name is changed from the generator's defaults.
    assert!(g.library_search_paths.is_empty() && g.device_name_strategies.is_empty());
    assert!(!g.no_all_device && g.device_ids.is_none() && g.disabled_hooks.is_empty());
}

#[test]
fn the_plugins_invocation_is_read_back_by_the_generator() {
    assert_read_back(&plain());
}

#[test]
fn the_shims_invocation_with_every_optional_flag_is_read_back_by_the_generator() {
    assert_read_back(&full());
}

#[test]
fn each_optional_flag_alone_is_read_back_by_the_generator() {
    let variants = [
        GenerateInvocation { driver_root_ctr_path: Some("/driver-root".into()), ..plain() },
        GenerateInvocation { nvml_lib: Some(PathBuf::from("/lib/libnvidia-ml.so.1")), ..plain() },
        GenerateInvocation { mps_pipe_dir: Some("/run/nvidia/mps".into()), ..plain() },
        GenerateInvocation { hook_timeout_secs: Some(3600), ..plain() },
        GenerateInvocation { kind: Some("nvidia.com/gpu".parse().unwrap()), ..plain() },
        GenerateInvocation { kind: Some("vendor_1.io/mig-gpu".parse().unwrap()), ..plain() },
        GenerateInvocation { log_level: Some("error".into()), ..plain() },
        GenerateInvocation { format: Format::Yaml, ..plain() },
    ];
    for invocation in &variants {
        assert_read_back(invocation);
    }
}

#[test]
fn the_parser_rejects_a_flag_it_does_not_know() {
    // The check above can fail: a misspelt flag is refused, not ignored.
    let mut args = plain().to_args();
    let at = args.iter().position(|a| a == "--sys-root").unwrap();
    args[at] = "--sysroot".into();
    let argv = std::iter::once(OsString::from("nvinject-cdi")).chain(args);
    assert!(Cli::try_parse_from(argv).is_err());
}

#[test]
fn a_hook_timeout_outside_one_second_to_an_hour_is_refused() {
    for (secs, ok) in [("0", false), ("1", true), ("3600", true), ("3601", false), ("-5", false)] {
        let mut args = plain().to_args();
        args.extend(["--hook-timeout-secs".into(), secs.into()]);
        let argv = std::iter::once(OsString::from("nvinject-cdi")).chain(args);
        assert_eq!(Cli::try_parse_from(argv).is_ok(), ok, "--hook-timeout-secs {secs}");
    }
}
