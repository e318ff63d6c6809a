//! Contract with cdi-gen: every CDI name the plugin hands out names a device in the spec
//! `nvinject-cdi generate` writes for the same node. Real processes on simulated nodes; needs root.

mod common;

use std::collections::BTreeSet;

use common::{Kubelet, Node, Plugin, ids, kubelet_dir, plugin_args};
use serde_json::{Value, json};

/// Qualified names of the devices in the spec generated for `node`.
fn spec_names(node: &Node) -> BTreeSet<String> {
    let out = node.tmp.path().join("spec.json");
    node.generate_spec(&out);
    let spec: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let kind = spec["kind"].as_str().unwrap().to_owned();
    spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| format!("{kind}={}", d["name"].as_str().unwrap()))
        .collect()
}

/// Allocates every device of `resource` in one container and returns the CDI names handed out.
fn handed_out(k: &mut Kubelet, resource: &str) -> Vec<String> {
    k.registered(resource);
    let devices = k.devices(resource, |d| !d.is_empty());
    let r = k.allocate(resource, json!([ids(&devices)])).unwrap();
    let names =
        r["containers"][0]["annotations"].as_object().unwrap().values().next().unwrap().as_str().unwrap();
    names.split(',').map(str::to_owned).collect()
}

#[test]
#[ignore = "needs root"]
fn every_name_handed_out_is_in_the_generated_spec() {
    nvinject_test_support::require_root("mknod for the simulated node");
    for (preset, strategy, resources) in [
        ("h100x8", "none", vec!["nvidia.com/gpu"]),
        ("a100-mig", "none", vec!["nvidia.com/gpu"]),
        (
            "a100-mig",
            "mixed",
            vec![
                "nvidia.com/gpu",
                "nvidia.com/mig-1g.10gb",
                "nvidia.com/mig-2g.20gb",
                "nvidia.com/mig-3g.40gb",
            ],
        ),
    ] {
        let node = Node::preset(preset);
        let in_spec = spec_names(&node);
        let dir = kubelet_dir(&node);
        let mut k = Kubelet::start(&dir);
        let mut args = plugin_args(&node, &dir);
        args.extend(["--mig-strategy".to_string(), strategy.to_string()]);
        let _p = Plugin::start(Some(&node), &args, &[]);
        let mut count = 0;
        for r in resources {
            for name in handed_out(&mut k, r) {
                assert!(
                    in_spec.contains(&name),
                    "{preset}/{strategy}: {name} is not in the spec: {in_spec:?}"
                );
                count += 1;
            }
        }
        assert!(count > 0);
    }
}
