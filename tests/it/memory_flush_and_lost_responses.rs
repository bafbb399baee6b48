//! The two-pass sync, the shutdown flush, lost upload responses and hostile
//! filesystems (`two-pass.test.ts`, `final-flush.test.ts`,
//! `lost-response.test.ts` and the hostile cases of issue 4).

use std::time::Duration;

use crate::common::fake_memory::{Call, Fault, Op};
use crate::common::harness::{H, Logs};
use envworker::api::types::Access;
use envworker::memory::options::DeleteMode;
use envworker::memory::store::{MARKER_PATH, UPLOAD_CONCURRENCY};

const RW: Access = Access::ReadWrite;
const RO: Access = Access::ReadOnly;

fn retrieves(calls: &[Call]) -> Vec<String> {
    calls
        .iter()
        .filter_map(|c| match c {
            Call::Retrieve { path } => Some(path.clone()),
            _ => None,
        })
        .collect()
}

// -------------------------------------------------------------- two pass

#[tokio::test]
async fn a_sync_that_pulls_nothing_fetches_no_content() {
    let h = H::new(
        &[("s", RW, &[("a.md", "a"), ("b.md", "b")])],
        DeleteMode::Enabled,
    )
    .await;
    h.stores.sync_now().await;
    let calls = h.fake.take_calls();
    assert_eq!(
        calls,
        vec![Call::List {
            store: "s".into(),
            view: envworker::api::types::View::Basic
        }]
    );
}

#[tokio::test]
async fn only_the_changed_memory_is_fetched() {
    let h = H::new(
        &[("s", RW, &[("a.md", "a"), ("b.md", "b"), ("c.md", "c")])],
        DeleteMode::Enabled,
    )
    .await;
    h.fake.put("s", "b.md", "b2");
    h.stores.sync_now().await;
    assert_eq!(retrieves(&h.fake.take_calls()), vec!["/b.md"]);
    assert_eq!(h.read("s", "b.md").as_deref(), Some("b2"));
}

#[tokio::test]
async fn a_file_already_holding_the_remote_content_is_adopted_without_a_fetch() {
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    h.write("s", "a.md", "same on both sides");
    h.fake.put("s", "a.md", "same on both sides");
    h.stores.sync_now().await;
    let calls = h.fake.take_calls();
    assert!(
        retrieves(&calls).is_empty() && !calls.iter().any(Call::is_write),
        "{calls:?}"
    );
    h.stores.sync_now().await;
    assert!(h.fake.take_writes().is_empty(), "adopted into the baseline");
}

#[tokio::test(start_paused = true)]
async fn content_fetches_fan_out_within_a_store() {
    let names: Vec<String> = (0..32).map(|i| format!("m{i:02}.md")).collect();
    let memories: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v1")).collect();
    let h = H::new(&[("s", RW, &memories)], DeleteMode::Enabled).await;
    for n in &names {
        h.fake.put("s", n, "v2");
        h.fake
            .fault(Op::Retrieve, Some(n), Fault::Delay(Duration::from_secs(1)));
    }
    let started = tokio::time::Instant::now();
    h.stores.sync_now().await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(3),
        "16 at a time: {took:?}"
    );
    assert!(h.disk("s").values().all(|v| v == "v2"));
}

#[tokio::test]
async fn a_failed_fetch_keeps_the_old_state_and_the_next_sync_retries() {
    let h = H::new(&[("s", RW, &[("a.md", "v1")])], DeleteMode::Enabled).await;
    h.fake.put("s", "a.md", "v2");
    h.fake.fault(Op::Retrieve, Some("a.md"), Fault::Status(503));
    h.stores.sync_now().await;
    assert_eq!(h.read("s", "a.md").as_deref(), Some("v1"));
    h.stores.sync_now().await;
    assert_eq!(h.read("s", "a.md").as_deref(), Some("v2"));
}

#[tokio::test]
async fn a_memory_deleted_between_listing_and_fetch_waits_for_the_next_sync() {
    let logs = Logs::capture();
    let h = H::new(&[("s", RW, &[("a.md", "v1")])], DeleteMode::Enabled).await;
    h.fake.put("s", "a.md", "v2");
    h.fake.fault(
        Op::Retrieve,
        Some("a.md"),
        Fault::before(|stores| {
            stores.get_mut("s").unwrap().remove("/a.md");
        }),
    );
    h.stores.sync_now().await;
    assert_eq!(
        h.read("s", "a.md").as_deref(),
        Some("v1"),
        "the 404 is skipped silently"
    );
    assert_eq!(logs.count("failed to fetch memory content"), 0);
    h.stores.sync_now().await;
    assert_eq!(
        h.read("s", "a.md"),
        None,
        "the next sync reconciles the deletion"
    );
    assert!(h.fake.take_writes().is_empty());
}

// ----------------------------------------------------------- final flush

#[tokio::test]
async fn flush_pushes_new_and_changed_files_and_nothing_else() {
    let logs = Logs::capture();
    let h = H::new(
        &[(
            "s",
            RW,
            &[("a.md", "a"), ("b.md", "b"), ("c.md", "c"), ("d.md", "d")],
        )],
        DeleteMode::Enabled,
    )
    .await;
    h.write("s", "a.md", "a2");
    h.write("s", "new.md", "n");
    h.rm("s", "b.md");
    h.fake.put("s", "c.md", "c-remote"); // a pull the flush must not do
    h.write("s", "d.md", "d-local");
    h.fake.put("s", "d.md", "d-remote"); // a conflict the flush leaves to the remote
    let n = h.stores.flush_writes().await;
    assert_eq!(n, 2);
    let writes = h.fake.take_writes();
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("a2"));
    assert_eq!(h.fake.get("s", "new.md").as_deref(), Some("n"));
    assert_eq!(h.fake.get("s", "b.md").as_deref(), Some("b"), "no deletes");
    assert_eq!(h.read("s", "c.md").as_deref(), Some("c"), "no pulls");
    assert_eq!(h.fake.get("s", "d.md").as_deref(), Some("d-remote"));
    assert_eq!(
        logs.count("memory changed both locally and remotely; the flush leaves the remote version"),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn flush_uploads_several_files_at_once_up_to_the_bound() {
    let h = H::new(&[("s", RW, &[])], DeleteMode::Enabled).await;
    for i in 0..80 {
        let name = format!("f{i:02}.md");
        h.write("s", &name, "x");
        h.fake.fault(
            Op::Create,
            Some(&name),
            Fault::Delay(Duration::from_millis(100)),
        );
    }
    h.stores.flush_writes().await;
    assert_eq!(h.server("s").len(), 80);
    assert_eq!(h.fake.peak_uploads(), UPLOAD_CONCURRENCY, "peak = 32");
}

#[tokio::test(start_paused = true)]
async fn a_flush_cut_off_part_way_logs_how_many_files_it_had_not_uploaded() {
    let logs = Logs::capture();
    let h = H::new(&[("s", RW, &[])], DeleteMode::Enabled).await;
    for (i, delay) in [1u64, 1, 1, 60, 60].iter().enumerate() {
        let name = format!("f{i}.md");
        h.write("s", &name, "x");
        h.fake.fault(
            Op::Create,
            Some(&name),
            Fault::Delay(Duration::from_secs(*delay)),
        );
    }
    let cut = tokio::time::timeout(Duration::from_secs(30), h.stores.flush_writes()).await;
    assert!(cut.is_err());
    assert_eq!(
        logs.count(
            "memory flush cut off part-way; 2 of 5 changed files had not finished uploading"
        ),
        1,
        "{}",
        logs.text()
    );
}

#[tokio::test(start_paused = true)]
async fn a_flush_cut_off_while_still_listing_counts_every_changed_file_as_not_uploaded() {
    let logs = Logs::capture();
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    for i in 0..4 {
        h.write("s", &format!("f{i}.md"), "x");
    }
    h.write("s", "a.md", "a2");
    h.fake
        .fault(Op::List, None, Fault::Delay(Duration::from_secs(60)));
    let cut = tokio::time::timeout(Duration::from_secs(30), h.stores.flush_writes()).await;
    assert!(cut.is_err());
    assert_eq!(
        logs.count(
            "memory flush cut off part-way; 5 of 5 changed files had not finished uploading"
        ),
        1,
        "{}",
        logs.text()
    );
}

#[tokio::test]
async fn flush_adopts_a_file_the_server_already_holds() {
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    h.write("s", "a.md", "same");
    h.fake.put("s", "a.md", "same");
    h.stores.flush_writes().await;
    assert!(h.fake.take_writes().is_empty());
}

#[tokio::test]
async fn flush_never_pushes_a_read_only_store() {
    let h = H::new(&[("kb", RO, &[("a.md", "a")])], DeleteMode::Enabled).await;
    h.write("kb", "a.md", "edited");
    h.write("kb", "new.md", "new");
    h.stores.flush_writes().await;
    assert!(h.fake.take_calls().is_empty(), "not even a listing");
}

#[tokio::test]
async fn flush_skips_files_the_server_already_refused() {
    let h = H::new(&[("s", RW, &[])], DeleteMode::Enabled).await;
    h.fake.max_content(4);
    h.write("s", "big.md", "too long");
    h.stores.sync_now().await;
    h.fake.take_calls();
    h.stores.flush_writes().await;
    assert!(h.fake.take_calls().is_empty(), "nothing dirty, no traffic");
}

#[tokio::test]
async fn flush_pushes_nothing_when_the_marker_check_fails() {
    let logs = Logs::capture();
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    h.rm("s", MARKER_PATH);
    h.write("s", "a.md", "edited");
    h.stores.flush_writes().await;
    assert!(h.fake.take_calls().is_empty());
    assert_eq!(
        logs.count("the marker file is gone; not uploading anything from the memory store folder"),
        1
    );
    assert!(
        !h.path("s", MARKER_PATH).exists(),
        "the flush does not recover"
    );
}

#[tokio::test]
async fn flush_never_throws() {
    let logs = Logs::capture();
    let h = H::new(
        &[("s", RW, &[("a.md", "a")]), ("t", RW, &[])],
        DeleteMode::Enabled,
    )
    .await;
    h.write("s", "a.md", "edited");
    h.write("t", "x.md", "x");
    // Each fault fires once: one failing listing per store (they flush in parallel).
    h.fake.fault(Op::List, None, Fault::Status(500));
    h.fake.fault(Op::List, None, Fault::Status(500));
    // Without a listing each edit still goes out, guarded by the hash it was
    // last synced at (issue 12 item 4).
    assert_eq!(h.stores.flush_writes().await, 2);
    assert_eq!(
        logs.count("the flush cannot list the memory store"),
        2,
        "{}",
        logs.text()
    );
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("edited"));
    assert_eq!(h.fake.get("t", "x.md").as_deref(), Some("x"));
    // A listing-free flush still loses to another writer's edit.
    h.write("s", "a.md", "edited again");
    h.fake.put("s", "a.md", "remote edit");
    h.fake.fault(Op::List, None, Fault::Status(500));
    h.fake.fault(Op::List, None, Fault::Status(500));
    assert_eq!(h.stores.flush_writes().await, 0);
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("remote edit"));
}

// --------------------------------------------------------- lost responses

#[tokio::test]
async fn an_edit_made_after_a_lost_upload_response_still_reaches_the_server() {
    let h = H::new(&[("s", RW, &[("a.md", "v1")])], DeleteMode::Enabled).await;
    h.write("s", "a.md", "v2");
    h.fake.fault(Op::Update, Some("a.md"), Fault::LoseResponse);
    h.stores.sync_now().await; // v2 landed, unheard
    h.write("s", "a.md", "v3");
    h.stores.sync_now().await;
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("v3"));
    assert_eq!(
        h.read("s", "a.md").as_deref(),
        Some("v3"),
        "not mistaken for a remote edit"
    );
}

#[tokio::test]
async fn a_retry_whose_response_is_lost_is_remembered_too() {
    let h = H::new(&[("s", RW, &[("a.md", "v1")])], DeleteMode::Enabled).await;
    h.write("s", "a.md", "v2");
    h.fake.fault(Op::Update, Some("a.md"), Fault::Status(503));
    h.stores.sync_now().await;
    h.fake.fault(Op::Update, Some("a.md"), Fault::LoseResponse);
    h.stores.sync_now().await;
    h.write("s", "a.md", "v3");
    h.stores.sync_now().await;
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("v3"));
    assert_eq!(h.read("s", "a.md").as_deref(), Some("v3"));
}

#[tokio::test]
async fn a_client_retry_refused_because_the_first_attempt_landed_is_remembered() {
    let logs = Logs::capture();
    let h = H::new(&[("s", RW, &[("a.md", "v1")])], DeleteMode::Enabled).await;
    h.write("s", "a.md", "v2");
    h.fake
        .fault(Op::Update, Some("a.md"), Fault::ApplyThen(409));
    h.stores.sync_now().await;
    h.fake.take_calls();
    h.stores.sync_now().await;
    // The listing shows exactly what was sent: our own write, not a conflict.
    assert!(h.fake.take_writes().is_empty());
    assert!(retrieves(&h.fake.take_calls()).is_empty());
    assert_eq!(h.read("s", "a.md").as_deref(), Some("v2"));
    assert_eq!(logs.count("keeping the remote version"), 0);
}

#[tokio::test]
async fn a_deletion_made_after_a_lost_upload_response_still_reaches_the_server() {
    let h = H::new(
        &[("s", RW, &[("a.md", "v1"), ("b.md", "b")])],
        DeleteMode::Enabled,
    )
    .await;
    h.write("s", "a.md", "v2");
    h.fake.fault(Op::Update, Some("a.md"), Fault::LoseResponse);
    h.stores.sync_now().await;
    h.rm("s", "a.md");
    h.stores.finish().await.unwrap();
    let calls = h.fake.take_calls();
    assert!(
        calls.contains(&Call::Delete {
            path: "/a.md".into(),
            expected: crate::common::fake_memory::sha("v2")
        }),
        "guarded by the sent content: {calls:?}"
    );
    assert_eq!(h.fake.get("s", "a.md"), None);
}

#[tokio::test]
async fn a_folder_wiped_after_a_lost_create_response_is_rebuilt_not_read_as_deletions() {
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    h.write("s", "new.md", "n");
    h.fake
        .fault(Op::Create, Some("new.md"), Fault::LoseResponse);
    h.stores.sync_now().await;
    std::fs::remove_dir_all(h.mount("s")).unwrap();
    std::fs::create_dir(h.mount("s")).unwrap();
    std::fs::write(h.path("s", MARKER_PATH), "version 1\ns").unwrap();
    h.stores.finish().await.unwrap();
    assert!(
        h.fake
            .take_writes()
            .iter()
            .all(|c| !matches!(c, Call::Delete { .. }))
    );
    assert_eq!(h.disk("s"), h.server("s"));
    assert_eq!(h.fake.get("s", "new.md").as_deref(), Some("n"));
}

#[tokio::test]
async fn the_shutdown_flush_pushes_a_revert_made_after_a_lost_upload_response() {
    let h = H::new(&[("s", RW, &[("a.md", "v1")])], DeleteMode::Enabled).await;
    h.write("s", "a.md", "v2");
    h.fake.fault(Op::Update, Some("a.md"), Fault::LoseResponse);
    h.stores.sync_now().await; // the server holds v2
    h.write("s", "a.md", "v1"); // reverted: equal to the baseline
    h.stores.flush_writes().await;
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("v1"));
}

#[tokio::test]
async fn the_shutdown_flush_sends_nothing_for_a_revert_whose_upload_never_landed() {
    let h = H::new(&[("s", RW, &[("a.md", "v1")])], DeleteMode::Enabled).await;
    h.write("s", "a.md", "v2");
    h.fake.fault(Op::Update, Some("a.md"), Fault::Status(503));
    h.stores.sync_now().await; // never landed
    h.write("s", "a.md", "v1");
    h.fake.take_calls();
    h.stores.flush_writes().await;
    assert!(h.fake.take_writes().is_empty());
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("v1"));
}

#[tokio::test]
async fn the_shutdown_flush_pushes_an_edit_made_after_a_lost_upload_response() {
    let h = H::new(&[("s", RW, &[("a.md", "v1")])], DeleteMode::Enabled).await;
    h.write("s", "a.md", "v2");
    h.fake.fault(Op::Update, Some("a.md"), Fault::LoseResponse);
    h.stores.sync_now().await;
    h.write("s", "a.md", "v3");
    h.stores.flush_writes().await;
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("v3"));
}

#[tokio::test]
async fn another_writers_edit_after_a_lost_upload_response_still_wins() {
    let h = H::new(&[("s", RW, &[("a.md", "v1")])], DeleteMode::Enabled).await;
    h.write("s", "a.md", "v2");
    h.fake.fault(Op::Update, Some("a.md"), Fault::LoseResponse);
    h.stores.sync_now().await;
    h.fake.take_calls();
    h.fake.put("s", "a.md", "someone else");
    h.stores.sync_now().await;
    assert!(
        h.fake.take_writes().is_empty(),
        "our stale bytes are not pushed over the other writer's"
    );
    assert_eq!(h.read("s", "a.md").as_deref(), Some("someone else"));
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("someone else"));
}

/// The agent writes `content` at `rel`, and a sync is cut off by its bound
/// (30 s, as the periodic sync's) with that `op` of `rel` in flight, never
/// answered.
async fn cut_off_in_flight(h: &H, op: Op, rel: &str, content: &str) {
    h.write("s", rel, content);
    h.fake
        .fault(op, Some(rel), Fault::Delay(Duration::from_secs(3600)));
    let cut = tokio::time::timeout(Duration::from_secs(30), h.stores.sync_now()).await;
    assert!(
        cut.is_err(),
        "the sync was cut off with {op:?} {rel} in flight"
    );
    h.fake.clear_faults();
}

/// v1's `op` of `rel` is cut off in flight ([`cut_off_in_flight`]); then
/// the agent writes `v2`, and v1 lands just before the next `op` of `rel`
/// does (`land` applies it to the server).
async fn cut_off_then_landing_late(h: &H, op: Op, rel: &str, land: Fault) {
    cut_off_in_flight(h, op, rel, "v1").await;
    h.write("s", rel, "v2");
    h.fake.fault(op, Some(rel), land);
}

/// A sync cut off by its bound with v1's update in flight (the periodic
/// sync's `timeout` drops the request mid-flight); the agent writes v2; the
/// next sync lists the server (still v0) and sends v2 guarded by v0 — and
/// v1 commits just before v2 arrives. The 409 is our own late write, not
/// another writer's: v2 is sent again over it and wins, on the server and
/// on disk.
#[tokio::test(start_paused = true)]
async fn an_upload_cut_off_in_flight_that_lands_late_never_beats_the_newer_edit() {
    let logs = Logs::capture();
    let h = H::new(&[("s", RW, &[("a.md", "v0")])], DeleteMode::Enabled).await;
    cut_off_then_landing_late(&h, Op::Update, "a.md", Fault::edit_first("s", "a.md", "v1")).await;
    h.stores.sync_now().await;
    h.stores.sync_now().await;
    assert_eq!(
        h.fake.get("s", "a.md").as_deref(),
        Some("v2"),
        "{}",
        logs.text()
    );
    assert_eq!(h.read("s", "a.md").as_deref(), Some("v2"));
    assert_eq!(logs.count("the local edit loses"), 0, "{}", logs.text());
    // Another writer's edit still wins over ours afterwards.
    h.write("s", "a.md", "v3");
    h.fake.put("s", "a.md", "someone else");
    h.stores.sync_now().await;
    h.stores.sync_now().await;
    assert_eq!(h.read("s", "a.md").as_deref(), Some("someone else"));
}

/// The same with a create: v1's create is cut off in flight, the agent
/// writes v2, and v1 lands just before v2's create (which the server then
/// refuses: the path is taken). The next listing shows our own v1, not
/// another writer's memory: v2 goes out over it.
#[tokio::test(start_paused = true)]
async fn a_create_cut_off_in_flight_that_lands_late_never_beats_the_newer_edit() {
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    let late = Fault::before(|stores| {
        let late = crate::common::fake_memory::Stored {
            id: "mem_late".into(),
            content: "v1".into(),
            version: 1,
        };
        stores.get_mut("s").unwrap().insert("/new.md".into(), late);
    });
    cut_off_then_landing_late(&h, Op::Create, "new.md", late).await;
    h.stores.sync_now().await;
    h.stores.sync_now().await;
    assert_eq!(h.fake.get("s", "new.md").as_deref(), Some("v2"));
    assert_eq!(h.read("s", "new.md").as_deref(), Some("v2"));
}

#[tokio::test]
async fn a_send_is_forgotten_once_a_later_sync_has_seen_the_server() {
    let h = H::new(&[("s", RW, &[("a.md", "v1")])], DeleteMode::Enabled).await;
    h.write("s", "a.md", "v2");
    h.fake.fault(Op::Update, Some("a.md"), Fault::Status(503)); // never landed
    h.stores.sync_now().await;
    h.write("s", "a.md", "v1");
    h.stores.sync_now().await; // the listing settles and forgets the send
    // Another writer now writes exactly the bytes once sent: a remote edit.
    h.fake.put("s", "a.md", "v2");
    h.stores.sync_now().await;
    assert_eq!(
        h.read("s", "a.md").as_deref(),
        Some("v2"),
        "pulled, not mistaken for our own old send"
    );
}

// --------------------------------------------------------- hostile disks

#[tokio::test]
async fn a_symlink_leaf_or_parent_is_never_followed_or_synced() {
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    let outside = h.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret.md"), "secret").unwrap();
    std::os::unix::fs::symlink(outside.join("secret.md"), h.path("s", "leaf.md")).unwrap();
    std::os::unix::fs::symlink(&outside, h.path("s", "dir")).unwrap();
    h.stores.finish().await.unwrap();
    h.stores.flush_writes().await;
    assert!(
        h.fake.take_writes().is_empty(),
        "nothing behind a symlink reaches the server"
    );
    // A pull through a symlinked parent is refused, never written outside.
    h.fake.put("s", "dir/planted.md", "x");
    let h2 = H::new(&[("s", RW, &[])], DeleteMode::Enabled).await;
    drop(h2);
    assert!(!outside.join("planted.md").exists());
}

#[tokio::test]
async fn a_symlink_swapped_in_between_scan_and_upload_is_not_read() {
    let logs = Logs::capture();
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    let secret = h.dir.path().join("secret.txt");
    std::fs::write(&secret, "do not upload").unwrap();
    h.write("s", "a.md", "edited");
    let file = h.path("s", "a.md");
    h.fake.fault(
        Op::List,
        None,
        Fault::before(move |_| {
            std::fs::remove_file(&file).unwrap();
            std::os::unix::fs::symlink(&secret, &file).unwrap();
        }),
    );
    h.stores.sync_now().await;
    let writes = h.fake.take_writes();
    assert!(writes.iter().all(|c| !matches!(c, Call::Update { content, .. } | Call::Create { content, .. } if content.contains("do not upload"))), "{writes:?}");
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("a"));
    assert!(logs.count("is a symlink") >= 1, "{}", logs.text());
}

#[tokio::test]
async fn a_fifo_in_the_folder_never_blocks_a_sync() {
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    rustix::fs::mknodat(
        rustix::fs::CWD,
        h.path("s", "pipe.md"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    h.write("s", "b.md", "b");
    tokio::time::timeout(Duration::from_secs(10), h.stores.finish())
        .await
        .expect("no hang")
        .unwrap();
    assert_eq!(h.fake.get("s", "b.md").as_deref(), Some("b"));
    assert_eq!(h.fake.get("s", "pipe.md"), None);
}

#[tokio::test]
async fn a_non_nfc_file_name_is_refused_by_the_server_and_warned_once() {
    let logs = Logs::capture();
    let h = H::new(&[("s", RW, &[])], DeleteMode::Enabled).await;
    h.fake
        .fault(Op::Create, Some("cafe\u{301}.md"), Fault::Status(400));
    h.write("s", "cafe\u{301}.md", "decomposed");
    h.write("s", "ok.md", "ok");
    h.stores.sync_now().await;
    h.stores.sync_now().await;
    assert_eq!(h.fake.get("s", "ok.md").as_deref(), Some("ok"));
    assert_eq!(logs.count("the server rejected this memory file"), 1);
}

#[tokio::test]
async fn the_root_removed_during_a_write_is_not_recreated_by_it() {
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    h.fake.put("s", "deep/new.md", "n");
    let root = h.mount("s");
    h.fake.fault(
        Op::Retrieve,
        Some("deep/new.md"),
        Fault::before(move |_| std::fs::remove_dir_all(&root).unwrap()),
    );
    h.stores.sync_now().await;
    assert!(
        !h.mount("s").exists(),
        "the pull's write did not re-create the root"
    );
    assert!(h.fake.take_writes().is_empty());
}

/// v1's update is cut off in flight and commits late (answer never heard);
/// another writer writes D before our next listing (server wins: D on disk);
/// later another writer writes v1's bytes back (a restore). The agent never
/// touches the file again. The restore must stay.
#[tokio::test(start_paused = true)]
async fn a_stale_in_flight_record_never_claims_another_writers_restore() {
    let h = H::new(&[("s", RW, &[("a.md", "v0")])], DeleteMode::Enabled).await;
    cut_off_in_flight(&h, Op::Update, "a.md", "v1").await;
    h.fake.put("s", "a.md", "v1"); // our v1 commits late
    h.fake.put("s", "a.md", "D"); // another writer, before our next listing
    h.stores.sync_now().await;
    assert_eq!(h.read("s", "a.md").as_deref(), Some("D"));
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("D"));
    h.fake.put("s", "a.md", "v1"); // another writer restores v1
    h.fake.take_calls();
    h.stores.sync_now().await;
    h.stores.sync_now().await;
    let writes = h.fake.take_writes();
    assert_eq!(
        h.fake.get("s", "a.md").as_deref(),
        Some("v1"),
        "the other writer's restore was reverted by the worker: {writes:?}"
    );
    assert_eq!(h.read("s", "a.md").as_deref(), Some("v1"));
}

/// A create cut off in flight that never lands; the agent removes the file;
/// later another writer creates the same path with the same bytes (an empty
/// placeholder). The worker must pull it, not delete it.
#[tokio::test(start_paused = true)]
async fn a_stale_in_flight_create_never_deletes_another_writers_memory() {
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    cut_off_in_flight(&h, Op::Create, "n.md", "").await;
    h.rm("s", "n.md");
    h.stores.sync_now().await;
    h.fake.put("s", "n.md", ""); // another writer
    for _ in 0..4 {
        h.stores.sync_now().await;
        tokio::time::sleep(Duration::from_secs(20)).await;
    }
    assert_eq!(
        h.fake.get("s", "n.md").as_deref(),
        Some(""),
        "another writer's memory was deleted"
    );
    assert_eq!(h.read("s", "n.md").as_deref(), Some(""));
}

/// As `an_upload_cut_off_in_flight_that_lands_late_never_beats_the_newer_edit`,
/// but v1's update is answered 504 by a gateway while the backend still
/// commits it later (just before v2's update).
#[tokio::test(start_paused = true)]
async fn a_gateway_504_that_commits_late_never_beats_the_newer_edit() {
    let h = H::new(&[("s", RW, &[("a.md", "v0")])], DeleteMode::Enabled).await;
    h.write("s", "a.md", "v1");
    h.fake.fault(Op::Update, Some("a.md"), Fault::Status(504));
    h.stores.sync_now().await;
    h.write("s", "a.md", "v2");
    h.fake.fault(
        Op::Update,
        Some("a.md"),
        Fault::edit_first("s", "a.md", "v1"),
    );
    h.stores.sync_now().await;
    h.stores.sync_now().await;
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("v2"));
    assert_eq!(h.read("s", "a.md").as_deref(), Some("v2"));
}

// ------------------------------------------ sends a later pass saw superseded

/// The agent writes v1 and its update never reaches the server (a
/// gateway's 502: nothing committed, no answer a client can trust); the
/// agent reverts the file, and a sync sees the file and the server agree.
async fn lost_then_seen_reverted(h: &H) {
    h.write("s", "a.md", "v1");
    h.fake.fault(Op::Update, Some("a.md"), Fault::Status(502));
    h.stores.sync_now().await;
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("v0"));
    h.write("s", "a.md", "v0");
    h.stores.sync_now().await;
}

/// After [`lost_then_seen_reverted`], another writer writes v1's bytes and
/// the agent writes v2: the flush (whose listing used to take the other
/// writer's v1 for our own late landing) leaves the remote version.
#[tokio::test]
async fn a_send_seen_superseded_never_claims_another_writers_edit_at_the_flush() {
    let logs = Logs::capture();
    let h = H::new(&[("s", RW, &[("a.md", "v0")])], DeleteMode::Enabled).await;
    lost_then_seen_reverted(&h).await;
    h.fake.put("s", "a.md", "v1");
    h.write("s", "a.md", "v2");
    h.stores.flush_writes().await;
    assert_eq!(
        h.fake.get("s", "a.md").as_deref(),
        Some("v1"),
        "{}",
        logs.text()
    );
    assert_eq!(
        logs.count("memory changed both locally and remotely; the flush leaves the remote version"),
        1,
        "{}",
        logs.text()
    );
}

/// The same at a sync without the version feed (each sync lists whole) and
/// at a push pass: the other writer's v1 wins, with the conflict warned.
#[tokio::test]
async fn a_send_seen_superseded_never_claims_another_writers_edit_at_a_listing_or_a_push() {
    for push in [false, true] {
        let logs = Logs::capture();
        let h = H::new(&[("s", RW, &[("a.md", "v0")])], DeleteMode::Enabled).await;
        lost_then_seen_reverted(&h).await;
        h.fake.put("s", "a.md", "v1");
        h.write("s", "a.md", "v2");
        if push {
            h.stores.push_now().await;
        }
        h.stores.sync_now().await;
        assert_eq!(
            h.fake.get("s", "a.md").as_deref(),
            Some("v1"),
            "push {push}\n{}",
            logs.text()
        );
        assert_eq!(h.read("s", "a.md").as_deref(), Some("v1"));
        assert!(logs.count("memory changed both locally and remotely") >= 1);
        assert_eq!(logs.count("landed late"), 0, "{}", logs.text());
    }
}

/// A create lost before the server; the agent removes the file and a sync
/// sees the path absent on both sides. Another writer then creates the path
/// with the same bytes and the agent writes it anew: the other writer's
/// memory wins (it was taken for our own late create, a tentative baseline
/// the agent's edit then went out over).
#[tokio::test]
async fn a_create_seen_superseded_never_claims_another_writers_memory() {
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    h.write("s", "n.md", "v1");
    h.fake.fault(Op::Create, Some("n.md"), Fault::Status(502));
    h.stores.sync_now().await;
    h.rm("s", "n.md");
    h.stores.sync_now().await;
    h.fake.put("s", "n.md", "v1");
    h.write("s", "n.md", "v2");
    h.stores.sync_now().await;
    h.stores.sync_now().await;
    assert_eq!(h.fake.get("s", "n.md").as_deref(), Some("v1"));
    assert_eq!(h.read("s", "n.md").as_deref(), Some("v1"));
}

/// The lost send, then the worker dies and a new one recovers the folder
/// from the journal (which holds the unanswered send; the records of
/// requests in flight live in memory only): the recovery's own listing
/// settles the send, and the other writer's identical bytes later win.
#[tokio::test]
async fn a_lost_send_recovered_from_the_journal_never_claims_another_writers_edit() {
    let mut h = H::new(&[("s", RW, &[("a.md", "v0")])], DeleteMode::Enabled).await;
    h.write("s", "a.md", "v1");
    h.fake.fault(Op::Update, Some("a.md"), Fault::Status(502));
    h.stores.sync_now().await;
    h.write("s", "a.md", "v0");
    h.crash_and_remount().await.unwrap();
    h.fake.put("s", "a.md", "v1");
    h.write("s", "a.md", "v2");
    h.stores.sync_now().await;
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("v1"));
    assert_eq!(h.read("s", "a.md").as_deref(), Some("v1"));
}

// ------------------------------------------------- the push's uploads in flight

/// The push's upload of `a.md` (v1) is at the server, slow (10 s); the
/// tasks of its uploads.
async fn push_upload_in_flight(h: &H) -> Vec<tokio::task::JoinHandle<bool>> {
    h.write("s", "a.md", "v1");
    h.fake.slow_next_writes(1, Duration::from_secs(10));
    let flights = h.stores.push_detached().await;
    while h.fake.writes_sent() == 0 {
        tokio::task::yield_now().await;
    }
    flights
}

/// The flush waits for a push upload that carries the file as it is (it
/// would only race it), and counts it: one request in all.
#[tokio::test(start_paused = true)]
async fn the_flush_waits_for_a_push_upload_of_the_same_content() {
    let h = H::new(&[("s", RW, &[("a.md", "v0")])], DeleteMode::Enabled).await;
    let flights = push_upload_in_flight(&h).await;
    assert_eq!(h.stores.flush_writes().await, 1);
    for f in flights {
        assert!(f.await.unwrap(), "the push's upload landed");
    }
    let updates = h
        .fake
        .take_calls()
        .into_iter()
        .filter(|c| matches!(c, Call::Update { .. }))
        .count();
    assert_eq!(updates, 1);
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("v1"));
}

/// The agent writes v2 while the push's upload of v1 is in flight: the
/// flush sends v2 at once, and whichever of the two the server takes first,
/// v2 stays — the older upload never wins over the newer edit, and nobody
/// is told the edit lost. (The older one landing first is simulated by a
/// change landing just before the flush's update: the push's request is
/// still sleeping at the server then, and is refused when it wakes.)
#[tokio::test(start_paused = true)]
async fn the_flush_overtakes_a_push_upload_of_older_content_whichever_lands_first() {
    for older_first in [false, true] {
        let logs = Logs::capture();
        let h = H::new(&[("s", RW, &[("a.md", "v0")])], DeleteMode::Enabled).await;
        let flights = push_upload_in_flight(&h).await;
        h.write("s", "a.md", "v2");
        if older_first {
            h.fake.fault(
                Op::Update,
                Some("a.md"),
                Fault::edit_first("s", "a.md", "v1"),
            );
        }
        h.stores.flush_writes().await;
        assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("v2"));
        for f in flights {
            assert!(!f.await.unwrap(), "the older upload landed after the newer");
        }
        assert_eq!(
            h.fake.get("s", "a.md").as_deref(),
            Some("v2"),
            "older first: {older_first}\n{}",
            logs.text()
        );
        assert_eq!(logs.count("the local edit loses"), 0, "{}", logs.text());
        // Settled: the next sync keeps v2 on disk and sends nothing.
        h.fake.take_calls();
        h.stores.sync_now().await;
        assert_eq!(h.read("s", "a.md").as_deref(), Some("v2"));
        assert!(h.fake.take_writes().is_empty(), "{}", logs.text());
    }
}
