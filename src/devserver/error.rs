//! Error responses in the API's envelope:
//! `{"type":"error","error":{"type":…,"message":…},"request_id":…}`.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::api::types::{ErrorBody, ErrorEnvelope};

use super::ids;

/// A refused request. Handlers return it before committing anything, so a
/// refusal never changes state.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status} {kind}: {message}")]
pub struct HttpError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl HttpError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        HttpError {
            status,
            kind,
            message: message.into(),
            details: None,
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn authentication(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "authentication_error", message)
    }

    pub fn permission(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "permission_error", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    pub fn conflict(kind: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, kind, message)
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "request_too_large", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "api_error", message)
    }
}

impl From<rusqlite::Error> for HttpError {
    fn from(e: rusqlite::Error) -> Self {
        tracing::error!(error = %e, "devserver storage error");
        HttpError::internal("internal storage error")
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let request_id = ids::new_id("req");
        let envelope = ErrorEnvelope {
            object_type: "error".into(),
            error: ErrorBody {
                kind: self.kind.to_string(),
                message: self.message,
                details: self.details,
            },
            request_id: Some(request_id.clone()),
        };
        let mut response = (self.status, axum::Json(envelope)).into_response();
        if let Ok(v) = HeaderValue::from_str(&request_id) {
            response.headers_mut().insert("request-id", v);
        }
        response
    }
}

pub type HttpResult<T> = Result<T, HttpError>;
