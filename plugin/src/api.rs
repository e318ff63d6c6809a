//! The deviceplugin v1beta1 messages and services, generated from `proto/` at build time.

#![allow(missing_docs, clippy::all)]

tonic::include_proto!("v1beta1");

/// The API version this plugin registers with.
pub const VERSION: &str = "v1beta1";
/// Health value of a usable device.
pub const HEALTHY: &str = "Healthy";
/// Health value of a device the kubelet must not hand out.
pub const UNHEALTHY: &str = "Unhealthy";
