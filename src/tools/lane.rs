//! Where a file tool's call runs: on the session's runtime thread while it
//! is short, on the blocking pool when it may be long.
//!
//! A file call on a note (read, write or edit a few hundred bytes; glob or
//! grep a small tree) takes tens of microseconds. Handing it to the blocking
//! pool and back costs two cross-thread wake-ups — about 40 µs on the 2-core
//! benchmark host, a tenth of a whole step and a tenth of the worker's CPU
//! (`cargo bench --bench session`). So on a multi-thread runtime a call
//! first runs on the calling thread, and what could hold that thread long
//! does not stay there:
//!
//! - **read, glob, grep** (nothing written) run with their deadline pulled
//!   in to [`INLINE_BUDGET`]; they honour a deadline at fine grain (every
//!   256 entries, every buffer, every line). One the budget cut short runs
//!   again, whole, on the blocking pool with its real deadline: at most one
//!   budget of work is wasted, and the runtime is never held longer (a
//!   hostile tree of a million files included).
//! - **write, edit**: bounded by the file cap; the one step that can wait on
//!   the disk, the `fsync` of the new file, is handed off ([`long`], tokio's
//!   `block_in_place`: the runtime moves to another thread meanwhile) unless
//!   the filesystem is memory-backed, where it returns at once.
//! - What cannot be bounded goes to the pool as before: a read or an edit
//!   with the cap off or above [`INLINE_MAX_BYTES`], an image or a PDF, a
//!   write larger than [`INLINE_MAX_BYTES`].
//!
//! On a current-thread runtime (a library user's, the tests') every call
//! goes to the pool: there is no other thread to hand the runtime to.

use std::cell::Cell;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a call may hold the runtime thread before it is handed off.
pub(crate) const INLINE_BUDGET: Duration = Duration::from_millis(2);
/// The largest file (read, edit) or content (write) handled inline.
pub(crate) const INLINE_MAX_BYTES: u64 = 1024 * 1024;

thread_local! {
    /// Set while a call runs on a runtime thread: [`long`] then hands the
    /// runtime off before it blocks.
    static INLINE: Cell<bool> = const { Cell::new(false) };
}

/// How a file call may run inline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inline {
    /// On the blocking pool only.
    No,
    /// Inline within [`INLINE_BUDGET`] (its deadline pulled in), else again
    /// on the pool: the call writes nothing.
    Budgeted,
    /// Inline to the end, its blocking steps handed off through [`long`].
    Bounded,
}

/// Whether the call `name(input)` may run inline, with files capped at
/// `max_bytes`; `is_media` tells a path `read` returns as a base64 block.
/// Decided from the input alone: the file is not opened twice.
pub(crate) fn inline_for(
    name: &str,
    input: &Value,
    max_bytes: Option<u64>,
    is_media: impl Fn(&str) -> bool,
) -> Inline {
    if !on_multi_thread_runtime() {
        return Inline::No;
    }
    let capped = max_bytes.is_some_and(|cap| cap <= INLINE_MAX_BYTES);
    match name {
        "glob" | "grep" => Inline::Budgeted,
        "read" => {
            let media = input["file_path"].as_str().is_some_and(is_media);
            if capped && !media {
                Inline::Budgeted
            } else {
                Inline::No
            }
        }
        "edit" if capped => Inline::Bounded,
        "write"
            if input["content"]
                .as_str()
                .is_some_and(|c| c.len() as u64 <= INLINE_MAX_BYTES) =>
        {
            Inline::Bounded
        }
        _ => Inline::No,
    }
}

fn on_multi_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// Run `f` here, on the runtime thread, with [`long`] handing off. A panic
/// is caught, as the blocking pool catches one, so that it fails the call
/// and not the session's runner.
pub(crate) fn run_inline<R>(f: impl FnOnce() -> R) -> std::thread::Result<R> {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            INLINE.with(|i| i.set(self.0));
        }
    }
    let _reset = Reset(INLINE.with(|i| i.replace(true)));
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
}

/// The deadline of a [`Inline::Budgeted`] call's inline run.
pub(crate) fn budget_end(deadline: Instant) -> Instant {
    (Instant::now() + INLINE_BUDGET).min(deadline)
}

/// Whether a budgeted inline run that had until `budget_end` was cut short
/// by the budget (not by the call's own `deadline`): it must run again.
pub(crate) fn cut_by_budget(budget_end: Instant, deadline: Instant) -> bool {
    budget_end < deadline && Instant::now() >= budget_end
}

/// Run `f`, which may wait on the disk: inline, it first hands the runtime
/// to another thread (`block_in_place`); anywhere else it just runs.
pub(crate) fn long<R>(f: impl FnOnce() -> R) -> R {
    if INLINE.with(Cell::get) {
        // Within `f`, nothing is inline any more.
        INLINE.with(|i| i.set(false));
        let out = tokio::task::block_in_place(f);
        INLINE.with(|i| i.set(true));
        out
    } else {
        f()
    }
}

/// Run `f`, which waits on the disk `file` lies on: [`long`], unless that
/// filesystem is held in memory (asked only inline: on the pool, `f` just
/// runs).
pub(crate) fn long_on_disk<R>(file: impl std::os::fd::AsFd, f: impl FnOnce() -> R) -> R {
    if INLINE.with(Cell::get) && !crate::fsx::memory_backed(file) {
        long(f)
    } else {
        f()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn media(path: &str) -> bool {
        path.to_ascii_lowercase().ends_with(".pdf") || path.ends_with(".png")
    }

    #[test]
    fn outside_a_multi_thread_runtime_every_call_goes_to_the_pool() {
        assert_eq!(inline_for("grep", &json!({}), Some(1), media), Inline::No);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            assert_eq!(
                inline_for("read", &json!({"file_path": "a"}), Some(1), media),
                Inline::No
            );
        });
    }

    #[test]
    fn what_may_run_inline_and_how() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        rt.block_on(async {
            let cap = Some(256 * 1024);
            let big = "x".repeat(INLINE_MAX_BYTES as usize + 1);
            let table = [
                ("read", json!({"file_path": "a.txt"}), cap, Inline::Budgeted),
                ("read", json!({"file_path": "a.txt"}), None, Inline::No),
                (
                    "read",
                    json!({"file_path": "a.txt"}),
                    Some(INLINE_MAX_BYTES + 1),
                    Inline::No,
                ),
                ("read", json!({"file_path": "scan.PDF"}), cap, Inline::No),
                ("read", json!({"file_path": "p.png"}), cap, Inline::No),
                ("glob", json!({"pattern": "*"}), None, Inline::Budgeted),
                ("grep", json!({"pattern": "x"}), None, Inline::Budgeted),
                ("edit", json!({"file_path": "a"}), cap, Inline::Bounded),
                ("edit", json!({"file_path": "a"}), None, Inline::No),
                (
                    "write",
                    json!({"file_path": "a", "content": "hi"}),
                    None,
                    Inline::Bounded,
                ),
                (
                    "write",
                    json!({"file_path": "a", "content": big}),
                    cap,
                    Inline::No,
                ),
                ("write", json!({"file_path": "a"}), cap, Inline::No),
                ("bash", json!({"command": "true"}), cap, Inline::No),
            ];
            for (name, input, max, want) in table {
                assert_eq!(
                    inline_for(name, &input, max, media),
                    want,
                    "{name} {input} {max:?}"
                );
            }
        });
    }

    #[test]
    fn a_run_is_cut_by_the_budget_only_before_its_own_deadline() {
        let now = Instant::now();
        let past = now - Duration::from_millis(1);
        assert!(cut_by_budget(past, now + Duration::from_secs(1)));
        // The call's own deadline was the budget's end: the result stands.
        assert!(!cut_by_budget(past, past));
        assert!(!cut_by_budget(
            now + Duration::from_secs(1),
            now + Duration::from_secs(2)
        ));
        assert_eq!(budget_end(past), past);
        assert!(budget_end(now + Duration::from_secs(9)) <= Instant::now() + INLINE_BUDGET);
    }

    #[test]
    fn long_runs_in_place_only_inline() {
        // Outside any runtime: `block_in_place` would not be called.
        assert_eq!(long(|| 7), 7);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let out = rt.block_on(async {
            tokio::spawn(async {
                run_inline(|| {
                    let inside = long(|| INLINE.with(Cell::get));
                    (inside, INLINE.with(Cell::get))
                })
                .unwrap()
            })
            .await
            .unwrap()
        });
        assert_eq!(out, (false, true));
        assert!(!INLINE.with(Cell::get));
    }

    #[test]
    fn only_a_file_off_memory_hands_the_runtime_off() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let (in_memory, on_proc) = rt.block_on(async {
            tokio::spawn(async {
                run_inline(|| {
                    let shm = std::fs::File::open("/dev/shm").unwrap();
                    let proc = std::fs::File::open("/proc/self/stat").unwrap();
                    (
                        long_on_disk(&shm, || INLINE.with(Cell::get)),
                        long_on_disk(&proc, || INLINE.with(Cell::get)),
                    )
                })
                .unwrap()
            })
            .await
            .unwrap()
        });
        // tmpfs: run in place (still inline); procfs, not memory: handed off.
        assert!(in_memory);
        assert!(!on_proc);
    }

    #[test]
    fn a_panic_inline_is_caught_and_resets_the_flag() {
        let caught = run_inline(|| -> u8 { panic!("boom") });
        assert!(caught.is_err());
        assert!(!INLINE.with(Cell::get));
    }
}
