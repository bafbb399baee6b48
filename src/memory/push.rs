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
    stop: tokio_util::sync::CancellationToken,
) {
    let mut seen = 0usize;
    let mut first: Option<Instant> = None;
    let mut last_change = Instant::now();
    let mut last_push: Option<Instant> = None;
    let Some(mut replaced) = store.upgrade().map(|s| s.watch_wakeups()) else {
        return;
    };
    // The current watch's descriptor, registered with the reactor; `None`
    // until taken (again, after the watch was replaced).
    let mut wake: Option<AsyncFd<OwnedFd>> = None;
    loop {
        if first.is_some() {
            // Debouncing: look again shortly.
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(TICK) => {}
            }
        } else {
            if wake.is_none() {
                let Some(held) = store.upgrade() else { return };
                replaced.mark_unchanged();
                wake = held.watch_fd().and_then(register);
            }
            // Idle: sleep until the kernel reports something.
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = replaced.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    wake = None;
                    continue;
                }
                ready = readable(wake.as_ref()) => match ready {
                    Ok(mut guard) => guard.clear_ready(),
                    // The reactor let the descriptor go (it is shutting
                    // down): drop the registration, the tick stands in.
                    Err(_) => wake = None,
                },
                _ = tokio::time::sleep(IDLE_TICK) => {}
            }
        }
        let Some(held) = store.upgrade() else { return };
        held.push_wakeups
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let now = Instant::now();
        let pending = held.pending_changes();
        match pending {
            Some(n) if n > 0 => {
                if n != seen {
                    seen = n;
                    last_change = now;
                }
                let first_at = *first.get_or_insert(now);
                let settled = now.duration_since(last_change) >= QUIET
                    || now.duration_since(first_at) >= MAX_WAIT;
                let spaced = last_push.is_none_or(|t| now.duration_since(t) >= MIN_GAP);
                // A sync under way goes first; a back-off is waited out.
                if settled && spaced && !held.board.sync_busy() && !held.board.backing_off() {
                    let uploads = held.push_changed(&api, &stop).await.len();
                    if uploads > 0 {
                        debug!(memory_store.id = %held.id, uploads, "pushing changed memories");
                    }
                    last_push = Some(Instant::now());
                    seen = 0;
                    first = None;
                }
            }
            // Nothing reported (or a sync took it), or the watch cannot
            // vouch for what it saw: nothing to push.
            Some(_) | None => {
                seen = 0;
                first = None;
            }
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
