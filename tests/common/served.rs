//! One scenario served end to end, on a fresh devserver, by either worker:
//! the official SDK's `EnvironmentWorker` (through `tests/conformance/sdk_worker.py`)
//! or envworker's. Both get the same scenario, the same host (a fresh root
//! holding the workdir, the mount root and whatever the scenario's
//! `prepare` puts there; `{root}` and `{workdir}` replaced), the same
//! settings ([`Knobs`]) and the same checks; what each left on the server
//! and sent to it is kept for the caller to compare ([`Served`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::time::Duration;

use envworker::api::types::Redacted;
use envworker::devserver::DevserverConfig;
use envworker::devserver::scenario::format::{Prepare, substitute_host};
use envworker::memory::options::SyncInterval;
use envworker::worker::poll::DrainOptions;
use envworker::worker::{EnvironmentWorker, WorkerOptions};
use reqwest::Method;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{ADMIN_KEY, TestServer, sdk};

/// The settings both workers run with (the SDK worker's names).
#[derive(Debug, Clone, Copy)]
pub struct Knobs {
    pub memory_sync_interval: Duration,
    pub max_idle: Duration,
    /// The bound of the final sync and, separately, of the flush.
    pub flush_timeout: Duration,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            memory_sync_interval: Duration::from_secs(5),
            max_idle: Duration::from_secs(1),
            flush_timeout: Duration::from_secs(30),
        }
    }
}

/// A scenario, the settings to serve it with, and the skills the devserver
/// must hold first (their ids replace `{skill:NAME}` in the scenario).
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub doc: Value,
    pub knobs: Knobs,
    /// `POST /dev/skills` bodies, each with a `name`.
    pub skills: Vec<Value>,
}

impl Case {
    pub fn new(name: &str, doc: Value) -> Case {
        Case {
            name: name.to_string(),
            doc,
            knobs: Knobs::default(),
            skills: Vec::new(),
        }
    }

    /// A scenario file of `events/scenarios/`, default settings.
    pub fn file(name: &str) -> Case {
        Case::new(name, super::scenario(name))
    }

    pub fn knobs(mut self, knobs: Knobs) -> Case {
        self.knobs = knobs;
        self
    }

    pub fn skill(mut self, body: Value) -> Case {
        self.skills.push(body);
        self
    }

    /// Upload the skills, then start the scenario on `server`.
    async fn start(&self, server: &TestServer, doc: &Value) -> super::Started {
        let mut text = doc.to_string();
        for body in &self.skills {
            let made = server
                .dev(Method::POST, "/dev/skills", Some(body.clone()))
                .await
                .ok();
            let name = body["name"].as_str().expect("a skill body has a name");
            text = text.replace(
                &format!("{{skill:{name}}}"),
                made["skill_id"].as_str().unwrap(),
            );
        }
        server
            .start_scenario(&serde_json::from_str(&text).unwrap())
            .await
    }
}

/// One memory version the worker's session made, as the server recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// `created`, `modified` or `deleted`.
    pub operation: String,
    pub path: String,
    pub content_sha256: Option<String>,
}

/// A memory create or update the worker sent, as the devserver received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// The memory's path: the create's, or the updated memory's (from the
    /// server's versions); `None` when the server never knew the memory.
    pub path: Option<String>,
    pub content_sha256: Option<String>,
    pub status: u16,
    /// When it arrived, µs since the epoch.
    pub at_us: i64,
}

pub struct Served {
    pub report: Value,
    /// Per store key and memory path: the versions the session made,
    /// oldest first. (The order across paths within one sync pass is the
    /// pass's own business: uploads run side by side.)
    pub versions: BTreeMap<String, BTreeMap<String, Vec<Version>>>,
    /// The memory creates and updates the worker sent, in arrival order.
    pub writes: Vec<Write>,
    /// Every request the worker sent (method and path), in arrival order.
    pub requests: Vec<(String, String)>,
    /// The status each of `requests` was answered with (an injected fault's
    /// included), in the same order.
    pub statuses: Vec<u16>,
    /// What the worker logged (the SDK's stderr; envworker's is not kept).
    pub log: String,
    /// The host's root; the workdir is `root/work`.
    pub root: tempfile::TempDir,
    /// The devserver's compiled statements once the session ended.
    pub statements: Vec<envworker::devserver::StatementStats>,
}

/// A fresh host for one run: `root/work` (the workdir) and `root/mnt/memory`
/// (the mount root), the scenario's placeholders replaced and its
/// `prepare` applied.
struct Host {
    root: tempfile::TempDir,
    workdir: PathBuf,
    mount_root: PathBuf,
    doc: Value,
}

impl Host {
    fn new(doc: &Value) -> Host {
        let root = tempfile::tempdir().unwrap();
        // Canonical: a temp dir reached through a symlink would make the
        // scenario's paths differ from the ones the worker reports.
        let base = std::fs::canonicalize(root.path()).unwrap();
        let workdir = base.join("work");
        let mount_root = base.join("mnt/memory");
        std::fs::create_dir_all(&workdir).unwrap();
        let doc = substitute_host(doc, &base, &workdir);
        if let Some(prepare) = doc.get("prepare") {
            let prepare: Prepare = serde_json::from_value(prepare.clone()).unwrap();
            prepare.apply(&base, &workdir).unwrap();
        }
        Host {
            root,
            workdir,
            mount_root,
            doc,
        }
    }

    async fn server(&self) -> TestServer {
        TestServer::start_with(
            DevserverConfig::new(ADMIN_KEY).mount_root(self.mount_root.to_str().unwrap()),
        )
        .await
    }
}

fn check(name: &str, doc: &Value, report: &Value, mount_root: &Path) {
    assert_eq!(report["status"], "passed", "{name}: {report:#}");
    assert_eq!(report["failures"], serde_json::json!([]));
    // Every store the scenario names holds exactly what it expects.
    for (key, want) in doc["expect_final"].as_object().into_iter().flatten() {
        assert_eq!(&report["final_contents"][key], want, "{name}: store {key}");
    }
    // The worker removed the folders it mounted.
    assert_eq!(
        std::fs::read_dir(mount_root)
            .map(|d| d.count())
            .unwrap_or(0),
        0,
        "{name}: mount folders left behind"
    );
}

/// What the session left on the server and what the worker sent it.
async fn collect(
    name: &str,
    doc: &Value,
    server: &TestServer,
    session_id: &str,
    log: String,
    host: Host,
) -> Served {
    let report = server
        .final_report(session_id, Duration::from_secs(120))
        .await;
    check(name, doc, &report, &host.mount_root);
    let mut versions = BTreeMap::new();
    let mut path_of = BTreeMap::new();
    for (key, store) in report["stores"].as_object().into_iter().flatten() {
        let id = store["memory_store_id"].as_str().unwrap();
        let (listed, _) = server
            .list_all(&format!("/v1/memory_stores/{id}/memory_versions?limit=100"))
            .await;
        let mut made: BTreeMap<String, Vec<Version>> = BTreeMap::new();
        // Newest first on the wire.
        for v in listed.iter().rev() {
            if let Some(path) = v["path"].as_str() {
                path_of.insert(
                    v["memory_id"].as_str().unwrap().to_string(),
                    path.to_string(),
                );
            }
            if v["created_by"]["type"] != "session_actor" {
                continue;
            }
            let path = v["path"].as_str().unwrap_or_default().to_string();
            made.entry(path.clone()).or_default().push(Version {
                operation: v["operation"].as_str().unwrap().to_string(),
                path,
                content_sha256: v["content_sha256"].as_str().map(str::to_string),
            });
        }
        versions.insert(key.clone(), made);
    }
    let logged = server.dev(Method::GET, "/dev/requests", None).await.ok();
    let mut writes = Vec::new();
    let mut requests = Vec::new();
    let mut statuses = Vec::new();
    for r in logged["data"].as_array().into_iter().flatten() {
        if r["auth"] != "bearer" {
            continue;
        }
        let (method, path) = (r["method"].as_str().unwrap(), r["path"].as_str().unwrap());
        requests.push((method.to_string(), path.to_string()));
        statuses.push(r["status"].as_u64().unwrap() as u16);
        let Some(write) = r.get("memory_write") else {
            continue;
        };
        let target = write["path"].as_str().map(str::to_string).or_else(|| {
            let id = path.rsplit('/').next().unwrap_or_default();
            path_of.get(id).cloned()
        });
        writes.push(Write {
            path: target,
            content_sha256: write["content_sha256"].as_str().map(str::to_string),
            status: r["status"].as_u64().unwrap() as u16,
            at_us: r["received_at_us"].as_i64().unwrap(),
        });
    }
    Served {
        report,
        versions,
        writes,
        requests,
        statuses,
        log,
        root: host.root,
        statements: server.running.state().db().statement_stats(),
    }
}

/// The SDK's worker serves the case.
pub async fn by_the_sdk(case: &Case) -> Served {
    let (name, knobs) = (case.name.as_str(), case.knobs);
    let host = Host::new(&case.doc);
    let server = host.server().await;
    let started = case.start(&server, &host.doc).await;
    let url = server.url();
    let work = host.workdir.to_str().unwrap().to_string();
    let s = started.clone();
    let (stdout, stderr) = tokio::task::spawn_blocking(move || {
        sdk::run_script_with_stderr(
            "sdk_worker.py",
            &[
                ("ENVWORKER_URL", &url),
                ("ENVWORKER_ENVIRONMENT_ID", &s.environment_id),
                ("ENVWORKER_ENVIRONMENT_KEY", &s.environment_key),
                ("ENVWORKER_WORKDIR", &work),
                (
                    "SDK_SYNC_INTERVAL",
                    &knobs.memory_sync_interval.as_secs_f64().to_string(),
                ),
                ("SDK_MAX_IDLE", &knobs.max_idle.as_secs_f64().to_string()),
                (
                    "SDK_FLUSH_TIMEOUT",
                    &knobs.flush_timeout.as_secs_f64().to_string(),
                ),
            ],
        )
    })
    .await
    .unwrap();
    assert!(stdout.contains("served work_"), "{stdout}\n{stderr}");
    let doc = host.doc.clone();
    if std::env::var_os("ENVWORKER_TEST_LOG").is_some() {
        eprintln!("--- the SDK's worker, {name}:\n{stderr}");
    }
    let who = format!("{name} (the SDK's worker)");
    collect(&who, &doc, &server, &started.session_id, stderr, host).await
}

/// envworker's worker serves the case, the queue drained once.
pub async fn by_envworker(case: &Case) -> Served {
    by_envworker_with(case, |_| {}).await
}

/// [`by_envworker`] with `adjust` applied to the worker's options last.
pub async fn by_envworker_with(case: &Case, adjust: impl FnOnce(&mut WorkerOptions)) -> Served {
    let (name, knobs) = (case.name.as_str(), case.knobs);
    // `ENVWORKER_TEST_LOG=debug` shows envworker's logs (a debugging aid).
    if let Ok(level) = std::env::var("ENVWORKER_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(level)
            .with_writer(std::io::stderr)
            .try_init();
    }
    let host = Host::new(&case.doc);
    let server = host.server().await;
    let started = case.start(&server, &host.doc).await;
    let mut options = WorkerOptions::new(&started.environment_id, server.url());
    options.environment_key = Some(Redacted::new(started.environment_key.clone()));
    options.workdir = host.workdir.clone();
    options.max_idle = Some(knobs.max_idle);
    options.memory_sync_interval = SyncInterval::every(knobs.memory_sync_interval).unwrap();
    options.memory_teardown_bound = knobs.flush_timeout;
    adjust(&mut options);
    let worker = EnvironmentWorker::new(options).unwrap();
    let drained = worker
        .drain(CancellationToken::new(), DrainOptions::default())
        .await
        .unwrap();
    assert_eq!(drained.items.len(), 1, "{name}: one item served");
    let doc = host.doc.clone();
    collect(
        &format!("{name} (envworker)"),
        &doc,
        &server,
        &started.session_id,
        String::new(),
        host,
    )
    .await
}

impl Served {
    /// The workdir as the worker left it ([`tree`]).
    pub fn workdir_tree(&self) -> BTreeMap<String, String> {
        let root = std::fs::canonicalize(self.root.path()).unwrap();
        tree(&root, &root.join("work"))
    }
}

/// Everything under `dir`: relative path → what it is (`file: <content>`,
/// `dir`, `link -> <target>`), `root` written `{root}` in contents and
/// targets, so two hosts' trees can be compared.
pub fn tree(root: &Path, dir: &Path) -> BTreeMap<String, String> {
    let root_text = root.display().to_string();
    let host = |text: String| text.replace(&root_text, "{root}");
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).into_iter().flatten().flatten() {
            let path = entry.path();
            let rel = path.strip_prefix(dir).unwrap().display().to_string();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let what = if meta.file_type().is_symlink() {
                host(format!(
                    "link -> {}",
                    std::fs::read_link(&path).unwrap().display()
                ))
            } else if meta.is_dir() {
                stack.push(path.clone());
                "dir".to_string()
            } else {
                host(format!(
                    "file: {}",
                    String::from_utf8_lossy(&std::fs::read(&path).unwrap())
                ))
            };
            out.insert(rel, what);
        }
    }
    out
}
