//! `Root::bind_mount` against the real kernel (needs root, as CI runs): each test runs in a thread
//! of its own that first unshares its mount namespace and makes every mount in it a slave, so
//! nothing it mounts is seen outside that thread and everything goes when the thread ends. Both
//! kernel interfaces are exercised; every escape attempt is shown to land inside the root or be
//! refused, with the host directory it aimed at checked untouched.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;
use nvinject_fsio::mount::{BindOptions, MountApi};
use nvinject_fsio::root::{ParentDirs, Root};

/// What CDI specs ask for a driver file: `ro, nosuid, nodev, rbind, rprivate`.
fn driver_file() -> BindOptions {
    BindOptions::from_oci_options(&["ro", "nosuid", "nodev", "rbind", "rprivate"]).unwrap().unwrap()
}

/// Runs `body` in a thread with a private mount namespace.
fn in_private_mount_ns(body: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect("unshare(CLONE_NEWNS)");
        nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_SLAVE, None::<&str>)
            .expect("make / rslave");
        body();
    })
    .join()
    .expect("test thread");
}

/// This thread's mounts (not the process's: the namespace was unshared by this thread only).
fn mountinfo_line(mountpoint: &Path) -> Option<String> {
    let text = fs::read_to_string("/proc/thread-self/mountinfo").unwrap();
    let want = mountpoint.display().to_string();
    text.lines().find(|l| l.split(' ').nth(4) == Some(want.as_str())).map(str::to_owned)
}

struct Layout {
    _dir: tempfile::TempDir,
    root: PathBuf,
    host: PathBuf,
    source: PathBuf,
}

/// A root, a host directory next to it (what an escape would aim at) and a source file.
fn layout() -> Layout {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("rootfs");
    let host = dir.path().join("host");
    fs::create_dir_all(root.join("etc")).unwrap();
    fs::create_dir_all(&host).unwrap();
    let source = dir.path().join("libcuda.so.550.54.15");
    fs::write(&source, b"driver bytes").unwrap();
    Layout { _dir: dir, root, host, source }
}

fn unmount(path: &Path) {
    nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH).unwrap();
}

#[test]
#[ignore = "needs root"]
fn a_driver_file_is_mounted_read_only_and_private_with_either_api() {
    nvinject_test_support::require_root("mount");
    in_private_mount_ns(|| {
        for api in [MountApi::Auto, MountApi::Classic] {
            let l = layout();
            let root = Root::open(&l.root).unwrap();
            let dest = Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15");
            let used = root.bind_mount(&l.source, dest, &driver_file(), api).unwrap();
            if api == MountApi::Classic {
                assert_eq!(used, MountApi::Classic);
            }
            let host_path = l.root.join("usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15");
            assert_eq!(fs::read(&host_path).unwrap(), b"driver bytes", "{api:?}");
            let line = mountinfo_line(&host_path).unwrap_or_else(|| panic!("{api:?}: not mounted"));
            let mount_options = line.split(' ').nth(5).unwrap();
            for flag in ["ro", "nosuid", "nodev"] {
                assert!(mount_options.split(',').any(|o| o == flag), "{api:?}: {flag} missing in {line}");
            }
            // Optional fields (peer groups) sit between field 6 and the " - " separator: private
            // means none of shared:/master:.
            let optional = line.split(" - ").next().unwrap();
            assert!(!optional.contains("shared:"), "{api:?}: not private: {line}");
            let write = fs::OpenOptions::new().write(true).open(&host_path).unwrap_err();
            assert_eq!(write.raw_os_error(), Some(nix::libc::EROFS), "{api:?}");
            // The parents were made 0755 whatever the umask.
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(l.root.join("usr/lib")).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode, 0o755);
            unmount(&host_path);
        }
    });
}

#[test]
#[ignore = "needs root"]
fn a_directory_source_gets_a_directory_mountpoint() {
    nvinject_test_support::require_root("mount");
    in_private_mount_ns(|| {
        let l = layout();
        let src_dir = l.host.join("firmware");
        fs::create_dir_all(&src_dir).unwrap();
        fs::write(src_dir.join("gsp.bin"), b"fw").unwrap();
        let root = Root::open(&l.root).unwrap();
        root.bind_mount(&src_dir, Path::new("/lib/firmware/nvidia/550"), &driver_file(), MountApi::Auto)
            .unwrap();
        let mounted = l.root.join("lib/firmware/nvidia/550");
        assert_eq!(fs::read(mounted.join("gsp.bin")).unwrap(), b"fw");
        unmount(&mounted);
    });
}

#[test]
#[ignore = "needs root"]
fn image_symlinks_keep_the_mount_inside_the_root() {
    nvinject_test_support::require_root("mount");
    in_private_mount_ns(|| {
        for (name, target) in [("absolute", None), ("relative", Some("../../../../../../../../../.."))] {
            let l = layout();
            fs::create_dir_all(l.root.join("usr/lib")).unwrap();
            // usr/lib/x86_64-linux-gnu -> <host dir>, written the way the image would.
            let link_target = match target {
                None => l.host.clone(),
                Some(ups) => PathBuf::from(format!("{ups}{}", l.host.display())),
            };
            symlink(&link_target, l.root.join("usr/lib/x86_64-linux-gnu")).unwrap();
            // Where the link leads when followed inside the root: missing, so made there (as runc
            // makes mountpoints).
            let inside_dir = l.root.join(l.host.strip_prefix("/").unwrap());
            let root = Root::open(&l.root).unwrap();
            root.bind_mount(
                &l.source,
                Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
                &driver_file(),
                MountApi::Auto,
            )
            .unwrap();
            assert_eq!(fs::read_dir(&l.host).unwrap().count(), 0, "{name}: a file appeared in the host dir");
            assert!(mountinfo_line(&l.host.join("libcuda.so.1")).is_none(), "{name}: mounted on the host");
            // Followed inside the root instead: <root>/<host path>/libcuda.so.1.
            let inside = inside_dir.join("libcuda.so.1");
            assert_eq!(fs::read(&inside).unwrap(), b"driver bytes", "{name}");
            unmount(&inside);
        }
    });
}

#[test]
#[ignore = "needs root"]
fn a_proc_magic_link_a_procfs_target_and_a_link_loop_are_refused_and_a_dangling_link_stays_inside() {
    nvinject_test_support::require_root("mount");
    in_private_mount_ns(|| {
        let l = layout();
        let proc_dir = l.root.join("proc");
        fs::create_dir_all(&proc_dir).unwrap();
        // The container's own procfs, as runc has mounted it by the time createContainer hooks run.
        nix::mount::mount(Some("proc"), &proc_dir, Some("proc"), MsFlags::empty(), None::<&str>).unwrap();
        fs::create_dir_all(l.root.join("usr/lib")).unwrap();
        fs::create_dir_all(l.root.join("usr/share")).unwrap();
        let via_proc_root = format!("/proc/1/root{}", l.host.display());
        symlink(&via_proc_root, l.root.join("usr/lib/x86_64-linux-gnu")).unwrap();
        symlink("/proc/sys/kernel", l.root.join("usr/share/nvidia")).unwrap();
        symlink("/nowhere/at/all", l.root.join("usr/lib/dangling.so")).unwrap();
        symlink("/usr/lib/loop2.so", l.root.join("usr/lib/loop1.so")).unwrap();
        symlink("/usr/lib/loop1.so", l.root.join("usr/lib/loop2.so")).unwrap();
        let root = Root::open(&l.root).unwrap();
        let bind = |dest: &str| root.bind_mount(&l.source, Path::new(dest), &driver_file(), MountApi::Auto);

        let err = bind("/usr/lib/x86_64-linux-gnu/libcuda.so.1").unwrap_err().to_string();
        // ELOOP (RESOLVE_NO_MAGICLINKS, explained as a magic link) or, before that, EACCES from
        // procfs's own check on another namespace's /proc/1/root: refused either way.
        let refused = err.contains("magic link") || err.contains("Permission denied");
        assert!(err.contains("/usr/lib/x86_64-linux-gnu/libcuda.so.1") && refused, "{err}");
        assert_eq!(fs::read_dir(&l.host).unwrap().count(), 0);

        // An existing procfs file behind an image symlink: refused by file system type.
        let err = bind("/usr/share/nvidia/ostype").unwrap_err().to_string();
        assert!(err.contains("procfs"), "{err}");
        assert!(mountinfo_line(Path::new("/proc/sys/kernel/ostype")).is_none());
        // A new mountpoint in a procfs directory behind an image symlink: refused before any
        // attempt to make it there.
        let err = bind("/usr/share/nvidia/nvoptix.bin").unwrap_err().to_string();
        assert!(err.contains("procfs") && err.contains("refusing to mount there"), "{err}");

        // A dangling link at the mountpoint: its target is made inside the root and mounted on.
        bind("/usr/lib/dangling.so").unwrap();
        assert_eq!(fs::read(l.root.join("nowhere/at/all")).unwrap(), b"driver bytes");
        assert!(!Path::new("/nowhere").exists());
        unmount(&l.root.join("nowhere/at/all"));
        // A loop of links is refused, not followed forever.
        let err = bind("/usr/lib/loop1.so").unwrap_err().to_string();
        assert!(err.contains("/usr/lib/loop1.so"), "{err}");
        unmount(&proc_dir);
    });
}

#[test]
#[ignore = "needs root"]
fn a_mountpoint_of_the_wrong_type_or_a_fifo_never_blocks_or_mixes() {
    nvinject_test_support::require_root("mount");
    in_private_mount_ns(|| {
        let l = layout();
        fs::create_dir_all(l.root.join("usr/bin/nvidia-smi")).unwrap();
        let root = Root::open(&l.root).unwrap();
        let err = root
            .bind_mount(&l.source, Path::new("/usr/bin/nvidia-smi"), &driver_file(), MountApi::Auto)
            .unwrap_err()
            .to_string();
        assert!(err.contains("mountpoint in the image is one"), "{err}");
        // A FIFO the image put at the mountpoint is opened O_PATH (no reader needed) and covered.
        let fifo = l.root.join("etc/nvidia.icd");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        root.bind_mount(&l.source, Path::new("/etc/nvidia.icd"), &driver_file(), MountApi::Auto).unwrap();
        assert_eq!(fs::read(&fifo).unwrap(), b"driver bytes");
        unmount(&fifo);
    });
}

#[test]
#[ignore = "needs root"]
fn a_missing_source_names_itself() {
    nvinject_test_support::require_root("mount");
    in_private_mount_ns(|| {
        let l = layout();
        let root = Root::open(&l.root).unwrap();
        let missing = l.host.join("libnvidia-ml.so.1");
        let err = root
            .bind_mount(&missing, Path::new("/usr/lib/x.so"), &driver_file(), MountApi::Auto)
            .unwrap_err();
        assert!(err.to_string().contains(&missing.display().to_string()), "{err}");
        assert!(!l.root.join("usr/lib/x.so").exists(), "nothing is created for a source that is not there");
    });
}

#[test]
#[ignore = "needs root"]
fn a_batch_shares_mountpoint_directories_until_a_directory_mount_may_cover_them() {
    nvinject_test_support::require_root("mount");
    in_private_mount_ns(|| {
        let l = layout();
        fs::create_dir_all(l.root.join("opt/a")).unwrap();
        // A directory the batch mounts over /opt/a; it has its own `b`, so /opt/a/b resolves to
        // another directory once it is mounted.
        let over = l.host.join("over");
        fs::create_dir_all(over.join("b")).unwrap();
        let root = Root::open(&l.root).unwrap();
        let mut dirs = ParentDirs::default();
        let writable = BindOptions::from_oci_options(&["rbind", "rprivate"]).unwrap().unwrap();
        let bind = |dirs: &mut ParentDirs, source: &Path, dest: &str, options: &BindOptions| {
            root.bind_mount_in(dirs, source, Path::new(dest), options, MountApi::Auto).unwrap()
        };

        bind(&mut dirs, &l.source, "/opt/a/b/one.so", &driver_file());
        // Same directory, taken from the batch: lands next to the first.
        bind(&mut dirs, &l.source, "/opt/a/b/two.so", &driver_file());
        for name in ["one.so", "two.so"] {
            assert_eq!(fs::read(l.root.join("opt/a/b").join(name)).unwrap(), b"driver bytes", "{name}");
        }
        // A link of the same batch in that directory.
        root.symlink_in(&mut dirs, Path::new("one.so"), Path::new("/opt/a/b/one.so.1")).unwrap();
        assert_eq!(fs::read_link(l.root.join("opt/a/b/one.so.1")).unwrap(), Path::new("one.so"));

        // The directory mount covers /opt/a: the next mountpoint in /opt/a/b must be made in the
        // directory now seen there (the mounted one), not in the covered one the batch had open.
        bind(&mut dirs, &over, "/opt/a", &writable);
        bind(&mut dirs, &l.source, "/opt/a/b/three.so", &driver_file());
        assert_eq!(fs::read(l.root.join("opt/a/b/three.so")).unwrap(), b"driver bytes");
        assert!(over.join("b/three.so").exists(), "the mountpoint went into the covered directory");
        unmount(&l.root.join("opt/a/b/three.so"));
        unmount(&l.root.join("opt/a"));
        for name in ["one.so", "two.so"] {
            unmount(&l.root.join("opt/a/b").join(name));
        }
        // Uncovered: the second mountpoint is a hard link to the first (one inode for the batch's
        // files), the one made in the other mount a file of its own.
        use std::os::unix::fs::MetadataExt;
        let ino = |p: &Path| fs::metadata(p).unwrap().ino();
        let b = l.root.join("opt/a/b");
        assert_eq!(ino(&b.join("one.so")), ino(&b.join("two.so")));
        assert_eq!(fs::metadata(b.join("two.so")).unwrap().len(), 0);
        assert_ne!(ino(&over.join("b/three.so")), ino(&b.join("one.so")));
    });
}
