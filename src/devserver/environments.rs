//! `/v1/environments` and `POST /dev/environments`.

use crate::devserver::db::Cached;
use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Extension, Path, RawQuery, State};
use rusqlite::{OptionalExtension, Row, Transaction, params};
use serde::{Deserialize, Serialize};

use crate::api::types::{Environment, EnvironmentConfig, Page};

use super::auth::{self, Principal};
use super::error::{HttpError, HttpResult};
use super::http::{JsonBody, OptionalJsonBody, QueryParams};
use super::{cursor, ids, state::AppState, validate};

const COLUMNS: &str =
    "id, name, description, metadata, config_type, scope, created_at, updated_at, archived_at";

fn from_row(row: &Row<'_>, at: usize) -> rusqlite::Result<Environment> {
    Ok(Environment {
        id: row.get(at)?,
        object_type: "environment".into(),
        name: row.get(at + 1)?,
        description: row.get(at + 2)?,
        metadata: serde_json::from_str(&row.get::<_, String>(at + 3)?).unwrap_or_default(),
        config: EnvironmentConfig {
            kind: row.get(at + 4)?,
        },
        scope: row.get(at + 5)?,
        created_at: ids::from_micros(row.get(at + 6)?),
        updated_at: ids::from_micros(row.get(at + 7)?),
        archived_at: row.get::<_, Option<i64>>(at + 8)?.map(ids::from_micros),
    })
}

/// The environment, or 404.
pub fn load(tx: &Transaction<'_>, id: &str) -> HttpResult<Environment> {
    tx.query_row_cached(
        &format!("SELECT {COLUMNS} FROM environments WHERE id = ?1"),
        [id],
        |r| from_row(r, 0),
    )
    .optional()?
    .ok_or_else(|| HttpError::not_found(format!("environment {id} not found")))
}

/// Insert a self-hosted environment; returns it.
pub fn insert_self_hosted(tx: &Transaction<'_>, name: &str) -> HttpResult<Environment> {
    insert(tx, name, "", &BTreeMap::new(), "self_hosted", None)
}

fn insert(
    tx: &Transaction<'_>,
    name: &str,
    description: &str,
    metadata: &BTreeMap<String, String>,
    config_type: &str,
    scope: Option<&str>,
) -> HttpResult<Environment> {
    let id = ids::new_id("env");
    let now = ids::now_micros();
    tx.execute_cached(
        "INSERT INTO environments (id, name, description, metadata, config_type, scope, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)",
        params![
            id,
            name,
            description,
            serde_json::to_string(metadata).unwrap_or_else(|_| "{}".into()),
            config_type,
            scope,
            now
        ],
    )?;
    load(tx, &id)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateEnvironment {
    name: String,
    config: ConfigParam,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    scope: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ConfigParam {
    #[serde(rename = "type")]
    kind: String,
}

fn check_name(name: &str) -> HttpResult<()> {
    let n = name.chars().count();
    if n == 0 || n > 256 {
        return Err(HttpError::invalid_request(
            "name: must be 1 to 256 characters long",
        ));
    }
    Ok(())
}

pub async fn create(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    JsonBody(body): JsonBody<CreateEnvironment>,
) -> HttpResult<Json<Environment>> {
    principal.require_org("create environments")?;
    check_name(&body.name)?;
    if !matches!(body.config.kind.as_str(), "self_hosted" | "cloud") {
        return Err(HttpError::invalid_request(
            "config.type: must be self_hosted or cloud",
        ));
    }
    if let Some(scope) = &body.scope
        && !matches!(scope.as_str(), "organization" | "account")
    {
        return Err(HttpError::invalid_request(
            "scope: must be organization or account",
        ));
    }
    let description = body.description.unwrap_or_default();
    validate::description(&description).map_err(HttpError::invalid_request)?;
    let metadata = body.metadata.unwrap_or_default();
    validate::metadata(&metadata).map_err(HttpError::invalid_request)?;
    let env = state
        .db()
        .transaction(move |tx| {
            insert(
                tx,
                &body.name,
                &description,
                &metadata,
                &body.config.kind,
                body.scope.as_deref(),
            )
        })
        .await?;
    Ok(Json(env))
}

pub async fn list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RawQuery(raw): RawQuery,
) -> HttpResult<Json<Page<Environment>>> {
    principal.require_org("list environments")?;
    let q = QueryParams::parse(raw.as_deref());
    let limit = q.limit_up_to(1000)?;
    let include_archived = q.boolean("include_archived")?.unwrap_or(false);
    let cursor: Option<cursor::Before> = cursor::decode(q.get("page"))?;
    let page = state
        .db()
        .transaction(move |tx| {
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT seq, {COLUMNS} FROM environments
                 WHERE (?1 OR archived_at IS NULL) AND seq < ?2 ORDER BY seq DESC LIMIT ?3"
            ))?;
            let rows = stmt.query_map(
                params![
                    include_archived,
                    cursor.map_or(i64::MAX, |c| c.before),
                    cursor::fetch_limit(limit)
                ],
                |r| Ok((r.get::<_, i64>(0)?, from_row(r, 1)?)),
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
    Path(id): Path<String>,
) -> HttpResult<Json<Environment>> {
    principal.require_member(&id)?;
    let env = state.db().transaction(move |tx| load(tx, &id)).await?;
    Ok(Json(env))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateEnvironment {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, Option<String>>>,
}

pub async fn update(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<UpdateEnvironment>,
) -> HttpResult<Json<Environment>> {
    principal.require_org("update environments")?;
    if let Some(name) = &body.name {
        check_name(name)?;
    }
    if let Some(d) = &body.description {
        validate::description(d).map_err(HttpError::invalid_request)?;
    }
    let env = state
        .db()
        .transaction(move |tx| {
            let mut env = load(tx, &id)?;
            if env.archived_at.is_some() {
                return Err(HttpError::invalid_request(format!(
                    "environment {id} is archived and cannot be updated"
                )));
            }
            if let Some(name) = body.name {
                env.name = name;
            }
            if let Some(d) = body.description {
                env.description = d;
            }
            for (k, v) in body.metadata.unwrap_or_default() {
                match v {
                    Some(v) => env.metadata.insert(k, v),
                    None => env.metadata.remove(&k),
                };
            }
            validate::metadata(&env.metadata).map_err(HttpError::invalid_request)?;
            tx.execute_cached(
                "UPDATE environments SET name = ?2, description = ?3, metadata = ?4, updated_at = ?5 WHERE id = ?1",
                params![
                    id,
                    env.name,
                    env.description,
                    serde_json::to_string(&env.metadata).unwrap_or_default(),
                    ids::now_micros()
                ],
            )?;
            load(tx, &id)
        })
        .await?;
    Ok(Json(env))
}

pub async fn archive(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> HttpResult<Json<Environment>> {
    principal.require_org("archive environments")?;
    let env = state
        .db()
        .transaction(move |tx| {
            let env = load(tx, &id)?;
            if env.archived_at.is_none() {
                tx.execute_cached(
                    "UPDATE environments SET archived_at = ?2, updated_at = ?2 WHERE id = ?1",
                    params![id, ids::now_micros()],
                )?;
            }
            load(tx, &id)
        })
        .await?;
    Ok(Json(env))
}

#[derive(Debug, Serialize)]
pub struct DeletedEnvironment {
    id: String,
    #[serde(rename = "type")]
    object_type: &'static str,
}

pub async fn delete(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> HttpResult<Json<DeletedEnvironment>> {
    principal.require_org("delete environments")?;
    let deleted = state
        .db()
        .transaction(move |tx| {
            load(tx, &id)?;
            let sessions: i64 = tx.query_row_cached(
                "SELECT COUNT(*) FROM sessions WHERE environment_id = ?1",
                [&id],
                |r| r.get(0),
            )?;
            if sessions > 0 {
                return Err(HttpError::invalid_request(format!(
                    "environment {id} is referenced by {sessions} session(s) and cannot be deleted; archive it instead"
                )));
            }
            tx.execute_cached("DELETE FROM environments WHERE id = ?1", [&id])?;
            tx.execute_cached("DELETE FROM credentials WHERE environment_id = ?1", [&id])?;
            tx.execute_cached("DELETE FROM work_items WHERE environment_id = ?1", [&id])?;
            Ok(DeletedEnvironment {
                id,
                object_type: "environment_deleted",
            })
        })
        .await?;
    Ok(Json(deleted))
}

/// Body of `POST /dev/environments`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevEnvironmentRequest {
    #[serde(default)]
    name: Option<String>,
}

/// Answer of `POST /dev/environments`.
#[derive(Debug, Serialize, Deserialize)]
pub struct DevEnvironment {
    pub(crate) environment_id: String,
    pub(crate) environment_key: String,
}

/// `POST /dev/environments`: a self-hosted environment and a key for it.
pub async fn dev_create(
    State(state): State<AppState>,
    OptionalJsonBody(body): OptionalJsonBody<DevEnvironmentRequest>,
) -> HttpResult<Json<DevEnvironment>> {
    let name = body
        .and_then(|b| b.name)
        .unwrap_or_else(|| "devserver environment".into());
    check_name(&name)?;
    let created = state
        .db()
        .transaction(move |tx| {
            let env = insert_self_hosted(tx, &name)?;
            let key = auth::issue_environment_key(tx, &env.id)?;
            Ok(DevEnvironment {
                environment_id: env.id,
                environment_key: key,
            })
        })
        .await?;
    Ok(Json(created))
}
