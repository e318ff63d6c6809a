//! `nvinject-image`: builds nvinject's own image (the one `deploy/` runs) from built binaries, as
//! an OCI layout tar. `./x image` builds the binaries and runs this.
//!
//! ```text
//! nvinject-image --bin-dir target/release --hook target/x86_64-unknown-linux-gnu/release/nvinject-hook \
//!     --out target/nvinject-image.tar [--name REF]
//! ```
//! `--name` defaults to the reference the packed installer's manifests use, so `deploy/` and the
//! image always agree. Prints the reference, the manifest digest and the size.

use std::path::PathBuf;

use anyhow::{Context, bail};
use nvinject_image_tool::release_image::{self, ReleaseInputs};

fn main() {
    if let Err(e) = run() {
        eprintln!("nvinject-image: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| -> anyhow::Result<Option<String>> {
        match args.iter().position(|a| a == flag) {
            None => Ok(None),
            Some(i) => args.get(i + 1).cloned().map(Some).with_context(|| format!("{flag} needs a value")),
        }
    };
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("usage: nvinject-image --bin-dir DIR --hook FILE --out FILE [--name REF]");
        return Ok(());
    }
    let bin_dir = PathBuf::from(value("--bin-dir")?.context("--bin-dir is required (e.g. target/release)")?);
    let hook = PathBuf::from(value("--hook")?.context("--hook is required (the static nvinject-hook)")?);
    let out = PathBuf::from(value("--out")?.context("--out is required")?);
    let name = match value("--name")? {
        Some(n) => n,
        None => release_image::manifests_image(&bin_dir.join("nvinject-installer"))?,
    };
    if name.is_empty() || name.contains(char::is_whitespace) {
        bail!("--name {name:?} is not an image reference");
    }
    let out = std::path::absolute(&out).with_context(|| format!("resolving {}", out.display()))?;
    let inputs = ReleaseInputs { name, bin_dir, hook };
    let built = release_image::build(&inputs, &out)?;
    println!("image    {}", built.image.name);
    println!("digest   {}", built.digest);
    println!("archive  {} ({:.1} MiB)", built.image.tar.display(), built.size as f64 / (1024.0 * 1024.0));
    println!("load it  ctr -n k8s.io images import {}", built.image.tar.display());
    Ok(())
}
