//! The database file a store has open, and whether the file at its path is still that one.
//!
//! A file deleted, moved or renamed over while a store has it open (an operator starting over or
//! moving it away, a temporary-file cleaner, a backup renamed into place) goes on being read and
//! written through the open connection in write-ahead-log mode, where SQLite refuses nothing (it
//! refuses such writes only with a rollback journal). A store writing there would claim keys in a
//! file no process opening the path sees, and each key would run once on each side. Following
//! the path instead would run again every key of a file that was only moved away. So a store
//! writes nothing once its file is no longer at its path: its calls fail closed until the file
//! is put back or the store is opened again.

use std::path::{Path, PathBuf};

use crate::store::StoreError;

/// The file a store opened: its path, made absolute when it was opened (a later change of the
/// working directory does not move it), and what identified the file there then.
pub(super) struct OpenedFile {
    path: PathBuf,
    id: FileId,
}

/// Device and inode (Unix). Elsewhere an open file is not deleted or replaced, and there is
/// nothing to compare.
type FileId = Option<(u64, u64)>;

impl OpenedFile {
    /// The file just opened at `path` (the name SQLite was given).
    pub(super) fn at(path: &Path) -> OpenedFile {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        let id = identity(&path);
        OpenedFile { path, id }
    }

    /// Refuses when the file at the path is no longer the one opened: gone, or another file. One
    /// `stat`.
    pub(super) fn check(&self) -> Result<(), StoreError> {
        if self.id.is_none() || identity(&self.path) == self.id {
            return Ok(());
        }
        Err(StoreError::unavailable(format!(
            "the SQLite database file {} is no longer the file this store opened (it was \
             deleted, moved or replaced while open); nothing is written to the file the store \
             still has open, which no process opening that path sees. Put the file back, or open \
             the store again (restart the process) to use the file now at the path",
            self.path.display()
        )))
    }
}

#[cfg(unix)]
fn identity(path: &Path) -> FileId {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn identity(_: &Path) -> FileId {
    None
}
