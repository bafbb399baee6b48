//! The push-only flush of one store: the last thing a session does with
//! its memory before the folder goes. New and changed files are uploaded,
//! nothing is deleted or pulled; which files and how is the planner's
//! ([`flush_dirty`], [`plan_flush`]), and a flush cut off part-way logs
//! what it had not uploaded.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::{StreamExt, stream};
use tracing::{Instrument, debug, warn};

use crate::api::types::MemoryIndexEntry;

use super::plan::{
    DirtyFacts, FlushDecision, FlushFacts, FlushRemote, FolderOp, FolderVerdict, Listed,
    flush_dirty, plan_flush, plan_folder,
};
use super::push::{MAX_UPLOADS, PASS_BUDGET};
use super::remote::MemoryApi;
use super::store::{AttachedStore, MARKER_PATH, PassError, UPLOAD_CONCURRENCY};

impl AttachedStore {
    /// Push-only: upload new and changed files, `UPLOAD_CONCURRENCY` at a
    /// time; no deletes, no pulls. If the caller drops this future part-way,
    /// the store logs how many changed files had not finished uploading.
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
        let _pass = self.lock_before_pushes().await;
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
                self.settle_sent(&remote);
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
        let (uploaded, conflicts, _) = self
            .push_dirty(api, &dirty, remote.as_deref(), &done, &|_| true)
            .await;
        stats.uploaded = uploaded;
        stats.conflicts += conflicts;
        Ok(())
    }

    /// The change-driven push: upload what the kernel reported written
    /// since the last pass — never a delete, never a pull, never a listing
    /// (each update is guarded by the hash it was last synced at, so the
    /// server refuses it if another writer changed the memory since: the
    /// server wins, and the next sync pulls its version). Holds the pass
    /// lock, so it never interleaves with a sync; bounded, and gives way to
    /// a sync that waits or to `stop` (see `super::push`): the paths it did
    /// not get to stay reported. Uploads done.
    pub(crate) async fn push_changed(
        &self,
        api: &dyn MemoryApi,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> usize {
        if self.read_only {
            return 0;
        }
        let _pass = self.pass.lock().await;
        let started = std::time::Instant::now();
        let seen = match self.scan_changed().await {
            Ok(Some(seen)) => seen,
            // The next sync scans whole and pushes what changed.
            Ok(None) => return 0,
            Err(e) => {
                debug!(memory_store.id = %self.id, error = %e, "cannot examine the memory store folder for a push");
                return 0;
            }
        };
        let (scan, changed) = seen;
        if plan_folder(scan.folder_facts(FolderOp::Flush)) != FolderVerdict::Proceed {
            return 0;
        }
        // A file the push saw is not missing: it breaks a pending delete's
        // streak as a sync's scan does, so an absence is corroborated only
        // by scans that all saw it (a file re-created, pushed and removed
        // again starts a fresh 30 s window).
        self.state()
            .pending
            .retain(|rel, _| !scan.files.contains_key(rel));
        let found = reported(scan.files.with_marker(), &changed);
        let mut dirty = self.dirty(found.iter());
        // An upload whose answer never came is settled by the next sync's
        // listing; a push over it would replace its record, and the server
        // holding our own lost upload would then read as another writer's
        // change, which wins (the model test found this).
        {
            let state = self.state();
            dirty.retain(|rel, _| !state.sent.contains_key(rel));
        }
        if dirty.is_empty() {
            return 0;
        }
        let go = |begun: usize| {
            begun < MAX_UPLOADS
                && started.elapsed() < PASS_BUDGET
                && !self.sync_waiting()
                && !stop()
        };
        let (uploaded, _, left) = self.push_dirty(api, &dirty, None, &|_| {}, &go).await;
        if !left.is_empty() {
            debug!(memory_store.id = %self.id, left = left.len(), "the push pass ends before its last uploads; the next pass or sync takes them");
            self.observer().report_again(left);
        }
        self.pushed
            .fetch_add(uploaded, std::sync::atomic::Ordering::Relaxed);
        drop(_pass);
        self.sync_journal().await;
        uploaded
    }

    /// Plan (the flush's rules) and upload each dirty file, `remote` the
    /// listing if there is one; `done` is told of each path as it is
    /// settled, and `go` (given how many uploads began) says whether the
    /// next may begin. Uploads landed, conflicts left to the server, and the
    /// paths `go` held back.
    async fn push_dirty(
        &self,
        api: &dyn MemoryApi,
        dirty: &BTreeMap<String, String>,
        remote: Option<&BTreeMap<String, MemoryIndexEntry>>,
        done: &(dyn Fn(&str) + Sync),
        go: &(dyn Fn(usize) -> bool + Sync),
    ) -> (usize, usize, Vec<String>) {
        let mut conflicts = 0;
        let mut work = Vec::new();
        for (rel, local) in dirty {
            match self.plan_flush_path(rel, local, remote) {
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
                    conflicts += 1;
                    done(rel);
                }
                FlushDecision::Upload { update } => work.push((rel.clone(), local.clone(), update)),
            }
        }
        let begun = AtomicUsize::new(0);
        let left = Mutex::new(Vec::new());
        let uploaded = stream::iter(work)
            .map(|(rel, local, update)| {
                let (begun, left) = (&begun, &left);
                async move {
                    // Asked as the upload would begin (a slot is free).
                    if !go(begun.fetch_add(1, Ordering::Relaxed)) {
                        left.lock().unwrap_or_else(|e| e.into_inner()).push(rel);
                        return false;
                    }
                    let landed = self.upload(api, &rel, Some(&local), update).await;
                    done(&rel);
                    match landed {
                        Some(sha) => {
                            self.state().baseline.insert(rel, sha);
                            true
                        }
                        None => false,
                    }
                }
            })
            .buffer_unordered(UPLOAD_CONCURRENCY)
            .filter(|ok| std::future::ready(*ok))
            .count()
            .await;
        let left = left.into_inner().unwrap_or_else(|e| e.into_inner());
        (uploaded, conflicts, left)
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

/// Logs, when a flush is dropped before it finished, how many of its
/// changed files had not finished uploading.
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
        let left = self.unsent.lock().map(|u| u.len()).unwrap_or(0);
        if left > 0 {
            warn!(
                memory_store.id = %self.store_id,
                "memory flush cut off part-way; {left} of {} changed files had not finished uploading",
                self.dirty
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
