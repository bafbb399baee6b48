//! The binary as users run it: `envworker serve` in container mode behind
//! the devserver's signed webhooks (SIGTERM mid-session loses no edit),
//! `envworker run` as a sandbox entrypoint, and `envworker dev`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::serve_stack::{Serve, free_port, stack, stack_without_webhooks};
use crate::common::{ADMIN_KEY, TestServer};
use envworker::devserver::DevserverConfig;
use envworker::webhook::SigningKey;
use reqwest::Method;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn serve_drains_on_a_signed_webhook_and_the_scenario_passes() {
    let stack = stack(&[]).await;
    let started = stack
        .start(crate::common::scenario("notes-roundtrip"))
        .await;
    stack.passed_report(&started.session_id).await;
    let logs = stack.serve.logs();
    assert!(
        logs.contains("webhook accepted; draining the queue"),
        "{logs}"
    );
    for secret in [stack.secret.as_str(), stack.started_env.1.as_str()] {
        assert!(!logs.contains(secret), "a secret reached the logs");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_whose_webhook_is_lost_is_served_by_the_periodic_queue_check() {
    let stack = stack_without_webhooks(&["--queue-check-interval", "2s"]).await;
    // Queued after the look at start, and its webhook never arrives.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !stack.serve.logs().contains("queue drained") {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            stack.serve.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let started = stack
        .start(json!({"name": "lost-webhook", "steps": [{"tool": "bash", "input": {"command": "echo served"}, "expect": {"contains": "served"}}]}))
        .await;
    let t0 = std::time::Instant::now();
    stack.passed_report(&started.session_id).await;
    let logs = stack.serve.logs();
    assert!(
        logs.contains("the queue check found work no webhook announced"),
        "{logs}"
    );
    assert!(!logs.contains("webhook accepted"), "{logs}");
    println!("served {:?} after it was queued", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_mid_session_refuses_new_webhooks_and_loses_no_edit() {
    let mut stack = stack(&[]).await;
    let started = stack
        .start(json!({
            "name": "interrupted",
            "memory_stores": [{"key": "notes", "name": "Notes", "access": "read_write", "memories": {"/a.md": "alpha\n"}}],
            "steps": [
                {"tool": "write", "input": {"file_path": "{mount:notes}/draft.md", "content": "unsaved work\n"}},
                {"tool": "edit", "input": {"file_path": "{mount:notes}/a.md", "old_string": "alpha", "new_string": "omega"}},
                {"wait_ms": 60000},
                {"tool": "bash", "input": {"command": "true"}}
            ]
        }))
        .await;
    // Wait until both edits are on disk (their results were posted).
    loop {
        let results = stack.server.tool_results(&started.session_id).await.len();
        if results >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let url = stack.serve.url.clone();
    stack.serve.terminate();
    // While it shuts down, readiness and new deliveries are refused.
    tokio::time::sleep(Duration::from_millis(100)).await;
    if let Ok(r) = reqwest::get(format!("{url}/readyz")).await {
        assert_eq!(r.status(), 503);
    }
    let status = tokio::task::spawn_blocking({
        let mut serve = std::mem::replace(
            &mut stack.serve.child,
            Command::new("true").spawn().unwrap(),
        );
        move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                if let Some(s) = serve.try_wait().unwrap() {
                    return s;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "serve did not exit after SIGTERM"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    })
    .await
    .unwrap();
    assert!(
        status.success(),
        "exit status {status}: {}",
        stack.serve.logs()
    );
    let memories = stack.server.session_memories(&started.session_id).await;
    let content = |path: &str| memories.get(path).map(String::as_str);
    assert_eq!(
        content("/draft.md"),
        Some("unsaved work\n"),
        "{}",
        stack.serve.logs()
    );
    assert_eq!(content("/a.md"), Some("omega\n"));
    let logs = stack.serve.logs();
    assert!(logs.contains("shutting down"), "{logs}");
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_answers_health_readiness_and_refuses_bad_deliveries() {
    let stack = stack(&[]).await;
    let http = reqwest::Client::new();
    let url = &stack.serve.url;
    assert_eq!(
        http.get(format!("{url}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        http.get(format!("{url}/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let key = SigningKey::parse(&stack.secret).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let body = br#"{"type":"event","id":"whe_1","created_at":"2026-01-01T00:00:00Z","data":{"type":"session.created","id":"sesn_x"}}"#;
    let post = |id: &str, ts: i64, sig: String, body: &'static [u8], endpoint: &str| {
        http.post(format!("{url}/webhooks/{endpoint}"))
            .header("webhook-id", id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", sig)
            .body(body)
            .send()
    };
    // Another event type: ignored.
    let r = post("whe_1", now, key.sign("whe_1", now, body), body, "default")
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "ignored");
    // A wrong signature, a stale timestamp, an unknown endpoint.
    let r = post("whe_2", now, "v1,AAAA".into(), body, "default")
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = post(
        "whe_3",
        now - 600,
        key.sign("whe_3", now - 600, body),
        body,
        "default",
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 401);
    let r = post("whe_4", now, key.sign("whe_4", now, body), body, "nope")
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // A run-started event is accepted once; its replay is not worked twice.
    let run: &'static [u8] = br#"{"type":"event","id":"whe_5","created_at":"2026-01-01T00:00:00Z","data":{"type":"session.status_run_started","id":"sesn_x"}}"#;
    let r = post("whe_5", now, key.sign("whe_5", now, run), run, "default")
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let r = post("whe_5", now, key.sign("whe_5", now, run), run, "default")
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "duplicate");
    // Not JSON, validly signed.
    let junk: &'static [u8] = b"not json";
    let r = post("whe_6", now, key.sign("whe_6", now, junk), junk, "default")
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // Too large.
    let big = vec![b'x'; 512 * 1024];
    let r = http
        .post(format!("{url}/webhooks/default"))
        .header("webhook-id", "whe_7")
        .header("webhook-timestamp", now.to_string())
        .header("webhook-signature", key.sign("whe_7", now, &big))
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
}

#[tokio::test(flavor = "multi_thread")]
async fn run_serves_one_claimed_item_from_anthropic_variables() {
    let (server, _mnt) = devserver().await;
    let work = tempfile::tempdir().unwrap();
    let started = server
        .start_scenario(&crate::common::scenario("notes-roundtrip"))
        .await;
    let polled = server
        .worker(
            &started.environment_key,
            Method::GET,
            &format!(
                "/v1/environments/{}/work/poll?block_ms=900",
                started.environment_id
            ),
            None,
        )
        .await
        .ok();
    let work_id = polled["id"].as_str().unwrap().to_string();
    server
        .worker(
            &started.environment_key,
            Method::POST,
            &format!(
                "/v1/environments/{}/work/{work_id}/ack",
                started.environment_id
            ),
            None,
        )
        .await;
    let url = server.url();
    let (env_id, session_id, secret) = (
        started.environment_id.clone(),
        started.session_id.clone(),
        polled["secret"].as_str().unwrap().to_string(),
    );
    let workdir = work.path().to_str().unwrap().to_string();
    let out = tokio::task::spawn_blocking(move || {
        // No environment key: a sandbox that holds only the work secret.
        Command::new(env!("CARGO_BIN_EXE_envworker"))
            .args(["run", "--max-idle", "1s", "--memory-sync-interval", "5s"])
            .env_remove("ANTHROPIC_ENVIRONMENT_KEY")
            .envs([
                ("ANTHROPIC_BASE_URL", url.as_str()),
                ("ANTHROPIC_WORK_ID", work_id.as_str()),
                ("ANTHROPIC_ENVIRONMENT_ID", env_id.as_str()),
                ("ANTHROPIC_SESSION_ID", session_id.as_str()),
                ("ANTHROPIC_WORK_SECRET", secret.as_str()),
                ("ENVWORKER_WORKDIR", workdir.as_str()),
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = server
        .final_report(&started.session_id, Duration::from_secs(30))
        .await;
    assert_eq!(report["status"], "passed", "{report:#}");

    // Without ids it names the first one missing.
    let out = Command::new(env!("CARGO_BIN_EXE_envworker"))
        .arg("run")
        .env_remove("ANTHROPIC_WORK_ID")
        .env_remove("ANTHROPIC_ENVIRONMENT_ID")
        .env_remove("ANTHROPIC_SESSION_ID")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("run: work_id is required — pass --work-id or set ANTHROPIC_WORK_ID"),
        "{stderr}"
    );
}

#[test]
fn dev_runs_the_demo_scenario_end_to_end_and_exits_zero() {
    let out = Command::new(env!("CARGO_BIN_EXE_envworker"))
        .arg("dev")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("result: PASSED — 12/12 steps passed"),
        "{stdout}"
    );
    assert!(stdout.contains("tool      read  ok"), "{stdout}");
    assert!(stdout.contains("sync      1 pulled"), "{stdout}");
    assert!(
        stdout.contains("released  session ended (Idle)"),
        "{stdout}"
    );
}

#[test]
fn dev_exits_non_zero_when_the_scenario_fails() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("failing.json");
    std::fs::write(
        &path,
        r#"{"name": "failing", "steps": [{"tool": "bash", "input": {"command": "echo hi"}, "expect": {"contains": "bye"}}]}"#,
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_envworker"))
        .args(["dev", "--scenario", path.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(stdout.contains("result: FAILED"), "{stdout}");
    assert!(
        stdout.contains("expected the result to contain \"bye\""),
        "{stdout}"
    );
}

/// The value of one sample (`name{labels}` exactly as exported), if present.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_run_moves_the_metrics_and_logs_json_lines_without_secrets() {
    let stack = stack(&["--log-format", "json"]).await;
    let started = stack
        .start(json!({
            "name": "metrics",
            "memory_stores": [
                {"key": "notes", "name": "Notes", "access": "read_write", "memories": {"/style.md": "Prefer short answers.\n"}},
                {"key": "kb", "name": "Team KB", "access": "read_only", "memories": {"/faq.md": "Q?\n"}}
            ],
            "steps": [
                {"tool": "write", "input": {"file_path": "{mount:notes}/new.md", "content": "from the agent\n"}, "expect": {"is_error": false}},
                {"tool": "read", "input": {"file_path": "{mount:notes}/style.md"}, "expect": {"is_error": false}},
                {"tool": "write", "input": {"file_path": "{mount:kb}/x.md", "content": "no"}, "expect": {"is_error": true}},
                {"remote": {"op": "update", "store": "notes", "path": "/style.md", "content": "Be brief.\n"}},
                {"tool": "bash", "input": {"command": "ls {mount:notes}"}, "expect": {"contains": "new.md"}}
            ],
            "expect_final": {"notes": {"/style.md": "Be brief.\n", "/new.md": "from the agent\n"}}
        }))
        .await;
    let report = stack
        .server
        .final_report(&started.session_id, Duration::from_secs(60))
        .await;
    assert_eq!(
        report["status"],
        "passed",
        "{report:#}\n{}",
        stack.serve.logs()
    );

    // The item's counters land when its teardown is over.
    let client = reqwest::Client::new();
    let scrape = || async {
        let response = client
            .get(format!("{}/metrics", stack.serve.url))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        // The body is OpenMetrics (`# EOF`), and the header says so.
        assert_eq!(
            response.headers()["content-type"],
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        let text = response.text().await.unwrap();
        assert!(text.ends_with("# EOF\n"), "{text}");
        text
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let metrics = loop {
        let metrics = scrape().await;
        if sample(&metrics, r#"envworker_work_items_total{outcome="served"}"#) == Some(1.0) {
            break metrics;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the item was never counted:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let expect = |series: &str, check: &dyn Fn(f64) -> bool| {
        let value = sample(&metrics, series);
        assert!(value.is_some_and(check), "{series} = {value:?}\n{metrics}");
    };
    expect(
        r#"envworker_webhooks_total{endpoint="default",outcome="accepted"}"#,
        &|v| v >= 1.0,
    );
    expect("envworker_sessions_in_flight", &|v| v == 0.0);
    expect(
        r#"envworker_tool_calls_total{tool="write",outcome="ok"}"#,
        &|v| v == 1.0,
    );
    expect(
        r#"envworker_tool_calls_total{tool="write",outcome="error"}"#,
        &|v| v == 1.0,
    );
    expect(
        r#"envworker_tool_calls_total{tool="read",outcome="ok"}"#,
        &|v| v == 1.0,
    );
    expect(
        r#"envworker_tool_calls_total{tool="bash",outcome="ok"}"#,
        &|v| v == 1.0,
    );
    expect(
        r#"envworker_tool_call_duration_seconds_count{tool="write"}"#,
        &|v| v == 2.0,
    );
    expect(r#"envworker_memory_syncs_total{kind="final"}"#, &|v| {
        v == 1.0
    });
    // The new file went up; the remote edit came down.
    expect("envworker_memory_uploads_total", &|v| v >= 1.0);
    expect("envworker_memory_pulls_total", &|v| v >= 1.0);
    expect("envworker_memory_conflicts_total", &|v| v == 0.0);
    expect("envworker_memory_flush_cutoffs_total", &|v| v == 0.0);
    expect("envworker_lease_losses_total", &|v| v == 0.0);
    // The item waited from its creation to its claim; the build is named.
    expect(
        r#"envworker_work_queue_wait_seconds_count{endpoint="default"}"#,
        &|v| v == 1.0,
    );
    assert!(
        metrics.contains(&format!(
            "envworker_build_info{{version=\"{}\",git_sha=",
            env!("CARGO_PKG_VERSION")
        )),
        "{metrics}"
    );

    // A bad delivery is counted under its outcome.
    let refused = client
        .post(format!("{}/webhooks/default", stack.serve.url))
        .header("webhook-id", "msg_x")
        .header("webhook-timestamp", "1")
        .header("webhook-signature", "v1,AAAA")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let metrics = scrape().await;
    assert_eq!(
        sample(
            &metrics,
            r#"envworker_webhooks_total{endpoint="default",outcome="unauthorized"}"#
        ),
        Some(1.0),
        "{metrics}"
    );

    // Every line the process wrote is JSON: stdout (the line announcing the
    // URL, which keeps its text as `message` and the URL as `url`) and stderr.
    let stdout = stack.serve.stdout.lock().unwrap().clone();
    assert!(!stdout.is_empty());
    for line in &stdout {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("stdout not JSON ({e}): {line}"));
        assert_eq!(v["url"], stack.serve.url.as_str(), "{line}");
        assert_eq!(v["level"], "INFO", "{line}");
    }
    // Logs: one JSON object per line, the item's lines carry its ids.
    let logs = stack.serve.logs();
    let lines: Vec<Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["session_id"] == started.session_id.as_str()
                && l["work_id"].as_str().is_some_and(|w| !w.is_empty())
                && l["message"] == "work item done"),
        "{logs}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["memory_store.id"].as_str().is_some_and(|s| !s.is_empty())),
        "{logs}"
    );
    // No secret of the run: the environment key, the signing key (whole or
    // its key material), any sessions token or work secret the devserver minted.
    let key_material = stack.secret.trim_start_matches("whsec_");
    let work_secret_prefix = &base64::Engine::encode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        br#"{"sessions_token":"#,
    )[..20];
    for (what, secret) in [
        ("environment key", stack.started_env.1.as_str()),
        ("signing key", stack.secret.as_str()),
        ("signing key material", key_material),
        ("sessions token", "sk-ant-sesstok-"),
        ("work secret", work_secret_prefix),
    ] {
        assert!(!logs.contains(secret), "the {what} reached the logs");
    }
}

/// The agent's commands run as the worker's user. Scrubbing their
/// environment is not enough if they can read the worker's own from
/// `/proc/<pid>/environ`: envworker marks itself non-dumpable at start, so
/// they cannot (nor attach to it). The control — a plain process of the same
/// user with the same environment — shows the check would see a leak.
#[test]
fn the_agents_user_cannot_read_the_workers_environment_from_proc() {
    use std::os::unix::process::CommandExt;
    const SECRET: &str = "sk-ant-envkey-proc-canary-5f1c";
    // As root every /proc file is readable: run both sides as `nobody`.
    let as_user = |command: &mut Command| {
        if rustix::process::geteuid().is_root() {
            command.uid(65534).gid(65534);
        }
    };
    let read_environ = |pid: u32| {
        let mut cat = Command::new("cat");
        cat.arg(format!("/proc/{pid}/environ"));
        as_user(&mut cat);
        let out = cat.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).contains(SECRET),
        )
    };

    let mut control = Command::new("sleep");
    control.arg("30").env("ANTHROPIC_ENVIRONMENT_KEY", SECRET);
    as_user(&mut control);
    let mut control = control.spawn().unwrap();
    assert_eq!(
        read_environ(control.id()),
        (true, true),
        "the control must leak"
    );
    let _ = control.kill();
    let _ = control.wait();

    let mut worker = Command::new(env!("CARGO_BIN_EXE_envworker"));
    worker
        .args(["devserver", "--listen", "127.0.0.1:0", "--admin-key", "k"])
        .env("ANTHROPIC_ENVIRONMENT_KEY", SECRET)
        .env("TMPDIR", "/tmp")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    as_user(&mut worker);
    let mut worker = worker.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(worker.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.contains("listening"),
        "the worker did not start: {line:?}"
    );
    let (readable, leaked) = read_environ(worker.id());
    let _ = worker.kill();
    let _ = worker.wait();
    assert!(!leaked, "the worker's environment was readable from /proc");
    assert!(!readable, "reading /proc/<pid>/environ should be refused");
}

/// With several endpoints, no endpoint's agent sees any endpoint's secrets:
/// the variables a config file names are kept from every shell, not only
/// from the endpoint they belong to.
#[tokio::test(flavor = "multi_thread")]
async fn one_endpoints_agent_cannot_read_another_endpoints_keys() {
    let port = free_port();
    let (_key_a, secret_a) = SigningKey::generate();
    let (_key_b, secret_b) = SigningKey::generate();
    let mnt = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(
        DevserverConfig::new(ADMIN_KEY)
            .mount_root(mnt.path().join("memory").to_str().unwrap())
            .webhook(
                format!("http://127.0.0.1:{port}/webhooks/team-a"),
                SigningKey::parse(&secret_a).unwrap(),
            ),
    )
    .await;
    let mut envs = Vec::new();
    for _ in 0..2 {
        envs.push(server.create_environment().await);
    }
    let config = work.path().join("envworker.toml");
    std::fs::write(
        &config,
        format!(
            r#"base_url = "{url}"
[[endpoint]]
name = "team-a"
signing_keys_env = ["TEAM_A_WHSEC"]
environment_id = "{a}"
environment_key_env = "TEAM_A_ENV_KEY"
workdir = "{wa}"

[[endpoint]]
name = "team-b"
signing_keys_env = ["TEAM_B_WHSEC"]
environment_id = "{b}"
environment_key_env = "TEAM_B_ENV_KEY"
workdir = "{wb}"
"#,
            url = server.url(),
            a = envs[0].0,
            b = envs[1].0,
            wa = work.path().join("a").display(),
            wb = work.path().join("b").display(),
        ),
    )
    .unwrap();
    let serve = Serve::start(
        port,
        &[
            ("TEAM_A_WHSEC", secret_a.as_str()),
            ("TEAM_A_ENV_KEY", envs[0].1.as_str()),
            ("TEAM_B_WHSEC", secret_b.as_str()),
            ("TEAM_B_ENV_KEY", envs[1].1.as_str()),
        ],
        &[
            "--config",
            config.to_str().unwrap(),
            "--max-idle",
            "1s",
            "--memory-sync-interval",
            "5s",
        ],
    );
    let started = server
        .start_scenario(&json!({
            "name": "neighbours",
            "environment_id": envs[0].0,
            "steps": [{"tool": "bash", "input": {"command": "env"},
                       "expect": {"is_error": false,
                                  "not_contains": "sk-ant-envkey-dev-",
                                  "contains": "PATH="}},
                      {"tool": "bash", "input": {"command": "env | grep -c TEAM_ || true"},
                       "expect": {"contains": "0"}}]
        }))
        .await;
    let report = server
        .final_report(&started.session_id, Duration::from_secs(60))
        .await;
    assert_eq!(report["status"], "passed", "{report:#}\n{}", serve.logs());
    let logs = serve.logs();
    for secret in [
        secret_a.as_str(),
        secret_b.as_str(),
        envs[0].1.as_str(),
        envs[1].1.as_str(),
    ] {
        assert!(!logs.contains(secret), "a secret reached the logs");
    }
}

/// A devserver whose sessions mount their stores in a temporary folder
/// (kept as long as the returned guard).
async fn devserver() -> (TestServer, tempfile::TempDir) {
    let mnt = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(
        DevserverConfig::new(ADMIN_KEY).mount_root(mnt.path().join("memory").to_str().unwrap()),
    )
    .await;
    (server, mnt)
}

/// Run `envworker poll --on-work command` (its `RLIMIT_NOFILE` at `nofile`)
/// until `started`'s report is final, then stop it: the report, the
/// poller's output and its logs.
async fn poll_until_reported(
    server: &TestServer,
    started: &crate::common::Started,
    command: &str,
    nofile: Option<(u64, u64)>,
) -> (Value, std::process::Output, String) {
    let poll = crate::common::toolbox::spawn_poll_limited(&server.url(), started, command, nofile);
    let report = server
        .final_report(&started.session_id, Duration::from_secs(60))
        .await;
    let _ = Command::new("kill")
        .args(["-TERM", &poll.id().to_string()])
        .status();
    let out = tokio::task::spawn_blocking(move || poll.wait_with_output().unwrap())
        .await
        .unwrap();
    let logs = String::from_utf8_lossy(&out.stderr).into_owned();
    (report, out, logs)
}

/// `envworker poll --on-work CMD` as the reference's sandbox launcher: the
/// command gets the item on stdin and the `ANTHROPIC_*` variables, and an
/// `envworker run` inside it serves the session.
#[tokio::test(flavor = "multi_thread")]
async fn poll_hands_each_item_to_the_on_work_command_and_run_serves_it() {
    let (server, _mnt) = devserver().await;
    let work = tempfile::tempdir().unwrap();
    let started = server
        .start_scenario(&crate::common::scenario("notes-roundtrip"))
        .await;
    let dir = work.path().to_path_buf();
    let command = format!(
        "cat > {d}/item.json; env | grep '^ANTHROPIC_' | sort > {d}/env.txt; \
         exec {bin} run --max-idle 1s --memory-sync-interval 5s --workdir {d}",
        d = dir.display(),
        bin = env!("CARGO_BIN_EXE_envworker"),
    );
    let (report, out, logs) = poll_until_reported(&server, &started, &command, None).await;
    assert_eq!(report["status"], "passed", "{report:#}\n{logs}");
    assert!(out.status.success(), "{logs}");

    let item: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("item.json")).unwrap()).unwrap();
    assert_eq!(item["data"]["id"], started.session_id.as_str());
    let env = std::fs::read_to_string(dir.join("env.txt")).unwrap();
    for expected in [
        format!("ANTHROPIC_SESSION_ID={}", started.session_id),
        format!("ANTHROPIC_ENVIRONMENT_ID={}", started.environment_id),
        format!("ANTHROPIC_ENVIRONMENT_KEY={}", started.environment_key),
        format!("ANTHROPIC_BASE_URL={}", server.url()),
        format!("ANTHROPIC_WORK_ID={}", item["id"].as_str().unwrap()),
        format!("ANTHROPIC_WORK_SECRET={}", item["secret"].as_str().unwrap()),
    ] {
        assert!(
            env.lines().any(|l| l == expected),
            "{expected} missing:\n{env}"
        );
    }
    assert!(
        !logs.contains(&started.environment_key),
        "a key reached the logs"
    );
    assert!(
        !logs.contains(item["secret"].as_str().unwrap()),
        "the work secret reached the logs"
    );
}

/// The poller raises its own descriptor limit; the `--on-work` command, the
/// `envworker run` inside it and so the agent's shell get the limit the
/// poller was started with (before: the raised one, recorded by `run` as
/// its original and handed on to the agent).
#[tokio::test(flavor = "multi_thread")]
async fn the_on_work_command_and_the_agents_bash_keep_the_pollers_original_descriptor_limit() {
    let (server, _mnt) = devserver().await;
    let work = tempfile::tempdir().unwrap();
    let started = server
        .start_scenario(&json!({
            "name": "on-work-ulimit",
            "steps": [
                {"tool": "bash", "input": {"command": "echo soft=$(ulimit -Sn) hard=$(ulimit -Hn)"},
                 "expect": {"contains": "soft=1000 hard=4096"}}
            ]
        }))
        .await;
    let dir = work.path().to_path_buf();
    let command = format!(
        "ulimit -Sn > {d}/sh_nofile; \
         exec {bin} run --max-idle 1s --memory-sync-interval 5s --workdir {d}",
        d = dir.display(),
        bin = env!("CARGO_BIN_EXE_envworker"),
    );
    let (report, _, logs) =
        poll_until_reported(&server, &started, &command, Some((1000, 4096))).await;
    let sh = std::fs::read_to_string(dir.join("sh_nofile")).unwrap();
    assert_eq!(sh.trim(), "1000", "the --on-work shell's soft limit");
    assert_eq!(report["status"], "passed", "{report:#}\n{logs}");
}

/// An `--on-work` command that cannot run would leave every item it is
/// handed acked and unserved: the item is stopped and the poller exits.
#[tokio::test(flavor = "multi_thread")]
async fn an_on_work_command_that_cannot_run_stops_the_item_and_the_poller() {
    let (server, _mnt) = devserver().await;
    let started = server
        .start_scenario(&crate::common::scenario("notes-roundtrip"))
        .await;
    let url = server.url();
    let (env_id, env_key) = (
        started.environment_id.clone(),
        started.environment_key.clone(),
    );
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_envworker"))
            .args(["poll", "--on-work", "/nonexistent/spawn.sh"])
            .envs([
                ("ANTHROPIC_BASE_URL", url.as_str()),
                ("ANTHROPIC_ENVIRONMENT_ID", env_id.as_str()),
                ("ANTHROPIC_ENVIRONMENT_KEY", env_key.as_str()),
            ])
            .output()
            .unwrap()
    });
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .expect("the poller exits")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("the --on-work command \"/nonexistent/spawn.sh\" cannot be run"),
        "{stderr}"
    );
    let work = server
        .agents(
            Method::GET,
            &format!("/v1/environments/{}/work", started.environment_id),
            None,
        )
        .await
        .ok();
    assert_eq!(work["data"][0]["state"], "stopped", "{work:#}");
}

/// `serve` with an environment key the API refuses: before, `/readyz`
/// answered 200 and one WARN was all an operator saw. Now readiness is 503
/// naming the endpoint and the cause, the log says what to fix, and the
/// refusals are counted — while deliveries are still accepted (202): the
/// queue keeps the work for when the key is mended.
#[tokio::test(flavor = "multi_thread")]
async fn serve_with_a_refused_key_is_unready_and_says_why() {
    let stack = stack(&["--environment-key", "sk-ant-envkey-wrong"]).await;
    let http = reqwest::Client::new();
    let url = &stack.serve.url;
    // The start-up look at the queue already met the refusal; /readyz probes otherwise.
    let r = http.get(format!("{url}/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], "unready", "{body}");
    assert_eq!(
        body["endpoints"]["default"]["cause"], "credentials_refused",
        "{body}"
    );
    assert_eq!(body["endpoints"]["default"]["class"], "auth", "{body}");
    let delivered = stack
        .deliver_run_started(&http, "whe_refused", "sesn_x")
        .await
        .unwrap();
    assert_eq!(delivered.status(), 202);
    let logs = stack.serve.logs();
    assert!(
        logs.contains(
            "the API refused the environment key; /readyz answers 503 until a request with it succeeds"
        ),
        "{logs}"
    );
    assert!(
        !logs.contains("sk-ant-envkey-wrong"),
        "the key reached the logs"
    );
    let metrics = http
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let auth_errors = sample(
        &metrics,
        r#"envworker_poll_errors_total{endpoint="default",class="auth"}"#,
    );
    assert!(auth_errors.is_some_and(|v| v >= 1.0), "{metrics}");
    // Liveness holds: a restart would not mend the key.
    let r = http.get(format!("{url}/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

/// A `serve` started with these flags and these variables, and what it must show.
type ServeCase<'a, T> = (&'a [&'a str], &'a [(&'a str, &'a str)], T);

/// Wait until serve's logs hold `want`, at most 20 s.
async fn logged(stack: &crate::common::serve_stack::Stack, want: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !stack.serve.logs().contains(want) {
        assert!(
            std::time::Instant::now() < deadline,
            "no {want:?} in:\n{}",
            stack.serve.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_says_at_start_where_sessions_work_and_names_the_flag() {
    let shared = "sessions run one after another in the shared workdir";
    let cases: [ServeCase<&str>; 5] = [
        (&[], &[], shared),
        (&[], &[], "--fresh-workdir (ENVWORKER_FRESH_WORKDIR"),
        (
            &["--fresh-workdir"],
            &[],
            "own fresh directory under the workdir (--fresh-workdir)",
        ),
        (
            &[],
            &[("ENVWORKER_FRESH_WORKDIR", "true")],
            "own fresh directory under the workdir (--fresh-workdir)",
        ),
        (
            &["--max-concurrent-items", "2"],
            &[],
            "own fresh directory under the workdir, as several run at once",
        ),
    ];
    for (extra, envs, want) in cases {
        let stack = crate::common::serve_stack::stack_without_webhooks_env(extra, envs).await;
        logged(&stack, want).await;
        if want != shared && !want.contains("ENVWORKER_FRESH_WORKDIR") {
            assert!(!stack.serve.logs().contains(shared), "{extra:?} {envs:?}");
        }
    }
}

/// With a 60 s interval, an edit the agent makes is on the server within a
/// few seconds only when the change-driven push was asked for: by default
/// (as the reference) it waits for the next sync, here the final one.
#[tokio::test(flavor = "multi_thread")]
async fn the_memory_push_is_off_by_default_and_on_with_its_flag_or_its_variable() {
    let cases: [ServeCase<bool>; 4] = [
        (&["--memory-sync-interval", "60s"], &[], false),
        (
            &["--memory-sync-interval", "60s", "--memory-push"],
            &[],
            true,
        ),
        (
            &["--memory-sync-interval", "60s"],
            &[("ENVWORKER_MEMORY_PUSH", "true")],
            true,
        ),
        (
            &["--memory-sync-interval", "60s", "--memory-push=false"],
            &[],
            false,
        ),
    ];
    for (extra, envs, pushed) in cases {
        let stack = crate::common::serve_stack::stack_without_webhooks_env(extra, envs).await;
        let started = stack
            .start(json!({
                "name": "push",
                "memory_stores": [{"key": "notes", "name": "Notes", "access": "read_write", "memories": {"/a.md": "alpha\n"}}],
                "steps": [
                    {"tool": "write", "input": {"file_path": "{mount:notes}/pushed.md", "content": "edited\n"}},
                    {"wait_ms": 6000},
                    {"tool": "bash", "input": {"command": "true"}}
                ]
            }))
            .await;
        stack
            .deliver_run_started(&reqwest::Client::new(), "msg_push", &started.session_id)
            .await
            .unwrap();
        while stack
            .server
            .tool_results(&started.session_id)
            .await
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_secs(4)).await;
        let on_server = stack
            .server
            .session_memories(&started.session_id)
            .await
            .contains_key("/pushed.md");
        assert_eq!(on_server, pushed, "{extra:?} {envs:?}");
        // Either way the edit is saved by the session's end.
        let report = stack.passed_report(&started.session_id).await;
        assert_eq!(
            report["final_contents"]["notes"]["/pushed.md"], "edited\n",
            "{extra:?} {envs:?}"
        );
    }
}
