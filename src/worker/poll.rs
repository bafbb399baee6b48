//! Claiming work: the always-on poll loop ([`EnvironmentWorker::run`]) and
//! the drain a webhook triggers ([`EnvironmentWorker::drain`]).
//!
//! Polls always authenticate with the environment key. The loop long-polls
//! (`block_ms=999`), sleeps 1–3 s after an empty answer, backs off 1 s → 60 s
//! (jittered) after a failure, and stops only on cancellation or a permanent
//! error (a 4xx other than 408, 409 and 429). One failing item never stops
//! it. The drain polls without blocking, reclaiming items whose worker went
//! quiet for 2 s, until the queue is empty.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use rand::RngExt;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, warn};

use crate::api::types::{PollWork, Work};
use crate::api::{Client, Error};

use super::item::{ItemReport, WorkItem, Workdir};
use super::{EnvironmentWorker, WorkerError};

pub(crate) const POLL_BLOCK_MS: u32 = 999;
pub(crate) const RECLAIM_OLDER_THAN_MS: u64 = 2_000;
const BACKOFF_CAP: Duration = Duration::from_secs(60);
const IDLE_LOG_EVERY: Duration = Duration::from_secs(300);

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

/// The reference's retry wait for a poll or an ack: `2^attempt` seconds
/// (1-indexed, capped at 60 s) plus up to 1 s of jitter. The first wait
/// after a failed ack (≥ 2 s) lets the item become reclaimable again.
fn backoff(attempt: u32) -> Duration {
    let base = Duration::from_secs(1u64 << attempt.clamp(1, 6)).min(BACKOFF_CAP);
    base + Duration::from_secs_f64(rand::rng().random_range(0.0..1.0))
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
    /// Notified when a new delivery arrives: a drain waiting for its running
    /// items polls again at once when a slot is free.
    pub wake: Option<Arc<tokio::sync::Notify>>,
}

impl Default for DrainOptions {
    fn default() -> Self {
        DrainOptions {
            max_concurrent_items: 1,
            deadline: None,
            min_serving_time: Duration::from_secs(60),
            wake: None,
        }
    }
}

/// What a drain did.
#[derive(Debug, Clone, Default)]
pub struct DrainReport {
    pub items: Vec<ItemReport>,
    /// The drain stopped claiming because the deadline was too near.
    pub(crate) stopped_for_deadline: bool,
}

/// What became of an ack.
enum Ack {
    Acked,
    /// Refused for good: the item was force-stopped.
    Stopped,
    /// Failed transiently: back off, then poll again (the item comes back).
    Retry(crate::api::Error),
}

/// Wait `wait` unless `cancel` fires first; `false` if it did.
async fn pause(cancel: &CancellationToken, wait: Duration) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(wait) => true,
    }
}

/// Serves one claimed item; the default is [`EnvironmentWorker::handle_item`].
pub(crate) type ItemHandler = Arc<dyn Fn(Work) -> BoxFuture<'static, ()> + Send + Sync>;

impl EnvironmentWorker {
    /// The environment key's client: its outcomes reach [`Self::standing`].
    fn poll_client(&self) -> Result<Client, WorkerError> {
        if self.options().environment_key.is_none() || self.options().environment_id.is_empty() {
            return Err(WorkerError::Config(
                "the environment id and environment key are required to poll for work".into(),
            ));
        }
        Ok(self.environment_client("environments-work-poller"))
    }

    /// Acknowledge a claimed item.
    async fn ack(&self, poller: &Client, work: &Work) -> Ack {
        let queue = poller.work(&work.environment_id);
        match queue.ack(&work.id).await {
            Ok(_) => Ack::Acked,
            Err(e) if e.is_permanent() => {
                warn!(work_id = %work.id, error = %e, "ack failed permanently; force-stopping");
                let _ =
                    tokio::time::timeout(Duration::from_secs(10), queue.stop(&work.id, true)).await;
                Ack::Stopped
            }
            Err(e) => Ack::Retry(e),
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
    pub(crate) async fn run_with(
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
        let (mut poll_attempt, mut ack_attempt) = (0u32, 0u32);
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
                    poll_attempt = 0;
                    idle_since = None;
                    info!(work_id = %work.id, session_id = %work.data.id, "claimed work");
                    match self.ack(&poller, &work).await {
                        Ack::Acked => {
                            ack_attempt = 0;
                            handler(work).await;
                            continue;
                        }
                        Ack::Stopped => continue,
                        Ack::Retry(e) => {
                            ack_attempt += 1;
                            let wait = backoff(ack_attempt);
                            warn!(work_id = %work.id, attempt = ack_attempt, backoff_ms = wait.as_millis() as u64, error = %e, "ack failed, backing off");
                            wait
                        }
                    }
                }
                Ok(None) => {
                    poll_attempt = 0;
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
                    poll_attempt += 1;
                    let wait = backoff(poll_attempt);
                    warn!(attempt = poll_attempt, backoff_ms = wait.as_millis() as u64, error = %e, "poll failed, backing off");
                    wait
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Where a drain's items work: two sessions cannot share one working
    /// directory, so items served side by side each get a fresh one.
    pub(crate) fn drain_workdir(&self, options: &DrainOptions) -> Workdir {
        if self.options().fresh_workdir || options.max_concurrent_items > 1 {
            Workdir::Fresh
        } else {
            Workdir::Shared
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
        let mut drain = Drain::new(self, cancel, options);
        let result = loop {
            // Wait for a free slot before claiming: never hold an item we cannot serve.
            let permit = tokio::select! {
                _ = drain.cancel.cancelled() => break Ok(()),
                p = drain.slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            };
            drain.collect_finished();
            if drain.deadline_too_near() {
                info!("too little time left in this invocation to claim another item");
                drain.report.stopped_for_deadline = true;
                break Ok(());
            }
            let polled = tokio::select! {
                _ = drain.cancel.cancelled() => break Ok(()),
                p = queue.poll(&params, Some(&worker_id)) => p,
            };
            let next = match polled {
                Ok(None) => drain.found_empty(permit).await,
                Ok(Some(work)) => drain.claimed(&poller, work, permit).await,
                Err(e) => drain.poll_failed(e, permit).await,
            };
            if let ControlFlow::Break(end) = next {
                break end;
            }
        };
        // Every claimed item is served to its end (a cancel ends them early,
        // through their own teardown).
        while let Some(done) = drain.running.join_next().await {
            if let Ok(item) = done {
                drain.report.items.push(item);
            }
        }
        result.map(|()| drain.report)
    }
}

/// Whether a drain goes on claiming, or ends with this result.
type Next = ControlFlow<Result<(), WorkerError>>;

/// One drain under way: its slots, the items it runs, what it reports, and
/// the attempts behind its current backoff.
struct Drain<'w> {
    worker: &'w EnvironmentWorker,
    cancel: CancellationToken,
    options: DrainOptions,
    slots: Arc<tokio::sync::Semaphore>,
    running: JoinSet<ItemReport>,
    report: DrainReport,
    poll_attempt: u32,
    ack_attempt: u32,
}

impl<'w> Drain<'w> {
    fn new(
        worker: &'w EnvironmentWorker,
        cancel: CancellationToken,
        options: DrainOptions,
    ) -> Self {
        let slots = Arc::new(tokio::sync::Semaphore::new(
            options.max_concurrent_items.max(1),
        ));
        Drain {
            worker,
            cancel,
            options,
            slots,
            running: JoinSet::new(),
            report: DrainReport::default(),
            poll_attempt: 0,
            ack_attempt: 0,
        }
    }

    /// Report the items that have ended since the last look.
    fn collect_finished(&mut self) {
        while let Some(done) = self.running.try_join_next() {
            if let Ok(item) = done {
                self.report.items.push(item);
            }
        }
    }

    /// Under a deadline: whether too little time is left to serve another item.
    fn deadline_too_near(&self) -> bool {
        self.options.deadline.is_some_and(|at| {
            at.saturating_duration_since(Instant::now())
                < self.worker.options().teardown_reserve() + self.options.min_serving_time
        })
    }

    /// The queue is empty. While items still run, a new delivery (a wake)
    /// means another item may wait: poll again for a free slot.
    async fn found_empty(&mut self, permit: OwnedSemaphorePermit) -> Next {
        self.poll_attempt = 0;
        drop(permit);
        let Some(wake) = &self.options.wake else {
            return ControlFlow::Break(Ok(()));
        };
        if self.running.is_empty() {
            return ControlFlow::Break(Ok(()));
        }
        tokio::select! {
            _ = self.cancel.cancelled() => return ControlFlow::Break(Ok(())),
            _ = wake.notified() => {}
            done = self.running.join_next() => {
                // A slot came free: look once more before waiting again.
                if let Some(Ok(item)) = done {
                    self.report.items.push(item);
                }
            }
        }
        ControlFlow::Continue(())
    }

    /// An item claimed: acknowledged, then served in its slot.
    async fn claimed(&mut self, poller: &Client, work: Work, permit: OwnedSemaphorePermit) -> Next {
        self.poll_attempt = 0;
        info!(work_id = %work.id, session_id = %work.data.id, "claimed work");
        match self.worker.ack(poller, &work).await {
            Ack::Acked => self.ack_attempt = 0,
            Ack::Stopped => return ControlFlow::Continue(()),
            Ack::Retry(e) => {
                self.ack_attempt += 1;
                let wait = backoff(self.ack_attempt);
                warn!(work_id = %work.id, attempt = self.ack_attempt, backoff_ms = wait.as_millis() as u64, error = %e, "ack failed, backing off");
                drop(permit);
                if !pause(&self.cancel, wait).await {
                    return ControlFlow::Break(Ok(()));
                }
                return ControlFlow::Continue(());
            }
        }
        let (worker, cancel, deadline) = (
            self.worker.clone(),
            self.cancel.clone(),
            self.options.deadline,
        );
        let workdir = self.worker.drain_workdir(&self.options);
        // In the drain's span: its items are its children in a trace.
        self.running.spawn(
            async move {
                let _permit = permit;
                worker
                    .handle_item_in(WorkItem::from(work), cancel, deadline, workdir)
                    .await
            }
            .in_current_span(),
        );
        ControlFlow::Continue(())
    }

    /// A failed poll ends the drain when it is permanent; otherwise back off.
    async fn poll_failed(&mut self, e: Error, permit: OwnedSemaphorePermit) -> Next {
        if poll_is_fatal(&e) {
            tracing::error!(error = %e, "poll failed permanently, stopping the drain");
            return ControlFlow::Break(Err(WorkerError::Poll(Box::new(e))));
        }
        // As the reference: a drain retries until the poll succeeds,
        // the process stops, or (Lambda) the deadline is too near.
        self.poll_attempt += 1;
        let wait = backoff(self.poll_attempt);
        warn!(attempt = self.poll_attempt, backoff_ms = wait.as_millis() as u64, error = %e, "poll failed, backing off");
        drop(permit);
        if !pause(&self.cancel, wait).await {
            return ControlFlow::Break(Ok(()));
        }
        ControlFlow::Continue(())
    }
}
