//! The command line. Every flag also reads an environment variable, so the
//! same binary is configured the same way in a shell, a container or Lambda.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::logging::LogFormat;
use crate::memory::options::{DeleteMode, SyncInterval};

pub mod reference;

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
    /// Try everything locally: devserver + webhook server + worker, running the demo scenario.
    #[cfg(feature = "devserver")]
    Dev(DevArgs),
    /// Serve signed webhooks and drain the work queue (container, or AWS Lambda when detected).
    Serve(ServeArgs),
    /// Poll an environment's work queue and serve its sessions (always-on).
    Poll(PollArgs),
    /// Serve one already-claimed work item from ANTHROPIC_* variables (a sandbox's entrypoint).
    Run(RunArgs),
    /// Run a local control plane that answers as the Managed Agents API does (SQLite-backed).
    #[cfg(feature = "devserver")]
    Devserver(DevserverArgs),
    /// Sign webhook bodies for local testing and sample events.
    #[command(subcommand)]
    Webhook(WebhookCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    Completions(CompletionsArgs),
    /// Write the man pages: envworker.1 and one page per subcommand (envworker-serve.1, …).
    Man(ManArgs),
}

/// `envworker completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `envworker man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// The directory the pages are written to (created if missing).
    #[arg(long, default_value = ".")]
    pub out: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum WebhookCommand {
    /// Sign a webhook body: print Standard Webhooks headers and a ready curl line.
    Sign(SignArgs),
}

/// `envworker webhook sign`.
#[derive(Debug, Args)]
pub struct SignArgs {
    /// The signing key (whsec_…).
    #[arg(long, env = "ANTHROPIC_WEBHOOK_SIGNING_KEY", hide_env_values = true)]
    pub(crate) key: String,

    /// The body to sign (a JSON webhook event); `-` reads stdin.
    pub(crate) file: PathBuf,

    /// The URL in the printed curl line.
    #[arg(long, default_value = "http://127.0.0.1:8080/webhooks/default")]
    pub(crate) url: String,

    /// The webhook-id. Default: the body's `id`, else a fresh one.
    #[arg(long)]
    pub id: Option<String>,
}

/// Options of the worker, shared by `serve`, `poll` and `run`.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// The API to talk to (point it at `envworker devserver` for local runs).
    #[arg(long, env = "ANTHROPIC_BASE_URL", default_value = crate::api::DEFAULT_BASE_URL)]
    pub(crate) base_url: String,

    /// The agent's working directory, with whatever it holds (a checked-out project, a dataset):
    /// the shell's cwd and the file tools' base; skills land in its `skills/`, stores without a
    /// mount path in its `memory/`. Default: the current directory.
    ///
    /// As with the official worker, `bash` starts there and the file tools resolve relative paths
    /// against it; a skill lands in `skills/<name>/`, a store without a mount path in
    /// `memory/<name>/`. Created when missing.
    #[arg(long, env = "ENVWORKER_WORKDIR")]
    pub workdir: Option<PathBuf>,

    /// Give each work item a fresh, empty, private `session-<random>` directory under the workdir
    /// as its working directory, removed at the item's end, instead of the workdir itself (on by
    /// itself when --max-concurrent-items is above 1).
    ///
    /// Off, the sessions of a replica share the workdir one after another: what one leaves there,
    /// the next sees (the official worker's behaviour). `serve` says which at start.
    #[arg(long, env = "ENVWORKER_FRESH_WORKDIR", value_parser = clap::builder::BoolishValueParser::new(), num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub(crate) fresh_workdir: bool,

    /// Upload what the agent writes to a memory store within about a second, instead of at the
    /// next sync: each edit burst becomes its own memory version, and write requests grow with the
    /// agent's edit rate (they count against the organisation's rate limits).
    #[arg(long, env = "ENVWORKER_MEMORY_PUSH", value_parser = clap::builder::BoolishValueParser::new(), num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub(crate) memory_push: bool,

    /// Confine the agent's shell with Landlock (and a private mount namespace where the kernel
    /// allows): off, auto (what the kernel offers) or require (all of it, or no start). Default: off
    /// with one session at a time, require with --max-concurrent-items above 1.
    ///
    /// The mount namespace gives the shell a private `/tmp`, `/dev/shm` and `/mnt/memory`.
    #[arg(long, env = "ENVWORKER_SHELL_SANDBOX", value_enum)]
    pub(crate) shell_sandbox: Option<crate::sandbox::Mode>,

    /// A path the sandboxed shell may read and execute (repeatable; the variable takes a
    /// comma-separated list): a toolchain, a cache, ~/.gitconfig.
    #[arg(
        long,
        env = "ENVWORKER_SHELL_ALLOW_READ",
        value_name = "PATH",
        value_delimiter = ','
    )]
    pub(crate) shell_allow_read: Vec<PathBuf>,

    /// A path the sandboxed shell may write (repeatable; comma-separated in the variable): a
    /// shared cache such as a pip or cargo directory.
    #[arg(
        long,
        env = "ENVWORKER_SHELL_ALLOW_WRITE",
        value_name = "PATH",
        value_delimiter = ','
    )]
    pub(crate) shell_allow_write: Vec<PathBuf>,

    /// Restrict the sandboxed shell's TCP to these ports, bind and connect (repeatable;
    /// comma-separated in the variable; Landlock ABI 4). Default: TCP unrestricted.
    #[arg(
        long,
        env = "ENVWORKER_SHELL_ALLOW_TCP",
        value_name = "PORT",
        value_delimiter = ','
    )]
    pub(crate) shell_allow_tcp: Vec<u16>,

    /// Stop serving a session this long after its turn ended with no new event, at most 24h (`off` never stops).
    #[arg(long, env = "ENVWORKER_MAX_IDLE", default_value = "60s")]
    pub(crate) max_idle: crate::config::MaxIdle,

    /// How often memory stores sync while the agent works: `15s`, `5`, `1m`, or `off` (no memory). 5s–24h.
    #[arg(long, env = "ENVWORKER_MEMORY_SYNC_INTERVAL", default_value = "15s")]
    pub(crate) memory_sync_interval: SyncInterval,

    /// Whether local deletions reach the server: enabled, log_only or disabled.
    #[arg(
        long,
        env = "ENVWORKER_MEMORY_SYNC_DELETIONS",
        default_value = "enabled"
    )]
    pub(crate) memory_sync_deletions: DeleteMode,

    /// The bound of the final memory sync, and separately of the flush, when a session ends (1s–1h).
    #[arg(long, env = "ENVWORKER_MEMORY_TEARDOWN_BOUND", default_value = "30s", value_parser = crate::config::parse_memory_teardown_bound)]
    pub(crate) memory_teardown_bound: Duration,

    /// The bound of one tool call (1s–24h).
    #[arg(long, env = "ENVWORKER_TOOL_TIMEOUT", default_value = "120s", value_parser = crate::config::parse_tool_timeout)]
    pub(crate) tool_timeout: Duration,

    /// On SIGTERM, how long the tool call in flight may run on before it is cut off and answered with an error (0s–1h).
    #[arg(long, env = "ENVWORKER_CALL_GRACE", default_value = "30s", value_parser = crate::config::parse_call_grace)]
    pub(crate) call_grace: Duration,

    /// Sent as Anthropic-Worker-ID on polls. Default: the host name, a dash and 12 random hex digits.
    #[arg(long, env = "ANTHROPIC_WORKER_ID")]
    pub(crate) worker_id: Option<String>,

    /// Mount stores advertised under FROM under TO instead, keeping FROM paths working for the
    /// agent (e.g. /mnt/memory=/tmp/mnt/memory where only /tmp is writable; the default on Lambda).
    #[arg(long, env = "ENVWORKER_MOUNT_REMAP", value_name = "FROM=TO")]
    pub(crate) mount_remap: Option<crate::remap::MountRemap>,

    /// Where each mounted memory store's sync state is journaled, so edits survive a killed worker.
    /// Keep it on a disk that outlives the process (an emptyDir, a volume, a warm Lambda's /tmp) and
    /// outside every path a sandboxed shell is granted. Default: $XDG_STATE_HOME/envworker, else
    /// ~/.local/state/envworker; on Lambda (or where neither can be made) envworker-UID in the
    /// temporary directory.
    ///
    /// Created 0700; refused if another user owns it or others can write to it. With the shell
    /// sandbox it also holds each session's own HOME and TMPDIR (`rooms/<session>/`). Keep it
    /// beside the mount paths, and not under /tmp when the shell is sandboxed.
    #[arg(long, env = "ENVWORKER_STATE_DIR")]
    pub(crate) state_dir: Option<PathBuf>,

    /// A header added to every API request, NAME=VALUE (repeatable). Added to those of
    /// ANTHROPIC_CUSTOM_HEADERS (`Name: value` lines); a --header replaces the variable's
    /// header of the same name.
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = parse_header)]
    pub(crate) headers: Vec<(String, String)>,
}

/// `ANTHROPIC_CUSTOM_HEADERS` as the official SDK (2.10) parses it: lines
/// split on `\n`; each line with a `:` is a header, its name and value
/// trimmed of whitespace, split at the first colon (a value may hold more);
/// a line without one is ignored; a later line replaces an earlier one of
/// the same name. One difference: the SDK's dict compares names by case
/// (`X-A` and `x-a` are two entries, both sent); HTTP names are
/// case-insensitive, so here the later one replaces the earlier.
pub fn parse_custom_headers(text: &str) -> Vec<(String, String)> {
    let mut headers: Vec<(String, String)> = Vec::new();
    for line in text.split('\n') {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        headers.push((name.to_string(), value.to_string()));
    }
    headers
}

/// The extra headers of a worker: those of `ANTHROPIC_CUSTOM_HEADERS`
/// (`env`), then the `--header` flags. A flag wins over the variable for
/// the same name, as the SDK's explicit `default_headers` win over the
/// variable; repeated flags of one name are all sent, as before.
pub fn worker_headers(env: Option<&str>, flags: &[(String, String)]) -> Vec<(String, String)> {
    let mut headers = env.map(parse_custom_headers).unwrap_or_default();
    headers.retain(|(name, _)| !flags.iter().any(|(f, _)| f.eq_ignore_ascii_case(name)));
    headers.extend(flags.iter().cloned());
    headers
}

fn parse_header(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not NAME=VALUE"))?;
    if name.trim().is_empty() {
        return Err(format!("{text:?} has an empty header name"));
    }
    Ok((name.trim().to_string(), value.to_string()))
}

/// `envworker serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (ignored on AWS Lambda).
    #[arg(long, env = "ENVWORKER_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,

    /// Endpoint file (TOML, one [[endpoint]] per route). Without it: one endpoint,
    /// POST /webhooks/default, from the ANTHROPIC_* variables.
    #[arg(long, env = "ENVWORKER_CONFIG")]
    pub(crate) config: Option<PathBuf>,

    /// The default endpoint's environment.
    #[arg(long, env = "ANTHROPIC_ENVIRONMENT_ID")]
    pub(crate) environment_id: Option<String>,

    /// The default endpoint's environment key.
    #[arg(long, env = "ANTHROPIC_ENVIRONMENT_KEY", hide_env_values = true)]
    pub(crate) environment_key: Option<String>,

    /// The default endpoint's signing key(s), whsec_…; several (rotation) separated by spaces or commas.
    #[arg(long, env = "ANTHROPIC_WEBHOOK_SIGNING_KEY", hide_env_values = true)]
    pub(crate) signing_key: Option<String>,

    /// Work items served at once per endpoint, 1–64 (default endpoint; the file sets its own).
    #[arg(long, env = "ENVWORKER_MAX_CONCURRENT_ITEMS", default_value = "1", value_parser = crate::config::parse_max_concurrent_items)]
    pub(crate) max_concurrent_items: usize,

    /// On Lambda: claim no item unless this much time is left beyond the teardown reserve
    /// (twice the memory teardown bound, plus 10s for the force-stop and 5s). 0s–15m.
    #[arg(long, env = "ENVWORKER_MIN_SERVING_TIME", default_value = "60s", value_parser = crate::config::parse_min_serving_time)]
    pub(crate) min_serving_time: Duration,

    /// Containers: how often an idle endpoint looks at its queue without a webhook, so work whose
    /// delivery was lost or refused is still served (1s–1h, or off).
    ///
    /// With `off`, only webhooks and the start look at the queue. On Lambda the template's
    /// one-minute schedule does this instead.
    #[arg(long, env = "ENVWORKER_QUEUE_CHECK_INTERVAL", default_value = "30s")]
    pub(crate) queue_check_interval: crate::config::QueueCheckInterval,

    /// After SIGTERM, how long running items get to end and flush before the process exits (1s–1h).
    #[arg(long, env = "ENVWORKER_STOP_GRACE", default_value = "75s", value_parser = crate::config::parse_stop_grace)]
    pub(crate) stop_grace: Duration,

    /// How long an endpoint's API may give no answer (or only 5xx) before /readyz answers 503
    /// (1s–1h). A refused environment key turns it 503 at once.
    #[arg(long, env = "ENVWORKER_UNREADY_AFTER", default_value = "60s", value_parser = crate::config::parse_unready_after)]
    pub(crate) unready_after: Duration,

    #[command(flatten)]
    pub(crate) worker: WorkerArgs,
}

/// `envworker poll`.
#[derive(Debug, Args)]
pub struct PollArgs {
    /// The environment whose work queue is polled.
    #[arg(long, env = "ANTHROPIC_ENVIRONMENT_ID")]
    pub(crate) environment_id: String,

    /// The environment's key.
    #[arg(long, env = "ANTHROPIC_ENVIRONMENT_KEY", hide_env_values = true)]
    pub(crate) environment_key: String,

    /// Hand each claimed item to this shell command instead of serving it here. It gets
    /// ANTHROPIC_WORK_ID, ANTHROPIC_ENVIRONMENT_ID, ANTHROPIC_SESSION_ID and
    /// ANTHROPIC_WORK_SECRET, and the work item as JSON on stdin.
    #[arg(long, env = "ENVWORKER_ON_WORK", value_name = "CMD")]
    pub(crate) on_work: Option<String>,

    #[command(flatten)]
    pub(crate) worker: WorkerArgs,
}

/// `envworker run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The claimed work item (required).
    #[arg(long, env = "ANTHROPIC_WORK_ID")]
    pub(crate) work_id: Option<String>,

    /// The work item's environment (required).
    #[arg(long, env = "ANTHROPIC_ENVIRONMENT_ID")]
    pub(crate) environment_id: Option<String>,

    /// The work item's session (required).
    #[arg(long, env = "ANTHROPIC_SESSION_ID")]
    pub(crate) session_id: Option<String>,

    /// Optional when the work secret carries a sessions token.
    #[arg(long, env = "ANTHROPIC_ENVIRONMENT_KEY", hide_env_values = true)]
    pub(crate) environment_key: Option<String>,

    /// The work item's `secret` (it carries the per-session token).
    #[arg(long, env = "ANTHROPIC_WORK_SECRET", hide_env_values = true)]
    pub(crate) work_secret: Option<String>,

    #[command(flatten)]
    pub(crate) worker: WorkerArgs,
}

/// `envworker dev`.
#[cfg(feature = "devserver")]
#[derive(Debug, Args)]
pub struct DevArgs {
    /// A scenario file to run. Default: the built-in demo (events/scenarios/two-stores-sync.json).
    #[arg(long)]
    pub(crate) scenario: Option<PathBuf>,

    /// Keep the temporary directory (database, workdir, mounts) and print where it is.
    #[arg(long)]
    pub(crate) keep: bool,
}

/// `envworker devserver`.
#[cfg(feature = "devserver")]
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

    /// Directory of the SQLite database, kept across restarts. Default: a fresh temporary one.
    #[arg(long, env = "ENVWORKER_DEVSERVER_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Where sessions mount their memory stores: mount_path = ROOT/SLUG, SLUG being the store name's slug.
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

    /// A fault to inject, e.g. 'POST /v1/memory_stores/*/memories/*:status=503,rate=0.5' (repeatable, at most 100).
    #[arg(long = "fault", value_name = "RULE")]
    pub faults: Vec<String>,

    /// Lease TTL of a work item in seconds (1–3600), unless a heartbeat asks for another.
    #[arg(long, env = "ENVWORKER_DEVSERVER_LEASE_TTL", default_value_t = 30)]
    pub lease_ttl: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    /// Each row: the variable's text, the headers the official SDK 2.10 takes
    /// from it (its `_client.py` parse, run by hand on the same input).
    #[test]
    fn custom_headers_parse_as_the_sdk_parses_them() {
        let table: &[(&str, &[(&str, &str)])] = &[
            ("", &[]),
            ("X-Team: a", &[("X-Team", "a")]),
            ("  X-Team  :   a b  ", &[("X-Team", "a b")]),
            ("X-A: 1\nX-B: 2", &[("X-A", "1"), ("X-B", "2")]),
            ("X-A: 1\r\nX-B: 2\r\n", &[("X-A", "1"), ("X-B", "2")]),
            (
                "X-Url: http://proxy:8080/x",
                &[("X-Url", "http://proxy:8080/x")],
            ),
            ("no colon here\nX-A: 1\n\n", &[("X-A", "1")]),
            ("X-A:", &[("X-A", "")]),
            ("X-A: 1\nX-A: 2", &[("X-A", "2")]),
            // The SDK keeps both spellings; here the later wins (see above).
            ("X-A: 1\nx-a: 2", &[("x-a", "2")]),
        ];
        for (text, expected) in table {
            assert_eq!(parse_custom_headers(text), pairs(expected), "{text:?}");
        }
    }

    #[test]
    fn a_header_flag_wins_over_the_variable_for_the_same_name() {
        let flags = pairs(&[("x-both", "flag"), ("X-Flag", "1"), ("X-Flag", "2")]);
        let merged = worker_headers(Some("X-Both: env\nX-Env: e"), &flags);
        assert_eq!(
            merged,
            pairs(&[
                ("X-Env", "e"),
                ("x-both", "flag"),
                ("X-Flag", "1"),
                ("X-Flag", "2"),
            ])
        );
        assert_eq!(worker_headers(None, &flags), flags);
        assert_eq!(
            worker_headers(Some("X-Env: e"), &[]),
            pairs(&[("X-Env", "e")])
        );
    }
}
