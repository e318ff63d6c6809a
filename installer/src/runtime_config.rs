//! `/etc/nvinject/config.toml`: the seam an install renders it through ([`RuntimeConfigWriter`])
//! and its production implementation, rendered from the shim's own configuration type (the small
//! `nvinject-shim-config` crate, not the shim itself) so the installer can never write a key the
//! shim rejects.

use std::path::PathBuf;

use nvinject_shim_config::Config;

use crate::containerd::RuntimeMode;
use crate::error::{Error, Result};
use crate::settings::Settings;

/// Produces `/etc/nvinject/config.toml` (the shim's config type in production).
pub trait RuntimeConfigWriter {
    /// The file's content for these settings.
    fn render(&self, settings: &Settings, mode: RuntimeMode) -> Result<String>;
}

/// The spec directories the installer gives the shim, lowest priority first: the shim's default
/// ones, then the install's `--cdi-dir` when it is not one of them (so ours is read last and wins).
pub fn shim_spec_dirs(settings: &Settings) -> Vec<PathBuf> {
    let mut dirs = Config::default().cdi.spec_dirs;
    let cdi_dir = PathBuf::from(&settings.cdi_dir);
    if !dirs.contains(&cdi_dir) {
        dirs.push(cdi_dir);
    }
    dirs
}

/// Renders the shim's configuration for an install.
#[derive(Debug, Clone, Copy, Default)]
pub struct ShimConfig;

impl RuntimeConfigWriter for ShimConfig {
    fn render(&self, settings: &Settings, mode: RuntimeMode) -> Result<String> {
        let mut config = Config::default();
        config.cdi.spec_dirs = shim_spec_dirs(settings);
        config.regenerate.sys_root = PathBuf::from(&settings.sys_root);
        // MIG capability minors are read from <proc root>/driver/nvidia-caps: without this the
        // shim's regeneration looks in the host's /proc and refuses every GPU container.
        config.regenerate.proc_root = PathBuf::from(&settings.proc_root);
        config.regenerate.driver_root = Some(PathBuf::from(&settings.driver_root));
        config.regenerate.dev_root = Some(PathBuf::from(&settings.dev_root));
        config.regenerate.hook_path = Some(PathBuf::from(settings.hook_path()));
        config.regenerate.spec_path = Some(PathBuf::from(settings.spec_path()));
        config.regenerate.nvml_lib = settings.nvml_lib.as_ref().map(PathBuf::from);
        config.regenerate.mps_pipe_dir = settings.mps_pipe_dir.as_ref().map(PathBuf::from);
        config.regenerate.hook_timeout_secs = settings.hook_timeout_secs;
        config.requests.accept_volume_mounts = settings.accept_volume_mounts;
        let shown = settings.host_root.shown(&settings.runtime_config);
        let body = toml::to_string(&config)
            .map_err(|e| Error::RuntimeConfig { path: shown.clone(), message: e.to_string() })?;
        let how = match mode {
            RuntimeMode::RuntimePath => {
                "containerd starts the shim through `runtime_path` with runc's options"
            }
            RuntimeMode::ShimType => "containerd starts the shim as runtime type io.containerd.nvinject.v2",
        };
        let text = format!(
            "# nvinject runtime configuration, written by nvinject-installer ({how}).\n\
             # Edits are kept: the installer does not overwrite a file changed since it wrote it, and\n\
             # uninstall leaves an edited file in place (an unedited one is removed). Keys: see the\n\
             # shim README.\n\n{body}"
        );
        // Round-trip through the shim's parser: what we write is what the shim accepts.
        Config::parse(&text, &shown)
            .map_err(|e| Error::RuntimeConfig { path: shown.clone(), message: e.to_string() })?;
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::HostRoot;

    #[test]
    fn renders_a_config_the_shim_accepts_with_our_paths() {
        let mut settings = Settings::defaults(HostRoot::new("/host"), PathBuf::from("/opt/bin"));
        settings.driver_root = "/run/nvidia/driver".into();
        let text = ShimConfig.render(&settings, RuntimeMode::RuntimePath).unwrap();
        let parsed = Config::parse(&text, std::path::Path::new("config.toml")).unwrap();
        assert_eq!(parsed.regenerate.driver_root, Some(PathBuf::from("/run/nvidia/driver")));
        assert_eq!(parsed.regenerate.hook_path, Some(PathBuf::from("/usr/local/nvinject/bin/nvinject-hook")));
        assert_eq!(parsed.regenerate.spec_path, Some(PathBuf::from("/var/run/cdi/nvidia.com-gpu.json")));
        assert!(parsed.cdi.spec_dirs.contains(&PathBuf::from("/var/run/cdi")));
        assert!(!parsed.requests.accept_volume_mounts, "volume mounts must be off by default");
        assert_eq!(parsed.regenerate.mps_pipe_dir, None, "no MPS unless asked");
        settings.mps_pipe_dir = Some("/run/nvidia/mps".into());
        let text = ShimConfig.render(&settings, RuntimeMode::RuntimePath).unwrap();
        let parsed = Config::parse(&text, std::path::Path::new("config.toml")).unwrap();
        assert_eq!(parsed.regenerate.mps_pipe_dir, Some(PathBuf::from("/run/nvidia/mps")));
    }

    #[test]
    fn proc_and_sys_roots_are_passed_to_the_shim() {
        let mut settings = Settings::defaults(HostRoot::new("/host"), PathBuf::from("/opt/bin"));
        settings.proc_root = "/run/nvidia/proc".into();
        settings.sys_root = "/run/nvidia/sys".into();
        let text = ShimConfig.render(&settings, RuntimeMode::RuntimePath).unwrap();
        let parsed = Config::parse(&text, std::path::Path::new("config.toml")).unwrap();
        assert_eq!(parsed.regenerate.proc_root, PathBuf::from("/run/nvidia/proc"), "{text}");
        assert_eq!(parsed.regenerate.sys_root, PathBuf::from("/run/nvidia/sys"), "{text}");
    }

    #[test]
    fn volume_mounts_are_accepted_only_when_asked() {
        let mut settings = Settings::defaults(HostRoot::new("/host"), PathBuf::from("/opt/bin"));
        settings.accept_volume_mounts = true;
        let text = ShimConfig.render(&settings, RuntimeMode::ShimType).unwrap();
        assert!(text.contains("accept-nvidia-visible-devices-as-volume-mounts = true"), "{text}");
        let parsed = Config::parse(&text, std::path::Path::new("config.toml")).unwrap();
        assert!(parsed.requests.accept_volume_mounts);
        assert!(!parsed.requests.accept_env_unprivileged);
    }
}
