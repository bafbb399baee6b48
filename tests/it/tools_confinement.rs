//! The file tools stay inside their roots whatever the agent does to the tree
//! (issue 12 item 1): a store folder or a directory on the way replaced by a
//! symlink (to `/proc/self`, to a directory holding a secret), a root renamed
//! away and re-created, and a `renameat2(RENAME_EXCHANGE)` loop between a
//! directory and symlinks (leading outside, absolute and relative, and
//! staying inside, absolute and relative) racing thousands of
//! `read`/`glob`/`grep`/`edit`/`write` calls. Nothing outside the roots is
//! ever returned or touched, and the links that stay inside are followed.
//!
//! The race runs a bounded count in CI; set `ENVWORKER_RACE_ATTEMPTS` for
//! more (e.g. `ENVWORKER_RACE_ATTEMPTS=100000 cargo test --test
//! it tools_confinement::race -- --nocapture`). It runs once with `openat2` and
//! once with the per-component walk the tools fall back to without it.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::common::toolbox::T;
use serde_json::json;

/// The marker only files outside the roots hold.
const SECRET: &str = "SECRET-OUTSIDE-7f3a";
/// A name only the outside directory holds: `glob` must never list it.
const OUTSIDE_ONLY: &str = "outside-only.txt";
/// Race attempts per mode when `ENVWORKER_RACE_ATTEMPTS` is unset.
const DEFAULT_RACE_ATTEMPTS: u64 = 2_000;

/// The shared toolset tree (`work`, `mem`, read-only `kb`, `outside`) with
/// the secret outside; built once, as at session start, before the agent
/// touches anything.
fn tree() -> T {
    let t = T::new();
    std::fs::write(t.p("outside/secret.txt"), SECRET).unwrap();
    t
}

/// Replace `rel` (a directory) by a symlink to `target`, as the agent's shell can.
fn replace_with_symlink(t: &T, rel: &str, target: &Path) {
    std::fs::remove_dir_all(t.p(rel)).unwrap();
    symlink(target, t.p(rel)).unwrap();
}

/// The names in `<tmp>/outside`: nothing the tools do may add one.
fn outside_names(t: &T) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(t.p("outside"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn set_openat2(on: bool) {
    envworker::fsx::use_openat2(on);
}

fn kernel_path() -> &'static str {
    if envworker::fsx::openat2_in_use() {
        "openat2"
    } else {
        "walk"
    }
}

/// Neither an answer nor an error may carry a byte of `leak`.
#[track_caller]
fn assert_no_leak(what: &str, answer: &Result<String, String>, leak: &str) {
    let text = match answer {
        Ok(t) | Err(t) => t,
    };
    assert!(!text.contains(leak), "{what} leaked: {text}");
}

#[tokio::test]
async fn a_store_folder_replaced_by_a_symlink_to_proc_self_leaks_no_environment() {
    let t = tree();
    std::fs::write(t.p("mem/note.md"), "note").unwrap();
    // The agent's shell: rm -rf the store folder, ln -s /proc/self in its place.
    replace_with_symlink(&t, "mem", Path::new("/proc/self"));
    let environ = std::fs::read("/proc/self/environ").unwrap();
    let first_var =
        String::from_utf8_lossy(environ.split(|b| *b == 0).next().unwrap()).into_owned();
    assert!(!first_var.is_empty(), "the test process has an environment");
    for (tool, input) in [
        ("read", json!({"file_path": t.s("mem/environ")})),
        ("read", json!({"file_path": t.s("mem/status")})),
        ("read", json!({"file_path": t.s("mem/cwd/../mem/environ")})),
        ("grep", json!({"pattern": ".", "path": t.s("mem/environ")})),
        ("grep", json!({"pattern": "Name", "path": t.s("mem")})),
        ("glob", json!({"pattern": "*", "path": t.s("mem")})),
    ] {
        let answer = t.call(tool, input.clone()).await;
        assert_no_leak(&format!("{tool} {input}"), &answer, &first_var);
        assert_no_leak(&format!("{tool} {input}"), &answer, "Name:");
        let err = answer.expect_err(&format!("{tool} {input} must be refused"));
        assert!(
            err.contains("was replaced or removed during the session"),
            "{tool}: {err}"
        );
        assert!(err.contains(&t.s("mem")), "names the folder: {err}");
    }
}

#[tokio::test]
async fn a_store_folder_replaced_by_a_symlink_to_an_outside_dir_is_neither_read_nor_written() {
    let t = tree();
    replace_with_symlink(&t, "mem", &t.p("outside"));
    for (tool, input) in [
        ("read", json!({"file_path": t.s("mem/secret.txt")})),
        ("grep", json!({"pattern": "SECRET", "path": t.s("mem")})),
        ("glob", json!({"pattern": "*.txt", "path": t.s("mem")})),
        (
            "write",
            json!({"file_path": t.s("mem/planted.md"), "content": "x"}),
        ),
        (
            "edit",
            json!({"file_path": t.s("mem/secret.txt"), "old_string": "SECRET", "new_string": "gone"}),
        ),
    ] {
        let answer = t.call(tool, input.clone()).await;
        assert_no_leak(&format!("{tool} {input}"), &answer, SECRET);
        if tool == "glob" {
            assert_no_leak(&format!("{tool} {input}"), &answer, "secret.txt");
        }
        let err = answer.expect_err(&format!("{tool} {input} must be refused"));
        assert!(
            err.contains("was replaced or removed during the session"),
            "{tool}: {err}"
        );
    }
    assert_eq!(outside_names(&t), vec!["secret.txt"]);
    assert_eq!(
        std::fs::read_to_string(t.p("outside/secret.txt")).unwrap(),
        SECRET
    );
}

#[tokio::test]
async fn a_directory_on_the_way_replaced_by_a_symlink_is_refused_by_every_tool() {
    let t = tree();
    for root in ["work", "mem"] {
        std::fs::create_dir_all(t.p(&format!("{root}/sub"))).unwrap();
        replace_with_symlink(&t, &format!("{root}/sub"), &t.p("outside"));
        let sub = t.s(&format!("{root}/sub"));
        for (tool, input) in [
            ("read", json!({"file_path": format!("{sub}/secret.txt")})),
            ("grep", json!({"pattern": "SECRET", "path": sub})),
            ("grep", json!({"pattern": "SECRET", "path": t.s(root)})),
            ("glob", json!({"pattern": "**/*.txt", "path": t.s(root)})),
            ("glob", json!({"pattern": "*", "path": sub})),
            // A plain segment enters a symlinked directory: one leading
            // out of the search root is dropped.
            ("glob", json!({"pattern": "sub/*", "path": t.s(root)})),
            ("glob", json!({"pattern": "*/*", "path": t.s(root)})),
            (
                "write",
                json!({"file_path": format!("{sub}/planted.md"), "content": "x"}),
            ),
            (
                "write",
                json!({"file_path": format!("{sub}/new/planted.md"), "content": "x"}),
            ),
        ] {
            let answer = t.call(tool, input.clone()).await;
            assert_no_leak(&format!("{tool} {input}"), &answer, SECRET);
            if tool == "glob" {
                assert_no_leak(&format!("{tool} {input}"), &answer, "secret.txt");
            }
        }
        let err = t
            .call("read", json!({"file_path": format!("{sub}/secret.txt")}))
            .await
            .unwrap_err();
        assert!(
            err.ends_with(
                "is outside the session's working directory and its other permitted directories"
            ),
            "{err}"
        );
    }
    assert_eq!(outside_names(&t), vec!["secret.txt"]);
}

#[tokio::test]
async fn a_root_renamed_away_and_recreated_answers_a_clear_error() {
    let t = tree();
    std::fs::write(t.p("mem/n.md"), "old").unwrap();
    std::fs::write(t.p("work/a.txt"), "old").unwrap();
    std::fs::rename(t.p("mem"), t.p("mem-old")).unwrap();
    std::fs::create_dir(t.p("mem")).unwrap();
    std::fs::write(t.p("mem/n.md"), "new").unwrap();
    let err = t
        .call("read", json!({"file_path": t.s("mem/n.md")}))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        format!(
            "read: the directory {} was replaced or removed during the session",
            t.s("mem")
        )
    );
    let err = t
        .call(
            "write",
            json!({"file_path": t.s("mem/n.md"), "content": "x"}),
        )
        .await
        .unwrap_err();
    assert!(err.starts_with("write: the directory"), "{err}");
    assert_eq!(std::fs::read_to_string(t.p("mem/n.md")).unwrap(), "new");
    assert_eq!(std::fs::read_to_string(t.p("mem-old/n.md")).unwrap(), "old");

    // The workdir too; the error never names it absolutely.
    std::fs::rename(t.p("work"), t.p("work-old")).unwrap();
    std::fs::create_dir(t.p("work")).unwrap();
    for (tool, input) in [
        ("read", json!({"file_path": "a.txt"})),
        ("glob", json!({"pattern": "*"})),
        ("grep", json!({"pattern": "old"})),
    ] {
        let err = t.call(tool, input).await.unwrap_err();
        assert_eq!(
            err,
            format!("{tool}: the working directory was replaced or removed during the session")
        );
    }
    // Removed outright: the same answer.
    std::fs::remove_dir_all(t.p("mem")).unwrap();
    let err = t
        .call("read", json!({"file_path": t.s("mem/n.md")}))
        .await
        .unwrap_err();
    assert!(err.contains("was replaced or removed"), "{err}");
}

fn race_attempts() -> u64 {
    std::env::var("ENVWORKER_RACE_ATTEMPTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_RACE_ATTEMPTS)
}

/// Exchange `a` with each of `partners` in turn (a directory and symlinks)
/// until `stop`: the name `a` holds, in turn, the directory and each link.
fn exchange_loop(a: PathBuf, partners: Vec<PathBuf>, stop: Arc<AtomicBool>, swaps: Arc<AtomicU64>) {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    while !stop.load(Ordering::Relaxed) {
        for b in &partners {
            renameat_with(CWD, &a, CWD, b, RenameFlags::EXCHANGE).expect("renameat2 EXCHANGE");
            swaps.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What a file reached through a link that stays inside holds.
const VIA_INSIDE_LINK: &str = "inside, through a link";

/// What one race saw.
struct Raced {
    leaks: u64,
    /// Files created outside.
    planted: u64,
    /// Reads answered through a link that stays inside (links are followed
    /// under the race, not refused).
    through_links: u64,
}

/// `attempts` tool calls through `work/d` and `mem`, each of which a thread
/// keeps exchanging with symlinks: to `outside` (absolute and relative) and
/// to a directory inside (absolute and relative); returns what it saw.
async fn race(attempts: u64) -> Raced {
    let t = tree();
    // work/d and mem hold `inside.txt` and a harmless `secret.txt`; outside
    // holds the real `secret.txt` and a name of its own; work/in is where
    // the links that stay inside lead.
    std::fs::write(t.p(&format!("outside/{OUTSIDE_ONLY}")), "x").unwrap();
    std::fs::create_dir(t.p("work/d")).unwrap();
    std::fs::create_dir(t.p("work/in")).unwrap();
    for dir in ["work/d", "mem"] {
        std::fs::write(t.p(&format!("{dir}/inside.txt")), "inside").unwrap();
        std::fs::write(t.p(&format!("{dir}/secret.txt")), "inside too").unwrap();
    }
    std::fs::write(t.p("work/in/inside.txt"), "inside").unwrap();
    std::fs::write(t.p("work/in/secret.txt"), VIA_INSIDE_LINK).unwrap();
    let links: [(&str, PathBuf); 7] = [
        ("work/l", t.p("outside")),
        ("work/l-rel", PathBuf::from("../outside")),
        ("work/l-in", t.p("work/in")),
        ("work/l-in-rel", PathBuf::from("in")),
        ("mem-link", t.p("outside")),
        ("mem-rel", PathBuf::from("outside")),
        ("mem-in-rel", PathBuf::from("work/in")),
    ];
    for (link, target) in &links {
        symlink(target, t.p(link)).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = [
        (
            "work/d",
            &["work/l", "work/l-in", "work/l-rel", "work/l-in-rel"][..],
        ),
        ("mem", &["mem-link", "mem-in-rel", "mem-rel"][..]),
    ]
    .into_iter()
    .map(|(a, partners)| {
        let (a, stop, swaps) = (t.p(a), stop.clone(), swaps.clone());
        let partners = partners.iter().map(|b| t.p(b)).collect();
        std::thread::spawn(move || exchange_loop(a, partners, stop, swaps))
    })
    .collect();
    let mut raced = Raced {
        leaks: 0,
        planted: 0,
        through_links: 0,
    };
    for i in 0..attempts {
        let base = if i % 2 == 0 {
            t.s("work/d")
        } else {
            t.s("mem")
        };
        let (tool, input) = match (i / 2) % 8 {
            0 => ("read", json!({"file_path": format!("{base}/secret.txt")})),
            1 => ("grep", json!({"pattern": "SECRET", "path": base})),
            2 => (
                "grep",
                json!({"pattern": "SECRET", "path": format!("{base}/secret.txt")}),
            ),
            3 => ("glob", json!({"pattern": "*", "path": base})),
            // Through the workdir: `d` (and the links beside it) entered by
            // a plain segment, whatever each holds at that instant.
            4 => ("glob", json!({"pattern": "*/*.txt", "path": t.s("work")})),
            5 => ("read", json!({"file_path": "d/secret.txt"})),
            6 => (
                "edit",
                json!({"file_path": format!("{base}/inside.txt"), "old_string": "inside", "new_string": "inside"}),
            ),
            _ => (
                "write",
                json!({"file_path": format!("{base}/w{i}.md"), "content": "x"}),
            ),
        };
        let answer = t.call(tool, input).await;
        let text = match &answer {
            Ok(t) | Err(t) => t,
        };
        // glob lists names only: a name only `outside` has is a leak.
        let leaked = text.contains(SECRET) || text.contains(OUTSIDE_ONLY);
        if leaked && raced.leaks == 0 {
            eprintln!("first leak: {tool}: {text}");
        }
        if leaked {
            raced.leaks += 1;
        }
        if text == VIA_INSIDE_LINK {
            raced.through_links += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for th in threads {
        th.join().unwrap();
    }
    raced.planted = outside_names(&t).len() as u64 - 2;
    eprintln!(
        "race [{}]: {} leaks and {} files written outside in {attempts} attempts ({} exchanges; {} reads answered through a link staying inside)",
        kernel_path(),
        raced.leaks,
        raced.planted,
        swaps.load(Ordering::Relaxed),
        raced.through_links,
    );
    raced
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn race_a_rename_exchange_loop_never_yields_an_outside_byte() {
    let attempts = race_attempts();
    set_openat2(true);
    let with_openat2 = race(attempts).await;
    set_openat2(false);
    let with_walk = race(attempts).await;
    set_openat2(true);
    assert_eq!(
        (
            with_openat2.leaks + with_openat2.planted,
            with_walk.leaks + with_walk.planted
        ),
        (0, 0),
        "leaks out of {attempts} attempts (openat2, walk)"
    );
    // The links that stay inside were followed, not refused.
    assert!(
        with_openat2.through_links > 0 && with_walk.through_links > 0,
        "no read went through a link staying inside ({}, {})",
        with_openat2.through_links,
        with_walk.through_links
    );
}

#[tokio::test]
async fn skill_cleanup_never_follows_a_skills_dir_replaced_by_a_symlink() {
    let t = tree();
    // What download_session_skills installed, then the agent's shell:
    // mv skills away, ln -s <outside> skills, where outside/pdf is not ours.
    std::fs::create_dir_all(t.p("work/skills/pdf/scripts")).unwrap();
    std::fs::write(t.p("work/skills/pdf/scripts/run.sh"), "x").unwrap();
    std::fs::create_dir_all(t.p("outside/pdf")).unwrap();
    std::fs::write(t.p("outside/pdf/keep.txt"), SECRET).unwrap();
    let installed = vec![t.p("work/skills/pdf")];
    std::fs::rename(t.p("work/skills"), t.p("work/skills-moved")).unwrap();
    symlink(t.p("outside"), t.p("work/skills")).unwrap();
    envworker::skills::remove_skills(&installed).await;
    assert!(
        t.p("outside/pdf/keep.txt").exists(),
        "removed outside files"
    );
    // Without the swap, the skill goes (symlinks inside it are unlinked, not followed).
    std::fs::remove_file(t.p("work/skills")).unwrap();
    std::fs::rename(t.p("work/skills-moved"), t.p("work/skills")).unwrap();
    symlink(t.p("outside"), t.p("work/skills/pdf/escape")).unwrap();
    envworker::skills::remove_skills(&installed).await;
    assert!(!t.p("work/skills/pdf").exists());
    assert!(t.p("outside/pdf/keep.txt").exists());
}

/// The worker's environment as this test process holds it: its first variable.
fn first_env_var() -> String {
    let environ = std::fs::read("/proc/self/environ").unwrap();
    let first = String::from_utf8_lossy(environ.split(|b| *b == 0).next().unwrap()).into_owned();
    assert!(!first.is_empty(), "the test process has an environment");
    first
}

#[tokio::test]
async fn roots_that_already_lead_into_proc_when_the_session_starts_are_refused() {
    // An earlier session's agent left the workdir and a store path as
    // symlinks to /proc/self: the next session's roots are opened through
    // them, and a plain `environ` below such a root involves no symlink.
    let leak = first_env_var();
    let t = T::with(|ctx| {
        for root in [ctx.workdir.clone(), ctx.allowed_roots[0].clone()] {
            std::fs::remove_dir_all(&root).unwrap();
            symlink("/proc/self", &root).unwrap();
        }
    });
    for (tool, input) in [
        ("read", json!({"file_path": "environ"})),
        ("read", json!({"file_path": t.s("work/environ")})),
        ("read", json!({"file_path": t.s("mem/environ")})),
        ("grep", json!({"pattern": ".", "path": t.s("mem")})),
        ("glob", json!({"pattern": "*", "path": t.s("work")})),
        (
            "write",
            json!({"file_path": t.s("mem/comm"), "content": "x"}),
        ),
    ] {
        let answer = t.call(tool, input.clone()).await;
        assert_no_leak(&format!("{tool} {input}"), &answer, &leak);
        let err = answer.expect_err(&format!("{tool} {input} must be refused"));
        assert!(
            err.contains("kernel filesystem such as /proc"),
            "{tool} {input}: {err}"
        );
    }
}

#[tokio::test]
async fn a_root_with_proc_below_it_never_serves_the_workers_own_proc_entry() {
    // A worker started with its workdir at `/` (an image without WORKDIR):
    // `/proc/<worker pid>/environ` has no symlink on the way, and a process
    // may always read its own environment, non-dumpable or not.
    let leak = first_env_var();
    let t = T::with(|ctx| ctx.workdir = PathBuf::from("/"));
    let pid = std::process::id();
    for (tool, input) in [
        ("read", json!({"file_path": format!("/proc/{pid}/environ")})),
        ("read", json!({"file_path": format!("proc/{pid}/environ")})),
        ("read", json!({"file_path": "/proc/self/environ"})),
        (
            "grep",
            json!({"pattern": ".", "path": format!("/proc/{pid}/environ")}),
        ),
        (
            "glob",
            json!({"pattern": "*", "path": format!("/proc/{pid}")}),
        ),
    ] {
        let answer = t.call(tool, input.clone()).await;
        assert_no_leak(&format!("{tool} {input}"), &answer, &leak);
        answer.expect_err(&format!("{tool} {input} must be refused"));
    }
    // What is not a kernel filesystem under that root is still served.
    std::fs::write(t.p("outside/plain.txt"), "plain").unwrap();
    let own = t
        .call("read", json!({"file_path": t.s("outside/plain.txt")}))
        .await;
    assert!(own.is_ok_and(|text| text.contains("plain")));
}

#[tokio::test]
async fn grep_and_glob_walking_from_a_root_above_proc_never_descend_into_it() {
    // With the workdir at `/`, a search from `/` must skip `/proc` (and
    // `/sys`): it holds the worker's own environment, readable by the
    // worker whatever its dumpable flag says.
    let t = T::with(|ctx| ctx.workdir = PathBuf::from("/"));
    let needle = format!(
        "CARGO_BIN_EXE_envworker={}",
        env!("CARGO_BIN_EXE_envworker")
    );
    let pid = std::process::id();
    let grep = t
        .call_for(
            "grep",
            json!({"pattern": regex::escape(&needle), "path": "/", "output_mode": "files_with_matches"}),
            std::time::Duration::from_secs(60),
        )
        .await;
    assert_no_leak("grep from /", &grep, &format!("/proc/{pid}"));
    assert_no_leak("grep from /", &grep, "/proc/");
    let glob = t
        .call_for(
            "glob",
            json!({"pattern": format!("proc/{pid}/environ"), "path": "/"}),
            std::time::Duration::from_secs(60),
        )
        .await;
    assert_no_leak("glob from /", &glob, "/proc/");
}
