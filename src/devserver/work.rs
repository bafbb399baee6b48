//! The work queue of a self-hosted environment
//! (`/v1/environments/{id}/work/**`): poll, ack, heartbeat, stop, retrieve,
//! update, list, stats — and the lease that returns an abandoned item to the
//! queue.
//!
//! States: `queued → starting` (ack) `→ active` (first heartbeat)
//! `→ stopping` (graceful stop) `→ stopped` (force stop). A poll claims a
//! queued item without changing its state; an unacknowledged claim may be
//! reclaimed by another poll after `reclaim_older_than_ms`. An acknowledged
//! item whose lease is not renewed within `ttl_seconds` returns to `queued`,
//! its heartbeat history erased, so the old holder's next beat gets 412.

use crate::devserver::db::Cached;
use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rusqlite::{OptionalExtension, Row, Transaction, params};
use serde::Deserialize;
use serde_json::json;

use crate::api::NO_HEARTBEAT;
use crate::api::types::{
    Heartbeat, LeaseState, Page, Redacted, Work, WorkData, WorkQueueStats, WorkSecret, WorkState,
};

use super::auth::{self, Principal};
use super::environments;
use super::error::{HttpError, HttpResult};
use super::http::{JsonBody, OptionalJsonBody, QueryParams};
use super::live::Effects;
use super::{cursor, ids, state::AppState};

/// Default `reclaim_older_than_ms` when a poll does not say.
pub const DEFAULT_RECLAIM_MS: i64 = 5_000;
/// Largest `desired_ttl_seconds` honoured.
pub const MAX_TTL_SECONDS: i64 = 3_600;
/// A worker counts toward `workers_polling` for this long after its last poll.
const WORKERS_POLLING_WINDOW_MICROS: i64 = 30_000_000;

const COLUMNS: &str = "id, environment_id, data_type, data_id, state, metadata, created_at, \
    acknowledged_at, started_at, latest_heartbeat_at, stop_requested_at, stopped_at, \
    last_heartbeat, ttl_seconds";

fn rfc3339(micros: i64) -> String {
    ids::from_micros(micros).to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// A work item row, with what the wire object does not show.
#[derive(Debug, Clone)]
pub struct WorkRow {
    pub(crate) work: Work,
    pub(crate) last_heartbeat: Option<String>,
    pub(crate) ttl_seconds: i64,
}

fn from_row(row: &Row<'_>) -> rusqlite::Result<WorkRow> {
    row_at(row, 0)
}

/// A work item whose [`COLUMNS`] start at column `at`.
fn row_at(row: &Row<'_>, at: usize) -> rusqlite::Result<WorkRow> {
    let ts = |i: usize| -> rusqlite::Result<Option<String>> {
        Ok(row.get::<_, Option<i64>>(at + i)?.map(rfc3339))
    };
    Ok(WorkRow {
        work: Work {
            id: row.get(at)?,
            object_type: "work".into(),
            environment_id: row.get(at + 1)?,
            data: WorkData {
                kind: row.get(at + 2)?,
                id: row.get(at + 3)?,
            },
            state: WorkState::parse(&row.get::<_, String>(at + 4)?),
            secret: None,
            metadata: serde_json::from_str(&row.get::<_, String>(at + 5)?).unwrap_or_default(),
            created_at: rfc3339(row.get(at + 6)?),
            acknowledged_at: ts(7)?,
            started_at: ts(8)?,
            latest_heartbeat_at: ts(9)?,
            stop_requested_at: ts(10)?,
            stopped_at: ts(11)?,
        },
        last_heartbeat: row.get(at + 12)?,
        ttl_seconds: row.get(at + 13)?,
    })
}

/// The item, or 404 — only within its own environment.
pub fn load(tx: &Transaction<'_>, environment_id: &str, work_id: &str) -> HttpResult<WorkRow> {
    tx.query_row_cached(
        &format!("SELECT {COLUMNS} FROM work_items WHERE id = ?1 AND environment_id = ?2"),
        [work_id, environment_id],
        from_row,
    )
    .optional()?
    .ok_or_else(|| {
        HttpError::not_found(format!(
            "work item {work_id} not found in environment {environment_id}"
        ))
    })
}

/// Queue a work item for `session_id` unless one is still live (not stopped).
/// Returns whether one was queued.
pub fn enqueue_session(
    tx: &Transaction<'_>,
    fx: &mut Effects,
    environment_id: &str,
    session_id: &str,
    ttl_seconds: i64,
) -> HttpResult<bool> {
    let self_hosted: bool = tx
        .query_row_cached(
            "SELECT config_type = 'self_hosted' FROM environments WHERE id = ?1",
            [environment_id],
            |r| r.get(0),
        )
        .optional()?
        .unwrap_or(false);
    if !self_hosted {
        return Ok(false);
    }
    let live: bool = tx.query_row_cached(
        "SELECT EXISTS (SELECT 1 FROM work_items WHERE data_id = ?1 AND state != 'stopped')",
        [session_id],
        |r| r.get(0),
    )?;
    if live {
        return Ok(false);
    }
    tx.execute_cached(
        "INSERT INTO work_items (id, environment_id, data_type, data_id, state, metadata, created_at, ttl_seconds)
         VALUES (?1, ?2, 'session', ?3, 'queued', '{}', ?4, ?5)",
        params![ids::new_id("work"), environment_id, session_id, ids::now_micros(), ttl_seconds],
    )?;
    fx.work_available = true;
    Ok(true)
}

/// Return every item whose lease ran out: acknowledged items go back to the
/// queue with their heartbeat history erased; a `stopping` item nobody
/// heartbeats any more is stopped. Returns how many were re-queued.
pub fn expire_leases(tx: &Transaction<'_>, now: i64) -> HttpResult<usize> {
    let requeued = tx.execute_cached(
        "UPDATE work_items
         SET state = 'queued', claimed_at = NULL, claimed_by = NULL, acknowledged_at = NULL,
             last_heartbeat = NULL, lease_expires_at = NULL
         WHERE state IN ('starting', 'active') AND lease_expires_at IS NOT NULL AND lease_expires_at < ?1",
        [now],
    )?;
    tx.execute_cached(
        "UPDATE work_items SET state = 'stopped', stopped_at = ?1
         WHERE state = 'stopping' AND lease_expires_at IS NOT NULL AND lease_expires_at < ?1",
        [now],
    )?;
    Ok(requeued)
}

/// The `secret` of a claimed item: URL-safe base64 of `{"sessions_token": …}`.
fn secret_for(token: String) -> Redacted {
    let payload = WorkSecret {
        sessions_token: Redacted::new(token),
        api_base_url: None,
    };
    let json = serde_json::to_vec(&payload).unwrap_or_default();
    Redacted::new(URL_SAFE_NO_PAD.encode(json))
}

/// Claim the oldest claimable item of `environment_id`, minting its secret.
fn claim(
    tx: &Transaction<'_>,
    environment_id: &str,
    reclaim_ms: i64,
    worker_id: Option<&str>,
) -> HttpResult<Option<Work>> {
    let now = ids::now_micros();
    expire_leases(tx, now)?;
    let claimable: Option<String> = tx
        .query_row_cached(
            "SELECT id FROM work_items
             WHERE environment_id = ?1 AND state = 'queued'
               AND (claimed_at IS NULL OR claimed_at <= ?2)
             ORDER BY seq LIMIT 1",
            params![environment_id, now - reclaim_ms * 1000],
            |r| r.get(0),
        )
        .optional()?;
    let Some(work_id) = claimable else {
        return Ok(None);
    };
    tx.execute_cached(
        "UPDATE work_items SET claimed_at = ?2, claimed_by = ?3 WHERE id = ?1",
        params![work_id, now, worker_id],
    )?;
    let mut row = load(tx, environment_id, &work_id)?;
    if row.work.data.is_session() {
        let token =
            auth::issue_sessions_token(tx, environment_id, &row.work.data.id, &row.work.id)?;
        row.work.secret = Some(secret_for(token));
    }
    Ok(Some(row.work))
}

/// `GET .../work/poll`.
pub async fn poll(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(environment_id): Path<String>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> HttpResult<Response> {
    principal.require_environment(&environment_id, None)?;
    let q = QueryParams::parse(raw.as_deref());
    let block_ms = q.integer("block_ms", 1, 999)?;
    let reclaim_ms = q
        .integer("reclaim_older_than_ms", 1, i64::MAX / 1000)?
        .unwrap_or(DEFAULT_RECLAIM_MS);
    let worker_id = headers
        .get("anthropic-worker-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_string);
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(block_ms.unwrap_or(0) as u64);
    loop {
        // Register for a wake-up before looking, so an item queued between the
        // look and the wait is not missed.
        let woken = state.live().work_available.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let env = environment_id.clone();
        let worker = worker_id.clone();
        let claimed = state
            .db()
            .transaction(move |tx| {
                environments::load(tx, &env)?;
                if let Some(worker) = &worker {
                    tx.execute_cached(
                        "INSERT INTO worker_polls (environment_id, worker_id, polled_at) VALUES (?1, ?2, ?3)
                         ON CONFLICT (environment_id, worker_id) DO UPDATE SET polled_at = excluded.polled_at",
                        params![env, worker, ids::now_micros()],
                    )?;
                }
                claim(tx, &env, reclaim_ms, worker.as_deref())
            })
            .await?;
        if let Some(work) = claimed {
            return Ok(Json(work).into_response());
        }
        if tokio::time::Instant::now() >= deadline {
            // "No work" is `200` with a JSON `null` body, as the official SDKs expect.
            return Ok(Json(serde_json::Value::Null).into_response());
        }
        let _ = tokio::time::timeout_at(deadline, woken).await;
    }
}

/// `POST .../work/{id}/ack`: `queued → starting`; the lease starts now.
pub async fn ack(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((environment_id, work_id)): Path<(String, String)>,
) -> HttpResult<Json<Work>> {
    principal.require_environment(&environment_id, Some(&work_id))?;
    let work = state
        .db()
        .transaction(move |tx| {
            let now = ids::now_micros();
            expire_leases(tx, now)?;
            let row = load(tx, &environment_id, &work_id)?;
            if row.work.state != WorkState::Queued {
                return Err(HttpError::conflict(
                    "conflict_error",
                    format!(
                        "work item {work_id} is {}, not queued; it cannot be acknowledged",
                        row.work.state.as_str()
                    ),
                ));
            }
            tx.execute_cached(
                "UPDATE work_items SET state = 'starting', acknowledged_at = ?2, lease_expires_at = ?3
                 WHERE id = ?1",
                params![work_id, now, now + row.ttl_seconds * 1_000_000],
            )?;
            Ok(load(tx, &environment_id, &work_id)?.work)
        })
        .await?;
    Ok(Json(work))
}

/// `POST .../work/{id}/heartbeat`.
pub async fn heartbeat(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((environment_id, work_id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> HttpResult<Json<Heartbeat>> {
    principal.require_environment(&environment_id, Some(&work_id))?;
    let q = QueryParams::parse(raw.as_deref());
    let expected = q.string("expected_last_heartbeat").ok_or_else(|| {
        HttpError::invalid_request(format!(
            "expected_last_heartbeat: is required ({NO_HEARTBEAT} for the first heartbeat)"
        ))
    })?;
    let desired_ttl = q.integer("desired_ttl_seconds", 1, MAX_TTL_SECONDS)?;
    let beat = state
        .db()
        .transaction(move |tx| {
            let now = ids::now_micros();
            expire_leases(tx, now)?;
            let row = load(tx, &environment_id, &work_id)?;
            let ttl = desired_ttl.unwrap_or(row.ttl_seconds);
            let lease_state = |extended: bool| LeaseState {
                last_heartbeat: row.last_heartbeat.clone(),
                lease_extended: extended,
                state: row.work.state,
                ttl_seconds: row.ttl_seconds,
            };
            match row.work.state {
                WorkState::Stopped => {
                    return Ok(Heartbeat {
                        object_type: "work_heartbeat".into(),
                        last_heartbeat: row.last_heartbeat.clone().unwrap_or_default(),
                        lease_extended: false,
                        state: WorkState::Stopped,
                        ttl_seconds: row.ttl_seconds,
                    });
                }
                // Not held by anyone: never acknowledged, or re-queued after the
                // lease ran out. The caller does not hold the lease.
                WorkState::Queued | WorkState::Unknown => {
                    return Err(precondition_failed(&work_id, lease_state(false)));
                }
                // The expectation is not compared once a stop was requested.
                WorkState::Stopping => {}
                WorkState::Starting | WorkState::Active => {
                    let held = row.last_heartbeat.as_deref().unwrap_or(NO_HEARTBEAT);
                    if expected != held {
                        return Err(precondition_failed(&work_id, lease_state(false)));
                    }
                }
            }
            let stamp = rfc3339(now);
            let next_state = match row.work.state {
                WorkState::Starting => WorkState::Active,
                other => other,
            };
            tx.execute_cached(
                "UPDATE work_items
                 SET state = ?2, last_heartbeat = ?3, latest_heartbeat_at = ?4, lease_expires_at = ?5,
                     ttl_seconds = ?6, started_at = COALESCE(started_at, ?4)
                 WHERE id = ?1",
                params![
                    work_id,
                    next_state.as_str(),
                    stamp,
                    now,
                    now + ttl * 1_000_000,
                    ttl
                ],
            )?;
            Ok(Heartbeat {
                object_type: "work_heartbeat".into(),
                last_heartbeat: stamp,
                lease_extended: true,
                state: next_state,
                ttl_seconds: ttl,
            })
        })
        .await?;
    Ok(Json(beat))
}

/// 412 with the lease as the server holds it in `error.details.current_state`.
fn precondition_failed(work_id: &str, current: LeaseState) -> HttpError {
    HttpError::new(
        StatusCode::PRECONDITION_FAILED,
        "precondition_failed_error",
        format!(
            "expected_last_heartbeat does not match the lease of work item {work_id}; another worker may hold it"
        ),
    )
    .with_details(json!({
        "error_code": "heartbeat_precondition_failed",
        "current_state": current,
    }))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StopRequest {
    #[serde(default)]
    force: bool,
}

/// Stop `work_id`: `force` (or a never-started item) → `stopped`, otherwise
/// `stopping`. 409 when it is already stopped.
pub fn stop_item(
    tx: &Transaction<'_>,
    environment_id: &str,
    work_id: &str,
    force: bool,
) -> HttpResult<WorkState> {
    let now = ids::now_micros();
    let row = load(tx, environment_id, work_id)?;
    let next = match row.work.state {
        WorkState::Stopped => {
            return Err(HttpError::conflict(
                "conflict_error",
                format!("work item {work_id} is already stopped"),
            ));
        }
        WorkState::Queued => WorkState::Stopped,
        _ if force => WorkState::Stopped,
        _ => WorkState::Stopping,
    };
    tx.execute_cached(
        "UPDATE work_items
         SET state = ?2, stop_requested_at = COALESCE(stop_requested_at, ?3),
             stopped_at = CASE WHEN ?2 = 'stopped' THEN ?3 ELSE stopped_at END
         WHERE id = ?1",
        params![work_id, next.as_str(), now],
    )?;
    Ok(next)
}

/// `POST .../work/{id}/stop`: answers 204, as the live API does.
pub async fn stop(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((environment_id, work_id)): Path<(String, String)>,
    OptionalJsonBody(body): OptionalJsonBody<StopRequest>,
) -> HttpResult<StatusCode> {
    principal.require_environment(&environment_id, Some(&work_id))?;
    let force = body.unwrap_or_default().force;
    state
        .db()
        .transaction(move |tx| stop_item(tx, &environment_id, &work_id, force))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET .../work/{id}`; the secret is never shown here.
pub async fn retrieve(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((environment_id, work_id)): Path<(String, String)>,
) -> HttpResult<Json<Work>> {
    principal.require_environment(&environment_id, Some(&work_id))?;
    let work = state
        .db()
        .transaction(move |tx| {
            expire_leases(tx, ids::now_micros())?;
            Ok(load(tx, &environment_id, &work_id)?.work)
        })
        .await?;
    Ok(Json(work))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateWork {
    metadata: BTreeMap<String, Option<String>>,
}

/// `POST .../work/{id}`: a metadata merge patch.
pub async fn update(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((environment_id, work_id)): Path<(String, String)>,
    JsonBody(body): JsonBody<UpdateWork>,
) -> HttpResult<Json<Work>> {
    principal.require_environment(&environment_id, None)?;
    let work = state
        .db()
        .transaction(move |tx| {
            let mut row = load(tx, &environment_id, &work_id)?;
            for (k, v) in body.metadata {
                match v {
                    Some(v) => row.work.metadata.insert(k, v),
                    None => row.work.metadata.remove(&k),
                };
            }
            super::validate::metadata(&row.work.metadata).map_err(HttpError::invalid_request)?;
            tx.execute_cached(
                "UPDATE work_items SET metadata = ?2 WHERE id = ?1",
                params![
                    work_id,
                    serde_json::to_string(&row.work.metadata).unwrap_or_default()
                ],
            )?;
            Ok(load(tx, &environment_id, &work_id)?.work)
        })
        .await?;
    Ok(Json(work))
}

/// `GET .../work`: newest first.
pub async fn list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(environment_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> HttpResult<Json<Page<Work>>> {
    principal.require_environment(&environment_id, None)?;
    let q = QueryParams::parse(raw.as_deref());
    let limit = q.limit_up_to(1000)?;
    let cursor: Option<cursor::Before> = cursor::decode(q.get("page"))?;
    let page = state
        .db()
        .transaction(move |tx| {
            expire_leases(tx, ids::now_micros())?;
            environments::load(tx, &environment_id)?;
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT seq, {COLUMNS} FROM work_items WHERE environment_id = ?1 AND seq < ?2
                 ORDER BY seq DESC LIMIT ?3"
            ))?;
            let rows = stmt.query_map(
                params![
                    environment_id,
                    cursor.map_or(i64::MAX, |c| c.before),
                    cursor::fetch_limit(limit)
                ],
                |r| Ok((r.get::<_, i64>(0)?, row_at(r, 1)?.work)),
            )?;
            let rows = rows.collect::<Result<Vec<_>, _>>()?;
            Ok(cursor::newest_first(rows, limit))
        })
        .await?;
    Ok(Json(page))
}

/// `GET .../work/stats`.
pub async fn stats(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(environment_id): Path<String>,
) -> HttpResult<Json<WorkQueueStats>> {
    principal.require_environment(&environment_id, None)?;
    let stats = state
        .db()
        .transaction(move |tx| {
            let now = ids::now_micros();
            expire_leases(tx, now)?;
            environments::load(tx, &environment_id)?;
            let (depth, pending, oldest): (i64, i64, Option<i64>) = tx.query_row_cached(
                "SELECT
                   COALESCE(SUM(claimed_at IS NULL), 0),
                   COALESCE(SUM(claimed_at IS NOT NULL), 0),
                   MIN(created_at)
                 FROM work_items WHERE environment_id = ?1 AND state = 'queued'",
                [&environment_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
            let workers: i64 = tx.query_row_cached(
                "SELECT COUNT(*) FROM worker_polls WHERE environment_id = ?1 AND polled_at >= ?2",
                params![environment_id, now - WORKERS_POLLING_WINDOW_MICROS],
                |r| r.get(0),
            )?;
            Ok(WorkQueueStats {
                object_type: "work_queue_stats".into(),
                depth: depth as u64,
                pending: pending as u64,
                oldest_queued_at: oldest.map(rfc3339),
                workers_polling: Some(workers as u64),
            })
        })
        .await?;
    Ok(Json(stats))
}
