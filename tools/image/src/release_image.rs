//! nvinject's own container image: the one `deploy/`'s DaemonSets run, built offline from this
//! workspace's binaries as an OCI layout tar for `ctr images import` (or a push to a registry).
//!
//! It holds the five binaries in [`BIN_DIR`] (the installer DaemonSet copies them from there onto
//! the host), the shared libraries the dynamic ones load, glibc's loader and an `ld.so.cache`,
//! `chroot` (the installer's systemd restart runs the host's `systemctl` through it) and the test
//! images' basic tools, for `kubectl exec` at 3 a.m. The hook must be the static build; anything
//! else is refused here, not discovered on a node.
//!
//! The same inputs give the same digest: [`crate::image::pack`] writes sorted, zero-time,
//! root-owned tars, and every mode is normalized here so the builder's umask does not leak in.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::command;
use crate::error::{ImageError, Result, io};
use crate::image::{self, BuiltImage, ImageSpec};

/// Where the binaries live inside the image (the installed layout on a node uses the same path).
pub const BIN_DIR: &str = "/usr/local/nvinject/bin";

/// The binaries the image carries, by file name.
pub const BINARIES: [&str; 5] = [
    "nvinject-installer",
    "nvinject-device-plugin",
    "nvinject-cdi",
    "containerd-shim-nvinject-v2",
    "nvinject-hook",
];

/// Host programs the image carries besides the test images' basic tools.
const EXTRA_PROGRAMS: [&str; 1] = ["/usr/sbin/chroot"];

/// What the image is built from.
#[derive(Debug, Clone)]
pub struct ReleaseInputs {
    /// The reference the image carries (`deploy/` names it: see `nvinject-installer manifests`).
    pub name: String,
    /// The profile directory holding every binary but the static ones (e.g. `target/release`).
    pub bin_dir: PathBuf,
    /// The static `nvinject-hook`; the static `containerd-shim-nvinject-v2` is taken from beside
    /// it (`./x build-hook` builds both there).
    pub hook: PathBuf,
}

impl ReleaseInputs {
    /// Where binary `name` comes from.
    pub fn source(&self, name: &str) -> PathBuf {
        source(&self.bin_dir, &self.hook, name)
    }
}

/// Where binary `name` comes from: the hook is `hook`, the shim the one beside `hook` (the static
/// build) when there is one, everything else `bin_dir`'s.
fn source(bin_dir: &Path, hook: &Path, name: &str) -> PathBuf {
    match name {
        "nvinject-hook" => hook.to_path_buf(),
        "containerd-shim-nvinject-v2" => {
            let beside = hook.with_file_name(name);
            if beside.is_file() { beside } else { bin_dir.join(name) }
        }
        _ => bin_dir.join(name),
    }
}

/// Builds the image as an OCI layout tar at `out`.
pub fn build(inputs: &ReleaseInputs, out: &Path) -> Result<ReleaseImage> {
    let work = tempfile::Builder::new()
        .prefix(".release-image-")
        .tempdir_in(out.parent().unwrap_or(Path::new("/tmp")))
        .map_err(io("create temp dir near", out))?;
    let root = work.path().join("rootfs");
    let spec = ImageSpec {
        name: inputs.name.clone(),
        programs: Vec::new(),
        cmd: vec!["nvinject-installer".into(), "--help".into()],
        env: vec![format!("PATH={BIN_DIR}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")],
    };
    image::assemble_root(&spec, &root)?;
    fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).map_err(io("chmod", &root))?;

    // The hook must be static (no loader for an image's environment to steer); the shim is, so
    // that each of its three starts per container skips the loader's work.
    for (name, what) in [("nvinject-hook", "hook"), ("containerd-shim-nvinject-v2", "shim")] {
        let binary = inputs.source(name);
        if !image::shared_libraries(&binary)?.is_empty() {
            return Err(ImageError::Prerequisite(format!(
                "{} is dynamically linked; the image needs the static {what} (`./x build-hook --release` \
                 builds it beside the static hook)",
                binary.display()
            )));
        }
    }
    let mut programs: Vec<(PathBuf, PathBuf)> =
        BINARIES.iter().map(|name| (inputs.source(name), Path::new(BIN_DIR).join(name))).collect();
    for extra in EXTRA_PROGRAMS.map(PathBuf::from) {
        let dest = image::canonical_dest(&extra)?;
        programs.push((extra, dest));
    }
    for (source, dest) in &programs {
        if !source.is_file() {
            return Err(ImageError::Prerequisite(format!(
                "{} is missing: build it first (`./x image` builds everything)",
                source.display()
            )));
        }
        image::copy_into(&root, source, dest)?;
        for lib in image::shared_libraries(source)? {
            image::copy_into(&root, &lib, &image::canonical_dest(&lib)?)?;
        }
    }
    // The cache again, now that the binaries' libraries are in; ldconfig's aux cache records
    // inode numbers and times, so it is not kept.
    command::run(Command::new("/sbin/ldconfig").arg("-r").arg(&root))?;
    let aux = root.join("var/cache/ldconfig");
    if aux.exists() {
        fs::remove_dir_all(&aux).map_err(io("remove", &aux))?;
    }
    normalize_modes(&root)?;
    let (image, digest) = image::pack_with_digest(&spec, &root, out)?;
    let size = fs::metadata(&image.tar).map_err(io("stat", &image.tar))?.len();
    Ok(ReleaseImage { image, digest, size })
}

/// A built release image.
#[derive(Debug, Clone)]
pub struct ReleaseImage {
    /// The archive and the reference it carries.
    pub image: BuiltImage,
    /// The manifest digest (`sha256:<hex>`).
    pub digest: String,
    /// Size of the (uncompressed) archive in bytes.
    pub size: u64,
}

/// Directories 0755; files 0755 when anyone may execute them, else 0644; links untouched.
fn normalize_modes(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir).map_err(io("read", dir))? {
        let entry = entry.map_err(io("read", dir))?;
        let path = entry.path();
        let meta = fs::symlink_metadata(&path).map_err(io("stat", &path))?;
        let mode = if meta.is_dir() {
            normalize_modes(&path)?;
            0o755
        } else if meta.is_file() {
            if meta.permissions().mode() & 0o111 != 0 { 0o755 } else { 0o644 }
        } else {
            continue;
        };
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).map_err(io("chmod", &path))?;
    }
    Ok(())
}

/// The image's [`BINARIES`] from `bin_dir` (the hook from `hook` and the shim from beside it, built
/// apart for their static link),
/// copied into `dir` without their debug info (`strip --strip-debug`, what the release profile's
/// `strip = "debuginfo"` does): debug binaries whole weigh about 220 MiB, and the installer, which
/// holds them in memory, would overrun deploy/'s 256 MiB limit. Returns `dir`.
pub fn stripped_copies(bin_dir: &Path, hook: &Path, dir: &Path) -> Result<PathBuf> {
    fs::create_dir_all(dir).map_err(io("create", dir))?;
    for name in BINARIES {
        let source = source(bin_dir, hook, name);
        command::run(Command::new("strip").arg("--strip-debug").arg("-o").arg(dir.join(name)).arg(&source))?;
    }
    Ok(dir.to_path_buf())
}

/// [`build`] from [`stripped_copies`] of `bin_dir`'s binaries (made in `work/image-bin`): the image
/// tests and benches pack, named `name`, written to `work/nvinject-image.tar`.
pub fn build_stripped(bin_dir: &Path, hook: &Path, name: &str, work: &Path) -> Result<ReleaseImage> {
    let stripped = stripped_copies(bin_dir, hook, &work.join("image-bin"))?;
    let inputs = ReleaseInputs {
        name: name.to_owned(),
        bin_dir: stripped.clone(),
        hook: stripped.join("nvinject-hook"),
    };
    build(&inputs, &work.join("nvinject-image.tar"))
}

/// The image reference the manifests of `installer` (an `nvinject-installer` binary) name: what
/// `deploy/` runs, so the image built from that installer carries exactly that name.
pub fn manifests_image(installer: &Path) -> Result<String> {
    let out = command::output(Command::new(installer).arg("manifests"))?;
    if !out.status.success() {
        return Err(ImageError::Prerequisite(format!(
            "{} manifests failed: {}",
            installer.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut images: Vec<&str> =
        text.lines().filter_map(|l| l.trim().strip_prefix("image: ")).map(str::trim).collect();
    images.sort_unstable();
    images.dedup();
    match images.as_slice() {
        [one] => Ok((*one).to_owned()),
        other => Err(ImageError::Prerequisite(format!(
            "{} manifests name {} images ({other:?}); expected one",
            installer.display(),
            other.len()
        ))),
    }
}
