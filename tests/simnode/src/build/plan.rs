//! The whole simulated node as a list of entries to create: a pure function of its inputs.
//!
//! Planning does no I/O, so the tree's shape (every path, mode, device number and file body) is
//! unit-tested without root, and the same inputs always give the same plan.

use std::path::{Path, PathBuf};

use crate::description::NodeDescription;
use crate::elf::{Machine, shared_object};
use crate::embed;
use crate::mig;

use super::devices::{self, Majors};
use super::driver::{self, NVML_STEM, SonameKind};
use super::layout::Layout;
use super::procfs;

/// One thing to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A directory with these permission bits (parents are created 0755 as needed).
    Dir {
        /// Absolute path.
        path: PathBuf,
        /// Permission bits.
        mode: u32,
    },
    /// A regular file with these bytes.
    File {
        /// Absolute path.
        path: PathBuf,
        /// Contents.
        bytes: Vec<u8>,
        /// Permission bits.
        mode: u32,
    },
    /// A copy of an existing file (the `nvidia-smi` stand-in, too big to hold in the plan).
    Copy {
        /// File to copy.
        from: PathBuf,
        /// Absolute destination path.
        path: PathBuf,
        /// Permission bits.
        mode: u32,
    },
    /// A symbolic link.
    Symlink {
        /// Absolute path of the link.
        path: PathBuf,
        /// What it points to, as written (relative targets stay relative).
        target: PathBuf,
    },
    /// A character device made with `mknod(2)`.
    CharDevice {
        /// Absolute path.
        path: PathBuf,
        /// Major number.
        major: u32,
        /// Minor number.
        minor: u32,
        /// Permission bits.
        mode: u32,
    },
    /// A unix socket file: bound, then closed, so the file stays.
    Socket {
        /// Absolute path.
        path: PathBuf,
    },
}

impl Entry {
    /// The path the entry creates.
    pub fn path(&self) -> &Path {
        match self {
            Entry::Dir { path, .. }
            | Entry::File { path, .. }
            | Entry::Copy { path, .. }
            | Entry::Symlink { path, .. }
            | Entry::CharDevice { path, .. }
            | Entry::Socket { path } => path,
        }
    }
}

/// Everything [`plan`] needs.
#[derive(Debug, Clone, Copy)]
pub struct PlanInput<'a> {
    /// The description, with `dev_root` and `events_file` already filled in.
    pub node: &'a NodeDescription,
    /// Where each part goes.
    pub layout: &'a Layout,
    /// Architecture of the stub libraries and of the library directory name.
    pub machine: Machine,
    /// Dynamic majors for `nvidia-uvm` and `nvidia-caps`.
    pub majors: Majors,
    /// The simulated NVML's ELF image (without any embedded description).
    pub nvml_image: &'a [u8],
    /// The `nvidia-smi` stand-in to copy.
    pub smi_bin: &'a Path,
}

const DIR: u32 = 0o755;
const EXEC: u32 = 0o755;
const DATA: u32 = 0o644;
const PROC: u32 = 0o444;

fn file(path: PathBuf, bytes: impl Into<Vec<u8>>, mode: u32) -> Entry {
    Entry::File { path, bytes: bytes.into(), mode }
}

fn link(path: PathBuf, target: impl Into<PathBuf>) -> Entry {
    Entry::Symlink { path, target: target.into() }
}

/// Plans the node. Device nodes come first, so that a build without the right to `mknod` fails
/// before it writes anything big.
pub fn plan(input: &PlanInput<'_>) -> Vec<Entry> {
    let mut out = Vec::new();
    dev_root(input, &mut out);
    driver_root(input, &mut out);
    proc_root(input, &mut out);
    sys_root(input, &mut out);
    let l = input.layout;
    let json = input.node.to_json();
    out.push(file(l.node_file(), json.as_bytes(), DATA));
    out.push(file(l.events_file(), Vec::new(), DATA));
    out.push(file(l.env_file(), env_file(input), DATA));
    out
}

fn dev_root(input: &PlanInput<'_>, out: &mut Vec<Entry>) {
    let root = &input.layout.dev_root;
    out.push(Entry::Dir { path: root.join("dev"), mode: DIR });
    for dev in devices::char_devices_for(input.node, &input.majors) {
        out.push(Entry::CharDevice {
            path: root.join(&dev.path),
            major: dev.major,
            minor: dev.minor,
            mode: dev.mode,
        });
    }
    for (path, target) in devices::dri_by_path(input.node) {
        out.push(link(root.join(path), target));
    }
}

fn driver_root(input: &PlanInput<'_>, out: &mut Vec<Entry>) {
    let l = input.layout;
    let root = &l.driver_root;
    let version = &input.node.driver.version;
    let lib_dir = l.lib_dir(input.machine);
    out.push(Entry::Dir { path: lib_dir.clone(), mode: DIR });
    for lib in driver::LIBRARIES {
        let file_name = lib.file_name(version);
        let bytes = if lib.stem == NVML_STEM {
            // The description travels inside the library, so a lone bind mount of it still knows
            // its node.
            embed::append(input.nvml_image, input.node.to_json().as_bytes())
        } else {
            shared_object(input.machine, &lib.soname(version))
        };
        out.push(file(lib_dir.join(&file_name), bytes, DATA));
        if let SonameKind::Major(_) = lib.soname {
            out.push(link(lib_dir.join(lib.soname(version)), &file_name));
        }
        if lib.dev_link {
            out.push(link(lib_dir.join(format!("{}.so", lib.stem)), lib.soname(version)));
        }
    }
    let vdpau_dir = lib_dir.join(driver::VDPAU_DIR);
    let vdpau = driver::VDPAU;
    out.push(file(
        vdpau_dir.join(vdpau.file_name(version)),
        shared_object(input.machine, &vdpau.soname(version)),
        DATA,
    ));
    out.push(link(vdpau_dir.join(vdpau.soname(version)), vdpau.file_name(version)));
    for (path, target) in driver::LIB_DIR_LINKS {
        out.push(link(lib_dir.join(path), target));
    }
    let xorg = root.join(driver::XORG_MODULES_DIR);
    let (modules, module_links) = driver::xorg_modules(version);
    for (path, soname) in modules {
        out.push(file(xorg.join(path), shared_object(input.machine, &soname), DATA));
    }
    for (path, target) in module_links {
        out.push(link(xorg.join(path), target));
    }
    let packages = input.node.driver.packages.iter().flat_map(|p| driver::package_binaries(*p));
    for name in driver::BINARIES.iter().chain(packages) {
        out.push(Entry::Copy { from: input.smi_bin.to_owned(), path: l.bin_dir().join(name), mode: EXEC });
    }
    let firmware_dir = root.join("lib/firmware/nvidia").join(version);
    for name in driver::FIRMWARE {
        out.push(file(firmware_dir.join(name), driver::firmware_image(name, version), DATA));
    }
    for (path, text) in driver::config_files(version) {
        out.push(file(root.join(path), text, DATA));
    }
    let triple = input.machine.multiarch_triple();
    out.push(file(root.join("etc/ld.so.conf"), driver::LD_SO_CONF, DATA));
    out.push(file(
        root.join(format!("etc/ld.so.conf.d/{triple}.conf")),
        driver::multiarch_conf(triple),
        DATA,
    ));
    // No var/cache/ldconfig: ldconfig would keep its auxiliary cache there, which records inode
    // numbers and times and would make two builds of the same preset differ.
    for daemon in ["nvidia-persistenced", "nvidia-fabricmanager"] {
        out.push(Entry::Dir { path: root.join("run").join(daemon), mode: DIR });
        out.push(Entry::Socket { path: root.join("run").join(daemon).join("socket") });
    }
    out.push(link(root.join("var/run"), "../run"));
    out.push(Entry::Dir { path: root.join("tmp/nvidia-mps"), mode: DIR });
}

fn proc_root(input: &PlanInput<'_>, out: &mut Vec<Entry>) {
    let root = &input.layout.proc_root;
    let node = input.node;
    let nv = root.join("driver/nvidia");
    out.push(file(nv.join("version"), procfs::version_file(&node.driver.version, input.machine), PROC));
    out.push(file(nv.join("params"), procfs::params_file(), PROC));
    for gpu in &node.gpus {
        let dir = nv.join("gpus").join(devices::linux_bus_id(&gpu.pci_bus_id));
        out.push(file(dir.join("information"), procfs::information_file(gpu, &node.driver.version), PROC));
    }
    let caps = nv.join("capabilities");
    out.push(file(caps.join("mig/config"), procfs::capability_file(mig::CONFIG_MINOR, 0o400), PROC));
    out.push(file(caps.join("mig/monitor"), procfs::capability_file(mig::MONITOR_MINOR, 0o444), PROC));
    for access in devices::mig_access(node) {
        // mig-minors says `gpu0/gi2/access`; the capability file lives at `gpu0/mig/gi2/access`.
        let (gpu, rest) = access.name.split_once('/').unwrap_or((&access.name, ""));
        out.push(file(
            caps.join(gpu).join("mig").join(rest),
            procfs::capability_file(access.minor, 0o444),
            PROC,
        ));
    }
    let minors = mig::mig_minors_file(devices::mig_minors_gpu_count(node));
    out.push(file(root.join("driver/nvidia-caps/mig-minors"), minors, PROC));
    let with_drm = node.gpus.iter().any(devices::has_display);
    out.push(file(root.join("devices"), devices::render_proc_devices(&input.majors, with_drm), PROC));
}

fn sys_root(input: &PlanInput<'_>, out: &mut Vec<Entry>) {
    let root = &input.layout.sys_root;
    out.push(file(root.join("module/nvidia/version"), format!("{}\n", input.node.driver.version), PROC));
    for gpu in &input.node.gpus {
        let dir = root.join("bus/pci/devices").join(devices::linux_bus_id(&gpu.pci_bus_id));
        for (name, text) in procfs::sysfs_pci_files(gpu) {
            out.push(file(dir.join(name), text, PROC));
        }
    }
}

/// Quotes `path` for a POSIX shell.
fn sh_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

fn env_file(input: &PlanInput<'_>) -> String {
    let l = input.layout;
    format!(
        "# Simulated GPU node `{name}`, made by `nvinject-simnode build`.\n\
         # Use: . {env}\n\
         export NVINJECT_SIM_NODE={node}\n\
         export NVINJECT_SIM_DRIVER_ROOT={driver}\n\
         export NVINJECT_SIM_DEV_ROOT={dev}\n\
         export NVINJECT_SIM_PROC_ROOT={proc_}\n\
         export NVINJECT_SIM_SYS_ROOT={sys}\n\
         LD_LIBRARY_PATH={lib}${{LD_LIBRARY_PATH:+\":$LD_LIBRARY_PATH\"}}\n\
         export LD_LIBRARY_PATH\n\
         PATH={bin}:\"$PATH\"\n\
         export PATH\n",
        name = input.node.name,
        env = l.env_file().display(),
        node = sh_quote(&l.node_file()),
        driver = sh_quote(&l.driver_root),
        dev = sh_quote(&l.dev_root),
        proc_ = sh_quote(&l.proc_root),
        sys = sh_quote(&l.sys_root),
        lib = sh_quote(&l.lib_dir(input.machine)),
        bin = sh_quote(&l.bin_dir()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(preset: &str) -> Vec<Entry> {
        let layout = Layout::new(Path::new("/sim"));
        let mut node = crate::presets::preset(preset).unwrap();
        node.dev_root = Some(layout.dev_root.clone());
        node.events_file = Some(layout.events_file());
        planned_node(&node, &layout)
    }

    fn planned_node(node: &NodeDescription, layout: &Layout) -> Vec<Entry> {
        let nvml = shared_object(Machine::X86_64, "libnvidia-ml.so.1");
        let input = PlanInput {
            node,
            layout,
            machine: Machine::X86_64,
            majors: Majors { uvm: 243, caps: 244 },
            nvml_image: &nvml,
            smi_bin: Path::new("/target/nvidia-smi"),
        };
        plan(&input)
    }

    fn find<'a>(entries: &'a [Entry], path: &str) -> &'a Entry {
        entries
            .iter()
            .find(|e| e.path() == Path::new(path))
            .unwrap_or_else(|| panic!("{path} is not planned"))
    }

    #[test]
    fn plan_is_deterministic_and_paths_are_unique() {
        let a = planned("a100-mig");
        let b = planned("a100-mig");
        assert_eq!(a, b);
        let mut paths: Vec<_> = a.iter().map(Entry::path).collect();
        paths.sort();
        let n = paths.len();
        paths.dedup();
        assert_eq!(paths.len(), n, "two entries create the same path");
    }

    #[test]
    fn default_layout() {
        let e = planned("h100x8");
        let lib = "/sim/driver/usr/lib/x86_64-linux-gnu";
        assert!(matches!(find(&e, &format!("{lib}/libcuda.so.550.54.15")), Entry::File { mode: 0o644, .. }));
        assert_eq!(
            find(&e, &format!("{lib}/libcuda.so.1")),
            &link(format!("{lib}/libcuda.so.1").into(), "libcuda.so.550.54.15")
        );
        assert_eq!(
            find(&e, &format!("{lib}/libcuda.so")),
            &link(format!("{lib}/libcuda.so").into(), "libcuda.so.1")
        );
        assert!(!e.iter().any(|x| x.path() == Path::new(&format!("{lib}/libnvidia-glcore.so.1"))));
        assert_eq!(
            find(&e, "/sim/host/dev/nvidia7"),
            &Entry::CharDevice { path: "/sim/host/dev/nvidia7".into(), major: 195, minor: 7, mode: 0o666 }
        );
        assert!(matches!(
            find(&e, "/sim/host/dev/nvidia-uvm-tools"),
            Entry::CharDevice { major: 243, minor: 1, .. }
        ));
        assert!(matches!(find(&e, "/sim/driver/run/nvidia-persistenced/socket"), Entry::Socket { .. }));
        assert!(matches!(
            find(&e, "/sim/driver/usr/bin/nvidia-cuda-mps-server"),
            Entry::Copy { mode: 0o755, .. }
        ));
        assert!(matches!(
            find(&e, "/sim/host/proc/driver/nvidia/gpus/0000:18:00.0/information"),
            Entry::File { .. }
        ));
        assert!(matches!(find(&e, "/sim/host/sys/module/nvidia/version"), Entry::File { .. }));
        // Graphics, video and display pieces of a 550 install.
        assert!(matches!(find(&e, &format!("{lib}/vdpau/libvdpau_nvidia.so.550.54.15")), Entry::File { .. }));
        assert_eq!(
            find(&e, &format!("{lib}/vdpau/libvdpau_nvidia.so.1")),
            &link(format!("{lib}/vdpau/libvdpau_nvidia.so.1").into(), "libvdpau_nvidia.so.550.54.15")
        );
        assert_eq!(
            find(&e, &format!("{lib}/gbm/nvidia-drm_gbm.so")),
            &link(format!("{lib}/gbm/nvidia-drm_gbm.so").into(), "../libnvidia-allocator.so.1")
        );
        assert_eq!(
            find(&e, &format!("{lib}/libnvidia-vulkan-producer.so")),
            &link(
                format!("{lib}/libnvidia-vulkan-producer.so").into(),
                "libnvidia-vulkan-producer.so.550.54.15"
            )
        );
        let xorg = "/sim/driver/usr/lib/xorg/modules";
        assert!(matches!(find(&e, &format!("{xorg}/drivers/nvidia_drv.so")), Entry::File { .. }));
        assert_eq!(
            find(&e, &format!("{xorg}/extensions/libglxserver_nvidia.so")),
            &link(
                format!("{xorg}/extensions/libglxserver_nvidia.so").into(),
                "libglxserver_nvidia.so.550.54.15"
            )
        );
        assert!(matches!(find(&e, "/sim/driver/usr/bin/nvidia-xconfig"), Entry::Copy { mode: 0o755, .. }));
        assert!(matches!(
            find(&e, "/sim/driver/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin"),
            Entry::File { .. }
        ));
    }

    #[test]
    fn separate_packages_add_their_programs_only_when_listed() {
        let imex = "/sim/driver/usr/bin/nvidia-imex";
        assert!(
            !planned("h100x8").iter().any(|e| e.path() == Path::new(imex)),
            "the driver alone has no IMEX"
        );
        let layout = Layout::new(Path::new("/sim"));
        let mut node = crate::presets::preset("h100x8").unwrap();
        node.driver.packages = vec![crate::description::DriverPackage::Imex];
        let e = planned_node(&node, &layout);
        for name in ["nvidia-imex", "nvidia-imex-ctl"] {
            let path = format!("/sim/driver/usr/bin/{name}");
            assert!(matches!(find(&e, &path), Entry::Copy { mode: 0o755, .. }), "{path}");
        }
        // The description says so, for whoever reads node.json.
        let json: serde_json::Value = serde_json::from_str(&node.to_json()).unwrap();
        assert_eq!(json["driver"]["packages"], serde_json::json!(["imex"]));
    }

    #[test]
    fn nvml_carries_the_description() {
        let e = planned("single");
        let Entry::File { bytes, .. } =
            find(&e, "/sim/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15")
        else {
            panic!("NVML is not a file")
        };
        let (_, json) = embed::split(bytes).expect("description embedded");
        let node = NodeDescription::from_slice(json, Path::new("embedded")).unwrap();
        assert_eq!(node.dev_root.as_deref(), Some(Path::new("/sim/host")));
        assert_eq!(node.events_file.as_deref(), Some(Path::new("/sim/xid-events")));
    }

    #[test]
    fn mig_caps_match_the_proc_files() {
        let e = planned("a100-mig");
        let Entry::File { bytes, .. } =
            find(&e, "/sim/host/proc/driver/nvidia/capabilities/gpu1/mig/gi7/ci0/access")
        else {
            panic!()
        };
        let minor = 3 + 135 + 7 * 9 + 1;
        assert!(String::from_utf8_lossy(bytes).starts_with(&format!("DeviceFileMinor: {minor}\n")));
        assert!(matches!(
            find(&e, &format!("/sim/host/dev/nvidia-caps/nvidia-cap{minor}")),
            Entry::CharDevice { major: 244, mode: 0o444, .. }
        ));
        assert!(matches!(
            find(&e, "/sim/host/dev/nvidia-caps/nvidia-cap1"),
            Entry::CharDevice { mode: 0o400, .. }
        ));
    }

    #[test]
    fn env_file_quotes_paths() {
        let e = planned("single");
        let Entry::File { bytes, .. } = find(&e, "/sim/env") else { panic!() };
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains("export NVINJECT_SIM_NODE='/sim/node.json'\n"), "{text}");
        assert!(text.contains("LD_LIBRARY_PATH='/sim/driver/usr/lib/x86_64-linux-gnu'${LD_LIBRARY_PATH:+"));
        assert_eq!(sh_quote(Path::new("/a'b")), r"'/a'\''b'");
    }
}
