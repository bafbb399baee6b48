//! A session's memory stores against the devserver over real HTTP, with the
//! credential a worker really has: the sessions token from a polled work
//! item's secret.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use envworker::api::types::{PollWork, Session, SessionResource};
use envworker::api::{Client, Credential};
use envworker::devserver::DevserverConfig;
use envworker::memory::options::{DeleteMode, SyncInterval};
use envworker::memory::{MemoryError, SessionMemoryStores};
use serde_json::{Value, json};

use super::{ADMIN_KEY, TestServer};

pub struct Served {
    pub s: TestServer,
    pub mnt: tempfile::TempDir,
    pub stores: SessionMemoryStores,
    /// Each store's folder, in the scenario's order.
    pub mounts: Vec<PathBuf>,
    /// Each store's id, in the scenario's order.
    pub ids: Vec<String>,
    pub session: String,
    /// What a worker holds to mount the stores again (a recovery).
    pub client: Client,
    pub session_resource: Session,
    /// Where the stores' sync state is journaled, when it is.
    pub state_dir: Option<PathBuf>,
}

/// A scenario-made session with a writable and a read-only store, claimed
/// like a worker claims it, its stores downloaded with the sessions token.
pub async fn served() -> Served {
    served_with(json!([
        {"key": "notes", "name": "Notes", "memories": {"/a.md": "a1", "/dir/b.md": "b1", "/gone.md": "g"}},
        {"key": "kb", "name": "KB", "access": "read_only", "memories": {"/faq.md": "f1"}}
    ]))
    .await
}

/// [`served`] with these scenario `memory_stores`.
pub async fn served_with(memory_stores: Value) -> Served {
    served_journaled(memory_stores, None).await
}

/// [`served_with`], journaling the stores' sync state under `state_dir`.
pub async fn served_journaled(memory_stores: Value, state_dir: Option<&Path>) -> Served {
    served_opts(memory_stores, state_dir, |stores| stores).await
}

/// [`served_journaled`], the stores object shaped by `shape` before the
/// download (e.g. a lower watch bound).
pub async fn served_opts(
    memory_stores: Value,
    state_dir: Option<&Path>,
    shape: impl FnOnce(SessionMemoryStores) -> SessionMemoryStores,
) -> Served {
    let mnt = tempfile::tempdir().unwrap();
    let s = TestServer::start_with(
        DevserverConfig::new(ADMIN_KEY).mount_root(mnt.path().join("memory").to_str().unwrap()),
    )
    .await;
    let started = s
        .start_scenario(&json!({"name": "engine", "memory_stores": memory_stores}))
        .await;
    let env_client = Client::builder(Credential::bearer(&started.environment_key))
        .base_url(s.url())
        .build()
        .unwrap();
    let work = env_client
        .work(&started.environment_id)
        .poll(&PollWork::default(), Some("engine-test"))
        .await
        .unwrap()
        .unwrap();
    let secret = work.secret.unwrap();
    let payload: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(secret.expose())
            .unwrap(),
    )
    .unwrap();
    let token = payload["sessions_token"].as_str().unwrap().to_string();
    let client = Client::builder(Credential::bearer(token))
        .base_url(s.url())
        .build()
        .unwrap();
    let session = client
        .sessions()
        .retrieve(&started.session_id)
        .await
        .unwrap();
    let ids: Vec<String> = session
        .resources
        .iter()
        .filter_map(|r| match r {
            SessionResource::MemoryStore(m) => Some(m.memory_store_id.clone()),
            SessionResource::Other(_) => None,
        })
        .collect();
    let mounts: Vec<_> = session
        .memory_stores()
        .map(|m| PathBuf::from(m.mount_path.clone().unwrap()))
        .collect();
    let mut stores = shape(
        SessionMemoryStores::new(
            Arc::new(client.clone()),
            mnt.path(),
            SyncInterval::default(),
            DeleteMode::Enabled,
        )
        .with_state_dir(state_dir),
    );
    stores.download(&session).await.unwrap();
    Served {
        s,
        mnt,
        stores,
        mounts,
        ids,
        session: started.session_id,
        client,
        session_resource: session,
        state_dir: state_dir.map(Path::to_path_buf),
    }
}

impl Served {
    /// The session's stores mounted again, as a new worker process on the
    /// same disk would (same state directory), after the first one died.
    pub async fn mount_again(&self) -> Result<SessionMemoryStores, MemoryError> {
        let mut stores = SessionMemoryStores::new(
            Arc::new(self.client.clone()),
            self.mnt.path(),
            SyncInterval::default(),
            DeleteMode::Enabled,
        )
        .with_state_dir(self.state_dir.as_deref());
        stores.download(&self.session_resource).await?;
        Ok(stores)
    }

    /// The id of the memory at `path` in `store`.
    pub async fn memory_id(&self, store: &str, path: &str) -> String {
        let (items, _) = self
            .s
            .list_all(&format!("/v1/memory_stores/{store}/memories"))
            .await;
        items
            .iter()
            .find(|m| m["path"] == path)
            .and_then(|m| m["id"].as_str())
            .unwrap_or_else(|| panic!("no memory at {path}"))
            .to_string()
    }
}
