//! Property tests for the CDI spec parser: arbitrary and mutated input never panics, errors name
//! the file, and a valid spec round-trips through `to_string`. Seeds are the cdi-gen goldens, read
//! at test time. Case counts are fixed and no failure files are written, so CI time is bounded.

use std::path::{Path, PathBuf};

use nvinject_cdi::Format;
use nvinject_cdi::codec::{parse, to_string};
use proptest::prelude::*;
use proptest::test_runner::Config;

fn config(cases: u32) -> Config {
    Config { failure_persistence: None, ..Config::with_cases(cases) }
}

fn seeds() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cdi-gen/tests/golden");
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| std::fs::read(&p).unwrap())
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no golden specs in {}", dir.display());
    out
}

fn name() -> PathBuf {
    PathBuf::from("/etc/cdi/fuzz-target.yaml")
}

/// Parses in both formats; any error must name the file.
fn check(bytes: &[u8]) {
    for format in [Format::Json, Format::Yaml] {
        if let Err(e) = parse(bytes, format, &name()) {
            assert!(e.to_string().contains("fuzz-target.yaml"), "error does not name the file: {e}");
        }
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Nest(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (
            any::<usize>(),
            prop::sample::select(vec![
                b"{".to_vec(),
                b"[".to_vec(),
                b": ".to_vec(),
                b"\n- ".to_vec(),
                b"&a ".to_vec(),
                b"*a".to_vec(),
                b"\"".to_vec(),
                b"\t".to_vec(),
                b"\xff\xfe".to_vec(),
                b"!!binary ".to_vec(),
                b"~".to_vec(),
            ])
        )
            .prop_map(|(i, s)| Mutation::Insert(i, s)),
        (any::<usize>(), 1usize..200).prop_map(|(i, d)| Mutation::Nest(i, d)),
    ]
}

fn apply(mut bytes: Vec<u8>, m: &Mutation) -> Vec<u8> {
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
        Mutation::Nest(i, depth) => {
            let at = i % (bytes.len() + 1);
            let mut nest = "[".repeat(*depth).into_bytes();
            nest.extend(std::iter::repeat_n(b']', *depth));
            bytes.splice(at..at, nest);
        }
    }
    bytes
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check(&bytes);
    }

    #[test]
    fn arbitrary_text_never_panics(text in "[ -~\n\t{}\\[\\]:,\"&*!-]{0,256}") {
        check(text.as_bytes());
    }
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn mutated_goldens_never_panic(
        seed in any::<prop::sample::Index>(),
        muts in prop::collection::vec(mutation(), 1..6),
    ) {
        let seeds = seeds();
        let mut bytes = seeds[seed.index(seeds.len())].clone();
        for m in &muts {
            bytes = apply(bytes, m);
        }
        check(&bytes);
    }
}

#[test]
fn goldens_parse_and_round_trip() {
    for bytes in seeds() {
        let spec = parse(&bytes, Format::Yaml, &name()).expect("golden spec parses");
        for format in [Format::Json, Format::Yaml] {
            let text = to_string(&spec, format);
            let again = parse(text.as_bytes(), format, &name())
                .unwrap_or_else(|e| panic!("re-encoded {format:?} does not parse: {e}\n{text}"));
            assert_eq!(again, spec, "{format:?} round trip changed the spec");
            assert_eq!(to_string(&again, format), text, "{format:?} encoding is not stable");
        }
    }
}

proptest! {
    #![proptest_config(config(64))]

    /// Golden specs with the top-level annotations set to arbitrary strings still round-trip: the
    /// YAML emitter must quote whatever a string holds.
    #[test]
    fn arbitrary_strings_round_trip(
        seed in any::<prop::sample::Index>(),
        s in "[ -~\\n\\t\u{a0}-\u{2fff}]{0,40}",
    ) {
        let seeds = seeds();
        let bytes = &seeds[seed.index(seeds.len())];
        let mut spec = parse(bytes, Format::Yaml, &name()).expect("golden spec parses");
        let mut value = serde_json::to_value(&spec).unwrap();
        value["annotations"] = serde_json::json!({ "fuzz": s.clone(), s.clone(): "v" });
        spec = serde_json::from_value(value).unwrap();
        // The strings must really be in the spec, or the round trip would prove nothing.
        prop_assert_eq!(spec.annotations.get("fuzz").map(String::as_str), Some(s.as_str()));
        for format in [Format::Json, Format::Yaml] {
            let text = to_string(&spec, format);
            let again = parse(text.as_bytes(), format, &name());
            prop_assert_eq!(again.as_ref().ok(), Some(&spec), "{:?}: {}", format, text);
        }
    }
}
