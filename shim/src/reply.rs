//! The inner shim's answer to `start`, in whichever of containerd's three forms it came, with the
//! address swapped for the proxy's and everything else kept.
//!
//! - containerd 1.x: a plain address on stdout (`unix:///run/containerd/s/<hash>`), task API v2.
//! - containerd 2.0 to 2.2: JSON `{"version":3,"address":"...","protocol":"ttrpc"}`.
//! - containerd 2.3 and later, when it sent `BootstrapParams` on stdin: a binary protobuf
//!   `containerd.runtime.bootstrap.v1.BootstrapResult`.
//!
//! Answering in the inner shim's own form keeps the protocol version negotiation between containerd
//! and runc exactly as it would be without the proxy.

use containerd_shim_protos::bootstrap_api::BootstrapResult;
use protobuf::Message;

/// The inner shim's `start` answer.
#[derive(Debug, Clone, PartialEq)]
pub enum StartReply {
    /// A bare address, with the text around it kept as it was (containerd trims it).
    Plain {
        /// Bytes before the address (normally none).
        leading: String,
        /// The address.
        address: String,
        /// Bytes after the address (normally a newline or nothing).
        trailing: String,
    },
    /// The JSON object of containerd 2.0 to 2.2, key order kept.
    Json(serde_json::Map<String, serde_json::Value>),
    /// The protobuf answer of the bootstrap protocol.
    Bootstrap(Box<BootstrapResult>),
}

/// The inner shim answered something that is none of the known forms.
#[derive(Debug, thiserror::Error)]
#[error("the runc shim's start answer is not an address, JSON or a BootstrapResult: {preview:?}")]
pub struct ReplyError {
    /// The first bytes of the answer, lossily decoded, for the error message.
    pub preview: String,
}

impl StartReply {
    /// Recognises the answer's form.
    pub fn parse(bytes: &[u8]) -> Result<StartReply, ReplyError> {
        let error =
            || ReplyError { preview: String::from_utf8_lossy(&bytes[..bytes.len().min(120)]).into_owned() };
        if let Ok(text) = std::str::from_utf8(bytes) {
            let trimmed = text.trim();
            if trimmed.starts_with('{') {
                return match serde_json::from_str::<serde_json::Value>(trimmed) {
                    Ok(serde_json::Value::Object(map))
                        if map.get("address").is_some_and(|a| a.is_string()) =>
                    {
                        Ok(StartReply::Json(map))
                    }
                    _ => Err(error()),
                };
            }
            // Addresses start with a letter (a URL scheme), '/' or '@'; a protobuf answer starts
            // with a field tag byte, which is a control character for the first fields.
            if trimmed.starts_with(|c: char| c.is_ascii_alphabetic() || c == '/' || c == '@') {
                let start = text.len() - text.trim_start().len();
                let end = start + trimmed.len();
                return Ok(StartReply::Plain {
                    leading: text[..start].to_owned(),
                    address: trimmed.to_owned(),
                    trailing: text[end..].to_owned(),
                });
            }
        }
        match BootstrapResult::parse_from_bytes(bytes) {
            Ok(result) if !result.address.is_empty() => Ok(StartReply::Bootstrap(Box::new(result))),
            _ => Err(error()),
        }
    }

    /// The address the answer announces.
    pub fn address(&self) -> &str {
        match self {
            StartReply::Plain { address, .. } => address,
            StartReply::Json(map) => map.get("address").and_then(|a| a.as_str()).unwrap_or_default(),
            StartReply::Bootstrap(result) => &result.address,
        }
    }

    /// The same answer announcing `address` instead.
    pub fn with_address(mut self, new: &str) -> StartReply {
        match &mut self {
            StartReply::Plain { address, .. } => *address = new.to_owned(),
            StartReply::Json(map) => {
                map.insert("address".to_owned(), serde_json::Value::String(new.to_owned()));
            }
            StartReply::Bootstrap(result) => result.address = new.to_owned(),
        }
        self
    }

    /// The bytes to print on stdout.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            StartReply::Plain { leading, address, trailing } => {
                format!("{leading}{address}{trailing}").into_bytes()
            }
            StartReply::Json(map) => serde_json::to_vec(map).unwrap_or_default(),
            StartReply::Bootstrap(result) => result.write_to_bytes().unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INNER: &str = "unix:///run/containerd/s/abc";
    const OURS: &str = "unix:///run/containerd/s/abc.nvinject";

    #[test]
    fn plain_addresses_keep_their_surroundings() {
        let reply = StartReply::parse(format!("{INNER}\n").as_bytes()).unwrap();
        assert_eq!(reply.address(), INNER);
        assert_eq!(reply.with_address(OURS).encode(), format!("{OURS}\n").into_bytes());
        let bare = StartReply::parse(INNER.as_bytes()).unwrap();
        assert_eq!(bare.with_address(OURS).encode(), OURS.as_bytes());
    }

    #[test]
    fn json_answers_keep_version_protocol_and_key_order() {
        let text = format!(r#"{{"version":3,"address":"{INNER}","protocol":"ttrpc"}}"#);
        let reply = StartReply::parse(text.as_bytes()).unwrap();
        assert_eq!(reply.address(), INNER);
        let out = String::from_utf8(reply.with_address(OURS).encode()).unwrap();
        assert_eq!(out, format!(r#"{{"version":3,"address":"{OURS}","protocol":"ttrpc"}}"#));
    }

    #[test]
    fn bootstrap_results_keep_every_other_field() {
        let mut inner = BootstrapResult {
            version: 3,
            address: INNER.into(),
            protocol: "ttrpc".into(),
            ..Default::default()
        };
        inner.metadata.insert("k".into(), "v".into());
        let reply = StartReply::parse(&inner.write_to_bytes().unwrap()).unwrap();
        assert!(matches!(reply, StartReply::Bootstrap(_)));
        assert_eq!(reply.address(), INNER);
        let back = BootstrapResult::parse_from_bytes(&reply.with_address(OURS).encode()).unwrap();
        let mut expected = inner.clone();
        expected.address = OURS.into();
        assert_eq!(back, expected);
    }

    #[test]
    fn garbage_is_refused_with_a_preview() {
        for bad in [&b""[..], b"{\"version\":3}", b"\x08\x03", b"   "] {
            let err = StartReply::parse(bad).unwrap_err();
            assert!(err.to_string().contains("not an address"), "{err}");
        }
    }
}
