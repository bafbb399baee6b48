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
//!
//! The parts, each one concept; each uses only parts listed before it:
//!
//! - `format` — the lines, the header and the records, and the state they
//!   describe ([`Snapshot`]);
//! - `replay` — a journal read back: torn tail or corruption;
//! - `log` — one mounted store's journal: append, sync, compact;
//! - `state_dir` — where journals live, their locks, and the claim of a dead
//!   worker's;
//! - `tracked` — the state's maps, recording each change for the journal.

mod format;
mod log;
mod replay;
mod state_dir;
mod tracked;

pub(crate) use self::format::{MapKind, Owner, Snapshot, boot_id};
pub(crate) use self::log::Journal;
pub(crate) use self::replay::Replay;
#[cfg(test)]
pub(crate) use self::replay::replay;
pub(crate) use self::state_dir::{JournalClaim, JournalError, StateDir};
pub(crate) use self::tracked::Tracked;

/// The fixtures the parts' tests share: a state, its owner, a journal of
/// it, and its bytes read back.
#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    pub(super) fn state() -> Snapshot {
        let mut s = Snapshot::default();
        s.baseline.insert("a.md".into(), "aa".into());
        s.baseline.insert("dir/b\nc.md".into(), "bb".into());
        s.tentative.insert("t.md".into(), "tt".into());
        s.sent.insert("a.md".into(), "a2".into());
        s.pending.insert("gone.md".into(), "1700000000000".into());
        s
    }

    pub(super) fn owner() -> Owner {
        Owner {
            store: "memstore_1".into(),
            root: "/mnt/memory/notes".into(),
            session: "sesn_1".into(),
            dev: 1,
            ino: 2,
            boot: boot_id(),
        }
    }

    pub(super) fn journal(dir: &StateDir) -> Journal {
        dir.create(owner(), &state()).unwrap()
    }

    pub(super) fn bytes(dir: &StateDir) -> Vec<u8> {
        let stem = StateDir::stem(Path::new("/mnt/memory/notes"));
        std::fs::read(dir.file(&stem, "journal")).unwrap()
    }

    pub(super) fn intact(replay: Replay) -> (Snapshot, bool) {
        match replay {
            Replay::Intact { state, torn, .. } => (state, torn),
            Replay::Corrupt { reason, .. } => panic!("corrupt: {reason}"),
        }
    }
}
