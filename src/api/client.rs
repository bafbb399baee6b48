//! The HTTP client: base URL, credential, the version and beta headers, and
//! response decoding.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, RequestBuilder, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use tracing::warn;

use super::error::{ApiError, Error};
use super::retry::{RetryHints, RetryPolicy, is_retryable_status};
use super::types::Page;

pub const ANTHROPIC_VERSION: &str = "2023-06-01";
pub const BETA_MANAGED_AGENTS: &str = "managed-agents-2026-04-01";
pub const BETA_AGENT_MEMORY: &str = "agent-memory-2026-07-22";
pub const BETA_SKILLS: &str = "skills-2025-10-02";
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";

/// Which API family a path belongs to; it decides the one `anthropic-beta`
/// value sent. Memory endpoints refuse the two betas together, so a request
/// carries exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiFamily {
    /// `/v1/environments`, `/v1/sessions`, `/v1/agents`.
    ManagedAgents,
    /// `/v1/memory_stores/**`.
    Memory,
    /// `/v1/skills/**`.
    Skills,
}

impl ApiFamily {
    pub(crate) fn beta(self) -> &'static str {
        match self {
            ApiFamily::ManagedAgents => BETA_MANAGED_AGENTS,
            ApiFamily::Memory => BETA_AGENT_MEMORY,
            ApiFamily::Skills => BETA_SKILLS,
        }
    }
}

/// How requests authenticate.
#[derive(Clone)]
pub enum Credential {
    /// An organisation API key, sent as `x-api-key`.
    ApiKey(SecretString),
    /// A worker credential (environment key or sessions token), sent as
    /// `Authorization: Bearer`, never together with `x-api-key`.
    Bearer(SecretString),
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::ApiKey(_) => f.write_str("ApiKey([redacted])"),
            Credential::Bearer(_) => f.write_str("Bearer([redacted])"),
        }
    }
}

impl Credential {
    pub fn api_key(key: impl Into<String>) -> Self {
        Credential::ApiKey(SecretString::from(key.into()))
    }

    pub fn bearer(token: impl Into<String>) -> Self {
        Credential::Bearer(SecretString::from(token.into()))
    }
}

/// Told of the outcome of each request a client sends through
/// [`Client::with_observer`]: `Ok` for a 2xx, else the error. It runs inline
/// and must be quick.
pub trait RequestObserver: Send + Sync + std::fmt::Debug {
    fn observe(&self, outcome: Result<(), &Error>);
}

/// A client for the Managed Agents API. Cheap to clone; clones share one
/// connection pool, so per-item sub-clients (another credential, another
/// helper tag) cost nothing.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    http: reqwest::Client,
    base_url: String,
    /// `base_url` parsed once: each request's URL is this with its path
    /// set, so no request parses a whole URL (its host included) again.
    base: url::Url,
    credential: Credential,
    extra_headers: HeaderMap,
    helper: Option<&'static str>,
    /// Each family's request headers ([`request_headers`]), made once: a
    /// request clones its family's map instead of building it (the names
    /// parsed, the credential formatted, on every tool result).
    headers: [HeaderMap; 3],
    request_timeout: Duration,
    memory_retry: RetryPolicy,
    /// Told of every outcome of [`Client::execute`] (not of memory requests).
    observer: Option<Arc<dyn RequestObserver>>,
}

const FAMILIES: [ApiFamily; 3] = [
    ApiFamily::ManagedAgents,
    ApiFamily::Memory,
    ApiFamily::Skills,
];

/// Every header of a `family` request: the extra headers, then the version,
/// the family's beta, the helper tag and the credential, which win over an
/// extra header of the same name.
fn request_headers(
    extra: &HeaderMap,
    helper: Option<&'static str>,
    credential: &Credential,
    family: ApiFamily,
) -> HeaderMap {
    let mut headers = extra.clone();
    headers.remove("x-api-key");
    headers.remove(reqwest::header::AUTHORIZATION);
    headers.insert(
        "anthropic-version",
        HeaderValue::from_static(ANTHROPIC_VERSION),
    );
    headers.insert("anthropic-beta", HeaderValue::from_static(family.beta()));
    if let Some(helper) = helper {
        headers.insert("x-stainless-helper", HeaderValue::from_static(helper));
    }
    match credential {
        Credential::ApiKey(key) => {
            if let Ok(mut v) = HeaderValue::from_str(key.expose_secret()) {
                v.set_sensitive(true);
                headers.insert("x-api-key", v);
            }
        }
        Credential::Bearer(token) => {
            if let Ok(mut v) = HeaderValue::from_str(&format!("Bearer {}", token.expose_secret())) {
                v.set_sensitive(true);
                headers.insert(reqwest::header::AUTHORIZATION, v);
            }
        }
    }
    headers
}

impl Inner {
    /// Make [`Inner::headers`] again from the fields it is made of.
    fn with_headers(mut self) -> Inner {
        self.headers = FAMILIES.map(|family| {
            request_headers(&self.extra_headers, self.helper, &self.credential, family)
        });
        self
    }
}

/// Builds a [`Client`].
#[derive(Debug)]
pub struct ClientBuilder {
    base_url: String,
    credential: Credential,
    extra_headers: HeaderMap,
    request_timeout: Duration,
    connect_timeout: Duration,
    http: Option<reqwest::Client>,
    memory_retry: RetryPolicy,
}

impl ClientBuilder {
    /// Point the client at another API (the devserver, a proxy).
    pub fn base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = url.into();
        self
    }

    /// A header added to every request. The client's own auth, version and
    /// beta headers win over an extra header of the same name.
    pub fn extra_header(mut self, name: &str, value: &str) -> Result<Self, Error> {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| Error::Config(format!("invalid header name {name:?}")))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| Error::Config(format!("invalid value for header {name}")))?;
        self.extra_headers.append(name, value);
        Ok(self)
    }

    /// The bound of one request (not of a streamed body); default 60 s.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Reuse an existing connection pool.
    pub fn http_client(mut self, http: reqwest::Client) -> Self {
        self.http = Some(http);
        self
    }

    /// How memory requests retry a transient failure; default
    /// [`RetryPolicy::default`] (the official SDK's: two retries).
    pub fn memory_retry(mut self, policy: RetryPolicy) -> Self {
        self.memory_retry = policy;
        self
    }

    pub fn build(self) -> Result<Client, Error> {
        let base_url = self.base_url.trim_end_matches('/').to_string();
        let parsed = url::Url::parse(&base_url)
            .map_err(|e| Error::Config(format!("invalid base URL {base_url:?}: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(Error::Config(format!(
                "invalid base URL {base_url:?}: the scheme must be http or https"
            )));
        }
        let http = match self.http {
            Some(http) => http,
            None => crate::tls::client_builder()
                .connect_timeout(self.connect_timeout)
                .pool_idle_timeout(Duration::from_secs(60))
                .build()
                .map_err(|e| Error::Config(format!("cannot build the HTTP client: {e}")))?,
        };
        Ok(Client {
            inner: Arc::new(
                Inner {
                    http,
                    base_url,
                    base: parsed,
                    credential: self.credential,
                    extra_headers: self.extra_headers,
                    helper: None,
                    headers: Default::default(),
                    request_timeout: self.request_timeout,
                    memory_retry: self.memory_retry,
                    observer: None,
                }
                .with_headers(),
            ),
        })
    }
}

impl Client {
    pub fn builder(credential: Credential) -> ClientBuilder {
        ClientBuilder {
            base_url: DEFAULT_BASE_URL.into(),
            credential,
            extra_headers: HeaderMap::new(),
            request_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            http: None,
            memory_retry: RetryPolicy::default(),
        }
    }

    pub fn base_url(&self) -> &str {
        &self.inner.base_url
    }

    /// The bound of one request; streamed downloads use it as their idle bound.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.inner.request_timeout
    }

    /// The same client with another credential (e.g. a work item's sessions
    /// token), sharing the connection pool and extra headers. The observer
    /// is not kept: outcomes under another credential say nothing of this one.
    pub fn with_credential(&self, credential: Credential) -> Client {
        self.derive(|inner| {
            inner.credential = credential;
            inner.observer = None;
        })
    }

    /// The same client telling `observer` the outcome of each request (the
    /// worker watches its environment key's standing this way).
    pub fn with_observer(&self, observer: Arc<dyn RequestObserver>) -> Client {
        self.derive(|inner| inner.observer = Some(observer))
    }

    /// The same client tagging its requests with `x-stainless-helper`
    /// (`environments-work-poller`, `environments-worker`, `session-tool-runner`).
    pub fn with_helper(&self, helper: &'static str) -> Client {
        self.derive(|inner| inner.helper = Some(helper))
    }

    /// The same client with other retry rules for memory requests.
    pub fn with_memory_retry(&self, policy: RetryPolicy) -> Client {
        self.derive(|inner| inner.memory_retry = policy)
    }

    fn derive(&self, change: impl FnOnce(&mut Inner)) -> Client {
        let mut inner = Inner {
            http: self.inner.http.clone(),
            base_url: self.inner.base_url.clone(),
            base: self.inner.base.clone(),
            credential: self.inner.credential.clone(),
            extra_headers: self.inner.extra_headers.clone(),
            helper: self.inner.helper,
            headers: Default::default(),
            request_timeout: self.inner.request_timeout,
            memory_retry: self.inner.memory_retry,
            observer: self.inner.observer.clone(),
        };
        change(&mut inner);
        Client {
            inner: Arc::new(inner.with_headers()),
        }
    }

    /// A request with every header the API wants, bounded by the request timeout.
    pub(crate) fn request(&self, method: Method, family: ApiFamily, path: &str) -> RequestBuilder {
        self.unbounded_request(method, family, path)
            .timeout(self.inner.request_timeout)
    }

    /// A request without the overall timeout, for streamed bodies (SSE).
    pub(crate) fn unbounded_request(
        &self,
        method: Method,
        family: ApiFamily,
        path: &str,
    ) -> RequestBuilder {
        // The official SDKs mark every beta path with `?beta=true`; the API
        // accepts it. Written into the URL (a caller's `.query` appends
        // after it).
        let url = self.url(path);
        let headers = self.inner.headers[family as usize].clone();
        self.inner.http.request(method, url).headers(headers)
    }

    /// `base_url` + `path` + `?beta=true`, as parsing that text gives it,
    /// from the base parsed once: only the path is parsed here.
    fn url(&self, path: &str) -> url::Url {
        let mut url = self.inner.base.clone();
        let prefix = self.inner.base.path().trim_end_matches('/');
        url.set_path(&format!("{prefix}{path}"));
        url.set_query(Some("beta=true"));
        url.set_fragment(None);
        url
    }

    /// Send and return the raw response when its status is a success.
    pub(crate) async fn execute(&self, rb: RequestBuilder) -> Result<reqwest::Response, Error> {
        let result = match rb.send().await {
            Ok(response) if response.status().is_success() => Ok(response),
            Ok(response) => Err(api_error(response).await),
            Err(e) => Err(Error::Transport(e)),
        };
        if let Some(observer) = &self.inner.observer {
            observer.observe(result.as_ref().map(|_| ()));
        }
        result
    }

    /// Send and decode a JSON body.
    pub(crate) async fn json<T: DeserializeOwned>(&self, rb: RequestBuilder) -> Result<T, Error> {
        let response = self.execute(rb).await?;
        let body = response.bytes().await.map_err(Error::Transport)?;
        serde_json::from_str(utf8(&body)?).map_err(|e| Error::Decode(e.to_string()))
    }

    /// Send and decode a JSON body that may be absent: `204`, an empty body and
    /// `null` all mean `None` (an empty poll).
    pub(crate) async fn optional_json<T: DeserializeOwned>(
        &self,
        rb: RequestBuilder,
    ) -> Result<Option<T>, Error> {
        let response = self.execute(rb).await?;
        if response.status() == StatusCode::NO_CONTENT {
            return Ok(None);
        }
        let body = response.bytes().await.map_err(Error::Transport)?;
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        serde_json::from_str::<Option<T>>(utf8(&body)?).map_err(|e| Error::Decode(e.to_string()))
    }

    /// Send and ignore whatever successful body comes back (`204` or JSON).
    pub(crate) async fn discard(&self, rb: RequestBuilder) -> Result<(), Error> {
        let response = self.execute(rb).await?;
        response.bytes().await.map_err(Error::Transport)?;
        Ok(())
    }

    /// A memory request: sent, retried per the memory retry policy (see
    /// [`super::retry`]), and its JSON body decoded.
    ///
    /// Safe for uploads and deletes: a retry of an attempt that did land is
    /// answered 200 (an update whose content already matches) or 409 / 404,
    /// which the sync's lost-response rules settle. Cancellation-safe: the
    /// caller's timeout drops this future mid-wait or mid-attempt, and no
    /// state survives it.
    pub(crate) async fn memory_json<T: DeserializeOwned>(
        &self,
        rb: RequestBuilder,
    ) -> Result<T, Error> {
        let (body, _) = self
            .send_retrying(rb, &self.inner.memory_retry, "memory request")
            .await?;
        serde_json::from_str(utf8(&body)?).map_err(|e| Error::Decode(e.to_string()))
    }

    /// A read that retries a transient failure as the official SDK's client
    /// retries every request (two retries, 0.5 s doubling): for a GET
    /// whose one failure would otherwise fail a whole work item (the
    /// session's fetch at the item's start).
    pub(crate) async fn json_retrying<T: DeserializeOwned>(
        &self,
        rb: RequestBuilder,
    ) -> Result<T, Error> {
        let (body, _) = self
            .send_retrying(rb, &RetryPolicy::default(), "request")
            .await?;
        serde_json::from_str(utf8(&body)?).map_err(|e| Error::Decode(e.to_string()))
    }

    /// [`Self::memory_json`], with the answer's `Date` header: the server's
    /// clock (to the second), which the memory version feed measures its
    /// window by (see `crate::memory::feed`).
    pub(crate) async fn memory_json_dated<T: DeserializeOwned>(
        &self,
        rb: RequestBuilder,
    ) -> Result<(T, Option<super::types::Timestamp>), Error> {
        let (body, date) = self
            .send_retrying(rb, &self.inner.memory_retry, "memory request")
            .await?;
        let value = serde_json::from_str(utf8(&body)?).map_err(|e| Error::Decode(e.to_string()))?;
        Ok((value, date))
    }

    /// Send until a success, a failure not worth retrying, or the policy's
    /// last retry; the whole body of the success. Each attempt reads the body
    /// too, so an answer cut short is retried like a dropped connection.
    /// `what` names the request in the log line of each retry.
    async fn send_retrying(
        &self,
        rb: RequestBuilder,
        policy: &RetryPolicy,
        what: &str,
    ) -> Result<(Bytes, Option<super::types::Timestamp>), Error> {
        let mut retries = 0u32;
        loop {
            // The last attempt sends the original; so does a streamed body,
            // which cannot be sent twice.
            let copy = if retries < policy.max_retries {
                rb.try_clone()
            } else {
                None
            };
            let Some(copy) = copy else {
                return attempt(rb, retries).await.map_err(|(e, _)| e);
            };
            let (error, hints) = match attempt(copy, retries).await {
                Ok(body) => return Ok(body),
                Err(failed) => failed,
            };
            let retryable = match &error {
                Error::Api(e) => is_retryable_status(e.status, &e.kind, &hints),
                Error::Transport(_) => hints.should_retry != Some(false),
                Error::Decode(_) | Error::Config(_) => false,
            };
            if !retryable {
                return Err(error);
            }
            let wait = policy.delay(retries, hints.retry_after);
            retries += 1;
            warn!(
                attempt = retries,
                max_retries = policy.max_retries,
                backoff_ms = wait.as_millis() as u64,
                server_asked_ms = hints.retry_after.map(|d| d.as_millis() as u64),
                error = %error,
                "{what} failed; retrying"
            );
            tokio::time::sleep(wait).await;
        }
    }
}

/// One attempt, body included, with the answer's `Date` (when it has a
/// readable one); a failure comes with what its answer said about retrying.
async fn attempt(
    rb: RequestBuilder,
    retries: u32,
) -> Result<(Bytes, Option<super::types::Timestamp>), (Error, RetryHints)> {
    let response = rb
        .header("x-stainless-retry-count", retries)
        .send()
        .await
        .map_err(|e| (Error::Transport(e), RetryHints::default()))?;
    if response.status().is_success() {
        let date = response
            .headers()
            .get(reqwest::header::DATE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| chrono::DateTime::parse_from_rfc2822(v).ok())
            .map(|d| d.to_utc());
        return response
            .bytes()
            .await
            .map(|body| (body, date))
            .map_err(|e| (Error::Transport(e), RetryHints::default()));
    }
    let hints = RetryHints::from_headers(response.headers());
    let mut error = api_error(response).await;
    if let Error::Api(e) = &mut error {
        e.retry_after_ms = hints.retry_after.and_then(|wait| {
            std::num::NonZeroU32::new(wait.as_millis().min(u128::from(u32::MAX)) as u32)
        });
    }
    Err((error, hints))
}

/// The error of a non-success answer.
async fn api_error(response: reqwest::Response) -> Error {
    let status = response.status().as_u16();
    let request_id = response
        .headers()
        .get("request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = response.bytes().await.unwrap_or_default();
    Error::Api(ApiError::from_parts(status, request_id, &body))
}

/// A response body as text. Validating the UTF-8 once, up front, spares the
/// JSON parser checking each string on its own — a listing of 2,000
/// memories has ten thousand of them.
fn utf8(body: &[u8]) -> Result<&str, Error> {
    std::str::from_utf8(body)
        .map_err(|e| Error::Decode(format!("the response body is not UTF-8: {e}")))
}

/// Turn a page fetcher into a stream of items that follows `next_page` until
/// the last page (an empty page or no cursor).
pub fn paginate<T, F, Fut>(mut fetch: F) -> impl Stream<Item = Result<T, Error>>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<Page<T>, Error>>,
{
    async_stream::try_stream! {
        let mut cursor: Option<String> = None;
        loop {
            let page = fetch(cursor.take()).await?;
            let next = page.next_cursor().map(str::to_string);
            for item in page.data {
                yield item;
            }
            match next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
    }
}

/// Query pairs, skipping unset values.
#[derive(Default)]
pub(crate) struct Query(Vec<(&'static str, String)>);

impl Query {
    pub(crate) fn opt<V: ToString>(mut self, key: &'static str, value: Option<V>) -> Self {
        if let Some(v) = value {
            self.0.push((key, v.to_string()));
        }
        self
    }

    pub(crate) fn pairs(&self) -> &[(&'static str, String)] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each request's URL is what parsing `base + path + "?beta=true"`
    /// gives (how it was built before the base was parsed once), for
    /// bases with a path prefix, a trailing slash, a port, IPv6 and
    /// international hosts, and paths with encoded segments.
    #[test]
    fn each_family_has_its_own_header_map() {
        for (index, family) in FAMILIES.into_iter().enumerate() {
            assert_eq!(family as usize, index, "{family:?}");
        }
        let client = Client::builder(Credential::bearer("t"))
            .base_url("http://127.0.0.1:1")
            .build()
            .unwrap()
            .with_helper("environments-worker");
        for family in FAMILIES {
            let request = client
                .request(Method::GET, family, "/v1/x")
                .build()
                .unwrap();
            let beta = request.headers().get("anthropic-beta").unwrap();
            assert_eq!(beta, family.beta());
            assert_eq!(
                request.headers().get("x-stainless-helper").unwrap(),
                "environments-worker"
            );
            assert_eq!(request.headers().get("authorization").unwrap(), "Bearer t");
        }
    }

    #[test]
    fn a_request_url_is_the_parsed_text_of_base_path_and_beta() {
        let bases = [
            "http://127.0.0.1:8080",
            "https://api.anthropic.com",
            "https://api.anthropic.com/",
            "https://api.anthropic.com:443",
            "http://proxy.local/anthropic",
            "http://proxy.local/anthropic/",
            "http://proxy.local/a%20b/c",
            "http://[::1]:9/",
            "https://Bücher.example/x",
        ];
        let paths = [
            "/v1/sessions/sesn_01/events",
            "/v1/memory_stores/memstore_1/memories",
            "/v1/memory_stores/a%2Fb%3Fc/memories",
            "/v1/skills/s%20k/versions",
        ];
        for base in bases {
            let client = Client::builder(Credential::Bearer("k".to_string().into()))
                .base_url(base)
                .build()
                .unwrap();
            for path in paths {
                let text = format!("{}{path}?beta=true", client.base_url());
                let want = url::Url::parse(&text).unwrap();
                assert_eq!(client.url(path).as_str(), want.as_str(), "{base} + {path}");
            }
        }
    }

    #[test]
    fn a_body_that_is_not_utf8_is_a_decode_error() {
        assert_eq!(utf8(br#"{"a":"b"}"#).unwrap(), r#"{"a":"b"}"#);
        match utf8(b"{\"a\":\"\xff\"}") {
            Err(Error::Decode(msg)) => assert!(msg.contains("not UTF-8"), "{msg}"),
            other => panic!("expected a decode error, got {other:?}"),
        }
    }
}
