//! `doctor`'s command-line flags.

use super::report::Phase;

/// `doctor` flags (besides the host flags shared with install).
#[derive(Debug, Clone, clap::Args)]
pub struct DoctorArgs {
    /// The kubelet's device plugin directory (holds kubelet.sock and the plugins' sockets).
    #[arg(long, default_value = "/var/lib/kubelet/device-plugins", env = "NVINJECT_DEVICE_PLUGIN_DIR")]
    pub device_plugin_dir: String,
    /// The extended resource the device plugin registers.
    #[arg(long, default_value = "nvidia.com/gpu")]
    pub resource: String,
    /// Image for the test container; it needs a C library (nvidia-smi comes from the driver).
    /// Without it, the container phase is skipped.
    #[arg(long, env = "NVINJECT_TEST_IMAGE")]
    pub test_image: Option<String>,
    /// Command the test container runs; it must exit 0 when it sees a GPU.
    #[arg(long, num_args = 1.., default_values = ["nvidia-smi", "-L"])]
    pub test_command: Vec<String>,
    /// CDI device the test container asks for.
    #[arg(long, default_value = "nvidia.com/gpu=all")]
    pub test_device: String,
    /// Phases to skip (driver, cdi, containerd, device-plugin, container).
    #[arg(long, value_delimiter = ',')]
    pub skip: Vec<String>,
}

impl Default for DoctorArgs {
    fn default() -> Self {
        DoctorArgs {
            device_plugin_dir: "/var/lib/kubelet/device-plugins".into(),
            resource: "nvidia.com/gpu".into(),
            test_image: None,
            test_command: vec!["nvidia-smi".into(), "-L".into()],
            test_device: "nvidia.com/gpu=all".into(),
            skip: Vec::new(),
        }
    }
}

impl DoctorArgs {
    /// Whether `--skip` names `phase`.
    pub fn skips(&self, phase: Phase) -> bool {
        self.skip.iter().any(|s| s == phase.name())
    }
}
