//! How a request is retried after a transient failure, after the official
//! SDK's client (`anthropic` 2.10.0, `_base_client.py`): two retries by
//! default, 0.5 s doubling to an 8 s cap with up to 25 % jitter off, unless
//! the server says how long to wait (`retry-after-ms`, then `retry-after`
//! in seconds or as an HTTP date) — which this client honours up to a cap,
//! so that no answer can park a caller for minutes.
//!
//! What is retried: 408, 409 (a lock timeout), 429, every 5xx and every
//! failure to get a whole answer (connect, timeout, reset, a body cut
//! short); `x-should-retry: true|false` overrides the status. One exception
//! to the SDK: a 409 whose `error.type` is one of the memory API's own
//! (`memory_precondition_failed_error`, `memory_path_conflict_error`) is an
//! answer about the data, the same on every retry, and comes back at once.

use std::time::Duration;

use rand::RngExt;
use reqwest::header::HeaderMap;

/// The retry rules of one kind of request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub(crate) max_retries: u32,
    /// The wait before the first retry; it doubles for each later one.
    pub(crate) initial_delay: Duration,
    /// The computed wait never grows past this.
    pub(crate) max_delay: Duration,
    /// The longest wait a server's `retry-after` can ask for; a longer ask
    /// waits this long.
    pub(crate) max_retry_after: Duration,
}

/// The official SDK's `DEFAULT_MAX_RETRIES`.
pub(crate) const DEFAULT_MAX_RETRIES: u32 = 2;
/// The official SDK's `INITIAL_RETRY_DELAY`.
pub(crate) const INITIAL_RETRY_DELAY: Duration = Duration::from_millis(500);
/// The official SDK's `MAX_RETRY_DELAY`.
pub(crate) const MAX_RETRY_DELAY: Duration = Duration::from_secs(8);
/// The cap on a server-requested wait: the teardown's own bound, so one
/// `retry-after` can never by itself outlast a final sync or a flush.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: DEFAULT_MAX_RETRIES,
            initial_delay: INITIAL_RETRY_DELAY,
            max_delay: MAX_RETRY_DELAY,
            max_retry_after: MAX_RETRY_AFTER,
        }
    }
}

impl RetryPolicy {
    /// Each request is sent once.
    pub const fn none() -> Self {
        RetryPolicy {
            max_retries: 0,
            initial_delay: Duration::ZERO,
            max_delay: Duration::ZERO,
            max_retry_after: Duration::ZERO,
        }
    }

    /// The wait before retry number `retry` (0 for the first): what the
    /// server asked for when it asked (capped), else the jittered backoff.
    pub(crate) fn delay(&self, retry: u32, asked: Option<Duration>) -> Duration {
        if let Some(asked) = asked.filter(|d| !d.is_zero()) {
            return asked.min(self.max_retry_after);
        }
        let base = self
            .initial_delay
            .saturating_mul(1u32 << retry.min(20))
            .min(self.max_delay);
        base.mul_f64(1.0 - 0.25 * rand::rng().random::<f64>())
    }
}

/// What a failed answer says about retrying it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RetryHints {
    /// `x-should-retry`, when the server said `true` or `false`.
    pub(crate) should_retry: Option<bool>,
    /// `retry-after-ms` or `retry-after`.
    pub(crate) retry_after: Option<Duration>,
}

impl RetryHints {
    pub(crate) fn from_headers(headers: &HeaderMap) -> RetryHints {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        RetryHints {
            should_retry: match text("x-should-retry") {
                Some("true") => Some(true),
                Some("false") => Some(false),
                _ => None,
            },
            retry_after: retry_after(text("retry-after-ms"), text("retry-after")),
        }
    }
}

/// The wait a server asked for: `retry-after-ms` (milliseconds, the SDKs'
/// own header), else `retry-after` as seconds (a fraction allowed) or as an
/// HTTP date. A date in the past, a negative or unreadable value asks for
/// nothing.
fn retry_after(ms: Option<&str>, value: Option<&str>) -> Option<Duration> {
    let secs = |s: f64| (s.is_finite() && s > 0.0).then(|| Duration::from_secs_f64(s.min(1e9)));
    if let Some(ms) = ms.and_then(|v| v.trim().parse::<f64>().ok()) {
        return secs(ms / 1000.0);
    }
    let value = value?.trim();
    if let Ok(s) = value.parse::<f64>() {
        return secs(s);
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let left = at.signed_duration_since(chrono::Utc::now());
    left.to_std().ok().filter(|d| !d.is_zero())
}

/// Whether an error answer is worth another attempt.
pub(crate) fn is_retryable_status(status: u16, kind: &str, hints: &RetryHints) -> bool {
    if let Some(verdict) = hints.should_retry {
        return verdict;
    }
    match status {
        408 | 429 => true,
        409 => !kind.starts_with("memory_"),
        s => s >= 500,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_half_a_second_to_eight_with_jitter_off() {
        let p = RetryPolicy::default();
        for (retry, base_ms) in [
            (0, 500),
            (1, 1000),
            (2, 2000),
            (4, 8000),
            (9, 8000),
            (400, 8000),
        ] {
            for _ in 0..50 {
                let d = p.delay(retry, None).as_secs_f64() * 1000.0;
                let base = base_ms as f64;
                assert!(d <= base && d >= base * 0.75 - 1e-6, "{retry}: {d}");
            }
        }
    }

    #[test]
    fn a_servers_wait_is_honoured_up_to_the_cap() {
        let p = RetryPolicy::default();
        assert_eq!(
            p.delay(0, Some(Duration::from_millis(1500))),
            Duration::from_millis(1500)
        );
        assert_eq!(p.delay(1, Some(Duration::from_secs(3600))), MAX_RETRY_AFTER);
        assert!(p.delay(0, Some(Duration::ZERO)) <= INITIAL_RETRY_DELAY);
    }

    #[test]
    fn retry_after_headers() {
        let ms = |v| retry_after(Some(v), Some("9"));
        assert_eq!(ms("1500"), Some(Duration::from_millis(1500)));
        assert_eq!(ms("12.5"), Some(Duration::from_micros(12_500)));
        // An unreadable `retry-after-ms` falls back to `retry-after`.
        assert_eq!(ms("soon"), Some(Duration::from_secs(9)));
        assert_eq!(retry_after(None, Some("2")), Some(Duration::from_secs(2)));
        assert_eq!(
            retry_after(None, Some("0.25")),
            Some(Duration::from_millis(250))
        );
        for nothing in ["-3", "0", "NaN", "inf", "later", ""] {
            assert_eq!(retry_after(None, Some(nothing)), None, "{nothing}");
        }
        assert_eq!(retry_after(Some("-1"), None), None);
        assert_eq!(retry_after(None, None), None);
        let soon = (chrono::Utc::now() + chrono::Duration::seconds(20)).to_rfc2822();
        let d = retry_after(None, Some(&soon.replace("+0000", "GMT"))).unwrap();
        assert!(
            d > Duration::from_secs(17) && d <= Duration::from_secs(20),
            "{d:?}"
        );
        assert_eq!(
            retry_after(None, Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            None,
            "a date in the past"
        );
    }

    #[test]
    fn what_is_retried() {
        let none = RetryHints::default();
        for yes in [408, 429, 500, 502, 503, 504, 529] {
            assert!(is_retryable_status(yes, "api_error", &none), "{yes}");
        }
        assert!(is_retryable_status(409, "conflict_error", &none));
        for no in [400, 401, 403, 404, 413, 422] {
            assert!(
                !is_retryable_status(no, "invalid_request_error", &none),
                "{no}"
            );
        }
        assert!(!is_retryable_status(
            409,
            "memory_precondition_failed_error",
            &none
        ));
        assert!(!is_retryable_status(
            409,
            "memory_path_conflict_error",
            &none
        ));
        let never = RetryHints {
            should_retry: Some(false),
            retry_after: None,
        };
        assert!(!is_retryable_status(503, "api_error", &never));
        let always = RetryHints {
            should_retry: Some(true),
            retry_after: None,
        };
        assert!(is_retryable_status(400, "invalid_request_error", &always));
    }

    #[test]
    fn hints_are_read_from_the_headers() {
        let mut h = HeaderMap::new();
        h.insert("x-should-retry", "false".parse().unwrap());
        h.insert("retry-after", "3".parse().unwrap());
        assert_eq!(
            RetryHints::from_headers(&h),
            RetryHints {
                should_retry: Some(false),
                retry_after: Some(Duration::from_secs(3))
            }
        );
        h.insert("x-should-retry", "maybe".parse().unwrap());
        assert_eq!(RetryHints::from_headers(&h).should_retry, None);
    }
}
