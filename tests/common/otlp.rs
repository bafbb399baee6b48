//! A real OTLP/HTTP trace receiver on 127.0.0.1:0: `POST /v1/traces` bodies
//! decoded with `opentelemetry-proto`'s generated (prost) types, every raw
//! body kept for byte-level checks (no secret anywhere in them).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;

/// One exported span, flattened with its resource's attributes.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// W3C `tracestate`, as the span carries it.
    pub trace_state: String,
    pub attributes: Vec<(String, String)>,
    pub resource: Vec<(String, String)>,
}

impl ReceivedSpan {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn resource_attr(&self, key: &str) -> Option<&str> {
        self.resource
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Received {
    bodies: Vec<Vec<u8>>,
    spans: Vec<ReceivedSpan>,
    content_types: Vec<String>,
}

/// The receiver; stops when dropped.
pub struct OtlpReceiver {
    /// `http://127.0.0.1:PORT`: what `OTEL_EXPORTER_OTLP_ENDPOINT` takes.
    pub endpoint: String,
    received: Arc<Mutex<Received>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl OtlpReceiver {
    pub async fn start() -> OtlpReceiver {
        let received = Arc::new(Mutex::new(Received::default()));
        let app = Router::new()
            .route("/v1/traces", post(export))
            .with_state(received.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        OtlpReceiver {
            endpoint,
            received,
            task,
        }
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received.lock().unwrap().spans.clone()
    }

    /// Every request body as received (protobuf bytes).
    pub fn raw_bodies(&self) -> Vec<Vec<u8>> {
        self.received.lock().unwrap().bodies.clone()
    }

    pub fn content_types(&self) -> Vec<String> {
        self.received.lock().unwrap().content_types.clone()
    }

    /// Wait until `done(spans)` holds; panics with what arrived after `timeout`.
    pub async fn wait_for(&self, timeout: Duration, done: impl Fn(&[ReceivedSpan]) -> bool) {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the spans expected did not arrive within {timeout:?}: {spans:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn export(
    State(received): State<Arc<Mutex<Received>>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Vec<u8>) {
    let request = match ExportTraceServiceRequest::decode(body.as_ref()) {
        Ok(request) => request,
        Err(_) => return (StatusCode::BAD_REQUEST, Vec::new()),
    };
    let mut received = received.lock().unwrap();
    received.bodies.push(body.to_vec());
    if let Some(ct) = headers.get("content-type").and_then(|v| v.to_str().ok()) {
        received.content_types.push(ct.to_string());
    }
    for resource_spans in request.resource_spans {
        let resource = resource_spans
            .resource
            .map(|r| flatten(&r.attributes))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                received.spans.push(ReceivedSpan {
                    name: span.name,
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    trace_state: span.trace_state,
                    attributes: flatten(&span.attributes),
                    resource: resource.clone(),
                });
            }
        }
    }
    (
        StatusCode::OK,
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

fn flatten(attributes: &[KeyValue]) -> Vec<(String, String)> {
    attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(AnyValue::StringValue(s)) => s.clone(),
                Some(AnyValue::BoolValue(b)) => b.to_string(),
                Some(AnyValue::IntValue(i)) => i.to_string(),
                Some(AnyValue::DoubleValue(d)) => d.to_string(),
                Some(other) => format!("{other:?}"),
                None => String::new(),
            };
            (kv.key.clone(), value)
        })
        .collect()
}
