//! The Kubernetes device plugin: advertises GPUs (whole, MIG, time-sliced) to the kubelet over the
//! deviceplugin v1beta1 gRPC API, tracks their health from NVML XID events and answers Allocate with
//! the CDI names cdi-gen writes.
//!
//! Not built yet: tracked by the device plugin issue.
