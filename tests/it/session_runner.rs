//! The session tool runner against the devserver's scripted sessions: the
//! test claims the work item (as a worker would), runs the runner with the
//! item's sessions token, then stops the item, and reads the scenario's
//! report and the session's events.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::harness::Logs;
use crate::common::{ADMIN_KEY, Started, TestServer};
use envworker::api::types::{PollWork, WorkSecret};
use envworker::api::{Client, Credential};
use envworker::session::{
    CallOutcome, RunEnd, RunReport, RunnerOptions, SendWindow, SessionRunner,
};
use envworker::tools::{ToolContext, ToolError, ToolHandler, ToolOutput, Toolset};
use futures::future::BoxFuture;
use reqwest::Method;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// A claimed work item and the client that carries its sessions token.
struct Claimed {
    env_client: Client,
    work_id: String,
    client: Client,
}

async fn claim(server: &TestServer, started: &Started) -> Claimed {
    let env_client = Client::builder(Credential::bearer(started.environment_key.clone()))
        .base_url(server.url())
        .build()
        .unwrap();
    let work = env_client
        .work(&started.environment_id)
        .poll(
            &PollWork {
                block_ms: Some(900),
                reclaim_older_than_ms: None,
            },
            Some("test-worker"),
        )
        .await
        .unwrap()
        .expect("the scenario queued a work item");
    env_client
        .work(&started.environment_id)
        .ack(&work.id)
        .await
        .unwrap();
    let token = WorkSecret::sessions_token(work.secret.as_ref().unwrap().expose()).unwrap();
    let client = env_client.with_credential(Credential::bearer(token.expose().to_string()));
    Claimed {
        env_client,
        work_id: work.id,
        client,
    }
}

fn quick() -> RunnerOptions {
    RunnerOptions {
        max_idle: Some(Duration::from_millis(500)),
        ..Default::default()
    }
}

struct Served {
    run: RunReport,
    report: Value,
    events: Vec<Value>,
    workdir: tempfile::TempDir,
}

impl Served {
    fn results_for(&self, tool_use_id: &str) -> Vec<&Value> {
        self.events
            .iter()
            .filter(|e| {
                e["type"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("tool_result"))
                    && (e["tool_use_id"] == tool_use_id || e["custom_tool_use_id"] == tool_use_id)
            })
            .collect()
    }

    fn step_id(&self, index: usize) -> String {
        self.report["steps"][index]["tool_use_id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    #[track_caller]
    fn assert_passed(&self) {
        assert_eq!(self.report["status"], "passed", "{:#}", self.report);
    }
}

/// Serve one scenario with the toolset over a fresh workdir.
async fn serve(server: &TestServer, scenario: Value, options: RunnerOptions) -> Served {
    let workdir = tempfile::tempdir().unwrap();
    let tools = Arc::new(Toolset::new(ToolContext::new(workdir.path())));
    serve_with(server, scenario, options, tools, workdir).await
}

async fn serve_with(
    server: &TestServer,
    scenario: Value,
    options: RunnerOptions,
    tools: Arc<dyn ToolHandler>,
    workdir: tempfile::TempDir,
) -> Served {
    let started = server.start_scenario(&scenario).await;
    let claimed = claim(server, &started).await;
    let runner = SessionRunner::new(claimed.client.clone(), &started.session_id, tools, options);
    let run = tokio::time::timeout(
        Duration::from_secs(60),
        runner.run(CancellationToken::new()),
    )
    .await
    .expect("the runner ends");
    claimed
        .env_client
        .work(&started.environment_id)
        .stop(&claimed.work_id, true)
        .await
        .unwrap();
    let report = server
        .final_report(&started.session_id, Duration::from_secs(30))
        .await;
    let events = server.events(&started.session_id).await;
    Served {
        run,
        report,
        events,
        workdir,
    }
}

#[tokio::test]
async fn answers_every_call_in_order_then_ends_idle_after_the_turn() {
    let server = TestServer::start().await;
    let served = serve(
        &server,
        json!({
            "name": "basic",
            "steps": [
                {"tool": "write", "input": {"file_path": "notes/a.md", "content": "alpha\n"},
                 "expect": {"is_error": false, "contains": "wrote 6 bytes"}},
                {"tool": "bash", "input": {"command": "cat notes/a.md; true"}, "expect": {"contains": "alpha"}},
                {"tool": "bash", "input": {"command": "true"}, "expect": {"is_error": false, "contains": "(no output)"}},
                {"tool": "read", "input": {"file_path": "nope.md"},
                 "expect": {"is_error": true, "contains": "no such file or directory"}}
            ]
        }),
        quick(),
    )
    .await;
    served.assert_passed();
    assert_eq!(served.run.end, RunEnd::Idle);
    assert_eq!(served.run.stats.executed, 4);
    assert_eq!(served.run.stats.errors, 1);
    assert_eq!(served.run.stats.posted, 4);
    // Each call was answered exactly once.
    for i in 0..4 {
        assert_eq!(served.results_for(&served.step_id(i)).len(), 1, "step {i}");
    }
    assert_eq!(
        std::fs::read_to_string(served.workdir.path().join("notes/a.md")).unwrap(),
        "alpha\n"
    );
}

#[tokio::test]
async fn the_permission_gate_runs_only_what_was_allowed_and_posts_nothing_for_denials() {
    let server = TestServer::start().await;
    let served = serve(
        &server,
        json!({
            "name": "gates",
            "steps": [
                {"tool": "write", "input": {"file_path": "approved.md", "content": "yes"},
                 "evaluated_permission": "ask", "confirm": "allow", "expect": {"is_error": false}},
                {"tool": "write", "input": {"file_path": "refused.md", "content": "no"},
                 "evaluated_permission": "ask", "confirm": "deny"},
                {"tool": "write", "input": {"file_path": "blocked.md", "content": "no"},
                 "evaluated_permission": "deny"},
                {"tool": "bash", "input": {"command": "ls"}, "expect": {"contains": "approved.md", "not_contains": ["refused", "blocked"]}}
            ]
        }),
        quick(),
    )
    .await;
    served.assert_passed();
    assert_eq!(served.run.stats.denied, 2);
    assert_eq!(served.run.stats.executed, 2);
    assert_eq!(served.results_for(&served.step_id(0)).len(), 1);
    assert!(
        served.results_for(&served.step_id(1)).is_empty(),
        "nothing posted for a user denial"
    );
    assert!(
        served.results_for(&served.step_id(2)).is_empty(),
        "nothing posted for a server denial"
    );
    assert!(!served.workdir.path().join("refused.md").exists());
    assert!(!served.workdir.path().join("blocked.md").exists());
}

#[tokio::test]
async fn a_tool_it_does_not_serve_is_left_for_its_owner() {
    let server = TestServer::start().await;
    let scenario = json!({
        "name": "split-client",
        "steps": [
            {"custom_tool": "lookup_customer", "input": {"id": 7}, "timeout_ms": 20000,
             "expect": {"contains": "answered by the app"}},
            {"tool": "bash", "input": {"command": "echo after"}, "expect": {"contains": "after"}}
        ]
    });
    let started = server.start_scenario(&scenario).await;
    let claimed = claim(&server, &started).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let observed = seen.clone();
    let options = RunnerOptions {
        observer: Some(Arc::new(move |r| observed.lock().unwrap().push(r.clone()))),
        ..quick()
    };
    let workdir = tempfile::tempdir().unwrap();
    let runner = SessionRunner::new(
        claimed.client.clone(),
        &started.session_id,
        Arc::new(Toolset::new(ToolContext::new(workdir.path()))),
        options,
    );
    let run = tokio::spawn(runner.run(CancellationToken::new()));
    // The app backend: wait for the custom call, give the runner time to
    // (wrongly) answer it, then answer it itself.
    let call_id = loop {
        let events = server.events(&started.session_id).await;
        if let Some(call) = events.iter().find(|e| e["type"] == "agent.custom_tool_use") {
            break call["id"].as_str().unwrap().to_string();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    server
        .agents(
            Method::POST,
            &format!("/v1/sessions/{}/events", started.session_id),
            Some(json!({"events": [{"type": "user.custom_tool_result", "custom_tool_use_id": call_id,
                                     "content": [{"type": "text", "text": "answered by the app"}]}]})),
        )
        .await
        .ok();
    let run = run.await.unwrap();
    claimed
        .env_client
        .work(&started.environment_id)
        .stop(&claimed.work_id, true)
        .await
        .unwrap();
    let report = server
        .final_report(&started.session_id, Duration::from_secs(30))
        .await;
    assert_eq!(report["status"], "passed", "{report:#}");
    assert_eq!(run.stats.not_owned, 1);
    let events = server.events(&started.session_id).await;
    let answers: Vec<_> = events
        .iter()
        .filter(|e| e["custom_tool_use_id"] == call_id.as_str())
        .collect();
    assert_eq!(answers.len(), 1, "only the owner answered: {answers:#?}");
    let records = seen.lock().unwrap();
    assert!(
        records
            .iter()
            .any(|r| r.outcome == CallOutcome::NotOwned && r.name == "lookup_customer")
    );
}

#[tokio::test]
async fn a_terminated_session_ends_the_run_at_once() {
    let server = TestServer::start().await;
    let served = serve(
        &server,
        json!({"name": "terminated", "steps": [
            {"tool": "bash", "input": {"command": "echo before"}, "expect": {"contains": "before"}},
            {"terminate": true},
            {"tool": "bash", "input": {"command": "echo never"}}
        ]}),
        // No idle end: only the termination can end this run.
        RunnerOptions {
            max_idle: None,
            ..Default::default()
        },
    )
    .await;
    served.assert_passed();
    assert_eq!(served.run.end, RunEnd::Terminated);
    assert_eq!(served.report["steps"][2]["status"], "skipped");
}

#[tokio::test]
async fn a_deleted_session_ends_the_run() {
    let server = TestServer::start().await;
    let started = server
        .start_scenario(&json!({"name": "x", "steps": [{"wait_ms": 10}]}))
        .await;
    let claimed = claim(&server, &started).await;
    let workdir = tempfile::tempdir().unwrap();
    let runner = SessionRunner::new(
        claimed.client.clone(),
        &started.session_id,
        Arc::new(Toolset::new(ToolContext::new(workdir.path()))),
        RunnerOptions {
            max_idle: None,
            ..Default::default()
        },
    );
    let run = tokio::spawn(runner.run(CancellationToken::new()));
    // The scenario ends its turn (the session goes idle); then it is deleted.
    loop {
        let events = server.events(&started.session_id).await;
        if events.iter().any(|e| e["type"] == "session.status_idle") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server
        .agents(
            Method::DELETE,
            &format!("/v1/sessions/{}", started.session_id),
            None,
        )
        .await
        .ok();
    let run = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("ends promptly")
        .unwrap();
    assert_eq!(run.end, RunEnd::Terminated);
}

#[tokio::test]
async fn a_bad_credential_is_a_fatal_end_not_a_retry_loop() {
    let server = TestServer::start().await;
    let started = server
        .start_scenario(&json!({"name": "x", "steps": [{"wait_ms": 10}]}))
        .await;
    let client = Client::builder(Credential::bearer("not-a-token"))
        .base_url(server.url())
        .build()
        .unwrap();
    let workdir = tempfile::tempdir().unwrap();
    let runner = SessionRunner::new(
        client,
        &started.session_id,
        Arc::new(Toolset::new(ToolContext::new(workdir.path()))),
        RunnerOptions::default(),
    );
    let run = tokio::time::timeout(Duration::from_secs(5), runner.run(CancellationToken::new()))
        .await
        .expect("a 401 ends the run");
    match run.end {
        RunEnd::Fatal(why) => assert!(why.contains("401"), "{why}"),
        other => panic!("expected a fatal end, got {other:?}"),
    }
}

#[tokio::test]
async fn a_dropped_stream_reconnects_and_the_history_fills_the_gap() {
    let server = TestServer::start().await;
    // The first two stream connections fail: the tool call is emitted while
    // the runner is backing off, and reaches it through the history.
    server
        .add_faults(vec![json!({"method": "GET", "path": "/v1/sessions/*/events/stream", "status": 503, "times": 2})])
        .await;
    let served = serve(
        &server,
        json!({"name": "reconnect", "steps": [
            {"tool": "bash", "input": {"command": "echo one"}, "expect": {"contains": "one"}},
            {"tool": "bash", "input": {"command": "echo two"}, "expect": {"contains": "two"}}
        ]}),
        quick(),
    )
    .await;
    served.assert_passed();
    for i in 0..2 {
        assert_eq!(
            served.results_for(&served.step_id(i)).len(),
            1,
            "step {i} answered once"
        );
    }
}

/// A `409` on the event stream is retried like a `408` or `429`, as the
/// reference does (its fatal 4xx are all the others): one conflict does not
/// end the run.
#[tokio::test]
async fn a_conflict_on_the_event_stream_is_retried_not_fatal() {
    let server = TestServer::start().await;
    server
        .add_faults(vec![json!({"method": "GET", "path": "/v1/sessions/*/events/stream", "status": 409, "times": 2})])
        .await;
    let served = serve(
        &server,
        json!({"name": "stream-conflict", "steps": [
            {"tool": "bash", "input": {"command": "echo one"}, "expect": {"contains": "one"}}
        ]}),
        quick(),
    )
    .await;
    served.assert_passed();
    assert_eq!(served.run.end, RunEnd::Idle);
    assert_eq!(served.results_for(&served.step_id(0)).len(), 1);
}

/// A transient failure of the history read after a reconnect is retried
/// (twice, as the reference's client retries a request), so a call emitted
/// while the stream was down is not left waiting for another reconnect.
#[tokio::test]
async fn a_transient_failure_of_the_history_read_is_retried() {
    let logs = Logs::capture();
    let server = TestServer::start().await;
    // The first two stream connections fail: the call reaches the runner
    // only through the history, whose first read fails once.
    server
        .add_faults(vec![
            json!({"method": "GET", "path": "/v1/sessions/*/events/stream", "status": 503, "times": 2}),
            json!({"method": "GET", "path": "/v1/sessions/*/events", "status": 503, "times": 1}),
        ])
        .await;
    let served = serve(
        &server,
        json!({"name": "history-retried", "steps": [
            {"tool": "bash", "input": {"command": "echo one"}, "timeout_ms": 15000, "expect": {"contains": "one"}}
        ]}),
        quick(),
    )
    .await;
    served.assert_passed();
    assert_eq!(served.results_for(&served.step_id(0)).len(), 1);
    assert_eq!(
        logs.count("reading the session's history failed; retrying"),
        1,
        "{}",
        logs.text()
    );
    assert_eq!(logs.count("reconcile list failed"), 0, "{}", logs.text());
}

#[tokio::test]
async fn a_failed_result_post_is_retried_and_lands_once() {
    let server = TestServer::start().await;
    server
        .add_faults(vec![
            json!({"method": "POST", "path": "/v1/sessions/*/events", "status": 503, "times": 2}),
        ])
        .await;
    let served = serve(
        &server,
        json!({"name": "retry", "steps": [{"tool": "bash", "input": {"command": "echo hi"}, "expect": {"contains": "hi"}}]}),
        quick(),
    )
    .await;
    served.assert_passed();
    assert_eq!(served.run.stats.posted, 1);
    assert_eq!(served.results_for(&served.step_id(0)).len(), 1);
}

#[tokio::test]
async fn a_result_post_keeps_retrying_for_the_send_window_not_a_fixed_count() {
    // Eight failures in a row, with the backoff shrunk to milliseconds: the
    // old cap of three attempts would have dropped the result.
    let server = TestServer::start().await;
    server
        .add_faults(vec![
            json!({"method": "POST", "path": "/v1/sessions/*/events", "status": 500, "times": 8}),
        ])
        .await;
    let served = serve(
        &server,
        json!({"name": "persistent", "steps": [{"tool": "bash", "input": {"command": "echo hi"}, "expect": {"contains": "hi"}}]}),
        RunnerOptions {
            post_backoff_start: Duration::from_millis(20),
            post_backoff_cap: Duration::from_millis(100),
            ..quick()
        },
    )
    .await;
    served.assert_passed();
    assert_eq!(served.run.end, RunEnd::Idle);
    assert_eq!(
        (served.run.stats.posted, served.run.stats.post_failures),
        (1, 0)
    );
    assert_eq!(served.results_for(&served.step_id(0)).len(), 1);
}

#[tokio::test]
async fn a_permanent_post_error_is_not_retried() {
    let server = TestServer::start().await;
    server
        .add_faults(vec![
            json!({"method": "POST", "path": "/v1/sessions/*/events", "status": 400}),
        ])
        .await;
    let started = server
        .start_scenario(&json!({"name": "refused", "steps": [{"tool": "bash", "input": {"command": "true"}, "timeout_ms": 3000}]}))
        .await;
    let claimed = claim(&server, &started).await;
    let workdir = tempfile::tempdir().unwrap();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let seen = attempts.clone();
    let window = Duration::from_millis(500);
    let runner = SessionRunner::new(
        claimed.client.clone(),
        &started.session_id,
        Arc::new(Toolset::new(ToolContext::new(workdir.path()))),
        RunnerOptions {
            observer: Some(Arc::new(move |r| seen.lock().unwrap().push(r.clone()))),
            send_window: SendWindow::fixed(window),
            ..quick()
        },
    );
    let run = tokio::spawn(runner.run(CancellationToken::new()));
    let began = std::time::Instant::now();
    while attempts.lock().unwrap().is_empty() {
        assert!(began.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // One attempt only: well under the 1 s first backoff.
    let gave_up = began.elapsed();
    assert!(gave_up < Duration::from_millis(900), "{gave_up:?}");
    assert_eq!(
        attempts.lock().unwrap()[0].outcome,
        CallOutcome::Answered {
            is_error: false,
            posted: false
        }
    );
    // The agent would wait for that result for ever, and no reconcile comes
    // (the stream stays up): the run ends by itself once the call has stayed
    // undeliverable for the bound, two send windows — not at once.
    let report = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("the run ends")
        .unwrap();
    assert!(
        began.elapsed() >= 2 * window,
        "ended {:?} after the start; the post was given up by {gave_up:?}",
        began.elapsed()
    );
    match report.end {
        RunEnd::Undelivered { tool_use_id, error } => {
            assert_eq!(tool_use_id, attempts.lock().unwrap()[0].tool_use_id);
            assert!(error.contains("400"), "{error}");
        }
        other => panic!("expected an undelivered result, got {other:?}"),
    }
}

/// The runner's own requests on the session (method, path after the
/// session's, status), in arrival order, from the devserver's request log.
async fn session_requests(server: &TestServer, session_id: &str) -> Vec<(String, String, u64)> {
    let logged = server.dev(Method::GET, "/dev/requests", None).await.ok();
    let prefix = format!("/v1/sessions/{session_id}");
    logged["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["auth"] == "bearer")
        .filter_map(|r| {
            let rest = r["path"].as_str()?.strip_prefix(&prefix)?;
            Some((
                r["method"].as_str()?.to_string(),
                rest.to_string(),
                r["status"].as_u64()?,
            ))
        })
        .collect()
}

/// Wait until `logs` has `n` lines holding `needle`.
async fn until_logged(logs: &Logs, needle: &str, n: usize, within: Duration) {
    let began = std::time::Instant::now();
    while logs.count(needle) < n {
        assert!(
            began.elapsed() < within,
            "no {n}× {needle:?} within {within:?}:\n{}",
            logs.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Issue 24 item 7: a result that could not be posted within the send
/// window does not end the run. The call stays unanswered until the next
/// reconcile — after the event stream reconnects, as the reference does —
/// which posts the result computed the first time (the tool does not run a
/// second time), and the session goes on to its next call.
#[tokio::test]
async fn a_result_that_could_not_be_posted_is_answered_at_the_next_reconcile_and_the_session_goes_on()
 {
    let logs = Logs::capture();
    let server = TestServer::start().await;
    server
        .add_faults(vec![
            // The first event stream is closed by the server 3.5 s after it
            // opens: after the post gave up (a 2 s window), well before the
            // bound (two more windows).
            json!({"method": "GET", "path": "/v1/sessions/*/events/stream", "cut_after_ms": 3500, "times": 1}),
            // Every result post fails until the test clears the rules.
            json!({"method": "POST", "path": "/v1/sessions/*/events", "status": 503}),
        ])
        .await;
    let started = server
        .start_scenario(&json!({"name": "answered-again", "steps": [
            {"tool": "bash", "input": {"command": "echo ran >> runs.txt; wc -l < runs.txt"},
             "timeout_ms": 30000, "expect": {"is_error": false, "contains": "1"}},
            {"tool": "bash", "input": {"command": "echo two"}, "expect": {"contains": "two"}}
        ]}))
        .await;
    let claimed = claim(&server, &started).await;
    let workdir = tempfile::tempdir().unwrap();
    let runner = SessionRunner::new(
        claimed.client.clone(),
        &started.session_id,
        Arc::new(Toolset::new(ToolContext::new(workdir.path()))),
        RunnerOptions {
            send_window: SendWindow::fixed(Duration::from_secs(2)),
            post_backoff_start: Duration::from_millis(50),
            post_backoff_cap: Duration::from_millis(200),
            ..quick()
        },
    );
    let run = tokio::spawn(runner.run(CancellationToken::new()));
    until_logged(
        &logs,
        "failed to send tool result",
        1,
        Duration::from_secs(10),
    )
    .await;
    server.clear_faults().await;
    let run = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the runner ends")
        .unwrap();
    claimed
        .env_client
        .work(&started.environment_id)
        .stop(&claimed.work_id, true)
        .await
        .unwrap();
    let report = server
        .final_report(&started.session_id, Duration::from_secs(30))
        .await;
    assert_eq!(report["status"], "passed", "{report:#}\n{}", logs.text());
    assert_eq!(run.end, RunEnd::Idle, "{}", logs.text());
    assert_eq!(
        (
            run.stats.executed,
            run.stats.posted,
            run.stats.post_failures
        ),
        (2, 2, 1)
    );
    // The command ran once: the result posted at the reconcile is the one
    // computed before.
    assert_eq!(
        std::fs::read_to_string(workdir.path().join("runs.txt")).unwrap(),
        "ran\n"
    );
    // Nothing was posted between the give-up and the reconnect: the first
    // result that landed came after the second stream and its history read.
    let requests = session_requests(&server, &started.session_id).await;
    let landed = requests
        .iter()
        .position(|(m, p, s)| m == "POST" && p == "/events" && *s == 200)
        .expect("a result landed");
    let streams: Vec<usize> = requests
        .iter()
        .enumerate()
        .filter(|(_, (m, p, _))| m == "GET" && p == "/events/stream")
        .map(|(i, _)| i)
        .collect();
    assert!(streams.len() >= 2, "{requests:#?}");
    assert!(streams[1] < landed, "{requests:#?}");
    let last_refused = requests
        .iter()
        .rposition(|(m, p, s)| m == "POST" && p == "/events" && *s == 503)
        .unwrap();
    assert!(last_refused < streams[1], "{requests:#?}");
    assert_eq!(logs.count("still undeliverable"), 0, "{}", logs.text());
}

/// The bound: a call whose result stays undeliverable is answered again at
/// each reconcile, but the slot is not held for ever — two send windows
/// after its first post gave up, the run ends and says why. The tool ran once.
#[tokio::test]
async fn a_result_still_undeliverable_past_the_bound_ends_the_run_and_says_so() {
    let logs = Logs::capture();
    let server = TestServer::start().await;
    server
        .add_faults(vec![
            // Every event stream is closed 700 ms after it opens: reconciles keep coming.
            json!({"method": "GET", "path": "/v1/sessions/*/events/stream", "cut_after_ms": 700}),
            json!({"method": "POST", "path": "/v1/sessions/*/events", "status": 503}),
        ])
        .await;
    let started = server
        .start_scenario(&json!({"name": "never-delivered", "steps": [
            {"tool": "bash", "input": {"command": "echo ran >> runs.txt"}, "timeout_ms": 30000}
        ]}))
        .await;
    let claimed = claim(&server, &started).await;
    let workdir = tempfile::tempdir().unwrap();
    let window = Duration::from_secs(1);
    let runner = SessionRunner::new(
        claimed.client.clone(),
        &started.session_id,
        Arc::new(Toolset::new(ToolContext::new(workdir.path()))),
        RunnerOptions {
            send_window: SendWindow::fixed(window),
            post_backoff_start: Duration::from_millis(50),
            post_backoff_cap: Duration::from_millis(200),
            ..quick()
        },
    );
    let began = std::time::Instant::now();
    let run = tokio::time::timeout(
        Duration::from_secs(20),
        runner.run(CancellationToken::new()),
    )
    .await
    .expect("the run ends");
    // The first post gives up a window after the call, and the bound is two
    // more windows.
    assert!(
        began.elapsed() >= 3 * window,
        "ended after {:?}: {}",
        began.elapsed(),
        logs.text()
    );
    match &run.end {
        RunEnd::Undelivered { error, .. } => assert!(error.contains("503"), "{error}"),
        other => panic!("expected an undelivered result, got {other:?}"),
    }
    assert!(
        logs.count("failed to send tool result") >= 2,
        "answered again at a reconcile: {}",
        logs.text()
    );
    assert_eq!(
        logs.count("still undeliverable"),
        1,
        "the end says why: {}",
        logs.text()
    );
    assert!(
        logs.count("ending the session's work item so its slot is not held") >= 1,
        "{}",
        logs.text()
    );
    assert_eq!(run.stats.executed, 1);
    assert_eq!(
        std::fs::read_to_string(workdir.path().join("runs.txt")).unwrap(),
        "ran\n"
    );
}

/// A tool handler that sleeps past its deadline, and records the order of calls and hooks.
struct Slow {
    log: Arc<Mutex<Vec<String>>>,
}

impl ToolHandler for Slow {
    fn owns(&self, name: &str) -> bool {
        name == "bash"
    }

    fn call<'a>(
        &'a self,
        _name: &'a str,
        input: Value,
        _deadline: tokio::time::Instant,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let ms = input["sleep_ms"].as_u64().unwrap_or(0);
            self.log.lock().unwrap().push(format!("start {ms}"));
            tokio::time::sleep(Duration::from_millis(ms)).await;
            self.log.lock().unwrap().push(format!("end {ms}"));
            Ok(ToolOutput::Text(format!("slept {ms}")))
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        self.log.lock().unwrap().push("close".into());
        Box::pin(async {})
    }
}

#[tokio::test]
async fn each_call_is_bounded_and_the_hook_runs_between_calls() {
    let server = TestServer::start().await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let hook_log = log.clone();
    let options = RunnerOptions {
        tool_timeout: Duration::from_millis(100),
        after_call: Some(Arc::new(move || {
            let log = hook_log.clone();
            Box::pin(async move {
                log.lock().unwrap().push("hook".into());
            })
        })),
        ..quick()
    };
    let served = serve_with(
        &server,
        json!({"name": "bounded", "steps": [
            {"tool": "bash", "input": {"sleep_ms": 10}, "expect": {"contains": "slept 10"}},
            {"tool": "bash", "input": {"sleep_ms": 60000}, "expect": {"is_error": true, "contains": "tool \"bash\" timed out after"}},
            {"tool": "bash", "input": {"sleep_ms": 20}, "expect": {"contains": "slept 20"}}
        ]}),
        options,
        Arc::new(Slow { log: log.clone() }),
        tempfile::tempdir().unwrap(),
    )
    .await;
    served.assert_passed();
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log,
        [
            "start 10",
            "end 10",
            "hook",
            "start 60000",
            "hook",
            "start 20",
            "end 20",
            "hook",
            "close"
        ],
    );
}

/// A runner on a session whose one call is `sleep 20`, started with
/// `options`; returns once the command runs. The run ends when `cancel` or
/// `shutdown` fires.
async fn running_a_long_call(
    server: &TestServer,
    options: RunnerOptions,
    cancel: &CancellationToken,
    shutdown: &CancellationToken,
) -> (
    Started,
    tokio::task::JoinHandle<RunReport>,
    tempfile::TempDir,
) {
    let started = server
        .start_scenario(&json!({"name": "long", "steps": [{"tool": "bash", "input": {"command": "sleep 20; touch finished"}, "timeout_ms": 30000}]}))
        .await;
    let claimed = claim(server, &started).await;
    let workdir = tempfile::tempdir().unwrap();
    let runner = SessionRunner::new(
        claimed.client.clone(),
        &started.session_id,
        Arc::new(Toolset::new(ToolContext::new(workdir.path()))),
        options,
    );
    let run = tokio::spawn(runner.run_until(cancel.clone(), shutdown.clone()));
    loop {
        let events = server.events(&started.session_id).await;
        if events.iter().any(|e| e["type"] == "agent.tool_use") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    (started, run, workdir)
}

#[tokio::test]
async fn cancelling_stops_the_call_in_flight_and_returns_promptly() {
    let server = TestServer::start().await;
    let (cancel, shutdown) = (CancellationToken::new(), CancellationToken::new());
    let (started, run, _workdir) =
        running_a_long_call(&server, RunnerOptions::default(), &cancel, &shutdown).await;
    let at = std::time::Instant::now();
    cancel.cancel();
    let run = run.await.unwrap();
    assert_eq!(run.mid_turn, None, "not a shutdown");
    assert_eq!(run.end, RunEnd::Cancelled);
    assert!(at.elapsed() < Duration::from_secs(2), "{:?}", at.elapsed());
    let events = server.events(&started.session_id).await;
    assert!(
        !events.iter().any(|e| e["type"] == "user.tool_result"),
        "nothing posted for the cancelled call"
    );
    let _ = ADMIN_KEY;
}

/// A shutdown answers the call in flight: past the call grace it is cut off
/// (its command killed) and answered with an error; the session is mid-turn.
#[tokio::test]
async fn a_shutdown_cuts_the_call_off_after_the_grace_and_answers_it() {
    let server = TestServer::start().await;
    let (cancel, shutdown) = (CancellationToken::new(), CancellationToken::new());
    let options = RunnerOptions {
        call_grace: Duration::from_millis(500),
        ..Default::default()
    };
    let (started, run, workdir) = running_a_long_call(&server, options, &cancel, &shutdown).await;
    let at = std::time::Instant::now();
    shutdown.cancel();
    let run = run.await.unwrap();
    assert!(at.elapsed() < Duration::from_secs(5), "{:?}", at.elapsed());
    assert_eq!(run.end, RunEnd::Cancelled);
    assert_eq!(run.mid_turn, Some(true));
    assert_eq!(
        (run.stats.executed, run.stats.posted, run.stats.errors),
        (1, 1, 1)
    );
    let results = server.tool_results(&started.session_id).await;
    assert_eq!(results.len(), 1, "{results:#?}");
    assert_eq!(results[0]["is_error"], true);
    let text = results[0]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("cut off after") && text.contains("shut down"),
        "{text}"
    );
    assert!(!workdir.path().join("finished").exists());
}

/// A lease that ends while a shutdown waits for the call drops it: the item
/// is no longer this worker's to answer for.
#[tokio::test]
async fn a_lease_ending_during_the_shutdown_grace_drops_the_call() {
    let server = TestServer::start().await;
    let (cancel, shutdown) = (CancellationToken::new(), CancellationToken::new());
    let (started, run, _workdir) =
        running_a_long_call(&server, RunnerOptions::default(), &cancel, &shutdown).await;
    shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at = std::time::Instant::now();
    cancel.cancel();
    let run = run.await.unwrap();
    assert!(at.elapsed() < Duration::from_secs(2), "{:?}", at.elapsed());
    assert_eq!(run.end, RunEnd::Cancelled);
    assert!(server.tool_results(&started.session_id).await.is_empty());
}

/// A shutdown after the turn ended (the idle countdown running) finds the
/// session resting: not mid-turn, so the item may be stopped.
#[tokio::test]
async fn a_shutdown_after_the_turn_ended_is_not_mid_turn() {
    let server = TestServer::start().await;
    let started = server
        .start_scenario(
            &json!({"name": "rest", "steps": [{"tool": "bash", "input": {"command": "true"}}]}),
        )
        .await;
    let claimed = claim(&server, &started).await;
    let workdir = tempfile::tempdir().unwrap();
    let runner = SessionRunner::new(
        claimed.client.clone(),
        &started.session_id,
        Arc::new(Toolset::new(ToolContext::new(workdir.path()))),
        RunnerOptions {
            max_idle: Some(Duration::from_secs(300)),
            ..Default::default()
        },
    );
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(runner.run_until(CancellationToken::new(), shutdown.clone()));
    loop {
        let events = server.events(&started.session_id).await;
        if events
            .iter()
            .any(|e| e["type"] == "session.status_idle" && e["stop_reason"]["type"] == "end_turn")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    shutdown.cancel();
    let run = run.await.unwrap();
    assert_eq!(run.mid_turn, Some(false));
}
