//! Simulated NVML.
