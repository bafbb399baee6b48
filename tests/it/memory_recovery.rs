//! The durable commit, in process against the devserver over real HTTP: a
//! worker "dies" (its stores are dropped without a teardown — the folder and
//! the journal stay, the journal's lock goes, as the kernel drops it for a
//! killed process) and a new mount on the same disk recovers the folder.
//! The crash test over the real binary and SIGKILL is `tests/it/crash.rs`.

use std::path::{Path, PathBuf};

use crate::common::harness::Logs;
use crate::common::memory_served::{Served, served_journaled};
use envworker::memory::SessionMemoryStores;
use envworker::memory::recovery::let_go_of_clean_folders;
use envworker::memory::store::MARKER_PATH;
use serde_json::{Value, json};

fn notes(memories: Value) -> Value {
    json!([{"key": "notes", "name": "Notes", "memories": memories}])
}

async fn journaled(memory_stores: Value) -> (tempfile::TempDir, Served) {
    let state = tempfile::tempdir().unwrap();
    let t = served_journaled(memory_stores, Some(&state.path().join("state"))).await;
    (state, t)
}

async fn update_remote(t: &Served, store: &str, path: &str, content: &str) {
    let id = t.memory_id(store, path).await;
    t.s.update_memory(store, &id, content).await;
}

fn journals(state: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(state.join("state"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "journal"))
        .collect()
}

fn contents(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    crate::common::contents(pairs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_workers_edits_reach_the_server_when_its_store_is_mounted_again() {
    let (state, mut t) = journaled(notes(json!({
        "/a.md": "a1", "/b.md": "b1", "/c.md": "c1", "/gone.md": "g", "/keep.md": "k"
    })))
    .await;
    let store = t.ids[0].clone();
    let dir = t.mounts[0].clone();
    // One sync, so the baseline has been journaled past the mount.
    t.stores.sync_now().await;
    // The agent's edits since the last sync: an edit, a new file, a deletion,
    // and an edit of a memory another writer changes meanwhile.
    std::fs::write(dir.join("a.md"), "a2 by the agent").unwrap();
    std::fs::write(dir.join("new.md"), "new by the agent").unwrap();
    std::fs::remove_file(dir.join("gone.md")).unwrap();
    std::fs::write(dir.join("c.md"), "c2 by the agent").unwrap();
    update_remote(&t, &store, "/b.md", "b2 remote").await;
    update_remote(&t, &store, "/c.md", "c2 remote").await;
    kill(&mut t);
    assert!(dir.exists(), "a dead worker's folder stays on disk");
    assert_eq!(journals(state.path()).len(), 1);

    let again = t
        .mount_again()
        .await
        .expect("the dead worker's folder is recovered");
    assert_eq!(
        t.s.store_memories(&store).await,
        contents(&[
            ("/a.md", "a2 by the agent"),
            ("/b.md", "b2 remote"),
            // A real conflict: the server wins, as in any sync.
            ("/c.md", "c2 remote"),
            // Not deleted by the recovery: a deletion waits for this
            // worker's own corroboration.
            ("/gone.md", "g"),
            ("/keep.md", "k"),
            ("/new.md", "new by the agent"),
        ]),
        "every edit on the disk is on the server; no remote change overwritten; nothing deleted"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("b.md")).unwrap(),
        "b2 remote"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("c.md")).unwrap(),
        "c2 remote"
    );
    assert!(
        !dir.join("gone.md").exists(),
        "the agent's deletion stands on disk"
    );

    // The session's final sync corroborates the deletion, as for any.
    again.finish().await.unwrap();
    assert!(!t.s.store_memories(&store).await.contains_key("/gone.md"));
    again.dispose().await;
    assert!(!dir.exists());
    assert!(
        journals(state.path()).is_empty(),
        "dispose removes the journal"
    );
}

/// The worker dies: its stores are dropped with no final sync, no flush
/// and no dispose.
fn kill(t: &mut Served) {
    let stores = std::mem::replace(
        &mut t.stores,
        SessionMemoryStores::new(
            std::sync::Arc::new(t.client.clone()),
            t.mnt.path(),
            Default::default(),
            Default::default(),
        ),
    );
    drop(stores);
}

/// Single-threaded, so that every log line lands in this thread's capture.
#[tokio::test]
async fn a_damaged_journal_is_no_baseline_and_deletes_nothing() {
    let (state, mut t) = journaled(notes(json!({"/a.md": "a1", "/gone.md": "g"}))).await;
    let store = t.ids[0].clone();
    let dir = t.mounts[0].clone();
    // A pull after the mount: one more batch, so the damaged one below is
    // not the journal's last (a damaged last batch is a torn tail).
    update_remote(&t, &store, "/gone.md", "g2").await;
    t.stores.sync_now().await;
    std::fs::write(dir.join("a.md"), "a2 by the agent").unwrap();
    std::fs::write(dir.join("new.md"), "new by the agent").unwrap();
    std::fs::remove_file(dir.join("gone.md")).unwrap();
    kill(&mut t);
    // A flipped byte in the journal's first batch.
    let journal = &journals(state.path())[0];
    let mut bytes = std::fs::read(journal).unwrap();
    let first = bytes.iter().position(|b| *b == b'\n').unwrap();
    bytes[first + 12] ^= 0x20;
    std::fs::write(journal, bytes).unwrap();

    let logs = Logs::capture();
    let again = t.mount_again().await.expect("recovered with no baseline");
    assert_eq!(logs.count("is damaged; recovering it with no baseline"), 1);
    assert_eq!(
        t.s.store_memories(&store).await,
        contents(&[
            // Without a baseline an edit cannot be told from a conflict: the server wins.
            ("/a.md", "a1"),
            // Never deleted on the server.
            ("/gone.md", "g2"),
            // A file the server lacks is a new memory.
            ("/new.md", "new by the agent"),
        ])
    );
    assert_eq!(std::fs::read_to_string(dir.join("a.md")).unwrap(), "a1");
    assert_eq!(
        std::fs::read_to_string(dir.join("gone.md")).unwrap(),
        "g2",
        "restored, not deleted"
    );
    again.dispose().await;
}

/// A child this process forks while the stores are mounted (a supervisor
/// being started, the namespace probe) shares the journal's lock until it
/// execs or exits. The worker dies meanwhile (a session's stores dropped,
/// the session claimed again in the same process): the folder is recovered
/// once the child lets go, not refused as a live worker's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_whose_lock_a_forked_child_still_shares_is_recovered() {
    let (_state, mut t) = journaled(notes(json!({"/a.md": "a1"}))).await;
    std::fs::write(t.mounts[0].join("a.md"), "a2 by the agent").unwrap();
    let (mut forked, told) = std::io::pipe().unwrap();
    // SAFETY: the child only makes system calls (`write`, `nanosleep`) and
    // leaves with `_exit`, as `cleanroom::probe_namespaces`'s does.
    let child = match unsafe { libc::fork() } {
        -1 => panic!("fork: {}", std::io::Error::last_os_error()),
        0 => unsafe {
            use std::os::fd::AsRawFd as _;
            libc::write(told.as_raw_fd(), b"f".as_ptr().cast(), 1);
            let pause = libc::timespec {
                tv_sec: 0,
                tv_nsec: 300_000_000,
            };
            libc::nanosleep(&pause, std::ptr::null_mut());
            libc::_exit(0)
        },
        child => child,
    };
    std::io::Read::read_exact(&mut forked, &mut [0]).unwrap();
    kill(&mut t);
    let again = t.mount_again().await;
    let mut status = 0;
    // SAFETY: waits for this test's own child.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    let again = again.expect("recovered once the child let go of the lock");
    assert_eq!(
        t.s.store_memories(&t.ids[0]).await,
        contents(&[("/a.md", "a2 by the agent")])
    );
    again.dispose().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_workers_folder_is_not_taken() {
    let (_state, t) = journaled(notes(json!({"/a.md": "a1"}))).await;
    std::fs::write(t.mounts[0].join("a.md"), "a2").unwrap();
    let err = t.mount_again().await.err().expect("refused");
    assert!(err.to_string().contains("another live worker"), "{err}");
    assert_eq!(
        std::fs::read_to_string(t.mounts[0].join("a.md")).unwrap(),
        "a2",
        "untouched"
    );
    assert_eq!(
        t.s.store_memories(&t.ids[0]).await,
        contents(&[("/a.md", "a1")])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_without_its_journal_or_its_marker_is_left_as_found() {
    // No journal: the folder is not known to be ours.
    let (state, mut t) = journaled(notes(json!({"/a.md": "a1"}))).await;
    std::fs::write(t.mounts[0].join("a.md"), "a2").unwrap();
    kill(&mut t);
    for j in journals(state.path()) {
        std::fs::remove_file(j).unwrap();
    }
    let err = t.mount_again().await.err().expect("refused");
    assert!(
        err.to_string().contains("something already exists"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(t.mounts[0].join("a.md")).unwrap(),
        "a2"
    );

    // A journal, but the marker names another store: hands off.
    let (state, mut t) = journaled(notes(json!({"/a.md": "a1"}))).await;
    std::fs::write(t.mounts[0].join("a.md"), "a2").unwrap();
    std::fs::write(t.mounts[0].join(MARKER_PATH), "version 1\nmemstore_other").unwrap();
    kill(&mut t);
    let err = t.mount_again().await.err().expect("refused");
    assert!(
        err.to_string().contains("something already exists"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(t.mounts[0].join("a.md")).unwrap(),
        "a2"
    );
    assert_eq!(
        t.s.store_memories(&t.ids[0]).await,
        contents(&[("/a.md", "a1")])
    );
    assert_eq!(
        journals(state.path()).len(),
        1,
        "a journal it did not take is left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_start_a_clean_left_folder_goes_and_an_edited_one_stays() {
    let (state, mut t) = journaled(json!([
        {"key": "clean", "name": "Clean", "memories": {"/a.md": "a1"}},
        {"key": "edited", "name": "Edited", "memories": {"/b.md": "b1"}}
    ]))
    .await;
    t.stores.sync_now().await;
    std::fs::write(t.mounts[1].join("b.md"), "b2 by the agent").unwrap();
    kill(&mut t);
    assert_eq!(let_go_of_clean_folders(&state.path().join("state")), 1);
    assert!(!t.mounts[0].exists(), "nothing unsynced: removed");
    assert_eq!(
        std::fs::read_to_string(t.mounts[1].join("b.md")).unwrap(),
        "b2 by the agent",
        "an unsynced edit is kept for the recovery"
    );
    assert_eq!(journals(state.path()).len(), 1);
    // The next claim recovers it: the clean store is downloaded afresh.
    let again = t.mount_again().await.unwrap();
    assert_eq!(
        t.s.store_memories(&t.ids[1]).await,
        contents(&[("/b.md", "b2 by the agent")])
    );
    assert_eq!(
        std::fs::read_to_string(t.mounts[0].join("a.md")).unwrap(),
        "a1"
    );
    again.dispose().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_op_sync_appends_nothing_to_the_journal() {
    let (state, t) = journaled(notes(json!({"/a.md": "a1", "/b.md": "b1"}))).await;
    t.stores.sync_now().await;
    let journal = journals(state.path())[0].clone();
    let before = std::fs::read(&journal).unwrap();
    for _ in 0..3 {
        t.stores.sync_now().await;
    }
    assert_eq!(
        std::fs::read(&journal).unwrap(),
        before,
        "nothing changed, nothing appended"
    );
    // An edit is appended as it syncs.
    std::fs::write(t.mounts[0].join("a.md"), "a2").unwrap();
    t.stores.sync_now().await;
    assert!(std::fs::read(&journal).unwrap().len() > before.len());
    t.stores.dispose().await;
}
