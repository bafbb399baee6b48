//! Folders a dead worker left: recovered when their store is mounted again,
//! or let go at start when they hold nothing unsynced.
//!
//! A worker killed mid-session (SIGKILL, the OOM killer, a Lambda timeout)
//! leaves its store folders on disk, with their journals in the state
//! directory (see [`journal`](super::journal)). Without recovery the next
//! mount at that path refuses ("something already exists"), and the edits
//! made since the last sync are lost.
//!
//! The rules, in the order they are checked:
//! - **Only a dead worker's folder.** The journal's lock must be free (the
//!   kernel released it when its worker died); a live worker's folder is
//!   refused, as before.
//! - **Only our folder, for this store.** The journal must name this store
//!   and this path, and the folder's marker must name this store; otherwise
//!   the folder is hands-off, exactly as a folder without a journal is.
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
//! - **A damaged journal is no baseline.** Every difference from the server
//!   is then a conflict the server wins, and a file the server lacks is
//!   uploaded as new — nothing is deleted on the server.
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
use super::journal::{JournalError, Replay, Snapshot, StateDir};
use super::store::{AttachedStore, MARKER_PATH, marks_store};

/// The mount's error for a path something else already occupies.
fn occupied(root: &Path, store_id: &str) -> MemoryError {
    MemoryError::Mount(format!(
        "something already exists at the memory store's path: {} (memory_store_id={store_id}); it must not exist when the session starts",
        root.display()
    ))
}

/// A folder found at `root` when mounting `store_id`: the store restored
/// from a dead worker's journal, ready for its recovery pass; or the mount's
/// error when it is not a folder this worker may take over (see the module
/// docs).
pub(crate) fn adopt(
    state_dir: Option<&StateDir>,
    root: &Path,
    store_id: &str,
    read_only: bool,
    folder: Folder,
) -> Result<AttachedStore, MemoryError> {
    let Some(dir) = state_dir else {
        return Err(occupied(root, store_id));
    };
    let (replay, claim) = match dir.claim(root) {
        Ok(Some(found)) => found,
        Ok(None) => return Err(occupied(root, store_id)),
        Err(e @ JournalError::Busy(_)) => {
            return Err(MemoryError::Mount(format!(
                "{e} (memory_store_id={store_id}); a session's store can be mounted by one worker at a time"
            )));
        }
        Err(e) => {
            warn!(memory_store.id = %store_id, error = %e, "cannot read the state directory to recover the folder at the store's path");
            return Err(occupied(root, store_id));
        }
    };
    let restored = match replay {
        Replay::Intact {
            store,
            root: at,
            state,
            torn,
        } if store == store_id && at == root => {
            if torn {
                info!(memory_store.id = %store_id, "the journal's last record was cut short when its worker died; it is dropped, and the records before it stand");
            }
            state
        }
        // Another store's or another path's journal: hands off.
        Replay::Intact { .. } => return Err(occupied(root, store_id)),
        Replay::Corrupt(reason) => {
            warn!(
                memory_store.id = %store_id,
                reason = %reason,
                "the journal of the folder a dead worker left is damaged; recovering it with no baseline: every difference from the server is a conflict the server wins, and nothing is deleted on the server"
            );
            Snapshot::default()
        }
    };
    if let Err(e) = folder.create_root() {
        warn!(memory_store.id = %store_id, error = %e, "cannot open the folder a dead worker left");
        return Err(occupied(root, store_id));
    }
    if !marks_store(&folder, store_id) {
        // Not ours (or not this store's): left exactly as found.
        return Err(occupied(root, store_id));
    }
    let waiting = restored.pending.len();
    let journal = match claim.into_journal(root, store_id, &restored) {
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
    Ok(AttachedStore::restored(
        store_id.to_string(),
        read_only,
        folder.adopt(),
        journal,
        restored,
    ))
}

/// At start: remove every folder a dead worker left that holds nothing
/// unsynced (its files are exactly its journaled baseline), with its
/// journal; drop journals whose folder is gone. Returns how many folders
/// were removed. Never fails: what cannot be read is left as it is.
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
            store, root, state, ..
        } = replay
        else {
            // Damaged: the mount that recovers the folder decides.
            continue;
        };
        let folder = match Folder::open(&root, true) {
            Ok(folder) if folder.removed_on_dispose() => {
                // The folder is gone: so is everything to recover.
                claim.remove();
                continue;
            }
            Ok(folder) => folder,
            Err(_) => continue,
        };
        if folder.create_root().is_err() || !marks_store(&folder, &store) {
            continue;
        }
        let Ok(scan) = folder.scan() else { continue };
        let mut files = scan.files;
        files.remove(MARKER_PATH);
        let clean = scan.unreadable.is_empty()
            && state.sent.is_empty()
            && state.tentative.is_empty()
            && files == state.baseline;
        if !clean {
            warn!(
                memory_store.id = %store,
                root = %root.display(),
                "a dead worker left this memory store folder with edits not yet on the server; it is kept, and recovered when its session is claimed again on this host"
            );
            continue;
        }
        if folder.adopt().dispose().is_ok() {
            claim.remove();
            removed += 1;
            info!(memory_store.id = %store, root = %root.display(), "removed a memory store folder a dead worker left; it held nothing unsynced");
        }
    }
    removed
}
