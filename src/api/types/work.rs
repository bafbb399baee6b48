//! Environments, work items, leases and queue statistics
//! (beta `managed-agents-2026-04-01`).
//!
//! Work-item timestamps stay strings: the worker echoes `last_heartbeat`
//! back byte for byte, so it must never be re-formatted.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::Timestamp;

/// A string that must never be printed: the work item's `secret`, tokens, keys.
/// `Debug` and `Display` print `[redacted]`; `expose` is the only way in.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Redacted(String);

impl Redacted {
    pub fn new(value: impl Into<String>) -> Self {
        Redacted(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// `environment`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    pub id: String,
    #[serde(rename = "type", default = "tag_environment")]
    pub object_type: String,
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    pub(crate) config: EnvironmentConfig,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) scope: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    #[serde(default)]
    pub(crate) archived_at: Option<Timestamp>,
}

fn tag_environment() -> String {
    "environment".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct EnvironmentConfig {
    #[serde(rename = "type")]
    pub kind: String,
}

/// State of a work item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkState {
    Queued,
    Starting,
    Active,
    Stopping,
    Stopped,
    /// A state this client does not know yet.
    #[serde(other)]
    Unknown,
}

impl WorkState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            WorkState::Queued => "queued",
            WorkState::Starting => "starting",
            WorkState::Active => "active",
            WorkState::Stopping => "stopping",
            WorkState::Stopped => "stopped",
            WorkState::Unknown => "unknown",
        }
    }

    #[cfg_attr(
        not(feature = "devserver"),
        expect(dead_code, reason = "the devserver's use")
    )]
    pub(crate) fn parse(s: &str) -> Self {
        match s {
            "queued" => WorkState::Queued,
            "starting" => WorkState::Starting,
            "active" => WorkState::Active,
            "stopping" => WorkState::Stopping,
            "stopped" => WorkState::Stopped,
            _ => WorkState::Unknown,
        }
    }
}

/// What a work item asks the worker to do: `{type:"session", id}` (or
/// `healthcheck`, or a type added later).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkData {
    #[serde(rename = "type")]
    pub kind: String,
    pub id: String,
}

impl WorkData {
    pub fn is_session(&self) -> bool {
        self.kind == "session"
    }
}

/// `work`: one claimable unit of a self-hosted environment's queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Work {
    pub id: String,
    #[serde(rename = "type", default = "tag_work")]
    pub object_type: String,
    pub environment_id: String,
    pub data: WorkData,
    pub state: WorkState,
    /// Only set on the poll response; never logged (see [`Redacted`]).
    #[serde(default)]
    pub secret: Option<Redacted>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    pub created_at: String,
    #[serde(default)]
    pub(crate) acknowledged_at: Option<String>,
    #[serde(default)]
    pub(crate) started_at: Option<String>,
    #[serde(default)]
    pub(crate) latest_heartbeat_at: Option<String>,
    #[serde(default)]
    pub(crate) stop_requested_at: Option<String>,
    #[serde(default)]
    pub(crate) stopped_at: Option<String>,
}

fn tag_work() -> String {
    "work".into()
}

/// `work_heartbeat`: the answer to a lease heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    #[serde(rename = "type", default = "tag_work_heartbeat")]
    pub object_type: String,
    /// Echo this value exactly as `expected_last_heartbeat` on the next beat.
    pub(crate) last_heartbeat: String,
    pub(crate) lease_extended: bool,
    pub state: WorkState,
    pub(crate) ttl_seconds: i64,
}

fn tag_work_heartbeat() -> String {
    "work_heartbeat".into()
}

/// The lease as the server holds it, carried in a 412 heartbeat error's
/// `error.details.current_state`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseState {
    #[serde(default)]
    pub(crate) last_heartbeat: Option<String>,
    pub(crate) lease_extended: bool,
    pub state: WorkState,
    pub(crate) ttl_seconds: i64,
}

/// `work_queue_stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkQueueStats {
    #[serde(rename = "type", default = "tag_work_queue_stats")]
    pub object_type: String,
    pub depth: u64,
    pub(crate) pending: u64,
    #[serde(default)]
    pub(crate) oldest_queued_at: Option<String>,
    #[serde(default)]
    pub(crate) workers_polling: Option<u64>,
}

fn tag_work_queue_stats() -> String {
    "work_queue_stats".into()
}

/// The decoded work `secret`: URL-safe base64 of this JSON. The worker reads
/// only `sessions_token`.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkSecret {
    pub(crate) sessions_token: Redacted,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) api_base_url: Option<String>,
}

impl fmt::Debug for WorkSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkSecret").finish_non_exhaustive()
    }
}

impl WorkSecret {
    /// The per-item sessions token in a work item's `secret`: base64 of a JSON
    /// object (URL-safe or standard alphabet, padded or not). `None` when the
    /// secret does not decode or carries no non-empty token — the caller then
    /// falls back to the environment key. Never log the secret or the token.
    pub fn sessions_token(secret: &str) -> Option<Redacted> {
        use base64::Engine;
        let normalized: String = secret
            .trim()
            .trim_end_matches('=')
            .chars()
            .map(|c| match c {
                '+' => '-',
                '/' => '_',
                c => c,
            })
            .collect();
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(normalized)
            .ok()?;
        let payload: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
        let token = payload.get("sessions_token")?.as_str()?;
        (!token.is_empty()).then(|| Redacted::new(token))
    }
}

/// Query of `GET .../work/poll`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PollWork {
    /// 1–999; `None` is a non-blocking poll.
    pub block_ms: Option<u32>,
    pub reclaim_older_than_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_debug_never_prints_the_secret() {
        let work: Work = serde_json::from_str(
            r#"{"id":"work_1","type":"work","environment_id":"env_1",
                "data":{"type":"session","id":"sesn_1"},"state":"queued",
                "secret":"c2VjcmV0LXRva2Vu","metadata":{},
                "created_at":"2026-01-01T00:00:00Z","actor":{"type":"api_key"}}"#,
        )
        .unwrap();
        let printed = format!("{work:?}");
        assert!(!printed.contains("c2VjcmV0LXRva2Vu"), "{printed}");
        assert_eq!(work.secret.unwrap().expose(), "c2VjcmV0LXRva2Vu");
    }

    #[test]
    fn the_sessions_token_decodes_from_every_base64_form() {
        use base64::Engine;
        use base64::engine::general_purpose::{
            STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD,
        };
        // A token whose base64 uses both alphabets' special characters.
        let json = br#"{"sessions_token":"tok>>>???~~~","ingress":"x"}"#;
        for engine in [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD] {
            let secret = engine.encode(json);
            let token = WorkSecret::sessions_token(&secret).expect(&secret);
            assert_eq!(token.expose(), "tok>>>???~~~");
        }
        for bad in [
            String::new(),
            URL_SAFE_NO_PAD.encode(b"null"),
            "%%%".to_string(),
            URL_SAFE_NO_PAD.encode(b"not json"),
            URL_SAFE_NO_PAD.encode(br#"["sessions_token"]"#),
            URL_SAFE_NO_PAD.encode(br#"{"sessions_token":""}"#),
            URL_SAFE_NO_PAD.encode(br#"{"sessions_token":7}"#),
            URL_SAFE_NO_PAD.encode(br#"{"other":"x"}"#),
        ] {
            assert!(WorkSecret::sessions_token(&bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn an_unknown_work_state_still_decodes() {
        let state: WorkState = serde_json::from_str(r#""hibernating""#).unwrap();
        assert_eq!(state, WorkState::Unknown);
    }
}
