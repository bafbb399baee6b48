//! The memory engine next to the official Python SDK's `SessionMemoryStores`,
//! on the same 2,000-memory store (2 KB each) of the same devserver, in the
//! same run: mount (download), a no-op sync right after the mount
//! (`noop_sync`), a no-op sync 2.1 s later after one earlier sync — past the
//! stat cache's 2 s trust margin, the state of every periodic sync
//! (`steady_sync`) — and a flush of 2,000 changed files, each with 0 ms and
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
//! `watch`, `idle_syncs`); all by default. The `idle_syncs` row (ours
//! only) runs 100 idle syncs back to back after the mount, at 0 and 5 ms,
//! and prints the CPU per sync with the safety cadence's full scans (every
//! 10th sync) averaged in: what an idle session costs, not one sync. The `watch` row (ours only, also run with
//! `steady_sync`) times the idle sync without the folder watch (every file
//! stat-ed, as before) and with it, and prints the entries each stat-ed.
//!
//! Ours journals each store's sync state as the worker does (the durable
//! commit, `memory::journal`), in a state directory on the disk (not tmpfs,
//! so `fsync` costs what it costs). The `journal` row (ours only) runs the
//! four operations with the journal off and on, at 0 ms latency, and prints
//! the ratio: the journal must not double the cost of a no-op sync.
//!
//! `ENVWORKER_BENCH_WRAP` runs each of our children under a tool, e.g.
//! `ENVWORKER_BENCH_WRAP="perf record --call-graph dwarf -o /tmp/p.data --"`
//! (the figures then include the tool's overhead).

#[path = "../tests/common/process.rs"]
#[allow(dead_code)]
mod process;
#[path = "../tests/common/sdk.rs"]
#[allow(dead_code)]
mod sdk;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
/// The syncs of the `idle_syncs` row.
const IDLE_SYNCS: usize = 100;
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
        // (the safety cadence's full scans included, every 10th), averaged.
        stores.download(&session).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2_100)).await;
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
                // Past the 2 s trust margin, after one sync: the state of
                // every periodic sync.
                tokio::time::sleep(Duration::from_millis(2_100)).await;
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

    // The store, its memories, and a session that attaches it.
    let admin = Client::builder(Credential::api_key(ADMIN_KEY))
        .base_url(&url)
        .build()
        .unwrap();
    let store = admin
        .memory_stores()
        .create(&CreateMemoryStore {
            name: "Bench Notes".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let memories = admin.memories(&store.id);
    let body: String =
        "memory text line\n".repeat(CONTENT_BYTES / 17 + 1)[..CONTENT_BYTES].to_string();
    futures::stream::iter(0..MEMORIES)
        .map(|i| {
            let (memories, body) = (&memories, &body);
            async move {
                memories
                    .create(
                        &CreateMemory {
                            path: format!("/topic-{:02}/note-{i:04}.md", i % 40),
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
    let http = reqwest::Client::new();
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
        http.delete(format!("{url}/dev/faults"))
            .header("x-api-key", ADMIN_KEY)
            .send()
            .await
            .unwrap();
        if latency > 0 {
            http.post(format!("{url}/dev/faults"))
                .header("x-api-key", ADMIN_KEY)
                .json(&json!({"rules": [{"path": "/v1/memory_stores/*", "latency_ms": latency}]}))
                .send()
                .await
                .unwrap();
        }
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
        http.delete(format!("{url}/dev/faults"))
            .header("x-api-key", ADMIN_KEY)
            .send()
            .await
            .unwrap();
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
        http.delete(format!("{url}/dev/faults"))
            .header("x-api-key", ADMIN_KEY)
            .send()
            .await
            .unwrap();
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
            "idle_syncs: ours, {IDLE_SYNCS} idle syncs back to back after the mount (the safety cadence's full scans included), per sync; median of 3 runs"
        );
        println!(
            "{:<8} | {:>10} {:>10} | {:>9} {:>10}",
            "latency", "wall/sync", "cpu/sync", "examined", "full scans"
        );
        for latency in [0, 5] {
            http.delete(format!("{url}/dev/faults"))
                .header("x-api-key", ADMIN_KEY)
                .send()
                .await
                .unwrap();
            if latency > 0 {
                http.post(format!("{url}/dev/faults"))
                    .header("x-api-key", ADMIN_KEY)
                    .json(
                        &json!({"rules": [{"path": "/v1/memory_stores/*", "latency_ms": latency}]}),
                    )
                    .send()
                    .await
                    .unwrap();
            }
            let runs: Vec<Sample> = (0..3)
                .map(|_| run_child(&me, &["--child"], &child_args("idle_syncs")))
                .collect();
            let m = medians(&runs);
            println!(
                "{:<8} | {:>8.2}ms {:>8.3}ms | {:>9.1} {:>10}",
                format!("{latency} ms"),
                m.wall_ms,
                m.cpu_ms,
                m.examined / IDLE_SYNCS as f64,
                m.full_scans
            );
        }
    }
    if wanted("sparse") {
        http.delete(format!("{url}/dev/faults"))
            .header("x-api-key", ADMIN_KEY)
            .send()
            .await
            .unwrap();
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
