//! HPACK decoding pieces (RFC 7541) for [`crate::AuthorityRewriter`]: integers, string literals, the
//! Huffman code, the static table and a connection's dynamic table.
//!
//! Written here rather than taken from an HPACK crate because the rewriter follows every request
//! of every connection and must cost next to nothing: the decoders checked (loona-hpack,
//! fluke-hpack, hpack, httlib-hpack) either panic on some malformed input or build their Huffman
//! tables per string (loona-hpack: 17 us per Huffman-coded `:path`, which added 40 us to every
//! Allocate from a tonic client, measured), and none lets a caller leave a value undecoded and
//! re-send its encoded bytes, which is what makes following a request nearly free. Pure; every
//! malformed input is an error, never a panic.

use std::collections::VecDeque;

/// The input is not valid HPACK (or beyond the limits this decoder follows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Malformed;

/// The static table (RFC 7541 Appendix A), index 1 first.
pub(crate) const STATIC_TABLE: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// A dynamic table entry: name and value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// A connection's dynamic table as the decoder keeps it (RFC 7541 section 2.3.2): newest entry
/// first, sizes counted as name + value + 32 octets.
#[derive(Debug)]
pub(crate) struct DynamicTable {
    entries: VecDeque<Entry>,
    size: usize,
    max_size: usize,
}

impl DynamicTable {
    /// An empty table of HTTP/2's initial size, 4096 octets.
    pub(crate) fn new() -> Self {
        DynamicTable { entries: VecDeque::new(), size: 0, max_size: 4096 }
    }

    /// The entry at `index` of the combined address space (1-based: the static table, then the
    /// dynamic one newest first).
    pub(crate) fn get(&self, index: usize) -> Option<(&[u8], &[u8])> {
        match index {
            0 => None,
            1..=61 => Some(STATIC_TABLE[index - 1]),
            _ => self.entries.get(index - 62).map(|(n, v)| (&n[..], &v[..])),
        }
    }

    /// Adds an entry, evicting the oldest ones to stay within the maximum size; an entry larger
    /// than the maximum empties the table and is not added.
    pub(crate) fn insert(&mut self, name: &[u8], value: &[u8]) {
        let size = name.len() + value.len() + 32;
        self.evict_to(self.max_size.saturating_sub(size));
        if size <= self.max_size {
            self.entries.push_front((name.into(), value.into()));
            self.size += size;
        }
    }

    /// Applies a dynamic table size update.
    pub(crate) fn set_max_size(&mut self, max_size: usize) {
        self.max_size = max_size;
        self.evict_to(max_size);
    }

    fn evict_to(&mut self, limit: usize) {
        while self.size > limit {
            let Some((n, v)) = self.entries.pop_back() else { break };
            self.size -= n.len() + v.len() + 32;
        }
    }
}

/// Reads an integer with a `prefix`-bit prefix (RFC 7541 section 5.1): the value and the bytes
/// used. At most four continuation bytes (values below 2^28), as decoders commonly allow.
pub(crate) fn read_int(buf: &[u8], prefix: u8) -> Result<(usize, usize), Malformed> {
    let mask = ((1u16 << prefix) - 1) as u8;
    let first = buf.first().ok_or(Malformed)? & mask;
    if first < mask {
        return Ok((usize::from(first), 1));
    }
    let mut value = usize::from(mask);
    for (i, &b) in buf.iter().skip(1).take(4).enumerate() {
        value += usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok((value, i + 2));
        }
    }
    Err(Malformed)
}

/// Appends an integer with a `prefix`-bit prefix; `flags` fills the bits above it.
pub(crate) fn put_int(out: &mut Vec<u8>, value: usize, prefix: u8, flags: u8) {
    let mask = ((1u16 << prefix) - 1) as usize;
    if value < mask {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        out.push((rest & 0x7f) as u8 | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// A string literal as it appears in a block (RFC 7541 section 5.2).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StringLiteral<'a> {
    /// Huffman-coded.
    pub huffman: bool,
    /// The octets after the length prefix.
    pub data: &'a [u8],
    /// Length of the whole literal, prefix included.
    pub encoded_len: usize,
}

impl StringLiteral<'_> {
    /// Appends the decoded octets.
    pub(crate) fn decode_into(&self, out: &mut Vec<u8>) -> Result<(), Malformed> {
        if self.huffman {
            return huffman_decode(self.data, out);
        }
        out.extend_from_slice(self.data);
        Ok(())
    }
}

/// Reads the string literal at the start of `buf`.
pub(crate) fn read_string(buf: &[u8]) -> Result<StringLiteral<'_>, Malformed> {
    let huffman = buf.first().ok_or(Malformed)? & 0x80 != 0;
    let (len, n) = read_int(buf, 7)?;
    let data = buf.get(n..n + len).ok_or(Malformed)?;
    Ok(StringLiteral { huffman, data, encoded_len: n + len })
}

/// Appends a string literal as plain octets.
pub(crate) fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    put_int(out, s.len(), 7, 0);
    out.extend_from_slice(s);
}

/// Code length in bits of each symbol of the HPACK Huffman code (RFC 7541 Appendix B; 256 is
/// EOS). The code is canonical: codes are assigned in order of length, then symbol, so the
/// lengths determine it.
const HUFFMAN_CODE_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, // 0..
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28, // 16..
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, // 32..
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, // 48..
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, // 64..
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, // 80..
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, // 96..
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, // 112..
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, // 128..
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, // 144..
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, // 160..
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, // 176..
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, // 192..
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, // 208..
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, // 224..
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, // 240..
    30, // EOS
];

const EOS: u16 = 256;
const MAX_CODE_LEN: usize = 30;

/// The canonical code in decoding form: per length, the first code, how many codes, and where
/// their symbols start in `symbols` (sorted by length, then symbol).
struct Canonical {
    first: [u32; MAX_CODE_LEN + 1],
    count: [u32; MAX_CODE_LEN + 1],
    offset: [usize; MAX_CODE_LEN + 1],
    symbols: [u16; 257],
}

/// Built at compile time from the code lengths.
const CANONICAL: Canonical = {
    let mut count = [0u32; MAX_CODE_LEN + 1];
    let mut s = 0;
    while s < 257 {
        count[HUFFMAN_CODE_LENGTHS[s] as usize] += 1;
        s += 1;
    }
    let mut first = [0u32; MAX_CODE_LEN + 1];
    let mut offset = [0usize; MAX_CODE_LEN + 1];
    let (mut code, mut at, mut len) = (0u32, 0usize, 1);
    while len <= MAX_CODE_LEN {
        code = (code + count[len - 1]) << 1;
        first[len] = code;
        offset[len] = at;
        at += count[len] as usize;
        len += 1;
    }
    let mut next = offset;
    let mut symbols = [0u16; 257];
    let mut s = 0;
    while s < 257 {
        let len = HUFFMAN_CODE_LENGTHS[s] as usize;
        symbols[next[len]] = s as u16;
        next[len] += 1;
        s += 1;
    }
    Canonical { first, count, offset, symbols }
};

/// Decodes a Huffman-coded string (RFC 7541 section 5.2), appending to `out`. EOS in the data,
/// padding longer than 7 bits, or padding other than ones are errors, as the RFC requires.
pub(crate) fn huffman_decode(src: &[u8], out: &mut Vec<u8>) -> Result<(), Malformed> {
    let c = &CANONICAL;
    let (mut code, mut len) = (0u32, 0usize);
    for &byte in src {
        for shift in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> shift) & 1);
            len += 1;
            let first = c.first[len];
            if code >= first && code - first < c.count[len] {
                let symbol = c.symbols[c.offset[len] + (code - first) as usize];
                if symbol == EOS {
                    return Err(Malformed);
                }
                out.push(symbol as u8);
                (code, len) = (0, 0);
            } else if len == MAX_CODE_LEN {
                return Err(Malformed);
            }
        }
    }
    if len > 7 || code != (1 << len) - 1 {
        return Err(Malformed);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The code of `symbol` rebuilt from the canonical form.
    fn code_of(symbol: usize) -> (u32, usize) {
        let c = &CANONICAL;
        let len = usize::from(HUFFMAN_CODE_LENGTHS[symbol]);
        let rank = c.symbols[c.offset[len]..c.offset[len] + c.count[len] as usize]
            .iter()
            .position(|&s| usize::from(s) == symbol)
            .unwrap();
        (c.first[len] + rank as u32, len)
    }

    fn encode(s: &[u8]) -> Vec<u8> {
        let (mut acc, mut bits, mut out) = (0u64, 0usize, Vec::new());
        for &b in s {
            let (code, len) = code_of(usize::from(b));
            acc = (acc << len) | u64::from(code);
            bits += len;
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

    fn decode(src: &[u8]) -> Result<Vec<u8>, Malformed> {
        let mut out = Vec::new();
        huffman_decode(src, &mut out).map(|()| out)
    }

    #[test]
    fn canonical_code_matches_rfc_codes() {
        // A few codes as RFC 7541 Appendix B prints them.
        assert_eq!(code_of(usize::from(b'0')), (0x0, 5));
        assert_eq!(code_of(usize::from(b' ')), (0x14, 6));
        assert_eq!(code_of(usize::from(b'a')), (0x3, 5));
        assert_eq!(code_of(usize::from(b'/')), (0x18, 6));
        assert_eq!(code_of(0), (0x1ff8, 13));
        assert_eq!(code_of(255), (0x3ffffee, 26));
        assert_eq!(code_of(256), (0x3fffffff, 30));
    }

    #[test]
    fn every_octet_round_trips_and_another_decoder_agrees() {
        let all: Vec<u8> = (0..=255).collect();
        let coded = encode(&all);
        assert_eq!(decode(&coded).unwrap(), all);
        // loona-hpack's decoder, with its own copy of the code table, reads the same octets.
        let mut block = vec![0x00, 0x01, b'x'];
        put_int(&mut block, coded.len(), 7, 0x80);
        block.extend_from_slice(&coded);
        let list = loona_hpack::Decoder::new().decode(&block).unwrap();
        assert_eq!(list[0].1, all);
        for b in 0..=255u8 {
            assert_eq!(decode(&encode(&[b])).unwrap(), [b], "octet {b}");
        }
    }

    #[test]
    fn rfc_huffman_examples_decode() {
        let hex = |s: &str| -> Vec<u8> {
            let s: String = s.split_whitespace().collect();
            (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
        };
        for (coded, text) in [
            ("f1e3 c2e5 f23a 6ba0 ab90 f4ff", "www.example.com"),
            ("a8eb 1064 9cbf", "no-cache"),
            ("25a8 49e9 5bb8 e8b4 bf", "custom-value"),
            ("d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff", "Mon, 21 Oct 2013 20:13:21 GMT"),
            ("9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3", "https://www.example.com"),
        ] {
            assert_eq!(decode(&hex(coded)).unwrap(), text.as_bytes(), "{text}");
        }
    }

    #[test]
    fn bad_huffman_is_refused() {
        let eos_then_padding = [0xff, 0xff, 0xff, 0xff]; // EOS (30 ones) in the data
        assert_eq!(decode(&eos_then_padding), Err(Malformed));
        assert_eq!(decode(&[0x00]), Err(Malformed), "'0' then padding of zeros");
        assert_eq!(decode(&[0xff]), Err(Malformed), "8 bits of padding");
        assert_eq!(decode(&[0x07]), Ok(b"0".to_vec()), "'0' (00000) then 3 bits of ones");
        assert_eq!(decode(&[0x1f]), Ok(b"a".to_vec()), "'a' (00011) then 3 bits of ones");
        assert_eq!(decode(&[]), Ok(Vec::new()));
    }

    #[test]
    fn static_table_matches_another_decoder() {
        let mut d = loona_hpack::Decoder::new();
        for i in 1..=61u8 {
            let list = d.decode(&[0x80 | i]).unwrap();
            let (n, v) = STATIC_TABLE[usize::from(i) - 1];
            assert_eq!((list[0].0.as_slice(), list[0].1.as_slice()), (n, v), "index {i}");
        }
    }

    #[test]
    fn dynamic_table_indexes_newest_first_and_evicts_oldest() {
        let mut t = DynamicTable::new();
        t.set_max_size(100);
        t.insert(b"a", b"1"); // 34
        t.insert(b"b", b"2"); // 34
        assert_eq!(t.get(62), Some((&b"b"[..], &b"2"[..])));
        assert_eq!(t.get(63), Some((&b"a"[..], &b"1"[..])));
        t.insert(b"c", b"3"); // 102 > 100: "a" goes
        assert_eq!(t.get(63), Some((&b"b"[..], &b"2"[..])));
        assert_eq!(t.get(64), None);
        t.insert(b"big", &[b'x'; 80]); // larger than the table: empties it
        assert_eq!(t.get(62), None);
        t.insert(b"d", b"4");
        t.set_max_size(0);
        assert_eq!(t.get(62), None);
        assert_eq!(t.get(0), None);
        assert_eq!(t.get(2), Some((&b":method"[..], &b"GET"[..])));
    }

    #[test]
    fn integers_round_trip_and_overlong_ones_are_refused() {
        for prefix in 1..=8u8 {
            for v in [0, 1, 30, 31, 127, 128, 255, 1337, (1 << 21) - 1, 1 << 27] {
                let mut b = Vec::new();
                put_int(&mut b, v, prefix, 0);
                assert_eq!(read_int(&b, prefix), Ok((v, b.len())), "{v} with {prefix}-bit prefix");
            }
        }
        // RFC 7541 C.1.2: 1337 with a 5-bit prefix.
        assert_eq!(read_int(&[0x1f, 0x9a, 0x0a], 5), Ok((1337, 3)));
        assert_eq!(read_int(&[0x1f, 0x80, 0x80, 0x80, 0x80, 0x01], 5), Err(Malformed));
        assert_eq!(read_int(&[0x1f, 0x80], 5), Err(Malformed));
        assert_eq!(read_int(&[], 5), Err(Malformed));
        assert!(read_string(&[0x05, b'a']).is_err());
    }
}
