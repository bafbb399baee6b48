//! Prometheus metrics: what an operator needs to see that webhooks arrive,
//! items are served, tools answer and memory reaches the server.
//!
//! Counters are fed from two places only: the webhook handler (one outcome
//! per delivery) and [`Metrics`] as a [`WorkerObserver`], told of every
//! [`WorkerEvent`] the worker emits — so the numbers are exactly the events,
//! and no module below this one, the worker included, knows metrics exist.
//! Labels are closed sets (outcomes, tool names the agent toolset defines,
//! configured endpoint names); nothing a sender controls becomes a label.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};

use crate::memory::SyncReport;
use crate::session::{CallOutcome, CallRecord, RunEnd};
use crate::worker::item::{ItemOutcome, ItemReport};
use crate::worker::lease::LeaseEnd;
use crate::worker::{WorkerEvent, WorkerObserver};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookLabels {
    endpoint: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabel {
    endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SandboxLabels {
    endpoint: String,
    /// `enforced` or `off`.
    mode: &'static str,
    /// `private`, `shared` or `unconfined`.
    tmp: &'static str,
    scopes: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PollErrorLabels {
    endpoint: String,
    class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    git_sha: &'static str,
}

/// The commit built, from `ENVWORKER_GIT_SHA` in the build's environment
/// (`ENVWORKER_GIT_SHA=$(git rev-parse HEAD) cargo build`; no build script
/// asks git); `unknown` otherwise.
pub const GIT_SHA: &str = match option_env!("ENVWORKER_GIT_SHA") {
    Some(sha) => sha,
    None => "unknown",
};

/// The content type of [`Metrics::render`]'s body (OpenMetrics text, which
/// Prometheus negotiates and reads).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds of the queue-wait histogram, in seconds: webhook-driven
/// claims take well under a second; a lost webhook waits for a periodic look.
const QUEUE_WAIT_BUCKETS: [f64; 14] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolName {
    tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SyncLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeleteLabels {
    result: &'static str,
}

/// The tools a worker serves; any other name is counted as `other`.
const TOOLS: [&str; 6] = ["bash", "read", "write", "edit", "glob", "grep"];

/// Register `metric` under `name` and keep a handle to it.
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// The build's own gauge: always 1, its labels name the running build.
fn register_build_info(registry: &mut Registry) {
    let build_info = registered(
        registry,
        "build_info",
        "Always 1; the labels name the running build (version, git_sha)",
        Family::<BuildLabels, Gauge>::default(),
    );
    build_info
        .get_or_create(&BuildLabels {
            version: env!("CARGO_PKG_VERSION"),
            git_sha: GIT_SHA,
        })
        .set(1);
}

/// Every metric envworker exports, in one registry.
pub struct Metrics {
    registry: Registry,
    webhooks: Family<WebhookLabels, Counter>,
    work_items: Family<OutcomeLabels, Counter>,
    sessions_in_flight: Gauge,
    tool_calls: Family<ToolLabels, Counter>,
    tool_call_seconds: Family<ToolName, Histogram>,
    memory_syncs: Family<SyncLabels, Counter>,
    memory_uploads: Counter,
    memory_pulls: Counter,
    memory_deletes: Family<DeleteLabels, Counter>,
    memory_conflicts: Counter,
    memory_refused_files: Counter,
    memory_flush_cutoffs: Counter,
    memory_final_sync_cutoffs: Counter,
    lease_losses: Counter,
    work_queue_depth: Family<EndpointLabel, Gauge>,
    poll_errors: Family<PollErrorLabels, Counter>,
    queue_wait_seconds: Family<EndpointLabel, Histogram>,
    shell_sandbox: Family<SandboxLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("envworker");
        register_build_info(&mut registry);
        // One registration per metric: a table (each of its own type).
        Metrics {
            webhooks: registered(
                &mut registry,
                "webhooks",
                "Webhook deliveries by endpoint and outcome (accepted, ignored, duplicate, unauthorized, bad_request, not_found, shutting_down)",
                Family::<WebhookLabels, Counter>::default(),
            ),
            work_items: registered(
                &mut registry,
                "work_items",
                "Work items handled, by outcome (served, cancelled, fatal, undelivered, not_a_session, already_terminated, failed, mount_path_in_use: handed back as a store's mount path was held by another live session)",
                Family::<OutcomeLabels, Counter>::default(),
            ),
            sessions_in_flight: registered(
                &mut registry,
                "sessions_in_flight",
                "Sessions being served right now",
                Gauge::default(),
            ),
            tool_calls: registered(
                &mut registry,
                "tool_calls",
                "Tool calls by tool and outcome (ok, error, not_posted, denied, not_owned)",
                Family::<ToolLabels, Counter>::default(),
            ),
            tool_call_seconds: registered(
                &mut registry,
                "tool_call_duration_seconds",
                "Time to run one tool call, until its result is ready (posting excluded)",
                Family::<ToolName, Histogram>::new_with_constructor(|| {
                    Histogram::new([
                        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                        10.0, 30.0, 60.0, 120.0,
                    ])
                }),
            ),
            memory_syncs: registered(
                &mut registry,
                "memory_syncs",
                "Memory syncs of a session's stores (periodic, final)",
                Family::<SyncLabels, Counter>::default(),
            ),
            memory_uploads: registered(
                &mut registry,
                "memory_uploads",
                "Memory files uploaded to their store",
                Counter::default(),
            ),
            memory_pulls: registered(
                &mut registry,
                "memory_pulls",
                "Memories written to disk from their store",
                Counter::default(),
            ),
            memory_deletes: registered(
                &mut registry,
                "memory_deletes",
                "Local deletions by result (sent, held by the per-sync cap, log_only)",
                Family::<DeleteLabels, Counter>::default(),
            ),
            memory_conflicts: registered(
                &mut registry,
                "memory_conflicts",
                "Local edits that lost to a remote change",
                Counter::default(),
            ),
            memory_refused_files: registered(
                &mut registry,
                "memory_refused_files",
                "Memory files the server refused (400/413), each once until it changes",
                Counter::default(),
            ),
            memory_flush_cutoffs: registered(
                &mut registry,
                "memory_flush_cutoffs",
                "Teardown flushes cut off by their bound with uploads unfinished",
                Counter::default(),
            ),
            memory_final_sync_cutoffs: registered(
                &mut registry,
                "memory_final_sync_cutoffs",
                "Final syncs cut off by their bound",
                Counter::default(),
            ),
            lease_losses: registered(
                &mut registry,
                "lease_losses",
                "Work item leases lost (412, or no successful heartbeat for a TTL)",
                Counter::default(),
            ),
            work_queue_depth: registered(
                &mut registry,
                "work_queue_depth",
                "Items queued in each endpoint's environment, read from the work queue stats at scrape time",
                Family::<EndpointLabel, Gauge>::default(),
            ),
            poll_errors: registered(
                &mut registry,
                "poll_errors",
                "Failed work-queue requests made with an endpoint's environment key (polls, acks, queue stats reads), by endpoint and class (auth = 401/403, unreachable = no answer, server = 5xx, other)",
                Family::<PollErrorLabels, Counter>::default(),
            ),
            queue_wait_seconds: registered(
                &mut registry,
                "work_queue_wait_seconds",
                "Time from a work item's creation (its created_at, the API's clock) to its claim, by endpoint",
                Family::<EndpointLabel, Histogram>::new_with_constructor(|| {
                    Histogram::new(QUEUE_WAIT_BUCKETS)
                }),
            ),
            shell_sandbox: registered(
                &mut registry,
                "shell_sandbox",
                "The agent's shell sandbox per endpoint: the value is the kernel's Landlock ABI; the labels say what is enforced (mode enforced/off, tmp private/shared/unconfined, scopes true/false)",
                Family::<SandboxLabels, Gauge>::default(),
            ),
            registry,
        }
    }

    /// Count one webhook delivery. `endpoint` must be a configured name (or
    /// `"unknown"`): a path a sender chose never becomes a label.
    pub fn webhook(&self, endpoint: &str, outcome: &'static str) {
        self.webhooks
            .get_or_create(&WebhookLabels {
                endpoint: endpoint.to_string(),
                outcome,
            })
            .inc();
    }

    /// Record an endpoint's queue depth (read at scrape time).
    pub fn set_queue_depth(&self, endpoint: &str, depth: u64) {
        self.work_queue_depth
            .get_or_create(&EndpointLabel {
                endpoint: endpoint.to_string(),
            })
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
    }

    fn synced(&self, report: &SyncReport, final_sync: bool) {
        let kind = if final_sync { "final" } else { "periodic" };
        self.memory_syncs.get_or_create(&SyncLabels { kind }).inc();
        // The push's uploads are uploads too (reported with the next sync).
        self.memory_uploads
            .inc_by((report.uploads + report.pushed) as u64);
        self.memory_pulls.inc_by(report.pulls as u64);
        for (result, n) in [
            ("sent", report.deletes),
            ("held", report.deletes_held),
            ("log_only", report.deletes_logged),
        ] {
            if n > 0 {
                self.memory_deletes
                    .get_or_create(&DeleteLabels { result })
                    .inc_by(n as u64);
            }
        }
        self.memory_conflicts.inc_by(report.conflicts as u64);
        self.memory_refused_files.inc_by(report.refused as u64);
    }

    /// Say what `endpoint`'s shell sandbox enforces (once, at start).
    pub fn set_shell_sandbox(&self, endpoint: &str, d: crate::sandbox::Described) {
        self.shell_sandbox
            .get_or_create(&SandboxLabels {
                endpoint: endpoint.to_string(),
                mode: d.mode,
                tmp: d.tmp,
                scopes: if d.scopes { "true" } else { "false" },
            })
            .set(i64::from(d.landlock_abi));
    }

    /// An observer of one endpoint's worker: [`Metrics`] labelling what it
    /// counts per endpoint with `endpoint` (a configured name).
    pub fn for_endpoint(self: &Arc<Self>, endpoint: &str) -> Arc<EndpointMetrics> {
        Arc::new(EndpointMetrics {
            metrics: self.clone(),
            endpoint: endpoint.to_string(),
        })
    }

    /// The registry in OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// [`Metrics`] as the observer of one endpoint's worker.
pub struct EndpointMetrics {
    metrics: Arc<Metrics>,
    endpoint: String,
}

impl WorkerObserver for EndpointMetrics {
    fn observe(&self, event: &WorkerEvent) {
        self.metrics.count(&self.endpoint, event);
    }
}

impl WorkerObserver for Metrics {
    /// Count what one worker event says happened; per-endpoint series get
    /// `endpoint="unknown"` (use [`Metrics::for_endpoint`] to name it).
    fn observe(&self, event: &WorkerEvent) {
        self.count("unknown", event);
    }
}

impl Metrics {
    /// Count what one event of `endpoint`'s worker says happened.
    fn count(&self, endpoint: &str, event: &WorkerEvent) {
        match event {
            WorkerEvent::Claimed { queued_for, .. } => self.claimed(endpoint, *queued_for),
            WorkerEvent::QueueError { class } => {
                self.poll_errors
                    .get_or_create(&PollErrorLabels {
                        endpoint: endpoint.to_string(),
                        class: class.as_str(),
                    })
                    .inc();
            }
            WorkerEvent::Call { record, .. } => self.called(record),
            WorkerEvent::Synced {
                report, final_sync, ..
            } => self.synced(report, *final_sync),
            WorkerEvent::Finished(report) => self.finished(report),
        }
    }

    /// A session in flight more, and how long its item waited in the queue.
    fn claimed(&self, endpoint: &str, queued_for: Option<std::time::Duration>) {
        self.sessions_in_flight.inc();
        if let Some(wait) = queued_for {
            self.queue_wait_seconds
                .get_or_create(&EndpointLabel {
                    endpoint: endpoint.to_string(),
                })
                .observe(wait.as_secs_f64());
        }
    }

    /// One tool call by tool and outcome; its duration when it was answered.
    fn called(&self, record: &CallRecord) {
        let tool = if TOOLS.contains(&record.name.as_str()) {
            record.name.clone()
        } else {
            "other".to_string()
        };
        let outcome = call_outcome(&record.outcome);
        if matches!(record.outcome, CallOutcome::Answered { .. }) {
            self.tool_call_seconds
                .get_or_create(&ToolName { tool: tool.clone() })
                .observe(record.duration.as_secs_f64());
        }
        self.tool_calls
            .get_or_create(&ToolLabels { tool, outcome })
            .inc();
    }

    /// One item ended: its outcome, the session no longer in flight, and
    /// what its teardown did (final sync, flush, lease, cut-offs).
    fn finished(&self, report: &ItemReport) {
        self.work_items
            .get_or_create(&OutcomeLabels {
                outcome: item_outcome(&report.outcome),
            })
            .inc();
        if report.claimed {
            self.sessions_in_flight.dec();
        }
        if let Some(sync) = &report.teardown.final_sync {
            self.synced(sync, true);
        }
        self.memory_uploads.inc_by(report.teardown.flushed as u64);
        if matches!(report.lease, Some(LeaseEnd::Lost)) {
            self.lease_losses.inc();
        }
        if report.teardown.flush_cut_off {
            self.memory_flush_cutoffs.inc();
        }
        if report.teardown.final_sync_cut_off {
            self.memory_final_sync_cutoffs.inc();
        }
    }
}

/// The `outcome` label of a tool call.
fn call_outcome(outcome: &CallOutcome) -> &'static str {
    match outcome {
        CallOutcome::Answered {
            is_error: false,
            posted: true,
        } => "ok",
        CallOutcome::Answered {
            is_error: true,
            posted: true,
        } => "error",
        CallOutcome::Answered { posted: false, .. } => "not_posted",
        CallOutcome::Denied => "denied",
        CallOutcome::NotOwned => "not_owned",
    }
}

/// The `outcome` label of a work item.
fn item_outcome(outcome: &ItemOutcome) -> &'static str {
    match outcome {
        ItemOutcome::Served(RunEnd::Terminated | RunEnd::Idle) => "served",
        ItemOutcome::Served(RunEnd::Cancelled) => "cancelled",
        ItemOutcome::Served(RunEnd::Fatal(_)) => "fatal",
        ItemOutcome::Served(RunEnd::Undelivered { .. }) => "undelivered",
        ItemOutcome::NotASession => "not_a_session",
        ItemOutcome::AlreadyTerminated => "already_terminated",
        ItemOutcome::Failed(_) => "failed",
        ItemOutcome::MountPathInUse(_) => "mount_path_in_use",
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::api::ErrorClass;
    use crate::memory::TeardownReport;
    use crate::session::{CallRecord, RunStats};
    use crate::worker::item::ItemReport;

    fn value(metrics: &Metrics, series: &str) -> Option<f64> {
        metrics.render().lines().find_map(|line| {
            line.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
    }

    fn call(name: &str, outcome: CallOutcome) -> WorkerEvent {
        WorkerEvent::Call {
            work_id: "work_1".into(),
            record: CallRecord {
                tool_use_id: "toolu_1".into(),
                name: name.into(),
                outcome,
                duration: Duration::from_millis(30),
                detail: None,
                summary: None,
            },
        }
    }

    fn finished(
        outcome: ItemOutcome,
        lease: Option<LeaseEnd>,
        teardown: TeardownReport,
    ) -> WorkerEvent {
        WorkerEvent::Finished(Box::new(ItemReport {
            work_id: "work_1".into(),
            session_id: "sesn_1".into(),
            outcome,
            lease,
            stopped: true,
            stats: RunStats::default(),
            teardown,
            duration: Duration::from_secs(1),
            claimed: true,
        }))
    }

    #[test]
    fn tool_calls_are_counted_by_tool_and_outcome_with_closed_labels() {
        let m = Metrics::new();
        let answered = |is_error, posted| CallOutcome::Answered { is_error, posted };
        for (tool, outcome) in [
            ("bash", answered(false, true)),
            ("bash", answered(true, true)),
            ("read", answered(false, false)),
            ("edit", CallOutcome::Denied),
            ("web_search", CallOutcome::NotOwned),
            ("$(rm -rf /)", answered(false, true)),
        ] {
            m.observe(&call(tool, outcome));
        }
        let table = [
            (
                r#"envworker_tool_calls_total{tool="bash",outcome="ok"}"#,
                1.0,
            ),
            (
                r#"envworker_tool_calls_total{tool="bash",outcome="error"}"#,
                1.0,
            ),
            (
                r#"envworker_tool_calls_total{tool="read",outcome="not_posted"}"#,
                1.0,
            ),
            (
                r#"envworker_tool_calls_total{tool="edit",outcome="denied"}"#,
                1.0,
            ),
            (
                r#"envworker_tool_calls_total{tool="other",outcome="not_owned"}"#,
                1.0,
            ),
            (
                r#"envworker_tool_calls_total{tool="other",outcome="ok"}"#,
                1.0,
            ),
            // Only executed calls are timed.
            (
                r#"envworker_tool_call_duration_seconds_count{tool="bash"}"#,
                2.0,
            ),
            (
                r#"envworker_tool_call_duration_seconds_count{tool="read"}"#,
                1.0,
            ),
        ];
        for (series, expected) in table {
            assert_eq!(
                value(&m, series),
                Some(expected),
                "{series}\n{}",
                m.render()
            );
        }
        assert_eq!(
            value(
                &m,
                r#"envworker_tool_call_duration_seconds_count{tool="edit"}"#
            ),
            None
        );
        assert!(
            !m.render().contains("rm -rf"),
            "a name the agent chose became a label"
        );
    }

    #[test]
    fn syncs_teardowns_and_leases_move_their_counters() {
        let m = Metrics::new();
        m.observe(&WorkerEvent::Claimed {
            work_id: "work_1".into(),
            session_id: "sesn_1".into(),
            queued_for: None,
        });
        assert_eq!(value(&m, "envworker_sessions_in_flight"), Some(1.0));
        m.observe(&WorkerEvent::Synced {
            work_id: "work_1".into(),
            report: SyncReport {
                uploads: 2,
                pulls: 3,
                deletes: 1,
                deletes_held: 4,
                deletes_logged: 0,
                conflicts: 1,
                refused: 1,
                recovered: 0,
                ..Default::default()
            },
            final_sync: false,
        });
        m.observe(&finished(
            ItemOutcome::Served(RunEnd::Idle),
            Some(LeaseEnd::Lost),
            TeardownReport {
                final_sync: Some(SyncReport {
                    uploads: 1,
                    deletes_logged: 2,
                    ..Default::default()
                }),
                final_sync_cut_off: false,
                flush_cut_off: true,
                flushed: 5,
            },
        ));
        let table = [
            (r#"envworker_memory_syncs_total{kind="periodic"}"#, 1.0),
            (r#"envworker_memory_syncs_total{kind="final"}"#, 1.0),
            ("envworker_memory_uploads_total", 8.0),
            ("envworker_memory_pulls_total", 3.0),
            (r#"envworker_memory_deletes_total{result="sent"}"#, 1.0),
            (r#"envworker_memory_deletes_total{result="held"}"#, 4.0),
            (r#"envworker_memory_deletes_total{result="log_only"}"#, 2.0),
            ("envworker_memory_conflicts_total", 1.0),
            ("envworker_memory_refused_files_total", 1.0),
            ("envworker_memory_flush_cutoffs_total", 1.0),
            ("envworker_memory_final_sync_cutoffs_total", 0.0),
            ("envworker_lease_losses_total", 1.0),
            (r#"envworker_work_items_total{outcome="served"}"#, 1.0),
            ("envworker_sessions_in_flight", 0.0),
        ];
        for (series, expected) in table {
            assert_eq!(
                value(&m, series),
                Some(expected),
                "{series}\n{}",
                m.render()
            );
        }
        // An item that never reached its session does not touch the gauge.
        m.observe(&WorkerEvent::Finished(Box::new(ItemReport {
            claimed: false,
            ..match finished(
                ItemOutcome::Failed("no credential".into()),
                None,
                TeardownReport::default(),
            ) {
                WorkerEvent::Finished(r) => *r,
                _ => unreachable!(),
            }
        })));
        assert_eq!(value(&m, "envworker_sessions_in_flight"), Some(0.0));
        assert_eq!(
            value(&m, r#"envworker_work_items_total{outcome="failed"}"#),
            Some(1.0)
        );
    }

    #[test]
    fn webhooks_are_counted_by_endpoint_and_outcome() {
        let m = Metrics::new();
        m.webhook("default", "accepted");
        m.webhook("default", "accepted");
        m.webhook("unknown", "not_found");
        assert_eq!(
            value(
                &m,
                r#"envworker_webhooks_total{endpoint="default",outcome="accepted"}"#
            ),
            Some(2.0)
        );
        assert_eq!(
            value(
                &m,
                r#"envworker_webhooks_total{endpoint="unknown",outcome="not_found"}"#
            ),
            Some(1.0)
        );
        assert!(m.render().contains("# TYPE envworker_webhooks counter"));
    }

    #[test]
    fn poll_errors_and_queue_waits_are_labelled_with_the_endpoint() {
        let m = Arc::new(Metrics::new());
        let a = m.for_endpoint("a");
        for class in [
            ErrorClass::Auth,
            ErrorClass::Auth,
            ErrorClass::Unreachable,
            ErrorClass::Server,
            ErrorClass::Other,
        ] {
            a.observe(&WorkerEvent::QueueError { class });
        }
        a.observe(&WorkerEvent::Claimed {
            work_id: "work_1".into(),
            session_id: "sesn_1".into(),
            queued_for: Some(Duration::from_millis(1_500)),
        });
        for (series, expected) in [
            (
                r#"envworker_poll_errors_total{endpoint="a",class="auth"}"#,
                2.0,
            ),
            (
                r#"envworker_poll_errors_total{endpoint="a",class="unreachable"}"#,
                1.0,
            ),
            (
                r#"envworker_poll_errors_total{endpoint="a",class="server"}"#,
                1.0,
            ),
            (
                r#"envworker_poll_errors_total{endpoint="a",class="other"}"#,
                1.0,
            ),
            (
                r#"envworker_work_queue_wait_seconds_count{endpoint="a"}"#,
                1.0,
            ),
            (
                r#"envworker_work_queue_wait_seconds_sum{endpoint="a"}"#,
                1.5,
            ),
            (
                r#"envworker_work_queue_wait_seconds_bucket{le="1.0",endpoint="a"}"#,
                0.0,
            ),
            (
                r#"envworker_work_queue_wait_seconds_bucket{le="2.5",endpoint="a"}"#,
                1.0,
            ),
            ("envworker_sessions_in_flight", 1.0),
        ] {
            assert_eq!(
                value(&m, series),
                Some(expected),
                "{series}\n{}",
                m.render()
            );
        }
    }

    #[test]
    fn build_info_names_the_version_and_commit() {
        let m = Metrics::new();
        let series = format!(
            r#"envworker_build_info{{version="{}",git_sha="{GIT_SHA}"}}"#,
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(value(&m, &series), Some(1.0), "{}", m.render());
        assert!(m.render().contains("# TYPE envworker_build_info gauge"));
        assert!(
            m.render().ends_with("# EOF\n"),
            "the body is OpenMetrics, as CONTENT_TYPE says"
        );
    }
}
