//! nvinject-hook's command line (clap), in the library so the contract test can run the real
//! parser on what `nvinject_cdi::nvinject::HookInvocation` writes.
//!
//! ```text
//! nvinject-hook create-symlinks --link <target>::<link> [--link ...]
//! nvinject-hook update-ldcache --folder <dir> [--folder ...]
//! nvinject-hook enable-cuda-compat --host-driver-version=<version>
//! nvinject-hook disable-device-node-modification
//! nvinject-hook update-application-profile
//! nvinject-hook [--mount <source>::<destination>::<options> ...] bind-mounts
//! nvinject-hook [--mount ...] inject [--link <target>::<link> ...] [--host-driver-version=<v>] [--folder <dir> ...]
//!     [--disable-device-node-modification] [--update-application-profile]
//! ```

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// The command line. Specs and the shim write it through `nvinject_cdi::nvinject::HookInvocation`
/// (a dev-dependency here only: `tests/contract.rs` pins the two grammars to each other).
#[derive(Parser, Debug)]
#[command(name = "nvinject-hook", version, about = "OCI createContainer hook for nvinject CDI specs")]
pub struct Cli {
    /// A bind mount to make before anything else:
    /// `<host source>::<destination in the container>::<OCI options, comma-separated>`.
    #[arg(long = "mount")]
    pub mounts: Vec<String>,
    /// Use mount(2) and a remount even where the kernel has open_tree/move_mount (a test knob for
    /// the path older kernels take).
    #[arg(long, hide = true)]
    pub classic_mount_api: bool,
    /// What to do after the mounts.
    #[command(subcommand)]
    pub command: Cmd,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Create symlinks inside the container root.
    CreateSymlinks {
        /// `<target>::<link>`; the link path is absolute inside the container.
        #[arg(long = "link")]
        links: Vec<String>,
    },
    /// Only the `--mount`s (the shim's own hook run, when no nvinject hook runs first).
    BindMounts,
    /// The `--mount`s, then create-symlinks' links, then update-ldcache's cache, then what
    /// disable-device-node-modification and update-application-profile do, in one run (the shim
    /// merges a spec's runs into this); the cache is built from the image's own plus what this
    /// run mounted and linked.
    Inject {
        /// As create-symlinks' `--link`.
        #[arg(long = "link")]
        links: Vec<String>,
        /// As update-ldcache's `--folder`.
        #[arg(long = "folder")]
        folders: Vec<PathBuf>,
        /// Accepted and ignored, as by update-ldcache.
        #[arg(long, hide = true)]
        ldconfig_path: Option<PathBuf>,
        /// As enable-cuda-compat's (decided before the cache is built, which then lists the
        /// compat folder first).
        #[command(flatten)]
        compat: CompatFlags,
        /// Also do disable-device-node-modification's work, after the cache.
        #[arg(long)]
        disable_device_node_modification: bool,
        /// Also do update-application-profile's work, last.
        #[arg(long)]
        update_application_profile: bool,
        /// As disable-device-node-modification's (a test knob: specs never give it).
        #[arg(long, hide = true, default_value = crate::params::HOST_PARAMS)]
        params_file: PathBuf,
    },
    /// Let the image's CUDA forward-compatibility libraries (`/usr/local/cuda/compat`) come first
    /// in the loader's order when they are newer than the host driver (NVIDIA's semantics); a
    /// later update-ldcache run builds the cache that way.
    EnableCudaCompat {
        /// The versions and folder to decide with.
        #[command(flatten)]
        compat: CompatFlags,
    },
    /// Make the container read `ModifyDeviceFiles: 0` in /proc/driver/nvidia/params (a private
    /// read-only copy of the host's file over the container's), so CUDA there never creates or
    /// changes device nodes; nothing when the host's says 0 already or the container has none.
    DisableDeviceNodeModification {
        /// The driver's params file as this process sees it (a test knob: specs never give it).
        #[arg(long, hide = true, default_value = crate::params::HOST_PARAMS)]
        params_file: PathBuf,
    },
    /// Write the driver's application profile limiting EGL/Vulkan to the container's GPUs (the
    /// `/dev/nvidia<N>` devices it has), as NVIDIA's hook of that name does; nothing without one.
    UpdateApplicationProfile,
    /// Rebuild the container's ld.so.cache (natively, inside the root; no ldconfig is run).
    UpdateLdcache {
        /// A folder (inside the container) holding injected libraries.
        #[arg(long = "folder")]
        folders: Vec<PathBuf>,
        /// Accepted for specs written before the cache was built natively; ignored (no program
        /// is run).
        #[arg(long, hide = true)]
        ldconfig_path: Option<PathBuf>,
    },
}

/// enable-cuda-compat's flags, spelled as NVIDIA's hook spells them.
#[derive(clap::Args, Debug, Default)]
pub struct CompatFlags {
    /// The host driver's version (`550.54.15`).
    #[arg(long)]
    pub host_driver_version: Option<String>,
    /// The CUDA version the host driver supports (used with the compat library's ELF note).
    #[arg(long)]
    pub host_cuda_version: Option<String>,
    /// The compat folder in the container (default /usr/local/cuda/compat).
    #[arg(long)]
    pub cuda_compat_container_root: Option<PathBuf>,
}

impl CompatFlags {
    /// The arguments, when any version was given (otherwise there is nothing to decide).
    pub fn given(self) -> Option<crate::compat::CompatArgs> {
        (self.host_driver_version.is_some() || self.host_cuda_version.is_some()).then_some(
            crate::compat::CompatArgs {
                host_driver_version: self.host_driver_version,
                host_cuda_version: self.host_cuda_version,
                container_root: self.cuda_compat_container_root,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translated_arguments_parse_and_mounts_come_only_before_the_subcommand() {
        let cli = Cli::try_parse_from([
            "nvinject-hook",
            "inject",
            "--link=a::/b",
            "--host-driver-version=550.54.15",
            "--folder=/usr/lib/x86_64-linux-gnu",
        ])
        .unwrap();
        let Cmd::Inject { links, folders, compat, .. } = cli.command else { panic!("{:?}", cli.command) };
        assert_eq!((links.as_slice(), folders.len()), (["a::/b".to_owned()].as_slice(), 1));
        assert_eq!(compat.host_driver_version.as_deref(), Some("550.54.15"));
        let cli =
            Cli::try_parse_from(["nvinject-hook", "enable-cuda-compat", "--host-driver-version", "560"])
                .unwrap();
        assert!(
            matches!(cli.command, Cmd::EnableCudaCompat { compat } if compat.host_driver_version.is_some())
        );
        // A spec's run can give --mount only before the subcommand, which the shim's translation
        // of NVIDIA's hooks never writes; after it, or twice a compat flag, it is refused.
        for argv in [
            &["nvinject-hook", "create-symlinks", "--mount", "/etc::/x::rbind"][..],
            &["nvinject-hook", "update-ldcache", "--mount=/etc::/x::rbind"],
            &["nvinject-hook", "inject", "--host-driver-version=1", "--host-driver-version=2"],
            &["nvinject-hook", "enable-cuda-compat", "--container-spec=/tmp/x"],
        ] {
            assert!(Cli::try_parse_from(argv).is_err(), "{argv:?}");
        }
        let none = Cli::try_parse_from(["nvinject-hook", "enable-cuda-compat"]).unwrap();
        assert!(
            matches!(none.command, Cmd::EnableCudaCompat { compat } if compat.host_driver_version.is_none() && compat.host_cuda_version.is_none())
        );
    }
}
