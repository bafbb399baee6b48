//! The devserver's API as the benchmarks drive it over HTTP with the admin
//! key (scenarios, faults, a session's events), and the small measuring
//! helpers they share. Included by `benches/session.rs` and
//! `benches/memory.rs` with `#[path]`, and by the integration tests (the
//! bench's scenario steps, [`tool_group`]).

use std::time::Duration;

use serde_json::{Value, json};

pub const AGENTS_BETA: &str = "managed-agents-2026-04-01";

/// The session bench's group `g` of six scenario steps — write, read, edit,
/// bash, glob, grep — on `files/gN.txt` in the workdir for an even `g`, on
/// `gN.md` in the store `notes` for an odd one. Whether it is in the store.
pub fn tool_group(g: usize) -> ([Value; 6], bool) {
    let in_store = g % 2 == 1;
    let (dir, file, ext) = if in_store {
        (
            "{mount:notes}".to_string(),
            format!("{{mount:notes}}/g{g}.md"),
            "md",
        )
    } else {
        ("files".to_string(), format!("files/g{g}.txt"), "txt")
    };
    let group = [
        json!({"tool": "write", "input": {"file_path": file, "content": format!("alpha {g}\nbeta {g}\n")},
               "expect": {"is_error": false}}),
        json!({"tool": "read", "input": {"file_path": file},
               "expect": {"is_error": false, "contains": format!("alpha {g}")}}),
        json!({"tool": "edit", "input": {"file_path": file, "old_string": format!("beta {g}\n"), "new_string": format!("gamma {g}\n")},
               "expect": {"is_error": false}}),
        json!({"tool": "bash", "input": {"command": format!("echo step {g}")},
               "expect": {"is_error": false, "contains": format!("step {g}")}}),
        json!({"tool": "glob", "input": {"pattern": format!("g*.{ext}"), "path": dir},
               "expect": {"is_error": false, "contains": format!("g{g}.{ext}")}}),
        json!({"tool": "grep", "input": {"pattern": format!("gamma {g}"), "path": dir},
               "expect": {"is_error": false, "contains": format!("gamma {g}")}}),
    ];
    (group, in_store)
}

/// A devserver's URL and a client for it, speaking with `admin_key`.
#[derive(Clone)]
pub struct DevApi {
    pub url: String,
    pub http: reqwest::Client,
    pub admin_key: String,
}

impl DevApi {
    pub fn new(url: &str, admin_key: &str) -> DevApi {
        DevApi {
            url: url.to_string(),
            http: reqwest::Client::new(),
            admin_key: admin_key.to_string(),
        }
    }

    /// Send with the admin key and the API's headers; panics unless 2xx.
    pub async fn send(&self, rb: reqwest::RequestBuilder) -> Value {
        let response = rb
            .header("x-api-key", &self.admin_key)
            .header("anthropic-version", "2023-06-01")
            .header("anthropic-beta", AGENTS_BETA)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .expect("the devserver answers");
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        assert!(status.is_success(), "devserver: {status}: {body}");
        serde_json::from_str(&body).unwrap_or(Value::Null)
    }

    pub async fn get(&self, path: &str) -> Value {
        self.send(self.http.get(format!("{}{path}", self.url)))
            .await
    }

    pub async fn post(&self, path: &str, body: Value) -> Value {
        self.send(self.http.post(format!("{}{path}", self.url)).json(&body))
            .await
    }

    /// Every event of the session, oldest first.
    pub async fn events(&self, session_id: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let mut path = format!("/v1/sessions/{session_id}/events?limit=1000");
            if let Some(p) = &page {
                path.push_str(&format!("&page={p}"));
            }
            let body = self.get(&path).await;
            out.extend(body["data"].as_array().cloned().unwrap_or_default());
            match body["next_page"].as_str() {
                Some(next) if !next.is_empty() => page = Some(next.to_string()),
                _ => return out,
            }
        }
    }
}

/// The `processed_at` (µs since the epoch) of the event of type `kind`
/// whose `field` is `id`.
pub fn stamp(events: &[Value], kind: &str, field: &str, id: &str) -> i64 {
    let event = events
        .iter()
        .find(|e| e["type"] == kind && e[field] == id)
        .unwrap_or_else(|| panic!("no {kind} with {field}={id}"));
    micros_of(event["processed_at"].as_str().unwrap())
}

pub fn micros_of(ts: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(ts)
        .unwrap_or_else(|e| panic!("{ts:?} is not RFC 3339: {e}"))
        .timestamp_micros()
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// CPU time of process `pid` (user + system, all its threads, those that
/// already exited included; not its children), in ms: the kernel's
/// per-process CPU clock (`clock_getcpuclockid`), to the nanosecond. Where
/// that clock cannot be read, `/proc/<pid>/stat`'s utime + stime, which the
/// kernel reports in ticks of 10 ms.
pub fn proc_cpu_ms(pid: u32) -> f64 {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: both calls only write the out-parameters given.
    if unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) } == 0 {
        let mut at = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        if unsafe { libc::clock_gettime(clock, &mut at) } == 0 {
            return at.tv_sec as f64 * 1e3 + at.tv_nsec as f64 / 1e6;
        }
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    // Fields 14 and 15 of the line (utime, stime), counted from `state` (3).
    let ticks: f64 = rest
        .get(11..13)
        .map(|f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum())
        .unwrap_or_else(|| panic!("no utime/stime in /proc/{pid}/stat"));
    // USER_HZ is 100 on every Linux target.
    ticks * 10.0
}

/// A child process (a worker, a devserver) whose stderr goes to a log
/// file; killed on drop.
pub struct LoggedChild {
    pub child: std::process::Child,
    pub name: String,
    pub log: std::path::PathBuf,
}

impl LoggedChild {
    /// The last lines of its stderr, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Panics (with its log) when the process has exited.
    pub fn assert_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "{} exited early ({status}); its log ({}):\n{}",
                self.name,
                self.log.display(),
                self.log_tail()
            );
        }
    }
}

impl Drop for LoggedChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
