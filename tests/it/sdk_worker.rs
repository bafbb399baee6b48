//! The official SDK worker (`anthropic==2.10.0`, `EnvironmentWorker`) serves
//! scripted sessions from the devserver, as it would serve the real API:
//! the scenario report passes and the stores hold what the scenario expects.

use crate::common::served;
use serde_json::Value;

/// Run one scenario file end to end with the SDK worker; returns its report.
async fn served_by_the_sdk(name: &str) -> Value {
    served::by_the_sdk(&served::Case::file(name)).await.report
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sdk_worker_passes_notes_roundtrip() {
    served_by_the_sdk("notes-roundtrip").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sdk_worker_passes_two_stores_with_a_remote_edit_a_local_delete_and_a_read_only_refusal()
 {
    let report = served_by_the_sdk("two-stores-sync").await;
    // The remote edit reached the disk before the read that checks it.
    let read_back = &report["steps"][9];
    assert_eq!(read_back["status"], "passed", "{read_back:#}");
    assert!(
        report["final_contents"]["notes"].get("/old.md").is_none(),
        "the local delete reached the server"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sdk_worker_passes_permission_gates() {
    served_by_the_sdk("permission-gates").await;
}

/// The oracle for SIGTERM mid tool call (issue 14, item 4): the SDK's
/// worker, its task cancelled on SIGTERM as the SDK tells an embedding
/// program to do, lets the call in flight finish, posts its own result,
/// then force-stops the item. The agent's next call then waits for ever:
/// the item is stopped and nothing re-queues it (queue depth 0). envworker
/// answers the call the same way (`tests/it/termination.rs` checks the same
/// result text) but hands the item back unstopped, so a restarted worker
/// finishes the session.
#[tokio::test(flavor = "multi_thread")]
async fn on_sigterm_mid_call_the_sdk_worker_answers_the_call_then_stops_the_item() {
    use std::time::{Duration, Instant};

    let server = crate::common::TestServer::start().await;
    let workdir = tempfile::tempdir().unwrap();
    let started = server
        .start_scenario(&crate::common::long_call_then_another(
            "sleep 5; echo slept",
            serde_json::json!({"is_error": false, "contains": "slept"}),
        ))
        .await;
    let url = server.url();
    let mut sdk = crate::common::sdk::spawn_script(
        "sdk_worker.py",
        &[
            ("ENVWORKER_URL", &url),
            ("ENVWORKER_ENVIRONMENT_ID", &started.environment_id),
            ("ENVWORKER_ENVIRONMENT_KEY", &started.environment_key),
            ("ENVWORKER_WORKDIR", workdir.path().to_str().unwrap()),
        ],
    );
    let logs = crate::common::process::collect_stderr(&mut sdk);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !logs.lock().unwrap().contains("executing tool") {
        assert!(Instant::now() < deadline, "{}", logs.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let signalled = Instant::now();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &sdk.id().to_string()])
        .status();
    let out = tokio::task::spawn_blocking(move || sdk.wait_with_output().unwrap())
        .await
        .unwrap();
    let took = signalled.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", logs.lock().unwrap());
    assert!(stdout.contains("cancelled by SIGTERM"), "{stdout}");

    // The call in flight got its own result, before the process exited.
    let results = server.tool_results(&started.session_id).await;
    assert_eq!(results.len(), 1, "{results:#?}");
    assert_eq!(results[0]["is_error"], false);
    assert_eq!(
        results[0]["content"][0]["text"].as_str().unwrap().trim(),
        "slept"
    );
    // Then the item was stopped, and the agent's next call is stranded.
    assert_eq!(
        server
            .work_state(&started.environment_id, &started.session_id)
            .await,
        "stopped"
    );
    let events = server.events(&started.session_id).await;
    let last = events.last().unwrap();
    assert_eq!(last["type"], "session.status_idle", "{events:#?}");
    assert_eq!(last["stop_reason"]["type"], "requires_action");
    assert_eq!(
        events
            .iter()
            .filter(|e| e["type"] == "agent.tool_use")
            .count(),
        2,
        "the next call was made, and no result will come for it"
    );
    assert_eq!(
        server.scenario_report(&started.session_id).await["status"],
        "running"
    );
    eprintln!(
        "SDK worker: exited {took:?} after SIGTERM; the call's own result posted; item stopped; next call stranded"
    );
}
