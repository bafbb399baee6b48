//! The environment worker against the devserver: the SDK's worker, lease,
//! secret and memory end-to-end scenarios (`sdk-behaviour.md` §5.2–5.3),
//! each by name.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::harness::Logs;
use common::{ADMIN_KEY, Started, TestServer, scenario};
use envworker::api::types::{PollWork, Redacted, WorkState};
use envworker::api::{Client, Credential};
use envworker::devserver::DevserverConfig;
use envworker::memory::options::{DeleteMode, SyncInterval};
use envworker::session::RunEnd;
use envworker::worker::lease::LeaseEnd;
use envworker::worker::poll::DrainOptions;
use envworker::worker::{EnvironmentWorker, ItemOutcome, ItemReport, WorkItem, WorkerOptions};
use reqwest::Method;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

struct Env {
    server: TestServer,
    mnt: tempfile::TempDir,
    work: tempfile::TempDir,
}

impl Env {
    async fn new() -> Env {
        Env::with_ttl(30).await
    }

    async fn with_ttl(ttl: i64) -> Env {
        let mnt = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let server = TestServer::start_with(
            DevserverConfig::new(ADMIN_KEY)
                .mount_root(mnt.path().join("memory").to_str().unwrap())
                .lease_ttl_seconds(ttl),
        )
        .await;
        Env { server, mnt, work }
    }

    fn mount_root(&self) -> PathBuf {
        self.mnt.path().join("memory")
    }

    fn options(&self, started: &Started) -> WorkerOptions {
        let mut o = WorkerOptions::new(&started.environment_id, self.server.url());
        o.environment_key = Some(Redacted::new(started.environment_key.clone()));
        o.workdir = self.work.path().to_path_buf();
        o.max_idle = Some(Duration::from_millis(500));
        o.memory_sync_interval = SyncInterval::every(Duration::from_secs(5)).unwrap();
        o.worker_id = "test-worker".into();
        o
    }

    fn worker(
        &self,
        started: &Started,
        tweak: impl FnOnce(&mut WorkerOptions),
    ) -> EnvironmentWorker {
        let mut o = self.options(started);
        tweak(&mut o);
        EnvironmentWorker::new(o).unwrap()
    }

    /// Claim (poll + ack) the scenario's item with the environment key, as a poller would.
    async fn claim(&self, started: &Started) -> envworker::api::types::Work {
        let client = Client::builder(Credential::bearer(started.environment_key.clone()))
            .base_url(self.server.url())
            .build()
            .unwrap();
        let queue = client.work(&started.environment_id);
        let work = queue
            .poll(
                &PollWork {
                    block_ms: Some(900),
                    reclaim_older_than_ms: None,
                },
                None,
            )
            .await
            .unwrap()
            .expect("a queued item");
        queue.ack(&work.id).await.unwrap();
        work
    }

    async fn work_state(&self, started: &Started, work_id: &str) -> String {
        self.server
            .agents(
                Method::GET,
                &format!("/v1/environments/{}/work/{work_id}", started.environment_id),
                None,
            )
            .await
            .ok()["state"]
            .as_str()
            .unwrap()
            .to_string()
    }

    async fn report(&self, started: &Started) -> Value {
        self.server
            .final_report(&started.session_id, Duration::from_secs(60))
            .await
    }

    async fn events(&self, started: &Started) -> Vec<Value> {
        self.server
            .agents(
                Method::GET,
                &format!("/v1/sessions/{}/events?limit=1000", started.session_id),
                None,
            )
            .await
            .ok()["data"]
            .as_array()
            .unwrap()
            .clone()
    }

    async fn fault(&self, rule: Value) {
        self.server
            .dev(Method::POST, "/dev/faults", Some(json!({"rules": [rule]})))
            .await
            .ok();
    }
}

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
    drain(&env.worker(&started, |o| o.memory_sync_interval = SyncInterval::Off)).await;
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
    let worker = env.worker(&started, |o| o.memory_sync_interval = SyncInterval::Off);
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
    let worker = env.worker(&started, |_| {});
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
    let session = env
        .server
        .agents(
            Method::GET,
            &format!("/v1/sessions/{}", started.session_id),
            None,
        )
        .await
        .ok();
    session["resources"][0]["memory_store_id"]
        .as_str()
        .unwrap()
        .to_string()
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
        o.memory_teardown_bound = Duration::from_millis(700)
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
    let skill = env
        .server
        .dev(
            Method::POST,
            "/dev/skills",
            Some(json!({"name": "report-writer", "files": {
                "SKILL.md": "---\nname: report-writer\n---\nWrite reports.\n",
                "scripts/run.sh": {"content": "#!/bin/sh\necho skill ran\n", "executable": true}
            }})),
        )
        .await
        .ok();
    let skill_id = skill["skill_id"].as_str().unwrap();
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
