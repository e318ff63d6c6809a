//! The CDI spec directories as one lookup table from qualified device names to specs.
//!
//! Rules (those of containerd's and podman's CDI support, so the shim and containerd agree on what
//! a name means):
//! - directories are given in priority order, lowest first (default `/etc/cdi` then `/var/run/cdi`);
//!   missing directories are skipped;
//! - in a directory, `*.json`, `*.yaml` and `*.yml` files are read in lexical order; subdirectories
//!   and other files are ignored;
//! - a device name defined in several directories resolves to the highest-priority one; defined
//!   twice in one directory, it is a conflict and resolves to nothing;
//! - a file that cannot be read, parsed or validated is set aside with its error; it never hides
//!   other files' devices, and an unresolvable name reports it;
//! - so is a file that fails the trust check ([`crate::trust`]: it, its folder or a folder above
//!   may be written by someone other than root), unless the registry's [`TrustPolicy`] accepts
//!   untrusted files, when [`Resolved::untrusted`] says so for the caller to report. The file is
//!   judged on the descriptor its bytes were read from; the folders at each (re)listing.
//!
//! Cost: [`Registry::scan`] only lists the directories (and `stat`s each spec folder and the
//! folders above it for the trust check, once per listing). A lookup reads just enough of each file to
//! learn its kind and fully parses only files of the kind asked for; results are cached, so a
//! registry can serve many lookups. [`Registry::refresh`] relists and keeps cached parses of files
//! whose identity (device, inode, size, mtime, ctime: a chmod or chown changes the last) did not
//! change.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use nvinject_fsio::escape::escape;
use serde::Deserialize;

use crate::codec::Format;
use crate::load::{SpecError, parse_and_validate};
use crate::name::{Kind, QualifiedName};
use crate::spec::{Device, Spec};
use crate::trust::{Stat, TrustPolicy, UntrustedError};

/// The CDI spec directories runtimes read, lowest priority first.
pub const DEFAULT_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// What identifies one version of a file's content without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

/// A file's bytes with the owner and mode of the descriptor they were read from.
type ReadBack = (Vec<u8>, Stat);

/// One spec file and what is known about it so far.
#[derive(Debug)]
struct FileState {
    path: PathBuf,
    format: Format,
    identity: Identity,
    /// The bytes and the owner and mode of the descriptor they were read from.
    bytes: OnceLock<Result<ReadBack, Arc<std::io::Error>>>,
    kind: OnceLock<Option<String>>,
    /// The file's own trust verdict (its folders are the entry's).
    untrusted: OnceLock<Option<UntrustedError>>,
    spec: OnceLock<Result<Spec, Arc<SpecError>>>,
}

impl FileState {
    fn read(&self) -> Result<&ReadBack, &std::io::Error> {
        let read = || {
            crate::codec::read_bounded_with_metadata(&self.path)
                .map(|(b, m)| (b, Stat::from(&m)))
                .map_err(Arc::new)
        };
        match self.bytes.get_or_init(read) {
            Ok(b) => Ok(b),
            Err(e) => Err(e),
        }
    }

    fn bytes(&self) -> Result<&[u8], &std::io::Error> {
        self.read().map(|(b, _)| b.as_slice())
    }

    /// Why the file read is not trusted; `None` when it is (or could not be read).
    fn untrusted(&self, trust: &TrustPolicy) -> Option<&UntrustedError> {
        self.untrusted
            .get_or_init(|| {
                let (_, stat) = self.read().ok()?;
                crate::trust::judge_file(&self.path, stat, &trust.owners)
                    .err()
                    .map(UntrustedError::with_host_names)
            })
            .as_ref()
    }

    /// The kind as cheaply as possible; `None` when only a full parse can tell.
    fn kind_hint(&self) -> Option<&str> {
        self.kind.get_or_init(|| peek_kind(self.bytes().ok()?, self.format)).as_deref()
    }

    fn spec(&self, trust: &TrustPolicy) -> &Result<Spec, Arc<SpecError>> {
        self.spec.get_or_init(|| {
            let bytes = self.bytes().map_err(|e| SpecError::Read {
                path: self.path.clone(),
                source: std::io::Error::new(e.kind(), e.to_string()),
            })?;
            if !trust.accept_untrusted
                && let Some(e) = self.untrusted(trust)
            {
                tracing::warn!(path = %self.path.display(), error = %e, "CDI spec rejected");
                return Err(Arc::new(SpecError::Untrusted(e.clone())));
            }
            let spec = parse_and_validate(bytes, self.format, &self.path);
            match &spec {
                Ok(s) => tracing::debug!(path = %self.path.display(), kind = %s.kind, devices = s.devices.len(), "CDI spec loaded"),
                // Once per file version and process: the file is set aside, so say why.
                Err(e) => tracing::warn!(path = %self.path.display(), error = %e, "CDI spec rejected"),
            }
            spec.map_err(Arc::new)
        })
    }
}

/// Reads only the top-level `kind` of a spec.
fn peek_kind(bytes: &[u8], format: Format) -> Option<String> {
    match format {
        Format::Json => {
            #[derive(Deserialize)]
            struct KindOnly {
                kind: Option<String>,
            }
            serde_json::from_slice::<KindOnly>(bytes).ok()?.kind
        }
        // A top-level `kind:` key sits at column 0 in block YAML; anything else (flow style, JSON
        // text in a .yaml file) falls back to a full parse.
        Format::Yaml => {
            let text = std::str::from_utf8(bytes).ok()?;
            let line = text.lines().find_map(|l| l.strip_prefix("kind:"))?;
            let value = line.split(" #").next()?.trim();
            let value = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value);
            let value = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')).unwrap_or(value);
            (!value.is_empty()).then(|| value.to_owned())
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    priority: usize,
    state: Arc<FileState>,
    /// The trust verdict on the folders the file is reached through, as of the last listing.
    untrusted_dir: Option<Arc<SpecError>>,
}

/// A snapshot of the CDI spec directories. Cheap to build; loads files on demand.
#[derive(Debug)]
pub struct Registry {
    dirs: Vec<PathBuf>,
    trust: TrustPolicy,
    files: Vec<Entry>,
    dir_errors: Vec<SpecError>,
}

/// A device found in the registry, with the spec that defines it.
#[derive(Debug, Clone, Copy)]
pub struct Resolved<'a> {
    /// The spec file.
    pub path: &'a Path,
    /// The whole spec (its `containerEdits` apply to a container getting any of its devices).
    pub spec: &'a Spec,
    /// The device.
    pub device: &'a Device,
    /// Why the spec file is not trusted, when the registry's policy accepts untrusted files and it
    /// is one; the caller reports each use.
    pub untrusted: Option<&'a UntrustedError>,
}

/// A device as `list` shows it.
#[derive(Debug, Clone)]
pub struct Listed<'a> {
    /// The qualified name.
    pub name: String,
    /// The spec file defining it (the winning one when several do).
    pub path: &'a Path,
}

/// Why a qualified name did not resolve. Messages name the directories and files involved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// No loadable spec has the kind.
    #[error(
        "unresolvable CDI device {}: no CDI spec for kind {kind} in {}{}",
        escape(name),
        PathList(dirs),
        Broken(broken)
    )]
    UnknownKind {
        /// The name asked for, `vendor/class=name`.
        name: String,
        /// Its kind.
        kind: Kind,
        /// Directories searched.
        dirs: Vec<PathBuf>,
        /// Spec files that could not be loaded and may have defined it.
        broken: Vec<Arc<SpecError>>,
    },
    /// Specs of the kind exist but none defines the device.
    #[error(
        "unresolvable CDI device {}: no device `{}` in {} (devices there: {}){}",
        escape(name),
        escape(device),
        PathList(files),
        Names(available),
        Broken(broken)
    )]
    UnknownDevice {
        /// The name asked for, `vendor/class=name`.
        name: String,
        /// The device part.
        device: String,
        /// Spec files of that kind.
        files: Vec<PathBuf>,
        /// Device names they do define.
        available: Vec<String>,
        /// Spec files that could not be loaded and may have defined it.
        broken: Vec<Arc<SpecError>>,
    },
    /// Two files of the same directory define the device.
    #[error(
        "ambiguous CDI device {}: defined by {} in the same directory; remove or rename one",
        escape(name),
        PathList(paths)
    )]
    Conflict {
        /// The name asked for, `vendor/class=name`.
        name: String,
        /// The files defining it.
        paths: Vec<PathBuf>,
    },
}

struct PathList<'a>(&'a [PathBuf]);

impl fmt::Display for PathList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", p.display())?;
        }
        Ok(())
    }
}

struct Names<'a>(&'a [String]);

impl fmt::Display for Names<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 12;
        f.write_str(&self.0.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", "))?;
        if self.0.len() > SHOWN {
            write!(f, ", ... {} more", self.0.len() - SHOWN)?;
        }
        Ok(())
    }
}

struct Broken<'a>(&'a [Arc<SpecError>]);

impl fmt::Display for Broken<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            f.write_str(if i == 0 { "; spec files that failed to load: " } else { "; " })?;
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl Registry {
    /// Lists `dirs` (lowest priority first), trusting only files of root and of this process's user
    /// ([`TrustPolicy::default`]). Never fails: unreadable directories are kept as errors.
    pub fn scan<P: AsRef<Path>>(dirs: &[P]) -> Registry {
        Registry::scan_with(dirs, TrustPolicy::default())
    }

    /// [`Registry::scan`] under `trust`.
    pub fn scan_with<P: AsRef<Path>>(dirs: &[P], trust: TrustPolicy) -> Registry {
        let dirs: Vec<PathBuf> = dirs.iter().map(|d| d.as_ref().to_owned()).collect();
        let mut registry = Registry { dirs, trust, files: Vec::new(), dir_errors: Vec::new() };
        registry.relist(&[]);
        registry
    }

    /// Relists the directories, keeping what was learned about files that did not change.
    pub fn refresh(&mut self) {
        let old = std::mem::take(&mut self.files);
        self.dir_errors.clear();
        self.relist(&old);
    }

    fn relist(&mut self, old: &[Entry]) {
        for (priority, dir) in self.dirs.iter().enumerate() {
            let read = match fs::read_dir(dir) {
                Ok(read) => read,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => {
                    self.dir_errors.push(SpecError::ReadDir { path: dir.clone(), source });
                    continue;
                }
            };
            // With whether the entry is a link (from the listing itself: no extra stat).
            let mut found: Vec<(PathBuf, Format, bool)> = read
                .filter_map(Result::ok)
                .filter_map(|e| {
                    let path = e.path();
                    let link = e.file_type().is_ok_and(|t| t.is_symlink());
                    Format::from_path(&path).map(|f| (path, f, link))
                })
                .collect();
            found.sort_by(|a, b| a.0.cmp(&b.0));
            // Folder verdicts of this listing: the spec folder's, and those of the folders links
            // lead to (few: each checked once).
            let mut folders: HashMap<PathBuf, Result<(), UntrustedError>> = HashMap::new();
            for (path, format, link) in found {
                // Follows symlinks, as runtimes do; directories named like specs are skipped.
                let Ok(meta) = fs::metadata(&path) else { continue };
                if !meta.is_file() {
                    continue;
                }
                let mut untrusted_dir = self.folder_verdict(&mut folders, dir).err();
                if untrusted_dir.is_none() && link {
                    untrusted_dir = match fs::canonicalize(&path) {
                        Ok(target) => match target.parent() {
                            Some(parent) => self.folder_verdict(&mut folders, parent).err(),
                            None => None,
                        },
                        Err(e) => Some(UntrustedError::Stat {
                            spec: path.clone(),
                            what: path.clone(),
                            message: e.to_string(),
                        }),
                    };
                }
                let untrusted_dir = untrusted_dir.map(|e| Arc::new(SpecError::Untrusted(e.for_spec(&path))));
                let identity = Identity {
                    dev: meta.dev(),
                    ino: meta.ino(),
                    size: meta.size(),
                    mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
                    ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
                };
                let reused = old.iter().find(|e| e.state.path == path && e.state.identity == identity);
                let state = match reused {
                    Some(e) => e.state.clone(),
                    None => Arc::new(FileState {
                        path,
                        format,
                        identity,
                        bytes: OnceLock::new(),
                        kind: OnceLock::new(),
                        untrusted: OnceLock::new(),
                        spec: OnceLock::new(),
                    }),
                };
                self.files.push(Entry { priority, state, untrusted_dir });
            }
        }
    }

    /// The trust verdict on `dir` and the folders above it, checked once per listing.
    fn folder_verdict(
        &self,
        folders: &mut HashMap<PathBuf, Result<(), UntrustedError>>,
        dir: &Path,
    ) -> Result<(), UntrustedError> {
        folders
            .entry(dir.to_owned())
            .or_insert_with(|| {
                crate::trust::check_dirs(dir, dir, &self.trust.owners)
                    .map_err(UntrustedError::with_host_names)
            })
            .clone()
    }

    /// The entry's spec, or why it is set aside (under this registry's trust policy).
    fn spec_of<'a>(&'a self, entry: &'a Entry) -> Result<&'a Spec, &'a Arc<SpecError>> {
        if let Some(e) = &entry.untrusted_dir
            && !self.trust.accept_untrusted
        {
            return Err(e);
        }
        entry.state.spec(&self.trust).as_ref()
    }

    /// Why a spec in use is not trusted (only when the policy accepts untrusted files).
    fn untrusted_of<'a>(&'a self, entry: &'a Entry) -> Option<&'a UntrustedError> {
        if !self.trust.accept_untrusted {
            return None;
        }
        match entry.untrusted_dir.as_deref() {
            Some(SpecError::Untrusted(e)) => Some(e),
            _ => entry.state.untrusted(&self.trust),
        }
    }

    /// The trust policy the registry reads under.
    pub fn trust(&self) -> &TrustPolicy {
        &self.trust
    }

    /// The directories, lowest priority first.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Finds the device `name`.
    pub fn resolve(&self, name: &QualifiedName) -> Result<Resolved<'_>, ResolveError> {
        let kind = name.kind();
        let mut of_kind: Vec<(&Entry, &Spec)> = Vec::new();
        let mut broken = Vec::new();
        for entry in &self.files {
            if entry.state.kind_hint().is_some_and(|k| k != kind.as_str()) {
                continue;
            }
            match self.spec_of(entry) {
                Ok(spec) if spec.kind == *kind => of_kind.push((entry, spec)),
                Ok(_) => {}
                Err(e) => broken.push(Arc::clone(e)),
            }
        }
        // Highest priority first; within a priority, any second definition is a conflict.
        let mut hits = of_kind.iter().rev().filter_map(|(e, s)| s.device(name.name()).map(|d| (*e, *s, d)));
        if let Some((entry, spec, device)) = hits.next() {
            let same_dir: Vec<PathBuf> = hits
                .take_while(|(e, _, _)| e.priority == entry.priority)
                .map(|(e, _, _)| e.state.path.clone())
                .collect();
            if !same_dir.is_empty() {
                let mut paths = vec![entry.state.path.clone()];
                paths.extend(same_dir);
                paths.sort();
                return Err(ResolveError::Conflict { name: name.to_string(), paths });
            }
            return Ok(Resolved {
                path: &entry.state.path,
                spec,
                device,
                untrusted: self.untrusted_of(entry),
            });
        }
        if of_kind.is_empty() {
            return Err(ResolveError::UnknownKind {
                name: name.to_string(),
                kind: kind.clone(),
                dirs: self.dirs.clone(),
                broken,
            });
        }
        Err(ResolveError::UnknownDevice {
            name: name.to_string(),
            device: name.name().to_owned(),
            files: of_kind.iter().map(|(e, _)| e.state.path.clone()).collect(),
            available: of_kind.iter().flat_map(|(_, s)| s.devices.iter().map(|d| d.name.clone())).collect(),
            broken,
        })
    }

    /// Every spec that loaded, with its file, in priority order (lowest first). Loads all files.
    pub fn specs(&self) -> impl Iterator<Item = (&Path, &Spec)> {
        self.files.iter().filter_map(|e| self.spec_of(e).ok().map(|s| (e.state.path.as_path(), s)))
    }

    /// Every device that resolves, by qualified name, with the file that wins for it; sorted by
    /// name. Devices in conflict are left out (see [`Registry::errors`] and [`Registry::resolve`]).
    pub fn devices(&self) -> Vec<Listed<'_>> {
        let mut out: Vec<Listed<'_>> = Vec::new();
        for (path, spec) in self.specs() {
            for device in &spec.devices {
                // Loaded specs passed validation, so the name is valid; a miss only skips, never panics.
                let Ok(name) = QualifiedName::new(spec.kind.clone(), &device.name) else { continue };
                if let Ok(resolved) = self.resolve(&name)
                    && resolved.path == path
                {
                    out.push(Listed { name: name.to_string(), path });
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out.dedup_by(|a, b| a.name == b.name);
        out
    }

    /// Every device name two files of one directory both define (so it resolves to nothing), with
    /// those files; sorted by name. The usual cause on a node moving from NVIDIA's toolkit: its
    /// `nvidia.yaml` and nvinject's spec side by side in one directory.
    pub fn conflicts(&self) -> Vec<ResolveError> {
        let mut names: Vec<QualifiedName> = Vec::new();
        for (_, spec) in self.specs() {
            names.extend(
                spec.devices.iter().filter_map(|d| QualifiedName::new(spec.kind.clone(), &d.name).ok()),
            );
        }
        names.sort_by_key(ToString::to_string);
        names.dedup();
        names
            .iter()
            .filter_map(|n| match self.resolve(n) {
                Err(e @ ResolveError::Conflict { .. }) => Some(e),
                _ => None,
            })
            .collect()
    }

    /// Every directory and file that could not be used, with why. Loads all files.
    pub fn errors(&self) -> Vec<&SpecError> {
        self.dir_errors
            .iter()
            .chain(self.files.iter().filter_map(|e| self.spec_of(e).err().map(|e| &**e)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_yaml(kind: &str, names: &[&str], marker: &str) -> String {
        let mut s = format!("cdiVersion: 0.5.0\nkind: {kind}\ndevices:\n");
        for n in names {
            s.push_str(&format!("- name: \"{n}\"\n  containerEdits:\n    env: [FROM={marker}]\n"));
        }
        s
    }

    fn env_of(r: &Resolved<'_>) -> String {
        r.device.container_edits.env[0].clone()
    }

    fn q(s: &str) -> QualifiedName {
        s.parse().unwrap()
    }

    #[test]
    fn later_directories_win_and_conflicts_in_one_directory_are_refused() {
        let etc = tempfile::tempdir().unwrap();
        let run = tempfile::tempdir().unwrap();
        fs::write(etc.path().join("nvidia.yaml"), spec_yaml("nvidia.com/gpu", &["0", "1"], "etc")).unwrap();
        fs::write(run.path().join("nvidia.com-gpu.json"), r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"0","containerEdits":{"env":["FROM=run"]}}]}"#).unwrap();
        fs::write(run.path().join("a-other.yaml"), spec_yaml("vendor.com/nic", &["0"], "nic")).unwrap();
        let reg = Registry::scan(&[etc.path(), run.path()]);
        assert_eq!(env_of(&reg.resolve(&q("nvidia.com/gpu=0")).unwrap()), "FROM=run");
        assert_eq!(env_of(&reg.resolve(&q("nvidia.com/gpu=1")).unwrap()), "FROM=etc");
        assert_eq!(env_of(&reg.resolve(&q("vendor.com/nic=0")).unwrap()), "FROM=nic");

        fs::write(run.path().join("z-dup.yaml"), spec_yaml("nvidia.com/gpu", &["0"], "dup")).unwrap();
        let reg = Registry::scan(&[etc.path(), run.path()]);
        let err = reg.resolve(&q("nvidia.com/gpu=0")).unwrap_err().to_string();
        assert!(err.contains("ambiguous CDI device nvidia.com/gpu=0"), "{err}");
        assert!(err.contains("nvidia.com-gpu.json") && err.contains("z-dup.yaml"), "{err}");
        let names: Vec<String> = reg.devices().into_iter().map(|d| d.name).collect();
        assert_eq!(names, ["nvidia.com/gpu=1", "vendor.com/nic=0"]);
        // What `list` and the installer report: the device left out, and both files.
        let conflicts: Vec<String> = reg.conflicts().iter().map(ToString::to_string).collect();
        assert_eq!(conflicts.len(), 1, "{conflicts:?}");
        assert!(
            conflicts[0].contains("nvidia.com/gpu=0") && conflicts[0].contains("z-dup.yaml"),
            "{conflicts:?}"
        );
        fs::remove_file(run.path().join("z-dup.yaml")).unwrap();
        assert!(
            Registry::scan(&[etc.path(), run.path()]).conflicts().is_empty(),
            "a later directory is no conflict"
        );
    }

    #[test]
    fn a_broken_file_of_another_vendor_hides_nothing_and_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a-broken.yaml"), "cdiVersion: 0.5.0\nkind: other.com/x\ndevices: [oops\n")
            .unwrap();
        fs::write(dir.path().join("b-bad.json"), "{ not json").unwrap();
        fs::write(dir.path().join("c-nvidia.yaml"), spec_yaml("nvidia.com/gpu", &["0"], "ok")).unwrap();
        fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
        fs::create_dir(dir.path().join("sub.yaml")).unwrap();
        let reg = Registry::scan(&[dir.path()]);
        assert_eq!(env_of(&reg.resolve(&q("nvidia.com/gpu=0")).unwrap()), "FROM=ok");
        let errors: Vec<String> = reg.errors().iter().map(|e| e.to_string()).collect();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains("a-broken.yaml"), "{errors:?}");
        assert!(errors[1].contains("b-bad.json"), "{errors:?}");

        // An unknown device names the specs searched, what they have, and the broken file whose
        // kind could not be read.
        let err = reg.resolve(&q("nvidia.com/gpu=7")).unwrap_err().to_string();
        assert!(
            err.contains("no device `7`")
                && err.contains("c-nvidia.yaml")
                && err.contains("devices there: 0")
        );
        assert!(err.contains("b-bad.json"), "{err}");
        let err = reg.resolve(&q("amd.com/gpu=0")).unwrap_err().to_string();
        assert!(err.contains("no CDI spec for kind amd.com/gpu in "), "{err}");
    }

    #[test]
    fn a_long_device_name_is_cut_in_the_message() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("nvidia.yaml"), spec_yaml("nvidia.com/gpu", &["0"], "ok")).unwrap();
        let reg = Registry::scan(&[dir.path()]);
        // A valid CDI name of 70,000 characters: the message stays short and says how long it was.
        let long = format!("nvidia.com/gpu={}", "a".repeat(70_000));
        let err = reg.resolve(&q(&long)).unwrap_err().to_string();
        assert!(err.len() < 2_000 && err.contains("[truncated: 70015 bytes in all]"), "{}", &err[..200]);
    }

    #[test]
    fn invalid_specs_are_refused_with_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let text = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n    - path: dev/nvidia0\n";
        fs::write(dir.path().join("nvidia.yaml"), text).unwrap();
        let reg = Registry::scan(&[dir.path()]);
        let err = reg.resolve(&q("nvidia.com/gpu=0")).unwrap_err().to_string();
        assert!(
            err.contains(
                "nvidia.yaml: invalid CDI spec: field `devices[0].containerEdits.deviceNodes[0].path`"
            ),
            "{err}"
        );
    }

    #[test]
    fn lookups_parse_only_files_of_the_kind_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a.yaml"), spec_yaml("other.com/x", &["0"], "x")).unwrap();
        fs::write(dir.path().join("b.json"), r#"{"kind":"other.com/y","cdiVersion":"0.5.0","devices":[]}"#)
            .unwrap();
        fs::write(dir.path().join("c.yaml"), spec_yaml("nvidia.com/gpu", &["0"], "ok")).unwrap();
        let reg = Registry::scan(&[dir.path()]);
        reg.resolve(&q("nvidia.com/gpu=0")).unwrap();
        let parsed: Vec<bool> = reg.files.iter().map(|e| e.state.spec.get().is_some()).collect();
        assert_eq!(parsed, [false, false, true]);
    }

    #[test]
    fn refresh_sees_new_and_changed_files_and_keeps_unchanged_ones() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a.yaml"), spec_yaml("nvidia.com/gpu", &["0"], "v1")).unwrap();
        let mut reg = Registry::scan(&[dir.path()]);
        assert_eq!(env_of(&reg.resolve(&q("nvidia.com/gpu=0")).unwrap()), "FROM=v1");
        let before = Arc::as_ptr(&reg.files[0].state);

        fs::write(dir.path().join("b.yaml"), spec_yaml("nvidia.com/gpu", &["1"], "new")).unwrap();
        reg.refresh();
        assert_eq!(Arc::as_ptr(&reg.files[0].state), before, "unchanged file re-parsed");
        assert_eq!(env_of(&reg.resolve(&q("nvidia.com/gpu=1")).unwrap()), "FROM=new");

        // A rewrite (new inode, as an atomic rename makes) is seen.
        let tmp = dir.path().join(".a.tmp");
        fs::write(&tmp, spec_yaml("nvidia.com/gpu", &["0"], "v2")).unwrap();
        fs::rename(&tmp, dir.path().join("a.yaml")).unwrap();
        reg.refresh();
        assert_eq!(env_of(&reg.resolve(&q("nvidia.com/gpu=0")).unwrap()), "FROM=v2");
    }

    #[test]
    fn hostile_files_of_other_vendors_are_skipped_and_of_our_kind_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let deep = format!("cdiVersion: 0.5.0\nkind: example.com/x\ndevices: {}\n", "[".repeat(300_000));
        fs::write(dir.path().join("a-deep.yaml"), &deep).unwrap();
        fs::write(dir.path().join("b-huge.yaml"), "kind: example.com/x\n".to_owned() + &"#".repeat(5 << 20))
            .unwrap();
        fs::write(dir.path().join("c-nvidia.yaml"), spec_yaml("nvidia.com/gpu", &["0"], "ok")).unwrap();
        let reg = Registry::scan(&[dir.path()]);
        assert_eq!(env_of(&reg.resolve(&q("nvidia.com/gpu=0")).unwrap()), "FROM=ok");
        let parsed: Vec<bool> = reg.files.iter().map(|e| e.state.spec.get().is_some()).collect();
        assert_eq!(parsed, [false, false, true]);

        fs::write(dir.path().join("d-evil.yaml"), deep.replace("example.com/x", "nvidia.com/gpu")).unwrap();
        let reg = Registry::scan(&[dir.path()]);
        let err = reg.resolve(&q("nvidia.com/gpu=1")).unwrap_err().to_string();
        assert!(err.contains("d-evil.yaml: field `devices`: nesting deeper than 64"), "{err}");
    }

    fn chmod(path: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Two spec folders as a node has them (0755, whatever the umask), our spec in the first.
    fn trusted_dirs() -> (tempfile::TempDir, tempfile::TempDir) {
        let (etc, run) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        chmod(etc.path(), 0o755);
        chmod(run.path(), 0o755);
        let ours = etc.path().join("nvidia.com-gpu.yaml");
        fs::write(&ours, spec_yaml("nvidia.com/gpu", &["0", "1"], "ours")).unwrap();
        chmod(&ours, 0o644);
        (etc, run)
    }

    #[test]
    fn an_untrusted_file_is_set_aside_and_named_where_it_would_have_mattered() {
        let (etc, run) = trusted_dirs();
        let evil = run.path().join("evil.yaml");
        fs::write(&evil, spec_yaml("nvidia.com/gpu", &["0", "9"], "evil")).unwrap();
        chmod(&evil, 0o666);
        let reg = Registry::scan(&[etc.path(), run.path()]);
        // The later directory would win for gpu=0: set aside, ours serves it, and nothing is hidden.
        let r = reg.resolve(&q("nvidia.com/gpu=0")).unwrap();
        assert_eq!((env_of(&r), r.untrusted), ("FROM=ours".into(), None));
        let err = reg.resolve(&q("nvidia.com/gpu=9")).unwrap_err().to_string();
        assert!(
            err.contains(&format!("untrusted CDI spec {}: the file is owned by", evil.display())),
            "{err}"
        );
        assert!(
            err.contains("mode 0666") && err.contains(&format!("chmod go-w {}", evil.display())),
            "{err}"
        );
        let errors: Vec<String> = reg.errors().iter().map(ToString::to_string).collect();
        assert!(errors.len() == 1 && errors[0].contains("evil.yaml"), "{errors:?}");
        assert_eq!(reg.devices().len(), 2, "only ours");

        // Accepted: it wins where it is defined, and says it is untrusted.
        let trust = TrustPolicy { accept_untrusted: true, ..TrustPolicy::default() };
        let reg = Registry::scan_with(&[etc.path(), run.path()], trust.clone());
        let r = reg.resolve(&q("nvidia.com/gpu=0")).unwrap();
        assert_eq!(env_of(&r), "FROM=evil");
        assert!(r.untrusted.is_some_and(|u| u.to_string().contains("0666")), "{:?}", r.untrusted);
        assert!(reg.errors().is_empty());
        assert_eq!(reg.resolve(&q("nvidia.com/gpu=1")).unwrap().untrusted, None);

        // A chmod alone (same content, same mtime) is seen at the next refresh.
        chmod(&evil, 0o644);
        let mut reg = Registry::scan(&[etc.path(), run.path()]);
        assert_eq!(env_of(&reg.resolve(&q("nvidia.com/gpu=0")).unwrap()), "FROM=evil");
        chmod(&evil, 0o646);
        reg.refresh();
        assert_eq!(env_of(&reg.resolve(&q("nvidia.com/gpu=0")).unwrap()), "FROM=ours");
    }

    #[test]
    fn a_folder_others_may_write_makes_every_file_in_it_untrusted() {
        let (etc, run) = trusted_dirs();
        let theirs = run.path().join("dropped.yaml");
        fs::write(&theirs, spec_yaml("nvidia.com/gpu", &["0"], "dropped")).unwrap();
        chmod(&theirs, 0o644);
        let mut reg = Registry::scan(&[etc.path(), run.path()]);
        assert_eq!(env_of(&reg.resolve(&q("nvidia.com/gpu=0")).unwrap()), "FROM=dropped", "control");
        for mode in [0o777, 0o1777, 0o757] {
            chmod(run.path(), mode);
            reg.refresh();
            assert_eq!(env_of(&reg.resolve(&q("nvidia.com/gpu=0")).unwrap()), "FROM=ours", "{mode:o}");
            let errors: Vec<String> = reg.errors().iter().map(ToString::to_string).collect();
            let want = format!("its folder {} is owned by", run.path().display());
            assert!(errors.len() == 1 && errors[0].contains(&want), "{mode:o}: {errors:?}");
            assert!(errors[0].contains(&format!("fix: `chmod go-w {}`", run.path().display())), "{errors:?}");
        }
        // A sticky folder above the spec folder is fine (as /tmp is above these).
        chmod(run.path(), 0o755);
        reg.refresh();
        assert_eq!(env_of(&reg.resolve(&q("nvidia.com/gpu=0")).unwrap()), "FROM=dropped");

        // A file linked in from a folder others may write is judged there.
        let open = tempfile::tempdir().unwrap();
        chmod(open.path(), 0o777);
        let target = open.path().join("t.yaml");
        fs::write(&target, spec_yaml("nvidia.com/gpu", &["5"], "linked")).unwrap();
        chmod(&target, 0o644);
        std::os::unix::fs::symlink(&target, etc.path().join("linked.yaml")).unwrap();
        reg.refresh();
        let err = reg.resolve(&q("nvidia.com/gpu=5")).unwrap_err().to_string();
        assert!(err.contains(&format!("its folder {}", open.path().display())), "{err}");
        chmod(open.path(), 0o755);
        reg.refresh();
        assert_eq!(env_of(&reg.resolve(&q("nvidia.com/gpu=5")).unwrap()), "FROM=linked");
    }

    #[test]
    #[ignore = "needs root"]
    fn a_file_of_another_user_is_untrusted_naming_the_owner() {
        nvinject_test_support::require_root("chown");
        let (etc, run) = trusted_dirs();
        let theirs = run.path().join("nobody.yaml");
        fs::write(&theirs, spec_yaml("nvidia.com/gpu", &["0", "7"], "nobody")).unwrap();
        chmod(&theirs, 0o644);
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let reg = Registry::scan(&[etc.path(), run.path()]);
        assert_eq!(env_of(&reg.resolve(&q("nvidia.com/gpu=0")).unwrap()), "FROM=ours");
        let err = reg.resolve(&q("nvidia.com/gpu=7")).unwrap_err().to_string();
        assert!(err.contains("owned by uid 65534") && err.contains("not owned by root"), "{err}");
        assert!(err.contains(&format!("chown root:root {}", theirs.display())), "{err}");
        // Control: root's again, it is used.
        std::os::unix::fs::chown(&theirs, Some(0), Some(0)).unwrap();
        let reg = Registry::scan(&[etc.path(), run.path()]);
        assert_eq!(env_of(&reg.resolve(&q("nvidia.com/gpu=7")).unwrap()), "FROM=nobody");
    }

    #[test]
    fn missing_directories_are_not_errors() {
        let reg = Registry::scan(&["/nonexistent/nvinject-cdi-test"]);
        assert!(reg.errors().is_empty());
        assert!(matches!(reg.resolve(&q("nvidia.com/gpu=0")), Err(ResolveError::UnknownKind { .. })));
    }

    #[test]
    fn yaml_kind_peek_handles_quotes_and_comments() {
        let peek = |t: &str| peek_kind(t.as_bytes(), Format::Yaml);
        assert_eq!(peek("cdiVersion: 0.5.0\nkind: \"nvidia.com/gpu\"\n").as_deref(), Some("nvidia.com/gpu"));
        assert_eq!(peek("kind: 'a.com/b' # comment\n").as_deref(), Some("a.com/b"));
        assert_eq!(peek("{kind: a.com/b}").as_deref(), None);
    }
}
