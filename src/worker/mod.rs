//! The environment worker: claim work items, serve each session's tool
//! calls with its memory stores mounted, and let go cleanly.
//!
//! - [`lease`] — the heartbeat that keeps a claimed item ours;
//! - `item` — one item from claim to force-stop (`handle_item`);
//! - [`poll`] — the always-on poll loop and the webhook's queue drain;
//! - [`standing`] — what the API last said of the environment key.
//!
//! A worker is built once per endpoint from [`WorkerOptions`]; it holds no
//! per-session state, so one worker serves any number of items.

pub(crate) mod item;
pub mod lease;
pub mod poll;
pub mod standing;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::api::types::Redacted;
use crate::api::{Client, Credential};
use crate::memory::SyncReport;
use crate::memory::options::{DeleteMode, MAX_TEARDOWN_BOUND, SyncInterval};
use crate::session::{CallRecord, DEFAULT_CALL_GRACE, DEFAULT_MAX_IDLE, DEFAULT_TOOL_TIMEOUT};

pub use item::{ItemOutcome, ItemReport, WorkItem};

/// A worker could not be built, or an item could not be served.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("{0}")]
    Config(String),
    #[error(
        "the work item's secret payload yielded no sessions token and no environment key is available; provide a secret whose payload carries a sessions_token, or an environment key"
    )]
    NoCredential,
    #[error(
        "this session has memory stores attached, but the work item carried no sessions token (work_id={work_id}, session_id={session_id}); the memory endpoints reject the environment key, so the work item's secret must carry a sessions_token, or run with --memory-sync-interval off"
    )]
    MemoryNoToken { work_id: String, session_id: String },
    #[error("cannot fetch session {session_id}: {source}")]
    Session {
        session_id: String,
        #[source]
        source: Box<crate::api::Error>,
    },
    #[error(transparent)]
    Memory(#[from] crate::memory::MemoryError),
    #[error("poll failed permanently: {0}")]
    Poll(Box<crate::api::Error>),
}

/// What the worker reports as it goes (for a timeline, metrics, tests).
#[derive(Debug, Clone)]
pub enum WorkerEvent {
    Claimed {
        work_id: String,
        session_id: String,
        /// From the item's `created_at` (the API's clock) to its claim;
        /// `None` when the item carried no readable time.
        queued_for: Option<Duration>,
    },
    Call {
        work_id: String,
        record: CallRecord,
    },
    Synced {
        work_id: String,
        report: SyncReport,
        final_sync: bool,
    },
    Finished(Box<ItemReport>),
    /// A request made with the environment key (a poll, an ack, a queue
    /// stats read) failed.
    QueueError {
        class: crate::api::ErrorClass,
    },
}

/// Where a worker sends its [`WorkerEvent`]s.
pub(crate) type EventSink = mpsc::UnboundedSender<WorkerEvent>;

/// Told of every [`WorkerEvent`] as it is emitted, on the emitting task.
///
/// The worker knows its observers only by this trait, so what subscribes
/// (the server's `/metrics` counters, say) depends on the worker and never
/// the other way round. `observe` must be quick and must not block: it runs
/// inline, before the event reaches `WorkerOptions::events`.
pub trait WorkerObserver: Send + Sync {
    fn observe(&self, event: &WorkerEvent);
}

/// Everything a worker is built from; `WorkerOptions::validate` checks it.
#[derive(Clone)]
pub struct WorkerOptions {
    pub environment_id: String,
    /// Polls with it, and serves items whose secret carries no sessions token.
    pub environment_key: Option<Redacted>,
    pub base_url: String,
    /// The agent's working directory, as the reference's `workdir`: the
    /// shell's cwd and the file tools' base, with whatever the operator put
    /// there; skills land in `<workdir>/skills/<name>/` and stores without a
    /// mount path in `<workdir>/memory/<name>/`. With
    /// [`fresh_workdir`](Self::fresh_workdir) it is the root of each item's
    /// own directory instead.
    pub workdir: PathBuf,
    /// Give each item a fresh, empty, private `<workdir>/session-<random>/`
    /// as its working directory, removed at the item's end (see
    /// [`crate::cleanroom`]), instead of the workdir itself. Off by default
    /// (the reference's contract); a drain serving several items at once
    /// turns it on for its items, as two sessions cannot share one working
    /// directory. Stores without a mount path still land in
    /// `<workdir>/memory/`, outside the item's directory, so a dead worker's
    /// folder is found and recovered by the session's next claim.
    pub fresh_workdir: bool,
    /// Our own binary, run as each session's supervisor
    /// (`envworker __supervise`); `None` when the library runs inside
    /// another program (the shell is then its own subreaper).
    pub supervisor: Option<PathBuf>,
    /// Stop serving a session after this long idle past its turn; `None` never.
    pub max_idle: Option<Duration>,
    pub memory_sync_interval: SyncInterval,
    pub memory_sync_deletions: DeleteMode,
    /// Push what the agent writes within about a second (the change-driven
    /// push, `memory::push`). Off by default, as the reference: edits leave
    /// with the periodic syncs, the final sync and the flush only. On, each
    /// edit burst becomes its own memory version and the write requests grow
    /// with the agent's edit rate (they count against the organisation's
    /// rate limits for writes).
    pub memory_push: bool,
    /// Sent as `Anthropic-Worker-ID` on polls.
    pub worker_id: String,
    /// Added to every request (tracing ids, routing).
    pub extra_headers: Vec<(String, String)>,
    pub tool_timeout: Duration,
    /// On shutdown, how long the tool call in flight may run on before it is
    /// cut off and answered with an error (`--call-grace`, 30 s).
    pub call_grace: Duration,
    /// Environment variables holding secrets of this deployment (beyond
    /// `ANTHROPIC_*` / `ENVWORKER_*`), kept out of the agent's shell.
    pub secret_env_vars: Vec<String>,
    /// Cap of `read` and `edit` on whole files; `None` disables it.
    pub(crate) max_file_bytes: Option<u64>,
    /// The bound of the final sync, and separately of the flush (30 s).
    pub memory_teardown_bound: Duration,
    /// The bound of each periodic sync after a tool call (30 s), so a slow
    /// memory API cannot hold the agent's next call. Its own option, not a
    /// CLI flag: the reference has none.
    pub memory_sync_bound: Duration,
    /// Mount paths under `advertised` really live under `actual` (Lambda: `/mnt/memory` → `/tmp/mnt/memory`).
    pub(crate) mount_remap: Option<crate::remap::MountRemap>,
    /// Where each mounted store's sync state is journaled, so a worker that
    /// dies loses no edit (see `memory::journal`); `None`: not journaled.
    /// The CLI's default is `$XDG_STATE_HOME/envworker` (else
    /// `~/.local/state/envworker`; `<tmp>/envworker-<uid>` on Lambda).
    pub state_dir: Option<PathBuf>,
    /// The shell's sandbox, as asked: `None` is the default for the
    /// concurrency (see [`crate::sandbox::Mode::default_for`]).
    pub shell_sandbox_mode: Option<crate::sandbox::Mode>,
    /// What the operator adds to each session's allow-list.
    pub shell_additions: crate::sandbox::Additions,
    /// The sandbox each session's shell gets, decided at start
    /// ([`crate::commands::decide_sandbox`]); `None`: unconfined.
    pub shell_sandbox: Option<crate::sandbox::Enforcement>,
    pub(crate) events: Option<EventSink>,
    /// Told of the same events first, in order (the server's `/metrics` counters).
    pub(crate) observers: Vec<Arc<dyn WorkerObserver>>,
}

impl std::fmt::Debug for WorkerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerOptions")
            .field("environment_id", &self.environment_id)
            .field("base_url", &self.base_url)
            .field("workdir", &self.workdir)
            .field("fresh_workdir", &self.fresh_workdir)
            .field("max_idle", &self.max_idle)
            .field("memory_sync_interval", &self.memory_sync_interval)
            .field("memory_sync_deletions", &self.memory_sync_deletions)
            .field("memory_push", &self.memory_push)
            .field("worker_id", &self.worker_id)
            .finish_non_exhaustive()
    }
}

/// `<hostname>-<12 random hex digits>`, as the Python SDK names its workers.
pub(crate) fn default_worker_id() -> String {
    let host = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    let suffix: u64 = rand::random();
    let suffix = format!("{suffix:016x}");
    if host.is_empty() {
        suffix[..12].to_string()
    } else {
        format!("{host}-{}", &suffix[..12])
    }
}

impl WorkerOptions {
    /// Options with the reference's defaults for everything but the ids.
    pub fn new(environment_id: impl Into<String>, base_url: impl Into<String>) -> Self {
        WorkerOptions {
            environment_id: environment_id.into(),
            environment_key: None,
            base_url: base_url.into(),
            workdir: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
            fresh_workdir: false,
            supervisor: None,
            max_idle: Some(DEFAULT_MAX_IDLE),
            memory_sync_interval: SyncInterval::default(),
            memory_sync_deletions: DeleteMode::default(),
            memory_push: false,
            worker_id: default_worker_id(),
            extra_headers: Vec::new(),
            tool_timeout: DEFAULT_TOOL_TIMEOUT,
            call_grace: DEFAULT_CALL_GRACE,
            secret_env_vars: Vec::new(),
            max_file_bytes: Some(crate::tools::files::DEFAULT_MAX_FILE_BYTES),
            memory_teardown_bound: crate::memory::options::FLUSH_TIMEOUT,
            memory_sync_bound: crate::memory::options::SYNC_BOUND,
            mount_remap: None,
            state_dir: None,
            shell_sandbox_mode: None,
            shell_additions: crate::sandbox::Additions::default(),
            shell_sandbox: None,
            events: None,
            observers: Vec::new(),
        }
    }

    /// Tell `observer` of every event this worker emits (`serve` adds its
    /// per-endpoint metrics this way).
    pub fn add_observer(&mut self, observer: Arc<dyn WorkerObserver>) {
        self.observers.push(observer);
    }

    /// Time a teardown needs before a hard deadline: the final sync and the
    /// flush, each bounded, the force-stop, and slack.
    pub(crate) fn teardown_reserve(&self) -> Duration {
        self.memory_teardown_bound * 2 + item::STOP_TIMEOUT + Duration::from_secs(5)
    }

    pub(crate) fn validate(&self) -> Result<(), WorkerError> {
        if self.base_url.is_empty() {
            return Err(WorkerError::Config("the API base URL is empty".into()));
        }
        if !self.workdir.is_absolute() {
            return Err(WorkerError::Config(format!(
                "the workdir must be an absolute path (got {})",
                self.workdir.display()
            )));
        }
        if self.worker_id.is_empty() {
            return Err(WorkerError::Config("the worker id is empty".into()));
        }
        check_bound(
            "memory teardown bound",
            self.memory_teardown_bound,
            "every flush",
        )?;
        check_bound(
            "memory sync bound",
            self.memory_sync_bound,
            "every periodic sync",
        )?;
        if self.tool_timeout.is_zero() {
            return Err(WorkerError::Config(
                "the tool timeout must be more than zero".into(),
            ));
        }
        Ok(())
    }
}

/// A memory bound between 1 s and an hour: a shorter one cuts off `what`.
fn check_bound(name: &str, bound: Duration, what: &str) -> Result<(), WorkerError> {
    if bound < Duration::from_secs(1) || bound > MAX_TEARDOWN_BOUND {
        return Err(WorkerError::Config(format!(
            "the {name} must be between 1s and {}s (got {bound:?}); a shorter one cuts off {what}",
            MAX_TEARDOWN_BOUND.as_secs(),
        )));
    }
    Ok(())
}

/// Serves work items of one environment. Cheap to clone.
#[derive(Clone)]
pub struct EnvironmentWorker {
    inner: Arc<Inner>,
}

struct Inner {
    options: WorkerOptions,
    /// Carries the environment key (empty without one) and reports to
    /// `watch`; each item's client takes the item's own credential.
    base: Client,
    watch: Arc<standing::KeyWatch>,
}

impl EnvironmentWorker {
    pub fn new(options: WorkerOptions) -> Result<Self, WorkerError> {
        options.validate()?;
        let mut builder = Client::builder(Credential::bearer(
            options
                .environment_key
                .as_ref()
                .map(|k| k.expose().to_string())
                .unwrap_or_default(),
        ))
        .base_url(options.base_url.clone());
        for (name, value) in &options.extra_headers {
            builder = builder
                .extra_header(name, value)
                .map_err(|e| WorkerError::Config(format!("extra header {name}: {e}")))?;
        }
        let watch = Arc::new(standing::KeyWatch::new(
            &options.environment_id,
            options.observers.clone(),
            options.events.clone(),
        ));
        let base = builder
            .build()
            .map_err(|e| WorkerError::Config(e.to_string()))?
            .with_observer(watch.clone());
        Ok(EnvironmentWorker {
            inner: Arc::new(Inner {
                options,
                base,
                watch,
            }),
        })
    }

    /// What the API last said of the environment key.
    pub fn standing(&self) -> standing::Standing {
        self.inner.watch.standing()
    }

    /// A client on the environment key whose outcomes reach [`Self::standing`].
    pub(crate) fn environment_client(&self, helper: &'static str) -> Client {
        self.inner.base.with_helper(helper)
    }

    pub(crate) fn options(&self) -> &WorkerOptions {
        &self.inner.options
    }

    /// The environment's queue statistics (environment key), for `/metrics`.
    pub(crate) async fn queue_stats(
        &self,
    ) -> Result<crate::api::types::WorkQueueStats, crate::api::Error> {
        self.inner
            .base
            .with_helper("environments-worker")
            .work(&self.inner.options.environment_id)
            .stats()
            .await
    }

    /// A client with this worker's headers and `credential`.
    pub(crate) fn client(&self, credential: &Redacted, helper: &'static str) -> Client {
        self.inner
            .base
            .with_credential(Credential::bearer(credential.expose().to_string()))
            .with_helper(helper)
    }

    pub(crate) fn emit(&self, event: WorkerEvent) {
        emit_to(
            &self.inner.options.observers,
            self.inner.options.events.as_ref(),
            event,
        );
    }
}

/// Tell `observers`, then `events`, of `event`.
pub(crate) fn emit_to(
    observers: &[Arc<dyn WorkerObserver>],
    events: Option<&EventSink>,
    event: WorkerEvent,
) {
    for observer in observers {
        observer.observe(&event);
    }
    if let Some(sink) = events {
        let _ = sink.send(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> WorkerOptions {
        let mut o = WorkerOptions::new("env_1", "http://127.0.0.1:1");
        o.workdir = std::env::temp_dir();
        o
    }

    #[test]
    fn options_that_would_lose_data_or_overflow_are_refused() {
        assert!(options().validate().is_ok());
        for (what, change) in [
            (
                "zero teardown bound",
                (|o: &mut WorkerOptions| o.memory_teardown_bound = Duration::ZERO)
                    as fn(&mut WorkerOptions),
            ),
            ("sub-second teardown bound", |o| {
                o.memory_teardown_bound = Duration::from_millis(500)
            }),
            ("teardown bound over an hour", |o| {
                o.memory_teardown_bound = MAX_TEARDOWN_BOUND + Duration::from_secs(1)
            }),
            ("sub-second sync bound", |o| {
                o.memory_sync_bound = Duration::from_millis(500)
            }),
            ("sync bound over an hour", |o| {
                o.memory_sync_bound = MAX_TEARDOWN_BOUND + Duration::from_secs(1)
            }),
            ("zero tool timeout", |o| o.tool_timeout = Duration::ZERO),
            ("relative workdir", |o| o.workdir = PathBuf::from("work")),
            ("empty worker id", |o| o.worker_id.clear()),
        ] {
            let mut o = options();
            change(&mut o);
            assert!(o.validate().is_err(), "{what} was accepted");
        }
    }

    #[test]
    fn the_teardown_reserve_covers_both_bounds_and_the_force_stop() {
        let o = options();
        assert_eq!(o.teardown_reserve(), Duration::from_secs(30 * 2 + 10 + 5));
    }
}
