//! Termination never leaves a tool call unanswered (issue 14, item 4).
//!
//! `envworker serve` gets SIGTERM while the agent's bash call runs. The
//! session still waits for that call and nobody else will answer it, so the
//! worker answers it before letting go: with the call's own result when it
//! finishes within `--call-grace` (30 s), else with an error saying it was
//! cut off. The session's turn is not over (the agent goes on after the
//! result), so the item is handed back unstopped: its lease lapses after one
//! TTL (10 s here), and a restarted replica (`envworker poll`) claims it and
//! serves the rest. A stopped item would strand the session: nothing but a
//! user message re-queues it (protocol §1.2, §4.15; before this change the
//! call was dropped unanswered and the item force-stopped, so the restarted
//! worker found nothing to claim and the session waited for ever).
//!
//! A session whose turn had ended is stopped as before: a user message
//! queues new work for it.

use std::time::{Duration, Instant};

use crate::common::long_call_then_another;
use crate::common::serve_stack::{Stack, stack};
use serde_json::{Value, json};

/// Wait until serve's logs show the first call running.
async fn until_executing(stack: &Stack) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !stack.serve.logs().contains("executing tool") {
        assert!(Instant::now() < deadline, "{}", stack.serve.logs_tail(40));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The shell has started the command.
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// SIGTERM serve and wait for it to exit (0); how long it took.
async fn terminate(stack: &mut Stack) -> Duration {
    let at = Instant::now();
    stack.serve.terminate();
    let status = tokio::task::block_in_place(|| stack.serve.wait_exit(Duration::from_secs(90)));
    assert!(status.success(), "{status}: {}", stack.serve.logs_tail(40));
    at.elapsed()
}

/// What serve left behind, then a restarted replica serving the rest: the
/// in-flight call's one result (posted by the terminated worker), the
/// work item's state right after serve exited, and the final report.
async fn answered_then_resumed(stack: &mut Stack, session_id: &str) -> (Value, String, Value) {
    let results = stack.server.tool_results(session_id).await;
    assert_eq!(
        results.len(),
        1,
        "the call in flight was answered before serve exited: {results:#?}\n{}",
        stack.serve.logs_tail(40)
    );
    let state = stack
        .server
        .work_state(&stack.started_env.0, session_id)
        .await;
    let (mut poll, poll_logs) = stack.poller(&[]);
    // One lease TTL (10 s) until the item is back in the queue, then the rest.
    let report = stack
        .server
        .final_report(session_id, Duration::from_secs(40))
        .await;
    let _ = poll.kill();
    let _ = poll.wait();
    assert_eq!(
        report["status"],
        "passed",
        "{report:#}\nserve:\n{}\npoll:\n{}",
        stack.serve.logs_tail(30),
        poll_logs.lock().unwrap()
    );
    let all = stack.server.tool_results(session_id).await;
    assert_eq!(all.len(), 2, "each call answered once: {all:#?}");
    (results[0].clone(), state, report)
}

fn text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// `serve EXTRA` serves [`long_call_then_another`] and gets SIGTERM while
/// `command` runs; then a restarted replica serves the rest (see
/// [`answered_then_resumed`]). The in-flight call's result, and how long
/// serve took to exit.
async fn sigterm_mid_call(extra: &[&str], command: &str, first_expect: Value) -> (Value, Duration) {
    let mut stack = stack(extra).await;
    let started = stack
        .start(long_call_then_another(command, first_expect))
        .await;
    until_executing(&stack).await;
    let took = terminate(&mut stack).await;
    let (first, state, _) = answered_then_resumed(&mut stack, &started.session_id).await;
    assert_ne!(state, "stopped", "handed back, not stopped");
    let logs = stack.serve.logs();
    assert!(
        logs.contains("shutting down mid-turn: released the work item without stopping it"),
        "{logs}"
    );
    (first, took)
}

/// A call that finishes within the call grace is answered with its own
/// result; the item is handed back and a restarted replica finishes the
/// session.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_mid_call_posts_its_result_and_a_restarted_replica_finishes_the_session() {
    let (first, took) = sigterm_mid_call(
        &[],
        "sleep 5; echo slept",
        json!({"is_error": false, "contains": "slept"}),
    )
    .await;
    assert_eq!(first["is_error"], false, "{first:#}");
    assert_eq!(text(&first).trim(), "slept");
    eprintln!("serve exited {took:?} after SIGTERM; the call's own result was posted");
}

/// A call still running when the call grace ends is cut off (its command
/// killed) and answered with an error saying so.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_outliving_the_call_grace_is_cut_off_and_answered_with_an_error() {
    let (first, took) = sigterm_mid_call(
        &["--call-grace", "1s"],
        "sleep 30; echo slept",
        json!({"is_error": true, "contains": "cut off"}),
    )
    .await;
    assert!(
        took < Duration::from_secs(15),
        "serve took {took:?} to exit: the 30 s command was not cut off"
    );
    assert_eq!(first["is_error"], true, "{first:#}");
    assert!(text(&first).contains("shut down"), "{first:#}");
    eprintln!("serve exited {took:?} after SIGTERM with the call cut off and answered");
}

/// A session whose turn ended needs no worker until a user message, which
/// queues new work: SIGTERM then stops its item as before.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_after_the_turn_ended_stops_the_item() {
    let mut stack = stack(&["--max-idle", "5m"]).await;
    let started = stack
        .start(json!({"name": "done", "steps": [{"tool": "bash", "input": {"command": "true"}}]}))
        .await;
    // The turn ended (the report turns `passed` only once the item stopped).
    let deadline = Instant::now() + Duration::from_secs(30);
    while !stack
        .server
        .events(&started.session_id)
        .await
        .iter()
        .any(|e| e["type"] == "session.status_idle" && e["stop_reason"]["type"] == "end_turn")
    {
        assert!(Instant::now() < deadline, "{}", stack.serve.logs_tail(40));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The runner has seen it too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    terminate(&mut stack).await;
    assert_eq!(
        stack
            .server
            .work_state(&stack.started_env.0, &started.session_id)
            .await,
        "stopped",
        "{}",
        stack.serve.logs_tail(20)
    );
    assert!(
        !stack
            .serve
            .logs()
            .contains("released the work item without stopping it")
    );
    stack.passed_report(&started.session_id).await;
}
