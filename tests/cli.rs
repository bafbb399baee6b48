//! The `envworker` binary as users run it.

mod common;

use std::process::Command;

use common::process::DevserverProcess;

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
    assert!(names.contains(&"devserver"), "{help}");
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
