//! The idle countdown: how long the session has been idle since its turn
//! ended. A `session.status_idle` whose stop reason is anything but
//! `requires_action` arms it; any other event but a neutral one disarms it.
//! Calls held for a confirmation (and allowed calls until they are done)
//! hold it: an arm that lands meanwhile is deferred until the last hold is
//! released, so the runner never stops over gated work.

use tokio::time::Instant;

use crate::api::types::SessionEvent;

/// Event types that leave the countdown as it is.
const NEUTRAL: [&str; 2] = ["user.tool_confirmation", "session.thread_status_terminated"];

/// Whether an event leaves the idle countdown untouched.
pub(crate) fn is_neutral(event: &SessionEvent) -> bool {
    NEUTRAL.contains(&event.event_type())
}

/// Whether `event` is an idle that ends the turn: every stop reason but
/// `requires_action` does, including one newer than this worker.
pub(crate) fn ends_turn(event: &SessionEvent) -> bool {
    match event {
        SessionEvent::StatusIdle(idle) => idle
            .stop_reason
            .as_ref()
            .is_none_or(|r| r.kind != "requires_action"),
        _ => false,
    }
}

#[derive(Debug, Default)]
pub(crate) struct IdleClock {
    armed_at: Option<Instant>,
    holds: usize,
    deferred: bool,
}

impl IdleClock {
    /// When the countdown started, if it runs.
    pub(crate) fn armed_at(&self) -> Option<Instant> {
        self.armed_at
    }

    pub(crate) fn note(&mut self, event: &SessionEvent) {
        if is_neutral(event) {
            return;
        }
        if ends_turn(event) {
            self.arm();
        } else {
            self.disarm();
        }
    }

    pub(crate) fn arm(&mut self) {
        if self.holds > 0 {
            self.deferred = true;
            return;
        }
        self.armed_at = Some(Instant::now());
    }

    pub(crate) fn disarm(&mut self) {
        self.deferred = false;
        self.armed_at = None;
    }

    pub(crate) fn hold(&mut self) {
        self.holds += 1;
        if self.armed_at.take().is_some() {
            self.deferred = true;
        }
    }

    pub(crate) fn release(&mut self) {
        self.holds = self.holds.saturating_sub(1);
        if self.holds == 0 && std::mem::take(&mut self.deferred) {
            self.arm();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(v: serde_json::Value) -> SessionEvent {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn end_turn_arms_requires_action_does_not_and_other_events_disarm() {
        let mut clock = IdleClock::default();
        clock.note(&ev(json!({"type": "session.status_idle", "id": "1", "stop_reason": {"type": "requires_action", "event_ids": []}})));
        assert!(clock.armed_at().is_none());
        clock.note(&ev(
            json!({"type": "session.status_idle", "id": "2", "stop_reason": {"type": "end_turn"}}),
        ));
        assert!(clock.armed_at().is_some());
        clock.note(&ev(json!({"type": "user.tool_confirmation", "id": "3", "tool_use_id": "x", "result": "allow"})));
        assert!(clock.armed_at().is_some(), "a confirmation is neutral");
        clock.note(&ev(
            json!({"type": "agent.message", "id": "4", "content": []}),
        ));
        assert!(clock.armed_at().is_none());
        clock.note(&ev(json!({"type": "session.status_idle", "id": "5", "stop_reason": {"type": "retries_exhausted"}})));
        assert!(
            clock.armed_at().is_some(),
            "any other stop reason ends the turn"
        );
    }

    #[test]
    fn holds_defer_an_arm_until_the_last_release() {
        let mut clock = IdleClock::default();
        clock.hold();
        clock.hold();
        clock.arm();
        assert!(clock.armed_at().is_none());
        clock.release();
        assert!(clock.armed_at().is_none());
        clock.release();
        assert!(clock.armed_at().is_some());
        // A hold taken while armed converts the countdown into a deferred one.
        clock.hold();
        assert!(clock.armed_at().is_none());
        clock.release();
        assert!(clock.armed_at().is_some());
        // A disarm drops a deferred arm.
        clock.hold();
        clock.disarm();
        clock.release();
        assert!(clock.armed_at().is_none());
    }
}
