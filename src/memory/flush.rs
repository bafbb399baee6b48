//! The push-only flush of one store: the last thing a session does with
//! its memory before the folder goes. New and changed files are uploaded,
//! nothing is deleted or pulled; which files and how is the planner's
//! ([`flush_dirty`], [`plan_flush`]), and a flush cut off part-way logs
//! how many of its changed files, and which, it had not uploaded.
//!
//! The flush waits for no lock: it knows what is dirty before anything
//! else (its own scan), sends every file at once (32 at a time), and an
//! upload of the push still in flight delays only its own path (see
//! `super::flights`). The change-driven push's pass lives here too: the
//! flush's rules, over what the folder's watch reported, against what the
//! version feed says the server holds.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};

use futures::{StreamExt, stream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, warn};

use crate::api::types::MemoryIndexEntry;

use super::flights::Start;
use super::plan::{
    DirtyFacts, FlushDecision, FlushFacts, FlushRemote, FolderOp, FolderVerdict, Listed,
    flush_dirty, plan_flush, plan_folder,
};
use super::push::{MAX_UPLOADS, PLAN_BUDGET};
use super::remote::MemoryApi;
use super::store::{
    AttachedStore, Followed, LocalFiles, MARKER_PATH, Marked, Outcome, PassError, RemoteMap,
    UPLOAD_CONCURRENCY,
};

/// Files the cut-off line names at most (the count says how many more).
const NAMED_AT_MOST: usize = 20;

/// What the push knows of the server for one pass.
enum PushIndex {
    /// The version feed's index, advanced just now.
    Known(RemoteMap),
    /// No index (no feed, or a full listing due): each update is guarded by
    /// the hash the file was last synced at, as without the feed.
    Unknown,
    /// The feed failed in a way worth waiting out (a `429`, a 5xx, no
    /// answer): no upload this pass; the wait the answer asked for.
    Failed(Option<std::time::Duration>),
}

impl AttachedStore {
    /// Push-only: upload new and changed files, `UPLOAD_CONCURRENCY` at a
    /// time; no deletes, no pulls. If the caller drops this future part-way,
    /// the store logs how many changed files had not finished uploading, and
    /// which.
    pub(crate) async fn flush(&self, api: &dyn MemoryApi) -> FlushStats {
        if self.read_only {
            return FlushStats::default();
        }
        let span = tracing::info_span!(
            "memory.flush",
            memory_store.id = %self.id,
            uploaded = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        let started = std::time::Instant::now();
        let stats = self.flush_writable(api).instrument(span.clone()).await;
        span.record("uploaded", stats.uploaded as u64);
        span.record("duration_ms", started.elapsed().as_millis() as u64);
        stats
    }

    async fn flush_writable(&self, api: &dyn MemoryApi) -> FlushStats {
        let mut stats = FlushStats::default();
        // No lock to wait for: from here no push upload starts, and those
        // that had not started are the flush's to send.
        let _busy = self.board.busy();
        self.board.take_over_unstarted();
        crate::killpoint::hit("memory.flush.start");
        let progress = Arc::new(Mutex::new(HashSet::<String>::new()));
        let mut guard = CutOffGuard {
            store_id: &self.id,
            unsent: progress.clone(),
            dirty: 0,
            done: false,
        };
        if let Err(e) = self.try_flush(api, &progress, &mut guard, &mut stats).await {
            warn!(memory_store.id = %self.id, error = %e, "memory flush failed");
        }
        self.sync_journal().await;
        guard.done = true;
        stats
    }

    async fn try_flush(
        &self,
        api: &dyn MemoryApi,
        unsent: &Arc<Mutex<HashSet<String>>>,
        guard: &mut CutOffGuard<'_>,
        stats: &mut FlushStats,
    ) -> Result<(), PassError> {
        // The flush scans whole, as it always did.
        let scan = self.scan(true).await?;
        match plan_folder(scan.folder_facts(FolderOp::Flush)) {
            FolderVerdict::Proceed => {}
            FolderVerdict::LeaveAlone(reason) => {
                warn!(
                    memory_store.id = %self.id,
                    root = %self.folder.root().display(),
                    "{reason}; not uploading anything from the memory store folder"
                );
                return Ok(());
            }
            // Never for a flush: it neither skips nor re-downloads.
            FolderVerdict::Skip | FolderVerdict::Recover(_) => return Ok(()),
        }
        let dirty = self.dirty(scan.files.iter());
        if dirty.is_empty() {
            return Ok(());
        }
        stats.dirty = dirty.len();
        guard.dirty = dirty.len();
        unsent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(dirty.keys().cloned());
        // Without a listing (the store cannot be listed: the very fault
        // that may have failed the final sync), each edit still goes out,
        // guarded by the hash it was last synced at: the server refuses it
        // (409) only if another writer changed the memory since.
        let remote = match self.index(api, true).await {
            Ok(remote) => {
                self.settle_sent(&remote, &scan.files);
                Some(remote)
            }
            Err(e) => {
                warn!(
                    memory_store.id = %self.id,
                    error = %e,
                    "the flush cannot list the memory store; pushing each changed file guarded by its last synced version"
                );
                None
            }
        };
        let done = |rel: &str| {
            unsent.lock().unwrap_or_else(|e| e.into_inner()).remove(rel);
        };
        let mut sends = Vec::new();
        for (rel, local) in &dirty {
            match self.plan_flush_path(rel, local, remote.as_deref()) {
                FlushDecision::Done => done(rel),
                FlushDecision::Adopt => {
                    self.state().baseline.insert(rel.clone(), local.clone());
                    done(rel);
                }
                FlushDecision::Conflict => {
                    warn!(
                        memory_store.id = %self.id,
                        memory.path = %rel,
                        "memory changed both locally and remotely; the flush leaves the remote version"
                    );
                    stats.conflicts += 1;
                    done(rel);
                }
                FlushDecision::Upload { update } => {
                    sends.push((rel.clone(), local.clone(), update))
                }
            }
        }
        stats.uploaded = self.flush_sends(api, sends, &done).await;
        Ok(())
    }

    /// The flush's uploads, each path marked `done` as it ends: how many
    /// landed. A file an upload of the push already carries as it is now
    /// waits for that upload (sending it again would only race it); every
    /// other file goes out at once, a newer edit of a file the push is
    /// still sending included.
    async fn flush_sends(
        &self,
        api: &dyn MemoryApi,
        sends: Vec<FlushSend>,
        done: &(dyn Fn(&str) + Sync),
    ) -> usize {
        let (waits, sends): (Vec<_>, Vec<_>) = sends
            .into_iter()
            .partition(|(rel, local, _)| self.board.flight_carrying(rel, local).is_some());
        let flushed = |landed: bool| std::future::ready(landed);
        let sent = stream::iter(sends)
            .map(|(rel, local, update)| async move {
                let landed = self.upload(api, &rel, Some(&local), update).await;
                done(&rel);
                matches!(landed, Outcome::Landed(_))
            })
            .buffer_unordered(UPLOAD_CONCURRENCY)
            .filter(|landed| flushed(*landed))
            .count();
        let waited =
            futures::future::join_all(waits.into_iter().map(|(rel, local, update)| async move {
                if let Some(mut flight) = self.board.flight_carrying(&rel, &local) {
                    let _ = flight.wait_for(|ended| *ended).await;
                }
                // Landed, it is in the baseline; else the flush sends it now.
                let landed = self.state().baseline.get(&rel) == Some(&local)
                    || matches!(
                        self.upload(api, &rel, Some(&local), update).await,
                        Outcome::Landed(_)
                    );
                done(&rel);
                landed
            }));
        let (sent, waited) = futures::future::join(sent, waited).await;
        sent + waited.into_iter().filter(|landed| *landed).count()
    }

    /// The change-driven push's pass: upload what the kernel reported
    /// written since the last pass — never a delete, never a pull. It asks
    /// the version feed what the server holds first (one request), so it
    /// never uploads content the server already holds (adopted, as a sync
    /// adopts it) nor over another writer's change (left to the next sync,
    /// which pulls it with its warning); without the feed each update is
    /// guarded by the hash it was last synced at, so the server refuses it
    /// if another writer changed the memory since. Holds the pass lock while
    /// it plans, so it never interleaves with a sync's planning; the uploads
    /// themselves fly on their own (`super::flights`), at most
    /// [`MAX_UPLOADS`] a pass; the paths it did not get to stay reported.
    /// Gives way to a sync or a flush under way, and to its back-off. The
    /// uploads' tasks, each yielding whether it landed.
    pub(crate) async fn push_changed(
        self: &Arc<Self>,
        api: &Arc<dyn MemoryApi>,
        stop: &CancellationToken,
    ) -> Vec<tokio::task::JoinHandle<bool>> {
        if self.read_only
            || self.board.sync_busy()
            || self.board.backing_off()
            || stop.is_cancelled()
        {
            return Vec::new();
        }
        let _pass = self.pass.lock().await;
        if self.board.sync_busy() || stop.is_cancelled() {
            return Vec::new();
        }
        let started = Instant::now();
        let Some((scan, changed, mut dirty)) = self.push_dirty().await else {
            return Vec::new();
        };
        let remote = match self.push_index(api.as_ref()).await {
            PushIndex::Known(remote) => {
                self.settle_sent(&remote, &scan.files);
                self.forget_gone(&scan.files, &changed, &remote);
                Some(remote)
            }
            PushIndex::Unknown => {
                // An upload whose answer never came is settled by the next
                // sync's listing; a push over it would replace its record,
                // and the server holding our own lost upload would then
                // read as another writer's change, which wins (the model
                // test found this).
                let state = self.state();
                dirty.retain(|rel, _| !state.sent.contains_key(rel));
                None
            }
            PushIndex::Failed(asked) => {
                self.board.back_off(asked);
                self.observer().report_again(dirty.into_keys().collect());
                return Vec::new();
            }
        };
        let flights = self.launch_flights(api, dirty, remote.as_deref(), started, stop);
        drop(_pass);
        self.sync_journal().await;
        flights
    }

    /// What the push looks at: the files the kernel reported changed since
    /// the last pass that differ from what was last agreed, none an upload
    /// of ours still carries, with the scan they were seen in. `None`:
    /// nothing to push, or the folder is not to be pushed from.
    #[allow(clippy::type_complexity)]
    async fn push_dirty(&self) -> Option<(Marked, BTreeSet<String>, BTreeMap<String, String>)> {
        let (scan, changed) = match self.scan_changed().await {
            Ok(Some(seen)) => seen,
            // The next sync scans whole and pushes what changed.
            Ok(None) => return None,
            Err(e) => {
                debug!(memory_store.id = %self.id, error = %e, "cannot examine the memory store folder for a push");
                return None;
            }
        };
        if plan_folder(scan.folder_facts(FolderOp::Flush)) != FolderVerdict::Proceed {
            return None;
        }
        // A file the push saw is not missing: it breaks a pending delete's
        // streak as a sync's scan does, so an absence is corroborated only
        // by scans that all saw it (a file re-created, pushed and removed
        // again starts a fresh 30 s window).
        self.state()
            .pending
            .retain(|rel, _| !scan.files.contains_key(rel));
        let found = reported(scan.files.with_marker(), &changed);
        // A path an upload of ours still carries is looked at again when
        // that upload ends.
        let mut dirty = self.dirty(found.iter());
        dirty.retain(|rel, _| !self.board.has_flight(rel));
        if dirty.is_empty() {
            return None;
        }
        Some((scan, changed, dirty))
    }

    /// Paths the kernel reported that are gone from the folder and from the
    /// server alike: their baseline entries go, as a sync's plan forgets
    /// them, so that a file the agent puts back there later (a rename away
    /// and back) is new, to be uploaded — not the stale copy of a memory
    /// the server deleted, to be removed (the model's case in
    /// tests/it/memory_model.rs).
    fn forget_gone(
        &self,
        files: &LocalFiles,
        changed: &BTreeSet<String>,
        remote: &BTreeMap<String, MemoryIndexEntry>,
    ) {
        let flying = self.board.flying();
        let mut state = self.state();
        let gone: Vec<String> = reported(state.baseline.as_map(), changed)
            .into_keys()
            .filter(|rel| {
                !remote.contains_key(rel) && files.agrees(rel, None) && !flying.contains(rel)
            })
            .collect();
        for rel in gone {
            state.baseline.remove(&rel);
            state.pending.remove(&rel);
        }
    }

    /// The push's plan for each dirty file, carried out: adopted, left to
    /// the sync, or an upload flying on its own, at most [`MAX_UPLOADS`];
    /// the paths past that stay reported for the next pass.
    fn launch_flights(
        self: &Arc<Self>,
        api: &Arc<dyn MemoryApi>,
        dirty: BTreeMap<String, String>,
        remote: Option<&BTreeMap<String, MemoryIndexEntry>>,
        started: Instant,
        stop: &CancellationToken,
    ) -> Vec<tokio::task::JoinHandle<bool>> {
        let mut left = Vec::new();
        let mut flights = Vec::new();
        for (rel, local) in dirty {
            if flights.len() >= MAX_UPLOADS {
                left.push(rel);
                continue;
            }
            match self.plan_flush_path(&rel, &local, remote) {
                FlushDecision::Done => {}
                // The server already holds these bytes: no request.
                FlushDecision::Adopt => {
                    self.state().baseline.insert(rel, local);
                }
                FlushDecision::Conflict => {
                    debug!(memory_store.id = %self.id, memory.path = %rel, "changed on both sides; the next sync keeps the remote version");
                }
                FlushDecision::Upload { update } => flights.push(self.spawn_flight(
                    Arc::clone(api),
                    rel,
                    local,
                    update,
                    started,
                    stop.clone(),
                )),
            }
        }
        if !left.is_empty() {
            debug!(memory_store.id = %self.id, left = left.len(), "the push pass ends before its last uploads; the next pass or sync takes them");
            self.observer().report_again(left);
        }
        flights
    }

    /// What the server holds, from the version feed, for a push pass: one
    /// request, bounded by [`PLAN_BUDGET`].
    async fn push_index(&self, api: &dyn MemoryApi) -> PushIndex {
        match tokio::time::timeout(PLAN_BUDGET, self.follow(api)).await {
            Ok(Followed::Advanced(remote, moved)) => {
                if moved {
                    self.remember_ids(&remote);
                }
                PushIndex::Known(remote)
            }
            Ok(Followed::NoIndex) => PushIndex::Unknown,
            Ok(Followed::Failed(e)) if e.is_transient() => {
                PushIndex::Failed(e.api().and_then(|a| a.retry_after()))
            }
            // The server has no version history for us (400, 404): the push
            // goes on without it, as it did before the feed.
            Ok(Followed::Failed(_)) => PushIndex::Unknown,
            Err(_) => PushIndex::Failed(None),
        }
    }

    /// The scanned files the flush looks at ([`flush_dirty`]), judged
    /// against the state before the listing.
    fn dirty<'a>(
        &self,
        files: impl Iterator<Item = (&'a String, &'a String)>,
    ) -> BTreeMap<String, String> {
        let state = self.state();
        files
            .filter(|&(rel, sha)| {
                flush_dirty(DirtyFacts {
                    local: sha,
                    baseline: state.baseline.get(rel).map(String::as_str),
                    sent: state.sent.contains_key(rel),
                    refused: state.refused.get(rel).map(String::as_str),
                })
            })
            .map(|(rel, sha)| (rel.clone(), sha.clone()))
            .collect()
    }

    /// The flush's plan for one dirty file ([`plan_flush`]), from the state
    /// as the listing (`None`: the store could not be listed) left it.
    fn plan_flush_path(
        &self,
        rel: &str,
        local: &str,
        remote: Option<&BTreeMap<String, MemoryIndexEntry>>,
    ) -> FlushDecision {
        let state = self.state();
        plan_flush(FlushFacts {
            local,
            baseline: state.baseline.get(rel).map(String::as_str),
            tentative: state.tentative.get(rel).map(String::as_str),
            remote: match remote {
                Some(remote) => FlushRemote::Listed(remote.get(rel).map(|m| Listed {
                    id: &m.id,
                    sha: &m.content_sha256,
                })),
                None => FlushRemote::Unlisted {
                    known_id: state.ids.get(rel).map(String::as_str),
                },
            },
        })
    }
}

/// The scanned files at or below a reported path (a reported directory
/// stands for everything under it): a lookup and a range of the sorted map
/// per reported path, so a push costs O(changed · log files + found), never
/// files × changed (the agent floods; the folder holds thousands).
fn reported(
    files: &BTreeMap<String, String>,
    changed: &BTreeSet<String>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for c in changed {
        if let Some((rel, sha)) = files.get_key_value(c) {
            out.insert(rel.clone(), sha.clone());
        }
        let below = format!("{c}/");
        for (rel, sha) in files
            .range::<str, _>((
                std::ops::Bound::Included(below.as_str()),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(rel, _)| rel.starts_with(&below))
        {
            out.insert(rel.clone(), sha.clone());
        }
    }
    // The marker is never a memory, whatever touched it. Nor is a file
    // tool's write in progress: the push runs while tools run, and the
    // temporary file of an atomic write (`O_EXCL`, fsync, rename) can sit
    // there long enough for a pass to see it (a slow fsync); the sync runs
    // between tool calls, and after a crash recovery removes such debris.
    out.remove(MARKER_PATH);
    out.retain(|rel, _| !crate::tools::files::is_write_tmp(rel.rsplit('/').next().unwrap_or(rel)));
    out
}

/// What a flush did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlushStats {
    pub(crate) dirty: usize,
    pub(crate) uploaded: usize,
    pub(crate) conflicts: usize,
}

/// One upload of the flush: the path, the file's hash, and the memory id
/// with the hash it is guarded by (`None`: a create).
type FlushSend = (String, String, Option<(String, String)>);

/// Logs, when a flush is dropped before it finished (cut off at its
/// bound), how many of its changed files had not finished uploading — the
/// reference's line — and which (at most [`NAMED_AT_MOST`] by name).
struct CutOffGuard<'a> {
    store_id: &'a str,
    unsent: Arc<Mutex<HashSet<String>>>,
    dirty: usize,
    done: bool,
}

impl Drop for CutOffGuard<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut left: Vec<String> = self
            .unsent
            .lock()
            .map(|u| u.iter().cloned().collect())
            .unwrap_or_default();
        if left.is_empty() {
            return;
        }
        left.sort();
        warn!(
            memory_store.id = %self.store_id,
            memory.paths = %named(&left),
            "memory flush cut off part-way; {} of {} changed files had not finished uploading",
            left.len(),
            self.dirty
        );
    }
}

/// `a.md, b.md, … and 3 more`: the first [`NAMED_AT_MOST`] paths.
fn named(paths: &[String]) -> String {
    let mut text = paths
        .iter()
        .take(NAMED_AT_MOST)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if paths.len() > NAMED_AT_MOST {
        text.push_str(&format!(" and {} more", paths.len() - NAMED_AT_MOST));
    }
    text
}

impl AttachedStore {
    /// Upload `local` (the file's hash) of `rel` in a task of its own (a
    /// flight, `super::flights`), as `update` (or a create) says; on the
    /// store's board before this returns, so a pass that plans after it
    /// knows of it. It starts when one of the store's upload slots is free,
    /// unless the board holds it back by then. Its task yields whether it
    /// landed.
    fn spawn_flight(
        self: &Arc<Self>,
        api: Arc<dyn MemoryApi>,
        rel: String,
        local: String,
        update: Option<(String, String)>,
        pass_started: Instant,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<bool> {
        let (id, done) = self.board.register(&rel, &local);
        let store = Arc::clone(self);
        let task = tokio::spawn(async move {
            let slot = store.upload_slots.clone().acquire_owned().await;
            match store.board.start(&rel, id, pass_started, &stop) {
                Start::Go => {}
                Start::TakenOver => return false,
                Start::HeldBack => {
                    store.observer().report_again(vec![rel]);
                    return false;
                }
            }
            let outcome = store.upload(api.as_ref(), &rel, Some(&local), update).await;
            drop(slot);
            let landed = match outcome {
                Outcome::Landed(_) => {
                    store.board.landed();
                    store
                        .pushed
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    true
                }
                Outcome::Failed(asked) => {
                    store.board.back_off(asked);
                    false
                }
                Outcome::Settled | Outcome::Superseded => false,
            };
            store.board.end(&rel, id);
            // The path was left out of the syncs while it flew.
            store.forget_quiet();
            // Whatever became of it, the path is looked at again: the file
            // may have changed while it flew, or it may need another try.
            store.observer().report_again(vec![rel]);
            store.sync_journal().await;
            let _ = done.send(true);
            landed
        });
        self.board.track(task.abort_handle());
        task
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cut_off_line_names_twenty_files_and_counts_the_rest() {
        let paths: Vec<String> = (0..23).map(|i| format!("f{i:02}.md")).collect();
        assert_eq!(named(&paths[..2]), "f00.md, f01.md");
        let text = named(&paths);
        assert!(text.starts_with("f00.md, f01.md,"), "{text}");
        assert!(text.ends_with("f19.md and 3 more"), "{text}");
    }

    fn files(n: usize) -> BTreeMap<String, String> {
        (0..n)
            .map(|i| (format!("d{}/f{i:05}.md", i % 20), format!("sha{i}")))
            .collect()
    }

    #[test]
    fn reported_takes_the_paths_and_everything_below_a_reported_directory() {
        let files: BTreeMap<String, String> = [
            "a.md", "ab.md", "d/x.md", "d/e/y.md", "d-e/z.md", "de/w.md", "q.md",
        ]
        .into_iter()
        .map(|p| (p.to_string(), format!("sha {p}")))
        .collect();
        let changed: BTreeSet<String> = ["a.md", "d", "gone.md", "d/e"]
            .into_iter()
            .map(String::from)
            .collect();
        let got: Vec<String> = reported(&files, &changed).into_keys().collect();
        assert_eq!(got, ["a.md", "d/e/y.md", "d/x.md"]);
    }

    /// 2,000 files × 1,000 reported paths (half files, half missing, plus
    /// the 20 directories): the cost is the reported paths', not their
    /// product with the folder's size. The time is printed; the bound is loose.
    #[test]
    fn reported_costs_what_changed_not_files_times_changed() {
        let files = files(2000);
        let mut changed: BTreeSet<String> = files.keys().step_by(4).cloned().collect();
        changed.extend((0..500).map(|i| format!("gone/{i}.md")));
        changed.extend((0..20).map(|d| format!("d{d}")));
        let started = std::time::Instant::now();
        let rounds = 20;
        let mut got = 0;
        for _ in 0..rounds {
            got = reported(&files, &changed).len();
        }
        let each = started.elapsed() / rounds;
        eprintln!(
            "reported(): 2,000 files x {} reported paths: {} us per pass",
            changed.len(),
            each.as_micros()
        );
        assert_eq!(got, 2000, "every file is below a reported directory");
        // Before: 81 ms per pass (debug build), the product of the two.
        assert!(each < std::time::Duration::from_millis(40), "{each:?}");
        changed.retain(|c| !c.starts_with('d') || c.contains('/'));
        assert_eq!(reported(&files, &changed).len(), 500);
    }
}
