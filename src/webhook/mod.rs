//! Standard Webhooks signing and verification, as the Managed Agents API
//! signs its webhooks.
//!
//! The signed content is `{webhook-id}.{webhook-timestamp}.{raw body}` — the
//! exact bytes received, never a re-serialisation. The signature is
//! HMAC-SHA256 under the key (the base64 after `whsec_`), base64-encoded and
//! prefixed `v1,`. `webhook-signature` may carry several space-separated
//! signatures (key rotation); any `v1` match passes. Timestamps more than five
//! minutes away from now, either way, are refused.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// How far a timestamp may be from now.
pub const TOLERANCE_SECONDS: i64 = 5 * 60;

/// A webhook signing key (`whsec_…`). Never printed.
#[derive(Clone)]
pub struct SigningKey(Vec<u8>);

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningKey([redacted])")
    }
}

/// Why a key or a delivery was refused. The messages name what is wrong and
/// never echo secrets or signatures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookError {
    #[error("the signing key must look like whsec_<base64>")]
    MalformedKey,
    #[error("the {0} header is missing")]
    MissingHeader(&'static str),
    #[error("the {0} header is malformed")]
    MalformedHeader(&'static str),
    #[error("the webhook timestamp is too old")]
    TooOld,
    #[error("the webhook timestamp is too far in the future")]
    TooNew,
    #[error("no signature matches")]
    NoMatch,
}

impl SigningKey {
    /// Parse `whsec_<base64>`.
    pub fn parse(key: &str) -> Result<SigningKey, WebhookError> {
        let encoded = key
            .trim()
            .strip_prefix("whsec_")
            .ok_or(WebhookError::MalformedKey)?;
        let bytes = STANDARD
            .decode(encoded)
            .map_err(|_| WebhookError::MalformedKey)?;
        if bytes.is_empty() {
            return Err(WebhookError::MalformedKey);
        }
        Ok(SigningKey(bytes))
    }

    /// A fresh random key, `whsec_` + 32 random bytes.
    pub fn generate() -> (SigningKey, String) {
        let mut bytes = [0u8; 32];
        rand::fill(&mut bytes[..]);
        let text = format!("whsec_{}", STANDARD.encode(bytes));
        (SigningKey(bytes.to_vec()), text)
    }

    fn mac(&self, id: &str, timestamp: &str, body: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }

    /// The `v1,<base64>` signature of one delivery.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let tag = self
            .mac(id, &timestamp.to_string(), body)
            .finalize()
            .into_bytes();
        format!("v1,{}", STANDARD.encode(tag))
    }

    /// Constant-time check of one base64 signature.
    fn matches(&self, id: &str, timestamp: &str, body: &[u8], signature: &[u8]) -> bool {
        self.mac(id, timestamp, body)
            .verify_slice(signature)
            .is_ok()
    }
}

/// The three headers of a delivery, as received.
#[derive(Debug, Clone, Copy)]
pub struct WebhookHeaders<'a> {
    pub id: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub signature: Option<&'a str>,
}

impl<'a> WebhookHeaders<'a> {
    pub fn from_http(headers: &'a http::HeaderMap) -> Self {
        // A present header that is not visible ASCII reads as empty: malformed, not missing.
        let get = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or_default());
        WebhookHeaders {
            id: get("webhook-id"),
            timestamp: get("webhook-timestamp"),
            signature: get("webhook-signature"),
        }
    }
}

/// Verify a delivery against any of `keys` (several during a rotation).
/// `now` is Unix seconds. Returns the `webhook-id` on success.
pub fn verify<'a>(
    keys: &[SigningKey],
    headers: WebhookHeaders<'a>,
    body: &[u8],
    now: i64,
) -> Result<&'a str, WebhookError> {
    let id = headers
        .id
        .ok_or(WebhookError::MissingHeader("webhook-id"))?;
    if id.is_empty() {
        return Err(WebhookError::MalformedHeader("webhook-id"));
    }
    let timestamp = headers
        .timestamp
        .ok_or(WebhookError::MissingHeader("webhook-timestamp"))?;
    let signatures = headers
        .signature
        .ok_or(WebhookError::MissingHeader("webhook-signature"))?;
    let ts: i64 = timestamp
        .parse()
        .map_err(|_| WebhookError::MalformedHeader("webhook-timestamp"))?;
    if ts < now - TOLERANCE_SECONDS {
        return Err(WebhookError::TooOld);
    }
    if ts > now + TOLERANCE_SECONDS {
        return Err(WebhookError::TooNew);
    }
    let mut any_v1 = false;
    for entry in signatures.split_whitespace() {
        let Some(encoded) = entry.strip_prefix("v1,") else {
            continue;
        };
        any_v1 = true;
        let Ok(signature) = STANDARD.decode(encoded) else {
            continue;
        };
        if keys
            .iter()
            .any(|key| key.matches(id, timestamp, body, &signature))
        {
            return Ok(id);
        }
    }
    if any_v1 {
        Err(WebhookError::NoMatch)
    } else {
        Err(WebhookError::MalformedHeader("webhook-signature"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test vector of the Standard Webhooks reference libraries.
    const KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TS: i64 = 1_614_265_330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn headers<'a>(id: &'a str, ts: &'a str, sig: &'a str) -> WebhookHeaders<'a> {
        WebhookHeaders {
            id: Some(id),
            timestamp: Some(ts),
            signature: Some(sig),
        }
    }

    #[test]
    fn signs_the_reference_vector() {
        let key = SigningKey::parse(KEY).unwrap();
        assert_eq!(key.sign(ID, TS, BODY), SIGNATURE);
    }

    #[test]
    fn verifies_the_reference_vector_and_refuses_tampering() {
        let key = SigningKey::parse(KEY).unwrap();
        let ts = TS.to_string();
        assert_eq!(
            verify(
                std::slice::from_ref(&key),
                headers(ID, &ts, SIGNATURE),
                BODY,
                TS
            ),
            Ok(ID)
        );
        // A re-serialised body, another id, another timestamp: no match.
        assert_eq!(
            verify(
                std::slice::from_ref(&key),
                headers(ID, &ts, SIGNATURE),
                br#"{"test":2432232314}"#,
                TS
            ),
            Err(WebhookError::NoMatch)
        );
        assert_eq!(
            verify(
                std::slice::from_ref(&key),
                headers("msg_other", &ts, SIGNATURE),
                BODY,
                TS
            ),
            Err(WebhookError::NoMatch)
        );
        let (other, _) = SigningKey::generate();
        assert_eq!(
            verify(
                std::slice::from_ref(&other),
                headers(ID, &ts, SIGNATURE),
                BODY,
                TS
            ),
            Err(WebhookError::NoMatch)
        );
        // Rotation: any of several keys, any of several signatures.
        let both = format!("v1,bm90IGl0 v2,whatever {SIGNATURE}");
        assert_eq!(
            verify(&[other, key], headers(ID, &ts, &both), BODY, TS),
            Ok(ID)
        );
    }

    #[test]
    fn timestamps_outside_five_minutes_are_refused() {
        let key = SigningKey::parse(KEY).unwrap();
        let ts = TS.to_string();
        let h = headers(ID, &ts, SIGNATURE);
        assert!(verify(std::slice::from_ref(&key), h, BODY, TS + TOLERANCE_SECONDS).is_ok());
        assert!(verify(std::slice::from_ref(&key), h, BODY, TS - TOLERANCE_SECONDS).is_ok());
        assert_eq!(
            verify(
                std::slice::from_ref(&key),
                h,
                BODY,
                TS + TOLERANCE_SECONDS + 1
            ),
            Err(WebhookError::TooOld)
        );
        assert_eq!(
            verify(&[key], h, BODY, TS - TOLERANCE_SECONDS - 1),
            Err(WebhookError::TooNew)
        );
    }

    #[test]
    fn missing_and_malformed_headers_are_refused() {
        let key = SigningKey::parse(KEY).unwrap();
        let ts = TS.to_string();
        let mut h = headers(ID, &ts, SIGNATURE);
        h.id = None;
        assert_eq!(
            verify(std::slice::from_ref(&key), h, BODY, TS),
            Err(WebhookError::MissingHeader("webhook-id"))
        );
        let mut h = headers(ID, &ts, SIGNATURE);
        h.timestamp = None;
        assert_eq!(
            verify(std::slice::from_ref(&key), h, BODY, TS),
            Err(WebhookError::MissingHeader("webhook-timestamp"))
        );
        let mut h = headers(ID, &ts, SIGNATURE);
        h.signature = None;
        assert_eq!(
            verify(std::slice::from_ref(&key), h, BODY, TS),
            Err(WebhookError::MissingHeader("webhook-signature"))
        );
        assert_eq!(
            verify(
                std::slice::from_ref(&key),
                headers(ID, "soon", SIGNATURE),
                BODY,
                TS
            ),
            Err(WebhookError::MalformedHeader("webhook-timestamp"))
        );
        assert_eq!(
            verify(
                std::slice::from_ref(&key),
                headers(ID, &ts, "v2,abc"),
                BODY,
                TS
            ),
            Err(WebhookError::MalformedHeader("webhook-signature"))
        );
        // A header that is present but not visible ASCII is malformed, not missing.
        let mut map = http::HeaderMap::new();
        map.insert(
            "webhook-id",
            http::HeaderValue::from_bytes(b"msg_\xff").unwrap(),
        );
        map.insert("webhook-timestamp", ts.parse().unwrap());
        map.insert("webhook-signature", SIGNATURE.parse().unwrap());
        assert_eq!(
            verify(&[key], WebhookHeaders::from_http(&map), BODY, TS),
            Err(WebhookError::MalformedHeader("webhook-id"))
        );
    }

    #[test]
    fn keys_must_be_whsec_base64() {
        assert!(SigningKey::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_err());
        assert!(SigningKey::parse("whsec_***").is_err());
        assert!(SigningKey::parse("whsec_").is_err());
        let (_, text) = SigningKey::generate();
        assert!(SigningKey::parse(&text).is_ok());
        assert!(!format!("{:?}", SigningKey::parse(KEY).unwrap()).contains("MfKQ"));
    }
}
