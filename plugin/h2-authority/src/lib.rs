//! Makes the requests of kubelets older than 1.26 acceptable to an h2 (tonic) gRPC server: the
//! device plugin's workaround for their `:authority`, kept in its own crate so it can be deleted
//! in one piece.
//!
//! Those kubelets dial a plugin's unix socket with grpc-go, which sends the socket path as the
//! HTTP/2 `:authority` (`/var/lib/kubelet/device-plugins/nvinject-gpu.sock`; Kubernetes 1.26 sends
//! `localhost` instead). h2, under tonic, refuses an authority that is not a URI authority and
//! resets the stream, so such a kubelet never sees our devices. [`AuthorityRewriter`] follows the
//! client->server bytes of one connection before h2 sees them: it tracks the HTTP/2 frames,
//! HPACK-decodes every header block with the connection's dynamic table, and replaces an
//! `:authority` that h2 would refuse with `localhost`. Everything else keeps its meaning; frames
//! other than HEADERS and CONTINUATION pass byte for byte. The HPACK pieces are in the private
//! `hpack` module.
//!
//! Keeping h2's HPACK state right: until the first rewrite every block passes untouched, so h2's
//! dynamic table is the client's. A rewritten block is re-encoded with literals that never enter
//! the table, so from then on h2's table lacks what the client added: every later block is
//! re-encoded too, its table references resolved here. Input the rewriter cannot follow (no
//! preface, a broken frame sequence, HPACK it cannot decode) is passed on as it came, and so is
//! everything after it: h2 then refuses it as it would have anyway.
//!
//! Boundary: pure, bytes in and bytes out; no sockets, no async, no logging. The socket wrapper
//! that drives it (and logs the first rewrite) is the device plugin's
//! `transport::AuthorityFixStream`. It never panics on input.
//!
//! End of life: this crate goes when no supported kubelet, and no other client of our sockets,
//! sends a socket path as `:authority` (see the README for what that means today).

use std::ops::Range;

mod hpack;

use crate::hpack::{DynamicTable, Malformed, STATIC_TABLE, put_int, put_string, read_int, read_string};

/// What every HTTP/2 client sends first (RFC 9113 section 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Length of a frame header: 24-bit length, type, flags, 32-bit stream id.
const FRAME_HEAD_LEN: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Largest frame payload the rewriter emits: the smallest SETTINGS_MAX_FRAME_SIZE a peer may
/// announce, so every server accepts it whatever it announced.
pub const MAX_EMITTED_FRAME: usize = 16_384;
/// Most bytes of one header block (frames as received) held back before giving up; far beyond
/// what h2 accepts with tonic's defaults, so only a broken or hostile client reaches it.
const MAX_BLOCK_BYTES: usize = 256 * 1024;
/// Most decoded bytes of one block kept for re-encoding. Table references can expand a small
/// block a thousandfold; a block that decodes to more is not re-encoded (see
/// [`Verdict::TooLarge`]).
const MAX_DECODED_BYTES: usize = 256 * 1024;
/// Largest dynamic table size update followed; bounds the decoder's memory (h2 itself accepts
/// only the size it announced, 4096 by default).
const MAX_TABLE_SIZE: usize = 64 * 1024;
/// Buffers above this capacity are released after use, so one large block does not pin memory
/// for the connection's life.
const KEEP_CAPACITY: usize = 64 * 1024;
/// What replaces a refused authority: what kubelets since 1.26 send.
pub const REPLACEMENT_AUTHORITY: &str = "localhost";

/// True when h2 accepts `value` as `:authority`. h2 applies the `http` crate's URI authority
/// parser: non-empty, and no `/`, space or other byte outside an RFC 3986 authority.
pub fn authority_is_acceptable(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// The first rewrite of a connection, for its log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewrite {
    /// The stream whose header block carried it.
    pub stream_id: u32,
    /// The authority as received (lossy UTF-8).
    pub authority: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Checking the connection preface; `matched` bytes so far.
    Preface { matched: usize },
    /// Collecting a frame header into `head`.
    FrameHead,
    /// Inside the payload of a frame that passes untouched.
    Pass { left: usize },
    /// Collecting the payload of a HEADERS or CONTINUATION frame into `raw`.
    Block { left: usize, payload_start: usize, frame_type: u8, flags: u8 },
    /// Lost track of the frames: everything passes untouched from here on.
    Passthrough,
}

/// The HEADERS frame that opened the block being collected.
#[derive(Debug, Clone, Copy)]
struct OpenBlock {
    stream_id: u32,
    flags: u8,
    /// Stream dependency and weight of a PRIORITY-flagged HEADERS, kept in the rewrite.
    priority: Option<[u8; 5]>,
}

/// One field of the examined block, as it will be re-encoded. Ranges point into the block
/// (`fragment`) or into the rewriter's arena of decoded octets.
#[derive(Debug, Clone)]
enum Field {
    /// A static table reference, re-sent as received (h2 has the same static table).
    Verbatim(Range<usize>),
    /// Re-sent as a literal that does not enter h2's dynamic table.
    Literal {
        name: FieldName,
        value: FieldValue,
        /// Sent as "never indexed": an intermediary keeps that representation (RFC 7541 6.2.3).
        never_indexed: bool,
    },
}

#[derive(Debug, Clone)]
enum FieldName {
    /// Index into the static table.
    Static(usize),
    /// Decoded octets in the arena (a dynamic table entry's name).
    Decoded(Range<usize>),
    /// A string literal in the block, copied as received (Huffman-coded or not).
    Encoded(Range<usize>),
}

#[derive(Debug, Clone)]
enum FieldValue {
    Decoded(Range<usize>),
    Encoded(Range<usize>),
    /// A refused `:authority`: sent as [`REPLACEMENT_AUTHORITY`].
    Replacement,
}

/// What to do with a complete header block.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Pass the frames as received.
    Untouched,
    /// Re-encode it; `replaced` is the first refused authority in it, if any.
    Reencode { replaced: Option<String> },
    /// Decoded, but its header list is too large to hold for re-encoding.
    TooLarge,
}

/// The block cannot be decoded (or its frames cannot be followed): it goes on as received, and
/// so does everything after it.
#[derive(Debug)]
struct Undecodable;

impl From<Malformed> for Undecodable {
    fn from(_: Malformed) -> Self {
        Undecodable
    }
}

/// Rewrites the client->server bytes of one HTTP/2 connection so that h2 accepts the
/// `:authority` of kubelets before 1.26. Feed it bytes as they arrive, in any chunking; it
/// appends what the server should read to `out`, holding back only an incomplete frame header
/// or header block.
pub struct AuthorityRewriter {
    state: State,
    head: [u8; FRAME_HEAD_LEN],
    head_len: usize,
    /// The frames of the header block being collected, exactly as received.
    raw: Vec<u8>,
    /// Their header block fragments, concatenated.
    fragment: Vec<u8>,
    block: Option<OpenBlock>,
    /// The connection's HPACK dynamic table, as the client's encoder keeps it.
    table: DynamicTable,
    /// Length of the current block's leading dynamic table size updates.
    updates_len: usize,
    /// Decoded octets of the current block, and its fields.
    arena: Vec<u8>,
    fields: Vec<Field>,
    /// A literal name, decoded.
    name: Vec<u8>,
    /// The re-encoded block.
    encoded: Vec<u8>,
    /// A block was re-encoded: h2's dynamic table no longer matches the client's.
    diverged: bool,
    rewritten_blocks: u64,
    first_rewrite: Option<Rewrite>,
}

impl std::fmt::Debug for AuthorityRewriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorityRewriter")
            .field("state", &self.state)
            .field("diverged", &self.diverged)
            .field("rewritten_blocks", &self.rewritten_blocks)
            .finish_non_exhaustive()
    }
}

impl Default for AuthorityRewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl AuthorityRewriter {
    /// A rewriter for a new connection: expects the client preface first.
    pub fn new() -> Self {
        AuthorityRewriter {
            state: State::Preface { matched: 0 },
            head: [0; FRAME_HEAD_LEN],
            head_len: 0,
            raw: Vec::new(),
            fragment: Vec::new(),
            block: None,
            table: DynamicTable::new(),
            updates_len: 0,
            arena: Vec::new(),
            fields: Vec::new(),
            name: Vec::new(),
            encoded: Vec::new(),
            diverged: false,
            rewritten_blocks: 0,
            first_rewrite: None,
        }
    }

    /// Header blocks whose authority was replaced so far.
    pub fn rewritten_blocks(&self) -> u64 {
        self.rewritten_blocks
    }

    /// The first rewrite, returned once (for a once-per-connection log line).
    pub fn take_first_rewrite(&mut self) -> Option<Rewrite> {
        self.first_rewrite.take()
    }

    /// True once everything passes untouched for good (the rewriter lost track of the frames):
    /// the caller may stop feeding it.
    pub fn is_passthrough(&self) -> bool {
        self.state == State::Passthrough
    }

    /// Processes `input`, appending the bytes for the server to `out`.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) {
        while !input.is_empty() {
            match self.state {
                State::Passthrough => {
                    out.extend_from_slice(input);
                    return;
                }
                State::Preface { matched } => {
                    let n = (PREFACE.len() - matched).min(input.len());
                    let (now, rest) = input.split_at(n);
                    out.extend_from_slice(now);
                    input = rest;
                    self.state = if now != &PREFACE[matched..matched + n] {
                        State::Passthrough
                    } else if matched + n == PREFACE.len() {
                        State::FrameHead
                    } else {
                        State::Preface { matched: matched + n }
                    };
                }
                State::FrameHead => {
                    let n = (FRAME_HEAD_LEN - self.head_len).min(input.len());
                    let (now, rest) = input.split_at(n);
                    self.head[self.head_len..self.head_len + n].copy_from_slice(now);
                    self.head_len += n;
                    input = rest;
                    if self.head_len == FRAME_HEAD_LEN {
                        self.head_len = 0;
                        self.on_frame_head(out);
                    }
                }
                State::Pass { left } => {
                    let n = left.min(input.len());
                    let (now, rest) = input.split_at(n);
                    out.extend_from_slice(now);
                    input = rest;
                    self.state = if n == left { State::FrameHead } else { State::Pass { left: left - n } };
                }
                State::Block { left, payload_start, frame_type, flags } => {
                    let n = left.min(input.len());
                    let (now, rest) = input.split_at(n);
                    self.raw.extend_from_slice(now);
                    input = rest;
                    if n == left {
                        self.on_block_frame_end(payload_start, frame_type, flags, out);
                    } else {
                        self.state = State::Block { left: left - n, payload_start, frame_type, flags };
                    }
                }
            }
        }
    }

    /// The input ended: passes on whatever is held back (an incomplete frame header or header
    /// block), so the server sees all the client sent.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        let (head, n) = (self.head, self.head_len);
        self.head_len = 0;
        self.give_up(&head[..n], out);
    }

    fn on_frame_head(&mut self, out: &mut Vec<u8>) {
        let head = self.head;
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (frame_type, flags) = (head[3], head[4]);
        let stream_id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        match self.block {
            // Between HEADERS and END_HEADERS only CONTINUATION frames of that stream may come
            // (RFC 9113 section 6.10); anything else is a connection error h2 reports itself.
            Some(b) if frame_type != TYPE_CONTINUATION || stream_id != b.stream_id => {
                return self.give_up(&head, out);
            }
            Some(_) => {}
            None if frame_type == TYPE_CONTINUATION => return self.give_up(&head, out),
            None if frame_type != TYPE_HEADERS => {
                out.extend_from_slice(&head);
                self.state = if len == 0 { State::FrameHead } else { State::Pass { left: len } };
                return;
            }
            None => self.block = Some(OpenBlock { stream_id, flags, priority: None }),
        }
        if self.raw.len() + FRAME_HEAD_LEN + len > MAX_BLOCK_BYTES {
            return self.give_up(&head, out);
        }
        self.raw.extend_from_slice(&head);
        let payload_start = self.raw.len();
        self.state = State::Block { left: len, payload_start, frame_type, flags };
        if len == 0 {
            self.on_block_frame_end(payload_start, frame_type, flags, out);
        }
    }

    /// A HEADERS or CONTINUATION frame is complete in `raw[payload_start..]`.
    fn on_block_frame_end(&mut self, payload_start: usize, frame_type: u8, flags: u8, out: &mut Vec<u8>) {
        let payload = &self.raw[payload_start..];
        let Some((fragment, priority)) = split_payload(frame_type, flags, payload) else {
            // Padding or priority longer than the frame: a connection error for h2.
            return self.give_up(&[], out);
        };
        self.fragment.extend_from_slice(&payload[fragment]);
        if let (Some(block), TYPE_HEADERS) = (self.block.as_mut(), frame_type) {
            block.priority = priority;
        }
        if flags & FLAG_END_HEADERS == 0 {
            self.state = State::FrameHead;
            return;
        }
        let Some(block) = self.block.take() else { return self.give_up(&[], out) };
        match self.examine() {
            Err(Undecodable) => return self.give_up(&[], out),
            Ok(Verdict::Untouched) => out.extend_from_slice(&self.raw),
            // h2's table already lacks what the client added, so the block cannot go as it came.
            Ok(Verdict::TooLarge) if self.diverged => return self.give_up(&[], out),
            // Tables still match: h2 judges the block (and refuses it by its own size limit).
            Ok(Verdict::TooLarge) => out.extend_from_slice(&self.raw),
            Ok(Verdict::Reencode { replaced }) => {
                self.encode();
                emit_frames(&self.encoded, block, out);
                self.diverged = true;
                if let Some(authority) = replaced {
                    self.rewritten_blocks += 1;
                    if self.rewritten_blocks == 1 {
                        self.first_rewrite = Some(Rewrite { stream_id: block.stream_id, authority });
                    }
                }
            }
        }
        self.reset_block();
        self.state = State::FrameHead;
    }

    /// Decodes the complete block in `fragment` into `fields`, updating the dynamic table as
    /// h2 will, and says what to do with the block. Values that neither enter the table nor are
    /// an `:authority` are not decoded: a re-encoded block carries them as received.
    fn examine(&mut self) -> Result<Verdict, Undecodable> {
        let AuthorityRewriter { fragment, table, arena, fields, name: name_buf, diverged, .. } = self;
        let block = &fragment[..];
        arena.clear();
        fields.clear();
        let (mut pos, mut updates_len, mut any_field, mut too_large) = (0, 0, false, false);
        let mut replaced: Option<String> = None;
        let mut refuse = |value: &[u8]| {
            let refused = !authority_is_acceptable(value);
            if refused && replaced.is_none() {
                replaced = Some(String::from_utf8_lossy(value).into_owned());
            }
            refused
        };
        while pos < block.len() {
            if too_large {
                // Only the table matters now; nothing is kept for re-encoding.
                arena.clear();
            }
            let first = block[pos];
            let field = if first & 0x80 != 0 {
                // Indexed field.
                let (index, n) = read_int(&block[pos..], 7)?;
                let (name, value) = table.get(index).ok_or(Undecodable)?;
                let refused = name == b":authority" && refuse(value);
                let representation = pos..pos + n;
                pos += n;
                match (index <= STATIC_TABLE.len(), refused) {
                    (true, false) => Field::Verbatim(representation),
                    (true, true) => Field::Literal {
                        name: FieldName::Static(index),
                        value: FieldValue::Replacement,
                        never_indexed: false,
                    },
                    (false, _) => {
                        let name = push(arena, name);
                        let value = if refused {
                            FieldValue::Replacement
                        } else {
                            FieldValue::Decoded(push(arena, value))
                        };
                        Field::Literal { name: FieldName::Decoded(name), value, never_indexed: false }
                    }
                }
            } else if first & 0x40 == 0 && first & 0x20 != 0 {
                // Dynamic table size update: only before the first field (RFC 7541 4.2).
                let (size, n) = read_int(&block[pos..], 5)?;
                if any_field || size > MAX_TABLE_SIZE {
                    return Err(Undecodable);
                }
                table.set_max_size(size);
                pos += n;
                updates_len = pos;
                continue;
            } else {
                // Literal: with incremental indexing (01), never indexed (0001), without (0000).
                let incremental = first & 0x40 != 0;
                let (index, n) = read_int(&block[pos..], if incremental { 6 } else { 4 })?;
                pos += n;
                name_buf.clear();
                let name = if index == 0 {
                    let literal = read_string(&block[pos..])?;
                    literal.decode_into(name_buf)?;
                    let encoded = pos..pos + literal.encoded_len;
                    pos += literal.encoded_len;
                    FieldName::Encoded(encoded)
                } else {
                    let (name, _) = table.get(index).ok_or(Undecodable)?;
                    name_buf.extend_from_slice(name);
                    if index <= STATIC_TABLE.len() {
                        FieldName::Static(index)
                    } else {
                        FieldName::Decoded(push(arena, name))
                    }
                };
                let literal = read_string(&block[pos..])?;
                let encoded = pos..pos + literal.encoded_len;
                pos += literal.encoded_len;
                let is_authority = name_buf.as_slice() == b":authority";
                let value = if incremental || is_authority {
                    let start = arena.len();
                    literal.decode_into(arena)?;
                    let value = start..arena.len();
                    if incremental {
                        table.insert(name_buf, &arena[value.clone()]);
                    }
                    if is_authority && refuse(&arena[value.clone()]) {
                        FieldValue::Replacement
                    } else {
                        FieldValue::Decoded(value)
                    }
                } else {
                    FieldValue::Encoded(encoded)
                };
                Field::Literal { name, value, never_indexed: !incremental && first & 0x10 != 0 }
            };
            any_field = true;
            if !too_large {
                fields.push(field);
                too_large = arena.len() > MAX_DECODED_BYTES;
            }
        }
        self.updates_len = updates_len;
        Ok(match replaced {
            _ if too_large => Verdict::TooLarge,
            None if !*diverged => Verdict::Untouched,
            replaced => Verdict::Reencode { replaced },
        })
    }

    /// Re-encodes the examined block into `encoded`: its leading size updates and static table
    /// references as received, every other field as a literal that does not enter the dynamic
    /// table (without indexing, or never indexed when sent so), undecoded strings as received.
    fn encode(&mut self) {
        let AuthorityRewriter { fragment, arena, fields, encoded, updates_len, .. } = self;
        encoded.clear();
        encoded.extend_from_slice(&fragment[..*updates_len]);
        for field in fields.iter() {
            let Field::Literal { name, value, never_indexed } = field else {
                if let Field::Verbatim(r) = field {
                    encoded.extend_from_slice(&fragment[r.clone()]);
                }
                continue;
            };
            let flags = if *never_indexed { 0x10 } else { 0x00 };
            match name {
                FieldName::Static(index) => put_int(encoded, *index, 4, flags),
                FieldName::Decoded(r) => {
                    encoded.push(flags);
                    put_string(encoded, &arena[r.clone()]);
                }
                FieldName::Encoded(r) => {
                    encoded.push(flags);
                    encoded.extend_from_slice(&fragment[r.clone()]);
                }
            }
            match value {
                FieldValue::Decoded(r) => put_string(encoded, &arena[r.clone()]),
                FieldValue::Encoded(r) => encoded.extend_from_slice(&fragment[r.clone()]),
                FieldValue::Replacement => put_string(encoded, REPLACEMENT_AUTHORITY.as_bytes()),
            }
        }
    }

    /// Passes on the held-back block, then `extra`, and stops following the frames.
    fn give_up(&mut self, extra: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(&self.raw);
        out.extend_from_slice(extra);
        self.reset_block();
        self.state = State::Passthrough;
    }

    fn reset_block(&mut self) {
        self.block = None;
        for buf in [&mut self.raw, &mut self.fragment, &mut self.arena, &mut self.encoded, &mut self.name] {
            buf.clear();
            if buf.capacity() > KEEP_CAPACITY {
                *buf = Vec::new();
            }
        }
        self.fields.clear();
    }
}

/// The header block fragment of a HEADERS or CONTINUATION payload (PADDED and PRIORITY fields
/// apply to HEADERS only), and a HEADERS frame's priority bytes. `None` when the padding or
/// priority do not fit in the payload.
fn split_payload(frame_type: u8, flags: u8, payload: &[u8]) -> Option<(Range<usize>, Option<[u8; 5]>)> {
    let (mut start, mut end) = (0, payload.len());
    let mut priority = None;
    if frame_type == TYPE_HEADERS {
        if flags & FLAG_PADDED != 0 {
            let pad = usize::from(*payload.first()?);
            start = 1;
            end = end.checked_sub(pad)?;
        }
        if flags & FLAG_PRIORITY != 0 {
            priority = Some(<[u8; 5]>::try_from(payload.get(start..start + 5)?).ok()?);
            start += 5;
        }
    }
    (start <= end).then_some((start..end, priority))
}

/// Appends `src` to `arena`; where it landed.
fn push(arena: &mut Vec<u8>, src: &[u8]) -> Range<usize> {
    let start = arena.len();
    arena.extend_from_slice(src);
    start..arena.len()
}

/// Appends `block` as a HEADERS frame (carrying `open`'s END_STREAM and priority) and as many
/// CONTINUATION frames as [`MAX_EMITTED_FRAME`] requires.
fn emit_frames(block: &[u8], open: OpenBlock, out: &mut Vec<u8>) {
    let priority_len = if open.priority.is_some() { 5 } else { 0 };
    let (first, mut rest) = block.split_at(block.len().min(MAX_EMITTED_FRAME - priority_len));
    let mut flags = open.flags & FLAG_END_STREAM;
    if open.priority.is_some() {
        flags |= FLAG_PRIORITY;
    }
    if rest.is_empty() {
        flags |= FLAG_END_HEADERS;
    }
    put_frame_head(out, priority_len + first.len(), TYPE_HEADERS, flags, open.stream_id);
    if let Some(p) = open.priority {
        out.extend_from_slice(&p);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, after) = rest.split_at(rest.len().min(MAX_EMITTED_FRAME));
        rest = after;
        let flags = if rest.is_empty() { FLAG_END_HEADERS } else { 0 };
        put_frame_head(out, chunk.len(), TYPE_CONTINUATION, flags, open.stream_id);
        out.extend_from_slice(chunk);
    }
}

fn put_frame_head(out: &mut Vec<u8>, len: usize, frame_type: u8, flags: u8, stream_id: u32) {
    // `len` is at most MAX_EMITTED_FRAME, so it fits the 24-bit field.
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    out.push(frame_type);
    out.push(flags);
    out.extend_from_slice(&stream_id.to_be_bytes());
}

#[cfg(test)]
#[path = "../tests/h2wire/mod.rs"]
mod h2wire;

#[cfg(test)]
mod tests {
    use super::h2wire::{
        CONTINUATION, DATA, END_HEADERS, END_STREAM, Frame, HEADERS, Name, PADDED, PREFACE, PRIORITY, Rep,
        SETTINGS, WINDOW_UPDATE, encode, frame, frames, grpc_go_first_block, huffman, server_view,
        try_server_view,
    };
    use super::*;

    const SOCKET: &str = "/var/lib/kubelet/device-plugins/nvinject-gpu.sock";

    /// grpc-go's first request on a connection: ListAndWatch.
    fn first_request(authority: &str, huff: bool) -> Vec<u8> {
        grpc_go_first_block("/v1beta1.DevicePlugin/ListAndWatch", authority, huff)
    }

    fn list(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }

    fn expected_first(authority: &str) -> Vec<(String, String)> {
        list(&[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/v1beta1.DevicePlugin/ListAndWatch"),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("user-agent", "grpc-go/1.27.1"),
            ("te", "trailers"),
        ])
    }

    fn run(input: &[u8]) -> (Vec<u8>, AuthorityRewriter) {
        let mut r = AuthorityRewriter::new();
        let mut out = Vec::new();
        r.feed(input, &mut out);
        r.finish(&mut out);
        (out, r)
    }

    fn connection(parts: &[Vec<u8>]) -> Vec<u8> {
        let mut c = PREFACE.to_vec();
        for p in parts {
            c.extend_from_slice(p);
        }
        c
    }

    fn not_headers(fs: &[Frame]) -> Vec<Frame> {
        fs.iter().filter(|f| f.ty != HEADERS && f.ty != CONTINUATION).cloned().collect()
    }

    #[test]
    fn socket_path_authority_becomes_localhost_whatever_the_read_boundaries() {
        let input = connection(&[
            frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0x80, 0]),
            frame(WINDOW_UPDATE, 0, 0, &[0, 0x0f, 0, 1]),
            frame(HEADERS, END_HEADERS, 1, &first_request(SOCKET, false)),
            frame(DATA, END_STREAM, 1, &[0, 0, 0, 0, 0]),
        ]);
        let (whole, mut r) = run(&input);
        assert_eq!(server_view(&whole), vec![expected_first("localhost")]);
        assert_eq!(r.rewritten_blocks(), 1);
        assert_eq!(r.take_first_rewrite(), Some(Rewrite { stream_id: 1, authority: SOCKET.into() }));
        assert_eq!(r.take_first_rewrite(), None, "reported once");
        // Other frames pass byte for byte, in order, and the preface first.
        assert!(whole.starts_with(PREFACE));
        assert_eq!(not_headers(&frames(&whole)), not_headers(&frames(&input)));

        for chunk in [1, 2, 3, 5, 7, 9, 10, 23, 64] {
            let mut r = AuthorityRewriter::new();
            let mut out = Vec::new();
            for piece in input.chunks(chunk) {
                r.feed(piece, &mut out);
            }
            r.finish(&mut out);
            assert_eq!(out, whole, "fed {chunk} bytes at a time");
        }
    }

    #[test]
    fn padded_and_priority_headers_keep_priority_and_end_stream() {
        let block = first_request(SOCKET, false);
        let mut payload = vec![7]; // pad length
        payload.extend_from_slice(&[0x80, 0, 0, 3, 200]); // exclusive dependency on 3, weight 201
        payload.extend_from_slice(&block);
        payload.extend_from_slice(&[0; 7]);
        let input = connection(&[frame(HEADERS, END_HEADERS | END_STREAM | PADDED | PRIORITY, 5, &payload)]);
        let (out, _) = run(&input);
        let fs = frames(&out);
        assert_eq!(fs.len(), 1);
        assert_eq!(fs[0].ty, HEADERS);
        assert_eq!(fs[0].stream, 5);
        assert_eq!(fs[0].flags, END_HEADERS | END_STREAM | PRIORITY, "padding dropped, the rest kept");
        assert_eq!(fs[0].payload[..5], [0x80, 0, 0, 3, 200]);
        assert_eq!(server_view(&out), vec![expected_first("localhost")]);

        // Padding only, without priority.
        let mut payload = vec![3];
        payload.extend_from_slice(&block);
        payload.extend_from_slice(&[0; 3]);
        let (out, _) = run(&connection(&[frame(HEADERS, END_HEADERS | PADDED, 1, &payload)]));
        assert_eq!(frames(&out)[0].flags, END_HEADERS);
        assert_eq!(server_view(&out), vec![expected_first("localhost")]);
    }

    #[test]
    fn continuation_frames_are_joined_and_large_blocks_split() {
        let block = first_request(SOCKET, true);
        let (a, rest) = block.split_at(10);
        let (b, c) = rest.split_at(17); // cuts through the Huffman-coded authority
        let input = connection(&[
            frame(HEADERS, 0, 1, a),
            frame(CONTINUATION, 0, 1, b),
            frame(CONTINUATION, END_HEADERS, 1, c),
            frame(DATA, END_STREAM, 1, &[0, 0, 0, 0, 0]),
        ]);
        let (out, r) = run(&input);
        assert_eq!(r.rewritten_blocks(), 1);
        assert_eq!(server_view(&out), vec![expected_first("localhost")]);
        assert_eq!(frames(&out).iter().filter(|f| f.ty == CONTINUATION).count(), 0, "fits one frame");

        // A 40 000-byte value (Huffman-free) sent in 10 000-byte frames comes out in frames of
        // at most MAX_EMITTED_FRAME, HEADERS first, END_HEADERS on the last only.
        let big = "x".repeat(40_000);
        let block = encode(&[
            Rep::Indexed(3),
            Rep::Without(Name::Index(1), SOCKET, false),
            Rep::Without(Name::Literal("x-big"), &big, false),
        ]);
        let mut parts = Vec::new();
        let chunks: Vec<&[u8]> = block.chunks(10_000).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let ty = if i == 0 { HEADERS } else { CONTINUATION };
            let flags = if i + 1 == chunks.len() { END_HEADERS } else { 0 };
            parts.push(frame(ty, flags, 3, chunk));
        }
        let (out, _) = run(&connection(&parts));
        let fs = frames(&out);
        assert!(fs.len() >= 3, "{} frames", fs.len());
        assert_eq!(fs[0].ty, HEADERS);
        for (i, f) in fs.iter().enumerate() {
            assert!(f.payload.len() <= MAX_EMITTED_FRAME, "frame {i}: {} bytes", f.payload.len());
            assert_eq!(f.stream, 3);
            if i > 0 {
                assert_eq!(f.ty, CONTINUATION);
            }
            assert_eq!(f.flags & END_HEADERS != 0, i + 1 == fs.len());
        }
        assert_eq!(
            server_view(&out),
            vec![list(&[(":method", "POST"), (":authority", "localhost"), ("x-big", &big)])]
        );
    }

    #[test]
    fn a_later_request_referring_to_the_indexed_authority_is_rewritten_too() {
        // Request 1 adds (in order) :path, :authority, content-type, user-agent, te to the
        // dynamic table; request 2 refers to them by index (62 = newest), as grpc-go does.
        let second = encode(&[
            Rep::Indexed(3),
            Rep::Indexed(6),
            Rep::Incremental(Name::Index(4), "/v1beta1.DevicePlugin/Allocate", false),
            Rep::Indexed(66), // :authority, the socket path (now one further down)
            Rep::Indexed(65), // content-type
            Rep::Indexed(64), // user-agent
            Rep::Indexed(63), // te
        ]);
        let input = connection(&[
            frame(HEADERS, END_HEADERS, 1, &first_request(SOCKET, true)),
            frame(DATA, END_STREAM, 1, &[0, 0, 0, 0, 0]),
            frame(HEADERS, END_HEADERS, 3, &second),
            frame(DATA, END_STREAM, 3, &[0, 0, 0, 0, 0]),
        ]);
        let (out, r) = run(&input);
        assert_eq!(r.rewritten_blocks(), 2);
        let mut want2 = expected_first("localhost");
        want2[2].1 = "/v1beta1.DevicePlugin/Allocate".into();
        assert_eq!(server_view(&out), vec![expected_first("localhost"), want2]);
    }

    #[test]
    fn huffman_coded_authority_is_decoded() {
        // The test helper agrees with RFC 7541's examples (C.4.1, C.4.2, C.4.3, C.6.1).
        let hex = |s: &str| -> Vec<u8> {
            let s: String = s.split_whitespace().collect();
            (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
        };
        for (text, coded) in [
            ("www.example.com", "f1e3 c2e5 f23a 6ba0 ab90 f4ff"),
            ("no-cache", "a8eb 1064 9cbf"),
            ("custom-key", "25a8 49e9 5ba9 7d7f"),
            ("custom-value", "25a8 49e9 5bb8 e8b4 bf"),
            ("302", "6402"),
            ("private", "aec3 771a 4b"),
            ("Mon, 21 Oct 2013 20:13:21 GMT", "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff"),
            ("https://www.example.com", "9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3"),
        ] {
            assert_eq!(huffman(text.as_bytes()), hex(coded), "{text}");
        }
        let block = encode(&[Rep::Indexed(3), Rep::Without(Name::Index(1), SOCKET, true)]);
        assert!(block.len() < SOCKET.len(), "Huffman-coded: {} bytes", block.len());
        let (out, mut r) = run(&connection(&[frame(HEADERS, END_HEADERS, 1, &block)]));
        assert_eq!(server_view(&out), vec![list(&[(":method", "POST"), (":authority", "localhost")])]);
        assert_eq!(r.take_first_rewrite().unwrap().authority, SOCKET);
    }

    #[test]
    fn valid_authority_passes_untouched_until_a_rewrite_then_blocks_are_reencoded() {
        // RFC 7541 C.4.1: GET http://www.example.com/ with a Huffman-coded, indexed authority.
        let rfc_request = [
            0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4,
            0xff,
        ];
        let untouched = connection(&[
            frame(HEADERS, END_HEADERS | END_STREAM, 1, &rfc_request),
            frame(HEADERS, END_HEADERS | END_STREAM, 3, &first_request("localhost", true)),
        ]);
        let (out, r) = run(&untouched);
        assert_eq!(out, untouched, "valid authorities: every byte as received");
        assert_eq!(r.rewritten_blocks(), 0);

        // Then a refused authority, then a valid one again whose fields refer to entries h2 never
        // got (they came in the re-encoded block): that block must be re-encoded as well.
        let mut input = untouched.clone();
        input.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            5,
            &encode(&[
                Rep::Indexed(2),
                Rep::Incremental(Name::Index(1), SOCKET, false),
                Rep::Incremental(Name::Literal("x-trace"), "abc", false),
            ]),
        ));
        input.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            7,
            &encode(&[
                Rep::Indexed(2),
                Rep::Indexed(62), // x-trace: abc
                Rep::Without(Name::Index(1), "www.example.com", false),
            ]),
        ));
        let (out, r) = run(&input);
        assert!(out.starts_with(&untouched), "the blocks before the rewrite stay as they were");
        assert_eq!(r.rewritten_blocks(), 1);
        let view = server_view(&out);
        assert_eq!(view[0][3], (":authority".into(), "www.example.com".into()));
        assert_eq!(view[2], list(&[(":method", "GET"), (":authority", "localhost"), ("x-trace", "abc")]));
        assert_eq!(
            view[3],
            list(&[(":method", "GET"), ("x-trace", "abc"), (":authority", "www.example.com")])
        );
    }

    #[test]
    fn size_updates_and_never_indexed_fields_are_kept() {
        let block = encode(&[
            Rep::SizeUpdate(0),
            Rep::SizeUpdate(4096),
            Rep::Indexed(3),
            Rep::Incremental(Name::Index(1), SOCKET, false),
            Rep::Never(Name::Literal("authorization"), "secret", false),
        ]);
        let (out, _) = run(&connection(&[frame(HEADERS, END_HEADERS, 1, &block)]));
        let payload = &frames(&out)[0].payload;
        assert_eq!(payload[..3], [0x20, 0x3f, 0xe1], "size updates 0 and 4096 first, as sent");
        let never = [&[0x10, 13][..], b"authorization", &[6], b"secret"].concat();
        assert!(payload.windows(never.len()).any(|w| w == never), "still never indexed: {payload:x?}");
        assert_eq!(
            server_view(&out),
            vec![list(&[(":method", "POST"), (":authority", "localhost"), ("authorization", "secret")])]
        );
    }

    #[test]
    fn garbage_passes_through_untouched() {
        let bad_block = frame(HEADERS, END_HEADERS, 1, &first_request(SOCKET, false));
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("no preface", [b"GET / HTTP/1.1\r\n\r\n".to_vec(), bad_block.clone()].concat()),
            (
                "index beyond the tables",
                connection(&[frame(HEADERS, END_HEADERS, 1, &[0xff, 0x80, 0x01]), bad_block.clone()]),
            ),
            (
                "integer too long",
                connection(&[frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01])]),
            ),
            (
                "string past the end",
                connection(&[frame(HEADERS, END_HEADERS, 1, &[0x41, 0x0a, b'a']), bad_block.clone()]),
            ),
            (
                "bad Huffman padding",
                connection(&[frame(HEADERS, END_HEADERS, 1, &[0x41, 0x81, 0x00]), bad_block.clone()]),
            ),
            (
                "size update after a field",
                connection(&[
                    frame(HEADERS, END_HEADERS, 1, &encode(&[Rep::Indexed(3), Rep::SizeUpdate(0)])),
                    bad_block.clone(),
                ]),
            ),
            (
                "huge size update",
                connection(&[
                    frame(HEADERS, END_HEADERS, 1, &encode(&[Rep::SizeUpdate(1 << 20), Rep::Indexed(3)])),
                    bad_block.clone(),
                ]),
            ),
            (
                "CONTINUATION without HEADERS",
                connection(&[frame(CONTINUATION, END_HEADERS, 1, &[0x82]), bad_block.clone()]),
            ),
            (
                "another frame inside a block",
                connection(&[frame(HEADERS, 0, 1, &[0x83]), frame(DATA, 0, 1, b"x"), bad_block.clone()]),
            ),
            (
                "CONTINUATION of another stream",
                connection(&[frame(HEADERS, 0, 1, &[0x83]), frame(CONTINUATION, END_HEADERS, 3, &[0x82])]),
            ),
            (
                "padding longer than the frame",
                connection(&[frame(HEADERS, END_HEADERS | PADDED, 1, &[9, 0x82]), bad_block.clone()]),
            ),
            (
                "priority longer than the frame",
                connection(&[frame(HEADERS, END_HEADERS | PRIORITY, 1, &[0, 0]), bad_block.clone()]),
            ),
            (
                "truncated block",
                connection(&[
                    frame(HEADERS, 0, 1, &[0x83, 0x86]),
                    frame(CONTINUATION, 0, 1, &[0x84, 0x85])[..10].to_vec(),
                ]),
            ),
            ("truncated frame header", [connection(&[]), vec![0, 0, 4, 1]].concat()),
            (
                "oversized block",
                connection(&[
                    frame(HEADERS, 0, 1, &vec![0x82; 200_000]),
                    frame(CONTINUATION, 0, 1, &vec![0x82; 100_000]),
                ]),
            ),
        ];
        for (what, input) in cases {
            for chunk in [1, 4, input.len()] {
                let mut r = AuthorityRewriter::new();
                let mut out = Vec::new();
                for piece in input.chunks(chunk) {
                    r.feed(piece, &mut out);
                }
                r.finish(&mut out);
                assert!(out == input, "{what}: output differs from input (fed {chunk} bytes at a time)");
                assert_eq!(r.rewritten_blocks(), 0, "{what}");
            }
        }
    }

    #[test]
    fn random_frames_never_panic_and_pass_untouched_without_a_rewrite() {
        // xorshift: deterministic, so a failure reproduces.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let types = [DATA, HEADERS, CONTINUATION, SETTINGS, WINDOW_UPDATE, 0x2, 0xa];
        for _ in 0..2000 {
            let mut input = PREFACE.to_vec();
            for _ in 0..(next() % 6) {
                let ty = types[(next() % types.len() as u64) as usize];
                let flags = (next() & 0x2d) as u8;
                let len = (next() % 40) as usize;
                let payload: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                input.extend(frame(ty, flags, (next() % 4) as u32, &payload));
            }
            let cut = (next() as usize) % (input.len() + 1);
            input.truncate(cut.max(input.len() - 3));
            let mut r = AuthorityRewriter::new();
            let mut out = Vec::new();
            let mut rest = &input[..];
            while !rest.is_empty() {
                let n = 1 + (next() as usize) % rest.len();
                r.feed(&rest[..n], &mut out);
                rest = &rest[n..];
            }
            r.finish(&mut out);
            if r.rewritten_blocks() == 0 {
                assert!(out == input, "no rewrite, yet the bytes changed: {input:x?}");
            }
        }
    }

    /// Random valid request streams, checked against another decoder: what h2 would decode
    /// from the rewriter's output equals what it would decode from the input, with every refused
    /// authority replaced.
    #[test]
    fn random_header_blocks_mean_the_same_after_the_rewrite() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let names =
            [":path", ":authority", "content-type", "user-agent", "te", "grpc-timeout", "x-custom-key"];
        let values = [
            "/v1beta1.DevicePlugin/Allocate",
            SOCKET,
            "localhost",
            "application/grpc",
            "trailers",
            "9998m",
            "",
            "abc DEF_09",
        ];
        let (mut checked, mut rewritten) = (0, 0);
        for case in 0..400 {
            let mut input = PREFACE.to_vec();
            let mut inserted = 0usize;
            for block_no in 0..(1 + next(6)) {
                let mut reps = Vec::new();
                if next(8) == 0 {
                    reps.push(Rep::SizeUpdate([0, 256, 4096][next(3)]));
                    inserted = 0; // possibly evicted: later references may be invalid (then skipped)
                }
                if block_no == 0 && case % 2 == 0 {
                    reps.push(Rep::Incremental(Name::Index(1), SOCKET, next(2) == 0));
                    inserted += 1;
                }
                for _ in 0..(1 + next(7)) {
                    let huff = next(2) == 0;
                    let name = if next(3) == 0 {
                        Name::Literal(names[next(names.len())])
                    } else {
                        Name::Index(1 + next(61))
                    };
                    let value = values[next(values.len())];
                    reps.push(match next(5) {
                        0 => Rep::Indexed(1 + next(61 + inserted)),
                        1 => Rep::Without(name, value, huff),
                        2 => Rep::Never(name, value, huff),
                        _ => {
                            inserted += 1;
                            Rep::Incremental(name, value, huff)
                        }
                    });
                }
                let block = encode(&reps);
                let stream = 2 * block_no as u32 + 1;
                // Split across HEADERS and CONTINUATION at a random point.
                let cut = next(block.len() + 1);
                if cut == 0 || cut == block.len() {
                    input.extend(frame(HEADERS, END_HEADERS | END_STREAM, stream, &block));
                } else {
                    input.extend(frame(HEADERS, END_STREAM, stream, &block[..cut]));
                    input.extend(frame(CONTINUATION, END_HEADERS, stream, &block[cut..]));
                }
            }
            // Skip streams that refer past the table (the generator does not track evictions).
            let Some(want) = try_server_view(&input) else { continue };
            let want: Vec<Vec<(String, String)>> = want
                .into_iter()
                .map(|list| {
                    list.into_iter()
                        .map(|(n, v)| {
                            let refused = n == ":authority" && !authority_is_acceptable(v.as_bytes());
                            (n, if refused { "localhost".to_owned() } else { v })
                        })
                        .collect()
                })
                .collect();
            let mut r = AuthorityRewriter::new();
            let mut out = Vec::new();
            for piece in input.chunks(1 + next(40)) {
                r.feed(piece, &mut out);
            }
            r.finish(&mut out);
            assert_eq!(server_view(&out), want, "case {case}");
            if r.rewritten_blocks() == 0 {
                assert!(out == input, "case {case}: nothing refused, so nothing may change");
            } else {
                rewritten += 1;
            }
            checked += 1;
        }
        assert!(checked > 200 && rewritten > 100, "{checked} streams checked, {rewritten} rewritten");
    }

    #[test]
    fn finish_gives_back_what_was_held() {
        let input = connection(&[frame(HEADERS, 0, 1, &[0x82, 0x86])]);
        let mut r = AuthorityRewriter::new();
        let mut out = Vec::new();
        r.feed(&input, &mut out);
        assert_eq!(out, PREFACE, "the incomplete block is held");
        r.finish(&mut out);
        assert_eq!(out, input);
    }

    #[test]
    fn authorities_h2_refuses() {
        for ok in ["localhost", "localhost:8080", "127.0.0.1:10250", "[::1]:80", "unix"] {
            assert!(authority_is_acceptable(ok.as_bytes()), "{ok}");
        }
        for refused in [SOCKET, "", "a b", "unix:///run/x.sock", "host/path", "\u{e9}"] {
            assert!(!authority_is_acceptable(refused.as_bytes()), "{refused:?}");
        }
    }
}
