//! Bounded inputs (issue 12 item 8): every numeric option of the binary,
//! the endpoint file, the devserver's flags, scenario fields and fault
//! rules is refused just above its bound with a message naming the option
//! and the bound, and accepted at the bound — over the real CLI and HTTP.

use std::process::Command;

use crate::common::process::DevserverProcess;
use crate::common::serve_stack::{Serve, free_port};
use crate::common::{ADMIN_KEY, TestServer};
use envworker::webhook::SigningKey;
use reqwest::Method;
use serde_json::{Value, json};

/// Run `envworker ARGS` expecting a refusal; its stderr.
fn refused(args: &[&str], envs: &[(&str, &str)]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_envworker"))
        .args(args)
        .envs(envs.iter().copied())
        .env_remove("RUST_LOG")
        .output()
        .expect("envworker runs");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{args:?} was accepted: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    stderr
}

fn serve_env(secret: &str) -> Vec<(&'static str, String)> {
    vec![
        ("ANTHROPIC_BASE_URL", "http://127.0.0.1:9".to_string()),
        ("ANTHROPIC_ENVIRONMENT_ID", "env_bounds".to_string()),
        ("ANTHROPIC_ENVIRONMENT_KEY", "sk-env-bounds".to_string()),
        ("ANTHROPIC_WEBHOOK_SIGNING_KEY", secret.to_string()),
        (
            "ENVWORKER_WORKDIR",
            std::env::temp_dir().display().to_string(),
        ),
    ]
}

#[test]
fn serve_flags_are_refused_above_their_bound_and_accepted_at_it() {
    let (_key, secret) = SigningKey::generate();
    let env = serve_env(&secret);
    let envs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for (flag, above, needle) in [
        ("--max-concurrent-items", "65", "between 1 and 64"),
        ("--max-concurrent-items", "0", "between 1 and 64"),
        (
            "--max-concurrent-items",
            "99999999999999999999999",
            "whole number",
        ),
        ("--tool-timeout", "24h1s", "between 1s and 24h"),
        ("--tool-timeout", "0", "between 1s and 24h"),
        ("--stop-grace", "1h1s", "between 1s and 1h"),
        ("--unready-after", "1h1s", "between 1s and 1h"),
        ("--unready-after", "999ms", "between 1s and 1h"),
        ("--min-serving-time", "15m1s", "between 0s and 15m"),
        ("--queue-check-interval", "1h1s", "between 1s and 1h"),
        ("--queue-check-interval", "999ms", "between 1s and 1h"),
        ("--memory-teardown-bound", "1h1ms", "between 1s and 1h"),
        ("--memory-teardown-bound", "999ms", "between 1s and 1h"),
        ("--max-idle", "24h1s", "at most 24h"),
        ("--memory-sync-interval", "24h1s", "at most 86400s"),
        ("--memory-sync-interval", "4s", "at least 5s"),
        ("--max-idle", "1e300", "too long"),
    ] {
        let err = refused(&["serve", "--listen", "127.0.0.1:0", flag, above], &envs);
        assert!(err.contains(flag), "{flag} {above}: {err}");
        assert!(err.contains(needle), "{flag} {above}: {err}");
    }
    // Every flag at its bound at once: serve starts and listens.
    let _serve = Serve::start(
        free_port(),
        &envs,
        &[
            "--max-concurrent-items",
            "64",
            "--tool-timeout",
            "24h",
            "--stop-grace",
            "1h",
            "--unready-after",
            "1h",
            "--min-serving-time",
            "15m",
            "--queue-check-interval",
            "1h",
            "--memory-teardown-bound",
            "1h",
            "--max-idle",
            "24h",
            "--memory-sync-interval",
            "24h",
        ],
    );
    let _low = Serve::start(
        free_port(),
        &envs,
        &[
            "--max-concurrent-items",
            "1",
            "--tool-timeout",
            "1s",
            "--stop-grace",
            "1s",
            "--unready-after",
            "1s",
            "--min-serving-time",
            "0s",
            "--queue-check-interval",
            "1s",
            "--memory-teardown-bound",
            "1s",
            "--memory-sync-interval",
            "5s",
        ],
    );
}

/// An endpoint file of `count` endpoints, padded with a comment to `size` bytes.
fn endpoint_file(dir: &std::path::Path, count: usize, items: usize, size: Option<usize>) -> String {
    let mut text = String::new();
    for i in 0..count {
        text.push_str(&format!(
            "[[endpoint]]\nname = \"e{i}\"\nsigning_keys_env = [\"BOUNDS_KEY\"]\nenvironment_id = \"env_{i}\"\nenvironment_key_env = \"BOUNDS_ENV_KEY\"\nmax_concurrent_items = {items}\n\n"
        ));
    }
    if let Some(size) = size {
        let pad = size - text.len() - 2;
        text.push('#');
        text.push_str(&"x".repeat(pad));
        text.push('\n');
        assert_eq!(text.len(), size);
    }
    let path = dir.join(format!("serve-{count}-{items}-{size:?}.toml"));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn the_endpoint_file_is_bounded_in_size_endpoints_and_items() {
    let dir = tempfile::tempdir().unwrap();
    let (_key, secret) = SigningKey::generate();
    let envs = [
        ("BOUNDS_KEY", secret.as_str()),
        ("BOUNDS_ENV_KEY", "sk-env-bounds"),
        ("ANTHROPIC_BASE_URL", "http://127.0.0.1:9"),
    ];
    let mib = 1024 * 1024;
    for (file, needle) in [
        (
            endpoint_file(dir.path(), 65, 1, None),
            "at most 64 are served",
        ),
        (
            endpoint_file(dir.path(), 1, 65, None),
            "max_concurrent_items: 65 is out of range",
        ),
        (
            endpoint_file(dir.path(), 1, 0, None),
            "max_concurrent_items: 0 is out of range",
        ),
        (
            endpoint_file(dir.path(), 1, 1, Some(mib + 1)),
            "larger than 1048576 bytes",
        ),
    ] {
        let err = refused(
            &["serve", "--listen", "127.0.0.1:0", "--config", &file],
            &envs,
        );
        assert!(err.contains(needle), "{file}: {err}");
    }
    // 64 endpoints of 64 items each, in a file of exactly 1 MiB: served.
    let file = endpoint_file(dir.path(), 64, 64, Some(mib));
    let _serve = Serve::start(free_port(), &envs, &["--config", &file]);
}

#[test]
fn devserver_flags_are_refused_above_their_bound_and_accepted_at_it() {
    let faults = |n: usize, rule: &str| -> Vec<String> {
        (0..n)
            .flat_map(|_| ["--fault".to_string(), rule.to_string()])
            .collect()
    };
    let base = [
        "devserver",
        "--listen",
        "127.0.0.1:0",
        "--admin-key",
        ADMIN_KEY,
    ];
    for (extra, needle) in [
        (faults(101, "/x:status=500"), "101 fault rules; at most 100"),
        (
            faults(1, "/x:latency_ms=600001"),
            "latency_ms is 600001; it must be at most 600000",
        ),
        (
            faults(1, "/x:times=1000001"),
            "times is 1000001; it must be at most 1000000",
        ),
        (
            vec!["--lease-ttl".into(), "3601".into()],
            "the lease TTL must be 1 to 3600 seconds",
        ),
        (
            vec!["--lease-ttl".into(), "0".into()],
            "the lease TTL must be 1 to 3600 seconds",
        ),
    ] {
        let mut args: Vec<&str> = base.to_vec();
        args.extend(extra.iter().map(String::as_str));
        let err = refused(&args, &[]);
        assert!(err.contains(needle), "{extra:?}: {err}");
    }
    let mut at_limit = faults(99, "/x:status=500");
    at_limit.extend(faults(1, "/y:latency_ms=600000,times=1000000"));
    at_limit.extend(["--lease-ttl".to_string(), "3600".to_string()]);
    let args: Vec<&str> = at_limit.iter().map(String::as_str).collect();
    let _devserver = DevserverProcess::start(ADMIN_KEY, &args);
}

async fn refused_over_http(server: &TestServer, path: &str, body: Value, needle: &str) {
    let answer = server.dev(Method::POST, path, Some(body)).await;
    let message = answer.expect_error(400, "invalid_request_error");
    assert!(message.contains(needle), "{path}: {message}");
}

async fn accepted_over_http(server: &TestServer, path: &str, body: Value) -> Value {
    let answer = server.dev(Method::POST, path, Some(body)).await;
    assert_eq!(answer.status, 200, "{path}: {:#}", answer.body);
    answer.body
}

#[tokio::test(flavor = "multi_thread")]
async fn scenario_fields_are_refused_above_their_bound_and_accepted_at_it() {
    let server = TestServer::start().await;
    let wait = |ms: u64| json!({"name": "w", "steps": [{"wait_ms": ms}]});
    refused_over_http(
        &server,
        "/dev/scenarios",
        wait(600_001),
        "steps[0]: wait_ms is 600001; the most a step waits is 600000",
    )
    .await;
    refused_over_http(
        &server,
        "/dev/scenarios",
        wait(1_000_000_000_000_000),
        "wait_ms",
    )
    .await;
    accepted_over_http(&server, "/dev/scenarios", wait(600_000)).await;

    let timeout = |ms: u64| json!({"name": "t", "steps": [{"tool": "bash", "input": {"command": "true"}, "timeout_ms": ms}]});
    refused_over_http(
        &server,
        "/dev/scenarios",
        timeout(3_600_001),
        "timeout_ms is 3600001; it must be between 1 and 3600000",
    )
    .await;
    refused_over_http(&server, "/dev/scenarios", timeout(0), "timeout_ms is 0").await;
    accepted_over_http(&server, "/dev/scenarios", timeout(3_600_000)).await;

    let steps = |n: usize| json!({"name": "s", "steps": vec![json!({"wait_ms": 0}); n]});
    refused_over_http(
        &server,
        "/dev/scenarios",
        steps(1_001),
        "1001 steps; a scenario has at most 1000",
    )
    .await;
    accepted_over_http(&server, "/dev/scenarios", steps(1_000)).await;

    let memories = |n: usize| {
        let half: serde_json::Map<String, Value> = (0..n / 2)
            .map(|i| (format!("/m{i}.md"), json!("x")))
            .collect();
        let rest: serde_json::Map<String, Value> = (n / 2..n)
            .map(|i| (format!("/m{i}.md"), json!("x")))
            .collect();
        json!({"name": "m", "memory_stores": [
            {"key": "a", "name": "A", "memories": half},
            {"key": "b", "name": "B", "memories": rest}
        ]})
    };
    refused_over_http(
        &server,
        "/dev/scenarios",
        memories(2_001),
        "2001 memories; a scenario seeds at most 2000",
    )
    .await;
    accepted_over_http(&server, "/dev/scenarios", memories(2_000)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fault_rules_are_refused_above_their_bound_and_accepted_at_it() {
    let server = TestServer::start().await;
    let rule = |latency_ms: u64, times: u64| json!({"path": "/nowhere", "latency_ms": latency_ms, "times": times});
    refused_over_http(
        &server,
        "/dev/faults",
        json!({"rules": [rule(600_001, 1)]}),
        "latency_ms is 600001",
    )
    .await;
    refused_over_http(
        &server,
        "/dev/faults",
        json!({"rules": [rule(1, 1_000_001)]}),
        "times is 1000001",
    )
    .await;
    refused_over_http(
        &server,
        "/dev/faults",
        json!({"rules": vec![rule(1, 1); 101]}),
        "101 fault rules; at most 100",
    )
    .await;
    let body = accepted_over_http(
        &server,
        "/dev/faults",
        json!({"rules": vec![rule(600_000, 1_000_000); 99]}),
    )
    .await;
    assert_eq!(body["rules"].as_array().unwrap().len(), 99);
    accepted_over_http(&server, "/dev/faults", json!({"rules": [rule(1, 1)]})).await;
    // The 101st, added later, is refused too.
    refused_over_http(
        &server,
        "/dev/faults",
        json!({"rules": [rule(1, 1)]}),
        "101 fault rules",
    )
    .await;
    let list = server.dev(Method::GET, "/dev/faults", None).await.ok();
    assert_eq!(list["rules"].as_array().unwrap().len(), 100);
}
