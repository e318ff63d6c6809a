//! `NVIDIA_DRIVER_CAPABILITIES`: which parts of the driver a container asks for, and which of the
//! files a CDI spec injects belong to which part. Pure: strings and edits in, decisions out.
//!
//! Semantics are those of NVIDIA's runtime in its legacy mode (nvidia-container-runtime-hook
//! driving libnvidia-container), the mode in which the variable means anything:
//! - unset, empty or naming nothing (`,`): `utility,compute`; unset in a "legacy" CUDA image
//!   (`CUDA_VERSION` set, `NVIDIA_REQUIRE_CUDA` unset or empty): everything;
//! - a comma-separated list of `compat32`, `compute`, `display`, `graphics`, `ngx`, `utility`,
//!   `video` (names trimmed, case-sensitive); `all` anywhere in the list: everything;
//! - any other name refuses the container (NVIDIA's hook panics on it, the start fails);
//! - `video` brings compute's files too and `display` graphics' (libnvidia-container's
//!   `--video` and `--display` flags), and `compat32` only adds the 32-bit copies of what the
//!   other capabilities select.
//!
//! NVIDIA's `jit-cdi` and `cdi` modes ignore the variable and inject the whole spec; so does the
//! shim for CDI requests (see `shim/README.md`).
//!
//! The file table follows libnvidia-container's per-capability lists (`src/nvc_info.c`: utility,
//! compute, video, graphics, ngx libraries and binaries; IPC sockets by capability in
//! `src/nvc_mount.c`) and, for what libnvidia-container never mounts, the toolkit's graphics
//! discoverer (`internal/discover/graphics.go`, gated on graphics or display). A file the table
//! does not know is kept and reported: the filter can only narrow what it understands, never
//! widen, and never silently.

use std::fmt;

use nvinject_cdi::nvinject::{self, Flag, HookKind};
use nvinject_cdi::{ContainerEdits, Hook};

/// The toolkit's variable.
pub const DRIVER_CAPABILITIES_ENV: &str = "NVIDIA_DRIVER_CAPABILITIES";
/// Set by legacy CUDA images; with [`REQUIRE_CUDA_ENV`] unset it makes "unset" mean `all`.
pub const CUDA_VERSION_ENV: &str = "CUDA_VERSION";
/// Set by current CUDA images.
pub const REQUIRE_CUDA_ENV: &str = "NVIDIA_REQUIRE_CUDA";

/// One driver capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Capability {
    /// 32-bit copies of the selected libraries.
    Compat32,
    /// CUDA and OpenCL.
    Compute,
    /// X11 display (brings graphics).
    Display,
    /// OpenGL, EGL, Vulkan, OptiX.
    Graphics,
    /// DLSS (NGX).
    Ngx,
    /// nvidia-smi and NVML.
    Utility,
    /// Video Codec SDK, VDPAU (brings compute).
    Video,
}

impl Capability {
    /// Every capability, in name order.
    pub const ALL: [Capability; 7] = [
        Capability::Compat32,
        Capability::Compute,
        Capability::Display,
        Capability::Graphics,
        Capability::Ngx,
        Capability::Utility,
        Capability::Video,
    ];

    /// The name in `NVIDIA_DRIVER_CAPABILITIES`.
    pub fn name(self) -> &'static str {
        match self {
            Capability::Compat32 => "compat32",
            Capability::Compute => "compute",
            Capability::Display => "display",
            Capability::Graphics => "graphics",
            Capability::Ngx => "ngx",
            Capability::Utility => "utility",
            Capability::Video => "video",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Capabilities(u8);

impl Capabilities {
    /// No capability.
    pub const NONE: Capabilities = Capabilities(0);
    /// Every capability.
    pub const ALL: Capabilities = Capabilities((1 << Capability::ALL.len()) - 1);

    /// `utility,compute`: NVIDIA's default.
    pub fn nvidia_default() -> Capabilities {
        Capabilities::of(&[Capability::Utility, Capability::Compute])
    }

    /// The set of `caps`.
    pub fn of(caps: &[Capability]) -> Capabilities {
        caps.iter().fold(Capabilities::NONE, |set, c| set.with(*c))
    }

    /// This set plus `cap`.
    pub fn with(self, cap: Capability) -> Capabilities {
        Capabilities(self.0 | cap.bit())
    }

    /// Whether `cap` is in the set.
    pub fn contains(self, cap: Capability) -> bool {
        self.0 & cap.bit() != 0
    }

    /// Whether the sets share a capability.
    pub fn intersects(self, other: Capabilities) -> bool {
        self.0 & other.0 != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// What selects files: `video` adds compute and `display` adds graphics, as
    /// libnvidia-container's flags do.
    pub fn effective(self) -> Capabilities {
        let mut set = self;
        if self.contains(Capability::Video) {
            set = set.with(Capability::Compute);
        }
        if self.contains(Capability::Display) {
            set = set.with(Capability::Graphics);
        }
        set
    }
}

impl fmt::Display for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Capabilities::ALL {
            return f.write_str("all");
        }
        if self.is_empty() {
            return f.write_str("none");
        }
        let names: Vec<&str> =
            Capability::ALL.iter().filter(|c| self.contains(**c)).map(|c| c.name()).collect();
        f.write_str(&names.join(","))
    }
}

/// Why the set is what it is (for the log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The variable is unset, empty or names nothing: NVIDIA's default.
    Default,
    /// The variable is unset in a legacy CUDA image: everything.
    LegacyImage,
    /// The variable's value.
    Env,
}

/// The capabilities a container asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requested {
    /// The set as asked (before [`Capabilities::effective`]).
    pub capabilities: Capabilities,
    /// Where it came from.
    pub origin: Origin,
}

impl fmt::Display for Requested {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.origin {
            Origin::Default => write!(f, "{} (default)", self.capabilities),
            Origin::LegacyImage => write!(f, "{} (legacy CUDA image)", self.capabilities),
            Origin::Env => write!(f, "{}", self.capabilities),
        }
    }
}

/// Most characters of an offending name shown in an error: the value is the image's.
const SHOWN_CHARS: usize = 64;

/// A name in `NVIDIA_DRIVER_CAPABILITIES` that is no capability.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{DRIVER_CAPABILITIES_ENV} in the container's environment names unknown driver capability {shown}; \
     set it to a comma-separated list of compat32, compute, display, graphics, ngx, utility, video, \
     or to `all` (unset or empty means utility,compute)"
)]
pub struct CapabilityError {
    /// The name as shown: escaped, and cut at 64 characters with its full length.
    pub shown: String,
}

impl CapabilityError {
    fn new(name: &str) -> CapabilityError {
        let count = name.chars().count();
        let shown = if count > SHOWN_CHARS {
            let cut: String = name.chars().take(SHOWN_CHARS).collect();
            format!("{cut:?}... ({} bytes)", name.len())
        } else {
            format!("{name:?}")
        };
        CapabilityError { shown }
    }
}

/// Parses a value of `NVIDIA_DRIVER_CAPABILITIES` (`None`: unset) for an image whose own
/// environment says whether it is a legacy CUDA image.
pub fn parse(value: Option<&str>, legacy_image: bool) -> Result<Requested, CapabilityError> {
    let Some(value) = value else {
        return Ok(if legacy_image {
            Requested { capabilities: Capabilities::ALL, origin: Origin::LegacyImage }
        } else {
            Requested { capabilities: Capabilities::nvidia_default(), origin: Origin::Default }
        });
    };
    let mut set = Capabilities::NONE;
    let mut all = false;
    let mut unknown = None;
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match Capability::ALL.iter().find(|c| c.name() == name) {
            Some(c) => set = set.with(*c),
            None if name == "all" => all = true,
            // `all` anywhere wins over unknown names, as in NVIDIA's hook; so keep looking.
            None => {
                unknown.get_or_insert(name);
            }
        }
    }
    if all {
        return Ok(Requested { capabilities: Capabilities::ALL, origin: Origin::Env });
    }
    if let Some(name) = unknown {
        return Err(CapabilityError::new(name));
    }
    if set.is_empty() {
        return Ok(Requested { capabilities: Capabilities::nvidia_default(), origin: Origin::Default });
    }
    Ok(Requested { capabilities: set, origin: Origin::Env })
}

/// Reads the capabilities from a process environment (`NAME=value` entries; the last entry of a
/// name wins, as for the process itself).
pub fn from_env<'a>(env: impl IntoIterator<Item = &'a str>) -> Result<Requested, CapabilityError> {
    let (mut caps, mut cuda_version, mut require_cuda) = (None, None, None);
    for entry in env {
        let Some((name, value)) = entry.split_once('=') else { continue };
        match name {
            DRIVER_CAPABILITIES_ENV => caps = Some(value),
            CUDA_VERSION_ENV => cuda_version = Some(value),
            REQUIRE_CUDA_ENV => require_cuda = Some(value),
            _ => {}
        }
    }
    let legacy = cuda_version.is_some_and(|v| !v.is_empty()) && require_cuda.is_none_or(str::is_empty);
    parse(caps, legacy)
}

/// Which capabilities a file belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileClass {
    /// Kept when any of these is selected; empty: kept whatever is selected (firmware).
    pub any_of: Capabilities,
    /// A 32-bit library: kept only with `compat32` as well.
    pub compat32: bool,
}

impl FileClass {
    /// Whether a container with the effective set `selected` gets the file.
    pub fn kept_by(self, selected: Capabilities) -> bool {
        (self.any_of.is_empty() || self.any_of.intersects(selected))
            && (!self.compat32 || selected.contains(Capability::Compat32))
    }
}

/// How a table entry matches a container path.
#[derive(Debug, Clone, Copy)]
enum Pattern {
    /// A library by name: the file is `stem` or `stem.<anything>` (`libcuda.so`, `libcuda.so.1`,
    /// `libcuda.so.550.54.15`).
    Lib(&'static str),
    /// The file name is exactly this.
    File(&'static str),
    /// The file name starts with this.
    FilePrefix(&'static str),
    /// The path lies below a folder ending in this (`/vulkan/icd.d/`).
    Under(&'static str),
    /// The path ends with this.
    Suffix(&'static str),
}

impl Pattern {
    fn matches(self, path: &str, file: &str) -> bool {
        match self {
            Pattern::Lib(stem) => {
                file.strip_prefix(stem).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
            }
            Pattern::File(name) => file == name,
            Pattern::FilePrefix(prefix) => file.starts_with(prefix),
            Pattern::Under(dir) => path.contains(dir),
            Pattern::Suffix(suffix) => path.ends_with(suffix),
        }
    }
}

use Capability::{Compute, Display, Graphics, Ngx, Utility, Video};

const ALWAYS: &[Capability] = &[];
const UTILITY: &[Capability] = &[Utility];
const COMPUTE: &[Capability] = &[Compute];
const VIDEO: &[Capability] = &[Video];
const GRAPHICS: &[Capability] = &[Graphics];
const DISPLAY: &[Capability] = &[Display];
const NGX: &[Capability] = &[Ngx];
const COMPUTE_OR_GRAPHICS: &[Capability] = &[Compute, Graphics];

/// The one table: every driver file a spec may inject, by capability. First match wins.
const TABLE: &[(Pattern, &[Capability])] = &[
    // Firmware: libnvidia-container mounts it whatever the capabilities.
    (Pattern::Under("/firmware/nvidia/"), ALWAYS),
    // WSL's core library: libnvidia-container always selects it.
    (Pattern::Lib("libdxcore.so"), ALWAYS),
    // utility_libs, utility_bins; the daemons' sockets go with utility.
    (Pattern::Lib("libnvidia-ml.so"), UTILITY),
    (Pattern::Lib("libnvidia-cfg.so"), UTILITY),
    (Pattern::Lib("libnvidia-nscq.so"), UTILITY),
    (Pattern::Lib("libnvidia-sandboxutils.so"), UTILITY),
    (Pattern::File("nvidia-smi"), UTILITY),
    (Pattern::File("nvidia-debugdump"), UTILITY),
    (Pattern::File("nvidia-persistenced"), UTILITY),
    (Pattern::File("nv-fabricmanager"), UTILITY),
    (Pattern::File("nvidia-imex"), UTILITY),
    (Pattern::File("nvidia-imex-ctl"), UTILITY),
    (Pattern::Suffix("/nvidia-persistenced/socket"), UTILITY),
    (Pattern::Suffix("/nvidia-fabricmanager/socket"), UTILITY),
    // compute_libs, compute_bins; every other IPC (the MPS pipes) goes with compute.
    (Pattern::Lib("libcuda.so"), COMPUTE),
    (Pattern::Lib("libcudadebugger.so"), COMPUTE),
    (Pattern::Lib("libnvidia-opencl.so"), COMPUTE),
    (Pattern::Lib("libnvidia-gpucomp.so"), COMPUTE),
    (Pattern::Lib("libnvidia-ptxjitcompiler.so"), COMPUTE),
    (Pattern::Lib("libnvidia-fatbinaryloader.so"), COMPUTE),
    (Pattern::Lib("libnvidia-compiler.so"), COMPUTE),
    (Pattern::Lib("libnvidia-pkcs11.so"), COMPUTE),
    (Pattern::Lib("libnvidia-pkcs11-openssl3.so"), COMPUTE),
    (Pattern::Lib("libnvidia-nvvm.so"), COMPUTE),
    (Pattern::Lib("libnvidia-nvvm70.so"), COMPUTE),
    (Pattern::Lib("libnvidia-tileiras.so"), COMPUTE),
    (Pattern::Lib("libOpenCL.so"), COMPUTE),
    (Pattern::File("nvidia-cuda-mps-control"), COMPUTE),
    (Pattern::File("nvidia-cuda-mps-server"), COMPUTE),
    (Pattern::Suffix("/nvidia-mps"), COMPUTE),
    // In compute_libs, and the toolkit's graphics discoverer mounts it for GBM.
    (Pattern::Lib("libnvidia-allocator.so"), COMPUTE_OR_GRAPHICS),
    // The OpenCL ICD names libnvidia-opencl (compute); the toolkit mounts it with graphics.
    (Pattern::Under("/OpenCL/vendors/"), COMPUTE_OR_GRAPHICS),
    // video_libs.
    (Pattern::Lib("libvdpau_nvidia.so"), VIDEO),
    (Pattern::Lib("libnvidia-encode.so"), VIDEO),
    (Pattern::Lib("libnvidia-opticalflow.so"), VIDEO),
    (Pattern::Lib("libnvcuvid.so"), VIDEO),
    // graphics_libs, graphics_libs_glvnd, graphics_libs_compat.
    (Pattern::Lib("libnvidia-eglcore.so"), GRAPHICS),
    (Pattern::Lib("libnvidia-glcore.so"), GRAPHICS),
    (Pattern::Lib("libnvidia-tls.so"), GRAPHICS),
    (Pattern::Lib("libnvidia-glsi.so"), GRAPHICS),
    (Pattern::Lib("libnvidia-fbc.so"), GRAPHICS),
    (Pattern::Lib("libnvidia-ifr.so"), GRAPHICS),
    (Pattern::Lib("libnvidia-rtcore.so"), GRAPHICS),
    (Pattern::Lib("libnvoptix.so"), GRAPHICS),
    (Pattern::Lib("libGLX_nvidia.so"), GRAPHICS),
    (Pattern::Lib("libGLX_indirect.so"), GRAPHICS),
    (Pattern::Lib("libEGL_nvidia.so"), GRAPHICS),
    (Pattern::Lib("libGLESv2_nvidia.so"), GRAPHICS),
    (Pattern::Lib("libGLESv1_CM_nvidia.so"), GRAPHICS),
    (Pattern::Lib("libnvidia-glvkspirv.so"), GRAPHICS),
    (Pattern::Lib("libnvidia-cbl.so"), GRAPHICS),
    (Pattern::Lib("libGL.so"), GRAPHICS),
    (Pattern::Lib("libEGL.so"), GRAPHICS),
    (Pattern::Lib("libGLESv1_CM.so"), GRAPHICS),
    (Pattern::Lib("libGLESv2.so"), GRAPHICS),
    (Pattern::Lib("libGLX.so"), GRAPHICS),
    (Pattern::Lib("libGLdispatch.so"), GRAPHICS),
    (Pattern::Lib("libOpenGL.so"), GRAPHICS),
    // The toolkit's graphics discoverer: EGL platform libraries, Vulkan producer, Wayland
    // client, NvAPI, the GBM backend link, Xorg modules, nvidia-xconfig and the config files.
    (Pattern::Lib("libnvidia-egl-gbm.so"), GRAPHICS),
    (Pattern::Lib("libnvidia-egl-wayland.so"), GRAPHICS),
    (Pattern::Lib("libnvidia-egl-wayland2.so"), GRAPHICS),
    (Pattern::Lib("libnvidia-egl-xcb.so"), GRAPHICS),
    (Pattern::Lib("libnvidia-egl-xlib.so"), GRAPHICS),
    (Pattern::Lib("libnvidia-vulkan-producer.so"), GRAPHICS),
    (Pattern::Lib("libnvidia-wayland-client.so"), GRAPHICS),
    (Pattern::Lib("libnvidia-api.so"), GRAPHICS),
    (Pattern::File("nvidia-drm_gbm.so"), GRAPHICS),
    (Pattern::File("nvidia_drv.so"), GRAPHICS),
    (Pattern::Lib("libglxserver_nvidia.so"), GRAPHICS),
    (Pattern::File("nvidia-xconfig"), GRAPHICS),
    (Pattern::Under("/vulkan/icd.d/"), GRAPHICS),
    (Pattern::Under("/vulkan/implicit_layer.d/"), GRAPHICS),
    (Pattern::Under("/glvnd/egl_vendor.d/"), GRAPHICS),
    (Pattern::Under("/egl/egl_external_platform.d/"), GRAPHICS),
    (Pattern::Under("/X11/xorg.conf.d/"), GRAPHICS),
    (Pattern::File("nvoptix.bin"), GRAPHICS),
    (Pattern::FilePrefix("nvidia-application-profiles"), GRAPHICS),
    // What libnvidia-container calls display libraries (nvidia-settings' GTK front ends, the
    // X server's wrapped framebuffer).
    (Pattern::Lib("libnvidia-gtk2.so"), DISPLAY),
    (Pattern::Lib("libnvidia-gtk3.so"), DISPLAY),
    (Pattern::Lib("libnvidia-wfb.so"), DISPLAY),
    // ngx_libs, and NGX's Windows DLLs for Proton/Wine.
    (Pattern::Lib("libnvidia-ngx.so"), NGX),
    (Pattern::Under("/nvidia/wine/"), NGX),
];

/// Folders that hold only 32-bit libraries (Debian's and the `lib32` convention). RPM's
/// `/usr/lib` is ambiguous without reading the ELF class, so its libraries count as 64-bit.
const LIB32_COMPONENTS: [&str; 3] = ["/lib32/", "/i386-linux-gnu/", "/i686-linux-gnu/"];

/// The class of the file a spec puts at `container_path`, or `None` for a file the table does
/// not know.
pub fn classify(container_path: &str) -> Option<FileClass> {
    let path = container_path.trim_end_matches('/');
    let file = path.rsplit('/').next().unwrap_or(path);
    let (_, caps) = TABLE.iter().find(|(pattern, _)| pattern.matches(path, file))?;
    let compat32 = LIB32_COMPONENTS.iter().any(|c| path.contains(c));
    Some(FileClass { any_of: Capabilities::of(caps), compat32 })
}

/// What [`filter_edits`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filtered {
    /// Mounts, links and ld-cache folders left out, as container paths (hooks by subcommand).
    pub left_out: Vec<String>,
    /// Files and hooks kept because the table does not know them.
    pub unclassified: Vec<String>,
}

/// The hook binaries whose subcommands are understood: ours and NVIDIA's.
const HOOK_PROGRAMS: [&str; 3] = [nvinject::HOOK_PROGRAM, nvinject::NVIDIA_CDI_HOOK, nvinject::NVIDIA_CTK];

/// Hook subcommands that belong to a capability (the rest of a known hook program's subcommands
/// with files are handled by their arguments).
fn hook_class(subcommand: &str) -> Option<&'static [Capability]> {
    match subcommand {
        s if s == HookKind::EnableCudaCompat.as_str() => Some(COMPUTE),
        s if s == HookKind::UpdateApplicationProfile.as_str() => Some(GRAPHICS),
        s if s == HookKind::DisableDeviceNodeModification.as_str() => Some(ALWAYS),
        "chmod" => Some(ALWAYS),
        _ => None,
    }
}

/// Where a known hook's subcommand is in its argv: `nvidia-ctk hook <sub>`, else `<prog> <sub>`.
fn subcommand_index(hook: &Hook) -> Option<usize> {
    let program = hook.path.rsplit('/').next().unwrap_or(&hook.path);
    if !HOOK_PROGRAMS.contains(&program) {
        return None;
    }
    let index = if hook.args.get(1).map(String::as_str) == Some(nvinject::NVIDIA_CTK_HOOK) { 2 } else { 1 };
    (index < hook.args.len()).then_some(index)
}

/// Removes from `edits` the mounts, links, ld-cache folders and capability-bound hooks that the
/// effective set of `requested` does not select. Device nodes, environment and hooks it does not
/// understand stay as they are, so the result is always a subset of what the spec gave.
pub fn filter_edits(edits: &mut ContainerEdits, requested: Capabilities) -> Filtered {
    let selected = requested.effective();
    let mut out = Filtered::default();
    let keep_path = |path: &str, out: &mut Filtered| match classify(path) {
        Some(class) => class.kept_by(selected),
        None => {
            out.unclassified.push(path.to_owned());
            true
        }
    };

    // Folders that had injected files before and after, for the ld-cache folders.
    let mut had_files: Vec<String> = Vec::new();
    let mut has_files: Vec<String> = Vec::new();
    let parent =
        |p: &str| p.rsplit_once('/').map(|(d, _)| if d.is_empty() { "/" } else { d }).map(str::to_owned);

    edits.mounts.retain(|m| {
        let path = m.container_path.as_str();
        let kept = keep_path(path, &mut out);
        had_files.extend(parent(path));
        if kept {
            has_files.extend(parent(path));
        } else {
            out.left_out.push(path.to_owned());
        }
        kept
    });

    // Links first: the ld-cache folders then count the links that stay.
    for hook in &mut edits.hooks {
        let Some(sub) = subcommand_index(hook) else { continue };
        if hook.args[sub] != HookKind::CreateSymlinks.as_str() {
            continue;
        }
        filter_values(
            hook,
            sub,
            Flag::Link,
            |value, out| {
                let (target, link) = value.split_once("::").unwrap_or(("", value));
                // Device links (/dev/dri/by-path) go with their device nodes, which are never filtered.
                if link.starts_with("/dev/") {
                    return true;
                }
                let target_file = target.rsplit('/').next().unwrap_or(target);
                let (own, of_target) = (classify(link), classify(target_file));
                let kept = match (own, of_target) {
                    (None, None) => {
                        out.unclassified.push(link.to_owned());
                        true
                    }
                    // A link stays only where what it points at stays too: no dangling links.
                    (own, of_target) => {
                        own.is_none_or(|c| c.kept_by(selected))
                            && of_target.is_none_or(|c| c.kept_by(selected))
                    }
                };
                had_files.extend(parent(link));
                if kept {
                    has_files.extend(parent(link));
                } else {
                    out.left_out.push(link.to_owned());
                }
                kept
            },
            &mut out,
        );
    }

    edits.hooks.retain_mut(|hook| {
        let Some(sub) = subcommand_index(hook) else { return true };
        let name = hook.args[sub].clone();
        // NVIDIA's create-soname-symlinks takes update-ldcache's `--folder`s.
        let takes_folders = name == HookKind::UpdateLdcache.as_str() || name == "create-soname-symlinks";
        match name.as_str() {
            n if n == HookKind::CreateSymlinks.as_str() => has_values(hook, sub, Flag::Link),
            _ if takes_folders => {
                let before = has_values(hook, sub, Flag::Folder);
                filter_values(
                    hook,
                    sub,
                    Flag::Folder,
                    |folder, out| {
                        let folder = folder.trim_end_matches('/');
                        // A folder no injected file was in is not ours to judge.
                        let kept =
                            !had_files.iter().any(|d| d == folder) || has_files.iter().any(|d| d == folder);
                        if !kept {
                            out.left_out.push(format!("{name} --folder {folder}"));
                        }
                        kept
                    },
                    &mut out,
                );
                !before || has_values(hook, sub, Flag::Folder)
            }
            other => match hook_class(other) {
                Some(caps) => {
                    let kept =
                        FileClass { any_of: Capabilities::of(caps), compat32: false }.kept_by(selected);
                    if !kept {
                        out.left_out.push(format!("hook {other}"));
                    }
                    kept
                }
                None => {
                    out.unclassified.push(format!("hook {other}"));
                    true
                }
            },
        }
    });
    out
}

/// Whether the hook still has a `flag` value (`--flag v` or `--flag=v`).
fn has_values(hook: &Hook, sub: usize, flag: Flag) -> bool {
    let flag = flag.long();
    let with_eq = format!("{flag}=");
    hook.args[sub + 1..].iter().any(|a| a == flag || a.starts_with(&with_eq))
}

/// Keeps the `flag` values of the hook's arguments for which `keep` says so, in either form
/// (`--flag v`, `--flag=v`); every other argument stays where it is.
fn filter_values(
    hook: &mut Hook,
    sub: usize,
    flag: Flag,
    mut keep: impl FnMut(&str, &mut Filtered) -> bool,
    out: &mut Filtered,
) {
    let flag = flag.long();
    let with_eq = format!("{flag}=");
    let mut args = Vec::with_capacity(hook.args.len());
    let mut rest = std::mem::take(&mut hook.args).into_iter();
    args.extend(rest.by_ref().take(sub + 1));
    while let Some(arg) = rest.next() {
        if arg == flag {
            match rest.next() {
                Some(value) => {
                    if keep(&value, out) {
                        args.push(arg);
                        args.push(value);
                    }
                }
                // A trailing flag without a value: the hook's problem, passed on as it came.
                None => args.push(arg),
            }
        } else if let Some(value) = arg.strip_prefix(&with_eq) {
            if keep(value, out) {
                args.push(arg);
            }
        } else {
            args.push(arg);
        }
    }
    hook.args = args;
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvinject_cdi::codec::{Format, parse as parse_spec};
    use nvinject_cdi::{Mount, Spec};
    use std::path::{Path, PathBuf};

    use Capability::Compat32;

    fn caps(names: &[Capability]) -> Capabilities {
        Capabilities::of(names)
    }

    fn ok(value: Option<&str>) -> Requested {
        parse(value, false).unwrap_or_else(|e| panic!("{value:?}: {e}"))
    }

    #[test]
    fn unset_empty_and_nameless_values_mean_utility_compute() {
        for value in [None, Some(""), Some(" "), Some(","), Some(" , ,")] {
            let r = ok(value);
            assert_eq!(r.capabilities, caps(&[Utility, Compute]), "{value:?}");
            assert_eq!(r.origin, Origin::Default, "{value:?}");
        }
        assert_eq!(ok(None).to_string(), "compute,utility (default)");
    }

    #[test]
    fn unset_in_a_legacy_cuda_image_means_all_but_a_value_still_wins() {
        let r = parse(None, true).unwrap();
        assert_eq!((r.capabilities, r.origin), (Capabilities::ALL, Origin::LegacyImage));
        assert_eq!(parse(Some("utility"), true).unwrap().capabilities, caps(&[Utility]));
        // Empty is not unset: NVIDIA's default, even in a legacy image.
        assert_eq!(parse(Some(""), true).unwrap().capabilities, Capabilities::nvidia_default());
    }

    #[test]
    fn lists_are_trimmed_deduplicated_and_all_wins() {
        assert_eq!(ok(Some("utility")).capabilities, caps(&[Utility]));
        assert_eq!(ok(Some(" compute , utility,compute")).capabilities, caps(&[Utility, Compute]));
        assert_eq!(ok(Some("video,,display")).capabilities, caps(&[Video, Display]));
        for all in ["all", " all ", "utility,all", "compute,all,bogus", "bogus,all"] {
            assert_eq!(ok(Some(all)).capabilities, Capabilities::ALL, "{all:?}");
        }
        let every = "compat32,compute,display,graphics,ngx,utility,video";
        assert_eq!(ok(Some(every)).capabilities, Capabilities::ALL);
        assert_eq!(Capabilities::ALL.to_string(), "all");
        assert_eq!(caps(&[Video, Utility]).to_string(), "utility,video");
    }

    #[test]
    fn unknown_names_are_refused_naming_the_name_and_the_fix() {
        for (value, name) in [
            ("bogus", "bogus"),
            ("compute,Utility", "Utility"),
            ("none", "none"),
            ("compute;utility", "compute;utility"),
        ] {
            let e = parse(Some(value), false).unwrap_err();
            let text = e.to_string();
            assert!(text.contains(&format!("{name:?}")), "{text}");
            assert!(
                text.contains("NVIDIA_DRIVER_CAPABILITIES") && text.contains("utility,compute"),
                "{text}"
            );
        }
    }

    #[test]
    fn hostile_values_give_a_short_escaped_error() {
        let huge = "x".repeat(1 << 20);
        let e = parse(Some(&huge), false).unwrap_err();
        assert!(e.shown.len() < 100, "{}", e.shown);
        assert!(e.shown.contains("1048576 bytes"), "{}", e.shown);
        let odd = "\u{0}\n\u{1b}[31mred\u{7f}";
        let text = parse(Some(odd), false).unwrap_err().to_string();
        assert!(!text.chars().any(|c| c.is_control()), "{text:?}");
        // Long lists of valid names are just long lists.
        let long = "compute,".repeat(100_000);
        assert_eq!(ok(Some(&long)).capabilities, caps(&[Compute]));
        // Multibyte names are cut on a character boundary.
        let wide = "é".repeat(200);
        assert!(parse(Some(&wide), false).unwrap_err().shown.contains("400 bytes"));
    }

    #[test]
    fn the_environment_is_read_as_the_process_sees_it() {
        let r =
            from_env(["PATH=/bin", "NVIDIA_DRIVER_CAPABILITIES=all", "NVIDIA_DRIVER_CAPABILITIES=utility"])
                .unwrap();
        assert_eq!(r.capabilities, caps(&[Utility]));
        // A longer name is another variable.
        assert_eq!(from_env(["NVIDIA_DRIVER_CAPABILITIES_X=all"]).unwrap().origin, Origin::Default);
        assert_eq!(from_env(["CUDA_VERSION=9.0"]).unwrap().origin, Origin::LegacyImage);
        assert_eq!(
            from_env(["CUDA_VERSION=9.0", "NVIDIA_REQUIRE_CUDA="]).unwrap().origin,
            Origin::LegacyImage
        );
        for not_legacy in [
            &["CUDA_VERSION=12.4", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"][..],
            &["CUDA_VERSION="][..],
            &["NVIDIA_REQUIRE_CUDA=cuda>=12.4"][..],
        ] {
            assert_eq!(
                from_env(not_legacy.iter().copied()).unwrap().origin,
                Origin::Default,
                "{not_legacy:?}"
            );
        }
        assert!(from_env(["NVIDIA_DRIVER_CAPABILITIES=gpu"]).is_err());
    }

    #[test]
    fn video_brings_compute_and_display_brings_graphics() {
        assert_eq!(caps(&[Video]).effective(), caps(&[Video, Compute]));
        assert_eq!(caps(&[Display]).effective(), caps(&[Display, Graphics]));
        assert_eq!(caps(&[Utility, Ngx]).effective(), caps(&[Utility, Ngx]));
    }

    /// NVIDIA's lists, pinned one file each (libnvidia-container `nvc_info.c`, `nvc_mount.c`;
    /// the toolkit's `discover/graphics.go`).
    #[test]
    fn files_belong_to_nvidia_s_capabilities() {
        let lib = "/usr/lib/x86_64-linux-gnu";
        let cases: &[(String, &[Capability], bool)] = &[
            (format!("{lib}/libcuda.so.550.54.15"), COMPUTE, false),
            (format!("{lib}/libcuda.so"), COMPUTE, false),
            (format!("{lib}/libnvidia-ml.so.1"), UTILITY, false),
            (format!("{lib}/libnvidia-cfg.so.550.54.15"), UTILITY, false),
            (format!("{lib}/libnvidia-ptxjitcompiler.so.550.54.15"), COMPUTE, false),
            (format!("{lib}/libnvidia-nvvm.so.4"), COMPUTE, false),
            (format!("{lib}/libnvidia-nvvm70.so.4"), COMPUTE, false),
            (format!("{lib}/libnvidia-pkcs11-openssl3.so.550.54.15"), COMPUTE, false),
            (format!("{lib}/libnvidia-allocator.so.1"), COMPUTE_OR_GRAPHICS, false),
            (format!("{lib}/libnvcuvid.so.550.54.15"), VIDEO, false),
            (format!("{lib}/libnvidia-opticalflow.so"), VIDEO, false),
            (format!("{lib}/vdpau/libvdpau_nvidia.so.550.54.15"), VIDEO, false),
            (format!("{lib}/libGLX_nvidia.so.550.54.15"), GRAPHICS, false),
            (format!("{lib}/libGLX_indirect.so.0"), GRAPHICS, false),
            (format!("{lib}/libnvoptix.so.1"), GRAPHICS, false),
            (format!("{lib}/libnvidia-egl-gbm.so.1.1.1"), GRAPHICS, false),
            (format!("{lib}/gbm/nvidia-drm_gbm.so"), GRAPHICS, false),
            (format!("{lib}/libnvidia-ngx.so.550.54.15"), NGX, false),
            (format!("{lib}/nvidia/wine/nvngx.dll"), NGX, false),
            (format!("{lib}/libnvidia-gtk3.so.550.54.15"), DISPLAY, false),
            ("/usr/lib/i386-linux-gnu/libcuda.so.550.54.15".into(), COMPUTE, true),
            ("/usr/lib32/libGLX_nvidia.so.0".into(), GRAPHICS, true),
            ("/usr/bin/nvidia-smi".into(), UTILITY, false),
            ("/usr/bin/nvidia-persistenced".into(), UTILITY, false),
            ("/usr/bin/nvidia-cuda-mps-server".into(), COMPUTE, false),
            ("/usr/bin/nvidia-xconfig".into(), GRAPHICS, false),
            ("/run/nvidia-persistenced/socket".into(), UTILITY, false),
            ("/var/run/nvidia-fabricmanager/socket".into(), UTILITY, false),
            ("/tmp/nvidia-mps".into(), COMPUTE, false),
            ("/tmp/nvidia-mps/".into(), COMPUTE, false),
            ("/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin".into(), ALWAYS, false),
            ("/etc/OpenCL/vendors/nvidia.icd".into(), COMPUTE_OR_GRAPHICS, false),
            ("/etc/vulkan/icd.d/nvidia_icd.json".into(), GRAPHICS, false),
            ("/usr/lib/xorg/modules/drivers/nvidia_drv.so".into(), GRAPHICS, false),
            ("/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.550.54.15".into(), GRAPHICS, false),
        ];
        for (path, want, compat32) in cases {
            let class = classify(path).unwrap_or_else(|| panic!("{path} unclassified"));
            assert_eq!(class, FileClass { any_of: Capabilities::of(want), compat32: *compat32 }, "{path}");
        }
        // Names that only look alike are not classified by accident.
        for unknown in
            ["/usr/lib/libcudart.so.12", "/usr/lib/libGLU.so.1", "/opt/app/nvidia-smi.txt", "/etc/passwd"]
        {
            assert_eq!(classify(unknown), None, "{unknown}");
        }
        assert!(classify("/usr/lib/libcuda.so.550").unwrap().kept_by(caps(&[Compute])));
        assert!(!classify("/usr/lib/libcuda.so.550").unwrap().kept_by(caps(&[Utility])));
        // 32-bit needs compat32 and its own capability.
        let c32 = classify("/usr/lib/i386-linux-gnu/libcuda.so.1").unwrap();
        assert!(!c32.kept_by(caps(&[Compute])) && !c32.kept_by(caps(&[Compat32])));
        assert!(c32.kept_by(caps(&[Compute, Compat32])));
    }

    fn repo(path: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
    }

    fn load(path: &str) -> Spec {
        let p = repo(path);
        let format = if path.ends_with(".json") { Format::Json } else { Format::Yaml };
        parse_spec(&std::fs::read(&p).unwrap(), format, &p).unwrap()
    }

    /// Our goldens (nvinject-cdi generate on the simulated node) and NVIDIA's (nvidia-ctk 1.20;
    /// its management mode derived from its source).
    const GOLDENS: [&str; 8] = [
        "cdi-gen/tests/golden/single.yaml",
        "cdi-gen/tests/golden/h100x8.yaml",
        "cdi-gen/tests/golden/a100-mig.yaml",
        "cdi/tests/golden/nvidia-ctk-1.20.0/h100x8.json",
        "cdi/tests/golden/nvidia-ctk-1.20.0/a100-mig.json",
        "cdi/tests/golden/nvidia-ctk-1.20.0/h100x8-graphics.json",
        "cdi/tests/golden/nvidia-ctk-1.20.0-derived/h100x8-management.json",
        "cdi/tests/golden/nvidia-ctk-1.20.0-derived/a100-mig-management.json",
    ];

    /// The common edits plus every device's, as the shim gathers them.
    fn all_edits(spec: &Spec) -> ContainerEdits {
        let mut edits = spec.container_edits.clone();
        for d in &spec.devices {
            edits.append(&d.container_edits);
        }
        edits
    }

    #[test]
    fn every_file_of_our_specs_and_nvidia_s_is_classified() {
        for golden in GOLDENS {
            let spec = load(golden);
            let mut edits = all_edits(&spec);
            assert!(!edits.mounts.is_empty(), "{golden}");
            for m in &edits.mounts {
                assert!(classify(&m.container_path).is_some(), "{golden}: {} unclassified", m.container_path);
            }
            // With every capability nothing is left out and nothing is unknown: links, folders
            // and hook subcommands included.
            let before = edits.clone();
            let filtered = filter_edits(&mut edits, Capabilities::ALL);
            assert_eq!(filtered, Filtered::default(), "{golden}");
            assert_eq!(edits, before, "{golden}");
        }
        // What cdi-gen looks for, whether or not the simulated node has it.
        use nvinject_cdi_gen::driver::{BINARIES, CONFIG_FILES, IPC_PATHS, OWN_VERSION_LIBRARIES};
        let own: Vec<String> =
            OWN_VERSION_LIBRARIES.iter().map(|l| format!("/usr/lib/{l}.so.1.1.1")).collect();
        let bins: Vec<String> = BINARIES.iter().map(|b| format!("/usr/bin/{b}")).collect();
        for path in own.iter().chain(&bins).map(String::as_str).chain(CONFIG_FILES).chain(IPC_PATHS) {
            assert!(classify(path).is_some(), "{path} unclassified");
        }
        // Every `.so.550.54.15` a 550 driver installs (the .run's file list), and its own-version
        // libraries.
        for lib in [
            "libEGL_nvidia",
            "libGLESv1_CM_nvidia",
            "libGLESv2_nvidia",
            "libGLX_nvidia",
            "libcuda",
            "libcudadebugger",
            "libnvcuvid",
            "libnvidia-allocator",
            "libnvidia-api",
            "libnvidia-cfg",
            "libnvidia-eglcore",
            "libnvidia-encode",
            "libnvidia-fbc",
            "libnvidia-glcore",
            "libnvidia-glsi",
            "libnvidia-glvkspirv",
            "libnvidia-gpucomp",
            "libnvidia-gtk2",
            "libnvidia-gtk3",
            "libnvidia-ml",
            "libnvidia-ngx",
            "libnvidia-nvvm",
            "libnvidia-opencl",
            "libnvidia-opticalflow",
            "libnvidia-pkcs11",
            "libnvidia-pkcs11-openssl3",
            "libnvidia-ptxjitcompiler",
            "libnvidia-rtcore",
            "libnvidia-tls",
            "libnvidia-wayland-client",
            "libnvidia-vulkan-producer",
            "libnvoptix",
            "libvdpau_nvidia",
            "libnvidia-wfb",
            "libglxserver_nvidia",
            "libnvidia-sandboxutils",
            "libnvidia-egl-wayland",
            "libnvidia-egl-gbm",
            "libnvidia-nvvm70",
        ] {
            let path = format!("/usr/lib/x86_64-linux-gnu/{lib}.so.550.54.15");
            assert!(classify(&path).is_some(), "{path} unclassified");
        }
    }

    fn nvidia_graphics() -> ContainerEdits {
        all_edits(&load("cdi/tests/golden/nvidia-ctk-1.20.0/h100x8-graphics.json"))
    }

    fn mounted(edits: &ContainerEdits) -> Vec<String> {
        edits.mounts.iter().map(|m| m.container_path.rsplit('/').next().unwrap().to_owned()).collect()
    }

    fn links(edits: &ContainerEdits) -> Vec<String> {
        edits
            .hooks
            .iter()
            .filter(|h| h.args.get(1).map(String::as_str) == Some("create-symlinks"))
            .flat_map(|h| h.args.iter().filter(|a| a.contains("::")).cloned())
            .collect()
    }

    fn subcommands(edits: &ContainerEdits) -> Vec<&str> {
        edits.hooks.iter().map(|h| h.args[1].as_str()).collect()
    }

    fn folders(edits: &ContainerEdits) -> Vec<&str> {
        edits
            .hooks
            .iter()
            .filter(|h| h.args[1] == "update-ldcache")
            .flat_map(|h| h.args.windows(2).filter(|w| w[0] == "--folder").map(|w| w[1].as_str()))
            .collect()
    }

    #[test]
    fn utility_gets_nvidia_smi_and_nvml_but_no_cuda() {
        let original = nvidia_graphics();
        let mut edits = original.clone();
        let filtered = filter_edits(&mut edits, caps(&[Utility]));
        let files = mounted(&edits);
        for want in [
            "nvidia-smi",
            "nvidia-debugdump",
            "nvidia-persistenced",
            "libnvidia-ml.so.550.54.15",
            "libnvidia-cfg.so.550.54.15",
            "socket",
            "gsp_ga10x.bin",
        ] {
            assert!(files.iter().any(|f| f == want), "{want} missing: {files:?}");
        }
        for gone in [
            "libcuda.so.550.54.15",
            "nvidia-cuda-mps-server",
            "libGLX_nvidia.so.550.54.15",
            "libnvcuvid.so.550.54.15",
            "nvidia_icd.json",
            "nvidia.icd",
            "libnvidia-ngx.so.550.54.15",
        ] {
            assert!(!files.iter().any(|f| f == gone), "{gone} kept: {files:?}");
        }
        assert_eq!(
            links(&edits),
            [
                "libnvidia-cfg.so.550.54.15::/usr/lib/x86_64-linux-gnu/libnvidia-cfg.so.1",
                "libnvidia-ml.so.550.54.15::/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            ]
        );
        // vdpau's folder had only VDPAU; the CUDA compat and application-profile hooks go too.
        assert_eq!(folders(&edits), ["/usr/lib/x86_64-linux-gnu"]);
        assert_eq!(
            subcommands(&edits),
            ["create-symlinks", "update-ldcache", "disable-device-node-modification"]
        );
        assert_eq!(edits.device_nodes, original.device_nodes, "device nodes are never filtered");
        assert_eq!(edits.env, original.env);
        assert!(filtered.unclassified.is_empty(), "{filtered:?}");
        assert!(filtered.left_out.iter().any(|p| p.ends_with("/libcuda.so.1")), "{filtered:?}");
        assert!(filtered.left_out.contains(&"hook enable-cuda-compat".to_owned()), "{filtered:?}");
    }

    #[test]
    fn compute_utility_gets_cuda_and_no_graphics_and_video_brings_compute() {
        let mut edits = nvidia_graphics();
        filter_edits(&mut edits, caps(&[Compute, Utility]));
        let files = mounted(&edits);
        for want in [
            "libcuda.so.550.54.15",
            "libnvidia-ptxjitcompiler.so.550.54.15",
            "nvidia-cuda-mps-control",
            "libnvidia-ml.so.550.54.15",
            "libnvidia-allocator.so.550.54.15",
            "nvidia.icd",
        ] {
            assert!(files.iter().any(|f| f == want), "{want} missing: {files:?}");
        }
        for gone in ["libGLX_nvidia.so.550.54.15", "nvidia_drv.so", "libnvcuvid.so.550.54.15", "nvoptix.bin"]
        {
            assert!(!files.iter().any(|f| f == gone), "{gone} kept: {files:?}");
        }
        assert!(links(&edits).contains(&"libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so".to_owned()));
        // The GBM link is graphics even though its target (the allocator) stays for compute.
        assert!(!links(&edits).iter().any(|l| l.contains("nvidia-drm_gbm")), "{:?}", links(&edits));
        assert!(subcommands(&edits).contains(&"enable-cuda-compat"));

        let mut video = nvidia_graphics();
        filter_edits(&mut video, caps(&[Video]));
        let files = mounted(&video);
        for want in ["libnvcuvid.so.550.54.15", "libvdpau_nvidia.so.550.54.15", "libcuda.so.550.54.15"] {
            assert!(files.iter().any(|f| f == want), "{want} missing: {files:?}");
        }
        assert!(!files.iter().any(|f| f == "nvidia-smi"), "video does not bring utility");
        assert_eq!(folders(&video), ["/usr/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu/vdpau"]);
    }

    #[test]
    fn display_brings_graphics_with_its_links_and_profile_hook() {
        let mut edits = nvidia_graphics();
        filter_edits(&mut edits, caps(&[Display]));
        let files = mounted(&edits);
        for want in [
            "libGLX_nvidia.so.550.54.15",
            "nvidia_drv.so",
            "nvidia_icd.json",
            "libnvidia-allocator.so.550.54.15",
        ] {
            assert!(files.iter().any(|f| f == want), "{want} missing: {files:?}");
        }
        assert!(!files.iter().any(|f| f == "libcuda.so.550.54.15"));
        let links = links(&edits);
        assert!(links.iter().any(|l| l.ends_with("/gbm/nvidia-drm_gbm.so")), "{links:?}");
        assert!(links.iter().any(|l| l.ends_with("/libGLX_indirect.so.0")), "{links:?}");
        assert!(subcommands(&edits).contains(&"update-application-profile"));
        assert!(!subcommands(&edits).contains(&"enable-cuda-compat"));
    }

    /// Over every set: the result is a subset of the spec, a larger set never gets less, and
    /// device nodes and environment never change.
    #[test]
    fn every_set_only_narrows_and_more_capabilities_never_give_less() {
        for golden in GOLDENS {
            let original = all_edits(&load(golden));
            let results: Vec<ContainerEdits> = (0..=Capabilities::ALL.0)
                .map(|bits| {
                    let mut e = original.clone();
                    filter_edits(&mut e, Capabilities(bits));
                    e
                })
                .collect();
            let is_subsequence = |small: &[String], big: &[String]| {
                let mut it = big.iter();
                small.iter().all(|s| it.any(|b| b == s))
            };
            for (bits, e) in results.iter().enumerate() {
                assert_eq!(e.device_nodes, original.device_nodes, "{golden} {bits}");
                assert_eq!(e.env, original.env, "{golden} {bits}");
                let paths = |m: &[Mount]| m.iter().map(|m| m.container_path.clone()).collect::<Vec<_>>();
                assert!(is_subsequence(&paths(&e.mounts), &paths(&original.mounts)), "{golden} {bits}");
                for h in &e.hooks {
                    assert!(
                        original.hooks.iter().any(|o| o.path == h.path && is_subsequence(&h.args, &o.args)),
                        "{golden} {bits}: {h:?} is not from the spec"
                    );
                }
                for (more, bigger) in results.iter().enumerate() {
                    if more & bits == bits {
                        assert!(
                            is_subsequence(&paths(&e.mounts), &paths(&bigger.mounts)),
                            "{golden}: {bits:#b} gets a mount {more:#b} does not"
                        );
                        assert!(
                            links(e).iter().all(|l| links(bigger).contains(l)),
                            "{golden} {bits:#b} {more:#b}"
                        );
                    }
                }
            }
            assert_eq!(results[Capabilities::ALL.0 as usize], original, "{golden}: all is the whole spec");
        }
    }

    proptest::proptest! {
        /// Any value: no panic; an error is short and printable; a set is exactly the names the
        /// value lists, or everything when it says `all`.
        #[test]
        fn any_value_parses_to_its_names_or_a_short_printable_error(
            value in proptest::string::string_regex("([a-z0-9 ,\\x00-\\x1f\\u{e9}\\u{202e}]|compute|utility|video|all|ngx){0,40}").unwrap()
        ) {
            let names: Vec<&str> = value.split(',').map(str::trim).filter(|n| !n.is_empty()).collect();
            match parse(Some(&value), false) {
                Ok(r) if names.contains(&"all") => proptest::prop_assert_eq!(r.capabilities, Capabilities::ALL),
                Ok(r) if names.is_empty() => proptest::prop_assert_eq!(r, ok(None)),
                Ok(r) => {
                    for c in Capability::ALL {
                        proptest::prop_assert_eq!(r.capabilities.contains(c), names.contains(&c.name()), "{}", c.name());
                    }
                }
                Err(e) => {
                    proptest::prop_assert!(!names.contains(&"all"));
                    proptest::prop_assert!(names.iter().any(|n| Capability::ALL.iter().all(|c| c.name() != *n)));
                    let text = e.to_string();
                    proptest::prop_assert!(!text.chars().any(char::is_control), "{:?}", text);
                    proptest::prop_assert!(e.shown.chars().count() < 6 * SHOWN_CHARS + 40, "{}", e.shown);
                }
            }
        }

        /// Filtering twice with the same set is filtering once.
        #[test]
        fn filtering_is_idempotent(bits in 0u8..=Capabilities::ALL.0, golden in 0usize..GOLDENS.len()) {
            let mut once = all_edits(&load(GOLDENS[golden]));
            filter_edits(&mut once, Capabilities(bits));
            let mut twice = once.clone();
            let again = filter_edits(&mut twice, Capabilities(bits));
            proptest::prop_assert_eq!(&twice, &once);
            proptest::prop_assert!(again.left_out.is_empty(), "{:?}", again.left_out);
        }
    }

    fn hook(path: &str, args: &[&str]) -> Hook {
        Hook {
            hook_name: "createContainer".into(),
            path: path.into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: vec![],
            timeout: None,
        }
    }

    #[test]
    fn hooks_in_any_form_are_filtered_and_unknown_ones_kept_and_reported() {
        let mut edits = ContainerEdits {
            hooks: vec![
                hook(
                    "/usr/bin/nvidia-ctk",
                    &[
                        "nvidia-ctk",
                        "hook",
                        "create-symlinks",
                        "--link=libcuda.so.1::/usr/lib/libcuda.so",
                        "--link",
                        "libnvidia-ml.so.1::/usr/lib/libnvidia-ml.so",
                    ],
                ),
                hook(
                    "/usr/bin/nvidia-cdi-hook",
                    &[
                        "nvidia-cdi-hook",
                        "create-symlinks",
                        "--link",
                        "../card1::/dev/dri/by-path/pci-0000:01:00.0-card",
                    ],
                ),
                hook("/opt/other/vendor-hook", &["vendor-hook", "enable-cuda-compat"]),
                hook("/usr/bin/nvidia-cdi-hook", &["nvidia-cdi-hook", "some-new-hook", "--x"]),
                hook(
                    "/usr/bin/nvidia-cdi-hook",
                    &["nvidia-cdi-hook", "create-symlinks", "--link", "a::/usr/lib/mystery"],
                ),
                hook("/usr/bin/nvidia-cdi-hook", &["nvidia-cdi-hook", "create-symlinks", "--link"]),
                hook("/usr/bin/nvidia-cdi-hook", &["nvidia-cdi-hook"]),
            ],
            ..Default::default()
        };
        let filtered = filter_edits(&mut edits, caps(&[Utility]));
        let args: Vec<Vec<&str>> =
            edits.hooks.iter().map(|h| h.args.iter().map(String::as_str).collect()).collect();
        assert_eq!(
            args,
            [
                vec![
                    "nvidia-ctk",
                    "hook",
                    "create-symlinks",
                    "--link",
                    "libnvidia-ml.so.1::/usr/lib/libnvidia-ml.so"
                ],
                vec![
                    "nvidia-cdi-hook",
                    "create-symlinks",
                    "--link",
                    "../card1::/dev/dri/by-path/pci-0000:01:00.0-card"
                ],
                vec!["vendor-hook", "enable-cuda-compat"],
                vec!["nvidia-cdi-hook", "some-new-hook", "--x"],
                vec!["nvidia-cdi-hook", "create-symlinks", "--link", "a::/usr/lib/mystery"],
                vec!["nvidia-cdi-hook", "create-symlinks", "--link"],
                vec!["nvidia-cdi-hook"],
            ]
        );
        assert_eq!(filtered.unclassified, ["/usr/lib/mystery", "hook some-new-hook"]);
        assert_eq!(filtered.left_out, ["/usr/lib/libcuda.so"]);
    }
}
