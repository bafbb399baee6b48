//! The `envworker` binary as users run it.

use std::process::Command;

use crate::common::process::DevserverProcess;

fn envworker() -> Command {
    Command::new(env!("CARGO_BIN_EXE_envworker"))
}

#[test]
fn help_lists_every_subcommand_with_a_purpose() {
    let out = envworker().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect();
    let names: Vec<&str> = commands
        .iter()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    for name in ["dev", "serve", "poll", "run", "devserver", "webhook"] {
        assert!(names.contains(&name), "{name} missing: {help}");
    }
    for line in &commands {
        let mut words = line.split_whitespace();
        let name = words.next().unwrap();
        assert!(
            words.count() >= 3,
            "{name} has no one-line purpose: {line:?}"
        );
    }
}

#[test]
fn devserver_refuses_a_missing_or_empty_admin_key() {
    let out = envworker()
        .args(["devserver", "--listen", "127.0.0.1:0"])
        .env_remove("ENVWORKER_DEVSERVER_ADMIN_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--admin-key"));

    let out = envworker()
        .args(["devserver", "--listen", "127.0.0.1:0", "--admin-key", ""])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("admin key must not be empty"));
}

#[test]
fn the_admin_key_is_read_from_the_environment_and_never_printed() {
    let out = envworker()
        .args(["devserver", "--help"])
        .env("ENVWORKER_DEVSERVER_ADMIN_KEY", "s3cr3t-admin")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("ENVWORKER_DEVSERVER_ADMIN_KEY"), "{help}");
    assert!(!help.contains("s3cr3t-admin"), "{help}");
}

#[tokio::test]
async fn a_data_dir_survives_sigterm_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let http = reqwest::Client::new();
    let call = |url: String, method: reqwest::Method, body: Option<serde_json::Value>| {
        let mut rb = http
            .request(method, url)
            .bearer_auth("cli-key")
            .header("anthropic-version", "2023-06-01")
            .header("anthropic-beta", "agent-memory-2026-07-22");
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        async move {
            let r = rb.send().await.unwrap();
            assert!(r.status().is_success(), "{}", r.status());
            r.json::<serde_json::Value>().await.unwrap()
        }
    };

    let mut first = DevserverProcess::start("cli-key", &["--data-dir", data_dir]);
    let store = call(
        format!("{}/v1/memory_stores", first.url),
        reqwest::Method::POST,
        Some(serde_json::json!({"name": "kept"})),
    )
    .await;
    let id = store["id"].as_str().unwrap().to_string();
    // SIGTERM: a graceful stop, exit status 0.
    let pid = first.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = first.child.wait().unwrap();
    assert!(status.success(), "{status}");

    let second = DevserverProcess::start("cli-key", &["--data-dir", data_dir]);
    let got = call(
        format!("{}/v1/memory_stores/{id}", second.url),
        reqwest::Method::GET,
        None,
    )
    .await;
    assert_eq!(got["name"], "kept");
}

#[tokio::test]
async fn devserver_flags_for_faults_mount_root_and_webhooks() {
    let server = DevserverProcess::start(
        "flag-key",
        &[
            "--fault",
            "GET /v1/memory_stores:status=529,times=1",
            "--mount-root",
            "/srv/agents/memory",
        ],
    );
    let http = reqwest::Client::new();
    let get = || {
        http.get(format!("{}/v1/memory_stores", server.url))
            .header("x-api-key", "flag-key")
            .header("anthropic-version", "2023-06-01")
            .header("anthropic-beta", "agent-memory-2026-07-22")
            .send()
    };
    let first = get().await.unwrap();
    assert_eq!(first.status(), 529);
    let body: serde_json::Value = first.json().await.unwrap();
    assert_eq!(body["error"]["type"], "overloaded_error");
    assert_eq!(
        get().await.unwrap().status(),
        200,
        "times=1 retires the fault"
    );

    let store: serde_json::Value = http
        .post(format!("{}/v1/memory_stores", server.url))
        .header("x-api-key", "flag-key")
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "agent-memory-2026-07-22")
        .json(&serde_json::json!({"name": "Mounted Here"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let started: serde_json::Value = http
        .post(format!("{}/dev/scenarios", server.url))
        .header("x-api-key", "flag-key")
        .json(&serde_json::json!({"name": "m", "memory_stores": [{"key": "k", "name": "Mounted Here"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let report: serde_json::Value = http
        .get(format!(
            "{}/dev/scenarios/{}",
            server.url,
            started["session_id"].as_str().unwrap()
        ))
        .header("x-api-key", "flag-key")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        report["stores"]["k"]["mount_path"],
        "/srv/agents/memory/mounted-here"
    );
    assert!(store["id"].is_string());
}

#[test]
fn bad_devserver_flags_are_refused_with_a_clear_message() {
    for (args, needle) in [
        (vec!["--fault", "nonsense"], "fault"),
        (
            vec!["--webhook-url", "http://127.0.0.1:9/hook"],
            "--webhook-secret",
        ),
        (
            vec![
                "--webhook-url",
                "http://127.0.0.1:9/hook",
                "--webhook-secret",
                "not-a-key",
            ],
            "whsec_",
        ),
        (vec!["--mount-root", "relative/path"], "absolute"),
        (vec!["--lease-ttl", "0"], "lease TTL"),
    ] {
        let out = envworker()
            .args(["devserver", "--listen", "127.0.0.1:0", "--admin-key", "k"])
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

/// With `--log-format json` even a failure at start is JSON only: the
/// `envworker failed` log line, no plain `envworker: …` line beside it.
#[test]
fn a_failure_at_start_writes_only_json_lines_in_json_mode() {
    let out = envworker()
        .args(["--log-format", "json", "serve", "--listen", "127.0.0.1:0"])
        .env_remove("ANTHROPIC_ENVIRONMENT_ID")
        .env_remove("ENVWORKER_CONFIG")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["message"] == "envworker failed"
            && l["error"]
                .as_str()
                .unwrap()
                .contains("ANTHROPIC_ENVIRONMENT_ID")),
        "{text}"
    );
}

/// The manual's table of deliberate differences from the official worker
/// (`docs/src/divergences.md`) names flags: each is one `envworker serve`
/// accepts, under that name, with the variable the table gives it, so the
/// table cannot point at a flag that does not exist.
#[test]
fn every_flag_the_divergence_table_names_is_accepted() {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/src/divergences.md"
    ))
    .unwrap();
    let start = page
        .find("# Where envworker differs from the official worker")
        .expect("the divergence table is in the manual");
    let section = &page[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let rows: Vec<&str> = section.lines().filter(|l| l.starts_with("| ")).collect();
    assert!(
        rows.len() >= 10,
        "the table lists the differences: {rows:?}"
    );
    let mut flags: Vec<String> = section
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("--") && w[2..].starts_with(|c: char| c.is_ascii_lowercase()))
        .map(str::to_string)
        .collect();
    flags.sort();
    flags.dedup();
    for want in [
        "--fresh-workdir",
        "--memory-push",
        "--max-concurrent-items",
        "--shell-sandbox",
    ] {
        assert!(
            flags.iter().any(|f| f == want),
            "{want} is named: {flags:?}"
        );
    }
    let help = String::from_utf8(
        envworker()
            .args(["serve", "--help"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    for flag in &flags {
        assert!(
            help.split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '[')
                .any(|w| w == flag),
            "{flag} (named in the manual's divergence table) is not a flag of envworker serve"
        );
    }
    // The two switches also read their variables.
    for var in ["ENVWORKER_FRESH_WORKDIR", "ENVWORKER_MEMORY_PUSH"] {
        assert!(help.contains(var), "{var} in serve --help");
    }
}
