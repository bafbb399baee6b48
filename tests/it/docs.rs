//! The manual's claims, held to the code: the generated configuration
//! reference is what the code generates today, the commands of the
//! Getting-started page run, and the docs checker's rules fail and pass
//! where they should.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `docs/src/configuration/reference.md` is written by a command from the
/// clap definitions and the code's tables; a change to either without
/// regenerating the page fails here, naming the command.
#[test]
fn the_configuration_reference_is_what_the_code_generates() {
    use envworker::cli::reference::{COMMAND, PATH, render};
    let committed = std::fs::read_to_string(repo().join(PATH)).unwrap_or_default();
    let generated = render();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(generated.lines().count()));
        panic!(
            "{PATH} differs from what the code generates (first at line {}); regenerate it with:\n\n    {COMMAND}\n\ncommitted: {:?}\ngenerated: {:?}",
            line + 1,
            committed.lines().nth(line).unwrap_or("<end of file>"),
            generated.lines().nth(line).unwrap_or("<end of file>"),
        );
    }
}

/// The docs checker's own rules, each on a text that must fail and one that
/// must pass (`scripts/check_docs.py --self-test`).
#[test]
fn the_docs_checker_passes_its_self_test() {
    let out = Command::new("python3")
        .arg(repo().join("scripts/check_docs.py"))
        .arg("--self-test")
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Lines of a runnable block that are not run: building and testing are
/// the reader's business, the test already runs a build.
const SKIPPED: &[&str] = &["cargo test", "cargo build", "cargo install"];

/// What runs the binary on the page, rewritten to the test build's binary.
const CARGO_RUNS: &[&str] = &["cargo run --release -- ", "cargo run -- "];

/// The script a Getting-started page runs: every fenced block whose info
/// string is exactly `sh`, in order, after `set -euo pipefail`; `cargo run
/// [--release] -- ` at a command's start becomes `binary`, and lines that
/// start with `cargo test`/`cargo build`/`cargo install` (with their
/// continuation lines) are left out.
pub(crate) fn script_from_page(page: &str, binary: &str) -> String {
    let mut script = String::from("set -euo pipefail\n");
    let mut fence: Option<(char, usize, bool)> = None;
    let mut skipping = false;
    for (number, line) in page.lines().enumerate() {
        let trimmed = line.trim_start();
        let opener = trimmed
            .chars()
            .next()
            .filter(|c| *c == '`' || *c == '~')
            .map(|c| (c, trimmed.chars().take_while(|x| *x == c).count()))
            .filter(|(_, n)| *n >= 3);
        match (fence, opener) {
            (None, Some((c, n))) => {
                let runs = trimmed[n..].trim() == "sh";
                if runs {
                    script.push_str(&format!("# the page's line {}\n", number + 1));
                }
                fence = Some((c, n, runs));
                skipping = false;
            }
            (Some((c, n, _)), Some((c2, n2)))
                if c == c2 && n2 >= n && trimmed[n2..].trim().is_empty() =>
            {
                fence = None;
            }
            (Some((_, _, true)), _) => {
                let skip = skipping || SKIPPED.iter().any(|s| starts_command(trimmed, s));
                skipping = skip && line.ends_with('\\');
                if skip {
                    script.push_str(&format!("# (not run) {line}\n"));
                } else {
                    script.push_str(&rewrite_cargo_run(line, binary));
                    script.push('\n');
                }
            }
            _ => {}
        }
    }
    script
}

/// `line` starts with the command `command` (a whole word at its end).
fn starts_command(line: &str, command: &str) -> bool {
    line.strip_prefix(command)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace))
}

/// `cargo run [--release] -- ` replaced by `binary` wherever it starts a
/// command: at the line's start or after `&&`, `||`, `;`, `|`, `&`, `(`.
fn rewrite_cargo_run(line: &str, binary: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    'scan: while !rest.is_empty() {
        for pattern in CARGO_RUNS {
            if let Some(at) = rest.find(pattern) {
                let before = out.clone() + &rest[..at];
                let head = before.trim_end();
                let starts = head.is_empty()
                    || ["&&", "||", ";", "|", "&", "("]
                        .iter()
                        .any(|s| head.ends_with(s));
                if starts {
                    out.push_str(&rest[..at]);
                    out.push_str(&format!("'{binary}' "));
                } else {
                    out.push_str(&rest[..at + pattern.len()]);
                }
                rest = &rest[at + pattern.len()..];
                continue 'scan;
            }
        }
        out.push_str(rest);
        break;
    }
    out
}

#[test]
fn the_page_s_script_keeps_sh_blocks_and_rewrites_cargo_run() {
    let page = "\
# Title

```sh
cargo build --release
cargo run --release -- dev
x=$(cargo run -- webhook sign --key k body.json) && cargo run -- dev --keep
echo 'cargo run -- stays inside a string' | cat
```

```text
cargo run -- not-run
```

```console
$ cargo run -- not-run-either
```

````sh
cargo install --locked \\
    something
  cargo test --test it
cargo testing-is-not-a-subcommand
```
````
";
    assert_eq!(
        script_from_page(page, "/bin/envworker"),
        "\
set -euo pipefail
# the page's line 3
# (not run) cargo build --release
'/bin/envworker' dev
x=$('/bin/envworker' webhook sign --key k body.json) && '/bin/envworker' dev --keep
echo 'cargo run -- stays inside a string' | cat
# the page's line 18
# (not run) cargo install --locked \\
# (not run)     something
# (not run)   cargo test --test it
cargo testing-is-not-a-subcommand
```
"
    );
}

/// How long the page's commands may take, all together.
const PAGE_TIMEOUT: Duration = Duration::from_secs(120);

/// What running a page's script came to.
struct Outcome {
    /// `None`: killed at the timeout.
    status: Option<std::process::ExitStatus>,
    output: String,
}

/// Runs `script` with bash from the repository's root, in a process group
/// of its own (so what it starts in the background goes with it), stdout
/// and stderr into one file (a pipe would stay open while a background
/// process lives); the whole group is killed at the end, or at `timeout`.
fn run_script(script: &str, timeout: Duration) -> Outcome {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("page.sh");
    std::fs::write(&path, script).unwrap();
    let log = dir.path().join("output.txt");
    let file = std::fs::File::create(&log).unwrap();
    let mut child = Command::new("bash")
        .arg(&path)
        .current_dir(repo())
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .process_group(0)
        .spawn()
        .expect("bash runs");
    let group = child.id() as i32;
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // SAFETY: a signal to the group this test created, and only to it.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    let _ = child.wait();
    Outcome {
        status,
        output: std::fs::read_to_string(&log).unwrap_or_default(),
    }
}

/// Runs the page at `page`, failing with its script's output.
fn run_page(page: &Path) {
    let text = std::fs::read_to_string(page).unwrap();
    let script = script_from_page(&text, env!("CARGO_BIN_EXE_envworker"));
    let outcome = run_script(&script, PAGE_TIMEOUT);
    match outcome.status {
        Some(status) if status.success() => {}
        Some(status) => panic!(
            "{} failed ({status}); its commands:\n{script}\noutput:\n{}",
            page.display(),
            outcome.output
        ),
        None => panic!(
            "{} did not finish within {PAGE_TIMEOUT:?}; its commands:\n{script}\noutput:\n{}",
            page.display(),
            outcome.output
        ),
    }
}

/// The Getting-started page's commands (the demo, the devserver walk
/// through) run as written, with the page as their source.
#[test]
fn the_getting_started_page_runs() {
    let page = repo().join("docs/src/getting-started.md");
    // The page is the demo and the devserver's walk-through: a page that
    // lost them would pass here while showing nothing that runs.
    let script = script_from_page(
        &std::fs::read_to_string(&page).unwrap(),
        env!("CARGO_BIN_EXE_envworker"),
    );
    for command in ["dev", "devserver"] {
        let line = format!("'{}' {command}", env!("CARGO_BIN_EXE_envworker"));
        assert!(
            script.contains(&line),
            "the Getting-started page runs `envworker {command}`:\n{script}"
        );
    }
    run_page(&page);
}

/// The harness fails a page whose command fails, and one that does not
/// end, and kills what the page left running in the background.
#[test]
fn a_failing_or_hanging_page_fails() {
    let failed = run_script(
        "set -euo pipefail\necho before\nfalse\necho after\n",
        PAGE_TIMEOUT,
    );
    assert!(!failed.status.unwrap().success());
    assert_eq!(failed.output, "before\n");

    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let started = Instant::now();
    let hung = run_script(
        &format!(
            "set -euo pipefail\nsleep 300 &\necho $! > '{}'\nsleep 300\n",
            pid_file.display()
        ),
        Duration::from_secs(1),
    );
    assert!(hung.status.is_none());
    assert!(started.elapsed() < Duration::from_secs(30));
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The background sleep is gone with its group (reaped by init, or a zombie at most).
    std::thread::sleep(Duration::from_millis(200));
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(state.is_empty() || state.contains(") Z "), "{state}");
}
