//! Sends `session.status_run_started` to the configured endpoint, signed per
//! Standard Webhooks, as the real API notifies a webhook-triggered worker.
//! A failed delivery (no 2xx, a redirect, a timeout) is retried up to three
//! times with jittered exponential backoff; every attempt keeps the
//! `webhook-id` and carries a fresh timestamp and signature.

use std::time::Duration;

use rand::RngExt;
use serde_json::json;

use crate::webhook::SigningKey;

use super::ids;

/// Retries after the first attempt.
pub const RETRIES: u32 = 3;

/// Where and how to deliver.
#[derive(Clone)]
pub struct WebhookSender {
    url: String,
    key: SigningKey,
    http: reqwest::Client,
    backoff: Duration,
}

impl std::fmt::Debug for WebhookSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookSender")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl WebhookSender {
    /// `backoff` is the first retry delay; it doubles each time.
    pub fn new(url: String, key: SigningKey, backoff: Duration) -> WebhookSender {
        let http = crate::tls::client_builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default();
        WebhookSender {
            url,
            key,
            http,
            backoff,
        }
    }

    /// Deliver `session.status_run_started` for `session_id` in the background.
    pub fn run_started(&self, session_id: &str) {
        let body = json!({
            "type": "event",
            "id": ids::new_id("whe"),
            "created_at": ids::from_micros(ids::now_micros()).to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "data": {
                "type": "session.status_run_started",
                "id": session_id,
                "organization_id": "org_devserver",
                "workspace_id": "wrkspc_devserver",
            },
        });
        let sender = self.clone();
        tokio::spawn(async move { sender.deliver(body).await });
    }

    async fn deliver(&self, body: serde_json::Value) {
        let id = body["id"].as_str().unwrap_or_default().to_string();
        let session_id = body["data"]["id"].as_str().unwrap_or_default().to_string();
        let bytes = body.to_string().into_bytes();
        for attempt in 0..=RETRIES {
            if attempt > 0 {
                let base = self.backoff * 2u32.pow(attempt - 1);
                let jitter = rand::rng().random_range(0.0..0.25);
                tokio::time::sleep(base.mul_f64(1.0 + jitter)).await;
            }
            let timestamp = chrono::Utc::now().timestamp();
            let signature = self.key.sign(&id, timestamp, &bytes);
            let sent = self
                .http
                .post(&self.url)
                .header("content-type", "application/json")
                .header("webhook-id", &id)
                .header("webhook-timestamp", timestamp.to_string())
                .header("webhook-signature", signature)
                .body(bytes.clone())
                .send()
                .await;
            match sent {
                Ok(r) if r.status().is_success() => {
                    tracing::info!(webhook.id = %id, session.id = %session_id, attempt, "webhook delivered");
                    return;
                }
                Ok(r) => {
                    tracing::warn!(webhook.id = %id, status = r.status().as_u16(), attempt, "webhook delivery refused")
                }
                Err(e) => {
                    tracing::warn!(webhook.id = %id, error = %e, attempt, "webhook delivery failed")
                }
            }
        }
        tracing::warn!(webhook.id = %id, session.id = %session_id, "webhook dropped after {RETRIES} retries");
    }
}
