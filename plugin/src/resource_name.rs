//! Extended resource names (`nvidia.com/<name>`): what the node advertises, what time-slicing
//! renames, what names a plugin socket. Pure.

use std::fmt;

use serde::Serialize;

/// An extended resource name: `nvidia.com/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct ResourceName(String);

/// The domain every resource name lives in.
pub const RESOURCE_DOMAIN: &str = "nvidia.com";

impl ResourceName {
    /// Accepts `gpu` or `nvidia.com/gpu`; the part after the domain must be a DNS label-like name
    /// (letters, digits, `-`, `_`, `.`, starting and ending alphanumeric, at most 63 characters).
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let short = match s.split_once('/') {
            Some((domain, short)) if domain == RESOURCE_DOMAIN => short,
            Some((domain, _)) => {
                return Err(format!("resource `{s}` is outside the `{RESOURCE_DOMAIN}` domain (`{domain}`)"));
            }
            None => s,
        };
        let ok_chars = short.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        let ok_ends = short.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && short.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
        if short.is_empty() || short.len() > 63 || !ok_chars || !ok_ends {
            return Err(format!(
                "resource name `{s}` is not valid: use letters, digits, '-', '_' or '.', starting and ending \
                 with a letter or digit, at most 63 characters"
            ));
        }
        Ok(ResourceName(format!("{RESOURCE_DOMAIN}/{short}")))
    }

    /// The full name, `nvidia.com/gpu`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The part after `nvidia.com/`: names the plugin's socket.
    pub fn short(&self) -> &str {
        &self.0[RESOURCE_DOMAIN.len() + 1..]
    }

    /// `<name>.shared`, the name replicas get under `renameByDefault`.
    pub fn shared(&self) -> ResourceName {
        ResourceName(format!("{}.shared", self.0))
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_names() {
        assert_eq!(ResourceName::parse("gpu").unwrap().as_str(), "nvidia.com/gpu");
        assert_eq!(ResourceName::parse("nvidia.com/mig-1g.10gb").unwrap().short(), "mig-1g.10gb");
        assert!(ResourceName::parse("nvidia.com/").is_err());
        assert!(ResourceName::parse("gpu-").is_err());
        assert!(ResourceName::parse("a/b/c").is_err());
    }
}
