//! The folder watch (inotify) against the devserver over real HTTP: an idle
//! sync examines nothing, an edit is examined alone, and everything the
//! kernel's account cannot answer exactly — an overflowed queue, a watched
//! directory replaced or renamed — makes that sync a full scan that gets
//! every change right. A renamed file is a create plus a corroborated delete.

use crate::common::contents;
use crate::common::fake_memory::Op;
use crate::common::harness::H;
use crate::common::memory_served::{Served, served_opts};
use envworker::api::types::Access;
use envworker::memory::SessionMemoryStores;
use envworker::memory::options::{DeleteMode, SyncInterval};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn notes() -> Value {
    json!([
        {"key": "notes", "name": "Notes", "memories": {"/a.md": "a1", "/dir/b.md": "b1", "/gone.md": "g"}},
        {"key": "kb", "name": "KB", "access": "read_only", "memories": {"/faq.md": "f1"}}
    ])
}

/// The stores with the change-driven push on (it is opt-in).
async fn pushing() -> Served {
    served_opts(notes(), None, |s| s.with_push(true)).await
}

/// The stores without the change-driven push (the default, spelled out):
/// what a sync examines is counted exactly, and the kernel's queue fills
/// between syncs.
async fn synced_only(shape: impl FnOnce(SessionMemoryStores) -> SessionMemoryStores) -> Served {
    served_opts(notes(), None, |s| shape(s.without_push())).await
}

/// A test that counts what a sync examined runs alone in a process of its
/// own. A child that another test of this process forks shares every file
/// open at that moment until its `execve`: a file the mount (or the test)
/// was writing then is closed for good only when the child execs, and the
/// watch reports that close as a write (`IN_CLOSE_WRITE`, under the file's
/// new name) — a path examined later than it was written, which the worker
/// takes in its stride but an exact count cannot. `false` in the test that
/// ran the child, which passed.
fn alone(test: &str) -> bool {
    crate::common::runs_alone(test)
}

async fn server(t: &Served) -> std::collections::BTreeMap<String, String> {
    t.s.store_memories(&t.ids[0]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sync_examines_nothing_and_an_edit_is_examined_alone() {
    if !alone("an_idle_sync_examines_nothing_and_an_edit_is_examined_alone") {
        return;
    }
    let t = synced_only(|s| s).await;
    let idle = t.stores.sync_now().await;
    assert_eq!(
        (idle.examined, idle.full_scans),
        (0, 0),
        "the watch set at mount reports nothing: {idle:?}"
    );
    std::fs::write(t.mounts[0].join("dir/b.md"), "b2").unwrap();
    let edited = t.stores.sync_now().await;
    assert_eq!(
        (edited.examined, edited.full_scans, edited.uploads),
        (1, 0, 1),
        "{edited:?}"
    );
    assert_eq!(server(&t).await["/dir/b.md"], "b2");
    // A directory made after the mount is watched, and what was written in
    // it before its watch landed is examined with it.
    std::fs::create_dir_all(t.mounts[0].join("new/deeper")).unwrap();
    std::fs::write(t.mounts[0].join("new/deeper/c.md"), "c1").unwrap();
    let made = t.stores.sync_now().await;
    assert_eq!((made.full_scans, made.uploads), (0, 1), "{made:?}");
    std::fs::write(t.mounts[0].join("new/deeper/c.md"), "c2").unwrap();
    let again = t.stores.sync_now().await;
    assert_eq!(
        (again.examined, again.full_scans, again.uploads),
        (1, 0, 1),
        "the new directory is watched: {again:?}"
    );
    assert_eq!(server(&t).await["/new/deeper/c.md"], "c2");
    let idle = t.stores.sync_now().await;
    assert_eq!((idle.examined, idle.full_scans), (0, 0), "{idle:?}");
    // The final sync scans whole, as it always did.
    let last = t.stores.finish().await.unwrap();
    assert_eq!(last.full_scans, 2, "{last:?}");
    t.stores.dispose().await;
}

/// A write through a shared mapping is one inotify never reports
/// (inotify(7)): only the safety cadence's full scan finds it. The cadence
/// runs by time, not by pass count: an idle store's syncs in between stat
/// nothing, however many there are (it was every 10th sync).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_safety_cadence_finds_a_write_the_watch_cannot_see() {
    if !alone("the_safety_cadence_finds_a_write_the_watch_cannot_see") {
        return;
    }
    let every = Duration::from_secs(6);
    let before_mount = Instant::now();
    let t = synced_only(|s| s.with_safety_cadence(every)).await;
    let mounted = Instant::now();
    let path = t.mounts[0].join("a.md");
    // A file opened for writing is reported when it is last released
    // (IN_CLOSE_WRITE), which a mapping defers to its unmapping: the map is
    // kept until the end.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    // SAFETY: the mapping is this test's alone; nothing else truncates the
    // file while it is mapped.
    let mut map = unsafe { memmap2::MmapMut::map_mut(&file) }.unwrap();
    drop(file);
    let opened = t.stores.sync_now().await;
    assert_eq!((opened.full_scans, opened.uploads), (0, 0), "{opened:?}");
    map[0] = b'A';
    map.flush().unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "A1");

    // No full scan is due before `every` has passed since the mount's
    // (which ended after `before_mount`): one that comes is early unless
    // its sync returned after that — the loop stops half a second before,
    // but a machine that stalls the test for longer may carry its last
    // sync past it, and then that sync is the cadence's.
    let mut idle = 0;
    let mut found = None;
    while before_mount.elapsed() + Duration::from_millis(500) < every {
        let report = t.stores.sync_now().await;
        if report.full_scans > 0 {
            assert!(
                before_mount.elapsed() >= every,
                "idle sync {idle}: a full scan came early: {report:?}"
            );
            found = Some(report);
            break;
        }
        assert_eq!(
            (report.examined, report.uploads),
            (0, 0),
            "idle sync {idle}: the watch saw the mapped write"
        );
        idle += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        idle > 10,
        "only {idle} idle syncs ran before the cadence was due"
    );
    let due = match found {
        Some(report) => report,
        None => {
            assert_eq!(server(&t).await["/a.md"], "a1");
            tokio::time::sleep((mounted + every).saturating_duration_since(Instant::now())).await;
            t.stores.sync_now().await
        }
    };
    assert!(due.full_scans >= 1, "{due:?}");
    assert_eq!(due.uploads, 1, "{due:?}");
    assert_eq!(server(&t).await["/a.md"], "A1");
    drop(map);
    t.stores.dispose().await;
}

/// More changed paths than the watch keeps: the sync is a full scan and
/// gets every change right; the next is incremental again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_changes_than_the_watch_keeps_fall_back_to_a_full_scan() {
    if !alone("more_changes_than_the_watch_keeps_fall_back_to_a_full_scan") {
        return;
    }
    let t = synced_only(|s| s.with_watch_bound(3)).await;
    let notes = &t.mounts[0];
    // Ten names in a watched directory: ten paths reported, over the bound.
    for i in 0..10 {
        std::fs::write(notes.join(format!("dir/f{i}.md")), format!("f{i}")).unwrap();
    }
    std::fs::write(notes.join("a.md"), "a2").unwrap();
    let report = t.stores.sync_now().await;
    assert_eq!(report.full_scans, 1, "{report:?}");
    assert_eq!(report.uploads, 11, "{report:?}");
    let mut want = contents(&[("/a.md", "a2"), ("/dir/b.md", "b1"), ("/gone.md", "g")]);
    for i in 0..10 {
        want.insert(format!("/dir/f{i}.md"), format!("f{i}"));
    }
    assert_eq!(server(&t).await, want);
    let idle = t.stores.sync_now().await;
    assert_eq!((idle.examined, idle.full_scans), (0, 0), "{idle:?}");
    t.stores.dispose().await;
}

/// The kernel's own queue overflows (`IN_Q_OVERFLOW`): more events than
/// `max_queued_events` after two writes. The sync is a full scan with the
/// right answer (the writes lost from the queue are found by the scan).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_queue_overflow_falls_back_to_a_full_scan() {
    let t = synced_only(|s| s).await;
    let notes = &t.mounts[0];
    std::fs::write(notes.join("a.md"), "a2").unwrap();
    std::fs::write(notes.join("x.md"), "x1").unwrap();
    crate::common::overflow_inotify(&notes.join("a.md"), &notes.join("dir/b.md"));
    std::fs::remove_file(notes.join("gone.md")).unwrap();
    let report = t.stores.sync_now().await;
    assert_eq!(report.full_scans, 1, "{report:?}");
    assert!(report.examined >= 3, "{report:?}");
    let disk = |p: &str| std::fs::read_to_string(notes.join(p)).unwrap();
    let server_now = server(&t).await;
    assert_eq!(server_now["/a.md"], disk("a.md"));
    assert_eq!(server_now["/x.md"], disk("x.md"));
    assert_eq!(
        server_now.get("/gone.md").map(String::as_str),
        Some("g"),
        "a local delete waits for its corroboration"
    );
    // The final sync corroborates the delete.
    t.stores.finish().await.unwrap();
    assert!(!server(&t).await.contains_key("/gone.md"));
    t.stores.dispose().await;
}

/// A watched directory moved away and another made in its place, then one
/// removed and made again: each is a full scan; every file is uploaded and
/// nothing is deleted wrongly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_directory_replaced_falls_back_to_a_full_scan() {
    let t = synced_only(|s| s).await;
    let notes = &t.mounts[0];
    std::fs::rename(notes.join("dir"), notes.join("old")).unwrap();
    std::fs::create_dir(notes.join("dir")).unwrap();
    std::fs::write(notes.join("dir/b.md"), "b2 in the new dir").unwrap();
    std::fs::write(notes.join("dir/c.md"), "c1").unwrap();
    let report = t.stores.sync_now().await;
    assert_eq!(report.full_scans, 1, "{report:?}");
    assert_eq!(
        server(&t).await,
        contents(&[
            ("/a.md", "a1"),
            ("/dir/b.md", "b2 in the new dir"),
            ("/dir/c.md", "c1"),
            ("/gone.md", "g"),
            ("/old/b.md", "b1"),
        ])
    );
    // The new directory is watched by the full scan.
    std::fs::write(notes.join("dir/c.md"), "c2").unwrap();
    let report = t.stores.sync_now().await;
    assert_eq!((report.full_scans, report.uploads), (0, 1), "{report:?}");

    // Removed and made again under the same name, with a file in it.
    std::fs::remove_dir_all(notes.join("old")).unwrap();
    std::fs::create_dir(notes.join("old")).unwrap();
    std::fs::write(notes.join("old/b.md"), "b3").unwrap();
    let report = t.stores.sync_now().await;
    assert_eq!((report.full_scans, report.uploads), (1, 1), "{report:?}");
    assert_eq!(server(&t).await["/old/b.md"], "b3");
    assert_eq!(server(&t).await["/dir/c.md"], "c2");
    t.stores.dispose().await;
}

/// A file renamed within the tree: the new path is created at once, the
/// old one is a local delete, corroborated (here by the final sync) before
/// it goes out — and no full scan is needed to see either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_file_is_a_create_and_a_corroborated_delete() {
    if !alone("a_renamed_file_is_a_create_and_a_corroborated_delete") {
        return;
    }
    let t = synced_only(|s| s).await;
    let notes = &t.mounts[0];
    std::fs::rename(notes.join("dir/b.md"), notes.join("moved.md")).unwrap();
    let report = t.stores.sync_now().await;
    assert_eq!(
        (report.examined, report.full_scans, report.uploads),
        (2, 0, 1),
        "{report:?}"
    );
    let now = server(&t).await;
    assert_eq!(now["/moved.md"], "b1");
    assert_eq!(
        now.get("/dir/b.md").map(String::as_str),
        Some("b1"),
        "not yet corroborated"
    );
    t.stores.finish().await.unwrap();
    assert_eq!(
        server(&t).await,
        contents(&[("/a.md", "a1"), ("/gone.md", "g"), ("/moved.md", "b1")])
    );
    t.stores.dispose().await;
}

/// A symlinked directory is never followed, by a scan or by a watch: what
/// is written behind it is never uploaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlinked_directory_is_neither_watched_nor_followed() {
    if !alone("a_symlinked_directory_is_neither_watched_nor_followed") {
        return;
    }
    let t = synced_only(|s| s).await;
    let notes = &t.mounts[0];
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), notes.join("link")).unwrap();
    std::fs::write(outside.path().join("secret.md"), "s1").unwrap();
    let report = t.stores.sync_now().await;
    assert_eq!((report.full_scans, report.uploads), (0, 0), "{report:?}");
    std::fs::write(outside.path().join("secret.md"), "s2").unwrap();
    std::fs::write(outside.path().join("more.md"), "m").unwrap();
    let report = t.stores.sync_now().await;
    assert_eq!(
        (report.examined, report.uploads),
        (0, 0),
        "nothing behind the link is watched: {report:?}"
    );
    t.stores.finish().await.unwrap();
    assert_eq!(
        server(&t).await,
        contents(&[("/a.md", "a1"), ("/dir/b.md", "b1"), ("/gone.md", "g")])
    );
    t.stores.dispose().await;
}

/// Poll the server until `path` in the first store holds `want`; how long
/// it took, or `None` after `limit`.
async fn visible(t: &Served, path: &str, want: &str, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if server(t).await.get(path).map(String::as_str) == Some(want) {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// The change-driven push: with no sync running at all (nothing calls the
/// periodic sync here), an edit, a new file and a file in a new directory
/// are on the server within a second; a local delete and a read-only edit
/// are not pushed; a conflicting edit loses to the server's. Edit latency
/// over `ENVWORKER_PUSH_EDITS` edits (10 by default) is printed, p50/p99.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_reaches_the_server_within_a_second_without_a_sync() {
    let t = pushing().await;
    let notes = &t.mounts[0];
    let second = Duration::from_secs(1);
    std::fs::write(notes.join("a.md"), "a2").unwrap();
    let took = visible(&t, "/a.md", "a2", second).await;
    assert!(took.is_some(), "an edit was not pushed within 1 s");
    std::fs::create_dir_all(notes.join("fresh/dir")).unwrap();
    std::fs::write(notes.join("fresh/dir/n.md"), "n1").unwrap();
    assert!(
        visible(&t, "/fresh/dir/n.md", "n1", second).await.is_some(),
        "a file in a new directory was not pushed within 1 s"
    );

    // Pushes never delete, and a read-only store never pushes.
    std::fs::remove_file(notes.join("gone.md")).unwrap();
    std::fs::write(t.mounts[1].join("faq.md"), "edited read-only").unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(server(&t).await["/gone.md"], "g");
    assert_eq!(t.s.store_memories(&t.ids[1]).await["/faq.md"], "f1");

    // A conflict: the server's edit wins; the push is refused (guarded by
    // the last synced hash) and the next sync pulls the server's version.
    let id = t.memory_id(&t.ids[0], "/dir/b.md").await;
    t.s.memory(
        reqwest::Method::POST,
        &format!("/v1/memory_stores/{}/memories/{id}", t.ids[0]),
        Some(json!({"content": "b2 remote"})),
    )
    .await
    .ok();
    std::fs::write(notes.join("dir/b.md"), "b2 local").unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(server(&t).await["/dir/b.md"], "b2 remote");
    t.stores.sync_now().await;
    assert_eq!(
        std::fs::read_to_string(notes.join("dir/b.md")).unwrap(),
        "b2 remote"
    );

    let edits: usize = std::env::var("ENVWORKER_PUSH_EDITS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let mut latencies = Vec::new();
    for i in 0..edits {
        let content = format!("edit {i}");
        std::fs::write(notes.join("a.md"), &content).unwrap();
        let took = visible(&t, "/a.md", &content, Duration::from_secs(3))
            .await
            .unwrap_or_else(|| panic!("edit {i} was not pushed within 3 s"));
        latencies.push(took);
    }
    latencies.sort();
    let p = |q: f64| {
        latencies[((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1]
    };
    eprintln!(
        "push latency over {edits} edits: p50 {} ms, p99 {} ms",
        p(0.5).as_millis(),
        p(0.99).as_millis()
    );
    assert!(p(0.99) < second, "p99 {:?}", p(0.99));
    t.stores.finish().await.unwrap();
    assert!(!server(&t).await.contains_key("/gone.md"));
    t.stores.dispose().await;
}

/// An agent flooding writes — `ENVWORKER_FLOOD_FILES` files (3,000 by
/// default) rewritten round after round, against a server that takes
/// 100 ms per upload, far more than it can take — never holds back the
/// periodic sync: the push yields to a sync that is due and bounds each of
/// its passes, and the sync pulls before it uploads, so a remote edit made
/// at the mount is on disk within the interval plus 2 s (the agent's calls
/// check the cadence every 100 ms, as a busy agent's tool calls do).
/// A file tool's atomic write in progress (its `O_EXCL` temporary file,
/// before the fsync and the rename) is never pushed: the push runs while
/// tools run. Found by the chaos test under load: a slow fsync left the
/// temporary file long enough for a push, and it became a memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_write_in_progress_is_never_pushed() {
    let t = pushing().await;
    let notes = &t.mounts[0];
    let tmp = notes.join("dir/.envworker-write-0123456789abcdef");
    std::fs::write(&tmp, "half written").unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        !server(&t)
            .await
            .keys()
            .any(|k| k.contains(".envworker-write-")),
        "the temporary file of a write in progress was pushed: {:?}",
        server(&t).await
    );
    std::fs::rename(&tmp, notes.join("dir/done.md")).unwrap();
    let took = visible(&t, "/dir/done.md", "half written", Duration::from_secs(2)).await;
    assert!(took.is_some(), "the renamed file was not pushed");
}

/// An idle store's push task sleeps on the kernel's queue instead of
/// polling it ten times a second (the worker's CPU while the agent is idle,
/// issue 16), and still wakes for an edit at once — also once a full scan
/// has replaced the watch (as the safety cadence does every 5 minutes), whose
/// old descriptor reports nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_push_sleeps_on_the_kernel_and_wakes_for_an_edit() {
    let t = pushing().await;
    let notes = &t.mounts[0];
    let idle = Duration::from_secs(3);
    let before = t.stores.push_wakeups();
    tokio::time::sleep(idle).await;
    let woken = t.stores.push_wakeups() - before;
    // One writable store: its safety tick is once a second.
    assert!(
        woken <= 5,
        "the idle push task woke {woken} times in {idle:?} (a 100 ms poll wakes 30)"
    );

    for round in 0..3 {
        // Replace the watch: a full scan makes a new inotify instance.
        t.stores.lose_watch_events();
        let report = t.stores.sync_now().await;
        assert_eq!(report.full_scans, 2, "both stores scan whole: {report:?}");
        // Let the push task go back to sleep, on the new instance.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let content = format!("after replacement {round}");
        std::fs::write(notes.join("a.md"), &content).unwrap();
        let took = visible(&t, "/a.md", &content, Duration::from_secs(3)).await;
        assert!(
            took.is_some_and(|d| d < Duration::from_millis(800)),
            "round {round}: an edit after the watch was replaced took {took:?} to reach the server"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_flood_never_holds_back_the_periodic_sync() {
    let files: usize = std::env::var("ENVWORKER_FLOOD_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let interval = Duration::from_secs(5);
    let h = H::pushing(
        &[("s", Access::ReadWrite, &[("remote.md", "r1")])],
        SyncInterval::every(interval).unwrap(),
    )
    .await;
    let mounted = Instant::now();
    let slow = Duration::from_millis(100);
    h.fake.latency(Op::Create, slow);
    h.fake.latency(Op::Update, slow);
    h.fake.put("s", "remote.md", "r2");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        let dir = h.mount("s").join("flood");
        std::thread::spawn(move || {
            std::fs::create_dir_all(&dir).unwrap();
            let mut round = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for i in 0..files {
                    std::fs::write(dir.join(format!("f{i}.md")), format!("round {round}")).unwrap();
                }
                round += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            round
        })
    };
    let agent = async {
        loop {
            h.stores.sync_if_due().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let limit = interval + Duration::from_secs(2);
    let pulled = async {
        while mounted.elapsed() < limit + Duration::from_secs(10) {
            if h.read("s", "remote.md").as_deref() == Some("r2") {
                return Some(mounted.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    };
    let took = tokio::select! {
        took = pulled => took,
        _ = agent => unreachable!(),
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = flood.join().unwrap();
    h.fake.latency(Op::Create, Duration::ZERO);
    h.fake.latency(Op::Update, Duration::ZERO);
    eprintln!("remote edit pulled after {took:?} under a flood of {files} files x {rounds} rounds");
    let took = took.expect("the remote edit was never pulled");
    assert!(
        took <= limit,
        "the remote edit was pulled {took:?} after the mount (interval {interval:?})"
    );
    h.stores.dispose().await;
}

/// One push pass starts at most 256 uploads (`push::MAX_UPLOADS`); the
/// paths it did not get to stay reported, so the next pass takes them
/// without waiting for a sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_pass_is_bounded_and_leaves_the_rest_reported() {
    let h = H::new(&[("s", Access::ReadWrite, &[])], DeleteMode::Enabled).await;
    for i in 0..300 {
        h.write("s", &format!("f{i}.md"), &format!("f{i}"));
    }
    assert_eq!(h.stores.push_now().await, 256);
    assert_eq!(h.stores.push_now().await, 44);
    assert_eq!(h.server("s"), h.disk("s"));
    assert_eq!(h.stores.push_now().await, 0);
}

/// The uploads of one push pass land together, and each makes the journal
/// durable: one `fdatasync` at a time, however many land at once (each used
/// to start its own on a blocking thread of its own — a thread made for
/// each, +10 % of the worker's CPU in the session bench's push row); and
/// every upload's record is still synced before its flight ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_passes_uploads_sync_the_journal_one_at_a_time() {
    let state = tempfile::tempdir().unwrap();
    let t = served_opts(notes(), Some(state.path()), |s| s.with_push(true)).await;
    let notes = &t.mounts[0];
    let (runs_before, _) = t.stores.journal_syncs();
    let files = 24;
    for i in 0..files {
        std::fs::write(notes.join(format!("burst-{i}.md")), format!("burst {i}")).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let on_server = server(&t).await;
        if (0..files).all(|i| on_server.contains_key(&format!("/burst-{i}.md"))) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the burst was not pushed: {on_server:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the last flights end (their sync comes after the upload).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (runs, most_at_once) = t.stores.journal_syncs();
    assert!(
        runs > runs_before,
        "the uploads' records were never made durable"
    );
    assert_eq!(
        most_at_once,
        1,
        "journal fdatasyncs ran side by side ({} in all for {files} uploads)",
        runs - runs_before
    );
}
