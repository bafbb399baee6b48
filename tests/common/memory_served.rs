//! A session's memory stores against the devserver over real HTTP, with the
//! credential a worker really has: the sessions token from a polled work
//! item's secret.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use envworker::api::Error;
use envworker::memory::remote::{Layered, MemoryAnswer, MemoryApi, MemoryCall, MemoryLayer};
use futures::future::BoxFuture;

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
    /// The memory API calls `stores` made (each one HTTP request).
    pub calls: Arc<Counting>,
}

/// A layer over the client counting the memory API calls made through it,
/// by kind. The client's single-attempt twin (the push's client) goes
/// through the same layer, so it shares the counts.
#[derive(Default)]
pub struct Counting {
    pub listings: AtomicUsize,
    pub versions: AtomicUsize,
    pub others: AtomicUsize,
    /// Creates, updates and deletes (counted in `others` too): the write
    /// requests that count against the organisation's write rate limits.
    pub writes: AtomicUsize,
    /// Version ids left out of `memory_versions` pages: a write committed
    /// late, not yet visible (take an id out to make it visible).
    pub hidden: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Run before a listing request is sent (given its prefix, `None` for
    /// the whole store or its top level): a hook between the mount's
    /// listing requests, e.g. another writer's change.
    pub before_listing: std::sync::Mutex<Option<ListingHook>>,
}

/// See [`Counting::before_listing`]: the future to await before the
/// listing of this prefix goes out, if any.
pub type ListingHook = Box<dyn Fn(Option<&str>) -> Option<BoxFuture<'static, ()>> + Send + Sync>;

impl Counting {
    fn hook(&self, prefix: Option<&str>) -> Option<BoxFuture<'static, ()>> {
        self.before_listing
            .lock()
            .unwrap()
            .as_ref()
            .and_then(|hook| hook(prefix))
    }

    /// Every call so far.
    pub fn total(&self) -> usize {
        [&self.listings, &self.versions, &self.others]
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .sum()
    }

    /// Calls of each kind so far: (listing pages, versions pages, others).
    pub fn split(&self) -> (usize, usize, usize) {
        (
            self.listings.load(Ordering::SeqCst),
            self.versions.load(Ordering::SeqCst),
            self.others.load(Ordering::SeqCst),
        )
    }

    /// `call` counted under its kind.
    fn count(&self, call: &MemoryCall<'_>) {
        let kind = match call {
            MemoryCall::List { .. }
            | MemoryCall::ListUnder { .. }
            | MemoryCall::ListIndex { .. } => &self.listings,
            MemoryCall::Versions { .. } => &self.versions,
            MemoryCall::Retrieve { .. }
            | MemoryCall::Create { .. }
            | MemoryCall::Update { .. }
            | MemoryCall::Delete { .. } => &self.others,
        };
        kind.fetch_add(1, Ordering::SeqCst);
        if matches!(
            call,
            MemoryCall::Create { .. } | MemoryCall::Update { .. } | MemoryCall::Delete { .. }
        ) {
            self.writes.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Each call counted; a listing by prefix held back by the hook, if any;
/// the hidden versions left out of a versions page.
impl MemoryLayer for Counting {
    fn around<'a>(
        &'a self,
        call: MemoryCall<'a>,
        inner: &'a dyn MemoryApi,
    ) -> BoxFuture<'a, Result<MemoryAnswer, Error>> {
        self.count(&call);
        let hook = match &call {
            MemoryCall::ListUnder { prefix, .. } => self.hook(*prefix),
            _ => None,
        };
        Box::pin(async move {
            if let Some(hook) = hook {
                hook.await;
            }
            let mut answer = call.send(inner).await?;
            if let MemoryAnswer::Versions((got, _)) = &mut answer {
                let hidden = self.hidden.lock().unwrap().clone();
                got.data.retain(|v| !hidden.contains(&v.id));
            }
            Ok(answer)
        })
    }
}

/// A scenario-made session with a writable and a read-only store, claimed
/// like a worker claims it, its stores downloaded with the sessions token.
pub async fn served() -> Served {
    served_with(two_stores()).await
}

/// [`served`]'s scenario `memory_stores`.
pub fn two_stores() -> Value {
    json!([
        {"key": "notes", "name": "Notes", "memories": {"/a.md": "a1", "/dir/b.md": "b1", "/gone.md": "g"}},
        {"key": "kb", "name": "KB", "access": "read_only", "memories": {"/faq.md": "f1"}}
    ])
}

/// Another writer (the admin key, straight to the devserver at `url`)
/// moves the memory at `from` to `to` in `store`.
pub async fn rename_on_server(url: &str, store: &str, from: &str, to: &str) {
    use envworker::api::types::{ListMemories, UpdateMemory};
    let admin = Client::builder(Credential::api_key(ADMIN_KEY))
        .base_url(url)
        .build()
        .unwrap();
    let memories = admin.memories(store);
    let listed = memories
        .list(&ListMemories {
            limit: Some(100),
            ..Default::default()
        })
        .await
        .unwrap();
    let id = listed
        .data
        .into_iter()
        .filter_map(|m| m.into_memory())
        .find(|m| m.path == from)
        .unwrap_or_else(|| panic!("no memory at {from}"))
        .id;
    memories
        .update(
            &id,
            &UpdateMemory {
                content: None,
                path: Some(to.into()),
                precondition: None,
            },
            None,
        )
        .await
        .unwrap();
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
    served_custom(memory_stores, state_dir, shape, |c| c, |_, _| None).await
}

/// [`served_opts`] on a devserver configured by `config`, with `hook`
/// (made from the devserver's URL and the stores' ids) run before each of
/// the download's listing requests ([`Counting::before_listing`]).
pub async fn served_custom(
    memory_stores: Value,
    state_dir: Option<&Path>,
    shape: impl FnOnce(SessionMemoryStores) -> SessionMemoryStores,
    config: impl FnOnce(DevserverConfig) -> DevserverConfig,
    hook: impl FnOnce(String, Vec<String>) -> Option<ListingHook>,
) -> Served {
    let mnt = tempfile::tempdir().unwrap();
    let s = TestServer::start_with(config(
        DevserverConfig::new(ADMIN_KEY).mount_root(mnt.path().join("memory").to_str().unwrap()),
    ))
    .await;
    let started = s
        .start_scenario(&json!({"name": "engine", "memory_stores": memory_stores}))
        .await;
    let session = started.session_id.clone();
    claim_and_mount(s, mnt, &started, session, state_dir, shape, hook).await
}

/// [`served_opts`], but the session the worker claims starts `gap` after
/// the scenario wrote its stores: a second session of the scenario's
/// environment, attaching the same stores (the scenario's own session is
/// claimed and left alone) — a store written well before the session.
/// `shape` and `hook` as [`served_custom`]'s.
pub async fn served_later(
    memory_stores: Value,
    gap: std::time::Duration,
    shape: impl FnOnce(SessionMemoryStores) -> SessionMemoryStores,
    hook: impl FnOnce(String, Vec<String>) -> Option<ListingHook>,
) -> Served {
    let mnt = tempfile::tempdir().unwrap();
    let s = TestServer::start_with(
        DevserverConfig::new(ADMIN_KEY).mount_root(mnt.path().join("memory").to_str().unwrap()),
    )
    .await;
    let started = s
        .start_scenario(&json!({"name": "engine", "memory_stores": memory_stores}))
        .await;
    tokio::time::sleep(gap).await;
    let first = s
        .agents(
            reqwest::Method::GET,
            &format!("/v1/sessions/{}", started.session_id),
            None,
        )
        .await
        .ok();
    let resources: Vec<Value> = first["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| json!({"type": "memory_store", "memory_store_id": r["memory_store_id"], "access": r["access"]}))
        .collect();
    let later = s
        .agents(
            reqwest::Method::POST,
            "/v1/sessions",
            Some(json!({"agent": "a", "environment_id": started.environment_id, "resources": resources})),
        )
        .await
        .ok();
    let session = later["id"].as_str().unwrap().to_string();
    claim_and_mount(s, mnt, &started, session, None, shape, hook).await
}

/// Claim `session`'s work item in the scenario's environment (passing over
/// any other), then download its stores with the item's sessions token.
async fn claim_and_mount(
    s: TestServer,
    mnt: tempfile::TempDir,
    started: &super::Started,
    session_id: String,
    state_dir: Option<&Path>,
    shape: impl FnOnce(SessionMemoryStores) -> SessionMemoryStores,
    hook: impl FnOnce(String, Vec<String>) -> Option<ListingHook>,
) -> Served {
    let env_client = Client::builder(Credential::bearer(&started.environment_key))
        .base_url(s.url())
        .build()
        .unwrap();
    let mut work = None;
    for _ in 0..10 {
        let polled = env_client
            .work(&started.environment_id)
            .poll(&PollWork::default(), Some("engine-test"))
            .await
            .unwrap()
            .unwrap();
        if polled.data.id == session_id {
            work = Some(polled);
            break;
        }
    }
    let work = work.unwrap_or_else(|| panic!("no work item for {session_id}"));
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
    let session = client.sessions().retrieve(&session_id).await.unwrap();
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
    let calls = Arc::new(Counting::default());
    *calls.before_listing.lock().unwrap() = hook(s.url(), ids.clone());
    let mut stores = shape(
        SessionMemoryStores::new(
            Arc::new(Layered::new(calls.clone(), Arc::new(client.clone()))),
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
        session: session_id,
        client,
        session_resource: session,
        state_dir: state_dir.map(Path::to_path_buf),
        calls,
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
