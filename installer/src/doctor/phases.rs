//! The phases as pure functions of what was observed ([`super::facts`]): each gives the report
//! line, OK or FAIL with the fix. No I/O here; the probes gathered everything.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::args::DoctorArgs;
use super::facts::{ContainerdFacts, DriverFacts, PluginFacts, ProbeError, SpecFacts};
use super::report::{Line, Phase, Status};
use crate::containerd;
use crate::containerd::effective::EffectiveRuntime;
use crate::containerd::plan::{CDI_ANNOTATIONS, SHIM_RUNTIME_TYPE};
use crate::cri::TestContainer;
use crate::foreign_specs;
use crate::paths::host_join;
use crate::settings::{SHIM_BINARY, Settings};

/// Driver and NVML: the module is loaded and NVML answers with its version.
pub fn driver(facts: &DriverFacts) -> Line {
    let phase = Phase::Driver;
    let (module, nvml) = match facts {
        DriverFacts::NoModule { version_file } => {
            return Line::fail(
                phase,
                format!("{version_file} is missing: the nvidia kernel module is not loaded"),
                "load the driver (modprobe nvidia, or wait for the driver container); check --sys-root",
            );
        }
        DriverFacts::Loaded { module, nvml } => (module, nvml),
    };
    match nvml {
        Err(e) => Line::fail(
            phase,
            format!("module {module} loaded, but NVML failed: {e}"),
            "install the driver's user-space libraries matching the module, or point --driver-root / \
             --nvml-lib at them",
        ),
        Ok(inv) if &inv.driver.version != module => Line::fail(
            phase,
            format!("module {module} but NVML library {}", inv.driver.version),
            "the loaded module and the libraries differ (driver upgraded without reboot): reboot or \
             reload the nvidia module",
        ),
        Ok(inv) => {
            let names: Vec<&str> = inv.gpus.iter().map(|g| g.name.as_str()).collect();
            let first = names.first().copied().unwrap_or("none");
            Line::ok(
                phase,
                format!("module {module} loaded; NVML answers: {} GPU(s) ({first})", inv.gpus.len()),
            )
        }
    }
}

/// CDI spec present and fresh: valid JSON, generated for the loaded driver and the GPUs NVML
/// reports (when the driver phase ran), and no other tool's spec defining its devices where CDI
/// runtimes would see both.
pub fn spec(facts: &SpecFacts, driver: Option<&DriverFacts>) -> Line {
    let phase = Phase::Cdi;
    let spec_path = &facts.path;
    let module = driver.and_then(DriverFacts::module);
    let inventory = driver.and_then(DriverFacts::matching_inventory);
    let fix = "run `nvinject-installer install` (or `nvinject-cdi generate`) to write a current spec";
    let text = match &facts.text {
        Ok(Some(text)) => text,
        Ok(None) => return Line::fail(phase, format!("{spec_path} is missing"), fix),
        Err(e) => return Line::fail(phase, format!("{spec_path} cannot be read: {e}"), fix),
    };
    // The shim sets an untrusted spec aside: every GPU container would be refused naming it.
    if let Some(e) = &facts.untrusted {
        return Line::fail(phase, e.summary(), e.fix().unwrap_or_else(|| e.to_string()));
    }
    let spec: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Line::fail(phase, format!("{spec_path} is not valid JSON: {e}"), fix),
    };
    let annotation = |key: &str| spec["annotations"][key].as_str().map(str::to_owned);
    let devices = spec["devices"].as_array().map_or(0, Vec::len);
    let spec_driver = annotation(nvinject_cdi::nvinject::ANNOTATION_DRIVER_VERSION);
    if let (Some(module), Some(spec_driver)) = (module, &spec_driver)
        && module != spec_driver
    {
        return Line::fail(
            phase,
            format!("{spec_path} was generated for driver {spec_driver}, the loaded driver is {module}"),
            fix,
        );
    }
    if let Some(inv) = inventory {
        let digest = nvinject_cdi_gen::inventory_digest(inv);
        if annotation(nvinject_cdi::nvinject::ANNOTATION_INVENTORY_DIGEST).as_deref() != Some(digest.as_str())
        {
            return Line::fail(
                phase,
                format!("{spec_path} does not match the GPUs NVML reports (GPUs or MIG layout changed)"),
                fix,
            );
        }
    }
    // Another tool's spec defining our devices: they resolve to nothing, or to its definitions.
    let findings = match spec["kind"].as_str() {
        Some(kind) => {
            let names = spec["devices"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|d| d["name"].as_str().map(str::to_owned))
                .collect();
            foreign_specs::find(kind, &names, &facts.foreign)
        }
        None => foreign_specs::Findings::default(),
    };
    if !findings.clashes.is_empty() {
        let detail: Vec<String> = findings.clashes.iter().map(|c| c.describe(spec_path)).collect();
        return Line::fail(phase, detail.join("; "), foreign_specs::fix(&findings.clashes));
    }
    let unchecked: String = findings
        .unchecked
        .iter()
        .map(|u| format!("; not checked for clashing devices: {} ({})", u.path, u.why))
        .collect();
    Line::ok(
        phase,
        format!(
            "{spec_path}: {devices} device(s), driver {}{}{unchecked}",
            spec_driver.as_deref().unwrap_or("?"),
            if inventory.is_some() { ", matches NVML's inventory" } else { "" }
        ),
    )
}

/// Where containerd will look for the shim of a runtime entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShimLookup {
    /// `runtime_path`: this host path.
    RuntimePath(String),
    /// `runtime_type = io.containerd.nvinject.v2`: [`SHIM_BINARY`] in the first of these
    /// directories (containerd's `PATH`, our link directory first).
    OnPath(Vec<String>),
    /// Neither: the entry is not nvinject's.
    NotOurs(Option<String>),
}

impl ShimLookup {
    /// How containerd finds the shim of `runtime`.
    pub fn of(settings: &Settings, runtime: &EffectiveRuntime) -> ShimLookup {
        match (runtime.runtime_type.as_deref(), runtime.runtime_path.as_deref()) {
            (_, Some(path)) if !path.is_empty() => ShimLookup::RuntimePath(path.to_owned()),
            (Some(SHIM_RUNTIME_TYPE), _) => ShimLookup::OnPath(
                [
                    settings.shim_link_dir.as_str(),
                    "/usr/local/sbin",
                    "/usr/local/bin",
                    "/usr/sbin",
                    "/usr/bin",
                    "/sbin",
                    "/bin",
                ]
                .map(str::to_owned)
                .to_vec(),
            ),
            (other, _) => ShimLookup::NotOurs(other.map(str::to_owned)),
        }
    }

    /// The host paths whose executability decides where the shim is.
    pub fn candidates(&self) -> Vec<String> {
        match self {
            ShimLookup::RuntimePath(path) => vec![path.clone()],
            ShimLookup::OnPath(dirs) => dirs.iter().map(|d| host_join(d, SHIM_BINARY)).collect(),
            ShimLookup::NotOurs(_) => Vec::new(),
        }
    }
}

/// containerd runtime and shim: the config has our runtime (CDI annotations passed, pod
/// annotations not), the shim it names is there, containerd's own CDI (if on) reads our spec
/// directory, and the running containerd loaded the runtime.
pub fn containerd(settings: &Settings, facts: &ContainerdFacts) -> Line {
    let phase = Phase::Containerd;
    let (version, facts) = match facts {
        ContainerdFacts::Silent(e) => {
            return Line::fail(
                phase,
                format!("containerd does not answer: {e}"),
                "start containerd (systemctl start containerd) or pass --containerd-socket",
            );
        }
        ContainerdFacts::Answered { config: Err(e), .. } => {
            return Line::fail(phase, e.to_string(), "fix the file named above");
        }
        ContainerdFacts::Answered { version, config: Ok(config) } => (version, config),
    };
    let sources = &facts.sources;
    let runtime = match containerd::effective_runtime(sources, version, &settings.handler) {
        Ok(Some(r)) => r,
        Ok(None) => {
            return Line::fail(
                phase,
                format!(
                    "{} (and its imports) define no runtime `{}`",
                    settings.containerd_config, settings.handler
                ),
                "run `nvinject-installer install`",
            );
        }
        Err(e) => return Line::fail(phase, e.to_string(), "fix the file named above"),
    };
    if !runtime.container_annotations.iter().any(|a| a == CDI_ANNOTATIONS) {
        return Line::fail(
            phase,
            format!(
                "runtime `{}` ({}) does not pass {CDI_ANNOTATIONS} annotations",
                settings.handler, runtime.defined_in
            ),
            "run `nvinject-installer install` to rewrite the runtime entry",
        );
    }
    if !runtime.pod_annotations.is_empty() {
        return Line::fail(
            phase,
            format!(
                "runtime `{}` ({}) passes pod annotations {:?}: a pod could request devices it was not allocated",
                settings.handler, runtime.defined_in, runtime.pod_annotations
            ),
            "remove pod_annotations from that runtime",
        );
    }
    let executable = |path: &str| facts.executable.get(path).copied().unwrap_or(false);
    let lookup = ShimLookup::of(settings, &runtime);
    let shim = match &lookup {
        ShimLookup::RuntimePath(path) => {
            if !version.honours_runtime_path() {
                return Line::fail(
                    phase,
                    format!(
                        "runtime `{}` relies on runtime_path, which containerd {version} ignores",
                        settings.handler
                    ),
                    "run `nvinject-installer install` again (it detects the version) or upgrade containerd",
                );
            }
            PathBuf::from(path)
        }
        ShimLookup::OnPath(dirs) => match lookup.candidates().into_iter().find(|p| executable(p)) {
            Some(p) => PathBuf::from(p),
            None => {
                return Line::fail(
                    phase,
                    format!("{SHIM_BINARY} is not on containerd's PATH ({})", dirs.join(":")),
                    "run `nvinject-installer install` (it links the shim into --shim-link-dir)",
                );
            }
        },
        ShimLookup::NotOurs(other) => {
            return Line::fail(
                phase,
                format!(
                    "runtime `{}` has runtime_type {:?} and no runtime_path: not nvinject's",
                    settings.handler,
                    other.as_deref()
                ),
                "run `nvinject-installer install`",
            );
        }
    };
    let shim_host = shim.to_string_lossy().into_owned();
    if !executable(&shim_host) {
        return Line::fail(
            phase,
            format!(
                "the shim {shim_host} named by runtime `{}` is missing or not executable",
                settings.handler
            ),
            "run `nvinject-installer install` to copy the binaries",
        );
    }
    // With containerd's own CDI on, it resolves the annotations before the shim: the spec must be
    // in a directory it reads, on this version's defaults and config.
    let cdi = match containerd::effective_cdi(sources, version) {
        Ok(c) => c,
        Err(e) => return Line::fail(phase, e.to_string(), "fix the file named above"),
    };
    if facts.reads_cdi_dir == Some(false)
        && let Some(cdi) = &cdi
    {
        let (detail, fix) = crate::cdi::unread_dir_message(&settings.cdi_dir, &version.to_string(), cdi);
        return Line::fail(phase, detail, fix);
    }
    let cdi_note = match cdi.as_ref().filter(|c| c.enabled) {
        Some(_) => format!("; containerd's own CDI is on and reads {}", settings.cdi_dir),
        None => String::new(),
    };
    match &facts.loaded {
        Ok(loaded) if loaded.contains_key(&settings.handler) => Line::ok(
            phase,
            format!(
                "containerd {version} runs handler `{}` with {shim_host} (from {}){cdi_note}",
                settings.handler, runtime.defined_in
            ),
        ),
        Ok(_) => Line::fail(
            phase,
            format!(
                "the config has runtime `{}` but the running containerd has not loaded it",
                settings.handler
            ),
            "restart containerd (systemctl restart containerd)",
        ),
        Err(e) => Line::fail(
            phase,
            format!("cannot ask containerd's CRI plugin which runtimes it loaded: {e}"),
            "make sure the CRI plugin is enabled (not in disabled_plugins)",
        ),
    }
}

/// Device plugin registered: the kubelet and our plugin answer, and the kubelet's checkpoint lists
/// the resource.
pub fn plugin(args: &DoctorArgs, facts: &PluginFacts) -> Line {
    let phase = Phase::DevicePlugin;
    if !facts.kubelet_answers {
        return Line::fail(
            phase,
            format!("{} does not answer: the kubelet is not running here", facts.kubelet),
            "start the kubelet, or pass --device-plugin-dir",
        );
    }
    let Some(first) = facts.answering.first() else {
        return Line::fail(
            phase,
            format!("no nvinject device plugin socket answers in {}", args.device_plugin_dir),
            "check the device plugin pod: kubectl -n nvinject-system logs ds/nvinject-device-plugin",
        );
    };
    let registered = facts
        .checkpoint
        .as_deref()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
        .map(|v| v["Data"]["RegisteredDevices"][&args.resource].as_array().map_or(0, Vec::len));
    match registered {
        Some(0) | None => Line::fail(
            phase,
            format!("plugin socket {first} answers, but the kubelet's checkpoint lists no {}", args.resource),
            "check the plugin's registration in its log and the kubelet's log",
        ),
        Some(n) => Line::ok(phase, format!("{} registered with {n} device(s) ({first})", args.resource)),
    }
}

/// The test container to run, or the line saying why none runs: an earlier phase other than the
/// device plugin failed (the container would only repeat it), or no image was given.
pub fn test_container(
    settings: &Settings,
    args: &DoctorArgs,
    earlier: &[Line],
) -> Result<TestContainer, Line> {
    let phase = Phase::Container;
    if earlier.iter().any(|l| l.status == Status::Fail && l.phase != Phase::DevicePlugin) {
        return Err(Line::skip(phase, "skipped: fix the failures above first"));
    }
    let Some(image) = &args.test_image else {
        return Err(Line::skip(
            phase,
            "no --test-image: pass an image with a C library to run `nvidia-smi -L` in a GPU container",
        ));
    };
    Ok(TestContainer {
        handler: settings.handler.clone(),
        image: image.clone(),
        command: args.test_command.clone(),
        annotations: BTreeMap::from([("cdi.k8s.io/nvinject-doctor".to_owned(), args.test_device.clone())]),
    })
}

/// A container gets a GPU: the test container exited 0.
pub fn container(
    settings: &Settings,
    args: &DoctorArgs,
    outcome: &Result<(i32, String), ProbeError>,
) -> Line {
    let phase = Phase::Container;
    match outcome {
        Ok((0, output)) => Line::ok(
            phase,
            format!(
                "handler {} with {}: `{}` printed: {}",
                settings.handler,
                args.test_device,
                args.test_command.join(" "),
                output.lines().next().unwrap_or("").trim()
            ),
        ),
        Ok((code, output)) => Line::fail(
            phase,
            format!(
                "`{}` exited {code}: {}",
                args.test_command.join(" "),
                output.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
            ),
            "read the shim's log (runtime.log-file in /etc/nvinject/config.toml) and containerd's journal",
        ),
        // containerd's own CDI refuses at CreateContainer, naming the device.
        Err(e @ ProbeError::Cri(cri))
            if cri.status_message().is_some_and(|m| {
                m.contains("CDI device injection failed") || m.contains("unresolvable CDI devices")
            }) =>
        {
            Line::fail(
                phase,
                format!("containerd's own CDI could not resolve {}: {e}", args.test_device),
                format!(
                    "containerd reads CDI specs itself: make sure {} is in its cdi_spec_dirs and holds a current \
                     spec (nvinject-cdi generate, or reinstall)",
                    settings.cdi_dir
                ),
            )
        }
        Err(e) => Line::fail(
            phase,
            format!("the test container did not run: {e}"),
            "check that the image exists on the node (or can be pulled) and containerd's journal",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::CriError;
    use crate::paths::HostRoot;

    // The phases need no host: facts in, line out.
    #[test]
    fn phases_judge_facts_alone() {
        let line = driver(&DriverFacts::NoModule { version_file: "/sys/module/nvidia/version".into() });
        assert_eq!((line.phase, line.status), (Phase::Driver, Status::Fail));
        assert!(line.detail.contains("/sys/module/nvidia/version is missing"), "{line:?}");

        let settings = Settings::defaults(HostRoot::new("/nonexistent"), PathBuf::from("/unused"));
        let line = containerd(&settings, &ContainerdFacts::Silent(CriError::NoConfig.into()));
        assert_eq!(line.status, Status::Fail);
        assert_eq!(line.detail, "containerd does not answer: CRI status has no config");

        let args = DoctorArgs::default();
        let facts = PluginFacts {
            kubelet: "/k/kubelet.sock".into(),
            kubelet_answers: true,
            answering: vec!["nvinject-gpu.sock".into()],
            checkpoint: Some(r#"{"Data":{"RegisteredDevices":{"nvidia.com/gpu":["GPU-1"]}}}"#.into()),
        };
        let line = plugin(&args, &facts);
        assert_eq!(line.status, Status::Ok, "{line:?}");
        assert_eq!(line.detail, "nvidia.com/gpu registered with 1 device(s) (nvinject-gpu.sock)");

        let skipped =
            test_container(&settings, &args, &[Line::fail(Phase::Cdi, "stale", "fix")]).unwrap_err();
        assert_eq!((skipped.phase, skipped.status), (Phase::Container, Status::Skip));
        // A failed device plugin does not stop the container phase; no image does.
        let no_image =
            test_container(&settings, &args, &[Line::fail(Phase::DevicePlugin, "x", "y")]).unwrap_err();
        assert!(no_image.detail.starts_with("no --test-image"), "{no_image:?}");
    }
}
