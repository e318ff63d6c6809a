//! Node descriptions shipped with nvinject, one JSON file each under `tests/simnode/presets/`.
//!
//! - `single`: one NVIDIA L4, no NVLink, no MIG.
//! - `h100x8`: an HGX H100 80GB SXM board, every pair of GPUs NVLinked, two NUMA nodes.
//! - `islands`: eight A100 80GB in two NVLink islands of four (0-3, 4-7), for topology-aware allocation.
//! - `a100-mig`: four A100 80GB; GPU 0 carved into 3g.40gb + 2g.20gb + 2x 1g.10gb, GPU 1 into
//!   7x 1g.10gb, GPUs 2 and 3 whole (MIG capable, disabled).

use std::path::Path;

use crate::description::{DescriptionError, NodeDescription};

/// Names accepted by [`preset`].
pub const NAMES: &[&str] = &["single", "h100x8", "islands", "a100-mig"];

/// The JSON text of a preset, exactly as shipped.
pub fn preset_json(name: &str) -> Option<&'static str> {
    Some(match name {
        "single" => include_str!("../presets/single.json"),
        "h100x8" => include_str!("../presets/h100x8.json"),
        "islands" => include_str!("../presets/islands.json"),
        "a100-mig" => include_str!("../presets/a100-mig.json"),
        _ => return None,
    })
}

/// A preset, parsed and validated; `None` for an unknown name.
pub fn preset(name: &str) -> Option<NodeDescription> {
    let json = preset_json(name)?;
    let origin = Path::new("tests/simnode/presets").join(format!("{name}.json"));
    Some(
        NodeDescription::from_slice(json.as_bytes(), &origin)
            .unwrap_or_else(|e: DescriptionError| panic!("shipped preset is invalid: {e}")),
    )
}
