//! One confined folder: the on-disk home of a memory store.
//!
//! Every access below the root goes through directory file descriptors:
//! `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` where the kernel has
//! it, else a component-by-component `openat(O_NOFOLLOW | O_DIRECTORY)` walk.
//! So no symlink — planted before or swapped in during an operation — can
//! lead a read or a write outside the root, and no `..` from the server can
//! either (it is refused before any syscall).
//!
//! The folder holds regular files only: symlinks are refused on read and
//! skipped by scans; FIFOs, sockets and devices are never opened (reads use
//! `O_NONBLOCK` and check `fstat` before reading). Directories are created
//! `0700` and files `0600`; writes go to a temporary file that is renamed
//! over the target, so a reader never sees half a file. Only
//! [`Folder::create_root`] makes the root: a write racing an `rm -rf` of the
//! folder fails instead of silently re-creating it.
//!
//! Hashing keeps a stat cache keyed by (mtime, ctime, size, inode), so an
//! unchanged file is not read again; a file is cached only once its newest
//! timestamp is more than two seconds older than the scan, so coarse
//! timestamps cannot hide a rewrite. The mount's own writes are cached
//! without that wait once a probe file proves them older than the file
//! system's clock tick ([`Folder::trust_private_writes`]).
//!
//! The root and its parent directory are opened once, by
//! [`Folder::create_root`], and every operation starts from those file
//! descriptors rather than from the path: a root swapped for a symlink (or a
//! file) redirects neither a sync nor the removal, and is reported as
//! replaced ([`FolderError::Replaced`]).
//!
//! One bad entry never stops the rest: a file or directory the worker cannot
//! read is listed in [`Scan::unreadable`] and skipped, and a file over the
//! API's size limit ([`MAX_FILE_BYTES`]) is decided by `fstat` and never read
//! whole — it is scanned as a stand-in hash ([`is_oversized`]) and refused by
//! [`Folder::get`]. [`Folder::dispose`] removes the folder by fd, restoring
//! the permissions it needs (the folder is the worker's own).
//!
//! The tree's shape never drives the stack or the descriptors (the agent
//! can nest directories thousands deep): scans and removal walk with an
//! explicit stack, a scan enters at most
//! [`MAX_SCAN_DEPTH`](walk::MAX_SCAN_DEPTH) levels (deeper is unreadable:
//! unknown, never deleted), and removal holds one directory's descriptor at
//! a time, however deep the tree.
//!
//! Everything here blocks; callers run it on a blocking thread.
//!
//! The parts, each one concept; each uses only parts listed before it:
//!
//! - `paths` — what a path may name, and the refusals of a no-follow open;
//! - `stat` — what the stat cache keys on, and when a stat is trusted;
//! - `size` — the size limit, and the stand-in hash of a file over it;
//! - `hash` — one file hashed, bounded, and whether its stat may be cached;
//! - `walk` — the tree walk behind a scan: explicit stack, capped depth;
//! - `root` — the root held by descriptor: attached, checked, removed;
//! - `files` — one file written atomically, read, hashed or removed;
//! - `private_writes` — the mount's own writes, trusted into the stat cache;
//! - `scan` — a scan, whole or of the paths the watch reported.

mod files;
mod hash;
mod paths;
mod private_writes;
mod root;
mod scan;
mod size;
mod stat;
mod walk;

use std::path::PathBuf;
use std::sync::Mutex;

use foldhash::HashMap;
use rustix::fs::OFlags;
use rustix::io::Errno;

use self::root::RootFds;
use self::stat::{StatCache, StatKey};

pub(crate) use self::paths::is_clean_absolute;
pub(crate) use self::scan::Scan;
pub(crate) use self::size::{MAX_FILE_BYTES, is_oversized, oversized_bytes};

/// The reserved marker at every store root; never synced.
pub const MARKER_PATH: &str = ".anthropic-memory-store";

/// Directories are owner-only.
const DIR_MODE: u32 = 0o700;

/// Files are owner-only.
const FILE_MODE: u32 = 0o600;

/// How the folder opens a directory: never through a symlink.
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Why the folder refused or failed an operation. The refusals are about the
/// input (a path or content the folder will not act on); `Io` is the OS.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FolderError {
    #[error("path {0:?} escapes the store root")]
    Escapes(String),
    #[error("path {0:?} is a symlink")]
    Symlink(String),
    #[error("path {0:?} is not a regular file")]
    NotAFile(String),
    #[error("path {0:?} is not a directory")]
    NotADirectory(String),
    #[error("path {0:?} is not valid utf-8")]
    NotUtf8(String),
    #[error("path {path:?} holds {size} bytes, over the {MAX_FILE_BYTES}-byte limit of a memory")]
    TooLarge { path: String, size: u64 },
    /// The root's path no longer names the directory this folder opened:
    /// something else (a symlink, a file) was put in its place.
    #[error(
        "the memory store folder {0} was replaced by something that is not a directory; it is neither read nor removed"
    )]
    Replaced(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl FolderError {
    /// A refusal of the input rather than a failure of the OS: retrying the
    /// same content cannot succeed.
    pub(crate) fn is_refusal(&self) -> bool {
        !matches!(self, FolderError::Io { .. } | FolderError::Replaced(_))
    }

    /// The OS error, when this is one (only the unit tests ask).
    #[cfg(test)]
    pub(crate) fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            FolderError::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }

    fn io(path: &str, errno: Errno) -> FolderError {
        FolderError::Io {
            path: path.to_string(),
            source: std::io::Error::from_raw_os_error(errno.raw_os_error()),
        }
    }
}

/// One store's folder.
#[derive(Debug)]
pub(crate) struct Folder {
    /// The configured (absolute) path, as the session names it.
    configured: PathBuf,
    /// The path with its ancestors' symlinks resolved, fixed by `create_root`.
    resolved: Mutex<PathBuf>,
    /// `true` when nothing was at the path when the folder was opened: then
    /// this folder is ours, and `dispose` removes it.
    removed_on_dispose: bool,
    utf8_only: bool,
    /// The root and its parent, held from `create_root` on.
    fds: Mutex<Option<RootFds>>,
    /// The stat cache: path → (stat, hash, the last scan that saw it).
    /// Hashed with foldhash, not SipHash: a scan looks up every file, and
    /// the keys are this folder's own paths.
    cache: Mutex<StatCache>,
    /// Files [`Folder::put_private`] wrote: device, stat and hash, until
    /// [`Folder::trust_private_writes`] moves them into `cache`.
    private_writes: Mutex<HashMap<String, (u64, StatKey, String)>>,
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A folder of the worker's own, its root created, in a temporary
    /// directory.
    pub(crate) fn folder() -> (tempfile::TempDir, Folder) {
        let dir = tempfile::tempdir().unwrap();
        let f = Folder::open(&dir.path().join("store"), true).unwrap();
        assert!(f.removed_on_dispose());
        f.create_root().unwrap();
        (dir, f)
    }
}
