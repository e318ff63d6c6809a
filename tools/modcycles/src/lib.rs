//! Finds module cycles inside each crate of the workspace, for `./x lint`.
//!
//! A crate's modules form a graph: module `a` has an edge to module `b` when code in `a` names
//! `b` or an item of `b` (`use crate::b::..`, a `crate::b::f()` path, `super::..`, `self::..`, a
//! child module by name, or a name `a` imported earlier). Declaring a child (`mod b;`) is no edge:
//! a parent using its child is fine on its own, and only a way back (child to parent, or sibling
//! to sibling) closes a cycle. A path through a re-export (`crate::Kind` where the root has
//! `pub use name::Kind`) counts as naming the module that defines it, so a crate root's facade
//! makes no cycle, and a `pub use` re-export is no edge by itself. `#[cfg(test)]` modules are left out: a test module's `use super::*` is not part
//! of the crate's structure.
//!
//! Boundary: reads `src/` of each workspace member (library, main and bin roots, following `mod`
//! declarations); never builds, never reads tests, benches or build scripts. Paths inside macro
//! invocations are not seen (they are token streams to a parser).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// Why a crate or workspace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A Rust file does not parse.
    #[error("{path}: not valid Rust: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        source: syn::Error,
    },
    /// A `Cargo.toml` is not what a workspace or package manifest looks like.
    #[error("{path}: {message}")]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// A module path inside one crate root: empty for the root, `["a", "b"]` for `a::b`.
pub type ModPath = Vec<String>;

/// One cycle: the modules in it, in order (the first is repeated implicitly at the end), with
/// their files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    /// The crate root file the modules belong to (`src/lib.rs`, `src/main.rs`, ...).
    pub root: PathBuf,
    /// The modules, each with the file that defines it.
    pub modules: Vec<(ModPath, PathBuf)>,
    /// How many of `modules` form the shortest loop shown; the rest are in the same tangle
    /// (each reaches and is reached from the loop).
    pub loop_len: usize,
    /// For each loop module, the path it writes that names the next one (the last names the first).
    pub because: Vec<String>,
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |m: &ModPath| if m.is_empty() { "crate".to_owned() } else { m.join("::") };
        let mut chain: Vec<String> = self.modules[..self.loop_len].iter().map(|(m, _)| name(m)).collect();
        chain.push(name(&self.modules[0].0));
        let why: Vec<String> = self
            .modules
            .iter()
            .zip(&self.because)
            .map(|((_, file), path)| format!("{} uses {path}", file.display()))
            .collect();
        write!(f, "{} ({})", chain.join(" -> "), why.join("; "))?;
        if self.modules.len() > self.loop_len {
            let rest: Vec<String> = self.modules[self.loop_len..].iter().map(|(m, _)| name(m)).collect();
            write!(f, "; in the same tangle: {}", rest.join(", "))?;
        }
        Ok(())
    }
}

/// A parsed module: where it is and what it contains (nested inline modules excluded).
struct Module {
    file: PathBuf,
    items: Vec<syn::Item>,
}

/// All modules of one crate root, by path.
struct Tree {
    modules: BTreeMap<ModPath, Module>,
}

fn read(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|source| Error::Read { path: path.to_owned(), source })
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Meta>().is_ok_and(|m| m.path().is_ident("test"))
    })
}

fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find(|a| a.path().is_ident("path")).and_then(|a| match &a.meta {
        syn::Meta::NameValue(nv) => match &nv.value {
            syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

impl Tree {
    fn load(root: &Path) -> Result<Tree, Error> {
        let mut tree = Tree { modules: BTreeMap::new() };
        let file =
            syn::parse_file(&read(root)?).map_err(|source| Error::Parse { path: root.to_owned(), source })?;
        let dir = root.parent().unwrap_or(Path::new(".")).to_owned();
        tree.add(Vec::new(), root, file.items, &dir)?;
        Ok(tree)
    }

    /// Adds module `path` defined in `file` with `items`; its file children live in `child_dir`.
    fn add(
        &mut self,
        path: ModPath,
        file: &Path,
        items: Vec<syn::Item>,
        child_dir: &Path,
    ) -> Result<(), Error> {
        let mut own = Vec::new();
        for item in items {
            let syn::Item::Mod(m) = item else {
                own.push(item);
                continue;
            };
            if is_cfg_test(&m.attrs) {
                continue;
            }
            let name = m.ident.to_string();
            let mut child = path.clone();
            child.push(name.clone());
            match m.content {
                Some((_, inner)) => self.add(child, file, inner, &child_dir.join(&name))?,
                None => {
                    let (child_file, grandchild_dir) = match path_attr(&m.attrs) {
                        Some(p) => {
                            let f = file.parent().unwrap_or(Path::new(".")).join(p);
                            let d = f.parent().unwrap_or(Path::new(".")).to_owned();
                            (f, d)
                        }
                        None => {
                            let flat = child_dir.join(format!("{name}.rs"));
                            if flat.is_file() {
                                (flat, child_dir.join(&name))
                            } else {
                                (child_dir.join(&name).join("mod.rs"), child_dir.join(&name))
                            }
                        }
                    };
                    let parsed = syn::parse_file(&read(&child_file)?)
                        .map_err(|source| Error::Parse { path: child_file.clone(), source })?;
                    self.add(child, &child_file, parsed.items, &grandchild_dir)?;
                }
            }
        }
        self.modules.insert(path, Module { file: file.to_owned(), items: own });
        Ok(())
    }

    /// The names each module imports with `use`, mapped to the absolute path they stand for.
    fn imports(&self) -> BTreeMap<ModPath, BTreeMap<String, ModPath>> {
        let mut out = BTreeMap::new();
        for (path, module) in &self.modules {
            let mut names = BTreeMap::new();
            for item in &module.items {
                if let syn::Item::Use(u) = item {
                    for (segments, alias) in flatten_use(&u.tree) {
                        if let (Some(alias), Some(abs)) =
                            (alias, self.absolute(path, &segments, &BTreeMap::new()))
                        {
                            names.insert(alias, abs);
                        }
                    }
                }
            }
            out.insert(path.clone(), names);
        }
        out
    }

    /// The absolute path `segments` names from module `at`, when it starts inside this crate.
    fn absolute(
        &self,
        at: &ModPath,
        segments: &[String],
        imports: &BTreeMap<String, ModPath>,
    ) -> Option<ModPath> {
        let first = segments.first()?;
        match first.as_str() {
            "crate" => Some(segments[1..].to_vec()),
            "self" => Some(at.iter().chain(&segments[1..]).cloned().collect()),
            "super" => {
                let mut base = at.clone();
                let mut rest = segments;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
                Some(base.into_iter().chain(rest.iter().cloned()).collect())
            }
            _ => {
                let mut child = at.clone();
                child.push(first.clone());
                if self.modules.contains_key(&child) {
                    Some(at.iter().chain(segments).cloned().collect())
                } else {
                    imports.get(first).map(|abs| abs.iter().chain(&segments[1..]).cloned().collect())
                }
            }
        }
    }

    /// The module an absolute path ends in: its longest module prefix, followed through that
    /// module's imports when the next segment is an imported name (re-exports).
    fn target(&self, abs: &[String], imports: &BTreeMap<ModPath, BTreeMap<String, ModPath>>) -> ModPath {
        let mut abs = abs.to_vec();
        for _ in 0..8 {
            let len = (0..=abs.len()).rev().find(|n| self.modules.contains_key(&abs[..*n])).unwrap_or(0);
            let module = abs[..len].to_vec();
            let Some(next) = abs.get(len) else { return module };
            match imports.get(&module).and_then(|names| names.get(next)) {
                Some(through) if through.as_slice() != &abs[..=len] => {
                    abs = through.iter().chain(&abs[len + 1..]).cloned().collect();
                }
                _ => return module,
            }
        }
        abs
    }

    /// Each module's edges, with the first path written that made each one.
    fn edges(&self) -> BTreeMap<ModPath, BTreeMap<ModPath, String>> {
        let imports = self.imports();
        let mut edges: BTreeMap<ModPath, BTreeMap<ModPath, String>> = BTreeMap::new();
        for (path, module) in &self.modules {
            let mut paths = Paths::default();
            for item in &module.items {
                paths.visit_item(item);
            }
            let own = &imports[path];
            let targets = edges.entry(path.clone()).or_default();
            for segments in &paths.found {
                if let Some(abs) = self.absolute(path, segments, own) {
                    let target = self.target(&abs, &imports);
                    if &target != path {
                        targets.entry(target).or_insert_with(|| segments.join("::"));
                    }
                }
            }
        }
        edges
    }
}

/// Each path a `use` tree imports, with the name it binds (`None` for a glob).
fn flatten_use(tree: &syn::UseTree) -> Vec<(Vec<String>, Option<String>)> {
    fn walk(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                walk(&p.tree, prefix, out);
                prefix.pop();
            }
            syn::UseTree::Name(n) if n.ident == "self" => {
                out.push((prefix.clone(), prefix.last().cloned()));
            }
            syn::UseTree::Name(n) => {
                let mut full = prefix.clone();
                full.push(n.ident.to_string());
                out.push((full, Some(n.ident.to_string())));
            }
            syn::UseTree::Rename(r) => {
                let mut full = prefix.clone();
                if r.ident != "self" {
                    full.push(r.ident.to_string());
                }
                out.push((full, Some(r.rename.to_string())));
            }
            syn::UseTree::Glob(_) => out.push((prefix.clone(), None)),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    walk(t, prefix, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(tree, &mut Vec::new(), &mut out);
    out
}

/// Every path written in a module's own items (not its nested modules), `use` trees included.
#[derive(Default)]
struct Paths {
    found: Vec<Vec<String>>,
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {
        // Nested modules are nodes of their own.
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        // A re-export (`pub use child::X`) only exposes the other module's item; it is followed
        // when resolving paths, but is no use of its own.
        if !matches!(u.vis, syn::Visibility::Inherited) {
            return;
        }
        self.found.extend(flatten_use(&u.tree).into_iter().map(|(p, _)| p));
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() && p.segments.len() > 1 {
            self.found.push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, p);
    }
}

/// The cycles among the modules of the crate whose root file is `root`, each once, smallest
/// module first; empty when there are none.
pub fn crate_cycles(root: &Path) -> Result<Vec<Cycle>, Error> {
    let tree = Tree::load(root)?;
    let edges = tree.edges();
    let mut cycles = Vec::new();
    for component in strongly_connected(&edges) {
        if component.len() < 2 {
            continue;
        }
        let (order, loop_len) = order_cycle(&component, &edges);
        // Why each loop module reaches the next.
        let because = (0..loop_len)
            .map(|i| {
                let next = &order[(i + 1) % loop_len];
                let out = &edges[&order[i]];
                out.get(next)
                    .or_else(|| out.iter().find(|(m, _)| component.contains(m)).map(|(_, p)| p))
                    .cloned()
                    .unwrap_or_default()
            })
            .collect();
        let modules = order
            .into_iter()
            .map(|m| {
                let file = tree.modules[&m].file.clone();
                (m, file)
            })
            .collect();
        cycles.push(Cycle { root: root.to_owned(), modules, loop_len, because });
    }
    Ok(cycles)
}

/// Tarjan's strongly connected components, each sorted.
fn strongly_connected(edges: &BTreeMap<ModPath, BTreeMap<ModPath, String>>) -> Vec<Vec<ModPath>> {
    struct State<'a> {
        edges: &'a BTreeMap<ModPath, BTreeMap<ModPath, String>>,
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on_stack: BTreeSet<&'a ModPath>,
        out: Vec<Vec<ModPath>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a ModPath) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.edges.get(v).into_iter().flat_map(BTreeMap::keys) {
            if !s.edges.contains_key(w) {
                continue;
            }
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            component.sort();
            s.out.push(component);
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

/// The shortest cycle through the component's smallest module (breadth-first over edges inside
/// the component), then the component's other modules, so a tangle reads from its tightest loop.
fn order_cycle(
    component: &[ModPath],
    edges: &BTreeMap<ModPath, BTreeMap<ModPath, String>>,
) -> (Vec<ModPath>, usize) {
    let start = &component[0];
    let mut came_from: BTreeMap<&ModPath, &ModPath> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    let mut last = None;
    while let Some(m) = queue.pop_front() {
        for next in edges[m].keys().filter(|n| component.contains(n)) {
            if next == start {
                last = Some(m);
                break;
            }
            if !came_from.contains_key(next) {
                came_from.insert(next, m);
                queue.push_back(next);
            }
        }
        if last.is_some() {
            break;
        }
    }
    let mut order = Vec::new();
    let mut at = last.expect("a strongly connected component of two or more has a cycle");
    while at != start {
        order.push(at.clone());
        at = came_from[at];
    }
    order.push(start.clone());
    order.reverse();
    let loop_len = order.len();
    order.extend(component.iter().filter(|m| !order.contains(m)).cloned().collect::<Vec<_>>());
    (order, loop_len)
}

/// A workspace member: its package name and its crate root files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The package name.
    pub name: String,
    /// `src/lib.rs`, `src/main.rs`, `src/bin/*.rs` and `[[bin]]` paths that exist.
    pub roots: Vec<PathBuf>,
}

/// The members of the workspace whose `Cargo.toml` is in `root`.
pub fn workspace_members(root: &Path) -> Result<Vec<Member>, Error> {
    let manifest = root.join("Cargo.toml");
    let bad =
        |path: &Path, message: &str| Error::Manifest { path: path.to_owned(), message: message.to_owned() };
    let doc: toml::Table =
        read(&manifest)?.parse().map_err(|e: toml::de::Error| bad(&manifest, &e.to_string()))?;
    let members = doc
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(toml::Value::as_array)
        .ok_or_else(|| bad(&manifest, "no [workspace] members list"))?;
    let mut out = Vec::new();
    for member in members {
        let dir = root.join(member.as_str().ok_or_else(|| bad(&manifest, "a member is not a string"))?);
        let path = dir.join("Cargo.toml");
        let pkg: toml::Table =
            read(&path)?.parse().map_err(|e: toml::de::Error| bad(&path, &e.to_string()))?;
        let name = pkg
            .get("package")
            .and_then(|p| p.get("name"))
            .and_then(toml::Value::as_str)
            .ok_or_else(|| bad(&path, "no [package] name"))?
            .to_owned();
        let mut roots: Vec<PathBuf> = ["src/lib.rs", "src/main.rs"].iter().map(|r| dir.join(r)).collect();
        if let Ok(bins) = std::fs::read_dir(dir.join("src/bin")) {
            roots.extend(
                bins.filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "rs") || p.join("main.rs").is_file()),
            );
        }
        for bin in pkg.get("bin").and_then(toml::Value::as_array).into_iter().flatten() {
            if let Some(p) = bin.get("path").and_then(toml::Value::as_str) {
                roots.push(dir.join(p));
            }
        }
        let mut roots: Vec<PathBuf> = roots
            .into_iter()
            .map(|p| if p.is_dir() { p.join("main.rs") } else { p })
            .filter(|p| p.is_file())
            .collect();
        roots.sort();
        roots.dedup();
        out.push(Member { name, roots });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a tiny crate (`files`: path under `src/`, text) and returns its lib.rs.
    fn krate(files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join("src").join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let lib = dir.path().join("src/lib.rs");
        (dir, lib)
    }

    fn chains(root: &Path) -> Vec<String> {
        crate_cycles(root)
            .unwrap()
            .iter()
            .map(|c| {
                c.modules[..c.loop_len].iter().map(|(m, _)| m.join("::")).collect::<Vec<_>>().join(" -> ")
            })
            .collect()
    }

    #[test]
    fn sibling_modules_that_use_each_other_are_a_cycle() {
        let (_d, lib) = krate(&[
            ("lib.rs", "pub mod inject;\npub mod regenerate;\npub mod other;\n"),
            ("inject.rs", "use crate::regenerate::Regen;\npub struct Inject;\n"),
            ("regenerate.rs", "pub struct Regen;\nfn f() { let _ = crate::inject::Inject; }\n"),
            ("other.rs", "use crate::inject::Inject;\n"),
        ]);
        assert_eq!(chains(&lib), ["inject -> regenerate"]);
        let cycle = &crate_cycles(&lib).unwrap()[0];
        assert!(cycle.to_string().contains("inject -> regenerate -> inject"), "{cycle}");
        assert!(cycle.modules[1].1.ends_with("src/regenerate.rs"), "{cycle:?}");
    }

    #[test]
    fn a_one_way_crate_with_test_modules_and_a_root_facade_has_none() {
        let (_d, lib) = krate(&[
            (
                "lib.rs",
                "pub mod name;\npub mod registry;\npub use name::Kind;\npub use registry::Registry;\n\
                 fn root_helper() { registry::scan(); }\n",
            ),
            (
                "name.rs",
                "pub struct Kind;\n#[cfg(test)]\nmod tests { use super::*; use crate::registry::scan; }\n",
            ),
            // Through the root's re-export: names `name`, not the root.
            (
                "registry.rs",
                "use crate::Kind;\npub struct Registry;\npub fn scan() { let _ = super::name::Kind; }\n",
            ),
        ]);
        assert_eq!(chains(&lib), Vec::<String>::new());
    }

    #[test]
    fn a_child_that_uses_its_parent_which_uses_it_is_a_cycle() {
        let (_d, lib) = krate(&[
            ("lib.rs", "pub mod doctor;\n"),
            ("doctor/mod.rs", "mod cri;\npub struct Facts;\nfn run() { cri::probe(); }\n"),
            ("doctor/cri.rs", "use super::Facts;\npub fn probe() {}\n"),
        ]);
        assert_eq!(chains(&lib), ["doctor -> doctor::cri"]);
        // The parent using its child alone is fine.
        let (_d, lib) = krate(&[
            ("lib.rs", "pub mod doctor;\n"),
            ("doctor.rs", "mod cri;\nfn run() { cri::probe(); }\n"),
            ("doctor/cri.rs", "pub fn probe() {}\n"),
        ]);
        assert_eq!(chains(&lib), Vec::<String>::new());
    }

    #[test]
    fn inline_modules_renames_and_longer_cycles_are_followed() {
        let (_d, lib) = krate(&[(
            "lib.rs",
            "mod a { use crate::b as bee; pub fn f() { bee::g(); } }\n\
             mod b { pub fn g() { super::c::h(); } }\n\
             mod c { use crate::a::{self}; pub fn h() { a::f(); } }\n",
        )]);
        assert_eq!(chains(&lib), ["a -> b -> c"]);
    }

    #[test]
    fn unreadable_and_invalid_files_name_the_file() {
        let (_d, lib) = krate(&[("lib.rs", "mod missing;\n")]);
        let e = crate_cycles(&lib).unwrap_err().to_string();
        assert!(e.contains("missing/mod.rs"), "{e}");
        let (_d, lib) = krate(&[("lib.rs", "fn (\n")]);
        let e = crate_cycles(&lib).unwrap_err().to_string();
        assert!(e.contains("lib.rs: not valid Rust"), "{e}");
    }

    #[test]
    fn workspace_members_finds_library_and_binary_roots() {
        let dir = tempfile::tempdir().unwrap();
        let w = dir.path();
        std::fs::write(w.join("Cargo.toml"), "[workspace]\nmembers = [\"one\"]\n").unwrap();
        std::fs::create_dir_all(w.join("one/src/bin")).unwrap();
        std::fs::write(
            w.join("one/Cargo.toml"),
            "[package]\nname = \"one\"\n[[bin]]\nname = \"x\"\npath = \"src/x.rs\"\n",
        )
        .unwrap();
        for f in ["src/lib.rs", "src/x.rs", "src/bin/tool.rs"] {
            std::fs::write(w.join("one").join(f), "").unwrap();
        }
        let members = workspace_members(w).unwrap();
        assert_eq!(members.len(), 1);
        assert_eq!(members[0].name, "one");
        let roots: Vec<String> =
            members[0].roots.iter().map(|p| p.strip_prefix(w).unwrap().display().to_string()).collect();
        assert_eq!(roots, ["one/src/bin/tool.rs", "one/src/lib.rs", "one/src/x.rs"]);
    }
}
