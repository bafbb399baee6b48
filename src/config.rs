//! Configuration shared by every mode: the bounds of the numeric options
//! (durations parsed by [`crate::duration`]), and the endpoint file of `envworker serve` (one TOML file, many
//! endpoints, each with its own keys, environment, workdir and sync options).
//!
//! Secrets never sit in the file: it names the environment variables that
//! hold them (`signing_keys_env`, `environment_key_env`), so the file can be
//! committed, templated and logged.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::api::types::Redacted;
use crate::duration::{parse_duration, parse_duration_within, show_duration};
use crate::memory::options::{DeleteMode, SyncInterval};
use crate::webhook::SigningKey;

/// Bounds of the numeric options (README, "Bounds"). Each is checked where
/// the value is parsed, so a bad value stops the process at start with a
/// message naming the option and its range, never a panic or an overflow.
pub(crate) mod bounds {
    use std::time::Duration;

    /// Work items per endpoint at once (`--max-concurrent-items`, `max_concurrent_items`).
    pub(crate) const MAX_CONCURRENT_ITEMS: usize = 64;
    /// `--max-idle` / `max_idle` (`off` disables it).
    pub(crate) const MAX_IDLE: Duration = Duration::from_secs(24 * 3600);
    /// `--tool-timeout`.
    pub(crate) const TOOL_TIMEOUT: (Duration, Duration) =
        (Duration::from_secs(1), Duration::from_secs(24 * 3600));
    /// `--call-grace`.
    pub(crate) const CALL_GRACE: (Duration, Duration) = (Duration::ZERO, Duration::from_secs(3600));
    /// `--stop-grace`.
    pub(crate) const STOP_GRACE: (Duration, Duration) =
        (Duration::from_secs(1), Duration::from_secs(3600));
    /// `--unready-after`.
    pub(crate) const UNREADY_AFTER: (Duration, Duration) =
        (Duration::from_secs(1), Duration::from_secs(3600));
    /// `--min-serving-time` (a Lambda invocation lasts at most 15 minutes).
    pub(crate) const MIN_SERVING_TIME: (Duration, Duration) =
        (Duration::ZERO, Duration::from_secs(15 * 60));
    /// `--queue-check-interval` (`off` disables it): at least a second, so an
    /// idle replica cannot poll the API in a loop; at most an hour, so a lost
    /// webhook is served the same hour.
    pub(crate) const QUEUE_CHECK_INTERVAL: (Duration, Duration) =
        (Duration::from_secs(1), Duration::from_secs(3600));
    /// `--memory-teardown-bound` (also checked by the worker's options).
    pub(crate) const MEMORY_TEARDOWN_BOUND: (Duration, Duration) = (
        Duration::from_secs(1),
        crate::memory::options::MAX_TEARDOWN_BOUND,
    );
    /// The endpoint file's size.
    pub(crate) const ENDPOINT_FILE_BYTES: u64 = 1024 * 1024;
    /// Endpoints in the endpoint file.
    pub(crate) const ENDPOINTS: usize = 64;
}

pub(crate) fn parse_tool_timeout(text: &str) -> Result<Duration, String> {
    parse_duration_within(text, bounds::TOOL_TIMEOUT)
}

pub(crate) fn parse_call_grace(text: &str) -> Result<Duration, String> {
    parse_duration_within(text, bounds::CALL_GRACE)
}

pub(crate) fn parse_stop_grace(text: &str) -> Result<Duration, String> {
    parse_duration_within(text, bounds::STOP_GRACE)
}

pub(crate) fn parse_unready_after(text: &str) -> Result<Duration, String> {
    parse_duration_within(text, bounds::UNREADY_AFTER)
}

pub(crate) fn parse_min_serving_time(text: &str) -> Result<Duration, String> {
    parse_duration_within(text, bounds::MIN_SERVING_TIME)
}

/// How often an idle endpoint looks at its queue without a webhook: a
/// duration, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueCheckInterval(pub Option<Duration>);

impl std::str::FromStr for QueueCheckInterval {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "off" | "none" | "disabled" => Ok(QueueCheckInterval(None)),
            other => parse_duration_within(other, bounds::QUEUE_CHECK_INTERVAL)
                .map(|d| QueueCheckInterval(Some(d)))
                .map_err(|e| format!("{e} (or off)")),
        }
    }
}

pub(crate) fn parse_memory_teardown_bound(text: &str) -> Result<Duration, String> {
    parse_duration_within(text, bounds::MEMORY_TEARDOWN_BOUND)
}

/// Work items at once: 1 to [`bounds::MAX_CONCURRENT_ITEMS`].
pub(crate) fn parse_max_concurrent_items(text: &str) -> Result<usize, String> {
    let n: usize = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number"))?;
    check_max_concurrent_items(n)
}

pub(crate) fn check_max_concurrent_items(n: usize) -> Result<usize, String> {
    if !(1..=bounds::MAX_CONCURRENT_ITEMS).contains(&n) {
        return Err(format!(
            "{n} is out of range: it must be between 1 and {}",
            bounds::MAX_CONCURRENT_ITEMS
        ));
    }
    Ok(n)
}

/// The endpoint file could not be used; the message names the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: the endpoint file is larger than {max} bytes", max = bounds::ENDPOINT_FILE_BYTES)]
    TooLarge { path: String },
    #[error("endpoint {endpoint:?}: {message}")]
    Endpoint { endpoint: String, message: String },
}

/// Where a key of the endpoint file sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileTable {
    /// The file's top level.
    Top,
    /// Each `[[endpoint]]`.
    Endpoint,
}

/// One key of the endpoint file, as the configuration reference shows it:
/// the one place its type, default and meaning are written (a test holds
/// this table and [`ServeFile`]/[`EndpointFile`] to the same keys).
#[derive(Debug, Clone, Copy)]
pub struct FileKey {
    pub table: FileTable,
    pub key: &'static str,
    /// The TOML type, in words.
    pub kind: &'static str,
    /// `None`: the key is required.
    pub default: Option<&'static str>,
    /// A value as the reference's example writes it (TOML).
    pub example: &'static str,
    pub meaning: &'static str,
}

const fn key(
    table: FileTable,
    key: &'static str,
    kind: &'static str,
    default: Option<&'static str>,
    example: &'static str,
    meaning: &'static str,
) -> FileKey {
    FileKey {
        table,
        key,
        kind,
        default,
        example,
        meaning,
    }
}

/// Every key of the endpoint file, in the order the reference shows them.
pub const FILE_KEYS: &[FileKey] = {
    use FileTable::{Endpoint as E, Top as T};
    &[
        key(
            T,
            "base_url",
            "string",
            Some("`--base-url`"),
            r#""https://api.anthropic.com""#,
            "The API every endpoint talks to.",
        ),
        key(
            E,
            "name",
            "string",
            None,
            r#""research""#,
            "The route, `POST /webhooks/<name>`: 1–64 letters, digits, `-` or `_`, unique in the file.",
        ),
        key(
            E,
            "signing_keys_env",
            "array of strings",
            None,
            r#"["RESEARCH_WHSEC", "RESEARCH_WHSEC_NEXT"]"#,
            "The variables holding the endpoint's `whsec_…` signing keys (one at least; several during a rotation).",
        ),
        key(
            E,
            "environment_id",
            "string",
            None,
            r#""env_01…""#,
            "The environment whose work queue the endpoint drains.",
        ),
        key(
            E,
            "environment_key_env",
            "string",
            None,
            r#""RESEARCH_ENV_KEY""#,
            "The variable holding the environment key.",
        ),
        key(
            E,
            "workdir",
            "string",
            Some("`--workdir`"),
            r#""/workspace/research""#,
            "The agent's working directory (an absolute path).",
        ),
        key(
            E,
            "fresh_workdir",
            "boolean",
            Some("`--fresh-workdir`"),
            "true",
            "Each item in a fresh, private directory of its own under the workdir.",
        ),
        key(
            E,
            "max_idle",
            "string (duration or `off`)",
            Some("`--max-idle`"),
            r#""60s""#,
            "Stop serving a session this long after its turn ended.",
        ),
        key(
            E,
            "memory_sync_interval",
            "string (duration or `off`)",
            Some("`--memory-sync-interval`"),
            r#""15s""#,
            "How often memory stores sync while the agent works.",
        ),
        key(
            E,
            "memory_sync_deletions",
            "string",
            Some("`--memory-sync-deletions`"),
            r#""log_only""#,
            "`enabled`, `log_only` or `disabled`: whether local deletions reach the server.",
        ),
        key(
            E,
            "memory_push",
            "boolean",
            Some("`--memory-push`"),
            "false",
            "The change-driven push: upload what the agent writes within about a second.",
        ),
        key(
            E,
            "shell_sandbox",
            "string",
            Some("`--shell-sandbox` (`off` at one item at a time, `require` above)"),
            r#""require""#,
            "`off`, `auto` or `require`: the agent's shell confined.",
        ),
        key(
            E,
            "shell_allow_read",
            "array of strings",
            Some("none"),
            r#"["/opt/toolchain"]"#,
            "Paths a sandboxed shell may also read and execute, added to `--shell-allow-read`.",
        ),
        key(
            E,
            "shell_allow_write",
            "array of strings",
            Some("none"),
            r#"["/var/cache/pip"]"#,
            "Paths a sandboxed shell may also write, added to `--shell-allow-write`.",
        ),
        key(
            E,
            "shell_allow_tcp",
            "array of integers",
            Some("none"),
            "[5432]",
            "TCP ports a sandboxed shell may bind and connect to, added to `--shell-allow-tcp`.",
        ),
        key(
            E,
            "max_concurrent_items",
            "integer",
            Some("`1`"),
            "2",
            "Work items served at once by this endpoint; above 1, each item gets a fresh directory.",
        ),
        key(
            E,
            "extra_headers",
            "table of strings",
            Some("none"),
            r#"{ "x-team" = "research" }"#,
            "Headers added to every API request of this endpoint.",
        ),
    ]
};

/// `[[endpoint]]` as written in the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointFile {
    /// The route: `POST /webhooks/<name>`.
    pub name: String,
    /// Variables holding the `whsec_` signing keys (several during a rotation).
    pub signing_keys_env: Vec<String>,
    pub environment_id: String,
    /// The variable holding the environment key.
    pub environment_key_env: String,
    #[serde(default)]
    pub workdir: Option<PathBuf>,
    #[serde(default)]
    pub max_idle: Option<String>,
    #[serde(default)]
    pub memory_sync_interval: Option<String>,
    #[serde(default)]
    pub memory_sync_deletions: Option<String>,
    #[serde(default)]
    pub max_concurrent_items: Option<usize>,
    /// Each item in a fresh directory of its own (`--fresh-workdir`).
    #[serde(default)]
    pub fresh_workdir: Option<bool>,
    /// The change-driven push (`--memory-push`).
    #[serde(default)]
    pub memory_push: Option<bool>,
    /// The shell's sandbox (`--shell-sandbox`): off, auto or require.
    #[serde(default)]
    pub shell_sandbox: Option<crate::sandbox::Mode>,
    /// Added to `--shell-allow-read`.
    #[serde(default)]
    pub shell_allow_read: Vec<PathBuf>,
    /// Added to `--shell-allow-write`.
    #[serde(default)]
    pub shell_allow_write: Vec<PathBuf>,
    /// Added to `--shell-allow-tcp`.
    #[serde(default)]
    pub shell_allow_tcp: Vec<u16>,
    /// Headers added to every API request of this endpoint.
    #[serde(default)]
    pub extra_headers: BTreeMap<String, String>,
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeFile {
    /// The API base URL (default: `ANTHROPIC_BASE_URL`, else the real API).
    #[serde(default)]
    pub base_url: Option<String>,
    #[serde(rename = "endpoint", default)]
    pub endpoints: Vec<EndpointFile>,
}

/// One endpoint, resolved and validated: secrets read, durations parsed.
#[derive(Clone)]
pub struct Endpoint {
    pub name: String,
    pub signing_keys: Vec<SigningKey>,
    pub environment_id: String,
    pub environment_key: Redacted,
    pub workdir: Option<PathBuf>,
    pub max_idle: Option<Option<Duration>>,
    pub memory_sync_interval: Option<SyncInterval>,
    pub memory_sync_deletions: Option<DeleteMode>,
    pub max_concurrent_items: usize,
    pub fresh_workdir: Option<bool>,
    pub memory_push: Option<bool>,
    pub shell_sandbox: Option<crate::sandbox::Mode>,
    pub shell_allow_read: Vec<PathBuf>,
    pub shell_allow_write: Vec<PathBuf>,
    pub shell_allow_tcp: Vec<u16>,
    pub extra_headers: Vec<(String, String)>,
    /// The variables this endpoint's secrets live in (kept from the agent's shell).
    pub secret_env_vars: Vec<String>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("name", &self.name)
            .field("environment_id", &self.environment_id)
            .field("signing_keys", &self.signing_keys.len())
            .field("workdir", &self.workdir)
            .finish_non_exhaustive()
    }
}

/// The idle end of a session as a flag takes it: a duration, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxIdle(pub Option<Duration>);

impl std::str::FromStr for MaxIdle {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_max_idle(s).map(MaxIdle)
    }
}

/// `off`/`none`/`0` disable the idle end; anything else is a duration.
pub(crate) fn parse_max_idle(text: &str) -> Result<Option<Duration>, String> {
    match text.trim() {
        "off" | "none" | "disabled" => Ok(None),
        other => {
            let d = parse_duration(other)?;
            if d > bounds::MAX_IDLE {
                return Err(format!(
                    "{other:?} is out of range: it must be at most {} (or off)",
                    show_duration(bounds::MAX_IDLE)
                ));
            }
            Ok((!d.is_zero()).then_some(d))
        }
    }
}

/// An endpoint name usable as one URL path segment.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl EndpointFile {
    /// This endpoint with `env`: its secrets read, its settings parsed and
    /// checked. The error says what is wrong with it.
    fn resolve(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Endpoint, String> {
        let signing_keys = self.signing_keys(env)?;
        if self.environment_id.is_empty() {
            return Err("environment_id is empty".into());
        }
        let environment_key = env(&self.environment_key_env)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                format!(
                    "the environment key variable {} is not set",
                    self.environment_key_env
                )
            })?;
        let max_idle = parsed("max_idle", self.max_idle.as_deref(), parse_max_idle)?;
        let memory_sync_interval = parsed(
            "memory_sync_interval",
            self.memory_sync_interval.as_deref(),
            str::parse::<SyncInterval>,
        )?;
        let memory_sync_deletions = parsed(
            "memory_sync_deletions",
            self.memory_sync_deletions.as_deref(),
            str::parse::<DeleteMode>,
        )?;
        if let Some(dir) = &self.workdir
            && !dir.is_absolute()
        {
            return Err(format!("workdir must be absolute (got {})", dir.display()));
        }
        let max_concurrent_items =
            check_max_concurrent_items(self.max_concurrent_items.unwrap_or(1))
                .map_err(|e| format!("max_concurrent_items: {e}"))?;
        let mut secret_env_vars = self.signing_keys_env.clone();
        secret_env_vars.push(self.environment_key_env.clone());
        Ok(Endpoint {
            name: self.name.clone(),
            signing_keys,
            environment_id: self.environment_id.clone(),
            environment_key: Redacted::new(environment_key),
            workdir: self.workdir.clone(),
            max_idle,
            memory_sync_interval,
            memory_sync_deletions,
            max_concurrent_items,
            fresh_workdir: self.fresh_workdir,
            memory_push: self.memory_push,
            shell_sandbox: self.shell_sandbox,
            shell_allow_read: self.shell_allow_read.clone(),
            shell_allow_write: self.shell_allow_write.clone(),
            shell_allow_tcp: self.shell_allow_tcp.clone(),
            extra_headers: self
                .extra_headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            secret_env_vars,
        })
    }

    /// The signing keys, each read from its variable (one at least).
    fn signing_keys(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Vec<SigningKey>, String> {
        if self.signing_keys_env.is_empty() {
            return Err("signing_keys_env names no variable".into());
        }
        let mut signing_keys = Vec::new();
        for var in &self.signing_keys_env {
            let value = env(var)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("the signing key variable {var} is not set"))?;
            signing_keys.push(
                SigningKey::parse(&value)
                    .map_err(|e| format!("the signing key in {var} is unusable: {e}"))?,
            );
        }
        Ok(signing_keys)
    }
}

/// An optional setting `field` of an endpoint, parsed when it is there.
fn parsed<T, E: std::fmt::Display>(
    field: &str,
    text: Option<&str>,
    parse: impl Fn(&str) -> Result<T, E>,
) -> Result<Option<T>, String> {
    text.map(parse)
        .transpose()
        .map_err(|e| format!("{field}: {e}"))
}

impl ServeFile {
    pub fn parse(path: &str, text: &str) -> Result<ServeFile, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_string(),
            message: e.to_string().trim().to_string(),
        })
    }

    pub fn load(path: &std::path::Path) -> Result<ServeFile, ConfigError> {
        let shown = path.display().to_string();
        let read = |source| ConfigError::Read {
            path: shown.clone(),
            source,
        };
        // Read at most the bound plus one byte, whatever the file's size.
        use std::io::Read;
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .map_err(read)?
            .take(bounds::ENDPOINT_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read)?;
        if bytes.len() as u64 > bounds::ENDPOINT_FILE_BYTES {
            return Err(ConfigError::TooLarge { path: shown });
        }
        let text = String::from_utf8(bytes).map_err(|_| ConfigError::Parse {
            path: shown.clone(),
            message: "the endpoint file is not UTF-8".into(),
        })?;
        ServeFile::parse(&shown, &text)
    }

    /// Resolve every endpoint with `env` (the process environment, or a map in tests).
    pub fn resolve(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Vec<Endpoint>, ConfigError> {
        if self.endpoints.len() > bounds::ENDPOINTS {
            return Err(ConfigError::Parse {
                path: "the endpoint file".into(),
                message: format!(
                    "it defines {} endpoints; at most {} are served",
                    self.endpoints.len(),
                    bounds::ENDPOINTS
                ),
            });
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        for file in &self.endpoints {
            let fail = |message: String| ConfigError::Endpoint {
                endpoint: file.name.clone(),
                message,
            };
            if !valid_name(&file.name) {
                return Err(fail("name must be 1-64 letters, digits, '-' or '_'".into()));
            }
            if !seen.insert(file.name.clone()) {
                return Err(fail("two endpoints have this name".into()));
            }
            out.push(file.resolve(env).map_err(fail)?);
        }
        if out.is_empty() {
            return Err(ConfigError::Parse {
                path: "the endpoint file".into(),
                message: "it defines no [[endpoint]]".into(),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    const FILE: &str = r#"
base_url = "http://127.0.0.1:8790"

[[endpoint]]
name = "team-a"
signing_keys_env = ["A_KEY", "A_OLD_KEY"]
environment_id = "env_a"
environment_key_env = "A_ENV_KEY"
workdir = "/workspace/a"
max_idle = "90s"
memory_sync_interval = "off"
memory_sync_deletions = "log_only"
max_concurrent_items = 2
fresh_workdir = true
memory_push = true
shell_sandbox = "auto"
shell_allow_read = ["/opt/toolchain"]
shell_allow_write = ["/var/cache/pip"]
shell_allow_tcp = [5432, 22]
extra_headers = { "x-team" = "a" }

[[endpoint]]
name = "team-b"
signing_keys_env = ["B_KEY"]
environment_id = "env_b"
environment_key_env = "B_ENV_KEY"
"#;

    #[test]
    fn an_endpoint_file_resolves_its_secrets_from_the_environment() {
        let file = ServeFile::parse("serve.toml", FILE).unwrap();
        let vars = env(&[
            ("A_KEY", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            ("A_OLD_KEY", "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ="),
            ("A_ENV_KEY", "sk-env-a"),
            ("B_KEY", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            ("B_ENV_KEY", "sk-env-b"),
        ]);
        let endpoints = file.resolve(&vars).unwrap();
        assert_eq!(endpoints.len(), 2);
        let a = &endpoints[0];
        assert_eq!(a.signing_keys.len(), 2);
        assert_eq!(a.environment_key.expose(), "sk-env-a");
        assert_eq!(a.max_idle, Some(Some(Duration::from_secs(90))));
        assert_eq!(a.memory_sync_interval, Some(SyncInterval::OFF));
        assert_eq!(a.memory_sync_deletions, Some(DeleteMode::LogOnly));
        assert_eq!(a.max_concurrent_items, 2);
        assert_eq!((a.fresh_workdir, a.memory_push), (Some(true), Some(true)));
        assert_eq!(a.shell_sandbox, Some(crate::sandbox::Mode::Auto));
        assert_eq!(a.shell_allow_read, [PathBuf::from("/opt/toolchain")]);
        assert_eq!(a.shell_allow_write, [PathBuf::from("/var/cache/pip")]);
        assert_eq!(a.shell_allow_tcp, [5432, 22]);
        assert_eq!(endpoints[1].shell_sandbox, None);
        assert_eq!(
            (endpoints[1].fresh_workdir, endpoints[1].memory_push),
            (None, None)
        );
        assert_eq!(
            a.extra_headers,
            vec![("x-team".to_string(), "a".to_string())]
        );
        assert_eq!(a.secret_env_vars, ["A_KEY", "A_OLD_KEY", "A_ENV_KEY"]);
        assert_eq!(endpoints[1].max_concurrent_items, 1);
        assert!(!format!("{a:?}").contains("sk-env-a"));
    }

    #[test]
    fn an_endpoint_file_refuses_inline_secrets_and_names_what_is_wrong() {
        let inline = FILE.replace(
            "signing_keys_env = [\"B_KEY\"]",
            "signing_key = \"whsec_x\"",
        );
        let err = ServeFile::parse("serve.toml", &inline)
            .unwrap_err()
            .to_string();
        assert!(err.contains("signing_key"), "{err}");
        let file = ServeFile::parse("serve.toml", FILE).unwrap();
        let err = file.resolve(&env(&[])).unwrap_err().to_string();
        assert_eq!(
            err,
            "endpoint \"team-a\": the signing key variable A_KEY is not set"
        );
        let err = file
            .resolve(&env(&[("A_KEY", "nope"), ("A_OLD_KEY", "whsec_c2VjcmV0")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("the signing key in A_KEY is unusable"),
            "{err}"
        );
        let bad = FILE.replace(
            "memory_sync_interval = \"off\"",
            "memory_sync_interval = \"2s\"",
        );
        let vars = env(&[
            ("A_KEY", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            ("A_OLD_KEY", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            ("A_ENV_KEY", "k"),
        ]);
        let err = ServeFile::parse("serve.toml", &bad)
            .unwrap()
            .resolve(&vars)
            .unwrap_err()
            .to_string();
        assert!(err.contains("memory_sync_interval"), "{err}");
        let dup = FILE.replace("team-b", "team-a");
        let err = ServeFile::parse("serve.toml", &dup)
            .unwrap()
            .resolve(&vars)
            .unwrap_err()
            .to_string();
        assert!(err.contains("two endpoints have this name"), "{err}");
    }

    /// The field names a derived `Deserialize` accepts, as serde hands
    /// them to `deserialize_struct` (renames applied).
    fn fields_of<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
        use serde::de::{Error as _, Visitor, value::Error};
        struct Recorder<'a>(&'a mut &'static [&'static str]);
        impl<'de> serde::Deserializer<'de> for Recorder<'_> {
            type Error = Error;
            fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
                Err(Error::custom("not a struct"))
            }
            fn deserialize_struct<V: Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, Error> {
                *self.0 = fields;
                Err(Error::custom("recorded"))
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
                byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
                identifier ignored_any
            }
        }
        let mut fields: &'static [&'static str] = &[];
        let _ = T::deserialize(Recorder(&mut fields));
        fields
    }

    /// The reference's key table and the structs the file is parsed into
    /// name the same keys: a key cannot be documented and refused, or
    /// accepted and undocumented.
    #[test]
    fn the_key_table_names_every_key_the_endpoint_file_takes() {
        let listed = |table: FileTable| -> Vec<&str> {
            let mut keys: Vec<&str> = FILE_KEYS
                .iter()
                .filter(|k| k.table == table)
                .map(|k| k.key)
                .collect();
            keys.sort_unstable();
            keys
        };
        let sorted = |fields: &[&'static str]| {
            let mut fields = fields.to_vec();
            fields.sort_unstable();
            fields
        };
        let mut top = listed(FileTable::Top);
        top.push("endpoint");
        top.sort_unstable();
        assert_eq!(sorted(fields_of::<ServeFile>()), top);
        assert_eq!(
            sorted(fields_of::<EndpointFile>()),
            listed(FileTable::Endpoint)
        );
        // Every example value has the key's type: one endpoint written
        // from the table parses.
        let mut file = String::new();
        for table in [FileTable::Top, FileTable::Endpoint] {
            if table == FileTable::Endpoint {
                file.push_str("[[endpoint]]\n");
            }
            for k in FILE_KEYS.iter().filter(|k| k.table == table) {
                file.push_str(&format!("{} = {}\n", k.key, k.example));
            }
        }
        let parsed = ServeFile::parse("example.toml", &file).unwrap();
        assert_eq!(parsed.endpoints.len(), 1, "{file}");
        // The keys without a default are exactly the ones the file must hold.
        for k in FILE_KEYS {
            let without: String = file
                .lines()
                .filter(|l| !l.starts_with(&format!("{} =", k.key)))
                .map(|l| format!("{l}\n"))
                .collect();
            match (k.default, ServeFile::parse("example.toml", &without)) {
                (None, Err(err)) => assert!(err.to_string().contains(k.key), "{}: {err}", k.key),
                (None, Ok(_)) => panic!("{} is listed as required but may be left out", k.key),
                (Some(_), Err(err)) => panic!("{} has a default but is required: {err}", k.key),
                (Some(_), Ok(_)) => {}
            }
        }
    }

    #[test]
    fn the_queue_check_interval_is_a_bounded_duration_or_off() {
        let parse = |t: &str| t.parse::<QueueCheckInterval>().map(|q| q.0);
        assert_eq!(parse("30s"), Ok(Some(Duration::from_secs(30))));
        assert_eq!(parse("off"), Ok(None));
        assert_eq!(parse("1h"), Ok(Some(Duration::from_secs(3600))));
        for bad in ["0", "999ms", "1h1s", "soon"] {
            assert!(parse(bad).is_err(), "{bad} was accepted");
        }
    }
}
