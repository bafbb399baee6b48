//! Work queue endpoints of a self-hosted environment.

use reqwest::Method;
use serde_json::json;

use super::client::{ApiFamily, Client, Query};
use super::error::Error;
use super::seg;
use super::types::*;

/// The value of `expected_last_heartbeat` that claims an unclaimed lease.
pub const NO_HEARTBEAT: &str = "NO_HEARTBEAT";

/// `/v1/environments/{id}/work`.
pub struct WorkQueue<'a> {
    client: &'a Client,
    environment_id: String,
}

impl Client {
    pub fn work(&self, environment_id: &str) -> WorkQueue<'_> {
        WorkQueue {
            client: self,
            environment_id: environment_id.to_string(),
        }
    }
}

impl WorkQueue<'_> {
    fn base(&self) -> String {
        format!("/v1/environments/{}/work", seg(&self.environment_id))
    }

    fn one(&self, work_id: &str, action: &str) -> String {
        format!("{}/{}{}", self.base(), seg(work_id), action)
    }

    /// Claim the next item, or `None` when the queue is empty. `worker_id` is
    /// sent as `Anthropic-Worker-ID` so the queue's stats count this worker.
    pub async fn poll(
        &self,
        params: &PollWork,
        worker_id: Option<&str>,
    ) -> Result<Option<Work>, Error> {
        let query = Query::default()
            .opt("block_ms", params.block_ms)
            .opt("reclaim_older_than_ms", params.reclaim_older_than_ms);
        let mut rb = self
            .client
            .request(
                Method::GET,
                ApiFamily::ManagedAgents,
                &format!("{}/poll", self.base()),
            )
            .query(query.pairs());
        if let Some(worker_id) = worker_id {
            rb = rb.header("anthropic-worker-id", worker_id);
        }
        self.client.optional_json(rb).await
    }

    /// Acknowledge a claimed item (`queued → starting`).
    pub async fn ack(&self, work_id: &str) -> Result<Option<Work>, Error> {
        let rb = self.client.request(
            Method::POST,
            ApiFamily::ManagedAgents,
            &self.one(work_id, "/ack"),
        );
        self.client.optional_json(rb).await
    }

    /// Renew the lease. `expected_last_heartbeat` is [`NO_HEARTBEAT`] first,
    /// then the previous answer's `last_heartbeat`, byte for byte.
    pub(crate) async fn heartbeat(
        &self,
        work_id: &str,
        expected_last_heartbeat: &str,
        desired_ttl_seconds: Option<u64>,
    ) -> Result<Heartbeat, Error> {
        let query = Query::default()
            .opt("expected_last_heartbeat", Some(expected_last_heartbeat))
            .opt("desired_ttl_seconds", desired_ttl_seconds);
        let rb = self
            .client
            .request(
                Method::POST,
                ApiFamily::ManagedAgents,
                &self.one(work_id, "/heartbeat"),
            )
            .query(query.pairs());
        self.client.json(rb).await
    }

    /// Ask the item to stop (`force: false` → `stopping`) or stop it now
    /// (`force: true` → `stopped`). The API may answer 204.
    pub async fn stop(&self, work_id: &str, force: bool) -> Result<(), Error> {
        let rb = self
            .client
            .request(
                Method::POST,
                ApiFamily::ManagedAgents,
                &self.one(work_id, "/stop"),
            )
            .json(&json!({ "force": force }));
        self.client.discard(rb).await
    }

    pub async fn retrieve(&self, work_id: &str) -> Result<Work, Error> {
        let rb = self.client.request(
            Method::GET,
            ApiFamily::ManagedAgents,
            &self.one(work_id, ""),
        );
        self.client.json(rb).await
    }

    pub async fn list(&self, limit: Option<u32>, page: Option<&str>) -> Result<Page<Work>, Error> {
        let query = Query::default().opt("limit", limit).opt("page", page);
        let rb = self
            .client
            .request(Method::GET, ApiFamily::ManagedAgents, &self.base())
            .query(query.pairs());
        self.client.json(rb).await
    }

    pub async fn stats(&self) -> Result<WorkQueueStats, Error> {
        let rb = self.client.request(
            Method::GET,
            ApiFamily::ManagedAgents,
            &format!("{}/stats", self.base()),
        );
        self.client.json(rb).await
    }
}
