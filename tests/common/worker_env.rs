//! A devserver whose mount root and a workdir live in temporary folders,
//! and envworker's worker for a scenario started on it: the set-up the
//! worker's end-to-end tests share (`worker.rs`, `resilience.rs`).

use std::path::PathBuf;
use std::time::Duration;

use envworker::api::types::{PollWork, Redacted, Work};
use envworker::api::{Client, Credential};
use envworker::devserver::DevserverConfig;
use envworker::memory::options::SyncInterval;
use envworker::worker::{EnvironmentWorker, WorkerOptions};
use reqwest::Method;
use serde_json::Value;

use super::{ADMIN_KEY, Started, TestServer};

pub struct Env {
    pub server: TestServer,
    pub mnt: tempfile::TempDir,
    pub work: tempfile::TempDir,
}

impl Env {
    pub async fn new() -> Env {
        Env::with_ttl(30).await
    }

    /// A work item's lease lasts `ttl` seconds without a heartbeat.
    pub async fn with_ttl(ttl: i64) -> Env {
        let mnt = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let server = TestServer::start_with(
            DevserverConfig::new(ADMIN_KEY)
                .mount_root(mnt.path().join("memory").to_str().unwrap())
                .lease_ttl_seconds(ttl),
        )
        .await;
        Env { server, mnt, work }
    }

    pub fn mount_root(&self) -> PathBuf {
        self.mnt.path().join("memory")
    }

    /// The worker's options for the scenario's environment: quick to go
    /// idle, a sync every 5 s.
    pub fn options(&self, started: &Started) -> WorkerOptions {
        let mut o = WorkerOptions::new(&started.environment_id, self.server.url());
        o.environment_key = Some(Redacted::new(started.environment_key.clone()));
        o.workdir = self.work.path().to_path_buf();
        o.max_idle = Some(Duration::from_millis(500));
        o.memory_sync_interval = SyncInterval::every(Duration::from_secs(5)).unwrap();
        o.worker_id = "test-worker".into();
        o
    }

    /// A worker with [`Env::options`], changed by `tweak`.
    pub fn worker(
        &self,
        started: &Started,
        tweak: impl FnOnce(&mut WorkerOptions),
    ) -> EnvironmentWorker {
        let mut o = self.options(started);
        tweak(&mut o);
        EnvironmentWorker::new(o).unwrap()
    }

    /// Claim (poll + ack) the scenario's item with the environment key, as a poller would.
    pub async fn claim(&self, started: &Started) -> Work {
        let client = Client::builder(Credential::bearer(started.environment_key.clone()))
            .base_url(self.server.url())
            .build()
            .unwrap();
        let queue = client.work(&started.environment_id);
        let work = queue
            .poll(
                &PollWork {
                    block_ms: Some(900),
                    reclaim_older_than_ms: None,
                },
                None,
            )
            .await
            .unwrap()
            .expect("a queued item");
        queue.ack(&work.id).await.unwrap();
        work
    }

    pub async fn work_state(&self, started: &Started, work_id: &str) -> String {
        self.server
            .agents(
                Method::GET,
                &format!("/v1/environments/{}/work/{work_id}", started.environment_id),
                None,
            )
            .await
            .ok()["state"]
            .as_str()
            .unwrap()
            .to_string()
    }

    pub async fn report(&self, started: &Started) -> Value {
        self.server
            .final_report(&started.session_id, Duration::from_secs(60))
            .await
    }

    pub async fn events(&self, started: &Started) -> Vec<Value> {
        self.server.events(&started.session_id).await
    }

    pub async fn results(&self, started: &Started) -> Vec<Value> {
        self.server.tool_results(&started.session_id).await
    }

    pub async fn fault(&self, rule: Value) {
        self.server.add_faults(vec![rule]).await;
    }
}
