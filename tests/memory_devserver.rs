//! The memory engine against the devserver over real HTTP, with the
//! credential a worker really has: the sessions token from a polled work
//! item's secret.

mod common;

use common::harness::Logs;
use common::memory_served::served;
use reqwest::Method;
use serde_json::json;

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
            t.ids[0]
        ))
        .await
        .0;
    t.s.memory(
        Method::POST,
        &format!(
            "/v1/memory_stores/{}/memories/{}",
            t.ids[0],
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
        t.s.store_memories(&t.ids[0]).await,
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
        t.s.store_memories(&t.ids[1])
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
                t.ids[0], t.session
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
    let held = t.s.store_memories(&t.ids[0]).await;
    assert_eq!(held.get("/fine.md").map(String::as_str), Some("fine"));
    assert!(!held.contains_key("/huge.md"));
    assert!(!held.keys().any(|k| k.contains("name.md")));
    let warned = |name: &str, why: &str| {
        logs.text()
            .lines()
            .filter(|l| l.contains(why) && l.contains(name))
            .count()
    };
    // Over the limit by its stat: refused before it is read or sent.
    let too_large = "larger than a memory may be";
    assert_eq!(warned("huge.md", too_large), 1, "{}", logs.text());
    let rejected = "the server rejected this memory file";
    assert_eq!(warned("huge.md", rejected), 0, "{}", logs.text());
    assert_eq!(warned("name.md", rejected), 1, "{}", logs.text());
}
