//! Files a loaded NVIDIA driver exposes under `/proc` and `/sys`, rendered from a description.
//!
//! Formats follow the open kernel module's `nv-procfs.c` (the `information` lines and their tab
//! layout, the `version` file's two lines, the `DeviceFile*` records of the capability files).
//! Values the description does not carry (VBIOS version, DMA width, IRQ) are fixed per architecture
//! so that the same preset always gives the same bytes.

use crate::description::{Architecture, GpuDescription};
use crate::elf::Machine;

use super::devices::linux_bus_id;

/// `/proc/driver/nvidia/version` of the proprietary kernel module.
pub fn version_file(driver_version: &str, machine: Machine) -> String {
    let arch = match machine {
        Machine::X86_64 => "x86_64",
        Machine::Aarch64 => "aarch64",
    };
    format!(
        "NVRM version: NVIDIA UNIX {arch} Kernel Module  {driver_version}  Tue Mar  5 22:23:56 UTC 2024\n\
         GCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n"
    )
}

/// `/proc/driver/nvidia/params`, reduced to the device-file settings tools read (`nvidia-modprobe`
/// takes the mode of the nodes it creates from `DeviceFileMode`: 438 = 0666).
pub fn params_file() -> String {
    "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n\
     DeviceFileGID: 0\nDeviceFileMode: 438\nEnableGpuFirmware: 18\n"
        .to_owned()
}

fn vbios(arch: Architecture) -> &'static str {
    match arch {
        Architecture::Hopper | Architecture::Blackwell => "96.00.74.00.0D",
        Architecture::Ada => "95.04.29.00.0A",
        Architecture::Ampere => "92.00.45.00.06",
        _ => "90.04.96.00.01",
    }
}

fn dma_bits(arch: Architecture) -> u32 {
    match arch {
        Architecture::Hopper | Architecture::Blackwell => 52,
        _ => 47,
    }
}

/// `/proc/driver/nvidia/gpus/<bus id>/information`.
pub fn information_file(gpu: &GpuDescription, driver_version: &str) -> String {
    let bits = dma_bits(gpu.architecture);
    let mask = (1u64 << bits) - 1;
    // GSP firmware runs on Turing and later; the driver then reports its version.
    let firmware = if gpu.architecture.nvml_value() >= Architecture::Turing.nvml_value() {
        format!("GPU Firmware: \t {driver_version}\n")
    } else {
        String::new()
    };
    format!(
        "Model: \t\t {name}\nIRQ:   \t\t 0\nGPU UUID: \t {uuid}\nVideo BIOS: \t {vbios}\nBus Type: \t PCIe\n\
         DMA Size: \t {bits} bits\nDMA Mask: \t 0x{mask:x}\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n\
         {firmware}GPU Excluded:\t No\n",
        name = gpu.name,
        uuid = gpu.uuid,
        vbios = vbios(gpu.architecture),
        bus = linux_bus_id(&gpu.pci_bus_id),
        minor = gpu.minor,
    )
}

/// A capability file (`capabilities/mig/config`, `.../gi<i>/access`): the minor and mode of the
/// device node `nvidia-modprobe` creates for it. `mode` is written in decimal, as the driver does.
pub fn capability_file(minor: u32, mode: u32) -> String {
    format!("DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n")
}

/// Files of `/sys/bus/pci/devices/<bus id>/`: `(name, contents)`.
pub fn sysfs_pci_files(gpu: &GpuDescription) -> Vec<(&'static str, String)> {
    let numa = gpu.numa_node.map_or("-1".to_owned(), |n| n.to_string());
    vec![
        ("vendor", format!("0x{:04x}\n", gpu.pci_device_id & 0xffff)),
        ("device", format!("0x{:04x}\n", gpu.pci_device_id >> 16)),
        ("subsystem_vendor", format!("0x{:04x}\n", gpu.pci_subsystem_id & 0xffff)),
        ("subsystem_device", format!("0x{:04x}\n", gpu.pci_subsystem_id >> 16)),
        // 3D controller: what data-center and inference boards report.
        ("class", "0x030200\n".to_owned()),
        ("numa_node", format!("{numa}\n")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn information_has_the_drivers_layout() {
        let node = crate::presets::preset("h100x8").unwrap();
        let text = information_file(&node.gpus[1], "550.54.15");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Model: \t\t NVIDIA H100 80GB HBM3");
        assert_eq!(lines[2], format!("GPU UUID: \t {}", node.gpus[1].uuid));
        assert!(lines.contains(&"Bus Location: \t 0000:2a:00.0"));
        assert!(lines.contains(&"Device Minor: \t 1"));
        assert!(lines.contains(&"DMA Mask: \t 0xfffffffffffff"));
        assert_eq!(*lines.last().unwrap(), "GPU Excluded:\t No");
    }

    #[test]
    fn version_and_capability_records() {
        let v = version_file("550.54.15", Machine::X86_64);
        assert!(v.starts_with("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  "));
        assert_eq!(v.lines().count(), 2);
        assert_eq!(
            capability_file(1, 0o400),
            "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n"
        );
    }

    #[test]
    fn sysfs_ids_split_device_and_vendor() {
        let node = crate::presets::preset("h100x8").unwrap();
        let files = sysfs_pci_files(&node.gpus[0]);
        let get = |n: &str| files.iter().find(|(k, _)| *k == n).unwrap().1.clone();
        assert_eq!(get("vendor"), "0x10de\n");
        assert_eq!(get("device"), "0x2330\n");
        assert_eq!(get("numa_node"), "0\n");
    }
}
