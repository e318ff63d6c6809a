//! Other tools' CDI specs that define nvinject's devices.
//!
//! A node moving from NVIDIA's toolkit may still have its spec beside ours: the toolkit package's
//! `nvidia-cdi-refresh` units write `/var/run/cdi/nvidia.yaml` (kind `nvidia.com/gpu`), and
//! NVIDIA's guide has users write `/etc/cdi/nvidia.yaml`. Two files of one directory defining a
//! device make it resolve to nothing, for containerd's CDI and for our shim alike; a file in a
//! directory read after ours wins over ours. Install warns about such a file and goes on (the
//! node works for every device that does not clash, and the operator may be removing NVIDIA's
//! pieces in the same rollout); doctor fails on it.
//!
//! Data flows one way: [`scan`] reads the directories inside the host root (links followed
//! there only, FIFOs and devices refused without blocking, sizes and counts bounded), [`find`]
//! judges what was read, purely. Nothing here can fail an install: a file that cannot be read or
//! parsed is reported as not checked.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use nvinject_cdi::Format;
use nvinject_fsio::root::EntryType;
use nvinject_shim_config::Config;

use crate::containerd::EffectiveCdi;
use crate::paths::{FILE_LIMIT, HostRoot, host_join, split};

/// The most spec files read from one directory; the rest are reported as not checked (a CDI
/// directory holds a handful).
pub const MAX_FILES_PER_DIR: usize = 64;

/// Devices named in one message before "and N more".
const SHOWN_DEVICES: usize = 8;

/// A program that resolves CDI names and the directories it reads, lowest priority first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reader {
    /// Who reads them, for messages.
    pub name: String,
    /// Host paths, lowest priority first.
    pub dirs: Vec<String>,
}

/// The shim as a reader: the spec dirs of its configuration (`config_text`, the file at
/// `config_path` on the host), or, when there is none or it does not parse, `written_dirs` (the
/// dirs the installer writes into it).
pub fn shim_reader(config_text: Option<&str>, config_path: &Path, written_dirs: Vec<PathBuf>) -> Reader {
    let parsed = config_text.and_then(|t| Config::parse(t, config_path).ok());
    let dirs = match parsed {
        Some(config) => config.cdi.spec_dirs,
        None => written_dirs,
    };
    Reader {
        name: "nvinject's shim".into(),
        dirs: dirs.iter().map(|d| d.to_string_lossy().into_owned()).collect(),
    }
}

/// containerd's own CDI as a reader, when it is on.
pub fn containerd_reader(cdi: Option<&EffectiveCdi>) -> Option<Reader> {
    let cdi = cdi.filter(|c| c.enabled)?;
    Some(Reader { name: "containerd's CDI".into(), dirs: cdi.spec_dirs.clone() })
}

/// Where a foreign spec's directory stands relative to nvinject's spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// nvinject's spec's own directory: a device both define resolves to nothing.
    SameDir,
    /// A directory these readers read after nvinject's: its definition wins over ours.
    After(Vec<String>),
}

/// A spec file of another tool, as read under the host root.
#[derive(Debug)]
pub struct Candidate {
    /// Host path.
    pub path: String,
    /// Its directory's place relative to ours.
    pub placement: Placement,
    /// Its bytes, or why they were not read.
    pub read: Result<Vec<u8>, String>,
}

/// What [`scan`] read: every candidate, and what it could not look at (with why).
#[derive(Debug, Default)]
pub struct Scan {
    /// Spec files other than ours, in directories where they matter.
    pub candidates: Vec<Candidate>,
    /// Directories that could not be listed, and files left unread past the count limit.
    pub skipped: Vec<Unchecked>,
}

/// A foreign spec that defines devices nvinject's spec defines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clash {
    /// Host path of the foreign spec.
    pub path: String,
    /// Where it is.
    pub placement: Placement,
    /// The devices both define, qualified (`nvidia.com/gpu=0`), sorted.
    pub devices: Vec<String>,
}

/// A file or directory that could not be checked, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unchecked {
    /// Host path.
    pub path: String,
    /// Why.
    pub why: String,
}

/// What [`find`] concluded.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Findings {
    /// Foreign specs defining our devices.
    pub clashes: Vec<Clash>,
    /// What could not be checked.
    pub unchecked: Vec<Unchecked>,
}

/// Lists, inside `root`, the directories where another spec matters to `our_spec` (its own, and
/// those a reader reads after it) and reads the spec files there other than ours. Never fails: a
/// directory or file that cannot be used is recorded with why.
pub fn scan(root: &HostRoot, our_spec: &str, readers: &[Reader]) -> Scan {
    let (our_dir, our_name) = split(our_spec);
    let ours = crate::cdi::resolved(root, &our_dir);
    // (resolved dir, host path as configured, placement), in the order first met.
    let mut dirs: Vec<(String, String, Placement)> =
        vec![(ours.clone(), our_dir.clone(), Placement::SameDir)];
    for reader in readers {
        let resolved: Vec<String> = reader.dirs.iter().map(|d| crate::cdi::resolved(root, d)).collect();
        // A reader that does not read our directory never sees our spec (install warns about that
        // separately), so nothing of its can clash with it.
        let Some(at) = resolved.iter().rposition(|d| *d == ours) else { continue };
        for (dir, shown) in resolved.iter().zip(&reader.dirs).skip(at + 1) {
            if *dir == ours {
                continue;
            }
            match dirs.iter_mut().find(|(d, _, _)| d == dir) {
                Some((_, _, Placement::After(names))) if !names.contains(&reader.name) => {
                    names.push(reader.name.clone())
                }
                Some(_) => {}
                None => dirs.push((dir.clone(), shown.clone(), Placement::After(vec![reader.name.clone()]))),
            }
        }
    }
    let mut out = Scan::default();
    for (_, dir, placement) in dirs {
        let entries = match root.read_dir(&dir) {
            Ok(Some(entries)) => entries,
            Ok(None) => continue,
            Err(e) => {
                out.skipped.push(Unchecked { path: dir, why: format!("cannot be listed: {e}") });
                continue;
            }
        };
        let names: Vec<String> = entries
            .into_iter()
            // Subdirectories are never read by CDI runtimes.
            .filter(|(name, kind)| *kind != EntryType::Dir && Format::from_path(Path::new(name)).is_some())
            .map(|(name, _)| name)
            .filter(|name| !(placement == Placement::SameDir && *name == our_name))
            .collect();
        if names.len() > MAX_FILES_PER_DIR {
            out.skipped.push(Unchecked {
                path: dir.clone(),
                why: format!(
                    "holds {} spec files; the first {MAX_FILES_PER_DIR} were checked, the rest were not",
                    names.len()
                ),
            });
        }
        for name in names.into_iter().take(MAX_FILES_PER_DIR) {
            let path = host_join(&dir, &name);
            let read = match root.read(&path, FILE_LIMIT) {
                Ok(Some(bytes)) => Ok(bytes),
                Ok(None) => Err("it is a link to nothing inside the host root".to_owned()),
                Err(e) => Err(e.to_string()),
            };
            out.candidates.push(Candidate { path, placement: placement.clone(), read });
        }
    }
    out
}

/// nvinject's spec's kind and device names, from its text; `None` when it does not parse as a
/// spec (then there is nothing to compare with).
pub fn our_devices(spec: &[u8], path: &str) -> Option<(String, BTreeSet<String>)> {
    let format = Format::from_path(Path::new(path)).unwrap_or(Format::Json);
    let spec = nvinject_cdi::codec::parse(spec, format, Path::new(path)).ok()?;
    Some((spec.kind.to_string(), spec.devices.iter().map(|d| d.name.clone()).collect()))
}

/// Judges what [`scan`] read against nvinject's spec (`kind` and its device names): a candidate
/// of the same kind that CDI runtimes would load and that defines one of our names clashes. A
/// candidate that cannot be read or is not a valid spec (runtimes set it aside, so it clashes
/// with nothing) is reported as not checked.
pub fn find(kind: &str, ours: &BTreeSet<String>, scan: &Scan) -> Findings {
    let mut findings = Findings { unchecked: scan.skipped.clone(), ..Findings::default() };
    for candidate in &scan.candidates {
        let bytes = match &candidate.read {
            Ok(bytes) => bytes,
            Err(why) => {
                findings.unchecked.push(Unchecked { path: candidate.path.clone(), why: why.clone() });
                continue;
            }
        };
        let path = PathBuf::from(&candidate.path);
        let format = Format::from_path(&path).unwrap_or(Format::Json);
        let spec = match nvinject_cdi::parse_and_validate(bytes, format, &path) {
            Ok(spec) => spec,
            Err(e) => {
                findings.unchecked.push(Unchecked {
                    path: candidate.path.clone(),
                    why: format!("not a valid CDI spec, so CDI runtimes ignore it: {e}"),
                });
                continue;
            }
        };
        if spec.kind.as_str() != kind {
            continue;
        }
        let devices: Vec<String> = spec
            .devices
            .iter()
            .filter(|d| ours.contains(&d.name))
            .map(|d| format!("{kind}={}", d.name))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if !devices.is_empty() {
            findings.clashes.push(Clash {
                path: candidate.path.clone(),
                placement: candidate.placement.clone(),
                devices,
            });
        }
    }
    findings
}

impl Clash {
    /// The finding in words: the file, the devices, what it does to them.
    pub fn describe(&self, our_spec: &str) -> String {
        let mut devices = self.devices.iter().take(SHOWN_DEVICES).cloned().collect::<Vec<_>>().join(", ");
        if self.devices.len() > SHOWN_DEVICES {
            devices.push_str(&format!(" and {} more", self.devices.len() - SHOWN_DEVICES));
        }
        match &self.placement {
            Placement::SameDir => format!(
                "{} defines {devices}, which nvinject's spec {our_spec} defines too, in the same directory: \
                 CDI resolves none of them (\"ambiguous CDI device\"), so containers asking for them fail",
                self.path
            ),
            Placement::After(readers) => format!(
                "{} defines {devices}, which nvinject's spec {our_spec} defines too, in a directory {} \
                 after nvinject's: those devices come from {} instead of nvinject's spec",
                self.path,
                match readers.as_slice() {
                    [one] => format!("{one} reads"),
                    many => format!("{} read", many.join(" and ")),
                },
                self.path
            ),
        }
    }
}

/// What to do about `clashes`: remove the files and what writes them, with the names NVIDIA uses.
pub fn fix(clashes: &[Clash]) -> String {
    let files: Vec<&str> = clashes.iter().map(|c| c.path.as_str()).collect();
    format!(
        "delete {} and turn off what writes it: NVIDIA's toolkit package rewrites /var/run/cdi/nvidia.yaml on \
         driver changes (`systemctl disable --now nvidia-cdi-refresh.path nvidia-cdi-refresh.service`), the GPU \
         Operator's toolkit container writes one when CDI_ENABLED is set with CDI_KIND=nvidia.com/gpu (turn the \
         toolkit off: toolkit.enabled=false); to keep a spec of NVIDIA's, move it to a directory read before \
         nvinject's (/etc/cdi when nvinject's is /var/run/cdi)",
        files.join(", ")
    )
}

/// Install's warnings for `findings`, one per clash and one per file not checked.
pub fn warnings(findings: &Findings, our_spec: &str) -> Vec<String> {
    let mut out: Vec<String> = findings
        .clashes
        .iter()
        .map(|c| format!("{}; fix: {}", c.describe(our_spec), fix(std::slice::from_ref(c))))
        .collect();
    out.extend(findings.unchecked.iter().map(|u| {
        format!("{}: not checked for CDI devices that clash with nvinject's spec: {}", u.path, u.why)
    }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spec of `kind` defining `names`, as JSON text.
    fn spec(kind: &str, names: &[&str]) -> Vec<u8> {
        let devices: Vec<_> = names
            .iter()
            .map(|n| serde_json::json!({"name": n, "containerEdits": {"env": [format!("DEV={n}")]}}))
            .collect();
        serde_json::json!({"cdiVersion": "0.5.0", "kind": kind, "devices": devices}).to_string().into_bytes()
    }

    fn candidate(path: &str, placement: Placement, read: Result<Vec<u8>, String>) -> Candidate {
        Candidate { path: path.into(), placement, read }
    }

    fn ours() -> BTreeSet<String> {
        ["0", "1", "all", "GPU-1"].iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_foreign_spec_of_our_kind_clashes_on_the_names_both_define() {
        let scan = Scan {
            candidates: vec![
                candidate(
                    "/var/run/cdi/nvidia.yaml",
                    Placement::SameDir,
                    Ok(spec("nvidia.com/gpu", &["0", "all", "5"])),
                ),
                // Another kind: the device plugin's or the Operator's management spec.
                candidate(
                    "/var/run/cdi/management.nvidia.com-gpu.yaml",
                    Placement::SameDir,
                    Ok(spec("management.nvidia.com/gpu", &["all"])),
                ),
                // Our kind, none of our names.
                candidate("/var/run/cdi/extra.json", Placement::SameDir, Ok(spec("nvidia.com/gpu", &["9"]))),
                candidate(
                    "/run/later/nvidia.json",
                    Placement::After(vec!["containerd's CDI".into()]),
                    Ok(spec("nvidia.com/gpu", &["1"])),
                ),
            ],
            skipped: Vec::new(),
        };
        let found = find("nvidia.com/gpu", &ours(), &scan);
        assert_eq!(
            found.clashes,
            [
                Clash {
                    path: "/var/run/cdi/nvidia.yaml".into(),
                    placement: Placement::SameDir,
                    devices: vec!["nvidia.com/gpu=0".into(), "nvidia.com/gpu=all".into()],
                },
                Clash {
                    path: "/run/later/nvidia.json".into(),
                    placement: Placement::After(vec!["containerd's CDI".into()]),
                    devices: vec!["nvidia.com/gpu=1".into()],
                },
            ]
        );
        assert!(found.unchecked.is_empty(), "{:?}", found.unchecked);
        // Another kind of ours: nothing clashes with it.
        assert!(find("example.com/gpu", &ours(), &scan).clashes.is_empty());
    }

    #[test]
    fn unreadable_and_invalid_specs_are_reported_not_checked() {
        let scan = Scan {
            candidates: vec![
                candidate(
                    "/var/run/cdi/fifo.json",
                    Placement::SameDir,
                    Err("is a FIFO, not a regular file".into()),
                ),
                candidate(
                    "/var/run/cdi/broken.yaml",
                    Placement::SameDir,
                    Ok(b"kind: [nvidia.com/gpu\n".to_vec()),
                ),
                // Parses, but a device name CDI refuses: runtimes set the whole file aside.
                candidate(
                    "/var/run/cdi/bad.json",
                    Placement::SameDir,
                    Ok(spec("nvidia.com/gpu", &["0", "bad name"])),
                ),
            ],
            skipped: vec![Unchecked { path: "/etc/cdi".into(), why: "cannot be listed: EACCES".into() }],
        };
        let found = find("nvidia.com/gpu", &ours(), &scan);
        assert!(found.clashes.is_empty(), "{:?}", found.clashes);
        let paths: Vec<&str> = found.unchecked.iter().map(|u| u.path.as_str()).collect();
        assert_eq!(
            paths,
            ["/etc/cdi", "/var/run/cdi/fifo.json", "/var/run/cdi/broken.yaml", "/var/run/cdi/bad.json"]
        );
        assert!(found.unchecked[1].why.contains("FIFO"), "{:?}", found.unchecked);
        assert!(found.unchecked[2].why.contains("not a valid CDI spec"), "{:?}", found.unchecked);
        let warnings = warnings(&found, "/var/run/cdi/nvidia.com-gpu.json");
        assert_eq!(warnings.len(), 4);
        assert!(warnings[1].starts_with("/var/run/cdi/fifo.json: not checked"), "{warnings:?}");
    }

    #[test]
    fn messages_name_the_file_the_devices_and_the_fix() {
        let same = Clash {
            path: "/var/run/cdi/nvidia.yaml".into(),
            placement: Placement::SameDir,
            devices: (0..10).map(|i| format!("nvidia.com/gpu={i}")).collect(),
        };
        let text = same.describe("/var/run/cdi/nvidia.com-gpu.json");
        assert!(text.starts_with("/var/run/cdi/nvidia.yaml defines nvidia.com/gpu=0, "), "{text}");
        assert!(text.contains("nvidia.com/gpu=7 and 2 more"), "{text}");
        assert!(
            text.contains("/var/run/cdi/nvidia.com-gpu.json") && text.contains("resolves none"),
            "{text}"
        );
        let later = Clash {
            placement: Placement::After(vec!["nvinject's shim".into(), "containerd's CDI".into()]),
            ..same.clone()
        };
        let text = later.describe("/etc/cdi/nvidia.com-gpu.json");
        assert!(text.contains("nvinject's shim and containerd's CDI read after nvinject's"), "{text}");
        let fix = fix(&[same]);
        assert!(fix.starts_with("delete /var/run/cdi/nvidia.yaml "), "{fix}");
        for name in
            ["nvidia-cdi-refresh.path", "nvidia-cdi-refresh.service", "CDI_ENABLED", "toolkit.enabled=false"]
        {
            assert!(fix.contains(name), "{name}: {fix}");
        }
    }

    #[test]
    fn our_devices_are_read_from_our_spec() {
        let (kind, names) =
            our_devices(&spec("nvidia.com/gpu", &["0", "all"]), "/x/nvidia.com-gpu.json").unwrap();
        assert_eq!(kind, "nvidia.com/gpu");
        assert_eq!(names.into_iter().collect::<Vec<_>>(), ["0", "all"]);
        assert!(our_devices(b"not json", "/x/nvidia.com-gpu.json").is_none());
    }

    fn reader(name: &str, dirs: &[&str]) -> Reader {
        Reader { name: name.into(), dirs: dirs.iter().map(|d| (*d).to_owned()).collect() }
    }

    #[test]
    fn the_scan_reads_our_dir_and_the_dirs_read_after_it_only() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for dir in ["etc/cdi", "var/run/cdi", "opt/cdi/sub.json"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        std::fs::write(root.join("etc/cdi/nvidia.yaml"), "before").unwrap();
        std::fs::write(root.join("var/run/cdi/nvidia.com-gpu.json"), "ours").unwrap();
        std::fs::write(root.join("var/run/cdi/nvidia.yaml"), "same").unwrap();
        std::fs::write(root.join("var/run/cdi/notes.txt"), "not a spec").unwrap();
        std::fs::write(root.join("opt/cdi/a.json"), "after").unwrap();
        let host = HostRoot::new(root);
        let readers = [
            reader("nvinject's shim", &["/etc/cdi", "/var/run/cdi"]),
            reader("containerd's CDI", &["/etc/cdi", "/var/run/cdi", "/opt/cdi"]),
            // Never reads our directory: its order says nothing.
            reader("other", &["/var/run/other", "/etc/cdi"]),
        ];
        let scan = scan(&host, "/var/run/cdi/nvidia.com-gpu.json", &readers);
        type Seen<'a> = (&'a str, &'a Placement, Result<&'a [u8], &'a String>);
        let got: Vec<Seen<'_>> = scan
            .candidates
            .iter()
            .map(|c| (c.path.as_str(), &c.placement, c.read.as_ref().map(Vec::as_slice)))
            .collect();
        let after = Placement::After(vec!["containerd's CDI".into()]);
        assert_eq!(
            got,
            [
                ("/var/run/cdi/nvidia.yaml", &Placement::SameDir, Ok(&b"same"[..])),
                ("/opt/cdi/a.json", &after, Ok(&b"after"[..])),
            ]
        );
        assert!(scan.skipped.is_empty(), "{:?}", scan.skipped);
    }

    #[test]
    fn the_scan_stops_at_the_file_count_limit() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("cdi")).unwrap();
        for i in 0..MAX_FILES_PER_DIR + 3 {
            std::fs::write(tmp.path().join(format!("cdi/{i:03}.json")), "{}").unwrap();
        }
        let scan = scan(&HostRoot::new(tmp.path()), "/cdi/nvidia.com-gpu.json", &[]);
        assert_eq!(scan.candidates.len(), MAX_FILES_PER_DIR);
        assert_eq!(scan.skipped.len(), 1);
        assert!(scan.skipped[0].why.contains(&format!("holds {} spec files", MAX_FILES_PER_DIR + 3)));
    }
}
