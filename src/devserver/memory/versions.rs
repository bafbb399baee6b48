//! `/v1/memory_stores/{id}/memory_versions`: list (newest first), retrieve, redact.

use crate::devserver::db::Cached;
use axum::Json;
use axum::extract::{Extension, Path, RawQuery, State};
use rusqlite::types::Value as SqlValue;
use rusqlite::{OptionalExtension, Transaction, params, params_from_iter};

use crate::api::types::{MemoryVersion, Page, View};

use super::super::auth::Principal;
use super::super::error::{HttpError, HttpResult};
use super::super::http::QueryParams;
use super::super::{cursor, ids, state::AppState};
use super::authorize_store;
use super::memories::FULL_VIEW_PAGE_CAP;
use super::rows::{VERSION_COLUMNS, load_store, version_at, version_from_row};

pub async fn list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(store_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> HttpResult<Json<Page<MemoryVersion>>> {
    let q = QueryParams::parse(raw.as_deref());
    let view = q.view(View::Basic)?;
    let mut limit = q.limit()?;
    if view == View::Full {
        limit = limit.min(FULL_VIEW_PAGE_CAP);
    }
    let cursor: Option<cursor::Before> = cursor::decode(q.get("page"))?;

    // Each filter adds one condition and one bound value.
    let mut conditions = vec!["store_id = ?".to_string(), "seq < ?".to_string()];
    let mut values: Vec<SqlValue> = vec![
        SqlValue::Text(store_id.clone()),
        SqlValue::Integer(cursor.map_or(i64::MAX, |c| c.before)),
    ];
    let mut filter = |condition: &str, value: SqlValue| {
        conditions.push(condition.to_string());
        values.push(value);
    };
    if let Some(memory_id) = q.string("memory_id") {
        filter("memory_id = ?", SqlValue::Text(memory_id));
    }
    for (param, actor_type) in [
        ("session_id", "session_actor"),
        ("api_key_id", "api_actor"),
        ("service_account_id", "service_account_actor"),
    ] {
        if let Some(id) = q.string(param) {
            filter("actor_type = ?", SqlValue::Text(actor_type.into()));
            filter("actor_id = ?", SqlValue::Text(id));
        }
    }
    if let Some(operation) = q.operation()? {
        filter("operation = ?", SqlValue::Text(operation.as_str().into()));
    }
    if let Some(t) = q.timestamp("created_at[gte]")? {
        filter("created_at >= ?", SqlValue::Integer(t.timestamp_micros()));
    }
    if let Some(t) = q.timestamp("created_at[lte]")? {
        filter("created_at <= ?", SqlValue::Integer(t.timestamp_micros()));
    }
    values.push(SqlValue::Integer(cursor::fetch_limit(limit)));
    let sql = format!(
        "SELECT seq, {VERSION_COLUMNS} FROM memory_versions WHERE {} ORDER BY seq DESC LIMIT ?",
        conditions.join(" AND ")
    );

    let page = state
        .db()
        .transaction(move |tx| {
            authorize_store(tx, &principal, &store_id, false)?;
            load_store(tx, &store_id)?;
            let mut stmt = tx.prepare_cached(&sql)?;
            let rows = stmt.query_map(params_from_iter(values), |r| {
                Ok((r.get::<_, i64>(0)?, version_at(r, 1, view == View::Full)?))
            })?;
            let rows = rows.collect::<Result<Vec<_>, _>>()?;
            Ok(cursor::newest_first(rows, limit))
        })
        .await?;
    Ok(Json(page))
}

fn load_version(
    tx: &Transaction<'_>,
    store_id: &str,
    version_id: &str,
) -> HttpResult<MemoryVersion> {
    tx.query_row_cached(
        &format!("SELECT {VERSION_COLUMNS} FROM memory_versions WHERE id = ?1 AND store_id = ?2"),
        [version_id, store_id],
        |r| version_from_row(r, true),
    )
    .optional()?
    .ok_or_else(|| {
        HttpError::not_found(format!(
            "memory version {version_id} not found in memory store {store_id}"
        ))
    })
}

pub async fn retrieve(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((store_id, version_id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> HttpResult<Json<MemoryVersion>> {
    let view = QueryParams::parse(raw.as_deref()).view(View::Full)?;
    let mut version = state
        .db()
        .transaction(move |tx| {
            authorize_store(tx, &principal, &store_id, false)?;
            load_store(tx, &store_id)?;
            load_version(tx, &store_id, &version_id)
        })
        .await?;
    if view == View::Basic {
        version.content = None;
    }
    Ok(Json(version))
}

pub async fn redact(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((store_id, version_id)): Path<(String, String)>,
) -> HttpResult<Json<MemoryVersion>> {
    principal.require_org("redact memory versions")?;
    let version = state
        .db()
        .transaction(move |tx| {
            load_store(tx, &store_id)?;
            let version = load_version(tx, &store_id, &version_id)?;
            if version.redacted_at.is_some() {
                return Ok(version);
            }
            let is_head: bool = tx.query_row_cached(
                "SELECT EXISTS (SELECT 1 FROM memories WHERE version_id = ?1)",
                [&version_id],
                |r| r.get(0),
            )?;
            if is_head {
                return Err(HttpError::invalid_request(format!(
                    "memory version {version_id} is the current version of a live memory and cannot be redacted; \
                     write new content to the memory (or delete it) first"
                )));
            }
            let by = serde_json::to_string(&principal.actor()).unwrap_or_default();
            tx.execute_cached(
                "UPDATE memory_versions
                 SET redacted_at = ?2, redacted_by = ?3,
                     content = NULL, content_sha256 = NULL, size_bytes = NULL, path = NULL
                 WHERE id = ?1",
                params![version_id, ids::now_micros(), by],
            )?;
            load_version(tx, &store_id, &version_id)
        })
        .await?;
    Ok(Json(version))
}
