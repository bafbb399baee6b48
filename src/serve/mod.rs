//! The HTTP face of envworker: one webhook route per configured endpoint,
//! health and readiness, and what happens after a delivery is accepted.
//!
//! `POST /webhooks/{name}` verifies the delivery over its raw body (any of
//! the endpoint's keys, any `v1` signature, ±5 min), ignores every event
//! but `session.status_run_started` (200 `ignored`), answers a replayed
//! `webhook-id` without working twice (200 `duplicate`), and otherwise
//! answers 202 `accepted` at once and drains the endpoint's queue:
//!
//! - in a container, a background task per endpoint drains while the
//!   process lives (and once at start, for work already queued, and every
//!   `--queue-check-interval` while idle, for work whose delivery was lost);
//!   a delivery arriving mid-drain wakes it to claim into a free slot, or
//!   makes it poll once more when its items are done;
//! - on Lambda ([`lambda`]) the response goes out first and the drain runs
//!   inside the same invocation, ending in time for its teardown; a
//!   scheduled event drains every endpoint the same way.
//!
//! `/readyz` answers 503 with a JSON body naming each unready endpoint and
//! why: its environment key refused, or the API unreachable for longer than
//! `--unready-after` ([`health`]).
//!
//! On shutdown new deliveries get 503 (the sender retries them elsewhere),
//! `/readyz` turns 503, running items are cancelled — their final flush
//! still runs within its bounds — and the process exits once they are done.

pub(crate) mod connections;
pub mod health;
pub mod lambda;
pub mod replay;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, warn};

use crate::metrics::Metrics;
use crate::telemetry::Parent;
use crate::webhook::{self, SigningKey, WebhookHeaders};
use crate::worker::EnvironmentWorker;
use crate::worker::poll::DrainOptions;

use self::replay::ReplayFilter;

/// Largest webhook body accepted (a thin event is a few hundred bytes).
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// Bound of one HTTP request (the work runs after the answer).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The only event that means "there is work".
pub const RUN_STARTED: &str = "session.status_run_started";

/// One configured endpoint, ready to serve.
pub struct Endpoint {
    pub(crate) name: String,
    pub(crate) keys: Vec<SigningKey>,
    pub(crate) worker: EnvironmentWorker,
    pub(crate) drain: DrainOptions,
    /// A delivery arrived since the running drain last found the queue empty.
    dirty: AtomicBool,
    /// A drain task is running (container mode).
    draining: AtomicBool,
    /// Readiness: the probe's rate limit, the outage log.
    health: health::Watch,
}

impl Endpoint {
    pub fn new(
        name: impl Into<String>,
        keys: Vec<SigningKey>,
        worker: EnvironmentWorker,
        mut drain: DrainOptions,
    ) -> Self {
        drain
            .wake
            .get_or_insert_with(|| Arc::new(tokio::sync::Notify::new()));
        Endpoint {
            name: name.into(),
            keys,
            worker,
            drain,
            dirty: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            health: health::Watch::default(),
        }
    }
}

/// How accepted work runs.
#[derive(Clone)]
pub enum Mode {
    /// A long-lived process: drains run as background tasks.
    Container,
    /// Inside the current Lambda invocation (see [`lambda`]).
    Lambda(lambda::InvocationWork),
}

/// Shared by every request.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Shared>,
}

struct Shared {
    endpoints: HashMap<String, Arc<Endpoint>>,
    mode: Mode,
    /// Fires when shutdown begins: deliveries get 503, running items end.
    shutdown: CancellationToken,
    tasks: TaskTracker,
    replay: Mutex<ReplayFilter>,
    metrics: Arc<Metrics>,
    /// When the queue depths were last read: scrapes share one read per
    /// [`QUEUE_STATS_MAX_AGE`], so `/metrics` cannot drive the API's rate limit.
    queue_stats_read: tokio::sync::Mutex<Option<Instant>>,
    queue_stats_max_age: Mutex<Duration>,
    /// Containers: how often an idle endpoint looks at its queue unprompted.
    queue_check_interval: Mutex<Option<Duration>>,
    /// How long the API may be unreachable before `/readyz` says so.
    unready_after: Mutex<Duration>,
    /// The endpoints whose look at their queue at start has not ended yet;
    /// [`Shared::looked_at_start`] fires when none is left.
    start_looks_left: std::sync::atomic::AtomicUsize,
    looked_at_start: CancellationToken,
}

impl Shared {
    fn start_look_ended(&self) {
        if self.start_looks_left.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.looked_at_start.cancel();
        }
    }
}

/// What made a drain start: logged when the drain finds work no webhook
/// announced, which means a delivery was lost or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A webhook delivery.
    Webhook,
    /// The process started (work may already wait).
    Start,
    /// The periodic look of an idle endpoint (`--queue-check-interval`).
    QueueCheck,
    /// EventBridge's scheduled event (Lambda).
    Schedule,
}

impl Trigger {
    fn as_str(self) -> &'static str {
        match self {
            Trigger::Webhook => "webhook",
            Trigger::Start => "start",
            Trigger::QueueCheck => "queue_check",
            Trigger::Schedule => "schedule",
        }
    }
}

impl AppState {
    /// A state with its own (fresh) metrics.
    pub fn new(endpoints: Vec<Endpoint>, mode: Mode) -> Self {
        Self::with_metrics(endpoints, mode, Arc::default())
    }

    /// A state exporting `metrics`, which the endpoints' workers also feed
    /// (one of their `crate::worker::WorkerOptions::observers`).
    pub fn with_metrics(endpoints: Vec<Endpoint>, mode: Mode, metrics: Arc<Metrics>) -> Self {
        let looked_at_start = CancellationToken::new();
        let endpoints_len = endpoints.len();
        if endpoints_len == 0 {
            looked_at_start.cancel();
        }
        AppState {
            inner: Arc::new(Shared {
                endpoints: endpoints
                    .into_iter()
                    .map(|e| (e.name.clone(), Arc::new(e)))
                    .collect(),
                mode,
                shutdown: CancellationToken::new(),
                tasks: TaskTracker::new(),
                replay: Mutex::new(ReplayFilter::default()),
                metrics,
                queue_stats_read: tokio::sync::Mutex::new(None),
                queue_stats_max_age: Mutex::new(QUEUE_STATS_MAX_AGE),
                queue_check_interval: Mutex::new(None),
                unready_after: Mutex::new(health::DEFAULT_UNREADY_AFTER),
                start_looks_left: std::sync::atomic::AtomicUsize::new(endpoints_len),
                looked_at_start,
            }),
        }
    }

    /// How long scrapes reuse the last queue depths (default [`QUEUE_STATS_MAX_AGE`]).
    pub fn set_queue_stats_max_age(&self, max_age: Duration) {
        *self
            .inner
            .queue_stats_max_age
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = max_age;
    }

    /// Containers: look at every idle endpoint's queue this often without a
    /// webhook (`None`, the default here: only webhooks and the start do).
    pub fn set_queue_check_interval(&self, every: Option<Duration>) {
        *self
            .inner
            .queue_check_interval
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = every;
    }

    fn queue_check_interval(&self) -> Option<Duration> {
        *self
            .inner
            .queue_check_interval
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// How long an endpoint's API may be unreachable before `/readyz`
    /// answers 503 (default [`health::DEFAULT_UNREADY_AFTER`]); `/readyz`
    /// probes an idle endpoint at [`health::probe_every`] of it.
    pub fn set_unready_after(&self, after: Duration) {
        *self
            .inner
            .unready_after
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = after;
    }

    fn unready_after(&self) -> Duration {
        *self
            .inner
            .unready_after
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    pub fn endpoint_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.inner.endpoints.keys().cloned().collect();
        names.sort();
        names
    }

    /// Begin shutdown: refuse new deliveries and end running items.
    pub fn begin_shutdown(&self) {
        self.inner.shutdown.cancel();
    }

    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutdown.is_cancelled()
    }

    /// Wait for every drain to finish (after [`begin_shutdown`](Self::begin_shutdown)
    /// they end early, each item still flushing). `false` if `grace` ran out first.
    pub async fn wait_for_work(&self, grace: Duration) -> bool {
        self.inner.tasks.close();
        let done = tokio::time::timeout(grace, self.inner.tasks.wait())
            .await
            .is_ok();
        self.inner.tasks.reopen();
        done
    }

    /// Start draining `endpoint` in the background, or tell the running
    /// drain to poll once more when it is done.
    /// `parent` is the delivery's span (none for a start or a queue check):
    /// the drain it starts is that span's child in the trace.
    fn kick(&self, endpoint: Arc<Endpoint>, trigger: Trigger, parent: Parent) {
        endpoint.dirty.store(true, Ordering::SeqCst);
        // A running drain with a free slot polls again at once.
        if let Some(wake) = &endpoint.drain.wake {
            wake.notify_one();
        }
        if endpoint.draining.swap(true, Ordering::SeqCst) {
            return;
        }
        let cancel = self.inner.shutdown.clone();
        let inner = self.inner.clone();
        let mut parent = parent;
        self.inner.tasks.spawn(async move {
            // Drains after the first were asked for by deliveries meanwhile.
            let mut trigger = trigger;
            loop {
                while endpoint.dirty.swap(false, Ordering::SeqCst) && !cancel.is_cancelled() {
                    let options = endpoint.drain.clone();
                    run_drain(&endpoint, cancel.clone(), options, trigger, &parent).await;
                    if trigger == Trigger::Start {
                        inner.start_look_ended();
                    }
                    trigger = Trigger::Webhook;
                    parent = Parent::none();
                }
                endpoint.draining.store(false, Ordering::SeqCst);
                // A delivery may have set `dirty` after the last check: take the drain back.
                if !endpoint.dirty.load(Ordering::SeqCst)
                    || cancel.is_cancelled()
                    || endpoint.draining.swap(true, Ordering::SeqCst)
                {
                    return;
                }
            }
        });
    }

    /// Resolves once every endpoint's look at its queue at start (the
    /// drain [`serve_container`] kicks) has ended: the start-up is done,
    /// and what a replica starts ahead of its first session (processes of
    /// its own) no longer takes a core from it.
    pub fn looked_at_start(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let done = self.inner.looked_at_start.clone();
        async move { done.cancelled().await }
    }

    /// Look at every idle endpoint's queue every `every` until shutdown; a
    /// drain already running is woken to fill a free slot.
    fn check_queues_periodically(&self, every: Duration) {
        let state = self.clone();
        let cancel = self.inner.shutdown.clone();
        self.inner.tasks.spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                }
                for endpoint in state.inner.endpoints.values() {
                    if endpoint.draining.load(Ordering::SeqCst) {
                        if let Some(wake) = &endpoint.drain.wake {
                            wake.notify_one();
                        }
                    } else {
                        tracing::debug!(endpoint = %endpoint.name, "periodic queue check");
                        state.kick(endpoint.clone(), Trigger::QueueCheck, Parent::none());
                    }
                }
            }
        });
    }
}

/// One drain of an endpoint's queue, logged; work found without a webhook
/// (a periodic check, a schedule) is a warning: a delivery went missing.
///
/// Its span (`drain`) is the parent of the items it serves; in the trace
/// its parent is `parent`, the delivery that started it (when there is
/// one), without keeping that span open until the drain ends.
pub async fn run_drain(
    endpoint: &Endpoint,
    cancel: CancellationToken,
    options: DrainOptions,
    trigger: Trigger,
    parent: &Parent,
) {
    let span = tracing::info_span!(
        parent: None,
        "drain",
        endpoint = %endpoint.name,
        trigger = trigger.as_str(),
        items = tracing::field::Empty,
        duration_ms = tracing::field::Empty,
    );
    parent.adopt(&span);
    drain_once(endpoint, cancel, options, trigger)
        .instrument(span)
        .await
}

async fn drain_once(
    endpoint: &Endpoint,
    cancel: CancellationToken,
    options: DrainOptions,
    trigger: Trigger,
) {
    let started = Instant::now();
    let span = tracing::Span::current();
    let result = endpoint.worker.drain(cancel, options).await;
    span.record("duration_ms", started.elapsed().as_millis() as u64);
    match result {
        Ok(report) => {
            let items = report.items.len();
            span.record("items", items as u64);
            if items > 0 && matches!(trigger, Trigger::QueueCheck | Trigger::Schedule) {
                warn!(
                    endpoint = %endpoint.name,
                    items,
                    trigger = trigger.as_str(),
                    "the queue check found work no webhook announced (a delivery was lost or refused); served it"
                );
            }
            info!(
                endpoint = %endpoint.name,
                items,
                trigger = trigger.as_str(),
                duration_ms = started.elapsed().as_millis() as u64,
                "queue drained"
            );
        }
        Err(e) => warn!(endpoint = %endpoint.name, error = %e, "drain failed"),
    }
}

/// The router: webhooks, health, readiness.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/webhooks/{endpoint}", post(webhook))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(
            MAX_BODY_BYTES,
        ))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        ))
        .with_state(state)
}

/// `{"status": "ready" | "unready" | "shutting_down", "endpoints": {name: …}}`:
/// 200 when every endpoint is ready, else 503 (see [`health`]).
async fn ready(State(state): State<AppState>) -> Response {
    if state.is_shutting_down() {
        return answer(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "shutting_down"}),
        );
    }
    let unready_after = state.unready_after();
    let every = health::probe_every(unready_after);
    let probes: Vec<_> = state
        .inner
        .endpoints
        .values()
        .filter_map(|endpoint| health::Watch::probe_if_due(endpoint, every))
        .collect();
    if !probes.is_empty() {
        let _ = tokio::time::timeout(health::PROBE_WAIT, futures::future::join_all(probes)).await;
    }
    let now = tokio::time::Instant::now();
    let mut all_ready = true;
    let mut endpoints = serde_json::Map::new();
    for name in state.endpoint_names() {
        let endpoint = &state.inner.endpoints[&name];
        let (ready, body) =
            endpoint
                .health
                .report(&name, &endpoint.worker.standing(), now, unready_after);
        all_ready &= ready;
        let mut body = body;
        if let Some(fields) = body.as_object_mut() {
            // What the shell's sandbox enforces: information, never the status.
            let options = endpoint.worker.options();
            let described = match &options.shell_sandbox {
                Some(enforcement) => enforcement.describe_now(),
                None => crate::sandbox::Described::off(crate::sandbox::Capabilities {
                    landlock_abi: crate::sandbox::probe::landlock_abi(),
                    namespaces: false,
                }),
            };
            fields.insert("shell_sandbox".into(), json!(described));
        }
        endpoints.insert(name, body);
    }
    let (status, word) = if all_ready {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "unready")
    };
    answer(status, json!({"status": word, "endpoints": endpoints}))
}

/// How long a scrape waits for the queue stats of the endpoints.
const QUEUE_STATS_TIMEOUT: Duration = Duration::from_secs(2);
/// Scrapes within this long of a read reuse its depths.
pub const QUEUE_STATS_MAX_AGE: Duration = Duration::from_secs(5);

async fn metrics(State(state): State<AppState>) -> Response {
    // Queue depth is the scaling signal (KEDA): read every endpoint at once,
    // at most once per max age whatever the scrape rate (one read in flight).
    let mut last_read = state.inner.queue_stats_read.lock().await;
    let max_age = *state
        .inner
        .queue_stats_max_age
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if last_read.is_none_or(|at| at.elapsed() >= max_age) {
        read_queue_depths(&state).await;
        *last_read = Some(Instant::now());
    }
    drop(last_read);
    (
        [(
            axum::http::header::CONTENT_TYPE,
            crate::metrics::CONTENT_TYPE,
        )],
        state.inner.metrics.render(),
    )
        .into_response()
}

async fn read_queue_depths(state: &AppState) {
    let reads = state.inner.endpoints.values().map(|endpoint| async move {
        match tokio::time::timeout(QUEUE_STATS_TIMEOUT, endpoint.worker.queue_stats()).await {
            Ok(Ok(stats)) => Some((endpoint.name.as_str(), stats.depth)),
            Ok(Err(e)) => {
                warn!(endpoint = %endpoint.name, error = %e, "cannot read the work queue stats");
                None
            }
            Err(_) => {
                warn!(endpoint = %endpoint.name, timeout_ms = QUEUE_STATS_TIMEOUT.as_millis() as u64, "cannot read the work queue stats: no answer in time");
                None
            }
        }
    });
    for (name, depth) in futures::future::join_all(reads).await.into_iter().flatten() {
        state.inner.metrics.set_queue_depth(name, depth);
    }
}

/// The replay filter's key: per endpoint, as the same event reaches every
/// endpoint subscribed to it.
fn replay_key(endpoint: &str, id: &str) -> String {
    format!("{endpoint}\n{id}")
}

/// 503 with `retry-after`: the sender delivers again later (elsewhere).
fn shutting_down() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [("retry-after", "5")],
        axum::Json(json!({"error": "shutting down; retry later"})),
    )
        .into_response()
}

fn answer(status: StatusCode, body: serde_json::Value) -> Response {
    (status, axum::Json(body)).into_response()
}

/// The thin event a webhook carries.
#[derive(Debug, Deserialize)]
struct WebhookEvent {
    #[serde(rename = "type")]
    kind: String,
    data: WebhookData,
}

#[derive(Debug, Deserialize)]
struct WebhookData {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    id: Option<String>,
}

/// Unix seconds now.
fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

/// What a delivery led to, before any work starts.
pub enum Verdict {
    Respond(Response),
    /// Verified, new, and a run started: work to do for this endpoint.
    Work(Arc<Endpoint>, Response),
}

/// Check one delivery: endpoint, signature, event type, replay, shutdown.
pub fn judge(state: &AppState, name: &str, headers: &HeaderMap, body: &[u8]) -> Verdict {
    let count = |outcome: &'static str| state.inner.metrics.webhook(name, outcome);
    let Some(endpoint) = state.inner.endpoints.get(name).cloned() else {
        state.inner.metrics.webhook("unknown", "not_found");
        return Verdict::Respond(answer(
            StatusCode::NOT_FOUND,
            json!({"error": format!("no webhook endpoint named {name:?}")}),
        ));
    };
    let id = match webhook::verify(
        &endpoint.keys,
        WebhookHeaders::from_http(headers),
        body,
        now_unix(),
    ) {
        Ok(id) => id.to_string(),
        Err(e) => {
            warn!(endpoint = %name, error = %e, "webhook refused");
            count("unauthorized");
            return Verdict::Respond(answer(
                StatusCode::UNAUTHORIZED,
                json!({"error": e.to_string()}),
            ));
        }
    };
    let event: WebhookEvent = match serde_json::from_slice(body) {
        Ok(event) => event,
        Err(e) => {
            warn!(endpoint = %name, webhook.id = %id, error = %e, "webhook body is not an event");
            count("bad_request");
            return Verdict::Respond(answer(
                StatusCode::BAD_REQUEST,
                json!({"error": format!("the body is not a webhook event: {e}")}),
            ));
        }
    };
    if event.kind != "event" || event.data.kind != RUN_STARTED {
        info!(endpoint = %name, webhook.id = %id, event.type = %event.data.kind, "webhook ignored");
        count("ignored");
        return Verdict::Respond(answer(StatusCode::OK, json!({"status": "ignored"})));
    }
    if state.is_shutting_down() {
        count("shutting_down");
        return Verdict::Respond(shutting_down());
    }
    {
        let mut replay = state.inner.replay.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        // Per endpoint: the same event reaches every endpoint subscribed to it.
        let seen = replay_key(name, &id);
        if replay.contains(&seen, now) {
            info!(endpoint = %name, webhook.id = %id, "webhook already accepted; not starting work again");
            count("duplicate");
            return Verdict::Respond(answer(StatusCode::OK, json!({"status": "duplicate"})));
        }
        replay.record(&seen, now);
    }
    info!(
        endpoint = %name,
        webhook.id = %id,
        session_id = %event.data.id.as_deref().unwrap_or(""),
        "webhook accepted; draining the queue"
    );
    count("accepted");
    Verdict::Work(
        endpoint,
        answer(StatusCode::ACCEPTED, json!({"status": "accepted"})),
    )
}

/// One delivery, in its span (`webhook`): a child of the sender's trace
/// when the request carries W3C trace context (`traceparent`), and the
/// parent of the drain it starts.
async fn webhook(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let span = tracing::info_span!(
        "webhook",
        endpoint = %name,
        webhook.id = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    );
    // The signature first: only a delivery that verifies may place its span
    // in the sender's trace (an unsigned flood must not choose trace ids, nor
    // force sampling with a `…-01` flag). The span is not entered before.
    let verdict = judge(&state, &name, &headers, &body);
    if matches!(verdict, Verdict::Work(..)) {
        crate::telemetry::adopt_remote_parent(&span, &headers);
    }
    let response = span.in_scope(|| deliver(&state, &name, &headers, verdict, &span));
    span.record("http.response.status_code", response.status().as_u16());
    response
}

fn deliver(
    state: &AppState,
    name: &str,
    headers: &HeaderMap,
    verdict: Verdict,
    span: &tracing::Span,
) -> Response {
    match verdict {
        Verdict::Respond(r) => r,
        Verdict::Work(endpoint, r) => {
            if let Some(id) = WebhookHeaders::from_http(headers).id {
                span.record("webhook.id", id);
            }
            match &state.inner.mode {
                Mode::Container => state.kick(endpoint, Trigger::Webhook, Parent::of(span)),
                Mode::Lambda(work) => work.start(
                    endpoint,
                    state.inner.shutdown.clone(),
                    Trigger::Webhook,
                    Parent::of(span),
                ),
            }
            // Shutdown began between the check and the start: the drain will
            // not run, so let the sender retry (and forget we saw the id).
            if state.is_shutting_down() {
                if let Some(id) = WebhookHeaders::from_http(headers).id {
                    state
                        .inner
                        .replay
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .forget(&replay_key(name, id));
                }
                return shutting_down();
            }
            r
        }
    }
}

/// Serve `app` on `listener` until `shutdown` resolves; then refuse new
/// deliveries, end running items (their teardown still runs) and wait up
/// to `grace` for them before returning.
pub async fn serve_container(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<bool> {
    let stop_http = CancellationToken::new();
    // Connections are capped below the descriptor limit, keeping a reserve
    // for every item that can run at once (its flush and dispose need fds).
    let concurrent_items = state
        .inner
        .endpoints
        .values()
        .map(|e| e.drain.max_concurrent_items.max(1))
        .sum();
    let limits = connections::ConnectionLimits::for_descriptors(
        crate::fdlimit::soft_limit(),
        concurrent_items,
    );
    info!(
        connections.max = limits.max_connections,
        header_read_timeout_ms = limits.header_read_timeout.as_millis() as u64,
        idle_timeout_ms = limits.idle_timeout.as_millis() as u64,
        "connection limits"
    );
    let server = tokio::spawn(connections::serve(
        listener,
        app(state.clone()),
        limits,
        stop_http.clone(),
    ));
    // Items may already wait (a restart, a replica added by the autoscaler):
    // look once at start instead of waiting for the next delivery.
    for endpoint in state.inner.endpoints.values() {
        state.kick(endpoint.clone(), Trigger::Start, Parent::none());
    }
    // A delivery can be lost (a sender outage, an endpoint disabled after
    // failures, a replica that answered 202 and died): look again when idle.
    match state.queue_check_interval() {
        Some(every) => {
            info!(
                interval_ms = every.as_millis() as u64,
                "idle endpoints look at their queue periodically"
            );
            state.check_queues_periodically(every);
        }
        None => info!("periodic queue checks are off: only webhooks start work"),
    }
    shutdown.await;
    info!("shutting down: new webhooks get 503; running sessions end and flush");
    state.begin_shutdown();
    let clean = state.wait_for_work(grace).await;
    if !clean {
        warn!(
            grace_s = grace.as_secs(),
            "running work did not finish within the stop grace"
        );
    }
    stop_http.cancel();
    if tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .is_err()
    {
        warn!("the HTTP server did not stop within 10s");
    }
    Ok(clean)
}
