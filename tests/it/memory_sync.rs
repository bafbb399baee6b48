//! The memory sync engine, scenario by scenario as the official SDKs test it
//! (`memory-sync.test.ts` and its Python and Go twins), over the in-process
//! fake where a failure must land at an exact point.

use std::sync::Arc;
use std::time::Duration;

use crate::common::fake_memory::{Call, FakeMemory, Fault, Op, sha};
use crate::common::harness::{H, Logs, session};
use envworker::api::types::{Access, MemoryListItem, MemoryPrefix};
use envworker::memory::options::{DeleteMode, SyncInterval};
use envworker::memory::{MemoryError, SessionMemoryStores};

const RW: Access = Access::ReadWrite;
const RO: Access = Access::ReadOnly;

use crate::common::contents as map;

#[tokio::test]
async fn edits_flow_both_ways_and_the_server_wins_conflicts() {
    let logs = Logs::capture();
    let h = H::new(
        &[("s", RW, &[("a.md", "a1"), ("b.md", "b1"), ("c.md", "c1")])],
        DeleteMode::Enabled,
    )
    .await;
    assert_eq!(
        h.disk("s"),
        map(&[("a.md", "a1"), ("b.md", "b1"), ("c.md", "c1")])
    );
    h.write("s", "a.md", "a2-local");
    h.fake.put("s", "b.md", "b2-remote");
    h.write("s", "c.md", "c2-local");
    h.fake.put("s", "c.md", "c2-remote");
    h.write("s", "new/d.md", "d-local");
    h.stores.sync_now().await;
    assert_eq!(
        h.server("s"),
        map(&[
            ("a.md", "a2-local"),
            ("b.md", "b2-remote"),
            ("c.md", "c2-remote"),
            ("new/d.md", "d-local")
        ])
    );
    assert_eq!(
        h.disk("s"),
        h.server("s"),
        "the server wins the conflict on c.md"
    );
    assert_eq!(
        logs.count("memory changed both locally and remotely; keeping the remote version"),
        1
    );
    // The update was guarded by the listed hash; the new file was created.
    let writes = h.fake.take_writes();
    assert!(
        writes.contains(&Call::Update {
            path: "/a.md".into(),
            content: "a2-local".into(),
            expected: sha("a1")
        }),
        "{writes:?}"
    );
    assert!(
        writes.contains(&Call::Create {
            path: "/new/d.md".into(),
            content: "d-local".into()
        }),
        "{writes:?}"
    );
    // A second pass has nothing to do.
    h.stores.sync_now().await;
    assert!(h.fake.take_writes().is_empty());
}

/// The mount's writes go straight to the stat cache; an edit the agent makes
/// the instant the mount returns — same size, same inode — must still
/// change the cached stat and be uploaded.
#[tokio::test]
async fn an_edit_right_after_the_mount_is_synced_even_at_the_same_size() {
    let h = H::new(
        &[("s", RW, &[("a.md", "a1"), ("d/b.md", "b1")])],
        DeleteMode::Enabled,
    )
    .await;
    h.write("s", "a.md", "a2");
    h.write("s", "d/b.md", "b2");
    h.stores.sync_now().await;
    assert_eq!(h.server("s"), map(&[("a.md", "a2"), ("d/b.md", "b2")]));
    let writes = h.fake.take_writes();
    assert!(
        writes.contains(&Call::Update {
            path: "/a.md".into(),
            content: "a2".into(),
            expected: sha("a1")
        }),
        "{writes:?}"
    );
}

/// A folder on tmpfs is read for its uploads on the sync's own task (no
/// blocking thread each): the same uploads as on disk — a new file and an
/// edit land with their exact bytes — and the same refusals: content that
/// is not UTF-8 and a FIFO under a memory's name are not uploaded, and the
/// FIFO (no writer) never holds the sync.
#[tokio::test]
async fn a_folder_in_memory_uploads_and_refuses_as_one_on_disk() {
    let Some(h) = H::in_memory(&[("s", RW, &[("a.md", "a1")])], DeleteMode::Enabled).await else {
        eprintln!("skipped: no /dev/shm");
        return;
    };
    h.write("s", "a.md", "a2 é");
    h.write("s", "d/new.md", "new");
    std::fs::write(h.path("s", "bytes.md"), b"\xff\xfe not text").unwrap();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        h.path("s", "pipe.md"),
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(20), h.stores.sync_now())
        .await
        .expect("the sync is not held by the FIFO");
    assert_eq!(h.server("s"), map(&[("a.md", "a2 é"), ("d/new.md", "new")]));
}

#[tokio::test]
async fn local_deletions_reach_the_server_unless_it_changed() {
    let h = H::new(
        &[(
            "s",
            RW,
            &[("gone.md", "g"), ("race.md", "r1"), ("keep.md", "k")],
        )],
        DeleteMode::Enabled,
    )
    .await;
    h.rm("s", "gone.md");
    h.rm("s", "race.md");
    h.fake.put("s", "race.md", "r2-remote");
    h.stores.finish().await.unwrap();
    assert_eq!(
        h.fake.get("s", "gone.md"),
        None,
        "corroborated at the final sync"
    );
    assert_eq!(h.fake.get("s", "race.md").as_deref(), Some("r2-remote"));
    assert_eq!(
        h.read("s", "race.md").as_deref(),
        Some("r2-remote"),
        "restored, not deleted"
    );
}

#[tokio::test]
async fn a_failed_download_write_is_never_read_as_a_deletion() {
    let h = H::prepare(
        &[("s", RW, &[("ok.md", "o"), ("blocked/x.md", "x")])],
        DeleteMode::Enabled,
    );
    // Once the root exists (at the listing), a regular file takes the place
    // of a directory: the write of blocked/x.md fails.
    let in_the_way = h.mount("s").join("blocked");
    h.fake.fault(
        Op::List,
        None,
        Fault::before(move |_| std::fs::write(&in_the_way, "in the way").unwrap()),
    );
    let h = H::download(h, &[("s", RW, &[])]).await;
    assert!(!h.stores.stores()[0].baseline().contains_key("blocked/x.md"));
    std::fs::remove_file(h.path("s", "blocked")).unwrap();
    h.stores.finish().await.unwrap();
    assert_eq!(
        h.fake.get("s", "blocked/x.md").as_deref(),
        Some("x"),
        "never deleted"
    );
    assert_eq!(
        h.read("s", "blocked/x.md").as_deref(),
        Some("x"),
        "pulled again instead"
    );
}

#[tokio::test]
async fn read_only_stores_are_never_written() {
    let logs = Logs::capture();
    let h = H::new(
        &[("kb", RO, &[("faq.md", "f1"), ("old.md", "o")])],
        DeleteMode::Enabled,
    )
    .await;
    h.write("kb", "faq.md", "edited locally");
    h.write("kb", "new.md", "new locally");
    h.rm("kb", "old.md");
    h.stores.sync_now().await;
    h.stores.finish().await.unwrap();
    assert!(
        h.fake.take_writes().is_empty(),
        "a read-only store never pushes or deletes"
    );
    assert_eq!(h.server("kb"), map(&[("faq.md", "f1"), ("old.md", "o")]));
    // A remote change still comes down, over the local edit, with a warning.
    let h = H::new(&[("kb", RO, &[("faq.md", "f1")])], DeleteMode::Enabled).await;
    h.write("kb", "faq.md", "edited locally");
    h.fake.put("kb", "faq.md", "f2");
    h.stores.sync_now().await;
    assert_eq!(h.read("kb", "faq.md").as_deref(), Some("f2"));
    assert!(logs.count("keeping the remote version") >= 1);
}

#[tokio::test]
async fn a_read_only_store_still_applies_a_remote_deletion() {
    let h = H::new(
        &[("kb", RO, &[("faq.md", "f"), ("gone.md", "g")])],
        DeleteMode::Enabled,
    )
    .await;
    h.fake.remove("kb", "gone.md");
    h.stores.sync_now().await;
    assert_eq!(h.read("kb", "gone.md"), None);
    assert_eq!(h.read("kb", "faq.md").as_deref(), Some("f"));
}

#[tokio::test]
async fn paths_that_escape_the_store_are_refused() {
    let logs = Logs::capture();
    let h = H::prepare(
        &[(
            "s",
            RW,
            &[
                ("ok.md", "o"),
                ("../escape.md", "evil"),
                ("a/../../b.md", "evil"),
            ],
        )],
        DeleteMode::Enabled,
    );
    let h = H::download(h, &[("s", RW, &[])]).await;
    assert_eq!(h.disk("s"), map(&[("ok.md", "o")]));
    assert!(!h.dir.path().join("mnt/escape.md").exists());
    assert!(!h.dir.path().join("b.md").exists());
    assert_eq!(logs.count("failed to write memory"), 2);
    // Never in the baseline, so never deleted by a later sync.
    h.stores.finish().await.unwrap();
    assert_eq!(h.fake.get("s", "../escape.md").as_deref(), Some("evil"));
}

#[tokio::test(start_paused = true)]
async fn worker_lifecycle_cadence_and_dispose() {
    let h = H::prepare(&[("s", RW, &[("a.md", "1")])], DeleteMode::Enabled);
    let h = H::download(h, &[("s", RW, &[])]).await;
    assert!(
        h.stores.sync_if_due().await.is_none(),
        "not due right after the download"
    );
    tokio::time::advance(Duration::from_secs(14)).await;
    assert!(h.stores.sync_if_due().await.is_none());
    assert!(h.fake.take_calls().is_empty());
    // One long gap triggers exactly one sync.
    tokio::time::advance(Duration::from_secs(100)).await;
    assert!(h.stores.sync_if_due().await.is_some());
    assert!(h.stores.sync_if_due().await.is_none());
    assert_eq!(
        h.fake
            .take_calls()
            .iter()
            .filter(|c| matches!(c, Call::List { .. }))
            .count(),
        1
    );
    let root = h.mount("s");
    assert!(root.exists());
    h.stores.dispose().await;
    assert!(!root.exists());
}

#[test]
fn a_sync_interval_under_the_minimum_is_refused_at_construction() {
    for bad in [0.0, 4.999, -1.0, f64::NAN] {
        let err = SyncInterval::from_secs_f64(bad).unwrap_err();
        assert!(err.to_string().contains("at least 5s"), "{bad}: {err}");
    }
    assert!("4s".parse::<SyncInterval>().is_err());
    assert_eq!("off".parse::<SyncInterval>().unwrap(), SyncInterval::OFF);
}

#[tokio::test]
async fn memory_sync_off_downloads_nothing_and_never_syncs() {
    let fake = Arc::new(FakeMemory::new());
    fake.store("s", &[("a.md", "a")]);
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("mnt/s");
    let mut stores = SessionMemoryStores::new(
        fake.clone(),
        &dir.path().join("work"),
        SyncInterval::OFF,
        DeleteMode::Enabled,
    );
    let mount_str = mount.display().to_string();
    stores
        .download(&session(&[("s", RW, Some(mount_str.as_str()), "s")]))
        .await
        .unwrap();
    assert!(
        !mount.exists(),
        "nothing is mounted when memory sync is off"
    );
    assert!(stores.roots().is_empty());
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(stores.sync_if_due().await.is_none());
    assert!(fake.take_calls().is_empty(), "no call reaches the server");
}

#[tokio::test]
async fn a_binary_local_file_never_blocks_the_other_files() {
    let logs = Logs::capture();
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    std::fs::write(h.path("s", "bin.dat"), [0xff, 0xfe, 0x00, 0x80]).unwrap();
    h.write("s", "a.md", "a2");
    h.write("s", "text.md", "t");
    for _ in 0..3 {
        h.stores.sync_now().await;
    }
    assert_eq!(h.server("s"), map(&[("a.md", "a2"), ("text.md", "t")]));
    assert_eq!(
        logs.count("the server rejected this memory file"),
        1,
        "warned once"
    );
    // Once it changes (to text), it syncs.
    h.write("s", "bin.dat", "now text");
    h.stores.sync_now().await;
    assert_eq!(h.fake.get("s", "bin.dat").as_deref(), Some("now text"));
}

#[tokio::test]
async fn an_oversized_file_is_skipped_until_it_shrinks() {
    let logs = Logs::capture();
    let h = H::new(&[("s", RW, &[])], DeleteMode::Enabled).await;
    h.fake.max_content(10);
    h.write("s", "big.md", "this is far too long");
    h.write("s", "small.md", "ok");
    for _ in 0..3 {
        h.stores.sync_now().await;
    }
    assert_eq!(h.server("s"), map(&[("small.md", "ok")]));
    assert_eq!(
        logs.count("the server rejected this memory file"),
        1,
        "warned once"
    );
    let creates = h
        .fake
        .take_writes()
        .into_iter()
        .filter(|c| matches!(c, Call::Create { path, .. } if path == "/big.md"))
        .count();
    assert_eq!(creates, 1, "not offered again while unchanged");
    h.write("s", "big.md", "short");
    h.stores.sync_now().await;
    assert_eq!(h.fake.get("s", "big.md").as_deref(), Some("short"));
}

#[tokio::test]
async fn a_refusal_that_says_nothing_about_the_content_is_retried_next_sync() {
    for code in [401, 403, 404] {
        let h = H::new(&[("s", RW, &[])], DeleteMode::Enabled).await;
        h.write("s", "n.md", "n");
        h.fake.fault(Op::Create, Some("n.md"), Fault::Status(code));
        h.stores.sync_now().await;
        assert_eq!(h.fake.get("s", "n.md"), None, "{code}");
        h.stores.sync_now().await;
        assert_eq!(
            h.fake.get("s", "n.md").as_deref(),
            Some("n"),
            "{code}: retried"
        );
    }
}

#[tokio::test]
async fn a_broken_store_fails_the_whole_download() {
    let mut h = H::prepare(&[("good", RW, &[("a.md", "a")])], DeleteMode::Enabled);
    let mounts = [h.mount("good"), h.mount("missing"), h.mount("later")];
    let names: Vec<String> = mounts.iter().map(|m| m.display().to_string()).collect();
    let s = session(&[
        ("good", RW, Some(&names[0]), "good"),
        ("missing", RW, Some(&names[1]), "missing"),
        ("later", RW, Some(&names[2]), "later"),
    ]);
    let err = h.stores.download(&s).await.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, MemoryError::Mount(_)));
    assert!(
        msg.contains("failed to download memory store memory_store_id=missing"),
        "{msg}"
    );
    assert!(msg.contains("404"), "the cause is attached: {msg}");
    assert!(
        !mounts[1].exists(),
        "the half-downloaded folder removed itself"
    );
    assert!(!mounts[2].exists(), "later stores are not opened");
    // The store that landed is tracked, so dispose removes it.
    assert!(mounts[0].exists());
    h.stores.dispose().await;
    assert!(!mounts[0].exists());
}

#[tokio::test]
async fn a_store_directory_that_already_exists_is_refused() {
    let mut h = H::prepare(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled);
    std::fs::create_dir_all(h.mount("s")).unwrap();
    std::fs::write(h.mount("s").join("leftover.md"), "from a dead run").unwrap();
    let mount = h.mount("s").display().to_string();
    let err = h
        .stores
        .download(&session(&[("s", RW, Some(&mount), "s")]))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("something already exists at the memory store's path"),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("it must not exist when the session starts")
    );
    h.stores.dispose().await;
    assert_eq!(
        std::fs::read_to_string(h.mount("s").join("leftover.md")).unwrap(),
        "from a dead run",
        "left untouched"
    );
    assert!(h.fake.take_writes().is_empty());
}

#[tokio::test]
async fn a_sibling_directory_beside_the_stores_root_is_none_of_our_business() {
    let h = H::new(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled).await;
    let sibling = h.mount("s").with_file_name("s-sibling");
    std::fs::create_dir_all(&sibling).unwrap();
    std::fs::write(sibling.join("x.md"), "mine").unwrap();
    h.stores.finish().await.unwrap();
    h.stores.dispose().await;
    assert_eq!(
        std::fs::read_to_string(sibling.join("x.md")).unwrap(),
        "mine"
    );
    assert!(h.fake.take_writes().is_empty());
}

#[tokio::test]
async fn an_upload_that_loses_the_race_pulls_the_winner_next_sync() {
    let logs = Logs::capture();
    let h = H::new(&[("s", RW, &[("a.md", "v1")])], DeleteMode::Enabled).await;
    h.write("s", "a.md", "local edit");
    // Another writer lands between our listing and our update.
    h.fake.fault(
        Op::Update,
        Some("a.md"),
        Fault::edit_first("s", "a.md", "the winner"),
    );
    h.stores.sync_now().await;
    assert_eq!(
        logs.count("the upload was refused and the local edit loses"),
        1
    );
    h.stores.sync_now().await;
    assert_eq!(h.read("s", "a.md").as_deref(), Some("the winner"));
    let updates = h
        .fake
        .take_writes()
        .into_iter()
        .filter(|c| matches!(c, Call::Update { .. }))
        .count();
    assert_eq!(updates, 1, "one guarded attempt, no re-push");
}

#[tokio::test]
async fn a_legal_mount_path_is_honoured_verbatim() {
    let mut h = H::prepare(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled);
    let mount = h.dir.path().join("deep/custom place/User Notes");
    h.stores
        .download(&session(&[("s", RW, Some(mount.to_str().unwrap()), "s")]))
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(mount.join("a.md")).unwrap(), "a");
    assert_eq!(
        h.stores.roots(),
        vec![std::fs::canonicalize(&mount).unwrap()]
    );
}

#[tokio::test]
async fn an_unwritable_mount_path_fails_the_download() {
    let mut h = H::prepare(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled);
    // A regular file where a directory of the path must be.
    std::fs::write(h.dir.path().join("a-file"), "x").unwrap();
    let mount = h.dir.path().join("a-file/store");
    let err = h
        .stores
        .download(&session(&[("s", RW, Some(mount.to_str().unwrap()), "s")]))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("cannot create the memory store's folder"),
        "{msg}"
    );
    assert!(
        msg.contains("the worker host must make this mount path writable"),
        "{msg}"
    );
    assert!(msg.contains(mount.to_str().unwrap()), "{msg}");
}

#[tokio::test]
async fn a_mount_path_the_worker_may_not_create_fails_the_download() {
    if !crate::common::runs_as_nobody("a_mount_path_the_worker_may_not_create_fails_the_download") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let mut h = H::prepare(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled);
    let locked = h.dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o500)).unwrap();
    let mount = locked.join("memory/store");
    let err = h
        .stores
        .download(&session(&[("s", RW, Some(mount.to_str().unwrap()), "s")]))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("cannot create the memory store's folder"),
        "{msg}"
    );
    assert!(msg.contains("ermission denied"), "{msg}");
    assert!(
        msg.contains("the worker host must make this mount path writable"),
        "{msg}"
    );
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
}

#[tokio::test]
async fn an_unclean_mount_path_fails_the_download() {
    for bad in ["/mnt/../../etc/cron.d", "relative/notes", "notes"] {
        let mut h = H::prepare(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled);
        let err = h
            .stores
            .download(&session(&[("s", RW, Some(bad), "s")]))
            .await
            .unwrap_err();
        // The error names the path.
        assert_eq!(
            err.to_string(),
            format!(
                "memory store mount_path is not a clean absolute path: {bad:?} (memory_store_id=s)"
            )
        );
    }
    // No mount_path at all: the workdir fallback, <workdir>/memory/<name>.
    let mut h = H::prepare(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled);
    h.stores
        .download(&session(&[("s", RW, None, "Team Notes")]))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(h.dir.path().join("work/memory/Team Notes/a.md")).unwrap(),
        "a"
    );
}

#[tokio::test]
async fn prefix_items_and_foreign_resources_leave_no_trace() {
    let mut h = H::prepare(&[("s", RW, &[("a.md", "a")])], DeleteMode::Enabled);
    h.fake.list_item(MemoryListItem::Prefix(MemoryPrefix {
        object_type: "memory_prefix".into(),
        path: "/dir/".into(),
    }));
    h.fake.list_item(MemoryListItem::Other(
        serde_json::json!({"type": "memory_hologram", "path": "/h"}),
    ));
    let mut s = session(&[("s", RW, Some(h.mount("s").to_str().unwrap()), "s")]);
    s.resources
        .push(envworker::api::types::SessionResource::Other(
            serde_json::json!({"type": "file", "file_id": "file_1"}),
        ));
    h.stores.download(&s).await.unwrap();
    assert_eq!(h.stores.roots().len(), 1);
    let disk: Vec<_> = std::fs::read_dir(h.mount("s"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let mut disk = disk;
    disk.sort();
    assert_eq!(disk, vec![".anthropic-memory-store", "a.md"]);
    h.stores.finish().await.unwrap();
    assert!(h.fake.take_writes().is_empty());
}

/// The nine rows: baseline v1 on both sides, one change per side, two
/// passes around the delete window, then a third pass that sends nothing.
#[tokio::test(start_paused = true)]
async fn the_sync_matrix() {
    #[derive(Clone, Copy, Debug)]
    enum S {
        Same,
        Edit,
        Del,
    }
    use S::*;
    /// Disk change, server change, disk after, server after, requests sent.
    type Row<'a> = (S, S, Option<&'a str>, Option<&'a str>, &'a [&'a str]);
    let rows: [Row; 9] = [
        (Same, Same, Some("v1"), Some("v1"), &[]),
        (Edit, Same, Some("v2"), Some("v2"), &["update v2 if v1"]),
        (Same, Edit, Some("v2r"), Some("v2r"), &[]),
        (Edit, Edit, Some("v2r"), Some("v2r"), &[]),
        (Del, Same, None, None, &["delete if v1"]),
        (Same, Del, None, None, &[]),
        (Del, Del, None, None, &[]),
        (Del, Edit, Some("v2r"), Some("v2r"), &[]),
        (Edit, Del, Some("v2"), Some("v2"), &["create v2"]),
    ];
    for (local, remote, disk_after, server_after, sent) in rows {
        let h = H::new(
            &[("s", RW, &[("f.md", "v1"), ("other.md", "o")])],
            DeleteMode::Enabled,
        )
        .await;
        match local {
            Same => {}
            Edit => h.write("s", "f.md", "v2"),
            Del => h.rm("s", "f.md"),
        }
        match remote {
            Same => {}
            Edit => h.fake.put("s", "f.md", "v2r"),
            Del => h.fake.remove("s", "f.md"),
        }
        h.stores.sync_now().await;
        tokio::time::advance(Duration::from_secs(31)).await;
        h.stores.sync_now().await;
        let what = format!("{local:?}/{remote:?}");
        assert_eq!(h.read("s", "f.md").as_deref(), disk_after, "{what}: disk");
        assert_eq!(
            h.fake.get("s", "f.md").as_deref(),
            server_after,
            "{what}: server"
        );
        let writes: Vec<String> = h
            .fake
            .take_writes()
            .into_iter()
            .map(|c| match c {
                Call::Update {
                    content, expected, ..
                } => format!(
                    "update {content} if {}",
                    if expected == sha("v1") { "v1" } else { "?" }
                ),
                Call::Create { content, .. } => format!("create {content}"),
                Call::Delete { expected, .. } => format!(
                    "delete if {}",
                    if expected == sha("v1") { "v1" } else { "?" }
                ),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(writes, sent, "{what}: requests");
        h.stores.sync_now().await;
        assert!(
            h.fake.take_writes().is_empty(),
            "{what}: a third pass sends nothing"
        );
    }
}

#[tokio::test]
async fn a_failed_upload_keeps_the_local_edit_and_retries() {
    let h = H::new(&[("s", RW, &[("a.md", "v1")])], DeleteMode::Enabled).await;
    h.write("s", "a.md", "v2");
    h.fake.fault(Op::Update, Some("a.md"), Fault::Status(503));
    h.stores.sync_now().await;
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("v1"));
    assert_eq!(
        h.read("s", "a.md").as_deref(),
        Some("v2"),
        "the edit is kept"
    );
    h.stores.sync_now().await;
    assert_eq!(h.fake.get("s", "a.md").as_deref(), Some("v2"), "retried");
}

#[tokio::test]
async fn a_failed_pull_leaves_the_old_file_and_retries() {
    let logs = Logs::capture();
    let h = H::new(&[("s", RW, &[("a.md", "v1")])], DeleteMode::Enabled).await;
    h.fake.put("s", "a.md", "v2");
    h.fake.fault(Op::Retrieve, Some("a.md"), Fault::Status(500));
    h.stores.sync_now().await;
    assert_eq!(h.read("s", "a.md").as_deref(), Some("v1"));
    assert_eq!(logs.count("failed to fetch memory content"), 1);
    h.stores.sync_now().await;
    assert_eq!(h.read("s", "a.md").as_deref(), Some("v2"));
    assert!(
        h.fake.take_writes().is_empty(),
        "the old file is never pushed over the newer remote"
    );
}

#[tokio::test]
async fn a_failed_local_removal_never_re_uploads_the_deleted_memory() {
    if !crate::common::runs_as_nobody("a_failed_local_removal_never_re_uploads_the_deleted_memory")
    {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let logs = Logs::capture();
    let h = H::new(
        &[("s", RW, &[("locked/a.md", "a"), ("b.md", "b")])],
        DeleteMode::Enabled,
    )
    .await;
    h.fake.remove("s", "locked/a.md");
    let locked = h.mount("s").join("locked");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o500)).unwrap();
    h.stores.sync_now().await;
    h.stores.sync_now().await;
    assert!(
        logs.count("failed to remove memory deleted remotely") >= 1,
        "{}",
        logs.text()
    );
    assert_eq!(h.fake.get("s", "locked/a.md"), None, "never re-uploaded");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    h.stores.sync_now().await;
    assert_eq!(h.read("s", "locked/a.md"), None, "removed once it can be");
    assert_eq!(h.fake.get("s", "locked/a.md"), None);
}

#[tokio::test(start_paused = true)]
async fn stores_sync_in_parallel_and_one_failure_spares_the_rest() {
    let logs = Logs::capture();
    let h = H::new(
        &[
            ("a", RW, &[("x.md", "1")]),
            ("b", RW, &[("y.md", "1")]),
            ("c", RW, &[("z.md", "1")]),
        ],
        DeleteMode::Enabled,
    )
    .await;
    h.write("a", "x.md", "2");
    h.write("b", "y.md", "2");
    h.write("c", "z.md", "2");
    // Every listing is slow; one of them fails.
    h.fake
        .fault(Op::List, None, Fault::Delay(Duration::from_secs(10)));
    h.fake
        .fault(Op::List, None, Fault::Delay(Duration::from_secs(10)));
    h.fake.fault(Op::List, None, Fault::Status(500));
    let started = tokio::time::Instant::now();
    h.stores.sync_now().await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the slow listings overlapped: {:?}",
        started.elapsed()
    );
    let pushed = [
        h.fake.get("a", "x.md"),
        h.fake.get("b", "y.md"),
        h.fake.get("c", "z.md"),
    ]
    .iter()
    .filter(|v| v.as_deref() == Some("2"))
    .count();
    assert_eq!(pushed, 2, "one store failed, the other two synced");
    assert_eq!(logs.count("memory sync failed"), 1);
}

#[tokio::test]
async fn finish_runs_once_and_a_second_call_is_an_error() {
    let h = H::new(&[("s", RW, &[])], DeleteMode::Enabled).await;
    h.stores.finish().await.unwrap();
    let err = h.stores.finish().await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "finish() was already called: it is the session's last sync and runs once"
    );
}
