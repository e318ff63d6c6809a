//! gRPC over unix sockets: the client connector and the listener, shared by the plugin and the
//! kubelet simulator, and the server-side connection wrapper that lets kubelets before 1.26 in
//! (see [`nvinject_h2_authority`]).

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::{Stream, StreamExt, wrappers::UnixListenerStream};
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint, Uri};

use nvinject_h2_authority::{AuthorityRewriter, REPLACEMENT_AUTHORITY};

/// Opens a gRPC channel to the unix socket at `path`.
pub async fn connect(path: &Path, timeout: Duration) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_path_buf();
    // The URI is required by the API but unused: the connector below ignores it.
    Endpoint::from_static("http://localhost")
        .connect_timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}

/// Binds a unix socket at `path`, first removing whatever a previous run left there.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => tracing::info!(socket = %path.display(), "removed stale socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixListener::bind(path)
}

/// The connections accepted on `listener`, each wrapped in an [`AuthorityFixStream`]; what the
/// plugin's gRPC server serves. `resource` names the resource in log lines.
pub fn incoming(
    listener: UnixListener,
    resource: &str,
) -> impl Stream<Item = io::Result<AuthorityFixStream<UnixStream>>> + use<> {
    let resource: Arc<str> = Arc::from(resource);
    UnixListenerStream::new(listener)
        .map(move |conn| conn.map(|s| AuthorityFixStream::new(s, resource.clone())))
}

/// Pending output above this capacity is released once handed out.
const KEEP_PENDING: usize = 64 * 1024;

/// A server-side connection whose client->server bytes pass through an [`AuthorityRewriter`]
/// before the gRPC server reads them, so that h2 accepts kubelets that send their socket path as
/// `:authority`. Server->client bytes pass untouched.
#[derive(Debug)]
pub struct AuthorityFixStream<S> {
    inner: S,
    rewriter: AuthorityRewriter,
    /// Bytes for the reader, from `pos` on.
    pending: Vec<u8>,
    pos: usize,
    eof: bool,
    resource: Arc<str>,
}

impl<S> AuthorityFixStream<S> {
    /// Wraps a just-accepted connection (nothing read from it yet). `resource` is for logs.
    pub fn new(inner: S, resource: Arc<str>) -> Self {
        AuthorityFixStream {
            inner,
            rewriter: AuthorityRewriter::new(),
            pending: Vec::new(),
            pos: 0,
            eof: false,
            resource,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFixStream<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.pos < this.pending.len() {
                let n = (this.pending.len() - this.pos).min(buf.remaining());
                buf.put_slice(&this.pending[this.pos..this.pos + n]);
                this.pos += n;
                if this.pos == this.pending.len() {
                    this.pending.clear();
                    this.pos = 0;
                    if this.pending.capacity() > KEEP_PENDING {
                        this.pending = Vec::new();
                    }
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if this.rewriter.is_passthrough() {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            // Read into the caller's buffer, then take the bytes back out through the rewriter:
            // no buffer of our own for input.
            let before = buf.filled().len();
            ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
            let read = &buf.filled()[before..];
            if read.is_empty() {
                this.rewriter.finish(&mut this.pending);
                this.eof = true;
            } else {
                this.rewriter.feed(read, &mut this.pending);
            }
            buf.set_filled(before);
            if let Some(r) = this.rewriter.take_first_rewrite() {
                tracing::debug!(
                    resource = %this.resource,
                    stream_id = r.stream_id,
                    authority = r.authority,
                    replaced_with = REPLACEMENT_AUTHORITY,
                    "client sent a :authority h2 refuses (a kubelet before 1.26 sends its socket path); \
                     replacing it on this connection"
                );
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFixStream<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for AuthorityFixStream<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// Identity of a file (device, inode, change time): differs when the file is re-created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIdentity {
    dev: u64,
    ino: u64,
    ctime_ns: i128,
}

/// The identity of `path`, `None` when it does not exist.
pub fn identity(path: &Path) -> Option<FileIdentity> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path).ok()?;
    Some(FileIdentity {
        dev: m.dev(),
        ino: m.ino(),
        ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
    })
}
