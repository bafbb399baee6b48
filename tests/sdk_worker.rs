//! The official SDK worker (`anthropic==2.10.0`, `EnvironmentWorker`) serves
//! scripted sessions from the devserver, as it would serve the real API:
//! the scenario report passes and the stores hold what the scenario expects.

mod common;

use std::time::Duration;

use common::{TestServer, scenario, sdk};
use envworker::devserver::DevserverConfig;
use serde_json::Value;

/// Run one scenario file end to end with the SDK worker; returns its report.
async fn served_by_the_sdk(name: &str) -> Value {
    let mnt = tempfile::tempdir().unwrap();
    let workdir = tempfile::tempdir().unwrap();
    let mount_root = mnt.path().join("memory");
    let server = TestServer::start_with(
        DevserverConfig::new(common::ADMIN_KEY).mount_root(mount_root.to_str().unwrap()),
    )
    .await;
    let doc = scenario(name);
    let started = server.start_scenario(&doc).await;
    let url = server.url();
    let work = workdir.path().to_str().unwrap().to_string();
    let s = started.clone();
    let out = tokio::task::spawn_blocking(move || {
        sdk::run_script(
            "sdk_worker.py",
            &[
                ("ENVWORKER_URL", &url),
                ("ENVWORKER_ENVIRONMENT_ID", &s.environment_id),
                ("ENVWORKER_ENVIRONMENT_KEY", &s.environment_key),
                ("ENVWORKER_WORKDIR", &work),
            ],
        )
    })
    .await
    .unwrap();
    assert!(out.contains("served work_"), "{out}");
    let report = server
        .final_report(&started.session_id, Duration::from_secs(60))
        .await;
    assert_eq!(report["status"], "passed", "{name}: {report:#}");
    assert_eq!(report["failures"], serde_json::json!([]));
    // Every store the scenario names holds exactly what it expects.
    for (key, want) in doc["expect_final"].as_object().unwrap() {
        assert_eq!(&report["final_contents"][key], want, "{name}: store {key}");
    }
    // The SDK removed the folders it mounted.
    assert!(
        std::fs::read_dir(&mount_root)
            .map(|d| d.count())
            .unwrap_or(0)
            == 0
    );
    report
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
