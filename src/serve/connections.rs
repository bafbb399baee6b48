//! The accept loop of container mode: HTTP/1 connections served by hyper,
//! each bounded in time, all bounded in number, so a flood of connections
//! cannot take the descriptors a running session needs for its flush and
//! folder removal, nor keep a signed delivery from being answered.
//!
//! - **Header-read timeout** ([`HEADER_READ_TIMEOUT`], 5 s): a request whose
//!   headers have not all arrived by then is dropped (slowloris). Hyper also
//!   starts this timer when a keep-alive connection waits for its next
//!   request, so an idle keep-alive connection is closed after it as well.
//! - **Header buffer** ([`MAX_BUF_BYTES`], 32 KiB): the most hyper buffers
//!   for one connection's request head (a larger head is refused), so a
//!   full house of slowloris connections holds at most
//!   `MAX_CONNECTIONS × 32 KiB` (128 MiB), not hyper's default ~400 KiB each.
//!   Bodies are streamed through this buffer, not held in it.
//! - **Body-read timeout** ([`BODY_READ_TIMEOUT`], 5 s): a request whose
//!   body has not all arrived this long after its headers closes its
//!   connection (a trickled body). Until its body is complete a request
//!   does not make its connection busy: the signature is checked only over
//!   the whole body, so an unauthenticated sender cannot hold a slot that
//!   way either.
//! - **Idle timeout** ([`IDLE_TIMEOUT`], 15 s): a connection with no request
//!   in the router for that long is closed whatever hyper is doing (a client
//!   that stops reading its answer, for one).
//! - **Connection cap** ([`ConnectionLimits::for_descriptors`]): the soft
//!   descriptor limit minus a reserve of 128 plus 128 per concurrent work
//!   item (never below a quarter of the limit), and never above
//!   [`MAX_CONNECTIONS`] (4,096) whatever the limit (Docker's default hard
//!   limit is 1,048,576: memory, not descriptors, would run out first). A
//!   connection counts against the cap from its `accept`. When the cap is
//!   reached the connection idle the longest (no request in the router, or
//!   one whose body is still arriving: a half-sent header, a quiet
//!   keep-alive, a trickled body) is closed to make room, so a new delivery
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
use axum::body::HttpBody as _;
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
/// How long a request's body may take to arrive once its headers have
/// (a webhook body is at most 256 KiB, sent at once).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The most connections served at once, whatever the descriptor limit:
/// each costs memory (up to [`MAX_BUF_BYTES`] of buffered head, a task),
/// and a webhook receiver needs a handful.
pub const MAX_CONNECTIONS: usize = 4096;
/// The largest read buffer hyper keeps per connection (its minimum is
/// 8 KiB); a request head that does not fit is refused.
pub const MAX_BUF_BYTES: usize = 32 * 1024;
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
    pub(crate) max_connections: usize,
    pub(crate) header_read_timeout: Duration,
    pub(crate) body_read_timeout: Duration,
    pub(crate) idle_timeout: Duration,
}

impl ConnectionLimits {
    /// The cap for a process whose soft descriptor limit is `soft_limit`
    /// (`None`: unlimited) serving `concurrent_items` work items at once:
    /// `limit − (128 + 128 × items)`, never below `limit / 4`, never above
    /// [`MAX_CONNECTIONS`].
    pub fn for_descriptors(soft_limit: Option<u64>, concurrent_items: usize) -> Self {
        let limit = soft_limit.unwrap_or(UNLIMITED_AS).min(UNLIMITED_AS);
        let reserve =
            RESERVE_BASE.saturating_add(RESERVE_PER_ITEM.saturating_mul(concurrent_items as u64));
        let cap = limit
            .saturating_sub(reserve)
            .max(limit / 4)
            .min(MAX_CONNECTIONS as u64)
            .max(1);
        ConnectionLimits {
            max_connections: cap as usize,
            header_read_timeout: HEADER_READ_TIMEOUT,
            body_read_timeout: BODY_READ_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
        }
    }
}

/// One open connection, as the accept loop sees it.
struct Conn {
    /// Requests in the router now.
    in_flight: usize,
    /// Of those, the ones whose body is still arriving, and since when
    /// (the first of them; HTTP/1 has one at a time).
    reading_body: usize,
    body_since: Instant,
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
    /// The most connections open at once (for tests).
    #[cfg(test)]
    peak: std::sync::atomic::AtomicUsize,
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
        let now = Instant::now();
        let mut conns = self.lock();
        conns.insert(
            id,
            Conn {
                in_flight: 0,
                reading_body: 0,
                body_since: now,
                idle_since: now,
                close: close.clone(),
                closing: false,
            },
        );
        #[cfg(test)]
        self.peak.fetch_max(conns.len(), Ordering::Relaxed);
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
            .filter(|c| !c.closing && c.in_flight == c.reading_body)
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

    /// A request entered the router; `body_pending`: its body has yet to
    /// arrive (until [`BodyRead`] says it has, the connection is evictable).
    fn request_started(self: &Arc<Self>, id: u64, body_pending: bool) -> (InFlight, BodyRead) {
        if let Some(c) = self.lock().get_mut(&id) {
            c.in_flight += 1;
            if body_pending {
                if c.reading_body == 0 {
                    c.body_since = Instant::now();
                }
                c.reading_body += 1;
            }
        }
        let in_flight = InFlight {
            tracker: self.clone(),
            id,
        };
        let body = BodyRead {
            tracker: body_pending.then(|| self.clone()),
            id,
        };
        (in_flight, body)
    }

    /// When the connection is to be closed unless something changes:
    /// its idle timeout with no request in the router, its body-read
    /// timeout while a body is arriving; `None` while a request is handled.
    fn deadline(&self, id: u64, limits: &ConnectionLimits) -> Option<Instant> {
        let conns = self.lock();
        let c = conns.get(&id)?;
        if c.in_flight == 0 {
            Some(c.idle_since + limits.idle_timeout)
        } else if c.reading_body > 0 {
            Some(c.body_since + limits.body_read_timeout)
        } else {
            None
        }
    }
}

/// A request body still arriving; dropped (or told) once it has all
/// arrived, failed, or was given up on.
struct BodyRead {
    tracker: Option<Arc<Tracker>>,
    id: u64,
}

impl BodyRead {
    fn done(&mut self) {
        if let Some(tracker) = self.tracker.take()
            && let Some(c) = tracker.lock().get_mut(&self.id)
        {
            c.reading_body = c.reading_body.saturating_sub(1);
        }
    }
}

impl Drop for BodyRead {
    fn drop(&mut self) {
        self.done();
    }
}

/// A request body that tells the tracker when it has all arrived.
struct TrackedBody {
    inner: Incoming,
    read: BodyRead,
}

impl axum::body::HttpBody for TrackedBody {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let frame = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        if let std::task::Poll::Ready(None | Some(Err(_))) = frame {
            this.read.done();
        } else if this.inner.is_end_stream() {
            this.read.done();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
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
#[derive(Default)]
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
    serve_tracked(listener, router, limits, stop, Arc::new(Tracker::default())).await
}

async fn serve_tracked(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    stop: CancellationToken,
    tracker: Arc<Tracker>,
) {
    let graceful = CancellationToken::new();
    let mut full = Throttled::default();
    let mut no_fds = Throttled::default();
    loop {
        let all_busy = make_room(&tracker, limits.max_connections, &stop, &mut full).await;
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
        let (id, close) = tracker.open();
        tokio::spawn(serve_connection(
            stream,
            router.clone(),
            limits,
            tracker.clone(),
            graceful.clone(),
            (id, close),
        ));
    }
    drop(listener);
    graceful.cancel();
    finish_connections(&tracker).await;
}

/// Make room before accepting: an evicted connection's descriptor is freed
/// only when its task ends, so wait for that (briefly) instead of accepting
/// past the cap. `true` when every connection is busy: then accept anyway
/// and refuse the newcomer at once. Returns early when `stop` fires.
async fn make_room(
    tracker: &Tracker,
    max_connections: usize,
    stop: &CancellationToken,
    full: &mut Throttled,
) -> bool {
    loop {
        // Every accepted connection is already counted: it is
        // registered before its task is spawned.
        let (open, closing) = tracker.counts();
        if open < max_connections {
            return false;
        }
        if closing == 0 {
            let evicted = tracker.evict_longest_idle();
            if let Some(skipped) = full.ready() {
                warn!(
                    connections.max = max_connections,
                    evicted_idle_connection = evicted,
                    warnings_skipped = skipped,
                    "connection cap reached; closing the longest-idle connection"
                );
            }
            if !evicted {
                return true;
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return false,
            _ = tracker.wait_for_a_close(Duration::from_millis(50)) => {}
        }
    }
}

/// After the accept loop: let open connections finish their answers, at
/// most [`SHUTDOWN_GRACE`], then close what is left.
async fn finish_connections(tracker: &Tracker) {
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
    (id, close): (u64, CancellationToken),
) {
    let requests = tracker.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let body_pending = !request.body().is_end_stream();
        let (in_flight, read) = requests.request_started(id, body_pending);
        let request = request.map(|inner| TrackedBody { inner, read });
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
        .max_buf_size(MAX_BUF_BYTES)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    let mut shutting_down = false;
    loop {
        let close_at = tracker
            .deadline(id, &limits)
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
            _ = tokio::time::sleep_until(close_at.into()) => {
                if tracker
                    .deadline(id, &limits)
                    .is_some_and(|at| at <= Instant::now())
                {
                    debug!(
                        idle_timeout_ms = limits.idle_timeout.as_millis() as u64,
                        body_read_timeout_ms = limits.body_read_timeout.as_millis() as u64,
                        "closing an idle connection or one whose request body is too slow"
                    );
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
        assert_eq!(cap(Some(4096), 4), 4096 - 640);
        assert_eq!(cap(Some(0), 1), 1);
    }

    #[test]
    fn the_cap_never_exceeds_the_absolute_ceiling_whatever_the_descriptor_limit() {
        let cap = |limit, items| ConnectionLimits::for_descriptors(limit, items).max_connections;
        // Docker's default hard limit, raised to at start.
        assert_eq!(cap(Some(1_048_576), 1), MAX_CONNECTIONS);
        assert_eq!(cap(None, 1), MAX_CONNECTIONS);
        assert_eq!(cap(Some(u64::MAX), 0), MAX_CONNECTIONS);
        // Just above the ceiling plus the reserve, and just below it.
        assert_eq!(cap(Some(4096 + 256 + 1), 1), MAX_CONNECTIONS);
        assert_eq!(cap(Some(4096 + 256 - 1), 1), MAX_CONNECTIONS - 1);
        // A quarter of a huge limit is still capped.
        assert_eq!(cap(Some(1 << 20), 10_000), MAX_CONNECTIONS);
    }

    #[test]
    fn eviction_picks_the_longest_idle_connection_never_a_busy_one() {
        let tracker = Arc::new(Tracker::default());
        let (busy, busy_close) = tracker.open();
        let _request = tracker.request_started(busy, false);
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
        let limits = ConnectionLimits::for_descriptors(Some(1024), 1);
        assert_eq!(tracker.deadline(busy, &limits), None);
    }

    #[test]
    fn a_request_whose_body_is_still_arriving_leaves_its_connection_evictable() {
        let tracker = Arc::new(Tracker::default());
        let limits = ConnectionLimits::for_descriptors(Some(1024), 1);
        let (slow, slow_close) = tracker.open();
        let (_request, _body) = tracker.request_started(slow, true);
        // Reading its body: evictable, and closed at the body deadline.
        let at = tracker.deadline(slow, &limits).unwrap();
        assert!(at <= Instant::now() + BODY_READ_TIMEOUT);
        assert!(tracker.evict_longest_idle());
        assert!(slow_close.is_cancelled());
        // Once the body is in, the request is busy: neither evicted nor timed.
        let (fast, fast_close) = tracker.open();
        let (_request, mut fast_body) = tracker.request_started(fast, true);
        fast_body.done();
        assert_eq!(tracker.deadline(fast, &limits), None);
        assert!(!tracker.evict_longest_idle());
        assert!(!fast_close.is_cancelled());
    }

    /// Connections waiting in the backlog are accepted one after another
    /// without a yield; each must count against the cap from its accept,
    /// not from when its task first runs (before: all 40 were open at once
    /// with a cap of 4).
    #[tokio::test]
    async fn a_full_backlog_never_pushes_the_open_count_past_the_cap() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let backlog: Vec<std::net::TcpStream> = (0..40)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let limits = ConnectionLimits {
            max_connections: 4,
            ..ConnectionLimits::for_descriptors(Some(1024), 1)
        };
        let tracker = Arc::new(Tracker::default());
        let stop = CancellationToken::new();
        let served = tokio::spawn(serve_tracked(
            listener,
            Router::new(),
            limits,
            stop.clone(),
            tracker.clone(),
        ));
        // Every connection gets accepted (evicting the longest idle) in time.
        let deadline = Instant::now() + Duration::from_secs(10);
        while tracker.next_id.load(Ordering::Relaxed) < 40 {
            assert!(Instant::now() < deadline, "the backlog is not drained");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.cancel();
        served.await.unwrap();
        drop(backlog);
        let peak = tracker.peak.load(Ordering::Relaxed);
        assert!(peak <= 4, "{peak} connections open at once, cap 4");
    }
}
