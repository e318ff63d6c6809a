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
use std::process::Command;
use std::time::Duration;

use nvinject_image_tool::image::{self, BuiltImage, ImageSpec};

use crate::error::{HarnessError, Result, io};
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
    Ok(image::pack(spec, &root, out)?)
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
    let run = process::run_with_deadline(cmd, scratch, what, timeout, || {})?;
    if run.timed_out {
        return Err(HarnessError::Timeout {
            what: format!("{} (stderr: {})", process::describe(cmd), process::log_tail(&run.stderr_path, 5)),
            seconds: timeout.as_secs(),
        });
    }
    Ok(Bounded { status: run.status.unwrap_or(-1), stdout: run.stdout, stderr: run.stderr })
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
