//! The `envworker` binary run as a child process, as users run it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `envworker devserver` child, killed on drop.
pub struct DevserverProcess {
    pub child: Child,
    pub url: String,
}

impl DevserverProcess {
    /// Start `envworker devserver --listen 127.0.0.1:0 --admin-key KEY EXTRA…`
    /// (logging at `warn` unless `RUST_LOG` says otherwise) and wait for the
    /// line that announces its URL.
    pub fn start(admin_key: &str, extra: &[&str]) -> DevserverProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_envworker"))
            .args([
                "devserver",
                "--listen",
                "127.0.0.1:0",
                "--admin-key",
                admin_key,
            ])
            .args(extra)
            // Quiet unless the caller's RUST_LOG asks for more: its request
            // log would bury a test's or a bench's own output.
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("envworker starts");
        let url = announced_url(&mut child, "envworker devserver listening on ")
            .expect("the devserver announces its URL");
        DevserverProcess { child, url }
    }
}

impl Drop for DevserverProcess {
    /// SIGTERM first, so the devserver stops gracefully and removes its
    /// temporary database; SIGKILL if it has not exited within two seconds.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            for _ in 0..40 {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Start `command`'s child with `RLIMIT_NOFILE` at `soft` / `hard`.
pub fn limit_nofile(command: &mut Command, soft: u64, hard: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit is async-signal-safe; nothing else runs here.
    unsafe {
        command.pre_exec(move || {
            rustix::process::setrlimit(
                rustix::process::Resource::Nofile,
                rustix::process::Rlimit {
                    current: Some(soft),
                    maximum: Some(hard),
                },
            )
            .map_err(std::io::Error::from)
        });
    }
}

/// The URL `child` prints on its (piped) stdout after `prefix`, within 30 s
/// — as a text line, or (`--log-format json`) as the `message` of a JSON
/// line; the rest of its stdout is drained in the background.
pub fn announced_url(child: &mut Child, prefix: &'static str) -> Option<String> {
    announced_url_and_stdout(child, prefix).0
}

/// [`announced_url`], and every line `child` writes to stdout, as it comes.
pub fn announced_url_and_stdout(
    child: &mut Child,
    prefix: &'static str,
) -> (
    Option<String>,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    let stdout = child.stdout.take().expect("stdout is piped");
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = lines.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let message = serde_json::from_str::<serde_json::Value>(&line)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| line.clone());
            if let Some(url) = message.strip_prefix(prefix) {
                let _ = tx.send(url.to_string());
            }
            sink.lock().unwrap().push(line);
        }
    });
    (rx.recv_timeout(Duration::from_secs(30)).ok(), lines)
}

/// Collect everything `child` writes to its (piped) stderr, as it comes.
pub fn collect_stderr(child: &mut Child) -> std::sync::Arc<std::sync::Mutex<String>> {
    use std::io::Read;
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = text.clone();
    let mut pipe = child.stderr.take().expect("stderr is piped");
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    text
}
