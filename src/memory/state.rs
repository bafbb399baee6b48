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
    /// The send's number ([`State::next_send`]): a higher one carries the
    /// file as it was read later.
    pub(super) seq: u64,
}

/// Whose bytes a memory holds after a send of ours to it was refused (409):
/// see [`State::owner_of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Owner {
    /// An earlier send of ours (one without an answer that landed late, or
    /// one that landed while this one was on its way): the newer content
    /// goes out over it.
    OlderSend,
    /// A later send of ours, already on the server: this one is superseded
    /// and has nothing left to do.
    NewerSend,
    /// Another writer's (or ours, past telling): the server wins.
    Other,
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
    /// The number of the last send ([`State::next_send`]).
    pub(super) sends: u64,
    /// Per path, the newest send of ours that landed: its number and hash.
    /// Memory only. It tells a 409 on another send of ours, concurrent with
    /// it, from another writer's change — and only while the baseline still
    /// holds that hash (see [`State::owner_of`]).
    pub(super) landed: HashMap<String, (u64, String)>,
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
            sends: 0,
            landed: HashMap::new(),
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

    /// Number a send whose content was just read: later reads get higher
    /// numbers, so of two sends of one path the newer content is known.
    pub(super) fn next_send(&mut self) -> u64 {
        self.sends += 1;
        self.sends
    }

    /// Send number `seq` of `sha` to `rel`, guarded by `guard` (`None`: a
    /// create), is about to go out at `now`.
    pub(super) fn sending(
        &mut self,
        rel: &str,
        sha: &str,
        guard: Option<&str>,
        now: Instant,
        seq: u64,
    ) {
        let sent = self.in_flight.entry(rel.to_string()).or_default();
        // The same request again (a retry) is one record: four retries of
        // one edit must not push out an older request that may still land.
        sent.retain(|r| !(r.sha == sha && r.guard.as_deref() == guard));
        sent.push(InFlight {
            sha: sha.to_string(),
            guard: guard.map(str::to_string),
            at: now,
            seq,
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

    /// A pass saw the server (`remote`: a listing, or the index the version
    /// feed advanced) at `now`, and the folder: `agrees(path, listed)` says
    /// whether the file at the path holds exactly what the server lists
    /// there (`None`: nothing, on either side). The records it shows
    /// landed are returned (path, hash, was it a create); every other record
    /// is dropped unless it could still land and still matters:
    ///
    /// - its guard is gone from the memory (another writer moved it on), or
    ///   its path is taken (a create): it can no longer land;
    /// - the file and the server agree: the send was superseded — the file
    ///   holds what the server does, so nothing of ours is pending there,
    ///   and bytes that appear later are another writer's, even ones equal
    ///   to what this send carried (a send is forgotten once a later pass
    ///   has seen the server, sdk-behaviour.md §3.9; issue 24);
    /// - it is older than [`IN_FLIGHT_FOR`].
    ///
    /// What stays is a send the server may still apply under an edit the
    /// agent has not synced yet: its late landing is then told from another
    /// writer's change (`AttachedStore::upload`). The paths of uploads
    /// still on their way (`flying`) are left as they are: their own
    /// answers tell whether bytes listed equal to theirs are theirs or
    /// another writer's.
    pub(super) fn settle_in_flight(
        &mut self,
        remote: &std::collections::BTreeMap<String, crate::api::types::MemoryIndexEntry>,
        agrees: &dyn Fn(&str, Option<&str>) -> bool,
        flying: &HashSet<String>,
        now: Instant,
    ) -> Vec<(String, String, bool)> {
        let mut landed = Vec::new();
        self.in_flight.retain(|rel, sent| {
            if flying.contains(rel) {
                return true;
            }
            let listed = remote.get(rel).map(|m| m.content_sha256.as_str());
            if let Some(r) = sent.iter().find(|r| Some(r.sha.as_str()) == listed) {
                landed.push((rel.clone(), r.sha.clone(), r.guard.is_none()));
                return false;
            }
            if agrees(rel, listed) {
                return false;
            }
            sent.retain(|r| r.may_land(listed, now));
            !sent.is_empty()
        });
        landed
    }

    /// Send number `seq` to `rel` was refused (409), and the memory now
    /// holds `current`: whose bytes are these? A send of ours without an
    /// answer carrying them (it landed late; taken out, as a write lands
    /// once), or the newest of ours that landed while the baseline still
    /// holds it (a send concurrent with this one, e.g. the push's upload
    /// and the flush's newer one): older or newer than this one, by number.
    /// Anything else is another writer's.
    pub(super) fn owner_of(&mut self, rel: &str, current: &str, seq: u64) -> Owner {
        let by_number = |other: u64| {
            if other < seq {
                Owner::OlderSend
            } else {
                Owner::NewerSend
            }
        };
        let unanswered = self
            .in_flight
            .get(rel)
            .and_then(|sent| sent.iter().find(|r| r.sha == current))
            .map(|r| r.seq);
        if let Some(other) = unanswered {
            if other < seq {
                self.answered(rel, current, false);
            }
            return by_number(other);
        }
        match self.landed.get(rel) {
            Some((other, sha))
                if sha == current
                    && self.baseline.get(rel).map(String::as_str) == Some(current) =>
            {
                by_number(*other)
            }
            _ => Owner::Other,
        }
    }

    /// Send number `seq` landed `sha` at `rel`.
    pub(super) fn landed(&mut self, rel: &str, sha: &str, seq: u64) {
        self.answered(rel, sha, true);
        let newest = self.landed.get(rel).is_none_or(|(other, _)| *other < seq);
        if newest {
            self.landed.insert(rel.to_string(), (seq, sha.to_string()));
        }
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
        s.sending("a.md", "v1", Some("v0"), now, 1);
        for seq in 0..IN_FLIGHT_KEPT as u64 {
            s.sending("a.md", "v2", Some("v0"), now, 2 + seq);
        }
        assert_eq!(s.in_flight["a.md"].len(), 2);
        assert_eq!(s.owner_of("a.md", "v1", 10), Owner::OlderSend);
        assert!(
            s.in_flight["a.md"].iter().all(|r| r.sha == "v2"),
            "taken out"
        );
    }

    /// However many paths the agent floods with failing uploads, the
    /// records stay bounded, and the oldest go first.
    #[test]
    fn records_in_flight_are_bounded_in_all() {
        let mut s = state();
        let start = Instant::now();
        for i in 0..IN_FLIGHT_TOTAL + 10 {
            let at = start + std::time::Duration::from_millis(i as u64);
            s.sending(&format!("f{i}.md"), "sha", None, at, i as u64);
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
        s.sending("moved.md", "v1", Some("v0"), now, 1);
        s.sending("held.md", "v1", Some("v0"), now, 2);
        s.sending("taken.md", "n1", None, now, 3);
        s.sending("free.md", "n1", None, now, 4);
        s.sending("landed.md", "v1", Some("v0"), now, 5);
        s.sending("old.md", "v1", Some("v0"), now, 6);
        s.sending("reverted.md", "v1", Some("v0"), now, 7);
        s.sending("dropped.md", "n1", None, now, 8);
        let remote = std::collections::BTreeMap::from([
            ("moved.md".to_string(), entry("D")),
            ("held.md".to_string(), entry("v0")),
            ("taken.md".to_string(), entry("other")),
            ("landed.md".to_string(), entry("v1")),
            ("old.md".to_string(), entry("v0")),
            ("reverted.md".to_string(), entry("v0")),
        ]);
        s.in_flight.get_mut("old.md").unwrap()[0].at = now - IN_FLIGHT_FOR;
        // The agent reverted reverted.md to v0 and removed dropped.md: the
        // folder agrees with the server on both, so their sends are
        // superseded. held.md still holds an edit the server lacks.
        let folder = std::collections::HashMap::from([
            ("held.md", "v2"),
            ("reverted.md", "v0"),
            ("free.md", "n1"),
            ("moved.md", "v1"),
            ("taken.md", "n1"),
            ("old.md", "v1"),
        ]);
        let agrees = |rel: &str, listed: Option<&str>| folder.get(rel).copied() == listed;
        let landed = s.settle_in_flight(&remote, &agrees, &HashSet::new(), now);
        assert_eq!(landed, [("landed.md".to_string(), "v1".to_string(), false)]);
        let mut kept: Vec<&str> = s.in_flight.keys().map(String::as_str).collect();
        kept.sort();
        assert_eq!(kept, ["free.md", "held.md"]);

        // An upload still on its way is left to its own answer, even when
        // the listing shows its bytes: another writer may have written them.
        let mut s = state();
        s.sending("flying.md", "v1", Some("v0"), now, 1);
        s.sending("taken.md", "n1", None, now, 2);
        let remote = std::collections::BTreeMap::from([
            ("flying.md".to_string(), entry("v1")),
            ("taken.md".to_string(), entry("other")),
        ]);
        let flying = HashSet::from(["flying.md".to_string(), "taken.md".to_string()]);
        let landed = s.settle_in_flight(&remote, &|_, _| false, &flying, now);
        assert!(landed.is_empty(), "{landed:?}");
        assert_eq!(s.in_flight.len(), 2);
    }

    /// Of two sends of one path racing (the push's and the flush's), the
    /// 409 of one is told apart by their numbers once the other landed: the
    /// older is superseded, the newer goes out over the older's bytes — and
    /// only while the baseline still holds what landed.
    #[test]
    fn a_409_between_two_sends_of_ours_is_told_by_their_numbers() {
        let mut s = state();
        let now = Instant::now();
        s.sending("a.md", "v1", Some("v0"), now, 1);
        s.sending("a.md", "v2", Some("v0"), now, 2);
        s.landed("a.md", "v1", 1);
        s.baseline.insert("a.md".into(), "v1".into());
        assert_eq!(s.owner_of("a.md", "v1", 2), Owner::OlderSend);
        s.landed("a.md", "v2", 2);
        s.baseline.insert("a.md".into(), "v2".into());
        assert_eq!(s.owner_of("a.md", "v2", 1), Owner::NewerSend);
        // A pull moved the baseline on: the bytes are no longer known ours.
        s.baseline.insert("a.md".into(), "theirs".into());
        assert_eq!(s.owner_of("a.md", "v2", 3), Owner::Other);
        assert_eq!(s.owner_of("a.md", "unknown", 3), Owner::Other);
    }
}
