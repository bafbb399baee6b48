//! The remote index between full listings: advanced from the store's
//! version history (`GET …/memory_versions?created_at[gte]=…`, newest
//! first) instead of re-listing every memory each sync.
//!
//! A full listing (the mount's, a fallback's, the safety cadence's) seeds a
//! [`RemoteIndex`]: path → (id, hash) and the newest version's `created_at`
//! (the high-water, read from the first versions page *before* the listing,
//! so nothing committed during the listing is skipped). Each later sync asks
//! for the versions created at or after `high-water − OVERLAP` and applies
//! the ones it has not seen ([`RemoteIndex::advance`]).
//!
//! Why an overlap: a version's `created_at` is stamped when its write
//! starts, but it becomes visible when the write commits, so a version can
//! appear with a `created_at` older than one already seen. [`OVERLAP`]
//! (5 s) is far above a write's commit latency (milliseconds; a request
//! that takes longer than this has also outlived the clients' timeouts) and
//! above clock differences between the API's own servers under NTP.
//!
//! The window is steered by the server's record clock only — the
//! `created_at`s the feed has actually returned (and, at the mount, the
//! session's own stamps: below) — never by this machine's clock nor by the
//! `Date` header: a proxy or load balancer whose clock
//! runs ahead (or a middlebox rewriting `Date`) would move a `Date`-based
//! window past versions not yet read, hiding them until the next full
//! listing. Once a poll made at least `OVERLAP` (of this machine's
//! monotonic time) after the high-water was first seen has answered, every
//! version at or before the high-water is visible: the window then starts
//! at the high-water itself (see [`RemoteIndex::floor`]), so an idle store
//! costs one small page, not the last five seconds of a burst again and
//! again.
//!
//! The mount can know more than that. A stamp the server put on a record
//! the worker read before the mount — the session's own `created_at` or
//! `updated_at` ([`RemoteIndex::witness`]) — is a reading of the server's
//! clock taken before the mount asked for its versions page: every version
//! stamped at least `OVERLAP` before it had committed by then (the bound
//! the window itself rests on: a commit's latency, plus the clock
//! difference between the API's servers), so the mount's listing reflects
//! it. A store written in a burst well before the session started is then
//! not read again (before: the first sync re-read the burst, over ten
//! pages, gave up and listed the store — 31 requests for 2,000 memories):
//! the first poll starts at that reading less `OVERLAP`, past the burst —
//! one page. Like the versions' `created_at`, it is a record's stamp from
//! the API's own clock, in the body of an answer: no proxy's clock or
//! rewritten header reaches it.
//!
//! Which version of a memory the index reflects is the first of its
//! versions the server lists (newest first): a late version listed after
//! one applied is recorded as seen and changes nothing, and one listed
//! first is the memory's head even when stamped before one already seen
//! (a server that lists in commit order: a write that started first and
//! committed last). A server that lists by `created_at` makes this the
//! newest stamp.
//!
//! Any doubt makes [`RemoteIndex::advance`] refuse, and the caller lists
//! the whole store: see [`Doubt`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::api::types::{IndexKind, MemoryIndexEntry, MemoryOperation, MemoryVersion};

use super::folder::MARKER_PATH;

/// How far before the high-water each poll starts (see the module docs).
pub(crate) const OVERLAP: Duration = Duration::from_secs(5);
/// Versions per page of the feed.
pub(crate) const FEED_PAGE: u32 = 100;
/// Pages one poll may read before it gives up and lists the store (at 100
/// versions a page, a burst of over 1,000 changes: a full listing of a
/// store at the 2,000-memory limit is 20 pages, so not much dearer).
pub(crate) const MAX_FEED_PAGES: usize = 10;
/// The safety cadence: the whole store is listed again at least this often
/// even when the feed has answered every sync (the final sync and the flush
/// always list it).
pub(crate) const FULL_LISTING_EVERY: Duration = Duration::from_secs(300);

/// Why the feed cannot be trusted this time; the sync lists the store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Doubt {
    #[error("a version in the window is redacted")]
    Redacted,
    #[error("a version changes a memory the index does not hold")]
    UnknownMemory,
    #[error("a version moves a memory onto a path the index gives another memory")]
    PathTaken,
    #[error("a version of a live memory carries no path or hash")]
    Incomplete,
    #[error("the listing gave one memory two paths (it moved while being listed)")]
    SeenTwice,
}

/// What an index knew of its high-water's age ([`RemoteIndex::clock`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FeedClock {
    high: Option<i64>,
    high_seen_at: Instant,
    settled: Option<i64>,
}

/// The store's memories as last known, and where the feed stands.
#[derive(Debug, Clone)]
pub(crate) struct RemoteIndex {
    /// By relative path (no leading `/`), as the full listing keys it.
    /// Shared with the pass that reads it, never copied for it.
    pub(crate) map: Arc<BTreeMap<String, MemoryIndexEntry>>,
    /// Memory id → its relative path in `map`.
    by_id: HashMap<String, String>,
    /// The newest `created_at` seen (server time, microseconds); `None`
    /// when the store had no version at all.
    high: Option<i64>,
    /// When (this machine's monotonic clock) `high` was first seen.
    high_seen_at: Instant,
    /// Every version at or before this is known to be visible and seen,
    /// or reflected by the listing that seeded the index (see the module
    /// docs); past the high-water when a witness of the server's clock
    /// showed the listing came that much later ([`Self::witness`]).
    settled: Option<i64>,
    /// Versions seen at or after the floor: id → created_at.
    seen: HashMap<String, i64>,
    /// When the store was last listed in full.
    pub(crate) listed_at: Instant,
    /// A new number whenever `map` is replaced
    /// (`super::watch::next_revision`).
    pub(crate) revision: u64,
}

fn micros(v: &MemoryVersion) -> i64 {
    v.created_at.timestamp_micros()
}

fn rel_of(path: &str) -> &str {
    path.trim_start_matches('/')
}

impl RemoteIndex {
    /// An index seeded by a full listing. `newest`: the first versions page
    /// read just before the listing (newest first): its versions are
    /// reflected by the listing, so they count as seen.
    ///
    /// A listing that gave one memory two paths ran while that memory
    /// moved (pages or prefixes listed one after another, the memory
    /// renamed from a part not yet listed into one already listed or the
    /// reverse): which path is current cannot be known, so it is a doubt.
    /// (A memory that moved out of sight the other way is listed at no
    /// path: the feed's version of it names a memory the index does not
    /// hold, [`Doubt::UnknownMemory`].)
    pub(crate) fn seeded(
        map: Arc<BTreeMap<String, MemoryIndexEntry>>,
        newest: &[MemoryVersion],
        now: Instant,
    ) -> Result<RemoteIndex, Doubt> {
        let mut by_id = HashMap::with_capacity(map.len());
        for (rel, m) in map.iter() {
            if by_id.insert(m.id.clone(), rel.clone()).is_some() {
                return Err(Doubt::SeenTwice);
            }
        }
        let high = newest.iter().map(micros).max();
        let mut index = RemoteIndex {
            map,
            by_id,
            high,
            high_seen_at: now,
            settled: None,
            seen: HashMap::new(),
            listed_at: now,
            revision: super::watch::next_revision(),
        };
        let floor = index.floor();
        for v in newest {
            let at = micros(v);
            if floor.is_none_or(|f| at >= f) {
                index.seen.insert(v.id.clone(), at);
            }
        }
        Ok(index)
    }

    /// What this index knows of the high-water's age, for the index a
    /// full listing seeds next ([`Self::inherit`]).
    pub(crate) fn clock(&self) -> FeedClock {
        FeedClock {
            high: self.high,
            high_seen_at: self.high_seen_at,
            settled: self.settled,
        }
    }

    /// Keep what an earlier index of the same store knew of the same
    /// high-water: when it was first seen, and whether it has settled. A
    /// full listing (a fallback, the cadence) must not restart the 5 s
    /// wait, or a store written in a burst of more versions than one poll
    /// reads would be listed again by every sync that comes within 5 s of
    /// the last.
    ///
    /// `asked`: when this index's versions page was asked for, before its
    /// listing. If that was at least [`OVERLAP`] after the high-water was
    /// first seen, every version stamped at or before it had committed, so
    /// the listing reflects them all: the window starts at the high-water.
    pub(crate) fn inherit(&mut self, earlier: FeedClock, asked: Instant) {
        if earlier.high.is_some() && earlier.high == self.high {
            self.high_seen_at = self.high_seen_at.min(earlier.high_seen_at);
            self.settled = self.settled.max(earlier.settled);
            if asked.saturating_duration_since(self.high_seen_at) >= OVERLAP {
                self.settled = self.settled.max(self.high);
            }
            if let Some(f) = self.floor() {
                self.seen.retain(|_, at| *at >= f);
            }
        }
    }

    /// The server's clock had read `server_clock` (microseconds; a stamp on
    /// a record read before this index's versions page was asked for, such
    /// as the session's `updated_at`) — what the listing that seeded the
    /// index proves beyond the versions it was given: the window starts at
    /// `server_clock − OVERLAP` when that is later than the high-water's
    /// window.
    ///
    /// Why no version is missed, late-committed ones included: the listing
    /// started after the versions page was asked for, when the server's
    /// clock read `server_clock` or later. A version stamped at or before
    /// `server_clock − OVERLAP` had committed by then (a write commits
    /// within `OVERLAP` of its stamp — the bound the window rests on), so
    /// the listing reflects it. A version the listing may not reflect
    /// committed after the page was asked for, so it is stamped after the
    /// clock's reading then, less `OVERLAP`: after `server_clock − OVERLAP`,
    /// inside the next poll's window, however late it commits within that
    /// bound. Versions after the seed are followed as before: the window
    /// trails the high-water by `OVERLAP`. A reading older than the
    /// high-water (a session updated before the store was last written)
    /// changes nothing.
    pub(crate) fn witness(&mut self, server_clock: i64) {
        let reflected = server_clock - OVERLAP.as_micros() as i64;
        self.settled = self.settled.max(Some(reflected));
        if let Some(f) = self.floor() {
            self.seen.retain(|_, at| *at >= f);
        }
    }

    /// The `created_at[gte]` of the next poll (microseconds), `None` for no
    /// filter (a store without any version yet).
    pub(crate) fn floor(&self) -> Option<i64> {
        let high = self.high?;
        let window = high - OVERLAP.as_micros() as i64;
        Some(self.settled.map_or(window, |s| s.max(window)))
    }

    /// Apply one poll's versions (every version created at or after
    /// [`Self::floor`], newest first as the server lists them), made at
    /// `now`. On a doubt the index is left as it was.
    pub(crate) fn advance(
        &mut self,
        versions: &[MemoryVersion],
        now: Instant,
    ) -> Result<(), Doubt> {
        let floor = self.floor();
        let fresh = self.unseen(versions)?;
        let heads = self.changed_heads(versions);
        let created: HashSet<&str> = fresh
            .iter()
            .filter(|v| v.operation == MemoryOperation::Created)
            .map(|v| v.memory_id.as_str())
            .collect();
        // Nothing new (an idle store): nothing to apply, and nothing copied.
        if fresh.is_empty() {
            self.moved(versions, now, floor);
            return Ok(());
        }
        let mut next = Relocation {
            map: BTreeMap::clone(&self.map),
            by_id: self.by_id.clone(),
        };
        let placed = next.vacate(&heads, |id| {
            self.by_id.contains_key(id) || created.contains(id)
        })?;
        next.place(placed)?;
        self.map = Arc::new(next.map);
        self.revision = super::watch::next_revision();
        self.by_id = next.by_id;
        for v in &fresh {
            self.seen.insert(v.id.clone(), micros(v));
        }
        self.moved(versions, now, floor);
        Ok(())
    }

    /// The versions of a poll not seen before, oldest first (the server
    /// lists newest first; a tie keeps the server's order, reversed); a
    /// redacted one (or one without a path) is a doubt.
    fn unseen<'v>(&self, versions: &'v [MemoryVersion]) -> Result<Vec<&'v MemoryVersion>, Doubt> {
        let fresh: Vec<&MemoryVersion> = versions
            .iter()
            .rev()
            .filter(|v| !self.seen.contains_key(&v.id))
            .collect();
        if fresh
            .iter()
            .any(|v| v.redacted_at.is_some() || v.path.is_none())
        {
            return Err(Doubt::Redacted);
        }
        Ok(fresh)
    }

    /// Per memory, its newest version: the first the server lists (see the
    /// module docs); only a memory whose newest is unseen changes.
    fn changed_heads<'v>(
        &self,
        versions: &'v [MemoryVersion],
    ) -> BTreeMap<&'v str, &'v MemoryVersion> {
        let mut newest: BTreeMap<&str, &MemoryVersion> = BTreeMap::new();
        for v in versions {
            newest.entry(&v.memory_id).or_insert(v);
        }
        newest.retain(|_, v| !self.seen.contains_key(&v.id));
        newest
    }

    /// Where the feed stands after a poll from `floor` that read
    /// `versions`, made at `now`.
    fn moved(&mut self, versions: &[MemoryVersion], now: Instant, floor: Option<i64>) {
        if let Some(top) = versions.iter().map(micros).max()
            && self.high.is_none_or(|h| top > h)
        {
            self.high = Some(top);
            self.high_seen_at = now;
        }
        // This poll covered the window from `floor`: if it came at least
        // OVERLAP after the high-water was first seen, everything up to
        // the high-water that was ever going to show has shown.
        // (A witness may have settled it further already: never back.)
        if floor.is_some()
            && now.saturating_duration_since(self.high_seen_at) >= OVERLAP
            && let Some(h) = self.high
        {
            self.settled = self.settled.max(Some(h));
        }
        if let Some(f) = self.floor() {
            self.seen.retain(|_, at| *at >= f);
        }
    }
}

/// The index's maps while one poll moves its memories: every changed
/// memory first leaves its old path, then takes its new one.
struct Relocation {
    map: BTreeMap<String, MemoryIndexEntry>,
    by_id: HashMap<String, String>,
}

impl Relocation {
    /// Take each changed memory (`heads`) off its old path (if the index
    /// still gives it to that memory), and say where each live one goes.
    /// `known`: whether a memory may change (the index holds it, or the
    /// poll created it); another is a doubt, and so is a live version
    /// without a path or hash.
    fn vacate<'h>(
        &mut self,
        heads: &BTreeMap<&'h str, &MemoryVersion>,
        known: impl Fn(&str) -> bool,
    ) -> Result<Vec<(&'h str, String, MemoryIndexEntry)>, Doubt> {
        let mut placed: Vec<(&str, String, MemoryIndexEntry)> = Vec::new();
        for (&memory_id, &v) in heads {
            // Leave the old path (if the index still gives it to this memory).
            if let Some(old) = self.by_id.remove(memory_id)
                && self.map.get(&old).is_some_and(|m| m.id == memory_id)
            {
                self.map.remove(&old);
            }
            if v.operation == MemoryOperation::Deleted {
                continue;
            }
            if !known(memory_id) {
                return Err(Doubt::UnknownMemory);
            }
            let (Some(path), Some(sha)) = (v.path.as_deref(), v.content_sha256.as_deref()) else {
                return Err(Doubt::Incomplete);
            };
            let rel = rel_of(path).to_string();
            placed.push((
                memory_id,
                rel,
                MemoryIndexEntry {
                    kind: IndexKind::Memory,
                    id: memory_id.to_string(),
                    path: String::new(),
                    content_sha256: sha.to_string(),
                },
            ));
        }
        Ok(placed)
    }

    /// Put each memory at its new path (never the marker's).
    fn place(&mut self, placed: Vec<(&str, String, MemoryIndexEntry)>) -> Result<(), Doubt> {
        for (memory_id, rel, entry) in placed {
            if rel == MARKER_PATH {
                continue;
            }
            // Every memory this poll moves has left its old path by now:
            // an occupant is a memory the feed says nothing of.
            if self
                .map
                .get(&rel)
                .is_some_and(|other| other.id != memory_id)
            {
                return Err(Doubt::PathTaken);
            }
            if let Some(other) = self.map.insert(rel.clone(), entry) {
                self.by_id.remove(&other.id);
            }
            self.by_id.insert(memory_id.to_string(), rel);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(id: &str, mem: &str, op: MemoryOperation, path: Option<&str>, at: i64) -> MemoryVersion {
        serde_json::from_value(serde_json::json!({
            "id": id, "type": "memory_version", "memory_id": mem, "memory_store_id": "s",
            "operation": match op { MemoryOperation::Created => "created", MemoryOperation::Modified => "modified", MemoryOperation::Deleted => "deleted" },
            "path": path,
            "content_sha256": if op == MemoryOperation::Deleted { None } else { Some(format!("sha-{id}")) },
            "created_at": chrono::DateTime::from_timestamp_micros(at).unwrap().to_rfc3339(),
        }))
        .unwrap()
    }

    fn entry(id: &str, sha: &str) -> MemoryIndexEntry {
        MemoryIndexEntry {
            kind: IndexKind::Memory,
            id: id.into(),
            path: String::new(),
            content_sha256: sha.into(),
        }
    }

    const S: i64 = 1_000_000;
    use MemoryOperation::*;

    fn listed() -> RemoteIndex {
        let map = BTreeMap::from([
            ("a.md".into(), entry("m1", "x")),
            ("b.md".into(), entry("m2", "y")),
        ]);
        RemoteIndex::seeded(
            map.into(),
            &[
                v("v2", "m2", Created, Some("/b.md"), 100 * S),
                v("v1", "m1", Created, Some("/a.md"), 99 * S),
            ],
            Instant::now(),
        )
        .unwrap()
    }

    fn paths(i: &RemoteIndex) -> Vec<(String, String, String)> {
        i.map
            .iter()
            .map(|(p, m)| (p.clone(), m.id.clone(), m.content_sha256.clone()))
            .collect()
    }

    #[test]
    fn create_modify_delete_and_rename_apply_in_order() {
        let mut i = listed();
        assert_eq!(i.floor(), Some(95 * S));
        let now = Instant::now();
        // Newest first, with the seeded versions replayed (already seen).
        let feed = [
            v("v6", "m1", Modified, Some("/dir/a2.md"), 104 * S),
            v("v5", "m3", Modified, Some("/c.md"), 103 * S),
            v("v4", "m3", Created, Some("/c.md"), 102 * S),
            v("v3", "m2", Deleted, Some("/b.md"), 101 * S),
            v("v2", "m2", Created, Some("/b.md"), 100 * S),
        ];
        i.advance(&feed, now).unwrap();
        assert_eq!(
            paths(&i),
            [
                ("c.md".into(), "m3".into(), "sha-v5".into()),
                ("dir/a2.md".into(), "m1".into(), "sha-v6".into())
            ]
        );
        // Replayed again: nothing changes.
        i.advance(&feed, now).unwrap();
        assert_eq!(paths(&i).len(), 2);
    }

    #[test]
    fn a_late_version_inside_the_window_is_applied_once_and_never_undoes_a_newer_one() {
        let mut i = listed();
        let now = Instant::now();
        i.advance(&[v("v3", "m1", Modified, Some("/a.md"), 110 * S)], now)
            .unwrap();
        assert_eq!(i.floor(), Some(105 * S));
        // Committed late: created before the high-water, visible only now.
        let late_b = v("v4", "m2", Modified, Some("/b.md"), 108 * S);
        let late_a = v("v5", "m1", Modified, Some("/a.md"), 107 * S);
        i.advance(
            &[
                v("v3", "m1", Modified, Some("/a.md"), 110 * S),
                late_b,
                late_a,
            ],
            now,
        )
        .unwrap();
        assert_eq!(
            i.map["b.md"].content_sha256, "sha-v4",
            "the late version is seen"
        );
        assert_eq!(
            i.map["a.md"].content_sha256, "sha-v3",
            "an older late version does not undo v3"
        );
    }

    #[test]
    fn doubts_leave_the_index_untouched() {
        let now = Instant::now();
        let cases: [(&[MemoryVersion], Doubt); 3] = [
            (&[v("v9", "m1", Modified, None, 101 * S)], Doubt::Redacted),
            (
                &[v("v9", "m7", Modified, Some("/z.md"), 101 * S)],
                Doubt::UnknownMemory,
            ),
            (
                &[v("v9", "m1", Modified, Some("/b.md"), 101 * S)],
                Doubt::PathTaken,
            ),
        ];
        for (feed, doubt) in cases {
            let mut i = listed();
            let before = paths(&i);
            assert_eq!(i.advance(feed, now), Err(doubt));
            assert_eq!(paths(&i), before);
        }
        // A deletion of a memory the index never held is no doubt.
        let mut i = listed();
        i.advance(&[v("v9", "m7", Deleted, Some("/z.md"), 101 * S)], now)
            .unwrap();
    }

    #[test]
    fn an_idle_window_settles_to_the_high_water() {
        let mut i = listed();
        let later = Instant::now() + OVERLAP;
        i.advance(&[], later).unwrap();
        assert_eq!(
            i.floor(),
            Some(100 * S),
            "after OVERLAP the window starts at the high-water"
        );
    }

    #[test]
    fn the_window_follows_the_versions_created_at_not_any_other_clock() {
        // Versions stamped a minute "ahead" of the last one seen (e.g. the
        // server's clock stepped), and a late one behind them: each is read
        // because the window is the high-water seen, less OVERLAP.
        let mut i = listed();
        let now = Instant::now();
        i.advance(&[v("v3", "m1", Modified, Some("/a.md"), 160 * S)], now)
            .unwrap();
        assert_eq!(i.floor(), Some(155 * S));
        let late = v("v4", "m2", Modified, Some("/b.md"), 157 * S);
        i.advance(
            &[v("v3", "m1", Modified, Some("/a.md"), 160 * S), late],
            now,
        )
        .unwrap();
        assert_eq!(i.map["b.md"].content_sha256, "sha-v4");
    }

    #[test]
    fn a_new_seed_keeps_the_age_of_the_same_high_water() {
        let earlier = listed();
        let seen = earlier.high_seen_at;
        // Asked again 1 s after the high-water was first seen: still the window.
        let mut i = listed();
        i.inherit(earlier.clock(), seen + Duration::from_secs(1));
        assert_eq!(i.floor(), Some(95 * S));
        // 6 s after: the listing reflects every version up to it.
        let mut i = listed();
        i.inherit(earlier.clock(), seen + Duration::from_secs(6));
        assert_eq!(i.floor(), Some(100 * S));
        // Another high-water: nothing is kept.
        let mut other = listed();
        other
            .advance(&[v("v7", "m1", Modified, Some("/a.md"), 120 * S)], seen)
            .unwrap();
        let mut i = listed();
        i.inherit(other.clock(), seen + Duration::from_secs(60));
        assert_eq!(i.floor(), Some(95 * S));
    }

    #[test]
    fn a_witness_of_the_servers_clock_moves_the_window_past_what_the_listing_reflects() {
        // The session was stamped a minute after the store's last version:
        // the window starts 5 s before that stamp, not 5 s before v2.
        let mut i = listed();
        i.witness(160 * S);
        assert_eq!(i.floor(), Some(155 * S));
        // A version committed late, stamped after the stamp less OVERLAP
        // (the mount's listing may have missed it), is in the window and
        // applied.
        let now = Instant::now();
        let late = v("v3", "m1", Modified, Some("/a.md"), 156 * S);
        i.advance(std::slice::from_ref(&late), now).unwrap();
        assert_eq!(i.map["a.md"].content_sha256, "sha-v3");
        assert_eq!(i.floor(), Some(155 * S), "the window never moves back");
        // Settling the new high-water later never moves it back either.
        i.advance(&[late], now + OVERLAP).unwrap();
        assert_eq!(i.floor(), Some(156 * S));
    }

    #[test]
    fn a_witness_not_past_the_store_changes_nothing_or_shortens_the_window() {
        // A session stamped before the store's last write, or with it: the
        // window stays OVERLAP before the high-water.
        for at in [50 * S, 100 * S] {
            let mut i = listed();
            i.witness(at);
            assert_eq!(i.floor(), Some(95 * S), "{at}");
        }
        // Stamped less than OVERLAP after it: a shorter window.
        let mut i = listed();
        i.witness(102 * S);
        assert_eq!(i.floor(), Some(97 * S), "a shorter window");
        // And a full listing that replaces it keeps what it knew.
        let mut next = listed();
        next.inherit(i.clock(), Instant::now());
        assert_eq!(next.floor(), Some(97 * S));
    }

    #[test]
    fn a_listing_that_gave_one_memory_two_paths_is_a_doubt() {
        let map = BTreeMap::from([
            ("a.md".into(), entry("m1", "x")),
            ("p/a.md".into(), entry("m1", "x")),
        ]);
        assert_eq!(
            RemoteIndex::seeded(map.into(), &[], Instant::now()).err(),
            Some(Doubt::SeenTwice)
        );
    }

    #[test]
    fn versions_of_one_memory_at_the_same_instant_settle_the_same_in_any_order() {
        // Two versions of m1 stamped at the same microsecond, listed by the
        // server as [vb, va] (vb committed last), seen in two polls in
        // either order (the other one not yet visible): the index ends on
        // the one the server lists first.
        let mut ends = Vec::new();
        for first in ["va", "vb"] {
            let mut i = listed();
            let now = Instant::now();
            i.advance(&[v(first, "m1", Modified, Some("/a.md"), 101 * S)], now)
                .unwrap();
            let both = [
                v("vb", "m1", Modified, Some("/a.md"), 101 * S),
                v("va", "m1", Modified, Some("/a.md"), 101 * S),
            ];
            i.advance(&both, now).unwrap();
            ends.push(i.map["a.md"].content_sha256.clone());
        }
        assert_eq!(ends, ["sha-vb", "sha-vb"], "the arrival order decided");
    }

    #[test]
    fn a_version_committed_after_one_seen_wins_though_stamped_before_it() {
        let mut i = listed();
        let now = Instant::now();
        i.advance(&[v("v3", "m1", Modified, Some("/a.md"), 110 * S)], now)
            .unwrap();
        // v4 started before v3 and committed after it: the memory's head,
        // listed first.
        i.advance(
            &[
                v("v4", "m1", Modified, Some("/a.md"), 109 * S),
                v("v3", "m1", Modified, Some("/a.md"), 110 * S),
            ],
            now,
        )
        .unwrap();
        assert_eq!(i.map["a.md"].content_sha256, "sha-v4");
    }
}
