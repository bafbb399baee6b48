//! Wire types of the Managed Agents API subset. Unknown fields are ignored on
//! decode; unknown union members are kept as raw JSON.

mod events;
mod memory;
mod session;
mod skills;
mod work;

pub use events::*;
pub use memory::*;
pub use session::*;
pub use skills::*;
pub use work::*;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Every timestamp the API sends is RFC 3339, UTC.
pub(crate) type Timestamp = chrono::DateTime<chrono::Utc>;

/// One page of a cursor-paginated listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Page<T> {
    pub data: Vec<T>,
    /// Pass as `page` to get the next page; `None` (or empty) on the last one.
    #[serde(default)]
    pub next_page: Option<String>,
}

impl<T> Page<T> {
    /// The cursor of the next page, if there is one to fetch.
    pub(crate) fn next_cursor(&self) -> Option<&str> {
        match self.next_page.as_deref() {
            Some(c) if !c.is_empty() && !self.data.is_empty() => Some(c),
            _ => None,
        }
    }
}

/// The error envelope: `{"type":"error","error":{...},"request_id":...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ErrorEnvelope {
    #[serde(rename = "type")]
    pub object_type: String,
    pub(crate) error: ErrorBody,
    #[serde(default)]
    pub(crate) request_id: Option<String>,
}

/// The `error` member of the envelope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ErrorBody {
    /// `invalid_request_error`, `not_found_error`, `memory_precondition_failed_error`, ….
    #[serde(rename = "type")]
    pub kind: String,
    pub(crate) message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) details: Option<Value>,
}
