//! Errors of the API client and how every retry loop classifies them.
//!
//! The rule all the official workers share: a 4xx other than 408 and 429 is
//! permanent (retrying will not fix it); everything else — 408, 429, 5xx,
//! timeouts, connection failures — is transient.

use serde_json::Value;

use super::types::ErrorEnvelope;

/// An error status returned by the API, decoded from its envelope.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status} {kind}: {message}")]
pub struct ApiError {
    pub status: u16,
    /// `error.type`, e.g. `not_found_error`.
    pub kind: String,
    pub message: String,
    pub request_id: Option<String>,
    /// `error.details`, e.g. the lease state of a 412 heartbeat.
    pub details: Option<Value>,
    /// How long the answer asked the client to wait before trying again
    /// (`retry-after-ms`, else `retry-after`), e.g. on a `429`, in
    /// milliseconds (kept small: every `Result` of the client carries it).
    pub retry_after_ms: Option<std::num::NonZeroU32>,
}

impl ApiError {
    /// Decode an error response. A body that is not the envelope still yields
    /// an error carrying the status and (a bounded prefix of) the body text.
    pub(crate) fn from_parts(status: u16, request_id: Option<String>, body: &[u8]) -> Self {
        match serde_json::from_slice::<ErrorEnvelope>(body) {
            Ok(envelope) => ApiError {
                status,
                kind: envelope.error.kind,
                message: envelope.error.message,
                request_id: envelope.request_id.or(request_id),
                details: envelope.error.details,
                retry_after_ms: None,
            },
            Err(_) => {
                let text = String::from_utf8_lossy(body);
                let message: String = text.chars().take(500).collect();
                ApiError {
                    status,
                    kind: "unknown_error".into(),
                    message: if message.is_empty() {
                        format!("HTTP {status}")
                    } else {
                        message
                    },
                    request_id,
                    details: None,
                    retry_after_ms: None,
                }
            }
        }
    }

    pub(crate) fn is_permanent(&self) -> bool {
        is_permanent_status(self.status)
    }

    /// The wait the answer asked for, if any ([`Self::retry_after_ms`]).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        self.retry_after_ms
            .map(|ms| std::time::Duration::from_millis(u64::from(ms.get())))
    }
}

/// `true` for a 4xx other than 408 and 429.
pub fn is_permanent_status(status: u16) -> bool {
    (400..500).contains(&status) && status != 408 && status != 429
}

/// `error: cause: cause…`, each distinct message once (hyper repeats its
/// kind in the next cause's text at times).
pub fn cause_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        source = cause.source();
    }
    text
}

/// Everything a client call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API answered with an error status.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The request never got a complete answer: connect, timeout, reset,
    /// a refused certificate. The message carries the whole cause chain
    /// (reqwest's own says only "error sending request"; the operator needs
    /// "invalid peer certificate: UnknownIssuer" or "connection refused"),
    /// so the error is not also a `source`: `{:#}` would print it twice.
    #[error("request failed: {}", cause_chain(.0))]
    Transport(reqwest::Error),
    /// The API answered 2xx with a body this client cannot decode.
    #[error("unexpected response body: {0}")]
    Decode(String),
    /// The client was configured or called with something unusable.
    #[error("{0}")]
    Config(String),
}

impl Error {
    /// The HTTP status, when the API answered with one.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api(e) => Some(e.status),
            _ => None,
        }
    }

    /// A permanent error will fail the same way on retry.
    pub fn is_permanent(&self) -> bool {
        match self {
            Error::Api(e) => e.is_permanent(),
            Error::Transport(_) => false,
            Error::Decode(_) | Error::Config(_) => true,
        }
    }

    pub fn is_transient(&self) -> bool {
        !self.is_permanent()
    }

    /// Which kind of failure this is, for readiness and the poll-error metric.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Api(e) if e.status == 401 || e.status == 403 => ErrorClass::Auth,
            Error::Api(e) if e.status >= 500 => ErrorClass::Server,
            Error::Transport(_) => ErrorClass::Unreachable,
            _ => ErrorClass::Other,
        }
    }

    /// The API error, if this is one.
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            Error::Api(e) => Some(e),
            _ => None,
        }
    }
}

/// The kind of a failed request, as an operator acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// 401 or 403: the credential was refused.
    Auth,
    /// No answer: a connection refused or reset, a timeout, a DNS failure.
    Unreachable,
    /// A 5xx: the API answered that it cannot serve now.
    Server,
    /// Anything else (another 4xx, a body that cannot be decoded).
    Other,
}

impl ErrorClass {
    /// The class's label (`auth`, `unreachable`, `server`, `other`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Auth => "auth",
            ErrorClass::Unreachable => "unreachable",
            ErrorClass::Server => "server",
            ErrorClass::Other => "other",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_classes() {
        for permanent in [400, 401, 403, 404, 409, 412, 413, 422] {
            assert!(is_permanent_status(permanent), "{permanent}");
        }
        for transient in [408, 429, 500, 502, 503, 504, 529] {
            assert!(!is_permanent_status(transient), "{transient}");
        }
    }

    #[test]
    fn classes_follow_the_status() {
        let api = |status| Error::Api(ApiError::from_parts(status, None, b""));
        for (status, class) in [
            (401, ErrorClass::Auth),
            (403, ErrorClass::Auth),
            (500, ErrorClass::Server),
            (503, ErrorClass::Server),
            (404, ErrorClass::Other),
            (429, ErrorClass::Other),
        ] {
            assert_eq!(api(status).class(), class, "{status}");
        }
        assert_eq!(Error::Decode("x".into()).class(), ErrorClass::Other);
    }

    #[test]
    fn envelope_is_decoded_and_a_bare_body_is_kept() {
        let e = ApiError::from_parts(
            412,
            Some("req_h".into()),
            br#"{"type":"error","error":{"type":"precondition_failed_error","message":"stale",
                 "details":{"current_state":{"state":"active"}}},"request_id":"req_b"}"#,
        );
        assert_eq!(e.kind, "precondition_failed_error");
        assert_eq!(e.request_id.as_deref(), Some("req_b"));
        assert_eq!(e.details.unwrap()["current_state"]["state"], "active");

        let e = ApiError::from_parts(502, None, b"bad gateway");
        assert_eq!((e.status, e.message.as_str()), (502, "bad gateway"));
        assert!(!e.is_permanent());
    }
}
