//! The database file a store has open, and whether the file at its path is still that one.
//!
//! A file deleted, moved or renamed over while a store has it open (an operator starting over or
//! moving it away, a temporary-file cleaner, a backup renamed into place) goes on being read and
//! written through the open connection in write-ahead-log mode, where SQLite refuses nothing (it
//! refuses such writes only with a rollback journal). So do its write-ahead log (`-wal`) and the
//! log's index (`-shm`) beside it, taken for temporary files and deleted: a process opening the
//! file afterwards makes new ones and sees nothing of what the open store writes in its own. A
//! store writing there would claim keys in a file no process opening the path sees, and each key
//! would run once on each side. Following
//! the path instead would run again every key of a file that was only moved away. So a store
//! writes nothing once its file is no longer at its path: its calls fail closed until the file
//! is put back or the store is opened again.

use std::path::{Path, PathBuf};

use crate::store::StoreError;

/// The file a store opened: its path, made absolute when it was opened (a later change of the
/// working directory does not move it), and what identified it and its log and index there
/// once the store had them open. While any connection has the file open in WAL mode, its log
/// and index stay (SQLite removes them only when the last connection closes).
pub(super) struct OpenedFile {
    path: PathBuf,
    beside: [PathBuf; 2],
    ids: [FileId; 3],
}

/// Device and inode (Unix). Elsewhere an open file is not deleted or replaced, and there is
/// nothing to compare.
type FileId = Option<(u64, u64)>;

impl OpenedFile {
    /// The file opened at `path` (the name SQLite was given), read once the store has it open in
    /// WAL mode.
    pub(super) fn at(path: &Path) -> OpenedFile {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        let beside = ["-wal", "-shm"].map(|suffix| {
            let mut name = path.as_os_str().to_owned();
            name.push(suffix);
            PathBuf::from(name)
        });
        if let Some(fs) = path.parent().and_then(network_filesystem) {
            tracing::warn!(
                path = %path.display(),
                filesystem = fs,
                "the SQLite store's file is on a network filesystem ({fs}): SQLite's write-ahead \
                 log keeps its index in shared memory, which processes on different machines do \
                 not share, so processes on two machines using this file would each acquire the \
                 same keys and run each tool once per machine; keep every process using it on \
                 one machine, or use the PostgreSQL or Redis store"
            );
        }
        let mut file = OpenedFile { path, beside, ids: [None; 3] };
        file.ids = file.identities();
        file
    }

    fn identities(&self) -> [FileId; 3] {
        [identity(&self.path), identity(&self.beside[0]), identity(&self.beside[1])]
    }

    /// Refuses when the file at the path, or its log or index, is no longer the one opened:
    /// gone, or another file. Three `stat`s, of the inode alone where the kernel can (see
    /// [`identity`]).
    pub(super) fn check(&self) -> Result<(), StoreError> {
        if self.ids[0].is_none() || self.identities() == self.ids {
            return Ok(());
        }
        Err(StoreError::unavailable(format!(
            "the SQLite database file {} (or its -wal or -shm file) is no longer the file this \
             store opened (it was deleted, moved or replaced while open); nothing is written to \
             the file the store still has open, which no process opening that path sees. Put the \
             file back, or open the store again (restart the process) to use the file now at \
             the path",
            self.path.display()
        )))
    }
}

/// Linux: `statx` asking for the inode alone. A `stat` that reads a file's times (as
/// `std::fs::metadata` does) makes the kernel (6.13 on: multigrain timestamps) give the file's
/// next write a fine-grained time, so every write of the log changes its inode and each commit's
/// `fdatasync` writes the filesystem's journal too: that was a fifth of a first call's time on
/// ext4 (BENCHMARKS.md, "SQLite: why a `stat` of the log cost a fifth of a first call").
#[cfg(target_os = "linux")]
fn identity(path: &Path) -> FileId {
    use rustix::fs::{AtFlags, CWD, StatxFlags, makedev, statx};
    match statx(CWD, path, AtFlags::empty(), StatxFlags::INO) {
        // The device as `stat` gives it, so either way of reading compares with the other.
        Ok(st) => Some((makedev(st.stx_dev_major, st.stx_dev_minor), st.stx_ino)),
        // A kernel before 4.11, or a sandbox that refuses `statx`: `stat`, as elsewhere.
        Err(rustix::io::Errno::NOSYS | rustix::io::Errno::PERM) => stat_identity(path),
        Err(_) => None,
    }
}

#[cfg(all(unix, not(target_os = "linux")))]
fn identity(path: &Path) -> FileId {
    stat_identity(path)
}

#[cfg(unix)]
fn stat_identity(path: &Path) -> FileId {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn identity(_: &Path) -> FileId {
    None
}

/// The network filesystem `dir` is on, by its magic number (`statfs`, Linux): one where
/// processes on several machines may open the same file. SQLite's WAL mode needs every process
/// using a database on one machine (SQLite's documentation of WAL mode: "WAL does not work over
/// a network filesystem").
#[cfg(target_os = "linux")]
fn network_filesystem(dir: &Path) -> Option<&'static str> {
    let magic = rustix::fs::statfs(dir).ok()?.f_type;
    // The kernel's magic numbers are 32 bits; a 64-bit `f_type` may carry a 32-bit one
    // sign-extended (CIFS's, on some architectures).
    network_kind(magic as u32)
}

#[cfg(not(target_os = "linux"))]
fn network_filesystem(_: &Path) -> Option<&'static str> {
    None
}

/// The network or cluster filesystem a `statfs` magic number names (`linux/magic.h` and the
/// filesystems' own headers).
#[cfg(target_os = "linux")]
fn network_kind(magic: u32) -> Option<&'static str> {
    Some(match magic {
        0x6969 => "NFS",
        0x517B => "SMB",
        0xFF53_4D42 => "CIFS",
        0xFE53_4D42 => "SMB2",
        0x00C3_6400 => "Ceph",
        0x0102_1997 => "9P",
        0x5346_414F | 0x6B41_4653 => "AFS",
        0x0BD0_0BD0 => "Lustre",
        0x7375_7245 => "Coda",
        0x0116_1970 => "GFS2",
        0x7461_636F => "OCFS2",
        _ => return None,
    })
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// Both ways of reading a file's identity give the same device and inode, so a store whose
    /// sandbox refuses `statx` for some calls compares like with like.
    #[test]
    fn statx_and_stat_agree() {
        let path = std::env::temp_dir().join(format!("idem-identity-{}", std::process::id()));
        std::fs::write(&path, b"x").expect("a file");
        assert_eq!(identity(&path), stat_identity(&path));
        assert!(identity(&path).is_some());
        std::fs::remove_file(&path).expect("removed");
        assert_eq!(identity(&path), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn network_filesystems_are_told_apart_from_local_ones() {
        assert_eq!(network_kind(0x6969), Some("NFS"));
        assert_eq!(network_kind(0xFF53_4D42), Some("CIFS"));
        assert_eq!(network_kind(0xFE53_4D42), Some("SMB2"));
        // ext4, tmpfs, overlayfs, btrfs, xfs.
        for local in [0xEF53, 0x0102_1994, 0x794C_7630, 0x9123_683E, 0x5846_5342] {
            assert_eq!(network_kind(local), None, "{local:#x}");
        }
    }
}
