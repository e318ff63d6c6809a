//! Install and uninstall on a temporary host root, through the library with a fake containerd
//! service (it records restarts) and a fixed CDI spec: idempotence, uninstall round trips for every
//! fixture, edits made by others, restart only on change, the shim link, /dev/char links and the
//! host lock.

mod common;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Case, FakeContainerd, fixture_dirs, write_binaries};
use nvinject_installer::Error;
use nvinject_installer::containerd::{ContainerdVersion, RuntimeMode};
use nvinject_installer::fsx::FaultHook;
use nvinject_installer::install::{Installer, Settings, SpecGenerator, SpecRequest};
use nvinject_installer::lock::HostLock;
use nvinject_installer::paths::HostRoot;
use nvinject_installer::runtime_config::ShimConfig;
use nvinject_installer::service::Restarted;

struct FixedSpec(RefCell<Vec<u8>>);

impl SpecGenerator for FixedSpec {
    fn generate(&self, request: &SpecRequest) -> nvinject_installer::Result<Vec<u8>> {
        assert_eq!(request.hook_path, "/usr/local/nvinject/bin/nvinject-hook");
        Ok(self.0.borrow().clone())
    }
}

/// The installer's edges in a test: a fake containerd, a fixed CDI spec (`{}` unless set), and
/// no fault points.
struct Edges {
    containerd: FakeContainerd,
    spec: FixedSpec,
    hook: FaultHook,
}

impl Edges {
    fn new(containerd: &str) -> Edges {
        Edges {
            containerd: FakeContainerd::new(containerd),
            spec: FixedSpec(RefCell::new(b"{}\n".to_vec())),
            hook: FaultHook::none(),
        }
    }

    fn installer(&self, settings: Settings) -> Installer<'_> {
        Installer {
            settings,
            containerd: &self.containerd,
            spec: Some(&self.spec),
            runtime_config: &ShimConfig,
            hook: &self.hook,
        }
    }
}

/// A temporary host: `host/` is the host root, `src/` the installer image's binaries.
struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new(containerd_config: Option<&str>, conf_d: bool) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("host");
        fs::create_dir_all(host.join("etc/containerd")).unwrap();
        fs::create_dir_all(host.join("run")).unwrap();
        fs::create_dir_all(host.join("usr/local/bin")).unwrap();
        fs::create_dir_all(host.join("var/lib")).unwrap();
        if conf_d {
            fs::create_dir_all(host.join("etc/containerd/conf.d")).unwrap();
        }
        if let Some(text) = containerd_config {
            fs::write(host.join("etc/containerd/config.toml"), text).unwrap();
        }
        let src = dir.path().join("src");
        fs::create_dir_all(&src).unwrap();
        write_binaries(&src, |name| format!("#!/bin/sh\n# {name}\n").into_bytes());
        Host { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("host")
    }

    fn settings(&self) -> Settings {
        let mut s = Settings::defaults(HostRoot::new(self.root()), self.dir.path().join("src"));
        s.lock_wait = Duration::from_millis(300);
        s
    }

    fn read(&self, host_path: &str) -> String {
        fs::read_to_string(self.root().join(host_path.trim_start_matches('/'))).unwrap()
    }
}

/// Every path under `root` with its content (files), target (links) or kind, except the lock
/// file, which stays on purpose (see `lock.rs`).
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let meta = fs::symlink_metadata(&path).unwrap();
            if rel == "run/nvinject-installer.lock" {
                continue;
            }
            if meta.file_type().is_symlink() {
                out.insert(rel, format!("-> {}", fs::read_link(&path).unwrap().display()));
            } else if meta.is_dir() {
                out.insert(rel.clone(), "dir".into());
                walk(root, &path, out);
            } else if meta.is_file() {
                use std::os::unix::fs::PermissionsExt;
                let mode = meta.permissions().mode() & 0o7777;
                out.insert(rel, format!("{mode:o} {}", String::from_utf8_lossy(&fs::read(&path).unwrap())));
            } else {
                out.insert(rel, format!("special {:?}", meta.file_type()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

const DEBIAN_CONFIG: &str = "version = 2\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    \
                             [plugins.\"io.containerd.grpc.v1.cri\".cni]\n      bin_dir = \"/usr/lib/cni\"\n";

#[test]
fn a_second_install_writes_nothing_and_restarts_nothing() {
    let host = Host::new(Some(DEBIAN_CONFIG), true);
    let edges = Edges::new("1.7.20");
    *edges.spec.0.borrow_mut() = b"{\"cdiVersion\":\"0.6.0\"}\n".to_vec();
    let first = edges.installer(host.settings()).install().unwrap();
    assert_eq!(first.restart, Some(Restarted::Yes));
    assert_eq!(first.mode, RuntimeMode::RuntimePath);
    assert!(
        first.written.contains(&"/etc/containerd/conf.d/99-nvinject.toml".to_owned()),
        "{:?}",
        first.written
    );
    assert!(first.written.contains(&"/var/run/cdi/nvidia.com-gpu.json".to_owned()));
    let after_first = snapshot(&host.root());

    let second = edges.installer(host.settings()).install().unwrap();
    assert!(second.written.is_empty(), "second install wrote {:?}", second.written);
    assert_eq!(second.restart, None);
    assert_eq!(edges.containerd.restarts.get(), 1, "containerd restarted although nothing changed");
    assert_eq!(snapshot(&host.root()), after_first);
}

#[test]
fn only_a_containerd_change_restarts_containerd() {
    let host = Host::new(Some(DEBIAN_CONFIG), true);
    let edges = Edges::new("2.1.4");
    *edges.spec.0.borrow_mut() = b"spec v1\n".to_vec();
    edges.installer(host.settings()).install().unwrap();
    assert_eq!(edges.containerd.restarts.get(), 1);

    // A new driver: the spec changes, containerd's config does not.
    *edges.spec.0.borrow_mut() = b"spec v2\n".to_vec();
    let report = edges.installer(host.settings()).install().unwrap();
    assert_eq!(report.written, vec!["/var/run/cdi/nvidia.com-gpu.json".to_owned()]);
    assert_eq!(edges.containerd.restarts.get(), 1);

    // --set-as-default changes the drop-in: restart.
    let mut settings = host.settings();
    settings.set_as_default = true;
    let report = edges.installer(settings).install().unwrap();
    assert_eq!(report.written, vec!["/etc/containerd/conf.d/99-nvinject.toml".to_owned()]);
    assert_eq!(edges.containerd.restarts.get(), 2);
    assert!(
        host.read("/etc/containerd/conf.d/99-nvinject.toml").contains("default_runtime_name = \"nvidia\"")
    );
}

/// Every fixture, installed for real on a temp host: the files written are the fixture's expected
/// files, and uninstall brings the whole host tree back exactly (directories the install created,
/// like a missing `conf.d`, included).
#[test]
fn every_fixture_installs_its_expected_files_and_uninstalls_to_the_same_tree() {
    let mut checked = 0;
    for dir in fixture_dirs() {
        let case = Case::read(&dir);
        let before = fs::read_to_string(dir.join("before.toml")).ok();
        let host = Host::new(before.as_deref(), case.drop_in_dir_exists);
        for i in &case.imported {
            let path = host.root().join(i.path.trim_start_matches('/'));
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::copy(dir.join(&i.file), path).unwrap();
        }
        let mut settings = host.settings();
        settings.set_as_default = case.set_as_default;
        let drop_in = case.drop_in_path.as_str();
        settings.drop_in_dir = Path::new(drop_in).parent().unwrap().to_string_lossy().into_owned();
        let edges = Edges::new(&case.containerd);
        let original = snapshot(&host.root());

        let result = edges.installer(settings.clone()).install();
        if let Some(expected) = &case.error {
            let err = result.err().unwrap_or_else(|| panic!("{}: installed", dir.display()));
            assert!(err.to_string().contains(expected.as_str()), "{}: {err}", dir.display());
            assert_eq!(
                snapshot(&host.root()),
                original,
                "{}: a failed install changed the host",
                dir.display()
            );
            continue;
        }
        result.unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        assert_eq!(
            host.read(drop_in),
            fs::read_to_string(dir.join("after-dropin.toml")).unwrap(),
            "{}",
            dir.display()
        );
        assert_eq!(
            host.read("/etc/containerd/config.toml"),
            fs::read_to_string(dir.join("after-main.toml")).unwrap(),
            "{}",
            dir.display()
        );
        let uninstall = edges.installer(settings).uninstall().unwrap();
        assert_eq!(uninstall.restart, Some(Restarted::Yes), "{}", dir.display());
        assert_eq!(snapshot(&host.root()), original, "{}: uninstall did not restore the host", dir.display());
        assert_eq!(edges.containerd.restarts.get(), 2, "{}", dir.display());
        checked += 1;
    }
    assert!(checked >= 12, "only {checked} fixtures installed");
}

#[test]
fn uninstall_keeps_an_operators_later_edit_and_removes_only_our_import() {
    let host = Host::new(Some(DEBIAN_CONFIG), true);
    let edges = Edges::new("1.6.20");
    edges.installer(host.settings()).install().unwrap();
    let main = host.root().join("etc/containerd/config.toml");
    let edited = fs::read_to_string(&main).unwrap()
        + "\n# tuned by the operator\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n";
    fs::write(&main, &edited).unwrap();
    let config = host.root().join("etc/nvinject/config.toml");
    fs::write(&config, "[requests]\naccept-env-unprivileged = true\n").unwrap();

    let report = edges.installer(host.settings()).uninstall().unwrap();
    let now = fs::read_to_string(&main).unwrap();
    assert!(!now.contains("99-nvinject.toml"), "{now}");
    assert!(now.contains("# tuned by the operator") && now.contains("certs.d"), "{now}");
    assert_eq!(now, edited.replace("imports = [\"/etc/containerd/conf.d/99-nvinject.toml\"]\n", ""));
    assert_eq!(fs::read_to_string(&config).unwrap(), "[requests]\naccept-env-unprivileged = true\n");
    assert!(report.kept.iter().any(|(p, _)| p == "/etc/nvinject/config.toml"), "{:?}", report.kept);
    assert!(!host.root().join("etc/containerd/conf.d/99-nvinject.toml").exists());
    assert!(!host.root().join("usr/local/nvinject").exists());
}

#[test]
fn old_containerd_gets_the_shim_on_its_path_and_uninstall_removes_the_link() {
    let host = Host::new(Some(DEBIAN_CONFIG), true);
    let edges = Edges::new("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3");
    let report = edges.installer(host.settings()).install().unwrap();
    assert_eq!(report.mode, RuntimeMode::ShimType);
    let link = host.root().join("usr/local/bin/containerd-shim-nvinject-v2");
    assert_eq!(
        fs::read_link(&link).unwrap(),
        Path::new("/usr/local/nvinject/bin/containerd-shim-nvinject-v2")
    );
    edges.installer(host.settings()).uninstall().unwrap();
    assert!(fs::symlink_metadata(&link).is_err());

    // Someone else's file in the way is an error that names it, and nothing is half-installed.
    fs::write(&link, "other").unwrap();
    let before = snapshot(&host.root());
    let err = edges.installer(host.settings()).install().unwrap_err();
    assert!(err.to_string().contains("containerd-shim-nvinject-v2"), "{err}");
    assert_eq!(snapshot(&host.root()), before);
}

#[test]
fn a_bad_config_fails_before_anything_is_written() {
    let host = Host::new(Some("version = 2\n[plugins\n"), true);
    let edges = Edges::new("1.7.20");
    let before = snapshot(&host.root());
    let err = edges.installer(host.settings()).install().unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("/etc/containerd/config.toml") && message.contains("not valid TOML"),
        "{message}"
    );
    assert_eq!(snapshot(&host.root()), before);
    assert_eq!(edges.containerd.restarts.get(), 0);
}

#[test]
fn a_missing_required_binary_is_named() {
    let host = Host::new(Some(DEBIAN_CONFIG), true);
    fs::remove_file(host.dir.path().join("src/nvinject-hook")).unwrap();
    let edges = Edges::new("1.7.20");
    let err = edges.installer(host.settings()).install().unwrap_err();
    assert!(matches!(err, Error::MissingBinary { .. }), "{err}");
    assert!(err.to_string().contains("nvinject-hook"));
}

/// The shim runs `nvinject-cdi` (beside itself) to regenerate a stale spec: a node without it
/// could not heal after a driver upgrade, so the install refuses.
#[test]
fn a_missing_generator_is_named() {
    let host = Host::new(Some(DEBIAN_CONFIG), true);
    fs::remove_file(host.dir.path().join("src/nvinject-cdi")).unwrap();
    let edges = Edges::new("1.7.20");
    let err = edges.installer(host.settings()).install().unwrap_err();
    assert!(matches!(err, Error::MissingBinary { .. }), "{err}");
    assert!(err.to_string().contains("nvinject-cdi"));
}

#[test]
fn another_installer_holding_the_lock_is_named() {
    let host = Host::new(Some(DEBIAN_CONFIG), true);
    let _held =
        HostLock::acquire(&HostRoot::new(host.root()), "/run/nvinject-installer.lock", Duration::ZERO)
            .unwrap();
    let edges = Edges::new("1.7.20");
    let err = edges.installer(host.settings()).install().unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    assert!(err.to_string().contains(&format!("pid {}", std::process::id())), "{err}");
    assert!(!host.root().join("etc/containerd/conf.d/99-nvinject.toml").exists());
}

#[test]
fn changing_the_drop_in_dir_moves_the_drop_in() {
    let host = Host::new(Some(DEBIAN_CONFIG), true);
    let edges = Edges::new("1.7.20");
    let original = snapshot(&host.root());
    edges.installer(host.settings()).install().unwrap();
    let mut moved = host.settings();
    moved.drop_in_dir = "/etc/containerd/nvinject.d".into();
    edges.installer(moved.clone()).install().unwrap();
    assert!(!host.root().join("etc/containerd/conf.d/99-nvinject.toml").exists());
    assert!(host.root().join("etc/containerd/nvinject.d/99-nvinject.toml").exists());
    let main = host.read("/etc/containerd/config.toml");
    assert!(
        main.contains("nvinject.d/99-nvinject.toml") && !main.contains("conf.d/99-nvinject.toml"),
        "{main}"
    );
    edges.installer(moved).uninstall().unwrap();
    assert_eq!(snapshot(&host.root()), original);
}

#[test]
fn a_linked_main_config_stays_a_link_and_its_target_is_edited_and_restored() {
    let host = Host::new(None, true);
    // A config-managed host: the main file is a link into the tool's own tree.
    fs::create_dir_all(host.root().join("srv/managed")).unwrap();
    fs::write(host.root().join("srv/managed/containerd.toml"), DEBIAN_CONFIG).unwrap();
    let link = host.root().join("etc/containerd/config.toml");
    std::os::unix::fs::symlink("/srv/managed/containerd.toml", &link).unwrap();
    let original = snapshot(&host.root());
    let edges = Edges::new("1.7.20");

    let report = edges.installer(host.settings()).install().unwrap();
    assert!(report.written.contains(&"/srv/managed/containerd.toml".to_owned()), "{:?}", report.written);
    assert_eq!(
        fs::read_link(&link).unwrap(),
        Path::new("/srv/managed/containerd.toml"),
        "the link was replaced"
    );
    assert!(host.read("/srv/managed/containerd.toml").contains("/etc/containerd/conf.d/99-nvinject.toml"));
    let again = edges.installer(host.settings()).install().unwrap();
    assert!(again.written.is_empty(), "{:?}", again.written);

    edges.installer(host.settings()).uninstall().unwrap();
    assert_eq!(snapshot(&host.root()), original);
}

#[test]
fn the_drop_in_is_no_more_readable_than_the_main_config() {
    use std::os::unix::fs::PermissionsExt;
    // containerd 1.x: the drop-in repeats the CRI section, registry credentials included.
    let config = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry.configs.\"registry.example\".auth]\n  \
                  username = \"ci\"\n  password = \"s3cret\"\n";
    let host = Host::new(Some(config), true);
    let main = host.root().join("etc/containerd/config.toml");
    fs::set_permissions(&main, fs::Permissions::from_mode(0o600)).unwrap();
    let edges = Edges::new("1.7.20");
    edges.installer(host.settings()).install().unwrap();
    let drop_in = host.root().join("etc/containerd/conf.d/99-nvinject.toml");
    assert!(fs::read_to_string(&drop_in).unwrap().contains("s3cret"), "the CRI section is repeated");
    assert_eq!(fs::metadata(&drop_in).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(fs::metadata(&main).unwrap().permissions().mode() & 0o777, 0o600);

    // Without a main file (or a readable one) the drop-in is 0644 like containerd's own config.
    let host = Host::new(None, true);
    edges.installer(host.settings()).install().unwrap();
    let drop_in = host.root().join("etc/containerd/conf.d/99-nvinject.toml");
    assert_eq!(fs::metadata(&drop_in).unwrap().permissions().mode() & 0o777, 0o644);
}

#[test]
fn sources_say_which_imported_files_containerd_loads_after_the_drop_in() {
    use nvinject_installer::containerd_files::read_sources;
    let host = Host::new(
        Some("version = 2\nimports = [\"/etc/containerd/a.toml\", \"/etc/containerd/conf.d/*.toml\"]\n"),
        true,
    );
    let put = |rel: &str, text: &str| fs::write(host.root().join(rel), text).unwrap();
    put("etc/containerd/a.toml", "version = 2\nimports = [\"/etc/containerd/nested.toml\"]\n");
    put("etc/containerd/nested.toml", "version = 2\n");
    put("etc/containerd/conf.d/10-early.toml", "version = 2\n");
    put("etc/containerd/conf.d/zz-late.toml", "version = 2\n");
    let v1 = ContainerdVersion::new(1, 6, 20);
    let root = HostRoot::new(host.root());
    let names = |s: &nvinject_installer::containerd::ConfigSources| -> Vec<String> {
        s.imported.iter().map(|f| f.path.rsplit('/').next().unwrap().to_owned()).collect()
    };
    // The glob places the (not yet written) drop-in between its matches; breadth first, as
    // containerd loads, `nested.toml` comes after everything the main file names.
    let drop_in = "/etc/containerd/conf.d/99-nvinject.toml";
    let s = read_sources(&root, "/etc/containerd/config.toml", drop_in, &v1).unwrap();
    assert_eq!(names(&s), ["a.toml", "10-early.toml", "zz-late.toml", "nested.toml"]);
    assert_eq!(s.imported_before_drop_in, 2);
    // Elsewhere, the drop-in is appended to the main file's imports: loaded after its direct
    // imports, before what they import.
    let s = read_sources(&root, "/etc/containerd/config.toml", "/etc/nvinject.toml", &v1).unwrap();
    assert_eq!(s.imported_before_drop_in, 3);
}

/// Needs root (mknod), as CI runs.
#[test]
#[ignore = "needs root"]
fn dev_char_links_point_at_the_nvidia_nodes_and_go_on_uninstall() {
    nvinject_test_support::require_root("mknod for the simulated node");
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    use std::os::unix::fs::FileTypeExt;
    let host = Host::new(Some(DEBIAN_CONFIG), true);
    let dev = host.root().join("dev");
    fs::create_dir_all(dev.join("nvidia-caps")).unwrap();
    for (name, major, minor) in
        [("nvidia0", 195, 0), ("nvidiactl", 195, 255), ("nvidia-caps/nvidia-cap1", 237, 1)]
    {
        mknod(&dev.join(name), SFlag::S_IFCHR, Mode::from_bits_truncate(0o666), makedev(major, minor))
            .unwrap();
    }
    fs::create_dir_all(dev.join("char")).unwrap();
    std::os::unix::fs::symlink("../nvidiactl", dev.join("char/195:255")).unwrap();
    let original = snapshot(&host.root());
    let edges = Edges::new("1.7.20");
    let report = edges.installer(host.settings()).install().unwrap();
    assert_eq!(fs::read_link(dev.join("char/195:0")).unwrap(), Path::new("../nvidia0"));
    assert_eq!(fs::read_link(dev.join("char/237:1")).unwrap(), Path::new("../nvidia-caps/nvidia-cap1"));
    assert!(fs::metadata(dev.join("char/195:0")).unwrap().file_type().is_char_device());
    assert!(!report.written.contains(&"/dev/char/195:255".to_owned()), "the existing link is not ours");
    edges.installer(host.settings()).uninstall().unwrap();
    assert_eq!(snapshot(&host.root()), original, "only our links go; the one udev made stays");
}

#[test]
fn a_dangling_or_non_regular_conf_d_entry_fails_before_anything_is_written() {
    let host =
        Host::new(Some(&format!("imports = [\"/etc/containerd/conf.d/*.toml\"]\n{DEBIAN_CONFIG}")), true);
    let edges = Edges::new("1.7.20");
    let conf_d = host.root().join("etc/containerd/conf.d");
    std::os::unix::fs::symlink("/nowhere.toml", conf_d.join("10-gone.toml")).unwrap();
    let before = snapshot(&host.root());
    let err = edges.installer(host.settings()).install().unwrap_err();
    assert!(matches!(err, Error::Source { .. }), "{err}");
    assert!(err.to_string().contains("10-gone.toml"), "{err}");
    assert_eq!(snapshot(&host.root()), before, "the host root changed");
    fs::remove_file(conf_d.join("10-gone.toml")).unwrap();
    nix::unistd::mkfifo(&conf_d.join("20-fifo.toml"), nix::sys::stat::Mode::from_bits_truncate(0o644))
        .unwrap();
    let before = snapshot(&host.root());
    let err = edges.installer(host.settings()).install().unwrap_err();
    assert!(err.to_string().contains("a FIFO"), "{err}");
    assert_eq!(snapshot(&host.root()), before, "the host root changed");
    assert_eq!(edges.containerd.restarts.get(), 0);
}

#[test]
fn a_state_dir_link_is_refused() {
    let host = Host::new(Some(DEBIAN_CONFIG), true);
    let edges = Edges::new("1.7.20");
    fs::create_dir_all(host.root().join("var/lib/nvinject")).unwrap();
    std::os::unix::fs::symlink("/etc", host.root().join("var/lib/nvinject/installer")).unwrap();
    let before = snapshot(&host.root());
    let err = edges.installer(host.settings()).install().unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert_eq!(snapshot(&host.root()), before);
}
