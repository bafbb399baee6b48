//! An in-process memory store server for the sync tests that must inject a
//! failure at an exact point (a lost response, a 409 race, a deletion
//! between listing and fetch). It follows the devserver's rules for the calls
//! the sync makes, and records every request.
//!
//! Every change appends a version to a log (as the devserver's
//! `memory_versions` table does), stamped by a fake server clock: the
//! tokio clock since the fake was made, in microseconds, on top of a fixed
//! epoch. The version history ([`MemoryApi::versions`]) and the prefix and
//! depth listings ([`MemoryApi::list_under`]) are served only once a test
//! turns them on ([`FakeMemory::serve_feed`]): without them the sync lists
//! the whole store each time, which is what the older tests count calls of.
//! A change made by a [`Fault::Before`] closure writes no version (it is a
//! change the feed cannot see).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use envworker::api::types::{
    Memory, MemoryListItem, MemoryOperation, MemoryPrefix, MemoryVersion, Page, View,
};
use envworker::api::{ApiError, Error};
use envworker::memory::remote::{MemoryApi, VersionsPage};
use futures::future::BoxFuture;
use sha2::{Digest, Sha256};

pub fn sha(content: &str) -> String {
    hex::encode(Sha256::digest(content.as_bytes()))
}

/// One request the sync made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    List {
        store: String,
        view: View,
    },
    Retrieve {
        path: String,
    },
    Create {
        path: String,
        content: String,
    },
    Update {
        path: String,
        content: String,
        expected: String,
    },
    Delete {
        path: String,
        expected: String,
    },
    /// A page of the version history.
    Versions {
        since_micros: Option<i64>,
    },
    /// A listing by prefix and depth.
    ListUnder {
        prefix: Option<String>,
        depth: Option<u32>,
    },
}

impl Fault {
    pub fn before(f: impl Fn(&mut Stores) + Send + Sync + 'static) -> Fault {
        Fault::Before(std::sync::Arc::new(f))
    }

    /// Before the call is served, `content` lands as a new version of the
    /// memory at `path` in `store`: another writer's edit, or a request of
    /// ours committing late.
    pub fn edit_first(store: &str, path: &str, content: &str) -> Fault {
        let (store, path, content) = (
            store.to_string(),
            format!("/{}", path.trim_start_matches('/')),
            content.to_string(),
        );
        Fault::before(move |stores| {
            let m = stores
                .get_mut(&store)
                .and_then(|s| s.get_mut(&path))
                .expect("the memory an edit lands on");
            m.content = content.clone();
            m.version += 1;
        })
    }
}

impl Call {
    /// The writes only (creates, updates, deletes).
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Call::Create { .. } | Call::Update { .. } | Call::Delete { .. }
        )
    }
}

/// What the next matching call does instead of answering normally.
#[derive(Clone)]
pub enum Fault {
    /// Answer this status without doing anything.
    Status(u16),
    /// Do the change, then fail as if the answer was lost.
    LoseResponse,
    /// Run this first (change the server, or the disk, under the call), then answer normally.
    Before(std::sync::Arc<dyn Fn(&mut Stores) + Send + Sync>),
    /// Wait this long (tokio time), then answer normally.
    Delay(std::time::Duration),
    /// Do the change, then answer this status (a retry refused because the first attempt landed).
    ApplyThen(u16),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    List,
    Retrieve,
    Create,
    Update,
    Delete,
    Versions,
    ListUnder,
}

/// The server's clock at the fake's start: 2026-01-01T00:00:00Z, in microseconds.
const EPOCH_MICROS: i64 = 1_767_225_600_000_000;

/// One entry of the version log, in commit order (the devserver's `seq`).
#[derive(Debug, Clone)]
struct Logged {
    id: String,
    store: String,
    memory_id: String,
    operation: MemoryOperation,
    /// `None` once redacted.
    path: Option<String>,
    /// `None` for a deletion or once redacted.
    sha: Option<String>,
    size: Option<u64>,
    created_at: i64,
    redacted_at: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct Stored {
    pub id: String,
    pub content: String,
    pub version: u64,
}

/// store id → path (with `/`) → memory.
pub type Stores = BTreeMap<String, BTreeMap<String, Stored>>;

/// Who changed a memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// A create, update or delete the worker sent (whatever it heard back).
    Worker,
    /// Another writer ([`FakeMemory::put`], `put_late`, `remove`).
    Remote,
}

/// One change of a memory's content, in the order the server made them.
#[derive(Debug, Clone)]
pub struct Change {
    pub at: tokio::time::Instant,
    pub store: String,
    /// Without the leading `/`.
    pub path: String,
    /// `None`: deleted.
    pub content: Option<String>,
    pub by: By,
}

/// One read of the store's index (a listing page or a versions page):
/// whether it was answered, and what the store held when it was.
#[derive(Debug, Clone)]
pub struct IndexRead {
    pub at: tokio::time::Instant,
    pub answered: bool,
    /// path (without `/`) → content, when answered.
    pub held: BTreeMap<String, String>,
}

#[derive(Default)]
struct Inner {
    stores: Stores,
    calls: Vec<Call>,
    faults: VecDeque<(Op, Option<String>, Fault)>,
    next_id: u64,
    max_content: Option<usize>,
    extra_items: Vec<MemoryListItem>,
    in_flight: usize,
    peak: usize,
    applied: Vec<(tokio::time::Instant, Call)>,
    /// Every call of an op waits this long first (a slow server).
    latency: Vec<(Op, std::time::Duration)>,
    /// The version log, oldest first.
    log: Vec<Logged>,
    /// Whether `versions` and `list_under` are served.
    feed: bool,
    /// When the fake's server clock reads [`EPOCH_MICROS`].
    origin: Option<tokio::time::Instant>,
    /// How far the `Date` of an answer is off the clock that stamps versions.
    date_skew_micros: i64,
    /// At most this many versions a page, whatever the limit asked.
    versions_page_cap: Option<u32>,
    /// Every change of a memory's content, in order.
    history: Vec<Change>,
    /// Every create and update the worker sent, answered or not: (when,
    /// path without `/`, content).
    sends: Vec<(tokio::time::Instant, String, String)>,
    /// Every read of the index (listings and versions pages).
    reads: Vec<IndexRead>,
    /// The next creates and updates wait this long each, in order.
    slow_writes: VecDeque<std::time::Duration>,
}

impl Inner {
    /// The server's clock, microseconds since the Unix epoch.
    fn clock(&mut self) -> i64 {
        let origin = *self.origin.get_or_insert_with(tokio::time::Instant::now);
        EPOCH_MICROS + origin.elapsed().as_micros() as i64
    }

    /// Append a version of `memory_id` stamped `backdate_micros` before now.
    fn record(
        &mut self,
        store: &str,
        memory_id: &str,
        operation: MemoryOperation,
        path: &str,
        content: Option<&str>,
        backdate_micros: i64,
    ) {
        let created_at = self.clock() - backdate_micros;
        self.next_id += 1;
        let id = format!("memver_{}", self.next_id);
        self.log.push(Logged {
            id,
            store: store.into(),
            memory_id: memory_id.into(),
            operation,
            path: Some(path.into()),
            sha: content.map(sha),
            size: content.map(|c| c.len() as u64),
            created_at,
            redacted_at: None,
        });
    }

    /// Change a path out of band: a version stamped `backdate_micros` early.
    fn put(&mut self, store: &str, path: &str, content: &str, backdate_micros: i64) {
        let path = format!("/{}", path.trim_start_matches('/'));
        self.next_id += 1;
        let fresh = format!("mem_{}", self.next_id);
        let memories = self.stores.get_mut(store).unwrap();
        let (id, op) = match memories.get_mut(&path) {
            Some(m) if m.content == content => return,
            Some(m) => {
                m.content = content.into();
                m.version += 1;
                (m.id.clone(), MemoryOperation::Modified)
            }
            None => {
                memories.insert(
                    path.clone(),
                    Stored {
                        id: fresh.clone(),
                        content: content.into(),
                        version: 1,
                    },
                );
                (fresh, MemoryOperation::Created)
            }
        };
        self.record(store, &id, op, &path, Some(content), backdate_micros);
        self.changed(store, &path, Some(content), By::Remote);
    }

    /// Log a change of the memory at `path` (with or without its `/`).
    fn changed(&mut self, store: &str, path: &str, content: Option<&str>, by: By) {
        self.history.push(Change {
            at: tokio::time::Instant::now(),
            store: store.into(),
            path: path.trim_start_matches('/').into(),
            content: content.map(str::to_string),
            by,
        });
    }

    /// Log a read of the index of `store`.
    fn read(&mut self, store: &str, answered: bool) {
        let held = self
            .stores
            .get(store)
            .map(|s| {
                s.iter()
                    .map(|(p, m)| (p.trim_start_matches('/').to_string(), m.content.clone()))
                    .collect()
            })
            .unwrap_or_default();
        self.reads.push(IndexRead {
            at: tokio::time::Instant::now(),
            answered,
            held,
        });
    }
}

#[derive(Default)]
pub struct FakeMemory {
    inner: Mutex<Inner>,
}

fn status(code: u16, kind: &str) -> Error {
    Error::Api(ApiError {
        status: code,
        kind: kind.into(),
        message: format!("fake {code}"),
        request_id: None,
        details: None,
        retry_after_ms: None,
    })
}

impl FakeMemory {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Create a store with memories (paths with or without the leading `/`).
    pub fn store(&self, id: &str, memories: &[(&str, &str)]) {
        let mut inner = self.lock();
        inner.stores.entry(id.into()).or_default();
        for (path, content) in memories {
            let path = format!("/{}", path.trim_start_matches('/'));
            inner.next_id += 1;
            let mid = format!("mem_{}", inner.next_id);
            inner.stores.get_mut(id).unwrap().insert(
                path.clone(),
                Stored {
                    id: mid.clone(),
                    content: content.to_string(),
                    version: 1,
                },
            );
            inner.record(id, &mid, MemoryOperation::Created, &path, Some(content), 0);
        }
    }

    /// Change the server out of band (as another writer).
    pub fn put(&self, store: &str, path: &str, content: &str) {
        self.lock().put(store, path, content, 0);
    }

    /// Change the server out of band with a version committed late: its
    /// `created_at` is `backdate` before the server's clock (a write that
    /// started then and became visible only now). It is still the memory's
    /// newest version: the head is what committed last.
    pub fn put_late(&self, store: &str, path: &str, content: &str, backdate: std::time::Duration) {
        self.lock()
            .put(store, path, content, backdate.as_micros() as i64);
    }

    pub fn remove(&self, store: &str, path: &str) {
        let path = format!("/{}", path.trim_start_matches('/'));
        let mut inner = self.lock();
        if let Some(m) = inner.stores.get_mut(store).unwrap().remove(&path) {
            inner.record(store, &m.id, MemoryOperation::Deleted, &path, None, 0);
            inner.changed(store, &path, None, By::Remote);
        }
    }

    /// Every change of the memories' contents so far, in order.
    pub fn history(&self) -> Vec<Change> {
        self.lock().history.clone()
    }

    /// Every create and update the worker sent so far (answered or not):
    /// (when, path without `/`, content).
    pub fn sends(&self) -> Vec<(tokio::time::Instant, String, String)> {
        self.lock().sends.clone()
    }

    /// How many creates and updates the worker has sent so far.
    pub fn writes_sent(&self) -> usize {
        self.lock().sends.len()
    }

    /// Every read of an index so far (listings and versions pages).
    pub fn reads(&self) -> Vec<IndexRead> {
        self.lock().reads.clone()
    }

    /// Serve the version history and the listings by prefix and depth.
    pub fn serve_feed(&self) {
        self.lock().feed = true;
    }

    /// The `Date` of every answer is off the version clock by `skew`
    /// (positive: ahead), as a front end's clock may be off the database's.
    pub fn skew_date(&self, skew_micros: i64) {
        self.lock().date_skew_micros = skew_micros;
    }

    /// Serve at most `cap` versions a page (as the API caps `view=full`
    /// listings), so that a few changes make the feed read several pages.
    pub fn cap_versions_page(&self, cap: u32) {
        self.lock().versions_page_cap = Some(cap);
    }

    /// Redact the newest version of the store that is not the head of a
    /// live memory (the devserver refuses to redact a head); whether there
    /// was one.
    pub fn redact_newest(&self, store: &str) -> bool {
        let mut inner = self.lock();
        let live: std::collections::HashSet<String> = inner
            .stores
            .get(store)
            .map(|s| s.values().map(|m| m.id.clone()).collect())
            .unwrap_or_default();
        let now = inner.clock();
        let log = &mut inner.log;
        let head_of = |i: usize, log: &[Logged]| {
            live.contains(&log[i].memory_id)
                && !log[i + 1..].iter().any(|l| l.memory_id == log[i].memory_id)
        };
        let Some(at) = (0..log.len())
            .rev()
            .find(|&i| log[i].store == store && log[i].redacted_at.is_none() && !head_of(i, log))
        else {
            return false;
        };
        let v = &mut log[at];
        v.redacted_at = Some(now);
        v.path = None;
        v.sha = None;
        v.size = None;
        true
    }

    /// path → content of a store.
    pub fn contents(&self, store: &str) -> BTreeMap<String, String> {
        self.lock().stores[store]
            .iter()
            .map(|(p, m)| (p.clone(), m.content.clone()))
            .collect()
    }

    pub fn get(&self, store: &str, path: &str) -> Option<String> {
        let path = format!("/{}", path.trim_start_matches('/'));
        self.lock().stores[store]
            .get(&path)
            .map(|m| m.content.clone())
    }

    /// Every call so far, then forget them.
    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.lock().calls)
    }

    pub fn take_writes(&self) -> Vec<Call> {
        self.take_calls()
            .into_iter()
            .filter(Call::is_write)
            .collect()
    }

    /// The next call of `op` (on `path`, if given) meets `fault`.
    pub fn fault(&self, op: Op, path: Option<&str>, fault: Fault) {
        let path = path.map(|p| format!("/{}", p.trim_start_matches('/')));
        self.lock().faults.push_back((op, path, fault));
    }

    /// Every write that took effect on the server (whatever its caller
    /// heard), with the time it was sent (a slow one lands later).
    pub fn applied(&self) -> Vec<(tokio::time::Instant, Call)> {
        self.lock().applied.clone()
    }

    /// Every later call of `op` waits `delay` (tokio time) before it is
    /// answered, as a slow server's; zero takes it away.
    pub fn latency(&self, op: Op, delay: std::time::Duration) {
        let mut inner = self.lock();
        inner.latency.retain(|(o, _)| *o != op);
        inner.latency.push((op, delay));
    }

    /// The next `n` creates and updates (whichever come) each wait `delay`
    /// (tokio time) before they are served: uploads that stay in flight.
    pub fn slow_next_writes(&self, n: usize, delay: std::time::Duration) {
        self.lock()
            .slow_writes
            .extend(std::iter::repeat_n(delay, n));
    }

    /// Drop every fault not yet triggered.
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// The most creates and updates that were in flight at once.
    pub fn peak_uploads(&self) -> usize {
        self.lock().peak
    }

    fn enter(&self) {
        let mut inner = self.lock();
        inner.in_flight += 1;
        inner.peak = inner.peak.max(inner.in_flight);
    }

    fn leave(&self) {
        self.lock().in_flight -= 1;
    }

    /// Add a raw item (a prefix, a future type) to every first page.
    pub fn list_item(&self, item: MemoryListItem) {
        self.lock().extra_items.push(item);
    }

    /// Refuse content over `bytes` with 413.
    pub fn max_content(&self, bytes: usize) {
        self.lock().max_content = Some(bytes);
    }

    fn take_fault(&self, op: Op, path: Option<&str>) -> Option<Fault> {
        let mut inner = self.lock();
        let at = inner
            .faults
            .iter()
            .position(|(o, p, _)| *o == op && (p.is_none() || p.as_deref() == path))?;
        inner.faults.remove(at).map(|(_, _, f)| f)
    }

    fn memory(store: &str, path: &str, m: &Stored, with_content: bool) -> Memory {
        Memory {
            id: m.id.clone(),
            object_type: "memory".into(),
            memory_store_id: store.into(),
            path: path.into(),
            content: with_content.then(|| m.content.clone()),
            content_sha256: sha(&m.content),
            content_size_bytes: m.content.len() as u64,
            memory_version_id: format!("memver_{}_{}", m.id, m.version),
            created_at: chrono::DateTime::UNIX_EPOCH,
            updated_at: chrono::DateTime::UNIX_EPOCH,
        }
    }

    fn path_of(&self, store: &str, id: &str) -> Option<String> {
        self.lock()
            .stores
            .get(store)?
            .iter()
            .find(|(_, m)| m.id == id)
            .map(|(p, _)| p.clone())
    }

    /// One page of the memories under `prefix` in path order, as the
    /// devserver lists them: with `rollup`, a folder below the prefix is
    /// one `memory_prefix` item; the cursor is `after_<path>` (strictly
    /// after a memory) or `from_<path>` (at or after the end of a folder).
    fn listing(
        &self,
        store: &str,
        view: View,
        limit: u32,
        prefix: &str,
        rollup: bool,
        page: Option<String>,
    ) -> Result<Page<MemoryListItem>, Error> {
        let inner = self.lock();
        let Some(memories) = inner.stores.get(store) else {
            return Err(status(404, "not_found_error"));
        };
        let limit = if view == View::Full {
            limit.min(20)
        } else {
            limit
        } as usize;
        // The least string above every path under a folder (`/a/` → `/a0`).
        let upper = |folder: &str| format!("{}0", &folder[..folder.len() - 1]);
        let first = page.as_deref().is_none_or(str::is_empty);
        let (strict, lower) = match page.as_deref().filter(|p| !p.is_empty()) {
            None => (false, prefix.to_string()),
            Some(p) => match (p.strip_prefix("after_"), p.strip_prefix("from_")) {
                (Some(after), _) => (true, after.to_string()),
                (_, Some(from)) => (false, from.to_string()),
                _ => return Err(status(400, "invalid_request_error")),
            },
        };
        let end = upper(prefix);
        let mut items: Vec<MemoryListItem> = Vec::new();
        let mut cursors: Vec<String> = Vec::new();
        for (path, m) in memories.range(lower.clone()..) {
            if path.as_str() >= end.as_str() {
                break;
            }
            if strict && *path == lower {
                continue;
            }
            if rollup && let Some(slash) = path[prefix.len()..].find('/') {
                let folder = path[..prefix.len() + slash + 1].to_string();
                if matches!(items.last(), Some(MemoryListItem::Prefix(p)) if p.path == folder) {
                    continue;
                }
                cursors.push(format!("from_{}", upper(&folder)));
                items.push(MemoryListItem::Prefix(MemoryPrefix {
                    object_type: "memory_prefix".into(),
                    path: folder,
                }));
            } else {
                cursors.push(format!("after_{path}"));
                items.push(MemoryListItem::Memory(Self::memory(
                    store,
                    path,
                    m,
                    view == View::Full,
                )));
            }
            if items.len() > limit {
                break;
            }
        }
        let next_page = (items.len() > limit).then(|| cursors[limit - 1].clone());
        items.truncate(limit);
        if first && prefix == "/" {
            items.extend(inner.extra_items.iter().cloned());
        }
        Ok(Page {
            data: items,
            next_page,
        })
    }

    /// Apply a fault that comes before the answer; `Some(result)` ends the call.
    /// The flag asks the caller to apply the change and then fail: `Some(code)`.
    async fn pre<T>(&self, op: Op, path: Option<&str>) -> (Option<Result<T, Error>>, Option<u16>) {
        let slow = {
            let mut inner = self.lock();
            let queued = match op {
                Op::Create | Op::Update => inner.slow_writes.pop_front(),
                _ => None,
            };
            queued.or_else(|| inner.latency.iter().find(|(o, _)| *o == op).map(|l| l.1))
        };
        if let Some(delay) = slow {
            tokio::time::sleep(delay).await;
        }
        let fault = self.take_fault(op, path);
        match fault {
            Some(Fault::Status(code)) => (Some(Err(status(code, "injected"))), None),
            Some(Fault::Before(f)) => {
                f(&mut self.lock().stores);
                (None, None)
            }
            Some(Fault::Delay(d)) => {
                tokio::time::sleep(d).await;
                (None, None)
            }
            Some(Fault::LoseResponse) => (None, Some(502)),
            Some(Fault::ApplyThen(code)) => (None, Some(code)),
            None => (None, None),
        }
    }
}

/// A version as the `basic` view answers it (no content).
fn version_json(v: &Logged) -> MemoryVersion {
    let micros = |t: i64| {
        chrono::DateTime::from_timestamp_micros(t)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    };
    let operation = match v.operation {
        MemoryOperation::Created => "created",
        MemoryOperation::Modified => "modified",
        MemoryOperation::Deleted => "deleted",
    };
    // Through JSON: the redaction fields are the client's own.
    serde_json::from_value(serde_json::json!({
        "id": v.id, "type": "memory_version", "memory_id": v.memory_id,
        "memory_store_id": v.store, "operation": operation, "path": v.path,
        "content": null, "content_sha256": v.sha, "content_size_bytes": v.size,
        "created_by": {"type": "api_actor", "api_key_id": "apikey_fake"},
        "created_at": micros(v.created_at),
        "redacted_at": v.redacted_at.map(micros),
        "redacted_by": v.redacted_at.map(|_| serde_json::json!({"type": "user_actor", "user_id": "user_fake"})),
    }))
    .unwrap()
}

/// The change is applied; the caller hears `code` instead of the answer.
fn lost<T>(result: Result<T, Error>, lose: Option<u16>) -> Result<T, Error> {
    match (result, lose) {
        (Ok(_), Some(code)) => Err(status(code, "after_the_change")),
        (other, _) => other,
    }
}

impl MemoryApi for FakeMemory {
    fn list<'a>(
        &'a self,
        store: &'a str,
        view: View,
        limit: u32,
        page: Option<String>,
    ) -> BoxFuture<'a, Result<Page<MemoryListItem>, Error>> {
        Box::pin(async move {
            self.lock().calls.push(Call::List {
                store: store.into(),
                view,
            });
            if let (Some(r), _) = self.pre(Op::List, None).await {
                self.lock().read(store, false);
                return r;
            }
            let got = self.listing(store, view, limit, "/", false, page);
            self.lock().read(store, got.is_ok());
            got
        })
    }

    fn list_under<'a>(
        &'a self,
        store: &'a str,
        view: View,
        limit: u32,
        prefix: Option<&'a str>,
        depth: Option<u32>,
        page: Option<String>,
    ) -> BoxFuture<'a, Result<Page<MemoryListItem>, Error>> {
        if !self.lock().feed {
            // The trait's default: a client without prefix listings.
            if prefix.is_none() && depth.is_none() {
                return self.list(store, view, limit, page);
            }
            return Box::pin(async { Err(Error::Config("no prefix listings".into())) });
        }
        Box::pin(async move {
            self.lock().calls.push(Call::ListUnder {
                prefix: prefix.map(str::to_string),
                depth,
            });
            if let (Some(r), _) = self.pre(Op::ListUnder, prefix).await {
                self.lock().read(store, false);
                return r;
            }
            // As the devserver: depth 0 or absent is recursive, 1 rolls up
            // folders into prefixes, anything else is refused; a prefix
            // starts and ends with `/`.
            let rollup = match depth {
                None | Some(0) => false,
                Some(1) => true,
                Some(_) => return Err(status(400, "invalid_request_error")),
            };
            let prefix = prefix.unwrap_or("/");
            if !prefix.starts_with('/') || !prefix.ends_with('/') || prefix.contains("//") {
                return Err(status(400, "invalid_request_error"));
            }
            let got = self.listing(store, view, limit, prefix, rollup, page);
            self.lock().read(store, got.is_ok());
            got
        })
    }

    fn versions<'a>(
        &'a self,
        store: &'a str,
        since_micros: Option<i64>,
        limit: u32,
        page: Option<String>,
    ) -> BoxFuture<'a, Result<VersionsPage, Error>> {
        if !self.lock().feed {
            return Box::pin(async { Err(Error::Config("no version history".into())) });
        }
        Box::pin(async move {
            self.lock().calls.push(Call::Versions { since_micros });
            let (early, lose) = self.pre(Op::Versions, None).await;
            if let Some(r) = early {
                self.lock().read(store, false);
                return r;
            }
            let mut inner = self.lock();
            if !inner.stores.contains_key(store) {
                return Err(status(404, "not_found_error"));
            }
            if !(1..=100).contains(&limit) {
                return Err(status(400, "invalid_request_error"));
            }
            // The devserver's cursor: the position (`seq`) of the last
            // version served; the next page starts strictly before it.
            let before = match page.as_deref().filter(|p| !p.is_empty()) {
                None => inner.log.len(),
                Some(p) => p
                    .strip_prefix("before_")
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| status(400, "invalid_request_error"))?,
            };
            let limit = inner.versions_page_cap.unwrap_or(limit).min(limit) as usize;
            // Newest first in commit order, `created_at >= since`.
            let rows: Vec<(usize, &Logged)> = inner.log[..before.min(inner.log.len())]
                .iter()
                .enumerate()
                .rev()
                .filter(|(_, v)| v.store == store)
                .filter(|(_, v)| since_micros.is_none_or(|t| v.created_at >= t))
                .take(limit + 1)
                .collect();
            let next_page = (rows.len() > limit).then(|| format!("before_{}", rows[limit - 1].0));
            let data = rows
                .iter()
                .take(limit)
                .map(|(_, v)| version_json(v))
                .collect();
            // `Date` is whole seconds (HTTP dates have no fraction), and
            // may be off the clock that stamps the versions.
            let date = inner.clock() + inner.date_skew_micros;
            let date = date - date.rem_euclid(1_000_000);
            let got = lost(Ok((Page { data, next_page }, Some(date))), lose);
            inner.read(store, got.is_ok());
            got
        })
    }

    fn retrieve<'a>(&'a self, store: &'a str, id: &'a str) -> BoxFuture<'a, Result<Memory, Error>> {
        Box::pin(async move {
            let path = self.path_of(store, id);
            self.lock().calls.push(Call::Retrieve {
                path: path.clone().unwrap_or_default(),
            });
            let (early, lose) = self.pre(Op::Retrieve, path.as_deref()).await;
            if let Some(r) = early {
                return r;
            }
            let inner = self.lock();
            let found = inner
                .stores
                .get(store)
                .and_then(|s| s.iter().find(|(_, m)| m.id == id));
            lost(
                found
                    .map(|(p, m)| Self::memory(store, p, m, true))
                    .ok_or_else(|| status(404, "not_found_error")),
                lose,
            )
        })
    }

    fn create<'a>(
        &'a self,
        store: &'a str,
        path: &'a str,
        content: &'a str,
    ) -> BoxFuture<'a, Result<Memory, Error>> {
        Box::pin(async move {
            let called = tokio::time::Instant::now();
            {
                let mut inner = self.lock();
                inner.calls.push(Call::Create {
                    path: path.into(),
                    content: content.into(),
                });
                let at = called;
                inner
                    .sends
                    .push((at, path.trim_start_matches('/').into(), content.into()));
            }
            self.enter();
            let (early, lose) = self.pre(Op::Create, Some(path)).await;
            self.leave();
            if let Some(r) = early {
                return r;
            }
            let mut inner = self.lock();
            if inner.max_content.is_some_and(|max| content.len() > max) {
                return Err(status(413, "request_too_large"));
            }
            inner.next_id += 1;
            let id = format!("mem_{}", inner.next_id);
            let memories = inner
                .stores
                .get_mut(store)
                .ok_or_else(|| status(404, "not_found_error"))?;
            if memories.contains_key(path) {
                return Err(status(409, "memory_path_conflict_error"));
            }
            let stored = Stored {
                id,
                content: content.into(),
                version: 1,
            };
            let memory = Self::memory(store, path, &stored, false);
            let id = stored.id.clone();
            memories.insert(path.into(), stored);
            inner.record(store, &id, MemoryOperation::Created, path, Some(content), 0);
            inner.changed(store, path, Some(content), By::Worker);
            let call = Call::Create {
                path: path.into(),
                content: content.into(),
            };
            inner.applied.push((called, call));
            lost(Ok(memory), lose)
        })
    }

    fn update<'a>(
        &'a self,
        store: &'a str,
        id: &'a str,
        content: &'a str,
        expected: &'a str,
    ) -> BoxFuture<'a, Result<Memory, Error>> {
        Box::pin(async move {
            let path = self.path_of(store, id);
            let called = tokio::time::Instant::now();
            {
                let mut inner = self.lock();
                inner.calls.push(Call::Update {
                    path: path.clone().unwrap_or_default(),
                    content: content.into(),
                    expected: expected.into(),
                });
                let rel = path.as_deref().unwrap_or_default().trim_start_matches('/');
                inner.sends.push((called, rel.into(), content.into()));
            }
            self.enter();
            let (early, lose) = self.pre(Op::Update, path.as_deref()).await;
            self.leave();
            if let Some(r) = early {
                return r;
            }
            let mut inner = self.lock();
            if inner.max_content.is_some_and(|max| content.len() > max) {
                return Err(status(413, "request_too_large"));
            }
            let Some((p, m)) = inner
                .stores
                .get_mut(store)
                .and_then(|s| s.iter_mut().find(|(_, m)| m.id == id))
            else {
                return Err(status(404, "not_found_error"));
            };
            if sha(&m.content) != expected && m.content != content {
                return Err(status(409, "memory_precondition_failed_error"));
            }
            let changed = m.content != content;
            if changed {
                m.content = content.into();
                m.version += 1;
            }
            let memory = Self::memory(store, p, m, false);
            let call = Call::Update {
                path: p.clone(),
                content: content.into(),
                expected: expected.into(),
            };
            if changed {
                let path = p.clone();
                inner.record(
                    store,
                    id,
                    MemoryOperation::Modified,
                    &path,
                    Some(content),
                    0,
                );
                inner.changed(store, &path, Some(content), By::Worker);
            }
            inner.applied.push((called, call));
            lost(Ok(memory), lose)
        })
    }

    fn delete<'a>(
        &'a self,
        store: &'a str,
        id: &'a str,
        expected: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let path = self.path_of(store, id);
            self.lock().calls.push(Call::Delete {
                path: path.clone().unwrap_or_default(),
                expected: expected.into(),
            });
            let (early, lose) = self.pre(Op::Delete, path.as_deref()).await;
            if let Some(r) = early {
                return r;
            }
            let mut inner = self.lock();
            let Some(memories) = inner.stores.get_mut(store) else {
                return Err(status(404, "not_found_error"));
            };
            let Some(path) = memories
                .iter()
                .find(|(_, m)| m.id == id)
                .map(|(p, _)| p.clone())
            else {
                return Err(status(404, "not_found_error"));
            };
            if sha(&memories[&path].content) != expected {
                return Err(status(409, "memory_precondition_failed_error"));
            }
            memories.remove(&path);
            inner.record(store, id, MemoryOperation::Deleted, &path, None, 0);
            inner.changed(store, &path, None, By::Worker);
            let call = Call::Delete {
                path,
                expected: expected.into(),
            };
            inner.applied.push((tokio::time::Instant::now(), call));
            lost(Ok(()), lose)
        })
    }
}
