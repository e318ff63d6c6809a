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
            "ClusterRole",
            "ClusterRoleBinding",
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

/// The `[env: NAME=...]` names a binary's `--help` declares.
fn declared_env(bin: &Path) -> String {
    let out = std::process::Command::new(bin).arg("--help").output().unwrap();
    assert!(out.status.success(), "{} --help: {}", bin.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Every variable a DaemonSet sets is one its binary reads: a misspelt name would be ignored
/// without a word, and the feature it turns on (the spec check, the ready file) silently off.
#[test]
fn every_variable_the_daemon_sets_set_is_one_their_binaries_read() {
    use nvinject_installer::manifests::{device_plugin_daemon_set, installer_daemon_set};
    let args = ManifestArgs::default();
    let plugin = nvinject_simnode::artifacts::artifact("nvinject-device-plugin", "nvinject-device-plugin");
    let installer = Path::new(env!("CARGO_BIN_EXE_nvinject-installer"));
    let installer_run_help = {
        let out = std::process::Command::new(installer).args(["run", "--help"]).output().unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    for (ds, help) in [
        (device_plugin_daemon_set(&args).unwrap(), declared_env(&plugin)),
        (installer_daemon_set(&args).unwrap(), installer_run_help),
    ] {
        let name = ds.metadata.name.clone().unwrap();
        let spec = ds.spec.unwrap().template.spec.unwrap();
        let env = spec.containers[0].env.clone().unwrap_or_default();
        assert!(!env.is_empty(), "{name}: no environment");
        for var in env {
            assert!(
                help.contains(&format!("[env: {}=", var.name)),
                "{name} sets {}, which its binary does not read",
                var.name
            );
        }
    }
}

/// The plugin is gated on the file the installer writes, and that file is on the host where both
/// see it: the installer's through its host-root mount, the plugin's through its `/run` mount.
#[test]
fn the_plugin_waits_for_the_file_the_installer_writes_and_writes_the_spec_the_installer_owns() {
    use nvinject_installer::manifests::{device_plugin_daemon_set, installer_daemon_set};
    let args = ManifestArgs::default();
    let env_of = |ds: &k8s_openapi::api::apps::v1::DaemonSet, key: &str| {
        let c = &ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0];
        c.env.as_ref().unwrap().iter().find(|e| e.name == key).and_then(|e| e.value.clone())
    };
    // The host path a container path names, through the container's hostPath mounts.
    let host_path_of = |ds: &k8s_openapi::api::apps::v1::DaemonSet, path: &str| -> String {
        let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        let c = &pod.containers[0];
        let mut best: Option<(usize, String)> = None;
        for m in c.volume_mounts.as_ref().unwrap() {
            let Some(rest) = path.strip_prefix(m.mount_path.as_str()) else { continue };
            if !(rest.is_empty() || rest.starts_with('/')) {
                continue;
            }
            let volume = pod.volumes.as_ref().unwrap().iter().find(|v| v.name == m.name).unwrap();
            let Some(hp) = &volume.host_path else { continue };
            if best.as_ref().is_none_or(|(len, _)| m.mount_path.len() > *len) {
                best = Some((m.mount_path.len(), format!("{}{rest}", hp.path.trim_end_matches('/'))));
            }
        }
        let host = best.unwrap_or_else(|| panic!("{path} is on no hostPath mount")).1;
        if host.is_empty() { "/".to_owned() } else { host }
    };
    let installer = installer_daemon_set(&args).unwrap();
    let plugin = device_plugin_daemon_set(&args).unwrap();
    let installer_ready = env_of(&installer, "NVINJECT_READY_FILE").unwrap();
    let plugin_ready = env_of(&plugin, "NVINJECT_INSTALLER_READY_FILE").unwrap();
    assert_eq!(host_path_of(&installer, &installer_ready), "/run/nvinject/ready");
    assert_eq!(host_path_of(&plugin, &plugin_ready), "/run/nvinject/ready");
    // The installer's spec, /var/run/cdi (a link to /run on the distributions we support).
    let spec = env_of(&plugin, "NVINJECT_CDI_SPEC").unwrap();
    assert_eq!(host_path_of(&plugin, &spec), "/run/cdi/nvidia.com-gpu.json");
    // The driver the plugin reads is the host's root, named as the host sees it.
    assert_eq!(env_of(&plugin, "NVIDIA_DRIVER_ROOT").as_deref(), Some("/"));
    let mount = env_of(&plugin, "CONTAINER_DRIVER_ROOT").unwrap();
    assert_eq!(host_path_of(&plugin, &mount), "/");
    // The readiness probe checks the same file.
    let probe = installer.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0]
        .readiness_probe
        .clone()
        .unwrap();
    assert!(probe.exec.unwrap().command.unwrap().contains(&installer_ready));
}
