//! The check on the crates under `tests/fixtures/` (see its README): one regression test per blind
//! spot of the check before issue 31, each a crate whose cycle shows only there, and controls that
//! must pass. The last tests run the binary as `./x lint` does, on a workspace made of a fixture.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// The shortest loop of each cycle the check reports for fixture `name`, as `a -> b`.
fn loops(name: &str) -> Vec<String> {
    let lib = fixture(name).join("src/lib.rs");
    nvinject_modcycles::crate_cycles(&lib)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .iter()
        .map(|c| c.modules[..c.loop_len].iter().map(|(m, _)| m.join("::")).collect::<Vec<_>>().join(" -> "))
        .collect()
}

/// The full report line of the fixture's only cycle.
fn report(name: &str) -> String {
    let cycles = nvinject_modcycles::crate_cycles(&fixture(name).join("src/lib.rs")).unwrap();
    assert_eq!(cycles.len(), 1, "{name}: {cycles:?}");
    cycles[0].to_string()
}

#[test]
fn a_path_inside_vec_is_an_edge_the_installers_shape() {
    assert_eq!(loops("macro-vec"), ["install -> runtime_config"]);
    let line = report("macro-vec");
    assert!(line.contains("uses crate::runtime_config::shim_spec_dirs (in vec!)"), "{line}");
    assert!(line.contains("runtime_config.rs uses crate::install::"), "{line}");
}

#[test]
fn a_path_in_format_arguments_is_an_edge() {
    assert_eq!(loops("macro-format"), ["a -> b"]);
}

#[test]
fn a_path_in_assert_arguments_is_an_edge() {
    assert_eq!(loops("macro-assert"), ["a -> b"]);
}

#[test]
fn a_path_in_a_matches_pattern_is_an_edge() {
    assert_eq!(loops("macro-matches"), ["a -> b"]);
}

#[test]
fn a_path_in_a_tracing_field_is_an_edge() {
    assert_eq!(loops("macro-tracing"), ["a -> b"]);
    assert!(report("macro-tracing").contains("crate::b::describe (in info!)"));
}

#[test]
fn a_path_in_a_macro_rules_body_is_an_edge() {
    assert_eq!(loops("macro-rules-body"), ["a -> b"]);
}

#[test]
fn a_serde_default_function_string_is_an_edge() {
    assert_eq!(loops("attr-serde-default"), ["a -> b"]);
    assert!(report("attr-serde-default").contains("crate::b::port (in #[serde])"));
}

#[test]
fn a_serde_with_module_string_is_an_edge() {
    assert_eq!(loops("attr-serde-with"), ["a -> b"]);
}

#[test]
fn a_serde_with_naming_a_child_by_its_bare_name_is_an_edge() {
    assert_eq!(loops("attr-serde-with-child"), ["a -> a::codec"]);
}

#[test]
fn serde_serialize_with_and_deserialize_with_strings_are_edges() {
    assert_eq!(loops("attr-serde-deserialize-with"), ["a -> b"]);
}

#[test]
fn a_path_in_a_serde_bound_string_is_an_edge() {
    assert_eq!(loops("attr-serde-bound"), ["a -> b"]);
}

#[test]
fn an_attribute_string_that_is_a_whole_crate_path_is_an_edge_under_any_key() {
    assert_eq!(loops("attr-crate-path-string"), ["a -> b"]);
}

#[test]
fn a_path_through_a_re_export_alias_names_the_re_exporting_module_too() {
    assert_eq!(loops("reexport-alias"), ["b -> c"]);
    let line = report("reexport-alias");
    assert!(line.contains("uses crate::b::Alias"), "{line}");
}

#[test]
fn a_pub_use_re_export_is_an_edge_to_the_module_it_re_exports_from() {
    assert_eq!(loops("reexport-pub-use"), ["a -> b"]);
    assert!(report("reexport-pub-use").contains("crate::a::make (re-export)"));
}

#[test]
fn a_path_through_a_glob_re_export_reaches_the_defining_module() {
    assert_eq!(loops("reexport-glob"), ["a -> c"]);
    let line = report("reexport-glob");
    assert!(line.contains("in the same tangle: b"), "{line}");
    assert!(line.contains("crate::b::Thing (re-exported by b)"), "{line}");
}

#[test]
fn paths_in_strings_docs_and_messages_are_no_edges() {
    assert_eq!(loops("control-text-only"), Vec::<String>::new());
}

#[test]
fn a_facade_above_the_user_is_no_edge_to_the_facade() {
    assert_eq!(loops("control-facade"), Vec::<String>::new());
}

/// A workspace in a temp dir whose one member is a copy of fixture `name`.
fn workspace(name: &str) -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), target).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("Cargo.toml"), "[workspace]\nmembers = [\"member\"]\n").unwrap();
    copy(&fixture(name).join("src"), &dir.path().join("member/src"));
    std::fs::write(dir.path().join("member/Cargo.toml"), format!("[package]\nname = \"{name}\"\n")).unwrap();
    dir
}

#[test]
fn the_binary_fails_on_a_cycle_and_names_it() {
    let dir = workspace("macro-vec");
    let out = Command::new(env!("CARGO_BIN_EXE_nvinject-modcycles")).arg(dir.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("module cycle in macro-vec: install -> runtime_config -> install"), "{stdout}");
}

#[test]
fn the_binary_passes_a_crate_without_one() {
    let dir = workspace("control-text-only");
    let out = Command::new(env!("CARGO_BIN_EXE_nvinject-modcycles")).arg(dir.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("no module cycles (1 crate roots read)"), "{stdout}");
}
