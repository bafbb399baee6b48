//! OpenTelemetry traces over OTLP (http/protobuf), configured by the
//! standard `OTEL_*` variables and off unless an endpoint is set.
//!
//! The spans are the `tracing` spans the worker already has (their fields
//! are the logs' field names); [`layer`] adds a `tracing-opentelemetry`
//! layer beside the log formatter that turns the crate's spans — and only
//! spans: events stay in the logs — into OTLP spans, batched on a
//! background thread. Without an endpoint no layer, provider, exporter or
//! thread exists: the cost of the feature when off is one look at the
//! environment at start.
//!
//! The exporter sends with the worker's own `reqwest` (rustls) rather than
//! a second HTTP stack; the batch thread is not a Tokio thread, so each
//! request is spawned on the runtime that built the exporter
//! (`TokioReqwest`) and awaited from there.
//!
//! Spans end up on the wire only when flushed: [`flush`] after each Lambda
//! invocation (the environment may be frozen right after), [`shutdown`]
//! before the process exits.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HeaderExtractor, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Subscriber;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

/// The provider [`layer`] installed, for [`flush`] and [`shutdown`].
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The service name when neither `OTEL_SERVICE_NAME` nor a `service.name`
/// in `OTEL_RESOURCE_ATTRIBUTES` gives one.
pub const DEFAULT_SERVICE_NAME: &str = "envworker";

/// Why traces are off, or how they are exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    /// No `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`.
    NoEndpoint,
    /// `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`.
    Disabled,
    /// A protocol other than `http/protobuf` was asked for (not built in).
    UnsupportedProtocol(String),
    /// Export over OTLP http/protobuf; the exporter reads the endpoint,
    /// headers, timeout and compression from the environment itself.
    Export,
}

impl Setting {
    /// Read the setting from `var` (the process environment in [`layer`]).
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Setting {
        let set = |name: &str| {
            var(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || set("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
        {
            return Setting::Disabled;
        }
        if set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
            && set("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
        {
            return Setting::NoEndpoint;
        }
        let protocol = set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL"));
        match protocol {
            Some(p) if p != "http/protobuf" => Setting::UnsupportedProtocol(p),
            _ => Setting::Export,
        }
    }
}

/// The OpenTelemetry layer when the environment asks for traces, else
/// `None` (nothing built). Only the crate's spans reach it, at INFO and
/// above, whatever `RUST_LOG` says; events do not (they are the logs').
/// Must be called inside the Tokio runtime (the exporter sends on it).
pub fn layer<S>() -> Option<Box<dyn Layer<S> + Send + Sync>>
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    let setting = Setting::from_env(|name| std::env::var(name).ok());
    let provider = match setting {
        Setting::Export => match build_provider() {
            Ok(provider) => provider,
            Err(e) => {
                // The subscriber is not installed yet: say it on stderr.
                eprintln!("envworker: OpenTelemetry traces are off: {e}");
                return None;
            }
        },
        Setting::UnsupportedProtocol(p) => {
            eprintln!(
                "envworker: OpenTelemetry traces are off: OTLP protocol {p:?} is not built in (only http/protobuf)"
            );
            return None;
        }
        Setting::NoEndpoint | Setting::Disabled => return None,
    };
    let tracer = provider.tracer("envworker");
    let _ = PROVIDER.set(provider);
    let only_spans = tracing_subscriber::filter::filter_fn(|meta| {
        meta.is_span()
            && meta.target().starts_with("envworker")
            && *meta.level() <= tracing::Level::INFO
    });
    Some(Box::new(
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_filter(only_spans),
    ))
}

fn build_provider() -> Result<SdkTracerProvider, String> {
    let handle = tokio::runtime::Handle::try_current()
        .map_err(|_| "no Tokio runtime to export on".to_string())?;
    // The exporter bounds its retries by the export timeout; each request
    // is bounded by the client, to the same figure.
    // The API's client builder: the same roots (the OS store) and proxies,
    // so a collector behind an internal CA is trusted as the API is.
    let client = crate::tls::client_builder()
        .timeout(export_timeout(|name| std::env::var(name).ok()))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_http_client(TokioReqwest { client, handle })
        .build()
        .map_err(|e| format!("cannot build the OTLP exporter: {e}"))?;
    let mut resource = Resource::builder();
    let named = std::env::var_os("OTEL_SERVICE_NAME").is_some_and(|v| !v.is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| {
            v.split(',')
                .any(|kv| kv.trim().starts_with("service.name="))
        });
    if !named {
        resource = resource.with_service_name(DEFAULT_SERVICE_NAME);
    }
    // The sampler comes from OTEL_TRACES_SAMPLER / _ARG (the SDK's default
    // config reads them; parentbased_always_on when unset).
    Ok(SdkTracerProvider::builder()
        .with_resource(
            resource
                .with_attribute(opentelemetry::KeyValue::new(
                    "service.version",
                    env!("CARGO_PKG_VERSION"),
                ))
                .build(),
        )
        .with_batch_exporter(exporter)
        .build())
}

/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT`
/// (milliseconds), else the OTLP default of 10 s.
fn export_timeout(var: impl Fn(&str) -> Option<String>) -> Duration {
    [
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ]
    .iter()
    .find_map(|name| var(name)?.trim().parse::<u64>().ok())
    .map_or(Duration::from_secs(10), Duration::from_millis)
}

/// Whether traces are being exported (a provider was built).
pub fn enabled() -> bool {
    PROVIDER.get().is_some()
}

/// Send every finished span now; waits for the export (bounded by the
/// exporter's timeout). Blocking: runs on a blocking thread so the runtime
/// that performs the export stays free. A no-op when traces are off.
pub async fn flush() {
    let Some(provider) = PROVIDER.get() else {
        return;
    };
    let provider = provider.clone();
    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || provider.force_flush()).await {
        tracing::warn!(error = %e, "cannot export the traces");
    }
}

/// [`flush`], given up at `deadline`: on Lambda the export must not carry
/// an invocation past its end (an unreachable collector would otherwise
/// hold it for the whole export timeout). Spans not sent by then go with
/// the next flush, or are lost with a frozen environment.
pub async fn flush_until(deadline: tokio::time::Instant) {
    if tokio::time::timeout_at(deadline, flush()).await.is_err() {
        tracing::warn!(
            "traces not exported before the invocation's deadline; left for the next flush"
        );
    }
}

/// Flush and stop the exporter before the process exits. A no-op when off.
pub async fn shutdown() {
    let Some(provider) = PROVIDER.get() else {
        return;
    };
    let provider = provider.clone();
    if let Ok(Err(e)) =
        tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(Duration::from_secs(5)))
            .await
    {
        tracing::warn!(error = %e, "cannot export the last traces");
    }
}

/// Make `span`'s parent the W3C trace context (`traceparent`, `tracestate`)
/// of `headers`, when they carry a valid one and traces are on.
pub fn adopt_remote_parent(span: &tracing::Span, headers: &http::HeaderMap) {
    if !enabled() || !headers.contains_key("traceparent") {
        return;
    }
    let cx = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    let _ = span.set_parent(cx);
}

/// A span's place in its trace, to hand to work that outlives the span
/// (a drain outlives the delivery that started it): holding it does not
/// keep the span open. Empty when traces are off.
#[derive(Clone, Default)]
pub struct Parent(Option<opentelemetry::Context>);

impl Parent {
    /// The trace position of `span`; empty when traces are off.
    pub fn of(span: &tracing::Span) -> Parent {
        if !enabled() || span.is_none() {
            return Parent(None);
        }
        Parent(Some(span.context()))
    }

    /// No parent: the work starts a trace of its own.
    pub fn none() -> Parent {
        Parent(None)
    }

    /// Make `span` (not yet entered) this parent's child in the trace.
    pub fn adopt(&self, span: &tracing::Span) {
        if let Some(cx) = &self.0 {
            let _ = span.set_parent(cx.clone());
        }
    }
}

/// The worker's `reqwest` client, driven by the runtime that built it: the
/// batch processor calls the exporter from its own (non-Tokio) thread.
#[derive(Debug)]
struct TokioReqwest {
    client: reqwest::Client,
    handle: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for TokioReqwest {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let request = reqwest::Request::try_from(request)?;
        self.handle
            .spawn(async move {
                let response = client.execute(request).await?;
                let mut answer = Response::builder().status(response.status().as_u16());
                if let Some(headers) = answer.headers_mut() {
                    *headers = response.headers().clone();
                }
                let body = response.bytes().await?;
                Ok::<_, HttpError>(answer.body(body)?)
            })
            .await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn setting(vars: &[(&str, &str)]) -> Setting {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Setting::from_env(|name| vars.get(name).cloned())
    }

    #[test]
    fn the_export_timeout_is_the_signals_then_the_generic_one_in_milliseconds() {
        let timeout = |vars: &[(&str, &str)]| {
            let vars: HashMap<String, String> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            export_timeout(|name| vars.get(name).cloned())
        };
        assert_eq!(timeout(&[]), Duration::from_secs(10));
        assert_eq!(
            timeout(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "2500")]),
            Duration::from_millis(2500)
        );
        assert_eq!(
            timeout(&[
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
                ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "700")
            ]),
            Duration::from_millis(700)
        );
        assert_eq!(
            timeout(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "soon")]),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn traces_are_off_without_an_endpoint_and_when_disabled() {
        assert_eq!(setting(&[]), Setting::NoEndpoint);
        assert_eq!(
            setting(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]),
            Setting::NoEndpoint
        );
        assert_eq!(
            setting(&[
                ("OTEL_SERVICE_NAME", "w"),
                ("OTEL_TRACES_SAMPLER", "always_on")
            ]),
            Setting::NoEndpoint
        );
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        assert_eq!(setting(&[endpoint]), Setting::Export);
        assert_eq!(
            setting(&[(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://c:4318/v1/traces"
            )]),
            Setting::Export
        );
        assert_eq!(
            setting(&[endpoint, ("OTEL_SDK_DISABLED", "TRUE")]),
            Setting::Disabled
        );
        assert_eq!(
            setting(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")]),
            Setting::Disabled
        );
        assert_eq!(
            setting(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]),
            Setting::Export
        );
        assert_eq!(
            setting(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]),
            Setting::UnsupportedProtocol("grpc".into())
        );
        // The signal's own variable wins.
        assert_eq!(
            setting(&[
                endpoint,
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
            ]),
            Setting::Export
        );
    }
}
