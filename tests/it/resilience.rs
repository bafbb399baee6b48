//! Transient faults never cost an edit or a tool result (issue 12, items 5
//! and 6): the worker against the real devserver over real HTTP, with the
//! devserver's fault injection (`/dev/faults`) breaking exactly the request
//! each test is about.
//!
//! - memory requests: a 500 on the listing at mount, two 500s on an upload at
//!   teardown, a 429 whose `retry-after` is honoured, a dropped answer to an
//!   update that landed, and retry waits cut by the teardown's bound;
//! - tool results: three 500s on the post, a duplicate answered 409, and a
//!   result that can never be delivered (the item ends and frees its slot).
//!
//! Every test captures its logs from its first line, even those that count
//! none: `tracing` caches whether a log line is wanted when the line first
//! runs, judged by the thread it first runs on while only one capture is
//! alive — a line first logged by a test without a capture would stay
//! unwanted for the test that counts it.

use std::time::{Duration, Instant};

use crate::common::harness::Logs;
use crate::common::worker_env::Env;
use crate::common::{ADMIN_KEY, Started, TestServer};
use envworker::api::{Client, Credential};
use envworker::memory::options::SyncInterval;
use envworker::session::RunEnd;
use envworker::worker::poll::DrainOptions;
use envworker::worker::{EnvironmentWorker, ItemOutcome, ItemReport, WorkerOptions};
use reqwest::Method;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// A worker whose periodic sync never comes due: the only syncs are the
/// mount's download and the teardown's final sync and flush.
fn quiet_worker(env: &Env, started: &Started) -> EnvironmentWorker {
    quiet_worker_with(env, started, |_| {})
}

fn quiet_worker_with(
    env: &Env,
    started: &Started,
    tweak: impl FnOnce(&mut WorkerOptions),
) -> EnvironmentWorker {
    env.worker(started, |o| {
        o.memory_sync_interval = SyncInterval::every(Duration::from_secs(3600)).unwrap();
        tweak(o);
    })
}

async fn drain_within(worker: &EnvironmentWorker, bound: Duration) -> Vec<ItemReport> {
    tokio::time::timeout(
        bound,
        worker.drain(CancellationToken::new(), DrainOptions::default()),
    )
    .await
    .unwrap_or_else(|_| panic!("the drain did not end within {bound:?}: an item holds the slot"))
    .unwrap()
    .items
}

fn notes_scenario(steps: Value, expect_final: Value) -> Value {
    json!({
        "name": "notes",
        "memory_stores": [{"key": "notes", "name": "Notes", "access": "read_write",
                           "memories": {"/a.md": "alpha\n"}}],
        "steps": steps,
        "expect_final": {"notes": expect_final},
    })
}

/// The agent writes `/b.md` ("beta"), then the session waits `wait_ms`.
fn write_b_then_wait(wait_ms: u64, expect_final: Value) -> Value {
    notes_scenario(
        json!([
            {"tool": "write", "input": {"file_path": "{mount:notes}/b.md", "content": "beta\n"}},
            {"wait_ms": wait_ms}
        ]),
        expect_final,
    )
}

async fn wait_for_results(env: &Env, started: &Started, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while env.results(started).await.len() < n {
        assert!(Instant::now() < deadline, "no {n} tool results yet");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A client of the memory endpoints with the admin key.
fn admin_client(server: &TestServer) -> Client {
    Client::builder(Credential::api_key(ADMIN_KEY))
        .base_url(server.url())
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_500_on_the_memory_listing_at_mount_is_retried_and_the_item_mounts() {
    let logs = Logs::capture();
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&notes_scenario(
            json!([{"tool": "read", "input": {"file_path": "{mount:notes}/a.md"},
                    "expect": {"contains": "alpha"}, "timeout_ms": 20000}]),
            json!({"/a.md": "alpha\n"}),
        ))
        .await;
    env.fault(
        json!({"method": "GET", "path": "/v1/memory_stores/*/memories", "status": 500, "times": 1}),
    )
    .await;
    let began = Instant::now();
    let items = drain_within(&quiet_worker(&env, &started), Duration::from_secs(60)).await;
    eprintln!("item served in {:?}", began.elapsed());
    assert_eq!(items[0].outcome, ItemOutcome::Served(RunEnd::Idle));
    assert!(env.server.faults().await.is_empty(), "the 500 was served");
    assert_eq!(env.report(&started).await["status"], "passed");
    assert_eq!(
        logs.count("memory request failed; retrying"),
        1,
        "{}",
        logs.text()
    );
}

#[tokio::test]
async fn two_500s_on_an_upload_at_teardown_do_not_lose_the_last_edit() {
    let _logs = Logs::capture();
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&write_b_then_wait(
            1500,
            json!({"/a.md": "alpha\n", "/b.md": "beta\n"}),
        ))
        .await;
    let worker = quiet_worker(&env, &started);
    let drained = tokio::spawn(async move { drain_within(&worker, Duration::from_secs(60)).await });
    // The download is done and the file written: the next upload is the teardown's.
    wait_for_results(&env, &started, 1).await;
    env.fault(
        json!({"method": "POST", "path": "/v1/memory_stores/*/memories*", "status": 500, "times": 2}),
    )
    .await;
    let items = drained.await.unwrap();
    assert_eq!(items[0].outcome, ItemOutcome::Served(RunEnd::Idle));
    assert!(
        env.server.faults().await.is_empty(),
        "both 500s were served"
    );
    assert_eq!(
        env.server
            .session_memories(&started.session_id)
            .await
            .get("/b.md")
            .map(String::as_str),
        Some("beta\n"),
        "the last edit reached the server: {:?}",
        items[0].teardown
    );
    let report = env.report(&started).await;
    assert_eq!(report["status"], "passed", "{report:#}");
}

#[tokio::test]
async fn a_429_is_retried_after_the_wait_the_server_asks_for() {
    let _logs = Logs::capture();
    let server = TestServer::start().await;
    let store = server.create_store("limits").await;
    server.create_memory(&store, "/a.md", "alpha").await;
    let client = admin_client(&server);
    let memories = client.memories(&store);
    let listing = format!("/v1/memory_stores/{store}/memories");
    let fault = |headers: Value, status: u16, times: u64| {
        server.add_faults(vec![
            json!({"method": "GET", "path": listing, "status": status,
                                      "times": times, "headers": headers}),
        ])
    };

    // `retry-after-ms` wins (the SDK's own header, more precise).
    fault(
        json!({"retry-after-ms": "1500", "retry-after": "9"}),
        429,
        1,
    )
    .await;
    let began = Instant::now();
    let page = memories.list_index(100, None).await.expect("retried");
    let waited = began.elapsed();
    eprintln!("429 with retry-after-ms 1500: answered after {waited:?}");
    assert_eq!(page.data.len(), 1);
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_millis(3000),
        "{waited:?}"
    );

    // `retry-after` in seconds.
    fault(json!({"retry-after": "1"}), 429, 1).await;
    let began = Instant::now();
    memories.list_index(100, None).await.expect("retried");
    let waited = began.elapsed();
    eprintln!("429 with retry-after 1: answered after {waited:?}");
    assert!(
        waited >= Duration::from_millis(1000) && waited < Duration::from_millis(2500),
        "{waited:?}"
    );

    // `x-should-retry: false` is obeyed: one attempt, the error comes back.
    fault(json!({"x-should-retry": "false"}), 503, 2).await;
    let err = memories.list_index(100, None).await.unwrap_err();
    assert_eq!(err.status(), Some(503));
    let left = server.faults().await;
    assert_eq!(left[0]["times"], 1, "one attempt only: {left:#?}");
    server.clear_faults().await;

    // A precondition conflict is an answer, not a transient failure: no retry.
    let memory = server.create_memory(&store, "/b.md", "beta").await;
    let began = Instant::now();
    let err = memories
        .update(
            memory["id"].as_str().unwrap(),
            &envworker::api::types::UpdateMemory {
                content: Some("new".into()),
                path: None,
                precondition: Some(envworker::api::types::Precondition::content_sha256(
                    crate::common::sha256("not what is stored"),
                )),
            },
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(409));
    assert!(began.elapsed() < Duration::from_millis(350), "no backoff");
}

#[tokio::test]
async fn a_dropped_answer_is_retried_and_an_update_that_landed_answers_200() {
    let _logs = Logs::capture();
    let server = TestServer::start().await;
    let store = server.create_store("dropped").await;
    let memory = server.create_memory(&store, "/a.md", "alpha").await;
    let id = memory["id"].as_str().unwrap();
    // The update commits, then its answer is cut off mid-body.
    server
        .add_faults(vec![
            json!({"method": "POST", "path": format!("/v1/memory_stores/{store}/memories/{id}"),
                                "drop_response": true, "times": 1}),
        ])
        .await;
    let update = envworker::api::types::UpdateMemory {
        content: Some("beta".into()),
        path: None,
        precondition: Some(envworker::api::types::Precondition::content_sha256(
            crate::common::sha256("alpha"),
        )),
    };
    // The retry meets its own landed write: the content already matches, 200.
    let updated = admin_client(&server)
        .memories(&store)
        .update(id, &update, None)
        .await
        .expect("the retry is answered");
    assert_eq!(updated.content_sha256, crate::common::sha256("beta"));
}

#[tokio::test]
async fn a_retry_wait_never_outlasts_the_teardown_bound() {
    let _logs = Logs::capture();
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&write_b_then_wait(1000, json!({"/a.md": "alpha\n"})))
        .await;
    let worker = quiet_worker_with(&env, &started, |o| {
        o.memory_teardown_bound = Duration::from_secs(2)
    });
    let drained = tokio::spawn(async move { drain_within(&worker, Duration::from_secs(60)).await });
    wait_for_results(&env, &started, 1).await;
    // Every upload is refused with a request to come back in 30 s.
    env.fault(
        json!({"method": "POST", "path": "/v1/memory_stores/*/memories*", "status": 503,
                     "headers": {"retry-after": "30"}}),
    )
    .await;
    let began = Instant::now();
    let items = drained.await.unwrap();
    let took = began.elapsed();
    eprintln!("teardown with a 30 s retry-after and a 2 s bound took {took:?}");
    // The final sync and the flush are each cut at their 2 s bound.
    assert!(took < Duration::from_secs(9), "{took:?}");
    assert!(
        items[0].teardown.final_sync_cut_off,
        "{:?}",
        items[0].teardown
    );
    assert!(items[0].teardown.flush_cut_off, "{:?}", items[0].teardown);
    assert!(items[0].stopped);
}

#[tokio::test]
async fn three_500s_on_a_tool_result_post_are_retried_until_it_is_delivered() {
    let logs = Logs::capture();
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&json!({"name": "post-retry", "steps": [
            {"tool": "bash", "input": {"command": "echo hi"}, "expect": {"contains": "hi"},
             "timeout_ms": 15000}
        ]}))
        .await;
    env.fault(
        json!({"method": "POST", "path": "/v1/sessions/*/events", "status": 500, "times": 3}),
    )
    .await;
    let began = Instant::now();
    let items = drain_within(&quiet_worker(&env, &started), Duration::from_secs(60)).await;
    eprintln!("item served in {:?}", began.elapsed());
    let report = env.report(&started).await;
    assert_eq!(report["status"], "passed", "{report:#}");
    assert_eq!(items[0].outcome, ItemOutcome::Served(RunEnd::Idle));
    assert_eq!(
        (items[0].stats.posted, items[0].stats.post_failures),
        (1, 0)
    );
    assert!(
        env.server.faults().await.is_empty(),
        "three attempts failed"
    );
    assert_eq!(env.results(&started).await.len(), 1);
    assert_eq!(logs.count("tool result send failed; retrying"), 3);
    assert_eq!(logs.count(" ERROR "), 0, "{}", logs.text());
}

#[tokio::test]
async fn the_devserver_answers_409_to_a_second_result_for_one_call() {
    let _logs = Logs::capture();
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&json!({"name": "dup", "steps": [
            {"tool": "bash", "input": {"command": "echo hi"}}
        ]}))
        .await;
    drain_within(&quiet_worker(&env, &started), Duration::from_secs(60)).await;
    let first = env.results(&started).await.remove(0);
    let again = env
        .server
        .worker(
            &started.environment_key,
            Method::POST,
            &format!("/v1/sessions/{}/events", started.session_id),
            Some(json!({"events": [{"type": "user.tool_result",
                "tool_use_id": first["tool_use_id"], "content": [], "is_error": false}]})),
        )
        .await;
    let message = again.expect_error(409, "conflict_error");
    assert!(message.contains("already has a result"), "{message}");
}

#[tokio::test]
async fn a_duplicate_result_answered_409_counts_as_delivered() {
    let logs = Logs::capture();
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&json!({"name": "lost-answer", "steps": [
            {"tool": "bash", "input": {"command": "echo hi"}, "expect": {"contains": "hi"}}
        ]}))
        .await;
    // The first post lands, its answer is lost: the retry meets the result.
    env.fault(json!({"method": "POST", "path": "/v1/sessions/*/events", "drop_response": true, "times": 1}))
        .await;
    let items = drain_within(&quiet_worker(&env, &started), Duration::from_secs(60)).await;
    assert_eq!(env.report(&started).await["status"], "passed");
    assert!(env.server.faults().await.is_empty());
    assert_eq!(env.results(&started).await.len(), 1);
    assert_eq!(items[0].outcome, ItemOutcome::Served(RunEnd::Idle));
    assert_eq!(
        (items[0].stats.posted, items[0].stats.post_failures),
        (1, 0),
        "{}",
        logs.text()
    );
    assert_eq!(logs.count(" ERROR "), 0, "{}", logs.text());
    assert_eq!(logs.count("tool result was already delivered"), 1);
}

#[tokio::test]
async fn a_result_that_can_never_be_delivered_ends_the_item_and_frees_the_slot() {
    let logs = Logs::capture();
    // A 2 s lease TTL makes the send window 2 s (the heartbeat sets it).
    let env = Env::with_ttl(2).await;
    let stuck = env
        .server
        .start_scenario(&notes_scenario(
            json!([
                {"tool": "write", "input": {"file_path": "{mount:notes}/b.md", "content": "beta\n"},
                 "timeout_ms": 60000}
            ]),
            json!({"/a.md": "alpha\n", "/b.md": "beta\n"}),
        ))
        .await;
    let next = env
        .server
        .start_scenario(
            &json!({"name": "next", "environment_id": stuck.environment_id,
            "steps": [{"tool": "bash", "input": {"command": "echo next"},
                       "expect": {"contains": "next"}}]}),
        )
        .await;
    env.fault(
        json!({"method": "POST", "path": format!("/v1/sessions/{}/events", stuck.session_id),
                     "status": 500}),
    )
    .await;
    let began = Instant::now();
    let items = drain_within(&quiet_worker(&env, &stuck), Duration::from_secs(30)).await;
    eprintln!("both items served in {:?}", began.elapsed());
    assert_eq!(items.len(), 2, "{items:#?}");
    let first = items
        .iter()
        .find(|i| i.session_id == stuck.session_id)
        .unwrap();
    match &first.outcome {
        ItemOutcome::Served(RunEnd::Undelivered { tool_use_id, error }) => {
            assert!(!tool_use_id.is_empty());
            assert!(error.contains("500"), "{error}");
        }
        other => panic!("expected an undelivered result, got {other:?}"),
    }
    assert!(first.stopped, "the stuck item was force-stopped");
    assert_eq!(
        env.server
            .work_state(&stuck.environment_id, &stuck.session_id)
            .await,
        "stopped"
    );
    // The teardown ran its final sync: the edit made by the undelivered call is kept.
    assert_eq!(
        env.server
            .session_memories(&stuck.session_id)
            .await
            .get("/b.md")
            .map(String::as_str),
        Some("beta\n")
    );
    assert_eq!(
        logs.count("failed to send tool result"),
        1,
        "{}",
        logs.text()
    );
    // The slot went to the next item.
    let report = env
        .server
        .final_report(&next.session_id, Duration::from_secs(10))
        .await;
    assert_eq!(report["status"], "passed", "{report:#}");
}
