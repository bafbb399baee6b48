//! A typed client for the subset of the Managed Agents API that a worker
//! touches: memory stores, the work queue, sessions and their events, and
//! the session agent's skills.
//!
//! Headers follow the API's rules exactly: `anthropic-version` on every
//! request; one `anthropic-beta` per family (`managed-agents-2026-04-01` for
//! environments and sessions, `agent-memory-2026-07-22` for memory stores —
//! never both, which the memory endpoints refuse — and `skills-2025-10-02`
//! for skills); worker credentials as `Authorization: Bearer` with no
//! `x-api-key`; `Anthropic-Worker-ID` on poll.

mod client;
pub mod error;
mod memory;
pub mod retry;
mod sessions;
mod skills;
pub mod types;
mod work;

pub use client::{
    ANTHROPIC_VERSION, ApiFamily, BETA_AGENT_MEMORY, BETA_MANAGED_AGENTS, BETA_SKILLS, Client,
    ClientBuilder, Credential, DEFAULT_BASE_URL, RequestObserver, paginate,
};
pub use error::{ApiError, Error, ErrorClass, is_permanent_status};
pub use memory::{Memories, MemoryStores, MemoryVersions};
pub use retry::RetryPolicy;
pub use sessions::Sessions;
pub use skills::{DownloadError, Skills};
pub use work::{NO_HEARTBEAT, WorkQueue};

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Characters left as they are in a path segment: RFC 3986 unreserved.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// An identifier made safe to splice into a URL path: an id can never add a
/// segment or a query to the request.
pub(crate) fn seg(id: &str) -> String {
    utf8_percent_encode(id, SEGMENT).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_cannot_escape_their_path_segment() {
        assert_eq!(super::seg("mem_01Ab-c.d~e"), "mem_01Ab-c.d~e");
        assert_eq!(super::seg("../x?y=1#z"), "..%2Fx%3Fy%3D1%23z");
    }
}
