//! What a test cluster runs: the kubelet and control plane from `integration/kubelet/build-kubelet.sh`
//! (one build, one cache directory), etcd, kubectl and the CNI plugins from
//! `integration/kubelet/fetch-cluster-debs.sh` (Debian 12's packages, unpacked).

use std::path::{Path, PathBuf};

use nvinject_node_harness::artifacts::setup_script;
use nvinject_node_harness::kubelet::{KubeletArtifacts, KubeletError, cached_path, kubelet_artifacts};

/// Everything a cluster runs, built or fetched into the cache.
#[derive(Debug, Clone)]
pub struct ClusterArtifacts {
    /// The kubelet and the pause image (and the build stamp, shared by the control plane).
    pub kubelet: KubeletArtifacts,
    /// `kube-apiserver`, from the kubelet's build.
    pub kube_apiserver: PathBuf,
    /// `kube-controller-manager`, from the kubelet's build.
    pub kube_controller_manager: PathBuf,
    /// `kube-scheduler`, from the kubelet's build.
    pub kube_scheduler: PathBuf,
    /// Debian 12's etcd.
    pub etcd: PathBuf,
    /// Debian 12's kubectl (1.20).
    pub kubectl: PathBuf,
    /// Debian 12's CNI plugins (`bridge`, `host-local`, `loopback`, ...).
    pub cni_bin_dir: PathBuf,
}

/// The script that unpacks etcd, kubectl and the CNI plugins.
pub fn fetch_debs_script() -> PathBuf {
    setup_script("kubelet/fetch-cluster-debs.sh")
}

/// Finds the kubelet and control plane (`build-kubelet.sh`) and etcd, kubectl and the CNI plugins
/// (`fetch-cluster-debs.sh`) in the cache, as `./x setup` left them; nothing is built or fetched here.
/// A missing one is an error naming the command, not a skip.
pub fn cluster_artifacts() -> Result<ClusterArtifacts, KubeletError> {
    let kubelet = kubelet_artifacts()?;
    let dir = kubelet.kubelet.parent().unwrap_or(Path::new("/")).to_path_buf();
    let out = cached_path(&fetch_debs_script(), "etcd, kubectl and the CNI plugins (Debian 12's packages)")?;
    let debs = PathBuf::from(out);
    let a = ClusterArtifacts {
        kube_apiserver: dir.join("kube-apiserver"),
        kube_controller_manager: dir.join("kube-controller-manager"),
        kube_scheduler: dir.join("kube-scheduler"),
        kubelet,
        etcd: debs.join("usr/bin/etcd"),
        kubectl: debs.join("usr/bin/kubectl"),
        cni_bin_dir: debs.join("usr/lib/cni"),
    };
    for p in [&a.kube_apiserver, &a.kube_controller_manager, &a.kube_scheduler, &a.etcd, &a.kubectl] {
        if !p.is_file() {
            return Err(KubeletError::Command {
                command: "cluster artifacts".into(),
                detail: format!("{} is missing after the build scripts ran", p.display()),
            });
        }
    }
    Ok(a)
}
