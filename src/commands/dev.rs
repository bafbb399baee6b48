//! `envworker dev`: everything in one process, on loopback — the devserver
//! (control plane over SQLite), the webhook server, and a worker — running
//! a scenario (by default the two-store demo), with a readable timeline of
//! tool calls and syncs. Exits 0 when the scenario's report says `passed`.
//!
//! It exercises the real path end to end: the devserver starts the session
//! and sends a signed `session.status_run_started` webhook; the webhook
//! server verifies it and drains the queue; the worker claims the item,
//! mounts the stores, answers the calls, syncs, and lets go.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::api::types::Redacted;
use crate::cli::DevArgs;
use crate::devserver::{Devserver, DevserverConfig};
use crate::memory::options::SyncInterval;
use crate::serve::{AppState, Endpoint, Mode, serve_container};
use crate::session::CallOutcome;
use crate::webhook::SigningKey;
use crate::worker::poll::DrainOptions;
use crate::worker::{EnvironmentWorker, ItemOutcome, WorkerEvent, WorkerOptions};

/// The built-in demo: two stores (one read-only), reads, writes, a refused
/// write, a local delete, a remote edit that reaches the disk.
pub const DEMO_SCENARIO: &str = include_str!("../../events/scenarios/two-stores-sync.json");

/// How long the whole run may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let scenario = load_scenario(&args)?;
    let tmp = tempfile::Builder::new()
        .prefix("envworker-dev-")
        .tempdir()?;
    let root = tmp.path().to_path_buf();
    let work = root.join("work");
    let scenario = prepare_host(&scenario, &root, &work)?;
    let (stack, mut timeline) = Stack::start(&root, &work).await?;

    let mut out = std::io::stdout();
    print_header(&mut out, &scenario, &stack, &root)?;
    let session_id = stack.start_session(&scenario).await?;
    let t0 = Instant::now();
    let printer = Printer {
        t0,
        // Paths print relative to the run's directory.
        prefix: format!("{}/", root.display()),
    };
    writeln!(
        out,
        "{}  session   {session_id} started; the devserver sends session.status_run_started",
        printer.at()
    )?;

    // Print the timeline until the scenario's report is final.
    let report = loop {
        tokio::select! {
            event = timeline.recv() => {
                if let Some(event) = event {
                    printer.event(&mut out, event)?;
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                let report = stack.report(&session_id).await?;
                if report["status"] != "running" {
                    break report;
                }
                if t0.elapsed() > RUN_TIMEOUT {
                    bail!("the scenario did not finish within {}s", RUN_TIMEOUT.as_secs());
                }
            }
        }
    };
    // Drain what is left of the timeline.
    while let Ok(event) = timeline.try_recv() {
        if let WorkerEvent::Finished(item) = event {
            writeln!(
                out,
                "{}  released  {:?}, item stopped: {}",
                printer.at(),
                item.outcome,
                item.stopped
            )?;
        }
    }
    let passed = print_result(&mut out, &report, t0)?;

    stack.stop().await;
    if args.keep {
        let kept = tmp.keep();
        writeln!(out, "kept {}", kept.display())?;
    }
    if !passed {
        bail!("the scenario failed");
    }
    Ok(())
}

/// The scenario file named, or the built-in demo.
fn load_scenario(args: &DevArgs) -> anyhow::Result<Value> {
    match &args.scenario {
        Some(path) => serde_json::from_str(
            &std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?,
        )
        .with_context(|| format!("{} is not JSON", path.display())),
        None => serde_json::from_str(DEMO_SCENARIO).context("the built-in scenario"),
    }
}

/// What the scenario's host must hold first (`prepare`), with `{root}` and
/// `{workdir}` replaced throughout, as any runner of a worker does: the
/// scenario as it then reads.
fn prepare_host(scenario: &Value, root: &Path, work: &Path) -> anyhow::Result<Value> {
    std::fs::create_dir_all(work)?;
    let scenario = crate::devserver::scenario::format::substitute_host(scenario, root, work);
    if let Some(prepare) = scenario.get("prepare") {
        let prepare: crate::devserver::scenario::format::Prepare =
            serde_json::from_value(prepare.clone()).context("the scenario's prepare")?;
        prepare
            .apply(root, work)
            .context("cannot prepare the scenario's host")?;
    }
    Ok(scenario)
}

/// The devserver, the webhook server and its worker, on loopback.
struct Stack {
    devserver: crate::devserver::RunningDevserver,
    api: String,
    http: reqwest::Client,
    admin_key: String,
    environment_id: String,
    webhook_url: String,
    stop_serving: tokio_util::sync::CancellationToken,
    serving: tokio::task::JoinHandle<std::io::Result<bool>>,
}

impl Stack {
    /// Start everything; the worker's events come on the receiver.
    async fn start(
        root: &Path,
        work: &Path,
    ) -> anyhow::Result<(Stack, mpsc::UnboundedReceiver<WorkerEvent>)> {
        let admin_key = format!("dev-admin-{:016x}", rand::random::<u64>());
        let (signing_key, signing_secret) = SigningKey::generate();
        // The webhook server's port first: the devserver needs its URL.
        let serve_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let webhook_url = format!("http://{}/webhooks/default", serve_listener.local_addr()?);
        let devserver = Devserver::open(
            DevserverConfig::new(admin_key.clone())
                .data_dir(root.join("data"))
                .mount_root(root.join("mnt").display().to_string())
                .webhook(webhook_url.clone(), SigningKey::parse(&signing_secret)?),
        )
        .context("cannot start the devserver")?;
        let devserver = devserver.spawn(tokio::net::TcpListener::bind("127.0.0.1:0").await?)?;
        let api = devserver.url();
        let http = crate::tls::client_builder()
            .build()
            .context("cannot build the HTTP client")?;
        let (environment_id, environment_key) = create_environment(&http, &api, &admin_key).await?;

        let (events, timeline) = mpsc::unbounded_channel();
        let mut options = WorkerOptions::new(&environment_id, &api);
        options.environment_key = Some(Redacted::new(environment_key));
        options.workdir = work.to_path_buf();
        options.state_dir = Some(root.join("state"));
        options.max_idle = Some(Duration::from_secs(2));
        options.memory_sync_interval = SyncInterval::every(Duration::from_secs(5))?;
        options.worker_id = "envworker-dev".into();
        options.events = Some(events);
        let worker = EnvironmentWorker::new(options)?;
        let state = AppState::new(
            vec![Endpoint::new(
                "default",
                vec![signing_key],
                worker,
                DrainOptions::default(),
            )],
            Mode::Container,
        );
        let stop_serving = tokio_util::sync::CancellationToken::new();
        let serving = {
            let stop = stop_serving.clone();
            tokio::spawn(serve_container(
                serve_listener,
                state,
                async move { stop.cancelled().await },
                Duration::from_secs(75),
            ))
        };
        let stack = Stack {
            devserver,
            api,
            http,
            admin_key,
            environment_id,
            webhook_url,
            stop_serving,
            serving,
        };
        Ok((stack, timeline))
    }

    /// Start the scenario's session in the environment this worker serves.
    async fn start_session(&self, scenario: &Value) -> anyhow::Result<String> {
        let mut body = scenario.clone();
        if let Some(obj) = body.as_object_mut() {
            obj.insert("environment_id".into(), json!(self.environment_id));
        }
        let started: Value = self
            .http
            .post(format!("{}/dev/scenarios", self.api))
            .header("x-api-key", &self.admin_key)
            .json(&body)
            .send()
            .await?
            .json()
            .await?;
        match started["session_id"].as_str() {
            Some(id) => Ok(id.to_string()),
            None => bail!("the devserver refused the scenario: {started}"),
        }
    }

    /// The scenario's report as it stands.
    async fn report(&self, session_id: &str) -> anyhow::Result<Value> {
        Ok(self
            .http
            .get(format!("{}/dev/scenarios/{session_id}", self.api))
            .header("x-api-key", &self.admin_key)
            .send()
            .await?
            .json()
            .await?)
    }

    async fn stop(self) {
        self.stop_serving.cancel();
        let _ = self.serving.await;
        self.devserver.shutdown().await;
    }
}

/// A new environment on the devserver: its id and key.
async fn create_environment(
    http: &reqwest::Client,
    api: &str,
    admin_key: &str,
) -> anyhow::Result<(String, String)> {
    let environment: Value = http
        .post(format!("{api}/dev/environments"))
        .header("x-api-key", admin_key)
        .json(&json!({"name": "envworker dev"}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let field = |name: &str| -> anyhow::Result<String> {
        Ok(environment[name]
            .as_str()
            .context(name.to_string())?
            .to_string())
    };
    Ok((field("environment_id")?, field("environment_key")?))
}

fn print_header(
    out: &mut impl Write,
    scenario: &Value,
    stack: &Stack,
    root: &Path,
) -> anyhow::Result<()> {
    let name = scenario["name"].as_str().unwrap_or("scenario");
    let steps = scenario["steps"].as_array().map(Vec::len).unwrap_or(0);
    writeln!(out, "envworker dev — scenario {name:?} ({steps} steps)")?;
    writeln!(
        out,
        "  control plane  {}  (devserver, SQLite in {})",
        stack.api,
        root.join("data").display()
    )?;
    writeln!(out, "  webhooks       {}", stack.webhook_url)?;
    writeln!(
        out,
        "  workdir        {}  (paths below are relative to {})",
        root.join("work").display(),
        root.display()
    )?;
    writeln!(out)?;
    Ok(())
}

/// The timeline's lines: seconds since the session started, paths
/// relative to the run's directory.
struct Printer {
    t0: Instant,
    prefix: String,
}

impl Printer {
    fn at(&self) -> String {
        format!("{:>6.2}s", self.t0.elapsed().as_secs_f64())
    }

    fn short(&self, text: String) -> String {
        text.replace(&self.prefix, "")
    }

    fn event(&self, out: &mut impl Write, event: WorkerEvent) -> std::io::Result<()> {
        let at = self.at();
        match event {
            WorkerEvent::Claimed {
                work_id,
                session_id,
                ..
            } => writeln!(
                out,
                "{at}  claimed   {work_id} for {session_id}; stores mounted"
            ),
            WorkerEvent::Call { record, .. } => {
                let (mark, how) = match record.outcome {
                    CallOutcome::Answered {
                        is_error: false, ..
                    } => ("ok   ", ""),
                    CallOutcome::Answered { is_error: true, .. } => ("error", ""),
                    CallOutcome::Denied => ("denied", " (not run)"),
                    CallOutcome::NotOwned => ("left ", " (not ours)"),
                };
                let detail = self.short(record.detail.unwrap_or_default());
                let summary = record
                    .summary
                    .map(|s| format!(" → {}", self.short(s)))
                    .unwrap_or_default();
                writeln!(
                    out,
                    "{at}  tool      {:<5} {mark} {:>5}ms  {detail}{how}{summary}",
                    record.name,
                    record.duration.as_millis()
                )
            }
            WorkerEvent::Synced { report, .. } => writeln!(
                out,
                "{at}  sync      {} pulled, {} uploaded, {} deleted, {} held{}",
                report.pulls,
                report.uploads,
                report.deletes,
                report.deletes_held,
                if report.conflicts > 0 {
                    format!(", {} conflicts", report.conflicts)
                } else {
                    String::new()
                }
            ),
            WorkerEvent::Finished(item) => {
                let how = match &item.outcome {
                    ItemOutcome::Served(end) => format!("session ended ({end:?})"),
                    other => format!("{other:?}"),
                };
                writeln!(
                    out,
                    "{at}  released  {how}; final sync and flush ({} uploaded), folders removed, item {}",
                    item.teardown.flushed,
                    if item.stopped {
                        "stopped"
                    } else {
                        "left to its new owner"
                    }
                )
            }
            WorkerEvent::QueueError { .. } => Ok(()),
        }
    }
}

/// The result's lines: passed or not, each store's final paths, the
/// failures. Whether the scenario passed.
fn print_result(out: &mut impl Write, report: &Value, t0: Instant) -> anyhow::Result<bool> {
    writeln!(out)?;
    let passed = report["status"] == "passed";
    let steps = report["steps"].as_array().cloned().unwrap_or_default();
    let ok = steps.iter().filter(|s| s["status"] == "passed").count();
    writeln!(
        out,
        "result: {} — {ok}/{} steps passed in {:.1}s",
        if passed { "PASSED" } else { "FAILED" },
        steps.len(),
        t0.elapsed().as_secs_f64()
    )?;
    if let Some(stores) = report["final_contents"].as_object() {
        for (key, memories) in stores {
            let paths: Vec<&str> = memories
                .as_object()
                .map(|m| m.keys().map(String::as_str).collect())
                .unwrap_or_default();
            writeln!(out, "  store {key:<8} {}", paths.join(", "))?;
        }
    }
    for failure in report["failures"].as_array().into_iter().flatten() {
        writeln!(out, "  failure: {}", failure.as_str().unwrap_or_default())?;
    }
    out.flush()?;
    Ok(passed)
}
