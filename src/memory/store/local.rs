//! The folder as a pass sees it: the watch's account of what changed (or a
//! full scan), the marker taken out and checked, and the entries the store
//! cannot sync warned once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tracing::{debug, warn};

use crate::memory::folder::{
    Folder, MARKER_PATH, MAX_FILE_BYTES, Scan, is_oversized, oversized_bytes,
};
use crate::memory::observe::{Observation, Observer};
use crate::memory::plan::{FolderFacts, FolderOp};

use super::marker::{marker_content, marker_distrust};
use super::{AttachedStore, PassError, blocking};

/// The files a pass saw, the marker left out: the watch's view itself,
/// shared rather than copied, so an idle pass allocates nothing per file.
#[derive(Debug, Clone)]
pub(crate) struct LocalFiles(Arc<Scan>);

impl LocalFiles {
    /// Every file but the marker, by path.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.0.files.iter().filter(|(rel, _)| *rel != MARKER_PATH)
    }

    /// Every file the scan saw, the marker included.
    pub(crate) fn with_marker(&self) -> &BTreeMap<String, String> {
        &self.0.files
    }

    pub(crate) fn contains_key(&self, rel: &str) -> bool {
        rel != MARKER_PATH && self.0.files.contains_key(rel)
    }

    /// The file's hash at `rel` (never the marker's).
    pub(crate) fn get(&self, rel: &str) -> Option<&String> {
        if rel == MARKER_PATH {
            return None;
        }
        self.0.files.get(rel)
    }

    /// Does the file at `rel` hold exactly `listed` (`None`: there is no
    /// file, and nothing listed)? Never for a path the scan could not read.
    pub(crate) fn agrees(&self, rel: &str, listed: Option<&str>) -> bool {
        !self.is_unknown(rel) && self.get(rel).map(String::as_str) == listed
    }

    pub(crate) fn len(&self) -> usize {
        self.0.files.len() - usize::from(self.0.files.contains_key(MARKER_PATH))
    }

    /// Is `rel` unknown to the scan: at or below an entry it could not read?
    pub(super) fn is_unknown(&self, rel: &str) -> bool {
        self.0.is_unknown(rel)
    }

    fn unreadable(&self) -> usize {
        self.0.unreadable.len()
    }
}

/// A scan with the marker checked.
pub(crate) struct Marked {
    pub(crate) files: LocalFiles,
    /// The view's revision ([`Observation::revision`]).
    pub(super) revision: u64,
    /// `None` when the marker names this store; otherwise why not.
    distrust: Option<&'static str>,
    /// Entries stat-ed for this scan (only the reported paths, unless full).
    pub(crate) examined: usize,
    /// The whole folder was walked.
    pub(crate) full: bool,
}

impl Marked {
    /// What this scan says of the folder as a whole, for `op`'s verdict
    /// (a sync adds the baseline once it has listed the store).
    pub(crate) fn folder_facts(&self, op: FolderOp) -> FolderFacts {
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

impl AttachedStore {
    /// The most changed paths the folder's watch keeps between passes
    /// before a full scan is due instead (tests lower it to force one).
    pub(crate) fn set_watch_bound(&self, bound: usize) {
        self.observer().set_bound(bound);
    }

    /// No watch: every pass scans the whole folder (the benchmark's baseline).
    pub(crate) fn disable_watch(&self) {
        self.observer().disable();
    }

    /// Lose the watch's queued events as an overflow does (tests).
    pub(crate) fn lose_watch_events(&self) {
        self.observer().lose_events();
    }

    pub(crate) fn observer(&self) -> std::sync::MutexGuard<'_, Observer> {
        self.observer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// See the folder: a full scan when `full` (or when the watch cannot
    /// vouch for what it did not report), else only the paths the kernel
    /// reported since the last scan ([`Observer`]).
    pub(crate) async fn scan(&self, full: bool) -> Result<Marked, PassError> {
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
    pub(crate) async fn scan_changed(
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
    pub(crate) fn pending_changes(&self) -> Option<usize> {
        self.observer.try_lock().ok()?.pending()
    }

    /// The watch's replacements, and a descriptor that turns readable when
    /// the kernel reports a change (see [`Observer::wake_fd`]).
    pub(crate) fn watch_wakeups(&self) -> tokio::sync::watch::Receiver<u64> {
        self.observer().subscribe()
    }

    pub(crate) fn watch_fd(&self) -> Option<std::os::fd::OwnedFd> {
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
        if full {
            debug!(memory_store.id = %self.id, examined, "memory folder scanned whole");
        }
        self.warn_unsyncable(&scan);
        let distrust = self.check_marker(&scan).await;
        Marked {
            files: LocalFiles(scan),
            revision,
            distrust,
            examined,
            full,
        }
    }

    /// Warn once of each entry the scan could not read, each file over the
    /// size limit (refused by its stat, never read) and each name that
    /// cannot be a memory.
    fn warn_unsyncable(&self, scan: &Scan) {
        let Scan {
            files,
            unrepresentable,
            unreadable,
        } = scan;
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

    /// Does the scanned marker name this store? `None` when it does;
    /// otherwise why not.
    async fn check_marker(&self, scan: &Scan) -> Option<&'static str> {
        let distrust = marker_distrust(scan.files.get(MARKER_PATH).map(String::as_str), &self.id);
        // A marker made unreadable in the very directory the mount created
        // is still ours: stamp it again rather than distrust the folder.
        if scan.unreadable.iter().any(|u| u == MARKER_PATH) && self.folder.is_original_root() {
            let folder = self.folder.clone();
            let marker = marker_content(&self.id);
            if let Ok(Ok(())) = blocking(move || folder.put(MARKER_PATH, marker.as_bytes())).await {
                return None;
            }
        }
        distrust
    }
}
