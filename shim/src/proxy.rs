//! The task-API proxy: containerd talks ttrpc to us, we talk ttrpc to the inner runc shim.
//!
//! Each connection containerd opens is paired with one connection to the inner shim and frames are
//! copied both ways unchanged. Stream ids therefore stay valid without any mapping, and every call
//! of both task API versions (`containerd.task.v2.Task`, `containerd.task.v3.Task`), streaming or
//! not, passes through without the proxy knowing its schema. The one exception is `Create`: the
//! request is decoded, handed to a [`CreateGate`] (which injects the CDI edits into the bundle), and
//! only then forwarded; if the gate refuses, containerd gets a ttrpc error answer instead and the
//! inner shim never hears of the container.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
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

/// The proxy for one inner shim.
pub struct Proxy {
    inner: ShimAddress,
    gate: Arc<dyn CreateGate>,
}

impl Proxy {
    /// A proxy forwarding to the inner shim at `inner`, consulting `gate` on every Create.
    pub fn new(inner: ShimAddress, gate: Arc<dyn CreateGate>) -> Proxy {
        Proxy { inner, gate }
    }

    /// Accepts connections forever, serving each on its own threads.
    pub fn serve(&self, listener: &UnixListener) -> io::Result<()> {
        loop {
            let (downstream, _) = match listener.accept() {
                Ok(conn) => conn,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
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
            thread::Builder::new().name("conn".into()).spawn(move || {
                if let Err(e) = pump(downstream, upstream, gate) {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            })?;
        }
    }
}

/// Copies frames between containerd (`downstream`) and the inner shim (`upstream`) until either side
/// closes, intercepting Creates. Returns when containerd's side is done.
pub fn pump(downstream: UnixStream, upstream: UnixStream, gate: Arc<dyn CreateGate>) -> io::Result<()> {
    let down_writer = Arc::new(Mutex::new(downstream.try_clone()?));
    let up_writer = Arc::new(Mutex::new(upstream.try_clone()?));

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
    let result = forward_requests(&mut down_reader, &down_writer, &up_writer, &gate);
    if let Ok(w) = up_writer.lock() {
        let _ = w.shutdown(std::net::Shutdown::Both);
    }
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
    down_writer: &Arc<Mutex<UnixStream>>,
    up_writer: &Arc<Mutex<UnixStream>>,
    gate: &Arc<dyn CreateGate>,
) -> io::Result<()> {
    while let Some(frame) = read_frame(reader)? {
        match classify(&frame) {
            Classified::Forward => send(up_writer, &frame)?,
            Classified::Undecodable(message) => {
                let rejection =
                    Rejection { code: Code::INVALID_ARGUMENT, message: format!("nvinject: {message}") };
                send(down_writer, &rejection_frame(frame.header.stream_id, &rejection))?;
            }
            Classified::Create(create) => {
                // Injection reads and writes files (and may regenerate a spec), so it runs off the
                // read loop: other calls on this connection keep flowing meanwhile. A Create is a
                // single frame, so forwarding it later cannot reorder a stream.
                let gate = Arc::clone(gate);
                let down_writer = Arc::clone(down_writer);
                let up_writer = Arc::clone(up_writer);
                thread::Builder::new().name("create".into()).spawn(move || {
                    // A panic must not leave containerd waiting for an answer that never comes.
                    let decision = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        gate.before_create(&create)
                    }))
                    .unwrap_or_else(|_| {
                        Err(Rejection {
                            code: Code::INTERNAL,
                            message: format!(
                                "nvinject: container {}: internal error while injecting devices",
                                create.id
                            ),
                        })
                    });
                    let outcome = match decision {
                        Ok(()) => send(&up_writer, &frame),
                        Err(rejection) => {
                            send(&down_writer, &rejection_frame(frame.header.stream_id, &rejection))
                        }
                    };
                    if let Err(e) = outcome {
                        tracing::debug!(id = %create.id, error = %e, "could not pass the Create on");
                    }
                })?;
            }
        }
    }
    Ok(())
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
        let req = Request { service: service.into(), method: method.into(), payload, ..Default::default() };
        let bytes = req.write_to_bytes().unwrap();
        Frame { header: MessageHeader::new_request(5, bytes.len() as u32), payload: bytes }
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
        let pump_thread = thread::spawn(move || pump(proxy_down, proxy_up, gate));
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
}
