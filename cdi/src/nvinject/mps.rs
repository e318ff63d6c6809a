//! The MPS device: the one device of nvinject's spec that is not a GPU.
//!
//! With `--mps-pipe-dir`, `nvinject-cdi` writes the MPS control daemon's pipe folder (mounted
//! read-write) and `CUDA_MPS_PIPE_DIRECTORY` as the edits of a device named [`MPS_DEVICE`], never
//! as common edits: only a container handed that device (the device plugin hands it out with the
//! GPUs of an MPS-shared resource) sees the folder. Writer (cdi-gen), handers-out (the device
//! plugin) and the shim's check ([`check_mps_request`]) all name it through [`mps_device`].
//!
//! The name cannot be a GPU's: GPU and MIG devices are named by NVML index (`0`, `0:1`), UUID
//! (`GPU-...`, `MIG-...`) or type and index (`gpu0`, `mig0:1`), and the spec's union device is
//! `all`.

use crate::name::{Kind, QualifiedName};

/// The device name (inside the spec's kind) of the MPS pipe folder's edits.
pub const MPS_DEVICE: &str = "mps";

/// `<kind>=mps`.
pub fn mps_device(kind: &Kind) -> QualifiedName {
    QualifiedName::new(kind.clone(), MPS_DEVICE).expect("`mps` is a valid CDI device name (pinned by a test)")
}

/// Whether `name` is the MPS device of its kind.
pub fn is_mps_device(name: &QualifiedName) -> bool {
    name.name() == MPS_DEVICE
}

/// A request for the MPS device without a GPU of its kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{mps} was requested without a GPU of kind {kind}: the MPS device only goes with the GPUs of an \
     MPS-shared resource (the device plugin hands both out); request a GPU as well, or drop {mps}"
)]
pub struct MpsWithoutGpu {
    /// The MPS device requested.
    pub mps: QualifiedName,
    /// Its kind.
    pub kind: Kind,
}

/// Refuses a request naming an MPS device but no other device of the same kind: the pipe folder
/// is for the MPS clients of a GPU, and a container with no GPU has no business with the daemon.
pub fn check_mps_request(names: &[QualifiedName]) -> Result<(), MpsWithoutGpu> {
    for mps in names.iter().filter(|n| is_mps_device(n)) {
        if !names.iter().any(|n| n.kind() == mps.kind() && !is_mps_device(n)) {
            return Err(MpsWithoutGpu { mps: mps.clone(), kind: mps.kind().clone() });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<QualifiedName> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn the_mps_device_is_named_in_its_kind() {
        assert_eq!(mps_device(&crate::nvinject::default_kind()).to_string(), "nvidia.com/gpu=mps");
        let kind: Kind = "example.com/accel".parse().unwrap();
        assert_eq!(mps_device(&kind).to_string(), "example.com/accel=mps");
        assert!(is_mps_device(&mps_device(&kind)));
        assert!(!is_mps_device(&"nvidia.com/gpu=0".parse().unwrap()));
    }

    #[test]
    fn the_mps_device_goes_only_with_a_gpu_of_its_kind() {
        for ok in [
            &["nvidia.com/gpu=0", "nvidia.com/gpu=mps"][..],
            &["nvidia.com/gpu=mps", "nvidia.com/gpu=GPU-1"],
            &["nvidia.com/gpu=all", "nvidia.com/gpu=mps"],
            &["nvidia.com/gpu=0"],
            &[],
        ] {
            assert_eq!(check_mps_request(&names(ok)), Ok(()), "{ok:?}");
        }
        for bad in [
            &["nvidia.com/gpu=mps"][..],
            &["nvidia.com/gpu=mps", "nvidia.com/gpu=mps"],
            &["nvidia.com/gpu=mps", "example.com/accel=0"],
        ] {
            let e = check_mps_request(&names(bad)).unwrap_err();
            assert_eq!(e.mps.to_string(), "nvidia.com/gpu=mps", "{bad:?}");
            assert!(e.to_string().contains("without a GPU of kind nvidia.com/gpu"), "{e}");
        }
    }
}
