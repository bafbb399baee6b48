//! What the API last said of a worker's environment key: the facts `serve`
//! decides readiness from (see `serve::health`).
//!
//! Every request the worker sends with its environment key — polls, acks,
//! the queue-stats reads of `/metrics` and of readiness — reports its
//! outcome here, through the client's [`RequestObserver`]. Requests made
//! with a work item's sessions token do not: they say nothing of the key.
//!
//! - a 2xx: the key works and the API answers; both troubles are over;
//! - a 401 or 403: the key is refused, until a request succeeds again;
//! - no answer (connect, timeout, reset) or a 5xx: the API is out, since
//!   the first such failure after an answer;
//! - any other answer (404, 429…): the API answers, so no outage, but it
//!   proves nothing of the key.
//!
//! A change of standing is logged once (the refusal as an ERROR naming the
//! status, the return as INFO); each failed request also becomes a
//! [`WorkerEvent::QueueError`] for the poll-error counter.

use std::sync::{Arc, Mutex};

use tokio::time::Instant;
use tracing::{error, info};

use crate::api::{Error, ErrorClass, RequestObserver};

use super::{EventSink, WorkerEvent, WorkerObserver, emit_to};

/// The key's standing at one moment.
#[derive(Debug, Clone, Default)]
pub struct Standing {
    /// When a request with the key last succeeded.
    pub last_success: Option<Instant>,
    /// When a request with the key last ended, whatever the outcome.
    pub last_outcome: Option<Instant>,
    /// The API refused the key and nothing succeeded since.
    pub refused: Option<Trouble>,
    /// The API gave no answer, or only 5xx, since `Trouble::since`.
    pub outage: Option<Trouble>,
}

/// A trouble that lasts: since when, and the latest error that showed it.
#[derive(Debug, Clone)]
pub struct Trouble {
    /// The first failure of the streak.
    pub since: Instant,
    pub class: ErrorClass,
    /// The latest error's text (the API's message, or the transport error;
    /// never a credential).
    pub error: String,
}

/// Watches the outcomes of the requests made with the environment key.
pub(crate) struct KeyWatch {
    /// Named in the log lines (the worker knows no endpoint name).
    environment_id: String,
    standing: Mutex<Standing>,
    observers: Vec<Arc<dyn WorkerObserver>>,
    events: Option<EventSink>,
}

impl std::fmt::Debug for KeyWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyWatch").finish_non_exhaustive()
    }
}

/// What one outcome changed, to log outside the lock.
enum Change {
    None,
    Refused { error: String },
    Recovered,
}

impl KeyWatch {
    pub(crate) fn new(
        environment_id: &str,
        observers: Vec<Arc<dyn WorkerObserver>>,
        events: Option<EventSink>,
    ) -> Self {
        KeyWatch {
            environment_id: environment_id.to_string(),
            standing: Mutex::new(Standing::default()),
            observers,
            events,
        }
    }

    pub(crate) fn standing(&self) -> Standing {
        self.standing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn record(&self, outcome: Result<(), &Error>, now: Instant) -> Change {
        let mut s = self.standing.lock().unwrap_or_else(|e| e.into_inner());
        s.last_outcome = Some(now);
        let Err(e) = outcome else {
            s.last_success = Some(now);
            let was_troubled = s.refused.take().is_some() | s.outage.take().is_some();
            return if was_troubled {
                Change::Recovered
            } else {
                Change::None
            };
        };
        let class = e.class();
        let text = crate::api::error::cause_chain(e);
        let trouble = |since| Trouble {
            since,
            class,
            error: text.clone(),
        };
        match class {
            ErrorClass::Auth => {
                s.outage = None;
                let first = s.refused.is_none();
                let since = s.refused.as_ref().map_or(now, |t| t.since);
                s.refused = Some(trouble(since));
                if first {
                    Change::Refused { error: text }
                } else {
                    Change::None
                }
            }
            ErrorClass::Unreachable | ErrorClass::Server => {
                let since = s.outage.as_ref().map_or(now, |t| t.since);
                s.outage = Some(trouble(since));
                Change::None
            }
            ErrorClass::Other => {
                s.outage = None;
                Change::None
            }
        }
    }
}

impl RequestObserver for KeyWatch {
    fn observe(&self, outcome: Result<(), &Error>) {
        match self.record(outcome, Instant::now()) {
            Change::None => {}
            Change::Refused { error } => error!(
                environment_id = %self.environment_id,
                error = %error,
                "the API refused the environment key; /readyz answers 503 until a request with it succeeds"
            ),
            Change::Recovered => info!(
                environment_id = %self.environment_id,
                "the API answers and accepts the environment key again"
            ),
        }
        if let Err(e) = outcome {
            emit_to(
                &self.observers,
                self.events.as_ref(),
                WorkerEvent::QueueError { class: e.class() },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::api::ApiError;

    fn api(status: u16) -> Error {
        Error::Api(ApiError::from_parts(status, None, b"nope"))
    }

    #[test]
    fn refusals_and_outages_last_until_a_success() {
        let watch = KeyWatch::new("env_1", Vec::new(), None);
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        watch.record(Err(&api(503)), at(1));
        watch.record(Err(&api(502)), at(5));
        let s = watch.standing();
        let outage = s.outage.expect("an outage");
        assert_eq!(
            (outage.since, outage.class),
            (at(1), ErrorClass::Server),
            "the streak starts at its first failure"
        );
        // An answer that is no 5xx ends the outage without vouching for the key.
        watch.record(Err(&api(404)), at(6));
        let s = watch.standing();
        assert!(s.outage.is_none() && s.refused.is_none() && s.last_success.is_none());
        assert!(matches!(
            watch.record(Err(&api(401)), at(7)),
            Change::Refused { .. }
        ));
        assert!(
            matches!(watch.record(Err(&api(403)), at(8)), Change::None),
            "logged once"
        );
        assert_eq!(watch.standing().refused.unwrap().since, at(7));
        assert!(matches!(watch.record(Ok(()), at(9)), Change::Recovered));
        let s = watch.standing();
        assert!(s.refused.is_none() && s.outage.is_none());
        assert_eq!((s.last_success, s.last_outcome), (Some(at(9)), Some(at(9))));
    }
}
