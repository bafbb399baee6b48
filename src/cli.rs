//! The command line. Every flag also reads an environment variable, so the
//! same binary is configured the same way in a shell, a container or Lambda.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::logging::LogFormat;

/// A self-hosted environment worker for Claude Managed Agents.
#[derive(Debug, Parser)]
#[command(name = "envworker", version, about, long_about = None)]
pub struct Cli {
    /// Log format: human-readable text or one JSON object per line.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "ENVWORKER_LOG_FORMAT")]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a local control plane that answers as the Managed Agents API does (SQLite-backed).
    Devserver(DevserverArgs),
}

/// `envworker devserver`.
#[derive(Debug, Args)]
pub struct DevserverArgs {
    /// Address to listen on (port 0 picks a free port; the URL is printed on stdout).
    #[arg(
        long,
        env = "ENVWORKER_DEVSERVER_LISTEN",
        default_value = "127.0.0.1:8790"
    )]
    pub listen: SocketAddr,

    /// The organisation key clients send as `x-api-key`.
    #[arg(long, env = "ENVWORKER_DEVSERVER_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: String,

    /// Directory of the SQLite database, kept across restarts (default: a fresh temporary one).
    #[arg(long, env = "ENVWORKER_DEVSERVER_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Where sessions mount their memory stores: mount_path = <root>/<slug of the store name>.
    #[arg(
        long,
        env = "ENVWORKER_DEVSERVER_MOUNT_ROOT",
        default_value = "/mnt/memory"
    )]
    pub mount_root: String,

    /// Send signed session.status_run_started webhooks to this URL.
    #[arg(
        long,
        env = "ENVWORKER_DEVSERVER_WEBHOOK_URL",
        requires = "webhook_secret"
    )]
    pub webhook_url: Option<String>,

    /// The webhook signing secret (whsec_…).
    #[arg(
        long,
        env = "ENVWORKER_DEVSERVER_WEBHOOK_SECRET",
        hide_env_values = true,
        requires = "webhook_url"
    )]
    pub webhook_secret: Option<String>,

    /// A fault to inject, e.g. 'POST /v1/memory_stores/*/memories/*:status=503,rate=0.5' (repeatable).
    #[arg(long = "fault", value_name = "RULE")]
    pub faults: Vec<String>,

    /// Lease TTL of a work item in seconds, unless a heartbeat asks for another.
    #[arg(long, env = "ENVWORKER_DEVSERVER_LEASE_TTL", default_value_t = 30)]
    pub lease_ttl: i64,
}
