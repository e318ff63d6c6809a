//! The installer's ledger: the I/O around its state file ([`record`]). It records every file,
//! directory and link the installer writes on the host, with the hash of what was there before
//! and of what it wrote, and undoes exactly its own changes on uninstall.
//!
//! The ledger is written (atomically) *before* each change it describes. A kill between the two
//! leaves an entry whose `after` hash the file does not have; uninstall and the next install
//! both handle that, because they decide from the file's current hash, never from the ledger
//! alone: what uninstall does with each entry is a pure function of the entry and what is at its
//! path now ([`undo::decide`]); this module reads the path and carries the decision out.

pub mod record;
pub mod undo;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use nvinject_fsio::root::EntryType;

use crate::error::{Error, Result};
use crate::fsx::{self, FaultHook};
use crate::paths::{CONFIG_LIMIT, FILE_LIMIT, HostRoot, host_join, split};

use record::FORMAT;
pub use record::{Entry, Kind, Role, State};
use undo::{UndoAction, decide};

/// Mode of the state directory and its `backup/`: backups hold containerd's config, registry
/// credentials included, so only root may enter.
pub const STATE_DIR_MODE: u32 = 0o700;

/// Mode of the system directories the state directory needed (`/var/lib` on a bare root): others
/// must traverse them. The state directory and nvinject's own parents are [`STATE_DIR_MODE`].
const STATE_PARENT_MODE: u32 = 0o755;

/// Prefix of the name under which a first save builds the missing part of the state directory's
/// path before renaming it into place.
const NEW_STATE_PREFIX: &str = ".nvinject-installer-new.";

/// The missing part of the path to `dir_host`: the deepest existing ancestor and the missing
/// directories below it, outermost first (`dir_host` last). Empty when `dir_host` exists.
fn missing_chain(root: &HostRoot, dir_host: &str) -> Result<(String, Vec<String>)> {
    let mut missing = Vec::new();
    let mut cur = Path::new(dir_host);
    loop {
        let host = cur.to_string_lossy().into_owned();
        if root.metadata(&host)?.is_some() {
            missing.reverse();
            return Ok((host, missing));
        }
        missing.push(host);
        cur = cur.parent().unwrap_or(Path::new("/"));
    }
}

/// Prefix of the name a complete uninstall moves the state directory (with the parents made for
/// it) to before removing it.
const OLD_STATE_PREFIX: &str = ".nvinject-installer-old.";

/// `dir` renamed with `prefix` in the same parent.
fn sibling_name(dir: &str, prefix: &str) -> String {
    let (parent, name) = split(dir);
    host_join(&parent, &format!("{prefix}{name}"))
}

/// Renames `from` to `to`, both in the same directory (resolved inside the root); never over
/// something that is there.
fn rename_sibling(root: &HostRoot, from: &str, to: &str) -> Result<()> {
    let (parent, from_name) = split(from);
    let (_, to_name) = split(to);
    let dir = root.dir(&parent)?;
    nix::fcntl::renameat2(
        &dir,
        from_name.as_str(),
        &dir,
        to_name.as_str(),
        nix::fcntl::RenameFlags::RENAME_NOREPLACE,
    )
    .map_err(|e| Error::io("rename", root.shown(from))(e.into()))?;
    let _ = nvinject_fsio::sync_parent_dir(&dir.join(&to_name));
    Ok(())
}

/// What a killed first save or a killed complete uninstall left (see [`Ledger::save`] and
/// [`Ledger::finish`]): trees under our own names beside the state directory or its parents.
fn remove_leftovers(root: &HostRoot, dir_host: &str, hook: &FaultHook) -> Result<()> {
    let (_, missing) = missing_chain(root, dir_host)?;
    if let Some(first) = missing.first() {
        remove_own_tree(root, &sibling_name(first, NEW_STATE_PREFIX), hook)?;
    }
    // An uninstall renames the state directory or one of its parents, always in a directory
    // that still exists: the outermost missing one's parent and those above.
    let start = missing.first().map_or(dir_host, String::as_str);
    let mut cur = Path::new(start);
    while cur != Path::new("/") && !cur.as_os_str().is_empty() {
        remove_own_tree(root, &sibling_name(&cur.to_string_lossy(), OLD_STATE_PREFIX), hook)?;
        cur = cur.parent().unwrap_or(Path::new("/"));
    }
    Ok(())
}

/// Removes a directory tree the installer made itself (a staging tree a killed run left):
/// entries are unlinked by name, links never followed.
fn remove_own_tree(root: &HostRoot, host_dir: &str, hook: &FaultHook) -> Result<()> {
    let Some(entries) = root.read_dir(host_dir)? else { return Ok(()) };
    for (name, kind) in entries {
        let path = host_join(host_dir, &name);
        if kind == EntryType::Dir {
            remove_own_tree(root, &path, hook)?;
        } else {
            fsx::remove_in(root, &path, hook)?;
        }
    }
    root.remove_dir(host_dir)?;
    Ok(())
}

/// Whether a write changed anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The path already had this content.
    Unchanged,
    /// The path was created or replaced.
    Written,
}

/// Result of placing a symlink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkOutcome {
    /// Created (or re-pointed from our own earlier target).
    Created,
    /// Already pointed at the target.
    Present,
    /// Something else is there; left alone.
    Occupied(String),
}

/// Removes our `imports` entry from the main config's text (`None`: it has none).
pub type RemoveImport<'a> = &'a dyn Fn(&str) -> Result<Option<String>>;

/// The ledger, bound to a host root and a state directory.
pub struct Ledger<'h> {
    root: HostRoot,
    dir_host: String,
    state: State,
    touched: BTreeSet<String>,
    hook: &'h FaultHook,
}

/// What uninstall did, for the report.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Undo {
    /// Host paths restored to their original bytes.
    pub restored: Vec<String>,
    /// Host paths removed.
    pub removed: Vec<String>,
    /// Host paths left as they are, with why.
    pub kept: Vec<(String, String)>,
    /// Whether containerd's effective configuration changed.
    pub containerd_changed: bool,
}

impl<'h> Ledger<'h> {
    /// Loads the ledger from `<root><state_dir>/state.json` (empty if absent).
    pub fn load(root: &HostRoot, state_dir: &str, hook: &'h FaultHook) -> Result<Self> {
        let host = host_join(state_dir, "state.json");
        let path = root.shown(&host);
        for p in [state_dir.to_owned(), host_join(state_dir, "backup"), host.clone()] {
            refuse_link(root, &p)?;
        }
        let state = match root.read(&host, CONFIG_LIMIT)? {
            None => {
                remove_leftovers(root, state_dir, hook)?;
                State::default()
            }
            Some(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| Error::State { path: path.clone(), message: e.to_string() })?,
        };
        if state.format != FORMAT {
            return Err(Error::State {
                path,
                message: format!("format {} (expected {FORMAT})", state.format),
            });
        }
        Ok(Ledger {
            root: root.clone(),
            dir_host: state_dir.to_owned(),
            state,
            touched: BTreeSet::new(),
            hook,
        })
    }

    /// The state as loaded and changed so far.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Records that containerd needs (or no longer needs) a restart.
    pub fn set_restart_pending(&mut self, pending: bool) -> Result<()> {
        if self.state.restart_pending != pending {
            self.state.restart_pending = pending;
            self.save()?;
        }
        Ok(())
    }

    /// Writes the state file. The first save also makes the state directory and any parents it
    /// lacks, and those appear on the host only together with a state file that records them: the
    /// missing part of the path is built under a staging name and renamed into place. A run killed
    /// before the rename leaves only the staging tree, which the next load removes; so a later
    /// uninstall knows exactly which parents were ours, however often installs were killed.
    fn save(&mut self) -> Result<()> {
        let (_, missing) = missing_chain(&self.root, &self.dir_host)?;
        if let Some(first) = missing.first() {
            return self.save_first(first, &missing);
        }
        self.private_dir(&self.dir_host.clone())?;
        let mut bytes = serde_json::to_vec_pretty(&self.state).expect("state serializes");
        bytes.push(b'\n');
        fsx::write_in(&self.root, &host_join(&self.dir_host, "state.json"), &bytes, 0o600, self.hook)
    }

    fn save_first(&mut self, first: &str, missing: &[String]) -> Result<()> {
        let staging = sibling_name(first, NEW_STATE_PREFIX);
        remove_own_tree(&self.root, &staging, self.hook)?;
        // `missing` without the state directory itself: the parents made for it.
        for d in &missing[..missing.len() - 1] {
            if !self.state.created_parents.contains(d) {
                self.state.created_parents.push(d.clone());
            }
        }
        let staged = |d: &str| format!("{staging}{}", &d[first.len()..]);
        for (i, d) in missing.iter().enumerate() {
            // nvinject's own directories (`/var/lib/nvinject`) are as private as the state; a
            // system directory it had to make (`/var/lib`) is one others must traverse.
            let own = i + 1 == missing.len() || split(d).1.contains("nvinject");
            let mode = if own { STATE_DIR_MODE } else { STATE_PARENT_MODE };
            self.root.mkdir(&staged(d), mode)?;
        }
        let mut bytes = serde_json::to_vec_pretty(&self.state).expect("state serializes");
        bytes.push(b'\n');
        let state_file = host_join(&self.dir_host, "state.json");
        fsx::write_in(&self.root, &staged(&state_file), &bytes, 0o600, self.hook)?;
        rename_sibling(&self.root, &staging, first)?;
        self.hook.point("renamed", &self.root.shown(first));
        Ok(())
    }

    /// Makes `host_dir` (the state directory or its `backup/`) a root-only directory: created
    /// [`STATE_DIR_MODE`], an existing one narrowed to it, a link there refused.
    fn private_dir(&self, host_dir: &str) -> Result<()> {
        refuse_link(&self.root, host_dir)?;
        let dir = self
            .root
            .open()?
            .mkdir_all(Path::new(host_dir), STATE_DIR_MODE)
            .map_err(Error::host(self.root.shown(host_dir)))?;
        let proc = dir.proc_path();
        let meta = std::fs::metadata(&proc).map_err(Error::io("inspect", self.root.shown(host_dir)))?;
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o7777 != STATE_DIR_MODE {
            std::fs::set_permissions(&proc, std::fs::Permissions::from_mode(STATE_DIR_MODE))
                .map_err(Error::io("chmod", self.root.shown(host_dir)))?;
        }
        Ok(())
    }

    fn entry_index(&self, path: &str) -> Option<usize> {
        self.state.entries.iter().position(|e| e.path == path)
    }

    /// The recorded change of `host_path`, if any.
    pub fn entry(&self, host_path: &str) -> Option<&Entry> {
        self.state.entries.iter().find(|e| e.path == host_path)
    }

    fn upsert(&mut self, entry: Entry) {
        match self.entry_index(&entry.path) {
            Some(i) => self.state.entries[i] = entry,
            None => self.state.entries.push(entry),
        }
    }

    /// Marks a recorded path as still wanted by this run (so [`Ledger::drop_untouched`] keeps it).
    pub fn keep(&mut self, host_path: &str) {
        self.touched.insert(host_path.to_owned());
    }

    /// Host paths recorded with `role` (by this run or earlier installs).
    pub fn paths_with_role(&self, role: Role) -> Vec<String> {
        self.state.entries.iter().filter(|e| e.role == role).map(|e| e.path.clone()).collect()
    }

    /// Creates `host_dir` and missing parents, each with exactly `mode` (whatever the umask),
    /// recording the ones it created.
    pub fn ensure_dir(&mut self, host_dir: &str, mode: u32) -> Result<()> {
        let mut missing = Vec::new();
        let mut cur = Some(PathBuf::from(host_dir));
        while let Some(d) = cur {
            if self.root.metadata(&d.to_string_lossy())?.is_some() {
                break;
            }
            missing.push(d.to_string_lossy().into_owned());
            cur = d.parent().map(Path::to_path_buf);
        }
        missing.reverse();
        let mut recorded = false;
        for d in &missing {
            self.touched.insert(d.clone());
            if self.entry(d).is_none() {
                self.upsert(Entry {
                    path: d.clone(),
                    kind: Kind::Dir,
                    role: Role::Dir,
                    before: None,
                    after: None,
                    backup: None,
                });
                recorded = true;
            }
        }
        if recorded {
            self.save()?;
        }
        for d in &missing {
            self.root.mkdir(d, mode)?;
        }
        // Directories recorded earlier and still present stay ours (and touched).
        let mut cur = Some(PathBuf::from(host_dir));
        while let Some(d) = cur {
            let key = d.to_string_lossy().into_owned();
            if self.entry(&key).is_some_and(|e| e.kind == Kind::Dir) {
                self.touched.insert(key);
            }
            cur = d.parent().map(Path::to_path_buf);
        }
        Ok(())
    }

    /// Writes `bytes` to `host_path` atomically, recording the change first. Writes nothing when
    /// the file already has these bytes.
    pub fn write_file(&mut self, host_path: &str, bytes: &[u8], mode: u32, role: Role) -> Result<Change> {
        self.touched.insert(host_path.to_owned());
        let current = self.root.read(host_path, role.read_limit())?;
        let new_hash = fsx::sha256_hex(bytes);
        if current.as_deref() == Some(bytes) {
            return Ok(Change::Unchanged);
        }
        let current_hash = current.as_deref().map(fsx::sha256_hex);
        let previous = self.entry(host_path).cloned();
        let entry = match previous {
            // The file is as we left it (or our earlier write never landed): keep the original.
            Some(mut e) if current_hash == e.after || current_hash == e.before => {
                e.after = Some(new_hash);
                e
            }
            _ => {
                let backup = match (&current, role.backs_up()) {
                    (Some(old), true) => Some(self.write_backup(host_path, old)?),
                    _ => None,
                };
                Entry {
                    path: host_path.to_owned(),
                    kind: Kind::File,
                    role,
                    before: current_hash,
                    after: Some(new_hash),
                    backup,
                }
            }
        };
        self.upsert(entry);
        self.save()?;
        fsx::write_in(&self.root, host_path, bytes, mode, self.hook)?;
        Ok(Change::Written)
    }

    fn backup_path(&self, name: &str) -> String {
        host_join(&host_join(&self.dir_host, "backup"), name)
    }

    fn write_backup(&self, host_path: &str, bytes: &[u8]) -> Result<String> {
        let name = fsx::sha256_hex(host_path.as_bytes());
        self.private_dir(&self.dir_host)?;
        self.private_dir(&host_join(&self.dir_host, "backup"))?;
        fsx::write_in(&self.root, &self.backup_path(&name), bytes, 0o600, self.hook)?;
        Ok(name)
    }

    /// Points `host_path` at `target` unless something else occupies it.
    pub fn symlink(&mut self, host_path: &str, target: &str, role: Role) -> Result<LinkOutcome> {
        let ours = self.entry(host_path).cloned();
        if let Some(meta) = self.root.symlink_metadata(host_path)? {
            let current = self.root.read_link(host_path)?;
            if current.as_deref() == Some(target) {
                if ours.is_some() {
                    self.touched.insert(host_path.to_owned());
                }
                return Ok(LinkOutcome::Present);
            }
            let is_our_old_link = meta.file_type().is_symlink()
                && ours.as_ref().is_some_and(|e| e.after.as_deref() == current.as_deref());
            if !is_our_old_link {
                return Ok(LinkOutcome::Occupied(current.unwrap_or_else(|| "a regular file".to_owned())));
            }
        }
        self.touched.insert(host_path.to_owned());
        self.upsert(Entry {
            path: host_path.to_owned(),
            kind: Kind::Symlink,
            role,
            before: None,
            after: Some(target.to_owned()),
            backup: None,
        });
        self.save()?;
        fsx::symlink_in(&self.root, target, host_path, self.hook)?;
        Ok(LinkOutcome::Created)
    }

    /// Undoes every recorded change that this install run did not touch again (left over from
    /// an earlier install with other settings). Returns whether containerd's config changed.
    pub fn drop_untouched(&mut self, warnings: &mut Vec<String>) -> Result<bool> {
        let stale: Vec<Entry> =
            self.state.entries.iter().filter(|e| !self.touched.contains(&e.path)).cloned().collect();
        let mut undo = Undo::default();
        for entry in stale.iter().rev() {
            self.undo_entry(entry, None, &mut undo, warnings)?;
        }
        Ok(undo.containerd_changed)
    }

    /// Undoes every recorded change, newest first.
    ///
    /// `remove_import` is called with the main file's current text when it changed since we wrote
    /// it; it returns the text without our `imports` entry (or `None` if it has none).
    pub fn uninstall(&mut self, remove_import: RemoveImport<'_>, warnings: &mut Vec<String>) -> Result<Undo> {
        let mut undo = Undo::default();
        let entries = self.state.entries.clone();
        for entry in entries.iter().rev() {
            self.undo_entry(entry, Some(remove_import), &mut undo, warnings)?;
        }
        Ok(undo)
    }

    /// Whether any recorded change is one of containerd's files.
    pub fn touches_containerd(&self) -> bool {
        self.state.entries.iter().any(|e| e.role.is_containerds())
    }

    /// After a complete uninstall: removes the state directory (nothing is recorded any more and
    /// no restart is owed).
    pub fn finish(&mut self) -> Result<()> {
        self.set_restart_pending(false)?;
        if self.state.entries.is_empty() && self.root.symlink_metadata(&self.dir_host)?.is_some() {
            // The state directory (root-only, ours: the state file and our backups) and the
            // created parents holding nothing else leave the host in one rename, so a run killed
            // while removing them leaves no state that forgot a parent: only a tree under a
            // known name, which the next load removes.
            let mut top = self.dir_host.clone();
            for d in self.state.created_parents.iter().rev() {
                let (_, child) = split(&top);
                match self.root.read_dir(d)?.as_deref() {
                    Some([(name, EntryType::Dir)]) if *name == child => top = d.clone(),
                    _ => break,
                }
            }
            let doomed = sibling_name(&top, OLD_STATE_PREFIX);
            remove_own_tree(&self.root, &doomed, self.hook)?;
            rename_sibling(&self.root, &top, &doomed)?;
            self.hook.point("renamed", &self.root.shown(&top));
            remove_own_tree(&self.root, &doomed, self.hook)?;
            // Parents made for the state directory carry nvinject's name (`/var/lib/nvinject`):
            // remove them too when empty, never a system directory above.
            let mut cur = Path::new(&self.dir_host).parent();
            while let Some(d) = cur {
                if !d.file_name().is_some_and(|n| n.to_string_lossy().contains("nvinject")) {
                    break;
                }
                if !self.root.remove_dir(&d.to_string_lossy())? {
                    break;
                }
                cur = d.parent();
            }
            // Then the parents the first save created (innermost first), while they are empty.
            for d in self.state.created_parents.iter().rev() {
                if self.root.symlink_metadata(d)?.is_some_and(|m| m.is_dir()) && !self.root.remove_dir(d)? {
                    break;
                }
            }
        }
        Ok(())
    }

    /// The lock file an earlier shim kept beside a spec (`<spec>.lock`): it goes with the spec we
    /// created, or the CDI directory would not be empty and would stay. Unlinking a name never
    /// follows a link planted there.
    fn remove_spec_lock(&self, spec: &str, undo: &mut Undo) -> Result<()> {
        let lock = format!("{spec}.lock");
        if self.root.symlink_metadata(&lock)?.is_some_and(|m| m.is_file()) {
            fsx::remove_in(&self.root, &lock, self.hook)?;
            undo.removed.push(lock);
        }
        Ok(())
    }

    fn forget(&mut self, path: &str) -> Result<()> {
        if let Some(i) = self.entry_index(path) {
            let entry = self.state.entries.remove(i);
            self.save()?;
            if let Some(name) = entry.backup {
                fsx::remove_in(&self.root, &self.backup_path(&name), self.hook)?;
            }
        }
        Ok(())
    }

    fn undo_entry(
        &mut self,
        entry: &Entry,
        remove_import: Option<RemoveImport<'_>>,
        undo: &mut Undo,
        warnings: &mut Vec<String>,
    ) -> Result<()> {
        // What is there now: a file's hash decides (and containerd's main file's text may be
        // edited), a link's target; a directory is only ever tried.
        let (now, content) = match entry.kind {
            Kind::Dir => (None, None),
            Kind::Symlink => (self.root.read_link(&entry.path)?, None),
            Kind::File => {
                let content = self.root.read(&entry.path, entry.role.read_limit())?;
                (content.as_deref().map(fsx::sha256_hex), content)
            }
        };
        match decide(entry, now.as_deref()) {
            UndoAction::Nothing => {}
            UndoAction::Restore { backup } => {
                let path = self.backup_path(&backup);
                let original = self.root.read(&path, FILE_LIMIT)?.ok_or_else(|| {
                    Error::io("read backup", self.root.shown(&path))(std::io::ErrorKind::NotFound.into())
                })?;
                fsx::write_in(&self.root, &entry.path, &original, 0o644, self.hook)?;
                undo.restored.push(entry.path.clone());
                undo.containerd_changed |= entry.role.is_containerds();
            }
            UndoAction::Remove { spec_lock } => {
                fsx::remove_in(&self.root, &entry.path, self.hook)?;
                undo.removed.push(entry.path.clone());
                if spec_lock {
                    self.remove_spec_lock(&entry.path, undo)?;
                }
                undo.containerd_changed |= entry.role.is_containerds();
            }
            UndoAction::RemoveDirIfEmpty => {
                if self.root.remove_dir(&entry.path)? {
                    undo.removed.push(entry.path.clone());
                } else if self.root.symlink_metadata(&entry.path)?.is_some() {
                    undo.kept.push((entry.path.clone(), "not empty".to_owned()));
                }
            }
            UndoAction::StripImport => {
                let text = String::from_utf8_lossy(content.as_deref().unwrap_or_default()).into_owned();
                match remove_import.map(|f| f(&text)).transpose()?.flatten() {
                    Some(new_text) => {
                        fsx::write_in(&self.root, &entry.path, new_text.as_bytes(), 0o644, self.hook)?;
                        undo.containerd_changed = true;
                        warnings.push(format!(
                            "{}: changed since install, so only nvinject's `imports` entry was removed \
                             (the rest is as it is now)",
                            entry.path
                        ));
                    }
                    None => undo.kept.push((entry.path.clone(), "changed since install".to_owned())),
                }
            }
            UndoAction::Keep { why, warn } => {
                if warn {
                    warnings.push(format!("{}: {why}; left as it is", entry.path));
                }
                undo.kept.push((entry.path.clone(), why.to_owned()));
            }
        }
        self.forget(&entry.path)
    }
}

/// Refuses a symlink at `host_path` (the state directory, its backups, the state file): state
/// is only ever where its configured path says, never where a planted link sends it.
fn refuse_link(root: &HostRoot, host_path: &str) -> Result<()> {
    match root.symlink_metadata(host_path)? {
        Some(m) if m.file_type().is_symlink() => Err(Error::NotOurs {
            path: root.shown(host_path),
            fix: "it is a symbolic link where the installer keeps its state: remove the link (or pass --state-dir)",
        }),
        Some(m) if !m.file_type().is_file() && !m.file_type().is_dir() => Err(Error::NotOurs {
            path: root.shown(host_path),
            fix: "it is neither a file nor a directory where the installer keeps its state: remove it",
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn setup() -> (tempfile::TempDir, HostRoot) {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        (dir, root)
    }

    fn no_import(_: &str) -> Result<Option<String>> {
        Ok(None)
    }

    #[test]
    fn modified_file_is_restored_byte_for_byte() {
        let (dir, root) = setup();
        fs::create_dir_all(dir.path().join("etc")).unwrap();
        fs::write(dir.path().join("etc/a.toml"), "original # comment\n").unwrap();
        let hook = FaultHook::none();
        let mut ledger = Ledger::load(&root, "/var/lib/nvinject", &hook).unwrap();
        assert_eq!(
            ledger.write_file("/etc/a.toml", b"changed", 0o644, Role::ContainerdMain).unwrap(),
            Change::Written
        );
        assert_eq!(
            ledger.write_file("/etc/a.toml", b"changed", 0o644, Role::ContainerdMain).unwrap(),
            Change::Unchanged
        );
        drop(ledger);
        let mut ledger = Ledger::load(&root, "/var/lib/nvinject", &hook).unwrap();
        let undo = ledger.uninstall(&no_import, &mut Vec::new()).unwrap();
        ledger.finish().unwrap();
        assert_eq!(undo.restored, vec!["/etc/a.toml".to_owned()]);
        assert_eq!(fs::read_to_string(dir.path().join("etc/a.toml")).unwrap(), "original # comment\n");
        assert!(!dir.path().join("var/lib/nvinject").exists(), "state dir left behind");
    }

    #[test]
    fn rewriting_keeps_the_first_original() {
        let (dir, root) = setup();
        fs::write(dir.path().join("a"), "v0").unwrap();
        let hook = FaultHook::none();
        let mut ledger = Ledger::load(&root, "/state", &hook).unwrap();
        ledger.write_file("/a", b"v1", 0o644, Role::CdiSpec).unwrap();
        ledger.write_file("/a", b"v2", 0o644, Role::CdiSpec).unwrap();
        ledger.uninstall(&no_import, &mut Vec::new()).unwrap();
        assert_eq!(fs::read_to_string(dir.path().join("a")).unwrap(), "v0");
    }

    #[test]
    fn a_file_changed_by_someone_else_is_kept() {
        let (dir, root) = setup();
        let hook = FaultHook::none();
        let mut ledger = Ledger::load(&root, "/state", &hook).unwrap();
        ledger.write_file("/config.toml", b"ours", 0o644, Role::RuntimeConfig).unwrap();
        fs::write(dir.path().join("config.toml"), "operator's").unwrap();
        let mut warnings = Vec::new();
        let undo = ledger.uninstall(&no_import, &mut warnings).unwrap();
        assert_eq!(fs::read_to_string(dir.path().join("config.toml")).unwrap(), "operator's");
        assert_eq!(undo.kept.len(), 1);
        assert!(warnings[0].contains("changed since install"));
    }

    #[test]
    fn main_config_changed_since_gets_only_our_import_removed() {
        let (dir, root) = setup();
        fs::write(dir.path().join("c.toml"), "a = 1\n").unwrap();
        let hook = FaultHook::none();
        let mut ledger = Ledger::load(&root, "/state", &hook).unwrap();
        ledger.write_file("/c.toml", b"a = 1\nimports = [\"/d\"]\n", 0o644, Role::ContainerdMain).unwrap();
        fs::write(dir.path().join("c.toml"), "a = 2\nimports = [\"/d\"]\n").unwrap();
        let strip =
            |text: &str| -> Result<Option<String>> { Ok(Some(text.replace("imports = [\"/d\"]\n", ""))) };
        let mut warnings = Vec::new();
        let undo = ledger.uninstall(&strip, &mut warnings).unwrap();
        assert!(undo.containerd_changed);
        assert_eq!(fs::read_to_string(dir.path().join("c.toml")).unwrap(), "a = 2\n");
    }

    #[test]
    fn created_dirs_and_links_are_removed_but_foreign_content_stays() {
        let (dir, root) = setup();
        let hook = FaultHook::none();
        let mut ledger = Ledger::load(&root, "/state", &hook).unwrap();
        ledger.ensure_dir("/etc/containerd/conf.d", 0o755).unwrap();
        ledger.write_file("/etc/containerd/conf.d/99.toml", b"x", 0o644, Role::DropIn).unwrap();
        assert_eq!(ledger.symlink("/etc/link", "/target", Role::ShimLink).unwrap(), LinkOutcome::Created);
        assert_eq!(ledger.symlink("/etc/link", "/target", Role::ShimLink).unwrap(), LinkOutcome::Present);
        fs::write(dir.path().join("etc/foreign"), "keep").unwrap();
        assert!(matches!(
            ledger.symlink("/etc/foreign", "/t", Role::ShimLink).unwrap(),
            LinkOutcome::Occupied(_)
        ));
        ledger.uninstall(&no_import, &mut Vec::new()).unwrap();
        assert!(!dir.path().join("etc/containerd").exists());
        assert!(!dir.path().join("etc/link").exists());
        assert_eq!(fs::read_to_string(dir.path().join("etc/foreign")).unwrap(), "keep");
    }

    #[test]
    fn entries_not_touched_by_a_new_install_are_undone() {
        let (dir, root) = setup();
        let hook = FaultHook::none();
        let mut ledger = Ledger::load(&root, "/state", &hook).unwrap();
        ledger.write_file("/old-drop-in.toml", b"x", 0o644, Role::DropIn).unwrap();
        drop(ledger);
        let mut ledger = Ledger::load(&root, "/state", &hook).unwrap();
        ledger.write_file("/new-drop-in.toml", b"x", 0o644, Role::DropIn).unwrap();
        assert!(ledger.drop_untouched(&mut Vec::new()).unwrap());
        assert!(!dir.path().join("old-drop-in.toml").exists());
        assert!(dir.path().join("new-drop-in.toml").exists());
        assert_eq!(ledger.state().entries.len(), 1);
    }

    #[test]
    fn a_created_spec_goes_with_its_lock_and_the_cdi_dirs_but_a_planted_lock_link_stays() {
        let (dir, root) = setup();
        let hook = FaultHook::none();
        let mut ledger = Ledger::load(&root, "/state", &hook).unwrap();
        ledger.ensure_dir("/var/run/cdi", 0o755).unwrap();
        ledger.write_file("/var/run/cdi/nvidia.com-gpu.json", b"{}", 0o644, Role::CdiSpec).unwrap();
        // The shim regenerated the spec and left its lock beside it.
        fs::write(dir.path().join("var/run/cdi/nvidia.com-gpu.json"), "{\"new\":1}").unwrap();
        fs::write(dir.path().join("var/run/cdi/nvidia.com-gpu.json.lock"), "").unwrap();
        let undo = ledger.uninstall(&no_import, &mut Vec::new()).unwrap();
        assert!(undo.removed.iter().any(|p| p.ends_with(".json.lock")), "{undo:?}");
        assert!(!dir.path().join("var").exists(), "the CDI dirs the install created are left");

        // A link where the lock would be is not ours: it (and so the directory) stays.
        let mut ledger = Ledger::load(&root, "/state", &hook).unwrap();
        ledger.ensure_dir("/cdi", 0o755).unwrap();
        ledger.write_file("/cdi/s.json", b"{}", 0o644, Role::CdiSpec).unwrap();
        fs::write(dir.path().join("target"), "keep").unwrap();
        std::os::unix::fs::symlink(dir.path().join("target"), dir.path().join("cdi/s.json.lock")).unwrap();
        ledger.uninstall(&no_import, &mut Vec::new()).unwrap();
        assert!(fs::symlink_metadata(dir.path().join("cdi/s.json.lock")).is_ok());
        assert_eq!(fs::read_to_string(dir.path().join("target")).unwrap(), "keep");
    }

    #[test]
    fn parents_the_state_dir_needed_are_removed_after_a_complete_uninstall_and_only_those() {
        let (dir, root) = setup();
        let hook = FaultHook::none();
        let mut ledger = Ledger::load(&root, "/var/lib/nvinject/installer", &hook).unwrap();
        ledger.write_file("/x", b"x", 0o644, Role::DropIn).unwrap();
        assert_eq!(ledger.state().created_parents, ["/var", "/var/lib", "/var/lib/nvinject"]);
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &str| fs::metadata(dir.path().join(p)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode("var/lib"), 0o755, "a system directory others traverse");
        assert_eq!(mode("var/lib/nvinject/installer"), STATE_DIR_MODE);
        assert_eq!(mode("var/lib/nvinject"), STATE_DIR_MODE, "nvinject's own directory");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(!names.iter().any(|n| n.to_string_lossy().starts_with(NEW_STATE_PREFIX)), "{names:?}");
        ledger.uninstall(&no_import, &mut Vec::new()).unwrap();
        ledger.finish().unwrap();
        let left: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.is_empty(), "a bare root is bare again: {left:?}");

        // Something put into a created parent since keeps it (and the parents above it).
        let mut ledger = Ledger::load(&root, "/var/lib/nvinject/installer", &hook).unwrap();
        ledger.write_file("/x", b"x", 0o644, Role::DropIn).unwrap();
        fs::write(dir.path().join("var/lib/other"), "").unwrap();
        ledger.uninstall(&no_import, &mut Vec::new()).unwrap();
        ledger.finish().unwrap();
        assert!(dir.path().join("var/lib/other").exists());
        assert!(!dir.path().join("var/lib/nvinject").exists());
    }

    #[test]
    fn parents_that_were_there_before_are_not_recorded() {
        let (dir, root) = setup();
        fs::create_dir_all(dir.path().join("var/lib")).unwrap();
        let hook = FaultHook::none();
        let mut ledger = Ledger::load(&root, "/var/lib/nvinject/installer", &hook).unwrap();
        ledger.write_file("/x", b"x", 0o644, Role::DropIn).unwrap();
        assert_eq!(ledger.state().created_parents, ["/var/lib/nvinject"]);
        ledger.uninstall(&no_import, &mut Vec::new()).unwrap();
        ledger.finish().unwrap();
        assert!(dir.path().join("var/lib").is_dir());
        assert!(!dir.path().join("var/lib/nvinject").exists());
    }

    #[test]
    fn a_staging_tree_left_by_a_killed_first_save_is_removed_and_not_mistaken_for_the_state() {
        let (dir, root) = setup();
        // A run killed after building the staging tree, before renaming it into place.
        let staging = dir.path().join(format!("{NEW_STATE_PREFIX}var"));
        let doomed = dir.path().join(format!("{OLD_STATE_PREFIX}var"));
        fs::create_dir_all(doomed.join("lib/nvinject/installer/backup")).unwrap();
        fs::write(doomed.join("lib/nvinject/installer/backup/1"), "old").unwrap();
        fs::create_dir_all(staging.join("lib/nvinject/installer")).unwrap();
        fs::write(staging.join("lib/nvinject/installer/state.json"), "{\"format\": 1, \"entries\": []}")
            .unwrap();
        std::os::unix::fs::symlink("/etc", staging.join("lib/link")).unwrap();
        fs::create_dir(dir.path().join("etc")).unwrap();
        fs::write(dir.path().join("etc/keep"), "keep").unwrap();
        let hook = FaultHook::none();
        let mut ledger = Ledger::load(&root, "/var/lib/nvinject/installer", &hook).unwrap();
        assert!(!staging.exists(), "load removes what a killed first save left");
        assert!(!doomed.exists(), "and what a killed uninstall left");
        assert_eq!(
            fs::read_to_string(dir.path().join("etc/keep")).unwrap(),
            "keep",
            "links are not followed"
        );
        ledger.write_file("/x", b"x", 0o644, Role::DropIn).unwrap();
        assert!(dir.path().join("var/lib/nvinject/installer/state.json").is_file());
        assert_eq!(ledger.state().created_parents, ["/var", "/var/lib", "/var/lib/nvinject"]);
    }
}
