//! `nvinject-hook`: the OCI `createContainer` hook that CDI specs written by nvinject-cdi call.
//!
//! runc runs it as root after the container's mounts are in place and before `pivot_root`, with the
//! OCI state on stdin, the container's rootfs as its working directory and, unless the spec's hook
//! names an `env`, the container's environment. Both are in the image's hands, so:
//! - the binary is **statically linked, with no dynamic loader** (no `PT_INTERP`, no `DT_NEEDED`):
//!   `LD_PRELOAD`, `LD_LIBRARY_PATH`, `LD_AUDIT`, `/etc/ld.so.preload` and any library in any
//!   directory have nothing to act on, whoever wrote the spec. The loader is what acts before
//!   `main()`, so clearing the environment in `main()` alone could never be enough. It is built with
//!   `--target <host triple>` and `-C target-feature=+crt-static` (`shim/README.md`; in tests,
//!   `nvinject_simnode::artifacts::static_hook`), and `main()` refuses to run when built otherwise;
//! - paths inside the root are resolved with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`
//!   ([`nvinject_fsio::root::Root`]), so no symlink in the image can redirect a write to the host;
//! - it runs **no program at all**: `update-ldcache` builds the container's `/etc/ld.so.cache`
//!   itself ([`nvinject_ldcache`], the format glibc's loader reads, from the image's `ld.so.conf`
//!   and the injected folders) and makes the SONAME links ldconfig would, every file it reads,
//!   lists or writes resolved inside the rootfs. Neither the image's `ldconfig` nor the host's
//!   (whose `-r` is only a chroot, which `/proc/1/root` leads out of) is run;
//! - the bind mounts the shim hands it (`--mount`, see [`Bind`]) are attached to the fd of the
//!   mountpoint resolved or made inside the root ([`nvinject_fsio::mount`]), never to a path;
//! - it refuses to run once the root is already `/` (that would mean it was wired as a hook that
//!   runs after `pivot_root`, in the container's own root).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use nvinject_fsio::mount::{BindError, BindOptions, MountApi};
use nvinject_fsio::root::{LinkOutcome, ParentDirs, Root, RootError};

pub mod app_profile;
pub mod cli;
pub mod compat;
pub mod params;

/// The ld.so.conf.d drop-in the hook writes so later `ldconfig` runs in the container keep the
/// injected folders.
pub const LDCONF_DROPIN: &str = "/etc/ld.so.conf.d/00-nvinject.conf";

/// Failures of a hook run. runc shows the message when the hook fails the container start.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The OCI state on stdin is not usable.
    #[error("invalid OCI state on stdin: {0}")]
    State(String),
    /// The bundle's config.json is not usable.
    #[error("cannot read the container root from {path}: {message}")]
    Bundle {
        /// The config.json.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The hook was run after pivot_root.
    #[error(
        "the container root {0} is the current root: nvinject-hook must run as a createContainer hook (before pivot_root)"
    )]
    AfterPivot(PathBuf),
    /// An operation in the container root failed.
    #[error(transparent)]
    Root(#[from] RootError),
    /// A `--link` argument is malformed.
    #[error("--link {0:?}: expected <target>::<link> with an absolute link path")]
    BadLink(String),
    /// A `--mount` argument is malformed.
    #[error("--mount {arg:?}: {why}")]
    BadMount {
        /// The argument.
        arg: String,
        /// What is wrong with it.
        why: String,
    },
    /// A bind mount could not be made.
    #[error(transparent)]
    Mount(#[from] BindError),
    /// A `--folder` argument is not absolute.
    #[error("--folder {0:?}: folders must be absolute paths inside the container")]
    BadFolder(String),
    /// `--cuda-compat-container-root` is not absolute.
    #[error("--cuda-compat-container-root {0:?}: give the folder as an absolute path inside the container")]
    BadCompatRoot(String),
    /// The driver's params file could not be read.
    #[error("reading the driver's parameters {}: {message}", path.display())]
    Params {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The container's library cache could not be planned (an unusable `ld.so.conf`, a limit).
    #[error("building the container's ld.so.cache: {0}")]
    Ldcache(#[from] nvinject_ldcache::LdCacheError),
}

/// The part of the OCI state a hook needs.
#[derive(Debug, Deserialize)]
pub struct State {
    /// Container id.
    #[serde(default)]
    pub id: String,
    /// Bundle directory (holds config.json).
    pub bundle: PathBuf,
}

/// Parses the OCI state JSON runc writes to a hook's stdin.
pub fn parse_state(bytes: &[u8]) -> Result<State, HookError> {
    serde_json::from_slice(bytes).map_err(|e| HookError::State(e.to_string()))
}

/// The container root of the bundle: `root.path` of its config.json, relative to the bundle
/// unless absolute.
pub fn container_root(bundle: &Path) -> Result<PathBuf, HookError> {
    let path = bundle.join("config.json");
    let fail = |message: String| HookError::Bundle { path: path.clone(), message };
    let text = std::fs::read(&path).map_err(|e| fail(e.to_string()))?;
    let spec: serde_json::Value = serde_json::from_slice(&text).map_err(|e| fail(e.to_string()))?;
    let root =
        spec.pointer("/root/path").and_then(|v| v.as_str()).ok_or_else(|| fail("no root.path".into()))?;
    let root = Path::new(root);
    Ok(if root.is_absolute() { root.to_owned() } else { bundle.join(root) })
}

/// Refuses to work when `root` is the filesystem root this process sees (after pivot_root).
pub fn check_before_pivot(root: &Path) -> Result<(), HookError> {
    use std::os::unix::fs::MetadataExt;
    let same = match (std::fs::metadata(root), std::fs::metadata("/")) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    };
    if same { Err(HookError::AfterPivot(root.to_owned())) } else { Ok(()) }
}

/// A parsed `--link target::link`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// What the link points to (kept as written: relative or absolute inside the container).
    pub target: PathBuf,
    /// Where the link goes, absolute inside the container.
    pub link: PathBuf,
}

/// Parses `target::link`.
pub fn parse_link(arg: &str) -> Result<Link, HookError> {
    match arg.split_once("::") {
        Some((target, link)) if !target.is_empty() && link.starts_with('/') && link.len() > 1 => {
            Ok(Link { target: target.into(), link: link.into() })
        }
        _ => Err(HookError::BadLink(arg.to_owned())),
    }
}

/// Creates each link in the container root. Existing files are left alone (logged), as an image
/// may ship its own.
pub fn create_symlinks(
    root: &Root,
    dirs: &mut ParentDirs,
    links: &[Link],
) -> Result<Vec<(Link, LinkOutcome)>, HookError> {
    let mut done = Vec::new();
    for link in links {
        let outcome = root.symlink_in(dirs, &link.target, &link.link)?;
        if let LinkOutcome::Occupied { existing } = &outcome {
            tracing::warn!(link = %link.link.display(), target = %link.target.display(), existing, "left an existing file in place");
        }
        done.push((link.clone(), outcome));
    }
    Ok(done)
}

/// One `--mount <source>::<destination>::<options>` of `bind-mounts`: a host path, the
/// mountpoint inside the container and the OCI mount options, comma-separated.
///
/// The shim moves a container's injected bind mounts into one such hook run instead of leaving
/// them to runc one by one: runc spends about 0.2 ms on each (a path walk in Go and three mount
/// calls), which over the ~40 files of a driver was most of what a GPU costs at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    /// The host path.
    pub source: PathBuf,
    /// Absolute inside the container.
    pub destination: PathBuf,
    /// OCI mount options (`ro`, `nosuid`, `nodev`, `rbind`, `rprivate`, ...).
    pub options: Vec<String>,
    /// What `options` mean, read once when the bind is made.
    parsed: BindOptions,
}

impl Bind {
    /// A bind `bind-mounts` can make, or `None` (then runc must): both paths absolute and free of
    /// `::`, options free of `,` and all understood by [`BindOptions::from_oci_options`], with
    /// `bind` or `rbind` among them.
    pub fn new(source: &str, destination: &str, options: &[String]) -> Option<Bind> {
        let path_ok = |p: &str| p.starts_with('/') && p.len() > 1 && !p.contains("::");
        if !path_ok(source)
            || !path_ok(destination)
            || options.iter().any(|o| o.contains(',') || o.is_empty())
        {
            return None;
        }
        let parsed = BindOptions::from_oci_options(options).ok()??;
        Some(Bind {
            source: source.into(),
            destination: destination.into(),
            options: options.to_vec(),
            parsed,
        })
    }

    /// The `--mount` value.
    pub fn to_arg(&self) -> String {
        format!("{}::{}::{}", self.source.display(), self.destination.display(), self.options.join(","))
    }

    /// Parses a `--mount` value.
    pub fn parse(arg: &str) -> Result<Bind, HookError> {
        let bad = |why: &str| HookError::BadMount { arg: arg.to_owned(), why: why.to_owned() };
        let mut parts = arg.split("::");
        let (Some(source), Some(destination), Some(options), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("expected <source>::<destination>::<options>"));
        };
        let options: Vec<String> =
            if options.is_empty() { Vec::new() } else { options.split(',').map(str::to_owned).collect() };
        Bind::new(source, destination, &options).ok_or_else(|| {
            match BindOptions::from_oci_options(&options) {
                Err(unknown) => {
                    bad(&format!("option {unknown:?} is not a bind-mount option this hook can apply"))
                }
                Ok(_) => {
                    bad("both paths must be absolute (and not /), and the options must include bind or rbind")
                }
            }
        })
    }
}

/// Makes each bind mount inside the container root, in order ([`Root::bind_mount_in`]: the
/// mountpoint is resolved and created inside the root and the mount attached to it by fd). The
/// first failure stops the run, and runc fails the container with its message.
///
/// `dirs` carries the mountpoints' directories from one mount to the next (and on to the links):
/// most of a driver's files share three or four directories.
pub fn bind_mounts(
    root: &Root,
    dirs: &mut ParentDirs,
    binds: &[Bind],
    api: MountApi,
) -> Result<(), HookError> {
    for bind in binds {
        let used = root.bind_mount_in(dirs, &bind.source, &bind.destination, &bind.parsed, api)?;
        tracing::trace!(source = %bind.source.display(), destination = %bind.destination.display(), ?used, "mounted");
    }
    Ok(())
}

/// Makes the container's `/etc/ld.so.cache` list `folders` (absolute paths inside the container)
/// besides what the image's own `ld.so.conf` lists, and creates the SONAME links ldconfig would.
///
/// The ld.so.conf.d drop-in is written first (when the image has that directory), so an `ldconfig`
/// the container runs later keeps the injected folders. No program is run: the cache is built over
/// the root and written atomically inside it, by [`nvinject_ldcache::plan_incremental`] from the
/// image's own cache and the `injected` files (the mountpoints and links this run made), or by a
/// full scan ([`nvinject_ldcache::plan`]) when nothing injected is known or the image's cache
/// cannot be built on. `first` (the CUDA compat folder, when [`compat::enable`] chose it) is
/// scanned before everything, so its libraries are the ones the loader finds.
pub fn update_ldcache(
    root: &Root,
    folders: &[PathBuf],
    injected: &[PathBuf],
    first: &[PathBuf],
) -> Result<(), HookError> {
    if let Some(bad) = folders.iter().find(|f| !f.is_absolute()) {
        return Err(HookError::BadFolder(bad.display().to_string()));
    }
    if !folders.is_empty() && root.dir_exists(Path::new("/etc/ld.so.conf.d")) {
        let mut text = String::from("# Written by nvinject-hook: folders of injected driver libraries.\n");
        for f in folders {
            text.push_str(&format!("{}\n", f.display()));
        }
        root.write_file(Path::new(LDCONF_DROPIN), text.as_bytes(), 0o644)?;
    }
    // The default work budget is hundreds of times a real image's scan; an image built to keep this
    // root process busy fails its start with an error naming the folder instead.
    let options = nvinject_ldcache::Options {
        first_dirs: first.to_vec(),
        extra_dirs: folders.to_vec(),
        work_budget: nvinject_ldcache::DEFAULT_WORK_BUDGET,
    };
    let update = nvinject_ldcache::plan_incremental(root, &options, injected)?;
    for link in &update.links {
        // ldconfig replaces a stale or dangling symlink, never a file the image put there.
        match root.symlink_metadata(&link.path)? {
            Some(meta) if !meta.file_type().is_symlink() => {
                tracing::warn!(link = %link.path.display(), "left a non-symlink in place of a SONAME link");
                continue;
            }
            _ => root.replace_symlink(&link.target, &link.path)?,
        }
    }
    let cache = Path::new(nvinject_ldcache::CACHE_PATH);
    root.mkdir_all(Path::new("/etc"), 0o755)?;
    root.write_file(cache, &update.cache, 0o644)?;
    tracing::debug!(links = update.links.len(), bytes = update.cache.len(), "ld.so.cache written");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse_link("libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so").unwrap(),
            Link { target: "libcuda.so.1".into(), link: "/usr/lib/x86_64-linux-gnu/libcuda.so".into() }
        );
        for bad in ["nolink", "a::relative/link", "::/x", "a::/"] {
            assert!(parse_link(bad).unwrap_err().to_string().contains(bad), "{bad}");
        }
    }

    #[test]
    fn the_root_comes_from_the_bundle_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), br#"{"root":{"path":"rootfs"},"x":1}"#).unwrap();
        assert_eq!(container_root(dir.path()).unwrap(), dir.path().join("rootfs"));
        std::fs::write(dir.path().join("config.json"), br#"{"root":{"path":"/abs/root"}}"#).unwrap();
        assert_eq!(container_root(dir.path()).unwrap(), PathBuf::from("/abs/root"));
        std::fs::write(dir.path().join("config.json"), br#"{"process":{}}"#).unwrap();
        assert!(container_root(dir.path()).unwrap_err().to_string().contains("root.path"));
        let state =
            parse_state(br#"{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":5,"bundle":"/b"}"#)
                .unwrap();
        assert_eq!((state.id.as_str(), state.bundle.as_path()), ("c1", Path::new("/b")));
        assert!(parse_state(b"{}").is_err());
    }

    #[test]
    fn mount_arguments_round_trip_and_bad_ones_are_named() {
        let opts: Vec<String> = ["ro", "nosuid", "nodev", "rbind", "rprivate"].map(String::from).to_vec();
        let bind =
            Bind::new("/usr/lib/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", &opts).unwrap();
        assert_eq!(
            bind.to_arg(),
            "/usr/lib/libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so.1::ro,nosuid,nodev,rbind,rprivate"
        );
        assert_eq!(Bind::parse(&bind.to_arg()).unwrap(), bind);
        // What the shim must leave to runc.
        assert!(Bind::new("/a::b", "/c", &opts).is_none());
        assert!(Bind::new("/a", "rel", &opts).is_none());
        assert!(Bind::new("/a", "/", &opts).is_none());
        assert!(Bind::new("/a", "/b", &["ro".to_owned()]).is_none(), "not a bind");
        assert!(Bind::new("/a", "/b", &["rbind".to_owned(), "idmap".to_owned()]).is_none());
        assert!(Bind::new("/a", "/b", &["rbind".to_owned(), "x,y".to_owned()]).is_none());
        for (arg, why) in [
            ("/a::/b", "expected <source>"),
            ("/a::/b::rbind::x", "expected <source>"),
            ("/a::/b::rbind,relatime", "\"relatime\" is not"),
            ("/a::b::rbind", "absolute"),
            ("/a::/b::ro", "bind or rbind"),
        ] {
            let err = Bind::parse(arg).unwrap_err().to_string();
            assert!(err.contains(arg) && err.contains(why), "{arg}: {err}");
        }
    }

    #[test]
    fn refuses_to_run_after_pivot_root() {
        assert!(matches!(check_before_pivot(Path::new("/")), Err(HookError::AfterPivot(_))));
        let dir = tempfile::tempdir().unwrap();
        check_before_pivot(dir.path()).unwrap();
    }

    #[test]
    fn the_cache_is_built_natively_in_a_real_root() {
        // A minimal root with one real library, under an unversioned name: the hook caches it under
        // its SONAME and makes the SONAME link, with no ldconfig anywhere.
        let dir = tempfile::tempdir().unwrap();
        let root_path = dir.path().join("rootfs");
        let lib_dir = root_path.join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib_dir).unwrap();
        std::fs::create_dir_all(root_path.join("etc/ld.so.conf.d")).unwrap();
        let libc_path = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        assert!(libc_path.exists(), "this test needs a Debian x86_64 host (as CI is)");
        std::fs::copy(libc_path, lib_dir.join("libc-2.36.so")).unwrap();
        let root = Root::open(&root_path).unwrap();
        update_ldcache(&root, &[PathBuf::from("/usr/lib/x86_64-linux-gnu")], &[], &[]).unwrap();
        let cache = std::fs::read(root_path.join("etc/ld.so.cache")).unwrap();
        let entries = nvinject_ldcache::parse(&cache).unwrap();
        assert!(
            entries.iter().any(|e| e.key == "libc.so.6" && e.path == "/usr/lib/x86_64-linux-gnu/libc.so.6"),
            "{entries:?}"
        );
        assert_eq!(std::fs::read_link(lib_dir.join("libc.so.6")).unwrap(), Path::new("libc-2.36.so"));
        let dropin = std::fs::read_to_string(root_path.join("etc/ld.so.conf.d/00-nvinject.conf")).unwrap();
        assert!(dropin.contains("/usr/lib/x86_64-linux-gnu"));
        let err = update_ldcache(&root, &[PathBuf::from("rel")], &[], &[]).unwrap_err();
        assert!(matches!(err, HookError::BadFolder(_)));
    }
}
