//! Atomic file replacement: readers (runc reading config.json, containerd reading `address`) see the
//! old bytes or the new ones, never a mix, and a crash leaves at most a stray temp file that the
//! next write in the same directory does not trip over.
//!
//! No fsync: the files written here live in containerd's bundle directories, which do not outlive
//! a reboot (containerd's state dir is on tmpfs on a normal host), and the rename alone gives
//! readers atomicity. An fsync would add a disk flush to every container start for nothing.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` through a temp file in the same directory, then renames it over `path`.
pub fn write_file(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let temp = temp_path(path)?;
    let result = (|| {
        let mut file = OpenOptions::new().write(true).create_new(true).mode(mode).open(&temp)?;
        file.write_all(bytes)?;
        // The mode given at creation is reduced by the umask; keep exactly the mode asked for.
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

fn temp_path(path: &Path) -> io::Result<PathBuf> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{} has no file name", path.display()))
    })?;
    let mut temp = std::ffi::OsString::from(".");
    temp.push(name);
    temp.push(format!(".nvinject-{}.tmp", std::process::id()));
    Ok(path.with_file_name(temp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temp_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        fs::write(&path, b"old").unwrap();
        write_file(&path, b"new", 0o640).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o640);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        fs::write(&path, b"old").unwrap();
        // A directory where the temp file would go makes create_new fail.
        fs::create_dir(temp_path(&path).unwrap()).unwrap();
        assert!(write_file(&path, b"new", 0o600).is_err());
        assert_eq!(fs::read(&path).unwrap(), b"old");
    }
}
