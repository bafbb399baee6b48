//! `/v1/sessions`: create, retrieve, list, archive, delete; the event log
//! (list, send) and the live SSE stream.
//!
//! A session created in a self-hosted environment queues a work item; so does
//! a `user.message` (or `user.interrupt`) to a session whose work items have
//! all stopped. Every status change is recorded as a `session.status_*`
//! event, and a change to `running` fires the `session.status_run_started`
//! webhook.

use crate::devserver::db::Cached;
use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;

use axum::Json;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use rusqlite::{OptionalExtension, Row, Transaction, params};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::api::types::{
    Access, MemoryStoreResource, Page, Session, SessionResource, SessionStatus,
};

use super::auth::Principal;
use super::environments;
use super::error::{HttpError, HttpResult};
use super::http::{JsonBody, QueryParams};
use super::live::{Effects, StoredEvent};
use super::{cursor, ids, state::AppState, validate, work};

/// At most this many memory stores may be attached to one session.
pub const MAX_MEMORY_STORES: usize = 8;
/// `instructions` of a memory store attachment, in characters.
pub const MAX_INSTRUCTIONS_CHARS: usize = 4096;

const COLUMNS: &str = "id, environment_id, status, agent, resources, metadata, title, created_at, updated_at, archived_at";

fn from_row(row: &Row<'_>, at: usize) -> rusqlite::Result<Session> {
    let created_at: i64 = row.get(at + 7)?;
    let archived_at: Option<i64> = row.get(at + 9)?;
    let end = archived_at.unwrap_or_else(ids::now_micros);
    Ok(Session {
        id: row.get(at)?,
        object_type: "session".into(),
        environment_id: row.get(at + 1)?,
        status: serde_json::from_value(Value::String(row.get(at + 2)?))
            .unwrap_or(SessionStatus::Unknown),
        agent: serde_json::from_str(&row.get::<_, String>(at + 3)?).unwrap_or_default(),
        resources: serde_json::from_str(&row.get::<_, String>(at + 4)?).unwrap_or_default(),
        metadata: serde_json::from_str(&row.get::<_, String>(at + 5)?).unwrap_or_default(),
        title: row.get(at + 6)?,
        vault_ids: Vec::new(),
        outcome_evaluations: Vec::new(),
        stats: json!({"duration_seconds": (end - created_at) as f64 / 1e6}),
        usage: json!({"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0}),
        created_at: ids::from_micros(created_at),
        updated_at: ids::from_micros(row.get(at + 8)?),
        archived_at: archived_at.map(ids::from_micros),
    })
}

/// The session, or 404.
pub fn load(tx: &Transaction<'_>, id: &str) -> HttpResult<Session> {
    tx.query_row_cached(
        &format!("SELECT {COLUMNS} FROM sessions WHERE id = ?1"),
        [id],
        |r| from_row(r, 0),
    )
    .optional()?
    .ok_or_else(|| HttpError::not_found(format!("session {id} not found")))
}

/// The session, checked against the caller's scope.
pub fn load_for(tx: &Transaction<'_>, principal: &Principal, id: &str) -> HttpResult<Session> {
    let session = load(tx, id)?;
    principal.require_session(id, session.environment_id.as_deref().unwrap_or_default())?;
    Ok(session)
}

/// The directory name a store gets under the mount root: lowercased, each
/// run of characters other than ASCII letters and digits turned into one
/// `-`, trimmed of `-`.
pub fn slugify(name: &str) -> String {
    let mut slug = String::with_capacity(name.len());
    for c in name.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_alphanumeric() {
            slug.push(c);
        } else if !slug.ends_with('-') {
            slug.push('-');
        }
    }
    slug.trim_matches('-').to_string()
}

/// Mount paths for stores, in order: `<root>/<slug>`, the store id when the
/// slug is empty, `-2`, `-3`, … on a collision within the session.
pub fn mount_paths(root: &str, stores: &[(&str, &str)]) -> Vec<String> {
    let root = root.trim_end_matches('/');
    let mut taken = HashSet::new();
    stores
        .iter()
        .map(|(id, name)| {
            let base = match slugify(name) {
                s if s.is_empty() => id.to_string(),
                s => s,
            };
            let mut slug = base.clone();
            let mut n = 2;
            while !taken.insert(slug.clone()) {
                slug = format!("{base}-{n}");
                n += 1;
            }
            format!("{root}/{slug}")
        })
        .collect()
}

/// The agent snapshot a session keeps: an agent id, an agent reference, or
/// an inline definition (a devserver convenience), with the API's defaults.
fn agent_snapshot(agent: &Value) -> HttpResult<Value> {
    let mut snapshot = json!({
        "type": "agent",
        "id": ids::new_id("agent"),
        "name": "devserver agent",
        "version": 1,
        "model": {"id": "claude-sonnet-4-5"},
        "system": null,
        "description": null,
        "tools": [{"type": "agent_toolset_20260401"}],
        "skills": [],
        "mcp_servers": [],
        "execution_identity": {"type": "service_account"},
    });
    match agent {
        Value::String(id) if !id.is_empty() => {
            snapshot["id"] = json!(id);
            snapshot["name"] = json!(id);
        }
        Value::Object(fields) => {
            for (k, v) in fields {
                snapshot[k] = v.clone();
            }
            snapshot["type"] = json!("agent");
        }
        _ => {
            return Err(HttpError::invalid_request(
                "agent: must be an agent id or an agent object",
            ));
        }
    }
    Ok(snapshot)
}

#[derive(Debug, Deserialize)]
pub struct CreateSession {
    agent: Value,
    environment_id: String,
    #[serde(default)]
    resources: Vec<Value>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    initial_events: Vec<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MemoryStoreParam {
    #[serde(rename = "type")]
    _kind: String,
    memory_store_id: String,
    #[serde(default)]
    access: Option<String>,
    #[serde(default)]
    instructions: Option<String>,
}

/// A memory store attachment, checked, with the store's name and description.
struct AttachedStore {
    id: String,
    access: Access,
    instructions: Option<String>,
    name: String,
    description: String,
}

/// Create a session in one transaction: validate, snapshot the stores, queue
/// the work item, and take the initial events.
pub fn insert(
    tx: &Transaction<'_>,
    fx: &mut Effects,
    state: &AppState,
    body: CreateSession,
) -> HttpResult<Session> {
    let env = environments::load(tx, &body.environment_id)?;
    if env.archived_at.is_some() {
        return Err(HttpError::invalid_request(format!(
            "environment {} is archived; new sessions cannot use it",
            env.id
        )));
    }
    let agent = agent_snapshot(&body.agent)?;
    let metadata = body.metadata.unwrap_or_default();
    validate::metadata(&metadata).map_err(HttpError::invalid_request)?;

    let params = memory_store_params(&env.id, &body.resources)?;
    let mut stores = Vec::new();
    let mut seen = HashSet::new();
    for p in params {
        stores.push(attach_store(tx, p, &mut seen)?);
    }
    let resources = store_resources(&state.mount_root(), stores);

    let id = ids::new_id("sesn");
    let now = ids::now_micros();
    tx.execute_cached(
        "INSERT INTO sessions (id, environment_id, status, agent, resources, metadata, title, created_at, updated_at)
         VALUES (?1, ?2, 'idle', ?3, ?4, ?5, ?6, ?7, ?7)",
        params![
            id,
            env.id,
            agent.to_string(),
            serde_json::to_string(&resources).unwrap_or_else(|_| "[]".into()),
            serde_json::to_string(&metadata).unwrap_or_else(|_| "{}".into()),
            body.title,
            now
        ],
    )?;
    work::enqueue_session(tx, fx, &env.id, &id, state.lease_ttl_seconds())?;
    if !body.initial_events.is_empty() {
        for e in &body.initial_events {
            if e.get("type").and_then(Value::as_str) != Some("user.message") {
                return Err(HttpError::invalid_request(
                    "initial_events: only user.message events are supported",
                ));
            }
        }
        let session = load(tx, &id)?;
        send(tx, fx, state, &session, body.initial_events)?;
    }
    load(tx, &id)
}

/// The session's `resources`, parsed: memory stores only (a self-hosted
/// environment takes no other kind), at most [`MAX_MEMORY_STORES`].
fn memory_store_params(env_id: &str, resources: &[Value]) -> HttpResult<Vec<MemoryStoreParam>> {
    let mut params = Vec::new();
    for resource in resources {
        let kind = resource
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if kind != "memory_store" {
            return Err(HttpError::invalid_request(format!(
                "Environment {env_id} is a self-hosted environment. `resources` are not supported with self-hosted environments."
            )));
        }
        let p: MemoryStoreParam = serde_json::from_value(resource.clone())
            .map_err(|e| HttpError::invalid_request(format!("resources: {e}")))?;
        params.push(p);
    }
    if params.len() > MAX_MEMORY_STORES {
        return Err(HttpError::invalid_request(format!(
            "resources: at most {MAX_MEMORY_STORES} memory stores can be attached to a session"
        )));
    }
    Ok(params)
}

/// One attachment checked (attached once, a known access, instructions in
/// bounds) against its store, which must exist and not be archived.
fn attach_store(
    tx: &Transaction<'_>,
    p: MemoryStoreParam,
    seen: &mut HashSet<String>,
) -> HttpResult<AttachedStore> {
    if !seen.insert(p.memory_store_id.clone()) {
        return Err(HttpError::invalid_request(format!(
            "resources: memory store {} is attached twice",
            p.memory_store_id
        )));
    }
    let access = match p.access.as_deref() {
        None => Access::ReadWrite,
        Some(a) => Access::parse(a).ok_or_else(|| {
            HttpError::invalid_request("resources: access must be read_write or read_only")
        })?,
    };
    if let Some(i) = &p.instructions
        && i.chars().count() > MAX_INSTRUCTIONS_CHARS
    {
        return Err(HttpError::invalid_request(format!(
            "resources: instructions are limited to {MAX_INSTRUCTIONS_CHARS} characters"
        )));
    }
    let (name, description, archived): (String, String, Option<i64>) = tx
        .query_row_cached(
            "SELECT name, description, archived_at FROM memory_stores WHERE id = ?1",
            [&p.memory_store_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?
        .ok_or_else(|| {
            HttpError::not_found(format!("memory store {} not found", p.memory_store_id))
        })?;
    if archived.is_some() {
        return Err(HttpError::invalid_request(format!(
            "memory store {} is archived and cannot be attached to new sessions",
            p.memory_store_id
        )));
    }
    Ok(AttachedStore {
        id: p.memory_store_id,
        access,
        instructions: p.instructions,
        name,
        description,
    })
}

/// The session's snapshot of its stores, each with its mount path.
fn store_resources(mount_root: &str, stores: Vec<AttachedStore>) -> Vec<SessionResource> {
    let pairs: Vec<(&str, &str)> = stores
        .iter()
        .map(|s| (s.id.as_str(), s.name.as_str()))
        .collect();
    let paths = mount_paths(mount_root, &pairs);
    stores
        .into_iter()
        .zip(paths)
        .map(|(store, mount_path)| {
            SessionResource::MemoryStore(MemoryStoreResource {
                object_type: "memory_store".into(),
                memory_store_id: store.id,
                access: Some(store.access),
                instructions: store.instructions,
                mount_path: Some(mount_path),
                name: Some(store.name),
                description: Some(store.description),
            })
        })
        .collect()
}

pub async fn create(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    JsonBody(body): JsonBody<CreateSession>,
) -> HttpResult<Json<Session>> {
    principal.require_org("create sessions")?;
    let st = state.clone();
    let (session, fx) = state
        .db()
        .transaction(move |tx| {
            let mut fx = Effects::default();
            let session = insert(tx, &mut fx, &st, body)?;
            Ok((session, fx))
        })
        .await?;
    state.apply(fx);
    Ok(Json(session))
}

pub async fn retrieve(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> HttpResult<Json<Session>> {
    let session = state
        .db()
        .transaction(move |tx| load_for(tx, &principal, &id))
        .await?;
    Ok(Json(session))
}

#[derive(Serialize, Deserialize)]
struct SeqCursor {
    seq: i64,
}

pub async fn list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RawQuery(raw): RawQuery,
) -> HttpResult<Json<Page<Session>>> {
    principal.require_org("list sessions")?;
    let q = QueryParams::parse(raw.as_deref());
    let limit = q.limit_up_to(1000)?;
    let ascending = order(&q)?.unwrap_or(false);
    let cursor: Option<SeqCursor> = cursor::decode(q.get("page"))?;
    let page = state
        .db()
        .transaction(move |tx| {
            let (cmp, dir, start) = if ascending {
                (">", "ASC", i64::MIN)
            } else {
                ("<", "DESC", i64::MAX)
            };
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT seq, {COLUMNS} FROM sessions WHERE seq {cmp} ?1 ORDER BY seq {dir} LIMIT ?2"
            ))?;
            let rows = stmt.query_map(
                params![cursor.map_or(start, |c| c.seq), cursor::fetch_limit(limit)],
                |r| Ok((r.get::<_, i64>(0)?, from_row(r, 1)?)),
            )?;
            let rows = rows.collect::<Result<Vec<_>, _>>()?;
            Ok(cursor::page(rows, limit, seq_cursor, |(_, s)| s))
        })
        .await?;
    Ok(Json(page))
}

/// `order=asc|desc`: `Some(true)` for ascending.
fn order(q: &QueryParams) -> HttpResult<Option<bool>> {
    match q.get("order") {
        None => Ok(None),
        Some("asc") => Ok(Some(true)),
        Some("desc") => Ok(Some(false)),
        Some(_) => Err(HttpError::invalid_request("order: must be asc or desc")),
    }
}

/// The position after a `(seq, item)` row, for [`cursor::page`].
fn seq_cursor<T>((seq, _): &(i64, T)) -> SeqCursor {
    SeqCursor { seq: *seq }
}

/// Append one event; it gets its `id` and `processed_at` here.
pub fn append(
    tx: &Transaction<'_>,
    fx: &mut Effects,
    session_id: &str,
    mut body: Value,
) -> HttpResult<StoredEvent> {
    let now = ids::now_micros();
    let id = ids::new_id("sevt");
    let kind = body
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let ref_id = body
        .get("tool_use_id")
        .or_else(|| body.get("custom_tool_use_id"))
        .and_then(Value::as_str)
        .map(str::to_string);
    if let Value::Object(map) = &mut body {
        map.insert("id".into(), json!(id));
        map.insert(
            "processed_at".into(),
            json!(ids::from_micros(now).to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
        );
    }
    tx.execute_cached(
        "INSERT INTO session_events (id, session_id, type, ref_id, body, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![id, session_id, kind, ref_id, body.to_string(), now],
    )?;
    let event = StoredEvent {
        seq: tx.last_insert_rowid(),
        session_id: session_id.to_string(),
        body,
    };
    fx.events.push(event.clone());
    Ok(event)
}

/// Move the session to `status`, recording a `session.status_*` event. An
/// idle is recorded every time (its stop reason may differ); other statuses
/// only on a change. Entering `running` fires the run-started webhook.
pub fn set_status(
    tx: &Transaction<'_>,
    fx: &mut Effects,
    session_id: &str,
    status: SessionStatus,
    stop_reason: Option<Value>,
) -> HttpResult<()> {
    let current: String = tx.query_row_cached(
        "SELECT status FROM sessions WHERE id = ?1",
        [session_id],
        |r| r.get(0),
    )?;
    if current == status.as_str() && status != SessionStatus::Idle {
        return Ok(());
    }
    tx.execute_cached(
        "UPDATE sessions SET status = ?2, updated_at = ?3 WHERE id = ?1",
        params![session_id, status.as_str(), ids::now_micros()],
    )?;
    let event = match status {
        SessionStatus::Idle => {
            json!({"type": "session.status_idle", "stop_reason": stop_reason.unwrap_or(json!({"type": "end_turn"}))})
        }
        SessionStatus::Running => json!({"type": "session.status_running"}),
        SessionStatus::Rescheduling => json!({"type": "session.status_rescheduled"}),
        SessionStatus::Terminated | SessionStatus::Unknown => {
            json!({"type": "session.status_terminated"})
        }
    };
    append(tx, fx, session_id, event)?;
    if status == SessionStatus::Running {
        fx.run_started.push(session_id.to_string());
    }
    Ok(())
}

/// Is `session_id` driven by a scenario (rather than the echo agent)?
fn is_scripted(tx: &Transaction<'_>, session_id: &str) -> HttpResult<bool> {
    Ok(tx.query_row_cached(
        "SELECT EXISTS (SELECT 1 FROM scenarios WHERE session_id = ?1)",
        [session_id],
        |r| r.get(0),
    )?)
}

/// The event (by id) of `kind` in this session, if any.
fn find_event(
    tx: &Transaction<'_>,
    session_id: &str,
    kind: &str,
    id: &str,
) -> HttpResult<Option<Value>> {
    let body: Option<String> = tx
        .query_row_cached(
            "SELECT body FROM session_events WHERE session_id = ?1 AND id = ?2 AND type = ?3",
            params![session_id, id, kind],
            |r| r.get(0),
        )
        .optional()?;
    Ok(body.and_then(|b| serde_json::from_str(&b).ok()))
}

/// How many events of `kind` answer `ref_id`.
pub fn answers(
    tx: &Transaction<'_>,
    session_id: &str,
    kind: &str,
    ref_id: &str,
) -> HttpResult<Vec<Value>> {
    let mut stmt = tx.prepare_cached(
        "SELECT body FROM session_events WHERE session_id = ?1 AND ref_id = ?2 AND type = ?3 ORDER BY seq",
    )?;
    let rows = stmt.query_map(params![session_id, ref_id, kind], |r| r.get::<_, String>(0))?;
    let mut out = Vec::new();
    for body in rows {
        out.push(serde_json::from_str(&body?).unwrap_or(Value::Null));
    }
    Ok(out)
}

/// Was this tool call denied (by the server's evaluation or the user)?
fn denied(tx: &Transaction<'_>, session_id: &str, tool_use: &Value) -> HttpResult<bool> {
    if tool_use.get("evaluated_permission").and_then(Value::as_str) == Some("deny") {
        return Ok(true);
    }
    let id = tool_use
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or_default();
    Ok(answers(tx, session_id, "user.tool_confirmation", id)?
        .iter()
        .any(|c| c.get("result").and_then(Value::as_str) == Some("deny")))
}

fn str_field<'a>(event: &'a Value, field: &str) -> HttpResult<&'a str> {
    event
        .get(field)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            HttpError::invalid_request(format!("{}: {field} is required", event_type(event)))
        })
}

fn event_type(event: &Value) -> &str {
    event.get("type").and_then(Value::as_str).unwrap_or("event")
}

/// Check one client event against the session; refuse what the API refuses.
fn check_client_event(tx: &Transaction<'_>, session_id: &str, event: &mut Value) -> HttpResult<()> {
    if !event.is_object() {
        return Err(HttpError::invalid_request(
            "events: each event must be an object",
        ));
    }
    let kind = event_type(event).to_string();
    match kind.as_str() {
        "user.message" => check_user_message(event),
        "user.interrupt" => Ok(()),
        "user.tool_result" | "user.custom_tool_result" => {
            check_tool_result(tx, session_id, &kind, event)
        }
        "user.tool_confirmation" => check_tool_confirmation(tx, session_id, event),
        other => Err(HttpError::invalid_request(format!(
            "events: an event of type {other:?} cannot be sent"
        ))),
    }
}

/// A message has content blocks; a plain string becomes one text block.
fn check_user_message(event: &mut Value) -> HttpResult<()> {
    if let Some(Value::String(text)) = event.get("content") {
        event["content"] = json!([{"type": "text", "text": text}]);
    }
    if !event.get("content").is_some_and(Value::is_array) {
        return Err(HttpError::invalid_request(
            "user.message: content is required",
        ));
    }
    Ok(())
}

/// A (custom) tool result answers a call of this session that was neither
/// denied nor answered before; its content and `is_error` get their defaults.
fn check_tool_result(
    tx: &Transaction<'_>,
    session_id: &str,
    kind: &str,
    event: &mut Value,
) -> HttpResult<()> {
    let (field, call_kind) = if kind == "user.tool_result" {
        ("tool_use_id", "agent.tool_use")
    } else {
        ("custom_tool_use_id", "agent.custom_tool_use")
    };
    let call_id = str_field(event, field)?.to_string();
    let call = find_event(tx, session_id, call_kind, &call_id)?.ok_or_else(|| {
        HttpError::invalid_request(format!(
            "{kind}: {field} {call_id} does not name an {call_kind} event of this session"
        ))
    })?;
    if denied(tx, session_id, &call)? {
        return Err(HttpError::invalid_request(format!(
            "{kind}: tool call {call_id} was denied and takes no result"
        )));
    }
    if !answers(tx, session_id, kind, &call_id)?.is_empty() {
        return Err(HttpError::conflict(
            "conflict_error",
            format!("{kind}: tool call {call_id} already has a result"),
        ));
    }
    match event.get("content") {
        None | Some(Value::Null) => event["content"] = json!([]),
        Some(Value::Array(_)) => {}
        Some(_) => {
            return Err(HttpError::invalid_request(format!(
                "{kind}: content must be a list of content blocks"
            )));
        }
    }
    match event.get("is_error") {
        None | Some(Value::Null) => event["is_error"] = json!(false),
        Some(Value::Bool(_)) => {}
        Some(_) => {
            return Err(HttpError::invalid_request(format!(
                "{kind}: is_error must be a boolean"
            )));
        }
    }
    Ok(())
}

/// A confirmation answers, once, a call of this session that awaits one;
/// only a denial carries a message.
fn check_tool_confirmation(
    tx: &Transaction<'_>,
    session_id: &str,
    event: &Value,
) -> HttpResult<()> {
    let call_id = str_field(event, "tool_use_id")?.to_string();
    let call = find_event(tx, session_id, "agent.tool_use", &call_id)?.ok_or_else(|| {
        HttpError::invalid_request(format!(
            "user.tool_confirmation: tool_use_id {call_id} does not name an agent.tool_use event of this session"
        ))
    })?;
    if call.get("evaluated_permission").and_then(Value::as_str) != Some("ask") {
        return Err(HttpError::invalid_request(format!(
            "user.tool_confirmation: tool call {call_id} does not await confirmation"
        )));
    }
    if !answers(tx, session_id, "user.tool_confirmation", &call_id)?.is_empty() {
        return Err(HttpError::conflict(
            "conflict_error",
            format!("user.tool_confirmation: tool call {call_id} was already confirmed or denied"),
        ));
    }
    let result = str_field(event, "result")?;
    if !matches!(result, "allow" | "deny") {
        return Err(HttpError::invalid_request(
            "user.tool_confirmation: result must be allow or deny",
        ));
    }
    if result == "allow" && event.get("deny_message").is_some_and(|m| !m.is_null()) {
        return Err(HttpError::invalid_request(
            "user.tool_confirmation: deny_message is only allowed with result deny",
        ));
    }
    Ok(())
}

/// Record events a client sent, and what they set in motion: a message runs
/// the session (the echo agent answers it unless a scenario drives the
/// session) and re-queues work when no item is live; an interrupt re-queues
/// work too.
pub fn send(
    tx: &Transaction<'_>,
    fx: &mut Effects,
    state: &AppState,
    session: &Session,
    mut events: Vec<Value>,
) -> HttpResult<Vec<Value>> {
    if session.status == SessionStatus::Terminated || session.archived_at.is_some() {
        return Err(HttpError::invalid_request(format!(
            "session {} is terminated and takes no more events",
            session.id
        )));
    }
    if events.is_empty() {
        return Err(HttpError::invalid_request(
            "events: at least one event is required",
        ));
    }
    let env = session.environment_id.clone().unwrap_or_default();
    let scripted = is_scripted(tx, &session.id)?;
    let mut recorded = Vec::with_capacity(events.len());
    for event in events.iter_mut() {
        check_client_event(tx, &session.id, event)?;
        let kind = event_type(event).to_string();
        recorded.push(append(tx, fx, &session.id, event.clone())?.body);
        match kind.as_str() {
            "user.message" => {
                set_status(tx, fx, &session.id, SessionStatus::Running, None)?;
                work::enqueue_session(tx, fx, &env, &session.id, state.lease_ttl_seconds())?;
                if !scripted {
                    append(
                        tx,
                        fx,
                        &session.id,
                        json!({"type": "agent.message", "content": [{"type": "text", "text": "(the devserver's echo agent has nothing to do; load a scenario to script a session)"}]}),
                    )?;
                    set_status(
                        tx,
                        fx,
                        &session.id,
                        SessionStatus::Idle,
                        Some(json!({"type": "end_turn"})),
                    )?;
                }
            }
            "user.interrupt" => {
                work::enqueue_session(tx, fx, &env, &session.id, state.lease_ttl_seconds())?;
                if !scripted {
                    set_status(
                        tx,
                        fx,
                        &session.id,
                        SessionStatus::Idle,
                        Some(json!({"type": "end_turn"})),
                    )?;
                }
            }
            _ => {}
        }
    }
    Ok(recorded)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendEventsBody {
    events: Vec<Value>,
}

pub async fn send_events(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<SendEventsBody>,
) -> HttpResult<Json<Value>> {
    let st = state.clone();
    let (recorded, fx) = state
        .db()
        .transaction(move |tx| {
            let session = load_for(tx, &principal, &id)?;
            let mut fx = Effects::default();
            let recorded = send(tx, &mut fx, &st, &session, body.events)?;
            Ok((recorded, fx))
        })
        .await?;
    state.apply(fx);
    Ok(Json(json!({ "data": recorded })))
}

/// Events of a session, oldest first unless `descending`, after `cursor`.
pub fn list_events_page(
    tx: &Transaction<'_>,
    session_id: &str,
    ascending: bool,
    cursor: Option<i64>,
    limit: usize,
    types: &[String],
    created: (Option<i64>, Option<i64>),
) -> HttpResult<Page<Value>> {
    let (cmp, dir) = if ascending {
        (">", "ASC")
    } else {
        ("<", "DESC")
    };
    let start = cursor.unwrap_or(if ascending { i64::MIN } else { i64::MAX });
    // Event types are checked to be `[a-z_.]+` before they reach here.
    let type_filter = if types.is_empty() {
        String::new()
    } else {
        format!(
            " AND type IN ({})",
            types
                .iter()
                .map(|t| format!("'{t}'"))
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    let mut stmt = tx.prepare_cached(&format!(
        "SELECT seq, body FROM session_events
         WHERE session_id = ?1 AND seq {cmp} ?2 AND created_at >= ?3 AND created_at <= ?4{type_filter}
         ORDER BY seq {dir} LIMIT ?5"
    ))?;
    let rows = stmt.query_map(
        params![
            session_id,
            start,
            created.0.unwrap_or(i64::MIN),
            created.1.unwrap_or(i64::MAX),
            cursor::fetch_limit(limit)
        ],
        |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)),
    )?;
    let mut items = Vec::new();
    for row in rows {
        let (seq, body) = row?;
        items.push((seq, serde_json::from_str(&body).unwrap_or(Value::Null)));
    }
    Ok(cursor::page(items, limit, seq_cursor, |(_, event)| event))
}

pub async fn list_events(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> HttpResult<Json<Page<Value>>> {
    let q = QueryParams::parse(raw.as_deref());
    let limit = q.limit_up_to(1000)?;
    let ascending = order(&q)?.unwrap_or(true);
    let cursor: Option<SeqCursor> = cursor::decode(q.get("page"))?;
    let types = q.all("types[]");
    if let Some(bad) = types.iter().find(|t| {
        t.is_empty()
            || !t
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_' || b == b'.')
    }) {
        return Err(HttpError::invalid_request(format!(
            "types[]: {bad:?} is not an event type"
        )));
    }
    let micros = |name: &str| -> HttpResult<Option<i64>> {
        Ok(q.timestamp(name)?.map(|t| t.timestamp_micros()))
    };
    let gte = match (micros("created_at[gte]")?, micros("created_at[gt]")?) {
        (Some(a), Some(b)) => Some(a.max(b + 1)),
        (a, b) => a.or(b.map(|b| b + 1)),
    };
    let lte = match (micros("created_at[lte]")?, micros("created_at[lt]")?) {
        (Some(a), Some(b)) => Some(a.min(b - 1)),
        (a, b) => a.or(b.map(|b| b - 1)),
    };
    let page = state
        .db()
        .transaction(move |tx| {
            load_for(tx, &principal, &id)?;
            list_events_page(
                tx,
                &id,
                ascending,
                cursor.map(|c| c.seq),
                limit,
                &types,
                (gte, lte),
            )
        })
        .await?;
    Ok(Json(page))
}

/// `GET /v1/sessions/{id}/events/stream`: events from now on, each as
/// `event: <type>` + `data: <json>`; history is read with the list endpoint.
pub async fn stream(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> HttpResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    // Subscribe before checking, so no event between the check and the
    // subscription is lost.
    let mut rx = state.live().subscribe(&id);
    let sid = id.clone();
    state
        .db()
        .transaction(move |tx| load_for(tx, &principal, &sid).map(|_| ()))
        .await?;
    let events = async_stream::stream! {
        // Falling behind or the session going away ends the stream; the
        // client reconnects and re-reads the history.
        while let Ok(event) = rx.recv().await {
            let kind = event.event_type().to_string();
            yield Ok(Event::default().event(kind.clone()).data(event.body.to_string()));
            if kind == "session.deleted" {
                break;
            }
        }
    };
    Ok(Sse::new(events).keep_alive(
        KeepAlive::new()
            .interval(state.ping_interval())
            .event(Event::default().event("ping").data(r#"{"type":"ping"}"#)),
    ))
}

pub async fn archive(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> HttpResult<Json<Session>> {
    principal.require_org("archive sessions")?;
    let (session, fx) = state
        .db()
        .transaction(move |tx| {
            let session = load(tx, &id)?;
            let mut fx = Effects::default();
            if session.status == SessionStatus::Running {
                return Err(HttpError::invalid_request(format!(
                    "session {id} is running and cannot be archived"
                )));
            }
            if session.archived_at.is_none() {
                set_status(tx, &mut fx, &id, SessionStatus::Terminated, None)?;
                tx.execute_cached(
                    "UPDATE sessions SET archived_at = ?2 WHERE id = ?1",
                    params![id, ids::now_micros()],
                )?;
            }
            Ok((load(tx, &id)?, fx))
        })
        .await?;
    state.apply(fx);
    Ok(Json(session))
}

pub async fn delete(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> HttpResult<Json<Value>> {
    principal.require_org("delete sessions")?;
    let fx = state
        .db()
        .transaction(move |tx| {
            let session = load(tx, &id)?;
            if session.status == SessionStatus::Running {
                return Err(HttpError::invalid_request(format!(
                    "session {id} is running and cannot be deleted"
                )));
            }
            let mut fx = Effects::default();
            append(tx, &mut fx, &id, json!({"type": "session.deleted"}))?;
            let now = ids::now_micros();
            tx.execute_cached(
                "UPDATE work_items SET state = 'stopped', stopped_at = ?2 WHERE data_id = ?1 AND state != 'stopped'",
                params![id, now],
            )?;
            tx.execute_cached("DELETE FROM session_events WHERE session_id = ?1", [&id])?;
            tx.execute_cached("DELETE FROM sessions WHERE id = ?1", [&id])?;
            Ok(fx)
        })
        .await?;
    let id = fx
        .events
        .first()
        .map(|e| e.session_id.clone())
        .unwrap_or_default();
    state.apply(fx);
    Ok(Json(json!({"id": id, "type": "session_deleted"})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs() {
        for (name, slug) in [
            ("User Preferences", "user-preferences"),
            ("Team KB", "team-kb"),
            ("  --Weird__Name!!  ", "weird-name"),
            ("Ünïcödé notes", "n-c-d-notes"),
            ("ABC123", "abc123"),
            ("!!!", ""),
        ] {
            assert_eq!(slugify(name), slug, "{name}");
        }
    }

    #[test]
    fn mount_paths_fall_back_to_the_id_and_number_collisions() {
        let paths = mount_paths(
            "/mnt/memory/",
            &[
                ("memstore_a", "Notes"),
                ("memstore_b", "notes"),
                ("memstore_c", "???"),
                ("memstore_d", "Notes!"),
            ],
        );
        assert_eq!(
            paths,
            vec![
                "/mnt/memory/notes",
                "/mnt/memory/notes-2",
                "/mnt/memory/memstore_c",
                "/mnt/memory/notes-3"
            ]
        );
    }
}
