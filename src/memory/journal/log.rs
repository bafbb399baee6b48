//! One mounted store's journal, the durable log: a batch appended in one
//! `write`, the appends made durable (`fdatasync`) off the state lock, and
//! the log compacted into a snapshot (temporary file, `fsync`, `rename`,
//! `fsync` of the directory) once it outgrows twice the live state.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;

use super::format::{Header, Owner, Record, Snapshot, VERSION, line};

/// Appends since the last snapshot before compaction is considered.
const MIN_COMPACT_RECORDS: usize = 4096;

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
    /// A journal of `owner`'s folder at `path` (in the state directory
    /// `dir`), its `lock` held, starting as a snapshot of `state`.
    pub(super) fn begin(
        dir: PathBuf,
        path: PathBuf,
        owner: Owner,
        lock: File,
        state: &Snapshot,
    ) -> std::io::Result<Journal> {
        let mut journal = Journal {
            dir,
            path,
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
        journal.snapshot(state)?;
        Ok(journal)
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::journal::StateDir;
    use crate::memory::journal::format::MapKind;
    use crate::memory::journal::replay::{Replay, replay};
    use crate::memory::journal::tests::{bytes, intact, journal, state};

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
}
