//! One attached store: its folder, its sync state, and the I/O that carries
//! out the planner's decisions.
//!
//! A pass reads: observe (scan the folder, list the store) → plan (the
//! folder's verdict, then every path, by the pure planner in `super::plan`)
//! → execute (the I/O, bounded) → commit (each completed operation enters
//! the state — see `super::state` — and its journal as it completes).
//!
//! Each completed operation (upload, delete, pull, local removal) enters the
//! baseline the moment it completes, never only at the end of a pass: a pass
//! cut off at its bound, cancelled or failed part-way loses nothing that
//! reached the server, so the agent's next edit is not mistaken for a
//! conflict. The flush judges edits against the same baseline (or the
//! tentative one a re-download left), and when it cannot list the store it
//! still pushes each edit, guarded by the hash it was last synced at.
//!
//! An upload that never got an answer may still land; its record
//! (`State::in_flight`) outlives a pass only while the server could still
//! apply it under an edit the agent has not synced: a pass that sees the
//! file and the server agree on the path forgets it, as the reference
//! forgets every send once a later sync has seen the server, so another
//! writer's identical bytes later are never taken for ours.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use futures::{StreamExt, stream};
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tracing::{Instrument, debug, info, warn};

use crate::api::types::{IndexKind, MemoryIndexEntry, MemoryListItem, MemoryVersion, View};

use super::feed::{FEED_PAGE, FULL_LISTING_EVERY, FeedClock, MAX_FEED_PAGES, RemoteIndex};
use super::flights::FlightBoard;
use super::folder::{Folder, FolderError, MAX_FILE_BYTES, Scan, is_oversized, oversized_bytes};
use super::journal::{Journal, Snapshot};
use super::observe::{Observation, Observer};
use super::options::DeleteMode;
use super::plan::{
    Decision, DeleteBudget, DeleteVerdict, FolderFacts, FolderOp, FolderVerdict, Listed, Note,
    PassFacts, PathFacts, Pending, Plan, plan, plan_folder, settled,
};
use super::remote::MemoryApi;
use super::report::SyncReport;
use super::state::{Owner, State, StateGuard};

/// The reserved marker at every store root (defined with the folder).
pub use super::folder::MARKER_PATH;
const MARKER_VERSION: u32 = 1;
/// Content fetches in flight at once in one store's pull pass.
pub(crate) const FETCH_CONCURRENCY: usize = 16;
/// Uploads in flight at once in one store's flush (and sync).
pub const UPLOAD_CONCURRENCY: usize = 32;
/// Prefixes listed at once by the mount.
pub(crate) const LIST_CONCURRENCY: usize = 8;
const BASIC_PAGE: u32 = 100;
const FULL_PAGE: u32 = 20;

pub(crate) fn marker_content(store_id: &str) -> String {
    format!("version {MARKER_VERSION}\n{store_id}")
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn marker_sha(store_id: &str) -> String {
    sha256_hex(marker_content(store_id).as_bytes())
}

/// The one marker check: does the marker found at a store folder (its
/// hash, `None` when there is none) name the store `store_id`? `None` when
/// it does; otherwise why not, in words fit for the log. The scan and the
/// second phase of a local deletion both ask it, so a folder is trusted by
/// one rule.
fn marker_distrust(found: Option<&str>, store_id: &str) -> Option<&'static str> {
    match found {
        Some(sha) if sha == marker_sha(store_id) => None,
        Some(_) => Some("the marker file does not match this store"),
        None => Some("the marker file is gone"),
    }
}

/// Does the marker in `folder` name the store `store_id`? (Read now.)
pub(crate) fn marks_store(folder: &Folder, store_id: &str) -> bool {
    matches!(folder.hash_file(MARKER_PATH), Ok(found) if marker_distrust(found.as_deref(), store_id).is_none())
}

/// A download's write: private while nothing else can write to the folder
/// (see [`Folder::put_private`]).
fn put(folder: &Folder, rel: &str, data: &[u8], private: bool) -> Result<(), FolderError> {
    if private {
        folder.put_private(rel, data)
    } else {
        folder.put(rel, data)
    }
}

/// A sync failure that stops this store's pass (logged, never raised).
#[derive(Debug, thiserror::Error)]
pub(crate) enum PassError {
    #[error(transparent)]
    Folder(#[from] FolderError),
    #[error(transparent)]
    Api(#[from] crate::api::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("a blocking task failed: {0}")]
    Join(String),
}

/// The remote index a pass plans against, shared with the feed's.
pub(super) type RemoteMap = Arc<BTreeMap<String, MemoryIndexEntry>>;

/// The files a pass saw, the marker left out: the watch's view itself,
/// shared rather than copied, so an idle pass allocates nothing per file.
#[derive(Debug, Clone)]
pub(super) struct LocalFiles(Arc<Scan>);

impl LocalFiles {
    /// Every file but the marker, by path.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.0.files.iter().filter(|(rel, _)| *rel != MARKER_PATH)
    }

    /// Every file the scan saw, the marker included.
    pub(super) fn with_marker(&self) -> &BTreeMap<String, String> {
        &self.0.files
    }

    pub(super) fn contains_key(&self, rel: &str) -> bool {
        rel != MARKER_PATH && self.0.files.contains_key(rel)
    }

    /// The file's hash at `rel` (never the marker's).
    pub(super) fn get(&self, rel: &str) -> Option<&String> {
        if rel == MARKER_PATH {
            return None;
        }
        self.0.files.get(rel)
    }

    /// Does the file at `rel` hold exactly `listed` (`None`: there is no
    /// file, and nothing listed)? Never for a path the scan could not read.
    pub(super) fn agrees(&self, rel: &str, listed: Option<&str>) -> bool {
        !self.is_unknown(rel) && self.get(rel).map(String::as_str) == listed
    }

    pub(super) fn len(&self) -> usize {
        self.0.files.len() - usize::from(self.0.files.contains_key(MARKER_PATH))
    }

    /// Is `rel` unknown to the scan: at or below an entry it could not read?
    fn is_unknown(&self, rel: &str) -> bool {
        self.0.is_unknown(rel)
    }

    fn unreadable(&self) -> usize {
        self.0.unreadable.len()
    }
}

/// A scan with the marker checked.
pub(super) struct Marked {
    pub(super) files: LocalFiles,
    /// The view's revision ([`Observation::revision`]).
    revision: u64,
    /// `None` when the marker names this store; otherwise why not.
    distrust: Option<&'static str>,
    /// Entries stat-ed for this scan (only the reported paths, unless full).
    pub(super) examined: usize,
    /// The whole folder was walked.
    pub(super) full: bool,
}

impl Marked {
    /// What this scan says of the folder as a whole, for `op`'s verdict
    /// (a sync adds the baseline once it has listed the store).
    pub(super) fn folder_facts(&self, op: FolderOp) -> FolderFacts {
        FolderFacts {
            op,
            root_unreadable: self.files.is_unknown(""),
            distrust: self.distrust,
            files: self.files.len(),
            unreadable: self.files.unreadable(),
            baseline: None,
        }
    }
}

/// One attached store.
pub struct AttachedStore {
    pub id: String,
    pub(crate) read_only: bool,
    pub(crate) folder: Arc<Folder>,
    state: Mutex<State>,
    /// The folder's watch and its last known contents ([`Observer`]).
    observer: Arc<Mutex<Observer>>,
    /// Held for a whole sync pass, and by the push while it plans: they
    /// never plan at once. The flush takes no lock (see `super::flush`),
    /// and the push's uploads fly without it (`super::flights`).
    pub(super) pass: tokio::sync::Mutex<()>,
    /// The remote index's safety cadence: the store is listed whole at
    /// least this often ([`FULL_LISTING_EVERY`]; tests and the benchmark
    /// shorten it).
    full_listing_every: std::time::Duration,
    /// The remote index the version feed advances between full listings
    /// (see `super::feed`); `None` until a full listing seeds it, and
    /// after a doubt.
    remote: Mutex<Option<RemoteIndex>>,
    /// Uploads the change-driven push made since the last sync collected
    /// them (reported with that sync: `SyncReport::pushed`).
    pub(super) pushed: std::sync::atomic::AtomicUsize,
    /// How often the push task woke up (an idle store's should be rare).
    pub(super) push_wakeups: std::sync::atomic::AtomicUsize,
    /// What the last feed index knew of its high-water's age, for the next
    /// seed (`RemoteIndex::inherit`).
    feed_clock: Mutex<Option<FeedClock>>,
    /// The facts the last sync planned from, when that plan was to do
    /// nothing at all: (the folder view's revision, the remote index's, the
    /// state's). A sync that finds the same three plans nothing.
    quiet: Mutex<Option<(u64, u64, u64)>>,
    /// The push's uploads in flight, the syncs and flushes under way, and
    /// the push's back-off after a failed upload (a `429`'s `retry-after`).
    pub(super) board: FlightBoard,
    /// Push uploads sending at once ([`UPLOAD_CONCURRENCY`]).
    pub(super) upload_slots: Arc<tokio::sync::Semaphore>,
}

/// What became of one upload ([`AttachedStore::upload`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The server holds this hash at the path now: the upload landed (or
    /// the server already held these very bytes).
    Landed(String),
    /// Nothing landed, and trying again now changes nothing: the server
    /// won a conflict, refused the file, or the file is gone.
    Settled,
    /// A later upload of ours already landed newer content: this one has
    /// nothing left to do, and must not move the baseline.
    Superseded,
    /// A failure worth another try later (a `429`, a 5xx, no answer), with
    /// the wait the answer asked for, if any.
    Failed(Option<std::time::Duration>),
}

/// Whose bytes a memory holds after an update of ours was refused (409).
enum Whose {
    /// Exactly what this upload sends.
    Same(String),
    /// An earlier upload of ours: the newer edit goes over it.
    OlderOfOurs(String),
    /// A later upload of ours landed newer content.
    NewerOfOurs,
    /// Another writer's: the server wins.
    Theirs,
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, PassError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| PassError::Join(e.to_string()))
}

impl AttachedStore {
    /// A store about to be mounted; `journal` (when there is a state
    /// directory) records its sync state from the first write on.
    pub(crate) fn new(
        id: String,
        read_only: bool,
        folder: Folder,
        journal: Option<Journal>,
    ) -> AttachedStore {
        Self::restored(id, read_only, folder, journal, Snapshot::default())
    }

    /// A store whose folder a dead worker left, with the state its journal
    /// held (empty when the journal was damaged).
    pub(crate) fn restored(
        id: String,
        read_only: bool,
        folder: Folder,
        journal: Option<Journal>,
        state: Snapshot,
    ) -> AttachedStore {
        AttachedStore {
            id,
            read_only,
            folder: Arc::new(folder),
            state: Mutex::new(State::new(journal, state)),
            observer: Arc::new(Mutex::new(Observer::default())),
            pass: tokio::sync::Mutex::new(()),
            full_listing_every: FULL_LISTING_EVERY,
            remote: Mutex::new(None),
            pushed: std::sync::atomic::AtomicUsize::new(0),
            push_wakeups: std::sync::atomic::AtomicUsize::new(0),
            feed_clock: Mutex::new(None),
            quiet: Mutex::new(None),
            board: FlightBoard::default(),
            upload_slots: Arc::new(tokio::sync::Semaphore::new(UPLOAD_CONCURRENCY)),
        }
    }

    pub(super) fn state(&self) -> StateGuard<'_> {
        StateGuard {
            state: self.state.lock().unwrap_or_else(|e| e.into_inner()),
            store_id: &self.id,
        }
    }

    /// The current baseline (for tests and diagnostics).
    pub fn baseline(&self) -> BTreeMap<String, String> {
        self.state().baseline.as_map().clone()
    }

    /// Make the journal's appends durable against a machine crash; once a
    /// pass, and only when it changed something.
    pub(super) async fn sync_journal(&self) {
        let handle = self.state().end_of_pass();
        if let Some(file) = handle
            && let Ok(Err(e)) = blocking(move || file.sync_data()).await
        {
            debug!(memory_store.id = %self.id, error = %e, "cannot fsync the memory store's journal");
        }
    }

    /// Take the journal out (dispose: the folder is gone).
    fn take_journal(&self) -> Option<Journal> {
        self.state().journal.take()
    }

    /// Close the journal, leaving it on disk (and its lock free) for the
    /// recovery of the folder: the stores are dropped without a teardown.
    pub(crate) fn let_go_of_journal(&self) {
        drop(self.take_journal());
    }

    /// The most changed paths the folder's watch keeps between passes
    /// before a full scan is due instead (tests lower it to force one).
    pub(crate) fn set_watch_bound(&self, bound: usize) {
        self.observer().set_bound(bound);
    }

    /// No watch: every pass scans the whole folder (the benchmark's baseline).
    pub(crate) fn disable_watch(&self) {
        self.observer().disable();
    }

    /// The safety cadences' period: the folder scanned whole and the store
    /// listed whole at least this often.
    pub(crate) fn set_safety_cadence(&mut self, every: std::time::Duration) {
        self.full_listing_every = every;
        self.observer().set_full_scan_every(every);
    }

    /// Lose the watch's queued events as an overflow does (tests).
    pub(crate) fn lose_watch_events(&self) {
        self.observer().lose_events();
    }

    pub(super) fn observer(&self) -> std::sync::MutexGuard<'_, Observer> {
        self.observer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// See the folder: a full scan when `full` (or when the watch cannot
    /// vouch for what it did not report), else only the paths the kernel
    /// reported since the last scan ([`Observer`]).
    pub(super) async fn scan(&self, full: bool) -> Result<Marked, PassError> {
        // An idle folder is seen here; anything else (a path to examine, a
        // full scan, a push holding the observer) on a blocking thread.
        let idle = if full {
            None
        } else {
            self.observer
                .try_lock()
                .ok()
                .and_then(|o| o.observe_idle(&self.folder))
        };
        let seen = match idle {
            Some(seen) => seen,
            None => self.observing(move |o, f| o.observe(f, full)).await??,
        };
        Ok(self.mark(seen).await)
    }

    /// Run `f` on the observer and the folder, on a blocking thread.
    async fn observing<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Observer, &Folder) -> T + Send + 'static,
    ) -> Result<T, PassError> {
        let folder = self.folder.clone();
        let observer = self.observer.clone();
        blocking(move || {
            f(
                &mut observer.lock().unwrap_or_else(|e| e.into_inner()),
                &folder,
            )
        })
        .await
    }

    /// Only the paths the kernel reported since the last pass, and those
    /// paths; `None` when the watch cannot vouch for them.
    pub(super) async fn scan_changed(
        &self,
    ) -> Result<Option<(Marked, BTreeSet<String>)>, PassError> {
        let seen = self.observing(|o, f| o.observe_changed(f)).await?;
        let Some(mut seen) = seen else {
            return Ok(None);
        };
        let changed = seen.changed.take().unwrap_or_default();
        Ok(Some((self.mark(seen).await, changed)))
    }

    /// Paths reported and not yet examined; `None` when the watch cannot
    /// vouch for them, or a pass holds the folder just now.
    pub(super) fn pending_changes(&self) -> Option<usize> {
        self.observer.try_lock().ok()?.pending()
    }

    /// The watch's replacements, and a descriptor that turns readable when
    /// the kernel reports a change (see [`Observer::wake_fd`]).
    pub(super) fn watch_wakeups(&self) -> tokio::sync::watch::Receiver<u64> {
        self.observer().subscribe()
    }

    pub(super) fn watch_fd(&self) -> Option<std::os::fd::OwnedFd> {
        self.observer().wake_fd()
    }

    /// The folder as seen, its marker taken out and checked; unreadable,
    /// oversized and unrepresentable entries warned once.
    async fn mark(&self, seen: Observation) -> Marked {
        let Observation {
            scan,
            revision,
            examined,
            full,
            changed: _,
        } = seen;
        let Scan {
            files,
            unrepresentable,
            unreadable,
        } = &*scan;
        if full {
            debug!(memory_store.id = %self.id, examined, "memory folder scanned whole");
        }
        {
            let mut state = self.state();
            for path in unreadable.iter() {
                if state.warned_paths.insert(path.clone()) {
                    warn!(
                        memory_store.id = %self.id,
                        memory.path = %path,
                        "this entry of the memory store folder cannot be read; it is skipped, and nothing at or below it is uploaded, deleted or pulled over"
                    );
                }
            }
            // A file over the limit is refused by its stat, never read: the
            // server would refuse it too (413). The operator reads the
            // reference's line for that refusal, with why in `rejection`.
            for (rel, sha) in files.iter().filter(|(_, sha)| is_oversized(sha)) {
                state.refused.insert(rel.clone(), sha.clone());
                if state.warned_paths.insert(rel.clone()) {
                    state.new_refusals += 1;
                    let size = oversized_bytes(sha).unwrap_or(MAX_FILE_BYTES + 1);
                    warn!(
                        memory_store.id = %self.id,
                        memory.path = %rel,
                        size_bytes = size,
                        limit_bytes = MAX_FILE_BYTES,
                        rejection = %format_args!("the file holds {size} bytes, over the {MAX_FILE_BYTES}-byte limit of a memory; refused before it is sent (and not deleted)"),
                        "the server rejected this memory file, so it stays un-synced until its content changes"
                    );
                }
            }
            for name in unrepresentable.iter() {
                if state.warned_names.insert(name.clone()) {
                    warn!(
                        memory_store.id = %self.id,
                        memory.path = %name,
                        "the file name is not valid UTF-8, so it cannot be a memory; the file stays un-synced"
                    );
                }
            }
        }
        let mut distrust = marker_distrust(files.get(MARKER_PATH).map(String::as_str), &self.id);
        // A marker made unreadable in the very directory the mount created
        // is still ours: stamp it again rather than distrust the folder.
        if unreadable.iter().any(|u| u == MARKER_PATH) && self.folder.is_original_root() {
            let folder = self.folder.clone();
            let marker = marker_content(&self.id);
            if let Ok(Ok(())) = blocking(move || folder.put(MARKER_PATH, marker.as_bytes())).await {
                distrust = None;
            }
        }
        Marked {
            files: LocalFiles(scan),
            revision,
            distrust,
            examined,
            full,
        }
    }

    /// Every memory of the store as (id, hash) by relative path (the entry's
    /// own `path` is moved into the key); prefixes, unknown item types and
    /// the marker path are skipped.
    ///
    /// Between full listings the index is advanced from the version feed
    /// (see `super::feed`): one request when nothing changed. `full` (the
    /// final sync, the flush) lists the whole store, as do the safety
    /// cadence and any doubt about the feed.
    pub(super) async fn index(
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
        let newest = self.newest_versions(api).await;
        let remote = Arc::new(self.list_index(api).await?);
        self.remember_ids(&remote);
        *self.remote_index() = self.seed(Arc::clone(&remote), newest, asked);
        Ok(remote)
    }

    fn feed_clock(&self) -> std::sync::MutexGuard<'_, Option<FeedClock>> {
        self.feed_clock.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn remote_index(&self) -> std::sync::MutexGuard<'_, Option<RemoteIndex>> {
        self.remote.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn remember_ids(&self, remote: &BTreeMap<String, MemoryIndexEntry>) {
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
    fn seed(
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

    /// The first page of the version history (newest first), to seed the
    /// feed; `None` when it cannot be read (the feed is then off until the
    /// next full listing). The answer's `Date` is not used: the feed's
    /// window follows the versions' own `created_at` (see `super::feed`).
    async fn newest_versions(&self, api: &dyn MemoryApi) -> Option<Vec<MemoryVersion>> {
        match api.versions(&self.id, None, FEED_PAGE, None).await {
            Ok((page, _date)) => Some(page.data),
            Err(e) => {
                debug!(memory_store.id = %self.id, error = %e, "cannot read the memory version history; listing the store each sync");
                None
            }
        }
    }

    /// The index advanced by the versions created since the last poll, and
    /// whether they moved it; or why not: no index (none seeded, or a full
    /// listing is due, or the feed is in doubt), or the versions request
    /// failed. Whatever it answers but `Advanced`, the index is gone until
    /// the next full listing seeds it again.
    pub(super) async fn follow(&self, api: &dyn MemoryApi) -> Followed {
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
    pub(super) fn settle_sent(
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

    /// The first download, before the agent runs: nothing else writes to
    /// the folder meanwhile, so the hashes of what it writes go straight to
    /// the stat cache and the first sync need not read the files back.
    pub(crate) async fn mount(&self, api: &dyn MemoryApi) -> Result<usize, PassError> {
        let written = self.stamp_and_pull(api, true).await?;
        let folder = self.folder.clone();
        blocking(move || folder.trust_private_writes()).await??;
        // The watch goes in before the agent gets the folder, with one full
        // scan under it: from here on a sync examines what changed. A scan
        // that fails here fails no mount: the first sync scans whole again.
        if let Err(e) = self.scan(true).await {
            debug!(memory_store.id = %self.id, error = %e, "cannot scan the memory store folder after the download");
        }
        Ok(written)
    }

    /// Write the marker, then every memory of the store; the baseline is
    /// rebuilt from successful writes only, so a failed write is pulled
    /// again later, never read as a deletion. `private`: no one else writes
    /// to the folder until the caller says so (see [`Folder::put_private`]).
    async fn stamp_and_pull(&self, api: &dyn MemoryApi, private: bool) -> Result<usize, PassError> {
        {
            let mut state = self.state();
            let old = state.baseline.take();
            state.tentative.extend(old);
            state.sent.clear();
            state.in_flight.clear();
            // The disk was just rebuilt: earlier absences mean nothing.
            state.pending.clear();
        }
        let folder = self.folder.clone();
        let marker = marker_content(&self.id);
        blocking(move || put(&folder, MARKER_PATH, marker.as_bytes(), private)).await??;
        // The feed's high-water, read before the listing (see `index`).
        let asked = Instant::now();
        let newest = self.newest_versions(api).await;
        // The top level with its prefixes rolled up, then each prefix
        // listed on its own, `LIST_CONCURRENCY` at once: the cursor makes
        // one listing's pages sequential, so under latency the mount costs
        // the longest prefix's pages, not the whole store's. A server that
        // refuses `depth` gets the one sequential listing.
        let (mut pulled, prefixes) = match self.pull_pages(api, private, None, Some(1)).await {
            Ok(got) => got,
            Err(PassError::Api(e))
                if matches!(e.status(), Some(400 | 404))
                    || matches!(e, crate::api::Error::Config(_)) =>
            {
                debug!(memory_store.id = %self.id, error = %e, "the memory store cannot be listed by prefix; listing it in one go");
                self.pull_pages(api, private, None, None).await?
            }
            Err(e) => return Err(e),
        };
        let parts: Vec<Result<(Pulled, Vec<String>), PassError>> = stream::iter(prefixes)
            .map(|prefix| self.pull_pages(api, private, Some(prefix), None))
            .buffer_unordered(LIST_CONCURRENCY)
            .collect()
            .await;
        for part in parts {
            let (part, _) = part?;
            pulled.written += part.written;
            pulled.listed.extend(part.listed);
        }
        let Pulled { written, listed } = pulled;
        // The whole store was listed: what it no longer holds is no concern.
        self.state()
            .tentative
            .retain(|rel, _| listed.contains_key(rel));
        *self.remote_index() = self.seed(listed.into(), newest, asked);
        Ok(written)
    }

    /// Every page of one listing (`view=full`; the whole store, or the
    /// memories under `prefix`, to `depth`), each written as it arrives.
    /// Returns what was listed and written, and the prefixes rolled up.
    async fn pull_pages(
        &self,
        api: &dyn MemoryApi,
        private: bool,
        prefix: Option<String>,
        depth: Option<u32>,
    ) -> Result<(Pulled, Vec<String>), PassError> {
        let mut pulled = Pulled::default();
        let mut prefixes = Vec::new();
        // This listing's own cursor: never another prefix's.
        let mut page = None;
        loop {
            let got = api
                .list_under(
                    &self.id,
                    View::Full,
                    FULL_PAGE,
                    prefix.as_deref(),
                    depth,
                    page.take(),
                )
                .await?;
            let next = got.next_cursor().map(str::to_string);
            let mut items: Vec<(String, String, String, String)> = Vec::new();
            for item in got.data {
                let m = match item {
                    // A rollup to list on its own only where this listing
                    // asked for rollups; a recursive listing has none to
                    // follow (and its memories are all here).
                    MemoryListItem::Prefix(p) => {
                        if depth == Some(1) {
                            prefixes.push(p.path);
                        }
                        continue;
                    }
                    other => match other.into_memory() {
                        Some(m) => m,
                        None => continue,
                    },
                };
                let rel = m.path.trim_start_matches('/').to_string();
                if rel == MARKER_PATH {
                    warn!(memory_store.id = %self.id, memory.path = %m.path, "the server listed the reserved marker path; skipping");
                    continue;
                }
                items.push((rel, m.id, m.content.unwrap_or_default(), m.content_sha256));
            }
            // One blocking hop per page.
            let folder = self.folder.clone();
            let results = blocking(move || {
                items
                    .into_iter()
                    .map(|(rel, id, content, sha)| {
                        let r = put(&folder, &rel, content.as_bytes(), private);
                        (rel, id, sha, r)
                    })
                    .collect::<Vec<_>>()
            })
            .await?;
            crate::killpoint::hit("memory.pull.written");
            let mut state = self.state();
            for (rel, id, sha, result) in results {
                pulled.listed.insert(
                    rel.clone(),
                    MemoryIndexEntry {
                        kind: IndexKind::Memory,
                        id: id.clone(),
                        path: String::new(),
                        content_sha256: sha.clone(),
                    },
                );
                state.ids.insert(rel.clone(), id);
                match result {
                    Ok(()) => {
                        state.tentative.remove(&rel);
                        state.baseline.insert(rel, sha);
                        pulled.written += 1;
                    }
                    Err(e) => {
                        warn!(memory_store.id = %self.id, memory.path = %rel, error = %e, "failed to write memory")
                    }
                }
            }
            drop(state);
            match next {
                Some(n) => page = Some(n),
                None => return Ok((pulled, prefixes)),
            }
        }
    }

    async fn recover(&self, api: &dyn MemoryApi, reason: &str) -> Result<(), PassError> {
        warn!(
            memory_store.id = %self.id,
            root = %self.folder.root().display(),
            "{reason}; re-downloading the memory store folder instead of syncing"
        );
        let folder = self.folder.clone();
        blocking(move || folder.create_root()).await??;
        // A rebuilt folder is scanned whole next time.
        self.observer().forget();
        self.stamp_and_pull(api, false).await?;
        Ok(())
    }

    /// One sync pass; never fails (a failure is logged and the next pass retries).
    pub(crate) async fn sync(
        &self,
        api: &dyn MemoryApi,
        deletions: DeleteMode,
        final_sync: bool,
    ) -> SyncReport {
        let span = tracing::info_span!(
            "memory.sync",
            memory_store.id = %self.id,
            final_sync,
            duration_ms = tracing::field::Empty,
        );
        let started = Instant::now();
        let pass = async {
            // Busy from now: the push starts no upload while this waits
            // for the store or runs, and this pass takes over the paths of
            // the push's uploads that had not started.
            let _busy = self.board.busy();
            let _pass = self.pass.lock().await;
            self.board.take_over_unstarted();
            let mut stats = SyncReport::default();
            if let Err(e) = self.try_sync(api, deletions, final_sync, &mut stats).await {
                warn!(memory_store.id = %self.id, error = %e, "memory sync failed");
            }
            self.sync_journal().await;
            stats.pushed = self.pushed.swap(0, std::sync::atomic::Ordering::Relaxed);
            stats
        };
        let stats = pass.instrument(span.clone()).await;
        span.record("duration_ms", started.elapsed().as_millis() as u64);
        stats
    }

    /// One pass: observe (scan the folder, list the store) → plan (the
    /// folder's verdict, then each path's) → execute, each operation
    /// committed to the baseline the moment it completes.
    async fn try_sync(
        &self,
        api: &dyn MemoryApi,
        deletions: DeleteMode,
        final_sync: bool,
        stats: &mut SyncReport,
    ) -> Result<(), PassError> {
        let Some((scan, remote)) = self.observe(api, final_sync, stats).await? else {
            return Ok(());
        };

        // Nothing the plan reads has changed since a sync that planned
        // nothing at all (the same folder view, remote index and state, no
        // delete window running, no tentative baseline — the plan is a pure
        // function of those and the clock, which only a pending delete
        // reads): this one would plan nothing either. An idle sync of a
        // large store then costs no walk over its paths.
        // The paths the push's uploads carry are left to them (planned
        // again once they end).
        let flying = self.board.flying();
        let facts = self
            .plan_revisions(&scan, &remote)
            .filter(|_| flying.is_empty());
        if !final_sync && facts.is_some() && *self.quiet() == facts {
            return Ok(());
        }

        // Plan every path.
        let pass = PassFacts {
            read_only: self.read_only,
            deletions,
            final_sync,
            now: Instant::now(),
        };
        let work = self.plan_paths(&scan, &remote, pass, &flying);
        // Recorded only if the state did not move while planning.
        *self.quiet() = facts.filter(|f| work.is_empty() && self.state().revision == f.2);

        self.execute(api, work, pass, stats).await;

        // A tentative entry retires once the path has a real baseline, or
        // once the server no longer holds it.
        let mut guard = self.state();
        let state = &mut *guard;
        let baseline = &state.baseline;
        state
            .tentative
            .retain(|rel, _| !baseline.contains_key(rel) && remote.contains_key(rel));
        Ok(())
    }

    /// A sync's observation: the folder scanned and judged, then the store
    /// listed (or its index advanced) and the uploads without an answer
    /// settled against it, and the folder judged again with the baseline
    /// that settled. `None`: the folder's verdict ended the pass.
    async fn observe(
        &self,
        api: &dyn MemoryApi,
        final_sync: bool,
        stats: &mut SyncReport,
    ) -> Result<Option<(Marked, RemoteMap)>, PassError> {
        // The final sync scans whole, as every sync did before the watch.
        let scan = self.scan(final_sync).await?;
        stats.examined = scan.examined;
        stats.full_scans = usize::from(scan.full);
        let mut folder = scan.folder_facts(FolderOp::Sync);
        if !self.carry_out_folder_verdict(api, folder, stats).await? {
            return Ok(None);
        }
        // A file this scan saw is not missing, whatever happens to the rest of
        // the pass: a pass that fails after the scan still breaks a pending
        // delete's streak, so an absence is only corroborated by scans that
        // all saw it.
        self.state()
            .pending
            .retain(|rel, _| !scan.files.contains_key(rel));
        let remote = self.index(api, final_sync).await?;
        self.settle_sent(&remote, &scan.files);
        // Asked again with the baseline the listing settled: is this a wipe?
        folder.baseline = Some(self.state().baseline.len());
        if !self.carry_out_folder_verdict(api, folder, stats).await? {
            return Ok(None);
        }
        Ok(Some((scan, remote)))
    }

    /// Carry out a pass's plan. The decisions' own baseline entries are
    /// recorded at once; each I/O records its entry the moment it completes.
    async fn execute(
        &self,
        api: &dyn MemoryApi,
        work: Work,
        pass: PassFacts,
        stats: &mut SyncReport,
    ) {
        let Work {
            changes,
            pulls,
            mut uploads,
            removals,
            deletes,
            notes,
            suppressed,
            mut budget,
        } = work;
        for (rel, note) in notes {
            if note == Note::BothChanged {
                stats.conflicts += 1;
            }
            self.report(&rel, note);
        }
        for (rel, sha) in changes {
            self.record(rel, sha);
        }
        uploads.extend(self.remove_all(removals, pass).await);
        // Pulls before uploads: a backlog of uploads (an agent writing
        // faster than the server takes it) never holds back the server's
        // changes. Each path has one decision, so the order changes nothing
        // else.
        stats.pulls = self.pull_all(api, pulls).await;
        stats.uploads = self.upload_all(api, uploads).await;
        {
            let mut state = self.state();
            stats.refused = std::mem::take(&mut state.new_refusals);
            stats.conflicts += std::mem::take(&mut state.lost_uploads);
        }
        for (rel, id, base) in deletes {
            let kept = self
                .confirm_delete(api, &rel, &id, &base, &mut budget)
                .await;
            if kept.is_none() {
                stats.deletes += 1;
            }
            self.record(rel, kept);
        }
        stats.deletes_logged = budget.logged();
        stats.deletes_held = budget.held();
        if suppressed > 0 {
            debug!(
                memory_store.id = %self.id,
                count = suppressed,
                "remote deletes are disabled; locally deleted memories stay on the server"
            );
        }
        if let Some((verb, attempted, capped)) = budget.cap_reached() {
            warn!(
                memory_store.id = %self.id,
                "delete cap reached: {verb} {attempted} deletes, held {capped} for later syncs"
            );
        }
    }

    /// Memories the server deleted: each file removed, unless it was edited
    /// since the scan — then it is the only copy, planned again: the
    /// uploads that planning makes.
    async fn remove_all(
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
                        uploads.push((rel, Some(fresh), update, fallback));
                    }
                }
            }
        }
        uploads
    }

    /// The pass's uploads, [`UPLOAD_CONCURRENCY`] at once, each recorded as
    /// it lands (or its fallback as it fails): how many landed.
    async fn upload_all(&self, api: &dyn MemoryApi, uploads: Vec<PlannedUpload>) -> usize {
        stream::iter(uploads)
            .map(|(rel, local, update, fallback)| async move {
                match self.upload(api, &rel, local.as_deref(), update).await {
                    Outcome::Landed(sha) => {
                        self.record(rel, Some(sha));
                        true
                    }
                    // A newer upload of ours moved the baseline already.
                    Outcome::Superseded => false,
                    Outcome::Settled | Outcome::Failed(_) => {
                        self.record(rel, fallback);
                        false
                    }
                }
            })
            .buffer_unordered(UPLOAD_CONCURRENCY)
            .filter(|ok| std::future::ready(*ok))
            .count()
            .await
    }

    fn quiet(&self) -> std::sync::MutexGuard<'_, Option<(u64, u64, u64)>> {
        self.quiet.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next sync plans every path again, whatever it finds unchanged.
    pub(super) fn forget_quiet(&self) {
        *self.quiet() = None;
    }

    /// What a sync plans from, as revisions: the folder view's, the remote
    /// index's (the feed's index this pass read), the state's. `None` when
    /// the plan also reads the clock (a delete window running) or a
    /// tentative baseline, or the remote map is not the feed's.
    fn plan_revisions(&self, scan: &Marked, remote: &RemoteMap) -> Option<(u64, u64, u64)> {
        let remote = self
            .remote_index()
            .as_ref()
            .filter(|index| Arc::ptr_eq(&index.map, remote))
            .map(|index| index.revision)?;
        let state = self.state();
        (state.pending.len() == 0 && state.tentative.len() == 0).then_some((
            scan.revision,
            remote,
            state.revision,
        ))
    }

    /// Carry out a sync's verdict on the folder ([`plan_folder`]): `true`
    /// when the pass goes on.
    async fn carry_out_folder_verdict(
        &self,
        api: &dyn MemoryApi,
        facts: FolderFacts,
        stats: &mut SyncReport,
    ) -> Result<bool, PassError> {
        match plan_folder(facts) {
            FolderVerdict::Proceed => Ok(true),
            // The scan warned once already.
            FolderVerdict::Skip => Ok(false),
            FolderVerdict::LeaveAlone(reason) => {
                warn!(
                    memory_store.id = %self.id,
                    root = %self.folder.root().display(),
                    "{reason}; leaving the memory store folder as found and not syncing. Delete it to recover — the server copy is intact."
                );
                Ok(false)
            }
            FolderVerdict::Recover(why) => {
                stats.recovered = 1;
                self.recover(api, why.reason()).await?;
                Ok(false)
            }
        }
    }

    /// Plan every path of the pass ([`plan`]) under one lock, reading the
    /// state in place, and say what is left to do. The pending-delete
    /// records move here, as the plans say; the baseline only changes
    /// where a decision (or its I/O) moves it, by the caller.
    fn plan_paths(
        &self,
        scan: &Marked,
        remote: &BTreeMap<String, MemoryIndexEntry>,
        pass: PassFacts,
        flying: &std::collections::HashSet<String>,
    ) -> Work {
        let mut guard = self.state();
        let State {
            baseline,
            tentative,
            refused,
            pending,
            ..
        } = &mut *guard;
        let mut work = Work {
            changes: Vec::new(),
            pulls: Vec::new(),
            uploads: Vec::new(),
            removals: Vec::new(),
            deletes: Vec::new(),
            notes: Vec::new(),
            suppressed: 0,
            budget: DeleteBudget::new(pass.deletions, baseline.len()),
        };
        let mut remote_it = remote.iter().peekable();
        let mut local_it = scan.files.iter().peekable();
        let mut baseline_it = baseline.iter().peekable();
        let mut tentative_it = tentative.iter().peekable();
        // The four maps are sorted by path: walk them in step, so each
        // path is visited once and looked up nowhere.
        while let Some(rel) = [
            remote_it.peek().map(|e| e.0),
            local_it.peek().map(|e| e.0),
            baseline_it.peek().map(|e| e.0),
            tentative_it.peek().map(|e| e.0),
        ]
        .into_iter()
        .flatten()
        .min()
        {
            let listed = remote_it.next_if(|e| e.0 == rel).map(|e| e.1);
            let local = local_it.next_if(|e| e.0 == rel).map(|e| e.1);
            let confirmed = baseline_it.next_if(|e| e.0 == rel).map(|e| e.1);
            let held = tentative_it.next_if(|e| e.0 == rel).map(|e| e.1);
            // An upload of the push carries it: left as it is until it ends.
            if !flying.is_empty() && flying.contains(rel) {
                continue;
            }
            // Settled, and no record concerns it: the plan would keep it as
            // it is (`plan::settled`), so it is not planned.
            if held.is_none()
                && settled(
                    local.map(String::as_str),
                    confirmed.map(String::as_str),
                    listed.map(|m| m.content_sha256.as_str()),
                )
                && !pending.contains_key(rel)
            {
                continue;
            }
            let facts = PathFacts {
                local: local.map(String::as_str),
                baseline: confirmed.or(held).map(String::as_str),
                remote: listed.map(|m| Listed {
                    id: &m.id,
                    sha: &m.content_sha256,
                }),
                refused: refused.get(rel).map(String::as_str),
                missing_since: pending.get(rel).copied(),
                tentative: confirmed.is_none() && held.is_some(),
                unreadable: local.is_none() && scan.files.is_unknown(rel),
            };
            let p = plan(facts, pass);
            match p.pending {
                Pending::Unchanged => {}
                Pending::Clear => {
                    pending.remove(rel);
                }
                Pending::Since(t) => pending.insert_if_absent(rel, t),
            }
            work.take(rel, p, confirmed, listed, facts.local);
        }
        work
    }

    /// Record one path's new baseline entry (`None`: out of the baseline),
    /// at once — the moment the decision or the I/O behind it completes.
    fn record(&self, rel: String, sha: Option<String>) {
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

    fn report(&self, rel: &str, note: Note) {
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

    /// Push one file: what became of it ([`Outcome`]; on anything but
    /// `Landed` the caller keeps its fallback). 404 on an update
    /// re-creates; 409 on an update loses the local edit to another
    /// writer's — unless the memory holds bytes of ours (see
    /// [`Self::whose`]); 400, 413 and content the folder refuses (not
    /// UTF-8) are remembered as refused until the file changes.
    pub(crate) fn upload<'a>(
        &'a self,
        api: &'a dyn MemoryApi,
        rel: &'a str,
        local_sha: Option<&'a str>,
        update: Option<(String, String)>,
    ) -> futures::future::BoxFuture<'a, Outcome> {
        Box::pin(async move {
            // The marker is read again with the file: an upload can start
            // long after its pass judged the folder (a push upload waiting
            // for a slot, a re-send after a 404 or a 409), and a folder that
            // stopped naming this store uploads nothing.
            let folder = self.folder.clone();
            let r = rel.to_string();
            let id = self.id.clone();
            let read = move || {
                if !marks_store(&folder, &id) {
                    return Ok(None);
                }
                folder.get(&r)
            };
            let data = match blocking(read).await {
                Ok(Ok(Some(data))) => data,
                Ok(Ok(None)) => return Outcome::Settled,
                Ok(Err(e)) if e.is_refusal() => {
                    self.refuse(rel, local_sha, &e.to_string());
                    return Outcome::Settled;
                }
                Ok(Err(e)) => {
                    warn!(memory_store.id = %self.id, memory.path = %rel, error = %e, "failed to upload memory");
                    return Outcome::Failed(None);
                }
                Err(e) => {
                    warn!(memory_store.id = %self.id, memory.path = %rel, error = %e, "failed to upload memory");
                    return Outcome::Failed(None);
                }
            };
            let sending = sha256_hex(&data);
            let seq = {
                let mut state = self.state();
                let seq = state.next_send();
                state.sent.insert(rel.to_string(), sending.clone());
                // Stays if this future is dropped mid-flight (a bound cut
                // the pass off): the request may still land.
                let guard = update.as_ref().map(|(_, expected)| expected.as_str());
                state.sending(rel, &sending, guard, Instant::now(), seq);
                seq
            };
            // The folder returns only UTF-8 for a memory store.
            let content = String::from_utf8_lossy(&data);
            let path = format!("/{rel}");
            let result = match &update {
                None => api.create(&self.id, &path, &content).await,
                Some((id, expected)) => api.update(&self.id, id, &content, expected).await,
            };
            let e = match result {
                Ok(memory) => {
                    crate::killpoint::hit("memory.upload.landed");
                    // The baseline and the sent record change in one batch:
                    // the journal never holds one without the other.
                    let mut state = self.state();
                    state.refused.remove(rel);
                    if state.sent.get(rel) == Some(&sending) {
                        state.sent.remove(rel);
                    }
                    state.landed(rel, &memory.content_sha256, seq);
                    state
                        .baseline
                        .insert(rel.to_string(), memory.content_sha256.clone());
                    state.ids.insert(rel.to_string(), memory.id);
                    return Outcome::Landed(memory.content_sha256);
                }
                Err(e) => e,
            };
            // An answer settles the request; a transport failure, a timeout
            // or a gateway's answer (408, 502, 504: the backend may still
            // apply it) does not.
            if e.status().is_some_and(|s| !matches!(s, 408 | 502 | 504)) {
                self.state().answered(rel, &sending, false);
            }
            self.after_refusal(api, rel, local_sha, update, &e, &sending, seq)
                .await
        })
    }

    /// What became of an upload the server answered with an error (or
    /// never answered): 404 on an update re-creates, 409 on an update asks
    /// whose bytes the memory holds ([`Self::whose`]), 400 and 413 are
    /// remembered as refused, the rest is worth another try.
    #[allow(clippy::too_many_arguments)]
    async fn after_refusal(
        &self,
        api: &dyn MemoryApi,
        rel: &str,
        local_sha: Option<&str>,
        update: Option<(String, String)>,
        e: &crate::api::Error,
        sending: &str,
        seq: u64,
    ) -> Outcome {
        match (update, e.status()) {
            // Deleted since the listing: the file is now the only copy.
            (Some(_), Some(404)) => self.upload(api, rel, local_sha, None).await,
            (Some((id, _)), Some(409)) => {
                match self.whose(api, rel, &id, sending, seq).await {
                    Whose::Same(current) => {
                        let mut state = self.state();
                        if state.sent.get(rel).map(String::as_str) == Some(sending) {
                            state.sent.remove(rel);
                        }
                        state.baseline.insert(rel.to_string(), current.clone());
                        Outcome::Landed(current)
                    }
                    Whose::OlderOfOurs(current) => {
                        info!(
                            memory_store.id = %self.id,
                            memory.path = %rel,
                            "an upload of ours cut off in flight landed late; sending the newer edit over it"
                        );
                        self.upload(api, rel, local_sha, Some((id, current))).await
                    }
                    Whose::NewerOfOurs => {
                        debug!(memory_store.id = %self.id, memory.path = %rel, "a newer upload of ours landed first; this one has nothing left to do");
                        Outcome::Superseded
                    }
                    Whose::Theirs => {
                        // The sent hash stays: this may be a retry of an
                        // attempt that landed; the next listing tells.
                        self.state().lost_uploads += 1;
                        warn!(
                            memory_store.id = %self.id,
                            memory.path = %rel,
                            "memory changed both locally and remotely; the upload was refused and the local edit loses"
                        );
                        Outcome::Settled
                    }
                }
            }
            (_, Some(400 | 413)) => {
                self.refuse(rel, local_sha, &e.to_string());
                Outcome::Settled
            }
            _ => {
                warn!(memory_store.id = %self.id, memory.path = %rel, error = %e, "failed to upload memory");
                Outcome::Failed(e.api().and_then(|a| a.retry_after()))
            }
        }
    }

    /// After send number `seq` of `sending` to `rel` (memory `id`) was
    /// refused (409): whose bytes does the memory hold now? Asks the server
    /// only when one of our own uploads could explain it — one without an
    /// answer that may have landed late (cut off in flight, then committed
    /// after the listing this update was guarded by), or one that landed
    /// while this one was on its way (the push's and the flush's) — so a
    /// plain conflict costs nothing more. Bytes equal to ours are ours
    /// whoever wrote them; the send numbers tell an older upload of ours
    /// from a newer one (`State::owner_of`); the rest is another writer's.
    async fn whose(
        &self,
        api: &dyn MemoryApi,
        rel: &str,
        id: &str,
        sending: &str,
        seq: u64,
    ) -> Whose {
        let candidates = {
            let state = self.state();
            state.in_flight.contains_key(rel) || state.landed.contains_key(rel)
        };
        if !candidates {
            return Whose::Theirs;
        }
        let current = match api.retrieve(&self.id, id).await {
            Ok(memory) => memory.content_sha256,
            Err(e) => {
                debug!(memory_store.id = %self.id, memory.path = %rel, error = %e, "cannot read the memory an upload was refused for");
                return Whose::Theirs;
            }
        };
        if current == sending {
            return Whose::Same(current);
        }
        match self.state().owner_of(rel, &current, seq) {
            Owner::OlderSend => Whose::OlderOfOurs(current),
            Owner::NewerSend => Whose::NewerOfOurs,
            Owner::Other => Whose::Theirs,
        }
    }

    fn refuse(&self, rel: &str, local_sha: Option<&str>, rejection: &str) {
        if let Some(sha) = local_sha {
            let mut state = self.state();
            state.refused.insert(rel.to_string(), sha.to_string());
            state.new_refusals += 1;
            drop(state);
            warn!(
                memory_store.id = %self.id,
                memory.path = %rel,
                rejection = %rejection,
                "the server rejected this memory file, so it stays un-synced until its content changes"
            );
        } else {
            warn!(memory_store.id = %self.id, memory.path = %rel, error = %rejection, "failed to upload memory");
        }
    }

    /// The second phase of a local deletion: re-check the marker and the
    /// file now (not from the scan), then carry out the budget's verdict
    /// (see [`DeleteBudget`]): delete on the server, only log, or hold.
    /// Returns the baseline entry to keep, or `None` when the path leaves
    /// the baseline.
    async fn confirm_delete(
        &self,
        api: &dyn MemoryApi,
        rel: &str,
        id: &str,
        base: &str,
        budget: &mut DeleteBudget,
    ) -> Option<String> {
        let keep = Some(base.to_string());
        let folder = self.folder.clone();
        let r = rel.to_string();
        let recheck = blocking(move || {
            let marker = folder.hash_file(MARKER_PATH)?;
            let file = folder.hash_file(&r)?;
            Ok::<_, FolderError>((marker, file))
        })
        .await;
        let Ok(Ok((marker, file))) = recheck else {
            return keep;
        };
        if marker_distrust(marker.as_deref(), &self.id).is_some() {
            return keep;
        }
        if file.is_some() {
            // Back again: no delete, and a later deletion starts a fresh window.
            self.state().pending.remove(rel);
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

    /// A memory just fetched is at least as fresh as the remote index's
    /// entry for it: when the feed missed a version (one committed late
    /// beyond its overlap), the stale hash would make the next local edit
    /// read as a conflict with a remote change that never came.
    fn correct_index(&self, rel: &str, id: &str, sha: &str) {
        if let Some(index) = self.remote_index().as_mut()
            && index
                .map
                .get(rel)
                .is_some_and(|e| e.id == id && e.content_sha256 != sha)
            && let Some(entry) = Arc::make_mut(&mut index.map).get_mut(rel)
        {
            entry.content_sha256 = sha.to_string();
            index.revision = super::watch::next_revision();
        }
    }

    /// The content pass: fetch each pulled memory and write it,
    /// `FETCH_CONCURRENCY` at a time. Returns how many landed.
    async fn pull_all(&self, api: &dyn MemoryApi, pulls: Vec<(String, String)>) -> usize {
        stream::iter(pulls)
            .map(|(rel, id)| async move {
                let memory = match api.retrieve(&self.id, &id).await {
                    Ok(m) => m,
                    // Deleted after the listing: the next sync reconciles it.
                    Err(e) if e.status() == Some(404) => return false,
                    Err(e) => {
                        warn!(memory_store.id = %self.id, memory.path = %rel, error = %e, "failed to fetch memory content");
                        return false;
                    }
                };
                let folder = self.folder.clone();
                let r = rel.clone();
                let content = memory.content.unwrap_or_default();
                match blocking(move || folder.put(&r, content.as_bytes())).await {
                    Ok(Ok(())) => {
                        crate::killpoint::hit("memory.pull.written");
                        self.correct_index(&rel, &memory.id, &memory.content_sha256);
                        let mut state = self.state();
                        state.tentative.remove(&rel);
                        state.baseline.insert(rel, memory.content_sha256);
                        true
                    }
                    Ok(Err(e)) => {
                        warn!(memory_store.id = %self.id, memory.path = %rel, error = %e, "failed to write memory");
                        false
                    }
                    Err(e) => {
                        warn!(memory_store.id = %self.id, memory.path = %rel, error = %e, "failed to write memory");
                        false
                    }
                }
            })
            .buffer_unordered(FETCH_CONCURRENCY)
            .filter(|ok| std::future::ready(*ok))
            .count()
            .await
    }

    /// Remove the folder if the worker made it and it still passes the
    /// marker check; never fails.
    pub(crate) async fn dispose(&self) {
        let checked = match self.scan(true).await {
            Ok(scan) => scan,
            Err(e) => {
                warn!(memory_store.id = %self.id, root = %self.folder.root().display(), error = %e, "failed to remove the memory store folder");
                return;
            }
        };
        match plan_folder(checked.folder_facts(FolderOp::Dispose)) {
            FolderVerdict::Proceed => {}
            FolderVerdict::LeaveAlone(reason) => {
                warn!(memory_store.id = %self.id, root = %self.folder.root().display(), "{reason}; leaving the memory store folder on disk");
                // Not ours any more: nothing to recover from it.
                if let Some(journal) = self.take_journal() {
                    journal.remove();
                }
                return;
            }
            // Never for a disposal: it neither skips nor re-downloads.
            FolderVerdict::Skip | FolderVerdict::Recover(_) => return,
        }
        // The journal says the folder is going before anything goes: a
        // removal cut short is finished by the next mount, never recovered
        // (the files it removed must not read as deletions).
        {
            let mut state = self.state();
            if let Some(journal) = state.journal.as_mut()
                && let Err(e) = journal.mark_disposing()
            {
                warn!(memory_store.id = %self.id, error = %e, "cannot mark the memory store's journal before removing the folder");
            }
        }
        crate::killpoint::hit("memory.dispose.removing");
        let folder = self.folder.clone();
        match blocking(move || folder.dispose()).await {
            Ok(Ok(())) if self.folder.removed_on_dispose() => {
                if let Some(journal) = self.take_journal() {
                    journal.remove();
                }
                info!(memory_store.id = %self.id, root = %self.folder.root().display(), "removed memory store dir");
            }
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                warn!(memory_store.id = %self.id, root = %self.folder.root().display(), error = %e, "failed to remove the memory store folder")
            }
            Err(e) => {
                warn!(memory_store.id = %self.id, root = %self.folder.root().display(), error = %e, "failed to remove the memory store folder")
            }
        }
    }
}

/// What one poll of the version feed came to ([`AttachedStore::follow`]).
pub(super) enum Followed {
    /// The index, advanced; whether the versions moved it.
    Advanced(RemoteMap, bool),
    /// No index to advance: none seeded yet, a full listing due, or the
    /// feed in doubt.
    NoIndex,
    /// The versions request failed.
    Failed(crate::api::Error),
}

/// What a mount's listing wrote, and every memory it listed.
#[derive(Default)]
struct Pulled {
    written: usize,
    listed: BTreeMap<String, MemoryIndexEntry>,
}

/// An upload a pass plans: the path, the file's hash, the update (memory
/// id, expected hash) or `None` to create, and the baseline entry if it fails.
type PlannedUpload = (
    String,
    Option<String>,
    Option<(String, String)>,
    Option<String>,
);

/// What a sync pass planned: the work lists the executor carries out.
struct Work {
    /// The decisions' baseline entries (`None` takes the path out), applied
    /// right after the planning.
    changes: Vec<(String, Option<String>)>,
    /// (path, memory id) to fetch and write.
    pulls: Vec<(String, String)>,
    uploads: Vec<PlannedUpload>,
    /// (path, base): remove the file if it still holds `base`.
    removals: Vec<(String, String)>,
    /// (path, memory id, base): corroborated local deletions to re-check.
    deletes: Vec<(String, String, String)>,
    /// The conditions to report, in path order.
    notes: Vec<(String, Note)>,
    /// Local deletions kept on the server because deletions are disabled.
    suppressed: usize,
    /// The pass's delete budget, from the baseline it was planned against.
    budget: DeleteBudget,
}

impl Work {
    /// One path's plan in the lists: its note, and its decision (the
    /// baseline entry now, or the I/O that settles it). `confirmed` is the
    /// path's baseline entry, `listed` its memory on the server, `local` the
    /// file's hash.
    fn take(
        &mut self,
        rel: &str,
        p: Plan,
        confirmed: Option<&String>,
        listed: Option<&MemoryIndexEntry>,
        local: Option<&str>,
    ) {
        match p.note {
            Some(Note::DeleteSuppressed) => self.suppressed += 1,
            Some(note) => self.notes.push((rel.to_string(), note)),
            None => {}
        }
        let mut keep = |sha: Option<String>| {
            if confirmed != sha.as_ref() {
                self.changes.push((rel.to_string(), sha));
            }
        };
        match p.decision {
            Decision::Forget => keep(None),
            Decision::Keep(sha) | Decision::HoldDelete { base: sha } => keep(Some(sha)),
            Decision::Pull { keep: k } => {
                keep(k);
                // The planner pulls only what the server listed.
                if let Some(m) = listed {
                    self.pulls.push((rel.to_string(), m.id.clone()));
                }
            }
            // These settle their baseline entry after their I/O.
            Decision::Upload { update, fallback } => {
                self.uploads
                    .push((rel.to_string(), local.map(str::to_string), update, fallback))
            }
            Decision::RemoveLocal { base } => self.removals.push((rel.to_string(), base)),
            Decision::Delete { id, base } => self.deletes.push((rel.to_string(), id, base)),
        }
    }

    /// Nothing to do, nothing to report.
    fn is_empty(&self) -> bool {
        self.changes.is_empty()
            && self.pulls.is_empty()
            && self.uploads.is_empty()
            && self.removals.is_empty()
            && self.deletes.is_empty()
            && self.notes.is_empty()
            && self.suppressed == 0
    }
}

enum Removal {
    /// The file is gone; the path leaves the baseline.
    Gone,
    /// Keep the baseline (a failed re-hash or removal).
    Kept,
    /// Edited since the scan: the file now holds this hash.
    Edited(String),
}
