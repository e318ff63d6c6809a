//! `--accept-nvidia-visible-devices-as-volume-mounts`: an install writes the key into the runtime
//! config the shim reads (and the shim's own parser accepts the file), turning it off again
//! rewrites the file, and without the flag the key stays off (NVIDIA's secure default).

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{FakeContainerd, write_binaries};
use nvinject_installer::fsx::FaultHook;
use nvinject_installer::install::{Installer, Settings};
use nvinject_installer::paths::HostRoot;
use nvinject_installer::runtime_config::ShimConfig;
use nvinject_shim_config::Config;

fn host() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for d in ["host/etc/containerd/conf.d", "host/run", "host/usr/local/bin", "host/var/lib", "src"] {
        fs::create_dir_all(dir.path().join(d)).unwrap();
    }
    fs::write(dir.path().join("host/etc/containerd/config.toml"), "version = 2\n").unwrap();
    write_binaries(&dir.path().join("src"), |name| format!("#!/bin/sh\n# {name}\n").into_bytes());
    dir
}

fn install(dir: &Path, accept: bool) -> Config {
    let mut settings = Settings::defaults(HostRoot::new(dir.join("host")), dir.join("src"));
    settings.lock_wait = Duration::from_millis(300);
    settings.dev_char_links = false;
    settings.accept_volume_mounts = accept;
    let containerd = FakeContainerd::new("1.7.20");
    let hook = FaultHook::none();
    let installer =
        Installer { settings, containerd: &containerd, spec: None, runtime_config: &ShimConfig, hook: &hook };
    installer.install().unwrap();
    let path = dir.join("host/etc/nvinject/config.toml");
    let text = fs::read_to_string(&path).unwrap();
    assert_eq!(
        text.contains("accept-nvidia-visible-devices-as-volume-mounts = true"),
        accept,
        "key as written:\n{text}"
    );
    Config::parse(&text, &PathBuf::from("/etc/nvinject/config.toml")).unwrap()
}

#[test]
fn the_flag_reaches_the_config_the_shim_reads() {
    let dir = host();
    assert!(!install(dir.path(), false).requests.accept_volume_mounts, "on without the flag");
    // The same host, now with the flag: the file is ours and unedited, so it is rewritten.
    let config = install(dir.path(), true);
    assert!(config.requests.accept_volume_mounts);
    assert!(!config.requests.accept_env_unprivileged, "the flag turned on more than volume mounts");
    // And off again.
    assert!(!install(dir.path(), false).requests.accept_volume_mounts);
}
