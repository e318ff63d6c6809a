//! Table-driven containerd config transformations: every directory under `tests/fixtures/`
//! holds a `before.toml` (absent: no config file), `case.toml` (containerd version and request),
//! the expected `after-dropin.toml` and `after-main.toml`, and a README saying what it represents.
//!
//! Set `NVINJECT_BLESS=1` to rewrite the expected files from the current output (then review
//! the diff: these files are the specification).

mod common;

use std::fs;
use std::path::Path;

use common::{Case, fixture_dirs};
use nvinject_installer::containerd::{
    ConfigSources, ContainerdVersion, MainChange, RuntimeMode, RuntimeRequest, SourceFile, plan,
    remove_import,
};

fn load(dir: &Path) -> (Case, ConfigSources, RuntimeRequest) {
    let case = Case::read(dir);
    let sources = ConfigSources {
        main_path: case.main_path.clone(),
        main: fs::read_to_string(dir.join("before.toml")).ok(),
        imported: case
            .imported
            .iter()
            .map(|i| SourceFile {
                path: i.path.clone(),
                text: fs::read_to_string(dir.join(&i.file)).unwrap(),
            })
            .collect(),
        imported_before_drop_in: case.imported.iter().take_while(|i| !i.after_drop_in).count(),
    };
    let request = RuntimeRequest {
        handler: case.handler.clone(),
        shim_path: case.shim_path.clone(),
        set_as_default: case.set_as_default,
        drop_in_path: case.drop_in_path.clone(),
    };
    (case, sources, request)
}

fn check_or_bless(path: &Path, actual: &str, failures: &mut Vec<String>) {
    if std::env::var_os("NVINJECT_BLESS").is_some() {
        fs::write(path, actual).unwrap();
        return;
    }
    match fs::read_to_string(path) {
        Ok(expected) if expected == actual => {}
        Ok(expected) => failures.push(format!(
            "{} differs.\n--- expected\n{expected}\n--- actual\n{actual}\n---",
            path.display()
        )),
        Err(e) => failures.push(format!("{}: {e}", path.display())),
    }
}

#[test]
fn every_fixture_plans_the_committed_result() {
    let dirs = fixture_dirs();
    assert!(dirs.len() >= 10, "fixtures missing: found {}", dirs.len());
    let mut failures = Vec::new();
    for dir in &dirs {
        assert!(dir.join("README.md").exists(), "{} has no README.md", dir.display());
        let (case, sources, request) = load(dir);
        let containerd = ContainerdVersion::parse(&case.containerd).unwrap();
        let result = plan(&sources, &containerd, &request);
        if let Some(expected) = &case.error {
            match result {
                Err(e) => assert!(e.to_string().contains(expected), "{}: error {e:?}", dir.display()),
                Ok(p) => failures.push(format!("{}: planned instead of failing: {p:?}", dir.display())),
            }
            continue;
        }
        let p = result.unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        if let Some(mode) = &case.mode {
            let actual = match p.mode {
                RuntimeMode::RuntimePath => "runtime-path",
                RuntimeMode::ShimType => "shim-type",
            };
            assert_eq!(actual, mode, "{}: mode", dir.display());
        }
        for w in &case.warnings {
            assert!(
                p.warnings.iter().any(|x| x.contains(w)),
                "{}: no warning with {w:?}: {:?}",
                dir.display(),
                p.warnings
            );
        }
        assert_eq!(p.warnings.len(), case.warnings.len(), "{}: warnings {:?}", dir.display(), p.warnings);
        check_or_bless(&dir.join("after-dropin.toml"), &p.drop_in, &mut failures);
        let main_after = match &p.main {
            MainChange::Unchanged => sources.main.clone().unwrap(),
            MainChange::Update(text) | MainChange::Create(text) => text.clone(),
        };
        check_or_bless(&dir.join("after-main.toml"), &main_after, &mut failures);
        // Both outputs are TOML containerd can parse.
        toml::from_str::<toml::Table>(&p.drop_in)
            .unwrap_or_else(|e| panic!("{}: drop-in: {e}", dir.display()));
        toml::from_str::<toml::Table>(&main_after).unwrap_or_else(|e| panic!("{}: main: {e}", dir.display()));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn planning_the_result_again_changes_nothing() {
    for dir in fixture_dirs() {
        let (case, mut sources, request) = load(&dir);
        if case.error.is_some() {
            continue;
        }
        let containerd = ContainerdVersion::parse(&case.containerd).unwrap();
        let first = plan(&sources, &containerd, &request).unwrap();
        if let MainChange::Update(t) | MainChange::Create(t) = &first.main {
            sources.main = Some(t.clone());
        }
        let second = plan(&sources, &containerd, &request).unwrap();
        assert_eq!(second.main, MainChange::Unchanged, "{}", dir.display());
        assert_eq!(second.drop_in, first.drop_in, "{}", dir.display());
    }
}

#[test]
fn removing_the_import_restores_the_main_file_semantics() {
    for dir in fixture_dirs() {
        let (case, sources, request) = load(&dir);
        let (Some(before), None) = (&sources.main, &case.error) else { continue };
        let containerd = ContainerdVersion::parse(&case.containerd).unwrap();
        let MainChange::Update(after) = plan(&sources, &containerd, &request).unwrap().main else { continue };
        let removed = remove_import(&case.main_path, &after, &case.drop_in_path).unwrap().unwrap();
        let parse = |t: &str| toml::from_str::<toml::Table>(t).unwrap();
        let mut expected = parse(before);
        if expected.get("imports").and_then(|v| v.as_array()).is_some_and(|a| a.is_empty()) {
            expected.remove("imports");
        }
        assert_eq!(parse(&removed), expected, "{}", dir.display());
    }
}

/// Runs the real `containerd config dump` on a config tree and returns the merged result.
fn dump(main: &Path) -> toml::Table {
    let out = std::process::Command::new("containerd")
        .arg("--config")
        .arg(main)
        .args(["config", "dump"])
        .output()
        .expect("containerd is not installed: apt-get install containerd (the tests use Debian's 1.6.20)");
    assert!(
        out.status.success(),
        "containerd config dump {}: {}",
        main.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    toml::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap()
}

fn remove_path(table: &mut toml::Table, path: &[&str]) {
    let Some((last, parents)) = path.split_last() else { return };
    let mut cur = table;
    for p in parents {
        match cur.get_mut(*p).and_then(|v| v.as_table_mut()) {
            Some(t) => cur = t,
            None => return,
        }
    }
    cur.remove(*last);
}

/// The effective configuration containerd 1.6 builds from `before` plus our runtime is exactly
/// the one it builds from `before` alone, except for the `nvidia` runtime (and the default
/// runtime name when asked): nothing of the operator's configuration is lost or changed.
#[test]
fn real_containerd_reads_every_1x_result_with_nothing_else_changed() {
    let mut checked = 0;
    for dir in fixture_dirs() {
        let (case, sources, request) = load(&dir);
        let containerd = ContainerdVersion::parse(&case.containerd).unwrap();
        if case.error.is_some() || containerd.major != 1 {
            continue;
        }
        let p = plan(&sources, &containerd, &request).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let at = |host: &str| tmp.path().join(host.trim_start_matches('/'));
        let relocate = |text: &str| {
            let mut text = text.replace(&case.drop_in_path, &at(&case.drop_in_path).to_string_lossy());
            for i in &case.imported {
                text = text.replace(&i.path, &at(&i.path).to_string_lossy());
            }
            text
        };
        let write = |host: &str, text: &str| {
            let path = at(host);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, relocate(text)).unwrap();
        };
        for (i, f) in case.imported.iter().zip(&sources.imported) {
            write(&i.path, &f.text);
        }
        let before = match &sources.main {
            Some(text) => {
                write(&case.main_path, text);
                dump(&at(&case.main_path))
            }
            None => {
                let empty = tmp.path().join("empty.toml");
                fs::write(&empty, "").unwrap();
                dump(&empty)
            }
        };
        let main_after = match &p.main {
            MainChange::Unchanged => sources.main.clone().unwrap(),
            MainChange::Update(t) | MainChange::Create(t) => t.clone(),
        };
        write(&case.main_path, &main_after);
        write(&case.drop_in_path, &p.drop_in);
        let mut after = dump(&at(&case.main_path));

        let cri = if after["plugins"].get("io.containerd.grpc.v1.cri").is_some() {
            "io.containerd.grpc.v1.cri"
        } else {
            "cri"
        };
        match after["plugins"].get(cri) {
            // containerd does not even load a disabled CRI plugin's section; the fixture warns.
            None => assert!(
                case.warnings.iter().any(|w| w.contains("turns off the CRI plugin")),
                "{}",
                dir.display()
            ),
            Some(section) => {
                let ours = section["containerd"]["runtimes"]
                    .get(&case.handler)
                    .unwrap_or_else(|| panic!("{}: no runtime {}", dir.display(), case.handler));
                let expected_type = if containerd.honours_runtime_path() {
                    "io.containerd.runc.v2"
                } else {
                    "io.containerd.nvinject.v2"
                };
                assert_eq!(ours["runtime_type"].as_str(), Some(expected_type), "{}", dir.display());
                assert_eq!(
                    ours["container_annotations"].as_array().unwrap(),
                    &vec![toml::Value::from("cdi.k8s.io/*")],
                    "{}",
                    dir.display()
                );
                assert!(ours["pod_annotations"].as_array().unwrap().is_empty(), "{}", dir.display());
            }
        }

        let mut before = before;
        drop_zero_options(&mut before);
        drop_zero_options(&mut after);
        remove_path(&mut before, &["imports"]);
        remove_path(&mut after, &["imports"]);
        remove_path(&mut after, &["plugins", cri, "containerd", "runtimes", &case.handler]);
        if case.set_as_default {
            assert_eq!(
                after["plugins"][cri]["containerd"]["default_runtime_name"].as_str(),
                Some(case.handler.as_str())
            );
            remove_path(&mut after, &["plugins", cri, "containerd", "default_runtime_name"]);
            remove_path(&mut before, &["plugins", cri, "containerd", "default_runtime_name"]);
        }
        if existing_handler(&sources, &case.handler) {
            remove_path(&mut before, &["plugins", cri, "containerd", "runtimes", &case.handler]);
        }
        assert_eq!(
            toml::to_string(&after).unwrap(),
            toml::to_string(&before).unwrap(),
            "{}: containerd's effective config changed beyond the nvidia runtime",
            dir.display()
        );
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} fixtures checked against containerd");
}

/// containerd's built-in `runc` entry spells "no options" as every runc option at its zero
/// value; a configured `runc` without options dumps an empty table. Both give runc its defaults,
/// so zero-valued options are dropped before comparing.
fn drop_zero_options(table: &mut toml::Table) {
    for (key, value) in table.iter_mut() {
        if let Some(t) = value.as_table_mut() {
            if key == "options" {
                t.retain(|_, v| {
                    !matches!(v, toml::Value::String(s) if s.is_empty())
                        && !matches!(v, toml::Value::Integer(0))
                        && !matches!(v, toml::Value::Boolean(false))
                });
            }
            drop_zero_options(t);
        }
    }
}

fn existing_handler(sources: &ConfigSources, handler: &str) -> bool {
    sources.main.as_deref().is_some_and(|t| t.contains(&format!(".runtimes.{handler}]")))
}
