//! What every API request goes through: the version and beta headers, the
//! credential, query parsing and JSON bodies — each refusal in the API's
//! envelope.

use axum::body::Body;
use axum::extract::{FromRequest, Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use serde::de::DeserializeOwned;

use crate::api::types::{MemoryOperation, Timestamp, View};
use crate::api::{ANTHROPIC_VERSION, ApiFamily, BETA_AGENT_MEMORY, BETA_MANAGED_AGENTS};

use super::auth::{Principal, authenticate};
use super::error::{HttpError, HttpResult};
use super::state::AppState;

/// Largest request body accepted; larger bodies get 413 `request_too_large`.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Check the credential, `anthropic-version` and the beta header of one API
/// family, then hand the [`Principal`] to the handler.
pub async fn check_request(
    State((state, family)): State<(AppState, ApiFamily)>,
    mut request: Request,
    next: Next,
) -> Result<Response, HttpError> {
    let principal = authenticate(&state, request.headers()).await?;
    check_version(request.headers())?;
    check_beta(request.headers(), family)?;
    request.extensions_mut().insert(principal);
    Ok(next.run(request).await)
}

/// The `/dev/*` endpoints: the admin key only, no version or beta header.
pub async fn check_admin(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, HttpError> {
    match authenticate(&state, request.headers()).await? {
        Principal::Admin { .. } => Ok(next.run(request).await),
        _ => Err(HttpError::permission(
            "the /dev endpoints need the devserver's admin key",
        )),
    }
}

/// `anthropic-version` must be present and a `YYYY-MM-DD` version date
/// (`2023-06-01` in the API reference, `2026-10-21` from the 2.x SDKs).
fn check_version(headers: &HeaderMap) -> HttpResult<()> {
    let Some(value) = headers.get("anthropic-version") else {
        return Err(HttpError::invalid_request(
            "anthropic-version: header is required",
        ));
    };
    let is_date = value
        .to_str()
        .ok()
        .and_then(|v| chrono::NaiveDate::parse_from_str(v, "%Y-%m-%d").ok())
        .is_some_and(|d| d >= chrono::NaiveDate::from_ymd_opt(2023, 1, 1).unwrap_or_default());
    if is_date {
        Ok(())
    } else {
        Err(HttpError::invalid_request(format!(
            "anthropic-version: not a known API version; use {ANTHROPIC_VERSION}"
        )))
    }
}

/// The betas named by every `anthropic-beta` header (comma-separated).
fn betas(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|b| b.trim().to_string())
        .filter(|b| !b.is_empty())
        .collect()
}

fn check_beta(headers: &HeaderMap, family: ApiFamily) -> HttpResult<()> {
    let betas = betas(headers);
    let has = |b: &str| betas.iter().any(|x| x == b);
    match family {
        ApiFamily::Memory => match (has(BETA_AGENT_MEMORY), has(BETA_MANAGED_AGENTS)) {
            (true, true) => Err(HttpError::invalid_request(format!(
                "anthropic-beta: send either {BETA_AGENT_MEMORY} or {BETA_MANAGED_AGENTS} to the memory store endpoints, not both"
            ))),
            (false, false) => Err(HttpError::invalid_request(format!(
                "anthropic-beta: the memory store endpoints require the {BETA_AGENT_MEMORY} beta"
            ))),
            _ => Ok(()),
        },
        ApiFamily::ManagedAgents => {
            if has(BETA_MANAGED_AGENTS) {
                Ok(())
            } else {
                Err(HttpError::invalid_request(format!(
                    "anthropic-beta: this endpoint requires the {BETA_MANAGED_AGENTS} beta"
                )))
            }
        }
        // The official SDK (2.10) reads skills with no beta header, and the
        // workers' spec sends `skills-2025-10-02`: both are served.
        ApiFamily::Skills => Ok(()),
    }
}

/// Query parameters, decoded once; typed getters answer with the API's 400.
pub struct QueryParams(Vec<(String, String)>);

impl QueryParams {
    pub fn parse(raw: Option<&str>) -> Self {
        let pairs = url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        QueryParams(pairs)
    }

    /// The last value given for `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn string(&self, name: &str) -> Option<String> {
        self.get(name).map(str::to_string)
    }

    pub fn integer(&self, name: &str, min: i64, max: i64) -> HttpResult<Option<i64>> {
        let Some(raw) = self.get(name) else {
            return Ok(None);
        };
        match raw.parse::<i64>() {
            Ok(v) if (min..=max).contains(&v) => Ok(Some(v)),
            _ => Err(HttpError::invalid_request(format!(
                "{name}: must be an integer from {min} to {max}"
            ))),
        }
    }

    /// Every value given for `name` (`types[]=a&types[]=b`).
    pub fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// `limit`, 1–100, default 20 (the memory store lists).
    pub fn limit(&self) -> HttpResult<usize> {
        self.limit_up_to(100)
    }

    /// `limit`, 1–`max`, default 20 (the Managed Agents and skills lists
    /// take up to 1000).
    pub fn limit_up_to(&self, max: i64) -> HttpResult<usize> {
        Ok(self.integer("limit", 1, max)?.unwrap_or(20) as usize)
    }

    pub fn boolean(&self, name: &str) -> HttpResult<Option<bool>> {
        match self.get(name) {
            None => Ok(None),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(_) => Err(HttpError::invalid_request(format!(
                "{name}: must be true or false"
            ))),
        }
    }

    pub fn timestamp(&self, name: &str) -> HttpResult<Option<Timestamp>> {
        let Some(raw) = self.get(name) else {
            return Ok(None);
        };
        // RFC 3339; a timestamp without an offset (a naive Python datetime) is UTC.
        chrono::DateTime::parse_from_rfc3339(raw)
            .map(|t| t.with_timezone(&chrono::Utc))
            .or_else(|_| {
                chrono::NaiveDateTime::parse_from_str(raw, "%Y-%m-%dT%H:%M:%S%.f")
                    .map(|t| t.and_utc())
            })
            .map(Some)
            .map_err(|_| {
                HttpError::invalid_request(format!("{name}: must be an RFC 3339 timestamp"))
            })
    }

    pub fn view(&self, default: View) -> HttpResult<View> {
        match self.get("view") {
            None => Ok(default),
            Some(raw) => View::parse(raw)
                .ok_or_else(|| HttpError::invalid_request("view: must be basic or full")),
        }
    }

    pub fn operation(&self) -> HttpResult<Option<MemoryOperation>> {
        match self.get("operation") {
            None => Ok(None),
            Some(raw) => MemoryOperation::parse(raw).map(Some).ok_or_else(|| {
                HttpError::invalid_request("operation: must be created, modified or deleted")
            }),
        }
    }
}

/// A JSON request body, read with a size bound, decoded with the API's errors.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = HttpError;

    async fn from_request(request: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let bytes = read_body(request.into_body()).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(HttpError::invalid_request("request body is required"));
        }
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| HttpError::invalid_request(format!("invalid request body: {e}")))
    }
}

/// A JSON body that may be absent (`POST .../stop` with no body).
pub struct OptionalJsonBody<T>(pub Option<T>);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OptionalJsonBody<T> {
    type Rejection = HttpError;

    async fn from_request(request: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let bytes = read_body(request.into_body()).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJsonBody(None));
        }
        serde_json::from_slice(&bytes)
            .map(|v| OptionalJsonBody(Some(v)))
            .map_err(|e| HttpError::invalid_request(format!("invalid request body: {e}")))
    }
}

async fn read_body(body: Body) -> HttpResult<bytes::Bytes> {
    axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|_| {
            HttpError::too_large(format!(
                "request body is larger than {MAX_BODY_BYTES} bytes"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn memory_endpoints_take_exactly_one_of_the_two_betas() {
        let ok = [
            headers(&[("anthropic-beta", BETA_AGENT_MEMORY)]),
            headers(&[("anthropic-beta", BETA_MANAGED_AGENTS)]),
            headers(&[(
                "anthropic-beta",
                "files-api-2025-04-14, agent-memory-2026-07-22",
            )]),
        ];
        for h in &ok {
            assert!(check_beta(h, ApiFamily::Memory).is_ok(), "{h:?}");
        }
        let bad = [
            headers(&[]),
            headers(&[("anthropic-beta", "files-api-2025-04-14")]),
            headers(&[(
                "anthropic-beta",
                "managed-agents-2026-04-01,agent-memory-2026-07-22",
            )]),
            headers(&[
                ("anthropic-beta", BETA_AGENT_MEMORY),
                ("anthropic-beta", BETA_MANAGED_AGENTS),
            ]),
        ];
        for h in &bad {
            assert!(check_beta(h, ApiFamily::Memory).is_err(), "{h:?}");
        }
    }

    #[test]
    fn skills_endpoints_take_the_skills_beta() {
        assert!(
            check_beta(
                &headers(&[("anthropic-beta", "skills-2025-10-02")]),
                ApiFamily::Skills
            )
            .is_ok()
        );
        assert!(
            check_beta(
                &headers(&[("anthropic-beta", "files-api-2025-04-14,skills-2025-10-02")]),
                ApiFamily::Skills
            )
            .is_ok()
        );
        // The official SDK sends none.
        assert!(check_beta(&headers(&[]), ApiFamily::Skills).is_ok());
    }

    #[test]
    fn query_getters() {
        let q = QueryParams::parse(Some(
            "limit=5&limit=7&include_archived=true&created_at%5Bgte%5D=2026-01-01T00%3A00%3A00Z&view=full",
        ));
        assert_eq!(q.limit().unwrap(), 7, "the last value wins");
        assert_eq!(q.boolean("include_archived").unwrap(), Some(true));
        assert!(q.timestamp("created_at[gte]").unwrap().is_some());
        let naive = QueryParams::parse(Some("t=2026-01-01T00%3A00%3A00.5"));
        assert_eq!(
            naive.timestamp("t").unwrap().unwrap().to_rfc3339(),
            "2026-01-01T00:00:00.500+00:00"
        );
        assert_eq!(q.view(View::Basic).unwrap(), View::Full);
        assert!(QueryParams::parse(Some("limit=0")).limit().is_err());
        assert!(QueryParams::parse(Some("limit=101")).limit().is_err());
        assert!(QueryParams::parse(Some("limit=x")).limit().is_err());
        assert!(
            QueryParams::parse(Some("view=partial"))
                .view(View::Basic)
                .is_err()
        );
        assert!(
            QueryParams::parse(Some("include_archived=yes"))
                .boolean("include_archived")
                .is_err()
        );
    }
}
