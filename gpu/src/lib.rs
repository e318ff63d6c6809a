//! The GPU device model and NVML.
