//! One node of a many-node test cluster, in namespaces of its own (`nvinject_cluster_harness::agent`):
//! started by the test under `unshare --mount --net` with its spec file as the one argument.

use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(spec) = std::env::args_os().nth(1) else {
        eprintln!("usage: nvinject-cluster-node <agent spec JSON file>");
        return ExitCode::from(2);
    };
    match nvinject_cluster_harness::agent::run(std::path::Path::new(&spec)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvinject-cluster-node: {e}");
            ExitCode::FAILURE
        }
    }
}
