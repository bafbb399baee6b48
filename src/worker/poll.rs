//! Claiming work: the always-on poll loop ([`EnvironmentWorker::run`]) and
//! the drain a webhook triggers ([`EnvironmentWorker::drain`]).
//!
//! Polls always authenticate with the environment key. The loop long-polls
//! (`block_ms=999`), sleeps 1–3 s after an empty answer, backs off 1 s → 60 s
//! (jittered) after a failure, and stops only on cancellation or a permanent
//! error (a 4xx other than 408, 409 and 429). One failing item never stops
//! it. The drain polls without blocking, reclaiming items whose worker went
//! quiet for 2 s, until the queue is empty.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use rand::RngExt;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::api::types::{PollWork, Redacted, Work};
use crate::api::{Client, Error};

use super::item::{ItemReport, WorkItem};
use super::{EnvironmentWorker, WorkerError};

pub const POLL_BLOCK_MS: u32 = 999;
pub const RECLAIM_OLDER_THAN_MS: u64 = 2_000;
const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_CAP: Duration = Duration::from_secs(60);
const IDLE_LOG_EVERY: Duration = Duration::from_secs(300);
/// Transient poll failures a drain tolerates before giving up.
const DRAIN_POLL_ATTEMPTS: u32 = 4;

/// A 4xx other than 408, 409 and 429: polling again will not help.
fn poll_is_fatal(e: &Error) -> bool {
    match e {
        Error::Api(api) => {
            (400..500).contains(&api.status) && ![408, 409, 429].contains(&api.status)
        }
        Error::Config(_) => true,
        _ => false,
    }
}

fn jittered(base: Duration) -> Duration {
    base.mul_f64(rand::rng().random_range(0.5..=1.0))
}

/// How a drain runs.
#[derive(Debug, Clone)]
pub struct DrainOptions {
    /// Items served at once.
    pub max_concurrent_items: usize,
    /// A hard end (a Lambda invocation's deadline): items end in time for
    /// their teardown, and no item is claimed without room to serve it.
    pub deadline: Option<Instant>,
    /// The least serving time worth claiming an item for, beyond the teardown reserve.
    pub min_serving_time: Duration,
}

impl Default for DrainOptions {
    fn default() -> Self {
        DrainOptions {
            max_concurrent_items: 1,
            deadline: None,
            min_serving_time: Duration::from_secs(60),
        }
    }
}

/// What a drain did.
#[derive(Debug, Clone, Default)]
pub struct DrainReport {
    pub items: Vec<ItemReport>,
    /// The drain stopped claiming because the deadline was too near.
    pub stopped_for_deadline: bool,
}

/// Serves one claimed item; the default is [`EnvironmentWorker::handle_item`].
pub type ItemHandler = Arc<dyn Fn(Work) -> BoxFuture<'static, ()> + Send + Sync>;

impl EnvironmentWorker {
    fn poll_client(&self) -> Result<Client, WorkerError> {
        let key: &Redacted = self.options().environment_key.as_ref().ok_or_else(|| {
            WorkerError::Config(
                "the environment id and environment key are required to poll for work".into(),
            )
        })?;
        if self.options().environment_id.is_empty() {
            return Err(WorkerError::Config(
                "the environment id and environment key are required to poll for work".into(),
            ));
        }
        Ok(self.client(key, "environments-work-poller"))
    }

    /// Acknowledge a claimed item. `false` when it must be skipped (it was
    /// force-stopped, or the ack failed transiently and the item will come back).
    async fn ack(&self, poller: &Client, work: &Work) -> bool {
        let queue = poller.work(&work.environment_id);
        match queue.ack(&work.id).await {
            Ok(_) => true,
            Err(e) if e.is_permanent() => {
                warn!(work_id = %work.id, error = %e, "ack failed permanently; force-stopping");
                let _ =
                    tokio::time::timeout(Duration::from_secs(10), queue.stop(&work.id, true)).await;
                false
            }
            Err(e) => {
                warn!(work_id = %work.id, error = %e, "ack failed; the item returns to the queue");
                false
            }
        }
    }

    /// Poll and serve forever, one item at a time, until `cancel` fires or
    /// polling fails permanently.
    pub async fn run(&self, cancel: CancellationToken) -> Result<(), WorkerError> {
        let worker = self.clone();
        let child = cancel.clone();
        let handler: ItemHandler = Arc::new(move |work: Work| {
            let (worker, cancel) = (worker.clone(), child.clone());
            Box::pin(async move {
                worker.handle_item(WorkItem::from(work), cancel, None).await;
            })
        });
        self.run_with(cancel, handler).await
    }

    /// [`run`](Self::run), handing each acknowledged item to `handler`.
    pub async fn run_with(
        &self,
        cancel: CancellationToken,
        handler: ItemHandler,
    ) -> Result<(), WorkerError> {
        let poller = self.poll_client()?;
        let queue = poller.work(&self.options().environment_id);
        let params = PollWork {
            block_ms: Some(POLL_BLOCK_MS),
            reclaim_older_than_ms: None,
        };
        let worker_id = self.options().worker_id.clone();
        let mut backoff = BACKOFF_START;
        let mut idle_since: Option<Instant> = None;
        let mut idle_logged = Instant::now();
        info!(environment_id = %self.options().environment_id, worker_id = %worker_id, "polling for work");
        loop {
            let polled = tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                p = queue.poll(&params, Some(&worker_id)) => p,
            };
            let pause = match polled {
                Ok(Some(work)) => {
                    backoff = BACKOFF_START;
                    idle_since = None;
                    info!(work_id = %work.id, session_id = %work.data.id, "claimed work");
                    if self.ack(&poller, &work).await {
                        handler(work).await;
                    }
                    continue;
                }
                Ok(None) => {
                    backoff = BACKOFF_START;
                    match idle_since {
                        None => {
                            info!("idle; polling for work");
                            idle_since = Some(Instant::now());
                            idle_logged = Instant::now();
                        }
                        Some(since) if idle_logged.elapsed() >= IDLE_LOG_EVERY => {
                            info!(
                                idle_s = since.elapsed().as_secs(),
                                "still polling; idle for {}s",
                                since.elapsed().as_secs()
                            );
                            idle_logged = Instant::now();
                        }
                        Some(_) => debug!("idle; polling for work"),
                    }
                    Duration::from_millis(rand::rng().random_range(1_000..=3_000))
                }
                Err(e) if poll_is_fatal(&e) => {
                    tracing::error!(error = %e, "poll failed permanently, stopping poller");
                    return Err(WorkerError::Poll(Box::new(e)));
                }
                Err(e) => {
                    let wait = jittered(backoff);
                    warn!(error = %e, backoff_ms = wait.as_millis() as u64, "poll failed, backing off");
                    backoff = (backoff * 2).min(BACKOFF_CAP);
                    wait
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Claim and serve items until the queue is empty: non-blocking polls
    /// that reclaim items whose worker went quiet for 2 s; at most
    /// `max_concurrent_items` at once. Returns when every item it claimed
    /// was served and let go.
    pub async fn drain(
        &self,
        cancel: CancellationToken,
        options: DrainOptions,
    ) -> Result<DrainReport, WorkerError> {
        let poller = self.poll_client()?;
        let queue = poller.work(&self.options().environment_id);
        let params = PollWork {
            block_ms: None,
            reclaim_older_than_ms: Some(RECLAIM_OLDER_THAN_MS),
        };
        let worker_id = self.options().worker_id.clone();
        let slots = Arc::new(tokio::sync::Semaphore::new(
            options.max_concurrent_items.max(1),
        ));
        let mut running: JoinSet<ItemReport> = JoinSet::new();
        let mut report = DrainReport::default();
        let mut failures = 0;
        let result = loop {
            // Wait for a free slot before claiming: never hold an item we cannot serve.
            let permit = tokio::select! {
                _ = cancel.cancelled() => break Ok(()),
                p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            };
            while let Some(done) = running.try_join_next() {
                if let Ok(item) = done {
                    report.items.push(item);
                }
            }
            if let Some(at) = options.deadline
                && at.saturating_duration_since(Instant::now())
                    < self.options().teardown_reserve() + options.min_serving_time
            {
                info!("too little time left in this invocation to claim another item");
                report.stopped_for_deadline = true;
                break Ok(());
            }
            let polled = tokio::select! {
                _ = cancel.cancelled() => break Ok(()),
                p = queue.poll(&params, Some(&worker_id)) => p,
            };
            match polled {
                Ok(None) => break Ok(()),
                Ok(Some(work)) => {
                    failures = 0;
                    info!(work_id = %work.id, session_id = %work.data.id, "claimed work");
                    if !self.ack(&poller, &work).await {
                        continue;
                    }
                    let (worker, cancel, deadline) =
                        (self.clone(), cancel.clone(), options.deadline);
                    running.spawn(async move {
                        let _permit = permit;
                        worker
                            .handle_item(WorkItem::from(work), cancel, deadline)
                            .await
                    });
                }
                Err(e) if poll_is_fatal(&e) => {
                    tracing::error!(error = %e, "poll failed permanently, stopping the drain");
                    break Err(WorkerError::Poll(Box::new(e)));
                }
                Err(e) => {
                    failures += 1;
                    if failures >= DRAIN_POLL_ATTEMPTS {
                        warn!(error = %e, "poll keeps failing; ending the drain");
                        break Ok(());
                    }
                    let wait = jittered(BACKOFF_START * 2u32.pow(failures - 1));
                    warn!(error = %e, backoff_ms = wait.as_millis() as u64, "poll failed, backing off");
                    tokio::time::sleep(wait).await;
                }
            }
        };
        // Every claimed item is served to its end (a cancel ends them early,
        // through their own teardown).
        while let Some(done) = running.join_next().await {
            if let Ok(item) = done {
                report.items.push(item);
            }
        }
        result.map(|()| report)
    }
}
