//! What the devserver keeps in memory only: the fan-out of session events to
//! open SSE streams and scripted agents, and the wake-up of blocked polls.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::{Notify, broadcast};

/// One recorded session event: its position in the log and its JSON, which
/// carries `id`, `type` and `processed_at`.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub(crate) seq: i64,
    pub(crate) session_id: String,
    pub(crate) body: Value,
}

impl StoredEvent {
    pub fn event_type(&self) -> &str {
        self.body
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }
}

/// Capacity of a session's fan-out; a subscriber that falls this far behind
/// is dropped and must re-read the history, as a real client reconnects.
const FANOUT_CAPACITY: usize = 1024;

#[derive(Default)]
pub struct Live {
    sessions: Mutex<HashMap<String, broadcast::Sender<Arc<StoredEvent>>>>,
    /// Notified whenever an item becomes claimable.
    pub(crate) work_available: Notify,
}

impl Live {
    /// Events of `session_id` published from now on.
    pub fn subscribe(&self, session_id: &str) -> broadcast::Receiver<Arc<StoredEvent>> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions
            .entry(session_id.to_string())
            .or_insert_with(|| broadcast::channel(FANOUT_CAPACITY).0)
            .subscribe()
    }

    /// Hand committed events to their sessions' subscribers.
    pub fn publish(&self, events: Vec<StoredEvent>) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        for event in events {
            if let Some(tx) = sessions.get(&event.session_id)
                && tx.send(Arc::new(event.clone())).is_err()
            {
                // Nobody listens any more; forget the channel.
                sessions.remove(&event.session_id);
            }
        }
    }
}

/// What a committed transaction must set in motion: events to fan out,
/// sessions that started running (a webhook each), new claimable work.
#[derive(Debug, Default)]
pub struct Effects {
    pub(crate) events: Vec<StoredEvent>,
    pub(crate) run_started: Vec<String>,
    pub(crate) work_available: bool,
}
