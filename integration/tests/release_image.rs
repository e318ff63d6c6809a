//! nvinject's own image (`./x image`, [`nvinject_image_tool::release_image`]) on real parts:
//! built twice from the same binaries (under different umasks) it has the same digest, a private containerd imports it, every
//! binary runs inside it under runc (the hook as the static build), and the manifests its own
//! installer renders name exactly this image. Needs root (CI runs as root).

use std::path::Path;

use nvinject_image_tool::release_image::{self, BIN_DIR, BINARIES, ReleaseInputs};
use nvinject_node_harness::artifacts;
use nvinject_node_harness::containerd::{Containerd, ContainerdOptions};
use nvinject_node_harness::process;
use nvinject_simnode::artifacts::{artifact, static_hook};

fn inputs() -> ReleaseInputs {
    let bin_dir = artifacts::this_build_bin_dir().unwrap_or_else(|e| panic!("{e}"));
    let installer = bin_dir.join("nvinject-installer");
    let name = release_image::manifests_image(&installer).unwrap_or_else(|e| panic!("{e}"));
    ReleaseInputs { name, bin_dir, hook: static_hook() }
}

/// `ctr run --rm` of `args` in the image with runc's runtime: (exit code, stdout, stderr).
fn run_in(containerd: &Containerd, image: &str, id: &str, args: &[&str]) -> (i32, String, String) {
    let out = process::output(
        containerd.ctr().args(["run", "--rm", "--runtime", "io.containerd.runc.v2", image, id]).args(args),
    )
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
#[ignore = "needs root"]
fn the_image_is_reproducible_imports_and_runs_every_binary() {
    nvinject_test_support::require_root("containerd and runc");
    let inputs = inputs();
    let dir = tempfile::tempdir().unwrap();
    let first = release_image::build(&inputs, &dir.path().join("a.tar")).unwrap_or_else(|e| panic!("{e}"));
    // The second build under another umask: the builder's umask must not reach the image.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let second = release_image::build(&inputs, &dir.path().join("b.tar"));
    nix::sys::stat::umask(old);
    let second = second.unwrap_or_else(|e| panic!("{e}"));
    assert!(first.digest.starts_with("sha256:") && first.digest.len() == 71, "{}", first.digest);
    assert_eq!(first.digest, second.digest, "same inputs, same digest");
    assert!(
        std::fs::read(&first.image.tar).unwrap() == std::fs::read(&second.image.tar).unwrap(),
        "same inputs, byte-identical archives"
    );
    eprintln!("image {} {} {:.1} MiB", first.image.name, first.digest, first.size as f64 / 1048576.0);

    let containerd =
        Containerd::start(dir.path(), &ContainerdOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    containerd.import(&first.image).unwrap_or_else(|e| panic!("{e}"));
    let listed = process::output(containerd.ctr().args(["images", "ls"])).unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(
        listed.lines().any(|l| l.starts_with(&first.image.name) && l.contains(&first.digest)),
        "ctr images ls shows the image under its name and digest:\n{listed}"
    );

    for (i, name) in BINARIES.iter().enumerate() {
        let path = Path::new(BIN_DIR).join(name);
        // The shim speaks containerd's flag dialect (`-version`).
        let flag = if *name == "containerd-shim-nvinject-v2" { "-version" } else { "--version" };
        let (code, stdout, stderr) =
            run_in(&containerd, &first.image.name, &format!("v{i}"), &[path.to_str().unwrap(), flag]);
        assert_eq!(code, 0, "{name} {flag} in the image: stdout {stdout} stderr {stderr}");
        assert!(!stdout.trim().is_empty() || !stderr.trim().is_empty(), "{name} printed its version");
    }
    // The image's PATH finds the binaries, and its installer renders manifests naming this image.
    let (code, stdout, stderr) =
        run_in(&containerd, &first.image.name, "manifests", &["nvinject-installer", "manifests"]);
    assert_eq!(code, 0, "stderr {stderr}");
    let images: Vec<&str> = stdout.lines().filter_map(|l| l.trim().strip_prefix("image: ")).collect();
    assert!(!images.is_empty() && images.iter().all(|i| *i == first.image.name), "{images:?}");
    // What the installer's systemd restart runs through.
    let (code, _, stderr) = run_in(&containerd, &first.image.name, "chroot", &["chroot", "/", "true"]);
    assert_eq!(code, 0, "chroot in the image: {stderr}");
}

#[test]
fn a_dynamic_hook_is_refused_with_the_fix() {
    let mut inputs = inputs();
    // The workspace build's hook is the dynamic one that refuses to run.
    inputs.hook = artifact("nvinject-hook", "nvinject-hook");
    assert!(inputs.hook.is_file(), "{} exists", inputs.hook.display());
    let dir = tempfile::tempdir().unwrap();
    let err = release_image::build(&inputs, &dir.path().join("x.tar")).unwrap_err().to_string();
    assert!(err.contains("dynamically linked") && err.contains("./x build-hook --release"), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "nothing written or left: {left:?}");
}

#[test]
fn a_dynamic_shim_is_refused_with_the_fix() {
    let mut inputs = inputs();
    // The static hook with the workspace build's (dynamic) shim beside it.
    let beside = tempfile::tempdir().unwrap();
    inputs.hook = beside.path().join("nvinject-hook");
    std::fs::copy(static_hook(), &inputs.hook).unwrap();
    let dynamic = artifact("nvinject-shim", "containerd-shim-nvinject-v2");
    std::fs::copy(&dynamic, beside.path().join("containerd-shim-nvinject-v2")).unwrap();
    assert_eq!(
        inputs.source("containerd-shim-nvinject-v2"),
        beside.path().join("containerd-shim-nvinject-v2")
    );
    let dir = tempfile::tempdir().unwrap();
    let err = release_image::build(&inputs, &dir.path().join("x.tar")).unwrap_err().to_string();
    assert!(err.contains("containerd-shim-nvinject-v2 is dynamically linked"), "{err}");
    assert!(err.contains("static shim") && err.contains("./x build-hook --release"), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "nothing written or left: {left:?}");
}
