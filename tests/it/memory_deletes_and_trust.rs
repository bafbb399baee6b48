//! Deletion discipline, folder trust and keep-the-only-copy, scenario by
//! scenario as the official SDKs test them (`delete-discipline.test.ts`,
//! `folder-trust.test.ts`, `keep-only-copy.test.ts`).

use std::time::Duration;

use crate::common::fake_memory::{Call, Fault, Op, sha};
use crate::common::harness::{H, Logs};
use envworker::api::types::Access;
use envworker::memory::options::DeleteMode;
use envworker::memory::store::MARKER_PATH;

const RW: Access = Access::ReadWrite;
const RO: Access = Access::ReadOnly;

fn deletes(calls: Vec<Call>) -> Vec<String> {
    calls
        .into_iter()
        .filter_map(|c| match c {
            Call::Delete { path, .. } => Some(path),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------- deletes

#[tokio::test(start_paused = true)]
async fn a_local_deletion_is_confirmed_before_it_reaches_the_server() {
    let h = H::new(
        &[("s", RW, &[("a.md", "a"), ("b.md", "b")])],
        DeleteMode::Enabled,
    )
    .await;
    h.rm("s", "a.md");
    h.stores.sync_now().await;
    assert!(
        deletes(h.fake.take_calls()).is_empty(),
        "the first pass only records the miss"
    );
    tokio::time::advance(Duration::from_secs(29)).await;
    h.stores.sync_now().await;
    assert!(
        deletes(h.fake.take_calls()).is_empty(),
        "inside the window nothing happens"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    h.stores.sync_now().await;
    let calls = h.fake.take_calls();
    assert!(
        calls.contains(&Call::Delete {
            path: "/a.md".into(),
            expected: sha("a")
        }),
        "{calls:?}"
    );
    assert_eq!(h.fake.get("s", "a.md"), None);
}

#[tokio::test(start_paused = true)]
async fn a_file_that_reappears_is_not_deleted_and_leaves_pending() {
    let h = H::new(
        &[("s", RW, &[("a.md", "a"), ("b.md", "b")])],
        DeleteMode::Enabled,
    )
    .await;
    h.rm("s", "a.md");
    h.stores.sync_now().await;
    tokio::time::advance(Duration::from_secs(20)).await;
    h.write("s", "a.md", "a");
    h.stores.sync_now().await;
    // Gone again: a fresh window starts now, not at the first sighting.
    h.rm("s", "a.md");
    tokio::time::advance(Duration::from_secs(15)).await;
    h.stores.sync_now().await;
    tokio::time::advance(Duration::from_secs(20)).await;
    h.stores.sync_now().await;
    assert!(
        deletes(h.fake.take_calls()).is_empty(),
        "35s after the first miss but only 20s after the second"
    );
    tokio::time::advance(Duration::from_secs(11)).await;
    h.stores.sync_now().await;
    assert_eq!(deletes(h.fake.take_calls()), vec!["/a.md"]);
}

/// A file the change-driven push saw is not missing: the push breaks a
/// pending delete's streak as a sync's scan does, so a file removed,
/// re-created (and pushed) and removed again gets a fresh 30 s window.
#[tokio::test(start_paused = true)]
async fn a_file_a_push_saw_starts_a_fresh_delete_window() {
    let h = H::new(
        &[("s", RW, &[("a.md", "a"), ("b.md", "b")])],
        DeleteMode::Enabled,
    )
    .await;
    h.rm("s", "a.md");
    h.stores.sync_now().await;
    tokio::time::advance(Duration::from_secs(20)).await;
    h.write("s", "a.md", "a again");
    assert_eq!(h.stores.push_now().await, 1, "the push re-creates a.md");
    h.rm("s", "a.md");
    tokio::time::advance(Duration::from_secs(15)).await;
    h.stores.sync_now().await;
    assert!(
        deletes(h.fake.take_calls()).is_empty(),
        "35 s after the first miss, but only 15 s after the push saw the file"
    );
    tokio::time::advance(Duration::from_secs(31)).await;
    h.stores.sync_now().await;
    assert_eq!(deletes(h.fake.take_calls()), vec!["/a.md"]);
}

#[tokio::test(start_paused = true)]
async fn disabled_mode_never_deletes_but_still_syncs() {
    let h = H::new(
        &[("s", RW, &[("a.md", "a"), ("b.md", "b")])],
        DeleteMode::Disabled,
    )
    .await;
    h.rm("s", "a.md");
    h.write("s", "b.md", "b2");
    h.fake.put("s", "c.md", "c");
    h.stores.sync_now().await;
    tokio::time::advance(Duration::from_secs(60)).await;
    h.stores.sync_now().await;
    h.stores.finish().await.unwrap();
    assert!(deletes(h.fake.take_calls()).is_empty());
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("a"));
    assert_eq!(
        h.fake.get("s", "b.md").as_deref(),
        Some("b2"),
        "uploads go on"
    );
    assert_eq!(h.read("s", "c.md").as_deref(), Some("c"), "pulls go on");
}

#[tokio::test(start_paused = true)]
async fn the_per_pass_cap_spreads_deletes_over_passes() {
    let logs = Logs::capture();
    let names: Vec<String> = (0..14).map(|i| format!("f{i:02}.md")).collect();
    let memories: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "x")).collect();
    let h = H::new(&[("s", RW, &memories)], DeleteMode::Enabled).await;
    for n in &names[..12] {
        h.rm("s", n);
    }
    h.stores.sync_now().await;
    tokio::time::advance(Duration::from_secs(30)).await;
    h.stores.sync_now().await;
    assert_eq!(
        deletes(h.fake.take_calls()).len(),
        8,
        "max(8, min(50, 14/4))"
    );
    assert_eq!(
        logs.count("delete cap reached: sent 8 deletes, held 4 for later syncs"),
        1,
        "{}",
        logs.text()
    );
    h.stores.sync_now().await;
    assert_eq!(deletes(h.fake.take_calls()).len(), 4);
    assert_eq!(h.server("s").len(), 2);
}

#[tokio::test]
async fn the_final_sync_waives_the_window_but_still_re_checks() {
    let h = H::new(
        &[("s", RW, &[("a.md", "a"), ("b.md", "b"), ("c.md", "c")])],
        DeleteMode::Enabled,
    )
    .await;
    h.rm("s", "a.md");
    h.rm("s", "b.md");
    // b.md comes back between the scan and the re-check.
    let back = h.path("s", "b.md");
    h.fake.fault(
        Op::List,
        None,
        Fault::before(move |_| std::fs::write(&back, "b").unwrap()),
    );
    h.stores.finish().await.unwrap();
    assert_eq!(deletes(h.fake.take_calls()), vec!["/a.md"]);
    assert_eq!(h.fake.get("s", "b.md").as_deref(), Some("b"));
}

#[tokio::test(start_paused = true)]
async fn a_folder_destroyed_mid_sync_sends_no_deletes() {
    let h = H::new(
        &[("s", RW, &[("a.md", "a"), ("b.md", "b"), ("c.md", "c")])],
        DeleteMode::Enabled,
    )
    .await;
    h.rm("s", "a.md");
    h.stores.sync_now().await;
    tokio::time::advance(Duration::from_secs(31)).await;
    // The whole folder goes after the scan: the marker re-check fails.
    let root = h.mount("s");
    h.fake.fault(
        Op::List,
        None,
        Fault::before(move |_| std::fs::remove_dir_all(&root).unwrap()),
    );
    h.stores.sync_now().await;
    assert!(deletes(h.fake.take_calls()).is_empty());
    assert_eq!(h.server("s").len(), 3);
    // The next pass rebuilds the folder from the server.
    h.stores.sync_now().await;
    assert_eq!(h.disk("s").len(), 3);
}

#[tokio::test]
async fn an_unreadable_subdirectory_is_skipped_instead_of_reading_as_deletions() {
    if !crate::common::runs_as_nobody(
        "an_unreadable_subdirectory_is_skipped_instead_of_reading_as_deletions",
    ) {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let logs = Logs::capture();
    let h = H::new(
        &[(
            "s",
            RW,
            &[("dir/a.md", "a"), ("dir/b.md", "b"), ("c.md", "c")],
        )],
        DeleteMode::Enabled,
    )
    .await;
    let dir = h.mount("s").join("dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o000)).unwrap();
    h.stores.finish().await.unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(deletes(h.fake.take_calls()).is_empty());
    assert_eq!(h.server("s").len(), 3);
    // Skipped with one warning (issue 12 item 2); the rest of the pass runs.
    assert_eq!(logs.count("memory sync failed"), 0, "{}", logs.text());
    assert_eq!(logs.count("cannot be read"), 1, "{}", logs.text());
}

#[tokio::test(start_paused = true)]
async fn a_recovery_re_download_clears_pending_deletes() {
    let h = H::new(
        &[("s", RW, &[("a.md", "a"), ("b.md", "b")])],
        DeleteMode::Enabled,
    )
    .await;
    h.rm("s", "a.md");
    h.stores.sync_now().await; // a.md pending
    std::fs::remove_dir_all(h.mount("s")).unwrap();
    h.stores.sync_now().await; // recovered: a.md back from the server
    assert_eq!(h.read("s", "a.md").as_deref(), Some("a"));
    h.rm("s", "a.md");
    tokio::time::advance(Duration::from_secs(31)).await;
    h.stores.sync_now().await;
    assert!(
        deletes(h.fake.take_calls()).is_empty(),
        "the old sighting does not corroborate the new deletion"
    );
}

#[tokio::test(start_paused = true)]
async fn log_only_mode_logs_the_delete_but_never_sends_it() {
    let logs = Logs::capture();
    let h = H::new(
        &[("s", RW, &[("a.md", "a"), ("b.md", "b")])],
        DeleteMode::LogOnly,
    )
    .await;
    h.rm("s", "a.md");
    h.stores.sync_now().await;
    tokio::time::advance(Duration::from_secs(31)).await;
    h.stores.sync_now().await;
    h.stores.sync_now().await;
    h.stores.finish().await.unwrap();
    assert!(deletes(h.fake.take_calls()).is_empty());
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("a"));
    assert_eq!(
        logs.count("log-only: sync would delete this memory on the server"),
        3,
        "logged on every sync"
    );
}

// ---------------------------------------------------------- folder trust

#[tokio::test]
async fn a_deleted_folder_issues_no_deletes_and_is_rebuilt() {
    let logs = Logs::capture();
    let h = H::new(
        &[("s", RW, &[("a.md", "a"), ("b/c.md", "c")])],
        DeleteMode::Enabled,
    )
    .await;
    std::fs::remove_dir_all(h.mount("s")).unwrap();
    h.stores.finish().await.unwrap();
    assert!(h.fake.take_writes().is_empty());
    assert_eq!(h.disk("s"), h.server("s"));
    assert_eq!(logs.count("the folder or its marker is gone; re-downloading the memory store folder instead of syncing"), 1);
}

#[tokio::test]
async fn an_emptied_folder_issues_no_deletes_and_is_repopulated() {
    let h = H::new(
        &[("s", RW, &[("a.md", "a"), ("b/c.md", "c")])],
        DeleteMode::Enabled,
    )
    .await;
    for entry in std::fs::read_dir(h.mount("s")).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            std::fs::remove_dir_all(p).unwrap();
        } else {
            std::fs::remove_file(p).unwrap();
        }
    }
    h.stores.finish().await.unwrap();
    assert!(h.fake.take_writes().is_empty());
    assert_eq!(h.disk("s"), h.server("s"));
}

#[tokio::test]
async fn an_emptied_folder_with_the_marker_left_behind_issues_no_deletes() {
    let logs = Logs::capture();
    let h = H::new(
        &[("s", RW, &[("a.md", "a"), ("b.md", "b")])],
        DeleteMode::Enabled,
    )
    .await;
    h.rm("s", "a.md");
    h.rm("s", "b.md"); // `rm dir/*` keeps the dotfile
    h.stores.finish().await.unwrap();
    assert!(h.fake.take_writes().is_empty());
    assert_eq!(h.disk("s").len(), 2);
    assert_eq!(logs.count("every memory file is gone at once"), 1);
}

#[tokio::test]
async fn a_swapped_folder_neither_deletes_nor_uploads_ever() {
    let logs = Logs::capture();
    let h = H::new(
        &[("s", RW, &[("a.md", "a"), ("b.md", "b")])],
        DeleteMode::Enabled,
    )
    .await;
    std::fs::write(h.path("s", MARKER_PATH), "version 1\nmemstore_someone_else").unwrap();
    h.rm("s", "a.md");
    h.write("s", "b.md", "edited");
    h.write("s", "new.md", "new");
    h.stores.sync_now().await;
    h.stores.finish().await.unwrap();
    h.stores.flush_writes().await;
    assert!(h.fake.take_writes().is_empty());
    assert!(logs.count("the marker file does not match this store; leaving the memory store folder as found and not syncing") >= 2);
    // The server copy is intact; dispose keeps the folder.
    h.stores.dispose().await;
    assert!(h.mount("s").exists());
}

#[tokio::test]
async fn files_without_a_marker_are_neither_pushed_nor_pulled_over() {
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    h.rm("s", MARKER_PATH);
    h.write("s", "a.md", "edited");
    h.fake.put("s", "a.md", "remote edit");
    h.stores.sync_now().await;
    h.stores.finish().await.unwrap();
    assert!(h.fake.take_writes().is_empty());
    assert_eq!(
        h.read("s", "a.md").as_deref(),
        Some("edited"),
        "not pulled over"
    );
}

#[tokio::test]
async fn a_single_local_deletion_with_the_marker_intact_still_propagates() {
    let h = H::new(
        &[("s", RW, &[("a.md", "a"), ("b.md", "b")])],
        DeleteMode::Enabled,
    )
    .await;
    h.rm("s", "a.md");
    h.stores.finish().await.unwrap();
    assert_eq!(deletes(h.fake.take_calls()), vec!["/a.md"]);
}

#[tokio::test]
async fn the_marker_never_syncs_in_either_direction() {
    let logs = Logs::capture();
    let h = H::prepare(
        &[(
            "s",
            RW,
            &[("a.md", "a"), (MARKER_PATH, "version 1\nhijack")],
        )],
        DeleteMode::Enabled,
    );
    let h = H::download(h, &[("s", RW, &[])]).await;
    assert_eq!(
        h.read("s", MARKER_PATH).as_deref(),
        Some("version 1\ns"),
        "the server's copy is not written"
    );
    assert!(logs.count("the server listed the reserved marker path; skipping") >= 1);
    h.stores.finish().await.unwrap();
    h.stores.flush_writes().await;
    let writes = h.fake.take_writes();
    assert!(writes.is_empty(), "{writes:?}");
}

#[tokio::test]
async fn dispose_tolerates_an_already_deleted_folder() {
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    std::fs::remove_dir_all(h.mount("s")).unwrap();
    h.stores.dispose().await;
    assert!(!h.mount("s").exists());
}

#[tokio::test]
async fn dispose_keeps_a_folder_that_fails_the_marker_check() {
    let logs = Logs::capture();
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    h.rm("s", MARKER_PATH);
    h.stores.dispose().await;
    assert_eq!(h.read("s", "a.md").as_deref(), Some("a"));
    assert_eq!(
        logs.count("the marker file is gone; leaving the memory store folder on disk"),
        1
    );
}

#[tokio::test]
async fn dispose_never_throws_when_a_store_root_is_replaced_by_a_file() {
    let logs = Logs::capture();
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    std::fs::remove_dir_all(h.mount("s")).unwrap();
    std::fs::write(h.mount("s"), "a file now").unwrap();
    h.stores.dispose().await;
    assert_eq!(std::fs::read_to_string(h.mount("s")).unwrap(), "a file now");
    assert_eq!(logs.count("failed to remove the memory store folder"), 1);
}

#[tokio::test]
async fn a_marker_from_an_older_format_no_longer_clears_the_folder() {
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    std::fs::write(h.path("s", MARKER_PATH), "s").unwrap(); // a bare store id
    h.write("s", "a.md", "edited");
    h.stores.finish().await.unwrap();
    assert!(h.fake.take_writes().is_empty());
}

#[tokio::test]
async fn a_folder_wiped_while_a_pull_is_in_flight_is_rebuilt_not_distrusted() {
    let h = H::new(
        &[(
            "s",
            RW,
            &[("z.md", "z1"), ("sub/z.md", "s1"), ("keep.md", "k")],
        )],
        DeleteMode::Enabled,
    )
    .await;
    h.fake.put("s", "z.md", "z2");
    h.fake.put("s", "sub/z.md", "s2");
    let root = h.mount("s");
    h.fake.fault(
        Op::Retrieve,
        None,
        Fault::before(move |_| {
            let _ = std::fs::remove_dir_all(&root);
        }),
    );
    h.stores.sync_now().await;
    assert!(!h.mount("s").exists(), "the pull never re-creates the root");
    h.stores.sync_now().await;
    assert_eq!(h.disk("s"), h.server("s"), "rebuilt");
    assert!(h.fake.take_writes().is_empty());
}

#[tokio::test]
async fn a_folder_wiped_while_a_locally_deleted_memory_is_being_restored_is_rebuilt() {
    let h = H::new(
        &[("s", RW, &[("a.md", "a1"), ("b.md", "b")])],
        DeleteMode::Enabled,
    )
    .await;
    h.rm("s", "a.md");
    h.fake.put("s", "a.md", "a2");
    let root = h.mount("s");
    h.fake.fault(
        Op::Retrieve,
        Some("a.md"),
        Fault::before(move |_| {
            let _ = std::fs::remove_dir_all(&root);
        }),
    );
    h.stores.sync_now().await;
    h.stores.sync_now().await;
    assert_eq!(h.disk("s"), h.server("s"));
    assert!(h.fake.take_writes().is_empty());
}

#[tokio::test]
async fn a_folder_wiped_again_mid_recovery_is_rebuilt_by_the_next_sync() {
    let h = H::new(
        &[("s", RW, &[("a.md", "a"), ("b.md", "b")])],
        DeleteMode::Enabled,
    )
    .await;
    std::fs::remove_dir_all(h.mount("s")).unwrap();
    // The recovery's full listing finds the folder gone again.
    let root = h.mount("s");
    h.fake.fault(
        Op::List,
        None,
        Fault::before(move |_| {
            let _ = std::fs::remove_dir_all(&root);
        }),
    );
    h.stores.sync_now().await;
    h.stores.sync_now().await;
    assert_eq!(h.disk("s"), h.server("s"));
    assert!(h.fake.take_writes().is_empty());
}

// ---------------------------------------------------- keep the only copy

#[tokio::test]
async fn an_edited_file_survives_a_remote_delete_and_is_re_created() {
    let logs = Logs::capture();
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    h.write("s", "a.md", "edited");
    h.fake.remove("s", "a.md");
    h.stores.sync_now().await;
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("edited"));
    assert_eq!(
        logs.count("memory deleted remotely but edited locally; re-creating it from the file"),
        1
    );
}

#[tokio::test]
async fn a_read_only_store_keeps_the_edited_file_without_pushing() {
    let logs = Logs::capture();
    let h = H::new(&[("kb", RO, &[("a.md", "a")])], DeleteMode::Enabled).await;
    h.write("kb", "a.md", "edited");
    h.fake.remove("kb", "a.md");
    h.stores.sync_now().await;
    h.stores.sync_now().await;
    assert_eq!(h.read("kb", "a.md").as_deref(), Some("edited"));
    assert!(h.fake.take_writes().is_empty());
    assert_eq!(
        logs.count("memory deleted remotely but edited locally; keeping the file, which a read-only store cannot push"),
        1,
        "warned once"
    );
}

#[tokio::test]
async fn a_refused_edit_survives_a_remote_delete_without_a_retry() {
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    h.fake.max_content(5);
    h.write("s", "a.md", "far too long");
    h.stores.sync_now().await; // refused
    h.fake.remove("s", "a.md");
    h.fake.take_calls();
    h.stores.sync_now().await;
    h.stores.sync_now().await;
    assert_eq!(h.read("s", "a.md").as_deref(), Some("far too long"));
    assert!(
        h.fake.take_writes().is_empty(),
        "not re-offered while unchanged"
    );
}

#[tokio::test]
async fn a_memory_deleted_between_the_listing_and_the_update_is_re_created() {
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    h.write("s", "a.md", "edited");
    h.fake.fault(
        Op::Update,
        Some("a.md"),
        Fault::before(|stores| {
            stores.get_mut("s").unwrap().remove("/a.md");
        }),
    );
    h.stores.sync_now().await;
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("edited"));
    let writes = h.fake.take_writes();
    assert!(
        matches!(writes.last(), Some(Call::Create { .. })),
        "{writes:?}"
    );
}

#[tokio::test]
async fn an_edit_written_mid_sync_still_survives_a_remote_delete() {
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    h.fake.remove("s", "a.md");
    // The agent edits the file after the scan, before the removal.
    let file = h.path("s", "a.md");
    h.fake.fault(
        Op::List,
        None,
        Fault::before(move |_| std::fs::write(&file, "written mid-sync").unwrap()),
    );
    h.stores.sync_now().await;
    assert_eq!(h.read("s", "a.md").as_deref(), Some("written mid-sync"));
    assert_eq!(
        h.fake.get("s", "a.md").as_deref(),
        Some("written mid-sync"),
        "re-created from the only copy"
    );
}

#[tokio::test]
async fn a_read_only_pull_over_a_local_edit_is_warned() {
    let logs = Logs::capture();
    let h = H::new(&[("kb", RO, &[("a.md", "a")])], DeleteMode::Enabled).await;
    h.write("kb", "a.md", "local");
    h.fake.put("kb", "a.md", "remote");
    h.stores.sync_now().await;
    assert_eq!(h.read("kb", "a.md").as_deref(), Some("remote"));
    assert_eq!(
        logs.count("memory changed both locally and remotely; keeping the remote version"),
        1
    );
}

#[tokio::test]
async fn a_failed_re_read_does_not_resurrect_a_server_deleted_memory() {
    if !crate::common::runs_as_nobody("a_failed_re_read_does_not_resurrect_a_server_deleted_memory")
    {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let h = H::new(
        &[("s", RW, &[("dir/a.md", "a"), ("b.md", "b")])],
        DeleteMode::Enabled,
    )
    .await;
    h.fake.remove("s", "dir/a.md");
    // The scan sees the file; the re-read before removal fails.
    let dir = h.mount("s").join("dir");
    h.fake.fault(
        Op::List,
        None,
        Fault::before(move |_| {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o000)).unwrap();
        }),
    );
    h.stores.sync_now().await;
    std::fs::set_permissions(
        h.mount("s").join("dir"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    assert_eq!(h.fake.get("s", "dir/a.md"), None, "never re-uploaded");
    h.stores.sync_now().await;
    assert_eq!(h.fake.get("s", "dir/a.md"), None);
    assert_eq!(h.read("s", "dir/a.md"), None, "removed on a later pass");
}

// ------------------------------------ found by the model-based property test

#[tokio::test]
async fn an_edit_made_after_a_failed_recovery_is_not_mistaken_for_a_conflict() {
    let logs = Logs::capture();
    let h = H::new(
        &[("s", RW, &[("a.md", "a"), ("c.md", "c")])],
        DeleteMode::Enabled,
    )
    .await;
    h.rm("s", "a.md");
    h.rm("s", "c.md"); // a wipe: the sync re-downloads the folder …
    h.fake.fault(Op::List, None, Fault::Delay(Duration::ZERO)); // (the basic listing passes)
    h.fake.fault(Op::List, None, Fault::Status(500)); // … and the re-download's full listing fails
    h.stores.sync_now().await;
    assert!(
        logs.count("every memory file is gone at once") == 1
            && logs.count("memory sync failed") == 1,
        "{}",
        logs.text()
    );
    h.write("s", "c.md", "the agent's edit");
    h.stores.finish().await.unwrap();
    assert_eq!(
        h.fake.get("s", "c.md").as_deref(),
        Some("the agent's edit"),
        "the edit is not lost"
    );
    assert_eq!(
        h.fake.get("s", "a.md").as_deref(),
        Some("a"),
        "a missing file is restored, never deleted"
    );
    assert_eq!(h.read("s", "a.md").as_deref(), Some("a"));
    assert_eq!(
        logs.count("keeping the remote version"),
        0,
        "{}",
        logs.text()
    );
}

#[tokio::test(start_paused = true)]
async fn a_file_seen_by_a_pass_that_failed_later_still_breaks_a_pending_delete() {
    let h = H::new(
        &[("s", RW, &[("a.md", "a"), ("b.md", "b")])],
        DeleteMode::Enabled,
    )
    .await;
    h.rm("s", "a.md");
    h.stores.sync_now().await; // missing since now
    h.write("s", "a.md", "back");
    tokio::time::advance(Duration::from_secs(31)).await;
    h.fake.fault(Op::List, None, Fault::Status(500));
    h.stores.sync_now().await; // the scan sees it back; the listing fails
    h.rm("s", "a.md");
    h.stores.sync_now().await; // missing again: a fresh window
    assert!(
        deletes(h.fake.take_calls()).is_empty(),
        "the absence was not continuous"
    );
    tokio::time::advance(Duration::from_secs(31)).await;
    h.stores.sync_now().await;
    assert_eq!(deletes(h.fake.take_calls()), vec!["/a.md"]);
}
