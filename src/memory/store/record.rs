//! The commit: each path's new baseline entry, recorded the moment the
//! decision or the I/O behind it completes (the state journals it), and the
//! plan's notes told to the operator.

use tracing::{info, warn};

use crate::memory::plan::Note;

use super::AttachedStore;

impl AttachedStore {
    /// Record one path's new baseline entry (`None`: out of the baseline),
    /// at once — the moment the decision or the I/O behind it completes.
    pub(super) fn record(&self, rel: String, sha: Option<String>) {
        let mut state = self.state();
        match sha {
            Some(sha) => {
                state.baseline.insert(rel, sha);
            }
            None => {
                state.baseline.remove(&rel);
            }
        }
    }

    /// Tell the operator what a plan noted of a path.
    pub(super) fn report(&self, rel: &str, note: Note) {
        let id = &self.id;
        match note {
            Note::BothChanged => {
                warn!(memory_store.id = %id, memory.path = %rel, "memory changed both locally and remotely; keeping the remote version")
            }
            Note::RestoredRemote => {
                warn!(memory_store.id = %id, memory.path = %rel, "memory deleted locally but changed remotely; restoring the remote version")
            }
            Note::Recreating => {
                info!(memory_store.id = %id, memory.path = %rel, "memory deleted remotely but edited locally; re-creating it from the file")
            }
            Note::ReadOnlyKeepsEdit => {
                warn!(memory_store.id = %id, memory.path = %rel, "memory deleted remotely but edited locally; keeping the file, which a read-only store cannot push")
            }
            Note::DeleteSuppressed => {}
        }
    }
}
