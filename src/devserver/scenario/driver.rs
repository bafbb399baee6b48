//! The scripted "agent": plays a scenario's steps into its session, one tool
//! call at a time, checks what comes back, and writes the report.
//!
//! A tool step records `agent.tool_use` and idles the session with
//! `requires_action` until a `user.tool_result` arrives (an `ask`-gated call
//! is confirmed or denied by the devserver acting as the user). After the last
//! step the turn ends (`session.status_idle` with `end_turn`); once the
//! session's work item has stopped, the stores' contents are compared with
//! `expect_final` and the report is final.

use crate::devserver::db::Cached;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rusqlite::params;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use crate::api::types::SessionStatus;

use super::super::error::{HttpError, HttpResult};
use super::super::ids;
use super::super::memory::rows;
use super::super::sessions;
use super::super::state::AppState;
use super::format::{RemoteOp, Step, ToolStep, substitute, substitute_str};
use super::report::{Report, ReportStatus, StepOutcome, StepStatus, diff_store, truncate};

/// How long a tool step waits for its result unless it says otherwise.
pub const DEFAULT_STEP_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the report waits for the work item to stop after the last step.
pub const FINISH_TIMEOUT: Duration = Duration::from_secs(900);
/// Delay before the devserver, as the user, answers an `ask`-gated call.
const CONFIRM_DELAY: Duration = Duration::from_millis(200);

/// Everything the driver needs, fixed when the scenario was loaded.
pub struct Run {
    pub(crate) session_id: String,
    pub(crate) steps: Vec<Step>,
    /// Store key → mount path, for `{mount:KEY}`.
    pub(crate) mounts: BTreeMap<String, String>,
    /// Store key → memory store id.
    pub(crate) store_ids: BTreeMap<String, String>,
    pub(crate) expect_final: Option<BTreeMap<String, BTreeMap<String, String>>>,
    pub(crate) report: Report,
    /// The devserver's admin actor, for out-of-band changes.
    pub(crate) admin: crate::api::types::Actor,
}

fn now_rfc3339() -> String {
    ids::from_micros(ids::now_micros()).to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

async fn save(state: &AppState, report: &Report) {
    let json = serde_json::to_string(report).unwrap_or_default();
    let session_id = report.session_id.clone();
    let saved = state
        .db()
        .transaction(move |tx| {
            tx.execute_cached(
                "UPDATE scenarios SET report = ?2 WHERE session_id = ?1",
                params![session_id, json],
            )?;
            Ok(())
        })
        .await;
    if let Err(e) = saved {
        tracing::error!(error = %e, "cannot save a scenario report");
    }
}

/// The text of a result's content blocks.
fn result_text(result: &Value) -> String {
    result
        .get("content")
        .and_then(Value::as_array)
        .map(|blocks| {
            blocks
                .iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// Play the scenario; never panics, always leaves a final report.
pub async fn drive(state: AppState, mut run: Run) {
    let shutdown = state.shutdown_token();
    tokio::select! {
        _ = play(&state, &mut run) => {}
        _ = shutdown.cancelled() => {
            run.report.status = ReportStatus::Failed;
            run.report.failures.push("the devserver stopped before the scenario finished".into());
            run.report.finished_at = Some(now_rfc3339());
        }
    }
    save(&state, &run.report).await;
}

/// The session's live events, as the driver reads them.
type LiveEvents = tokio::sync::broadcast::Receiver<std::sync::Arc<super::super::live::StoredEvent>>;

/// Play the steps in order, each one's status saved when it starts and
/// when it ends (with the next one's start), until the last, an abort or a
/// termination; then end the turn, wait for
/// the worker to let go, and finalize the report.
async fn play(state: &AppState, run: &mut Run) {
    let mut events = state.live().subscribe(&run.session_id);
    let mut denied = Vec::new();
    let mut terminated = false;
    for index in 0..run.steps.len() {
        let step = run.steps[index].clone();
        run.report.steps[index].status = StepStatus::Running;
        // One save between two steps: the outcome of the one before goes
        // with this one's start (nothing happens in between). The report is
        // rewritten whole, so two saves per step were most of the
        // devserver's work between a result and the next call.
        save(state, &run.report).await;
        terminated |= matches!(step, Step::Terminate);
        let outcome = play_step(state, run, index, &step, &mut events, &mut denied).await;
        let aborted = record_outcome(run, index, &step, outcome);
        if terminated && !aborted {
            skip_after(run, index);
        }
        if aborted || terminated || index + 1 == run.steps.len() {
            save(state, &run.report).await;
            break;
        }
    }

    // End the turn (unless the session was terminated), then wait for the
    // worker to let go of the session.
    if !terminated && let Err(e) = end_turn(state, &run.session_id).await {
        run.report
            .failures
            .push(format!("cannot end the turn: {e}"));
    }
    if !wait_for_stop(state, &run.session_id).await {
        run.report.failures.push(format!(
            "the session's work item did not stop within {}s of the last step",
            FINISH_TIMEOUT.as_secs()
        ));
    }
    finalize(state, run, &denied).await;
}

/// Do one step. `Ok(Some(reason))` is a failed expectation; the scenario goes on.
async fn play_step(
    state: &AppState,
    run: &mut Run,
    index: usize,
    step: &Step,
    events: &mut LiveEvents,
    denied: &mut Vec<String>,
) -> Result<Option<String>, StepAbort> {
    match step {
        Step::Wait(ms) => {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
            Ok(None)
        }
        Step::Remote(op) => remote(state, run, op).await.map(|()| None),
        Step::Terminate => {
            let sid = run.session_id.clone();
            state
                .commit(move |tx, fx| {
                    sessions::set_status(tx, fx, &sid, SessionStatus::Terminated, None)
                })
                .await
                .map(|_| None)
                .map_err(|e| StepAbort(format!("cannot terminate the session: {e}")))
        }
        Step::Tool(tool) => call_tool(state, run, index, tool, events, denied).await,
        Step::Faults(rules) => state
            .faults()
            .add(rules.clone())
            .map(|()| None)
            .map_err(StepAbort),
        Step::ClearFaults => {
            state.faults().clear();
            Ok(None)
        }
    }
}

/// Write a step's outcome into the report; an abort skips the steps after
/// it. `true` when the step aborted the scenario.
fn record_outcome(
    run: &mut Run,
    index: usize,
    step: &Step,
    outcome: Result<Option<String>, StepAbort>,
) -> bool {
    let slot = &mut run.report.steps[index];
    match outcome {
        Ok(failure) => {
            slot.status = if failure.is_some() {
                StepStatus::Failed
            } else {
                StepStatus::Passed
            };
            if let Some(f) = failure {
                slot.detail = Some(f.clone());
                run.report
                    .failures
                    .push(format!("step {index} ({}): {f}", describe(step)));
            }
            false
        }
        Err(StepAbort(reason)) => {
            slot.status = StepStatus::Failed;
            slot.detail = Some(reason.clone());
            run.report
                .failures
                .push(format!("step {index} ({}): {reason}", describe(step)));
            skip_after(run, index);
            true
        }
    }
}

/// Mark every step after `index` skipped.
fn skip_after(run: &mut Run, index: usize) {
    for later in run.report.steps.iter_mut().skip(index + 1) {
        later.status = StepStatus::Skipped;
    }
}

/// The agent's last message, and the session idle at the end of its turn.
async fn end_turn(state: &AppState, session_id: &str) -> HttpResult<()> {
    let sid = session_id.to_string();
    state
        .commit(move |tx, fx| {
            sessions::append(
                tx,
                fx,
                &sid,
                json!({"type": "agent.message", "content": [{"type": "text", "text": "The scenario's steps are done."}]}),
            )?;
            sessions::set_status(tx, fx, &sid, SessionStatus::Idle, Some(json!({"type": "end_turn"})))
        })
        .await
}

fn describe(step: &Step) -> String {
    match step {
        Step::Tool(t) => format!("{} {}", step.kind(), t.name),
        Step::Remote(op) => format!("remote {} {}", op.op, op.path),
        Step::Wait(ms) => format!("wait {ms}ms"),
        Step::Terminate => "terminate".to_string(),
        Step::Faults(rules) => format!("faults ({} rules)", rules.len()),
        Step::ClearFaults => "clear_faults".to_string(),
    }
}

/// A step failure that ends the scenario (the agent cannot go on).
struct StepAbort(String);

/// Emit one tool call and wait for its answer. `Ok(Some(reason))` is a failed
/// expectation; the scenario goes on.
async fn call_tool(
    state: &AppState,
    run: &mut Run,
    index: usize,
    tool: &ToolStep,
    events: &mut LiveEvents,
    denied: &mut Vec<String>,
) -> Result<Option<String>, StepAbort> {
    let result_type = if tool.custom {
        "user.custom_tool_result"
    } else {
        "user.tool_result"
    };
    let emitted = emit_call(state, run, tool).await?;
    let started = Instant::now();
    run.report.steps[index].tool_use_id = Some(emitted.clone());

    let allowed = match tool.evaluated_permission.as_deref() {
        Some("deny") => false,
        Some("ask") => confirm(state, &run.session_id, tool, &emitted).await?,
        _ => true,
    };
    if !allowed {
        denied.push(emitted);
        return Ok(None);
    }

    let timeout = tool
        .timeout_ms
        .map(Duration::from_millis)
        .unwrap_or(DEFAULT_STEP_TIMEOUT);
    let Some(result) = wait_for_answer(
        state,
        &run.session_id,
        result_type,
        &emitted,
        events,
        timeout,
    )
    .await
    else {
        return Err(StepAbort(format!(
            "no {result_type} within {}s",
            timeout.as_secs()
        )));
    };
    let latency = started.elapsed();
    let sid = run.session_id.clone();
    state
        .commit(move |tx, fx| sessions::set_status(tx, fx, &sid, SessionStatus::Running, None))
        .await
        .map_err(|e| StepAbort(format!("cannot resume the session: {e}")))?;

    let text = result_text(&result);
    let is_error = result
        .get("is_error")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let slot = &mut run.report.steps[index];
    slot.is_error = Some(is_error);
    slot.output = Some(truncate(&text));
    slot.latency_ms = Some(latency.as_secs_f64() * 1e3);
    Ok(unmet_expectations(tool, &text, is_error, &run.mounts))
}

/// Append the call to the session (its status `idle`, requiring action,
/// unless the server itself denied it): the call's event id.
async fn emit_call(state: &AppState, run: &Run, tool: &ToolStep) -> Result<String, StepAbort> {
    let input = substitute(&tool.input, &run.mounts);
    let call_type = if tool.custom {
        "agent.custom_tool_use"
    } else {
        "agent.tool_use"
    };
    let mut call = json!({"type": call_type, "name": tool.name, "input": input});
    if let Some(p) = &tool.evaluated_permission {
        call["evaluated_permission"] = json!(p);
    }
    let sid = run.session_id.clone();
    // A call the server itself denied needs no action from anyone.
    let needs_action = tool.evaluated_permission.as_deref() != Some("deny");
    state
        .commit(move |tx, fx| {
            sessions::set_status(tx, fx, &sid, SessionStatus::Running, None)?;
            let event = sessions::append(tx, fx, &sid, call)?;
            let id = event.body["id"].as_str().unwrap_or_default().to_string();
            if needs_action {
                sessions::set_status(
                    tx,
                    fx,
                    &sid,
                    SessionStatus::Idle,
                    Some(json!({"type": "requires_action", "event_ids": [id]})),
                )?;
            }
            Ok(id)
        })
        .await
        .map_err(|e| StepAbort(format!("cannot record the tool call: {e}")))
}

/// Answer an ask-gated call as the scenario says, after a user's pause:
/// whether it was allowed.
async fn confirm(
    state: &AppState,
    session_id: &str,
    tool: &ToolStep,
    emitted: &str,
) -> Result<bool, StepAbort> {
    tokio::time::sleep(CONFIRM_DELAY).await;
    let verdict = tool.confirm.clone().unwrap_or_else(|| "deny".into());
    let allowed = verdict != "deny";
    let sid = session_id.to_string();
    let id = emitted.to_string();
    state
        .commit(move |tx, fx| {
            let mut confirmation =
                json!({"type": "user.tool_confirmation", "tool_use_id": id, "result": verdict});
            if !allowed {
                confirmation["deny_message"] = json!("denied by the scenario");
            }
            sessions::append(tx, fx, &sid, confirmation)?;
            if !allowed {
                sessions::set_status(tx, fx, &sid, SessionStatus::Running, None)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| StepAbort(format!("cannot record the confirmation: {e}")))?;
    Ok(allowed)
}

/// What the result misses of the step's expectations, if anything.
fn unmet_expectations(
    tool: &ToolStep,
    text: &str,
    is_error: bool,
    mounts: &BTreeMap<String, String>,
) -> Option<String> {
    let mut problems = Vec::new();
    if let Some(want) = tool.expect.is_error
        && want != is_error
    {
        problems.push(format!("expected is_error={want}, got {is_error}"));
    }
    for needle in tool.expect.contains.iter().flat_map(|c| c.items()) {
        let needle = substitute_str(needle, mounts);
        if !text.contains(&needle) {
            problems.push(format!("expected the result to contain {needle:?}"));
        }
    }
    for needle in tool.expect.not_contains.iter().flat_map(|c| c.items()) {
        let needle = substitute_str(needle, mounts);
        if text.contains(&needle) {
            problems.push(format!("expected the result not to contain {needle:?}"));
        }
    }
    if problems.is_empty() {
        None
    } else {
        Some(format!(
            "{}; the result was {:?}",
            problems.join("; "),
            truncate(text)
        ))
    }
}

/// The first event of `kind` answering `ref_id`, or `None` after `timeout`.
async fn wait_for_answer(
    state: &AppState,
    session_id: &str,
    kind: &str,
    ref_id: &str,
    events: &mut LiveEvents,
    timeout: Duration,
) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + timeout;
    let lookup = |state: AppState| {
        let (sid, kind, rid) = (session_id.to_string(), kind.to_string(), ref_id.to_string());
        async move {
            state
                .db()
                .transaction(move |tx| sessions::answers(tx, &sid, &kind, &rid))
                .await
                .ok()
                .and_then(|mut a| (!a.is_empty()).then(|| a.remove(0)))
        }
    };
    if let Some(found) = lookup(state.clone()).await {
        return Some(found);
    }
    loop {
        let received = tokio::time::timeout_at(deadline, events.recv()).await;
        match received {
            Err(_) => return None,
            Ok(Ok(event)) => {
                let answers = event.event_type() == kind
                    && ["tool_use_id", "custom_tool_use_id"]
                        .iter()
                        .any(|f| event.body.get(*f).and_then(Value::as_str) == Some(ref_id));
                if answers {
                    return Some(event.body.clone());
                }
            }
            Ok(Err(RecvError::Lagged(_))) => {
                if let Some(found) = lookup(state.clone()).await {
                    return Some(found);
                }
            }
            Ok(Err(RecvError::Closed)) => {
                *events = state.live().subscribe(session_id);
                if let Some(found) = lookup(state.clone()).await {
                    return Some(found);
                }
            }
        }
    }
}

/// An out-of-band change, made as an organisation key would make it.
async fn remote(state: &AppState, run: &Run, op: &RemoteOp) -> Result<(), StepAbort> {
    let store_id = run.store_ids[&op.store].clone();
    let op = op.clone();
    let actor = run.admin.clone();
    let changed = state
        .db()
        .transaction(move |tx| -> HttpResult<()> {
            let existing = rows::find_by_path(tx, &store_id, &op.path)?;
            let missing = || HttpError::not_found(format!("no memory at {}", op.path));
            match op.op.as_str() {
                "create" => {
                    rows::insert_memory(
                        tx,
                        &store_id,
                        &op.path,
                        op.content.as_deref().unwrap_or_default(),
                        &actor,
                    )?;
                }
                "update" => {
                    let current = existing.ok_or_else(missing)?;
                    let content = op.content.as_deref().unwrap_or_default();
                    if current.content.as_deref() != Some(content) {
                        rows::rewrite_memory(tx, &current, &current.path, content, &actor)?;
                    }
                }
                "delete" => {
                    let current = existing.ok_or_else(missing)?;
                    rows::remove_memory(tx, &current, &actor)?;
                }
                _ => {
                    let current = existing.ok_or_else(missing)?;
                    let to = op.new_path.as_deref().unwrap_or_default();
                    if let Some(hit) = rows::path_conflict(tx, &store_id, to, Some(&current.id))? {
                        return Err(rows::conflict_error(to, hit));
                    }
                    let content = current.content.clone().unwrap_or_default();
                    rows::rewrite_memory(tx, &current, to, &content, &actor)?;
                }
            }
            Ok(())
        })
        .await;
    changed.map_err(|e| StepAbort(format!("the remote change failed: {}", e.message)))
}

/// Wait until the session has no live work item; `false` on timeout.
async fn wait_for_stop(state: &AppState, session_id: &str) -> bool {
    let deadline = Instant::now() + FINISH_TIMEOUT;
    while Instant::now() < deadline {
        let sid = session_id.to_string();
        let live = state
            .db()
            .transaction(move |tx| {
                super::super::work::expire_leases(tx, ids::now_micros())?;
                Ok(tx.query_row_cached(
                    "SELECT EXISTS (SELECT 1 FROM work_items WHERE data_id = ?1 AND state != 'stopped')",
                    [&sid],
                    |r| r.get::<_, bool>(0),
                )?)
            })
            .await
            .unwrap_or(true);
        if !live {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

async fn finalize(state: &AppState, run: &mut Run, denied: &[String]) {
    let store_ids = run.store_ids.clone();
    let sid = run.session_id.clone();
    let denied_ids = denied.to_vec();
    let read = state
        .db()
        .transaction(move |tx| {
            let mut contents = BTreeMap::new();
            for (key, id) in &store_ids {
                contents.insert(key.clone(), rows::contents(tx, id)?);
            }
            let mut answered_denied = Vec::new();
            for id in &denied_ids {
                if !sessions::answers(tx, &sid, "user.tool_result", id)?.is_empty() {
                    answered_denied.push(id.clone());
                }
            }
            Ok((contents, answered_denied))
        })
        .await;
    match read {
        Ok((contents, answered_denied)) => {
            for id in answered_denied {
                run.report.failures.push(format!(
                    "the denied tool call {id} was answered with a result"
                ));
            }
            if let Some(expected) = &run.expect_final {
                for (key, want) in expected {
                    let empty = BTreeMap::new();
                    let got = contents.get(key).unwrap_or(&empty);
                    run.report.failures.extend(diff_store(key, want, got));
                }
            }
            run.report.final_contents = Some(contents);
        }
        Err(e) => run
            .report
            .failures
            .push(format!("cannot read the final contents: {e}")),
    }
    run.report.status = if run.report.failures.is_empty() {
        ReportStatus::Passed
    } else {
        ReportStatus::Failed
    };
    run.report.finished_at = Some(now_rfc3339());
    tracing::info!(
        session.id = %run.session_id,
        scenario = %run.report.name,
        status = ?run.report.status,
        failures = run.report.failures.len(),
        "scenario finished"
    );
}

/// A fresh report for a scenario about to run.
pub fn initial_outcomes(steps: &[Step]) -> Vec<StepOutcome> {
    steps
        .iter()
        .enumerate()
        .map(|(index, step)| StepOutcome {
            index,
            kind: step.kind().to_string(),
            name: match step {
                Step::Tool(t) => Some(t.name.clone()),
                Step::Remote(op) => Some(op.op.clone()),
                Step::Wait(_) | Step::Terminate | Step::Faults(_) | Step::ClearFaults => None,
            },
            status: StepStatus::Pending,
            tool_use_id: None,
            is_error: None,
            output: None,
            latency_ms: None,
            detail: None,
        })
        .collect()
}

pub fn started_now() -> String {
    now_rfc3339()
}
