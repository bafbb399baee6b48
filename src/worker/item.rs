//! One work item, from claim to force-stop.
//!
//! The order matters and follows the official workers:
//! heartbeat first (a slow download must not let the lease lapse) → the
//! session, fetched once → the memory gate → skills → memory download →
//! the tool runner (a due sync after each call) → teardown: tools closed →
//! skills removed → final sync on a clean end (≤ 30 s) → flush (≤ 30 s,
//! always) → dispose → the item's own directory removed (when it has one:
//! [`Workdir::Fresh`]) → heartbeat stopped →
//! force-stop unless the lease was lost. The teardown runs whatever failed before it.
//!
//! Two ways to end a session early, told apart. The lease's end (lost, or a
//! control-plane stop) drops the call in flight: the item is not ours any
//! more. The worker's own shutdown (the caller's `cancel`: SIGTERM) answers
//! the call in flight first (its own result
//! within `--call-grace`, else an error), and when the session is mid-turn
//! hands the item back instead of stopping it: the heartbeat stops, the
//! lease lapses after one TTL and the item returns to the queue, where
//! another worker claims it and its reconcile serves what comes next. A
//! force-stop there would strand the session: the official worker stops the
//! item, and the agent's next call then waits for ever, since nothing but a
//! user message re-queues a stopped item (protocol §1.2, §4.15).
//!
//! One [`ItemRun`] owns the item from the heartbeat's start to the
//! force-stop: the lease, the credential, the memory stores once mounted,
//! and the report. Its steps are methods in the order above, so no step
//! hands state back through out-parameters.
//!
//! Two bounds, set apart: each periodic sync after a tool call is cut off
//! after [`WorkerOptions::memory_sync_bound`](super::WorkerOptions::memory_sync_bound)
//! (30 s, the reference's; not a CLI flag), so a slow memory API cannot hold
//! the agent's next call; the final sync and the flush are each bounded by
//! `--memory-teardown-bound` (30 s), shortened to fit before a hard deadline.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::api::Client;
use crate::api::types::{Redacted, Session, SessionStatus, WorkSecret};
use crate::memory::{SessionMemoryStores, TeardownReport};
use crate::session::{RunEnd, RunStats, RunnerOptions, SendWindow, SessionRunner};
use crate::tools::{ToolContext, Toolset, scrubbed_env};

use super::lease::{self, Lease, LeaseEnd};
use super::{EnvironmentWorker, WorkerError, WorkerEvent};

/// The bound of the force-stop on the way out.
pub(crate) const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Where an item's agent works.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Workdir {
    /// The configured workdir itself, with its content: the reference's
    /// contract (files the operator put there are what the tools see).
    Shared,
    /// A fresh, empty, private directory below the workdir, removed at the
    /// item's end ([`crate::cleanroom`]).
    Fresh,
}

/// A claimed item: what the poll answered, or what a sandbox was handed.
#[derive(Clone)]
pub struct WorkItem {
    pub id: String,
    pub environment_id: String,
    /// `session`, `healthcheck`, or a type added later.
    pub kind: String,
    /// The session id (for a session item).
    pub(crate) data_id: String,
    pub secret: Option<Redacted>,
    /// From the item's `created_at` to now, when it was claimed (the
    /// `envworker_work_queue_wait_seconds` histogram); `None` when unknown.
    pub(crate) queued_for: Option<Duration>,
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
            queued_for: queued_for(&work.created_at, chrono::Utc::now()),
        }
    }
}

/// How long an item created at `created_at` (RFC 3339, the API's clock)
/// has waited at `now`; zero when the clocks disagree the other way.
fn queued_for(created_at: &str, now: chrono::DateTime<chrono::Utc>) -> Option<Duration> {
    let created = chrono::DateTime::parse_from_rfc3339(created_at).ok()?;
    Some(
        now.signed_duration_since(created)
            .to_std()
            .unwrap_or(Duration::ZERO),
    )
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
    /// A memory store's mount path is held by another live session on this
    /// replica (no mount namespace to give each its own): handed back, never
    /// failed; another replica, or this one once the path frees, serves it.
    MountPathInUse(String),
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
    pub(crate) duration: Duration,
    /// The session was fetched and [`WorkerEvent::Claimed`] emitted.
    pub(crate) claimed: bool,
}

impl ItemReport {
    /// The report of an item not started yet.
    fn new(item: &WorkItem) -> Self {
        ItemReport {
            work_id: item.id.clone(),
            session_id: item.data_id.clone(),
            outcome: ItemOutcome::Failed("not started".into()),
            lease: None,
            stopped: false,
            stats: RunStats::default(),
            teardown: TeardownReport::default(),
            duration: Duration::ZERO,
            claimed: false,
        }
    }
}

/// Whom an item acts as. The sessions token in the item's secret is scoped
/// to its one session and is the only credential the memory endpoints
/// accept; without one, the item runs on the environment key (no memory).
enum ItemCredential {
    /// Extracted from the work item's secret payload.
    SessionsToken(Redacted),
    /// The worker's own key: the secret carried no sessions token.
    EnvironmentKey(Redacted),
}

impl ItemCredential {
    /// The secret's sessions token, else the environment key; `None` when
    /// there is neither.
    fn choose(item: &WorkItem, environment_key: Option<&Redacted>) -> Option<Self> {
        let token = item
            .secret
            .as_ref()
            .and_then(|s| WorkSecret::sessions_token(s.expose()));
        if item.secret.is_some() && token.is_none() {
            warn!(
                "work item carried a secret payload but no sessions token could be extracted; falling back to the environment key"
            );
        }
        match token {
            Some(token) => Some(ItemCredential::SessionsToken(token)),
            None => environment_key.cloned().map(ItemCredential::EnvironmentKey),
        }
    }

    fn bearer(&self) -> &Redacted {
        match self {
            ItemCredential::SessionsToken(c) | ItemCredential::EnvironmentKey(c) => c,
        }
    }

    /// Whether the memory endpoints accept it (they refuse the environment key).
    fn reaches_memory(&self) -> bool {
        matches!(self, ItemCredential::SessionsToken(_))
    }
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
        let workdir = if self.options().fresh_workdir {
            Workdir::Fresh
        } else {
            Workdir::Shared
        };
        self.handle_item_in(item, cancel, deadline, workdir).await
    }

    /// [`Self::handle_item`] with the agent working in `workdir`: a drain
    /// serving several items at once gives each a fresh directory, whatever
    /// the options say.
    pub(crate) async fn handle_item_in(
        &self,
        item: WorkItem,
        cancel: CancellationToken,
        deadline: Option<Instant>,
        workdir: Workdir,
    ) -> ItemReport {
        // The span of the item from its claim to its force-stop: the parent
        // of its tool calls, syncs and flushes (the logs' fields too).
        let span = info_span!(
            "work_item",
            work_id = %item.id,
            session_id = %item.data_id,
            stopped = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        let report = self
            .serve(item, cancel, deadline, workdir)
            .instrument(span.clone())
            .await;
        span.record("stopped", report.stopped);
        span.record("duration_ms", report.duration.as_millis() as u64);
        report
    }

    async fn serve(
        &self,
        item: WorkItem,
        cancel: CancellationToken,
        deadline: Option<Instant>,
        workdir: Workdir,
    ) -> ItemReport {
        let started = Instant::now();
        let mut report = ItemReport::new(&item);
        let Some(credential) =
            ItemCredential::choose(&item, self.options().environment_key.as_ref())
        else {
            let e = WorkerError::NoCredential;
            error!(error = %e, "work item failed");
            report.outcome = ItemOutcome::Failed(e.to_string());
            report.duration = started.elapsed();
            self.emit(WorkerEvent::Finished(Box::new(report.clone())));
            return report;
        };
        let mut run = ItemRun::start(self, item, credential, report, cancel, deadline, started);
        run.workdir = workdir;
        run.report.outcome = run.run_session().await;
        run.teardown_memory().await;
        run.clear_room().await;
        run.release().await
    }
}

/// One item's run, from the heartbeat's start to the force-stop: what it
/// acts as, its lease, its memory stores once mounted, and its report.
struct ItemRun<'w> {
    worker: &'w EnvironmentWorker,
    item: WorkItem,
    credential: ItemCredential,
    client: Client,
    lease: Arc<Lease>,
    window: SendWindow,
    /// Ends the heartbeat once the teardown is done.
    release: CancellationToken,
    /// Ends it too when the run is dropped unfinished (a Lambda drain
    /// stopped at its invocation's deadline): a heartbeat left running would
    /// keep the lease, so no other worker could ever take the item over.
    _release_on_drop: tokio_util::sync::DropGuard,
    heartbeat: JoinHandle<()>,
    /// Ends the session early, dropping the call in flight: the lease's end,
    /// a near invocation deadline.
    stop: CancellationToken,
    /// Ends the session early, answering the call in flight first: the
    /// worker's shutdown (the caller's `cancel`).
    shutdown: CancellationToken,
    watcher: JoinHandle<()>,
    deadline: Option<Instant>,
    started: Instant,
    /// Set as soon as the stores exist, so the teardown runs even when the download failed.
    stores: Option<Arc<SessionMemoryStores>>,
    /// What the runner said when the shutdown ended it: whether the session
    /// still needs a worker.
    mid_turn: Option<bool>,
    /// Where the agent works: the workdir, or a fresh directory of its own.
    workdir: Workdir,
    /// This item's own working directory ([`Workdir::Fresh`]), removed at teardown.
    room: Option<crate::cleanroom::SessionDir>,
    /// The shell sandbox's own directories of this session (`HOME`, `TMPDIR`,
    /// its memory folders), when the shell is sandboxed.
    sandbox_room: Option<crate::sandbox::SessionRoom>,
    report: ItemReport,
}

impl<'w> ItemRun<'w> {
    /// Start the heartbeat before anything slow, then the watcher that ends
    /// the session on shutdown, on the lease's end, and in time for the
    /// teardown before a hard deadline.
    fn start(
        worker: &'w EnvironmentWorker,
        item: WorkItem,
        credential: ItemCredential,
        report: ItemReport,
        cancel: CancellationToken,
        deadline: Option<Instant>,
        started: Instant,
    ) -> Self {
        let client = worker.client(credential.bearer(), "environments-worker");
        let lease = Lease::new();
        let window = SendWindow::default();
        let release = CancellationToken::new();
        let heartbeat = tokio::spawn(
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
        let stop = CancellationToken::new();
        let shutdown = CancellationToken::new();
        let reserve = worker.options().teardown_reserve();
        let watcher = {
            let (stop, shutdown, cancel, ended) =
                (stop.clone(), shutdown.clone(), cancel, lease.ended.clone());
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
                    _ = cancel.cancelled() => shutdown.cancel(),
                    _ = ended.cancelled() => stop.cancel(),
                    // The deadline ends the session as a shutdown does (the
                    // Lambda drain cancels at the same moment): the call in
                    // flight is answered and a mid-turn item handed back.
                    _ = before_deadline => {
                        info!("the invocation deadline is near; ending the session to leave time for the teardown");
                        shutdown.cancel();
                    }
                }
                // A lease that ends during a shutdown still drops the call.
                ended.cancelled().await;
                stop.cancel();
            })
        };
        ItemRun {
            worker,
            item,
            credential,
            client,
            lease,
            window,
            _release_on_drop: release.clone().drop_guard(),
            release,
            heartbeat,
            stop,
            shutdown,
            watcher,
            deadline,
            started,
            stores: None,
            mid_turn: None,
            workdir: Workdir::Shared,
            room: None,
            sandbox_room: None,
            report,
        }
    }

    /// Resolves when the session must end early, for either reason.
    async fn ending(&self) {
        tokio::select! {
            _ = self.stop.cancelled() => {}
            _ = self.shutdown.cancelled() => {}
        }
    }

    /// Whether to hand the item back (let the lease lapse, no stop) rather
    /// than stop it: the worker's shutdown, not the lease's end, cut the
    /// session short while it still needed a worker. A shutdown before the
    /// runner started counts as mid-turn: the item was claimed because the
    /// session had work.
    fn hands_back(&self) -> bool {
        if matches!(self.report.outcome, ItemOutcome::MountPathInUse(_))
            && !self.stop.is_cancelled()
        {
            return true;
        }
        self.report.outcome == ItemOutcome::Served(RunEnd::Cancelled)
            && self.shutdown.is_cancelled()
            && !self.stop.is_cancelled()
            && self.mid_turn.unwrap_or(true)
    }

    /// Everything between the heartbeat's start and the teardown.
    async fn run_session(&mut self) -> ItemOutcome {
        let opts = self.worker.options();
        if self.item.kind != "session" {
            debug!(kind = %self.item.kind, "skipping non-session work item");
            return ItemOutcome::NotASession;
        }
        let sessions = self.client.sessions();
        let session: Session = tokio::select! {
            _ = self.ending() => return ItemOutcome::Served(RunEnd::Cancelled),
            fetched = sessions.retrieve(&self.item.data_id) => match fetched {
                Ok(s) => s,
                Err(source) => {
                    return ItemOutcome::Failed(WorkerError::Session { session_id: self.item.data_id.clone(), source: Box::new(source) }.to_string());
                }
            },
        };
        self.worker.emit(WorkerEvent::Claimed {
            work_id: self.item.id.clone(),
            session_id: session.id.clone(),
            queued_for: self.item.queued_for,
        });
        self.report.claimed = true;
        if session.status == SessionStatus::Terminated {
            info!("session already terminated; stopping the item without running tools");
            return ItemOutcome::AlreadyTerminated;
        }

        // Memory needs the item's own token: the memory endpoints refuse the environment key.
        let memory_on = opts.memory_sync_interval.interval().is_some();
        let has_stores = session.memory_stores().next().is_some();
        if memory_on && has_stores && !self.credential.reaches_memory() {
            let e = WorkerError::MemoryNoToken {
                work_id: self.item.id.clone(),
                session_id: session.id.clone(),
            };
            error!(error = %e, "memory stores cannot be mounted");
            return ItemOutcome::Failed(e.to_string());
        }
        if !memory_on || !has_stores {
            debug!("memory stores disabled for this item");
        }

        let work = match self.working_directory().await {
            Ok(work) => work,
            Err(why) => return ItemOutcome::Failed(why),
        };

        // Skills: a failure is logged by the download and never fails the item.
        let skills = tokio::select! {
            _ = self.ending() => return ItemOutcome::Served(RunEnd::Cancelled),
            dirs = crate::skills::download_session_skills(&self.client, &session, &work) => dirs,
        };
        let outcome = self.serve_tools(&session, memory_on && has_stores).await;
        // The runner closed the tools; the skills go before the memory teardown.
        crate::skills::remove_skills(&skills).await;
        outcome
    }

    /// The agent's working directory, created when missing: the workdir
    /// itself, or (fresh) a new private directory below it, kept in
    /// `self.room` for the teardown to remove.
    async fn working_directory(&mut self) -> Result<std::path::PathBuf, String> {
        let root = self.worker.options().workdir.clone();
        let shown = root.display().to_string();
        let fresh = self.workdir == Workdir::Fresh;
        let made = tokio::task::spawn_blocking(move || -> std::io::Result<_> {
            if fresh {
                crate::cleanroom::create_session_dir(&root).map(Some)
            } else {
                std::fs::create_dir_all(&root).map(|()| None)
            }
        })
        .await
        .map_err(|e| format!("cannot create the working directory: {e}"))?;
        match made {
            Ok(Some(room)) => {
                debug!(workdir.path = %room.path.display(), "session directory created");
                let path = room.path.clone();
                self.room = Some(room);
                Ok(path)
            }
            Ok(None) => Ok(self.worker.options().workdir.clone()),
            Err(e) if fresh => Err(format!(
                "cannot create a session directory in the workdir {shown}: {e}"
            )),
            Err(e) => Err(format!("cannot create the workdir {shown}: {e}")),
        }
    }

    /// The sandbox's own directories of this session, below
    /// `<state-dir>/rooms/` (never granted whole: each shell gets only its
    /// own room's `home`, `tmp` and memory folders).
    async fn make_sandbox_room(
        &self,
        enforcement: &crate::sandbox::Enforcement,
        session_id: &str,
    ) -> Result<crate::sandbox::SessionRoom, String> {
        let Some(state) = self.worker.options().state_dir.clone() else {
            return Err("the agent's shell cannot be sandboxed: it needs a state directory for the sessions' own HOME and TMPDIR".into());
        };
        let enforcement = enforcement.clone();
        let id = session_id.to_string();
        tokio::task::spawn_blocking(move || {
            let own_mounts = enforcement.own_mounts().is_some();
            let private_tmp = enforcement.caps().namespaces;
            crate::sandbox::SessionRoom::create(&state.join("rooms"), &id, private_tmp, own_mounts)
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))
        .map_err(|e| format!("cannot create the session's sandbox directories: {e}"))
    }

    /// Mount the stores (when the session has them and memory is on), then
    /// run the tools until the session ends, a due sync after each call.
    async fn serve_tools(&mut self, session: &Session, with_memory: bool) -> ItemOutcome {
        let opts = self.worker.options();
        let work = self
            .room
            .as_ref()
            .map(|r| r.path.clone())
            .unwrap_or_else(|| opts.workdir.clone());
        let mut ctx = match self.tool_context(&work, &session.id).await {
            Ok(ctx) => ctx,
            Err(why) => return ItemOutcome::Failed(why),
        };
        if with_memory && let Err(outcome) = self.mount_memory(session, &mut ctx).await {
            return outcome;
        }
        if let Err(why) = self.confine_shell(&work, &mut ctx) {
            return ItemOutcome::Failed(why);
        }

        let tools = Arc::new(Toolset::new(ctx));
        if opts.shell_sandbox.is_some() {
            // A confined shell costs more to start (its namespace, mounts
            // and rule set): started now, beside the runner's stream.
            let tools = tools.clone();
            tokio::spawn(async move { tools.start_shell_ahead().await });
        }
        let runner = SessionRunner::new(
            self.client.clone(),
            &session.id,
            tools,
            self.runner_options(),
        );
        let run = runner
            .run_until(self.stop.clone(), self.shutdown.clone())
            .await;
        self.report.stats = run.stats;
        self.mid_turn = run.mid_turn;
        ItemOutcome::Served(run.end)
    }

    /// The tools' context in `work`: the options' bounds, the scrubbed bash
    /// environment, and (sandboxed) this session's own room, its `HOME`,
    /// `TMPDIR` and memory folders.
    async fn tool_context(
        &mut self,
        work: &std::path::Path,
        session_id: &str,
    ) -> Result<ToolContext, String> {
        let opts = self.worker.options();
        let mut ctx = ToolContext::new(work.to_path_buf());
        ctx.supervisor = opts.supervisor.clone();
        ctx.max_file_bytes = opts.max_file_bytes;
        ctx.bash_env = scrubbed_env(&opts.secret_env_vars);
        ctx.remap = opts.mount_remap.clone();
        if let Some(enforcement) = &opts.shell_sandbox {
            let room = self.make_sandbox_room(enforcement, session_id).await?;
            if let (Some(shown), Some(actual)) = (enforcement.own_mounts(), &room.mount_root) {
                // This session's stores live in its room and its shell
                // sees them at the advertised path (a bind in its
                // namespace); the file tools map the paths.
                ctx.remap = Some(crate::remap::MountRemap {
                    advertised: shown.to_path_buf(),
                    actual: actual.clone(),
                });
            }
            ctx.bash_env.retain(|(k, _)| k != "HOME" && k != "TMPDIR");
            ctx.bash_env.extend(room.env());
            self.sandbox_room = Some(room);
        }
        Ok(ctx)
    }

    /// Download the session's stores (kept in `self.stores` even when the
    /// download fails, for the teardown) and open their roots to the tools.
    async fn mount_memory(
        &mut self,
        session: &Session,
        ctx: &mut ToolContext,
    ) -> Result<(), ItemOutcome> {
        let opts = self.worker.options();
        let mut stores = SessionMemoryStores::new(
            Arc::new(self.client.clone()),
            &opts.workdir,
            opts.memory_sync_interval,
            opts.memory_sync_deletions,
        )
        .with_remap(ctx.remap.clone())
        .with_state_dir(opts.state_dir.as_deref())
        .with_push(opts.memory_push);
        let downloaded = tokio::select! {
            _ = self.ending() => Err(None),
            d = stores.download(session) => d.map_err(Some),
        };
        let stores = Arc::new(stores);
        self.stores = Some(stores.clone());
        match downloaded {
            Ok(()) => {}
            Err(None) => return Err(ItemOutcome::Served(RunEnd::Cancelled)),
            Err(Some(crate::memory::MemoryError::InUse(why))) => {
                warn!(error = %why, "a memory store's mount path is in use by another live session on this replica: the work item is handed back, not failed; another replica (or this one, once the path frees) serves the session");
                return Err(ItemOutcome::MountPathInUse(why));
            }
            Err(Some(e)) => return Err(ItemOutcome::Failed(e.to_string())),
        }
        ctx.allowed_roots = stores.roots();
        ctx.read_only_roots = stores.read_only_roots();
        Ok(())
    }

    /// The sandboxed shell's policy: the workdir, its room, and the stores
    /// (read-only ones read-only); nothing when the shell is not sandboxed.
    fn confine_shell(&self, work: &std::path::Path, ctx: &mut ToolContext) -> Result<(), String> {
        let opts = self.worker.options();
        let (Some(enforcement), Some(room)) = (&opts.shell_sandbox, &self.sandbox_room) else {
            return Ok(());
        };
        let mut grants = enforcement.grants(work, room);
        grants.stores_ro = ctx.read_only_roots.clone();
        grants.stores_rw = ctx
            .allowed_roots
            .iter()
            .filter(|r| !ctx.read_only_roots.contains(r))
            .cloned()
            .collect();
        match grants.policy(&enforcement.protected) {
            Ok(policy) => {
                ctx.shell_sandbox = Some(policy);
                Ok(())
            }
            Err(e) => Err(format!("the agent's shell cannot be sandboxed: {e}")),
        }
    }

    /// The runner's options: the item's bounds, its send window, a due sync
    /// after each call (with memory) and each call reported to the worker.
    fn runner_options(&self) -> RunnerOptions {
        let opts = self.worker.options();
        let after_call = self.stores.clone().map(|stores| {
            let worker = self.worker.clone();
            let work_id = self.item.id.clone();
            let bound = opts.memory_sync_bound;
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
            let worker = self.worker.clone();
            let work_id = self.item.id.clone();
            let observer: crate::session::Observer = Arc::new(move |record| {
                worker.emit(WorkerEvent::Call {
                    work_id: work_id.clone(),
                    record: record.clone(),
                });
            });
            Some(observer)
        };
        RunnerOptions {
            max_idle: opts.max_idle,
            tool_timeout: opts.tool_timeout,
            // Under an invocation deadline the session ends when only the
            // teardown reserve is left: a call in flight gets at most the
            // reserve's force-stop share, so the teardown still fits.
            call_grace: match self.deadline {
                Some(_) => opts.call_grace.min(STOP_TIMEOUT),
                None => opts.call_grace,
            },
            send_window: self.window.clone(),
            after_call,
            observer,
            ..Default::default()
        }
    }

    /// The runner closed the tools; memory next: the final sync on a clean
    /// end, the flush, dispose — each pass bounded, both fitting before a
    /// hard deadline.
    async fn teardown_memory(&mut self) {
        let Some(stores) = &self.stores else { return };
        let opts = self.worker.options();
        let clean = matches!(&self.report.outcome, ItemOutcome::Served(end) if end.is_clean());
        let bound = match self.deadline {
            // Both bounds must fit before a hard deadline.
            Some(at) => opts.memory_teardown_bound.min(
                at.saturating_duration_since(Instant::now())
                    .saturating_sub(STOP_TIMEOUT + Duration::from_secs(2))
                    / 2,
            ),
            None => opts.memory_teardown_bound,
        };
        // The teardown logs the reference's lines itself when a bound cuts
        // the final sync or the flush off (with this item's span fields).
        self.report.teardown = stores.teardown(clean, bound).await;
    }

    /// After the final flush: remove the item's directory and whatever the
    /// agent left in it (its processes are dead: the runner closed the
    /// tools, which killed the shell's whole tree). By fd, never through a
    /// symlink the agent planted.
    async fn clear_room(&mut self) {
        // Orphans adopted by the worker (a process whose supervisor the
        // agent killed) are children of no session: kill them now.
        match tokio::task::spawn_blocking(crate::cleanroom::sweep_orphans).await {
            Ok(0) => {}
            Ok(n) => info!(processes = n, "killed processes that escaped their session"),
            Err(e) => warn!(error = %e, "cannot sweep orphaned processes"),
        }
        // The shell's supervisor was killed a moment ago: its processes,
        // killed with it, reach this worker (the subreaper) only once the
        // kernel has reparented them, which a loaded host can delay past
        // the sweep above. They are reaped by a second look, a moment later
        // (else each would stay a zombie until the next item's sweep).
        tokio::spawn(async {
            for wait_ms in [500, 2_000, 5_000] {
                tokio::time::sleep(Duration::from_millis(wait_ms)).await;
                if let Ok(n @ 1..) =
                    tokio::task::spawn_blocking(crate::cleanroom::sweep_orphans).await
                {
                    debug!(processes = n, "reaped processes of a session that ended");
                }
            }
        });
        if let Some(sandbox_room) = self.sandbox_room.take()
            && let Err(e) = tokio::task::spawn_blocking(move || sandbox_room.discard()).await
        {
            warn!(error = %e, "cannot remove the session's sandbox directories");
        }
        let Some(room) = self.room.take() else { return };
        let shown = room.path.display().to_string();
        // Renamed out of the way now; removed in the background, so a huge
        // tree does not hold the release (a worker that dies first leaves
        // a `trash-*` the next one removes).
        let remove = match crate::cleanroom::discard_session_dir(room) {
            Ok(remove) => remove,
            Err(e) => {
                warn!(workdir.path = %shown, error = %e, "cannot remove the session directory");
                return;
            }
        };
        tokio::spawn(async move {
            match tokio::task::spawn_blocking(remove).await {
                Ok(Ok(())) => debug!(workdir.path = %shown, "session directory removed"),
                Ok(Err(e)) => {
                    warn!(workdir.path = %shown, error = %e, "cannot remove the session directory")
                }
                Err(e) => {
                    warn!(workdir.path = %shown, error = %e, "cannot remove the session directory")
                }
            }
        });
    }

    /// Stop the watcher and the heartbeat, force-stop the item unless the
    /// lease was lost, and report.
    async fn release(self) -> ItemReport {
        let hand_back = self.hands_back();
        let ItemRun {
            worker,
            item,
            client,
            lease,
            window,
            release,
            heartbeat,
            watcher,
            started,
            mut report,
            ..
        } = self;
        watcher.abort();
        release.cancel();
        let _ = heartbeat.await;
        report.lease = lease.end();
        if lease.is_lost() {
            warn!("lease lost; released without stopping it");
        } else if hand_back {
            report.lease = Some(LeaseEnd::HandedBack);
            if matches!(report.outcome, ItemOutcome::MountPathInUse(_)) {
                warn!(
                    lease.ttl_s = window.get().as_secs(),
                    "released the work item without stopping it, as a memory store's mount path is in use here; another worker (or this one, once the path frees) resumes the session once its lease lapses"
                );
            } else {
                warn!(
                    lease.ttl_s = window.get().as_secs(),
                    "shutting down mid-turn: released the work item without stopping it; another worker resumes the session once its lease lapses"
                );
            }
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
        worker.emit(WorkerEvent::Finished(Box::new(report.clone())));
        // The worker is idle again: a spare supervisor for the next shell.
        crate::tools::spare::replenish();
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_wait_runs_from_created_at_and_never_goes_negative() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-04-01T12:00:10.5Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        assert_eq!(
            queued_for("2026-04-01T12:00:00Z", now),
            Some(Duration::from_millis(10_500))
        );
        // The API's clock ahead of ours: no wait, not a panic or a huge value.
        assert_eq!(
            queued_for("2026-04-01T12:01:00Z", now),
            Some(Duration::ZERO)
        );
        assert_eq!(queued_for("yesterday", now), None);
    }
}
