//! A session's memory stores over the in-process fake: set up, poke the disk
//! and the server, sync, and read the logs.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use envworker::api::types::{Access, Session};
use envworker::memory::SessionMemoryStores;
use envworker::memory::options::{DeleteMode, SyncInterval};
use envworker::memory::store::MARKER_PATH;
use serde_json::json;

use super::fake_memory::FakeMemory;

/// A session object with these memory store resources:
/// `(store id, access, mount_path, name)`.
pub fn session(resources: &[(&str, Access, Option<&str>, &str)]) -> Session {
    let resources: Vec<_> = resources
        .iter()
        .map(|(id, access, mount, name)| {
            json!({"type": "memory_store", "memory_store_id": id, "access": access.as_str(),
                   "mount_path": mount, "name": name})
        })
        .collect();
    serde_json::from_value(json!({
        "id": "sesn_test", "type": "session", "status": "running", "environment_id": "env_test",
        "agent": {"tools": [], "skills": []}, "resources": resources, "metadata": {},
        "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"
    }))
    .unwrap()
}

pub struct H {
    pub fake: Arc<FakeMemory>,
    pub dir: tempfile::TempDir,
    pub stores: SessionMemoryStores,
    deletions: DeleteMode,
    /// The session the stores were downloaded for (for a remount).
    session: Option<Session>,
}

/// One store of a harness: id, access, initial memories.
pub type Spec<'a> = (&'a str, Access, &'a [(&'a str, &'a str)]);

impl H {
    /// Stores on the fake, mounted at `<tmp>/mnt/<id>`, downloaded.
    pub async fn new(specs: &[Spec<'_>], deletions: DeleteMode) -> H {
        let h = H::prepare(specs, deletions);
        H::download(h, specs).await
    }

    /// Like [`H::new`] (deletes enabled), with the change-driven push
    /// running and the periodic sync due every `interval`: real time, the
    /// push's debounce runs on the clock.
    pub async fn pushing(specs: &[Spec<'_>], interval: SyncInterval) -> H {
        let mut h = H::prepare(specs, DeleteMode::Enabled);
        h.stores = SessionMemoryStores::new(
            h.fake.clone(),
            &h.dir.path().join("work"),
            interval,
            DeleteMode::Enabled,
        )
        .with_state_dir(Some(&h.dir.path().join("state")))
        .with_push(true);
        H::download(h, specs).await
    }

    /// Like [`H::new`], with the folders (and the state) on tmpfs
    /// (`/dev/shm`), where the engine reads memories on its own task;
    /// `None` on a host without one.
    pub async fn in_memory(specs: &[Spec<'_>], deletions: DeleteMode) -> Option<H> {
        let dir = tempfile::tempdir_in("/dev/shm").ok()?;
        let mut h = H::prepare(specs, deletions);
        h.stores = Self::stores_in(&h.fake, dir.path(), deletions);
        h.dir = dir;
        Some(H::download(h, specs).await)
    }

    /// The fake and the stores object, nothing downloaded yet.
    pub fn prepare(specs: &[Spec<'_>], deletions: DeleteMode) -> H {
        let fake = Arc::new(FakeMemory::new());
        for (id, _, memories) in specs {
            fake.store(id, memories);
        }
        let dir = tempfile::tempdir().unwrap();
        let stores = Self::stores_in(&fake, dir.path(), deletions);
        H {
            fake,
            dir,
            stores,
            deletions,
            session: None,
        }
    }

    /// Stores on the fake, in `dir`, journaled under `dir/state` like the
    /// worker's are. Without the background push, whose timing would make
    /// a paused-clock run nondeterministic: a test pushes with `push_now`.
    fn stores_in(fake: &Arc<FakeMemory>, dir: &Path, deletions: DeleteMode) -> SessionMemoryStores {
        SessionMemoryStores::new(
            fake.clone(),
            &dir.join("work"),
            SyncInterval::default(),
            deletions,
        )
        .with_state_dir(Some(&dir.join("state")))
        .without_push()
    }

    /// The worker dies (no final sync, no flush, no dispose: the folders and
    /// their journals stay) and a new one mounts the same session on the
    /// same disk, recovering the folders.
    pub async fn crash_and_remount(&mut self) -> Result<(), envworker::memory::MemoryError> {
        let fresh = Self::stores_in(&self.fake, self.dir.path(), self.deletions);
        drop(std::mem::replace(&mut self.stores, fresh));
        let session = self.session.clone().expect("downloaded before");
        self.stores.download(&session).await
    }

    pub async fn download(mut h: H, specs: &[Spec<'_>]) -> H {
        let mounts: Vec<(String, Access, String)> = specs
            .iter()
            .map(|(id, access, _)| (id.to_string(), *access, h.mount(id).display().to_string()))
            .collect();
        let resources: Vec<(&str, Access, Option<&str>, &str)> = mounts
            .iter()
            .map(|(id, a, m)| (id.as_str(), *a, Some(m.as_str()), id.as_str()))
            .collect();
        let session = session(&resources);
        h.stores.download(&session).await.expect("download");
        h.session = Some(session);
        h.fake.take_calls();
        h
    }

    pub fn mount(&self, store: &str) -> PathBuf {
        self.dir.path().join("mnt").join(store)
    }

    pub fn path(&self, store: &str, rel: &str) -> PathBuf {
        self.mount(store).join(rel)
    }

    pub fn write(&self, store: &str, rel: &str, content: &str) {
        let p = self.path(store, rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    pub fn read(&self, store: &str, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.path(store, rel)).ok()
    }

    pub fn rm(&self, store: &str, rel: &str) {
        std::fs::remove_file(self.path(store, rel)).unwrap();
    }

    /// Every file of the store's folder but the marker: rel → content.
    pub fn disk(&self, store: &str) -> BTreeMap<String, String> {
        fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for e in entries.flatten() {
                let p = e.path();
                let ft = e.file_type().unwrap();
                if ft.is_dir() {
                    walk(base, &p, out);
                } else if ft.is_file() {
                    let rel = p.strip_prefix(base).unwrap().to_string_lossy().to_string();
                    if rel != MARKER_PATH {
                        out.insert(rel, std::fs::read_to_string(&p).unwrap_or_default());
                    }
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(&self.mount(store), &self.mount(store), &mut out);
        out
    }

    /// The server's contents, keyed without the leading `/` like the disk.
    pub fn server(&self, store: &str) -> BTreeMap<String, String> {
        self.fake
            .contents(store)
            .into_iter()
            .map(|(p, c)| (p.trim_start_matches('/').to_string(), c))
            .collect()
    }
}

/// Capture this thread's logs (the async tests run on one thread).
///
/// One global subscriber, installed once per test binary, writes each
/// event into the capture of the thread that emitted it (and drops events
/// of threads that capture nothing). A per-thread default subscriber
/// (`set_default`) would race with tracing's per-callsite interest cache
/// when tests on other threads register the same callsites, and miss lines.
pub struct Logs {
    buf: Arc<Mutex<Vec<u8>>>,
    previous: Option<Arc<Mutex<Vec<u8>>>>,
}

thread_local! {
    static CAPTURE: std::cell::RefCell<Option<Arc<Mutex<Vec<u8>>>>> =
        const { std::cell::RefCell::new(None) };
}

/// Writes into the current thread's capture, if any.
struct Sink;

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        CAPTURE.with(|c| {
            if let Some(buf) = c.borrow().as_ref() {
                buf.lock().unwrap().extend_from_slice(b);
            }
        });
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    pub fn capture() -> Logs {
        static INSTALL: std::sync::Once = std::sync::Once::new();
        INSTALL.call_once(|| {
            let subscriber = tracing_subscriber::fmt()
                .with_writer(|| Sink)
                .with_ansi(false)
                .with_max_level(tracing::Level::DEBUG)
                .finish();
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other global subscriber in a test binary");
        });
        let buf = Arc::new(Mutex::new(Vec::new()));
        let previous = CAPTURE.with(|c| c.borrow_mut().replace(buf.clone()));
        Logs { buf, previous }
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.buf.lock().unwrap()).to_string()
    }

    /// How many log lines contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.text().lines().filter(|l| l.contains(needle)).count()
    }

    pub fn clear(&self) {
        self.buf.lock().unwrap().clear();
    }
}

impl Drop for Logs {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CAPTURE.with(|c| *c.borrow_mut() = previous);
    }
}
