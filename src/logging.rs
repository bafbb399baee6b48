//! Logging setup: `tracing` to stderr, as text or as one JSON object per line.
//! The filter comes from `RUST_LOG`; when that is unset, `ANTHROPIC_LOG`
//! (`debug` or `info`, as the official SDK reads it) names the level; else
//! the command's default (`info`; `warn` for `dev`).
//!
//! In JSON every field is a top-level member — the event's own and those of
//! the spans it happens in (`work_id`, `session_id` of the work item,
//! `requestId` of a Lambda invocation) — so a log pipeline can filter on
//! `work_id` without knowing about spans. A field an event repeats wins
//! over the span's, and a key never appears twice.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Output format of the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The format [`init`] installed (text until then).
static FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// Print the line that announces where a server listens, on stdout, where
/// scripts and tests read it: `{what} {url}` as text, or with
/// `--log-format json` a JSON log line whose `message` is that same text
/// and whose `url` is the URL — so every line the process writes is JSON.
pub fn announce(what: &str, url: &str) {
    use std::io::Write;
    let text = format!("{what} {url}");
    let line = match FORMAT.get().copied().unwrap_or_default() {
        LogFormat::Text => text,
        LogFormat::Json => {
            let mut timestamp = String::new();
            let _ = SystemTime.format_time(&mut Writer::new(&mut timestamp));
            serde_json::json!({
                "timestamp": timestamp,
                "level": "INFO",
                "target": "envworker",
                "message": text,
                "url": url,
            })
            .to_string()
        }
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Install the global subscriber; `default_filter` applies when `RUST_LOG`
/// is unset. Calling it twice keeps the first.
///
/// With JSON, a panic is logged as an ERROR line too (its message and
/// place), instead of the default hook's plain text on stderr.
pub fn init(format: LogFormat, default_filter: &str) {
    let _ = FORMAT.set(format);
    if format == LogFormat::Json {
        std::panic::set_hook(Box::new(|info| {
            let message = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let location = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_default();
            tracing::error!(panic.message = %message, panic.location = %location, "panicked");
        }));
    }
    let fallback = fallback_filter(
        std::env::var("ANTHROPIC_LOG").ok().as_deref(),
        default_filter,
    );
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(fallback));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder
            .with_ansi(false)
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson)
            .try_init(),
    };
}

/// The filter when `RUST_LOG` is unset (or invalid): `ANTHROPIC_LOG` as the
/// official SDK reads it — exactly `debug` (its own logger and its HTTP
/// client's at DEBUG: here envworker's and reqwest's, the rest at INFO, so
/// hyper's and h2's frame-level chatter stays out) or exactly `info` —
/// else `default_filter`. Any other value is ignored, as the SDK ignores it.
pub fn fallback_filter<'a>(anthropic_log: Option<&str>, default_filter: &'a str) -> &'a str {
    match anthropic_log {
        Some("debug") => "info,envworker=debug,reqwest=debug",
        Some("info") => "info",
        _ => default_filter,
    }
}

/// One JSON object per event: `timestamp`, `level`, `target`, `message`,
/// then the fields of the enclosing spans (outermost first) and the event's.
pub struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = Map::new();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        line.insert("timestamp".into(), Value::String(timestamp));
        let meta = event.metadata();
        line.insert("level".into(), Value::String(meta.level().to_string()));
        line.insert("target".into(), Value::String(meta.target().to_string()));
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                // With `JsonFields`, a span's recorded fields are a JSON object.
                if let Some(fields) = extensions.get::<FormattedFields<N>>()
                    && let Ok(Value::Object(fields)) = serde_json::from_str(&fields.fields)
                {
                    line.extend(fields);
                }
            }
        }
        event.record(&mut Fields(&mut line));
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// Collects an event's fields into the line.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().into(), Value::String(value.into()));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), Value::Bool(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0
            .insert(field.name().into(), Value::String(value.to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), Value::String(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::sync::{Arc, Mutex};
    use tracing::{info, info_span, warn};

    /// `ANTHROPIC_LOG` as the SDK's `setup_logging` reads it: two exact values.
    #[test]
    fn anthropic_log_names_the_level_when_rust_log_is_unset() {
        let table = [
            (None, "info", "info"),
            (None, "warn", "warn"),
            (Some("debug"), "warn", "info,envworker=debug,reqwest=debug"),
            (Some("info"), "warn", "info"),
            (Some("DEBUG"), "warn", "warn"),
            (Some("trace"), "warn", "warn"),
            (Some(""), "info", "info"),
            (Some(" info"), "warn", "warn"),
        ];
        for (anthropic_log, default, expected) in table {
            assert_eq!(
                fallback_filter(anthropic_log, default),
                expected,
                "{anthropic_log:?}"
            );
            EnvFilter::try_new(expected).expect("a valid filter");
        }
    }

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_carry_span_and_event_fields_at_the_top_level() {
        let buffer = Buffer::default();
        let sink = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let item = info_span!("work_item", work_id = "work_1", session_id = "sesn_1");
            let _in_item = item.enter();
            info!(
                memory_store.id = "memstore_1",
                uploads = 2_u64,
                "memory synced"
            );
            // The event's own field wins over the span's; no duplicate key.
            warn!(session_id = "sesn_2", "odd \"quoted\" message");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["work_id"], "work_1");
        assert_eq!(lines[0]["session_id"], "sesn_1");
        assert_eq!(lines[0]["memory_store.id"], "memstore_1");
        assert_eq!(lines[0]["uploads"], 2);
        assert_eq!(lines[0]["message"], "memory synced");
        assert_eq!(lines[0]["level"], "INFO");
        assert!(lines[0]["timestamp"].as_str().unwrap().starts_with("20"));
        assert_eq!(lines[1]["session_id"], "sesn_2");
        assert_eq!(lines[1]["work_id"], "work_1");
        assert_eq!(lines[1]["message"], "odd \"quoted\" message");
        assert_eq!(text.matches("session_id").count(), 2, "{text}");
    }
}
