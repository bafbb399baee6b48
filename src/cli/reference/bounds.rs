//! The Bounds table: every numeric input's range, each written from the
//! constant the code checks the input against, so the page cannot drift
//! from what the binary accepts.

use crate::config::bounds as config;
use crate::memory::options::{MAX_SYNC_INTERVAL, MIN_SYNC_INTERVAL};
use crate::serve::connections;

use super::markdown::{bytes, count, duration, durations};

/// One row: the input (flags, keys, fields), where it is given, its bound.
pub struct Bound {
    pub input: &'static str,
    pub place: &'static str,
    pub bound: String,
}

fn row(input: &'static str, place: &'static str, bound: String) -> Bound {
    Bound {
        input,
        place,
        bound,
    }
}

/// What the Bounds section says before its table.
pub(super) fn intro() -> String {
    format!(
        "Every numeric input has a range; a value outside it stops the command at start (or \
         answers 400 on the devserver) with a message naming the option and its range — never a \
         panic, an overflow or a silently clamped value. Durations take `90`, `90s`, `1m30s`, \
         `250ms`, `1h` (never more than {} days, whatever the option).",
        crate::duration::MAX_DURATION.as_secs() / 86_400
    )
}

/// Every bound, in the order the reference shows them.
pub fn bounds() -> Vec<Bound> {
    let mut rows = vec![
        row(
            "`--max-concurrent-items`, `max_concurrent_items`",
            "`serve`, endpoint file",
            format!("1–{}", config::MAX_CONCURRENT_ITEMS),
        ),
        row(
            "`--tool-timeout`",
            "worker flags",
            durations(config::TOOL_TIMEOUT),
        ),
        row(
            "`--call-grace`",
            "worker flags",
            durations(config::CALL_GRACE),
        ),
        row(
            "`--memory-teardown-bound`",
            "worker flags",
            durations(config::MEMORY_TEARDOWN_BOUND),
        ),
        row(
            "`--memory-sync-interval`, `memory_sync_interval`",
            "worker flags, endpoint file",
            format!(
                "{}, or `off`",
                durations((MIN_SYNC_INTERVAL, MAX_SYNC_INTERVAL))
            ),
        ),
        row(
            "`--max-idle`, `max_idle`",
            "worker flags, endpoint file",
            format!(
                "at most {}, or `off` (`0` = `off`)",
                duration(config::MAX_IDLE)
            ),
        ),
        row("`--stop-grace`", "`serve`", durations(config::STOP_GRACE)),
        row(
            "`--unready-after`",
            "`serve`",
            durations(config::UNREADY_AFTER),
        ),
        row(
            "`--min-serving-time`",
            "`serve` (Lambda)",
            durations(config::MIN_SERVING_TIME),
        ),
        row(
            "`--queue-check-interval`",
            "`serve` (containers)",
            format!("{}, or `off`", durations(config::QUEUE_CHECK_INTERVAL)),
        ),
        row(
            "endpoint file",
            "`--config`",
            format!(
                "at most {} (never read beyond), at most {} `[[endpoint]]`s",
                bytes(config::ENDPOINT_FILE_BYTES),
                config::ENDPOINTS
            ),
        ),
    ];
    #[cfg(feature = "devserver")]
    rows.extend(devserver());
    rows.push(row("HTTP connections", "`serve`", http_connections()));
    rows
}

/// The devserver's inputs: its flags, fault rules and scenarios.
#[cfg(feature = "devserver")]
fn devserver() -> Vec<Bound> {
    use crate::devserver::faults::{MAX_LATENCY_MS, MAX_RULES, MAX_TIMES, RATE, STATUS};
    use crate::devserver::scenario::format::{
        MAX_MEMORIES, MAX_STEPS, MAX_TIMEOUT_MS, MAX_WAIT_MS,
    };
    vec![
        row(
            "`--lease-ttl`",
            "`devserver`",
            format!(
                "1–{} s",
                count(crate::devserver::work::MAX_TTL_SECONDS as u64)
            ),
        ),
        row(
            "`--fault` and `POST /dev/faults`",
            "`devserver`",
            format!(
                "at most {MAX_RULES} rules active at once; `latency_ms` ≤ {}; `times` ≤ {}; \
                 `rate` {}–{}; `status` {}–{}",
                count(MAX_LATENCY_MS),
                count(MAX_TIMES),
                RATE.start(),
                RATE.end(),
                STATUS.start(),
                STATUS.end()
            ),
        ),
        row(
            "scenario (`POST /dev/scenarios`, `dev --scenario`)",
            "`devserver`",
            format!(
                "at most {} steps; `wait_ms` ≤ {}; `timeout_ms` 1–{}; at most {} seeded memories \
                 (and {} stores)",
                count(MAX_STEPS as u64),
                count(MAX_WAIT_MS),
                count(MAX_TIMEOUT_MS),
                count(MAX_MEMORIES as u64),
                crate::devserver::sessions::MAX_MEMORY_STORES
            ),
        ),
    ]
}

/// The webhook server's connections: read deadlines, head size, idle
/// close, and the cap that keeps descriptors for the work itself.
fn http_connections() -> String {
    format!(
        "headers within {}, at most {} of request head (else 431); a body within {} of its \
         headers; closed after {} with no request in progress; at most min({}, soft fd limit − \
         {} − {} × concurrent items, never below ¼ of the limit) at once",
        duration(connections::HEADER_READ_TIMEOUT),
        bytes(connections::MAX_BUF_BYTES as u64),
        duration(connections::BODY_READ_TIMEOUT),
        duration(connections::IDLE_TIMEOUT),
        count(connections::MAX_CONNECTIONS as u64),
        connections::RESERVE_BASE,
        connections::RESERVE_PER_ITEM,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn help_of(path: &[&str], flag: &str) -> String {
        use clap::CommandFactory;
        let mut cmd = crate::cli::Cli::command();
        for name in path {
            cmd = cmd.find_subcommand(name).unwrap().clone();
        }
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(flag))
            .unwrap_or_else(|| panic!("--{flag}"));
        arg.get_long_help().or(arg.get_help()).unwrap().to_string()
    }

    /// The ranges `--help` quotes are the constants the code checks.
    #[test]
    fn the_help_quotes_the_bounds_the_code_checks() {
        use crate::duration::show_duration as show;
        let range = |(min, max): (std::time::Duration, std::time::Duration)| {
            format!("{}–{}", show(min), show(max))
        };
        let mut quoted = vec![
            (
                &["serve"][..],
                "max-concurrent-items",
                format!("1–{}", config::MAX_CONCURRENT_ITEMS),
            ),
            (
                &["serve"],
                "min-serving-time",
                range(config::MIN_SERVING_TIME),
            ),
            (
                &["serve"],
                "queue-check-interval",
                range(config::QUEUE_CHECK_INTERVAL),
            ),
            (&["serve"], "stop-grace", range(config::STOP_GRACE)),
            (&["serve"], "unready-after", range(config::UNREADY_AFTER)),
            (
                &["serve"],
                "max-idle",
                format!("at most {}", show(config::MAX_IDLE)),
            ),
            (
                &["serve"],
                "memory-sync-interval",
                range((MIN_SYNC_INTERVAL, MAX_SYNC_INTERVAL)),
            ),
            (
                &["serve"],
                "memory-teardown-bound",
                range(config::MEMORY_TEARDOWN_BOUND),
            ),
            (&["serve"], "tool-timeout", range(config::TOOL_TIMEOUT)),
            (&["serve"], "call-grace", range(config::CALL_GRACE)),
        ];
        #[cfg(feature = "devserver")]
        quoted.extend([
            (
                &["devserver"][..],
                "lease-ttl",
                format!("1–{}", crate::devserver::work::MAX_TTL_SECONDS),
            ),
            (
                &["devserver"],
                "fault",
                format!("at most {}", crate::devserver::faults::MAX_RULES),
            ),
        ]);
        for (path, flag, figure) in quoted {
            let help = help_of(path, flag);
            assert!(
                help.contains(&figure),
                "--{flag}'s help does not say {figure}: {help}"
            );
        }
    }

    /// Each flag a row names is a flag of the command line.
    #[test]
    fn every_flag_the_bounds_name_exists() {
        use clap::CommandFactory;
        fn flags(cmd: &clap::Command, into: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                if let Some(long) = arg.get_long() {
                    into.push(format!("--{long}"));
                }
            }
            for sub in cmd.get_subcommands() {
                flags(sub, into);
            }
        }
        let mut known = Vec::new();
        flags(&crate::cli::Cli::command(), &mut known);
        for bound in bounds() {
            for word in bound.input.split('`').filter(|w| w.starts_with("--")) {
                assert!(known.iter().any(|k| k == word), "{word} is not a flag");
            }
        }
    }
}
