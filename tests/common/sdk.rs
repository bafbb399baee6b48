//! The official Python SDK (`anthropic==2.10.0`) in a virtualenv under
//! `target/`, installed on first use. An SDK that cannot be installed fails
//! the test: a conformance check that silently skips proves nothing.
//! [`install`] puts any other PyPI tool (cargo-lambda) in a virtualenv the same way.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub const SDK_VERSION: &str = "2.10.0";

/// The virtualenv's python, with the SDK importable.
pub fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let venv = install(
                &format!("sdk-venv-{SDK_VERSION}"),
                &format!("anthropic[webhooks]=={SDK_VERSION}"),
                &has_sdk,
            );
            venv_python(&venv)
        })
        .clone()
}

fn venv_python(venv: &Path) -> PathBuf {
    venv.join("bin").join("python")
}

fn has_sdk(venv: &Path) -> bool {
    Command::new(venv_python(venv))
        .args([
            "-c",
            &format!("import anthropic, standardwebhooks; assert anthropic.__version__ == '{SDK_VERSION}'"),
        ])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A virtualenv `target/tmp/<name>` with `requirement` installed from PyPI,
/// created on first use; `ready` tells a usable one. Panics (never skips)
/// when it cannot be installed.
pub fn install(name: &str, requirement: &str, ready: &dyn Fn(&Path) -> bool) -> PathBuf {
    // Integration tests get CARGO_TARGET_TMPDIR; benchmarks share the same place.
    let root = PathBuf::from(
        option_env!("CARGO_TARGET_TMPDIR")
            .map(str::to_string)
            .unwrap_or_else(|| format!("{}/target/tmp", env!("CARGO_MANIFEST_DIR"))),
    );
    std::fs::create_dir_all(&root).expect("the target directory is writable");
    let venv = root.join(name);
    if ready(&venv) {
        return venv;
    }
    // Build in a private directory and rename it into place, so concurrent
    // test processes never see a half-installed virtualenv.
    let staging = root.join(format!("{name}-staging-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let host_python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    run(
        Command::new(&host_python)
            .args(["-m", "venv"])
            .arg(&staging),
        "create the virtualenv",
    );
    run(
        Command::new(venv_python(&staging)).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            requirement,
        ]),
        &format!("install {requirement}"),
    );
    if std::fs::rename(&staging, &venv).is_err() {
        // Another process got there first; use theirs if it works.
        let _ = std::fs::remove_dir_all(&staging);
    }
    assert!(
        ready(&venv),
        "{requirement} is not usable from {}",
        venv.display()
    );
    venv
}

fn run(cmd: &mut Command, what: &str) -> Output {
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot {what}: {e} (is python3 with venv installed?)"));
    assert!(
        output.status.success(),
        "cannot {what}: {}\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The command that runs a script from `tests/conformance/` with the SDK.
fn script_command(script: &str, env: &[(&str, &str)]) -> Command {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/conformance")
        .join(script);
    let mut cmd = Command::new(python());
    cmd.arg(&path).env("PYTHONUNBUFFERED", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Start a script from `tests/conformance/` with the SDK, its stdout and
/// stderr piped.
pub fn spawn_script(script: &str, env: &[(&str, &str)]) -> std::process::Child {
    script_command(script, env)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python runs")
}

/// Run a script from `tests/conformance/` with the SDK; panics with its
/// output unless it exits 0. Returns its stdout.
pub fn run_script(script: &str, env: &[(&str, &str)]) -> String {
    run_script_with_stderr(script, env).0
}

/// [`run_script`], returning its stdout and its stderr (the SDK's logs).
pub fn run_script_with_stderr(script: &str, env: &[(&str, &str)]) -> (String, String) {
    let output = script_command(script, env).output().expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(
        output.status.success(),
        "{script} failed ({}):\n{stdout}\n{stderr}",
        output.status,
    );
    (stdout, stderr)
}
