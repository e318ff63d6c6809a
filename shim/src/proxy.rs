//! The task-API proxy: containerd talks ttrpc to us, we talk ttrpc to the inner runc shim.
//!
//! Each connection containerd opens is paired with one connection to the inner shim and frames are
//! copied both ways unchanged. Stream ids therefore stay valid without any mapping, and every call
//! of both task API versions (`containerd.task.v2.Task`, `containerd.task.v3.Task`), streaming or
//! not, passes through without the proxy knowing its schema. The one exception is `Create`: the
//! request is decoded, handed to a [`CreateGate`] (which injects the CDI edits into the bundle), and
//! only then forwarded; if the gate refuses, containerd gets a ttrpc error answer instead and the
//! inner shim never hears of the container.
//!
//! The proxy also keeps track of containerd's use of it ([`Usage`]): its open connections and the
//! bundle of every container it was started for or saw a Create of. Once no connection is open and
//! every one of those bundles is gone (containerd removes a task's bundle when it deletes the task
//! or gives up on it), nothing is left for the proxy to serve, even if the inner shim stays (it can,
//! after containerd gave up on a Create that runc was still running).

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use containerd_shim_protos::api::CreateTaskRequest;
use protobuf::Message;
use ttrpc::proto::{Code, Request, Response, Status};

use crate::address::ShimAddress;
use crate::frame::{Frame, read_frame, write_frame};

/// The ttrpc service names of the task API whose `Create` the proxy intercepts.
pub const TASK_SERVICES: [&str; 2] = ["containerd.task.v2.Task", "containerd.task.v3.Task"];

/// Decides, before the inner shim sees it, whether a container's Create may proceed, and prepares
/// its bundle. Implemented by the injector; tests use their own.
pub trait CreateGate: Send + Sync + 'static {
    /// Runs before the Create is forwarded. An error is sent back to containerd as the Create's
    /// answer and the request is dropped.
    fn before_create(&self, request: &CreateTaskRequest) -> Result<(), Rejection>;
}

/// Why a Create was refused, as containerd will see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The gRPC status code; containerd maps it to its error classes.
    pub code: Code,
    /// The message `ctr` and CRI print.
    pub message: String,
}

/// What the proxy does with one frame from containerd.
#[derive(Debug)]
pub enum Classified {
    /// Not a Create: pass through untouched.
    Forward,
    /// A task-API Create, decoded.
    Create(Box<CreateTaskRequest>),
    /// A task-API Create whose payload does not decode. Refused: forwarding it would start a
    /// container without its devices.
    Undecodable(String),
}

/// Looks at a frame from containerd and says whether it is a Create. Pure.
pub fn classify(frame: &Frame) -> Classified {
    if !frame.is_request() {
        return Classified::Forward;
    }
    let Ok(request) = Request::parse_from_bytes(&frame.payload) else {
        // Not ours to judge: the inner shim answers malformed ttrpc as it always would.
        return Classified::Forward;
    };
    if request.method != "Create" || !TASK_SERVICES.contains(&request.service.as_str()) {
        return Classified::Forward;
    }
    match CreateTaskRequest::parse_from_bytes(&request.payload) {
        Ok(create) => Classified::Create(Box::new(create)),
        Err(e) => Classified::Undecodable(format!("cannot decode {}.Create request: {e}", request.service)),
    }
}

/// Encodes the answer that refuses the RPC on `stream_id`.
pub fn rejection_frame(stream_id: u32, rejection: &Rejection) -> Frame {
    let status =
        Status { code: rejection.code.into(), message: rejection.message.clone(), ..Default::default() };
    let response = Response { status: Some(status).into(), ..Default::default() };
    // Encoding a message built in memory cannot fail; an empty payload would still be a valid
    // (if uninformative) error to containerd.
    Frame::response(stream_id, response.write_to_bytes().unwrap_or_default())
}

/// containerd's use of the proxy: its open connections, and the bundles of the containers the
/// proxy serves (the one `start` named, and each Create's).
#[derive(Debug, Default)]
pub struct Usage {
    open: AtomicUsize,
    bundles: Mutex<Vec<PathBuf>>,
}

impl Usage {
    /// Usage of a proxy started for the container whose bundle is `bundle`.
    pub fn new(bundle: Option<PathBuf>) -> Arc<Usage> {
        Arc::new(Usage { open: AtomicUsize::new(0), bundles: Mutex::new(bundle.into_iter().collect()) })
    }

    /// Whether containerd is done with the proxy: no connection open, and every bundle known gone
    /// by `exists` (containerd removes a bundle when it deletes the task or gives up on it; while
    /// it restarts, its tasks' bundles stay). Never with no bundle known.
    pub fn done(&self, exists: impl Fn(&Path) -> bool) -> bool {
        if self.open.load(Ordering::SeqCst) > 0 {
            return false;
        }
        let bundles = self.bundles.lock().unwrap_or_else(|e| e.into_inner());
        !bundles.is_empty() && !bundles.iter().any(|b| exists(b))
    }

    fn opened(&self) {
        self.open.fetch_add(1, Ordering::SeqCst);
    }

    fn closed(&self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
    }

    fn created(&self, bundle: &str) {
        let mut bundles = self.bundles.lock().unwrap_or_else(|e| e.into_inner());
        if !bundles.iter().any(|b| b.as_os_str() == bundle) {
            bundles.push(PathBuf::from(bundle));
        }
    }
}

/// The proxy for one inner shim.
pub struct Proxy {
    inner: ShimAddress,
    gate: Arc<dyn CreateGate>,
    usage: Arc<Usage>,
}

impl Proxy {
    /// A proxy forwarding to the inner shim at `inner`, consulting `gate` on every Create and
    /// telling `usage` about containerd's connections and containers.
    pub fn new(inner: ShimAddress, gate: Arc<dyn CreateGate>, usage: Arc<Usage>) -> Proxy {
        Proxy { inner, gate, usage }
    }

    /// Accepts connections forever, serving each on its own threads. Returns only when the listening
    /// socket itself is broken: running out of descriptors, memory or threads costs the connection
    /// that hit it, never the proxy (its exit would cut containerd off from every task of the pod).
    pub fn serve(&self, listener: &UnixListener) -> io::Result<()> {
        loop {
            let (downstream, _) = match listener.accept() {
                Ok(conn) => conn,
                Err(e) if accept_error_is_transient(&e) => {
                    tracing::warn!(error = %e, "accept failed; retrying");
                    // Bounded retry rate while descriptors or memory are short.
                    thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let upstream = match self.inner.connect() {
                Ok(s) => s,
                Err(e) => {
                    // Dropping the accepted socket tells containerd the shim is unreachable, which
                    // is the truth: the inner shim is gone or refusing.
                    tracing::warn!(inner = %self.inner, error = %e, "cannot reach the inner shim");
                    continue;
                }
            };
            let gate = Arc::clone(&self.gate);
            let usage = Arc::clone(&self.usage);
            usage.opened();
            let spawned = thread::Builder::new().name("conn".into()).spawn(move || {
                if let Err(e) = pump(downstream, upstream, gate, &usage) {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                usage.closed();
            });
            if let Err(e) = spawned {
                // Never opened as far as containerd's use goes (the closure, and its count, is gone).
                self.usage.closed();
                // The connection's sockets were moved into the closure and are closed with it.
                tracing::warn!(error = %e, "cannot start a thread for a connection; dropped it");
            }
        }
    }
}

/// Whether a failed `accept` leaves the listener usable (the next one may succeed).
fn accept_error_is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted | io::ErrorKind::OutOfMemory
    ) || matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EPROTO | libc::EPERM)
    )
}

/// Copies frames between containerd (`downstream`) and the inner shim (`upstream`) until either side
/// closes, intercepting Creates. Returns when containerd's side is done.
pub fn pump(
    downstream: UnixStream,
    upstream: UnixStream,
    gate: Arc<dyn CreateGate>,
    usage: &Usage,
) -> io::Result<()> {
    // Two writers share containerd's side (relayed answers, and our own refusals); the inner shim's
    // side has one writer, the request loop below.
    let down_writer = Arc::new(Mutex::new(downstream.try_clone()?));
    let mut up_writer = upstream.try_clone()?;

    // Inner shim -> containerd: verbatim.
    let mut up_reader = upstream;
    let back_writer = Arc::clone(&down_writer);
    let back = thread::Builder::new().name("conn-back".into()).spawn(move || {
        let result = copy_frames(&mut up_reader, &back_writer);
        // The inner shim closed (or broke) the connection: containerd must see the same.
        if let Ok(w) = back_writer.lock() {
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
        result
    })?;

    // containerd -> inner shim: verbatim except Create.
    let mut down_reader = downstream;
    let result = forward_requests(&mut down_reader, &down_writer, &mut up_writer, gate.as_ref(), usage);
    let _ = up_writer.shutdown(std::net::Shutdown::Both);
    let _ = back.join();
    result
}

fn copy_frames(reader: &mut UnixStream, writer: &Mutex<UnixStream>) -> io::Result<()> {
    while let Some(frame) = read_frame(reader)? {
        send(writer, &frame)?;
    }
    Ok(())
}

fn forward_requests(
    reader: &mut UnixStream,
    down_writer: &Mutex<UnixStream>,
    up_writer: &mut UnixStream,
    gate: &dyn CreateGate,
    usage: &Usage,
) -> io::Result<()> {
    while let Some(frame) = read_frame(reader)? {
        match classify(&frame) {
            Classified::Forward => write_frame(up_writer, &frame)?,
            Classified::Undecodable(message) => {
                let rejection =
                    Rejection { code: Code::INVALID_ARGUMENT, message: format!("nvinject: {message}") };
                send(down_writer, &rejection_frame(frame.header.stream_id, &rejection))?;
            }
            Classified::Create(create) => {
                usage.created(&create.bundle);
                // The Create is decided here, on the read loop, and forwarded before any later frame:
                // Go ttrpc servers (v1.2+, containerd 1.7 and 2.x) refuse a request whose stream id is
                // not above every id they have seen on the connection, so a Create held back while a
                // later call went ahead would be refused. Other calls on this connection wait for the
                // injection (about a millisecond); answers from the inner shim keep flowing.
                match decide(gate, &create) {
                    Ok(()) => write_frame(up_writer, &frame)?,
                    Err(rejection) => {
                        send(down_writer, &rejection_frame(frame.header.stream_id, &rejection))?
                    }
                }
            }
        }
    }
    Ok(())
}

/// Asks the gate about one Create. A panic in the gate becomes a refusal: containerd must get an
/// answer, and the proxy must go on serving the pod's other containers.
fn decide(gate: &dyn CreateGate, create: &CreateTaskRequest) -> Result<(), Rejection> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| gate.before_create(create))).unwrap_or_else(
        |_| {
            Err(Rejection {
                code: Code::INTERNAL,
                message: format!("nvinject: container {}: internal error while injecting devices", create.id),
            })
        },
    )
}

fn send(writer: &Mutex<UnixStream>, frame: &Frame) -> io::Result<()> {
    let mut stream = writer.lock().map_err(|_| io::Error::other("connection writer lock poisoned"))?;
    write_frame(&mut *stream, frame)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ttrpc::proto::MessageHeader;

    fn request_frame(service: &str, method: &str, payload: Vec<u8>) -> Frame {
        request_frame_on(5, service, method, payload)
    }

    fn request_frame_on(stream_id: u32, service: &str, method: &str, payload: Vec<u8>) -> Frame {
        let req = Request { service: service.into(), method: method.into(), payload, ..Default::default() };
        let bytes = req.write_to_bytes().unwrap();
        Frame { header: MessageHeader::new_request(stream_id, bytes.len() as u32), payload: bytes }
    }

    fn create_payload(id: &str, bundle: &str) -> Vec<u8> {
        CreateTaskRequest { id: id.into(), bundle: bundle.into(), ..Default::default() }
            .write_to_bytes()
            .unwrap()
    }

    #[test]
    fn creates_of_both_task_api_versions_are_intercepted() {
        for service in TASK_SERVICES {
            let frame = request_frame(service, "Create", create_payload("c1", "/run/b/c1"));
            match classify(&frame) {
                Classified::Create(c) => {
                    assert_eq!(c.id, "c1");
                    assert_eq!(c.bundle, "/run/b/c1");
                }
                other => panic!("{service}: expected Create, got {other:?}"),
            }
        }
    }

    #[test]
    fn everything_else_is_forwarded() {
        let cases = [
            request_frame("containerd.task.v2.Task", "Start", create_payload("c1", "/b")),
            request_frame("containerd.task.v3.Task", "State", vec![]),
            request_frame("containerd.services.sandbox.v1.Controller", "Create", vec![]),
            Frame::response(5, vec![1, 2, 3]),
            Frame { header: MessageHeader::new_request(1, 3), payload: vec![0xff, 0xff, 0xff] },
        ];
        for frame in cases {
            assert!(matches!(classify(&frame), Classified::Forward), "{frame:?}");
        }
    }

    #[test]
    fn a_create_that_does_not_decode_is_refused() {
        let frame = request_frame("containerd.task.v2.Task", "Create", vec![0x0a, 0xff]);
        assert!(
            matches!(classify(&frame), Classified::Undecodable(m) if m.contains("containerd.task.v2.Task"))
        );
    }

    #[test]
    fn running_out_of_descriptors_does_not_end_the_accept_loop_but_a_broken_listener_does() {
        for errno in [libc::EMFILE, libc::ENFILE, libc::ECONNABORTED, libc::EINTR] {
            assert!(accept_error_is_transient(&io::Error::from_raw_os_error(errno)), "errno {errno}");
        }
        for errno in [libc::EBADF, libc::EINVAL, libc::ENOTSOCK] {
            assert!(!accept_error_is_transient(&io::Error::from_raw_os_error(errno)), "errno {errno}");
        }
    }

    #[test]
    fn rejection_frames_carry_code_and_message_on_the_same_stream() {
        let frame =
            rejection_frame(9, &Rejection { code: Code::FAILED_PRECONDITION, message: "no GPU 9".into() });
        assert!(frame.is_response());
        assert_eq!(frame.header.stream_id, 9);
        let response = Response::parse_from_bytes(&frame.payload).unwrap();
        assert_eq!(response.status.code.value(), Code::FAILED_PRECONDITION as i32);
        assert_eq!(response.status.message, "no GPU 9");
    }

    struct Refuse;
    impl CreateGate for Refuse {
        fn before_create(&self, request: &CreateTaskRequest) -> Result<(), Rejection> {
            Err(Rejection { code: Code::NOT_FOUND, message: format!("refused {}", request.id) })
        }
    }

    struct Panic;
    impl CreateGate for Panic {
        fn before_create(&self, _: &CreateTaskRequest) -> Result<(), Rejection> {
            panic!("bug");
        }
    }

    #[test]
    fn a_panicking_gate_still_answers_the_create() {
        let create = request_frame("containerd.task.v2.Task", "Create", create_payload("p1", "/b"));
        let answers = run_pump(Arc::new(Panic), vec![create]);
        let response = Response::parse_from_bytes(&answers[0].payload).unwrap();
        assert_eq!(response.status.code.value(), Code::INTERNAL as i32);
        assert!(response.status.message.contains("p1"));
    }

    struct Allow;
    impl CreateGate for Allow {
        fn before_create(&self, _: &CreateTaskRequest) -> Result<(), Rejection> {
            Ok(())
        }
    }

    /// An "inner shim" that answers every request frame with a response echoing the request bytes.
    fn echo_inner(mut conn: UnixStream) {
        while let Ok(Some(frame)) = read_frame(&mut conn) {
            let reply = Frame::response(frame.header.stream_id, frame.payload.clone());
            if write_frame(&mut conn, &reply).is_err() {
                break;
            }
        }
    }

    fn run_pump(gate: Arc<dyn CreateGate>, frames: Vec<Frame>) -> Vec<Frame> {
        let (client, proxy_down) = UnixStream::pair().unwrap();
        let (proxy_up, inner) = UnixStream::pair().unwrap();
        let inner_thread = thread::spawn(move || echo_inner(inner));
        let pump_thread = thread::spawn(move || pump(proxy_down, proxy_up, gate, &Usage::default()));
        let mut client_w = client.try_clone().unwrap();
        for f in &frames {
            write_frame(&mut client_w, f).unwrap();
        }
        let mut client_r = client;
        let mut answers = Vec::new();
        for _ in 0..frames.len() {
            answers.push(read_frame(&mut client_r).unwrap().unwrap());
        }
        client_w.shutdown(std::net::Shutdown::Both).unwrap();
        pump_thread.join().unwrap().unwrap();
        inner_thread.join().unwrap();
        answers
    }

    #[test]
    fn pump_forwards_calls_unchanged_and_relays_answers() {
        let start = request_frame("containerd.task.v2.Task", "Start", vec![1, 2]);
        let create = request_frame("containerd.task.v3.Task", "Create", create_payload("c", "/b"));
        let answers = run_pump(Arc::new(Allow), vec![start.clone(), create.clone()]);
        let mut payloads: Vec<_> = answers.iter().map(|f| f.payload.clone()).collect();
        payloads.sort();
        let mut expected = vec![start.payload, create.payload];
        expected.sort();
        assert_eq!(payloads, expected, "the inner shim must receive the exact request bytes");
    }

    #[test]
    fn refused_creates_never_reach_the_inner_shim() {
        let create = request_frame("containerd.task.v2.Task", "Create", create_payload("gpu-c", "/b"));
        let answers = run_pump(Arc::new(Refuse), vec![create.clone()]);
        let response = Response::parse_from_bytes(&answers[0].payload).unwrap();
        assert_eq!(response.status.message, "refused gpu-c");
        assert_ne!(answers[0].payload, create.payload, "the echo shim must not have seen it");
    }

    /// A proxy serving a real socket in front of an echoing "inner shim", started for `bundle`.
    fn serving_proxy(dir: &std::path::Path, bundle: PathBuf) -> (ShimAddress, Arc<Usage>) {
        let inner = ShimAddress { abstract_socket: false, path: dir.join("inner") };
        let inner_listener = inner.bind().unwrap();
        thread::spawn(move || {
            for conn in inner_listener.incoming() {
                let conn = conn.unwrap();
                thread::spawn(move || echo_inner(conn));
            }
        });
        let own = ShimAddress { abstract_socket: false, path: dir.join("proxy") };
        let listener = own.bind().unwrap();
        let usage = Usage::new(Some(bundle));
        let proxy = Proxy::new(inner, Arc::new(Allow), Arc::clone(&usage));
        thread::spawn(move || proxy.serve(&listener));
        (own, usage)
    }

    fn call(conn: &mut UnixStream, frame: &Frame) {
        write_frame(conn, frame).unwrap();
        read_frame(conn).unwrap().expect("an answer");
    }

    /// `usage.done`, asked until it says yes or `millis` have passed (connections close
    /// asynchronously).
    fn done_within(usage: &Usage, millis: u64) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(millis);
        loop {
            if usage.done(Path::exists) {
                return true;
            }
            if std::time::Instant::now() > deadline {
                return false;
            }
            thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    #[test]
    fn containerd_is_done_with_the_proxy_when_no_connection_is_open_and_every_bundle_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let (first, second) = (dir.path().join("first"), dir.path().join("second"));
        std::fs::create_dir(&first).unwrap();
        std::fs::create_dir(&second).unwrap();
        let (own, usage) = serving_proxy(dir.path(), first.clone());

        // A connection open, then a Create of a second container through it.
        let mut conn = own.connect().unwrap();
        let create = create_payload("second", second.to_str().unwrap());
        call(&mut conn, &request_frame("containerd.task.v3.Task", "Create", create));
        std::fs::remove_dir(&first).unwrap();
        std::fs::remove_dir(&second).unwrap();
        assert!(!done_within(&usage, 200), "a connection is open: containerd still uses the proxy");

        // No connection (containerd restarting), a bundle still there: not done.
        std::fs::create_dir(&second).unwrap();
        drop(conn);
        assert!(!done_within(&usage, 200), "the second container's bundle is still there");

        // containerd gave up on it too: done.
        std::fs::remove_dir(&second).unwrap();
        assert!(done_within(&usage, 5000), "no connection and no bundle left");

        // A proxy that knows no bundle is never done by this rule.
        assert!(!Usage::default().done(|_| false));
    }

    /// Answers like a Go ttrpc server since v1.2 (containerd 1.7 and 2.x): a request whose stream id
    /// is not above every id seen on the connection is refused, any other is answered OK. Tells
    /// `arrived` each stream id it receives, and pokes `poke`.
    fn strict_inner(
        mut conn: UnixStream,
        arrived: std::sync::mpsc::Sender<u32>,
        poke: std::sync::mpsc::Sender<()>,
    ) {
        let mut last = 0;
        while let Ok(Some(frame)) = read_frame(&mut conn) {
            let id = frame.header.stream_id;
            let _ = arrived.send(id);
            let _ = poke.send(());
            let code = if id <= last { Code::INVALID_ARGUMENT } else { Code::OK };
            last = last.max(id);
            let status = Status { code: code.into(), ..Default::default() };
            let response = Response { status: Some(status).into(), ..Default::default() };
            if write_frame(&mut conn, &Frame::response(id, response.write_to_bytes().unwrap())).is_err() {
                break;
            }
        }
    }

    /// A gate that is still injecting when later calls arrive: it returns once the inner shim has
    /// received anything, or after a bounded wait.
    struct Busy(Mutex<std::sync::mpsc::Receiver<()>>);
    impl CreateGate for Busy {
        fn before_create(&self, _: &CreateTaskRequest) -> Result<(), Rejection> {
            let _ = self.0.lock().unwrap().recv_timeout(std::time::Duration::from_millis(500));
            Ok(())
        }
    }

    #[test]
    fn calls_behind_a_create_reach_the_inner_shim_after_it_in_stream_order() {
        let (client, proxy_down) = UnixStream::pair().unwrap();
        let (proxy_up, inner) = UnixStream::pair().unwrap();
        let (arrived_tx, arrived_rx) = std::sync::mpsc::channel();
        let (poke_tx, poke_rx) = std::sync::mpsc::channel();
        let inner_thread = thread::spawn(move || strict_inner(inner, arrived_tx, poke_tx));
        let gate: Arc<dyn CreateGate> = Arc::new(Busy(Mutex::new(poke_rx)));
        let pump_thread = thread::spawn(move || pump(proxy_down, proxy_up, gate, &Usage::default()));

        // containerd 2.x: a Create for one container, then a call for another, on one connection.
        let mut client_w = client.try_clone().unwrap();
        let create = request_frame_on(5, "containerd.task.v3.Task", "Create", create_payload("b", "/b"));
        write_frame(&mut client_w, &create).unwrap();
        write_frame(&mut client_w, &request_frame_on(7, "containerd.task.v3.Task", "State", vec![])).unwrap();
        let mut client_r = client;
        for _ in 0..2 {
            let answer = read_frame(&mut client_r).unwrap().unwrap();
            let response = Response::parse_from_bytes(&answer.payload).unwrap();
            assert_eq!(
                response.status.code.value(),
                Code::OK as i32,
                "stream {} was refused by the inner shim",
                answer.header.stream_id
            );
        }
        client_w.shutdown(std::net::Shutdown::Both).unwrap();
        pump_thread.join().unwrap().unwrap();
        inner_thread.join().unwrap();
        assert_eq!(arrived_rx.iter().collect::<Vec<_>>(), [5, 7]);
    }
}
