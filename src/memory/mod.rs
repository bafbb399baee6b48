//! Memory stores on disk: mount each store a session attaches, keep it in
//! sync while the agent works, and let go without losing an edit.
//!
//! - `folder` — the confined folder (fd-based, symlink-proof, atomic writes, stat cache);
//! - `watch` — the kernel's account of what changed in a folder (inotify);
//! - `observe` — a sync's view of its folder: the reported paths examined,
//!   the rest as the last pass left it, or a full scan;
//! - `feed` — the remote index: what the server holds, from the version feed;
//! - `plan` — the pure three-way merge of one path;
//! - [`store`] — one store, wired as its data flow: observe (the folder,
//!   the remote index) → plan → execute (uploads, deletes, pulls) → commit;
//!   its download and its disposal;
//! - `flush` — the push-only flush at a session's end, and the push's pass;
//! - `push`, `flights` — the change-driven push (opt-in) and its uploads;
//! - `state` — one store's sync state, committed to its journal as it changes;
//! - `journal` — the durable commit: each store's sync state on disk;
//! - [`SyncReport`] (`report`) — what a sync did: one store's pass, or all summed;
//! - [`recovery`] — folders a dead worker left: recovered, or let go;
//! - [`remote`] — the memory endpoints the sync uses, listed once: the trait,
//!   the HTTP client's mapping, and layers that wrap an api (counts, faults);
//! - [`options`] — the sync interval and the delete mode.
//!
//! The server is the source of truth: conflicts go its way (with a
//! warning), a local deletion reaches it only once corroborated, and a folder
//! that cannot be trusted (its marker gone or foreign while files remain) is
//! never pushed from nor deleted from.

pub(crate) mod feed;
mod flights;
pub(crate) mod flush;
pub(crate) mod folder;
pub(crate) mod journal;
pub(crate) mod observe;
pub mod options;
pub(crate) mod plan;
mod push;
pub mod recovery;
pub mod remote;
mod report;
mod state;
pub mod store;
pub(crate) mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use crate::api::types::{Access, MemoryStoreResource, Session, Timestamp};

use self::flush::FlushStats;
use self::folder::{Folder, is_clean_absolute};
use self::journal::{JournalError, Owner, Snapshot, StateDir};
use self::options::{DeleteMode, FLUSH_TIMEOUT, SyncInterval};
use self::recovery::Adopted;
use self::remote::MemoryApi;
use self::store::{AttachedStore, FirstReads};

pub use self::report::SyncReport;

/// A store could not be materialised, or the stores were misused.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The session's stores cannot be mounted; the work item fails.
    #[error("{0}")]
    Mount(String),
    #[error("finish() was already called: it is the session's last sync and runs once")]
    FinishedTwice,
    /// Another live worker (or session) on this host holds the store's
    /// folder: the item is handed back, not failed.
    #[error("{0}")]
    InUse(String),
}

/// The memory stores attached to one session, materialised on disk.
pub struct SessionMemoryStores {
    api: Arc<dyn MemoryApi>,
    workdir: PathBuf,
    /// `None`: memory sync is off — no download, no sync.
    interval: Option<Duration>,
    deletions: DeleteMode,
    stores: Vec<Arc<AttachedStore>>,
    /// The change-driven push ([`push::run`]), from the download to the
    /// final sync, the flush or dispose (dropped with the stores).
    pushers: std::sync::Mutex<
        Option<(
            tokio::task::JoinSet<()>,
            tokio_util::sync::CancellationToken,
        )>,
    >,
    last_sync: std::sync::Mutex<Instant>,
    finished: AtomicBool,
    remap: Option<crate::remap::MountRemap>,
    /// Where each store's sync state is journaled; `None`: not journaled.
    state_dir: Option<StateDir>,
    /// The most changed paths a store's watch keeps between syncs; `None`:
    /// [`watch::DEFAULT_EVENT_BOUND`].
    watch_bound: Option<usize>,
    /// The safety cadences' period; `None`: 5 minutes
    /// ([`observe::FULL_SCAN_EVERY`], [`feed::FULL_LISTING_EVERY`]).
    safety_cadence: Option<Duration>,
    /// Run the change-driven push (off unless the operator opts in).
    push: bool,
    /// Watch the folders (on unless the benchmark's baseline turns it off).
    watch: bool,
}

impl Drop for SessionMemoryStores {
    /// The push's uploads still in flight end with the stores: after the
    /// teardown (whose flush waited for them as long as its bound allows),
    /// or when a session is dropped without one — and the stores let go of
    /// their journals now, not when an aborted upload's task is dropped, so
    /// that the folders left can be recovered at once (as after a death).
    fn drop(&mut self) {
        for store in &self.stores {
            store.board.ground();
            store.let_go_of_journal();
        }
    }
}

/// What a teardown did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TeardownReport {
    /// What the final sync did, when it ran to its end.
    pub final_sync: Option<SyncReport>,
    pub final_sync_cut_off: bool,
    pub flush_cut_off: bool,
    pub flushed: usize,
}

impl SessionMemoryStores {
    /// Stores for one session. The interval is validated by its type (≥ 5 s,
    /// or off: then nothing is downloaded or synced, as in the reference);
    /// the fallback folder of a store without a `mount_path` is
    /// `<workdir>/memory/<name or id>`.
    pub fn new(
        api: Arc<dyn MemoryApi>,
        workdir: &Path,
        interval: SyncInterval,
        deletions: DeleteMode,
    ) -> Self {
        SessionMemoryStores {
            api,
            workdir: workdir.to_path_buf(),
            interval: interval.interval(),
            deletions,
            stores: Vec::new(),
            pushers: std::sync::Mutex::new(None),
            last_sync: std::sync::Mutex::new(Instant::now()),
            finished: AtomicBool::new(false),
            remap: None,
            state_dir: None,
            watch_bound: None,
            safety_cadence: None,
            push: false,
            watch: true,
        }
    }

    /// Journal each store's sync state under `dir`, and recover folders a
    /// dead worker left at a store's path (see [`recovery`]). A directory
    /// that cannot be used is warned about, and nothing is journaled.
    pub fn with_state_dir(mut self, dir: Option<&Path>) -> Self {
        self.state_dir = dir.and_then(|dir| match StateDir::open(dir) {
            Ok(dir) => Some(dir),
            Err(e) => {
                warn!(error = %e, "memory store journals are off: edits made since the last sync are lost if the worker dies");
                None
            }
        });
        self
    }

    /// Run the change-driven push (the `push` module) or not. Off by default, as
    /// the reference has none: edits leave with the periodic syncs, the
    /// final sync and the flush only (one sync pass per interval).
    pub fn with_push(mut self, on: bool) -> Self {
        self.push = on;
        self
    }

    /// No change-driven push (the default; kept for callers that spell it out).
    #[doc(hidden)]
    pub fn without_push(self) -> Self {
        self.with_push(false)
    }

    /// No folder watch: every sync scans every folder whole, as before the
    /// watch (the benchmark's baseline).
    #[doc(hidden)]
    pub fn without_watch(mut self) -> Self {
        self.watch = false;
        self
    }

    /// How often the stores' push tasks have woken up so far (an idle
    /// store's task sleeps on the kernel's queue: about once a second).
    #[doc(hidden)]
    pub fn push_wakeups(&self) -> usize {
        self.stores
            .iter()
            .map(|s| s.push_wakeups.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }

    /// The stores' journal `fdatasync`s so far: how many, and the most
    /// that ran at once.
    #[doc(hidden)]
    pub fn journal_syncs(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.stores.iter().fold((0, 0), |(runs, most), s| {
            (
                runs + s.journal_syncs.runs.load(Relaxed),
                most.max(s.journal_syncs.most_at_once.load(Relaxed)),
            )
        })
    }

    /// Every store's watch loses the events queued now, as when the
    /// kernel's queue overflows: the next pass must scan whole (the model
    /// test interleaves it; a real overflow is tested over HTTP).
    #[doc(hidden)]
    pub fn lose_watch_events(&self) {
        for store in &self.stores {
            store.lose_watch_events();
        }
    }

    /// Keep at most `bound` changed paths per store between syncs before a
    /// full scan is due instead (tests lower it to force the fallback).
    #[doc(hidden)]
    pub fn with_watch_bound(mut self, bound: usize) -> Self {
        self.watch_bound = Some(bound);
        self
    }

    /// Scan each folder whole and list each store whole at least this
    /// often (the safety cadences, 5 minutes by default); tests and the
    /// benchmark shorten it.
    #[doc(hidden)]
    pub fn with_safety_cadence(mut self, every: Duration) -> Self {
        self.safety_cadence = Some(every);
        self
    }

    /// Apply this set's watch and safety-cadence settings to a store just
    /// attached.
    fn configure(&self, store: &mut AttachedStore) {
        if let Some(bound) = self.watch_bound {
            store.set_watch_bound(bound);
        }
        if let Some(every) = self.safety_cadence {
            store.set_safety_cadence(every);
        }
        if !self.watch {
            store.disable_watch();
        }
    }

    pub(crate) fn with_remap(mut self, remap: Option<crate::remap::MountRemap>) -> Self {
        self.remap = remap;
        self
    }

    /// Every attached store's folder (canonical), for the file tools' allowed roots.
    pub fn roots(&self) -> Vec<PathBuf> {
        self.stores.iter().map(|s| s.folder.root()).collect()
    }

    /// The folders of stores attached read-only, where write and edit refuse.
    pub(crate) fn read_only_roots(&self) -> Vec<PathBuf> {
        self.stores
            .iter()
            .filter(|s| s.read_only)
            .map(|s| s.folder.root())
            .collect()
    }

    /// The attached stores (for diagnostics and tests).
    pub fn stores(&self) -> &[Arc<AttachedStore>] {
        &self.stores
    }

    /// Where a store's files land: its `mount_path` verbatim when it is a
    /// clean absolute path (anything else is refused, never relocated), or
    /// the workdir fallback when it has none.
    fn store_root(
        &self,
        store_id: &str,
        name: Option<&str>,
        mount_path: Option<&str>,
    ) -> Result<PathBuf, MemoryError> {
        match mount_path.filter(|p| !p.is_empty()) {
            Some(p) if is_clean_absolute(p) => Ok(match &self.remap {
                Some(remap) => remap.to_actual_path(Path::new(p)),
                None => PathBuf::from(p),
            }),
            Some(p) => Err(MemoryError::Mount(format!(
                "memory store mount_path is not a clean absolute path: {p:?} (memory_store_id={store_id})"
            ))),
            None => Ok(self
                .workdir
                .join("memory")
                .join(name.filter(|n| !n.is_empty()).unwrap_or(store_id))),
        }
    }

    /// Download every attached store, in resource order. The first store
    /// that cannot be materialised fails the whole download: its own folder
    /// is removed (a folder that was already there is left untouched), and
    /// the stores that did land are kept for `dispose`.
    pub async fn download(&mut self, session: &Session) -> Result<(), MemoryError> {
        if self.interval.is_none() {
            return Ok(());
        }
        for resource in session.memory_stores() {
            let mut store = self.download_one(session, resource).await?;
            self.configure(&mut store);
            self.stores.push(Arc::new(store));
        }
        *self.last_sync.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.start_pushes();
        Ok(())
    }

    /// One store: a dead worker's folder at its path recovered, or a new
    /// folder made and filled.
    async fn download_one(
        &self,
        session: &Session,
        resource: &MemoryStoreResource,
    ) -> Result<AttachedStore, MemoryError> {
        let id = resource.memory_store_id.clone();
        let root = self.store_root(
            &id,
            resource.name.as_deref(),
            resource.mount_path.as_deref(),
        )?;
        let read_only = resource.access() == Access::ReadOnly;
        let open = || {
            Folder::open(&root, true).map_err(|e| {
                MemoryError::Mount(format!(
                    "failed to download memory store memory_store_id={id}: {e}"
                ))
            })
        };
        let mut folder = open()?;
        if !folder.removed_on_dispose() {
            // A dead worker's folder is recovered; anything else refuses.
            // Its journal is claimed on the blocking pool: that reads it,
            // and waits for a held lock (`LOCK_WAIT`, the state directory's).
            let claimed = {
                let (state_dir, root, id) = (self.state_dir.clone(), root.clone(), id.clone());
                let span = tracing::Span::current();
                tokio::task::spawn_blocking(move || {
                    let _entered = span.enter();
                    recovery::claim_left(state_dir.as_ref(), &root, &id)
                })
                .await
                .map_err(|e| MemoryError::Mount(format!("the recovery's set-up failed: {e}")))??
            };
            let adopted = recovery::adopt(claimed, &root, &id, &session.id, read_only)?;
            match adopted {
                Adopted::Store(store) => {
                    let pass = store.sync(self.api.as_ref(), self.deletions, false).await;
                    info!(
                        memory_store.id = %id,
                        root = %store.folder.root().display(),
                        uploads = pass.uploads,
                        pulls = pass.pulls,
                        conflicts = pass.conflicts,
                        "recovered memory store folder"
                    );
                    return Ok(*store);
                }
                Adopted::Cleared => {
                    folder = open()?;
                    if !folder.removed_on_dispose() {
                        return Err(recovery::occupied(&root, &id));
                    }
                }
            }
        }
        // The journal and the folder wait on disks (a journal's snapshot is
        // two `fsync`s), so they are made on the blocking pool while the
        // download's first reads go out: those only read, in their usual
        // order, and nothing is written to the folder before both are done.
        // A folder that cannot be made drops the reads.
        let prepare = {
            let (state_dir, id, root) = (self.state_dir.clone(), id.clone(), root.clone());
            let session_id = session.id.clone();
            let span = tracing::Span::current();
            async move {
                tokio::task::spawn_blocking(move || {
                    let _entered = span.enter();
                    prepare_new(state_dir.as_ref(), &id, &root, &session_id, folder)
                })
                .await
                .map_err(|e| MemoryError::Mount(format!("the mount's set-up failed: {e}")))?
            }
        };
        let reads = async { Ok(FirstReads::read(self.api.as_ref(), &id).await) };
        let ((folder, journal), first) = tokio::try_join!(prepare, reads)?;
        // The session was read before the mount: its stamps are readings
        // of the server's clock taken before it (see `feed`).
        let server_clock = session.created_at.max(session.updated_at);
        self.mount_new(id, read_only, folder, journal, server_clock, first)
            .await
    }

    /// Fill a new store's folder (made by [`prepare_new`]) from the server;
    /// on failure the folder and its journal go. `server_clock`: a stamp
    /// the server put on a record read before this mount
    /// (`AttachedStore::mount`); `first`: the download's first reads.
    async fn mount_new(
        &self,
        id: String,
        read_only: bool,
        folder: Folder,
        journal: Option<journal::Journal>,
        server_clock: Timestamp,
        first: FirstReads,
    ) -> Result<AttachedStore, MemoryError> {
        let store = AttachedStore::new(id.clone(), read_only, folder, journal);
        match store
            .mount(
                self.api.as_ref(),
                Some(server_clock.timestamp_micros()),
                Some(first),
            )
            .await
        {
            Ok(count) => {
                info!(
                    memory_store.id = %id,
                    root = %store.folder.root().display(),
                    count,
                    "downloaded memories"
                );
                Ok(store)
            }
            Err(e) => {
                store.dispose().await;
                Err(MemoryError::Mount(format!(
                    "failed to download memory store memory_store_id={id}: {e}"
                )))
            }
        }
    }
    /// The client the push sends with: each request once, so it sees every
    /// `429` itself and backs off as a whole (`MemoryApi::single_attempt`).
    fn push_api(&self) -> Arc<dyn MemoryApi> {
        self.api
            .single_attempt()
            .unwrap_or_else(|| self.api.clone())
    }

    /// Start the change-driven push of every writable store, when it is on.
    fn start_pushes(&self) {
        if !self.push {
            return;
        }
        let mut set = tokio::task::JoinSet::new();
        let stop = tokio_util::sync::CancellationToken::new();
        let api = self.push_api();
        for store in self.stores.iter().filter(|s| !s.read_only) {
            set.spawn(push::run(Arc::downgrade(store), api.clone(), stop.clone()));
        }
        *self.pushers.lock().unwrap_or_else(|e| e.into_inner()) = Some((set, stop));
    }

    /// Stop the change-driven push at once: no upload of it starts from
    /// here on, and a pass still planning is dropped (it holds the store's
    /// lock only while it plans). Its uploads already in flight go on to
    /// their own request's end without holding anything (`flights`): the
    /// final sync leaves their paths to them, and the flush waits for one
    /// only while it carries the file's current content, within its bound.
    async fn stop_pushes(&self) {
        let pushers = self
            .pushers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((mut set, stop)) = pushers {
            stop.cancel();
            set.abort_all();
            while set.join_next().await.is_some() {}
        }
    }

    async fn sync_all(&self, final_sync: bool) -> SyncReport {
        let api = self.api.as_ref();
        let passes = futures::future::join_all(
            self.stores
                .iter()
                .map(|s| s.sync(api, self.deletions, final_sync)),
        )
        .await;
        *self.last_sync.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        let mut report = SyncReport::default();
        for pass in passes {
            report.add(&pass);
        }
        report
    }

    /// Sync every store (in parallel) when the interval has passed since the
    /// last sync; `None` when it was not due. Never fails.
    pub async fn sync_if_due(&self) -> Option<SyncReport> {
        let interval = self.interval?;
        let last = *self.last_sync.lock().unwrap_or_else(|e| e.into_inner());
        if last.elapsed() < interval {
            return None;
        }
        Some(self.sync_all(false).await)
    }

    /// [`sync_if_due`](Self::sync_if_due) cut off after `bound`, so a slow
    /// memory API cannot hold the agent's next call for long. A sync cut
    /// off counts as done for the cadence (the next one waits an interval);
    /// what it completed is already in the baseline (each operation is
    /// recorded as it completes), and what it had not finished is picked up
    /// by the next listing. An update cut off in flight may still commit
    /// after that listing: its 409 on the newer edit is then known for our
    /// own write (`State::in_flight`), and the newer edit goes out over it —
    /// unless a pass has seen the file and the server agree since (the
    /// send was superseded, and is forgotten).
    pub(crate) async fn sync_if_due_within(&self, bound: Duration) -> Option<SyncReport> {
        match tokio::time::timeout(bound, self.sync_if_due()).await {
            Ok(report) => report,
            Err(_) => {
                *self.last_sync.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                warn!(
                    bound_s = bound.as_secs_f64(),
                    "memory sync cut off after {}s; the next sync picks up where it stopped",
                    bound.as_secs_f64()
                );
                None
            }
        }
    }

    /// Run the change-driven push's pass on every store now, whatever its
    /// debounce, and wait for its uploads: how many landed (the model test
    /// interleaves it with every other step). It runs whether the push is
    /// on or not, with the push's own client.
    #[doc(hidden)]
    pub async fn push_now(&self) -> usize {
        let api = self.push_api();
        let never = tokio_util::sync::CancellationToken::new();
        let passes =
            futures::future::join_all(self.stores.iter().map(|s| s.push_changed(&api, &never)))
                .await;
        let flights = futures::future::join_all(passes.into_iter().flatten()).await;
        flights
            .into_iter()
            .filter(|landed| matches!(landed, Ok(true)))
            .count()
    }

    /// Run the push's pass on every store now, as [`Self::push_now`] does,
    /// but leave its uploads flying: their tasks, each yielding whether it
    /// landed (the model test lets them fly across its other steps).
    #[doc(hidden)]
    pub async fn push_detached(&self) -> Vec<tokio::task::JoinHandle<bool>> {
        let api = self.push_api();
        let never = tokio_util::sync::CancellationToken::new();
        let passes =
            futures::future::join_all(self.stores.iter().map(|s| s.push_changed(&api, &never)))
                .await;
        passes.into_iter().flatten().collect()
    }

    /// Sync every store now, whatever the cadence (a regular sync, not the final one).
    pub async fn sync_now(&self) -> SyncReport {
        self.sync_all(false).await
    }

    /// The session's last sync: like any sync, but a corroborated local
    /// deletion does not wait out its window (the cap and the re-checks
    /// still apply). Runs once.
    pub async fn finish(&self) -> Result<SyncReport, MemoryError> {
        if self.finished.swap(true, Ordering::SeqCst) {
            return Err(MemoryError::FinishedTwice);
        }
        self.stop_pushes().await;
        Ok(self.sync_all(true).await)
    }

    /// Push new and changed files of every writable store; send no deletes,
    /// pull nothing. Never fails. It waits for no lock: each store knows
    /// what is dirty first and sends it at once, whatever upload of the push
    /// is still in flight (`flush`). Bound it with a timeout: a store cut
    /// off part-way logs how many of its changed files had not been
    /// uploaded, and which.
    pub async fn flush_writes(&self) -> usize {
        self.stop_pushes().await;
        let api = self.api.as_ref();
        let stats: Vec<FlushStats> =
            futures::future::join_all(self.stores.iter().map(|s| s.flush(api))).await;
        stats.iter().map(|s| s.uploaded).sum()
    }

    /// Remove every folder this worker created that passes the marker check.
    pub async fn dispose(&self) {
        self.stop_pushes().await;
        for store in &self.stores {
            store.dispose().await;
        }
    }

    /// The teardown of a session: the final sync on a clean end (bounded),
    /// then the push-only flush (bounded separately, always), then dispose.
    pub async fn teardown(&self, clean_end: bool, bound: Duration) -> TeardownReport {
        let mut report = TeardownReport::default();
        if clean_end {
            match tokio::time::timeout(bound, self.finish()).await {
                Ok(Ok(sync)) => report.final_sync = Some(sync),
                Ok(Err(e)) => warn!(error = %e, "final memory sync skipped"),
                Err(_) => {
                    report.final_sync_cut_off = true;
                    warn!(
                        "final memory sync cut off after {}s; the flush that follows still uploads changed files",
                        bound.as_secs_f64()
                    );
                }
            }
        }
        match tokio::time::timeout(bound, self.flush_writes()).await {
            Ok(n) => report.flushed = n,
            Err(_) => {
                report.flush_cut_off = true;
                warn!(
                    "memory flush cut off after {}s; changed files it had not uploaded yet are not saved",
                    bound.as_secs_f64()
                );
            }
        }
        self.dispose().await;
        report
    }

    /// [`teardown`](Self::teardown) with the reference's 30 s bounds.
    pub async fn teardown_default(&self, clean_end: bool) -> TeardownReport {
        self.teardown(clean_end, FLUSH_TIMEOUT).await
    }
}

/// A new store's journal, then its folder, then the folder's identity in
/// the journal — in that order, so a worker killed in between leaves a
/// journal that says its folder is being made, never a folder without its
/// journal. Blocking (each journal snapshot `fsync`s a file and its
/// directory). The journal is `None` when journaling is off or the journal
/// cannot be written (said once); a folder that cannot be made is an error,
/// its journal removed.
fn prepare_new(
    state_dir: Option<&StateDir>,
    id: &str,
    root: &Path,
    session_id: &str,
    folder: Folder,
) -> Result<(Folder, Option<journal::Journal>), MemoryError> {
    let cannot_journal = |e: &dyn std::fmt::Display| {
        warn!(memory_store.id = %id, error = %e, "cannot journal this memory store: edits made since the last sync are lost if the worker dies");
    };
    let mut journal = match state_dir {
        None => None,
        Some(dir) => {
            let owner = Owner {
                store: id.to_string(),
                root: root.to_path_buf(),
                session: session_id.to_string(),
                dev: 0,
                ino: 0,
                boot: journal::boot_id(),
            };
            match dir.create(owner, &Snapshot::default()) {
                Ok(journal) => Some(journal),
                Err(JournalError::Busy(_)) => return Err(recovery::in_use(root, id)),
                Err(e) => {
                    cannot_journal(&e);
                    None
                }
            }
        }
    };
    if let Err(e) = folder.create_root() {
        let _ = folder.dispose();
        if let Some(journal) = journal {
            journal.remove();
        }
        return Err(MemoryError::Mount(format!(
            "cannot create the memory store's folder: {} (memory_store_id={id}): {e}; the worker host must make this mount path writable",
            root.display()
        )));
    }
    if let (Some(j), Some((dev, ino))) = (journal.as_mut(), folder.identity())
        && let Err(e) = j.set_identity(dev, ino)
    {
        cannot_journal(&e);
        if let Some(journal) = journal.take() {
            journal.remove();
        }
    }
    Ok((folder, journal))
}
