//! The agent toolset over a scratch tree, and the real binary serving a
//! scenario the way `poll --on-work 'exec envworker run …'` does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use envworker::tools::{ToolContext, ToolError, Toolset};
use serde_json::Value;
use tokio::time::Instant;

use super::Started;

/// A toolset over `<tmp>/work`, with `<tmp>/mem` (read-write) and `<tmp>/kb`
/// (read-only) as extra roots and `<tmp>/outside` beside them.
pub struct T {
    pub dir: tempfile::TempDir,
    pub tools: Toolset,
}

impl T {
    pub fn new() -> T {
        T::with(|_| {})
    }

    /// [`T::new`] after `tweak` changed the context; the toolset is built
    /// once, as at session start.
    pub fn with(tweak: impl FnOnce(&mut ToolContext)) -> T {
        let dir = tempfile::tempdir().unwrap();
        for d in ["work", "mem", "kb", "outside"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        let mut ctx = ToolContext::new(dir.path().join("work"));
        ctx.allowed_roots = vec![dir.path().join("mem"), dir.path().join("kb")];
        ctx.read_only_roots = vec![dir.path().join("kb")];
        ctx.bash_env = vec![("PATH".into(), "/usr/bin:/bin".into())];
        tweak(&mut ctx);
        T {
            tools: Toolset::new(ctx),
            dir,
        }
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn s(&self, rel: &str) -> String {
        self.p(rel).display().to_string()
    }

    pub async fn call(&self, name: &str, input: Value) -> Result<String, String> {
        self.call_for(name, input, Duration::from_secs(30)).await
    }

    pub async fn call_for(
        &self,
        name: &str,
        input: Value,
        bound: Duration,
    ) -> Result<String, String> {
        self.tools
            .run(name, input, Instant::now() + bound)
            .await
            .map(|o| o.text())
            .map_err(|ToolError { message }| message)
    }
}

/// Write `content` at `path`, creating its parents.
pub fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

/// `envworker poll --on-work COMMAND` for the scenario `started` on the
/// devserver at `url`, stderr piped; `command` typically ends in
/// `exec envworker run …`.
pub fn spawn_poll(url: &str, started: &Started, command: &str) -> Child {
    spawn_poll_limited(url, started, command, None)
}

/// [`spawn_poll`] with the poller's `RLIMIT_NOFILE` (soft, hard).
pub fn spawn_poll_limited(
    url: &str,
    started: &Started,
    command: &str,
    nofile: Option<(u64, u64)>,
) -> Child {
    let mut poll = Command::new(env!("CARGO_BIN_EXE_envworker"));
    if let Some((soft, hard)) = nofile {
        super::process::limit_nofile(&mut poll, soft, hard);
    }
    poll.args(["poll", "--on-work", command])
        .env_remove("ANTHROPIC_WORK_SECRET")
        .envs([
            ("ANTHROPIC_BASE_URL", url),
            ("ANTHROPIC_ENVIRONMENT_ID", started.environment_id.as_str()),
            (
                "ANTHROPIC_ENVIRONMENT_KEY",
                started.environment_key.as_str(),
            ),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}
