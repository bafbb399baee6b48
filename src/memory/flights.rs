//! The change-driven push's uploads, each in a task of its own (a
//! "flight"), and what the other passes know of them: the [`FlightBoard`]
//! each store keeps. The board knows nothing of the store; the push's pass
//! (`super::flush`) spawns the flights and tells the board as they start
//! and end.
//!
//! An upload the push starts outlives the pass that planned it: it holds no
//! lock while it waits for the server, so one that hangs holds neither the
//! periodic sync nor the teardown's flush hostage — it keeps only its own
//! request's bound (issue 24). In return every other pass knows what flies:
//!
//! - A sync (or the flush) is *busy* from the moment it starts waiting for
//!   the store: no flight starts meanwhile, and the flights that have not
//!   started yet are taken over (the pass plans their paths itself).
//! - A sync leaves a path a started flight carries alone; the path is
//!   planned again once the flight ends (its end makes the next sync plan,
//!   and reports the path to the push again).
//! - The flush waits for a flight that carries the file's current content
//!   (within the flush's own bound, whose cut-off names the path) and sends
//!   a newer edit at once. Whichever of the two the server takes first, the
//!   newer content wins: the send numbers tell the older from the newer
//!   (`State::owner_of`), so an older upload of ours never beats a newer
//!   edit, and its late answer changes nothing.
//! - A flight that fails on a `429` — or on any failure worth retrying —
//!   makes the push back off as a whole: as long as the answer's
//!   `retry-after-ms` / `retry-after` asks (at most [`MAX_BACKOFF`]), else
//!   0.5 s doubling to 8 s, as the client's own retries wait. No flight
//!   starts and no pass runs meanwhile; the path is reported again.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// No upload of a push pass starts after this long (those in flight
/// finish), so a slow server cannot stretch one pass out.
pub(crate) const PASS_BUDGET: Duration = Duration::from_secs(2);
/// The longest a `retry-after` can stop the push: a longer ask waits this
/// long (the periodic sync goes on meanwhile, with the client's retries).
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// The push's wait after a failure that asked for none; it doubles with
/// each failure in a row, up to [`BACKOFF_CAP`] (the client's own retry
/// delays).
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_CAP: Duration = Duration::from_secs(8);

/// One store's flights, the syncs and flushes under way, and the push's
/// back-off.
#[derive(Default)]
pub(super) struct FlightBoard {
    flights: Mutex<Flights>,
    backoff: Mutex<Backoff>,
}

/// The store's flights, by path, and whether a sync or a flush is under way.
#[derive(Default)]
struct Flights {
    /// Syncs and flushes under way (waiting for the store, or running).
    busy: usize,
    next: u64,
    by_path: HashMap<String, Vec<Flight>>,
    /// Every flight's task not known to have ended, to stop them with the
    /// stores ([`FlightBoard::ground`]).
    tasks: Vec<tokio::task::AbortHandle>,
}

struct Flight {
    id: u64,
    /// The hash of the content it carries.
    sha: String,
    /// It has sent (or is sending) its request.
    started: bool,
    /// Turns `true` when it ends; its sender dropped, the same.
    done: watch::Receiver<bool>,
}

/// Whether a flight may send its request now.
pub(super) enum Start {
    Go,
    /// A sync or the flush took its path over.
    TakenOver,
    /// Not now (a pass under way, the push stopped or backing off, the
    /// pass's budget spent): the path is reported again.
    HeldBack,
}

/// The push's back-off after a failed upload.
#[derive(Default)]
struct Backoff {
    until: Option<Instant>,
    failures: u32,
}

/// A sync or a flush under way (see [`FlightBoard::busy`]).
pub(super) struct Busy<'a>(&'a FlightBoard);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.flights().busy -= 1;
    }
}

impl FlightBoard {
    fn flights(&self) -> MutexGuard<'_, Flights> {
        self.flights.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn backoff(&self) -> MutexGuard<'_, Backoff> {
        self.backoff.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A sync or a flush starts (it may still wait for the store): no
    /// flight starts until the guard drops, and the push plans no pass.
    pub(super) fn busy(&self) -> Busy<'_> {
        self.flights().busy += 1;
        Busy(self)
    }

    /// Is a sync or a flush under way?
    pub(super) fn sync_busy(&self) -> bool {
        self.flights().busy > 0
    }

    /// Take over the flights that have not sent their request: the pass
    /// under way plans their paths instead. Call it holding [`Self::busy`].
    pub(super) fn take_over_unstarted(&self) {
        let mut flights = self.flights();
        flights.by_path.retain(|_, fs| {
            fs.retain(|f| f.started);
            !fs.is_empty()
        });
    }

    /// The paths a flight carries now (a sync leaves them alone).
    pub(super) fn flying(&self) -> HashSet<String> {
        self.flights().by_path.keys().cloned().collect()
    }

    /// Does a flight carry `rel`?
    pub(super) fn has_flight(&self, rel: &str) -> bool {
        self.flights().by_path.contains_key(rel)
    }

    /// A started flight carrying exactly `sha` to `rel`: its end.
    pub(super) fn flight_carrying(&self, rel: &str, sha: &str) -> Option<watch::Receiver<bool>> {
        self.flights()
            .by_path
            .get(rel)?
            .iter()
            .find(|f| f.started && f.sha == sha)
            .map(|f| f.done.clone())
    }

    /// A new flight carrying `sha` to `rel`, not started: its id, and the
    /// sender its task signals its end on. Registered before the task runs,
    /// so a pass that plans after it knows of it.
    pub(super) fn register(&self, rel: &str, sha: &str) -> (u64, watch::Sender<bool>) {
        let (done, watching) = watch::channel(false);
        let mut flights = self.flights();
        flights.next += 1;
        let id = flights.next;
        flights
            .by_path
            .entry(rel.to_string())
            .or_default()
            .push(Flight {
                id,
                sha: sha.to_string(),
                started: false,
                done: watching,
            });
        (id, done)
    }

    /// Keep the flight's task, to stop it with the store ([`Self::ground`]).
    pub(super) fn track(&self, task: tokio::task::AbortHandle) {
        let mut flights = self.flights();
        flights.tasks.retain(|t| !t.is_finished());
        flights.tasks.push(task);
    }

    /// Stop every flight now, its request dropped wherever it is (it may
    /// still land: a later pass of another worker settles it as any upload
    /// cut off in flight): the stores are going without their teardown (a
    /// session dropped unfinished), and nothing of theirs may outlive them —
    /// not a request, not a hold on their journals.
    pub(super) fn ground(&self) {
        let mut flights = self.flights();
        for task in flights.tasks.drain(..) {
            task.abort();
        }
        flights.by_path.clear();
    }

    /// May flight `id` of `rel` send its request now? It may unless a sync
    /// or the flush is under way, the push was stopped or backs off, or its
    /// pass's budget is spent ([`PASS_BUDGET`]); held back, it is forgotten.
    pub(super) fn start(
        &self,
        rel: &str,
        id: u64,
        pass_started: Instant,
        stop: &CancellationToken,
    ) -> Start {
        let mut flights = self.flights();
        let held_back = flights.busy > 0
            || stop.is_cancelled()
            || pass_started.elapsed() >= PASS_BUDGET
            || self.backing_off();
        let Some(fs) = flights.by_path.get_mut(rel) else {
            return Start::TakenOver;
        };
        let Some(at) = fs.iter().position(|f| f.id == id) else {
            return Start::TakenOver;
        };
        if held_back {
            fs.remove(at);
            if fs.is_empty() {
                flights.by_path.remove(rel);
            }
            return Start::HeldBack;
        }
        fs[at].started = true;
        Start::Go
    }

    /// Flight `id` of `rel` ended, whatever became of it.
    pub(super) fn end(&self, rel: &str, id: u64) {
        let mut flights = self.flights();
        if let Some(fs) = flights.by_path.get_mut(rel) {
            fs.retain(|f| f.id != id);
            if fs.is_empty() {
                flights.by_path.remove(rel);
            }
        }
    }

    /// Does the push back off now?
    pub(super) fn backing_off(&self) -> bool {
        self.backoff()
            .until
            .is_some_and(|until| Instant::now() < until)
    }

    /// A push upload landed: the next failure waits the first back-off again.
    pub(super) fn landed(&self) {
        self.backoff().failures = 0;
    }

    /// A push upload failed: back off as long as the server asked, else
    /// [`BACKOFF_FIRST`] doubling with each failure in a row.
    pub(super) fn back_off(&self, asked: Option<Duration>) {
        let mut backoff = self.backoff();
        let wait = match asked {
            Some(asked) => asked.min(MAX_BACKOFF),
            None => BACKOFF_FIRST
                .saturating_mul(1u32 << backoff.failures.min(10))
                .min(BACKOFF_CAP),
        };
        backoff.failures = backoff.failures.saturating_add(1);
        let until = Instant::now() + wait;
        backoff.until = Some(backoff.until.map_or(until, |u| u.max(until)));
    }
}
