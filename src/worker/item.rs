//! One work item, from claim to force-stop.
//!
//! The order matters and follows the official workers:
//! heartbeat first (a slow download must not let the lease lapse) → the
//! session, fetched once → the memory gate → skills → memory download →
//! the tool runner (a due sync after each call) → teardown: tools closed →
//! skills removed → final sync on a clean end (≤ 30 s) → flush (≤ 30 s,
//! always) → dispose → heartbeat stopped → force-stop unless the lease was
//! lost. The teardown runs whatever failed before it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::api::types::{Redacted, Session, SessionStatus, WorkSecret};
use crate::memory::{SessionMemoryStores, TeardownReport};
use crate::session::{RunEnd, RunStats, RunnerOptions, SendWindow, SessionRunner};
use crate::tools::{ToolContext, Toolset, scrubbed_env};

use super::lease::{self, Lease, LeaseEnd};
use super::{EnvironmentWorker, WorkerError, WorkerEvent};

/// The bound of the force-stop on the way out.
pub(crate) const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A claimed item: what the poll answered, or what a sandbox was handed.
#[derive(Clone)]
pub struct WorkItem {
    pub id: String,
    pub environment_id: String,
    /// `session`, `healthcheck`, or a type added later.
    pub kind: String,
    /// The session id (for a session item).
    pub data_id: String,
    pub secret: Option<Redacted>,
}

impl std::fmt::Debug for WorkItem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkItem")
            .field("id", &self.id)
            .field("environment_id", &self.environment_id)
            .field("kind", &self.kind)
            .field("data_id", &self.data_id)
            .finish_non_exhaustive()
    }
}

impl From<crate::api::types::Work> for WorkItem {
    fn from(work: crate::api::types::Work) -> Self {
        WorkItem {
            id: work.id,
            environment_id: work.environment_id,
            kind: work.data.kind,
            data_id: work.data.id,
            secret: work.secret,
        }
    }
}

/// How an item went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemOutcome {
    /// The session was served until the runner ended.
    Served(RunEnd),
    /// Not a session item (a health check): stopped without running anything.
    NotASession,
    /// The session had already ended: stopped without running tools.
    AlreadyTerminated,
    /// The item could not be served; the message says why.
    Failed(String),
}

/// Everything the worker did with one item.
#[derive(Debug, Clone)]
pub struct ItemReport {
    pub work_id: String,
    pub session_id: String,
    pub outcome: ItemOutcome,
    pub lease: Option<LeaseEnd>,
    /// Whether the item was force-stopped on the way out.
    pub stopped: bool,
    pub stats: RunStats,
    pub teardown: TeardownReport,
    pub duration: Duration,
    /// The session was fetched and [`WorkerEvent::Claimed`] emitted.
    pub claimed: bool,
}

impl EnvironmentWorker {
    /// Serve one claimed (and acknowledged) item. Never fails: what went
    /// wrong is in the report, and the teardown ran. `cancel` ends the
    /// session early (shutdown); `deadline` is a hard end (a Lambda
    /// invocation's), before which the teardown must be done.
    pub async fn handle_item(
        &self,
        item: WorkItem,
        cancel: CancellationToken,
        deadline: Option<Instant>,
    ) -> ItemReport {
        let span = info_span!("work_item", work_id = %item.id, session_id = %item.data_id);
        self.serve(item, cancel, deadline).instrument(span).await
    }

    async fn serve(
        &self,
        item: WorkItem,
        cancel: CancellationToken,
        deadline: Option<Instant>,
    ) -> ItemReport {
        let started = Instant::now();
        let opts = self.options();
        let mut report = ItemReport {
            work_id: item.id.clone(),
            session_id: item.data_id.clone(),
            outcome: ItemOutcome::Failed("not started".into()),
            lease: None,
            stopped: false,
            stats: RunStats::default(),
            teardown: TeardownReport::default(),
            duration: Duration::ZERO,
            claimed: false,
        };

        // The per-item credential: the secret's sessions token, else the environment key.
        let token = item
            .secret
            .as_ref()
            .and_then(|s| WorkSecret::sessions_token(s.expose()));
        if item.secret.is_some() && token.is_none() {
            warn!(
                "work item carried a secret payload but no sessions token could be extracted; falling back to the environment key"
            );
        }
        let Some(credential) = token.clone().or_else(|| opts.environment_key.clone()) else {
            let e = WorkerError::NoCredential;
            error!(error = %e, "work item failed");
            report.outcome = ItemOutcome::Failed(e.to_string());
            report.duration = started.elapsed();
            self.emit(WorkerEvent::Finished(Box::new(report.clone())));
            return report;
        };
        let client = self.client(&credential, "environments-worker");

        // The heartbeat runs before anything slow.
        let lease = Lease::new();
        let window = SendWindow::default();
        let release = CancellationToken::new();
        let beating = tokio::spawn(
            lease::heartbeat(
                client.clone(),
                item.environment_id.clone(),
                item.id.clone(),
                lease.clone(),
                window.clone(),
                release.clone(),
            )
            .in_current_span(),
        );
        // The session ends early on shutdown, on the lease's end, and in
        // time for the teardown before a hard deadline.
        let stop_session = CancellationToken::new();
        let reserve = opts.teardown_reserve();
        let watcher = {
            let (stop, cancel, ended) = (stop_session.clone(), cancel.clone(), lease.ended.clone());
            tokio::spawn(async move {
                let before_deadline = async {
                    match deadline {
                        Some(at) => {
                            let end_by = at.checked_sub(reserve).unwrap_or_else(Instant::now);
                            tokio::time::sleep_until(end_by).await
                        }
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = ended.cancelled() => {}
                    _ = before_deadline => info!("the invocation deadline is near; ending the session to leave time for the teardown"),
                }
                stop.cancel();
            })
        };

        let mut stores: Option<Arc<SessionMemoryStores>> = None;
        let outcome = self
            .run_session(
                &item,
                &client,
                token.is_some(),
                &window,
                &stop_session,
                &mut stores,
                &mut report,
            )
            .await;
        report.outcome = outcome;

        // Teardown: the runner closed the tools; memory next.
        if let Some(stores) = &stores {
            let clean = matches!(&report.outcome, ItemOutcome::Served(end) if end.is_clean());
            let bound = match deadline {
                // Both bounds must fit before a hard deadline.
                Some(at) => opts.memory_teardown_bound.min(
                    at.saturating_duration_since(Instant::now())
                        .saturating_sub(STOP_TIMEOUT + Duration::from_secs(2))
                        / 2,
                ),
                None => opts.memory_teardown_bound,
            };
            report.teardown = stores.teardown(clean, bound).await;
            if report.teardown.flush_cut_off {
                warn!("memory flush was cut off; see the warning above for what was not saved");
            }
        }
        watcher.abort();
        release.cancel();
        let _ = beating.await;
        report.lease = lease.end();
        if lease.is_lost() {
            warn!("lease lost; released without stopping it");
        } else {
            let work = client.work(&item.environment_id);
            match tokio::time::timeout(STOP_TIMEOUT, work.stop(&item.id, true)).await {
                Ok(Ok(())) => report.stopped = true,
                Ok(Err(crate::api::Error::Api(e))) if e.status == 409 => report.stopped = true,
                Ok(Err(e)) => warn!(error = %e, "force-stop on exit failed"),
                Err(_) => warn!(
                    "force-stop on exit failed: no answer within {}s",
                    STOP_TIMEOUT.as_secs()
                ),
            }
        }
        report.duration = started.elapsed();
        match &report.outcome {
            ItemOutcome::Failed(why) => {
                error!(error = %why, duration_ms = report.duration.as_millis() as u64, "work item failed")
            }
            outcome => {
                info!(outcome = ?outcome, duration_ms = report.duration.as_millis() as u64, tool_calls = report.stats.executed, "work item done")
            }
        }
        self.emit(WorkerEvent::Finished(Box::new(report.clone())));
        report
    }

    /// Everything between the heartbeat's start and the teardown.
    #[allow(clippy::too_many_arguments)]
    async fn run_session(
        &self,
        item: &WorkItem,
        client: &crate::api::Client,
        has_token: bool,
        window: &SendWindow,
        stop: &CancellationToken,
        stores_out: &mut Option<Arc<SessionMemoryStores>>,
        report: &mut ItemReport,
    ) -> ItemOutcome {
        let opts = self.options();
        if item.kind != "session" {
            debug!(kind = %item.kind, "skipping non-session work item");
            return ItemOutcome::NotASession;
        }
        let sessions = client.sessions();
        let session: Session = tokio::select! {
            _ = stop.cancelled() => return ItemOutcome::Served(RunEnd::Cancelled),
            fetched = sessions.retrieve(&item.data_id) => match fetched {
                Ok(s) => s,
                Err(source) => {
                    return ItemOutcome::Failed(WorkerError::Session { session_id: item.data_id.clone(), source: Box::new(source) }.to_string());
                }
            },
        };
        self.emit(WorkerEvent::Claimed {
            work_id: item.id.clone(),
            session_id: session.id.clone(),
        });
        report.claimed = true;
        if session.status == SessionStatus::Terminated {
            info!("session already terminated; stopping the item without running tools");
            return ItemOutcome::AlreadyTerminated;
        }

        // Memory needs the item's own token: the memory endpoints refuse the environment key.
        let memory_on = opts.memory_sync_interval.interval().is_some();
        let has_stores = session.memory_stores().next().is_some();
        if memory_on && has_stores && !has_token {
            let e = WorkerError::MemoryNoToken {
                work_id: item.id.clone(),
                session_id: session.id.clone(),
            };
            error!(error = %e, "memory stores cannot be mounted");
            return ItemOutcome::Failed(e.to_string());
        }
        if !memory_on || !has_stores {
            debug!("memory stores disabled for this item");
        }

        if let Err(e) = tokio::fs::create_dir_all(&opts.workdir).await {
            return ItemOutcome::Failed(format!(
                "cannot create the workdir {}: {e}",
                opts.workdir.display()
            ));
        }

        // Skills: a failure is logged by the download and never fails the item.
        let skills = tokio::select! {
            _ = stop.cancelled() => return ItemOutcome::Served(RunEnd::Cancelled),
            dirs = crate::tools::skills::download_session_skills(client, &session, &opts.workdir) => dirs,
        };
        let outcome = self
            .serve_tools(
                item,
                client,
                &session,
                window,
                stop,
                stores_out,
                report,
                memory_on && has_stores,
            )
            .await;
        // The runner closed the tools; the skills go before the memory teardown.
        crate::tools::skills::remove_skills(&skills).await;
        outcome
    }

    #[allow(clippy::too_many_arguments)]
    async fn serve_tools(
        &self,
        item: &WorkItem,
        client: &crate::api::Client,
        session: &Session,
        window: &SendWindow,
        stop: &CancellationToken,
        stores_out: &mut Option<Arc<SessionMemoryStores>>,
        report: &mut ItemReport,
        with_memory: bool,
    ) -> ItemOutcome {
        let opts = self.options();
        let mut ctx = ToolContext::new(&opts.workdir);
        ctx.max_file_bytes = opts.max_file_bytes;
        ctx.bash_env = scrubbed_env(&opts.secret_env_vars);
        ctx.remap = opts.mount_remap.clone();
        if with_memory {
            let mut stores = SessionMemoryStores::new(
                Arc::new(client.clone()),
                &opts.workdir,
                opts.memory_sync_interval,
                opts.memory_sync_deletions,
            )
            .with_remap(opts.mount_remap.clone());
            let downloaded = tokio::select! {
                _ = stop.cancelled() => Err(None),
                d = stores.download(session) => d.map_err(Some),
            };
            let stores = Arc::new(stores);
            *stores_out = Some(stores.clone());
            match downloaded {
                Ok(()) => {}
                Err(None) => return ItemOutcome::Served(RunEnd::Cancelled),
                Err(Some(e)) => return ItemOutcome::Failed(e.to_string()),
            }
            ctx.allowed_roots = stores.roots();
            ctx.read_only_roots = stores.read_only_roots();
        }

        let tools = Arc::new(Toolset::new(ctx));
        let after_call = stores_out.clone().map(|stores| {
            let worker = self.clone();
            let work_id = item.id.clone();
            let bound = opts.memory_teardown_bound;
            let hook: crate::session::AfterCall = Arc::new(move || {
                let (stores, worker, work_id) = (stores.clone(), worker.clone(), work_id.clone());
                Box::pin(async move {
                    if let Some(report) = stores.sync_if_due_within(bound).await {
                        worker.emit(WorkerEvent::Synced {
                            work_id,
                            report,
                            final_sync: false,
                        });
                    }
                })
            });
            hook
        });
        let observer = {
            let worker = self.clone();
            let work_id = item.id.clone();
            let observer: crate::session::Observer = Arc::new(move |record| {
                worker.emit(WorkerEvent::Call {
                    work_id: work_id.clone(),
                    record: record.clone(),
                });
            });
            Some(observer)
        };
        let runner = SessionRunner::new(
            client.clone(),
            &session.id,
            tools,
            RunnerOptions {
                max_idle: opts.max_idle,
                tool_timeout: opts.tool_timeout,
                send_window: window.clone(),
                after_call,
                observer,
                ..Default::default()
            },
        );
        let run = runner.run(stop.clone()).await;
        report.stats = run.stats;
        ItemOutcome::Served(run.end)
    }
}
