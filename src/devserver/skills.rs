//! Skills: the read endpoints a worker uses to download the agent's skills,
//! and `POST /dev/skills` to upload one.
//!
//! Versions are numbered as with the `skills-2025-10-02` beta: the Unix
//! timestamp of the upload in microseconds (`"1759178010641129"`), bumped
//! when needed so that each skill's versions strictly increase. `latest`
//! resolves to the largest. Any valid credential may read skills (the admin
//! key, an environment key, a sessions token): the worker downloads them with
//! whatever credential it holds.
//!
//! `POST /dev/skills` builds the archive from a map of files (zip, or tar
//! plain, gzip or bzip2, wrapped in a `<name>/` directory as real bundles
//! are), or stores caller-supplied bytes verbatim so tests can serve hostile
//! archives. For the same reason the skill's name is not validated.

use crate::devserver::db::Cached;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Cursor, Write};

use axum::Json;
use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use rusqlite::{OptionalExtension, Transaction, params};
use serde::{Deserialize, Serialize};

use crate::api::types::{Page, SkillVersion};

use super::error::{HttpError, HttpResult};
use super::http::{JsonBody, QueryParams};
use super::{cursor, ids, state::AppState, validate};

/// The alias every version endpoint but the content one resolves.
const LATEST: &str = "latest";
/// Longest skill name accepted, in bytes.
const MAX_NAME_BYTES: usize = 1024;

/// Routes under `/v1/skills`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/skills/{skill_id}/versions", get(list))
        .route("/v1/skills/{skill_id}/versions/{version}", get(retrieve))
        .route(
            "/v1/skills/{skill_id}/versions/{version}/content",
            get(content),
        )
}

/// One stored version, without its archive.
struct Row {
    skill_id: String,
    version: i64,
    name: String,
    description: String,
    created_at: i64,
}

impl Row {
    fn into_api(self) -> SkillVersion {
        SkillVersion {
            object_type: "skill_version".into(),
            id: self.version.to_string(),
            skill_id: self.skill_id,
            name: self.name,
            description: self.description,
            created_at: ids::from_micros(self.created_at),
        }
    }
}

const ROW_COLUMNS: &str = "skill_id, version, name, description, created_at";

fn row_at(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        skill_id: r.get(0)?,
        version: r.get(1)?,
        name: r.get(2)?,
        description: r.get(3)?,
        created_at: r.get(4)?,
    })
}

fn skill_not_found(skill_id: &str) -> HttpError {
    HttpError::not_found(format!("skill {skill_id} not found"))
}

/// The version `version` names: `latest` (any version endpoint but content,
/// when `alias` is set) or the canonical decimal form of a version id.
fn find_version(
    tx: &Transaction<'_>,
    skill_id: &str,
    version: &str,
    alias: bool,
) -> HttpResult<i64> {
    let found = if alias && version == LATEST {
        tx.query_row_cached(
            "SELECT MAX(version) FROM skills WHERE skill_id = ?1",
            [skill_id],
            |r| r.get::<_, Option<i64>>(0),
        )?
    } else {
        match version.parse::<i64>() {
            Ok(v) if v.to_string() == version => tx
                .query_row_cached(
                    "SELECT version FROM skills WHERE skill_id = ?1 AND version = ?2",
                    params![skill_id, v],
                    |r| r.get(0),
                )
                .optional()?,
            _ => None,
        }
    };
    found.ok_or_else(|| {
        HttpError::not_found(format!("version {version} of skill {skill_id} not found"))
    })
}

/// `GET /v1/skills/{skill_id}/versions/{version}`; `version` may be `latest`.
pub async fn retrieve(
    State(state): State<AppState>,
    Path((skill_id, version)): Path<(String, String)>,
) -> HttpResult<Json<SkillVersion>> {
    let row = state
        .db()
        .transaction(move |tx| {
            let v = find_version(tx, &skill_id, &version, true)?;
            Ok(tx.query_row_cached(
                &format!("SELECT {ROW_COLUMNS} FROM skills WHERE skill_id = ?1 AND version = ?2"),
                params![skill_id, v],
                row_at,
            )?)
        })
        .await?;
    Ok(Json(row.into_api()))
}

/// `GET /v1/skills/{skill_id}/versions/{version}/content`: the archive as
/// stored. The version must be a concrete id, as on the API.
pub async fn content(
    State(state): State<AppState>,
    Path((skill_id, version)): Path<(String, String)>,
) -> HttpResult<Response> {
    let archive: Vec<u8> = state
        .db()
        .transaction(move |tx| {
            let v = find_version(tx, &skill_id, &version, false)?;
            Ok(tx.query_row_cached(
                "SELECT archive FROM skills WHERE skill_id = ?1 AND version = ?2",
                params![skill_id, v],
                |r| r.get(0),
            )?)
        })
        .await?;
    let content_type = if is_zip(&archive) {
        "application/zip"
    } else {
        "application/octet-stream"
    };
    let mut response = archive.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(response)
}

fn is_zip(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06")
}

/// `GET /v1/skills/{skill_id}/versions`: newest first, `limit` 1–1000
/// (default 20), `page`.
pub async fn list(
    State(state): State<AppState>,
    Path(skill_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> HttpResult<Json<Page<SkillVersion>>> {
    let q = QueryParams::parse(raw.as_deref());
    let limit = q.limit_up_to(1000)?;
    let cursor: Option<cursor::Before> = cursor::decode(q.get("page"))?;
    let page = state
        .db()
        .transaction(move |tx| {
            let known: bool = tx.query_row_cached(
                "SELECT EXISTS (SELECT 1 FROM skills WHERE skill_id = ?1)",
                [&skill_id],
                |r| r.get(0),
            )?;
            if !known {
                return Err(skill_not_found(&skill_id));
            }
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT {ROW_COLUMNS} FROM skills WHERE skill_id = ?1 AND version < ?2
                 ORDER BY version DESC LIMIT ?3"
            ))?;
            let rows = stmt.query_map(
                params![
                    skill_id,
                    cursor.map_or(i64::MAX, |c| c.before),
                    cursor::fetch_limit(limit)
                ],
                row_at,
            )?;
            let rows = rows.collect::<Result<Vec<_>, _>>()?;
            Ok(cursor::page(
                rows,
                limit,
                |r| cursor::Before { before: r.version },
                Row::into_api,
            ))
        })
        .await?;
    Ok(Json(page))
}

/// How `POST /dev/skills` packs the files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum ArchiveFormat {
    #[default]
    #[serde(rename = "zip")]
    Zip,
    #[serde(rename = "tar")]
    Tar,
    #[serde(rename = "tar.gz")]
    TarGz,
    #[serde(rename = "tar.bz2")]
    TarBz2,
}

/// One file of `POST /dev/skills`: its text, or its text and whether it is
/// executable.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum DevSkillFile {
    Text(String),
    Spec {
        content: String,
        #[serde(default)]
        executable: bool,
    },
}

impl DevSkillFile {
    fn content(&self) -> &[u8] {
        match self {
            DevSkillFile::Text(t) | DevSkillFile::Spec { content: t, .. } => t.as_bytes(),
        }
    }

    fn mode(&self) -> u32 {
        match self {
            DevSkillFile::Spec {
                executable: true, ..
            } => 0o755,
            _ => 0o644,
        }
    }
}

/// Body of `POST /dev/skills`: `files` (packed as `format`, under `<name>/`
/// unless `wrap` is false) or `archive_base64` (stored verbatim).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevSkillRequest {
    /// Required for a new skill; for a new version of `skill_id`, optional
    /// and, if given, the skill's name (a name never changes).
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    /// Add a version to this existing skill instead of creating one.
    #[serde(default)]
    skill_id: Option<String>,
    #[serde(default)]
    files: Option<BTreeMap<String, DevSkillFile>>,
    #[serde(default)]
    format: Option<ArchiveFormat>,
    #[serde(default)]
    wrap: Option<bool>,
    #[serde(default)]
    archive_base64: Option<String>,
}

/// Answer of `POST /dev/skills`: the skill version, plus `version` (= `id`).
#[derive(Debug, Serialize)]
pub struct DevSkill {
    #[serde(flatten)]
    pub(crate) skill: SkillVersion,
    pub(crate) version: String,
}

/// `POST /dev/skills` (admin key).
pub async fn dev_create(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<DevSkillRequest>,
) -> HttpResult<Json<DevSkill>> {
    fn invalid(message: impl Into<String>) -> HttpError {
        HttpError::invalid_request(message)
    }
    if let Some(name) = &body.name
        && name.len() > MAX_NAME_BYTES
    {
        return Err(invalid(format!(
            "name: is {} bytes long; the limit is {MAX_NAME_BYTES}",
            name.len()
        )));
    }
    let description = body.description.clone().unwrap_or_default();
    validate::description(&description).map_err(invalid)?;
    if body.skill_id.is_none() && body.name.is_none() {
        return Err(invalid("name: is required for a new skill"));
    }
    let source = match (&body.files, &body.archive_base64) {
        (Some(files), None) => {
            if files.is_empty() {
                return Err(invalid("files: must name at least one file"));
            }
            for path in files.keys() {
                check_file_path(path).map_err(invalid)?;
            }
            Source::Files
        }
        (None, Some(encoded)) => {
            if body.format.is_some() || body.wrap.is_some() {
                return Err(invalid(
                    "format and wrap apply to files, not to archive_base64",
                ));
            }
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .map_err(|e| invalid(format!("archive_base64: not valid base64: {e}")))?;
            Source::Raw(bytes)
        }
        _ => return Err(invalid("give exactly one of files and archive_base64")),
    };
    let created = state
        .db()
        .transaction(move |tx| insert(tx, body, description, source))
        .await?;
    Ok(Json(created))
}

enum Source {
    Files,
    Raw(Vec<u8>),
}

fn insert(
    tx: &Transaction<'_>,
    body: DevSkillRequest,
    description: String,
    source: Source,
) -> HttpResult<DevSkill> {
    let now = ids::now_micros();
    let (skill_id, name, version) = match &body.skill_id {
        Some(skill_id) => {
            let latest: Option<(i64, String)> = tx
                .query_row_cached(
                    "SELECT version, name FROM skills WHERE skill_id = ?1
                     ORDER BY version DESC LIMIT 1",
                    [skill_id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let Some((last, name)) = latest else {
                return Err(skill_not_found(skill_id));
            };
            if body.name.as_ref().is_some_and(|n| *n != name) {
                return Err(HttpError::invalid_request(format!(
                    "name: skill {skill_id} is named {name:?}; a skill's name cannot change"
                )));
            }
            (skill_id.clone(), name, now.max(last + 1))
        }
        None => (
            ids::new_id("skill"),
            body.name.clone().unwrap_or_default(),
            now,
        ),
    };
    let archive = match source {
        Source::Raw(bytes) => bytes,
        Source::Files => {
            let files = body
                .files
                .as_ref()
                .map(|f| f.iter().collect())
                .unwrap_or_default();
            let wrapper = if body.wrap.unwrap_or(true) {
                if !is_one_component(&name) {
                    return Err(HttpError::invalid_request(format!(
                        "wrap: the name {name:?} is not one path component; pass \"wrap\": false"
                    )));
                }
                Some(name.as_str())
            } else {
                None
            };
            build_archive(&files, wrapper, body.format.unwrap_or_default())
                .map_err(|e| HttpError::internal(format!("cannot build the archive: {e}")))?
        }
    };
    tx.execute_cached(
        "INSERT INTO skills (skill_id, version, name, description, archive, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![skill_id, version, name, description, archive, now],
    )?;
    let skill = Row {
        skill_id,
        version,
        name,
        description,
        created_at: now,
    }
    .into_api();
    Ok(DevSkill {
        version: skill.id.clone(),
        skill,
    })
}

fn is_one_component(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// A path of the `files` map: relative, `/`-separated, no empty, `.` or `..`
/// component (hostile names go through `archive_base64`).
fn check_file_path(path: &str) -> Result<(), String> {
    if path.split('/').all(is_one_component) {
        Ok(())
    } else {
        Err(format!(
            "files: {path:?} must be a relative path of names, without '.' or '..'"
        ))
    }
}

/// Pack `files` (under `wrapper/` when given), directories first.
fn build_archive(
    files: &BTreeMap<&String, &DevSkillFile>,
    wrapper: Option<&str>,
    format: ArchiveFormat,
) -> std::io::Result<Vec<u8>> {
    let full = |path: &str| match wrapper {
        Some(w) => format!("{w}/{path}"),
        None => path.to_string(),
    };
    let mut dirs = BTreeSet::new();
    for path in files.keys() {
        let path = full(path);
        let mut end = 0;
        while let Some(slash) = path[end..].find('/') {
            end += slash;
            dirs.insert(path[..end].to_string());
            end += 1;
        }
    }
    let entries: Vec<(String, &DevSkillFile)> = files.iter().map(|(p, f)| (full(p), *f)).collect();
    match format {
        ArchiveFormat::Zip => build_zip(&dirs, &entries),
        ArchiveFormat::Tar => build_tar(&dirs, &entries),
        ArchiveFormat::TarGz => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(&build_tar(&dirs, &entries)?)?;
            gz.finish()
        }
        ArchiveFormat::TarBz2 => {
            let mut bz = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::default());
            bz.write_all(&build_tar(&dirs, &entries)?)?;
            bz.finish()
        }
    }
}

fn build_zip(
    dirs: &BTreeSet<String>,
    files: &[(String, &DevSkillFile)],
) -> std::io::Result<Vec<u8>> {
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    for dir in dirs {
        zip.add_directory(format!("{dir}/"), options.unix_permissions(0o755))
            .map_err(std::io::Error::other)?;
    }
    for (path, file) in files {
        zip.start_file(path, options.unix_permissions(file.mode()))
            .map_err(std::io::Error::other)?;
        zip.write_all(file.content())?;
    }
    Ok(zip.finish().map_err(std::io::Error::other)?.into_inner())
}

fn build_tar(
    dirs: &BTreeSet<String>,
    files: &[(String, &DevSkillFile)],
) -> std::io::Result<Vec<u8>> {
    let mtime = u64::try_from(ids::now_micros() / 1_000_000).unwrap_or_default();
    let mut tar = tar::Builder::new(Vec::new());
    for dir in dirs {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        h.set_mtime(mtime);
        tar.append_data(&mut h, format!("{dir}/"), std::io::empty())?;
    }
    for (path, file) in files {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(file.mode());
        h.set_size(file.content().len() as u64);
        h.set_mtime(mtime);
        tar.append_data(&mut h, path, file.content())?;
    }
    tar.into_inner()
}
