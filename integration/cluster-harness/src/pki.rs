//! The test cluster's certificates, made with the `openssl` command (Debian's `openssl`, which `./x setup`
//! installs): a CA valid for two days, serving and client certificates it signs (P-256 keys, fast to
//! make), the service-account signing key pair, and kubeconfig files naming them. Everything is written
//! under one directory of the test; nothing is trusted outside it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use nvinject_node_harness::kubelet::KubeletError;
use nvinject_node_harness::process;

/// A certificate and its private key (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertPair {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key (PKCS#8).
    pub key: PathBuf,
}

/// What a certificate is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Usage {
    /// A TLS server reached at these IP addresses and DNS names.
    Server {
        /// `IP:` subject alternative names.
        ips: Vec<String>,
        /// `DNS:` subject alternative names.
        dns: Vec<String>,
    },
    /// A TLS client (Kubernetes reads the user from CN and the groups from O).
    Client,
}

/// The cluster's CA and service-account keys, in one directory.
#[derive(Debug, Clone)]
pub struct Pki {
    dir: PathBuf,
    /// The CA certificate every component trusts.
    pub ca: CertPair,
    /// The service-account token signing key (the API server signs, the controller-manager too).
    pub service_account_key: PathBuf,
    /// Its public half (the API server verifies with it).
    pub service_account_pub: PathBuf,
    serial: std::cell::Cell<u32>,
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> KubeletError + use<> {
    let path = path.to_path_buf();
    move |source| KubeletError::Io { op, path, source }
}

const EC_KEY: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

impl Pki {
    /// Makes the CA and the service-account key pair in `dir` (created).
    pub fn create(dir: &Path) -> Result<Self, KubeletError> {
        fs::create_dir_all(dir).map_err(io("create", dir))?;
        let ca = CertPair { cert: dir.join("ca.crt"), key: dir.join("ca.key") };
        process::run(
            Command::new("openssl")
                .args(["req", "-x509", "-new", "-nodes", "-days", "2", "-subj", "/CN=nvinject-test-ca"])
                .args(EC_KEY)
                .args(["-addext", "basicConstraints=critical,CA:TRUE"])
                .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"])
                .arg("-keyout")
                .arg(&ca.key)
                .arg("-out")
                .arg(&ca.cert),
        )
        .map_err(openssl_missing)?;
        let service_account_key = dir.join("service-account.key");
        let service_account_pub = dir.join("service-account.pub");
        process::run(
            Command::new("openssl")
                .args(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out"])
                .arg(&service_account_key),
        )?;
        process::run(
            Command::new("openssl")
                .args(["pkey", "-pubout", "-in"])
                .arg(&service_account_key)
                .arg("-out")
                .arg(&service_account_pub),
        )?;
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca,
            service_account_key,
            service_account_pub,
            serial: std::cell::Cell::new(1),
        })
    }

    /// Issues `<name>.crt` and `<name>.key` for `common_name` in `organizations`, signed by the CA.
    pub fn issue(
        &self,
        name: &str,
        common_name: &str,
        organizations: &[&str],
        usage: &Usage,
    ) -> Result<CertPair, KubeletError> {
        let pair = CertPair {
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
        };
        let csr = self.dir.join(format!("{name}.csr"));
        let ext = self.dir.join(format!("{name}.ext"));
        process::run(
            Command::new("openssl")
                .args(["req", "-new", "-nodes", "-subj", &subject(common_name, organizations)])
                .args(EC_KEY)
                .arg("-keyout")
                .arg(&pair.key)
                .arg("-out")
                .arg(&csr),
        )?;
        fs::write(&ext, extensions(usage)).map_err(io("write", &ext))?;
        let serial = self.serial.get() + 1;
        self.serial.set(serial);
        process::run(
            Command::new("openssl")
                .args(["x509", "-req", "-days", "2", "-set_serial", &serial.to_string(), "-in"])
                .arg(&csr)
                .arg("-CA")
                .arg(&self.ca.cert)
                .arg("-CAkey")
                .arg(&self.ca.key)
                .arg("-extfile")
                .arg(&ext)
                .arg("-out")
                .arg(&pair.cert),
        )?;
        Ok(pair)
    }

    /// Writes `<name>.kubeconfig` for `client` talking to `server` and returns its path.
    pub fn kubeconfig(&self, name: &str, server: &str, client: &CertPair) -> Result<PathBuf, KubeletError> {
        let path = self.dir.join(format!("{name}.kubeconfig"));
        let text = serde_json::to_string_pretty(&kubeconfig(server, &self.ca.cert, client, name))
            .expect("JSON values serialise");
        fs::write(&path, text).map_err(io("write", &path))?;
        Ok(path)
    }
}

fn openssl_missing(e: nvinject_node_harness::HarnessError) -> KubeletError {
    KubeletError::Command {
        command: "openssl req -x509".into(),
        detail: format!(
            "{e} (the openssl command comes from Debian's openssl package; ./x setup installs it)"
        ),
    }
}

/// The `-subj` argument: organizations first, then the common name (`/O=system:nodes/CN=system:node:a`).
pub fn subject(common_name: &str, organizations: &[&str]) -> String {
    let mut s: String = organizations.iter().map(|o| format!("/O={o}")).collect();
    s.push_str(&format!("/CN={common_name}"));
    s
}

/// The X.509 v3 extensions of a leaf certificate, as an `openssl x509 -extfile` file.
pub fn extensions(usage: &Usage) -> String {
    let mut text = String::from(
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n",
    );
    match usage {
        Usage::Client => text.push_str("extendedKeyUsage=clientAuth\n"),
        Usage::Server { ips, dns } => {
            text.push_str("extendedKeyUsage=serverAuth\n");
            let names: Vec<String> = ips
                .iter()
                .map(|ip| format!("IP:{ip}"))
                .chain(dns.iter().map(|d| format!("DNS:{d}")))
                .collect();
            if !names.is_empty() {
                text.push_str(&format!("subjectAltName={}\n", names.join(",")));
            }
        }
    }
    text
}

/// A kubeconfig (JSON, which kubectl and every component read) with one cluster, user and context.
pub fn kubeconfig(server: &str, ca: &Path, client: &CertPair, user: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "nvinject-test", "cluster": { "server": server, "certificate-authority": ca } }],
        "users": [{ "name": user, "user": { "client-certificate": client.cert, "client-key": client.key } }],
        "contexts": [{ "name": "nvinject-test", "context": { "cluster": "nvinject-test", "user": user } }],
        "current-context": "nvinject-test",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_put_groups_before_the_user() {
        assert_eq!(subject("system:node:gpu", &["system:nodes"]), "/O=system:nodes/CN=system:node:gpu");
        assert_eq!(subject("admin", &[]), "/CN=admin");
    }

    #[test]
    fn server_certificates_name_their_addresses_and_clients_have_none() {
        let server =
            extensions(&Usage::Server { ips: vec!["10.77.0.1".into()], dns: vec!["kubernetes".into()] });
        assert!(server.contains("extendedKeyUsage=serverAuth\n"), "{server}");
        assert!(server.contains("subjectAltName=IP:10.77.0.1,DNS:kubernetes\n"), "{server}");
        let client = extensions(&Usage::Client);
        assert!(
            client.contains("extendedKeyUsage=clientAuth") && !client.contains("subjectAltName"),
            "{client}"
        );
        assert!(client.contains("CA:FALSE"));
    }

    #[test]
    fn a_kubeconfig_names_the_server_the_ca_and_the_client_pair() {
        let pair = CertPair { cert: "/p/admin.crt".into(), key: "/p/admin.key".into() };
        let k = kubeconfig("https://10.77.0.1:6443", Path::new("/p/ca.crt"), &pair, "admin");
        assert_eq!(k["clusters"][0]["cluster"]["server"], "https://10.77.0.1:6443");
        assert_eq!(k["clusters"][0]["cluster"]["certificate-authority"], "/p/ca.crt");
        assert_eq!(k["users"][0]["user"]["client-key"], "/p/admin.key");
        assert_eq!(k["current-context"], k["contexts"][0]["name"]);
    }
}
