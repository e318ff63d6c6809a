//! Property tests for the containerd TOML planner (`containerd::plan`) and the reader in front of
//! it (`containerd_files::read_sources`): generated and hostile configs (every `version`, odd
//! `imports`, CRI and `nvidia` tables of the wrong type, huge strings, deep tables, garbage bytes)
//! never panic; a refusal names the file (and the key, for a key of the wrong type); a plan writes
//! TOML, keeps every key of the operator's that is not ours, sets our runtime, plans nothing new
//! when run on its own result, and its `imports` entry comes out again leaving the file as it was.
//! Fixed case counts, no failure files, so CI time is bounded.

mod common;

use std::fs;
use std::time::Duration;

use nvinject_installer::containerd::plan::{CDI_ANNOTATIONS, RUNC_RUNTIME_TYPE, SHIM_RUNTIME_TYPE};
use nvinject_installer::containerd::{
    ConfigSources, ContainerdVersion, MainChange, PlanError, RuntimeMode, RuntimeRequest, SourceFile, plan,
    remove_import,
};
use nvinject_installer::containerd_files::read_sources;
use nvinject_installer::fsx::FaultHook;
use nvinject_installer::install::{Installer, Settings};
use nvinject_installer::paths::HostRoot;
use nvinject_installer::runtime_config::ShimConfig;
use proptest::prelude::*;
use proptest::test_runner::Config;

fn config(cases: u32) -> Config {
    Config { failure_persistence: None, ..Config::with_cases(cases) }
}

const MAIN: &str = "/etc/containerd/config.toml";
const DROP_IN: &str = "/etc/containerd/conf.d/99-nvinject.toml";
const IMPORTED: [&str; 2] = ["/etc/containerd/conf.d/10-a.toml", "/etc/containerd/conf.d/50-b.toml"];
const SHIM: &str = "/usr/local/nvinject/bin/containerd-shim-nvinject-v2";

const CRI_KEYS: [&str; 4] =
    ["cri", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"];

fn versions() -> impl Strategy<Value = ContainerdVersion> {
    prop::sample::select(vec![(1, 6, 20), (1, 6, 21), (1, 7, 0), (1, 7, 20), (2, 0, 0), (2, 1, 3)])
        .prop_map(|(a, b, c)| ContainerdVersion::new(a, b, c))
}

/// A TOML value, rendered by [`render_value`].
#[derive(Debug, Clone)]
enum V {
    Str(String),
    Int(i64),
    Bool(bool),
    Float,
    Date,
    Arr(Vec<V>),
    Inline(Vec<(String, V)>),
}

fn quote(s: &str) -> String {
    // JSON string escapes are valid TOML basic-string escapes.
    serde_json::to_string(s).unwrap()
}

fn key(k: &str) -> String {
    if !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        k.to_owned()
    } else {
        quote(k)
    }
}

fn render_value(v: &V) -> String {
    match v {
        V::Str(s) => quote(s),
        V::Int(n) => n.to_string(),
        V::Bool(b) => b.to_string(),
        V::Float => "1.5e3".to_owned(),
        V::Date => "1979-05-27T07:32:00Z".to_owned(),
        V::Arr(items) => format!("[{}]", items.iter().map(render_value).collect::<Vec<_>>().join(", ")),
        V::Inline(kv) => format!(
            "{{{}}}",
            kv.iter()
                .map(|(k, v)| format!("{} = {}", key(k), render_value(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("io.containerd.runc.v2".to_owned()),
        Just("io.containerd.runc.v1".to_owned()),
        Just(SHIM_RUNTIME_TYPE.to_owned()),
        Just("io.containerd.kata.v2".to_owned()),
        Just("/usr/bin/runc".to_owned()),
        Just("cdi.k8s.io/*".to_owned()),
        Just("nvidia".to_owned()),
        Just("runc".to_owned()),
        Just(String::new()),
        "[ -~]{0,16}",
        any::<String>(),
        (1usize..20_000).prop_map(|n| "x".repeat(n)),
    ]
}

fn value() -> impl Strategy<Value = V> {
    let leaf = prop_oneof![
        4 => string().prop_map(V::Str),
        1 => any::<i64>().prop_map(V::Int),
        1 => any::<bool>().prop_map(V::Bool),
        1 => Just(V::Float),
        1 => Just(V::Date),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(V::Arr),
            prop::collection::vec((table_key(), inner), 0..3).prop_map(V::Inline),
        ]
    })
}

/// Keys the planner reads, and some it does not.
fn table_key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "runtime_type",
            "runtime_path",
            "runtime_root",
            "default_runtime_name",
            "container_annotations",
            "pod_annotations",
            "SystemdCgroup",
            "BinaryName",
            "options",
            "runtimes",
            "containerd",
            "default_runtime",
            "nvidia",
            "runc",
            "snapshotter",
            "sandbox_image",
            "version",
            "imports",
        ])
        .prop_map(str::to_owned),
        "[a-z_]{1,10}",
        "[ -~]{1,8}",
    ]
}

/// A table header path: the CRI section and its runtimes (ours too), foreign tables, deep ones.
fn header() -> impl Strategy<Value = Vec<String>> {
    let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let cri = prop::sample::select(CRI_KEYS.to_vec());
    prop_oneof![
        cri.clone().prop_map(move |c| owned(&["plugins", c])),
        cri.clone().prop_map(move |c| owned(&["plugins", c, "containerd"])),
        (cri.clone(), prop::sample::select(vec!["runc", "nvidia", "kata", "x y", "ünï"]))
            .prop_map(move |(c, r)| owned(&["plugins", c, "containerd", "runtimes", r])),
        (cri.clone(), prop::sample::select(vec!["runc", "nvidia"])).prop_map(move |(c, r)| owned(&[
            "plugins",
            c,
            "containerd",
            "runtimes",
            r,
            "options"
        ])),
        cri.clone().prop_map(move |c| owned(&["plugins", c, "containerd", "default_runtime"])),
        cri.prop_map(move |c| owned(&["plugins", c, "registry", "mirrors", "docker.io"])),
        Just(owned(&["plugins", "io.containerd.internal.v1.opt"])),
        Just(owned(&["grpc"])),
        Just(owned(&["metrics"])),
        prop::collection::vec("[a-z]{1,6}", 1..4).prop_map(|mut p| {
            p.insert(0, "foreign".to_owned());
            p
        }),
        // Deep: containerd never reads these, the planner must still carry or ignore them.
        (1usize..60).prop_map(|d| (0..d).map(|i| format!("d{i}")).collect()),
    ]
}

fn version_rhs() -> impl Strategy<Value = Option<String>> {
    let valid = prop::sample::select(vec![None, Some("1"), Some("2"), Some("3")]);
    let invalid = prop::sample::select(vec![
        Some("4"),
        Some("0"),
        Some("-1"),
        Some("\"2\""),
        Some("2.0"),
        Some("true"),
        Some("[2]"),
        Some("99999999999999999999"),
    ]);
    prop_oneof![6 => valid, 1 => invalid].prop_map(|v| v.map(str::to_owned))
}

fn imports_rhs() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        4 => Just(None),
        2 => Just(Some("[\"/etc/containerd/conf.d/*.toml\"]".to_owned())),
        1 => Just(Some("[\"conf.d/*.toml\"]".to_owned())),
        1 => Just(Some(format!("[{}]", quote(DROP_IN)))),
        1 => Just(Some("[\"/etc/containerd/conf.d/./99-nvinject.toml\"]".to_owned())),
        1 => Just(Some("[]".to_owned())),
        1 => Just(Some("[\n  # operator's list\n  \"/etc/containerd/other.toml\", # trailing\n]".to_owned())),
        1 => Just(Some("[\"\", \"/\", \"*\", \"[\", \"../../../../x\", \"\\\\\"]".to_owned())),
        1 => Just(Some("\"/etc/containerd/conf.d/*.toml\"".to_owned())),
        1 => Just(Some("[1, 2]".to_owned())),
        1 => Just(Some("[\"/a.toml\", 1]".to_owned())),
        1 => Just(Some("{a = \"b\"}".to_owned())),
        1 => prop::collection::vec(string(), 0..4)
            .prop_map(|v| Some(format!("[{}]", v.iter().map(|s| quote(s)).collect::<Vec<_>>().join(", ")))),
    ]
}

/// Key-value pairs of one table.
type Pairs = Vec<(String, V)>;

/// One generated config file.
#[derive(Debug, Clone)]
struct Doc {
    version: Option<String>,
    imports: Option<String>,
    disabled_cri: bool,
    top: Pairs,
    tables: Vec<(Vec<String>, Pairs)>,
    dotted: bool,
    /// Render through the `toml` serializer (always valid TOML) instead of as text.
    valid: bool,
}

fn doc() -> impl Strategy<Value = Doc> {
    (
        version_rhs(),
        imports_rhs(),
        prop::bool::weighted(0.1),
        prop::collection::vec((table_key(), value()), 0..3),
        prop::collection::vec((header(), prop::collection::vec((table_key(), value()), 0..5)), 0..6),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(version, imports, disabled_cri, top, tables, dotted, valid)| Doc {
            version,
            imports,
            disabled_cri,
            top,
            tables,
            dotted,
            valid,
        })
}

fn to_toml(v: &V) -> toml::Value {
    match v {
        V::Str(s) => toml::Value::String(s.clone()),
        V::Int(n) => toml::Value::Integer(*n),
        V::Bool(b) => toml::Value::Boolean(*b),
        V::Float => toml::Value::Float(1.5e3),
        V::Date => toml::Value::Datetime("1979-05-27T07:32:00Z".parse().unwrap()),
        V::Arr(items) => toml::Value::Array(items.iter().map(to_toml).collect()),
        V::Inline(kv) => toml::Value::Table(kv.iter().map(|(k, v)| (k.clone(), to_toml(v))).collect()),
    }
}

/// A raw right-hand side as a value, if it is one.
fn rhs(text: &str) -> Option<toml::Value> {
    toml::from_str::<toml::Table>(&format!("v = {text}")).ok()?.remove("v")
}

impl Doc {
    fn render(&self) -> String {
        if self.valid {
            return self.render_valid();
        }
        self.render_text()
    }

    /// The same content built as a tree (later keys replace earlier ones, a table never replaces
    /// a value) and serialized: valid TOML, so the planner's own paths run.
    fn render_valid(&self) -> String {
        let mut root = toml::Table::new();
        for (name, text) in [("version", &self.version), ("imports", &self.imports)] {
            if let Some(v) = text.as_deref().and_then(rhs) {
                root.insert(name.to_owned(), v);
            }
        }
        if self.disabled_cri {
            root.insert(
                "disabled_plugins".into(),
                toml::Value::Array(vec!["io.containerd.grpc.v1.cri".into()]),
            );
        }
        for (k, v) in &self.top {
            if k != "version" && k != "imports" {
                root.insert(k.clone(), to_toml(v));
            }
        }
        'tables: for (path, kvs) in &self.tables {
            let mut cur = &mut root;
            for p in path {
                let entry = cur.entry(p.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
                match entry {
                    toml::Value::Table(t) => cur = t,
                    _ => continue 'tables,
                }
            }
            for (k, v) in kvs {
                if !matches!(cur.get(k), Some(toml::Value::Table(_))) {
                    cur.insert(k.clone(), to_toml(v));
                }
            }
        }
        let mut out = String::from("# operator's comment\n");
        out.push_str(&toml::to_string(&root).unwrap());
        out
    }

    fn render_text(&self) -> String {
        let mut out = String::from("# operator's comment\n");
        if let Some(v) = &self.version {
            out.push_str(&format!("version = {v}\n"));
        }
        if let Some(i) = &self.imports {
            out.push_str(&format!("imports = {i}\n"));
        }
        if self.disabled_cri {
            out.push_str("disabled_plugins = [\"io.containerd.grpc.v1.cri\", \"cri\"]\n");
        }
        for (k, v) in &self.top {
            out.push_str(&format!("{} = {}\n", key(k), render_value(v)));
        }
        for (path, kvs) in &self.tables {
            let dotted: Vec<String> = path.iter().map(|p| key(p)).collect();
            if self.dotted && dotted.len() > 1 {
                // The same content as dotted keys under the first table: another TOML shape.
                out.push_str(&format!("\n[{}]\n", dotted[0]));
                for (k, v) in kvs {
                    out.push_str(&format!("{}.{} = {}\n", dotted[1..].join("."), key(k), render_value(v)));
                }
                continue;
            }
            out.push_str(&format!("\n[{}]\n", dotted.join(".")));
            for (k, v) in kvs {
                out.push_str(&format!("{} = {}\n", key(k), render_value(v)));
            }
        }
        out
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (
            any::<usize>(),
            prop::sample::select(vec![
                b"[".to_vec(),
                b"]".to_vec(),
                b"\"".to_vec(),
                b"=".to_vec(),
                b"\n[plugins]\n".to_vec(),
                b"\n[[plugins]]\n".to_vec(),
                b"\xff\xfe".to_vec(),
                b"\xc0\x80".to_vec(),
                b"\0".to_vec(),
                b"'''".to_vec(),
                b"\\u0000".to_vec(),
            ])
        )
            .prop_map(|(i, s)| Mutation::Insert(i, s)),
    ]
}

fn mutate(mut bytes: Vec<u8>, m: &Mutation) -> Vec<u8> {
    let len = bytes.len().max(1);
    match m {
        Mutation::Flip(i, b) => {
            if !bytes.is_empty() {
                bytes[i % len] = *b;
            }
        }
        Mutation::Truncate(i) => bytes.truncate(i % len),
        Mutation::Insert(i, s) => {
            let at = i % (bytes.len() + 1);
            bytes.splice(at..at, s.iter().copied());
        }
    }
    bytes
}

fn request(set_as_default: bool) -> RuntimeRequest {
    RuntimeRequest {
        handler: "nvidia".into(),
        shim_path: SHIM.into(),
        set_as_default,
        drop_in_path: DROP_IN.into(),
    }
}

/// Every leaf of a table, by dotted path (arrays are leaves).
fn leaves(table: &toml::Table, prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, toml::Value)>) {
    for (k, v) in table {
        prefix.push(k.clone());
        match v {
            toml::Value::Table(t) if !t.is_empty() => leaves(t, prefix, out),
            other => out.push((prefix.clone(), other.clone())),
        }
        prefix.pop();
    }
}

fn get<'a>(table: &'a toml::Table, path: &[&str]) -> Option<&'a toml::Value> {
    let (first, rest) = path.split_first()?;
    let v = table.get(*first)?;
    if rest.is_empty() { Some(v) } else { get(v.as_table()?, rest) }
}

fn without_imports(mut t: toml::Table) -> toml::Table {
    if t.get("imports").and_then(toml::Value::as_array).is_some_and(|a| a.is_empty()) {
        t.remove("imports");
    }
    t
}

/// The invariants of one plan (or refusal).
fn check_plan(
    sources: &ConfigSources,
    containerd: &ContainerdVersion,
    set_as_default: bool,
) -> Result<(), TestCaseError> {
    let req = request(set_as_default);
    let result = plan(sources, containerd, &req);
    let p = match result {
        Err(e) => {
            let shown = e.to_string();
            let paths: Vec<&str> =
                std::iter::once(MAIN).chain(sources.imported.iter().map(|f| f.path.as_str())).collect();
            prop_assert!(paths.iter().any(|p| shown.contains(p)), "error names no file: {}", shown);
            if let PlanError::NotATable { key, .. } = &e {
                prop_assert!(!key.is_empty() && shown.contains(key.as_str()), "{}", shown);
            }
            return Ok(());
        }
        Ok(p) => p,
    };

    // Both outputs are TOML.
    let drop_in: toml::Table = toml::from_str(&p.drop_in)
        .map_err(|e| TestCaseError::fail(format!("drop-in: {e}\n{}", p.drop_in)))?;
    let after_text = match &p.main {
        MainChange::Unchanged => sources.main.clone().expect("unchanged needs a main file"),
        MainChange::Update(t) | MainChange::Create(t) => t.clone(),
    };
    let after: toml::Table =
        toml::from_str(&after_text).map_err(|e| TestCaseError::fail(format!("main: {e}\n{after_text}")))?;
    if let MainChange::Create(_) = &p.main {
        prop_assert!(sources.main.is_none());
    }

    // Our runtime, under the plugin id of the file's version.
    let declared = match &sources.main {
        Some(m) => toml::from_str::<toml::Table>(m).unwrap().get("version").and_then(toml::Value::as_integer),
        None => Some(i64::from(containerd.max_config_version())),
    };
    let cri = match declared {
        None | Some(1) => "cri",
        Some(2) => "io.containerd.grpc.v1.cri",
        Some(3) => "io.containerd.cri.v1.runtime",
        Some(other) => return Err(TestCaseError::fail(format!("planned for version {other}"))),
    };
    let ours = get(&drop_in, &["plugins", cri, "containerd", "runtimes", "nvidia"])
        .and_then(toml::Value::as_table)
        .ok_or_else(|| TestCaseError::fail(format!("no runtime nvidia under {cri}:\n{}", p.drop_in)))?;
    let runtime_type = ours.get("runtime_type").and_then(toml::Value::as_str);
    match p.mode {
        RuntimeMode::ShimType => {
            prop_assert!(!containerd.honours_runtime_path());
            prop_assert_eq!(runtime_type, Some(SHIM_RUNTIME_TYPE));
            prop_assert!(ours.get("runtime_path").is_none());
        }
        RuntimeMode::RuntimePath => {
            prop_assert!(containerd.honours_runtime_path());
            prop_assert_eq!(runtime_type, Some(RUNC_RUNTIME_TYPE));
            prop_assert_eq!(ours.get("runtime_path").and_then(toml::Value::as_str), Some(SHIM));
        }
    }
    let annotations = ours.get("container_annotations").and_then(toml::Value::as_array);
    prop_assert!(annotations.is_some_and(|a| a.iter().any(|v| v.as_str() == Some(CDI_ANNOTATIONS))));
    prop_assert!(ours.get("pod_annotations").is_none(), "pod annotations in ours");
    if set_as_default {
        prop_assert_eq!(
            get(&drop_in, &["plugins", cri, "containerd", "default_runtime_name"])
                .and_then(toml::Value::as_str),
            Some("nvidia")
        );
    }

    // Foreign content. On 1.x the drop-in repeats the effective CRI section (the last file's):
    // every leaf of it that is not ours is carried with its value. On 2.x the drop-in holds only
    // ours. Either way the main file is the operator's plus one `imports` entry.
    let ours_prefix = |path: &[String]| {
        let p: Vec<&str> = path.iter().map(String::as_str).collect();
        p.starts_with(&["containerd", "runtimes", "nvidia"])
            || (set_as_default && p == ["containerd", "default_runtime_name"])
    };
    if !containerd.merges_plugin_sections() {
        let files: Vec<toml::Table> = sources
            .main
            .iter()
            .chain(sources.imported.iter().map(|f| &f.text))
            .map(|t| toml::from_str(t).unwrap())
            .collect();
        if let Some(section) = files.iter().rev().find_map(|f| get(f, &["plugins", cri])) {
            let section = section.as_table().expect("a planned CRI section is a table");
            let mut found = Vec::new();
            leaves(section, &mut Vec::new(), &mut found);
            for (path, value) in found.iter().filter(|(p, _)| !ours_prefix(p)) {
                let mut full: Vec<&str> = vec!["plugins", cri];
                full.extend(path.iter().map(String::as_str));
                let carried = get(&drop_in, &full);
                if value.as_table().is_some_and(toml::Table::is_empty) {
                    // An empty table stays a table; ours may have filled it.
                    prop_assert!(
                        carried.is_some_and(toml::Value::is_table),
                        "{:?} not carried:\n{}",
                        full,
                        p.drop_in
                    );
                } else {
                    prop_assert_eq!(carried, Some(value), "{:?} not carried:\n{}", full, p.drop_in);
                }
            }
        }
    } else {
        let mut found = Vec::new();
        leaves(&drop_in, &mut Vec::new(), &mut found);
        for (path, _) in &found {
            let p: Vec<&str> = path.iter().map(String::as_str).collect();
            let allowed =
                p == ["version"] || (p.len() > 3 && p[..2] == ["plugins", cri] && ours_prefix(&path[2..]));
            prop_assert!(allowed, "the 2.x drop-in sets {:?}", p);
        }
    }
    if let (Some(before), MainChange::Update(_)) = (&sources.main, &p.main) {
        let before: toml::Table = toml::from_str(before).unwrap();
        let mut stripped = after.clone();
        if let Some(list) = stripped.get_mut("imports").and_then(toml::Value::as_array_mut) {
            let n = list.len();
            list.retain(|v| v.as_str() != Some(DROP_IN));
            prop_assert_eq!(list.len() + 1, n, "exactly one imports entry added");
        } else {
            prop_assert!(false, "updated main file has no imports array");
        }
        prop_assert_eq!(without_imports(stripped), without_imports(before.clone()), "foreign keys changed");
        // Uninstall's edit gives the operator's file back.
        let removed = remove_import(MAIN, &after_text, DROP_IN)
            .map_err(|e| TestCaseError::fail(e.to_string()))?
            .ok_or_else(|| TestCaseError::fail("remove_import found no entry"))?;
        let removed: toml::Table = toml::from_str(&removed).unwrap();
        prop_assert_eq!(without_imports(removed), without_imports(before));
    }

    // Idempotent: planning on the result changes nothing more.
    let mut again = sources.clone();
    again.main = Some(after_text);
    let second =
        plan(&again, containerd, &req).map_err(|e| TestCaseError::fail(format!("second plan: {e}")))?;
    prop_assert_eq!(&second.main, &MainChange::Unchanged);
    prop_assert_eq!(&second.drop_in, &p.drop_in);
    prop_assert_eq!(second.mode, p.mode);
    Ok(())
}

fn sources(main: Option<String>, imported: Vec<String>, before: usize) -> ConfigSources {
    let imported: Vec<SourceFile> = imported
        .into_iter()
        .zip(IMPORTED)
        .map(|(text, path)| SourceFile { path: path.into(), text })
        .collect();
    let imported_before_drop_in = before.min(imported.len());
    ConfigSources { main_path: MAIN.into(), main, imported, imported_before_drop_in }
}

proptest! {
    #![proptest_config(config(128))]

    /// Generated configs, main file and up to two imports, every containerd version.
    #[test]
    fn generated_configs_plan_safely(
        main in prop::option::weighted(0.9, doc()),
        imported in prop::collection::vec(doc(), 0..3),
        before in 0usize..3,
        containerd in versions(),
        set_as_default in any::<bool>(),
        hostile_imports in prop::bool::weighted(0.2),
    ) {
        // Imports are mostly valid TOML, so that the cases reach the planner's merge rules.
        let imported = imported.into_iter().map(|mut d| {
            d.valid |= !hostile_imports;
            d.render()
        });
        let s = sources(main.map(|d| d.render()), imported.collect(), before);
        check_plan(&s, &containerd, set_as_default)?;
    }

    /// The same, with garbage mixed into the text (made UTF-8 the way a reader would have to).
    #[test]
    fn mutated_configs_plan_safely(
        main in doc(),
        muts in prop::collection::vec(mutation(), 1..4),
        containerd in versions(),
    ) {
        let mut bytes = main.render().into_bytes();
        for m in &muts {
            bytes = mutate(bytes, m);
        }
        let s = sources(Some(String::from_utf8_lossy(&bytes).into_owned()), vec![], 0);
        check_plan(&s, &containerd, false)?;
    }
}

proptest! {
    #![proptest_config(config(32))]

    /// Raw bytes on disk under a host root, through the reader (UTF-8 check, imports, globs) and
    /// then the planner: any refusal names the file.
    #[test]
    fn bytes_on_disk_read_and_plan_safely(
        main in doc(),
        import in doc(),
        muts in prop::collection::vec(mutation(), 0..3),
        containerd in versions(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let conf_d = dir.path().join("etc/containerd/conf.d");
        fs::create_dir_all(&conf_d).unwrap();
        let mut bytes = main.render().into_bytes();
        for m in &muts {
            bytes = mutate(bytes, m);
        }
        fs::write(dir.path().join("etc/containerd/config.toml"), &bytes).unwrap();
        fs::write(conf_d.join("10-a.toml"), mutate(import.render().into_bytes(), muts.first().unwrap_or(&Mutation::Truncate(usize::MAX)))).unwrap();
        let root = HostRoot::new(dir.path());
        match read_sources(&root, MAIN, DROP_IN, &containerd) {
            Err(e) => {
                let shown = e.to_string();
                prop_assert!(shown.contains("config.toml") || shown.contains("10-a.toml"), "error names no file: {}", shown);
            }
            Ok(s) => {
                prop_assert_eq!(s.main.as_deref().map(str::as_bytes), Some(bytes.as_slice()));
                check_plan(&s, &containerd, false)?;
            }
        }
    }
}

#[test]
fn the_foreign_content_check_can_fail() {
    // A plan that lost an operator's key must be caught: drop a key from a real plan's drop-in
    // and run the same comparison.
    let main = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\nsnapshotter = \"zfs\"\n";
    let s = sources(Some(main.into()), vec![], 0);
    let c = ContainerdVersion::new(1, 7, 20);
    check_plan(&s, &c, false).unwrap();
    let p = plan(&s, &c, &request(false)).unwrap();
    assert!(p.drop_in.contains("snapshotter = \"zfs\""), "{}", p.drop_in);
    let drop_in: toml::Table = toml::from_str(&p.drop_in.replace("snapshotter = \"zfs\"\n", "")).unwrap();
    assert!(get(&drop_in, &["plugins", "io.containerd.grpc.v1.cri", "containerd", "snapshotter"]).is_none());
}

#[test]
fn hostile_examples_are_refused_naming_file_and_key() {
    let c = ContainerdVersion::new(1, 7, 20);
    for (text, key) in [
        (
            "version = 2\n[plugins]\n\"io.containerd.grpc.v1.cri\" = 5\n",
            "plugins.\"io.containerd.grpc.v1.cri\"",
        ),
        ("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\ncontainerd = \"x\"\n", "containerd"),
        ("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\nruntimes = [1]\n", "runtimes"),
        ("version = \"2\"\n", "version"),
        ("imports = \"/etc/x.toml\"\n", "imports"),
        ("imports = [1]\n", "imports"),
    ] {
        let e = plan(&sources(Some(text.into()), vec![], 0), &c, &request(false)).unwrap_err().to_string();
        assert!(e.contains(MAIN) && e.contains(key), "{text:?}: {e}");
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// The whole install then uninstall on a host holding a generated config: whatever install
    /// did (or refused), uninstall leaves the operator's file byte for byte as it was, and a second
    /// install changes nothing.
    #[test]
    fn install_then_uninstall_restores_the_original_bytes(main in doc(), containerd in versions()) {
        let dir = tempfile::tempdir().unwrap();
        for d in ["host/etc/containerd/conf.d", "host/run", "host/usr/local/bin", "host/var/lib", "src"] {
            fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        let config = dir.path().join("host/etc/containerd/config.toml");
        let original = main.render();
        fs::write(&config, &original).unwrap();
        common::write_binaries(&dir.path().join("src"), |name| format!("#!/bin/sh\n# {name}\n").into_bytes());
        let mut settings = Settings::defaults(HostRoot::new(dir.path().join("host")), dir.path().join("src"));
        settings.lock_wait = Duration::from_millis(300);
        settings.dev_char_links = false;
        let fake = common::FakeContainerd::new(&containerd.raw);
        let hook = FaultHook::none();
        let installer =
            Installer { settings, containerd: &fake, spec: None, runtime_config: &ShimConfig, hook: &hook };
        match installer.install() {
            Err(e) => {
                // Refused: nothing was changed, and the message names the file.
                prop_assert_eq!(fs::read_to_string(&config).unwrap(), original.clone());
                prop_assert!(e.to_string().contains("config.toml"), "{}", e);
                prop_assert!(!dir.path().join("host/etc/containerd/conf.d/99-nvinject.toml").exists());
            }
            Ok(_) => {
                let installed = fs::read_to_string(&config).unwrap();
                let second = installer.install().map_err(|e| TestCaseError::fail(format!("second install: {e}")))?;
                let _ = second;
                prop_assert_eq!(fs::read_to_string(&config).unwrap(), installed, "second install changed the file");
                installer.uninstall().map_err(|e| TestCaseError::fail(format!("uninstall: {e}")))?;
                prop_assert_eq!(fs::read_to_string(&config).unwrap(), original, "uninstall did not restore the bytes");
                prop_assert!(!dir.path().join("host/etc/containerd/conf.d/99-nvinject.toml").exists());
            }
        }
    }
}
