//! Which containerd is installed, and what that version can do with our configuration.

use std::fmt;

/// A containerd release, as `containerd --version` or the version API reports it.
///
/// Only the numeric part matters for the decisions below; Debian suffixes (`~ds1`) and
/// pre-release tags (`-rc.2`) are kept in [`ContainerdVersion::raw`] for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerdVersion {
    /// Major version (1 or 2 today).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
    /// The version token as reported, for messages.
    pub raw: String,
}

/// The version text did not contain a `MAJOR.MINOR.PATCH` token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot find a containerd version (MAJOR.MINOR.PATCH) in {text:?}; pass --containerd-version \
     (for example 1.7.20)"
)]
pub struct VersionParseError {
    /// The text that was searched.
    pub text: String,
}

impl ContainerdVersion {
    /// Finds the first `vMAJOR.MINOR.PATCH` token in `text`: the whole output of
    /// `containerd --version` (`containerd github.com/containerd/containerd 1.6.20~ds1 ...`) or the
    /// bare string the version API returns (`v2.0.0`).
    pub fn parse(text: &str) -> Result<Self, VersionParseError> {
        text.split_whitespace()
            .find_map(Self::parse_token)
            .ok_or_else(|| VersionParseError { text: text.trim().to_owned() })
    }

    fn parse_token(token: &str) -> Option<Self> {
        let numeric = token.strip_prefix('v').unwrap_or(token);
        let mut parts = numeric.splitn(3, '.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let rest = parts.next()?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let patch = digits.parse().ok()?;
        Some(Self { major, minor, patch, raw: token.to_owned() })
    }

    /// Builds a version from numbers (tests, `--containerd-version`).
    pub fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self { major, minor, patch, raw: format!("{major}.{minor}.{patch}") }
    }

    /// Whether the CRI plugin passes a runtime's `runtime_path` to containers' tasks.
    ///
    /// containerd issue 8207: before the fix the path was only used for the pod sandbox, so
    /// containers silently ran the shim found on `PATH`. The fix shipped in 1.6.21 (backport #8454),
    /// 1.7.1 (#8453) and every 2.x release (#8208).
    pub fn honours_runtime_path(&self) -> bool {
        match (self.major, self.minor) {
            (0, _) => false,
            (1, minor) if minor < 6 => false,
            (1, 6) => self.patch >= 21,
            (1, 7) => self.patch >= 1,
            _ => true,
        }
    }

    /// Whether a plugin section in an imported file is merged key by key into the main file's.
    ///
    /// containerd 1.x replaces the whole plugin section (containerd issue 5837); 2.0 merges
    /// (#9982). On 1.x the drop-in must therefore carry the entire CRI section.
    pub fn merges_plugin_sections(&self) -> bool {
        self.major >= 2
    }

    /// Whether relative glob imports resolve against the config file's directory (2.x) rather
    /// than containerd's working directory (1.x).
    pub fn resolves_relative_globs_from_config_dir(&self) -> bool {
        self.major >= 2
    }

    /// Whether the CRI plugin has its own CDI (`enable_cdi`, `cdi_spec_dirs`): 1.7 and later.
    pub fn has_cdi(&self) -> bool {
        (self.major, self.minor) >= (1, 7)
    }

    /// `enable_cdi` when the config does not set it: off on 1.7, on from 2.0.
    pub fn cdi_enabled_by_default(&self) -> bool {
        self.major >= 2
    }

    /// The highest config `version` this containerd reads.
    pub fn max_config_version(&self) -> u8 {
        if self.major >= 2 { 3 } else { 2 }
    }
}

impl fmt::Display for ContainerdVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_debian_version_output() {
        let v = ContainerdVersion::parse(
            "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3\n",
        )
        .unwrap();
        assert_eq!((v.major, v.minor, v.patch), (1, 6, 20));
        assert_eq!(v.raw, "1.6.20~ds1");
    }

    #[test]
    fn parses_upstream_and_api_forms() {
        let v = ContainerdVersion::parse("containerd github.com/containerd/containerd/v2 v2.0.0-rc.2 28b7")
            .unwrap();
        assert_eq!((v.major, v.minor, v.patch), (2, 0, 0));
        assert_eq!(ContainerdVersion::parse("v1.7.1").unwrap(), ContainerdVersion::parse("v1.7.1").unwrap());
        assert!(ContainerdVersion::parse("containerd github.com/containerd/containerd").is_err());
    }

    #[test]
    fn runtime_path_support_follows_the_8207_fix() {
        let cases = [
            ((1, 5, 18), false),
            ((1, 6, 20), false),
            ((1, 6, 21), true),
            ((1, 7, 0), false),
            ((1, 7, 1), true),
            ((1, 7, 27), true),
            ((2, 0, 0), true),
            ((2, 3, 4), true),
        ];
        for ((major, minor, patch), expected) in cases {
            let v = ContainerdVersion::new(major, minor, patch);
            assert_eq!(v.honours_runtime_path(), expected, "{v}");
        }
    }

    #[test]
    fn only_2x_merges_plugin_sections_and_reads_v3() {
        assert!(!ContainerdVersion::new(1, 7, 20).merges_plugin_sections());
        assert!(ContainerdVersion::new(2, 0, 0).merges_plugin_sections());
        assert_eq!(ContainerdVersion::new(1, 6, 20).max_config_version(), 2);
        assert_eq!(ContainerdVersion::new(2, 1, 0).max_config_version(), 3);
    }
}
