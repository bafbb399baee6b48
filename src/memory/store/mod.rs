//! One attached store: its folder, its sync state, and the wiring that
//! carries a pass through its steps, each a module of its own:
//!
//! - observe — `local` (the folder as its watch and a scan see it, the
//!   marker checked by `marker`) and `index` (what the server holds: listed
//!   whole, or followed by the version feed);
//! - plan — `work`: every path through the pure planner (`super::plan`),
//!   gathered into the work lists;
//! - execute — `execute` runs the lists: `deletes` (local removals, then
//!   corroborated remote deletes), `pulls`, `upload`;
//! - commit — `record`: each completed operation enters the state (see
//!   `super::state`) and its journal as it completes.
//!
//! `sync` runs one pass in that order; `mount` is the first download (and
//! the re-download of a folder the sync cannot trust).
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

mod deletes;
mod execute;
mod index;
mod local;
mod marker;
mod mount;
mod pulls;
mod record;
mod sync;
mod upload;
mod work;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tracing::{Instrument, debug, info, warn};

use super::feed::{FULL_LISTING_EVERY, FeedClock, RemoteIndex};
use super::flights::FlightBoard;
use super::folder::{Folder, FolderError};
use super::journal::{Journal, Snapshot};
use super::observe::Observer;
use super::options::DeleteMode;
use super::plan::{FolderOp, FolderVerdict, plan_folder};
use super::remote::MemoryApi;
use super::report::SyncReport;
use super::state::{State, StateGuard};

pub(crate) use self::index::{Followed, RemoteMap};
pub(crate) use self::local::{LocalFiles, Marked};
#[cfg(test)]
pub(crate) use self::marker::marker_content;
pub(crate) use self::marker::marks_store;
pub(crate) use self::mount::FirstReads;
pub(crate) use self::upload::Outcome;
pub use self::upload::UPLOAD_CONCURRENCY;
/// The reserved marker at every store root (defined with the folder).
pub use super::folder::MARKER_PATH;

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

/// The hash of a memory's content, as the server writes it.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, PassError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| PassError::Join(e.to_string()))
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
    /// Held while the journal's appends are made durable: one `fdatasync`
    /// at a time (see [`AttachedStore::sync_journal`]).
    journal_sync: tokio::sync::Mutex<()>,
    /// The journal's `fdatasync`s: how many ran, and the most at once.
    pub(super) journal_syncs: SyncCount,
}

/// How many journal syncs ran, and the most that ran at once.
#[derive(Debug, Default)]
pub(super) struct SyncCount {
    pub(super) runs: std::sync::atomic::AtomicUsize,
    now: std::sync::atomic::AtomicUsize,
    pub(super) most_at_once: std::sync::atomic::AtomicUsize,
}

impl SyncCount {
    /// A sync starts; it is over when the guard drops (a caller dropped
    /// mid-wait included).
    fn start(&self) -> impl Drop + '_ {
        use std::sync::atomic::Ordering::Relaxed;
        struct Running<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Relaxed);
            }
        }
        self.runs.fetch_add(1, Relaxed);
        let now = self.now.fetch_add(1, Relaxed) + 1;
        self.most_at_once.fetch_max(now, Relaxed);
        Running(&self.now)
    }
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
            journal_sync: tokio::sync::Mutex::new(()),
            journal_syncs: SyncCount::default(),
        }
    }

    pub(in crate::memory) fn state(&self) -> StateGuard<'_> {
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
    /// pass, and only when it changed something. One sync at a time (a
    /// group commit): a caller that finds one running waits for it, then
    /// syncs only if something was appended since that one took its handle
    /// — every append made before this call is durable when it returns.
    /// The push's uploads of one pass land together, and each used to start
    /// an `fdatasync` of its own on a blocking thread of its own (a thread
    /// made for each on the 2-core bench: +10 % of the worker's CPU).
    pub(crate) async fn sync_journal(&self) {
        let _turn = self.journal_sync.lock().await;
        let handle = self.state().end_of_pass();
        let Some(file) = handle else {
            return;
        };
        let _counted = self.journal_syncs.start();
        if let Ok(Err(e)) = blocking(move || file.sync_data()).await {
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

    /// The safety cadences' period: the folder scanned whole and the store
    /// listed whole at least this often.
    pub(crate) fn set_safety_cadence(&mut self, every: std::time::Duration) {
        self.full_listing_every = every;
        self.observer().set_full_scan_every(every);
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
        self.mark_disposing();
        crate::killpoint::hit("memory.dispose.removing");
        self.remove_folder().await;
    }

    /// The journal says the folder is going before anything goes: a
    /// removal cut short is finished by the next mount, never recovered
    /// (the files it removed must not read as deletions).
    fn mark_disposing(&self) {
        let mut state = self.state();
        if let Some(journal) = state.journal.as_mut()
            && let Err(e) = journal.mark_disposing()
        {
            warn!(memory_store.id = %self.id, error = %e, "cannot mark the memory store's journal before removing the folder");
        }
    }

    /// The folder removed (if the worker made it), then its journal.
    async fn remove_folder(&self) {
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
