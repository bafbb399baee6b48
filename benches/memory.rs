//! The memory engine next to the official Python SDK's `SessionMemoryStores`,
//! on the same 2,000-memory store (2 KB each) of the same devserver, in the
//! same run: mount (download), a no-op sync right after the mount
//! (`noop_sync`), a no-op sync 5.5 s later after one earlier sync — past the
//! stat cache's 2 s trust margin and the version feed's 5 s overlap window
//! (a fresh process that mounts a store whose newest versions came in one
//! burst of over 1,000 — this one's 2,000 — lists it again in its first
//! 5 s), the state of every periodic sync (`steady_sync`) — and a flush of 2,000 changed files, each with 0 ms and
//! 5 ms of injected server latency.
//!
//! Every measured operation runs in a fresh child process (ours: this binary
//! re-executed with `--child`; the SDK's: `benches/sdk_memory.py`), which
//! reports the operation's wall and CPU time and the process's peak RSS.
//! Prints medians and ratios. Run: `cargo bench --bench memory`.
//!
//! The `sparse` row (ours only) puts a 2 GiB sparse file next to the 2,000
//! memories, runs two syncs and a flush, and compares the peak RSS with the
//! same store without it: a file's size must not drive memory use (target:
//! within 1.2×). `ENVWORKER_BENCH_ROWS` picks rows by name, comma-separated
//! (`mount`, `noop_sync`, `steady_sync`, `flush`, `sparse`, `journal`,
//! `watch`, `idle_syncs`, `edit_latency`, `idle_cpu`); all by default. The
//! `idle_syncs` row (ours only) runs 100 idle syncs back to back after the
//! mount, at 0 and 5 ms, then 100 that are each due for the safety
//! cadences (a full scan of the folder, a full listing of the store), and
//! prints the CPU per sync of an idle session at the default 15 s interval,
//! where the cadences (every 5 minutes) make one sync in 20 such a sync:
//! what an idle session's syncs cost, not one sync. The `watch` row (ours only, also run with
//! `steady_sync`) times the idle sync without the folder watch (every file
//! stat-ed, as before) and with it, and prints the entries each stat-ed.
//!
//! Ours journals each store's sync state as the worker does (the durable
//! commit, `memory::journal`), in a state directory on the disk (not tmpfs,
//! so `fsync` costs what it costs). The `journal` row (ours only) runs the
//! four operations with the journal off and on, at 0 ms latency, and prints
//! the ratio: the journal must not double the cost of a no-op sync.
//!
//! Two rows run the whole worker instead (the release binary's `envworker
//! poll`, as users run it, with max idle 1 s and the memory sync every 5 s)
//! serving a scenario session of the same devserver whose store holds the
//! same 2,000 memories × 2 KB (seeded through the API before the worker
//! starts; a scenario's own seed must fit one 4 MiB request):
//!
//! - `edit_latency`: the scripted agent makes 100 `write` calls, each
//!   rewriting another whole memory, each followed by a 700–1,099 ms pause
//!   (longer than the push's debounce and rate bound, ≈ 0.7 s, so each is
//!   its own edit; spread so the calls fall at every phase of the push's
//!   100 ms tick and the sync interval). For each call: the time from its
//!   `agent.tool_use` recorded (the agent issues it) and from its
//!   `user.tool_result` recorded (the tool returned) to the memory version
//!   holding the new content — all three stamps the devserver's, one clock,
//!   read after the run, so nothing polls while the calls run. p50, p99 and
//!   max at 0 and 5 ms latency on the memory endpoints. The SDK is not run:
//!   it has no change-driven push, so an edit waits for its next periodic
//!   sync: a sync interval at best, and, since no sync runs while the agent
//!   makes no calls (below), until its next call or the session's end.
//! - `idle_cpu`: after one call the agent makes none for a minute; over a
//!   50 s window (ten sync intervals) starting 5 s after that call, the
//!   worker process's CPU time (`/proc/PID/stat`, 10 ms ticks), the context
//!   switches of its threads alive throughout (how often it wakes), and the
//!   API requests it made (counted by two no-op fault rules with a `times`
//!   budget: memory endpoints, every route). Ours at 0 and 5 ms, the SDK's
//!   poller (`benches/sdk_session.py poll`, same interval) at 0 ms. Neither
//!   worker syncs while the agent makes no calls (ours runs the periodic
//!   sync as the session runner's after-call hook), so the figure is what
//!   watching and serving an idle session costs, not a sync's.
//!
//! Run: `ENVWORKER_BENCH_ROWS=edit_latency,idle_cpu cargo bench --bench memory`
//! (about 7 minutes).
//!
//! `ENVWORKER_BENCH_WRAP` runs each of our children under a tool, e.g.
//! `ENVWORKER_BENCH_WRAP="perf record --call-graph dwarf -o /tmp/p.data --"`
//! (the figures then include the tool's overhead).

#[path = "../tests/common/dev_api.rs"]
#[allow(dead_code)]
mod dev_api;
#[path = "../tests/common/process.rs"]
#[allow(dead_code)]
mod process;
#[path = "../tests/common/sdk.rs"]
#[allow(dead_code)]
mod sdk;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dev_api::{DevApi, LoggedChild, percentile, proc_cpu_ms, stamp};
use envworker::api::types::*;
use envworker::api::{Client, Credential};
use envworker::memory::SessionMemoryStores;
use envworker::memory::options::{DeleteMode, SyncInterval};
use futures::StreamExt;
use serde_json::{Value, json};

const MEMORIES: usize = 2_000;
/// The sparse file of the `sparse` row: it costs no disk.
const SPARSE_BYTES: u64 = 2 << 30;
const CONTENT_BYTES: usize = 2_048;
/// How long after the mount the steady syncs start (see the module docs).
const STEADY_AFTER: Duration = Duration::from_millis(5_500);
/// The syncs of the `idle_syncs` row.
const IDLE_SYNCS: usize = 100;
/// The safety cadences (`watch::FULL_SCAN_EVERY`, `feed::FULL_LISTING_EVERY`,
/// crate-private) and the worker's default sync interval (15 s): one sync
/// in this many scans the folder and lists the store whole.
const FULL_SCAN_EVERY_S: u64 = 300;
const SYNCS_PER_SAFETY_SCAN: u64 = FULL_SCAN_EVERY_S / 15;
const ADMIN_KEY: &str = "bench-admin";

#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    wall_ms: f64,
    cpu_ms: f64,
    peak_rss_kb: f64,
    /// Entries the measured sync stat-ed (syncs only).
    examined: f64,
    /// Full scans among the measured syncs (`idle_syncs` only).
    full_scans: f64,
}

fn cpu_ms() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 / 1e6
}

fn peak_rss_kb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0)
}

/// `--child OP URL KEY SESSION_ID WORKDIR NONCE STATE_DIR`: one measured
/// operation of ours; `STATE_DIR` is `off` for no journal.
async fn child(args: &[String]) {
    let (op, url, key, session_id, workdir, nonce, state_dir) = (
        &args[0], &args[1], &args[2], &args[3], &args[4], &args[5], &args[6],
    );
    let state_dir = (state_dir != "off").then(|| std::path::PathBuf::from(state_dir));
    let client = Client::builder(Credential::api_key(key.as_str()))
        .base_url(url.as_str())
        .build()
        .unwrap();
    let session = client.sessions().retrieve(session_id).await.unwrap();
    let mut stores = SessionMemoryStores::new(
        Arc::new(client),
        std::path::Path::new(workdir),
        SyncInterval::every(Duration::from_secs(5)).unwrap(),
        DeleteMode::Enabled,
    )
    .with_state_dir(state_dir.as_deref());
    let (op, watched) = match op.strip_suffix("_nowatch") {
        Some(op) => (op.to_string(), false),
        None => (op.to_string(), true),
    };
    if !watched {
        stores = stores.without_watch();
    }
    // `_scanning`: the safety cadences are due at every sync (each one a
    // full scan of the folder and a full listing of the store, as the
    // cadences' own syncs are).
    let (op, scanning) = match op.strip_suffix("_scanning") {
        Some(op) => (op.to_string(), true),
        None => (op, false),
    };
    if scanning {
        stores = stores.with_safety_cadence(Duration::ZERO);
    }
    let op = &op;
    let (wall, cpu);
    let mut examined = 0;
    let mut full_scans = 0;
    if let Some(with) = op.strip_prefix("sparse_") {
        stores.download(&session).await.unwrap();
        let root = stores.roots()[0].clone();
        if with == "with" {
            std::fs::File::create(root.join("sparse.md"))
                .unwrap()
                .set_len(SPARSE_BYTES)
                .unwrap();
        }
        let (w, c) = (Instant::now(), cpu_ms());
        stores.sync_now().await;
        stores.sync_now().await;
        stores.flush_writes().await;
        (wall, cpu) = (w.elapsed().as_secs_f64() * 1e3, cpu_ms() - c);
    } else if op == "idle_syncs" {
        // The idle syncs of a long session: IDLE_SYNCS of them back to back
        // (with `_scanning`, each the safety cadence's full scan), averaged.
        stores.download(&session).await.unwrap();
        tokio::time::sleep(STEADY_AFTER).await;
        stores.sync_now().await;
        let (w, c) = (Instant::now(), cpu_ms());
        for _ in 0..IDLE_SYNCS {
            let report = stores.sync_now().await;
            examined += report.examined;
            full_scans += report.full_scans;
        }
        let n = IDLE_SYNCS as f64;
        (wall, cpu) = (w.elapsed().as_secs_f64() * 1e3 / n, (cpu_ms() - c) / n);
    } else if op == "mount" {
        let (w, c) = (Instant::now(), cpu_ms());
        stores.download(&session).await.unwrap();
        (wall, cpu) = (w.elapsed().as_secs_f64() * 1e3, cpu_ms() - c);
    } else {
        stores.download(&session).await.unwrap();
        if op == "noop_sync" || op == "steady_sync" {
            if op == "steady_sync" {
                // Past the 2 s trust margin and the feed's 5 s window,
                // after one sync: the state of every periodic sync.
                tokio::time::sleep(STEADY_AFTER).await;
                stores.sync_now().await;
            }
            let (w, c) = (Instant::now(), cpu_ms());
            examined = stores.sync_now().await.examined;
            (wall, cpu) = (w.elapsed().as_secs_f64() * 1e3, cpu_ms() - c);
        } else {
            let root = stores.roots()[0].clone();
            edit_all(&root, nonce);
            let (w, c) = (Instant::now(), cpu_ms());
            stores.flush_writes().await;
            (wall, cpu) = (w.elapsed().as_secs_f64() * 1e3, cpu_ms() - c);
        }
    }
    stores.dispose().await;
    println!(
        "{}",
        json!({"wall_ms": wall, "cpu_ms": cpu, "peak_rss_kb": peak_rss_kb(), "examined": examined, "full_scans": full_scans})
    );
}

fn edit_all(root: &std::path::Path, nonce: &str) {
    use std::io::Write;
    for entry in std::fs::read_dir(root).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            edit_all(&path, nonce);
        } else if !path.ends_with(".anthropic-memory-store") {
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap();
            write!(f, "\nedited {nonce}\n").unwrap();
        }
    }
}

fn run_child(program: &std::path::Path, prefix: &[&str], args: &[String]) -> Sample {
    // `ENVWORKER_BENCH_WRAP="perf record -g -o /tmp/p.data --"` runs our
    // children under a profiler (the SDK's run unwrapped).
    let wrap: Vec<String> = std::env::var("ENVWORKER_BENCH_WRAP")
        .ok()
        .filter(|_| prefix == ["--child"])
        .map(|w| w.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default();
    let mut command = match wrap.split_first() {
        Some((tool, tool_args)) => {
            let mut c = Command::new(tool);
            c.args(tool_args).arg(program);
            c
        }
        None => Command::new(program),
    };
    let out = command
        .args(prefix)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{program:?} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let line = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
    Sample {
        wall_ms: v["wall_ms"].as_f64().unwrap(),
        cpu_ms: v["cpu_ms"].as_f64().unwrap(),
        peak_rss_kb: v["peak_rss_kb"].as_f64().unwrap(),
        examined: v["examined"].as_f64().unwrap_or_default(),
        full_scans: v["full_scans"].as_f64().unwrap_or_default(),
    }
}

/// Clear the devserver's faults, then add `latency_ms` on the memory
/// endpoints (none for 0).
async fn memory_latency(http: &reqwest::Client, url: &str, latency_ms: u64) {
    let faults = format!("{url}/dev/faults");
    let clear = http.delete(&faults).header("x-api-key", ADMIN_KEY);
    clear.send().await.unwrap().error_for_status().unwrap();
    if latency_ms > 0 {
        let rule = json!({"rules": [{"path": "/v1/memory_stores/*", "latency_ms": latency_ms}]});
        let add = http
            .post(&faults)
            .header("x-api-key", ADMIN_KEY)
            .json(&rule);
        add.send().await.unwrap().error_for_status().unwrap();
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs[xs.len() / 2]
}

fn medians(samples: &[Sample]) -> Sample {
    Sample {
        wall_ms: median(samples.iter().map(|s| s.wall_ms).collect()),
        cpu_ms: median(samples.iter().map(|s| s.cpu_ms).collect()),
        peak_rss_kb: median(samples.iter().map(|s| s.peak_rss_kb).collect()),
        examined: median(samples.iter().map(|s| s.examined).collect()),
        full_scans: median(samples.iter().map(|s| s.full_scans).collect()),
    }
}

// ------------------------------------------------------------ worker rows

/// The worker rows' sync interval, for ours and the SDK's: the shortest
/// the worker accepts (the default is 15 s), so the idle window holds the
/// most syncs and the push shares its lock with them the most often.
const WORKER_SYNC_INTERVAL_S: u64 = 5;
/// `write` calls of the `edit_latency` row.
const EDITS: usize = 100;
/// The pause after each `write` call's result (`wait_ms`): 700 ms plus
/// `(i · 37) mod EDIT_SPREAD_MS`, so 700–1,099 ms.
const EDIT_PAUSE_MS: u64 = 700;
const EDIT_SPREAD_MS: u64 = 400;
/// From the idle session's last tool call to the start of the measured
/// window, and the window: ten sync intervals, so a worker that synced on a
/// timer would sync ten times in it.
const IDLE_SETTLE: Duration = Duration::from_secs(5);
const IDLE_WINDOW: Duration = Duration::from_secs(10 * WORKER_SYNC_INTERVAL_S);
/// A fault rule with this many `times` and no effect counts the requests it
/// matches: `GET /dev/faults` shows how many are left.
const COUNT_TIMES: u64 = 1_000_000;
const WORKER_TIMEOUT: Duration = Duration::from_secs(600);

/// The 2 KB content of every seeded memory.
fn memory_body() -> String {
    "memory text line\n".repeat(CONTENT_BYTES / 17 + 1)[..CONTENT_BYTES].to_string()
}

/// The seeded memory `i` (of [`MEMORIES`]): its path in the store.
fn memory_path(i: usize) -> String {
    format!("/topic-{:02}/note-{i:04}.md", i % 40)
}

/// Create the [`MEMORIES`] memories of 2 KB in `store_id`, 16 at a time.
async fn seed(admin: &Client, store_id: &str) {
    let memories = admin.memories(store_id);
    let body = memory_body();
    futures::stream::iter(0..MEMORIES)
        .map(|i| {
            let (memories, body) = (&memories, &body);
            async move {
                memories
                    .create(
                        &CreateMemory {
                            path: memory_path(i),
                            content: Some(body.clone()),
                        },
                        None,
                    )
                    .await
                    .unwrap()
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
}

/// Which worker serves a session of the worker rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Ours,
    Sdk,
}

/// The devserver as the worker rows drive it: scenarios, faults, events.
struct Dev {
    api: DevApi,
    admin: Client,
    /// Where the rows' workdirs, state directories and logs go.
    root: std::path::PathBuf,
    envworker: std::path::PathBuf,
}

impl std::ops::Deref for Dev {
    type Target = DevApi;

    fn deref(&self) -> &DevApi {
        &self.api
    }
}

/// A scenario started, its store seeded.
struct Started {
    session_id: String,
    environment_id: String,
    environment_key: String,
    store_id: String,
}

impl Dev {
    /// Clear the faults; add `latency` ms on the memory endpoints, and the
    /// two counting rules (memory endpoints, every API route).
    async fn faults(&self, latency: u64) {
        self.send(self.http.delete(format!("{}/dev/faults", self.url)))
            .await;
        let mut rules = vec![
            json!({"path": "/v1/memory_stores/*", "times": COUNT_TIMES}),
            json!({"path": "*", "times": COUNT_TIMES}),
        ];
        if latency > 0 {
            rules.push(json!({"path": "/v1/memory_stores/*", "latency_ms": latency}));
        }
        self.post("/dev/faults", json!({ "rules": rules })).await;
    }

    /// API requests counted so far: (memory endpoints, every route).
    async fn requests(&self) -> (u64, u64) {
        let rules = self.get("/dev/faults").await;
        let counted = |path: &str| {
            rules["rules"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["path"] == path && r["times"].is_u64())
                .map(|r| COUNT_TIMES - r["times"].as_u64().unwrap())
                .unwrap_or_else(|| panic!("no counting rule on {path}: {rules}"))
        };
        (counted("/v1/memory_stores/*"), counted("*"))
    }

    /// Start a scenario whose store `notes` is empty, then seed it with the
    /// [`MEMORIES`] memories through the API (a scenario's own seed must
    /// fit one 4 MiB request). No worker serves the session yet.
    async fn start(&self, name: &str, steps: Vec<Value>) -> Started {
        let doc = json!({
            "name": name,
            "memory_stores": [{"key": "notes", "name": name, "access": "read_write"}],
            "steps": steps,
        });
        let started = self.post("/dev/scenarios", doc).await;
        let session_id = started["session_id"].as_str().unwrap().to_string();
        let report = self.get(&format!("/dev/scenarios/{session_id}")).await;
        let store_id = report["stores"]["notes"]["memory_store_id"]
            .as_str()
            .unwrap()
            .to_string();
        seed(&self.admin, &store_id).await;
        Started {
            session_id,
            environment_id: started["environment_id"].as_str().unwrap().to_string(),
            environment_key: started["environment_key"].as_str().unwrap().to_string(),
            store_id,
        }
    }

    /// Start `who`'s always-on poller on the scenario's environment, with
    /// max idle 1 s and the memory sync every [`WORKER_SYNC_INTERVAL_S`];
    /// ours with the change-driven push when `push` (the SDK has none).
    fn worker(&self, who: Who, tag: &str, s: &Started, push: bool) -> LoggedChild {
        let dir = self.root.join(tag);
        let workdir = dir.join("work");
        std::fs::create_dir_all(&workdir).unwrap();
        let interval = WORKER_SYNC_INTERVAL_S.to_string();
        let mut cmd = match who {
            Who::Ours => {
                let mut c = Command::new(&self.envworker);
                c.args(["poll", "--max-idle", "1s", "--memory-sync-interval"])
                    .arg(format!("{interval}s"))
                    .arg(format!("--memory-push={push}"))
                    .env_remove("RUST_LOG")
                    .env("ANTHROPIC_BASE_URL", &self.url)
                    .env("ANTHROPIC_ENVIRONMENT_ID", &s.environment_id)
                    .env("ANTHROPIC_ENVIRONMENT_KEY", &s.environment_key)
                    .env("ENVWORKER_WORKDIR", &workdir)
                    .env("ENVWORKER_STATE_DIR", dir.join("state"));
                c
            }
            Who::Sdk => {
                let mut c = Command::new(sdk::python());
                c.arg(
                    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/sdk_session.py"),
                )
                .arg("poll")
                .env("PYTHONUNBUFFERED", "1")
                .env("ENVWORKER_URL", &self.url)
                .env("ENVWORKER_ENVIRONMENT_ID", &s.environment_id)
                .env("ENVWORKER_ENVIRONMENT_KEY", &s.environment_key)
                .env("ENVWORKER_WORKDIR", &workdir)
                .env("SDK_MAX_IDLE", "1")
                .env("SDK_SYNC_INTERVAL", &interval);
                c
            }
        };
        let log = dir.join("worker.log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the {who:?} worker: {e}"));
        LoggedChild {
            child,
            name: format!("the {who:?} worker ({tag})"),
            log,
        }
    }

    /// The report once `done` says so; panics with the worker's log if the
    /// scenario failed or the worker died.
    async fn wait_report(
        &self,
        session_id: &str,
        worker: &mut LoggedChild,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + WORKER_TIMEOUT;
        loop {
            let report = self.get(&format!("/dev/scenarios/{session_id}")).await;
            assert!(
                report["failures"] == json!([]),
                "the scenario failed: {:#}\nworker log:\n{}",
                report["failures"],
                worker.log_tail()
            );
            if done(&report) {
                return report;
            }
            worker.assert_alive();
            assert!(
                Instant::now() < deadline,
                "the scenario is still running after {WORKER_TIMEOUT:?}; worker log:\n{}",
                worker.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// The first step of a worker row: it waits out the mount.
fn warm_up_step() -> Value {
    json!({"tool": "bash", "input": {"command": "echo warm-up"}, "timeout_ms": 300_000,
           "expect": {"is_error": false, "contains": "warm-up"}})
}

fn passed(report: &Value) -> bool {
    report["status"] == "passed"
}

/// What the `edit_latency` row measured at one latency, in ms, sorted.
struct EditRun {
    /// `agent.tool_use` recorded → the version with the new content created.
    from_issue: Vec<f64>,
    /// `user.tool_result` recorded → the same version.
    from_result: Vec<f64>,
    /// `agent.tool_use` → `user.tool_result` (the call itself).
    call: Vec<f64>,
}

/// 100 `write` calls through `envworker poll`, each to another of the
/// 2,000 memories, each followed by a pause; then, from the devserver's own
/// stamps (one clock, nothing polled while the calls run), how long after
/// each call the store had its new content.
async fn edit_latency_run(dev: &Dev, latency: u64) -> EditRun {
    let body = memory_body();
    // Memory `k = 19 i mod 2,000` (distinct, spread over the 40 folders),
    // rewritten whole with a marked first line, 2 KB as before.
    let edits: Vec<(String, String)> = (0..EDITS)
        .map(|i| {
            let mut content = format!("edited at {latency} ms, call {i:03}\n");
            content.push_str(&body[content.len()..]);
            (memory_path(i * 19 % MEMORIES), content)
        })
        .collect();
    let mut steps = vec![warm_up_step(), json!({"wait_ms": 2_000})];
    for (i, (path, content)) in edits.iter().enumerate() {
        steps.push(json!({"tool": "write",
                          "input": {"file_path": format!("{{mount:notes}}{path}"), "content": content},
                          "expect": {"is_error": false}}));
        steps.push(json!({"wait_ms": EDIT_PAUSE_MS + (i as u64 * 37) % EDIT_SPREAD_MS}));
    }
    dev.faults(latency).await;
    let name = format!("bench edit latency {latency}ms");
    let started = dev.start(&name, steps).await;
    let mut worker = dev.worker(Who::Ours, &format!("edit-{latency}"), &started, true);
    let report = dev
        .wait_report(&started.session_id, &mut worker, passed)
        .await;
    drop(worker);

    let events = dev.events(&started.session_id).await;
    let calls: Vec<(i64, i64)> = (0..EDITS)
        .map(|i| {
            let id = report["steps"][2 + 2 * i]["tool_use_id"].as_str().unwrap();
            (
                stamp(&events, "agent.tool_use", "id", id),
                stamp(&events, "user.tool_result", "tool_use_id", id),
            )
        })
        .collect();
    let since = chrono::DateTime::from_timestamp_micros(calls[0].0 - 1_000_000).unwrap();
    let versions: Vec<MemoryVersion> = dev
        .admin
        .memory_versions(&started.store_id)
        .list_all(ListMemoryVersions {
            operation: Some(MemoryOperation::Modified),
            created_at_gte: Some(since),
            limit: Some(100),
            ..Default::default()
        })
        .map(|v| v.unwrap())
        .collect()
        .await;
    let mut run = EditRun {
        from_issue: Vec::new(),
        from_result: Vec::new(),
        call: Vec::new(),
    };
    for ((path, content), (issued, answered)) in edits.iter().zip(&calls) {
        use sha2::Digest;
        let sha = hex::encode(sha2::Sha256::digest(content.as_bytes()));
        let created = versions
            .iter()
            .filter(|v| v.path.as_deref() == Some(path.as_str()))
            .filter(|v| v.content_sha256.as_deref() == Some(sha.as_str()))
            .map(|v| v.created_at.timestamp_micros())
            .min()
            .unwrap_or_else(|| panic!("{path}: no version with the written content"));
        run.from_issue.push((created - issued) as f64 / 1e3);
        run.from_result.push((created - answered) as f64 / 1e3);
        run.call.push((answered - issued) as f64 / 1e3);
    }
    for v in [&mut run.from_issue, &mut run.from_result, &mut run.call] {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    }
    run
}

/// What the `idle_cpu` row measured over one idle window.
struct IdleRun {
    cpu_ms: f64,
    /// Context switches of its threads alive throughout: how often it woke.
    switches: u64,
    memory_requests: u64,
    all_requests: u64,
}

/// Voluntary and involuntary context switches of each live thread of
/// process `pid`, by thread id.
fn context_switches(pid: u32) -> std::collections::HashMap<String, u64> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Default::default();
    };
    tasks
        .flatten()
        .filter_map(|t| {
            let status = std::fs::read_to_string(t.path().join("status")).ok()?;
            let switches = status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split(':').nth(1)?.trim().parse::<u64>().ok())
                .sum();
            Some((t.file_name().to_string_lossy().into_owned(), switches))
        })
        .collect()
}

/// The context switches between two samples of [`context_switches`], of
/// the threads alive at both (a thread that exits takes its count along).
fn switches_between(
    before: &std::collections::HashMap<String, u64>,
    after: &std::collections::HashMap<String, u64>,
) -> u64 {
    after
        .iter()
        .filter_map(|(tid, n)| Some(n.saturating_sub(*before.get(tid)?)))
        .sum()
}

/// `who` serving a session whose agent, after one call, makes none for
/// [`IDLE_SETTLE`] + [`IDLE_WINDOW`] + 5 s: its CPU time and its API
/// requests over the window.
async fn idle_run(dev: &Dev, who: Who, latency: u64) -> IdleRun {
    let wait = IDLE_SETTLE + IDLE_WINDOW + Duration::from_secs(5);
    let steps = vec![
        warm_up_step(),
        json!({"wait_ms": wait.as_millis() as u64}),
        json!({"tool": "bash", "input": {"command": "echo done"}, "expect": {"is_error": false}}),
    ];
    dev.faults(latency).await;
    let tag = format!("idle-{who:?}-{latency}").to_lowercase();
    let started = dev.start(&format!("bench {tag}"), steps).await;
    let mut worker = dev.worker(who, &tag, &started, false);
    dev.wait_report(&started.session_id, &mut worker, |r| {
        r["steps"][0]["status"] == "passed"
    })
    .await;
    tokio::time::sleep(IDLE_SETTLE).await;
    let pid = worker.child.id();
    let (cpu0, sw0, (mem0, all0)) = (
        proc_cpu_ms(pid),
        context_switches(pid),
        dev.requests().await,
    );
    tokio::time::sleep(IDLE_WINDOW).await;
    let (cpu1, sw1, (mem1, all1)) = (
        proc_cpu_ms(pid),
        context_switches(pid),
        dev.requests().await,
    );
    dev.wait_report(&started.session_id, &mut worker, passed)
        .await;
    IdleRun {
        cpu_ms: cpu1 - cpu0,
        switches: switches_between(&sw0, &sw1),
        memory_requests: mem1 - mem0,
        all_requests: all1 - all0,
    }
}

/// The `edit_latency` and `idle_cpu` rows, each wanted.
async fn worker_rows(dev: &Dev, edit: bool, idle: bool) {
    if edit {
        println!(
            "edit_latency: {EDITS} `write` calls (each a whole 2 KB memory, each another of the {MEMORIES}) through `envworker poll` (sync every {WORKER_SYNC_INTERVAL_S} s), {EDIT_PAUSE_MS}–{} ms apart after each result; ms to the memory version holding the new content, from the call's `agent.tool_use` recorded (issue) and from its `user.tool_result` recorded (result), by the devserver's stamps",
            EDIT_PAUSE_MS + EDIT_SPREAD_MS - 1
        );
        println!(
            "{:>7} | {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>9}",
            "latency", "issue p50", "p99", "max", "result p50", "p99", "max", "call p50"
        );
        for latency in [0u64, 5] {
            let r = edit_latency_run(dev, latency).await;
            println!(
                "{:>5}ms | {:>7.0}ms {:>7.0}ms {:>7.0}ms | {:>8.0}ms {:>7.0}ms {:>7.0}ms | {:>7.1}ms",
                latency,
                percentile(&r.from_issue, 50.0),
                percentile(&r.from_issue, 99.0),
                percentile(&r.from_issue, 100.0),
                percentile(&r.from_result, 50.0),
                percentile(&r.from_result, 99.0),
                percentile(&r.from_result, 100.0),
                percentile(&r.call, 50.0),
            );
        }
        println!(
            "  the SDK (not run) has no change-driven push: an edit leaves with its next periodic sync, a sync interval ({WORKER_SYNC_INTERVAL_S} s here) at best, and not while the agent makes no calls (idle_cpu)"
        );
    }
    if idle {
        let window_s = IDLE_WINDOW.as_secs_f64();
        println!(
            "idle_cpu: the worker serving a session whose agent is idle (a wait step), {MEMORIES} memories mounted, sync interval {WORKER_SYNC_INTERVAL_S} s; over a {window_s:.0} s window from {} s after the last call: CPU from /proc/PID/stat (10 ms ticks), per second and per sync interval; context switches of its threads (wake-ups); API requests counted by the devserver (memory endpoints, all)",
            IDLE_SETTLE.as_secs()
        );
        println!(
            "{:<9} {:>7} | {:>6} {:>8} {:>9} | {:>10} | {:>8} {:>8}",
            "worker", "latency", "cpu", "cpu/s", "cpu/5 s", "switches/s", "mem reqs", "all reqs"
        );
        let runs = [(Who::Ours, 0u64), (Who::Ours, 5), (Who::Sdk, 0)];
        for (who, latency) in runs {
            let r = idle_run(dev, who, latency).await;
            println!(
                "{:<9} {:>5}ms | {:>4.0}ms {:>6.2}ms {:>7.1}ms | {:>10.1} | {:>8} {:>8}",
                match who {
                    Who::Ours => "envworker",
                    Who::Sdk => "sdk",
                },
                latency,
                r.cpu_ms,
                r.cpu_ms / window_s,
                r.cpu_ms / window_s * WORKER_SYNC_INTERVAL_S as f64,
                r.switches as f64 / window_s,
                r.memory_requests,
                r.all_requests
            );
        }
        println!(
            "  neither worker syncs while the agent makes no calls (ours: the periodic sync is the runner's after-call hook, src/worker/item.rs), so 0 memory requests is the idle sync's cost here"
        );
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--child") {
        child(&args[at + 1..]).await;
        return;
    }
    let rows = std::env::var("ENVWORKER_BENCH_ROWS").ok();
    let wanted = |row: &str| {
        rows.as_deref()
            .is_none_or(|r| r.split(',').any(|w| w.trim() == row))
    };
    let sdk_rows = ["mount", "noop_sync", "steady_sync", "flush"];
    let python = sdk_rows.iter().any(|r| wanted(r)).then(sdk::python);
    let tmp = tempfile::tempdir().unwrap();
    // Mount on tmpfs when there is one: on a busy ext4, inode allocation
    // (`ext4_create → recently_deleted`) dominates both sides and buries the
    // engines' own costs.
    let shm = std::path::Path::new("/dev/shm");
    let mount_tmp = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let mount_root = mount_tmp.path().join("mnt");
    let data_dir = tmp.path().join("data");
    let server = process::DevserverProcess::start(
        ADMIN_KEY,
        &[
            "--data-dir",
            data_dir.to_str().unwrap(),
            "--mount-root",
            mount_root.to_str().unwrap(),
        ],
    );
    let url = server.url.clone();
    let http = reqwest::Client::new();
    let admin = Client::builder(Credential::api_key(ADMIN_KEY))
        .base_url(&url)
        .build()
        .unwrap();

    let (edit, idle) = (wanted("edit_latency"), wanted("idle_cpu"));
    if edit || idle {
        let dev = Dev {
            api: DevApi::new(&url, ADMIN_KEY),
            admin: admin.clone(),
            root: mount_tmp.path().join("workers"),
            envworker: env!("CARGO_BIN_EXE_envworker").into(),
        };
        worker_rows(&dev, edit, idle).await;
    }
    let legacy = [
        "mount",
        "noop_sync",
        "steady_sync",
        "flush",
        "sparse",
        "journal",
        "watch",
        "idle_syncs",
    ];
    if !legacy.into_iter().any(wanted) {
        return;
    }

    // The store, its memories, and a session that attaches it.
    let store = admin
        .memory_stores()
        .create(&CreateMemoryStore {
            name: "Bench Notes".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    seed(&admin, &store.id).await;
    let env: Value = http
        .post(format!("{url}/dev/environments"))
        .header("x-api-key", ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let session: Value = http
        .post(format!("{url}/v1/sessions"))
        .header("x-api-key", ADMIN_KEY)
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "managed-agents-2026-04-01")
        .json(
            &json!({"agent": "bench", "environment_id": env["environment_id"],
                      "resources": [{"type": "memory_store", "memory_store_id": store.id}]}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let session_id = session["id"].as_str().unwrap().to_string();
    let workdir = mount_tmp.path().join("work");
    std::fs::create_dir_all(&workdir).unwrap();
    let me = std::env::current_exe().unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/sdk_memory.py");
    println!(
        "store: {MEMORIES} memories of {CONTENT_BYTES} B, mounted under {}; each figure is the median of the runs shown",
        mount_root.display()
    );
    if python.is_some() {
        println!(
            "{:<10} {:>7} {:>5} | {:>12} {:>12} {:>12} | {:>12} {:>12} {:>12} | {:>6} {:>6} {:>6}",
            "operation",
            "latency",
            "runs",
            "ours wall",
            "ours cpu",
            "ours peak",
            "sdk wall",
            "sdk cpu",
            "sdk peak",
            "wall×",
            "cpu×",
            "mem×"
        );
    }
    // A child's arguments: `OP URL KEY SESSION_ID WORKDIR NONCE STATE_DIR`,
    // a fresh nonce each time; the journal on by default, as in the worker.
    let state_dir = tmp.path().join("state");
    let nonce = std::cell::Cell::new(0u64);
    let child_args_with = |op: &str, journal: bool| -> Vec<String> {
        nonce.set(nonce.get() + 1);
        vec![
            op.to_string(),
            url.clone(),
            ADMIN_KEY.to_string(),
            session_id.clone(),
            workdir.to_str().unwrap().to_string(),
            nonce.get().to_string(),
            if journal {
                state_dir.to_str().unwrap().to_string()
            } else {
                "off".to_string()
            },
        ]
    };
    let child_args = |op: &str| child_args_with(op, true);
    for latency in [0u64, 5] {
        let Some(python) = &python else {
            break;
        };
        memory_latency(&http, &url, latency).await;
        for op in sdk_rows.into_iter().filter(|r| wanted(r)) {
            // A no-op sync is a few milliseconds of CPU on our side, so
            // scheduler noise moves single runs by a third: more runs.
            let runs = match (op, latency) {
                ("noop_sync" | "steady_sync", _) => 9,
                (_, 0) => 5,
                _ => 3,
            };
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            for _ in 0..runs {
                ours.push(run_child(&me, &["--child"], &child_args(op)));
                theirs.push(run_child(
                    python,
                    &[script.to_str().unwrap()],
                    &child_args(op),
                ));
            }
            let (o, t) = (medians(&ours), medians(&theirs));
            println!(
                "{:<10} {:>5}ms {:>5} | {:>10.1}ms {:>10.1}ms {:>9.1}MiB | {:>10.1}ms {:>10.1}ms {:>9.1}MiB | {:>6.2} {:>6.2} {:>6.2}",
                op,
                latency,
                runs,
                o.wall_ms,
                o.cpu_ms,
                o.peak_rss_kb / 1024.0,
                t.wall_ms,
                t.cpu_ms,
                t.peak_rss_kb / 1024.0,
                o.wall_ms / t.wall_ms,
                o.cpu_ms / t.cpu_ms,
                o.peak_rss_kb / t.peak_rss_kb
            );
        }
    }
    if wanted("journal") {
        memory_latency(&http, &url, 0).await;
        println!(
            "journal: ours with the journal off and on, 0 ms latency, 9 runs each (state directory on {})",
            tmp.path().display()
        );
        println!(
            "{:<12} | {:>10} {:>10} | {:>10} {:>10} | {:>6} {:>6}",
            "operation", "off wall", "off cpu", "on wall", "on cpu", "wall×", "cpu×"
        );
        for op in sdk_rows {
            let (mut off, mut on) = (Vec::new(), Vec::new());
            for _ in 0..9 {
                off.push(run_child(&me, &["--child"], &child_args_with(op, false)));
                on.push(run_child(&me, &["--child"], &child_args_with(op, true)));
            }
            let (off, on) = (medians(&off), medians(&on));
            println!(
                "{:<12} | {:>8.1}ms {:>8.1}ms | {:>8.1}ms {:>8.1}ms | {:>6.2} {:>6.2}",
                op,
                off.wall_ms,
                off.cpu_ms,
                on.wall_ms,
                on.cpu_ms,
                on.wall_ms / off.wall_ms,
                on.cpu_ms / off.cpu_ms
            );
        }
    }
    if wanted("watch") || wanted("steady_sync") {
        memory_latency(&http, &url, 0).await;
        println!(
            "watch: ours, the idle (steady) sync without the folder watch (every file stat-ed, as before issue 16) and with it, 0 ms latency, 9 runs each"
        );
        println!(
            "{:<12} | {:>10} {:>10} {:>9} | {:>10} {:>10} {:>9} | {:>6}",
            "operation", "off wall", "off cpu", "examined", "on wall", "on cpu", "examined", "cpu×"
        );
        let (mut off, mut on) = (Vec::new(), Vec::new());
        for _ in 0..9 {
            off.push(run_child(
                &me,
                &["--child"],
                &child_args("steady_sync_nowatch"),
            ));
            on.push(run_child(&me, &["--child"], &child_args("steady_sync")));
        }
        let (off, on) = (medians(&off), medians(&on));
        println!(
            "{:<12} | {:>8.1}ms {:>8.1}ms {:>9} | {:>8.1}ms {:>8.1}ms {:>9} | {:>6.2}",
            "steady_sync",
            off.wall_ms,
            off.cpu_ms,
            off.examined,
            on.wall_ms,
            on.cpu_ms,
            on.examined,
            on.cpu_ms / off.cpu_ms
        );
    }
    if wanted("idle_syncs") {
        println!(
            "idle_syncs: ours, {IDLE_SYNCS} idle syncs back to back after the mount, per sync, median of 3 runs: none due for a safety cadence (`idle`), then each of them due for both (`scan`: a full scan of the folder and a full listing of the store); `session` is the CPU per sync of an idle session at the default 15 s interval, where the cadences (every {} s) make one sync in {SYNCS_PER_SAFETY_SCAN} such a sync",
            FULL_SCAN_EVERY_S
        );
        println!(
            "{:<8} | {:>10} {:>10} {:>9} | {:>10} {:>10} {:>9} | {:>12}",
            "latency",
            "idle wall",
            "idle cpu",
            "examined",
            "scan wall",
            "scan cpu",
            "examined",
            "session cpu"
        );
        for latency in [0, 5] {
            memory_latency(&http, &url, latency).await;
            let median_of = |op: &str| {
                let runs: Vec<Sample> = (0..3)
                    .map(|_| run_child(&me, &["--child"], &child_args(op)))
                    .collect();
                medians(&runs)
            };
            let (idle, scan) = (median_of("idle_syncs"), median_of("idle_syncs_scanning"));
            assert_eq!(idle.full_scans, 0.0, "a full scan among the idle syncs");
            assert_eq!(
                scan.full_scans, IDLE_SYNCS as f64,
                "a sync without its full scan"
            );
            let n = SYNCS_PER_SAFETY_SCAN as f64;
            let session = (idle.cpu_ms * (n - 1.0) + scan.cpu_ms) / n;
            println!(
                "{:<8} | {:>8.2}ms {:>8.3}ms {:>9.1} | {:>8.2}ms {:>8.3}ms {:>9.1} | {:>10.3}ms",
                format!("{latency} ms"),
                idle.wall_ms,
                idle.cpu_ms,
                idle.examined / IDLE_SYNCS as f64,
                scan.wall_ms,
                scan.cpu_ms,
                scan.examined / IDLE_SYNCS as f64,
                session
            );
        }
    }
    if wanted("sparse") {
        memory_latency(&http, &url, 0).await;
        let measure = |op: &str| {
            let samples: Vec<Sample> = (0..3)
                .map(|_| run_child(&me, &["--child"], &child_args(op)))
                .collect();
            medians(&samples)
        };
        let (without, with) = (measure("sparse_without"), measure("sparse_with"));
        println!(
            "sparse: two syncs and a flush of the {MEMORIES}-memory store, 3 runs each: peak RSS {:.1} MiB without, {:.1} MiB with a {} GiB sparse file beside it ({:.2}×, target ≤ 1.20×); wall {:.1} ms vs {:.1} ms",
            without.peak_rss_kb / 1024.0,
            with.peak_rss_kb / 1024.0,
            SPARSE_BYTES >> 30,
            with.peak_rss_kb / without.peak_rss_kb,
            without.wall_ms,
            with.wall_ms
        );
    }
    drop(server);
}
