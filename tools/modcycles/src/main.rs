//! `nvinject-modcycles [WORKSPACE_ROOT]`: prints each module cycle in the workspace's crates and
//! exits 1 when there is one (0 when none). Run by `./x lint`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

fn main() -> anyhow::Result<ExitCode> {
    let root = std::env::args_os().nth(1).map_or_else(|| PathBuf::from("."), PathBuf::from);
    let (mut found, mut crates) = (0, 0);
    for member in nvinject_modcycles::workspace_members(&root).context("reading the workspace")? {
        for crate_root in &member.roots {
            crates += 1;
            let cycles = nvinject_modcycles::crate_cycles(crate_root)
                .with_context(|| format!("reading crate {}", member.name))?;
            for cycle in cycles {
                println!("module cycle in {}: {cycle}", member.name);
                found += 1;
            }
        }
    }
    if found > 0 {
        eprintln!("{found} module cycle(s): make the dependency between those modules one-way");
        return Ok(ExitCode::FAILURE);
    }
    println!("no module cycles ({crates} crate roots read)");
    Ok(ExitCode::SUCCESS)
}
