//! The CDI spec seam (what a spec is generated from, and the generator trait an install calls) and
//! its production implementation through the cdi-gen library, with host-path rebasing: files are found through
//! the host root, and the spec names them by their host paths.

use std::path::PathBuf;

use nvinject_cdi::codec::Format;
use nvinject_cdi_gen::{GenerateOptions, Nvml, Root, generate};

use crate::containerd::EffectiveCdi;
use crate::containerd::imports::clean;
use crate::error::Result;
use crate::paths::{HostRoot, host_join};

/// What the CDI spec is generated from (host paths, plus the host root to reach them).
#[derive(Debug, Clone)]
pub struct SpecRequest {
    /// Host root.
    pub host_root: HostRoot,
    /// Driver root (host path).
    pub driver_root: String,
    /// Dev root (host path).
    pub dev_root: String,
    /// Proc root (host path).
    pub proc_root: String,
    /// Sys root (host path).
    pub sys_root: String,
    /// NVML library (host path), if not the driver root's.
    pub nvml_lib: Option<String>,
    /// Hook path written into the spec (host path).
    pub hook_path: String,
    /// The MPS pipe directory (host path) the spec mounts, if any.
    pub mps_pipe_dir: Option<String>,
    /// The OCI timeout of the spec's hook runs, in seconds.
    pub hook_timeout_secs: u32,
}

/// Produces the CDI spec file for this node (the cdi-gen library in production).
pub trait SpecGenerator {
    /// The spec's bytes, deterministic for a given node.
    fn generate(&self, request: &SpecRequest) -> Result<Vec<u8>>;
}

/// The production spec generator (NVML + driver root + dev root).
#[derive(Debug, Clone, Copy, Default)]
pub struct CdiGen;

impl SpecGenerator for CdiGen {
    fn generate(&self, r: &SpecRequest) -> Result<Vec<u8>> {
        // cdi-gen resolves paths inside each root it is given; the roots themselves are located
        // inside the host root first, so a link there cannot hand it the installer's own tree.
        let root = |host: &str| -> Result<Root> {
            Ok(Root { lookup: r.host_root.locate(host)?, host: PathBuf::from(host) })
        };
        let mut opts = GenerateOptions::new(
            root(&r.driver_root)?,
            root(&r.dev_root)?,
            r.host_root.locate(&r.proc_root)?,
            r.host_root.locate(&r.sys_root)?,
            r.hook_path.clone(),
        );
        opts.nvml_lib = r.nvml_lib.as_ref().map(|p| r.host_root.locate(p)).transpose()?;
        opts.mps_pipe_dir = r.mps_pipe_dir.as_deref().map(root).transpose()?;
        opts.spec.hook_timeout_secs = Some(r.hook_timeout_secs);
        let spec = generate(&opts, &Nvml)?;
        Ok(nvinject_cdi::codec::to_string(&spec, Format::Json).into_bytes())
    }
}

/// `host_path` with every symbolic link on the way followed inside the host root (Debian's
/// `/var/run -> /run`), so two spellings of one directory compare equal. A component that cannot
/// be read is kept as written.
pub(crate) fn resolved(root: &HostRoot, host_path: &str) -> String {
    let mut cur = "/".to_owned();
    for name in clean(host_path).split('/').filter(|n| !n.is_empty()) {
        let next = host_join(&cur, name);
        cur = root.follow_links(&next).unwrap_or(next);
    }
    cur
}

/// When containerd's own CDI is on, whether it reads specs from `cdi_dir`; `None` when its CDI
/// is off or absent (our shim then resolves the annotations, from any directory).
pub fn containerd_reads(root: &HostRoot, cdi_dir: &str, cdi: Option<&EffectiveCdi>) -> Option<bool> {
    let cdi = cdi.filter(|c| c.enabled)?;
    let ours = resolved(root, cdi_dir);
    Some(cdi.spec_dirs.iter().any(|d| resolved(root, d) == ours))
}

/// The warning (install) and failure detail (doctor) for a spec directory containerd's CDI does
/// not read, with where to change what.
pub fn unread_dir_message(cdi_dir: &str, containerd: &str, cdi: &EffectiveCdi) -> (String, String) {
    let from = cdi.defined_in.as_deref().map_or_else(|| "its default".to_owned(), |f| format!("set in {f}"));
    let detail = format!(
        "containerd {containerd} resolves cdi.k8s.io/ annotations itself (enable_cdi = true, {from}) and reads \
         specs only from cdi_spec_dirs {:?}; the spec dir {cdi_dir} is not one of them, so every GPU container \
         fails inside containerd (\"unresolvable CDI devices\")",
        cdi.spec_dirs
    );
    let fix = match cdi.spec_dirs.first() {
        Some(first) => format!(
            "install with --cdi-dir={first}, or add {cdi_dir} to cdi_spec_dirs in containerd's CRI config and \
             restart containerd"
        ),
        None => format!("add {cdi_dir} to cdi_spec_dirs in containerd's CRI config and restart containerd"),
    };
    (detail, fix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cdi(enabled: bool, dirs: &[&str]) -> EffectiveCdi {
        EffectiveCdi { enabled, spec_dirs: dirs.iter().map(|d| (*d).to_owned()).collect(), defined_in: None }
    }

    #[test]
    fn a_dir_is_read_when_listed_or_reached_through_a_link_and_not_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("run/cdi")).unwrap();
        std::fs::create_dir_all(dir.path().join("var")).unwrap();
        std::os::unix::fs::symlink("/run", dir.path().join("var/run")).unwrap();
        let root = HostRoot::new(dir.path());
        let on = cdi(true, &["/etc/cdi", "/var/run/cdi"]);
        assert_eq!(containerd_reads(&root, "/var/run/cdi", Some(&on)), Some(true));
        assert_eq!(containerd_reads(&root, "/var/run/cdi/", Some(&on)), Some(true));
        // /run/cdi is /var/run/cdi through Debian's link.
        assert_eq!(containerd_reads(&root, "/run/cdi", Some(&on)), Some(true));
        assert_eq!(containerd_reads(&root, "/opt/cdi", Some(&on)), Some(false));
        assert_eq!(containerd_reads(&root, "/var/run/cdi-other", Some(&on)), Some(false));
        // CDI off or absent: the shim resolves, any directory serves.
        assert_eq!(containerd_reads(&root, "/opt/cdi", Some(&cdi(false, &["/etc/cdi"]))), None);
        assert_eq!(containerd_reads(&root, "/opt/cdi", None), None);
    }

    #[test]
    fn the_message_names_the_dirs_the_source_and_a_fix_that_points_at_them() {
        let mut c = cdi(true, &["/etc/cdi", "/var/run/cdi"]);
        c.defined_in = Some("/etc/containerd/config.toml".into());
        let (detail, fix) = unread_dir_message("/opt/cdi", "2.1.9", &c);
        assert!(detail.contains("/opt/cdi") && detail.contains("/etc/containerd/config.toml"), "{detail}");
        assert!(detail.contains("\"/var/run/cdi\""), "{detail}");
        assert!(fix.contains("--cdi-dir=/etc/cdi") && fix.contains("cdi_spec_dirs"), "{fix}");
        assert!(!fix.contains("image"), "{fix}");
    }
}
