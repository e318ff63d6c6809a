//! containerd's configuration as containerd will run with it: the files as found
//! ([`ConfigSources`]), parsed, their `version` header, and the effective CRI section once every
//! file is loaded (on 1.x the last file's section replaces the others', on 2.x sections merge key
//! by key), with the runtime entry and the CDI settings read from it. The planner ([`super::plan`])
//! and `doctor` both read the configuration through this model; nothing here decides a change.

use toml_edit::{DocumentMut, Item, Table, Value};

use super::config_version::ConfigVersion;
use super::error::PlanError;
use super::imports::{self, ImportTarget};
use super::version::ContainerdVersion;

/// One config file: its host path and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// Absolute path on the host (as containerd sees it, without any host-root prefix).
    pub path: String,
    /// The file's content.
    pub text: String,
}

/// containerd's configuration as found on the host.
#[derive(Debug, Clone, Default)]
pub struct ConfigSources {
    /// Host path of the main file (`/etc/containerd/config.toml`).
    pub main_path: String,
    /// The main file's text; `None` when it does not exist (containerd runs on defaults).
    pub main: Option<String>,
    /// Files the main file imports, transitively, in containerd's load order, without our
    /// drop-in.
    pub imported: Vec<SourceFile>,
    /// How many of `imported` (a prefix) containerd loads before our drop-in once it is imported
    /// (where an existing entry or glob puts it, else after the main file's other imports); it
    /// loads the rest after it.
    pub imported_before_drop_in: usize,
}

/// A parsed config file.
pub(super) struct Parsed {
    pub(super) path: String,
    pub(super) doc: DocumentMut,
}

/// The runtime entry containerd will use for `handler` once every file is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectiveRuntime {
    /// `runtime_type`.
    pub runtime_type: Option<String>,
    /// `runtime_path`.
    pub runtime_path: Option<String>,
    /// `container_annotations`.
    pub container_annotations: Vec<String>,
    /// `pod_annotations`.
    pub pod_annotations: Vec<String>,
    /// Host path of the file the entry came from (the last definition).
    pub defined_in: String,
}

/// Finds the effective runtime entry for `handler` across the main file and its imports (which,
/// for this function, include our drop-in). Used by `doctor`.
pub fn effective_runtime(
    sources: &ConfigSources,
    containerd: &ContainerdVersion,
    handler: &str,
) -> Result<Option<EffectiveRuntime>, PlanError> {
    let main = match &sources.main {
        Some(text) => parse(&sources.main_path, text)?,
        None => return Ok(None),
    };
    let (version, _) = detect_version(&main)?;
    let imported = sources.imported.iter().map(|f| parse(&f.path, &f.text)).collect::<Result<Vec<_>, _>>()?;
    let files: Vec<&Parsed> = std::iter::once(&main).chain(imported.iter()).collect();
    let cri_key = version.cri_runtime_plugin();
    let Some(cri) = effective_cri(&files, cri_key, containerd.merges_plugin_sections())? else {
        return Ok(None);
    };
    let Some(runtime) = cri
        .get("containerd")
        .and_then(Item::as_table_like)
        .and_then(|c| c.get("runtimes"))
        .and_then(Item::as_table_like)
        .and_then(|r| r.get(handler))
        .and_then(Item::as_table_like)
    else {
        return Ok(None);
    };
    let strings = |key: &str| -> Vec<String> {
        runtime
            .get(key)
            .and_then(Item::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    };
    let defined_in = handler_file(&files, cri_key, handler).unwrap_or_default();
    Ok(Some(EffectiveRuntime {
        runtime_type: runtime.get("runtime_type").and_then(Item::as_str).map(str::to_owned),
        runtime_path: runtime.get("runtime_path").and_then(Item::as_str).map(str::to_owned),
        container_annotations: strings("container_annotations"),
        pod_annotations: strings("pod_annotations"),
        defined_in,
    }))
}

/// containerd's own CDI, as the CRI plugin will run it once every file is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectiveCdi {
    /// `enable_cdi`: containerd resolves `cdi.k8s.io/` annotations itself, before any shim.
    pub enabled: bool,
    /// `cdi_spec_dirs`: the only directories it reads specs from.
    pub spec_dirs: Vec<String>,
    /// The file that set `enable_cdi` (the last in load order), `None` for containerd's default.
    pub defined_in: Option<String>,
}

/// containerd's default `cdi_spec_dirs`.
pub const DEFAULT_CDI_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// The CDI settings the CRI plugin of `containerd` will run with, across the main file and its
/// imports (our drop-in included); `None` for a containerd without CDI of its own (before 1.7).
pub fn effective_cdi(
    sources: &ConfigSources,
    containerd: &ContainerdVersion,
) -> Result<Option<EffectiveCdi>, PlanError> {
    if !containerd.has_cdi() {
        return Ok(None);
    }
    let mut cdi = EffectiveCdi {
        enabled: containerd.cdi_enabled_by_default(),
        spec_dirs: DEFAULT_CDI_SPEC_DIRS.iter().map(|d| (*d).to_owned()).collect(),
        defined_in: None,
    };
    let Some(text) = &sources.main else { return Ok(Some(cdi)) };
    let main = parse(&sources.main_path, text)?;
    let (version, _) = detect_version(&main)?;
    let imported = sources.imported.iter().map(|f| parse(&f.path, &f.text)).collect::<Result<Vec<_>, _>>()?;
    let files: Vec<&Parsed> = std::iter::once(&main).chain(imported.iter()).collect();
    let cri_key = version.cri_runtime_plugin();
    let Some(cri) = effective_cri(&files, cri_key, containerd.merges_plugin_sections())? else {
        return Ok(Some(cdi));
    };
    if let Some(enabled) = cri.get("enable_cdi").and_then(Item::as_bool) {
        cdi.enabled = enabled;
        cdi.defined_in = files
            .iter()
            .rev()
            .find(|f| {
                plugin_item(f, cri_key)
                    .and_then(Item::as_table_like)
                    .is_some_and(|t| t.contains_key("enable_cdi"))
            })
            .map(|f| f.path.clone());
    }
    if let Some(dirs) = cri.get("cdi_spec_dirs").and_then(Item::as_array) {
        cdi.spec_dirs = dirs.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect();
    }
    Ok(Some(cdi))
}

pub(super) fn parse(path: &str, text: &str) -> Result<Parsed, PlanError> {
    let doc = text
        .parse::<DocumentMut>()
        .map_err(|e| PlanError::Parse { path: path.to_owned(), message: e.to_string().trim().to_owned() })?;
    Ok(Parsed { path: path.to_owned(), doc })
}

pub(super) fn detect_version(file: &Parsed) -> Result<(ConfigVersion, Option<i64>), PlanError> {
    match file.doc.get("version") {
        None => Ok((ConfigVersion::V1, None)),
        Some(item) => match item.as_integer() {
            Some(1) => Ok((ConfigVersion::V1, Some(1))),
            Some(2) => Ok((ConfigVersion::V2, Some(2))),
            Some(3) => Ok((ConfigVersion::V3, Some(3))),
            _ => Err(PlanError::UnknownVersion {
                path: file.path.clone(),
                found: item.to_string().trim().to_owned(),
            }),
        },
    }
}

pub(super) fn plugin_item<'a>(file: &'a Parsed, cri_key: &str) -> Option<&'a Item> {
    file.doc.get("plugins").and_then(Item::as_table_like).and_then(|p| p.get(cri_key))
}

fn handler_table<'a>(file: &'a Parsed, cri_key: &str, handler: &str) -> Option<&'a Item> {
    plugin_item(file, cri_key)?
        .as_table_like()?
        .get("containerd")?
        .as_table_like()?
        .get("runtimes")?
        .as_table_like()?
        .get(handler)
}

/// The path of the last file (in load order) that defines `runtimes.<handler>`.
pub(super) fn handler_file(files: &[&Parsed], cri_key: &str, handler: &str) -> Option<String> {
    files.iter().rev().find(|f| handler_table(f, cri_key, handler).is_some()).map(|f| f.path.clone())
}

/// The CRI section containerd will see without our drop-in: on 1.x the last file's section
/// replaces earlier ones; on 2.x all sections merge key by key.
pub(super) fn effective_cri(
    files: &[&Parsed],
    cri_key: &str,
    merges: bool,
) -> Result<Option<Table>, PlanError> {
    let mut effective: Option<Table> = None;
    for file in files {
        let Some(item) = plugin_item(file, cri_key) else { continue };
        let table = to_table(item).ok_or_else(|| PlanError::NotATable {
            path: file.path.clone(),
            key: format!("plugins.\"{cri_key}\""),
            found: item.type_name(),
        })?;
        effective = match (effective, merges) {
            (Some(mut acc), true) => {
                merge_into(&mut acc, &table);
                Some(acc)
            }
            _ => Some(table),
        };
    }
    Ok(effective)
}

/// Where the copied CRI section comes from on 1.x (the last file defining it), for the drop-in
/// header.
pub(super) fn effective_source(files: &[&Parsed], cri_key: &str) -> Option<String> {
    files.iter().rev().find(|f| plugin_item(f, cri_key).is_some()).map(|f| f.path.clone())
}

pub(super) fn to_table(item: &Item) -> Option<Table> {
    match item {
        Item::Table(t) => Some(t.clone()),
        Item::Value(Value::InlineTable(t)) => Some(t.clone().into_table()),
        _ => None,
    }
}

/// Key-by-key merge as containerd 2.x does: tables merge, anything else is replaced.
fn merge_into(acc: &mut Table, other: &Table) {
    for (key, item) in other.iter() {
        match (acc.get_mut(key), to_table(item)) {
            (Some(existing), Some(theirs)) if existing.is_table_like() => {
                if let Some(mut mine) = to_table(existing) {
                    merge_into(&mut mine, &theirs);
                    *existing = Item::Table(mine);
                }
            }
            _ => {
                acc.insert(key, item.clone());
            }
        }
    }
}

pub(super) fn import_entries(file: &Parsed) -> Result<Vec<String>, PlanError> {
    let Some(item) = file.doc.get("imports") else { return Ok(Vec::new()) };
    let array = item.as_array().ok_or_else(|| PlanError::BadImports { path: file.path.clone() })?;
    array
        .iter()
        .map(|v| {
            v.as_str().map(str::to_owned).ok_or_else(|| PlanError::BadImports { path: file.path.clone() })
        })
        .collect()
}

/// Every file an `imports` list names, resolved (used by the I/O side to read them).
pub fn import_targets(
    path: &str,
    text: &str,
    containerd: &ContainerdVersion,
) -> Result<Vec<ImportTarget>, PlanError> {
    let parsed = parse(path, text)?;
    Ok(import_entries(&parsed)?.iter().map(|e| imports::resolve(e, path, containerd)).collect())
}

#[cfg(test)]
mod cdi_tests {
    use super::*;

    fn sources(main: Option<&str>, imported: &[(&str, &str)]) -> ConfigSources {
        ConfigSources {
            main_path: "/etc/containerd/config.toml".into(),
            main: main.map(str::to_owned),
            imported: imported
                .iter()
                .map(|(p, t)| SourceFile { path: (*p).to_owned(), text: (*t).to_owned() })
                .collect(),
            imported_before_drop_in: 0,
        }
    }

    #[test]
    fn each_versions_defaults_and_config_decide_containerds_cdi() {
        let v16 = ContainerdVersion::new(1, 6, 20);
        let v17 = ContainerdVersion::new(1, 7, 24);
        let v21 = ContainerdVersion::new(2, 1, 9);
        assert_eq!(effective_cdi(&sources(None, &[]), &v16).unwrap(), None, "1.6 has no CDI of its own");
        let off = effective_cdi(&sources(None, &[]), &v17).unwrap().unwrap();
        assert!(!off.enabled && off.spec_dirs == DEFAULT_CDI_SPEC_DIRS && off.defined_in.is_none());
        let on = effective_cdi(&sources(Some("version = 3\n"), &[]), &v21).unwrap().unwrap();
        assert!(on.enabled && on.spec_dirs == DEFAULT_CDI_SPEC_DIRS);

        // 2.x, version 3: the runtime plugin holds it; an import merges key by key.
        let main = "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\nenable_cdi = false\n";
        let drop_in =
            "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\ncdi_spec_dirs = [\"/run/cdi\"]\n";
        let c = effective_cdi(&sources(Some(main), &[("/etc/containerd/conf.d/x.toml", drop_in)]), &v21)
            .unwrap()
            .unwrap();
        assert!(!c.enabled, "{c:?}");
        assert_eq!(c.spec_dirs, ["/run/cdi"]);
        assert_eq!(c.defined_in.as_deref(), Some("/etc/containerd/config.toml"));

        // A version 2 file on 2.x: the old CRI plugin id.
        let v2 = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = true\ncdi_spec_dirs = [\"/x\"]\n";
        let c = effective_cdi(&sources(Some(v2), &[]), &v17).unwrap().unwrap();
        assert!(c.enabled && c.spec_dirs == ["/x"], "{c:?}");
    }
}
