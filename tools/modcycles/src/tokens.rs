//! Paths written where `syn` keeps only tokens: the arguments of macro invocations (`vec![..]`,
//! `format!(..)`, `assert!(..)`, `matches!(..)`, tracing fields, a `macro_rules!` body) and
//! attributes (`#[serde(with = "crate::x")]`, `#[arg(value_parser = crate::a::parse)]`).
//!
//! The scan reads tokens, not a grammar, so it needs no idea of what a macro's arguments mean and
//! sees every path any parse of them could: a path is an identifier followed by `::` and further
//! identifiers, wherever it stands, inside nested groups too. An identifier right after `::` (the
//! tail of `Vec::<T>::new`, an extern `::name::x`) starts no path, and `path::{a, b::c}` is read as
//! a use tree. String literals name nothing in macro arguments (format strings); in attributes a
//! string counts when it is a whole path beginning with `crate`, `self` or `super`, and the strings
//! of serde-style keys that hold paths or types (`default`, `with`, `serialize_with`, `bound`, ...)
//! are scanned like code. Doc attributes (`///`) name nothing.

use syn::buffer::Cursor;
use syn::parse::{Parse, ParseStream};

/// Attribute keys whose string value is code: a function, a module, a type or where-predicates.
const PATH_KEYS: &[&str] = &[
    "default",
    "with",
    "serialize_with",
    "deserialize_with",
    "bound",
    "from",
    "try_from",
    "into",
    "remote",
    "getter",
    "crate",
];

/// A token as the scan sees it.
#[derive(Debug)]
enum Tok {
    Ident(String),
    /// `::`.
    PathSep,
    Punct(char),
    /// A literal: its value when it is a string.
    Lit(Option<String>),
    Group(Vec<Tok>),
}

/// Every token of a stream, read to its end.
struct Toks(Vec<Tok>);

impl Parse for Toks {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        input.step(|cursor| {
            let (toks, rest) = read(*cursor);
            Ok((Toks(toks), rest))
        })
    }
}

fn read(mut c: Cursor<'_>) -> (Vec<Tok>, Cursor<'_>) {
    let mut out = Vec::new();
    loop {
        if let Some((inner, _, _, next)) = c.any_group() {
            out.push(Tok::Group(read(inner).0));
            c = next;
        } else if let Some((ident, next)) = c.ident() {
            out.push(Tok::Ident(ident.to_string()));
            c = next;
        } else if let Some((_, next)) = c.lifetime() {
            out.push(Tok::Punct('\''));
            c = next;
        } else if let Some((punct, next)) = c.punct() {
            out.push(Tok::Punct(punct.as_char()));
            c = next;
        } else if let Some((literal, next)) = c.literal() {
            let value = match syn::Lit::new(literal) {
                syn::Lit::Str(s) => Some(s.value()),
                _ => None,
            };
            out.push(Tok::Lit(value));
            c = next;
        } else if let Some((_, next)) = c.token_tree() {
            c = next;
        } else {
            break;
        }
    }
    (join_path_seps(out), c)
}

/// Pairs colons into `::`. Spacing is not needed: in valid Rust a run of colons is `::` pairs,
/// preceded by one lone `:` when its count is odd (`x: ::a::B`).
fn join_path_seps(toks: Vec<Tok>) -> Vec<Tok> {
    let mut out = Vec::with_capacity(toks.len());
    let mut colons = 0;
    let flush = |colons: &mut usize, out: &mut Vec<Tok>| {
        if *colons % 2 == 1 {
            out.push(Tok::Punct(':'));
        }
        out.extend((0..*colons / 2).map(|_| Tok::PathSep));
        *colons = 0;
    };
    for tok in toks {
        if matches!(tok, Tok::Punct(':')) {
            colons += 1;
            continue;
        }
        flush(&mut colons, &mut out);
        out.push(tok);
    }
    flush(&mut colons, &mut out);
    out
}

/// The paths written in a macro invocation's arguments (or a `macro_rules!` body).
pub fn in_macro(mac: &syn::Macro) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    if let Ok(Toks(toks)) = mac.parse_body::<Toks>() {
        walk(&toks, Mode::Code, &mut out);
    }
    out
}

/// The paths an attribute names beyond its own path and a `name = expr` value (which `syn`
/// parses): those in a list's tokens and in the strings described in the module doc.
pub fn in_attribute(attr: &syn::Attribute) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let name = attr.path().segments.last().map(|s| s.ident.to_string()).unwrap_or_default();
    match &attr.meta {
        _ if name == "doc" => {}
        syn::Meta::Path(_) => {}
        syn::Meta::List(list) => {
            if let Ok(Toks(toks)) = list.parse_args::<Toks>() {
                walk(&toks, Mode::Attr { bound: name == "bound" }, &mut out);
            }
        }
        syn::Meta::NameValue(nv) => {
            if let syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) = &nv.value {
                string(&s.value(), Some(&name), false, &mut out);
            }
        }
    }
    out
}

/// Whether strings are read (inside an attribute) and whether the group is `bound(..)`, whose
/// `serialize = ".."` and `deserialize = ".."` hold where-predicates.
#[derive(Clone, Copy)]
enum Mode {
    Code,
    Attr { bound: bool },
}

fn walk(toks: &[Tok], mode: Mode, out: &mut Vec<Vec<String>>) {
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Ident(_) if !(i > 0 && matches!(toks[i - 1], Tok::PathSep)) => {
                let (segments, end) = path_at(toks, i);
                if let (Some(Tok::PathSep), Some(Tok::Group(tree))) = (toks.get(end), toks.get(end + 1)) {
                    use_group(&segments, tree, out);
                    i = end + 2;
                    continue;
                }
                if segments.len() > 1 {
                    out.push(segments);
                }
                i = end;
                continue;
            }
            Tok::Group(inner) => match mode {
                Mode::Code if attribute_starts(toks, i) => attribute(inner, out),
                Mode::Code => walk(inner, mode, out),
                Mode::Attr { bound } => {
                    let key = key_before(toks, i);
                    walk(inner, Mode::Attr { bound: bound || key == Some("bound") }, out);
                }
            },
            Tok::Lit(Some(value)) => {
                if let Mode::Attr { bound } = mode {
                    let key =
                        (i > 0 && matches!(toks[i - 1], Tok::Punct('='))).then(|| key_before(toks, i - 1));
                    string(value, key.flatten(), bound, out);
                }
            }
            _ => {}
        }
        i += 1;
    }
}

/// The identifier right before position `at` (`key` in `key = ..` or `key(..)`).
fn key_before(toks: &[Tok], at: usize) -> Option<&str> {
    match at.checked_sub(1).and_then(|j| toks.get(j)) {
        Some(Tok::Ident(key)) => Some(key),
        _ => None,
    }
}

/// Whether the group at `i` is the body of an attribute: `#[..]` or `#![..]`.
fn attribute_starts(toks: &[Tok], i: usize) -> bool {
    match i.checked_sub(1).map(|j| &toks[j]) {
        Some(Tok::Punct('#')) => true,
        Some(Tok::Punct('!')) => i >= 2 && matches!(toks[i - 2], Tok::Punct('#')),
        _ => false,
    }
}

/// An attribute inside macro tokens (`#[serde(default = "crate::f")]` on a generated struct).
fn attribute(body: &[Tok], out: &mut Vec<Vec<String>>) {
    match body.first() {
        Some(Tok::Ident(name)) if name == "doc" => {}
        Some(Tok::Ident(name)) => walk(body, Mode::Attr { bound: name == "bound" }, out),
        _ => {}
    }
}

/// An attribute's string literal, the value of `key` when it is `key = ".."`.
fn string(value: &str, key: Option<&str>, bound: bool, out: &mut Vec<Vec<String>>) {
    let Ok(Toks(toks)) = syn::parse_str::<Toks>(value) else { return };
    let whole = whole_path(&toks);
    let holds_code =
        key.is_some_and(|k| PATH_KEYS.contains(&k) || (bound && matches!(k, "serialize" | "deserialize")));
    if holds_code {
        walk(&toks, Mode::Code, out);
        // `with = "module"`: the module's functions are used, so a lone module name counts too.
        if key == Some("with")
            && let Some(mut module) = whole
        {
            module.push("serialize".to_owned());
            out.push(module);
        }
    } else if let Some(path) = whole
        && path.len() > 1
        && matches!(path[0].as_str(), "crate" | "self" | "super")
    {
        out.push(path);
    }
}

/// The path the tokens are, when they are nothing but one.
fn whole_path(toks: &[Tok]) -> Option<Vec<String>> {
    match toks.first() {
        Some(Tok::Ident(_)) => {
            let (segments, end) = path_at(toks, 0);
            (end == toks.len()).then_some(segments)
        }
        _ => None,
    }
}

/// The identifiers joined by `::` from `start` (an identifier), and where they end.
fn path_at(toks: &[Tok], start: usize) -> (Vec<String>, usize) {
    let mut segments = Vec::new();
    let mut i = start;
    while let Some(Tok::Ident(ident)) = toks.get(i) {
        segments.push(ident.clone());
        match toks.get(i + 1) {
            Some(Tok::PathSep) if matches!(toks.get(i + 2), Some(Tok::Ident(_))) => i += 2,
            _ => return (segments, i + 1),
        }
    }
    (segments, i)
}

/// `prefix::{a, b::c, self, d::{e, *}}`: each path the tree imports.
fn use_group(prefix: &[String], tree: &[Tok], out: &mut Vec<Vec<String>>) {
    for element in tree.split(|t| matches!(t, Tok::Punct(','))) {
        match element.first() {
            Some(Tok::Ident(_)) => {
                let (segments, end) = path_at(element, 0);
                let rest = segments.iter().skip_while(|s| *s == "self");
                let full: Vec<String> = prefix.iter().cloned().chain(rest.cloned()).collect();
                match (element.get(end), element.get(end + 1)) {
                    (Some(Tok::PathSep), Some(Tok::Group(inner))) => use_group(&full, inner, out),
                    _ => out.push(full),
                }
            }
            Some(Tok::Punct('*')) => out.push(prefix.to_vec()),
            _ => walk(element, Mode::Code, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn macro_paths(src: &str) -> Vec<String> {
        let mac: syn::Macro = syn::parse_str(src).unwrap();
        in_macro(&mac).iter().map(|p| p.join("::")).collect()
    }

    fn attr_paths(src: &str) -> Vec<String> {
        let file: syn::File = syn::parse_str(&format!("{src}\nstruct S;")).unwrap();
        let syn::Item::Struct(s) = &file.items[0] else { panic!("a struct") };
        s.attrs.iter().flat_map(in_attribute).map(|p| p.join("::")).collect()
    }

    #[test]
    fn macro_arguments_yield_their_paths_nested_groups_included() {
        assert_eq!(
            macro_paths("vec![Config::default(), crate::runtime_config::shim_spec_dirs(s)]"),
            ["Config::default", "crate::runtime_config::shim_spec_dirs"]
        );
        assert_eq!(
            macro_paths(
                "tracing::info!(x = %crate::a::b(), y = ?super::c::D { e: self::f::G }, \"msg {}\", 1)"
            ),
            ["crate::a::b", "super::c::D", "self::f::G"]
        );
        assert_eq!(
            macro_paths("matches!(k, crate::a::Kind::V | crate::b::K(_))"),
            ["crate::a::Kind::V", "crate::b::K"]
        );
        assert_eq!(macro_paths("assert!(x, \"crate::in::a::string {}\", crate::m::f())"), ["crate::m::f"]);
    }

    #[test]
    fn turbofish_tails_extern_paths_and_type_annotations_start_no_path() {
        assert_eq!(
            macro_paths("m!(Vec::<u8>::new(), ::serde::Value, let x: ::std::X = a::<T>::b, c: crate::d::E)"),
            ["crate::d::E"]
        );
        assert_eq!(macro_paths("m!(<T as crate::a::Tr>::X, 'label: loop {})"), ["crate::a::Tr"]);
    }

    #[test]
    fn macro_rules_bodies_and_use_trees_in_macros_are_read() {
        let rules: syn::ItemMacro =
            syn::parse_str("macro_rules! m { ($x:expr) => { $crate::a::f($x) } }").unwrap();
        assert_eq!(in_macro(&rules.mac), [["crate", "a", "f"]]);
        assert_eq!(
            macro_paths("m! { use crate::{a::X, b::{self, c::*}, d}; }"),
            ["crate::a::X", "crate::b", "crate::b::c", "crate::d"]
        );
    }

    #[test]
    fn attribute_strings_count_for_path_keys_and_whole_crate_paths_only() {
        assert_eq!(
            attr_paths(
                "#[serde(default = \"crate::a::f\", with = \"codec\", deserialize_with = \"super::b::de\")]\n\
                 #[serde(bound = \"T: crate::c::Tr\", bound(serialize = \"U: self::d::Tr\"), rename = \"e::f\")]"
            ),
            ["crate::a::f", "codec::serialize", "super::b::de", "crate::c::Tr", "self::d::Tr"]
        );
        assert_eq!(attr_paths("#[error(\"see crate::a::b\")]\n#[other(\"crate::x::y\")]"), ["crate::x::y"]);
        assert_eq!(attr_paths("#[arg(value_parser = crate::a::parse)]"), ["crate::a::parse"]);
        assert_eq!(attr_paths("/// Uses crate::a::b.\n#[doc = \"crate::a::b\"]"), Vec::<String>::new());
    }

    #[test]
    fn attributes_inside_macro_tokens_are_read_like_attributes() {
        assert_eq!(
            macro_paths("m! { #[serde(with = \"crate::x\")] /// crate::doc::only\n struct S; }"),
            ["crate::x", "crate::x::serialize"]
        );
    }
}
