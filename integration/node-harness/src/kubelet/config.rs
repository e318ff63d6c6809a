//! What the test node's daemons are told, as pure functions of paths and names: the kubelet's
//! configuration file and flags, containerd's configuration, and static pod manifests.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// Everything the standalone kubelet needs to know about its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletSettings {
    /// The node name (static pods are named `<pod>-<node>`).
    pub node_name: String,
    /// `--root-dir` (pods, plugins, checkpoints, certificates).
    pub root_dir: PathBuf,
    /// The configuration file written from [`KubeletSettings::config`].
    pub config_file: PathBuf,
    /// `staticPodPath`: the kubelet runs every manifest it finds there.
    pub manifest_dir: PathBuf,
    /// `cgroupRoot`: every cgroup the kubelet makes goes below it (it must exist in every hierarchy).
    pub cgroup_root: String,
    /// containerd's CRI socket.
    pub cri_socket: PathBuf,
    /// `--volume-plugin-dir` (the kubelet creates it: keep it in the test's directory).
    pub volume_plugin_dir: PathBuf,
    /// The sandbox image, so image garbage collection keeps it.
    pub pause_image: String,
    /// The kubelet's API port, on 127.0.0.1.
    pub port: u16,
    /// The health port, on 127.0.0.1.
    pub healthz_port: u16,
    /// The read-only API port (plain HTTP, `/pods` with each pod's status), on 127.0.0.1 of the
    /// test's own network namespace: how a test sees admission results without an API server.
    pub read_only_port: u16,
    /// The API server this kubelet joins; `None`: standalone (static pods only).
    pub api: Option<ApiServerLink>,
}

/// How a kubelet joins a cluster: its kubeconfig, the node address it registers (the kubelet refuses
/// a loopback one) and the labels it registers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiServerLink {
    /// `--kubeconfig`: the API server's address, its CA and the node's client certificate.
    pub kubeconfig: PathBuf,
    /// `--node-ip`, also the address the kubelet serves on (the API server reaches it there for logs).
    pub node_ip: String,
    /// `--node-labels`, e.g. `nvidia.com/gpu.present=true` (what nvinject's DaemonSets select).
    pub node_labels: Vec<(String, String)>,
}

impl KubeletSettings {
    /// The KubeletConfiguration (v1beta1), as JSON (which the kubelet's YAML decoder reads).
    pub fn config(&self) -> Value {
        let mut config = self.standalone_config();
        if let Some(api) = &self.api {
            config["address"] = json!(api.node_ip);
            // The default is 10 s; GPU counts and Ready reach the API server sooner.
            config["nodeStatusUpdateFrequency"] = json!("4s");
            // The default is 1 min: a ConfigMap volume (the device plugin's config) is refreshed on
            // this period, so an edited config reaches the plugin within seconds.
            config["syncFrequency"] = json!("10s");
        }
        config
    }

    fn standalone_config(&self) -> Value {
        json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "staticPodPath": self.manifest_dir,
            // The file source also watches with inotify; this is its fallback re-list.
            "fileCheckFrequency": "1s",
            "address": "127.0.0.1",
            "port": self.port,
            "readOnlyPort": self.read_only_port,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {
                "anonymous": { "enabled": true },
                "webhook": { "enabled": false },
            },
            "authorization": { "mode": "AlwaysAllow" },
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "cgroupsPerQOS": true,
            "enforceNodeAllocatable": ["pods"],
            "failSwapOn": false,
            // No iptables chains: the test's network namespace has no use for them.
            "makeIPTablesUtilChains": false,
            // A shared CI disk must not evict or refuse test pods; the node stays realistic otherwise.
            "evictionHard": { "memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%" },
            // 100 disables image garbage collection: the test's images cannot be pulled again.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "resolvConf": "/etc/resolv.conf",
        })
    }

    /// The kubelet's command-line arguments (the flags 1.20 does not take from the file).
    pub fn args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        let mut flag = |name: &str, value: &dyn AsRef<std::ffi::OsStr>| {
            let mut s = OsString::from(format!("--{name}="));
            s.push(value.as_ref());
            args.push(s);
        };
        flag("config", &self.config_file);
        flag("container-runtime", &"remote");
        let mut endpoint = OsString::from("unix://");
        endpoint.push(&self.cri_socket);
        flag("container-runtime-endpoint", &endpoint);
        flag("root-dir", &self.root_dir);
        // Its default is /var/lib/kubelet/pki whatever the root dir: the serving certificate it makes
        // for itself would be written outside the test's directories.
        flag("cert-dir", &self.root_dir.join("pki"));
        flag("hostname-override", &self.node_name);
        match &self.api {
            None => flag("node-ip", &"127.0.0.1"),
            Some(api) => {
                flag("kubeconfig", &api.kubeconfig);
                flag("node-ip", &api.node_ip);
                let labels: Vec<String> = api.node_labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                if !labels.is_empty() {
                    flag("node-labels", &labels.join(","));
                }
            }
        }
        flag("pod-infra-container-image", &self.pause_image);
        flag("volume-plugin-dir", &self.volume_plugin_dir);
        flag("v", &"2");
        args
    }
}

/// containerd's `/etc/containerd/config.toml` on the test node: Debian 12's file (CNI dirs, `opt` under
/// the root) plus what a kubelet node needs from CRI: the locally built sandbox image, streaming on
/// loopback only, runc as the default runtime, oom_score_adj kept within what the test may set.
/// CNI plugins come from `cni_bin_dir` (Debian's `/usr/lib/cni`, or the unpacked package's).
/// Root, state and sockets stay at containerd's defaults (`/var/lib/containerd`, `/run/containerd`),
/// which the node shadows with test directories; the installer adds its runtime through a drop-in.
pub fn containerd_node_config(pause_image: &str, cni_bin_dir: &Path) -> String {
    let image = Value::String(pause_image.to_owned());
    let cni_bin_dir = Value::String(cni_bin_dir.to_string_lossy().into_owned());
    format!(
        r#"# containerd on an nvinject test node: Debian 12's config.toml plus the CRI settings below.
version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    # Built locally from the kubelet's source tree: a test node pulls nothing.
    sandbox_image = {image}
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    # The machines this runs on (CI included) withhold CAP_SYS_RESOURCE even from root, so the
    # negative oom_score_adj the kubelet asks for pod sandboxes cannot be set: runc's init would fail.
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = {cni_bin_dir}
      conf_dir = "/etc/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
"#
    )
}

/// A container of a static pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodContainer {
    /// Its name in the pod.
    pub name: String,
    /// Its image (must already be in containerd's `k8s.io` namespace: nothing is pulled).
    pub image: String,
    /// Entrypoint override (empty: the image's).
    pub command: Vec<String>,
    /// Resource limits, e.g. `("nvidia.com/gpu", "1")`.
    pub limits: Vec<(String, String)>,
    /// Environment variables.
    pub env: Vec<(String, String)>,
}

/// A static pod, host network (the test node has no CNI), one-second termination grace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticPod {
    /// The name in the manifest (the kubelet appends `-<node>`).
    pub name: String,
    /// The namespace.
    pub namespace: String,
    /// The containers.
    pub containers: Vec<PodContainer>,
}

impl StaticPod {
    /// A pod with one container `main` running `image` with `command`.
    pub fn single(name: &str, image: &str, command: &[&str]) -> Self {
        StaticPod {
            name: name.to_owned(),
            namespace: "default".to_owned(),
            containers: vec![PodContainer {
                name: "main".to_owned(),
                image: image.to_owned(),
                command: command.iter().map(|s| (*s).to_owned()).collect(),
                limits: Vec::new(),
                env: Vec::new(),
            }],
        }
    }

    /// Adds a resource limit to every container (and so a request: the kubelet defaults one to the other).
    pub fn with_limit(mut self, resource: &str, quantity: &str) -> Self {
        for c in &mut self.containers {
            c.limits.push((resource.to_owned(), quantity.to_owned()));
        }
        self
    }

    /// The name the kubelet gives the pod on node `node`, as found in CRI labels.
    pub fn full_name(&self, node: &str) -> String {
        format!("{}-{node}", self.name)
    }

    /// The Pod manifest, as JSON.
    pub fn manifest(&self) -> Value {
        let containers: Vec<Value> = self
            .containers
            .iter()
            .map(|c| {
                let mut v = json!({
                    "name": c.name,
                    "image": c.image,
                    "imagePullPolicy": "Never",
                });
                if !c.command.is_empty() {
                    v["command"] = json!(c.command);
                }
                if !c.limits.is_empty() {
                    let limits: serde_json::Map<String, Value> =
                        c.limits.iter().map(|(k, q)| (k.clone(), Value::String(q.clone()))).collect();
                    v["resources"] = json!({ "limits": limits });
                }
                if !c.env.is_empty() {
                    v["env"] = c.env.iter().map(|(k, val)| json!({ "name": k, "value": val })).collect();
                }
                v
            })
            .collect();
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": self.name, "namespace": self.namespace },
            "spec": {
                "hostNetwork": true,
                "terminationGracePeriodSeconds": 1,
                "containers": containers,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> KubeletSettings {
        KubeletSettings {
            node_name: "node-a".into(),
            root_dir: "/w/kubelet".into(),
            config_file: "/w/kubelet.json".into(),
            manifest_dir: "/w/manifests".into(),
            cgroup_root: "/nvinject-t-1".into(),
            cri_socket: "/w/containerd/containerd.sock".into(),
            volume_plugin_dir: "/w/volume-plugins".into(),
            pause_image: "localhost/nvinject/pause:3.4".into(),
            port: 10250,
            healthz_port: 10248,
            read_only_port: 10255,
            api: None,
        }
    }

    #[test]
    fn kubelet_config_is_standalone_loopback_and_keeps_host_settings() {
        let c = settings().config();
        assert_eq!(c["staticPodPath"], "/w/manifests");
        assert_eq!(c["address"], "127.0.0.1");
        assert_eq!(c["healthzBindAddress"], "127.0.0.1");
        assert_eq!(c["readOnlyPort"], 10255);
        assert_eq!(c["authorization"]["mode"], "AlwaysAllow");
        assert_eq!(c["authentication"]["anonymous"]["enabled"], true);
        assert_eq!(c["cgroupDriver"], "cgroupfs");
        assert_eq!(c["cgroupRoot"], "/nvinject-t-1");
        assert_eq!(c["failSwapOn"], false);
        assert_eq!(c["makeIPTablesUtilChains"], false);
    }

    #[test]
    fn kubelet_flags_point_at_the_private_runtime_and_dirs() {
        let args: Vec<String> = settings().args().into_iter().map(|a| a.into_string().unwrap()).collect();
        for expected in [
            "--config=/w/kubelet.json",
            "--container-runtime=remote",
            "--container-runtime-endpoint=unix:///w/containerd/containerd.sock",
            "--root-dir=/w/kubelet",
            "--cert-dir=/w/kubelet/pki",
            "--volume-plugin-dir=/w/volume-plugins",
            "--hostname-override=node-a",
        ] {
            assert!(args.iter().any(|a| a == expected), "{expected} missing from {args:?}");
        }
        assert!(!args.iter().any(|a| a.starts_with("--kubeconfig")), "standalone: no API server");
        assert!(args.iter().any(|a| a == "--node-ip=127.0.0.1"), "{args:?}");
    }

    #[test]
    fn a_kubelet_joining_an_api_server_registers_its_address_and_labels() {
        let mut s = settings();
        s.api = Some(ApiServerLink {
            kubeconfig: "/w/kubelet.kubeconfig".into(),
            node_ip: "10.77.0.1".into(),
            node_labels: vec![("nvidia.com/gpu.present".into(), "true".into()), ("a".into(), "b".into())],
        });
        let args: Vec<String> = s.args().into_iter().map(|a| a.into_string().unwrap()).collect();
        for expected in [
            "--kubeconfig=/w/kubelet.kubeconfig",
            "--node-ip=10.77.0.1",
            "--node-labels=nvidia.com/gpu.present=true,a=b",
        ] {
            assert!(args.iter().any(|a| a == expected), "{expected} missing from {args:?}");
        }
        let c = s.config();
        assert_eq!(c["address"], "10.77.0.1");
        assert_eq!(c["nodeStatusUpdateFrequency"], "4s");
        assert_eq!(c["syncFrequency"], "10s");
        assert_eq!(c["healthzBindAddress"], "127.0.0.1");
    }

    #[test]
    fn containerd_config_is_debians_plus_cri_on_loopback_with_the_local_pause_image() {
        let v: toml::Value = toml::from_str(&containerd_node_config(
            "localhost/nvinject/pause:3.4",
            Path::new("/usr/lib/cni"),
        ))
        .expect("valid TOML");
        assert_eq!(v["version"].as_integer(), Some(2));
        assert!(v.get("root").is_none() && v.get("state").is_none(), "containerd's default dirs (shadowed)");
        let cri = &v["plugins"]["io.containerd.grpc.v1.cri"];
        assert_eq!(cri["sandbox_image"].as_str(), Some("localhost/nvinject/pause:3.4"));
        assert_eq!(cri["stream_server_address"].as_str(), Some("127.0.0.1"));
        assert_eq!(cri["containerd"]["default_runtime_name"].as_str(), Some("runc"));
        assert_eq!(
            cri["containerd"]["runtimes"]["runc"]["runtime_type"].as_str(),
            Some("io.containerd.runc.v2")
        );
    }

    #[test]
    fn static_pod_manifest_asks_for_the_limit_and_never_pulls() {
        let pod = StaticPod::single("gpu-a", "localhost/probe:1", &["/probe", "sleep"])
            .with_limit("nvidia.com/gpu", "1");
        let m = pod.manifest();
        assert_eq!(m["metadata"]["name"], "gpu-a");
        assert_eq!(m["spec"]["hostNetwork"], true);
        let c = &m["spec"]["containers"][0];
        assert_eq!(c["imagePullPolicy"], "Never");
        assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], "1");
        assert_eq!(c["command"][1], "sleep");
        assert_eq!(pod.full_name("node-a"), "gpu-a-node-a");
    }
}
