//! File calls on a multi-thread runtime, as the worker runs them: a short
//! call runs on the session's runtime thread; a long one never holds that
//! thread longer than the inline budget (`tools::lane`), whatever the agent
//! made of its tree; results are the same either way.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::common::toolbox::{T, write};
use serde_json::{Value, json};

/// Run `call` on a one-thread multi-thread runtime (the worker's shape
/// with one item) while a ticker on the same runtime sleeps 1 ms at a
/// time: the call's output and the longest the ticker waited past its tick.
fn beside_a_ticker(t: &Arc<T>, name: &str, input: Value) -> (Result<String, String>, Duration) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let stop = Arc::new(AtomicBool::new(false));
        let ticker = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut worst = Duration::ZERO;
                while !stop.load(Ordering::Relaxed) {
                    let before = std::time::Instant::now();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    worst = worst.max(before.elapsed().saturating_sub(Duration::from_millis(1)));
                }
                worst
            }
        });
        // Let the ticker start ticking.
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The call as a spawned task: a runtime worker thread polls it, as
        // a session's runner is.
        let out = tokio::spawn({
            let t = t.clone();
            let name = name.to_string();
            async move {
                t.tools
                    .run(
                        &name,
                        input,
                        tokio::time::Instant::now() + Duration::from_secs(60),
                    )
                    .await
                    .map(|o| o.text())
                    .map_err(|e| e.message)
            }
        })
        .await
        .unwrap();
        stop.store(true, Ordering::Relaxed);
        (out, ticker.await.unwrap())
    })
}

/// A tree of `n` small files under `work/big`, the needle in the last one.
fn big_tree(t: &T, n: usize) {
    for i in 0..n {
        let body = if i == n - 1 { "needle here\n" } else { "hay\n" };
        write(&t.p(&format!("work/big/d{:03}/f{i:05}.txt", i / 500)), body);
    }
}

/// Over a 30,000-file tree, `name(input)` gives `want` (the whole tree
/// searched: again, on the blocking pool) and takes far longer than any
/// wait of the ticker: it did not hold the runtime thread past its budget.
fn never_holds_the_runtime_thread(name: &str, input: Value, want: &str) {
    let t = Arc::new(T::new());
    big_tree(&t, 30_000);
    let started = std::time::Instant::now();
    let (out, worst) = beside_a_ticker(&t, name, input);
    let took = started.elapsed();
    assert_eq!(out.unwrap(), format!("{}/big/d059/{want}", t.s("work")));
    assert!(
        took > worst * 3,
        "the runtime thread was held {worst:?} by a {name} of {took:?}"
    );
}

#[test]
fn a_grep_over_a_huge_tree_never_holds_the_runtime_thread() {
    never_holds_the_runtime_thread(
        "grep",
        json!({"pattern": "needle", "path": "big"}),
        "f29999.txt:1:needle here",
    );
}

#[test]
fn a_glob_over_a_huge_tree_never_holds_the_runtime_thread() {
    never_holds_the_runtime_thread("glob", json!({"pattern": "**/f29999.txt"}), "f29999.txt");
}

#[test]
fn short_calls_inline_give_what_the_blocking_pool_gives() {
    // In the default temporary directory: on a disk (as on the machine
    // this was written on), the write's fsync is handed off through
    // `block_in_place`, which must work there.
    let t = Arc::new(T::new());
    write(&t.p("work/notes/a.txt"), "alpha\nbeta\n");
    let calls = [
        (
            "write",
            json!({"file_path": "notes/b.txt", "content": "one\ntwo\n"}),
        ),
        ("read", json!({"file_path": "notes/b.txt"})),
        (
            "read",
            json!({"file_path": "notes/b.txt", "view_range": [2, 2]}),
        ),
        (
            "edit",
            json!({"file_path": "notes/b.txt", "old_string": "two", "new_string": "three"}),
        ),
        ("read", json!({"file_path": "notes/b.txt"})),
        ("glob", json!({"pattern": "notes/*.txt"})),
        ("grep", json!({"pattern": "^(beta|three)$"})),
        ("read", json!({"file_path": "notes/missing.txt"})),
        (
            "write",
            json!({"file_path": "../outside/x.txt", "content": "no"}),
        ),
    ];
    let mut inline = Vec::new();
    for (name, input) in calls.clone() {
        inline.push(beside_a_ticker(&t, name, input).0);
    }
    // The same calls on a current-thread runtime: all on the blocking pool.
    std::fs::remove_file(t.p("work/notes/b.txt")).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let pooled: Vec<_> = rt.block_on(async {
        let mut out = Vec::new();
        for (name, input) in calls {
            out.push(t.call(name, input).await);
        }
        out
    });
    assert_eq!(inline, pooled);
    let w = t.s("work");
    assert_eq!(inline[4], Ok("one\nthree\n".to_string()));
    assert_eq!(
        inline[6],
        Ok(format!("{w}/notes/a.txt:2:beta\n{w}/notes/b.txt:2:three"))
    );
    assert!(std::fs::metadata(t.p("outside/x.txt")).is_err());
}
