//! `/v1/memory_stores/{id}/memories`: create, list, retrieve, update, delete.

use axum::Json;
use axum::extract::{Extension, Path, RawQuery, State};
use rusqlite::{Transaction, params};
use serde::{Deserialize, Serialize};

use crate::api::types::{
    CreateMemory, DeletedMemory, Memory, MemoryListItem, MemoryPrefix, Page, UpdateMemory, View,
};

use super::super::auth::Principal;
use super::super::error::{HttpError, HttpResult};
use super::super::http::{JsonBody, QueryParams};
use super::super::{cursor, state::AppState, validate};
use super::authorize_store;
use super::rows::{
    MEMORY_COLUMNS, conflict_error, insert_memory, load_memory, load_store, load_writable_store,
    memory_from_row, path_conflict, remove_memory, rewrite_memory,
};

/// A `full` page holds at most this many items, whatever `limit` says.
pub const FULL_VIEW_PAGE_CAP: usize = 20;

fn invalid(message: String) -> HttpError {
    HttpError::invalid_request(message)
}

/// The memory in the requested view.
fn in_view(mut memory: Memory, view: View) -> Memory {
    if view == View::Basic {
        memory.content = None;
    }
    memory
}

pub async fn create(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(store_id): Path<String>,
    RawQuery(raw): RawQuery,
    JsonBody(body): JsonBody<CreateMemory>,
) -> HttpResult<Json<Memory>> {
    let view = QueryParams::parse(raw.as_deref()).view(View::Basic)?;
    validate::memory_path("path", &body.path).map_err(invalid)?;
    let content = body.content.unwrap_or_default();
    validate::content(&content).map_err(invalid)?;

    let memory = state
        .db()
        .transaction(move |tx| {
            authorize_store(tx, &principal, &store_id, true)?;
            load_writable_store(tx, &store_id)?;
            insert_memory(tx, &store_id, &body.path, &content, &principal.actor())
        })
        .await?;
    Ok(Json(in_view(memory, view)))
}

pub async fn retrieve(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((store_id, memory_id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> HttpResult<Json<Memory>> {
    let view = QueryParams::parse(raw.as_deref()).view(View::Full)?;
    let memory = state
        .db()
        .transaction(move |tx| {
            authorize_store(tx, &principal, &store_id, false)?;
            load_store(tx, &store_id)?;
            load_memory(tx, &store_id, &memory_id)
        })
        .await?;
    Ok(Json(in_view(memory, view)))
}

pub async fn update(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((store_id, memory_id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
    JsonBody(body): JsonBody<UpdateMemory>,
) -> HttpResult<Json<Memory>> {
    let view = QueryParams::parse(raw.as_deref()).view(View::Basic)?;
    if body.content.is_none() && body.path.is_none() {
        return Err(HttpError::invalid_request(
            "an update must set content, path, or both",
        ));
    }
    if let Some(path) = &body.path {
        validate::memory_path("path", path).map_err(invalid)?;
    }
    if let Some(content) = &body.content {
        validate::content(content).map_err(invalid)?;
    }
    let expected_sha = match &body.precondition {
        None => None,
        Some(p) if p.kind == "content_sha256" => {
            let sha = p.content_sha256.as_deref().ok_or_else(|| {
                HttpError::invalid_request("precondition.content_sha256: is required")
            })?;
            validate::sha256_hex("precondition.content_sha256", sha).map_err(invalid)?;
            Some(sha.to_string())
        }
        Some(p) => {
            return Err(HttpError::invalid_request(format!(
                "precondition.type: {:?} is not supported; use content_sha256",
                p.kind
            )));
        }
    };

    let memory = state
        .db()
        .transaction(move |tx| {
            authorize_store(tx, &principal, &store_id, true)?;
            load_writable_store(tx, &store_id)?;
            let current = load_memory(tx, &store_id, &memory_id)?;
            let current_content = current.content.clone().unwrap_or_default();
            let content = body.content.unwrap_or_else(|| current_content.clone());
            let path = body.path.unwrap_or_else(|| current.path.clone());
            // The stored state already equals the request: a no-op, which also
            // answers a retried update whose first attempt landed.
            let unchanged = content == current_content && path == current.path;
            if let Some(expected) = expected_sha
                && expected != current.content_sha256
                && !unchanged
            {
                return Err(HttpError::conflict(
                    "memory_precondition_failed_error",
                    format!(
                        "memory {memory_id} no longer has content_sha256 {expected}; re-read it and retry"
                    ),
                ));
            }
            if unchanged {
                return Ok(current);
            }
            if path != current.path
                && let Some(hit) = path_conflict(tx, &store_id, &path, Some(&memory_id))?
            {
                return Err(conflict_error(&path, hit));
            }
            rewrite_memory(tx, &current, &path, &content, &principal.actor())
        })
        .await?;
    Ok(Json(in_view(memory, view)))
}

pub async fn delete(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((store_id, memory_id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> HttpResult<Json<DeletedMemory>> {
    let q = QueryParams::parse(raw.as_deref());
    let expected = q.string("expected_content_sha256");
    if let Some(sha) = &expected {
        validate::sha256_hex("expected_content_sha256", sha).map_err(invalid)?;
    }
    let deleted = state
        .db()
        .transaction(move |tx| {
            authorize_store(tx, &principal, &store_id, true)?;
            // Archived stores are read-only, but their memories can still be deleted.
            load_store(tx, &store_id)?;
            let current = load_memory(tx, &store_id, &memory_id)?;
            if let Some(expected) = expected
                && expected != current.content_sha256
            {
                return Err(HttpError::conflict(
                    "memory_precondition_failed_error",
                    format!(
                        "memory {memory_id} no longer has content_sha256 {expected}; nothing was deleted"
                    ),
                ));
            }
            remove_memory(tx, &current, &principal.actor())?;
            Ok(DeletedMemory {
                id: memory_id,
                object_type: "memory_deleted".into(),
            })
        })
        .await?;
    Ok(Json(deleted))
}

/// Where the next page starts, in path order.
#[derive(Debug, Serialize, Deserialize)]
enum MemoryCursor {
    /// Strictly after this memory path.
    After(String),
    /// At or after this path (the first path past a rolled-up folder).
    From(String),
}

/// The least string greater than every path that starts with `prefix`
/// (which ends in `/`): the same string with its last `/` turned into `0`.
fn prefix_upper_bound(prefix: &str) -> String {
    debug_assert!(prefix.ends_with('/'));
    format!("{}0", &prefix[..prefix.len() - 1])
}

pub async fn list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(store_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> HttpResult<Json<Page<MemoryListItem>>> {
    let q = QueryParams::parse(raw.as_deref());
    let view = q.view(View::Basic)?;
    let mut limit = q.limit()?;
    if view == View::Full {
        limit = limit.min(FULL_VIEW_PAGE_CAP);
    }
    let rollup = match q.integer("depth", i64::MIN, i64::MAX) {
        Ok(None | Some(0)) => false,
        Ok(Some(1)) => true,
        _ => {
            return Err(HttpError::invalid_request(
                "depth: must be 0 (every memory below the prefix) or 1 (direct children)",
            ));
        }
    };
    let prefix = q.string("path_prefix").unwrap_or_else(|| "/".into());
    validate::path_prefix(&prefix).map_err(invalid)?;
    let cursor: Option<MemoryCursor> = cursor::decode(q.get("page"))?;

    let page = state
        .db()
        .transaction(move |tx| {
            authorize_store(tx, &principal, &store_id, false)?;
            load_store(tx, &store_id)?;
            list_page(tx, &store_id, &prefix, rollup, view, limit, cursor)
        })
        .await?;
    Ok(Json(page))
}

fn list_page(
    tx: &Transaction<'_>,
    store_id: &str,
    prefix: &str,
    rollup: bool,
    view: View,
    limit: usize,
    cursor: Option<MemoryCursor>,
) -> HttpResult<Page<MemoryListItem>> {
    let upper = prefix_upper_bound(prefix);
    let (lower_op, lower) = match cursor {
        None => (">=", prefix.to_string()),
        Some(MemoryCursor::After(p)) => (">", p),
        Some(MemoryCursor::From(p)) => (">=", p),
    };
    let with_content = view == View::Full;
    let columns = if with_content {
        format!("{MEMORY_COLUMNS}, content")
    } else {
        MEMORY_COLUMNS.to_string()
    };
    let mut stmt = tx.prepare_cached(&format!(
        "SELECT {columns} FROM memories
         WHERE store_id = ?1 AND path {lower_op} ?2 AND path < ?3
         ORDER BY path"
    ))?;
    let mut rows = stmt.query(params![store_id, lower, upper])?;
    let mut items: Vec<MemoryListItem> = Vec::with_capacity(limit + 1);
    while let Some(row) = rows.next()? {
        let path: String = row.get(2)?;
        if rollup {
            let rest = &path[prefix.len()..];
            if let Some(slash) = rest.find('/') {
                let folder = format!("{prefix}{}", &rest[..=slash]);
                // Paths below one folder are contiguous in path order, so a
                // folder is rolled up exactly once.
                if matches!(items.last(), Some(MemoryListItem::Prefix(p)) if p.path == folder) {
                    continue;
                }
                items.push(MemoryListItem::Prefix(MemoryPrefix {
                    object_type: "memory_prefix".into(),
                    path: folder,
                }));
                if items.len() > limit {
                    break;
                }
                continue;
            }
        }
        items.push(MemoryListItem::Memory(memory_from_row(row, with_content)?));
        if items.len() > limit {
            break;
        }
    }
    Ok(cursor::page(
        items,
        limit,
        |last| match last {
            MemoryListItem::Prefix(p) => MemoryCursor::From(prefix_upper_bound(&p.path)),
            MemoryListItem::Memory(m) => MemoryCursor::After(m.path.clone()),
            MemoryListItem::Other(_) => {
                unreachable!("the devserver lists memories and prefixes only")
            }
        },
        |item| item,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upper_bound_of_a_prefix_covers_exactly_its_paths() {
        let upper = prefix_upper_bound("/a/b/");
        assert_eq!(upper, "/a/b0");
        for inside in ["/a/b/c", "/a/b/\u{10FFFF}", "/a/b/~~~~"] {
            assert!(inside > "/a/b/" && inside < upper.as_str(), "{inside}");
        }
        for outside in ["/a/b0", "/a/b0x", "/a/c"] {
            assert!(outside >= upper.as_str(), "{outside}");
        }
        assert_eq!(prefix_upper_bound("/"), "0");
    }
}
