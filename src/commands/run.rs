//! `envworker run`: serve one already-claimed work item — the entrypoint of
//! a sandbox started per session. Everything comes from `ANTHROPIC_*`
//! variables (or the matching flags); the item is heartbeated, served and
//! force-stopped exactly as the poller would.

use anyhow::bail;
use tokio_util::sync::CancellationToken;

use crate::api::types::Redacted;
use crate::cli::RunArgs;
use crate::worker::{EnvironmentWorker, ItemOutcome, WorkItem};

fn required(value: &Option<String>, what: &str, var: &str) -> anyhow::Result<String> {
    match value.as_deref().filter(|v| !v.is_empty()) {
        Some(v) => Ok(v.to_string()),
        None => bail!(
            "run: {what} is required — pass --{} or set {var}",
            what.replace('_', "-")
        ),
    }
}

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    super::become_subreaper();
    let work_id = required(&args.work_id, "work_id", "ANTHROPIC_WORK_ID")?;
    let environment_id = required(
        &args.environment_id,
        "environment_id",
        "ANTHROPIC_ENVIRONMENT_ID",
    )?;
    let session_id = required(&args.session_id, "session_id", "ANTHROPIC_SESSION_ID")?;
    let secret = args.work_secret.clone().filter(|s| !s.is_empty());
    if secret.is_none() && args.environment_key.as_deref().is_none_or(str::is_empty) {
        bail!(
            "run: environment_key is required when no work secret is given — pass --environment-key or set ANTHROPIC_ENVIRONMENT_KEY"
        );
    }
    let mut options = super::worker_options(
        &args.worker,
        &environment_id,
        args.environment_key.as_deref(),
    )?;
    super::decide_sandbox("run", &mut options, 1, None, None)?;
    crate::sandbox::probe::start_namespace_probe();
    super::recover_left_folders(&options);
    super::sweep_left_rooms(&options, options.fresh_workdir);
    let worker = EnvironmentWorker::new(options)?;
    let item = WorkItem {
        id: work_id,
        environment_id,
        kind: "session".into(),
        data_id: session_id,
        secret: secret.map(Redacted::new),
        // Handed over already claimed: its wait is the poller's to measure.
        queued_for: None,
    };
    let cancel = CancellationToken::new();
    let on_signal = cancel.clone();
    tokio::spawn(async move {
        super::shutdown_signal().await;
        tracing::info!("signal received: ending the session; the teardown still flushes memory");
        on_signal.cancel();
    });
    let report = worker.handle_item(item, cancel, None).await;
    match report.outcome {
        ItemOutcome::Failed(why) => bail!("the work item failed: {why}"),
        _ => Ok(()),
    }
}
