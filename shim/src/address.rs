//! Shim socket addresses: parsing what the inner shim answered, deriving the proxy's own socket from
//! it, and claiming that socket (or finding the proxy that already holds it).
//!
//! The proxy's socket name is a pure function of the inner shim's address. The runc shim already
//! groups the containers of a pod onto one shim (by `io.kubernetes.cri.sandbox-id`), so every `start`
//! for a pod gets the same inner address and therefore the same proxy address: grouping follows
//! runc's without re-implementing it.

use std::fmt;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::PathBuf;

/// Suffix appended to the inner socket's name to name the proxy's socket next to it.
pub const PROXY_SUFFIX: &str = ".nvinject";

/// Longest socket path the kernel accepts (`sun_path` minus the terminating NUL).
const MAX_SOCKET_PATH: usize = 107;

/// A shim's ttrpc endpoint as containerd writes it (`unix:///run/containerd/s/<hash>`, or an
/// abstract socket `unix://@name`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShimAddress {
    /// `true` for a Linux abstract socket (no file).
    pub abstract_socket: bool,
    /// The socket path, or the abstract name without its `@`.
    pub path: PathBuf,
}

/// Why an address cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    /// The address is not a unix socket URL.
    #[error("shim address {0:?} is not a unix socket (expected unix:///path or unix://@name)")]
    NotUnix(String),
    /// The derived proxy socket path does not fit in a sockaddr_un.
    #[error("proxy socket path {path} is {len} bytes, over the kernel's {MAX_SOCKET_PATH}")]
    TooLong {
        /// The path that was too long.
        path: String,
        /// Its length in bytes.
        len: usize,
    },
}

impl ShimAddress {
    /// Parses `unix:///path`, `unix://@name`, or a bare absolute path.
    pub fn parse(text: &str) -> Result<ShimAddress, AddressError> {
        let text = text.trim();
        let rest = text.strip_prefix("unix://").unwrap_or(text);
        if let Some(name) = rest.strip_prefix('@') {
            return Ok(ShimAddress { abstract_socket: true, path: PathBuf::from(name) });
        }
        if rest.starts_with('/') {
            return Ok(ShimAddress { abstract_socket: false, path: PathBuf::from(rest) });
        }
        Err(AddressError::NotUnix(text.to_owned()))
    }

    /// The proxy's address for this inner shim: same directory (or namespace), name + [`PROXY_SUFFIX`].
    pub fn proxy_address(&self) -> Result<ShimAddress, AddressError> {
        let mut path = self.path.clone().into_os_string();
        path.push(PROXY_SUFFIX);
        let len = path.len() + usize::from(self.abstract_socket);
        if len > MAX_SOCKET_PATH {
            return Err(AddressError::TooLong { path: path.to_string_lossy().into_owned(), len });
        }
        Ok(ShimAddress { abstract_socket: self.abstract_socket, path: PathBuf::from(path) })
    }

    fn socket_addr(&self) -> io::Result<SocketAddr> {
        if self.abstract_socket {
            SocketAddr::from_abstract_name(self.path.as_os_str().as_encoded_bytes())
        } else {
            SocketAddr::from_pathname(&self.path)
        }
    }

    /// Connects to the socket.
    pub fn connect(&self) -> io::Result<UnixStream> {
        UnixStream::connect_addr(&self.socket_addr()?)
    }

    /// Binds and listens on the socket. Fails with `AddrInUse` if something holds it.
    pub fn bind(&self) -> io::Result<UnixListener> {
        UnixListener::bind_addr(&self.socket_addr()?)
    }

    /// Removes the socket file (nothing to do for abstract sockets). Missing is fine.
    pub fn remove(&self) -> io::Result<()> {
        if self.abstract_socket {
            return Ok(());
        }
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Claims the socket for a new proxy, or reports that a live proxy already serves it.
    ///
    /// A socket file nobody answers on is left over from a proxy that was killed; it is replaced.
    pub fn bind_or_join(&self) -> io::Result<Claim> {
        for _ in 0..3 {
            match self.bind() {
                Ok(listener) => return Ok(Claim::New(listener)),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                    if self.connect().is_ok() {
                        return Ok(Claim::Existing);
                    }
                    self.remove()?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(io::ErrorKind::AddrInUse, format!("{self} is taken and does not answer")))
    }
}

/// The outcome of [`ShimAddress::bind_or_join`].
#[derive(Debug)]
pub enum Claim {
    /// This process owns the socket now; a proxy must serve it.
    New(UnixListener),
    /// A proxy is already serving this address.
    Existing,
}

impl fmt::Display for ShimAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = if self.abstract_socket { "@" } else { "" };
        write!(f, "unix://{at}{}", self.path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms_containerd_uses() {
        let a = ShimAddress::parse("unix:///run/containerd/s/abc\n").unwrap();
        assert_eq!(a, ShimAddress { abstract_socket: false, path: "/run/containerd/s/abc".into() });
        assert_eq!(a.to_string(), "unix:///run/containerd/s/abc");
        let b = ShimAddress::parse("unix://@/containerd-shim/x.sock").unwrap();
        assert!(b.abstract_socket);
        assert_eq!(b.to_string(), "unix://@/containerd-shim/x.sock");
        assert!(ShimAddress::parse("/run/x").is_ok());
        assert!(matches!(ShimAddress::parse("tcp://1.2.3.4:5"), Err(AddressError::NotUnix(_))));
    }

    #[test]
    fn the_proxy_lives_next_to_the_inner_shim() {
        let inner = ShimAddress::parse("unix:///run/containerd/s/0123abcd").unwrap();
        assert_eq!(inner.proxy_address().unwrap().to_string(), "unix:///run/containerd/s/0123abcd.nvinject");
        let long =
            ShimAddress { abstract_socket: false, path: PathBuf::from(format!("/{}", "x".repeat(100))) };
        assert!(matches!(long.proxy_address(), Err(AddressError::TooLong { .. })));
    }

    #[test]
    fn bind_or_join_replaces_dead_sockets_and_joins_live_ones() {
        let dir = tempfile::tempdir().unwrap();
        let addr = ShimAddress { abstract_socket: false, path: dir.path().join("s") };
        let first = match addr.bind_or_join().unwrap() {
            Claim::New(l) => l,
            Claim::Existing => panic!("nothing was there"),
        };
        assert!(matches!(addr.bind_or_join().unwrap(), Claim::Existing));
        drop(first); // The file stays but nobody listens: a killed proxy.
        assert!(addr.path.exists());
        assert!(matches!(addr.bind_or_join().unwrap(), Claim::New(_)));
    }
}
