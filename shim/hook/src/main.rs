//! `nvinject-hook`: OCI createContainer hook for CDI specs written by nvinject-cdi.
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
//! `--mount`s (which the shim adds; specs never carry them) are made first, before the subcommand's
//! own work, so one run can do both.
//! Both read the OCI state from stdin. Messages go to stderr, which runc includes in its error.
//!
//! Only a static build (no dynamic loader) may run: see the crate documentation and
//! `shim/README.md` for why and how it is built.

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use nvinject_fsio::escape::escape_within;
use nvinject_fsio::mount::MountApi;
use nvinject_fsio::root::{ParentDirs, Root};
use nvinject_hook as hook;
use nvinject_hook::cli::{Cli, Cmd};

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
    // Plain text, always: runc passes stderr into containerd's error and log, which are read as
    // text, so no colour (tracing's default) and no control character from a file name.
    let _ = tracing_subscriber::fmt()
        .with_writer(|| PlainStderr)
        .with_ansi(false)
        .with_target(false)
        .without_time()
        .try_init();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("nvinject-hook: {}", escape_within(&message(&e), MESSAGE_LIMIT));
        std::process::exit(1);
    }
}

/// The longest message or log line the hook prints (anything longer is cut, with its length).
const MESSAGE_LIMIT: usize = 8192;

/// stderr for log lines: each line escaped ([`escape_within`]) but for its final newline. Text
/// from the image (file and link names) reaches these lines.
struct PlainStderr;

impl Write for PlainStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (line, end) = match text.strip_suffix('\n') {
            Some(line) => (line, "\n"),
            None => (&*text, ""),
        };
        write!(std::io::stderr().lock(), "{}{end}", escape_within(line, MESSAGE_LIMIT))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
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
    // The last two steps: the params cover (with the driver's params file) and the profile.
    let mut params: Option<PathBuf> = None;
    let mut profile = false;
    let (links, folders, compat) = match cli.command {
        Cmd::DisableDeviceNodeModification { params_file } => {
            params = Some(params_file);
            (Vec::new(), None, Compat::None)
        }
        Cmd::UpdateApplicationProfile => {
            profile = true;
            (Vec::new(), None, Compat::None)
        }
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
        Cmd::Inject {
            links,
            folders,
            ldconfig_path: _,
            compat,
            disable_device_node_modification,
            update_application_profile,
            params_file,
        } => {
            params = disable_device_node_modification.then_some(params_file);
            profile = update_application_profile;
            (
                links,
                (!folders.is_empty()).then_some(folders),
                compat.given().map_or(Compat::None, Compat::Decide),
            )
        }
    };
    // Parsed before anything is done, so a bad argument changes nothing.
    let binds = cli.mounts.iter().map(|m| hook::Bind::parse(m)).collect::<Result<Vec<_>, _>>()?;
    let links = links.iter().map(|l| hook::parse_link(l)).collect::<Result<Vec<_>, _>>()?;
    let api = if cli.classic_mount_api { MountApi::Classic } else { MountApi::Auto };
    // Every subcommand is these steps, each with what it was given: the mounts, the links, the
    // compat decision, the cache, the params cover, then the profile (NVIDIA's order of the runs).
    // The cache is built on the image's own from what this run mounted and linked (a spec's own
    // update-ldcache run is given neither: a full scan).
    let mut dirs = ParentDirs::default();
    hook::bind_mounts(&root, &mut dirs, &binds, api)?;
    hook::create_symlinks(&root, &mut dirs, &links)?;
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
    if let Some(params_file) = params {
        let outcome = hook::params::disable_device_node_modification(&root, &params_file)?;
        tracing::debug!(?outcome, "disable-device-node-modification");
    }
    if profile {
        let outcome = hook::app_profile::update_application_profile(&root)?;
        tracing::debug!(?outcome, "update-application-profile");
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
}
