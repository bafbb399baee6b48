//! The devserver's SQLite storage: one connection behind a mutex, used from
//! blocking threads. Every write runs in one transaction that commits only
//! when the handler succeeds, so a refused request leaves no trace.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, Transaction};

use super::error::{HttpError, HttpResult};

/// Why the database could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open the database {path}: {source}")]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("cannot migrate the database {path}: {source}")]
    Migrate {
        path: PathBuf,
        source: rusqlite::Error,
    },
}

/// Schema migrations, applied in order; `PRAGMA user_version` records how many ran.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE memory_stores (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL UNIQUE,
    name         TEXT NOT NULL,
    description  TEXT NOT NULL,
    metadata     TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    archived_at  INTEGER
);
CREATE TABLE memories (
    id             TEXT PRIMARY KEY,
    store_id       TEXT NOT NULL REFERENCES memory_stores(id) ON DELETE CASCADE,
    path           TEXT NOT NULL,
    content        TEXT NOT NULL,
    content_sha256 TEXT NOT NULL,
    size_bytes     INTEGER NOT NULL,
    version_id     TEXT NOT NULL,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    UNIQUE (store_id, path)
);
CREATE TABLE memory_versions (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    id             TEXT NOT NULL UNIQUE,
    store_id       TEXT NOT NULL REFERENCES memory_stores(id) ON DELETE CASCADE,
    memory_id      TEXT NOT NULL,
    operation      TEXT NOT NULL,
    path           TEXT,
    content        TEXT,
    content_sha256 TEXT,
    size_bytes     INTEGER,
    actor          TEXT NOT NULL,
    actor_type     TEXT NOT NULL,
    actor_id       TEXT NOT NULL,
    created_at     INTEGER NOT NULL,
    redacted_at    INTEGER,
    redacted_by    TEXT
);
CREATE INDEX memory_versions_by_store ON memory_versions (store_id, seq);
CREATE INDEX memory_versions_by_memory ON memory_versions (memory_id, seq);
"#,
    r#"
CREATE TABLE environments (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL UNIQUE,
    name         TEXT NOT NULL,
    description  TEXT NOT NULL,
    metadata     TEXT NOT NULL,
    config_type  TEXT NOT NULL,
    scope        TEXT,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    archived_at  INTEGER
);
-- Worker credentials, by the SHA-256 of the secret: the secret itself is never stored.
CREATE TABLE credentials (
    token_sha256   TEXT PRIMARY KEY,
    kind           TEXT NOT NULL,
    environment_id TEXT NOT NULL,
    session_id     TEXT,
    work_id        TEXT,
    created_at     INTEGER NOT NULL,
    revoked_at     INTEGER
);
CREATE TABLE sessions (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    id             TEXT NOT NULL UNIQUE,
    environment_id TEXT NOT NULL,
    status         TEXT NOT NULL,
    agent          TEXT NOT NULL,
    resources      TEXT NOT NULL,
    metadata       TEXT NOT NULL,
    title          TEXT,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    archived_at    INTEGER
);
-- `ref_id` is the tool call a result or confirmation answers.
CREATE TABLE session_events (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    id         TEXT NOT NULL UNIQUE,
    session_id TEXT NOT NULL,
    type       TEXT NOT NULL,
    ref_id     TEXT,
    body       TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX session_events_by_session ON session_events (session_id, seq);
CREATE INDEX session_events_by_ref ON session_events (session_id, ref_id);
CREATE TABLE work_items (
    seq                 INTEGER PRIMARY KEY AUTOINCREMENT,
    id                  TEXT NOT NULL UNIQUE,
    environment_id      TEXT NOT NULL,
    data_type           TEXT NOT NULL,
    data_id             TEXT NOT NULL,
    state               TEXT NOT NULL,
    metadata            TEXT NOT NULL,
    created_at          INTEGER NOT NULL,
    claimed_at          INTEGER,
    claimed_by          TEXT,
    acknowledged_at     INTEGER,
    started_at          INTEGER,
    last_heartbeat      TEXT,
    latest_heartbeat_at INTEGER,
    lease_expires_at    INTEGER,
    ttl_seconds         INTEGER NOT NULL,
    stop_requested_at   INTEGER,
    stopped_at          INTEGER
);
CREATE INDEX work_items_queue ON work_items (environment_id, state, seq);
CREATE INDEX work_items_by_session ON work_items (data_id, seq);
CREATE TABLE worker_polls (
    environment_id TEXT NOT NULL,
    worker_id      TEXT NOT NULL,
    polled_at      INTEGER NOT NULL,
    PRIMARY KEY (environment_id, worker_id)
);
CREATE TABLE scenarios (
    session_id TEXT PRIMARY KEY,
    report     TEXT NOT NULL
);
"#,
    r#"
-- One row per skill version; `version` is the upload's Unix time in
-- microseconds, strictly increasing per skill. `archive` is served verbatim.
CREATE TABLE skills (
    skill_id    TEXT NOT NULL,
    version     INTEGER NOT NULL,
    name        TEXT NOT NULL,
    description TEXT NOT NULL,
    archive     BLOB NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (skill_id, version)
);
"#,
];

/// Prepared statements kept per connection: every statement the handlers
/// run (a few dozen texts; the listings' few variants each) stays compiled.
const STATEMENT_CACHE: usize = 256;

/// Run SQL through the connection's prepared-statement cache: a tool call
/// costs the devserver a handful of statements, and compiling each anew
/// was the largest part of its CPU per request.
pub trait Cached {
    fn execute_cached<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;
    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>;
}

impl Cached for Connection {
    fn execute_cached<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}

/// One compiled statement's counters (`Db::statement_stats`, a devserver diagnostic).
#[derive(Debug, Clone)]
pub struct StatementStats {
    pub sql: String,
    /// Runs (`SQLITE_STMTSTATUS_RUN`).
    pub runs: i32,
    /// Automatic recompilations (`SQLITE_STMTSTATUS_REPREPARE`).
    pub recompiles: i32,
}

/// The storage handle. Cloning shares the connection.
#[derive(Clone)]
pub struct Db {
    conn: Arc<Mutex<Connection>>,
    /// Keeps a temporary data directory alive for as long as the server runs.
    _temp: Option<Arc<tempfile::TempDir>>,
    path: PathBuf,
}

impl Db {
    /// Open (and migrate) `<data_dir>/devserver.sqlite3`, or a fresh database
    /// in a temporary directory when no data directory is given.
    pub fn open(data_dir: Option<&Path>) -> Result<Db, DbError> {
        let (dir, temp) = match data_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| DbError::DataDir {
                    path: dir.to_path_buf(),
                    source,
                })?;
                (dir.to_path_buf(), None)
            }
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("envworker-devserver-")
                    .tempdir()
                    .map_err(|source| DbError::DataDir {
                        path: std::env::temp_dir(),
                        source,
                    })?;
                (temp.path().to_path_buf(), Some(Arc::new(temp)))
            }
        };
        let path = dir.join("devserver.sqlite3");
        let mut conn = Connection::open(&path).map_err(|source| DbError::Open {
            path: path.clone(),
            source,
        })?;
        let configure = |conn: &Connection| {
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            conn.pragma_update(None, "foreign_keys", "ON")?;
            // The query planner's stability guarantee: a plan does not
            // depend on the values bound. Without it the bundled library
            // (built with STAT4) marks the parameters of an `ORDER BY`,
            // `LIMIT ?` or `LEFT JOIN` query as plan inputs and compiles the
            // cached statement again on every run with new values — the
            // token lookup of every worker request, the answers lookup of
            // every tool result, the event and version listings.
            conn.set_db_config(
                rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
                true,
            )?;
            conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
            conn.busy_timeout(std::time::Duration::from_secs(5))
        };
        configure(&conn).map_err(|source| DbError::Open {
            path: path.clone(),
            source,
        })?;
        migrate(&mut conn).map_err(|source| DbError::Migrate {
            path: path.clone(),
            source,
        })?;
        Ok(Db {
            conn: Arc::new(Mutex::new(conn)),
            _temp: temp,
            path,
        })
    }

    /// Where the database file lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Run `f`, one read statement, outside an explicit transaction: a
    /// single `SELECT` is atomic on its own, and `BEGIN` and `COMMIT` are
    /// parsed anew each time (two compilations per authenticated request).
    pub async fn read<T, F>(&self, f: F) -> HttpResult<T>
    where
        F: FnOnce(&Connection) -> HttpResult<T>,
    {
        let conn = self
            .conn
            .lock()
            .map_err(|_| HttpError::internal("storage lock poisoned"))?;
        f(&conn)
    }

    /// Every statement compiled on the connection (those its cache keeps):
    /// its text, how often it ran and how often SQLite had to compile it
    /// again. A diagnostic: a cached statement recompiled on each run costs
    /// what the cache is there to save.
    pub fn statement_stats(&self) -> Vec<StatementStats> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        // SAFETY: the connection is locked for the whole walk, so no
        // statement is finalized while it is visited; each pointer comes
        // from `sqlite3_next_stmt` on this connection and is only read.
        unsafe {
            let db = conn.handle();
            let mut stmt = rusqlite::ffi::sqlite3_next_stmt(db, std::ptr::null_mut());
            while !stmt.is_null() {
                let sql = rusqlite::ffi::sqlite3_sql(stmt);
                let sql = if sql.is_null() {
                    String::new()
                } else {
                    std::ffi::CStr::from_ptr(sql).to_string_lossy().into_owned()
                };
                out.push(StatementStats {
                    sql,
                    runs: rusqlite::ffi::sqlite3_stmt_status(
                        stmt,
                        rusqlite::ffi::SQLITE_STMTSTATUS_RUN,
                        0,
                    ),
                    recompiles: rusqlite::ffi::sqlite3_stmt_status(
                        stmt,
                        rusqlite::ffi::SQLITE_STMTSTATUS_REPREPARE,
                        0,
                    ),
                });
                stmt = rusqlite::ffi::sqlite3_next_stmt(db, stmt);
            }
        }
        out
    }

    /// Run `f` in a transaction; commit when it succeeds, roll back when
    /// it fails. On the calling task, not a blocking thread: a statement
    /// here takes microseconds (WAL, `synchronous=NORMAL`: a commit is a
    /// write, the fsync waits for a checkpoint), less than the hand-off to
    /// a blocking thread and back, which was most of a request's time.
    pub async fn transaction<T, F>(&self, f: F) -> HttpResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> HttpResult<T> + Send + 'static,
    {
        let mut conn = self
            .conn
            .lock()
            .map_err(|_| HttpError::internal("storage lock poisoned"))?;
        let tx = conn.transaction()?;
        let value = f(&tx)?;
        tx.commit()?;
        Ok(value)
    }
}

fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
    let applied: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(applied.max(0) as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (index + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}
