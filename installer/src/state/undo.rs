//! How one recorded change is undone, decided from the record and what is at its path now, both
//! plain values: restore the original, remove ours, strip our `imports` entry, keep someone
//! else's, or nothing. The ledger reads the path, asks [`decide`], and carries the answer out;
//! the rules are here, with the table that lists them.
//!
//! A kill between recording a change and making it leaves an entry whose `after` the path does not
//! have, so the decision goes by what is there now, never by the record alone:
//! - now == after: the file is as we left it; restore the original (or remove it if there was none);
//! - now == before: our change never landed; nothing to undo;
//! - anything else: someone changed it since; keep their bytes (containerd's main file still gets
//!   our `imports` entry removed surgically). Files that are ours outright (our drop-in and
//!   binaries, a CDI spec we created) are removed whatever they hold.

use super::record::{Entry, Kind, Role};

/// What to do with one recorded change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UndoAction {
    /// Nothing to undo: the path is gone, or our change never landed.
    Nothing,
    /// Write the original bytes back from this backup (a name in the state directory's `backup/`).
    Restore {
        /// The backup's file name.
        backup: String,
    },
    /// Remove the file or link.
    Remove {
        /// Also remove the lock file a shim kept beside a spec we created (`<spec>.lock`), or the
        /// CDI directory would not be empty and would stay.
        spec_lock: bool,
    },
    /// Remove the directory if it is empty; one that is not stays (something else was put there).
    RemoveDirIfEmpty,
    /// containerd's main file changed since we wrote it: remove only our `imports` entry.
    StripImport,
    /// Leave it as it is, reported as kept.
    Keep {
        /// Why, for the report.
        why: &'static str,
        /// Whether the operator is also warned.
        warn: bool,
    },
}

/// The undo of `entry`, given what is at its path now: for a file the SHA-256 of its content, for
/// a link its target, `None` when nothing is there. A directory's is not looked at: it goes only if
/// empty, which removing it finds out.
pub fn decide(entry: &Entry, now: Option<&str>) -> UndoAction {
    match entry.kind {
        Kind::Dir => UndoAction::RemoveDirIfEmpty,
        Kind::Symlink => match now {
            None => UndoAction::Nothing,
            Some(target) if Some(target) == entry.after.as_deref() => UndoAction::Remove { spec_lock: false },
            Some(_) => UndoAction::Keep { why: "points elsewhere now", warn: false },
        },
        Kind::File => {
            // Already gone (or our write never landed).
            let Some(now) = now else { return UndoAction::Nothing };
            if Some(now) == entry.after.as_deref() || entry.owned() {
                match &entry.backup {
                    Some(backup) => UndoAction::Restore { backup: backup.clone() },
                    None if entry.before.is_some() && !entry.owned() => {
                        UndoAction::Keep { why: "no backup of the original", warn: false }
                    }
                    None => UndoAction::Remove { spec_lock: entry.role == Role::CdiSpec },
                }
            } else if Some(now) == entry.before.as_deref() {
                UndoAction::Nothing
            } else if entry.role == Role::ContainerdMain {
                UndoAction::StripImport
            } else {
                UndoAction::Keep { why: "changed since install", warn: true }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(role: Role, before: Option<&str>, after: &str, backup: Option<&str>) -> Entry {
        Entry {
            path: "/p".to_owned(),
            kind: Kind::File,
            role,
            before: before.map(str::to_owned),
            after: Some(after.to_owned()),
            backup: backup.map(str::to_owned),
        }
    }

    fn link(target: &str) -> Entry {
        Entry { kind: Kind::Symlink, ..file(Role::ShimLink, None, target, None) }
    }

    fn dir() -> Entry {
        Entry { kind: Kind::Dir, after: None, ..file(Role::Dir, None, "", None) }
    }

    #[test]
    fn each_record_and_finding_has_its_undo() {
        use Role::{Binary, CdiSpec, ContainerdMain, DropIn, RuntimeConfig};
        use UndoAction::{Keep, Nothing, RemoveDirIfEmpty, StripImport};
        let restore = || UndoAction::Restore { backup: "b".to_owned() };
        let remove = |spec_lock| UndoAction::Remove { spec_lock };
        let changed = || Keep { why: "changed since install", warn: true };
        let no_backup = Keep { why: "no backup of the original", warn: false };
        let elsewhere = Keep { why: "points elsewhere now", warn: false };
        // One case a line, so the rules read as a table: (case, the record (role, before, after,
        // backup), found now (a file's hash, a link's target), the undo).
        #[rustfmt::skip]
        let cases: Vec<(&str, Entry, Option<&str>, UndoAction)> = vec![
            ("a file gone since", file(RuntimeConfig, None, "h1", None), None, Nothing),
            ("our drop-in gone since", file(DropIn, None, "h1", None), None, Nothing),
            ("a file as we wrote it, with a backup", file(ContainerdMain, Some("h0"), "h1", Some("b")), Some("h1"), restore()),
            ("a file we created, as we wrote it", file(RuntimeConfig, None, "h1", None), Some("h1"), remove(false)),
            ("a file we replaced, with no backup", file(RuntimeConfig, Some("h0"), "h1", None), Some("h1"), no_backup),
            ("our change never landed", file(RuntimeConfig, Some("h0"), "h1", Some("b")), Some("h0"), Nothing),
            ("containerd's main file, edited since", file(ContainerdMain, Some("h0"), "h1", Some("b")), Some("h2"), StripImport),
            ("containerd's main file we created, edited since", file(ContainerdMain, None, "h1", None), Some("h2"), StripImport),
            ("the runtime config, edited since", file(RuntimeConfig, None, "h1", None), Some("h2"), changed()),
            ("our drop-in, edited since: ours outright", file(DropIn, None, "h1", None), Some("h2"), remove(false)),
            ("a binary that replaced another, changed since: ours", file(Binary, Some("h0"), "h1", None), Some("h2"), remove(false)),
            ("a spec we created, regenerated by the shim", file(CdiSpec, None, "h1", None), Some("h2"), remove(true)),
            ("a spec we created, as we wrote it", file(CdiSpec, None, "h1", None), Some("h1"), remove(true)),
            ("a spec that replaced another, as we wrote it", file(CdiSpec, Some("h0"), "h1", Some("b")), Some("h1"), restore()),
            ("a spec that replaced another, edited since", file(CdiSpec, Some("h0"), "h1", Some("b")), Some("h2"), changed()),
            ("our link, as we placed it", link("/t"), Some("/t"), remove(false)),
            ("our link, pointed elsewhere since", link("/t"), Some("/other"), elsewhere),
            ("our link, gone since", link("/t"), None, Nothing),
            ("a directory we created", dir(), None, RemoveDirIfEmpty),
        ];
        for (case, entry, now, want) in cases {
            assert_eq!(decide(&entry, now), want, "{case}");
        }
    }
}
