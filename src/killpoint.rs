//! Named points where a crash test can SIGKILL the process (debug builds only).
//!
//! The failure model is that the worker may die at any instruction. The
//! crash test (`tests/it/crash.rs`) proves the durable memory commit against
//! that by running the real binary with `ENVWORKER_KILL_AT=<point>[:<n>]`:
//! the `n`-th time (default 1) execution reaches `hit(<point>)`, the process
//! sends itself SIGKILL — no destructor, no flush, no log line after it,
//! exactly like the OOM killer or a Lambda timeout.
//!
//! `ENVWORKER_KILL_TRACE=<file>` appends each point's name to that file, one
//! line per hit, before the kill check. A clean run's trace tells the crash
//! test how often each point is reached (so it can aim at every `n` that
//! exists), and a killed run's last line proves where it died — a renamed or
//! removed point shows up as "never reached" instead of a vacuous pass.
//!
//! In release builds [`hit`] is an empty inline function and neither
//! variable is read, so a production binary carries no kill switch.

#[cfg(debug_assertions)]
mod armed {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Mutex, OnceLock};

    /// The point armed by `ENVWORKER_KILL_AT`, and at which hit.
    struct Armed {
        point: String,
        nth: u64,
        hits: AtomicU64,
    }

    /// What the environment asked for, read once.
    struct Config {
        armed: Option<Armed>,
        trace: Option<Mutex<std::fs::File>>,
    }

    fn config() -> &'static Config {
        static CONFIG: OnceLock<Config> = OnceLock::new();
        CONFIG.get_or_init(|| Config {
            armed: std::env::var("ENVWORKER_KILL_AT").ok().and_then(|spec| {
                let (point, nth) = match spec.rsplit_once(':') {
                    Some((p, n)) => (p.to_string(), n.parse().ok()?),
                    None => (spec, 1),
                };
                Some(Armed {
                    point,
                    nth,
                    hits: AtomicU64::new(0),
                })
            }),
            trace: std::env::var_os("ENVWORKER_KILL_TRACE").and_then(|path| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .ok()
                    .map(Mutex::new)
            }),
        })
    }

    pub fn hit(point: &str) {
        let config = config();
        if let Some(trace) = &config.trace {
            let mut file = trace.lock().unwrap_or_else(|p| p.into_inner());
            let _ = file.write_all(format!("{point}\n").as_bytes());
        }
        let Some(armed) = &config.armed else { return };
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
