//! Identifiers, clock and hashing helpers of the devserver.

use rand::RngExt;
use sha2::{Digest, Sha256};

use crate::api::types::Timestamp;

const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// `<prefix>_01<22 random base62 characters>`, the shape of the API's ids.
pub fn new_id(prefix: &str) -> String {
    let mut rng = rand::rng();
    let mut id = String::with_capacity(prefix.len() + 25);
    id.push_str(prefix);
    id.push_str("_01");
    for _ in 0..22 {
        id.push(BASE62[rng.random_range(0..BASE62.len())] as char);
    }
    id
}

/// A random secret of `bytes` bytes, URL-safe base64 without padding.
pub fn new_secret(prefix: &str, bytes: usize) -> String {
    use base64::Engine;
    let mut buf = vec![0u8; bytes];
    rand::rng().fill(&mut buf[..]);
    format!(
        "{prefix}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buf)
    )
}

/// Lowercase hex SHA-256 of the exact bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Microseconds since the Unix epoch: how timestamps are stored, so they sort
/// and compare as integers.
pub fn now_micros() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

pub fn from_micros(micros: i64) -> Timestamp {
    chrono::DateTime::from_timestamp_micros(micros).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_the_api_shape_and_do_not_repeat() {
        let a = new_id("memstore");
        let b = new_id("memstore");
        assert!(
            a.starts_with("memstore_01") && a.len() == "memstore_01".len() + 22,
            "{a}"
        );
        assert_ne!(a, b);
    }

    #[test]
    fn sha_of_empty_content() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
