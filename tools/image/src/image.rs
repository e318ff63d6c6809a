//! A container image made from the host's own binaries, as an OCI layout tar for `ctr images import`.
//!
//! No registry is needed (none is reachable in CI): images, the tests' and nvinject's release image
//! ([`crate::release_image`]) alike, are assembled from files already on the host: the
//! programs asked for plus every shared library `ldd` says they load, glibc's loader, `ldconfig`, a
//! `/etc/ld.so.conf` that includes `ld.so.conf.d`, and an `ld.so.cache` built for the image's own
//! libraries (as a Debian image has). The layout follows the host's (merged `/usr`: `/bin`, `/lib`,
//! `/lib64`, `/sbin` are symlinks into `/usr`), so paths that work on the host work inside.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::command;
use crate::error::{ImageError, Result, io};

/// The basic tools every test image carries besides the programs asked for.
pub const BASE_PROGRAMS: [&str; 11] = [
    "/bin/sh",
    "/bin/ls",
    "/bin/cat",
    "/bin/echo",
    "/bin/sleep",
    "/bin/env",
    "/bin/readlink",
    "/bin/stat",
    "/usr/bin/id",
    "/sbin/ldconfig",
    "/bin/true",
];

/// What to put in an image.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    /// Image reference, e.g. `docker.io/nvinject/probe:latest`.
    pub name: String,
    /// Host programs to copy to `/usr/local/bin/<file name>` (with their libraries).
    pub programs: Vec<PathBuf>,
    /// The image's default command.
    pub cmd: Vec<String>,
    /// Image environment (`NAME=value`).
    pub env: Vec<String>,
}

/// The built archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltImage {
    /// The OCI layout tar.
    pub tar: PathBuf,
    /// The reference it carries.
    pub name: String,
}

/// Shared libraries `binary` loads, per `ldd` (absolute paths, loader included).
pub fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = command::output(Command::new("ldd").arg(binary))?;
    let text = String::from_utf8_lossy(&out.stdout);
    // Static binaries make ldd exit 1 with "not a dynamic executable": no libraries.
    let mut libs = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.contains("not found") {
            return Err(ImageError::Prerequisite(format!("{}: {line}", binary.display())));
        }
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next().unwrap_or(""),
            None => line.split_whitespace().next().unwrap_or(""),
        };
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

/// Copies host file `host` to `dest` (absolute, inside the image) under `root`, parents made.
pub fn copy_into(root: &Path, host: &Path, dest: &Path) -> Result<()> {
    let target = root.join(dest.strip_prefix("/").unwrap_or(dest));
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent).map_err(io("create", parent))?;
    }
    fs::copy(host, &target).map_err(io("copy", host))?;
    Ok(())
}

/// Where a host file lands in a merged-/usr image: its directory canonicalized, its own name kept.
pub fn canonical_dest(host: &Path) -> Result<PathBuf> {
    let dir = host.parent().unwrap_or(Path::new("/"));
    let dir = fs::canonicalize(dir).map_err(io("resolve", dir))?;
    Ok(dir.join(host.file_name().unwrap_or_default()))
}

/// Lays out the image root in `root`.
pub fn assemble_root(spec: &ImageSpec, root: &Path) -> Result<()> {
    for dir in [
        "usr/bin",
        "usr/sbin",
        "usr/lib",
        "usr/lib64",
        "usr/local/bin",
        "etc/ld.so.conf.d",
        "tmp",
        "proc",
        "sys",
        "dev",
        "run",
        "var",
    ] {
        fs::create_dir_all(root.join(dir)).map_err(io("create", root.join(dir)))?;
    }
    for (link, target) in
        [("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")]
    {
        let path = root.join(link);
        if fs::symlink_metadata(&path).is_err() {
            std::os::unix::fs::symlink(target, &path).map_err(io("symlink", &path))?;
        }
    }
    std::os::unix::fs::symlink("../run", root.join("var/run"))
        .map_err(io("symlink", root.join("var/run")))?;
    let mut files: BTreeSet<PathBuf> = BTreeSet::new();
    for program in BASE_PROGRAMS.iter().map(PathBuf::from) {
        files.insert(program.clone());
        files.extend(shared_libraries(&program)?);
    }
    for program in &spec.programs {
        let dest = Path::new("/usr/local/bin").join(program.file_name().unwrap_or_default());
        copy_into(root, program, &dest)?;
        files.extend(shared_libraries(program)?);
    }
    for file in &files {
        copy_into(root, file, &canonical_dest(file)?)?;
    }
    fs::write(root.join("etc/ld.so.conf"), "include /etc/ld.so.conf.d/*.conf\n")
        .map_err(io("write", root.join("etc/ld.so.conf")))?;
    fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n",
    )
    .map_err(io("write", root.join("etc/passwd")))?;
    fs::write(root.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n")
        .map_err(io("write", root.join("etc/group")))?;
    // The image's own cache, built by the host's ldconfig chrooted into it (as a Debian image has).
    command::run(Command::new("/sbin/ldconfig").arg("-r").arg(root))?;
    Ok(())
}

fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A temp dir next to `out` (removed on drop).
fn work_dir_near(out: &Path) -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(".image-")
        .tempdir_in(out.parent().unwrap_or(Path::new("/tmp")))
        .map_err(io("create temp dir near", out))
}

/// Builds the OCI layout tar at `out` (a temp dir is used next to it and removed).
pub fn build(spec: &ImageSpec, out: &Path) -> Result<BuiltImage> {
    let work = work_dir_near(out)?;
    let root = work.path().join("rootfs");
    assemble_root(spec, &root)?;
    pack(spec, &root, out)
}

/// Packs an assembled (and possibly edited) root as a one-layer OCI layout tar at `out`, with
/// `spec`'s name, `Env` and `Cmd`.
pub fn pack(spec: &ImageSpec, root: &Path, out: &Path) -> Result<BuiltImage> {
    pack_with_digest(spec, root, out).map(|(image, _)| image)
}

/// [`pack`], also returning the manifest's digest (`sha256:<hex>`, what `ctr images ls` shows):
/// the same for the same inputs.
pub fn pack_with_digest(spec: &ImageSpec, root: &Path, out: &Path) -> Result<(BuiltImage, String)> {
    let work = work_dir_near(out)?;
    let layout = work.path().join("layout");
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs).map_err(io("create", &blobs))?;
    let layer = work.path().join("layer.tar");
    // Sorted names, zero times and numeric root ownership: same inputs, same layer digest.
    command::run(
        Command::new("tar")
            .args(["--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner", "-C"])
            .arg(root)
            .arg("-cf")
            .arg(&layer)
            .arg("."),
    )?;
    let layer_bytes = fs::read(&layer).map_err(io("read", &layer))?;
    let layer_digest = sha256_hex(&layer_bytes);
    fs::rename(&layer, blobs.join(&layer_digest)).map_err(io("move", &layer))?;

    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": spec.env,
            "Cmd": spec.cmd,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
    });
    let config_bytes = serde_json::to_vec(&config).expect("json");
    let config_digest = sha256_hex(&config_bytes);
    fs::write(blobs.join(&config_digest), &config_bytes).map_err(io("write", &blobs))?;

    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{config_digest}"), "size": config_bytes.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": format!("sha256:{layer_digest}"), "size": layer_bytes.len()}],
    });
    let manifest_bytes = serde_json::to_vec(&manifest).expect("json");
    let manifest_digest = sha256_hex(&manifest_bytes);
    fs::write(blobs.join(&manifest_digest), &manifest_bytes).map_err(io("write", &blobs))?;

    let tag = spec.name.rsplit_once(':').map(|(_, t)| t).unwrap_or("latest");
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest_bytes.len(),
            "annotations": {"io.containerd.image.name": spec.name, "org.opencontainers.image.ref.name": tag},
            "platform": {"architecture": "amd64", "os": "linux"},
        }],
    });
    fs::write(layout.join("index.json"), serde_json::to_vec(&index).expect("json"))
        .map_err(io("write", &layout))?;
    fs::write(layout.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)
        .map_err(io("write", &layout))?;
    // The layout's own files get fixed modes too, so the builder's umask does not reach the archive.
    command::run(
        Command::new("tar")
            .args([
                "--sort=name",
                "--mtime=@0",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "--mode=u=rwX,go=rX",
                "-C",
            ])
            .arg(&layout)
            .arg("-cf")
            .arg(out)
            .args(["oci-layout", "index.json", "blobs"]),
    )?;
    Ok((BuiltImage { tar: out.to_owned(), name: spec.name.clone() }, format!("sha256:{manifest_digest}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lists_glibc_for_a_dynamic_program() {
        let libs = shared_libraries(Path::new("/bin/ls")).unwrap();
        assert!(libs.iter().any(|l| l.to_string_lossy().contains("libc.so.6")), "{libs:?}");
        assert!(libs.iter().any(|l| l.to_string_lossy().contains("ld-linux")), "{libs:?}");
        // ldconfig is static: no libraries, no error.
        assert!(shared_libraries(Path::new("/sbin/ldconfig")).unwrap().is_empty());
    }

    #[test]
    fn an_assembled_root_runs_its_shell_in_a_chroot_like_layout() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let spec = ImageSpec { name: "x:latest".into(), programs: vec![], cmd: vec![], env: vec![] };
        assemble_root(&spec, &root).unwrap();
        assert!(root.join("usr/bin/sh").exists() || root.join("usr/bin/dash").exists());
        assert_eq!(fs::read_link(root.join("lib")).unwrap(), Path::new("usr/lib"));
        let cache = fs::read(root.join("etc/ld.so.cache")).unwrap();
        assert!(cache.windows(9).any(|w| w == b"libc.so.6"), "the image's own ld cache lists glibc");
    }
}
