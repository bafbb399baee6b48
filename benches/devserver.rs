//! Devserver throughput: `basic` listing of a 2,000-memory store, `full`
//! listing of it, and single-memory updates (sequential and 16 at a time),
//! over real HTTP through the typed client.
//!
//! Run: `cargo bench --bench devserver` (release build). Prints medians of
//! repeated runs; nothing is asserted — this is a measurement, not a test.

use std::time::{Duration, Instant};

use envworker::api::types::*;
use envworker::api::{Client, Credential};
use envworker::devserver::{Devserver, DevserverConfig};
use futures::{StreamExt, TryStreamExt};

const MEMORIES: usize = 2_000;
const CONTENT_BYTES: usize = 2_048;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main]
async fn main() {
    let data_dir = tempfile::tempdir().unwrap();
    let server = Devserver::open(DevserverConfig::new("bench").data_dir(data_dir.path())).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = server.spawn(listener).unwrap();
    let client = Client::builder(Credential::api_key("bench"))
        .base_url(running.url())
        .build()
        .unwrap();

    let store = client
        .memory_stores()
        .create(&CreateMemoryStore {
            name: "bench".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let memories = client.memories(&store.id);
    let body = "x".repeat(CONTENT_BYTES);
    let started = Instant::now();
    futures::stream::iter(0..MEMORIES)
        .map(|i| {
            let memories = &memories;
            let body = &body;
            async move {
                memories
                    .create(
                        &CreateMemory {
                            path: format!("/notes/{:02}/{i:04}.md", i % 50),
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
    let fill = started.elapsed();
    println!(
        "setup: created {MEMORIES} memories of {CONTENT_BYTES} B in {:.0} ms ({:.0} creates/s, 16 at a time)",
        ms(fill),
        MEMORIES as f64 / fill.as_secs_f64()
    );

    // Basic listing: 20 pages of 100.
    let mut samples = Vec::new();
    for _ in 0..30 {
        let t = Instant::now();
        let items: Vec<MemoryListItem> = memories
            .list_all(ListMemories {
                limit: Some(100),
                ..Default::default()
            })
            .try_collect()
            .await
            .unwrap();
        samples.push(t.elapsed());
        assert_eq!(items.len(), MEMORIES);
    }
    let basic = median(samples);
    println!(
        "basic listing of {MEMORIES} memories (20 pages of 100): median {:.1} ms, {:.0} memories/s, {:.0} pages/s",
        ms(basic),
        MEMORIES as f64 / basic.as_secs_f64(),
        20.0 / basic.as_secs_f64()
    );

    // Full listing: 100 pages of 20, with content (the download path).
    let mut samples = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        let n = memories
            .list_all(ListMemories {
                view: Some(View::Full),
                limit: Some(20),
                ..Default::default()
            })
            .try_fold(0usize, |n, _| async move { Ok(n + 1) })
            .await
            .unwrap();
        samples.push(t.elapsed());
        assert_eq!(n, MEMORIES);
    }
    let full = median(samples);
    println!(
        "full listing of {MEMORIES} memories (100 pages of 20): median {:.1} ms, {:.0} memories/s, {:.1} MB/s of content",
        ms(full),
        MEMORIES as f64 / full.as_secs_f64(),
        (MEMORIES * CONTENT_BYTES) as f64 / full.as_secs_f64() / 1e6
    );

    // Single-memory updates with a content_sha256 precondition, as a sync sends them.
    let targets: Vec<Memory> = memories
        .list_all(ListMemories {
            limit: Some(100),
            ..Default::default()
        })
        .map_ok(|i| i.into_memory().unwrap())
        .try_collect()
        .await
        .unwrap();
    let mut latencies = Vec::new();
    let t = Instant::now();
    for (round, m) in targets.iter().take(1_000).enumerate() {
        let one = Instant::now();
        memories
            .update(
                &m.id,
                &UpdateMemory {
                    content: Some(format!("{body}{round}")),
                    precondition: Some(Precondition::content_sha256(&m.content_sha256)),
                    ..Default::default()
                },
                None,
            )
            .await
            .unwrap();
        latencies.push(one.elapsed());
    }
    let sequential = t.elapsed();
    latencies.sort();
    println!(
        "updates, one at a time: {:.0} updates/s, median {:.2} ms, p99 {:.2} ms (1,000 updates)",
        1_000.0 / sequential.as_secs_f64(),
        ms(latencies[latencies.len() / 2]),
        ms(latencies[latencies.len() * 99 / 100])
    );

    let t = Instant::now();
    futures::stream::iter(targets.iter().skip(1_000))
        .map(|m| {
            let memories = &memories;
            let body = &body;
            async move {
                memories
                    .update(
                        &m.id,
                        &UpdateMemory {
                            content: Some(format!("{body}!")),
                            precondition: Some(Precondition::content_sha256(&m.content_sha256)),
                            ..Default::default()
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
    let concurrent = t.elapsed();
    println!(
        "updates, 16 at a time: {:.0} updates/s (1,000 updates in {:.0} ms)",
        1_000.0 / concurrent.as_secs_f64(),
        ms(concurrent)
    );
    running.shutdown().await;
}
