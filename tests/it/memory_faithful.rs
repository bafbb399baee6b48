//! Issue 24 for the memory engine, over real HTTP against the devserver:
//! what a user or the API can observe behaves as the reference worker's
//! (`anthropic` 2.10.0, `_memories.py`) does.
//!
//! - A send lost before it reached the server is forgotten once a later
//!   sync has seen the server (and the file) without it: another writer's
//!   identical bytes later are the other writer's, and win.
//! - The change-driven push is opt-in; off, nothing is uploaded between two
//!   syncs. On, it never uploads content the server already holds and it
//!   backs off as long as a `429` asks.
//! - A stuck upload holds neither the teardown's flush nor the periodic sync
//!   hostage, and a flush cut off names what it had not uploaded.
//! - The operator's log lines keep the reference's wording.
//!
//! Single-threaded tests capture their logs (every line lands in this
//! thread's capture); the others run on two threads.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::common::harness::Logs;
use crate::common::memory_served::{Served, served_opts};
use reqwest::Method;
use serde_json::{Value, json};

fn notes() -> Value {
    json!([
        {"key": "notes", "name": "Notes", "memories": {"/a.md": "a0", "/b.md": "b0", "/c.md": "c0"}}
    ])
}

/// The notes store, with the change-driven push running or not.
async fn served_push(push: bool) -> Served {
    served_opts(notes(), None, |s| s.with_push(push)).await
}

async fn server(t: &Served) -> BTreeMap<String, String> {
    t.s.store_memories(&t.ids[0]).await
}

fn write(t: &Served, rel: &str, content: &str) {
    std::fs::write(t.mounts[0].join(rel), content).unwrap();
}

fn read(t: &Served, rel: &str) -> Option<String> {
    std::fs::read_to_string(t.mounts[0].join(rel)).ok()
}

fn writes(t: &Served) -> usize {
    t.calls.writes.load(Ordering::SeqCst)
}

/// The path an update of the memory at `path` is posted to.
async fn update_route(t: &Served, path: &str) -> String {
    let id = t.memory_id(&t.ids[0], path).await;
    format!("/v1/memory_stores/{}/memories/{id}", t.ids[0])
}

/// Another writer (the admin key, straight to the devserver) sets the
/// memory at `path` to `content`.
async fn other_writer(t: &Served, path: &str, content: &str) {
    let route = update_route(t, path).await;
    t.s.memory(Method::POST, &route, Some(json!({ "content": content })))
        .await
        .ok();
}

/// Wait until `done` holds, at most `limit`.
async fn until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done()
}

// ---------------------------------------------------------------- lost sends

/// The sequence of issue 24, item 2: the agent writes v1; the upload never
/// reaches the server (a gateway's 502 on every attempt: nothing commits);
/// the agent reverts the file and a sync sees the server and the file both
/// at a0 (through the version feed, as idle syncs do); later another writer
/// sets the memory to v1 while the agent writes v2. A send is forgotten once
/// a later sync has seen the server (sdk-behaviour.md §3.9): v1 is the other
/// writer's, and the server wins. Before: "an upload of ours cut off in
/// flight landed late; sending the newer edit over it", and v2 replaced v1.
async fn a_lost_send_never_claims_another_writers_identical_edit(via_push: bool) {
    let logs = Logs::capture();
    let t = served_push(false).await;
    let route = update_route(&t, "/a.md").await;
    write(&t, "a.md", "v1");
    // The sync's client tries three times; the push's, once.
    let attempts = if via_push { 1 } else { 3 };
    t.s.add_faults(vec![
        json!({"method": "POST", "path": route, "status": 502, "times": attempts}),
    ])
    .await;
    if via_push {
        t.stores.push_now().await;
    } else {
        t.stores.sync_now().await;
    }
    assert_eq!(server(&t).await["/a.md"], "a0", "the upload never landed");
    t.s.clear_faults().await;
    write(&t, "a.md", "a0");
    t.stores.sync_now().await;
    other_writer(&t, "/a.md", "v1").await;
    write(&t, "a.md", "v2");
    if via_push {
        t.stores.push_now().await;
    }
    t.stores.sync_now().await;
    let text = logs.text();
    assert_eq!(
        server(&t).await["/a.md"],
        "v1",
        "the other writer's edit was overwritten\n{text}"
    );
    assert_eq!(read(&t, "a.md").as_deref(), Some("v1"), "the server wins");
    assert_eq!(logs.count("landed late"), 0, "{text}");
    assert!(
        logs.count("memory changed both locally and remotely") >= 1,
        "the lost edit is warned about\n{text}"
    );
}

#[tokio::test]
async fn a_lost_send_never_claims_another_writers_identical_edit_at_a_sync() {
    a_lost_send_never_claims_another_writers_identical_edit(false).await;
}

#[tokio::test]
async fn a_lost_send_never_claims_another_writers_identical_edit_at_a_push() {
    a_lost_send_never_claims_another_writers_identical_edit(true).await;
}

// ------------------------------------------------------------------ the push

/// The push is opt-in at every level: off by default, the request pattern
/// is the reference's — an edit burst uploads nothing until the next sync,
/// which sends one upload per changed file (one memory version each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_push_off_by_default_nothing_is_uploaded_between_syncs() {
    let options = envworker::worker::WorkerOptions::new("env_x", "http://127.0.0.1:1");
    assert!(!options.memory_push, "the worker's default is no push");
    let t = served_opts(notes(), None, |s| s).await;
    write(&t, "new.md", "n1");
    for round in 1..=4 {
        write(&t, "a.md", &format!("a{round}"));
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(writes(&t), 0, "an upload between syncs");
    assert_eq!(server(&t).await["/a.md"], "a0");
    let report = t.stores.sync_now().await;
    assert_eq!(report.uploads, 2, "{report:?}");
    assert_eq!(writes(&t), 2, "one sync pass: one update and one create");
    let held = server(&t).await;
    assert_eq!(
        (held["/a.md"].as_str(), held["/new.md"].as_str()),
        ("a4", "n1")
    );
}

/// A file whose content another writer has just set identically is
/// adopted without a request, as the reference adopts it: the push reads
/// the version feed before it uploads, and a later sync neither uploads
/// nor fetches it. The next edit goes out guarded by the adopted content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_push_never_uploads_content_the_server_already_holds() {
    let t = served_push(false).await;
    other_writer(&t, "/a.md", "same").await;
    write(&t, "a.md", "same");
    let before = writes(&t);
    assert_eq!(t.stores.push_now().await, 0);
    assert_eq!(writes(&t), before, "an upload of the server's own content");
    let others = t.calls.others.load(Ordering::SeqCst);
    t.stores.sync_now().await;
    assert_eq!(
        t.calls.others.load(Ordering::SeqCst),
        others,
        "the sync fetched or uploaded the adopted file"
    );
    write(&t, "a.md", "next");
    assert_eq!(t.stores.push_now().await, 1);
    assert_eq!(server(&t).await["/a.md"], "next");
}

/// What the devserver's two write rules saw, polled every 20 ms over
/// `limit`: when write requests arrived (one entry per request) and when
/// `429`s were answered, until `429s` of them and a write after the last
/// were seen.
async fn rate_limited_writes(
    t: &Served,
    limit: Duration,
    refusals: usize,
) -> (Vec<Instant>, Vec<Instant>) {
    let (mut writes, mut limited) = (Vec::new(), Vec::new());
    let (mut counted, mut refused): (Option<u64>, Option<u64>) = (None, None);
    let start = Instant::now();
    while start.elapsed() < limit {
        let rules = t.s.faults().await;
        let now = Instant::now();
        let left = |with_status: bool| {
            rules
                .iter()
                .find(|r| r.get("status").is_some() == with_status)
                .and_then(|r| r["times"].as_u64())
        };
        // A rule whose `times` ran out is retired: none left.
        let (count, refuse) = (left(false), left(true).or(Some(0)));
        if let (Some(before), Some(now_left)) = (counted, count) {
            writes.extend(std::iter::repeat_n(now, (before - now_left) as usize));
        }
        if let (Some(before), Some(now_left)) = (refused, refuse) {
            limited.extend(std::iter::repeat_n(now, (before - now_left) as usize));
        }
        counted = count.or(counted);
        refused = refuse.or(refused);
        if limited.len() >= refusals && writes.len() > refusals {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (writes, limited)
}

/// A `429` answer's `retry-after-ms` or `retry-after` is honoured by the
/// push as a whole: after one, no write request of the store goes out
/// before the wait asked for has passed, however busy the agent is (it
/// writes a new file every 150 ms). Before, the client waited inside the
/// one upload that met the `429` while the next push pass sent the other
/// files half a second later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_push_backs_off_as_long_as_a_429_asks() {
    for (header, value, asked) in [("retry-after-ms", "1000", 1.0), ("retry-after", "1", 1.0)] {
        let t = served_push(true).await;
        let route = format!("/v1/memory_stores/{}/memories*", t.ids[0]);
        t.s.add_faults(vec![
            json!({"method": "POST", "path": route, "status": 429, "times": 6,
                   "headers": { header: value }}),
            // No status: it only counts the write requests.
            json!({"method": "POST", "path": route, "times": 1000}),
        ])
        .await;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let agent = {
            let (stop, dir) = (stop.clone(), t.mounts[0].clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    std::fs::write(dir.join(format!("f{n}.md")), "x").unwrap();
                    tokio::time::sleep(Duration::from_millis(150)).await;
                }
            })
        };
        let (writes, limited) = rate_limited_writes(&t, Duration::from_secs(10), 6).await;
        stop.store(true, Ordering::Relaxed);
        agent.await.unwrap();
        assert_eq!(limited.len(), 6, "{header}: {limited:?}");
        assert!(writes.len() > 6, "{header}: nothing written after the 429s");
        for refused in &limited {
            for write in &writes {
                let after = write.saturating_duration_since(*refused).as_secs_f64();
                assert!(
                    after <= 0.1 || after >= asked - 0.15,
                    "{header}: a write request {after:.2}s after a 429 that asked for {asked}s"
                );
            }
        }
    }
}

// -------------------------------------------------------------- stuck uploads

/// The push's update of a.md hangs at the server (a latency fault); then
/// the agent writes two more files and the session ends. Neither the
/// final sync nor the flush waits behind the stuck upload: the other files
/// are on the server after the teardown, the stuck one keeps only its own
/// request bound, and the flush cut off at its bound names it. Before, the
/// flush waited for the push's lock until its bound and sent nothing.
#[tokio::test]
async fn a_stuck_upload_never_holds_the_teardown_hostage() {
    for clean_end in [false, true] {
        let logs = Logs::capture();
        let t = served_push(true).await;
        let route = update_route(&t, "/a.md").await;
        t.s.add_faults(vec![
            json!({"method": "POST", "path": route, "latency_ms": 120_000}),
        ])
        .await;
        write(&t, "a.md", "stuck");
        assert!(
            until(Duration::from_secs(5), || writes(&t) >= 1).await,
            "the push never sent a.md"
        );
        write(&t, "c.md", "written after");
        write(&t, "new.md", "new after");
        let bound = Duration::from_secs(2);
        let started = Instant::now();
        let report = t.stores.teardown(clean_end, bound).await;
        let took = started.elapsed();
        let held = server(&t).await;
        let text = logs.text();
        assert_eq!(
            held["/c.md"], "written after",
            "clean end {clean_end}\n{text}"
        );
        assert_eq!(
            held.get("/new.md").map(String::as_str),
            Some("new after"),
            "{text}"
        );
        assert_eq!(held["/a.md"], "a0", "still stuck");
        assert!(report.flush_cut_off, "{report:?}");
        assert!(took < bound * 3, "the teardown took {took:?}");
        let line = text
            .lines()
            .find(|l| l.contains("memory flush cut off part-way;"))
            .unwrap_or_else(|| panic!("no cut-off line\n{text}"));
        assert!(
            line.contains("1 of ") && line.contains("changed files had not finished uploading"),
            "{line}"
        );
        assert!(line.contains("a.md"), "the stuck file is not named: {line}");
        assert!(!line.contains("c.md"), "{line}");
        assert!(
            line.contains(&format!("memory_store.id={}", t.ids[0])),
            "{line}"
        );
        assert_eq!(
            logs.count(
                "memory flush cut off after 2s; changed files it had not uploaded yet are not saved"
            ),
            1,
            "{text}"
        );
        t.s.clear_faults().await;
    }
}

/// A periodic sync never stalls behind a push upload stuck at the server:
/// it pulls another writer's edit and uploads a new file at once, and
/// leaves the stuck file to its own request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_push_upload_never_stalls_the_periodic_sync() {
    let t = served_push(true).await;
    let route = update_route(&t, "/a.md").await;
    t.s.add_faults(vec![
        json!({"method": "POST", "path": route, "latency_ms": 120_000}),
    ])
    .await;
    write(&t, "a.md", "stuck");
    assert!(until(Duration::from_secs(5), || writes(&t) >= 1).await);
    other_writer(&t, "/b.md", "b-remote").await;
    for round in 0..2 {
        write(&t, "d.md", &format!("d{round}"));
        let synced = tokio::time::timeout(Duration::from_secs(5), t.stores.sync_now()).await;
        assert!(
            synced.is_ok(),
            "round {round}: the sync waited behind the stuck upload"
        );
        assert_eq!(read(&t, "b.md").as_deref(), Some("b-remote"));
        assert_eq!(server(&t).await["/d.md"], format!("d{round}"));
    }
    assert_eq!(server(&t).await["/a.md"], "a0");
    t.s.clear_faults().await;
}

// ----------------------------------------------------------------- wording

/// The first line that holds every one of `parts`.
fn line_with<'a>(text: &'a str, parts: &[&str]) -> &'a str {
    text.lines()
        .find(|l| parts.iter().all(|p| l.contains(p)))
        .unwrap_or_else(|| panic!("no line with {parts:?}\n{text}"))
}

/// The operator-facing lines of real runs keep the reference's wording
/// (sdk-behaviour.md §3.6–3.9, `_memories.py`, `_worker.py`), with the store
/// and the path as fields: an oversized file (refused before it is sent,
/// with the reference's line for the server's 413), a file the server
/// refuses, an upload that fails, the three conflicts (sync, refused upload,
/// flush), the final sync and the flush cut off at their bound.
#[tokio::test]
async fn the_operator_lines_keep_the_references_wording() {
    let logs = Logs::capture();
    let t = served_push(false).await;
    let store = format!("memory_store.id={}", t.ids[0]);
    let creates = format!("/v1/memory_stores/{}/memories", t.ids[0]);

    write(&t, "huge.md", &"x".repeat(102_401));
    write(&t, "bad\u{200b}name.md", "a format character in the path");
    t.stores.sync_now().await;
    let rejected =
        "the server rejected this memory file, so it stays un-synced until its content changes";
    let huge = line_with(&logs.text(), &[rejected, "memory.path=huge.md"]).to_string();
    assert!(
        huge.contains(&store) && huge.contains("rejection="),
        "{huge}"
    );
    assert!(huge.contains("102401 bytes"), "{huge}");
    let bad = line_with(&logs.text(), &[rejected, "name.md"]).to_string();
    assert!(
        bad.contains(&store) && bad.contains("rejection=") && bad.contains("400"),
        "{bad}"
    );

    write(&t, "new.md", "n");
    t.s.add_faults(vec![
        json!({"method": "POST", "path": creates, "status": 500, "times": 3}),
    ])
    .await;
    t.stores.sync_now().await;
    let failed = line_with(
        &logs.text(),
        &["failed to upload memory", "memory.path=new.md"],
    )
    .to_string();
    assert!(
        failed.contains(&store) && failed.contains("error="),
        "{failed}"
    );

    write(&t, "b.md", "b-local");
    other_writer(&t, "/b.md", "b-remote").await;
    t.stores.sync_now().await;
    let both = line_with(
        &logs.text(),
        &[
            "memory changed both locally and remotely; keeping the remote version",
            "memory.path=b.md",
        ],
    )
    .to_string();
    assert!(both.contains(&store), "{both}");

    write(&t, "c.md", "c-local");
    let c = update_route(&t, "/c.md").await;
    t.s.add_faults(vec![
        json!({"method": "POST", "path": c, "status": 409, "times": 3}),
    ])
    .await;
    t.stores.sync_now().await;
    let loses = line_with(
        &logs.text(),
        &[
            "memory changed both locally and remotely; the upload was refused and the local edit loses",
            "memory.path=c.md",
        ],
    )
    .to_string();
    assert!(loses.contains(&store), "{loses}");
    t.s.clear_faults().await;

    write(&t, "a.md", "a-local");
    other_writer(&t, "/a.md", "a-remote").await;
    t.stores.flush_writes().await;
    let flush = line_with(
        &logs.text(),
        &[
            "memory changed both locally and remotely; the flush leaves the remote version",
            "memory.path=a.md",
        ],
    )
    .to_string();
    assert!(flush.contains(&store), "{flush}");

    // The listing hangs: the final sync and the flush are both cut off.
    write(&t, "e.md", "e");
    t.s.add_faults(vec![
        json!({"method": "GET", "path": format!("{creates}*"), "latency_ms": 20_000}),
    ])
    .await;
    let report = t.stores.teardown(true, Duration::from_secs(1)).await;
    assert!(
        report.final_sync_cut_off && report.flush_cut_off,
        "{report:?}"
    );
    let text = logs.text();
    line_with(
        &text,
        &["final memory sync cut off after 1s; the flush that follows still uploads changed files"],
    );
    let cut = line_with(
        &text,
        &[
            "memory flush cut off part-way; ",
            " changed files had not finished uploading",
        ],
    );
    assert!(cut.contains(&store) && cut.contains("e.md"), "{cut}");
    line_with(
        &text,
        &["memory flush cut off after 1s; changed files it had not uploaded yet are not saved"],
    );
    t.s.clear_faults().await;
}
