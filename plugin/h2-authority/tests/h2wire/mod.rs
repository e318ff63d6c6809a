//! Raw HTTP/2 for tests: frames, HPACK representations (Huffman coding included) written here
//! from RFC 9113 and RFC 7541, and a blocking client over a unix socket that sends whatever
//! `:authority` it is given, as grpc-go in kubelets before 1.26 does (tonic's client cannot:
//! its URI type refuses a path as authority). Shared by this crate's unit tests (`src/lib.rs`)
//! and the device plugin's `tests/old_kubelet.rs` and bench (included there by path), so it goes
//! with this crate. Decoding what a server sends uses loona-hpack.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

/// HTTP/2 error code PROTOCOL_ERROR.
pub const PROTOCOL_ERROR: u32 = 0x1;

/// One frame's bytes.
pub fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.push(ty);
    f.push(flags);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A parsed frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub ty: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

/// Splits `bytes` (a connection's frames, the preface stripped if present) into frames; panics
/// on a truncated frame.
pub fn frames(bytes: &[u8]) -> Vec<Frame> {
    let mut rest = bytes.strip_prefix(PREFACE).unwrap_or(bytes);
    let mut out = Vec::new();
    while !rest.is_empty() {
        assert!(rest.len() >= 9, "truncated frame header");
        let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        assert!(rest.len() >= 9 + len, "truncated frame payload");
        out.push(Frame {
            ty: rest[3],
            flags: rest[4],
            stream: u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff,
            payload: rest[9..9 + len].to_vec(),
        });
        rest = &rest[9 + len..];
    }
    out
}

/// The HPACK Huffman code (RFC 7541 Appendix B) of the characters tests use (those of paths,
/// authorities and the RFC's examples): character, code, bits.
const HUFFMAN_CODES: &[(u8, u32, u8)] = &[
    (b' ', 0x14, 6),
    (b',', 0xfa, 8),
    (b'-', 0x16, 6),
    (b'.', 0x17, 6),
    (b'/', 0x18, 6),
    (b':', 0x5c, 7),
    (b'_', 0x22, 6),
    (b'0', 0x0, 5),
    (b'1', 0x1, 5),
    (b'2', 0x2, 5),
    (b'3', 0x19, 6),
    (b'4', 0x1a, 6),
    (b'5', 0x1b, 6),
    (b'6', 0x1c, 6),
    (b'7', 0x1d, 6),
    (b'8', 0x1e, 6),
    (b'9', 0x1f, 6),
    (b'A', 0x21, 6),
    (b'B', 0x5d, 7),
    (b'C', 0x5e, 7),
    (b'D', 0x5f, 7),
    (b'E', 0x60, 7),
    (b'F', 0x61, 7),
    (b'G', 0x62, 7),
    (b'H', 0x63, 7),
    (b'I', 0x64, 7),
    (b'J', 0x65, 7),
    (b'K', 0x66, 7),
    (b'L', 0x67, 7),
    (b'M', 0x68, 7),
    (b'N', 0x69, 7),
    (b'O', 0x6a, 7),
    (b'P', 0x6b, 7),
    (b'Q', 0x6c, 7),
    (b'R', 0x6d, 7),
    (b'S', 0x6e, 7),
    (b'T', 0x6f, 7),
    (b'U', 0x70, 7),
    (b'V', 0x71, 7),
    (b'W', 0x72, 7),
    (b'X', 0xfc, 8),
    (b'Y', 0x73, 7),
    (b'Z', 0xfd, 8),
    (b'a', 0x3, 5),
    (b'b', 0x23, 6),
    (b'c', 0x4, 5),
    (b'd', 0x24, 6),
    (b'e', 0x5, 5),
    (b'f', 0x25, 6),
    (b'g', 0x26, 6),
    (b'h', 0x27, 6),
    (b'i', 0x6, 5),
    (b'j', 0x74, 7),
    (b'k', 0x75, 7),
    (b'l', 0x28, 6),
    (b'm', 0x29, 6),
    (b'n', 0x2a, 6),
    (b'o', 0x7, 5),
    (b'p', 0x2b, 6),
    (b'q', 0x76, 7),
    (b'r', 0x2c, 6),
    (b's', 0x8, 5),
    (b't', 0x9, 5),
    (b'u', 0x2d, 6),
    (b'v', 0x77, 7),
    (b'w', 0x78, 7),
    (b'x', 0x79, 7),
    (b'y', 0x7a, 7),
    (b'z', 0x7b, 7),
];

fn huffman_code(c: u8) -> (u32, u8) {
    let &(_, code, bits) = HUFFMAN_CODES
        .iter()
        .find(|(ch, _, _)| *ch == c)
        .unwrap_or_else(|| panic!("no Huffman code for {:?} in the test table", c as char));
    (code, bits)
}

/// Huffman-codes `s`, padded with the most significant bits of EOS (all ones).
pub fn huffman(s: &[u8]) -> Vec<u8> {
    let (mut acc, mut bits, mut out) = (0u64, 0u32, Vec::new());
    for &c in s {
        let (code, len) = huffman_code(c);
        acc = (acc << len) | u64::from(code);
        bits += u32::from(len);
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
        acc &= (1 << bits) - 1;
    }
    if bits > 0 {
        out.push(((acc << (8 - bits)) | ((1 << (8 - bits)) - 1)) as u8);
    }
    out
}

/// Appends an HPACK integer (RFC 7541 5.1).
pub fn int(out: &mut Vec<u8>, value: usize, prefix: u8, flags: u8) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    let mut v = value - max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// Appends an HPACK string, Huffman-coded or plain.
pub fn string(out: &mut Vec<u8>, s: &str, huff: bool) {
    if huff {
        let h = huffman(s.as_bytes());
        int(out, h.len(), 7, 0x80);
        out.extend_from_slice(&h);
    } else {
        int(out, s.len(), 7, 0);
        out.extend_from_slice(s.as_bytes());
    }
}

/// A field's name: an index into the tables, or a literal.
#[derive(Debug, Clone, Copy)]
pub enum Name<'a> {
    Index(usize),
    Literal(&'a str),
}

/// An HPACK representation (RFC 7541 section 6); the bool asks for Huffman coding.
#[derive(Debug, Clone, Copy)]
pub enum Rep<'a> {
    Indexed(usize),
    Incremental(Name<'a>, &'a str, bool),
    Without(Name<'a>, &'a str, bool),
    Never(Name<'a>, &'a str, bool),
    SizeUpdate(usize),
}

/// Encodes a header block.
pub fn encode(reps: &[Rep]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in reps {
        match *r {
            Rep::Indexed(i) => int(&mut out, i, 7, 0x80),
            Rep::SizeUpdate(s) => int(&mut out, s, 5, 0x20),
            Rep::Incremental(n, v, h) => literal(&mut out, 6, 0x40, n, v, h),
            Rep::Without(n, v, h) => literal(&mut out, 4, 0x00, n, v, h),
            Rep::Never(n, v, h) => literal(&mut out, 4, 0x10, n, v, h),
        }
    }
    out
}

fn literal(out: &mut Vec<u8>, prefix: u8, flags: u8, name: Name, value: &str, huff: bool) {
    match name {
        Name::Index(i) => int(out, i, prefix, flags),
        Name::Literal(n) => {
            int(out, 0, prefix, flags);
            string(out, n, huff);
        }
    }
    string(out, value, huff);
}

/// A request header block as grpc-go (kubelet 1.20) encodes its first one on a connection: known
/// names by static index, new fields added to the dynamic table (`:path`, `:authority`,
/// `content-type`, `user-agent`, `te`, in that order), the authority Huffman-coded when `huff`.
pub fn grpc_go_first_block(path: &str, authority: &str, huff: bool) -> Vec<u8> {
    encode(&[
        Rep::Indexed(3), // :method POST
        Rep::Indexed(6), // :scheme http
        Rep::Incremental(Name::Index(4), path, false),
        Rep::Incremental(Name::Index(1), authority, huff),
        Rep::Incremental(Name::Index(31), "application/grpc", false),
        Rep::Incremental(Name::Index(58), "grpc-go/1.27.1", false),
        Rep::Incremental(Name::Literal("te"), "trailers", false),
    ])
}

/// A later request on the same connection: the path as a literal that does not enter the table
/// (Huffman-coded when `huff`), the authority and the other repeated fields by dynamic table
/// index.
pub fn grpc_go_next_block(path: &str, huff: bool) -> Vec<u8> {
    encode(&[
        Rep::Indexed(3),
        Rep::Indexed(6),
        Rep::Without(Name::Index(4), path, huff),
        Rep::Indexed(65), // :authority (after :path, the oldest of the five entries still there)
        Rep::Indexed(64), // content-type
        Rep::Indexed(63), // user-agent
        Rep::Indexed(62), // te
    ])
}

/// The header block fragment of a HEADERS or CONTINUATION frame's payload: a HEADERS frame's
/// padding and priority fields removed.
pub fn fragment(ty: u8, flags: u8, payload: &[u8]) -> &[u8] {
    let mut p = payload;
    if ty == HEADERS && flags & PADDED != 0 {
        let pad = p[0] as usize;
        p = &p[1..p.len() - pad];
    }
    if ty == HEADERS && flags & PRIORITY != 0 {
        p = &p[5..];
    }
    p
}

/// The header lists h2 would decode from a connection's client bytes (preface optional): every
/// header block decoded in order with one HPACK decoder, PADDED and PRIORITY fields removed.
pub fn server_view(bytes: &[u8]) -> Vec<Vec<(String, String)>> {
    try_server_view(bytes).expect("the server's decoder accepts every block")
}

/// [`server_view`], `None` when a block does not decode.
pub fn try_server_view(bytes: &[u8]) -> Option<Vec<Vec<(String, String)>>> {
    let mut decoder = loona_hpack::Decoder::new();
    let mut lists = Vec::new();
    let mut block = Vec::new();
    for f in frames(bytes) {
        if f.ty != HEADERS && f.ty != CONTINUATION {
            continue;
        }
        block.extend_from_slice(fragment(f.ty, f.flags, &f.payload));
        if f.flags & END_HEADERS != 0 {
            let list = decoder.decode(&block).ok()?;
            lists.push(
                list.into_iter()
                    .map(|(n, v)| (String::from_utf8_lossy(&n).into(), String::from_utf8_lossy(&v).into()))
                    .collect(),
            );
            block.clear();
        }
    }
    Some(lists)
}

/// A gRPC length-prefixed message (uncompressed).
pub fn grpc_message(msg: &[u8]) -> Vec<u8> {
    let mut m = vec![0];
    m.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    m.extend_from_slice(msg);
    m
}

/// The gRPC messages in a stream's DATA (complete ones only).
pub fn grpc_messages(mut data: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while data.len() >= 5 {
        let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
        if data.len() < 5 + len {
            break;
        }
        out.push(data[5..5 + len].to_vec());
        data = &data[5 + len..];
    }
    out
}

/// What the server sent on one stream.
#[derive(Debug, Default, Clone)]
pub struct StreamSeen {
    /// Header lists: the response headers, then trailers.
    pub headers: Vec<Vec<(String, String)>>,
    pub data: Vec<u8>,
    /// RST_STREAM error code.
    pub reset: Option<u32>,
    pub ended: bool,
}

impl StreamSeen {
    /// A header's value in any of the stream's header lists.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().flatten().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// A blocking HTTP/2 client that writes its frames itself.
pub struct RawClient {
    sock: UnixStream,
    decoder: loona_hpack::Decoder<'static>,
    buf: Vec<u8>,
    block: Vec<u8>,
    pub streams: HashMap<u32, StreamSeen>,
    pub goaway: Option<u32>,
    pub closed: bool,
}

impl RawClient {
    /// Connects and sends the preface and an empty SETTINGS frame.
    pub fn connect(path: &Path) -> RawClient {
        let sock = UnixStream::connect(path).unwrap_or_else(|e| panic!("connect {}: {e}", path.display()));
        sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let mut c = RawClient {
            sock,
            decoder: loona_hpack::Decoder::new(),
            buf: Vec::new(),
            block: Vec::new(),
            streams: HashMap::new(),
            goaway: None,
            closed: false,
        };
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        c.send(&hello);
        c
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).unwrap();
    }

    /// Sends a request: its header block in one HEADERS frame, then `body` as DATA ending the
    /// stream.
    pub fn request(&mut self, stream: u32, block: &[u8], body: &[u8]) {
        let mut bytes = frame(HEADERS, END_HEADERS, stream, block);
        bytes.extend(frame(DATA, END_STREAM, stream, body));
        self.send(&bytes);
    }

    /// Reads frames until `done` holds for `stream`, the connection closes, or `patience` runs
    /// out; returns what the stream got.
    pub fn wait(
        &mut self,
        stream: u32,
        patience: Duration,
        done: impl Fn(&StreamSeen) -> bool,
    ) -> StreamSeen {
        let deadline = Instant::now() + patience;
        loop {
            let seen = self.streams.get(&stream).cloned().unwrap_or_default();
            if done(&seen) || self.closed || Instant::now() > deadline {
                return seen;
            }
            self.read_some();
        }
    }

    fn read_some(&mut self) {
        let mut chunk = [0u8; 16384];
        match self.sock.read(&mut chunk) {
            Ok(0) => self.closed = true,
            Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => self.closed = true,
        }
        while self.buf.len() >= 9 {
            let len = u32::from_be_bytes([0, self.buf[0], self.buf[1], self.buf[2]]) as usize;
            if self.buf.len() < 9 + len {
                break;
            }
            let f: Vec<u8> = self.buf.drain(..9 + len).collect();
            let (ty, flags) = (f[3], f[4]);
            let id = u32::from_be_bytes([f[5], f[6], f[7], f[8]]) & 0x7fff_ffff;
            let payload = &f[9..];
            match ty {
                SETTINGS if flags & ACK == 0 => self.send(&frame(SETTINGS, ACK, 0, &[])),
                PING if flags & ACK == 0 => self.send(&frame(PING, ACK, 0, payload)),
                GOAWAY => self.goaway = Some(u32::from_be_bytes(payload[4..8].try_into().unwrap())),
                RST_STREAM => {
                    self.streams.entry(id).or_default().reset =
                        Some(u32::from_be_bytes(payload[..4].try_into().unwrap()))
                }
                DATA => {
                    let s = self.streams.entry(id).or_default();
                    s.data.extend_from_slice(payload);
                    s.ended |= flags & END_STREAM != 0;
                    // Give the window back so long streams keep flowing.
                    if !payload.is_empty() {
                        let inc = (payload.len() as u32).to_be_bytes();
                        let mut w = frame(WINDOW_UPDATE, 0, 0, &inc);
                        w.extend(frame(WINDOW_UPDATE, 0, id, &inc));
                        self.send(&w);
                    }
                }
                HEADERS | CONTINUATION => {
                    self.block.extend_from_slice(fragment(ty, flags, payload));
                    if ty == HEADERS && flags & END_STREAM != 0 {
                        self.streams.entry(id).or_default().ended = true;
                    }
                    if flags & END_HEADERS != 0 {
                        let list = self.decoder.decode(&self.block).expect("server's HPACK decodes");
                        self.block.clear();
                        self.streams.entry(id).or_default().headers.push(
                            list.into_iter()
                                .map(|(n, v)| {
                                    (String::from_utf8_lossy(&n).into(), String::from_utf8_lossy(&v).into())
                                })
                                .collect(),
                        );
                    }
                }
                _ => {}
            }
        }
    }
}
