//! The serve app in process: `app()` called through `oneshot` (no listener),
//! its endpoint's worker draining a real devserver environment; and once
//! through `serve_container` on a real listener.
//!
//! Covered at the app level: the Standard Webhooks test vector, rotated keys
//! and several signatures, the ±5 min tolerance, the exact-bytes rule,
//! missing and malformed headers, unknown endpoints, the body limit,
//! unparseable bodies, ignored types, replays, shutdown, and an answer that
//! does not wait for the drain. Where a delivery must start no work, a
//! "canary" item sits in the queue and is checked to be still queued once
//! every drain is over.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::container::spawn_container;
use crate::common::{ADMIN_KEY, TestServer};
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use envworker::api::types::Redacted;
use envworker::devserver::DevserverConfig;
use envworker::metrics::Metrics;
use envworker::serve::{AppState, Endpoint, MAX_BODY_BYTES, Mode, app};
use envworker::webhook::{self, SigningKey, WebhookError, WebhookHeaders};
use envworker::worker::poll::DrainOptions;
use envworker::worker::{EnvironmentWorker, WorkerOptions};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

/// The test vector of the Standard Webhooks reference libraries.
const VECTOR_KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const VECTOR_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const VECTOR_TS: i64 = 1_614_265_330;
const VECTOR_BODY: &[u8] = br#"{"test": 2432232314}"#;
const VECTOR_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

/// Everything a drain needs: generous, but a hung drain fails the test.
const DRAIN_BOUND: Duration = Duration::from_secs(60);

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A devserver, one of its environments, and the serve app over it.
struct Fx {
    server: TestServer,
    env_id: String,
    state: AppState,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

/// One endpoint per `(name, keys)`, each over its own environment of one devserver.
async fn fixture_with(endpoints: Vec<(&str, Vec<SigningKey>)>) -> (Fx, Vec<String>) {
    fixture_tweaked(endpoints, |_, _| {}).await
}

/// [`fixture_with`], each endpoint's worker options changed by `tweak(name, options)`.
async fn fixture_tweaked(
    endpoints: Vec<(&str, Vec<SigningKey>)>,
    tweak: impl Fn(&str, &mut WorkerOptions),
) -> (Fx, Vec<String>) {
    let mnt = tempfile::tempdir().unwrap();
    let workdir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(
        DevserverConfig::new(ADMIN_KEY).mount_root(mnt.path().join("memory").to_str().unwrap()),
    )
    .await;
    let mut built = Vec::new();
    let mut env_ids = Vec::new();
    let metrics = std::sync::Arc::new(Metrics::new());
    for (name, keys) in endpoints {
        let (env_id, env_key) = server.create_environment().await;
        let mut options = WorkerOptions::new(&env_id, server.url());
        options.environment_key = Some(Redacted::new(env_key));
        options.workdir = workdir.path().to_path_buf();
        options.max_idle = Some(Duration::from_secs(1));
        // Fed as `serve` feeds it: per endpoint.
        options.add_observer(metrics.for_endpoint(name));
        tweak(name, &mut options);
        let worker = EnvironmentWorker::new(options).unwrap();
        built.push(Endpoint::new(name, keys, worker, DrainOptions::default()));
        env_ids.push(env_id);
    }
    let state = AppState::with_metrics(built, Mode::Container, metrics);
    let fx = Fx {
        server,
        env_id: env_ids[0].clone(),
        state,
        _dirs: (mnt, workdir),
    };
    (fx, env_ids)
}

/// One endpoint `default` under `keys`.
async fn fixture(keys: Vec<SigningKey>) -> Fx {
    fixture_with(vec![("default", keys)]).await.0
}

fn key() -> SigningKey {
    SigningKey::generate().0
}

/// A thin event body, compact as the sender sends it.
fn event(id: &str, kind: &str, session: &str) -> Vec<u8> {
    json!({"type": "event", "id": id, "created_at": "2026-04-01T12:00:00Z",
           "data": {"type": kind, "id": session, "organization_id": "org", "workspace_id": "wrkspc_1"}})
    .to_string()
    .into_bytes()
}

fn run_started(id: &str) -> Vec<u8> {
    event(id, "session.status_run_started", "sesn_test")
}

/// The three headers of a delivery of `body` signed by `key` at `ts`.
fn signed(key: &SigningKey, id: &str, ts: i64, body: &[u8]) -> Vec<(&'static str, String)> {
    vec![
        ("webhook-id", id.to_string()),
        ("webhook-timestamp", ts.to_string()),
        ("webhook-signature", key.sign(id, ts, body)),
    ]
}

fn post(path: &str, headers: &[(&str, String)], body: impl Into<Body>) -> Request<Body> {
    let mut request = Request::post(path).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    request.body(body.into()).unwrap()
}

/// A delivery of `body` to `/webhooks/default`, signed by `key` now.
fn delivery(key: &SigningKey, id: &str, body: &[u8]) -> Request<Body> {
    post(
        "/webhooks/default",
        &signed(key, id, now(), body),
        body.to_vec(),
    )
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    /// The JSON body, or the text as a JSON string.
    body: Value,
}

impl Answer {
    /// An accepted delivery: `202 {"status": "accepted"}`.
    #[track_caller]
    fn accepted(&self) {
        assert_eq!(
            (self.status, &self.body),
            (StatusCode::ACCEPTED, &json!({"status": "accepted"}))
        );
    }

    /// A refusal: this status, and `{"error": …}` naming the problem.
    #[track_caller]
    fn refused(&self, status: StatusCode, error: &str) {
        assert_eq!(self.status, status, "{}", self.body);
        assert_eq!(self.body, json!({ "error": error }));
    }
}

async fn call(state: &AppState, request: Request<Body>) -> Answer {
    let response = app(state.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    Answer {
        status,
        headers,
        body,
    }
}

impl Fx {
    /// Start a scenario in this fixture's (first) environment; its item is queued.
    async fn start(&self, mut doc: Value) -> String {
        self.start_in(&self.env_id.clone(), &mut doc).await
    }

    async fn start_in(&self, env_id: &str, doc: &mut Value) -> String {
        doc["environment_id"] = json!(env_id);
        self.server.start_scenario(doc).await.session_id
    }

    /// A one-call scenario whose item must stay queued unless a drain runs.
    async fn canary(&self) -> String {
        self.start(
            json!({"name": "canary", "steps": [{"tool": "bash", "input": {"command": "true"}}]}),
        )
        .await
    }

    async fn work_state(&self, session: &str) -> String {
        self.server.work_state(&self.env_id, session).await
    }

    /// Every drain started so far is over, and `session`'s item was never claimed.
    async fn assert_not_drained(&self, session: &str) {
        assert!(self.state.wait_for_work(DRAIN_BOUND).await);
        assert_eq!(self.work_state(session).await, "queued", "no drain ran");
    }

    /// Every drain started so far is over, and `session`'s scenario passed.
    async fn assert_served(&self, session: &str) {
        assert!(self.state.wait_for_work(DRAIN_BOUND).await);
        let report = self.server.final_report(session, DRAIN_BOUND).await;
        assert_eq!(report["status"], "passed", "{report:#}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_standard_webhooks_test_vector_verifies_at_its_timestamp_only() {
    let key = SigningKey::parse(VECTOR_KEY).unwrap();
    let headers = WebhookHeaders {
        id: Some(VECTOR_ID),
        timestamp: Some("1614265330"),
        signature: Some(VECTOR_SIGNATURE),
    };
    let keys = std::slice::from_ref(&key);
    assert_eq!(
        webhook::verify(keys, headers, VECTOR_BODY, VECTOR_TS),
        Ok(VECTOR_ID)
    );
    assert_eq!(
        key.sign(VECTOR_ID, VECTOR_TS, VECTOR_BODY),
        VECTOR_SIGNATURE
    );
    assert_eq!(
        webhook::verify(keys, headers, VECTOR_BODY, VECTOR_TS + 301),
        Err(WebhookError::TooOld)
    );

    // Delivered to the app today, the vector is years old.
    let fx = fixture(vec![key.clone()]).await;
    let canary = fx.canary().await;
    let vector = [
        ("webhook-id", VECTOR_ID.to_string()),
        ("webhook-timestamp", VECTOR_TS.to_string()),
        ("webhook-signature", VECTOR_SIGNATURE.to_string()),
    ];
    call(&fx.state, post("/webhooks/default", &vector, VECTOR_BODY))
        .await
        .refused(StatusCode::UNAUTHORIZED, "the webhook timestamp is too old");
    // Signed now under the vector's key, its body passes the signature check
    // and is refused for what it is: not a webhook event.
    let a = call(&fx.state, delivery(&key, VECTOR_ID, VECTOR_BODY)).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
    assert!(
        a.body["error"]
            .as_str()
            .unwrap()
            .starts_with("the body is not a webhook event"),
        "{}",
        a.body
    );
    fx.assert_not_drained(&canary).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delivery_signed_by_either_rotated_key_is_accepted() {
    let (old, new, stranger) = (key(), key(), key());
    let fx = fixture(vec![old.clone(), new.clone()]).await;
    for (id, by) in [("whe_old", &old), ("whe_new", &new)] {
        call(&fx.state, delivery(by, id, &run_started(id)))
            .await
            .accepted();
    }
    call(
        &fx.state,
        delivery(&stranger, "whe_stranger", &run_started("whe_stranger")),
    )
    .await
    .refused(StatusCode::UNAUTHORIZED, "no signature matches");

    // Several signatures in the header: any one match passes, others (and non-v1 entries) are skipped.
    let ts = now();
    let several = |id: &str, body: &[u8], entries: &[String]| {
        post(
            "/webhooks/default",
            &[
                ("webhook-id", id.to_string()),
                ("webhook-timestamp", ts.to_string()),
                ("webhook-signature", entries.join(" ")),
            ],
            body.to_vec(),
        )
    };
    let body = run_started("whe_several");
    call(
        &fx.state,
        several(
            "whe_several",
            &body,
            &[
                stranger.sign("whe_several", ts, &body),
                "v2,bm90IGEgdjEgc2lnbmF0dXJl".into(),
                new.sign("whe_several", ts, &body),
            ],
        ),
    )
    .await
    .accepted();
    // …but signatures of the endpoint's keys over something else do not.
    let body = run_started("whe_none");
    call(
        &fx.state,
        several(
            "whe_none",
            &body,
            &[
                stranger.sign("whe_none", ts, &body),
                old.sign("whe_none", ts, b"another body"),
                new.sign("whe_other_id", ts, &body),
                old.sign("whe_none", ts + 1, &body),
            ],
        ),
    )
    .await
    .refused(StatusCode::UNAUTHORIZED, "no signature matches");
    assert!(fx.state.wait_for_work(DRAIN_BOUND).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn timestamps_more_than_five_minutes_away_are_refused() {
    let key = key();
    let fx = fixture(vec![key.clone()]).await;
    let canary = fx.canary().await;
    let at = |id: &str, offset: i64| {
        let body = run_started(id);
        post(
            "/webhooks/default",
            &signed(&key, id, now() + offset, &body),
            body,
        )
    };
    call(&fx.state, at("whe_past", -6 * 60))
        .await
        .refused(StatusCode::UNAUTHORIZED, "the webhook timestamp is too old");
    call(&fx.state, at("whe_future", 6 * 60)).await.refused(
        StatusCode::UNAUTHORIZED,
        "the webhook timestamp is too far in the future",
    );
    fx.assert_not_drained(&canary).await;
    // Within five minutes either way: accepted (and the queue drained).
    for (id, offset) in [("whe_recent", -4 * 60), ("whe_early", 4 * 60)] {
        let a = call(&fx.state, at(id, offset)).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{id}: {}", a.body);
    }
    fx.assert_served(&canary).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_re_serialised_body_is_refused() {
    let key = key();
    let fx = fixture(vec![key.clone()]).await;
    let canary = fx.canary().await;
    let body = run_started("whe_bytes");
    let ts = now();
    let headers = signed(&key, "whe_bytes", ts, &body);
    let reserialised =
        serde_json::to_vec_pretty(&serde_json::from_slice::<Value>(&body).unwrap()).unwrap();
    assert_ne!(reserialised, body);
    assert_eq!(
        serde_json::from_slice::<Value>(&reserialised).unwrap(),
        serde_json::from_slice::<Value>(&body).unwrap(),
        "the same JSON"
    );
    call(&fx.state, post("/webhooks/default", &headers, reserialised))
        .await
        .refused(StatusCode::UNAUTHORIZED, "no signature matches");
    fx.assert_not_drained(&canary).await;
    // The bytes that were signed pass.
    call(&fx.state, post("/webhooks/default", &headers, body))
        .await
        .accepted();
    fx.assert_served(&canary).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn each_missing_header_is_refused_with_an_error_naming_it() {
    let key = key();
    let fx = fixture(vec![key.clone()]).await;
    let canary = fx.canary().await;
    let body = run_started("whe_missing");
    let all = signed(&key, "whe_missing", now(), &body);
    for missing in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        let headers: Vec<_> = all.iter().filter(|(n, _)| *n != missing).cloned().collect();
        call(&fx.state, post("/webhooks/default", &headers, body.clone()))
            .await
            .refused(
                StatusCode::UNAUTHORIZED,
                &format!("the {missing} header is missing"),
            );
    }
    fx.assert_not_drained(&canary).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_headers_are_refused_with_an_error_naming_them() {
    let key = key();
    let fx = fixture(vec![key.clone()]).await;
    let canary = fx.canary().await;
    let body = run_started("whe_malformed");
    let at = now();
    let ts = at.to_string();
    let good = key.sign("whe_malformed", at, &body);
    let t = ts.as_str();
    let cases: [(&str, &str, String, &str); 7] = [
        // (id, timestamp, signature, error)
        (
            "whe_malformed",
            t,
            "garbage".into(),
            "the webhook-signature header is malformed",
        ),
        (
            "whe_malformed",
            t,
            "".into(),
            "the webhook-signature header is malformed",
        ),
        (
            "whe_malformed",
            t,
            format!("v2,{}", &good[3..]),
            "the webhook-signature header is malformed",
        ),
        (
            "whe_malformed",
            t,
            "v1,***not-base64***".into(),
            "no signature matches",
        ),
        (
            "whe_malformed",
            t,
            good.replacen("v1,", "v1;", 1),
            "the webhook-signature header is malformed",
        ),
        (
            "whe_malformed",
            "soon",
            good.clone(),
            "the webhook-timestamp header is malformed",
        ),
        ("", t, good.clone(), "the webhook-id header is malformed"),
    ];
    for (id, timestamp, signature, error) in cases {
        let headers = [
            ("webhook-id", id.to_string()),
            ("webhook-timestamp", timestamp.to_string()),
            ("webhook-signature", signature.clone()),
        ];
        let a = call(&fx.state, post("/webhooks/default", &headers, body.clone())).await;
        assert_eq!(
            (a.status, &a.body),
            (StatusCode::UNAUTHORIZED, &json!({ "error": error })),
            "signature {signature:?}, timestamp {timestamp:?}, id {id:?}"
        );
    }
    fx.assert_not_drained(&canary).await;
    // The control: the same delivery well-formed is accepted.
    let headers = [
        ("webhook-id", "whe_malformed".to_string()),
        ("webhook-timestamp", ts),
        ("webhook-signature", good),
    ];
    call(&fx.state, post("/webhooks/default", &headers, body))
        .await
        .accepted();
    fx.assert_served(&canary).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_endpoint_is_404_and_other_methods_are_refused() {
    let key = key();
    let fx = fixture(vec![key.clone()]).await;
    let canary = fx.canary().await;
    let body = run_started("whe_where");
    let a = call(
        &fx.state,
        post(
            "/webhooks/nope",
            &signed(&key, "whe_where", now(), &body),
            body.clone(),
        ),
    )
    .await;
    a.refused(StatusCode::NOT_FOUND, "no webhook endpoint named \"nope\"");
    // No such route at all, and GET on a webhook route.
    let a = call(&fx.state, post("/hooks/default", &[], body.clone())).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    let a = call(
        &fx.state,
        Request::get("/webhooks/default")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED);
    fx.assert_not_drained(&canary).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_over_the_limit_is_413() {
    let key = key();
    let fx = fixture(vec![key.clone()]).await;
    let canary = fx.canary().await;
    // Exactly at the limit: read, verified, and refused for not being an event.
    let at_limit = vec![b' '; MAX_BODY_BYTES];
    let a = call(&fx.state, delivery(&key, "whe_at_limit", &at_limit)).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
    // One byte over, with a content-length (as curl and the sender send it)…
    let over = vec![b' '; MAX_BODY_BYTES + 1];
    let mut headers = signed(&key, "whe_over", now(), &over);
    headers.push(("content-length", over.len().to_string()));
    let a = call(&fx.state, post("/webhooks/default", &headers, over.clone())).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", a.body);
    // …and streamed without one.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        over.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    let headers = signed(&key, "whe_over_stream", now(), &over);
    let a = call(
        &fx.state,
        post(
            "/webhooks/default",
            &headers,
            Body::from_stream(futures::stream::iter(chunks)),
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", a.body);
    fx.assert_not_drained(&canary).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_correctly_signed_body_that_is_no_event_is_400() {
    let key = key();
    let fx = fixture(vec![key.clone()]).await;
    let canary = fx.canary().await;
    for (id, body) in [
        ("whe_junk", b"not json".to_vec()),
        ("whe_empty", Vec::new()),
        (
            "whe_no_data",
            br#"{"type":"event","id":"whe_no_data"}"#.to_vec(),
        ),
        ("whe_array", b"[1,2,3]".to_vec()),
    ] {
        let a = call(&fx.state, delivery(&key, id, &body)).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{id}: {}", a.body);
        let error = a.body["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with("the body is not a webhook event: "),
            "{id}: {error}"
        );
    }
    fx.assert_not_drained(&canary).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn other_event_types_are_ignored_with_200() {
    let key = key();
    let fx = fixture(vec![key.clone()]).await;
    let canary = fx.canary().await;
    for (id, body) in [
        (
            "whe_idled",
            event("whe_idled", "session.status_idled", &canary),
        ),
        (
            "whe_created",
            event("whe_created", "session.created", &canary),
        ),
        // The run-started type, but not inside an event.
        (
            "whe_not_event",
            json!({"type": "message", "id": "whe_not_event", "data": {"type": "session.status_run_started", "id": canary}})
                .to_string()
                .into_bytes(),
        ),
    ] {
        let a = call(&fx.state, delivery(&key, id, &body)).await;
        assert_eq!(a.status, StatusCode::OK, "{id}: {}", a.body);
        assert_eq!(a.body, json!({"status": "ignored"}), "{id}");
    }
    fx.assert_not_drained(&canary).await;
    // The control: the run-started event drains the queue.
    call(
        &fx.state,
        delivery(
            &key,
            "whe_run",
            &event("whe_run", "session.status_run_started", &canary),
        ),
    )
    .await
    .accepted();
    fx.assert_served(&canary).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_webhook_id_twice_is_a_duplicate_and_starts_no_second_drain() {
    let key = key();
    let fx = fixture(vec![key.clone()]).await;
    let first = fx.canary().await;
    let body = run_started("whe_twice");
    call(&fx.state, delivery(&key, "whe_twice", &body))
        .await
        .accepted();
    fx.assert_served(&first).await;
    // A second item waits; the sender retries the same event (same id, new
    // timestamp and signature).
    let second = fx.canary().await;
    tokio::time::sleep(Duration::from_millis(1100)).await; // a new timestamp
    let a = call(&fx.state, delivery(&key, "whe_twice", &body)).await;
    assert_eq!(
        (a.status, a.body),
        (StatusCode::OK, json!({"status": "duplicate"}))
    );
    fx.assert_not_drained(&second).await;
    // A new event drains it.
    call(
        &fx.state,
        delivery(&key, "whe_next", &run_started("whe_next")),
    )
    .await
    .accepted();
    fx.assert_served(&second).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_id_seen_by_one_endpoint_is_no_duplicate_for_another() {
    let (key_a, key_b) = (key(), key());
    let (fx, envs) =
        fixture_with(vec![("a", vec![key_a.clone()]), ("b", vec![key_b.clone()])]).await;
    let mut doc =
        json!({"name": "in-b", "steps": [{"tool": "bash", "input": {"command": "true"}}]});
    let in_b = fx.start_in(&envs[1], &mut doc).await;
    // Both endpoints subscribe to the organisation's events: the same event
    // reaches both, each signed with that endpoint's secret.
    let body = run_started("whe_both");
    let ts = now();
    for (name, key) in [("a", &key_a), ("b", &key_b)] {
        let a = call(
            &fx.state,
            post(
                &format!("/webhooks/{name}"),
                &signed(key, "whe_both", ts, &body),
                body.clone(),
            ),
        )
        .await;
        assert_eq!(
            (a.status, a.body),
            (StatusCode::ACCEPTED, json!({"status": "accepted"})),
            "endpoint {name}"
        );
    }
    assert!(fx.state.wait_for_work(DRAIN_BOUND).await);
    assert_ne!(fx.server.work_state(&envs[1], &in_b).await, "queued");
}

#[tokio::test(flavor = "multi_thread")]
async fn after_shutdown_deliveries_get_503_and_readiness_fails_but_health_holds() {
    let key = key();
    let fx = fixture(vec![key.clone()]).await;
    let canary = fx.canary().await;
    let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
    let a = call(&fx.state, get("/readyz")).await;
    assert_eq!(
        (a.status, without_sandbox(a.body)),
        (
            StatusCode::OK,
            json!({"status": "ready", "endpoints": {"default": {"ready": true}}})
        )
    );

    fx.state.begin_shutdown();
    assert!(fx.state.is_shutting_down());
    let a = call(
        &fx.state,
        delivery(&key, "whe_late", &run_started("whe_late")),
    )
    .await;
    a.refused(
        StatusCode::SERVICE_UNAVAILABLE,
        "shutting down; retry later",
    );
    let retry_after = a.headers["retry-after"].to_str().unwrap();
    assert!(
        retry_after.parse::<u64>().is_ok_and(|s| s > 0),
        "retry-after: {retry_after}"
    );
    let a = call(&fx.state, get("/readyz")).await;
    assert_eq!(
        (a.status, a.body),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "shutting_down"})
        )
    );
    let a = call(&fx.state, get("/healthz")).await;
    assert_eq!((a.status, a.body), (StatusCode::OK, json!("ok\n")));
    fx.assert_not_drained(&canary).await;
    // Refused, not remembered: the sender's retry (elsewhere, or here after a
    // restart) is not a duplicate — still 503 here, never 200.
    let a = call(
        &fx.state,
        delivery(&key, "whe_late", &run_started("whe_late")),
    )
    .await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_accepted_delivery_is_answered_at_once_while_the_drain_goes_on() {
    let key = key();
    let fx = fixture(vec![key.clone()]).await;
    let session = fx
        .start(json!({
            "name": "slow",
            "steps": [
                {"tool": "bash", "input": {"command": "echo before"}, "expect": {"contains": "before"}},
                {"wait_ms": 3000},
                {"tool": "bash", "input": {"command": "echo after"}, "expect": {"contains": "after"}}
            ]
        }))
        .await;
    let t0 = Instant::now();
    let a = call(
        &fx.state,
        delivery(&key, "whe_slow", &run_started("whe_slow")),
    )
    .await;
    let answered = t0.elapsed();
    a.accepted();
    assert!(
        answered < Duration::from_secs(1),
        "answered after {answered:?}"
    );
    // The session was still going when the answer came.
    assert_ne!(fx.work_state(&session).await, "stopped");
    fx.assert_served(&session).await;
    assert!(
        t0.elapsed() >= Duration::from_secs(3),
        "the drain served the whole session ({:?})",
        t0.elapsed()
    );
    assert_eq!(fx.work_state(&session).await, "stopped");
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_container_on_a_real_listener_serves_a_signed_webhook() {
    let key = key();
    let fx = fixture(vec![key.clone()]).await;
    let (addr, stop, served) = spawn_container(fx.state.clone(), Duration::from_secs(60)).await;
    let url = format!("http://{addr}");
    let http = reqwest::Client::new();
    for path in ["/healthz", "/readyz"] {
        let r = http.get(format!("{url}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    // Queued once the server is up (and its start-up look at the queue is over).
    assert!(fx.state.wait_for_work(DRAIN_BOUND).await);
    let session = fx.start(crate::common::scenario("notes-roundtrip")).await;
    let body = run_started("whe_real");
    let ts = now();
    let mut request = http
        .post(format!("{url}/webhooks/default"))
        .header("content-type", "application/json");
    for (name, value) in signed(&key, "whe_real", ts, &body) {
        request = request.header(name, value);
    }
    let r = request.body(body).send().await.unwrap();
    assert_eq!(r.status(), 202);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"status": "accepted"})
    );
    let report = fx.server.final_report(&session, DRAIN_BOUND).await;
    assert_eq!(report["status"], "passed", "{report:#}");
    assert_eq!(report["failures"], json!([]));
    // Shutdown: the drain is over, so it ends cleanly and the port closes.
    stop.send(()).unwrap();
    let clean = tokio::time::timeout(DRAIN_BOUND, served)
        .await
        .expect("serve_container returns")
        .unwrap()
        .unwrap();
    assert!(clean);
    assert!(
        reqwest::Client::new()
            .get(format!("{url}/healthz"))
            .send()
            .await
            .is_err(),
        "the listener is closed"
    );
}

fn get(path: &str) -> Request<Body> {
    Request::builder()
        .method("GET")
        .uri(path)
        .body(Body::empty())
        .unwrap()
}

/// The value of one exported sample, `name{labels}` exactly as rendered.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_report_each_endpoints_queue_depth_and_webhook_outcomes() {
    let key = key();
    let (fx, envs) = fixture_with(vec![("a", vec![key.clone()]), ("b", vec![key.clone()])]).await;
    let first = fx.canary().await;
    let mut doc =
        json!({"name": "canary-b", "steps": [{"tool": "bash", "input": {"command": "true"}}]});
    fx.start_in(&envs[1], &mut doc).await;
    let mut doc =
        json!({"name": "canary-b2", "steps": [{"tool": "bash", "input": {"command": "true"}}]});
    fx.start_in(&envs[1], &mut doc).await;

    let scraped = call(&fx.state, get("/metrics")).await;
    assert_eq!(scraped.status, StatusCode::OK);
    // The body is OpenMetrics text, and says so (not Prometheus 0.0.4's type).
    assert_eq!(
        scraped.headers["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let text = scraped.body.as_str().unwrap().to_string();
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert_eq!(
        sample(&text, r#"envworker_work_queue_depth{endpoint="a"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"envworker_work_queue_depth{endpoint="b"}"#),
        Some(2.0),
        "{text}"
    );
    // Scrapes right after a read reuse it: /metrics cannot drive the API's rate limit.
    let mut doc =
        json!({"name": "canary-b3", "steps": [{"tool": "bash", "input": {"command": "true"}}]});
    fx.start_in(&envs[1], &mut doc).await;
    let text = call(&fx.state, get("/metrics"))
        .await
        .body
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        sample(&text, r#"envworker_work_queue_depth{endpoint="b"}"#),
        Some(2.0),
        "{text}"
    );
    fx.state.set_queue_stats_max_age(Duration::ZERO);

    // Outcomes are counted per configured endpoint; an unknown name never becomes a label.
    let ignored = event("whe_m1", "session.status_idled", &first);
    let a = call(
        &fx.state,
        post(
            "/webhooks/a",
            &signed(&key, "whe_m1", now(), &ignored),
            ignored.clone(),
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let stranger = post(
        "/webhooks/no-such-endpoint",
        &signed(&key, "whe_m2", now(), b"{}"),
        "{}",
    );
    assert_eq!(
        call(&fx.state, stranger).await.status,
        StatusCode::NOT_FOUND
    );
    let accepted = run_started("whe_m3");
    call(
        &fx.state,
        post(
            "/webhooks/a",
            &signed(&key, "whe_m3", now(), &accepted),
            accepted.clone(),
        ),
    )
    .await
    .accepted();
    fx.assert_served(&first).await;
    let text = call(&fx.state, get("/metrics"))
        .await
        .body
        .as_str()
        .unwrap()
        .to_string();
    for (series, expected) in [
        (
            r#"envworker_webhooks_total{endpoint="a",outcome="ignored"}"#,
            Some(1.0),
        ),
        (
            r#"envworker_webhooks_total{endpoint="unknown",outcome="not_found"}"#,
            Some(1.0),
        ),
        (
            r#"envworker_webhooks_total{endpoint="a",outcome="accepted"}"#,
            Some(1.0),
        ),
        (r#"envworker_work_queue_depth{endpoint="a"}"#, Some(0.0)),
        (r#"envworker_work_queue_depth{endpoint="b"}"#, Some(3.0)),
    ] {
        assert_eq!(sample(&text, series), expected, "{series}\n{text}");
    }
    assert!(!text.contains("no-such-endpoint"), "{text}");
}

/// A replica that starts (a restart, a scale-up) serves what already waits
/// in its queues without waiting for the next delivery.
#[tokio::test(flavor = "multi_thread")]
async fn serve_container_serves_work_already_queued_when_it_starts() {
    let fx = fixture(vec![key()]).await;
    let session = fx.canary().await;
    let (_, stop, served) = spawn_container(fx.state.clone(), Duration::from_secs(60)).await;
    let report = fx.server.final_report(&session, DRAIN_BOUND).await;
    assert_eq!(report["status"], "passed", "{report:#}");
    stop.send(()).unwrap();
    assert!(
        tokio::time::timeout(DRAIN_BOUND, served)
            .await
            .expect("serve_container returns")
            .unwrap()
            .unwrap()
    );
}

/// With an environment key the API refuses, readiness says so at once,
/// naming the endpoint and the cause (before: 200 `ready` while every
/// delivery was answered 202 and drained into a 401).
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_environment_key_turns_readiness_503_naming_the_endpoint() {
    let (fx, _) = fixture_tweaked(vec![("default", vec![key()])], |_, o| {
        o.environment_key = Some(Redacted::new("sk-ant-envkey-wrong".to_string()))
    })
    .await;
    let a = call(&fx.state, get("/readyz")).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{}", a.body);
    assert_eq!(a.body["status"], "unready", "{}", a.body);
    let default = &a.body["endpoints"]["default"];
    assert_eq!(default["ready"], false, "{}", a.body);
    assert_eq!(default["cause"], "credentials_refused", "{}", a.body);
    assert!(
        default["error"].as_str().unwrap().starts_with("401"),
        "{}",
        a.body
    );
}

/// One endpoint `default`, its worker's options changed by `tweak`.
async fn observed_fixture(tweak: impl Fn(&mut WorkerOptions)) -> Fx {
    fixture_tweaked(vec![("default", vec![key()])], |_, o| tweak(o))
        .await
        .0
}

/// `/readyz`'s body without each endpoint's `shell_sandbox` field, after
/// checking it says what these endpoints run: one item at a time, the shell
/// unconfined (the default), on whatever Landlock ABI this kernel has.
fn without_sandbox(mut body: Value) -> Value {
    if let Some(endpoints) = body["endpoints"].as_object_mut() {
        for (name, endpoint) in endpoints.iter_mut() {
            let sandbox = endpoint
                .as_object_mut()
                .and_then(|e| e.remove("shell_sandbox"))
                .unwrap_or_else(|| panic!("{name}: /readyz names no shell_sandbox"));
            assert_eq!(sandbox["mode"], "off", "{name}: {sandbox}");
            assert_eq!(sandbox["tmp"], "unconfined", "{name}: {sandbox}");
            assert!(sandbox["landlock_abi"].is_i64(), "{name}: {sandbox}");
        }
    }
    body
}

async fn readyz(fx: &Fx) -> Answer {
    call(&fx.state, get("/readyz")).await
}

async fn metrics_text(fx: &Fx) -> String {
    call(&fx.state, get("/metrics"))
        .await
        .body
        .as_str()
        .unwrap()
        .to_string()
}

/// `envworker_poll_errors_total` of endpoint `default` and `class` (0 if absent).
async fn poll_errors(fx: &Fx, class: &str) -> f64 {
    let text = metrics_text(fx).await;
    sample(
        &text,
        &format!(r#"envworker_poll_errors_total{{endpoint="default",class="{class}"}}"#),
    )
    .unwrap_or(0.0)
}

/// A key revoked while the replica is idle shows on the next readiness
/// probe (nothing else polls), and readiness recovers by itself once the
/// key works again. Revocation is the devserver refusing the work queue
/// with 401, as the API does for a revoked key.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_revoked_while_idle_shows_on_readiness_and_recovers_by_itself() {
    let fx = observed_fixture(|_| {}).await;
    fx.state.set_unready_after(Duration::from_secs(2));
    // A probe is due once the interval is over (a timer may wake a tick early).
    let every =
        envworker::serve::health::probe_every(Duration::from_secs(2)) + Duration::from_millis(50);
    let a = readyz(&fx).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    fx.server
        .add_faults(vec![
            json!({"path": "/v1/environments/*/work/*", "status": 401}),
        ])
        .await;
    // Within the probe interval readiness answers from what it knows.
    assert_eq!(readyz(&fx).await.status, StatusCode::OK);
    tokio::time::sleep(every).await;
    let a = readyz(&fx).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{}", a.body);
    assert_eq!(
        a.body["endpoints"]["default"]["cause"], "credentials_refused",
        "{}",
        a.body
    );
    assert!(poll_errors(&fx, "auth").await >= 1.0);
    // The key works again: the next probe says so.
    fx.server.clear_faults().await;
    tokio::time::sleep(every).await;
    let a = readyz(&fx).await;
    assert_eq!(
        (a.status, without_sandbox(a.body)),
        (
            StatusCode::OK,
            json!({"status": "ready", "endpoints": {"default": {"ready": true}}})
        )
    );
}

/// An API that gives no answer, or only 5xx, turns readiness 503 once it
/// has done so for `--unready-after` — not before — and readiness recovers
/// when it answers again.
#[tokio::test(flavor = "multi_thread")]
async fn an_api_failing_longer_than_the_threshold_turns_readiness_503_until_it_answers() {
    let fx = observed_fixture(|_| {}).await;
    let after = Duration::from_secs(2);
    fx.state.set_unready_after(after);
    let every = envworker::serve::health::probe_every(after) + Duration::from_millis(50);
    fx.server
        .add_faults(vec![
            json!({"path": "/v1/environments/*/work/*", "status": 503}),
        ])
        .await;
    let t0 = Instant::now();
    let a = readyz(&fx).await;
    assert_eq!(a.status, StatusCode::OK, "under the threshold: {}", a.body);
    assert_eq!(
        a.body["endpoints"]["default"]["failing_for_s"], 0,
        "{}",
        a.body
    );
    let a = loop {
        tokio::time::sleep(every).await;
        let a = readyz(&fx).await;
        if a.status != StatusCode::OK {
            break a;
        }
        assert!(
            t0.elapsed() < after + every * 3,
            "never unready: {}",
            a.body
        );
    };
    assert!(t0.elapsed() >= after, "unready before the threshold");
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    let default = &a.body["endpoints"]["default"];
    assert_eq!(default["cause"], "api_unreachable", "{}", a.body);
    assert_eq!(default["class"], "server", "{}", a.body);
    fx.server.clear_faults().await;
    tokio::time::sleep(every).await;
    assert_eq!(readyz(&fx).await.status, StatusCode::OK);
    assert!(poll_errors(&fx, "server").await >= 2.0);
}

/// No answer at all (nothing listens at the API's address) is an outage
/// of class `unreachable`.
#[tokio::test(flavor = "multi_thread")]
async fn an_api_nobody_answers_at_is_unreachable_past_the_threshold() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let fx = observed_fixture(|o| o.base_url = closed.clone()).await;
    let after = Duration::from_secs(1);
    fx.state.set_unready_after(after);
    assert_eq!(readyz(&fx).await.status, StatusCode::OK);
    tokio::time::sleep(envworker::serve::health::probe_every(after) + Duration::from_millis(100))
        .await;
    let a = readyz(&fx).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{}", a.body);
    assert_eq!(
        a.body["endpoints"]["default"]["class"], "unreachable",
        "{}",
        a.body
    );
    assert!(poll_errors(&fx, "unreachable").await >= 2.0);
}

/// The wait from an item's creation to its claim is observed per endpoint.
#[tokio::test(flavor = "multi_thread")]
async fn the_wait_from_enqueue_to_claim_is_a_histogram_per_endpoint() {
    let k = key();
    let fx = fixture(vec![k.clone()]).await;
    let session = fx.canary().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    call(
        &fx.state,
        delivery(&k, "whe_wait", &run_started("whe_wait")),
    )
    .await
    .accepted();
    fx.assert_served(&session).await;
    let text = metrics_text(&fx).await;
    assert_eq!(
        sample(
            &text,
            r#"envworker_work_queue_wait_seconds_count{endpoint="default"}"#
        ),
        Some(1.0),
        "{text}"
    );
    let waited = sample(
        &text,
        r#"envworker_work_queue_wait_seconds_sum{endpoint="default"}"#,
    )
    .unwrap();
    assert!((0.3..30.0).contains(&waited), "{waited}\n{text}");
}
