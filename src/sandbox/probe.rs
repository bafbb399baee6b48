//! What this kernel and this process can enforce, probed once.
//!
//! The Landlock ABI is one syscall, read at start. Namespaces take a
//! process (a user namespace needs one thread, which the worker is not):
//! the probe runs the supervisor in namespace-only mode once, in the
//! background; whoever needs the answer waits for it (a few milliseconds).
//!
//! The probe is an `execve` of this binary: started beside the start-up it
//! takes a core from it (on two cores, spawn → `/readyz` 200 went from 3.0
//! to 4.8 ms). So a replica [`register_namespace_probe`]s it at start and
//! [`start_namespace_probe`]s it once its start-up is done; the first to
//! need the answer before that starts it at once.

use std::path::Path;
use std::sync::OnceLock;

/// What the probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// The kernel's Landlock ABI, 0 without Landlock (capped at what the
    /// `landlock` crate knows).
    pub landlock_abi: i32,
    /// A user and mount namespace with a private `/tmp` can be made.
    pub namespaces: bool,
}

impl Capabilities {
    /// Signals and abstract unix sockets can be scoped (ABI 6).
    pub fn scopes(&self) -> bool {
        self.landlock_abi >= 6
    }

    /// TCP ports can be filtered (ABI 4).
    pub fn tcp(&self) -> bool {
        self.landlock_abi >= 4
    }
}

/// The Landlock ABI version of the running kernel; 0 when it has none, or
/// when `ENVWORKER_SANDBOX_FORCE_UNAVAILABLE` names `landlock` (the tests'
/// way to play an old kernel).
pub fn landlock_abi() -> i32 {
    if forced_unavailable("landlock") {
        return 0;
    }
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the version query takes no attribute and returns an int.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v < 0 {
        0
    } else {
        (v as i32).min(landlock::ABI::V10 as i32)
    }
}

/// `ENVWORKER_SANDBOX_FORCE_UNAVAILABLE=landlock,namespaces`: pretend a
/// feature is missing. A test knob, read by the probe only; it can only take
/// protection away from what `auto` gives, and `require` then refuses.
fn forced_unavailable(feature: &str) -> bool {
    std::env::var("ENVWORKER_SANDBOX_FORCE_UNAVAILABLE")
        .is_ok_and(|v| v.split(',').any(|f| f.trim() == feature))
}

/// Whether the supervisor (`supervisor subcommand`) can make a private
/// mount namespace here: run it in namespace-only mode.
pub fn namespaces(supervisor: &Path, subcommand: &str) -> bool {
    if forced_unavailable("namespaces") {
        return false;
    }
    std::process::Command::new(supervisor)
        .arg(subcommand)
        .arg(super::NAMESPACE_PROBE)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

static NAMESPACES: OnceLock<bool> = OnceLock::new();
/// The probe's command, once a replica has registered it.
static REGISTERED: OnceLock<(std::path::PathBuf, &'static str)> = OnceLock::new();
static STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Say how the namespace probe runs (the supervisor as `supervisor
/// subcommand`), without running it yet: it starts at
/// [`start_namespace_probe`] or when its answer is first needed.
pub fn register_namespace_probe(supervisor: &Path, subcommand: &'static str) {
    let _ = REGISTERED.set((supervisor.to_path_buf(), subcommand));
}

/// Start the registered probe in the background (once per process; nothing
/// when none is registered).
pub fn start_namespace_probe() {
    let Some((supervisor, subcommand)) = REGISTERED.get() else {
        return;
    };
    if STARTED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    let (supervisor, subcommand) = (supervisor.clone(), *subcommand);
    let spawned = std::thread::Builder::new()
        .name("sandbox-probe".into())
        .spawn(move || {
            let _ = NAMESPACES.set(namespaces(&supervisor, subcommand));
        });
    if spawned.is_err() {
        let _ = NAMESPACES.set(false);
    }
}

/// Whether sessions get a private mount namespace: starts the registered
/// probe if it has not started and waits for it (a few milliseconds,
/// once); `false` when none is registered.
pub fn namespaces_available() -> bool {
    if REGISTERED.get().is_none() {
        return false;
    }
    start_namespace_probe();
    *NAMESPACES.wait()
}

/// The probe's answer once someone has started it, without starting it:
/// for what only reports the answer (the start-up line), which must not
/// pull the probe onto the start path. `false` when none is registered.
pub fn namespaces_once_probed() -> bool {
    if REGISTERED.get().is_none() {
        return false;
    }
    *NAMESPACES.wait()
}

/// The probe's answer if it has one, without waiting.
pub fn namespaces_if_known() -> Option<bool> {
    NAMESPACES.get().copied()
}
