//! One store's view of its folder between passes: the observe step of a
//! sync. A pass asks the [`Observer`] what the folder holds; the observer
//! answers from the watch's reported paths (examined on the folder) and the
//! view the last pass left, or with a full scan when the watch cannot answer
//! exactly (see [`super::watch`]) or the safety cadence is due.
//!
//! Arrows: this module uses the folder (to scan and examine) and the watch
//! (to learn what changed); neither of them knows it.
//!
//! Nothing here waits, but examining paths costs what the agent makes it
//! cost: callers run passes on a blocking thread. Only
//! [`Observer::observe_idle`], which reads no event and examines nothing,
//! runs on the async thread.

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::folder::{Folder, FolderError, Scan};
use super::watch::{DEFAULT_EVENT_BOUND, Watch, next_revision};

/// The safety cadence: a full scan at least this often, to catch what a
/// watch cannot see but a file's stat shows (a write through a shared
/// `mmap`, which inotify does not report, moves the file's mtime at its
/// first fault; a change a network or FUSE filesystem's other clients
/// make). What changes no stat at all — later writes through a mapping
/// still live on tmpfs — no scan sees: the stat cache trusts an unchanged
/// stat, as it did before the watch.
/// By time, not by pass count, as the remote index's full listing
/// ([`super::feed::FULL_LISTING_EVERY`]): the safety net costs the same
/// whatever the sync interval, and an idle store's syncs cost nothing per
/// file.
pub(crate) const FULL_SCAN_EVERY: Duration = Duration::from_secs(300);

/// One store's view of its folder between passes: the watch, and the
/// folder as the last pass left it (the last full scan, with every path
/// examined since put in). A pass examines only the reported paths and
/// takes the rest from here, so the planner is fed the same facts a full
/// scan would give — an unexamined path is as last seen, never missing.
#[derive(Debug)]
pub(crate) struct Observer {
    watch: Option<Watch>,
    /// Shared with the pass that last saw it, never copied for it: an idle
    /// pass costs no allocation per file (a pass that changes it copies it
    /// only if the previous pass still holds it).
    known: Option<Arc<Scan>>,
    /// The root's identity when the last full scan began.
    root: Option<(u64, u64)>,
    last_full: Option<Instant>,
    /// The safety cadence ([`FULL_SCAN_EVERY`]; tests shorten it).
    full_every: Duration,
    bound: usize,
    /// `false`: no watch, every pass a full scan (as before the watch; the
    /// benchmark's baseline).
    enabled: bool,
    /// The revision of `known` ([`Observation::revision`]).
    revision: u64,
    /// Bumped whenever the watch is replaced or dropped, so that a task
    /// waiting on the old instance's descriptor ([`Observer::wake_fd`])
    /// learns to take the new one.
    replaced: tokio::sync::watch::Sender<u64>,
}

/// What a pass saw of its folder.
#[derive(Debug)]
pub(crate) struct Observation {
    pub(crate) scan: Arc<Scan>,
    /// Which view this is: a new number whenever any pass (a sync's or a
    /// push's) saw the folder change, so a sync can tell that nothing
    /// local changed since an earlier one ([`next_revision`]).
    pub(crate) revision: u64,
    /// Entries stat-ed to see it.
    pub(crate) examined: usize,
    /// A full scan, not only the reported paths.
    pub(crate) full: bool,
    /// The paths reported and examined (`None`: a full scan).
    pub(crate) changed: Option<BTreeSet<String>>,
}

impl Default for Observer {
    fn default() -> Self {
        Observer::new(DEFAULT_EVENT_BOUND)
    }
}

impl Observer {
    pub(crate) fn new(bound: usize) -> Observer {
        Observer {
            watch: None,
            known: None,
            root: None,
            last_full: None,
            full_every: FULL_SCAN_EVERY,
            bound,
            enabled: true,
            revision: next_revision(),
            replaced: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Told each time the watch is replaced or dropped (see
    /// [`Observer::wake_fd`]).
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.replaced.subscribe()
    }

    /// A second descriptor of the current watch's inotify instance, which
    /// turns readable when the kernel queues an event: a task can sleep on it
    /// instead of polling the queue. `None` without a watch. Take a new one
    /// when [`Observer::subscribe`]'s channel changes: the old instance
    /// reports nothing more.
    pub(crate) fn wake_fd(&self) -> Option<OwnedFd> {
        self.watch.as_ref()?.duplicate_fd()
    }

    fn replace_watch(&mut self, watch: Option<Watch>) {
        self.watch = watch;
        self.replaced.send_modify(|generation| *generation += 1);
    }

    /// The safety cadence's period (tests and the benchmark shorten it).
    pub(crate) fn set_full_scan_every(&mut self, every: Duration) {
        self.full_every = every;
    }

    /// The most changed paths kept between passes (tests lower it).
    pub(crate) fn set_bound(&mut self, bound: usize) {
        self.bound = bound;
        if let Some(watch) = self.watch.as_mut() {
            watch.set_bound(bound);
        }
    }

    /// No watch from the next pass on: every pass scans whole.
    pub(crate) fn disable(&mut self) {
        self.enabled = false;
        self.forget();
    }

    /// Lose every event queued now, as an overflowing kernel queue does,
    /// and say so as it does (the model test's overflow step).
    pub(crate) fn lose_events(&mut self) {
        if let Some(watch) = self.watch.as_mut() {
            watch.drain();
            watch.fall_back("the kernel's event queue overflowed");
        }
    }

    /// The folder was rebuilt (a re-download): the next pass scans it whole.
    pub(crate) fn forget(&mut self) {
        self.replace_watch(None);
        self.revision = next_revision();
        self.known = None;
    }

    /// See the folder: only the paths reported since the last pass, unless
    /// `full` is asked for (the final sync, the flush), the safety cadence
    /// is due, or anything made the watch's account doubtful.
    pub(crate) fn observe(
        &mut self,
        folder: &Folder,
        full: bool,
    ) -> Result<Observation, FolderError> {
        if !full
            && !self.cadence_due()
            && let Some(seen) = self.changed(folder)
        {
            return Ok(seen);
        }
        self.full_scan(folder)
    }

    /// The safety cadence's full scan is due (or none was made yet).
    fn cadence_due(&self) -> bool {
        self.last_full
            .is_none_or(|t| t.elapsed() >= self.full_every)
    }

    /// The pass of an idle folder, without examining anything: `Some` only
    /// when no full scan is asked for or due, the watch holds no report and
    /// the kernel no event, and the root is the one scanned. Cheap enough
    /// to run on the async thread (one `ioctl` on the queue, which reads no
    /// event; one `stat` of the root): an idle sync then costs no hand-off
    /// to a blocking thread. `None`: ask [`observe`](Self::observe), which
    /// reads the events.
    pub(crate) fn observe_idle(&self, folder: &Folder) -> Option<Observation> {
        if self.cadence_due() {
            return None;
        }
        let known = self.known.as_ref()?;
        if !self.watch.as_ref()?.is_quiet() || folder.current_identity() != self.root {
            return None;
        }
        Some(Observation {
            revision: self.revision,
            scan: Arc::clone(known),
            examined: 0,
            full: false,
            changed: Some(BTreeSet::new()),
        })
    }

    /// Only the paths reported since the last pass, for a push; `None`
    /// when the watch cannot vouch for them (the next sync scans whole).
    pub(crate) fn observe_changed(&mut self, folder: &Folder) -> Option<Observation> {
        self.changed(folder)
    }

    /// Report these paths again (a push examined them but did not get to
    /// upload them): the next pass examines them once more. Past the
    /// watch's bound, the next pass scans whole instead.
    pub(crate) fn report_again(&mut self, paths: Vec<String>) {
        if let Some(watch) = self.watch.as_mut() {
            watch.report_again(paths);
        }
    }

    /// How many paths were reported and not yet examined (after reading
    /// the queued events), or `None` when the next pass must scan whole.
    pub(crate) fn pending(&mut self) -> Option<usize> {
        let watch = self.watch.as_mut()?;
        self.known.as_ref()?;
        watch.pending()
    }

    /// The incremental pass; `None` when it cannot be trusted.
    fn changed(&mut self, folder: &Folder) -> Option<Observation> {
        let watch = self.watch.as_mut()?;
        let known = self.known.as_mut()?;
        let dirty = watch.take_dirty();
        if watch.full().is_some() || folder.current_identity() != self.root {
            return None;
        }
        if dirty.is_empty() {
            return Some(Observation {
                revision: self.revision,
                scan: Arc::clone(known),
                examined: 0,
                full: false,
                changed: Some(dirty),
            });
        }
        self.revision = next_revision();
        let view = Arc::make_mut(known);
        for rel in &dirty {
            forget_below(view, rel);
        }
        // The root swapped while the paths were read (they are from another
        // directory than the rest), or a path could not be examined: the
        // view has lost those paths, so it is dropped — the next pass scans
        // whole, and no forgotten path is ever read as deleted.
        let examined = folder.examine(&dirty, watch).ok().flatten();
        let Some((seen, examined)) = examined.filter(|_| folder.current_identity() == self.root)
        else {
            self.known = None;
            return None;
        };
        view.files.extend(seen.files);
        view.unreadable.extend(seen.unreadable);
        view.unrepresentable.extend(seen.unrepresentable);
        Some(Observation {
            revision: self.revision,
            scan: Arc::clone(known),
            examined,
            full: false,
            changed: Some(dirty),
        })
    }

    fn full_scan(&mut self, folder: &Folder) -> Result<Observation, FolderError> {
        let previous = self.known.take();
        // A new instance: the old one's watches (and whatever it missed) go.
        // Without one (`max_user_instances`), every pass is a full scan.
        self.replace_watch(None);
        let mut watch = self.enabled.then(|| Watch::new(self.bound).ok()).flatten();
        self.root = folder.current_identity();
        let (scan, examined) = folder.scan_watched(watch.as_mut())?;
        // A scan that finds the folder exactly as the view already held it
        // (the safety cadence's, on an idle store) keeps the view and its
        // revision: the sync then knows nothing local changed and skips its
        // walk over the paths, as after an incremental pass.
        let scan = match previous {
            Some(view) if *view == scan => view,
            _ => {
                self.revision = next_revision();
                Arc::new(scan)
            }
        };
        self.replace_watch(watch);
        self.known = Some(Arc::clone(&scan));
        self.last_full = Some(Instant::now());
        Ok(Observation {
            revision: self.revision,
            scan,
            examined,
            full: true,
            changed: None,
        })
    }
}

/// Drop what `known` held at or below `rel` (about to be examined again).
fn forget_below(known: &mut Scan, rel: &str) {
    let below = |p: &str| {
        p.strip_prefix(rel)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    known.files.remove(rel);
    let prefix = format!("{rel}/");
    let under: Vec<String> = known
        .files
        .range(prefix.clone()..)
        .take_while(|(k, _)| k.starts_with(&prefix))
        .map(|(k, _)| k.clone())
        .collect();
    for k in under {
        known.files.remove(&k);
    }
    known.unreadable.retain(|u| !below(u));
    known.unrepresentable.retain(|u| !below(u));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full scan that finds the folder as the view held it (the safety
    /// cadence on an idle store) keeps the view and its revision, so the
    /// sync skips its walk; one that finds any change is a new revision.
    #[test]
    fn a_full_scan_of_an_unchanged_folder_keeps_the_views_revision() {
        let (_dir, folder) = crate::memory::folder::tests::folder();
        folder.put("a/b.md", b"one").unwrap();
        let mut observer = Observer::default();
        let first = observer.observe(&folder, true).unwrap();
        let again = observer.observe(&folder, true).unwrap();
        assert!(again.full);
        assert_eq!(again.revision, first.revision);
        assert!(
            Arc::ptr_eq(&again.scan, &first.scan),
            "the view was rebuilt"
        );

        folder.put("a/b.md", b"two").unwrap();
        let changed = observer.observe(&folder, true).unwrap();
        assert_ne!(changed.revision, first.revision);
        assert_ne!(changed.scan.files, first.scan.files);
        // After the view was forgotten (a rebuilt folder), never the old one.
        observer.forget();
        let rebuilt = observer.observe(&folder, true).unwrap();
        assert_ne!(rebuilt.revision, changed.revision);
    }

    /// The idle pass answers only for a folder the watch reported nothing
    /// of, and leaves every report to the full pass that follows.
    #[test]
    fn the_idle_pass_answers_only_when_nothing_was_reported() {
        let (_dir, folder) = crate::memory::folder::tests::folder();
        folder.put("a/b.md", b"one").unwrap();
        let mut observer = Observer::default();
        assert!(observer.observe_idle(&folder).is_none(), "never scanned");
        let scanned = observer.observe(&folder, true).unwrap();
        let idle = observer.observe_idle(&folder).expect("an idle folder");
        assert_eq!(
            (idle.revision, idle.examined, idle.full),
            (scanned.revision, 0, false)
        );

        std::fs::write(folder.root().join("a/b.md"), "two").unwrap();
        assert!(
            observer.observe_idle(&folder).is_none(),
            "a write was reported"
        );
        assert!(
            observer.observe_idle(&folder).is_none(),
            "the report is kept"
        );
        let seen = observer.observe(&folder, false).unwrap();
        assert!(!seen.full);
        assert_eq!(seen.changed, Some(BTreeSet::from(["a/b.md".to_string()])));
        assert_ne!(seen.revision, scanned.revision);
        assert_eq!(
            observer.observe_idle(&folder).unwrap().revision,
            seen.revision
        );

        // Due for the safety cadence: only the full pass answers.
        observer.set_full_scan_every(Duration::ZERO);
        assert!(
            observer.observe_idle(&folder).is_none(),
            "the cadence is due"
        );
    }
}
