//! Temporary files: their names, who may remove them, and the cleanup of those a killed writer left.
//!
//! A temp file for `dir/name` is `dir/.name.nvinject-<pid>-<counter>.tmp`: hidden (tools listing a
//! directory skip it), in the same directory (so the rename is atomic), ending in `.tmp` (so a CDI
//! registry loading `*.json`/`*.yaml` never reads one), and unique per writer: the pid separates
//! processes and the counter separates writes within one, so two writers never share a temp file.
//!
//! A temp file outlives its writer only if the writer was killed between creating and renaming it.
//! [`remove_stale_temps`] removes those, judging "killed" by the pid in the name: a pid that no
//! longer exists is stale; our own pid is stale unless this process is writing that file right now
//! (a previous incarnation in another pid namespace, a container restarted as pid 1 again); any other
//! live pid is left alone, as it may be a writer at work.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::WriteError;

const MARK: &[u8] = b".nvinject-";
const SUFFIX: &[u8] = b".tmp";

/// Temp files this process is writing now; [`remove_stale_temps`] never touches these.
static IN_FLIGHT: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// The temp file name for target file name `name`, written by `pid`, `counter`-th of that process.
pub(crate) fn temp_name(name: &OsStr, pid: u32, counter: u64) -> OsString {
    let mut out = Vec::with_capacity(name.len() + 32);
    out.push(b'.');
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(MARK);
    out.extend_from_slice(format!("{pid}-{counter}").as_bytes());
    out.extend_from_slice(SUFFIX);
    OsString::from_vec(out)
}

/// The writer pid of `candidate` if it is a temp file name for target `name` (exactly the shape
/// [`temp_name`] makes; a temp of another file whose name merely starts the same does not match).
pub(crate) fn temp_writer(name: &OsStr, candidate: &OsStr) -> Option<u32> {
    let rest = candidate.as_bytes().strip_prefix(b".")?;
    let rest = rest.strip_prefix(name.as_bytes())?;
    let rest = rest.strip_prefix(MARK)?;
    let rest = rest.strip_suffix(SUFFIX)?;
    let text = std::str::from_utf8(rest).ok()?;
    let (pid, counter) = text.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(counter) {
        return None;
    }
    counter.parse::<u64>().ok()?;
    // Pid 0 and values beyond i32 are no process: such a name is not one of ours.
    let pid: u32 = pid.parse().ok()?;
    (pid > 0 && i32::try_from(pid).is_ok()).then_some(pid)
}

/// Splits a target path into its directory (`.` for a bare name) and file name.
pub(crate) fn split(path: &Path) -> Result<(&Path, &OsStr), WriteError> {
    let name = path.file_name().ok_or_else(|| {
        WriteError::new(
            path,
            "name the file",
            io::Error::new(io::ErrorKind::InvalidInput, "the path has no file name"),
        )
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Ok((dir, name))
}

/// A temp file this process created and has not renamed yet: removed when dropped (failure, or a
/// panic in a caller's step callback), so a failed write leaves nothing behind.
pub(crate) struct Temp {
    path: PathBuf,
    /// Whether a file of ours is at `path` (created, not yet renamed away).
    ours: bool,
}

impl Temp {
    /// Creates a fresh temp file for `dir/name` with `create` (which must fail with
    /// `AlreadyExists` rather than reuse a file), trying the next name if one is taken by a
    /// leftover of an earlier process that had our pid.
    pub(crate) fn create<T>(
        dir: &Path,
        name: &OsStr,
        mut create: impl FnMut(&Path) -> io::Result<T>,
    ) -> io::Result<(Temp, T)> {
        // A handful of leftovers is the most a crashed predecessor leaves; beyond that, say so.
        const ATTEMPTS: u32 = 64;
        let pid = std::process::id();
        for _ in 0..ATTEMPTS {
            let path = dir.join(temp_name(name, pid, COUNTER.fetch_add(1, Ordering::Relaxed)));
            // Registered before it exists, so a concurrent cleanup in this process never removes it.
            in_flight().insert(path.clone());
            // Not ours until created: a taken name belongs to someone else and must stay.
            let mut temp = Temp { path, ours: false };
            match create(&temp.path) {
                Ok(value) => {
                    temp.ours = true;
                    return Ok((temp, value));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{ATTEMPTS} temporary file names in {} are taken by leftovers", dir.display()),
        ))
    }

    /// Renames the temp file over `target`; from then on there is nothing to clean up.
    pub(crate) fn rename_to(mut self, target: &Path) -> io::Result<()> {
        fs::rename(&self.path, target)?;
        self.ours = false;
        Ok(())
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if self.ours {
            // Best effort: the write already failed, and that error is the one to report.
            let _ = fs::remove_file(&self.path);
        }
        in_flight().remove(&self.path);
    }
}

fn in_flight() -> std::sync::MutexGuard<'static, BTreeSet<PathBuf>> {
    // A panic while holding the lock leaves the set consistent (single inserts and removes).
    IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes the temp files of `path` that killed writers left behind (see the module docs for how
/// "killed" is judged) and returns the ones removed. A missing directory has none.
///
/// Safe to call while other processes in this pid namespace write `path`: a live writer's temp
/// file is kept. Pids are judged in this process's pid namespace only, so a writer at work in
/// another one (a pod without `hostPID` next to a host process) may look gone; its rename then
/// fails and it reports the error, nothing is left half-written. Call it before writing a file
/// whose writers can be killed mid-write (an installer under its lock), so those kills leave no
/// stray files.
pub fn remove_stale_temps(path: &Path) -> Result<Vec<PathBuf>, WriteError> {
    let (dir, name) = split(path)?;
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(WriteError::new(path, "list the directory", e)),
    };
    let own = std::process::id();
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| WriteError::new(path, "list the directory", e))?;
        let Some(pid) = temp_writer(name, &entry.file_name()) else { continue };
        // A directory with a temp's name is no temp of ours: leave it to whoever made it.
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let temp = entry.path();
        let stale = if pid == own { !in_flight().contains(&temp) } else { !process_exists(pid) };
        if !stale {
            continue;
        }
        match fs::remove_file(&temp) {
            Ok(()) => {
                tracing::info!(temp = %temp.display(), writer_pid = pid, "removed a temporary file left by a killed writer");
                removed.push(temp);
            }
            // Its writer (or another cleanup) got there first.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(WriteError::new(path, "remove a stale temporary file", e)),
        }
    }
    Ok(removed)
}

/// Whether a process with this pid exists in our pid namespace. Signal 0 checks without sending;
/// EPERM means it exists but belongs to another user.
fn process_exists(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else { return false };
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), None) {
        Ok(()) => true,
        Err(nix::errno::Errno::ESRCH) => false,
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_hidden_tmp_files() {
        let name = temp_name(OsStr::new("nvidia.com-gpu.json"), 4242, 7);
        assert_eq!(name, ".nvidia.com-gpu.json.nvinject-4242-7.tmp");
        assert_eq!(temp_writer(OsStr::new("nvidia.com-gpu.json"), &name), Some(4242));
    }

    #[test]
    fn only_temps_of_the_same_target_match() {
        let target = OsStr::new("config.toml");
        for other in [
            "config.toml",
            ".config.toml.nvinject-tmp",
            ".config.toml.bak.nvinject-12-0.tmp",
            ".config.nvinject-12-0.tmp",
            ".config.toml.nvinject-12.tmp",
            ".config.toml.nvinject--0.tmp",
            ".config.toml.nvinject-x-0.tmp",
            ".config.toml.nvinject-0-0.tmp",
            ".config.toml.nvinject-99999999999-0.tmp",
            ".config.toml.nvinject-12-0.tmp.nvinject-13-0.tmp",
        ] {
            assert_eq!(
                temp_writer(target, OsStr::new(other)),
                None,
                "{other} taken for a temp of {target:?}"
            );
        }
        // The temp of a file whose own name looks like a temp is still told apart.
        let odd = OsStr::new("a.nvinject-1-2.tmp");
        let its_temp = temp_name(odd, 5, 0);
        assert_eq!(temp_writer(odd, &its_temp), Some(5));
        assert_eq!(temp_writer(OsStr::new("a"), &its_temp), None);
    }

    #[test]
    fn non_utf8_names_work() {
        let name = OsStr::from_bytes(b"spec-\xff.json");
        assert_eq!(temp_writer(name, &temp_name(name, 3, 1)), Some(3));
    }

    #[test]
    fn a_bare_file_name_lives_in_the_current_directory() {
        assert_eq!(split(Path::new("x.json")).unwrap(), (Path::new("."), OsStr::new("x.json")));
        let err = split(Path::new("/")).unwrap_err();
        assert_eq!(err.step, "name the file");
    }

    /// A pid that existed a moment ago and is gone now (a child we started and reaped).
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn stale_temps_of_gone_writers_are_removed_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("config.toml");
        fs::write(&target, b"current").unwrap();
        let at = |pid: u32, n: u64| dir.path().join(temp_name(OsStr::new("config.toml"), pid, n));
        let dead = at(dead_pid(), 0);
        let ours_from_before = at(std::process::id(), u64::MAX);
        // Pid 1 always exists: a writer that may be at work.
        let live = at(1, 0);
        let other_file = dir.path().join(temp_name(OsStr::new("other.toml"), dead_pid(), 0));
        for p in [&dead, &ours_from_before, &live, &other_file] {
            fs::write(p, b"partial").unwrap();
        }
        // A symlink left by a killed symlink replacement is removed too, not followed.
        let dead_link = at(dead_pid(), 1);
        std::os::unix::fs::symlink(&target, &dead_link).unwrap();

        let mut removed = remove_stale_temps(&target).unwrap();
        removed.sort();
        let mut expected = vec![dead.clone(), ours_from_before.clone(), dead_link.clone()];
        expected.sort();
        assert_eq!(removed, expected);
        assert!(!dead.exists() && !ours_from_before.exists() && fs::symlink_metadata(&dead_link).is_err());
        assert!(live.exists(), "a live writer's temp file was removed");
        assert!(other_file.exists(), "another file's temp was removed");
        assert_eq!(fs::read(&target).unwrap(), b"current");
    }

    #[test]
    fn a_temp_being_written_by_this_process_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("state.json");
        let (temp, ()) =
            Temp::create(dir.path(), OsStr::new("state.json"), |p| fs::write(p, b"half")).unwrap();
        assert!(remove_stale_temps(&target).unwrap().is_empty());
        assert!(temp.path.exists());
        drop(temp);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "a dropped temp is removed");
    }

    #[test]
    fn a_missing_directory_has_no_stale_temps() {
        let dir = tempfile::tempdir().unwrap();
        assert!(remove_stale_temps(&dir.path().join("absent/x.json")).unwrap().is_empty());
    }

    #[test]
    fn a_taken_temp_name_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        // Two names are taken by files of another writer, which must survive.
        let mut tried = Vec::new();
        let (temp, ()) = Temp::create(dir.path(), OsStr::new("f"), |p| {
            tried.push(p.to_owned());
            if tried.len() < 3 {
                fs::write(p, b"someone else's")?;
                Err(io::ErrorKind::AlreadyExists.into())
            } else {
                fs::write(p, b"x")
            }
        })
        .unwrap();
        assert_eq!(tried.len(), 3);
        assert!(tried[..2].iter().all(|p| fs::read(p).unwrap() == b"someone else's"));
        assert_eq!(tried.iter().collect::<BTreeSet<_>>().len(), 3, "the same name was tried twice");
        assert_eq!(temp.path, tried[2]);
    }
}
