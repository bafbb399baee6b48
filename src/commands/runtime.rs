//! The async runtime a subcommand runs on, sized to the work items it can
//! serve at once.
//!
//! A session's async side is coordination: read the event stream, run a
//! short file call in place or hand a long one to the blocking pool (see
//! `tools::lane`), talk to the shell, post the result. Each hand-off
//! between two runtime threads costs a futex wake-up and a context switch,
//! and with one session at a time a second thread adds little but those
//! (the 200-call session of `cargo bench --bench session`: about 15 % of the
//! worker's CPU). No tool call holds the runtime thread long: a file call
//! runs in place only within its budget, the rest on the blocking pool;
//! items served side by side get a thread each, up to the cores.
//! `TOKIO_WORKER_THREADS`, when set, wins (tokio's own variable).

use std::num::NonZeroUsize;

use crate::cli::Command;
use crate::config::ServeFile;

/// The multi-thread runtime for `command`.
pub fn build(command: &Command) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none()
        && let Some(items) = items_at_once(command)
    {
        let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        builder.worker_threads(threads_for(items, cores));
    }
    builder.build()
}

/// Runtime threads for `items` served at once on `cores` cores.
fn threads_for(items: usize, cores: usize) -> usize {
    items.clamp(1, cores.max(1))
}

/// How many work items `command` can serve at once; `None` for the commands
/// that serve other things (the devserver's requests, `dev`'s all-in-one):
/// they keep a thread per core.
fn items_at_once(command: &Command) -> Option<usize> {
    match command {
        Command::Serve(args) => Some(match &args.config {
            None => args.max_concurrent_items,
            // The file is read again, and checked, when the endpoints are
            // built; a file that does not load leaves the default here.
            Some(path) => ServeFile::load(path)
                .ok()?
                .endpoints
                .iter()
                .map(|e| e.max_concurrent_items.unwrap_or(1))
                .sum(),
        }),
        Command::Poll(_) | Command::Run(_) => Some(1),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::Cli;

    fn items(args: &[&str]) -> Option<usize> {
        let cli = Cli::try_parse_from(std::iter::once("envworker").chain(args.iter().copied()))
            .expect("the arguments parse");
        items_at_once(&cli.command)
    }

    #[test]
    fn the_runtime_has_a_thread_per_item_served_at_once_up_to_the_cores() {
        assert_eq!(threads_for(1, 2), 1);
        assert_eq!(threads_for(4, 2), 2);
        assert_eq!(threads_for(3, 8), 3);
        assert_eq!(threads_for(64, 0), 1);
        assert_eq!(threads_for(0, 4), 1);
    }

    #[test]
    fn items_at_once_follow_the_command_and_the_endpoint_file() {
        assert_eq!(
            items(&["poll", "--environment-id", "e", "--environment-key", "k"]),
            Some(1)
        );
        assert_eq!(
            items(&[
                "run",
                "--work-id",
                "w",
                "--environment-id",
                "e",
                "--session-id",
                "s"
            ]),
            Some(1)
        );
        assert_eq!(items(&["serve"]), Some(1));
        assert_eq!(items(&["serve", "--max-concurrent-items", "4"]), Some(4));

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("endpoints.toml");
        let endpoint = |name: &str, items: &str| {
            format!(
                "[[endpoint]]\nname = \"{name}\"\nsigning_keys_env = [\"K\"]\n\
                 environment_id = \"env_1\"\nenvironment_key_env = \"E\"\n{items}\n"
            )
        };
        std::fs::write(
            &file,
            endpoint("a", "max_concurrent_items = 3") + &endpoint("b", ""),
        )
        .unwrap();
        let path = file.to_str().unwrap();
        assert_eq!(items(&["serve", "--config", path]), Some(4));
        // A file that does not load keeps the default; `serve` reports it.
        std::fs::write(&file, "not toml [").unwrap();
        assert_eq!(items(&["serve", "--config", path]), None);

        #[cfg(feature = "devserver")]
        assert_eq!(items(&["devserver", "--admin-key", "k"]), None);
    }
}
