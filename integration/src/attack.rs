//! What the security tests attack with: payloads compiled on the host (a library whose constructor
//! records every process that loads it, a static checker that reports from inside a container, a
//! dynamic program that needs `libgcc_s.so.1`), images carrying files at any path, and `ctr run`
//! with a bounded wait so a hang fails the test instead of stalling it.
//!
//! The library writes `pwned-<executable name>` twice: into a marker directory given by absolute
//! host path (reachable only from the host's root, so a file there means image code ran on the host,
//! as root, outside the container) and into its working directory (a hook's is the container
//! rootfs, so the container can see that one).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::error::{HarnessError, Result, io};
use crate::image::{self, BuiltImage, ImageSpec};
use crate::node::{GpuNode, NVINJECT_RUNTIME};
use crate::process;

/// The line prefix of the static checker's report.
pub const CHECK_PREFIX: &str = "NVINJECT-CHECK ";

const EVIL_C: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static void mark(const char *dir) {
    char exe[512] = {0}, path[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    const char *base = n > 0 ? strrchr(exe, '/') : NULL;
    base = base ? base + 1 : "unknown";
    snprintf(path, sizeof path, "%s/pwned-%s", dir, base);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        dprintf(fd, "uid=%d pid=%d exe=%s\n", (int)getuid(), (int)getpid(), exe);
        close(fd);
    }
}
__attribute__((constructor)) static void pwn(void) { mark(MARKER_DIR); mark("."); }
/* LD_AUDIT keeps a library only if it has la_version; gconv needs these two. */
unsigned int la_version(unsigned int v) { return v; }
int gconv_init(void *step) { (void)step; return 1; }
int gconv(void *a, void *b, void *c, void *d, void *e, int f) {
    (void)a; (void)b; (void)c; (void)d; (void)e; (void)f; return 1;
}
"#;

const CHECK_C: &str = r#"
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
int main(void) {
    struct stat st;
    int gpu = stat("/dev/nvidia0", &st) == 0 && S_ISCHR(st.st_mode);
    int ldconf = access("/etc/ld.so.conf.d/00-nvinject.conf", F_OK) == 0;
    printf("NVINJECT-CHECK gpu0=%d ldconf=%d pwned=", gpu, ldconf);
    DIR *d = opendir("/");
    struct dirent *e;
    int first = 1;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, "pwned-", 6) == 0) {
            printf("%s%s", first ? "" : ",", e->d_name + 6);
            first = 0;
        }
    }
    printf("\n");
    return 0;
}
"#;

/// The compiled payloads.
#[derive(Debug, Clone)]
pub struct Payloads {
    /// The library (`LD_PRELOAD`, `LD_AUDIT`, a gconv module, or renamed as any library).
    pub evil_so: PathBuf,
    /// A static program (no loader variable acts on it) printing a [`CHECK_PREFIX`] line.
    pub check: PathBuf,
    /// A dynamic program with `libgcc_s.so.1` in `DT_NEEDED` (as a dynamic Rust hook has).
    pub victim: PathBuf,
    /// Where the library records host-side runs.
    pub marker_dir: PathBuf,
}

fn gcc(args: &[&str], dir: &Path) -> Result<()> {
    process::require_file(Path::new("/usr/bin/gcc"), "install gcc and libc6-dev")?;
    process::run(Command::new("/usr/bin/gcc").args(args).current_dir(dir))?;
    Ok(())
}

/// Compiles the payloads in `dir`; the library records host runs in `marker_dir` (created).
pub fn build_payloads(dir: &Path, marker_dir: &Path) -> Result<Payloads> {
    fs::create_dir_all(dir).map_err(io("create", dir))?;
    fs::create_dir_all(marker_dir).map_err(io("create", marker_dir))?;
    for (name, text) in
        [("evil.c", EVIL_C), ("check.c", CHECK_C), ("victim.c", "int main(void) { return 0; }\n")]
    {
        fs::write(dir.join(name), text).map_err(io("write", dir.join(name)))?;
    }
    let define =
        format!("-DMARKER_DIR={}", serde_json::to_string(&marker_dir.to_string_lossy()).expect("json"));
    gcc(&["-shared", "-fPIC", "-O2", &define, "-o", "evil.so", "evil.c"], dir)?;
    gcc(&["-static", "-O2", "-o", "check", "check.c"], dir)?;
    gcc(&["-O2", "-o", "victim", "victim.c", "-Wl,--no-as-needed", "-lgcc_s"], dir)?;
    Ok(Payloads {
        evil_so: dir.join("evil.so"),
        check: dir.join("check"),
        victim: dir.join("victim"),
        marker_dir: marker_dir.to_owned(),
    })
}

/// The sorted names of the files in `dir` (empty when it does not exist).
pub fn markers(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Removes every file in `dir` (the marker directory between runs).
pub fn clear_markers(dir: &Path) {
    for name in markers(dir) {
        let _ = fs::remove_file(dir.join(name));
    }
}

/// What the static checker saw inside a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// `/dev/nvidia0` is a character device.
    pub gpu0: bool,
    /// The ld.so.conf.d drop-in of `update-ldcache` exists (the hook ran).
    pub ldconf: bool,
    /// `pwned-*` files in the container's `/`, by executable name.
    pub pwned: Vec<String>,
}

/// Parses the checker's line from container output.
pub fn parse_check(output: &str) -> Option<Check> {
    let line = output.lines().find_map(|l| l.trim().strip_prefix(CHECK_PREFIX))?;
    let field = |key: &str| line.split(' ').find_map(|f| f.strip_prefix(key));
    let mut pwned: Vec<String> =
        field("pwned=")?.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect();
    pwned.sort();
    Some(Check { gpu0: field("gpu0=")? == "1", ldconf: field("ldconf=")? == "1", pwned })
}

/// A file to put into an image: absolute path inside it, content, mode.
#[derive(Debug, Clone)]
pub struct ImageFile {
    /// Absolute path in the image.
    pub path: PathBuf,
    /// The bytes.
    pub content: Vec<u8>,
    /// Permission bits.
    pub mode: u32,
}

impl ImageFile {
    /// A copy of a host file, keeping its mode.
    pub fn copy(path: impl Into<PathBuf>, host: &Path) -> Result<ImageFile> {
        let content = fs::read(host).map_err(io("read", host))?;
        let mode = fs::metadata(host).map_err(io("stat", host))?.permissions().mode() & 0o7777;
        Ok(ImageFile { path: path.into(), content, mode })
    }

    /// A file with the given text.
    pub fn text(path: impl Into<PathBuf>, text: &str, mode: u32) -> ImageFile {
        ImageFile { path: path.into(), content: text.as_bytes().to_vec(), mode }
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn tar(dir: &Path, out: &Path, names: &[&str]) -> Result<()> {
    process::run(
        Command::new("tar")
            .args(["--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner", "-C"])
            .arg(dir)
            .arg("-cf")
            .arg(out)
            .args(names),
    )?;
    Ok(())
}

/// Builds an OCI archive like [`image::build`] with `files` added at any path (`image::build` puts
/// programs in `/usr/local/bin` only). `spec.env` becomes the image config's `Env`.
pub fn build_image(spec: &ImageSpec, files: &[ImageFile], out: &Path) -> Result<BuiltImage> {
    let work = tempfile::Builder::new()
        .prefix(".attack-image-")
        .tempdir_in(out.parent().unwrap_or(Path::new("/tmp")))
        .map_err(io("create temp dir near", out))?;
    let root = work.path().join("rootfs");
    image::assemble_root(spec, &root)?;
    for file in files {
        let dest = root.join(file.path.strip_prefix("/").unwrap_or(&file.path));
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent).map_err(io("create", parent))?;
        }
        fs::write(&dest, &file.content).map_err(io("write", &dest))?;
        fs::set_permissions(&dest, fs::Permissions::from_mode(file.mode)).map_err(io("chmod", &dest))?;
    }
    let blobs = work.path().join("layout/blobs/sha256");
    fs::create_dir_all(&blobs).map_err(io("create", &blobs))?;
    let layer = work.path().join("layer.tar");
    tar(&root, &layer, &["."])?;
    let layer_bytes = fs::read(&layer).map_err(io("read", &layer))?;
    let layer_digest = sha256_hex(&layer_bytes);
    fs::rename(&layer, blobs.join(&layer_digest)).map_err(io("move", &layer))?;
    let blob = |value: serde_json::Value| -> Result<(String, usize)> {
        let bytes = serde_json::to_vec(&value).expect("json");
        let digest = sha256_hex(&bytes);
        fs::write(blobs.join(&digest), &bytes).map_err(io("write", &blobs))?;
        Ok((digest, bytes.len()))
    };
    let (config_digest, config_size) = blob(json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": spec.env, "Cmd": spec.cmd, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
    }))?;
    let (manifest_digest, manifest_size) = blob(json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": format!("sha256:{config_digest}"), "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": format!("sha256:{layer_digest}"), "size": layer_bytes.len()}],
    }))?;
    let tag = spec.name.rsplit_once(':').map_or("latest", |(_, t)| t);
    let layout = work.path().join("layout");
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest_size,
            "annotations": {"io.containerd.image.name": spec.name, "org.opencontainers.image.ref.name": tag},
            "platform": {"architecture": "amd64", "os": "linux"},
        }],
    });
    fs::write(layout.join("index.json"), serde_json::to_vec(&index).expect("json"))
        .map_err(io("write", &layout))?;
    fs::write(layout.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)
        .map_err(io("write", &layout))?;
    tar(&layout, out, &["oci-layout", "index.json", "blobs"])?;
    Ok(BuiltImage { tar: out.to_owned(), name: spec.name.clone() })
}

/// What a bounded command gave back.
#[derive(Debug, Clone)]
pub struct Bounded {
    /// Exit code (-1 when killed by a signal).
    pub status: i32,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

/// Runs `cmd` with its output in files under `scratch`; kills it (by PID) and fails with
/// [`HarnessError::Timeout`] when it runs past `timeout`.
pub fn run_bounded(cmd: &mut Command, timeout: Duration, scratch: &Path, what: &str) -> Result<Bounded> {
    let out_path = scratch.join(format!("{what}.stdout"));
    let err_path = scratch.join(format!("{what}.stderr"));
    let out = fs::File::create(&out_path).map_err(io("create", &out_path))?;
    let err = fs::File::create(&err_path).map_err(io("create", &err_path))?;
    let mut child =
        cmd.stdin(Stdio::null()).stdout(out).stderr(err).spawn().map_err(|e| HarnessError::Command {
            command: process::describe(cmd),
            status: "not started".into(),
            output: e.to_string(),
        })?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(io("wait for", &out_path))? {
            break status;
        }
        if Instant::now() >= deadline {
            process::stop_pid(child.id() as i32, Duration::from_secs(1));
            let _ = child.wait();
            return Err(HarnessError::Timeout {
                what: format!("{} (stderr: {})", process::describe(cmd), process::log_tail(&err_path, 5)),
                seconds: timeout.as_secs(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Bounded {
        status: status.code().unwrap_or(-1),
        stdout: fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: fs::read_to_string(&err_path).unwrap_or_default(),
    })
}

/// One `ctr run --rm` through our runtime.
#[derive(Debug, Clone, Default)]
pub struct CtrRun {
    /// The image reference.
    pub image: String,
    /// `cdi.k8s.io/...` annotation value (CDI names, comma-separated); none when empty.
    pub devices: String,
    /// `--env` entries, `NAME=value`.
    pub env: Vec<String>,
    /// The command.
    pub command: Vec<String>,
}

/// Runs a container with `ctr run --rm --runtime io.containerd.nvinject.v2`, waiting at most
/// `timeout` (then `ctr` is killed and the run fails; the node's drop removes what is left).
pub fn ctr_run(node: &GpuNode, id: &str, run: &CtrRun, timeout: Duration) -> Result<Bounded> {
    let mut cmd = node.containerd.ctr();
    cmd.args(["run", "--rm", "--runtime", NVINJECT_RUNTIME]);
    if !run.devices.is_empty() {
        cmd.arg("--annotation").arg(format!("cdi.k8s.io/attack={}", run.devices));
    }
    for e in &run.env {
        cmd.arg("--env").arg(e);
    }
    cmd.arg(&run.image).arg(id).args(&run.command);
    run_bounded(&mut cmd, timeout, node.base(), &format!("ctr-run-{id}"))
}

/// Waits (bounded) until containerd has no shim or proxy left; returns what is still running.
pub fn shims_left(node: &GpuNode, timeout: Duration) -> Vec<process::ProcessInfo> {
    let gone = process::wait_for("shims and proxies to exit", timeout, || {
        node.containerd.shim_processes().is_empty().then_some(())
    });
    if gone.is_ok() { Vec::new() } else { node.containerd.shim_processes() }
}
