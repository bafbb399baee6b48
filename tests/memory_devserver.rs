//! The memory engine against the devserver over real HTTP, with the
//! credential a worker really has: the sessions token from a polled work
//! item's secret.

mod common;

use std::sync::Arc;

use base64::Engine;
use common::TestServer;
use common::harness::Logs;
use envworker::api::types::{PollWork, SessionResource};
use envworker::api::{Client, Credential};
use envworker::devserver::DevserverConfig;
use envworker::memory::SessionMemoryStores;
use envworker::memory::options::{DeleteMode, SyncInterval};
use reqwest::Method;
use serde_json::{Value, json};

struct Served {
    s: TestServer,
    _mnt: tempfile::TempDir,
    stores: SessionMemoryStores,
    mounts: Vec<std::path::PathBuf>,
    notes: String,
    kb: String,
    session: String,
}

/// A scenario-made session with a writable and a read-only store, claimed
/// like a worker claims it, its stores downloaded with the sessions token.
async fn served() -> Served {
    let mnt = tempfile::tempdir().unwrap();
    let s = TestServer::start_with(
        DevserverConfig::new(common::ADMIN_KEY)
            .mount_root(mnt.path().join("memory").to_str().unwrap()),
    )
    .await;
    let started = s
        .start_scenario(&json!({"name": "engine", "memory_stores": [
            {"key": "notes", "name": "Notes", "memories": {"/a.md": "a1", "/dir/b.md": "b1", "/gone.md": "g"}},
            {"key": "kb", "name": "KB", "access": "read_only", "memories": {"/faq.md": "f1"}}
        ]}))
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
        .map(|m| std::path::PathBuf::from(m.mount_path.clone().unwrap()))
        .collect();
    let mut stores = SessionMemoryStores::new(
        Arc::new(client),
        mnt.path(),
        SyncInterval::default(),
        DeleteMode::Enabled,
    );
    stores.download(&session).await.unwrap();
    Served {
        s,
        _mnt: mnt,
        stores,
        mounts,
        notes: ids[0].clone(),
        kb: ids[1].clone(),
        session: started.session_id,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_sync_and_finish_over_http_with_a_sessions_token() {
    let t = served().await;
    let notes = &t.mounts[0];
    assert_eq!(
        std::fs::read_to_string(notes.join("dir/b.md")).unwrap(),
        "b1"
    );
    assert_eq!(
        std::fs::read_to_string(t.mounts[1].join("faq.md")).unwrap(),
        "f1"
    );
    assert!(notes.ends_with("memory/notes"));

    std::fs::write(notes.join("a.md"), "a2 from the agent").unwrap();
    std::fs::write(notes.join("new.md"), "created by the agent").unwrap();
    std::fs::remove_file(notes.join("gone.md")).unwrap();
    std::fs::write(t.mounts[1].join("faq.md"), "edited in a read-only store").unwrap();
    // Another writer edits b.md through the API meanwhile.
    let b =
        t.s.list_all(&format!(
            "/v1/memory_stores/{}/memories?path_prefix=/dir/",
            t.notes
        ))
        .await
        .0;
    t.s.memory(
        Method::POST,
        &format!(
            "/v1/memory_stores/{}/memories/{}",
            t.notes,
            b[0]["id"].as_str().unwrap()
        ),
        Some(json!({"content": "b2 remote"})),
    )
    .await
    .ok();

    t.stores.sync_now().await;
    assert_eq!(
        std::fs::read_to_string(notes.join("dir/b.md")).unwrap(),
        "b2 remote"
    );
    t.stores.finish().await.unwrap();
    assert_eq!(
        t.s.store_memories(&t.notes).await,
        [
            ("/a.md", "a2 from the agent"),
            ("/dir/b.md", "b2 remote"),
            ("/new.md", "created by the agent")
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
    );
    assert_eq!(
        t.s.store_memories(&t.kb)
            .await
            .get("/faq.md")
            .map(String::as_str),
        Some("f1"),
        "read-only: never pushed"
    );

    // The agent's writes are recorded as the session's.
    let versions =
        t.s.memory(
            Method::GET,
            &format!(
                "/v1/memory_stores/{}/memory_versions?session_id={}",
                t.notes, t.session
            ),
            None,
        )
        .await
        .ok();
    let ops: Vec<&str> = versions["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["operation"].as_str().unwrap())
        .collect();
    assert_eq!(ops.len(), 3, "{versions:#}");
    assert!(ops.contains(&"deleted") && ops.contains(&"created") && ops.contains(&"modified"));

    t.stores.dispose().await;
    assert!(!notes.exists() && !t.mounts[1].exists());
}

/// Single-threaded, so that every log line lands in this thread's capture.
#[tokio::test]
async fn the_devservers_refusals_are_remembered_and_warned_once() {
    let logs = Logs::capture();
    let t = served().await;
    let notes = &t.mounts[0];
    std::fs::write(notes.join("huge.md"), "x".repeat(102_401)).unwrap();
    std::fs::write(
        notes.join("bad\u{200b}name.md"),
        "a format character in the path",
    )
    .unwrap();
    std::fs::write(notes.join("fine.md"), "fine").unwrap();
    for _ in 0..3 {
        t.stores.sync_now().await;
    }
    let held = t.s.store_memories(&t.notes).await;
    assert_eq!(held.get("/fine.md").map(String::as_str), Some("fine"));
    assert!(!held.contains_key("/huge.md"));
    assert!(!held.keys().any(|k| k.contains("name.md")));
    let refused = |name: &str| {
        logs.text()
            .lines()
            .filter(|l| l.contains("the server rejected this memory file") && l.contains(name))
            .count()
    };
    assert_eq!(refused("huge.md"), 1, "warned once: {}", logs.text());
    assert_eq!(refused("name.md"), 1, "warned once: {}", logs.text());
}
