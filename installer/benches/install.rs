//! Installer benchmark: prints what an operator's node pays.
//!
//! - `plan`: planning containerd's change (parse the config with toml_edit, build the drop-in and the
//!   main-file edit) for the Debian 1.6, containerd 1.7 and containerd 2.x fixtures;
//! - `install`: a whole first install into a temporary host root (binaries, config.toml, CDI spec,
//!   drop-in, imports entry, state), then the no-change install every DaemonSet pod restart runs,
//!   and uninstall. containerd is a fake that only counts restarts (the real restart is containerd's
//!   own time), the CDI spec a fixed 24 KiB.
//!
//! Run: `cargo bench -p nvinject-installer --bench install`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{FakeContainerd, fixtures_root, write_binaries};
use nvinject_installer::containerd::{ConfigSources, ContainerdVersion, RuntimeRequest, plan};
use nvinject_installer::fsx::FaultHook;
use nvinject_installer::install::{Installer, Settings, SpecGenerator, SpecRequest};
use nvinject_installer::paths::HostRoot;
use nvinject_installer::runtime_config::ShimConfig;

const RUNS: usize = 200;

struct FixedSpec(Vec<u8>);

impl SpecGenerator for FixedSpec {
    fn generate(&self, _: &SpecRequest) -> nvinject_installer::Result<Vec<u8>> {
        Ok(self.0.clone())
    }
}

fn summary(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    format!("median {:>9.1?}  p90 {:>9.1?}  max {:>9.1?}", at(0.5), at(0.9), at(1.0))
}

fn time(mut f: impl FnMut()) -> Vec<Duration> {
    (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect()
}

fn bench_plan(fixtures: &Path) {
    println!("containerd config planning ({RUNS} runs each)");
    for (case, version) in
        [("v2-debian-default-1.6", "1.6.20"), ("v2-runtime-path-1.7", "1.7.20"), ("v3-containerd-2", "2.1.4")]
    {
        let sources = ConfigSources {
            main_path: "/etc/containerd/config.toml".into(),
            main: Some(fs::read_to_string(fixtures.join(case).join("before.toml")).unwrap()),
            imported: Vec::new(),
            imported_before_drop_in: 0,
        };
        let containerd = ContainerdVersion::parse(version).unwrap();
        let request = RuntimeRequest {
            handler: "nvidia".into(),
            shim_path: "/usr/local/nvinject/bin/containerd-shim-nvinject-v2".into(),
            set_as_default: false,
            drop_in_path: "/etc/containerd/conf.d/99-nvinject.toml".into(),
        };
        let samples = time(|| {
            plan(&sources, &containerd, &request).expect("fixture plans");
        });
        println!("  {case:<24} {}", summary(samples));
    }
}

fn host(dir: &Path, config: &str) -> Settings {
    let root = dir.join("host");
    for d in ["etc/containerd/conf.d", "run", "usr/local/bin", "var/lib"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    fs::write(root.join("etc/containerd/config.toml"), config).unwrap();
    let src = dir.join("src");
    fs::create_dir_all(&src).unwrap();
    // A few MiB, like the release binaries.
    write_binaries(&src, |_| vec![0x7f; 4 << 20]);
    Settings::defaults(HostRoot::new(root), src)
}

fn bench_install(fixtures: &Path) {
    let config = fs::read_to_string(fixtures.join("v2-debian-default-1.6/before.toml")).unwrap();
    let containerd = FakeContainerd::new("1.6.20");
    let spec = FixedSpec(vec![b' '; 24 << 10]);
    let hook = FaultHook::none();
    let (mut first, mut again, mut uninstall) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS / 4 {
        let dir = tempfile::tempdir().unwrap();
        let settings = host(dir.path(), &config);
        let installer = Installer {
            settings,
            containerd: &containerd,
            spec: Some(&spec),
            runtime_config: &ShimConfig,
            hook: &hook,
        };
        let t = Instant::now();
        installer.install().expect("install");
        first.push(t.elapsed());
        let restarts = containerd.restarts.get();
        let t = Instant::now();
        installer.install().expect("second install");
        again.push(t.elapsed());
        assert_eq!(containerd.restarts.get(), restarts, "a no-change install must not restart containerd");
        let t = Instant::now();
        installer.uninstall().expect("uninstall");
        uninstall.push(t.elapsed());
    }
    println!("install into a temporary host root (containerd 1.6.20 config, {} runs each)", RUNS / 4);
    println!("  first install            {}", summary(first));
    println!("  no-change install        {}", summary(again));
    println!("  uninstall                {}", summary(uninstall));
}

fn main() {
    let fixtures = fixtures_root();
    bench_plan(&fixtures);
    bench_install(&fixtures);
}
