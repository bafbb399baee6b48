//! Differential test: each case is served by envworker and by the official
//! SDK's worker (`anthropic==2.10.0`), each on a fresh devserver and a fresh
//! host prepared the same way. Both reports must pass, and the two runs
//! must agree on what a user or the API can see: the steps that passed,
//! the stores' final contents, the memory versions the session made (the
//! uploads that landed, in order), the contents of the uploads each worker
//! sent, and the workdir each left behind.
//!
//! The cases: every scenario file of `events/scenarios/`, and one per rule
//! of the reference's contract that envworker once changed (issue 24).

use std::collections::BTreeSet;

use crate::common::served::{self, Case, Served};
use serde_json::json;

/// What both workers must agree on.
fn assert_same(case: &Case, ours: &Served, theirs: &Served) {
    let name = &case.name;
    assert_eq!(
        ours.report["final_contents"], theirs.report["final_contents"],
        "{name}: the stores differ between envworker and the SDK worker"
    );
    let statuses = |r: &serde_json::Value| -> Vec<String> {
        r["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| format!("{} {}", s["index"], s["status"]))
            .collect()
    };
    assert_eq!(
        statuses(&ours.report),
        statuses(&theirs.report),
        "{name}: steps"
    );
    assert_eq!(
        ours.versions, theirs.versions,
        "{name}: the memory versions the session made differ (envworker left, SDK right)"
    );
    let sent = |s: &Served| -> BTreeSet<(Option<String>, Option<String>)> {
        s.writes
            .iter()
            .map(|w| (w.path.clone(), w.content_sha256.clone()))
            .collect()
    };
    assert_eq!(
        sent(ours),
        sent(theirs),
        "{name}: the uploads sent differ (envworker left, SDK right)"
    );
    assert_eq!(
        ours.workdir_tree(),
        theirs.workdir_tree(),
        "{name}: the workdirs differ (envworker left, SDK right)"
    );
}

/// Serve `case` with both workers side by side and compare. Each run is a
/// task of its own, so one that fails lets the other finish (its devserver
/// must outlive its worker) before the failure is raised.
async fn both(case: Case) -> (Served, Served) {
    let (ours, theirs) = {
        let (a, b) = (case.clone(), case.clone());
        tokio::join!(
            tokio::spawn(async move { served::by_envworker(&a).await }),
            tokio::spawn(async move { served::by_the_sdk(&b).await })
        )
    };
    let unwrap = |r: Result<Served, tokio::task::JoinError>| {
        r.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    };
    let (ours, theirs) = (unwrap(ours), unwrap(theirs));
    assert_same(&case, &ours, &theirs);
    (ours, theirs)
}

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
        both(Case::file(&name)).await;
    }
}

/// The agent works in the configured workdir, with what the operator put
/// there: the file tools reach it by relative and absolute path, `glob` and
/// `grep` search it, `bash` starts in it, and what the agent changes stays.
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_works_in_the_prepared_workdir() {
    let (ours, _) = both(Case::new(
        "prepared-workdir",
        json!({
            "name": "prepared-workdir",
            "prepare": {"files": {
                "{workdir}/README.md": "A project checked out into the image. needle\n",
                "{workdir}/src/lib.rs": "pub fn answer() -> u32 { 41 }\n",
                "{workdir}/data/rows.csv": "a,b\n1,2\n"
            }},
            "steps": [
                {"tool": "read", "input": {"file_path": "README.md"},
                 "expect": {"is_error": false, "contains": "checked out"}},
                {"tool": "read", "input": {"file_path": "{workdir}/data/rows.csv"},
                 "expect": {"is_error": false, "contains": "1,2"}},
                {"tool": "edit", "input": {"file_path": "src/lib.rs", "old_string": "41", "new_string": "42"},
                 "expect": {"is_error": false}},
                {"tool": "edit", "input": {"file_path": "{workdir}/README.md", "old_string": "image.", "new_string": "image, edited."},
                 "expect": {"is_error": false}},
                {"tool": "bash", "input": {"command": "pwd; cat src/lib.rs; ls"},
                 "expect": {"is_error": false, "contains": ["{workdir}\n", "{ 42 }", "README.md", "data"]}},
                {"tool": "glob", "input": {"pattern": "**/*.rs"},
                 "expect": {"is_error": false, "contains": "{workdir}/src/lib.rs"}},
                {"tool": "glob", "input": {"pattern": "*.csv", "path": "{workdir}/data"},
                 "expect": {"is_error": false, "contains": "{workdir}/data/rows.csv"}},
                {"tool": "grep", "input": {"pattern": "needle"},
                 "expect": {"is_error": false, "contains": "README.md"}},
                {"tool": "grep", "input": {"pattern": "42", "path": "src"},
                 "expect": {"is_error": false, "contains": "lib.rs"}},
                {"tool": "write", "input": {"file_path": "notes/plan.md", "content": "ship it\n"},
                 "expect": {"is_error": false}},
                {"tool": "read", "input": {"file_path": "{workdir}/notes/plan.md"},
                 "expect": {"is_error": false, "contains": "ship it"}}
            ]
        }),
    ))
    .await;
    // Not only the same on both: what the agent changed is in the workdir.
    let tree = ours.workdir_tree();
    assert_eq!(
        tree["src/lib.rs"], "file: pub fn answer() -> u32 { 42 }\n",
        "{tree:#?}"
    );
    assert_eq!(tree["notes/plan.md"], "file: ship it\n", "{tree:#?}");
}

/// Skills land in `<workdir>/skills/<name>/`, and a store without a mount
/// path in `<workdir>/memory/<name>/`, where the agent reaches both by
/// relative path; both are gone after the session.
#[tokio::test(flavor = "multi_thread")]
async fn skills_and_a_store_without_a_mount_path_land_in_the_workdir() {
    let case = Case::new(
        "skills-and-pathless-store",
        json!({
            "name": "skills-and-pathless-store",
            "agent": {"name": "with skills", "skills": [
                {"type": "custom", "skill_id": "{skill:report-writer}", "version": "latest"}
            ]},
            "memory_stores": [
                {"key": "notes", "name": "team-notes", "access": "read_write", "mount_path": null,
                 "memories": {"/a.md": "alpha\n"}}
            ],
            "steps": [
                {"tool": "read", "input": {"file_path": "skills/report-writer/SKILL.md"},
                 "expect": {"is_error": false, "contains": "Write reports."}},
                {"tool": "bash", "input": {"command": "sh skills/report-writer/scripts/run.sh"},
                 "expect": {"is_error": false, "contains": "skill ran"}},
                {"tool": "read", "input": {"file_path": "memory/team-notes/a.md"},
                 "expect": {"is_error": false, "contains": "alpha"}},
                {"tool": "read", "input": {"file_path": "{workdir}/memory/team-notes/a.md"},
                 "expect": {"is_error": false, "contains": "alpha"}},
                {"tool": "write", "input": {"file_path": "memory/team-notes/b.md", "content": "beta\n"},
                 "expect": {"is_error": false}},
                {"tool": "bash", "input": {"command": "cat memory/team-notes/b.md"},
                 "expect": {"is_error": false, "contains": "beta"}}
            ],
            "expect_final": {"notes": {"/a.md": "alpha\n", "/b.md": "beta\n"}}
        }),
    )
    .skill(json!({"name": "report-writer", "files": {
        "SKILL.md": "---\nname: report-writer\n---\nWrite reports.\n",
        "scripts/run.sh": {"content": "#!/bin/sh\necho skill ran\n", "executable": true}
    }}));
    let (ours, theirs) = both(case).await;
    // The comparison of uploads is not vacuous: both sent `/b.md`'s bytes.
    for served in [&ours, &theirs] {
        assert!(
            served
                .writes
                .iter()
                .any(|w| w.path.as_deref() == Some("/b.md")
                    && w.content_sha256.as_deref()
                        == Some(crate::common::sha256("beta\n").as_str())
                    && w.status < 300),
            "{:?}",
            served.writes
        );
    }
    let tree = ours.workdir_tree();
    assert!(
        !tree
            .keys()
            .any(|p| p.starts_with("skills/") || p.starts_with("memory/")),
        "the skill and the store folder are removed after the session: {tree:#?}"
    );
}

/// The store of the memory cases: one writable store holding `/f.md`.
fn notes(memories: serde_json::Value) -> serde_json::Value {
    json!([{"key": "notes", "name": "notes", "access": "read_write", "memories": memories}])
}

/// A tool call after a pause past the 5 s interval, which triggers a sync,
/// and a pause for that sync to end: the SDK's worker syncs once the call's
/// result is posted, so a remote step right after it would race the sync.
fn sync_step() -> [serde_json::Value; 3] {
    [
        json!({"wait_ms": 5500}),
        json!({"tool": "bash", "input": {"command": "true"}, "expect": {"is_error": false}}),
        json!({"wait_ms": 1000}),
    ]
}

/// Steps, with `"sync"` standing for [`sync_step`]'s two.
fn steps(items: Vec<serde_json::Value>) -> serde_json::Value {
    let mut out = Vec::new();
    for item in items {
        if item == json!("sync") {
            out.extend(sync_step());
        } else {
            out.push(item);
        }
    }
    serde_json::Value::Array(out)
}

/// Uploads leave at the sync cadence, one pass per interval: three edits
/// between two syncs make one version (the last), not three — no upload
/// between syncs (the change-driven push is opt-in).
#[tokio::test(flavor = "multi_thread")]
async fn edits_between_two_syncs_make_one_version() {
    let (ours, _) = both(Case::new(
        "one-version-per-sync",
        json!({
            "name": "one-version-per-sync",
            "memory_stores": notes(json!({"/f.md": "v0\n"})),
            "steps": steps(vec![
                json!({"tool": "write", "input": {"file_path": "{mount:notes}/f.md", "content": "v1\n"}}),
                json!({"wait_ms": 1500}),
                json!({"tool": "write", "input": {"file_path": "{mount:notes}/f.md", "content": "v2\n"}}),
                json!({"wait_ms": 1500}),
                json!({"tool": "write", "input": {"file_path": "{mount:notes}/f.md", "content": "v3\n"}}),
                json!("sync"),
                json!({"tool": "write", "input": {"file_path": "{mount:notes}/g.md", "content": "g\n"}}),
            ]),
            "expect_final": {"notes": {"/f.md": "v3\n", "/g.md": "g\n"}}
        }),
    ))
    .await;
    let f = &ours.versions["notes"]["/f.md"];
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(
        f[0].content_sha256.as_deref(),
        Some(crate::common::sha256("v3\n").as_str())
    );
}

/// An edit whose content the server already holds (another writer set the
/// same bytes) is adopted: no upload, no version of the session's.
#[tokio::test(flavor = "multi_thread")]
async fn an_edit_the_server_already_holds_is_adopted_without_an_upload() {
    let (ours, theirs) = both(Case::new(
        "adopted-edit",
        json!({
            "name": "adopted-edit",
            "memory_stores": notes(json!({"/f.md": "v0\n"})),
            "steps": steps(vec![
                json!({"remote": {"op": "update", "store": "notes", "path": "/f.md", "content": "same\n"}}),
                json!({"tool": "write", "input": {"file_path": "{mount:notes}/f.md", "content": "same\n"}}),
                json!("sync"),
                json!({"tool": "read", "input": {"file_path": "{mount:notes}/f.md"},
                       "expect": {"is_error": false, "contains": "same"}}),
            ]),
            "expect_final": {"notes": {"/f.md": "same\n"}}
        }),
    ))
    .await;
    for served in [&ours, &theirs] {
        assert!(served.writes.is_empty(), "{:?}", served.writes);
        assert!(served.versions["notes"].is_empty(), "{:?}", served.versions);
    }
}

/// The lost-send sequence (issue 24 item 2): the agent writes v1, whose
/// upload is lost (a gateway's 502: no answer from the API, so the upload
/// may have landed); it reverts to v0 and a sync sees the server at v0; then
/// another writer sets v1 while the agent writes v2. The server wins: it
/// keeps the other writer's v1, and the agent's file becomes v1 too.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_send_seen_superseded_never_overwrites_another_writer() {
    let (ours, theirs) = both(Case::new(
        "lost-send",
        json!({
            "name": "lost-send",
            "memory_stores": notes(json!({"/f.md": "v0\n"})),
            "steps": steps(vec![
                json!({"faults": [{"method": "POST", "path": "/v1/memory_stores/*/memories/*", "status": 502}]}),
                json!({"tool": "write", "input": {"file_path": "{mount:notes}/f.md", "content": "v1\n"}}),
                json!("sync"),
                // The sync's upload and both its retries (0.5 s, 1 s) fail
                // before the fault goes.
                json!({"wait_ms": 2000}),
                json!({"clear_faults": true}),
                json!({"tool": "write", "input": {"file_path": "{mount:notes}/f.md", "content": "v0\n"}}),
                json!("sync"),
                json!({"remote": {"op": "update", "store": "notes", "path": "/f.md", "content": "v1\n"}}),
                json!({"tool": "write", "input": {"file_path": "{mount:notes}/f.md", "content": "v2\n"}}),
                json!("sync"),
                json!({"tool": "read", "input": {"file_path": "{mount:notes}/f.md"},
                       "expect": {"is_error": false, "contains": "v1"}}),
            ]),
            "expect_final": {"notes": {"/f.md": "v1\n"}}
        }),
    ))
    .await;
    for served in [&ours, &theirs] {
        assert!(
            served.writes.iter().all(|w| w.status >= 500),
            "nothing of the session's landed: {:?}",
            served.writes
        );
    }
}

/// An upload stuck at teardown holds only itself: the other file written
/// in the session still reaches the server, and the stuck one is reported
/// (the final sync and the flush each cut off at their bound, 5 s here).
#[tokio::test(flavor = "multi_thread")]
async fn a_stuck_upload_at_teardown_holds_back_no_other_file() {
    let case = Case::new(
        "stuck-upload",
        json!({
            "name": "stuck-upload",
            "memory_stores": notes(json!({"/a.md": "a0\n"})),
            "steps": [
                {"tool": "write", "input": {"file_path": "{mount:notes}/a.md", "content": "a1\n"}},
                // Every update hangs (longer than both bounds); creates go through.
                {"faults": [{"method": "POST", "path": "/v1/memory_stores/*/memories/*", "latency_ms": 120000}]},
                {"tool": "write", "input": {"file_path": "{mount:notes}/b.md", "content": "b1\n"}}
            ],
            "expect_final": {"notes": {"/a.md": "a0\n", "/b.md": "b1\n"}}
        }),
    )
    .knobs(served::Knobs {
        flush_timeout: std::time::Duration::from_secs(5),
        ..Default::default()
    });
    let (_, theirs) = both(case).await;
    assert!(
        theirs.log.contains("memory flush cut off"),
        "{}",
        theirs.log
    );
}

/// Issue 24 item 7: a result post the API refuses (a 400, once) does not end
/// the session. The call stays unanswered until the next reconcile, after
/// the event stream reconnects (the devserver closes each stream 2 s after
/// it opens), which answers it; the session goes on to its next call. The
/// call is a `write` of fixed content, so the reference's second run of the
/// tool and envworker's post of the result it kept leave the same workdir.
#[tokio::test(flavor = "multi_thread")]
async fn a_result_post_that_fails_is_answered_at_the_next_reconcile() {
    let (ours, theirs) = both(Case::new(
        "answered-again",
        json!({
            "name": "answered-again",
            "steps": [
                {"faults": [
                    {"method": "GET", "path": "/v1/sessions/*/events/stream", "cut_after_ms": 2000},
                    {"method": "POST", "path": "/v1/sessions/*/events", "status": 400, "times": 1}
                ]},
                {"tool": "write", "input": {"file_path": "notes.txt", "content": "kept\n"},
                 "timeout_ms": 60000, "expect": {"is_error": false}},
                {"tool": "read", "input": {"file_path": "notes.txt"},
                 "expect": {"is_error": false, "contains": "kept"}},
                {"clear_faults": true}
            ]
        }),
    ))
    .await;
    assert!(
        theirs.log.contains("failed to send tool result"),
        "{}",
        theirs.log
    );
    for (who, served) in [("envworker", &ours), ("the SDK", &theirs)] {
        // The refused post, then a reconnect of the stream, then the post
        // that landed: answered at the reconcile, not by a retry.
        let at = |want: &dyn Fn(&(String, String), u16) -> bool, from: usize| {
            (from..served.requests.len())
                .find(|&i| want(&served.requests[i], served.statuses[i]))
                .unwrap_or_else(|| panic!("{who}: {:#?}", served.requests))
        };
        let post = |(m, p): &(String, String)| m == "POST" && p.ends_with("/events");
        let refused = at(&|r, s| post(r) && s == 400, 0);
        let stream = at(
            &|(m, p), _| m == "GET" && p.ends_with("/events/stream"),
            refused,
        );
        let landed = at(&|r, s| post(r) && s == 200, refused);
        assert!(stream < landed, "{who}: {:#?}", served.requests);
    }
    let tree = ours.workdir_tree();
    assert_eq!(tree["notes.txt"], "file: kept\n", "{tree:#?}");
}

/// Symbolic links that stay inside the roots are followed by both workers
/// (issue 24 item 6): a relative link, a chain, `current -> releases/42`, a
/// `node_modules/.bin` link, a dangling link `write` creates the target of,
/// an edit through a link, a workdir link into a store (read, and a write
/// that reaches the server), and `glob`/`grep` through symlinked
/// directories.
#[tokio::test(flavor = "multi_thread")]
async fn symlinks_inside_the_roots_are_followed() {
    let (ours, theirs) = both(Case::new(
        "symlinks-inside",
        json!({
            "name": "symlinks-inside",
            "memory_stores": [
                {"key": "notes", "name": "notes", "access": "read_write",
                 "mount_path": "{root}/stores/notes", "memories": {"/a.md": "alpha\n"}}
            ],
            "prepare": {
                "files": {
                    "{workdir}/real.txt": "real content\n",
                    "{workdir}/releases/42/app.txt": "release 42\n",
                    "{workdir}/node_modules/pkg/bin/tool.js": "the tool\n",
                    "{workdir}/edit-me.txt": "one two\n",
                    "{workdir}/g/realdir/d.txt": "d needle\n"
                },
                "symlinks": {
                    "{workdir}/alias.txt": "real.txt",
                    "{workdir}/c1": "c2",
                    "{workdir}/c2": "{workdir}/c3",
                    "{workdir}/c3": "real.txt",
                    "{workdir}/current": "releases/42",
                    "{workdir}/node_modules/.bin/tool": "../pkg/bin/tool.js",
                    "{workdir}/new.txt": "made/created.txt",
                    "{workdir}/edit-alias.txt": "edit-me.txt",
                    "{workdir}/notes": "{root}/stores/notes",
                    "{workdir}/g/linkdir": "realdir"
                }
            },
            "steps": [
                {"tool": "read", "input": {"file_path": "alias.txt"},
                 "expect": {"is_error": false, "contains": "real content"}},
                {"tool": "read", "input": {"file_path": "c1"},
                 "expect": {"is_error": false, "contains": "real content"}},
                {"tool": "read", "input": {"file_path": "current/app.txt"},
                 "expect": {"is_error": false, "contains": "release 42"}},
                {"tool": "read", "input": {"file_path": "{workdir}/node_modules/.bin/tool"},
                 "expect": {"is_error": false, "contains": "the tool"}},
                {"tool": "write", "input": {"file_path": "new.txt", "content": "created\n"},
                 "expect": {"is_error": false}},
                {"tool": "read", "input": {"file_path": "made/created.txt"},
                 "expect": {"is_error": false, "contains": "created"}},
                {"tool": "edit", "input": {"file_path": "edit-alias.txt", "old_string": "one", "new_string": "1"},
                 "expect": {"is_error": false}},
                {"tool": "read", "input": {"file_path": "notes/a.md"},
                 "expect": {"is_error": false, "contains": "alpha"}},
                {"tool": "write", "input": {"file_path": "notes/b.md", "content": "beta\n"},
                 "expect": {"is_error": false}},
                {"tool": "glob", "input": {"pattern": "*/*.txt", "path": "g"},
                 "expect": {"is_error": false, "contains": "{workdir}/g/linkdir/d.txt"}},
                {"tool": "glob", "input": {"pattern": "*.md", "path": "notes"},
                 "expect": {"is_error": false, "contains": ["{root}/stores/notes/a.md", "{root}/stores/notes/b.md"]}},
                {"tool": "grep", "input": {"pattern": "needle", "path": "g/linkdir"},
                 "expect": {"is_error": false, "contains": "{workdir}/g/realdir/d.txt:1:d needle"}},
                {"tool": "grep", "input": {"pattern": "needle", "path": "g"},
                 "expect": {"is_error": false, "not_contains": "linkdir"}}
            ],
            "expect_final": {"notes": {"/a.md": "alpha\n", "/b.md": "beta\n"}}
        }),
    ))
    .await;
    // Written through the links: the targets changed, the links are links.
    let tree = ours.workdir_tree();
    assert_eq!(tree["made/created.txt"], "file: created\n", "{tree:#?}");
    assert_eq!(tree["edit-me.txt"], "file: 1 two\n", "{tree:#?}");
    assert_eq!(tree["new.txt"], "link -> made/created.txt", "{tree:#?}");
    for served in [&ours, &theirs] {
        assert!(
            served
                .writes
                .iter()
                .any(|w| w.path.as_deref() == Some("/b.md")
                    && w.content_sha256.as_deref()
                        == Some(crate::common::sha256("beta\n").as_str())),
            "the write through the link reached the server: {:?}",
            served.writes
        );
    }
}

/// Links that leave the roots are refused by both workers, dangling or
/// not, absolute or relative, under a directory link or at the leaf; a
/// loop answers "too many levels of symbolic links" without the workdir;
/// an alias of a read-only store refuses writes; `glob` through a
/// directory link leading out finds nothing; `glob` with an empty pattern
/// is refused (item 8). Nothing is created outside.
#[tokio::test(flavor = "multi_thread")]
async fn symlinks_leaving_the_roots_are_refused() {
    let outside = "is outside the session's working directory and its other permitted directories";
    let (ours, theirs) = both(Case::new(
        "symlinks-leaving",
        json!({
            "name": "symlinks-leaving",
            "memory_stores": [
                {"key": "kb", "name": "kb", "access": "read_only",
                 "mount_path": "{root}/stores/kb", "memories": {"/faq.md": "Q\n"}}
            ],
            "prepare": {
                "files": {"{root}/outside/secret.txt": "the secret\n"},
                "symlinks": {
                    "{workdir}/abs-out": "{root}/outside/secret.txt",
                    "{workdir}/rel-out": "../outside/secret.txt",
                    "{workdir}/dir-out": "../outside",
                    "{workdir}/dangling-out": "{root}/outside/not-yet.txt",
                    "{workdir}/loop-a": "loop-b",
                    "{workdir}/loop-b": "{workdir}/loop-a",
                    "{workdir}/kb-alias": "{root}/stores/kb"
                }
            },
            "steps": [
                {"tool": "read", "input": {"file_path": "abs-out"},
                 "expect": {"is_error": true, "contains": outside, "not_contains": "the secret"}},
                {"tool": "read", "input": {"file_path": "rel-out"},
                 "expect": {"is_error": true, "contains": outside, "not_contains": "the secret"}},
                {"tool": "read", "input": {"file_path": "dir-out/secret.txt"},
                 "expect": {"is_error": true, "contains": outside, "not_contains": "the secret"}},
                {"tool": "write", "input": {"file_path": "dangling-out", "content": "planted"},
                 "expect": {"is_error": true, "contains": outside}},
                {"tool": "write", "input": {"file_path": "dir-out/planted.txt", "content": "planted"},
                 "expect": {"is_error": true, "contains": outside}},
                {"tool": "read", "input": {"file_path": "loop-a"},
                 "expect": {"is_error": true, "contains": "too many levels of symbolic links", "not_contains": "{workdir}"}},
                {"tool": "write", "input": {"file_path": "loop-b/x", "content": "x"},
                 "expect": {"is_error": true, "contains": "too many levels of symbolic links", "not_contains": "{workdir}"}},
                {"tool": "read", "input": {"file_path": "kb-alias/faq.md"},
                 "expect": {"is_error": false, "contains": "Q"}},
                {"tool": "write", "input": {"file_path": "kb-alias/faq.md", "content": "changed"},
                 "expect": {"is_error": true, "contains": "kb-alias/faq.md is inside read-only directory"}},
                {"tool": "glob", "input": {"pattern": "dir-out/*"},
                 "expect": {"is_error": false, "contains": "no matches"}},
                {"tool": "glob", "input": {"pattern": "*", "path": "dir-out"},
                 "expect": {"is_error": true, "contains": outside}},
                {"tool": "grep", "input": {"pattern": "secret", "path": "dir-out"},
                 "expect": {"is_error": true, "contains": outside}},
                {"tool": "glob", "input": {"pattern": ""},
                 "expect": {"is_error": true, "contains": "glob: Unacceptable pattern: ''"}}
            ],
            "expect_final": {"kb": {"/faq.md": "Q\n"}}
        }),
    ))
    .await;
    for served in [&ours, &theirs] {
        let outside = served.root.path().join("outside");
        let mut names: Vec<_> = std::fs::read_dir(&outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, vec!["secret.txt"], "nothing planted outside");
    }
}

/// A store whose mount path has a symlinked ancestor (`{root}/link ->
/// {root}/real`, the store at `{root}/link/notes`) is reachable by the file
/// tools at the path the agent is told, by both workers; what the agent
/// writes there reaches the server.
#[tokio::test(flavor = "multi_thread")]
async fn a_store_under_a_symlinked_ancestor_is_reachable_at_its_mount_path() {
    let (ours, theirs) = both(Case::new(
        "store-under-symlinked-ancestor",
        json!({
            "name": "store-under-symlinked-ancestor",
            "memory_stores": [
                {"key": "notes", "name": "notes", "access": "read_write",
                 "mount_path": "{root}/link/notes", "memories": {"/a.md": "alpha\n"}}
            ],
            "prepare": {
                "dirs": ["{root}/real"],
                "symlinks": {"{root}/link": "{root}/real"}
            },
            "steps": [
                {"tool": "read", "input": {"file_path": "{root}/link/notes/a.md"},
                 "expect": {"is_error": false, "contains": "alpha"}},
                {"tool": "write", "input": {"file_path": "{root}/link/notes/b.md", "content": "beta\n"},
                 "expect": {"is_error": false}},
                {"tool": "edit", "input": {"file_path": "{root}/link/notes/a.md", "old_string": "alpha", "new_string": "alpha edited"},
                 "expect": {"is_error": false}},
                {"tool": "glob", "input": {"pattern": "*.md", "path": "{root}/link/notes"},
                 "expect": {"is_error": false, "contains": ["a.md", "b.md"]}},
                {"tool": "grep", "input": {"pattern": "beta", "path": "{root}/link/notes"},
                 "expect": {"is_error": false, "contains": "b.md:1:beta"}},
                {"tool": "bash", "input": {"command": "cat {root}/link/notes/b.md"},
                 "expect": {"is_error": false, "contains": "beta"}}
            ],
            "expect_final": {"notes": {"/a.md": "alpha edited\n", "/b.md": "beta\n"}}
        }),
    ))
    .await;
    for served in [&ours, &theirs] {
        assert!(
            served
                .writes
                .iter()
                .any(|w| w.path.as_deref() == Some("/b.md")),
            "{:?}",
            served.writes
        );
    }
}
