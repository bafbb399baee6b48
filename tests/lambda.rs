//! Lambda mode end to end against a local stand-in for the Lambda Runtime
//! API and Extensions API: `envworker serve` started with
//! `AWS_LAMBDA_RUNTIME_API` registers its internal extension, takes one
//! invocation (a Function URL event carrying a signed webhook), answers it
//! at once, and keeps working inside the invocation — the stand-in sees the
//! extension ask for its next event only after the memory flush and the
//! force-stop. The invocation deadline is honoured.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use common::{ADMIN_KEY, TestServer};
use envworker::devserver::DevserverConfig;
use envworker::webhook::SigningKey;
use reqwest::Method;
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

/// What the stand-in saw, with the time of each thing.
#[derive(Default)]
struct Seen {
    registered: Option<Instant>,
    runtime_waiting: Option<Instant>,
    response: Option<(Instant, Value)>,
    /// The extension asked for its next event after the invocation (the work is done).
    extension_done: Option<Instant>,
    errors: Vec<String>,
    /// Every call, in order (for failure messages).
    calls: Vec<String>,
}

#[derive(Clone)]
struct StandIn {
    seen: Arc<Mutex<Seen>>,
    /// The invocation to hand out: (event, deadline in epoch ms).
    invocation: Arc<Mutex<Option<(Value, u64)>>>,
    dispatched: watch::Sender<bool>,
    changed: Arc<Notify>,
    /// The deadline handed out, repeated in the extension's INVOKE event.
    deadline_ms: u64,
    /// Calls of the extension's `event/next`.
    extension_calls: Arc<std::sync::atomic::AtomicUsize>,
}

impl StandIn {
    fn note(&self, f: impl FnOnce(&mut Seen)) {
        f(&mut self.seen.lock().unwrap());
        self.changed.notify_waiters();
    }

    /// `true` once `done` holds, `false` after `timeout`.
    async fn wait_for(&self, timeout: Duration, done: impl Fn(&Seen) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            if done(&self.seen.lock().unwrap()) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let _ = tokio::time::timeout(left.min(Duration::from_millis(200)), notified).await;
        }
    }
}

async fn runtime_next(State(s): State<StandIn>) -> Response {
    s.note(|seen| seen.calls.push("runtime next".into()));
    s.note(|seen| seen.runtime_waiting = Some(Instant::now()));
    let Some((event, deadline)) = s.invocation.lock().unwrap().take() else {
        // Nothing more to run: hold the poll like a frozen environment would.
        std::future::pending::<()>().await;
        unreachable!()
    };
    s.dispatched.send_replace(true);
    (
        StatusCode::OK,
        [
            ("lambda-runtime-aws-request-id", "req-1".to_string()),
            ("lambda-runtime-deadline-ms", deadline.to_string()),
            (
                "lambda-runtime-invoked-function-arn",
                "arn:aws:lambda:us-east-1:123456789012:function:envworker".to_string(),
            ),
            (
                "lambda-runtime-trace-id",
                "Root=1-5759e988-bd862e3fe1be46a994272793".to_string(),
            ),
        ],
        axum::Json(event),
    )
        .into_response()
}

async fn runtime_response(State(s): State<StandIn>, body: axum::body::Bytes) -> StatusCode {
    let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    s.note(|seen| seen.response = Some((Instant::now(), value)));
    StatusCode::ACCEPTED
}

async fn error(State(s): State<StandIn>, body: String) -> StatusCode {
    s.note(|seen| seen.errors.push(body));
    StatusCode::ACCEPTED
}

async fn register(State(s): State<StandIn>) -> Response {
    s.note(|seen| seen.calls.push("register".into()));
    s.note(|seen| seen.registered = Some(Instant::now()));
    (
        StatusCode::OK,
        [("lambda-extension-identifier", "ext-1")],
        axum::Json(json!({"functionName": "envworker", "functionVersion": "$LATEST", "handler": "bootstrap"})),
    )
        .into_response()
}

async fn extension_next(State(s): State<StandIn>, _headers: HeaderMap) -> Response {
    s.note(|seen| seen.calls.push("extension next".into()));
    let mut dispatched = s.dispatched.subscribe();
    // The first call waits for the invocation; the second means the extension is done with it.
    if s.extension_calls
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        > 0
    {
        s.note(|seen| seen.extension_done = Some(Instant::now()));
        std::future::pending::<()>().await;
    }
    let _ = dispatched.wait_for(|d| *d).await;
    let deadline = s.deadline_ms;
    axum::Json(json!({
        "eventType": "INVOKE",
        "deadlineMs": deadline,
        "requestId": "req-1",
        "invokedFunctionArn": "arn:aws:lambda:us-east-1:123456789012:function:envworker",
        "tracing": {"type": "X-Amzn-Trace-Id", "value": "Root=1-5759e988-bd862e3fe1be46a994272793"}
    }))
    .into_response()
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A Function URL (API Gateway HTTP API v2) event carrying `body` with `headers`.
fn function_url_event(path: &str, headers: &[(String, String)], body: &str) -> Value {
    let mut h = serde_json::Map::new();
    h.insert("content-type".into(), json!("application/json"));
    for (k, v) in headers {
        h.insert(k.clone(), json!(v));
    }
    json!({
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": "",
        "headers": h,
        "requestContext": {
            "accountId": "123456789012", "apiId": "envworker", "domainName": "envworker.lambda-url.us-east-1.on.aws",
            "domainPrefix": "envworker",
            "http": {"method": "POST", "path": path, "protocol": "HTTP/1.1", "sourceIp": "203.0.113.7", "userAgent": "webhook-sender"},
            "requestId": "req-1", "routeKey": "$default", "stage": "$default",
            "time": "29/Nov/2026:10:00:00 +0000", "timeEpoch": epoch_ms()
        },
        "body": body,
        "isBase64Encoded": false
    })
}

struct Lambda {
    child: Child,
    stand_in: StandIn,
    stderr: Arc<Mutex<String>>,
}

impl Lambda {
    async fn wait_for(&self, what: &str, timeout: Duration, done: impl Fn(&Seen) -> bool) {
        if !self.stand_in.wait_for(timeout, done).await {
            let seen = self.stand_in.seen.lock().unwrap();
            panic!(
                "timed out waiting for {what}; errors: {:?}; calls: {:?}\n--- envworker stderr ---\n{}",
                seen.errors,
                seen.calls,
                self.stderr.lock().unwrap()
            );
        }
    }
}

impl Drop for Lambda {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start the stand-in and `envworker serve` as a Lambda function; one invocation is queued.
async fn lambda(
    server: &TestServer,
    env: (&str, &str),
    secret: &str,
    event: Value,
    deadline_ms: u64,
    extra: &[&str],
) -> Lambda {
    let mut args = vec!["serve", "--max-idle", "1s", "--memory-sync-interval", "5s"];
    args.extend_from_slice(extra);
    lambda_with_args(server, env, secret, event, deadline_ms, &args).await
}

/// [`lambda`] with exactly `args` on the command line (none: as Lambda starts `bootstrap`).
async fn lambda_with_args(
    server: &TestServer,
    env: (&str, &str),
    secret: &str,
    event: Value,
    deadline_ms: u64,
    args: &[&str],
) -> Lambda {
    let (dispatched, _) = watch::channel(false);
    let stand_in = StandIn {
        seen: Arc::default(),
        invocation: Arc::new(Mutex::new(Some((event, deadline_ms)))),
        dispatched,
        changed: Arc::new(Notify::new()),
        deadline_ms,
        extension_calls: Arc::default(),
    };
    let app = Router::new()
        .route("/2018-06-01/runtime/invocation/next", get(runtime_next))
        .route(
            "/2018-06-01/runtime/invocation/{id}/response",
            post(runtime_response),
        )
        .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
        .route("/2018-06-01/runtime/init/error", post(error))
        .route("/2020-01-01/extension/register", post(register))
        .route("/2020-01-01/extension/event/next", get(extension_next))
        .route("/2020-01-01/extension/init/error", post(error))
        .route("/2020-01-01/extension/exit/error", post(error))
        .with_state(stand_in.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let tmp = tempfile::tempdir().unwrap().keep();
    let mut child = Command::new(env!("CARGO_BIN_EXE_envworker"))
        .args(args)
        .env("RUST_LOG", "info,envworker::serve::lambda=debug")
        .envs([
            ("AWS_LAMBDA_RUNTIME_API", api.as_str()),
            ("AWS_LAMBDA_FUNCTION_NAME", "envworker"),
            ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "1024"),
            ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST"),
            ("ANTHROPIC_BASE_URL", server.url().as_str()),
            ("ANTHROPIC_ENVIRONMENT_ID", env.0),
            ("ANTHROPIC_ENVIRONMENT_KEY", env.1),
            ("ANTHROPIC_WEBHOOK_SIGNING_KEY", secret),
            ("ENVWORKER_WORKDIR", tmp.join("work").to_str().unwrap()),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = common::process::collect_stderr(&mut child);
    Lambda {
        child,
        stand_in,
        stderr,
    }
}

struct Fixture {
    server: TestServer,
    env: (String, String),
    secret: String,
    key: SigningKey,
    _mnt: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    let mnt = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(
        DevserverConfig::new(ADMIN_KEY)
            .mount_root(mnt.path().join("advertised/memory").to_str().unwrap()),
    )
    .await;
    let env = server
        .dev(Method::POST, "/dev/environments", Some(json!({})))
        .await
        .ok();
    let (key, secret) = SigningKey::generate();
    Fixture {
        env: (
            env["environment_id"].as_str().unwrap().into(),
            env["environment_key"].as_str().unwrap().into(),
        ),
        server,
        secret,
        key,
        _mnt: mnt,
    }
}

impl Fixture {
    fn webhook_event(&self, session_id: &str) -> Value {
        let body =
            json!({"type": "event", "id": "whe_lambda_1", "created_at": "2026-11-29T10:00:00Z",
                          "data": {"type": "session.status_run_started", "id": session_id}})
            .to_string();
        let now = (epoch_ms() / 1000) as i64;
        let headers = vec![
            ("webhook-id".to_string(), "whe_lambda_1".to_string()),
            ("webhook-timestamp".to_string(), now.to_string()),
            (
                "webhook-signature".to_string(),
                self.key.sign("whe_lambda_1", now, body.as_bytes()),
            ),
        ];
        function_url_event("/webhooks/default", &headers, &body)
    }

    async fn store_contents(&self, session_id: &str) -> Value {
        let session = self
            .server
            .agents(Method::GET, &format!("/v1/sessions/{session_id}"), None)
            .await
            .ok();
        let store = session["resources"][0]["memory_store_id"]
            .as_str()
            .unwrap()
            .to_string();
        let (memories, _) = self
            .server
            .list_all(&format!("/v1/memory_stores/{store}/memories?view=full"))
            .await;
        memories
            .iter()
            .map(|m| {
                (
                    m["path"].as_str().unwrap().to_string(),
                    m["content"].clone(),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    async fn work_state(&self) -> String {
        let work = self
            .server
            .agents(
                Method::GET,
                &format!("/v1/environments/{}/work", self.env.0),
                None,
            )
            .await
            .ok();
        work["data"][0]["state"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_webhook_is_answered_first_and_the_flush_happens_inside_the_invocation() {
    let fx = fixture().await;
    let advertised = fx._mnt.path().join("advertised/memory");
    let actual = fx._mnt.path().join("actual/memory");
    let started = fx
        .server
        .start_scenario(&json!({
            "name": "lambda",
            "environment_id": fx.env.0,
            "memory_stores": [{"key": "notes", "name": "Notes", "access": "read_write", "memories": {"/a.md": "alpha\n"}}],
            "steps": [
                {"tool": "write", "input": {"file_path": "{mount:notes}/b.md", "content": "from lambda\n"},
                 "expect": {"is_error": false, "contains": "{mount:notes}/b.md"}},
                {"tool": "bash", "input": {"command": "ls {mount:notes} && pwd"}, "expect": {"contains": "b.md"}},
                {"tool": "glob", "input": {"pattern": "*.md", "path": "{mount:notes}"}, "expect": {"contains": "{mount:notes}/a.md"}}
            ],
            "expect_final": {"notes": {"/a.md": "alpha\n", "/b.md": "from lambda\n"}}
        }))
        .await;
    let deadline = epoch_ms() + 300_000;
    let remap = format!("{}={}", advertised.display(), actual.display());
    let lambda = lambda(
        &fx.server,
        (&fx.env.0, &fx.env.1),
        &fx.secret,
        fx.webhook_event(&started.session_id),
        deadline,
        &["--mount-remap", &remap],
    )
    .await;
    let s = &lambda.stand_in;
    lambda
        .wait_for("the response", Duration::from_secs(30), |seen| {
            seen.response.is_some()
        })
        .await;
    let (answered_at, response) = s.seen.lock().unwrap().response.clone().unwrap();
    assert_eq!(response["statusCode"], 202, "{response:#}");
    assert!(
        response["body"].as_str().unwrap().contains("accepted"),
        "{response:#}"
    );
    lambda
        .wait_for(
            "the extension's next event",
            Duration::from_secs(60),
            |seen| seen.extension_done.is_some(),
        )
        .await;
    let done_at = s.seen.lock().unwrap().extension_done.unwrap();
    assert!(
        done_at > answered_at + Duration::from_millis(500),
        "the work ran after the answer"
    );
    // At the moment the invocation ends, everything is saved and the item stopped.
    let contents = fx.store_contents(&started.session_id).await;
    assert_eq!(contents["/b.md"], "from lambda\n", "{contents:#}");
    assert_eq!(fx.work_state().await, "stopped");
    let report = fx
        .server
        .final_report(&started.session_id, Duration::from_secs(30))
        .await;
    assert_eq!(
        report["status"],
        "passed",
        "{report:#}\n{}",
        lambda.stderr.lock().unwrap()
    );
    // The advertised paths worked although the files lived elsewhere.
    assert!(
        !advertised.exists(),
        "nothing was created at the advertised root"
    );
    assert!(s.seen.lock().unwrap().errors.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn started_bare_it_serves_and_claims_no_item_when_the_invocation_has_too_little_time_left() {
    let fx = fixture().await;
    let started = fx
        .server
        .start_scenario(&json!({"name": "late", "environment_id": fx.env.0, "steps": [{"tool": "bash", "input": {"command": "true"}}]}))
        .await;
    let deadline = epoch_ms() + 30_000; // under the 65 s teardown reserve + 60 s serving time
    // Started as Lambda starts a custom runtime's `bootstrap`: no arguments at all.
    let lambda = lambda_with_args(
        &fx.server,
        (&fx.env.0, &fx.env.1),
        &fx.secret,
        fx.webhook_event(&started.session_id),
        deadline,
        &[],
    )
    .await;

    lambda
        .wait_for(
            "the extension's next event",
            Duration::from_secs(20),
            |seen| seen.extension_done.is_some(),
        )
        .await;
    assert_eq!(
        fx.work_state().await,
        "queued",
        "the item waits for an invocation with time to serve it"
    );
    assert!(
        lambda
            .stderr
            .lock()
            .unwrap()
            .contains("serving webhooks on AWS Lambda"),
        "{}",
        lambda.stderr.lock().unwrap()
    );
    assert!(
        lambda
            .stderr
            .lock()
            .unwrap()
            .contains("too little time left"),
        "{}",
        lambda.stderr.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_session_ends_in_time_for_its_teardown_before_the_deadline() {
    let fx = fixture().await;
    let started = fx
        .server
        .start_scenario(&json!({
            "name": "long",
            "environment_id": fx.env.0,
            "memory_stores": [{"key": "notes", "name": "Notes", "access": "read_write", "memories": {}}],
            "steps": [
                {"tool": "write", "input": {"file_path": "{mount:notes}/late.md", "content": "keep me\n"}},
                {"wait_ms": 120000}
            ]
        }))
        .await;
    let deadline_in = Duration::from_secs(30);
    let deadline = epoch_ms() + deadline_in.as_millis() as u64;
    let t0 = Instant::now();
    let remap_root = tempfile::tempdir().unwrap();
    let remap = format!(
        "{}={}",
        fx._mnt.path().join("advertised/memory").display(),
        remap_root.path().join("memory").display()
    );
    // Teardown bounds of 2 s → a 19 s reserve (2 × 2 s, 10 s for the force-stop, 5 s);
    // 1 s of serving time is enough to claim. The session is cut at about 11 s.
    let lambda = lambda(
        &fx.server,
        (&fx.env.0, &fx.env.1),
        &fx.secret,
        fx.webhook_event(&started.session_id),
        deadline,
        &[
            "--memory-teardown-bound",
            "2s",
            "--min-serving-time",
            "1s",
            "--mount-remap",
            &remap,
        ],
    )
    .await;
    let s = &lambda.stand_in;
    lambda
        .wait_for(
            "the extension's next event",
            Duration::from_secs(30),
            |seen| seen.extension_done.is_some(),
        )
        .await;
    let done = s.seen.lock().unwrap().extension_done.unwrap();
    assert!(
        done.duration_since(t0) < deadline_in,
        "the invocation outlived its deadline: {:?}",
        done.duration_since(t0)
    );
    assert!(
        done.duration_since(t0) >= Duration::from_secs(10),
        "the session was served until the reserve"
    );
    let contents = fx.store_contents(&started.session_id).await;
    assert_eq!(
        contents["/late.md"],
        "keep me\n",
        "{}",
        lambda.stderr.lock().unwrap()
    );
    assert_eq!(fx.work_state().await, "stopped");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_event_the_runtime_cannot_decode_does_not_hold_the_invocation_past_its_deadline() {
    let fx = fixture().await;
    // A console test event: not an HTTP request, so the handler is never called.
    let deadline_in = Duration::from_secs(4);
    let t0 = Instant::now();
    let lambda = lambda(
        &fx.server,
        (&fx.env.0, &fx.env.1),
        &fx.secret,
        json!({"key1": "value1"}),
        epoch_ms() + deadline_in.as_millis() as u64,
        &[],
    )
    .await;
    lambda
        .wait_for(
            "the extension's next event",
            Duration::from_secs(20),
            |seen| seen.extension_done.is_some(),
        )
        .await;
    let seen = lambda.stand_in.seen.lock().unwrap();
    let done = seen.extension_done.unwrap().duration_since(t0);
    assert!(
        done < deadline_in + Duration::from_secs(2),
        "the invocation was held {done:?}, past its deadline"
    );
    assert!(
        !seen.errors.is_empty() || seen.response.is_some(),
        "the runtime reported the invocation"
    );
}
