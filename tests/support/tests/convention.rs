//! Every root-only test of the workspace follows the one convention (see the crate's doc): marked
//! `#[ignore = "needs root"]` and calling `require_root` in its body; no test calls it unmarked, none
//! carries the marker without the call, and no other `#[ignore]` exists (an ignored test that nothing
//! runs is a test that cannot fail).

use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).expect("tests/support is two levels down").into()
}

/// Every `.rs` file below `dir`, skipping build outputs, hidden folders and the module-cycle check's
/// fixture crates (code it reads, not code that runs).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            if name != "target" && name != "fixtures" && !name.starts_with('.') {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// True when `tokens` hold the identifier `ident`, at any depth.
fn mentions(tokens: TokenStream, ident: &str) -> bool {
    tokens.into_iter().any(|t| match t {
        TokenTree::Ident(i) => i == ident,
        TokenTree::Group(g) => mentions(g.stream(), ident),
        _ => false,
    })
}

/// Finds `require_root` anywhere in a body: calls, paths, and inside macro arguments.
#[derive(Default)]
struct CallsRequireRoot(bool);

impl<'ast> Visit<'ast> for CallsRequireRoot {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.segments.last().is_some_and(|s| s.ident == "require_root") {
            self.0 = true;
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        if mentions(mac.tokens.clone(), "require_root") {
            self.0 = true;
        }
    }
}

/// What the convention checks of one function.
#[derive(Debug, PartialEq, Eq)]
enum Finding {
    /// `#[ignore = "needs root"]` but no `require_root` call: by hand it is ignored, under CI it runs
    /// without saying why it needs root.
    MarkedWithoutCheck,
    /// A `require_root` call without the marker: by hand without root it fails instead of being ignored.
    CheckWithoutMarker,
    /// Some other `#[ignore]`: nothing runs it.
    OtherIgnore(String),
}

fn check_fn(attrs: &[syn::Attribute], block: &syn::Block) -> Option<Finding> {
    let is_test = attrs.iter().any(|a| {
        let p = a.path();
        p.is_ident("test") || p.segments.last().is_some_and(|s| s.ident == "test")
    });
    let mut marked = false;
    for attr in attrs.iter().filter(|a| a.path().is_ident("ignore")) {
        match &attr.meta {
            syn::Meta::NameValue(nv) if matches!(&nv.value, syn::Expr::Lit(l) if matches!(&l.lit, syn::Lit::Str(s) if s.value() == nvinject_test_support::MARKER)) =>
            {
                marked = true;
            }
            other => {
                let text = match other {
                    syn::Meta::Path(_) => "#[ignore]".to_owned(),
                    syn::Meta::NameValue(nv) => match &nv.value {
                        syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => {
                            format!("#[ignore = {:?}]", s.value())
                        }
                        _ => "#[ignore = ..]".to_owned(),
                    },
                    syn::Meta::List(_) => "#[ignore(..)]".to_owned(),
                };
                return Some(Finding::OtherIgnore(text));
            }
        }
    }
    let mut calls = CallsRequireRoot::default();
    calls.visit_block(block);
    match (is_test, marked, calls.0) {
        (_, true, false) => Some(Finding::MarkedWithoutCheck),
        (true, false, true) => Some(Finding::CheckWithoutMarker),
        _ => None,
    }
}

struct Collect<'a> {
    file: &'a Path,
    out: Vec<String>,
}

impl Collect<'_> {
    fn report(&mut self, name: &syn::Ident, finding: Option<Finding>) {
        if let Some(f) = finding {
            self.out.push(format!("{}: fn {name}: {f:?}", self.file.display()));
        }
    }
}

impl<'ast> Visit<'ast> for Collect<'_> {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.report(&f.sig.ident, check_fn(&f.attrs, &f.block));
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.report(&f.sig.ident, check_fn(&f.attrs, &f.block));
        syn::visit::visit_impl_item_fn(self, f);
    }
}

fn findings_in(file: &Path, source: &str) -> Vec<String> {
    let parsed = syn::parse_file(source).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut c = Collect { file, out: Vec::new() };
    c.visit_file(&parsed);
    c.out
}

#[test]
fn every_root_only_test_is_marked_and_checks_root() {
    let mut files = Vec::new();
    rust_files(&workspace(), &mut files);
    assert!(files.len() > 100, "found only {} Rust files under {}", files.len(), workspace().display());
    let mut findings = Vec::new();
    let mut marked = 0;
    for file in &files {
        let source = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        marked += source.matches("#[ignore = \"needs root\"]").count();
        findings.extend(findings_in(file, &source));
    }
    assert!(
        findings.is_empty(),
        "tests that break the root-only convention (tests/support/src/lib.rs):\n  {}",
        findings.join("\n  ")
    );
    // The count, so that a run shows how many tests only `--include-ignored` as root runs.
    println!("{marked} root-only tests, {} files read", files.len());
}

#[test]
fn the_check_finds_each_way_of_breaking_the_convention() {
    let source = r#"
        #[test]
        #[ignore = "needs root"]
        fn good() { nvinject_test_support::require_root("mknod"); }
        #[test]
        #[ignore = "needs root"]
        fn marked_only() {}
        #[test]
        fn check_only() { require_root("mount"); }
        #[test]
        #[ignore]
        fn plain_ignore() {}
        #[test]
        #[ignore = "slow"]
        fn other_reason() {}
        #[test]
        fn in_a_macro() { assert!({ require_root("x"); true }); }
        fn helper_not_a_test() { require_root("x"); }
    "#;
    let found = findings_in(Path::new("f.rs"), source);
    assert_eq!(
        found,
        [
            "f.rs: fn marked_only: MarkedWithoutCheck",
            "f.rs: fn check_only: CheckWithoutMarker",
            "f.rs: fn plain_ignore: OtherIgnore(\"#[ignore]\")",
            "f.rs: fn other_reason: OtherIgnore(\"#[ignore = \\\"slow\\\"]\")",
            "f.rs: fn in_a_macro: CheckWithoutMarker",
        ]
    );
}
