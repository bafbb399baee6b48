//! The official SDK worker (`anthropic==2.10.0`, `EnvironmentWorker`) serves
//! scripted sessions from the devserver, as it would serve the real API:
//! the scenario report passes and the stores hold what the scenario expects.

mod common;

use common::served;
use serde_json::Value;

/// Run one scenario file end to end with the SDK worker; returns its report.
async fn served_by_the_sdk(name: &str) -> Value {
    served::by_the_sdk(name).await.report
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sdk_worker_passes_notes_roundtrip() {
    served_by_the_sdk("notes-roundtrip").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sdk_worker_passes_two_stores_with_a_remote_edit_a_local_delete_and_a_read_only_refusal()
 {
    let report = served_by_the_sdk("two-stores-sync").await;
    // The remote edit reached the disk before the read that checks it.
    let read_back = &report["steps"][9];
    assert_eq!(read_back["status"], "passed", "{read_back:#}");
    assert!(
        report["final_contents"]["notes"].get("/old.md").is_none(),
        "the local delete reached the server"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sdk_worker_passes_permission_gates() {
    served_by_the_sdk("permission-gates").await;
}
