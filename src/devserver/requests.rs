//! The request log: every API request the devserver received, in arrival
//! order, with the status it was answered with (an injected fault's
//! included) and, for a memory write, which memory and which bytes it
//! carried. `GET /dev/requests` (admin key) answers it; `DELETE` clears it.
//!
//! It exists so a test can hold two workers to the same requests — the
//! differential test compares the uploads the official SDK's worker and
//! envworker sent for one scenario — without a proxy in front of either.
//! Only digests of memory content are kept, never the content.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::faults::glob;

/// Entries kept; the oldest go first past this.
pub const MAX_ENTRIES: usize = 100_000;

/// One request as received.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoggedRequest {
    /// Arrival order, from 1.
    pub seq: u64,
    /// When it arrived, µs since the epoch (the devserver's clock).
    pub received_at_us: i64,
    pub method: String,
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// The status it was answered with.
    pub status: u16,
    /// How it authenticated: `bearer` (a worker's environment key or
    /// sessions token), `api_key` (an organisation or admin key), or `none`.
    pub auth: &'static str,
    /// A memory create or update: what it asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_write: Option<MemoryWrite>,
}

/// The memory-relevant part of a create (`path`) or update body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemoryWrite {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// SHA-256 of the `content` sent (lowercase hex), the API's own digest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_sha256: Option<String>,
    /// The update's `precondition.content_sha256`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precondition_sha256: Option<String>,
}

/// The log, bounded by [`MAX_ENTRIES`].
#[derive(Debug, Default)]
pub struct RequestLog {
    entries: Mutex<(u64, VecDeque<LoggedRequest>)>,
}

impl RequestLog {
    pub(super) fn push(&self, mut entry: LoggedRequest) {
        let mut guard = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (next, entries) = &mut *guard;
        *next += 1;
        entry.seq = *next;
        if entries.len() == MAX_ENTRIES {
            entries.pop_front();
        }
        entries.push_back(entry);
    }

    pub fn entries(&self) -> Vec<LoggedRequest> {
        let guard = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        guard.1.iter().cloned().collect()
    }

    pub fn clear(&self) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clear();
    }
}

/// Whether `method path` creates or updates a memory.
pub(super) fn is_memory_write(method: &str, path: &str) -> bool {
    method == "POST"
        && (glob("/v1/memory_stores/*/memories", path)
            || glob("/v1/memory_stores/*/memories/*", path))
}

/// How a request authenticated, as far as its headers tell.
pub(super) fn auth_kind(headers: &axum::http::HeaderMap) -> &'static str {
    if headers.contains_key("x-api-key") {
        "api_key"
    } else if headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("Bearer "))
    {
        "bearer"
    } else {
        "none"
    }
}

/// What a memory write's JSON body asked for (nothing when it is not JSON).
pub(super) fn memory_write(body: &[u8]) -> MemoryWrite {
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    MemoryWrite {
        path: value["path"].as_str().map(str::to_string),
        content_sha256: value["content"]
            .as_str()
            .map(|c| hex::encode(Sha256::digest(c.as_bytes()))),
        precondition_sha256: value["precondition"]["content_sha256"]
            .as_str()
            .map(str::to_string),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_writes_are_told_from_other_posts() {
        assert!(is_memory_write("POST", "/v1/memory_stores/ms_1/memories"));
        assert!(is_memory_write(
            "POST",
            "/v1/memory_stores/ms_1/memories/mem_2"
        ));
        assert!(!is_memory_write("GET", "/v1/memory_stores/ms_1/memories"));
        assert!(!is_memory_write(
            "DELETE",
            "/v1/memory_stores/ms_1/memories/mem_2"
        ));
        assert!(!is_memory_write("POST", "/v1/sessions/s/events"));
    }

    #[test]
    fn a_memory_write_keeps_digests_not_content() {
        let w = memory_write(
            br#"{"path":"/a.md","content":"hi","precondition":{"type":"content_sha256","content_sha256":"abc"}}"#,
        );
        assert_eq!(w.path.as_deref(), Some("/a.md"));
        assert_eq!(
            w.content_sha256.as_deref(),
            Some("8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4")
        );
        assert_eq!(w.precondition_sha256.as_deref(), Some("abc"));
        assert_eq!(memory_write(b"not json").path, None);
    }

    #[test]
    fn the_log_is_bounded_and_numbered() {
        let log = RequestLog::default();
        let entry = LoggedRequest {
            seq: 0,
            received_at_us: 0,
            method: "GET".into(),
            path: "/x".into(),
            query: None,
            status: 200,
            auth: "none",
            memory_write: None,
        };
        for _ in 0..MAX_ENTRIES + 2 {
            log.push(entry.clone());
        }
        let entries = log.entries();
        assert_eq!(entries.len(), MAX_ENTRIES);
        assert_eq!(entries[0].seq, 3);
        assert_eq!(entries.last().unwrap().seq, MAX_ENTRIES as u64 + 2);
        log.clear();
        assert!(log.entries().is_empty());
    }
}
