//! The devserver's sessions over real HTTP: creation with memory stores and
//! mount paths, the event log and its rules, the SSE stream, re-queued work,
//! webhooks with retries, injected faults, and scripted-session reports.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{TestServer, scenario};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use envworker::devserver::DevserverConfig;
use envworker::webhook::{SigningKey, WebhookHeaders, verify};
use futures::StreamExt;
use reqwest::Method;
use serde_json::{Value, json};

async fn events(s: &TestServer, session: &str) -> Vec<Value> {
    let body = s
        .agents(
            Method::GET,
            &format!("/v1/sessions/{session}/events?limit=1000"),
            None,
        )
        .await
        .ok();
    body["data"].as_array().unwrap().clone()
}

fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn create_a_session_with_memory_stores_and_derived_mount_paths() {
    let s = TestServer::start_with(
        DevserverConfig::new(crate::common::ADMIN_KEY).mount_root("/srv/mem"),
    )
    .await;
    let (env_id, _) = s.create_environment().await;
    let a = s.create_store("User Preferences").await;
    let b = s.create_store("user preferences!").await;
    let c = s.create_store("???").await;
    let session = s
        .agents(
            Method::POST,
            "/v1/sessions",
            Some(json!({"agent": {"name": "helper", "skills": [{"type": "custom", "skill_id": "skill_1", "version": "latest"}]},
                        "environment_id": env_id, "title": "t", "metadata": {"k": "v"},
                        "resources": [
                          {"type": "memory_store", "memory_store_id": a, "instructions": "use it"},
                          {"type": "memory_store", "memory_store_id": b, "access": "read_only"},
                          {"type": "memory_store", "memory_store_id": c}]})),
        )
        .await
        .ok();
    assert!(session["id"].as_str().unwrap().starts_with("sesn_"));
    assert_eq!(session["status"], "idle", "sessions start idle");
    assert_eq!(session["agent"]["name"], "helper");
    assert_eq!(session["agent"]["skills"][0]["skill_id"], "skill_1");
    assert_eq!(
        session["agent"]["tools"][0]["type"],
        "agent_toolset_20260401"
    );
    let r = &session["resources"];
    assert_eq!(r[0]["mount_path"], "/srv/mem/user-preferences");
    assert_eq!(r[0]["access"], "read_write");
    assert_eq!(r[0]["instructions"], "use it");
    assert_eq!(r[0]["name"], "User Preferences");
    assert_eq!(r[1]["mount_path"], "/srv/mem/user-preferences-2");
    assert_eq!(r[1]["access"], "read_only");
    assert_eq!(r[2]["mount_path"], format!("/srv/mem/{c}"));
    let got = s
        .agents(
            Method::GET,
            &format!("/v1/sessions/{}", session["id"].as_str().unwrap()),
            None,
        )
        .await
        .ok();
    assert_eq!(got["resources"], session["resources"]);
    let listed = s.agents(Method::GET, "/v1/sessions", None).await.ok();
    assert_eq!(listed["data"][0]["id"], session["id"]);

    // The refusals, none of which creates anything.
    let archived = s.create_store("old").await;
    s.archive_store(&archived).await;
    let nine: Vec<Value> = {
        let mut v = Vec::new();
        for i in 0..9 {
            v.push(json!({"type": "memory_store", "memory_store_id": s.create_store(&format!("s{i}")).await}));
        }
        v
    };
    let session_ids = || async {
        let listed = s
            .agents(Method::GET, "/v1/sessions?limit=100", None)
            .await
            .ok();
        listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["id"].clone())
            .collect::<Vec<_>>()
    };
    let before = session_ids().await;
    for (body, status, kind) in [
        (
            json!({"agent": "a", "environment_id": env_id, "resources": [{"type": "file", "file_id": "file_1"}]}),
            400,
            "invalid_request_error",
        ),
        (
            json!({"agent": "a", "environment_id": env_id, "resources": nine}),
            400,
            "invalid_request_error",
        ),
        (
            json!({"agent": "a", "environment_id": env_id, "resources": [{"type": "memory_store", "memory_store_id": a}, {"type": "memory_store", "memory_store_id": a}]}),
            400,
            "invalid_request_error",
        ),
        (
            json!({"agent": "a", "environment_id": env_id, "resources": [{"type": "memory_store", "memory_store_id": archived}]}),
            400,
            "invalid_request_error",
        ),
        (
            json!({"agent": "a", "environment_id": env_id, "resources": [{"type": "memory_store", "memory_store_id": a, "access": "write_only"}]}),
            400,
            "invalid_request_error",
        ),
        (
            json!({"agent": "a", "environment_id": env_id, "resources": [{"type": "memory_store", "memory_store_id": "memstore_nope"}]}),
            404,
            "not_found_error",
        ),
        (
            json!({"agent": "a", "environment_id": "env_nope"}),
            404,
            "not_found_error",
        ),
        (
            json!({"agent": 7, "environment_id": env_id}),
            400,
            "invalid_request_error",
        ),
        (
            json!({"environment_id": env_id}),
            400,
            "invalid_request_error",
        ),
    ] {
        let msg = s
            .agents(Method::POST, "/v1/sessions", Some(body))
            .await
            .expect_error(status, kind);
        assert!(!msg.is_empty());
    }
    let file_msg = s
        .agents(Method::POST, "/v1/sessions", Some(json!({"agent": "a", "environment_id": env_id, "resources": [{"type": "github_repository", "url": "x"}]})))
        .await
        .expect_error(400, "invalid_request_error");
    assert!(
        file_msg.contains("is a self-hosted environment. `resources` are not supported"),
        "{file_msg}"
    );
    assert_eq!(
        session_ids().await,
        before,
        "no refused request created a session"
    );
}

#[tokio::test]
async fn a_user_message_runs_the_session_and_the_echo_agent_ends_the_turn() {
    let s = TestServer::start().await;
    let (env_id, key) = s.create_environment().await;
    let session = s.create_session(&env_id).await;
    let id = session.as_str();
    let sent = s
        .worker(
            &key,
            Method::POST,
            &format!("/v1/sessions/{id}/events"),
            Some(json!({"events": [{"type": "user.message", "content": "hello"}]})),
        )
        .await
        .ok();
    let recorded = &sent["data"][0];
    assert_eq!(recorded["type"], "user.message");
    assert!(recorded["id"].as_str().unwrap().starts_with("sevt_"));
    assert!(recorded["processed_at"].is_string());
    assert_eq!(
        recorded["content"],
        json!([{"type": "text", "text": "hello"}])
    );
    let log = events(&s, id).await;
    assert_eq!(
        types(&log),
        vec![
            "user.message",
            "session.status_running",
            "agent.message",
            "session.status_idle"
        ]
    );
    assert_eq!(log[3]["stop_reason"]["type"], "end_turn");
    let got = s
        .agents(Method::GET, &format!("/v1/sessions/{id}"), None)
        .await
        .ok();
    assert_eq!(got["status"], "idle");

    // Order and pagination of the log.
    let desc = s
        .agents(
            Method::GET,
            &format!("/v1/sessions/{id}/events?order=desc&limit=1"),
            None,
        )
        .await
        .ok();
    assert_eq!(desc["data"][0]["type"], "session.status_idle");
    let (all, pages) = {
        let mut out = Vec::new();
        let mut pages = 0;
        let mut page: Option<String> = None;
        loop {
            let q = page
                .as_ref()
                .map(|p| format!("&page={p}"))
                .unwrap_or_default();
            let b = s
                .agents(
                    Method::GET,
                    &format!("/v1/sessions/{id}/events?limit=3{q}"),
                    None,
                )
                .await
                .ok();
            pages += 1;
            out.extend(b["data"].as_array().unwrap().clone());
            match b["next_page"].as_str() {
                Some(p) => page = Some(p.into()),
                None => break,
            }
        }
        (out, pages)
    };
    assert_eq!((all, pages), (log.clone(), 2));
    let only = s
        .agents(
            Method::GET,
            &format!(
                "/v1/sessions/{id}/events?types[]=session.status_running&types[]=agent.message"
            ),
            None,
        )
        .await
        .ok();
    assert_eq!(
        types(only["data"].as_array().unwrap()),
        vec!["session.status_running", "agent.message"]
    );
    for bad in [
        "order=sideways",
        "limit=0",
        "limit=1001",
        "types[]=DROP TABLE",
    ] {
        s.agents(
            Method::GET,
            &format!("/v1/sessions/{id}/events?{bad}"),
            None,
        )
        .await
        .expect_error(400, "invalid_request_error");
    }
}

#[tokio::test]
async fn event_rules_refuse_what_the_api_refuses() {
    let s = TestServer::start().await;
    let started = s
        .start_scenario(&json!({"name": "rules", "steps": [
            {"tool": "bash", "input": {"command": "true"}, "evaluated_permission": "ask", "confirm": "allow", "timeout_ms": 20000}
        ]}))
        .await;
    let sid = &started.session_id;
    // Wait for the gated tool call and the devserver's own confirmation of it.
    let mut tool_use = Value::Null;
    for _ in 0..100 {
        let log = events(&s, sid).await;
        if let Some(t) = log.iter().find(|e| e["type"] == "agent.tool_use")
            && log.iter().any(|e| e["type"] == "user.tool_confirmation")
        {
            tool_use = t.clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tid = tool_use["id"]
        .as_str()
        .expect("the scenario emitted its tool call")
        .to_string();
    assert_eq!(tool_use["evaluated_permission"], "ask");
    let key = started.environment_key.clone();
    let path = format!("/v1/sessions/{sid}/events");
    let post = |events: Value| s.worker(&key, Method::POST, &path, Some(json!({"events": events})));
    for (events, status, kind) in [
        (
            json!([{"type": "user.tool_result", "tool_use_id": "sevt_nope", "content": []}]),
            400,
            "invalid_request_error",
        ),
        (
            json!([{"type": "user.custom_tool_result", "custom_tool_use_id": tid, "content": []}]),
            400,
            "invalid_request_error",
        ),
        (
            json!([{"type": "user.tool_confirmation", "tool_use_id": tid, "result": "allow"}]),
            409,
            "conflict_error",
        ),
        (
            json!([{"type": "user.tool_result", "tool_use_id": tid, "content": "not a list"}]),
            400,
            "invalid_request_error",
        ),
        (
            json!([{"type": "agent.message", "content": []}]),
            400,
            "invalid_request_error",
        ),
        (json!([]), 400, "invalid_request_error"),
    ] {
        post(events).await.expect_error(status, kind);
    }
    let ok = post(json!([{"type": "user.tool_result", "tool_use_id": tid, "content": [{"type": "text", "text": "done"}], "is_error": false}])).await.ok();
    assert_eq!(ok["data"][0]["tool_use_id"], tid);
    post(json!([{"type": "user.tool_result", "tool_use_id": tid, "content": []}]))
        .await
        .expect_error(409, "conflict_error");
    let report = s
        .dev(Method::GET, &format!("/dev/scenarios/{sid}"), None)
        .await
        .ok();
    assert_eq!(report["steps"][0]["tool_use_id"], tid);
}

#[tokio::test]
async fn the_event_stream_speaks_sse_with_pings() {
    let s = TestServer::start_with(
        DevserverConfig::new(crate::common::ADMIN_KEY).ping_interval(Duration::from_millis(150)),
    )
    .await;
    let (env_id, key) = s.create_environment().await;
    let id = s.create_session(&env_id).await;
    let response = reqwest::Client::new()
        .get(format!("{}/v1/sessions/{id}/events/stream", s.url()))
        .bearer_auth(&key)
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", crate::common::AGENTS_BETA)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut body = response.bytes_stream();
    s.agents(
        Method::POST,
        &format!("/v1/sessions/{id}/events"),
        Some(json!({"events": [{"type": "user.message", "content": "hi"}]})),
    )
    .await
    .ok();
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !(text.contains("event: session.status_idle") && text.contains("event: ping")) {
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .expect("stream data")
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    // Every frame: `event:` equal to the JSON `type`, then `data:`.
    let frames: Vec<&str> = text
        .split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .collect();
    let mut seen = Vec::new();
    for frame in frames {
        let event = frame
            .lines()
            .find_map(|l| l.strip_prefix("event: "))
            .unwrap_or_else(|| panic!("no event line: {frame:?}"));
        let data: Value = serde_json::from_str(
            frame
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(data["type"], event, "{frame}");
        seen.push(event.to_string());
    }
    let real: Vec<&String> = seen.iter().filter(|e| *e != "ping").collect();
    assert_eq!(
        real,
        vec![
            "user.message",
            "session.status_running",
            "agent.message",
            "session.status_idle"
        ]
    );
    // A stream for someone else's session is refused before it starts.
    let other = s.dev(Method::POST, "/dev/environments", None).await.ok();
    s.worker(
        other["environment_key"].as_str().unwrap(),
        Method::GET,
        &format!("/v1/sessions/{id}/events/stream"),
        None,
    )
    .await
    .expect_error(403, "permission_error");
}

#[tokio::test]
async fn a_dormant_session_gets_a_new_work_item_for_a_new_message() {
    let s = TestServer::start().await;
    let (env_id, key) = s.create_environment().await;
    let session = s.create_session(&env_id).await;
    let id = session.as_str();
    let work_path = format!("/v1/environments/{env_id}/work");
    let first = s
        .worker(&key, Method::GET, &format!("{work_path}/poll"), None)
        .await
        .ok();
    // While that item is live, a message queues nothing more.
    s.agents(
        Method::POST,
        &format!("/v1/sessions/{id}/events"),
        Some(json!({"events": [{"type": "user.message", "content": "a"}]})),
    )
    .await
    .ok();
    let listed = s.worker(&key, Method::GET, &work_path, None).await.ok();
    assert_eq!(listed["data"].as_array().unwrap().len(), 1);
    s.worker(
        &key,
        Method::POST,
        &format!("{work_path}/{}/stop", first["id"].as_str().unwrap()),
        Some(json!({"force": true})),
    )
    .await;
    // Dormant now: the next message queues a new item.
    s.agents(
        Method::POST,
        &format!("/v1/sessions/{id}/events"),
        Some(json!({"events": [{"type": "user.message", "content": "b"}]})),
    )
    .await
    .ok();
    let next = s
        .worker(&key, Method::GET, &format!("{work_path}/poll"), None)
        .await
        .ok();
    assert_eq!(next["data"]["id"], id);
    assert_ne!(next["id"], first["id"]);
    // So does an interrupt, after that one stops too.
    s.worker(
        &key,
        Method::POST,
        &format!("{work_path}/{}/stop", next["id"].as_str().unwrap()),
        Some(json!({"force": true})),
    )
    .await;
    s.agents(
        Method::POST,
        &format!("/v1/sessions/{id}/events"),
        Some(json!({"events": [{"type": "user.interrupt"}]})),
    )
    .await
    .ok();
    let third = s
        .worker(&key, Method::GET, &format!("{work_path}/poll"), None)
        .await
        .ok();
    assert_eq!(third["data"]["id"], id);
}

#[tokio::test]
async fn archive_and_delete_end_a_session() {
    let s = TestServer::start().await;
    let (env_id, _) = s.create_environment().await;
    let one = s.create_session(&env_id).await;
    let id = one.as_str();
    let archived = s
        .agents(Method::POST, &format!("/v1/sessions/{id}/archive"), None)
        .await
        .ok();
    assert_eq!(archived["status"], "terminated");
    assert!(types(&events(&s, id).await).contains(&"session.status_terminated".to_string()));
    s.agents(
        Method::POST,
        &format!("/v1/sessions/{id}/events"),
        Some(json!({"events": [{"type": "user.message", "content": "x"}]})),
    )
    .await
    .expect_error(400, "invalid_request_error");
    let deleted = s
        .agents(Method::DELETE, &format!("/v1/sessions/{id}"), None)
        .await
        .ok();
    assert_eq!(deleted, json!({"id": id, "type": "session_deleted"}));
    s.agents(Method::GET, &format!("/v1/sessions/{id}"), None)
        .await
        .expect_error(404, "not_found_error");
}

/// A webhook receiver that answers with `statuses` in turn (then 200) and keeps every delivery.
type Deliveries = Arc<Mutex<Vec<(HeaderMap, Vec<u8>)>>>;

async fn receiver(statuses: Vec<u16>) -> (String, Deliveries) {
    let seen: Deliveries = Arc::default();
    let script = Arc::new(Mutex::new(statuses.into_iter()));
    let app = axum::Router::new()
        .route(
            "/hook",
            axum::routing::post(
                move |State(seen): State<Deliveries>,
                      headers: HeaderMap,
                      body: axum::body::Bytes| {
                    let script = script.clone();
                    async move {
                        seen.lock().unwrap().push((headers, body.to_vec()));
                        StatusCode::from_u16(script.lock().unwrap().next().unwrap_or(200)).unwrap()
                    }
                },
            ),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

async fn wait_for(seen: &Deliveries, n: usize) {
    for _ in 0..200 {
        if seen.lock().unwrap().len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "expected {n} deliveries, got {}",
        seen.lock().unwrap().len()
    );
}

#[tokio::test]
async fn run_started_webhooks_are_signed_and_retried() {
    let (url, seen) = receiver(vec![500, 503]).await;
    let (key, secret) = SigningKey::generate();
    let s = TestServer::start_with(
        DevserverConfig::new(crate::common::ADMIN_KEY)
            .webhook(url, SigningKey::parse(&secret).unwrap())
            .webhook_backoff(Duration::from_millis(50)),
    )
    .await;
    let (env_id, _) = s.create_environment().await;
    let session = s.create_session(&env_id).await;
    let id = session.as_str();
    s.agents(
        Method::POST,
        &format!("/v1/sessions/{id}/events"),
        Some(json!({"events": [{"type": "user.message", "content": "go"}]})),
    )
    .await
    .ok();
    wait_for(&seen, 3).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deliveries = seen.lock().unwrap().clone();
    assert_eq!(deliveries.len(), 3, "two refusals, then delivered; no more");
    let ids: Vec<&str> = deliveries
        .iter()
        .map(|(h, _)| h["webhook-id"].to_str().unwrap())
        .collect();
    assert!(
        ids.iter().all(|i| *i == ids[0]),
        "one webhook-id across retries"
    );
    for (headers, body) in &deliveries {
        let now = chrono::Utc::now().timestamp();
        verify(
            std::slice::from_ref(&key),
            WebhookHeaders::from_http(headers),
            body,
            now,
        )
        .expect("a valid signature");
        let payload: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(payload["type"], "event");
        assert_eq!(payload["id"], ids[0]);
        assert_eq!(payload["data"]["type"], "session.status_run_started");
        assert_eq!(payload["data"]["id"], id);
    }
}

#[tokio::test]
async fn a_failing_endpoint_gets_three_retries_then_the_event_is_dropped() {
    let (url, seen) = receiver(vec![500; 10]).await;
    let (_, secret) = SigningKey::generate();
    let s = TestServer::start_with(
        DevserverConfig::new(crate::common::ADMIN_KEY)
            .webhook(url, SigningKey::parse(&secret).unwrap())
            .webhook_backoff(Duration::from_millis(20)),
    )
    .await;
    let (env_id, _) = s.create_environment().await;
    s.agents(
        Method::POST,
        "/v1/sessions",
        Some(json!({"agent": "a", "environment_id": env_id, "initial_events": [{"type": "user.message", "content": "go"}]})),
    )
    .await
    .ok();
    wait_for(&seen, 4).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        seen.lock().unwrap().len(),
        4,
        "one attempt and three retries"
    );
}

#[tokio::test]
async fn the_official_sdk_unwraps_a_webhook_the_devserver_sent() {
    let (url, seen) = receiver(vec![]).await;
    let (_, secret) = SigningKey::generate();
    let s = TestServer::start_with(
        DevserverConfig::new(crate::common::ADMIN_KEY)
            .webhook(url, SigningKey::parse(&secret).unwrap()),
    )
    .await;
    let started = s
        .start_scenario(&json!({"name": "wake-up", "steps": []}))
        .await;
    wait_for(&seen, 1).await;
    let (headers, body) = seen.lock().unwrap()[0].clone();
    let header = |n: &str| headers[n].to_str().unwrap().to_string();
    let (id, ts, sig) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    );
    let body = String::from_utf8(body).unwrap();
    let out = tokio::task::spawn_blocking(move || {
        crate::common::sdk::run_script(
            "unwrap_webhook.py",
            &[
                ("WEBHOOK_SECRET", &secret),
                ("WEBHOOK_BODY", &body),
                ("WEBHOOK_ID", &id),
                ("WEBHOOK_TIMESTAMP", &ts),
                ("WEBHOOK_SIGNATURE", &sig),
            ],
        )
    })
    .await
    .unwrap();
    assert!(
        out.contains(&format!(
            "session.status_run_started {}",
            started.session_id
        )),
        "{out}"
    );
    assert!(out.contains("tampered body refused"), "{out}");
}

#[tokio::test]
async fn faults_by_flag_and_by_admin_endpoint() {
    use envworker::devserver::faults::FaultRule;
    let s = TestServer::start_with(
        DevserverConfig::new(crate::common::ADMIN_KEY)
            .fault(FaultRule::parse("GET /v1/memory_stores:status=503,times=1").unwrap()),
    )
    .await;
    s.memory(Method::GET, "/v1/memory_stores", None)
        .await
        .expect_error(503, "api_error");
    s.memory(Method::GET, "/v1/memory_stores", None).await.ok();

    // Latency.
    s.dev(
        Method::POST,
        "/dev/faults",
        Some(json!({"rules": [{"method": "GET", "path": "/v1/memory_stores", "latency_ms": 250}]})),
    )
    .await
    .ok();
    let t = std::time::Instant::now();
    s.memory(Method::GET, "/v1/memory_stores", None).await.ok();
    assert!(t.elapsed() >= Duration::from_millis(240));
    let listed = s.dev(Method::GET, "/dev/faults", None).await.ok();
    assert_eq!(listed["rules"].as_array().unwrap().len(), 1);
    s.dev(Method::DELETE, "/dev/faults", None).await.ok();

    // Commit, then drop the response: the client hears nothing, the change happened.
    let store = s.create_store("dropped").await;
    s.dev(
        Method::POST,
        "/dev/faults",
        Some(json!({"rules": [{"method": "POST", "path": "/v1/memory_stores/*/memories", "drop_response": true, "times": 1}]})),
    )
    .await
    .ok();
    let lost = reqwest::Client::new()
        .post(format!("{}/v1/memory_stores/{store}/memories", s.url()))
        .header("x-api-key", crate::common::ADMIN_KEY)
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", crate::common::MEMORY_BETA)
        .json(&json!({"path": "/landed.md", "content": "it landed"}))
        .send()
        .await;
    let failed = match lost {
        Err(_) => true,
        Ok(r) => r.bytes().await.is_err(),
    };
    assert!(failed, "the response must not arrive whole");
    let (memories, _) = s
        .list_all(&format!("/v1/memory_stores/{store}/memories?view=full"))
        .await;
    assert_eq!(memories[0]["content"], "it landed");
    // The rule retired after one use.
    s.create_memory(&store, "/next.md", "fine").await;

    // Bad rules are refused; /dev needs the admin key.
    s.dev(
        Method::POST,
        "/dev/faults",
        Some(json!({"rules": [{"path": "/x", "rate": 3}]})),
    )
    .await
    .expect_error(400, "invalid_request_error");
    s.send(Method::GET, "/dev/faults", None, &[])
        .await
        .expect_error(401, "authentication_error");
}

#[tokio::test]
async fn scenario_reports_name_what_failed_and_bad_scenarios_are_refused() {
    let s = TestServer::start().await;
    for (doc, needle) in [
        (
            json!({"steps": [{"tool": "read", "input": {"file_path": "{mount:ghost}/x"}}]}),
            "mount:ghost",
        ),
        (
            json!({"memory_stores": [{"key": "a", "name": "", "memories": {}}]}),
            "name",
        ),
        (json!({"steps": [{"wait_ms": "soon"}]}), "steps[0]"),
        (json!("not an object"), "scenario"),
    ] {
        let msg = s
            .dev(Method::POST, "/dev/scenarios", Some(doc))
            .await
            .expect_error(400, "invalid_request_error");
        assert!(msg.contains(needle), "{msg}");
    }
    s.dev(Method::GET, "/dev/scenarios/sesn_nope", None)
        .await
        .expect_error(404, "not_found_error");

    // A tool call nobody answers: the step fails after its timeout, the rest is skipped.
    let started = s
        .start_scenario(&json!({"name": "unanswered", "memory_stores": [{"key": "m", "name": "M", "memories": {"/a.md": "a"}}],
            "steps": [{"tool": "read", "input": {"file_path": "{mount:m}/a.md"}, "timeout_ms": 300}, {"wait_ms": 1}],
            "expect_final": {"m": {"/a.md": "b"}}}))
        .await;
    let running = s
        .dev(
            Method::GET,
            &format!("/dev/scenarios/{}", started.session_id),
            None,
        )
        .await
        .ok();
    assert_eq!(running["status"], "running");
    assert!(
        running["stores"]["m"]["mount_path"]
            .as_str()
            .unwrap()
            .ends_with("/m")
    );
    // Stop the item as a worker would, so the report can finish.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let work = s
        .worker(
            &started.environment_key,
            Method::GET,
            &format!("/v1/environments/{}/work/poll", started.environment_id),
            None,
        )
        .await
        .ok();
    s.worker(
        &started.environment_key,
        Method::POST,
        &format!(
            "/v1/environments/{}/work/{}/stop",
            started.environment_id,
            work["id"].as_str().unwrap()
        ),
        Some(json!({"force": true})),
    )
    .await;
    let report = s
        .final_report(&started.session_id, Duration::from_secs(10))
        .await;
    assert_eq!(report["status"], "failed");
    assert_eq!(report["steps"][0]["status"], "failed");
    assert_eq!(report["steps"][1]["status"], "skipped");
    let failures: Vec<&str> = report["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert!(
        failures
            .iter()
            .any(|f| f.contains("step 0 (tool read)") && f.contains("no user.tool_result")),
        "{failures:?}"
    );
    assert!(
        failures
            .iter()
            .any(|f| f.contains(r#"store m: /a.md holds "a", expected "b""#)),
        "{failures:?}"
    );
    assert_eq!(report["final_contents"]["m"], json!({"/a.md": "a"}));
}

#[tokio::test]
async fn a_scenario_can_run_in_a_named_environment() {
    let s = TestServer::start().await;
    let (env_id, _) = s.create_environment().await;
    let mut doc = scenario("notes-roundtrip");
    doc["environment_id"] = json!(env_id);
    let started = s.start_scenario(&doc).await;
    assert_eq!(started.environment_id, env_id);
    // The key answered is a fresh key of that environment.
    let stats = s
        .worker(
            &started.environment_key,
            Method::GET,
            &format!("/v1/environments/{env_id}/work/stats"),
            None,
        )
        .await
        .ok();
    assert_eq!(stats["depth"], 1);
    doc["environment_id"] = json!("env_nope");
    s.dev(Method::POST, "/dev/scenarios", Some(doc))
        .await
        .expect_error(404, "not_found_error");
}

#[tokio::test]
async fn a_restart_fails_a_scenario_that_was_running() {
    let dir = tempfile::tempdir().unwrap();
    let config = DevserverConfig::new(crate::common::ADMIN_KEY).data_dir(dir.path());
    let first = TestServer::start_with(config.clone()).await;
    let started = first.start_scenario(&scenario("notes-roundtrip")).await;
    first.running.shutdown().await;
    let second = TestServer::start_with(config).await;
    let report = second
        .final_report(&started.session_id, Duration::from_secs(5))
        .await;
    assert_eq!(report["status"], "failed");
    let failures = report["failures"].to_string();
    assert!(
        failures.contains("stopped before the scenario finished") || failures.contains("restarted"),
        "{failures}"
    );
}

/// `GET /dev/requests` logs what a client sent (a memory write as digests),
/// the status it got (an injected one included) and how it authenticated;
/// a scenario's `faults` step adds rules at its point of the session.
#[tokio::test]
async fn the_request_log_and_a_scenarios_faults_step() {
    let s = TestServer::start().await;
    let store = s.create_store("Logged").await;
    s.create_memory(&store, "/a.md", "alpha").await;
    s.add_faults(vec![
        json!({"method": "GET", "path": "/v1/memory_stores/*/memories", "status": 503, "times": 1}),
    ])
    .await;
    s.memory(
        Method::GET,
        &format!("/v1/memory_stores/{store}/memories"),
        None,
    )
    .await;
    let log = s.dev(Method::GET, "/dev/requests", None).await.ok();
    let entries = log["data"].as_array().unwrap();
    let write = entries
        .iter()
        .find(|e| e["memory_write"]["path"] == "/a.md")
        .expect("the create is logged");
    assert_eq!(write["method"], "POST");
    assert_eq!(write["auth"], "api_key");
    assert_eq!(
        write["memory_write"]["content_sha256"],
        crate::common::sha256("alpha")
    );
    assert!(
        !log.to_string().contains("\"alpha\""),
        "content is never logged"
    );
    let listed = entries.last().unwrap();
    assert_eq!(
        (listed["method"].as_str(), listed["status"].as_u64()),
        (Some("GET"), Some(503))
    );
    assert!(
        entries
            .windows(2)
            .all(|w| w[0]["seq"].as_u64() < w[1]["seq"].as_u64())
    );
    s.dev(Method::DELETE, "/dev/requests", None).await.ok();
    assert_eq!(
        s.dev(Method::GET, "/dev/requests", None).await.ok()["data"],
        json!([])
    );

    // The rule is in place once the step ran (the tool call after it waits
    // for an answer that never comes, and fails after its timeout).
    let started = s
        .start_scenario(&json!({"name": "faulty", "steps": [
            {"faults": [{"method": "DELETE", "path": "/v1/nowhere", "status": 500}]},
            {"tool": "bash", "input": {"command": "true"}, "timeout_ms": 300}
        ]}))
        .await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while s.faults().await.is_empty() {
        assert!(std::time::Instant::now() < deadline, "no rule added");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(s.faults().await[0]["path"], "/v1/nowhere");
    let _ = started;
}

/// An event reaches a stream the client only reads as soon as it is logged:
/// the devserver's connections set TCP_NODELAY, as production HTTP servers
/// do. Without it, the first events written after the stream's headers, which
/// the client's TCP acknowledges late (it sent the request right after an
/// earlier response, so it delays its ACKs), waited for that delayed ACK:
/// 40 ms on Linux, every time — the worker saw it on a session's second call
/// (Nagle's algorithm). Three fresh connections: all three stall with the
/// bug; a load spike would have to hit all three to fail the test without it.
#[tokio::test]
async fn stream_events_are_not_held_back_for_the_clients_ack() {
    let s = TestServer::start().await;
    let (env_id, key) = s.create_environment().await;
    let mut delays = Vec::new();
    for attempt in 0..3 {
        let id = s.create_session(&env_id).await;
        // As a worker does: the stream's request on the connection of an
        // earlier request.
        let client = reqwest::Client::new();
        let get = |path: String| {
            client
                .get(format!("{}{path}", s.url()))
                .bearer_auth(&key)
                .header("anthropic-version", "2023-06-01")
                .header("anthropic-beta", crate::common::AGENTS_BETA)
                .send()
        };
        let read = get(format!("/v1/sessions/{id}")).await.unwrap();
        assert_eq!(read.status(), 200);
        read.bytes().await.unwrap();
        let response = get(format!("/v1/sessions/{id}/events/stream"))
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let mut body = response.bytes_stream();
        let sent = tokio::time::Instant::now();
        s.agents(
            Method::POST,
            &format!("/v1/sessions/{id}/events"),
            Some(json!({"events": [{"type": "user.message", "content": format!("attempt {attempt}")}]})),
        )
        .await
        .ok();
        let mut text = String::new();
        while !text.contains("event: session.status_idle") {
            let chunk = tokio::time::timeout(Duration::from_secs(5), body.next())
                .await
                .expect("stream data")
                .unwrap()
                .unwrap();
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        delays.push(sent.elapsed());
    }
    assert!(
        delays.iter().any(|d| *d < Duration::from_millis(35)),
        "a user message's events reached the stream after {delays:?}: held back for the client's delayed ACK"
    );
}

/// The devserver's statements are compiled once. Without the query
/// planner's stability guarantee, the bundled SQLite (a STAT4 build)
/// compiled a cached statement again on every run whose bound values could
/// change its plan: the token lookup of every worker request (a `LEFT
/// JOIN`), the lookup of a call's answers (an `ORDER BY`), the event and
/// version listings and the claim (`ORDER BY … LIMIT`) — a parse per
/// request, the largest item of the devserver's share of a step
/// (`cargo bench --bench session`).
/// A scripted 36-call session in the shape of the session bench's (six of
/// its groups: every tool, in the workdir and in the store), served by the
/// real worker: the devserver's statements afterwards, and the call count.
async fn bench_shaped_session(name: &str) -> (crate::common::served::Served, i32) {
    use crate::common::dev_api;
    use crate::common::served::{self, Case};
    let steps: Vec<Value> = (0..6).flat_map(|g| dev_api::tool_group(g).0).collect();
    let calls = steps.len() as i32;
    let served = served::by_envworker(&Case::new(
        name,
        json!({
            "name": name,
            "memory_stores": [{"key": "notes", "name": "notes", "access": "read_write",
                               "memories": {"/seed.md": "seed\n"}}],
            "steps": steps,
        }),
    ))
    .await;
    assert_eq!(served.report["status"], "passed", "{:#}", served.report);
    (served, calls)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_devservers_statements_are_compiled_once() {
    let (served, calls) = bench_shaped_session("compiled-once").await;
    // Every statement run for each call, or more often.
    let per_call: Vec<_> = served
        .statements
        .iter()
        .filter(|s| s.runs >= calls)
        .collect();
    for needle in [
        "FROM credentials",
        "ref_id = ?2",
        "INSERT INTO session_events",
    ] {
        assert!(
            per_call.iter().any(|s| s.sql.contains(needle)),
            "{needle:?} is not among the statements run for every call: {per_call:#?}"
        );
    }
    // Any statement run more than once (the memory version listing and the
    // path-conflict check among them): nothing changes the schema while the
    // devserver runs, so nothing is ever compiled again.
    let recompiled: Vec<_> = served
        .statements
        .iter()
        .filter(|s| s.runs >= 2 && s.recompiles > 0)
        .collect();
    assert!(recompiled.is_empty(), "compiled again: {recompiled:#?}");
}

/// The scenario's report is saved once between two steps, not twice: it is
/// rewritten whole each time (a 200-step report is tens of KiB), and its
/// saves were the largest item of the devserver's work between a result
/// and the next call. A step still reads `running` while it runs, and the
/// one before already reads its outcome.
#[tokio::test(flavor = "multi_thread")]
async fn the_scenario_report_is_saved_once_per_step() {
    let (served, calls) = bench_shaped_session("one-save-per-step").await;
    let saves = served
        .statements
        .iter()
        .find(|s| s.sql.contains("UPDATE scenarios SET report"))
        .map(|s| s.runs)
        .expect("the report is saved");
    // One per step, the last step's end, the end of the turn: a few more.
    assert!(
        saves >= calls && saves <= calls + 4,
        "{saves} saves for {calls} steps"
    );
}
