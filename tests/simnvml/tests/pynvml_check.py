"""NVIDIA's own Python NVML bindings (nvidia-ml-py, `import pynvml`) against the simulated library.

Usage: pynvml_check.py NODE_JSON. The library is found the way pynvml always finds it: by the name
libnvidia-ml.so.1 through the dynamic linker (LD_LIBRARY_PATH). Compares what pynvml reads with the
node description and prints `ok <name>: <n> GPUs, <m> MIG devices`.
"""
import json
import sys

import pynvml as n

node = json.load(open(sys.argv[1]))


def check(cond, what):
    if not cond:
        print("MISMATCH:", what)
        sys.exit(1)


n.nvmlInit()
check(n.nvmlSystemGetDriverVersion() == node["driver"]["version"], "driver version")
check(n.nvmlSystemGetCudaDriverVersion_v2() == node["driver"]["cuda_version"], "cuda version")
check(n.nvmlDeviceGetCount() == len(node["gpus"]), "device count")
migs = 0
for i, want in enumerate(node["gpus"]):
    h = n.nvmlDeviceGetHandleByIndex(i)
    check(n.nvmlDeviceGetName(h) == want["name"], f"gpu {i} name")
    check(n.nvmlDeviceGetUUID(h) == want["uuid"], f"gpu {i} uuid")
    check(n.nvmlDeviceGetMinorNumber(h) == want["minor"], f"gpu {i} minor")
    check(n.nvmlDeviceGetPciInfo(h).busId.upper() == want["pci_bus_id"].upper(), f"gpu {i} pci")
    check(n.nvmlDeviceGetMemoryInfo(h).total == want["memory_mib"] << 20, f"gpu {i} memory")
    check(list(n.nvmlDeviceGetCudaComputeCapability(h)) == want["compute_capability"], f"gpu {i} cc")
    check(n.nvmlDeviceGetHandleByUUID(want["uuid"]) is not None, f"gpu {i} by uuid")
    check(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU) == want["telemetry"]["temperature_c"], f"gpu {i} temp")
    check(n.nvmlDeviceGetPowerUsage(h) == want["telemetry"]["power_mw"], f"gpu {i} power")
    mig = want.get("mig")
    if mig is None:
        try:
            n.nvmlDeviceGetMigMode(h)
            check(False, f"gpu {i}: MIG mode must be NOT_SUPPORTED")
        except n.NVMLError_NotSupported:
            pass
        continue
    current, pending = n.nvmlDeviceGetMigMode(h)
    check(current == (1 if mig["enabled"] else 0), f"gpu {i} mig mode")
    if not mig["enabled"]:
        continue
    want_cis = [(gi["id"], ci["id"], ci["uuid"]) for gi in mig["gpu_instances"] for ci in gi["compute_instances"]]
    got = []
    for j in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
        except n.NVMLError_NotFound:
            continue
        check(n.nvmlDeviceIsMigDeviceHandle(m), f"gpu {i} mig {j} is a MIG handle")
        got.append((n.nvmlDeviceGetGpuInstanceId(m), n.nvmlDeviceGetComputeInstanceId(m), n.nvmlDeviceGetUUID(m)))
    check(got == want_cis, f"gpu {i} MIG devices {got} != {want_cis}")
    migs += len(got)
# Something NVML has but the simulation does not: an NVML error, never a crash.
try:
    n.nvmlDeviceGetClockInfo(n.nvmlDeviceGetHandleByIndex(0), n.NVML_CLOCK_GRAPHICS)
    check(False, "clock info must be NOT_SUPPORTED")
except n.NVMLError_NotSupported:
    pass
n.nvmlShutdown()
print(f"ok {node['name']}: {len(node['gpus'])} GPUs, {migs} MIG devices")
