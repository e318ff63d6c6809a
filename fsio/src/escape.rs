//! Text someone else wrote (an annotation key, a requested device name, a file name in an image),
//! made safe to put in a log line or an error message: control characters (and the Unicode
//! controls that reorder text) are written as escapes, so input cannot move a terminal's cursor,
//! colour containerd's log or forge a line break; input longer than a limit is cut, with a marker
//! giving its original length, so a 70 KB annotation key costs one short line.
//!
//! It lives here because every binary that echoes such input (the shim, the hook) already links
//! this crate; it does no I/O.

use std::fmt::{self, Write as _};

/// The limit [`escape`] applies: ample for any real name or path fragment, short enough that a
/// hostile one does not swamp the log.
pub const FIELD_LIMIT: usize = 256;

/// `text`, escaped and cut at [`FIELD_LIMIT`] bytes when shown (see the module docs).
pub fn escape(text: &str) -> Escaped<'_> {
    escape_within(text, FIELD_LIMIT)
}

/// `text`, escaped and cut at `limit` bytes of the original (at a character boundary) when shown.
pub fn escape_within(text: &str, limit: usize) -> Escaped<'_> {
    Escaped { text, limit }
}

/// What [`escape`] returns: formats as the escaped, possibly truncated, text.
#[derive(Debug, Clone, Copy)]
pub struct Escaped<'a> {
    text: &'a str,
    limit: usize,
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut cut = self.text.len().min(self.limit);
        while !self.text.is_char_boundary(cut) {
            cut -= 1;
        }
        for c in self.text[..cut].chars() {
            if needs_escape(c) {
                // `\n`, `\t`, `\r`, `\0`, else `\u{1b}`: Rust's own spelling, unambiguous to a reader.
                write!(f, "{}", c.escape_debug())?;
            } else {
                f.write_char(c)?;
            }
        }
        if cut < self.text.len() {
            write!(f, "...[truncated: {} bytes in all]", self.text.len())?;
        }
        Ok(())
    }
}

/// Control characters (C0, DEL, C1) and the bidirectional controls, which reorder what a reader
/// sees (U+061C, U+200E/F, U+202A-E, U+2066-9).
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(escape("nvidia.com/gpu=0").to_string(), "nvidia.com/gpu=0");
        assert_eq!(escape("a\nb\x1b[31mred\x07\t\r\0").to_string(), "a\\nb\\u{1b}[31mred\\u{7}\\t\\r\\0");
        assert_eq!(escape("\u{202e}gpj.exe\u{9b}").to_string(), "\\u{202e}gpj.exe\\u{9b}");
        assert_eq!(escape("été ✓ /lib/x86_64").to_string(), "été ✓ /lib/x86_64");
        let out = escape("x\x1by").to_string();
        assert!(!out.contains('\x1b'), "{out:?}");
    }

    #[test]
    fn long_input_is_cut_with_its_length() {
        let key = format!("cdi.k8s.io/{}", "k".repeat(70_000));
        let out = escape(&key).to_string();
        assert!(out.starts_with("cdi.k8s.io/kkk"), "{out}");
        assert!(out.ends_with("...[truncated: 70011 bytes in all]"), "{out}");
        assert!(out.len() < FIELD_LIMIT + 40, "{}", out.len());
        // Exactly at the limit: nothing cut.
        assert_eq!(escape_within("abcd", 4).to_string(), "abcd");
        assert_eq!(escape_within("abcde", 4).to_string(), "abcd...[truncated: 5 bytes in all]");
    }

    #[test]
    fn the_cut_falls_on_a_character_boundary_and_escapes_still_apply() {
        // 'é' is two bytes: a limit of 2 would split it.
        assert_eq!(escape_within("aé\n", 2).to_string(), "a...[truncated: 4 bytes in all]");
        assert_eq!(escape_within("\n\n\n", 2).to_string(), "\\n\\n...[truncated: 3 bytes in all]");
    }
}
