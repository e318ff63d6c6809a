//! Whether a spec file may be used at all: the one trust check every reader of spec directories
//! goes through (the shim's registry, the device plugin's read-back, `nvinject-cdi validate`,
//! `nvinject-installer doctor`).
//!
//! A spec's hooks run as root on the host at every container start, so whoever can write a spec,
//! or swap one in, runs code as root. A spec is trusted only when:
//! - the file is owned by a trusted owner (root, or the user running the check: a file that user
//!   owns gives nobody more than that user has) and no one else may write it (no write bit for
//!   others, none for a group other than root's or the checker's);
//! - its folder, and every folder above it up to `/`, is owned by a trusted owner and writable by no
//!   one else, so nobody else can rename another file into its place or replace a folder on the way.
//!   A *parent* that is sticky and owned by a trusted owner (`/tmp`) is allowed: there others may
//!   only remove their own entries, never ours. The spec folder itself may not be such a folder,
//!   sticky or not: anyone could add specs to it (a spec of their own is refused by owner, but
//!   could squat the name our generator writes, or be taken in by a host that accepts untrusted
//!   specs);
//! - for a folder reached through symlinks, both the path as written (where a link lives) and the
//!   resolved path are checked.
//!
//! The file verdict is made on the metadata of the descriptor the bytes are read from
//! ([`read_trusted`]), so a file swapped between a stat and the read is judged as what was read.
//! Folders are checked by path before the read; a folder that passed can only be changed by a
//! trusted owner, so the order leaves nothing to race.
//!
//! [`judge_file`] and [`judge_dir`] are pure; [`check_dirs`] and [`read_trusted`] are the edge.

use std::fmt;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The owner, group and mode bits of a file or folder, as `stat` gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Permission bits with setuid, setgid and sticky (`mode & 0o7777`).
    pub mode: u32,
}

impl From<&std::fs::Metadata> for Stat {
    fn from(m: &std::fs::Metadata) -> Stat {
        Stat { uid: m.uid(), gid: m.gid(), mode: m.mode() & 0o7777 }
    }
}

/// Whose files are trusted: root always, and the user (and group) the check runs as, which in
/// production is root too (the shim, the plugin, doctor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owners {
    uids: Vec<u32>,
    gids: Vec<u32>,
}

impl Owners {
    /// Root and this process's effective user and group.
    pub fn this_process() -> Owners {
        // SAFETY: geteuid and getegid cannot fail and touch no memory of ours.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Owners::of(uid, gid)
    }

    /// Root and `uid`/`gid`.
    pub fn of(uid: u32, gid: u32) -> Owners {
        let mut uids = vec![0, uid];
        let mut gids = vec![0, gid];
        uids.dedup();
        gids.dedup();
        Owners { uids, gids }
    }

    fn trusts_uid(&self, uid: u32) -> bool {
        self.uids.contains(&uid)
    }

    fn trusts_gid(&self, gid: u32) -> bool {
        self.gids.contains(&gid)
    }

    /// Whether anyone outside these owners may write through these mode bits.
    fn others_may_write(&self, stat: &Stat) -> bool {
        stat.mode & 0o002 != 0 || (stat.mode & 0o020 != 0 && !self.trusts_gid(stat.gid))
    }
}

/// What a reader does with spec files: whose it trusts, and whether it uses untrusted ones anyway
/// (the shim's `[cdi] accept-untrusted-specs`, `nvinject-cdi validate --accept-untrusted`), which it
/// then reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustPolicy {
    /// Whose files and folders are trusted.
    pub owners: Owners,
    /// Use untrusted files too (each use is the caller's to report loudly).
    pub accept_untrusted: bool,
}

impl Default for TrustPolicy {
    /// Strict, trusting root and this process's user.
    fn default() -> Self {
        TrustPolicy { owners: Owners::this_process(), accept_untrusted: false }
    }
}

/// A uid with its user name when the passwd file gives one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The uid.
    pub uid: u32,
    /// The name, when known.
    pub name: Option<String>,
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(name) => write!(f, "uid {} ({name})", self.uid),
            None => write!(f, "uid {}", self.uid),
        }
    }
}

/// What is wrong with a file or folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// Owned by someone not trusted.
    Owner,
    /// Writable by others (or by a group not root's).
    Writable,
    /// The spec folder itself is sticky and world-writable: anyone may add files.
    StickySpecDir,
}

/// Where the untrusted thing sits relative to the spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The spec file.
    File,
    /// The folder holding it.
    SpecDir,
    /// A folder above that.
    Parent,
}

/// Why a spec file is not trusted. The message names the spec, what was judged, its owner and
/// mode, and the command that fixes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UntrustedError {
    /// The file, its folder or a folder above has the wrong owner or mode.
    #[error("{}; fix: `{}` (or remove the file)", summary(spec, what, *role, owner, *mode, *problem), fix(what, *problem, *role))]
    Untrusted {
        /// The spec file.
        spec: PathBuf,
        /// The file or folder judged.
        what: PathBuf,
        /// Which one it is.
        role: Role,
        /// Its owner.
        owner: Owner,
        /// Its group.
        gid: u32,
        /// Its mode bits.
        mode: u32,
        /// What is wrong.
        problem: Problem,
    },
    /// A folder on the way could not be looked at.
    #[error("untrusted CDI spec {}: cannot check the folder {}: {message}", shown(spec), shown(what))]
    Stat {
        /// The spec file.
        spec: PathBuf,
        /// The folder.
        what: PathBuf,
        /// What the OS said.
        message: String,
    },
}

impl UntrustedError {
    /// The spec file.
    pub fn spec(&self) -> &Path {
        match self {
            UntrustedError::Untrusted { spec, .. } | UntrustedError::Stat { spec, .. } => spec,
        }
    }

    /// The same verdict for another spec file of the same folder.
    pub fn for_spec(&self, path: &Path) -> UntrustedError {
        let mut e = self.clone();
        match &mut e {
            UntrustedError::Untrusted { spec, .. } | UntrustedError::Stat { spec, .. } => {
                *spec = path.to_owned()
            }
        }
        e
    }

    /// What is wrong, without the fix (for a report that shows the fix on its own line).
    pub fn summary(&self) -> String {
        match self {
            UntrustedError::Untrusted { spec, what, role, owner, mode, problem, .. } => {
                summary(spec, what, *role, owner, *mode, *problem)
            }
            UntrustedError::Stat { .. } => self.to_string(),
        }
    }

    /// The command that makes it trusted, when one does.
    pub fn fix(&self) -> Option<String> {
        match self {
            UntrustedError::Untrusted { what, role, problem, .. } => Some(fix(what, *problem, *role)),
            UntrustedError::Stat { .. } => None,
        }
    }

    /// Fills in owner names from the passwd file's text (cheap, and only on the refusal path).
    pub fn with_names_from(mut self, passwd: &str) -> UntrustedError {
        if let UntrustedError::Untrusted { owner, .. } = &mut self
            && owner.name.is_none()
        {
            owner.name = user_name(passwd, owner.uid);
        }
        self
    }

    /// Fills in owner names from this host's `/etc/passwd`.
    pub fn with_host_names(self) -> UntrustedError {
        match crate::codec::read_bounded(Path::new("/etc/passwd")) {
            Ok(bytes) => self.with_names_from(&String::from_utf8_lossy(&bytes)),
            Err(_) => self,
        }
    }
}

/// The message without its fix.
fn summary(spec: &Path, what: &Path, role: Role, owner: &Owner, mode: u32, problem: Problem) -> String {
    format!(
        "untrusted CDI spec {}: {}{} is owned by {owner} with mode {mode:04o}, {}: a spec's hooks run as \
         root, so only specs owned by root and writable by no one else, in folders only root can change, \
         are used",
        shown(spec),
        role_text(role),
        if role == Role::File { String::new() } else { format!(" {}", shown(what)) },
        problem_text(problem, role),
    )
}

/// A path as messages show it: file names in a folder others may write are anyone's text, so
/// control characters are escaped and a huge name is cut.
fn shown(path: &Path) -> String {
    nvinject_fsio::escape::escape(&path.to_string_lossy()).to_string()
}

fn role_text(role: Role) -> &'static str {
    match role {
        Role::File => "the file",
        Role::SpecDir => "its folder",
        Role::Parent => "the folder above it",
    }
}

fn problem_text(problem: Problem, role: Role) -> &'static str {
    match (problem, role) {
        (Problem::Owner, Role::File) => "not owned by root",
        (Problem::Owner, _) => "not owned by root, so its owner can replace what is in it",
        (Problem::Writable, Role::File) => "writable by others",
        (Problem::Writable, _) => "writable by others, so they can replace what is in it",
        (Problem::StickySpecDir, _) => "so anyone may add spec files to it (sticky or not)",
    }
}

fn fix(what: &Path, problem: Problem, role: Role) -> String {
    let p = shown(what);
    match (problem, role) {
        (Problem::Owner, Role::File) => format!("chown root:root {p} && chmod 0644 {p}"),
        (Problem::Writable, Role::File) => format!("chmod go-w {p}"),
        (Problem::Owner, _) => format!("chown root:root {p} && chmod go-w {p}"),
        (Problem::Writable | Problem::StickySpecDir, _) => format!("chmod go-w {p}"),
    }
}

/// The user name of `uid` in passwd-format text.
pub fn user_name(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id: u32 = fields.nth(1)?.parse().ok()?;
        (id == uid && !name.is_empty()).then(|| name.to_owned())
    })
}

fn untrusted(spec: &Path, what: &Path, role: Role, stat: &Stat, problem: Problem) -> UntrustedError {
    UntrustedError::Untrusted {
        spec: spec.to_owned(),
        what: what.to_owned(),
        role,
        owner: Owner { uid: stat.uid, name: None },
        gid: stat.gid,
        mode: stat.mode,
        problem,
    }
}

/// Judges the spec file `spec` by its `stat` (pure).
pub fn judge_file(spec: &Path, stat: &Stat, owners: &Owners) -> Result<(), UntrustedError> {
    if !owners.trusts_uid(stat.uid) {
        return Err(untrusted(spec, spec, Role::File, stat, Problem::Owner));
    }
    if owners.others_may_write(stat) {
        return Err(untrusted(spec, spec, Role::File, stat, Problem::Writable));
    }
    Ok(())
}

/// Judges the folder `dir` on the way to `spec` (pure): `role` says whether it holds the spec.
pub fn judge_dir(
    spec: &Path,
    dir: &Path,
    role: Role,
    stat: &Stat,
    owners: &Owners,
) -> Result<(), UntrustedError> {
    if !owners.trusts_uid(stat.uid) {
        return Err(untrusted(spec, dir, role, stat, Problem::Owner));
    }
    if owners.others_may_write(stat) {
        let sticky = stat.mode & 0o1000 != 0;
        return match (role, sticky) {
            (Role::Parent, true) => Ok(()),
            (_, true) => Err(untrusted(spec, dir, role, stat, Problem::StickySpecDir)),
            _ => Err(untrusted(spec, dir, role, stat, Problem::Writable)),
        };
    }
    Ok(())
}

/// Judges a whole chain (pure): each folder (from [`folders_of`], with its `stat`), then the
/// file's `stat`. For a reader that gathers the facts its own way (doctor, inside a host root).
pub fn judge_chain(
    spec: &Path,
    file: &Stat,
    folders: &[(PathBuf, Role, Stat)],
    owners: &Owners,
) -> Result<(), UntrustedError> {
    for (dir, role, stat) in folders {
        judge_dir(spec, dir, *role, stat, owners)?;
    }
    judge_file(spec, file, owners)
}

/// The folders to check for the spec folder `dir` given as written and as resolved (absolute,
/// links followed; the same when it has none): each and every folder above, without repeats.
pub fn folders_of(dir: &Path, resolved: &Path) -> Vec<(PathBuf, Role)> {
    let mut out: Vec<(PathBuf, Role)> = Vec::new();
    for start in [dir, resolved] {
        for (i, d) in start.ancestors().enumerate() {
            if !out.iter().any(|(p, _)| p == d) {
                out.push((d.to_owned(), if i == 0 { Role::SpecDir } else { Role::Parent }));
            }
        }
    }
    out
}

/// The folders to check for a spec folder `dir`: it and each folder above it, for the path as
/// written and for the resolved one, without repeats (the spec folder first).
fn chain(dir: &Path) -> io::Result<Vec<(PathBuf, Role)>> {
    let absolute = if dir.is_absolute() { dir.to_owned() } else { std::env::current_dir()?.join(dir) };
    let resolved = std::fs::canonicalize(&absolute)?;
    Ok(folders_of(&absolute, &resolved))
}

/// Checks the folder `dir` that holds spec files and every folder above it; `spec` names the file
/// (or the folder itself) in the error. The edge: one `stat` per folder, links followed.
pub fn check_dirs(spec: &Path, dir: &Path, owners: &Owners) -> Result<(), UntrustedError> {
    let stat_error = |what: &Path, e: io::Error| UntrustedError::Stat {
        spec: spec.to_owned(),
        what: what.to_owned(),
        message: e.to_string(),
    };
    for (d, role) in chain(dir).map_err(|e| stat_error(dir, e))? {
        let meta = std::fs::metadata(&d).map_err(|e| stat_error(&d, e))?;
        judge_dir(spec, &d, role, &Stat::from(&meta), owners)?;
    }
    Ok(())
}

/// Why [`read_trusted`] gave no bytes.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be read.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// It is not trusted.
    #[error(transparent)]
    Untrusted(#[from] UntrustedError),
}

/// Reads the spec at `path` (bounded, as [`crate::codec::read_bounded`]) and judges it: its folders
/// by path first, then the file by the metadata of the descriptor read. `accept` keeps the bytes of
/// an untrusted file and returns the verdict beside them (for a host that accepts such files).
pub fn read_trusted(
    path: &Path,
    owners: &Owners,
    accept: bool,
) -> Result<(Vec<u8>, Option<UntrustedError>), ReadError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dirs = check_dirs(path, dir, owners);
    if let Err(e) = &dirs
        && !accept
    {
        return Err(e.clone().with_host_names().into());
    }
    let (bytes, meta) = crate::codec::read_bounded_with_metadata(path)?;
    let stat = Stat::from(&meta);
    let verdict =
        dirs.and_then(|()| judge_file(path, &stat, owners)).err().map(UntrustedError::with_host_names);
    match verdict {
        Some(e) if !accept => Err(e.into()),
        verdict => Ok((bytes, verdict)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    fn owners() -> Owners {
        Owners::of(1000, 1000)
    }

    fn st(uid: u32, gid: u32, mode: u32) -> Stat {
        Stat { uid, gid, mode }
    }

    #[test]
    fn files_must_be_ours_and_written_by_no_one_else() {
        let f = Path::new("/etc/cdi/x.yaml");
        let o = owners();
        assert!(judge_file(f, &st(0, 0, 0o644), &o).is_ok());
        assert!(judge_file(f, &st(1000, 1000, 0o664), &o).is_ok(), "our own group");
        assert!(judge_file(f, &st(0, 0, 0o664), &o).is_ok(), "root's group");
        let err = judge_file(f, &st(0, 0, 0o666), &o).unwrap_err().to_string();
        assert_eq!(
            err,
            "untrusted CDI spec /etc/cdi/x.yaml: the file is owned by uid 0 with mode 0666, writable by others: \
             a spec's hooks run as root, so only specs owned by root and writable by no one else, in folders \
             only root can change, are used; fix: `chmod go-w /etc/cdi/x.yaml` (or remove the file)"
        );
        let err = judge_file(f, &st(0, 100, 0o664), &o).unwrap_err();
        assert!(matches!(err, UntrustedError::Untrusted { problem: Problem::Writable, .. }), "{err}");
        let err = judge_file(f, &st(65534, 65534, 0o644), &o).unwrap_err().with_names_from(
            "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        );
        let text = err.to_string();
        assert!(text.contains("owned by uid 65534 (nobody) with mode 0644, not owned by root"), "{text}");
        assert!(
            text.contains("fix: `chown root:root /etc/cdi/x.yaml && chmod 0644 /etc/cdi/x.yaml`"),
            "{text}"
        );
    }

    #[test]
    fn folders_must_be_ours_and_a_sticky_one_is_allowed_only_above_the_spec_folder() {
        let f = Path::new("/tmp/cdi/x.yaml");
        let o = owners();
        let tmp = Path::new("/tmp");
        assert!(judge_dir(f, tmp, Role::Parent, &st(0, 0, 0o1777), &o).is_ok());
        let err = judge_dir(f, tmp, Role::SpecDir, &st(0, 0, 0o1777), &o).unwrap_err().to_string();
        assert!(err.contains("its folder /tmp is owned by uid 0 with mode 1777"), "{err}");
        assert!(err.contains("anyone may add spec files") && err.contains("fix: `chmod go-w /tmp`"), "{err}");
        // Sticky but owned by someone else: that owner may remove or rename anything in it.
        let err = judge_dir(f, tmp, Role::Parent, &st(65534, 0, 0o1777), &o).unwrap_err();
        assert!(matches!(err, UntrustedError::Untrusted { problem: Problem::Owner, .. }), "{err}");
        let err = judge_dir(f, tmp, Role::Parent, &st(0, 0, 0o777), &o).unwrap_err().to_string();
        assert!(err.contains("the folder above it /tmp") && err.contains("writable by others"), "{err}");
        let err = judge_dir(f, Path::new("/tmp/cdi"), Role::SpecDir, &st(0, 50, 0o775), &o).unwrap_err();
        assert!(matches!(err, UntrustedError::Untrusted { problem: Problem::Writable, .. }), "{err}");
        assert!(judge_dir(f, Path::new("/tmp/cdi"), Role::SpecDir, &st(1000, 1000, 0o775), &o).is_ok());
    }

    #[test]
    fn a_hostile_file_name_cannot_forge_a_line() {
        let f = Path::new("/tmp/drop/x\n2026 INFO container create ok.yaml");
        let err = judge_file(f, &st(65534, 0, 0o644), &owners()).unwrap_err().to_string();
        assert!(!err.contains('\n') && err.contains("x\\n2026 INFO"), "{err}");
    }

    #[test]
    fn user_names_come_from_passwd_text() {
        let passwd = "root:x:0:0::/root:/bin/sh\n# comment\nbad line\nbob:x:1000:1000::/home/bob:/bin/sh\n";
        assert_eq!(user_name(passwd, 1000).as_deref(), Some("bob"));
        assert_eq!(user_name(passwd, 7), None);
    }

    /// A temp folder laid out as a spec folder: its mode narrowed so a umask of 002 does not matter.
    fn spec_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    fn write(path: &Path, mode: u32) {
        fs::write(path, "kind: a.b/c\n").unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn read_trusted_judges_the_file_read_and_its_folders() {
        let dir = spec_dir();
        let o = Owners::this_process();
        let f = dir.path().join("a.yaml");
        write(&f, 0o644);
        let (bytes, verdict) = read_trusted(&f, &o, false).unwrap();
        assert_eq!((bytes.as_slice(), verdict), (&b"kind: a.b/c\n"[..], None));

        fs::set_permissions(&f, fs::Permissions::from_mode(0o666)).unwrap();
        let err = read_trusted(&f, &o, false).unwrap_err().to_string();
        assert!(
            err.contains(&format!("{}: the file is owned by", f.display())) && err.contains("0666"),
            "{err}"
        );
        // Accepted: the bytes and the verdict.
        let (_, verdict) = read_trusted(&f, &o, true).unwrap();
        assert!(verdict.is_some_and(|v| v.to_string().contains("0666")));

        fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
        for (mode, ok) in [(0o777, false), (0o1777, false), (0o775, true), (0o755, true)] {
            fs::set_permissions(dir.path(), fs::Permissions::from_mode(mode)).unwrap();
            let got = read_trusted(&f, &o, false);
            assert_eq!(got.is_ok(), ok, "folder {mode:o}: {:?}", got.err());
        }
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
        let err = read_trusted(&f, &o, false).unwrap_err().to_string();
        assert!(err.contains(&format!("fix: `chmod go-w {}`", dir.path().display())), "{err}");

        // A folder above the spec folder: world-writable refuses, sticky (as /tmp) does not.
        let inner = dir.path().join("cdi");
        fs::create_dir(&inner).unwrap();
        fs::set_permissions(&inner, fs::Permissions::from_mode(0o755)).unwrap();
        let g = inner.join("b.json");
        write(&g, 0o644);
        assert!(read_trusted(&g, &o, false).unwrap_err().to_string().contains("the folder above it"));
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o1777)).unwrap();
        read_trusted(&g, &o, false).unwrap();
    }

    #[test]
    fn a_folder_reached_through_a_link_is_checked_where_the_link_points() {
        let dir = spec_dir();
        let o = Owners::this_process();
        let open = dir.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        std::os::unix::fs::symlink(&open, dir.path().join("cdi")).unwrap();
        let f = dir.path().join("cdi/a.yaml");
        write(&f, 0o644);
        let err = read_trusted(&f, &o, false).unwrap_err().to_string();
        assert!(err.contains("writable by others"), "{err}");
    }

    #[test]
    #[ignore = "needs root"]
    fn files_and_folders_of_another_user_are_refused_naming_the_owner() {
        nvinject_test_support::require_root("chown");
        let dir = spec_dir();
        let o = Owners::this_process();
        let f = dir.path().join("a.yaml");
        write(&f, 0o644);
        std::os::unix::fs::chown(&f, Some(65534), Some(65534)).unwrap();
        let err = read_trusted(&f, &o, false).unwrap_err().to_string();
        assert!(err.contains("owned by uid 65534"), "{err}");
        assert!(err.contains(&format!("chown root:root {} && chmod 0644", f.display())), "{err}");
        std::os::unix::fs::chown(&f, Some(0), Some(0)).unwrap();
        read_trusted(&f, &o, false).unwrap();
        std::os::unix::fs::chown(dir.path(), Some(65534), Some(0)).unwrap();
        let err = read_trusted(&f, &o, false).unwrap_err().to_string();
        assert!(err.contains("its folder") && err.contains("owned by uid 65534"), "{err}");
    }
}
