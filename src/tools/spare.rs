//! A spare supervisor, started while the worker is idle so that a session's
//! first `bash` call does not wait for our binary to start.
//!
//! Every session's shell runs under its own supervisor (see
//! [`crate::cleanroom`]), our own binary re-executed: about a millisecond
//! and a half of `execve`, page faults and relocations before the shell
//! itself can start, on the path of the first result. A spare is that
//! process started ahead, with the scrubbed environment any session's shell
//! starts from, in `/`, waiting on its
//! stdin for a [`Launch`](crate::cleanroom::Launch): the shell's directory, its exact environment and
//! the supervisor's arguments (the sandbox's rules, the shell). A session
//! that takes it writes the launch and goes on as with a supervisor it
//! started itself: the same process, the same tree, the same confinement,
//! applied by the supervisor to itself after the launch and before the
//! shell runs. Nothing of the worker reaches it: no secret variable (the
//! keys), no descriptor but its two pipes (it closes the rest at once), the
//! fd limit the worker started with.
//!
//! One spare at most per process, made only where the command line asked
//! for it ([`enable`]: the binary's own subcommands, one runtime per
//! process): when the worker starts serving and again after each work item,
//! never on a session's path. A spare nobody takes costs one sleeping
//! process; it exits by itself when the worker goes (its stdin closes).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, OnceLock};

use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::cleanroom::{AWAIT_LAUNCH, SUPERVISE};

/// The supervisor binary spares are made of and the environment they wait
/// with, once [`enable`]d.
static BINARY: OnceLock<(PathBuf, Vec<(String, String)>)> = OnceLock::new();
/// The spare, when one is waiting.
static SPARE: Mutex<Option<Spare>> = Mutex::new(None);

/// A supervisor waiting for its launch.
pub(crate) struct Spare {
    pub(crate) child: Child,
    pub(crate) stdin: ChildStdin,
    pub(crate) stdout: ChildStdout,
}

/// Keep a spare supervisor of `binary` ready from now on, waiting with
/// `env` (scrubbed of every secret: what a supervisor started for a session
/// holds; the shell gets exactly its launch's). Call it once, from inside
/// the process's only runtime.
pub fn enable(binary: &Path, env: Vec<(String, String)>) {
    let _ = BINARY.set((binary.to_path_buf(), env));
}

/// Start a spare if spares are enabled and none is waiting: call it
/// wherever the worker goes idle. The start runs on the blocking pool (a
/// spawn holds its thread until the child's `execve`), so it delays no
/// request, `/readyz` or poll. A spare that cannot start is no error: the
/// next shell starts its own supervisor, as without spares.
pub fn replenish() {
    if BINARY.get().is_none() {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(replenish_now)),
        Err(_) => replenish_now(),
    }
}

fn replenish_now() {
    let Some((binary, env)) = BINARY.get() else {
        return;
    };
    let mut slot = SPARE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(spare) = slot.as_mut()
        && matches!(spare.child.try_wait(), Ok(None))
    {
        return;
    }
    *slot = match start(binary, env) {
        Ok(spare) => Some(spare),
        Err(e) => {
            tracing::debug!(error = %e, "cannot start a spare shell supervisor; each shell starts its own");
            None
        }
    };
}

/// The waiting spare of `binary`, if there is one and it is still alive.
pub(crate) fn take(binary: &Path) -> Option<Spare> {
    if BINARY.get().map(|(b, _)| b.as_path()) != Some(binary) {
        return None;
    }
    let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner()).take()?;
    matches!(spare.child.try_wait(), Ok(None)).then_some(spare)
}

fn start(binary: &Path, env: &[(String, String)]) -> std::io::Result<Spare> {
    let mut command = Command::new(binary);
    command
        .arg0("envworker-supervisor")
        .args([SUPERVISE, AWAIT_LAUNCH])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    crate::fdlimit::restore_on_exec(&mut command);
    let mut child = crate::cleanroom::spawn_tracked(&mut command)?;
    match (child.stdin.take(), child.stdout.take()) {
        (Some(stdin), Some(stdout)) => Ok(Spare {
            child,
            stdin,
            stdout,
        }),
        _ => Err(std::io::Error::other("no pipes to the spare supervisor")),
    }
}
