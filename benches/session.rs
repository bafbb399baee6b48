//! envworker's worker next to the official Python SDK's (`anthropic==2.10.0`),
//! each serving identical scripted sessions of one devserver:
//!
//! 1. **Runner throughput.** A generated scenario of 1 warm-up call and 200
//!    measured tool calls (bash `echo`, read, write, edit, glob, grep on small
//!    files of the workdir and of a memory store; every call must succeed and
//!    the store must end as expected). Calls per second over the window from
//!    the `agent.tool_use` of the first measured call to the `user.tool_result`
//!    of the last (the devserver's `processed_at` stamps), and p50/p99 of the
//!    report's per-step `latency_ms` (tool_use recorded → result recorded).
//! 2. **Start-up.** (i) cold start: spawn → `GET /readyz` answers 200, for
//!    `envworker serve` and for a webhook receiver built on the SDK alone
//!    (`benches/sdk_session.py webhook`; its `import anthropic` time is shown
//!    too); and spawn → first poll request, for `envworker poll` and the SDK's
//!    `EnvironmentWorker.run()`, against a stub that answers every poll with
//!    `null`. (ii) a signed `session.status_run_started` webhook delivered to
//!    the running receiver → the first call's result recorded by the
//!    devserver, split at the work item's `acknowledged_at`; and, for the
//!    always-on pollers, work enqueued (`created_at`) → first result. (iii)
//!    peak RSS (`VmHWM`) of the worker process at the end of the 200-call
//!    session, and its CPU time during the session.
//! 3. **The shell's sandbox.** `envworker serve --shell-sandbox require` as
//!    another worker of the webhook-driven runs of 1 and 2, next to the
//!    default (`off` with one item at a time): throughput, step latency,
//!    webhook → first result, cold start, and require ÷ off.
//! 4. **Sessions side by side.** One `envworker serve --max-concurrent-items
//!    N` (N = 4, `SESSION_BENCH_SIDE_BY_SIDE`) serving N sessions of a
//!    20-call scenario started at once, one webhook each: step latency over
//!    all sessions' calls, and the worker's memory per session, (`VmHWM` once
//!    they are done − `VmHWM` of an idle single-session worker) ÷ N; with the
//!    sandbox `require` (the default above one item) and `off`.
//! 5. **The change-driven push.** `envworker serve --memory-push` as another
//!    worker of the webhook-driven runs (tmpfs, sandbox off), next to the
//!    default: throughput, step latency, webhook → first result, CPU.
//!
//! The workers run as their own processes (envworker: the release binary
//! `envworker serve`, the path a webhook takes in production; the SDK: one
//! Python process), with the same settings (max idle 1 s, memory sync every
//! 5 s), against one `envworker devserver` process whose database and mount
//! root are on tmpfs, as are every worker's workdirs and stores (the SDK's
//! too; on disk our write tool's `fsync` would cost ~0.4 ms that the SDK,
//! which does not sync, never pays). Runs alternate envworker / envworker
//! (sandbox) / envworker (push) / SDK, and require / off;
//! one warm-up round of each is not counted. Prints medians and ratios and
//! writes them into `benches/RESULTS.md` between its markers. Run: `cargo
//! bench --bench session` (`SESSION_BENCH_RUNS=N` for another number of
//! runs, default 5; `ENVWORKER_BENCH_WRAP` runs our workers under a tool,
//! e.g. a profiler).

#[path = "../tests/common/dev_api.rs"]
mod dev_api;
#[path = "../tests/common/sdk.rs"]
#[allow(dead_code)]
mod sdk;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dev_api::{DevApi, LoggedChild, micros_of, percentile, proc_cpu_ms, stamp};
use envworker::webhook::SigningKey;
use serde_json::{Value, json};

const ADMIN_KEY: &str = "bench-admin";
/// Measured tool calls of the throughput scenario (after one warm-up call).
const CALLS: usize = 200;
/// Measured calls of the short scenario of the poll-mode runs.
const SHORT_CALLS: usize = 5;
/// Measured calls of each session of the side-by-side runs: three groups and
/// a half, so both the workdir and the memory store are used.
const SIDE_CALLS: usize = 20;
/// Sessions served at once in the side-by-side runs (`SESSION_BENCH_SIDE_BY_SIDE`).
const SIDE_BY_SIDE: usize = 4;
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// The pause before each webhook-driven run: what the run before left
/// running winds down first.
const SETTLE: Duration = Duration::from_millis(300);
const RUN_TIMEOUT: Duration = Duration::from_secs(300);
/// Where the phase of the always-on pollers is sampled: the work is enqueued
/// this long after the poller's first poll (the same list for both).
const POLL_PHASES_MS: [u64; 7] = [300, 2_900, 1_500, 3_700, 700, 2_300, 4_100];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    /// `envworker serve` with its default at one session: `--shell-sandbox off`.
    Ours,
    /// `envworker serve --shell-sandbox require`.
    OursSandboxed,
    /// `envworker serve --memory-push` (tmpfs, sandbox off): the store's
    /// edits uploaded within about a second instead of at the sync.
    OursPush,
    Sdk,
}

impl Who {
    fn label(self) -> &'static str {
        match self {
            Who::Ours => "envworker",
            Who::OursSandboxed => "envworker (sandbox)",
            Who::OursPush => "envworker (push)",
            Who::Sdk => "sdk",
        }
    }

    /// The label as it goes into file names and ids.
    fn slug(self) -> &'static str {
        match self {
            Who::Ours => "envworker",
            Who::OursSandboxed => "envworker-sandbox",
            Who::OursPush => "envworker-push",
            Who::Sdk => "sdk",
        }
    }

    /// envworker's `--shell-sandbox`.
    fn shell_sandbox(self) -> &'static str {
        match self {
            Who::OursSandboxed => "require",
            Who::Ours | Who::OursPush | Who::Sdk => "off",
        }
    }
}

// ---------------------------------------------------------------- processes

/// A child process, killed on drop; stdout lines are timestamped as they come.
struct Proc {
    logged: LoggedChild,
    lines: mpsc::Receiver<(String, Instant)>,
}

impl std::ops::Deref for Proc {
    type Target = LoggedChild;

    fn deref(&self) -> &LoggedChild {
        &self.logged
    }
}

impl std::ops::DerefMut for Proc {
    fn deref_mut(&mut self) -> &mut LoggedChild {
        &mut self.logged
    }
}

/// Under `ENVWORKER_BENCH_WRAP` the tool (a profiler) is asked to stop
/// first, so it can write what it recorded before the kill.
impl Drop for Proc {
    fn drop(&mut self) {
        if std::env::var_os("ENVWORKER_BENCH_WRAP").is_none() {
            return;
        }
        // SAFETY: a signal to our own child, which has not been reaped.
        unsafe { libc::kill(self.logged.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.logged.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Proc {
    /// Spawn `cmd` with stderr into `log`; returns the process and the instant
    /// just before the spawn.
    fn spawn(cmd: &mut Command, name: &str, log: &Path) -> (Proc, Instant) {
        let err = std::fs::File::create(log).expect("the log file can be created");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err));
        let at = Instant::now();
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((line, Instant::now())).is_err() {
                    break;
                }
            }
        });
        (
            Proc {
                logged: LoggedChild {
                    child,
                    name: name.to_string(),
                    log: log.to_path_buf(),
                },
                lines: rx,
            },
            at,
        )
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The first stdout line starting with `prefix`, and when it arrived.
    fn wait_line(&mut self, prefix: &str, timeout: Duration) -> (String, Instant) {
        let deadline = Instant::now() + timeout;
        loop {
            match self.lines.recv_timeout(Duration::from_millis(50)) {
                Ok((line, at)) if line.starts_with(prefix) => return (line, at),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.assert_alive();
                    std::thread::sleep(Duration::from_millis(50));
                    self.assert_alive();
                    panic!("{}: stdout closed before {prefix:?}", self.name);
                }
            }
            self.assert_alive();
            assert!(
                Instant::now() < deadline,
                "{}: no {prefix:?} line within {timeout:?}; log:\n{}",
                self.name,
                self.log_tail()
            );
        }
    }
}

/// A `VmHWM` / `VmRSS` line of `/proc/PID/status`, in KiB.
fn proc_status_kb(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Poll `GET /readyz` (a fresh connection every millisecond, as a load
/// balancer's probe would) until it answers 200; the instant it did.
fn wait_ready(port: u16, proc: &mut Proc) -> Instant {
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = s
                .write_all(b"GET /readyz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n");
            let mut head = [0u8; 12];
            if s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200") {
                return Instant::now();
            }
        }
        proc.assert_alive();
        assert!(
            Instant::now() < deadline,
            "{}: /readyz did not answer 200 within {READY_TIMEOUT:?}; log:\n{}",
            proc.name,
            proc.log_tail()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A stand-in API that answers every request with `200 null` and reports
/// the instant each `…/work/poll` request arrived.
fn poll_stub() -> (String, mpsc::Receiver<Instant>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                let mut request_line = String::new();
                if reader.read_line(&mut request_line).is_err() {
                    return;
                }
                loop {
                    let mut line = String::new();
                    match reader.read_line(&mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) if line == "\r\n" || line == "\n" => break,
                        Ok(_) => {}
                    }
                }
                if request_line.contains("/work/poll") {
                    let _ = tx.send(Instant::now());
                }
                let _ = reader.get_mut().write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 4\r\nconnection: close\r\n\r\nnull",
                );
            });
        }
    });
    (url, rx)
}

// ---------------------------------------------------------------- devserver

struct Devserver {
    _proc: Proc,
    api: DevApi,
}

impl std::ops::Deref for Devserver {
    type Target = DevApi;

    fn deref(&self) -> &DevApi {
        &self.api
    }
}

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

impl Devserver {
    fn start(exe: &Path, root: &Path) -> Devserver {
        let data = root.join("data");
        let mnt = root.join("mnt");
        let (mut proc, _) = Proc::spawn(
            Command::new(exe)
                .args([
                    "devserver",
                    "--listen",
                    "127.0.0.1:0",
                    "--admin-key",
                    ADMIN_KEY,
                ])
                .args(["--data-dir", data.to_str().unwrap()])
                .args(["--mount-root", mnt.to_str().unwrap()])
                .env("RUST_LOG", "warn"),
            "envworker devserver",
            &root.join("devserver.log"),
        );
        let (line, _) = proc.wait_line("envworker devserver listening on ", READY_TIMEOUT);
        let url = line.trim().rsplit(' ').next().unwrap().to_string();
        Devserver {
            _proc: proc,
            api: DevApi::new(&url, ADMIN_KEY),
        }
    }

    /// A new self-hosted environment: (id, key).
    async fn environment(&self) -> (String, String) {
        let env = self.post("/dev/environments", json!({})).await;
        (
            env["environment_id"].as_str().unwrap().to_string(),
            env["environment_key"].as_str().unwrap().to_string(),
        )
    }

    async fn start_scenario(&self, doc: &Value) -> String {
        let started = self.post("/dev/scenarios", doc.clone()).await;
        started["session_id"].as_str().unwrap().to_string()
    }

    /// The report once it is no longer `running`; panics with the worker's
    /// log unless it passed.
    async fn passed_report(&self, session_id: &str, worker: &mut Proc) -> Value {
        let deadline = Instant::now() + RUN_TIMEOUT;
        loop {
            let report = self.get(&format!("/dev/scenarios/{session_id}")).await;
            if report["status"] != "running" {
                assert!(
                    report["status"] == "passed" && report["failures"] == json!([]),
                    "{}: the scenario did not pass: {:#}\nworker log:\n{}",
                    worker.name,
                    report["failures"],
                    worker.log_tail()
                );
                return report;
            }
            worker.assert_alive();
            // envworker's word for an item it gave up on: no need to wait for the timeout.
            assert!(
                !std::fs::read_to_string(&worker.log)
                    .unwrap_or_default()
                    .contains("work item failed"),
                "{}: a work item failed; worker log:\n{}",
                worker.name,
                worker.log_tail()
            );
            assert!(
                Instant::now() < deadline,
                "{}: the scenario is still running after {RUN_TIMEOUT:?}; worker log:\n{}",
                worker.name,
                worker.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The (only) work item of an environment.
    async fn work_item(&self, environment_id: &str) -> Value {
        let list = self
            .get(&format!("/v1/environments/{environment_id}/work"))
            .await;
        list["data"][0].clone()
    }

    /// Wait until a worker has polled this environment.
    async fn wait_polling(&self, environment_id: &str, worker: &mut Proc) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let stats = self
                .get(&format!("/v1/environments/{environment_id}/work/stats"))
                .await;
            if stats["workers_polling"].as_u64().unwrap_or(0) >= 1 {
                return;
            }
            worker.assert_alive();
            assert!(
                Instant::now() < deadline,
                "{}: never polled; log:\n{}",
                worker.name,
                worker.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

// ---------------------------------------------------------------- scenario

/// One warm-up call, then `calls` measured calls cycling through write,
/// read, edit, bash, glob, grep — on `files/gN.txt` in the workdir for even
/// groups and on `gN.md` in the memory store for odd ones.
fn scenario(name: &str, environment_id: &str, store_name: &str, calls: usize) -> Value {
    let mut memories: BTreeMap<String, String> = (0..10)
        .map(|i| (format!("/seed-{i}.md"), format!("seed {i}\n")))
        .collect();
    let initial = memories.clone();
    let mut steps = vec![json!({"tool": "bash", "input": {"command": "echo warm-up"},
                                "expect": {"is_error": false, "contains": "warm-up"}})];
    let mut g = 0;
    'groups: loop {
        let (group, in_store) = dev_api::tool_group(g);
        for (i, step) in group.into_iter().enumerate() {
            if steps.len() == calls + 1 {
                break 'groups;
            }
            if in_store {
                let path = format!("/g{g}.md");
                match i {
                    0 => {
                        memories.insert(path, format!("alpha {g}\nbeta {g}\n"));
                    }
                    2 => {
                        memories.insert(path, format!("alpha {g}\ngamma {g}\n"));
                    }
                    _ => {}
                }
            }
            steps.push(step);
        }
        g += 1;
    }
    json!({
        "name": name,
        "environment_id": environment_id,
        "memory_stores": [{"key": "notes", "name": store_name, "access": "read_write", "memories": initial}],
        "steps": steps,
        "expect_final": {"notes": memories},
    })
}

// ---------------------------------------------------------------- workers

struct Setup {
    envworker: PathBuf,
    python: PathBuf,
    script: PathBuf,
    /// The devserver's database and mount root, the logs, the workers'
    /// workdirs and the side-by-side sessions' stores (tmpfs where there is
    /// one: `/dev/shm`, which the shell's sandbox may be granted).
    root: PathBuf,
}

impl Setup {
    /// Our worker's binary, run under `ENVWORKER_BENCH_WRAP`'s tool when
    /// it names one, e.g. `ENVWORKER_BENCH_WRAP="perf record -g -o
    /// /tmp/p.data --"` (the figures then include the tool's overhead, and
    /// the RSS and CPU read are the tool's process's).
    fn ours(&self) -> Command {
        let wrap: Vec<String> = std::env::var("ENVWORKER_BENCH_WRAP")
            .map(|w| w.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default();
        match wrap.split_first() {
            Some((tool, args)) => {
                let mut c = Command::new(tool);
                c.args(args).arg(&self.envworker);
                c
            }
            None => Command::new(&self.envworker),
        }
    }

    /// Command for a webhook receiver of `who` on `port`.
    fn webhook_cmd(
        &self,
        who: Who,
        port: u16,
        env: &(String, String),
        api: &str,
        workdir: &Path,
        secret: &str,
    ) -> Command {
        match who {
            Who::Ours | Who::OursSandboxed | Who::OursPush => {
                let mut c = self.serve_cmd(port, env, api, workdir, secret);
                c.args(["--shell-sandbox", who.shell_sandbox()]);
                if who == Who::OursPush {
                    c.arg("--memory-push");
                }
                c
            }
            Who::Sdk => {
                let mut c = self.sdk_cmd("webhook", env, api, workdir);
                c.env("WEBHOOK_SECRET", secret)
                    .env("LISTEN_PORT", port.to_string());
                c
            }
        }
    }

    /// `envworker serve` on `port` with the bench's settings (the shell's
    /// sandbox left to its default).
    fn serve_cmd(
        &self,
        port: u16,
        env: &(String, String),
        api: &str,
        workdir: &Path,
        secret: &str,
    ) -> Command {
        let mut c = self.ours();
        c.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--max-idle", "1s", "--memory-sync-interval", "5s"])
            .env_remove("RUST_LOG")
            .env_remove("ENVWORKER_SHELL_SANDBOX")
            .env_remove("ENVWORKER_MAX_CONCURRENT_ITEMS")
            .env("ANTHROPIC_BASE_URL", api)
            .env("ANTHROPIC_ENVIRONMENT_ID", &env.0)
            .env("ANTHROPIC_ENVIRONMENT_KEY", &env.1)
            .env("ANTHROPIC_WEBHOOK_SIGNING_KEY", secret)
            .env("ENVWORKER_WORKDIR", workdir);
        c
    }

    /// Command for an always-on poller of `who`.
    fn poll_cmd(&self, who: Who, env: &(String, String), api: &str, workdir: &Path) -> Command {
        match who {
            Who::Ours | Who::OursSandboxed | Who::OursPush => {
                let mut c = self.ours();
                c.args(["poll", "--max-idle", "1s", "--memory-sync-interval", "5s"])
                    .args(["--shell-sandbox", who.shell_sandbox()])
                    .env_remove("RUST_LOG")
                    .env("ANTHROPIC_BASE_URL", api)
                    .env("ANTHROPIC_ENVIRONMENT_ID", &env.0)
                    .env("ANTHROPIC_ENVIRONMENT_KEY", &env.1)
                    .env("ENVWORKER_WORKDIR", workdir);
                c
            }
            Who::Sdk => self.sdk_cmd("poll", env, api, workdir),
        }
    }

    fn sdk_cmd(&self, mode: &str, env: &(String, String), api: &str, workdir: &Path) -> Command {
        let mut c = Command::new(&self.python);
        c.arg(&self.script)
            .arg(mode)
            .env("PYTHONUNBUFFERED", "1")
            .env("ENVWORKER_URL", api)
            .env("ENVWORKER_ENVIRONMENT_ID", &env.0)
            .env("ENVWORKER_ENVIRONMENT_KEY", &env.1)
            .env("ENVWORKER_WORKDIR", workdir)
            .env("SDK_MAX_IDLE", "1")
            .env("SDK_SYNC_INTERVAL", "5");
        c
    }

    fn workdir(&self, tag: &str) -> PathBuf {
        let dir = self.root.join(tag).join("work");
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Mount the scenario's store at a path of its own beside the workdirs
    /// (the scenario's `mount_path`, instead of one under the devserver's
    /// mount root): side by side, each session's store has its own folder.
    fn store_of_its_own(&self, doc: &mut Value, tag: &str) {
        let store = self.root.join(tag).join("notes");
        doc["memory_stores"][0]["mount_path"] = json!(store.to_str().unwrap());
    }
}

/// What one webhook-driven run of the throughput scenario measured.
#[derive(Debug, Default, Clone)]
struct WebhookRun {
    /// Spawn → `/readyz` 200.
    cold_ms: f64,
    /// SDK only: spawn → `import anthropic` done.
    import_ms: Option<f64>,
    /// `VmHWM` once ready.
    rss_ready_kb: f64,
    /// Webhook sent → first call's result recorded.
    first_result_ms: f64,
    /// Webhook sent → the work item acknowledged.
    to_ack_ms: f64,
    /// Acknowledged → first call's result recorded.
    ack_to_first_ms: f64,
    calls_per_s: f64,
    /// Mean time per call the devserver spent between a result and the next
    /// `agent.tool_use` (the window less the calls' latencies, over the calls).
    gap_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// `VmHWM` at the end of the session.
    peak_rss_kb: f64,
    /// CPU time of the worker process from ready to the end of the session.
    cpu_ms: f64,
    /// (tool, latency) of every measured call.
    per_call: Vec<(String, f64)>,
    /// Ours only: where webhook → first result went, from the worker's log.
    phases: Option<SetupPhases>,
}

/// Where one of our workers spent webhook → first result: the bench's clock
/// at the send, the stamps of the worker's own INFO lines, and the
/// devserver's stamp of the result (one clock: one machine), in ms.
#[derive(Debug, Default, Clone, Copy)]
struct SetupPhases {
    /// Sent → `webhook accepted` (connection, request, signature check).
    accepted: f64,
    /// → `claimed work` (the poll that claims the item).
    claimed: f64,
    /// → the last `downloaded memories` before the first call: the ack, the
    /// session read, each store's journal, folder, listing and files.
    mounted: f64,
    /// → the first `executing tool` (the runner's stream and history).
    first_call_started: f64,
    /// → `tool call finished`: the first call (`bash`: its supervisor and
    /// shell start here, at the first call, as with the official worker).
    first_call: f64,
    /// → the result recorded by the devserver (the post).
    recorded: f64,
}

impl SetupPhases {
    const NAMES: [&'static str; 6] = [
        "webhook sent → accepted (connection, signature check)",
        "→ item claimed (the drain's poll)",
        "→ stores mounted (ack, session read, journal, folder, listing, files)",
        "→ first call started (the runner's stream and history)",
        "→ first call finished (`bash`: the shell's start under the spare supervisor)",
        "→ result recorded (the post)",
    ];

    fn values(&self) -> [f64; 6] {
        [
            self.accepted,
            self.claimed,
            self.mounted,
            self.first_call_started,
            self.first_call,
            self.recorded,
        ]
    }

    /// From the worker's text log; `None` when a line is missing.
    fn read(log: &Path, sent: i64, recorded: i64) -> Option<SetupPhases> {
        let text = std::fs::read_to_string(log).ok()?;
        let at = |line: &str| {
            chrono::DateTime::parse_from_rfc3339(line.split_whitespace().next()?)
                .ok()
                .map(|t| t.timestamp_micros())
        };
        let first = |what: &str| text.lines().find(|l| l.contains(what)).and_then(at);
        let accepted = first("webhook accepted")?;
        let claimed = first("claimed work")?;
        let started = first("executing tool")?;
        let finished = first("tool call finished")?;
        let mounted = text
            .lines()
            .filter(|l| l.contains("downloaded memories"))
            .filter_map(at)
            .filter(|&t| t <= started)
            .max()?;
        let ms = |from: i64, to: i64| (to - from) as f64 / 1e3;
        Some(SetupPhases {
            accepted: ms(sent, accepted),
            claimed: ms(accepted, claimed),
            mounted: ms(claimed, mounted),
            first_call_started: ms(mounted, started),
            first_call: ms(started, finished),
            recorded: ms(finished, recorded),
        })
    }
}

fn median(xs: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = xs.into_iter().collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

async fn webhook_run(
    setup: &Setup,
    dev: &Devserver,
    who: Who,
    tag: &str,
    calls: usize,
) -> WebhookRun {
    let env = dev.environment().await;
    let dir = format!("{tag}-{}", who.slug());
    let workdir = setup.workdir(&dir);
    let (key, secret) = SigningKey::generate();
    let port = free_port();
    let mut cmd = setup.webhook_cmd(who, port, &env, &dev.url, &workdir, &secret);
    let log = setup.root.join(format!("{tag}-{}.log", who.slug()));
    let (mut proc, spawned) = Proc::spawn(&mut cmd, &format!("{} ({tag})", who.label()), &log);
    let ready = tokio::task::block_in_place(|| wait_ready(port, &mut proc));
    let mut run = WebhookRun {
        cold_ms: (ready - spawned).as_secs_f64() * 1e3,
        ..Default::default()
    };
    if who == Who::Sdk {
        let (_, imported) = proc.wait_line("imported", Duration::from_secs(1));
        run.import_ms = Some((imported - spawned).as_secs_f64() * 1e3);
    }
    let pid = proc.pid();
    run.rss_ready_kb = proc_status_kb(pid, "VmHWM");
    let cpu_ready = proc_cpu_ms(pid);

    let doc = scenario(
        &format!("bench-{tag}-{}", who.slug()),
        &env.0,
        &format!("Bench Notes {tag} {}", who.slug()),
        calls,
    );
    let session_id = dev.start_scenario(&doc).await;
    let webhook_id = format!("whe_bench_{tag}_{}", who.slug());
    let sent = send_webhook(dev, port, &key, &webhook_id, &session_id, &proc).await;

    let report = dev.passed_report(&session_id, &mut proc).await;
    run.peak_rss_kb = proc_status_kb(pid, "VmHWM");
    run.cpu_ms = proc_cpu_ms(pid) - cpu_ready;
    drop(proc);

    let events = dev.events(&session_id).await;
    let steps = report["steps"].as_array().unwrap();
    assert_eq!(steps.len(), calls + 1);
    let use_id = |i: usize| steps[i]["tool_use_id"].as_str().unwrap().to_string();
    let first_result = stamp(&events, "user.tool_result", "tool_use_id", &use_id(0));
    let acked = micros_of(
        dev.work_item(&env.0).await["acknowledged_at"]
            .as_str()
            .expect("the item was acknowledged"),
    );
    run.first_result_ms = (first_result - sent) as f64 / 1e3;
    if who != Who::Sdk {
        run.phases = SetupPhases::read(&log, sent, first_result);
    }
    run.to_ack_ms = (acked - sent) as f64 / 1e3;
    run.ack_to_first_ms = (first_result - acked) as f64 / 1e3;
    let window_start = stamp(&events, "agent.tool_use", "id", &use_id(1));
    let window_end = stamp(&events, "user.tool_result", "tool_use_id", &use_id(calls));
    run.calls_per_s = calls as f64 / ((window_end - window_start) as f64 / 1e6);
    run.per_call = steps[1..]
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or("?").to_string(),
                s["latency_ms"]
                    .as_f64()
                    .expect("a measured step has a latency"),
            )
        })
        .collect();
    let busy: f64 = run.per_call.iter().map(|(_, l)| *l).sum();
    run.gap_ms = ((window_end - window_start) as f64 / 1e3 - busy) / calls as f64;
    let mut lat: Vec<f64> = run.per_call.iter().map(|(_, l)| *l).collect();
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    run.p50_ms = percentile(&lat, 50.0);
    run.p99_ms = percentile(&lat, 99.0);
    run
}

/// Deliver a signed `session.status_run_started` for `session_id` to the
/// receiver on `port`; asserts 202. When it was sent (µs since the epoch).
async fn send_webhook(
    dev: &Devserver,
    port: u16,
    key: &SigningKey,
    webhook_id: &str,
    session_id: &str,
    proc: &Proc,
) -> i64 {
    let body = json!({
        "type": "event",
        "id": webhook_id,
        "created_at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "data": {"type": "session.status_run_started", "id": session_id,
                 "organization_id": "org_devserver", "workspace_id": "wrkspc_devserver"},
    })
    .to_string();
    let ts = now_micros() / 1_000_000;
    let sent = now_micros();
    let answer = dev
        .http
        .post(format!("http://127.0.0.1:{port}/webhooks/default"))
        .header("webhook-id", webhook_id)
        .header("webhook-timestamp", ts.to_string())
        .header(
            "webhook-signature",
            key.sign(webhook_id, ts, body.as_bytes()),
        )
        .header("content-type", "application/json")
        .body(body)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("the webhook receiver answers");
    assert_eq!(
        answer.status().as_u16(),
        202,
        "{}: webhook refused; log:\n{}",
        proc.name,
        proc.log_tail()
    );
    sent
}

/// What one run of N sessions side by side in one worker measured.
#[derive(Debug, Clone)]
struct SideRun {
    /// `VmHWM` of the worker once ready, before any work.
    rss_ready_kb: f64,
    /// `VmHWM` once the drain that served the sessions let all of them go.
    peak_rss_kb: f64,
    /// Nearest-rank percentiles over the measured calls of all sessions.
    p50_ms: f64,
    p99_ms: f64,
    /// All sessions' measured calls ÷ (the last one's result − the first one's tool_use).
    calls_per_s: f64,
    /// How long all N sessions were making calls at once: the earliest end of
    /// a session's measured calls − the latest start (negative: they did not overlap).
    overlap_ms: f64,
}

/// Wait until the worker's log holds `needle`.
fn wait_log(proc: &mut Proc, needle: &str) {
    let deadline = Instant::now() + READY_TIMEOUT;
    while !std::fs::read_to_string(&proc.log)
        .unwrap_or_default()
        .contains(needle)
    {
        proc.assert_alive();
        assert!(
            Instant::now() < deadline,
            "{}: no {needle:?} in the log within {READY_TIMEOUT:?}; log:\n{}",
            proc.name,
            proc.log_tail()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Wait until the worker's drains (`queue drained … items=K` lines) served
/// `items` items in all: every one was served and let go.
fn wait_drained(proc: &mut Proc, items: usize) {
    let deadline = Instant::now() + RUN_TIMEOUT;
    loop {
        let served: usize = std::fs::read_to_string(&proc.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                l.split_once("queue drained")?
                    .1
                    .split_once(" items=")?
                    .1
                    .split(' ')
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .sum();
        if served >= items {
            return;
        }
        proc.assert_alive();
        assert!(
            Instant::now() < deadline,
            "{}: {served} of {items} items served after {RUN_TIMEOUT:?}; log:\n{}",
            proc.name,
            proc.log_tail()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `n` sessions of the short scenario at once in one `envworker serve
/// --max-concurrent-items n`, its shell's sandbox `sandbox` (`require`, the
/// default above one item, is left to the default). All `n` scenarios are
/// started, then one signed delivery per session is sent, all at once, as
/// the API sends them (one alone would do: a drain claims until the queue is
/// empty, the later ones wake it).
async fn side_by_side_run(
    setup: &Setup,
    dev: &Devserver,
    sandbox: &str,
    n: usize,
    tag: &str,
) -> SideRun {
    let env = dev.environment().await;
    let slug = format!("side{n}-{sandbox}");
    let workdir = setup.workdir(&format!("{tag}-{slug}"));
    let (key, secret) = SigningKey::generate();
    let port = free_port();
    let mut cmd = setup.serve_cmd(port, &env, &dev.url, &workdir, &secret);
    cmd.args(["--max-concurrent-items", &n.to_string()]);
    if sandbox != "require" {
        cmd.args(["--shell-sandbox", sandbox]);
    }
    let log = setup.root.join(format!("{tag}-{slug}.log"));
    let (mut proc, _) = Proc::spawn(
        &mut cmd,
        &format!("envworker ×{n}, sandbox {sandbox} ({tag})"),
        &log,
    );
    tokio::task::block_in_place(|| {
        wait_ready(port, &mut proc);
        if sandbox == "require" {
            // The default took effect (said once, after start-up).
            wait_log(&mut proc, "shell_sandbox=\"require\"");
        }
    });
    let pid = proc.pid();
    let rss_ready_kb = proc_status_kb(pid, "VmHWM");

    let docs: Vec<Value> = (0..n)
        .map(|i| {
            let mut doc = scenario(
                &format!("bench-{tag}-{slug}-{i}"),
                &env.0,
                &format!("Bench Notes {tag} {slug} {i}"),
                SIDE_CALLS,
            );
            setup.store_of_its_own(&mut doc, &format!("{tag}-{slug}-{i}"));
            doc
        })
        .collect();
    let sessions: Vec<String> =
        futures::future::join_all(docs.iter().map(|d| dev.start_scenario(d))).await;
    let hook_ids: Vec<String> = (0..n)
        .map(|i| format!("whe_bench_{tag}_{slug}_{i}"))
        .collect();
    futures::future::join_all(
        sessions
            .iter()
            .zip(&hook_ids)
            .map(|(s, id)| send_webhook(dev, port, &key, id, s, &proc)),
    )
    .await;
    let mut reports = Vec::new();
    for s in &sessions {
        reports.push(dev.passed_report(s, &mut proc).await);
    }
    tokio::task::block_in_place(|| wait_drained(&mut proc, n));
    let peak_rss_kb = proc_status_kb(pid, "VmHWM");
    drop(proc);

    let mut lat = Vec::new();
    let (mut first, mut last) = (i64::MAX, i64::MIN);
    let (mut latest_start, mut earliest_end) = (i64::MIN, i64::MAX);
    for (s, report) in sessions.iter().zip(&reports) {
        let events = dev.events(s).await;
        let steps = report["steps"].as_array().unwrap();
        assert_eq!(steps.len(), SIDE_CALLS + 1);
        let use_id = |i: usize| steps[i]["tool_use_id"].as_str().unwrap().to_string();
        let start = stamp(&events, "agent.tool_use", "id", &use_id(1));
        let end = stamp(
            &events,
            "user.tool_result",
            "tool_use_id",
            &use_id(SIDE_CALLS),
        );
        (first, last) = (first.min(start), last.max(end));
        (latest_start, earliest_end) = (latest_start.max(start), earliest_end.min(end));
        lat.extend(steps[1..].iter().map(|s| {
            s["latency_ms"]
                .as_f64()
                .expect("a measured step has a latency")
        }));
    }
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    SideRun {
        rss_ready_kb,
        peak_rss_kb,
        p50_ms: percentile(&lat, 50.0),
        p99_ms: percentile(&lat, 99.0),
        calls_per_s: lat.len() as f64 / ((last - first) as f64 / 1e6),
        overlap_ms: (earliest_end - latest_start) as f64 / 1e3,
    }
}

/// Always-on poller: (enqueued → first result, enqueued → ack, ack → first result), ms.
async fn poll_run(
    setup: &Setup,
    dev: &Devserver,
    who: Who,
    tag: &str,
    phase: Duration,
) -> (f64, f64, f64) {
    let env = dev.environment().await;
    let workdir = setup.workdir(&format!("{tag}-{}", who.slug()));
    let mut cmd = setup.poll_cmd(who, &env, &dev.url, &workdir);
    let log = setup.root.join(format!("{tag}-{}.log", who.slug()));
    let (mut proc, _) = Proc::spawn(&mut cmd, &format!("{} poller ({tag})", who.label()), &log);
    dev.wait_polling(&env.0, &mut proc).await;
    tokio::time::sleep(phase).await;
    let doc = scenario(
        &format!("bench-{tag}-{}", who.slug()),
        &env.0,
        &format!("Bench Notes {tag} {}", who.slug()),
        SHORT_CALLS,
    );
    let session_id = dev.start_scenario(&doc).await;
    let report = dev.passed_report(&session_id, &mut proc).await;
    drop(proc);
    let events = dev.events(&session_id).await;
    let first = stamp(
        &events,
        "user.tool_result",
        "tool_use_id",
        report["steps"][0]["tool_use_id"].as_str().unwrap(),
    );
    let item = dev.work_item(&env.0).await;
    let created = micros_of(item["created_at"].as_str().unwrap());
    let acked = micros_of(item["acknowledged_at"].as_str().unwrap());
    (
        (first - created) as f64 / 1e3,
        (acked - created) as f64 / 1e3,
        (first - acked) as f64 / 1e3,
    )
}

/// Spawn → the first poll request reaching the stub, ms.
fn first_poll_run(
    setup: &Setup,
    stub: &(String, mpsc::Receiver<Instant>),
    who: Who,
    tag: &str,
) -> f64 {
    while stub.1.try_recv().is_ok() {}
    let env = ("env_stub".to_string(), "sk-ant-envkey-stub".to_string());
    let workdir = setup.workdir(&format!("{tag}-{}", who.slug()));
    let mut cmd = setup.poll_cmd(who, &env, &stub.0, &workdir);
    let log = setup.root.join(format!("{tag}-{}.log", who.slug()));
    let (mut proc, spawned) =
        Proc::spawn(&mut cmd, &format!("{} poller ({tag})", who.label()), &log);
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(at) = stub.1.recv_timeout(Duration::from_millis(50)) {
            return (at - spawned).as_secs_f64() * 1e3;
        }
        proc.assert_alive();
        assert!(
            Instant::now() < deadline,
            "{}: no poll within {READY_TIMEOUT:?}; log:\n{}",
            proc.name,
            proc.log_tail()
        );
    }
}

// ---------------------------------------------------------------- report

struct Row {
    what: String,
    ours: Option<f64>,
    sdk: Option<f64>,
    unit: &'static str,
    /// Higher is better (throughput); else lower is better.
    higher_better: bool,
    /// Say which is better: not for figures decided by chance (poll cadence).
    verdict: bool,
}

fn row(
    what: &str,
    ours: Option<f64>,
    sdk: Option<f64>,
    unit: &'static str,
    higher_better: bool,
) -> Row {
    Row {
        what: what.to_string(),
        ours,
        sdk,
        unit,
        higher_better,
        verdict: true,
    }
}

/// A row whose difference is chance, not the implementation: no verdict.
fn chance(mut r: Row) -> Row {
    r.verdict = false;
    r
}

fn fmt_value(v: Option<f64>, unit: &str) -> String {
    match v {
        None => "—".into(),
        Some(v) if v >= 100.0 => format!("{v:.0} {unit}"),
        Some(v) if v >= 10.0 => format!("{v:.1} {unit}"),
        Some(v) => format!("{v:.2} {unit}"),
    }
}

/// A table of `rows` under the header cells `head` (measure, the two
/// values, their ratio).
fn table(head: [&str; 4], rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| {} | {} | {} | {} | |\n|---|---|---|---|---|",
        head[0], head[1], head[2], head[3]
    );
    for r in rows {
        let (ratio, verdict) = match (r.ours, r.sdk) {
            (Some(o), Some(s)) if s > 0.0 && o > 0.0 && !r.verdict => (
                format!("{:.2}", o / s),
                "chance (both: 999 ms long poll, then 1–3 s jittered sleep)".to_string(),
            ),
            (Some(o), Some(s)) if s > 0.0 && o > 0.0 => {
                let ratio = o / s;
                let better = if r.higher_better {
                    ratio >= 1.0
                } else {
                    ratio <= 1.0
                };
                let factor = if ratio >= 1.0 { ratio } else { 1.0 / ratio };
                let word = match (r.unit, better) {
                    ("MiB", true) => "less memory",
                    ("MiB", false) => "more memory",
                    ("ms CPU", true) => "less CPU",
                    ("ms CPU", false) => "more CPU",
                    (_, true) => "faster",
                    (_, false) => "slower",
                };
                let verdict = if factor < 1.05 {
                    "about the same (within 5%)".to_string()
                } else if factor >= 10.0 {
                    format!("{factor:.0}× {word}")
                } else {
                    format!("{factor:.1}× {word}")
                };
                let ratio = if ratio < 0.1 {
                    format!("{ratio:.4}")
                } else {
                    format!("{ratio:.2}")
                };
                (ratio, verdict)
            }
            _ => ("—".into(), String::new()),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            r.what,
            fmt_value(r.ours, r.unit),
            fmt_value(r.sdk, r.unit),
            ratio,
            verdict
        );
    }
    out
}

fn machine_note() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    format!("{cores} cores ({model}), Linux {kernel}")
}

/// The 1-minute load average: other work on the machine skews every figure.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_string()
}

const BEGIN: &str = "<!-- session-bench:begin (written by `cargo bench --bench session`) -->";
const END: &str = "<!-- session-bench:end -->";

/// Replace the section between the markers of `benches/RESULTS.md` (or
/// write the file with only that section).
fn write_results(section: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/RESULTS.md");
    let block = format!("{BEGIN}\n{section}{END}\n");
    let text = match std::fs::read_to_string(&path) {
        Ok(old) if old.contains(BEGIN) && old.contains(END) => {
            let (head, rest) = old.split_once(BEGIN).unwrap();
            let (_, tail) = rest.split_once(END).unwrap();
            format!("{head}{block}\n{}", tail.trim_start_matches('\n'))
        }
        Ok(old) => format!("{}\n\n{block}", old.trim_end()),
        Err(_) => format!("# Benchmark results\n\n{block}"),
    };
    std::fs::write(&path, text).expect("benches/RESULTS.md is writable");
    println!("written to {}", path.display());
}

// ---------------------------------------------------------------- main

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs: usize = std::env::var("SESSION_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 1)
        .unwrap_or(5);
    let side_n: usize = match std::env::var("SESSION_BENCH_SIDE_BY_SIDE") {
        Ok(v) => v
            .parse()
            .ok()
            .filter(|n| (2..=64).contains(n))
            .unwrap_or_else(|| {
                panic!("SESSION_BENCH_SIDE_BY_SIDE={v:?}: sessions side by side, 2 to 64")
            }),
        Err(_) => SIDE_BY_SIDE,
    };
    // Installs the SDK into target/tmp on first use; fails loudly if it cannot.
    let python = sdk::python();
    let shm = Path::new("/dev/shm");
    let tmp = if shm.is_dir() {
        tempfile::Builder::new()
            .prefix("envworker-session-bench-")
            .tempdir_in(shm)
            .unwrap()
    } else {
        tempfile::Builder::new()
            .prefix("envworker-session-bench-")
            .tempdir()
            .unwrap()
    };
    let setup = Setup {
        envworker: PathBuf::from(env!("CARGO_BIN_EXE_envworker")),
        python,
        script: Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/sdk_session.py"),
        root: tmp.path().to_path_buf(),
    };
    let load_before = load_average();
    let dev = Devserver::start(&setup.envworker, &setup.root);
    println!(
        "session bench: {runs} runs per worker, {CALLS} measured calls per session; devserver {} (data, mounts and workdirs under {}); {}",
        dev.url,
        setup.root.display(),
        machine_note()
    );

    // Warm-up round (page cache, the venv's bytecode): not counted.
    let webhook_workers = [Who::Ours, Who::OursSandboxed, Who::OursPush, Who::Sdk];
    for who in webhook_workers {
        webhook_run(&setup, &dev, who, "warmup", SHORT_CALLS).await;
    }

    println!("\n-- throughput, start-up and memory (webhook-driven; {CALLS} calls)");
    let mut hooks: BTreeMap<&str, Vec<WebhookRun>> = BTreeMap::new();
    for n in 0..runs {
        // Each round starts with the next worker: no worker always runs
        // right after the same other one (the SDK's process and its
        // session still winding down at the start of the run after it).
        let mut order = webhook_workers;
        order.rotate_left(n % webhook_workers.len());
        for who in order {
            // What the run before left running (its process's exit, the
            // devserver's end of its session) settles first.
            tokio::time::sleep(SETTLE).await;
            let r = webhook_run(&setup, &dev, who, &format!("r{n}"), CALLS).await;
            println!(
                "run {n} {:<21} cold {:>7.1} ms | webhook→first result {:>7.1} ms (→ack {:>6.1}, ack→first {:>6.1}) | {:>6.1} calls/s (gap {:>5.2} ms), p50 {:>6.2} ms, p99 {:>7.2} ms | peak {:>6.1} MiB, cpu {:>6.0} ms",
                who.label(),
                r.cold_ms,
                r.first_result_ms,
                r.to_ack_ms,
                r.ack_to_first_ms,
                r.calls_per_s,
                r.gap_ms,
                r.p50_ms,
                r.p99_ms,
                r.peak_rss_kb / 1024.0,
                r.cpu_ms
            );
            hooks.entry(who.label()).or_default().push(r);
        }
    }

    println!(
        "\n-- {side_n} sessions side by side in one `envworker serve --max-concurrent-items {side_n}` ({SIDE_CALLS} calls each)"
    );
    let side_modes = ["require", "off"];
    for sandbox in side_modes {
        side_by_side_run(&setup, &dev, sandbox, side_n, "sidewarmup").await;
    }
    let mut sides: BTreeMap<&str, Vec<SideRun>> = BTreeMap::new();
    for n in 0..runs {
        for sandbox in side_modes {
            let r = side_by_side_run(&setup, &dev, sandbox, side_n, &format!("b{n}")).await;
            println!(
                "run {n} sandbox {sandbox:<7} p50 {:>6.2} ms, p99 {:>7.2} ms, {:>6.1} calls/s (all sessions' calls at once for {:>6.1} ms) | VmHWM ready {:>5.1} MiB, after {:>5.1} MiB",
                r.p50_ms,
                r.p99_ms,
                r.calls_per_s,
                r.overlap_ms,
                r.rss_ready_kb / 1024.0,
                r.peak_rss_kb / 1024.0
            );
            sides.entry(sandbox).or_default().push(r);
        }
    }

    println!("\n-- always-on pollers: enqueued → first result");
    let mut polls: BTreeMap<&str, Vec<(f64, f64, f64)>> = BTreeMap::new();
    for n in 0..runs {
        let phase = Duration::from_millis(POLL_PHASES_MS[n % POLL_PHASES_MS.len()]);
        for who in [Who::Ours, Who::Sdk] {
            let r = poll_run(&setup, &dev, who, &format!("p{n}"), phase).await;
            println!(
                "run {n} {:<9} enqueued at +{:>4} ms after the first poll: →first result {:>7.1} ms (→ack {:>7.1}, ack→first {:>6.1})",
                who.label(),
                phase.as_millis(),
                r.0,
                r.1,
                r.2
            );
            polls.entry(who.label()).or_default().push(r);
        }
    }

    println!("\n-- always-on pollers: spawn → first poll request");
    let stub = poll_stub();
    let mut first_polls: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for n in 0..=runs {
        for who in [Who::Ours, Who::Sdk] {
            let ms = tokio::task::block_in_place(|| {
                first_poll_run(&setup, &stub, who, &format!("s{n}"))
            });
            if n == 0 {
                continue; // warm-up
            }
            println!("run {} {:<9} {:>7.1} ms", n - 1, who.label(), ms);
            first_polls.entry(who.label()).or_default().push(ms);
        }
    }

    // Medians.
    let m = |who: &str, f: &dyn Fn(&WebhookRun) -> f64| Some(median(hooks[who].iter().map(f)));
    let both = |what: &str, f: &dyn Fn(&WebhookRun) -> f64, unit: &'static str, hb: bool| {
        row(what, m("envworker", f), m("sdk", f), unit, hb)
    };
    let pm =
        |who: &str, f: &dyn Fn(&(f64, f64, f64)) -> f64| Some(median(polls[who].iter().map(f)));
    let rows = vec![
        both(
            &format!("1. runner throughput ({CALLS} calls)"),
            &|r| r.calls_per_s,
            "calls/s",
            true,
        ),
        both("1. step latency p50", &|r| r.p50_ms, "ms", false),
        both("1. step latency p99", &|r| r.p99_ms, "ms", false),
        both(
            "1. devserver time between a result and the next call (mean per call)",
            &|r| r.gap_ms,
            "ms",
            false,
        ),
        both(
            "2(i) cold start: spawn → `/readyz` 200 (webhook receiver)",
            &|r| r.cold_ms,
            "ms",
            false,
        ),
        row(
            "2(i) cold start: spawn → first poll request (always-on poller)",
            Some(median(first_polls["envworker"].iter().copied())),
            Some(median(first_polls["sdk"].iter().copied())),
            "ms",
            false,
        ),
        row(
            "2(i) SDK only: spawn → `import anthropic` done",
            None,
            Some(median(hooks["sdk"].iter().filter_map(|r| r.import_ms))),
            "ms",
            false,
        ),
        both(
            "2(ii) signed webhook → first tool result recorded",
            &|r| r.first_result_ms,
            "ms",
            false,
        ),
        both(
            "2(ii) … of which webhook → item acknowledged",
            &|r| r.to_ack_ms,
            "ms",
            false,
        ),
        both(
            "2(ii) … of which acknowledged → first result",
            &|r| r.ack_to_first_ms,
            "ms",
            false,
        ),
        chance(row(
            "2(ii) always-on poller: enqueued → first tool result",
            pm("envworker", &|r| r.0),
            pm("sdk", &|r| r.0),
            "ms",
            false,
        )),
        chance(row(
            "2(ii) … of which enqueued → acknowledged (poll cadence)",
            pm("envworker", &|r| r.1),
            pm("sdk", &|r| r.1),
            "ms",
            false,
        )),
        row(
            "2(ii) … of which acknowledged → first result",
            pm("envworker", &|r| r.2),
            pm("sdk", &|r| r.2),
            "ms",
            false,
        ),
        both(
            &format!("2(iii) peak RSS (VmHWM) after the {CALLS}-call session"),
            &|r| r.peak_rss_kb / 1024.0,
            "MiB",
            false,
        ),
        both(
            "2(iii) VmHWM once ready, before any work",
            &|r| r.rss_ready_kb / 1024.0,
            "MiB",
            false,
        ),
        both(
            &format!("worker CPU during the {CALLS}-call session (own process)"),
            &|r| r.cpu_ms,
            "ms CPU",
            false,
        ),
    ];

    // Per-tool medians, pooled over the runs.
    let mut tools = String::from(
        "| tool | calls per run | envworker p50 | SDK p50 | envworker ÷ SDK |\n|---|---|---|---|---|\n",
    );
    let pooled = |who: &str, tool: &str| {
        median(
            hooks[who]
                .iter()
                .flat_map(|r| r.per_call.iter())
                .filter(|(t, _)| t == tool)
                .map(|(_, l)| *l),
        )
    };
    for tool in ["bash", "read", "write", "edit", "glob", "grep"] {
        let count = hooks["envworker"][0]
            .per_call
            .iter()
            .filter(|(t, _)| t == tool)
            .count();
        let (o, s) = (pooled("envworker", tool), pooled("sdk", tool));
        let _ = writeln!(
            tools,
            "| {tool} | {count} | {o:.2} ms | {s:.2} ms | {:.2} |",
            o / s
        );
    }

    // The shell's sandbox, one session at a time: the same runs, `require` next to `off`.
    let (sandboxed, off) = (Who::OursSandboxed.label(), Who::Ours.label());
    let require_off = |what: &str, f: &dyn Fn(&WebhookRun) -> f64, unit: &'static str, hb: bool| {
        row(what, m(sandboxed, f), m(off, f), unit, hb)
    };
    let sandbox_rows = vec![
        require_off(
            &format!("1. runner throughput ({CALLS} calls)"),
            &|r| r.calls_per_s,
            "calls/s",
            true,
        ),
        require_off("1. step latency p50", &|r| r.p50_ms, "ms", false),
        require_off("1. step latency p99", &|r| r.p99_ms, "ms", false),
        row(
            "1. bash step latency p50 (all runs' bash calls)",
            Some(pooled(sandboxed, "bash")),
            Some(pooled(off, "bash")),
            "ms",
            false,
        ),
        require_off(
            "2(ii) signed webhook → first tool result recorded",
            &|r| r.first_result_ms,
            "ms",
            false,
        ),
        require_off(
            "2(i) cold start: spawn → `/readyz` 200",
            &|r| r.cold_ms,
            "ms",
            false,
        ),
    ];
    // The file tools run in the worker, outside the shell's sandbox: their
    // rows show whether the sandbox's set-up costs them anything per call.
    let sandbox_rows: Vec<_> = sandbox_rows
        .into_iter()
        .chain(["read", "write", "edit", "glob", "grep"].map(|tool| {
            row(
                &format!("1. {tool} step latency p50 (all runs' {tool} calls)"),
                Some(pooled(sandboxed, tool)),
                Some(pooled(off, tool)),
                "ms",
                false,
            )
        }))
        .collect();

    // The change-driven push, one session at a time: the same runs, on next to off.
    let push = Who::OursPush.label();
    let push_rows: Vec<_> = [
        (
            format!("1. runner throughput ({CALLS} calls)"),
            (|r: &WebhookRun| r.calls_per_s) as fn(&WebhookRun) -> f64,
            "calls/s",
            true,
        ),
        ("1. step latency p50".to_string(), |r| r.p50_ms, "ms", false),
        ("1. step latency p99".to_string(), |r| r.p99_ms, "ms", false),
        (
            "2(ii) signed webhook → first tool result recorded".to_string(),
            |r| r.first_result_ms,
            "ms",
            false,
        ),
        (
            "worker CPU during the session (own process)".to_string(),
            |r| r.cpu_ms,
            "ms CPU",
            false,
        ),
    ]
    .into_iter()
    .map(|(what, f, unit, hb)| row(&what, m(push, &f), m("envworker", &f), unit, hb))
    .collect();

    // N sessions side by side in one worker, sandbox `require` (the default there) and `off`.
    let sm =
        |sandbox: &str, f: &dyn Fn(&SideRun) -> f64| Some(median(sides[sandbox].iter().map(f)));
    let side = |what: &str, f: &dyn Fn(&SideRun) -> f64, unit: &'static str, hb: bool| {
        row(what, sm("require", f), sm("off", f), unit, hb)
    };
    // The idle single-session worker of the same sandbox mode (VmHWM once ready, median).
    let idle_single = |sandbox: &str| {
        let who = if sandbox == "require" { sandboxed } else { off };
        median(hooks[who].iter().map(|r| r.rss_ready_kb))
    };
    let (idle_require, idle_off) = (idle_single("require"), idle_single("off"));
    let per_session = |sandbox: &str, idle: f64| {
        Some(median(
            sides[sandbox]
                .iter()
                .map(|r| (r.peak_rss_kb - idle) / side_n as f64 / 1024.0),
        ))
    };
    let side_rows = vec![
        side(
            "step latency p50 (all sessions' calls)",
            &|r| r.p50_ms,
            "ms",
            false,
        ),
        side(
            "step latency p99 (all sessions' calls)",
            &|r| r.p99_ms,
            "ms",
            false,
        ),
        side(
            "throughput, all sessions together",
            &|r| r.calls_per_s,
            "calls/s",
            true,
        ),
        side(
            "worker VmHWM once ready, before any work",
            &|r| r.rss_ready_kb / 1024.0,
            "MiB",
            false,
        ),
        side(
            &format!("worker VmHWM after the {side_n} sessions"),
            &|r| r.peak_rss_kb / 1024.0,
            "MiB",
            false,
        ),
        row(
            "idle single-session worker's VmHWM (the baseline: the one-at-a-time runs above, once ready)",
            Some(idle_require / 1024.0),
            Some(idle_off / 1024.0),
            "MiB",
            false,
        ),
        row(
            &format!(
                "worker memory per extra session: (VmHWM after the {side_n} sessions − the baseline) ÷ {side_n}"
            ),
            per_session("require", idle_require),
            per_session("off", idle_off),
            "MiB",
            false,
        ),
    ];

    let mut command = String::new();
    for var in ["SESSION_BENCH_RUNS", "SESSION_BENCH_SIDE_BY_SIDE"] {
        if let Ok(v) = std::env::var(var) {
            let _ = write!(command, "{var}={v} ");
        }
    }
    command.push_str("cargo bench --bench session");
    let mut section = String::new();
    let _ = writeln!(
        section,
        "Command: `{command}` — {runs} runs per worker (medians), {}; \
         envworker {} ({} build) vs the official Python SDK `anthropic=={}` ({}). \
         Last run: {}; 1-minute load average {} before, {} after (anything above 0 is \
         other work competing for the cores).\n",
        machine_note(),
        env!("CARGO_PKG_VERSION"),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        sdk::SDK_VERSION,
        python_version(&setup.python),
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        load_before,
        load_average(),
    );
    section.push_str(&table(
        ["measure", "envworker", "SDK", "envworker ÷ SDK"],
        &rows,
    ));
    section.push_str(&targets_table(&hooks));
    section.push_str("\nMedian latency per tool (all measured calls of all runs):\n\n");
    section.push_str(&tools);
    let _ = write!(
        section,
        "\nThe agent's shell in a sandbox, one session at a time (the webhook-driven runs above, \
         alternating with them): `envworker serve --shell-sandbox require` next to `off` (the default \
         with one item at a time, the first table's envworker), both on tmpfs:\n\n{}",
        table(
            [
                "measure",
                "`--shell-sandbox require`",
                "`off`",
                "require ÷ off",
            ],
            &sandbox_rows,
        )
    );
    let _ = write!(
        section,
        "\nThe change-driven push (`envworker serve --memory-push`: what the agent writes to the \
         store is uploaded within about a second, not at the next sync), one session at a time in \
         the webhook-driven runs above, next to the default (push off), both on tmpfs:\n\n{}",
        table(
            [
                "measure",
                "`--memory-push`",
                "push off (default)",
                "push ÷ off"
            ],
            &push_rows,
        )
    );
    let _ = write!(
        section,
        "\n{side_n} sessions side by side ({SIDE_CALLS} calls each, started at once, one webhook each) in one \
         `envworker serve --max-concurrent-items {side_n}`: the shell's sandbox `require` (the default \
         there) next to `--shell-sandbox off`, workdirs and stores on tmpfs:\n\n{}",
        table(
            [
                "measure",
                "sandbox `require` (default)",
                "`off`",
                "require ÷ off",
            ],
            &side_rows,
        )
    );
    section.push_str(&phases_table(&hooks, &webhook_workers));
    section.push_str(&supervisor_spawn(&setup));
    section.push_str(&namespace_probe());
    println!("\n{section}");
    write_results(&section);
}

/// Each of our single-session workers against the SDK of the same runs, on
/// the six bounds every one of them is held to (issue 27): a cell says its
/// ratio and whether it is within its bound.
fn targets_table(hooks: &BTreeMap<&str, Vec<WebhookRun>>) -> String {
    let m = |who: &str, f: fn(&WebhookRun) -> f64| median(hooks[who].iter().map(f));
    let sdk = Who::Sdk.label();
    let ratio = |who: &str, f: fn(&WebhookRun) -> f64| m(who, f) / m(sdk, f);
    let mut out = String::from(
        "\nEach single-session worker against the SDK of the same runs, on the bounds each is held \
         to (✓ within, ✗ not):\n\n\
         | envworker | throughput (≥ 3× the SDK) | step p50 (≤ 0.2×) | webhook → first result (≤ 0.08×) \
         | cold start (≤ 6 ms) | worker CPU (≤ 0.1×) | peak RSS (≤ 0.2×) |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let mark = |ok: bool| if ok { "✓" } else { "✗" };
    for (who, what) in [
        (
            Who::Ours,
            "defaults (`--shell-sandbox off` at one item, push off)",
        ),
        (Who::OursPush, "`--memory-push`"),
        (Who::OursSandboxed, "`--shell-sandbox require`"),
    ] {
        let who = who.label();
        let throughput = ratio(who, |r| r.calls_per_s);
        let p50 = ratio(who, |r| r.p50_ms);
        let first = ratio(who, |r| r.first_result_ms);
        let cold = m(who, |r| r.cold_ms);
        let cpu = ratio(who, |r| r.cpu_ms);
        let rss = ratio(who, |r| r.peak_rss_kb);
        let _ = writeln!(
            out,
            "| {what} | {throughput:.2}× {} | {p50:.3} {} | {first:.3} {} | {cold:.2} ms {} | {cpu:.3} {} | {rss:.2} {} |",
            mark(throughput >= 3.0),
            mark(p50 <= 0.2),
            mark(first <= 0.08),
            mark(cold <= 6.0),
            mark(cpu <= 0.1),
            mark(rss <= 0.2),
        );
    }
    out
}

/// Where webhook → first result went in each of our workers (medians of
/// the runs), phase by phase: the per-session set-up's costs, each on a row
/// of its own so a new one shows.
fn phases_table(hooks: &BTreeMap<&str, Vec<WebhookRun>>, workers: &[Who]) -> String {
    let ours: Vec<Who> = workers.iter().copied().filter(|w| *w != Who::Sdk).collect();
    let mut out = String::from(
        "\nWhere a signed webhook → first tool result goes in envworker (the webhook-driven runs \
         above; the bench's clock at the send, the worker's own INFO lines, the devserver's stamp \
         of the result; medians, ms):\n\n| phase |",
    );
    for who in &ours {
        let _ = write!(out, " {} |", who.label());
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(ours.len()));
    out.push('\n');
    let medians: Vec<Option<[f64; 6]>> = ours
        .iter()
        .map(|who| {
            let runs: Vec<[f64; 6]> = hooks
                .get(who.label())?
                .iter()
                .filter_map(|r| r.phases.map(|p| p.values()))
                .collect();
            (!runs.is_empty()).then(|| std::array::from_fn(|i| median(runs.iter().map(|v| v[i]))))
        })
        .collect();
    for (i, name) in SetupPhases::NAMES.iter().enumerate() {
        let _ = write!(out, "| {name} |");
        for m in &medians {
            match m {
                Some(v) => {
                    let _ = write!(out, " {:.2} |", v[i]);
                }
                None => out.push_str(" — |"),
            }
        }
        out.push('\n');
    }
    out
}

/// The session supervisor's own start, the clean room's price at the first
/// `bash` call: `envworker __supervise /bin/true` against `/bin/true`,
/// spawn → exit, medians of 51 alternating runs.
fn supervisor_spawn(setup: &Setup) -> String {
    let time = |cmd: &mut Command| {
        let at = Instant::now();
        let status = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("the command starts");
        assert!(status.success(), "{cmd:?}: {status}");
        at.elapsed().as_secs_f64() * 1e3
    };
    let (mut supervised, mut bare) = (Vec::new(), Vec::new());
    for _ in 0..51 {
        supervised.push(time(
            Command::new(&setup.envworker).args([envworker::cleanroom::SUPERVISE, "/bin/true"]),
        ));
        bare.push(time(&mut Command::new("/bin/true")));
    }
    let (s, b) = (median(supervised), median(bare));
    format!(
        "\nThe session supervisor (the clean room's subreaper; `serve` and `poll` start one ahead, \
         while idle, so this is off the first call's path when a spare is waiting): \
         `envworker __supervise /bin/true` {s:.2} ms against `/bin/true` {b:.2} ms, \
         spawn → exit (its start, and its sweep of what the shell left when the shell exits), \
         medians of 51 alternating runs: {:.2} ms per session.\n",
        s - b
    )
}

/// The shell sandbox's namespace probe, once per replica (a session that
/// comes right after the start waits for it): as the worker runs it, a
/// fork of the calling process whose child tries the namespace
/// (`envworker::cleanroom::probe_namespaces`, here in the bench's own
/// process, larger than a worker's: a fork's cost grows with the parent's
/// mappings), against the same steps after an `execve` of the binary
/// (`envworker __supervise --probe-namespace`, how it ran before
/// 2026-12-05), medians of 51 alternating runs.
fn namespace_probe() -> String {
    let ms = |at: Instant| at.elapsed().as_secs_f64() * 1e3;
    let (mut forked, mut executed) = (Vec::new(), Vec::new());
    let (mut fork_answer, mut exec_answer) = (false, false);
    for _ in 0..51 {
        let at = Instant::now();
        fork_answer = envworker::cleanroom::probe_namespaces();
        forked.push(ms(at));
        let at = Instant::now();
        exec_answer = Command::new(env!("CARGO_BIN_EXE_envworker"))
            .args([
                envworker::cleanroom::SUPERVISE,
                envworker::sandbox::NAMESPACE_PROBE,
            ])
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        executed.push(ms(at));
    }
    assert_eq!(
        fork_answer, exec_answer,
        "the forked probe and the supervisor's probe mode disagree"
    );
    let (f, e) = (median(forked), median(executed));
    format!(
        "\nThe shell sandbox's namespace probe (once per replica, off the start path; a session \
         right after the start waits for its answer): a fork of the worker whose child tries the \
         namespace {f:.2} ms, against the same steps after an `execve` of the binary \
         (`envworker __supervise --probe-namespace`) {e:.2} ms, spawn → answer, medians of 51 \
         alternating runs (namespaces {}).\n",
        if fork_answer {
            "available"
        } else {
            "not available"
        }
    )
}

fn python_version(python: &Path) -> String {
    Command::new(python)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
