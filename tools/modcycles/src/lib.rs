//! Finds module cycles inside each crate of the workspace, for `./x lint`.
//!
//! A crate's modules form a graph: module `a` has an edge to module `b` when the text of `a` names
//! `b` or an item of `b`: a `use` (a `pub use` re-export too), a path anywhere in the code
//! (`crate::b::f()`, `super::..`, `self::..`, a child module by name, a name `a` imported), a path
//! in a macro's arguments or an attribute (modules `names` and `tokens`). A path through a
//! re-export names the module that defines the item and each module it was re-exported by, except
//! a facade above the module writing it (`crate::Kind` where the root has `pub use name::Kind`
//! names `name`), so a crate root's facade makes no cycle. Declaring a child (`mod b;`) is no edge:
//! a parent using its child is fine on its own, and only a way back (child to parent, or sibling
//! to sibling) closes a cycle. `#[cfg(test)]` modules are left out: a test module's `use super::*` is not part
//! of the crate's structure. The README lists what the check reads and what it cannot see.
//!
//! Boundary: reads `src/` of each workspace member (library, main and bin roots, following `mod`
//! declarations); never builds, never expands macros, never reads tests, benches or build scripts.

mod names;
mod tokens;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

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
        let mut chain: Vec<String> =
            self.modules[..self.loop_len].iter().map(|(m, _)| display_name(m)).collect();
        chain.push(display_name(&self.modules[0].0));
        let why: Vec<String> = self
            .modules
            .iter()
            .zip(&self.because)
            .map(|((_, file), path)| format!("{} uses {path}", file.display()))
            .collect();
        write!(f, "{} ({})", chain.join(" -> "), why.join("; "))?;
        if self.modules.len() > self.loop_len {
            let rest: Vec<String> =
                self.modules[self.loop_len..].iter().map(|(m, _)| display_name(m)).collect();
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

    /// The names each module imports with `use` (re-exports included), mapped to the absolute
    /// path they stand for, and the modules it glob-imports. An import may go through another
    /// (`use crate::a; use a::X;`).
    fn imports(&self) -> BTreeMap<ModPath, Names> {
        let mut out = BTreeMap::new();
        for (path, module) in &self.modules {
            let mut names = Names::default();
            // Twice: a use may rely on one written after it.
            for _ in 0..2 {
                for item in &module.items {
                    let syn::Item::Use(u) = item else { continue };
                    for (segments, alias) in names::flatten_use(&u.tree) {
                        let Some(abs) = self.absolute(path, &segments, &names) else { continue };
                        match alias {
                            Some(alias) => {
                                names.named.insert(alias, abs);
                            }
                            None if !names.globs.contains(&abs) => names.globs.push(abs),
                            None => {}
                        }
                    }
                }
            }
            out.insert(path.clone(), names);
        }
        out
    }

    /// Whether module `at` defines `name` itself (an item or a child module).
    fn defines(&self, at: &[String], name: &str) -> bool {
        let mut child = at.to_vec();
        child.push(name.to_owned());
        self.modules.contains_key(&child)
            || self
                .modules
                .get(at)
                .is_some_and(|m| m.items.iter().any(|i| names::item_name(i).is_some_and(|n| n == name)))
    }

    /// The absolute path `segments` names from module `at`, when it starts inside this crate.
    fn absolute(&self, at: &ModPath, segments: &[String], names: &Names) -> Option<ModPath> {
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
                    return Some(at.iter().chain(segments).cloned().collect());
                }
                if self.defines(at, first) {
                    return None;
                }
                if let Some(abs) = names.named.get(first) {
                    return Some(abs.iter().chain(&segments[1..]).cloned().collect());
                }
                // A name a glob brought in: the glob's module that defines it.
                let glob = names.globs.iter().find(|g| self.defines(g, first))?;
                Some(glob.iter().chain(segments).cloned().collect())
            }
        }
    }

    /// The modules an absolute path written in module `from` depends on: the module defining the
    /// item (the path's longest module prefix, followed through that module's imports when the
    /// next segment is an imported name), and each module whose re-export the path went through,
    /// except an ancestor of `from` (a facade: `crate::Kind`, where the root has
    /// `pub use name::Kind`, names `name` only). The defining module comes last, with the
    /// re-export it was reached through.
    fn targets(
        &self,
        from: &ModPath,
        abs: &[String],
        imports: &BTreeMap<ModPath, Names>,
    ) -> Vec<(ModPath, Option<String>)> {
        let prefix = |abs: &[String]| {
            let len = (0..=abs.len()).rev().find(|n| self.modules.contains_key(&abs[..*n])).unwrap_or(0);
            abs[..len].to_vec()
        };
        let mut abs = abs.to_vec();
        let mut out = Vec::new();
        let mut via = None;
        // Bounded: re-exports that go round in a loop do not compile, but they still parse.
        for _ in 0..8 {
            let module = prefix(&abs);
            let Some(next) = abs.get(module.len()) else { break };
            let names = &imports[&module];
            let through = names.named.get(next).cloned().or_else(|| {
                if self.defines(&module, next) {
                    return None;
                }
                let exports = |g: &ModPath| {
                    self.defines(g, next) || imports.get(g).is_some_and(|n| n.named.contains_key(next))
                };
                names.globs.iter().find(|g| exports(g)).map(|g| {
                    let mut t = g.clone();
                    t.push(next.clone());
                    t
                })
            });
            match through {
                Some(through) if through.as_slice() != &abs[..=module.len()] => {
                    let facade = module.len() < from.len() && from.starts_with(&module);
                    if !facade {
                        out.push((module.clone(), Some("re-exported there".to_owned())));
                    }
                    abs = through.iter().chain(&abs[module.len() + 1..]).cloned().collect();
                    via = Some(module);
                }
                _ => break,
            }
        }
        let note = via.map(|m| format!("re-exported by {}", display_name(&m)));
        out.push((prefix(&abs), note));
        out
    }

    /// Each module's edges, with the first path written that made each one.
    fn edges(&self) -> BTreeMap<ModPath, BTreeMap<ModPath, String>> {
        let imports = self.imports();
        let mut edges: BTreeMap<ModPath, BTreeMap<ModPath, String>> = BTreeMap::new();
        for (path, module) in &self.modules {
            let own = &imports[path];
            let targets = edges.entry(path.clone()).or_default();
            for found in names::written(&module.items) {
                let Some(abs) = self.absolute(path, &found.segments, own) else { continue };
                for (target, note) in self.targets(path, &abs, &imports) {
                    if &target == path {
                        continue;
                    }
                    targets.entry(target).or_insert_with(|| {
                        let notes: Vec<&str> =
                            found.context.iter().chain(&note).map(String::as_str).collect();
                        let written = found.segments.join("::");
                        if notes.is_empty() { written } else { format!("{written} ({})", notes.join(", ")) }
                    });
                }
            }
        }
        edges
    }
}

/// A module's imported names: `use a::X as Y` binds `Y` to `a::X`; `use a::*` adds `a`.
#[derive(Debug, Default)]
struct Names {
    named: BTreeMap<String, ModPath>,
    globs: Vec<ModPath>,
}

/// `crate` for the root, else `a::b`.
fn display_name(m: &ModPath) -> String {
    if m.is_empty() { "crate".to_owned() } else { m.join("::") }
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
    fn a_re_export_through_an_earlier_import_reaches_the_defining_module() {
        // `b`'s `pub use a::X` goes through its `use crate::a`: `c` naming `crate::b::X` uses `a`
        // directly, so the tightest loop is a -> c (b is in the same tangle).
        let (_d, lib) = krate(&[(
            "lib.rs",
            "mod a { pub struct X; pub fn f() { crate::c::g(); } }\n\
             mod b { pub use a::X; use crate::a; }\n\
             mod c { pub fn g() -> Option<crate::b::X> { None } }\n",
        )]);
        assert_eq!(chains(&lib), ["a -> c"]);
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
