//! One scenario served end to end, on a fresh devserver, by either worker:
//! the official SDK's `EnvironmentWorker` (through `tests/conformance/sdk_worker.py`)
//! or envworker's. Both get the same scenario file and the same checks.

use std::path::Path;
use std::time::Duration;

use envworker::api::types::Redacted;
use envworker::devserver::DevserverConfig;
use envworker::memory::options::SyncInterval;
use envworker::worker::poll::DrainOptions;
use envworker::worker::{EnvironmentWorker, WorkerOptions};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{ADMIN_KEY, TestServer, scenario, sdk};

pub struct Served {
    pub report: Value,
}

fn check(name: &str, doc: &Value, report: &Value, mount_root: &Path) {
    assert_eq!(report["status"], "passed", "{name}: {report:#}");
    assert_eq!(report["failures"], serde_json::json!([]));
    // Every store the scenario names holds exactly what it expects.
    for (key, want) in doc["expect_final"].as_object().into_iter().flatten() {
        assert_eq!(&report["final_contents"][key], want, "{name}: store {key}");
    }
    // The worker removed the folders it mounted.
    assert_eq!(
        std::fs::read_dir(mount_root)
            .map(|d| d.count())
            .unwrap_or(0),
        0,
        "{name}: mount folders left behind"
    );
}

/// The SDK's worker serves scenario `name` (a file of `events/scenarios/`).
pub async fn by_the_sdk(name: &str) -> Served {
    let mnt = tempfile::tempdir().unwrap();
    let workdir = tempfile::tempdir().unwrap();
    let mount_root = mnt.path().join("memory");
    let server = TestServer::start_with(
        DevserverConfig::new(ADMIN_KEY).mount_root(mount_root.to_str().unwrap()),
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
    check(name, &doc, &report, &mount_root);
    Served { report }
}

/// envworker's worker serves scenario `name`, with the SDK worker's settings
/// (5 s sync interval, the queue drained once).
pub async fn by_envworker(name: &str) -> Served {
    let mnt = tempfile::tempdir().unwrap();
    let workdir = tempfile::tempdir().unwrap();
    let mount_root = mnt.path().join("memory");
    let server = TestServer::start_with(
        DevserverConfig::new(ADMIN_KEY).mount_root(mount_root.to_str().unwrap()),
    )
    .await;
    let doc = scenario(name);
    let started = server.start_scenario(&doc).await;
    let mut options = WorkerOptions::new(&started.environment_id, server.url());
    options.environment_key = Some(Redacted::new(started.environment_key.clone()));
    options.workdir = workdir.path().to_path_buf();
    options.max_idle = Some(Duration::from_secs(1));
    options.memory_sync_interval = SyncInterval::every(Duration::from_secs(5)).unwrap();
    let worker = EnvironmentWorker::new(options).unwrap();
    let drained = worker
        .drain(CancellationToken::new(), DrainOptions::default())
        .await
        .unwrap();
    assert_eq!(drained.items.len(), 1, "{name}: one item served");
    let report = server
        .final_report(&started.session_id, Duration::from_secs(60))
        .await;
    check(name, &doc, &report, &mount_root);
    Served { report }
}
