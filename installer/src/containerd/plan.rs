//! The change to containerd's configuration, planned as a pure function. What the configuration
//! is (the files parsed, the effective CRI section) is [`super::effective`]'s model; this module
//! decides the change and renders it.
//!
//! Input: the main config file's text, the files it already imports, the containerd version and
//! what we want (handler name, shim path, default or not). Output: the full text of our drop-in
//! and, only if needed, the main file with one `imports` entry added; nothing else in the main
//! file changes, so its comments and formatting survive (`toml_edit`).
//!
//! Why the drop-in looks the way it does:
//! - containerd 1.x replaces a whole plugin section with an imported file's (issue 5837), so on
//!   1.x the drop-in carries a copy of the effective CRI section with our runtime added; on 2.x
//!   sections merge key by key and the drop-in holds only our runtime.
//! - where containerd honours `runtime_path` (1.6.21+, 1.7.1+, 2.x), the runtime is
//!   `io.containerd.runc.v2` with `runtime_path` = our shim, so the runc options of the existing
//!   runtime (SystemdCgroup, BinaryName, ...) reach runc through our shim. Older containerd ignores
//!   `runtime_path` for containers, so there the runtime type is `io.containerd.nvinject.v2` and
//!   containerd finds `containerd-shim-nvinject-v2` on its `PATH`; runc options cannot pass.
//! - `container_annotations = ["cdi.k8s.io/*"]` lets the device plugin's annotations reach the
//!   shim; `pod_annotations` is never set, so a pod cannot name its own devices.

use toml_edit::{Array, DocumentMut, Item, Table, Value};

use super::config_version::ConfigVersion;
use super::effective::{
    ConfigSources, Parsed, detect_version, effective_cri, effective_source, handler_file, import_entries,
    parse, plugin_item, to_table,
};
use super::error::PlanError;
use super::imports;
use super::version::ContainerdVersion;

/// The runtime type containerd maps to `containerd-shim-nvinject-v2` on its `PATH`.
pub const SHIM_RUNTIME_TYPE: &str = "io.containerd.nvinject.v2";
/// runc's shim type; with `runtime_path` set, containerd starts our shim under this type.
pub const RUNC_RUNTIME_TYPE: &str = "io.containerd.runc.v2";
/// The annotations the CRI plugin passes from a container's config into its OCI spec.
pub const CDI_ANNOTATIONS: &str = "cdi.k8s.io/*";

/// Runtime-level keys never copied from the existing runc runtime: ours are set explicitly, the
/// options go through the `runtime_path` rule, and pod annotations are never allowed.
const NOT_COPIED: &[&str] = &[
    "runtime_type",
    "runtime_path",
    "runtime_engine",
    "runtime_root",
    "options",
    "container_annotations",
    "pod_annotations",
];

/// What we want containerd to know.
#[derive(Debug, Clone)]
pub struct RuntimeRequest {
    /// The runtime handler (and RuntimeClass handler) name, `nvidia` by default.
    pub handler: String,
    /// Host path of `containerd-shim-nvinject-v2`.
    pub shim_path: String,
    /// Whether the handler becomes the CRI default runtime.
    pub set_as_default: bool,
    /// Host path of our drop-in file.
    pub drop_in_path: String,
}

/// How containerd will start our shim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeMode {
    /// `runtime_type = io.containerd.runc.v2` + `runtime_path` = our shim, runc options copied.
    RuntimePath,
    /// `runtime_type = io.containerd.nvinject.v2`: the shim must be on containerd's `PATH`.
    ShimType,
}

/// What happens to the main config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MainChange {
    /// It already imports the drop-in.
    Unchanged,
    /// It exists and gets this new text (one `imports` entry added).
    Update(String),
    /// It does not exist and is created with this text.
    Create(String),
}

/// The planned change.
#[derive(Debug, Clone)]
pub struct Plan {
    /// How the runtime entry starts our shim.
    pub mode: RuntimeMode,
    /// Full text of the drop-in.
    pub drop_in: String,
    /// The main file's change.
    pub main: MainChange,
    /// Things the operator should know (each a full sentence).
    pub warnings: Vec<String>,
}

/// Plans the drop-in and the main file's `imports` entry.
pub fn plan(
    sources: &ConfigSources,
    containerd: &ContainerdVersion,
    request: &RuntimeRequest,
) -> Result<Plan, PlanError> {
    let main = match &sources.main {
        Some(text) => Some(parse(&sources.main_path, text)?),
        None => None,
    };
    let (version, declared) = match &main {
        Some(m) => detect_version(m)?,
        None => {
            let v = ConfigVersion::newest_for(containerd);
            (v, Some(i64::from(v.number())))
        }
    };
    if version.number() > containerd.max_config_version() {
        return Err(PlanError::VersionTooNew {
            path: sources.main_path.clone(),
            config: version.number(),
            containerd: containerd.clone(),
        });
    }
    let imported = sources.imported.iter().map(|f| parse(&f.path, &f.text)).collect::<Result<Vec<_>, _>>()?;
    let files: Vec<&Parsed> = main.iter().chain(imported.iter()).collect();
    let cri_key = version.cri_runtime_plugin();
    let mut warnings = Vec::new();

    if !containerd.merges_plugin_sections() {
        // containerd 1.x replaces the whole CRI section with the last file's: one loaded after
        // the drop-in would drop our runtime, and a restart would load a config without it.
        let later = imported.get(sources.imported_before_drop_in..).unwrap_or_default();
        if let Some(file) = later.iter().find(|f| plugin_item(f, cri_key).is_some()) {
            return Err(PlanError::DropInOverridden {
                path: file.path.clone(),
                drop_in: request.drop_in_path.clone(),
                main: sources.main_path.clone(),
                containerd: containerd.clone(),
            });
        }
    }
    warn_if_cri_disabled(&files, version, &mut warnings);
    if let Some(path) = handler_file(&files, cri_key, &request.handler) {
        let table = format!("plugins.\"{cri_key}\".containerd.runtimes.{}", request.handler);
        if containerd.merges_plugin_sections() {
            return Err(PlanError::HandlerDefined {
                path,
                table,
                handler: request.handler.clone(),
                containerd: containerd.clone(),
            });
        }
        warnings.push(format!(
            "{path}: runtime `{}` ({table}) is replaced by nvinject's while nvinject is installed; \
             uninstall restores it",
            request.handler
        ));
    }

    let effective = effective_cri(&files, cri_key, containerd.merges_plugin_sections())?;
    let mode =
        if containerd.honours_runtime_path() { RuntimeMode::RuntimePath } else { RuntimeMode::ShimType };
    let base = base_runtime(effective.as_ref(), &request.handler);
    let runtime = runtime_table(mode, request, base.as_ref(), containerd, &mut warnings);

    let drop_in = if containerd.merges_plugin_sections() {
        render_merged_drop_in(declared, cri_key, runtime, request)
    } else {
        let source = effective_source(&files, cri_key);
        render_replacing_drop_in(declared, cri_key, effective, runtime, request, source.as_deref())?
    };

    let main_change = match main {
        None => MainChange::Create(render_created_main(version, &request.drop_in_path)),
        Some(mut parsed) => {
            if imports_cover(&parsed, containerd, &request.drop_in_path)? {
                MainChange::Unchanged
            } else {
                add_import(&mut parsed, &request.drop_in_path)?;
                MainChange::Update(parsed.doc.to_string())
            }
        }
    };
    Ok(Plan { mode, drop_in, main: main_change, warnings })
}

/// Removes our drop-in from the main file's `imports`; `None` when it was not there.
///
/// Used by uninstall when the main file changed since install, so its original bytes cannot be
/// restored: everything else in it stays as the operator left it.
pub fn remove_import(
    main_path: &str,
    main_text: &str,
    drop_in_path: &str,
) -> Result<Option<String>, PlanError> {
    let mut parsed = parse(main_path, main_text)?;
    let root = parsed.doc.as_table_mut();
    let Some(item) = root.get_mut("imports") else { return Ok(None) };
    let array = item.as_array_mut().ok_or_else(|| PlanError::BadImports { path: main_path.to_owned() })?;
    let before = array.len();
    array.retain(|v| v.as_str().map(imports::clean).as_deref() != Some(drop_in_path));
    if array.len() == before {
        return Ok(None);
    }
    if array.is_empty() {
        root.remove("imports");
    }
    Ok(Some(parsed.doc.to_string()))
}

fn warn_if_cri_disabled(files: &[&Parsed], version: ConfigVersion, warnings: &mut Vec<String>) {
    for file in files {
        let Some(disabled) = file.doc.get("disabled_plugins").and_then(Item::as_array) else { continue };
        let cri_ids = ["cri", "io.containerd.grpc.v1.cri", version.cri_runtime_plugin()];
        if disabled.iter().filter_map(Value::as_str).any(|id| cri_ids.contains(&id)) {
            warnings.push(format!(
                "{}: `disabled_plugins` turns off the CRI plugin, so Kubernetes cannot use this containerd \
                 and the `nvidia` runtime stays unused; remove the CRI entry from `disabled_plugins`",
                file.path
            ));
        }
    }
}

/// The runc runtime whose settings ours inherits: the default runtime if it is runc, else `runc`.
fn base_runtime(cri: Option<&Table>, handler: &str) -> Option<Table> {
    let containerd = cri?.get("containerd").and_then(Item::as_table_like)?;
    let runtimes = containerd.get("runtimes").and_then(Item::as_table_like);
    let default_name = containerd.get("default_runtime_name").and_then(Item::as_str).unwrap_or("runc");
    let is_runc = |t: &Table| {
        matches!(
            t.get("runtime_type").and_then(Item::as_str),
            Some("io.containerd.runc.v2") | Some("io.containerd.runc.v1")
        )
    };
    let lookup = |name: &str| runtimes.and_then(|r| r.get(name)).and_then(to_table).filter(is_runc);
    let from_default = if default_name == handler { None } else { lookup(default_name) };
    from_default
        .or_else(|| lookup("runc"))
        .or_else(|| containerd.get("default_runtime").and_then(to_table).filter(is_runc))
}

fn runtime_table(
    mode: RuntimeMode,
    request: &RuntimeRequest,
    base: Option<&Table>,
    containerd: &ContainerdVersion,
    warnings: &mut Vec<String>,
) -> Table {
    let mut table = Table::new();
    match mode {
        RuntimeMode::RuntimePath => {
            table.insert("runtime_type", toml_edit::value(RUNC_RUNTIME_TYPE));
            table.insert("runtime_path", toml_edit::value(request.shim_path.as_str()));
        }
        RuntimeMode::ShimType => {
            table.insert("runtime_type", toml_edit::value(SHIM_RUNTIME_TYPE));
        }
    }
    let mut annotations = Array::new();
    annotations.push(CDI_ANNOTATIONS);
    if let Some(theirs) = base.and_then(|b| b.get("container_annotations")).and_then(Item::as_array) {
        for a in theirs.iter().filter_map(Value::as_str) {
            if a != CDI_ANNOTATIONS {
                annotations.push(a);
            }
        }
    }
    table.insert("container_annotations", toml_edit::value(annotations));
    let Some(base) = base else { return table };
    if base.get("pod_annotations").and_then(Item::as_array).is_some_and(|a| !a.is_empty()) {
        warnings.push(format!(
            "the runc runtime's `pod_annotations` are not copied to runtime `{}`: pod annotations could \
             name devices a pod was not allocated",
            request.handler
        ));
    }
    for (key, item) in base.iter() {
        if NOT_COPIED.contains(&key) || item.is_table() {
            continue;
        }
        let mut item = item.clone();
        if let Some(v) = item.as_value_mut() {
            v.decor_mut().clear();
        }
        table.insert(key, item);
    }
    let options = base.get("options").and_then(to_table).filter(|o| !o.is_empty());
    match (mode, options) {
        (RuntimeMode::RuntimePath, Some(mut options)) => {
            normalize(&mut options);
            table.insert("options", Item::Table(options));
        }
        (RuntimeMode::ShimType, Some(options)) => {
            let listed: Vec<String> =
                options.iter().map(|(k, v)| format!("{k} = {}", v.to_string().trim())).collect();
            warnings.push(format!(
                "containerd {containerd} ignores `runtime_path` for containers (containerd issue 8207, fixed in \
                 1.6.21 and 1.7.1), so runtime `{}` uses runtime_type {SHIM_RUNTIME_TYPE} and the runc options \
                 ({}) cannot pass through to runc; upgrade containerd to keep them",
                request.handler,
                listed.join(", ")
            ));
        }
        _ => {}
    }
    table
}

/// Makes a copied table render as plain `[header]` tables in tree order, one blank line before
/// each header, no indentation, comments kept.
fn normalize(table: &mut Table) {
    table.set_position(None);
    table.set_dotted(false);
    let comments = comment_lines(table.decor().prefix());
    table.decor_mut().set_prefix(format!("\n{comments}"));
    for (mut key, item) in table.iter_mut() {
        if let Item::Table(t) = item {
            // A sub-table's key decor sits inside its header's brackets.
            key.leaf_decor_mut().clear();
            normalize(t);
        } else {
            let comments = comment_lines(key.leaf_decor().prefix());
            key.leaf_decor_mut().set_prefix(comments);
        }
    }
}

/// The comment lines of a decor prefix, unindented, each ending in a newline.
fn comment_lines(raw: Option<&toml_edit::RawString>) -> String {
    raw.and_then(|r| r.as_str())
        .map(|s| s.lines().map(str::trim).filter(|l| l.starts_with('#')).map(|l| format!("{l}\n")).collect())
        .unwrap_or_default()
}

/// Gets (or creates, implicit) the sub-table `key`, turning an inline table into a normal one.
fn child_table<'a>(
    parent: &'a mut Table,
    key: &str,
    path: &str,
    dotted: &str,
) -> Result<&'a mut Table, PlanError> {
    let item = parent.entry(key).or_insert_with(|| {
        let mut t = Table::new();
        t.set_implicit(true);
        Item::Table(t)
    });
    if let Item::Value(Value::InlineTable(inline)) = item {
        *item = Item::Table(inline.clone().into_table());
    }
    let found = item.type_name();
    item.as_table_mut().ok_or_else(|| PlanError::NotATable {
        path: path.to_owned(),
        key: dotted.to_owned(),
        found,
    })
}

fn header(lines: &[String]) -> String {
    let mut out = String::new();
    for line in lines {
        out.push_str("# ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn common_header(request: &RuntimeRequest) -> Vec<String> {
    vec![
        format!(
            "Written by nvinject-installer: containerd runtime `{}` (RuntimeClass handler `{}`).",
            request.handler, request.handler
        ),
        "Regenerated by every install and removed by uninstall; edits here are lost.".to_owned(),
    ]
}

fn version_line(doc: &mut DocumentMut, declared: Option<i64>) {
    if let Some(v) = declared {
        doc.insert("version", toml_edit::value(v));
    }
}

/// containerd 2.x: only our runtime (and the default, if asked); sections merge.
fn render_merged_drop_in(
    declared: Option<i64>,
    cri_key: &str,
    runtime: Table,
    request: &RuntimeRequest,
) -> String {
    let mut doc = DocumentMut::new();
    doc.decor_mut().set_prefix(header(&common_header(request)));
    version_line(&mut doc, declared);
    let mut containerd = Table::new();
    if request.set_as_default {
        containerd.insert("default_runtime_name", toml_edit::value(request.handler.as_str()));
    } else {
        containerd.set_implicit(true);
    }
    let mut runtimes = Table::new();
    runtimes.set_implicit(true);
    runtimes.insert(&request.handler, Item::Table(runtime));
    containerd.insert("runtimes", Item::Table(runtimes));
    let mut cri = Table::new();
    cri.set_implicit(true);
    cri.insert("containerd", Item::Table(containerd));
    let mut plugins = Table::new();
    plugins.set_implicit(true);
    plugins.insert(cri_key, Item::Table(cri));
    doc.insert("plugins", Item::Table(plugins));
    doc.to_string()
}

/// containerd 1.x: the whole effective CRI section, with our runtime added.
fn render_replacing_drop_in(
    declared: Option<i64>,
    cri_key: &str,
    effective: Option<Table>,
    runtime: Table,
    request: &RuntimeRequest,
    source: Option<&str>,
) -> Result<String, PlanError> {
    let mut lines = common_header(request);
    lines.push(
        "containerd 1.x replaces a whole plugin section with an imported one, so this file repeats the CRI"
            .to_owned(),
    );
    match source {
        Some(path) => {
            lines.push(format!("section of {path}: change settings there and run the installer again."))
        }
        None => lines.push(
            "section (containerd's defaults plus the runc runtime) with this runtime added.".to_owned(),
        ),
    }
    let mut doc = DocumentMut::new();
    doc.decor_mut().set_prefix(header(&lines));
    version_line(&mut doc, declared);

    // A key of the wrong type is the operator's, in the file the section was copied from.
    let label = source.unwrap_or(request.drop_in_path.as_str());
    let mut cri = effective.unwrap_or_else(|| {
        let mut t = Table::new();
        t.set_implicit(true);
        t
    });
    normalize(&mut cri);
    let containerd_key = format!("plugins.\"{cri_key}\".containerd");
    let containerd = child_table(&mut cri, "containerd", label, &containerd_key)?;
    if request.set_as_default {
        containerd.insert("default_runtime_name", toml_edit::value(request.handler.as_str()));
    }
    let had_runtimes = containerd.contains_key("runtimes");
    let runtimes = child_table(containerd, "runtimes", label, &format!("{containerd_key}.runtimes"))?;
    if !had_runtimes {
        // A `runtimes` table in the CRI section replaces containerd's built-in one, which only
        // holds `runc`: keep runc so pods without a RuntimeClass still start.
        let mut runc = Table::new();
        runc.insert("runtime_type", toml_edit::value(RUNC_RUNTIME_TYPE));
        runtimes.insert("runc", Item::Table(runc));
    }
    runtimes.insert(&request.handler, Item::Table(runtime));

    let mut plugins = Table::new();
    plugins.set_implicit(true);
    plugins.insert(cri_key, Item::Table(cri));
    doc.insert("plugins", Item::Table(plugins));
    Ok(doc.to_string())
}

fn render_created_main(version: ConfigVersion, drop_in: &str) -> String {
    let mut doc = DocumentMut::new();
    doc.decor_mut().set_prefix(header(&[
        "Written by nvinject-installer: containerd had no config file, so it ran on its defaults.".to_owned(),
        "This file only imports nvinject's drop-in; uninstall removes it if it is unchanged.".to_owned(),
    ]));
    doc.insert("version", toml_edit::value(i64::from(version.number())));
    let mut imports = Array::new();
    imports.push(drop_in);
    doc.insert("imports", toml_edit::value(imports));
    doc.to_string()
}

fn imports_cover(file: &Parsed, containerd: &ContainerdVersion, drop_in: &str) -> Result<bool, PlanError> {
    Ok(import_entries(file)?
        .iter()
        .any(|entry| imports::resolve(entry, &file.path, containerd).covers(drop_in)))
}

fn add_import(file: &mut Parsed, drop_in: &str) -> Result<(), PlanError> {
    let path = file.path.clone();
    let root = file.doc.as_table_mut();
    match root.get_mut("imports") {
        None => {
            let mut array = Array::new();
            array.push(drop_in);
            root.insert("imports", toml_edit::value(array));
        }
        Some(item) => {
            let array = item.as_array_mut().ok_or(PlanError::BadImports { path })?;
            let multiline = array
                .iter()
                .last()
                .and_then(|v| v.decor().prefix().and_then(|p| p.as_str()).map(str::to_owned))
                .filter(|p| p.contains('\n'));
            let mut value = Value::from(drop_in);
            match multiline {
                Some(prefix) => {
                    value.decor_mut().set_prefix(prefix);
                    // A multi-line array keeps its closing bracket on its own line.
                    if !array.trailing_comma() {
                        array.set_trailing_comma(true);
                    }
                    array.push_formatted(value);
                }
                None => array.push(drop_in),
            }
        }
    }
    Ok(())
}
