//! What the server holds, as a pass plans against it: the store listed
//! whole, or its index advanced by the version feed (`memory::feed`)
//! between full listings; and the uploads without an answer settled
//! against what a pass saw.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::time::Instant;
use tracing::{debug, warn};

use crate::api::types::{MemoryIndexEntry, MemoryVersion};
use crate::memory::feed::{FEED_PAGE, FeedClock, MAX_FEED_PAGES, RemoteIndex};
use crate::memory::folder::MARKER_PATH;
use crate::memory::remote::MemoryApi;

use super::local::LocalFiles;
use super::{AttachedStore, PassError};

const BASIC_PAGE: u32 = 100;

/// The remote index a pass plans against, shared with the feed's.
pub(crate) type RemoteMap = Arc<BTreeMap<String, MemoryIndexEntry>>;

/// What one poll of the version feed came to ([`AttachedStore::follow`]).
pub(crate) enum Followed {
    /// The index, advanced; whether the versions moved it.
    Advanced(RemoteMap, bool),
    /// No index to advance: none seeded yet, a full listing due, or the
    /// feed in doubt.
    NoIndex,
    /// The versions request failed.
    Failed(crate::api::Error),
}

impl AttachedStore {
    /// Every memory of the store as (id, hash) by relative path (the entry's
    /// own `path` is moved into the key); prefixes, unknown item types and
    /// the marker path are skipped.
    ///
    /// Between full listings the index is advanced from the version feed
    /// (see `super::feed`): one request when nothing changed. `full` (the
    /// final sync, the flush) lists the whole store, as do the safety
    /// cadence and any doubt about the feed.
    pub(crate) async fn index(
        &self,
        api: &dyn MemoryApi,
        full: bool,
    ) -> Result<RemoteMap, PassError> {
        if !full && let Followed::Advanced(remote, moved) = self.follow(api).await {
            // An idle store's index is the one the ids were taken from.
            if moved {
                self.remember_ids(&remote);
            }
            return Ok(remote);
        }
        // The feed's high-water is read before the listing, so a change
        // committed while it runs is replayed by the next poll.
        let asked = Instant::now();
        let newest = newest_versions(api, &self.id).await;
        let remote = Arc::new(self.list_index(api).await?);
        self.remember_ids(&remote);
        *self.remote_index() = self.seed(Arc::clone(&remote), newest, asked);
        Ok(remote)
    }

    fn feed_clock(&self) -> std::sync::MutexGuard<'_, Option<FeedClock>> {
        self.feed_clock.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn remote_index(&self) -> std::sync::MutexGuard<'_, Option<RemoteIndex>> {
        self.remote.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn remember_ids(&self, remote: &BTreeMap<String, MemoryIndexEntry>) {
        let mut state = self.state();
        state.ids.clear();
        state
            .ids
            .extend(remote.iter().map(|(rel, m)| (rel.clone(), m.id.clone())));
    }

    /// The feed's index from a full listing and the versions page read
    /// before it; `None` (the next sync lists again) without that page or
    /// when the listing is in doubt.
    /// `asked`: when the versions page was asked for, before the listing.
    pub(super) fn seed(
        &self,
        listed: RemoteMap,
        newest: Option<Vec<MemoryVersion>>,
        asked: Instant,
    ) -> Option<RemoteIndex> {
        let earlier = self.feed_clock().take();
        match RemoteIndex::seeded(listed, &newest?, Instant::now()) {
            Ok(mut index) => {
                if let Some(earlier) = earlier {
                    index.inherit(earlier, asked);
                }
                Some(index)
            }
            Err(doubt) => {
                debug!(memory_store.id = %self.id, reason = %doubt, "the memory store listing is in doubt; listing it again next sync");
                None
            }
        }
    }

    /// The index advanced by the versions created since the last poll, and
    /// whether they moved it; or why not: no index (none seeded, or a full
    /// listing is due, or the feed is in doubt), or the versions request
    /// failed. Whatever it answers but `Advanced`, the index is gone until
    /// the next full listing seeds it again.
    pub(crate) async fn follow(&self, api: &dyn MemoryApi) -> Followed {
        let Some(mut index) = self.remote_index().take() else {
            return Followed::NoIndex;
        };
        // Whatever this poll ends in, the next seed keeps what this index
        // knew of the high-water's age (`RemoteIndex::inherit`).
        *self.feed_clock() = Some(index.clock());
        let now = Instant::now();
        if now.saturating_duration_since(index.listed_at) >= self.full_listing_every {
            debug!(memory_store.id = %self.id, "listing the memory store in full (safety cadence)");
            return Followed::NoIndex;
        }
        let since = index.floor();
        let before = Arc::clone(&index.map);
        let mut versions = Vec::new();
        let mut page = None;
        for _ in 0..MAX_FEED_PAGES {
            let got = match api.versions(&self.id, since, FEED_PAGE, page.take()).await {
                Ok((got, _date)) => got,
                Err(e) => {
                    debug!(memory_store.id = %self.id, error = %e, "cannot read the memory version history; listing the store");
                    return Followed::Failed(e);
                }
            };
            let next = got.next_cursor().map(str::to_string);
            versions.extend(got.data);
            match next {
                Some(n) => page = Some(n),
                None => {
                    if let Err(doubt) = index.advance(&versions, now) {
                        debug!(memory_store.id = %self.id, reason = %doubt, "the memory version feed is in doubt; listing the store");
                        return Followed::NoIndex;
                    }
                    let remote = Arc::clone(&index.map);
                    *self.remote_index() = Some(index);
                    let moved = !Arc::ptr_eq(&before, &remote);
                    return Followed::Advanced(remote, moved);
                }
            }
        }
        debug!(memory_store.id = %self.id, pages = MAX_FEED_PAGES, "too many memory versions since the last sync; listing the store");
        Followed::NoIndex
    }

    /// The whole store's `basic` listing, page after page.
    async fn list_index(
        &self,
        api: &dyn MemoryApi,
    ) -> Result<BTreeMap<String, MemoryIndexEntry>, PassError> {
        // Collected, then built in one go: the server lists in path order,
        // so the sort is a single pass and the tree is bulk-built.
        let mut out = Vec::new();
        let mut page = None;
        loop {
            let got = api.list_index(&self.id, BASIC_PAGE, page.take()).await?;
            let next = got.next_cursor().map(str::to_string);
            for mut entry in got.data {
                if !entry.is_memory() {
                    continue;
                }
                if entry.path.trim_start_matches('/') == MARKER_PATH {
                    warn!(
                        memory_store.id = %self.id,
                        memory.path = %entry.path,
                        "the server listed the reserved marker path; skipping"
                    );
                    continue;
                }
                // The path becomes the key (without its leading `/`), in place.
                let mut rel = std::mem::take(&mut entry.path);
                rel.drain(..rel.len() - rel.trim_start_matches('/').len());
                out.push((rel, entry));
            }
            match next {
                Some(n) => page = Some(n),
                // A path listed twice keeps its last entry, as an insert would.
                None => return Ok(BTreeMap::from_iter(out)),
            }
        }
    }

    /// A memory just fetched is at least as fresh as the remote index's
    /// entry for it: when the feed missed a version (one committed late
    /// beyond its overlap), the stale hash would make the next local edit
    /// read as a conflict with a remote change that never came.
    pub(super) fn correct_index(&self, rel: &str, id: &str, sha: &str) {
        if let Some(index) = self.remote_index().as_mut()
            && index
                .map
                .get(rel)
                .is_some_and(|e| e.id == id && e.content_sha256 != sha)
            && let Some(entry) = Arc::make_mut(&mut index.map).get_mut(rel)
        {
            entry.content_sha256 = sha.to_string();
            index.revision = crate::memory::watch::next_revision();
        }
    }

    /// Uploads whose answer never came, resolved against what a pass just
    /// saw of the server — a full listing, or the index the version feed
    /// advanced (it reflects every version committed before the poll) — and
    /// of the folder (`files`): a memory holding exactly what was sent is
    /// that upload, landed. Every record is then dropped, so it never claims
    /// another writer's bytes (the reference's `settle_sent`) — but for
    /// requests that never got any answer at all (`in_flight`) which could
    /// still land under an edit the agent has not synced: once a pass shows
    /// one landed, it is ours too (a create cut off in flight, then refused
    /// to the newer edit because the path was taken, is settled here). A
    /// send whose path the file and the server agree on is superseded and
    /// forgotten like the rest (`State::settle_in_flight`).
    pub(crate) fn settle_sent(
        &self,
        remote: &BTreeMap<String, MemoryIndexEntry>,
        files: &LocalFiles,
    ) {
        // A push upload still in flight keeps its record, unconfirmed: its
        // answer tells whether the bytes listed are its own (another writer
        // may have written the very same bytes meanwhile) — unless the file
        // and the server agree now: then what both hold is agreed on,
        // whoever wrote it, and the send is settled like any other (bytes
        // equal to it that appear later are another writer's). The model's
        // cases in tests/it/memory_model.rs.
        let flying = self.board.flying();
        let mut state = self.state();
        let sent = state.sent.take();
        for (rel, sha) in sent {
            let listed = remote.get(&rel).map(|m| m.content_sha256.as_str());
            let agreed = files.agrees(&rel, listed);
            if flying.contains(&rel) && !agreed {
                state.sent.insert(rel, sha);
            } else if listed == Some(sha.as_str()) {
                state.baseline.insert(rel, sha);
            }
        }
        let agrees = |rel: &str, listed: Option<&str>| files.agrees(rel, listed);
        for (rel, sha, create) in state.settle_in_flight(remote, &agrees, &flying, Instant::now()) {
            if create {
                // A create of ours that landed late — or another writer's
                // memory with the same bytes: it tells the agent's newer
                // edit from a conflict, but never drives a delete.
                state.tentative.insert(rel, sha);
            } else {
                state.baseline.insert(rel, sha);
            }
        }
    }
}

/// The first page of the version history (newest first), to seed the feed;
/// `None` when it cannot be read (the feed is then off until the next full
/// listing). The answer's `Date` is not used: the feed's window follows the
/// versions' own `created_at` (see `crate::memory::feed`).
pub(super) async fn newest_versions(
    api: &dyn MemoryApi,
    store_id: &str,
) -> Option<Vec<MemoryVersion>> {
    match api.versions(store_id, None, FEED_PAGE, None).await {
        Ok((page, _date)) => Some(page.data),
        Err(e) => {
            debug!(memory_store.id = %store_id, error = %e, "cannot read the memory version history; listing the store each sync");
            None
        }
    }
}
