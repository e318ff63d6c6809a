//! The `version` header of a containerd config file (1, 2 or 3), which decides the CRI plugin's
//! id, and which one a containerd release reads.

use super::version::ContainerdVersion;

/// The `version` header of a containerd config file, which decides the plugin names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigVersion {
    /// No header or `version = 1`: short plugin ids (`plugins.cri`), deprecated, gone in 2.0.
    V1,
    /// `version = 2`: fully qualified plugin ids (`plugins."io.containerd.grpc.v1.cri"`).
    V2,
    /// `version = 3` (containerd 2.x): the CRI runtime plugin is `io.containerd.cri.v1.runtime`.
    V3,
}

impl ConfigVersion {
    /// The plugin id whose `containerd.runtimes` table holds runtime handlers.
    pub fn cri_runtime_plugin(self) -> &'static str {
        match self {
            ConfigVersion::V1 => "cri",
            ConfigVersion::V2 => "io.containerd.grpc.v1.cri",
            ConfigVersion::V3 => "io.containerd.cri.v1.runtime",
        }
    }

    /// The number written in the header.
    pub fn number(self) -> u8 {
        match self {
            ConfigVersion::V1 => 1,
            ConfigVersion::V2 => 2,
            ConfigVersion::V3 => 3,
        }
    }

    /// The version to write when there is no config file yet: the newest this containerd reads.
    pub fn newest_for(containerd: &ContainerdVersion) -> Self {
        if containerd.max_config_version() >= 3 { ConfigVersion::V3 } else { ConfigVersion::V2 }
    }
}
