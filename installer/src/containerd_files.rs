//! Reads containerd's configuration from the host: the main file and every file its `imports`
//! name, transitively and in containerd's load order, as text for the pure planner
//! ([`crate::containerd`]). This is the only place the installer (and `doctor`) reads them; globs
//! are expanded here, inside the host root, the way containerd expands them.

use crate::containerd::imports::{self, ImportTarget};
use crate::containerd::{ConfigSources, ContainerdVersion, PlanError, SourceFile, import_targets};
use crate::error::{Error, Result};
use crate::paths::{CONFIG_LIMIT, HostRoot, host_join};

/// Reads containerd's main config and the files it imports (transitively, in load order),
/// skipping `drop_in`.
pub fn read_sources(
    root: &HostRoot,
    main_path: &str,
    drop_in: &str,
    containerd: &ContainerdVersion,
) -> Result<ConfigSources> {
    let main = match root.read(main_path, CONFIG_LIMIT)? {
        None => None,
        Some(bytes) => Some(String::from_utf8(bytes).map_err(|_| {
            Error::Plan(PlanError::Parse { path: main_path.to_owned(), message: "not UTF-8 text".into() })
        })?),
    };
    let mut sources = ConfigSources {
        main_path: main_path.to_owned(),
        main: main.clone(),
        imported: Vec::new(),
        imported_before_drop_in: 0,
    };
    let mut loaded = vec![main_path.to_owned()];
    let mut pending: Vec<(String, String)> =
        main.map(|t| vec![(main_path.to_owned(), t)]).unwrap_or_default();
    // Where containerd will load the drop-in: files are read in load order (breadth first, as
    // containerd does), so that is the number read when an entry names it.
    let mut drop_in_at: Option<usize> = None;
    while !pending.is_empty() {
        let (path, text) = pending.remove(0);
        for target in import_targets(&path, &text, containerd)? {
            let files = match &target {
                ImportTarget::File(f) => vec![f.clone()],
                ImportTarget::Glob(pattern) => {
                    let mut files = expand_glob(root, pattern)?;
                    // On a first install the drop-in does not exist yet; the glob will match it.
                    if !drop_in.is_empty() && target.covers(drop_in) && !files.iter().any(|f| f == drop_in) {
                        let at = files.iter().position(|f| f.as_str() > drop_in).unwrap_or(files.len());
                        files.insert(at, drop_in.to_owned());
                    }
                    files
                }
            };
            for file in files {
                if file == drop_in {
                    drop_in_at.get_or_insert(sources.imported.len());
                    continue;
                }
                if loaded.contains(&file) {
                    continue;
                }
                loaded.push(file.clone());
                // containerd fails on a missing plain import; that is the operator's to fix, and
                // planning around it is still right, so only note it. A glob entry exists by
                // definition: one that cannot be read (a dangling link) would make containerd fail
                // to start, so nothing is changed.
                // A refusal (a directory, FIFO or device, an oversized file: `imports = [""]` names
                // the config's own directory) names the importing file and its entry too.
                let read = root.read(&file, CONFIG_LIMIT).map_err(|e| Error::Source {
                    path: root.shown(&path),
                    message: format!(
                        "`imports` entry {} names a file that cannot be read: {e}",
                        target_text(&target)
                    ),
                })?;
                let Some(bytes) = read else {
                    if matches!(target, ImportTarget::Glob(_)) {
                        return Err(Error::Source {
                            path: root.shown(&file),
                            message: format!(
                                "matches containerd's import {} but is a link to a missing file (containerd \
                                 would fail to load it): remove the link or restore its target",
                                target_text(&target)
                            ),
                        });
                    }
                    tracing::warn!(file = %file, "imported containerd config file does not exist");
                    continue;
                };
                // Strict, like the main file: a lossy copy would put replacement characters into
                // the drop-in, which repeats the CRI section on containerd 1.x.
                let text = String::from_utf8(bytes).map_err(|_| {
                    Error::Plan(PlanError::Parse { path: file.clone(), message: "not UTF-8 text".into() })
                })?;
                sources.imported.push(SourceFile { path: file.clone(), text: text.clone() });
                pending.push((file, text));
            }
        }
        if path == main_path {
            // Not imported yet: the entry we add goes after the main file's others.
            drop_in_at.get_or_insert(sources.imported.len());
        }
    }
    sources.imported_before_drop_in = drop_in_at.unwrap_or(sources.imported.len());
    Ok(sources)
}

fn target_text(target: &ImportTarget) -> &str {
    match target {
        ImportTarget::File(f) | ImportTarget::Glob(f) => f,
    }
}

/// Expands an absolute glob pattern on the host, sorted like Go's `filepath.Glob` (which, like
/// containerd, lists entries without following them: a dangling link matches). Every directory is
/// listed inside the host root.
fn expand_glob(root: &HostRoot, pattern: &str) -> Result<Vec<String>> {
    let mut matches = vec!["/".to_owned()];
    for component in pattern.split('/').filter(|c| !c.is_empty()) {
        let mut next = Vec::new();
        for base in &matches {
            let has_meta = component.contains(['*', '?', '[']);
            if !has_meta {
                let candidate = host_join(base, component);
                if root.symlink_metadata(&candidate)?.is_some() {
                    next.push(candidate);
                }
                continue;
            }
            // A base that is missing or not a directory matches nothing, as in Go.
            let entries = match root.read_dir(base) {
                Ok(Some(entries)) => entries,
                Ok(None) => continue,
                Err(Error::HostFile { source, .. })
                    if source.source.raw_os_error() == Some(nix::errno::Errno::ENOTDIR as i32) =>
                {
                    continue;
                }
                Err(e) => return Err(e),
            };
            for (name, _) in entries {
                if imports::component_match(component, &name) {
                    next.push(host_join(base, &name));
                }
            }
        }
        matches = next;
    }
    Ok(matches)
}
