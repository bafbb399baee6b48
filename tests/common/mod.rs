//! Shared test harness: an in-process devserver on 127.0.0.1:0 and raw HTTP
//! helpers that send exactly the headers a real client sends.
#![allow(dead_code)]

pub mod cargo_lambda;
pub mod container;
pub mod dev_api;
pub mod fake_memory;
pub mod harness;
pub mod lambda;
pub mod memory_served;
pub mod network;
pub mod otlp;
pub mod process;
pub mod sdk;
pub mod serve_stack;
pub mod served;
pub mod toolbox;
pub mod worker_env;

use envworker::devserver::{Devserver, DevserverConfig, RunningDevserver};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

pub const ADMIN_KEY: &str = "test-admin-key";
pub const MEMORY_BETA: &str = "agent-memory-2026-07-22";
pub const AGENTS_BETA: &str = "managed-agents-2026-04-01";

/// What `POST /dev/scenarios` answers.
#[derive(Debug, Clone)]
pub struct Started {
    pub session_id: String,
    pub environment_id: String,
    pub environment_key: String,
}

/// A session whose first bash call (`command`, its result checked by
/// `first_expect`) outlives a SIGTERM, then one more call: what a worker
/// that terminates mid-call must still leave servable.
pub fn long_call_then_another(command: &str, first_expect: Value) -> Value {
    json!({
        "name": "sigterm-mid-call",
        "steps": [
            {"tool": "bash", "input": {"command": command}, "expect": first_expect},
            {"tool": "bash", "input": {"command": "echo after"}, "expect": {"is_error": false, "contains": "after"}}
        ]
    })
}

/// A scenario file of `events/scenarios/`.
pub fn scenario(name: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("events/scenarios")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub struct TestServer {
    pub running: RunningDevserver,
    pub http: reqwest::Client,
}

/// The answer to one request: status and decoded JSON body (`Value::Null` when empty).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Answer {
    /// Assert an error envelope with this status and `error.type`; returns the message.
    #[track_caller]
    pub fn expect_error(&self, status: u16, kind: &str) -> String {
        assert_eq!(self.status.as_u16(), status, "status of {:#}", self.body);
        assert_eq!(self.body["type"], "error", "{:#}", self.body);
        assert_eq!(self.body["error"]["type"], kind, "{:#}", self.body);
        assert!(
            self.body["request_id"]
                .as_str()
                .is_some_and(|r| r.starts_with("req_")),
            "{:#}",
            self.body
        );
        self.body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    #[track_caller]
    pub fn ok(self) -> Value {
        assert!(self.status.is_success(), "{} {:#}", self.status, self.body);
        self.body
    }
}

impl TestServer {
    pub async fn start() -> TestServer {
        Self::start_with(DevserverConfig::new(ADMIN_KEY)).await
    }

    pub async fn start_with(config: DevserverConfig) -> TestServer {
        let server = Devserver::open(config).expect("devserver opens");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        TestServer {
            running: server.spawn(listener).unwrap(),
            http: reqwest::Client::new(),
        }
    }

    pub fn url(&self) -> String {
        self.running.url()
    }

    /// A request to the memory endpoints with the admin key and the memory beta.
    pub async fn memory(&self, method: Method, path: &str, body: Option<Value>) -> Answer {
        self.send(
            method,
            path,
            body,
            &[
                ("x-api-key", ADMIN_KEY),
                ("anthropic-version", "2023-06-01"),
                ("anthropic-beta", MEMORY_BETA),
            ],
        )
        .await
    }

    /// A request to the managed-agents endpoints (environments, work, sessions)
    /// with the admin key.
    pub async fn agents(&self, method: Method, path: &str, body: Option<Value>) -> Answer {
        self.send(
            method,
            path,
            body,
            &[
                ("x-api-key", ADMIN_KEY),
                ("anthropic-version", "2023-06-01"),
                ("anthropic-beta", AGENTS_BETA),
            ],
        )
        .await
    }

    /// The state of `session`'s work item in `env_id` (`queued`, `claimed`,
    /// `stopped`…); panics, showing the queue, when there is none.
    pub async fn work_state(&self, env_id: &str, session: &str) -> String {
        let work = self
            .agents(
                Method::GET,
                &format!("/v1/environments/{env_id}/work?limit=100"),
                None,
            )
            .await
            .ok();
        work["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["data"]["id"] == session)
            .and_then(|w| w["state"].as_str())
            .unwrap_or_else(|| panic!("no work item for {session}: {work:#}"))
            .to_string()
    }

    /// A request to the managed-agents endpoints with a worker credential.
    pub async fn worker(
        &self,
        key: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Answer {
        let auth = format!("Bearer {key}");
        self.send(
            method,
            path,
            body,
            &[
                ("authorization", &auth),
                ("anthropic-version", "2023-06-01"),
                ("anthropic-beta", AGENTS_BETA),
            ],
        )
        .await
    }

    /// A request to a `/dev` endpoint with the admin key.
    pub async fn dev(&self, method: Method, path: &str, body: Option<Value>) -> Answer {
        self.send(method, path, body, &[("x-api-key", ADMIN_KEY)])
            .await
    }

    /// A new self-hosted environment (`POST /dev/environments`): its id and
    /// its key.
    pub async fn create_environment(&self) -> (String, String) {
        let env = self
            .dev(Method::POST, "/dev/environments", Some(json!({})))
            .await
            .ok();
        (
            env["environment_id"].as_str().unwrap().to_string(),
            env["environment_key"].as_str().unwrap().to_string(),
        )
    }

    /// A session of agent `a` in `env_id`, without resources: its id.
    pub async fn create_session(&self, env_id: &str) -> String {
        let session = self
            .agents(
                Method::POST,
                "/v1/sessions",
                Some(json!({"agent": "a", "environment_id": env_id})),
            )
            .await
            .ok();
        session["id"].as_str().unwrap().to_string()
    }

    /// Load a scenario file from `events/scenarios/` (or any JSON) and start it.
    pub async fn start_scenario(&self, scenario: &Value) -> Started {
        let body = self
            .dev(Method::POST, "/dev/scenarios", Some(scenario.clone()))
            .await
            .ok();
        Started {
            session_id: body["session_id"].as_str().unwrap().to_string(),
            environment_id: body["environment_id"].as_str().unwrap().to_string(),
            environment_key: body["environment_key"].as_str().unwrap().to_string(),
        }
    }

    /// The scenario's report as it stands (`GET /dev/scenarios/{session_id}`).
    pub async fn scenario_report(&self, session_id: &str) -> Value {
        self.dev(Method::GET, &format!("/dev/scenarios/{session_id}"), None)
            .await
            .ok()
    }

    /// The scenario's report once it is no longer `running`.
    pub async fn final_report(&self, session_id: &str, timeout: std::time::Duration) -> Value {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let report = self.scenario_report(session_id).await;
            if report["status"] != "running" {
                return report;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the scenario is still running: {report:#}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// A request with exactly these headers.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut rb = self.http.request(method, format!("{}{}", self.url(), path));
        for (k, v) in headers {
            rb = rb.header(*k, *v);
        }
        if let Some(body) = body {
            rb = rb.json(&body);
        }
        let response = rb.send().await.expect("request reaches the devserver");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.unwrap();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| panic!("body is not JSON: {}", String::from_utf8_lossy(&bytes)))
        };
        Answer {
            status,
            headers,
            body,
        }
    }

    pub async fn create_store(&self, name: &str) -> String {
        let store = self
            .memory(
                Method::POST,
                "/v1/memory_stores",
                Some(json!({ "name": name })),
            )
            .await
            .ok();
        store["id"].as_str().unwrap().to_string()
    }

    pub async fn create_memory(&self, store: &str, path: &str, content: &str) -> Value {
        self.memory(
            Method::POST,
            &format!("/v1/memory_stores/{store}/memories"),
            Some(json!({ "path": path, "content": content })),
        )
        .await
        .ok()
    }

    /// Archive `store`: read-only from now on.
    pub async fn archive_store(&self, store: &str) -> Value {
        self.memory(
            Method::POST,
            &format!("/v1/memory_stores/{store}/archive"),
            None,
        )
        .await
        .ok()
    }

    /// Another writer's edit: the memory `id` of `store` now holds `content`.
    pub async fn update_memory(&self, store: &str, id: &str, content: &str) -> Value {
        self.memory(
            Method::POST,
            &format!("/v1/memory_stores/{store}/memories/{id}"),
            Some(json!({ "content": content })),
        )
        .await
        .ok()
    }

    /// Every item of a listing, following `next_page`; also returns the page count.
    pub async fn list_all(&self, path_and_query: &str) -> (Vec<Value>, usize) {
        let mut items = Vec::new();
        let mut pages = 0;
        let mut page: Option<String> = None;
        loop {
            let sep = if path_and_query.contains('?') {
                '&'
            } else {
                '?'
            };
            let url = match &page {
                Some(p) => format!("{path_and_query}{sep}page={p}"),
                None => path_and_query.to_string(),
            };
            let body = self.memory(Method::GET, &url, None).await.ok();
            pages += 1;
            items.extend(body["data"].as_array().unwrap().iter().cloned());
            match body["next_page"].as_str() {
                Some(next) if !next.is_empty() => page = Some(next.to_string()),
                _ => break,
            }
            assert!(pages < 10_000, "pagination does not end");
        }
        (items, pages)
    }

    /// A session's events, oldest first (up to 1,000).
    pub async fn events(&self, session_id: &str) -> Vec<Value> {
        self.agents(
            Method::GET,
            &format!("/v1/sessions/{session_id}/events?limit=1000"),
            None,
        )
        .await
        .ok()["data"]
            .as_array()
            .unwrap()
            .clone()
    }

    /// A session's `user.tool_result` events, oldest first.
    pub async fn tool_results(&self, session_id: &str) -> Vec<Value> {
        self.events(session_id)
            .await
            .into_iter()
            .filter(|e| e["type"] == "user.tool_result")
            .collect()
    }

    /// Add fault rules to the devserver's (`POST /dev/faults`).
    pub async fn add_faults(&self, rules: Vec<Value>) {
        self.dev(Method::POST, "/dev/faults", Some(json!({ "rules": rules })))
            .await
            .ok();
    }

    /// Clear every fault rule (`DELETE /dev/faults`).
    pub async fn clear_faults(&self) {
        self.dev(Method::DELETE, "/dev/faults", None).await.ok();
    }

    /// The fault rules still active (a rule with `times` retires once used up).
    pub async fn faults(&self) -> Vec<Value> {
        self.dev(Method::GET, "/dev/faults", None).await.ok()["rules"]
            .as_array()
            .unwrap()
            .clone()
    }

    /// The id of the session's first memory store resource.
    pub async fn session_store(&self, session_id: &str) -> String {
        let session = self
            .agents(Method::GET, &format!("/v1/sessions/{session_id}"), None)
            .await
            .ok();
        session["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["type"] == "memory_store")
            .and_then(|r| r["memory_store_id"].as_str())
            .unwrap_or_else(|| panic!("no memory store in {session:#}"))
            .to_string()
    }

    /// A store's memories as path → content.
    pub async fn store_memories(&self, store: &str) -> std::collections::BTreeMap<String, String> {
        let (memories, _) = self
            .list_all(&format!("/v1/memory_stores/{store}/memories?view=full"))
            .await;
        memories
            .iter()
            .map(|m| {
                let content = m["content"].as_str().unwrap_or_default();
                (m["path"].as_str().unwrap().to_string(), content.to_string())
            })
            .collect()
    }

    /// The memories of the session's first store, as path → content.
    pub async fn session_memories(
        &self,
        session_id: &str,
    ) -> std::collections::BTreeMap<String, String> {
        let store = self.session_store(session_id).await;
        self.store_memories(&store).await
    }

    /// Everything the server holds: every store (archived too), with its full
    /// memories and its full version history. Equal snapshots = nothing changed.
    pub async fn snapshot(&self) -> Value {
        let (stores, _) = self
            .list_all("/v1/memory_stores?include_archived=true&limit=100")
            .await;
        let mut out = Vec::new();
        for store in stores {
            let id = store["id"].as_str().unwrap();
            let (memories, _) = self
                .list_all(&format!("/v1/memory_stores/{id}/memories?view=full"))
                .await;
            let (versions, _) = self
                .list_all(&format!(
                    "/v1/memory_stores/{id}/memory_versions?view=full&limit=100"
                ))
                .await;
            out.push(json!({ "store": store, "memories": memories, "versions": versions }));
        }
        Value::Array(out)
    }
}

/// A store's expected contents: path → content.
pub fn contents(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Lowercase hex SHA-256.
pub fn sha256(content: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(content.as_bytes()))
}

/// Root reads and writes everything, so a check that needs a permission
/// error re-runs itself as `nobody` in a child process. Returns `true` when
/// this process should run the check itself; `false` after the child ran it
/// (and passed). The test binary is copied somewhere `nobody` can run it.
pub fn runs_as_nobody(test: &str) -> bool {
    if !rustix::process::geteuid().is_root() {
        return true;
    }
    rerun(test, true);
    false
}

/// A check that measures the whole process (its peak RSS), or that no
/// other test's child may disturb (a fork shares the open files until its
/// `execve`), re-runs itself alone in a child process, so no other test
/// thread counts. Returns `true` in the child, which runs the check;
/// `false` after the child passed.
pub fn runs_alone(test: &str) -> bool {
    if std::env::var_os(ALONE).is_some() {
        return true;
    }
    rerun(test, false);
    false
}

/// Set in the environment of a test re-run alone by [`runs_alone`].
const ALONE: &str = "ENVWORKER_TEST_ALONE";

/// Run this binary's `test` alone in a child (as `nobody` when asked) and
/// assert that it ran and passed. `test` is the function's name or its full
/// path: the child is given the full path (`module::name` in the `it`
/// binary), and a child that ran no test fails the check — a filter that
/// matched nothing would pass it vacuously.
fn rerun(test: &str, as_nobody: bool) {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let full_name = full_test_name(test);
    let dir = tempfile::Builder::new()
        .prefix("envworker-rerun-")
        .tempdir_in("/tmp")
        .unwrap();
    let exe = if as_nobody {
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let exe = dir.path().join("test-binary");
        std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        exe
    } else {
        std::env::current_exe().unwrap()
    };
    // Another test thread forking while the copy's write handle was open
    // makes exec fail with ETXTBSY for a moment: retry that.
    let mut attempts = 0;
    let output = loop {
        let mut command = std::process::Command::new(&exe);
        command
            .args(["--exact", &full_name, "--nocapture", "--test-threads=1"])
            .env("TMPDIR", "/tmp")
            .env(ALONE, "1");
        if as_nobody {
            command.uid(65534).gid(65534);
        }
        match command.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && attempts < 50 => {
                attempts += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => break other.unwrap(),
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    let who = if as_nobody { "as nobody" } else { "alone" };
    assert!(
        output.status.success(),
        "{full_name} failed {who}: {}",
        output.status
    );
    assert!(
        stdout.contains("test result: ok. 1 passed"),
        "{full_name} {who}: the child ran no test"
    );
}

/// The full name (`module::name`) of this binary's test `test`, which is
/// either that or the function's name: exactly one test must answer to it.
fn full_test_name(test: &str) -> String {
    let listed = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--list", "--format", "terse"])
        .output()
        .unwrap();
    let tail = format!("::{test}");
    let found: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .filter(|name| *name == test || name.ends_with(&tail))
        .map(str::to_string)
        .collect();
    assert_eq!(found.len(), 1, "tests answering to {test}: {found:?}");
    found.into_iter().next().unwrap()
}

/// This process's peak resident set size (`VmHWM`), in KiB.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Build a chain of `depth` nested directories named `d` below `root`, each
/// level also holding an empty sibling directory `e` (so a walk keeps one
/// pending sibling per level) and, at the bottom, `bottom` holding
/// `content`. Made by fd (`mkdirat`/`openat`), so a chain thousands deep
/// costs no path resolution; returns the chain's relative path.
pub fn deep_chain(root: &std::path::Path, depth: usize, bottom: &str, content: &str) -> String {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut dir = rustix::fs::open(root, flags, Mode::empty()).unwrap();
    for _ in 0..depth {
        rustix::fs::mkdirat(&dir, "e", Mode::from_raw_mode(0o755)).unwrap();
        rustix::fs::mkdirat(&dir, "d", Mode::from_raw_mode(0o755)).unwrap();
        dir = rustix::fs::openat(&dir, "d", flags, Mode::empty()).unwrap();
    }
    let file = rustix::fs::openat(
        &dir,
        bottom,
        OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .unwrap();
    rustix::io::write(&file, content.as_bytes()).unwrap();
    vec!["d"; depth].join("/")
}

/// The number of descriptors this process holds now.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A count from the environment (a probe's size, e.g. `ENVWORKER_SPARSE_MIB`),
/// or `default` when unset or not a number.
pub fn env_count(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Overflow the kernel's inotify queue for the directories holding `a` and
/// `b` (two existing files): more mode changes than `max_queued_events`,
/// alternating so the kernel merges none (it merges only identical
/// consecutive events). A `chmod` to the mode a file has costs no I/O.
pub fn overflow_inotify(a: &std::path::Path, b: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let queued: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(16_384);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode();
    let (ma, mb) = (mode(a), mode(b));
    for _ in 0..queued / 2 + 100 {
        std::fs::set_permissions(a, std::fs::Permissions::from_mode(ma)).unwrap();
        std::fs::set_permissions(b, std::fs::Permissions::from_mode(mb)).unwrap();
    }
}
