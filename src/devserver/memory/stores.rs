//! `/v1/memory_stores`: create, list, retrieve, update, archive, delete.

use crate::devserver::db::Cached;
use axum::Json;
use axum::extract::{Extension, Path, RawQuery, State};
use rusqlite::params;

use crate::api::types::{
    CreateMemoryStore, DeletedMemoryStore, MemoryStore, Page, UpdateMemoryStore,
};

use super::super::auth::Principal;
use super::super::error::{HttpError, HttpResult};
use super::super::http::{JsonBody, QueryParams};
use super::super::{cursor, ids, state::AppState, validate};
use super::authorize_store;
use super::rows::{self, STORE_COLUMNS, load_store, metadata_json, store_at};

fn invalid(message: String) -> HttpError {
    HttpError::invalid_request(message)
}

pub async fn create(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    JsonBody(body): JsonBody<CreateMemoryStore>,
) -> HttpResult<Json<MemoryStore>> {
    principal.require_org("create memory stores")?;
    validate::store_name(&body.name).map_err(invalid)?;
    let description = body.description.unwrap_or_default();
    validate::description(&description).map_err(invalid)?;
    let metadata = body.metadata.unwrap_or_default();
    validate::metadata(&metadata).map_err(invalid)?;

    let store = state
        .db()
        .transaction(move |tx| rows::insert_store(tx, &body.name, &description, &metadata))
        .await?;
    Ok(Json(store))
}

pub async fn list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RawQuery(raw): RawQuery,
) -> HttpResult<Json<Page<MemoryStore>>> {
    principal.require_org("list memory stores")?;
    let q = QueryParams::parse(raw.as_deref());
    let limit = q.limit()?;
    let include_archived = q.boolean("include_archived")?.unwrap_or(false);
    let gte = q
        .timestamp("created_at[gte]")?
        .map(|t| t.timestamp_micros());
    let lte = q
        .timestamp("created_at[lte]")?
        .map(|t| t.timestamp_micros());
    let cursor: Option<cursor::Before> = cursor::decode(q.get("page"))?;

    let page = state
        .db()
        .transaction(move |tx| {
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT seq, {STORE_COLUMNS} FROM memory_stores
                 WHERE (?1 OR archived_at IS NULL)
                   AND created_at >= ?2 AND created_at <= ?3 AND seq < ?4
                 ORDER BY seq DESC LIMIT ?5"
            ))?;
            let rows = stmt.query_map(
                params![
                    include_archived,
                    gte.unwrap_or(i64::MIN),
                    lte.unwrap_or(i64::MAX),
                    cursor.map_or(i64::MAX, |c| c.before),
                    cursor::fetch_limit(limit),
                ],
                |r| Ok((r.get::<_, i64>(0)?, store_at(r, 1)?)),
            )?;
            let rows = rows.collect::<Result<Vec<_>, _>>()?;
            Ok(cursor::newest_first(rows, limit))
        })
        .await?;
    Ok(Json(page))
}

pub async fn retrieve(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(store_id): Path<String>,
) -> HttpResult<Json<MemoryStore>> {
    let store = state
        .db()
        .transaction(move |tx| {
            authorize_store(tx, &principal, &store_id, false)?;
            load_store(tx, &store_id)
        })
        .await?;
    Ok(Json(store))
}

pub async fn update(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(store_id): Path<String>,
    JsonBody(body): JsonBody<UpdateMemoryStore>,
) -> HttpResult<Json<MemoryStore>> {
    principal.require_org("update memory stores")?;
    if let Some(name) = &body.name {
        validate::store_name(name).map_err(invalid)?;
    }
    if let Some(description) = &body.description {
        validate::description(description).map_err(invalid)?;
    }
    let store = state
        .db()
        .transaction(move |tx| {
            let mut store = load_store(tx, &store_id)?;
            if store.archived_at.is_some() {
                return Err(HttpError::invalid_request(format!(
                    "memory store {store_id} is archived and cannot be updated"
                )));
            }
            let before = store.clone();
            if let Some(name) = body.name {
                store.name = name;
            }
            if let Some(description) = body.description {
                store.description = description;
            }
            for (key, value) in body.metadata.unwrap_or_default() {
                match value {
                    Some(value) => store.metadata.insert(key, value),
                    None => store.metadata.remove(&key),
                };
            }
            validate::metadata(&store.metadata).map_err(invalid)?;
            if store == before {
                return Ok(store);
            }
            tx.execute_cached(
                "UPDATE memory_stores SET name = ?2, description = ?3, metadata = ?4, updated_at = ?5
                 WHERE id = ?1",
                params![
                    store_id,
                    store.name,
                    store.description,
                    metadata_json(&store.metadata),
                    ids::now_micros()
                ],
            )?;
            load_store(tx, &store_id)
        })
        .await?;
    Ok(Json(store))
}

pub async fn archive(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(store_id): Path<String>,
) -> HttpResult<Json<MemoryStore>> {
    principal.require_org("archive memory stores")?;
    let store = state
        .db()
        .transaction(move |tx| {
            let store = load_store(tx, &store_id)?;
            if store.archived_at.is_some() {
                // Archiving twice returns the store unchanged.
                return Ok(store);
            }
            let now = ids::now_micros();
            tx.execute_cached(
                "UPDATE memory_stores SET archived_at = ?2, updated_at = ?2 WHERE id = ?1",
                params![store_id, now],
            )?;
            load_store(tx, &store_id)
        })
        .await?;
    Ok(Json(store))
}

pub async fn delete(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(store_id): Path<String>,
) -> HttpResult<Json<DeletedMemoryStore>> {
    principal.require_org("delete memory stores")?;
    let deleted = state
        .db()
        .transaction(move |tx| {
            load_store(tx, &store_id)?;
            // Memories and versions go with the store (ON DELETE CASCADE).
            tx.execute_cached("DELETE FROM memory_stores WHERE id = ?1", [&store_id])?;
            Ok(DeletedMemoryStore {
                id: store_id,
                object_type: "memory_store_deleted".into(),
            })
        })
        .await?;
    Ok(Json(deleted))
}
