//! The hook has no dynamic loader: nothing in its environment, working directory or the file system
//! can make code run in it before (or after) `main()`.
//!
//! Checked on the binary that is installed and that the integration tests run
//! ([`nvinject_simnode::artifacts::static_hook`]), two ways: its ELF program headers (no
//! `PT_INTERP`, no `DT_NEEDED`), and an attack: a constructor library offered through
//! `LD_PRELOAD` (relative to the image-controlled cwd, and absolute), `LD_LIBRARY_PATH` and an
//! `LD_AUDIT` library, which must never run, while the same libraries do run in `/bin/true` (so the
//! attack is real and the test can fail).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nvinject_simnode::artifacts::static_hook;

/// What the dynamic-linking parts of an ELF64 little-endian file say.
#[derive(Debug, Default)]
struct Linking {
    /// A `PT_INTERP` program header (the file asks the kernel for a dynamic loader).
    interp: Option<String>,
    /// The number of `DT_NEEDED` entries in its dynamic section (shared libraries it loads).
    needed: usize,
    /// Whether it has a `PT_DYNAMIC` segment at all (a static-pie has one, for self-relocation).
    dynamic: bool,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Reads the program headers of `path` (ELF64, little-endian, as on x86_64 and aarch64 Linux).
fn linking(path: &Path) -> Linking {
    const PT_DYNAMIC: u32 = 2;
    const PT_INTERP: u32 = 3;
    const DT_NULL: u64 = 0;
    const DT_NEEDED: u64 = 1;
    let b = fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    assert_eq!(&b[..4], b"\x7fELF", "{} is not an ELF file", path.display());
    assert_eq!((b[4], b[5]), (2, 1), "{}: expected ELF64 little-endian", path.display());
    let phoff = u64_at(&b, 0x20) as usize;
    let phentsize = u16_at(&b, 0x36) as usize;
    let phnum = u16_at(&b, 0x38) as usize;
    assert!(phnum > 0 && phentsize >= 56, "{}: no program headers", path.display());
    let mut out = Linking::default();
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        let (p_type, offset, filesz) =
            (u32_at(&b, ph), u64_at(&b, ph + 8) as usize, u64_at(&b, ph + 32) as usize);
        match p_type {
            PT_INTERP => {
                let raw = &b[offset..offset + filesz];
                let name = raw.split(|&c| c == 0).next().unwrap_or_default();
                out.interp = Some(String::from_utf8_lossy(name).into_owned());
            }
            PT_DYNAMIC => {
                out.dynamic = true;
                for entry in b[offset..offset + filesz].chunks_exact(16) {
                    match u64_at(entry, 0) {
                        DT_NULL => break,
                        DT_NEEDED => out.needed += 1,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    out
}

#[test]
fn the_hook_has_no_interpreter_and_needs_no_library() {
    let hook = static_hook();
    let l = linking(&hook);
    assert_eq!(l.interp, None, "{} asks for a dynamic loader", hook.display());
    assert_eq!(l.needed, 0, "{} needs shared libraries: {l:?}", hook.display());

    // The same reader sees both on a dynamic program, so the assertions above can fail.
    let l = linking(Path::new("/bin/true"));
    assert!(l.interp.as_deref().is_some_and(|i| i.contains("ld-linux")), "{l:?}");
    assert!(l.dynamic && l.needed >= 1, "{l:?}");
}

/// A test directory holding the attacker's libraries and a container bundle for the hook.
struct Attack {
    dir: tempfile::TempDir,
}

impl Attack {
    fn new() -> Attack {
        let dir = tempfile::tempdir().unwrap();
        let a = Attack { dir };
        let marker = a.marker();
        // A constructor that runs when the loader maps the library (LD_PRELOAD, LD_LIBRARY_PATH)...
        a.compile(
            "evil",
            "#include <fcntl.h>\n#include <unistd.h>\n\
             __attribute__((constructor)) static void evil(void) {\n\
               int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND, 0644);\n\
               if (fd >= 0) { write(fd, \"preload\\n\", 8); close(fd); }\n}\n",
            &marker,
        );
        // ... and an rtld-audit module, whose la_version the loader calls first (LD_AUDIT).
        a.compile(
            "audit",
            "#include <fcntl.h>\n#include <unistd.h>\n\
             unsigned int la_version(unsigned int v) {\n\
               int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND, 0644);\n\
               if (fd >= 0) { write(fd, \"audit\\n\", 6); close(fd); }\n  return v;\n}\n",
            &marker,
        );
        // Libraries static glibc itself could dlopen (NSS modules, the unwinder), found first through
        // LD_LIBRARY_PATH if anything in the hook reached NSS or glibc's own unwinding.
        for name in ["libnss_files.so.2", "libnss_dns.so.2", "libgcc_s.so.1"] {
            fs::copy(a.path().join("evil.so"), a.path().join(name)).unwrap();
        }
        let rootfs = a.path().join("bundle/rootfs");
        fs::create_dir_all(rootfs.join("usr/lib")).unwrap();
        fs::create_dir_all(rootfs.join("etc/ld.so.conf.d")).unwrap();
        fs::write(a.path().join("bundle/config.json"), br#"{"root":{"path":"rootfs"}}"#).unwrap();
        a
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn marker(&self) -> PathBuf {
        self.path().join("marker")
    }

    fn compile(&self, name: &str, source: &str, marker: &Path) {
        let c = self.path().join(format!("{name}.c"));
        fs::write(&c, source).unwrap();
        let out = Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(self.path().join(format!("{name}.so")))
            .arg(format!("-DMARKER=\"{}\"", marker.display()))
            .arg(&c)
            .output()
            .expect("gcc (the project's setup installs it)");
        assert!(out.status.success(), "gcc {name}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// `program` with the attacker's environment, run where runc runs a hook: in a directory the
    /// image controls (here the one holding the libraries).
    fn run(&self, program: &Path, args: &[&str], stdin: &[u8]) -> std::process::Output {
        use std::io::Write;
        let dir = self.path();
        let mut child = Command::new(program)
            .args(args)
            .current_dir(dir)
            .env("LD_PRELOAD", format!("./evil.so {}", dir.join("evil.so").display()))
            .env("LD_LIBRARY_PATH", dir)
            .env("LD_AUDIT", dir.join("audit.so"))
            .env("LD_BIND_NOW", "1")
            .env("GCONV_PATH", dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        child.wait_with_output().unwrap()
    }

    fn marker_text(&self) -> Option<String> {
        fs::read_to_string(self.marker()).ok()
    }
}

#[test]
#[ignore = "needs root"]
fn loader_variables_and_libraries_in_the_cwd_never_run_in_the_hook() {
    nvinject_test_support::require_root("mknod and mounts in a rootfs");
    let attack = Attack::new();

    // The attack works on a dynamic program: both the preload constructor and the audit module run.
    attack.run(Path::new("/bin/true"), &[], b"");
    let seen =
        attack.marker_text().expect("the preload library must run in /bin/true, or this test proves nothing");
    assert!(seen.contains("preload") && seen.contains("audit"), "{seen:?}");
    fs::remove_file(attack.marker()).unwrap();

    // The hook, doing real work with the same environment and cwd: it works, and nothing ran.
    let hook = static_hook();
    let state = format!(
        r#"{{"ociVersion":"1.0.2","id":"c1","pid":1,"bundle":"{}"}}"#,
        attack.path().join("bundle").display()
    );
    let out = attack.run(
        &hook,
        &["create-symlinks", "--link", "libcuda.so.1::/usr/lib/libcuda.so"],
        state.as_bytes(),
    );
    assert!(out.status.success(), "hook failed: {}", String::from_utf8_lossy(&out.stderr));
    let link = attack.path().join("bundle/rootfs/usr/lib/libcuda.so");
    assert_eq!(fs::read_link(&link).unwrap(), Path::new("libcuda.so.1"), "the hook did its work");
    assert_eq!(attack.marker_text(), None, "code from the attacker's libraries ran in {}", hook.display());

    // update-ldcache also starts the host's ldconfig: the child gets none of it either.
    let out = attack.run(&hook, &["update-ldcache", "--folder", "/usr/lib"], state.as_bytes());
    assert!(out.status.success(), "hook failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(attack.path().join("bundle/rootfs/etc/ld.so.cache").exists(), "the hook did its work");
    assert_eq!(attack.marker_text(), None, "code from the attacker's libraries ran in update-ldcache");

    // A failing run (bad arguments) takes the same path through process start-up: still nothing.
    let out = attack.run(&hook, &["create-symlinks", "--link", "bad"], state.as_bytes());
    assert!(!out.status.success());
    assert_eq!(attack.marker_text(), None);
}

#[test]
fn a_dynamically_linked_build_refuses_to_run() {
    // What `cargo test` builds in target/<profile> is whatever the caller's flags make; normally
    // dynamic, and then it must refuse with the way to build it statically.
    let built = Path::new(env!("CARGO_BIN_EXE_nvinject-hook"));
    let out = Command::new(built).args(["create-symlinks"]).stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if linking(built).interp.is_some() {
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("refusing to run") && stderr.contains("crt-static"), "{stderr}");
    } else {
        assert!(!stderr.contains("refusing to run"), "a static build must run: {stderr}");
    }
    // The installed build is static and does not refuse (it fails here only on the empty stdin).
    let out = Command::new(static_hook()).args(["create-symlinks"]).stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("refusing to run") && stderr.contains("OCI state"), "{stderr}");
}
