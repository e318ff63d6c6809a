//! Simulated NVML: a `libnvidia-ml.so.1` that exports NVML's C ABI and answers from a node description.
//!
//! Its job is to let real NVML callers (our `nvml-wrapper` layer, `nvidia-smi` stand-ins, NVIDIA's
//! Go bindings, python ctypes) run unchanged on a machine without a GPU. It reads the node description
//! once per `nvmlInit` (lookup order in `README.md`), decides which GPUs and MIG devices this process
//! may use from the device nodes it can open, and serves every NVML query from that snapshot. XID
//! events come from the description's append-only control file.
//!
//! Boundary: the library is loaded into every NVML user, including processes inside containers, so it
//! reads only the description, its own file and device nodes, writes nothing but one stderr line when
//! a description is unusable, and never lets a panic cross the C boundary. Every NVML function it does
//! not simulate is still exported and answers `NVML_ERROR_NOT_SUPPORTED` (or
//! `NVML_ERROR_UNINITIALIZED` before init): callers that resolve symbols eagerly or lazily must never
//! find one missing.
//!
//! Layout: [`node`] is the pure model (description + visibility -> enumerated objects), [`devfs`]
//! the device-node edge, [`source`] where the description comes from, [`events`] the XID file reader,
//! [`state`] the per-process NVML state, and `ffi` the exported functions.

pub mod devfs;
pub mod events;
pub mod node;
pub mod source;
pub mod state;

mod ffi;
mod stubs;

/// NVML functions this library simulates; every other name in `nvml-functions.txt` is a stub.
///
/// Kept by hand next to the `ffi` module; a unit test checks that this list and the stub list
/// together are exactly NVML's function list.
pub const SIMULATED_FUNCTIONS: &[&str] = &[
    "nvmlInit",
    "nvmlInit_v2",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleBySerial",
    "nvmlDeviceGetHandleByPciBusId",
    "nvmlDeviceGetHandleByPciBusId_v2",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetPciInfo_v2",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetBrand",
    "nvmlDeviceGetAttributes",
    "nvmlDeviceGetAttributes_v2",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetGpuInstanceById",
    "nvmlDeviceGetGpuInstances",
    "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlDeviceGetGpuInstanceProfileInfoV",
    "nvmlDeviceGetGpuInstancePossiblePlacements",
    "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
    "nvmlDeviceGetGpuInstanceRemainingCapacity",
    "nvmlGpuInstanceGetInfo",
    "nvmlGpuInstanceGetComputeInstanceById",
    "nvmlGpuInstanceGetComputeInstances",
    "nvmlGpuInstanceGetComputeInstanceProfileInfo",
    "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
    "nvmlGpuInstanceGetComputeInstanceRemainingCapacity",
    "nvmlComputeInstanceGetInfo",
    "nvmlComputeInstanceGetInfo_v2",
    "nvmlDeviceGetTopologyCommonAncestor",
    "nvmlDeviceGetTopologyNearestGpus",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkCapability",
    "nvmlDeviceGetNvLinkRemotePciInfo",
    "nvmlDeviceGetNvLinkRemotePciInfo_v2",
    "nvmlDeviceGetNvLinkRemoteDeviceType",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetCreate",
    "nvmlEventSetWait",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    #[test]
    fn simulated_plus_stubbed_is_exactly_nvmls_function_list() {
        let all: BTreeSet<&str> = include_str!("../nvml-functions.txt").lines().collect();
        let simulated: BTreeSet<&str> = super::SIMULATED_FUNCTIONS.iter().copied().collect();
        let stubbed: BTreeSet<&str> = crate::stubs::STUBBED.iter().copied().collect();
        assert_eq!(simulated.len(), super::SIMULATED_FUNCTIONS.len(), "duplicate in SIMULATED_FUNCTIONS");
        assert_eq!(stubbed.len(), crate::stubs::STUBBED.len(), "duplicate in STUBBED");
        assert!(
            simulated.is_disjoint(&stubbed),
            "{:?}",
            simulated.intersection(&stubbed).collect::<Vec<_>>()
        );
        let union: BTreeSet<&str> = simulated.union(&stubbed).copied().collect();
        assert_eq!(union, all, "missing: {:?}", all.difference(&union).collect::<Vec<_>>());
    }
}
