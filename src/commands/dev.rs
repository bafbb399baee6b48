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
    let scenario: Value = match &args.scenario {
        Some(path) => serde_json::from_str(
            &std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?,
        )
        .with_context(|| format!("{} is not JSON", path.display()))?,
        None => serde_json::from_str(DEMO_SCENARIO).context("the built-in scenario")?,
    };
    let tmp = tempfile::Builder::new()
        .prefix("envworker-dev-")
        .tempdir()?;
    let root = tmp.path().to_path_buf();
    // What the scenario's host must hold first (`prepare`), with `{root}`
    // and `{workdir}` replaced throughout, as any runner of a worker does.
    let work = root.join("work");
    std::fs::create_dir_all(&work)?;
    let scenario = crate::devserver::scenario::format::substitute_host(&scenario, &root, &work);
    if let Some(prepare) = scenario.get("prepare") {
        let prepare: crate::devserver::scenario::format::Prepare =
            serde_json::from_value(prepare.clone()).context("the scenario's prepare")?;
        prepare
            .apply(&root, &work)
            .context("cannot prepare the scenario's host")?;
    }
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
    let environment: Value = http
        .post(format!("{api}/dev/environments"))
        .header("x-api-key", &admin_key)
        .json(&json!({"name": "envworker dev"}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let environment_id = environment["environment_id"]
        .as_str()
        .context("environment_id")?
        .to_string();
    let environment_key = environment["environment_key"]
        .as_str()
        .context("environment_key")?
        .to_string();

    let (events, mut timeline) = mpsc::unbounded_channel();
    let mut options = WorkerOptions::new(&environment_id, &api);
    options.environment_key = Some(Redacted::new(environment_key));
    options.workdir = work.clone();
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

    let name = scenario["name"].as_str().unwrap_or("scenario").to_string();
    let steps = scenario["steps"].as_array().map(Vec::len).unwrap_or(0);
    let mut out = std::io::stdout();
    writeln!(out, "envworker dev — scenario {name:?} ({steps} steps)")?;
    writeln!(
        out,
        "  control plane  {api}  (devserver, SQLite in {})",
        root.join("data").display()
    )?;
    writeln!(out, "  webhooks       {webhook_url}")?;
    writeln!(
        out,
        "  workdir        {}  (paths below are relative to {})",
        root.join("work").display(),
        root.display()
    )?;
    writeln!(out)?;

    // The session runs in the environment this worker serves.
    let mut body = scenario.clone();
    if let Some(obj) = body.as_object_mut() {
        obj.insert("environment_id".into(), json!(environment_id));
    }
    let started: Value = http
        .post(format!("{api}/dev/scenarios"))
        .header("x-api-key", &admin_key)
        .json(&body)
        .send()
        .await?
        .json()
        .await?;
    let Some(session_id) = started["session_id"].as_str().map(str::to_string) else {
        bail!("the devserver refused the scenario: {started}");
    };
    let t0 = Instant::now();
    let at = |t0: Instant| format!("{:>6.2}s", t0.elapsed().as_secs_f64());
    // Paths print relative to the run's directory.
    let prefix = format!("{}/", root.display());
    let short = |text: String| text.replace(&prefix, "");
    writeln!(
        out,
        "{}  session   {session_id} started; the devserver sends session.status_run_started",
        at(t0)
    )?;

    // Print the timeline until the scenario's report is final.
    let report = loop {
        tokio::select! {
            event = timeline.recv() => match event {
                Some(WorkerEvent::Claimed { work_id, session_id, .. }) => {
                    writeln!(out, "{}  claimed   {work_id} for {session_id}; stores mounted", at(t0))?;
                }
                Some(WorkerEvent::Call { record, .. }) => {
                    let (mark, how) = match record.outcome {
                        CallOutcome::Answered { is_error: false, .. } => ("ok   ", String::new()),
                        CallOutcome::Answered { is_error: true, .. } => ("error", String::new()),
                        CallOutcome::Denied => ("denied", " (not run)".to_string()),
                        CallOutcome::NotOwned => ("left ", " (not ours)".to_string()),
                    };
                    let detail = short(record.detail.unwrap_or_default());
                    let summary = record.summary.map(|s| format!(" → {}", short(s))).unwrap_or_default();
                    writeln!(
                        out,
                        "{}  tool      {:<5} {mark} {:>5}ms  {detail}{how}{summary}",
                        at(t0),
                        record.name,
                        record.duration.as_millis()
                    )?;
                }
                Some(WorkerEvent::Synced { report, .. }) => {
                    writeln!(
                        out,
                        "{}  sync      {} pulled, {} uploaded, {} deleted, {} held{}",
                        at(t0),
                        report.pulls,
                        report.uploads,
                        report.deletes,
                        report.deletes_held,
                        if report.conflicts > 0 { format!(", {} conflicts", report.conflicts) } else { String::new() }
                    )?;
                }
                Some(WorkerEvent::Finished(item)) => {
                    let how = match &item.outcome {
                        ItemOutcome::Served(end) => format!("session ended ({end:?})"),
                        other => format!("{other:?}"),
                    };
                    writeln!(
                        out,
                        "{}  released  {how}; final sync and flush ({} uploaded), folders removed, item {}",
                        at(t0),
                        item.teardown.flushed,
                        if item.stopped { "stopped" } else { "left to its new owner" }
                    )?;
                }
                Some(WorkerEvent::QueueError { .. }) | None => {}
            },
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                let report: Value = http
                    .get(format!("{api}/dev/scenarios/{session_id}"))
                    .header("x-api-key", &admin_key)
                    .send()
                    .await?
                    .json()
                    .await?;
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
                at(t0),
                item.outcome,
                item.stopped
            )?;
        }
    }

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

    stop_serving.cancel();
    let _ = serving.await;
    devserver.shutdown().await;
    if args.keep {
        let kept = tmp.keep();
        writeln!(out, "kept {}", kept.display())?;
    }
    if !passed {
        bail!("the scenario failed");
    }
    Ok(())
}
