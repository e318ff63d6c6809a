#!/usr/bin/env python3
"""Derives what `nvidia-ctk cdi generate --mode=management --format=json` (toolkit 1.20.0, commit
d34b3046) writes for a simulated node, from the full-GPU spec nvidia-ctk recorded on that node and
the node's dev root. See README.md beside this file for why and how; nothing here is run by tests.

    python3 derive.py RECORDED.json NODE_DIR > OUT.json

RECORDED.json is a recording from ../nvidia-ctk-1.20.0 (placeholders kept), NODE_DIR the output
directory of `nvinject-simnode build` for the same preset (its dev root is NODE_DIR/host).
"""

import json
import os
import re
import stat
import sys

VERSION = "550.54.15"

# pkg/nvcdi/management.go, newManagementDeviceDiscoverer: the globs, in order.
DEVICE_GLOBS = [
    ("dev", re.compile(r"nvidia.*")),
    ("dev/nvidia-caps", re.compile(r"nvidia-cap.*")),
    ("dev", re.compile(r"nvidia-modeset")),
    ("dev", re.compile(r"nvidia-uvm-tools")),
    ("dev", re.compile(r"nvidia-uvm")),
    ("dev", re.compile(r"nvidiactl")),
    ("dev/nvidia-caps-imex-channels", re.compile(r"channel.*")),
]
# managementDiscoverer.nodeIsBlocked.
BLOCKED_PREFIXES = ("nvidia-fs", "nvidia-nvswitch", "nvidia-nvlink")

# pkg/nvcdi/driver-nvml.go, newDriverBinariesDiscoverer.
DRIVER_BINARIES = {
    "nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server", "nvidia-imex", "nvidia-imex-ctl",
}
# internal/discover/ipc.go.
IPC_PATHS = {"/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket",
             "/var/run/nvidia-persistenced/socket", "/var/run/nvidia-fabricmanager/socket", "/tmp/nvidia-mps"}
# The hooks newDriverVersionDiscoverer creates (its create-symlinks run is told apart below).
DRIVER_HOOKS = {"create-symlinks", "enable-cuda-compat", "update-ldcache", "disable-device-node-modification"}
# Links only the graphics discoverer asks for (internal/discover/graphics.go).
GRAPHICS_LINKS = re.compile(r"::.*/(gbm/nvidia-drm_gbm\.so|libnvidia-vulkan-producer\.so|libglxserver_nvidia\.so)$")


def from_driver_discoverer(mount):
    """Whether newDriverVersionDiscoverer (the only discoverer of management mode's common edits)
    produces this mount: versioned libraries, the legacy NVVM, IPC sockets, GSP firmware, the
    driver's binaries. Everything else nvml mode adds (graphics configs and libraries) is not."""
    path = mount["containerPath"]
    name = os.path.basename(path)
    if name.endswith(".so." + VERSION) and "/xorg/" not in path:
        return True
    if name.startswith("libnvidia-nvvm70.so."):
        return True
    if path in IPC_PATHS:
        return True
    if re.fullmatch(r"/lib/firmware/(updates/)?([^/]+/)?nvidia/" + re.escape(VERSION) + r"/gsp[^/]*\.bin", path):
        return True
    return os.path.dirname(path) in ("/usr/bin", "/usr/sbin", "/bin", "/sbin") and name in DRIVER_BINARIES


def from_driver_hooks(hook):
    sub = hook["args"][1]
    if sub not in DRIVER_HOOKS:
        return False
    links = [a for a in hook["args"] if "::" in a]
    return not (sub == "create-symlinks" and all(GRAPHICS_LINKS.search(a) for a in links))


def device_nodes(dev_root):
    """The char devices the globs find, as edits.device.toSpec writes them (Lstat'ed like
    AssertCharDevice and runc's DeviceFromPath; no type; zero major, minor and gid left out)."""
    seen, nodes = set(), []
    for rel_dir, pattern in DEVICE_GLOBS:
        directory = os.path.join(dev_root, rel_dir)
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            continue
        for name in names:
            if not pattern.fullmatch(name):
                continue
            host = os.path.join(directory, name)
            st = os.lstat(host)
            if not stat.S_ISCHR(st.st_mode) or host in seen or name.startswith(BLOCKED_PREFIXES):
                continue
            seen.add(host)
            node = {"path": "/" + os.path.join(rel_dir, name), "hostPath": "@DEV_ROOT@/" + os.path.join(rel_dir, name)}
            if os.major(st.st_rdev):
                node["major"] = os.major(st.st_rdev)
            if os.minor(st.st_rdev):
                node["minor"] = os.minor(st.st_rdev)
            if stat.S_IMODE(st.st_mode):
                node["fileMode"] = stat.S_IMODE(st.st_mode)
            node["permissions"] = "rwm"
            if st.st_gid:
                node["gid"] = st.st_gid
            nodes.append(node)
    # transform/sorter.go: by depth, then path.
    nodes.sort(key=lambda n: (n["path"].count("/"), n["path"]))
    return nodes


def main():
    recorded = json.load(open(sys.argv[1]))
    dev_root = os.path.join(sys.argv[2], "host")
    common = recorded["containerEdits"]
    nodes = device_nodes(dev_root)
    if not nodes:
        sys.exit("no NVIDIA device nodes found")
    edits = {
        "env": common["env"],
        "hooks": [h for h in common["hooks"] if from_driver_hooks(h)],
        "mounts": [m for m in common["mounts"] if from_driver_discoverer(m)],
    }
    for dropped in [m["containerPath"] for m in common["mounts"] if not from_driver_discoverer(m)]:
        print("dropped mount (nvml mode only):", dropped, file=sys.stderr)
    for dropped in [h["args"][1:] for h in common["hooks"] if not from_driver_hooks(h)]:
        print("dropped hook (nvml mode only):", dropped, file=sys.stderr)
    spec = {
        "cdiVersion": "0.5.0",  # hostPath on device nodes; nothing later is used
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "all", "containerEdits": {"deviceNodes": nodes}}],
        "containerEdits": edits,
    }
    sys.stdout.write(json.dumps(spec, separators=(",", ":")))


if __name__ == "__main__":
    main()
