//! What one module's own items write that may name another module: every path of two segments or
//! more in the syntax tree, every path a `use` tree imports (`pub use` re-exports included), and
//! the paths in macro arguments and attributes, read from their tokens ([`crate::tokens`]). The
//! items of nested modules are left out: each module is a node of its own.
//!
//! Knows nothing of the crate's module tree: it returns paths as written, and the caller decides
//! which module each one names.

use syn::visit::Visit;

use crate::tokens;

/// A path as written, with where it was written when that is not plain code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The segments, `crate`, `self` and `super` included.
    pub segments: Vec<String>,
    /// Where: `in vec!`, `in #[serde]`, `re-export`; `None` in plain code or a private `use`.
    pub context: Option<String>,
}

/// Each path a `use` tree imports, with the name it binds (`None` for a glob).
pub fn flatten_use(tree: &syn::UseTree) -> Vec<(Vec<String>, Option<String>)> {
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

/// The name an item defines in its module's namespace, if any.
pub fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::ExternCrate(i) => i.rename.as_ref().map_or(&i.ident, |(_, r)| r),
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        syn::Item::Mod(i) => &i.ident,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// Every path written in `items` (not in nested modules).
pub fn written(items: &[syn::Item]) -> Vec<Found> {
    let mut paths = Paths::default();
    for item in items {
        paths.visit_item(item);
    }
    paths.found
}

#[derive(Default)]
struct Paths {
    found: Vec<Found>,
}

impl Paths {
    fn add(&mut self, segments: Vec<String>, context: Option<String>) {
        self.found.push(Found { segments, context });
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {
        // Nested modules are nodes of their own.
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        // A re-export names the other module like any use: this module's interface holds its item.
        let context = (!matches!(u.vis, syn::Visibility::Inherited)).then(|| "re-export".to_owned());
        for (path, _) in flatten_use(&u.tree) {
            self.add(path, context.clone());
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() && p.segments.len() > 1 {
            self.add(p.segments.iter().map(|s| s.ident.to_string()).collect(), None);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        syn::visit::visit_macro(self, m);
        let name = m.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default();
        for path in tokens::in_macro(m) {
            self.add(path, Some(format!("in {name}!")));
        }
    }

    fn visit_attribute(&mut self, a: &'ast syn::Attribute) {
        if a.path().is_ident("doc") {
            return;
        }
        syn::visit::visit_attribute(self, a);
        let name = a.path().segments.last().map(|s| s.ident.to_string()).unwrap_or_default();
        for path in tokens::in_attribute(a) {
            self.add(path, Some(format!("in #[{name}]")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(src: &str) -> Vec<String> {
        let file = syn::parse_file(src).unwrap();
        written(&file.items)
            .into_iter()
            .map(|f| match f.context {
                Some(c) => format!("{} ({c})", f.segments.join("::")),
                None => f.segments.join("::"),
            })
            .collect()
    }

    #[test]
    fn code_uses_re_exports_macros_and_attributes_are_all_read_but_not_nested_modules() {
        assert_eq!(
            found(
                "use crate::a::X;\npub use crate::b::Y as Z;\n\
                 #[derive(serde::Deserialize)]\nstruct S { #[serde(default = \"crate::c::f\")] x: u8 }\n\
                 fn f() { let _ = vec![crate::d::g()]; }\nmod inner { use crate::e::H; }\n"
            ),
            [
                "crate::a::X",
                "crate::b::Y (re-export)",
                "serde::Deserialize (in #[derive])",
                "crate::c::f (in #[serde])",
                "crate::d::g (in vec!)"
            ]
        );
    }
}
