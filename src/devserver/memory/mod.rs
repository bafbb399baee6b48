//! The memory stores API (`spec/protocol.md` §2.5) over SQLite.

mod memories;
mod rows;
mod stores;
mod versions;

use axum::Router;
use axum::routing::{get, post};
use rusqlite::Transaction;

use super::AppState;
use super::error::HttpResult;
use super::http::Principal;

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
/// An organisation key may touch every store.
pub(super) fn authorize_store(
    _tx: &Transaction<'_>,
    principal: &Principal,
    _store_id: &str,
    _write: bool,
) -> HttpResult<()> {
    match principal {
        Principal::Admin { .. } => Ok(()),
    }
}
