//! Reading and writing spec text: JSON and YAML.
//!
//! Parsing reports the file, the field path (`devices[2].containerEdits.mounts[0].hostPath`) and the
//! line, so a user can fix a hand-edited spec without guessing. Writing is deterministic: the same
//! [`Spec`] value always gives the same bytes.
//!
//! YAML is written by a small emitter of our own rather than a library's, because a spec is read
//! by YAML 1.1 parsers too (Go's `sigs.k8s.io/yaml`, which containerd uses): there, plain `yes`,
//! `on` or `1_000` are not strings. The emitter quotes every string a YAML 1.1 or 1.2 parser could
//! read as anything else, and every string starting with a digit (`"0"`, `"0:1"`, `"0.6.0"`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::spec::Spec;
use crate::yaml::YamlLimits;

/// A spec file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// JSON: fastest to parse; what the installer writes for the shim.
    Json,
    /// YAML: what people read and edit; JSON is valid YAML, so this also reads JSON.
    Yaml,
}

impl Format {
    /// The format a spec directory entry has by its extension (`.json`, `.yaml`, `.yml`); `None` for
    /// other files, which CDI runtimes ignore.
    pub fn from_path(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()? {
            "json" => Some(Format::Json),
            "yaml" | "yml" => Some(Format::Yaml),
            _ => None,
        }
    }

    /// The canonical extension, without the dot.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Yaml => "yaml",
        }
    }
}

/// A spec that could not be parsed: where, and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{}: {}{message}{}",
    path.display(),
    if field.is_empty() { String::new() } else { format!("field `{field}`: ") },
    line.map(|l| format!(" (line {l})")).unwrap_or_default()
)]
pub struct ParseError {
    /// The file (or the name given to the bytes).
    pub path: PathBuf,
    /// Field path where parsing stopped, e.g. `devices[0].containerEdits`; empty at the top level.
    pub field: String,
    /// What the parser said, without its position suffix.
    pub message: String,
    /// 1-based line, when the parser knows it.
    pub line: Option<usize>,
}

/// The largest spec file we parse. Our generated specs are tens of KB (a 64-GPU node stays under
/// 1 MiB); anything bigger is refused before parsing so one file cannot stall every container start.
pub const MAX_SPEC_BYTES: usize = 4 * 1024 * 1024;
/// The deepest nesting (sequences and mappings, flow or block) a YAML spec may use; a CDI spec
/// needs about 8. Enforced by the YAML parser's budget as it reads, so a deeply nested file stops
/// at the 65th level; JSON is held to serde_json's own limit of 128.
pub const MAX_NESTING: usize = 64;
/// YAML aliases (`*name`) and anchors a spec may use. CDI specs have no need for them; a few are
/// tolerated, many are how an alias bomb ("billion laughs") multiplies a small file into gigabytes.
pub const MAX_ALIASES: usize = 16;
/// YAML nodes (scalars, sequences, mappings, aliases replayed) in one spec. Generated specs use
/// about 9 bytes a node (an 8-GPU spec is 15 KB, about 1.6k nodes; a 400 KB spec has 44k), so
/// 128k nodes is over 80 such nodes' worth; the cap bounds what a file of one-character nodes can
/// make us build (parse cost grows with nodes, not bytes).
pub const MAX_NODES: usize = 1 << 17;

fn refuse_size(len: usize, path: &Path) -> Result<(), ParseError> {
    if len <= MAX_SPEC_BYTES {
        return Ok(());
    }
    Err(ParseError {
        path: path.to_owned(),
        field: String::new(),
        message: format!(
            "spec is {len} bytes, over the {MAX_SPEC_BYTES}-byte limit for CDI specs: split it or remove it"
        ),
        line: None,
    })
}

/// The limits a YAML spec is read under.
pub const YAML_LIMITS: YamlLimits = YamlLimits {
    bytes: MAX_SPEC_BYTES,
    nesting: MAX_NESTING,
    aliases: MAX_ALIASES,
    nodes: MAX_NODES,
    what: "a CDI spec",
};

/// Reads at most [`MAX_SPEC_BYTES`] + 1 bytes of `path`, so a huge file (or `/dev/zero` behind a
/// symlink) costs a bounded read; [`parse`] then refuses it by size.
///
/// Opened `O_NONBLOCK` and checked on the open file, so a file swapped for a FIFO or a device after
/// a caller's stat is refused instead of blocking the reader.
pub fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    read_bounded_with_metadata(path).map(|(bytes, _)| bytes)
}

/// [`read_bounded`], with the metadata of the descriptor read (what the spec-trust check judges,
/// `crate::trust`: the file read, not whatever the path names a moment later).
pub fn read_bounded_with_metadata(path: &Path) -> std::io::Result<(Vec<u8>, std::fs::Metadata)> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO, device or socket is never read as a spec)",
        ));
    }
    let mut bytes = Vec::new();
    file.take(MAX_SPEC_BYTES as u64 + 1).read_to_end(&mut bytes)?;
    Ok((bytes, meta))
}

/// Parses spec text. Checks structure and types only; see [`crate::validate::validate`] for the rules.
/// Text over [`MAX_SPEC_BYTES`] is refused unparsed; YAML over [`MAX_NESTING`], [`MAX_ALIASES`] or
/// [`MAX_NODES`] is refused where the parser meets the breach.
pub fn parse(bytes: &[u8], format: Format, path: &Path) -> Result<Spec, ParseError> {
    refuse_size(bytes.len(), path)?;
    match format {
        Format::Json => {
            let mut de = serde_json::Deserializer::from_slice(bytes);
            let spec = serde_path_to_error::deserialize(&mut de).map_err(|e| {
                parse_error(path, e.path().to_string(), e.inner().to_string(), Some(e.inner().line()))
            })?;
            de.end().map_err(|e| parse_error(path, String::new(), e.to_string(), Some(e.line())))?;
            Ok(spec)
        }
        Format::Yaml => crate::yaml::from_yaml(bytes, &YAML_LIMITS).map_err(|e| ParseError {
            path: path.to_owned(),
            field: e.field,
            message: e.message,
            line: e.line,
        }),
    }
}

fn parse_error(path: &Path, field: String, message: String, line: Option<usize>) -> ParseError {
    let field = if field == "." { String::new() } else { field };
    // Both parsers append their own position; we report the line separately.
    let message = match message.find(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message,
    };
    ParseError { path: path.to_owned(), field, message, line: line.filter(|l| *l > 0) }
}

/// The spec as text in `format`, newline-terminated.
pub fn to_string(spec: &Spec, format: Format) -> String {
    // Serializing our own types to a `Value` cannot fail: every map key is a string.
    let value = serde_json::to_value(spec).expect("a CDI spec always serializes");
    match format {
        Format::Json => {
            let mut text = serde_json::to_string_pretty(&value).expect("a JSON value always serializes");
            text.push('\n');
            text
        }
        Format::Yaml => {
            let mut out = String::with_capacity(4096);
            yaml_block(&mut out, &value, 0);
            out
        }
    }
}

/// Writes a mapping or sequence in block style at `indent`; scalars on their own line.
fn yaml_block(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, v) in map {
                pad(out, indent);
                yaml_scalar_str(out, key);
                yaml_member(out, v, indent);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for item in items {
                pad(out, indent);
                out.push('-');
                match item {
                    Value::Object(map) if !map.is_empty() => {
                        // First key on the dash line, the rest aligned under it.
                        for (n, (key, v)) in map.iter().enumerate() {
                            if n == 0 {
                                out.push(' ');
                            } else {
                                pad(out, indent + 2);
                            }
                            yaml_scalar_str(out, key);
                            yaml_member(out, v, indent + 2);
                        }
                    }
                    Value::Array(inner) if !inner.is_empty() => {
                        out.push('\n');
                        yaml_block(out, item, indent + 2);
                    }
                    scalar => {
                        out.push(' ');
                        yaml_scalar(out, scalar);
                        out.push('\n');
                    }
                }
            }
        }
        scalar => {
            pad(out, indent);
            yaml_scalar(out, scalar);
            out.push('\n');
        }
    }
}

/// Writes `: value` after a key: nested collections on the following lines (sequences at the key's
/// own indentation, as Go's YAML writers do), scalars and empty collections inline.
fn yaml_member(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push_str(":\n");
            yaml_block(out, value, indent + 2);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push_str(":\n");
            yaml_block(out, value, indent);
        }
        _ => {
            out.push_str(": ");
            yaml_scalar(out, value);
            out.push('\n');
        }
    }
}

fn pad(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

fn yaml_scalar(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => yaml_scalar_str(out, s),
        Value::Object(_) => out.push_str("{}"),
        Value::Array(_) => out.push_str("[]"),
    }
}

fn yaml_scalar_str(out: &mut String, s: &str) {
    if plain_is_safe(s) {
        out.push_str(s);
    } else {
        // JSON string syntax is valid YAML double-quoted scalar syntax.
        out.push_str(&serde_json::to_string(s).expect("a string always serializes"));
    }
}

/// True when `s` written unquoted reads back as the same string under YAML 1.1 and 1.2.
fn plain_is_safe(s: &str) -> bool {
    const RESERVED: [&str; 11] = ["y", "n", "yes", "no", "on", "off", "true", "false", "null", "nan", "inf"];
    let body = s.trim_start_matches('-');
    let Some(first) = body.chars().next() else { return false };
    // A leading dash is only plain when a letter follows (`--link`), never `- x` or `-1`.
    if !(first.is_ascii_alphabetic() || first == '/' || first == '_') {
        return false;
    }
    if RESERVED.iter().any(|r| s.eq_ignore_ascii_case(r)) {
        return false;
    }
    s.ends_with(|c: char| c != ':') && s.chars().all(|c| c.is_ascii_alphanumeric() || "/_.-=:+,".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Device, Hook};

    #[test]
    fn read_bounded_refuses_a_fifo_without_blocking_and_caps_a_device() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("spec.yaml");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = read_bounded(&fifo).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let err = read_bounded(Path::new("/dev/zero")).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let file = tmp.path().join("ok.yaml");
        std::fs::write(&file, "kind: a.b/c\n").unwrap();
        assert_eq!(read_bounded(&file).unwrap(), b"kind: a.b/c\n");
    }

    fn sample() -> Spec {
        let mut spec = Spec {
            cdi_version: "0.6.0".into(),
            kind: "nvidia.com/gpu".parse().unwrap(),
            devices: ["0", "0:1", "GPU-4c1d890a", "yes", "all"]
                .iter()
                .map(|n| crate::spec::gpu0_device(n))
                .collect(),
            annotations: Default::default(),
            container_edits: Default::default(),
        };
        spec.annotations.insert("nvinject.io/generated-by".into(), "nvinject-cdi 0.1.0".into());
        spec.container_edits.env.push("NVIDIA_VISIBLE_DEVICES=void".into());
        spec.container_edits.hooks.push(Hook {
            hook_name: "createContainer".into(),
            path: "/usr/local/nvinject/bin/nvinject-hook".into(),
            args: vec!["nvinject-hook".into(), "create-symlinks".into(), "--link".into(), "a::b".into()],
            ..Default::default()
        });
        spec.devices.push(Device { name: "empty".into(), ..Default::default() });
        spec
    }

    #[test]
    fn yaml_output_round_trips_and_quotes_ambiguous_strings() {
        let spec = sample();
        let yaml = to_string(&spec, Format::Yaml);
        assert_eq!(parse(yaml.as_bytes(), Format::Yaml, Path::new("t.yaml")).unwrap(), spec);
        // YAML 1.1 readers would take these as numbers or booleans if they were plain.
        for quoted in ["name: \"0\"", "name: \"0:1\"", "name: \"yes\"", "cdiVersion: \"0.6.0\""] {
            assert!(yaml.contains(quoted), "missing {quoted} in\n{yaml}");
        }
        assert!(
            yaml.contains("- name: all\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n")
        );
        assert!(yaml.contains("- name: empty\n  containerEdits: {}\n"), "{yaml}");
        assert!(yaml.contains("    - --link\n    - a::b\n"), "{yaml}");
        assert!(yaml.contains("nvinject.io/generated-by: \"nvinject-cdi 0.1.0\""));
    }

    #[test]
    fn json_output_round_trips_and_is_minimal() {
        let spec = sample();
        let json = to_string(&spec, Format::Json);
        assert_eq!(parse(json.as_bytes(), Format::Json, Path::new("t.json")).unwrap(), spec);
        assert!(!json.contains("null") && !json.contains("hostPath"), "{json}");
        assert!(json.ends_with("}\n"));
        // JSON is YAML: the YAML reader accepts it too.
        assert_eq!(parse(json.as_bytes(), Format::Yaml, Path::new("t.json")).unwrap(), spec);
    }

    #[test]
    fn parse_errors_name_file_field_and_line() {
        let yaml = "cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices:\n- name: x\n  containerEdits:\n    deviceNodes:\n    - path: /dev/x\n      major: many\n";
        let err = parse(yaml.as_bytes(), Format::Yaml, Path::new("/etc/cdi/x.yaml")).unwrap_err();
        assert_eq!(err.field, "devices[0].containerEdits.deviceNodes[0].major");
        assert_eq!(err.line, Some(8));
        let text = err.to_string();
        assert!(
            text.starts_with("/etc/cdi/x.yaml: field `devices[0].containerEdits.deviceNodes[0].major`: ")
        );
        assert!(text.contains("invalid type: expected an integer (i64)"), "{text}");

        let json = br#"{"cdiVersion":"0.6.0","kind":"a.b/c","devices":[{"name":"x","containerEdit":{}}]}"#;
        let err = parse(json, Format::Json, Path::new("x.json")).unwrap_err();
        assert_eq!(err.field, "devices[0].containerEdit");
        assert!(err.message.contains("unknown field `containerEdit`"), "{}", err.message);

        let err =
            parse(b"{\"kind\": \"a.b/c\", \"devices\": []}", Format::Json, Path::new("y.json")).unwrap_err();
        assert!(err.message.contains("missing field `cdiVersion`"), "{err}");
        assert!(parse(b"{} trailing", Format::Json, Path::new("z.json")).is_err());
    }

    #[test]
    fn hostile_text_is_refused_by_the_parser_limits_with_the_file() {
        let deep_flow =
            format!("kind: nvidia.com/gpu\ndevices: {}{}\n", "[".repeat(200_000), "]".repeat(200_000));
        let deep_map = format!("kind: a.b/c\ndevices:\n- containerEdits: {}\n", "{a: ".repeat(100_000));
        let deep_block: String = "cdiVersion: 0.6.0\nkind: a.b/c\ncontainerEdits:\n".to_owned()
            + &(0..100).map(|i| format!("{}k{i}:\n", " ".repeat(2 * (i + 1)))).collect::<String>();
        let deep_dashes = format!("kind: a.b/c\ndevices:\n{}x\n", "- ".repeat(100_000));
        // Typed fields refuse nested lists, so the bomb CDI admits is a long string aliased: one
        // 64 KB string aliased 100 times is 6.4 MB of text from a 65 KB file.
        let scalar_bomb = format!(
            "cdiVersion: 0.6.0\nkind: a.b/c\ncontainerEdits:\n  env: [&s \"{}\"{}]\ndevices: []\n",
            "A".repeat(65_536),
            ", *s".repeat(100)
        );
        let many_anchors = "cdiVersion: 0.6.0\nkind: a.b/c\ncontainerEdits:\n  env: [".to_owned()
            + &(0..40).map(|i| format!("&a{i} x{i}, ")).collect::<String>()
            + "]\ndevices: []\n";
        let two_docs = "cdiVersion: 0.6.0\nkind: a.b/c\ndevices: []\n---\nkind: a.b/d\n";
        let huge = "#".repeat(MAX_SPEC_BYTES + 1);
        for (text, format, needle) in [
            (deep_flow.as_str(), Format::Yaml, "nesting deeper than 64"),
            // Typed fields stop a deep mapping at its first unknown key.
            (deep_map.as_str(), Format::Yaml, "unknown field `a`"),
            (deep_block.as_str(), Format::Yaml, "unknown field `k0`"),
            (deep_dashes.as_str(), Format::Yaml, "expected a mapping"),
            (scalar_bomb.as_str(), Format::Yaml, "YAML aliases"),
            (many_anchors.as_str(), Format::Yaml, "YAML aliases or anchors"),
            (two_docs, Format::Yaml, "document"),
            (huge.as_str(), Format::Yaml, "byte limit"),
            (huge.as_str(), Format::Json, "byte limit"),
        ] {
            let err = parse(text.as_bytes(), format, Path::new("/etc/cdi/evil.yaml")).unwrap_err();
            let shown = err.to_string();
            assert!(shown.starts_with("/etc/cdi/evil.yaml: ") && shown.contains(needle), "{shown}");
        }
        // Under the byte cap, a flood of one-character nodes meets the node budget.
        let flood = format!(
            "cdiVersion: 0.6.0\nkind: a.b/c\ncontainerEdits:\n  env: [{}a]\n",
            "a,".repeat(MAX_NODES + 10)
        );
        let shown = parse(flood.as_bytes(), Format::Yaml, Path::new("f.yaml")).unwrap_err().to_string();
        assert!(shown.contains("YAML nodes") && shown.contains("containerEdits.env"), "{shown}");
        // JSON nesting stops at serde_json's own recursion limit.
        let deep_json = format!("{{\"kind\": {}", "[".repeat(200_000));
        let shown = parse(deep_json.as_bytes(), Format::Json, Path::new("j.json")).unwrap_err().to_string();
        assert!(shown.starts_with("j.json: field `kind`: "), "{shown}");
        // Brackets inside strings and a few aliases are not nesting or bombs.
        let ok = "cdiVersion: 0.5.0\nkind: a.b/c\ndevices:\n- name: x\n  containerEdits:\n    env: [&e \"A=[[[[\", *e]\n";
        let spec = parse(ok.as_bytes(), Format::Yaml, Path::new("ok.yaml")).unwrap();
        assert_eq!(spec.devices[0].container_edits.env, ["A=[[[[", "A=[[[["]);
    }

    /// `kind` and a node's `type` are typed: a malformed one fails parsing at its field, with the
    /// message the name and type rules give (before they were typed, validation gave it).
    #[test]
    fn a_malformed_kind_or_node_type_fails_at_its_field() {
        let good = "cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices:\n- name: x\n  containerEdits:\n    deviceNodes:\n    - path: /dev/x\n      type: c\n";
        let json = r#"{"cdiVersion":"0.6.0","kind":"nvidia.com/gpu","devices":[{"name":"x","containerEdits":{"deviceNodes":[{"path":"/dev/x","type":"c"}]}}]}"#;
        let kind = ("kind", "kind `nvidia.com` is not of the form vendor/class");
        let node_type =
            ("devices[0].containerEdits.deviceNodes[0].type", "device type `x` is not one of b, c, u, p");
        let cases = [
            (good.replace("kind: nvidia.com/gpu", "kind: nvidia.com"), Format::Yaml, kind),
            (json.replace("nvidia.com/gpu", "nvidia.com"), Format::Json, kind),
            (good.replace("type: c", "type: x"), Format::Yaml, node_type),
            (json.replace(r#""type":"c""#, r#""type":"x""#), Format::Json, node_type),
        ];
        for (text, format, (field, message)) in cases {
            let err = parse(text.as_bytes(), format, Path::new("x.yaml")).unwrap_err();
            assert_eq!(err.field, field, "{format:?}: {err}");
            assert!(err.message.starts_with(message), "{format:?}: {err}");
        }
        let spec = parse(good.as_bytes(), Format::Yaml, Path::new("x.yaml")).unwrap();
        assert_eq!(spec.kind.as_str(), "nvidia.com/gpu");
        assert_eq!(
            spec.devices[0].container_edits.device_nodes[0].device_type,
            Some(crate::DeviceType::Char)
        );
    }

    #[test]
    fn formats_follow_extensions() {
        assert_eq!(Format::from_path(Path::new("/etc/cdi/a.json")), Some(Format::Json));
        assert_eq!(Format::from_path(Path::new("b.yml")), Some(Format::Yaml));
        assert_eq!(Format::from_path(Path::new("c.yaml")), Some(Format::Yaml));
        assert_eq!(Format::from_path(Path::new("d.yaml.bak")), None);
        assert_eq!(Format::from_path(Path::new("README")), None);
    }
}
