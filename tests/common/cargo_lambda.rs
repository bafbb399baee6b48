//! cargo-lambda, the standard Rust Lambda tool, from PyPI (`cargo-lambda`
//! ships the binary) in a virtualenv under `target/`, and its Lambda
//! emulator: `cargo lambda watch --only-lambda-apis` serves the Runtime and
//! Extensions APIs and the invoke endpoint, and the function — the released
//! `envworker` binary — is started by the test against it, as cargo-lambda
//! documents for a function started elsewhere. A cargo-lambda that cannot
//! be installed fails the test, never skips it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const VERSION: &str = "1.9.2";

/// The `cargo-lambda` binary (run as `cargo-lambda lambda …`).
pub fn bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let venv = super::sdk::install(
            &format!("cargo-lambda-venv-{VERSION}"),
            &format!("cargo-lambda=={VERSION}"),
            &|venv| {
                Command::new(cargo_lambda(venv))
                    .args(["lambda", "--version"])
                    .output()
                    .is_ok_and(|o| {
                        o.status.success() && String::from_utf8_lossy(&o.stdout).contains(VERSION)
                    })
            },
        );
        cargo_lambda(&venv)
    })
    .clone()
}

fn cargo_lambda(venv: &Path) -> PathBuf {
    venv.join("bin").join("cargo-lambda")
}

/// `cargo lambda watch --only-lambda-apis` on a free port of 127.0.0.1.
pub struct Emulator {
    child: Child,
    pub port: u16,
    /// A crate of its own: `watch` reads a manifest before it starts.
    dir: tempfile::TempDir,
    pub output: Arc<Mutex<String>>,
}

impl Emulator {
    pub fn start() -> Emulator {
        let bin = bin();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("Cargo.toml"),
            "[package]\nname = \"envworker\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n[[bin]]\nname = \"envworker\"\npath = \"main.rs\"\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("main.rs"), "fn main() {}\n").unwrap();
        let port = super::serve_stack::free_port();
        let mut child = Command::new(&bin)
            .args([
                "lambda",
                "watch",
                "--only-lambda-apis",
                "-A",
                "127.0.0.1",
                "-P",
            ])
            .arg(port.to_string())
            .current_dir(dir.path())
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let output = super::process::collect_stderr(&mut child);
        let mut emulator = Emulator {
            child,
            port,
            dir,
            output,
        };
        let until = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = emulator.child.try_wait() {
                panic!(
                    "cargo lambda watch exited ({status}):\n{}",
                    emulator.output.lock().unwrap()
                );
            }
            assert!(
                Instant::now() < until,
                "cargo lambda watch did not listen on {port} within 60s:\n{}",
                emulator.output.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        emulator
    }

    /// `AWS_LAMBDA_RUNTIME_API` for the function, as `watch` prints it.
    pub fn runtime_api(&self) -> String {
        format!("http://127.0.0.1:{}/.rt", self.port)
    }

    /// `cargo lambda invoke --data-file` with `event`; its JSON answer.
    pub fn invoke(&self, event: &Value) -> Value {
        let file = self.dir.path().join(format!(
            "event-{}.json",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::write(&file, serde_json::to_vec(event).unwrap()).unwrap();
        let output = Command::new(bin())
            .args(["lambda", "invoke", "-A", "127.0.0.1", "-P"])
            .arg(self.port.to_string())
            .arg("--data-file")
            .arg(&file)
            .args(["--output-format", "json"])
            .current_dir(self.dir.path())
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "cargo lambda invoke failed ({}):\n{stdout}\n{}\n--- watch ---\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr),
            self.output.lock().unwrap()
        );
        serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("cargo lambda invoke printed no JSON ({e}):\n{stdout}"))
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
