//! Lambda mode end to end against a local stand-in for the Lambda Runtime
//! API and Extensions API: `envworker serve` started with
//! `AWS_LAMBDA_RUNTIME_API` registers its internal extension, takes one
//! invocation (a Function URL event carrying a signed webhook), answers it
//! at once, and keeps working inside the invocation — the stand-in sees the
//! extension ask for its next event only after the memory flush and the
//! force-stop. The invocation deadline is honoured.

use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::TestServer;
use crate::common::lambda::{Seen, StandIn, epoch_ms, fixture, spawn_function};
use serde_json::{Value, json};

struct Lambda {
    child: Child,
    stand_in: StandIn,
    stderr: Arc<Mutex<String>>,
}

impl Lambda {
    async fn wait_for(&self, what: &str, timeout: Duration, done: impl Fn(&Seen) -> bool) {
        if !self.stand_in.wait_for(timeout, done).await {
            let seen = self.stand_in.seen.lock().unwrap();
            panic!(
                "timed out waiting for {what}; errors: {:?}; calls: {:?}\n--- envworker stderr ---\n{}",
                seen.errors,
                seen.calls,
                self.stderr.lock().unwrap()
            );
        }
    }
}

impl Drop for Lambda {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start the stand-in and `envworker serve` as a Lambda function; one invocation is queued.
async fn lambda(
    server: &TestServer,
    env: (&str, &str),
    secret: &str,
    event: Value,
    deadline_ms: u64,
    extra: &[&str],
) -> Lambda {
    let mut args = vec!["serve", "--max-idle", "1s", "--memory-sync-interval", "5s"];
    args.extend_from_slice(extra);
    lambda_with_args(
        server,
        env,
        secret,
        event,
        (deadline_ms, deadline_ms),
        &args,
    )
    .await
}

/// [`lambda`] with exactly `args` on the command line (none: as Lambda starts
/// `bootstrap`), and the deadlines of the runtime and of the extension.
async fn lambda_with_args(
    server: &TestServer,
    env: (&str, &str),
    secret: &str,
    event: Value,
    (deadline_ms, extension_deadline_ms): (u64, u64),
    args: &[&str],
) -> Lambda {
    let (stand_in, api) = StandIn::start_with(event, deadline_ms, extension_deadline_ms).await;
    let tmp = tempfile::tempdir().unwrap().keep();
    let workdir = tmp.join("work");
    let (child, stderr) = spawn_function(
        &api,
        args,
        &[
            ("ANTHROPIC_BASE_URL", server.url().as_str()),
            ("ANTHROPIC_ENVIRONMENT_ID", env.0),
            ("ANTHROPIC_ENVIRONMENT_KEY", env.1),
            ("ANTHROPIC_WEBHOOK_SIGNING_KEY", secret),
            ("ENVWORKER_WORKDIR", workdir.to_str().unwrap()),
        ],
    );
    Lambda {
        child,
        stand_in,
        stderr,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_webhook_is_answered_first_and_the_flush_happens_inside_the_invocation() {
    let fx = fixture().await;
    let advertised = fx._mnt.path().join("advertised/memory");
    let (started, remap) = fx.memory_scenario("lambda", "from lambda\n").await;
    let deadline = epoch_ms() + 300_000;
    let lambda = lambda(
        &fx.server,
        (&fx.env.0, &fx.env.1),
        &fx.secret,
        fx.webhook_event(&started.session_id),
        deadline,
        &["--mount-remap", &remap],
    )
    .await;
    let s = &lambda.stand_in;
    lambda
        .wait_for("the response", Duration::from_secs(30), |seen| {
            seen.response.is_some()
        })
        .await;
    let (answered_at, response) = s.seen.lock().unwrap().response.clone().unwrap();
    assert_eq!(response["statusCode"], 202, "{response:#}");
    assert!(
        response["body"].as_str().unwrap().contains("accepted"),
        "{response:#}"
    );
    lambda
        .wait_for(
            "the extension's next event",
            Duration::from_secs(60),
            |seen| seen.extension_done.is_some(),
        )
        .await;
    let done_at = s.seen.lock().unwrap().extension_done.unwrap();
    assert!(
        done_at > answered_at + Duration::from_millis(500),
        "the work ran after the answer"
    );
    // At the moment the invocation ends, everything is saved and the item stopped.
    let contents = fx.server.session_memories(&started.session_id).await;
    assert_eq!(contents["/b.md"], "from lambda\n", "{contents:#?}");
    assert_eq!(
        fx.server.work_state(&fx.env.0, &started.session_id).await,
        "stopped"
    );
    let report = fx
        .server
        .final_report(&started.session_id, Duration::from_secs(30))
        .await;
    assert_eq!(
        report["status"],
        "passed",
        "{report:#}\n{}",
        lambda.stderr.lock().unwrap()
    );
    // The advertised paths worked although the files lived elsewhere.
    assert!(
        !advertised.exists(),
        "nothing was created at the advertised root"
    );
    assert!(s.seen.lock().unwrap().errors.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn started_bare_it_serves_and_claims_no_item_when_the_invocation_has_too_little_time_left() {
    let fx = fixture().await;
    let started = fx
        .server
        .start_scenario(&json!({"name": "late", "environment_id": fx.env.0, "steps": [{"tool": "bash", "input": {"command": "true"}}]}))
        .await;
    let deadline = epoch_ms() + 30_000; // under the 65 s teardown reserve + 60 s serving time
    // Started as Lambda starts a custom runtime's `bootstrap`: no arguments at all.
    let lambda = lambda_with_args(
        &fx.server,
        (&fx.env.0, &fx.env.1),
        &fx.secret,
        fx.webhook_event(&started.session_id),
        (deadline, deadline),
        &[],
    )
    .await;

    lambda
        .wait_for(
            "the extension's next event",
            Duration::from_secs(20),
            |seen| seen.extension_done.is_some(),
        )
        .await;
    assert_eq!(
        fx.server.work_state(&fx.env.0, &started.session_id).await,
        "queued",
        "the item waits for an invocation with time to serve it"
    );
    assert!(
        lambda
            .stderr
            .lock()
            .unwrap()
            .contains("serving webhooks on AWS Lambda"),
        "{}",
        lambda.stderr.lock().unwrap()
    );
    // Either the drain finds too little time left, or the invocation's end
    // (only the teardown reserve left from the start) stops it claiming
    // first: which one says so first is a race; neither claims.
    let log = lambda.stderr.lock().unwrap().clone();
    assert!(
        log.contains("too little time left") || log.contains("the drain claims nothing more"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_session_ends_in_time_for_its_teardown_before_the_deadline() {
    let fx = fixture().await;
    let started = fx.long_session("long", "late.md", "keep me\n").await;
    let deadline_in = Duration::from_secs(30);
    let deadline = epoch_ms() + deadline_in.as_millis() as u64;
    let t0 = Instant::now();
    let remap_root = tempfile::tempdir().unwrap();
    let remap = fx.remap_to(remap_root.path());
    // Teardown bounds of 2 s → a 19 s reserve (2 × 2 s, 10 s for the force-stop, 5 s);
    // 1 s of serving time is enough to claim. The session is cut at about 11 s.
    let lambda = lambda(
        &fx.server,
        (&fx.env.0, &fx.env.1),
        &fx.secret,
        fx.webhook_event(&started.session_id),
        deadline,
        &[
            "--memory-teardown-bound",
            "2s",
            "--min-serving-time",
            "1s",
            "--mount-remap",
            &remap,
        ],
    )
    .await;
    let s = &lambda.stand_in;
    lambda
        .wait_for(
            "the extension's next event",
            Duration::from_secs(30),
            |seen| seen.extension_done.is_some(),
        )
        .await;
    let done = s.seen.lock().unwrap().extension_done.unwrap();
    assert!(
        done.duration_since(t0) < deadline_in,
        "the invocation outlived its deadline: {:?}",
        done.duration_since(t0)
    );
    assert!(
        done.duration_since(t0) >= Duration::from_secs(10),
        "the session was served until the reserve"
    );
    let contents = fx.server.session_memories(&started.session_id).await;
    assert_eq!(
        contents["/late.md"],
        "keep me\n",
        "{}",
        lambda.stderr.lock().unwrap()
    );
    // Mid-turn (the agent still has a step to take): handed back unstopped,
    // as on SIGTERM, for the next invocation to resume once the lease lapses.
    assert_eq!(
        fx.server.work_state(&fx.env.0, &started.session_id).await,
        "active"
    );
    assert!(
        lambda
            .stderr
            .lock()
            .unwrap()
            .contains("released the work item without stopping it")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_event_the_runtime_cannot_decode_does_not_hold_the_invocation_past_its_deadline() {
    let fx = fixture().await;
    // A console test event: neither an HTTP request nor a scheduled event,
    // answered with an error at once.
    let deadline_in = Duration::from_secs(4);
    let t0 = Instant::now();
    let lambda = lambda(
        &fx.server,
        (&fx.env.0, &fx.env.1),
        &fx.secret,
        json!({"key1": "value1"}),
        epoch_ms() + deadline_in.as_millis() as u64,
        &[],
    )
    .await;
    // The runtime's report and the extension's next event may come in
    // either order (CI saw the extension first): wait for both.
    lambda
        .wait_for(
            "the extension's next event and the runtime's report",
            Duration::from_secs(20),
            |seen| {
                seen.extension_done.is_some()
                    && (!seen.errors.is_empty() || seen.response.is_some())
            },
        )
        .await;
    let seen = lambda.stand_in.seen.lock().unwrap();
    let done = seen.extension_done.unwrap().duration_since(t0);
    assert!(
        done < deadline_in + Duration::from_secs(2),
        "the invocation was held {done:?}, past its deadline"
    );
    assert!(
        !seen.errors.is_empty() || seen.response.is_some(),
        "the runtime reported the invocation"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invocation_that_ends_claims_nothing_more_and_tears_its_session_down_inside_the_deadline()
 {
    let fx = fixture().await;
    // A session that would go on for two minutes, its edit saved only by
    // the teardown (no periodic sync within the test), and one more queued.
    let held = fx.long_session("held", "held.md", "saved in time\n").await;
    let waiting = fx
        .server
        .start_scenario(&json!({"name": "waiting", "environment_id": fx.env.0, "steps": [{"tool": "bash", "input": {"command": "true"}}]}))
        .await;
    // The runtime is told two minutes, the extension 25 s: the invocation
    // really ends at 25 s, so the drain must stop at 25 s − the 17 s reserve.
    let t0 = Instant::now();
    let ends_in = Duration::from_secs(25);
    let remap_root = tempfile::tempdir().unwrap();
    let remap = fx.remap_to(remap_root.path());
    let lambda = lambda_with_args(
        &fx.server,
        (&fx.env.0, &fx.env.1),
        &fx.secret,
        fx.webhook_event(&held.session_id),
        (
            epoch_ms() + 120_000,
            epoch_ms() + ends_in.as_millis() as u64,
        ),
        &[
            "serve",
            "--max-idle",
            "off",
            "--memory-sync-interval",
            "1h",
            "--memory-teardown-bound",
            "1s",
            "--min-serving-time",
            "1s",
            "--mount-remap",
            &remap,
        ],
    )
    .await;
    lambda
        .wait_for(
            "the extension's next event",
            Duration::from_secs(40),
            |seen| seen.extension_done.is_some(),
        )
        .await;
    let done = lambda.stand_in.seen.lock().unwrap().extension_done.unwrap();
    let log = || lambda.stderr.lock().unwrap().clone();
    assert!(
        done.duration_since(t0) < ends_in,
        "the invocation outlived its deadline: {:?}\n{}",
        done.duration_since(t0),
        log()
    );
    // When the invocation ends, the held session is torn down: saved, and —
    // its turn not over — handed back unstopped, as on SIGTERM, so the next
    // invocation resumes it once its lease lapses (a stop would strand it).
    assert_eq!(
        fx.server.session_memories(&held.session_id).await["/held.md"],
        "saved in time\n",
        "{}",
        log()
    );
    assert_eq!(
        fx.server.work_state(&fx.env.0, &held.session_id).await,
        "active"
    );
    assert!(
        log().contains("released the work item without stopping it"),
        "{}",
        log()
    );
    // And nothing more is claimed after it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        fx.server.work_state(&fx.env.0, &waiting.session_id).await,
        "queued",
        "{}",
        log()
    );
    assert_eq!(log().matches("claimed work").count(), 1, "{}", log());
    assert!(
        log().contains("the invocation is about to end"),
        "{}",
        log()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deadline_already_past_at_arrival_is_warned_about_once_and_nothing_is_claimed() {
    let fx = fixture().await;
    let started = fx
        .server
        .start_scenario(&json!({"name": "past", "environment_id": fx.env.0, "steps": [{"tool": "bash", "input": {"command": "true"}}]}))
        .await;
    let lambda = lambda(
        &fx.server,
        (&fx.env.0, &fx.env.1),
        &fx.secret,
        fx.webhook_event(&started.session_id),
        epoch_ms() - 60_000,
        &[],
    )
    .await;
    // The extension may be done before the runtime has posted its answer:
    // wait for both.
    lambda
        .wait_for(
            "the extension's next event and the answer",
            Duration::from_secs(20),
            |seen| seen.extension_done.is_some() && seen.response.is_some(),
        )
        .await;
    let (_, response) = lambda
        .stand_in
        .seen
        .lock()
        .unwrap()
        .response
        .clone()
        .unwrap();
    assert_eq!(response["statusCode"], 202, "{response:#}");
    assert_eq!(
        fx.server.work_state(&fx.env.0, &started.session_id).await,
        "queued",
        "nothing is claimed without time to serve it"
    );
    let log = lambda.stderr.lock().unwrap().clone();
    assert_eq!(
        log.matches("already past when the invocation arrived")
            .count(),
        1,
        "{log}"
    );
}
