//! The containerd service edge: which version runs, restarting it, and waiting until it answers.
//!
//! The install logic sees only the [`Containerd`] trait; tests inject a fake that records
//! restarts. The real implementation talks to containerd's gRPC socket (the version API is also
//! the readiness check: a restarted containerd answers only once its config loaded).

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::containerd::ContainerdVersion;
use crate::error::{Error, Result};
use crate::paths::HostRoot;

/// What the installer needs from the running containerd.
pub trait Containerd {
    /// The installed containerd's version.
    fn version(&self) -> Result<ContainerdVersion>;
    /// Makes containerd load its configuration again and waits until it answers.
    fn restart(&self) -> Result<Restarted>;
}

/// What a restart request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restarted {
    /// containerd was restarted and answers again.
    Yes,
    /// Restart mode `none`: the operator restarts containerd.
    Skipped,
}

/// How containerd is restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RestartMode {
    /// `systemd` where the host booted with systemd and the unit is active (a restart through
    /// systemd starts containerd again at once), else `signal` (k3s, rke2, any other supervisor).
    Auto,
    /// `systemctl restart containerd` on the host (through `chroot` when the host is mounted).
    Systemd,
    /// Send a signal (SIGHUP by default) to the process serving the socket; its supervisor
    /// (systemd's `Restart=always`, a kubelet static pod, ...) starts it again.
    Signal,
    /// Do not restart: the operator does it.
    None,
}

impl RestartMode {
    /// The mode's name, as `--restart-mode` and `NVINJECT_RESTART_MODE` take it.
    pub fn name(self) -> &'static str {
        match self {
            RestartMode::Auto => "auto",
            RestartMode::Systemd => "systemd",
            RestartMode::Signal => "signal",
            RestartMode::None => "none",
        }
    }
}

/// The real containerd on the host.
#[derive(Debug, Clone)]
pub struct HostContainerd {
    /// Host root.
    pub host_root: HostRoot,
    /// containerd's gRPC socket (a host path, located inside the host root at each use: it is
    /// recreated by every restart).
    pub socket: String,
    /// The containerd binary (a host path; run with `--version` when the socket is down).
    pub binary: String,
    /// Restart mode.
    pub mode: RestartMode,
    /// Signal for [`RestartMode::Signal`].
    pub signal: Signal,
    /// systemd unit for [`RestartMode::Systemd`].
    pub unit: String,
    /// The `systemctl` program (looked up in `PATH` by default).
    pub systemctl: PathBuf,
    /// `--containerd-version`: skips detection.
    pub version_override: Option<ContainerdVersion>,
    /// How long to wait for containerd to answer after a restart.
    pub wait: Duration,
}

impl Containerd for HostContainerd {
    fn version(&self) -> Result<ContainerdVersion> {
        if let Some(v) = &self.version_override {
            return Ok(v.clone());
        }
        match self.socket_path().map_err(|e| e.to_string()).and_then(|p| version_over_socket(&p)) {
            Ok(text) => return Ok(ContainerdVersion::parse(&text)?),
            Err(e) => tracing::debug!(socket = %self.socket, error = %e, "version API unavailable"),
        }
        // The host's binary, found inside the host root: a link in it must not make us run one
        // of the installer image's (or anything else outside the root).
        let binary = self.host_root.locate(&self.binary)?;
        let out = Command::new(&binary).arg("--version").output().map_err(Error::io("run", &binary))?;
        Ok(ContainerdVersion::parse(&String::from_utf8_lossy(&out.stdout))?)
    }

    fn restart(&self) -> Result<Restarted> {
        let chosen = match self.mode {
            RestartMode::Auto => {
                let booted = self.host_root.locate("/run/systemd/system").is_ok_and(|p| p.is_dir());
                let active = booted
                    && self
                        .systemctl(&["is-active", "--quiet", &self.unit])
                        .is_ok_and(|o| o.status.success());
                let chosen = choose_restart(booted, active);
                tracing::info!(systemd_booted = booted, unit = %self.unit, unit_active = active, mode = chosen.name(), "restart mode auto");
                chosen
            }
            m => m,
        };
        let mode = chosen.name();
        match chosen {
            RestartMode::None => return Ok(Restarted::Skipped),
            RestartMode::Systemd => {
                let out = self
                    .systemctl(&["restart", &self.unit])
                    .map_err(|e| Error::Restart { mode, message: format!("cannot run systemctl: {e}") })?;
                if !out.status.success() {
                    return Err(Error::Restart {
                        mode,
                        message: format!(
                            "`systemctl restart {}` failed: {}; check the unit name (--containerd-unit) or use \
                             --restart-mode signal",
                            self.unit,
                            String::from_utf8_lossy(&out.stderr).trim()
                        ),
                    });
                }
            }
            // `auto` has resolved to one of the others above.
            RestartMode::Signal | RestartMode::Auto => {
                let pid = self
                    .socket_path()
                    .map_err(|e| e.to_string())
                    .and_then(|p| socket_peer_pid(&p).map_err(|e| e.to_string()))
                    .map_err(|e| Error::Restart {
                        mode,
                        message: format!(
                            "cannot find the process serving {}: {e}; is containerd running (and the pod using \
                             hostPID)?",
                            self.host_root.shown(&self.socket).display()
                        ),
                    })?;
                let pid = nix::unistd::Pid::from_raw(pid);
                nix::sys::signal::kill(pid, self.signal)
                    .map_err(|e| Error::Restart { mode, message: format!("cannot signal pid {pid}: {e}") })?;
                // Wait for the old process to go, so the readiness check below cannot be
                // answered by it.
                let deadline = Instant::now() + self.wait;
                while nix::sys::signal::kill(pid, None).is_ok() && !is_zombie(pid.as_raw()) {
                    if Instant::now() >= deadline {
                        return Err(Error::Restart {
                            mode,
                            message: format!("containerd (pid {pid}) did not exit after {:?}", self.signal),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        wait_until_answering(&self.host_root, &self.socket, self.wait)?;
        Ok(Restarted::Yes)
    }
}

/// What `auto` restarts with: through systemd when the host booted with it and the unit is active
/// (systemd starts it again at once; a signal would leave containerd down for the unit's
/// `RestartSec`, 5 s in containerd's own unit), else by signal.
pub fn choose_restart(systemd_booted: bool, unit_active: bool) -> RestartMode {
    if systemd_booted && unit_active { RestartMode::Systemd } else { RestartMode::Signal }
}

impl HostContainerd {
    /// The host's `systemctl` with `args` (through `chroot` when the host is mounted), talking to
    /// the host's systemd over its /run socket.
    fn systemctl(&self, args: &[&str]) -> std::io::Result<std::process::Output> {
        let mut cmd = if self.host_root.is_host() {
            Command::new(&self.systemctl)
        } else {
            let mut c = Command::new("chroot");
            c.arg(self.host_root.path()).arg(&self.systemctl);
            c
        };
        cmd.args(args).output()
    }

    /// The socket as this process reaches it, located inside the host root
    /// ([`HostRoot::locate`]): a link in the host root cannot send the installer to a socket
    /// outside it.
    pub fn socket_path(&self) -> Result<PathBuf> {
        self.host_root.locate(&self.socket)
    }
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// Polls containerd's version API on the host socket `socket` (located inside `root` at each
/// try: a restarted containerd makes a new one) until it answers or `wait` passes.
pub fn wait_until_answering(root: &HostRoot, socket: &str, wait: Duration) -> Result<String> {
    let deadline = Instant::now() + wait;
    loop {
        let answer = root.locate(socket).map_err(|e| e.to_string()).and_then(|p| version_over_socket(&p));
        match answer {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() >= deadline => {
                return Err(Error::NotAnswering {
                    socket: root.shown(socket),
                    waited_s: wait.as_secs(),
                    last_error: e,
                });
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// The PID of the process listening on a unix socket (`SO_PEERCRED`), as seen from our PID
/// namespace.
pub fn socket_peer_pid(socket: &Path) -> std::io::Result<i32> {
    let stream = UnixStream::connect(socket)?;
    let creds = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(std::io::Error::from)?;
    if creds.pid() <= 0 {
        return Err(std::io::Error::other("the peer's PID is not visible from this PID namespace"));
    }
    Ok(creds.pid())
}

/// containerd's `containerd.services.version.v1.VersionResponse`.
#[derive(Clone, PartialEq, prost::Message)]
struct VersionResponse {
    #[prost(string, tag = "1")]
    version: String,
    #[prost(string, tag = "2")]
    revision: String,
}

/// Calls `containerd.services.version.v1.Version/Version` on `socket`.
pub fn version_over_socket(socket: &Path) -> std::result::Result<String, String> {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let endpoint = format!("unix://{}", socket.display());
    runtime.block_on(async move {
        let channel = tonic::transport::Endpoint::from_shared(endpoint)
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.map_err(|e| format!("not ready: {e}"))?;
        let codec = tonic_prost::ProstCodec::<(), VersionResponse>::default();
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(
            "/containerd.services.version.v1.Version/Version",
        );
        let response = grpc
            .unary(tonic::Request::new(()), path, codec)
            .await
            .map_err(|status| format!("version call: {}", status.message()))?;
        Ok(response.into_inner().version)
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn auto_restarts_through_systemd_only_where_it_runs_the_unit() {
        assert_eq!(choose_restart(true, true), RestartMode::Systemd);
        assert_eq!(choose_restart(true, false), RestartMode::Signal, "k3s/rke2 on a systemd host");
        assert_eq!(choose_restart(false, false), RestartMode::Signal);
    }

    use super::*;

    #[test]
    fn waiting_on_a_missing_socket_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("containerd.sock");
        let socket = socket.to_str().unwrap();
        let err = wait_until_answering(&HostRoot::new("/"), socket, Duration::from_millis(300)).unwrap_err();
        let message = err.to_string();
        assert!(message.contains(socket), "{message}");
        assert!(message.contains("journalctl"), "{message}");
    }

    fn host_containerd(dir: &Path, mode: RestartMode) -> HostContainerd {
        HostContainerd {
            host_root: HostRoot::new("/"),
            socket: dir.join("containerd.sock").to_string_lossy().into_owned(),
            binary: dir.join("containerd").to_string_lossy().into_owned(),
            mode,
            signal: Signal::SIGHUP,
            unit: "containerd.service".into(),
            systemctl: dir.join("systemctl"),
            version_override: None,
            wait: Duration::from_millis(300),
        }
    }

    /// An executable `systemctl` in `dir` running `script`.
    fn fake_systemctl(dir: &Path, script: &str) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(dir.join("systemctl"), script).unwrap();
        std::fs::set_permissions(dir.join("systemctl"), std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn systemd_mode_restarts_the_unit_then_waits_for_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let calls = dir.path().join("calls");
        fake_systemctl(dir.path(), &format!("#!/bin/sh\necho \"$@\" >> {}\n", calls.display()));
        let containerd = host_containerd(dir.path(), RestartMode::Systemd);
        // No containerd answers here: the restart is issued, then the wait fails naming the socket.
        let err = containerd.restart().unwrap_err();
        assert_eq!(std::fs::read_to_string(&calls).unwrap(), "restart containerd.service\n");
        assert!(matches!(err, Error::NotAnswering { .. }), "{err}");
    }

    #[test]
    fn a_failing_systemctl_is_reported_with_the_unit() {
        let dir = tempfile::tempdir().unwrap();
        fake_systemctl(dir.path(), "#!/bin/sh\necho 'Unit containerd.service not found.' >&2\nexit 5\n");
        let err = host_containerd(dir.path(), RestartMode::Systemd).restart().unwrap_err();
        let message = err.to_string();
        assert!(message.contains("not found") && message.contains("--containerd-unit"), "{message}");
    }

    #[test]
    fn mode_none_restarts_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(host_containerd(dir.path(), RestartMode::None).restart().unwrap(), Restarted::Skipped);
    }

    #[test]
    fn signal_mode_without_a_listener_says_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let message = host_containerd(dir.path(), RestartMode::Signal).restart().unwrap_err().to_string();
        assert!(message.contains("is containerd running"), "{message}");
    }

    #[test]
    fn peer_pid_of_our_own_listener_is_us() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert_eq!(socket_peer_pid(&path).unwrap(), std::process::id() as i32);
    }
}
