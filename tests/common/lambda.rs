//! A stand-in for the Lambda Runtime API and Extensions API, and
//! `envworker serve` started under it as a Lambda function: one invocation
//! is handed out; what the function does with it is recorded with times.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use envworker::devserver::DevserverConfig;
use envworker::webhook::SigningKey;
use serde_json::{Value, json};

use super::{ADMIN_KEY, TestServer};
use tokio::sync::{Notify, watch};

const REQUEST_ID: &str = "req-1";
const FUNCTION_ARN: &str = "arn:aws:lambda:us-east-1:123456789012:function:envworker";
const TRACE_ID: &str = "Root=1-5759e988-bd862e3fe1be46a994272793";

pub fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// What the stand-in saw, with the time of each thing.
#[derive(Default)]
pub struct Seen {
    pub registered: Option<Instant>,
    pub runtime_waiting: Option<Instant>,
    pub response: Option<(Instant, Value)>,
    /// The extension asked for its next event after the invocation (the work is done).
    pub extension_done: Option<Instant>,
    pub errors: Vec<String>,
    /// Every call, in order (for failure messages).
    pub calls: Vec<String>,
}

#[derive(Clone)]
pub struct StandIn {
    pub seen: Arc<Mutex<Seen>>,
    /// The invocation still to hand out.
    invocation: Arc<Mutex<Option<Value>>>,
    dispatched: watch::Sender<bool>,
    changed: Arc<Notify>,
    /// The deadline handed out to the runtime.
    deadline_ms: u64,
    /// The deadline in the extension's INVOKE event (the same, unless told otherwise).
    extension_deadline_ms: u64,
    /// Calls of the extension's `event/next`.
    extension_calls: Arc<AtomicUsize>,
}

impl StandIn {
    /// Serve the stand-in on a free port with one invocation of `event`;
    /// returns it and its address (for `AWS_LAMBDA_RUNTIME_API`).
    pub async fn start(event: Value, deadline_ms: u64) -> (StandIn, String) {
        Self::start_with(event, deadline_ms, deadline_ms).await
    }

    /// [`start`](Self::start), telling the extension `extension_deadline_ms`
    /// instead: the invocation ends earlier than the runtime was told.
    pub async fn start_with(
        event: Value,
        deadline_ms: u64,
        extension_deadline_ms: u64,
    ) -> (StandIn, String) {
        let stand_in = StandIn {
            seen: Arc::default(),
            invocation: Arc::new(Mutex::new(Some(event))),
            dispatched: watch::channel(false).0,
            changed: Arc::new(Notify::new()),
            deadline_ms,
            extension_deadline_ms,
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
        (stand_in, api)
    }

    fn note(&self, f: impl FnOnce(&mut Seen)) {
        f(&mut self.seen.lock().unwrap());
        self.changed.notify_waiters();
    }

    /// `true` once `done` holds, `false` after `timeout`.
    pub async fn wait_for(&self, timeout: Duration, done: impl Fn(&Seen) -> bool) -> bool {
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
    s.note(|seen| {
        seen.calls.push("runtime next".into());
        seen.runtime_waiting = Some(Instant::now());
    });
    let Some(event) = s.invocation.lock().unwrap().take() else {
        // Nothing more to run: hold the poll like a frozen environment would.
        std::future::pending::<()>().await;
        unreachable!()
    };
    s.dispatched.send_replace(true);
    (
        StatusCode::OK,
        [
            ("lambda-runtime-aws-request-id", REQUEST_ID.to_string()),
            ("lambda-runtime-deadline-ms", s.deadline_ms.to_string()),
            (
                "lambda-runtime-invoked-function-arn",
                FUNCTION_ARN.to_string(),
            ),
            ("lambda-runtime-trace-id", TRACE_ID.to_string()),
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
    s.note(|seen| {
        seen.calls.push("register".into());
        seen.registered = Some(Instant::now());
    });
    (
        StatusCode::OK,
        [("lambda-extension-identifier", "ext-1")],
        axum::Json(json!({"functionName": "envworker", "functionVersion": "$LATEST", "handler": "bootstrap"})),
    )
        .into_response()
}

async fn extension_next(State(s): State<StandIn>) -> Response {
    s.note(|seen| seen.calls.push("extension next".into()));
    let mut dispatched = s.dispatched.subscribe();
    // The first call waits for the invocation; the second means the extension is done with it.
    if s.extension_calls.fetch_add(1, Ordering::SeqCst) > 0 {
        s.note(|seen| seen.extension_done = Some(Instant::now()));
        std::future::pending::<()>().await;
    }
    let _ = dispatched.wait_for(|d| *d).await;
    axum::Json(json!({
        "eventType": "INVOKE",
        "deadlineMs": s.extension_deadline_ms,
        "requestId": REQUEST_ID,
        "invokedFunctionArn": FUNCTION_ARN,
        "tracing": {"type": "X-Amzn-Trace-Id", "value": TRACE_ID}
    }))
    .into_response()
}

/// `envworker ARGS…` as a Lambda function of the stand-in at `api`, with
/// `envs` on top of the variables Lambda sets; its stderr is collected.
pub fn spawn_function(
    api: &str,
    args: &[&str],
    envs: &[(&str, &str)],
) -> (Child, Arc<Mutex<String>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_envworker"))
        .args(args)
        .env("RUST_LOG", "info,envworker::serve::lambda=debug")
        .env_remove("AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH")
        .envs([
            ("AWS_LAMBDA_RUNTIME_API", api),
            ("AWS_LAMBDA_FUNCTION_NAME", "envworker"),
            ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "1024"),
            ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST"),
        ])
        .envs(envs.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = super::process::collect_stderr(&mut child);
    (child, stderr)
}

/// A Function URL (API Gateway HTTP API v2) event carrying `body` with `headers`.
pub fn function_url_event(path: &str, headers: &[(String, String)], body: &str) -> Value {
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

pub struct Fixture {
    pub server: TestServer,
    pub env: (String, String),
    pub secret: String,
    pub key: SigningKey,
    pub _mnt: tempfile::TempDir,
}

pub async fn fixture() -> Fixture {
    let mnt = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(
        DevserverConfig::new(ADMIN_KEY)
            .mount_root(mnt.path().join("advertised/memory").to_str().unwrap()),
    )
    .await;
    let env = server.create_environment().await;
    let (key, secret) = SigningKey::generate();
    Fixture {
        env,
        server,
        secret,
        key,
        _mnt: mnt,
    }
}

impl Fixture {
    /// A scenario that writes `/b.md` (`content`) beside the seeded `/a.md`
    /// in a store advertised under the fixture's mount root, and the
    /// `--mount-remap` that keeps it under `actual/` instead.
    pub async fn memory_scenario(&self, name: &str, content: &str) -> (super::Started, String) {
        let started = self
            .server
            .start_scenario(&json!({
                "name": name,
                "environment_id": self.env.0,
                "memory_stores": [{"key": "notes", "name": "Notes", "access": "read_write", "memories": {"/a.md": "alpha\n"}}],
                "steps": [
                    {"tool": "write", "input": {"file_path": "{mount:notes}/b.md", "content": content},
                     "expect": {"is_error": false, "contains": "{mount:notes}/b.md"}},
                    {"tool": "bash", "input": {"command": "ls {mount:notes} && pwd"}, "expect": {"contains": "b.md"}},
                    {"tool": "glob", "input": {"pattern": "*.md", "path": "{mount:notes}"}, "expect": {"contains": "{mount:notes}/a.md"}}
                ],
                "expect_final": {"notes": {"/a.md": "alpha\n", "/b.md": content}}
            }))
            .await;
        let remap = self.remap_to(&self._mnt.path().join("actual"));
        (started, remap)
    }

    /// A session that writes `file` (`content`) in an empty writable store,
    /// then would go on for two minutes: its edit is saved only by the
    /// teardown, unless a periodic sync comes first.
    pub async fn long_session(&self, name: &str, file: &str, content: &str) -> super::Started {
        self.server
            .start_scenario(&json!({
                "name": name,
                "environment_id": self.env.0,
                "memory_stores": [{"key": "notes", "name": "Notes", "access": "read_write", "memories": {}}],
                "steps": [
                    {"tool": "write", "input": {"file_path": format!("{{mount:notes}}/{file}"), "content": content}},
                    {"wait_ms": 120000}
                ]
            }))
            .await
    }

    /// The `--mount-remap` that keeps the stores advertised under the
    /// fixture's mount root in `memory` under `root` instead.
    pub fn remap_to(&self, root: &std::path::Path) -> String {
        format!(
            "{}={}",
            self._mnt.path().join("advertised/memory").display(),
            root.join("memory").display()
        )
    }

    pub fn webhook_event(&self, session_id: &str) -> Value {
        self.webhook_event_with(session_id, &[])
    }

    /// [`webhook_event`](Self::webhook_event) with more request headers
    /// (W3C trace context, say).
    pub fn webhook_event_with(&self, session_id: &str, extra: &[(&str, &str)]) -> Value {
        let body =
            json!({"type": "event", "id": "whe_lambda_1", "created_at": "2026-11-29T10:00:00Z",
                          "data": {"type": "session.status_run_started", "id": session_id}})
            .to_string();
        let now = (epoch_ms() / 1000) as i64;
        let mut headers: Vec<(String, String)> = extra
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        headers.extend([
            ("webhook-id".to_string(), "whe_lambda_1".to_string()),
            ("webhook-timestamp".to_string(), now.to_string()),
            (
                "webhook-signature".to_string(),
                self.key.sign("whe_lambda_1", now, body.as_bytes()),
            ),
        ]);
        function_url_event("/webhooks/default", &headers, &body)
    }
}

/// EventBridge's scheduled event, as `infra/template.yaml`'s schedule sends it.
pub fn scheduled_event() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("events/schedule/eventbridge.scheduled.json");
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}
