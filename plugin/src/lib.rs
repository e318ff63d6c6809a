//! The Kubernetes device plugin: advertises GPUs (whole, MIG, time-sliced) to the kubelet over
//! the deviceplugin v1beta1 gRPC API, tracks their health from NVML XID events, and answers
//! Allocate with the CDI names cdi-gen writes (or env vars, mounts, CRI CDI devices).
//!
//! Boundary: the policy is pure and lives in [`config`] (NVIDIA's file schema, and the merge of
//! file, environment and flags into [`settings::Settings`]), [`settings`] (what the plugin runs
//! with), [`resources`], [`allocate`], [`preferred`], [`health`] and [`labels`], with the small
//! value types [`resource_name`] and [`duration`]: functions of values, tested without sockets or
//! NVML. CDI kinds are `nvinject_cdi::Kind`, checked by the same rules the shim applies. The edges
//! are small: [`events`] (NVML behind the `XidSource` trait), [`service`] (tonic handlers that
//! translate and delegate), [`lifecycle`] (sockets, registration, re-registration), [`transport`]
//! (unix sockets; old kubelets' `:authority` fixed by the pure `nvinject_h2_authority` crate) and
//! [`metrics`], [`node_object`] (the GPU labels on the Node object, through the API server), and
//! [`freshness`], which keeps the CDI spec current before containerd's own CDI
//! reads it (by running `nvinject-cdi`: this crate never writes CDI specs itself). It never
//! touches the kubelet's state beyond its own sockets, and never panics on what the kubelet or a
//! config file sends it.

pub mod allocate;
pub mod api;
pub mod config;
pub mod config_watch;
pub mod duration;
pub mod error;
pub mod events;
pub mod freshness;
pub mod health;
pub mod labels;
pub mod lifecycle;
pub mod metrics;
pub mod node_object;
pub mod preferred;
pub mod resource_name;
pub mod resources;
pub mod service;
pub mod settings;
pub mod transport;
