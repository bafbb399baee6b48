//! Reading and writing memory-store rows. Every function takes the open
//! transaction, so a handler's checks and writes are one atomic unit.

use crate::devserver::db::Cached;
use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, Row, Transaction, params};

use crate::api::types::{Actor, Memory, MemoryOperation, MemoryStore, MemoryVersion};

use super::super::error::{HttpError, HttpResult};
use super::super::{ids, validate};

pub const STORE_COLUMNS: &str =
    "id, name, description, metadata, created_at, updated_at, archived_at";

pub fn store_from_row(row: &Row<'_>) -> rusqlite::Result<MemoryStore> {
    store_at(row, 0)
}

/// A store whose [`STORE_COLUMNS`] start at column `at`.
pub fn store_at(row: &Row<'_>, at: usize) -> rusqlite::Result<MemoryStore> {
    let metadata: String = row.get(at + 3)?;
    Ok(MemoryStore {
        id: row.get(at)?,
        object_type: "memory_store".into(),
        name: row.get(at + 1)?,
        description: row.get(at + 2)?,
        metadata: serde_json::from_str(&metadata).unwrap_or_default(),
        created_at: ids::from_micros(row.get(at + 4)?),
        updated_at: ids::from_micros(row.get(at + 5)?),
        archived_at: row.get::<_, Option<i64>>(at + 6)?.map(ids::from_micros),
    })
}

/// The store, or 404.
pub fn load_store(tx: &Transaction<'_>, store_id: &str) -> HttpResult<MemoryStore> {
    tx.query_row_cached(
        &format!("SELECT {STORE_COLUMNS} FROM memory_stores WHERE id = ?1"),
        [store_id],
        store_from_row,
    )
    .optional()?
    .ok_or_else(|| HttpError::not_found(format!("memory store {store_id} not found")))
}

/// The store, or 404; 400 when it is archived (archived stores are read-only).
pub fn load_writable_store(tx: &Transaction<'_>, store_id: &str) -> HttpResult<MemoryStore> {
    let store = load_store(tx, store_id)?;
    if store.archived_at.is_some() {
        return Err(HttpError::invalid_request(format!(
            "memory store {store_id} is archived; its memories can no longer be created or updated"
        )));
    }
    Ok(store)
}

pub fn metadata_json(metadata: &BTreeMap<String, String>) -> String {
    serde_json::to_string(metadata).unwrap_or_else(|_| "{}".into())
}

/// Columns of a memory without its content; `content` is appended for the full view.
pub const MEMORY_COLUMNS: &str =
    "id, store_id, path, content_sha256, size_bytes, version_id, created_at, updated_at";

pub fn memory_from_row(row: &Row<'_>, with_content: bool) -> rusqlite::Result<Memory> {
    Ok(Memory {
        id: row.get(0)?,
        object_type: "memory".into(),
        memory_store_id: row.get(1)?,
        path: row.get(2)?,
        content_sha256: row.get(3)?,
        content_size_bytes: row.get::<_, i64>(4)? as u64,
        memory_version_id: row.get(5)?,
        created_at: ids::from_micros(row.get(6)?),
        updated_at: ids::from_micros(row.get(7)?),
        content: if with_content {
            Some(row.get(8)?)
        } else {
            None
        },
    })
}

/// A memory of this store with its content, or 404.
pub fn load_memory(tx: &Transaction<'_>, store_id: &str, memory_id: &str) -> HttpResult<Memory> {
    tx.query_row_cached(
        &format!("SELECT {MEMORY_COLUMNS}, content FROM memories WHERE id = ?1 AND store_id = ?2"),
        [memory_id, store_id],
        |r| memory_from_row(r, true),
    )
    .optional()?
    .ok_or_else(|| {
        HttpError::not_found(format!(
            "memory {memory_id} not found in memory store {store_id}"
        ))
    })
}

/// A memory already at `path`, or at a path that would be a folder of it or
/// inside it: `/a` blocks `/a/b`, and `/a/b` blocks `/a`. Returns
/// `(conflicting_path, conflicting_memory_id)`. `except` is the memory being
/// renamed, which never conflicts with itself.
pub fn path_conflict(
    tx: &Transaction<'_>,
    store_id: &str,
    path: &str,
    except: Option<&str>,
) -> HttpResult<Option<(String, String)>> {
    let except = except.unwrap_or("");
    let exact = |p: &str| -> HttpResult<Option<(String, String)>> {
        Ok(tx
            .query_row_cached(
                "SELECT path, id FROM memories WHERE store_id = ?1 AND path = ?2 AND id != ?3",
                params![store_id, p, except],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
    };
    if let Some(hit) = exact(path)? {
        return Ok(Some(hit));
    }
    // An ancestor: every proper prefix ending just before a '/'.
    for (i, _) in path.match_indices('/').skip(1) {
        if let Some(hit) = exact(&path[..i])? {
            return Ok(Some(hit));
        }
    }
    // A descendant: anything in [path + "/", path + "0").
    let lower = format!("{path}/");
    let upper = format!("{path}0");
    Ok(tx
        .query_row_cached(
            "SELECT path, id FROM memories
             WHERE store_id = ?1 AND path >= ?2 AND path < ?3 AND id != ?4
             ORDER BY path LIMIT 1",
            params![store_id, lower, upper, except],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?)
}

/// 409 `memory_path_conflict_error` naming the memory in the way.
pub fn conflict_error(
    path: &str,
    (conflicting_path, conflicting_id): (String, String),
) -> HttpError {
    let message = if conflicting_path == path {
        format!("a memory already exists at {path}")
    } else {
        format!(
            "{path} conflicts with the memory at {conflicting_path}: a path cannot be both a memory and a folder"
        )
    };
    HttpError::conflict("memory_path_conflict_error", message).with_details(serde_json::json!({
        "conflicting_path": conflicting_path,
        "conflicting_memory_id": conflicting_id,
    }))
}

/// Insert a store; returns it.
pub fn insert_store(
    tx: &Transaction<'_>,
    name: &str,
    description: &str,
    metadata: &BTreeMap<String, String>,
) -> HttpResult<MemoryStore> {
    let id = ids::new_id("memstore");
    let now = ids::now_micros();
    tx.execute_cached(
        "INSERT INTO memory_stores (id, name, description, metadata, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
        params![id, name, description, metadata_json(metadata), now],
    )?;
    load_store(tx, &id)
}

/// The memory at `path`, with its content.
pub fn find_by_path(
    tx: &Transaction<'_>,
    store_id: &str,
    path: &str,
) -> HttpResult<Option<Memory>> {
    Ok(tx
        .query_row_cached(
            &format!(
                "SELECT {MEMORY_COLUMNS}, content FROM memories WHERE store_id = ?1 AND path = ?2"
            ),
            [store_id, path],
            |r| memory_from_row(r, true),
        )
        .optional()?)
}

/// Create a memory: refuses an occupied (or folder-conflicting) path and a
/// full store; appends the `created` version.
pub fn insert_memory(
    tx: &Transaction<'_>,
    store_id: &str,
    path: &str,
    content: &str,
    actor: &Actor,
) -> HttpResult<Memory> {
    if let Some(hit) = path_conflict(tx, store_id, path, None)? {
        return Err(conflict_error(path, hit));
    }
    let count: i64 = tx.query_row_cached(
        "SELECT COUNT(*) FROM memories WHERE store_id = ?1",
        [store_id],
        |r| r.get(0),
    )?;
    if count as u64 >= validate::MAX_MEMORIES_PER_STORE {
        return Err(HttpError::invalid_request(format!(
            "memory store {store_id} already holds {} memories, the most a store can hold",
            validate::MAX_MEMORIES_PER_STORE
        )));
    }
    let id = ids::new_id("mem");
    let sha = ids::sha256_hex(content.as_bytes());
    let now = ids::now_micros();
    let version_id = insert_version(
        tx,
        NewVersion {
            store_id,
            memory_id: &id,
            operation: MemoryOperation::Created,
            path,
            content: Some((content, &sha)),
            actor,
            at: now,
        },
    )?;
    tx.execute_cached(
        "INSERT INTO memories
           (id, store_id, path, content, content_sha256, size_bytes, version_id, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)",
        params![id, store_id, path, content, sha, content.len() as i64, version_id, now],
    )?;
    load_memory(tx, store_id, &id)
}

/// Give `current` a new path and content (the caller has checked both) and
/// append the `modified` version.
pub fn rewrite_memory(
    tx: &Transaction<'_>,
    current: &Memory,
    path: &str,
    content: &str,
    actor: &Actor,
) -> HttpResult<Memory> {
    let sha = ids::sha256_hex(content.as_bytes());
    let now = ids::now_micros();
    let version_id = insert_version(
        tx,
        NewVersion {
            store_id: &current.memory_store_id,
            memory_id: &current.id,
            operation: MemoryOperation::Modified,
            path,
            content: Some((content, &sha)),
            actor,
            at: now,
        },
    )?;
    tx.execute_cached(
        "UPDATE memories SET path = ?2, content = ?3, content_sha256 = ?4, size_bytes = ?5,
                version_id = ?6, updated_at = ?7
         WHERE id = ?1",
        params![
            current.id,
            path,
            content,
            sha,
            content.len() as i64,
            version_id,
            now
        ],
    )?;
    load_memory(tx, &current.memory_store_id, &current.id)
}

/// Delete `current`, appending the `deleted` version.
pub fn remove_memory(tx: &Transaction<'_>, current: &Memory, actor: &Actor) -> HttpResult<()> {
    insert_version(
        tx,
        NewVersion {
            store_id: &current.memory_store_id,
            memory_id: &current.id,
            operation: MemoryOperation::Deleted,
            path: &current.path,
            content: None,
            actor,
            at: ids::now_micros(),
        },
    )?;
    tx.execute_cached("DELETE FROM memories WHERE id = ?1", [&current.id])?;
    Ok(())
}

/// Every memory of a store, path → content.
pub fn contents(tx: &Transaction<'_>, store_id: &str) -> HttpResult<BTreeMap<String, String>> {
    let mut stmt =
        tx.prepare_cached("SELECT path, content FROM memories WHERE store_id = ?1 ORDER BY path")?;
    let rows = stmt.query_map([store_id], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
    })?;
    Ok(rows.collect::<Result<BTreeMap<_, _>, _>>()?)
}

/// What a new version records.
pub struct NewVersion<'a> {
    pub(crate) store_id: &'a str,
    pub(crate) memory_id: &'a str,
    pub(crate) operation: MemoryOperation,
    pub(crate) path: &'a str,
    /// `None` for a deletion.
    pub(crate) content: Option<(&'a str, &'a str)>,
    pub(crate) actor: &'a Actor,
    pub(crate) at: i64,
}

/// Append a version; returns its id.
pub fn insert_version(tx: &Transaction<'_>, v: NewVersion<'_>) -> HttpResult<String> {
    let id = ids::new_id("memver");
    let (content, sha, size) = match v.content {
        Some((content, sha)) => (Some(content), Some(sha), Some(content.len() as i64)),
        None => (None, None, None),
    };
    tx.execute_cached(
        "INSERT INTO memory_versions
           (id, store_id, memory_id, operation, path, content, content_sha256, size_bytes,
            actor, actor_type, actor_id, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        params![
            id,
            v.store_id,
            v.memory_id,
            v.operation.as_str(),
            v.path,
            content,
            sha,
            size,
            serde_json::to_string(v.actor).unwrap_or_default(),
            v.actor.actor_type,
            v.actor.id().unwrap_or_default(),
            v.at,
        ],
    )?;
    Ok(id)
}

pub const VERSION_COLUMNS: &str = "id, store_id, memory_id, operation, path, content, content_sha256, size_bytes, actor, created_at, redacted_at, redacted_by";

pub fn version_from_row(row: &Row<'_>, with_content: bool) -> rusqlite::Result<MemoryVersion> {
    version_at(row, 0, with_content)
}

/// A version whose [`VERSION_COLUMNS`] start at column `at`. Redacted and
/// deleted versions carry no content whatever the view.
pub fn version_at(row: &Row<'_>, at: usize, with_content: bool) -> rusqlite::Result<MemoryVersion> {
    let actor = |raw: Option<String>| raw.and_then(|s| serde_json::from_str::<Actor>(&s).ok());
    let operation: String = row.get(at + 3)?;
    Ok(MemoryVersion {
        id: row.get(at)?,
        object_type: "memory_version".into(),
        memory_store_id: row.get(at + 1)?,
        memory_id: row.get(at + 2)?,
        operation: MemoryOperation::parse(&operation).unwrap_or(MemoryOperation::Modified),
        path: row.get(at + 4)?,
        content: if with_content { row.get(at + 5)? } else { None },
        content_sha256: row.get(at + 6)?,
        content_size_bytes: row.get::<_, Option<i64>>(at + 7)?.map(|s| s as u64),
        created_by: actor(row.get(at + 8)?),
        created_at: ids::from_micros(row.get(at + 9)?),
        redacted_at: row.get::<_, Option<i64>>(at + 10)?.map(ids::from_micros),
        redacted_by: actor(row.get(at + 11)?),
    })
}
