//! The control plane of a test cluster: etcd (private data dir, on loopback), kube-apiserver (on the
//! node's address inside the test's network namespace, Node and RBAC authorization, the test's own
//! certificates), kube-controller-manager and kube-scheduler, each a [`Daemon`] stopped by its PID.
//! Every directory a component would default to on the host (`--cert-dir`, etcd's data dir) is given
//! one under the test's directory.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nvinject_node_harness::kubelet::daemon::Daemon;
use nvinject_node_harness::kubelet::node::http_get;
use nvinject_node_harness::kubelet::{KubeletError, wait_for};
use nvinject_node_harness::process;

use crate::artifacts::ClusterArtifacts;
use crate::pki::{CertPair, Pki, Usage};

/// The API server's secure port.
pub const APISERVER_PORT: u16 = 6443;
/// etcd's client port (loopback).
pub const ETCD_CLIENT_PORT: u16 = 2379;
/// The Service IP range (nothing routes it: the test runs no kube-proxy).
pub const SERVICE_CIDR: &str = "10.96.0.0/24";
/// The `kubernetes` Service's address, the first of [`SERVICE_CIDR`] (in the API server's certificate).
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";

/// A running control plane.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    kubectl: PathBuf,
    admin: PathBuf,
    server: String,
    /// The cluster's CA and keys (node certificates are issued as nodes join).
    pki: Pki,
    // Stopped in reverse: scheduler, controller-manager, API server, etcd.
    daemons: Vec<Daemon>,
}

/// The kubeconfigs and certificates the control plane made for others.
#[derive(Debug, Clone)]
pub struct Credentials {
    /// kubectl's (`system:masters`).
    pub admin: PathBuf,
    /// The node's kubelet (`system:node:<name>` in `system:nodes`, as the Node authorizer wants).
    pub kubelet: PathBuf,
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> KubeletError + use<> {
    let path = path.to_path_buf();
    move |source| KubeletError::Io { op, path, source }
}

fn flag(name: &str, value: impl AsRef<std::ffi::OsStr>) -> OsString {
    let mut s = OsString::from(format!("--{name}="));
    s.push(value.as_ref());
    s
}

/// The flags controller-manager and scheduler share: their kubeconfig for everything, a loopback
/// secure port of their own with self-made certificates in `cert_dir`, no insecure port and no
/// leader election (one of each).
fn component_flags(kubeconfig: &Path, secure_port: &str, cert_dir: &Path) -> Vec<OsString> {
    vec![
        flag("kubeconfig", kubeconfig),
        flag("authentication-kubeconfig", kubeconfig),
        flag("authorization-kubeconfig", kubeconfig),
        flag("bind-address", "127.0.0.1"),
        flag("secure-port", secure_port),
        flag("port", "0"),
        flag("cert-dir", cert_dir),
        flag("leader-elect", "false"),
        flag("v", "1"),
    ]
}

impl ControlPlane {
    /// Makes the certificates, then starts etcd, the API server, the controller-manager and the
    /// scheduler under `dir`, the API server on `address`; returns once the API server is ready.
    /// `node_name` gets a kubelet kubeconfig.
    pub fn start(
        artifacts: &ClusterArtifacts,
        dir: &Path,
        address: &str,
        node_name: &str,
    ) -> Result<(Self, Credentials), KubeletError> {
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(io("create", &logs))?;
        let pid_file = dir.join("pids");
        let pki = Pki::create(&dir.join("pki"))?;
        let server = format!("https://{address}:{APISERVER_PORT}");
        let serving = pki.issue(
            "apiserver",
            "kube-apiserver",
            &[],
            &Usage::Server {
                ips: vec![address.into(), KUBERNETES_SERVICE_IP.into(), "127.0.0.1".into()],
                dns: ["kubernetes", "kubernetes.default", "kubernetes.default.svc", "localhost"]
                    .map(String::from)
                    .to_vec(),
            },
        )?;
        let kubelet_client = pki.issue(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            &["system:masters"],
            &Usage::Client,
        )?;
        let admin_pair = pki.issue("admin", "kubernetes-admin", &["system:masters"], &Usage::Client)?;
        let admin = pki.kubeconfig("admin", &server, &admin_pair)?;
        let cm_pair =
            pki.issue("controller-manager", "system:kube-controller-manager", &[], &Usage::Client)?;
        let cm_kubeconfig = pki.kubeconfig("controller-manager", &server, &cm_pair)?;
        let sched_pair = pki.issue("scheduler", "system:kube-scheduler", &[], &Usage::Client)?;
        let sched_kubeconfig = pki.kubeconfig("scheduler", &server, &sched_pair)?;
        let node_pair =
            pki.issue("kubelet", &format!("system:node:{node_name}"), &["system:nodes"], &Usage::Client)?;
        let kubelet = pki.kubeconfig("kubelet", &server, &node_pair)?;

        let mut plane = ControlPlane {
            dir: dir.to_path_buf(),
            kubectl: artifacts.kubectl.clone(),
            admin: admin.clone(),
            server,
            // Its serial counter goes on from here; the local copy only lends paths below.
            pki: pki.clone(),
            daemons: Vec::new(),
        };
        plane.start_etcd(artifacts, &logs, &pid_file)?;
        plane.start_apiserver(artifacts, &pki, &serving, &kubelet_client, address, &logs, &pid_file)?;
        let mut cmd = Command::new(&artifacts.kube_controller_manager);
        cmd.args(component_flags(&cm_kubeconfig, "10257", &dir.join("controller-manager-certs"))).args([
            flag("service-account-private-key-file", &pki.service_account_key),
            flag("root-ca-file", &pki.ca.cert),
            // Each controller acts as its own service account (what the RBAC bootstrap roles expect).
            flag("use-service-account-credentials", "true"),
            // Its default, /usr/libexec/kubernetes/kubelet-plugins/volume/exec, is created at start
            // (the flexvolume prober): a host write a test must not make.
            flag("flex-volume-plugin-dir", dir.join("flexvolume")),
        ]);
        plane.spawn("kube-controller-manager", cmd, &logs, &pid_file)?;
        let mut cmd = Command::new(&artifacts.kube_scheduler);
        cmd.args(component_flags(&sched_kubeconfig, "10259", &dir.join("scheduler-certs")));
        plane.spawn("kube-scheduler", cmd, &logs, &pid_file)?;
        Ok((plane, Credentials { admin, kubelet }))
    }

    fn spawn(&mut self, name: &str, cmd: Command, logs: &Path, pid_file: &Path) -> Result<(), KubeletError> {
        let d = Daemon::spawn(name, cmd, &logs.join(format!("{name}.log")), pid_file)?;
        self.daemons.push(d);
        Ok(())
    }

    fn start_etcd(
        &mut self,
        artifacts: &ClusterArtifacts,
        logs: &Path,
        pid_file: &Path,
    ) -> Result<(), KubeletError> {
        let client = format!("http://127.0.0.1:{ETCD_CLIENT_PORT}");
        let peer = "http://127.0.0.1:2380";
        let mut cmd = Command::new(&artifacts.etcd);
        cmd.args([
            flag("name", "nvinject-test"),
            flag("data-dir", self.dir.join("etcd")),
            flag("listen-client-urls", &client),
            flag("advertise-client-urls", &client),
            flag("listen-peer-urls", peer),
            flag("initial-advertise-peer-urls", peer),
            flag("initial-cluster", format!("nvinject-test={peer}")),
        ]);
        self.spawn("etcd", cmd, logs, pid_file)?;
        let started = Instant::now();
        let d = self.daemons.last_mut().expect("just started");
        wait_for("etcd to be healthy", Duration::from_secs(30), Duration::from_millis(50), || {
            if let Some(status) = d.exited() {
                return Err(KubeletError::Exited {
                    daemon: "etcd".into(),
                    status: status.to_string(),
                    log: d.log_tail(20),
                });
            }
            Ok(http_get(ETCD_CLIENT_PORT, "/health").ok().filter(|b| b.contains("\"true\"")).map(|_| ()))
        })
        .map_err(|e| e.with_log(d))?;
        tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, "etcd healthy");
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn start_apiserver(
        &mut self,
        artifacts: &ClusterArtifacts,
        pki: &Pki,
        serving: &CertPair,
        kubelet_client: &CertPair,
        address: &str,
        logs: &Path,
        pid_file: &Path,
    ) -> Result<(), KubeletError> {
        let mut cmd = Command::new(&artifacts.kube_apiserver);
        cmd.args([
            flag("etcd-servers", format!("http://127.0.0.1:{ETCD_CLIENT_PORT}")),
            flag("bind-address", address),
            flag("advertise-address", address),
            flag("secure-port", APISERVER_PORT.to_string()),
            flag("insecure-port", "0"),
            flag("cert-dir", self.dir.join("apiserver-certs")),
            flag("tls-cert-file", &serving.cert),
            flag("tls-private-key-file", &serving.key),
            flag("client-ca-file", &pki.ca.cert),
            flag("kubelet-client-certificate", &kubelet_client.cert),
            flag("kubelet-client-key", &kubelet_client.key),
            // The node's address, not its name: nothing in the namespace resolves names.
            flag("kubelet-preferred-address-types", "InternalIP"),
            flag("service-account-key-file", &pki.service_account_pub),
            flag("service-account-signing-key-file", &pki.service_account_key),
            flag("service-account-issuer", "https://kubernetes.default.svc"),
            flag("service-cluster-ip-range", SERVICE_CIDR),
            flag("authorization-mode", "Node,RBAC"),
            flag("enable-admission-plugins", "NodeRestriction"),
            // nvinject's DaemonSets are privileged (they configure the node).
            flag("allow-privileged", "true"),
            flag("profiling", "false"),
            flag("v", "1"),
        ]);
        self.spawn("kube-apiserver", cmd, logs, pid_file)?;
        let started = Instant::now();
        let mut readyz = self.kubectl();
        readyz.args(["get", "--raw", "/readyz"]);
        let d = self.daemons.last_mut().expect("just started");
        wait_for("the API server to be ready", Duration::from_secs(120), Duration::from_millis(250), || {
            if let Some(status) = d.exited() {
                return Err(KubeletError::Exited {
                    daemon: "kube-apiserver".into(),
                    status: status.to_string(),
                    log: d.log_tail(30),
                });
            }
            let out = process::output(&mut readyz)?;
            Ok((out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok").then_some(()))
        })
        .map_err(|e| e.with_log(d))?;
        tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, "kube-apiserver ready");
        Ok(())
    }

    /// `kubectl --kubeconfig <admin>`: the operator's view.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(&self.kubectl);
        cmd.arg("--kubeconfig").arg(&self.admin).arg("--request-timeout=20s");
        cmd
    }

    /// Runs kubectl with `args`; its stdout, or an error with its stderr.
    pub fn kubectl_out(&self, args: &[&str]) -> Result<String, KubeletError> {
        let out = process::output(self.kubectl().args(args))?;
        if !out.status.success() {
            return Err(KubeletError::Command {
                command: format!("kubectl {}", args.join(" ")),
                detail: format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl get <args> -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> Result<serde_json::Value, KubeletError> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let text = self.kubectl_out(&all)?;
        serde_json::from_str(&text).map_err(|e| KubeletError::Command {
            command: format!("kubectl {}", all.join(" ")),
            detail: format!("not JSON: {e}"),
        })
    }

    /// `kubectl apply -f <file>` with `manifest` (JSON) written under the control plane's directory.
    pub fn apply(&self, manifest: &serde_json::Value) -> Result<String, KubeletError> {
        let dir = self.dir.join("applied");
        std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        let name = manifest["metadata"]["name"].as_str().unwrap_or("object");
        let file = dir.join(format!("{name}.json"));
        std::fs::write(&file, serde_json::to_string_pretty(manifest).expect("JSON values serialise"))
            .map_err(io("write", &file))?;
        self.kubectl_out(&["apply", "-f", &file.to_string_lossy()])
    }

    /// A kubeconfig for the kubelet of node `name` (`system:node:<name>` in `system:nodes`).
    pub fn node_kubeconfig(&self, name: &str) -> Result<PathBuf, KubeletError> {
        let pair = self.pki.issue(
            &format!("kubelet-{name}"),
            &format!("system:node:{name}"),
            &["system:nodes"],
            &Usage::Client,
        )?;
        self.pki.kubeconfig(&format!("kubelet-{name}"), &self.server, &pair)
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The PID and name of each daemon still running.
    pub fn pids(&self) -> Vec<(u32, String)> {
        self.daemons.iter().map(|d| (d.pid(), d.name().to_owned())).collect()
    }

    /// The last `lines` lines of a component's log (`kube-apiserver`, `etcd`, ...).
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        process::log_tail(&self.dir.join("logs").join(format!("{name}.log")), lines)
    }

    /// Fails naming the first component that exited.
    pub fn check_running(&mut self) -> Result<(), KubeletError> {
        for d in &mut self.daemons {
            if let Some(status) = d.exited() {
                return Err(KubeletError::Exited {
                    daemon: d.name().into(),
                    status: status.to_string(),
                    log: d.log_tail(20),
                });
            }
        }
        Ok(())
    }

    /// Stops every component, newest first, by PID.
    pub fn stop(&mut self) {
        for mut d in self.daemons.drain(..).rev() {
            d.stop(Duration::from_secs(10));
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}
