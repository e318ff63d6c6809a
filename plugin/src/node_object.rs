//! The GPU labels on this node's Node object, through the API server (kube-rs): the edge beside
//! [`crate::labels`], which decides the labels, and [`crate::labels::node_object_patch`], which
//! decides the change. One GET of the Node, then one merge PATCH of its labels and of the
//! annotation that records which labels are nvinject's; nothing is written when nothing changed.
//!
//! Needs `get` and `patch` on `nodes` (the DaemonSet's ClusterRole grants only those) and the
//! pod's service-account token; outside a pod, a kubeconfig (`KUBECONFIG`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};

use crate::labels::{self, MANAGED_LABELS_ANNOTATION};

/// Why the Node object could not be labelled.
#[derive(Debug, thiserror::Error)]
pub enum NodeObjectError {
    /// No client configuration (no service-account token in a pod, no kubeconfig outside).
    #[error(
        "cannot configure a Kubernetes client: {0}; in a pod, mount the service-account token \
         (automountServiceAccountToken); outside one, set KUBECONFIG"
    )]
    Config(#[source] kube::Error),
    /// The API server refused or could not be reached.
    #[error("node {node}: {step} failed: {source}")]
    Api {
        /// The Node's name.
        node: String,
        /// `get` or `patch`.
        step: &'static str,
        /// What the client said.
        #[source]
        source: kube::Error,
    },
}

/// What one publication did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    /// The Node already carried exactly these labels.
    Unchanged,
    /// Labels set (new or changed value) and removed.
    Patched {
        /// Keys set.
        set: Vec<String>,
        /// Keys removed (nvinject's from an earlier run, no longer true).
        removed: Vec<String>,
    },
}

/// A client from the pod's service account (or `KUBECONFIG` outside a pod).
pub async fn client() -> Result<kube::Client, NodeObjectError> {
    // rustls needs one process-wide crypto provider; more than one crate in the tree enables one,
    // so it cannot pick on its own (it panics). Ring, kube's own choice; an earlier install stands.
    let _ = rustls::crypto::ring::default_provider().install_default();
    kube::Client::try_default().await.map_err(NodeObjectError::Config)
}

/// Makes node `node` carry `desired` as nvinject's labels: sets what differs, removes what an
/// earlier run set and `desired` no longer has, leaves every other label alone.
pub async fn publish(
    client: &kube::Client,
    node: &str,
    desired: &BTreeMap<String, String>,
) -> Result<Published, NodeObjectError> {
    let api: Api<Node> = Api::all(client.clone());
    let err = |step| move |source| NodeObjectError::Api { node: node.to_owned(), step, source };
    let current = api.get(node).await.map_err(err("get"))?;
    let labels_now = current.metadata.labels.unwrap_or_default();
    let managed = current.metadata.annotations.as_ref().and_then(|a| a.get(MANAGED_LABELS_ANNOTATION));
    let Some(patch) = labels::node_object_patch(desired, &labels_now, managed.map(String::as_str)) else {
        return Ok(Published::Unchanged);
    };
    api.patch(node, &PatchParams::default(), &Patch::Merge(&patch.body)).await.map_err(err("patch"))?;
    Ok(Published::Patched { set: patch.set, removed: patch.removed })
}
