//! Issue 12 (decision 10): neither a file's size nor a tree's shape drives
//! the worker's memory, stack or descriptors through the file tools. The
//! agent makes a one-line sparse file of gigabytes (`truncate -s 64G`: the
//! hole reads as zeros, no `\n`) and a directory chain thousands deep;
//! `grep`, `read` with a `view_range`, and `glob` must answer with a flat
//! peak RSS, in bounded time, and never crash.
//!
//! `ENVWORKER_SPARSE_MIB` sets the sparse file's size (default 1,024 MiB:
//! it costs no disk, and the fixed code no memory either);
//! `ENVWORKER_DEEP_LEVELS` the chain's depth (default 5,000).

use std::time::{Duration, Instant};

use crate::common::toolbox::{T, write};
use serde_json::json;

/// Before the fix, `ENVWORKER_SPARSE_MIB=1024`: grep's `read_until` and the
/// read tool's line streaming each buffered the whole 1 GiB "line" (see the
/// commit for the figures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sparse_one_line_file_never_drives_memory_use() {
    if !crate::common::runs_alone("a_sparse_one_line_file_never_drives_memory_use") {
        return;
    }
    let mib = crate::common::env_count("ENVWORKER_SPARSE_MIB", 1024);
    let t = T::new();
    write(&t.p("work/f.txt"), &"x".repeat(600));
    std::fs::OpenOptions::new()
        .write(true)
        .open(t.p("work/f.txt"))
        .unwrap()
        .set_len(mib << 20)
        .unwrap();
    write(&t.p("work/g.txt"), "x marks the spot\n");
    let before = crate::common::peak_rss_kib();
    let started = Instant::now();
    let grep = t.call("grep", json!({"pattern": "x"})).await;
    let grep_s = started.elapsed().as_secs_f64();
    // The over-long line is skipped, the file searched only so far (and
    // said so), the other file still searched.
    let grep = grep.unwrap();
    assert!(grep.contains("g.txt:1:x marks the spot"), "{grep}");
    assert!(!grep.contains("f.txt:1:"), "{grep}");
    if mib > 100 {
        assert!(
            grep.contains("f.txt: searched only the first 104857600 bytes]"),
            "{grep}"
        );
    }
    let started = Instant::now();
    let line1 = t
        .call("read", json!({"file_path": "f.txt", "view_range": [1, 1]}))
        .await
        .unwrap_err();
    assert!(line1.contains("line 1 of f.txt alone exceeds"), "{line1}");
    // Line 2 does not exist: the whole (skipped) first line is streamed past.
    let line2 = t
        .call("read", json!({"file_path": "f.txt", "view_range": [2, 2]}))
        .await;
    let read_s = started.elapsed().as_secs_f64();
    assert!(
        line2.as_deref().is_ok_and(str::is_empty)
            || line2.as_ref().is_err_and(|e| e.contains("timed out")),
        "{line2:?}"
    );
    let peak = crate::common::peak_rss_kib();
    println!(
        "sparse one-line file: {mib} MiB; peak RSS before {} MiB, after grep and read {} MiB; grep {grep_s:.2} s, reads {read_s:.2} s",
        before / 1024,
        peak / 1024
    );
    assert!(
        peak < before + 64 * 1024,
        "peak RSS grew from {before} KiB to {peak} KiB with a {mib} MiB one-line file"
    );
}

/// A chain deeper than the walk's cap, with an empty sibling at every level
/// (so a walk keeps one pending directory per level): `glob` and `grep`
/// answer in bounded time, find what is shallow and skip what is deeper
/// than the cap, and hold a bounded number of descriptors. Before the fix
/// both walked all 5,000 levels (one descriptor and an O(depth) path per
/// pending sibling) and found the deep file.
#[tokio::test]
async fn glob_and_grep_over_a_deep_chain_answer_in_bounded_time() {
    let depth = crate::common::env_count("ENVWORKER_DEEP_LEVELS", 5_000) as usize;
    let t = T::new();
    write(&t.p("work/top.txt"), "needle at the top\n");
    crate::common::deep_chain(&t.p("work"), depth, "deep.txt", "needle at the bottom\n");
    for (tool, pattern) in [("glob", "**/*.txt"), ("grep", "needle")] {
        let started = Instant::now();
        let answer = t
            .call_for(tool, json!({"pattern": pattern}), Duration::from_secs(60))
            .await
            .unwrap();
        let took = started.elapsed();
        println!("{tool} over a {depth}-deep chain: {took:?}");
        assert!(answer.contains("top.txt"), "{tool}: {answer}");
        assert!(
            !answer.contains("deep.txt"),
            "{tool}: deeper than the cap, skipped"
        );
        assert!(took < Duration::from_secs(20), "{tool} took {took:?}");
    }
}
