//! What an install is told: every host path and choice ([`Settings`], from the command line or
//! its defaults), and the paths derived from them (where the shim, the hook, the drop-in and the
//! spec go). Plain values; nothing here touches the host.

use std::path::PathBuf;
use std::time::Duration;

use crate::paths::{HostRoot, host_join};

/// The shim binary containerd starts.
pub const SHIM_BINARY: &str = "containerd-shim-nvinject-v2";

/// The CDI spec file the installer owns (JSON: the fastest for the shim to parse).
pub const SPEC_FILE: &str = nvinject_cdi::nvinject::SPEC_FILE_NAME;

/// Everything install and uninstall need to know; every path is a host path.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where the host's `/` is reachable.
    pub host_root: HostRoot,
    /// Install prefix (`/usr/local/nvinject`); binaries go to `<prefix>/bin`.
    pub install_dir: String,
    /// Where the binaries to install are (a local path, not under the host root).
    pub source_dir: PathBuf,
    /// containerd's main config file.
    pub containerd_config: String,
    /// Directory of our drop-in (default: `conf.d` next to the main config).
    pub drop_in_dir: String,
    /// Runtime handler and RuntimeClass handler name.
    pub handler: String,
    /// Make the handler containerd's default runtime.
    pub set_as_default: bool,
    /// `/etc/nvinject/config.toml`.
    pub runtime_config: String,
    /// Where CDI specs go (`/var/run/cdi`).
    pub cdi_dir: String,
    /// Driver root on the host (`/`, or `/run/nvidia/driver` with a driver container).
    pub driver_root: String,
    /// Dev root on the host: device nodes are `<dev root>/dev/nvidia*` (`/`).
    pub dev_root: String,
    /// Proc root on the host (`/proc`).
    pub proc_root: String,
    /// Sys root on the host (`/sys`).
    pub sys_root: String,
    /// NVML library to load (host path); default: found under the driver root.
    pub nvml_lib: Option<String>,
    /// The MPS control daemon's pipe directory (host path), when the node runs MPS; `None`: no MPS.
    pub mps_pipe_dir: Option<String>,
    /// The OCI timeout of the spec's hook runs, in seconds (the spec written at install, and the
    /// shim's `[regenerate] hook-timeout-secs`).
    pub hook_timeout_secs: u32,
    /// Where the shim is linked onto containerd's `PATH` when containerd ignores `runtime_path`.
    pub shim_link_dir: String,
    /// The installer's state directory.
    pub state_dir: String,
    /// The host lock file.
    pub lock_file: String,
    /// How long to wait for another installer.
    pub lock_wait: Duration,
    /// Whether to create `/dev/char` links.
    pub dev_char_links: bool,
    /// Writes `[requests] accept-nvidia-visible-devices-as-volume-mounts = true` into the runtime
    /// config: needed when the device plugin uses the volume-mounts device-list strategy, and off
    /// by default (as in NVIDIA's toolkit) because any pod can ask for such a mount.
    pub accept_volume_mounts: bool,
}

impl Settings {
    /// Defaults for a host mounted at `host_root`.
    pub fn defaults(host_root: HostRoot, source_dir: PathBuf) -> Settings {
        Settings {
            host_root,
            install_dir: "/usr/local/nvinject".into(),
            source_dir,
            containerd_config: "/etc/containerd/config.toml".into(),
            drop_in_dir: "/etc/containerd/conf.d".into(),
            handler: "nvidia".into(),
            set_as_default: false,
            runtime_config: "/etc/nvinject/config.toml".into(),
            cdi_dir: "/var/run/cdi".into(),
            driver_root: "/".into(),
            dev_root: "/".into(),
            proc_root: "/proc".into(),
            sys_root: "/sys".into(),
            nvml_lib: None,
            mps_pipe_dir: None,
            hook_timeout_secs: nvinject_cdi::nvinject::DEFAULT_HOOK_TIMEOUT_SECS,
            shim_link_dir: "/usr/local/bin".into(),
            state_dir: "/var/lib/nvinject/installer".into(),
            lock_file: "/run/nvinject-installer.lock".into(),
            lock_wait: Duration::from_secs(120),
            dev_char_links: true,
            accept_volume_mounts: false,
        }
    }

    /// `<install dir>/bin`.
    pub fn bin_dir(&self) -> String {
        host_join(&self.install_dir, "bin")
    }

    /// Host path of the shim.
    pub fn shim_path(&self) -> String {
        host_join(&self.bin_dir(), SHIM_BINARY)
    }

    /// Host path of the OCI hook.
    pub fn hook_path(&self) -> String {
        host_join(&self.bin_dir(), nvinject_cdi::nvinject::HOOK_PROGRAM)
    }

    /// Host path of our drop-in.
    pub fn drop_in_path(&self) -> String {
        host_join(&self.drop_in_dir, "99-nvinject.toml")
    }

    /// Host path of the CDI spec.
    pub fn spec_path(&self) -> String {
        host_join(&self.cdi_dir, SPEC_FILE)
    }
}
