//! Sessions and their resources (beta `managed-agents-2026-04-01`).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::Timestamp;

/// Session status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    Idle,
    Running,
    Rescheduling,
    Terminated,
    #[serde(other)]
    Unknown,
}

impl SessionStatus {
    #[cfg_attr(
        not(feature = "devserver"),
        expect(dead_code, reason = "the devserver's use")
    )]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Idle => "idle",
            SessionStatus::Running => "running",
            SessionStatus::Rescheduling => "rescheduling",
            SessionStatus::Terminated => "terminated",
            SessionStatus::Unknown => "unknown",
        }
    }
}

/// `session`. The worker reads `agent.skills`, `resources` and `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    pub id: String,
    #[serde(rename = "type", default = "tag_session")]
    pub object_type: String,
    pub(crate) status: SessionStatus,
    #[serde(default)]
    pub environment_id: Option<String>,
    pub agent: AgentSnapshot,
    #[serde(default)]
    pub resources: Vec<SessionResource>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub(crate) title: Option<String>,
    #[serde(default)]
    pub(crate) vault_ids: Vec<String>,
    #[serde(default)]
    pub(crate) outcome_evaluations: Vec<Value>,
    #[serde(default)]
    pub stats: Value,
    #[serde(default)]
    pub(crate) usage: Value,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    #[serde(default)]
    pub(crate) archived_at: Option<Timestamp>,
}

fn tag_session() -> String {
    "session".into()
}

impl Session {
    /// The memory stores attached to this session, in resource order.
    pub fn memory_stores(&self) -> impl Iterator<Item = &MemoryStoreResource> {
        self.resources.iter().filter_map(|r| match r {
            SessionResource::MemoryStore(m) => Some(m),
            SessionResource::Other(_) => None,
        })
    }
}

/// The agent as snapshotted when the session was created. Fields the worker
/// does not use are carried in `rest` so that nothing is lost on a round trip.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentSnapshot {
    #[serde(default)]
    pub(crate) tools: Vec<Value>,
    #[serde(default)]
    pub skills: Vec<SkillRef>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A skill attached to the agent; `version` may be an alias such as `latest`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillRef {
    pub skill_id: String,
    #[serde(default)]
    pub(crate) version: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// Access mode of a memory store attached to a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    #[default]
    ReadWrite,
    ReadOnly,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Access::ReadWrite => "read_write",
            Access::ReadOnly => "read_only",
        }
    }

    #[cfg_attr(
        not(feature = "devserver"),
        expect(dead_code, reason = "the devserver's use")
    )]
    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "read_write" => Some(Access::ReadWrite),
            "read_only" => Some(Access::ReadOnly),
            _ => None,
        }
    }
}

/// A `memory_store` session resource. `mount_path` is output-only and is used
/// verbatim by the worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryStoreResource {
    #[serde(rename = "type", default = "tag_memory_store")]
    pub object_type: String,
    pub memory_store_id: String,
    #[serde(default)]
    pub(crate) access: Option<Access>,
    #[serde(default)]
    pub(crate) instructions: Option<String>,
    #[serde(default)]
    pub mount_path: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
}

fn tag_memory_store() -> String {
    "memory_store".into()
}

impl MemoryStoreResource {
    /// `read_write` unless the resource says `read_only` (the API default).
    pub fn access(&self) -> Access {
        self.access.unwrap_or_default()
    }
}

/// A session resource: a memory store, or something else kept as raw JSON.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionResource {
    MemoryStore(MemoryStoreResource),
    Other(Value),
}

impl Serialize for SessionResource {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            SessionResource::MemoryStore(m) => m.serialize(s),
            SessionResource::Other(v) => v.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for SessionResource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        if value.get("type").and_then(Value::as_str) == Some("memory_store") {
            serde_json::from_value(value)
                .map(SessionResource::MemoryStore)
                .map_err(serde::de::Error::custom)
        } else {
            Ok(SessionResource::Other(value))
        }
    }
}
