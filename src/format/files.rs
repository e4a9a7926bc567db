//! Where a task's kernels may touch the filesystem.
//!
//! A task's clients name paths: `SaveV2`'s prefix, `MergeV2Checkpoints`' sources and
//! destination, a summary writer's log directory, a `TFRecordDataset`'s files, a vocabulary
//! file. TensorFlow lets them name any path the daemon's user can reach, and so does tessera by
//! default ([`Files::ambient`]). A task holds two confinements, each a [`Files`] naming its own
//! config key: the checkpoint and summary kernels (and `WriteFile`) write through one
//! (`[checkpoints] allowed_dirs`, [`ALLOWED_DIRS_KEY`]), the kernels that only read input
//! (`tf.data` file sources, `ReadFile`, `InitializeTableFromTextFileV2`) read through the other
//! (`[data] allowed_dirs`, [`DATA_ALLOWED_DIRS_KEY`]; the server decides its directories, see
//! `DataConfig::read_dirs`). A confined one ([`Files::confined`], [`Files::confined_as`]) checks
//! every file its kernels touch:
//!
//! * [`Files::resolve`] checks a path before anything is touched: it is made absolute, its
//!   longest existing ancestor canonicalised (symlinks and `..` resolved as the OS resolves
//!   them), the rest appended, and the result must lie under one of the allowed directories;
//!   otherwise PERMISSION_DENIED names the path and the key.
//! * The [`Target`] it returns then reaches the file through a directory handle opened once at
//!   start (cap-std, which opens beneath that handle with `openat2`'s `RESOLVE_BENEATH` or
//!   its own component walk), never through the path again. A directory swapped for a symlink
//!   between the check and the use cannot lead outside: the open fails instead.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use cap_std::ambient_authority;
use cap_std::fs::Dir;

use crate::error::{Result, Status};

/// The config key that confines the checkpoint and summary kernels' paths; errors name it.
pub const ALLOWED_DIRS_KEY: &str = "checkpoints.allowed_dirs";

/// The config key that confines the paths the input kernels read; errors name it.
pub const DATA_ALLOWED_DIRS_KEY: &str = "data.allowed_dirs";

/// [`Files::ambient`], for contexts that borrow one.
pub static AMBIENT: Files = Files::ambient();

/// Which paths a task's kernels may touch through it.
#[derive(Clone, Debug)]
pub struct Files {
    /// `None`: any path (TensorFlow's behaviour).
    roots: Option<Arc<[Root]>>,
    /// The config key that lists the directories (`checkpoints.allowed_dirs`); refusals
    /// name it.
    key: &'static str,
    /// How the task's operator allows another directory (a refused path's message ends
    /// with it); `None`: the cluster file's key.
    widen: Option<Arc<str>>,
}

impl Default for Files {
    fn default() -> Self {
        Self::ambient()
    }
}

/// Two confinements are equal when they allow the same directories.
impl PartialEq for Files {
    fn eq(&self, other: &Self) -> bool {
        self.is_confined() == other.is_confined() && self.allowed_dirs() == other.allowed_dirs()
    }
}

/// One allowed directory: its canonical path and a handle opened on it at start.
#[derive(Clone, Debug)]
struct Root {
    path: PathBuf,
    dir: Arc<Dir>,
}

/// A checked path, ready to be used.
#[derive(Clone, Debug)]
pub struct Target {
    /// The path as the client gave it, for messages.
    shown: PathBuf,
    place: Place,
}

#[derive(Clone, Debug)]
enum Place {
    /// Any path: the ordinary filesystem calls.
    Ambient,
    /// `relative` beneath an allowed directory's handle (`.` for the directory itself).
    Beneath { dir: Arc<Dir>, relative: PathBuf },
}

impl Files {
    /// Any path the daemon's user can reach.
    pub const fn ambient() -> Self {
        Self {
            roots: None,
            key: ALLOWED_DIRS_KEY,
            widen: None,
        }
    }

    /// The same confinement, a refused path's message ending with `how` another directory
    /// is allowed (`tessera train` names its `--checkpoint_dir` and the task).
    pub fn widened_by(mut self, how: impl Into<String>) -> Self {
        self.widen = Some(how.into().into());
        self
    }

    /// Only paths under `dirs` (`[checkpoints] allowed_dirs`), each of which must exist and
    /// be a directory; an error names the one that is not.
    pub fn confined(dirs: &[PathBuf]) -> Result<Self> {
        Self::confined_as(ALLOWED_DIRS_KEY, dirs)
    }

    /// Only paths under `dirs`, the directories the config key `key` lists
    /// (`data.allowed_dirs`), which its refusals name; each must exist and be a directory.
    pub fn confined_as(key: &'static str, dirs: &[PathBuf]) -> Result<Self> {
        let mut roots = Vec::with_capacity(dirs.len());
        for dir in dirs {
            let refuse = |e: io::Error| {
                Status::failed_precondition(format!(
                    "{key}: cannot open directory `{}`: {e}; create it, or list only \
                     directories that exist",
                    dir.display()
                ))
            };
            let path = fs::canonicalize(dir).map_err(refuse)?;
            let handle = Dir::open_ambient_dir(&path, ambient_authority()).map_err(refuse)?;
            roots.push(Root {
                path,
                dir: Arc::new(handle),
            });
        }
        Ok(Self {
            roots: Some(roots.into()),
            key,
            widen: None,
        })
    }

    /// The config key that lists the allowed directories (`checkpoints.allowed_dirs`).
    pub fn key(&self) -> &'static str {
        self.key
    }

    /// Whether paths are confined.
    pub fn is_confined(&self) -> bool {
        self.roots.is_some()
    }

    /// The allowed directories, canonical; empty when unconfined.
    pub fn allowed_dirs(&self) -> Vec<&Path> {
        self.roots
            .iter()
            .flat_map(|roots| roots.iter().map(|r| r.path.as_path()))
            .collect()
    }

    /// Checks `path` (see the module doc) and returns what reaches it; PERMISSION_DENIED
    /// naming the path, where it leads and the key when it is outside the allowed directories.
    pub fn resolve(&self, path: impl AsRef<Path>) -> Result<Target> {
        let shown = path.as_ref().to_path_buf();
        let Some(roots) = &self.roots else {
            return Ok(Target {
                shown,
                place: Place::Ambient,
            });
        };
        let full = canonical_prefix(&shown).map_err(|e| {
            Status::permission_denied(format!(
                "cannot check path `{}` against {}: {e}",
                shown.display(),
                self.key
            ))
        })?;
        for root in roots.iter() {
            if let Ok(relative) = full.strip_prefix(&root.path) {
                let relative = if relative.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    relative.to_path_buf()
                };
                return Ok(Target {
                    shown,
                    place: Place::Beneath {
                        dir: Arc::clone(&root.dir),
                        relative,
                    },
                });
            }
        }
        let allowed: Vec<String> = roots
            .iter()
            .map(|r| format!("\"{}\"", r.path.display()))
            .collect();
        let widen = match &self.widen {
            Some(how) => how.to_string(),
            None => {
                let (section, name) = self.key.split_once('.').unwrap_or(("", self.key));
                format!("add this one to [{section}] {name} in the task's cluster file")
            }
        };
        Err(Status::permission_denied(format!(
            "path `{}` (resolved to `{}`) is outside {} = [{}]; use a path under one of those \
             directories, or {widen}",
            shown.display(),
            full.display(),
            self.key,
            allowed.join(", ")
        )))
    }
}

/// `path` made absolute, with its longest existing ancestor canonicalised and the components
/// after it appended (`.` dropped, `..` removing the one before).
fn canonical_prefix(path: &Path) -> io::Result<PathBuf> {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let components: Vec<Component<'_>> = absolute.components().collect();
    for split in (1..=components.len()).rev() {
        let head: PathBuf = components[..split].iter().collect();
        let Ok(mut full) = fs::canonicalize(&head) else {
            continue;
        };
        for component in &components[split..] {
            match component {
                Component::Normal(name) => full.push(name),
                Component::ParentDir => {
                    full.pop();
                }
                _ => {}
            }
        }
        return Ok(full);
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        "no part of the path exists",
    ))
}

impl Target {
    /// The path as given.
    pub fn path(&self) -> &Path {
        &self.shown
    }

    /// Creates (or truncates) the file for writing.
    pub fn create(&self) -> io::Result<fs::File> {
        match &self.place {
            Place::Ambient => fs::File::create(&self.shown),
            Place::Beneath { dir, relative } => dir.create(relative).map(|f| f.into_std()),
        }
    }

    /// Opens the file for reading.
    pub fn open(&self) -> io::Result<fs::File> {
        match &self.place {
            Place::Ambient => fs::File::open(&self.shown),
            Place::Beneath { dir, relative } => dir.open(relative).map(|f| f.into_std()),
        }
    }

    /// Reads the whole file.
    pub fn read(&self) -> io::Result<Vec<u8>> {
        match &self.place {
            Place::Ambient => fs::read(&self.shown),
            Place::Beneath { dir, relative } => dir.read(relative),
        }
    }

    /// Whether the file or directory exists.
    pub fn exists(&self) -> bool {
        match &self.place {
            Place::Ambient => self.shown.exists(),
            Place::Beneath { dir, relative } => dir.exists(relative),
        }
    }

    /// Creates the directory and its missing parents.
    pub fn create_dir_all(&self) -> io::Result<()> {
        match &self.place {
            Place::Ambient => fs::create_dir_all(&self.shown),
            Place::Beneath { dir, relative } => dir.create_dir_all(relative),
        }
    }

    /// Removes the file.
    pub fn remove_file(&self) -> io::Result<()> {
        match &self.place {
            Place::Ambient => fs::remove_file(&self.shown),
            Place::Beneath { dir, relative } => dir.remove_file(relative),
        }
    }

    /// Removes the directory if it is empty.
    pub fn remove_dir(&self) -> io::Result<()> {
        match &self.place {
            Place::Ambient => fs::remove_dir(&self.shown),
            Place::Beneath { dir, relative } => dir.remove_dir(relative),
        }
    }

    /// Renames this file to `to` (replacing it). Both must come from the same [`Files`].
    pub fn rename_to(&self, to: &Target) -> io::Result<()> {
        match (&self.place, &to.place) {
            (Place::Ambient, Place::Ambient) => fs::rename(&self.shown, &to.shown),
            (
                Place::Beneath { dir, relative },
                Place::Beneath {
                    dir: to_dir,
                    relative: to_relative,
                },
            ) => dir.rename(relative, to_dir, to_relative),
            _ => Err(io::Error::other(
                "cannot rename between a confined and an unconfined path",
            )),
        }
    }

    /// The names of the directory's entries.
    pub fn entry_names(&self) -> io::Result<Vec<OsString>> {
        match &self.place {
            Place::Ambient => fs::read_dir(&self.shown)?
                .map(|entry| entry.map(|e| e.file_name()))
                .collect(),
            Place::Beneath { dir, relative } => dir
                .read_dir(relative)?
                .map(|entry| entry.map(|e| e.file_name()))
                .collect(),
        }
    }

    /// Flushes the directory itself to disk (so a rename in it survives a crash).
    pub fn sync_dir(&self) -> io::Result<()> {
        match &self.place {
            Place::Ambient => fs::File::open(&self.shown)?.sync_all(),
            Place::Beneath { dir, relative } => dir.open(relative)?.into_std().sync_all(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;

    /// A scratch directory with `allowed/` and `outside/` in it.
    fn scratch() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let allowed = root.path().join("allowed");
        let outside = root.path().join("outside");
        fs::create_dir(&allowed).unwrap();
        fs::create_dir(&outside).unwrap();
        (root, allowed, outside)
    }

    fn denied(files: &Files, path: &Path) -> String {
        let err = files.resolve(path).unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{err}");
        err.message().to_string()
    }

    #[test]
    fn paths_under_an_allowed_directory_are_reached_through_its_handle() {
        let (_root, allowed, _) = scratch();
        let files = Files::confined(std::slice::from_ref(&allowed)).unwrap();
        let dir = files.resolve(allowed.join("run/1")).unwrap();
        dir.create_dir_all().unwrap();
        let file = files.resolve(allowed.join("run/1/model.index")).unwrap();
        std::io::Write::write_all(&mut file.create().unwrap(), b"abc").unwrap();
        assert_eq!(fs::read(allowed.join("run/1/model.index")).unwrap(), b"abc");
        assert_eq!(file.read().unwrap(), b"abc");
        let moved = files.resolve(allowed.join("run/model.index")).unwrap();
        file.rename_to(&moved).unwrap();
        assert!(moved.exists() && !file.exists());
        assert_eq!(dir.entry_names().unwrap().len(), 0);
        dir.sync_dir().unwrap();
        dir.remove_dir().unwrap();
        // `..` that stays inside is fine, and so is the directory itself.
        files.resolve(allowed.join("run/../run/x")).unwrap();
        files.resolve(&allowed).unwrap().sync_dir().unwrap();
    }

    #[test]
    fn paths_outside_plain_dotdot_or_symlinked_are_refused_naming_path_and_key() {
        let (_root, allowed, outside) = scratch();
        let files = Files::confined(std::slice::from_ref(&allowed)).unwrap();
        let message = denied(&files, &outside.join("model"));
        assert!(message.contains("outside/model"), "{message}");
        assert!(message.contains(ALLOWED_DIRS_KEY), "{message}");
        denied(&files, &allowed.join("../outside/model"));
        denied(&files, &allowed.join("new/../../outside/model"));
        std::os::unix::fs::symlink(&outside, allowed.join("link")).unwrap();
        denied(&files, &allowed.join("link/model"));
        std::os::unix::fs::symlink(outside.join("secret"), allowed.join("file-link")).unwrap();
        fs::write(outside.join("secret"), b"x").unwrap();
        denied(&files, &allowed.join("file-link"));
        // A prefix of the directory's name is not the directory.
        let sibling = allowed.with_file_name("allowed-not");
        fs::create_dir(&sibling).unwrap();
        denied(&files, &sibling.join("model"));
    }

    #[test]
    fn a_directory_swapped_for_a_symlink_after_the_check_does_not_lead_outside() {
        let (_root, allowed, outside) = scratch();
        let files = Files::confined(std::slice::from_ref(&allowed)).unwrap();
        fs::create_dir(allowed.join("run")).unwrap();
        let target = files.resolve(allowed.join("run/model.index")).unwrap();
        // The swap: `run` becomes a symlink to a directory outside.
        fs::remove_dir(allowed.join("run")).unwrap();
        std::os::unix::fs::symlink(&outside, allowed.join("run")).unwrap();
        assert!(target.create().is_err());
        assert!(!outside.join("model.index").exists());
        fs::write(outside.join("model.index"), b"secret").unwrap();
        assert!(target.read().is_err());
        assert!(target.remove_file().is_err());
        assert!(outside.join("model.index").exists());
    }

    #[test]
    fn each_confinement_names_its_own_key_and_section() {
        let (_root, allowed, outside) = scratch();
        let reads =
            Files::confined_as(DATA_ALLOWED_DIRS_KEY, std::slice::from_ref(&allowed)).unwrap();
        assert_eq!(reads.key(), DATA_ALLOWED_DIRS_KEY);
        let message = denied(&reads, &outside.join("train.tfrecord"));
        assert!(
            message.contains("outside data.allowed_dirs = ["),
            "{message}"
        );
        assert!(
            message.ends_with("add this one to [data] allowed_dirs in the task's cluster file"),
            "{message}"
        );
        let missing = outside.join("missing");
        let err =
            Files::confined_as(DATA_ALLOWED_DIRS_KEY, std::slice::from_ref(&missing)).unwrap_err();
        assert!(err.message().starts_with("data.allowed_dirs: "), "{err}");
        let writes = Files::confined(std::slice::from_ref(&allowed)).unwrap();
        let message = denied(&writes, &outside.join("model"));
        assert!(
            message
                .ends_with("add this one to [checkpoints] allowed_dirs in the task's cluster file"),
            "{message}"
        );
    }

    #[test]
    fn unconfined_files_reach_any_path_and_missing_roots_are_named() {
        let (_root, _, outside) = scratch();
        let files = Files::ambient();
        assert!(!files.is_confined());
        let target = files.resolve(outside.join("f")).unwrap();
        target.create().unwrap();
        assert!(target.exists());
        let missing = outside.join("missing");
        let err = Files::confined(std::slice::from_ref(&missing)).unwrap_err();
        assert!(err.message().contains("missing"), "{err}");
        assert!(err.message().contains(ALLOWED_DIRS_KEY), "{err}");
    }
}
