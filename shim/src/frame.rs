//! ttrpc framing: a 10-byte header (payload length, stream id, type, flags; big endian) followed by
//! the payload. The proxy moves whole frames without looking inside, except request frames it must
//! classify, so framing is all it needs to understand about the wire.

use std::io::{self, Read, Write};

use ttrpc::proto::{MESSAGE_HEADER_LENGTH, MESSAGE_TYPE_REQUEST, MESSAGE_TYPE_RESPONSE, MessageHeader};

/// Frames larger than this are refused. ttrpc's own limit is 4 MiB; containerd can raise it, so the
/// proxy allows more, but a length beyond this means the peer is not speaking ttrpc.
pub const MAX_FRAME_PAYLOAD: u32 = 64 << 20;

/// One ttrpc frame as it crossed the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The decoded header; `header.length` always equals `payload.len()`.
    pub header: MessageHeader,
    /// The payload bytes, untouched.
    pub payload: Vec<u8>,
}

impl Frame {
    /// A response frame for `stream_id` carrying an encoded `ttrpc.Response`.
    pub fn response(stream_id: u32, payload: Vec<u8>) -> Frame {
        let length = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        Frame { header: MessageHeader::new_response(stream_id, length), payload }
    }

    /// Whether this frame opens an RPC (carries a `ttrpc.Request`).
    pub fn is_request(&self) -> bool {
        self.header.type_ == MESSAGE_TYPE_REQUEST
    }

    /// Whether this frame answers an RPC.
    pub fn is_response(&self) -> bool {
        self.header.type_ == MESSAGE_TYPE_RESPONSE
    }
}

/// Reads one frame. `Ok(None)` means the peer closed the connection cleanly between frames.
pub fn read_frame(reader: &mut impl Read) -> io::Result<Option<Frame>> {
    let mut head = [0u8; MESSAGE_HEADER_LENGTH];
    let mut filled = 0;
    while filled < head.len() {
        match reader.read(&mut head[filled..]) {
            Ok(0) if filled == 0 => return Ok(None),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed inside a frame header",
                ));
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let header = MessageHeader::from(head);
    if header.length > MAX_FRAME_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("ttrpc frame of {} bytes exceeds the {MAX_FRAME_PAYLOAD} byte limit", header.length),
        ));
    }
    let mut payload = vec![0u8; header.length as usize];
    reader.read_exact(&mut payload)?;
    Ok(Some(Frame { header, payload }))
}

/// Writes one frame with a single `write_all`, so frames from several writers sharing a locked
/// stream never interleave.
pub fn write_frame(writer: &mut impl Write, frame: &Frame) -> io::Result<()> {
    let mut buf: Vec<u8> = Vec::with_capacity(MESSAGE_HEADER_LENGTH + frame.payload.len());
    buf.extend_from_slice(&Vec::from(frame.header));
    buf.extend_from_slice(&frame.payload);
    writer.write_all(&buf)?;
    writer.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ttrpc::proto::MESSAGE_TYPE_DATA;

    #[test]
    fn frames_round_trip_byte_for_byte() {
        let frames = vec![
            Frame { header: MessageHeader::new_request(1, 3), payload: vec![1, 2, 3] },
            Frame {
                header: MessageHeader { length: 0, stream_id: 3, type_: MESSAGE_TYPE_DATA, flags: 5 },
                payload: vec![],
            },
            Frame::response(7, b"hello".to_vec()),
        ];
        let mut wire = Vec::new();
        for f in &frames {
            write_frame(&mut wire, f).unwrap();
        }
        // Header layout is what Go's ttrpc writes: length, stream id (big endian), type, flags.
        assert_eq!(&wire[..10], &[0, 0, 0, 3, 0, 0, 0, 1, 1, 0]);
        let mut reader = &wire[..];
        let mut back = Vec::new();
        while let Some(f) = read_frame(&mut reader).unwrap() {
            back.push(f);
        }
        assert_eq!(back, frames);
    }

    #[test]
    fn truncated_frames_are_errors_not_clean_ends() {
        let mut wire = Vec::new();
        write_frame(&mut wire, &Frame::response(1, vec![9; 8])).unwrap();
        let mut short = &wire[..wire.len() - 1];
        assert_eq!(read_frame(&mut short).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        let mut half_header = &wire[..4];
        assert_eq!(read_frame(&mut half_header).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn absurd_lengths_are_refused_before_allocating() {
        let wire = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 1, 0];
        let err = read_frame(&mut &wire[..]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
