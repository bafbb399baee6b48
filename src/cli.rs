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
}
