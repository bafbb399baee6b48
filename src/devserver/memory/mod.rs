//! The memory stores API (`spec/protocol.md` §2.5) over SQLite.

mod memories;
pub(super) mod rows;
mod stores;
mod versions;

use crate::devserver::db::Cached;
use axum::Router;
use axum::routing::{get, post};
use rusqlite::{OptionalExtension, Transaction};

use crate::api::types::{Access, SessionResource};

use super::auth::Principal;
use super::error::{HttpError, HttpResult};
use super::state::AppState;

/// Routes under `/v1/memory_stores`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/memory_stores", post(stores::create).get(stores::list))
        .route(
            "/v1/memory_stores/{store_id}",
            get(stores::retrieve)
                .post(stores::update)
                .delete(stores::delete),
        )
        .route(
            "/v1/memory_stores/{store_id}/archive",
            post(stores::archive),
        )
        .route(
            "/v1/memory_stores/{store_id}/memories",
            post(memories::create).get(memories::list),
        )
        .route(
            "/v1/memory_stores/{store_id}/memories/{memory_id}",
            get(memories::retrieve)
                .post(memories::update)
                .delete(memories::delete),
        )
        .route(
            "/v1/memory_stores/{store_id}/memory_versions",
            get(versions::list),
        )
        .route(
            "/v1/memory_stores/{store_id}/memory_versions/{version_id}",
            get(versions::retrieve),
        )
        .route(
            "/v1/memory_stores/{store_id}/memory_versions/{version_id}/redact",
            post(versions::redact),
        )
}

/// May `principal` read (or, with `write`, change) the memories of `store_id`?
/// An organisation key may touch every store. The memory endpoints refuse
/// environment keys. A sessions token reaches only the stores attached to its
/// session, and writes only where the attachment is `read_write`.
pub(super) fn authorize_store(
    tx: &Transaction<'_>,
    principal: &Principal,
    store_id: &str,
    write: bool,
) -> HttpResult<()> {
    match principal {
        Principal::Admin { .. } => Ok(()),
        Principal::Environment { .. } => Err(HttpError::permission(
            "the memory store endpoints do not accept an environment key; \
             use the sessions token from the work item's secret",
        )),
        Principal::Session { session_id, .. } => {
            let resources: Option<String> = tx
                .query_row_cached(
                    "SELECT resources FROM sessions WHERE id = ?1",
                    [session_id],
                    |r| r.get(0),
                )
                .optional()?;
            let resources: Vec<SessionResource> = resources
                .and_then(|r| serde_json::from_str(&r).ok())
                .unwrap_or_default();
            let attachment = resources.iter().find_map(|r| match r {
                SessionResource::MemoryStore(m) if m.memory_store_id == store_id => Some(m),
                _ => None,
            });
            match attachment {
                None => Err(HttpError::permission(format!(
                    "memory store {store_id} is not attached to session {session_id}"
                ))),
                Some(m) if write && m.access() == Access::ReadOnly => {
                    Err(HttpError::permission(format!(
                        "memory store {store_id} is attached read-only to session {session_id}; \
                         the session cannot write to it"
                    )))
                }
                Some(_) => Ok(()),
            }
        }
    }
}
