//! The state every handler shares: the database, the admin key (kept as a
//! digest), the live event fan-out, the fault rules, the webhook sender and
//! the shutdown token, behind one `Arc` so a clone per request is cheap.

use std::sync::Arc;
use std::time::Duration;

use rusqlite::Transaction;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::DevserverConfig;
use super::db::Db;
use super::error::HttpResult;
use super::faults::Faults;
use super::live::{Effects, Live};
use super::requests::RequestLog;
use super::webhooks::WebhookSender;

/// Shared state of every handler.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<StateInner>,
}

struct StateInner {
    db: Db,
    admin_key_sha256: [u8; 32],
    admin_key_id: String,
    mount_root: String,
    lease_ttl_seconds: i64,
    ping_interval: Duration,
    date_skew_seconds: i64,
    live: Live,
    faults: Faults,
    requests: RequestLog,
    webhook: Option<WebhookSender>,
    shutdown: CancellationToken,
}

impl AppState {
    /// The state of a devserver over `db`, from a config already checked
    /// by [`super::Devserver::open`].
    pub(super) fn new(db: Db, config: DevserverConfig) -> AppState {
        let digest: [u8; 32] = Sha256::digest(config.admin_key.as_bytes()).into();
        let admin_key_id = format!("apikey_01{}", &hex::encode(digest)[..22]);
        let webhook = config
            .webhook
            .map(|(url, key)| WebhookSender::new(url, key, config.webhook_backoff));
        AppState {
            inner: Arc::new(StateInner {
                db,
                admin_key_sha256: digest,
                admin_key_id,
                mount_root: config.mount_root,
                lease_ttl_seconds: config.lease_ttl_seconds,
                ping_interval: config.ping_interval,
                date_skew_seconds: config.date_skew_seconds,
                live: Live::default(),
                faults: Faults::new(config.faults),
                requests: RequestLog::default(),
                webhook,
                shutdown: CancellationToken::new(),
            }),
        }
    }

    pub fn db(&self) -> &Db {
        &self.inner.db
    }

    pub fn live(&self) -> &Live {
        &self.inner.live
    }

    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    /// Every API request received (`GET /dev/requests`).
    pub fn requests(&self) -> &RequestLog {
        &self.inner.requests
    }

    pub fn mount_root(&self) -> String {
        self.inner.mount_root.clone()
    }

    pub fn lease_ttl_seconds(&self) -> i64 {
        self.inner.lease_ttl_seconds
    }

    pub fn ping_interval(&self) -> Duration {
        self.inner.ping_interval
    }

    /// Seconds the `Date` header is off the true clock (a test setting).
    pub fn date_skew_seconds(&self) -> i64 {
        self.inner.date_skew_seconds
    }

    pub fn shutdown_token(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    /// Compare digests rather than the keys themselves, so the comparison
    /// time says nothing about the key.
    pub fn is_admin_key(&self, key: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        digest == self.inner.admin_key_sha256
    }

    /// The admin key's public id (`apikey_…`), recorded as the actor of its writes.
    pub fn admin_key_id(&self) -> &str {
        &self.inner.admin_key_id
    }

    /// Set in motion what a committed transaction produced.
    pub fn apply(&self, fx: Effects) {
        self.inner.live.publish(fx.events);
        if fx.work_available {
            self.inner.live.work_available.notify_waiters();
        }
        if let Some(webhook) = &self.inner.webhook {
            for session_id in &fx.run_started {
                webhook.run_started(session_id);
            }
        }
    }

    /// Run `f` in a transaction and apply its effects once it committed.
    pub async fn commit<T, F>(&self, f: F) -> HttpResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>, &mut Effects) -> HttpResult<T> + Send + 'static,
    {
        let (value, fx) = self
            .db()
            .transaction(move |tx| {
                let mut fx = Effects::default();
                let value = f(tx, &mut fx)?;
                Ok((value, fx))
            })
            .await?;
        self.apply(fx);
        Ok(value)
    }
}
