//! The `envworker` binary: parse the command line, set up logging, dispatch.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use envworker::cli::{Cli, Command, DevserverArgs};
use envworker::devserver::faults::FaultRule;
use envworker::devserver::{Devserver, DevserverConfig};
use envworker::logging;
use envworker::webhook::SigningKey;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    let result = match cli.command {
        Command::Devserver(args) => devserver(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "envworker failed");
            ExitCode::FAILURE
        }
    }
}

async fn devserver(args: DevserverArgs) -> anyhow::Result<()> {
    let mut config = DevserverConfig::new(args.admin_key)
        .mount_root(args.mount_root)
        .lease_ttl_seconds(args.lease_ttl);
    if let Some(dir) = args.data_dir {
        config = config.data_dir(dir);
    }
    if let (Some(url), Some(secret)) = (args.webhook_url, args.webhook_secret) {
        let key = SigningKey::parse(&secret).context("--webhook-secret")?;
        config = config.webhook(url, key);
    }
    for spec in &args.faults {
        config = config.fault(FaultRule::parse(spec).map_err(anyhow::Error::msg)?);
    }
    let server = Devserver::open(config).context("cannot start the devserver")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(listen.addr = %addr, db.path = %server.state().db().path().display(), "devserver listening");
    // Scripts and tests read the URL from this line.
    println!("envworker devserver listening on http://{addr}");
    std::io::stdout().flush().ok();
    server.serve(listener, shutdown_signal()).await?;
    tracing::info!("devserver stopped");
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
