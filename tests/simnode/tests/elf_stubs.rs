//! The stub ELF writer against the real consumers: glibc's `ldconfig` and `dlopen`.
//! Needs root (`ldconfig -r` chroots) and python3 (ctypes is the child process that dlopens).

use std::path::Path;
use std::process::Command;

use nvinject_simnode::elf::{Machine, shared_object};

fn host() -> Machine {
    Machine::host().expect("tests run on x86_64 or aarch64")
}

fn write_root(root: &Path, libs: &[(&str, &str)]) -> std::path::PathBuf {
    let triple = host().multiarch_triple();
    let libdir = root.join("usr/lib").join(triple);
    std::fs::create_dir_all(&libdir).unwrap();
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(root.join("etc/ld.so.conf"), format!("/usr/lib/{triple}\n")).unwrap();
    for (file, soname) in libs {
        std::fs::write(libdir.join(file), shared_object(host(), soname)).unwrap();
    }
    libdir
}

#[test]
fn ldconfig_caches_stubs_under_their_soname() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_root(
        root,
        &[
            ("libcuda.so.550.54.15", "libcuda.so.1"),
            ("libnvidia-gpucomp.so.550.54.15", "libnvidia-gpucomp.so.550.54.15"),
        ],
    );
    let out = Command::new("ldconfig").arg("-r").arg(root).output().expect("run ldconfig");
    assert!(out.status.success(), "ldconfig -r failed: {}", String::from_utf8_lossy(&out.stderr));
    let cache = root.join("etc/ld.so.cache");
    let out = Command::new("ldconfig").arg("-p").arg("-C").arg(&cache).output().unwrap();
    let listing = String::from_utf8(out.stdout).unwrap();
    let triple = host().multiarch_triple();
    let label = host().ldconfig_label();
    for (soname, file) in [
        ("libcuda.so.1", "libcuda.so.1"),
        ("libnvidia-gpucomp.so.550.54.15", "libnvidia-gpucomp.so.550.54.15"),
    ] {
        let line = format!("\t{soname} ({label}) => /usr/lib/{triple}/{file}");
        assert!(listing.lines().any(|l| l == line), "missing `{line}` in:\n{listing}");
    }
    // ldconfig made the SONAME link, as it does for a real driver install.
    let link = std::fs::read_link(root.join("usr/lib").join(triple).join("libcuda.so.1")).unwrap();
    assert_eq!(link, Path::new("libcuda.so.550.54.15"));
}

#[test]
fn glibc_dlopens_a_stub_in_a_child_process() {
    let dir = tempfile::tempdir().unwrap();
    let libdir = write_root(dir.path(), &[("libnvidia-nvvm.so.4", "libnvidia-nvvm.so.4")]);
    let script = "import ctypes, sys\nlib = ctypes.CDLL(sys.argv[1])\nprint('loaded', lib._name)\n";
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(libdir.join("libnvidia-nvvm.so.4"))
        .output()
        .expect("python3 is needed for this test (apt-get install python3)");
    assert!(out.status.success(), "dlopen failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("loaded "));

    // A corrupted image must be refused, or the test above proves nothing.
    let mut bad = shared_object(host(), "libbroken.so.1");
    bad[18] ^= 0xff; // e_machine
    std::fs::write(libdir.join("libbroken.so.1"), bad).unwrap();
    let out =
        Command::new("python3").args(["-c", script]).arg(libdir.join("libbroken.so.1")).output().unwrap();
    assert!(!out.status.success(), "glibc loaded an image for another machine");
}
