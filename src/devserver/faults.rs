//! Faults for tests: per-route latency, an error status at a rate, and
//! "commit, then drop the response" (the request takes effect, the client
//! never hears so). Set at start with `--fault RULE` (repeatable) or at run
//! time with `POST /dev/faults`; `DELETE /dev/faults` clears them.
//!
//! Rule syntax for the flag: `[METHOD ]PATH_GLOB:key=value[,key=value…]`,
//! where `*` in the glob matches anything (slashes too) and the keys are
//! `latency_ms`, `status`, `rate` (0–1, default 1), `drop` (`true`),
//! `cut_after_ms` (handle the request, then end its response this long after
//! it began: an open event stream is closed by the server, as a proxy's
//! timeout or a deploy does, and the client must reconnect) and `times`
//! (apply to this many matching requests, then stop). For example
//! `POST /v1/memory_stores/*/memories/*:status=503,rate=0.5` or
//! `*:latency_ms=5`. Through `POST /dev/faults` a rule may also carry
//! `headers` (e.g. `{"retry-after-ms": "1500"}`) added to its injected error
//! answer, to exercise a client's `retry-after` and `x-should-retry` handling.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use rand::RngExt;
use serde::{Deserialize, Serialize};

/// Rules active at once (from `--fault` and `POST /dev/faults` together).
pub const MAX_RULES: usize = 100;
/// A rule's `latency_ms` is at most this (10 minutes).
pub const MAX_LATENCY_MS: u64 = 600_000;
/// A rule's `times` is at most this.
pub const MAX_TIMES: u64 = 1_000_000;
/// A rule's `rate`: a probability.
pub const RATE: std::ops::RangeInclusive<f64> = 0.0..=1.0;
/// A rule's `status`: an error status, client or server.
pub const STATUS: std::ops::RangeInclusive<u16> = 400..=599;

/// One fault rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRule {
    /// Only requests with this method; any method when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) method: Option<String>,
    /// A glob over the request path (`*` matches anything).
    pub(crate) path: String,
    #[serde(default)]
    pub(crate) latency_ms: u64,
    /// Answer with this error status instead of handling the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Handle the request (it commits), then drop the response.
    #[serde(default)]
    pub(crate) drop_response: bool,
    /// Handle the request, then end its response body this many ms after it
    /// began. An event stream open that long is closed by the server, as a
    /// proxy's idle timeout or a deploy does; the client has to reconnect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cut_after_ms: Option<u64>,
    /// Probability that a matching request gets the status or the drop.
    #[serde(default = "one")]
    pub(crate) rate: f64,
    /// Matching requests left before the rule retires; unlimited when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) times: Option<u64>,
    /// Headers added to the injected error answer (`retry-after`, `x-should-retry`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) headers: BTreeMap<String, String>,
}

fn one() -> f64 {
    1.0
}

impl FaultRule {
    /// Parse the flag syntax.
    pub fn parse(spec: &str) -> Result<FaultRule, String> {
        let (target, options) = spec
            .split_once(':')
            .ok_or_else(|| format!("fault {spec:?}: expected [METHOD ]PATH:key=value,…"))?;
        let mut words = target.split_whitespace();
        let (method, path) = match (words.next(), words.next(), words.next()) {
            (Some(path), None, None) => (None, path),
            (Some(method), Some(path), None) => (Some(method.to_ascii_uppercase()), path),
            _ => return Err(format!("fault {spec:?}: expected [METHOD ]PATH before ':'")),
        };
        let mut rule = FaultRule {
            method,
            path: path.to_string(),
            latency_ms: 0,
            status: None,
            drop_response: false,
            cut_after_ms: None,
            rate: 1.0,
            times: None,
            headers: BTreeMap::new(),
        };
        for option in options.split(',').filter(|o| !o.trim().is_empty()) {
            let (key, value) = option
                .split_once('=')
                .ok_or_else(|| format!("fault {spec:?}: {option:?} is not key=value"))?;
            let bad = || format!("fault {spec:?}: bad value for {key}");
            match key.trim() {
                "latency_ms" => rule.latency_ms = value.trim().parse().map_err(|_| bad())?,
                "status" => rule.status = Some(value.trim().parse().map_err(|_| bad())?),
                "rate" => rule.rate = value.trim().parse().map_err(|_| bad())?,
                "drop" => rule.drop_response = value.trim().parse().map_err(|_| bad())?,
                "cut_after_ms" => {
                    rule.cut_after_ms = Some(value.trim().parse().map_err(|_| bad())?)
                }
                "times" => rule.times = Some(value.trim().parse().map_err(|_| bad())?),
                other => return Err(format!("fault {spec:?}: unknown key {other:?}")),
            }
        }
        rule.check().map_err(|e| format!("fault {spec:?}: {e}"))?;
        Ok(rule)
    }

    pub fn check(&self) -> Result<(), String> {
        if self.latency_ms > MAX_LATENCY_MS {
            return Err(format!(
                "latency_ms is {}; it must be at most {MAX_LATENCY_MS} (10 minutes)",
                self.latency_ms
            ));
        }
        if let Some(cut) = self.cut_after_ms
            && cut > MAX_LATENCY_MS
        {
            return Err(format!(
                "cut_after_ms is {cut}; it must be at most {MAX_LATENCY_MS} (10 minutes)"
            ));
        }
        if self.cut_after_ms.is_some() && self.status.is_some() {
            return Err("cut_after_ms cuts a handled response; it cannot go with a status".into());
        }
        if let Some(times) = self.times
            && times > MAX_TIMES
        {
            return Err(format!("times is {times}; it must be at most {MAX_TIMES}"));
        }
        if !RATE.contains(&self.rate) {
            return Err(format!(
                "rate must be between {} and {}",
                RATE.start(),
                RATE.end()
            ));
        }
        if let Some(s) = self.status
            && !STATUS.contains(&s)
        {
            return Err(format!(
                "status must be an error status ({}–{})",
                STATUS.start(),
                STATUS.end()
            ));
        }
        if !self.path.starts_with('/') && self.path != "*" {
            return Err("path must start with / (or be *)".into());
        }
        if !self.headers.is_empty() && self.status.is_none() {
            return Err("headers go with an injected status".into());
        }
        for (name, value) in &self.headers {
            if HeaderName::from_bytes(name.as_bytes()).is_err()
                || HeaderValue::from_str(value).is_err()
            {
                return Err(format!("header {name:?} is not a valid HTTP header"));
            }
        }
        Ok(())
    }

    fn matches(&self, method: &str, path: &str) -> bool {
        self.method
            .as_deref()
            .is_none_or(|m| m.eq_ignore_ascii_case(method))
            && glob(&self.path, path)
    }
}

/// `*` matches any run of characters, `/` included.
pub fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first)
        || !text[first.len()..].ends_with(last)
        || text.len() < first.len() + last.len()
    {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    true
}

/// The error for `count` rules: more than [`MAX_RULES`].
pub fn too_many_rules(count: usize) -> String {
    format!("{count} fault rules; at most {MAX_RULES} can be active at once")
}

/// The active rules.
#[derive(Debug, Default)]
pub struct Faults {
    rules: Mutex<Vec<FaultRule>>,
}

/// What one request gets.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Decision {
    pub(super) latency: Duration,
    pub(super) status: Option<u16>,
    /// The headers of the rule whose status applies.
    pub(super) headers: BTreeMap<String, String>,
    pub(super) drop_response: bool,
    /// End the response body this long after the request began.
    pub(super) cut_after: Option<Duration>,
}

impl Faults {
    pub fn new(rules: Vec<FaultRule>) -> Self {
        Faults {
            rules: Mutex::new(rules),
        }
    }

    /// Add `rules`, unless the active rules would then exceed [`MAX_RULES`].
    pub fn add(&self, rules: Vec<FaultRule>) -> Result<(), String> {
        let mut active = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        if active.len() + rules.len() > MAX_RULES {
            return Err(too_many_rules(active.len() + rules.len()));
        }
        active.extend(rules);
        Ok(())
    }

    pub fn clear(&self) {
        self.rules.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    pub fn rules(&self) -> Vec<FaultRule> {
        self.rules.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(super) fn decide(&self, method: &str, path: &str) -> Decision {
        let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        let mut decision = Decision::default();
        let mut rng = rand::rng();
        for rule in rules.iter_mut().filter(|r| r.matches(method, path)) {
            if rule.times == Some(0) {
                continue;
            }
            if let Some(t) = &mut rule.times {
                *t -= 1;
            }
            decision.latency += Duration::from_millis(rule.latency_ms);
            let hit = rule.rate >= 1.0 || rng.random::<f64>() < rule.rate;
            if hit {
                if decision.status.is_none() && rule.status.is_some() {
                    decision.headers = rule.headers.clone();
                }
                decision.status = decision.status.or(rule.status);
                decision.drop_response |= rule.drop_response;
                if let Some(ms) = rule.cut_after_ms {
                    let cut = Duration::from_millis(ms);
                    decision.cut_after = Some(decision.cut_after.map_or(cut, |c| c.min(cut)));
                }
            }
        }
        rules.retain(|r| r.times != Some(0));
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn globs() {
        assert!(glob(
            "/v1/memory_stores/*/memories/*",
            "/v1/memory_stores/ms_1/memories/mem_2"
        ));
        assert!(glob(
            "/v1/memory_stores/*/memories*",
            "/v1/memory_stores/ms_1/memories"
        ));
        assert!(glob("*", "/anything/at/all"));
        assert!(glob("/v1/sessions/*/events", "/v1/sessions/s/events"));
        assert!(!glob(
            "/v1/sessions/*/events",
            "/v1/sessions/s/events/stream"
        ));
        assert!(!glob("/v1/a", "/v1/ab"));
        assert!(!glob("/a*b*c", "/acb"));
    }

    #[test]
    fn flag_syntax() {
        let r = FaultRule::parse("post /v1/memory_stores/*:status=503,rate=0.5,times=2").unwrap();
        assert_eq!(r.method.as_deref(), Some("POST"));
        assert_eq!((r.status, r.rate, r.times), (Some(503), 0.5, Some(2)));
        let r = FaultRule::parse("*:latency_ms=5").unwrap();
        assert_eq!((r.method, r.latency_ms), (None, 5));
        let r = FaultRule::parse("POST /v1/x:drop=true").unwrap();
        assert!(r.drop_response);
        for bad in [
            "nocolon",
            "/x:status=200",
            "/x:rate=2",
            "/x:bogus=1",
            "relative:latency_ms=1",
            "A B C:x=1",
        ] {
            assert!(FaultRule::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_cut_rides_on_a_handled_request_and_the_earliest_applies() {
        let r =
            FaultRule::parse("GET /v1/sessions/*/events/stream:cut_after_ms=1500,times=1").unwrap();
        assert_eq!((r.cut_after_ms, r.times), (Some(1500), Some(1)));
        assert!(FaultRule::parse("/x:cut_after_ms=1,status=503").is_err());
        assert!(FaultRule::parse("/x:cut_after_ms=600001").is_err());
        let faults = Faults::new(vec![
            FaultRule::parse("GET /s:cut_after_ms=900").unwrap(),
            FaultRule::parse("*:cut_after_ms=300,times=1").unwrap(),
        ]);
        let first = faults.decide("GET", "/s");
        assert_eq!(
            (first.cut_after, first.status),
            (Some(Duration::from_millis(300)), None)
        );
        assert_eq!(
            faults.decide("GET", "/s").cut_after,
            Some(Duration::from_millis(900))
        );
        assert_eq!(faults.decide("GET", "/other").cut_after, None);
    }

    #[test]
    fn times_retires_a_rule_and_latency_adds_up() {
        let faults = Faults::new(vec![
            FaultRule::parse("GET /a:status=500,times=1").unwrap(),
            FaultRule::parse("*:latency_ms=3").unwrap(),
            FaultRule::parse("*:latency_ms=4").unwrap(),
        ]);
        let first = faults.decide("GET", "/a");
        assert_eq!(
            (first.status, first.latency),
            (Some(500), Duration::from_millis(7))
        );
        let second = faults.decide("GET", "/a");
        assert_eq!(second.status, None);
        assert_eq!(faults.rules().len(), 2);
        assert_eq!(faults.decide("POST", "/b").status, None);
    }

    #[test]
    fn headers_ride_on_the_injected_status_only() {
        let rule = |v: Value| serde_json::from_value::<FaultRule>(v).unwrap();
        let faults = Faults::new(vec![rule(json!({
            "method": "GET", "path": "/a", "status": 429, "times": 1,
            "headers": {"retry-after-ms": "1500"}
        }))]);
        let first = faults.decide("GET", "/a");
        assert_eq!(first.status, Some(429));
        assert_eq!(first.headers["retry-after-ms"], "1500");
        assert!(faults.decide("GET", "/a").headers.is_empty());
        assert!(
            rule(json!({"path": "/a", "latency_ms": 1, "headers": {"retry-after": "1"}}))
                .check()
                .is_err(),
            "headers without a status"
        );
        assert!(
            rule(json!({"path": "/a", "status": 500, "headers": {"bad name": "1"}}))
                .check()
                .is_err()
        );
    }
}
