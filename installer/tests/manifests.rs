//! The kustomize base committed under `deploy/` is exactly what `nvinject-installer manifests`
//! renders, and what it configures is accepted by the components it configures.
//!
//! After changing the manifests code, regenerate with
//! `cargo run -p nvinject-installer -- manifests --out-dir deploy` (or `NVINJECT_BLESS=1`).

use std::fs;
use std::path::Path;

use nvinject_installer::manifests::{DEVICE_PLUGIN_CONFIG, ManifestArgs, render};

fn deploy_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

#[test]
fn committed_deploy_base_equals_the_rendered_manifests() {
    let files = render(&ManifestArgs::default()).unwrap();
    let dir = deploy_dir();
    if std::env::var_os("NVINJECT_BLESS").is_some() {
        for f in &files {
            fs::write(dir.join(f.name), &f.content).unwrap();
        }
    }
    let mut problems = Vec::new();
    for f in &files {
        match fs::read_to_string(dir.join(f.name)) {
            Ok(committed) if committed == f.content => {}
            Ok(_) => problems.push(format!("deploy/{} differs from the rendered output", f.name)),
            Err(e) => problems.push(format!("deploy/{}: {e}", f.name)),
        }
    }
    for entry in fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".yaml") && !files.iter().any(|f| f.name == name) {
            problems.push(format!("deploy/{name} is not rendered by the installer: remove it"));
        }
    }
    assert!(
        problems.is_empty(),
        "{}\nregenerate: cargo run -p nvinject-installer -- manifests --out-dir deploy",
        problems.join("\n")
    );
}

#[test]
fn every_document_is_a_kubernetes_object_with_the_expected_kinds() {
    let mut kinds = Vec::new();
    for f in render(&ManifestArgs::default()).unwrap() {
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&f.content).unwrap();
        for value in docs {
            let kind = value["kind"].as_str().unwrap().to_owned();
            assert!(value["apiVersion"].as_str().is_some(), "{}: no apiVersion", f.name);
            kinds.push(kind);
        }
    }
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "DaemonSet",
            "DaemonSet",
            "Kustomization",
            "Namespace",
            "RuntimeClass",
            "ServiceAccount",
            "ServiceAccount"
        ]
    );
}

#[test]
fn the_device_plugin_accepts_its_config_map() {
    let file =
        nvinject_device_plugin::config::parse_file(DEVICE_PLUGIN_CONFIG, Path::new("configmap/config.yaml"))
            .unwrap_or_else(|e| panic!("{e}"));
    let defaults = nvinject_device_plugin::config::Defaults {
        driver_root: "/driver-root".into(),
        proc_root: "/proc".into(),
        kubelet_socket: "/var/lib/kubelet/device-plugins/kubelet.sock".into(),
        features_file: "".into(),
    };
    let resolved =
        nvinject_device_plugin::config::resolve(&file, "configmap", &Default::default(), &defaults)
            .unwrap_or_else(|e| panic!("{e}"));
    assert!(resolved.ignored.is_empty(), "ignored keys: {:?}", resolved.ignored);
    assert_eq!(resolved.settings.device_list_strategies.len(), 1);
    assert_eq!(resolved.settings.cdi_annotation_prefix, "cdi.k8s.io/");
}
