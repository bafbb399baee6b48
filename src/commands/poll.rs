//! `envworker poll`: the always-on worker, or a dispatcher with `--on-work`.
//!
//! With `--on-work CMD`, each claimed item is handed to `sh -c CMD` with
//! `ANTHROPIC_WORK_ID`, `ANTHROPIC_ENVIRONMENT_ID`, `ANTHROPIC_SESSION_ID`
//! and `ANTHROPIC_WORK_SECRET` set and the work item as JSON on stdin (the
//! command typically starts a sandbox that runs `envworker run`). Its
//! stdout is folded into stderr. The poller waits for it; on shutdown the
//! command gets SIGTERM and 30 s before SIGKILL. Non-session items are
//! force-stopped without running the command. A command that cannot be
//! started stops the poller.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::types::Work;
use crate::cli::PollArgs;
use crate::worker::EnvironmentWorker;
use crate::worker::poll::ItemHandler;

/// How long the `--on-work` command gets after SIGTERM before SIGKILL: an
/// `envworker run` child answers its call in flight (up to the call grace)
/// and then tears down (final sync, flush, force-stop), as this worker would.
fn child_stop_grace(worker: &EnvironmentWorker) -> Duration {
    let options = worker.options();
    options.call_grace + options.teardown_reserve()
}

pub async fn run(args: PollArgs) -> anyhow::Result<()> {
    super::become_subreaper();
    let mut options = super::worker_options(
        &args.worker,
        &args.environment_id,
        Some(&args.environment_key),
    )?;
    super::decide_sandbox("poll", &mut options, 1, None, None)?;
    super::recover_left_folders(&options);
    super::sweep_left_rooms(&options, options.fresh_workdir);
    if args.on_work.is_none() {
        super::announce_workdir("poll", &options, 1);
    }
    let worker = EnvironmentWorker::new(options)?;
    let cancel = CancellationToken::new();
    let on_signal = cancel.clone();
    tokio::spawn(async move {
        super::shutdown_signal().await;
        info!("signal received: finishing the current item, then stopping");
        on_signal.cancel();
    });
    match args.on_work {
        None => {
            super::start_background_processes(&worker.options().secret_env_vars);
            worker.run(cancel).await?
        }
        Some(command) => {
            crate::sandbox::probe::start_namespace_probe();
            let failed: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
            let stop_polling = CancellationToken::new();
            let handler: ItemHandler = {
                let (cancel, failed, stop_polling, worker) = (
                    cancel.clone(),
                    failed.clone(),
                    stop_polling.clone(),
                    worker.clone(),
                );
                Arc::new(move |work: Work| {
                    let (command, cancel, failed, stop_polling, worker) = (
                        command.clone(),
                        cancel.clone(),
                        failed.clone(),
                        stop_polling.clone(),
                        worker.clone(),
                    );
                    Box::pin(async move {
                        if let Err(e) = hand_off(&worker, &command, work, cancel).await {
                            *failed.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some(format!("{e:#}"));
                            stop_polling.cancel();
                        }
                    })
                })
            };
            let both = CancellationToken::new();
            let (a, b, c) = (cancel.clone(), stop_polling.clone(), both.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = a.cancelled() => {}
                    _ = b.cancelled() => {}
                }
                c.cancel();
            });
            worker.run_with(both, handler).await?;
            if let Some(e) = failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
                anyhow::bail!("{e}");
            }
        }
    }
    Ok(())
}

/// Run the `--on-work` command for one acknowledged item. `Err` only when
/// the command cannot be started (that stops the poller).
async fn hand_off(
    worker: &EnvironmentWorker,
    command: &str,
    work: Work,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    if !work.data.is_session() {
        info!(work_id = %work.id, kind = %work.data.kind, "skipping non-session work item");
        let item = crate::worker::WorkItem::from(work);
        worker.handle_item(item, cancel, None).await;
        return Ok(());
    }
    let json = serde_json::to_vec(&work)?;
    let mut sh = on_work_command(worker, command, &work);
    let spawned = crate::cleanroom::spawn_tracked(&mut sh);
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            force_stop(worker, &work).await;
            return Err(e)
                .with_context(|| format!("cannot start the --on-work command {command:?}"));
        }
    };
    if let Some(mut stdin) = child.stdin.take() {
        // A command that does not read its stdin must not block the poller.
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            let _ = stdin.write_all(&json).await;
            let _ = stdin.shutdown().await;
        })
        .await;
    }
    info!(work_id = %work.id, session_id = %work.data.id, "handed the item to the --on-work command");
    let status = wait_or_stop(worker, &mut child, &work, &cancel).await;
    // What the command left behind re-parented to us (a child subreaper).
    let orphans = tokio::task::spawn_blocking(crate::cleanroom::sweep_orphans)
        .await
        .unwrap_or(0);
    if orphans > 0 {
        info!(work_id = %work.id, processes = orphans, "killed what the --on-work command left running");
    }
    match status {
        Ok(s) if s.success() => info!(work_id = %work.id, "the --on-work command finished"),
        // The shell could not find or execute the command: no item will ever be served.
        Ok(s) if matches!(s.code(), Some(126 | 127)) => {
            force_stop(worker, &work).await;
            anyhow::bail!(
                "the --on-work command {command:?} cannot be run ({s}); the item was stopped"
            );
        }
        Ok(s) => warn!(work_id = %work.id, status = %s, "the --on-work command failed"),
        Err(e) => warn!(work_id = %work.id, error = %e, "cannot wait for the --on-work command"),
    }
    Ok(())
}

/// `sh -c CMD` for one item. The reference's contract, plus what an
/// `envworker run` inside needs: the API it talks to and the item's secret.
fn on_work_command(
    worker: &EnvironmentWorker,
    command: &str,
    work: &Work,
) -> tokio::process::Command {
    let options = worker.options();
    let mut sh = tokio::process::Command::new("/bin/sh");
    // The poller raised its descriptor limit for its own use; the command
    // (and the `envworker run` inside, which records the limit it finds as
    // the one to give the agent's shell) gets the limit we were started with.
    if let Some(original) = crate::fdlimit::original() {
        // SAFETY: one setrlimit syscall, async-signal-safe, no allocation.
        unsafe {
            sh.pre_exec(move || crate::fdlimit::restore_in_child(&original));
        }
    }
    sh.arg("-c")
        .arg(command)
        .env("ANTHROPIC_WORK_ID", &work.id)
        .env("ANTHROPIC_ENVIRONMENT_ID", &work.environment_id)
        .env("ANTHROPIC_SESSION_ID", &work.data.id)
        .env(
            "ANTHROPIC_ENVIRONMENT_KEY",
            options
                .environment_key
                .as_ref()
                .map(|k| k.expose())
                .unwrap_or_default(),
        )
        .env("ANTHROPIC_BASE_URL", &options.base_url)
        .env(
            "ANTHROPIC_WORK_SECRET",
            work.secret.as_ref().map(|s| s.expose()).unwrap_or_default(),
        )
        .stdin(Stdio::piped())
        .stdout(std::io::stderr())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    sh
}

/// The command's exit. On shutdown it gets SIGTERM, then its grace
/// ([`child_stop_grace`]) before it is killed.
async fn wait_or_stop(
    worker: &EnvironmentWorker,
    child: &mut tokio::process::Child,
    work: &Work,
    cancel: &CancellationToken,
) -> std::io::Result<std::process::ExitStatus> {
    tokio::select! {
        status = child.wait() => status,
        _ = cancel.cancelled() => {
            if let Some(pid) = child.id().and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
            let grace = child_stop_grace(worker);
            match tokio::time::timeout(grace, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    warn!(work_id = %work.id, grace_s = grace.as_secs(), "the --on-work command did not exit within its grace after SIGTERM; killing it");
                    let _ = child.kill().await;
                    child.wait().await
                }
            }
        }
    }
}

/// Stop an item nobody will serve (bounded; a failure is logged).
async fn force_stop(worker: &EnvironmentWorker, work: &Work) {
    let Some(key) = worker.options().environment_key.clone() else {
        return;
    };
    let client = worker.client(&key, "environments-work-poller");
    match tokio::time::timeout(
        Duration::from_secs(10),
        client.work(&work.environment_id).stop(&work.id, true),
    )
    .await
    {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(work_id = %work.id, error = %e, "force-stop failed"),
        Err(_) => warn!(work_id = %work.id, "force-stop failed: no answer within 10s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::WorkerOptions;

    #[test]
    fn the_on_work_command_gets_its_call_grace_and_its_teardown_after_sigterm() {
        let mut options = WorkerOptions::new("env_1", "http://127.0.0.1:9");
        options.call_grace = Duration::from_secs(30);
        let worker = EnvironmentWorker::new(options.clone()).unwrap();
        // 30 s to answer the call, then the teardown reserve (2 × 30 s + 15 s).
        assert_eq!(child_stop_grace(&worker), Duration::from_secs(30 + 75));
        options.call_grace = Duration::from_secs(90);
        let worker = EnvironmentWorker::new(options).unwrap();
        assert_eq!(child_stop_grace(&worker), Duration::from_secs(90 + 75));
    }
}
