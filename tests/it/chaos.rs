//! Chaos over the real binaries (issue 14, "Done when"): scripted sessions
//! with memory edits on one devserver, served by three `envworker serve`
//! replicas that are killed (SIGKILL or SIGTERM, seeded) and restarted on the
//! same directories while a third of the webhooks are lost.
//!
//! The replicas share one disk, as containers sharing a volume on one host
//! do: the devserver's mount root (stores live at their advertised paths) and
//! one `--state-dir`, so the replica that takes over a session after a
//! SIGKILL recovers the folder the dead one left. Each replica has its own
//! workdir, port and worker id, kept across its restarts.
//!
//! Webhooks reach the replicas through a small load balancer in the test
//! that answers 202 to every third delivery (seeded) without forwarding it —
//! a delivery that a replica accepted and then lost — and forwards the rest to
//! a live replica; `--queue-check-interval 2s` finds what was lost.
//!
//! Checks: every session's scenario passes; every file the sessions wrote is
//! on the server; no work item is served by two replica processes at
//! overlapping times (from their JSON logs: from `claimed work` to the last
//! line naming the item); no queued item waits longer than the queue-check
//! interval plus one lease TTL plus slack.
//!
//! `ENVWORKER_CHAOS_SESSIONS` (default 30) sets the session count;
//! `ENVWORKER_CHAOS_SEED` the seed (default: the time, printed).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::serve_stack::{Serve, free_port};
use crate::common::{ADMIN_KEY, TestServer};
use envworker::devserver::DevserverConfig;
use envworker::webhook::SigningKey;
use reqwest::Method;
use serde_json::{Value, json};

const REPLICAS: usize = 3;
const LEASE_TTL_S: u64 = 6;
const QUEUE_CHECK_S: u64 = 2;
/// Scheduling slack on two busy cores.
const SLACK_S: u64 = 6;

/// A small seeded generator (xorshift64*): the run is replayable from its seed.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One replica: its fixed port, workdir and arguments, and the process
/// running now.
struct Replica {
    index: usize,
    port: u16,
    envs: Vec<(String, String)>,
    args: Vec<String>,
    generation: usize,
    serve: Option<Serve>,
}

impl Replica {
    fn start(&mut self) {
        self.generation += 1;
        let mut envs = self.envs.clone();
        envs.push((
            "ANTHROPIC_WORKER_ID".into(),
            format!("replica-{}-gen-{}", self.index, self.generation),
        ));
        let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.serve = Some(Serve::start(self.port, &envs, &args));
    }

    fn label(&self) -> String {
        format!("replica-{}-gen-{}", self.index, self.generation)
    }
}

/// What the chaos thread did.
#[derive(Default)]
struct Chaos {
    sigkills: usize,
    sigterms: usize,
    /// (process label, its logs, when it was killed (SIGKILL) or exited
    /// after SIGTERM, in microseconds since the epoch) of every process.
    logs: Vec<(String, String, Option<i64>)>,
}

fn now_micros() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// The scenario of session `i`: writes, an edit and a nested write to its own
/// store (a unique name, so a unique mount path), a call slow enough to be
/// cut by a kill, and a final read-back of everything it wrote.
fn scenario(i: usize, env_id: &str) -> (Value, BTreeMap<String, String>) {
    let expected: BTreeMap<String, String> = [
        ("/seed.md", format!("seed {i} edited\n")),
        ("/a.md", format!("alpha {i}\n")),
        ("/b/c.md", format!("gamma {i}\n")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let doc = json!({
        "name": format!("chaos-{i}"),
        "environment_id": env_id,
        "memory_stores": [{"key": "notes", "name": format!("chaos {i}"), "access": "read_write",
                           "memories": {"/seed.md": format!("seed {i}\n")}}],
        "steps": [
            {"tool": "write", "input": {"file_path": "{mount:notes}/a.md", "content": format!("alpha {i}\n")}},
            {"tool": "bash", "input": {"command": "sleep 1; echo slept"}, "expect": {"contains": "slept"}},
            {"tool": "edit", "input": {"file_path": "{mount:notes}/seed.md", "old_string": format!("seed {i}\n"), "new_string": format!("seed {i} edited\n")}},
            {"tool": "write", "input": {"file_path": "{mount:notes}/b/c.md", "content": format!("gamma {i}\n")}},
            {"wait_ms": 500},
            {"tool": "bash", "input": {"command": "cat {mount:notes}/a.md {mount:notes}/b/c.md {mount:notes}/seed.md"},
             "expect": {"is_error": false, "contains": [format!("alpha {i}"), format!("gamma {i}"), format!("seed {i} edited")]}}
        ],
        "expect_final": {"notes": expected},
    });
    (doc, expected)
}

/// The load balancer in front of the replicas: drops every third delivery
/// (seeded) with a 202, forwards the others verbatim to a live replica.
async fn balancer(
    ports: Vec<u16>,
    seed: u64,
    dropped: Arc<AtomicUsize>,
    forwarded: Arc<AtomicUsize>,
) -> String {
    let rng = Arc::new(Mutex::new(Rng(seed ^ 0x9E37_79B9_7F4A_7C15)));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let app = axum::Router::new().route(
        "/webhooks/default",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let (rng, http, ports, dropped, forwarded) = (
                    rng.clone(),
                    http.clone(),
                    ports.clone(),
                    dropped.clone(),
                    forwarded.clone(),
                );
                async move {
                    let (drop, first) = {
                        let mut rng = rng.lock().unwrap();
                        (rng.below(3) == 0, rng.below(ports.len() as u64) as usize)
                    };
                    if drop {
                        dropped.fetch_add(1, Ordering::SeqCst);
                        return axum::http::StatusCode::ACCEPTED;
                    }
                    for k in 0..ports.len() {
                        let port = ports[(first + k) % ports.len()];
                        let mut rb = http
                            .post(format!("http://127.0.0.1:{port}/webhooks/default"))
                            .body(body.clone());
                        for name in [
                            "content-type",
                            "webhook-id",
                            "webhook-timestamp",
                            "webhook-signature",
                        ] {
                            if let Some(v) = headers.get(name) {
                                rb = rb.header(name, v.as_bytes());
                            }
                        }
                        if let Ok(r) = rb.send().await
                            && r.status().is_success()
                        {
                            forwarded.fetch_add(1, Ordering::SeqCst);
                            return axum::http::StatusCode::ACCEPTED;
                        }
                    }
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/webhooks/default", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// Every work item of the environment, newest first.
async fn work_items(server: &TestServer, env_id: &str) -> Vec<Value> {
    let mut items = Vec::new();
    let mut page: Option<String> = None;
    loop {
        let path = match &page {
            Some(p) => format!("/v1/environments/{env_id}/work?limit=100&page={p}"),
            None => format!("/v1/environments/{env_id}/work?limit=100"),
        };
        let body = server.agents(Method::GET, &path, None).await.ok();
        items.extend(body["data"].as_array().cloned().unwrap_or_default());
        match body["next_page"].as_str() {
            Some(p) => page = Some(p.to_string()),
            None => return items,
        }
    }
}

/// Work id → (first `claimed work`, last line naming it), in microseconds
/// since the epoch, of one process.
type Holdings = HashMap<String, (i64, i64)>;

/// The [`Holdings`] of one process, from its JSON logs.
fn holdings(logs: &str) -> Holdings {
    let mut out = Holdings::new();
    for line in logs.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let Some(ts) = v["timestamp"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.timestamp_micros())
        else {
            continue;
        };
        let work = line
            .split("\"work_id\":\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next());
        let Some(work) = work else { continue };
        let claimed = line.contains("claimed work");
        match out.get_mut(work) {
            Some(span) => span.1 = ts,
            None if claimed => {
                out.insert(work.to_string(), (ts, ts));
            }
            None => {}
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_survive_killed_replicas_and_lost_webhooks() {
    let t_run = Instant::now();
    let sessions: usize = std::env::var("ENVWORKER_CHAOS_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let seed: u64 = std::env::var("ENVWORKER_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
        | 1;
    println!("chaos seed {seed} (ENVWORKER_CHAOS_SEED={seed} replays the choices)");

    let ports: Vec<u16> = (0..REPLICAS).map(|_| free_port()).collect();
    let dropped = Arc::new(AtomicUsize::new(0));
    let forwarded = Arc::new(AtomicUsize::new(0));
    let webhook_url = balancer(ports.clone(), seed, dropped.clone(), forwarded.clone()).await;

    let (_key, secret) = SigningKey::generate();
    let disk = tempfile::tempdir().unwrap();
    let mount_root = disk.path().join("memory");
    let state_dir = disk.path().join("state");
    let server = TestServer::start_with(
        DevserverConfig::new(ADMIN_KEY)
            .mount_root(mount_root.to_str().unwrap())
            .webhook(webhook_url, SigningKey::parse(&secret).unwrap())
            .lease_ttl_seconds(LEASE_TTL_S as i64),
    )
    .await;
    let (env_id, env_key) = server.create_environment().await;

    let mut replicas: Vec<Replica> = ports
        .iter()
        .enumerate()
        .map(|(index, &port)| {
            let workdir = disk.path().join(format!("work-{index}"));
            std::fs::create_dir_all(&workdir).unwrap();
            Replica {
                index,
                port,
                envs: vec![
                    ("ANTHROPIC_BASE_URL".into(), server.url()),
                    ("ANTHROPIC_ENVIRONMENT_ID".into(), env_id.clone()),
                    ("ANTHROPIC_ENVIRONMENT_KEY".into(), env_key.clone()),
                    ("ANTHROPIC_WEBHOOK_SIGNING_KEY".into(), secret.clone()),
                    ("ENVWORKER_WORKDIR".into(), workdir.to_str().unwrap().into()),
                    (
                        "ENVWORKER_STATE_DIR".into(),
                        state_dir.to_str().unwrap().into(),
                    ),
                ],
                args: [
                    "--log-format",
                    "json",
                    "--max-idle",
                    "1s",
                    "--memory-sync-interval",
                    "5s",
                    "--queue-check-interval",
                    &format!("{QUEUE_CHECK_S}s"),
                    "--max-concurrent-items",
                    "8",
                    "--stop-grace",
                    "8s",
                    "--call-grace",
                    "1s",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect(),
                generation: 0,
                serve: None,
            }
        })
        .collect();
    for replica in &mut replicas {
        replica.start();
    }

    // The chaos thread: every 2–5 s one replica is killed (SIGKILL or
    // SIGTERM), then restarted on the same directories.
    let stop = Arc::new(AtomicBool::new(false));
    let chaos = std::thread::spawn({
        let stop = stop.clone();
        let mut rng = Rng(seed);
        move || {
            let mut done = Chaos::default();
            let sleep_unless_stopped = |ms: u64| {
                let until = Instant::now() + Duration::from_millis(ms);
                while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            };
            loop {
                sleep_unless_stopped(1_500 + rng.below(2_500));
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let replica = &mut replicas[rng.below(REPLICAS as u64) as usize];
                let mut serve = replica.serve.take().unwrap();
                let gone_at = if rng.below(2) == 0 {
                    done.sigkills += 1;
                    let at = now_micros();
                    let _ = serve.child.kill();
                    let _ = serve.child.wait();
                    at
                } else {
                    done.sigterms += 1;
                    serve.terminate();
                    serve.wait_exit(Duration::from_secs(30));
                    now_micros()
                };
                done.logs
                    .push((replica.label(), serve.logs(), Some(gone_at)));
                drop(serve);
                sleep_unless_stopped(200 + rng.below(1_300));
                replica.start();
            }
            for replica in &mut replicas {
                let serve = replica.serve.take().unwrap();
                done.logs.push((replica.label(), serve.logs(), None));
            }
            done
        }
    });

    // Start the sessions, one every 900 ms, while watching the queue: the
    // wait of an item is from when it is first seen queued to when it is
    // first seen claimed.
    let mut started = Vec::new();
    let mut queued_since: HashMap<String, Instant> = HashMap::new();
    let mut longest_wait = Duration::ZERO;
    let mut longest_wait_item = String::new();
    let mut next_start = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(90 + 2 * sessions as u64);
    loop {
        if started.len() < sessions && Instant::now() >= next_start {
            let (doc, expected) = scenario(started.len(), &env_id);
            let s = server.start_scenario(&doc).await;
            started.push((s.session_id, expected));
            next_start = Instant::now() + Duration::from_millis(900);
        }
        let now = Instant::now();
        for item in work_items(&server, &env_id).await {
            let id = item["id"].as_str().unwrap().to_string();
            let queued = item["state"] == "queued";
            match (queued, queued_since.get(&id)) {
                (true, None) => {
                    queued_since.insert(id, now);
                }
                (false, Some(since)) => {
                    let wait = now - *since;
                    if wait > longest_wait {
                        longest_wait = wait;
                        longest_wait_item = id.clone();
                    }
                    queued_since.remove(&id);
                }
                _ => {}
            }
        }
        if started.len() == sessions {
            let mut running = 0;
            for (session, _) in &started {
                if server.scenario_report(session).await["status"] == "running" {
                    running += 1;
                }
            }
            if running == 0 {
                break;
            }
            if Instant::now() > deadline {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let chaos = tokio::task::spawn_blocking(move || chaos.join().unwrap())
        .await
        .unwrap();
    let all_logs = || {
        chaos
            .logs
            .iter()
            .map(|(label, logs, _)| {
                let tail: Vec<&str> = logs.lines().rev().take(30).collect();
                format!(
                    "--- {label}\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };

    // Every process's full logs, for a failure's post-mortem.
    let log_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("chaos-logs");
    let _ = std::fs::remove_dir_all(&log_dir);
    std::fs::create_dir_all(&log_dir).unwrap();
    for (label, logs, _) in &chaos.logs {
        std::fs::write(log_dir.join(format!("{label}.log")), logs).unwrap();
    }
    println!("replica logs in {}", log_dir.display());

    // Every session passed, and holds exactly what it wrote.
    let mut failed = Vec::new();
    let mut passed = 0;
    let mut lost_edits = 0;
    for (session, expected) in &started {
        let report = server.scenario_report(session).await;
        if report["status"] == "passed" {
            passed += 1;
        } else {
            failed.push(format!("{session}: {report:#}"));
        }
        let memories = server.session_memories(session).await;
        for (path, content) in expected {
            if memories.get(path) != Some(content) {
                lost_edits += 1;
                failed.push(format!("{session}: {path} is {:?}", memories.get(path)));
            }
        }
    }

    // No item served by two processes at overlapping times.
    let spans: Vec<(String, Holdings, Option<i64>)> = chaos
        .logs
        .iter()
        .map(|(label, logs, gone)| (label.clone(), holdings(logs), *gone))
        .collect();
    let mut overlaps = Vec::new();
    for (i, (a, held_a, _)) in spans.iter().enumerate() {
        for (b, held_b, _) in &spans[i + 1..] {
            for (work, (a0, a1)) in held_a {
                if let Some((b0, b1)) = held_b.get(work)
                    && a0 < b1
                    && b0 < a1
                {
                    overlaps.push(format!("{work}: {a} [{a0}, {a1}] and {b} [{b0}, {b1}]"));
                }
            }
        }
    }
    let claims: usize = spans.iter().map(|(_, h, _)| h.len()).sum();

    // An item a killed process held is claimed again within a lease TTL
    // plus the queue-check interval (plus slack) of the kill: the wait of a
    // takeover, from the kill (SIGKILL) or the exit (SIGTERM) to the next
    // claim of the same item by another process.
    let mut takeovers = 0;
    let mut longest_takeover = 0i64;
    let mut longest_takeover_item = String::new();
    for (a, held_a, gone) in &spans {
        let Some(gone) = gone else { continue };
        for (work, (a0, _)) in held_a {
            let next_claim = spans
                .iter()
                .filter(|(b, _, _)| b != a)
                .filter_map(|(_, held_b, _)| held_b.get(work).map(|(b0, _)| *b0))
                .filter(|b0| b0 > a0)
                .min();
            if let Some(b0) = next_claim
                && b0 > *gone
            {
                takeovers += 1;
                if b0 - gone > longest_takeover {
                    longest_takeover = b0 - gone;
                    longest_takeover_item = work.clone();
                }
            }
        }
    }
    let recoveries: usize = chaos
        .logs
        .iter()
        .map(|(_, logs, _)| logs.matches("recovered memory store folder").count())
        .sum();

    let bound = Duration::from_secs(QUEUE_CHECK_S + LEASE_TTL_S + SLACK_S);
    println!(
        "chaos summary: sessions {} (passed {}), kills {} (SIGKILL {}, SIGTERM {}), \
         processes {}, claims {claims}, dropped webhooks {} (forwarded {}), lost edits {lost_edits}, \
         longest queued wait {:.1}s ({longest_wait_item}), takeovers {takeovers} \
         (longest from kill to claim {:.1}s, {longest_takeover_item}; bound {}s), \
         folders recovered {recoveries}, overlaps {}, run {:.0}s",
        started.len(),
        passed,
        chaos.sigkills + chaos.sigterms,
        chaos.sigkills,
        chaos.sigterms,
        chaos.logs.len(),
        dropped.load(Ordering::SeqCst),
        forwarded.load(Ordering::SeqCst),
        longest_wait.as_secs_f64(),
        longest_takeover as f64 / 1e6,
        bound.as_secs(),
        overlaps.len(),
        t_run.elapsed().as_secs_f64(),
    );
    assert!(failed.is_empty(), "{failed:#?}\n{}", all_logs());
    assert_eq!(lost_edits, 0);
    assert!(overlaps.is_empty(), "{overlaps:#?}");
    assert!(
        longest_wait <= bound,
        "{longest_wait_item} waited {longest_wait:?} > {bound:?}\n{}",
        all_logs()
    );
    assert!(
        Duration::from_micros(longest_takeover as u64) <= bound,
        "{longest_takeover_item} was taken over {longest_takeover} µs after its holder died"
    );
    assert!(chaos.sigkills + chaos.sigterms > 0, "no replica was killed");
    assert!(dropped.load(Ordering::SeqCst) > 0, "no webhook was dropped");
}
