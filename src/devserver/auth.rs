//! Who is calling, and what they may touch.
//!
//! Three kinds of credential, as on the real API:
//! - the admin key, acting as an organisation API key (`x-api-key`, or
//!   `Authorization: Bearer` as the 2.x SDKs send it): everything;
//! - an environment key (Bearer): its environment's work queue and the
//!   sessions in that environment — never the memory endpoints;
//! - a work item's sessions token (Bearer, minted on each poll claim and
//!   carried in the item's `secret`): that one session, its work item, and
//!   the memory stores attached to it (writes refused on `read_only` ones).
//!
//! Secrets are stored as SHA-256 digests only.

use crate::devserver::db::Cached;
use axum::http::HeaderMap;
use rusqlite::{Connection, OptionalExtension, Transaction, params};

use crate::api::types::Actor;

use super::error::{HttpError, HttpResult};
use super::ids;
use super::state::AppState;

const ENVIRONMENT_KEY: &str = "environment_key";
const SESSIONS_TOKEN: &str = "sessions_token";

/// The authenticated caller of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The devserver's admin key, acting as an organisation API key.
    Admin { api_key_id: String },
    /// An environment key.
    Environment { environment_id: String },
    /// A work item's sessions token.
    Session {
        environment_id: String,
        session_id: String,
        work_id: String,
    },
}

impl Principal {
    /// The actor recorded on memory versions this principal writes.
    pub fn actor(&self) -> Actor {
        match self {
            Principal::Admin { api_key_id } => Actor::api(api_key_id.clone()),
            Principal::Environment { environment_id } => Actor::api(environment_id.clone()),
            Principal::Session { session_id, .. } => Actor::session(session_id.clone()),
        }
    }

    /// Refuse anything but an organisation key, for `what` ("create memory stores").
    pub fn require_org(&self, what: &str) -> HttpResult<()> {
        match self {
            Principal::Admin { .. } => Ok(()),
            _ => Err(HttpError::permission(format!(
                "this credential cannot {what}; it needs an organisation API key"
            ))),
        }
    }

    /// May this principal use the work queue of `environment_id`? A sessions
    /// token may only touch its own work item (`work_id`).
    pub fn require_environment(
        &self,
        environment_id: &str,
        work_id: Option<&str>,
    ) -> HttpResult<()> {
        let allowed = match self {
            Principal::Admin { .. } => true,
            Principal::Environment {
                environment_id: own,
            } => own == environment_id,
            Principal::Session {
                environment_id: own,
                work_id: own_work,
                ..
            } => own == environment_id && work_id == Some(own_work.as_str()),
        };
        if allowed {
            Ok(())
        } else {
            Err(HttpError::permission(
                "this credential is not scoped to this environment or work item",
            ))
        }
    }

    /// May this principal see `environment_id` itself (any credential of it)?
    pub fn require_member(&self, environment_id: &str) -> HttpResult<()> {
        match self {
            Principal::Admin { .. } => Ok(()),
            Principal::Environment {
                environment_id: own,
            }
            | Principal::Session {
                environment_id: own,
                ..
            } if own == environment_id => Ok(()),
            _ => Err(HttpError::permission(
                "this credential is not scoped to this environment",
            )),
        }
    }

    /// May this principal read and post to `session_id` (in `environment_id`)?
    pub fn require_session(&self, session_id: &str, environment_id: &str) -> HttpResult<()> {
        let allowed = match self {
            Principal::Admin { .. } => true,
            Principal::Environment {
                environment_id: own,
            } => own == environment_id,
            Principal::Session {
                session_id: own, ..
            } => own == session_id,
        };
        if allowed {
            Ok(())
        } else {
            Err(HttpError::permission(
                "this credential is not scoped to this session",
            ))
        }
    }
}

/// Identify the caller from the request headers.
pub async fn authenticate(state: &AppState, headers: &HeaderMap) -> HttpResult<Principal> {
    let admin = || Principal::Admin {
        api_key_id: state.admin_key_id().to_string(),
    };
    if let Some(key) = headers.get("x-api-key") {
        let key = key.to_str().unwrap_or_default();
        return if state.is_admin_key(key) {
            Ok(admin())
        } else {
            Err(HttpError::authentication("invalid x-api-key"))
        };
    }
    let Some(auth) = headers.get(axum::http::header::AUTHORIZATION) else {
        return Err(HttpError::authentication(
            "x-api-key header is required (or Authorization: Bearer for worker credentials)",
        ));
    };
    let Some(token) = auth.to_str().unwrap_or_default().strip_prefix("Bearer ") else {
        return Err(HttpError::authentication(
            "the Authorization header must be 'Bearer <token>'",
        ));
    };
    if state.is_admin_key(token) {
        return Ok(admin());
    }
    let digest = ids::sha256_hex(token.as_bytes());
    state
        .db()
        .read(move |conn| lookup(conn, &digest))
        .await?
        .ok_or_else(|| HttpError::authentication("invalid bearer token"))
}

/// The live credential whose token hashes to `digest`. A single statement,
/// so no transaction ([`super::db::Db::read`]): this runs on every worker
/// request.
fn lookup(conn: &Connection, digest: &str) -> HttpResult<Option<Principal>> {
    // A sessions token dies with its work item.
    let row = conn
        .query_row_cached(
            "SELECT c.kind, c.environment_id, c.session_id, c.work_id
             FROM credentials c LEFT JOIN work_items w ON w.id = c.work_id
             WHERE c.token_sha256 = ?1 AND c.revoked_at IS NULL
               AND (c.kind != 'sessions_token' OR (w.state IS NOT NULL AND w.state != 'stopped'))",
            [digest],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<String>>(2)?,
                    r.get::<_, Option<String>>(3)?,
                ))
            },
        )
        .optional()?;
    Ok(match row {
        Some((kind, environment_id, _, _)) if kind == ENVIRONMENT_KEY => {
            Some(Principal::Environment { environment_id })
        }
        Some((_, environment_id, Some(session_id), Some(work_id))) => Some(Principal::Session {
            environment_id,
            session_id,
            work_id,
        }),
        _ => None,
    })
}

/// Mint an environment key for `environment_id`; only its digest is kept.
pub fn issue_environment_key(tx: &Transaction<'_>, environment_id: &str) -> HttpResult<String> {
    let key = ids::new_secret("sk-ant-envkey-dev-", 32);
    tx.execute_cached(
        "INSERT INTO credentials (token_sha256, kind, environment_id, created_at)
         VALUES (?1, ?2, ?3, ?4)",
        params![
            ids::sha256_hex(key.as_bytes()),
            ENVIRONMENT_KEY,
            environment_id,
            ids::now_micros()
        ],
    )?;
    Ok(key)
}

/// Mint a sessions token scoped to one session and its work item.
pub fn issue_sessions_token(
    tx: &Transaction<'_>,
    environment_id: &str,
    session_id: &str,
    work_id: &str,
) -> HttpResult<String> {
    let token = ids::new_secret("sk-ant-sesstok-dev-", 32);
    tx.execute_cached(
        "INSERT INTO credentials (token_sha256, kind, environment_id, session_id, work_id, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            ids::sha256_hex(token.as_bytes()),
            SESSIONS_TOKEN,
            environment_id,
            session_id,
            work_id,
            ids::now_micros()
        ],
    )?;
    Ok(token)
}
