//! Reading YAML under limits, for CDI specs and for the other YAML files nvinject reads (the device
//! plugin's config): one place that configures the parser's budgets and words its refusals.
//!
//! The limits are enforced by the parser (serde-saphyr's budget) as events stream out of it, so
//! hostile text (deep nesting, alias bombs, node floods) costs one pass up to the point where it
//! breaks a limit, and typed fields stop most of it sooner. The byte cap is the caller's: it must
//! come before reading the file at all (see [`crate::codec::read_bounded`]).

use serde::de::DeserializeOwned;

/// What a YAML document may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct YamlLimits {
    /// Bytes of text, aliases expanded: caps what aliases of a long string can add up to.
    pub bytes: usize,
    /// Nesting of sequences and mappings, flow (`[[`) or block.
    pub nesting: usize,
    /// Aliases (`*a`), anchors (`&a`) and merge keys (`<<`), each.
    pub aliases: usize,
    /// Nodes (scalars, sequences, mappings), aliases replayed.
    pub nodes: usize,
    /// What the text should be, for messages: `a CDI spec`.
    pub what: &'static str,
}

/// Why a YAML document was refused, without the file's name (the caller has it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YamlError {
    /// Field path where reading stopped (`devices[0].containerEdits`); empty at the top level. A
    /// key the parser failed on before handing it over is left out (its parent is given).
    pub field: String,
    /// What was wrong, one line, without the position.
    pub message: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
}

impl YamlLimits {
    fn options(&self) -> serde_saphyr::Options {
        let mut budget = serde_saphyr::Budget::default();
        budget.max_reader_input_bytes = Some(self.bytes);
        budget.max_depth = self.nesting;
        budget.flow_nesting_limit = self.nesting;
        budget.max_aliases = self.aliases;
        budget.max_anchors = self.aliases;
        budget.max_merge_keys = self.aliases;
        budget.max_documents = 1;
        budget.max_inclusion_depth = 0;
        budget.max_nodes = self.nodes;
        budget.max_events = 2 * self.nodes;
        // Alias expansion counts toward these: aliases of a long anchor cannot outgrow the file cap.
        budget.max_total_scalar_bytes = self.bytes;
        budget.max_recorded_anchor_bytes = self.bytes;
        budget.max_recorded_anchor_events = self.nodes;
        let mut options = serde_saphyr::Options::default();
        options.budget = Some(budget);
        options.alias_limits.max_total_replayed_events = self.nodes;
        // Our messages name the file and line; a source snippet would only repeat the input.
        options.with_snippet = false;
        options
    }

    /// The parser's error as one line, limit breaches in our words with the limit and the fix.
    fn message(&self, e: &serde_saphyr::Error) -> String {
        use serde_saphyr::Error as E;
        use serde_saphyr::budget::BudgetBreach as B;
        let mut e = e;
        while let E::WithSnippet { error, .. } | E::AliasError { error, .. } = e {
            e = error;
        }
        let what = self.what;
        let nesting = || format!("nesting deeper than {} levels: not {what}", self.nesting);
        let aliases = || {
            format!(
                "more than {} YAML aliases or anchors, or too much copied through them (alias bomb?): \
                 not {what}; write the values out",
                self.aliases
            )
        };
        match e {
            E::Budget { breach, .. } => match breach {
                B::Depth { .. } => nesting(),
                B::Aliases { .. }
                | B::Anchors { .. }
                | B::MergeKeys { .. }
                | B::AliasAnchorRatio { .. }
                | B::RecordedAnchorEvents { .. }
                | B::RecordedAnchorBytes { .. } => aliases(),
                B::Nodes { .. } | B::Events { .. } => {
                    format!("more than {} YAML nodes: not {what}; split it or remove it", self.nodes)
                }
                B::ScalarBytes { .. } | B::InputBytes { .. } => format!(
                    "over the {}-byte limit once aliases are expanded (alias bomb?): not {what}; \
                     write the values out",
                    self.bytes
                ),
                B::Documents { .. } => format!("more than one YAML document: the file holds {what}"),
                other => format!("over a YAML parser limit ({other:?}): not {what}"),
            },
            E::AliasReplayLimitExceeded { .. }
            | E::AliasExpansionLimitExceeded { .. }
            | E::AliasReplayStackDepthExceeded { .. } => aliases(),
            other => {
                let text = other.to_string().replace('\n', " ");
                let text = match text.find(" at line ") {
                    Some(i) => text[..i].to_owned(),
                    None => text,
                };
                // The scanner reports deep flow nesting (`[[[[`) as its recursion limit.
                if text.contains("recursion limit exceeded") {
                    nesting()
                } else if let Some(kind) = text.strip_prefix("invalid ").and_then(scalar_kind) {
                    // The library says only `invalid i64`: say what was expected.
                    format!("invalid type: expected {kind} ({})", &text["invalid ".len()..])
                } else if let Some(rest) = text.strip_prefix("expected mapping start") {
                    format!("expected a mapping (`key: value` entries) here{rest}")
                } else {
                    text
                }
            }
        }
    }
}

/// `an integer` for `i64`, and so on: the words for a Rust scalar type the library names.
fn scalar_kind(ty: &str) -> Option<&'static str> {
    match ty {
        "i8" | "i16" | "i32" | "i64" | "i128" | "u8" | "u16" | "u32" | "u64" | "u128" => Some("an integer"),
        "f32" | "f64" => Some("a number"),
        "bool" => Some("true or false"),
        _ => None,
    }
}

/// Reads one YAML document (JSON text too) into `T` under `limits`.
pub fn from_yaml<T: DeserializeOwned>(text: &[u8], limits: &YamlLimits) -> Result<T, YamlError> {
    // The field path is known only inside the closure; carried out beside the error.
    let mut field = String::new();
    serde_saphyr::with_deserializer_from_slice_with_options(text, limits.options(), |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            field = e.path().to_string();
            e.into_inner()
        })
    })
    .map_err(|e| {
        let message = limits.message(&e);
        let line = e.location().map(|l| l.line() as usize).filter(|l| *l > 0);
        // serde_path_to_error ends the path with the key being read: `?` when the parser stopped
        // before it had one, nothing (`flags.`, or `.` at the top) for an empty key.
        let (parent, key) = match field.rsplit_once('.') {
            Some((parent, key)) => (parent.to_owned(), key),
            None => (String::new(), field.as_str()),
        };
        let empty_key = (key.is_empty() && message.contains("unknown field ``"))
            || (key == "?" && message.contains("null into string"));
        let (field, message) = if empty_key {
            let at = if parent.is_empty() { "at top level".to_owned() } else { format!("in `{parent}`") };
            (parent, format!("an empty key {at}: remove it or write the key's name"))
        } else if key == "?" {
            (parent, message)
        } else {
            (field.clone(), message)
        };
        let field = if field == "." { String::new() } else { field };
        YamlError { field, message, line }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const LIMITS: YamlLimits =
        YamlLimits { bytes: 1 << 20, nesting: 64, aliases: 16, nodes: 1 << 17, what: "a test" };

    fn refusal(text: &str) -> YamlError {
        from_yaml::<Value>(text.as_bytes(), &LIMITS).unwrap_err()
    }

    #[test]
    fn untyped_values_are_held_to_the_limits() {
        let bomb = "a: &a [x,x,x,x,x,x,x,x,x]\n".to_owned()
            + &(b'b'..=b'z')
                .map(|c| {
                    format!(
                        "{}: &{} [{}]\n",
                        c as char,
                        c as char,
                        vec![format!("*{}", (c - 1) as char); 9].join(",")
                    )
                })
                .collect::<String>();
        let block: String = (0..100).map(|i| format!("{}k{i}:\n", " ".repeat(2 * i))).collect();
        let dashes = format!("a:\n  {}x\n", "- ".repeat(10_000));
        let flow = format!("a: {}", "{b: [".repeat(10_000));
        for (text, field, needle) in [
            (bomb.as_str(), "c", "YAML aliases"),
            (block.as_str(), "k0.k1", "nesting deeper than 64 levels: not a test"),
            (dashes.as_str(), "a", "nesting deeper than 64"),
            (flow.as_str(), "a", "nesting deeper than 64"),
        ] {
            let e = refusal(text);
            assert!(e.field.starts_with(field) && e.message.contains(needle), "{e:?}");
            assert!(e.line.is_some(), "{e:?}");
        }
        // Exactly at the limits is fine: 64 levels, 16 aliases.
        let at_depth: String = (0..63).map(|i| format!("{}k{i}:\n", " ".repeat(2 * i))).collect::<String>()
            + &" ".repeat(126)
            + "leaf: 1\n";
        from_yaml::<Value>(at_depth.as_bytes(), &LIMITS).unwrap();
        let aliases = format!("a: &a x\nb: [{}]\n", ["*a"; 16].join(","));
        assert_eq!(from_yaml::<Value>(aliases.as_bytes(), &LIMITS).unwrap()["b"][15], "x");
        let aliases = format!("a: &a x\nb: [{}]\n", ["*a"; 17].join(","));
        assert!(refusal(&aliases).message.contains("more than 16 YAML aliases"));
    }

    #[test]
    fn empty_keys_are_named() {
        for (text, field, at) in
            [("? \n", "", "at top level"), ("a:\n  ? \n", "a", "in `a`"), ("\"\": 1\n", "", "at top level")]
        {
            #[derive(Debug, serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            #[allow(dead_code)]
            struct S {
                a: Option<Inner>,
            }
            #[derive(Debug, serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Inner {}
            let e = from_yaml::<S>(text.as_bytes(), &LIMITS).unwrap_err();
            assert_eq!(e.field, field, "{text:?}: {e:?}");
            assert!(e.message.starts_with(&format!("an empty key {at}")), "{text:?}: {e:?}");
        }
    }
}
