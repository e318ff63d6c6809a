//! Allocate: what the runtime must do to give a container the devices the kubelet picked.
//!
//! Pure: [`allocate`] turns one container request into a [`ContainerAllocation`] for the chosen
//! device-list strategies. Replica ids map to their device; a device asked for twice through two
//! replicas is given once. The replicas of an MPS-shared resource come with the spec's MPS device
//! (`<kind>=mps`: the MPS daemon's pipe folder and `CUDA_MPS_PIPE_DIRECTORY`), named by the same
//! function cdi-gen writes it with; no other allocation ever names it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use nvinject_cdi::nvinject::{MPS_DEVICE, mps_device};

use crate::error::RequestError;
use crate::resources::{Resource, SharingStrategy, Target};
use crate::settings::{DeviceIdStrategy, DeviceListStrategy, Settings};

/// The environment variable NVIDIA's runtimes read.
pub const VISIBLE_DEVICES_ENV: &str = "NVIDIA_VISIBLE_DEVICES";
/// Root of the `volume-mounts` markers inside the container.
pub const VOLUME_MOUNTS_ROOT: &str = "/var/run/nvidia-container-devices";
/// Host side of every `volume-mounts` marker.
pub const VOLUME_MOUNTS_HOST_PATH: &str = "/dev/null";
/// Plugin name in the CDI annotation key.
pub const ANNOTATION_PLUGIN_NAME: &str = "nvinject-device-plugin";

/// A bind mount for the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    /// Path inside the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// Mounted read-only.
    pub read_only: bool,
}

/// A device node for the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNodeSpec {
    /// Path inside the container.
    pub container_path: String,
    /// Path on the host (under the dev root).
    pub host_path: String,
    /// Cgroup access, `rw`.
    pub permissions: String,
}

/// One container's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerAllocation {
    /// Environment variables.
    pub envs: BTreeMap<String, String>,
    /// Mounts.
    pub mounts: Vec<MountSpec>,
    /// Device nodes (only with pass-device-specs).
    pub device_specs: Vec<DeviceNodeSpec>,
    /// Container annotations.
    pub annotations: BTreeMap<String, String>,
    /// Fully qualified CDI device names for the CRI `CDIDevices` field.
    pub cdi_devices: Vec<String>,
}

/// Checks a container request and returns the distinct targets it asks for, in request order.
fn resolve_request<'r>(
    resource: &'r Resource,
    container: usize,
    ids: &[String],
) -> Result<Vec<&'r Target>, RequestError> {
    let name = || resource.name.to_string();
    if ids.is_empty() {
        return Err(RequestError::NoDevices { resource: name(), container });
    }
    let mut devices = Vec::with_capacity(ids.len());
    let mut unknown: Vec<String> = Vec::new();
    for id in ids {
        match resource.device(id) {
            Some(d) => devices.push(d),
            None => unknown.push(id.clone()),
        }
    }
    if !unknown.is_empty() {
        return Err(RequestError::UnknownDevices { resource: name(), ids: unknown });
    }
    let mut seen = BTreeSet::new();
    let dups: BTreeSet<String> = ids.iter().filter(|id| !seen.insert(id.as_str())).cloned().collect();
    if !dups.is_empty() {
        return Err(RequestError::DuplicateDevices { resource: name(), ids: dups.into_iter().collect() });
    }
    if let Some(s) = &resource.sharing
        && s.fail_requests_greater_than_one
        && ids.len() > 1
    {
        return Err(RequestError::TooManyReplicas {
            resource: name(),
            sharing: s.strategy.config_key(),
            requested: ids.len(),
        });
    }
    let mut out: Vec<&Target> = Vec::with_capacity(devices.len());
    for d in devices {
        let t = resource.target_of(d);
        if !out.iter().any(|o| o.uuid == t.uuid) {
            out.push(t);
        }
    }
    Ok(out)
}

/// The annotation key for a container's CDI devices: `<prefix>nvinject-device-plugin_<id>`, where
/// `<id>` is a hash of the request so the same request always gets the same key.
pub fn annotation_key(prefix: &str, ids: &[String]) -> String {
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for id in ids {
        for b in id.bytes().chain(std::iter::once(b',')) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{prefix}{ANNOTATION_PLUGIN_NAME}_{h:016x}")
}

/// Builds one container's answer. `control_nodes` are the control device nodes present on the host.
pub fn allocate(
    resource: &Resource,
    settings: &Settings,
    control_nodes: &[String],
    container: usize,
    ids: &[String],
) -> Result<ContainerAllocation, RequestError> {
    let targets = resolve_request(resource, container, ids)?;
    let mut runtime_ids: Vec<&str> = targets
        .iter()
        .map(|t| match settings.device_id_strategy {
            DeviceIdStrategy::Uuid => t.uuid.as_str(),
            DeviceIdStrategy::Index => t.index_name.as_str(),
        })
        .collect();
    // Sent as text: the kubelet and annotations carry CDI names as strings.
    let mut cdi_names: Vec<String> = targets.iter().map(|t| t.cdi_name.to_string()).collect();
    if resource.sharing.as_ref().is_some_and(|s| s.strategy == SharingStrategy::Mps) {
        // After the GPUs: the MPS folder goes only with them (the shim refuses it alone). Bare
        // `mps` for envvar and volume-mounts, which the runtime qualifies with the default kind.
        runtime_ids.push(MPS_DEVICE);
        cdi_names.push(mps_device(&settings.cdi_kind).to_string());
    }

    let mut out = ContainerAllocation::default();
    let strategies = &settings.device_list_strategies;
    for s in strategies {
        match s {
            DeviceListStrategy::Envvar => {
                out.envs.insert(VISIBLE_DEVICES_ENV.into(), runtime_ids.join(","));
            }
            DeviceListStrategy::VolumeMounts => {
                out.envs.insert(VISIBLE_DEVICES_ENV.into(), VOLUME_MOUNTS_ROOT.into());
                out.mounts.extend(runtime_ids.iter().map(|id| MountSpec {
                    container_path: format!("{VOLUME_MOUNTS_ROOT}/{id}"),
                    host_path: VOLUME_MOUNTS_HOST_PATH.into(),
                    read_only: false,
                }));
            }
            DeviceListStrategy::CdiAnnotations => {
                out.annotations
                    .insert(annotation_key(&settings.cdi_annotation_prefix, ids), cdi_names.join(","));
            }
            DeviceListStrategy::CdiCri => out.cdi_devices.extend(cdi_names.iter().cloned()),
        }
    }
    if !strategies.iter().any(|s| matches!(s, DeviceListStrategy::Envvar | DeviceListStrategy::VolumeMounts))
    {
        // CDI does the injecting; `void` stops a legacy-mode runtime (or an image's
        // NVIDIA_VISIBLE_DEVICES=all) from handing the container every GPU as well.
        out.envs.insert(VISIBLE_DEVICES_ENV.into(), "void".into());
    }
    if settings.pass_device_specs {
        let mut paths: Vec<&str> = control_nodes.iter().map(String::as_str).collect();
        for t in &targets {
            for n in &t.device_nodes {
                if !paths.contains(&n.as_str()) {
                    paths.push(n);
                }
            }
        }
        out.device_specs = paths
            .into_iter()
            .map(|p| DeviceNodeSpec {
                container_path: p.to_owned(),
                host_path: host_path(&settings.dev_root, p),
                permissions: "rw".into(),
            })
            .collect();
    }
    Ok(out)
}

fn host_path(dev_root: &Path, container_path: &str) -> String {
    dev_root.join(container_path.trim_start_matches('/')).display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::tests::{gpu, gpu_time_slicing, inventory, mig_node, settings};
    use crate::resources::{HostFacts, plan};
    use crate::settings::ReplicaPolicy;

    const G0: &str = "GPU-00000000-0000-0000-0000-000000000000";
    const G1: &str = "GPU-10000000-0000-0000-0000-000000000000";

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn two_gpus(s: &Settings) -> Resource {
        let inv = inventory(vec![gpu(0, 0, &[]), gpu(1, 0, &[])], &[]);
        let facts = HostFacts { mig_minors: None, control_nodes: vec!["/dev/nvidiactl".into()] };
        plan(&inv, s, &facts).unwrap().resources.remove(0)
    }

    #[test]
    fn cdi_annotations_by_default() {
        let s = settings();
        let r = two_gpus(&s);
        let a = allocate(&r, &s, &[], 0, &ids(&[G1, G0])).unwrap();
        let key = annotation_key("cdi.k8s.io/", &ids(&[G1, G0]));
        assert!(key.starts_with("cdi.k8s.io/nvinject-device-plugin_") && key.len() <= 11 + 63, "{key}");
        assert_eq!(a.annotations.get(&key).unwrap(), &format!("nvidia.com/gpu={G1},nvidia.com/gpu={G0}"));
        assert_eq!(a.envs.get(VISIBLE_DEVICES_ENV).unwrap(), "void");
        assert!(a.mounts.is_empty() && a.device_specs.is_empty() && a.cdi_devices.is_empty());
        assert_ne!(key, annotation_key("cdi.k8s.io/", &ids(&[G0])), "different requests, different keys");
    }

    #[test]
    fn envvar_volume_mounts_and_cdi_cri() {
        let mut s = settings();
        s.device_list_strategies = vec![DeviceListStrategy::Envvar];
        let r = two_gpus(&s);
        let a = allocate(&r, &s, &[], 0, &ids(&[G0, G1])).unwrap();
        assert_eq!(a.envs.get(VISIBLE_DEVICES_ENV).unwrap(), &format!("{G0},{G1}"));
        assert!(a.annotations.is_empty());

        s.device_id_strategy = DeviceIdStrategy::Index;
        let a = allocate(&r, &s, &[], 0, &ids(&[G1])).unwrap();
        assert_eq!(a.envs.get(VISIBLE_DEVICES_ENV).unwrap(), "1");

        s.device_id_strategy = DeviceIdStrategy::Uuid;
        s.device_list_strategies = vec![DeviceListStrategy::VolumeMounts];
        let a = allocate(&r, &s, &[], 0, &ids(&[G1])).unwrap();
        assert_eq!(a.envs.get(VISIBLE_DEVICES_ENV).unwrap(), VOLUME_MOUNTS_ROOT);
        assert_eq!(
            a.mounts,
            vec![MountSpec {
                container_path: format!("/var/run/nvidia-container-devices/{G1}"),
                host_path: "/dev/null".into(),
                read_only: false
            }]
        );

        s.device_list_strategies = vec![DeviceListStrategy::CdiCri];
        let a = allocate(&r, &s, &[], 0, &ids(&[G1])).unwrap();
        assert_eq!(a.cdi_devices, vec![format!("nvidia.com/gpu={G1}")]);
        assert_eq!(a.envs.get(VISIBLE_DEVICES_ENV).unwrap(), "void");
    }

    #[test]
    fn device_specs_under_the_dev_root() {
        let mut s = settings();
        s.pass_device_specs = true;
        s.dev_root = "/run/nvidia/driver".into();
        let r = two_gpus(&s);
        let a = allocate(&r, &s, &["/dev/nvidiactl".to_string()], 0, &ids(&[G1])).unwrap();
        let got: Vec<(&str, &str)> =
            a.device_specs.iter().map(|d| (d.container_path.as_str(), d.host_path.as_str())).collect();
        assert_eq!(
            got,
            vec![
                ("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl"),
                ("/dev/nvidia1", "/run/nvidia/driver/dev/nvidia1")
            ]
        );
        assert!(a.device_specs.iter().all(|d| d.permissions == "rw"));
    }

    #[test]
    fn bad_requests_name_the_ids() {
        let s = settings();
        let r = two_gpus(&s);
        let e = allocate(&r, &s, &[], 0, &ids(&[G0, "GPU-nope", "3"])).unwrap_err();
        assert_eq!(
            e,
            RequestError::UnknownDevices { resource: "nvidia.com/gpu".into(), ids: ids(&["GPU-nope", "3"]) }
        );
        let status = tonic::Status::from(e);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("GPU-nope"));
        assert!(matches!(allocate(&r, &s, &[], 2, &[]), Err(RequestError::NoDevices { container: 2, .. })));
        assert!(matches!(
            allocate(&r, &s, &[], 0, &ids(&[G0, G0])),
            Err(RequestError::DuplicateDevices { .. })
        ));
    }

    #[test]
    fn replicas_map_to_their_gpu() {
        let mut s = settings();
        s.time_slicing = gpu_time_slicing("gpu.shared", 4, ReplicaPolicy::Distributed);
        let r = two_gpus(&s);
        let req = ids(&[&format!("{G1}::3"), &format!("{G1}::0"), &format!("{G0}::1")]);
        let a = allocate(&r, &s, &[], 0, &req).unwrap();
        assert_eq!(
            a.annotations.values().next().unwrap(),
            &format!("nvidia.com/gpu={G1},nvidia.com/gpu={G0}")
        );
        assert!(matches!(allocate(&r, &s, &[], 0, &ids(&[G1])), Err(RequestError::UnknownDevices { .. })));

        if let Some(ts) = s.time_slicing.as_mut() {
            ts.fail_requests_greater_than_one = true;
        }
        let r = two_gpus(&s);
        let e = allocate(&r, &s, &[], 0, &req).unwrap_err();
        assert_eq!(
            e,
            RequestError::TooManyReplicas {
                resource: "nvidia.com/gpu.shared".into(),
                sharing: "sharing.timeSlicing",
                requested: 3
            }
        );
        assert!(allocate(&r, &s, &[], 0, &ids(&[&format!("{G0}::2")])).is_ok());
    }

    #[test]
    fn mps_replicas_come_with_the_mps_device_and_nothing_else_does() {
        let g0 = format!("{G0}::1");
        let g1 = format!("{G1}::0");
        let mps_name = "nvidia.com/gpu=mps";
        // Exclusive and time-sliced GPUs never name it, whatever the strategy.
        let mut s = settings();
        s.device_list_strategies = vec![
            DeviceListStrategy::CdiAnnotations,
            DeviceListStrategy::CdiCri,
            DeviceListStrategy::Envvar,
            DeviceListStrategy::VolumeMounts,
        ];
        let never = |a: &ContainerAllocation| {
            assert!(!a.annotations.values().any(|v| v.contains("=mps")), "{a:?}");
            assert!(!a.cdi_devices.iter().any(|d| d.ends_with("=mps")), "{a:?}");
            assert!(!a.envs.values().any(|v| v.split(',').any(|id| id == "mps")), "{a:?}");
            assert!(!a.mounts.iter().any(|m| m.container_path.ends_with("/mps")), "{a:?}");
        };
        never(&allocate(&two_gpus(&s), &s, &[], 0, &ids(&[G0, G1])).unwrap());
        s.time_slicing = gpu_time_slicing("gpu.shared", 2, ReplicaPolicy::Distributed);
        never(&allocate(&two_gpus(&s), &s, &[], 0, &ids(&[&g0, &g1])).unwrap());

        // MPS: the GPUs, then the MPS device, in the CDI annotation and the CRI field.
        s.mps = s.time_slicing.take();
        s.device_list_strategies = vec![DeviceListStrategy::CdiAnnotations, DeviceListStrategy::CdiCri];
        let r = two_gpus(&s);
        let a = allocate(&r, &s, &[], 0, &ids(&[&g1, &g0])).unwrap();
        let want = [format!("nvidia.com/gpu={G1}"), format!("nvidia.com/gpu={G0}"), mps_name.to_owned()];
        assert_eq!(a.annotations.values().next().unwrap(), &want.join(","));
        assert_eq!(a.cdi_devices, want);
        assert_eq!(a.envs.get(VISIBLE_DEVICES_ENV).unwrap(), "void");
        // With a custom kind, the MPS device of that kind.
        s.cdi_kind = "example.com/accel".parse().unwrap();
        let r = two_gpus(&s);
        let a = allocate(&r, &s, &[], 0, &ids(&[&g0])).unwrap();
        assert_eq!(
            a.annotations.values().next().unwrap(),
            &format!("example.com/accel={G0},example.com/accel=mps")
        );
        s.cdi_kind = nvinject_cdi::nvinject::default_kind();

        // Envvar and volume-mounts: the bare name, which the runtime gives the default kind.
        s.device_list_strategies = vec![DeviceListStrategy::Envvar];
        let r = two_gpus(&s);
        let a = allocate(&r, &s, &[], 0, &ids(&[&g0])).unwrap();
        assert_eq!(a.envs.get(VISIBLE_DEVICES_ENV).unwrap(), &format!("{G0},mps"));
        s.device_list_strategies = vec![DeviceListStrategy::VolumeMounts];
        let a = allocate(&r, &s, &[], 0, &ids(&[&g0])).unwrap();
        let marks: Vec<&str> = a.mounts.iter().map(|m| m.container_path.as_str()).collect();
        assert_eq!(marks, [format!("{VOLUME_MOUNTS_ROOT}/{G0}"), format!("{VOLUME_MOUNTS_ROOT}/mps")]);

        // NVIDIA's MPS default: one replica per container; two are refused unless allowed.
        let mps = &mut s.mps.as_mut().unwrap();
        mps.fail_requests_greater_than_one = true;
        let r = two_gpus(&s);
        let e = allocate(&r, &s, &[], 0, &ids(&[&g0, &g1])).unwrap_err();
        assert_eq!(
            e,
            RequestError::TooManyReplicas {
                resource: "nvidia.com/gpu.shared".into(),
                sharing: "sharing.mps",
                requested: 2
            }
        );
        assert!(e.to_string().contains("sharing.mps.failRequestsGreaterThanOne"), "{e}");
    }

    #[test]
    fn mig_devices_get_mig_cdi_names() {
        let mut s = settings();
        s.mig_strategy = crate::settings::MigStrategy::Mixed;
        s.device_list_strategies = vec![DeviceListStrategy::Envvar, DeviceListStrategy::CdiCri];
        s.device_id_strategy = DeviceIdStrategy::Index;
        let p = plan(&mig_node(), &s, &HostFacts::default()).unwrap();
        let r = p.resources.iter().find(|r| r.name.as_str() == "nvidia.com/mig-1g.10gb").unwrap();
        let id = r.devices[3].id.clone();
        let a = allocate(r, &s, &[], 0, std::slice::from_ref(&id)).unwrap();
        assert_eq!(a.envs.get(VISIBLE_DEVICES_ENV).unwrap(), "1:1");
        assert_eq!(a.cdi_devices, vec![format!("nvidia.com/gpu={id}")]);
    }
}
