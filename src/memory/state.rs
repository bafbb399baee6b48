//! One store's sync state, and its durable commit.
//!
//! `baseline` (path → hash both sides held at the last download or
//! successful sync), `tentative` (entries a re-download did not land
//! again), `refused` (hashes the server refused for good), `pending` (paths
//! seen missing, since when) and `sent` (hashes of uploads whose answer
//! never came). The first four that tell an edit from a conflict are
//! journaled ([`super::journal`]): every change to them is appended when the
//! lock is released ([`StateGuard`]), so no mutation can skip the journal and
//! the journal's order is the order of the changes.

use std::collections::{HashMap, HashSet};

use tokio::time::Instant;
use tracing::warn;

use super::journal::{Journal, MapKind, Snapshot, Tracked};

/// Uploads without an answer remembered per path (older ones are forgotten:
/// a request cut off that long ago is settled one way or the other).
pub(super) const IN_FLIGHT_KEPT: usize = 4;
/// ...and in all, whatever the agent floods.
pub(super) const IN_FLIGHT_TOTAL: usize = 1_024;
/// How long a request without an answer may still land: well past the
/// client's 60 s request timeout. Older records are dropped.
pub(super) const IN_FLIGHT_FOR: std::time::Duration = std::time::Duration::from_secs(300);

/// An upload sent that never got an answer: it may still land, but only
/// while the memory holds what it was guarded by.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct InFlight {
    /// The hash of the content sent.
    pub(super) sha: String,
    /// The update's `expected_content_sha256`; `None` for a create (which
    /// lands only on a free path).
    pub(super) guard: Option<String>,
    pub(super) at: Instant,
}

impl InFlight {
    /// Could this request still land, given what a listing shows at its
    /// path (`None`: no memory there)?
    fn may_land(&self, listed: Option<&str>, now: Instant) -> bool {
        now.saturating_duration_since(self.at) < IN_FLIGHT_FOR && self.guard.as_deref() == listed
    }
}

/// One store's sync state. `baseline`, `tentative`, `pending` and `sent`
/// are journaled: every change to them is appended to the store's journal
/// when the lock is released ([`StateGuard`]).
#[derive(Debug)]
pub(super) struct State {
    pub(super) baseline: Tracked<String>,
    /// Baseline entries from before a re-download that did not land them
    /// again: they tell a local edit from a conflict, and never drive a delete.
    pub(super) tentative: Tracked<String>,
    pub(super) refused: HashMap<String, String>,
    pub(super) pending: Tracked<Instant>,
    pub(super) sent: Tracked<String>,
    /// Hashes of uploads sent whose request never got any answer (cut off
    /// in flight by a bound, or failed in transport), by path, newest last:
    /// the server may still apply one later than any listing, so unlike a
    /// `sent` record (settled, then dropped, by the next listing) these
    /// outlive it. A 409 whose current server hash is one of them is our
    /// own late write, not another writer's (see `AttachedStore::upload`).
    /// Memory only, at most [`IN_FLIGHT_KEPT`] a path and
    /// [`IN_FLIGHT_TOTAL`] in all; each listing drops those that can no
    /// longer land ([`State::settle_in_flight`]).
    pub(super) in_flight: HashMap<String, Vec<InFlight>>,
    /// Names already reported as unsyncable.
    pub(super) warned_names: HashSet<String>,
    /// Paths already reported as unreadable or too large (each warned once).
    pub(super) warned_paths: HashSet<String>,
    /// Memory ids by path, from the last listing and the uploads since: the
    /// flush updates with them when it cannot list the store.
    pub(super) ids: HashMap<String, String>,
    /// Files the server refused since the last pass took the count.
    pub(super) new_refusals: usize,
    /// Uploads that lost to a remote change (409) since the last pass took the count.
    pub(super) lost_uploads: usize,
    /// Where the journaled maps are committed; `None`: journaling is off
    /// (no state directory).
    pub(super) journal: Option<Journal>,
    /// An append failed: the journal is left as it was (lagging, which is
    /// safe) and still locked, and nothing more is appended.
    pub(super) journal_failed: bool,
    /// Bumped at each commit that changed `baseline`, `tentative`,
    /// `pending` or `sent`: with the folder view's and the remote index's
    /// revisions, it tells a sync that nothing it plans from has changed.
    pub(super) revision: u64,
}

impl State {
    pub(super) fn new(journal: Option<Journal>, restored: Snapshot) -> State {
        State {
            baseline: Tracked::restored(MapKind::Baseline, restored.baseline),
            tentative: Tracked::restored(MapKind::Tentative, restored.tentative),
            refused: HashMap::new(),
            // A recovered folder's deletions start their window afresh:
            // nothing is deleted on the server without this worker's own
            // scans corroborating it.
            pending: Tracked::new(MapKind::Pending),
            sent: Tracked::restored(MapKind::Sent, restored.sent),
            in_flight: HashMap::new(),
            warned_names: HashSet::new(),
            warned_paths: HashSet::new(),
            ids: HashMap::new(),
            new_refusals: 0,
            lost_uploads: 0,
            journal,
            journal_failed: false,
            revision: 0,
        }
    }

    /// The journaled maps as they are now.
    pub(super) fn snapshot(&self) -> Snapshot {
        Snapshot {
            baseline: self.baseline.journal_map(),
            tentative: self.tentative.journal_map(),
            sent: self.sent.journal_map(),
            pending: self.pending.journal_map(),
        }
    }

    /// Append the changes made since the last commit as one batch (one
    /// `write`), and compact the journal when its log has outgrown the state.
    pub(super) fn commit(&mut self, store_id: &str) {
        let mut records = Vec::new();
        self.baseline.drain_changes(&mut records);
        self.tentative.drain_changes(&mut records);
        self.pending.drain_changes(&mut records);
        self.sent.drain_changes(&mut records);
        if !records.is_empty() {
            self.revision += 1;
        }
        // After a failed write the journal is rewritten whole at the end of
        // the pass (`end_of_pass`), not appended to.
        if records.is_empty() || self.journal_failed {
            return;
        }
        let live = self.live();
        let Some(journal) = self.journal.as_mut() else {
            return;
        };
        let mut result = journal.append(&records);
        if result.is_ok() && journal.compaction_due(live) {
            let snapshot = self.snapshot();
            if let Some(journal) = self.journal.as_mut() {
                result = journal.snapshot(&snapshot);
            }
        }
        if let Err(e) = result {
            self.journal_failed = true;
            warn!(
                memory_store.id = %store_id,
                error = %e,
                "cannot write the memory store's journal; it is rewritten whole at the end of the pass, and until then edits are lost if the worker dies"
            );
        }
    }

    /// An upload of `sha` to `rel`, guarded by `guard` (`None`: a create),
    /// is about to go out at `now`.
    pub(super) fn sending(&mut self, rel: &str, sha: &str, guard: Option<&str>, now: Instant) {
        let sent = self.in_flight.entry(rel.to_string()).or_default();
        // The same request again (a retry) is one record: four retries of
        // one edit must not push out an older request that may still land.
        sent.retain(|r| !(r.sha == sha && r.guard.as_deref() == guard));
        sent.push(InFlight {
            sha: sha.to_string(),
            guard: guard.map(str::to_string),
            at: now,
        });
        if sent.len() > IN_FLIGHT_KEPT {
            sent.remove(0);
        }
        let total: usize = self.in_flight.values().map(Vec::len).sum();
        if total > IN_FLIGHT_TOTAL {
            // The oldest record of all goes.
            let oldest = self
                .in_flight
                .iter()
                .filter_map(|(rel, sent)| Some((sent.first()?.at, rel.clone())))
                .min();
            if let Some((_, rel)) = oldest {
                self.answered_oldest(&rel);
            }
        }
    }

    fn answered_oldest(&mut self, rel: &str) {
        if let Some(sent) = self.in_flight.get_mut(rel) {
            sent.remove(0);
            if sent.is_empty() {
                self.in_flight.remove(rel);
            }
        }
    }

    /// A listing (`remote`) seen at `now`: the records it shows landed are
    /// returned (path, hash, was it a create), and every record that can no
    /// longer land is dropped — its guard is gone from the memory (another
    /// writer moved it on), its path is taken (a create), or it is older
    /// than [`IN_FLIGHT_FOR`]. So a record never claims bytes another
    /// writer puts back later.
    pub(super) fn settle_in_flight(
        &mut self,
        remote: &std::collections::BTreeMap<String, crate::api::types::MemoryIndexEntry>,
        now: Instant,
    ) -> Vec<(String, String, bool)> {
        let mut landed = Vec::new();
        self.in_flight.retain(|rel, sent| {
            let listed = remote.get(rel).map(|m| m.content_sha256.as_str());
            if let Some(r) = sent.iter().find(|r| Some(r.sha.as_str()) == listed) {
                landed.push((rel.clone(), r.sha.clone(), r.guard.is_none()));
                return false;
            }
            sent.retain(|r| r.may_land(listed, now));
            !sent.is_empty()
        });
        landed
    }

    /// The upload of `sha` to `rel` was answered: it can no longer land
    /// later. `landed`: it changed the memory, which fences every older
    /// request still out there (each is guarded by a hash the memory no
    /// longer holds), so the path's records all go.
    pub(super) fn answered(&mut self, rel: &str, sha: &str, landed: bool) {
        let Some(sent) = self.in_flight.get_mut(rel) else {
            return;
        };
        if landed {
            sent.clear();
        } else if let Some(at) = sent.iter().position(|r| r.sha == sha) {
            sent.remove(at);
        }
        if sent.is_empty() {
            self.in_flight.remove(rel);
        }
    }

    /// Was `sha` sent to `rel` by a request that never got an answer? It is
    /// then taken out: a write lands once.
    pub(super) fn take_in_flight(&mut self, rel: &str, sha: &str) -> bool {
        let found = self
            .in_flight
            .get(rel)
            .is_some_and(|sent| sent.iter().any(|r| r.sha == sha));
        if found {
            self.answered(rel, sha, false);
        }
        found
    }

    fn live(&self) -> usize {
        self.baseline.len() + self.tentative.len() + self.pending.len() + self.sent.len()
    }

    /// The end of a pass: a journal whose write failed is rewritten whole
    /// (a snapshot); otherwise a handle to `fdatasync` the pass's appends
    /// with, off the lock (`None` when nothing was appended).
    pub(super) fn end_of_pass(&mut self) -> Option<std::fs::File> {
        if self.journal_failed {
            let snapshot = self.snapshot();
            let journal = self.journal.as_mut()?;
            if journal.snapshot(&snapshot).is_ok() {
                self.journal_failed = false;
            }
            return None;
        }
        self.journal.as_mut()?.take_unsynced()
    }
}

/// The store's state, locked; releasing it commits what changed to the
/// journal, in the order it changed.
pub(super) struct StateGuard<'a> {
    pub(super) state: std::sync::MutexGuard<'a, State>,
    pub(super) store_id: &'a str,
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.state
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        self.state.commit(self.store_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        State::new(None, Snapshot::default())
    }

    /// Retries of one edit are one record: they never push out an older
    /// request that may still land (the 409 would then read as another
    /// writer's change, and the agent's newer edit would lose).
    #[test]
    fn retries_of_one_upload_keep_an_older_request_in_flight() {
        let mut s = state();
        let now = Instant::now();
        s.sending("a.md", "v1", Some("v0"), now);
        for _ in 0..IN_FLIGHT_KEPT {
            s.sending("a.md", "v2", Some("v0"), now);
        }
        assert_eq!(s.in_flight["a.md"].len(), 2);
        assert!(s.take_in_flight("a.md", "v1"));
    }

    /// However many paths the agent floods with failing uploads, the
    /// records stay bounded, and the oldest go first.
    #[test]
    fn records_in_flight_are_bounded_in_all() {
        let mut s = state();
        let start = Instant::now();
        for i in 0..IN_FLIGHT_TOTAL + 10 {
            let at = start + std::time::Duration::from_millis(i as u64);
            s.sending(&format!("f{i}.md"), "sha", None, at);
        }
        let total: usize = s.in_flight.values().map(Vec::len).sum();
        assert_eq!(total, IN_FLIGHT_TOTAL);
        assert!(!s.in_flight.contains_key("f0.md"), "the oldest stayed");
        assert!(
            s.in_flight
                .contains_key(&format!("f{}.md", IN_FLIGHT_TOTAL + 9))
        );
    }

    /// A listing drops what can no longer land: an update whose guard the
    /// memory no longer holds, a create whose path is taken, a record older
    /// than `IN_FLIGHT_FOR`; it returns what it shows landed.
    #[test]
    fn a_listing_settles_what_landed_and_drops_what_cannot_land() {
        use crate::api::types::{IndexKind, MemoryIndexEntry};
        let entry = |sha: &str| MemoryIndexEntry {
            kind: IndexKind::Memory,
            id: "m".into(),
            path: String::new(),
            content_sha256: sha.into(),
        };
        let mut s = state();
        let now = Instant::now();
        s.sending("moved.md", "v1", Some("v0"), now);
        s.sending("held.md", "v1", Some("v0"), now);
        s.sending("taken.md", "n1", None, now);
        s.sending("free.md", "n1", None, now);
        s.sending("landed.md", "v1", Some("v0"), now);
        s.sending("old.md", "v1", Some("v0"), now);
        let remote = std::collections::BTreeMap::from([
            ("moved.md".to_string(), entry("D")),
            ("held.md".to_string(), entry("v0")),
            ("taken.md".to_string(), entry("other")),
            ("landed.md".to_string(), entry("v1")),
            ("old.md".to_string(), entry("v0")),
        ]);
        s.in_flight.get_mut("old.md").unwrap()[0].at = now - IN_FLIGHT_FOR;
        let landed = s.settle_in_flight(&remote, now);
        assert_eq!(landed, [("landed.md".to_string(), "v1".to_string(), false)]);
        let mut kept: Vec<&str> = s.in_flight.keys().map(String::as_str).collect();
        kept.sort();
        assert_eq!(kept, ["free.md", "held.md"]);
    }
}
