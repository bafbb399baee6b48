//! The confinement race end to end (issue 12 item 1): the real `envworker`
//! binary (`poll --on-work 'exec envworker run …'`) serves a devserver
//! scenario over HTTP whose agent starts, from its own `bash` tool, a
//! background loop exchanging its memory store folder with a symlink to a
//! directory outside (`renameat2(RENAME_EXCHANGE)`, via perl), then makes
//! `read`/`grep`/`glob` calls through the folder. No answer may carry a byte
//! or a name from outside.
//!
//! `ENVWORKER_E2E_RACE_STEPS` sets the number of racing tool steps (default
//! 150, a few seconds).

use std::process::Command;
use std::time::Duration;

use crate::common::{ADMIN_KEY, TestServer};
use envworker::devserver::DevserverConfig;
use serde_json::{Value, json};

const SECRET: &str = "SECRET-OUTSIDE-e2e-91c4";
const OUTSIDE_ONLY: &str = "outside-only.md";
const DEFAULT_STEPS: usize = 150;

/// A perl one-liner calling `renameat2(AT_FDCWD, a, AT_FDCWD, b,
/// RENAME_EXCHANGE)` forever, or `once`.
fn exchange(a: &str, b: &str, forever: bool) -> String {
    let nr = if cfg!(target_arch = "aarch64") {
        276
    } else {
        316
    };
    let body =
        format!("syscall({nr}, -100, $ARGV[0], -100, $ARGV[1], 2) == 0 or die \"renameat2: $!\"");
    let body = if forever {
        format!("while (1) {{ {body} }}")
    } else {
        body
    };
    format!("perl -e '{body}' {a} {b}")
}

/// The scenario: one read-write store, the exchange loop started in the
/// background, `steps` racing calls, then the loop stopped and the folder
/// put back in place.
fn scenario(outside: &str, ctl: &str, steps: usize) -> Value {
    let mount = "{mount:notes}";
    let swap = format!("{mount}.swap");
    let mut list = vec![json!({"tool": "bash", "input": {"command": format!(
        "ln -s {outside} {swap} && ({} >/dev/null 2>&1 & echo $! > {ctl}/pid) && echo started",
        exchange(mount, &swap, true)
    )}, "expect": {"contains": "started"}})];
    for i in 0..steps {
        let (tool, input) = match i % 3 {
            0 => ("read", json!({"file_path": format!("{mount}/note.md")})),
            1 => ("grep", json!({"pattern": "SECRET|inside", "path": mount})),
            _ => ("glob", json!({"pattern": "*.md", "path": mount})),
        };
        list.push(json!({"tool": tool, "input": input}));
    }
    list.push(json!({"tool": "bash", "input": {"command": format!(
        "pid=$(cat {ctl}/pid); kill $pid; while kill -0 $pid 2>/dev/null; do sleep 0.05; done; \
         if [ -L {mount} ]; then {}; fi; rm {swap}; cat {mount}/note.md",
        exchange(mount, &swap, false)
    )}, "expect": {"contains": "inside"}}));
    json!({
        "name": "confinement-race",
        "memory_stores": [{"key": "notes", "name": "Notes", "access": "read_write",
                           "memories": {"/note.md": "inside\n"}}],
        "steps": list,
    })
}

/// The `poll` child, stopped (SIGTERM, then waited) however the test ends.
struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rename_exchange_loop_in_the_agents_shell_leaks_nothing_through_the_real_binary() {
    let steps = std::env::var("ENVWORKER_E2E_RACE_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_STEPS);
    let mnt = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let ctl = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("note.md"), SECRET).unwrap();
    std::fs::write(outside.path().join(OUTSIDE_ONLY), SECRET).unwrap();
    let server = TestServer::start_with(
        DevserverConfig::new(ADMIN_KEY).mount_root(mnt.path().join("memory").to_str().unwrap()),
    )
    .await;
    let started = server
        .start_scenario(&scenario(
            outside.path().to_str().unwrap(),
            ctl.path().to_str().unwrap(),
            steps,
        ))
        .await;
    let command = format!(
        "exec {bin} run --max-idle 1s --memory-sync-interval 5s --workdir {d}",
        d = work.path().display(),
        bin = env!("CARGO_BIN_EXE_envworker"),
    );
    let poll = crate::common::toolbox::spawn_poll(&server.url(), &started, &command);
    let mut poll = KillOnDrop(Some(poll));
    let logs = crate::common::process::collect_stderr(poll.0.as_mut().unwrap());
    let report = server
        .final_report(&started.session_id, Duration::from_secs(120))
        .await;
    drop(poll);
    let logs = logs.lock().unwrap().clone();

    let results = report["steps"].as_array().expect("steps in the report");
    let racing = &results[1..results.len() - 1];
    let mut leaks = 0;
    let mut refused = 0;
    for step in racing {
        let output = step["output"].as_str().unwrap_or_default();
        if output.contains(SECRET) || output.contains(OUTSIDE_ONLY) {
            leaks += 1;
        }
        if step["is_error"] == true {
            refused += 1;
        }
    }
    eprintln!(
        "e2e race: {leaks} leaks in {} steps ({refused} refused while the folder was swapped)",
        racing.len()
    );
    assert_eq!(racing.len(), steps, "{report:#}\n{logs}");
    assert_eq!(leaks, 0, "{report:#}");
    // Proof the race ran: with the folder swapped about half the time, some
    // steps must have met the swap (0 would mean the exchange loop died).
    assert!(
        refused > 0,
        "no step met a swapped folder: {report:#}\n{logs}"
    );
    assert_eq!(
        std::fs::read_to_string(outside.path().join("note.md")).unwrap(),
        SECRET
    );
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 2);
}
