//! Named points where a crash test can SIGKILL the process (debug builds only).
//!
//! The failure model is that the worker may die at any instruction. The
//! crash test (`tests/crash.rs`) proves the durable memory commit against
//! that by running the real binary with `ENVWORKER_KILL_AT=<point>[:<n>]`:
//! the `n`-th time (default 1) execution reaches `hit(<point>)`, the process
//! sends itself SIGKILL — no destructor, no flush, no log line after it,
//! exactly like the OOM killer or a Lambda timeout.
//!
//! In release builds [`hit`] is an empty inline function and the variable
//! is never read, so a production binary carries no kill switch.

#[cfg(debug_assertions)]
mod armed {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The point armed by `ENVWORKER_KILL_AT`, and at which hit.
    struct Armed {
        point: String,
        nth: u64,
        hits: AtomicU64,
    }

    fn armed() -> Option<&'static Armed> {
        static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
        ARMED
            .get_or_init(|| {
                let spec = std::env::var("ENVWORKER_KILL_AT").ok()?;
                let (point, nth) = match spec.rsplit_once(':') {
                    Some((p, n)) => (p.to_string(), n.parse().ok()?),
                    None => (spec, 1),
                };
                Some(Armed {
                    point,
                    nth,
                    hits: AtomicU64::new(0),
                })
            })
            .as_ref()
    }

    pub fn hit(point: &str) {
        let Some(armed) = armed() else { return };
        if armed.point != point {
            return;
        }
        if armed.hits.fetch_add(1, Ordering::SeqCst) + 1 == armed.nth {
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::KILL,
            );
            // SIGKILL cannot be caught; never go on past the point.
            loop {
                std::thread::park();
            }
        }
    }
}

/// A point the crash test may kill the process at; see the module docs.
#[cfg(debug_assertions)]
pub fn hit(point: &str) {
    armed::hit(point)
}

/// A point the crash test may kill the process at (a no-op in release builds).
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn hit(_point: &str) {}
