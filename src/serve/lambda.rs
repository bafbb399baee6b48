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
//! enough for both 30 s teardown bounds.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body as AxumBody;
use http_body_util::BodyExt;
use lambda_extension::{Extension, LambdaEvent, NextEvent};
use lambda_http::{Body as LambdaBody, Request as LambdaRequest, RequestExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::{info, warn};

use super::{AppState, Endpoint, app, run_drain};

/// The drain an invocation started, handed from the request handler to the extension.
type Started = Option<JoinHandle<()>>;

/// The work of the invocation being served (Lambda serves one at a time).
#[derive(Clone, Default)]
pub struct InvocationWork {
    /// The drain this invocation started, if any.
    started: Arc<Mutex<Started>>,
    /// The invocation's deadline, as a tokio instant.
    deadline: Arc<Mutex<Option<tokio::time::Instant>>>,
}

impl InvocationWork {
    /// Start draining `endpoint` for the current invocation.
    pub(super) fn start(&self, endpoint: Arc<Endpoint>, cancel: CancellationToken) {
        let mut options = endpoint.drain.clone();
        options.deadline = *self.deadline.lock().unwrap_or_else(|e| e.into_inner());
        let handle = tokio::spawn(async move {
            run_drain(&endpoint, cancel, options).await;
        });
        let mut slot = self.started.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(previous) = slot.replace(handle) {
            // Two deliveries in one invocation cannot happen; keep both alive anyway.
            tokio::spawn(async move {
                let _ = previous.await;
            });
        }
    }

    fn take(&self) -> Started {
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    fn set_deadline(&self, deadline_ms: u64) {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner()) =
            (deadline_ms > 0).then(|| deadline_instant(deadline_ms));
    }
}

/// A deadline in Unix milliseconds as a tokio instant (now, if it passed).
fn deadline_instant(deadline_ms: u64) -> tokio::time::Instant {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default();
    tokio::time::Instant::now() + Duration::from_millis(deadline_ms.saturating_sub(now_ms))
}

/// Whether this process runs as a Lambda function.
pub fn in_lambda() -> bool {
    std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some()
}

/// Serve invocations until the runtime stops. `state` must have been built
/// with [`super::Mode::Lambda`] over `work`.
pub async fn run(state: AppState, work: InvocationWork) -> Result<(), lambda_http::Error> {
    // One message per handled invocation: its request id and the drain it started.
    let (done_tx, done_rx) = mpsc::unbounded_channel::<(String, Started)>();
    let done_rx = Arc::new(tokio::sync::Mutex::new(done_rx));
    let extension = Extension::new()
        .with_extension_name("envworker-drain")
        .with_events(&["INVOKE"])
        .with_events_processor(lambda_extension::service_fn(move |event: LambdaEvent| {
            let done_rx = done_rx.clone();
            async move {
                if let NextEvent::Invoke(invoke) = event.next {
                    tracing::debug!(request_id = %invoke.request_id, "extension: invocation started");
                    // Never past the invocation's deadline: an event the runtime
                    // could not decode never reaches the handler, so no message comes.
                    let end = deadline_instant(invoke.deadline_ms);
                    let started = tokio::time::timeout_at(end, async {
                        let mut rx = done_rx.lock().await;
                        // A late message of an earlier invocation is not this one's.
                        loop {
                            match rx.recv().await {
                                Some((id, started)) if id == invoke.request_id => break started,
                                Some(_) => continue,
                                None => break None,
                            }
                        }
                    })
                    .await
                    .unwrap_or_else(|_| {
                        warn!(request_id = %invoke.request_id, "the handler never answered this invocation; ending it");
                        None
                    });
                    tracing::debug!(request_id = %invoke.request_id, drain = started.is_some(), "extension: the handler answered");
                    if let Some(drain) = started {
                        info!(request_id = %invoke.request_id, "webhook answered; finishing the drain inside the invocation");
                        match tokio::time::timeout_at(end, drain).await {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => warn!(error = %e, "the drain task failed"),
                            Err(_) => warn!(request_id = %invoke.request_id, "the drain outlived the invocation's deadline"),
                        }
                    }
                }
                Ok::<(), lambda_extension::Error>(())
            }
        }))
        .register()
        .await?;

    let router = app(state);
    let handler = lambda_http::service_fn(move |request: LambdaRequest| {
        let (router, work, done_tx) = (router.clone(), work.clone(), done_tx.clone());
        async move {
            // Whatever happens below, the extension hears exactly once from this invocation.
            struct Report(
                mpsc::UnboundedSender<(String, Started)>,
                InvocationWork,
                String,
            );
            impl Drop for Report {
                fn drop(&mut self) {
                    let _ = self.0.send((std::mem::take(&mut self.2), self.1.take()));
                }
            }
            let request_id = request
                .lambda_context_ref()
                .map(|ctx| ctx.request_id.clone())
                .unwrap_or_default();
            let _report = Report(done_tx, work.clone(), request_id);
            if let Some(ctx) = request.lambda_context_ref() {
                work.set_deadline(ctx.deadline);
            }
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
            Ok::<_, lambda_http::Error>(http::Response::from_parts(parts, body))
        }
    });
    tokio::try_join!(lambda_http::run(handler), extension.run())?;
    Ok(())
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
    use super::route_by_raw_path;

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
