//! Where the node description comes from, in this order:
//! 1. the file named by `$NVINJECT_SIM_NODE` ([`NODE_ENV`]);
//! 2. a description embedded in the library's own file (`nvinject-simnode build` appends one to the
//!    driver root's copy, so the library knows its node wherever it is bind-mounted);
//! 3. [`DEFAULT_NODE_PATH`].
//!
//! No description anywhere is a host without the driver (`NVML_ERROR_DRIVER_NOT_LOADED`); a
//! description that exists but cannot be read or parsed is an error naming the file and field.

use std::ffi::{CStr, OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nvinject_simnode::description::{DEFAULT_NODE_PATH, DescriptionError, NODE_ENV, NodeDescription};
use nvinject_simnode::embed;

/// File reads the lookup needs; [`RealFiles`] reads the file system, tests use fakes.
pub trait Files {
    /// The whole file; `ErrorKind::NotFound` when it does not exist.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
}

/// Reads the real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFiles;

impl Files for RealFiles {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }
}

/// The outcome of the lookup.
#[derive(Debug)]
pub enum Lookup {
    /// A valid description and where it came from.
    Found {
        /// The parsed, validated description.
        node: NodeDescription,
        /// The file it came from (for an embedded one: the library file, marked as such).
        origin: PathBuf,
    },
    /// Nothing to read anywhere; the text says where the library looked.
    Absent(String),
    /// A description exists but is unusable.
    Invalid(DescriptionError),
}

/// Runs the lookup. `env` is the value of [`NODE_ENV`]; `own_file` the path of this library, if known.
pub fn lookup(env: Option<&OsStr>, own_file: Option<&Path>, files: &dyn Files) -> Lookup {
    if let Some(path) = env.filter(|v| !v.is_empty()).map(Path::new) {
        return match files.read(path) {
            Ok(bytes) => parse(&bytes, path),
            Err(source) => Lookup::Invalid(DescriptionError::Read { path: path.to_owned(), source }),
        };
    }
    if let Some(lib) = own_file
        && let Ok(bytes) = files.read(lib)
        && let Some((_, json)) = embed::split(&bytes)
    {
        let origin = PathBuf::from(format!("{} (embedded description)", lib.display()));
        return parse(json, &origin);
    }
    let default = Path::new(DEFAULT_NODE_PATH);
    match files.read(default) {
        Ok(bytes) => parse(&bytes, default),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Lookup::Absent(format!(
            "no node description: ${NODE_ENV} is not set, {} carries none, and {DEFAULT_NODE_PATH} does not exist",
            own_file
                .map_or_else(|| "the library file (path unknown)".to_owned(), |p| p.display().to_string())
        )),
        Err(source) => Lookup::Invalid(DescriptionError::Read { path: default.to_owned(), source }),
    }
}

fn parse(bytes: &[u8], origin: &Path) -> Lookup {
    match NodeDescription::from_slice(bytes, origin) {
        Ok(node) => Lookup::Found { node, origin: origin.to_owned() },
        Err(e) => Lookup::Invalid(e),
    }
}

/// The environment's [`NODE_ENV`].
pub fn env_value() -> Option<OsString> {
    std::env::var_os(NODE_ENV)
}

/// The path of the shared object this function lives in, from the dynamic loader.
pub fn own_library_path() -> Option<PathBuf> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let addr = own_library_path as fn() -> Option<PathBuf> as *const libc::c_void;
    // SAFETY: `addr` is an address inside this library and `info` is valid for writes.
    let found = unsafe { libc::dladdr(addr, info.as_mut_ptr()) };
    if found == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded, so it filled `info`.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader for the library's lifetime.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(OsStr::from_bytes(name.to_bytes())))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    struct FakeFiles(BTreeMap<PathBuf, Vec<u8>>);

    impl Files for FakeFiles {
        fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
            self.0.get(path).cloned().ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }
    }

    fn single() -> Vec<u8> {
        nvinject_simnode::presets::preset_json("single").unwrap().as_bytes().to_vec()
    }

    fn files(entries: &[(&str, Vec<u8>)]) -> FakeFiles {
        FakeFiles(entries.iter().map(|(p, b)| (PathBuf::from(p), b.clone())).collect())
    }

    #[test]
    fn env_wins_over_embedded_and_default() {
        let lib = embed::append(b"\x7fELF", &single());
        let fs = files(&[("/e.json", single()), ("/lib.so", lib), (DEFAULT_NODE_PATH, b"{".to_vec())]);
        match lookup(Some(OsStr::new("/e.json")), Some(Path::new("/lib.so")), &fs) {
            Lookup::Found { origin, node } => {
                assert_eq!(origin, Path::new("/e.json"));
                assert_eq!(node.name, "single");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn embedded_wins_over_default() {
        let lib = embed::append(b"\x7fELF", &single());
        let fs = files(&[("/lib.so", lib), (DEFAULT_NODE_PATH, b"{".to_vec())]);
        match lookup(None, Some(Path::new("/lib.so")), &fs) {
            Lookup::Found { origin, .. } => assert_eq!(origin, Path::new("/lib.so (embedded description)")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn default_path_is_last() {
        let fs = files(&[("/lib.so", b"\x7fELF plain".to_vec()), (DEFAULT_NODE_PATH, single())]);
        match lookup(Some(OsStr::new("")), Some(Path::new("/lib.so")), &fs) {
            Lookup::Found { origin, .. } => assert_eq!(origin, Path::new(DEFAULT_NODE_PATH)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn nothing_anywhere_is_absent() {
        match lookup(None, Some(Path::new("/lib.so")), &files(&[])) {
            Lookup::Absent(text) => assert!(text.contains("/etc/nvinject-sim/node.json"), "{text}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn env_naming_a_missing_file_is_an_error_naming_it() {
        match lookup(Some(OsStr::new("/gone.json")), None, &files(&[])) {
            Lookup::Invalid(e) => assert!(e.to_string().starts_with("/gone.json: cannot read"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_embedded_description_names_the_library() {
        let lib = embed::append(b"\x7fELF", br#"{"name": 1}"#);
        match lookup(None, Some(Path::new("/lib.so")), &files(&[("/lib.so", lib)])) {
            Lookup::Invalid(e) => {
                let text = e.to_string();
                assert!(text.starts_with("/lib.so (embedded description): field `name`"), "{text}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn own_path_is_found() {
        // In the unit-test binary the function lives in the executable itself.
        let path = own_library_path().unwrap();
        assert!(path.exists(), "{}", path.display());
    }
}
