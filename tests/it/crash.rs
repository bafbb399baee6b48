//! The durable commit under SIGKILL (issue 13): the real binary serves a
//! scripted session that edits its memory store, dies by SIGKILL at a named
//! kill point (or at a random moment), and a second worker process on the
//! same disk re-claims the item once its lease expires and ends the session.
//! The server — the source of truth — must then hold every edit that reached
//! the disk before the kill, the remote change nobody local touched (no stale
//! overwrite), and every memory nobody deleted (no spurious remote delete).
//!
//! How a run goes (each run has its own devserver, workdir and state dir, so
//! runs go concurrently):
//! 1. A devserver over real HTTP (lease TTL 3 s) starts [`scenario`]: a store
//!    seeded with memories; the agent creates, modifies (write, edit, bash),
//!    removes (`rm`) and moves files, with two 5.1 s waits so the periodic
//!    sync (`--memory-sync-interval 5s`) runs mid-session; a remote update
//!    of `/remote.md` lands through the API after the worker downloaded it.
//! 2. Worker 1 (`envworker poll`, `ENVWORKER_KILL_AT=<point>:<n>`) serves it
//!    until it kills itself; it must die by signal 9. At that moment the test
//!    reads what reached the disk (the folder) and which tool calls were
//!    emitted and answered (the session's events).
//! 3. Worker 2 (no kill; same `--workdir`, same `ENVWORKER_STATE_DIR`)
//!    re-claims the item and ends the session. The tool call worker 1 left
//!    unanswered is dispatched again by worker 2's runner: on (re)connect it
//!    reads the whole history and runs every call without a result
//!    (`src/session/mod.rs`, `reconcile`; protocol §1.6 "a later reconcile
//!    re-dispatches"). So every step is idempotent in effect (`write`,
//!    `printf >`, `rm -f`, an `edit` whose second run fails without changing
//!    anything) and the session always completes.
//! 4. Against the server: every edit found on disk at the kill is there
//!    (`recovered`, else `lost`); the remote change is intact; the untouched
//!    memories are intact; the removed and the moved-away file are either
//!    gone (the delete reached the server) or back with their original
//!    content — never anything else; no other memory exists; every scenario
//!    step passed.
//!
//! Kill points: a clean census run first (worker with
//! `ENVWORKER_KILL_TRACE`, no kill) counts how often each point of
//! [`POINTS`] is reached; the kill runs then aim at `n` spread over
//! `1..=count` of each point; a tenth are chained (worker 1 dies at
//! `tool.done`, worker 2 dies too while it re-claims and recovers, worker 3
//! ends the session); the rest of the budget are kills at a seeded random
//! moment. Every configured point must have been reached in the census and
//! must have killed a worker in at least one run (its trace's last line
//! names it), so a renamed point fails the test instead of making it
//! vacuous; and at least 50 kills must have happened.
//!
//! Environment:
//! - `ENVWORKER_CRASH_RUNS` — kill runs (default 60: about two minutes on
//!   2 cores). Raise it for a longer probe, e.g. 400.
//! - `ENVWORKER_CRASH_JOBS` — runs at once (default 8).
//! - `ENVWORKER_CRASH_SEED` — seed of the random kill moments (default 13;
//!   printed with the table).
//! - `ENVWORKER_CRASH_POINTS` — a comma-separated subset of [`POINTS`] (e.g.
//!   `tool.done` while the memory points are not in the build yet).
//!
//! `cargo test --test it crash:: -- --nocapture` prints the table (point, n,
//! killed?, edits made / recovered / lost, problems) and the totals.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::process::collect_stderr;
use crate::common::{ADMIN_KEY, Started, TestServer, env_count};
use envworker::devserver::DevserverConfig;
use futures::StreamExt;
use serde_json::{Value, json};

/// Every kill point the worker has (or is getting) on the way of a memory
/// edit: after a tool's effect reached the disk, mid-scan, after the server
/// committed an upload / a delete the worker has not recorded yet, after a
/// pulled memory was written, mid-append of a journal record (a torn tail),
/// a journal snapshot not yet renamed, and the teardown flush's start.
const POINTS: [&str; 9] = [
    "tool.done",
    "memory.scan.file",
    "memory.upload.landed",
    "memory.delete.landed",
    "memory.pull.written",
    "memory.journal.append",
    "memory.journal.snapshot",
    "memory.flush.start",
    "memory.dispose.removing",
];

/// The lease TTL: how soon worker 2 may re-claim a dead worker's item.
const LEASE_TTL_SECONDS: i64 = 3;
/// A run that has not ended by then is stuck (reported, not waited for).
const RUN_DEADLINE: Duration = Duration::from_secs(150);
/// A tool step's wait for its result: longer than a re-claim takes.
const STEP_TIMEOUT_MS: u64 = 120_000;

/// The memories the store starts with.
const SEED: [(&str, &str); 10] = [
    ("/keep1.md", "keep one\n"),
    ("/keep2.md", "keep two\n"),
    ("/dir/keep3.md", "keep three\n"),
    ("/remote.md", "remote one\n"),
    ("/edit.md", "edit original\n"),
    ("/edit2.md", "second original\n"),
    ("/bash.md", "bash one\n"),
    ("/rm.md", "rm original\n"),
    ("/move-from.md", "moved\n"),
    ("/ignored-by-agent.md", "nobody touches this\n"),
];

/// The remote update made through the API mid-session.
const REMOTE: (&str, &str) = ("/remote.md", "remote two\n");

/// One edit the agent makes: the tool step's index among the tool steps, the
/// path it changes and the content it leaves (`None`: removed).
struct Edit {
    tool_index: usize,
    path: &'static str,
    after: Option<&'static str>,
}

/// The agent's edits, in order. Each changes one path no other step touches
/// (the move touches two: both listed).
const EDITS: [Edit; 10] = [
    Edit {
        tool_index: 0,
        path: "/new1.md",
        after: Some("new one\n"),
    },
    Edit {
        tool_index: 1,
        path: "/edit.md",
        after: Some("edit changed\n"),
    },
    Edit {
        tool_index: 2,
        path: "/bash.md",
        after: Some("bash two\n"),
    },
    Edit {
        tool_index: 3,
        path: "/rm.md",
        after: None,
    },
    Edit {
        tool_index: 4,
        path: "/sub/deep.md",
        after: Some("deep\n"),
    },
    Edit {
        tool_index: 5,
        path: "/new2.md",
        after: Some("new two\n"),
    },
    Edit {
        tool_index: 6,
        path: "/move-from.md",
        after: None,
    },
    Edit {
        tool_index: 6,
        path: "/move-to.md",
        after: Some("moved\n"),
    },
    Edit {
        tool_index: 7,
        path: "/edit2.md",
        after: Some("second changed\n"),
    },
    Edit {
        tool_index: 8,
        path: "/late.md",
        after: Some("late\n"),
    },
];

/// The scripted session. Every step is idempotent in effect, because the
/// call a dead worker left unanswered runs again on the next worker.
fn scenario() -> Value {
    let tool = |name: &str, input: Value| json!({"tool": name, "input": input, "timeout_ms": STEP_TIMEOUT_MS});
    let bash = |command: &str| tool("bash", json!({"command": command}));
    json!({
        "name": "crash",
        "memory_stores": [{"key": "notes", "name": "Notes", "access": "read_write",
                           "memories": SEED.iter().map(|(p, c)| (p.to_string(), json!(c)))
                               .collect::<serde_json::Map<_, _>>()}],
        "steps": [
            tool("write", json!({"file_path": "{mount:notes}/new1.md", "content": "new one\n"})),
            tool("edit", json!({"file_path": "{mount:notes}/edit.md",
                                "old_string": "edit original", "new_string": "edit changed"})),
            bash("printf 'bash two\\n' > {mount:notes}/bash.md"),
            {"remote": {"op": "update", "store": "notes", "path": REMOTE.0, "content": REMOTE.1}},
            {"wait_ms": 5100},
            bash("rm -f {mount:notes}/rm.md"),
            tool("write", json!({"file_path": "{mount:notes}/sub/deep.md", "content": "deep\n"})),
            tool("write", json!({"file_path": "{mount:notes}/new2.md", "content": "new two\n"})),
            bash("if [ -e {mount:notes}/move-from.md ]; then mv -f {mount:notes}/move-from.md {mount:notes}/move-to.md; fi"),
            {"wait_ms": 5100},
            tool("edit", json!({"file_path": "{mount:notes}/edit2.md",
                                "old_string": "second original", "new_string": "second changed"})),
            bash("printf 'late\\n' > {mount:notes}/late.md"),
            {"tool": "read", "input": {"file_path": "{mount:notes}/remote.md"},
             "expect": {"contains": "remote two"}, "timeout_ms": STEP_TIMEOUT_MS},
        ],
    })
}

/// Where a worker dies.
#[derive(Debug, Clone)]
enum Kill {
    /// No kill: the census run, and the last worker of every run.
    None,
    /// `ENVWORKER_KILL_AT=point:n`.
    At(&'static str, u64),
    /// The test sends SIGKILL this long after the worker started.
    After(Duration),
}

impl Kill {
    fn point(&self) -> &'static str {
        match self {
            Kill::None => "(census)",
            Kill::At(p, _) => p,
            Kill::After(_) => "random",
        }
    }

    fn label(&self) -> String {
        match self {
            Kill::None => "(census)".into(),
            Kill::At(p, n) => format!("{p}:{n}"),
            Kill::After(d) => format!("random:{}ms", d.as_millis()),
        }
    }
}

/// What one run showed.
#[derive(Debug)]
struct Outcome {
    /// Worker 1's kill, then (a chained run) worker 2's.
    kills: Vec<Kill>,
    /// Per planned kill: that worker died by signal 9.
    killed: Vec<bool>,
    /// Per planned kill: the last kill point that worker reached (its
    /// trace's last line) — where a named kill fired.
    last_point: Vec<Option<String>>,
    /// Every kill point worker 1 hit, counted (the census).
    hits: BTreeMap<String, u64>,
    /// Edits that reached the disk before a kill (all of them when there was none).
    made: usize,
    recovered: usize,
    lost: Vec<String>,
    /// Removed or moved-away files back on the server with their content.
    back: usize,
    /// Everything else that went wrong in the run.
    problems: Vec<String>,
    /// What is worth knowing but not wrong (a worker lost its lease).
    notes: Vec<String>,
    took: Duration,
}

impl Outcome {
    fn kill_count(&self) -> usize {
        self.killed.iter().filter(|k| **k).count()
    }

    fn label(&self) -> String {
        if self.kills.is_empty() {
            return Kill::None.label();
        }
        let labels: Vec<String> = self.kills.iter().map(Kill::label).collect();
        labels.join(" > ")
    }
}

/// An `envworker poll` child on the run's workdir and state dir, killed on drop.
struct Worker {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Worker {
    fn spawn(run: &RunDirs, url: &str, started: &Started, name: &str, kill: &Kill) -> Worker {
        let mut command = Command::new(env!("CARGO_BIN_EXE_envworker"));
        command
            .args(["poll", "--workdir"])
            .arg(&run.work)
            .args([
                "--max-idle",
                "1s",
                "--memory-sync-interval",
                "5s",
                "--memory-teardown-bound",
                "10s",
            ])
            .env_remove("ANTHROPIC_WORK_SECRET")
            .env_remove("ENVWORKER_KILL_AT")
            .envs([
                ("ANTHROPIC_BASE_URL", url),
                ("ANTHROPIC_ENVIRONMENT_ID", started.environment_id.as_str()),
                (
                    "ANTHROPIC_ENVIRONMENT_KEY",
                    started.environment_key.as_str(),
                ),
                ("ANTHROPIC_WORKER_ID", name),
                ("RUST_LOG", "info"),
            ])
            // The state dir: by variable, so the same command line works
            // before and after `--state-dir` exists.
            .env("ENVWORKER_STATE_DIR", &run.state)
            .env("ENVWORKER_KILL_TRACE", run.trace(name))
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Kill::At(point, n) = kill {
            command.env("ENVWORKER_KILL_AT", format!("{point}:{n}"));
        }
        let mut child = command.spawn().expect("envworker starts");
        let stderr = collect_stderr(&mut child);
        Worker { child, stderr }
    }

    /// Why the item failed, from its log's "work item failed" line, if it did.
    fn failure(&self) -> Option<String> {
        let text = self.stderr.lock().unwrap();
        let line = text.lines().find(|l| l.contains("work item failed"))?;
        Some(match line.split_once("error=") {
            Some((_, why)) => format!("work item failed: {why}"),
            None => line.to_string(),
        })
    }

    /// Whether it lost a lease (a heartbeat late by a TTL under load): the
    /// item then goes back to the queue while the worker lives on.
    fn lost_a_lease(&self) -> bool {
        let text = self.stderr.lock().unwrap();
        text.lines()
            .any(|l| l.contains("lease lost") || l.contains("lease not extended"))
    }

    fn tail(&self) -> String {
        let text = self.stderr.lock().unwrap();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(8)..].join("\n")
    }

    /// SIGTERM, then SIGKILL after 15 s; the exit status.
    async fn stop(&mut self) -> std::process::ExitStatus {
        if self.child.try_wait().ok().flatten().is_none() {
            let pid = rustix::process::Pid::from_child(&self.child);
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            let deadline = Instant::now() + Duration::from_secs(15);
            while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let _ = self.child.kill();
        self.child.wait().unwrap()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A run's directories: the mount root, the shared workdir and state dir,
/// and each worker's kill trace.
struct RunDirs {
    tmp: tempfile::TempDir,
    work: PathBuf,
    state: PathBuf,
}

impl RunDirs {
    fn new() -> RunDirs {
        let tmp = tempfile::Builder::new()
            .prefix("envworker-crash-")
            .tempdir()
            .unwrap();
        let work = tmp.path().join("work");
        let state = tmp.path().join("state");
        RunDirs { work, state, tmp }
    }

    fn mount_root(&self) -> PathBuf {
        self.tmp.path().join("mnt/memory")
    }

    fn trace(&self, worker: &str) -> PathBuf {
        self.tmp.path().join(format!("{worker}.trace"))
    }

    /// The kill points a worker reached, in order.
    fn hits(&self, worker: &str) -> Vec<String> {
        std::fs::read_to_string(self.trace(worker))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// The scenario's report once final, or `None` while it runs.
async fn final_report(server: &TestServer, session_id: &str) -> Option<Value> {
    let report = server.scenario_report(session_id).await;
    (report["status"] != "running").then_some(report)
}

/// The session's tool calls so far: how many were emitted, and which of
/// them (by order) have a result.
async fn calls(server: &TestServer, session_id: &str) -> (usize, Vec<bool>) {
    let events = server.events(session_id).await;
    let answered: std::collections::HashSet<&str> = events
        .iter()
        .filter(|e| e["type"] == "user.tool_result")
        .filter_map(|e| e["tool_use_id"].as_str())
        .collect();
    let uses: Vec<bool> = events
        .iter()
        .filter(|e| e["type"] == "agent.tool_use")
        .map(|e| answered.contains(e["id"].as_str().unwrap_or_default()))
        .collect();
    (uses.len(), uses)
}

/// Whether the scenario's remote update has been made (its step passed).
async fn remote_done(server: &TestServer, session_id: &str) -> bool {
    server.scenario_report(session_id).await["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| s["kind"] == "remote" && s["status"] == "passed")
}

/// A file's content under the store's folder, `None` when absent.
fn on_disk(root: &Path, path: &str) -> Option<String> {
    std::fs::read_to_string(root.join(path.trim_start_matches('/'))).ok()
}

/// How a worker's stint ended.
enum Stint {
    /// The process exited (a kill: signal 9).
    Exited(std::process::ExitStatus),
    /// The session ended: the scenario's report is final.
    Finished(Value),
    /// The worker gave up on the item, or the run is stuck.
    Failed,
}

/// One run: worker 1 until it dies, (chained) worker 2 until it dies too,
/// then a last worker to the end of the session; then the server's
/// contents against what reached the disk.
async fn run_one(kills: Vec<Kill>) -> Outcome {
    let began = Instant::now();
    let dirs = RunDirs::new();
    let server = TestServer::start_with(
        DevserverConfig::new(ADMIN_KEY)
            .mount_root(dirs.mount_root().to_str().unwrap())
            .lease_ttl_seconds(LEASE_TTL_SECONDS),
    )
    .await;
    let started = server.start_scenario(&scenario()).await;
    let sid = started.session_id.clone();
    let store = server.session_store(&sid).await;
    let loaded = server.scenario_report(&sid).await;
    let mount = PathBuf::from(loaded["stores"]["notes"]["mount_path"].as_str().unwrap());
    let mut outcome = Outcome {
        kills: kills.clone(),
        killed: Vec::new(),
        last_point: Vec::new(),
        hits: BTreeMap::new(),
        made: 0,
        recovered: 0,
        lost: Vec::new(),
        back: 0,
        problems: Vec::new(),
        notes: Vec::new(),
        took: Duration::ZERO,
    };
    let deadline = Instant::now() + RUN_DEADLINE;
    let mut made: Vec<bool> = vec![false; EDITS.len()];
    let mut report = None;
    let stints = kills.iter().cloned().chain([Kill::None]);
    for (i, kill) in stints.enumerate() {
        let name = format!("w{}", i + 1);
        let mut worker = Worker::spawn(&dirs, &server.url(), &started, &name, &kill);
        let spawned = Instant::now();
        let mut polls = 0u64;
        let stint = loop {
            if let Some(status) = worker.child.try_wait().unwrap() {
                break Stint::Exited(status);
            }
            if let Kill::After(at) = kill
                && spawned.elapsed() >= at
            {
                let _ = worker.child.kill();
                continue;
            }
            // The report is an HTTP request: not every turn, so the
            // devservers of concurrent runs stay responsive to heartbeats.
            polls += 1;
            if polls.is_multiple_of(5)
                && let Some(r) = final_report(&server, &sid).await
            {
                break Stint::Finished(r);
            }
            if let Some(line) = worker.failure() {
                outcome.problems.push(format!("{name}: {line}"));
                break Stint::Failed;
            }
            if Instant::now() > deadline {
                outcome.problems.push(format!(
                    "the session did not end within {RUN_DEADLINE:?}; {name}'s log ends:\n{}",
                    worker.tail()
                ));
                break Stint::Failed;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        if worker.lost_a_lease() {
            outcome.notes.push(format!("{name} lost a lease"));
        }
        let trace = dirs.hits(&name);
        if i == 0 {
            for point in &trace {
                *outcome.hits.entry(point.clone()).or_default() += 1;
            }
        }
        let planned = i < kills.len();
        if planned {
            outcome.last_point.push(trace.last().cloned());
            outcome
                .killed
                .push(matches!(&stint, Stint::Exited(s) if s.signal() == Some(9)));
        }
        // What reached the disk before this worker died (or, in a run
        // without a kill, before the session ended): an edit whose result
        // was delivered, or whose call was emitted and whose effect is there
        // now (the call in flight: `tool.done` kills right after it). After
        // the teardown removed the folder, only the delivered ones count.
        let (emitted, answered) = calls(&server, &sid).await;
        let folder = mount.is_dir();
        let counts = matches!(stint, Stint::Exited(_)) || i == 0;
        for (k, e) in EDITS.iter().enumerate().filter(|_| counts) {
            let delivered = answered.get(e.tool_index) == Some(&true);
            let there = on_disk(&mount, e.path).as_deref() == e.after;
            made[k] |= delivered || (folder && e.tool_index < emitted && there);
            // Worker 1's answers vouch for its disk (a later worker may die
            // mid-download, and a delete may be undone: both allowed).
            if i == 0 && folder && delivered && e.after.is_some() && !there {
                outcome.problems.push(format!(
                    "{} was answered but its effect is not on disk after {name} died",
                    e.path
                ));
            }
        }
        match stint {
            Stint::Exited(status) if planned && status.signal() == Some(9) => continue,
            Stint::Exited(status) => {
                outcome.problems.push(format!(
                    "{name} ended with {status}, not by a planned SIGKILL; its log ends:\n{}",
                    worker.tail()
                ));
                break;
            }
            Stint::Finished(r) => {
                report = Some(r);
                worker.stop().await;
                break;
            }
            Stint::Failed => {
                worker.stop().await;
                break;
            }
        }
    }
    if let Some(report) = &report
        && report["status"] != "passed"
    {
        outcome.problems.push(format!(
            "scenario {}: {}",
            report["status"], report["failures"]
        ));
    }

    // The server against what reached the disk.
    let held = server.store_memories(&store).await;
    let original = |path: &str| SEED.iter().find(|(p, _)| *p == path).map(|(_, c)| *c);
    for e in EDITS.iter().zip(&made).filter(|(_, m)| **m).map(|(e, _)| e) {
        outcome.made += 1;
        let now = held.get(e.path).map(String::as_str);
        if now == e.after {
            outcome.recovered += 1;
        } else if e.after.is_none() && now == original(e.path) {
            // A delete not corroborated may come back: nothing is lost.
            outcome.recovered += 1;
            outcome.back += 1;
        } else {
            outcome.lost.push(format!("{} (server: {now:?})", e.path));
        }
    }
    let mut expected: BTreeMap<&str, Option<&str>> =
        SEED.iter().map(|(p, c)| (*p, Some(*c))).collect();
    expected.insert(REMOTE.0, Some(REMOTE.1));
    for e in &EDITS {
        expected.insert(e.path, e.after);
    }
    if report.is_some() {
        for (path, want) in &expected {
            let now = held.get(*path).map(String::as_str);
            let deleted_or_back = want.is_none() && now == original(path);
            if now != *want && !deleted_or_back {
                outcome
                    .problems
                    .push(format!("server {path}: {now:?}, expected {want:?}"));
            }
        }
    } else if remote_done(&server, &sid).await
        && held.get(REMOTE.0).map(String::as_str) != Some(REMOTE.1)
    {
        outcome.problems.push(format!(
            "the remote change was overwritten: {:?}",
            held.get(REMOTE.0)
        ));
    }
    for (path, _) in SEED
        .iter()
        .filter(|(p, _)| !expected.get(p).is_some_and(|w| w.is_none()))
    {
        if !held.contains_key(*path) {
            outcome.problems.push(format!(
                "{path} was deleted remotely, though nobody deleted it"
            ));
        }
    }
    for path in held.keys() {
        if !expected.contains_key(path.as_str()) {
            outcome
                .problems
                .push(format!("unexpected memory on the server: {path}"));
        }
    }
    outcome.took = began.elapsed();
    outcome
}

/// SplitMix64: the seeded random kill moments, reproducible from the seed.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `k` values of `n` spread evenly over `1..=count` (both ends included).
fn spread(count: u64, k: u64) -> Vec<u64> {
    if k >= count {
        return (1..=count).collect();
    }
    let mut ns: Vec<u64> = (0..k)
        .map(|i| 1 + (i * (count - 1) + (k - 1) / 2) / (k - 1).max(1))
        .collect();
    ns.dedup();
    ns
}

/// Kill points a re-claiming worker reaches early — while it recovers the
/// dead worker's folder (scan, push, journal) or re-runs the call in flight.
const SECOND_KILLS: [&str; 6] = [
    "memory.scan.file",
    "memory.upload.landed",
    "memory.journal.append",
    "memory.journal.snapshot",
    "memory.pull.written",
    "tool.done",
];

/// The kill runs within `budget`:
/// - per point the census reached, `n` spread over `1..=count`, handed out
///   one at a time round-robin (a point reached 3 times gets at most 3);
/// - a tenth are chained: worker 1 dies at `tool.done` (unsynced edits on
///   disk), then worker 2 dies while it re-claims (the first hit of a point
///   of [`SECOND_KILLS`], or a random moment 0.5–6 s after it started),
///   and worker 3 ends the session;
/// - the rest (at least an eighth) die at a random moment within the first
///   90 % of the census run's length.
fn plan(
    points: &[&'static str],
    census: &BTreeMap<String, u64>,
    budget: u64,
    seed: u64,
    span: Duration,
) -> Vec<Vec<Kill>> {
    let mut state = seed;
    let mut random_moment = |from: Duration, to: Duration| {
        let span_ms = to.saturating_sub(from).as_millis().max(1) as u64;
        Kill::After(from + Duration::from_millis(splitmix(&mut state) % span_ms))
    };
    let reached = |p: &str| census.get(p).copied().unwrap_or(0);
    let chained = if reached("tool.done") > 0 {
        budget / 10
    } else {
        0
    };
    let mut random = (budget / 8).max(1);
    let named_budget = budget.saturating_sub(random + chained);
    let mut allot: BTreeMap<&str, u64> = BTreeMap::new();
    let mut given = 0;
    loop {
        let before = given;
        for p in points {
            let a = allot.entry(p).or_default();
            if given < named_budget && *a < reached(p) {
                *a += 1;
                given += 1;
            }
        }
        if given == before {
            break;
        }
    }
    random += named_budget - given;
    let mut runs = Vec::new();
    for p in points {
        for n in spread(reached(p), allot.get(p).copied().unwrap_or(0)) {
            runs.push(vec![Kill::At(p, n)]);
        }
    }
    let seconds: Vec<&'static str> = SECOND_KILLS
        .iter()
        .copied()
        .filter(|p| points.contains(p) && reached(p) > 0)
        .collect();
    let firsts = spread(reached("tool.done"), chained);
    for i in 0..chained as usize {
        let first = Kill::At("tool.done", firsts[i % firsts.len()]);
        let second = match seconds.get(i) {
            Some(p) => Kill::At(p, 1),
            None => random_moment(Duration::from_millis(500), Duration::from_secs(6)),
        };
        runs.push(vec![first, second]);
    }
    for _ in 0..random {
        runs.push(vec![random_moment(
            Duration::from_millis(200),
            span.mul_f64(0.9),
        )]);
    }
    runs
}

fn table(outcomes: &[Outcome]) -> String {
    let mut out = format!(
        "{:<48} {:>7} {:<24} {:>5} {:>9} {:>4} {:>4} {:>6}  problems\n",
        "kills (point:n, or a random moment)",
        "killed",
        "last point",
        "made",
        "recovered",
        "lost",
        "back",
        "secs"
    );
    for o in outcomes {
        let killed: Vec<&str> = o
            .killed
            .iter()
            .map(|k| if *k { "yes" } else { "no" })
            .collect();
        let last: Vec<&str> = o
            .last_point
            .iter()
            .map(|p| p.as_deref().unwrap_or("-"))
            .collect();
        out.push_str(&format!(
            "{:<48} {:>7} {:<24} {:>5} {:>9} {:>4} {:>4} {:>6.1}  {}\n",
            o.label(),
            killed.join(","),
            last.join(","),
            o.made,
            o.recovered,
            o.lost.len(),
            o.back,
            o.took.as_secs_f64(),
            o.problems
                .first()
                .or(o.notes.first())
                .map(|p| p.lines().next().unwrap_or_default())
                .unwrap_or_default(),
        ));
    }
    let kills: usize = outcomes.iter().map(Outcome::kill_count).sum();
    let named = outcomes
        .iter()
        .flat_map(|o| o.kills.iter().zip(&o.killed))
        .filter(|(k, killed)| **killed && matches!(k, Kill::At(..)))
        .count();
    let sum = |f: fn(&Outcome) -> usize| outcomes.iter().map(f).sum::<usize>();
    out.push_str(&format!(
        "runs {}, kills {kills} ({named} at a named point, {} at a random moment; {} runs killed twice); edits made {}, recovered {}, lost {}; deletes back {}; runs with problems {}; leases lost {}\n",
        outcomes.len(),
        kills - named,
        outcomes.iter().filter(|o| o.kill_count() == 2).count(),
        sum(|o| o.made),
        sum(|o| o.recovered),
        sum(|o| o.lost.len()),
        sum(|o| o.back),
        outcomes.iter().filter(|o| !o.problems.is_empty()).count(),
        sum(|o| o.notes.len()),
    ));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_any_point_loses_no_edit_that_reached_the_disk() {
    let budget = env_count("ENVWORKER_CRASH_RUNS", 60);
    let jobs = env_count("ENVWORKER_CRASH_JOBS", 8).max(1) as usize;
    let seed = env_count("ENVWORKER_CRASH_SEED", 13);
    let points: Vec<&'static str> = match std::env::var("ENVWORKER_CRASH_POINTS") {
        Ok(list) => POINTS
            .iter()
            .copied()
            .filter(|p| list.split(',').any(|q| q.trim() == *p))
            .collect(),
        Err(_) => POINTS.to_vec(),
    };

    // The census: a clean run counts each point's hits.
    let census = run_one(Vec::new()).await;
    eprintln!(
        "census (no kill, {:.1}s): {:?}",
        census.took.as_secs_f64(),
        census.hits
    );
    assert!(
        census.problems.is_empty() && census.lost.is_empty(),
        "the session fails without any kill: {:#?}",
        census.problems
    );
    let runs = plan(&points, &census.hits, budget, seed, census.took);
    eprintln!("{} kill runs, {jobs} at once, seed {seed}", runs.len());

    let mut outcomes: Vec<Outcome> = futures::stream::iter(runs)
        .map(|kills| async move { tokio::spawn(run_one(kills)).await.unwrap() })
        .buffer_unordered(jobs)
        .collect()
        .await;
    outcomes.sort_by_key(|o| {
        let first = &o.kills[0];
        (
            o.kills.len(),
            POINTS
                .iter()
                .position(|p| *p == first.point())
                .unwrap_or(POINTS.len()),
            match first {
                Kill::At(_, n) => *n,
                Kill::After(d) => d.as_millis() as u64,
                Kill::None => 0,
            },
        )
    });
    outcomes.insert(0, census);
    let table = table(&outcomes);
    eprintln!("{table}");

    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.problems.is_empty() || !o.lost.is_empty())
        .map(|o| {
            format!(
                "{}: lost {:?}; {}",
                o.label(),
                o.lost,
                o.problems.join("; ")
            )
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} runs failed; the first: {}\n{table}",
        failed.len(),
        outcomes.len(),
        failed[0]
    );
    for point in &points {
        let killed_there = outcomes.iter().any(|o| {
            (0..o.killed.len()).any(|i| {
                matches!(o.kills[i], Kill::At(p, _) if p == *point)
                    && o.killed[i]
                    && o.last_point[i].as_deref() == Some(*point)
            })
        });
        assert!(
            killed_there,
            "kill point {point} never killed a worker (census hits: {}): renamed, or not on the way of an edit?\n{table}",
            outcomes[0].hits.get(*point).copied().unwrap_or(0)
        );
    }
    let kills: usize = outcomes.iter().map(Outcome::kill_count).sum();
    assert!(
        kills as u64 >= budget.min(50),
        "only {kills} kills happened; at least {} are wanted\n{table}",
        budget.min(50)
    );
}

/// The plan aims at every point the census reached, never past its count,
/// keeps within the budget, and fills what the points cannot take with
/// random moments.
#[test]
fn the_plan_aims_at_every_reached_point_within_the_budget() {
    let census: BTreeMap<String, u64> = [
        ("tool.done", 10),
        ("memory.scan.file", 60),
        ("memory.upload.landed", 9),
        ("memory.delete.landed", 2),
        ("memory.flush.start", 1),
    ]
    .into_iter()
    .map(|(p, n)| (p.to_string(), n))
    .collect();
    let runs = plan(&POINTS, &census, 60, 13, Duration::from_secs(12));
    assert_eq!(runs.len(), 60);
    let at = |point: &str| -> Vec<u64> {
        runs.iter()
            .filter(|r| r.len() == 1)
            .filter_map(|r| match r[0] {
                Kill::At(p, n) if p == point => Some(n),
                _ => None,
            })
            .collect()
    };
    assert_eq!(at("memory.flush.start"), [1]);
    assert_eq!(at("memory.delete.landed"), [1, 2]);
    let scans = at("memory.scan.file");
    assert!(scans.len() >= 8 && scans[0] == 1 && *scans.last().unwrap() == 60);
    assert!(at("memory.pull.written").is_empty(), "never reached");
    assert_eq!(runs.iter().filter(|r| r.len() == 2).count(), 6);
    let random = runs
        .iter()
        .filter(|r| matches!(r[..], [Kill::After(_)]))
        .count();
    assert!(random >= 7, "{random}");

    // Nothing reached but tool.done (main today): the rest is random.
    let only: BTreeMap<String, u64> = [("tool.done".to_string(), 10)].into();
    let runs = plan(&POINTS, &only, 60, 13, Duration::from_secs(12));
    assert_eq!(runs.len(), 60);
    assert_eq!(spread(10, 3), [1, 6, 10]);
    assert_eq!(spread(3, 8), [1, 2, 3]);
}
