//! The sample events of `events/` stay usable: every webhook body under
//! `events/webhooks/` is signed by `envworker webhook sign` into headers that
//! verify over the file's exact bytes, and gets the answer its type calls for
//! from the serve app; every Lambda envelope under `events/lambda/` is an
//! event `lambda_http` accepts, carrying a sample's exact bytes, and
//! `events/sign-envelope.sh` re-signs it into one the Lambda handler accepts.
//!
//! The directories are read, not listed here: a sample added later is covered.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::TestServer;
use crate::common::container::spawn_container;
use crate::common::lambda::{StandIn, epoch_ms, spawn_function};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use envworker::api::types::Redacted;
use envworker::serve::{AppState, Endpoint, Mode, RUN_STARTED, app};
use envworker::webhook::{self, SigningKey, WebhookHeaders};
use envworker::worker::poll::DrainOptions;
use envworker::worker::{EnvironmentWorker, WorkerOptions};
use http_body_util::BodyExt;
use lambda_http::RequestExt;
use lambda_http::request::LambdaRequest;
use serde_json::{Value, json};
use tower::ServiceExt;

const BIN: &str = env!("CARGO_BIN_EXE_envworker");
const SIGNED_HEADERS: [&str; 3] = ["webhook-id", "webhook-timestamp", "webhook-signature"];

fn events_dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("events")
        .join(sub)
}

/// Every `*.json` of `events/<sub>/`, sorted; there is at least one.
fn samples(sub: &str) -> Vec<PathBuf> {
    let dir = events_dir(sub);
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no samples in {}", dir.display());
    out
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// What `envworker webhook sign` printed.
struct CliSigned {
    headers: Vec<(String, String)>,
    curl: String,
}

impl CliSigned {
    fn header(&self, name: &str) -> &str {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no {name} among {:?}", self.headers))
    }

    fn webhook_headers(&self) -> WebhookHeaders<'_> {
        WebhookHeaders {
            id: Some(self.header("webhook-id")),
            timestamp: Some(self.header("webhook-timestamp")),
            signature: Some(self.header("webhook-signature")),
        }
    }
}

/// Run the real binary: `envworker webhook sign --key KEY [--url URL] FILE`.
fn cli_sign(key: &str, file: &Path, url: Option<&str>) -> CliSigned {
    let mut cmd = Command::new(BIN);
    cmd.args(["webhook", "sign", "--key", key])
        .env_remove("ANTHROPIC_WEBHOOK_SIGNING_KEY");
    if let Some(url) = url {
        cmd.args(["--url", url]);
    }
    let out = cmd.arg(file).output().expect("envworker runs");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{}: {stdout}{}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !stdout.contains(key) && !String::from_utf8_lossy(&out.stderr).contains(key),
        "the key was printed"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "three headers and a curl line:\n{stdout}");
    let headers = lines[..3]
        .iter()
        .map(|line| {
            let (name, value) = line
                .split_once(": ")
                .unwrap_or_else(|| panic!("not a header line: {line:?}"));
            (name.to_string(), value.to_string())
        })
        .collect::<Vec<_>>();
    let names: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, SIGNED_HEADERS, "{stdout}");
    CliSigned {
        headers,
        curl: lines[3].to_string(),
    }
}

/// A fresh `whsec_` key: its text and its parsed form.
fn fresh_key() -> (String, SigningKey) {
    let (key, text) = SigningKey::generate();
    (text, key)
}

/// The serve app over a devserver environment with an empty queue, one
/// endpoint `default` under `key`.
struct App {
    server: TestServer,
    state: AppState,
    env: (String, String),
    _workdir: tempfile::TempDir,
}

async fn serve_app(key: SigningKey) -> App {
    let server = TestServer::start().await;
    let env = server.create_environment().await;
    let workdir = tempfile::tempdir().unwrap();
    let mut options = WorkerOptions::new(&env.0, server.url());
    options.environment_key = Some(Redacted::new(env.1.clone()));
    options.workdir = workdir.path().to_path_buf();
    options.max_idle = Some(Duration::from_secs(1));
    let worker = EnvironmentWorker::new(options).unwrap();
    let state = AppState::new(
        vec![Endpoint::new(
            "default",
            vec![key],
            worker,
            DrainOptions::default(),
        )],
        Mode::Container,
    );
    App {
        server,
        state,
        env,
        _workdir: workdir,
    }
}

/// Hand `request` to the app; the status and the JSON body.
async fn call(state: &AppState, request: Request<Body>) -> (StatusCode, Value) {
    let response = app(state.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
        panic!(
            "{status}: the body is not JSON: {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    (status, body)
}

#[test]
fn webhook_samples_are_thin_events_named_after_their_type() {
    let mut kinds = Vec::new();
    for path in samples("webhooks") {
        let bytes = std::fs::read(&path).unwrap();
        let event: Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
        let name = path.display();
        assert_eq!(event["type"], "event", "{name}");
        assert!(
            event["id"].as_str().is_some_and(|i| i.starts_with("whe_")),
            "{name}: id"
        );
        let created = event["created_at"].as_str().unwrap_or_default();
        assert!(
            chrono::DateTime::parse_from_rfc3339(created).is_ok(),
            "{name}: created_at {created:?} is not RFC 3339"
        );
        let kind = event["data"]["type"].as_str().unwrap_or_default();
        assert_eq!(
            path.file_stem().unwrap().to_str().unwrap(),
            kind,
            "{name}: a sample is named after its data.type"
        );
        if kind.starts_with("session.") {
            assert!(
                event["data"]["id"]
                    .as_str()
                    .is_some_and(|i| i.starts_with("sesn_")),
                "{name}: data.id"
            );
        }
        for field in ["organization_id", "workspace_id"] {
            assert!(event["data"][field].is_string(), "{name}: data.{field}");
        }
        kinds.push(kind.to_string());
    }
    assert!(
        kinds.iter().any(|k| k == RUN_STARTED),
        "a {RUN_STARTED} sample: {kinds:?}"
    );
    assert!(
        kinds.iter().any(|k| k != RUN_STARTED),
        "an ignored sample: {kinds:?}"
    );
}

#[test]
fn the_cli_signs_every_webhook_sample_over_its_exact_bytes() {
    let (key_text, key) = fresh_key();
    for path in samples("webhooks") {
        let bytes = std::fs::read(&path).unwrap();
        let event: Value = serde_json::from_slice(&bytes).unwrap();
        let before = now();
        let signed = cli_sign(&key_text, &path, None);
        let name = path.display();
        // The id is the event's; the timestamp is now.
        assert_eq!(
            signed.header("webhook-id"),
            event["id"].as_str().unwrap(),
            "{name}"
        );
        let ts: i64 = signed.header("webhook-timestamp").parse().unwrap();
        assert!((before - 1..=now() + 1).contains(&ts), "{name}: {ts}");
        assert_eq!(
            webhook::verify(
                std::slice::from_ref(&key),
                signed.webhook_headers(),
                &bytes,
                now()
            ),
            Ok(event["id"].as_str().unwrap()),
            "{name}"
        );
        // Over the exact bytes: the same JSON re-serialised does not verify.
        let reserialised = serde_json::to_vec_pretty(&event).unwrap();
        assert_ne!(reserialised, bytes);
        assert_eq!(
            webhook::verify(
                std::slice::from_ref(&key),
                signed.webhook_headers(),
                &reserialised,
                now()
            ),
            Err(webhook::WebhookError::NoMatch),
            "{name}"
        );
        // The curl line posts the file with the three headers.
        let curl = &signed.curl;
        assert!(curl.starts_with("curl "), "{curl}");
        assert!(
            curl.contains("-X POST 'http://127.0.0.1:8080/webhooks/default'"),
            "{curl}"
        );
        assert!(
            curl.contains("-H 'content-type: application/json'"),
            "{curl}"
        );
        for (header, value) in &signed.headers {
            assert!(curl.contains(&format!("-H '{header}: {value}'")), "{curl}");
        }
        assert!(
            curl.ends_with(&format!("--data-binary @'{}'", path.display())),
            "{curl}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_webhook_sample_gets_the_answer_its_type_calls_for() {
    let (key_text, key) = fresh_key();
    let fx = serve_app(key).await;
    let mut accepted = 0;
    for path in samples("webhooks") {
        let name = path.display();
        // An item waits in the queue: a run-started sample drains it, any other leaves it.
        let queued = fx
            .server
            .start_scenario(&json!({
                "name": "waiting", "environment_id": fx.env.0,
                "steps": [{"tool": "bash", "input": {"command": "true"}}]
            }))
            .await
            .session_id;
        let bytes = std::fs::read(&path).unwrap();
        let event: Value = serde_json::from_slice(&bytes).unwrap();
        let signed = cli_sign(&key_text, &path, None);
        let mut request =
            Request::post("/webhooks/default").header("content-type", "application/json");
        for (name, value) in &signed.headers {
            request = request.header(name, value);
        }
        let (status, body) = call(&fx.state, request.body(Body::from(bytes)).unwrap()).await;
        assert!(fx.state.wait_for_work(Duration::from_secs(60)).await);
        if event["data"]["type"] == RUN_STARTED {
            assert_eq!(status, StatusCode::ACCEPTED, "{name}: {body}");
            assert_eq!(body, json!({"status": "accepted"}), "{name}");
            let report = fx
                .server
                .final_report(&queued, Duration::from_secs(60))
                .await;
            assert_eq!(report["status"], "passed", "{name}: {report:#}");
            accepted += 1;
        } else {
            assert_eq!(status, StatusCode::OK, "{name}: {body}");
            assert_eq!(body, json!({"status": "ignored"}), "{name}");
            assert_eq!(
                fx.server.work_state(&fx.env.0, &queued).await,
                "queued",
                "{name}: no drain"
            );
        }
    }
    assert!(accepted > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_printed_curl_line_delivers_each_sample_to_a_running_server() {
    if Command::new("curl").arg("--version").output().is_err() {
        eprintln!("curl is not installed; skipping the curl line check");
        return;
    }
    let (key_text, key) = fresh_key();
    let fx = serve_app(key).await;
    let (addr, stop, served) = spawn_container(fx.state.clone(), Duration::from_secs(30)).await;
    let url = format!("http://{addr}/webhooks/default");
    for path in samples("webhooks") {
        let event: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let signed = cli_sign(&key_text, &path, Some(&url));
        let curl = signed.curl.clone();
        let out = tokio::task::spawn_blocking(move || {
            Command::new("bash")
                .args(["-c", &format!("{curl} -w '\\n%{{http_code}}'")])
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (body, code) = stdout.rsplit_once('\n').unwrap();
        let body: Value = serde_json::from_str(body).unwrap();
        if event["data"]["type"] == RUN_STARTED {
            assert_eq!((code, body), ("202", json!({"status": "accepted"})));
        } else {
            assert_eq!((code, body), ("200", json!({"status": "ignored"})));
        }
    }
    stop.send(()).unwrap();
    assert!(served.await.unwrap().unwrap(), "the drain ended in time");
}

/// The webhook sample an envelope carries: `events/webhooks/<data.type>.json`.
fn sample_for(body: &[u8]) -> (PathBuf, Vec<u8>) {
    let event: Value = serde_json::from_slice(body).expect("the envelope's body is JSON");
    let kind = event["data"]["type"].as_str().expect("data.type");
    let path = events_dir("webhooks").join(format!("{kind}.json"));
    let bytes = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("the matching sample {}: {e}", path.display()));
    (path, bytes)
}

/// Parse an envelope as the Lambda runtime does; the kind must match its name.
fn parse_envelope(path: &Path, text: &str) -> lambda_http::Request {
    let name = path.file_name().unwrap().to_str().unwrap();
    let parsed: LambdaRequest = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("{name}: not a Lambda HTTP event: {e}"));
    match (name.split('.').next().unwrap(), &parsed) {
        ("function-url", LambdaRequest::ApiGatewayV2(_))
        | ("apigw-v1", LambdaRequest::ApiGatewayV1(_)) => {}
        (kind, other) => panic!(
            "{name}: a {kind:?} envelope parsed as {:?} (name envelopes function-url.* or apigw-v1.*)",
            other.request_origin()
        ),
    }
    parsed.into()
}

#[test]
fn lambda_envelopes_are_valid_events_that_carry_a_sample() {
    for path in samples("lambda") {
        let text = std::fs::read_to_string(&path).unwrap();
        let request = parse_envelope(&path, &text);
        let name = path.display();
        assert_eq!(request.method(), http::Method::POST, "{name}");
        assert_eq!(request.raw_http_path(), "/webhooks/default", "{name}");
        assert_eq!(
            request.headers()["content-type"],
            "application/json",
            "{name}"
        );
        for header in SIGNED_HEADERS {
            assert!(request.headers().contains_key(header), "{name}: {header}");
        }
        let body: &[u8] = request.body().as_ref();
        let (sample, bytes) = sample_for(body);
        assert!(
            body == bytes.as_slice(),
            "{name}: the body differs from {} — regenerate it with events/sign-envelope.sh",
            sample.display()
        );
        let event: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(
            request.headers()["webhook-id"],
            event["id"].as_str().unwrap(),
            "{name}: webhook-id is the event id"
        );
    }
}

/// Run `events/sign-envelope.sh KEY SAMPLE ENVELOPE` with this build's binary.
fn sign_envelope(key: &str, sample: &Path, envelope: &Path) -> String {
    let out = Command::new("bash")
        .arg(events_dir("sign-envelope.sh"))
        .args([Path::new(key), sample, envelope])
        .env("ENVWORKER", BIN)
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "sign-envelope.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn sign_envelope_re_signs_each_envelope_so_that_it_verifies() {
    let (key_text, key) = fresh_key();
    for path in samples("lambda") {
        let original = std::fs::read_to_string(&path).unwrap();
        let committed = parse_envelope(&path, &original);
        let (sample, sample_bytes) = sample_for(committed.body().as_ref());
        let before = now();
        let text = sign_envelope(&key_text, &sample, &path);
        let name = path.display();
        let signed = parse_envelope(&path, &text);
        let headers = WebhookHeaders::from_http(signed.headers());
        let body: &[u8] = signed.body().as_ref();
        assert!(body == sample_bytes.as_slice(), "{name}: body");
        assert!(
            webhook::verify(std::slice::from_ref(&key), headers, body, now()).is_ok(),
            "{name}: the re-signed envelope does not verify: {headers:?}"
        );
        let ts: i64 = headers.timestamp.unwrap().parse().unwrap();
        assert!(ts >= before - 1, "{name}: a fresh timestamp");
        // The committed envelope's placeholders do not verify.
        assert!(
            webhook::verify(
                std::slice::from_ref(&key),
                WebhookHeaders::from_http(committed.headers()),
                committed.body().as_ref(),
                now()
            )
            .is_err()
        );
        // Nothing but the signed headers and the request time changed.
        let strip = |text: &str| {
            let mut v: Value = serde_json::from_str(text).unwrap();
            for table in ["headers", "multiValueHeaders"] {
                if let Some(t) = v[table].as_object_mut() {
                    t.retain(|k, _| !SIGNED_HEADERS.contains(&k.to_ascii_lowercase().as_str()));
                }
            }
            if let Some(ctx) = v["requestContext"].as_object_mut() {
                for field in ["time", "timeEpoch", "requestTime", "requestTimeEpoch"] {
                    ctx.remove(field);
                }
            }
            v
        };
        assert_eq!(strip(&text), strip(&original), "{name}");
        // Multi-value headers (REST API) agree with the single-value ones.
        let v: Value = serde_json::from_str(&text).unwrap();
        if let Some(multi) = v["multiValueHeaders"].as_object() {
            for header in SIGNED_HEADERS {
                assert_eq!(multi[header], json!([v["headers"][header]]), "{name}");
            }
        }
    }
    // The key may come from the environment instead of the command line.
    let path = events_dir("lambda").join("function-url.run_started.json");
    let sample = events_dir("webhooks").join(format!("{RUN_STARTED}.json"));
    let out = Command::new("bash")
        .arg(events_dir("sign-envelope.sh"))
        .args([Path::new("-"), &sample, &path])
        .env("ENVWORKER", BIN)
        .env("ANTHROPIC_WEBHOOK_SIGNING_KEY", &key_text)
        .output()
        .unwrap();
    assert!(out.status.success());
    let signed = parse_envelope(&path, &String::from_utf8(out.stdout).unwrap());
    assert!(
        webhook::verify(
            &[key],
            WebhookHeaders::from_http(signed.headers()),
            signed.body().as_ref(),
            now()
        )
        .is_ok()
    );
    // A wrong call says how to call it.
    let out = Command::new("bash")
        .arg(events_dir("sign-envelope.sh"))
        .arg("whsec_only-one-argument")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage:"));
}

// ---------------------------------------------------------------------------
// The re-signed envelopes through the real Lambda handler: `envworker serve`
// under a stand-in for the Lambda Runtime and Extensions APIs, one invocation.

/// Invoke `envworker serve` as a Lambda function with `envelope` (signed
/// under `secret`) and return its response to the Runtime API.
async fn invoke(envelope: Value, secret: &str, extra_env: &[(&str, &str)]) -> Value {
    let server = TestServer::start().await;
    let (env_id, env_key) = server.create_environment().await;
    let (stand_in, api) = StandIn::start(
        envelope,
        epoch_ms() + Duration::from_secs(300).as_millis() as u64,
    )
    .await;
    let workdir = tempfile::tempdir().unwrap();
    let mut envs = vec![
        ("ANTHROPIC_BASE_URL", server.url()),
        ("ANTHROPIC_ENVIRONMENT_ID", env_id),
        ("ANTHROPIC_ENVIRONMENT_KEY", env_key),
        ("ANTHROPIC_WEBHOOK_SIGNING_KEY", secret.to_string()),
        (
            "ENVWORKER_WORKDIR",
            workdir.path().to_str().unwrap().to_string(),
        ),
    ];
    envs.extend(extra_env.iter().map(|(k, v)| (*k, v.to_string())));
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (mut child, stderr) = spawn_function(&api, &["serve", "--max-idle", "1s"], &envs);
    let answered = stand_in
        .wait_for(Duration::from_secs(30), |seen| seen.response.is_some())
        .await;
    let _ = child.kill();
    let _ = child.wait();
    let seen = stand_in.seen.lock().unwrap();
    match (answered, &seen.response) {
        (true, Some((_, response))) => response.clone(),
        _ => panic!(
            "no response to the invocation; errors: {:?}\n--- envworker stderr ---\n{}",
            seen.errors,
            stderr.lock().unwrap()
        ),
    }
}

/// Re-sign `events/lambda/<name>` and invoke the real handler with it.
async fn invoke_sample(name: &str, extra_env: &[(&str, &str)]) -> Value {
    let (secret, _) = fresh_key();
    let path = events_dir("lambda").join(name);
    let committed = parse_envelope(&path, &std::fs::read_to_string(&path).unwrap());
    let (sample, _) = sample_for(committed.body().as_ref());
    let envelope: Value = serde_json::from_str(&sign_envelope(&secret, &sample, &path)).unwrap();
    invoke(envelope, &secret, extra_env).await
}

fn assert_accepted(response: &Value) {
    assert_eq!(response["statusCode"], 202, "{response:#}");
    let body: Value = serde_json::from_str(response["body"].as_str().unwrap_or_default())
        .unwrap_or_else(|_| panic!("{response:#}"));
    assert_eq!(body, json!({"status": "accepted"}), "{response:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_signed_function_url_envelope_is_accepted_by_the_lambda_handler() {
    assert_accepted(&invoke_sample("function-url.run_started.json", &[]).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_signed_rest_api_envelope_is_accepted_when_the_stage_is_left_out_of_the_path() {
    // lambda_http prefixes a REST API's path with its stage (`/Prod/webhooks/…`)
    // unless this is set; see events/README.md.
    assert_accepted(
        &invoke_sample(
            "apigw-v1.run_started.json",
            &[("AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH", "true")],
        )
        .await,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_signed_rest_api_envelope_is_accepted_by_the_lambda_handler() {
    assert_accepted(&invoke_sample("apigw-v1.run_started.json", &[]).await);
}
