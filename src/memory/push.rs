//! The change-driven push, opt-in (`SessionMemoryStores::with_push`): a
//! file the agent writes reaches the server within about a second, without
//! waiting for the sync interval.
//!
//! The trade-off, against the reference (which has no push): each edit
//! burst becomes its own memory version within a second instead of one
//! version per sync interval, and the write requests grow with the agent's
//! edit rate (a burst every half second at most per store) — they count
//! against the organisation's write rate limits, shared by all its workers.
//! Off (the default), the request pattern is the reference's: one sync
//! pass per interval, nothing uploaded between syncs.
//!
//! One task per writable store watches the count of paths its folder's
//! watch reported ([`super::observe::Observer::pending`]; a non-blocking read
//! of the inotify queue, every [`TICK`]) and, once the writes pause for
//! [`QUIET`] (or have kept coming for [`MAX_WAIT`]), runs an upload-only
//! pass over just those paths ([`AttachedStore::push_changed`]): it reads
//! the version feed first (one request; content the server already holds
//! is adopted without an upload, a file another writer changed is left to
//! the next sync), and never pulls or deletes — those keep their interval
//! and every rule (the 30 s delete corroboration, the cap, the server
//! winning conflicts). Passes of one store are at least [`MIN_GAP`] apart
//! and plan under the same lock as the periodic sync, so the two never
//! plan at once. An event the watch cannot vouch for (an overflow, a
//! directory replaced) pushes nothing: the next sync scans whole.
//!
//! Each upload flies in a task of its own (`super::flights`): one that
//! hangs holds no lock, so neither the periodic sync nor the teardown's
//! flush waits behind it. A pass is bounded — at most [`MAX_UPLOADS`]
//! uploads, none started after [`super::flights::PASS_BUDGET`] — and gives way to a sync or
//! a flush under way: no upload starts while one is, and the ones that had
//! not started are left to it. An agent writing faster than the server
//! takes it therefore never holds back the sync's pulls and deletes. Each
//! upload is sent once (no client-side retry): a `429` (or any failure worth
//! retrying) makes the whole push back off as long as its `retry-after`
//! asks, so the push never hammers a rate-limited organisation.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::remote::MemoryApi;
use super::store::AttachedStore;

/// How often the task looks at the watch's queue (a non-blocking read)
/// while a change is being debounced.
pub(crate) const TICK: Duration = Duration::from_millis(100);
/// While nothing is reported the task sleeps on the inotify descriptor
/// itself and wakes when the kernel queues an event; this is only its
/// safety net (a descriptor the reactor would not take, a missed wake-up):
/// an idle store costs one wake-up a second, not ten.
pub(crate) const IDLE_TICK: Duration = Duration::from_secs(1);
/// The debounce: a push waits for the writes to pause this long.
pub(crate) const QUIET: Duration = Duration::from_millis(200);
/// ...but no longer than this after the first unpushed write.
pub(crate) const MAX_WAIT: Duration = Duration::from_millis(600);
/// The rate bound: push passes of one store at least this far apart.
pub(crate) const MIN_GAP: Duration = Duration::from_millis(500);
/// The most uploads one push pass starts (8 rounds of `UPLOAD_CONCURRENCY`);
/// the rest wait for the next pass, half a second later.
pub(crate) const MAX_UPLOADS: usize = 256;
/// The most a push pass waits for the version feed, holding the store's
/// lock: past it, the pass uploads nothing and the push backs off.
pub(crate) const PLAN_BUDGET: Duration = Duration::from_secs(10);

/// Run until the store is gone or the task is cancelled. Holds the store
/// only while it plans, so dropping the stores lets it go.
///
/// `stop` ends it, and no upload of it starts after; the ones in flight go
/// on to their own request's end (`super::flights`), and the teardown waits
/// for none of them: the final sync leaves their paths to them, and the
/// flush waits for one only while it carries the file's current content.
pub(super) async fn run(
    store: Weak<AttachedStore>,
    api: Arc<dyn MemoryApi>,
    stop: CancellationToken,
) {
    let Some(replaced) = store.upgrade().map(|s| s.watch_wakeups()) else {
        return;
    };
    let mut wake = Wakeups { replaced, fd: None };
    let mut debounce = Debounce::new();
    loop {
        if debounce.waiting() {
            // Debouncing: look again shortly.
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(TICK) => {}
            }
        } else {
            match wake.idle(&store, &stop).await {
                Woke::Stop => return,
                Woke::Replaced => continue,
                Woke::Look => {}
            }
        }
        let Some(held) = store.upgrade() else { return };
        held.push_wakeups
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let now = Instant::now();
        // A sync under way goes first; a back-off is waited out.
        if debounce.due(held.pending_changes(), now)
            && !held.board.sync_busy()
            && !held.board.backing_off()
        {
            let uploads = held.push_changed(&api, &stop).await.len();
            if uploads > 0 {
                debug!(memory_store.id = %held.id, uploads, "pushing changed memories");
            }
            debounce.pushed(Instant::now());
        }
    }
}

/// When a push is due: once the reported writes pause for [`QUIET`] (or
/// have kept coming for [`MAX_WAIT`]), and [`MIN_GAP`] after the last push.
struct Debounce {
    /// The count of reported paths last seen.
    seen: usize,
    /// When the first unpushed change was seen; `None`: nothing waits.
    first: Option<Instant>,
    /// When the count last moved.
    last_change: Instant,
    last_push: Option<Instant>,
}

impl Debounce {
    fn new() -> Debounce {
        Debounce {
            seen: 0,
            first: None,
            last_change: Instant::now(),
            last_push: None,
        }
    }

    /// A change waits for its push.
    fn waiting(&self) -> bool {
        self.first.is_some()
    }

    /// With `pending` paths reported (`None`: the watch cannot vouch for
    /// them) at `now`: is a push due?
    fn due(&mut self, pending: Option<usize>, now: Instant) -> bool {
        match pending {
            Some(n) if n > 0 => {
                if n != self.seen {
                    self.seen = n;
                    self.last_change = now;
                }
                let first_at = *self.first.get_or_insert(now);
                let settled = now.duration_since(self.last_change) >= QUIET
                    || now.duration_since(first_at) >= MAX_WAIT;
                let spaced = self
                    .last_push
                    .is_none_or(|t| now.duration_since(t) >= MIN_GAP);
                settled && spaced
            }
            // Nothing reported (or a sync took it), or the watch cannot
            // vouch for what it saw: nothing to push.
            Some(_) | None => {
                self.rest();
                false
            }
        }
    }

    /// A push ran at `at`.
    fn pushed(&mut self, at: Instant) {
        self.last_push = Some(at);
        self.rest();
    }

    fn rest(&mut self) {
        self.seen = 0;
        self.first = None;
    }
}

/// What ended an idle wait.
enum Woke {
    /// The task is cancelled, or the store is gone.
    Stop,
    /// The watch was replaced: its new descriptor is taken before waiting.
    Replaced,
    /// The kernel reported something, or the safety tick came: look.
    Look,
}

/// What wakes the idle task: the watch's descriptor turning readable, or
/// the watch being replaced.
struct Wakeups {
    replaced: tokio::sync::watch::Receiver<u64>,
    /// The current watch's descriptor, registered with the reactor; `None`
    /// until taken (again, after the watch was replaced).
    fd: Option<AsyncFd<OwnedFd>>,
}

impl Wakeups {
    /// Sleep until the kernel reports something (at most [`IDLE_TICK`]).
    async fn idle(&mut self, store: &Weak<AttachedStore>, stop: &CancellationToken) -> Woke {
        if self.fd.is_none() {
            let Some(held) = store.upgrade() else {
                return Woke::Stop;
            };
            self.replaced.mark_unchanged();
            self.fd = held.watch_fd().and_then(register);
        }
        tokio::select! {
            _ = stop.cancelled() => Woke::Stop,
            changed = self.replaced.changed() => {
                if changed.is_err() {
                    return Woke::Stop;
                }
                self.fd = None;
                Woke::Replaced
            }
            ready = readable(self.fd.as_ref()) => {
                match ready {
                    Ok(mut guard) => guard.clear_ready(),
                    // The reactor let the descriptor go (it is shutting
                    // down): drop the registration, the tick stands in.
                    Err(_) => self.fd = None,
                }
                Woke::Look
            }
            _ = tokio::time::sleep(IDLE_TICK) => Woke::Look,
        }
    }
}

/// Readable: the kernel queued an event on the watch. Never, without one.
async fn readable(
    fd: Option<&AsyncFd<OwnedFd>>,
) -> std::io::Result<AsyncFdReadyGuard<'_, OwnedFd>> {
    match fd {
        Some(fd) => fd.readable().await,
        None => std::future::pending().await,
    }
}

/// The watch's descriptor with the reactor, for its readability; `None`
/// when the reactor refuses it (the one-second tick then stands in).
fn register(fd: OwnedFd) -> Option<AsyncFd<OwnedFd>> {
    // SAFETY: the `OwnedFd` is open (a fresh `dup` of the inotify
    // instance's), owned by the `AsyncFd` until it drops, and its raw
    // descriptor never changes: what `register` asks of its caller.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.ok()
}
