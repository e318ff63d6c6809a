//! How the loaded driver's version is read: what a spec's `nvinject.io/driver-version` annotation is
//! compared with to tell a stale spec. Two small files under the given roots; nothing here loads
//! NVML or walks the driver's files, so the per-pod shim proxy can use it.

use std::fs;
use std::path::{Path, PathBuf};

/// The loaded kernel module's version: `<sys root>/module/nvidia/version`, else the
/// `NVRM version:` line of `<proc root>/driver/nvidia/version`. Returns the version and the file
/// it came from; when neither gives one, the files looked at.
pub fn read_driver_version(sys_root: &Path, proc_root: &Path) -> Result<(String, String), Vec<String>> {
    let sys = join(sys_root, "module/nvidia/version");
    let proc = join(proc_root, "driver/nvidia/version");
    if let Ok(text) = fs::read_to_string(&sys)
        && let Some(v) = text.lines().next().map(str::trim).filter(|v| !v.is_empty())
    {
        return Ok((v.to_owned(), sys.display().to_string()));
    }
    if let Ok(text) = fs::read_to_string(&proc)
        && let Some(v) = parse_nvrm_version(&text)
    {
        return Ok((v, proc.display().to_string()));
    }
    Err(vec![sys.display().to_string(), proc.display().to_string()])
}

/// The version in `NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ...`.
pub fn parse_nvrm_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|w| {
            w.split('.').count() >= 2
                && w.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_owned)
}

/// `root` and a path inside it, one `/` between them whatever either carries (`/` as the root
/// gives the path itself).
fn join(root: &Path, inner: &str) -> PathBuf {
    let root = root.to_string_lossy();
    PathBuf::from(format!("{}/{inner}", root.trim_end_matches('/')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_driver_version_from_sys_then_proc() {
        let tmp = tempfile::tempdir().unwrap();
        let (sys, proc) = (tmp.path().join("sys"), tmp.path().join("proc"));
        let missing = read_driver_version(&sys, &proc).unwrap_err();
        assert!(
            missing[0].ends_with("sys/module/nvidia/version")
                && missing[1].ends_with("proc/driver/nvidia/version"),
            "{missing:?}"
        );
        fs::create_dir_all(proc.join("driver/nvidia")).unwrap();
        fs::write(
            proc.join("driver/nvidia/version"),
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\nGCC version:  gcc version 12.2.0\n",
        )
        .unwrap();
        assert_eq!(
            read_driver_version(&sys, &proc).unwrap(),
            ("550.54.15".to_owned(), proc.join("driver/nvidia/version").display().to_string())
        );
        fs::create_dir_all(sys.join("module/nvidia")).unwrap();
        fs::write(sys.join("module/nvidia/version"), "550.54.14\n").unwrap();
        assert_eq!(read_driver_version(&sys, &proc).unwrap().0, "550.54.14");
        // An empty module file says nothing: the proc line is used.
        fs::write(sys.join("module/nvidia/version"), "\n").unwrap();
        assert_eq!(read_driver_version(&sys, &proc).unwrap().0, "550.54.15");
    }

    #[test]
    fn root_slash_reads_the_host_files() {
        assert_eq!(join(Path::new("/"), "module/nvidia/version"), PathBuf::from("/module/nvidia/version"));
        assert_eq!(
            join(Path::new("/host/sys/"), "module/nvidia/version"),
            PathBuf::from("/host/sys/module/nvidia/version")
        );
    }

    #[test]
    fn the_nvrm_line_gives_the_dotted_version_only() {
        assert_eq!(
            parse_nvrm_version(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build"
            ),
            Some("560.35.03".to_owned())
        );
        assert_eq!(parse_nvrm_version("GCC version: gcc 12.2.0\n"), None);
        assert_eq!(parse_nvrm_version("NVRM version: NVIDIA driver x.y"), None);
    }
}
