//! The hook's command line against the contract that writes it: every run
//! `nvinject_cdi::nvinject::HookInvocation::to_args` produces (cdi-gen's spec runs, the shim's
//! merged and translated runs) parses with the hook's real clap parser into the same links,
//! folders, mounts and versions. A flag or subcommand renamed on one side fails here.

use clap::Parser;
use nvinject_cdi::nvinject::{CudaCompat, FlagForm, HookCommand, HookInvocation, HookLink, HookMount};
use nvinject_hook::cli::{Cli, Cmd, CompatFlags};

fn links(pairs: &[(&str, &str)]) -> Vec<HookLink> {
    pairs.iter().map(|(t, l)| HookLink { target: (*t).into(), link: (*l).into() }).collect()
}

/// What the hook understood, in the contract's terms.
#[derive(Debug, PartialEq)]
struct Understood {
    mounts: Vec<String>,
    subcommand: &'static str,
    links: Vec<String>,
    folders: Vec<String>,
    compat: [Option<String>; 3],
    /// inject's `--disable-device-node-modification` and `--update-application-profile`.
    switches: [bool; 2],
}

fn compat_of(c: CompatFlags) -> [Option<String>; 3] {
    [
        c.host_driver_version,
        c.host_cuda_version,
        c.cuda_compat_container_root.map(|p| p.display().to_string()),
    ]
}

fn understood(cli: Cli) -> Understood {
    let folders = |f: Vec<std::path::PathBuf>| f.iter().map(|p| p.display().to_string()).collect();
    let mut switches = [false; 2];
    let (subcommand, links, folders, compat) = match cli.command {
        Cmd::CreateSymlinks { links } => ("create-symlinks", links, Vec::new(), [None, None, None]),
        Cmd::UpdateLdcache { folders: f, .. } => {
            ("update-ldcache", Vec::new(), folders(f), [None, None, None])
        }
        Cmd::EnableCudaCompat { compat } => ("enable-cuda-compat", Vec::new(), Vec::new(), compat_of(compat)),
        Cmd::DisableDeviceNodeModification { params_file } => {
            // Specs never give the file: the hook reads the driver's own.
            assert_eq!(params_file, std::path::Path::new(nvinject_hook::params::HOST_PARAMS));
            ("disable-device-node-modification", Vec::new(), Vec::new(), [None, None, None])
        }
        Cmd::UpdateApplicationProfile => {
            ("update-application-profile", Vec::new(), Vec::new(), [None, None, None])
        }
        Cmd::BindMounts => ("bind-mounts", Vec::new(), Vec::new(), [None, None, None]),
        Cmd::Inject {
            links,
            folders: f,
            compat,
            disable_device_node_modification,
            update_application_profile,
            params_file,
            ..
        } => {
            assert_eq!(params_file, std::path::Path::new(nvinject_hook::params::HOST_PARAMS));
            switches = [disable_device_node_modification, update_application_profile];
            ("inject", links, folders(f), compat_of(compat))
        }
    };
    Understood { mounts: cli.mounts, subcommand, links, folders, compat, switches }
}

fn expected(run: &HookInvocation) -> Understood {
    let none = CudaCompat::default();
    let mut switches = [false; 2];
    let (links, folders, compat): (&[HookLink], &[String], &CudaCompat) = match &run.command {
        HookCommand::CreateSymlinks { links } => (links, &[], &none),
        HookCommand::UpdateLdcache { folders, .. } => (&[], folders, &none),
        HookCommand::EnableCudaCompat { compat } => (&[], &[], compat),
        HookCommand::DisableDeviceNodeModification
        | HookCommand::UpdateApplicationProfile
        | HookCommand::BindMounts => (&[], &[], &none),
        HookCommand::Inject {
            links,
            compat,
            folders,
            disable_device_node_modification,
            update_application_profile,
            ..
        } => {
            switches = [*disable_device_node_modification, *update_application_profile];
            (links, folders, compat)
        }
    };
    Understood {
        mounts: run.mounts.iter().map(HookMount::to_arg).collect(),
        subcommand: run.command.subcommand().as_str(),
        links: links.iter().map(HookLink::to_arg).collect(),
        folders: folders.to_vec(),
        compat: [
            compat.host_driver_version.clone(),
            compat.host_cuda_version.clone(),
            compat.container_root.clone(),
        ],
        switches,
    }
}

fn runs() -> Vec<HookInvocation> {
    let lib = links(&[
        ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so"),
        ("../card1", "/dev/dri/by-path/pci-0000:01:00.0-card"),
    ]);
    let compat = CudaCompat {
        host_driver_version: Some("550.54.15".into()),
        host_cuda_version: Some("12.4".into()),
        container_root: Some("/usr/local/cuda/compat".into()),
    };
    let driver_only = CudaCompat { host_driver_version: Some("550.54.15".into()), ..Default::default() };
    let mount = HookMount {
        source: "/run/nvidia/driver/usr/lib/libcuda.so.550".into(),
        destination: "/usr/lib/x86_64-linux-gnu/libcuda.so.550".into(),
        options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "rbind".into(), "rprivate".into()],
    };
    let commands = vec![
        HookCommand::CreateSymlinks { links: lib.clone() },
        // A value that looks like a flag (the shim's translation passes one on as a value).
        HookCommand::CreateSymlinks { links: links(&[("--mount=/etc", "/x::rbind")]) },
        HookCommand::UpdateLdcache {
            folders: vec!["/usr/lib/x86_64-linux-gnu".into(), "/usr/lib64".into()],
            ldconfig_path: None,
        },
        HookCommand::UpdateLdcache { folders: vec![], ldconfig_path: Some("/sbin/ldconfig".into()) },
        HookCommand::EnableCudaCompat { compat: driver_only.clone() },
        HookCommand::EnableCudaCompat { compat: compat.clone() },
        HookCommand::EnableCudaCompat { compat: CudaCompat::default() },
        HookCommand::DisableDeviceNodeModification,
        HookCommand::UpdateApplicationProfile,
        HookCommand::BindMounts,
        HookCommand::Inject {
            links: lib.clone(),
            compat,
            folders: vec!["/usr/lib/x86_64-linux-gnu".into()],
            ldconfig_path: Some("/sbin/ldconfig".into()),
            disable_device_node_modification: true,
            update_application_profile: true,
        },
        HookCommand::Inject {
            links: lib,
            compat: CudaCompat::default(),
            folders: vec![],
            ldconfig_path: None,
            disable_device_node_modification: false,
            update_application_profile: true,
        },
        HookCommand::Inject {
            links: vec![],
            compat: driver_only,
            folders: vec![],
            ldconfig_path: None,
            disable_device_node_modification: false,
            update_application_profile: false,
        },
    ];
    let mut out = Vec::new();
    for command in commands {
        for form in [FlagForm::Separate, FlagForm::Joined] {
            for mounts in
                [vec![], vec![mount.clone(), HookMount { options: vec!["rbind".into()], ..mount.clone() }]]
            {
                // Specs never carry mounts; the shim gives them to bind-mounts and inject only.
                let shim_run = matches!(command, HookCommand::BindMounts | HookCommand::Inject { .. });
                if mounts.is_empty() || shim_run {
                    out.push(HookInvocation { form, mounts, ..HookInvocation::new(command.clone()) });
                }
            }
        }
    }
    out
}

#[test]
fn every_run_the_contract_writes_parses_with_the_hook_s_own_parser() {
    let runs = runs();
    assert!(runs.len() > 20, "the range covers each subcommand, form and mounts");
    for run in runs {
        let args = run.to_args();
        let cli = Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert_eq!(understood(cli), expected(&run), "{args:?}");
        // And the contract reads back what it wrote.
        assert_eq!(HookInvocation::parse(&args).unwrap().command, run.command, "{args:?}");
    }
}

#[test]
fn what_the_hook_refuses_the_contract_refuses_too() {
    for argv in [
        &["nvinject-hook", "create-symlinks", "--mount", "/etc::/x::rbind"][..],
        &["nvinject-hook", "update-ldcache", "--mount=/etc::/x::rbind"],
        &["nvinject-hook", "inject", "--host-driver-version=1", "--host-driver-version=2"],
        &["nvinject-hook", "enable-cuda-compat", "--container-spec=/tmp/x"],
        &["nvinject-hook", "update-ldcache", "stray"],
        &["nvinject-hook", "inject", "--update-application-profile=true"],
        &["nvinject-hook", "update-application-profile", "--disable-device-node-modification"],
        &["nvinject-hook", "chmod"],
        &["nvinject-hook"],
    ] {
        assert!(Cli::try_parse_from(argv).is_err(), "hook: {argv:?}");
        assert!(HookInvocation::parse(argv).is_err(), "contract: {argv:?}");
    }
}
