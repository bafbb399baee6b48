//! The devserver's test hooks over HTTP: the two middlewares on the API
//! routes — [`inject`] applies the fault rules ([`super::faults`]) and
//! [`record`] logs each request ([`super::requests`]) — and the
//! `/dev/faults` and `/dev/requests` endpoints that set and read them.
//! (The rules and the log are plain data, kept in [`AppState`]; what acts
//! on a request lives here, above the state, so the arrows run one way.)

use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::{HttpError, HttpResult};
use super::http::{JsonBody, MAX_BODY_BYTES};
use super::ids;
use super::requests;
use super::state::AppState;

/// The error type an injected status answers with.
fn error_kind(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        408 => "timeout_error",
        409 => "conflict_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// The middleware: applied to the API routes (not to `/dev`).
pub async fn inject(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let began = tokio::time::Instant::now();
    let decision = state
        .faults()
        .decide(request.method().as_str(), request.uri().path());
    if !decision.latency.is_zero() {
        tokio::time::sleep(decision.latency).await;
    }
    if let Some(status) = decision.status {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response =
            HttpError::new(status, error_kind(status.as_u16()), "injected fault").into_response();
        for (name, value) in decision.headers {
            // Checked when the rule was added.
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                response.headers_mut().insert(name, value);
            }
        }
        return response;
    }
    let response = next.run(request).await;
    if decision.drop_response {
        // The handler has committed; the client gets a broken response.
        let (parts, _) = response.into_parts();
        let broken = futures::stream::once(async {
            Err::<bytes::Bytes, std::io::Error>(std::io::Error::other("fault: response dropped"))
        });
        return Response::from_parts(parts, Body::from_stream(broken));
    }
    if let Some(cut) = decision.cut_after {
        // The body ends cleanly at the cut, as a server closing the stream.
        use futures::StreamExt;
        let (parts, body) = response.into_parts();
        let cut_off = body
            .into_data_stream()
            .take_until(tokio::time::sleep_until(began + cut));
        return Response::from_parts(parts, Body::from_stream(cut_off));
    }
    response
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddFaults {
    rules: Vec<super::faults::FaultRule>,
}

/// `POST /dev/faults`: add rules.
pub async fn add_faults(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<AddFaults>,
) -> HttpResult<Json<Value>> {
    for rule in &body.rules {
        rule.check().map_err(HttpError::invalid_request)?;
    }
    state
        .faults()
        .add(body.rules)
        .map_err(HttpError::invalid_request)?;
    Ok(Json(json!({ "rules": state.faults().rules() })))
}

/// `GET /dev/faults`.
pub async fn list_faults(State(state): State<AppState>) -> Json<Value> {
    Json(json!({ "rules": state.faults().rules() }))
}

/// `DELETE /dev/faults`: clear every rule.
pub async fn clear_faults(State(state): State<AppState>) -> Json<Value> {
    state.faults().clear();
    Json(json!({ "rules": [] }))
}

/// The middleware, outermost on the API routes: it sees what the client
/// sent and the status that went back, injected faults included.
pub async fn record(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let received_at_us = ids::now_micros();
    let method = request.method().to_string();
    let path = request.uri().path().to_string();
    let query = request.uri().query().map(str::to_string);
    let auth = requests::auth_kind(request.headers());
    let (response, memory_write) = if requests::is_memory_write(&method, &path) {
        let (parts, body) = request.into_parts();
        // The handler reads at most this much too, and answers 413 past it.
        match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
            Ok(bytes) => {
                let write = requests::memory_write(&bytes);
                let request = Request::from_parts(parts, Body::from(bytes));
                (next.run(request).await, Some(write))
            }
            Err(_) => {
                let refused = super::error::HttpError::too_large(format!(
                    "request body is larger than {MAX_BODY_BYTES} bytes"
                ));
                (refused.into_response(), None)
            }
        }
    } else {
        (next.run(request).await, None)
    };
    state.requests().push(requests::LoggedRequest {
        seq: 0,
        received_at_us,
        method,
        path,
        query,
        status: response.status().as_u16(),
        auth,
        memory_write,
    });
    response
}

/// `GET /dev/requests`: every logged request, oldest first.
pub async fn list_requests(State(state): State<AppState>) -> Json<Value> {
    Json(json!({ "data": state.requests().entries() }))
}

/// `DELETE /dev/requests`: forget them.
pub async fn clear_requests(State(state): State<AppState>) -> Json<Value> {
    state.requests().clear();
    Json(json!({ "data": [] }))
}
