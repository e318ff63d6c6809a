//! `nvinject-cdi validate` on hostile spec files: each is refused by a parser limit, and the
//! message names the file and the limit (the bench `cargo bench -p nvinject-cdi --bench parse`
//! prints what each refusal costs).

use std::process::Command;

const CDI: &str = env!("CARGO_BIN_EXE_nvinject-cdi");

#[test]
fn validate_refuses_hostile_specs_naming_the_file_and_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let head = "cdiVersion: 0.6.0\nkind: nvidia.com/gpu\n";
    let scalar_bomb = format!(
        "{head}containerEdits:\n  env: [&s \"{}\"{}]\ndevices: []\n",
        "A".repeat(4096),
        ", *s".repeat(100_000)
    );
    let cases = [
        ("flow.yaml", format!("{head}devices: {}\n", "[".repeat(400_000)), "nesting deeper than 64"),
        ("bomb.yaml", scalar_bomb, "more than 16 YAML aliases"),
        ("dashes.yaml", format!("{head}devices:\n{}x\n", "- ".repeat(200_000)), "expected a mapping"),
        ("huge.yaml", format!("{head}#{}\n", "x".repeat(5 << 20)), "byte limit"),
    ];
    for (name, text, needle) in &cases {
        let file = dir.path().join(name);
        std::fs::write(&file, text).unwrap();
        let out = Command::new(CDI).arg("validate").arg(&file).output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} accepted");
        assert!(said.contains(&file.display().to_string()) && said.contains(needle), "{name}: {said}");
    }
}
