//! The lease heartbeat of one claimed work item.
//!
//! The first beat goes out at once with `expected_last_heartbeat =
//! NO_HEARTBEAT`; each later beat echoes the server's `last_heartbeat`. The
//! interval follows the TTL the server grants (half of it, between 1 s and
//! 30 s), each beat is cut off after one interval, and the TTL becomes the
//! session runner's send-retry window. What ends a lease:
//!
//! - `state` `stopping`/`stopped`, or `lease_extended: false` — the control
//!   plane wants the item back: the session ends and the item is still
//!   force-stopped;
//! - a 412 — another worker owns it now: the lease is *lost*, the item is
//!   released without a stop;
//! - another permanent 4xx (401, 403, 404) — the session ends, the item is
//!   force-stopped;
//! - transient failures (5xx, timeouts, 408/409/429) until a whole TTL passed
//!   without a successful beat — the lease is assumed lost.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::api::types::{Heartbeat, WorkState};
use crate::api::{ApiError, Client, Error, NO_HEARTBEAT};
use crate::session::SendWindow;

/// The interval before the server's first answer, and its ceiling.
pub(crate) const MAX_INTERVAL: Duration = Duration::from_secs(30);
pub(crate) const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The TTL assumed until the server states one.
pub(crate) const ASSUMED_TTL: Duration = Duration::from_secs(90);

/// Why a lease ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEnd {
    /// The control plane asked the item to stop (`stopping`, `stopped`, not extended).
    Stopped,
    /// A permanent heartbeat error other than 412.
    Refused(String),
    /// 412, or no successful beat for a whole TTL: another worker may own it.
    Lost,
    /// The worker ended it (teardown done).
    Released,
    /// The worker shut down while the session was mid-turn: it answered the
    /// call in flight, then stopped heartbeating *without* stopping the
    /// item, so the lease lapses (one TTL) and the item goes back to the
    /// queue for another worker to resume the session. A stop would strand
    /// it: nothing re-queues a stopped item but a user message.
    HandedBack,
}

/// The shared state of one item's lease.
#[derive(Debug, Default)]
pub(crate) struct Lease {
    /// Fires when the lease ends for any reason but the worker's own release:
    /// the session must stop.
    pub(crate) ended: CancellationToken,
    end: Mutex<Option<LeaseEnd>>,
}

impl Lease {
    pub(crate) fn new() -> Arc<Lease> {
        Arc::new(Lease::default())
    }

    fn finish(&self, why: LeaseEnd) {
        let mut end = self.end.lock().unwrap_or_else(|e| e.into_inner());
        if end.is_none() {
            *end = Some(why.clone());
        }
        drop(end);
        if why != LeaseEnd::Released {
            self.ended.cancel();
        }
    }

    /// How the lease ended, if it did.
    pub(crate) fn end(&self) -> Option<LeaseEnd> {
        self.end.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether another worker may own the item now (no force-stop then).
    pub(crate) fn is_lost(&self) -> bool {
        self.end() == Some(LeaseEnd::Lost)
    }
}

/// Keep the lease alive until `release` fires or the lease ends.
pub(crate) async fn heartbeat(
    client: Client,
    environment_id: String,
    work_id: String,
    lease: Arc<Lease>,
    window: SendWindow,
    release: CancellationToken,
) {
    let work = client.work(&environment_id);
    let mut beats = Beats {
        work_id: &work_id,
        expected: NO_HEARTBEAT.to_string(),
        interval: MAX_INTERVAL,
        ttl: ASSUMED_TTL,
        last_ok: Instant::now(),
    };
    loop {
        let beat = tokio::select! {
            _ = release.cancelled() => {
                lease.finish(LeaseEnd::Released);
                return;
            }
            beat = tokio::time::timeout(beats.interval, work.heartbeat(&work_id, &beats.expected, None)) => beat,
        };
        let end = match beat {
            Ok(Ok(hb)) => beats.answered(hb, &window),
            Ok(Err(Error::Api(e))) if e.status == 412 => Some(beats.precondition_failed(&e)),
            Ok(Err(e)) if e.is_permanent() && !is_conflict(&e) => {
                error!(work_id = %work_id, error = %e, "permanent heartbeat failure");
                Some(LeaseEnd::Refused(e.to_string()))
            }
            Ok(Err(e)) => beats.failed(&e.to_string()),
            Err(_) => beats.failed(&format!(
                "no answer within {}ms",
                beats.interval.as_millis()
            )),
        };
        if let Some(end) = end {
            lease.finish(end);
            return;
        }
        tokio::select! {
            _ = release.cancelled() => {
                lease.finish(LeaseEnd::Released);
                return;
            }
            _ = tokio::time::sleep(beats.interval) => {}
        }
    }
}

/// Where one item's heartbeats stand: what the next beat echoes, how often
/// to beat, and how long the lease outlives a silence.
struct Beats<'a> {
    work_id: &'a str,
    /// The server's `last_heartbeat`, echoed as the next beat's precondition.
    expected: String,
    interval: Duration,
    ttl: Duration,
    last_ok: Instant,
}

impl Beats<'_> {
    /// A beat answered: the TTL it grants sets the interval and the send
    /// window. How the lease ends, when the control plane wants the item back.
    fn answered(&mut self, hb: Heartbeat, window: &SendWindow) -> Option<LeaseEnd> {
        self.last_ok = Instant::now();
        self.expected = hb.last_heartbeat;
        if hb.ttl_seconds > 0 {
            self.ttl = Duration::from_secs(hb.ttl_seconds as u64);
            self.interval = (self.ttl / 2).clamp(MIN_INTERVAL, MAX_INTERVAL);
            window.set(self.ttl);
        }
        if matches!(hb.state, WorkState::Stopping | WorkState::Stopped) {
            info!(work_id = %self.work_id, state = hb.state.as_str(), "heartbeat signals shutdown");
            return Some(LeaseEnd::Stopped);
        }
        if !hb.lease_extended {
            warn!(work_id = %self.work_id, "lease not extended, shutting down");
            return Some(LeaseEnd::Stopped);
        }
        None
    }

    /// A 412: another worker owns the item now; the lease is lost.
    fn precondition_failed(&self, e: &ApiError) -> LeaseEnd {
        let current = e
            .details
            .as_ref()
            .and_then(|d| d.get("current_state"))
            .cloned()
            .unwrap_or_default();
        warn!(
            work_id = %self.work_id,
            lease.state = %current.get("state").and_then(|v| v.as_str()).unwrap_or("unknown"),
            lease.ttl_seconds = current.get("ttl_seconds").and_then(|v| v.as_i64()).unwrap_or(0),
            lease.last_heartbeat = %current.get("last_heartbeat").and_then(|v| v.as_str()).unwrap_or(""),
            "lease lost: heartbeat precondition failed"
        );
        LeaseEnd::Lost
    }

    /// A transient failure: the lease is assumed lost once a whole TTL
    /// passed without a successful beat.
    fn failed(&self, why: &str) -> Option<LeaseEnd> {
        warn!(work_id = %self.work_id, error = %why, "transient heartbeat failure");
        if self.last_ok.elapsed() > self.ttl {
            warn!(work_id = %self.work_id, ttl_s = self.ttl.as_secs(), "lease assumed lost: no successful heartbeat in ttl");
            return Some(LeaseEnd::Lost);
        }
        None
    }
}

/// A 409 on a heartbeat is retried like a transient failure.
fn is_conflict(e: &Error) -> bool {
    matches!(e, Error::Api(api) if api.status == 409)
}
