//! `envworker devserver`: a local control plane that answers as the real
//! Managed Agents API does, backed by SQLite, so that workers — ours and the
//! official SDK's — can be run and tested without the real API.
//!
//! It serves self-hosted environments and their work queue, sessions and
//! their events (list, send, SSE), memory stores, skills (uploaded with
//! `/dev/skills`), scripted sessions driven by scenario files
//! (`/dev/scenarios`), signed webhooks, injected faults (`/dev/faults`), and
//! a log of the requests it received (`/dev/requests`).
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

pub(crate) mod auth;
pub(crate) mod cursor;
pub(crate) mod db;
pub(crate) mod dev_routes;
pub(crate) mod environments;
pub(crate) mod error;
pub mod faults;
pub(crate) mod http;
pub(crate) mod ids;
pub(crate) mod live;
mod memory;
pub mod requests;
pub mod scenario;
pub(crate) mod sessions;
pub(crate) mod skills;
pub(crate) mod state;
pub(crate) mod validate;
pub(crate) mod webhooks;
pub(crate) mod work;

pub use db::StatementStats;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderValue, Request};
use axum::middleware;
use axum::response::Response;
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api::ApiFamily;
use crate::webhook::SigningKey;

use self::db::{Db, DbError};
use self::error::HttpError;
use self::faults::FaultRule;
use self::state::AppState;

/// Default lease TTL of a work item, in seconds.
pub const DEFAULT_LEASE_TTL_SECONDS: i64 = 30;
/// Default mount root of memory stores.
pub const DEFAULT_MOUNT_ROOT: &str = "/mnt/memory";

/// How to start a devserver.
#[derive(Clone)]
pub struct DevserverConfig {
    /// The organisation key, accepted as `x-api-key` or Bearer.
    pub admin_key: String,
    /// Where the SQLite database lives; `None` is a fresh temporary database.
    pub data_dir: Option<PathBuf>,
    /// Where memory stores are mounted: `mount_path` = `<root>/<slug>`.
    pub mount_root: String,
    /// Deliver `session.status_run_started` here, signed with the key.
    pub(crate) webhook: Option<(String, SigningKey)>,
    /// First retry delay of a failed webhook delivery (doubles each time).
    pub(crate) webhook_backoff: Duration,
    /// Fault rules active from the start.
    pub faults: Vec<FaultRule>,
    /// Lease TTL of a work item unless a heartbeat asks for another.
    pub(crate) lease_ttl_seconds: i64,
    /// How often an idle event stream sends `event: ping`.
    pub(crate) ping_interval: Duration,
    /// Seconds added to every response's `Date` header (0: the true
    /// clock). A test setting: a proxy or load balancer whose clock is off
    /// rewrites `Date`, and a client must not steer by it.
    pub(crate) date_skew_seconds: i64,
}

impl std::fmt::Debug for DevserverConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevserverConfig")
            .field("admin_key", &"[redacted]")
            .field("data_dir", &self.data_dir)
            .field("mount_root", &self.mount_root)
            .field("webhook_url", &self.webhook.as_ref().map(|(u, _)| u))
            .field("faults", &self.faults)
            .field("lease_ttl_seconds", &self.lease_ttl_seconds)
            .field("date_skew_seconds", &self.date_skew_seconds)
            .finish()
    }
}

impl DevserverConfig {
    pub fn new(admin_key: impl Into<String>) -> Self {
        DevserverConfig {
            admin_key: admin_key.into(),
            data_dir: None,
            mount_root: DEFAULT_MOUNT_ROOT.into(),
            webhook: None,
            webhook_backoff: Duration::from_secs(1),
            faults: Vec::new(),
            lease_ttl_seconds: DEFAULT_LEASE_TTL_SECONDS,
            ping_interval: Duration::from_secs(15),
            date_skew_seconds: 0,
        }
    }

    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    pub fn mount_root(mut self, root: impl Into<String>) -> Self {
        self.mount_root = root.into();
        self
    }

    pub fn webhook(mut self, url: impl Into<String>, key: SigningKey) -> Self {
        self.webhook = Some((url.into(), key));
        self
    }

    pub fn webhook_backoff(mut self, backoff: Duration) -> Self {
        self.webhook_backoff = backoff;
        self
    }

    pub fn fault(mut self, rule: FaultRule) -> Self {
        self.faults.push(rule);
        self
    }

    pub fn lease_ttl_seconds(mut self, ttl: i64) -> Self {
        self.lease_ttl_seconds = ttl;
        self
    }

    pub fn ping_interval(mut self, interval: Duration) -> Self {
        self.ping_interval = interval;
        self
    }

    /// Answer with a `Date` header `seconds` off the true clock (negative:
    /// behind), as a middlebox with a wrong clock would.
    pub fn date_skew_seconds(mut self, seconds: i64) -> Self {
        self.date_skew_seconds = seconds;
        self
    }
}

/// Why a devserver could not start.
#[derive(Debug, thiserror::Error)]
pub enum DevserverError {
    #[error("the admin key must not be empty")]
    EmptyAdminKey,
    #[error("the mount root must be an absolute path, got {0:?}")]
    MountRoot(String),
    #[error("the lease TTL must be 1 to {max} seconds", max = work::MAX_TTL_SECONDS)]
    LeaseTtl,
    #[error("--fault: {0}")]
    Faults(String),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("cannot recover the database: {0}")]
    Recover(String),
    #[error("cannot read the listener's address: {0}")]
    Listener(#[source] std::io::Error),
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
        if !config.mount_root.starts_with('/') {
            return Err(DevserverError::MountRoot(config.mount_root));
        }
        if !(1..=work::MAX_TTL_SECONDS).contains(&config.lease_ttl_seconds) {
            return Err(DevserverError::LeaseTtl);
        }
        if config.faults.len() > faults::MAX_RULES {
            return Err(DevserverError::Faults(faults::too_many_rules(
                config.faults.len(),
            )));
        }
        for rule in &config.faults {
            rule.check().map_err(DevserverError::Faults)?;
        }
        let db = Db::open(config.data_dir.as_deref())?;
        Ok(Devserver {
            state: AppState::new(db, config),
        })
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// The whole HTTP application.
    pub fn app(&self) -> Router {
        app(self.state.clone())
    }

    /// Serve on `listener` until `shutdown` resolves; background tasks (the
    /// lease sweeper, scripted sessions) stop with it.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let token = self.state.shutdown_token();
        let recovered = self
            .state
            .db()
            .transaction(scenario::fail_interrupted)
            .await;
        if let Err(e) = recovered {
            tracing::error!(error = %e, "cannot mark interrupted scenarios");
        }
        tokio::spawn(sweep_leases(self.state.clone()));
        // TCP_NODELAY on every connection, as production HTTP servers set
        // it: without it an event written to a stream the client never
        // writes back on waits for the client's delayed ACK (40 ms) when the
        // one before it is not yet acknowledged (Nagle).
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::warn!(error = %e, "cannot set TCP_NODELAY on a connection");
            }
        });
        let result = axum::serve(listener, self.app())
            .with_graceful_shutdown(async move {
                shutdown.await;
            })
            .await;
        token.cancel();
        result
    }

    /// Serve on `listener` in a background task.
    pub fn spawn(self, listener: TcpListener) -> Result<RunningDevserver, DevserverError> {
        let addr = listener.local_addr().map_err(DevserverError::Listener)?;
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let state = self.state.clone();
        let task = tokio::spawn(self.serve(listener, async move { stopped.cancelled().await }));
        Ok(RunningDevserver {
            addr,
            stop,
            state,
            task: Some(task),
        })
    }
}

/// Re-queue expired leases every quarter second and wake blocked polls.
async fn sweep_leases(state: AppState) {
    let token = state.shutdown_token();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        let requeued = state
            .db()
            .transaction(|tx| work::expire_leases(tx, ids::now_micros()))
            .await;
        match requeued {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(work_items = n, "leases expired; work items re-queued");
                state.live().work_available.notify_waiters();
            }
            Err(e) => tracing::error!(error = %e, "lease sweep failed"),
        }
    }
}

/// A devserver serving in the background; dropping it stops it.
pub struct RunningDevserver {
    addr: SocketAddr,
    stop: CancellationToken,
    state: AppState,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl RunningDevserver {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, the value for `ANTHROPIC_BASE_URL`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Stop accepting, finish in-flight requests, and wait.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        // Open SSE streams would hold a graceful shutdown forever.
        self.state.shutdown_token().cancel();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }
}

impl Drop for RunningDevserver {
    fn drop(&mut self) {
        self.stop.cancel();
        self.state.shutdown_token().cancel();
    }
}

/// The router: each API family behind its header checks and the fault layer,
/// the `/dev` endpoints behind the admin key, and API-shaped 404/405 answers.
pub fn app(state: AppState) -> Router {
    Router::new()
        .merge(api_family(&state, memory::routes(), ApiFamily::Memory))
        .merge(api_family(
            &state,
            managed_agents_routes(),
            ApiFamily::ManagedAgents,
        ))
        .merge(api_family(&state, skills::routes(), ApiFamily::Skills))
        .merge(dev_endpoints(&state))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::map_response(add_request_id))
        .layer(middleware::map_response_with_state(
            state.clone(),
            skew_date,
        ))
        .with_state(state)
}

/// One API family's routes behind its header checks, the injected faults
/// and the request log.
fn api_family(state: &AppState, routes: Router<AppState>, family: ApiFamily) -> Router<AppState> {
    routes
        .layer(middleware::from_fn_with_state(
            (state.clone(), family),
            http::check_request,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            dev_routes::inject,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            dev_routes::record,
        ))
}

/// The Managed Agents API: environments, their work queue, and sessions.
fn managed_agents_routes() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/environments",
            post(environments::create).get(environments::list),
        )
        .route(
            "/v1/environments/{environment_id}",
            get(environments::retrieve)
                .post(environments::update)
                .delete(environments::delete),
        )
        .route(
            "/v1/environments/{environment_id}/archive",
            post(environments::archive),
        )
        .route("/v1/environments/{environment_id}/work", get(work::list))
        .route(
            "/v1/environments/{environment_id}/work/poll",
            get(work::poll),
        )
        .route(
            "/v1/environments/{environment_id}/work/stats",
            get(work::stats),
        )
        .route(
            "/v1/environments/{environment_id}/work/{work_id}",
            get(work::retrieve).post(work::update),
        )
        .route(
            "/v1/environments/{environment_id}/work/{work_id}/ack",
            post(work::ack),
        )
        .route(
            "/v1/environments/{environment_id}/work/{work_id}/heartbeat",
            post(work::heartbeat),
        )
        .route(
            "/v1/environments/{environment_id}/work/{work_id}/stop",
            post(work::stop),
        )
        .route("/v1/sessions", post(sessions::create).get(sessions::list))
        .route(
            "/v1/sessions/{session_id}",
            get(sessions::retrieve).delete(sessions::delete),
        )
        .route("/v1/sessions/{session_id}/archive", post(sessions::archive))
        .route(
            "/v1/sessions/{session_id}/events",
            get(sessions::list_events).post(sessions::send_events),
        )
        .route(
            "/v1/sessions/{session_id}/events/stream",
            get(sessions::stream),
        )
}

/// The devserver's own `/dev` endpoints, behind the admin key.
fn dev_endpoints(state: &AppState) -> Router<AppState> {
    Router::new()
        .route("/dev/environments", post(environments::dev_create))
        .route("/dev/skills", post(skills::dev_create))
        .route("/dev/scenarios", post(scenario::start))
        .route("/dev/scenarios/{session_id}", get(scenario::report))
        .route(
            "/dev/faults",
            get(dev_routes::list_faults)
                .post(dev_routes::add_faults)
                .delete(dev_routes::clear_faults),
        )
        .route(
            "/dev/requests",
            get(dev_routes::list_requests).delete(dev_routes::clear_requests),
        )
        .layer(middleware::from_fn_with_state(
            state.clone(),
            http::check_admin,
        ))
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

/// With a date skew configured, the `Date` header is stamped here, off by
/// that much (hyper adds the true one only when none is set).
async fn skew_date(
    axum::extract::State(state): axum::extract::State<AppState>,
    mut response: Response,
) -> Response {
    let skew = state.date_skew_seconds();
    if skew != 0 {
        let at = chrono::Utc::now() + chrono::Duration::seconds(skew);
        if let Ok(v) = HeaderValue::from_str(&at.format("%a, %d %b %Y %H:%M:%S GMT").to_string()) {
            response.headers_mut().insert(axum::http::header::DATE, v);
        }
    }
    response
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
