//! The subcommands, one module each; `main.rs` only parses and dispatches.
//! Errors here are `anyhow` (this is the edge): each names what to fix.

pub mod completions;
#[cfg(feature = "devserver")]
pub mod dev;
pub mod man;
pub mod poll;
pub mod run;
pub mod runtime;
pub mod serve;
pub mod sign;

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::api::types::Redacted;
use crate::cli::WorkerArgs;
use crate::worker::{WorkerOptions, default_worker_id};

/// Each session's shell supervisor: this very binary, even if its file was
/// replaced since it started.
const SUPERVISOR: &str = "/proc/self/exe";

/// Keep a spare shell supervisor ready (see `crate::tools::spare`): for a
/// command whose worker runs the shells itself and waits for work, once it
/// serves. It waits with the environment any session's shell would get
/// (`secret_env_vars` and the worker's own variables scrubbed), as a
/// supervisor started for a session does.
fn keep_a_spare_supervisor(secret_env_vars: &[String]) {
    let env = crate::tools::scrubbed_env(secret_env_vars);
    crate::tools::spare::enable(Path::new(SUPERVISOR), env);
    crate::tools::spare::replenish();
}

/// Once the start-up is done: the processes a replica starts ahead of its
/// first session, a spare shell supervisor and the shell sandbox's
/// namespace probe (an `execve` of this binary each, which would take the
/// start-up's cores).
fn start_background_processes(secret_env_vars: &[String]) {
    keep_a_spare_supervisor(secret_env_vars);
    crate::sandbox::probe::start_namespace_probe();
}

/// Worker options from the shared flags.
pub fn worker_options(
    args: &WorkerArgs,
    environment_id: &str,
    environment_key: Option<&str>,
) -> anyhow::Result<WorkerOptions> {
    let workdir = match &args.workdir {
        Some(dir) => absolute(dir)?,
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let mut options = WorkerOptions::new(environment_id, args.base_url.trim_end_matches('/'));
    options.environment_key = environment_key.filter(|k| !k.is_empty()).map(Redacted::new);
    options.workdir = workdir;
    options.fresh_workdir = args.fresh_workdir;
    options.memory_push = args.memory_push;
    options.shell_sandbox_mode = args.shell_sandbox;
    options.shell_additions = crate::sandbox::Additions {
        read: args.shell_allow_read.clone(),
        write: args.shell_allow_write.clone(),
        tcp_ports: args.shell_allow_tcp.clone(),
    };
    options.supervisor = Some(PathBuf::from(SUPERVISOR));
    options.max_idle = args.max_idle.0;
    options.memory_sync_interval = args.memory_sync_interval;
    options.memory_sync_deletions = args.memory_sync_deletions;
    options.tool_timeout = args.tool_timeout;
    options.call_grace = args.call_grace;
    options.memory_teardown_bound = args.memory_teardown_bound;
    options.worker_id = args.worker_id.clone().unwrap_or_else(default_worker_id);
    options.extra_headers = crate::cli::worker_headers(
        std::env::var("ANTHROPIC_CUSTOM_HEADERS").ok().as_deref(),
        &args.headers,
    );
    options.mount_remap = args.mount_remap.clone().or_else(lambda_default_remap);
    options.state_dir = Some(match &args.state_dir {
        Some(dir) => absolute(dir)?,
        None => default_state_dir(),
    });
    Ok(options)
}

/// Where the journals live by default: `$XDG_STATE_HOME/envworker`, else
/// `~/.local/state/envworker` — beside the worker's other state, under no
/// path a sandboxed shell is granted (not `/tmp`, which the shells share
/// where they have no private one). On Lambda, and where neither can be
/// made, `<tmp>/envworker-<uid>` (a warm Lambda's `/tmp` is kept; one per
/// user, so no user reads another's).
fn default_state_dir() -> PathBuf {
    let in_tmp =
        || std::env::temp_dir().join(format!("envworker-{}", rustix::process::geteuid().as_raw()));
    if crate::serve::lambda::in_lambda() {
        return in_tmp();
    }
    let absolute_var = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute() && p != Path::new("/"))
    };
    let candidate = absolute_var("XDG_STATE_HOME")
        .map(|d| d.join("envworker"))
        .or_else(|| absolute_var("HOME").map(|h| h.join(".local/state/envworker")));
    match candidate {
        Some(dir) if std::fs::create_dir_all(&dir).is_ok() => dir,
        _ => in_tmp(),
    }
}

/// Decide `endpoint`'s shell sandbox from its mode (or the default for its
/// concurrency) and the kernel, before it serves: `Err` when `require`
/// cannot be met or a grant would expose the worker's own files. Says once
/// what is enforced (a log line, the metric, `/readyz`'s body).
pub fn decide_sandbox(
    endpoint: &str,
    options: &mut WorkerOptions,
    concurrency: usize,
    endpoint_file: Option<&Path>,
    metrics: Option<&std::sync::Arc<crate::metrics::Metrics>>,
) -> anyhow::Result<()> {
    use crate::sandbox::{self, Described, Mode, probe};
    let mode = options
        .shell_sandbox_mode
        .unwrap_or_else(|| Mode::default_for(concurrency));
    let abi = probe::landlock_abi();
    let caps = sandbox::Capabilities {
        landlock_abi: abi,
        namespaces: false,
    };
    let decided = sandbox::decide(
        mode,
        concurrency,
        caps,
        options.supervisor.is_some(),
        &options.shell_additions,
    )
    .with_context(|| format!("endpoint {endpoint:?}"))?;
    let Some(abi) = decided else {
        options.shell_sandbox = None;
        announce_unconfined(endpoint, mode, abi);
        if let Some(m) = metrics {
            m.set_shell_sandbox(endpoint, Described::off(caps));
        }
        return Ok(());
    };
    let fresh = options.fresh_workdir || concurrency > 1;
    let enforcement = sandbox::Enforcement {
        landlock_abi: abi,
        additions: options.shell_additions.clone(),
        protected: protected_paths(options, endpoint_file, fresh)?,
        own_mount_root: own_mount_root(options),
    };
    // Whether /tmp is private decides what a grant below it exposes. The
    // namespace probe (a forked child) runs in the background once the
    // start-up is done ([`start_background_processes`]); the start waits for
    // it only when the grants pass with one answer and not the other.
    if options.supervisor.is_some() {
        probe::register_namespace_probe(crate::cleanroom::probe_namespaces);
    }
    check_every_sessions_grants(&enforcement, options, fresh)
        .with_context(|| format!("endpoint {endpoint:?}"))?;
    // The line and the metric say what is enforced, the probe's answer
    // included: written once it is in, off the start path.
    let announced = enforcement.clone();
    let metrics = metrics.cloned();
    let endpoint_name = endpoint.to_string();
    let announce = move || {
        let described = announced.describe();
        announce_sandbox(&endpoint_name, mode, &described);
        if let Some(m) = metrics {
            m.set_shell_sandbox(&endpoint_name, described);
        }
    };
    if probe::namespaces_if_known().is_some() || options.supervisor.is_none() {
        announce();
    } else if let Err(e) = std::thread::Builder::new()
        .name("sandbox-announce".into())
        .spawn(announce)
    {
        tracing::warn!(error = %e, "cannot start the sandbox's announcement thread");
    }
    options.shell_sandbox = Some(enforcement);
    Ok(())
}

/// The line of a replica whose shells run unconfined: `auto` without
/// Landlock, and Lambda's cold start.
fn announce_unconfined(endpoint: &str, mode: crate::sandbox::Mode, abi: i32) {
    if mode == crate::sandbox::Mode::Auto {
        tracing::warn!(
            endpoint,
            shell_sandbox = mode.as_str(),
            landlock_abi = abi,
            "the agent's shell is NOT confined: this kernel has no Landlock (or the shell has no supervisor); it runs as the worker's user, as the official worker's"
        );
    }
    if crate::serve::lambda::in_lambda() {
        tracing::info!(
            endpoint,
            shell_sandbox = mode.as_str(),
            landlock_abi = abi,
            "on AWS Lambda the agent's shell is not sandboxed (its kernel offers no Landlock to an unprivileged function): each execution environment serves one session at a time, and the session's whole process tree is killed before the invocation ends"
        );
    }
}

/// The line saying what a sandboxed replica enforces.
fn announce_sandbox(endpoint: &str, mode: crate::sandbox::Mode, d: &crate::sandbox::Described) {
    tracing::info!(
        endpoint,
        shell_sandbox = mode.as_str(),
        landlock_abi = d.landlock_abi,
        file_system = d.file_system,
        scopes = d.scopes,
        tcp_filter = d.tcp_filter,
        namespaces = d.namespaces,
        tmp = d.tmp,
        "{}",
        if d.tmp == "private" {
            "the agent's shell is sandboxed: Landlock, and a private /tmp, /dev/shm and /mnt/memory per session"
        } else {
            "the agent's shell is sandboxed: Landlock; /tmp and /dev/shm are shared between the sessions of this replica (no mount namespace here)"
        }
    );
}

/// The worker's own paths, which no shell may be granted: the state
/// directory, the endpoint file, the worker's `HOME`, the directory holding
/// the sessions' directories (`fresh`), `/run`.
fn protected_paths(
    options: &WorkerOptions,
    endpoint_file: Option<&Path>,
    fresh: bool,
) -> anyhow::Result<crate::sandbox::Protected> {
    let mut protected = crate::sandbox::Protected::default();
    if let Some(dir) = &options.state_dir {
        protected.add("state directory", dir.clone());
    }
    if let Some(file) = endpoint_file {
        protected.add("endpoint file", absolute(file)?);
    }
    if let Some(home) = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute() && h != Path::new("/"))
    {
        protected.add("HOME", home);
    }
    if fresh {
        protected.add(
            "directory holding the sessions' directories",
            options.workdir.clone(),
        );
    }
    protected.add("runtime directory", "/run");
    Ok(protected)
}

/// Where each session's own `/mnt/memory` is bound (created when missing),
/// unless the stores already live elsewhere (`--mount-remap`).
fn own_mount_root(options: &WorkerOptions) -> Option<PathBuf> {
    if options.mount_remap.is_some() {
        return None;
    }
    let root = PathBuf::from(crate::sandbox::MOUNT_ROOT);
    (std::fs::create_dir_all(&root).is_ok() && root.is_dir()).then_some(root)
}

/// Check now, against the worker's own paths, the grants every session
/// gets (its stores are checked per session).
fn check_every_sessions_grants(
    enforcement: &crate::sandbox::Enforcement,
    options: &WorkerOptions,
    fresh: bool,
) -> Result<(), crate::sandbox::SandboxError> {
    let work = if fresh {
        options.workdir.join("session-x")
    } else {
        options.workdir.clone()
    };
    let rooms = options.state_dir.clone().unwrap_or_default().join("rooms");
    let room = crate::sandbox::SessionRoom {
        path: rooms.join("x"),
        home: rooms.join("x/home"),
        tmpdir: None,
        mount_root: None,
    };
    // Passing with either answer of the namespace probe needs no answer.
    let passes = |namespaces: bool| {
        let caps = crate::sandbox::Capabilities {
            landlock_abi: enforcement.landlock_abi,
            namespaces,
        };
        enforcement
            .grants_with(caps, &work, &room)
            .policy(&enforcement.protected)
            .is_ok()
    };
    if crate::sandbox::probe::namespaces_if_known().is_none() && passes(false) && passes(true) {
        return Ok(());
    }
    enforcement
        .grants(&work, &room)
        .policy(&enforcement.protected)?;
    Ok(())
}

/// At start: let go of the memory store folders a dead worker left that
/// hold nothing unsynced (the others wait for their session's next claim,
/// which recovers them). Once per process.
pub fn recover_left_folders(options: &WorkerOptions) {
    static DONE: std::sync::Once = std::sync::Once::new();
    if let Some(dir) = &options.state_dir {
        DONE.call_once(|| {
            crate::memory::recovery::let_go_of_clean_folders(dir);
        });
    }
}

/// At start, when items get fresh directories (`fresh`): remove the
/// session directories a dead worker left in the work root (and unfinished
/// `trash-*` ones); a live worker's stay (see
/// [`crate::cleanroom::sweep_left_rooms`]). Never in a shared workdir: its
/// `session-*` entries are the operator's. Once per process.
pub fn sweep_left_rooms(options: &WorkerOptions, fresh: bool) {
    if !fresh {
        return;
    }
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        let root = options.workdir.clone();
        // In the background: a left tree may be huge, and nothing waits on it.
        let _ = std::thread::Builder::new()
            .name("sweep-rooms".into())
            .spawn(move || {
                let n = crate::cleanroom::sweep_left_rooms(&root);
                if n > 0 {
                    tracing::info!(directories = n, workdir.path = %root.display(), "removed session directories left by a dead worker");
                }
            });
    });
}

/// Say once at start where the agent of `endpoint` works: in the shared
/// workdir, one session after another (the reference's contract: what one
/// session leaves there the next one sees), or in a fresh directory per item
/// (the flag, or several sessions at once). Deployments that relied on the
/// fresh directory, once the default, find the flag named here.
pub fn announce_workdir(endpoint: &str, options: &WorkerOptions, concurrency: usize) {
    let workdir = options.workdir.display();
    if concurrency > 1 {
        tracing::info!(endpoint, workdir.path = %workdir, max_concurrent_items = concurrency,
            "each session works in its own fresh directory under the workdir, as several run at once");
    } else if options.fresh_workdir {
        tracing::info!(endpoint, workdir.path = %workdir,
            "each session works in its own fresh directory under the workdir (--fresh-workdir)");
    } else {
        tracing::info!(endpoint, workdir.path = %workdir,
            "sessions run one after another in the shared workdir, as the official worker runs them: what one session leaves there the next one sees; --fresh-workdir (ENVWORKER_FRESH_WORKDIR, the endpoint file's fresh_workdir) gives each its own empty directory");
    }
}

/// On Lambda only `/tmp` is writable: stores advertised under `/mnt/memory`
/// live under `/tmp/mnt/memory`, unless `/mnt/memory` is writable after all.
fn lambda_default_remap() -> Option<crate::remap::MountRemap> {
    if !crate::serve::lambda::in_lambda() {
        return None;
    }
    let writable = rustix::fs::access("/mnt/memory", rustix::fs::Access::WRITE_OK).is_ok();
    (!writable).then(|| crate::remap::MountRemap {
        advertised: "/mnt/memory".into(),
        actual: "/tmp/mnt/memory".into(),
    })
}

/// `dir` made absolute against the current directory (it need not exist yet).
pub fn absolute(dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    if dir.is_absolute() {
        return Ok(dir.to_path_buf());
    }
    Ok(std::env::current_dir()
        .context("cannot read the current directory")?
        .join(dir))
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => {
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}

/// Make this process a child subreaper before it spawns anything (see
/// [`crate::cleanroom::sweep_orphans`]); refused, the supervisors still
/// catch what the agent detaches without killing them.
pub(crate) fn become_subreaper() {
    if !crate::cleanroom::become_subreaper() {
        tracing::warn!(
            "cannot become a child subreaper: a process whose supervisor is killed escapes its session's teardown"
        );
    }
}
