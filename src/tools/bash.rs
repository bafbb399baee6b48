//! `bash`: one persistent `/bin/bash` per session, so the working directory,
//! variables and background jobs survive between calls.
//!
//! Each command runs as `{ cmd\n} </dev/null 2>&1` followed by a `printf` of
//! a per-call random sentinel and `$?`; the output is read up to that
//! sentinel. The sentinel is written split by `''`, so only the shell's own
//! `printf` can assemble it and a command cannot forge the end of its output.
//! The shell runs under the session's supervisor (see [`crate::cleanroom`]),
//! a child subreaper, so whatever it detaches (`setsid`, double forks,
//! another process group) stays in the supervisor's tree; a timeout, a
//! cancelled call or the end of the session freezes and kills that whole
//! tree, and the next call starts a fresh shell. Without a supervisor
//! binary (the library embedded elsewhere) the shell itself is made the
//! subreaper: the same tree kill, but what the agent detaches escapes if the
//! shell exits first.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use rand::RngExt;
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::Instant;

use super::{ToolError, ToolOutput};

/// Output kept per call; beyond it the tail is kept.
pub(crate) const BASH_OUTPUT_LIMIT: usize = 100 * 1024;
/// A command's timeout when the call gives none.
pub(crate) const BASH_DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// How a command failed to produce a result.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BashError {
    #[error("bash command timed out after {0}ms")]
    Timeout(u128),
    #[error("the shell exited{0}")]
    Exited(String),
    #[error("cannot start /bin/bash: {0}")]
    Spawn(std::io::Error),
    #[error("cannot talk to the shell: {0}")]
    Io(std::io::Error),
}

/// What a command printed (stdout and stderr together) and its exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BashResult {
    pub(crate) output: String,
    /// `-1` when the status could not be read.
    pub(crate) exit_code: i32,
}

/// A running `/bin/bash --noprofile --norc`.
pub(crate) struct BashSession {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    /// The root of the session's process tree: the supervisor (or the
    /// shell), also its process group; `None` once killed.
    root: Option<rustix::process::Pid>,
}

fn ansi() -> &'static regex::Regex {
    static ANSI: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    ANSI.get_or_init(|| regex::Regex::new(r"\x1b\[[0-9;?]*[ -/]*[@-~]").expect("valid regex"))
}

impl BashSession {
    /// Start a shell in `workdir` with exactly `env` (plus an empty prompt
    /// and `TERM=dumb`), under `supervisor` (our own binary, run as
    /// `envworker __supervise`) when given.
    pub(crate) async fn start(
        workdir: &std::path::Path,
        env: &[(String, String)],
        supervisor: Option<&std::path::Path>,
        sandbox: Option<&crate::sandbox::ShellPolicy>,
    ) -> Result<Self, BashError> {
        const SHELL: [&str; 3] = ["/bin/bash", "--noprofile", "--norc"];
        let shell_env = || {
            env.iter().map(|(k, v)| (k.as_str(), v.as_str())).chain([
                ("PS1", ""),
                ("PS2", ""),
                ("TERM", "dumb"),
            ])
        };
        // A spare supervisor started ahead (see `super::spare`) runs the
        // shell exactly as one started here would.
        if let Some(binary) = supervisor
            && let Some(spare) = super::spare::take(binary)
        {
            let launch = crate::cleanroom::Launch {
                cwd: workdir.to_path_buf(),
                env: shell_env().map(|(k, v)| (k.into(), v.into())).collect(),
                args: sandbox
                    .map(|p| p.to_args())
                    .unwrap_or_default()
                    .into_iter()
                    .chain(SHELL.map(std::ffi::OsString::from))
                    .collect(),
            };
            match Self::launch(spare, &launch).await {
                Ok(shell) => return Ok(shell),
                Err(e) => {
                    tracing::debug!(error = %e, "the spare shell supervisor did not take its launch; starting one");
                }
            }
        }
        let mut command = match supervisor {
            Some(binary) => {
                let mut c = Command::new(binary);
                c.arg0("envworker-supervisor")
                    .arg(crate::cleanroom::SUPERVISE)
                    .args(sandbox.map(|p| p.to_args()).unwrap_or_default())
                    .args(SHELL);
                c
            }
            None if sandbox.is_some() => {
                return Err(BashError::Spawn(std::io::Error::other(
                    "the shell's sandbox needs the supervisor",
                )));
            }
            None => {
                let mut c = Command::new(SHELL[0]);
                c.args(&SHELL[1..]);
                // SAFETY: one prctl syscall, async-signal-safe, no allocation.
                unsafe {
                    c.pre_exec(|| {
                        // Refused (seccomp): the shell runs anyway.
                        let _ =
                            rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
                        Ok(())
                    });
                }
                c
            }
        };
        crate::fdlimit::restore_on_exec(&mut command);
        command
            .current_dir(workdir)
            .env_clear()
            .envs(shell_env())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = crate::cleanroom::spawn_tracked(&mut command).map_err(BashError::Spawn)?;
        let root = child
            .id()
            .and_then(|id| rustix::process::Pid::from_raw(id as i32));
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(BashError::Io(std::io::Error::other(
                "no pipes to the shell",
            )));
        };
        Self::begin(child, stdin, stdout, root).await
    }

    /// A shell under the spare supervisor `spare`, given its `launch`.
    async fn launch(
        super::spare::Spare {
            child,
            mut stdin,
            stdout,
        }: super::spare::Spare,
        launch: &crate::cleanroom::Launch,
    ) -> Result<Self, BashError> {
        stdin
            .write_all(&launch.encode())
            .await
            .map_err(BashError::Io)?;
        let root = child
            .id()
            .and_then(|id| rustix::process::Pid::from_raw(id as i32));
        Self::begin(child, stdin, stdout, root).await
    }

    async fn begin(
        child: Child,
        mut stdin: ChildStdin,
        stdout: ChildStdout,
        root: Option<rustix::process::Pid>,
    ) -> Result<Self, BashError> {
        // From here on the shell's own messages (syntax errors) reach the output too.
        stdin
            .write_all(b"exec 2>&1\n")
            .await
            .map_err(BashError::Io)?;
        Ok(BashSession {
            child,
            stdin,
            stdout,
            root,
        })
    }

    /// Run `cmd`; on a timeout the caller must drop the session (it is killed).
    pub(crate) async fn exec(
        &mut self,
        cmd: &str,
        timeout: Duration,
    ) -> Result<BashResult, BashError> {
        let nonce: u128 = rand::rng().random();
        let sentinel = format!("__ANT_CMD_{nonce:032x}_DONE__");
        let split = format!("{}''{}", &sentinel[..8], &sentinel[8..]);
        let wrapped = format!("{{ {cmd}\n}} </dev/null 2>&1; printf '\\n{split}%d\\n' $?\n");
        let read = async {
            self.stdin
                .write_all(wrapped.as_bytes())
                .await
                .map_err(BashError::Io)?;
            self.stdin.flush().await.map_err(BashError::Io)?;
            let mut buf: Vec<u8> = Vec::with_capacity(8 * 1024);
            let mut truncated = false;
            let mut chunk = vec![0u8; 16 * 1024];
            let marker = sentinel.as_bytes();
            loop {
                let n = self.stdout.read(&mut chunk).await.map_err(BashError::Io)?;
                if n == 0 {
                    return Ok((buf, truncated, false));
                }
                buf.extend_from_slice(&chunk[..n]);
                if buf.len() > BASH_OUTPUT_LIMIT {
                    // Keep only the tail: the sentinel stays findable and memory bounded.
                    let cut = buf.len() - BASH_OUTPUT_LIMIT;
                    buf.drain(..cut);
                    truncated = true;
                }
                // Done once the sentinel and the status line after it are in.
                if let Some(at) = find(&buf, marker)
                    && buf[at + marker.len()..].contains(&b'\n')
                {
                    return Ok((buf, truncated, true));
                }
            }
        };
        let (buf, truncated, complete) = match tokio::time::timeout(timeout, read).await {
            Ok(r) => r?,
            Err(_) => {
                self.kill();
                return Err(BashError::Timeout(timeout.as_millis()));
            }
        };
        let text = String::from_utf8_lossy(&buf);
        let text = ansi().replace_all(&text, "");
        let Some(at) = text.rfind(&sentinel) else {
            // The shell went away (`exit`, killed) before the sentinel.
            self.kill();
            let out = text.trim().to_string();
            let status = self
                .child
                .try_wait()
                .ok()
                .flatten()
                .and_then(|s| s.code())
                .map(|c| format!(" with status {c}"))
                .unwrap_or_default();
            let detail = if out.is_empty() {
                status
            } else {
                format!("{status}: {out}")
            };
            debug_assert!(!complete);
            return Err(BashError::Exited(detail));
        };
        let mut output = text[..at].trim_end_matches('\n').to_string();
        let exit_code = text[at + sentinel.len()..]
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or(-1);
        if truncated {
            output = format!("[output truncated]\n{output}");
        }
        Ok(BashResult { output, exit_code })
    }

    /// Kill the session's whole process tree (background jobs, detached
    /// daemons) and its process group. Bounded ([`crate::cleanroom::KILL_BOUND`]).
    pub(crate) fn kill(&mut self) {
        if let Some(root) = self.root.take() {
            // The root is our unreaped child: its pid cannot be reused yet.
            let killed =
                crate::cleanroom::kill_tree(root, true, false, crate::cleanroom::KILL_BOUND);
            let _ = rustix::process::kill_process_group(root, rustix::process::Signal::KILL);
            tracing::debug!(processes = killed, "killed the session's processes");
        }
        let _ = self.child.start_kill();
    }
}

/// Kill `shell`'s tree on the blocking pool ([`crate::cleanroom::kill_tree`]
/// sleeps, for up to its bound, and must not hold a runtime thread), and
/// wait for it: the caller's teardown goes on only once the tree is dead.
/// (A shell dropped by a cancelled call is killed in place by `Drop`.)
async fn end(shell: Option<BashSession>) {
    if let Some(shell) = shell
        && let Err(e) = tokio::task::spawn_blocking(move || drop(shell)).await
    {
        tracing::warn!(error = %e, "cannot kill the shell's processes");
    }
}

impl Drop for BashSession {
    fn drop(&mut self) {
        self.kill();
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

#[derive(Deserialize)]
struct BashInput {
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    restart: Option<bool>,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

/// The `bash` tool: owns the session's shell, started on first use (or
/// ahead of it, [`BashTool::start_ahead`]).
pub(crate) struct BashTool {
    workdir: PathBuf,
    env: Vec<(String, String)>,
    supervisor: Option<PathBuf>,
    sandbox: Option<crate::sandbox::ShellPolicy>,
    shell: tokio::sync::Mutex<Option<BashSession>>,
    /// Set by [`BashTool::close`]: a start ahead that comes later starts nothing.
    closed: std::sync::atomic::AtomicBool,
}

impl BashTool {
    pub(crate) fn new(
        workdir: PathBuf,
        env: Vec<(String, String)>,
        supervisor: Option<PathBuf>,
        sandbox: Option<crate::sandbox::ShellPolicy>,
    ) -> Self {
        BashTool {
            workdir,
            env,
            supervisor,
            sandbox,
            shell: tokio::sync::Mutex::new(None),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Start the shell before the first call needs it, so a confined
    /// shell's set-up (namespace, mounts, rule set) overlaps the runner's
    /// stream instead of delaying the first result. The first call waits
    /// for it (it holds the lock) and uses it; a start that fails leaves no
    /// shell, and the first call starts one and reports its error as
    /// always. Nothing is started once the tool is closed.
    pub(crate) async fn start_ahead(&self) {
        let mut slot = self.shell.lock().await;
        if slot.is_some() || self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        match self.start().await {
            Ok(shell) => *slot = Some(shell),
            Err(e) => {
                tracing::debug!(error = %e.message, "the shell started ahead of the first call did not start; the first call starts it")
            }
        }
    }

    /// Run one call. `deadline` is the runner's bound on the whole call: a
    /// command's own timeout never outlives it.
    pub(crate) async fn call(
        &self,
        input: Value,
        deadline: Instant,
    ) -> Result<ToolOutput, ToolError> {
        let input: BashInput = super::parse_input("bash", input)?;
        let mut slot = self.shell.lock().await;
        if input.restart.unwrap_or(false) {
            end(slot.take()).await;
            *slot = Some(self.start().await?);
            return Ok(ToolOutput::Text("bash session restarted".into()));
        }
        let Some(command) = input.command.filter(|c| !c.is_empty()) else {
            return Err(ToolError::new("bash: command is required"));
        };
        let requested = input
            .timeout_ms
            .filter(|&ms| ms > 0)
            .map(Duration::from_millis)
            .unwrap_or(BASH_DEFAULT_TIMEOUT);
        let timeout = requested.min(deadline.saturating_duration_since(Instant::now()));
        // Taken out while the command runs: if this call is cancelled the
        // shell is dropped (and killed) with it, and the next call starts fresh.
        let mut shell = match slot.take() {
            Some(s) => s,
            None => self.start().await?,
        };
        match shell.exec(&command, timeout).await {
            Ok(result) => {
                *slot = Some(shell);
                if result.exit_code != 0 {
                    let text = if result.output.is_empty() {
                        format!("exit {}", result.exit_code)
                    } else {
                        result.output
                    };
                    return Err(ToolError::new(text));
                }
                Ok(ToolOutput::Text(result.output))
            }
            Err(e) => {
                // A timeout or a dead shell: kill its tree before answering.
                end(Some(shell)).await;
                Err(ToolError::new(format!("bash: {e}")))
            }
        }
    }

    async fn start(&self) -> Result<BashSession, ToolError> {
        BashSession::start(
            &self.workdir,
            &self.env,
            self.supervisor.as_deref(),
            self.sandbox.as_ref(),
        )
        .await
        .map_err(|e| ToolError::new(format!("bash: {e}")))
    }

    /// Kill the shell, if one runs.
    pub(crate) async fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        let shell = self.shell.lock().await.take();
        end(shell).await;
    }
}
