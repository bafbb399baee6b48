//! `envworker devserver`: a local control plane that answers as the real
//! Managed Agents API does, backed by SQLite, so that workers — ours and the
//! official SDK's — can be run and tested without the real API.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use envworker::devserver::{Devserver, DevserverConfig};
//! let server = Devserver::open(DevserverConfig::new("admin-key"))?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let running = server.spawn(listener)?;
//! println!("{}", running.url());
//! running.shutdown().await;
//! # Ok(()) }
//! ```

pub mod cursor;
pub mod db;
pub mod error;
pub mod http;
pub mod ids;
mod memory;
pub mod validate;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderValue, Request};
use axum::middleware;
use axum::response::Response;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api::ApiFamily;

use self::db::{Db, DbError};
use self::error::HttpError;

/// How to start a devserver.
#[derive(Clone)]
pub struct DevserverConfig {
    /// The organisation key, accepted as `x-api-key`.
    pub admin_key: String,
    /// Where the SQLite database lives; `None` is a fresh temporary database.
    pub data_dir: Option<PathBuf>,
}

impl std::fmt::Debug for DevserverConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevserverConfig")
            .field("admin_key", &"[redacted]")
            .field("data_dir", &self.data_dir)
            .finish()
    }
}

impl DevserverConfig {
    pub fn new(admin_key: impl Into<String>) -> Self {
        DevserverConfig {
            admin_key: admin_key.into(),
            data_dir: None,
        }
    }

    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }
}

/// Why a devserver could not start.
#[derive(Debug, thiserror::Error)]
pub enum DevserverError {
    #[error("the admin key must not be empty")]
    EmptyAdminKey,
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("cannot read the listener's address: {0}")]
    Listener(#[source] std::io::Error),
}

/// Shared state of every handler.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<StateInner>,
}

struct StateInner {
    db: Db,
    admin_key_sha256: [u8; 32],
    admin_key_id: String,
}

impl AppState {
    pub fn db(&self) -> &Db {
        &self.inner.db
    }

    /// Compare digests rather than the keys themselves, so the comparison
    /// time says nothing about the key.
    pub fn is_admin_key(&self, key: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        digest == self.inner.admin_key_sha256
    }

    /// The admin key's public id (`apikey_…`), recorded as the actor of its writes.
    pub fn admin_key_id(&self) -> &str {
        &self.inner.admin_key_id
    }
}

/// A devserver ready to serve.
pub struct Devserver {
    state: AppState,
}

impl Devserver {
    /// Open the database and prepare the state.
    pub fn open(config: DevserverConfig) -> Result<Devserver, DevserverError> {
        if config.admin_key.is_empty() {
            return Err(DevserverError::EmptyAdminKey);
        }
        let db = Db::open(config.data_dir.as_deref())?;
        let digest: [u8; 32] = Sha256::digest(config.admin_key.as_bytes()).into();
        let admin_key_id = format!("apikey_01{}", &hex::encode(digest)[..22]);
        Ok(Devserver {
            state: AppState {
                inner: Arc::new(StateInner {
                    db,
                    admin_key_sha256: digest,
                    admin_key_id,
                }),
            },
        })
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// The whole HTTP application.
    pub fn app(&self) -> Router {
        app(self.state.clone())
    }

    /// Serve on `listener` until `shutdown` resolves.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(listener, self.app())
            .with_graceful_shutdown(shutdown)
            .await
    }

    /// Serve on `listener` in a background task.
    pub fn spawn(self, listener: TcpListener) -> Result<RunningDevserver, DevserverError> {
        let addr = listener.local_addr().map_err(DevserverError::Listener)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(self.serve(listener, async {
            let _ = stopped.await;
        }));
        Ok(RunningDevserver {
            addr,
            stop: Some(stop),
            task,
        })
    }
}

/// A devserver serving in the background; dropping it stops it.
pub struct RunningDevserver {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl RunningDevserver {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, the value for `ANTHROPIC_BASE_URL`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stop accepting, finish in-flight requests, and wait.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for RunningDevserver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The router: the API families, each behind its header checks, and an
/// API-shaped 404/405 for everything else.
pub fn app(state: AppState) -> Router {
    let memory = memory::routes().layer(middleware::from_fn_with_state(
        (state.clone(), ApiFamily::Memory),
        http::check_request,
    ));
    Router::new()
        .merge(memory)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::map_response(add_request_id))
        .with_state(state)
}

async fn not_found(request: Request<axum::body::Body>) -> HttpError {
    HttpError::not_found(format!(
        "no route for {} {}",
        request.method(),
        request.uri().path()
    ))
}

async fn method_not_allowed(request: Request<axum::body::Body>) -> HttpError {
    HttpError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!(
            "{} is not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    )
}

/// Every response carries a `request-id`, as the API's do.
async fn add_request_id(mut response: Response) -> Response {
    if !response.headers().contains_key("request-id")
        && let Ok(v) = HeaderValue::from_str(&ids::new_id("req"))
    {
        response.headers_mut().insert("request-id", v);
    }
    response
}
