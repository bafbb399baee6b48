//! Readiness that tells the truth: `/readyz` answers 503, naming each
//! endpoint and its cause, when an endpoint cannot serve what it is sent.
//!
//! An endpoint is unready when
//! - `credentials_refused`: the API refused its environment key (401/403)
//!   and no request with the key succeeded since; or
//! - `api_unreachable`: its requests have got no answer (connect errors,
//!   timeouts) or only 5xx for `--unready-after` (60 s by default) or more.
//!
//! It is ready again as soon as a request with its key succeeds. The facts
//! come from every request the endpoint's worker makes with its key (see
//! [`crate::worker::standing`]). An idle replica makes none, so a key
//! revoked while idle would never show: `/readyz` itself then probes the
//! key with one work-queue stats read (`GET …/work/stats`, which claims
//! nothing), at most once per [`probe_every`] per endpoint, only when no
//! request with the key ended within that time, one at a time. The answer
//! waits at most [`PROBE_WAIT`] for the probe (a kubelet's probe times out
//! after 1 s); a slower probe still records its outcome for the next ask.
//!
//! The replica is unready when any endpoint is: every replica shares the
//! endpoint file, so a wrong key is a deployment error to surface, not a
//! replica to route around. `/healthz` stays 200: a restart mends neither.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::time::Instant;
use tracing::warn;

use crate::worker::standing::{Standing, Trouble};

use super::Endpoint;

/// `--unready-after`'s default: how long the API may be unreachable
/// before the replica reports itself unready.
pub const DEFAULT_UNREADY_AFTER: Duration = Duration::from_secs(60);
/// The longest `/readyz` waits for a probe it started.
pub const PROBE_WAIT: Duration = Duration::from_millis(800);

/// How often `/readyz` may probe an idle endpoint's key: half the
/// threshold, so an outage shows within 1.5× of it, between 1 s and 30 s.
pub fn probe_every(unready_after: Duration) -> Duration {
    (unready_after / 2).clamp(Duration::from_secs(1), Duration::from_secs(30))
}

/// Why an endpoint is unready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    CredentialsRefused,
    ApiUnreachable,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::CredentialsRefused => "credentials_refused",
            Cause::ApiUnreachable => "api_unreachable",
        }
    }
}

/// Is an endpoint with this standing unready at `now`, and why?
pub fn verdict(
    standing: &Standing,
    now: Instant,
    unready_after: Duration,
) -> Option<(Cause, &Trouble)> {
    if let Some(t) = &standing.refused {
        return Some((Cause::CredentialsRefused, t));
    }
    match &standing.outage {
        Some(t) if now.saturating_duration_since(t.since) >= unready_after => {
            Some((Cause::ApiUnreachable, t))
        }
        _ => None,
    }
}

/// Per endpoint: the probe's rate limit and whether an outage was logged.
#[derive(Debug, Default)]
pub(crate) struct Watch {
    last_probe: Mutex<Option<Instant>>,
    probing: AtomicBool,
    /// The crossing into `api_unreachable` was logged (once per outage).
    reported: AtomicBool,
}

impl Watch {
    /// Start a probe of `endpoint`'s key when it is due (see the module
    /// doc); the handle ends when the probe did.
    pub(crate) fn probe_if_due(
        endpoint: &std::sync::Arc<Endpoint>,
        every: Duration,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let now = Instant::now();
        let watch = &endpoint.health;
        let recent = |at: Option<Instant>| at.is_some_and(|t| now.duration_since(t) < every);
        if recent(endpoint.worker.standing().last_outcome) {
            return None;
        }
        {
            let mut last = watch.last_probe.lock().unwrap_or_else(|e| e.into_inner());
            if recent(*last) || watch.probing.swap(true, Ordering::SeqCst) {
                return None;
            }
            *last = Some(now);
        }
        let endpoint = endpoint.clone();
        Some(tokio::spawn(async move {
            // The outcome reaches the standing through the client; the
            // request's own timeout bounds it, so a hung API counts too.
            let _ = endpoint.worker.queue_stats().await;
            endpoint.health.probing.store(false, Ordering::SeqCst);
        }))
    }

    /// The endpoint's part of the readiness body, and whether it is ready.
    /// Logs once when an outage crosses the threshold.
    pub(crate) fn report(
        &self,
        name: &str,
        standing: &Standing,
        now: Instant,
        unready_after: Duration,
    ) -> (bool, Value) {
        let secs = |t: &Trouble| now.saturating_duration_since(t.since).as_secs();
        match verdict(standing, now, unready_after) {
            Some((cause, trouble)) => {
                if cause == Cause::ApiUnreachable && !self.reported.swap(true, Ordering::SeqCst) {
                    warn!(
                        endpoint = %name,
                        unreachable_s = secs(trouble),
                        error = %trouble.error,
                        "the API has given no answer or only 5xx for longer than --unready-after; /readyz answers 503 until a request succeeds"
                    );
                }
                (
                    false,
                    json!({
                        "ready": false,
                        "cause": cause.as_str(),
                        "class": trouble.class.as_str(),
                        "error": trouble.error,
                        "for_s": secs(trouble),
                    }),
                )
            }
            None => {
                if standing.outage.is_none() {
                    self.reported.store(false, Ordering::SeqCst);
                }
                let mut body = Map::new();
                body.insert("ready".into(), Value::Bool(true));
                // A failing streak still under the threshold: shown, not fatal.
                if let Some(t) = &standing.outage {
                    body.insert("failing_for_s".into(), secs(t).into());
                    body.insert("error".into(), Value::String(t.error.clone()));
                }
                (true, Value::Object(body))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ErrorClass;

    fn trouble(since: Instant, class: ErrorClass) -> Trouble {
        Trouble {
            since,
            class,
            error: "boom".into(),
        }
    }

    #[test]
    fn refusal_is_unready_at_once_and_an_outage_only_past_the_threshold() {
        let t0 = Instant::now();
        let after = Duration::from_secs(60);
        let at = |s| t0 + Duration::from_secs(s);
        assert!(verdict(&Standing::default(), at(0), after).is_none());
        let refused = Standing {
            refused: Some(trouble(t0, ErrorClass::Auth)),
            ..Default::default()
        };
        assert_eq!(
            verdict(&refused, t0, after).map(|v| v.0),
            Some(Cause::CredentialsRefused)
        );
        let out = Standing {
            outage: Some(trouble(t0, ErrorClass::Unreachable)),
            ..Default::default()
        };
        assert!(verdict(&out, at(59), after).is_none());
        assert_eq!(
            verdict(&out, at(60), after).map(|v| v.0),
            Some(Cause::ApiUnreachable)
        );
    }

    #[test]
    fn probes_come_at_half_the_threshold_within_bounds() {
        assert_eq!(
            probe_every(Duration::from_secs(60)),
            Duration::from_secs(30)
        );
        assert_eq!(
            probe_every(Duration::from_secs(600)),
            Duration::from_secs(30)
        );
        assert_eq!(probe_every(Duration::from_secs(1)), Duration::from_secs(1));
        assert_eq!(probe_every(Duration::from_secs(4)), Duration::from_secs(2));
    }
}
