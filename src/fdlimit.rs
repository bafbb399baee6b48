//! The process's file-descriptor limit (`RLIMIT_NOFILE`).
//!
//! `envworker` raises its soft limit to the hard limit at start, so a
//! burst of connections or open files does not hit a default of 1,024 that
//! the hard limit would allow past. Children the agent controls (its bash)
//! get the limit the process was started with back: some tools close every
//! descriptor up to the soft limit before they exec, and a limit raised to
//! a million would make each of them crawl.

use std::sync::OnceLock;

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// The limit as the process found it, recorded by [`raise_to_hard`].
static ORIGINAL: OnceLock<Rlimit> = OnceLock::new();

/// The soft limit before and after a [`raise_to_hard`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raised {
    pub before: Option<u64>,
    pub after: Option<u64>,
}

/// Raise the soft `RLIMIT_NOFILE` to the hard limit, remembering the
/// original for `restore_in_child`. Call once, at start, before any child
/// is spawned. A hard limit of "unlimited" is left alone (the kernel caps
/// the soft limit at `fs.nr_open` and refuses infinity).
pub fn raise_to_hard() -> std::io::Result<Raised> {
    let original = getrlimit(Resource::Nofile);
    let _ = ORIGINAL.set(original);
    let before = original.current;
    let Some(hard) = original.maximum else {
        return Ok(Raised {
            before,
            after: before,
        });
    };
    if before == Some(hard) {
        return Ok(Raised {
            before,
            after: before,
        });
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(hard),
            maximum: Some(hard),
        },
    )?;
    Ok(Raised {
        before,
        after: Some(hard),
    })
}

/// The soft limit now (`None`: unlimited).
pub(crate) fn soft_limit() -> Option<u64> {
    getrlimit(Resource::Nofile).current
}

/// The limit the process started with, if [`raise_to_hard`] changed it.
pub(crate) fn original() -> Option<Rlimit> {
    let original = *ORIGINAL.get()?;
    (original.current != soft_limit()).then_some(original)
}

/// Put the original limit back; for `pre_exec` (async-signal-safe: one
/// syscall, no allocation). Lowering a soft limit never needs privileges.
pub(crate) fn restore_in_child(original: &Rlimit) -> std::io::Result<()> {
    setrlimit(Resource::Nofile, *original).map_err(std::io::Error::from)
}

/// Have `command`'s child run with the limit the process started with:
/// the worker raised its own for its connections, and the agent's shell
/// (and the supervisor it inherits it from) gets the original back, so
/// tools that close every descriptor up to the limit stay fast.
pub fn restore_on_exec(command: &mut tokio::process::Command) {
    if let Some(original) = original() {
        // SAFETY: one setrlimit syscall, async-signal-safe, no allocation.
        unsafe {
            command.pre_exec(move || restore_in_child(&original));
        }
    }
}
