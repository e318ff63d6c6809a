//! Property tests for the OCI request resolver (`request::resolve`): arbitrary OCI configs (CDI
//! annotations, `NVIDIA_VISIBLE_DEVICES`, `/dev/null` volume mounts, with every policy switch)
//! never panic, give the same answer every time and in any key order, name only devices in the CDI
//! grammar and of the kinds each source may name, and never honour a source the policy refuses.
//! Fixed case counts, no failure files, so CI time is bounded.

use nvinject_cdi::{Kind, QualifiedName};
use nvinject_shim::request::{
    CONTAINER_TYPE_ANNOTATION, DEVICE_LIST_DIRS, Policy, RequestProblem, Resolution, Source,
    VISIBLE_DEVICES_ENV, resolve,
};
use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Map, Value, json};

fn config(cases: u32) -> Config {
    Config { failure_persistence: None, ..Config::with_cases(cases) }
}

const DEFAULT_KIND: &str = "nvidia.com/gpu";

fn policy(accept_env_unprivileged: bool, accept_volume_mounts: bool) -> Policy {
    Policy {
        default_kind: DEFAULT_KIND.parse().unwrap(),
        annotation_prefixes: vec!["cdi.k8s.io/".into()],
        accept_env_unprivileged,
        accept_volume_mounts,
    }
}

/// One entry of a device list: valid ids and names, other vendors' kinds, the toolkit's special
/// words, and text that is not a name at all.
fn entry() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("all".to_owned()),
        Just("none".to_owned()),
        Just("void".to_owned()),
        Just(String::new()),
        Just(" ".to_owned()),
        Just("0".to_owned()),
        Just("0:1".to_owned()),
        Just("GPU-8c3e5a52-77f5-4f6a-9d21-0bd1c5b1a7c1".to_owned()),
        Just("MIG-1d5e0e3c-1c2d-5e1a-8f1b-2a4c7d9e0f11".to_owned()),
        Just("nvidia.com/gpu=1".to_owned()),
        Just("nvidia.com/gpu=all".to_owned()),
        Just("mps".to_owned()),
        Just("nvidia.com/gpu=mps".to_owned()),
        Just("example.com/nic=mps".to_owned()),
        Just("nvidia.com/mig=0:1".to_owned()),
        Just("example.com/nic=eth0".to_owned()),
        Just("=".to_owned()),
        Just("a=b=c".to_owned()),
        Just("nvidia.com/gpu=".to_owned()),
        Just("/gpu=0".to_owned()),
        Just("nvidia.com/=0".to_owned()),
        Just("../../etc/passwd".to_owned()),
        Just("-1".to_owned()),
        Just("\u{0}".to_owned()),
        Just("\u{fffd}\u{fffd}".to_owned()),
        Just("ＧＰＵ-0".to_owned()),
        (0u32..64).prop_map(|n| n.to_string()),
        "[a-z.]{1,12}/[a-z]{1,8}=[A-Za-z0-9:._-]{1,16}",
        "[ -~]{0,24}",
        any::<String>(),
        // Huge: the resolver must not mind, and must not choke on it.
        (1usize..20_000).prop_map(|n| "9".repeat(n)),
    ]
}

/// A comma-separated list, with odd separators and padding.
fn list() -> impl Strategy<Value = String> {
    (prop::collection::vec(entry(), 0..6), prop::sample::select(vec![",", ", ", " ,", ",,", ";"]))
        .prop_map(|(items, sep)| items.join(sep))
}

fn annotation_key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("cdi.k8s.io/".to_owned()),
        Just("cdi.k8s.io/nvinject-device-plugin_abc".to_owned()),
        "cdi\\.k8s\\.io/[ -~]{0,16}",
        Just("cdi.k8s.io".to_owned()),
        Just("CDI.K8S.IO/x".to_owned()),
        Just("other.io/devices".to_owned()),
        Just(CONTAINER_TYPE_ANNOTATION.to_owned()),
        any::<String>(),
    ]
}

fn annotation_value(key: &str) -> BoxedStrategy<Value> {
    if key == CONTAINER_TYPE_ANNOTATION {
        return prop_oneof![Just(json!("sandbox")), Just(json!("container")), Just(json!("Sandbox"))].boxed();
    }
    prop_oneof![
        6 => list().prop_map(Value::from),
        1 => Just(Value::Null),
        1 => any::<i64>().prop_map(Value::from),
        1 => Just(json!(["nvidia.com/gpu=0"])),
        1 => Just(json!({"nvidia.com/gpu": "0"})),
    ]
    .boxed()
}

fn annotations() -> impl Strategy<Value = Vec<(String, Value)>> {
    prop::collection::vec(
        annotation_key().prop_flat_map(|k| {
            let v = annotation_value(&k);
            (Just(k), v)
        }),
        0..5,
    )
}

fn env_entry() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => list().prop_map(|v| Value::from(format!("{VISIBLE_DEVICES_ENV}={v}"))),
        1 => Just(Value::from(VISIBLE_DEVICES_ENV)),
        1 => Just(Value::from(format!("{VISIBLE_DEVICES_ENV}_X=0"))),
        1 => Just(Value::from(format!(" {VISIBLE_DEVICES_ENV}=0"))),
        1 => Just(Value::from("nvidia_visible_devices=0")),
        1 => Just(Value::from("PATH=/usr/bin")),
        1 => Just(Value::from(7)),
        1 => Just(Value::Null),
        1 => any::<String>().prop_map(Value::from),
    ]
}

fn mount() -> impl Strategy<Value = Value> {
    let dir = prop_oneof![
        Just(DEVICE_LIST_DIRS[0].to_owned()),
        Just(DEVICE_LIST_DIRS[1].to_owned()),
        Just("/var/run/nvidia-container-devices".to_owned()),
        Just("/var/run/nvidia-container-devices//".to_owned()),
        Just("/var/run/../run/nvidia-container-devices/".to_owned()),
        Just("/dev/".to_owned()),
    ];
    let source = prop_oneof![
        4 => Just(json!("/dev/null")),
        1 => Just(json!("/dev/nvidia0")),
        1 => Just(json!("/dev/null/")),
        1 => Just(json!(null)),
        1 => Just(json!(0)),
    ];
    (dir, entry(), source, any::<bool>()).prop_map(|(dir, id, source, typed)| {
        let mut m = json!({"destination": format!("{dir}{id}"), "source": source});
        if typed {
            m["type"] = json!("bind");
            m["options"] = json!(["rbind", "ro"]);
        }
        m
    })
}

#[derive(Debug, Clone)]
struct Oci {
    annotations: Vec<(String, Value)>,
    env: Vec<Value>,
    mounts: Vec<Value>,
    privileged: bool,
    /// Whether to spell some fields with the wrong JSON type.
    odd_shapes: u8,
}

impl Oci {
    fn to_json(&self, reverse: bool) -> Value {
        let mut pairs = self.annotations.clone();
        if reverse {
            pairs.reverse();
        }
        // Duplicate keys in the file: serde_json keeps the last, so the map here does the same.
        let mut annotations = Map::new();
        for (k, v) in pairs {
            annotations.insert(k, v);
        }
        let caps = if self.privileged { json!(["CAP_CHOWN", "CAP_SYS_ADMIN"]) } else { json!(["CAP_CHOWN"]) };
        let mut oci = json!({
            "ociVersion": "1.0.2",
            "process": {"env": self.env, "capabilities": {"bounding": caps}},
            "mounts": self.mounts,
            "annotations": annotations,
        });
        match self.odd_shapes {
            1 => oci["annotations"] = json!("cdi.k8s.io/x=nvidia.com/gpu=0"),
            2 => oci["mounts"] = json!({"destination": "/var/run/nvidia-container-devices/0"}),
            3 => oci["process"]["env"] = json!("NVIDIA_VISIBLE_DEVICES=all"),
            4 => oci["process"]["capabilities"]["bounding"] = json!("CAP_SYS_ADMIN"),
            5 => oci["process"] = json!(null),
            _ => {}
        }
        oci
    }
}

fn oci() -> impl Strategy<Value = Oci> {
    (
        annotations(),
        prop::collection::vec(env_entry(), 0..4),
        prop::collection::vec(mount(), 0..4),
        any::<bool>(),
        prop_oneof![6 => Just(0u8), 1 => 1u8..6],
    )
        .prop_map(|(annotations, env, mounts, privileged, odd_shapes)| Oci {
            annotations,
            env,
            mounts,
            privileged,
            odd_shapes,
        })
}

/// Every invariant of one resolution.
fn check(oci: &Oci, accept_env: bool, accept_mounts: bool) -> Result<(), TestCaseError> {
    let policy = policy(accept_env, accept_mounts);
    let value = oci.to_json(false);
    let first = resolve(&value, &policy);
    // Deterministic: the same input twice, and the annotations in another order (when no key is
    // duplicated, the order is the only difference).
    prop_assert_eq!(&first, &resolve(&value, &policy));
    let mut keys: Vec<&String> = oci.annotations.iter().map(|(k, _)| k).collect();
    keys.sort();
    keys.dedup();
    if keys.len() == oci.annotations.len() {
        prop_assert_eq!(&first, &resolve(&oci.to_json(true), &policy), "annotation order changed the result");
    }

    let default_kind: Kind = DEFAULT_KIND.parse().unwrap();
    match &first {
        Err(e) => {
            // The error names the entry (escaped and cut: it is the pod's text) and where it came from.
            let shown = e.to_string();
            let value = nvinject_fsio::escape::escape(&e.value).to_string();
            prop_assert!(shown.contains(&format!("`{value}`")), "{}", shown);
            prop_assert!(!shown.chars().any(char::is_control), "{:?}", shown);
            prop_assert!(shown.contains(&e.origin.to_string()), "{}", shown);
            // Refused only for a reason: not a CDI name, or another kind from env or mounts.
            let valid = match e.value.parse::<QualifiedName>() {
                Ok(n) => Some(n),
                Err(_) if !e.value.contains('=') => QualifiedName::new(default_kind.clone(), &e.value).ok(),
                Err(_) => None,
            };
            match (&e.error, valid) {
                (RequestProblem::Name(_), None) => {}
                (RequestProblem::ForeignKind { kind, .. }, Some(n)) => {
                    prop_assert!(!matches!(e.origin, Source::Annotations(_)), "{}", shown);
                    prop_assert_eq!(n.kind(), kind);
                    prop_assert!(kind != &default_kind, "{}", shown);
                }
                // The MPS device with no GPU of its kind beside it.
                (RequestProblem::MpsWithoutGpu(m), Some(n)) => {
                    prop_assert!(nvinject_cdi::nvinject::is_mps_device(&n), "{}", shown);
                    prop_assert_eq!(&m.mps, &n);
                }
                (problem, valid) => prop_assert!(false, "{:?} refused as {:?}: {}", valid, problem, shown),
            }
        }
        Ok(Resolution::Sandbox) => {
            let sandbox = value["annotations"][CONTAINER_TYPE_ANNOTATION].as_str() == Some("sandbox");
            prop_assert!(sandbox, "sandbox without the sandbox annotation");
        }
        Ok(Resolution::Nothing { ignored }) | Ok(Resolution::Devices { ignored, .. }) => {
            for i in ignored {
                prop_assert!(!i.reason.is_empty());
            }
        }
    }
    // A refused volume-mount request is reported, never silently dropped or honoured.
    let mount_request = value["mounts"].as_array().into_iter().flatten().any(|m| {
        m["source"].as_str() == Some("/dev/null")
            && m["destination"].as_str().is_some_and(|d| {
                DEVICE_LIST_DIRS
                    .iter()
                    .any(|dir| d.strip_prefix(dir).is_some_and(|id| !id.trim_matches('/').is_empty()))
            })
    });
    if mount_request
        && !accept_mounts
        && let Ok(Resolution::Nothing { ignored } | Resolution::Devices { ignored, .. }) = &first
    {
        prop_assert!(ignored.iter().any(|i| i.source == Source::VolumeMounts), "refused mounts not reported");
    }
    if let Ok(Resolution::Devices { source, names, .. }) = &first {
        prop_assert!(!names.is_empty(), "devices from {} but no names", source);
        // The MPS pipe folder is given only beside a GPU of its kind.
        for mps in names.iter().filter(|n| nvinject_cdi::nvinject::is_mps_device(n)) {
            let gpu =
                names.iter().any(|n| n.kind() == mps.kind() && !nvinject_cdi::nvinject::is_mps_device(n));
            prop_assert!(gpu, "{} given without a GPU: {:?}", mps, names);
        }
        let mut seen = std::collections::BTreeSet::new();
        for name in names {
            // In the CDI grammar: the text form parses back to the same name.
            let text = name.to_string();
            let again = text.parse::<QualifiedName>();
            prop_assert_eq!(again.as_ref(), Ok(name), "{}", text);
            prop_assert!(seen.insert(name.clone()), "duplicate {}", text);
            // Only the device plugin's annotations may name other kinds; an image's env or a
            // pod's mount names NVIDIA GPUs or nothing.
            if !matches!(source, Source::Annotations(_)) {
                prop_assert_eq!(name.kind(), &default_kind, "{} from {}", text, source);
            }
        }
        match source {
            Source::VolumeMounts => prop_assert!(accept_mounts, "volume mounts honoured while refused"),
            Source::Env => {
                prop_assert!(
                    accept_env || is_privileged(&value),
                    "env honoured from an unprivileged container"
                )
            }
            Source::Annotations(keys) => {
                for k in keys {
                    prop_assert!(k.starts_with("cdi.k8s.io/"), "annotation {:?} is not a request", k);
                }
            }
        }
    }
    Ok(())
}

fn is_privileged(oci: &Value) -> bool {
    nvinject_shim::request::is_privileged(oci)
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn arbitrary_oci_configs_resolve_safely(oci in oci(), accept_env in any::<bool>(), accept_mounts in any::<bool>()) {
        check(&oci, accept_env, accept_mounts)?;
    }

    /// Volume-mount requests alone: refused when the key is off, whatever else the config holds.
    #[test]
    fn volume_mounts_are_ignored_when_the_key_is_off(mounts in prop::collection::vec(mount(), 1..5), privileged in any::<bool>()) {
        let oci = Oci { annotations: vec![], env: vec![], mounts, privileged, odd_shapes: 0 };
        check(&oci, true, false)?;
        match resolve(&oci.to_json(false), &policy(true, false)) {
            Ok(Resolution::Nothing { .. }) => {}
            other => prop_assert!(false, "mounts only, key off: {:?}", other),
        }
    }

    /// Arbitrary JSON documents of any shape never panic.
    #[test]
    fn arbitrary_json_never_panics(value in arbitrary_json()) {
        for (env, mounts) in [(false, false), (true, true)] {
            let _ = resolve(&value, &policy(env, mounts));
        }
    }
}

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        list().prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        let key = prop_oneof![
            Just("annotations".to_owned()),
            Just("process".to_owned()),
            Just("env".to_owned()),
            Just("mounts".to_owned()),
            Just("capabilities".to_owned()),
            Just("bounding".to_owned()),
            Just("source".to_owned()),
            Just("destination".to_owned()),
            annotation_key(),
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::vec((key, inner), 0..4).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

#[test]
fn the_kind_check_can_fail() {
    // The kind property above must be able to fail: a mount naming another vendor's device is
    // the request it exists to catch.
    let oci = json!({"mounts": [{"destination": "/var/run/nvidia-container-devices/example.com/nic=eth0", "source": "/dev/null"}]});
    let r = resolve(&oci, &policy(false, true));
    assert!(matches!(&r, Err(e) if matches!(e.error, RequestProblem::ForeignKind { .. })), "{r:?}");
    // And the sandbox rule: a sandbox asks for nothing, whatever else it carries.
    let sandbox =
        json!({"annotations": {CONTAINER_TYPE_ANNOTATION: "sandbox", "cdi.k8s.io/a": "nvidia.com/gpu=0"}});
    assert_eq!(resolve(&sandbox, &policy(true, true)), Ok(Resolution::Sandbox));
}
