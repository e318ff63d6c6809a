//! CDI names: the kind `vendor/class` and the qualified device name `vendor/class=name`.
//!
//! The character rules are the CDI specification's, the same ones containerd and podman apply:
//! - vendor: starts with a letter, ends with a letter or digit, letters, digits, `-`, `_`, `.`
//!   between; at most 253 characters (a DNS subdomain);
//! - class: the same characters, at most 63 characters (dots need cdiVersion >= 0.6.0);
//! - device name: starts and ends with a letter or digit, letters, digits, `-`, `_`, `.`, `:`
//!   between (a leading digit needs cdiVersion >= 0.5.0).
//!
//! [`Kind`] and [`QualifiedName`] can only be built through these checks, so holding one means the
//! text is valid.

use std::fmt;
use std::str::FromStr;

use nvinject_fsio::escape::escape;

/// Longest vendor segment: the CDI spec makes it a DNS subdomain.
pub const MAX_VENDOR_LEN: usize = 253;
/// Longest class segment.
pub const MAX_CLASS_LEN: usize = 63;

/// Which part of a CDI name a [`NameError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamePart {
    /// The vendor, before `/`.
    Vendor,
    /// The class, between `/` and `=`.
    Class,
    /// The device name, after `=`.
    Device,
}

impl NamePart {
    fn allowed(self) -> &'static str {
        match self {
            NamePart::Vendor | NamePart::Class => "letters, digits, '-', '_' and '.'",
            NamePart::Device => "letters, digits, '-', '_', '.' and ':'",
        }
    }
}

impl fmt::Display for NamePart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NamePart::Vendor => "vendor",
            NamePart::Class => "class",
            NamePart::Device => "device name",
        })
    }
}

/// Why a CDI name is not valid. Every message says what is allowed, and shows the offending text
/// escaped and cut ([`nvinject_fsio::escape`]): it comes from pods and images.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The part is empty.
    #[error("{part} is empty")]
    Empty {
        /// Which part.
        part: NamePart,
    },
    /// The part starts with a character it may not start with.
    #[error("{part} `{}` must start with {}", escape(.value), if *part == NamePart::Device { "a letter or digit" } else { "a letter" })]
    BadStart {
        /// Which part.
        part: NamePart,
        /// The offending text.
        value: String,
    },
    /// The part ends with something other than a letter or digit.
    #[error("{part} `{}` must end with a letter or digit", escape(.value))]
    BadEnd {
        /// Which part.
        part: NamePart,
        /// The offending text.
        value: String,
    },
    /// The part contains a character that is not allowed.
    #[error("{part} `{}` contains `{}`: only {} are allowed", escape(.value), escape(&.ch.to_string()), part.allowed())]
    BadChar {
        /// Which part.
        part: NamePart,
        /// The offending text.
        value: String,
        /// The first character not allowed.
        ch: char,
    },
    /// The part is longer than the spec allows.
    #[error("{part} `{}` is {len} characters long; the limit is {max}", escape(.value))]
    TooLong {
        /// Which part.
        part: NamePart,
        /// The offending text.
        value: String,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A kind without exactly one `/` between a vendor and a class.
    #[error("kind `{}` is not of the form vendor/class (e.g. nvidia.com/gpu)", escape(.0))]
    NotAKind(String),
    /// A device reference without `=` between kind and name.
    #[error("`{}` is not a qualified CDI device name of the form vendor/class=name (e.g. nvidia.com/gpu=0)", escape(.0))]
    NotQualified(String),
}

fn check(part: NamePart, value: &str, max: Option<usize>) -> Result<(), NameError> {
    let err_value = || value.to_owned();
    let first = value.chars().next().ok_or(NameError::Empty { part })?;
    let start_ok = match part {
        NamePart::Device => first.is_ascii_alphanumeric(),
        NamePart::Vendor | NamePart::Class => first.is_ascii_alphabetic(),
    };
    if !start_ok {
        return Err(NameError::BadStart { part, value: err_value() });
    }
    let extra: &[char] = match part {
        NamePart::Device => &['-', '_', '.', ':'],
        NamePart::Vendor | NamePart::Class => &['-', '_', '.'],
    };
    if let Some(ch) = value.chars().find(|c| !c.is_ascii_alphanumeric() && !extra.contains(c)) {
        return Err(NameError::BadChar { part, value: err_value(), ch });
    }
    if !value.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(NameError::BadEnd { part, value: err_value() });
    }
    if let Some(max) = max
        && value.len() > max
    {
        return Err(NameError::TooLong { part, value: err_value(), len: value.len(), max });
    }
    Ok(())
}

/// Checks a vendor (`nvidia.com`).
pub fn validate_vendor(vendor: &str) -> Result<(), NameError> {
    check(NamePart::Vendor, vendor, Some(MAX_VENDOR_LEN))
}

/// Checks a class (`gpu`).
pub fn validate_class(class: &str) -> Result<(), NameError> {
    check(NamePart::Class, class, Some(MAX_CLASS_LEN))
}

/// Checks an unqualified device name (`0`, `GPU-...`, `mig0:1`).
pub fn validate_device_name(name: &str) -> Result<(), NameError> {
    check(NamePart::Device, name, None)
}

/// A validated `vendor/class`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Kind {
    text: String,
    slash: usize,
}

impl Kind {
    /// Builds a kind from its two parts, checking both.
    pub fn new(vendor: &str, class: &str) -> Result<Self, NameError> {
        validate_vendor(vendor)?;
        validate_class(class)?;
        Ok(Kind { text: format!("{vendor}/{class}"), slash: vendor.len() })
    }

    /// The vendor, before `/`.
    pub fn vendor(&self) -> &str {
        &self.text[..self.slash]
    }

    /// The class, after `/`.
    pub fn class(&self) -> &str {
        &self.text[self.slash + 1..]
    }

    /// `vendor/class`.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl FromStr for Kind {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((vendor, class)) if !class.contains('/') => Kind::new(vendor, class),
            _ => Err(NameError::NotAKind(s.to_owned())),
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Written as its text, so a spec's `kind` is the same bytes as before it was typed.
impl serde::Serialize for Kind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

/// Read through [`FromStr`]: a malformed kind fails parsing at its field with the same message
/// [`NameError`] gives everywhere else.
impl<'de> serde::Deserialize<'de> for Kind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_de(d)
    }
}

/// Deserializes a string through `T`'s [`FromStr`], its error as the message.
pub(crate) fn from_str_de<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    let text = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
    text.parse().map_err(serde::de::Error::custom)
}

/// A validated fully qualified device name, `vendor/class=name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QualifiedName {
    kind: Kind,
    name: String,
}

impl QualifiedName {
    /// Builds `kind=name`, checking the device name.
    pub fn new(kind: Kind, name: &str) -> Result<Self, NameError> {
        validate_device_name(name)?;
        Ok(QualifiedName { kind, name: name.to_owned() })
    }

    /// The kind part.
    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    /// The device name after `=`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True when `s` has the shape of a qualified name (`x/y=z`), valid or not: tells a qualified
    /// reference from a bare device id before choosing how to parse it.
    pub fn looks_qualified(s: &str) -> bool {
        s.split_once('=').is_some_and(|(kind, _)| kind.contains('/'))
    }
}

impl FromStr for QualifiedName {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, name) = s.split_once('=').ok_or_else(|| NameError::NotQualified(s.to_owned()))?;
        if !kind.contains('/') {
            return Err(NameError::NotQualified(s.to_owned()));
        }
        QualifiedName::new(kind.parse()?, name)
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.kind, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names_from_the_spec_parse() {
        for kind in ["vendor.com/foo", "foo.bar.baz/foo-bar123.B_az", "nvidia.com/gpu", "a/b"] {
            let k: Kind = kind.parse().unwrap_or_else(|e| panic!("{kind}: {e}"));
            assert_eq!(k.to_string(), kind);
        }
        let q: QualifiedName = "nvidia.com/gpu=mig0:1".parse().unwrap();
        assert_eq!((q.kind().vendor(), q.kind().class(), q.name()), ("nvidia.com", "gpu", "mig0:1"));
        for name in ["0", "GPU-a243dc34-57b3-0fcb-5244-1038baa98945", "0:1", "all", "x_y.z"] {
            validate_device_name(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn invalid_names_say_what_is_wrong() {
        let cases: &[(&str, &str)] = &[
            ("foo", "not of the form vendor/class"),
            ("vendor.com/foo/", "not of the form vendor/class"),
            ("vendor.com/foo/bar", "not of the form vendor/class"),
            ("1vendor.com/foo", "vendor `1vendor.com` must start with a letter"),
            ("vendor.com/foo-", "class `foo-` must end with a letter or digit"),
            ("vendor.com/f:o", "class `f:o` contains `:`"),
            ("/gpu", "vendor is empty"),
        ];
        for (text, want) in cases {
            let err = text.parse::<Kind>().unwrap_err().to_string();
            assert!(err.contains(want), "{text}: got `{err}`, want `{want}`");
        }
        let long = format!("nvidia.com/{}", "c".repeat(64));
        assert!(long.parse::<Kind>().unwrap_err().to_string().contains("limit is 63"));
        for (text, want) in [
            ("nvidia.com/gpu", "not a qualified CDI device name"),
            ("gpu=0", "not a qualified CDI device name"),
            ("nvidia.com/gpu=", "device name is empty"),
            ("nvidia.com/gpu=-1", "must start with a letter or digit"),
            ("nvidia.com/gpu=a b", "contains ` `"),
        ] {
            let err = text.parse::<QualifiedName>().unwrap_err().to_string();
            assert!(err.contains(want), "{text}: got `{err}`, want `{want}`");
        }
    }

    #[test]
    fn looks_qualified_tells_bare_ids_apart() {
        assert!(QualifiedName::looks_qualified("nvidia.com/gpu=0"));
        assert!(QualifiedName::looks_qualified("x/y=bad name"));
        assert!(!QualifiedName::looks_qualified("GPU-1234"));
        assert!(!QualifiedName::looks_qualified("0"));
    }
}
