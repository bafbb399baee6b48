//! An in-process memory store server for the sync tests that must inject a
//! failure at an exact point (a lost response, a 409 race, a deletion
//! between listing and fetch). It follows the devserver's rules for the calls
//! the sync makes, and records every request.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use envworker::api::types::{Memory, MemoryListItem, Page, View};
use envworker::api::{ApiError, Error};
use envworker::memory::remote::MemoryApi;
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
}

impl Fault {
    pub fn before(f: impl Fn(&mut Stores) + Send + Sync + 'static) -> Fault {
        Fault::Before(std::sync::Arc::new(f))
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
}

#[derive(Debug, Clone)]
pub struct Stored {
    pub id: String,
    pub content: String,
    pub version: u64,
}

/// store id → path (with `/`) → memory.
pub type Stores = BTreeMap<String, BTreeMap<String, Stored>>;

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
                path,
                Stored {
                    id: mid,
                    content: content.to_string(),
                    version: 1,
                },
            );
        }
    }

    /// Change the server out of band (as another writer).
    pub fn put(&self, store: &str, path: &str, content: &str) {
        let mut inner = self.lock();
        let path = format!("/{}", path.trim_start_matches('/'));
        inner.next_id += 1;
        let fresh = format!("mem_{}", inner.next_id);
        let memories = inner.stores.get_mut(store).unwrap();
        match memories.get_mut(&path) {
            Some(m) => {
                m.content = content.into();
                m.version += 1;
            }
            None => {
                memories.insert(
                    path,
                    Stored {
                        id: fresh,
                        content: content.into(),
                        version: 1,
                    },
                );
            }
        }
    }

    pub fn remove(&self, store: &str, path: &str) {
        let path = format!("/{}", path.trim_start_matches('/'));
        self.lock().stores.get_mut(store).unwrap().remove(&path);
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

    /// Every write that took effect on the server (whatever its caller heard), with its time.
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

    /// Apply a fault that comes before the answer; `Some(result)` ends the call.
    /// The flag asks the caller to apply the change and then fail: `Some(code)`.
    async fn pre<T>(&self, op: Op, path: Option<&str>) -> (Option<Result<T, Error>>, Option<u16>) {
        let slow = self
            .lock()
            .latency
            .iter()
            .find(|(o, _)| *o == op)
            .map(|l| l.1);
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
                return r;
            }
            let inner = self.lock();
            let Some(memories) = inner.stores.get(store) else {
                return Err(status(404, "not_found_error"));
            };
            let limit = if view == View::Full {
                limit.min(20)
            } else {
                limit
            } as usize;
            let start = page.as_deref().map(str::to_string);
            let items: Vec<(&String, &Stored)> = memories
                .iter()
                .filter(|(p, _)| start.as_ref().is_none_or(|s| p.as_str() > s.as_str()))
                .take(limit + 1)
                .collect();
            let next = (items.len() > limit).then(|| items[limit - 1].0.clone());
            let mut data: Vec<MemoryListItem> = items
                .into_iter()
                .take(limit)
                .map(|(p, m)| MemoryListItem::Memory(Self::memory(store, p, m, view == View::Full)))
                .collect();
            if start.is_none() {
                data.extend(inner.extra_items.iter().cloned());
            }
            Ok(Page {
                data,
                next_page: next,
            })
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
            self.lock().calls.push(Call::Create {
                path: path.into(),
                content: content.into(),
            });
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
            memories.insert(path.into(), stored);
            let call = Call::Create {
                path: path.into(),
                content: content.into(),
            };
            inner.applied.push((tokio::time::Instant::now(), call));
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
            self.lock().calls.push(Call::Update {
                path: path.clone().unwrap_or_default(),
                content: content.into(),
                expected: expected.into(),
            });
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
            if m.content != content {
                m.content = content.into();
                m.version += 1;
            }
            let memory = Self::memory(store, p, m, false);
            let call = Call::Update {
                path: p.clone(),
                content: content.into(),
                expected: expected.into(),
            };
            inner.applied.push((tokio::time::Instant::now(), call));
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
            let call = Call::Delete {
                path,
                expected: expected.into(),
            };
            inner.applied.push((tokio::time::Instant::now(), call));
            lost(Ok(()), lose)
        })
    }
}
