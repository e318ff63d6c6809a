//! Loading one spec file: read, parse, validate.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::codec::{Format, ParseError, parse};
use crate::spec::Spec;
use crate::validate::{Problem, validate};

/// Why a spec file (or a spec directory) could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The file could not be read.
    #[error("cannot read CDI spec {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A spec directory exists but could not be listed.
    #[error("cannot list CDI spec directory {}: {source}", path.display())]
    ReadDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The text is not a CDI spec (syntax, types, unknown or missing fields).
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// The file, its folder or a folder above may be written by someone other than root
    /// ([`crate::trust`]); names the file, owner, mode and fix.
    #[error(transparent)]
    Untrusted(#[from] crate::trust::UntrustedError),
    /// The spec parsed but breaks CDI rules.
    #[error("{}: invalid CDI spec: {}", path.display(), ProblemList(problems))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Every rule broken, with its field.
        problems: Vec<Problem>,
    },
}

impl SpecError {
    /// The file or directory the error is about.
    pub fn path(&self) -> &Path {
        match self {
            SpecError::Read { path, .. }
            | SpecError::ReadDir { path, .. }
            | SpecError::Invalid { path, .. } => path,
            SpecError::Parse(e) => &e.path,
            SpecError::Untrusted(e) => e.spec(),
        }
    }
}

struct ProblemList<'a>(&'a [Problem]);

impl fmt::Display for ProblemList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

/// Parses and validates spec text; `path` names it in errors.
pub fn parse_and_validate(bytes: &[u8], format: Format, path: &Path) -> Result<Spec, SpecError> {
    let spec = parse(bytes, format, path)?;
    let problems = validate(&spec);
    if problems.is_empty() { Ok(spec) } else { Err(SpecError::Invalid { path: path.to_owned(), problems }) }
}

/// Reads, parses and validates the spec file at `path`. The format follows the extension; any other
/// extension is read as YAML, which also accepts JSON.
pub fn load_file(path: &Path) -> Result<Spec, SpecError> {
    let bytes = crate::codec::read_bounded(path)
        .map_err(|source| SpecError::Read { path: path.to_owned(), source })?;
    parse_and_validate(&bytes, Format::from_path(path).unwrap_or(Format::Yaml), path)
}

/// [`load_file`] behind the spec-trust check ([`crate::trust::read_trusted`]): what every reader
/// that acts on a spec uses. With `accept`, an untrusted file is loaded and its verdict returned
/// beside it, for the caller to report.
pub fn load_trusted_file(
    path: &Path,
    owners: &crate::trust::Owners,
    accept: bool,
) -> Result<(Spec, Option<crate::trust::UntrustedError>), SpecError> {
    let (bytes, verdict) = crate::trust::read_trusted(path, owners, accept).map_err(|e| match e {
        crate::trust::ReadError::Io(source) => SpecError::Read { path: path.to_owned(), source },
        crate::trust::ReadError::Untrusted(e) => SpecError::Untrusted(e),
    })?;
    let spec = parse_and_validate(&bytes, Format::from_path(path).unwrap_or(Format::Yaml), path)?;
    Ok((spec, verdict))
}
