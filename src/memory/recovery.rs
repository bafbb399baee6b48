//! Folders a dead worker left: recovered when their store is mounted again,
//! or let go at start when they hold nothing unsynced.
//!
//! A worker killed mid-session (SIGKILL, the OOM killer, a Lambda timeout)
//! leaves its store folders on disk, with their journals in the state
//! directory (see `journal`). Without recovery the next
//! mount at that path refuses ("something already exists"), and the edits
//! made since the last sync are lost.
//!
//! The rules, in the order they are checked:
//! - **Only a dead worker's folder.** The journal's lock must be free (the
//!   kernel released it when its worker died); a live worker's folder is
//!   refused, as before.
//! - **Only our folder, for this store.** The journal's header must be
//!   readable and name this store and this path, the folder must be the very
//!   directory it names (device and inode: not a symlink, not another
//!   directory put in its place), and the folder's marker must name this
//!   store; otherwise the folder is hands-off, exactly as a folder without a
//!   journal is.
//! - **Only for its own session.** A folder another session's worker left
//!   is recovered only when that session is claimed again; when it holds
//!   nothing unsynced it is removed so it blocks no mount, otherwise the
//!   mount fails naming the session. (The agent may run as the worker's own
//!   user and write the state directory: binding edits to their session
//!   means no agent can plant memories into another session's mount.)
//! - **A removal cut short is finished.** Dispose marks the journal before
//!   it removes anything; a folder found so marked is removed and mounted
//!   afresh, never recovered (the files already gone are not deletions).
//! - **Recovered, then reused.** The folder is adopted, the store's state is
//!   restored from the journal, and one ordinary sync pass runs before the
//!   agent does: local edits against the journaled baseline are pushed with
//!   the usual preconditions (the server wins a real conflict; nothing it
//!   changed meanwhile is overwritten); remote changes are pulled.
//! - **Never a delete without corroboration.** Deletions that were waiting
//!   in the dead worker start their window again: a file missing from a
//!   recovered folder is deleted on the server only after this worker's own
//!   scans have seen it missing for the whole window (or the session's final
//!   sync, as for any deletion).
//! - **A damaged journal is no baseline.** When its header still names the
//!   owner, every difference from the server is then a conflict the server
//!   wins, and a file the server lacks is uploaded as new — nothing is
//!   deleted on the server. A journal whose header is damaged is hands-off.
//!
//! At start ([`let_go_of_clean_folders`]), a folder whose journal is
//! orphaned and whose files are exactly its journaled baseline holds
//! nothing to lose: it is removed with its journal, so it blocks no path.
//! A folder that does hold unsynced edits is kept for the mount that will
//! recover it (the memory endpoints accept only the item's own sessions
//! token, so no push can happen before its session is claimed again).

use std::path::Path;

use tracing::{info, warn};

use super::MemoryError;
use super::folder::Folder;
use super::journal::{JournalClaim, JournalError, Owner, Replay, Snapshot, StateDir, boot_id};
use super::store::{AttachedStore, MARKER_PATH, marks_store};

/// The mount's error for a path something else already occupies.
pub(crate) fn occupied(root: &Path, store_id: &str) -> MemoryError {
    MemoryError::Mount(format!(
        "something already exists at the memory store's path: {} (memory_store_id={store_id}); it must not exist when the session starts",
        root.display()
    ))
}

/// The folder at a store's path is held by a live worker (or session) on
/// this host: named by the folder, not by its journal's lock file.
pub(crate) fn in_use(root: &Path, store_id: &str) -> MemoryError {
    MemoryError::InUse(format!(
        "another live worker on this host holds the memory store folder {} (memory_store_id={store_id}); a session's store can be mounted by one worker at a time",
        root.display()
    ))
}

/// What became of a folder found at a store's path.
pub(crate) enum Adopted {
    /// A dead worker's folder of this session: restored, ready for its
    /// recovery pass.
    Store(Box<AttachedStore>),
    /// It held nothing to recover (a removal cut short, or nothing
    /// unsynced of another session): removed; mount afresh.
    Cleared,
}

/// Does the folder (root attached) hold exactly its journaled baseline,
/// with no upload in flight and no re-download half done?
fn is_clean(folder: &Folder, state: &Snapshot) -> bool {
    let Ok(scan) = folder.scan() else {
        return false;
    };
    let mut files = scan.files;
    files.remove(MARKER_PATH);
    scan.unreadable.is_empty()
        && state.sent.is_empty()
        && state.tentative.is_empty()
        && files == state.baseline
}

/// The checks every left folder passes before anything is done with it:
/// it is the very directory the journal names (device and inode — a path
/// swapped for another directory or a symlink is not it), and its marker
/// names the journal's store. `None`: hands off.
fn attach(root: &Path, owner: &Owner) -> Option<Folder> {
    let folder = Folder::open(root, true).ok()?;
    if folder.removed_on_dispose() {
        return None;
    }
    folder.attach_root().ok()?;
    (folder.identity() == Some((owner.dev, owner.ino)) && marks_store(&folder, &owner.store))
        .then_some(folder)
}

/// Was the dead worker still making the folder? Its journal is made
/// first and names the folder's identity once the folder exists; the
/// marker is the first thing written in it. So: no identity yet, or the
/// very directory named, still empty.
fn being_made(root: &Path, owner: &Owner) -> bool {
    use std::os::unix::fs::MetadataExt;
    if (owner.dev, owner.ino) == (0, 0) {
        return true;
    }
    std::fs::symlink_metadata(root).is_ok_and(|m| {
        m.is_dir()
            && (m.dev(), m.ino()) == (owner.dev, owner.ino)
            && std::fs::read_dir(root).is_ok_and(|mut d| d.next().is_none())
    })
}

/// A folder its worker died making can hold nothing yet: remove it if it
/// is an empty directory (anything else there is not ours), and its journal.
fn clear_unmade(root: &Path, claim: JournalClaim) -> bool {
    let empty_dir = std::fs::symlink_metadata(root).is_ok_and(|m| m.is_dir())
        && std::fs::read_dir(root).is_ok_and(|mut d| d.next().is_none());
    let gone = !empty_dir && std::fs::symlink_metadata(root).is_err();
    if gone || (empty_dir && std::fs::remove_dir(root).is_ok()) {
        claim.remove();
        return true;
    }
    false
}

/// Remove a left folder and its journal; `false` when the folder stays.
fn clear(folder: Folder, claim: JournalClaim) -> bool {
    if folder.adopt().dispose().is_err() {
        return false;
    }
    claim.remove();
    true
}

/// The journal of a folder found at `root` when a session mounts
/// `store_id`, claimed for [`adopt`]; or the mount's error when there is
/// none or a live worker holds it. Blocking: it reads the journal, and a
/// held lock is waited for up to `LOCK_WAIT` (the state directory's).
pub(crate) fn claim_left(
    state_dir: Option<&StateDir>,
    root: &Path,
    store_id: &str,
) -> Result<(Replay, JournalClaim), MemoryError> {
    let Some(dir) = state_dir else {
        return Err(occupied(root, store_id));
    };
    match dir.claim(root) {
        Ok(Some(found)) => Ok(found),
        Ok(None) => Err(occupied(root, store_id)),
        Err(JournalError::Busy(_)) => Err(in_use(root, store_id)),
        Err(e) => {
            warn!(memory_store.id = %store_id, error = %e, "cannot read the state directory to recover the folder at the store's path");
            Err(occupied(root, store_id))
        }
    }
}

/// A folder found at `root` when session `session_id` mounts `store_id`,
/// its journal claimed ([`claim_left`]; see the module docs): adopted,
/// cleared, or the mount's error when it is not a folder this worker may
/// touch.
pub(crate) fn adopt(
    (replay, claim): (Replay, JournalClaim),
    root: &Path,
    store_id: &str,
    session_id: &str,
    read_only: bool,
) -> Result<Adopted, MemoryError> {
    let (owner, restored, disposing) = read_replay(replay, store_id)
        .filter(|(owner, ..)| owner.store == store_id && owner.root == root)
        .ok_or_else(|| occupied(root, store_id))?;
    if being_made(root, &owner) {
        return if clear_unmade(root, claim) {
            Ok(Adopted::Cleared)
        } else {
            Err(occupied(root, store_id))
        };
    }
    let Some(folder) = attach(root, &owner) else {
        // Not ours (or not this store's, or swapped): left exactly as found.
        return Err(occupied(root, store_id));
    };
    if owner.boot != boot_id() {
        // The machine restarted since: the folder's own writes were never
        // fsync'd, so a file may be torn or empty. Never pushed from.
        return if clear(folder, claim) {
            warn!(memory_store.id = %store_id, root = %root.display(), "removed the memory store folder a worker left before the machine restarted; its unsynced edits cannot be trusted after a crash of the machine");
            Ok(Adopted::Cleared)
        } else {
            Err(occupied(root, store_id))
        };
    }
    if disposing {
        // A removal cut short: finish it. What it had removed must not
        // read as deletions.
        return if clear(folder, claim) {
            info!(memory_store.id = %store_id, root = %root.display(), "finished removing the memory store folder a dead worker was removing");
            Ok(Adopted::Cleared)
        } else {
            Err(occupied(root, store_id))
        };
    }
    if owner.session != session_id {
        // Another session's folder: its edits are for that session's next
        // claim, never pushed from this one. With nothing unsynced it
        // blocks nothing.
        if is_clean(&folder, &restored) && clear(folder, claim) {
            info!(memory_store.id = %store_id, root = %root.display(), "removed the memory store folder another session's dead worker left; it held nothing unsynced");
            return Ok(Adopted::Cleared);
        }
        return Err(MemoryError::Mount(format!(
            "the memory store's path {} holds edits a dead worker left for session {} that are not on the server yet (memory_store_id={store_id}); they are recovered when that session is claimed again on this host, or remove the folder to give them up",
            root.display(),
            owner.session
        )));
    }
    Ok(resume(folder, claim, owner, restored, store_id, read_only))
}

/// What a dead worker's journal says: its owner, the state it held, and
/// whether it was removing the folder. `None`: not even the header can be
/// read, so whose folder this is is unknown.
fn read_replay(replay: Replay, store_id: &str) -> Option<(Owner, Snapshot, bool)> {
    match replay {
        Replay::Intact {
            owner,
            state,
            torn,
            disposing,
        } => {
            if torn {
                info!(memory_store.id = %store_id, "the journal's last batch was cut short when its worker died; it is dropped, and the batches before it stand");
            }
            Some((owner, state, disposing))
        }
        Replay::Corrupt {
            owner: Some(owner),
            reason,
        } => {
            warn!(
                memory_store.id = %store_id,
                reason = %reason,
                "the journal of the folder a dead worker left is damaged; recovering it with no baseline: every difference from the server is a conflict the server wins, and nothing is deleted on the server"
            );
            Some((owner, Snapshot::default(), false))
        }
        Replay::Corrupt { owner: None, .. } => None,
    }
}

/// This session's own folder, left by its dead worker: taken over with its
/// journal, to be synced before the session runs.
fn resume(
    folder: Folder,
    claim: JournalClaim,
    owner: Owner,
    mut restored: Snapshot,
    store_id: &str,
    read_only: bool,
) -> Adopted {
    remove_write_debris(&folder, &restored, store_id);
    let waiting = restored.pending.len();
    // Deletions waiting in the dead worker start their window afresh.
    restored.pending.clear();
    let root = owner.root.clone();
    let journal = match claim.into_journal(owner, &restored) {
        Ok(journal) => Some(journal),
        Err(e) => {
            warn!(memory_store.id = %store_id, error = %e, "cannot rewrite the recovered journal; this store is not journaled from now on");
            None
        }
    };
    info!(
        memory_store.id = %store_id,
        root = %root.display(),
        baseline = restored.baseline.len(),
        deletions_waiting = waiting,
        "recovering the memory store folder a dead worker left: syncing its edits before the session runs"
    );
    Adopted::Store(Box::new(AttachedStore::restored(
        store_id.to_string(),
        read_only,
        folder.adopt(),
        journal,
        restored,
    )))
}

/// Remove the temporary files of atomic writes the dead worker was making
/// (killed before the rename): the write never happened, so they are not
/// edits and must not become memories. A path the journal knows (a memory
/// of that name on the server) is kept.
fn remove_write_debris(folder: &Folder, state: &Snapshot, store_id: &str) {
    let Ok(scan) = folder.scan() else {
        return;
    };
    for rel in scan.files.keys() {
        let leaf = rel.rsplit('/').next().unwrap_or(rel);
        let known = [&state.baseline, &state.sent, &state.tentative]
            .iter()
            .any(|map| map.contains_key(rel.as_str()));
        if !crate::tools::files::is_write_tmp(leaf) || known {
            continue;
        }
        match folder.remove(rel) {
            Ok(()) => {
                info!(memory_store.id = %store_id, "memory.path" = %rel, "removed the temporary file of a write the dead worker never finished")
            }
            Err(e) => {
                warn!(memory_store.id = %store_id, "memory.path" = %rel, error = %e, "cannot remove the temporary file of an unfinished write; it will be synced as a file")
            }
        }
    }
}

/// At start: remove every folder a dead worker left that holds nothing
/// unsynced (its files are exactly its journaled baseline) or whose removal
/// was cut short, with its journal; drop journals whose folder is gone.
/// Returns how many folders were removed. Never fails: what cannot be read
/// is left as it is.
pub fn let_go_of_clean_folders(state_dir: &Path) -> usize {
    let dir = match StateDir::open(state_dir) {
        Ok(dir) => dir,
        Err(e) => {
            warn!(error = %e, "cannot open the state directory; memory store journals are off");
            return 0;
        }
    };
    let mut removed = 0;
    for (replay, claim) in dir.orphans() {
        let Replay::Intact {
            owner,
            state,
            disposing,
            ..
        } = replay
        else {
            // Damaged: the mount that recovers the folder decides.
            continue;
        };
        if std::fs::symlink_metadata(&owner.root).is_err() {
            // The folder is gone: so is everything to recover.
            claim.remove();
            continue;
        }
        if being_made(&owner.root, &owner) {
            if clear_unmade(&owner.root, claim) {
                removed += 1;
            }
            continue;
        }
        let Some(folder) = attach(&owner.root, &owner) else {
            continue;
        };
        let rebooted = owner.boot != boot_id();
        if !disposing && !rebooted && !is_clean(&folder, &state) {
            warn!(
                memory_store.id = %owner.store,
                root = %owner.root.display(),
                session_id = %owner.session,
                "a dead worker left this memory store folder with edits not yet on the server; it is kept, and recovered when its session is claimed again on this host"
            );
            continue;
        }
        if clear(folder, claim) {
            removed += 1;
            info!(memory_store.id = %owner.store, root = %owner.root.display(), "removed a memory store folder a dead worker left; it held nothing unsynced");
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::store::marker_content;

    /// Claim the journal left at `root`, then adopt the folder: the mount's
    /// two steps.
    fn adopt_at(
        dir: &StateDir,
        root: &Path,
        store_id: &str,
        session_id: &str,
        read_only: bool,
    ) -> Result<Adopted, MemoryError> {
        adopt(
            claim_left(Some(dir), root, store_id)?,
            root,
            store_id,
            session_id,
            read_only,
        )
    }

    /// A folder with its marker and `files`, journaled for `session` with
    /// `files` as its baseline; the journal's lock let go (its worker died).
    fn left_folder(
        files: &[(&str, &str)],
        session: &str,
    ) -> (tempfile::TempDir, StateDir, std::path::PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("mnt/notes");
        let folder = Folder::open(&root, true).unwrap();
        folder.create_root().unwrap();
        folder
            .put(MARKER_PATH, marker_content("memstore_1").as_bytes())
            .unwrap();
        let mut state = Snapshot::default();
        for (rel, content) in files {
            folder.put(rel, content.as_bytes()).unwrap();
            state.baseline.insert(
                rel.to_string(),
                crate::memory::store::sha256_hex(content.as_bytes()),
            );
        }
        let (dev, ino) = folder.identity().unwrap();
        let dir = StateDir::open(&tmp.path().join("state")).unwrap();
        let owner = Owner {
            store: "memstore_1".into(),
            root: root.clone(),
            session: session.into(),
            dev,
            ino,
            boot: boot_id(),
        };
        drop(dir.create(owner, &state).unwrap());
        (tmp, dir, root)
    }

    #[test]
    fn a_removal_cut_short_is_finished_never_recovered() {
        let (_tmp, dir, root) = left_folder(&[("a.md", "a"), ("b.md", "b")], "sesn_1");
        // The dead worker had marked the journal and removed one file.
        let (_, claim) = dir.claim(&root).unwrap().unwrap();
        let owner =
            match crate::memory::journal::replay(&std::fs::read(dir_journal(&dir, &root)).unwrap())
            {
                Replay::Intact { owner, .. } => owner,
                other => panic!("{other:?}"),
            };
        let mut journal = claim.into_journal(owner, &Snapshot::default()).unwrap();
        journal.mark_disposing().unwrap();
        drop(journal);
        std::fs::remove_file(root.join("a.md")).unwrap();

        let adopted = adopt_at(&dir, &root, "memstore_1", "sesn_1", false).unwrap();
        assert!(
            matches!(adopted, Adopted::Cleared),
            "finished, not recovered"
        );
        assert!(!root.exists());
        assert!(
            dir.claim(&root).unwrap().is_none(),
            "its journal is gone too"
        );
    }

    /// A worker killed mid-write (found by `tests/it/chaos.rs`) leaves the
    /// write's temporary file: recovery removes it rather than pushing it as
    /// a memory, keeps the real unsynced edit, and keeps a memory the server
    /// has under a name of that shape.
    #[test]
    fn an_unfinished_writes_temporary_file_is_removed_not_recovered() {
        let known = ".envworker-write-00000000000000aa";
        let (_tmp, dir, root) = left_folder(&[("a.md", "a"), (known, "on the server")], "sesn_1");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        let debris = [
            ".envworker-write-0123456789abcdef",
            "sub/.envworker-write-fedcba9876543210",
        ];
        for rel in debris {
            std::fs::write(root.join(rel), "half a write").unwrap();
        }
        std::fs::write(root.join("b.md"), "unsynced edit").unwrap();

        let adopted = adopt_at(&dir, &root, "memstore_1", "sesn_1", false).unwrap();
        assert!(matches!(adopted, Adopted::Store(_)), "recovered");
        for rel in debris {
            assert!(!root.join(rel).exists(), "{rel} is debris");
        }
        assert!(
            root.join("b.md").exists(),
            "the real edit stays to be synced"
        );
        assert!(root.join(known).exists(), "a memory of that name stays");
    }

    #[test]
    fn another_sessions_folder_is_cleared_when_clean_and_refused_when_not() {
        let (_tmp, dir, root) = left_folder(&[("a.md", "a")], "sesn_1");
        assert!(matches!(
            adopt_at(&dir, &root, "memstore_1", "sesn_2", false),
            Ok(Adopted::Cleared)
        ));
        assert!(!root.exists());

        let (_tmp, dir, root) = left_folder(&[("a.md", "a")], "sesn_1");
        std::fs::write(root.join("a.md"), "edited by session 1's agent").unwrap();
        let err = match adopt_at(&dir, &root, "memstore_1", "sesn_2", false) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("another session's edits must not be taken"),
        };
        assert!(err.contains("session sesn_1"), "{err}");
        assert_eq!(
            std::fs::read_to_string(root.join("a.md")).unwrap(),
            "edited by session 1's agent"
        );
        // Its own session recovers it.
        assert!(matches!(
            adopt_at(&dir, &root, "memstore_1", "sesn_1", false),
            Ok(Adopted::Store(_))
        ));
    }

    #[test]
    fn a_folder_from_before_the_machine_restarted_is_removed_never_recovered() {
        let (_tmp, dir, root) = left_folder(&[("a.md", "a")], "sesn_1");
        std::fs::write(root.join("a.md"), "").unwrap();
        // The journal as an earlier boot wrote it.
        let path = dir.journal_path(&root);
        let text = std::fs::read_to_string(&path).unwrap();
        let (header, rest) = text.split_once('\n').unwrap();
        let json = &header[9..];
        let mut value: serde_json::Value = serde_json::from_str(json).unwrap();
        value["boot"] = "an-earlier-boot".into();
        let json = serde_json::to_string(&value).unwrap();
        let header = format!("{:08x} {json}", crc32fast::hash(json.as_bytes()));
        std::fs::write(&path, format!("{header}\n{rest}")).unwrap();

        assert!(matches!(
            adopt_at(&dir, &root, "memstore_1", "sesn_1", false),
            Ok(Adopted::Cleared)
        ));
        assert!(!root.exists(), "a possibly torn file is never pushed");
    }

    #[test]
    fn a_folder_swapped_for_another_directory_or_a_symlink_is_hands_off() {
        let (tmp, dir, root) = left_folder(&[("a.md", "a")], "sesn_1");
        let copy = tmp.path().join("copy");
        std::fs::rename(&root, &copy).unwrap();
        std::os::unix::fs::symlink(&copy, &root).unwrap();
        assert!(adopt_at(&dir, &root, "memstore_1", "sesn_1", false).is_err());
        std::fs::remove_file(&root).unwrap();
        // A new directory with a copied marker and files: not the folder.
        std::fs::create_dir(&root).unwrap();
        for entry in std::fs::read_dir(&copy).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), root.join(entry.file_name())).unwrap();
        }
        assert!(adopt_at(&dir, &root, "memstore_1", "sesn_1", false).is_err());
        assert!(
            root.join("a.md").exists() && copy.join("a.md").exists(),
            "both left as found"
        );
    }

    #[test]
    fn a_folder_its_worker_died_making_is_cleared_only_when_empty() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("mnt/notes");
        let dir = StateDir::open(&tmp.path().join("state")).unwrap();
        let owner = Owner {
            store: "memstore_1".into(),
            root: root.clone(),
            session: "sesn_1".into(),
            dev: 0,
            ino: 0,
            boot: boot_id(),
        };
        drop(dir.create(owner.clone(), &Snapshot::default()).unwrap());
        // Something that is not an empty directory: not the worker's making.
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("planted.md"), "x").unwrap();
        assert!(adopt_at(&dir, &root, "memstore_1", "sesn_1", false).is_err());
        assert!(root.join("planted.md").exists());
        // Empty: cleared, with its journal.
        std::fs::remove_file(root.join("planted.md")).unwrap();
        assert!(matches!(
            adopt_at(&dir, &root, "memstore_1", "sesn_1", false),
            Ok(Adopted::Cleared)
        ));
        assert!(!root.exists());
        assert!(dir.claim(&root).unwrap().is_none());
    }

    fn dir_journal(dir: &StateDir, root: &Path) -> std::path::PathBuf {
        dir.journal_path(root)
    }
}
