//! A bounded memory of the `webhook-id`s already accepted.
//!
//! A signature only proves who sent a delivery, not that it is the first
//! time it arrives: within the ±5 min tolerance a captured delivery can be
//! sent again, and the sender itself retries with the same id. An id seen
//! within the window is answered without starting work twice. Entries
//! older than the window are forgotten (a replay that old fails the
//! timestamp check anyway), and the table never grows past its capacity.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Remember ids a little longer than the timestamp tolerance allows a replay.
pub const REPLAY_WINDOW: Duration = Duration::from_secs(11 * 60);
pub const REPLAY_CAPACITY: usize = 100_000;

#[derive(Debug)]
pub struct ReplayFilter {
    window: Duration,
    capacity: usize,
    seen: HashMap<String, Instant>,
    order: VecDeque<(Instant, String)>,
}

impl Default for ReplayFilter {
    fn default() -> Self {
        ReplayFilter::new(REPLAY_WINDOW, REPLAY_CAPACITY)
    }
}

impl ReplayFilter {
    pub fn new(window: Duration, capacity: usize) -> Self {
        ReplayFilter {
            window,
            capacity: capacity.max(1),
            seen: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    fn expire(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front() {
            let old = now.duration_since(*at) > self.window;
            if !old && self.order.len() <= self.capacity {
                break;
            }
            if let Some((at, id)) = self.order.pop_front()
                && self.seen.get(&id) == Some(&at)
            {
                self.seen.remove(&id);
            }
        }
    }

    /// Whether `id` was recorded within the window.
    pub fn contains(&mut self, id: &str, now: Instant) -> bool {
        self.expire(now);
        self.seen.contains_key(id)
    }

    /// Record `id` as accepted.
    pub fn record(&mut self, id: &str, now: Instant) {
        self.seen.insert(id.to_string(), now);
        self.order.push_back((now, id.to_string()));
        self.expire(now);
    }

    /// Forget `id` (its delivery was not acted on after all).
    pub fn forget(&mut self, id: &str) {
        self.seen.remove(id);
    }

    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_a_replay_within_the_window_and_forgotten_after() {
        let mut filter = ReplayFilter::new(Duration::from_secs(60), 10);
        let t0 = Instant::now();
        assert!(!filter.contains("a", t0));
        filter.record("a", t0);
        assert!(filter.contains("a", t0 + Duration::from_secs(59)));
        assert!(!filter.contains("a", t0 + Duration::from_secs(61)));
        assert!(filter.is_empty());
    }

    #[test]
    fn a_forgotten_id_is_new_again() {
        let mut filter = ReplayFilter::default();
        let now = Instant::now();
        filter.record("msg_1", now);
        filter.forget("msg_1");
        assert!(!filter.contains("msg_1", now));
        filter.record("msg_1", now);
        assert!(filter.contains("msg_1", now));
    }

    #[test]
    fn the_table_never_grows_past_its_capacity() {
        let mut filter = ReplayFilter::new(Duration::from_secs(600), 3);
        let t0 = Instant::now();
        for i in 0..10 {
            filter.record(&format!("id{i}"), t0);
        }
        assert_eq!(filter.len(), 3);
        assert!(filter.contains("id9", t0));
        assert!(!filter.contains("id0", t0), "the oldest ids go first");
    }
}
