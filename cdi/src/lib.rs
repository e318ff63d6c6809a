//! CDI (Container Device Interface) for nvinject: the spec model ([`spec`]), names ([`name`]),
//! versions ([`version`]), reading and writing spec text ([`codec`]), validation ([`mod@validate`]),
//! the trust check a spec file passes before it is used at all ([`trust`]: owner and mode of the
//! file and its folders), the registry of spec directories that resolves `vendor/class=name` to a
//! device ([`registry`]), and applying a device's edits to an OCI runtime spec ([`apply`]); and
//! [`nvinject`], the contract between nvinject's spec writer and its readers (annotation keys, hook
//! command lines, defaults, the loaded-driver version a spec is compared with).
//!
//! Boundary: pure data handling plus reading spec files. It never discovers hardware (that is
//! `nvinject-gpu` and `nvinject-cdi-gen`), never writes spec files (cdi-gen does, atomically) and
//! never talks to a container runtime (that is the shim). Applying a spec is a pure function of
//! complete device nodes. It looks at the host in three places only: [`fill`], which completes the
//! device-node fields a spec may leave out (`type`, `major`, `minor`, `fileMode`) from the host device
//! file, before applying, as the CDI reference library does; [`nvinject::read_driver_version`],
//! the kernel module's version file (never NVML), so a reader can tell a stale spec without linking
//! the generator; and [`trust`], which `stat`s a spec's folders up to `/` (and reads `/etc/passwd`
//! to name the owner of a file it refuses). It starts one process: [`nvinject::run_generator`] runs `nvinject-cdi generate`
//! for a reader that regenerates a stale spec, so readers run the generator instead of linking it.

pub mod apply;
pub mod codec;
pub mod fill;
pub mod load;
pub mod name;
pub mod nvinject;
pub mod registry;
pub mod spec;
pub mod trust;
pub mod validate;
pub mod version;
pub mod yaml;

pub use codec::{Format, ParseError};
pub use load::{SpecError, load_file, load_trusted_file, parse_and_validate};
pub use name::{Kind, NameError, QualifiedName};
pub use registry::{DEFAULT_SPEC_DIRS, Registry, ResolveError, Resolved};
pub use spec::{
    ContainerEdits, Device, DeviceNode, DeviceType, HOOK_ENV, Hook, IntelRdt, Mount, NetDevice, Spec,
    minimal_hook_env,
};
pub use trust::{Owners, UntrustedError};
pub use validate::{Problem, validate};
pub use version::{CdiVersion, minimum_version};
