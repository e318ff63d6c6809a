//! Roots: a directory tree as this process sees it and as the spec must name it.
//!
//! On a host both views are the same. In a container (the installer's DaemonSet) the host's driver
//! root `/run/nvidia/driver` may be mounted at `/host/run/nvidia/driver`: files are looked up under
//! the second and written into the spec under the first (NVIDIA's `--driver-root` and
//! `--driver-root-ctr-path`).
//!
//! Paths inside a root are kept as absolute-looking strings (`/usr/lib/x86_64-linux-gnu/libcuda.so.1`),
//! which is also where the container sees them.

use std::fs::Metadata;
use std::io;
use std::path::{Path, PathBuf};

/// Symlink hops allowed while resolving one path, as Linux's `MAXSYMLINKS`.
const MAX_HOPS: u32 = 40;

/// One tree, seen from this process (`lookup`) and from the host runtime (`host`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    /// Where this process finds the tree.
    pub lookup: PathBuf,
    /// What the host (and so the spec) calls it.
    pub host: PathBuf,
}

impl Root {
    /// A root seen the same way by this process and the host.
    pub fn same(path: impl Into<PathBuf>) -> Root {
        let path = path.into();
        Root { lookup: path.clone(), host: path }
    }

    /// Where this process finds `inner` (a path inside the root, starting with `/`).
    pub fn lookup_path(&self, inner: &str) -> PathBuf {
        join(&self.lookup, inner)
    }

    /// The host path of `inner`, as written into the spec.
    pub fn host_path(&self, inner: &str) -> String {
        join(&self.host, inner).to_string_lossy().into_owned()
    }

    /// The host root as text, for annotations.
    pub fn host_display(&self) -> String {
        self.host.to_string_lossy().into_owned()
    }
}

/// `root` + `inner`, where `inner` starts with `/`; `/` + `/x` is `/x`.
pub fn join(root: &Path, inner: &str) -> PathBuf {
    let root = root.to_string_lossy();
    let root = root.trim_end_matches('/');
    PathBuf::from(format!("{root}/{}", inner.trim_start_matches('/')))
}

/// Resolves every symlink in `inner` as if `root` were `/`: absolute link targets restart at the
/// root and `..` never climbs above it, so a driver root's `/lib -> usr/lib` or
/// `libcuda.so.1 -> /usr/lib/...` resolve inside the root, never on this machine.
/// Returns the resolved path inside the root; fails when a component does not exist.
pub fn resolve_in_root(root: &Path, inner: &str) -> io::Result<String> {
    walk(root, inner).map(|(path, _, _)| path)
}

/// [`resolve_in_root`], with the metadata of what the path resolves to. The walk already
/// `lstat`ed it (as a non-link, so that is what `stat` would say), so callers asking "is it a
/// file?" need no second `stat`.
pub(crate) fn resolve_with_metadata(root: &Path, inner: &str) -> io::Result<(String, Metadata)> {
    let (path, current, last) = walk(root, inner)?;
    let meta = match last {
        Some(meta) => meta,
        None => std::fs::metadata(current)?,
    };
    Ok((path, meta))
}

/// The resolved path inside the root, this process's path to it, and its metadata when the walk
/// ended on a component it `lstat`ed.
fn walk(root: &Path, inner: &str) -> io::Result<(String, PathBuf, Option<Metadata>)> {
    let mut done: Vec<String> = Vec::new();
    let mut todo: Vec<String> = components(inner).rev().collect();
    let mut hops = 0;
    let mut current = root.to_path_buf();
    // The metadata of `current` when its last step pushed a component onto `done`; `None` after
    // a `..` or a restart at the root.
    let mut last: Option<Metadata> = None;
    while let Some(part) = todo.pop() {
        if part == ".." {
            done.pop();
            current = join(root, &format!("/{}", done.join("/")));
            last = None;
            continue;
        }
        let candidate = current.join(&part);
        let meta = std::fs::symlink_metadata(&candidate)?;
        if meta.file_type().is_symlink() {
            hops += 1;
            if hops > MAX_HOPS {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("too many symbolic links resolving {inner} under {}", root.display()),
                ));
            }
            let target = std::fs::read_link(&candidate)?;
            let target = target.to_string_lossy();
            if target.starts_with('/') {
                done.clear();
                current = root.to_path_buf();
                last = None;
            }
            todo.extend(components(&target).rev());
        } else {
            done.push(part);
            current = candidate;
            last = Some(meta);
        }
    }
    Ok((format!("/{}", done.join("/")), current, last))
}

fn components(path: &str) -> impl DoubleEndedIterator<Item = String> + '_ {
    path.split('/').filter(|c| !c.is_empty() && *c != ".").map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn joins_roots_and_inner_paths() {
        assert_eq!(join(Path::new("/"), "/usr/lib/x"), PathBuf::from("/usr/lib/x"));
        assert_eq!(
            join(Path::new("/run/nvidia/driver/"), "/usr/lib"),
            PathBuf::from("/run/nvidia/driver/usr/lib")
        );
        let r = Root { lookup: "/host/run/nvidia/driver".into(), host: "/run/nvidia/driver".into() };
        assert_eq!(
            r.lookup_path("/usr/bin/nvidia-smi"),
            PathBuf::from("/host/run/nvidia/driver/usr/bin/nvidia-smi")
        );
        assert_eq!(r.host_path("/usr/bin/nvidia-smi"), "/run/nvidia/driver/usr/bin/nvidia-smi");
    }

    #[test]
    fn symlinks_resolve_inside_the_root() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("usr/lib/x86_64-linux-gnu")).unwrap();
        std::fs::write(r.join("usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"), b"").unwrap();
        symlink("usr/lib", r.join("lib")).unwrap();
        symlink("libcuda.so.550.54.15", r.join("usr/lib/x86_64-linux-gnu/libcuda.so.1")).unwrap();
        // An absolute target means the root's /usr, not this machine's.
        symlink("/usr/lib/x86_64-linux-gnu/libcuda.so.1", r.join("usr/lib/abs-link")).unwrap();
        symlink("../../../../../../usr/lib", r.join("usr/lib/x86_64-linux-gnu/up")).unwrap();
        let want = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15";
        assert_eq!(resolve_in_root(r, "/lib/x86_64-linux-gnu/libcuda.so.1").unwrap(), want);
        assert_eq!(resolve_in_root(r, "/usr/lib/abs-link").unwrap(), want);
        assert_eq!(
            resolve_in_root(r, "/usr/lib/x86_64-linux-gnu/up/x86_64-linux-gnu/libcuda.so.1").unwrap(),
            want
        );
        assert!(resolve_in_root(r, "/usr/lib/missing").is_err());

        symlink("loop", r.join("loop")).unwrap();
        assert!(resolve_in_root(r, "/loop").unwrap_err().to_string().contains("too many symbolic links"));

        // The metadata is that of what the path resolves to, however the walk ended.
        let (path, meta) = resolve_with_metadata(r, "/usr/lib/abs-link").unwrap();
        assert!(path == want && meta.is_file());
        let (path, meta) = resolve_with_metadata(r, "/lib/x86_64-linux-gnu/..").unwrap();
        assert!(path == "/usr/lib" && meta.is_dir());
        symlink("/", r.join("usr/lib/to-root")).unwrap();
        let (path, meta) = resolve_with_metadata(r, "/usr/lib/to-root").unwrap();
        assert!(path == "/" && meta.is_dir());
    }
}
