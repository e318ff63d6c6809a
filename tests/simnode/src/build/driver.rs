//! What a driver root holds: the library table and the small configuration files, as values.
//!
//! The names, SONAMEs and symlinks follow NVIDIA's x86_64 Linux driver as Debian/Ubuntu and the
//! `.run` installer lay it out (driver 550): most libraries have a `.so.1` (or `.so.0`, `.so.2`,
//! `.so.4`) SONAME link; the internal ones (`libnvidia-glcore`, `-eglcore`, `-tls`, `-glsi`,
//! `-glvkspirv`, `-rtcore`, `-gpucomp`, `-pkcs11`, `-wayland-client`, `-vulkan-producer`) use the
//! full versioned file name as their SONAME and get no link. Every library except `libnvidia-ml` is
//! a stub from [`crate::elf`].
//!
//! Where the file list comes from: the package file list of Frugalware's `nvidia 550.54.14-1` and
//! `550.40.07-6` (a repackaging of NVIDIA's 550 `.run`: `usr/lib/vdpau/libvdpau_nvidia.so.<v>`,
//! `xorg/modules/drivers/nvidia_drv.so`, `libglxserver_nvidia.so.<v>`, `libnvidia-egl-wayland.so.1.1.13`,
//! `libnvidia-fbc`, `egl_external_platform.d/10_nvidia_wayland.json`), negativo17's Fedora
//! `nvidia-driver.spec` (`gbm/nvidia-drm_gbm.so`, `libnvidia-ngx`, `libnvidia-opticalflow`,
//! `libnvidia-pkcs11{,-openssl3}`), and the stub set nvidia-ctk 1.20 was recorded against
//! (`cdi/tests/golden/nvidia-ctk-1.20.0/h100x8-graphics.json`).
//!
//! What 550.54.x does and does not ship of the files nvidia-ctk looks for (the evidence, file by
//! file, is in `tests/simnode/README.md`, "The driver's files against a real 550.54.x"). The
//! decisive list is negativo17's build of 550.54.14 (github.com/negativo17/nvidia-driver, commit
//! 22980522fed0): it unpacks
//! NVIDIA's `NVIDIA-Linux-x86_64-550.54.14.run`, copies every `libnv*.so*` into the package and
//! names each in `%files`, so a library the `.run` had and the list lacks would have stopped
//! rpmbuild ("installed but unpackaged"). Shipped, and here: the Xorg modules, the EGL Wayland and
//! GBM platforms (which that build deletes to use Fedora's own; NVIDIA's 550.54.14 README lists
//! them among the installed components) and `libnvidia-api.so.1`. Not shipped, so not here (first
//! in later branches): `libnvidia-egl-xcb`/`-xlib` and `20_nvidia_{xcb,xlib}.json` (560.28.03,
//! negativo17 75994e6c4b76), `libnvidia-sandboxutils` (565.57.01, 2e4a03115222), `libnvidia-nvvm70`
//! (575.51.02, 986976d283d5). The IMEX programs ship for 550.54.15, but in their own package
//! (`nvidia-imex-550`, from NVIDIA's separate `imex-linux-x86_64-550.54.15-archive`;
//! github.com/canonical/apt-packaging-imex, commit a67857cd5fe0): a node has them only when its
//! description lists the package ([`package_binaries`]).

use crate::description::DriverPackage;

/// How a library's SONAME is formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SonameKind {
    /// `lib<X>.so.<N>`, with a SONAME symlink to the versioned file.
    Major(&'static str),
    /// The versioned file name itself; no symlink.
    Versioned,
}

/// The version part of a library's file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileVersion {
    /// The driver version (`libcuda.so.550.54.15`).
    Driver,
    /// A version of its own (`libnvidia-egl-gbm.so.1.1.1` ships outside the driver's numbering).
    Own(&'static str),
}

/// One driver library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverLibrary {
    /// File name stem, e.g. `libcuda`.
    pub stem: &'static str,
    /// How the SONAME is formed.
    pub soname: SonameKind,
    /// Version in the file name.
    pub version: FileVersion,
    /// Also ships the unversioned development link `lib<X>.so -> <SONAME>` (libcuda, from the -dev
    /// package: CUDA applications `dlopen("libcuda.so")`).
    pub dev_link: bool,
}

impl DriverLibrary {
    /// File name for driver `version`, e.g. `libcuda.so.550.54.15`.
    pub fn file_name(&self, driver_version: &str) -> String {
        match self.version {
            FileVersion::Driver => format!("{}.so.{driver_version}", self.stem),
            FileVersion::Own(v) => format!("{}.so.{v}", self.stem),
        }
    }

    /// SONAME for driver `version`, e.g. `libcuda.so.1`.
    pub fn soname(&self, driver_version: &str) -> String {
        match self.soname {
            SonameKind::Major(n) => format!("{}.so.{n}", self.stem),
            SonameKind::Versioned => self.file_name(driver_version),
        }
    }
}

const fn lib(stem: &'static str, soname: SonameKind) -> DriverLibrary {
    DriverLibrary { stem, soname, version: FileVersion::Driver, dev_link: false }
}

/// The stem of the NVML library, which is the simulated NVML rather than a stub.
pub const NVML_STEM: &str = "libnvidia-ml";

/// Every library the driver root holds.
pub const LIBRARIES: &[DriverLibrary] = &[
    DriverLibrary {
        stem: "libcuda",
        soname: SonameKind::Major("1"),
        version: FileVersion::Driver,
        dev_link: true,
    },
    lib(NVML_STEM, SonameKind::Major("1")),
    lib("libnvidia-ptxjitcompiler", SonameKind::Major("1")),
    lib("libnvidia-nvvm", SonameKind::Major("4")),
    lib("libnvidia-cfg", SonameKind::Major("1")),
    lib("libnvidia-gpucomp", SonameKind::Versioned),
    lib("libnvidia-allocator", SonameKind::Major("1")),
    lib("libnvidia-opencl", SonameKind::Major("1")),
    lib("libnvidia-encode", SonameKind::Major("1")),
    lib("libnvcuvid", SonameKind::Major("1")),
    lib("libcudadebugger", SonameKind::Major("1")),
    lib("libEGL_nvidia", SonameKind::Major("0")),
    lib("libGLESv2_nvidia", SonameKind::Major("2")),
    lib("libGLESv1_CM_nvidia", SonameKind::Major("1")),
    lib("libGLX_nvidia", SonameKind::Major("0")),
    lib("libnvidia-eglcore", SonameKind::Versioned),
    lib("libnvidia-glcore", SonameKind::Versioned),
    lib("libnvidia-tls", SonameKind::Versioned),
    lib("libnvidia-glsi", SonameKind::Versioned),
    lib("libnvidia-glvkspirv", SonameKind::Versioned),
    lib("libnvidia-rtcore", SonameKind::Versioned),
    lib("libnvoptix", SonameKind::Major("1")),
    lib("libnvidia-fbc", SonameKind::Major("1")),
    lib("libnvidia-ngx", SonameKind::Major("1")),
    lib("libnvidia-opticalflow", SonameKind::Major("1")),
    lib("libnvidia-pkcs11", SonameKind::Versioned),
    lib("libnvidia-pkcs11-openssl3", SonameKind::Versioned),
    lib("libnvidia-wayland-client", SonameKind::Versioned),
    // The `.run` installer also makes `libnvidia-vulkan-producer.so -> .so.<version>`. 550 itself
    // no longer ships it (negativo17 dropped it at 545.23.06, NVIDIA's yum packaging in its 550
    // branch); kept because nvidia-ctk's recorded spec was made on a node that had it.
    DriverLibrary {
        stem: "libnvidia-vulkan-producer",
        soname: SonameKind::Versioned,
        version: FileVersion::Driver,
        dev_link: true,
    },
    // Named by 10_nvidia_wayland.json.
    DriverLibrary {
        stem: "libnvidia-egl-wayland",
        soname: SonameKind::Major("1"),
        version: FileVersion::Own("1.1.13"),
        dev_link: false,
    },
    // Named by 15_nvidia_gbm.json; without it that file would point at nothing.
    DriverLibrary {
        stem: "libnvidia-egl-gbm",
        soname: SonameKind::Major("1"),
        version: FileVersion::Own("1.1.1"),
        dev_link: false,
    },
    // NvAPI: the `.run` ships it only as `libnvidia-api.so.1` (negativo17's 550.54.14 `%files`;
    // NVIDIA's own yum packaging, branch 550).
    DriverLibrary {
        stem: "libnvidia-api",
        soname: SonameKind::Versioned,
        version: FileVersion::Own("1"),
        dev_link: false,
    },
];

/// The VDPAU driver, in `vdpau/` under the library folder (outside the ld.so.conf folders, so
/// not in the ld.so.cache: VDPAU's loader opens it by path), with its `.so.1` SONAME link.
pub const VDPAU: DriverLibrary = lib("libvdpau_nvidia", SonameKind::Major("1"));

/// The folder of [`VDPAU`], under the library folder.
pub const VDPAU_DIR: &str = "vdpau";

/// Links under the library folder: `(link, target)`. GBM's loader finds NVIDIA's backend as
/// `gbm/nvidia-drm_gbm.so`, a link to the allocator library.
pub const LIB_DIR_LINKS: &[(&str, &str)] = &[("gbm/nvidia-drm_gbm.so", "../libnvidia-allocator.so.1")];

/// Xorg's module folder, inside the driver root (the `.run` installer's default).
pub const XORG_MODULES_DIR: &str = "usr/lib/xorg/modules";

/// Pairs of paths or names: `(path, SONAME)` or `(link, target)`.
pub type Pairs = Vec<(String, String)>;

/// The Xorg driver and GLX server module, relative to [`XORG_MODULES_DIR`], for driver `version`:
/// `(path, SONAME)`, plus the unversioned `libglxserver_nvidia.so` link the installer makes.
pub fn xorg_modules(version: &str) -> (Pairs, Pairs) {
    let glx = format!("libglxserver_nvidia.so.{version}");
    (
        vec![
            ("drivers/nvidia_drv.so".into(), "nvidia_drv.so".into()),
            (format!("extensions/{glx}"), glx.clone()),
        ],
        vec![("extensions/libglxserver_nvidia.so".into(), glx)],
    )
}

/// Programs in `usr/bin`. The first is the `nvidia-smi` stand-in; the others are copies of it
/// that, called by these names, say what they are and exit 0.
pub const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-xconfig",
];

/// The programs `nvidia-imex-<branch>` installs in `usr/bin`: the IMEX daemon and its control tool
/// (NVIDIA's IMEX guide: the package installs the `nvidia-imex` service and `nvidia-imex-ctl`).
pub const IMEX_BINARIES: [&str; 2] = ["nvidia-imex", "nvidia-imex-ctl"];

/// Programs in `usr/bin` that a separately installed package adds: copies of the stand-in, like
/// [`BINARIES`].
pub fn package_binaries(package: DriverPackage) -> &'static [&'static str] {
    match package {
        DriverPackage::Imex => &IMEX_BINARIES,
    }
}

/// GSP firmware images under `lib/firmware/nvidia/<version>/`.
pub const FIRMWARE: &[&str] = &["gsp_ga10x.bin", "gsp_tu10x.bin"];

/// Vulkan API version the 550 driver's ICD manifest announces.
const VULKAN_API_VERSION: &str = "1.3.277";

/// Small configuration files, as `(path relative to the driver root, contents)`.
pub fn config_files(driver_version: &str) -> Vec<(String, String)> {
    let icd = format!(
        "{{\n    \"file_format_version\" : \"1.0.1\",\n    \"ICD\": {{\n        \"library_path\": \
         \"libGLX_nvidia.so.0\",\n        \"api_version\" : \"{VULKAN_API_VERSION}\"\n    }}\n}}\n"
    );
    let layers = format!(
        "{{\n    \"file_format_version\" : \"1.0.1\",\n    \"layer\": {{\n        \"name\": \
         \"VK_LAYER_NV_optimus\",\n        \"type\": \"INSTANCE\",\n        \"library_path\": \
         \"libGLX_nvidia.so.0\",\n        \"api_version\" : \"{VULKAN_API_VERSION}\",\n        \
         \"implementation_version\" : \"1\",\n        \"description\" : \"NVIDIA Optimus layer\",\n        \
         \"functions\": {{\n            \"vkGetInstanceProcAddr\": \"vk_optimusGetInstanceProcAddr\",\n            \
         \"vkGetDeviceProcAddr\": \"vk_optimusGetDeviceProcAddr\"\n        }},\n        \
         \"enable_environment\": {{\n            \"__NV_PRIME_RENDER_OFFLOAD\": \"1\"\n        }},\n        \
         \"disable_environment\": {{\n            \"DISABLE_LAYER_NV_OPTIMUS_1\": \"\"\n        }}\n    }}\n}}\n"
    );
    let egl_vendor = "{\n    \"file_format_version\" : \"1.0.0\",\n    \"ICD\" : {\n        \
                      \"library_path\" : \"libEGL_nvidia.so.0\"\n    }\n}\n";
    let gbm = "{\n    \"file_format_version\" : \"1.0.0\",\n    \"ICD\" : {\n        \
               \"library_path\" : \"libnvidia-egl-gbm.so.1\"\n    }\n}\n";
    let wayland = "{\n    \"file_format_version\" : \"1.0.0\",\n    \"ICD\" : {\n        \
                   \"library_path\" : \"libnvidia-egl-wayland.so.1\"\n    }\n}\n";
    vec![
        ("usr/share/vulkan/icd.d/nvidia_icd.json".into(), icd),
        ("usr/share/vulkan/implicit_layer.d/nvidia_layers.json".into(), layers),
        ("usr/share/glvnd/egl_vendor.d/10_nvidia.json".into(), egl_vendor.into()),
        ("usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json".into(), wayland.into()),
        ("usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json".into(), gbm.into()),
        ("etc/OpenCL/vendors/nvidia.icd".into(), "libnvidia-opencl.so.1\n".into()),
        // The real file is an opaque blob the OptiX library reads; only its presence matters here.
        ("usr/share/nvidia/nvoptix.bin".into(), format!("nvinject simulated nvoptix.bin {driver_version}\n")),
    ]
}

/// Contents of a simulated GSP firmware image: a marker saying what it stands for.
pub fn firmware_image(name: &str, driver_version: &str) -> String {
    format!("nvinject simulated GSP firmware {name} for driver {driver_version}\n")
}

/// `etc/ld.so.conf` as Debian ships it.
pub const LD_SO_CONF: &str = "include /etc/ld.so.conf.d/*.conf\n\n";

/// `etc/ld.so.conf.d/<triple>.conf` as Debian ships it.
pub fn multiarch_conf(triple: &str) -> String {
    format!("# Multiarch support\n/usr/local/lib/{triple}\n/lib/{triple}\n/usr/lib/{triple}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sonames_and_file_names() {
        let by_stem = |s: &str| LIBRARIES.iter().find(|l| l.stem == s).unwrap();
        assert_eq!(by_stem("libcuda").soname("550.54.15"), "libcuda.so.1");
        assert_eq!(by_stem("libnvidia-nvvm").soname("550.54.15"), "libnvidia-nvvm.so.4");
        assert_eq!(by_stem("libGLESv2_nvidia").soname("550.54.15"), "libGLESv2_nvidia.so.2");
        assert_eq!(by_stem("libnvidia-gpucomp").soname("550.54.15"), "libnvidia-gpucomp.so.550.54.15");
        assert_eq!(by_stem("libnvidia-egl-gbm").file_name("550.54.15"), "libnvidia-egl-gbm.so.1.1.1");
        let stems: std::collections::BTreeSet<_> = LIBRARIES.iter().map(|l| l.stem).collect();
        assert_eq!(stems.len(), LIBRARIES.len(), "a library is listed twice");
    }

    #[test]
    fn config_files_are_valid_json_naming_shipped_libraries() {
        let sonames: Vec<String> = LIBRARIES.iter().map(|l| l.soname("550.54.15")).collect();
        for (path, text) in config_files("550.54.15") {
            if !path.ends_with(".json") {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
            let lib = v.pointer("/ICD/library_path").or_else(|| v.pointer("/layer/library_path")).unwrap();
            assert!(sonames.iter().any(|s| s == lib.as_str().unwrap()), "{path} names {lib}");
        }
    }
}
