//! Node labels in the Node Feature Discovery features-file format (`key=value` per line).
//!
//! The keys are the ones NVIDIA's GPU feature discovery publishes (`nvidia.com/gpu.product`,
//! `nvidia.com/gpu.count`, `nvidia.com/mig-1g.10gb.count`, ...), so node selectors written for
//! NVIDIA's stack keep matching. [`node_labels`] is pure; the binary writes the text atomically
//! into NFD's `features.d` directory.

use std::collections::BTreeMap;

use nvinject_gpu::Inventory;

use crate::resources::{Plan, Resource};
use crate::settings::{MigStrategy, Settings};

/// Makes `s` a valid label value: letters, digits, `-`, `_`, `.`; at most 63; alphanumeric ends.
pub fn label_value(s: &str) -> String {
    let mapped: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).collect();
    let cut: String = mapped.chars().take(63).collect();
    cut.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_owned()
}

/// The labels for this node.
pub fn node_labels(inv: &Inventory, plan: &Plan, settings: &Settings) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        l.insert(format!("nvidia.com/{k}"), label_value(&v));
    };
    let driver = &inv.driver.version;
    let mut parts = driver.split('.');
    put("cuda.driver.major", parts.next().unwrap_or("").to_owned());
    put("cuda.driver.minor", parts.next().unwrap_or("").to_owned());
    put("cuda.driver.rev", parts.next().unwrap_or("").to_owned());
    put("cuda.driver-version.full", driver.clone());
    put("cuda.runtime.major", inv.driver.cuda.major.to_string());
    put("cuda.runtime.minor", inv.driver.cuda.minor.to_string());
    put("cuda.runtime-version.full", inv.driver.cuda.to_string());
    put("mig.capable", inv.gpus.iter().any(|g| g.mig_enabled.is_some()).to_string());
    let strategy = match settings.mig_strategy {
        MigStrategy::None => "none",
        MigStrategy::Single => "single",
        MigStrategy::Mixed => "mixed",
    };
    put("mig.strategy", strategy.to_owned());
    let shared = plan.resources.iter().any(|r| r.sharing.is_some());
    put("gpu.sharing-strategy", if shared { "time-slicing" } else { "none" }.to_owned());

    let Some(first) = inv.gpus.first() else { return l };
    put("gpu.family", first.architecture.clone());
    put("gpu.compute.major", first.compute_capability.major.to_string());
    put("gpu.compute.minor", first.compute_capability.minor.to_string());

    for r in &plan.resources {
        let g = inv.gpu(r.targets[0].gpu_index).unwrap_or(first);
        let replicas = r.sharing.as_ref().map_or(1, |s| s.replicas);
        // A resource advertised under its own name while shared gets the `-SHARED` product
        // suffix, as NVIDIA's GFD does, so workloads can tell a time-sliced GPU from a whole one.
        let suffix = if r.sharing.is_some() && !r.name.short().ends_with(".shared") { "-SHARED" } else { "" };
        let count = r.targets.len().to_string();
        match &r.targets[0].mig {
            None => {
                let key = base(r);
                put(&format!("{key}.product"), format!("{}{suffix}", g.name));
                put(&format!("{key}.count"), count);
                put(&format!("{key}.replicas"), replicas.to_string());
                put(&format!("{key}.memory"), (g.memory_bytes >> 20).to_string());
            }
            Some(m) => {
                let p = &m.profile;
                let key = if settings.mig_strategy == MigStrategy::Single {
                    put("gpu.product", format!("{}-MIG-{}{suffix}", g.name, p.name()));
                    "gpu".to_owned()
                } else {
                    base(r)
                };
                put(&format!("{key}.count"), count);
                put(&format!("{key}.replicas"), replicas.to_string());
                put(&format!("{key}.memory"), (p.memory_bytes >> 20).to_string());
                put(&format!("{key}.slices.gi"), p.gpu_slices.to_string());
                put(&format!("{key}.slices.ci"), p.compute_slices.to_string());
            }
        }
    }
    l
}

fn base(r: &Resource) -> String {
    // `gpu.shared` labels like `gpu`: GFD labels the underlying resource.
    r.name.short().trim_end_matches(".shared").to_owned()
}

/// The features-file text: sorted `key=value` lines.
pub fn render(labels: &BTreeMap<String, String>) -> String {
    labels.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::tests::{gpu, gpu_time_slicing, inventory, mig_node, settings};
    use crate::resources::{HostFacts, plan};
    use crate::settings::ReplicaPolicy;

    #[test]
    fn whole_gpus_and_sharing() {
        let inv = inventory(vec![gpu(0, 0, &[]), gpu(1, 0, &[])], &[]);
        let mut s = settings();
        let p = plan(&inv, &s, &HostFacts::default()).unwrap();
        let l = node_labels(&inv, &p, &s);
        let get = |l: &BTreeMap<String, String>, k: &str| l.get(&format!("nvidia.com/{k}")).cloned().unwrap();
        assert_eq!(get(&l, "gpu.product"), "NVIDIA-A100-SXM4-80GB");
        assert_eq!(get(&l, "gpu.count"), "2");
        assert_eq!(get(&l, "gpu.memory"), "81920");
        assert_eq!(get(&l, "gpu.replicas"), "1");
        assert_eq!(get(&l, "gpu.compute.major"), "8");
        assert_eq!(get(&l, "gpu.family"), "ampere");
        assert_eq!(get(&l, "cuda.driver.major"), "550");
        assert_eq!(get(&l, "cuda.driver.rev"), "15");
        assert_eq!(get(&l, "cuda.runtime-version.full"), "12.4");
        assert_eq!(get(&l, "gpu.sharing-strategy"), "none");
        assert_eq!(get(&l, "mig.strategy"), "none");
        let text = render(&l);
        assert!(text.lines().all(|line| line.starts_with("nvidia.com/") && line.contains('=')));

        s.time_slicing = gpu_time_slicing("gpu", 4, ReplicaPolicy::Distributed);
        let p = plan(&inv, &s, &HostFacts::default()).unwrap();
        let l = node_labels(&inv, &p, &s);
        assert_eq!(get(&l, "gpu.product"), "NVIDIA-A100-SXM4-80GB-SHARED");
        assert_eq!(get(&l, "gpu.replicas"), "4");
        assert_eq!(get(&l, "gpu.count"), "2");
        assert_eq!(get(&l, "gpu.sharing-strategy"), "time-slicing");
    }

    #[test]
    fn mig_profiles_in_mixed_and_single() {
        let inv = mig_node();
        let mut s = settings();
        s.mig_strategy = MigStrategy::Mixed;
        let p = plan(&inv, &s, &HostFacts::default()).unwrap();
        let l = node_labels(&inv, &p, &s);
        assert_eq!(l["nvidia.com/mig-1g.10gb.count"], "4");
        assert_eq!(l["nvidia.com/mig-1g.10gb.memory"], "9856");
        assert_eq!(l["nvidia.com/mig-3g.40gb.slices.gi"], "3");
        assert_eq!(l["nvidia.com/gpu.count"], "2");
        assert_eq!(l["nvidia.com/mig.capable"], "true");
        assert_eq!(l["nvidia.com/mig.strategy"], "mixed");

        let uniform = inventory(vec![gpu(0, 0, &[(1, 0, "1g"), (2, 0, "1g")])], &[]);
        s.mig_strategy = MigStrategy::Single;
        let p = plan(&uniform, &s, &HostFacts::default()).unwrap();
        let l = node_labels(&uniform, &p, &s);
        assert_eq!(l["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb");
        assert_eq!(l["nvidia.com/gpu.count"], "2");
        assert_eq!(l["nvidia.com/gpu.memory"], "9856");
    }

    #[test]
    fn label_values_are_sanitised() {
        assert_eq!(label_value("NVIDIA H100 80GB HBM3"), "NVIDIA-H100-80GB-HBM3");
        assert_eq!(label_value(" (x) "), "x");
        assert_eq!(label_value(&"a".repeat(80)).len(), 63);
    }
}
