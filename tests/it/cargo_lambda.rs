//! Lambda mode under cargo-lambda, the standard Rust Lambda tool: its
//! emulator (`cargo lambda watch --only-lambda-apis`) runs the Runtime and
//! Extensions APIs, the released `envworker` binary is the function, and
//! `cargo lambda invoke --data-file` sends the events — a freshly signed
//! Function URL webhook, and EventBridge's scheduled event. The emulator
//! sends `lambda-runtime-deadline-ms` as the timeout itself (`600000`) and
//! `deadlineMs: 0` to extensions, so these prove envworker serves under a
//! deadline that cannot be Unix milliseconds, with one warning.
//!
//! What cargo-lambda cannot check — a deadline controlled to the second, the
//! moment the extension lets the invocation end — stays in `tests/it/lambda.rs`
//! against the stand-in.

use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::cargo_lambda::Emulator;
use crate::common::lambda::{Fixture, fixture, scheduled_event, spawn_function};
use serde_json::{Value, json};

/// `envworker serve` as the function of `emulator`.
struct Function {
    child: Child,
    stderr: Arc<Mutex<String>>,
    _work: tempfile::TempDir,
}

impl Drop for Function {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- envworker stderr ---\n{}", self.stderr.lock().unwrap());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn function(emulator: &Emulator, fx: &Fixture, extra: &[&str]) -> Function {
    let work = tempfile::tempdir().unwrap();
    let workdir = work.path().join("work");
    let mut args = vec!["serve", "--max-idle", "1s", "--memory-sync-interval", "5s"];
    args.extend_from_slice(extra);
    let (child, stderr) = spawn_function(
        &emulator.runtime_api(),
        &args,
        &[
            // The function name `watch` prints for a function it did not start.
            ("AWS_LAMBDA_FUNCTION_NAME", "_"),
            ("ANTHROPIC_BASE_URL", fx.server.url().as_str()),
            ("ANTHROPIC_ENVIRONMENT_ID", &fx.env.0),
            ("ANTHROPIC_ENVIRONMENT_KEY", &fx.env.1),
            ("ANTHROPIC_WEBHOOK_SIGNING_KEY", &fx.secret),
            ("ENVWORKER_WORKDIR", workdir.to_str().unwrap()),
            (
                "ENVWORKER_STATE_DIR",
                work.path().join("state").to_str().unwrap(),
            ),
        ],
    );
    Function {
        child,
        stderr,
        _work: work,
    }
}

/// `cargo lambda invoke` off the async runtime (it blocks until the answer).
async fn invoke(emulator: &Arc<Emulator>, event: Value) -> Value {
    let emulator = emulator.clone();
    tokio::task::spawn_blocking(move || emulator.invoke(&event))
        .await
        .unwrap()
}

/// The deadline warning, counted in `log`.
fn deadline_warnings(log: &str) -> usize {
    log.matches("too small to be Unix milliseconds").count()
}

#[tokio::test(flavor = "multi_thread")]
async fn under_cargo_lambda_a_signed_webhook_is_answered_and_its_session_served_with_its_memory() {
    let fx = fixture().await;
    let (started, remap) = fx
        .memory_scenario("cargo-lambda", "from cargo-lambda\n")
        .await;
    let emulator = Arc::new(Emulator::start());
    let function = function(&emulator, &fx, &["--mount-remap", &remap]);

    let answer = invoke(&emulator, fx.webhook_event(&started.session_id)).await;
    assert_eq!(answer["statusCode"], 202, "{answer:#}");
    let report = fx
        .server
        .final_report(&started.session_id, Duration::from_secs(60))
        .await;
    let log = function.stderr.lock().unwrap().clone();
    assert_eq!(report["status"], "passed", "{report:#}\n{log}");
    assert_eq!(
        fx.server.session_memories(&started.session_id).await["/b.md"],
        "from cargo-lambda\n"
    );
    assert!(!log.contains("too little time left"), "{log}");
    assert_eq!(deadline_warnings(&log), 1, "one clear warning:\n{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn under_cargo_lambda_a_scheduled_event_serves_a_session_whose_webhook_never_came() {
    let fx = fixture().await;
    let emulator = Arc::new(Emulator::start());
    let function = function(&emulator, &fx, &[]);
    // Two sessions queued, no webhook ever sent: two scheduled invocations
    // (the second one warns no more about the deadline).
    for n in 0..2 {
        let started = fx
            .server
            .start_scenario(&json!({
                "name": format!("lost-webhook-{n}"),
                "environment_id": fx.env.0,
                "steps": [{"tool": "bash", "input": {"command": "echo served"}, "expect": {"contains": "served"}}]
            }))
            .await;
        let answer = invoke(&emulator, scheduled_event()).await;
        assert_eq!(answer["status"], "draining", "{answer:#}");
        let report = fx
            .server
            .final_report(&started.session_id, Duration::from_secs(60))
            .await;
        assert_eq!(
            report["status"],
            "passed",
            "{report:#}\n{}",
            function.stderr.lock().unwrap()
        );
    }
    let log = function.stderr.lock().unwrap().clone();
    assert!(log.contains("scheduled queue check"), "{log}");
    assert_eq!(deadline_warnings(&log), 1, "one clear warning:\n{log}");
}
