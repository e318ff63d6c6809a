//! `nvinject-hook update-application-profile` (and `inject --update-application-profile`), the real
//! static binary, on rootfs trees with real character devices (`mknod`, so it needs root): the
//! profile names the minors of the `/dev/nvidia<N>` devices; other nodes, files with GPU names and
//! an image's links towards host paths change nothing outside the rootfs.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nvinject_simnode::artifacts::static_hook;

const PROFILE: &str = "etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf";

mod common;

/// [`common::bundle`] with a `/dev` in the rootfs.
fn bundle(dir: &Path) -> (PathBuf, PathBuf) {
    let (rootfs, state) = common::bundle(dir);
    fs::create_dir(rootfs.join("dev")).unwrap();
    (rootfs, state)
}

fn mknod_char(path: &Path, major: u32, minor: u32) {
    let out =
        Command::new("mknod").arg(path).args(["c", &major.to_string(), &minor.to_string()]).output().unwrap();
    assert!(
        out.status.success(),
        "mknod {} (needs root): {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn run_hook(state: &Path, args: &[&str]) {
    let out = Command::new(static_hook()).args(args).stdin(fs::File::open(state).unwrap()).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn mask_text(mask: &str) -> String {
    format!(
        r#"{{"profiles":[{{"name":"_container_","settings":["EGLVisibleDGPUDevices",{mask}]}}],"rules":[{{"pattern":[],"profile":"_container_"}}]}}"#
    )
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

#[test]
#[ignore = "needs root"]
fn the_profile_names_the_minors_of_the_gpu_devices_the_container_has() {
    nvinject_test_support::require_root("mknod and mounts in a rootfs");
    for args in [&["update-application-profile"][..], &["inject", "--update-application-profile"]] {
        let dir = tempfile::tempdir().unwrap();
        let (rootfs, state) = bundle(dir.path());
        // GPUs by their device's minor (a node named nvidia1 with minor 5 is GPU 5); control
        // nodes, caps and a regular file with a GPU's name are not GPUs.
        mknod_char(&rootfs.join("dev/nvidia1"), 195, 5);
        mknod_char(&rootfs.join("dev/nvidia12"), 195, 12);
        mknod_char(&rootfs.join("dev/nvidiactl"), 195, 255);
        mknod_char(&rootfs.join("dev/nvidia-uvm"), 243, 0);
        fs::create_dir(rootfs.join("dev/nvidia-caps")).unwrap();
        fs::write(rootfs.join("dev/nvidia3"), "").unwrap();
        run_hook(&state, args);
        let profile = rootfs.join(PROFILE);
        assert_eq!(fs::read_to_string(&profile).unwrap(), mask_text("0x1020"), "{args:?}");
        assert_eq!(mode(&profile), 0o444);
        assert_eq!(mode(profile.parent().unwrap()), 0o555);
        assert_eq!(mode(&rootfs.join("etc/nvidia")), 0o555);

        // Run again (a restarted container): replaced whole, same text.
        run_hook(&state, args);
        assert_eq!(fs::read_to_string(&profile).unwrap(), mask_text("0x1020"));
    }
}

#[test]
#[ignore = "needs root"]
fn no_gpu_device_writes_nothing() {
    nvinject_test_support::require_root("mknod and mounts in a rootfs");
    let dir = tempfile::tempdir().unwrap();
    let (rootfs, state) = bundle(dir.path());
    mknod_char(&rootfs.join("dev/nvidiactl"), 195, 255);
    fs::write(rootfs.join("dev/nvidia0"), "").unwrap();
    run_hook(&state, &["update-application-profile"]);
    assert!(!rootfs.join("etc").exists(), "nothing made for a container without GPUs");
}

#[test]
#[ignore = "needs root"]
fn image_links_towards_host_paths_are_followed_inside_the_rootfs() {
    nvinject_test_support::require_root("mknod and mounts in a rootfs");
    let dir = tempfile::tempdir().unwrap();
    let (rootfs, state) = bundle(dir.path());
    mknod_char(&rootfs.join("dev/nvidia0"), 195, 0);
    // The image's /etc/nvidia points at a host directory by its absolute path, and a profile
    // already there is a link to a host file.
    let host_dir = dir.path().join("host-etc-nvidia");
    fs::create_dir(&host_dir).unwrap();
    let host_file = dir.path().join("host-file");
    fs::write(&host_file, "host's own\n").unwrap();
    fs::create_dir_all(rootfs.join("etc")).unwrap();
    std::os::unix::fs::symlink(&host_dir, rootfs.join("etc/nvidia")).unwrap();
    let inside = rootfs.join(host_dir.strip_prefix("/").unwrap());
    fs::create_dir_all(inside.join("nvidia-application-profiles-rc.d")).unwrap();
    std::os::unix::fs::symlink(&host_file, inside.join("nvidia-application-profiles-rc.d/10-container.conf"))
        .unwrap();

    run_hook(&state, &["inject", "--update-application-profile"]);

    // Written where the link leads inside the rootfs, the old link replaced by a file; the host's
    // directory and file are untouched.
    let written = inside.join("nvidia-application-profiles-rc.d/10-container.conf");
    assert!(fs::symlink_metadata(&written).unwrap().file_type().is_file());
    assert_eq!(fs::read_to_string(&written).unwrap(), mask_text("0x1"));
    assert_eq!(fs::read_dir(&host_dir).unwrap().count(), 0, "nothing in the host's directory");
    assert_eq!(fs::read_to_string(&host_file).unwrap(), "host's own\n");
}
