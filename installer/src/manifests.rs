//! The Kubernetes manifests, built as typed `k8s-openapi` objects and rendered to YAML.
//!
//! `deploy/` holds the same files as a kustomize base; a test checks they equal what this module
//! renders, so the committed YAML can never drift from the code.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, RollingUpdateDaemonSet};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, EnvVar, EnvVarSource, ExecAction, HostPathVolumeSource,
    Namespace, ObjectFieldSelector, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SecurityContext,
    ServiceAccount, Toleration, Volume, VolumeMount,
};
use k8s_openapi::api::node::v1::{RuntimeClass, Scheduling};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::error::{Error, Result};
use crate::service::RestartMode;

/// The image carrying every nvinject binary.
pub const DEFAULT_IMAGE: &str = concat!("ghcr.io/nvinject/nvinject:v", env!("CARGO_PKG_VERSION"));

/// Where the installer DaemonSet signals readiness: the host's `/run/nvinject/ready` (through its
/// `/host` mount), so the device plugin on the node sees it too; `/run` is emptied at boot, and
/// the installer removes the file when it starts and when it stops.
pub const READY_FILE: &str = "/host/run/nvinject/ready";

/// Where the device plugin DaemonSet mounts the host's `/run`: the installer's ready file and
/// the CDI spec directory containerd reads (`/var/run/cdi`, which is `/run/cdi` on every
/// distribution that links `/var/run` to `/run`) are under it.
const PLUGIN_HOST_RUN: &str = "/host/run";

/// `manifests` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ManifestArgs {
    /// Namespace of the DaemonSets.
    #[arg(long, default_value = "nvinject-system")]
    pub namespace: String,
    /// Image with the nvinject binaries.
    #[arg(long, default_value = DEFAULT_IMAGE)]
    pub image: String,
    /// RuntimeClass name and containerd handler.
    #[arg(long, default_value = "nvidia")]
    pub handler: String,
    /// Node label (KEY=VALUE) selecting GPU nodes.
    #[arg(long, default_value = "nvidia.com/gpu.present=true")]
    pub node_selector: String,
    /// Restart mode the installer DaemonSet uses (auto, signal, systemd, none). `auto` restarts
    /// through systemd where the host runs containerd's unit (it is back at once) and otherwise by
    /// signal, NVIDIA's default for containerd, which works whatever supervises containerd (k3s,
    /// rke2, a test node). Both signalling modes make the pod use the host's PID namespace, where
    /// the process serving containerd's socket can be found and signalled.
    #[arg(long, value_enum, default_value = "auto")]
    pub restart_mode: RestartMode,
    /// Write the kustomize base into this directory instead of printing one YAML stream.
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
}

impl Default for ManifestArgs {
    fn default() -> Self {
        ManifestArgs {
            namespace: "nvinject-system".into(),
            image: DEFAULT_IMAGE.into(),
            handler: "nvidia".into(),
            node_selector: "nvidia.com/gpu.present=true".into(),
            restart_mode: RestartMode::Auto,
            out_dir: None,
        }
    }
}

/// One rendered file of the kustomize base.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestFile {
    /// File name in the base.
    pub name: &'static str,
    /// YAML content.
    pub content: String,
}

/// The device plugin's configuration (NVIDIA's `version: v1` format): CDI annotations with uuid
/// names, which the shim turns into devices, so the kubelet passes no device nodes itself.
pub const DEVICE_PLUGIN_CONFIG: &str = "\
version: v1
flags:
  migStrategy: none
  failOnInitError: true
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: cdi-annotations
    deviceIDStrategy: uuid
";

const HEADER: &str = "# Rendered by `nvinject-installer manifests --out-dir deploy`: edit the code, not this file\n\
                      # (a test checks that it equals the rendered output).\n";

fn labels(name: &str, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), name.to_owned()),
        ("app.kubernetes.io/component".to_owned(), component.to_owned()),
        ("app.kubernetes.io/part-of".to_owned(), "nvinject".to_owned()),
    ])
}

fn meta(name: &str, namespace: Option<&str>, component: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(labels(name, component)),
        ..Default::default()
    }
}

fn node_selector(args: &ManifestArgs) -> Result<BTreeMap<String, String>> {
    let (key, value) = args.node_selector.split_once('=').ok_or_else(|| {
        Error::Manifest(format!("--node-selector {:?}: expected KEY=VALUE", args.node_selector))
    })?;
    Ok(BTreeMap::from([(key.to_owned(), value.to_owned())]))
}

/// Tolerations for the taints GPU nodes commonly carry.
fn gpu_tolerations() -> Vec<Toleration> {
    vec![
        Toleration {
            key: Some("nvidia.com/gpu".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        },
        Toleration {
            key: Some("CriticalAddonsOnly".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        },
    ]
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), ..Default::default() }
}

fn host_path(name: &str, path: &str, kind: &str) -> Volume {
    Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource { path: path.into(), type_: Some(kind.into()) }),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

fn resources(cpu: &str, memory: &str, memory_limit: &str) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.into())),
            ("memory".to_owned(), Quantity(memory.into())),
        ])),
        limits: Some(BTreeMap::from([("memory".to_owned(), Quantity(memory_limit.into()))])),
        ..Default::default()
    }
}

fn daemon_set(name: &str, args: &ManifestArgs, component: &str, pod: PodSpec) -> DaemonSet {
    let selector = BTreeMap::from([("app.kubernetes.io/name".to_owned(), name.to_owned())]);
    let pod_labels = labels(name, component);
    DaemonSet {
        metadata: meta(name, Some(&args.namespace), component),
        spec: Some(DaemonSetSpec {
            selector: LabelSelector { match_labels: Some(selector), ..Default::default() },
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDaemonSet {
                    max_unavailable: Some(IntOrString::Int(1)),
                    ..Default::default()
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(pod_labels), ..Default::default() }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The installer DaemonSet: privileged, host root at `/host`, `run` mode (install, wait for
/// SIGTERM, uninstall), ready once the install succeeded.
pub fn installer_daemon_set(args: &ManifestArgs) -> Result<DaemonSet> {
    let container = Container {
        name: "installer".into(),
        image: Some(args.image.clone()),
        command: Some(vec!["nvinject-installer".into(), "run".into()]),
        env: Some(vec![
            env("NVINJECT_HOST_ROOT", "/host"),
            env("NVINJECT_HANDLER", &args.handler),
            env("NVINJECT_RESTART_MODE", args.restart_mode.name()),
            env("NVINJECT_DRIVER_ROOT", "/"),
            env("NVINJECT_READY_FILE", READY_FILE),
            env("NVINJECT_LOG_FORMAT", "json"),
        ]),
        security_context: Some(SecurityContext { privileged: Some(true), ..Default::default() }),
        volume_mounts: Some(vec![mount("host-root", "/host", false)]),
        readiness_probe: Some(Probe {
            exec: Some(ExecAction {
                command: Some(vec![
                    "nvinject-installer".into(),
                    "probe".into(),
                    "--ready-file".into(),
                    READY_FILE.into(),
                ]),
            }),
            period_seconds: Some(5),
            ..Default::default()
        }),
        resources: Some(resources("10m", "32Mi", "256Mi")),
        ..Default::default()
    };
    let pod = PodSpec {
        service_account_name: Some("nvinject-installer".into()),
        automount_service_account_token: Some(false),
        priority_class_name: Some("system-node-critical".into()),
        node_selector: Some(node_selector(args)?),
        tolerations: Some(gpu_tolerations()),
        // Signalling containerd (`signal`, `auto`'s fallback) needs its PID, which SO_PEERCRED on
        // the socket gives only in the host's PID namespace.
        host_pid: matches!(args.restart_mode, RestartMode::Signal | RestartMode::Auto).then_some(true),
        // Uninstall restores containerd's config and restarts it: give it time.
        termination_grace_period_seconds: Some(120),
        containers: vec![container],
        volumes: Some(vec![host_path("host-root", "/", "Directory")]),
        ..Default::default()
    };
    Ok(daemon_set("nvinject-installer", args, "installer", pod))
}

/// The device plugin DaemonSet: registers `nvidia.com/gpu` with the kubelet and answers Allocate
/// with CDI annotations.
pub fn device_plugin_daemon_set(args: &ManifestArgs) -> Result<DaemonSet> {
    let container = Container {
        name: "device-plugin".into(),
        image: Some(args.image.clone()),
        command: Some(vec![
            "nvinject-device-plugin".into(),
            "--config-file".into(),
            "/etc/nvinject-device-plugin/config.yaml".into(),
        ]),
        env: Some(vec![
            // The host's driver root is `/`, mounted read-only at /driver-root: NVML is loaded
            // from there, and a regenerated spec names the host's paths (NVIDIA's two variables).
            // Device nodes are named by their host paths.
            env("NVIDIA_DRIVER_ROOT", "/"),
            env("CONTAINER_DRIVER_ROOT", "/driver-root"),
            env("NVIDIA_DEV_ROOT", "/"),
            env("NVINJECT_FEATURES_FILE", ""),
            // containerd's own CDI (2.x's default) reads this spec without our shim: the plugin
            // regenerates it after a driver upgrade before it answers Allocate, once the installer,
            // which owns the file, is ready; until then it does not register.
            env(
                "NVINJECT_CDI_SPEC",
                &format!("{PLUGIN_HOST_RUN}/cdi/{}", nvinject_cdi::nvinject::SPEC_FILE_NAME),
            ),
            env("NVINJECT_INSTALLER_READY_FILE", READY_FILE),
            // The Node object the GPU labels go on (the plugin's ClusterRole allows `get` and
            // `patch` on nodes, nothing else).
            EnvVar {
                name: "NODE_NAME".into(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "spec.nodeName".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ]),
        // NVML opens /dev/nvidia*; a privileged container sees the host's device nodes.
        security_context: Some(SecurityContext { privileged: Some(true), ..Default::default() }),
        volume_mounts: Some(vec![
            mount("device-plugins", "/var/lib/kubelet/device-plugins", false),
            mount("driver-root", "/driver-root", true),
            mount("host-run", PLUGIN_HOST_RUN, false),
            mount("config", "/etc/nvinject-device-plugin", true),
        ]),
        resources: Some(resources("10m", "32Mi", "256Mi")),
        ..Default::default()
    };
    let pod = PodSpec {
        service_account_name: Some("nvinject-device-plugin".into()),
        // Its token labels the Node object; the installer's pod gets none.
        automount_service_account_token: Some(true),
        priority_class_name: Some("system-node-critical".into()),
        node_selector: Some(node_selector(args)?),
        tolerations: Some(gpu_tolerations()),
        containers: vec![container],
        volumes: Some(vec![
            host_path("device-plugins", "/var/lib/kubelet/device-plugins", "Directory"),
            host_path("driver-root", "/", "Directory"),
            host_path("host-run", "/run", "Directory"),
            Volume {
                name: "config".into(),
                config_map: Some(ConfigMapVolumeSource {
                    name: "nvinject-device-plugin".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ]),
        ..Default::default()
    };
    Ok(daemon_set("nvinject-device-plugin", args, "device-plugin", pod))
}

/// An RFC 1123 label: what Kubernetes accepts as a RuntimeClass handler (and so what the
/// installer accepts as containerd's runtime name).
pub fn is_dns_label(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// The RuntimeClass pods name to run under nvinject's shim; it also steers them to GPU nodes.
pub fn runtime_class(args: &ManifestArgs) -> Result<RuntimeClass> {
    if !is_dns_label(&args.handler) {
        return Err(Error::Manifest(format!(
            "--handler {:?}: a RuntimeClass handler is a DNS label (lower-case letters, digits and '-', at most \
             63), e.g. nvidia",
            args.handler
        )));
    }
    Ok(RuntimeClass {
        metadata: meta(&args.handler, None, "runtime"),
        handler: args.handler.clone(),
        scheduling: Some(Scheduling {
            node_selector: Some(node_selector(args)?),
            tolerations: Some(gpu_tolerations()[..1].to_vec()),
        }),
        ..Default::default()
    })
}

/// The namespace, labelled so Pod Security admission allows the privileged DaemonSets.
pub fn namespace(args: &ManifestArgs) -> Namespace {
    let mut metadata = meta(&args.namespace, None, "namespace");
    let labels = metadata.labels.get_or_insert_with(BTreeMap::new);
    for mode in ["enforce", "audit", "warn"] {
        labels.insert(format!("pod-security.kubernetes.io/{mode}"), "privileged".into());
    }
    Namespace { metadata, ..Default::default() }
}

/// The service accounts, tokens not mounted unless a pod asks: the installer calls no API; the
/// device plugin's pod mounts its token to label its Node ([`device_plugin_rbac`]).
pub fn service_accounts(args: &ManifestArgs) -> Vec<ServiceAccount> {
    [("nvinject-installer", "installer"), ("nvinject-device-plugin", "device-plugin")]
        .into_iter()
        .map(|(name, component)| ServiceAccount {
            metadata: meta(name, Some(&args.namespace), component),
            automount_service_account_token: Some(false),
            ..Default::default()
        })
        .collect()
}

/// What the device plugin may do through the API: read and patch Node objects (its GPU labels on
/// its own node; RBAC cannot narrow a DaemonSet to "its own" node). Nothing else.
pub fn device_plugin_rbac(args: &ManifestArgs) -> (ClusterRole, ClusterRoleBinding) {
    let name = "nvinject-device-plugin";
    let role = ClusterRole {
        metadata: meta(name, None, "device-plugin"),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["nodes".into()]),
            verbs: vec!["get".into(), "patch".into()],
            ..Default::default()
        }]),
        ..Default::default()
    };
    let binding = ClusterRoleBinding {
        metadata: meta(name, None, "device-plugin"),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: name.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: Some(args.namespace.clone()),
            ..Default::default()
        }]),
    };
    (role, binding)
}

/// The device plugin's configuration.
pub fn device_plugin_config(args: &ManifestArgs) -> ConfigMap {
    ConfigMap {
        metadata: meta("nvinject-device-plugin", Some(&args.namespace), "device-plugin"),
        data: Some(BTreeMap::from([("config.yaml".to_owned(), DEVICE_PLUGIN_CONFIG.to_owned())])),
        ..Default::default()
    }
}

fn yaml<T: serde::Serialize>(docs: &[T]) -> Result<String> {
    let mut out = String::from(HEADER);
    for (i, doc) in docs.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(&serde_saphyr::to_string(doc).map_err(|e| Error::Manifest(e.to_string()))?);
    }
    Ok(out)
}

/// The service accounts, then the plugin's ClusterRole and its binding.
fn rbac_yaml(args: &ManifestArgs) -> Result<String> {
    let value = |v: std::result::Result<serde_json::Value, serde_json::Error>| {
        v.map_err(|e| Error::Manifest(e.to_string()))
    };
    let mut docs: Vec<serde_json::Value> =
        service_accounts(args).iter().map(|sa| value(serde_json::to_value(sa))).collect::<Result<_>>()?;
    let (role, binding) = device_plugin_rbac(args);
    docs.push(value(serde_json::to_value(&role))?);
    docs.push(value(serde_json::to_value(&binding))?);
    yaml(&docs)
}

/// Every file of the kustomize base, `kustomization.yaml` last.
pub fn render(args: &ManifestArgs) -> Result<Vec<ManifestFile>> {
    let mut files = vec![
        ManifestFile { name: "namespace.yaml", content: yaml(&[namespace(args)])? },
        ManifestFile { name: "rbac.yaml", content: rbac_yaml(args)? },
        ManifestFile { name: "runtimeclass.yaml", content: yaml(&[runtime_class(args)?])? },
        ManifestFile { name: "device-plugin-config.yaml", content: yaml(&[device_plugin_config(args)])? },
        ManifestFile { name: "installer-daemonset.yaml", content: yaml(&[installer_daemon_set(args)?])? },
        ManifestFile {
            name: "device-plugin-daemonset.yaml",
            content: yaml(&[device_plugin_daemon_set(args)?])?,
        },
    ];
    let mut kustomization = String::from(HEADER);
    kustomization.push_str("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n");
    for f in &files {
        kustomization.push_str(&format!("- {}\n", f.name));
    }
    files.push(ManifestFile { name: "kustomization.yaml", content: kustomization });
    Ok(files)
}

/// `manifests`: one YAML stream on stdout, or the kustomize base in `--out-dir`.
pub fn run(args: &ManifestArgs) -> Result<()> {
    let files = render(args)?;
    match &args.out_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(Error::io("create directory", dir))?;
            for f in &files {
                let path = dir.join(f.name);
                std::fs::write(&path, &f.content).map_err(Error::io("write", &path))?;
            }
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            for f in files.iter().filter(|f| f.name != "kustomization.yaml") {
                let body = f.content.strip_prefix(HEADER).unwrap_or(&f.content);
                write!(stdout, "---\n{body}").map_err(Error::io("write", "stdout"))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installer_is_privileged_with_the_host_at_slash_host() {
        let ds = installer_daemon_set(&ManifestArgs::default()).unwrap();
        let pod = ds.spec.unwrap().template.spec.unwrap();
        let c = &pod.containers[0];
        assert_eq!(c.security_context.as_ref().unwrap().privileged, Some(true));
        assert_eq!(c.volume_mounts.as_ref().unwrap()[0].mount_path, "/host");
        assert_eq!(pod.volumes.unwrap()[0].host_path.as_ref().unwrap().path, "/");
        assert!(pod.tolerations.unwrap().iter().any(|t| t.key.as_deref() == Some("nvidia.com/gpu")));
        assert_eq!(pod.node_selector.unwrap()["nvidia.com/gpu.present"], "true");
    }

    #[test]
    fn signal_restarts_see_the_hosts_processes_and_systemd_restarts_do_not() {
        let restart = |mode: RestartMode| {
            let ds =
                installer_daemon_set(&ManifestArgs { restart_mode: mode, ..Default::default() }).unwrap();
            let pod = ds.spec.unwrap().template.spec.unwrap();
            let env = pod.containers[0].env.clone().unwrap();
            let value = env.iter().find(|e| e.name == "NVINJECT_RESTART_MODE").unwrap().value.clone();
            (value.unwrap(), pod.host_pid)
        };
        assert_eq!(restart(ManifestArgs::default().restart_mode), ("auto".into(), Some(true)));
        assert_eq!(restart(RestartMode::Signal), ("signal".into(), Some(true)));
        assert_eq!(restart(RestartMode::Systemd), ("systemd".into(), None));
        assert_eq!(restart(RestartMode::None), ("none".into(), None));
    }

    #[test]
    fn the_plugin_may_get_and_patch_nodes_and_nothing_else() {
        let (role, binding) = device_plugin_rbac(&ManifestArgs::default());
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].resources.as_deref(), Some(&["nodes".to_owned()][..]));
        assert_eq!(rules[0].verbs, ["get", "patch"]);
        let subject = &binding.subjects.unwrap()[0];
        assert_eq!(
            (subject.name.as_str(), subject.namespace.as_deref()),
            ("nvinject-device-plugin", Some("nvinject-system"))
        );
        let ds = device_plugin_daemon_set(&ManifestArgs::default()).unwrap();
        let pod = ds.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.automount_service_account_token, Some(true));
        let env = pod.containers[0].env.clone().unwrap();
        let node = env.iter().find(|e| e.name == "NODE_NAME").unwrap();
        assert_eq!(node.value_from.as_ref().unwrap().field_ref.as_ref().unwrap().field_path, "spec.nodeName");
        let installer =
            installer_daemon_set(&ManifestArgs::default()).unwrap().spec.unwrap().template.spec.unwrap();
        assert_eq!(installer.automount_service_account_token, Some(false), "the installer calls no API");
    }

    #[test]
    fn runtime_class_uses_the_handler() {
        let args = ManifestArgs { handler: "nvinject".into(), ..Default::default() };
        let rc = runtime_class(&args).unwrap();
        assert_eq!(rc.handler, "nvinject");
        assert_eq!(rc.metadata.name.as_deref(), Some("nvinject"));
    }

    #[test]
    fn a_handler_kubernetes_would_refuse_is_named() {
        let args = ManifestArgs { handler: "Nvidia_GPU".into(), ..Default::default() };
        assert!(render(&args).unwrap_err().to_string().contains("--handler \"Nvidia_GPU\""));
        assert!(is_dns_label("nvidia") && is_dns_label("nv-1") && !is_dns_label("") && !is_dns_label("-a"));
    }

    #[test]
    fn a_bad_node_selector_is_named() {
        let args = ManifestArgs { node_selector: "gpu".into(), ..Default::default() };
        assert!(render(&args).unwrap_err().to_string().contains("--node-selector \"gpu\""));
    }
}
