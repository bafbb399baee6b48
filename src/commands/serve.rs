//! `envworker serve`: the webhook server, as a container or a Lambda function.

use std::sync::Arc;

use anyhow::{Context, bail};

use crate::cli::ServeArgs;
use crate::config::ServeFile;
use crate::metrics::Metrics;
use crate::serve::{AppState, Endpoint, Mode, lambda, serve_container};
use crate::webhook::SigningKey;
use crate::worker::poll::DrainOptions;
use crate::worker::{EnvironmentWorker, WorkerOptions};

/// The endpoints to serve: from the file, or the one default endpoint.
pub fn endpoints(args: &ServeArgs) -> anyhow::Result<Vec<Endpoint>> {
    endpoints_with_metrics(args, &Arc::default())
}

/// [`endpoints`] whose workers feed `metrics`.
pub fn endpoints_with_metrics(
    args: &ServeArgs,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Vec<Endpoint>> {
    match &args.config {
        None => Ok(vec![default_endpoint(args, metrics)?]),
        Some(path) => file_endpoints(args, path, metrics),
    }
}

/// The one endpoint the flags (or their variables) describe, named `default`.
fn default_endpoint(args: &ServeArgs, metrics: &Arc<Metrics>) -> anyhow::Result<Endpoint> {
    let environment_id = args
        .environment_id
        .clone()
        .filter(|v| !v.is_empty())
        .context("set ANTHROPIC_ENVIRONMENT_ID (or --environment-id), or give --config")?;
    let environment_key = args
        .environment_key
        .clone()
        .filter(|v| !v.is_empty())
        .context("set ANTHROPIC_ENVIRONMENT_KEY (or --environment-key), or give --config")?;
    let keys_text = args
        .signing_key
        .clone()
        .filter(|v| !v.trim().is_empty())
        .context("set ANTHROPIC_WEBHOOK_SIGNING_KEY (or --signing-key), or give --config")?;
    let keys = keys_text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|k| !k.is_empty())
        .map(SigningKey::parse)
        .collect::<Result<Vec<_>, _>>()
        .context("ANTHROPIC_WEBHOOK_SIGNING_KEY")?;
    let mut options = super::worker_options(&args.worker, &environment_id, Some(&environment_key))?;
    let concurrency = args.max_concurrent_items;
    prepare_worker("default", &mut options, concurrency, None, metrics)?;
    let worker = EnvironmentWorker::new(options)?;
    Ok(Endpoint::new(
        "default",
        keys,
        worker,
        DrainOptions {
            max_concurrent_items: args.max_concurrent_items,
            min_serving_time: args.min_serving_time,
            ..Default::default()
        },
    ))
}

/// Every endpoint of the endpoint file at `path`: the flags' options, each
/// with its endpoint's own settings.
fn file_endpoints(
    args: &ServeArgs,
    path: &std::path::Path,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Vec<Endpoint>> {
    let file = ServeFile::load(path)?;
    let resolved = file.resolve(&|name| std::env::var(name).ok())?;
    let base_url = file
        .base_url
        .clone()
        .unwrap_or_else(|| args.worker.base_url.clone());
    // Every endpoint's secrets are kept from every endpoint's agent: one
    // team's shell must not read another team's keys.
    let all_secret_vars: Vec<String> = resolved
        .iter()
        .flat_map(|e| e.secret_env_vars.iter().cloned())
        .collect();
    let mut out = Vec::new();
    for endpoint in resolved {
        let mut options = super::worker_options(
            &args.worker,
            &endpoint.environment_id,
            Some(endpoint.environment_key.expose()),
        )?;
        options.base_url = base_url.trim_end_matches('/').to_string();
        apply_endpoint_settings(&mut options, &endpoint);
        options.secret_env_vars = all_secret_vars.clone();
        let concurrency = endpoint.max_concurrent_items;
        prepare_worker(
            &endpoint.name,
            &mut options,
            concurrency,
            Some(path),
            metrics,
        )?;
        let worker = EnvironmentWorker::new(options)
            .with_context(|| format!("endpoint {:?}", endpoint.name))?;
        out.push(Endpoint::new(
            endpoint.name.clone(),
            endpoint.signing_keys.clone(),
            worker,
            DrainOptions {
                max_concurrent_items: endpoint.max_concurrent_items,
                min_serving_time: args.min_serving_time,
                ..Default::default()
            },
        ));
    }
    Ok(out)
}

/// What an endpoint of the file sets overrides the flags; its shell
/// allowances and headers add to theirs.
fn apply_endpoint_settings(options: &mut WorkerOptions, endpoint: &crate::config::Endpoint) {
    if let Some(dir) = &endpoint.workdir {
        options.workdir = dir.clone();
    }
    if let Some(max_idle) = endpoint.max_idle {
        options.max_idle = max_idle;
    }
    if let Some(interval) = endpoint.memory_sync_interval {
        options.memory_sync_interval = interval;
    }
    if let Some(deletions) = endpoint.memory_sync_deletions {
        options.memory_sync_deletions = deletions;
    }
    if let Some(fresh) = endpoint.fresh_workdir {
        options.fresh_workdir = fresh;
    }
    if let Some(push) = endpoint.memory_push {
        options.memory_push = push;
    }
    if let Some(mode) = endpoint.shell_sandbox {
        options.shell_sandbox_mode = Some(mode);
    }
    let additions = &mut options.shell_additions;
    additions
        .read
        .extend(endpoint.shell_allow_read.iter().cloned());
    additions
        .write
        .extend(endpoint.shell_allow_write.iter().cloned());
    additions
        .tcp_ports
        .extend(endpoint.shell_allow_tcp.iter().copied());
    options.extra_headers.extend(endpoint.extra_headers.clone());
}

/// Before an endpoint's worker starts: its metrics, the folders and rooms a
/// dead process left, the shell sandbox decided, and the workdir announced.
fn prepare_worker(
    name: &str,
    options: &mut WorkerOptions,
    concurrency: usize,
    endpoint_file: Option<&std::path::Path>,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<()> {
    options.observers.push(metrics.for_endpoint(name));
    super::recover_left_folders(options);
    super::decide_sandbox(name, options, concurrency, endpoint_file, Some(metrics))?;
    super::sweep_left_rooms(options, options.fresh_workdir || concurrency > 1);
    super::announce_workdir(name, options, concurrency);
    Ok(())
}

/// The longest the spare supervisor and the sandbox's probe wait for the
/// start-up's look at the queues.
const START_UP_AT_MOST: std::time::Duration = std::time::Duration::from_millis(100);

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    super::become_subreaper();
    let metrics = Arc::new(Metrics::new());
    let endpoints = endpoints_with_metrics(&args, &metrics)?;
    let secret_vars = secret_env_vars(&endpoints);
    if lambda::in_lambda() {
        let work = lambda::InvocationWork::default();
        let state = AppState::with_metrics(endpoints, Mode::Lambda(work.clone()), metrics);
        state.set_unready_after(args.unready_after);
        tracing::info!(endpoints = ?state.endpoint_names(), "serving webhooks on AWS Lambda");
        super::start_background_processes(&secret_vars);
        return lambda::run(state, work)
            .await
            .map_err(|e| anyhow::anyhow!("the Lambda runtime stopped: {e}"));
    }
    let state = AppState::with_metrics(endpoints, Mode::Container, metrics);
    state.set_queue_check_interval(args.queue_check_interval.0);
    state.set_unready_after(args.unready_after);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(listen.addr = %addr, endpoints = ?state.endpoint_names(), "serving webhooks");
    // Scripts and tests read the URL from this line (a JSON line with --log-format json).
    crate::logging::announce("envworker serve listening on", &format!("http://{addr}"));
    // The spare supervisor and the sandbox's probe wait for the start-up's
    // look at the queues (its first request: what `/readyz` waits for), or
    // START_UP_AT_MOST if that look finds work or the API does not answer.
    let looked = state.looked_at_start();
    tokio::spawn(async move {
        let _ = tokio::time::timeout(START_UP_AT_MOST, looked).await;
        super::start_background_processes(&secret_vars);
    });
    let clean = serve_container(listener, state, super::shutdown_signal(), args.stop_grace).await?;
    if !clean {
        bail!(
            "running work did not finish within the stop grace ({}s)",
            args.stop_grace.as_secs()
        );
    }
    tracing::info!("stopped");
    Ok(())
}

/// Every endpoint's secret variables (each endpoint's options hold them all).
fn secret_env_vars(endpoints: &[crate::serve::Endpoint]) -> Vec<String> {
    endpoints
        .iter()
        .flat_map(|e| e.worker.options().secret_env_vars.iter().cloned())
        .collect()
}
