//! OpenTelemetry traces end to end: the real `envworker serve` exports OTLP
//! (http/protobuf) to a real receiver in the test ([`crate::common::otlp`]); one
//! signed webhook carrying W3C trace context drives a session with tool
//! calls and a memory store, and the span tree that arrives is checked —
//! its link to the sender's trace, each parent, the logs' field names, and
//! no secret or memory content anywhere in the bytes. Without an endpoint
//! no exporter exists at all.

use std::time::Duration;

use crate::common::ADMIN_KEY;
use crate::common::lambda::{StandIn, epoch_ms, fixture, spawn_function};
use crate::common::otlp::{OtlpReceiver, ReceivedSpan};
use crate::common::serve_stack::{Serve, stack_without_webhooks_env};

/// The sender's trace: what the webhook's `traceparent` carries.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SENDER_SPAN_ID: &str = "00f067aa0ba902b7";
/// The trace an unsigned (forged) delivery names.
const FORGED_TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";

/// The one span named `name` (panics with the tree if there is not exactly one).
fn one<'a>(spans: &'a [ReceivedSpan], name: &str) -> &'a ReceivedSpan {
    let found: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "one {name} span expected: {spans:#?}");
    found[0]
}

/// Whether the process has the SDK's batch exporter thread
/// ("OpenTelemetry.Traces.BatchProcessor", cut to 15 bytes by the kernel).
fn has_exporter_thread(pid: u32) -> bool {
    // The exporter's thread starts beside the listener, not before it: give
    // it a moment (a loaded CI machine once took longer than none).
    let until = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let found = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|t| t.ok())
            .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
            .any(|comm| comm.starts_with("OpenTelemetry"));
        if found || std::time::Instant::now() >= until {
            return found;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait until the drain `serve` runs at start is done, so the only drain
/// left is the one the test's webhook starts.
async fn wait_for_the_start_drain(serve: &Serve) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !serve.logs().contains("queue drained") {
        assert!(std::time::Instant::now() < deadline, "{}", serve.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_with_trace_context_yields_the_span_tree_under_the_senders_trace() {
    let receiver = OtlpReceiver::start().await;
    let mut stack = stack_without_webhooks_env(
        &["--queue-check-interval", "off"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()),
            ("OTEL_SERVICE_NAME", "envworker-otel-test"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test"),
        ],
    )
    .await;
    assert!(has_exporter_thread(stack.serve.child.id()));
    wait_for_the_start_drain(&stack.serve).await;
    let started = stack
        .start(crate::common::scenario("notes-roundtrip"))
        .await;
    // An unsigned delivery's trace context is not adopted: a forger must not
    // place spans in a trace of its choosing (nor force sampling).
    let forged = reqwest::Client::new()
        .post(format!("{}/webhooks/default", stack.serve.url))
        .header("content-type", "application/json")
        .header("webhook-id", "msg_forged")
        .header("webhook-timestamp", "1")
        .header("webhook-signature", "v1,Zm9yZ2Vk")
        .header(
            "traceparent",
            format!("00-{FORGED_TRACE_ID}-{SENDER_SPAN_ID}-01"),
        )
        .body("{}")
        .send()
        .await
        .unwrap();
    assert!(forged.status().is_client_error(), "{}", forged.status());
    let traceparent = format!("00-{TRACE_ID}-{SENDER_SPAN_ID}-01");
    let answer = stack
        .deliver_run_started_with(
            &reqwest::Client::new(),
            "msg_otel_1",
            &started.session_id,
            &[
                ("traceparent", traceparent.as_str()),
                ("tracestate", "sender=1"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(answer.status(), 202);
    stack.passed_report(&started.session_id).await;
    // The item's teardown (final sync, flush, force-stop) ends its span;
    // SIGTERM then makes the process export what is still batched.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while stack.serve.logs().matches("queue drained").count() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            stack.serve.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stack.serve.terminate();
    assert!(stack.serve.wait_exit(Duration::from_secs(30)).success());
    let spans = receiver.spans();
    assert!(
        receiver
            .content_types()
            .iter()
            .all(|ct| ct == "application/x-protobuf"),
        "{:?}",
        receiver.content_types()
    );

    assert!(
        spans.iter().all(|s| s.trace_id != FORGED_TRACE_ID),
        "an unsigned delivery's traceparent was adopted: {spans:#?}"
    );
    // The delivery's span continues the sender's trace (the forged one's
    // span, if sampled, is a root of its own).
    let accepted: Vec<ReceivedSpan> = spans
        .iter()
        .filter(|s| s.name != "webhook" || s.attr("http.response.status_code") == Some("202"))
        .cloned()
        .collect();
    let webhook = one(&accepted, "webhook");
    assert_eq!(webhook.trace_id, TRACE_ID, "{spans:#?}");
    assert_eq!(webhook.parent_span_id, SENDER_SPAN_ID, "{spans:#?}");
    assert_eq!(webhook.trace_state, "sender=1", "{spans:#?}");
    assert_eq!(webhook.attr("endpoint"), Some("default"));
    assert_eq!(webhook.attr("webhook.id"), Some("msg_otel_1"));
    assert_eq!(webhook.attr("http.response.status_code"), Some("202"));
    assert_eq!(
        webhook.resource_attr("service.name"),
        Some("envworker-otel-test")
    );
    assert_eq!(
        webhook.resource_attr("deployment.environment"),
        Some("test")
    );

    // The drain it started, then the item the drain served.
    let in_trace: Vec<ReceivedSpan> = spans
        .iter()
        .filter(|s| s.trace_id == TRACE_ID)
        .cloned()
        .collect();
    let drain = one(&in_trace, "drain");
    assert_eq!(drain.parent_span_id, webhook.span_id, "{spans:#?}");
    assert_eq!(drain.attr("trigger"), Some("webhook"));
    assert_eq!(drain.attr("items"), Some("1"));
    let item = one(&in_trace, "work_item");
    assert_eq!(item.parent_span_id, drain.span_id, "{spans:#?}");
    assert_eq!(item.attr("session_id"), Some(started.session_id.as_str()));
    assert!(
        item.attr("work_id").is_some_and(|id| !id.is_empty()),
        "{item:#?}"
    );
    assert!(item.attr("duration_ms").is_some(), "{item:#?}");
    assert_eq!(item.attr("stopped"), Some("true"), "{item:#?}");

    // The item's tool calls, syncs and flush are its children.
    let children = |name: &str| -> Vec<&ReceivedSpan> {
        in_trace
            .iter()
            .filter(|s| s.name == name && s.parent_span_id == item.span_id)
            .collect()
    };
    let calls = children("tool_call");
    let mut tools: Vec<&str> = calls.iter().filter_map(|c| c.attr("tool.name")).collect();
    tools.sort();
    assert_eq!(tools, ["bash", "read", "write"], "{spans:#?}");
    for call in &calls {
        assert_eq!(call.attr("session_id"), Some(started.session_id.as_str()));
        assert!(call.attr("tool_use_id").is_some() && call.attr("duration_ms").is_some());
    }
    let write = calls.iter().find(|c| c.attr("tool.name") == Some("write"));
    assert_eq!(write.unwrap().attr("is_error"), Some("true"));
    let syncs = children("memory.sync");
    assert!(
        syncs.iter().any(|s| s.attr("final_sync") == Some("true")),
        "{spans:#?}"
    );
    assert!(
        syncs
            .iter()
            .all(|s| s.attr("memory_store.id").is_some_and(|id| !id.is_empty())),
        "{syncs:#?}"
    );
    let flushes = children("memory.flush");
    assert!(!flushes.is_empty(), "{spans:#?}");
    assert!(
        flushes
            .iter()
            .all(|s| s.attr("memory_store.id").is_some() && s.attr("uploaded").is_some())
    );
    // Nothing of the item's lies outside its trace.
    for span in &spans {
        if ["tool_call", "memory.sync", "memory.flush", "work_item"].contains(&span.name.as_str()) {
            assert_eq!(span.trace_id, TRACE_ID, "{span:#?}");
        }
    }

    // No secret, memory content or tool input in what was exported.
    let bytes: Vec<u8> = receiver.raw_bodies().concat();
    let text = String::from_utf8_lossy(&bytes);
    for secret in [
        stack.secret.as_str(),
        stack.started_env.1.as_str(),
        started.environment_key.as_str(),
        ADMIN_KEY,
        // Every key and token the devserver issues (environment keys,
        // sessions tokens) starts so.
        "sk-ant-",
        // Memory content and tool input text of the scenario.
        "short answers",
        "Be brief",
        "team knowledge base",
        "ls /",
        "x.md",
    ] {
        assert!(!text.contains(secret), "{secret:?} was exported");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn without_an_endpoint_or_when_disabled_no_exporter_exists() {
    let receiver = OtlpReceiver::start().await;
    // Every other OTEL_* variable set, but no endpoint: nothing is built.
    let stack = stack_without_webhooks_env(
        &["--queue-check-interval", "off"],
        &[
            ("OTEL_SERVICE_NAME", "envworker-otel-test"),
            ("OTEL_TRACES_SAMPLER", "always_on"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ],
    )
    .await;
    wait_for_the_start_drain(&stack.serve).await;
    assert!(!has_exporter_thread(stack.serve.child.id()));
    // An endpoint, but the SDK disabled: still nothing, and nothing sent.
    let disabled = stack_without_webhooks_env(
        &["--queue-check-interval", "off"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()),
            ("OTEL_SDK_DISABLED", "true"),
        ],
    )
    .await;
    wait_for_the_start_drain(&disabled.serve).await;
    assert!(!has_exporter_thread(disabled.serve.child.id()));
    let started = disabled
        .start(serde_json::json!({"name": "untraced", "steps": [{"tool": "bash", "input": {"command": "echo hi"}, "expect": {"contains": "hi"}}]}))
        .await;
    let answer = disabled
        .deliver_run_started(&reqwest::Client::new(), "msg_off_1", &started.session_id)
        .await
        .unwrap();
    assert_eq!(answer.status(), 202);
    disabled.passed_report(&started.session_id).await;
    drop(disabled);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(receiver.raw_bodies().is_empty());
}

/// On Lambda the environment may be frozen once the invocation ends: the
/// spans of the work it did are exported before the extension asks for
/// its next event, not at some later batch tick (set an hour away here).
#[tokio::test(flavor = "multi_thread")]
async fn on_lambda_the_invocations_spans_are_exported_before_it_ends() {
    let receiver = OtlpReceiver::start().await;
    let fx = fixture().await;
    let (started, remap) = fx.memory_scenario("lambda-traced", "traced\n").await;
    let traceparent = format!("00-{TRACE_ID}-{SENDER_SPAN_ID}-01");
    let event = fx.webhook_event_with(&started.session_id, &[("traceparent", &traceparent)]);
    let (stand_in, api) = StandIn::start(event, epoch_ms() + 300_000).await;
    let work = tempfile::tempdir().unwrap();
    let (mut child, stderr) = spawn_function(
        &api,
        &["serve", "--max-idle", "1s", "--mount-remap", &remap],
        &[
            ("ANTHROPIC_BASE_URL", fx.server.url().as_str()),
            ("ANTHROPIC_ENVIRONMENT_ID", fx.env.0.as_str()),
            ("ANTHROPIC_ENVIRONMENT_KEY", fx.env.1.as_str()),
            ("ANTHROPIC_WEBHOOK_SIGNING_KEY", fx.secret.as_str()),
            ("ENVWORKER_WORKDIR", work.path().to_str().unwrap()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "3600000"),
        ],
    );
    let ended = stand_in
        .wait_for(Duration::from_secs(60), |seen| {
            seen.extension_done.is_some()
        })
        .await;
    assert!(ended, "{}", stderr.lock().unwrap());
    // The function is still alive (waiting for its next invocation).
    assert!(child.try_wait().unwrap().is_none());
    let spans = receiver.spans();
    let webhook = one(&spans, "webhook");
    assert_eq!(webhook.trace_id, TRACE_ID, "{spans:#?}");
    assert_eq!(webhook.parent_span_id, SENDER_SPAN_ID, "{spans:#?}");
    let drain = one(&spans, "drain");
    assert_eq!(drain.parent_span_id, webhook.span_id, "{spans:#?}");
    let item = one(&spans, "work_item");
    assert_eq!(item.parent_span_id, drain.span_id, "{spans:#?}");
    assert_eq!(item.attr("session_id"), Some(started.session_id.as_str()));
    for name in ["tool_call", "memory.sync", "memory.flush"] {
        assert!(
            spans
                .iter()
                .any(|s| s.name == name && s.parent_span_id == item.span_id),
            "no {name} under the item: {spans:#?}"
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The exporter trusts what the API client trusts (the OS store, here
/// `SSL_CERT_FILE`): a collector behind an internal CA receives the spans.
#[tokio::test(flavor = "multi_thread")]
async fn a_collector_behind_an_internal_ca_is_trusted_through_ssl_cert_file() {
    let receiver = OtlpReceiver::start().await;
    let upstream = receiver
        .endpoint
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let front = crate::common::network::TlsFront::start(upstream).await;
    let ca = front.ca_pem.to_str().unwrap().to_string();
    let stack = stack_without_webhooks_env(
        &["--queue-check-interval", "off"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", front.url.as_str()),
            ("SSL_CERT_FILE", ca.as_str()),
        ],
    )
    .await;
    wait_for_the_start_drain(&stack.serve).await;
    let started = stack
        .start(serde_json::json!({"name": "traced over tls", "steps": [{"tool": "bash", "input": {"command": "echo hi"}, "expect": {"contains": "hi"}}]}))
        .await;
    let answer = stack
        .deliver_run_started(&reqwest::Client::new(), "msg_tls_1", &started.session_id)
        .await
        .unwrap();
    assert_eq!(answer.status(), 202);
    stack.passed_report(&started.session_id).await;
    let mut stack = stack;
    stack.serve.terminate();
    assert!(stack.serve.wait_exit(Duration::from_secs(30)).success());
    let spans = receiver.spans();
    assert!(
        spans.iter().any(|s| s.name == "work_item"),
        "no span crossed the TLS front: {}",
        stack.serve.logs()
    );
}
