//! The `envworker` binary: parse the command line, set up logging, dispatch.

use std::process::ExitCode;

#[cfg(feature = "devserver")]
use anyhow::Context;
use clap::Parser;
#[cfg(feature = "devserver")]
use envworker::cli::DevserverArgs;
use envworker::cli::{Cli, Command, WebhookCommand};
use envworker::commands;
#[cfg(feature = "devserver")]
use envworker::devserver::faults::FaultRule;
#[cfg(feature = "devserver")]
use envworker::devserver::{Devserver, DevserverConfig};
use envworker::logging;
#[cfg(feature = "devserver")]
use envworker::webhook::SigningKey;

fn main() -> ExitCode {
    // The agent's commands run as this process's user: keep them from
    // reading its environment (`/proc/<pid>/environ`: the keys) or
    // attaching to it. Children get a normal flag back at exec.
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // A session's supervisor (see `cleanroom`): no runtime, no logging.
    if args
        .get(1)
        .is_some_and(|a| a == envworker::cleanroom::SUPERVISE)
    {
        return envworker::cleanroom::supervise(&args[2..]);
    }
    // PID 1 in a container: be init for the real worker, our child.
    if let Some(code) = envworker::cleanroom::run_as_init() {
        return code;
    }
    let mut args = args;
    // Lambda starts `bootstrap` with no arguments: that means `serve`.
    if args.len() == 1 && envworker::serve::lambda::in_lambda() {
        args.push("serve".into());
    }
    let cli = Cli::parse_from(args);
    match commands::runtime::build(&cli.command) {
        Ok(runtime) => runtime.block_on(run(cli)),
        Err(e) => {
            eprintln!("envworker: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> ExitCode {
    // `dev` prints its own timeline; only warnings reach stderr unless RUST_LOG says otherwise.
    let default_filter = match cli.command {
        #[cfg(feature = "devserver")]
        Command::Dev(_) => "warn",
        _ => "info",
    };
    logging::init(cli.log_format, default_filter);
    // Connections and open files get every descriptor the hard limit allows;
    // the agent's shell gets the original limit back (see `fdlimit`).
    match envworker::fdlimit::raise_to_hard() {
        Ok(r) if r.before != r.after => tracing::debug!(
            fd_limit.before = ?r.before,
            fd_limit.after = ?r.after,
            "raised the descriptor limit to the hard limit"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot raise the descriptor limit"),
    }
    let result = match cli.command {
        #[cfg(feature = "devserver")]
        Command::Dev(args) => commands::dev::run(args).await,
        Command::Serve(args) => commands::serve::run(args).await,
        Command::Poll(args) => commands::poll::run(args).await,
        Command::Run(args) => commands::run::run(args).await,
        #[cfg(feature = "devserver")]
        Command::Devserver(args) => devserver(args).await,
        Command::Webhook(WebhookCommand::Sign(args)) => commands::sign::run(args),
        Command::Completions(args) => commands::completions::run(args),
        Command::Man(args) => commands::man::run(args),
    };
    // Spans still batched go out before the process ends (a no-op when off).
    envworker::telemetry::shutdown().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "envworker failed");
            // In JSON every line is JSON: the log line above says it all.
            if cli.log_format == logging::LogFormat::Text {
                eprintln!("envworker: {e:#}");
            }
            ExitCode::FAILURE
        }
    }
}

#[cfg(feature = "devserver")]
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
    // Scripts and tests read the URL from this line (JSON with --log-format json).
    logging::announce(
        "envworker devserver listening on",
        &format!("http://{addr}"),
    );
    server.serve(listener, commands::shutdown_signal()).await?;
    tracing::info!("devserver stopped");
    Ok(())
}
