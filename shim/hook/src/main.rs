//! `nvinject-hook`: OCI createContainer hook for CDI specs written by nvinject-cdi.
//!
//! ```text
//! nvinject-hook create-symlinks --link <target>::<link> [--link ...]
//! nvinject-hook update-ldcache --folder <dir> [--folder ...]
//! nvinject-hook enable-cuda-compat --host-driver-version=<version>
//! nvinject-hook [--mount <source>::<destination>::<options> ...] bind-mounts
//! nvinject-hook [--mount ...] inject [--link <target>::<link> ...] [--host-driver-version=<v>] [--folder <dir> ...]
//! ```
//! `--mount`s (which the shim adds; specs never carry them) are made first, before the subcommand's
//! own work, so one run can do both.
//! Both read the OCI state from stdin. Messages go to stderr, which runc includes in its error.
//!
//! Only a static build (no dynamic loader) may run: see the crate documentation and
//! `shim/README.md` for why and how it is built.

use std::io::Read;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use nvinject_fsio::mount::MountApi;
use nvinject_fsio::root::Root;
use nvinject_hook as hook;

#[derive(Parser, Debug)]
#[command(name = "nvinject-hook", version, about = "OCI createContainer hook for nvinject CDI specs")]
struct Cli {
    /// A bind mount to make before anything else:
    /// `<host source>::<destination in the container>::<OCI options, comma-separated>`.
    #[arg(long = "mount")]
    mounts: Vec<String>,
    /// Use mount(2) and a remount even where the kernel has open_tree/move_mount (a test knob for
    /// the path older kernels take).
    #[arg(long, hide = true)]
    classic_mount_api: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create symlinks inside the container root.
    CreateSymlinks {
        /// `<target>::<link>`; the link path is absolute inside the container.
        #[arg(long = "link")]
        links: Vec<String>,
    },
    /// Only the `--mount`s (the shim's own hook run, when no nvinject hook runs first).
    BindMounts,
    /// The `--mount`s, then create-symlinks' links, then update-ldcache's cache, in one run (the
    /// shim merges a spec's runs into this); the cache is built from the image's own plus what
    /// this run mounted and linked.
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
    },
    /// Let the image's CUDA forward-compatibility libraries (`/usr/local/cuda/compat`) come first
    /// in the loader's order when they are newer than the host driver (NVIDIA's semantics); a
    /// later update-ldcache run builds the cache that way.
    EnableCudaCompat {
        #[command(flatten)]
        compat: CompatFlags,
    },
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
struct CompatFlags {
    /// The host driver's version (`550.54.15`).
    #[arg(long)]
    host_driver_version: Option<String>,
    /// The CUDA version the host driver supports (used with the compat library's ELF note).
    #[arg(long)]
    host_cuda_version: Option<String>,
    /// The compat folder in the container (default /usr/local/cuda/compat).
    #[arg(long)]
    cuda_compat_container_root: Option<PathBuf>,
}

impl CompatFlags {
    /// The arguments, when any version was given (otherwise there is nothing to decide).
    fn given(self) -> Option<hook::compat::CompatArgs> {
        (self.host_driver_version.is_some() || self.host_cuda_version.is_some()).then_some(
            hook::compat::CompatArgs {
                host_driver_version: self.host_driver_version,
                host_cuda_version: self.host_cuda_version,
                container_root: self.cuda_compat_container_root,
            },
        )
    }
}

/// How to get the only build of this binary that may run; shown when another one is started.
const BUILD_STATIC: &str = "cargo build -p nvinject-hook --target x86_64-unknown-linux-gnu \
     (with CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS=\"-C target-feature=+crt-static\" and RUSTFLAGS unset); \
     the binary is target/x86_64-unknown-linux-gnu/<profile>/nvinject-hook";

fn main() {
    // A dynamically linked hook has already run the image's LD_PRELOAD (if any) by now; refusing
    // here keeps such a build (for example target/debug/nvinject-hook from a plain workspace build)
    // from ever being installed or tested by mistake.
    if !cfg!(target_feature = "crt-static") {
        eprintln!(
            "nvinject-hook: this build is dynamically linked, and a dynamic loader would run code the \
             container image controls before main(); refusing to run. Build it statically: {BUILD_STATIC}"
        );
        std::process::exit(2);
    }
    // The hook runs with whatever environment runc was given; nothing here may depend on it, and
    // nothing it starts inherits it.
    for (key, _) in std::env::vars_os() {
        // SAFETY: single-threaded at this point (no thread has been spawned yet), so no other
        // thread can be reading the environment while it is modified.
        unsafe { std::env::remove_var(key) };
    }
    let _ =
        tracing_subscriber::fmt().with_writer(std::io::stderr).with_target(false).without_time().try_init();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("nvinject-hook: {}", message(&e));
        std::process::exit(1);
    }
}

/// The error and its causes, each once: our error types already show their source in their own
/// message, which `{:#}` would print again after it (runc passes the whole text on to the user).
fn message(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain().map(ToString::to_string) {
        if !text.contains(&cause) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&cause);
        }
    }
    text
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let mut stdin = Vec::new();
    std::io::stdin().read_to_end(&mut stdin).context("reading the OCI state from stdin")?;
    let state = hook::parse_state(&stdin)?;
    let root_path = hook::container_root(&state.bundle)?;
    hook::check_before_pivot(&root_path)?;
    let root = Root::open(&root_path)?;
    // What each step gets. The compat decision: in this run (the flags) or, for a spec's own
    // update-ldcache run after a separate enable-cuda-compat run, from the drop-in that run left.
    enum Compat {
        None,
        Decide(hook::compat::CompatArgs),
        FromDropin,
    }
    let (links, folders, compat) = match cli.command {
        Cmd::BindMounts => (Vec::new(), None, Compat::None),
        Cmd::CreateSymlinks { links } => (links, None, Compat::None),
        Cmd::EnableCudaCompat { compat } => {
            (Vec::new(), None, compat.given().map_or(Compat::None, Compat::Decide))
        }
        Cmd::UpdateLdcache { folders, ldconfig_path } => {
            if let Some(ignored) = ldconfig_path {
                tracing::debug!(ldconfig = %ignored.display(), "--ldconfig-path ignored: no program is run");
            }
            (Vec::new(), Some(folders), Compat::FromDropin)
        }
        Cmd::Inject { links, folders, ldconfig_path: _, compat } => (
            links,
            (!folders.is_empty()).then_some(folders),
            compat.given().map_or(Compat::None, Compat::Decide),
        ),
    };
    // Parsed before anything is done, so a bad argument changes nothing.
    let binds = cli.mounts.iter().map(|m| hook::Bind::parse(m)).collect::<Result<Vec<_>, _>>()?;
    let links = links.iter().map(|l| hook::parse_link(l)).collect::<Result<Vec<_>, _>>()?;
    let api = if cli.classic_mount_api { MountApi::Classic } else { MountApi::Auto };
    // Every subcommand is these steps, each with what it was given: the mounts, the links, the
    // compat decision, then the cache. The cache is built on the image's own from what this run
    // mounted and linked (a spec's own update-ldcache run is given neither: a full scan).
    hook::bind_mounts(&root, &binds, api)?;
    hook::create_symlinks(&root, &links)?;
    let first: Vec<PathBuf> = match compat {
        Compat::None => Vec::new(),
        Compat::Decide(args) => hook::compat::enable(&root, &args)?.into_iter().collect(),
        Compat::FromDropin => hook::compat::folders_from_dropin(&root)?,
    };
    if let Some(folders) = folders {
        let injected: Vec<PathBuf> =
            binds.iter().map(|b| b.destination.clone()).chain(links.iter().map(|l| l.link.clone())).collect();
        hook::update_ldcache(&root, &folders, &injected, &first)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_is_shown_once() {
        let io = std::io::Error::other("disk on fire");
        let root = nvinject_fsio::root::RootError {
            op: "write",
            path: "/etc/ld.so.cache".into(),
            root: "/r".into(),
            source: io,
        };
        let e = anyhow::Error::from(hook::HookError::from(root)).context("updating the cache");
        assert_eq!(message(&e), "updating the cache: write /etc/ld.so.cache in /r: disk on fire");
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(message(&plain), "outer: inner");
    }

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
