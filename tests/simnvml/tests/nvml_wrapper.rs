//! The simulated library through `nvml-wrapper` (what nvinject's own NVML layer uses) and through its
//! raw symbol table. Needs root: fixtures make real device nodes with `mknod`.

mod common;

use std::collections::BTreeMap;
use std::ffi::{CStr, c_char, c_uint};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{CAPS_MAJOR, Fixture, child_description, env_list, is_child, join, lib_path};
use nvinject_simnode::description::{GpuDescription, NodeDescription};
use nvinject_simnode::events::{XidEvent, inject};
use nvinject_simnode::mig;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;

const MIB: u64 = 1 << 20;

fn init() -> Nvml {
    let lib = lib_path();
    Nvml::builder().lib_path(lib.as_os_str()).init().expect("nvmlInit_v2 on the simulated library")
}

/// The NVML version string NVML itself reports: `<CUDA major>.<driver version>`.
fn nvml_version(node: &NodeDescription) -> String {
    format!("{}.{}", node.driver.cuda_version / 1000, node.driver.version)
}

/// Expected common-ancestor level, written from the rules in the simnvml README.
fn expected_level(a: &GpuDescription, b: &GpuDescription) -> TopologyLevel {
    if a.uuid == b.uuid {
        TopologyLevel::Internal
    } else if a.pcie_switch.is_some() && a.pcie_switch == b.pcie_switch {
        TopologyLevel::Single
    } else if a.numa_node == b.numa_node {
        TopologyLevel::Node
    } else {
        TopologyLevel::System
    }
}

/// Expected NVLink peers of GPU `i`: peer bus id -> link count.
fn expected_links(node: &NodeDescription, i: usize) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for link in &node.nvlinks {
        let peer = match link.gpus {
            [a, b] if a == i => b,
            [a, b] if b == i => a,
            _ => continue,
        };
        *out.entry(node.gpus[peer].pci_bus_id.clone()).or_default() += link.links;
    }
    out
}

fn raw_u32(f: impl FnOnce(*mut c_uint) -> sys::nvmlReturn_t) -> Result<u32, u32> {
    let mut v = 0;
    match f(&mut v) {
        0 => Ok(v),
        e => Err(e),
    }
}

/// Every field of every GPU of the child's description, read back through nvml-wrapper.
fn check_node_reads_back() {
    let node = child_description();
    let nvml = init();
    let lib = nvml.lib();
    assert_eq!(nvml.sys_driver_version().unwrap(), node.driver.version);
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), node.driver.cuda_version);
    assert_eq!(nvml.sys_nvml_version().unwrap(), nvml_version(&node));
    assert_eq!(nvml.device_count().unwrap() as usize, node.gpus.len());
    let devices: Vec<_> = (0..node.gpus.len() as u32).map(|i| nvml.device_by_index(i).unwrap()).collect();
    for (i, (gpu, dev)) in node.gpus.iter().zip(&devices).enumerate() {
        let at = format!("{} GPU {i}", node.name);
        assert_eq!(dev.index().unwrap() as usize, i, "{at}");
        assert_eq!(dev.name().unwrap(), gpu.name, "{at}");
        assert_eq!(dev.uuid().unwrap(), gpu.uuid, "{at}");
        assert_eq!(dev.serial().unwrap(), gpu.serial, "{at}");
        assert_eq!(dev.minor_number().unwrap(), gpu.minor, "{at}");
        let pci = dev.pci_info().unwrap();
        assert_eq!(pci.bus_id, gpu.pci_bus_id, "{at}");
        assert_eq!(pci.pci_device_id, gpu.pci_device_id, "{at}");
        assert_eq!(pci.pci_sub_system_id, Some(gpu.pci_subsystem_id), "{at}");
        let bus = u32::from_str_radix(&gpu.pci_bus_id[9..11], 16).unwrap();
        assert_eq!((pci.domain, pci.bus, pci.device), (0, bus, 0), "{at}");
        let mem = dev.memory_info().unwrap();
        assert_eq!((mem.total, mem.used, mem.free), (gpu.memory_mib * MIB, 0, gpu.memory_mib * MIB), "{at}");
        let cc = dev.cuda_compute_capability().unwrap();
        assert_eq!([cc.major, cc.minor], gpu.compute_capability, "{at}");
        // SAFETY: valid handle and out-pointer.
        let arch = raw_u32(|p| unsafe { lib.nvmlDeviceGetArchitecture(dev.handle(), p) });
        assert_eq!(arch, Ok(gpu.architecture.nvml_value()), "{at}");
        match gpu.numa_node {
            Some(n) => assert_eq!(dev.numa_node_id().unwrap(), n, "{at}"),
            None => assert!(matches!(dev.numa_node_id(), Err(NvmlError::NotSupported)), "{at}"),
        }
        assert_eq!(dev.attributes().unwrap().multiprocessor_count, gpu.multiprocessor_count, "{at}");
        assert_eq!(dev.attributes().unwrap().memory_size_mb, gpu.memory_mib, "{at}");
        let t = &gpu.telemetry;
        let temp = dev.temperature(nvml_wrapper::enum_wrappers::device::TemperatureSensor::Gpu).unwrap();
        assert_eq!(temp, t.temperature_c, "{at}");
        assert_eq!(dev.power_usage().unwrap(), t.power_mw, "{at}");
        let util = dev.utilization_rates().unwrap();
        assert_eq!((util.gpu, util.memory), (t.gpu_util_percent, t.memory_util_percent), "{at}");
        assert_eq!(nvml.device_by_uuid(gpu.uuid.as_str()).unwrap().index().unwrap() as usize, i, "{at}");
        assert_eq!(nvml.device_by_pci_bus_id(gpu.pci_bus_id.as_str()).unwrap().index().unwrap() as usize, i);
        let serial = std::ffi::CString::new(gpu.serial.as_str()).unwrap();
        let mut by_serial = std::ptr::null_mut();
        // SAFETY: NUL-terminated input and a local out-pointer.
        assert_eq!(unsafe { lib.nvmlDeviceGetHandleBySerial(serial.as_ptr(), &mut by_serial) }, 0, "{at}");
        // SAFETY: valid handle.
        assert_eq!(by_serial, unsafe { dev.handle() }, "{at}");

        // NVLink: which peers, how many links each.
        let expected = expected_links(&node, i);
        let mut seen: BTreeMap<String, u32> = BTreeMap::new();
        for link in 0..sys::NVML_NVLINK_MAX_LINKS {
            let wrapper = dev.link_wrapper_for(link);
            match wrapper.is_active() {
                Ok(true) => *seen.entry(wrapper.remote_pci_info().unwrap().bus_id).or_default() += 1,
                Ok(false) => assert!(wrapper.remote_pci_info().is_err(), "{at} link {link}"),
                Err(NvmlError::NotSupported) => {
                    assert!(expected.is_empty(), "{at}: links described but NVLink not supported");
                    break;
                }
                Err(e) => panic!("{at} link {link}: {e}"),
            }
        }
        assert_eq!(seen, expected, "{at}: NVLink map");
        if !expected.is_empty() {
            let past = dev.link_wrapper_for(sys::NVML_NVLINK_MAX_LINKS).is_active();
            assert!(matches!(past, Err(NvmlError::InvalidArg)), "{at}: {past:?}");
        }

        // PCIe topology against every GPU, itself included.
        for (j, other) in devices.iter().enumerate() {
            let level = nvml.topology_common_ancestor(dev, other).unwrap();
            assert_eq!(level, expected_level(gpu, &node.gpus[j]), "{at} vs GPU {j}");
        }

        check_mig(&nvml, &at, gpu, dev);
    }
}

/// The MIG tree of one GPU: mode, devices in description order, GPU/compute instance info and profiles.
fn check_mig(nvml: &Nvml, at: &str, gpu: &GpuDescription, dev: &nvml_wrapper::Device<'_>) {
    let lib = nvml.lib();
    // SAFETY: valid handles; the out-pointers are locals.
    let handle = unsafe { dev.handle() };
    let Some(desc) = &gpu.mig else {
        assert!(matches!(dev.mig_mode(), Err(NvmlError::NotSupported)), "{at}");
        return;
    };
    let mode = dev.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (desc.enabled as u32, desc.enabled as u32), "{at}");
    let model = mig::model_for(gpu).expect("MIG-capable presets have a table");
    if !desc.enabled {
        assert_eq!(dev.mig_device_count().unwrap(), 0, "{at}");
        return;
    }
    let max = dev.mig_device_count().unwrap();
    assert_eq!(max, model.max_mig_devices, "{at}");
    let cis: Vec<_> = desc
        .gpu_instances
        .iter()
        .flat_map(|gi| gi.compute_instances.iter().map(move |ci| (gi, ci)))
        .collect();
    for index in 0..max {
        let found = dev.mig_device_by_index(index);
        let Some((gi, ci)) = cis.get(index as usize) else {
            assert!(matches!(found, Err(NvmlError::NotFound)), "{at} MIG {index}: {:?}", found.err());
            continue;
        };
        let m = found.unwrap();
        let mat = format!("{at} MIG {index}");
        let profile = model.profile_by_name(&gi.profile).unwrap();
        assert_eq!(m.uuid().unwrap(), ci.uuid, "{mat}");
        assert_eq!(m.name().unwrap(), format!("{} MIG {}", gpu.name, ci.profile), "{mat}");
        assert_eq!(m.memory_info().unwrap().total, profile.memory_mib * MIB, "{mat}");
        let attrs = m.attributes().unwrap();
        assert_eq!(attrs.gpu_instance_slice_count, profile.slices, "{mat}");
        assert_eq!(attrs.memory_size_mb, profile.memory_mib, "{mat}");
        assert_eq!(m.mig_parent_device().unwrap().uuid().unwrap(), gpu.uuid, "{mat}");
        assert_eq!(nvml.device_by_uuid(ci.uuid.as_str()).unwrap().uuid().unwrap(), ci.uuid, "{mat}");
        // SAFETY: valid handles; the out-pointers are locals.
        unsafe {
            let mh = m.handle();
            assert_eq!(raw_u32(|p| lib.nvmlDeviceIsMigDeviceHandle(mh, p)), Ok(1), "{mat}");
            assert_eq!(raw_u32(|p| lib.nvmlDeviceGetGpuInstanceId(mh, p)), Ok(gi.id), "{mat}");
            assert_eq!(raw_u32(|p| lib.nvmlDeviceGetComputeInstanceId(mh, p)), Ok(ci.id), "{mat}");
            assert!(matches!(m.minor_number(), Err(NvmlError::NotSupported)), "{mat}");
        }
    }
    // SAFETY: valid handle; out-pointers are locals.
    unsafe {
        assert_eq!(raw_u32(|p| lib.nvmlDeviceIsMigDeviceHandle(handle, p)), Ok(0), "{at}");
        for gi in &desc.gpu_instances {
            let profile = model.profile_by_name(&gi.profile).unwrap();
            let mut gi_handle = std::ptr::null_mut();
            assert_eq!(
                lib.nvmlDeviceGetGpuInstanceById(handle, gi.id, &mut gi_handle),
                0,
                "{at} GI {}",
                gi.id
            );
            let mut info: sys::nvmlGpuInstanceInfo_t = std::mem::zeroed();
            assert_eq!(lib.nvmlGpuInstanceGetInfo(gi_handle, &mut info), 0);
            assert_eq!(info.id, gi.id);
            assert_eq!(info.profileId, profile.id, "{at} GI {}: {}", gi.id, gi.profile);
            assert_eq!(
                (info.placement.start, info.placement.size),
                (gi.placement_start, profile.memory_slices)
            );
            assert_eq!(info.device, handle);
            let mut p: sys::nvmlGpuInstanceProfileInfo_t = std::mem::zeroed();
            assert_eq!(lib.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile.index, &mut p), 0);
            assert_eq!(
                (p.id, p.sliceCount, p.memorySizeMB),
                (profile.id, profile.slices, profile.memory_mib)
            );
            let mut v2: sys::nvmlGpuInstanceProfileInfo_v2_t = std::mem::zeroed();
            v2.version = std::mem::size_of::<sys::nvmlGpuInstanceProfileInfo_v2_t>() as u32 | 2 << 24;
            assert_eq!(lib.nvmlDeviceGetGpuInstanceProfileInfoV(handle, profile.index, &mut v2), 0);
            let name = CStr::from_ptr(v2.name.as_ptr()).to_str().unwrap();
            assert_eq!(name, format!("MIG {}", gi.profile));
            for ci in &gi.compute_instances {
                let mut ci_handle = std::ptr::null_mut();
                assert_eq!(lib.nvmlGpuInstanceGetComputeInstanceById(gi_handle, ci.id, &mut ci_handle), 0);
                let mut cinfo: sys::nvmlComputeInstanceInfo_t = std::mem::zeroed();
                assert_eq!(lib.nvmlComputeInstanceGetInfo_v2(ci_handle, &mut cinfo), 0);
                assert_eq!((cinfo.id, cinfo.gpuInstance, cinfo.device), (ci.id, gi_handle, handle));
                let cp = model.compute_profiles(profile).into_iter().find(|c| c.name == ci.profile).unwrap();
                assert_eq!(cinfo.profileId, cp.index, "{at} CI {}/{}", gi.id, ci.id);
                let mut cpi: sys::nvmlComputeInstanceProfileInfo_t = std::mem::zeroed();
                assert_eq!(
                    lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi_handle, cp.index, 0, &mut cpi),
                    0
                );
                assert_eq!(
                    (cpi.id, cpi.sliceCount, cpi.sharedCopyEngineCount),
                    (cp.index, cp.slices, profile.copy_engines),
                    "{at} CI {}/{} profile info",
                    gi.id,
                    ci.id
                );
                let mut cv2: sys::nvmlComputeInstanceProfileInfo_v2_t = std::mem::zeroed();
                cv2.version =
                    std::mem::size_of::<sys::nvmlComputeInstanceProfileInfo_v2_t>() as u32 | 2 << 24;
                assert_eq!(
                    lib.nvmlGpuInstanceGetComputeInstanceProfileInfoV(gi_handle, cp.index, 0, &mut cv2),
                    0
                );
                let cname = CStr::from_ptr(cv2.name.as_ptr()).to_str().unwrap();
                assert_eq!((cv2.id, cname), (cp.index, format!("MIG {}", cp.name).as_str()));
            }
            let missing = (0..15).find(|id| desc.gpu_instances.iter().all(|g| g.id != *id)).unwrap();
            let mut none = std::ptr::null_mut();
            assert_eq!(
                lib.nvmlDeviceGetGpuInstanceById(handle, missing, &mut none),
                sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND
            );
        }
    }
}

#[test]
#[ignore = "needs root"]
fn every_preset_reads_back_through_nvml_wrapper() {
    nvinject_test_support::require_root("mknod for the simulated node");
    if is_child() {
        check_node_reads_back();
        return;
    }
    for name in nvinject_simnode::presets::NAMES {
        Fixture::preset(name).run_child("every_preset_reads_back_through_nvml_wrapper", &[]);
    }
}

const EXPECT_UUIDS: &str = "SIMNVML_EXPECT_UUIDS";

#[test]
#[ignore = "needs root"]
fn removing_a_device_node_hides_that_gpu() {
    nvinject_test_support::require_root("mknod for the simulated node");
    if is_child() {
        let expected = env_list(EXPECT_UUIDS);
        let nvml = init();
        assert_eq!(nvml.device_count().unwrap() as usize, expected.len());
        for (i, uuid) in expected.iter().enumerate() {
            let dev = nvml.device_by_index(i as u32).unwrap();
            assert_eq!(&dev.uuid().unwrap(), uuid, "index {i}");
            assert_eq!(dev.index().unwrap() as usize, i);
        }
        assert!(matches!(nvml.device_by_index(expected.len() as u32), Err(NvmlError::InvalidArg)));
        return;
    }
    let fx = Fixture::preset("h100x8");
    let uuids: Vec<String> = fx.node.gpus.iter().map(|g| g.uuid.clone()).collect();
    fx.run_child("removing_a_device_node_hides_that_gpu", &[(EXPECT_UUIDS, &join(&uuids))]);

    std::fs::remove_file(fx.dev_root.join("dev/nvidia3")).unwrap();
    let fewer: Vec<String> =
        uuids.iter().enumerate().filter(|(i, _)| *i != 3).map(|(_, u)| u.clone()).collect();
    fx.run_child("removing_a_device_node_hides_that_gpu", &[(EXPECT_UUIDS, &join(&fewer))]);

    // A container given only GPU 5: it is NVML index 0 there.
    for gpu in &fx.node.gpus {
        if gpu.minor != 5 {
            let _ = std::fs::remove_file(fx.dev_root.join(format!("dev/nvidia{}", gpu.minor)));
        }
    }
    fx.run_child("removing_a_device_node_hides_that_gpu", &[(EXPECT_UUIDS, &join(&[uuids[5].clone()]))]);
}

const EXPECT_MIG: &str = "SIMNVML_EXPECT_MIG";

#[test]
#[ignore = "needs root"]
fn mig_devices_follow_capability_nodes() {
    nvinject_test_support::require_root("mknod for the simulated node");
    if is_child() {
        let expected = env_list(EXPECT_MIG);
        let nvml = init();
        let gpu = nvml.device_by_index(0).unwrap();
        let mut found = Vec::new();
        for i in 0..gpu.mig_device_count().unwrap() {
            match gpu.mig_device_by_index(i) {
                Ok(m) => found.push(m.uuid().unwrap()),
                Err(NvmlError::NotFound) => {}
                Err(e) => panic!("MIG {i}: {e}"),
            }
        }
        assert_eq!(found, expected);
        return;
    }
    let fx = Fixture::preset("a100-mig");
    let gpu0 = &fx.node.gpus[0];
    let gis = &gpu0.mig.as_ref().unwrap().gpu_instances;
    let all: Vec<String> =
        gis.iter().flat_map(|gi| gi.compute_instances.iter().map(|ci| ci.uuid.clone())).collect();
    // No nvidia-caps directory: every described MIG device of a visible GPU.
    fx.run_child("mig_devices_follow_capability_nodes", &[(EXPECT_MIG, &join(&all))]);

    // With the directory, only devices whose GI and CI access nodes both open: the second described
    // instance gets both, the third only its GI node.
    let (second, third) = (&gis[1], &gis[2]);
    let cap = |minor: u32| format!("dev/nvidia-caps/nvidia-cap{minor}");
    fx.mknod(&cap(mig::gpu_instance_access_minor(gpu0.minor, second.id)), CAPS_MAJOR, 0);
    fx.mknod(&cap(mig::compute_instance_access_minor(gpu0.minor, second.id, 0)), CAPS_MAJOR, 1);
    fx.mknod(&cap(mig::gpu_instance_access_minor(gpu0.minor, third.id)), CAPS_MAJOR, 2);
    let only = vec![second.compute_instances[0].uuid.clone()];
    fx.run_child("mig_devices_follow_capability_nodes", &[(EXPECT_MIG, &join(&only))]);
}

#[test]
#[ignore = "needs root"]
fn xid_round_trip_and_timeout() {
    nvinject_test_support::require_root("mknod for the simulated node");
    if !is_child() {
        let out = Fixture::preset("h100x8").run_child("xid_round_trip_and_timeout", &[]);
        // The measured figures (no assertion on time: see the project's rules on speed).
        for line in String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("latency") || l.contains("path"))
        {
            println!("{line}");
        }
        return;
    }
    let node = child_description();
    let events = node.events_file.clone().unwrap();
    let nvml = init();
    let watched = nvml.device_by_index(1).unwrap();
    // Injected before the set exists: never reported.
    let early = XidEvent {
        uuid: node.gpus[1].uuid.clone(),
        xid: 31,
        gpu_instance_id: None,
        compute_instance_id: None,
    };
    inject(&events, &early).unwrap();
    let set = nvml.create_event_set().unwrap();
    let set = watched.register_events(EventTypes::CRITICAL_XID_ERROR, set).unwrap();

    // An XID for an unregistered GPU is not reported; the wait times out.
    let other = XidEvent {
        uuid: node.gpus[2].uuid.clone(),
        xid: 79,
        gpu_instance_id: None,
        compute_instance_id: None,
    };
    inject(&events, &other).unwrap();
    let started = Instant::now();
    assert!(matches!(set.wait(300), Err(NvmlError::Timeout)));
    println!("timeout path: a 300 ms wait returned after {:?}", started.elapsed());

    // A waiting call returns an XID injected from another thread.
    let path = events.clone();
    let uuid = node.gpus[1].uuid.clone();
    let injector = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        let at = Instant::now();
        inject(&path, &XidEvent { uuid, xid: 79, gpu_instance_id: None, compute_instance_id: None }).unwrap();
        at
    });
    let data = set.wait(10_000).expect("the injected XID");
    let returned = Instant::now();
    let injected_at = injector.join().unwrap();
    println!("xid latency: injected -> returned in {:?}", returned.duration_since(injected_at));
    assert_eq!(data.device.uuid().unwrap(), node.gpus[1].uuid);
    assert!(data.event_type.contains(EventTypes::CRITICAL_XID_ERROR));
    assert!(matches!(data.event_data, Some(XidError::Value(79))), "{:?}", data.event_data);

    // Instance ids travel with the line; NVML's 0xFFFFFFFF stands for "none".
    let mig_line = XidEvent {
        uuid: node.gpus[1].uuid.clone(),
        xid: 13,
        gpu_instance_id: Some(3),
        compute_instance_id: Some(0),
    };
    inject(&events, &mig_line).unwrap();
    inject(&events, &early).unwrap();
    let lib = nvml.lib();
    // SAFETY: the set handle is live; the out-structs are locals.
    unsafe {
        let mut raw: sys::nvmlEventData_t = std::mem::zeroed();
        assert_eq!(lib.nvmlEventSetWait_v2(set.handle(), &mut raw, 10_000), 0);
        assert_eq!((raw.eventData, raw.gpuInstanceId, raw.computeInstanceId), (13, 3, 0));
        assert_eq!(raw.device, watched.handle());
        assert_eq!(lib.nvmlEventSetWait_v2(set.handle(), &mut raw, 10_000), 0);
        assert_eq!((raw.eventData, raw.gpuInstanceId, raw.computeInstanceId), (31, 0xFFFF_FFFF, 0xFFFF_FFFF));
        assert_eq!(raw.eventType, sys::nvmlEventTypeXidCriticalError as u64);
    }
    assert!(matches!(set.wait(0), Err(NvmlError::Timeout)));
}

#[test]
#[ignore = "needs root"]
fn driver_not_loaded() {
    nvinject_test_support::require_root("mknod for the simulated node");
    if is_child() {
        let lib = lib_path();
        // Held open so the library's state outlives nvml-wrapper's own handle, closed on failure.
        let _held = hold(&lib);
        let err = Nvml::builder().lib_path(lib.as_os_str()).init().err();
        assert!(matches!(err, Some(NvmlError::DriverNotLoaded)), "{err:?}");
        let message = last_error(&lib);
        assert!(message.contains("field `driver.loaded` is false"), "{message}");
        return;
    }
    let mut node = nvinject_simnode::presets::preset("single").unwrap();
    node.driver.loaded = false;
    Fixture::new(node).run_child("driver_not_loaded", &[]);
}

/// Keeps the library loaded.
fn hold(lib: &Path) -> libloading::Library {
    // SAFETY: loading the simulated library runs no initialisers with preconditions.
    unsafe { libloading::Library::new(lib) }.unwrap()
}

/// `nvinjectSimGetLastError` through dlopen.
fn last_error(lib: &Path) -> String {
    // SAFETY: loading the simulated library runs no initialisers with preconditions.
    let lib = unsafe { libloading::Library::new(lib) }.unwrap();
    // SAFETY: the symbol has this C signature.
    unsafe {
        let f: libloading::Symbol<unsafe extern "C" fn(*mut c_char, c_uint) -> c_uint> =
            lib.get(b"nvinjectSimGetLastError").unwrap();
        let mut buf = vec![0 as c_char; 4096];
        assert_eq!(f(buf.as_mut_ptr(), buf.len() as c_uint), 0);
        CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
    }
}

#[test]
#[ignore = "needs root"]
fn malformed_description_names_file_and_field() {
    nvinject_test_support::require_root("mknod for the simulated node");
    if is_child() {
        let lib = lib_path();
        let _held = hold(&lib);
        let err = Nvml::builder().lib_path(lib.as_os_str()).init().err();
        assert!(matches!(err, Some(NvmlError::Unknown)), "{err:?}");
        println!("last error: {}", last_error(&lib));
        return;
    }
    let fx = Fixture::preset("h100x8");
    let mut json: serde_json::Value = serde_json::from_str(&fx.node.to_json()).unwrap();
    json["gpus"][1]["minor"] = serde_json::json!("one");
    std::fs::write(&fx.node_path, json.to_string()).unwrap();
    let out = fx.run_child("malformed_description_names_file_and_field", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let expected =
        format!("libnvidia-ml.so.1 (nvinject simulated): {}: field `gpus[1].minor`", fx.node_path.display());
    assert_eq!(stderr.matches(&expected).count(), 1, "stderr:\n{stderr}");
    let via_export = format!("last error: {}: field `gpus[1].minor`", fx.node_path.display());
    assert!(stdout.contains(&via_export), "stdout:\n{stdout}");

    // An invalid profile (parses, fails validation) is reported the same way.
    let mut node = nvinject_simnode::presets::preset("a100-mig").unwrap();
    node.gpus[0].mig.as_mut().unwrap().gpu_instances[0].profile = "5g.50gb".into();
    let bad = Fixture::new(node.clone());
    let out = bad.run_child("malformed_description_names_file_and_field", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("field `gpus[0].mig.gpu_instances[0].profile`: `5g.50gb` is not a profile"),
        "{stderr}"
    );
}

/// Names of the stubs, read from the crate's stub list.
fn stub_names() -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/stubs.rs")).unwrap();
    let start = text.find("not_supported! {\n").expect("stub invocation");
    text[start..]
        .lines()
        .skip(1)
        .take_while(|l| *l != "}")
        .map(|l| l.trim().trim_end_matches(',').to_owned())
        .collect()
}

#[test]
#[ignore = "needs root"]
fn every_nvml_function_is_exported_and_stubs_answer_not_supported() {
    nvinject_test_support::require_root("mknod for the simulated node");
    if !is_child() {
        Fixture::preset("single")
            .run_child("every_nvml_function_is_exported_and_stubs_answer_not_supported", &[]);
        return;
    }
    let path = lib_path();
    // SAFETY: loading the simulated library runs no initialisers with preconditions.
    let lib = unsafe { libloading::Library::new(&path) }.unwrap();
    let all = include_str!("../nvml-functions.txt");
    let missing: Vec<&str> = all
        .lines()
        // SAFETY: only looks the symbol up.
        .filter(|name| unsafe { lib.get::<*const ()>(name.as_bytes()) }.is_err())
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
    let stubs = stub_names();
    assert!(stubs.len() > 300, "{}", stubs.len());
    type Stub = unsafe extern "C" fn() -> c_uint;
    let call = |name: &str| {
        // SAFETY: stubs take no arguments they read and return nvmlReturn_t.
        unsafe { lib.get::<Stub>(name.as_bytes()).unwrap()() }
    };
    for name in &stubs {
        assert_eq!(call(name), sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED, "{name} before init");
    }
    // SAFETY: simulated entry points with their NVML signatures.
    unsafe {
        let init: libloading::Symbol<unsafe extern "C" fn() -> c_uint> = lib.get(b"nvmlInit_v2").unwrap();
        let count: libloading::Symbol<unsafe extern "C" fn(*mut c_uint) -> c_uint> =
            lib.get(b"nvmlDeviceGetCount_v2").unwrap();
        let mut n = 0;
        assert_eq!(count(&mut n), sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED);
        assert_eq!(init(), 0);
        assert_eq!(count(&mut n), 0);
        assert_eq!(n, 1);
    }
    for name in &stubs {
        assert_eq!(call(name), sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED, "{name} after init");
    }
}

#[test]
#[ignore = "needs root"]
fn init_is_reference_counted_and_versions_are_checked() {
    nvinject_test_support::require_root("mknod for the simulated node");
    if !is_child() {
        Fixture::preset("single").run_child("init_is_reference_counted_and_versions_are_checked", &[]);
        return;
    }
    let path = lib_path();
    // SAFETY: loading the library and calling its NVML entry points with valid arguments.
    unsafe {
        let lib = sys::NvmlLib::new(&path).unwrap();
        assert_eq!(lib.nvmlShutdown(), sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED);
        assert_eq!(lib.nvmlInit_v2(), 0);
        assert_eq!(lib.nvmlInitWithFlags(0), 0);
        assert_eq!(lib.nvmlShutdown(), 0);
        let mut dev = std::ptr::null_mut();
        assert_eq!(
            lib.nvmlDeviceGetHandleByIndex_v2(0, &mut dev),
            0,
            "one shutdown of two inits keeps NVML up"
        );

        let mut mem: sys::nvmlMemory_v2_t = std::mem::zeroed();
        mem.version = 1;
        assert_eq!(
            lib.nvmlDeviceGetMemoryInfo_v2(dev, &mut mem),
            sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );
        mem.version = std::mem::size_of::<sys::nvmlMemory_v2_t>() as u32 | 2 << 24;
        assert_eq!(lib.nvmlDeviceGetMemoryInfo_v2(dev, &mut mem), 0);
        assert_eq!(mem.total, 23034 * MIB);

        let mut name = [0 as c_char; 4];
        assert_eq!(
            lib.nvmlDeviceGetName(dev, name.as_mut_ptr(), 4),
            sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE
        );
        let forged = 0x1234usize as sys::nvmlDevice_t;
        let mut n = 0;
        assert_eq!(
            lib.nvmlDeviceGetMinorNumber(forged, &mut n),
            sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            lib.nvmlDeviceGetMinorNumber(dev, std::ptr::null_mut()),
            sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );
        let s = CStr::from_ptr(lib.nvmlErrorString(sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED));
        assert_eq!(s.to_str().unwrap(), "Driver Not Loaded");

        assert_eq!(lib.nvmlShutdown(), 0);
        assert_eq!(
            lib.nvmlDeviceGetHandleByIndex_v2(0, &mut dev),
            sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
        );
        assert_eq!(lib.nvmlShutdown(), sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED);
    }
}

#[test]
#[ignore = "needs root"]
fn queries_proceed_while_another_thread_waits_for_events() {
    nvinject_test_support::require_root("mknod for the simulated node");
    if !is_child() {
        Fixture::preset("h100x8").run_child("queries_proceed_while_another_thread_waits_for_events", &[]);
        return;
    }
    let node = child_description();
    let nvml = init();
    let lib = nvml.lib();
    let gpu = nvml.device_by_index(0).unwrap();
    let set = gpu.register_events(EventTypes::CRITICAL_XID_ERROR, nvml.create_event_set().unwrap()).unwrap();
    // SAFETY: the handle stays valid while `set` lives, past the scope below.
    let set_handle = unsafe { set.handle() } as usize;
    std::thread::scope(|s| {
        let waiter = s.spawn(move || {
            // SAFETY: a live set handle and a local out-struct.
            unsafe {
                let mut raw: sys::nvmlEventData_t = std::mem::zeroed();
                let ret = lib.nvmlEventSetWait_v2(set_handle as sys::nvmlEventSet_t, &mut raw, 10_000);
                (ret, raw.eventData)
            }
        });
        std::thread::sleep(Duration::from_millis(100));
        // Were the wait holding the library's lock, these would block until it timed out, and the XID
        // below would come too late for it.
        for i in 0..node.gpus.len() as u32 {
            assert_eq!(nvml.device_by_index(i).unwrap().uuid().unwrap(), node.gpus[i as usize].uuid);
        }
        let events = node.events_file.as_deref().unwrap();
        let xid = XidEvent {
            uuid: node.gpus[0].uuid.clone(),
            xid: 94,
            gpu_instance_id: None,
            compute_instance_id: None,
        };
        inject(events, &xid).unwrap();
        assert_eq!(waiter.join().unwrap(), (0, 94));
    });
}

#[test]
#[ignore = "needs root"]
fn a_description_embedded_in_the_library_file_is_used() {
    nvinject_test_support::require_root("mknod for the simulated node");
    if is_child() {
        assert!(std::env::var_os(nvinject_simnode::description::NODE_ENV).is_none());
        let nvml = init();
        assert_eq!(nvml.device_count().unwrap(), 1);
        assert_eq!(nvml.device_by_index(0).unwrap().name().unwrap(), "NVIDIA L4 (embedded)");
        return;
    }
    let fx = Fixture::preset("single");
    let mut node = fx.node.clone();
    node.gpus[0].name = "NVIDIA L4 (embedded)".into();
    let original = std::fs::read(lib_path()).unwrap();
    let copy = fx.dir.path().join("libnvidia-ml.so.550.54.15");
    std::fs::write(&copy, nvinject_simnode::embed::append(&original, node.to_json().as_bytes())).unwrap();
    // No NVINJECT_SIM_NODE: the copy must find its own description.
    common::run_child(
        "a_description_embedded_in_the_library_file_is_used",
        &[(common::LIB_ENV, copy.as_os_str())],
    );
}
