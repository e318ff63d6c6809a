//! Node labels in the Node Feature Discovery features-file format (`key=value` per line).
//!
//! The keys are the ones NVIDIA's GPU feature discovery publishes (`nvidia.com/gpu.product`,
//! `nvidia.com/gpu.count`, `nvidia.com/mig-1g.10gb.count`, ...), so node selectors written for
//! NVIDIA's stack keep matching. [`node_labels`] is pure; the binary writes the text atomically
//! into NFD's `features.d` directory, and sets the same labels on its Node object through the API
//! ([`node_object_patch`] decides the change, `crate::node_object` sends it).

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
    // NVIDIA's values: `mps`, `time-slicing` or `none` (the config never sets both strategies).
    let strategy =
        plan.resources.iter().filter_map(|r| r.sharing.as_ref()).map(|s| s.strategy.label()).next();
    put("gpu.sharing-strategy", strategy.unwrap_or("none").to_owned());

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

/// The Node annotation listing the labels nvinject set (comma-separated keys): a later run
/// removes those it no longer sets, and never touches a label someone else set.
pub const MANAGED_LABELS_ANNOTATION: &str = "nvinject.io/managed-labels";

/// The label nvinject's DaemonSets select GPU nodes by. It comes with the node (kubelet
/// `--node-labels`, a cloud GPU node pool): nvinject adds it where GPUs are found but never
/// removes it, because removing it would take the DaemonSets, and with them the only thing that
/// puts the labels back when the driver returns, off the node.
pub const GPU_PRESENT_LABEL: &str = "nvidia.com/gpu.present";

/// The labels for the Node object: [`node_labels`] and, with at least one GPU,
/// [`GPU_PRESENT_LABEL`]. No GPU (or no driver): none.
pub fn node_object_labels(inv: &Inventory, plan: &Plan, settings: &Settings) -> BTreeMap<String, String> {
    if inv.gpus.is_empty() {
        return BTreeMap::new();
    }
    let mut l = node_labels(inv, plan, settings);
    l.insert(GPU_PRESENT_LABEL.to_owned(), "true".to_owned());
    l
}

/// A merge patch for the Node object, with what it changes.
#[derive(Debug, Clone, PartialEq)]
pub struct NodePatch {
    /// `{"metadata": {"labels": {...}, "annotations": {...}}}`; `null` removes a key.
    pub body: serde_json::Value,
    /// Labels set (new, or a new value).
    pub set: Vec<String>,
    /// Labels removed.
    pub removed: Vec<String>,
}

/// The change that makes a Node with labels `current` and nvinject's annotation `managed` carry
/// `desired` as nvinject's labels; `None` when it already does (no write at all).
pub fn node_object_patch(
    desired: &BTreeMap<String, String>,
    current: &BTreeMap<String, String>,
    managed: Option<&str>,
) -> Option<NodePatch> {
    use serde_json::{Map, Value};
    let previously: std::collections::BTreeSet<&str> =
        managed.unwrap_or("").split(',').filter(|k| !k.is_empty()).collect();
    let mut labels = Map::new();
    let (mut set, mut removed) = (Vec::new(), Vec::new());
    for (k, v) in desired {
        if current.get(k) != Some(v) {
            labels.insert(k.clone(), Value::String(v.clone()));
            set.push(k.clone());
        }
    }
    for k in previously {
        if !desired.contains_key(k) && current.contains_key(k) && k != GPU_PRESENT_LABEL {
            labels.insert(k.to_owned(), Value::Null);
            removed.push(k.to_owned());
        }
    }
    let now_managed: Vec<&str> =
        desired.keys().map(String::as_str).filter(|k| *k != GPU_PRESENT_LABEL).collect();
    let now_managed = now_managed.join(",");
    let annotation_changes = managed.unwrap_or("") != now_managed;
    if labels.is_empty() && !annotation_changes {
        return None;
    }
    let mut metadata = Map::new();
    if !labels.is_empty() {
        metadata.insert("labels".into(), Value::Object(labels));
    }
    if annotation_changes {
        let value = if now_managed.is_empty() { Value::Null } else { Value::String(now_managed) };
        metadata.insert("annotations".into(), serde_json::json!({ MANAGED_LABELS_ANNOTATION: value }));
    }
    Some(NodePatch { body: serde_json::json!({ "metadata": metadata }), set, removed })
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

        // MPS: NVIDIA's `mps` value, with the same replica and product labels.
        s.mps = s.time_slicing.take();
        let p = plan(&inv, &s, &HostFacts::default()).unwrap();
        let l = node_labels(&inv, &p, &s);
        assert_eq!(get(&l, "gpu.sharing-strategy"), "mps");
        assert_eq!(get(&l, "gpu.replicas"), "4");
        assert_eq!(get(&l, "gpu.product"), "NVIDIA-A100-SXM4-80GB-SHARED");
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

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_first_publication_sets_every_label_and_records_them_but_not_gpu_present() {
        let desired = map(&[
            ("nvidia.com/gpu.count", "8"),
            ("nvidia.com/gpu.present", "true"),
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
        ]);
        let current = map(&[("kubernetes.io/hostname", "n1"), ("nvidia.com/gpu.present", "true")]);
        let p = node_object_patch(&desired, &current, None).unwrap();
        assert_eq!(p.set, ["nvidia.com/gpu.count", "nvidia.com/gpu.product"]);
        assert!(p.removed.is_empty());
        assert_eq!(
            p.body,
            serde_json::json!({ "metadata": {
                "labels": { "nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3" },
                "annotations": { MANAGED_LABELS_ANNOTATION: "nvidia.com/gpu.count,nvidia.com/gpu.product" },
            }})
        );
    }

    #[test]
    fn nothing_is_written_when_the_node_already_carries_the_labels() {
        let desired = map(&[("nvidia.com/gpu.count", "8"), ("nvidia.com/gpu.present", "true")]);
        let current = map(&[("nvidia.com/gpu.count", "8"), ("nvidia.com/gpu.present", "true")]);
        assert_eq!(node_object_patch(&desired, &current, Some("nvidia.com/gpu.count")), None);
    }

    #[test]
    fn labels_no_longer_true_are_removed_and_others_labels_never_touched() {
        // Time-slicing turned off and a MIG profile gone; an operator's own nvidia.com label stays.
        let desired = map(&[("nvidia.com/gpu.count", "8"), ("nvidia.com/gpu.replicas", "1")]);
        let current = map(&[
            ("nvidia.com/gpu.count", "8"),
            ("nvidia.com/gpu.replicas", "4"),
            ("nvidia.com/mig-1g.10gb.count", "7"),
            ("nvidia.com/team", "vision"),
        ]);
        let managed = "nvidia.com/gpu.count,nvidia.com/gpu.replicas,nvidia.com/mig-1g.10gb.count";
        let p = node_object_patch(&desired, &current, Some(managed)).unwrap();
        assert_eq!(p.set, ["nvidia.com/gpu.replicas"]);
        assert_eq!(p.removed, ["nvidia.com/mig-1g.10gb.count"]);
        let labels = &p.body["metadata"]["labels"];
        assert_eq!(labels["nvidia.com/mig-1g.10gb.count"], serde_json::Value::Null);
        assert!(labels.get("nvidia.com/team").is_none(), "not ours: {labels}");
        assert_eq!(
            p.body["metadata"]["annotations"][MANAGED_LABELS_ANNOTATION],
            "nvidia.com/gpu.count,nvidia.com/gpu.replicas"
        );
    }

    #[test]
    fn when_the_gpus_go_every_label_of_ours_goes_but_gpu_present_stays() {
        let current = map(&[
            ("nvidia.com/gpu.count", "1"),
            ("nvidia.com/gpu.present", "true"),
            ("nvidia.com/gpu.product", "NVIDIA-L4"),
        ]);
        let p = node_object_patch(
            &BTreeMap::new(),
            &current,
            Some("nvidia.com/gpu.count,nvidia.com/gpu.product"),
        )
        .unwrap();
        assert_eq!(p.removed, ["nvidia.com/gpu.count", "nvidia.com/gpu.product"]);
        assert!(p.body["metadata"]["labels"].get(GPU_PRESENT_LABEL).is_none());
        assert_eq!(p.body["metadata"]["annotations"][MANAGED_LABELS_ANNOTATION], serde_json::Value::Null);
        // And a node that never had any: nothing to do.
        assert_eq!(node_object_patch(&BTreeMap::new(), &map(&[("a", "b")]), None), None);
    }

    #[test]
    fn the_node_object_gets_gpu_present_only_with_gpus() {
        let inv = inventory(vec![gpu(0, 0, &[])], &[]);
        let s = settings();
        let p = plan(&inv, &s, &HostFacts::default()).unwrap();
        let l = node_object_labels(&inv, &p, &s);
        assert_eq!(l[GPU_PRESENT_LABEL], "true");
        assert_eq!(l["nvidia.com/gpu.count"], "1");
        let none = inventory(vec![], &[]);
        let p = plan(&none, &s, &HostFacts::default()).unwrap();
        assert!(node_object_labels(&none, &p, &s).is_empty());
    }
}
