//! Differential test: every scenario under `events/scenarios/` is served by
//! envworker and by the official SDK's worker, each on a fresh devserver.
//! Both reports must pass and the stores must end up identical.

mod common;

use common::served;

fn scenario_names() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("events/scenarios");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let path = e.ok()?.path();
            if path.extension()? != "json" {
                return None;
            }
            Some(path.file_stem()?.to_string_lossy().into_owned())
        })
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn every_scenario_ends_the_same_with_envworker_and_with_the_sdk_worker() {
    let names = scenario_names();
    assert!(names.len() >= 3, "{names:?}");
    for name in names {
        let (ours, theirs) = tokio::join!(served::by_envworker(&name), served::by_the_sdk(&name));
        assert_eq!(
            ours.report["final_contents"], theirs.report["final_contents"],
            "{name}: the stores differ between envworker and the SDK worker"
        );
        let passed = |r: &serde_json::Value| {
            r["steps"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|s| s["status"] == "passed")
                .count()
        };
        assert_eq!(
            passed(&ours.report),
            passed(&theirs.report),
            "{name}: steps passed"
        );
    }
}
