//! The spare shell supervisor (`envworker::tools::spare`), started while the
//! worker is idle so a session's first `bash` call does not wait for our
//! binary to start: it runs the shell exactly as a supervisor started for
//! the session would — in the session's directory, with exactly its
//! launch's environment (nothing of its own), reading nothing of what the
//! shell is to read — and runs nothing when the worker lets it go or sends
//! a malformed launch. End to end, each session's first shell of a `serve`
//! worker runs under one, which holds no secret.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use envworker::cleanroom::{AWAIT_LAUNCH, Launch, SUPERVISE, processes};
use serde_json::json;

use crate::common::serve_stack::stack;

/// A spare as the worker starts one, with `HOME` in its own environment
/// (which the shell must not get unless its launch says so).
fn spare() -> Child {
    Command::new(env!("CARGO_BIN_EXE_envworker"))
        .arg0("envworker")
        .args([SUPERVISE, AWAIT_LAUNCH])
        .env_clear()
        .env("HOME", "/the-spares-own-home")
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the spare starts")
}

/// Wait for `child` (up to 10 s) and read all it printed.
fn finish(mut child: Child) -> (ExitStatus, String) {
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    let out = String::from_utf8_lossy(&out).to_string();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, out);
        }
        assert!(Instant::now() < until, "the spare did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn bash() -> Vec<OsString> {
    ["/bin/bash", "--noprofile", "--norc"]
        .map(OsString::from)
        .to_vec()
}

#[test]
fn a_spare_runs_its_launch_in_its_directory_with_exactly_its_environment() {
    let dir = tempfile::tempdir().unwrap();
    // A space and a byte that is not UTF-8: any byte but NUL passes.
    let mut name = b"the room \xff".to_vec();
    let cwd = {
        let p = dir
            .path()
            .join(OsString::from_vec(std::mem::take(&mut name)));
        std::fs::create_dir(&p).unwrap();
        p
    };
    let launch = Launch {
        cwd: cwd.clone(),
        env: vec![
            ("PATH".into(), std::env::var_os("PATH").unwrap_or_default()),
            ("FOO".into(), "a b\nc=d".into()),
        ],
        args: bash(),
    };
    let mut child = spare();
    let mut stdin = child.stdin.take().unwrap();
    // The commands follow the launch in the same write: the spare must
    // leave every byte after the launch to the shell.
    let mut bytes = launch.encode();
    bytes.extend_from_slice(
        b"pwd; printf '%s|' \"$FOO\"; echo \"${HOME-unset}\"; tr '\\0' '\\n' < /proc/$PPID/cmdline; exit 7\n",
    );
    stdin.write_all(&bytes).unwrap();
    drop(stdin);
    let (status, out) = finish(child);
    let cwd_shown = String::from_utf8_lossy(cwd.as_os_str().as_encoded_bytes()).to_string();
    let want = format!("{cwd_shown}\na b\nc=d|unset\nenvworker\n{SUPERVISE}\n{AWAIT_LAUNCH}\n");
    // `pwd` prints the raw bytes; both sides are read lossily.
    assert_eq!(out, want);
    assert_eq!(
        status.code(),
        Some(7),
        "the supervisor exits with the shell's status"
    );
}

#[test]
fn a_spare_whose_worker_lets_it_go_exits_and_runs_nothing() {
    let mut child = spare();
    drop(child.stdin.take());
    let (status, out) = finish(child);
    assert!(status.success(), "{status:?}");
    assert_eq!(out, "");

    // A launch cut short by the worker's death runs nothing either.
    let mut child = spare();
    let mut stdin = child.stdin.take().unwrap();
    let whole = Launch {
        cwd: "/".into(),
        env: Vec::new(),
        args: bash(),
    }
    .encode();
    stdin.write_all(&whole[..whole.len() - 3]).unwrap();
    drop(stdin);
    let (status, out) = finish(child);
    assert!(status.success(), "{status:?}");
    assert_eq!(out, "");
}

#[test]
fn a_malformed_launch_is_refused_and_runs_nothing() {
    let cases: [(&[u8], &str); 5] = [
        (b"12x\n", "length is malformed"),
        (b"\n", "length is malformed"),
        (b"99999999\necho ran\n", "larger than"),
        (b"4\nabc\0", "no variable count"),
        (b"8\n/\x001\0FOO\0", "has no `=`"),
    ];
    for (bytes, why) in cases {
        let mut child = spare();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(bytes).unwrap();
        stdin.write_all(b"echo ran\n").unwrap();
        drop(stdin);
        let (status, out) = finish(child);
        assert_eq!(status.code(), Some(126), "{bytes:?}: {out}");
        assert!(
            out.contains("cannot start the shell") && out.contains(why),
            "{bytes:?}: {out}"
        );
        assert!(!out.contains("\nran"), "{bytes:?} ran a command: {out}");
    }
    // A directory that is not there: said, nothing run.
    let mut child = spare();
    let mut stdin = child.stdin.take().unwrap();
    let launch = Launch {
        cwd: PathBuf::from("/no/such/room"),
        env: Vec::new(),
        args: bash(),
    };
    stdin.write_all(&launch.encode()).unwrap();
    stdin.write_all(b"echo ran\n").unwrap();
    drop(stdin);
    let (status, out) = finish(child);
    assert_eq!(status.code(), Some(126), "{out}");
    assert!(out.contains("/no/such/room"), "{out}");
}

/// The spare waiting below `worker`, if one is.
fn spare_under(worker: u32) -> Option<i32> {
    processes().into_iter().find_map(|(pid, state, ppid)| {
        (ppid as u32 == worker
            && state != b'Z'
            && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.split(|&b| b == 0)
                    .any(|arg| arg == AWAIT_LAUNCH.as_bytes())
            }))
        .then_some(pid)
    })
}

/// Wait (up to 20 s) for the spare the worker starts off its path.
async fn wait_for_spare(worker: u32, before: &str) -> i32 {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(pid) = spare_under(worker) {
            return pid;
        }
        assert!(
            Instant::now() < until,
            "no spare was started before the {before} session"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Each session's first shell on a `serve` worker runs under a spare made
/// while the worker was idle (at start, then after each item, in the
/// background); like any supervisor it holds no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sessions_shell_runs_under_a_spare_started_ahead_which_holds_no_secret() {
    let s = stack(&[]).await;
    let key = s.started_env.1.clone();
    let worker = s.serve.child.id();
    for name in ["first", "second"] {
        // The spare is started off the worker's path: wait until it is there.
        wait_for_spare(worker, name).await;
        let started = s
            .start(json!({"name": name, "steps": [
                {"tool": "bash",
                 "input": {"command": "tr '\\0' ' ' < /proc/$PPID/cmdline; echo; tr '\\0' '\\n' < /proc/$PPID/environ"},
                 "expect": {"contains": format!("{SUPERVISE} {AWAIT_LAUNCH}"), "not_contains": key}},
                {"tool": "bash",
                 "input": {"command": "tr '\\0' '\\n' < /proc/$PPID/environ"},
                 "expect": {"contains": "PATH="}},
            ]}))
            .await;
        s.passed_report(&started.session_id).await;
    }
}

/// Another session's agent (same user) kills the spare while it waits: the
/// next session's shell still starts, under a supervisor started for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spare_killed_while_it_waits_gives_way_to_a_supervisor_started_for_the_session() {
    let s = stack(&[]).await;
    let worker = s.serve.child.id();
    let spare = wait_for_spare(worker, "first").await;
    assert!(
        Command::new("kill")
            .args(["-KILL", &spare.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let until = Instant::now() + Duration::from_secs(10);
    while spare_under(worker) == Some(spare) {
        assert!(
            Instant::now() < until,
            "the killed spare {spare} is still there"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = s
        .start(json!({"name": "after-the-spare-died", "steps": [
            {"tool": "bash",
             "input": {"command": "tr '\\0' ' ' < /proc/$PPID/cmdline"},
             "expect": {"contains": format!("{SUPERVISE} /bin/bash"), "not_contains": AWAIT_LAUNCH}},
            {"tool": "bash", "input": {"command": "echo still here"}, "expect": {"contains": "still here"}},
        ]}))
        .await;
    s.passed_report(&started.session_id).await;
}
