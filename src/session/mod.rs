//! The session tool runner: answer a session's tool calls until it ends.
//!
//! It opens the event stream first, then reads the whole history (ascending)
//! and reconciles: every tool call without a result is dispatched, so an
//! event emitted between the two reads is never lost and a call left
//! unanswered by an earlier run is answered now. Event ids are deduplicated
//! across the two. On a disconnect it reconnects with jittered backoff
//! (0.5 s doubling to 10 s, reset once a connection stayed up 5 s); a
//! permanent 4xx (any but 408, 409 and 429, as the reference) ends the run.
//!
//! Calls run one at a time. A call the server gated (`evaluated_permission:
//! ask`, or a value this worker does not know) waits for its
//! `user.tool_confirmation`; only `allow` runs it, a `deny` (or a call the
//! server already denied) never runs and nothing is posted. A tool this
//! worker does not serve is left unanswered for its owner. The answer is a
//! `user.tool_result` (`user.custom_tool_result` for a custom tool), posted
//! with retries for as long as the send window allows (the lease's TTL, set
//! on every heartbeat); then the caller's hook runs (the memory sync), and
//! only then the next call — so a call never sees files older than the
//! previous call's sync. A `409` saying the call already has a result (the
//! answer to an attempt that landed was lost) counts as delivered.
//!
//! A result that could not be posted (refused, or still failing when the
//! window ran out) does not end the run: as in the reference, the call stays
//! unanswered and the next reconcile — the history read after the stream
//! reconnects — finds it and answers it again, and the session goes on.
//! Unlike the reference, which runs the tool a second time, the result
//! computed the first time is kept and posted again: a command with side
//! effects does not run twice, and an edit that was made is not reported as
//! failed the second time. A call answered meanwhile (the post landed though
//! its answer was lost, or another client answered it) or of a thread that
//! terminated is forgotten. The slot is still never held for ever: a call
//! that stays undeliverable for [`UNDELIVERED_BOUND_WINDOWS`] send windows
//! after its first post gave up ends the run ([`RunEnd::Undelivered`]).
//!
//! The run ends on `session.status_terminated` / `session.deleted`, after
//! `max_idle` of idle following a turn that ended, on a permanent error, when
//! a result stayed undeliverable past the bound, or when the caller cancels
//! (lease lost, control-plane stop) — which drops the call in flight (the
//! shell is killed) and returns at once: the item is no longer ours, or the
//! control plane took it back.
//!
//! A shutdown of this worker (SIGTERM) is different:
//! the session still waits for the call in flight, and nobody else will
//! answer it. So the call gets [`RunnerOptions::call_grace`] (30 s, as the
//! TypeScript worker drains) to finish and its own result is posted; a call
//! still running then is cut off (its shell killed) and answered with an
//! error saying so, as the `ant` CLI does on SIGTERM (protocol §4.12). The
//! run ends [`RunEnd::Cancelled`] with [`RunReport::mid_turn`] telling the
//! worker whether the session still needs a worker (so the item must go back
//! to the queue, not be stopped).

pub(crate) mod idle;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use rand::RngExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, warn};

use crate::api::types::{
    ListEvents, Order, SessionEvent, UserCustomToolResult, UserToolResult, text_block,
};
use crate::api::{Client, Error};
use crate::tools::ToolHandler;

use self::idle::IdleClock;

pub(crate) const STREAM_BACKOFF_START: Duration = Duration::from_millis(500);
pub(crate) const STREAM_BACKOFF_CAP: Duration = Duration::from_secs(10);
/// A connection that stayed up this long resets the reconnect backoff.
pub(crate) const STREAM_HEALTHY_AFTER: Duration = Duration::from_secs(5);
pub(crate) const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(120);
pub(crate) const DEFAULT_MAX_IDLE: Duration = Duration::from_secs(60);
/// How long a failing result post keeps retrying when the worker gives no lease TTL.
pub(crate) const DEFAULT_SEND_WINDOW: Duration = Duration::from_secs(300);
/// The wait after a result post's first failed attempt; it doubles each time.
pub(crate) const POST_BACKOFF_START: Duration = Duration::from_secs(1);
/// The longest wait between two result post attempts.
pub(crate) const POST_BACKOFF_CAP: Duration = Duration::from_secs(30);
pub(crate) const POST_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long an ending run waits for the call in flight.
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a shutdown lets the call in flight run on before cutting it off
/// (the TypeScript worker's drain; `--call-grace`).
pub const DEFAULT_CALL_GRACE: Duration = DRAIN_TIMEOUT;
/// Slack past a call's deadline before the runner stops waiting for a tool
/// that ignores it.
const DEADLINE_SLACK: Duration = Duration::from_secs(5);
/// How long a call whose result could not be posted may stay undelivered
/// before the run ends ([`RunEnd::Undelivered`]), in send windows counted
/// from the moment its first post gave up. Meanwhile it waits for the next
/// reconcile (the stream's reconnect), which posts the result again, as
/// the reference does. The reference waits without a bound, so a stream
/// that stays up while results cannot be posted would hold the item's slot
/// for ever. Two windows leave room for a reconnect (its backoff is at most
/// 10 s) and for one more complete delivery attempt, which itself retries
/// for a whole window. The window is the lease TTL in the worker, so the
/// bound is two lease TTLs: long enough that a blip of the events endpoint
/// the lease survived does not end the session, short enough that a result
/// the API keeps refusing gives the slot back.
pub const UNDELIVERED_BOUND_WINDOWS: u32 = 2;
/// Attempts of one history read after a (re)connect: the first and two
/// retries of a transient failure, as the reference's client retries any
/// request (its default `max_retries` of 2). A read that still fails skips
/// that reconcile, and only the next reconnect would find a call emitted
/// while the stream was down.
const HISTORY_READ_ATTEMPTS: u32 = 3;
/// The wait before the first retry of a history read; it doubles (jittered),
/// as the reference client's 0.5 s.
const HISTORY_RETRY_START: Duration = Duration::from_millis(500);

/// How long a failing result post may keep retrying: the worker sets it to
/// the lease TTL on every heartbeat, so a post is only abandoned once the
/// lease can no longer be ours. Cheap to clone; all clones share the value.
#[derive(Debug, Clone, Default)]
pub struct SendWindow(Arc<AtomicU64>);

impl SendWindow {
    /// A window of `window` that nothing updates (a runner used without a
    /// lease, or a test). A zero window means the default.
    pub fn fixed(window: Duration) -> SendWindow {
        let fixed = SendWindow::default();
        fixed.set(window);
        fixed
    }

    pub(crate) fn set(&self, window: Duration) {
        self.0.store(window.as_millis() as u64, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> Duration {
        match self.0.load(Ordering::Relaxed) {
            0 => DEFAULT_SEND_WINDOW,
            ms => Duration::from_millis(ms),
        }
    }
}

/// Runs after each call this runner executed and answered (the memory sync).
pub(crate) type AfterCall = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// Sees each call the runner dealt with (for a timeline, metrics, tests).
pub(crate) type Observer = Arc<dyn Fn(&CallRecord) + Send + Sync>;

#[derive(Clone)]
pub struct RunnerOptions {
    /// Stop after this long idle once a turn ended; `None` runs until the session ends.
    pub max_idle: Option<Duration>,
    /// The bound of one tool call; an error result says it timed out.
    pub tool_timeout: Duration,
    /// How long a failing result post keeps retrying (the worker keeps it at the lease TTL).
    pub send_window: SendWindow,
    /// The first wait between result post attempts (doubling, up to `post_backoff_cap`).
    pub post_backoff_start: Duration,
    pub post_backoff_cap: Duration,
    /// On shutdown, how long the call in flight may run on before it is cut
    /// off and answered with an error.
    pub call_grace: Duration,
    pub after_call: Option<AfterCall>,
    pub observer: Option<Observer>,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        RunnerOptions {
            max_idle: Some(DEFAULT_MAX_IDLE),
            tool_timeout: DEFAULT_TOOL_TIMEOUT,
            send_window: SendWindow::default(),
            post_backoff_start: POST_BACKOFF_START,
            post_backoff_cap: POST_BACKOFF_CAP,
            call_grace: DEFAULT_CALL_GRACE,
            after_call: None,
            observer: None,
        }
    }
}

/// Why a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// `session.status_terminated` or `session.deleted`.
    Terminated,
    /// Idle for `max_idle` after the turn ended: the normal end of a stint.
    Idle,
    /// The caller cancelled: the lease ended (lost, control-plane stop), and
    /// the call in flight was dropped unanswered; or the worker is shutting
    /// down ([`SessionRunner::run_until`]), and the call in flight was
    /// answered first (see [`RunReport::mid_turn`]).
    Cancelled,
    /// A permanent error (401, 403, 404 …) on the event stream.
    Fatal(String),
    /// A tool result stayed undeliverable past the bound
    /// ([`UNDELIVERED_BOUND_WINDOWS`] send windows after its first post gave
    /// up), though each reconcile meanwhile posted it again. The agent would
    /// wait for it for ever, so the run ends and the worker lets the item go
    /// (final sync, flush, stop) instead of holding its slot. `error` is the
    /// last post's failure.
    Undelivered { tool_use_id: String, error: String },
}

impl RunEnd {
    /// A clean end: the session is done with this worker for now, and its
    /// memory gets a final sync.
    pub(crate) fn is_clean(&self) -> bool {
        matches!(
            self,
            RunEnd::Terminated | RunEnd::Idle | RunEnd::Undelivered { .. }
        )
    }
}

/// What happened to one tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallOutcome {
    /// Executed; `posted` tells whether the result reached the session.
    Answered { is_error: bool, posted: bool },
    /// Denied (by the server or the user): not executed, nothing posted.
    Denied,
    /// Not a tool this worker serves: left for its owner.
    NotOwned,
}

#[derive(Debug, Clone)]
pub struct CallRecord {
    pub tool_use_id: String,
    pub name: String,
    pub outcome: CallOutcome,
    pub(crate) duration: Duration,
    /// What the call was about: the command, the file or the pattern.
    #[cfg_attr(
        not(feature = "devserver"),
        expect(dead_code, reason = "`dev`'s timeline")
    )]
    pub(crate) detail: Option<String>,
    /// The first line of the result text (for a timeline), when there is one.
    #[cfg_attr(
        not(feature = "devserver"),
        expect(dead_code, reason = "`dev`'s timeline")
    )]
    pub(crate) summary: Option<String>,
}

/// The command, file or pattern of a call's input, shortened.
fn call_detail(input: &Value) -> Option<String> {
    ["command", "file_path", "pattern", "path"]
        .iter()
        .find_map(|k| input.get(*k).and_then(Value::as_str))
        .map(|t| {
            let line = t.lines().next().unwrap_or_default();
            let mut short: String = line.chars().take(100).collect();
            if short.len() < t.len() {
                short.push('…');
            }
            short
        })
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunStats {
    pub executed: usize,
    pub errors: usize,
    pub posted: usize,
    pub post_failures: usize,
    pub denied: usize,
    pub not_owned: usize,
}

#[derive(Debug, Clone)]
pub struct RunReport {
    pub end: RunEnd,
    pub stats: RunStats,
    /// Set when the run ended on the worker's shutdown: whether the session
    /// still needs a worker (a call was in flight, queued or held, or its
    /// turn had not ended). The item must then go back to the queue rather
    /// than be stopped: a stopped item with a turn under way strands the
    /// session (protocol §4.15: only a `user.interrupt` re-queues it).
    pub mid_turn: Option<bool>,
}

/// A tool call as the runner sees it, built-in or custom.
#[derive(Debug, Clone)]
struct Call {
    id: String,
    name: String,
    input: Value,
    permission: Option<String>,
    thread: Option<String>,
    custom: bool,
}

impl Call {
    fn from_event(event: &SessionEvent) -> Option<Call> {
        match event {
            SessionEvent::AgentToolUse(e) => Some(Call {
                id: e.id.clone(),
                name: e.name.clone(),
                input: e.input.clone(),
                permission: e.evaluated_permission.clone(),
                thread: e.session_thread_id.clone(),
                custom: false,
            }),
            SessionEvent::AgentCustomToolUse(e) => Some(Call {
                id: e.id.clone(),
                name: e.name.clone(),
                input: e.input.clone(),
                permission: None,
                thread: e.session_thread_id.clone(),
                custom: true,
            }),
            _ => None,
        }
    }

    fn result(&self, content: Vec<Value>, is_error: bool) -> SessionEvent {
        if self.custom {
            SessionEvent::UserCustomToolResult(UserCustomToolResult {
                id: None,
                processed_at: None,
                custom_tool_use_id: self.id.clone(),
                content,
                is_error,
            })
        } else {
            SessionEvent::UserToolResult(UserToolResult {
                id: None,
                processed_at: None,
                tool_use_id: self.id.clone(),
                content,
                is_error,
            })
        }
    }
}

/// The id a result or confirmation event refers to.
fn answered_id(event: &SessionEvent) -> Option<&str> {
    match event {
        SessionEvent::UserToolResult(r) => Some(&r.tool_use_id),
        SessionEvent::UserCustomToolResult(r) => Some(&r.custom_tool_use_id),
        _ => None,
    }
}

fn terminated_thread(event: &SessionEvent) -> Option<String> {
    match event {
        SessionEvent::Other(v) if event.event_type() == "session.thread_status_terminated" => v
            .get("session_thread_id")
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    }
}

fn ends_session(event: &SessionEvent) -> bool {
    matches!(
        event,
        SessionEvent::StatusTerminated(_) | SessionEvent::Deleted(_)
    )
}

/// What the stream task tells the runner.
enum Feed {
    /// The whole history, read right after the stream (re)connected.
    History(Result<Vec<SessionEvent>, Error>),
    Live(SessionEvent),
    Fatal(Error),
}

/// Drives one session's tool calls; see the module docs.
pub struct SessionRunner {
    client: Client,
    session_id: String,
    tools: Arc<dyn ToolHandler>,
    options: RunnerOptions,
}

/// The runner's bookkeeping of one run.
#[derive(Default)]
struct State {
    seen: HashSet<String>,
    answered: HashSet<String>,
    confirmations: HashMap<String, String>,
    awaiting: HashMap<String, Call>,
    queue: VecDeque<(Call, bool)>,
    terminated_threads: HashSet<String>,
    /// Results computed and not delivered, by call id.
    undelivered: HashMap<String, Undelivered>,
    clock: IdleClock,
    stats: RunStats,
}

/// A result computed and not delivered: posted again, as it is, when a
/// reconcile finds its call still unanswered.
struct Undelivered {
    result: SessionEvent,
    /// The call's thread: a result for a terminated thread is forgotten.
    thread: Option<String>,
    /// When its first post gave up: the bound counts from here.
    since: Instant,
    /// The last post's failure.
    error: String,
}

/// One call dealt with: run and answered (then synced), or its kept result
/// posted again.
struct Done {
    call: Call,
    /// Released by an `allow` verdict: it holds the idle clock until now.
    allowed: bool,
    /// The run's record; `None` when a kept result was posted again.
    executed: Option<CallRecord>,
    result: SessionEvent,
    /// Why the result could not be delivered, if it could not.
    undelivered: Option<String>,
}

/// The call being run, answered and synced, and the token that cuts it off
/// (its command is killed and an error result posted in its place).
struct InFlight {
    done: BoxFuture<'static, Done>,
    cut_off: CancellationToken,
}

impl SessionRunner {
    /// `client` carries the credential for the session's endpoints (the
    /// work item's sessions token, or the environment key).
    pub fn new(
        client: Client,
        session_id: impl Into<String>,
        tools: Arc<dyn ToolHandler>,
        options: RunnerOptions,
    ) -> Self {
        SessionRunner {
            client: client.with_helper("session-tool-runner"),
            session_id: session_id.into(),
            tools,
            options,
        }
    }

    /// Run until the session ends, goes idle, fails permanently or `cancel`
    /// fires. The tools are closed before this returns.
    pub async fn run(self, cancel: CancellationToken) -> RunReport {
        self.run_until(cancel, CancellationToken::new()).await
    }

    /// [`run`](Self::run), and also until `shutdown` fires: then the call in
    /// flight is answered (its own result within the call grace, else an
    /// error) and the run ends [`RunEnd::Cancelled`], with
    /// [`RunReport::mid_turn`] set when the session still needs a worker.
    pub async fn run_until(
        self,
        cancel: CancellationToken,
        shutdown: CancellationToken,
    ) -> RunReport {
        info!(session_id = %self.session_id, "session tool runner starting");
        let (tx, mut feed) = mpsc::channel(1024);
        let stream_stop = CancellationToken::new();
        let stream = tokio::spawn(stream_task(
            self.client.clone(),
            self.session_id.clone(),
            tx,
            stream_stop.clone(),
        ));
        let mut st = State::default();
        let mut in_flight: Option<InFlight> = None;
        let mut mid_turn = None;
        let end = loop {
            if in_flight.is_none() {
                in_flight = self.next_call(&mut st);
            }
            let idle_deadline = self.idle_deadline(&st, in_flight.is_some());
            let undelivered_deadline = self.undelivered_deadline(&st);
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break RunEnd::Cancelled,
                _ = shutdown.cancelled() => {
                    mid_turn = Some(self.mid_turn(&st, in_flight.is_some()));
                    break RunEnd::Cancelled;
                }
                done = async { (&mut in_flight.as_mut().expect("guarded").done).await }, if in_flight.is_some() => {
                    in_flight = None;
                    self.finish_call(&mut st, done);
                }
                msg = feed.recv() => if let Some(end) = self.on_feed(&mut st, msg) {
                    break end;
                },
                _ = sleep_until(idle_deadline), if idle_deadline.is_some() => {
                    let max = self.options.max_idle.unwrap_or_default();
                    info!(session_id = %self.session_id, max_idle_s = max.as_secs_f64(), "session idle for {:.0}s after its turn ended; stopping", max.as_secs_f64());
                    break RunEnd::Idle;
                }
                _ = sleep_until(undelivered_deadline), if undelivered_deadline.is_some() => {
                    break self.give_up_undelivered(&mut st);
                }
            }
        };
        stream_stop.cancel();
        stream.abort();
        if let Some(in_flight) = in_flight.take() {
            self.settle_in_flight(&mut st, in_flight, &end, mid_turn.is_some(), &cancel)
                .await;
        }
        self.tools.close().await;
        info!(session_id = %self.session_id, end = ?end, executed = st.stats.executed, "session tool runner stopped");
        RunReport {
            end,
            stats: st.stats,
            mid_turn,
        }
    }

    /// When the idle countdown ends the run: once a turn ended, with no call
    /// in flight or queued.
    fn idle_deadline(&self, st: &State, in_flight: bool) -> Option<Instant> {
        match (self.options.max_idle, st.clock.armed_at()) {
            (Some(max), Some(at)) if !in_flight && st.queue.is_empty() => Some(at + max),
            _ => None,
        }
    }

    /// What the stream task said; the run's end when it ends the run.
    fn on_feed(&self, st: &mut State, msg: Option<Feed>) -> Option<RunEnd> {
        match msg {
            None => Some(RunEnd::Fatal("the event stream task ended".into())),
            // The session itself is gone (deleted while the stream
            // reconnected, before its `session.deleted` event was read):
            // that is the end of the session, not a failure.
            Some(Feed::Fatal(e)) if e.status() == Some(404) => {
                info!(session_id = %self.session_id, error = %e, "session not found; it was deleted");
                Some(RunEnd::Terminated)
            }
            Some(Feed::Fatal(e)) => {
                error!(session_id = %self.session_id, error = %e, "stream failed permanently");
                Some(RunEnd::Fatal(e.to_string()))
            }
            Some(Feed::History(history)) => self.reconcile(st, history).then(|| {
                info!(session_id = %self.session_id, "session terminated");
                RunEnd::Terminated
            }),
            Some(Feed::Live(event)) => self.on_live(st, event).then(|| {
                info!(session_id = %self.session_id, "session terminated");
                RunEnd::Terminated
            }),
        }
    }

    /// An ending run lets the call in flight finish (bounded) unless the
    /// session is gone or the caller cancelled: then it is dropped, which
    /// kills its command. A shutdown answers it whatever happens.
    async fn settle_in_flight(
        &self,
        st: &mut State,
        in_flight: InFlight,
        end: &RunEnd,
        shutting_down: bool,
        cancel: &CancellationToken,
    ) {
        let InFlight {
            done: call,
            cut_off,
        } = in_flight;
        if shutting_down {
            self.answer_before_shutdown(st, call, cut_off, cancel).await;
        } else if matches!(end, RunEnd::Idle | RunEnd::Fatal(_)) {
            match tokio::time::timeout(DRAIN_TIMEOUT, call).await {
                Ok(done) => self.finish_call(st, done),
                Err(_) => {
                    warn!(session_id = %self.session_id, "the tool call in flight did not finish within {}s; dropping it", DRAIN_TIMEOUT.as_secs())
                }
            }
        } else {
            drop(call);
        }
    }

    /// Whether the session still needs a worker: a call is in flight,
    /// queued, held for its confirmation or waiting to be answered again, or
    /// the turn has not ended (the idle countdown is not running).
    fn mid_turn(&self, st: &State, in_flight: bool) -> bool {
        in_flight
            || !st.queue.is_empty()
            || !st.awaiting.is_empty()
            || !st.undelivered.is_empty()
            || st.clock.armed_at().is_none()
    }

    /// On shutdown: give the call in flight the call grace to finish (its
    /// own result is posted), then cut it off (its command is killed and an
    /// error result posted instead). Either way the session gets an answer:
    /// nobody else would give one. Unless the lease ends meanwhile (`cancel`):
    /// then the item is not ours to answer for, and the call is dropped.
    async fn answer_before_shutdown(
        &self,
        st: &mut State,
        mut call: BoxFuture<'static, Done>,
        cut_off: CancellationToken,
        cancel: &CancellationToken,
    ) {
        let grace = self.options.call_grace;
        info!(session_id = %self.session_id, call_grace_ms = grace.as_millis() as u64, "shutting down; letting the tool call in flight finish before answering it");
        let answered = async {
            match tokio::time::timeout(grace, &mut call).await {
                Ok(done) => done,
                Err(_) => {
                    cut_off.cancel();
                    call.await
                }
            }
        };
        tokio::select! {
            done = answered => self.finish_call(st, done),
            _ = cancel.cancelled() => {
                warn!(session_id = %self.session_id, "the lease ended while the tool call in flight was being answered; dropping it");
            }
        }
    }

    /// Read the reconnect's history: pair calls with results, record
    /// verdicts, then dispatch what is still unanswered. `true` when the
    /// history says the session ended.
    fn reconcile(&self, st: &mut State, history: Result<Vec<SessionEvent>, Error>) -> bool {
        let events = match history {
            Ok(events) => events,
            Err(e) => {
                // Part of the history may be missing: dispatching now could
                // re-run a call whose result sits on an unread page.
                warn!(session_id = %self.session_id, error = %e, "reconcile list failed; skipping pending enqueue");
                return false;
            }
        };
        let mut pending = Vec::new();
        let mut last_ended_turn = false;
        for event in &events {
            if ends_session(event) {
                return true;
            }
            if let Some(call) = Call::from_event(event) {
                st.seen.insert(call.id.clone());
                pending.push(call);
            } else if let Some(id) = answered_id(event) {
                st.answered.insert(id.to_string());
            } else if let SessionEvent::UserToolConfirmation(c) = event {
                if !st.answered.contains(&c.tool_use_id) {
                    st.confirmations
                        .insert(c.tool_use_id.clone(), c.result.clone());
                }
            } else if let Some(thread) = terminated_thread(event) {
                st.terminated_threads.insert(thread);
            }
            if !idle::is_neutral(event) {
                last_ended_turn = idle::ends_turn(event);
            }
        }
        self.drop_terminated_holds(st);
        self.forget_settled_results(st);
        let unanswered: Vec<Call> = pending
            .into_iter()
            .filter(|c| !st.answered.contains(&c.id))
            .collect();
        st.clock.disarm();
        for call in &unanswered {
            self.route(st, call.clone());
        }
        let held_with_verdict: Vec<Call> = st
            .awaiting
            .values()
            .filter(|c| st.confirmations.contains_key(&c.id))
            .cloned()
            .collect();
        for call in held_with_verdict {
            let verdict = st.confirmations[&call.id].clone();
            self.apply_verdict(st, call, &verdict);
        }
        // Gated calls do not count (the clock holds them), nor does a call
        // already settled, of a dead thread, or released to a tool we serve.
        let settled = |c: &Call| {
            st.answered.contains(&c.id)
                || self.in_terminated_thread(st, c)
                || st.awaiting.contains_key(&c.id)
                || (st.confirmations.contains_key(&c.id) && self.tools.owns(&c.name))
        };
        let outstanding = unanswered.iter().any(|c| !settled(c));
        if last_ended_turn && !outstanding {
            st.clock.arm();
        }
        false
    }

    /// One live event. `true` when the session ended.
    fn on_live(&self, st: &mut State, event: SessionEvent) -> bool {
        st.clock.note(&event);
        if ends_session(&event) {
            return true;
        }
        if let Some(call) = Call::from_event(&event) {
            if st.seen.insert(call.id.clone()) {
                self.route(st, call);
            }
        } else if let Some(id) = answered_id(&event) {
            st.answered.insert(id.to_string());
            self.forget_settled_results(st);
        } else if let SessionEvent::UserToolConfirmation(c) = &event {
            st.confirmations
                .insert(c.tool_use_id.clone(), c.result.clone());
            if let Some(held) = st.awaiting.get(&c.tool_use_id).cloned() {
                self.apply_verdict(st, held, &c.result);
            }
        } else if let Some(thread) = terminated_thread(&event) {
            st.terminated_threads.insert(thread);
            self.drop_terminated_holds(st);
            self.forget_settled_results(st);
        }
        false
    }

    /// Forget the kept results of calls that need none any more: answered
    /// meanwhile (a post that landed though its answer was lost, or another
    /// client), or of a thread that terminated (the API takes no result).
    fn forget_settled_results(&self, st: &mut State) {
        let (answered, terminated) = (&st.answered, &st.terminated_threads);
        st.undelivered.retain(|id, kept| {
            let settled = answered.contains(id)
                || kept.thread.as_ref().is_some_and(|t| terminated.contains(t));
            if settled {
                info!(session_id = %self.session_id, tool_use_id = %id, "the call whose result could not be posted needs none any more (answered, or its thread terminated); forgetting the result");
            }
            !settled
        });
    }

    /// When the oldest undelivered result passes the bound.
    fn undelivered_deadline(&self, st: &State) -> Option<Instant> {
        let bound = self.options.send_window.get() * UNDELIVERED_BOUND_WINDOWS;
        st.undelivered.values().map(|u| u.since + bound).min()
    }

    /// The bound passed: end the run over the oldest undelivered result.
    fn give_up_undelivered(&self, st: &mut State) -> RunEnd {
        let (id, kept) = st
            .undelivered
            .iter()
            .min_by_key(|(_, u)| u.since)
            .expect("a deadline means an undelivered result");
        let waited = kept.since.elapsed();
        error!(
            session_id = %self.session_id,
            tool_use_id = %id,
            undelivered_ms = waited.as_millis() as u64,
            bound_windows = UNDELIVERED_BOUND_WINDOWS,
            error = %kept.error,
            "tool result still undeliverable {:.0}s after its post first gave up ({} send windows, the bound); ending the session's work item so its slot is not held",
            waited.as_secs_f64(),
            UNDELIVERED_BOUND_WINDOWS
        );
        RunEnd::Undelivered {
            tool_use_id: id.clone(),
            error: kept.error.clone(),
        }
    }

    fn in_terminated_thread(&self, st: &State, call: &Call) -> bool {
        call.thread
            .as_ref()
            .is_some_and(|t| st.terminated_threads.contains(t))
    }

    fn drop_terminated_holds(&self, st: &mut State) {
        let dead: Vec<String> = st
            .awaiting
            .values()
            .filter(|c| self.in_terminated_thread(st, c))
            .map(|c| c.id.clone())
            .collect();
        for id in dead {
            if let Some(call) = st.awaiting.remove(&id) {
                info!(session_id = %self.session_id, tool = %call.name, tool_use_id = %call.id, "thread terminated; not executing");
                st.clock.release();
            }
        }
    }

    /// Queue a call, hold it for its confirmation, or resolve it as denied.
    fn route(&self, st: &mut State, call: Call) {
        if self.in_terminated_thread(st, &call) {
            debug!(tool = %call.name, tool_use_id = %call.id, "thread terminated; not executing");
            return;
        }
        if call.permission.as_deref() == Some("deny") {
            // The server denied it: never run, whatever verdict exists.
            self.resolve_denied(st, &call);
            return;
        }
        match st.confirmations.get(&call.id).cloned() {
            None => match call.permission.as_deref() {
                None | Some("allow") => self.enqueue(st, call, false),
                // `ask`, or a value this worker does not know: fail closed.
                Some(_) => {
                    if !st.awaiting.contains_key(&call.id) {
                        info!(session_id = %self.session_id, tool = %call.name, tool_use_id = %call.id, "tool requires user confirmation; holding until user.tool_confirmation");
                        st.clock.hold();
                        st.awaiting.insert(call.id.clone(), call);
                    }
                }
            },
            Some(verdict) => self.apply_verdict(st, call, &verdict),
        }
    }

    fn apply_verdict(&self, st: &mut State, call: Call, verdict: &str) {
        let was_held = st.awaiting.remove(&call.id).is_some();
        if verdict == "allow" {
            info!(session_id = %self.session_id, tool = %call.name, tool_use_id = %call.id, "tool call confirmed");
            if !was_held {
                st.clock.hold();
            }
            // The hold stays until the call is done with.
            self.enqueue(st, call, true);
        } else {
            // `deny`, or a verdict this worker does not know: never run.
            if was_held {
                st.clock.release();
            }
            self.resolve_denied(st, &call);
        }
    }

    fn resolve_denied(&self, st: &mut State, call: &Call) {
        if !st.answered.insert(call.id.clone()) {
            return;
        }
        info!(session_id = %self.session_id, tool = %call.name, tool_use_id = %call.id, "tool call denied; not executing");
        st.stats.denied += 1;
        self.observe(&CallRecord {
            tool_use_id: call.id.clone(),
            name: call.name.clone(),
            outcome: CallOutcome::Denied,
            duration: Duration::ZERO,
            detail: call_detail(&call.input),
            summary: None,
        });
    }

    fn enqueue(&self, st: &mut State, call: Call, allowed: bool) {
        if st.queue.iter().any(|(c, _)| c.id == call.id) {
            if allowed {
                st.clock.release();
            }
            return;
        }
        st.queue.push_back((call, allowed));
    }

    fn observe(&self, record: &CallRecord) {
        if let Some(observer) = &self.options.observer {
            observer(record);
        }
    }

    /// Start the next queued call that still needs running.
    fn next_call(&self, st: &mut State) -> Option<InFlight> {
        while let Some((call, allowed)) = st.queue.pop_front() {
            let skip = if self.in_terminated_thread(st, &call) {
                info!(session_id = %self.session_id, tool = %call.name, tool_use_id = %call.id, "thread terminated; not executing");
                true
            } else if st.answered.contains(&call.id) {
                true
            } else if let Some(kept) = st.undelivered.get(&call.id) {
                return Some(InFlight {
                    done: self.post_again(call, allowed, kept.result.clone()),
                    cut_off: CancellationToken::new(),
                });
            } else if !self.tools.owns(&call.name) {
                info!(session_id = %self.session_id, tool = %call.name, tool_use_id = %call.id, "tool not owned by this runner; leaving the tool_use_id pending for its owner");
                st.stats.not_owned += 1;
                self.observe(&CallRecord {
                    tool_use_id: call.id.clone(),
                    name: call.name.clone(),
                    outcome: CallOutcome::NotOwned,
                    duration: Duration::ZERO,
                    detail: call_detail(&call.input),
                    summary: None,
                });
                if allowed {
                    // The owner still has to answer: no countdown for it.
                    st.clock.disarm();
                }
                true
            } else {
                false
            };
            if skip {
                if allowed {
                    st.clock.release();
                }
                continue;
            }
            let cut_off = CancellationToken::new();
            return Some(InFlight {
                done: self.execute(call, allowed, cut_off.clone()),
                cut_off,
            });
        }
        None
    }

    /// Run, post, then the hook — one future, so the next call waits for all
    /// three. `cut_off` ends the tool early (shutdown): the command is
    /// dropped (killed) and an error result is posted in its place.
    fn execute(
        &self,
        call: Call,
        allowed: bool,
        cut_off: CancellationToken,
    ) -> BoxFuture<'static, Done> {
        let tools = self.tools.clone();
        let delivery = self.delivery();
        let timeout = self.options.tool_timeout;
        let hook = self.options.after_call.clone();
        let observer = self.options.observer.clone();
        // The call's span: the tool's run and its result's delivery (not the
        // hook's sync after it, a sibling under the work item). Never the
        // input or the output: they may hold anything the agent saw.
        let span = tracing::info_span!(
            "tool_call",
            session_id = %delivery.session_id,
            tool.name = %call.name,
            tool_use_id = %call.id,
            is_error = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        let answered = span.clone();
        async move {
            let session_id = &delivery.session_id;
            let run = async {
                info!(session_id = %session_id, tool = %call.name, tool_use_id = %call.id, "executing tool");
                let started = Instant::now();
                let (content, is_error) =
                    run_tool(&*tools, session_id, &call, timeout, started, &cut_off).await;
                let duration = started.elapsed();
                let summary = first_line(&content);
                info!(
                    session_id = %session_id,
                    tool = %call.name,
                    tool_use_id = %call.id,
                    is_error,
                    duration_ms = duration.as_millis() as u64,
                    "tool call finished"
                );
                answered.record("is_error", is_error);
                answered.record("duration_ms", duration.as_millis() as u64);
                let result = call.result(content, is_error);
                let delivered = delivery.post(&call.id, &result).await;
                (is_error, duration, summary, result, delivered)
            }
            .instrument(span);
            let (is_error, duration, summary, result, delivered) = run.await;
            let posted = delivered.is_ok();
            let record = CallRecord {
                tool_use_id: call.id.clone(),
                name: call.name.clone(),
                outcome: CallOutcome::Answered { is_error, posted },
                duration,
                detail: call_detail(&call.input),
                summary,
            };
            // Seen before the hook's sync, in the order things happened.
            if let Some(observer) = &observer {
                observer(&record);
            }
            if let Some(hook) = hook {
                hook().await;
            }
            Done {
                call,
                allowed,
                executed: Some(record),
                result,
                undelivered: delivered.err(),
            }
        }
        .boxed()
    }

    /// Where this run's results go, and how hard to try.
    fn delivery(&self) -> Delivery {
        Delivery {
            client: self.client.clone(),
            session_id: self.session_id.clone(),
            window: self.options.send_window.clone(),
            backoff: (
                self.options.post_backoff_start,
                self.options.post_backoff_cap,
            ),
        }
    }

    /// Post a kept result again (a reconcile found its call unanswered). The
    /// tool does not run again, so no hook either: nothing changed on disk.
    fn post_again(
        &self,
        call: Call,
        allowed: bool,
        result: SessionEvent,
    ) -> BoxFuture<'static, Done> {
        let delivery = self.delivery();
        let span = tracing::info_span!(
            "tool_result_again",
            session_id = %delivery.session_id,
            tool.name = %call.name,
            tool_use_id = %call.id,
        );
        async move {
            let session_id = &delivery.session_id;
            info!(session_id = %session_id, tool = %call.name, tool_use_id = %call.id, "posting the tool result again at the reconcile (the result computed when the call ran; the tool does not run twice)");
            let delivered = delivery.post(&call.id, &result).await;
            if delivered.is_ok() {
                info!(session_id = %session_id, tool = %call.name, tool_use_id = %call.id, "tool result delivered at the reconcile; the session goes on");
            }
            Done {
                call,
                allowed,
                executed: None,
                result,
                undelivered: delivered.err(),
            }
        }
        .instrument(span)
        .boxed()
    }

    /// Count a finished call. A result not delivered is kept for the next
    /// reconcile; the bound runs from its first failure.
    fn finish_call(&self, st: &mut State, done: Done) {
        let Done {
            call,
            allowed,
            executed,
            result,
            undelivered,
        } = done;
        if let Some(CallRecord {
            outcome: CallOutcome::Answered { is_error, .. },
            ..
        }) = executed
        {
            st.stats.executed += 1;
            st.stats.errors += is_error as usize;
        }
        match undelivered {
            None => {
                st.stats.posted += 1;
                st.undelivered.remove(&call.id);
                st.answered.insert(call.id);
            }
            Some(error) => {
                st.stats.post_failures += 1;
                st.undelivered
                    .entry(call.id)
                    .and_modify(|kept| kept.error.clone_from(&error))
                    .or_insert(Undelivered {
                        result,
                        thread: call.thread,
                        since: Instant::now(),
                        error,
                    });
            }
        }
        if allowed {
            st.clock.release();
        }
    }
}

/// Where a call's results go, and how hard to try: what a call's future
/// takes from the runner, which it outlives.
struct Delivery {
    client: Client,
    session_id: String,
    window: SendWindow,
    backoff: (Duration, Duration),
}

impl Delivery {
    /// [`post_result`] for this session.
    async fn post(&self, tool_use_id: &str, result: &SessionEvent) -> Result<(), String> {
        post_result(
            &self.client,
            &self.session_id,
            tool_use_id,
            result,
            self.backoff,
            &self.window,
        )
        .await
    }
}

/// Run one call's tool (started at `started`) within `timeout`, unless
/// `cut_off` fires first: the result's content and whether it is an error.
async fn run_tool(
    tools: &dyn ToolHandler,
    session_id: &str,
    call: &Call,
    timeout: Duration,
    started: Instant,
    cut_off: &CancellationToken,
) -> (Vec<Value>, bool) {
    let deadline = started + timeout;
    let outcome = tokio::select! {
        outcome = tokio::time::timeout(
            timeout + DEADLINE_SLACK,
            tools.call(&call.name, call.input.clone(), deadline),
        ) => Some(outcome),
        _ = cut_off.cancelled() => None,
    };
    match outcome {
        None => {
            let ran = started.elapsed();
            warn!(session_id = %session_id, tool = %call.name, tool_use_id = %call.id, duration_ms = ran.as_millis() as u64, "tool call cut off by the worker's shutdown; answering it with an error");
            (
                vec![text_block(format!(
                    "tool {:?} was cut off after {:.1}s: the worker running it shut down (SIGTERM) before it finished. Its command was killed and may have done part of its work; run it again if it is still needed.",
                    call.name,
                    ran.as_secs_f64()
                ))],
                true,
            )
        }
        Some(Ok(Ok(output))) => (output.into_content(), false),
        Some(Ok(Err(e))) => {
            let text = if e.message.is_empty() {
                "(no output)".to_string()
            } else {
                e.message
            };
            (vec![text_block(text)], true)
        }
        Some(Err(_)) => (
            vec![text_block(format!(
                "tool {:?} timed out after {}s",
                call.name,
                timeout.as_secs()
            ))],
            true,
        ),
    }
}

/// The first line of a result's first text block, at most 120 characters
/// (a timeline's summary of the call).
fn first_line(content: &[Value]) -> Option<String> {
    content
        .first()
        .and_then(|b| b.get("text"))
        .and_then(Value::as_str)
        .map(|t| {
            t.lines()
                .next()
                .unwrap_or_default()
                .chars()
                .take(120)
                .collect()
        })
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Post one result, retrying every failure but a permanent refusal with
/// jittered backoff (`start` doubling to `cap`) for as long as the send
/// window allows; each attempt is bounded. `Ok` once the session has the
/// result — including a `409` saying it already had it, the answer to a
/// retry of an attempt that landed. `Err` (logged here, once, in the
/// reference's words) when it could not be delivered this time.
async fn post_result(
    client: &Client,
    session_id: &str,
    tool_use_id: &str,
    event: &SessionEvent,
    (start, cap): (Duration, Duration),
    window: &SendWindow,
) -> Result<(), String> {
    let started = Instant::now();
    let mut backoff = start;
    let mut attempt = 0u32;
    let failure = loop {
        attempt += 1;
        let sent = tokio::time::timeout(
            POST_ATTEMPT_TIMEOUT,
            client
                .sessions()
                .send_events(session_id, vec![event.clone()]),
        )
        .await;
        let err = match sent {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) if already_answered(&e) => {
                info!(session_id = %session_id, tool_use_id = %tool_use_id, attempt, "tool result was already delivered (409: the call has a result); counting it as delivered");
                return Ok(());
            }
            Ok(Err(e)) if e.is_permanent() && !is_conflict(&e) => break e.to_string(),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {}s", POST_ATTEMPT_TIMEOUT.as_secs()),
        };
        let remaining = window.get().saturating_sub(started.elapsed());
        if remaining.is_zero() {
            break format!(
                "{err} (still failing after {attempt} attempts over {:.1}s, the send window)",
                started.elapsed().as_secs_f64()
            );
        }
        let wait = backoff
            .mul_f64(rand::rng().random_range(0.5..=1.0))
            .min(remaining);
        warn!(session_id = %session_id, tool_use_id = %tool_use_id, attempt, backoff_ms = wait.as_millis() as u64, error = %err, "tool result send failed; retrying");
        tokio::time::sleep(wait).await;
        backoff = backoff.saturating_mul(2).min(cap);
    };
    error!(session_id = %session_id, tool_use_id = %tool_use_id, attempts = attempt, error = %failure, "failed to send tool result; the call is answered again at the next reconcile (after the event stream reconnects)");
    Err(failure)
}

fn is_conflict(e: &Error) -> bool {
    e.status() == Some(409)
}

/// A stream error no reconnect can mend: a 4xx but 408, 409 and 429 (the
/// reference's fatal set; a `409` is a conflict worth retrying), or a
/// response that cannot be read.
fn ends_the_stream(e: &Error) -> bool {
    e.is_permanent() && !is_conflict(e)
}

/// A `409` on a result post that says the call already has a result.
/// Another `409` (a lock timeout) is retried like a transient failure.
fn already_answered(e: &Error) -> bool {
    e.api().is_some_and(|api| {
        api.status == 409 && api.message.to_ascii_lowercase().contains("already")
    })
}

/// The session's whole history, oldest first; a transient failure is
/// retried ([`HISTORY_READ_ATTEMPTS`]).
async fn read_history(client: &Client, session_id: &str) -> Result<Vec<SessionEvent>, Error> {
    let mut wait = HISTORY_RETRY_START;
    let mut attempt = 1;
    loop {
        let read = client
            .sessions()
            .events(
                session_id,
                ListEvents {
                    limit: Some(1000),
                    order: Some(Order::Asc),
                    ..Default::default()
                },
            )
            .try_collect::<Vec<_>>()
            .await;
        match read {
            Err(e) if attempt < HISTORY_READ_ATTEMPTS && !ends_the_stream(&e) => {
                let jittered = wait.mul_f64(rand::rng().random_range(0.75..=1.0));
                warn!(session_id = %session_id, attempt, backoff_ms = jittered.as_millis() as u64, error = %e, "reading the session's history failed; retrying");
                tokio::time::sleep(jittered).await;
                wait *= 2;
                attempt += 1;
            }
            read => return read,
        }
    }
}

/// Keep the event stream open: connect, read the history, forward live
/// events; reconnect with jittered backoff; report a permanent error.
async fn stream_task(
    client: Client,
    session_id: String,
    tx: mpsc::Sender<Feed>,
    stop: CancellationToken,
) {
    let mut backoff = STREAM_BACKOFF_START;
    loop {
        let connected_at = Instant::now();
        match client.sessions().stream(&session_id).await {
            Err(e) if ends_the_stream(&e) => {
                let _ = tx.send(Feed::Fatal(e)).await;
                return;
            }
            Err(e) => {
                warn!(session_id = %session_id, backoff_ms = backoff.as_millis() as u64, error = %e, "stream disconnected, reconnecting");
            }
            Ok(stream) => {
                // The stream is attached first: an event emitted while the
                // history is read arrives live instead of being lost.
                let history = read_history(&client, &session_id).await;
                if tx.send(Feed::History(history)).await.is_err() {
                    return;
                }
                let mut stream = std::pin::pin!(stream);
                let why = loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        next = stream.next() => match next {
                            Some(Ok(event)) => {
                                if tx.send(Feed::Live(event)).await.is_err() {
                                    return;
                                }
                            }
                            Some(Err(e)) if ends_the_stream(&e) => {
                                let _ = tx.send(Feed::Fatal(e)).await;
                                return;
                            }
                            Some(Err(e)) => break e.to_string(),
                            None => break "the server closed the stream".to_string(),
                        }
                    }
                };
                if connected_at.elapsed() >= STREAM_HEALTHY_AFTER {
                    backoff = STREAM_BACKOFF_START;
                }
                warn!(session_id = %session_id, backoff_ms = backoff.as_millis() as u64, error = %why, "stream disconnected, reconnecting");
            }
        }
        let wait = backoff.mul_f64(rand::rng().random_range(0.5..=1.0));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        backoff = (backoff * 2).min(STREAM_BACKOFF_CAP);
    }
}
