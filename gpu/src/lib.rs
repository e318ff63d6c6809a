//! The GPU device model ([`Inventory`]) and its one source, NVML.
//!
//! Job: turn what NVML reports into an owned, plain value (GPUs, MIG devices, NVLink links, PCIe
//! topology, driver versions) that every other crate computes from, and name devices the way CDI
//! specs and the device plugin both do ([`naming`]), so the two can never disagree; and own the
//! facts about the driver's device nodes both hand out ([`devnodes`]: the control nodes, GPU and
//! MIG capability nodes with their numbers, the parser of the driver's MIG capability minors).
//!
//! Boundary: [`nvml`] is the only module that performs I/O (it loads `libnvidia-ml.so.1` through
//! `nvml-wrapper`, from a path the caller chooses). Everything else is pure. This crate never reads
//! the driver's files (callers read `mig-minors` and hand [`devnodes`] its text) or writes
//! anything; [`discover`] unloads NVML before it returns, and a caller that must keep it loaded
//! (the device plugin waits for XID events) holds the handle [`nvml::open`] gives it.

pub mod devnodes;
pub mod model;
pub mod naming;
pub mod nvml;

pub use devnodes::{DriverNode, MigCap, MigMinors};
pub use model::{
    ComputeCapability, CudaVersion, DeviceUuid, DriverInfo, Gpu, Inventory, MigDevice, MigProfile, NvLink,
    PciBusId, TopologyLevel,
};
pub use naming::{DeviceRef, NamingStrategy};
pub use nvml::{NvmlError, discover};
