//! The DevicePlugin gRPC service for one resource: translate, delegate to the pure core, translate back.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::allocate::{ContainerAllocation, allocate};
use crate::api;
use crate::health::HealthSnapshot;
use crate::metrics::{Metrics, ResourceHealthCount};
use crate::preferred::preferred;
use crate::resources::{Resource, Topology};
use crate::settings::Settings;

/// What a resource's service needs; shared by every server generation of that resource.
#[derive(Debug)]
pub struct ResourceContext {
    /// The resource served.
    pub resource: Resource,
    /// Settings (strategies, prefixes, dev root).
    pub settings: Arc<Settings>,
    /// Control device nodes present on the host.
    pub control_nodes: Arc<Vec<String>>,
    /// GPU distances.
    pub topology: Arc<Topology>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// The CDI spec checked against the loaded driver before Allocate answers (containerd's own
    /// CDI reads it before our shim could regenerate it); `None` when not configured.
    pub freshness: Option<Arc<crate::freshness::SpecFreshness>>,
}

/// The options this plugin registers with and reports.
pub fn options() -> api::DevicePluginOptions {
    api::DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }
}

/// The device list for ListAndWatch: every advertised device with its health and NUMA node.
pub fn device_list(resource: &Resource, health: &HealthSnapshot) -> Vec<api::Device> {
    resource
        .devices
        .iter()
        .map(|d| {
            let t = resource.target_of(d);
            api::Device {
                id: d.id.clone(),
                health: if health.is_healthy(&t.uuid) { api::HEALTHY } else { api::UNHEALTHY }.to_owned(),
                topology: t
                    .numa_node
                    .map(|n| api::TopologyInfo { nodes: vec![api::NumaNode { id: i64::from(n) }] }),
            }
        })
        .collect()
}

/// Devices by health, for the metrics gauge.
pub fn health_count(resource: &Resource, health: &HealthSnapshot) -> ResourceHealthCount {
    let unhealthy =
        resource.devices.iter().filter(|d| !health.is_healthy(&resource.target_of(d).uuid)).count();
    ResourceHealthCount {
        resource: resource.name.to_string(),
        healthy: resource.devices.len() - unhealthy,
        unhealthy,
    }
}

fn to_proto(a: ContainerAllocation) -> api::ContainerAllocateResponse {
    api::ContainerAllocateResponse {
        envs: a.envs,
        mounts: a
            .mounts
            .into_iter()
            .map(|m| api::Mount {
                container_path: m.container_path,
                host_path: m.host_path,
                read_only: m.read_only,
            })
            .collect(),
        devices: a
            .device_specs
            .into_iter()
            .map(|d| api::DeviceSpec {
                container_path: d.container_path,
                host_path: d.host_path,
                permissions: d.permissions,
            })
            .collect(),
        annotations: a.annotations,
        cdi_devices: a.cdi_devices.into_iter().map(|name| api::CdiDevice { name }).collect(),
    }
}

/// One generation of a resource's gRPC service. `stop` ends its ListAndWatch streams so the
/// server can shut down (the kubelet then reconnects to the next generation).
#[derive(Debug, Clone)]
pub struct PluginService {
    ctx: Arc<ResourceContext>,
    health: watch::Receiver<HealthSnapshot>,
    stop: watch::Receiver<bool>,
}

impl PluginService {
    /// A service over `ctx`, following `health`, ending streams when `stop` turns true.
    pub fn new(
        ctx: Arc<ResourceContext>,
        health: watch::Receiver<HealthSnapshot>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        PluginService { ctx, health, stop }
    }
}

#[tonic::async_trait]
impl api::device_plugin_server::DevicePlugin for PluginService {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = ReceiverStream<Result<api::ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let ctx = self.ctx.clone();
        let mut health = self.health.clone();
        let mut stop = self.stop.clone();
        tokio::spawn(async move {
            let mut last: Option<Vec<api::Device>> = None;
            loop {
                let devices = device_list(&ctx.resource, &health.borrow_and_update());
                // Health changes of other resources' devices wake every stream; send only news.
                if last.as_ref() != Some(&devices) {
                    let msg = api::ListAndWatchResponse { devices: devices.clone() };
                    if tx.send(Ok(msg)).await.is_err() {
                        break;
                    }
                    tracing::debug!(resource = %ctx.resource.name, "ListAndWatch update sent");
                    last = Some(devices);
                }
                let tracking_ended = tokio::select! {
                    changed = health.changed() => changed.is_err(),
                    _ = stop.wait_for(|s| *s) => break,
                    _ = tx.closed() => break,
                };
                if tracking_ended {
                    // Health tracking ended (NVML gone): the list is final, but the stream stays
                    // open, or the kubelet would drop every device.
                    tokio::select! {
                        _ = stop.wait_for(|s| *s) => {},
                        _ = tx.closed() => {},
                    }
                    break;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let ctx = &self.ctx;
        let mut container_responses = Vec::new();
        for c in request.into_inner().container_requests {
            let ids = preferred(
                &ctx.resource,
                &ctx.topology,
                &c.available_device_i_ds,
                &c.must_include_device_i_ds,
                i64::from(c.allocation_size),
            )?;
            container_responses.push(api::ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(Response::new(api::PreferredAllocationResponse { container_responses }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let ctx = &self.ctx;
        let name = ctx.resource.name.as_str();
        let requests = request.into_inner().container_requests;
        if let Some(freshness) = ctx.freshness.clone() {
            let checked = tokio::task::spawn_blocking(move || freshness.ensure_fresh()).await;
            if let Err(e) = checked.map_err(|e| e.to_string()).and_then(|r| r.map_err(|e| e.to_string())) {
                ctx.metrics.allocation(name, false, requests.len() as u64);
                tracing::error!(resource = name, error = %e, "Allocate refused: the CDI spec is not fresh");
                return Err(Status::unavailable(e));
            }
        }
        let mut container_responses = Vec::with_capacity(requests.len());
        for (i, c) in requests.iter().enumerate() {
            match allocate(&ctx.resource, &ctx.settings, &ctx.control_nodes, i, &c.devices_ids) {
                Ok(a) => container_responses.push(to_proto(a)),
                Err(e) => {
                    ctx.metrics.allocation(name, false, 1);
                    tracing::warn!(resource = name, error = %e, "Allocate refused");
                    return Err(e.into());
                }
            }
        }
        ctx.metrics.allocation(name, true, container_responses.len() as u64);
        Ok(Response::new(api::AllocateResponse { container_responses }))
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        // Registered with pre_start_required = false: nothing to do before a container starts.
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::tests::{gpu, inventory, settings};
    use crate::resources::{HostFacts, plan};
    use std::collections::BTreeSet;

    #[test]
    fn device_list_carries_health_and_numa() {
        let inv = inventory(vec![gpu(0, 0, &[]), gpu(1, 1, &[])], &[]);
        let p = plan(&inv, &settings(), &HostFacts::default()).unwrap();
        let r = &p.resources[0];
        let sick = HealthSnapshot {
            unhealthy: Arc::new(BTreeSet::from(["GPU-10000000-0000-0000-0000-000000000000".to_string()])),
        };
        let list = device_list(r, &sick);
        assert_eq!(list[0].health, "Healthy");
        assert_eq!(list[1].health, "Unhealthy");
        assert_eq!(list[1].topology.as_ref().unwrap().nodes[0].id, 1);
        assert_eq!(
            health_count(r, &sick),
            ResourceHealthCount { resource: "nvidia.com/gpu".into(), healthy: 1, unhealthy: 1 }
        );
    }
}
