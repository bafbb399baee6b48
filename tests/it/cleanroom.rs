//! A clean room per session (issue 15 item 3), end to end: the real
//! `envworker serve` behind an in-process devserver serves scenarios whose
//! agent, from its own `bash`, detaches processes every way it can, leaves
//! files, plants symlinks to the outside, FIFOs and `chmod 000` directories,
//! and reads its parent's environment. After the session nothing of it is
//! left — before the next session on the same worker starts — and nothing
//! outside was touched; a session torn down beside another kills only its
//! own processes; as PID 1 the binary reaps the orphans that reach it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::serve_stack::stack;
use envworker::cleanroom::processes;
use serde_json::{Value, json};

/// A marker unique to this test run, put in `argv[0]` of every process the
/// agent starts (`exec -a`), so `/proc` tells ours from anybody else's.
fn marker(tag: &str) -> String {
    format!(
        "cleanroom-{tag}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// Pids of the live processes whose command line contains `marker`, with
/// their parent pid.
fn processes_with(marker: &str) -> Vec<(i32, i32)> {
    processes()
        .into_iter()
        .filter(|&(pid, state, _)| {
            state != b'Z'
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .map(|(pid, _, ppid)| (pid, ppid))
        .collect()
}

/// Kills, when dropped, whatever still carries the marker (a failing run
/// must not leave `sleep 1000`s behind), and the given pids.
struct Sweep(Vec<String>, Vec<i32>);

impl Drop for Sweep {
    fn drop(&mut self) {
        let kill = |pid: i32| {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        };
        self.1.iter().copied().for_each(kill);
        // Again until none is left: a forking loop may add one meanwhile.
        for _ in 0..50 {
            let marked: Vec<i32> = self
                .0
                .iter()
                .flat_map(|m| processes_with(m))
                .map(|(pid, _)| pid)
                .collect();
            if marked.is_empty() {
                break;
            }
            marked.into_iter().for_each(kill);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Wait (polling) until `done`, at most `bound`.
fn eventually(bound: Duration, mut done: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + bound;
    while Instant::now() < until {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    done()
}

fn bash(command: String, expect: Value) -> Value {
    json!({"tool": "bash", "input": {"command": command}, "expect": expect})
}

/// A shell snippet starting `sleep 1000`s named with `m`, detached every
/// way an agent can: `setsid` + `disown`, `nohup … &`, a double fork (its
/// parent gone at once), another process group (`set -m`), a double fork
/// inside a new session, and a detached loop that keeps forking more.
fn detach_everything(m: &str) -> String {
    let quiet = "</dev/null >/dev/null 2>&1";
    [
        format!("setsid bash -c 'exec -a {m}-setsid sleep 1000' {quiet} & disown"),
        format!("nohup bash -c 'exec -a {m}-nohup sleep 1000' {quiet} &"),
        format!("( ( exec -a {m}-daemon sleep 1000 ) {quiet} & )"),
        format!("bash -c 'set -m; (exec -a {m}-pgrp sleep 1000) {quiet} &'"),
        format!("setsid bash -c '(exec -a {m}-setsid-daemon sleep 1000 &)' {quiet}"),
        // Forking all along, so the teardown races it (named by its script).
        format!(
            "setsid bash -c 'while :; do (exec -a {m}-storm sleep 1000 {quiet} &); sleep 0.01; done' {quiet} & disown"
        ),
        "sleep 0.3; echo started".to_string(),
    ]
    .join("\n")
}

/// A shell condition true while a process named with `m` lives (the
/// `[x]` keeps the grep from matching itself).
fn alive(m: &str) -> String {
    let (first, rest) = m.split_at(1);
    format!("grep -qs '[{first}]{rest}' /proc/[0-9]*/cmdline")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

/// (1) + (2) + (4): one session leaves detached processes, files, symlinks
/// to the outside, a FIFO and `chmod 000` directories; the next session on
/// the same worker starts in a different, empty, private directory, with
/// none of that left, and the outside untouched. The agent's processes see
/// neither the worker's secrets in their own environment nor in their
/// parent's (the supervisor's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_files_and_processes_are_gone_before_the_next_session_starts() {
    // Files: with a fresh directory per item (by default the sessions share
    // the workdir, as the reference's do); processes: always.
    let s = stack(&["--fresh-workdir"]).await;
    let ctl = tempfile::tempdir().unwrap();
    let c = ctl.path().display().to_string();
    let outside = ctl.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("canary"), "alive\n").unwrap();
    let o = outside.display();
    let m = marker("a");
    let _sweep = Sweep(vec![m.clone()], Vec::new());
    let key = s.started_env.1.clone();
    let signing = s.secret.trim_start_matches("whsec_").to_string();

    let a = s
        .start(json!({"name": "leaves-a-mess", "steps": [
            bash(format!("pwd > {c}/a.pwd; stat -c %a . > {c}/a.mode; echo hi > left.txt; \
                          mkdir -p sub/deep; echo x > sub/deep/f; echo ok"), json!({"contains": "ok"})),
            bash(detach_everything(&m), json!({"contains": "started"})),
            bash(format!("ln -s {o} link; ln -s {o}/canary flink; mkdir -p locked/in; touch locked/in/f; \
                          chmod 000 locked/in locked; mkfifo fifo; mkdir -p d/e; ln -s / d/e/root; \
                          ln -s {o} d/e/out; chmod 000 d; echo planted"),
                 json!({"contains": "planted"})),
            // `PATH=` proves each read succeeded (a failed read would pass
            // `not_contains` vacuously).
            bash("{ tr '\\0' '\\n' < /proc/self/environ; tr '\\0' '\\n' < /proc/$PPID/environ; } 2>&1".into(),
                 json!({"not_contains": key, "contains": "PATH="})),
            bash("tr '\\0' '\\n' < /proc/$PPID/environ 2>&1".into(),
                 json!({"not_contains": signing, "contains": "PATH="})),
        ]}))
        .await;
    s.passed_report(&a.session_id).await;
    let a_dir = PathBuf::from(read(&ctl.path().join("a.pwd")));

    // The next session, on the same worker (one item at a time): it runs
    // only once the first one's teardown is done.
    let b = s
        .start(json!({"name": "finds-nothing", "steps": [
            bash(format!("pwd > {c}/b.pwd; ls -A | wc -l > {c}/b.count; \
                          if {}; then echo left > {c}/b.procs; else echo none > {c}/b.procs; fi; \
                          if [ -e {} ]; then echo left > {c}/b.room; else echo gone > {c}/b.room; fi; echo ok",
                         alive(&m), a_dir.display()), json!({"contains": "ok"})),
        ]}))
        .await;
    s.passed_report(&b.session_id).await;
    let b_dir = PathBuf::from(read(&ctl.path().join("b.pwd")));
    let root = s._dirs.1.path().canonicalize().unwrap();

    let survivors = processes_with(&m);
    eprintln!(
        "session A ran in {}, B in {}; A's processes seen by B: {}; A's directory seen by B: {}; \
         A's processes alive now: {}",
        a_dir.display(),
        b_dir.display(),
        read(&ctl.path().join("b.procs")),
        read(&ctl.path().join("b.room")),
        survivors.len()
    );
    assert_eq!(
        read(&ctl.path().join("b.procs")),
        "none",
        "A's processes outlived it"
    );
    assert!(
        survivors.is_empty(),
        "A's processes outlived it: {survivors:?}"
    );
    assert_ne!(a_dir, b_dir, "both sessions ran in the same directory");
    assert_eq!(
        read(&ctl.path().join("b.room")),
        "gone",
        "A's directory was left"
    );
    assert_eq!(
        read(&ctl.path().join("b.count")),
        "0",
        "B's directory was not empty"
    );
    assert_eq!(read(&ctl.path().join("a.mode")), "700");
    for dir in [&a_dir, &b_dir] {
        assert_eq!(dir.parent().unwrap().canonicalize().unwrap(), root);
    }
    // The planted symlinks were removed, never followed.
    assert_eq!(read(&outside.join("canary")), "alive");
    assert!(std::fs::symlink_metadata(&a_dir).is_err());
    // B's directory goes at its own teardown.
    assert!(
        eventually(Duration::from_secs(15), || std::fs::symlink_metadata(
            &b_dir
        )
        .is_err()),
        "B's directory was left"
    );
}

/// (3): two sessions at once on one worker: the teardown of the first kills
/// its own detached processes and none of the second's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tearing_down_one_session_leaves_a_concurrent_sessions_processes_alone() {
    let s = stack(&["--max-concurrent-items", "2"]).await;
    let (ma, mb) = (marker("one"), marker("two"));
    let _sweep = Sweep(vec![ma.clone(), mb.clone()], Vec::new());
    let start = |m: &str| {
        bash(
            format!(
                "setsid bash -c 'exec -a {m} sleep 1000' </dev/null >/dev/null 2>&1 & disown; sleep 0.2; echo started"
            ),
            json!({"contains": "started"}),
        )
    };
    let wait_for = |cond: String, secs: u32| {
        format!(
            "for i in $(seq {}); do if {cond}; then break; fi; sleep 0.1; done",
            secs * 10
        )
    };
    // A ends once B runs; B watches A's process come and go, then looks at its own.
    let a = s
        .start(json!({"name": "ends-first", "steps": [
            start(&ma),
            bash(format!("{}; echo ok", wait_for(alive(&mb), 30)), json!({"contains": "ok"})),
        ]}))
        .await;
    let b = s
        .start(json!({"name": "runs-on", "steps": [
            start(&mb),
            bash(format!("{}; {}; if {}; then echo A-left; else echo A-gone; fi; \
                          if {}; then echo B-alive; else echo B-killed; fi",
                         wait_for(alive(&ma), 30), wait_for(format!("! {}", alive(&ma)), 45),
                         alive(&ma), alive(&mb)),
                 json!({"contains": "A-gone\nB-alive"})),
        ]}))
        .await;
    s.passed_report(&a.session_id).await;
    s.passed_report(&b.session_id).await;
    assert!(
        eventually(Duration::from_secs(15), || processes_with(&mb).is_empty()),
        "B's own teardown left its process: {:?}",
        processes_with(&mb)
    );
    assert!(processes_with(&ma).is_empty());
}

/// (5): as PID 1 (`unshare --pid --fork --mount-proc`), the binary is init
/// for the worker: no zombie stays, and SIGTERM reaches the worker, which
/// exits cleanly. The orphans come from the `--on-work` command, whose
/// grandchildren lose their parent at once: they re-parent to the worker
/// (a child subreaper), which kills and reaps them once the command exits.
/// Fails where `unshare` is refused, unless `ENVWORKER_SKIP_UNSHARE=1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_pid_1_the_binary_reaps_orphans_and_forwards_sigterm() {
    if !Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        assert!(
            std::env::var_os("ENVWORKER_SKIP_UNSHARE").is_some(),
            "`unshare --pid --fork --mount-proc` is refused here; set ENVWORKER_SKIP_UNSHARE=1 to skip"
        );
        eprintln!("skipped: `unshare --pid --fork --mount-proc` is not allowed here");
        return;
    }
    let server = crate::common::TestServer::start().await;
    let started = server
        .start_scenario(&json!({"name": "pid-1", "steps": [
            bash("echo hi".into(), json!({"contains": "hi"}))]}))
        .await;
    let m = marker("orphan");
    // In a file: the marker must not be in the worker's own arguments.
    let work = tempfile::tempdir().unwrap();
    let script = work.path().join("orphans.sh");
    std::fs::write(
        &script,
        format!("(exec -a {m}-1 sleep 1000 &)\n(exec -a {m}-2 sleep 1000 &)\nsleep 2\nexit 0\n"),
    )
    .unwrap();
    let on_work = format!("bash {} </dev/null >/dev/null 2>&1", script.display());
    let mut unshare = Command::new("unshare")
        .args([
            "--pid",
            "--fork",
            "--mount-proc",
            env!("CARGO_BIN_EXE_envworker"),
        ])
        .args(["poll", "--on-work", &on_work])
        .env_remove("RUST_LOG")
        .envs([
            ("ANTHROPIC_BASE_URL", server.url()),
            ("ANTHROPIC_ENVIRONMENT_ID", started.environment_id.clone()),
            ("ANTHROPIC_ENVIRONMENT_KEY", started.environment_key.clone()),
            ("ENVWORKER_WORKDIR", work.path().display().to_string()),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let unshare_pid = unshare.id() as i32;
    let mut sweep = Sweep(vec![m.clone()], vec![unshare_pid]);
    let child_of = |parent: i32| {
        processes()
            .into_iter()
            .find(|&(_, _, ppid)| ppid == parent)
            .map(|(pid, _, _)| pid)
    };
    let (mut init, mut worker) = (None, None);
    assert!(
        eventually(Duration::from_secs(10), || {
            init = child_of(unshare_pid);
            worker = init.and_then(child_of);
            worker.is_some()
        }),
        "no PID 1 and worker under unshare"
    );
    let (init, worker) = (init.unwrap(), worker.unwrap());
    sweep.1.push(init);
    // The orphans land on the worker …
    assert!(
        eventually(Duration::from_secs(20), || {
            let p = processes_with(&m);
            p.len() == 2 && p.iter().all(|&(_, ppid)| ppid == worker)
        }),
        "the orphans never reached the worker: {:?}",
        processes_with(&m)
    );
    // … which kills them once the command exits, and no zombie stays.
    assert!(
        eventually(Duration::from_secs(15), || processes_with(&m).is_empty()),
        "the orphans outlived the --on-work command: {:?}",
        processes_with(&m)
    );
    let zombies = || {
        processes()
            .into_iter()
            .filter(|&(_, state, ppid)| (ppid == init || ppid == worker) && state == b'Z')
            .count()
    };
    let reaped = eventually(Duration::from_secs(5), || zombies() == 0);
    eprintln!(
        "zombies under PID 1 and the worker after the sweep: {}",
        zombies()
    );
    let _ = Command::new("kill")
        .args(["-TERM", &init.to_string()])
        .status();
    let mut status = None;
    let exited = eventually(Duration::from_secs(15), || {
        status = unshare.try_wait().unwrap();
        status.is_some()
    });
    if !exited {
        let _ = Command::new("kill")
            .args(["-KILL", &init.to_string()])
            .status();
        let _ = unshare.kill();
    }
    let _ = unshare.wait();
    assert!(reaped, "zombies stayed under PID 1 or the worker");
    assert!(exited, "SIGTERM to PID 1 did not end the worker");
    eprintln!("exit status after SIGTERM: {status:?}");
    assert!(
        status.is_some_and(|s| s.success()),
        "the worker did not exit cleanly on SIGTERM: {status:?}"
    );
}

/// Without the supervisor binary (the library embedded in another
/// program), the shell itself is the subreaper: dropping the toolset still
/// kills what the agent detached while the shell lived.
#[tokio::test]
async fn without_a_supervisor_the_shell_is_the_subreaper() {
    let m = marker("lib");
    let _sweep = Sweep(vec![m.clone()], Vec::new());
    let t = crate::common::toolbox::T::new();
    let out = t
        .call("bash", json!({"command": detach_everything(&m)}))
        .await
        .unwrap();
    assert!(out.contains("started"), "{out}");
    assert!(
        eventually(Duration::from_secs(5), || processes_with(&m).len() >= 6),
        "{:?}",
        processes_with(&m)
    );
    drop(t);
    assert!(
        eventually(Duration::from_secs(5), || processes_with(&m).is_empty()),
        "left: {:?}",
        processes_with(&m)
    );
}

/// Review item 1: the agent kills its own supervisor (`kill -9 $PPID`)
/// after detaching a process, so the process would re-parent to init and
/// outlive every teardown. The worker is a child subreaper: the orphan
/// lands on it, and the session's teardown kills it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_its_own_supervisor_does_not_let_a_process_escape() {
    let s = stack(&[]).await;
    let m = marker("escape");
    let _sweep = Sweep(vec![m.clone()], Vec::new());
    let a = s
        .start(json!({"name": "kills-its-supervisor", "steps": [
            bash(format!("setsid bash -c 'exec -a {m} sleep 1e9' </dev/null >/dev/null 2>&1 & disown; \
                          sleep 0.2; kill -9 $PPID; sleep 0.2; echo ok"),
                 json!({"contains": "ok"})),
        ]}))
        .await;
    s.passed_report(&a.session_id).await;
    let gone = eventually(Duration::from_secs(10), || processes_with(&m).is_empty());
    eprintln!(
        "escaped processes alive after the teardown: {:?}",
        processes_with(&m)
    );
    assert!(gone, "the detached process escaped the teardown");
    // The teardown said so: a process was alive outside its session's tree.
    assert!(
        eventually(Duration::from_secs(10), || s
            .serve
            .logs()
            .contains("killed processes that escaped their session")),
        "{}",
        s.serve.logs_tail(30)
    );
}

/// The shell's own tree, killed at the session's end, is no escape: its
/// processes reach the worker (the subreaper) already dead, once their
/// supervisor is gone, and are reaped without a word. Before, every
/// session's end logged "killed processes that escaped their session
/// processes=1" for its own dead shell, and operators grep that line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_own_dead_shell_is_not_reported_as_an_escape() {
    let s = stack(&[]).await;
    for name in ["first", "second"] {
        let a = s
            .start(json!({"name": name, "steps": [
                bash("echo ok".into(), json!({"contains": "ok"})),
            ]}))
            .await;
        s.passed_report(&a.session_id).await;
    }
    assert!(
        eventually(Duration::from_secs(10), || s
            .serve
            .logs()
            .matches("work item done")
            .count()
            == 2),
        "{}",
        s.serve.logs_tail(30)
    );
    let logs = s.serve.logs();
    assert!(
        !logs.contains("escaped their session"),
        "a session's own shell was reported as an escape:\n{}",
        s.serve.logs_tail(30)
    );
}

/// Review item 2: with no time left for the freeze, [`kill_tree`] still
/// sends every process one `SIGKILL` (it used to end with the whole tree
/// frozen and never killed).
#[test]
fn kill_tree_kills_even_with_no_time_to_freeze() {
    use envworker::cleanroom::{descendants, kill_tree};
    let m = marker("nobudget");
    let _sweep = Sweep(vec![m.clone()], Vec::new());
    let mut parent = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "for i in 1 2 3 4; do (exec -a {m} sleep 1000) & done; wait"
        ))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let root = rustix::process::Pid::from_raw(parent.id() as i32).unwrap();
    assert!(eventually(Duration::from_secs(5), || descendants(root)
        .len()
        == 4));
    kill_tree(root, false, false, Duration::ZERO);
    let gone = eventually(Duration::from_secs(5), || descendants(root).is_empty());
    eprintln!(
        "left after kill_tree with a zero bound: {:?}",
        descendants(root)
    );
    let _ = parent.kill();
    let _ = parent.wait();
    assert!(gone, "kill_tree left the tree frozen, not killed");
}

/// Review item 5: the session directories a SIGKILLed worker left (its
/// lock gone with it), and `trash-*` ones whose background removal it did
/// not finish, are removed when the next worker on the same root starts
/// with fresh directories; a session directory another live worker holds
/// stays, and a worker whose sessions share the workdir touches none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_workers_rooms_are_removed_at_the_next_start_and_a_live_one_kept() {
    let s = stack(&[]).await;
    let root = s._dirs.1.path().to_path_buf();
    let plant = |name: &str| {
        let dir = root.join(name);
        std::fs::create_dir_all(dir.join("deep/er")).unwrap();
        std::fs::write(dir.join("deep/er/f"), "x").unwrap();
        dir
    };
    let (dead, trash, live) = (
        plant("session-deadworker"),
        plant("trash-unfinished"),
        plant("session-liveworker"),
    );
    // A worker holds its session directory's lock while it lives: `flock`
    // stands in for it; the dead one is SIGKILLed.
    let hold = |dir: &Path| {
        // The lock's holder is the very process spawned (`exec`).
        Command::new("bash")
            .arg("-c")
            .arg(r#"exec 9<"$0" && flock -n 9 && exec sleep 1000"#)
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut dead_holder = hold(&dead);
    let mut live_holder = hold(&live);
    let _sweep = Sweep(
        Vec::new(),
        vec![dead_holder.id() as i32, live_holder.id() as i32],
    );
    std::thread::sleep(Duration::from_millis(300));
    dead_holder.kill().unwrap();
    dead_holder.wait().unwrap();
    // A worker whose sessions share the workdir leaves every `session-*`
    // and `trash-*` there alone: they are the operator's files.
    let (mut sharing, _stderr) = s.poller(&[]);
    std::thread::sleep(Duration::from_millis(1500));
    let untouched = dead.exists() && trash.exists();
    let _ = sharing.kill();
    let _ = sharing.wait();
    assert!(untouched, "a worker with a shared workdir swept it");
    let (mut poller, _stderr) = s.poller(&["--fresh-workdir"]);
    let removed = eventually(Duration::from_secs(10), || {
        !dead.exists() && !trash.exists()
    });
    std::thread::sleep(Duration::from_millis(300));
    let kept = live.join("deep/er/f").exists();
    eprintln!(
        "after the next worker started: dead worker's room left: {}, trash left: {}, live room kept: {kept}",
        dead.exists(),
        trash.exists()
    );
    let _ = poller.kill();
    let _ = poller.wait();
    let _ = live_holder.kill();
    let _ = live_holder.wait();
    assert!(removed, "a dead worker's session directory was left");
    assert!(kept, "a live worker's session directory was removed");
}

/// The shell sandbox's namespace probe forks the worker (no `execve`): its
/// child must answer as the kernel does (`unshare -Urm`, a user and mount
/// namespace for this user) while other threads allocate all along (a child
/// that allocated could hang on a lock they held at the fork), and the
/// worker's own orphan sweep, running beside it as it does at a session's
/// end, must take the probe's child for the worker's own: neither kill it
/// nor reap its answer. Alone in a process of its own: a subreaper's sweep
/// kills every child it did not start through the worker.
#[test]
fn the_forked_namespace_probe_answers_as_the_kernel_does_beside_allocations_and_sweeps() {
    if !crate::common::runs_alone(
        "cleanroom::the_forked_namespace_probe_answers_as_the_kernel_does_beside_allocations_and_sweeps",
    ) {
        return;
    }
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let Ok(kernel) = Command::new("unshare")
        .args(["-Urm", "true"])
        .stderr(Stdio::null())
        .status()
    else {
        eprintln!("skipped: no unshare(1) to compare with");
        return;
    };
    assert!(envworker::cleanroom::become_subreaper(), "a subreaper");
    let stop = Arc::new(AtomicBool::new(false));
    let (sweeps, swept) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut helpers: Vec<_> = (0..2)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut kept: Vec<Vec<u8>> = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    kept.push(vec![i as u8; 1 + kept.len() * 37 % 8192]);
                    if kept.len() > 512 {
                        kept.clear();
                    }
                }
            })
        })
        .collect();
    helpers.push({
        let (stop, sweeps, swept) = (stop.clone(), sweeps.clone(), swept.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                swept.fetch_add(envworker::cleanroom::sweep_orphans(), Ordering::Relaxed);
                sweeps.fetch_add(1, Ordering::Relaxed);
            }
        })
    });
    let answers: Vec<bool> = (0..300)
        .map(|_| envworker::cleanroom::probe_namespaces())
        .collect();
    stop.store(true, Ordering::Relaxed);
    for h in helpers {
        h.join().unwrap();
    }
    let sweeps = sweeps.load(Ordering::Relaxed);
    eprintln!(
        "unshare -Urm: {kernel}; 300 probes beside {sweeps} sweeps: {} answered {}",
        answers.iter().filter(|&&a| a == kernel.success()).count(),
        kernel.success()
    );
    assert!(sweeps > 0, "the sweep ran beside the probes");
    assert_eq!(swept.load(Ordering::Relaxed), 0, "the sweep killed a probe");
    assert!(
        answers.iter().all(|&a| a == kernel.success()),
        "unshare -Urm: {kernel}; the probe: {answers:?}"
    );
}
