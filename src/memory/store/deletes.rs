//! Deletions, both ways: a memory the server deleted leaves the folder
//! (unless the file was edited since: then it is the only copy), and a
//! corroborated local deletion reaches the server once re-checked, within
//! the pass's budget.

use tracing::{info, warn};

use crate::memory::folder::{FolderError, MARKER_PATH};
use crate::memory::plan::{Decision, DeleteBudget, DeleteVerdict, PassFacts, PathFacts, plan};
use crate::memory::remote::MemoryApi;

use super::marker::marker_distrust;
use super::work::PlannedUpload;
use super::{AttachedStore, blocking};

/// What became of a file whose memory the server deleted.
enum Removal {
    /// The file is gone; the path leaves the baseline.
    Gone,
    /// Keep the baseline (a failed re-hash or removal).
    Kept,
    /// Edited since the scan: the file now holds this hash.
    Edited(String),
}

impl AttachedStore {
    /// Memories the server deleted: each file removed, unless it was edited
    /// since the scan — then it is the only copy, planned again: the
    /// uploads that planning makes.
    pub(super) async fn remove_all(
        &self,
        removals: Vec<(String, String)>,
        pass: PassFacts,
    ) -> Vec<PlannedUpload> {
        let mut uploads = Vec::new();
        for (rel, base) in removals {
            match self.remove_local(&rel, &base).await {
                Removal::Gone => self.record(rel, None),
                Removal::Kept => self.record(rel, Some(base)),
                Removal::Edited(fresh) => {
                    let refused = self.state().refused.get(&rel).cloned();
                    let facts = PathFacts {
                        local: Some(&fresh),
                        baseline: Some(&base),
                        remote: None,
                        refused: refused.as_deref(),
                        missing_since: None,
                        tentative: false,
                        unreadable: false,
                    };
                    let p = plan(facts, pass);
                    if let Some(note) = p.note {
                        self.report(&rel, note);
                    }
                    self.record(rel.clone(), None);
                    if let Decision::Upload { update, fallback } = p.decision {
                        uploads.push(PlannedUpload {
                            rel,
                            local: Some(fresh),
                            update,
                            fallback,
                        });
                    }
                }
            }
        }
        uploads
    }

    /// Remove the file at `rel` if it still holds `base`.
    async fn remove_local(&self, rel: &str, base: &str) -> Removal {
        let folder = self.folder.clone();
        let r = rel.to_string();
        let fresh = match blocking(move || folder.hash_file(&r)).await {
            Ok(Ok(fresh)) => fresh,
            // A failed re-hash keeps the baseline, so a retry can never
            // re-upload the deleted memory.
            _ => return Removal::Kept,
        };
        match fresh {
            None => Removal::Gone,
            Some(fresh) if fresh != base => Removal::Edited(fresh),
            Some(_) => {
                let folder = self.folder.clone();
                let r = rel.to_string();
                match blocking(move || folder.remove(&r)).await {
                    Ok(Ok(())) => Removal::Gone,
                    Ok(Err(e)) => {
                        warn!(memory_store.id = %self.id, memory.path = %rel, error = %e, "failed to remove memory deleted remotely");
                        Removal::Kept
                    }
                    Err(e) => {
                        warn!(memory_store.id = %self.id, memory.path = %rel, error = %e, "failed to remove memory deleted remotely");
                        Removal::Kept
                    }
                }
            }
        }
    }

    /// The second phase of a local deletion: re-check the marker and the
    /// file now (not from the scan), then carry out the budget's verdict
    /// (see [`DeleteBudget`]): delete on the server, only log, or hold.
    /// Returns the baseline entry to keep, or `None` when the path leaves
    /// the baseline.
    pub(super) async fn confirm_delete(
        &self,
        api: &dyn MemoryApi,
        rel: &str,
        id: &str,
        base: &str,
        budget: &mut DeleteBudget,
    ) -> Option<String> {
        let keep = Some(base.to_string());
        if !self.still_deleted(rel).await {
            return keep;
        }
        match budget.take() {
            DeleteVerdict::Send => {}
            DeleteVerdict::OverCap | DeleteVerdict::Suppressed => return keep,
            DeleteVerdict::LogOnly => {
                info!(memory_store.id = %self.id, memory.path = %rel, "log-only: sync would delete this memory on the server");
                return keep;
            }
        }
        match api.delete(&self.id, id, base).await {
            Ok(()) => {
                crate::killpoint::hit("memory.delete.landed");
                info!(memory_store.id = %self.id, memory.path = %rel, "propagated local deletion");
                self.state().pending.remove(rel);
                None
            }
            Err(e) if e.status() == Some(404) => {
                self.state().pending.remove(rel);
                None
            }
            Err(e) if matches!(e.status(), Some(409 | 412)) => {
                warn!(memory_store.id = %self.id, memory.path = %rel, "memory deleted locally but changed remotely; keeping the remote version");
                keep
            }
            Err(e) => {
                warn!(memory_store.id = %self.id, memory.path = %rel, error = %e, "failed to delete memory");
                keep
            }
        }
    }

    /// Is the deletion of `rel` still so, read now: the folder still names
    /// this store, and the file is still gone? A file back again ends its
    /// pending delete (a later deletion starts a fresh window).
    async fn still_deleted(&self, rel: &str) -> bool {
        let folder = self.folder.clone();
        let r = rel.to_string();
        let recheck = blocking(move || {
            let marker = folder.hash_file(MARKER_PATH)?;
            let file = folder.hash_file(&r)?;
            Ok::<_, FolderError>((marker, file))
        })
        .await;
        let Ok(Ok((marker, file))) = recheck else {
            return false;
        };
        if marker_distrust(marker.as_deref(), &self.id).is_some() {
            return false;
        }
        if file.is_some() {
            // Back again: no delete, and a later deletion starts a fresh window.
            self.state().pending.remove(rel);
            return false;
        }
        true
    }
}
