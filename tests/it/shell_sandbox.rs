//! The agent's shell in its sandbox (`--shell-sandbox`, see `src/sandbox/`),
//! end to end: the real `envworker serve` behind an in-process devserver,
//! run as a non-root user (`nobody` when the tests run as root), serving
//! scenarios whose agent attacks, from its own `bash`, another session on
//! the same worker.
//!
//! 1. An exploit suite: session B leaves secrets in its working directory,
//!    its memory store folder and its `/tmp`, and waits; session A, on the
//!    same worker at the same time, tries to read, list, write, link, move
//!    and truncate them, to list the worker's directories, to read B's
//!    environment, to `ptrace` B, to signal B and the worker, and looks at
//!    the descriptors its shell holds. The same attack runs three times:
//!    with `--shell-sandbox off` (every case the sandbox refuses must
//!    succeed there, so the sandbox is what refuses it), with Landlock only
//!    (namespaces forced unavailable) and with the whole sandbox. A table
//!    says who refused what (`--nocapture`).
//! 2. Ordinary work still works in the sandbox: git, a C compiler, a
//!    virtualenv, multiprocessing, a large sort, pipes and jobs, a script in
//!    `/tmp`, `mktemp`, a loopback server and its client, unix sockets.
//! 3. What `serve` says: it refuses to start when `require` cannot be met,
//!    says when the shell is NOT confined, and says what is enforced.
//! 4. One mount path, two live sessions: both served with namespaces (each
//!    its own `/mnt/memory`), the second handed back, never failed, without.
//!
//! A case whose kernel feature the probe reports present is never skipped:
//! a case that cannot run there fails the suite.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::serve_stack::{ServeUser, Stack, StackOptions, stack_with_options};
use serde_json::{Value, json};

/// The system's directories only: the test runner's own `PATH` may start
/// with directories under its `HOME` (`/root/.pyenv/shims`), which no
/// sandboxed shell reaches (nor `nobody`).
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where every stack's directories are made: outside `/tmp` and `/dev/shm`
/// (where a shared `/tmp` would expose them, and `serve` refuses to start)
/// and reachable by `nobody`: `target/tmp`, unless the checkout itself lies
/// below `/tmp` (a CI clone), then `/var/tmp/envworker-shell-sandbox-tests`.
fn temp_base() -> PathBuf {
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    if !target.starts_with("/tmp") && !target.starts_with("/dev/shm") {
        return target;
    }
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let base = PathBuf::from("/var/tmp/envworker-shell-sandbox-tests");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&base)
        .unwrap_or_else(|e| panic!("{}: {e}", base.display()));
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    base
}

fn bash(command: impl Into<String>, expect: Value) -> Value {
    json!({"tool": "bash", "input": {"command": command.into()}, "expect": expect})
}

fn tag() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// What the kernel offers, probed independently of `serve`.
#[derive(Debug, Clone, Copy)]
struct Kernel {
    /// `envworker::sandbox::probe::landlock_abi()`.
    abi: i32,
    /// `unshare -Urm true` succeeds as the user `serve` runs as.
    namespaces: bool,
}

fn kernel(user: ServeUser) -> Kernel {
    let mut unshare = Command::new("unshare");
    unshare
        .args(["-Urm", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some((uid, gid)) = user.ids {
        unshare.uid(uid).gid(gid);
    }
    Kernel {
        abi: envworker::sandbox::probe::landlock_abi(),
        namespaces: unshare.status().is_ok_and(|s| s.success()),
    }
}

/// A directory below [`temp_base`] for `user`.
fn user_dir(user: ServeUser) -> tempfile::TempDir {
    let dir = tempfile::tempdir_in(temp_base()).unwrap();
    user.own(dir.path());
    dir
}

/// The options every stack here shares.
fn options(user: ServeUser, envs: &[(&str, &str)]) -> StackOptions {
    let mut all = vec![("PATH".to_string(), PATH.to_string())];
    all.extend(envs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    StackOptions {
        envs: all,
        user,
        temp_base: Some(temp_base()),
        state_dir: true,
        ..Default::default()
    }
}

/// The output of step `index` of a running scenario once it passed; panics
/// (with the report and serve's logs) when it failed or `bound` passed.
async fn step_output(s: &Stack, session: &str, index: usize, bound: Duration) -> String {
    let until = Instant::now() + bound;
    loop {
        let report = s.server.scenario_report(session).await;
        let step = &report["steps"][index];
        match step["status"].as_str() {
            Some("passed") => return step["output"].as_str().unwrap_or_default().to_string(),
            Some("failed") | Some("skipped") => {
                panic!("step {index} failed: {report:#}\n{}", s.serve.logs_tail(40))
            }
            _ => {}
        }
        assert!(
            report["status"] == "running"
                && Instant::now() < until
                && !s.serve.logs().contains("work item failed"),
            "step {index} never passed: {report:#}\n{}",
            s.serve.logs_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value after `KEY=` on its own line of `text`.
fn field(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {text:?}"))
        .trim()
        .to_string()
}

/// A bash step waiting (at most 90 s) for `.release` in its working directory.
fn wait_for_release() -> Value {
    bash(
        "for i in $(seq 900); do [ -e .release ] && break; sleep 0.1; done; echo released",
        json!({"contains": "released"}),
    )
}

fn release(dir: &Path) {
    std::fs::write(dir.join(".release"), "")
        .unwrap_or_else(|e| panic!("release {}: {e}", dir.display()));
}

/// Wait until serve's logs hold `want`.
async fn logged(s: &Stack, want: &str, bound: Duration) -> String {
    let until = Instant::now() + bound;
    loop {
        let logs = s.serve.logs();
        if let Some(line) = logs.lines().find(|l| l.contains(want)) {
            return line.to_string();
        }
        assert!(
            Instant::now() < until,
            "no {want:?} in serve's logs:\n{logs}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------
// 1. The exploit suite
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Config {
    /// `--shell-sandbox off`: the reference's unconfined shell.
    Off,
    /// The sandbox with `ENVWORKER_SANDBOX_FORCE_UNAVAILABLE=namespaces`.
    LandlockOnly,
    /// The sandbox, as `--max-concurrent-items 2` gives it by default.
    On,
}

/// The kernel feature a case's refusal needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Needs {
    /// Landlock, any ABI (file system, `ptrace`, `/proc/<pid>/environ`).
    Landlock,
    /// Landlock ABI 6: signal scopes.
    Scopes,
    /// A user and mount namespace: a private `/tmp`.
    Namespaces,
}

impl Needs {
    fn present(self, k: Kernel) -> bool {
        match self {
            Needs::Landlock => k.abi >= 1,
            Needs::Scopes => k.abi >= 6,
            Needs::Namespaces => k.namespaces,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Needs::Landlock => "Landlock",
            Needs::Scopes => "Landlock ABI 6 (scopes)",
            Needs::Namespaces => "user+mount namespaces",
        }
    }
}

/// Who is expected to refuse a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refuser {
    /// The sandbox: the case succeeds with `--shell-sandbox off`.
    Sandbox(Needs),
    /// Something outside the sandbox, refusing it with the sandbox off too.
    Other(&'static str),
}

/// One attack: a shell snippet, and what its success looks like.
struct Case {
    name: &'static str,
    cmd: String,
    /// Text only a successful attack prints.
    success: String,
    refuser: Refuser,
}

/// What a case did in one configuration.
#[derive(Debug, Clone)]
struct Outcome {
    rc: i32,
    out: String,
    succeeded: bool,
}

impl Outcome {
    fn short(&self) -> String {
        if self.succeeded {
            return "SUCCEEDED".into();
        }
        const WHY: [&str; 5] = [
            "Permission denied",
            "Operation not permitted",
            "Invalid cross-device link",
            "No such file or directory",
            "No such process",
        ];
        let why = WHY
            .iter()
            .find(|w| self.out.contains(*w))
            .copied()
            .unwrap_or("failed");
        format!("refused: {why} (rc={})", self.rc)
    }
}

/// The paths and pids of the attack, in one configuration.
struct Targets {
    /// B's working directory.
    bwd: String,
    /// B's store folder where the files really are (the host's view).
    bstore: String,
    /// B's store as B's agent names it (`/mnt/memory/<slug>`).
    bstore_advertised: String,
    /// B's shell (`$$`).
    bpid: String,
    /// The worker (`serve`).
    wpid: String,
    /// The directory holding the sessions' directories.
    root: String,
    /// `--state-dir`.
    state: String,
    /// The file B left in its `/tmp`.
    btmp: String,
    /// The session directory of B, by name.
    bdir_name: String,
}

/// The secrets B leaves, unique to the run.
struct Secrets {
    wd: String,
    wd_move: String,
    st: String,
    st_move: String,
    tmp: String,
    pwned: String,
}

impl Secrets {
    fn new() -> Secrets {
        let t = tag();
        Secrets {
            wd: format!("SECRET-WD-{t}"),
            wd_move: format!("SECRET-WD-MOVE-{t}"),
            st: format!("SECRET-ST-{t}"),
            st_move: format!("SECRET-ST-MOVE-{t}"),
            tmp: format!("SECRET-TMP-{t}"),
            pwned: format!("PWNED-{t}"),
        }
    }
}

/// Every attack of A on B.
fn cases(t: &Targets, s: &Secrets) -> Vec<Case> {
    use Needs::*;
    let sb = Refuser::Sandbox;
    let (bwd, st) = (&t.bwd, &t.bstore);
    let mut v = Vec::new();
    let mut add = |name, cmd: String, success: &str, refuser| {
        v.push(Case {
            name,
            cmd,
            success: success.to_string(),
            refuser,
        })
    };
    // B's working directory.
    add(
        "wd: read B's file",
        format!("cat {bwd}/secret.txt"),
        &s.wd,
        sb(Landlock),
    );
    add(
        "wd: list B's directory",
        format!("ls -A {bwd}"),
        "secret.txt",
        sb(Landlock),
    );
    add(
        "wd: write into B's directory",
        format!(
            "echo {p} > {bwd}/pwned.txt && cat {bwd}/pwned.txt",
            p = s.pwned
        ),
        &s.pwned,
        sb(Landlock),
    );
    add(
        "wd: hard link B's file, read it",
        format!("ln {bwd}/secret.txt hl-wd && cat hl-wd"),
        &s.wd,
        sb(Landlock),
    );
    add(
        "wd: symlink B's file, read it",
        format!("ln -s {bwd}/secret.txt sl-wd && cat sl-wd"),
        &s.wd,
        sb(Landlock),
    );
    add(
        "wd: move B's file out",
        format!("mv {bwd}/move.txt mv-wd && cat mv-wd"),
        &s.wd_move,
        sb(Landlock),
    );
    add(
        "wd: truncate B's file",
        format!("truncate -s 0 {bwd}/trunc.txt && stat -c truncated-to-%s {bwd}/trunc.txt"),
        "truncated-to-0",
        sb(Landlock),
    );
    // B's memory store folder, where its files are.
    add(
        "store: read B's file",
        format!("cat {st}/secret.md"),
        &s.st,
        sb(Landlock),
    );
    add(
        "store: list B's folder",
        format!("ls -A {st}"),
        "secret.md",
        sb(Landlock),
    );
    add(
        "store: write into B's folder",
        format!("echo {p} > {st}/pwned.md && cat {st}/pwned.md", p = s.pwned),
        &s.pwned,
        sb(Landlock),
    );
    add(
        "store: hard link B's file, read it",
        format!("ln {st}/secret.md hl-st && cat hl-st"),
        &s.st,
        sb(Landlock),
    );
    add(
        "store: symlink B's file, read it",
        format!("ln -s {st}/secret.md sl-st && cat sl-st"),
        &s.st,
        sb(Landlock),
    );
    add(
        "store: move B's file out",
        format!("mv {st}/move.md mv-st && cat mv-st"),
        &s.st_move,
        sb(Landlock),
    );
    add(
        "store: truncate B's file",
        format!("truncate -s 0 {st}/trunc.md && stat -c truncated-to-%s {st}/trunc.md"),
        "truncated-to-0",
        sb(Landlock),
    );
    add(
        "store: read B's file at B's mount path",
        format!("cat {}/secret.md", t.bstore_advertised),
        &s.st,
        sb(Landlock),
    );
    // The worker's own directories.
    add(
        "list the sessions' directories",
        format!("ls -A {}", t.root),
        &t.bdir_name,
        sb(Landlock),
    );
    add(
        "list the state directory",
        format!("ls -A {} && echo listed-state", t.state),
        "listed-state",
        sb(Landlock),
    );
    // B's /tmp.
    add(
        "tmp: read B's /tmp file",
        format!("cat {}", t.btmp),
        &s.tmp,
        sb(Namespaces),
    );
    // B's process.
    add(
        "proc: read B's shell's environ",
        format!("tr '\\0' '\\n' < /proc/{}/environ | grep '^PATH='", t.bpid),
        "PATH=",
        sb(Landlock),
    );
    add(
        "ptrace: attach to B's shell",
        ptrace(&t.bpid),
        "ptrace-attached",
        sb(Landlock),
    );
    add(
        "signal: kill -0 B's shell",
        format!("kill -0 {} && echo signalled", t.bpid),
        "signalled",
        sb(Scopes),
    );
    add(
        "signal: kill -STOP (+CONT) B's shell",
        format!(
            "kill -STOP {p} && kill -CONT {p} && echo signalled",
            p = t.bpid
        ),
        "signalled",
        sb(Scopes),
    );
    add(
        "signal: kill -0 the worker",
        format!("kill -0 {} && echo signalled", t.wpid),
        "signalled",
        sb(Scopes),
    );
    add(
        "signal: kill -STOP (+CONT) the worker",
        format!(
            "kill -STOP {p} && kill -CONT {p} && echo signalled",
            p = t.wpid
        ),
        "signalled",
        sb(Scopes),
    );
    // The worker's process: refused without the sandbox too.
    let undumpable =
        "the worker is not dumpable (PR_SET_DUMPABLE 0: its /proc files belong to root)";
    add(
        "proc: read the worker's environ",
        format!("tr '\\0' '\\n' < /proc/{}/environ | grep '^PATH='", t.wpid),
        "PATH=",
        Refuser::Other(undumpable),
    );
    add(
        "ptrace: attach to the worker",
        ptrace(&t.wpid),
        "ptrace-attached",
        Refuser::Other(undumpable),
    );
    v
}

/// Run the ptrace helper the first step built (C, else Python's ctypes) on `pid`.
fn ptrace(pid: &str) -> String {
    format!("if [ -x ./pt ]; then ./pt {pid}; else python3 pt.py {pid}; fi")
}

/// `PTRACE_ATTACH`, wait for the stop, `PTRACE_DETACH` (the tracee runs on).
const PTRACE_C: &str = r#"#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
int main(int argc, char **argv) {
    pid_t pid = atoi(argv[1]);
    if (ptrace(PTRACE_ATTACH, pid, 0, 0) != 0) {
        printf("ptrace: %s\n", strerror(errno));
        return 1;
    }
    int status;
    waitpid(pid, &status, __WALL);
    ptrace(PTRACE_DETACH, pid, 0, 0);
    printf("ptrace-attached\n");
    return 0;
}
"#;

const PTRACE_PY: &str = r#"import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
pid = int(sys.argv[1])
if libc.ptrace(16, pid, None, None) != 0:
    print("ptrace:", os.strerror(ctypes.get_errno()))
    sys.exit(1)
os.waitpid(pid, 0x40000000)
libc.ptrace(17, pid, None, None)
print("ptrace-attached")
"#;

/// A case as a step: its output, then `rc=` its status.
fn case_step(case: &Case) -> Value {
    bash(
        format!("( {}\n) 2>&1; echo \"rc=$?\"", case.cmd),
        json!({"contains": "rc="}),
    )
}

fn outcome(case: &Case, output: &str) -> Outcome {
    let (out, rc) = match output.rfind("rc=") {
        Some(at) => (
            output[..at].to_string(),
            output[at + 3..]
                .lines()
                .next()
                .and_then(|l| l.trim().parse().ok())
                .unwrap_or(-1),
        ),
        None => (output.to_string(), -1),
    };
    Outcome {
        succeeded: rc == 0 && out.contains(&case.success),
        rc,
        out,
    }
}

/// A's shell's descriptors, and those of a program it starts.
struct Fds {
    /// `(fd, target, flags)` of the shell itself.
    shell: Vec<(u32, String, u32)>,
    /// `(fd, target)` of `ls /proc/self/fd`.
    child: Vec<(u32, String)>,
}

/// Lists, from a subshell (so the listing's own descriptors are in other
/// processes), the shell's descriptors: number, `fdinfo` flags (octal),
/// target; then those of a program the shell starts (`ls`, whose own
/// listing holds one: `/proc/<its pid>/fd`).
const FDS_STEP: &str = r#"( for f in /proc/$$/fd/*; do n=${f##*/}; printf 'SHELLFD %s %s %s\n' "$n" "$(sed -n 's/^flags:[[:space:]]*//p' /proc/$$/fdinfo/$n)" "$(readlink "$f")"; done ); ls -l /proc/self/fd | sed -n 's/.* \([0-9][0-9]*\) -> \(.*\)$/CHILDFD \1 \2/p'; echo fds-listed"#;

fn parse_fds(out: &str) -> Fds {
    let mut fds = Fds {
        shell: Vec::new(),
        child: Vec::new(),
    };
    for line in out.lines() {
        if let Some(rest) = line.strip_prefix("SHELLFD ") {
            let mut parts = rest.splitn(3, ' ');
            let n = parts.next().and_then(|n| n.parse().ok());
            // No flags (fdinfo unreadable): 0, so the fd counts as unknown.
            let flags = parts
                .next()
                .and_then(|f| u32::from_str_radix(f, 8).ok())
                .unwrap_or(0);
            let target = parts.next().unwrap_or_default().to_string();
            fds.shell.push((
                n.unwrap_or_else(|| panic!("bad line {line:?}")),
                target,
                flags,
            ));
        } else if let Some(rest) = line.strip_prefix("CHILDFD ") {
            let (n, target) = rest.split_once(' ').unwrap_or((rest, ""));
            fds.child.push((
                n.parse().unwrap_or_else(|_| panic!("bad line {line:?}")),
                target.to_string(),
            ));
        }
    }
    fds
}

/// Pipe inodes (`pipe:[N]`) among a process's descriptors; `None` when
/// they cannot be read (the worker is not dumpable: only root reads them).
fn pipes_of(pid: u32) -> Option<BTreeSet<String>> {
    let pipes: BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|t| t.display().to_string())
        .filter(|t| t.starts_with("pipe:"))
        .collect();
    (!pipes.is_empty()).then_some(pipes)
}

/// Every descriptor of A's shell beyond 0-2 is one bash made itself for
/// the call's `{ …; } </dev/null 2>&1` (saved copies of its own stdin and
/// stderr: fd 10 and up, close-on-exec, pipes to the worker — checked
/// against the worker's own descriptors when they can be read); a program
/// the shell starts holds 0-2 and its own listing's descriptor only.
/// Returns what is wrong.
fn check_fds(fds: &Fds, worker_pipes: Option<&BTreeSet<String>>) -> Vec<String> {
    let mut wrong = Vec::new();
    let stdout_pipe = fds
        .shell
        .iter()
        .find(|(n, ..)| *n == 1)
        .map(|(_, t, _)| t.clone());
    const O_CLOEXEC: u32 = 0o2000000;
    for (n, target, flags) in &fds.shell {
        if *n <= 2 {
            continue;
        }
        let bash_saved = *n >= 10
            && flags & O_CLOEXEC != 0
            && target.starts_with("pipe:")
            && (Some(target) == stdout_pipe.as_ref()
                || worker_pipes.is_none_or(|pipes| pipes.contains(target)));
        if !bash_saved {
            wrong.push(format!(
                "the shell holds fd {n} -> {target} (flags {flags:o})"
            ));
        }
    }
    if fds.shell.iter().filter(|(n, ..)| *n <= 2).count() != 3 {
        wrong.push(format!("the shell's stdio is not 0-2: {:?}", fds.shell));
    }
    for (n, target) in &fds.child {
        let own_listing = target.starts_with("/proc/") && target.ends_with("/fd");
        if *n > 2 && !own_listing {
            wrong.push(format!(
                "a program the shell starts inherits fd {n} -> {target}"
            ));
        }
    }
    if fds.child.iter().filter(|(n, _)| *n <= 2).count() != 3 {
        wrong.push(format!(
            "a started program's stdio is not 0-2: {:?}",
            fds.child
        ));
    }
    wrong
}

/// One configuration's results.
struct Run {
    outcomes: Vec<Outcome>,
    names: Vec<&'static str>,
    refusers: Vec<Refuser>,
    /// What is wrong with A's descriptors.
    fds_wrong: Vec<String>,
    fds_summary: String,
    /// B's files as found from outside after A's attack: name → intact.
    b_intact: BTreeMap<&'static str, bool>,
    /// The start-up line, when the sandbox is on.
    tmp_mode: Option<String>,
    /// The owner of `/proc/<worker>/environ` (root: the worker is not dumpable).
    worker_proc_uid: u32,
}

async fn run_config(config: Config, user: ServeUser) -> Run {
    let remap_dir = user_dir(user);
    let remap = format!("/mnt/memory={}", remap_dir.path().display());
    // With namespaces the sandbox binds each session's own folder at
    // /mnt/memory; otherwise every session shares the host's paths, which
    // `nobody` cannot create under /mnt/memory: a remap, as on Lambda.
    // Whether serve has namespaces is what its start-up line says.
    let mut own_mounts = config == Config::On;
    let (s, tmp_mode) = loop {
        let mut extra: Vec<&str> = vec!["--max-concurrent-items", "2"];
        let mut envs: Vec<(&str, &str)> = Vec::new();
        match config {
            Config::Off => extra.extend(["--shell-sandbox", "off"]),
            Config::LandlockOnly => {
                envs.push(("ENVWORKER_SANDBOX_FORCE_UNAVAILABLE", "namespaces"))
            }
            Config::On => {}
        }
        if !own_mounts {
            extra.extend(["--mount-remap", remap.as_str()]);
        }
        let mut opts = options(user, &envs);
        opts.mount_root = Some("/mnt/memory".into());
        let s = stack_with_options(&extra, opts).await;
        if config == Config::Off {
            break (s, None);
        }
        let line = logged(
            &s,
            "the agent's shell is sandboxed",
            Duration::from_secs(20),
        )
        .await;
        if own_mounts && !line.contains("namespaces=true") {
            eprintln!(
                "serve has no namespaces ({line}); again with a remap for the stores, as without namespaces"
            );
            own_mounts = false;
            continue;
        }
        break (s, Some(line));
    };
    let secrets = Secrets::new();
    let btmp = format!("/tmp/envworker-b-secret-{}", tag());
    let store_name = format!("b-notes-{}", tag());

    // B: leave the secrets, say where, wait.
    let b = s
        .start(json!({"name": "victim", "memory_stores": [
                {"key": "b", "name": store_name, "memories": {"/seed.md": "seed\n"}}],
            "steps": [
                bash(format!(
                    "echo {wd} > secret.txt && echo {wdm} > move.txt && echo truncate-me > trunc.txt && \
                     echo {st} > {{mount:b}}/secret.md && echo {stm} > {{mount:b}}/move.md && \
                     echo truncate-me > {{mount:b}}/trunc.md && echo {tmp} > {btmp} && \
                     echo \"BWD=$PWD\" && echo \"BPID=$$\" && echo ready",
                    wd = secrets.wd, wdm = secrets.wd_move, st = secrets.st,
                    stm = secrets.st_move, tmp = secrets.tmp),
                    json!({"contains": "ready"})),
                wait_for_release(),
            ]}))
        .await;
    let b_out = step_output(&s, &b.session_id, 0, Duration::from_secs(30)).await;
    let bwd = field(&b_out, "BWD");
    let bpid = field(&b_out, "BPID");
    let report = s.server.scenario_report(&b.session_id).await;
    let advertised = report["stores"]["b"]["mount_path"]
        .as_str()
        .unwrap()
        .to_string();
    let slug = Path::new(&advertised)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let state = s.state_dir.as_ref().unwrap().path().to_path_buf();
    let bstore = if own_mounts {
        state
            .join("rooms")
            .join(&b.session_id)
            .join("mnt")
            .join(&slug)
    } else {
        remap_dir.path().join(&slug)
    };
    // The targets are where the test says they are: seen from outside.
    let from_outside = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    assert_eq!(
        from_outside(&Path::new(&bwd).join("secret.txt")).trim(),
        secrets.wd
    );
    assert_eq!(
        from_outside(&bstore.join("secret.md")).trim(),
        secrets.st,
        "B's store is not at {}",
        bstore.display()
    );
    let bdir_name = Path::new(&bwd)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let targets = Targets {
        bwd: bwd.clone(),
        bstore: bstore.display().to_string(),
        bstore_advertised: advertised,
        bpid,
        wpid: s.serve.child.id().to_string(),
        root: s._dirs.1.path().display().to_string(),
        state: state.display().to_string(),
        btmp: btmp.clone(),
        bdir_name,
    };
    let cases = cases(&targets, &secrets);

    // A: build the ptrace helper, attack, list its descriptors, wait.
    let prep = format!(
        "echo \"AWD=$PWD\"; cat > pt.c <<'EOF_C'\n{PTRACE_C}EOF_C\ncat > pt.py <<'EOF_PY'\n{PTRACE_PY}EOF_PY\n\
         if command -v cc >/dev/null; then cc -o pt pt.c && echo helper=c; else echo helper=python; fi; echo prepared"
    );
    let mut steps = vec![bash(prep, json!({"contains": "prepared"}))];
    steps.extend(cases.iter().map(case_step));
    steps.push(bash(FDS_STEP, json!({"contains": "fds-listed"})));
    steps.push(wait_for_release());
    let fds_index = steps.len() - 2;
    let a = s.start(json!({"name": "attacker", "steps": steps})).await;
    let prep_out = step_output(&s, &a.session_id, 0, Duration::from_secs(60)).await;
    let awd = PathBuf::from(field(&prep_out, "AWD"));
    let fds_out = step_output(&s, &a.session_id, fds_index, Duration::from_secs(90)).await;
    let worker_proc_uid = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(format!("/proc/{}/environ", s.serve.child.id()))
            .unwrap()
            .uid()
    };
    // A waits, its shell alive: the pipes it may hold are the worker's.
    let worker_pipes = pipes_of(s.serve.child.id());
    let fds = parse_fds(&fds_out);
    let fds_wrong = check_fds(&fds, worker_pipes.as_ref());
    let fds_summary = format!(
        "shell: {}; started program: {}",
        fds.shell
            .iter()
            .map(|(n, t, _)| format!("{n}→{t}"))
            .collect::<Vec<_>>()
            .join(" "),
        fds.child
            .iter()
            .map(|(n, t)| format!("{n}→{t}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let report = s.server.scenario_report(&a.session_id).await;
    let outcomes: Vec<Outcome> = cases
        .iter()
        .enumerate()
        .map(|(i, case)| {
            outcome(
                case,
                report["steps"][i + 1]["output"]
                    .as_str()
                    .unwrap_or_default(),
            )
        })
        .collect();
    // B's files, from outside, before B's teardown removes them.
    let bwd = PathBuf::from(&bwd);
    let mut b_intact = BTreeMap::new();
    b_intact.insert(
        "wd secret.txt",
        from_outside(&bwd.join("secret.txt")).trim() == secrets.wd,
    );
    b_intact.insert(
        "wd move.txt",
        from_outside(&bwd.join("move.txt")).trim() == secrets.wd_move,
    );
    b_intact.insert(
        "wd trunc.txt",
        from_outside(&bwd.join("trunc.txt")).trim() == "truncate-me",
    );
    b_intact.insert("wd no pwned.txt", !bwd.join("pwned.txt").exists());
    b_intact.insert(
        "store secret.md",
        from_outside(&bstore.join("secret.md")).trim() == secrets.st,
    );
    b_intact.insert(
        "store move.md",
        from_outside(&bstore.join("move.md")).trim() == secrets.st_move,
    );
    b_intact.insert(
        "store trunc.md",
        from_outside(&bstore.join("trunc.md")).trim() == "truncate-me",
    );
    b_intact.insert("store no pwned.md", !bstore.join("pwned.md").exists());
    release(&awd);
    release(&bwd);
    s.passed_report(&a.session_id).await;
    s.passed_report(&b.session_id).await;
    let _ = std::fs::remove_file(&btmp);
    Run {
        names: cases.iter().map(|c| c.name).collect(),
        refusers: cases.iter().map(|c| c.refuser).collect(),
        outcomes,
        fds_wrong,
        fds_summary,
        b_intact,
        tmp_mode,
        worker_proc_uid,
    }
}

/// Sessions A and B on one worker, run as a non-root user: every attack of
/// A on B the sandbox refuses succeeds with `--shell-sandbox off`; the
/// Landlock-only run tells Landlock's refusals from the namespace's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_cannot_reach_another_on_the_same_worker() {
    let user = ServeUser::nobody_if_root();
    let k = kernel(user);
    eprintln!(
        "kernel: Landlock ABI {}, user+mount namespaces: {}; serve runs as {}",
        k.abi,
        k.namespaces,
        match user.ids {
            Some((uid, gid)) => format!("uid {uid} gid {gid}"),
            None => format!(
                "the current user (uid {})",
                rustix::process::geteuid().as_raw()
            ),
        }
    );
    if k.abi == 0 {
        eprintln!(
            "skipped: this kernel has no Landlock (the probe says so): `require` cannot start"
        );
        return;
    }
    let serve_uid = user
        .ids
        .map(|(uid, _)| uid)
        .unwrap_or_else(|| rustix::process::geteuid().as_raw());
    let off = run_config(Config::Off, user).await;
    let landlock = run_config(Config::LandlockOnly, user).await;
    let on = run_config(Config::On, user).await;

    let mut failures = Vec::new();
    let mut rows = Vec::new();
    for i in 0..on.names.len() {
        let name = on.names[i];
        let (o, l, n) = (&off.outcomes[i], &landlock.outcomes[i], &on.outcomes[i]);
        let refuser = on.refusers[i];
        let who = match refuser {
            Refuser::Other(why) => {
                if o.succeeded || n.succeeded {
                    failures.push(format!("{name}: expected refused everywhere ({why})"));
                }
                if serve_uid != 0 && off.worker_proc_uid != 0 {
                    failures.push(format!(
                        "{name}: refused, but not as explained ({why}): /proc/<worker>/environ belongs to uid {}",
                        off.worker_proc_uid
                    ));
                }
                format!("not the sandbox: {why}")
            }
            Refuser::Sandbox(needs) => {
                if !needs.present(k) {
                    // Allowed: the probe says the feature is absent.
                    format!("SKIPPED: no {} on this kernel", needs.name())
                } else {
                    if !o.succeeded {
                        failures.push(format!(
                            "{name}: did not succeed with --shell-sandbox off, so the refusal proves nothing: {:?}",
                            o.out
                        ));
                    }
                    if n.succeeded {
                        failures.push(format!("{name}: NOT refused by the sandbox: {:?}", n.out));
                    }
                    let by = match (l.succeeded, n.succeeded) {
                        (_, true) => "NOTHING".to_string(),
                        (false, false) => match needs {
                            Needs::Scopes => "the sandbox: Landlock signal scope".to_string(),
                            _ => "the sandbox: Landlock".to_string(),
                        },
                        (true, false) if needs == Needs::Namespaces => {
                            "the sandbox: mount namespace (private /tmp)".to_string()
                        }
                        (true, false) => "the sandbox's namespaces, NOT Landlock alone".to_string(),
                    };
                    // Landlock-only must refuse what Landlock covers.
                    if matches!(needs, Needs::Landlock | Needs::Scopes) && l.succeeded {
                        failures.push(format!(
                            "{name}: Landlock alone did not refuse it: {:?}",
                            l.out
                        ));
                    }
                    by
                }
            }
        };
        rows.push([name.to_string(), o.short(), l.short(), n.short(), who]);
    }
    let fd_row = |r: &Run| {
        if r.fds_wrong.is_empty() {
            "stdio + bash's own saved pipes".to_string()
        } else {
            format!("LEAK: {}", r.fds_wrong.join("; "))
        }
    };
    rows.push([
        "fds: A's shell holds only stdio".to_string(),
        fd_row(&off),
        fd_row(&landlock),
        fd_row(&on),
        "(no refusal: nothing to leak)".to_string(),
    ]);
    let header = [
        "case",
        "sandbox off",
        "Landlock only",
        "sandbox on",
        "what refuses it",
    ];
    let widths: Vec<usize> = (0..5)
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .chain([header[c].len()])
                .max()
                .unwrap()
        })
        .collect();
    let line = |cells: &[&str]| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    eprintln!("\n{}", line(&header));
    eprintln!(
        "{}",
        widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("-|-")
    );
    for r in &rows {
        eprintln!(
            "{}",
            line(&r.iter().map(String::as_str).collect::<Vec<_>>())
        );
    }
    eprintln!("\nA's descriptors (sandbox on): {}", on.fds_summary);
    eprintln!("A's descriptors (sandbox off): {}", off.fds_summary);
    eprintln!(
        "B's files after A's attack, from outside: off {:?}\n  Landlock only {:?}\n  on {:?}",
        off.b_intact, landlock.b_intact, on.b_intact
    );
    if let Some(line) = &on.tmp_mode {
        eprintln!("start-up line (sandbox on): {line}");
    }
    for run in [&off, &landlock, &on] {
        failures.extend(run.fds_wrong.iter().cloned());
    }
    for (file, intact) in on.b_intact.iter().chain(&landlock.b_intact) {
        if !intact {
            failures.push(format!("with the sandbox, B's {file} was touched"));
        }
    }
    if off.b_intact.values().all(|v| *v) {
        failures.push("with the sandbox off, A's writes never reached B's files".into());
    }
    if k.namespaces {
        let line = on.tmp_mode.clone().unwrap_or_default();
        if !(line.contains("tmp=private") || line.contains("tmp=\"private\"")) {
            failures.push(format!(
                "namespaces are available to this user here (`unshare -Urm true`) but serve's \
                 sandbox is not tmp=private (its namespace probe failed: see \
                 serve_refuses_or_says_what_the_sandbox_enforces): {line}"
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------
// 2. Ordinary work
// ---------------------------------------------------------------------------

/// In the sandbox (`--shell-sandbox require`, one session), what agents
/// do every day still works: as a non-root user, and (when the tests run
/// as root) as root too, whose sandbox has namespaces either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordinary_work_still_works_in_the_sandbox() {
    let nobody = ServeUser::nobody_if_root();
    if envworker::sandbox::probe::landlock_abi() == 0 {
        eprintln!("skipped: this kernel has no Landlock: `require` cannot start");
        return;
    }
    let root = ServeUser {
        ids: None,
        only_stdio: true,
        leaked_fd: None,
    };
    if nobody.ids.is_some() {
        tokio::join!(ordinary_work(nobody), ordinary_work(root));
    } else {
        ordinary_work(nobody).await;
    }
}

async fn ordinary_work(user: ServeUser) {
    let who = match user.ids {
        Some((uid, _)) => format!("uid {uid}"),
        None => format!("uid {}", rustix::process::geteuid().as_raw()),
    };
    let s = stack_with_options(&["--shell-sandbox", "require"], options(user, &[])).await;
    let has_cc = Command::new("sh")
        .args(["-c", "command -v cc"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|st| st.success());
    let mut steps = vec![bash(
        "( git init -q repo && cd repo && git -c user.name=a -c user.email=a@b commit -q --allow-empty -m sandboxed-commit && git log --format=%s )",
        json!({"contains": "sandboxed-commit"}),
    )];
    if has_cc {
        steps.push(bash(
            "cat > hello.c <<'EOF'\n#include <stdio.h>\nint main(void) { printf(\"hello from c\\n\"); return 0; }\nEOF\ncc -o hello hello.c && ./hello",
            json!({"contains": "hello from c"}),
        ));
    } else {
        eprintln!("as {who}: C compiler SKIPPED, no `cc` on this machine's PATH");
    }
    steps.extend([
        bash(
            "python3 -m venv v && v/bin/python -c 'print(\"venv-\" + str(1))'",
            json!({"contains": "venv-1"}),
        ),
        bash(
            "python3 -c 'import multiprocessing as mp\nif __name__ == \"__main__\":\n    with mp.Pool(2) as p: print(\"pool\", sum(p.map(abs, [-1, -2, -3])))\n    q = mp.Queue(); q.put(\"queued\"); print(q.get())'",
            json!({"contains": ["pool 6", "queued"]}),
        ),
        bash(
            "seq 2000000 | sort -rn -S 1M | head -1",
            json!({"contains": "2000000"}),
        ),
        bash(
            "sleep 0.2 & wait $!; echo \"bg=$?\"; echo abc | tr a-c x-z | cat",
            json!({"contains": ["bg=0", "xyz"]}),
        ),
        bash(
            "printf '#!/bin/sh\\necho script-ran-$1\\n' > /tmp/s-$$.sh && chmod +x /tmp/s-$$.sh && /tmp/s-$$.sh ok; rm -f /tmp/s-$$.sh",
            json!({"contains": "script-ran-ok"}),
        ),
        // In TMPDIR: /tmp when it is private, the session's own otherwise.
        bash(
            "f=$(mktemp) && d=$(mktemp -d) && echo mktemp-data > \"$f\" && cat \"$f\" && touch \"$d/x\" && \
             [ \"$(dirname \"$f\")\" = \"${TMPDIR:-/tmp}\" ] && echo mktemp-in-tmpdir; rm -rf \"$f\" \"$d\"",
            json!({"contains": ["mktemp-data", "mktemp-in-tmpdir"]}),
        ),
        bash(
            "python3 -u -m http.server 0 --bind 127.0.0.1 > srv.log 2>&1 &\n\
             for i in $(seq 100); do port=$(sed -n 's/.* port \\([0-9][0-9]*\\).*/\\1/p' srv.log | head -1); [ -n \"$port\" ] && break; sleep 0.1; done\n\
             echo served-page > page.txt\n\
             python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/page.txt').read().decode().strip())\"\n\
             kill %1; wait",
            json!({"contains": "served-page"}),
        ),
        bash(
            "python3 - <<'EOF'\nimport os, socket, threading\ntag = str(os.getpid())\nfor addr in ('\\0envworker-sandbox-abstract-' + tag, '/tmp/u-' + tag + '.sock'):\n    s = socket.socket(socket.AF_UNIX); s.bind(addr); s.listen(1)\n    def echo():\n        c = s.accept()[0]; c.sendall(c.recv(9)); c.close()\n    t = threading.Thread(target=echo); t.start()\n    c = socket.socket(socket.AF_UNIX); c.connect(addr); c.sendall(b'unix-echo')\n    print(c.recv(9).decode(), 'abstract' if addr[0] == '\\0' else 'path'); t.join()\n    if addr[0] == '/': os.unlink(addr)\nEOF",
            json!({"contains": ["unix-echo abstract", "unix-echo path"]}),
        ),
    ]);
    let line = logged(
        &s,
        "the agent's shell is sandboxed",
        Duration::from_secs(20),
    )
    .await;
    let started = s
        .start(json!({"name": "ordinary-work", "steps": steps}))
        .await;
    let report = s.passed_report(&started.session_id).await;
    eprintln!(
        "as {who}: {}",
        &line[line.find("the agent's").unwrap_or(0)..]
    );
    for step in report["steps"].as_array().unwrap() {
        eprintln!(
            "as {who}: step {} passed: {:?}",
            step["index"],
            step["output"]
                .as_str()
                .unwrap_or_default()
                .lines()
                .last()
                .unwrap_or_default()
        );
    }
}

// ---------------------------------------------------------------------------
// 3. What serve says
// ---------------------------------------------------------------------------

/// With no Landlock (forced) and several sessions at once, `serve` does not
/// start and names the fixes; with `auto` it starts and says the shell is
/// NOT confined; with the sandbox its start-up line and `/readyz` say what
/// is enforced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_or_says_what_the_sandbox_enforces() {
    use envworker::webhook::SigningKey;
    // No Landlock, two at once: no start.
    let (_key, secret) = SigningKey::generate();
    let work = tempfile::tempdir_in(temp_base()).unwrap();
    let state = tempfile::tempdir_in(temp_base()).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_envworker"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--max-concurrent-items",
            "2",
        ])
        .env_remove("RUST_LOG")
        .envs([
            ("ENVWORKER_SANDBOX_FORCE_UNAVAILABLE", "landlock"),
            ("ANTHROPIC_BASE_URL", "http://127.0.0.1:9"),
            ("ANTHROPIC_ENVIRONMENT_ID", "env_refused"),
            ("ANTHROPIC_ENVIRONMENT_KEY", "sk-ant-envkey-dev-refused"),
            ("ANTHROPIC_WEBHOOK_SIGNING_KEY", secret.as_str()),
            ("ENVWORKER_WORKDIR", work.path().to_str().unwrap()),
            ("ENVWORKER_STATE_DIR", state.path().to_str().unwrap()),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = crate::common::process::collect_stderr(&mut child);
    let until = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(100));
    let message = stderr.lock().unwrap().clone();
    eprintln!("serve without Landlock, 2 at once: {status:?}\n{message}");
    let status = status.expect("serve started without Landlock and with 2 sessions at once");
    assert!(!status.success(), "{message}");
    for part in ["Landlock", "--max-concurrent-items", "--shell-sandbox off"] {
        assert!(
            message.contains(part),
            "the refusal names {part}: {message}"
        );
    }

    let http = reqwest::Client::new();
    let readyz = |s: &Stack| {
        let url = format!("{}/readyz", s.serve.url);
        let http = http.clone();
        async move {
            let body: Value = http.get(url).send().await.unwrap().json().await.unwrap();
            body["endpoints"]["default"]["shell_sandbox"].clone()
        }
    };

    // `auto` without Landlock: it starts, and says so.
    let s = stack_with_options(
        &["--shell-sandbox", "auto", "--max-concurrent-items", "2"],
        options(
            ServeUser::default(),
            &[("ENVWORKER_SANDBOX_FORCE_UNAVAILABLE", "landlock")],
        ),
    )
    .await;
    let line = logged(
        &s,
        "the agent's shell is NOT confined",
        Duration::from_secs(20),
    )
    .await;
    eprintln!("auto without Landlock: {line}");
    let described = readyz(&s).await;
    assert_eq!(described["mode"], "off", "{described}");
    drop(s);

    // The sandbox: said once, and in /readyz; as a non-root user and (when
    // the tests run as root) as root.
    if envworker::sandbox::probe::landlock_abi() == 0 {
        eprintln!("the enforced half: SKIPPED, this kernel has no Landlock");
        return;
    }
    let mut users = vec![ServeUser::nobody_if_root()];
    if users[0].ids.is_some() {
        users.push(ServeUser {
            ids: None,
            only_stdio: true,
            leaked_fd: None,
        });
    }
    let mut failures = Vec::new();
    for user in users {
        let k = kernel(user);
        let who = match user.ids {
            Some((uid, _)) => format!("uid {uid}"),
            None => format!("uid {}", rustix::process::geteuid().as_raw()),
        };
        // What serve's probe runs: the supervisor in namespace-only mode.
        let mut probe = Command::new(env!("CARGO_BIN_EXE_envworker"));
        probe
            .args([
                envworker::cleanroom::SUPERVISE,
                envworker::sandbox::NAMESPACE_PROBE,
            ])
            .env_clear()
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        user.apply(&mut probe);
        let probed = probe.status().is_ok_and(|st| st.success());
        eprintln!(
            "as {who}: `unshare -Urm true` {}, `envworker {} {}` {}",
            if k.namespaces { "succeeds" } else { "fails" },
            envworker::cleanroom::SUPERVISE,
            envworker::sandbox::NAMESPACE_PROBE,
            if probed { "succeeds" } else { "fails" },
        );
        if k.namespaces && !probed {
            failures.push(format!(
                "as {who}: the kernel gives this user a user+mount namespace (`unshare -Urm true`), \
                 but serve's namespace probe (`envworker __supervise --probe-namespace`) fails: \
                 every session shares /tmp, /dev/shm and the host's /mnt/memory"
            ));
        }
        let s = stack_with_options(&["--max-concurrent-items", "2"], options(user, &[])).await;
        let line = logged(
            &s,
            "the agent's shell is sandboxed",
            Duration::from_secs(20),
        )
        .await;
        eprintln!("as {who}: the sandbox's start-up line: {line}");
        let tmp = if k.namespaces { "private" } else { "shared" };
        if !(line.contains(&format!("tmp={tmp}")) || line.contains(&format!("tmp=\"{tmp}\""))) {
            failures.push(format!(
                "as {who}: namespaces {}: want tmp={tmp} in {line}",
                k.namespaces
            ));
        }
        let described = readyz(&s).await;
        eprintln!("as {who}: /readyz shell_sandbox: {described}");
        let want = json!({"mode": "enforced", "tmp": tmp, "namespaces": k.namespaces,
            "scopes": k.abi >= 6, "landlock_abi": k.abi, "file_system": true});
        for (field, value) in want.as_object().unwrap() {
            if &described[field] != value {
                failures.push(format!(
                    "as {who}: /readyz shell_sandbox.{field} is {}, want {value}: {described}",
                    described[field]
                ));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------
// 4. One mount path, two live sessions
// ---------------------------------------------------------------------------

/// A session that writes `who` into its store `name` (at
/// `/mnt/memory/<slug>`), says where it works, waits to be released, then
/// reads the store back — its own file, whoever else wrote at that path.
fn shared_store_session(name: &str, who: &str, wait: bool, own_view: bool) -> Value {
    let mut steps = vec![bash(
        format!("echo {who} > {{mount:s}}/who.md && echo \"WD=$PWD\" && echo \"at={{mount:s}}\""),
        json!({"contains": "at=/mnt/memory/"}),
    )];
    if wait {
        steps.push(wait_for_release());
    }
    // With its own mount namespace, also the path as the shell resolves it
    // past the text remap of the advertised path: the namespace's view.
    let (read, want) = if own_view {
        (
            "p=/mnt/mem; cat {mount:s}/who.md; cat ${p}ory/\"$(basename {mount:s})\"/who.md; ls {mount:s}",
            format!("{who}\n{who}\n"),
        )
    } else {
        ("cat {mount:s}/who.md; ls {mount:s}", format!("{who}\n"))
    };
    steps.push(bash(
        read,
        json!({"contains": want, "not_contains": if who == "one" { "two" } else { "one" }}),
    ));
    json!({
        "name": format!("shared-{who}"),
        "memory_stores": [{"key": "s", "name": name, "memories": {"/seed.md": "seed\n"}}],
        "steps": steps,
        "expect_final": {"s": {"/seed.md": "seed\n", "/who.md": format!("{who}\n")}},
    })
}

/// Two live sessions attach a store at the same mount path
/// (`/mnt/memory/<slug>`: two stores of one name — a scenario cannot attach
/// another scenario's store): with namespaces both are served at once,
/// each seeing its own folder there; without, the second is handed back
/// (never failed) while the first holds the path, and served once it ends.
/// Runs as the tests' own user: each session's own `/mnt/memory` needs the
/// mount point `/mnt/memory` (root's here); the exploit suite covers a
/// non-root worker's store folders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_mount_path_two_live_sessions() {
    let user = ServeUser::default();
    let k = kernel(user);
    if k.abi == 0 {
        eprintln!("skipped: this kernel has no Landlock");
        return;
    }
    let begun = Instant::now();
    let name = format!("shared-{}", tag());
    let _cleanup = Cleanup(PathBuf::from("/mnt/memory").join(&name));

    // With namespaces (when the kernel has them): both at once.
    if k.namespaces {
        assert!(
            std::fs::create_dir_all("/mnt/memory").is_ok(),
            "each session's own /mnt/memory needs the directory /mnt/memory (create it, or run as root)"
        );
        let mut opts = options(user, &[]);
        opts.mount_root = Some("/mnt/memory".into());
        let s = stack_with_options(&["--max-concurrent-items", "2"], opts).await;
        let one = s
            .start(shared_store_session(&name, "one", true, true))
            .await;
        let one_out = step_output(&s, &one.session_id, 0, Duration::from_secs(30)).await;
        let two = s
            .start(shared_store_session(&name, "two", false, true))
            .await;
        // Two has written and read back its own file while one holds the path.
        let two_report = s.passed_report(&two.session_id).await;
        release(Path::new(&field(&one_out, "WD")));
        let one_report = s.passed_report(&one.session_id).await;
        eprintln!(
            "with namespaces: both served at {}: one {}, two {}",
            one_report["stores"]["s"]["mount_path"], one_report["status"], two_report["status"]
        );
        assert!(!s.serve.logs().contains("mount path is in use"));
        eprintln!("with namespaces: {:.1}s", begun.elapsed().as_secs_f64());
    } else {
        eprintln!("with namespaces: SKIPPED, `unshare -Urm` is refused here (the probe says so)");
    }

    // Without: the second is handed back until the first ends.
    let remap_dir = user_dir(user);
    let remap = format!("/mnt/memory={}", remap_dir.path().display());
    let mut opts = options(
        user,
        &[("ENVWORKER_SANDBOX_FORCE_UNAVAILABLE", "namespaces")],
    );
    opts.mount_root = Some("/mnt/memory".into());
    opts.lease_ttl_seconds = Some(3);
    let s = stack_with_options(
        // The handed-back item returns to the queue when its lease lapses
        // (3 s here); an idle replica finds it at its next queue check
        // (every 30 s by default, 1 s here), no webhook re-delivered.
        &[
            "--max-concurrent-items",
            "2",
            "--mount-remap",
            &remap,
            "--queue-check-interval",
            "1s",
        ],
        opts,
    )
    .await;
    let line = logged(
        &s,
        "the agent's shell is sandboxed",
        Duration::from_secs(20),
    )
    .await;
    assert!(line.contains("shared"), "{line}");
    let one = s
        .start(shared_store_session(&name, "one", true, false))
        .await;
    let one_out = step_output(&s, &one.session_id, 0, Duration::from_secs(30)).await;
    let two = s
        .start(shared_store_session(&name, "two", false, false))
        .await;
    let handed_back = logged(
        &s,
        "a memory store's mount path is in use by another live session on this replica",
        Duration::from_secs(20),
    )
    .await;
    eprintln!("without namespaces: {handed_back}");
    let report = s.server.scenario_report(&two.session_id).await;
    assert_eq!(
        report["status"], "running",
        "handed back, not failed: {report:#}"
    );
    let state = s
        .server
        .work_state(&one.environment_id, &two.session_id)
        .await;
    assert_ne!(state, "stopped", "the second session's item was stopped");
    release(Path::new(&field(&one_out, "WD")));
    s.passed_report(&one.session_id).await;
    eprintln!(
        "without namespaces: the first session passed at {:.1}s",
        begun.elapsed().as_secs_f64()
    );
    let two_report = s.passed_report(&two.session_id).await;

    eprintln!(
        "without namespaces: the second session served once the first ended ({}), {:.1}s in all",
        two_report["status"],
        begun.elapsed().as_secs_f64()
    );
    assert!(
        !s.serve.logs().contains("level=ERROR") && two_report["status"] == "passed",
        "{}",
        s.serve.logs_tail(40)
    );
}

/// Removes a path when dropped (a store folder a failed run left).
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A descriptor the worker inherited without close-on-exec (a careless
/// parent's) never reaches the agent's shell, sandbox or not: the supervisor
/// closes everything above stderr before it starts the shell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descriptor_the_worker_inherited_never_reaches_the_shell() {
    const LEAKED: i32 = 77;
    let modes: &[&str] = if envworker::sandbox::probe::landlock_abi() > 0 {
        &["off", "require"]
    } else {
        &["off"]
    };
    for mode in modes {
        let user = ServeUser {
            ids: None,
            only_stdio: true,
            leaked_fd: Some(LEAKED),
        };
        let s = stack_with_options(&["--shell-sandbox", mode], options(user, &[])).await;
        assert!(
            std::fs::read_link(format!("/proc/{}/fd/{LEAKED}", s.serve.child.id())).is_ok(),
            "the worker itself holds the leaked descriptor"
        );
        let started = s
            .start(json!({"name": format!("fds-{mode}"), "steps": [
                bash("ls /proc/$$/fd; echo --; ls /proc/self/fd; echo listed", json!({"contains": "listed"})),
            ]}))
            .await;
        let out = step_output(&s, &started.session_id, 0, Duration::from_secs(60)).await;
        assert!(
            !out.lines().any(|l| l.trim() == LEAKED.to_string()),
            "{mode}: the shell or its child holds the worker's inherited descriptor {LEAKED}:\n{out}"
        );
        s.passed_report(&started.session_id).await;
    }
}

/// The pids of `bash` processes below `root` (any depth), from `/proc`.
fn bash_below(root: u32) -> Vec<u32> {
    let parent_of = |pid: u32| -> Option<(u32, String)> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid …`: comm may hold spaces, so split at the last ')'.
        let (head, tail) = stat.rsplit_once(')')?;
        let comm = head.split_once('(')?.1.to_string();
        let ppid = tail.split_whitespace().nth(1)?.parse().ok()?;
        Some((ppid, comm))
    };
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.into_iter()
        .filter(|&pid| {
            let Some((mut up, comm)) = parent_of(pid) else {
                return false;
            };
            if comm != "bash" {
                return false;
            }
            for _ in 0..64 {
                if up == root {
                    return true;
                }
                match parent_of(up) {
                    Some((next, _)) if up > 1 => up = next,
                    _ => return false,
                }
            }
            false
        })
        .collect()
}

/// A confined shell costs more to start, so a sandboxed session starts it
/// while the runner opens its stream, ahead of the first `bash` call; the
/// session ends with it all the same, and a session that never calls `bash`
/// leaves no shell behind. With the sandbox off the shell starts on first
/// use, as the official worker's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confined_shell_starts_ahead_of_the_first_call_and_ends_with_the_session() {
    let modes: &[&str] = if envworker::sandbox::probe::landlock_abi() > 0 {
        &["off", "require"]
    } else {
        &["off"]
    };
    for mode in modes {
        let user = ServeUser {
            ids: None,
            only_stdio: true,
            leaked_fd: None,
        };
        let s = stack_with_options(&["--shell-sandbox", mode], options(user, &[])).await;
        let worker = s.serve.child.id();
        let started = s
            .start(json!({"name": format!("ahead-{mode}"), "steps": [
                {"tool": "write", "input": {"file_path": "notes.txt", "content": "no shell yet\n"}},
                {"wait_ms": 3000},
                {"tool": "read", "input": {"file_path": "notes.txt"}, "expect": {"contains": "no shell yet"}},
            ]}))
            .await;
        step_output(&s, &started.session_id, 0, Duration::from_secs(60)).await;
        // During the wait: a shell below the worker with the sandbox, none without.
        let until = Instant::now() + Duration::from_millis(2500);
        let mut seen = bash_below(worker);
        while seen.is_empty() && *mode == "require" && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
            seen = bash_below(worker);
        }
        match *mode {
            "require" => assert!(
                !seen.is_empty(),
                "require: no shell was started ahead of the first bash call\n{}",
                s.serve.logs_tail(30)
            ),
            _ => assert!(
                seen.is_empty(),
                "off: a shell {seen:?} runs although the session made no bash call (the official worker starts it on first use)"
            ),
        }
        s.passed_report(&started.session_id).await;
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let left = bash_below(worker);
            if left.is_empty() {
                break;
            }
            assert!(
                Instant::now() < until,
                "{mode}: shells {:?} outlived the session (the worker is {worker})\n{}",
                left.iter()
                    .map(|pid| (
                        pid,
                        std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default()
                    ))
                    .collect::<Vec<_>>(),
                s.serve.logs_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A replica's start-up is not slowed by the processes it keeps ahead of
/// its first session: the spare shell supervisor and the sandbox's
/// namespace probe (an `execve` of the binary each) start once its look at
/// the queue at start has ended, or 100 ms after it began when that look
/// takes longer — here an API that accepts and never answers, so only the
/// 100 ms start them. Before, both started beside the start-up and took a
/// core from it (spawn → `/readyz` 200 +0.8 ms, +1.5 ms with the probe, on
/// two cores).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_starts_no_process_of_its_own_before_its_start_up_is_done() {
    use crate::common::serve_stack::{Serve, free_port};
    let api = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", api.local_addr().unwrap());
    // Holds every connection open, unanswered, until the test ends.
    std::thread::spawn(move || {
        let held: Vec<_> = api.incoming().collect();
        drop(held);
    });
    let work = tempfile::tempdir_in(temp_base()).unwrap();
    let (_, secret) = envworker::webhook::SigningKey::generate();
    let spawned = Instant::now();
    let mut serve = Serve::start(
        free_port(),
        &[
            ("ANTHROPIC_BASE_URL", base.as_str()),
            ("ANTHROPIC_ENVIRONMENT_ID", "env_held"),
            ("ANTHROPIC_ENVIRONMENT_KEY", "sk-ant-envkey-held"),
            ("ANTHROPIC_WEBHOOK_SIGNING_KEY", secret.as_str()),
            ("ENVWORKER_WORKDIR", work.path().to_str().unwrap()),
        ],
        // auto: the probe is registered wherever Landlock is.
        &["--shell-sandbox", "auto"],
    );
    let read_at = Instant::now();
    let worker = serve.child.id();
    let children = || -> Vec<i32> {
        envworker::cleanroom::processes()
            .into_iter()
            .filter(|&(_, state, ppid)| ppid as u32 == worker && state != b'Z')
            .map(|(pid, _, _)| pid)
            .collect()
    };
    let said = |logs: &str| logs.contains("the agent's shell is sandboxed");
    // The 100 ms run from the listening line, written after the spawn:
    // nothing may start before `spawned` + 100 ms. Look until 90 ms.
    let window_end = spawned + Duration::from_millis(90);
    let mut looks = 0;
    while Instant::now() < window_end {
        let seen = children();
        assert!(
            seen.is_empty(),
            "processes {seen:?} started while the start-up's look at the queue was still under way\n{}",
            serve.logs()
        );
        assert!(
            !said(&serve.logs()),
            "the namespace probe ran during the start-up (its answer is announced)\n{}",
            serve.logs()
        );
        looks += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        looks > 0 || read_at >= window_end,
        "the window was never looked at"
    );
    // Past the 100 ms, both start although the look never ends.
    let until = Instant::now() + Duration::from_secs(20);
    let landlock = envworker::sandbox::probe::landlock_abi() > 0;
    loop {
        let spare = children().into_iter().any(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.split(|&b| b == 0)
                    .any(|arg| arg == envworker::cleanroom::AWAIT_LAUNCH.as_bytes())
            })
        });
        if spare && (!landlock || said(&serve.logs())) {
            break;
        }
        assert!(
            Instant::now() < until,
            "no spare supervisor (or no probe answer) 20 s after the start (spare: {spare})\n{}",
            serve.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    serve.terminate();
    let _ = serve.wait_exit(Duration::from_secs(20));
}
