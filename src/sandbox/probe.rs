//! What this kernel and this process can enforce, probed once.
//!
//! The Landlock ABI is one syscall, read at start. Namespaces take a
//! process (a user namespace needs one thread, which the worker is not):
//! the probe the replica registers ([`crate::cleanroom::probe_namespaces`]:
//! a forked child tries the namespace a session's supervisor would enter,
//! no `execve`) runs once, in the background; whoever needs the answer
//! waits for it.
//!
//! Even the fork is not on the start path: a replica
//! [`register_namespace_probe`]s it at start and [`start_namespace_probe`]s
//! it once its start-up is done; the first to need the answer before that
//! starts it at once.

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

static NAMESPACES: OnceLock<bool> = OnceLock::new();
/// The probe a replica registered (it has a supervisor to enter the
/// namespace with): `true` when the namespace can be made.
static REGISTERED: OnceLock<fn() -> bool> = OnceLock::new();
static STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Say how sessions' private namespace is probed (`probe`, `true` when it
/// can be made), without probing yet: the probe starts at
/// [`start_namespace_probe`] or when its answer is first needed.
pub fn register_namespace_probe(probe: fn() -> bool) {
    let _ = REGISTERED.set(probe);
}

/// Start the registered probe in the background (once per process; nothing
/// when none is registered).
pub fn start_namespace_probe() {
    let Some(&probe) = REGISTERED.get() else {
        return;
    };
    if STARTED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("sandbox-probe".into())
        .spawn(move || {
            let _ = NAMESPACES.set(!forced_unavailable("namespaces") && probe());
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
