//! `envworker serve` as users run it: a child process behind an in-process
//! devserver that signs its webhooks (shared by `serve_process.rs`,
//! `serve_flood.rs` and `bounds.rs`).

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envworker::devserver::DevserverConfig;
use envworker::webhook::SigningKey;
use serde_json::{Value, json};

use super::{ADMIN_KEY, Started, TestServer};

/// A running `envworker serve`, with its stderr collected.
pub struct Serve {
    pub child: Child,
    pub url: String,
    pub stderr: Arc<Mutex<String>>,
    /// Every line written to stdout.
    pub stdout: Arc<Mutex<Vec<String>>>,
}

/// How the `serve` child is started.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServeLimits {
    /// `RLIMIT_NOFILE` (soft, hard) set in the child before `exec`.
    pub nofile: Option<(u64, u64)>,
}

/// Who the `serve` child runs as, and what it inherits.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServeUser {
    /// `(uid, gid)`: set in the child before `exec` (the test must be root);
    /// std drops the supplementary groups with it (`setgroups(0)` when the
    /// parent is root and no groups are given).
    pub ids: Option<(u32, u32)>,
    /// Close every descriptor above 2 before `exec`: the child starts with
    /// only its stdio, as under a container runtime, whatever the test
    /// runner itself inherited.
    pub only_stdio: bool,
    /// A descriptor `serve` inherits without close-on-exec (a copy of its
    /// stderr at this number), as a careless parent leaves one.
    pub leaked_fd: Option<i32>,
}

impl Serve {
    pub fn start(port: u16, envs: &[(&str, &str)], extra: &[&str]) -> Serve {
        Self::start_limited(port, envs, extra, ServeLimits::default())
    }

    /// [`Serve::start`] with the child's resource limits set before it runs.
    pub fn start_limited(
        port: u16,
        envs: &[(&str, &str)],
        extra: &[&str],
        limits: ServeLimits,
    ) -> Serve {
        Self::start_as(port, envs, extra, limits, ServeUser::default())
    }

    /// [`Serve::start_limited`] as another user, or with only stdio.
    pub fn start_as(
        port: u16,
        envs: &[(&str, &str)],
        extra: &[&str],
        limits: ServeLimits,
        user: ServeUser,
    ) -> Serve {
        let mut command = Command::new(env!("CARGO_BIN_EXE_envworker"));
        command
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .env_remove("RUST_LOG")
            .envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some((soft, hard)) = limits.nofile {
            super::process::limit_nofile(&mut command, soft, hard);
        }
        user.apply(&mut command);
        let mut child = command.spawn().expect("envworker serve starts");
        let stderr = super::process::collect_stderr(&mut child);
        let (url, stdout) =
            super::process::announced_url_and_stdout(&mut child, "envworker serve listening on ");
        let url = url.unwrap_or_else(|| panic!("serve did not start: {}", stderr.lock().unwrap()));
        Serve {
            child,
            url,
            stderr,
            stdout,
        }
    }

    pub fn logs(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The last `lines` lines of the logs.
    pub fn logs_tail(&self, lines: usize) -> String {
        let logs = self.logs();
        let all: Vec<&str> = logs.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Wait (blocking, polling) for the process to exit; panics with its
    /// logs after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "serve did not exit within {timeout:?}: {}",
                self.logs_tail(40)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn terminate(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }
}

impl ServeUser {
    /// `nobody` (65534) when this process is root; else the current user.
    pub fn nobody_if_root() -> ServeUser {
        ServeUser {
            ids: rustix::process::geteuid()
                .is_root()
                .then_some((65534, 65534)),
            only_stdio: true,
            leaked_fd: None,
        }
    }

    /// Set up `command` to start as this user.
    pub fn apply(&self, command: &mut Command) {
        use std::os::unix::process::CommandExt;
        if let Some((uid, gid)) = self.ids {
            command.uid(uid).gid(gid);
        }
        if self.only_stdio {
            // SAFETY: one close_range syscall, async-signal-safe, no
            // allocation; the pipes std set up are 0-2 by now. Marked
            // close-on-exec rather than closed: std's own exec-error pipe
            // must stay open until the exec.
            unsafe {
                command.pre_exec(|| {
                    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 4;
                    if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC)
                        != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        if let Some(fd) = self.leaked_fd {
            // SAFETY: one dup2 syscall, async-signal-safe; the copy it makes
            // has no close-on-exec flag, so `serve` inherits it.
            unsafe {
                command.pre_exec(move || {
                    if libc::dup2(2, fd) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
    }

    /// Hand `path` (a directory the stack made) to this user.
    pub fn own(&self, path: &std::path::Path) {
        if let Some((uid, gid)) = self.ids {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct Stack {
    pub server: TestServer,
    pub serve: Serve,
    pub started_env: (String, String),
    pub secret: String,
    /// Where sessions mount their stores (empty once every session disposed of them).
    pub mount_root: std::path::PathBuf,
    pub _dirs: (tempfile::TempDir, tempfile::TempDir),
    /// `--state-dir`, when [`StackOptions::state_dir`] asked for one.
    pub state_dir: Option<tempfile::TempDir>,
}

/// Everything [`stack_with_options`] can vary; the defaults are [`stack`]'s.
#[derive(Debug, Clone, Default)]
pub struct StackOptions {
    /// More variables in the `serve` child's environment.
    pub envs: Vec<(String, String)>,
    pub limits: ServeLimits,
    /// Who `serve` runs as; the stack's directories are handed to that user.
    pub user: ServeUser,
    /// The devserver's mount root (advertised mount paths are
    /// `<root>/<slug>`); default: `memory` in a temporary directory.
    pub mount_root: Option<String>,
    /// Where the temporary directories are made (default: the system's).
    pub temp_base: Option<std::path::PathBuf>,
    /// Pass `--state-dir` (a temporary directory) to `serve`.
    pub state_dir: bool,
    /// The devserver's lease TTL (default 10 s).
    pub lease_ttl_seconds: Option<i64>,
}

/// A stack started the way `options` says.
pub async fn stack_with_options(extra: &[&str], options: StackOptions) -> Stack {
    stack_full(extra, options, true).await
}

/// A devserver that signs webhooks to a `serve` process serving its environment.
pub async fn stack(extra: &[&str]) -> Stack {
    stack_limited(extra, ServeLimits::default()).await
}

/// [`stack`] with the `serve` child's resource limits.
pub async fn stack_limited(extra: &[&str], limits: ServeLimits) -> Stack {
    stack_with(extra, &[], limits, true).await
}

/// [`stack`] whose webhooks are all lost: the devserver delivers them to a
/// port nobody listens on (a sender outage).
pub async fn stack_without_webhooks(extra: &[&str]) -> Stack {
    stack_with(extra, &[], ServeLimits::default(), false).await
}

/// [`stack_without_webhooks`] with more variables in the `serve` child's
/// environment: the test delivers every webhook itself.
pub async fn stack_without_webhooks_env(extra: &[&str], envs: &[(&str, &str)]) -> Stack {
    stack_with(extra, envs, ServeLimits::default(), false).await
}

async fn stack_with(
    extra: &[&str],
    envs: &[(&str, &str)],
    limits: ServeLimits,
    webhooks: bool,
) -> Stack {
    let options = StackOptions {
        envs: envs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        limits,
        ..Default::default()
    };
    stack_full(extra, options, webhooks).await
}

async fn stack_full(extra: &[&str], options: StackOptions, webhooks: bool) -> Stack {
    let port = free_port();
    let webhook_port = if webhooks { port } else { free_port() };
    let (_key, secret) = SigningKey::generate();
    let tempdir = || match &options.temp_base {
        Some(base) => tempfile::tempdir_in(base).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let mnt = tempdir();
    let work = tempdir();
    let state = options.state_dir.then(tempdir);
    for dir in [Some(&mnt), Some(&work), state.as_ref()]
        .into_iter()
        .flatten()
    {
        options.user.own(dir.path());
    }
    let mount_root = match &options.mount_root {
        Some(root) => std::path::PathBuf::from(root),
        None => mnt.path().join("memory"),
    };
    let server = TestServer::start_with(
        DevserverConfig::new(ADMIN_KEY)
            .mount_root(mount_root.to_str().unwrap())
            .webhook(
                format!("http://127.0.0.1:{webhook_port}/webhooks/default"),
                SigningKey::parse(&secret).unwrap(),
            )
            .lease_ttl_seconds(options.lease_ttl_seconds.unwrap_or(10)),
    )
    .await;
    let (env_id, env_key) = server.create_environment().await;
    // The defaults, unless `extra` sets them (a flag may appear only once).
    let mut args: Vec<&str> = [["--max-idle", "1s"], ["--memory-sync-interval", "5s"]]
        .into_iter()
        .filter(|[flag, _]| !extra.contains(flag))
        .flatten()
        .collect();
    let state_arg = state
        .as_ref()
        .map(|d| d.path().to_str().unwrap().to_string());
    if let Some(dir) = &state_arg {
        args.extend(["--state-dir", dir.as_str()]);
    }
    args.extend_from_slice(extra);
    let url = server.url();
    let mut all_envs = vec![
        ("ANTHROPIC_BASE_URL", url.as_str()),
        ("ANTHROPIC_ENVIRONMENT_ID", env_id.as_str()),
        ("ANTHROPIC_ENVIRONMENT_KEY", env_key.as_str()),
        ("ANTHROPIC_WEBHOOK_SIGNING_KEY", secret.as_str()),
        ("ENVWORKER_WORKDIR", work.path().to_str().unwrap()),
    ];
    all_envs.extend(options.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let serve = Serve::start_as(port, &all_envs, &args, options.limits, options.user);
    Stack {
        server,
        serve,
        started_env: (env_id, env_key),
        secret,
        mount_root,
        _dirs: (mnt, work),
        state_dir: state,
    }
}

impl Stack {
    /// Another replica of this stack's worker: `envworker poll` on the same
    /// environment and workdir (always polling, so it needs no webhook), its
    /// stderr collected.
    pub fn poller(&self, extra: &[&str]) -> (Child, Arc<Mutex<String>>) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_envworker"))
            .args(["poll", "--max-idle", "1s", "--memory-sync-interval", "5s"])
            .args(extra)
            .env_remove("RUST_LOG")
            .envs([
                ("ANTHROPIC_BASE_URL", self.server.url().as_str()),
                ("ANTHROPIC_ENVIRONMENT_ID", self.started_env.0.as_str()),
                ("ANTHROPIC_ENVIRONMENT_KEY", self.started_env.1.as_str()),
                ("ENVWORKER_WORKDIR", self._dirs.1.path().to_str().unwrap()),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("envworker poll starts");
        let stderr = super::process::collect_stderr(&mut child);
        (child, stderr)
    }

    pub async fn start(&self, mut doc: Value) -> Started {
        doc["environment_id"] = json!(self.started_env.0);
        self.server.start_scenario(&doc).await
    }

    /// The scenario's final report, asserted `passed` (else the report, the
    /// session's events and the tail of serve's logs are shown).
    pub async fn passed_report(&self, session_id: &str) -> Value {
        let report = self
            .server
            .final_report(session_id, Duration::from_secs(60))
            .await;
        if report["status"] != "passed" {
            let events = self.server.events(session_id).await;
            panic!("{report:#}\n{events:#?}\n{}", self.serve.logs_tail(60));
        }
        report
    }

    /// POST a signed `session.status_run_started` for `session_id` (webhook-id
    /// `id`) to the default endpoint, as the API delivers it.
    pub async fn deliver_run_started(
        &self,
        http: &reqwest::Client,
        id: &str,
        session_id: &str,
    ) -> reqwest::Result<reqwest::Response> {
        self.deliver(http, id, run_started(id, session_id)).await
    }

    /// POST `body`, signed as webhook-id `id`, to the default endpoint.
    pub async fn deliver(
        &self,
        http: &reqwest::Client,
        id: &str,
        body: String,
    ) -> reqwest::Result<reqwest::Response> {
        self.deliver_with(http, id, body, &[]).await
    }

    /// A signed `session.status_run_started` for `session_id` with more
    /// request headers (W3C trace context, say).
    pub async fn deliver_run_started_with(
        &self,
        http: &reqwest::Client,
        id: &str,
        session_id: &str,
        headers: &[(&str, &str)],
    ) -> reqwest::Result<reqwest::Response> {
        self.deliver_with(http, id, run_started(id, session_id), headers)
            .await
    }

    /// [`deliver`](Self::deliver) with more request headers.
    pub async fn deliver_with(
        &self,
        http: &reqwest::Client,
        id: &str,
        body: String,
        headers: &[(&str, &str)],
    ) -> reqwest::Result<reqwest::Response> {
        let key = SigningKey::parse(&self.secret).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let mut request = http.post(format!("{}/webhooks/default", self.serve.url));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", now.to_string())
            .header("webhook-signature", key.sign(id, now, body.as_bytes()))
            .body(body)
            .send()
            .await
    }
}

/// The body of a `session.status_run_started` delivery.
fn run_started(id: &str, session_id: &str) -> String {
    json!({"type": "event", "id": id, "created_at": "2026-01-01T00:00:00Z",
        "data": {"type": "session.status_run_started", "id": session_id}})
    .to_string()
}
