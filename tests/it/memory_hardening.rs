//! Issue 12, items 2–4, against the devserver over real HTTP: an unreadable
//! entry never blocks the rest of a store, a file's size never drives the
//! worker's memory use, and work that reached the server is remembered even
//! when the pass that did it is cut off or the final sync fails.
//!
//! `ENVWORKER_SPARSE_MIB` sets the size of the sparse file of the RSS check
//! (default 512 MiB; it costs no disk and, fixed, no memory either);
//! `ENVWORKER_DEEP_LEVELS` the depth of the directory chain (default 5,000).

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use crate::common::harness::Logs;
use crate::common::memory_served::{Served, served_opts};
use serde_json::json;

fn chmod(path: &std::path::Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A store of a few memories, with `extra` more: the session, the store's
/// id and its folder. Without the change-driven push: these tests count the
/// warnings of the syncs, and a capture is per thread (the push warns the
/// same things from its own task).
async fn notes(extra: serde_json::Value) -> (Served, String, std::path::PathBuf) {
    let mut memories =
        json!({"/a.md": "a1", "/dir/b.md": "b1", "/dir/c.md": "c1", "/locked.md": "l1"});
    memories
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let t = served_opts(
        json!([{"key": "notes", "name": "Notes", "memories": memories}]),
        None,
        |s| s.without_push(),
    )
    .await;
    let (store, root) = (t.ids[0].clone(), t.mounts[0].clone());
    (t, store, root)
}

/// Item 2. Before the fix: every sync and the flush failed on the first
/// unreadable entry, so the edits to `a.md` and `new.md` were lost (2 of 2),
/// and the folder stayed behind, so the next session could not mount.
#[tokio::test]
async fn an_unreadable_file_and_folder_never_block_the_other_edits() {
    if !crate::common::runs_as_nobody("an_unreadable_file_and_folder_never_block_the_other_edits") {
        return;
    }
    let logs = Logs::capture();
    let (t, store, root) = notes(json!({})).await;
    std::fs::write(root.join("a.md"), "a2, the agent's edit").unwrap();
    std::fs::write(root.join("new.md"), "a new note").unwrap();
    chmod(&root.join("locked.md"), 0o000);
    chmod(&root.join("dir"), 0o000);
    // Another writer edits a memory under the unreadable folder: nothing
    // may be pulled over it (the folder's content is unknown).
    let b = t.memory_id(&store, "/dir/b.md").await;
    t.s.memory(
        reqwest::Method::POST,
        &format!("/v1/memory_stores/{store}/memories/{b}"),
        Some(json!({"content": "b2, remote"})),
    )
    .await
    .ok();
    t.stores.sync_now().await;
    t.stores.sync_now().await;
    let report = t.stores.teardown(true, Duration::from_secs(10)).await;
    assert_eq!(
        t.s.store_memories(&store).await,
        crate::common::contents(&[
            ("/a.md", "a2, the agent's edit"),
            ("/dir/b.md", "b2, remote"),
            ("/dir/c.md", "c1"),
            ("/locked.md", "l1"),
            ("/new.md", "a new note"),
        ]),
        "the other edits reached the server and nothing was deleted ({report:?}): {}",
        logs.text()
    );
    for path in ["locked.md", "dir"] {
        let warned = logs
            .text()
            .lines()
            .filter(|l| l.contains("cannot be read") && l.contains(path))
            .count();
        assert_eq!(warned, 1, "{path} warned once: {}", logs.text());
    }
    assert_eq!(logs.count("memory sync failed"), 0, "{}", logs.text());
    assert!(
        !root.exists(),
        "dispose removed the folder, so the next session can mount: {}",
        logs.text()
    );
}

/// Item 2, the store's own entries. Before the fix: a `chmod 000` marker
/// made the folder untrusted (the edit was never pushed), and a `chmod 000`
/// root failed every pass and kept the folder on disk.
#[tokio::test]
async fn an_unreadable_marker_or_root_is_still_ours_to_sync_and_remove() {
    if !crate::common::runs_as_nobody(
        "an_unreadable_marker_or_root_is_still_ours_to_sync_and_remove",
    ) {
        return;
    }
    let logs = Logs::capture();
    let (t, store, root) = notes(json!({})).await;
    std::fs::write(root.join("a.md"), "a2, the agent's edit").unwrap();
    chmod(&root.join(".anthropic-memory-store"), 0o000);
    t.stores.sync_now().await;
    assert_eq!(
        t.s.store_memories(&store)
            .await
            .get("/a.md")
            .map(String::as_str),
        Some("a2, the agent's edit"),
        "{}",
        logs.text()
    );
    chmod(&root, 0o000);
    t.stores.sync_now().await;
    let report = t.stores.teardown(true, Duration::from_secs(10)).await;
    assert_eq!(
        t.s.store_memories(&store).await.len(),
        4,
        "nothing deleted ({report:?}): {}",
        logs.text()
    );
    assert_eq!(logs.count("re-downloading"), 0, "{}", logs.text());
    assert!(!root.exists(), "removed: {}", logs.text());
}

/// Item 3. Before the fix, `ENVWORKER_SPARSE_MIB=256`: the worker read the
/// file whole and JSON-encoded it — peak RSS 1,823 MiB (see the commit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_sparse_file_never_drives_memory_use() {
    if !crate::common::runs_alone("an_oversized_sparse_file_never_drives_memory_use") {
        return;
    }
    let mib = crate::common::env_count("ENVWORKER_SPARSE_MIB", 512);
    let (t, store, root) = notes(json!({"/big.md": "small once"})).await;
    let before = crate::common::peak_rss_kib();
    std::fs::File::create(root.join("big.md"))
        .unwrap()
        .set_len(mib << 20)
        .unwrap();
    std::fs::File::create(root.join("huge-new.md"))
        .unwrap()
        .set_len(mib << 20)
        .unwrap();
    std::fs::write(root.join("a.md"), "a2").unwrap();
    t.stores.sync_now().await;
    t.stores.sync_now().await;
    t.stores.teardown(true, Duration::from_secs(20)).await;
    let peak = crate::common::peak_rss_kib();
    println!(
        "sparse file: {mib} MiB; peak RSS before the syncs {} MiB, after {} MiB",
        before / 1024,
        peak / 1024
    );
    let held = t.s.store_memories(&store).await;
    assert_eq!(held.get("/a.md").map(String::as_str), Some("a2"));
    assert_eq!(
        held.get("/big.md").map(String::as_str),
        Some("small once"),
        "refused, not deleted"
    );
    assert!(!held.contains_key("/huge-new.md"));
    assert!(
        peak < before + 64 * 1024,
        "peak RSS grew from {before} KiB to {peak} KiB with a {mib} MiB file"
    );
}

/// Item 4. Before the fix: the cut-off pass forgot that `a.md` = a2 had
/// landed, so the agent's next edit (a3) was judged a conflict and
/// overwritten by a2, on the server and on disk (1 of 1 edits lost).
#[tokio::test]
async fn an_edit_after_a_cut_off_pass_is_kept_not_overwritten() {
    let logs = Logs::capture();
    let (t, store, root) = notes(json!({})).await;
    let b = t.memory_id(&store, "/dir/b.md").await;
    // b.md's upload hangs past the bound; a.md's lands at once.
    t.s.add_faults(vec![json!({"method": "POST", "path": format!("/v1/memory_stores/{store}/memories/{b}"), "latency_ms": 30_000})])
        .await;
    std::fs::write(root.join("a.md"), "a2").unwrap();
    std::fs::write(root.join("dir/b.md"), "b2").unwrap();
    // Cut the pass off once a.md's upload has landed (polled, so a loaded
    // machine cannot make the cut come first), while b.md's still hangs.
    let mut pass = Box::pin(t.stores.sync_now());
    let landed = async {
        while t
            .s
            .store_memories(&store)
            .await
            .get("/a.md")
            .map(String::as_str)
            != Some("a2")
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        _ = &mut pass => panic!("the pass ended although b.md's upload hangs"),
        landed = tokio::time::timeout(Duration::from_secs(20), landed) => {
            landed.expect("a.md's upload landed");
        }
    }
    drop(pass); // the cut-off
    t.s.clear_faults().await;
    std::fs::write(root.join("a.md"), "a3, edited again").unwrap();
    t.stores.sync_now().await;
    assert_eq!(
        std::fs::read_to_string(root.join("a.md")).unwrap(),
        "a3, edited again",
        "{}",
        logs.text()
    );
    assert_eq!(
        t.s.store_memories(&store)
            .await
            .get("/a.md")
            .map(String::as_str),
        Some("a3, edited again")
    );
    assert_eq!(
        logs.count("changed both locally and remotely"),
        0,
        "{}",
        logs.text()
    );
    t.stores.dispose().await;
}

/// Item 4. Before the fix: the final sync failed on the listing, and so did
/// the flush, which needed the same listing: 2 of 2 edits lost.
#[tokio::test]
async fn a_failed_final_sync_still_flushes_every_edit() {
    let logs = Logs::capture();
    let (t, store, root) = notes(json!({})).await;
    std::fs::write(root.join("a.md"), "a2, before the end").unwrap();
    std::fs::write(root.join("new.md"), "new, before the end").unwrap();
    t.s.add_faults(vec![
        json!({"method": "GET", "path": "/v1/memory_stores/*/memories", "status": 500}),
    ])
    .await;
    t.stores.teardown(true, Duration::from_secs(10)).await;
    t.s.clear_faults().await;
    let held = t.s.store_memories(&store).await;
    assert_eq!(
        held.get("/a.md").map(String::as_str),
        Some("a2, before the end"),
        "{}",
        logs.text()
    );
    assert_eq!(
        held.get("/new.md").map(String::as_str),
        Some("new, before the end")
    );
    assert!(!root.exists());
}

/// Decision 10: a tree's shape never drives the worker's stack or
/// descriptors. Before the fix, the scan recursed once per level on a 2 MiB
/// blocking thread: a 5,000-deep chain overflowed its stack at the next
/// sync and aborted the whole process (every session's unsynced edits
/// lost). Now what lies deeper than the cap is unknown (warned once, never
/// read as deleted), the other edits sync, and dispose removes the chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_chain_thousands_deep_never_aborts_a_sync() {
    if !crate::common::runs_alone("a_directory_chain_thousands_deep_never_aborts_a_sync") {
        return;
    }
    let depth = crate::common::env_count("ENVWORKER_DEEP_LEVELS", 5_000) as usize;
    let logs = Logs::capture();
    let (t, store, root) = notes(json!({})).await;
    crate::common::deep_chain(&root, depth, "deep.md", "deep");
    std::fs::write(root.join("a.md"), "a2, the agent's edit").unwrap();
    let fds = crate::common::open_fds();
    t.stores.sync_now().await;
    t.stores.sync_now().await;
    let report = t.stores.teardown(true, Duration::from_secs(30)).await;
    let held = t.s.store_memories(&store).await;
    assert_eq!(
        held.get("/a.md").map(String::as_str),
        Some("a2, the agent's edit"),
        "{report:?}: {}",
        logs.text()
    );
    for path in ["/dir/b.md", "/dir/c.md", "/locked.md"] {
        assert!(held.contains_key(path), "{path} not deleted: {held:?}");
    }
    assert!(
        held.keys().all(|k| !k.ends_with("/deep.md")),
        "deeper than the cap: never uploaded"
    );
    let warned = logs
        .text()
        .lines()
        .filter(|l| l.contains("cannot be read"))
        .count();
    // `d` and `e` at the cap, each warned once.
    assert_eq!(warned, 2, "the deep entries warned once: {}", logs.text());
    assert_eq!(logs.count("memory sync failed"), 0, "{}", logs.text());
    assert!(!root.exists(), "dispose removed the chain: {}", logs.text());
    println!(
        "{depth}-deep chain: synced and removed; descriptors before {fds}, after {}",
        crate::common::open_fds()
    );
}
