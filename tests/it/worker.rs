//! The environment worker against the devserver: the SDK's worker, lease,
//! secret and memory end-to-end scenarios (`sdk-behaviour.md` §5.2–5.3),
//! each by name.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::harness::Logs;
use crate::common::worker_env::Env;
use crate::common::{ADMIN_KEY, Started, TestServer, scenario};
use envworker::api::types::{Redacted, WorkState};
use envworker::memory::options::{DeleteMode, SyncInterval};
use envworker::session::RunEnd;
use envworker::worker::lease::LeaseEnd;
use envworker::worker::poll::DrainOptions;
use envworker::worker::{EnvironmentWorker, ItemOutcome, ItemReport, WorkItem};
use reqwest::Method;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

async fn drain(worker: &EnvironmentWorker) -> Vec<ItemReport> {
    tokio::time::timeout(
        Duration::from_secs(90),
        worker.drain(CancellationToken::new(), DrainOptions::default()),
    )
    .await
    .expect("the drain ends")
    .unwrap()
    .items
}

fn notes_scenario(steps: Value) -> Value {
    json!({
        "name": "notes",
        "memory_stores": [{"key": "notes", "name": "Notes", "access": "read_write",
                           "memories": {"/a.md": "alpha\n"}}],
        "steps": steps,
    })
}

#[tokio::test]
async fn claims_a_session_dispatches_its_tools_heartbeats_the_lease_and_force_stops_on_exit() {
    let env = Env::new().await;
    let doc = scenario("two-stores-sync");
    let started = env.server.start_scenario(&doc).await;
    let worker = env.worker(&started, |_| {});
    let items = drain(&worker).await;
    assert_eq!(items.len(), 1);
    let item = &items[0];
    assert_eq!(item.outcome, ItemOutcome::Served(RunEnd::Idle));
    assert!(item.stopped, "force-stopped on exit");
    assert_eq!(item.lease, Some(LeaseEnd::Released));
    assert_eq!(env.work_state(&started, &item.work_id).await, "stopped");
    let report = env.report(&started).await;
    assert_eq!(report["status"], "passed", "{report:#}");
    for (key, want) in doc["expect_final"].as_object().unwrap() {
        assert_eq!(&report["final_contents"][key], want, "store {key}");
    }
    // The folders it mounted are gone; the workdir stays.
    assert_eq!(
        std::fs::read_dir(env.mount_root())
            .map(|d| d.count())
            .unwrap_or(0),
        0
    );
    // The heartbeat ran: the item saw at least the first beat.
    let work = env
        .server
        .agents(
            Method::GET,
            &format!(
                "/v1/environments/{}/work/{}",
                started.environment_id, item.work_id
            ),
            None,
        )
        .await
        .ok();
    assert!(work["latest_heartbeat_at"].is_string(), "{work:#}");
}

#[tokio::test]
async fn the_worker_lists_the_store_folders_as_allowed_roots_outside_the_workdir() {
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&notes_scenario(json!([
            {"tool": "write", "input": {"file_path": "{mount:notes}/b.md", "content": "beta\n"}, "expect": {"is_error": false}},
            {"tool": "read", "input": {"file_path": "{mount:notes}/a.md"}, "expect": {"contains": "alpha"}}
        ])))
        .await;
    assert!(!env.mount_root().starts_with(env.work.path()));
    drain(&env.worker(&started, |_| {})).await;
    let report = env.report(&started).await;
    assert_eq!(report["status"], "passed", "{report:#}");
    assert_eq!(report["final_contents"]["notes"]["/b.md"], "beta\n");
}

#[tokio::test]
async fn the_worker_leaves_the_allowed_roots_unset_when_memory_is_off() {
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&notes_scenario(json!([
            {"tool": "read", "input": {"file_path": "{mount:notes}/a.md"},
             "expect": {"is_error": true, "contains": "outside the session's working directory"}}
        ])))
        .await;
    let logs = Logs::capture();
    drain(&env.worker(&started, |o| o.memory_sync_interval = SyncInterval::OFF)).await;
    let report = env.report(&started).await;
    assert_eq!(report["status"], "passed", "{report:#}");
    assert!(!env.mount_root().exists(), "nothing was mounted");
    assert_eq!(logs.count(" ERROR "), 0, "{}", logs.text());
}

#[tokio::test]
async fn the_worker_fails_the_item_when_the_sessions_token_is_missing() {
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&notes_scenario(
            json!([{"tool": "bash", "input": {"command": "touch ran"}, "timeout_ms": 2000}]),
        ))
        .await;
    let work = env.claim(&started).await;
    let worker = env.worker(&started, |_| {});
    let mut item = WorkItem::from(work);
    item.secret = None;
    let report = worker
        .handle_item(item, CancellationToken::new(), None)
        .await;
    match &report.outcome {
        ItemOutcome::Failed(why) => assert!(why.contains("carried no sessions token"), "{why}"),
        other => panic!("expected a failure, got {other:?}"),
    }
    assert!(report.stopped, "the item is still force-stopped");
    assert_eq!(env.work_state(&started, &report.work_id).await, "stopped");
    assert!(!env.work.path().join("ran").exists(), "no tool ran");
    assert!(!env.mount_root().exists(), "no folder was made");
}

#[tokio::test]
async fn the_worker_skips_memory_silently_when_the_interval_turns_it_off() {
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&notes_scenario(json!([{"tool": "bash", "input": {"command": "echo hi"}, "expect": {"contains": "hi"}}])))
        .await;
    let work = env.claim(&started).await;
    let worker = env.worker(&started, |o| o.memory_sync_interval = SyncInterval::OFF);
    let mut item = WorkItem::from(work);
    item.secret = None; // falls back to the environment key
    let logs = Logs::capture();
    let report = worker
        .handle_item(item, CancellationToken::new(), None)
        .await;
    assert_eq!(report.outcome, ItemOutcome::Served(RunEnd::Idle));
    assert!(!logs.text().contains("sessions token"), "{}", logs.text());
    assert_eq!(logs.count(" WARN "), 0, "{}", logs.text());
    assert_eq!(logs.count(" ERROR "), 0, "{}", logs.text());
    assert_eq!(env.report(&started).await["status"], "passed");
}

#[tokio::test]
async fn an_undecodable_secret_falls_back_to_the_environment_key_with_a_warning() {
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(
            &json!({"name": "plain", "steps": [{"tool": "bash", "input": {"command": "echo ok"}}]}),
        )
        .await;
    let work = env.claim(&started).await;
    let mut item = WorkItem::from(work);
    item.secret = Some(Redacted::new("%%% not base64 %%%"));
    let logs = Logs::capture();
    let report = env
        .worker(&started, |_| {})
        .handle_item(item, CancellationToken::new(), None)
        .await;
    assert_eq!(report.outcome, ItemOutcome::Served(RunEnd::Idle));
    assert_eq!(
        logs.count("work item carried a secret payload but no sessions token could be extracted; falling back to the environment key"),
        1,
        "{}",
        logs.text()
    );
    assert!(
        !logs.text().contains("%%% not base64"),
        "the secret is never logged"
    );
    assert_eq!(env.report(&started).await["status"], "passed");
}

#[tokio::test]
async fn a_session_with_no_memory_store_stays_quiet() {
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(
            &json!({"name": "plain", "steps": [{"tool": "bash", "input": {"command": "true"}}]}),
        )
        .await;
    let logs = Logs::capture();
    drain(&env.worker(&started, |_| {})).await;
    assert_eq!(
        logs.count("memory stores disabled for this item"),
        1,
        "{}",
        logs.text()
    );
    assert_eq!(logs.count(" WARN "), 0, "{}", logs.text());
    assert_eq!(logs.count(" ERROR "), 0, "{}", logs.text());
}

#[tokio::test]
async fn the_worker_fails_the_item_when_a_memory_store_cannot_be_downloaded() {
    let env = Env::new().await;
    // Debris where the store would be mounted.
    let debris = env.mount_root().join("notes");
    std::fs::create_dir_all(&debris).unwrap();
    std::fs::write(debris.join("keep.txt"), "mine").unwrap();
    let started = env
        .server
        .start_scenario(&notes_scenario(
            json!([{"tool": "bash", "input": {"command": "touch ran"}, "timeout_ms": 2000}]),
        ))
        .await;
    let items = drain(&env.worker(&started, |_| {})).await;
    match &items[0].outcome {
        ItemOutcome::Failed(why) => assert!(why.contains("already exists"), "{why}"),
        other => panic!("expected a failure, got {other:?}"),
    }
    assert!(items[0].stopped);
    assert_eq!(
        std::fs::read_to_string(debris.join("keep.txt")).unwrap(),
        "mine",
        "debris untouched"
    );
    assert!(!env.work.path().join("ran").exists());
}

#[tokio::test]
async fn the_worker_flushes_writes_when_the_control_plane_stops_the_item_mid_session() {
    let env = Env::with_ttl(2).await; // a beat every second
    let started = env
        .server
        .start_scenario(&notes_scenario(json!([
            {"tool": "write", "input": {"file_path": "{mount:notes}/late.md", "content": "saved by the flush\n"}},
            {"wait_ms": 60000}
        ])))
        .await;
    let worker = env.worker(&started, |o| {
        // The flush is what is tested: no change-driven push ahead of it.
        o.memory_push = false;
    });
    let drained = tokio::spawn(async move { drain(&worker).await });
    // Once the write happened, the control plane asks for the item back.
    loop {
        let events = env.events(&started).await;
        if events.iter().any(|e| e["type"] == "user.tool_result") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let work = env
        .server
        .agents(
            Method::GET,
            &format!("/v1/environments/{}/work", started.environment_id),
            None,
        )
        .await
        .ok();
    let work_id = work["data"][0]["id"].as_str().unwrap().to_string();
    env.server
        .agents(
            Method::POST,
            &format!(
                "/v1/environments/{}/work/{work_id}/stop",
                started.environment_id
            ),
            Some(json!({"force": false})),
        )
        .await;
    let items = tokio::time::timeout(Duration::from_secs(20), drained)
        .await
        .expect("the item ends")
        .unwrap();
    let item = &items[0];
    assert_eq!(item.outcome, ItemOutcome::Served(RunEnd::Cancelled));
    assert_eq!(item.lease, Some(LeaseEnd::Stopped));
    assert!(item.stopped, "a control-plane stop still force-stops");
    assert_eq!(
        env.work_state(&started, &item.work_id).await,
        "stopped",
        "the graceful stop was followed by a force-stop"
    );
    assert_eq!(item.teardown.flushed, 1);
    let (memories, _) = env
        .server
        .list_all(&format!(
            "/v1/memory_stores/{}/memories?view=full",
            store_id(&env, &started).await
        ))
        .await;
    assert!(
        memories
            .iter()
            .any(|m| m["path"] == "/late.md" && m["content"] == "saved by the flush\n"),
        "{memories:#?}"
    );
}

async fn store_id(env: &Env, started: &Started) -> String {
    env.server.session_store(&started.session_id).await
}

#[tokio::test]
async fn on_a_clean_end_the_worker_syncs_once_and_the_flush_adds_nothing() {
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&notes_scenario(json!([
            {"tool": "write", "input": {"file_path": "{mount:notes}/b.md", "content": "beta\n"}}
        ])))
        .await;
    let items = drain(&env.worker(&started, |_| {})).await;
    assert_eq!(items[0].outcome, ItemOutcome::Served(RunEnd::Idle));
    assert!(!items[0].teardown.final_sync_cut_off);
    assert_eq!(
        items[0].teardown.flushed, 0,
        "the final sync uploaded everything"
    );
    assert_eq!(
        env.report(&started).await["final_contents"]["notes"]["/b.md"],
        "beta\n"
    );
}

#[tokio::test]
async fn the_worker_can_turn_remote_deletes_off() {
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&notes_scenario(json!([
            {"tool": "bash", "input": {"command": "rm {mount:notes}/a.md"}}
        ])))
        .await;
    drain(&env.worker(&started, |o| o.memory_sync_deletions = DeleteMode::Disabled)).await;
    assert_eq!(
        env.report(&started).await["final_contents"]["notes"]["/a.md"],
        "alpha\n"
    );
}

#[tokio::test]
async fn the_workers_flush_is_bounded_and_teardown_still_runs() {
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&notes_scenario(json!([
            {"tool": "write", "input": {"file_path": "{mount:notes}/slow.md", "content": "x"}}
        ])))
        .await;
    // Every upload hangs longer than the bounds.
    env.fault(
        json!({"method": "POST", "path": "/v1/memory_stores/*/memories", "latency_ms": 5000}),
    )
    .await;
    let logs = Logs::capture();
    let items = drain(&env.worker(&started, |o| {
        o.memory_teardown_bound = Duration::from_secs(1)
    }))
    .await;
    let item = &items[0];
    assert!(item.teardown.final_sync_cut_off, "{item:?}");
    assert!(item.teardown.flush_cut_off, "{item:?}");
    assert!(item.stopped, "teardown went on to the force-stop");
    assert!(
        logs.text()
            .contains("1 of 1 changed files had not finished uploading"),
        "{}",
        logs.text()
    );
    assert!(
        !env.mount_root().join("notes").exists(),
        "dispose still ran"
    );
}

#[tokio::test]
async fn skips_a_non_session_item_but_still_stops_it() {
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&json!({"name": "x", "steps": []}))
        .await;
    let work = env.claim(&started).await;
    let mut item = WorkItem::from(work);
    item.kind = "healthcheck".into();
    let report = env
        .worker(&started, |_| {})
        .handle_item(item, CancellationToken::new(), None)
        .await;
    assert_eq!(report.outcome, ItemOutcome::NotASession);
    assert!(report.stopped);
    assert_eq!(env.work_state(&started, &report.work_id).await, "stopped");
}

#[tokio::test]
async fn a_failing_work_item_does_not_take_the_poll_loop_down() {
    let env = Env::new().await;
    std::fs::create_dir_all(env.mount_root().join("notes")).unwrap(); // the first item fails on it
    let first = env
        .server
        .start_scenario(&notes_scenario(
            json!([{"tool": "bash", "input": {"command": "true"}, "timeout_ms": 1000}]),
        ))
        .await;
    let second = env
        .server
        .start_scenario(&json!({"name": "second", "environment_id": first.environment_id,
                                 "steps": [{"tool": "bash", "input": {"command": "echo second"}, "expect": {"contains": "second"}}]}))
        .await;
    let worker = env.worker(&first, |_| {});
    let cancel = CancellationToken::new();
    let running = tokio::spawn({
        let (worker, cancel) = (worker.clone(), cancel.clone());
        async move { worker.run(cancel).await }
    });
    let report = env.report(&second).await;
    assert_eq!(report["status"], "passed", "{report:#}");
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn run_requires_the_environment_key() {
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&json!({"name": "x", "steps": []}))
        .await;
    let worker = env.worker(&started, |o| o.environment_key = None);
    let err = worker.run(CancellationToken::new()).await.unwrap_err();
    assert!(
        err.to_string().contains("environment key are required"),
        "{err}"
    );
}

/// Run a long scenario under a heartbeat fault; returns the item report.
async fn with_heartbeat_fault(rule: Value, ttl: i64) -> (Env, Started, ItemReport) {
    let env = Env::with_ttl(ttl).await;
    let started = env
        .server
        .start_scenario(&json!({"name": "long", "steps": [
            {"tool": "bash", "input": {"command": "echo first"}},
            {"wait_ms": 60000}
        ]}))
        .await;
    let work = env.claim(&started).await;
    let worker = env.worker(&started, |_| {});
    let item = WorkItem::from(work);
    let handle = tokio::spawn({
        let worker = worker.clone();
        async move {
            worker
                .handle_item(item, CancellationToken::new(), None)
                .await
        }
    });
    // Let the first beat through, then break the heartbeats.
    loop {
        if env
            .events(&started)
            .await
            .iter()
            .any(|e| e["type"] == "user.tool_result")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.fault(rule).await;
    let report = tokio::time::timeout(Duration::from_secs(30), handle)
        .await
        .expect("the item ends")
        .unwrap();
    (env, started, report)
}

#[tokio::test]
async fn a_heartbeat_412_releases_the_item_without_stopping_it() {
    let (env, started, report) = with_heartbeat_fault(
        json!({"path": "/v1/environments/*/work/*/heartbeat", "status": 412}),
        2,
    )
    .await;
    assert_eq!(report.lease, Some(LeaseEnd::Lost));
    assert!(!report.stopped, "released, not stopped");
    assert_ne!(env.work_state(&started, &report.work_id).await, "stopped");
}

#[tokio::test]
async fn another_4xx_on_the_heartbeat_still_force_stops() {
    let (env, started, report) = with_heartbeat_fault(
        json!({"path": "/v1/environments/*/work/*/heartbeat", "status": 403}),
        2,
    )
    .await;
    assert!(
        matches!(report.lease, Some(LeaseEnd::Refused(_))),
        "{:?}",
        report.lease
    );
    assert!(report.stopped);
    assert_eq!(env.work_state(&started, &report.work_id).await, "stopped");
}

#[tokio::test]
async fn a_401_is_permanent_and_cancels_the_session_on_the_first_failure() {
    let started_at = std::time::Instant::now();
    let (_env, _started, report) = with_heartbeat_fault(
        json!({"path": "/v1/environments/*/work/*/heartbeat", "status": 401}),
        2,
    )
    .await;
    assert!(
        matches!(report.lease, Some(LeaseEnd::Refused(_))),
        "{:?}",
        report.lease
    );
    assert_eq!(report.outcome, ItemOutcome::Served(RunEnd::Cancelled));
    assert!(started_at.elapsed() < Duration::from_secs(15));
}

#[tokio::test]
async fn a_409_is_retried_until_the_ttl_passes_with_no_successful_beat() {
    let (_env, _started, report) = with_heartbeat_fault(
        json!({"path": "/v1/environments/*/work/*/heartbeat", "status": 409}),
        3,
    )
    .await;
    assert_eq!(
        report.lease,
        Some(LeaseEnd::Lost),
        "assumed lost after a TTL of failures"
    );
    assert!(!report.stopped);
}

#[tokio::test]
async fn a_heartbeat_that_never_answers_is_cut_off_each_interval_and_the_stale_lease_ends_the_session()
 {
    let logs = Logs::capture();
    let (_env, _started, report) = with_heartbeat_fault(
        json!({"path": "/v1/environments/*/work/*/heartbeat", "latency_ms": 60000}),
        2,
    )
    .await;
    assert_eq!(report.lease, Some(LeaseEnd::Lost));
    // Each beat is cut off after one interval (TTL 2 s → 1 s), not after the 60 s it would hang.
    assert!(
        logs.count("error=no answer within 1000ms") >= 1,
        "{}",
        logs.text()
    );
    assert_eq!(
        logs.count("lease assumed lost: no successful heartbeat in ttl"),
        1
    );
    assert!(!report.stopped);
}

#[tokio::test]
async fn does_not_log_the_secret_or_any_key_on_any_path() {
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&notes_scenario(json!([
            {"tool": "bash", "input": {"command": "exit 3"}},
            {"tool": "read", "input": {"file_path": "/etc/shadow"}}
        ])))
        .await;
    let logs = Logs::capture();
    let work = env.claim(&started).await;
    let secret = work.secret.clone().unwrap();
    let token = envworker::api::types::WorkSecret::sessions_token(secret.expose()).unwrap();
    // A heartbeat error path too.
    let report = env
        .worker(&started, |_| {})
        .handle_item(WorkItem::from(work), CancellationToken::new(), None)
        .await;
    assert_eq!(report.outcome, ItemOutcome::Served(RunEnd::Idle));
    let text = logs.text();
    for (what, value) in [
        ("work secret", secret.expose()),
        ("sessions token", token.expose()),
        ("environment key", started.environment_key.as_str()),
        ("admin key", ADMIN_KEY),
    ] {
        assert!(!text.contains(value), "the {what} appears in the logs");
    }
}

#[tokio::test]
async fn the_agents_shell_never_sees_the_workers_credentials() {
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&json!({"name": "env", "steps": [
            {"tool": "bash", "input": {"command": "env"}, "expect": {"not_contains": ["ANTHROPIC_", "ENVWORKER_"]}}
        ]}))
        .await;
    drain(&env.worker(&started, |_| {})).await;
    let report = env.report(&started).await;
    assert_eq!(report["status"], "passed", "{report:#}");
    let output = report["steps"][0]["output"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!output.contains(&started.environment_key), "{output}");
}

#[tokio::test]
async fn a_terminated_session_is_stopped_without_running_tools() {
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&json!({"name": "t", "steps": [{"terminate": true}]}))
        .await;
    // Wait for the termination before claiming.
    loop {
        let s = env
            .server
            .agents(
                Method::GET,
                &format!("/v1/sessions/{}", started.session_id),
                None,
            )
            .await
            .ok();
        if s["status"] == "terminated" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let items = drain(&env.worker(&started, |_| {})).await;
    if let Some(item) = items.first() {
        assert_eq!(item.outcome, ItemOutcome::AlreadyTerminated);
        assert!(item.stopped);
    }
    let _ = WorkState::Stopped;
}

#[tokio::test]
async fn the_sessions_skills_are_in_the_workdir_while_it_runs_and_gone_after() {
    let env = Env::new().await;
    let skill_id = upload_skill(&env).await;
    let started = env
        .server
        .start_scenario(&json!({
            "name": "skills",
            "agent": {"skills": [
                {"type": "custom", "skill_id": skill_id, "version": "latest"},
                {"type": "custom", "skill_id": "skill_missing", "version": "latest"}
            ]},
            "steps": [
                {"tool": "bash", "input": {"command": "./skills/report-writer/scripts/run.sh"}, "expect": {"contains": "skill ran"}},
                {"tool": "read", "input": {"file_path": "skills/report-writer/SKILL.md"}, "expect": {"contains": "Write reports."}}
            ]
        }))
        .await;
    let logs = Logs::capture();
    let items = drain(&env.worker(&started, |_| {})).await;
    assert_eq!(items[0].outcome, ItemOutcome::Served(RunEnd::Idle));
    let report = env.report(&started).await;
    assert_eq!(report["status"], "passed", "{report:#}");
    assert!(
        !env.work.path().join("skills/report-writer").exists(),
        "removed after the item"
    );
    assert!(
        logs.text().contains("failed to download skill"),
        "a missing skill is only logged"
    );
}

// ---------------------------------------------------------------------------
// What the worker sends, as the devserver receives it.
// ---------------------------------------------------------------------------

/// One request the worker made, as the devserver received it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: http::HeaderMap,
    /// When the request arrived, and when its answer left (`None`: the
    /// client gave up on it first).
    start: Instant,
    end: Option<Instant>,
    /// What the recorder's probe saw on the worker's host as the request arrived.
    probe: Option<Value>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Looks at the worker's host when a request arrives: `(method, path)` → what it saw.
type Probe = Arc<dyn Fn(&str, &str) -> Option<Value> + Send + Sync>;

/// The devserver's own application, sharing the test server's state, on a
/// second port: every request the worker sends there is recorded (arrival,
/// answer, headers) before the devserver handles it. Point the worker's
/// `base_url` at [`Recorder::url`].
struct Recorder {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Recorder {
    async fn start(server: &TestServer, probe: Option<Probe>) -> Recorder {
        let seen = Arc::new(Mutex::new(Vec::<Seen>::new()));
        let log = seen.clone();
        let app = envworker::devserver::app(server.running.state().clone()).layer(
            axum::middleware::from_fn(
                move |request: axum::extract::Request, next: axum::middleware::Next| {
                    let (log, probe) = (log.clone(), probe.clone());
                    async move {
                        let method = request.method().to_string();
                        let path = request.uri().path().to_string();
                        let probed = probe.as_ref().and_then(|p| p(&method, &path));
                        let index = {
                            let mut log = log.lock().unwrap();
                            log.push(Seen {
                                method,
                                path,
                                headers: request.headers().clone(),
                                start: Instant::now(),
                                end: None,
                                probe: probed,
                            });
                            log.len() - 1
                        };
                        let response = next.run(request).await;
                        log.lock().unwrap()[index].end = Some(Instant::now());
                        response
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Recorder { url, seen, task }
    }

    /// Every recorded request with this method whose path matches the glob.
    fn matching(&self, method: &str, path_glob: &str) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| {
                s.method == method && envworker::devserver::faults::glob(path_glob, &s.path)
            })
            .cloned()
            .collect()
    }

    fn all(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Wait until the session holds at least `n` tool results.
async fn wait_for_results(env: &Env, started: &Started, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let results = env
            .events(started)
            .await
            .iter()
            .filter(|e| e["type"] == "user.tool_result")
            .count();
        if results >= n {
            return;
        }
        assert!(Instant::now() < deadline, "no {n} tool results yet");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The server's memories of the scenario's (only) store: path → content.
async fn server_memories(
    env: &Env,
    started: &Started,
) -> std::collections::BTreeMap<String, String> {
    env.server.session_memories(&started.session_id).await
}

/// Upload the `report-writer` skill; returns its id.
async fn upload_skill(env: &Env) -> String {
    env.server
        .dev(
            Method::POST,
            "/dev/skills",
            Some(json!({"name": "report-writer", "files": {
                "SKILL.md": "---\nname: report-writer\n---\nWrite reports.\n",
                "scripts/run.sh": {"content": "#!/bin/sh\necho skill ran\n", "executable": true}
            }})),
        )
        .await
        .ok()["skill_id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Whether the process is alive (a zombie is not).
fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) S …`: the state follows the last `)`.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[tokio::test]
async fn the_worker_flushes_after_a_clean_final_sync_that_failed() {
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&notes_scenario(json!([
            {"tool": "write", "input": {"file_path": "{mount:notes}/b.md", "content": "beta\n"}},
            {"wait_ms": 1500}
        ])))
        .await;
    let logs = Logs::capture();
    let worker = env.worker(&started, |o| {
        // The teardown path is what is tested: no change-driven push ahead of it.
        o.memory_push = false;
        o.memory_sync_interval = SyncInterval::every(Duration::from_secs(3600)).unwrap()
    });
    let drained = tokio::spawn(async move { drain(&worker).await });
    // The download is done and the file written: the next listing is the final sync's.
    // It fails on its first attempt and on both retries.
    wait_for_results(&env, &started, 1).await;
    env.fault(
        json!({"method": "GET", "path": "/v1/memory_stores/*/memories", "status": 500, "times": 3}),
    )
    .await;
    let items = tokio::time::timeout(Duration::from_secs(60), drained)
        .await
        .expect("the item ends")
        .unwrap();
    let item = &items[0];
    assert_eq!(
        item.outcome,
        ItemOutcome::Served(RunEnd::Idle),
        "a clean end"
    );
    let final_sync = item
        .teardown
        .final_sync
        .expect("the final sync ran to its end");
    assert_eq!(final_sync.uploads, 0, "the final sync failed: {item:?}");
    assert!(!item.teardown.final_sync_cut_off);
    assert_eq!(logs.count("memory sync failed"), 1, "{}", logs.text());
    assert_eq!(
        item.teardown.flushed, 1,
        "the flush uploaded what the sync could not"
    );
    assert_eq!(
        server_memories(&env, &started)
            .await
            .get("/b.md")
            .map(String::as_str),
        Some("beta\n")
    );
    assert!(item.stopped);
}

#[tokio::test]
async fn the_worker_flushes_and_disposes_even_when_skill_teardown_throws() {
    // Root removes anything, so the agent's lock on the skill folder only
    // holds for an ordinary user: run this as `nobody`.
    if !crate::common::runs_as_nobody(
        "the_worker_flushes_and_disposes_even_when_skill_teardown_throws",
    ) {
        return;
    }
    let env = Env::new().await;
    let skill_id = upload_skill(&env).await;
    let started = env
        .server
        .start_scenario(&json!({
            "name": "locked-skill",
            "agent": {"skills": [{"type": "custom", "skill_id": skill_id, "version": "latest"}]},
            "memory_stores": [{"key": "notes", "name": "Notes", "access": "read_write",
                               "memories": {"/a.md": "alpha\n"}}],
            "steps": [
                {"tool": "bash", "input": {"command": "chmod 555 skills/report-writer && echo locked"},
                 "expect": {"contains": "locked"}},
                {"tool": "write", "input": {"file_path": "{mount:notes}/b.md", "content": "beta\n"}}
            ]
        }))
        .await;
    let logs = Logs::capture();
    let items = drain(&env.worker(&started, |_| {})).await;
    let item = &items[0];
    assert_eq!(item.outcome, ItemOutcome::Served(RunEnd::Idle));
    assert_eq!(logs.count("skill cleanup failed"), 1, "{}", logs.text());
    // As the reference: the skill the agent locked stays in the workdir
    // (only a fresh directory per item would take it along).
    assert!(env.work.path().join("skills/report-writer").exists());
    assert!(item.teardown.final_sync.is_some(), "{item:?}");
    assert_eq!(
        env.report(&started).await["final_contents"]["notes"]["/b.md"],
        "beta\n",
        "the memory teardown still ran"
    );
    assert!(
        !env.mount_root().join("notes").exists(),
        "dispose still ran"
    );
    assert!(item.stopped, "the item was still force-stopped");
}

#[tokio::test]
async fn the_workers_final_sync_is_bounded_and_the_flush_still_runs() {
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&notes_scenario(json!([
            {"tool": "write", "input": {"file_path": "{mount:notes}/b.md", "content": "beta\n"}},
            {"wait_ms": 1500}
        ])))
        .await;
    let logs = Logs::capture();
    let worker = env.worker(&started, |o| {
        // The teardown path is what is tested: no change-driven push ahead of it.
        o.memory_push = false;
        o.memory_sync_interval = SyncInterval::every(Duration::from_secs(3600)).unwrap();
        o.memory_teardown_bound = Duration::from_secs(1);
    });
    let drained = tokio::spawn(async move { drain(&worker).await });
    wait_for_results(&env, &started, 1).await;
    // The final sync's listing hangs past the bound; the flush's answers at once.
    env.fault(json!({"method": "GET", "path": "/v1/memory_stores/*/memories", "latency_ms": 5000, "times": 1}))
        .await;
    let began = Instant::now();
    let items = tokio::time::timeout(Duration::from_secs(60), drained)
        .await
        .expect("the item ends")
        .unwrap();
    let item = &items[0];
    assert_eq!(item.outcome, ItemOutcome::Served(RunEnd::Idle));
    assert!(item.teardown.final_sync_cut_off, "{item:?}");
    assert_eq!(item.teardown.final_sync, None);
    assert!(!item.teardown.flush_cut_off, "{item:?}");
    assert_eq!(item.teardown.flushed, 1, "the flush uploaded the file");
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "the teardown did not wait out the hanging listing: {:?}",
        began.elapsed()
    );
    assert_eq!(
        logs.count(
            "final memory sync cut off after 1s; the flush that follows still uploads changed files"
        ),
        1,
        "{}",
        logs.text()
    );
    assert_eq!(
        server_memories(&env, &started)
            .await
            .get("/b.md")
            .map(String::as_str),
        Some("beta\n")
    );
    assert!(item.stopped);
}

#[tokio::test]
async fn the_worker_logs_what_a_cut_off_flush_left_behind() {
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&notes_scenario(json!([
            {"tool": "write", "input": {"file_path": "{mount:notes}/b.md", "content": "beta\n"}},
            {"tool": "write", "input": {"file_path": "{mount:notes}/c.md", "content": "gamma\n"}},
            {"wait_ms": 60000}
        ])))
        .await;
    let work = env.claim(&started).await;
    let worker = env.worker(&started, |o| {
        o.memory_sync_interval = SyncInterval::every(Duration::from_secs(3600)).unwrap();
        o.memory_teardown_bound = Duration::from_secs(1);
    });
    let logs = Logs::capture();
    let cancel = CancellationToken::new();
    let handle = tokio::spawn({
        let (worker, cancel) = (worker.clone(), cancel.clone());
        async move { worker.handle_item(WorkItem::from(work), cancel, None).await }
    });
    wait_for_results(&env, &started, 2).await;
    // An unclean end (shutdown): no final sync, only the flush of both files.
    // The first upload hangs past the bound, the second lands.
    env.fault(json!({"method": "POST", "path": "/v1/memory_stores/*/memories", "latency_ms": 10000, "times": 1}))
        .await;
    cancel.cancel();
    let report = tokio::time::timeout(Duration::from_secs(30), handle)
        .await
        .expect("the item ends")
        .unwrap();
    assert_eq!(report.outcome, ItemOutcome::Served(RunEnd::Cancelled));
    assert!(report.teardown.flush_cut_off, "{report:?}");
    let store = store_id(&env, &started).await;
    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("1 of 2 changed files had not finished uploading"))
        .unwrap_or_else(|| panic!("no cut-off line:\n{text}"));
    for field in [
        format!("work_id={}", report.work_id),
        format!("session_id={}", started.session_id),
        format!("memory_store.id={store}"),
    ] {
        assert!(line.contains(&field), "{field} missing from: {line}");
    }
    // Exactly one of the two reached the server.
    let memories = server_memories(&env, &started).await;
    assert_eq!(
        ["/b.md", "/c.md"]
            .iter()
            .filter(|p| memories.contains_key(**p))
            .count(),
        1,
        "{memories:?}"
    );
    // Shut down mid-turn: handed back for another worker, not stopped.
    assert!(!report.stopped);
    assert_eq!(report.lease, Some(LeaseEnd::HandedBack));
}

#[tokio::test]
async fn the_last_sync_runs_after_the_skill_teardown_and_after_the_tools_are_closed() {
    // The shell's close kills its process group (no hook of the agent's runs
    // at close), so the order is checked where it shows: when the final
    // sync's listing reaches the server, the agent's background job must be
    // dead and the skills gone; and the file written by the last call is
    // uploaded by that sync.
    let env = Env::new().await;
    let skill_id = upload_skill(&env).await;
    let pid_file = env.work.path().join("bg.pid");
    let work = env.work.path().to_path_buf();
    let probe: Probe = {
        let (pid_file, work) = (pid_file.clone(), work.clone());
        Arc::new(move |method: &str, path: &str| {
            if method != "GET"
                || !envworker::devserver::faults::glob("/v1/memory_stores/*/memories", path)
            {
                return None;
            }
            Some(json!({
                "job_alive": read_pid(&pid_file).map(process_alive),
                // In the workdir, `<work>/skills/`.
                "skills_present": work.join("skills/report-writer").exists(),
            }))
        })
    };
    let recorder = Recorder::start(&env.server, Some(probe)).await;
    let started = env
        .server
        .start_scenario(&json!({
            "name": "order",
            "agent": {"skills": [{"type": "custom", "skill_id": skill_id, "version": "latest"}]},
            "memory_stores": [{"key": "notes", "name": "Notes", "access": "read_write",
                               "memories": {"/a.md": "alpha\n"}}],
            "steps": [
                {"tool": "bash", "input": {"command": "sleep 300 >/dev/null 2>&1 & echo $! > bg.pid; echo started"},
                 "expect": {"contains": "started"}},
                {"tool": "write", "input": {"file_path": "{mount:notes}/last.md", "content": "written by the last call\n"}}
            ]
        }))
        .await;
    let items = drain(&env.worker(&started, |o| {
        // The teardown path is what is tested: no change-driven push ahead of it.
        o.memory_push = false;
        o.base_url = recorder.url.clone();
        // No sync on cadence: every listing after the job started is the teardown's.
        o.memory_sync_interval = SyncInterval::every(Duration::from_secs(3600)).unwrap();
    }))
    .await;
    let pid = read_pid(&pid_file).expect("the job started");
    let alive_after = process_alive(pid);
    if alive_after {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid as i32).unwrap(),
            rustix::process::Signal::KILL,
        );
    }
    let item = &items[0];
    assert_eq!(item.outcome, ItemOutcome::Served(RunEnd::Idle));
    assert!(!alive_after, "closing the tools killed the agent's job");
    let teardown_listings: Vec<Value> = recorder
        .matching("GET", "/v1/memory_stores/*/memories")
        .into_iter()
        .filter_map(|s| s.probe)
        .filter(|p| !p["job_alive"].is_null())
        .collect();
    assert!(
        !teardown_listings.is_empty(),
        "the final sync listed the store"
    );
    for seen in &teardown_listings {
        assert_eq!(
            seen["job_alive"], false,
            "the tools were closed before the final sync: {teardown_listings:?}"
        );
        assert_eq!(
            seen["skills_present"], false,
            "the skills were removed before the final sync: {teardown_listings:?}"
        );
    }
    let final_sync = item.teardown.final_sync.expect("the final sync ran");
    assert_eq!(final_sync.uploads, 1, "{item:?}");
    assert_eq!(item.teardown.flushed, 0);
    assert_eq!(
        server_memories(&env, &started)
            .await
            .get("/last.md")
            .map(String::as_str),
        Some("written by the last call\n")
    );
}

#[tokio::test]
async fn the_lease_is_heartbeated_until_the_memory_teardown_is_done() {
    let env = Env::with_ttl(2).await; // a beat every second
    let recorder = Recorder::start(&env.server, None).await;
    let started = env
        .server
        .start_scenario(&notes_scenario(json!([
            {"tool": "write", "input": {"file_path": "{mount:notes}/b.md", "content": "beta\n"}}
        ])))
        .await;
    // Every upload takes 3 s: the final sync outlasts several heartbeat intervals.
    env.fault(
        json!({"method": "POST", "path": "/v1/memory_stores/*/memories", "latency_ms": 3000}),
    )
    .await;
    let items = drain(&env.worker(&started, |o| {
        // The teardown path is what is tested: no change-driven push ahead of it.
        o.memory_push = false;
        o.base_url = recorder.url.clone();
        o.memory_sync_interval = SyncInterval::every(Duration::from_secs(3600)).unwrap();
    }))
    .await;
    let item = &items[0];
    assert_eq!(item.outcome, ItemOutcome::Served(RunEnd::Idle));
    assert_eq!(item.lease, Some(LeaseEnd::Released), "the lease held");
    assert!(item.stopped);
    let uploads = recorder.matching("POST", "/v1/memory_stores/*/memories");
    assert_eq!(uploads.len(), 1, "{uploads:?}");
    let upload = &uploads[0];
    let upload_end = upload.end.expect("the upload was answered");
    let stops = recorder.matching("POST", "/v1/environments/*/work/*/stop");
    assert_eq!(stops.len(), 1);
    let stop = &stops[0];
    let beats = recorder.matching("POST", "/v1/environments/*/work/*/heartbeat");
    let during = beats
        .iter()
        .filter(|b| b.start > upload.start && b.start < upload_end)
        .count();
    assert!(
        during >= 2,
        "the lease was heartbeated while the teardown uploaded ({during} beats)"
    );
    assert!(upload_end <= stop.start, "the stop came after the teardown");
    assert!(
        beats.iter().all(|b| b.start < stop.start),
        "no heartbeat after the stop"
    );
    assert_eq!(
        env.report(&started).await["final_contents"]["notes"]["/b.md"],
        "beta\n"
    );
}

#[tokio::test]
async fn a_memory_sync_interval_under_the_minimum_is_refused_at_construction() {
    let floor = "memory sync interval must be at least 5s";
    for too_short in [
        Duration::ZERO,
        Duration::from_millis(4999),
        Duration::from_secs(4),
    ] {
        let err = SyncInterval::every(too_short).unwrap_err();
        assert!(err.to_string().contains(floor), "{err}");
    }
    for secs in [0.0, 4.999, -1.0, f64::NAN, f64::NEG_INFINITY] {
        let err = SyncInterval::from_secs_f64(secs).unwrap_err();
        assert!(err.to_string().contains(floor), "{secs}: {err}");
    }
    for text in ["4s", "0", "4999ms"] {
        assert!(text.parse::<SyncInterval>().is_err(), "{text}");
    }
    assert!(SyncInterval::every(Duration::from_secs(5)).is_ok());

    // The worker refuses one built around the constructors, too.
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&json!({"name": "x", "steps": []}))
        .await;
    for too_short in [
        Duration::ZERO,
        Duration::from_millis(4999),
        Duration::from_secs(4),
    ] {
        // The interval is a type with no way around its floor: the options
        // a worker is built from cannot hold a shorter one.
        match SyncInterval::every(too_short) {
            Ok(_) => panic!("a {too_short:?} sync interval was built"),
            Err(e) => assert!(e.to_string().contains(floor), "{e}"),
        }
    }
    let mut options = env.options(&started);
    options.memory_sync_interval = SyncInterval::every(Duration::from_secs(5)).unwrap();
    assert!(EnvironmentWorker::new(options).is_ok(), "5 s is allowed");
}

#[tokio::test]
async fn forwards_custom_headers_to_poll_ack_heartbeat_stop_and_the_session_calls() {
    let env = Env::new().await;
    let recorder = Recorder::start(&env.server, None).await;
    let skill_id = upload_skill(&env).await;
    let started = env
        .server
        .start_scenario(&json!({
            "name": "headers",
            "agent": {"skills": [{"type": "custom", "skill_id": skill_id, "version": "latest"}]},
            "memory_stores": [{"key": "notes", "name": "Notes", "access": "read_write",
                               "memories": {"/a.md": "alpha\n"}}],
            "steps": [
                {"tool": "write", "input": {"file_path": "{mount:notes}/b.md", "content": "beta\n"}}
            ]
        }))
        .await;
    let items = drain(&env.worker(&started, |o| {
        o.base_url = recorder.url.clone();
        o.extra_headers = vec![
            ("x-trace-id".into(), "trace-123".into()),
            // The worker's own credential wins over these.
            ("authorization".into(), "Bearer not-the-key".into()),
            ("x-api-key".into(), "not-the-key".into()),
        ];
    }))
    .await;
    assert_eq!(items[0].outcome, ItemOutcome::Served(RunEnd::Idle));
    assert!(items[0].stopped);
    let report = env.report(&started).await;
    assert_eq!(report["status"], "passed", "{report:#}");

    let env_key = format!("Bearer {}", started.environment_key);
    let all = recorder.all();
    for seen in &all {
        assert_eq!(
            seen.header("x-trace-id"),
            Some("trace-123"),
            "{} {}",
            seen.method,
            seen.path
        );
        assert_eq!(
            seen.header("x-api-key"),
            None,
            "{} {}",
            seen.method,
            seen.path
        );
        assert_ne!(
            seen.header("authorization"),
            Some("Bearer not-the-key"),
            "{} {}",
            seen.method,
            seen.path
        );
    }
    let sid = &started.session_id;
    // (what, method, path glob, helper tag, polled with the environment key)
    let calls = [
        (
            "poll",
            "GET",
            "/v1/environments/*/work/poll",
            "environments-work-poller",
            true,
        ),
        (
            "ack",
            "POST",
            "/v1/environments/*/work/*/ack",
            "environments-work-poller",
            true,
        ),
        (
            "heartbeat",
            "POST",
            "/v1/environments/*/work/*/heartbeat",
            "environments-worker",
            false,
        ),
        (
            "stop",
            "POST",
            "/v1/environments/*/work/*/stop",
            "environments-worker",
            false,
        ),
        (
            "session",
            "GET",
            &format!("/v1/sessions/{sid}"),
            "environments-worker",
            false,
        ),
        (
            "stream",
            "GET",
            &format!("/v1/sessions/{sid}/events/stream"),
            "session-tool-runner",
            false,
        ),
        (
            "history",
            "GET",
            &format!("/v1/sessions/{sid}/events"),
            "session-tool-runner",
            false,
        ),
        (
            "result",
            "POST",
            &format!("/v1/sessions/{sid}/events"),
            "session-tool-runner",
            false,
        ),
        ("skill", "GET", "/v1/skills/*", "environments-worker", false),
        (
            "memory",
            "GET",
            "/v1/memory_stores/*/memories",
            "environments-worker",
            false,
        ),
        (
            "upload",
            "POST",
            "/v1/memory_stores/*/memories",
            "environments-worker",
            false,
        ),
    ];
    let mut item_auth = None;
    for (what, method, glob, helper, with_env_key) in calls {
        let seen = recorder.matching(method, glob);
        assert!(!seen.is_empty(), "no {what} request: {all:#?}");
        for s in &seen {
            assert_eq!(s.header("x-stainless-helper"), Some(helper), "{what}");
            let auth = s.header("authorization").unwrap_or_default().to_string();
            if with_env_key {
                assert_eq!(auth, env_key, "{what} uses the environment key");
            } else {
                assert!(
                    auth.starts_with("Bearer ") && auth != env_key,
                    "{what} uses the item's token"
                );
                assert_eq!(item_auth.get_or_insert(auth.clone()), &auth, "{what}");
            }
        }
    }
    assert!(
        recorder
            .matching("GET", "/v1/environments/*/work/poll")
            .iter()
            .all(|s| s.header("anthropic-worker-id") == Some("test-worker"))
    );
}

#[tokio::test]
async fn the_lease_ttl_bounds_how_long_a_failing_tool_result_send_is_retried() {
    // Every result post hangs 1.2 s, then fails with a 503. The runner keeps
    // retrying (1 s, 2 s, 4 s … jittered) for the send window, which the
    // heartbeat sets to the lease TTL: with 2 s the window closes after the
    // second attempt; with 10 s it allows four or five. Then the call waits
    // for the next reconcile (none comes: the stream stays up). With 2 s the
    // bound (two TTLs) ends the item; with 10 s the session moves on first:
    // the scenario's step times out at 15 s and ends the turn, and the item
    // ends idle. Either way it does not hold its slot.
    for (ttl, least, step_timeout_ms) in [(2, 2, 30000), (10, 4, 15000)] {
        let env = Env::with_ttl(ttl).await;
        let recorder = Recorder::start(&env.server, None).await;
        env.fault(json!({"method": "POST", "path": "/v1/sessions/*/events", "latency_ms": 1200, "status": 503}))
            .await;
        let started = env
            .server
            .start_scenario(&json!({"name": "unsent", "steps": [
                // Long enough for the first heartbeat to set the window.
                {"tool": "bash", "input": {"command": "sleep 1; echo done"}, "timeout_ms": step_timeout_ms}
            ]}))
            .await;
        let logs = Logs::capture();
        let items = drain(&env.worker(&started, |o| o.base_url = recorder.url.clone())).await;
        match (ttl, &items[0].outcome) {
            (2, ItemOutcome::Served(RunEnd::Undelivered { error, .. })) => {
                assert!(error.contains("503"), "{error}")
            }
            (10, ItemOutcome::Served(RunEnd::Idle)) => {}
            (_, other) => panic!("TTL {ttl}s: unexpected end {other:?}"),
        }
        assert!(items[0].stopped);
        let posts = recorder.matching(
            "POST",
            &format!("/v1/sessions/{}/events", started.session_id),
        );
        assert!(posts.len() >= least, "TTL {ttl}s: {posts:#?}");
        if ttl == 2 {
            assert_eq!(posts.len(), 2, "{posts:#?}");
        }
        // The last wait is cut to what is left of the window, so the last
        // attempt starts at its edge at the latest.
        let last = posts.last().unwrap().start - posts[0].start;
        assert!(
            last < Duration::from_secs(ttl as u64) + Duration::from_millis(500),
            "TTL {ttl}s: an attempt started after the window: {last:?}"
        );
        assert_eq!(
            logs.count("failed to send tool result"),
            1,
            "{}",
            logs.text()
        );
        drop(logs);
    }
}

#[tokio::test]
async fn the_heartbeat_starts_before_the_skill_download() {
    let env = Env::new().await;
    let recorder = Recorder::start(&env.server, None).await;
    let skill_id = upload_skill(&env).await;
    // Each skill request (the version, then the archive) takes 2 s.
    env.fault(json!({"method": "GET", "path": "/v1/skills/*", "latency_ms": 2000}))
        .await;
    let started = env
        .server
        .start_scenario(&json!({
            "name": "slow-skill",
            "agent": {"skills": [{"type": "custom", "skill_id": skill_id, "version": "latest"}]},
            "steps": [
                {"tool": "bash", "input": {"command": "./skills/report-writer/scripts/run.sh"}, "expect": {"contains": "skill ran"}}
            ]
        }))
        .await;
    let items = drain(&env.worker(&started, |o| o.base_url = recorder.url.clone())).await;
    assert_eq!(items[0].outcome, ItemOutcome::Served(RunEnd::Idle));
    assert_eq!(env.report(&started).await["status"], "passed");
    let skills = recorder.matching("GET", "/v1/skills/*");
    let first_skill_answered = skills
        .iter()
        .filter_map(|s| s.end)
        .min()
        .expect("the skill was downloaded");
    let first_beat = recorder
        .matching("POST", "/v1/environments/*/work/*/heartbeat")
        .first()
        .and_then(|b| b.end)
        .expect("a heartbeat was answered");
    assert!(
        first_beat < first_skill_answered,
        "the first heartbeat was answered {:?} after the skill download's first answer",
        first_beat - first_skill_answered
    );
}

#[tokio::test]
async fn a_periodic_sync_is_bounded_so_a_slow_memory_api_does_not_hold_the_next_call() {
    let env = Env::new().await;
    let started = env
        .server
        .start_scenario(&notes_scenario(json!([
            {"tool": "write", "input": {"file_path": "{mount:notes}/b.md", "content": "beta\n"}},
            {"wait_ms": 5200},
            {"tool": "bash", "input": {"command": "true"}},
            {"tool": "bash", "input": {"command": "echo next"}, "expect": {"contains": "next"}}
        ])))
        .await;
    let logs = Logs::capture();
    let worker = env.worker(&started, |o| {
        o.memory_sync_interval = SyncInterval::every(Duration::from_secs(5)).unwrap();
        o.memory_sync_bound = Duration::from_secs(1);
        o.memory_teardown_bound = Duration::from_secs(1);
    });
    let drained = tokio::spawn(async move { drain(&worker).await });
    wait_for_results(&env, &started, 1).await;
    // The periodic sync after the second call finds its first read (the
    // version feed, or a listing) hanging 5 s.
    env.fault(json!({"method": "GET", "path": "/v1/memory_stores/*/memor*", "latency_ms": 5000, "times": 1}))
        .await;
    let items = tokio::time::timeout(Duration::from_secs(60), drained)
        .await
        .expect("the item ends")
        .unwrap();
    let report = env
        .server
        .final_report(&started.session_id, Duration::from_secs(30))
        .await;
    assert_eq!(report["status"], "passed", "{report:#}");
    // The call after the cut-off sync was answered without waiting out the listing.
    let next = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|s| s["latency_ms"].is_number())
        .unwrap();
    let latency = next["latency_ms"].as_f64().unwrap();
    assert!(
        latency < 3000.0,
        "the next call waited {latency} ms: {report:#}"
    );
    assert_eq!(
        logs.count("memory sync cut off after 1s; the next sync picks up where it stopped"),
        1,
        "{}",
        logs.text()
    );
    // Nothing was lost: the final sync (or the flush) still saved the file.
    assert!(items[0].stopped);
    assert_eq!(
        server_memories(&env, &started)
            .await
            .get("/b.md")
            .map(String::as_str),
        Some("beta\n")
    );
}

/// A drain serving fewer items than it may (`max_concurrent_items` 2, one
/// running) claims a newly queued item as soon as it is woken by a
/// delivery, not when the running session ends.
#[tokio::test]
async fn a_drain_with_a_free_slot_claims_new_work_when_woken() {
    let env = Env::new().await;
    let long = env
        .server
        .start_scenario(&json!({"name": "long", "steps": [
            {"tool": "bash", "input": {"command": "true"}},
            {"wait_ms": 6000},
            {"tool": "bash", "input": {"command": "true"}}
        ]}))
        .await;
    let worker = env.worker(&long, |_| {});
    let wake = Arc::new(tokio::sync::Notify::new());
    let options = DrainOptions {
        max_concurrent_items: 2,
        wake: Some(wake.clone()),
        ..Default::default()
    };
    let began = Instant::now();
    let drained = tokio::spawn(async move {
        worker
            .drain(CancellationToken::new(), options)
            .await
            .unwrap()
    });
    wait_for_results(&env, &long, 1).await;
    let short = env
        .server
        .start_scenario(&json!({"name": "short", "environment_id": long.environment_id,
            "steps": [{"tool": "bash", "input": {"command": "echo second"}, "expect": {"contains": "second"}}]}))
        .await;
    wake.notify_one();
    let report = env
        .server
        .final_report(&short.session_id, Duration::from_secs(30))
        .await;
    assert_eq!(report["status"], "passed", "{report:#}");
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "the second item waited for the first: {:?}",
        began.elapsed()
    );
    let items = tokio::time::timeout(Duration::from_secs(60), drained)
        .await
        .expect("the drain ends")
        .unwrap()
        .items;
    assert_eq!(items.len(), 2, "{items:?}");
}

// ---------------------------------------------------------------------------
// Where the agent works (issue 24 item 1): the workdir itself by default, as
// the reference; a fresh directory per item when asked, or when items run
// side by side.
// ---------------------------------------------------------------------------

/// A session of `steps` in the environment of `first` (a fresh one when `None`).
async fn start_in(env: &Env, first: Option<&Started>, steps: Value) -> Started {
    let mut doc = json!({"name": "workdir", "steps": steps});
    if let Some(first) = first {
        doc["environment_id"] = json!(first.environment_id);
    }
    env.server.start_scenario(&doc).await
}

fn passed(report: &Value) {
    assert_eq!(report["status"], "passed", "{report:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn by_default_the_agent_works_in_the_workdir_and_the_next_session_finds_what_it_left() {
    let env = Env::new().await;
    std::fs::write(
        env.work.path().join("project.txt"),
        "the operator's project\n",
    )
    .unwrap();
    let first = start_in(
        &env,
        None,
        json!([
            {"tool": "read", "input": {"file_path": "project.txt"},
             "expect": {"is_error": false, "contains": "operator's project"}},
            {"tool": "bash", "input": {"command": "pwd"},
             "expect": {"is_error": false, "contains": env.work.path().to_str().unwrap()}},
            {"tool": "write", "input": {"file_path": "left.txt", "content": "from the first session\n"}}
        ]),
    )
    .await;
    let items = drain(&env.worker(&first, |_| {})).await;
    assert_eq!(items.len(), 1);
    passed(&env.report(&first).await);
    let second = start_in(
        &env,
        Some(&first),
        json!([
            {"tool": "read", "input": {"file_path": "left.txt"},
             "expect": {"is_error": false, "contains": "from the first session"}}
        ]),
    )
    .await;
    drain(&env.worker(&first, |_| {})).await;
    passed(&env.report(&second).await);
    let names: Vec<String> = std::fs::read_dir(env.work.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("session-") || n.starts_with("trash-")),
        "no directory of the worker's own in the workdir: {names:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn with_fresh_workdir_each_item_starts_empty_and_its_directory_goes_with_it() {
    let env = Env::new().await;
    std::fs::write(
        env.work.path().join("project.txt"),
        "the operator's project\n",
    )
    .unwrap();
    let started = start_in(
        &env,
        None,
        json!([
            {"tool": "read", "input": {"file_path": "project.txt"},
             "expect": {"is_error": true, "contains": "no such file"}},
            {"tool": "bash", "input": {"command": "pwd; ls -A | wc -l"},
             "expect": {"is_error": false, "contains": ["/session-", "\n0"]}},
            {"tool": "write", "input": {"file_path": "left.txt", "content": "gone with the item\n"}}
        ]),
    )
    .await;
    drain(&env.worker(&started, |o| o.fresh_workdir = true)).await;
    passed(&env.report(&started).await);
    // The directory is renamed away at once and removed in the background.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let names: Vec<String> = std::fs::read_dir(env.work.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        if names == ["project.txt"] {
            break;
        }
        assert!(Instant::now() < deadline, "left in the workdir: {names:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_drain_serving_items_side_by_side_gives_each_its_own_fresh_directory() {
    let env = Env::new().await;
    // Each session holds its slot until the other has started too, so they
    // overlap, and writes the same name: in one shared directory the second
    // write would find the first one's file.
    let steps = |tag: &str| {
        json!([
            {"tool": "bash", "input": {"command": format!(
                "pwd; test ! -e mine.txt && echo {tag} > mine.txt && sleep 2 && cat mine.txt")},
             "expect": {"is_error": false, "contains": ["/session-", tag]}}
        ])
    };
    let a = start_in(&env, None, steps("first")).await;
    let b = start_in(&env, Some(&a), steps("second")).await;
    let worker = env.worker(&a, |_| {});
    let report = tokio::time::timeout(
        Duration::from_secs(90),
        worker.drain(
            CancellationToken::new(),
            DrainOptions {
                max_concurrent_items: 2,
                ..Default::default()
            },
        ),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(report.items.len(), 2);
    passed(&env.report(&a).await);
    passed(&env.report(&b).await);
}

/// Spawn a drain of `started`'s environment, so the test can act while the
/// item runs.
fn spawn_drain(env: &Env, started: &Started) -> tokio::task::JoinHandle<Vec<ItemReport>> {
    let worker = env.worker(started, |_| {});
    tokio::spawn(async move { drain(&worker).await })
}

/// Wait until `logs` has a line holding `needle`; when it was seen.
async fn until_logged(logs: &Logs, needle: &str, within: Duration) -> Instant {
    let began = Instant::now();
    while logs.count(needle) == 0 {
        assert!(
            began.elapsed() < within,
            "no {needle:?} within {within:?}:\n{}",
            logs.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Instant::now()
}

/// Issue 24 item 7: a result the worker could not post within the send
/// window (the lease TTL) does not end the item. The next reconcile, after
/// the event stream reconnects, answers the call with the result computed
/// the first time, and the session goes on to its next call.
#[tokio::test]
async fn a_result_that_could_not_be_posted_is_answered_at_the_next_reconcile_and_the_item_goes_on()
{
    let logs = Logs::capture();
    // A 3 s TTL: the post gives up 3 s after the result, the bound is 6 s more.
    let env = Env::with_ttl(3).await;
    env.server
        .add_faults(vec![
            // The first stream is closed 6 s after it opens: after the give-up.
            json!({"method": "GET", "path": "/v1/sessions/*/events/stream", "cut_after_ms": 6000, "times": 1}),
            json!({"method": "POST", "path": "/v1/sessions/*/events", "status": 503}),
        ])
        .await;
    let started = env
        .server
        .start_scenario(&json!({"name": "answered-again", "steps": [
            // Long enough for the first heartbeat to set the window.
            {"tool": "bash", "input": {"command": "sleep 1; echo ran >> runs.txt; wc -l < runs.txt"},
             "timeout_ms": 30000, "expect": {"is_error": false, "contains": "1"}},
            {"tool": "bash", "input": {"command": "echo two"}, "expect": {"contains": "two"}}
        ]}))
        .await;
    let drained = spawn_drain(&env, &started);
    until_logged(&logs, "failed to send tool result", Duration::from_secs(15)).await;
    env.server.clear_faults().await;
    let items = drained.await.unwrap();
    passed(&env.report(&started).await);
    assert_eq!(
        items[0].outcome,
        ItemOutcome::Served(RunEnd::Idle),
        "{}",
        logs.text()
    );
    assert!(items[0].stopped);
    assert_eq!(
        (items[0].stats.executed, items[0].stats.post_failures),
        (2, 1)
    );
    assert_eq!(
        std::fs::read_to_string(env.work.path().join("runs.txt")).unwrap(),
        "ran\n",
        "the command ran once"
    );
    assert_eq!(logs.count("tool result delivered at the reconcile"), 1);
    assert_eq!(logs.count("still undeliverable"), 0, "{}", logs.text());
}

/// The bound in the worker: the send window is the lease TTL, so a call
/// whose result stays undeliverable ends the item two TTLs after its post
/// gave up — not at once — and the log says so; the item is stopped.
#[tokio::test]
async fn a_result_undeliverable_for_two_lease_ttls_ends_the_item_and_says_so() {
    let logs = Logs::capture();
    let env = Env::with_ttl(2).await;
    env.fault(json!({"method": "POST", "path": "/v1/sessions/*/events", "status": 503}))
        .await;
    let started = env
        .server
        .start_scenario(&json!({"name": "never-delivered", "steps": [
            {"tool": "bash", "input": {"command": "sleep 1; echo hi"}, "timeout_ms": 30000}
        ]}))
        .await;
    let drained = spawn_drain(&env, &started);
    let gave_up = until_logged(&logs, "failed to send tool result", Duration::from_secs(15)).await;
    let items = drained.await.unwrap();
    let waited = gave_up.elapsed();
    match &items[0].outcome {
        ItemOutcome::Served(RunEnd::Undelivered { error, .. }) => {
            assert!(error.contains("503"), "{error}")
        }
        other => panic!("expected an undelivered result, got {other:?}"),
    }
    assert!(
        waited >= Duration::from_millis(3800) && waited < Duration::from_secs(10),
        "the item ended {waited:?} after the give-up; the bound is 2 × 2 s"
    );
    assert!(items[0].stopped);
    assert_eq!(
        logs.count("failed to send tool result"),
        1,
        "{}",
        logs.text()
    );
    assert_eq!(
        logs.count("still undeliverable"),
        1,
        "the end says why: {}",
        logs.text()
    );
}

/// While a call waits for the reconcile that answers it again, losing the
/// lease still ends the item at once, as before: released, not stopped,
/// without waiting for the bound.
#[tokio::test]
async fn a_lease_lost_while_a_result_waits_for_the_reconcile_ends_the_item_at_once() {
    let logs = Logs::capture();
    let env = Env::with_ttl(2).await;
    env.fault(json!({"method": "POST", "path": "/v1/sessions/*/events", "status": 503}))
        .await;
    let started = env
        .server
        .start_scenario(&json!({"name": "lost-while-waiting", "steps": [
            {"tool": "bash", "input": {"command": "sleep 1; echo hi"}, "timeout_ms": 30000}
        ]}))
        .await;
    let drained = spawn_drain(&env, &started);
    let gave_up = until_logged(&logs, "failed to send tool result", Duration::from_secs(15)).await;
    env.fault(json!({"path": "/v1/environments/*/work/*/heartbeat", "status": 412}))
        .await;
    let items = drained.await.unwrap();
    let waited = gave_up.elapsed();
    assert_eq!(
        items[0].outcome,
        ItemOutcome::Served(RunEnd::Cancelled),
        "{}",
        logs.text()
    );
    assert_eq!(items[0].lease, Some(LeaseEnd::Lost));
    assert!(!items[0].stopped, "released, not stopped");
    assert!(
        waited < Duration::from_secs(3),
        "the lease's loss ended the item {waited:?} after the give-up, not the bound (4 s)"
    );
    assert_eq!(logs.count("still undeliverable"), 0, "{}", logs.text());
}

/// One transient failure of the session's fetch at the item's start does
/// not fail the item: the fetch is retried as the official SDK's client
/// retries it (twice, 0.5 s doubling).
#[tokio::test(flavor = "multi_thread")]
async fn a_transient_failure_of_the_session_fetch_is_retried_not_fatal() {
    let env = Env::new().await;
    let started = start_in(
        &env,
        None,
        json!([{"tool": "bash", "input": {"command": "echo served"}, "expect": {"contains": "served"}}]),
    )
    .await;
    env.fault(json!({"method": "GET", "path": format!("/v1/sessions/{}", started.session_id), "status": 503, "times": 2}))
        .await;
    let items = drain(&env.worker(&started, |_| {})).await;
    assert_eq!(
        items[0].outcome,
        ItemOutcome::Served(RunEnd::Idle),
        "{items:?}"
    );
    passed(&env.report(&started).await);
    assert!(
        env.server.faults().await.is_empty(),
        "both failures were met"
    );
}
