//! Replacing a file or a symlink atomically, with the options that differ between callers.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::WriteError;
use crate::temp::{Temp, split};

/// How much of a write survives a power cut or kernel crash (readers always see the old bytes
/// or the new ones while the machine stays up, whatever the level).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Nothing is flushed. After a crash the file may hold the old bytes, the new ones, or be empty.
    /// For files that do not outlive a reboot (tmpfs, containerd's bundle directories) and hot paths.
    None,
    /// The data is flushed before the rename: after a crash the name holds the old complete file
    /// or the new complete one, but the rename itself may be undone (the old file comes back).
    File,
    /// The data is flushed, and the directory after the rename: once the write returns, the new
    /// file survives a crash. One more disk flush than [`Durability::File`].
    FileAndDir,
}

/// How [`write_atomic`] writes. The differences between callers are deliberate (a container-start
/// hot path, a spec regenerated on demand, an installer that must never lose a config), so each
/// caller states its own; [`WriteOptions::new`] is the safe default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    /// Permission bits of the file (exactly these: the umask does not reduce them).
    pub mode: u32,
    /// What is flushed to disk.
    pub durability: Durability,
    /// Whether missing parent directories are created (mode exactly 0755, whatever the umask).
    pub create_dirs: bool,
    /// Whether an existing file keeps its permission bits and owner instead of getting `mode` and
    /// the writer's owner (a config file an administrator made 0600 stays 0600).
    pub keep_existing_mode_and_owner: bool,
}

impl WriteOptions {
    /// A file with `mode`, fully durable ([`Durability::FileAndDir`]), in an existing directory,
    /// replacing whatever mode and owner an existing file had.
    pub const fn new(mode: u32) -> Self {
        WriteOptions {
            mode,
            durability: Durability::FileAndDir,
            create_dirs: false,
            keep_existing_mode_and_owner: false,
        }
    }

    /// The same options with `durability`.
    pub const fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// The same options, creating missing parent directories (or not).
    pub const fn create_dirs(mut self, create: bool) -> Self {
        self.create_dirs = create;
        self
    }

    /// The same options, keeping an existing file's mode and owner (or not).
    pub const fn keep_existing_mode_and_owner(mut self, keep: bool) -> Self {
        self.keep_existing_mode_and_owner = keep;
        self
    }
}

/// The two moments of a replacement that a caller may want to act on (the installer's
/// fault-injection hook kills itself at each, to prove a kill anywhere leaves readable files).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteStep {
    /// The temp file (or temp symlink) is complete, flushed as asked, and not yet renamed: the
    /// target still holds the old content.
    TempWritten,
    /// The target holds the new content (and the directory is flushed, if asked).
    Renamed,
}

impl WriteStep {
    /// The step in words: `temp written`, `renamed`.
    pub fn label(self) -> &'static str {
        match self {
            WriteStep::TempWritten => "temp written",
            WriteStep::Renamed => "renamed",
        }
    }
}

impl std::fmt::Display for WriteStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Replaces `path` with `bytes` atomically: the bytes go to a fresh temp file in the same
/// directory, which is renamed over `path`. Readers see the old file or the new one, never a
/// mix; on failure `path` is untouched and the temp file removed.
pub fn write_atomic(path: &Path, bytes: &[u8], options: &WriteOptions) -> Result<(), WriteError> {
    write_atomic_with(path, bytes, options, &mut |_, _| {})
}

/// [`write_atomic`], calling `on_step` with the target path at each [`WriteStep`].
pub fn write_atomic_with(
    path: &Path,
    bytes: &[u8],
    options: &WriteOptions,
    on_step: &mut dyn FnMut(WriteStep, &Path),
) -> Result<(), WriteError> {
    write_with(path, bytes, options, on_step, &mut DiskFlush)
}

/// Points `link` at `target` atomically: a symlink made under a temp name in the same directory
/// is renamed over `link`, which may be a symlink or file already there. Calls `on_step` like
/// [`write_atomic_with`]. `durability` is honoured as far as it applies to a symlink, which
/// holds no data: [`Durability::FileAndDir`] flushes the directory after the rename, the other
/// levels flush nothing.
pub fn symlink_atomic(
    target: &Path,
    link: &Path,
    durability: Durability,
    on_step: &mut dyn FnMut(WriteStep, &Path),
) -> Result<(), WriteError> {
    let err = |step: &'static str| move |source| WriteError::new(link, step, source);
    let (dir, name) = split(link)?;
    let (temp, ()) = Temp::create(dir, name, |p| std::os::unix::fs::symlink(target, p))
        .map_err(err("create temporary symlink"))?;
    on_step(WriteStep::TempWritten, link);
    temp.rename_to(link).map_err(err("rename"))?;
    if durability == Durability::FileAndDir {
        flush_dir(&mut DiskFlush, dir, link);
    }
    on_step(WriteStep::Renamed, link);
    tracing::debug!(link = %link.display(), target = %target.display(), "symlink replaced atomically");
    Ok(())
}

/// Flushes the directory holding `path`, so a rename or removal in it survives a crash (without
/// it a power cut can bring the old name back). For callers that remove files durably.
pub fn sync_parent_dir(path: &Path) -> Result<(), WriteError> {
    let (dir, _) = split(path)?;
    DiskFlush.dir(dir).map_err(|e| WriteError::new(path, "fsync directory", e))
}

/// The disk flushes, behind a seam so tests can see which ones a write asks for.
trait Flush {
    fn file(&mut self, file: &File) -> io::Result<()>;
    fn dir(&mut self, dir: &Path) -> io::Result<()>;
}

struct DiskFlush;

impl Flush for DiskFlush {
    fn file(&mut self, file: &File) -> io::Result<()> {
        file.sync_all()
    }

    fn dir(&mut self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// Flushes `dir` after a rename. Best effort: the new file is already in place, so a failure
/// (some file systems refuse fsync on directories) is logged rather than reported as a failed write.
fn flush_dir(flush: &mut dyn Flush, dir: &Path, target: &Path) {
    if let Err(error) = flush.dir(dir) {
        tracing::warn!(path = %target.display(), dir = %dir.display(), %error, "cannot fsync the directory after a rename; the new file is in place but may not survive a power cut");
    }
}

fn write_with(
    path: &Path,
    bytes: &[u8],
    options: &WriteOptions,
    on_step: &mut dyn FnMut(WriteStep, &Path),
    flush: &mut dyn Flush,
) -> Result<(), WriteError> {
    let err = |step: &'static str| move |source| WriteError::new(path, step, source);
    let (dir, name) = split(path)?;
    if options.create_dirs {
        create_dirs_exact(dir, 0o755)
            .map_err(|e| match e.kind() {
                // create_dir_all reports a file in the way as EEXIST; say what it means.
                io::ErrorKind::AlreadyExists => io::Error::new(
                    io::ErrorKind::NotADirectory,
                    format!("{} exists and is not a directory", dir.display()),
                ),
                _ => e,
            })
            .map_err(err("create directory"))?;
    }
    let existing = if options.keep_existing_mode_and_owner {
        match fs::metadata(path) {
            Ok(meta) => Some(meta),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(err("inspect the existing file")(e)),
        }
    } else {
        None
    };
    let mode = existing.as_ref().map_or(options.mode, |m| m.mode() & 0o7777);
    let (temp, mut file) =
        Temp::create(dir, name, |p| OpenOptions::new().write(true).create_new(true).mode(mode).open(p))
            .map_err(err("create temporary file"))?;
    file.write_all(bytes).map_err(err("write"))?;
    if let Some(meta) = &existing {
        // Only when it differs: a writer that is not root can still keep its own files' owner.
        let now = file.metadata().map_err(err("chown"))?;
        if (now.uid(), now.gid()) != (meta.uid(), meta.gid()) {
            std::os::unix::fs::fchown(&file, Some(meta.uid()), Some(meta.gid())).map_err(err("chown"))?;
        }
    }
    // After the chown, which clears set-id bits; and exactly `mode`, which the umask reduced at creation.
    file.set_permissions(fs::Permissions::from_mode(mode)).map_err(err("chmod"))?;
    if options.durability != Durability::None {
        flush.file(&file).map_err(err("fsync"))?;
    }
    drop(file);
    on_step(WriteStep::TempWritten, path);
    temp.rename_to(path).map_err(err("rename"))?;
    if options.durability == Durability::FileAndDir {
        flush_dir(flush, dir, path);
    }
    on_step(WriteStep::Renamed, path);
    tracing::debug!(path = %path.display(), bytes = bytes.len(), "written atomically");
    Ok(())
}

/// `create_dir_all`, with every directory it creates given exactly `mode`: under `umask 000` a plain
/// `create_dir_all` would leave world-writable directories above files root reads.
fn create_dirs_exact(dir: &Path, mode: u32) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dirs_exact(parent, mode)?;
    }
    match fs::create_dir(dir) {
        Ok(()) => fs::set_permissions(dir, fs::Permissions::from_mode(mode)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[test]
    fn created_directories_get_0755_whatever_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("a/b/spec.json");
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o000));
        let result = write_atomic(&target, b"{}", &WriteOptions::new(0o644).create_dirs(true));
        nix::sys::stat::umask(old);
        result.unwrap();
        for d in ["a", "a/b"] {
            assert_eq!(fs::metadata(dir.path().join(d)).unwrap().mode() & 0o7777, 0o755, "{d}");
        }
        assert_eq!(fs::metadata(&target).unwrap().mode() & 0o7777, 0o644);
    }

    fn names(dir: &Path) -> Vec<OsString> {
        let mut names: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        names
    }

    fn mode_of(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn replaces_the_file_and_leaves_no_temp_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        fs::write(&path, b"old").unwrap();
        write_atomic(&path, b"new", &WriteOptions::new(0o640)).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(mode_of(&path), 0o640);
        assert_eq!(names(dir.path()), ["config.json"]);
    }

    #[test]
    fn a_new_file_gets_exactly_the_mode_asked_for() {
        // 0666 is what a umask (022 by default) cuts down; the file must still get 0666.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shared");
        write_atomic(&path, b"x", &WriteOptions::new(0o666)).unwrap();
        assert_eq!(mode_of(&path), 0o666);
        write_atomic(&path, b"y", &WriteOptions::new(0o755)).unwrap();
        assert_eq!(mode_of(&path), 0o755, "without keep_existing_mode_and_owner the mode asked for wins");
    }

    #[test]
    #[ignore = "needs root"]
    fn keep_existing_mode_and_owner_keeps_both() {
        nvinject_test_support::require_root("chown");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        fs::write(&path, b"old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&path, Some(1234), Some(5678)).unwrap();
        let keep = WriteOptions::new(0o644).keep_existing_mode_and_owner(true);
        write_atomic(&path, b"new", &keep).unwrap();
        let meta = fs::metadata(&path).unwrap();
        assert_eq!((meta.mode() & 0o7777, meta.uid(), meta.gid()), (0o600, 1234, 5678));
        assert_eq!(fs::read(&path).unwrap(), b"new");

        // A new file gets the mode asked for and the writer as owner.
        let fresh = dir.path().join("fresh.toml");
        write_atomic(&fresh, b"x", &keep).unwrap();
        let meta = fs::metadata(&fresh).unwrap();
        assert_eq!((meta.mode() & 0o7777, meta.uid()), (0o644, 0));

        // Without the option, the writer's owner and the mode asked for replace them.
        write_atomic(&path, b"newer", &WriteOptions::new(0o644)).unwrap();
        let meta = fs::metadata(&path).unwrap();
        assert_eq!((meta.mode() & 0o7777, meta.uid(), meta.gid()), (0o644, 0, 0));
    }

    #[test]
    fn create_dirs_makes_missing_parents_and_without_it_the_write_fails() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("etc/cdi/nvidia.yaml");
        let err = write_atomic(&path, b"x", &WriteOptions::new(0o644)).unwrap_err();
        assert_eq!(err.step, "create temporary file");
        assert!(err.to_string().ends_with("(the directory does not exist: create it first)"), "{err}");
        write_atomic(&path, b"x", &WriteOptions::new(0o644).create_dirs(true)).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"x");
        assert_eq!(names(&dir.path().join("etc/cdi")), ["nvidia.yaml"]);
    }

    #[test]
    fn a_file_in_the_way_of_a_directory_is_named() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("file"), b"").unwrap();
        let path = dir.path().join("file/nvidia.yaml");
        let err = write_atomic(&path, b"x", &WriteOptions::new(0o644).create_dirs(true)).unwrap_err();
        assert_eq!(err.step, "create directory");
        let text = err.to_string();
        assert!(text.starts_with(&format!("cannot write {}: create directory failed: ", path.display())));
        assert!(text.contains("file exists and is not a directory"), "{text}");
        assert!(text.ends_with("(a path component is a file, not a directory)"), "{text}");
    }

    #[test]
    fn a_failed_rename_keeps_the_target_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        // A non-empty directory of the target's name: everything up to the rename succeeds.
        let target = dir.path().join("spec.json");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("keep"), b"x").unwrap();
        let mut steps = Vec::new();
        let err = write_atomic_with(&target, b"new", &WriteOptions::new(0o644), &mut |s, _| steps.push(s))
            .unwrap_err();
        assert_eq!(err.step, "rename");
        assert!(
            err.to_string().starts_with(&format!("cannot write {}: rename failed: ", target.display())),
            "{err}"
        );
        assert_eq!(steps, [WriteStep::TempWritten], "Renamed reported for a failed rename");
        assert_eq!(fs::read(target.join("keep")).unwrap(), b"x");
        assert_eq!(names(dir.path()), ["spec.json"]);
    }

    #[test]
    fn a_panic_between_the_steps_keeps_the_old_file_and_removes_the_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        fs::write(&path, b"old").unwrap();
        let result = std::panic::catch_unwind(|| {
            write_atomic_with(&path, b"new", &WriteOptions::new(0o644), &mut |_, _| panic!("killed"))
        });
        assert!(result.is_err());
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert_eq!(names(dir.path()), ["config.toml"]);
    }

    #[test]
    fn steps_come_with_the_target_in_the_state_they_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("drop-in.toml");
        fs::write(&path, b"old").unwrap();
        let mut seen = Vec::new();
        write_atomic_with(&path, b"new", &WriteOptions::new(0o644), &mut |step, p| {
            let temps = fs::read_dir(p.parent().unwrap()).unwrap().count() - 1;
            seen.push((step, p.to_owned(), fs::read(p).unwrap(), temps));
        })
        .unwrap();
        assert_eq!(
            seen,
            [
                (WriteStep::TempWritten, path.clone(), b"old".to_vec(), 1),
                (WriteStep::Renamed, path.clone(), b"new".to_vec(), 0),
            ]
        );
        assert_eq!(WriteStep::TempWritten.to_string(), "temp written");
        assert_eq!(WriteStep::Renamed.label(), "renamed");
    }

    /// Records which flushes a write asks for, in order, around the steps.
    #[derive(Default)]
    struct Recorder(Vec<&'static str>);

    impl Flush for Recorder {
        fn file(&mut self, _: &File) -> io::Result<()> {
            self.0.push("fsync file");
            Ok(())
        }
        fn dir(&mut self, _: &Path) -> io::Result<()> {
            self.0.push("fsync dir");
            Ok(())
        }
    }

    fn flushes(durability: Durability) -> Vec<&'static str> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut flush = Recorder::default();
        let mut steps = Vec::new();
        write_with(
            &path,
            b"x",
            &WriteOptions::new(0o644).durability(durability),
            &mut |s, _| steps.push(s),
            &mut flush,
        )
        .unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"x");
        assert_eq!(steps, [WriteStep::TempWritten, WriteStep::Renamed]);
        flush.0
    }

    #[test]
    fn durability_decides_the_flushes() {
        assert_eq!(flushes(Durability::None), Vec::<&str>::new());
        assert_eq!(flushes(Durability::File), ["fsync file"]);
        assert_eq!(flushes(Durability::FileAndDir), ["fsync file", "fsync dir"]);
        assert_eq!(
            WriteOptions::new(0o600).durability,
            Durability::FileAndDir,
            "the default is the safe one"
        );
    }

    #[test]
    fn a_failed_directory_flush_does_not_fail_a_write_that_happened() {
        struct NoDirSync;
        impl Flush for NoDirSync {
            fn file(&mut self, _: &File) -> io::Result<()> {
                Ok(())
            }
            fn dir(&mut self, _: &Path) -> io::Result<()> {
                Err(io::ErrorKind::InvalidInput.into())
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_with(&path, b"x", &WriteOptions::new(0o644), &mut |_, _| {}, &mut NoDirSync).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"x");
    }

    #[test]
    fn a_failed_file_flush_fails_the_write_before_the_rename() {
        struct Broken;
        impl Flush for Broken {
            fn file(&mut self, _: &File) -> io::Result<()> {
                Err(io::Error::from_raw_os_error(nix::errno::Errno::EIO as i32))
            }
            fn dir(&mut self, _: &Path) -> io::Result<()> {
                Ok(())
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        fs::write(&path, b"old").unwrap();
        let err =
            write_with(&path, b"x", &WriteOptions::new(0o644), &mut |_, _| {}, &mut Broken).unwrap_err();
        assert_eq!(err.step, "fsync");
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert_eq!(names(dir.path()), ["f"]);
    }

    #[test]
    fn concurrent_writers_never_collide() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nvidia.com-gpu.json");
        let options = WriteOptions::new(0o644).durability(Durability::None);
        std::thread::scope(|s| {
            for t in 0..8u8 {
                let path = &path;
                s.spawn(move || {
                    for _ in 0..50 {
                        write_atomic(path, &[t; 4096], &options).unwrap();
                    }
                });
            }
        });
        let bytes = fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 4096);
        assert!(bytes.iter().all(|b| *b == bytes[0]), "the file mixes two writers' bytes");
        assert_eq!(names(dir.path()), ["nvidia.com-gpu.json"]);
    }

    #[test]
    fn a_path_without_a_file_name_is_refused() {
        let err = write_atomic(Path::new(""), b"x", &WriteOptions::new(0o644)).unwrap_err();
        assert_eq!(err.step, "name the file");
    }

    #[test]
    fn symlinks_are_replaced_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("195:0");
        let mut steps = Vec::new();
        symlink_atomic(Path::new("../nvidia0"), &link, Durability::None, &mut |s, _| steps.push(s)).unwrap();
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("../nvidia0"));
        symlink_atomic(Path::new("../nvidia1"), &link, Durability::FileAndDir, &mut |s, _| steps.push(s))
            .unwrap();
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("../nvidia1"));
        assert_eq!(
            steps,
            [WriteStep::TempWritten, WriteStep::Renamed, WriteStep::TempWritten, WriteStep::Renamed]
        );
        assert_eq!(names(dir.path()), ["195:0"]);
        let err =
            symlink_atomic(Path::new("x"), &dir.path().join("absent/link"), Durability::None, &mut |_, _| {})
                .unwrap_err();
        assert_eq!(err.step, "create temporary symlink");
    }

    #[test]
    fn sync_parent_dir_names_a_missing_directory() {
        let dir = tempfile::tempdir().unwrap();
        sync_parent_dir(&dir.path().join("removed-file")).unwrap();
        let err = sync_parent_dir(&dir.path().join("absent/file")).unwrap_err();
        assert_eq!(err.step, "fsync directory");
    }
}
