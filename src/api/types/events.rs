//! Session events: what the agent emits (`agent.*`), what clients send
//! (`user.*`), and status changes (`session.*`).
//!
//! Event types this client does not model are kept as raw JSON in
//! [`SessionEvent::Other`], so a new server-side event never breaks a stream.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::Timestamp;

/// A text content block, the form every tool result takes here.
pub(crate) fn text_block(text: impl Into<String>) -> Value {
    serde_json::json!({"type": "text", "text": text.into()})
}

/// `agent.tool_use`: the agent calls a built-in toolset tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentToolUse {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub(crate) input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) processed_at: Option<Timestamp>,
    /// `allow`, `ask` or `deny`; absent means allow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) evaluated_permission: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) session_thread_id: Option<String>,
}

/// `agent.custom_tool_use`: the agent calls a custom tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentCustomToolUse {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub(crate) input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) processed_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) session_thread_id: Option<String>,
}

/// `user.tool_result`: the answer to an `agent.tool_use`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserToolResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) processed_at: Option<Timestamp>,
    pub(crate) tool_use_id: String,
    #[serde(default)]
    pub content: Vec<Value>,
    #[serde(default)]
    pub(crate) is_error: bool,
}

/// `user.custom_tool_result`: the answer to an `agent.custom_tool_use`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserCustomToolResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) processed_at: Option<Timestamp>,
    pub(crate) custom_tool_use_id: String,
    #[serde(default)]
    pub content: Vec<Value>,
    #[serde(default)]
    pub(crate) is_error: bool,
}

/// `user.tool_confirmation`: the verdict on a tool call held for permission.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserToolConfirmation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) processed_at: Option<Timestamp>,
    pub(crate) tool_use_id: String,
    /// `allow` or `deny`.
    pub(crate) result: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) deny_message: Option<String>,
}

/// `user.message`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserMessage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) processed_at: Option<Timestamp>,
    #[serde(default)]
    pub content: Vec<Value>,
}

/// An event that carries nothing but its identity: `user.interrupt`,
/// `session.status_running`, `session.status_terminated`, ….
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Marker {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) processed_at: Option<Timestamp>,
}

/// Why a session went idle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StopReason {
    /// `end_turn`, `requires_action`, `retries_exhausted`, `budget_reached`, ….
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) event_ids: Option<Vec<String>>,
}

/// `session.status_idle`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusIdle {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) processed_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) stop_reason: Option<StopReason>,
}

/// `session.error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionErrorEvent {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) processed_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<Value>,
}

macro_rules! session_events {
    ($( $variant:ident($ty:ty) = $name:literal ),* $(,)?) => {
        /// One session event.
        #[derive(Debug, Clone, PartialEq)]
        pub enum SessionEvent {
            $( $variant($ty), )*
            /// An event type this client does not model, kept whole.
            Other(Value),
        }

        impl SessionEvent {
            /// The wire `type` of this event.
            pub(crate) fn event_type(&self) -> &str {
                match self {
                    $( SessionEvent::$variant(_) => $name, )*
                    SessionEvent::Other(v) => v.get("type").and_then(Value::as_str).unwrap_or(""),
                }
            }

            /// Every event type this client models.
            pub const KNOWN_TYPES: &'static [&'static str] = &[$( $name ),*];

            /// Parse one event's JSON text (a stream's `data:`): its `type`
            /// read first, then the text straight into that type — one
            /// pass, where the generic [`Deserialize`] builds a `Value`
            /// first. Anything that does not parse so (not an object, an
            /// unknown type, a malformed event) takes the generic path, so
            /// the result and the error are the same.
            pub(crate) fn from_json(text: &str) -> serde_json::Result<SessionEvent> {
                #[derive(Deserialize)]
                struct Kind<'a> {
                    #[serde(rename = "type", borrow)]
                    kind: std::borrow::Cow<'a, str>,
                }
                let typed = match serde_json::from_str::<Kind<'_>>(text) {
                    Ok(Kind { kind }) => match kind.as_ref() {
                        $( $name => serde_json::from_str(text).map(SessionEvent::$variant).ok(), )*
                        _ => None,
                    },
                    Err(_) => None,
                };
                match typed {
                    Some(event) => Ok(event),
                    None => serde_json::from_str(text),
                }
            }
        }

        impl Serialize for SessionEvent {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut value = match self {
                    $( SessionEvent::$variant(e) => serde_json::to_value(e).map_err(serde::ser::Error::custom)?, )*
                    SessionEvent::Other(v) => return v.serialize(s),
                };
                if let Value::Object(map) = &mut value {
                    map.insert("type".into(), Value::String(self.event_type().to_string()));
                }
                value.serialize(s)
            }
        }

        impl<'de> Deserialize<'de> for SessionEvent {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let value = Value::deserialize(d)?;
                let kind = value.get("type").and_then(Value::as_str).unwrap_or("").to_string();
                match kind.as_str() {
                    $( $name => serde_json::from_value(value).map(SessionEvent::$variant).map_err(serde::de::Error::custom), )*
                    _ => Ok(SessionEvent::Other(value)),
                }
            }
        }
    };
}

session_events! {
    AgentToolUse(AgentToolUse) = "agent.tool_use",
    AgentCustomToolUse(AgentCustomToolUse) = "agent.custom_tool_use",
    UserToolResult(UserToolResult) = "user.tool_result",
    UserCustomToolResult(UserCustomToolResult) = "user.custom_tool_result",
    UserToolConfirmation(UserToolConfirmation) = "user.tool_confirmation",
    UserMessage(UserMessage) = "user.message",
    UserInterrupt(Marker) = "user.interrupt",
    StatusIdle(StatusIdle) = "session.status_idle",
    StatusRunning(Marker) = "session.status_running",
    StatusRescheduled(Marker) = "session.status_rescheduled",
    StatusTerminated(Marker) = "session.status_terminated",
    Deleted(Marker) = "session.deleted",
    Error(SessionErrorEvent) = "session.error",
}

impl SessionEvent {
    /// The event's `id`, when it has one (events a client sends have none).
    pub fn id(&self) -> Option<&str> {
        match self {
            SessionEvent::AgentToolUse(e) => Some(&e.id),
            SessionEvent::AgentCustomToolUse(e) => Some(&e.id),
            SessionEvent::UserToolResult(e) => e.id.as_deref(),
            SessionEvent::UserCustomToolResult(e) => e.id.as_deref(),
            SessionEvent::UserToolConfirmation(e) => e.id.as_deref(),
            SessionEvent::UserMessage(e) => e.id.as_deref(),
            SessionEvent::StatusIdle(e) => e.id.as_deref(),
            SessionEvent::Error(e) => e.id.as_deref(),
            SessionEvent::UserInterrupt(m)
            | SessionEvent::StatusRunning(m)
            | SessionEvent::StatusRescheduled(m)
            | SessionEvent::StatusTerminated(m)
            | SessionEvent::Deleted(m) => m.id.as_deref(),
            SessionEvent::Other(v) => v.get("id").and_then(Value::as_str),
        }
    }

    /// A successful or failed tool result for `tool_use_id`.
    pub fn tool_result(
        tool_use_id: impl Into<String>,
        content: Vec<Value>,
        is_error: bool,
    ) -> Self {
        SessionEvent::UserToolResult(UserToolResult {
            id: None,
            processed_at: None,
            tool_use_id: tool_use_id.into(),
            content,
            is_error,
        })
    }
}

/// Body of `POST /v1/sessions/{id}/events`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SendEvents {
    pub(crate) events: Vec<SessionEvent>,
}

/// Answer of `POST /v1/sessions/{id}/events`: the events as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SentEvents {
    pub data: Vec<SessionEvent>,
}

/// Order of an event listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    #[default]
    Asc,
    Desc,
}

impl Order {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Order::Asc => "asc",
            Order::Desc => "desc",
        }
    }
}

/// Query of `GET /v1/sessions/{id}/events`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListEvents {
    pub limit: Option<u32>,
    pub page: Option<String>,
    pub(crate) order: Option<Order>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_events_decode_and_unknown_ones_are_kept_raw() {
        let events: Vec<SessionEvent> = serde_json::from_str(
            r#"[
              {"type":"agent.tool_use","id":"sevt_1","name":"bash","input":{"command":"ls"},
               "processed_at":"2026-01-01T00:00:00Z","evaluated_permission":"ask","novel":true},
              {"type":"session.status_idle","id":"sevt_2","stop_reason":{"type":"end_turn"}},
              {"type":"agent.message","id":"sevt_3","content":[{"type":"text","text":"hi"}]}
            ]"#,
        )
        .unwrap();
        match &events[0] {
            SessionEvent::AgentToolUse(t) => {
                assert_eq!(t.name, "bash");
                assert_eq!(t.evaluated_permission.as_deref(), Some("ask"));
            }
            other => panic!("expected a tool use, got {other:?}"),
        }
        assert!(
            matches!(&events[1], SessionEvent::StatusIdle(i) if i.stop_reason.as_ref().unwrap().kind == "end_turn")
        );
        assert!(matches!(&events[2], SessionEvent::Other(v) if v["content"][0]["text"] == "hi"));
        assert_eq!(events[2].event_type(), "agent.message");
        assert_eq!(events[2].id(), Some("sevt_3"));
    }

    /// The one-pass parse of a stream's `data:` gives what the generic
    /// path gives, event or error, for every modelled type, unknown types,
    /// odd `type`s and malformed events.
    #[test]
    fn parsing_a_data_line_in_one_pass_gives_what_the_generic_path_gives() {
        let texts = [
            r#"{"type":"agent.tool_use","id":"sevt_1","name":"bash","input":{"command":"ls"},"processed_at":"2026-01-01T00:00:00Z","session_thread_id":"t1"}"#,
            r#"{"type":"agent.custom_tool_use","id":"sevt_1","name":"mine","input":{}}"#,
            r#"{"type":"user.tool_result","id":"sevt_2","tool_use_id":"sevt_1","content":[{"type":"text","text":"hi é"}],"is_error":false}"#,
            r#"{"type":"user.custom_tool_result","tool_use_id":"sevt_1","content":[]}"#,
            r#"{"type":"user.tool_confirmation","tool_use_id":"sevt_1","result":"allow"}"#,
            r#"{"type":"session.status_idle","id":"sevt_2","stop_reason":{"type":"end_turn"}}"#,
            r#"{"type":"session.status_running","id":"sevt_3"}"#,
            r#"{"type":"session.status_terminated","id":"sevt_4"}"#,
            r#"{"type":"session.thread_status_terminated","session_thread_id":"t1"}"#,
            r#"{"type":"session.error","error":{"message":"boom"}}"#,
            r#"{"type":"session.deleted","id":"sevt_5"}"#,
            r#"{"type":"agent.message","id":"sevt_3","content":[{"type":"text","text":"hi"}]}"#,
            r#"{"type":"agent.tool\u005fuse","id":"sevt_1","name":"bash","input":{}}"#,
            r#"{"type":7,"id":"x"}"#,
            r#"{"id":"no type"}"#,
            r#"[1,2]"#,
            r#""text""#,
            r#"{"type":"agent.tool_use","id":5}"#,
            r#"{"type":"user.tool_result","tool_use_id":"sevt_1","is_error":"no"}"#,
            r#"{"type":"agent.tool_use","#,
            "",
        ];
        for text in texts {
            let fast = SessionEvent::from_json(text).map_err(|e| e.to_string());
            let generic = serde_json::from_str::<SessionEvent>(text).map_err(|e| e.to_string());
            assert_eq!(fast, generic, "{text}");
        }
        // The modelled types all went the typed way.
        assert!(matches!(
            SessionEvent::from_json(texts[0]),
            Ok(SessionEvent::AgentToolUse(_))
        ));
    }

    #[test]
    fn serialising_adds_the_type_tag() {
        let event = SessionEvent::tool_result("sevt_1", vec![text_block("(no output)")], false);
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"type":"user.tool_result","tool_use_id":"sevt_1",
                               "content":[{"type":"text","text":"(no output)"}],"is_error":false})
        );
        let back: SessionEvent = serde_json::from_value(json).unwrap();
        assert_eq!(back, event);
    }
}
