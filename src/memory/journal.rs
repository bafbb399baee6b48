//! The durable commit: each mounted store's sync state, journaled on disk,
//! so a worker that dies mid-session (SIGKILL, the OOM killer, a Lambda
//! timeout) loses no edit that reached the folder.
//!
//! **Where.** One journal per store folder, in the state directory
//! (`--state-dir`), named by a hash of the folder's path — never inside the
//! folder, so the sync never uploads it and an `rm -rf` of the folder leaves
//! it. The directory must survive what the worker does not: an `emptyDir`
//! across container restarts, a volume, a warm Lambda's `/tmp`.
//!
//! **What.** The state that tells a local edit from a conflict: the
//! `baseline` (path → hash both sides held), the `tentative` entries a
//! re-download left, the `sent` uploads whose answer never came, and the
//! `pending` local deletions (path → since when, wall clock).
//!
//! **How.** An append-only log of lines `<crc32 hex> <json>\n`. The first
//! line is the header (version, store id, folder path); every later line
//! sets or clears one entry of one of the four maps. A change enters the log
//! when the store's state lock is released — in the order it was made, and
//! always after the I/O it records completed. A log grown past twice the
//! live state is compacted into a snapshot (temporary file, `fsync`,
//! `rename`, `fsync` of the directory); appends are `fdatasync`'d at the
//! end of each pass. A process death keeps every append (they are in the
//! page cache); a machine crash keeps what the last pass end synced.
//!
//! **Reading back.** A last line without its newline, or a last line whose
//! checksum fails, is a torn tail (the process died mid-append): it is
//! dropped and the lines before it stand. Anything else that fails — the
//! header, or a bad line followed by good ones — is corruption, and the
//! whole journal counts as no baseline. Both are safe because a baseline
//! that lags the truth is safe: every change that enters the baseline
//! records an operation after which both sides hold the same bytes (an
//! upload landed, a pull written, a delete done on both sides), and the
//! three-way merge, replayed without it, finds local equal to remote and
//! keeps it. A missing baseline makes every difference a conflict the
//! server wins, and every local-only file a new memory — never a delete.
//!
//! **Liveness.** Beside each journal is a lock file that the worker which
//! mounted the store holds (`flock`) while the store is mounted. The kernel
//! drops the lock when the process dies, however it dies: a lock that can be
//! taken means its worker is gone, and its folder can be recovered.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::FlockOperation;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

const VERSION: u32 = 1;
/// A journal larger than this is not read (a state of 2,000 memories is ≈ 250 KiB).
const MAX_JOURNAL_BYTES: u64 = 256 * 1024 * 1024;
/// Appends since the last snapshot before compaction is considered.
const MIN_COMPACT_RECORDS: usize = 4096;

/// The state directory could not be used, or a journal could not be written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JournalError {
    #[error("state directory {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "state directory {0} is not a private directory of this user (it must be a directory owned by the worker's user, not writable by others)"
    )]
    NotPrivate(String),
    #[error("another live worker on this host holds the memory store folder {0}")]
    Busy(String),
}

fn io_error(path: &Path, source: std::io::Error) -> JournalError {
    JournalError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Which map of the state a record changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum MapKind {
    #[serde(rename = "b")]
    Baseline,
    #[serde(rename = "t")]
    Tentative,
    #[serde(rename = "s")]
    Sent,
    #[serde(rename = "p")]
    Pending,
}

/// One change: set (`Some`) or clear (`None`) `path` in `map`; a `None`
/// path clears the whole map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record(MapKind, Option<String>, Option<String>);

/// Whose folder a journal describes: checked before a folder is recovered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Owner {
    pub(crate) store: String,
    /// The folder's path as the session gave it (after any remap).
    pub(crate) root: PathBuf,
    /// The session whose worker mounted it: only that session's next claim
    /// recovers its edits (another session's agent must not push them).
    pub(crate) session: String,
    /// The folder directory's device and inode: a path swapped for another
    /// directory (or a symlink) is not the folder. Both 0 until the folder
    /// exists (the journal is made first).
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    /// The kernel's boot id when the folder was made: after a machine crash
    /// the folder's own writes (never `fsync`'d) cannot be trusted, so a
    /// folder from an earlier boot is removed, never recovered.
    #[serde(default)]
    pub(crate) boot: String,
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`); empty when unknown.
pub(crate) fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Header {
    journal: u32,
    #[serde(flatten)]
    owner: Owner,
    /// The folder is being removed (the session is over): a folder found
    /// with such a journal is finished off, never recovered — files already
    /// removed must not read as deletions.
    #[serde(default)]
    disposing: bool,
}

/// The journaled state of one store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub(crate) baseline: BTreeMap<String, String>,
    pub(crate) tentative: BTreeMap<String, String>,
    pub(crate) sent: BTreeMap<String, String>,
    /// Path → since when (milliseconds since the epoch).
    pub(crate) pending: BTreeMap<String, String>,
}

impl Snapshot {
    fn map(&mut self, kind: MapKind) -> &mut BTreeMap<String, String> {
        match kind {
            MapKind::Baseline => &mut self.baseline,
            MapKind::Tentative => &mut self.tentative,
            MapKind::Sent => &mut self.sent,
            MapKind::Pending => &mut self.pending,
        }
    }

    fn apply(&mut self, Record(kind, path, value): Record) {
        let map = self.map(kind);
        match (path, value) {
            (None, _) => map.clear(),
            (Some(path), Some(value)) => {
                map.insert(path, value);
            }
            (Some(path), None) => {
                map.remove(&path);
            }
        }
    }

    fn records(&self) -> impl Iterator<Item = Record> + '_ {
        let kinds = [
            (MapKind::Baseline, &self.baseline),
            (MapKind::Tentative, &self.tentative),
            (MapKind::Sent, &self.sent),
            (MapKind::Pending, &self.pending),
        ];
        kinds.into_iter().flat_map(|(kind, map)| {
            map.iter()
                .map(move |(p, v)| Record(kind, Some(p.clone()), Some(v.clone())))
        })
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.baseline.len() + self.tentative.len() + self.sent.len() + self.pending.len()
    }
}

/// What reading a journal back found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Replay {
    /// The state, and whether a torn last batch was dropped.
    Intact {
        owner: Owner,
        state: Snapshot,
        torn: bool,
        disposing: bool,
    },
    /// The checksums tell the journal is damaged: no baseline. `owner`
    /// when the header itself is intact (else nothing can be trusted).
    Corrupt {
        owner: Option<Owner>,
        reason: String,
    },
}

fn corrupt(owner: Option<Owner>, reason: impl Into<String>) -> Replay {
    Replay::Corrupt {
        owner,
        reason: reason.into(),
    }
}

fn line(json: &[u8]) -> Vec<u8> {
    let mut out = format!("{:08x} ", crc32fast::hash(json)).into_bytes();
    out.extend_from_slice(json);
    out.push(b'\n');
    out
}

fn decode_line<T: serde::de::DeserializeOwned>(line: &[u8]) -> Option<T> {
    let (crc, json) = (line.get(..8)?, line.get(9..)?);
    if line.get(8) != Some(&b' ') {
        return None;
    }
    let crc = u32::from_str_radix(std::str::from_utf8(crc).ok()?, 16).ok()?;
    if crc != crc32fast::hash(json) {
        return None;
    }
    serde_json::from_slice(json).ok()
}

/// Read a journal's bytes back (see the module docs for torn and corrupt).
/// Every line after the header is one batch of records (what one release
/// of the state lock changed): a batch applies whole or not at all.
pub(crate) fn replay(bytes: &[u8]) -> Replay {
    let mut lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    // The piece after the last newline is a batch that never finished.
    let unfinished = lines.pop().is_some_and(|rest| !rest.is_empty());
    let Some((first, rest)) = lines.split_first() else {
        return corrupt(None, "the journal has no header");
    };
    let Some(header) = decode_line::<Header>(first) else {
        return corrupt(None, "the journal's header fails its checksum");
    };
    if header.journal != VERSION {
        return corrupt(None, format!("unknown journal version {}", header.journal));
    }
    let mut state = Snapshot::default();
    let mut torn = unfinished;
    for (i, raw) in rest.iter().enumerate() {
        match decode_line::<Vec<Record>>(raw) {
            Some(batch) => batch.into_iter().for_each(|r| state.apply(r)),
            None if i + 1 == rest.len() && !unfinished => torn = true,
            None => {
                return corrupt(
                    Some(header.owner),
                    format!("batch {} of the journal fails its checksum", i + 1),
                );
            }
        }
    }
    Replay::Intact {
        owner: header.owner,
        state,
        torn,
        disposing: header.disposing,
    }
}

/// Milliseconds since the epoch of an `Instant` in the past (a pending
/// deletion's start), for the journal.
pub(crate) fn wall_ms(at: Instant) -> String {
    let wall = SystemTime::now()
        .checked_sub(at.elapsed())
        .unwrap_or(UNIX_EPOCH);
    wall.duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis()
        .to_string()
}

/// The worker's state directory: private to the worker's user.
#[derive(Debug, Clone)]
pub(crate) struct StateDir {
    path: PathBuf,
}

impl StateDir {
    /// Create (`0700`) or open the directory; refuse one another user owns
    /// or others can write to (they could plant a journal).
    pub(crate) fn open(path: &Path) -> Result<StateDir, JournalError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(|e| io_error(path, e))?;
        let meta = std::fs::symlink_metadata(path).map_err(|e| io_error(path, e))?;
        let euid = rustix::process::geteuid().as_raw();
        if !meta.is_dir() || meta.uid() != euid || meta.permissions().mode() & 0o022 != 0 {
            return Err(JournalError::NotPrivate(path.display().to_string()));
        }
        Ok(StateDir {
            path: path.to_path_buf(),
        })
    }

    /// The journal's file name stem for a folder: a hash of its path.
    fn stem(root: &Path) -> String {
        use std::os::unix::ffi::OsStrExt;
        hex::encode(&Sha256::digest(root.as_os_str().as_bytes())[..16])
    }

    #[cfg(test)]
    pub(crate) fn journal_path(&self, root: &Path) -> PathBuf {
        self.file(&Self::stem(root), "journal")
    }

    fn file(&self, stem: &str, ext: &str) -> PathBuf {
        self.path.join(format!("{stem}.{ext}"))
    }

    /// Take the lock of the folder at `root`, without waiting.
    fn lock(&self, stem: &str) -> Result<File, JournalError> {
        let path = self.file(stem, "lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc_nofollow())
            .open(&path)
            .map_err(|e| io_error(&path, e))?;
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(JournalError::Busy(path.display().to_string()));
            }
            Err(e) => return Err(io_error(&path, e.into())),
        }
        // The lock file may have been removed (and a new one made) between
        // our open and our lock, by its holder letting it go: then the lock
        // we hold guards nothing. Only the file at the path counts.
        let held = file.metadata().map_err(|e| io_error(&path, e))?;
        match std::fs::symlink_metadata(&path) {
            Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => Ok(file),
            _ => Err(JournalError::Busy(path.display().to_string())),
        }
    }

    /// A new journal for a store just created at `owner.root`, holding
    /// `state`: the lock is taken first, and any journal left at the same
    /// path (by a worker that is gone) is replaced.
    pub(crate) fn create(&self, owner: Owner, state: &Snapshot) -> Result<Journal, JournalError> {
        let stem = Self::stem(&owner.root);
        let lock = self.lock(&stem)?;
        self.adopt(lock, stem, owner, state)
    }

    fn adopt(
        &self,
        lock: File,
        stem: String,
        owner: Owner,
        state: &Snapshot,
    ) -> Result<Journal, JournalError> {
        let path = self.file(&stem, "journal");
        let mut journal = Journal {
            dir: self.path.clone(),
            path: path.clone(),
            header: Header {
                journal: VERSION,
                owner,
                disposing: false,
            },
            file: None,
            lock,
            appended: 0,
            unsynced: false,
        };
        journal.snapshot(state).map_err(|e| io_error(&path, e))?;
        Ok(journal)
    }

    /// The journal left at `root` by a worker that is gone: `Ok(None)` when
    /// there is none; [`JournalError::Busy`] when a live worker holds it.
    /// On success the lock is held and the caller owns the journal — it is
    /// rewritten (compacted) from what was read, so a torn tail is gone.
    pub(crate) fn claim(
        &self,
        root: &Path,
    ) -> Result<Option<(Replay, JournalClaim)>, JournalError> {
        let stem = Self::stem(root);
        let path = self.file(&stem, "journal");
        if !path.exists() {
            return Ok(None);
        }
        let lock = self.lock(&stem)?;
        let replay = match read_bounded(&path) {
            Ok(bytes) => replay(&bytes),
            Err(e) => corrupt(None, format!("the journal cannot be read: {e}")),
        };
        Ok(Some((
            replay,
            JournalClaim {
                dir: self.clone(),
                stem,
                lock,
            },
        )))
    }

    /// Every journal whose worker is gone (its lock free), claimed. Also
    /// removes the temporary files of snapshots whose worker died before
    /// the rename (older than a minute: a live worker's is renamed within
    /// milliseconds).
    pub(crate) fn orphans(&self) -> Vec<(Replay, JournalClaim)> {
        let Ok(entries) = std::fs::read_dir(&self.path) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name.to_str().is_some_and(|n| n.starts_with(".journal-"))
                && entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > Duration::from_secs(60)))
            {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".journal")) else {
                continue;
            };
            let Ok(lock) = self.lock(stem) else { continue };
            let replay = match read_bounded(&entry.path()) {
                Ok(bytes) => replay(&bytes),
                Err(e) => corrupt(None, format!("the journal cannot be read: {e}")),
            };
            out.push((
                replay,
                JournalClaim {
                    dir: self.clone(),
                    stem: stem.to_string(),
                    lock,
                },
            ));
        }
        out
    }
}

fn libc_nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc_nofollow())
        .open(path)?;
    let mut bytes = Vec::new();
    file.take(MAX_JOURNAL_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_JOURNAL_BYTES {
        return Err(std::io::Error::other(format!(
            "the journal is larger than {MAX_JOURNAL_BYTES} bytes"
        )));
    }
    Ok(bytes)
}

/// A dead worker's journal, locked by this process: turn it into this
/// worker's journal, or remove it.
#[derive(Debug)]
pub(crate) struct JournalClaim {
    dir: StateDir,
    stem: String,
    lock: File,
}

impl JournalClaim {
    /// Continue the journal as this worker's, starting from `state`.
    pub(crate) fn into_journal(
        self,
        owner: Owner,
        state: &Snapshot,
    ) -> Result<Journal, JournalError> {
        let JournalClaim { dir, stem, lock } = self;
        dir.adopt(lock, stem, owner, state)
    }

    /// Remove the journal and its lock (the folder is gone or was let go).
    pub(crate) fn remove(self) {
        let _ = std::fs::remove_file(self.dir.file(&self.stem, "journal"));
        let _ = std::fs::remove_file(self.dir.file(&self.stem, "lock"));
    }
}

/// One mounted store's journal, locked by this worker while it lives.
#[derive(Debug)]
pub(crate) struct Journal {
    dir: PathBuf,
    path: PathBuf,
    header: Header,
    /// The append handle; `None` until the first snapshot lands.
    file: Option<File>,
    lock: File,
    /// Records appended since the last snapshot.
    appended: usize,
    /// Appended since the last `fdatasync`.
    unsynced: bool,
}

impl Journal {
    /// Append `records` as one batch: one line, one `write`.
    pub(crate) fn append(&mut self, records: &[Record]) -> std::io::Result<()> {
        let Some(file) = self.file.as_mut() else {
            return Err(std::io::Error::other("the journal has no file"));
        };
        let buf = line(&serde_json::to_vec(records).map_err(std::io::Error::other)?);
        if cfg!(debug_assertions) {
            // The crash test kills here with half the batch written: a torn tail.
            let half = buf.len() / 2;
            file.write_all(&buf[..half])?;
            crate::killpoint::hit("memory.journal.append");
            file.write_all(&buf[half..])?;
        } else {
            file.write_all(&buf)?;
        }
        self.appended += records.len();
        self.unsynced = true;
        Ok(())
    }

    /// Compact when the log has grown past twice the live state.
    pub(crate) fn compaction_due(&self, live: usize) -> bool {
        self.appended > MIN_COMPACT_RECORDS.max(live * 2)
    }

    /// Replace the log by a snapshot of `state`: temporary file, `fsync`,
    /// `rename` over the journal, `fsync` of the directory.
    pub(crate) fn snapshot(&mut self, state: &Snapshot) -> std::io::Result<()> {
        let mut tmp = tempfile::Builder::new()
            .prefix(".journal-")
            .tempfile_in(&self.dir)?;
        {
            let mut out = std::io::BufWriter::new(tmp.as_file_mut());
            out.write_all(&line(
                &serde_json::to_vec(&self.header).map_err(std::io::Error::other)?,
            ))?;
            for record in state.records() {
                out.write_all(&line(
                    &serde_json::to_vec(&[record]).map_err(std::io::Error::other)?,
                ))?;
            }
            out.flush()?;
        }
        tmp.as_file().sync_data()?;
        crate::killpoint::hit("memory.journal.snapshot");
        let file = tmp.persist(&self.path).map_err(|e| e.error)?;
        File::open(&self.dir)?.sync_all()?;
        let mut file = file;
        use std::io::Seek;
        file.seek(std::io::SeekFrom::End(0))?;
        self.file = Some(file);
        self.appended = 0;
        self.unsynced = false;
        Ok(())
    }

    /// A handle to make the appends durable with (`fdatasync`, off the
    /// state lock); `None` when nothing was appended since the last one.
    pub(crate) fn take_unsynced(&mut self) -> Option<File> {
        if !self.unsynced {
            return None;
        }
        self.unsynced = false;
        self.file.as_ref().and_then(|f| f.try_clone().ok())
    }

    /// The folder now exists: record its device and inode (a journal is
    /// created before its folder, with none, so no folder is ever without
    /// its journal).
    pub(crate) fn set_identity(&mut self, dev: u64, ino: u64) -> std::io::Result<()> {
        (self.header.owner.dev, self.header.owner.ino) = (dev, ino);
        self.snapshot(&Snapshot::default())
    }

    /// The session is over and the folder is about to be removed: say so
    /// first (durably), so a removal cut short is finished by the next
    /// mount, never recovered — the files it already removed must not read
    /// as deletions.
    pub(crate) fn mark_disposing(&mut self) -> std::io::Result<()> {
        self.header.disposing = true;
        self.snapshot(&Snapshot::default())
    }

    /// The folder is gone: remove the journal and its lock file, then let
    /// the lock go.
    pub(crate) fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_file(self.path.with_extension("lock"));
        drop(self.lock);
    }
}

/// How a journaled map's value is written in the journal.
pub(crate) trait JournalValue {
    fn journal_value(&self) -> String;
}

impl JournalValue for String {
    fn journal_value(&self) -> String {
        self.clone()
    }
}

impl JournalValue for Instant {
    fn journal_value(&self) -> String {
        wall_ms(*self)
    }
}

/// A journaled map of the store's state: a path-sorted map that remembers
/// each change made to it since the last commit. The store's state lock
/// takes the changes and appends them when it is released
/// (`store::StateGuard`), so no mutation can skip the journal.
#[derive(Debug)]
pub(crate) struct Tracked<V> {
    kind: MapKind,
    map: BTreeMap<String, V>,
    changes: Vec<Record>,
}

impl<V: JournalValue + PartialEq> Tracked<V> {
    pub(crate) fn new(kind: MapKind) -> Self {
        Tracked {
            kind,
            map: BTreeMap::new(),
            changes: Vec::new(),
        }
    }

    /// A map restored from a journal: nothing to record, it is there already.
    pub(crate) fn restored(kind: MapKind, map: BTreeMap<String, V>) -> Self {
        Tracked {
            kind,
            map,
            changes: Vec::new(),
        }
    }

    pub(crate) fn get(&self, path: &str) -> Option<&V> {
        self.map.get(path)
    }

    pub(crate) fn contains_key(&self, path: &str) -> bool {
        self.map.contains_key(path)
    }

    pub(crate) fn iter(&self) -> std::collections::btree_map::Iter<'_, String, V> {
        self.map.iter()
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn as_map(&self) -> &BTreeMap<String, V> {
        &self.map
    }

    /// Set `path` (recorded only when its value changes).
    pub(crate) fn insert(&mut self, path: String, value: V) -> Option<V> {
        if self.map.get(&path) == Some(&value) {
            return Some(value);
        }
        self.changes.push(Record(
            self.kind,
            Some(path.clone()),
            Some(value.journal_value()),
        ));
        self.map.insert(path, value)
    }

    /// Insert unless the path is there already (`entry().or_insert()`).
    pub(crate) fn insert_if_absent(&mut self, path: &str, value: V) {
        if !self.map.contains_key(path) {
            self.insert(path.to_string(), value);
        }
    }

    pub(crate) fn remove(&mut self, path: &str) -> Option<V> {
        let old = self.map.remove(path);
        if old.is_some() {
            self.changes
                .push(Record(self.kind, Some(path.to_string()), None));
        }
        old
    }

    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&String, &mut V) -> bool) {
        let (kind, changes) = (self.kind, &mut self.changes);
        self.map.retain(|path, value| {
            let kept = keep(path, value);
            if !kept {
                changes.push(Record(kind, Some(path.clone()), None));
            }
            kept
        });
    }

    pub(crate) fn clear(&mut self) {
        if !self.map.is_empty() {
            self.map.clear();
            self.changes.push(Record(self.kind, None, None));
        }
    }

    /// Empty the map, returning what it held.
    pub(crate) fn take(&mut self) -> BTreeMap<String, V> {
        let old = std::mem::take(&mut self.map);
        if !old.is_empty() {
            self.changes.push(Record(self.kind, None, None));
        }
        old
    }

    pub(crate) fn extend(&mut self, entries: impl IntoIterator<Item = (String, V)>) {
        for (path, value) in entries {
            self.insert(path, value);
        }
    }

    /// Move the changes since the last commit to `out`.
    pub(crate) fn drain_changes(&mut self, out: &mut Vec<Record>) {
        out.append(&mut self.changes);
    }

    /// The map as the journal writes it.
    pub(crate) fn journal_map(&self) -> BTreeMap<String, String> {
        self.map
            .iter()
            .map(|(p, v)| (p.clone(), v.journal_value()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> Snapshot {
        let mut s = Snapshot::default();
        s.baseline.insert("a.md".into(), "aa".into());
        s.baseline.insert("dir/b\nc.md".into(), "bb".into());
        s.tentative.insert("t.md".into(), "tt".into());
        s.sent.insert("a.md".into(), "a2".into());
        s.pending.insert("gone.md".into(), "1700000000000".into());
        s
    }

    fn owner() -> Owner {
        Owner {
            store: "memstore_1".into(),
            root: "/mnt/memory/notes".into(),
            session: "sesn_1".into(),
            dev: 1,
            ino: 2,
            boot: boot_id(),
        }
    }

    fn journal(dir: &StateDir) -> Journal {
        dir.create(owner(), &state()).unwrap()
    }

    fn bytes(dir: &StateDir) -> Vec<u8> {
        let stem = StateDir::stem(Path::new("/mnt/memory/notes"));
        std::fs::read(dir.file(&stem, "journal")).unwrap()
    }

    fn intact(replay: Replay) -> (Snapshot, bool) {
        match replay {
            Replay::Intact { state, torn, .. } => (state, torn),
            Replay::Corrupt { reason, .. } => panic!("corrupt: {reason}"),
        }
    }

    #[test]
    fn a_snapshot_and_its_appends_replay_to_the_same_state() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(&tmp.path().join("state")).unwrap();
        let mut j = journal(&dir);
        j.append(&[
            Record(MapKind::Baseline, Some("new.md".into()), Some("nn".into())),
            Record(MapKind::Baseline, Some("a.md".into()), None),
            Record(MapKind::Sent, None, None),
        ])
        .unwrap();
        let mut want = state();
        want.baseline.insert("new.md".into(), "nn".into());
        want.baseline.remove("a.md");
        want.sent.clear();
        match replay(&bytes(&dir)) {
            Replay::Intact {
                owner: found,
                state,
                torn,
                disposing,
            } => {
                assert_eq!(found, owner());
                assert_eq!(state, want);
                assert!(!torn && !disposing);
            }
            Replay::Corrupt { reason, .. } => panic!("corrupt: {reason}"),
        }
    }

    #[test]
    fn a_torn_last_record_is_dropped_and_the_rest_stands() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(&tmp.path().join("state")).unwrap();
        let mut j = journal(&dir);
        j.append(&[Record(
            MapKind::Baseline,
            Some("new.md".into()),
            Some("nn".into()),
        )])
        .unwrap();
        let full = bytes(&dir);
        // Every cut inside the last record: unfinished, or (cut right
        // before its newline) finished with a failing checksum.
        let last_start = full[..full.len() - 1]
            .iter()
            .rposition(|b| *b == b'\n')
            .unwrap()
            + 1;
        for cut in last_start + 1..full.len() {
            let (got, torn) = intact(replay(&full[..cut]));
            assert_eq!(got, state(), "cut at {cut}");
            assert!(torn, "cut at {cut}");
        }
        // A flipped bit in the last record: torn, too.
        let mut flipped = full.clone();
        flipped[full.len() - 3] ^= 1;
        let (got, torn) = intact(replay(&flipped));
        assert_eq!(got, state());
        assert!(torn);
    }

    #[test]
    fn damage_before_the_last_record_or_in_the_header_is_corruption() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(&tmp.path().join("state")).unwrap();
        journal(&dir);
        let full = bytes(&dir);
        // A flipped byte in the header: nothing can be trusted.
        let header_end = full.iter().position(|b| *b == b'\n').unwrap();
        let mut bad = full.clone();
        bad[12] ^= 0x20;
        assert_eq!(
            replay(&bad),
            Replay::Corrupt {
                owner: None,
                reason: "the journal's header fails its checksum".into()
            }
        );
        // In the first batch (others follow): corrupt, the owner still known.
        let mut bad = full.clone();
        bad[header_end + 12] ^= 0x20;
        assert!(
            matches!(replay(&bad), Replay::Corrupt { owner: Some(o), .. } if o == owner()),
            "a flipped byte in a middle batch must be caught"
        );
        assert!(matches!(replay(b""), Replay::Corrupt { owner: None, .. }));
        assert!(matches!(
            replay(b"garbage"),
            Replay::Corrupt { owner: None, .. }
        ));
    }

    #[test]
    fn a_live_lock_keeps_others_out_and_a_dead_one_lets_them_claim() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(&tmp.path().join("state")).unwrap();
        let root = &owner().root;
        let j = journal(&dir);
        assert!(matches!(dir.claim(root), Err(JournalError::Busy(_))));
        assert!(dir.orphans().is_empty(), "a held journal is no orphan");
        drop(j);
        let (replay, claim) = dir.claim(root).unwrap().expect("a journal is there");
        assert_eq!(intact(replay).0, state());
        assert!(matches!(dir.claim(root), Err(JournalError::Busy(_))));
        claim.remove();
        assert!(dir.claim(root).unwrap().is_none());
    }

    #[test]
    fn a_batch_applies_whole_or_not_at_all() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(&tmp.path().join("state")).unwrap();
        let mut j = journal(&dir);
        // The re-download's first batch: the baseline moves to tentative.
        j.append(&[
            Record(MapKind::Baseline, None, None),
            Record(MapKind::Tentative, Some("a.md".into()), Some("aa".into())),
        ])
        .unwrap();
        let full = bytes(&dir);
        let (got, _) = intact(replay(&full[..full.len() - 20]));
        assert_eq!(
            got,
            state(),
            "a torn batch: none of it, not the clear alone"
        );
        let (got, _) = intact(replay(&full));
        assert!(got.baseline.is_empty() && got.tentative.contains_key("a.md"));
    }

    #[test]
    fn a_disposing_journal_says_so_and_holds_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(&tmp.path().join("state")).unwrap();
        let mut j = journal(&dir);
        j.mark_disposing().unwrap();
        match replay(&bytes(&dir)) {
            Replay::Intact {
                state, disposing, ..
            } => {
                assert!(disposing);
                assert_eq!(state, Snapshot::default());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_journal_over_the_size_limit_is_not_read_as_a_torn_one() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("big.journal");
        let file = File::create(&path).unwrap();
        file.set_len(MAX_JOURNAL_BYTES + 1).unwrap();
        assert!(read_bounded(&path).is_err());
    }

    #[test]
    fn compaction_keeps_the_state_and_resets_the_log() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(&tmp.path().join("state")).unwrap();
        let mut j = journal(&dir);
        let mut want = state();
        for i in 0..MIN_COMPACT_RECORDS + 1 {
            let (p, v) = (format!("f{}.md", i % 10), format!("{i}"));
            j.append(&[Record(MapKind::Baseline, Some(p.clone()), Some(v.clone()))])
                .unwrap();
            want.baseline.insert(p, v);
        }
        assert!(j.compaction_due(want.len()));
        let before = bytes(&dir).len();
        j.snapshot(&want).unwrap();
        assert!(!j.compaction_due(want.len()));
        assert!(bytes(&dir).len() < before / 10);
        assert_eq!(intact(replay(&bytes(&dir))).0, want);
    }

    #[test]
    fn a_state_dir_others_can_write_to_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state");
        std::fs::create_dir(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            StateDir::open(&path),
            Err(JournalError::NotPrivate(_))
        ));
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(tmp.path(), &link).unwrap();
        assert!(matches!(
            StateDir::open(&link),
            Err(JournalError::NotPrivate(_))
        ));
    }
}
