//! What parsing a spec costs: the golden h100x8 spec as YAML and as JSON, a 400 KB spec of many
//! devices, and hostile files (each refused by a limit: the figure is what the refusal costs), then
//! `nvinject-cdi validate` on each hostile file as a process. Prints medians; asserts nothing.
//! `NVINJECT_BENCH_RUNS` sets the runs (default 51); `NVINJECT_BENCH_NO_CLI=1` skips the CLI part.

use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nvinject_cdi::Spec;
use nvinject_cdi::codec::{self, Format, MAX_NODES, MAX_SPEC_BYTES};

fn median(runs: usize, mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..runs.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The golden spec with its devices repeated under new names until the YAML reaches 400 KB.
fn big_spec(golden: &Spec) -> String {
    let mut spec = golden.clone();
    for n in 0.. {
        let text = codec::to_string(&spec, Format::Yaml);
        if text.len() >= 400_000 {
            return text;
        }
        spec.devices.extend(golden.devices.iter().map(|d| {
            let mut d = d.clone();
            d.name = format!("{}-x{n}", d.name);
            d
        }));
    }
    unreachable!()
}

/// Hostile spec texts, about 400 KB each unless the name says otherwise.
fn hostile() -> Vec<(&'static str, String)> {
    let head = "cdiVersion: 0.6.0\nkind: nvidia.com/gpu\n";
    let mut bomb = format!("{head}containerEdits:\n  env: &a0 [x,x,x,x,x,x,x,x,x]\n");
    for i in 1..10 {
        bomb += &format!("x{i}: &a{i} [{}]\n", vec![format!("*a{}", i - 1); 9].join(","));
    }
    bomb += "devices: [";
    while bomb.len() < 400_000 {
        bomb += "*a9,";
    }
    bomb += "*a9]\n";
    let mut scalar_bomb = format!("{head}containerEdits:\n  env: [&s \"{}\"", "A".repeat(4096));
    while scalar_bomb.len() < 400_000 {
        scalar_bomb += ", *s";
    }
    scalar_bomb += "]\ndevices: []\n";
    let mut block_map = format!("{head}containerEdits:\n");
    for i in 0.. {
        if block_map.len() >= 400_000 {
            break;
        }
        block_map += &format!("{}k{i}:\n", " ".repeat(2 * (i + 1)));
    }
    vec![
        ("flow nesting, 100k `[`", format!("{head}devices: {}\n", "[".repeat(100_000))),
        ("flow nesting, 400 KB of `[`", format!("{head}devices: {}\n", "[".repeat(400_000))),
        ("billion laughs (9^10), 400 KB", bomb),
        ("4 KB string aliased 100k times", scalar_bomb),
        ("block mapping nesting, 400 KB", block_map),
        ("block sequence nesting `- - -`", format!("{head}devices:\n{}x\n", "- ".repeat(200_000))),
        ("one 4 MiB scalar", format!("{head}devices:\n- name: {}\n", "a".repeat(MAX_SPEC_BYTES - 100))),
        (
            "node flood (one-char nodes), ~1 MiB",
            format!("{head}containerEdits:\n  env: [{}a]\n", "a,".repeat(MAX_NODES + 10)),
        ),
    ]
}

fn main() {
    let runs: usize = std::env::var("NVINJECT_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(51);
    let golden_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cdi-gen/tests/golden/h100x8.yaml");
    let yaml = std::fs::read(&golden_path).expect("golden spec");
    let golden = codec::parse(&yaml, Format::Yaml, &golden_path).expect("golden spec parses");
    let json = codec::to_string(&golden, Format::Json);
    let parse = |text: &[u8], format| black_box(codec::parse(black_box(text), format, Path::new("bench")));

    println!("CDI spec parsing, median of {runs} runs");
    let y = median(runs, || drop(parse(&yaml, Format::Yaml)));
    let j = median(runs, || drop(parse(json.as_bytes(), Format::Json)));
    println!("golden h100x8 YAML ({:>7} B)          {:>9.3} ms", yaml.len(), ms(y));
    println!("golden h100x8 JSON ({:>7} B)          {:>9.3} ms", json.len(), ms(j));
    println!("  YAML / JSON                           {:>9.1}x", y.as_secs_f64() / j.as_secs_f64());
    let big = big_spec(&golden);
    let devices =
        codec::parse(big.as_bytes(), Format::Yaml, Path::new("big")).expect("400 KB spec").devices.len();
    let b = median(runs.div_ceil(5), || drop(parse(big.as_bytes(), Format::Yaml)));
    println!("400 KB spec YAML ({:>7} B, {devices} devices) {:>9.3} ms", big.len(), ms(b));

    println!("\nhostile specs (each refused; cost of the refusal)");
    let cases = hostile();
    for (label, text) in &cases {
        let d = median(runs.div_ceil(5), || drop(parse(text.as_bytes(), Format::Yaml)));
        let err = match codec::parse(text.as_bytes(), Format::Yaml, Path::new("evil.yaml")) {
            Ok(_) => "accepted!".to_owned(),
            Err(e) => e.to_string(),
        };
        println!("{label:<38} {:>8} B {:>9.3} ms  {err}", text.len(), ms(d));
    }

    if std::env::var_os("NVINJECT_BENCH_NO_CLI").is_some() {
        return;
    }
    let cli = nvinject_simnode::artifacts::artifact("nvinject-cdi-gen", "nvinject-cdi");
    let dir = tempfile::tempdir().expect("temp dir");
    println!("\n`{} validate FILE` (wall time of the process, median of 5)", cli.display());
    for (n, (label, text)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("hostile-{n}.yaml"));
        std::fs::write(&file, text).expect("write hostile spec");
        let mut out = None;
        let d = median(5, || {
            out = Some(Command::new(&cli).arg("validate").arg(&file).output().expect("run CLI"))
        });
        let out = out.expect("ran");
        let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        let first = said.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        println!("{label:<38} {:>9.3} ms  exit {}  {first}", ms(d), out.status.code().unwrap_or(-1));
    }
}
