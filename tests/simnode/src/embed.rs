//! A node description carried inside the simulated `libnvidia-ml.so` file itself.
//!
//! Why: inside a container the library is bind-mounted on its own, without the node file or the
//! environment variable that name the node on the host. `nvinject-simnode build` appends the
//! description to the driver root's copy of the library, after the ELF image (the loader and
//! `ldconfig` ignore trailing bytes), so that copy knows its node wherever it is mounted.
//!
//! Layout: `<ELF bytes> <JSON bytes> <JSON length: u64 little endian> <MAGIC>`.

/// Marks a library that carries a description.
pub const MAGIC: &[u8; 8] = b"NVSIMND1";

/// Returns `library` with `json` appended in the trailer layout (replacing any earlier trailer).
pub fn append(library: &[u8], json: &[u8]) -> Vec<u8> {
    let elf = match split(library) {
        Some((elf, _)) => elf,
        None => library,
    };
    let mut out = Vec::with_capacity(elf.len() + json.len() + 16);
    out.extend_from_slice(elf);
    out.extend_from_slice(json);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(MAGIC);
    out
}

/// Splits a file into its ELF image and the embedded JSON, if it has a trailer.
pub fn split(file: &[u8]) -> Option<(&[u8], &[u8])> {
    let n = file.len();
    if n < 16 || &file[n - 8..] != MAGIC {
        return None;
    }
    let len = u64::from_le_bytes(file[n - 16..n - 8].try_into().ok()?) as usize;
    let json_start = (n - 16).checked_sub(len)?;
    Some((&file[..json_start], &file[json_start..n - 16]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_replace() {
        let lib = b"\x7fELF...image".to_vec();
        let once = append(&lib, b"{\"a\":1}");
        assert_eq!(split(&once), Some((&lib[..], &b"{\"a\":1}"[..])));
        let twice = append(&once, b"{}");
        assert_eq!(split(&twice), Some((&lib[..], &b"{}"[..])));
        assert_eq!(split(&lib), None);
    }
}
