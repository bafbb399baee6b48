//! Memory stores, memories, memory prefixes and memory versions
//! (beta `agent-memory-2026-07-22`).
//!
//! The same structs serve both sides: the client decodes them and the devserver
//! encodes them, so what the devserver sends is exactly what the worker reads.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::Timestamp;

/// `memory_store`: a named container of memories.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryStore {
    pub id: String,
    #[serde(rename = "type", default = "tag::memory_store")]
    pub object_type: String,
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    #[serde(default)]
    pub(crate) archived_at: Option<Timestamp>,
}

/// `memory`: a UTF-8 text document at a path inside a store.
///
/// `content` is `None` in the `basic` view; `content_sha256` and
/// `content_size_bytes` are always set, which is what lets a sync decide
/// without downloading content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    pub id: String,
    #[serde(rename = "type", default = "tag::memory")]
    pub object_type: String,
    pub memory_store_id: String,
    pub path: String,
    #[serde(default)]
    pub content: Option<String>,
    pub content_sha256: String,
    pub content_size_bytes: u64,
    pub memory_version_id: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// `memory_prefix`: a list-time rollup of the memories below a folder (`depth=1`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryPrefix {
    #[serde(rename = "type", default = "tag::memory_prefix")]
    pub object_type: String,
    pub path: String,
}

/// One item of a memory listing. Items of a type this client does not know
/// are kept as raw JSON instead of failing the whole page.
#[derive(Debug, Clone, PartialEq)]
pub enum MemoryListItem {
    Memory(Memory),
    Prefix(MemoryPrefix),
    Other(Value),
}

impl MemoryListItem {
    pub fn as_memory(&self) -> Option<&Memory> {
        match self {
            MemoryListItem::Memory(m) => Some(m),
            _ => None,
        }
    }

    pub fn into_memory(self) -> Option<Memory> {
        match self {
            MemoryListItem::Memory(m) => Some(m),
            _ => None,
        }
    }
}

impl Serialize for MemoryListItem {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MemoryListItem::Memory(m) => m.serialize(s),
            MemoryListItem::Prefix(p) => p.serialize(s),
            MemoryListItem::Other(v) => v.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for MemoryListItem {
    /// Peek at `type`, then decode the item once; a listing of thousands of
    /// memories must not build a JSON tree per item.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Tag<'a> {
            #[serde(rename = "type", borrow, default)]
            kind: Option<std::borrow::Cow<'a, str>>,
        }
        let raw = Box::<serde_json::value::RawValue>::deserialize(d)?;
        let tag: Tag<'_> = serde_json::from_str(raw.get()).map_err(serde::de::Error::custom)?;
        let item = match tag.kind.as_deref() {
            Some("memory") => MemoryListItem::Memory(
                serde_json::from_str(raw.get()).map_err(serde::de::Error::custom)?,
            ),
            Some("memory_prefix") => MemoryListItem::Prefix(
                serde_json::from_str(raw.get()).map_err(serde::de::Error::custom)?,
            ),
            _ => MemoryListItem::Other(
                serde_json::from_str(raw.get()).map_err(serde::de::Error::custom)?,
            ),
        };
        Ok(item)
    }
}

/// A memory as a sync needs it from a `basic` listing: which memory, where,
/// and the hash of its content. Decoding only these fields keeps a listing of
/// thousands of memories cheap; other item types come back with `id` empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct MemoryIndexEntry {
    #[serde(rename = "type", default)]
    pub kind: IndexKind,
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub content_sha256: String,
}

/// The item types of a listing, as the index tells them apart (decoded
/// without allocating: a sync lists every memory of the store).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexKind {
    Memory,
    MemoryPrefix,
    /// A type this client does not know (or none).
    #[default]
    #[serde(other)]
    Other,
}

impl From<MemoryListItem> for MemoryIndexEntry {
    fn from(item: MemoryListItem) -> Self {
        match item {
            MemoryListItem::Memory(m) => MemoryIndexEntry {
                kind: IndexKind::Memory,
                id: m.id,
                path: m.path,
                content_sha256: m.content_sha256,
            },
            MemoryListItem::Prefix(p) => MemoryIndexEntry {
                kind: IndexKind::MemoryPrefix,
                id: String::new(),
                path: p.path,
                content_sha256: String::new(),
            },
            MemoryListItem::Other(v) => serde_json::from_value(v).unwrap_or_default(),
        }
    }
}

impl MemoryIndexEntry {
    pub(crate) fn is_memory(&self) -> bool {
        self.kind == IndexKind::Memory
    }
}

/// What kind of change a memory version records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryOperation {
    Created,
    Modified,
    Deleted,
}

impl MemoryOperation {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            MemoryOperation::Created => "created",
            MemoryOperation::Modified => "modified",
            MemoryOperation::Deleted => "deleted",
        }
    }

    #[cfg_attr(
        not(feature = "devserver"),
        expect(dead_code, reason = "the devserver's use")
    )]
    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "created" => Some(MemoryOperation::Created),
            "modified" => Some(MemoryOperation::Modified),
            "deleted" => Some(MemoryOperation::Deleted),
            _ => None,
        }
    }
}

/// Who made a change: `session_actor`, `api_actor`, `user_actor` or
/// `service_account_actor`. Kept as a flat struct so an actor type added later
/// still decodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    #[serde(rename = "type")]
    pub(crate) actor_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) user_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_id: Option<String>,
}

#[cfg_attr(
    not(feature = "devserver"),
    expect(dead_code, reason = "the devserver's use")
)]
impl Actor {
    pub(crate) fn api(api_key_id: impl Into<String>) -> Self {
        Actor {
            actor_type: "api_actor".into(),
            session_id: None,
            api_key_id: Some(api_key_id.into()),
            user_id: None,
            service_account_id: None,
        }
    }

    pub(crate) fn session(session_id: impl Into<String>) -> Self {
        Actor {
            actor_type: "session_actor".into(),
            session_id: Some(session_id.into()),
            api_key_id: None,
            user_id: None,
            service_account_id: None,
        }
    }

    /// The identifier that names this actor, whatever its type.
    pub(crate) fn id(&self) -> Option<&str> {
        self.session_id
            .as_deref()
            .or(self.api_key_id.as_deref())
            .or(self.user_id.as_deref())
            .or(self.service_account_id.as_deref())
    }
}

/// `memory_version`: one immutable entry in a memory's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryVersion {
    pub id: String,
    #[serde(rename = "type", default = "tag::memory_version")]
    pub object_type: String,
    pub memory_id: String,
    pub memory_store_id: String,
    pub operation: MemoryOperation,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub content_sha256: Option<String>,
    #[serde(default)]
    pub content_size_bytes: Option<u64>,
    #[serde(default)]
    pub(crate) created_by: Option<Actor>,
    pub created_at: Timestamp,
    #[serde(default)]
    pub(crate) redacted_at: Option<Timestamp>,
    #[serde(default)]
    pub(crate) redacted_by: Option<Actor>,
}

/// Confirmation of `DELETE /v1/memory_stores/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeletedMemoryStore {
    pub id: String,
    #[serde(rename = "type", default = "tag::memory_store_deleted")]
    pub object_type: String,
}

/// Confirmation of `DELETE /v1/memory_stores/{id}/memories/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeletedMemory {
    pub id: String,
    #[serde(rename = "type", default = "tag::memory_deleted")]
    pub object_type: String,
}

/// Whether a response carries memory content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum View {
    Basic,
    Full,
}

impl View {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            View::Basic => "basic",
            View::Full => "full",
        }
    }

    #[cfg_attr(
        not(feature = "devserver"),
        expect(dead_code, reason = "the devserver's use")
    )]
    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "basic" => Some(View::Basic),
            "full" => Some(View::Full),
            _ => None,
        }
    }
}

/// `precondition` of a memory update: the stored content must have this hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Precondition {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub content_sha256: Option<String>,
}

impl Precondition {
    pub fn content_sha256(sha: impl Into<String>) -> Self {
        Precondition {
            kind: "content_sha256".into(),
            content_sha256: Some(sha.into()),
        }
    }
}

/// Body of `POST /v1/memory_stores`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateMemoryStore {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// Body of `POST /v1/memory_stores/{id}`: a patch. In `metadata`, a `None`
/// value removes the key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateMemoryStore {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, Option<String>>>,
}

/// Body of `POST /v1/memory_stores/{id}/memories`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateMemory {
    pub path: String,
    /// Required on the wire; `null` is accepted and means an empty memory.
    #[serde(deserialize_with = "required_nullable")]
    pub content: Option<String>,
}

/// A field that must be present but may be `null` (serde would otherwise
/// read a missing `Option` as `None`).
fn required_nullable<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Option::<String>::deserialize(d)
}

/// Body of `POST /v1/memory_stores/{id}/memories/{id}`: new content, a new path
/// (rename), or both, optionally guarded by a precondition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateMemory {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precondition: Option<Precondition>,
}

/// Query of `GET /v1/memory_stores`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListMemoryStores {
    pub limit: Option<u32>,
    pub page: Option<String>,
    pub(crate) include_archived: Option<bool>,
    pub created_at_gte: Option<Timestamp>,
    pub created_at_lte: Option<Timestamp>,
}

/// Query of `GET /v1/memory_stores/{id}/memories`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListMemories {
    pub path_prefix: Option<String>,
    pub depth: Option<u32>,
    pub view: Option<View>,
    pub limit: Option<u32>,
    pub page: Option<String>,
}

/// Query of `GET /v1/memory_stores/{id}/memory_versions`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListMemoryVersions {
    pub memory_id: Option<String>,
    pub session_id: Option<String>,
    pub api_key_id: Option<String>,
    pub service_account_id: Option<String>,
    pub operation: Option<MemoryOperation>,
    pub created_at_gte: Option<Timestamp>,
    pub created_at_lte: Option<Timestamp>,
    pub view: Option<View>,
    pub limit: Option<u32>,
    pub page: Option<String>,
}

/// Default values of the `type` fields, so that a constructor need not spell them.
pub(crate) mod tag {
    pub(crate) fn memory_store() -> String {
        "memory_store".into()
    }
    pub(crate) fn memory() -> String {
        "memory".into()
    }
    pub(crate) fn memory_prefix() -> String {
        "memory_prefix".into()
    }
    pub(crate) fn memory_version() -> String {
        "memory_version".into()
    }
    pub(crate) fn memory_store_deleted() -> String {
        "memory_store_deleted".into()
    }
    pub(crate) fn memory_deleted() -> String {
        "memory_deleted".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_entries_tell_memories_from_other_item_types() {
        let page: Vec<MemoryIndexEntry> = serde_json::from_str(
            r#"[
              {"type":"memory","id":"mem_1","path":"/a.md","content":null,
               "content_sha256":"00","content_size_bytes":0,"brand_new_field":{"x":1}},
              {"type":"memory_prefix","path":"/dir/"},
              {"type":"memory_hologram","path":"/h","id":"x"},
              {"path":"/untyped"}
            ]"#,
        )
        .unwrap();
        let kinds: Vec<IndexKind> = page.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                IndexKind::Memory,
                IndexKind::MemoryPrefix,
                IndexKind::Other,
                IndexKind::Other
            ]
        );
        assert_eq!(
            page.iter().filter(|e| e.is_memory()).count(),
            1,
            "only a memory is synced"
        );
        assert_eq!(
            (page[0].id.as_str(), page[0].content_sha256.as_str()),
            ("mem_1", "00")
        );
    }

    #[test]
    fn list_items_keep_unknown_types_and_ignore_unknown_fields() {
        let page: Vec<MemoryListItem> = serde_json::from_str(
            r#"[
              {"type":"memory","id":"mem_1","memory_store_id":"memstore_1","path":"/a.md",
               "content":null,"content_sha256":"00","content_size_bytes":0,
               "memory_version_id":"memver_1","created_at":"2026-01-01T00:00:00Z",
               "updated_at":"2026-01-01T00:00:00Z","brand_new_field":{"x":1}},
              {"type":"memory_prefix","path":"/dir/"},
              {"type":"memory_hologram","path":"/h"}
            ]"#,
        )
        .unwrap();
        assert!(
            matches!(&page[0], MemoryListItem::Memory(m) if m.path == "/a.md" && m.content.is_none())
        );
        assert!(matches!(&page[1], MemoryListItem::Prefix(p) if p.path == "/dir/"));
        assert!(matches!(&page[2], MemoryListItem::Other(v) if v["type"] == "memory_hologram"));
    }

    #[test]
    fn a_malformed_memory_is_an_error_not_a_silent_skip() {
        let r: Result<MemoryListItem, _> = serde_json::from_str(r#"{"type":"memory","path":"/a"}"#);
        assert!(r.is_err());
    }

    #[test]
    fn create_memory_content_is_required_but_nullable() {
        let null: CreateMemory = serde_json::from_str(r#"{"path":"/a","content":null}"#).unwrap();
        assert_eq!(null.content, None);
        assert!(serde_json::from_str::<CreateMemory>(r#"{"path":"/a"}"#).is_err());
    }

    #[test]
    fn actor_round_trips_only_its_own_fields() {
        let json = serde_json::to_value(Actor::session("sesn_1")).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"type":"session_actor","session_id":"sesn_1"})
        );
    }
}
