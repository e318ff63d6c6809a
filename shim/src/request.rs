//! Which devices a container asks for: a pure function of its OCI spec and the request policy.
//!
//! Sources, in priority order (the first that asks for anything wins; the others are reported as
//! ignored, so an image's `ENV NVIDIA_VISIBLE_DEVICES=all` cannot widen what the device plugin
//! allocated through an annotation):
//! 1. annotations whose key starts with a configured prefix (`cdi.k8s.io/`): comma-separated CDI
//!    names;
//! 2. mounts of `/dev/null` at `/var/run/nvidia-container-devices/<id>` (device plugin
//!    volume-mounts strategy), when the policy accepts them;
//! 3. `NVIDIA_VISIBLE_DEVICES` in the process environment (`all`, indices, UUIDs, MIG ids, CDI
//!    names; `none`, `void` and empty ask for nothing), only from privileged containers unless the
//!    policy accepts it from everyone.
//!
//! Bare ids (`1`, `GPU-...`) get the default kind. Duplicates are dropped, keeping first-seen
//! order. Sandbox (pause) containers ask for nothing by definition.
//!
//! A request from the env or volume mounts with at least one bare id is a legacy request, whose
//! driver files follow `NVIDIA_DRIVER_CAPABILITIES` (see [`crate::capabilities`]); annotations and
//! requests of only qualified CDI names get the whole spec, as NVIDIA's runtime gives them.

use std::collections::BTreeSet;
use std::fmt;

use nvinject_cdi::{Kind, NameError, QualifiedName};
use nvinject_fsio::escape::escape;
use serde_json::Value;

/// Where volume-mount requests point.
pub const DEVICE_LIST_DIRS: [&str; 2] =
    ["/var/run/nvidia-container-devices/", "/run/nvidia-container-devices/"];

/// The environment variable of NVIDIA's container toolkit.
pub const VISIBLE_DEVICES_ENV: &str = "NVIDIA_VISIBLE_DEVICES";

/// The annotation CRI puts on every container with its role (`sandbox` or `container`).
pub const CONTAINER_TYPE_ANNOTATION: &str = "io.kubernetes.cri.container-type";

/// What requests are honoured, from the config.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Kind for bare ids.
    pub default_kind: Kind,
    /// Annotation key prefixes that carry requests.
    pub annotation_prefixes: Vec<String>,
    /// Honour `NVIDIA_VISIBLE_DEVICES` from unprivileged containers.
    pub accept_env_unprivileged: bool,
    /// Honour `/dev/null` volume-mount requests.
    pub accept_volume_mounts: bool,
}

/// A request source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// One or more annotations (their keys).
    Annotations(Vec<String>),
    /// `/dev/null` mounts under the device list directory.
    VolumeMounts,
    /// `NVIDIA_VISIBLE_DEVICES`.
    Env,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Keys come from the pod: escaped and cut, so a 70 KB key is one short field.
            Source::Annotations(keys) => {
                f.write_str("annotations ")?;
                for (i, key) in keys.iter().enumerate() {
                    write!(f, "{}{}", if i == 0 { "" } else { "," }, escape(key))?;
                }
                Ok(())
            }
            Source::VolumeMounts => f.write_str("volume-mounts"),
            Source::Env => f.write_str(VISIBLE_DEVICES_ENV),
        }
    }
}

/// A request that was present but not used, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ignored {
    /// Where it was.
    pub source: Source,
    /// Why it was not used.
    pub reason: String,
}

/// The outcome for one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// A pod sandbox (pause) container: never touched.
    Sandbox,
    /// No device asked for (after applying the policy).
    Nothing {
        /// Requests that were present but not honoured.
        ignored: Vec<Ignored>,
    },
    /// These devices, from this source.
    Devices {
        /// Where the request came from.
        source: Source,
        /// The devices, deduplicated, in request order.
        names: Vec<QualifiedName>,
        /// Lower-priority or refused requests that were also present.
        ignored: Vec<Ignored>,
        /// How the devices were named: NVIDIA's runtime takes a request of only qualified CDI
        /// names (`vendor/class=name`, and every annotation) as a CDI request, which injects the
        /// spec as it is; bare ids from the env or volume mounts make a legacy request, which
        /// honours `NVIDIA_DRIVER_CAPABILITIES`.
        naming: Naming,
    },
}

/// How a request named its devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// Only qualified CDI names, or an annotation (CDI by definition).
    Cdi,
    /// At least one bare id (`0`, `GPU-...`, `all`) from the env or a volume mount.
    Legacy,
}

impl Resolution {
    /// Whether `NVIDIA_DRIVER_CAPABILITIES` applies: devices asked for by the env or volume
    /// mounts with at least one bare id, as NVIDIA's legacy runtime mode takes them.
    pub fn honours_driver_capabilities(&self) -> bool {
        matches!(
            self,
            Resolution::Devices { source: Source::Env | Source::VolumeMounts, naming: Naming::Legacy, .. }
        )
    }
}

/// A request that names something that cannot be a device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid device request `{}` in {origin}: {error}", escape(.value))]
pub struct RequestError {
    /// Where it was.
    pub origin: Source,
    /// The offending entry.
    pub value: String,
    /// What is wrong with it.
    pub error: RequestProblem,
}

/// What is wrong with one requested entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestProblem {
    /// Not a CDI name.
    #[error(transparent)]
    Name(#[from] NameError),
    /// A qualified name of another kind from a source the image or the pod controls
    /// (`NVIDIA_VISIBLE_DEVICES`, volume mounts): those stand for the toolkit's variable, which
    /// names NVIDIA GPUs, so they must not reach another vendor's CDI devices.
    #[error(
        "kind `{kind}` is not the default kind `{default}`; only the device plugin's annotations may name \
         other kinds (write a bare id or {default}=<id>)"
    )]
    ForeignKind {
        /// The kind the entry named.
        kind: Kind,
        /// `cdi.default-kind`.
        default: Kind,
    },
    /// The MPS device without a GPU of its kind (see `nvinject_cdi::nvinject::check_mps_request`).
    #[error(transparent)]
    MpsWithoutGpu(Box<nvinject_cdi::nvinject::MpsWithoutGpu>),
}

/// Reads the requests of the container whose OCI spec is `oci`.
pub fn resolve(oci: &Value, policy: &Policy) -> Result<Resolution, RequestError> {
    let annotations = oci.get("annotations").and_then(Value::as_object);
    let annotation = |key: &str| annotations.and_then(|a| a.get(key)).and_then(Value::as_str);
    if annotation(CONTAINER_TYPE_ANNOTATION) == Some("sandbox") {
        return Ok(Resolution::Sandbox);
    }

    let mut candidates: Vec<(Source, Vec<String>)> = Vec::new();
    let mut ignored = Vec::new();

    // 1. Annotations, in key order (serde_json keeps file order; sort for determinism).
    let mut keys: Vec<&String> = annotations
        .map(|a| {
            a.keys()
                .filter(|k| policy.annotation_prefixes.iter().any(|p| k.starts_with(p.as_str())))
                .collect()
        })
        .unwrap_or_default();
    keys.sort();
    let mut from_annotations = Vec::new();
    for key in &keys {
        let value = annotation(key).unwrap_or_default();
        from_annotations.extend(split_list(value));
    }
    if !keys.is_empty() {
        candidates.push((Source::Annotations(keys.iter().map(|k| (*k).clone()).collect()), from_annotations));
    }

    // 2. Volume mounts.
    let mounted: Vec<String> = oci
        .get("mounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|m| m.get("source").and_then(Value::as_str) == Some("/dev/null"))
        .filter_map(|m| m.get("destination").and_then(Value::as_str))
        .filter_map(|d| DEVICE_LIST_DIRS.iter().find_map(|dir| d.strip_prefix(dir)))
        .map(|id| id.trim_matches('/').to_owned())
        .filter(|id| !id.is_empty())
        .collect();
    if !mounted.is_empty() {
        if policy.accept_volume_mounts {
            candidates.push((Source::VolumeMounts, mounted));
        } else {
            ignored.push(Ignored {
                source: Source::VolumeMounts,
                reason: "requests.accept-nvidia-visible-devices-as-volume-mounts is false".into(),
            });
        }
    }

    // 3. The environment (last entry wins, as for the process itself).
    let env_value = oci
        .pointer("/process/env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter_map(|e| e.strip_prefix(VISIBLE_DEVICES_ENV).and_then(|r| r.strip_prefix('=')))
        .next_back();
    if let Some(value) = env_value {
        let ids = env_ids(value);
        if !ids.is_empty() {
            if policy.accept_env_unprivileged || is_privileged(oci) {
                candidates.push((Source::Env, ids));
            } else {
                ignored.push(Ignored {
                    source: Source::Env,
                    reason: "the container is not privileged and requests.accept-env-unprivileged is false"
                        .into(),
                });
            }
        }
    }

    let mut candidates = candidates.into_iter();
    let Some((source, ids)) = candidates.by_ref().find(|(_, ids)| !ids.is_empty()) else {
        return Ok(Resolution::Nothing { ignored });
    };
    for (other, _) in candidates {
        ignored.push(Ignored { reason: format!("{source} take priority"), source: other });
    }
    let naming = if matches!(source, Source::Annotations(_)) || ids.iter().all(|id| id.contains('=')) {
        Naming::Cdi
    } else {
        Naming::Legacy
    };
    let mut seen = BTreeSet::new();
    let mut names = Vec::new();
    for id in ids {
        let fail = |error: RequestProblem| RequestError { origin: source.clone(), value: id.clone(), error };
        let name = qualify(&id, &policy.default_kind).map_err(|e| fail(e.into()))?;
        if !matches!(source, Source::Annotations(_)) && name.kind() != &policy.default_kind {
            return Err(fail(RequestProblem::ForeignKind {
                kind: name.kind().clone(),
                default: policy.default_kind.clone(),
            }));
        }
        if seen.insert(name.clone()) {
            names.push(name);
        }
    }
    // The MPS pipe folder goes only with a GPU: a request for it alone is a mistake or an attempt
    // to reach the daemon without being its client.
    if let Err(e) = nvinject_cdi::nvinject::check_mps_request(&names) {
        let value = e.mps.to_string();
        return Err(RequestError {
            origin: source,
            value,
            error: RequestProblem::MpsWithoutGpu(Box::new(e)),
        });
    }
    Ok(Resolution::Devices { source, names, ignored, naming })
}

fn split_list(value: &str) -> impl Iterator<Item = String> + '_ {
    value.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned)
}

/// `NVIDIA_VISIBLE_DEVICES` values: `none`, `void` and empty mean no device.
fn env_ids(value: &str) -> Vec<String> {
    match value.trim() {
        "" | "none" | "void" => Vec::new(),
        v => split_list(v).collect(),
    }
}

/// A bare id gets the default kind; anything with `vendor/class=` is parsed as it is.
pub fn qualify(id: &str, default_kind: &Kind) -> Result<QualifiedName, NameError> {
    if id.contains('=') { id.parse() } else { QualifiedName::new(default_kind.clone(), id) }
}

/// Privileged as NVIDIA's toolkit and CRI mean it: `CAP_SYS_ADMIN` in the bounding set.
pub fn is_privileged(oci: &Value) -> bool {
    oci.pointer("/process/capabilities/bounding")
        .and_then(Value::as_array)
        .is_some_and(|caps| caps.iter().any(|c| c.as_str() == Some("CAP_SYS_ADMIN")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy() -> Policy {
        Policy {
            default_kind: "nvidia.com/gpu".parse().unwrap(),
            annotation_prefixes: vec!["cdi.k8s.io/".into()],
            accept_env_unprivileged: false,
            accept_volume_mounts: true,
        }
    }

    fn names(r: &Resolution) -> Vec<String> {
        match r {
            Resolution::Devices { names, .. } => names.iter().map(|n| n.to_string()).collect(),
            other => panic!("expected devices, got {other:?}"),
        }
    }

    fn privileged(env: &[&str]) -> Value {
        json!({"process": {"env": env, "capabilities": {"bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN"]}}})
    }

    #[test]
    fn annotations_are_read_split_and_deduplicated() {
        let oci = json!({"annotations": {
            "cdi.k8s.io/nvinject-device-plugin_abc": "nvidia.com/gpu=GPU-1, nvidia.com/gpu=GPU-2",
            "cdi.k8s.io/x": "nvidia.com/gpu=GPU-1,3",
            "other.io/y": "nvidia.com/gpu=7"
        }});
        let r = resolve(&oci, &policy()).unwrap();
        assert_eq!(names(&r), ["nvidia.com/gpu=GPU-1", "nvidia.com/gpu=GPU-2", "nvidia.com/gpu=3"]);
        assert!(matches!(r, Resolution::Devices { source: Source::Annotations(ref k), .. } if k.len() == 2));
    }

    #[test]
    fn keys_and_names_from_the_pod_are_escaped_and_cut_in_messages() {
        let long_key = format!("cdi.k8s.io/{}", "k".repeat(70_000));
        let oci = json!({"annotations": {long_key.clone(): "nvidia.com/gpu=0\n\u{1b}[2J"}});
        let e = resolve(&oci, &policy()).unwrap_err().to_string();
        assert!(!e.contains('\n') && !e.contains('\u{1b}'), "{e:?}");
        assert!(e.contains("...[truncated: 70011 bytes in all]"), "{e}");
        assert!(e.contains("`nvidia.com/gpu=0\\n\\u{1b}[2J`"), "{e}");
        assert!(e.len() < 1000, "{} bytes: {e}", e.len());
        // The same key on a good request: the source, as the create log shows it, is cut too.
        let oci = json!({"annotations": {long_key: "nvidia.com/gpu=0"}});
        let Resolution::Devices { source, .. } = resolve(&oci, &policy()).unwrap() else { panic!() };
        assert!(source.to_string().len() < 400, "{source}");
    }

    #[test]
    fn volume_mounts_name_devices_by_destination() {
        let oci = json!({"mounts": [
            {"destination": "/var/run/nvidia-container-devices/GPU-abc", "source": "/dev/null", "type": "bind"},
            {"destination": "/var/run/nvidia-container-devices/nvidia.com/gpu=1", "source": "/dev/null"},
            {"destination": "/var/run/nvidia-container-devices/2", "source": "/tmp/not-null"},
            {"destination": "/proc", "source": "proc"}
        ]});
        assert_eq!(names(&resolve(&oci, &policy()).unwrap()), ["nvidia.com/gpu=GPU-abc", "nvidia.com/gpu=1"]);
        let mut off = policy();
        off.accept_volume_mounts = false;
        let r = resolve(&oci, &off).unwrap();
        assert!(
            matches!(&r, Resolution::Nothing { ignored } if ignored[0].source == Source::VolumeMounts),
            "{r:?}"
        );
    }

    #[test]
    fn env_is_honoured_for_privileged_containers_only_by_default() {
        let unpriv = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0,1"], "capabilities": {"bounding": ["CAP_CHOWN"]}}});
        let r = resolve(&unpriv, &policy()).unwrap();
        match &r {
            Resolution::Nothing { ignored } => assert!(ignored[0].reason.contains("not privileged")),
            other => panic!("{other:?}"),
        }
        let mut open = policy();
        open.accept_env_unprivileged = true;
        assert_eq!(names(&resolve(&unpriv, &open).unwrap()), ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]);
        assert_eq!(
            names(&resolve(&privileged(&["NVIDIA_VISIBLE_DEVICES=all"]), &policy()).unwrap()),
            ["nvidia.com/gpu=all"]
        );
    }

    #[test]
    fn env_forms_none_void_mig_and_last_entry_wins() {
        for nothing in ["none", "void", "", " "] {
            let var = format!("NVIDIA_VISIBLE_DEVICES={nothing}");
            let r = resolve(&privileged(&[var.as_str()]), &policy()).unwrap();
            assert_eq!(r, Resolution::Nothing { ignored: vec![] }, "{nothing:?}");
        }
        let oci = privileged(&[
            "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_VISIBLE_DEVICES=0:1,MIG-xyz,nvidia.com/gpu=2",
        ]);
        assert_eq!(
            names(&resolve(&oci, &policy()).unwrap()),
            ["nvidia.com/gpu=0:1", "nvidia.com/gpu=MIG-xyz", "nvidia.com/gpu=2"]
        );
        // A longer variable name is not the same variable.
        let r = resolve(&privileged(&["NVIDIA_VISIBLE_DEVICES_X=1"]), &policy()).unwrap();
        assert_eq!(r, Resolution::Nothing { ignored: vec![] });
    }

    #[test]
    fn the_first_source_that_asks_wins_and_the_rest_are_reported() {
        let mut oci = privileged(&["NVIDIA_VISIBLE_DEVICES=all"]);
        oci["annotations"] = json!({"cdi.k8s.io/a": "nvidia.com/gpu=1"});
        oci["mounts"] =
            json!([{"destination": "/var/run/nvidia-container-devices/3", "source": "/dev/null"}]);
        let r = resolve(&oci, &policy()).unwrap();
        assert_eq!(names(&r), ["nvidia.com/gpu=1"]);
        let Resolution::Devices { ignored, .. } = r else { unreachable!() };
        let sources: Vec<_> = ignored.iter().map(|i| i.source.clone()).collect();
        assert_eq!(sources, [Source::VolumeMounts, Source::Env]);
        // An empty annotation does not shadow a lower source.
        let mut oci = privileged(&["NVIDIA_VISIBLE_DEVICES=2"]);
        oci["annotations"] = json!({"cdi.k8s.io/a": " , "});
        assert_eq!(names(&resolve(&oci, &policy()).unwrap()), ["nvidia.com/gpu=2"]);
    }

    #[test]
    fn sandboxes_are_left_alone_even_with_requests() {
        let oci = json!({"annotations": {"io.kubernetes.cri.container-type": "sandbox", "cdi.k8s.io/a": "nvidia.com/gpu=1"}});
        assert_eq!(resolve(&oci, &policy()).unwrap(), Resolution::Sandbox);
    }

    #[test]
    fn bad_names_are_errors_naming_source_and_entry() {
        let oci = json!({"annotations": {"cdi.k8s.io/a": "nvidia.com/gpu=0,nvidia.com/gpu=bad name"}});
        let e = resolve(&oci, &policy()).unwrap_err();
        assert_eq!(e.value, "nvidia.com/gpu=bad name");
        let text = e.to_string();
        assert!(text.contains("annotations cdi.k8s.io/a") && text.contains("bad name"), "{text}");
        let e = resolve(&privileged(&["NVIDIA_VISIBLE_DEVICES=-1"]), &policy()).unwrap_err();
        assert_eq!(e.origin, Source::Env);
    }

    #[test]
    fn env_and_mounts_name_only_the_default_kind() {
        // Found by tests/prop_request.rs: an image's env or a pod's hostPath mount reached any
        // vendor's CDI devices. Annotations (set by the device plugin through CRI) still may.
        let e =
            resolve(&privileged(&["NVIDIA_VISIBLE_DEVICES=0,example.com/nic=eth0"]), &policy()).unwrap_err();
        assert_eq!((e.origin.clone(), e.value.as_str()), (Source::Env, "example.com/nic=eth0"));
        assert!(matches!(e.error, RequestProblem::ForeignKind { .. }), "{e}");
        assert!(e.to_string().contains("nvidia.com/gpu"), "{e}");
        let oci = json!({"mounts": [
            {"destination": "/var/run/nvidia-container-devices/nvidia.com/mig=0:1", "source": "/dev/null"}
        ]});
        let e = resolve(&oci, &policy()).unwrap_err();
        assert_eq!(e.origin, Source::VolumeMounts);
        let oci = json!({"annotations": {"cdi.k8s.io/a": "example.com/nic=eth0"}});
        assert_eq!(names(&resolve(&oci, &policy()).unwrap()), ["example.com/nic=eth0"]);
        assert_eq!(
            names(&resolve(&privileged(&["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1,2"]), &policy()).unwrap()),
            ["nvidia.com/gpu=1", "nvidia.com/gpu=2"]
        );
    }

    #[test]
    fn only_bare_ids_from_env_or_mounts_make_a_legacy_request() {
        let honours = |oci: &Value| resolve(oci, &policy()).unwrap().honours_driver_capabilities();
        assert!(honours(&privileged(&["NVIDIA_VISIBLE_DEVICES=0"])));
        assert!(honours(&privileged(&["NVIDIA_VISIBLE_DEVICES=all"])));
        assert!(
            honours(&privileged(&["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0,1"])),
            "one bare id is enough"
        );
        assert!(!honours(&privileged(&["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0,nvidia.com/gpu=1"])));
        let mounts = json!({"mounts": [{"destination": "/var/run/nvidia-container-devices/GPU-abc", "source": "/dev/null"}]});
        assert!(honours(&mounts));
        let mut oci = privileged(&["NVIDIA_VISIBLE_DEVICES=0"]);
        oci["annotations"] = json!({"cdi.k8s.io/a": "nvidia.com/gpu=1"});
        assert!(!honours(&oci), "annotations are CDI requests, whatever the env says");
        assert!(!honours(&json!({})));
    }

    #[test]
    fn containers_without_requests_resolve_to_nothing() {
        for oci in [
            json!({}),
            json!({"process": {"env": ["PATH=/bin"]}, "mounts": [], "annotations": {}}),
            json!(null),
        ] {
            assert_eq!(resolve(&oci, &policy()).unwrap(), Resolution::Nothing { ignored: vec![] });
        }
    }

    #[test]
    fn the_mps_device_is_refused_without_a_gpu_from_every_source() {
        let mps_only = [
            json!({"annotations": {"cdi.k8s.io/a": "nvidia.com/gpu=mps"}}),
            privileged(&["NVIDIA_VISIBLE_DEVICES=mps"]),
            json!({"mounts": [{"destination": "/var/run/nvidia-container-devices/mps", "source": "/dev/null"}]}),
            // Another kind's device is no GPU of the MPS device's kind.
            json!({"annotations": {"cdi.k8s.io/a": "nvidia.com/gpu=mps,example.com/net=0"}}),
        ];
        for oci in mps_only {
            let e = resolve(&oci, &policy()).unwrap_err();
            assert_eq!(e.value, "nvidia.com/gpu=mps", "{oci}");
            assert!(matches!(e.error, RequestProblem::MpsWithoutGpu(_)), "{e}");
            assert!(e.to_string().contains("without a GPU of kind nvidia.com/gpu"), "{e}");
        }
        // With a GPU (as the device plugin hands it out), from any source: given.
        for oci in [
            json!({"annotations": {"cdi.k8s.io/a": "nvidia.com/gpu=GPU-1", "cdi.k8s.io/b": "nvidia.com/gpu=mps"}}),
            privileged(&["NVIDIA_VISIBLE_DEVICES=GPU-1,mps"]),
        ] {
            let names = names(&resolve(&oci, &policy()).unwrap());
            assert_eq!(names, ["nvidia.com/gpu=GPU-1", "nvidia.com/gpu=mps"], "{oci}");
        }
    }
}
