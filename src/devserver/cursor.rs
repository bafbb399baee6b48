//! Opaque page cursors: `page_<base64url(JSON)>`.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::error::{HttpError, HttpResult};

/// The position in a newest-first listing: the key of the last item returned.
#[derive(Debug, Serialize, Deserialize)]
pub struct Before {
    pub before: i64,
}

pub fn encode<T: Serialize>(position: &T) -> String {
    let json = serde_json::to_vec(position).unwrap_or_default();
    format!("page_{}", URL_SAFE_NO_PAD.encode(json))
}

/// Decode the `page` query parameter; anything this server did not issue is a 400.
pub fn decode<T: DeserializeOwned>(page: Option<&str>) -> HttpResult<Option<T>> {
    let Some(page) = page.filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let invalid = || HttpError::invalid_request("page: not a valid page cursor");
    let encoded = page.strip_prefix("page_").ok_or_else(invalid)?;
    let json = URL_SAFE_NO_PAD.decode(encoded).map_err(|_| invalid())?;
    serde_json::from_slice(&json)
        .map(Some)
        .map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let c = encode(&("after", "/a/b.md"));
        assert!(c.starts_with("page_"));
        let back: Option<(String, String)> = decode(Some(&c)).unwrap();
        assert_eq!(back.unwrap().1, "/a/b.md");
        assert!(decode::<i64>(None).unwrap().is_none());
        assert!(decode::<i64>(Some("")).unwrap().is_none());
        assert!(decode::<i64>(Some("page_!!")).is_err());
        assert!(decode::<i64>(Some("nope")).is_err());
    }
}
