//! `nvinject-cdi generate` against simulated nodes built by `nvinject-simnode build` (real device
//! nodes, real ELF stubs, an ld.so.cache made by the real `ldconfig`, the simulated NVML loaded by
//! nvml-wrapper). Needs root, as `nvinject-simnode build` does.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nvinject_cdi::{Format, Spec, codec, validate};
use nvinject_simnode::artifacts::{sim_nvml_lib, simnode_bin};
use nvinject_simnode::description::DriverPackage;

const CDI: &str = env!("CARGO_BIN_EXE_nvinject-cdi");
const VER: &str = "550.54.15";

/// A simulated node in a temporary directory, removed (device nodes included) when dropped.
struct Node {
    tmp: tempfile::TempDir,
    preset: &'static str,
}

impl Node {
    fn build(preset: &'static str) -> Node {
        Node::build_with(preset, &[])
    }

    /// `preset` with NVIDIA's separately packaged components `packages` installed beside the driver.
    fn build_with(preset: &'static str, packages: &[DriverPackage]) -> Node {
        sim_nvml_lib();
        let tmp = tempfile::tempdir().unwrap();
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/proc-devices");
        let mut description = nvinject_simnode::presets::preset(preset).unwrap();
        description.driver.packages = packages.to_vec();
        let file = tmp.path().join("node.json");
        std::fs::write(&file, description.to_json()).unwrap();
        let out = Command::new(simnode_bin("nvinject-simnode"))
            .arg("build")
            .arg("--node")
            .arg(&file)
            .arg("--out")
            .arg(tmp.path().join("node"))
            .arg("--host-proc-devices")
            .arg(fixture)
            .output()
            .unwrap();
        assert!(out.status.success(), "simnode build: {}", String::from_utf8_lossy(&out.stderr));
        Node { tmp, preset }
    }

    fn dir(&self) -> PathBuf {
        self.tmp.path().join("node")
    }
    fn driver(&self) -> PathBuf {
        self.dir().join("driver")
    }
    fn host(&self) -> PathBuf {
        self.dir().join("host")
    }
    fn lib_dir(&self) -> PathBuf {
        self.driver().join("usr/lib/x86_64-linux-gnu")
    }

    /// Arguments that make the spec read as on a host whose roots are `/`.
    fn rebased(&self) -> Vec<String> {
        let s = |p: PathBuf| p.to_string_lossy().into_owned();
        vec![
            "--driver-root".into(),
            "/".into(),
            "--driver-root-ctr-path".into(),
            s(self.driver()),
            "--dev-root".into(),
            "/".into(),
            "--dev-root-ctr-path".into(),
            s(self.host()),
            "--proc-root".into(),
            s(self.host().join("proc")),
            "--sys-root".into(),
            s(self.host().join("sys")),
        ]
    }

    /// Arguments naming the roots where they are, without rebasing.
    fn direct(&self) -> Vec<String> {
        let s = |p: PathBuf| p.to_string_lossy().into_owned();
        vec![
            "--driver-root".into(),
            s(self.driver()),
            "--dev-root".into(),
            s(self.host()),
            "--proc-root".into(),
            s(self.host().join("proc")),
            "--sys-root".into(),
            s(self.host().join("sys")),
        ]
    }

    fn uuid(&self, gpu: usize) -> String {
        nvinject_simnode::presets::preset(self.preset).unwrap().gpus[gpu].uuid.clone()
    }
}

fn cdi<S: AsRef<std::ffi::OsStr>>(args: impl IntoIterator<Item = S>) -> Output {
    Command::new(CDI).args(args).output().unwrap()
}

fn generate(args: &[String]) -> String {
    let out = cdi(std::iter::once("generate".to_owned()).chain(args.iter().cloned()));
    assert!(out.status.success(), "generate {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn generate_fails(args: &[String]) -> String {
    let out = cdi(std::iter::once("generate".to_owned()).chain(args.iter().cloned()));
    assert_eq!(
        out.status.code(),
        Some(1),
        "generate {args:?} should fail; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(out.stdout.is_empty(), "a failed generate prints no spec");
    String::from_utf8(out.stderr).unwrap()
}

fn parse(yaml: &str) -> Spec {
    codec::parse(yaml.as_bytes(), Format::Yaml, Path::new("stdout")).unwrap()
}

fn args(base: Vec<String>, extra: &[&str]) -> Vec<String> {
    base.into_iter().chain(extra.iter().map(|s| (*s).to_owned())).collect()
}

fn names(spec: &Spec) -> Vec<&str> {
    spec.devices.iter().map(|d| d.name.as_str()).collect()
}

/// The reference Rust CDI implementation reads the file, checks its schema and its rules.
fn reference_accepts(path: &Path, text: &str) {
    container_device_interface::schema::validate_builtin(text.as_bytes())
        .unwrap_or_else(|e| panic!("{}: schema: {e:#}", path.display()));
    container_device_interface::spec::read_spec(&path.to_path_buf(), 0)
        .unwrap_or_else(|e| panic!("{}: container-device-interface: {e:#}", path.display()));
}

fn golden(preset: &'static str) {
    let node = Node::build(preset);
    let yaml = generate(&node.rebased());
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/{preset}.yaml"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&file, &yaml).unwrap();
    }
    let want = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert!(
        yaml == want,
        "{preset}: output differs from {} (UPDATE_GOLDEN=1 to accept):\n{yaml}",
        file.display()
    );
    assert!(!yaml.contains(node.tmp.path().to_str().unwrap()), "a temporary path leaked into the spec");

    let spec = parse(&yaml);
    assert_eq!(validate(&spec), vec![]);
    // The JSON form is the same spec.
    let json = generate(&args(node.rebased(), &["--format", "json"]));
    assert_eq!(codec::parse(json.as_bytes(), Format::Json, Path::new("stdout")).unwrap(), spec);
    // Both are accepted by the reference implementation.
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [("nvidia.yaml", &yaml), ("nvidia.json", &json)] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        reference_accepts(&path, text);
    }
}

#[test]
#[ignore = "needs root"]
fn golden_single() {
    nvinject_test_support::require_root("mknod for the simulated node");
    golden("single");
}

#[test]
#[ignore = "needs root"]
fn golden_h100x8() {
    nvinject_test_support::require_root("mknod for the simulated node");
    golden("h100x8");
}

#[test]
#[ignore = "needs root"]
fn golden_a100_mig() {
    nvinject_test_support::require_root("mknod for the simulated node");
    golden("a100-mig");
}

#[test]
#[ignore = "needs root"]
fn split_roots_prefix_host_paths_and_are_recorded() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::build("single");
    let spec = parse(&generate(&node.direct()));
    let driver = node.driver().to_string_lossy().into_owned();
    let host = node.host().to_string_lossy().into_owned();
    // Every file comes from the driver root, at its own path (Vulkan's manifests under /etc/vulkan).
    for m in &spec.container_edits.mounts {
        let inner =
            m.host_path.strip_prefix(&driver).unwrap_or_else(|| panic!("{} not under {driver}", m.host_path));
        assert_eq!(nvinject_cdi_gen::driver::config_container_path(inner), m.container_path);
    }
    let nodes = spec
        .devices
        .iter()
        .flat_map(|d| &d.container_edits.device_nodes)
        .chain(&spec.container_edits.device_nodes);
    for n in nodes {
        assert_eq!(n.host_path.as_deref(), Some(format!("{host}{}", n.path).as_str()));
        assert!(Path::new(n.host_path.as_deref().unwrap()).exists(), "{} exists", n.path);
    }
    assert_eq!(spec.annotations["nvinject.io/driver-root"], driver);
    assert_eq!(spec.annotations["nvinject.io/dev-root"], host);
    // The L4 is a display GPU: its DRM nodes and by-path links come along.
    let gpu = &spec.device("0").unwrap().container_edits;
    assert!(gpu.device_nodes.iter().any(|n| n.path == "/dev/dri/card0"));
    assert!(gpu.hooks[0].args.contains(&"../card0::/dev/dri/by-path/pci-0000:01:00.0-card".to_owned()));
}

#[test]
#[ignore = "needs root"]
fn a_root_without_ld_cache_gives_the_same_spec() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::build("h100x8");
    let with_cache = generate(&node.rebased());
    std::fs::remove_file(node.driver().join("etc/ld.so.cache")).unwrap();
    let without = generate(&node.rebased());
    assert_eq!(with_cache, without, "libraries in the standard folders are found without the cache");
}

#[test]
#[ignore = "needs root"]
fn libraries_in_an_odd_folder_are_found_through_the_ld_cache_only() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::build("single");
    // Move every library to a folder no search path names and register it with the real ldconfig.
    let odd = node.driver().join("opt/nvidia/lib");
    std::fs::create_dir_all(&odd).unwrap();
    for entry in std::fs::read_dir(node.lib_dir()).unwrap() {
        let entry = entry.unwrap();
        std::fs::rename(entry.path(), odd.join(entry.file_name())).unwrap();
    }
    std::fs::write(node.driver().join("etc/ld.so.conf.d/zz-nvidia.conf"), "/opt/nvidia/lib\n").unwrap();
    let status = Command::new("ldconfig").arg("-r").arg(node.driver()).status().unwrap();
    assert!(status.success());

    let spec = parse(&generate(&node.rebased()));
    let cuda = format!("/opt/nvidia/lib/libcuda.so.{VER}");
    assert!(spec.container_edits.mounts.iter().any(|m| m.container_path == cuda), "found through the cache");
    let ldcache = spec.container_edits.hooks.iter().find(|h| h.args[1] == "update-ldcache").unwrap();
    // VDPAU's folder moved along with the rest.
    assert_eq!(ldcache.args[2..], ["--folder", "/opt/nvidia/lib", "--folder", "/opt/nvidia/lib/vdpau"]);

    // Without the cache nothing says where they are: the error says what was searched.
    std::fs::remove_file(node.driver().join("etc/ld.so.cache")).unwrap();
    let nvml = odd.join("libnvidia-ml.so.1").to_string_lossy().into_owned();
    let err = generate_fails(&args(node.rebased(), &["--nvml-lib", &nvml]));
    assert!(err.contains(&format!("driver library libcuda.so.{VER} not found under driver root /")), "{err}");
    assert!(
        err.contains(
            "searched /lib, /usr/lib, /usr/lib/x86_64-linux-gnu (the root has no readable etc/ld.so.cache)"
        ),
        "{err}"
    );
    assert!(err.contains("--library-search-path"), "{err}");
    // Naming the folder fixes it.
    let spec = parse(&generate(&args(
        node.rebased(),
        &["--nvml-lib", &nvml, "--library-search-path", "/opt/nvidia/lib"],
    )));
    assert!(spec.container_edits.mounts.iter().any(|m| m.container_path == cuda));
}

#[test]
#[ignore = "needs root"]
fn naming_strategies() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::build("a100-mig");
    let spec =
        parse(&generate(&args(node.rebased(), &["--device-name-strategy", "type-index", "--no-all-device"])));
    assert_eq!(
        names(&spec),
        [
            "mig0:0", "mig0:1", "mig0:2", "mig0:3", "mig1:0", "mig1:1", "mig1:2", "mig1:3", "mig1:4",
            "mig1:5", "mig1:6", "gpu2", "gpu3"
        ]
    );

    let spec = parse(&generate(&args(
        node.rebased(),
        &[
            "--device-name-strategy",
            "index",
            "--device-name-strategy",
            "uuid",
            "--device-name-strategy",
            "type-index",
        ],
    )));
    let gpu2 = node.uuid(2);
    let n = names(&spec);
    let at = n.iter().position(|x| *x == "2").unwrap();
    assert_eq!(n[at..at + 3], ["2", gpu2.as_str(), "gpu2"]);
    assert_eq!(n.last(), Some(&"all"));
    assert_eq!(n.len(), 13 * 3 + 1);
    // The same device under each name has the same edits.
    assert_eq!(spec.device("2").unwrap().container_edits, spec.device("gpu2").unwrap().container_edits);

    let out = cdi(["generate", "--device-name-strategy", "by-name"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected index, uuid or type-index"));
}

#[test]
#[ignore = "needs root"]
fn device_ids_limit_the_spec() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::build("h100x8");
    let three = node.uuid(3);
    let spec = parse(&generate(&args(node.rebased(), &["--device-ids", &format!("1,{three}")])));
    assert_eq!(names(&spec), ["1", node.uuid(1).as_str(), "3", three.as_str(), "all"]);
    let all: Vec<&str> =
        spec.device("all").unwrap().container_edits.device_nodes.iter().map(|n| n.path.as_str()).collect();
    assert_eq!(all, ["/dev/nvidia1", "/dev/nvidia3"]);

    let err = generate_fails(&args(node.rebased(), &["--device-ids", "9"]));
    assert!(err.contains("no device `9` on this node; devices are: 0, 1, 2, 3, 4, 5, 6, 7"), "{err}");
}

#[test]
#[ignore = "needs root"]
fn management_mode_needs_no_nvml() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::build("a100-mig");
    let spec = parse(&generate(&args(
        node.rebased(),
        &["--mode", "management", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"],
    )));
    assert_eq!(names(&spec), ["all"]);
    let nodes: Vec<&str> =
        spec.devices[0].container_edits.device_nodes.iter().map(|n| n.path.as_str()).collect();
    for want in [
        "/dev/nvidia0",
        "/dev/nvidia3",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2",
        "/dev/nvidia-caps/nvidia-cap21",
    ] {
        assert!(nodes.contains(&want), "{want} in {nodes:?}");
    }
    assert_eq!(spec.annotations["nvinject.io/driver-version"], VER);
    assert!(
        spec.container_edits.mounts.iter().any(|m| m.container_path.ends_with(&format!("libcuda.so.{VER}")))
    );

    let err = generate_fails(&args(node.rebased(), &["--mode", "management", "--device-ids", "0"]));
    assert!(err.contains("--device-ids cannot be used with --mode management"), "{err}");
}

#[test]
#[ignore = "needs root"]
fn same_node_same_bytes() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::build("a100-mig");
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    for path in [&a, &b] {
        generate(&args(node.rebased(), &["--output", path.to_str().unwrap()]));
    }
    let (a, b) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert_eq!(a, b);
    assert!(a.starts_with(b"{\n  \"cdiVersion\": \"0.6.0\""), "the .json extension picks JSON");
    assert_eq!(generate(&node.rebased()), generate(&node.rebased()));
}

#[test]
#[ignore = "needs root"]
fn hooks_follow_the_flags() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::build("single");
    let spec = parse(&generate(&args(
        node.rebased(),
        &[
            "--hook-path",
            "/opt/nv/bin/nvinject-hook",
            "--disable-hook",
            "update-ldcache",
            "--disable-hook",
            "enable-cuda-compat",
            "--disable-hook",
            "disable-device-node-modification",
            "--disable-hook",
            "update-application-profile",
        ],
    )));
    let hooks = &spec.container_edits.hooks;
    assert_eq!(hooks.len(), 1);
    assert_eq!(
        (hooks[0].path.as_str(), hooks[0].args[1].as_str()),
        ("/opt/nv/bin/nvinject-hook", "create-symlinks")
    );
    assert!(hooks[0].args.contains(&format!("libcuda.so.{VER}::/usr/lib/x86_64-linux-gnu/libcuda.so.1")));
    let err = generate_fails(&args(node.rebased(), &["--hook-path", "nvinject-hook"]));
    assert!(err.contains("--hook-path nvinject-hook must be absolute"), "{err}");
}

#[test]
#[ignore = "needs root"]
fn errors_name_what_failed_and_what_to_do() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::build("single");
    let err = generate_fails(&args(node.rebased(), &["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"]));
    assert!(
        err.contains("cannot load NVML from /nonexistent/libnvidia-ml.so.1")
            && err.contains("--mode management"),
        "{err}"
    );

    let empty = tempfile::tempdir().unwrap();
    let e = empty.path().to_str().unwrap();
    let err = generate_fails(
        &["--mode", "management", "--driver-root", e, "--proc-root", e, "--sys-root", e].map(String::from),
    );
    assert!(
        err.contains("NVIDIA driver version not found")
            && err.contains(&format!("{e}/module/nvidia/version")),
        "{err}"
    );

    for f in std::fs::read_dir(node.lib_dir()).unwrap() {
        let f = f.unwrap();
        if f.file_name().to_string_lossy().starts_with("libcuda.so") {
            std::fs::remove_file(f.path()).unwrap();
        }
    }
    let err = generate_fails(&node.rebased());
    assert!(err.contains(&format!("driver library libcuda.so.{VER} not found under driver root /")), "{err}");
}

#[test]
#[ignore = "needs root"]
fn output_that_cannot_be_written_is_refused_and_nothing_is_left_behind() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::build("single");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("file"), b"").unwrap();
    let target = dir.path().join("file/nvidia.yaml");
    let err = generate_fails(&args(node.rebased(), &["--output", target.to_str().unwrap()]));
    assert!(err.contains(&format!("cannot write {}: create directory failed", target.display())), "{err}");

    // An existing spec is replaced whole or not at all: a directory in the way makes the rename
    // fail, and no temporary file stays.
    let busy = dir.path().join("busy.yaml");
    std::fs::create_dir(&busy).unwrap();
    std::fs::write(busy.join("x"), b"").unwrap();
    let err = generate_fails(&args(node.rebased(), &["--output", busy.to_str().unwrap()]));
    assert!(err.contains("rename failed"), "{err}");
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["busy.yaml", "file"]);
}

#[test]
#[ignore = "needs root"]
fn a_written_spec_validates_and_lists() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::build("a100-mig");
    let dir = tempfile::tempdir().unwrap();
    let spec_dir = dir.path().join("run/cdi");
    let path = spec_dir.join("nvidia.com-gpu.json");
    generate(&args(node.rebased(), &["--output", path.to_str().unwrap()]));

    let out = cdi([std::ffi::OsStr::new("validate"), path.as_os_str()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("ok (cdiVersion 0.6.0, kind nvidia.com/gpu, 27 devices)")
    );

    let out = cdi([std::ffi::OsStr::new("list"), "--spec-dir".as_ref(), spec_dir.as_os_str()]);
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let listed: Vec<&str> = stdout.lines().collect();
    assert_eq!(listed.len(), 27);
    for want in ["nvidia.com/gpu=all", "nvidia.com/gpu=0:0", "nvidia.com/gpu=1:6", "nvidia.com/gpu=3"] {
        assert!(listed.contains(&want), "{want} not listed: {stdout}");
    }
    let mig = format!(
        "nvidia.com/gpu={}",
        nvinject_simnode::presets::preset("a100-mig").unwrap().gpus[0].mig.as_ref().unwrap().gpu_instances[0]
            .compute_instances[0]
            .uuid
    );
    assert!(listed.contains(&mig.as_str()), "{mig} not listed");
}

/// MPS: nothing unless asked; asked, an `mps` device with the pipe directory writable and the
/// variable naming it, and nothing else changed; a directory that is not there is refused before
/// anything is written.
#[test]
#[ignore = "needs root"]
fn mps_pieces_come_only_with_mps_pipe_dir() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::build("single");
    let plain = parse(&generate(&node.rebased()));
    // The node has the daemon's default pipe folder, but MPS is not configured.
    assert!(node.driver().join("tmp/nvidia-mps").is_dir());
    assert!(
        !plain.container_edits.mounts.iter().any(|m| m.container_path.contains("/tmp")),
        "not configured"
    );
    assert!(!plain.container_edits.env.iter().any(|e| e.starts_with("CUDA_MPS_")));

    let here = node.driver().join("tmp/nvidia-mps").to_string_lossy().into_owned();
    let spec = parse(&generate(&args(
        node.rebased(),
        &["--mps-pipe-dir", "/tmp/nvidia-mps", "--mps-pipe-dir-ctr-path", &here],
    )));
    assert_eq!(validate(&spec), vec![]);
    // Never in the common edits every GPU container gets: those are the plain spec's.
    assert_eq!(spec.container_edits, plain.container_edits, "MPS pieces in the common edits");
    // Only in the `mps` device, which the device plugin hands out with MPS-shared GPUs.
    let holders: Vec<&str> = spec
        .devices
        .iter()
        .filter(|d| d.container_edits.mounts.iter().any(|m| m.container_path == "/tmp/nvidia-mps"))
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(holders, ["mps"]);
    let edits = &spec.devices.iter().find(|d| d.name == "mps").unwrap().container_edits;
    let mps = &edits.mounts;
    assert_eq!(mps.len(), 1);
    assert_eq!(mps[0].host_path, "/tmp/nvidia-mps");
    assert!(mps[0].options.iter().any(|o| o == "rw") && !mps[0].options.iter().any(|o| o == "ro"));
    for o in ["nosuid", "nodev", "noexec"] {
        assert!(mps[0].options.iter().any(|x| x == o), "{o}: {:?}", mps[0].options);
    }
    assert_eq!(edits.env, ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]);
    // The GPU devices are the plain spec's.
    assert_eq!(spec.devices[..spec.devices.len() - 1], plain.devices[..]);

    let err = generate_fails(&args(node.rebased(), &["--mps-pipe-dir", "/nonexistent/nvidia-mps"]));
    assert!(err.contains("MPS pipe directory /nonexistent/nvidia-mps: does not exist"), "{err}");
    let file = node.driver().join("etc/ld.so.conf").to_string_lossy().into_owned();
    let err = generate_fails(&args(
        node.rebased(),
        &["--mps-pipe-dir", "/etc/ld.so.conf", "--mps-pipe-dir-ctr-path", &file],
    ));
    assert!(err.contains("not a directory") && err.contains("looked up at"), "{err}");
    let err = generate_fails(&args(node.rebased(), &["--mps-pipe-dir-ctr-path", &here]));
    assert!(err.contains("--mps-pipe-dir-ctr-path needs --mps-pipe-dir"), "{err}");
}

/// A node with NVIDIA's `nvidia-imex` package (its own package for 550.54.15, not part of the
/// driver): its two programs are mounted, as the driver's own programs are, and nothing else
/// changes. nvidia-ctk 1.20 finds them with the same executable locator and mounts them the same
/// way as `nvidia-smi` (`pkg/nvcdi/driver-nvml.go`, `newDriverBinariesDiscoverer`), and
/// `nvidia_ctk_diff.rs` pins how our `nvidia-smi` mount compares with NVIDIA's; its recording was
/// made without the package, so it is compared here, not there.
#[test]
#[ignore = "needs root"]
fn imex_programs_are_mounted_like_the_driver_s_own() {
    nvinject_test_support::require_root("mknod for the simulated node");
    let node = Node::build_with("h100x8", &[DriverPackage::Imex]);
    let spec = parse(&generate(&node.rebased()));
    assert_eq!(validate(&spec), vec![]);
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/h100x8.yaml");
    let plain = parse(&std::fs::read_to_string(&golden).unwrap());
    let smi = spec.container_edits.mounts.iter().find(|m| m.container_path == "/usr/bin/nvidia-smi").unwrap();
    let mut rest = spec.clone();
    for name in nvinject_simnode::build::driver::IMEX_BINARIES {
        let path = format!("/usr/bin/{name}");
        let at = rest.container_edits.mounts.iter().position(|m| m.container_path == path);
        let m = rest.container_edits.mounts.remove(at.unwrap_or_else(|| panic!("{path} not mounted")));
        assert_eq!((m.host_path.as_str(), &m.options), (path.as_str(), &smi.options), "{path}");
    }
    assert_eq!(rest, plain, "the package changed more than its two mounts");
}
