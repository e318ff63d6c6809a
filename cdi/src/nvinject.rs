//! The nvinject spec contract: what specs written by `nvinject-cdi` carry and what the shim, the
//! device plugin and the installer read back from them.
//!
//! One owner for each part, so writer and readers cannot drift apart:
//! - the annotation keys recording how a spec was made ([`ANNOTATION_DRIVER_VERSION`], ...), and
//!   the key prefix of the annotations that carry CDI device requests from the device plugin to
//!   the shim ([`CDI_ANNOTATION_PREFIX`]) with the one rule a configured prefix must follow
//!   ([`check_annotation_prefix`]);
//! - the default kind ([`DEFAULT_KIND`]), spec file name ([`SPEC_FILE_NAME`]) and hook path
//!   ([`DEFAULT_HOOK_PATH`]);
//! - how the loaded driver's version is read ([`read_driver_version`]), which
//!   [`ANNOTATION_DRIVER_VERSION`] is compared with to tell a stale spec;
//! - the `nvinject-hook` command lines, as a type ([`HookInvocation`]) with [`HookInvocation::to_args`]
//!   and [`HookInvocation::parse`]: cdi-gen writes the spec's runs with it, the shim reads them,
//!   merges them and translates NVIDIA's hooks through it, and a flag is named once ([`Flag`]);
//! - the `nvinject-cdi generate` command line the shim and the device plugin run to regenerate a
//!   spec ([`GenerateInvocation`]) and its bounded run ([`run_generator`], [`GeneratorError`]);
//! - the MPS device, the one device that is not a GPU ([`mps_device`]), and the rule that it
//!   never goes to a container without a GPU ([`check_mps_request`]).
//!
//! The hook binary itself (`shim/hook`) parses its command line with clap and, to stay small and
//! static, does not link this crate; a test there feeds [`HookInvocation::to_args`] to its real
//! parser, so the two grammars are pinned to each other.

use std::fmt;
use std::str::FromStr;

use crate::name::Kind;

mod driver_version;
pub mod generate;
mod mps;

pub use driver_version::{parse_nvrm_version, read_driver_version};
pub use generate::{GenerateInvocation, GeneratorError, StderrTail, run_generator};
pub use mps::{MPS_DEVICE, MpsWithoutGpu, check_mps_request, is_mps_device, mps_device};

/// Annotation: the driver version the spec was made for (compared with
/// `<sys>/module/nvidia/version` to tell a stale spec).
pub const ANNOTATION_DRIVER_VERSION: &str = "nvinject.io/driver-version";
/// Annotation: sha256 over device UUIDs, minors, MIG instance ids and the driver version.
pub const ANNOTATION_INVENTORY_DIGEST: &str = "nvinject.io/inventory-digest";
/// Annotation: `nvinject-cdi <version>`.
pub const ANNOTATION_GENERATED_BY: &str = "nvinject.io/generated-by";
/// Annotation: the host driver root the spec was made from (regeneration reuses it).
pub const ANNOTATION_DRIVER_ROOT: &str = "nvinject.io/driver-root";
/// Annotation: the host dev root the spec was made from (regeneration and `fill` reuse it).
pub const ANNOTATION_DEV_ROOT: &str = "nvinject.io/dev-root";

/// The key prefix of the container annotations that carry CDI device requests
/// (`<prefix><name>: vendor/class=name,...`): the CDI library's `AnnotationPrefix`, which
/// containerd's own CDI support reads, and the default of both the device plugin, which writes
/// them, and the shim, which reads them.
pub const CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// Why text cannot be an annotation key prefix. Each message says what to write instead; the
/// caller adds where the text came from (file and field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationPrefixError {
    /// The prefix is empty, so every annotation would be read as a device request.
    #[error(
        "an empty prefix would make every annotation a device request: write a DNS subdomain followed \
         by '/', e.g. {}",
        CDI_ANNOTATION_PREFIX
    )]
    Empty,
    /// The prefix is not `<domain>/`: it lacks the final `/`, or has another `/`.
    #[error(
        "`{prefix}` is not of the form <domain>/ (one '/', at the end): write e.g. {}",
        CDI_ANNOTATION_PREFIX
    )]
    NotDomainSlash {
        /// The prefix as given.
        prefix: String,
    },
    /// The part before the `/` is not a DNS subdomain.
    #[error(
        "`{prefix}`: `{domain}` is not a DNS subdomain (at most 253 characters: labels of 1 to 63 \
         letters, digits and '-', each starting and ending with a letter or digit, joined by '.'): \
         write e.g. {}",
        CDI_ANNOTATION_PREFIX
    )]
    NotDnsSubdomain {
        /// The prefix as given.
        prefix: String,
        /// Its part before the `/`.
        domain: String,
    },
}

/// Checks a prefix that marks annotations as CDI device requests: the device plugin's
/// `cdiAnnotationPrefix` (it writes `<prefix><name>`) and each of the shim's `[cdi]
/// annotation-prefixes` (it reads keys that start with one). The rule is Kubernetes' for the
/// prefix part of an annotation key, `<DNS subdomain>/`, checked lower-cased as the API server
/// checks keys, so a key made from it is one the API server and CDI's `ParseAnnotations` accept
/// (the CDI library writes only under [`CDI_ANNOTATION_PREFIX`]).
pub fn check_annotation_prefix(prefix: &str) -> Result<(), AnnotationPrefixError> {
    if prefix.is_empty() {
        return Err(AnnotationPrefixError::Empty);
    }
    let Some(domain) = prefix.strip_suffix('/').filter(|d| !d.contains('/')) else {
        return Err(AnnotationPrefixError::NotDomainSlash { prefix: prefix.to_owned() });
    };
    if !crate::validate::is_dns_subdomain(domain) {
        return Err(AnnotationPrefixError::NotDnsSubdomain {
            prefix: prefix.to_owned(),
            domain: domain.to_owned(),
        });
    }
    Ok(())
}

/// The CDI kind NVIDIA's tools use, and ours by default. As text for flag defaults and constant
/// contexts; [`default_kind`] gives it as a [`Kind`].
pub const DEFAULT_KIND: &str = "nvidia.com/gpu";

/// The vendor of [`DEFAULT_KIND`] (cdi-gen's `--vendor` default).
pub const DEFAULT_VENDOR: &str = "nvidia.com";
/// The class of [`DEFAULT_KIND`] (cdi-gen's `--class` default).
pub const DEFAULT_CLASS: &str = "gpu";

/// [`DEFAULT_KIND`] as a [`Kind`].
pub fn default_kind() -> Kind {
    DEFAULT_KIND.parse().expect("DEFAULT_KIND is a valid kind (pinned by a test)")
}

/// The file name of the spec nvinject writes in a CDI spec directory.
pub const SPEC_FILE_NAME: &str = "nvidia.com-gpu.json";

/// The file name of the hook binary, argv\[0\] of every run a spec carries.
pub const HOOK_PROGRAM: &str = "nvinject-hook";

/// Where the installer puts `nvinject-hook` on the host, and so the path specs run it from.
pub const DEFAULT_HOOK_PATH: &str = "/usr/local/nvinject/bin/nvinject-hook";

/// The OCI `timeout` (seconds) of every hook run a spec carries, unless the operator picks another
/// (`nvinject-cdi generate --hook-timeout-secs`, `[regenerate] hook-timeout-secs`): runc kills a
/// hook still running after it and fails the start, so a hook held up by the image (or by a hung
/// filesystem) cannot hold the pod's start, or leave a `runc init` behind, for ever. A normal run
/// takes milliseconds and the hook's own work budget ends a hostile scan within seconds; the
/// figures are in `shim/README.md`.
pub const DEFAULT_HOOK_TIMEOUT_SECS: u32 = 30;

/// The hook timeouts an operator may choose, in seconds: OCI wants more than 0, and past an hour
/// the kubelet (2 minutes per request by default) has long given up.
pub const HOOK_TIMEOUT_SECS_RANGE: std::ops::RangeInclusive<u32> = 1..=3600;

/// NVIDIA's CDI hook binary (`nvidia-cdi-hook <subcommand>`), whose runs the shim translates.
pub const NVIDIA_CDI_HOOK: &str = "nvidia-cdi-hook";
/// NVIDIA's toolkit CLI, whose older specs run `nvidia-ctk hook <subcommand>`.
pub const NVIDIA_CTK: &str = "nvidia-ctk";
/// The `nvidia-ctk` subcommand that holds the hooks.
pub const NVIDIA_CTK_HOOK: &str = "hook";

/// The hook runs a spec written by nvinject-cdi carries, by the name `--disable-hook` takes (the
/// hook's subcommand).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HookKind {
    /// `nvinject-hook create-symlinks --link target::link ...`.
    CreateSymlinks,
    /// `nvinject-hook update-ldcache --folder DIR ...`.
    UpdateLdcache,
    /// `nvinject-hook enable-cuda-compat --host-driver-version=VERSION` (NVIDIA's spelling).
    EnableCudaCompat,
    /// `nvinject-hook disable-device-node-modification`: the container reads `ModifyDeviceFiles: 0`
    /// in `/proc/driver/nvidia/params`, so CUDA in it never tries to make or change device nodes.
    DisableDeviceNodeModification,
    /// `nvinject-hook update-application-profile`: the driver's application profile in the
    /// container limits EGL/Vulkan to the GPUs the container was given (`EGLVisibleDGPUDevices`).
    UpdateApplicationProfile,
}

impl HookKind {
    /// Every hook, for parsing a name back.
    pub const ALL: [HookKind; 5] = [
        HookKind::CreateSymlinks,
        HookKind::UpdateLdcache,
        HookKind::EnableCudaCompat,
        HookKind::DisableDeviceNodeModification,
        HookKind::UpdateApplicationProfile,
    ];

    /// The name on the command line and as the hook's subcommand.
    pub fn as_str(self) -> &'static str {
        self.subcommand().as_str()
    }

    /// The hook subcommand this run is.
    pub fn subcommand(self) -> Subcommand {
        match self {
            HookKind::CreateSymlinks => Subcommand::CreateSymlinks,
            HookKind::UpdateLdcache => Subcommand::UpdateLdcache,
            HookKind::EnableCudaCompat => Subcommand::EnableCudaCompat,
            HookKind::DisableDeviceNodeModification => Subcommand::DisableDeviceNodeModification,
            HookKind::UpdateApplicationProfile => Subcommand::UpdateApplicationProfile,
        }
    }
}

impl fmt::Display for HookKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown `--disable-hook` name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown hook `{0}`: expected create-symlinks, update-ldcache, enable-cuda-compat, \
     disable-device-node-modification or update-application-profile"
)]
pub struct UnknownHook(pub String);

impl FromStr for HookKind {
    type Err = UnknownHook;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|h| h.as_str() == s).ok_or_else(|| UnknownHook(s.to_owned()))
    }
}

/// Every subcommand of `nvinject-hook`: the five a spec carries, and the two only the shim
/// writes when it folds a container's runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Subcommand {
    /// Links inside the container root.
    CreateSymlinks,
    /// The container's ld.so.cache.
    UpdateLdcache,
    /// CUDA forward-compatibility libraries first when newer than the host driver.
    EnableCudaCompat,
    /// `ModifyDeviceFiles: 0` in the container's view of the driver's params.
    DisableDeviceNodeModification,
    /// The driver's application profile naming the container's GPUs.
    UpdateApplicationProfile,
    /// Only the `--mount`s (the shim's own run, when no nvinject run comes first).
    BindMounts,
    /// The `--mount`s, links, compat decision, cache, params cover and application profile in one
    /// run (the shim's merge).
    Inject,
}

impl Subcommand {
    const ALL: [Subcommand; 7] = [
        Subcommand::CreateSymlinks,
        Subcommand::UpdateLdcache,
        Subcommand::EnableCudaCompat,
        Subcommand::DisableDeviceNodeModification,
        Subcommand::UpdateApplicationProfile,
        Subcommand::BindMounts,
        Subcommand::Inject,
    ];

    /// The subcommand's name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Subcommand::CreateSymlinks => "create-symlinks",
            Subcommand::UpdateLdcache => "update-ldcache",
            Subcommand::EnableCudaCompat => "enable-cuda-compat",
            Subcommand::DisableDeviceNodeModification => "disable-device-node-modification",
            Subcommand::UpdateApplicationProfile => "update-application-profile",
            Subcommand::BindMounts => "bind-mounts",
            Subcommand::Inject => "inject",
        }
    }

    /// The spec hook this subcommand is, if a spec can carry it.
    pub fn kind(self) -> Option<HookKind> {
        HookKind::ALL.into_iter().find(|k| k.subcommand() == self)
    }

    /// The flags the subcommand takes after its name.
    fn flags(self) -> &'static [Flag] {
        const COMPAT: [Flag; 3] =
            [Flag::HostDriverVersion, Flag::HostCudaVersion, Flag::CudaCompatContainerRoot];
        match self {
            Subcommand::CreateSymlinks => &[Flag::Link],
            Subcommand::UpdateLdcache => &[Flag::Folder, Flag::LdconfigPath],
            Subcommand::EnableCudaCompat => &COMPAT,
            Subcommand::DisableDeviceNodeModification
            | Subcommand::UpdateApplicationProfile
            | Subcommand::BindMounts => &[],
            Subcommand::Inject => &[
                Flag::Link,
                Flag::Folder,
                Flag::LdconfigPath,
                Flag::HostDriverVersion,
                Flag::HostCudaVersion,
                Flag::CudaCompatContainerRoot,
                Flag::DisableDeviceNodeModification,
                Flag::UpdateApplicationProfile,
            ],
        }
    }
}

impl fmt::Display for Subcommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Subcommand {
    type Err = HookArgsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| HookArgsError::UnknownSubcommand(s.to_owned()))
    }
}

/// A flag of `nvinject-hook`; each takes one value but the two switches that stand for the runs
/// of the same names in `inject`. Readers that look at a spec's argv without
/// parsing all of it (the shim's capability filter) name flags through this, never as literals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flag {
    /// `--mount <source>::<destination>::<options>`, before the subcommand.
    Mount,
    /// `--link <target>::<link>`.
    Link,
    /// `--folder <dir>`.
    Folder,
    /// `--ldconfig-path <path>`: accepted and ignored (no program is run).
    LdconfigPath,
    /// `--host-driver-version=<version>`.
    HostDriverVersion,
    /// `--host-cuda-version=<version>`.
    HostCudaVersion,
    /// `--cuda-compat-container-root=<dir>`.
    CudaCompatContainerRoot,
    /// `--disable-device-node-modification`, a switch: `inject` also does that run's work.
    DisableDeviceNodeModification,
    /// `--update-application-profile`, a switch: `inject` also does that run's work.
    UpdateApplicationProfile,
}

impl Flag {
    const ALL: [Flag; 9] = [
        Flag::Mount,
        Flag::Link,
        Flag::Folder,
        Flag::LdconfigPath,
        Flag::HostDriverVersion,
        Flag::HostCudaVersion,
        Flag::CudaCompatContainerRoot,
        Flag::DisableDeviceNodeModification,
        Flag::UpdateApplicationProfile,
    ];

    /// The flag with its dashes: `--link`.
    pub fn long(self) -> &'static str {
        match self {
            Flag::Mount => "--mount",
            Flag::Link => "--link",
            Flag::Folder => "--folder",
            Flag::LdconfigPath => "--ldconfig-path",
            Flag::HostDriverVersion => "--host-driver-version",
            Flag::HostCudaVersion => "--host-cuda-version",
            Flag::CudaCompatContainerRoot => "--cuda-compat-container-root",
            Flag::DisableDeviceNodeModification => "--disable-device-node-modification",
            Flag::UpdateApplicationProfile => "--update-application-profile",
        }
    }

    /// Whether the flag is a switch, given alone (no value).
    pub fn is_switch(self) -> bool {
        matches!(self, Flag::DisableDeviceNodeModification | Flag::UpdateApplicationProfile)
    }

    /// The flag's name without dashes: `link`.
    pub fn name(self) -> &'static str {
        &self.long()[2..]
    }

    /// The compat flags are always written `--flag=value`, NVIDIA's spelling of them.
    fn always_joined(self) -> bool {
        matches!(self, Flag::HostDriverVersion | Flag::HostCudaVersion | Flag::CudaCompatContainerRoot)
    }
}

/// How a run gives its flag values: `--link v` (what cdi-gen writes) or `--link=v` (what the shim
/// writes for runs it translates from NVIDIA's specs, so no value can read as another flag).
/// Either way a value starting with `-` is written `--flag=value`, and the compat flags are
/// always written that way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum FlagForm {
    /// `--flag value`, two arguments.
    #[default]
    Separate,
    /// `--flag=value`, one argument.
    Joined,
}

/// One `--link <target>::<link>`: what the link points to (as written: relative or absolute
/// inside the container) and where the link goes (absolute inside the container).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HookLink {
    /// What the link points to.
    pub target: String,
    /// The link's path, absolute inside the container.
    pub link: String,
}

impl HookLink {
    /// The `--link` value.
    pub fn to_arg(&self) -> String {
        format!("{}::{}", self.target, self.link)
    }

    /// Parses `target::link` by the hook's rule: a target, and an absolute link path other than `/`.
    pub fn parse(arg: &str) -> Result<HookLink, HookArgsError> {
        match arg.split_once("::") {
            Some((target, link)) if !target.is_empty() && link.starts_with('/') && link.len() > 1 => {
                Ok(HookLink { target: target.to_owned(), link: link.to_owned() })
            }
            _ => Err(HookArgsError::BadLink(arg.to_owned())),
        }
    }
}

/// One `--mount <source>::<destination>::<options>`: a host path, the mountpoint inside the
/// container and the OCI mount options. Only the shape is checked here; which options the hook
/// can apply is the hook's own rule (`nvinject_hook::Bind`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HookMount {
    /// The host path.
    pub source: String,
    /// The mountpoint, absolute inside the container.
    pub destination: String,
    /// OCI mount options (`ro`, `rbind`, ...), none containing `,`.
    pub options: Vec<String>,
}

impl HookMount {
    /// The `--mount` value.
    pub fn to_arg(&self) -> String {
        format!("{}::{}::{}", self.source, self.destination, self.options.join(","))
    }

    /// Parses `source::destination::options` (options comma-separated, possibly none).
    pub fn parse(arg: &str) -> Result<HookMount, HookArgsError> {
        let mut parts = arg.split("::");
        let (Some(source), Some(destination), Some(options), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(HookArgsError::BadMount(arg.to_owned()));
        };
        let options =
            if options.is_empty() { Vec::new() } else { options.split(',').map(str::to_owned).collect() };
        Ok(HookMount { source: source.to_owned(), destination: destination.to_owned(), options })
    }
}

/// enable-cuda-compat's flags (also taken by `inject`), spelled as NVIDIA's hook spells them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CudaCompat {
    /// `--host-driver-version`: the host driver's version (`550.54.15`).
    pub host_driver_version: Option<String>,
    /// `--host-cuda-version`: the CUDA version the host driver supports.
    pub host_cuda_version: Option<String>,
    /// `--cuda-compat-container-root`: the compat folder in the container.
    pub container_root: Option<String>,
}

impl CudaCompat {
    fn slots(&mut self) -> [(Flag, &mut Option<String>); 3] {
        [
            (Flag::HostDriverVersion, &mut self.host_driver_version),
            (Flag::HostCudaVersion, &mut self.host_cuda_version),
            (Flag::CudaCompatContainerRoot, &mut self.container_root),
        ]
    }

    fn values(&self) -> [(Flag, Option<&String>); 3] {
        [
            (Flag::HostDriverVersion, self.host_driver_version.as_ref()),
            (Flag::HostCudaVersion, self.host_cuda_version.as_ref()),
            (Flag::CudaCompatContainerRoot, self.container_root.as_ref()),
        ]
    }
}

/// What a run does: the subcommand with its typed flag values.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HookCommand {
    /// `create-symlinks --link ...`.
    CreateSymlinks {
        /// The links, in order.
        links: Vec<HookLink>,
    },
    /// `update-ldcache --folder ... [--ldconfig-path P]`.
    UpdateLdcache {
        /// Folders inside the container holding injected libraries.
        folders: Vec<String>,
        /// Accepted for older specs, ignored by the hook.
        ldconfig_path: Option<String>,
    },
    /// `enable-cuda-compat --host-driver-version=V ...`.
    EnableCudaCompat {
        /// The versions and folder.
        compat: CudaCompat,
    },
    /// `disable-device-node-modification`: no flags.
    DisableDeviceNodeModification,
    /// `update-application-profile`: no flags.
    UpdateApplicationProfile,
    /// `bind-mounts`: the `--mount`s only.
    BindMounts,
    /// `inject`: links, then the compat decision, then the cache, then the params cover and the
    /// application profile, as the merged runs did them.
    Inject {
        /// As create-symlinks'.
        links: Vec<HookLink>,
        /// As enable-cuda-compat's.
        compat: CudaCompat,
        /// As update-ldcache's.
        folders: Vec<String>,
        /// As update-ldcache's.
        ldconfig_path: Option<String>,
        /// `--disable-device-node-modification`: that run's work, after the cache.
        disable_device_node_modification: bool,
        /// `--update-application-profile`: that run's work, last.
        update_application_profile: bool,
    },
}

impl HookCommand {
    /// The subcommand.
    pub fn subcommand(&self) -> Subcommand {
        match self {
            HookCommand::CreateSymlinks { .. } => Subcommand::CreateSymlinks,
            HookCommand::UpdateLdcache { .. } => Subcommand::UpdateLdcache,
            HookCommand::EnableCudaCompat { .. } => Subcommand::EnableCudaCompat,
            HookCommand::DisableDeviceNodeModification => Subcommand::DisableDeviceNodeModification,
            HookCommand::UpdateApplicationProfile => Subcommand::UpdateApplicationProfile,
            HookCommand::BindMounts => Subcommand::BindMounts,
            HookCommand::Inject { .. } => Subcommand::Inject,
        }
    }

    fn empty(sub: Subcommand) -> HookCommand {
        match sub {
            Subcommand::CreateSymlinks => HookCommand::CreateSymlinks { links: Vec::new() },
            Subcommand::UpdateLdcache => {
                HookCommand::UpdateLdcache { folders: Vec::new(), ldconfig_path: None }
            }
            Subcommand::EnableCudaCompat => HookCommand::EnableCudaCompat { compat: CudaCompat::default() },
            Subcommand::DisableDeviceNodeModification => HookCommand::DisableDeviceNodeModification,
            Subcommand::UpdateApplicationProfile => HookCommand::UpdateApplicationProfile,
            Subcommand::BindMounts => HookCommand::BindMounts,
            Subcommand::Inject => HookCommand::Inject {
                links: Vec::new(),
                compat: CudaCompat::default(),
                folders: Vec::new(),
                ldconfig_path: None,
                disable_device_node_modification: false,
                update_application_profile: false,
            },
        }
    }

    /// Stores one flag value (`None` for a switch); `flag` is one the subcommand takes.
    fn set(&mut self, flag: Flag, value: Option<&str>) -> Result<(), HookArgsError> {
        let Some(value) = value else { return self.switch_on(flag) };
        let once = |slot: &mut Option<String>| match slot {
            Some(_) => Err(HookArgsError::Repeated(flag.name())),
            None => {
                *slot = Some(value.to_owned());
                Ok(())
            }
        };
        match (self, flag) {
            (HookCommand::CreateSymlinks { links } | HookCommand::Inject { links, .. }, Flag::Link) => {
                links.push(HookLink::parse(value)?);
                Ok(())
            }
            (
                HookCommand::UpdateLdcache { folders, .. } | HookCommand::Inject { folders, .. },
                Flag::Folder,
            ) => {
                folders.push(value.to_owned());
                Ok(())
            }
            (
                HookCommand::UpdateLdcache { ldconfig_path, .. } | HookCommand::Inject { ldconfig_path, .. },
                Flag::LdconfigPath,
            ) => once(ldconfig_path),
            (HookCommand::EnableCudaCompat { compat } | HookCommand::Inject { compat, .. }, flag) => {
                let slot = compat.slots().into_iter().find(|(f, _)| *f == flag).map(|(_, s)| s);
                once(slot.expect("only flags the subcommand takes reach here"))
            }
            _ => unreachable!("only flags the subcommand takes reach here"),
        }
    }

    /// Turns on a switch; given twice is refused, as for valued flags.
    fn switch_on(&mut self, flag: Flag) -> Result<(), HookArgsError> {
        let HookCommand::Inject { disable_device_node_modification, update_application_profile, .. } = self
        else {
            unreachable!("only inject takes switches")
        };
        let switch = match flag {
            Flag::DisableDeviceNodeModification => disable_device_node_modification,
            Flag::UpdateApplicationProfile => update_application_profile,
            _ => unreachable!("only switches come without a value"),
        };
        if std::mem::replace(switch, true) { Err(HookArgsError::Repeated(flag.name())) } else { Ok(()) }
    }

    fn push_args(&self, form: FlagForm, args: &mut Vec<String>) {
        let links = |links: &[HookLink], args: &mut Vec<String>| {
            for l in links {
                push_value(args, Flag::Link, &l.to_arg(), form);
            }
        };
        let folders = |folders: &[String], ldconfig: &Option<String>, args: &mut Vec<String>| {
            for f in folders {
                push_value(args, Flag::Folder, f, form);
            }
            if let Some(p) = ldconfig {
                push_value(args, Flag::LdconfigPath, p, form);
            }
        };
        let compat = |compat: &CudaCompat, args: &mut Vec<String>| {
            for (flag, value) in compat.values() {
                if let Some(v) = value {
                    push_value(args, flag, v, form);
                }
            }
        };
        match self {
            HookCommand::CreateSymlinks { links: l } => links(l, args),
            HookCommand::UpdateLdcache { folders: f, ldconfig_path } => folders(f, ldconfig_path, args),
            HookCommand::EnableCudaCompat { compat: c } => compat(c, args),
            HookCommand::DisableDeviceNodeModification
            | HookCommand::UpdateApplicationProfile
            | HookCommand::BindMounts => {}
            HookCommand::Inject {
                links: l,
                compat: c,
                folders: f,
                ldconfig_path,
                disable_device_node_modification,
                update_application_profile,
            } => {
                links(l, args);
                compat(c, args);
                folders(f, ldconfig_path, args);
                for (on, flag) in [
                    (*disable_device_node_modification, Flag::DisableDeviceNodeModification),
                    (*update_application_profile, Flag::UpdateApplicationProfile),
                ] {
                    if on {
                        args.push(flag.long().to_owned());
                    }
                }
            }
        }
    }
}

fn push_value(args: &mut Vec<String>, flag: Flag, value: &str, form: FlagForm) {
    if form == FlagForm::Joined || flag.always_joined() || value.starts_with('-') {
        args.push(format!("{}={value}", flag.long()));
    } else {
        args.push(flag.long().to_owned());
        args.push(value.to_owned());
    }
}

/// One `nvinject-hook` command line: argv\[0\], the `--mount`s before the subcommand, the
/// subcommand with its values, and the form its values are written in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HookInvocation {
    /// argv\[0\], normally [`HOOK_PROGRAM`].
    pub argv0: String,
    /// Bind mounts made before anything else (only the shim writes them; specs never carry them).
    pub mounts: Vec<HookMount>,
    /// What the run does.
    pub command: HookCommand,
    /// How link, folder and ldconfig-path values are written.
    pub form: FlagForm,
}

impl HookInvocation {
    /// A run of `command` as [`HOOK_PROGRAM`], with no mounts, in cdi-gen's form.
    pub fn new(command: HookCommand) -> HookInvocation {
        HookInvocation {
            argv0: HOOK_PROGRAM.to_owned(),
            mounts: Vec::new(),
            command,
            form: FlagForm::Separate,
        }
    }

    /// The argv, argv\[0\] first. `--mount`s are always written as two arguments (their values are
    /// absolute paths); see [`FlagForm`] for the rest.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![self.argv0.clone()];
        for m in &self.mounts {
            push_value(&mut args, Flag::Mount, &m.to_arg(), FlagForm::Separate);
        }
        args.push(self.command.subcommand().as_str().to_owned());
        self.command.push_args(self.form, &mut args);
        args
    }

    /// Parses an argv (argv\[0\] first) by nvinject-hook's grammar: `--mount`s, then a
    /// subcommand, then that subcommand's flags, each `--name value` or `--name=value` (the
    /// argument after `--name` is its value whatever it looks like), switches alone. The form is
    /// [`FlagForm::Joined`] when any link, folder or ldconfig-path value was given joined.
    pub fn parse<S: AsRef<str>>(argv: &[S]) -> Result<HookInvocation, HookArgsError> {
        let (argv0, rest) = argv.split_first().ok_or(HookArgsError::NoSubcommand)?;
        let mut rest = rest.iter().map(AsRef::as_ref);
        let mut form = FlagForm::Separate;
        let mut mounts = Vec::new();
        let mut flag_value = |arg: &str, rest: &mut dyn Iterator<Item = &str>, allowed: &[Flag]| {
            let body = arg.strip_prefix("--").ok_or_else(|| HookArgsError::Unexpected(arg.to_owned()))?;
            let (name, joined) = match body.split_once('=') {
                Some((name, value)) => (name, Some(value.to_owned())),
                None => (body, None),
            };
            let flag = Flag::ALL.into_iter().find(|f| f.name() == name).filter(|f| allowed.contains(f));
            let flag = flag.ok_or_else(|| HookArgsError::FlagNotTaken(name.to_owned()))?;
            if flag.is_switch() {
                return match joined {
                    Some(_) => Err(HookArgsError::SwitchWithValue(flag.name())),
                    None => Ok((flag, None)),
                };
            }
            let value = match joined {
                Some(v) => {
                    // Values starting with `-` are joined in either form, so they do not tell it.
                    if !flag.always_joined() && flag != Flag::Mount && !v.starts_with('-') {
                        form = FlagForm::Joined;
                    }
                    v
                }
                None => rest.next().ok_or(HookArgsError::NoValue(flag.name()))?.to_owned(),
            };
            Ok::<_, HookArgsError>((flag, Some(value)))
        };
        let sub = loop {
            let arg = rest.next().ok_or(HookArgsError::NoSubcommand)?;
            if !arg.starts_with("--") {
                break arg.parse::<Subcommand>()?;
            }
            let (_, value) = flag_value(arg, &mut rest, &[Flag::Mount])?;
            mounts.push(HookMount::parse(value.as_deref().unwrap_or_default())?);
        };
        let mut command = HookCommand::empty(sub);
        while let Some(arg) = rest.next() {
            let (flag, value) = flag_value(arg, &mut rest, sub.flags()).map_err(|e| match e {
                HookArgsError::FlagNotTaken(name) => {
                    HookArgsError::NotTakenBy { flag: name, subcommand: sub }
                }
                e => e,
            })?;
            command.set(flag, value.as_deref())?;
        }
        Ok(HookInvocation { argv0: argv0.as_ref().to_owned(), mounts, command, form })
    }
}

/// Why an argv is not an nvinject-hook command line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookArgsError {
    /// No subcommand after the `--mount`s.
    #[error("no subcommand")]
    NoSubcommand,
    /// A subcommand the hook does not have.
    #[error("nvinject-hook does not implement {0}")]
    UnknownSubcommand(String),
    /// A positional argument after the subcommand.
    #[error("unexpected argument {0:?}")]
    Unexpected(String),
    /// A flag given last, with no value.
    #[error("--{0} has no value")]
    NoValue(&'static str),
    /// A flag before the subcommand other than `--mount`.
    #[error("flag --{0} is not one nvinject-hook takes before its subcommand")]
    FlagNotTaken(String),
    /// A flag the subcommand does not take.
    #[error("flag --{flag} is not one nvinject-hook {subcommand} takes")]
    NotTakenBy {
        /// The flag's name.
        flag: String,
        /// The subcommand.
        subcommand: Subcommand,
    },
    /// A single-valued flag or a switch given twice.
    #[error("--{0} is given twice")]
    Repeated(&'static str),
    /// A switch given `--switch=value`.
    #[error("--{0} takes no value")]
    SwitchWithValue(&'static str),
    /// A `--link` value that is not `target::/link`.
    #[error("--link {0:?}: expected <target>::<link> with an absolute link path")]
    BadLink(String),
    /// A `--mount` value that is not `source::destination::options`.
    #[error("--mount {0:?}: expected <source>::<destination>::<options>")]
    BadMount(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_default_kind_is_a_valid_kind() {
        assert_eq!(default_kind().as_str(), DEFAULT_KIND);
        assert_eq!((default_kind().vendor(), default_kind().class()), (DEFAULT_VENDOR, DEFAULT_CLASS));
        assert!(DEFAULT_HOOK_PATH.ends_with(&format!("/{HOOK_PROGRAM}")));
    }

    #[test]
    fn annotation_prefixes_follow_kubernetes_key_rules() {
        let label = |n: usize| "a".repeat(n);
        // A domain of exactly 253 characters: three labels of 63 and one of 61, joined by dots.
        let longest = format!("{0}.{0}.{0}.{1}", label(63), label(61));
        assert_eq!(longest.len(), 253);
        let accepted: Vec<String> = vec![
            CDI_ANNOTATION_PREFIX.into(),
            "x.io/".into(),
            "example/".into(),
            "a/".into(),
            "1.example.com/".into(),
            "a-b.c-d.io/".into(),
            // The API server lower-cases a key before checking it.
            "CDI.k8s.io/".into(),
            format!("{}.io/", label(63)),
            format!("{longest}/"),
        ];
        for prefix in &accepted {
            assert_eq!(check_annotation_prefix(prefix), Ok(()), "{prefix}");
        }
        let rejected: Vec<(String, &str)> = vec![
            ("".into(), "empty"),
            ("cdi.k8s.io".into(), "no '/'"),
            ("cdi.k8s.io//".into(), "two '/'"),
            ("a/b/".into(), "a '/' inside"),
            ("/cdi.k8s.io/".into(), "a leading '/'"),
            ("/".into(), "no domain"),
            ("cdi_k8s.io/".into(), "'_' is not in DNS names"),
            ("-cdi.io/".into(), "a label starting with '-'"),
            ("cdi-.io/".into(), "a label ending with '-'"),
            ("cdi..io/".into(), "an empty label"),
            (".cdi.io/".into(), "a leading dot"),
            ("cdi.io./".into(), "a trailing dot"),
            (" cdi.k8s.io/".into(), "a space"),
            ("cdi.k8s.io/*".into(), "a containerd pattern, not a prefix"),
            (format!("{}.io/", label(64)), "a label of 64 characters"),
            (format!("a{longest}/"), "a domain of 254 characters"),
        ];
        for (prefix, why) in &rejected {
            assert!(check_annotation_prefix(prefix).is_err(), "{why}: {prefix:?} accepted");
        }
        // Each refusal says what is wrong and what to write.
        assert_eq!(check_annotation_prefix(""), Err(AnnotationPrefixError::Empty));
        assert_eq!(
            check_annotation_prefix("cdi.k8s.io").unwrap_err().to_string(),
            "`cdi.k8s.io` is not of the form <domain>/ (one '/', at the end): write e.g. cdi.k8s.io/"
        );
        let e = check_annotation_prefix("cdi_k8s.io/").unwrap_err();
        assert_eq!(
            e,
            AnnotationPrefixError::NotDnsSubdomain {
                prefix: "cdi_k8s.io/".into(),
                domain: "cdi_k8s.io".into()
            }
        );
        assert!(e.to_string().starts_with("`cdi_k8s.io/`: `cdi_k8s.io` is not a DNS subdomain"), "{e}");
        assert!(e.to_string().ends_with("e.g. cdi.k8s.io/"), "{e}");
        assert!(AnnotationPrefixError::Empty.to_string().contains("every annotation"));
    }

    #[test]
    fn cdi_gens_runs_are_written_as_before() {
        let links = vec![HookLink { target: "libcuda.so.1".into(), link: "/usr/lib/libcuda.so".into() }];
        let run = HookInvocation::new(HookCommand::CreateSymlinks { links });
        assert_eq!(
            run.to_args(),
            args(&["nvinject-hook", "create-symlinks", "--link", "libcuda.so.1::/usr/lib/libcuda.so"])
        );
        let compat = CudaCompat { host_driver_version: Some("550.54.15".into()), ..Default::default() };
        let run = HookInvocation::new(HookCommand::EnableCudaCompat { compat });
        assert_eq!(
            run.to_args(),
            args(&["nvinject-hook", "enable-cuda-compat", "--host-driver-version=550.54.15"])
        );
        let run = HookInvocation::new(HookCommand::UpdateLdcache {
            folders: vec!["/usr/lib".into()],
            ldconfig_path: None,
        });
        assert_eq!(run.to_args(), args(&["nvinject-hook", "update-ldcache", "--folder", "/usr/lib"]));
    }

    #[test]
    fn parse_accepts_both_forms_and_refuses_what_the_hook_refuses() {
        let run =
            HookInvocation::parse(&["x", "create-symlinks", "--link=a::/b", "--link", "c::/d"]).unwrap();
        assert_eq!(run.form, FlagForm::Joined);
        assert_eq!(run.to_args(), args(&["x", "create-symlinks", "--link=a::/b", "--link=c::/d"]));
        // A value that looks like a flag stays a value, and is written joined.
        let run =
            HookInvocation::parse(&["x", "create-symlinks", "--link", "--mount=/etc::/x::rbind"]).unwrap();
        assert_eq!(run.to_args(), args(&["x", "create-symlinks", "--link=--mount=/etc::/x::rbind"]));
        let run = HookInvocation::parse(&["x", "--mount", "/a::/b::rbind,ro", "bind-mounts"]).unwrap();
        assert_eq!(
            run.mounts,
            [HookMount { source: "/a".into(), destination: "/b".into(), options: args(&["rbind", "ro"]) }]
        );
        let refused: [(&[&str], &str); 12] = [
            (&["x"], "no subcommand"),
            (&["x", "chmod"], "does not implement chmod"),
            (&["x", "update-ldcache", "stray"], "unexpected argument \"stray\""),
            (&["x", "create-symlinks", "--link"], "--link has no value"),
            (
                &["x", "create-symlinks", "--mount", "/a::/b::rbind"],
                "flag --mount is not one nvinject-hook create-symlinks takes",
            ),
            (&["x", "update-ldcache", "--container-spec", "/tmp/x"], "--container-spec"),
            (&["x", "inject", "--host-driver-version=1", "--host-driver-version=2"], "given twice"),
            (&["x", "create-symlinks", "--link", "a::b"], "absolute link path"),
            (&["x", "--link", "a::/b", "create-symlinks"], "before its subcommand"),
            (&["x", "inject", "--update-application-profile=1"], "takes no value"),
            (
                &["x", "inject", "--disable-device-node-modification", "--disable-device-node-modification"],
                "given twice",
            ),
            (
                &["x", "update-ldcache", "--update-application-profile"],
                "flag --update-application-profile is not one nvinject-hook update-ldcache takes",
            ),
        ];
        for (argv, want) in refused {
            let e = HookInvocation::parse(argv).unwrap_err().to_string();
            assert!(e.contains(want), "{argv:?}: got `{e}`, want `{want}`");
        }
    }

    #[test]
    fn hook_kinds_name_their_subcommands() {
        for k in HookKind::ALL {
            assert_eq!(k.as_str().parse::<HookKind>().unwrap(), k);
            assert_eq!(k.subcommand().kind(), Some(k));
        }
        assert_eq!(Subcommand::Inject.kind(), None);
        assert!(
            "inject".parse::<HookKind>().unwrap_err().to_string().contains("create-symlinks, update-ldcache")
        );
    }

    fn value() -> impl Strategy<Value = String> {
        // Anything but `::` in paths, including values that start with `-` or `=`.
        "[-=a-zA-Z0-9._/ ]{0,12}"
    }

    fn link() -> impl Strategy<Value = HookLink> {
        ("[-=a-zA-Z0-9._/]{1,12}", "/[-=a-zA-Z0-9._/:]{1,12}")
            .prop_map(|(target, link)| HookLink { target, link })
            .prop_filter("no :: in the target", |l| !l.target.contains("::"))
    }

    fn compat() -> impl Strategy<Value = CudaCompat> {
        (proptest::option::of(value()), proptest::option::of(value()), proptest::option::of(value()))
            .prop_map(|(host_driver_version, host_cuda_version, container_root)| CudaCompat {
                host_driver_version,
                host_cuda_version,
                container_root,
            })
    }

    fn command() -> impl Strategy<Value = HookCommand> {
        let links = || proptest::collection::vec(link(), 0..4);
        let folders = || proptest::collection::vec(value(), 0..4);
        prop_oneof![
            links().prop_map(|links| HookCommand::CreateSymlinks { links }),
            (folders(), proptest::option::of(value()))
                .prop_map(|(folders, ldconfig_path)| HookCommand::UpdateLdcache { folders, ldconfig_path }),
            compat().prop_map(|compat| HookCommand::EnableCudaCompat { compat }),
            Just(HookCommand::BindMounts),
            Just(HookCommand::DisableDeviceNodeModification),
            Just(HookCommand::UpdateApplicationProfile),
            (links(), compat(), folders(), proptest::option::of(value()), any::<(bool, bool)>()).prop_map(
                |(links, compat, folders, ldconfig_path, (ddnm, profile))| HookCommand::Inject {
                    links,
                    compat,
                    folders,
                    ldconfig_path,
                    disable_device_node_modification: ddnm,
                    update_application_profile: profile,
                }
            ),
        ]
    }

    fn mount() -> impl Strategy<Value = HookMount> {
        ("/[a-z0-9._/]{1,10}", "/[a-z0-9._/]{1,10}", proptest::collection::vec("[a-z]{1,6}", 0..3))
            .prop_map(|(source, destination, options)| HookMount { source, destination, options })
    }

    proptest! {
        #[test]
        fn to_args_parses_back_to_the_same_run(
            mounts in proptest::collection::vec(mount(), 0..3),
            command in command(),
            joined in any::<bool>(),
        ) {
            let form = if joined { FlagForm::Joined } else { FlagForm::Separate };
            let run = HookInvocation { argv0: HOOK_PROGRAM.into(), mounts, command, form };
            let args = run.to_args();
            let back = HookInvocation::parse(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            prop_assert_eq!(&back.command, &run.command);
            prop_assert_eq!(&back.mounts, &run.mounts);
            prop_assert_eq!(&back.argv0, &run.argv0);
            // The form is only visible when there is a value to write.
            prop_assert_eq!(back.to_args(), args);
        }
    }
}
