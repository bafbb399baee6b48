//! A clean room per session: a fresh private working directory, and every
//! process the agent started killed and reaped when the session ends.
//!
//! - `create_session_dir` / `discard_session_dir` — each work item gets
//!   `<workdir>/session-<random>` (mode `0700`, `flock`ed by the worker), the
//!   shell's cwd and the file tools' base; at teardown it is renamed to
//!   `trash-<random>` at once and removed in the background after the
//!   release, by fd (`crate::fsx::remove_tree_at`: symlinks unlinked,
//!   never followed; `chmod 000` directories opened back up through their
//!   own fd; FIFOs unlinked, never opened). [`sweep_left_rooms`] removes
//!   what a dead worker left.
//! - [`supervise`] — the hidden `__supervise` subcommand: a tiny process,
//!   started with the agent's (scrubbed) environment only, that makes itself
//!   a child subreaper (`PR_SET_CHILD_SUBREAPER`) and runs the session's
//!   shell. Whatever the agent detaches (`setsid`, `nohup … &`, a double fork,
//!   a new process group) is re-parented to it, not to init, so the session's
//!   processes stay one tree under one pid — and sessions running side by side
//!   on one worker each have their own tree. When the shell exits, the
//!   supervisor kills its tree and exits with the shell's status. A spare
//!   one (`__supervise --await-launch`, see `crate::tools::spare`) is
//!   started ahead, with the scrubbed environment only, and reads what to run — the
//!   shell's directory, environment and arguments, a [`Launch`] — from its
//!   stdin first.
//! - [`kill_tree`] — freeze (`SIGSTOP`) every descendant of a pid until a scan
//!   finds no new one (a fork bomb cannot outrun a frozen parent), then
//!   `SIGKILL` them until none is left, in bounded time.
//! - [`run_as_init`] — as PID 1 in a container nothing else reaps orphans:
//!   the binary then runs the real worker as its child (same arguments and
//!   environment) and acts as init, like `tini`: it forwards the usual
//!   termination signals to the worker and reaps every child that exits. The
//!   worker stays a normal process, so tokio keeps the exit statuses of its
//!   own children (a `waitpid(-1)` inside the worker would steal them).
//!
//! - [`become_subreaper`] / [`sweep_orphans`] — the worker itself is a
//!   child subreaper, so a process whose supervisor the agent killed
//!   (`kill -9 $PPID`) re-parents to the worker, not init; each session's
//!   teardown kills and reaps every child of the worker it did not start
//!   itself (`spawn_tracked` records those). Such an orphan may come from
//!   a session still running beside it: that session broke its own room.
//!
//! Limits: a process started by another user (setuid), or one the agent
//! hands to a daemon outside (`at`, `systemd-run`, a container runtime
//! socket), is not found.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::process::{Pid, Signal, WaitOptions};

/// The hidden subcommand that runs [`supervise`].
pub const SUPERVISE: &str = "__supervise";

/// [`supervise`]'s first argument for a spare: wait for a [`Launch`] on stdin.
pub const AWAIT_LAUNCH: &str = "--await-launch";

/// The most a [`Launch`] may take on the wire: a bound for the spare's
/// read, far above any real environment.
const MAX_LAUNCH_BYTES: usize = 1 << 20;

/// What a spare supervisor runs: the working directory, the exact
/// environment, and the arguments it would otherwise have had
/// (`[--sandbox …] PROGRAM ARGS…`). On its stdin as `<length>\n` and then
/// that many bytes: NUL-terminated fields (directory, the number of
/// variables, each `KEY=VALUE`, then the arguments), so any byte but NUL
/// passes, as in `execve`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub cwd: PathBuf,
    pub env: Vec<(OsString, OsString)>,
    pub args: Vec<OsString>,
}

impl Launch {
    /// The request as the spare reads it.
    pub fn encode(&self) -> Vec<u8> {
        use std::os::unix::ffi::OsStrExt;
        let mut body = Vec::new();
        let mut field = |bytes: &[u8]| {
            body.extend_from_slice(bytes);
            body.push(0);
        };
        field(self.cwd.as_os_str().as_bytes());
        field(self.env.len().to_string().as_bytes());
        for (k, v) in &self.env {
            field(&[k.as_bytes(), b"=", v.as_bytes()].concat());
        }
        for a in &self.args {
            field(a.as_bytes());
        }
        let mut out = format!("{}\n", body.len()).into_bytes();
        out.extend_from_slice(&body);
        out
    }

    /// The fields of a request's body, or why they do not make one.
    fn decode(body: &[u8]) -> Result<Launch, String> {
        use std::os::unix::ffi::OsStrExt;
        let Some(body) = body.strip_suffix(&[0]) else {
            return Err("the launch is not NUL-terminated".into());
        };
        let mut fields = body.split(|&b| b == 0);
        let os = |b: &[u8]| std::ffi::OsStr::from_bytes(b).to_os_string();
        let cwd = PathBuf::from(os(fields.next().unwrap_or_default()));
        let count: usize = fields
            .next()
            .and_then(|n| std::str::from_utf8(n).ok()?.parse().ok())
            .ok_or("the launch has no variable count")?;
        let mut env = Vec::with_capacity(count.min(4096));
        for _ in 0..count {
            let var = fields.next().ok_or("the launch lacks a variable")?;
            let eq = var
                .iter()
                .position(|&b| b == b'=')
                .ok_or("a launch variable has no `=`")?;
            env.push((os(&var[..eq]), os(&var[eq + 1..])));
        }
        let args: Vec<OsString> = fields.map(os).collect();
        if cwd.as_os_str().is_empty() || args.is_empty() {
            return Err("the launch has no directory or no program".into());
        }
        Ok(Launch { cwd, env, args })
    }

    /// Read one request from fd 0, a byte at a time up to the length and
    /// then exactly the body, so nothing the shell is to read is taken
    /// (std's buffered stdin would). `Ok(None)`: the worker closed the pipe
    /// (it let the spare go, or died) before a whole request came.
    fn read_from_stdin() -> Result<Option<Launch>, String> {
        // SAFETY: fd 0 is the pipe the worker gave us; it stays open for
        // as long as this borrow (the whole read).
        let stdin = unsafe { std::os::fd::BorrowedFd::borrow_raw(0) };
        let read_some = |buf: &mut [u8]| loop {
            match rustix::io::read(stdin, &mut *buf) {
                Err(Errno::INTR) => {}
                other => return other.map_err(|e| format!("cannot read the launch: {e}")),
            }
        };
        let mut len = 0usize;
        let mut digits = 0;
        loop {
            let mut byte = [0u8];
            if read_some(&mut byte)? == 0 {
                return Ok(None);
            }
            match byte[0] {
                b'\n' if digits > 0 => break,
                b @ b'0'..=b'9' if digits < 8 => {
                    len = len * 10 + usize::from(b - b'0');
                    digits += 1;
                }
                _ => return Err("the launch's length is malformed".into()),
            }
        }
        if len > MAX_LAUNCH_BYTES {
            return Err(format!(
                "the launch is larger than {MAX_LAUNCH_BYTES} bytes"
            ));
        }
        let mut body = vec![0u8; len];
        let mut got = 0;
        while got < len {
            match read_some(&mut body[got..])? {
                0 => return Ok(None),
                n => got += n,
            }
        }
        Launch::decode(&body).map(Some)
    }
}

/// How long [`kill_tree`] may take before it gives up (a process stuck in
/// uninterruptible sleep cannot be killed sooner).
pub(crate) const KILL_BOUND: Duration = Duration::from_secs(3);

/// An item's session directory, locked (`flock`) by this process for as
/// long as it lives: a worker starting beside it on the same root
/// ([`sweep_left_rooms`]) knows it is in use; once the worker dies the
/// kernel drops the lock and the next worker removes it.
#[derive(Debug)]
pub(crate) struct SessionDir {
    pub(crate) path: PathBuf,
    lock: std::os::fd::OwnedFd,
}

/// Create `<root>/session-<random>`, owner-only, creating `root` first, and
/// lock it.
pub(crate) fn create_session_dir(root: &Path) -> std::io::Result<SessionDir> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(root)?;
    let dir = tempfile::Builder::new()
        .prefix("session-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(root)?;
    let path = dir.keep();
    let lock = rustix::fs::open(&path, crate::fsx::DIR_FLAGS, rustix::fs::Mode::empty())?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive)?;
    Ok(SessionDir { path, lock })
}

/// Rename `<root>/<name>` to `<root>/trash-<random>` (one syscall, however
/// many files the agent made) when it is still the directory `expected`
/// refers to. Returns the new name.
fn to_trash(
    root: &std::os::fd::OwnedFd,
    name: &str,
    expected: &std::os::fd::OwnedFd,
) -> Result<String, Errno> {
    let want = rustix::fs::fstat(expected)?;
    let now = rustix::fs::statat(root, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?;
    if (now.st_dev, now.st_ino) != (want.st_dev, want.st_ino) {
        return Err(Errno::STALE);
    }
    let trash = format!("trash-{:016x}", rand::random::<u64>());
    rustix::fs::renameat(root, name, root, trash.as_str())?;
    Ok(trash)
}

/// Move a session directory out of the way at once (see [`to_trash`]) and
/// return what removes it: the caller runs that in the background, after
/// the item is released — an agent that made millions of files must not
/// hold the release past its deadline. What a dead worker did not finish
/// the next one's [`sweep_left_rooms`] does.
pub(crate) fn discard_session_dir(
    dir: SessionDir,
) -> Result<impl FnOnce() -> Result<(), Errno> + Send + 'static, Errno> {
    let (Some(parent), Some(name)) = (
        dir.path.parent(),
        dir.path.file_name().and_then(|n| n.to_str()),
    ) else {
        return Err(Errno::INVAL);
    };
    let root = rustix::fs::open(parent, crate::fsx::DIR_FLAGS, rustix::fs::Mode::empty())?;
    let trash = to_trash(&root, name, &dir.lock)?;
    drop(dir);
    Ok(move || crate::fsx::remove_tree_at(&root, &trash))
}

/// Once per process at startup: remove from the work root every
/// `trash-*` directory and every `session-*` one no live worker holds the
/// lock of (left by a worker that died). A session directory another
/// worker sharing the root is using stays. Returns how many were removed.
pub fn sweep_left_rooms(root: &Path) -> usize {
    let Ok(root_fd) = rustix::fs::open(root, crate::fsx::DIR_FLAGS, rustix::fs::Mode::empty())
    else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut removed = 0;
    for name in entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
    {
        let trash = if name.starts_with("trash-") {
            name
        } else if name.starts_with("session-") {
            let Ok(dir) = rustix::fs::openat(
                &root_fd,
                name.as_str(),
                crate::fsx::DIR_FLAGS,
                rustix::fs::Mode::empty(),
            ) else {
                continue;
            };
            // Held: a live worker's session.
            if rustix::fs::flock(&dir, rustix::fs::FlockOperation::NonBlockingLockExclusive)
                .is_err()
            {
                continue;
            }
            match to_trash(&root_fd, &name, &dir) {
                Ok(trash) => trash,
                Err(_) => continue,
            }
        } else {
            continue;
        };
        match crate::fsx::remove_tree_at(&root_fd, &trash) {
            Ok(()) => removed += 1,
            Err(e) => {
                tracing::warn!(workdir.path = %root.join(&trash).display(), error = %e, "cannot remove a left session directory")
            }
        }
    }
    removed
}

/// Every process in `/proc`, with its state letter (`Z`: zombie) and its
/// parent's pid (no `/proc/<pid>/task/*/children`: that needs a kernel
/// option). A session's end scans a few times (the freeze, the kill, the
/// sweep), so each entry costs three system calls: `openat` beneath one
/// `/proc` descriptor, one `read` into a buffer on the stack, `close`.
pub fn processes() -> Vec<(i32, u8, i32)> {
    use rustix::fs::{Mode, OFlags};
    let Ok(proc_dir) = rustix::fs::openat(
        rustix::fs::CWD,
        "/proc",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return Vec::new();
    };
    let Ok(entries) = rustix::fs::Dir::read_from(&proc_dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    // `pid (comm) state ppid …`: comm is at most 64 bytes, the fields
    // before `ppid` a few dozen.
    let mut buf = [0u8; 512];
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .ok()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(fd) = rustix::fs::openat(
            &proc_dir,
            format!("{pid}/stat"),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            continue; // gone meanwhile
        };
        let Ok(len) = rustix::io::read(&fd, &mut buf) else {
            continue;
        };
        if let Some(fields) = stat_fields(&buf[..len]) {
            found.push((pid, fields.0, fields.1));
        }
    }
    found
}

/// The state letter and the parent's pid of a `/proc/<pid>/stat` line
/// (its start, at least up to `ppid`); comm may hold spaces and
/// parentheses, so the fields are read after its last `)`.
fn stat_fields(text: &[u8]) -> Option<(u8, i32)> {
    let close = text.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&text[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.bytes().next()?;
    Some((state, fields.next()?.parse().ok()?))
}

/// Every live (not zombie) descendant of `root`.
pub fn descendants(root: Pid) -> Vec<Pid> {
    let mut children: HashMap<i32, Vec<(i32, u8)>> = HashMap::new();
    for (pid, state, ppid) in processes() {
        children.entry(ppid).or_default().push((pid, state));
    }
    let mut found = Vec::new();
    let mut queue = vec![root.as_raw_nonzero().get()];
    while let Some(parent) = queue.pop() {
        for &(pid, state) in children.get(&parent).map(Vec::as_slice).unwrap_or(&[]) {
            queue.push(pid);
            if state != b'Z'
                && state != b'X'
                && let Some(pid) = Pid::from_raw(pid)
            {
                found.push(pid);
            }
        }
    }
    found
}

/// Kill every descendant of `root` (and `root` itself when `with_root`):
/// freeze them all first, then `SIGKILL` until a scan finds none alive,
/// reaping our own children as we go when `reap` (the supervisor). The
/// freeze and the kill each get `bound`, separately, and each runs at least
/// one full round however little time is left: a tree is never left frozen
/// without a `SIGKILL` (a stopped process would stay stopped forever).
/// Returns how many processes were signalled.
pub fn kill_tree(root: Pid, with_root: bool, reap: bool, bound: Duration) -> usize {
    if with_root {
        // A frozen root cannot exit, so its orphans keep landing on it.
        let _ = rustix::process::kill_process(root, Signal::STOP);
    }
    let mut frozen: HashSet<Pid> = HashSet::new();
    // Freeze until a whole scan finds nothing new: a process forking as
    // fast as it can is stopped before its children are, and they are
    // found by the next scan.
    let freeze_until = Instant::now() + bound;
    loop {
        let fresh: Vec<Pid> = descendants(root)
            .into_iter()
            .filter(|p| !frozen.contains(p))
            .collect();
        if fresh.is_empty() {
            break;
        }
        for pid in fresh {
            let _ = rustix::process::kill_process(pid, Signal::STOP);
            frozen.insert(pid);
        }
        if Instant::now() >= freeze_until {
            break;
        }
    }
    // Everything frozen gets its SIGKILL, whatever the scans find next.
    for &pid in &frozen {
        let _ = rustix::process::kill_process(pid, Signal::KILL);
    }
    let mut signalled: HashSet<Pid> = frozen;
    let kill_until = Instant::now() + bound;
    loop {
        if reap {
            while let Ok(Some(_)) = rustix::process::wait(WaitOptions::NOHANG) {}
        }
        let alive = descendants(root);
        if alive.is_empty() {
            break;
        }
        for pid in alive {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
            signalled.insert(pid);
        }
        if Instant::now() >= kill_until {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    if with_root {
        let _ = rustix::process::kill_process(root, Signal::KILL);
    }
    signalled.len()
}

/// The pids this process started itself (session supervisors, `--on-work`
/// commands): its children that [`sweep_orphans`] leaves alone. Anything
/// else that is a child of the worker is an orphan it adopted as a child
/// subreaper ([`become_subreaper`]).
static SPAWNED: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

fn spawned() -> std::sync::MutexGuard<'static, Vec<i32>> {
    SPAWNED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Make the worker a child subreaper, once at startup before any spawn: a
/// process whose supervisor was killed (`kill -9 $PPID` from the agent's
/// shell) re-parents to the worker instead of init, where
/// [`sweep_orphans`] finds it. `false` when refused (a seccomp profile).
pub fn become_subreaper() -> bool {
    let ok = rustix::process::set_child_subreaper(Some(rustix::process::getpid())).is_ok();
    SUBREAPER.store(ok, std::sync::atomic::Ordering::SeqCst);
    ok
}

/// Set by [`become_subreaper`]: only then are this process's unknown
/// children orphans it adopted. A program embedding the library has
/// children of its own, which [`sweep_orphans`] must not touch.
static SUBREAPER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Spawn `command` and record its pid as the worker's own, atomically with
/// respect to [`sweep_orphans`] (which would otherwise take a child spawned
/// between its scan and its kill for an orphan).
pub(crate) fn spawn_tracked(
    command: &mut tokio::process::Command,
) -> std::io::Result<tokio::process::Child> {
    let mut own = spawned();
    let child = command.spawn()?;
    if let Some(pid) = child.id() {
        own.push(pid as i32);
    }
    Ok(child)
}

/// The shell sandbox's namespace probe as a replica runs it: can this
/// process make the private user and mount namespace a session's supervisor
/// enters? A forked child tries [`crate::sandbox::confine::enter_namespace`]
/// with a private `/tmp` and nothing to bind (what `__supervise
/// --probe-namespace` runs as a process of its own) and exits with the
/// answer. No `execve`: re-executing the binary cost a few milliseconds of
/// a core, and a session that came right after the start waited for them.
/// The child is recorded as the worker's own, as `spawn_tracked` does,
/// so an orphan sweep neither kills it nor reaps its answer.
pub fn probe_namespaces() -> bool {
    // Built before the fork: the child must not allocate.
    let policy = crate::sandbox::ShellPolicy::namespace_probe();
    let child = {
        let mut own = spawned();
        // SAFETY: the child is a copy of one thread of a multi-threaded
        // process. It only makes system calls (`enter_namespace` allocates
        // nothing for a policy with nothing to bind, and takes no lock; the
        // lock held here is never touched in the child) and leaves with
        // `_exit`, running no destructor and no exit handler.
        match unsafe { libc::fork() } {
            -1 => return false,
            0 => {
                let entered = crate::sandbox::confine::enter_namespace(&policy).is_ok();
                // SAFETY: ends the child at once, as above.
                unsafe { libc::_exit(if entered { 0 } else { 1 }) }
            }
            child => {
                own.push(child);
                child
            }
        }
    };
    let answer = loop {
        match rustix::process::waitpid(Pid::from_raw(child), WaitOptions::empty()) {
            Ok(Some((_, status))) => break status.exit_status() == Some(0),
            Err(Errno::INTR) => {}
            _ => break false,
        }
    };
    spawned().retain(|&pid| pid != child);
    answer
}

/// Kill and reap every child of this process that it did not start itself
/// (`spawn_tracked`): orphans adopted as a subreaper, with their whole
/// trees; zombies among them are reaped too. Each is waited for by its own
/// pid, never `waitpid(-1)`, so tokio's children keep their statuses (tokio
/// waits per pid too, so adopted orphans do not confuse it). Blocking, up
/// to a few `KILL_BOUND`s; run it off the runtime. Does nothing unless
/// [`become_subreaper`] succeeded. Returns how many were alive (killed);
/// dead ones (zombies) are only reaped.
pub fn sweep_orphans() -> usize {
    if !SUBREAPER.load(std::sync::atomic::Ordering::SeqCst) {
        return 0;
    }
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let until = Instant::now() + KILL_BOUND * 2;
    let mut found = 0;
    loop {
        let strays: Vec<(i32, u8)> = {
            // Scanned under the lock: a child spawned meanwhile is recorded
            // before the scan or seen after it.
            let mut own = spawned();
            let procs = processes();
            // Forget the pids tokio has reaped (no longer our children).
            own.retain(|p| procs.iter().any(|&(pid, _, ppid)| pid == *p && ppid == me));
            procs
                .into_iter()
                .filter(|&(pid, _, ppid)| ppid == me && !own.contains(&pid))
                .map(|(pid, state, _)| (pid, state))
                .collect()
        };
        if strays.is_empty() {
            break;
        }
        for (pid, state) in strays {
            let Some(pid) = Pid::from_raw(pid) else {
                continue;
            };
            // Our unreaped child: its pid cannot be reused until we wait.
            // A zombie is already dead — typically a session's shell, killed
            // with its tree, whose supervisor died before reaping it — and is
            // only reaped; a live one escaped its session's tree.
            if state != b'Z' {
                found += 1;
                kill_tree(pid, true, false, KILL_BOUND);
            }
            let reap_until = Instant::now() + KILL_BOUND;
            loop {
                match rustix::process::waitpid(Some(pid), WaitOptions::NOHANG) {
                    Ok(None) if Instant::now() < reap_until => {
                        std::thread::sleep(Duration::from_millis(1))
                    }
                    Err(Errno::INTR) => {}
                    _ => break,
                }
            }
        }
        if Instant::now() >= until {
            break;
        }
    }
    found
}

/// `envworker __supervise [--sandbox ABI RULES… --] PROGRAM ARGS…`: become
/// a child subreaper, confine ourselves to the session's sandbox when one is
/// given (see [`crate::sandbox`]), run PROGRAM on our stdin/stdout (which we then close, so the caller sees the
/// end of the output when PROGRAM exits), reap every child, and when
/// PROGRAM exits kill what is left and exit with its status.
/// `envworker __supervise --await-launch`: a spare, the same once a
/// [`Launch`] read from stdin gave it the directory, the environment (for
/// PROGRAM) and those arguments; a closed stdin before that ends it quietly.
pub fn supervise(args: &[OsString]) -> ExitCode {
    use std::os::fd::{FromRawFd, OwnedFd};
    if args
        .first()
        .is_some_and(|a| a == crate::sandbox::NAMESPACE_PROBE)
    {
        let probe = crate::sandbox::ShellPolicy::namespace_probe();
        return match crate::sandbox::confine::enter_namespace(&probe) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        };
    }
    // Whatever the worker inherited without close-on-exec (a parent's
    // descriptors) must not reach the agent: the shell gets stdio only.
    // (A spare holds nothing else while it waits, either.)
    close_inherited_descriptors();
    // A spare: what to run comes on stdin, then it goes on as any other.
    let launch = if args.first().is_some_and(|a| a == AWAIT_LAUNCH) {
        match Launch::read_from_stdin() {
            Ok(Some(launch)) => Some(launch),
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => {
                println!("envworker: cannot start the shell: {e}");
                return ExitCode::from(126);
            }
        }
    } else {
        None
    };
    if let Some(launch) = &launch
        && let Err(e) = std::env::set_current_dir(&launch.cwd)
    {
        println!(
            "envworker: cannot start the shell in {}: {e}",
            launch.cwd.display()
        );
        return ExitCode::from(126);
    }
    let args = launch.as_ref().map_or(args, |l| &l.args[..]);
    let (policy, args) = match crate::sandbox::ShellPolicy::from_args(args) {
        Ok(parsed) => parsed,
        Err(e) => {
            println!("envworker: cannot confine the shell: {e}");
            return ExitCode::from(126);
        }
    };
    let Some((program, rest)) = args.split_first() else {
        eprintln!("envworker {SUPERVISE}: no program");
        return ExitCode::from(2);
    };
    // The sandbox before the shell, so everything the agent starts inherits
    // it; a shell that asked for one never runs without it. Stdout is the
    // tool's output: the agent (and the operator, in the call's result)
    // reads why.
    if let Some(policy) = &policy
        && let Err(e) = crate::sandbox::confine::apply(policy)
    {
        println!("envworker: cannot confine the shell: {e}");
        return ExitCode::from(126);
    }
    // Refused (a seccomp profile): the shell still runs, and the tree kill
    // still finds what did not detach; a broken `bash` would be worse.
    let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
    // SAFETY: fds 0 and 1 are ours (set up by the worker) and nothing else
    // in this process uses them; the shell gets them and we keep neither.
    let (stdin, stdout) = unsafe { (OwnedFd::from_raw_fd(0), OwnedFd::from_raw_fd(1)) };
    let mut command = std::process::Command::new(program);
    command.args(rest).stdin(stdin).stdout(stdout);
    if let Some(launch) = &launch {
        command
            .env_clear()
            .envs(launch.env.iter().map(|(k, v)| (k, v)));
    }
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("envworker {SUPERVISE}: cannot start {program:?}: {e}");
            return ExitCode::from(127);
        }
    };
    let shell = Pid::from_child(&child);
    let status = loop {
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((pid, status))) if pid == shell => break status,
            Ok(_) => {}
            Err(Errno::INTR) => {}
            Err(_) => return ExitCode::from(1),
        }
    };
    kill_tree(rustix::process::getpid(), false, true, KILL_BOUND);
    let code = status
        .exit_status()
        .or_else(|| status.terminating_signal().map(|s| 128 + s))
        .unwrap_or(1);
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// Close every descriptor above stderr: `close_range(3, ~0)`, or one by one
/// from `/proc/self/fd` on a kernel without it (before 5.9).
fn close_inherited_descriptors() {
    // SAFETY: the supervisor is single-threaded and holds nothing above 2
    // that it still needs; the syscall takes three integers.
    let closed = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if closed == 0 {
        return;
    }
    let open: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .filter(|&fd: &i32| fd > 2)
                .collect()
        })
        .unwrap_or_default();
    for fd in open {
        // SAFETY: as above; the directory's own descriptor is gone by now.
        unsafe { libc::close(fd) };
    }
}

/// When this process is PID 1: run the worker as a child and be its init
/// (forward signals, reap every orphan) until it exits; `None` otherwise.
pub fn run_as_init() -> Option<ExitCode> {
    if rustix::process::getpid() != Pid::INIT {
        return None;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("envworker (init): cannot start: {e}");
            return Some(ExitCode::FAILURE);
        }
    };
    Some(runtime.block_on(init()))
}

async fn init() -> ExitCode {
    use std::os::unix::process::CommandExt;
    use tokio::signal::unix::{SignalKind, signal};
    let forwarded = [
        (SignalKind::terminate(), Signal::TERM),
        (SignalKind::interrupt(), Signal::INT),
        (SignalKind::hangup(), Signal::HUP),
        (SignalKind::quit(), Signal::QUIT),
        (SignalKind::user_defined1(), Signal::USR1),
        (SignalKind::user_defined2(), Signal::USR2),
    ];
    // Handlers first: PID 1 ignores any signal it has no handler for.
    let mut streams = Vec::new();
    for (kind, sig) in forwarded {
        match signal(kind) {
            Ok(s) => streams.push((s, sig)),
            Err(e) => eprintln!("envworker (init): cannot handle {sig:?}: {e}"),
        }
    }
    let Ok(mut exited) = signal(SignalKind::child()) else {
        eprintln!("envworker (init): cannot handle SIGCHLD");
        return ExitCode::FAILURE;
    };
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| "envworker".into());
    // `std::process` (not tokio's), so this loop is the only one waiting.
    let worker = match std::process::Command::new("/proc/self/exe")
        .arg0(arg0)
        .args(args)
        .spawn()
    {
        Ok(child) => Pid::from_child(&child),
        Err(e) => {
            eprintln!("envworker (init): cannot start the worker: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Signal>();
    for (mut stream, sig) in streams {
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send(sig).is_err() {
                    break;
                }
            }
        });
    }
    loop {
        // Reap everything that has exited: the worker, and any orphan.
        loop {
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(Some((pid, status))) if pid == worker => {
                    let code = status
                        .exit_status()
                        .or_else(|| status.terminating_signal().map(|s| 128 + s))
                        .unwrap_or(1);
                    return ExitCode::from(code.clamp(0, 255) as u8);
                }
                Ok(Some(_)) => {}
                Err(Errno::INTR) => {}
                Ok(None) | Err(_) => break,
            }
        }
        tokio::select! {
            _ = exited.recv() => {}
            Some(sig) = rx.recv() => {
                let _ = rustix::process::kill_process(worker, sig);
            }
            // A SIGCHLD coalesced with one already handled is still caught.
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_after_the_last_parenthesis_of_its_comm() {
        assert_eq!(stat_fields(b"42 (bash) S 7 42 42 0 -1"), Some((b'S', 7)));
        assert_eq!(
            stat_fields(b"43 (a) Z 9 (b) ) R 12 43 43 0"),
            Some((b'R', 12))
        );
        assert_eq!(stat_fields(b"44 (sleep) Z 1"), Some((b'Z', 1)));
        assert_eq!(stat_fields(b"45 (cut"), None);
        assert_eq!(stat_fields(b""), None);
    }

    #[test]
    fn the_scan_sees_a_live_child_and_a_zombie_with_their_parent() {
        let me = rustix::process::getpid().as_raw_nonzero().get();
        let mut sleeper = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut exited = std::process::Command::new("true").spawn().unwrap();
        let exited_pid = exited.id() as i32;
        // `true` exits at once and stays a zombie until waited for.
        let deadline = Instant::now() + Duration::from_secs(10);
        let state_of = |pid: i32| {
            processes()
                .into_iter()
                .find(|&(p, _, _)| p == pid)
                .map(|(_, state, ppid)| (state, ppid))
        };
        while state_of(exited_pid).is_some_and(|(s, _)| s != b'Z') && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(state_of(exited_pid), Some((b'Z', me)));
        let (state, ppid) = state_of(sleeper.id() as i32).expect("the sleeper is listed");
        assert_eq!(ppid, me);
        assert_ne!(state, b'Z');
        assert!(processes().iter().any(|&(p, _, _)| p == me));
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        exited.wait().unwrap();
    }
}
