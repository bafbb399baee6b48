//! The worker's state directory, where the journals live: private to the
//! worker's user, one journal per store folder named by a hash of the
//! folder's path, each beside a lock file its worker holds (`flock`) while
//! the store is mounted. A lock that can be taken means its worker is
//! gone: its journal is claimed, to recover the folder or let it go.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::FlockOperation;
use sha2::{Digest, Sha256};

use super::format::{Owner, Snapshot};
use super::log::Journal;
use super::replay::{Replay, corrupt, replay};

/// How long a held lock is waited for before its holder counts as a live
/// worker. A file lock belongs to the open file, and every child this
/// process forks shares its open files until its `execve` closes them
/// (they are close-on-exec; Linux has no close-on-fork): while a shell or
/// a supervisor is being started, a lock let go of a moment ago — a
/// session's stores dropped and the session claimed again in the same
/// process — still looks held. A live worker holds its lock for as long as
/// the store is mounted, so a short wait tells the two apart.
pub(crate) const LOCK_WAIT: Duration = Duration::from_secs(1);

/// A journal larger than this is not read (a state of 2,000 memories is ≈ 250 KiB).
const MAX_JOURNAL_BYTES: u64 = 256 * 1024 * 1024;

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
    pub(super) fn stem(root: &Path) -> String {
        use std::os::unix::ffi::OsStrExt;
        hex::encode(&Sha256::digest(root.as_os_str().as_bytes())[..16])
    }

    #[cfg(test)]
    pub(crate) fn journal_path(&self, root: &Path) -> PathBuf {
        self.file(&Self::stem(root), "journal")
    }

    pub(super) fn file(&self, stem: &str, ext: &str) -> PathBuf {
        self.path.join(format!("{stem}.{ext}"))
    }

    /// Take the lock of the folder at `stem`; a held one is waited for up to
    /// [`LOCK_WAIT`] when `patient` (see there), else refused at once.
    fn lock(&self, stem: &str, patient: bool) -> Result<File, JournalError> {
        let until = Instant::now() + if patient { LOCK_WAIT } else { Duration::ZERO };
        let mut pause = Duration::from_millis(1);
        loop {
            match self.try_lock(stem) {
                Err(JournalError::Busy(_)) if Instant::now() < until => {
                    std::thread::sleep(pause.min(until.saturating_duration_since(Instant::now())));
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                taken => return taken,
            }
        }
    }

    /// Take the lock of the folder at `stem`, without waiting.
    fn try_lock(&self, stem: &str) -> Result<File, JournalError> {
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
    /// `state`: the lock is taken first (a held one waited for up to
    /// [`LOCK_WAIT`]: blocking), and any journal left at the same path (by
    /// a worker that is gone) is replaced.
    pub(crate) fn create(&self, owner: Owner, state: &Snapshot) -> Result<Journal, JournalError> {
        let stem = Self::stem(&owner.root);
        let lock = self.lock(&stem, true)?;
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
        Journal::begin(self.path.clone(), path.clone(), owner, lock, state)
            .map_err(|e| io_error(&path, e))
    }

    /// The journal left at `root` by a worker that is gone: `Ok(None)` when
    /// there is none; [`JournalError::Busy`] when a live worker holds it
    /// (held for [`LOCK_WAIT`]: blocking).
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
        let lock = self.lock(&stem, true)?;
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
            // Not waited for: a journal held at start is a live worker's,
            // and one held for a moment is claimed by the mount of its
            // folder, which waits.
            let Ok(lock) = self.lock(stem, false) else {
                continue;
            };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::journal::tests::{intact, journal, owner, state};

    #[test]
    fn a_live_lock_keeps_others_out_and_a_dead_one_lets_them_claim() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(&tmp.path().join("state")).unwrap();
        let root = &owner().root;
        let j = journal(&dir);
        let asked = Instant::now();
        assert!(matches!(dir.claim(root), Err(JournalError::Busy(_))));
        assert!(asked.elapsed() >= LOCK_WAIT, "a held lock is waited for");
        let asked = Instant::now();
        assert!(dir.orphans().is_empty(), "a held journal is no orphan");
        assert!(
            asked.elapsed() < LOCK_WAIT,
            "the start's sweep waits for none"
        );
        drop(j);
        let (replay, claim) = dir.claim(root).unwrap().expect("a journal is there");
        assert_eq!(intact(replay).0, state());
        assert!(matches!(dir.claim(root), Err(JournalError::Busy(_))));
        claim.remove();
        assert!(dir.claim(root).unwrap().is_none());
    }

    /// A child forked while the lock is held shares it until its `execve`
    /// (or exit): a journal let go of meanwhile is claimed once the child
    /// lets go — not refused as a live worker's.
    #[test]
    fn a_lock_a_forked_child_shares_until_its_exec_is_waited_for() {
        use std::io::Read as _;
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(&tmp.path().join("state")).unwrap();
        let root = &owner().root;
        let j = journal(&dir);
        let (mut started, forked) = std::io::pipe().unwrap();
        let child = std::thread::spawn(move || {
            use std::os::fd::AsRawFd as _;
            use std::os::unix::process::CommandExt as _;
            let fd = forked.as_raw_fd();
            let mut command = std::process::Command::new("true");
            // SAFETY: `write` and `nanosleep` only, both async-signal-safe.
            unsafe {
                command.pre_exec(move || {
                    libc::write(fd, b"f".as_ptr().cast(), 1);
                    let pause = libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 300_000_000,
                    };
                    libc::nanosleep(&pause, std::ptr::null_mut());
                    Ok(())
                });
            }
            command.status().unwrap()
        });
        // The child is forked: it holds the lock's open file too.
        started.read_exact(&mut [0]).unwrap();
        drop(j);
        let asked = Instant::now();
        let claimed = dir.claim(root);
        let waited = asked.elapsed();
        assert!(child.join().unwrap().success());
        let (replay, _claim) = claimed.expect("claimed").expect("a journal is there");
        assert_eq!(intact(replay).0, state());
        assert!(
            waited >= Duration::from_millis(100) && waited < LOCK_WAIT,
            "the claim waited {waited:?} for the child's exec"
        );
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
