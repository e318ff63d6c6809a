//! Device node paths a container needs for a GPU or MIG device, for Allocate's optional DeviceSpecs.
//!
//! Paths are container paths (`/dev/nvidia0`); the host path is the same path under the dev root.
//! MIG devices are reached through capability nodes `/dev/nvidia-caps/nvidia-cap<N>`, whose minors
//! the driver lists in `<proc root>/driver/nvidia-caps/mig-minors` (`gpu0/gi2/access 21`).
//! Parsing is pure; the binary reads the file once at start.

use std::collections::BTreeMap;

/// Control nodes every CUDA process opens, in the order they are handed out. Only `nvidiactl` is
/// required; the others are passed when they exist on the host.
pub const CONTROL_NODES: [&str; 4] =
    ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"];

/// The driver's table of MIG capability minors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigMinors(BTreeMap<String, u32>);

impl MigMinors {
    /// Parses `mig-minors`: one `<name> <minor>` per line; lines that do not fit are skipped.
    pub fn parse(text: &str) -> Self {
        let map = text
            .lines()
            .filter_map(|line| {
                let mut parts = line.split_whitespace();
                let name = parts.next()?;
                let minor = parts.next()?.parse().ok()?;
                Some((name.to_owned(), minor))
            })
            .collect();
        MigMinors(map)
    }

    /// Minor of the capability `name` (`gpu0/gi2/access`).
    pub fn get(&self, name: &str) -> Option<u32> {
        self.0.get(name).copied()
    }
}

/// The node of a whole GPU.
pub fn gpu_node(minor: u32) -> String {
    format!("/dev/nvidia{minor}")
}

/// The nodes of a MIG device: its parent GPU, then the GPU-instance and compute-instance access
/// capabilities. `Err` names the capability missing from the table.
pub fn mig_nodes(gpu_minor: u32, gi: u32, ci: u32, minors: &MigMinors) -> Result<Vec<String>, String> {
    let gi_cap = format!("gpu{gpu_minor}/gi{gi}/access");
    let ci_cap = format!("gpu{gpu_minor}/gi{gi}/ci{ci}/access");
    let gi_minor = minors.get(&gi_cap).ok_or(gi_cap)?;
    let ci_minor = minors.get(&ci_cap).ok_or(ci_cap)?;
    Ok(vec![
        gpu_node(gpu_minor),
        format!("/dev/nvidia-caps/nvidia-cap{gi_minor}"),
        format!("/dev/nvidia-caps/nvidia-cap{ci_minor}"),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_nodes_come_from_the_minor_table() {
        let minors =
            MigMinors::parse("config 1\nmonitor 2\ngpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\nbogus\n");
        assert_eq!(minors.get("config"), Some(1));
        assert_eq!(
            mig_nodes(0, 2, 0, &minors).unwrap(),
            vec!["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"]
        );
        assert_eq!(mig_nodes(0, 3, 0, &minors).unwrap_err(), "gpu0/gi3/access");
    }
}
