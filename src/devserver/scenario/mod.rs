//! Scripted sessions: `POST /dev/scenarios` loads a scenario and starts its
//! session; `GET /dev/scenarios/{session_id}` answers its report.

mod driver;
pub mod format;
pub(crate) mod report;

use crate::devserver::db::Cached;
use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::api::types::{Actor, SessionResource};

use super::error::{HttpError, HttpResult};
use super::http::JsonBody;
use super::live::Effects;
use super::memory::rows;
use super::{auth, environments, sessions, state::AppState};
use report::{Report, ReportStatus, StoreInfo};

/// Answer of `POST /dev/scenarios`.
#[derive(Debug, Serialize, Deserialize)]
pub struct StartedScenario {
    pub(crate) session_id: String,
    pub(crate) environment_id: String,
    pub(crate) environment_key: String,
}

pub async fn start(
    State(state): State<AppState>,
    JsonBody(doc): JsonBody<Value>,
) -> HttpResult<Json<StartedScenario>> {
    let checked = format::parse(doc).map_err(HttpError::invalid_request)?;
    let admin = Actor::api(state.admin_key_id());
    let st = state.clone();
    let scenario = checked.scenario.clone();
    let steps = checked.steps.clone();
    let actor = admin.clone();
    let (started, report, store_ids) = state
        .commit(move |tx, fx| create_run(tx, fx, &st, &scenario, &steps, &actor))
        .await?;
    let mounts = report
        .stores
        .iter()
        .map(|(k, s)| (k.clone(), s.mount_path.clone()))
        .collect();
    tracing::info!(session.id = %started.session_id, scenario = %report.name, "scenario started");
    let run = driver::Run {
        session_id: started.session_id.clone(),
        steps: checked.steps,
        mounts,
        store_ids,
        expect_final: checked.scenario.expect_final,
        report,
        admin,
    };
    tokio::spawn(driver::drive(state.clone(), run));
    Ok(Json(started))
}

/// In one transaction: the environment (the scenario's, or a new one) and a
/// key for it, the stores with their memories, the session, its report, and
/// the user's message that starts the run. Also answers store key → id.
fn create_run(
    tx: &rusqlite::Transaction<'_>,
    fx: &mut Effects,
    st: &AppState,
    scenario: &format::Scenario,
    steps: &[format::Step],
    actor: &Actor,
) -> HttpResult<(StartedScenario, Report, BTreeMap<String, String>)> {
    let env = match &scenario.environment_id {
        Some(id) => environments::load(tx, id)?,
        None => environments::insert_self_hosted(tx, &format!("scenario: {}", scenario.name))?,
    };
    let key = auth::issue_environment_key(tx, &env.id)?;
    let (resources, store_ids) = create_stores(tx, &scenario.memory_stores, actor)?;
    let body = serde_json::from_value(json!({
        "agent": scenario.agent.clone().unwrap_or(json!({"name": format!("scenario: {}", scenario.name)})),
        "environment_id": env.id,
        "resources": resources,
        "title": scenario.name,
        "metadata": {"scenario": scenario.name.chars().take(512).collect::<String>()},
    }))
    .map_err(|e| HttpError::internal(format!("cannot build the session: {e}")))?;
    let mut session = sessions::insert(tx, fx, st, body)?;
    override_mount_paths(tx, &mut session, &scenario.memory_stores)?;

    let report = Report {
        session_id: session.id.clone(),
        environment_id: env.id.clone(),
        name: scenario.name.clone(),
        status: ReportStatus::Running,
        stores: store_infos(&scenario.memory_stores, &session.resources),
        steps: driver::initial_outcomes(steps),
        final_contents: None,
        failures: Vec::new(),
        started_at: driver::started_now(),
        finished_at: None,
    };
    tx.execute_cached(
        "INSERT INTO scenarios (session_id, report) VALUES (?1, ?2)",
        params![
            session.id,
            serde_json::to_string(&report).unwrap_or_default()
        ],
    )?;
    // The user's message starts the run; the scenario answers it.
    sessions::send(
        tx,
        fx,
        st,
        &session,
        vec![
            json!({"type": "user.message", "content": [{"type": "text", "text": format!("Run the scenario {:?}.", scenario.name)}]}),
        ],
    )?;
    Ok((
        StartedScenario {
            session_id: session.id,
            environment_id: env.id,
            environment_key: key,
        },
        report,
        store_ids,
    ))
}

/// The scenario's stores, each with its memories: the session's resources
/// attaching them, and store key → id.
fn create_stores(
    tx: &rusqlite::Transaction<'_>,
    specs: &[format::StoreSpec],
    actor: &Actor,
) -> HttpResult<(Vec<Value>, BTreeMap<String, String>)> {
    let mut store_ids = BTreeMap::new();
    let mut resources = Vec::new();
    for spec in specs {
        let store = rows::insert_store(
            tx,
            &spec.name,
            spec.description.as_deref().unwrap_or_default(),
            &BTreeMap::new(),
        )?;
        for (path, content) in &spec.memories {
            rows::insert_memory(tx, &store.id, path, content, actor)?;
        }
        resources.push(json!({
            "type": "memory_store",
            "memory_store_id": store.id,
            "access": spec.access().as_str(),
            "instructions": spec.instructions,
        }));
        store_ids.insert(spec.key.clone(), store.id);
    }
    Ok((resources, store_ids))
}

/// The report's view of each store attached, by key.
fn store_infos(
    specs: &[format::StoreSpec],
    resources: &[SessionResource],
) -> BTreeMap<String, StoreInfo> {
    let mut stores = BTreeMap::new();
    for (spec, resource) in specs.iter().zip(resources) {
        if let SessionResource::MemoryStore(m) = resource {
            stores.insert(
                spec.key.clone(),
                StoreInfo {
                    memory_store_id: m.memory_store_id.clone(),
                    mount_path: m.mount_path.clone().unwrap_or_default(),
                    access: m.access().as_str().into(),
                },
            );
        }
    }
    stores
}

/// Write a scenario's `mount_path` overrides over the paths the session
/// derived (a path used verbatim, or none at all).
fn override_mount_paths(
    tx: &rusqlite::Transaction<'_>,
    session: &mut crate::api::types::Session,
    specs: &[format::StoreSpec],
) -> HttpResult<()> {
    let mut changed = false;
    for (spec, resource) in specs.iter().zip(session.resources.iter_mut()) {
        if let (Some(path), SessionResource::MemoryStore(m)) = (&spec.mount_path, resource) {
            m.mount_path = path.clone();
            changed = true;
        }
    }
    if changed {
        let resources = serde_json::to_string(&session.resources)
            .map_err(|e| HttpError::internal(format!("cannot store the session: {e}")))?;
        tx.execute_cached(
            "UPDATE sessions SET resources = ?2 WHERE id = ?1",
            params![session.id, resources],
        )?;
    }
    Ok(())
}

pub async fn report(
    State(state): State<AppState>,
    Path(session_id): Path<String>,
) -> HttpResult<Json<Value>> {
    let report = state
        .db()
        .transaction(move |tx| {
            let raw: Option<String> = tx
                .query_row_cached(
                    "SELECT report FROM scenarios WHERE session_id = ?1",
                    [&session_id],
                    |r| r.get(0),
                )
                .optional()?;
            raw.ok_or_else(|| {
                HttpError::not_found(format!("no scenario runs in session {session_id}"))
            })
        })
        .await?;
    Ok(Json(serde_json::from_str(&report).unwrap_or(Value::Null)))
}

/// At start-up: a scenario that was running when the devserver stopped can
/// never finish; say so in its report.
pub fn fail_interrupted(tx: &rusqlite::Transaction<'_>) -> HttpResult<usize> {
    let mut stmt = tx.prepare_cached("SELECT session_id, report FROM scenarios")?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?
        .collect::<Result<Vec<_>, _>>()?;
    let mut failed = 0;
    for (session_id, raw) in rows {
        let Ok(mut report) = serde_json::from_str::<Report>(&raw) else {
            continue;
        };
        if report.status == ReportStatus::Running {
            report.status = ReportStatus::Failed;
            report
                .failures
                .push("the devserver restarted before the scenario finished".into());
            tx.execute_cached(
                "UPDATE scenarios SET report = ?2 WHERE session_id = ?1",
                params![
                    session_id,
                    serde_json::to_string(&report).unwrap_or_default()
                ],
            )?;
            failed += 1;
        }
    }
    Ok(failed)
}
