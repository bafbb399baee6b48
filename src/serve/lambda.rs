//! Lambda mode: the same router, behind a Function URL (or API Gateway),
//! with the work kept inside the invocation.
//!
//! Lambda freezes the execution environment as soon as the invocation is
//! over, and SIGTERM gives a frozen-then-killed environment about 500 ms —
//! far too little for a final sync and flush. So the webhook is answered
//! first, and the drain runs after the answer *inside the same
//! invocation*: an internal Lambda extension (registered in-process through
//! `lambda_extension`) receives every `INVOKE` and does not ask for the next
//! event until the drain that invocation started is done. Lambda considers
//! an invocation finished only when the runtime and every extension have
//! asked for the next event, so the environment stays alive (and billed)
//! until the last upload.
//!
//! The invocation deadline bounds the drain: no item is claimed without
//! room to serve it and tear it down, and a running session ends early
//! enough for both 30 s teardown bounds. When the teardown reserve is all
//! that is left, the extension tells the invocation's drains to claim
//! nothing more; a drain still running at the deadline is stopped, so no
//! work ever goes on after its invocation (on Lambda it would be frozen
//! mid-session; the journal keeps what it had not uploaded).
//!
//! Besides webhooks the function takes EventBridge's scheduled event
//! (`infra/template.yaml` sends one a minute): it drains every endpoint
//! inside that invocation, so a session whose webhook was lost or refused
//! is served within a minute anyway.
//!
//! Deadlines: Lambda hands out `lambda-runtime-deadline-ms` as Unix
//! milliseconds. Emulators do not all agree — cargo-lambda's sends the
//! timeout itself (`600000`) and its extension event `0` — so a deadline
//! that cannot be a real one is interpreted ([`interpret_deadline`]) and
//! warned about once per process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body as AxumBody;
use http_body_util::BodyExt;
use lambda_extension::{Extension, LambdaEvent, NextEvent};
use lambda_http::request::LambdaRequest as HttpEvent;
use lambda_http::{Body as LambdaBody, Request as LambdaRequest, RequestExt, Service};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::{info, warn};

use super::{AppState, Endpoint, Trigger, app, run_drain};
use crate::telemetry::Parent;

/// The longest a Lambda invocation can last (the largest function timeout).
pub const MAX_INVOCATION: Duration = Duration::from_secs(15 * 60);
/// Unix milliseconds below this are before September 2001: such a
/// "deadline" is not a time but a duration (or nothing at all).
pub const EPOCH_MS_FLOOR: u64 = 1_000_000_000_000;

/// Why a deadline was not taken as it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadlineOddity {
    /// `0`: no deadline given; Lambda's longest invocation is assumed.
    Missing,
    /// Below [`EPOCH_MS_FLOOR`]: the timeout itself, counted from arrival.
    Duration,
    /// Unix milliseconds already past when the invocation arrived.
    Past,
    /// Unix milliseconds further than [`MAX_INVOCATION`] away.
    TooFar,
}

impl DeadlineOddity {
    fn explain(self) -> &'static str {
        match self {
            DeadlineOddity::Missing => {
                "no invocation deadline was given; assuming Lambda's longest invocation (15 minutes) from its arrival"
            }
            DeadlineOddity::Duration => {
                "the invocation deadline is too small to be Unix milliseconds (an emulator such as cargo-lambda sends the timeout itself); taking it as that many milliseconds from the invocation's arrival, at most 15 minutes"
            }
            DeadlineOddity::Past => {
                "the invocation deadline was already past when the invocation arrived (a clock that is off, or an emulator); taking it as no time left: nothing is claimed in this invocation"
            }
            DeadlineOddity::TooFar => {
                "the invocation deadline is more than 15 minutes away (a clock that is off, or an emulator); taking it as 15 minutes from the invocation's arrival"
            }
        }
    }
}

/// The time left in an invocation whose deadline is `raw_ms`, arriving at
/// Unix time `now_ms`, and why `raw_ms` was not taken as it came:
///
/// - Unix milliseconds in the future, at most 15 minutes away: as they are;
/// - further away: 15 minutes (Lambda's longest invocation);
/// - already past at arrival: nothing (the runtime just handed the
///   invocation out, so the clock or the emulator is wrong — and claiming
///   an item that cannot be torn down in time is the one unsafe choice);
/// - below [`EPOCH_MS_FLOOR`]: a duration from arrival, at most 15 minutes;
/// - `0`: none given; 15 minutes.
pub fn interpret_deadline(raw_ms: u64, now_ms: u64) -> (Duration, Option<DeadlineOddity>) {
    match raw_ms {
        0 => (MAX_INVOCATION, Some(DeadlineOddity::Missing)),
        ms if ms < EPOCH_MS_FLOOR => (
            Duration::from_millis(ms).min(MAX_INVOCATION),
            Some(DeadlineOddity::Duration),
        ),
        ms if ms <= now_ms => (Duration::ZERO, Some(DeadlineOddity::Past)),
        ms => {
            let left = Duration::from_millis(ms - now_ms);
            if left > MAX_INVOCATION {
                (MAX_INVOCATION, Some(DeadlineOddity::TooFar))
            } else {
                (left, None)
            }
        }
    }
}

/// Unix milliseconds now.
fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// The runtime's deadline `raw_ms` as a tokio instant, warning (once per
/// process: an emulator sends the same kind of value every time) when it
/// cannot be a real one.
fn runtime_deadline(raw_ms: u64) -> Instant {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let (left, oddity) = interpret_deadline(raw_ms, epoch_ms());
    if let Some(oddity) = oddity {
        if !WARNED.swap(true, Ordering::Relaxed) {
            warn!(
                deadline_ms = raw_ms,
                interpreted_left_ms = left.as_millis() as u64,
                "{} (warned once)",
                oddity.explain()
            );
        } else {
            tracing::debug!(
                deadline_ms = raw_ms,
                interpreted_left_ms = left.as_millis() as u64,
                ?oddity,
                "invocation deadline interpreted"
            );
        }
    }
    Instant::now() + left
}

/// The extension's deadline, when it is a real one (cargo-lambda's
/// extension events carry `0`); the runtime's wins otherwise.
fn extension_deadline(raw_ms: u64) -> Option<Instant> {
    match interpret_deadline(raw_ms, epoch_ms()) {
        (left, None) | (left, Some(DeadlineOddity::Past)) => Some(Instant::now() + left),
        _ => None,
    }
}

/// One drain started in an invocation.
struct Drain {
    handle: JoinHandle<()>,
    /// Fired when the invocation is about to end: claim nothing more, end the sessions.
    over: CancellationToken,
    /// The endpoint's teardown reserve.
    reserve: Duration,
}

/// The invocation being served (Lambda serves one at a time) and the
/// drains it started.
struct Invocation {
    deadline: Instant,
    drains: Vec<Drain>,
}

/// The work of the invocation being served.
#[derive(Clone, Default)]
pub struct InvocationWork {
    current: Arc<Mutex<Option<Invocation>>>,
}

impl InvocationWork {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Invocation>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new invocation, ending at `deadline`.
    fn begin(&self, deadline: Instant) {
        if let Some(left) = self.lock().replace(Invocation {
            deadline,
            drains: Vec::new(),
        }) {
            // The extension always takes an invocation's drains; never leave one running unheld.
            for drain in left.drains {
                drain.over.cancel();
            }
        }
    }

    /// Start draining `endpoint` inside the current invocation.
    pub(super) fn start(
        &self,
        endpoint: Arc<Endpoint>,
        cancel: CancellationToken,
        trigger: Trigger,
        parent: Parent,
    ) {
        let mut current = self.lock();
        let invocation = current.get_or_insert_with(|| Invocation {
            deadline: Instant::now() + MAX_INVOCATION,
            drains: Vec::new(),
        });
        let mut options = endpoint.drain.clone();
        options.deadline = Some(invocation.deadline);
        let over = cancel.child_token();
        let reserve = endpoint.worker.options().teardown_reserve();
        let token = over.clone();
        let handle = tokio::spawn(async move {
            run_drain(&endpoint, token, options, trigger, &parent).await;
        });
        invocation.drains.push(Drain {
            handle,
            over,
            reserve,
        });
    }

    fn take(&self) -> Option<Invocation> {
        self.lock().take()
    }
}

impl Invocation {
    /// Wait for the drains, ending them in time: once only their teardown
    /// reserve is left before `end` they claim nothing more and their
    /// sessions end (final sync, flush, force-stop); any still running at
    /// `end` is stopped where it is.
    async fn finish(self, end: Instant, request_id: &str) {
        let reserve = self
            .drains
            .iter()
            .map(|d| d.reserve)
            .max()
            .unwrap_or_default();
        let cut = end.checked_sub(reserve).unwrap_or_else(Instant::now);
        let overs: Vec<CancellationToken> = self.drains.iter().map(|d| d.over.clone()).collect();
        let aborts: Vec<AbortHandle> = self
            .drains
            .iter()
            .map(|d| d.handle.abort_handle())
            .collect();
        let mut all = futures::future::join_all(self.drains.into_iter().map(|d| d.handle));
        let results = tokio::select! {
            results = &mut all => Some(results),
            _ = tokio::time::sleep_until(cut) => None,
        };
        let results = match results {
            Some(results) => results,
            None => {
                info!(
                    request_id,
                    left_ms = end.saturating_duration_since(Instant::now()).as_millis() as u64,
                    "the invocation is about to end: the drain claims nothing more and its sessions end and flush"
                );
                for over in &overs {
                    over.cancel();
                }
                match tokio::time::timeout_at(end, &mut all).await {
                    Ok(results) => results,
                    Err(_) => {
                        warn!(
                            request_id,
                            "the drain outlived the invocation's deadline; stopping it (what it had not uploaded stays in the journal for the next worker)"
                        );
                        for abort in &aborts {
                            abort.abort();
                        }
                        return;
                    }
                }
            }
        };
        for result in results {
            if let Err(e) = result {
                warn!(error = %e, "the drain task failed");
            }
        }
    }
}

/// Whether this process runs as a Lambda function.
pub fn in_lambda() -> bool {
    std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some()
}

/// EventBridge's scheduled event (`infra/template.yaml`'s `QueueCheck`).
fn is_scheduled_event(event: &Value) -> bool {
    event.get("source").and_then(Value::as_str) == Some("aws.events")
        && event.get("detail-type").and_then(Value::as_str) == Some("Scheduled Event")
}

/// What the function answers: an HTTP response in the shape its event
/// source expects, or a plain JSON document (a scheduled event's).
#[derive(serde::Serialize)]
#[serde(untagged)]
enum Answer<R> {
    /// `lambda_http`'s response type (not nameable outside it).
    Http(R),
    Json(Value),
}

/// What the handler tells the extension of one invocation: its request id
/// and the drains it started.
type Handled = (String, Option<Invocation>);

/// Tells the extension of an invocation when dropped, so it hears exactly
/// once from each, whatever the handler did.
struct ReportOnDrop(mpsc::UnboundedSender<Handled>, InvocationWork, String);

impl Drop for ReportOnDrop {
    fn drop(&mut self) {
        let _ = self.0.send((std::mem::take(&mut self.2), self.1.take()));
    }
}

/// The extension's part of one invocation: wait for the handler's answer,
/// finish the drains it started inside the invocation, then send the
/// invocation's spans.
async fn after_invoke(
    invoke: lambda_extension::InvokeEvent,
    done_rx: &tokio::sync::Mutex<mpsc::UnboundedReceiver<Handled>>,
) {
    tracing::debug!(request_id = %invoke.request_id, deadline_ms = invoke.deadline_ms, "extension: invocation started");
    // Never past the invocation's deadline: an event the runtime
    // could not decode never reaches the handler, so no message comes.
    let own_end = extension_deadline(invoke.deadline_ms);
    let answer_by = own_end.unwrap_or_else(|| Instant::now() + MAX_INVOCATION);
    let invocation = handler_answer(&invoke.request_id, answer_by, done_rx).await;
    let drains = invocation.as_ref().map_or(0, |i| i.drains.len());
    tracing::debug!(request_id = %invoke.request_id, drains, "extension: the handler answered");
    let mut flush_by = answer_by;
    if let Some(invocation) = invocation.filter(|i| !i.drains.is_empty()) {
        // The earlier of the two deadlines, when both are real.
        let end = own_end.map_or(invocation.deadline, |own| own.min(invocation.deadline));
        flush_by = end;
        info!(request_id = %invoke.request_id, left_ms = end.saturating_duration_since(Instant::now()).as_millis() as u64, "answered; finishing the drain inside the invocation");
        invocation.finish(end, &invoke.request_id).await;
    }
    // The environment may be frozen as soon as the extension
    // asks for the next event: send this invocation's spans now.
    // Bounded by the invocation's end: a collector that does not
    // answer must not hold the invocation past it.
    crate::telemetry::flush_until(flush_by).await;
}

/// The handler's message about invocation `request_id`, waited for until
/// `answer_by`.
async fn handler_answer(
    request_id: &str,
    answer_by: Instant,
    done_rx: &tokio::sync::Mutex<mpsc::UnboundedReceiver<Handled>>,
) -> Option<Invocation> {
    tokio::time::timeout_at(answer_by, async {
        let mut rx = done_rx.lock().await;
        // A late message of an earlier invocation is not this one's.
        loop {
            match rx.recv().await {
                Some((id, invocation)) if id == request_id => break invocation,
                Some(_) => continue,
                None => break None,
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        warn!(request_id = %request_id, "the handler never answered this invocation; ending it");
        None
    })
}

/// Serve invocations until the runtime stops. `state` must have been built
/// with [`super::Mode::Lambda`] over `work`.
pub async fn run(state: AppState, work: InvocationWork) -> Result<(), lambda_http::Error> {
    // One message per handled invocation: its request id and the drains it started.
    let (done_tx, done_rx) = mpsc::unbounded_channel::<Handled>();
    let done_rx = Arc::new(tokio::sync::Mutex::new(done_rx));
    let extension = Extension::new()
        .with_extension_name("envworker-drain")
        .with_events(&["INVOKE"])
        .with_events_processor(lambda_extension::service_fn(move |event: LambdaEvent| {
            let done_rx = done_rx.clone();
            async move {
                if let NextEvent::Invoke(invoke) = event.next {
                    after_invoke(invoke, &done_rx).await;
                }
                Ok::<(), lambda_extension::Error>(())
            }
        }))
        .register()
        .await?;

    let router = app(state.clone());
    let http = lambda_http::service_fn(move |request: LambdaRequest| {
        let router = router.clone();
        async move { serve_http(router, request).await }
    });
    let handler = lambda_http::service_fn(move |event: lambda_http::LambdaEvent<Value>| {
        let (state, work, done_tx, mut http) =
            (state.clone(), work.clone(), done_tx.clone(), http.clone());
        async move {
            let lambda_http::LambdaEvent { payload, context } = event;
            work.begin(runtime_deadline(context.deadline));
            // Whatever happens below, the extension hears exactly once from this invocation.
            let _report = ReportOnDrop(done_tx, work.clone(), context.request_id.clone());
            if is_scheduled_event(&payload) {
                return Ok(Answer::Json(scheduled_queue_check(&state, &work)));
            }
            match serde_json::from_value::<HttpEvent>(payload) {
                Ok(request) => {
                    let mut adapter = lambda_http::Adapter::from(&mut http);
                    let response = adapter
                        .call(lambda_http::LambdaEvent::new(request, context))
                        .await?;
                    Ok(Answer::Http(response))
                }
                Err(e) => {
                    warn!(request_id = %context.request_id, error = %e, "the event is neither an HTTP request nor a scheduled event; ignored");
                    Err(lambda_http::Error::from(format!(
                        "envworker takes HTTP requests (a Function URL or API Gateway) and EventBridge scheduled events; this event is neither: {e}"
                    )))
                }
            }
        }
    });
    tokio::try_join!(lambda_http::lambda_runtime::run(handler), extension.run())?;
    Ok(())
}

/// A scheduled event: look at every endpoint's queue inside this
/// invocation, so work whose webhook never came (lost, refused, answered by
/// an environment that died) is served within one schedule period.
fn scheduled_queue_check(state: &AppState, work: &InvocationWork) -> Value {
    if state.is_shutting_down() {
        return json!({"status": "shutting down"});
    }
    let names = state.endpoint_names();
    info!(endpoints = ?names, "scheduled queue check: draining every endpoint inside this invocation");
    for name in &names {
        if let Some(endpoint) = state.inner.endpoints.get(name) {
            work.start(
                endpoint.clone(),
                state.inner.shutdown.clone(),
                Trigger::Schedule,
                Parent::none(),
            );
        }
    }
    json!({"status": "draining", "endpoints": names})
}

/// One HTTP request through the router.
async fn serve_http(
    router: axum::Router,
    request: LambdaRequest,
) -> Result<http::Response<LambdaBody>, lambda_http::Error> {
    // A REST API (v1) event's path comes with the stage in front
    // (`/Prod/webhooks/…`); route the path the sender asked for.
    let raw_path = request.raw_http_path().to_string();
    let (mut parts, body) = request.into_parts();
    parts.uri = route_by_raw_path(&parts.uri, &raw_path);
    let bytes: Vec<u8> = match body {
        LambdaBody::Empty => Vec::new(),
        LambdaBody::Text(t) => t.into_bytes(),
        LambdaBody::Binary(b) => b,
        _ => Vec::new(),
    };
    let request = http::Request::from_parts(parts, AxumBody::from(bytes));
    let response = router
        .oneshot(request)
        .await
        .expect("the router is infallible");
    let (parts, body) = response.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    let body = match String::from_utf8(bytes) {
        Ok(text) => LambdaBody::Text(text),
        Err(e) => LambdaBody::Binary(e.into_bytes()),
    };
    Ok(http::Response::from_parts(parts, body))
}

/// `uri` with its path replaced by `raw_path` (the query kept); `uri` itself
/// when there is no raw path or it does not make a valid URI.
fn route_by_raw_path(uri: &http::Uri, raw_path: &str) -> http::Uri {
    if raw_path.is_empty() || raw_path == uri.path() {
        return uri.clone();
    }
    let path_and_query = match uri.query() {
        Some(query) => format!("{raw_path}?{query}"),
        None => raw_path.to_string(),
    };
    let mut parts = uri.clone().into_parts();
    match path_and_query.parse() {
        Ok(pq) => parts.path_and_query = Some(pq),
        Err(_) => return uri.clone(),
    }
    http::Uri::from_parts(parts).unwrap_or_else(|_| uri.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_that_cannot_be_real_is_interpreted_safely() {
        let now = 1_796_000_000_000; // Unix ms, November 2026
        let min = |m: u64| Duration::from_secs(m * 60);
        // Real Lambda: Unix milliseconds ahead, taken as they are.
        assert_eq!(interpret_deadline(now + 300_000, now), (min(5), None));
        // cargo-lambda: the timeout itself.
        assert_eq!(
            interpret_deadline(600_000, now),
            (min(10), Some(DeadlineOddity::Duration))
        );
        assert_eq!(
            interpret_deadline(3_600_000, now),
            (min(15), Some(DeadlineOddity::Duration))
        );
        assert_eq!(
            interpret_deadline(0, now),
            (min(15), Some(DeadlineOddity::Missing))
        );
        // Past at arrival: no time, nothing claimed.
        assert_eq!(
            interpret_deadline(now - 1, now),
            (Duration::ZERO, Some(DeadlineOddity::Past))
        );
        assert_eq!(
            interpret_deadline(now + 3_600_000, now),
            (min(15), Some(DeadlineOddity::TooFar))
        );
    }

    #[test]
    fn a_rest_api_stage_is_not_part_of_the_routed_path() {
        let uri: http::Uri =
            "https://abc.execute-api.us-east-1.amazonaws.com/Prod/webhooks/default?x=1"
                .parse()
                .unwrap();
        assert_eq!(
            route_by_raw_path(&uri, "/webhooks/default").to_string(),
            "https://abc.execute-api.us-east-1.amazonaws.com/webhooks/default?x=1"
        );
        assert_eq!(route_by_raw_path(&uri, ""), uri);
        assert_eq!(route_by_raw_path(&uri, "not a path"), uri);
    }
}
