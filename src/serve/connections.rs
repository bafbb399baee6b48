//! The accept loop of container mode: HTTP/1 connections served by hyper,
//! each bounded in time, all bounded in number, so a flood of connections
//! cannot take the descriptors a running session needs for its flush and
//! folder removal, nor keep a signed delivery from being answered.
//!
//! - **Header-read timeout** ([`HEADER_READ_TIMEOUT`], 5 s): a request whose
//!   headers have not all arrived by then is dropped (slowloris). Hyper also
//!   starts this timer when a keep-alive connection waits for its next
//!   request, so an idle keep-alive connection is closed after it as well.
//! - **Idle timeout** ([`IDLE_TIMEOUT`], 15 s): a connection with no request
//!   in the router for that long is closed whatever hyper is doing (a client
//!   that stops reading its answer, for one).
//! - **Connection cap** ([`ConnectionLimits::for_descriptors`]): the soft
//!   descriptor limit minus a reserve of 128 plus 128 per concurrent work
//!   item (never below a quarter of the limit). When the cap is reached the
//!   connection idle the longest (no request in the router: a half-sent
//!   header, a quiet keep-alive) is closed to make room, so a new delivery
//!   still gets in; only when every connection is busy is the new one
//!   refused (closed at once, the sender retries). The loop waits for an
//!   evicted connection's descriptor to be closed before it accepts the
//!   next, so a storm of connects never pushes the open count past the cap.
//!   An `accept` that fails for want of descriptors also frees the
//!   longest-idle connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::Service;
use tracing::{debug, warn};

/// How long a client has to send a request's headers (and, on a
/// keep-alive connection, to start its next request).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection with no request in progress for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(15);
/// Descriptors kept from connections for the process itself (listener,
/// API connections, logs, the runtime).
pub const RESERVE_BASE: u64 = 128;
/// Descriptors kept from connections per concurrent work item (its
/// folders, the agent's shell and pipes, the flush and dispose walks).
pub const RESERVE_PER_ITEM: u64 = 128;
/// The limit assumed when the soft limit is "unlimited".
const UNLIMITED_AS: u64 = 1 << 20;
/// How long connections get to finish their answers at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// At most one warning per this long about refused or evicted connections.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The bounds of the accept loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
}

impl ConnectionLimits {
    /// The cap for a process whose soft descriptor limit is `soft_limit`
    /// (`None`: unlimited) serving `concurrent_items` work items at once:
    /// `limit − (128 + 128 × items)`, never below `limit / 4`.
    pub fn for_descriptors(soft_limit: Option<u64>, concurrent_items: usize) -> Self {
        let limit = soft_limit.unwrap_or(UNLIMITED_AS).min(UNLIMITED_AS);
        let reserve =
            RESERVE_BASE.saturating_add(RESERVE_PER_ITEM.saturating_mul(concurrent_items as u64));
        let cap = limit.saturating_sub(reserve).max(limit / 4).max(1);
        ConnectionLimits {
            max_connections: cap as usize,
            header_read_timeout: HEADER_READ_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
        }
    }
}

/// One open connection, as the accept loop sees it.
struct Conn {
    /// Requests in the router now.
    in_flight: usize,
    /// Since when no request has been in the router.
    idle_since: Instant,
    /// Closes the connection at once (eviction).
    close: CancellationToken,
    /// Already told to close: no longer counted against the cap.
    closing: bool,
}

/// The open connections.
#[derive(Default)]
struct Tracker {
    conns: Mutex<HashMap<u64, Conn>>,
    next_id: AtomicU64,
    /// Fires whenever a connection's task ends (its descriptor is closed).
    closed: tokio::sync::Notify,
}

impl Tracker {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Conn>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn open(&self) -> (u64, CancellationToken) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let close = CancellationToken::new();
        self.lock().insert(
            id,
            Conn {
                in_flight: 0,
                idle_since: Instant::now(),
                close: close.clone(),
                closing: false,
            },
        );
        (id, close)
    }

    fn closed(&self, id: u64) {
        self.lock().remove(&id);
        self.closed.notify_waiters();
    }

    /// Open connections (each holds a descriptor until its task ends), and
    /// how many of them are already told to close.
    fn counts(&self) -> (usize, usize) {
        let conns = self.lock();
        (conns.len(), conns.values().filter(|c| c.closing).count())
    }

    /// Wait until a connection closes (or `at_most` passes).
    async fn wait_for_a_close(&self, at_most: Duration) {
        let closed = self.closed.notified();
        let _ = tokio::time::timeout(at_most, closed).await;
    }

    fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Close the connection idle the longest; `false` if every one is busy.
    fn evict_longest_idle(&self) -> bool {
        let mut conns = self.lock();
        let victim = conns
            .values_mut()
            .filter(|c| !c.closing && c.in_flight == 0)
            .min_by_key(|c| c.idle_since);
        match victim {
            Some(c) => {
                c.closing = true;
                c.close.cancel();
                true
            }
            None => false,
        }
    }

    fn request_started(self: &Arc<Self>, id: u64) -> InFlight {
        if let Some(c) = self.lock().get_mut(&id) {
            c.in_flight += 1;
        }
        InFlight {
            tracker: self.clone(),
            id,
        }
    }

    /// When the connection's idle timeout runs out (`None`: a request is in the router).
    fn idle_deadline(&self, id: u64, idle_timeout: Duration) -> Option<Instant> {
        self.lock()
            .get(&id)
            .filter(|c| c.in_flight == 0)
            .map(|c| c.idle_since + idle_timeout)
    }
}

/// A request in the router; its drop makes the connection idle again.
struct InFlight {
    tracker: Arc<Tracker>,
    id: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(c) = self.tracker.lock().get_mut(&self.id) {
            c.in_flight = c.in_flight.saturating_sub(1);
            if c.in_flight == 0 {
                c.idle_since = Instant::now();
            }
        }
    }
}

/// Rate-limits a warning to one per [`WARN_EVERY`], counting what it skipped.
struct Throttled {
    last: Option<Instant>,
    skipped: u64,
}

impl Throttled {
    fn ready(&mut self) -> Option<u64> {
        if self.last.is_some_and(|t| t.elapsed() < WARN_EVERY) {
            self.skipped += 1;
            return None;
        }
        self.last = Some(Instant::now());
        Some(std::mem::take(&mut self.skipped))
    }
}

/// Serve `router` on `listener` within `limits` until `stop` fires; then
/// stop accepting, let open connections finish their answers (at most
/// 5 s) and return.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    stop: CancellationToken,
) {
    let tracker = Arc::new(Tracker::default());
    let graceful = CancellationToken::new();
    let mut full = Throttled {
        last: None,
        skipped: 0,
    };
    let mut no_fds = Throttled {
        last: None,
        skipped: 0,
    };
    loop {
        // Make room before accepting: an evicted connection's descriptor is
        // freed only when its task ends, so wait for that (briefly) instead
        // of accepting past the cap. If every connection is busy, accept
        // anyway and refuse the newcomer at once.
        let mut all_busy = false;
        loop {
            let (open, closing) = tracker.counts();
            if open < limits.max_connections {
                break;
            }
            if closing == 0 {
                let evicted = tracker.evict_longest_idle();
                if let Some(skipped) = full.ready() {
                    warn!(
                        connections.max = limits.max_connections,
                        evicted_idle_connection = evicted,
                        warnings_skipped = skipped,
                        "connection cap reached; closing the longest-idle connection"
                    );
                }
                if !evicted {
                    all_busy = true;
                    break;
                }
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tracker.wait_for_a_close(Duration::from_millis(50)) => {}
            }
        }
        if stop.is_cancelled() {
            break;
        }
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                // Out of descriptors (or another transient error): free the
                // longest-idle connection and try again shortly.
                let freed = tracker.evict_longest_idle();
                if let Some(skipped) = no_fds.ready() {
                    warn!(error = %e, freed_idle_connection = freed, warnings_skipped = skipped, "cannot accept a connection");
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if all_busy && tracker.counts().0 >= limits.max_connections {
            // Every connection is busy: refuse this one now (the sender retries).
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve_connection(
            stream,
            router.clone(),
            limits,
            tracker.clone(),
            graceful.clone(),
        ));
    }
    drop(listener);
    graceful.cancel();
    let drained = async {
        while !tracker.is_empty() {
            // Re-checked now and then: a close may slip between the check and the wait.
            tracker.wait_for_a_close(Duration::from_millis(100)).await;
        }
    };
    if tokio::time::timeout(SHUTDOWN_GRACE, drained).await.is_err() {
        debug!(
            grace_s = SHUTDOWN_GRACE.as_secs(),
            "connections still open after the shutdown grace; closing them"
        );
        for c in tracker.lock().values() {
            c.close.cancel();
        }
    }
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    router: Router,
    limits: ConnectionLimits,
    tracker: Arc<Tracker>,
    graceful: CancellationToken,
) {
    let (id, close) = tracker.open();
    let requests = tracker.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let in_flight = requests.request_started(id);
        // `Router` is always ready: calling it without `poll_ready` is fine.
        let mut router = router.clone();
        async move {
            let response = router.call(request).await;
            drop(in_flight);
            response
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    let mut shutting_down = false;
    loop {
        let idle_until = tracker
            .idle_deadline(id, limits.idle_timeout)
            .unwrap_or_else(|| Instant::now() + limits.idle_timeout);
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    debug!(error = %e, "connection ended with an error");
                }
                break;
            }
            // Evicted to make room, or the shutdown grace ran out: close now.
            _ = close.cancelled() => break,
            _ = graceful.cancelled(), if !shutting_down => {
                shutting_down = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = tokio::time::sleep_until(idle_until.into()) => {
                if tracker
                    .idle_deadline(id, limits.idle_timeout)
                    .is_some_and(|at| at <= Instant::now())
                {
                    debug!(idle_timeout_ms = limits.idle_timeout.as_millis() as u64, "closing an idle connection");
                    break;
                }
            }
        }
    }
    tracker.closed(id);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_keeps_a_reserve_per_item_and_never_falls_below_a_quarter() {
        let cap = |limit, items| ConnectionLimits::for_descriptors(limit, items).max_connections;
        assert_eq!(cap(Some(1024), 1), 1024 - 256);
        assert_eq!(cap(Some(1024), 2), 1024 - 384);
        // A large reserve: a quarter of the limit still serves connections.
        assert_eq!(cap(Some(1024), 64), 256);
        assert_eq!(cap(Some(65_536), 4), 65_536 - 640);
        assert_eq!(cap(None, 1), (1 << 20) - 256);
        assert_eq!(cap(Some(0), 1), 1);
    }

    #[test]
    fn eviction_picks_the_longest_idle_connection_never_a_busy_one() {
        let tracker = Arc::new(Tracker::default());
        let (busy, busy_close) = tracker.open();
        let _request = tracker.request_started(busy);
        let (old, old_close) = tracker.open();
        std::thread::sleep(Duration::from_millis(5));
        let (_new, new_close) = tracker.open();
        assert_eq!(tracker.counts(), (3, 0));
        assert!(tracker.evict_longest_idle());
        assert!(old_close.is_cancelled() && !new_close.is_cancelled());
        assert!(!busy_close.is_cancelled());
        assert_eq!(tracker.counts(), (3, 1), "open until its task ends");
        assert!(tracker.evict_longest_idle());
        assert!(!tracker.evict_longest_idle(), "only the busy one is left");
        tracker.closed(old);
        assert_eq!(tracker.counts(), (2, 1));
        assert_eq!(tracker.idle_deadline(busy, IDLE_TIMEOUT), None);
    }
}
