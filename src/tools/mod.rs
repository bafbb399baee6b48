//! The agent toolset `agent_toolset_20260401`: `bash`, `read`, `write`,
//! `edit`, `glob`, `grep`, with the inputs, outputs and error texts of the
//! official SDKs.
//!
//! - [`paths`] — where the file tools may go: the workdir and the allowed
//!   roots, each opened once as a directory fd; a path is accepted when,
//!   its symlinks followed as the reference follows them, it lies inside
//!   one of them (read-only roots refuse writes);
//! - `resolve` — that resolution, from the roots' fds: each link read
//!   from its own descriptor and the walk restarted from the root its
//!   target lies under, never a name followed by the kernel;
//! - `files` — `read`, `write`, `edit`;
//! - `search` — `glob`, `grep` (built in);
//! - `bash` — the persistent shell;
//! - `lane` — where a file call runs: on the runtime thread while it is
//!   short, on the blocking pool when it may be long.
//!
//! Trust model: the file tools are confined to the workdir and the allowed
//! roots, whatever the agent renames or symlinks meanwhile; `bash` is not
//! (the sandbox around the worker confines it: it runs as the worker's user,
//! starts in the workdir by path, and can reach whatever that user can), but
//! its environment never carries the worker's credentials.

pub(crate) mod bash;
pub(crate) mod files;
mod glob_walk;
mod lane;
mod lines;
pub mod paths;
mod resolve;
pub(crate) mod search;
pub mod spare;
mod walk;

use std::path::PathBuf;

use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::time::Instant;

use self::bash::BashTool;
use self::paths::PathPolicy;

/// The names this toolset serves, in the reference's order.
pub(crate) const TOOL_NAMES: [&str; 6] = ["bash", "read", "write", "edit", "glob", "grep"];

/// A tool refused or failed; the text is what the agent reads (`is_error: true`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    pub message: String,
}

impl ToolError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        ToolError {
            message: message.into(),
        }
    }
}

/// What a tool returns: text, or content blocks (an image, a document).
#[derive(Debug, Clone, PartialEq)]
pub enum ToolOutput {
    Text(String),
    Blocks(Vec<Value>),
}

impl ToolOutput {
    /// As `user.tool_result` content: empty text reads `(no output)`.
    pub fn into_content(self) -> Vec<Value> {
        match self {
            ToolOutput::Text(t) if t.is_empty() => {
                vec![crate::api::types::text_block("(no output)")]
            }
            ToolOutput::Text(t) => vec![crate::api::types::text_block(t)],
            ToolOutput::Blocks(b) if b.is_empty() => {
                vec![crate::api::types::text_block("(no output)")]
            }
            ToolOutput::Blocks(b) => b,
        }
    }

    /// The text of the output (blocks other than text are summarised).
    pub fn text(&self) -> String {
        match self {
            ToolOutput::Text(t) => t.clone(),
            ToolOutput::Blocks(b) => b
                .iter()
                .map(|v| {
                    v.get("text")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("[{} block]", v["type"].as_str().unwrap_or("?")))
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// Decode a tool's input, naming the tool in the error.
pub(crate) fn parse_input<T: DeserializeOwned>(tool: &str, input: Value) -> Result<T, ToolError> {
    serde_json::from_value(input).map_err(|e| ToolError::new(format!("{tool}: invalid input: {e}")))
}

/// What a session runner needs from a set of tools.
pub trait ToolHandler: Send + Sync {
    /// Whether this handler answers tool calls named `name`; the others are
    /// left for another client to answer.
    fn owns(&self, name: &str) -> bool;

    /// Run one call, finishing by `deadline`.
    fn call<'a>(
        &'a self,
        name: &'a str,
        input: Value,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>>;

    /// Release what the tools hold (the shell); called once the session ends.
    fn close(&self) -> BoxFuture<'_, ()>;
}

/// Variables the agent's shell never inherits, beyond every `ANTHROPIC_*`
/// and `ENVWORKER_*` one: cloud credentials of the host, and the Lambda
/// runtime's address (the shell must not fetch the worker's invocations).
const HOST_SECRETS: [&str; 10] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_LAMBDA_RUNTIME_API",
    // The current invocation's trace header, set by the Lambda runtime
    // client per event: it names the invocation, not the session.
    "_X_AMZN_TRACE_ID",
    // ECS/EKS credential endpoints and tokens, web identity (IRSA).
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
];

/// The process environment without the worker's credentials: every
/// `ANTHROPIC_*` and `ENVWORKER_*` variable, every `OTEL_*` one (the
/// worker's collector, whose headers often carry a vendor's key, and its
/// telemetry identity), the host's cloud credentials, and the variables
/// named in `also_secret` (where a configuration file said a secret lives).
pub(crate) fn scrubbed_env(also_secret: &[String]) -> Vec<(String, String)> {
    scrub(
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        also_secret,
    )
}

/// `scrubbed_env` over any set of variables.
pub fn scrub(
    vars: impl Iterator<Item = (String, String)>,
    also_secret: &[String],
) -> Vec<(String, String)> {
    vars.filter(|(k, _)| {
        !k.starts_with("ANTHROPIC_")
            && !k.starts_with("ENVWORKER_")
            && !k.starts_with("OTEL_")
            && !HOST_SECRETS.contains(&k.as_str())
            && !also_secret.iter().any(|s| s == k)
    })
    .collect()
}

/// Where and how the toolset works.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub workdir: PathBuf,
    /// Directories (or files) outside the workdir the file tools may reach:
    /// the memory store folders.
    pub allowed_roots: Vec<PathBuf>,
    /// Where `write` and `edit` refuse: read-only memory stores.
    pub read_only_roots: Vec<PathBuf>,
    /// Cap of a whole-file `read` and of `edit`; `None` disables it.
    pub(crate) max_file_bytes: Option<u64>,
    /// The shell's environment, used verbatim.
    pub bash_env: Vec<(String, String)>,
    /// Advertised mount paths that really live elsewhere (Lambda).
    pub(crate) remap: Option<crate::remap::MountRemap>,
    /// Our own binary, to run the shell under `envworker __supervise` (see
    /// [`crate::cleanroom`]); `None`: the shell is its own subreaper.
    pub supervisor: Option<PathBuf>,
    /// The shell's sandbox (see [`crate::sandbox`]); `None`: unconfined.
    pub shell_sandbox: Option<crate::sandbox::ShellPolicy>,
}

impl ToolContext {
    /// A context for `workdir` with the scrubbed process environment.
    pub fn new(workdir: impl Into<PathBuf>) -> Self {
        ToolContext {
            workdir: workdir.into(),
            allowed_roots: Vec::new(),
            read_only_roots: Vec::new(),
            max_file_bytes: Some(files::DEFAULT_MAX_FILE_BYTES),
            bash_env: scrubbed_env(&[]),
            remap: None,
            supervisor: None,
            shell_sandbox: None,
        }
    }
}

/// The six tools bound to one session's context.
pub struct Toolset {
    policy: PathPolicy,
    max_file_bytes: Option<u64>,
    bash: BashTool,
    remap: Option<crate::remap::MountRemap>,
}

impl Toolset {
    pub fn new(ctx: ToolContext) -> Self {
        Toolset {
            policy: PathPolicy::new(&ctx.workdir, ctx.allowed_roots, ctx.read_only_roots),
            max_file_bytes: ctx.max_file_bytes,
            bash: BashTool::new(ctx.workdir, ctx.bash_env, ctx.supervisor, ctx.shell_sandbox),
            remap: ctx.remap,
        }
    }

    /// Start the session's shell now, ahead of its first `bash` call: a
    /// confined shell's set-up then overlaps the runner's stream. The first
    /// call waits for it and uses it; a start that fails leaves the first
    /// call to start the shell (and report why); once closed, nothing starts.
    pub async fn start_shell_ahead(&self) {
        self.bash.start_ahead().await;
    }

    /// Run one call of a tool of this set; with a remap, paths in the input
    /// move to where the files are and paths in the answer move back.
    pub async fn run(
        &self,
        name: &str,
        mut input: Value,
        deadline: Instant,
    ) -> Result<ToolOutput, ToolError> {
        let Some(remap) = self.remap.clone() else {
            return self.run_here(name, input, deadline).await;
        };
        if let Some(obj) = input.as_object_mut() {
            for key in ["file_path", "path", "command"] {
                if let Some(Value::String(text)) = obj.get_mut(key) {
                    *text = remap.to_actual_text(text);
                }
            }
        }
        let back = |text: String| remap.to_advertised_text(&text);
        match self.run_here(name, input, deadline).await {
            Ok(ToolOutput::Text(t)) => Ok(ToolOutput::Text(back(t))),
            Ok(other) => Ok(other),
            Err(e) => Err(ToolError::new(back(e.message))),
        }
    }

    async fn run_here(
        &self,
        name: &str,
        input: Value,
        deadline: Instant,
    ) -> Result<ToolOutput, ToolError> {
        if name == "bash" {
            let out = self.bash.call(input, deadline).await;
            crate::killpoint::hit("tool.done");
            return out;
        }
        let max = self.max_file_bytes;
        let std_deadline =
            std::time::Instant::now() + deadline.saturating_duration_since(Instant::now());
        let run = |input, deadline| {
            lane::run_inline(|| file_call(name, &self.policy, max, input, deadline)).unwrap_or_else(
                |_| {
                    Err(ToolError::new(format!(
                        "{name}: the tool failed: it panicked"
                    )))
                },
            )
        };
        // Short calls run here; the rest, and a read-only call the budget
        // cut short, on the blocking pool (see `lane`).
        let input = match lane::inline_for(name, &input, max, files::is_media_path) {
            lane::Inline::No => input,
            lane::Inline::Bounded => {
                let out = run(input, std_deadline);
                crate::killpoint::hit("tool.done");
                return out;
            }
            lane::Inline::Budgeted => {
                let until = lane::budget_end(std_deadline);
                let out = run(input.clone(), until);
                if !lane::cut_by_budget(until, std_deadline) {
                    crate::killpoint::hit("tool.done");
                    return out;
                }
                input
            }
        };
        let policy = self.policy.clone();
        let name_owned = name.to_string();
        let out = tokio::task::spawn_blocking(move || {
            file_call(&name_owned, &policy, max, input, std_deadline)
        })
        .await
        .unwrap_or_else(|e| Err(ToolError::new(format!("{name}: the tool failed: {e}"))));
        // The call's effect is on disk; its result is not sent yet.
        crate::killpoint::hit("tool.done");
        out
    }
}

/// One call of a file tool, blocking: on the blocking pool, or inline
/// when [`lane`] allows it.
fn file_call(
    name: &str,
    policy: &PathPolicy,
    max_file_bytes: Option<u64>,
    input: Value,
    deadline: std::time::Instant,
) -> Result<ToolOutput, ToolError> {
    match name {
        "read" => files::read(policy, max_file_bytes, input, deadline),
        "write" => files::write(policy, input),
        "edit" => files::edit(policy, max_file_bytes, input),
        "glob" => search::glob(policy, input, deadline),
        "grep" => search::grep(policy, input, deadline),
        other => Err(ToolError::new(format!("unknown tool {other:?}"))),
    }
}

impl ToolHandler for Toolset {
    fn owns(&self, name: &str) -> bool {
        TOOL_NAMES.contains(&name)
    }

    fn call<'a>(
        &'a self,
        name: &'a str,
        input: Value,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(self.run(name, input, deadline))
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.bash.close())
    }
}
