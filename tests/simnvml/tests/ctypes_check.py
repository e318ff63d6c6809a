#!/usr/bin/env python3
"""Reads the simulated NVML through ctypes, as a non-Rust caller would, and compares with the node JSON.

Usage: ctypes_check.py <libnvidia-ml.so> <node.json>

The C structs are declared here from NVIDIA's nvml.h layouts, independently of the Rust bindings, so a
layout mistake in the library shows up as wrong values. Every GPU of the description must be visible
(the caller makes all device nodes). Exits non-zero with a message on the first mismatch; prints one
`ok` line on success.
"""

import ctypes
import json
import math
import sys

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
MIB = 1 << 20


class PciInfo(ctypes.Structure):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class MemoryV2(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class Attributes(ctypes.Structure):
    _fields_ = [
        ("multiprocessorCount", ctypes.c_uint),
        ("sharedCopyEngineCount", ctypes.c_uint),
        ("sharedDecoderCount", ctypes.c_uint),
        ("sharedEncoderCount", ctypes.c_uint),
        ("sharedJpegCount", ctypes.c_uint),
        ("sharedOfaCount", ctypes.c_uint),
        ("gpuInstanceSliceCount", ctypes.c_uint),
        ("computeInstanceSliceCount", ctypes.c_uint),
        ("memorySizeMB", ctypes.c_ulonglong),
    ]


MEMORY_V2 = ctypes.sizeof(MemoryV2) | (2 << 24)


def fail(message):
    sys.exit("ctypes_check: " + message)


def expect(what, got, want):
    if got != want:
        fail(f"{what}: got {got!r}, want {want!r}")


def check(ret, call):
    if ret != NVML_SUCCESS:
        fail(f"{call} returned {ret}")


def text(lib, fn, handle, size=96):
    buf = ctypes.create_string_buffer(size)
    check(fn(handle, buf, ctypes.c_uint(size)), fn.__name__)
    return buf.value.decode()


def memory_gb(total_mib, mig_mib):
    """The profile name's GB figure: share of the GPU rounded up to eighths (NVIDIA's go-nvlib rule)."""
    eighths = math.ceil(8 * mig_mib / total_mib)
    return round(eighths * math.ceil(total_mib / 1024) / 8)


def main():
    lib_path, node_path = sys.argv[1], sys.argv[2]
    with open(node_path) as f:
        node = json.load(f)
    lib = ctypes.CDLL(lib_path)
    lib.nvmlErrorString.restype = ctypes.c_char_p
    lib.nvmlErrorString.argtypes = [ctypes.c_uint]
    expect("nvmlErrorString(9)", lib.nvmlErrorString(9), b"Driver Not Loaded")

    check(lib.nvmlInit_v2(), "nvmlInit_v2")
    buf = ctypes.create_string_buffer(80)
    check(lib.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(80)), "nvmlSystemGetDriverVersion")
    expect("driver version", buf.value.decode(), node["driver"]["version"])
    cuda = ctypes.c_int()
    check(lib.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(cuda)), "nvmlSystemGetCudaDriverVersion_v2")
    expect("CUDA version", cuda.value, node["driver"]["cuda_version"])

    count = ctypes.c_uint()
    check(lib.nvmlDeviceGetCount_v2(ctypes.byref(count)), "nvmlDeviceGetCount_v2")
    expect("device count", count.value, len(node["gpus"]))

    mig_total = 0
    for i, gpu in enumerate(node["gpus"]):
        at = f"GPU {i}"
        handle = ctypes.c_void_p()
        check(lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(i), ctypes.byref(handle)), "GetHandleByIndex_v2")
        expect(f"{at} name", text(lib, lib.nvmlDeviceGetName, handle), gpu["name"])
        expect(f"{at} uuid", text(lib, lib.nvmlDeviceGetUUID, handle), gpu["uuid"])
        minor = ctypes.c_uint()
        check(lib.nvmlDeviceGetMinorNumber(handle, ctypes.byref(minor)), "GetMinorNumber")
        expect(f"{at} minor", minor.value, gpu["minor"])

        pci = PciInfo()
        check(lib.nvmlDeviceGetPciInfo_v3(handle, ctypes.byref(pci)), "GetPciInfo_v3")
        expect(f"{at} busId", pci.busId.decode(), gpu["pci_bus_id"])
        expect(f"{at} busIdLegacy", pci.busIdLegacy.decode(), gpu["pci_bus_id"][4:])
        expect(f"{at} bus", pci.bus, int(gpu["pci_bus_id"][9:11], 16))
        expect(f"{at} pciDeviceId", pci.pciDeviceId, gpu["pci_device_id"])
        expect(f"{at} pciSubSystemId", pci.pciSubSystemId, gpu["pci_subsystem_id"])

        mem = MemoryV2(version=MEMORY_V2)
        check(lib.nvmlDeviceGetMemoryInfo_v2(handle, ctypes.byref(mem)), "GetMemoryInfo_v2")
        expect(f"{at} memory total", mem.total, gpu["memory_mib"] * MIB)
        expect(f"{at} memory free + used + reserved", mem.free + mem.used + mem.reserved, mem.total)

        major, minor_cc = ctypes.c_int(), ctypes.c_int()
        check(lib.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor_cc)), "GetCC")
        expect(f"{at} compute capability", [major.value, minor_cc.value], gpu["compute_capability"])

        current, pending = ctypes.c_uint(), ctypes.c_uint()
        ret = lib.nvmlDeviceGetMigMode(handle, ctypes.byref(current), ctypes.byref(pending))
        mig = gpu.get("mig")
        if mig is None:
            expect(f"{at} MIG mode without MIG", ret, NVML_ERROR_NOT_SUPPORTED)
            continue
        check(ret, "GetMigMode")
        expect(f"{at} MIG mode", (current.value, pending.value), (int(mig["enabled"]),) * 2)
        if not mig["enabled"]:
            continue
        described = [(gi, ci) for gi in mig.get("gpu_instances", []) for ci in gi["compute_instances"]]
        max_count = ctypes.c_uint()
        check(lib.nvmlDeviceGetMaxMigDeviceCount(handle, ctypes.byref(max_count)), "GetMaxMigDeviceCount")
        found = 0
        for m in range(max_count.value):
            mig_handle = ctypes.c_void_p()
            ret = lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, ctypes.c_uint(m), ctypes.byref(mig_handle))
            if m >= len(described):
                expect(f"{at} MIG {m} beyond the described ones", ret, NVML_ERROR_NOT_FOUND)
                continue
            check(ret, "GetMigDeviceHandleByIndex")
            gi, ci = described[m]
            mat = f"{at} MIG {m}"
            expect(f"{mat} uuid", text(lib, lib.nvmlDeviceGetUUID, mig_handle), ci["uuid"])
            expect(f"{mat} name", text(lib, lib.nvmlDeviceGetName, mig_handle), f"{gpu['name']} MIG {ci['profile']}")
            ids = ctypes.c_uint(), ctypes.c_uint()
            check(lib.nvmlDeviceGetGpuInstanceId(mig_handle, ctypes.byref(ids[0])), "GetGpuInstanceId")
            check(lib.nvmlDeviceGetComputeInstanceId(mig_handle, ctypes.byref(ids[1])), "GetComputeInstanceId")
            expect(f"{mat} GI/CI ids", (ids[0].value, ids[1].value), (gi["id"], ci["id"]))
            mem = MemoryV2(version=MEMORY_V2)
            check(lib.nvmlDeviceGetMemoryInfo_v2(mig_handle, ctypes.byref(mem)), "GetMemoryInfo_v2 (MIG)")
            gb = int(gi["profile"].split(".")[1].split("gb")[0])
            expect(f"{mat} memory vs profile {gi['profile']}", memory_gb(gpu["memory_mib"], mem.total // MIB), gb)
            attrs = Attributes()
            check(lib.nvmlDeviceGetAttributes_v2(mig_handle, ctypes.byref(attrs)), "GetAttributes_v2")
            expect(f"{mat} GI slices", attrs.gpuInstanceSliceCount, int(gi["profile"].split("g.")[0]))
            expect(f"{mat} memorySizeMB", attrs.memorySizeMB * MIB, mem.total)
            found += 1
        expect(f"{at} MIG devices", found, len(described))
        mig_total += found

    check(lib.nvmlShutdown(), "nvmlShutdown")
    print(f"ok {node['name']}: {count.value} GPUs, {mig_total} MIG devices")


if __name__ == "__main__":
    main()
