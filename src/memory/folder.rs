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
//! explicit stack, a scan enters at most [`MAX_SCAN_DEPTH`] levels (deeper is
//! unreadable: unknown, never deleted), and removal holds one directory's
//! descriptor at a time, however deep the tree.
//!
//! Everything here blocks; callers run it on a blocking thread.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CStr;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use foldhash::{HashMap, HashMapExt};
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;
use sha2::{Digest, Sha256};

use super::watch::{Watch, next_revision};

/// The reserved marker at every store root; never synced.
pub const MARKER_PATH: &str = ".anthropic-memory-store";

/// Directories are owner-only.
const DIR_MODE: u32 = 0o700;
/// Files are owner-only.
const FILE_MODE: u32 = 0o600;
/// A file younger than this (by mtime or ctime) is re-hashed on every scan.
const TIMESTAMP_TRUST_MARGIN: Duration = Duration::from_secs(2);
/// The most bytes a memory may hold: the API's limit on one memory's content
/// (`102_400`). A larger file is decided by `fstat` and never read whole, so
/// no file's size can drive the worker's memory use.
pub(crate) const MAX_FILE_BYTES: u64 = 102_400;
/// The prefix of an oversized file's stand-in hash; see [`is_oversized`].
const OVERSIZED: &str = "oversized:";

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

/// A scan of the folder: `rel → sha256` of every regular file (a stand-in
/// for a file over [`MAX_FILE_BYTES`], see [`is_oversized`]), the names it
/// could not represent (not UTF-8), which can never be memories, and the
/// entries it could not read.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Scan {
    pub(crate) files: BTreeMap<String, String>,
    pub(crate) unrepresentable: Vec<String>,
    /// Files and directories the scan could not read (`""`: the root). What
    /// is at or below such a path is unknown — never a deletion.
    pub(crate) unreadable: Vec<String>,
}

impl Scan {
    /// Is `rel` unknown to this scan: at or below an unreadable entry?
    pub(crate) fn is_unknown(&self, rel: &str) -> bool {
        self.unreadable.iter().any(|u| {
            u.is_empty()
                || rel
                    .strip_prefix(u.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
    }
}

/// Is this scanned hash the stand-in of a file over [`MAX_FILE_BYTES`]? A
/// stand-in is made from the file's stat (size, times, inode), so it changes
/// whenever the file does, and it never equals a content hash.
pub(crate) fn is_oversized(sha: &str) -> bool {
    sha.starts_with(OVERSIZED)
}

/// The size an oversized file's stand-in hash records ([`is_oversized`]).
pub(crate) fn oversized_bytes(sha: &str) -> Option<u64> {
    sha.strip_prefix(OVERSIZED)?.split(':').next()?.parse().ok()
}

fn stand_in(st: &rustix::fs::Stat) -> String {
    let k = stat_key(st);
    format!(
        "{OVERSIZED}{}:{}:{}:{}",
        k.size, k.mtime_ns, k.ctime_ns, k.ino
    )
}

/// The root and its parent, opened by `create_root`.
#[derive(Debug, Clone)]
struct RootFds {
    parent: Arc<OwnedFd>,
    /// The root's name in `parent`.
    name: String,
    root: Arc<OwnedFd>,
    dev: u64,
    ino: u64,
    /// The identity of the directory `create_root` made (or found) there.
    original: (u64, u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StatKey {
    mtime_ns: i128,
    ctime_ns: i128,
    size: i64,
    ino: u64,
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

/// `path` is usable verbatim as a folder: absolute, and no `..` component.
pub(crate) fn is_clean_absolute(path: &str) -> bool {
    path.starts_with('/') && !path.split('/').any(|c| c == "..")
}

/// The components of a relative path: backslashes are separators, leading
/// `/` and `.` components are dropped; `..` is refused.
pub(crate) fn components(rel: &str) -> Result<Vec<&str>, FolderError> {
    let mut out = Vec::new();
    for c in rel.split(['/', '\\']) {
        match c {
            "" | "." => {}
            ".." => return Err(FolderError::Escapes(rel.to_string())),
            other => out.push(other),
        }
    }
    Ok(out)
}

fn stat_key(st: &rustix::fs::Stat) -> StatKey {
    StatKey {
        mtime_ns: st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128,
        ctime_ns: st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128,
        size: st.st_size,
        ino: st.st_ino,
    }
}

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or_default()
}

thread_local! {
    /// One read buffer per (blocking) thread: hashing thousands of small
    /// files must not allocate and zero a buffer each time.
    static READ_BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; 64 * 1024]);
}

/// Hash an open regular file, reading at most [`MAX_FILE_BYTES`] + 1 bytes:
/// `None` when it holds more (it grew since its `fstat`).
fn hash_fd(fd: &OwnedFd) -> Result<Option<String>, Errno> {
    let mut hasher = Sha256::new();
    let within = READ_BUF.with_borrow_mut(|buf| {
        let mut total: u64 = 0;
        loop {
            let room = (MAX_FILE_BYTES + 1 - total).min(buf.len() as u64) as usize;
            let n = match rustix::io::read(fd, &mut buf[..room]) {
                Ok(n) => n,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Ok(true);
            }
            total += n as u64;
            if total > MAX_FILE_BYTES {
                return Ok(false);
            }
            hasher.update(&buf[..n]);
        }
    })?;
    Ok(within.then(|| hex::encode(hasher.finalize())))
}

/// Read and hash the regular file `name` in `dir`. Returns the hash and,
/// when the file may be cached, its stat: only a file whose newest timestamp
/// is older than the trust margin before `scan_start_ns`, so a coarse
/// timestamp cannot hide a rewrite. `Ok(None)` when it vanished or turned
/// into something else.
fn hash_fresh(
    dir: &OwnedFd,
    name: &str,
    scan_start_ns: i128,
) -> Result<Option<(String, Option<StatKey>)>, Errno> {
    let fd = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) | Err(Errno::LOOP) => return Ok(None),
        Err(e) => return Err(e),
    };
    let fresh = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(fresh.st_mode) != FileType::RegularFile {
        return Ok(None);
    }
    // Too large by its stat: a stand-in, never a read.
    let (sha, exact) = if fresh.st_size as u64 > MAX_FILE_BYTES {
        (stand_in(&fresh), true)
    } else {
        match hash_fd(&fd)? {
            Some(sha) => (sha, true),
            // It grew past the limit while being read.
            None => (stand_in(&rustix::fs::fstat(&fd)?), false),
        }
    };
    let key = stat_key(&fresh);
    let newest = key.mtime_ns.max(key.ctime_ns);
    let trusted = exact && newest < scan_start_ns - TIMESTAMP_TRUST_MARGIN.as_nanos() as i128;
    Ok(Some((sha, trusted.then_some(key))))
}

/// Path → (stat, hash, the number of the last scan that saw the file; 0:
/// none yet). Entries are marked where they are, not moved between maps:
/// a full scan then drops those it did not mark.
type StatCache = HashMap<String, (StatKey, String, u64)>;

/// One scan's walk: the stat cache it reads and marks.
struct Walk<'w> {
    start: i128,
    /// Each directory listed is watched first, when there is a watch.
    watch: Option<&'w mut Watch>,
    /// Entries stat-ed (files and directories): what the walk cost.
    examined: usize,
    cache: StatCache,
    /// This walk's mark in the cache (a fresh [`next_revision`], never 0).
    walk: u64,
    /// The files seen, in directory order; sorted into the scan at the end.
    files: Vec<(String, String)>,
    unrepresentable: Vec<String>,
    unreadable: Vec<String>,
}

/// Deepest directory a scan enters, counted from the root (whose entries
/// are at depth 1). The agent can nest directories without limit; the scan
/// holds one descriptor and the remaining names per level it is inside, so
/// the cap bounds its descriptors (at most this many, well under the usual
/// 1,024) and, with the explicit stack, rules out any stack overflow. A
/// directory deeper than the cap is listed in [`Scan::unreadable`]: what it
/// holds is unknown (warned once), never read as deleted.
pub(crate) const MAX_SCAN_DEPTH: usize = 128;

/// A directory a scan is inside: its fd (`None`: the root), its path and
/// depth, and the names still to visit in it.
struct Frame {
    fd: Option<OwnedFd>,
    prefix: String,
    depth: usize,
    names: std::vec::IntoIter<std::ffi::CString>,
}

impl Walk<'_> {
    /// Walk the tree below `root` with an explicit stack (never recursion:
    /// the agent decides the depth). An entry that cannot be read is listed
    /// in `unreadable` and skipped; the walk goes on with the rest.
    fn tree(&mut self, root: &OwnedFd) {
        let mut stack: Vec<Frame> = Vec::new();
        self.descend(&mut stack, root, None, String::new(), 0);
        self.run(root, stack);
    }

    /// Walk the tree below the directory `sub` (at `rel`, `depth` levels
    /// below `root`), as [`tree`](Self::tree) walks the root's.
    fn subtree(&mut self, root: &OwnedFd, sub: OwnedFd, rel: String, depth: usize) {
        let mut stack: Vec<Frame> = Vec::new();
        self.descend(&mut stack, root, Some(sub), rel, depth);
        self.run(root, stack);
    }

    /// List the directory `fd` (`None`: the root) and stack it to be walked.
    fn descend(
        &mut self,
        stack: &mut Vec<Frame>,
        root: &OwnedFd,
        fd: Option<OwnedFd>,
        prefix: String,
        depth: usize,
    ) {
        if let Some(names) = self.list(fd.as_ref().unwrap_or(root), &prefix) {
            stack.push(Frame {
                fd,
                prefix,
                depth,
                names,
            });
        }
    }

    fn run(&mut self, root: &OwnedFd, mut stack: Vec<Frame>) {
        while let Some(frame) = stack.last_mut() {
            let Some(name) = frame.names.next() else {
                stack.pop();
                continue;
            };
            let depth = frame.depth + 1;
            let dir = frame.fd.as_ref().unwrap_or(root);
            let Some((sub, rel)) = self.entry(dir, &frame.prefix, depth, &name) else {
                continue;
            };
            self.descend(&mut stack, root, Some(sub), rel, depth);
        }
    }

    /// The names in `dir` (at `prefix`), its descriptor's duplicate closed
    /// again at once; `None` (and `prefix` unreadable) when it cannot be
    /// listed. A listing cut short by an error keeps what it read, and the
    /// directory is unreadable all the same.
    fn list(
        &mut self,
        dir: &OwnedFd,
        prefix: &str,
    ) -> Option<std::vec::IntoIter<std::ffi::CString>> {
        // Watched before it is listed: a name added after the listing is
        // reported, one added before it is listed.
        if let Some(watch) = self.watch.as_deref_mut() {
            watch.add(prefix, dir);
        }
        let Ok(entries) = Dir::read_from(dir) else {
            self.unreadable.push(prefix.to_string());
            return None;
        };
        let mut names = Vec::new();
        for entry in entries {
            let Ok(entry) = entry else {
                self.unreadable.push(prefix.to_string());
                break;
            };
            let bytes = entry.file_name().to_bytes();
            if bytes != b"." && bytes != b".." {
                names.push(entry.file_name().to_owned());
            }
        }
        Some(names.into_iter())
    }

    /// Visit the entry `raw` of `dir` (at `prefix`, the entry at `depth`):
    /// a file is hashed into the scan; a directory is opened and returned
    /// with its path, to be walked, unless it lies deeper than
    /// [`MAX_SCAN_DEPTH`] (then it is unreadable).
    fn entry(
        &mut self,
        dir: &OwnedFd,
        prefix: &str,
        depth: usize,
        raw: &CStr,
    ) -> Option<(OwnedFd, String)> {
        let shown = |name: &str| {
            if prefix.is_empty() {
                name.to_string()
            } else {
                let mut rel = String::with_capacity(prefix.len() + 1 + name.len());
                rel.push_str(prefix);
                rel.push('/');
                rel.push_str(name);
                rel
            }
        };
        let bytes = raw.to_bytes();
        let Ok(name) = std::str::from_utf8(bytes) else {
            self.unrepresentable
                .push(shown(&String::from_utf8_lossy(bytes)));
            return None;
        };
        let rel = shown(name);
        self.examined += 1;
        let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return None, // a scan is a snapshot, not a lock
            Err(_) => {
                self.unreadable.push(rel);
                return None;
            }
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                if depth > MAX_SCAN_DEPTH {
                    self.unreadable.push(rel);
                    return None;
                }
                // A mount of /proc or /sys below the root is never scanned.
                match rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty())
                    .and_then(crate::fsx::refuse_pseudo_fs)
                {
                    Ok(fd) => Some((fd, rel)),
                    Err(Errno::NOENT) | Err(Errno::LOOP) | Err(Errno::NOTDIR) => None,
                    Err(_) => {
                        self.unreadable.push(rel);
                        None
                    }
                }
            }
            FileType::RegularFile => {
                crate::killpoint::hit("memory.scan.file");
                // A hit is marked as seen by this walk; a stale entry goes.
                match self.cache.get_mut(rel.as_str()) {
                    Some((stat, sha, seen)) if *stat == stat_key(&st) => {
                        *seen = self.walk;
                        self.files.push((rel, sha.clone()));
                        return None;
                    }
                    Some(_) => {
                        self.cache.remove(rel.as_str());
                    }
                    None => {}
                }
                let hashed = match hash_fresh(dir, name, self.start) {
                    Ok(hashed) => hashed,
                    Err(_) => {
                        self.unreadable.push(rel);
                        return None;
                    }
                };
                if let Some((sha, cacheable)) = hashed {
                    if let Some(stat) = cacheable {
                        self.cache
                            .insert(rel.clone(), (stat, sha.clone(), self.walk));
                    }
                    self.files.push((rel, sha));
                }
                None
            }
            // Symlinks, FIFOs, sockets, devices: never opened, never synced.
            _ => None,
        }
    }
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Open `comps` beneath `dirfd` without following any symlink.
use crate::fsx::open_beneath;

/// Map the errno of a no-follow open to the folder's refusals.
fn open_error(rel: &str, errno: Errno) -> FolderError {
    match errno {
        // ELOOP: the leaf (or, with openat2, any component) is a symlink;
        // EXDEV: openat2 refused to leave the root.
        Errno::LOOP | Errno::MLINK => FolderError::Symlink(rel.to_string()),
        Errno::XDEV => FolderError::Escapes(rel.to_string()),
        Errno::NOTDIR => FolderError::NotADirectory(rel.to_string()),
        other => FolderError::io(rel, other),
    }
}

impl Folder {
    /// Prepare the folder at `root` (absolute); creates nothing. Whatever is
    /// at the path now (a directory, a file, a symlink) makes it not ours.
    pub(crate) fn open(root: &Path, utf8_only: bool) -> std::io::Result<Folder> {
        let removed_on_dispose = match std::fs::symlink_metadata(root) {
            Ok(_) => false,
            // Nothing is there (or nothing can be, under a non-directory).
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                true
            }
            Err(e) => return Err(e),
        };
        Ok(Folder {
            configured: root.to_path_buf(),
            resolved: Mutex::new(root.to_path_buf()),
            removed_on_dispose,
            utf8_only,
            fds: Mutex::new(None),
            cache: Mutex::new(HashMap::new()),
            private_writes: Mutex::new(HashMap::new()),
        })
    }

    /// The folder's path with symlinks in its ancestors resolved.
    pub(crate) fn root(&self) -> PathBuf {
        self.resolved
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Take a folder that was already there as the worker's own: one a
    /// dead worker left, recovered (its marker and journal checked). It is
    /// removed on dispose like a folder the mount created.
    pub(crate) fn adopt(mut self) -> Folder {
        self.removed_on_dispose = true;
        self
    }

    /// Did `open` find nothing there (so the folder is ours to remove)?
    pub(crate) fn removed_on_dispose(&self) -> bool {
        self.removed_on_dispose
    }

    /// Create the root and any missing ancestors (`0700`); an existing
    /// directory is fine. Fixes the resolved path, and opens the root and
    /// its parent: every later operation starts from these descriptors.
    pub(crate) fn create_root(&self) -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(&self.configured)?;
        self.attach_root()
    }

    /// Open the root that is already there (creating nothing), as
    /// [`create_root`](Self::create_root) does after making it: a folder a
    /// dead worker left is taken as it is, or not at all. The root itself
    /// must be a directory, not a symlink to one.
    pub(crate) fn attach_root(&self) -> std::io::Result<()> {
        let resolved = std::fs::canonicalize(&self.configured)?;
        let (Some(parent), Some(name)) = (
            resolved.parent(),
            resolved.file_name().and_then(|n| n.to_str()),
        ) else {
            return Err(std::io::Error::other(format!(
                "{} cannot be a memory store folder",
                resolved.display()
            )));
        };
        let parent = rustix::fs::open(
            parent,
            DIR_FLAGS.difference(OFlags::NOFOLLOW),
            Mode::empty(),
        )?;
        // A store path that led into /proc (a symlink planted before the
        // mount) would sync the worker's own environment: refused.
        if std::fs::symlink_metadata(&self.configured)?
            .file_type()
            .is_symlink()
        {
            return Err(std::io::Error::other(format!(
                "{} is a symlink, not a memory store folder",
                self.configured.display()
            )));
        }
        let root = rustix::fs::openat(&parent, name, DIR_FLAGS, Mode::empty())
            .and_then(crate::fsx::refuse_pseudo_fs)?;
        let st = rustix::fs::fstat(&root)?;
        *self.fds.lock().unwrap_or_else(|e| e.into_inner()) = Some(RootFds {
            parent: Arc::new(parent),
            name: name.to_string(),
            root: Arc::new(root),
            dev: st.st_dev,
            ino: st.st_ino,
            original: (st.st_dev, st.st_ino),
        });
        *self.resolved.lock().unwrap_or_else(|e| e.into_inner()) = resolved;
        Ok(())
    }

    /// The root directory as opened by `create_root`, after checking that
    /// its name in the parent still leads to it. `Ok(None)` when nothing is
    /// there (or the root was never created). Another directory put in its
    /// place is taken as the folder (the marker check decides whether it is
    /// trusted); anything else there — a symlink, a file — is
    /// [`FolderError::Replaced`]: never followed, never removed.
    fn root_fd(&self) -> Result<Option<Arc<OwnedFd>>, FolderError> {
        let mut fds = self.fds.lock().unwrap_or_else(|e| e.into_inner());
        let Some(held) = fds.as_mut() else {
            return Ok(None);
        };
        let shown = || self.root().display().to_string();
        let st = match rustix::fs::statat(
            &*held.parent,
            held.name.as_str(),
            AtFlags::SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(FolderError::io(&shown(), e)),
        };
        if (st.st_dev, st.st_ino) == (held.dev, held.ino) {
            return Ok(Some(held.root.clone()));
        }
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return Err(FolderError::Replaced(shown()));
        }
        let root =
            match rustix::fs::openat(&*held.parent, held.name.as_str(), DIR_FLAGS, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => return Ok(None),
                Err(Errno::LOOP) | Err(Errno::NOTDIR) => {
                    return Err(FolderError::Replaced(shown()));
                }
                Err(e) => return Err(FolderError::io(&shown(), e)),
            };
        let st = rustix::fs::fstat(&root).map_err(|e| FolderError::io(&shown(), e))?;
        held.root = Arc::new(root);
        (held.dev, held.ino) = (st.st_dev, st.st_ino);
        Ok(Some(held.root.clone()))
    }

    /// The device and inode of the directory `create_root` opened.
    pub(crate) fn identity(&self) -> Option<(u64, u64)> {
        self.fds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|h| h.original)
    }

    /// Is the root still the very directory `create_root` opened (not
    /// another one put in its place)?
    pub(crate) fn is_original_root(&self) -> bool {
        matches!(self.root_fd(), Ok(Some(_)))
            && self
                .fds
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_some_and(|h| (h.dev, h.ino) == h.original)
    }

    fn require_root(&self) -> Result<Arc<OwnedFd>, FolderError> {
        self.root_fd()?.ok_or_else(|| FolderError::Io {
            path: self.root().display().to_string(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })
    }

    fn check_utf8(&self, rel: &str, data: &[u8]) -> Result<(), FolderError> {
        if self.utf8_only && std::str::from_utf8(data).is_err() {
            return Err(FolderError::NotUtf8(rel.to_string()));
        }
        Ok(())
    }

    /// The file's directory, created below the root when missing (`0700`),
    /// never the root itself.
    fn parent_dir(
        &self,
        root: &OwnedFd,
        rel: &str,
        dirs: &[&str],
        create: bool,
    ) -> Result<OwnedFd, FolderError> {
        match open_beneath(root, dirs, DIR_FLAGS) {
            Ok(fd) => return Ok(fd),
            Err(Errno::NOENT) if create => {}
            Err(e) => return Err(open_error(rel, e)),
        }
        let mut current = rustix::fs::openat(root, ".", DIR_FLAGS, Mode::empty())
            .map_err(|e| FolderError::io(rel, e))?;
        for dir in dirs {
            match rustix::fs::mkdirat(&current, *dir, Mode::from_raw_mode(DIR_MODE)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(FolderError::io(rel, e)),
            }
            current = rustix::fs::openat(&current, *dir, DIR_FLAGS, Mode::empty())
                .map_err(|e| open_error(rel, e))?;
        }
        Ok(current)
    }

    /// Write `data` at `rel` atomically (temporary file + rename).
    pub(crate) fn put(&self, rel: &str, data: &[u8]) -> Result<(), FolderError> {
        self.write_atomic(rel, data).map(drop)
    }

    /// [`Folder::put`] by a writer that vouches nothing else writes below
    /// the root until it calls [`Folder::trust_private_writes`] — the mount,
    /// which runs before the agent's first tool call. The file's stat and
    /// hash are kept so the first scan need not read it back.
    pub(crate) fn put_private(&self, rel: &str, data: &[u8]) -> Result<(), FolderError> {
        let (dir, leaf) = self.write_atomic(rel, data)?;
        // Stat after the rename, which moves the file's ctime.
        if let Ok(st) = rustix::fs::statat(&dir, leaf.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            && FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
        {
            let key = components(rel)?.join("/");
            let sha = hex::encode(Sha256::digest(data));
            self.private_writes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, (st.st_dev, stat_key(&st), sha));
        }
        Ok(())
    }

    /// Move the private writes made so far into the stat cache — each one
    /// whose timestamps are older than a probe file created now on the same
    /// file system. A later write to such a file gets a timestamp at least
    /// the probe's, so it cannot keep the cached stat; a write in the probe's
    /// clock tick could, which is why files of that tick are left out (they
    /// are hashed by the next scan). Comparing with the file system's own
    /// clock holds for any timestamp granularity and any clock skew between
    /// this host and a network file system. Returns how many were trusted.
    pub(crate) fn trust_private_writes(&self) -> Result<usize, FolderError> {
        let writes = std::mem::take(
            &mut *self
                .private_writes
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        if writes.is_empty() {
            return Ok(0);
        }
        let root = self.require_root()?;
        let probe_name = format!(".fs-{}.probe", hex::encode(rand::random::<[u8; 8]>()));
        let probe = rustix::fs::openat(
            &root,
            probe_name.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(FILE_MODE),
        )
        .map_err(|e| FolderError::io(&probe_name, e))?;
        let probe_stat = rustix::fs::fstat(&probe);
        drop(probe);
        let _ = rustix::fs::unlinkat(&root, probe_name.as_str(), AtFlags::empty());
        let probe_stat = probe_stat.map_err(|e| FolderError::io(&probe_name, e))?;
        let probe_key = stat_key(&probe_stat);
        let now = probe_key.mtime_ns.min(probe_key.ctime_ns);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let mut trusted = 0;
        for (rel, (dev, key, sha)) in writes {
            if dev == probe_stat.st_dev && key.mtime_ns.max(key.ctime_ns) < now {
                cache.insert(rel, (key, sha, 0));
                trusted += 1;
            }
        }
        Ok(trusted)
    }

    /// The atomic write behind [`Folder::put`]; returns the file's directory
    /// and name.
    fn write_atomic(&self, rel: &str, data: &[u8]) -> Result<(OwnedFd, String), FolderError> {
        let comps = components(rel)?;
        let Some((leaf, dirs)) = comps.split_last() else {
            return Err(FolderError::NotAFile(rel.to_string()));
        };
        if rel.ends_with('/') || rel.ends_with('\\') || rel.ends_with("/.") {
            return Err(FolderError::NotAFile(rel.to_string()));
        }
        self.check_utf8(rel, data)?;
        let root = self.require_root()?;
        let dir = self.parent_dir(&root, rel, dirs, true)?;
        let mut nonce = [0u8; 8];
        rand::fill(&mut nonce[..]);
        let tmp = format!(".fs-{}.tmp", hex::encode(nonce));
        let fd = rustix::fs::openat(
            &dir,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(FILE_MODE),
        )
        .map_err(|e| FolderError::io(rel, e))?;
        let written = std::fs::File::from(fd).write_all(data);
        let renamed = written
            .map_err(|e| FolderError::Io {
                path: rel.to_string(),
                source: e,
            })
            .and_then(|()| {
                rustix::fs::renameat(&dir, tmp.as_str(), &dir, *leaf)
                    .map_err(|e| FolderError::io(rel, e))
            });
        if renamed.is_err() {
            let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
        }
        renamed?;
        Ok((dir, leaf.to_string()))
    }

    /// The file's bytes; `None` when absent. Symlinks and non-regular files
    /// are refused without being read (a FIFO never blocks the open).
    pub(crate) fn get(&self, rel: &str) -> Result<Option<Vec<u8>>, FolderError> {
        let comps = components(rel)?;
        if comps.is_empty() {
            return Err(FolderError::NotAFile(rel.to_string()));
        }
        let Some(root) = self.root_fd()? else {
            return Ok(None);
        };
        let fd = match open_beneath(&root, &comps, OFlags::RDONLY | OFlags::NONBLOCK) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(open_error(rel, e)),
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| FolderError::io(rel, e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(FolderError::NotAFile(rel.to_string()));
        }
        let too_large = |size: u64| FolderError::TooLarge {
            path: rel.to_string(),
            size,
        };
        if st.st_size as u64 > MAX_FILE_BYTES {
            return Err(too_large(st.st_size as u64));
        }
        // At most one byte past the limit, however much the file grows meanwhile.
        let mut data = Vec::with_capacity(st.st_size.max(0) as usize);
        std::fs::File::from(fd)
            .take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut data)
            .map_err(|e| FolderError::Io {
                path: rel.to_string(),
                source: e,
            })?;
        if data.len() as u64 > MAX_FILE_BYTES {
            return Err(too_large(data.len() as u64));
        }
        self.check_utf8(rel, &data)?;
        Ok(Some(data))
    }

    /// One file's SHA-256; `None` when absent. Shares the scan's cache.
    pub(crate) fn hash_file(&self, rel: &str) -> Result<Option<String>, FolderError> {
        let comps = components(rel)?;
        let Some((leaf, dirs)) = comps.split_last() else {
            return Err(FolderError::NotAFile(rel.to_string()));
        };
        let Some(root) = self.root_fd()? else {
            return Ok(None);
        };
        let dir = match open_beneath(&root, dirs, DIR_FLAGS) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(open_error(rel, e)),
        };
        let st = match rustix::fs::statat(&dir, *leaf, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(FolderError::io(rel, e)),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {}
            FileType::Symlink => return Err(FolderError::Symlink(rel.to_string())),
            _ => return Err(FolderError::NotAFile(rel.to_string())),
        }
        let key = comps.join("/");
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((stat, sha, _)) = cache.get(&key)
            && *stat == stat_key(&st)
        {
            return Ok(Some(sha.clone()));
        }
        let hashed = hash_fresh(&dir, leaf, now_ns()).map_err(|e| FolderError::io(rel, e))?;
        Ok(hashed.map(|(sha, cacheable)| {
            match cacheable {
                Some(stat) => {
                    cache.insert(key, (stat, sha.clone(), 0));
                }
                None => {
                    cache.remove(&key);
                }
            }
            sha
        }))
    }

    /// Hash every regular file below the root. Symlinks (and what they point
    /// to), FIFOs and devices are skipped; an entry that cannot be read is
    /// listed in [`Scan::unreadable`] (so what is below it is unknown, never
    /// deleted). An absent root scans empty; a replaced one fails.
    pub(crate) fn scan(&self) -> Result<Scan, FolderError> {
        self.scan_watched(None).map(|(scan, _)| scan)
    }

    /// [`scan`](Self::scan), watching each directory before it is listed
    /// when `watch` is given; also says how many entries it stat-ed.
    pub(crate) fn scan_watched(
        &self,
        watch: Option<&mut Watch>,
    ) -> Result<(Scan, usize), FolderError> {
        let start = now_ns();
        let Some(root) = self.root_fd()? else {
            return Ok((Scan::default(), 0));
        };
        // The scan keeps of the cache only what it saw, so entries of files
        // that are gone drop out.
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let cached = std::mem::take(&mut *cache);
        let mut walk = Walk {
            start,
            watch,
            examined: 0,
            files: Vec::with_capacity(cached.len()),
            unrepresentable: Vec::new(),
            unreadable: Vec::new(),
            cache: cached,
            walk: next_revision(),
        };
        walk.tree(&root);
        let seen = walk.walk;
        walk.cache.retain(|_, (_, _, by)| *by == seen);
        *cache = std::mem::take(&mut walk.cache);
        Ok((
            Scan {
                files: BTreeMap::from_iter(walk.files),
                unrepresentable: walk.unrepresentable,
                unreadable: walk.unreadable,
            },
            walk.examined,
        ))
    }

    /// Examine only `paths` (each a file, a directory — walked whole, its
    /// directories watched — or nothing any more): a scan of just what is
    /// at or below them now, and how many entries it stat-ed. A path whose
    /// parent is gone, or is no directory, or is a symlink, holds nothing.
    /// `Ok(None)` when the root is gone; an error the caller answers with a
    /// full scan.
    pub(crate) fn examine(
        &self,
        paths: &BTreeSet<String>,
        watch: &mut Watch,
    ) -> Result<Option<(Scan, usize)>, FolderError> {
        let start = now_ns();
        let Some(root) = self.root_fd()? else {
            return Ok(None);
        };
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let cached = std::mem::take(&mut *cache);
        let mut walk = Walk {
            start,
            watch: Some(watch),
            examined: 0,
            files: Vec::new(),
            unrepresentable: Vec::new(),
            unreadable: Vec::new(),
            cache: cached,
            walk: next_revision(),
        };
        let mut result = Ok(());
        for rel in paths {
            let comps = match components(rel) {
                Ok(comps) => comps,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            let Some((leaf, dirs)) = comps.split_last() else {
                continue;
            };
            let parent = if dirs.is_empty() {
                None
            } else {
                match open_beneath(&root, dirs, DIR_FLAGS) {
                    Ok(fd) => Some(fd),
                    Err(Errno::NOENT) | Err(Errno::NOTDIR) | Err(Errno::LOOP) => continue,
                    Err(e) => {
                        result = Err(open_error(rel, e));
                        break;
                    }
                }
            };
            let Ok(leaf) = std::ffi::CString::new(*leaf) else {
                continue;
            };
            let prefix = dirs.join("/");
            let dir = parent.as_ref().unwrap_or(&root);
            if let Some((sub, sub_rel)) = walk.entry(dir, &prefix, comps.len(), &leaf) {
                walk.subtree(&root, sub, sub_rel, comps.len());
            }
        }
        // Only the examined paths were looked at: every other entry stays.
        *cache = std::mem::take(&mut walk.cache);
        result?;
        Ok(Some((
            Scan {
                files: BTreeMap::from_iter(walk.files),
                unrepresentable: walk.unrepresentable,
                unreadable: walk.unreadable,
            },
            walk.examined,
        )))
    }

    /// The device and inode of the directory the root's path leads to now
    /// (`None`: nothing there, or never created).
    pub(crate) fn current_identity(&self) -> Option<(u64, u64)> {
        self.root_fd().ok().flatten()?;
        self.fds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|h| (h.dev, h.ino))
    }

    /// Delete the file at `rel`; an absent file is fine.
    pub(crate) fn remove(&self, rel: &str) -> Result<(), FolderError> {
        let comps = components(rel)?;
        let Some((leaf, dirs)) = comps.split_last() else {
            return Ok(());
        };
        let Some(root) = self.root_fd()? else {
            return Ok(());
        };
        let dir = match open_beneath(&root, dirs, DIR_FLAGS) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(open_error(rel, e)),
        };
        match rustix::fs::unlinkat(&dir, *leaf, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(FolderError::io(rel, e)),
        }
    }

    /// Remove the root and everything below it — only if `open` found
    /// nothing there. Works from the descriptors opened at mount: symlinks
    /// inside are removed, never followed; a root replaced by something
    /// else is left alone and reported; permissions the agent took away are
    /// restored first (the folder is the worker's own).
    pub(crate) fn dispose(&self) -> Result<(), FolderError> {
        if !self.removed_on_dispose {
            return Ok(());
        }
        let Some(root) = self.root_fd()? else {
            return Ok(());
        };
        let shown = self.root().display().to_string();
        let held = self
            .fds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .expect("a root fd comes from the held descriptors");
        let st = rustix::fs::fstat(&*root).map_err(|e| FolderError::io(&shown, e))?;
        if st.st_mode & DIR_MODE != DIR_MODE {
            rustix::fs::fchmod(&*root, Mode::from_raw_mode(DIR_MODE))
                .map_err(|e| FolderError::io(&shown, e))?;
        }
        crate::fsx::remove_below(&root, &shown, DIR_MODE)
            .map_err(|(path, e)| FolderError::io(&path, e))?;
        match rustix::fs::unlinkat(&*held.parent, held.name.as_str(), AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(FolderError::io(&shown, e)),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    pub(crate) fn folder() -> (tempfile::TempDir, Folder) {
        let dir = tempfile::tempdir().unwrap();
        let f = Folder::open(&dir.path().join("store"), true).unwrap();
        assert!(f.removed_on_dispose());
        f.create_root().unwrap();
        (dir, f)
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn put_get_and_owner_only_modes() {
        let (_t, f) = folder();
        f.put("a/b/c.md", b"hello").unwrap();
        assert_eq!(f.get("a/b/c.md").unwrap().unwrap(), b"hello");
        assert_eq!(
            f.get("/a/b/c.md").unwrap().unwrap(),
            b"hello",
            "a leading / means the root"
        );
        assert_eq!(
            f.get("a\\b\\c.md").unwrap().unwrap(),
            b"hello",
            "backslashes are separators"
        );
        assert_eq!(f.get("missing.md").unwrap(), None);
        let root = f.root();
        assert_eq!(mode(&root.join("a")), 0o700);
        assert_eq!(mode(&root.join("a/b")), 0o700);
        assert_eq!(mode(&root.join("a/b/c.md")), 0o600);
        assert_eq!(mode(&root), 0o700);
        // Overwrite is atomic and leaves no temporary file behind.
        f.put("a/b/c.md", b"again").unwrap();
        let names: Vec<_> = std::fs::read_dir(root.join("a/b"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["c.md"]);
    }

    #[test]
    fn dot_dot_is_refused_before_any_syscall() {
        let (_t, f) = folder();
        for bad in ["../x", "a/../../x", "..", "a/..\\..\\x"] {
            assert!(
                matches!(f.put(bad, b"x"), Err(FolderError::Escapes(_))),
                "{bad}"
            );
            assert!(matches!(f.get(bad), Err(FolderError::Escapes(_))), "{bad}");
            assert!(
                matches!(f.hash_file(bad), Err(FolderError::Escapes(_))),
                "{bad}"
            );
            assert!(
                matches!(f.remove(bad), Err(FolderError::Escapes(_))),
                "{bad}"
            );
        }
        for not_a_file in ["", "/", "a/", "a/."] {
            assert!(
                matches!(f.put(not_a_file, b"x"), Err(FolderError::NotAFile(_))),
                "{not_a_file:?}"
            );
        }
    }

    #[test]
    fn symlinks_are_refused_on_read_and_write_and_skipped_by_scans() {
        let (t, f) = folder();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret.txt"), "secret").unwrap();
        let root = f.root();
        symlink(outside.join("secret.txt"), root.join("leaf.md")).unwrap();
        symlink(&outside, root.join("dir")).unwrap();
        assert!(matches!(f.get("leaf.md"), Err(FolderError::Symlink(_))));
        assert!(matches!(
            f.hash_file("leaf.md"),
            Err(FolderError::Symlink(_))
        ));
        // A symlinked parent directory: neither read nor written through.
        assert!(f.get("dir/secret.txt").is_err());
        assert!(f.put("dir/planted.md", b"x").is_err());
        assert!(!outside.join("planted.md").exists());
        // Scans skip both and never look behind them.
        f.put("real.md", b"r").unwrap();
        let scan = f.scan().unwrap();
        assert_eq!(scan.files.keys().collect::<Vec<_>>(), vec!["real.md"]);
        // Removing through the link removes nothing outside.
        f.remove("dir/secret.txt").unwrap_err();
        assert!(outside.join("secret.txt").exists());
    }

    #[test]
    fn the_fallback_walk_refuses_symlinks_too() {
        let (t, f) = folder();
        let outside = t.path().join("elsewhere");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("s.md"), "s").unwrap();
        symlink(&outside, f.root().join("link")).unwrap();
        let root = f.require_root().unwrap();
        // Force the component walk regardless of the kernel.
        let walked = {
            let (last, dirs) = ["link", "s.md"]
                .split_last()
                .map(|(l, d)| (*l, d.to_vec()))
                .unwrap();
            let mut current: Option<OwnedFd> = None;
            let mut result = Ok(());
            for dir in &dirs {
                match rustix::fs::openat(
                    current.as_ref().unwrap_or(&root),
                    *dir,
                    DIR_FLAGS,
                    Mode::empty(),
                ) {
                    Ok(fd) => current = Some(fd),
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            result.and_then(|()| {
                rustix::fs::openat(
                    current.as_ref().unwrap_or(&root),
                    last,
                    OFlags::RDONLY | OFlags::NOFOLLOW,
                    Mode::empty(),
                )
                .map(|_| ())
            })
        };
        assert!(
            matches!(walked, Err(Errno::LOOP) | Err(Errno::NOTDIR)),
            "{walked:?}"
        );
    }

    #[test]
    fn fifos_and_devices_are_never_opened() {
        let (_t, f) = folder();
        let fifo = f.root().join("pipe.md");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        // A blocking open of a FIFO would hang here; the folder refuses instead.
        assert!(matches!(f.get("pipe.md"), Err(FolderError::NotAFile(_))));
        assert!(matches!(
            f.hash_file("pipe.md"),
            Err(FolderError::NotAFile(_))
        ));
        assert!(f.scan().unwrap().files.is_empty());
    }

    #[test]
    fn binary_content_is_refused_on_put_and_get() {
        let (_t, f) = folder();
        assert!(matches!(
            f.put("bin.md", &[0xff, 0xfe, 0x00]),
            Err(FolderError::NotUtf8(_))
        ));
        std::fs::write(f.root().join("bin.md"), [0xc3, 0x28]).unwrap();
        assert!(matches!(f.get("bin.md"), Err(FolderError::NotUtf8(_))));
        // ...but it is still scanned (so a sync can see and refuse it).
        assert!(f.scan().unwrap().files.contains_key("bin.md"));
    }

    #[test]
    fn a_root_that_leads_into_proc_is_never_opened() {
        // `/mnt/memory` left as a symlink to /proc/self by an earlier agent,
        // and a store whose slug names a directory there: syncing it would
        // upload the worker's own process files (its environment among them).
        let f = Folder::open(Path::new("/proc/self/fdinfo"), true).unwrap();
        let err = f.create_root().unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(Errno::XDEV.raw_os_error()),
            "{err}"
        );
        assert!(
            f.scan().is_ok_and(|s| s.files.is_empty()),
            "nothing was opened"
        );
    }

    #[test]
    fn the_root_is_never_recreated_by_a_write() {
        let (_t, f) = folder();
        f.put("x.md", b"x").unwrap();
        std::fs::remove_dir_all(f.root()).unwrap();
        let err = f.put("y/z.md", b"z").unwrap_err();
        assert_eq!(err.io_kind(), Some(std::io::ErrorKind::NotFound));
        assert!(!f.root().exists());
        assert_eq!(
            f.scan().unwrap(),
            Scan::default(),
            "an absent root scans empty"
        );
        assert_eq!(f.get("x.md").unwrap(), None);
    }

    #[test]
    fn names_that_are_not_utf8_are_reported_not_synced() {
        use std::os::unix::ffi::OsStrExt;
        let (_t, f) = folder();
        let name = std::ffi::OsStr::from_bytes(b"caf\xe9.md");
        std::fs::write(f.root().join(name), "x").unwrap();
        let scan = f.scan().unwrap();
        assert!(scan.files.is_empty());
        assert_eq!(scan.unrepresentable, vec!["caf\u{fffd}.md"]);
    }

    #[test]
    fn the_stat_cache_skips_rereads_and_sees_rewrites() {
        let (_t, f) = folder();
        f.put("old.md", b"v1").unwrap();
        let path = f.root().join("old.md");
        // Only a file older than the trust margin (by mtime and ctime) is cached.
        f.scan().unwrap();
        assert!(
            !f.cache.lock().unwrap().contains_key("old.md"),
            "a fresh file is not cached"
        );
        std::thread::sleep(TIMESTAMP_TRUST_MARGIN + Duration::from_millis(100));
        let first = f.scan().unwrap();
        assert!(
            f.cache.lock().unwrap().contains_key("old.md"),
            "aged files are cached"
        );
        // A rewrite changes size or ctime, so it is re-hashed.
        std::fs::write(&path, "v2, longer").unwrap();
        let second = f.scan().unwrap();
        assert_ne!(first.files["old.md"], second.files["old.md"]);
        assert_eq!(
            second.files["old.md"],
            hex::encode(Sha256::digest(b"v2, longer"))
        );
        // A fresh file (inside the margin) is never cached.
        f.put("new.md", b"n").unwrap();
        f.scan().unwrap();
        assert!(!f.cache.lock().unwrap().contains_key("new.md"));
    }

    #[test]
    fn private_writes_are_trusted_only_when_older_than_the_probe() {
        let (_t, f) = folder();
        f.put_private("d/a.md", b"v1").unwrap();
        f.put_private("b.md", b"b1").unwrap();
        f.put("plain.md", b"p").unwrap();
        // Pretend `b.md` was written in the probe's clock tick (or later):
        // its stat could survive a rewrite, so it must not be trusted.
        f.private_writes
            .lock()
            .unwrap()
            .get_mut("b.md")
            .unwrap()
            .1
            .ctime_ns = now_ns() + 60_000_000_000;
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(f.trust_private_writes().unwrap(), 1);
        {
            let cache = f.cache.lock().unwrap();
            assert_eq!(
                cache.get("d/a.md").map(|(_, sha, _)| sha.as_str()),
                Some(hex::encode(Sha256::digest(b"v1")).as_str())
            );
            assert!(!cache.contains_key("b.md"), "written in the probe's tick");
            assert!(
                !cache.contains_key("plain.md"),
                "a plain put vouches nothing"
            );
        }
        assert!(f.private_writes.lock().unwrap().is_empty());
        // The probe is gone; the scan sees exactly the three files.
        let scan = f.scan().unwrap();
        assert_eq!(
            scan.files.keys().collect::<Vec<_>>(),
            ["b.md", "d/a.md", "plain.md"]
        );
        // A same-size rewrite right after is seen: its timestamps are at
        // least the probe's, so the cached stat no longer matches.
        std::fs::write(f.root().join("d/a.md"), b"v2").unwrap();
        assert_eq!(
            f.scan().unwrap().files["d/a.md"],
            hex::encode(Sha256::digest(b"v2"))
        );
    }

    #[test]
    fn dispose_removes_only_a_folder_it_created() {
        let t = tempfile::tempdir().unwrap();
        let existing = t.path().join("preexisting");
        std::fs::create_dir(&existing).unwrap();
        let f = Folder::open(&existing, true).unwrap();
        assert!(!f.removed_on_dispose());
        f.dispose().unwrap();
        assert!(existing.exists());

        let (_t2, ours) = folder();
        ours.put("a/b.md", b"x").unwrap();
        ours.dispose().unwrap();
        assert!(!ours.root().exists());
        ours.dispose().unwrap();
    }

    #[test]
    fn oversized_files_are_decided_by_stat_and_never_read_whole() {
        let (_t, f) = folder();
        let path = f.root().join("big.md");
        // Sparse: no disk, and a read of it would show in the test's memory.
        std::fs::File::create(&path)
            .unwrap()
            .set_len(64 << 30)
            .unwrap();
        let scan = f.scan().unwrap();
        assert!(is_oversized(&scan.files["big.md"]), "{scan:?}");
        assert!(is_oversized(&f.hash_file("big.md").unwrap().unwrap()));
        assert!(matches!(
            f.get("big.md"),
            Err(FolderError::TooLarge { size, .. }) if size == 64 << 30
        ));
        assert!(f.get("big.md").unwrap_err().is_refusal());
        // The stand-in changes with the file; at the limit a file is hashed.
        std::fs::File::create(&path)
            .unwrap()
            .set_len(MAX_FILE_BYTES + 1)
            .unwrap();
        let again = f.scan().unwrap().files["big.md"].clone();
        assert!(is_oversized(&again) && again != scan.files["big.md"]);
        std::fs::write(&path, "x".repeat(MAX_FILE_BYTES as usize)).unwrap();
        assert_eq!(
            f.scan().unwrap().files["big.md"],
            hex::encode(Sha256::digest("x".repeat(MAX_FILE_BYTES as usize)))
        );
        assert_eq!(
            f.get("big.md").unwrap().unwrap().len() as u64,
            MAX_FILE_BYTES
        );
    }

    #[test]
    fn a_read_stops_one_byte_past_the_limit_whatever_the_file_grows_to() {
        let (_t, f) = folder();
        // A file that grew past the limit after its fstat: the reader stops
        // at limit + 1 bytes and says so.
        let fd = rustix::fs::open(
            f.root().join("g.md").as_path(),
            OFlags::RDWR | OFlags::CREATE,
            Mode::from_raw_mode(0o600),
        )
        .unwrap();
        std::fs::File::from(fd.try_clone().unwrap())
            .write_all(&vec![b'y'; MAX_FILE_BYTES as usize + 4096])
            .unwrap();
        rustix::fs::seek(&fd, rustix::fs::SeekFrom::Start(0)).unwrap();
        assert_eq!(hash_fd(&fd).unwrap(), None, "over the limit while read");
        rustix::fs::seek(&fd, rustix::fs::SeekFrom::Start(0)).unwrap();
        rustix::fs::ftruncate(&fd, 10).unwrap();
        assert!(hash_fd(&fd).unwrap().is_some());
    }

    #[test]
    fn unreadable_entries_are_listed_and_the_rest_still_scans() {
        let (_t, f) = folder();
        f.put("ok.md", b"ok").unwrap();
        f.put("dir/in.md", b"in").unwrap();
        f.put("locked.md", b"l").unwrap();
        std::fs::set_permissions(f.root().join("dir"), std::fs::Permissions::from_mode(0o000))
            .unwrap();
        std::fs::set_permissions(
            f.root().join("locked.md"),
            std::fs::Permissions::from_mode(0o000),
        )
        .unwrap();
        let scan = f.scan().unwrap();
        if rustix::process::geteuid().is_root() {
            // Root reads everything: nothing is unreadable.
            assert!(scan.unreadable.is_empty());
        } else {
            assert_eq!(scan.files.keys().collect::<Vec<_>>(), ["ok.md"]);
            assert_eq!(scan.unreadable, ["dir", "locked.md"]);
            assert!(scan.is_unknown("dir/in.md") && scan.is_unknown("locked.md"));
            assert!(!scan.is_unknown("dirt.md") && !scan.is_unknown("ok.md"));
        }
        // Dispose removes it all anyway: the folder is the worker's own.
        f.dispose().unwrap();
        assert!(!f.root().exists());
    }

    /// A chain past [`MAX_SCAN_DEPTH`] (with a file beside every level and
    /// a wide level in the middle): the scan stops at the cap and lists the
    /// deeper directory as unreadable (so nothing below it reads as
    /// deleted); dispose removes it all, bottom-up, holding one directory's
    /// descriptor at a time.
    #[test]
    fn a_chain_deeper_than_the_cap_is_unknown_and_still_removed() {
        let (_t, f) = folder();
        let depth = MAX_SCAN_DEPTH + 50;
        let mut dir = rustix::fs::open(f.root(), DIR_FLAGS, Mode::empty()).unwrap();
        for level in 0..depth {
            let file = rustix::fs::openat(
                &dir,
                "f.md",
                OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .unwrap();
            rustix::io::write(&file, b"f").unwrap();
            if level == 3 {
                for i in 0..20 {
                    rustix::fs::mkdirat(&dir, format!("w{i}"), Mode::from_raw_mode(0o700)).unwrap();
                }
            }
            rustix::fs::mkdirat(&dir, "d", Mode::from_raw_mode(0o700)).unwrap();
            dir = rustix::fs::openat(&dir, "d", DIR_FLAGS, Mode::empty()).unwrap();
        }
        drop(dir);
        let scan = f.scan().unwrap();
        let capped = vec!["d"; MAX_SCAN_DEPTH + 1].join("/");
        assert_eq!(scan.unreadable, std::slice::from_ref(&capped));
        assert_eq!(
            scan.files.len(),
            MAX_SCAN_DEPTH + 1,
            "f.md at every level walked"
        );
        assert!(scan.is_unknown(&format!("{capped}/f.md")));
        f.dispose().unwrap();
        assert!(!f.root().exists());
    }

    #[test]
    fn a_root_swapped_for_a_symlink_is_reported_and_never_followed() {
        let (t, f) = folder();
        f.put("a.md", b"a").unwrap();
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("secret.md"), "secret").unwrap();
        std::fs::rename(f.root(), t.path().join("moved")).unwrap();
        symlink(&elsewhere, f.root()).unwrap();
        for err in [
            f.scan().unwrap_err(),
            f.get("secret.md").unwrap_err(),
            f.put("planted.md", b"x").unwrap_err(),
            f.dispose().unwrap_err(),
        ] {
            assert!(matches!(err, FolderError::Replaced(_)), "{err}");
            assert!(!err.is_refusal());
        }
        assert!(elsewhere.join("secret.md").exists());
        assert!(!elsewhere.join("planted.md").exists());
        assert!(f.root().is_symlink(), "left alone");
        // Another directory put in its place is taken as the folder (the
        // marker check decides whether it is trusted).
        std::fs::remove_file(f.root()).unwrap();
        std::fs::create_dir(f.root()).unwrap();
        std::fs::write(f.root().join("b.md"), "b").unwrap();
        assert_eq!(f.scan().unwrap().files.keys().collect::<Vec<_>>(), ["b.md"]);
        f.dispose().unwrap();
        assert!(!f.root().exists());
    }

    #[test]
    fn clean_absolute_paths() {
        for ok in ["/mnt/memory/notes", "/a", "/a/./b"] {
            assert!(is_clean_absolute(ok), "{ok}");
        }
        for bad in [
            "relative/notes",
            "notes",
            "/mnt/../../etc/cron.d",
            "/a/..",
            "",
        ] {
            assert!(!is_clean_absolute(bad), "{bad}");
        }
    }
}
