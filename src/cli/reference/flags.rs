//! One section per command, its flags read from the clap definitions that
//! parse the command line: names, variables, defaults and long help, so
//! `--help`, the man pages and the book say the same.

use clap::{Arg, ArgAction, Args, Command};

use super::markdown::{plain, table};

/// Pages that say more about a command, linked under its table.
const SEE_ALSO: &[(&str, &[(&str, &str)])] = &[
    ("dev", &[("Getting started", "../getting-started.md")]),
    (
        "serve",
        &[
            ("Deploying", "../deploying/index.md"),
            ("A clean room per session", "../security/clean-room.md"),
            (
                "The agent's shell in a sandbox",
                "../security/shell-sandbox.md",
            ),
            ("Memory stores", "../memory.md"),
            ("What happens when…", "../operating/what-happens-when.md"),
            ("TLS, proxies and the SDK's variables", "network.md"),
        ],
    ),
    (
        "poll",
        &[(
            "A sandbox per session",
            "../deploying/sandbox-per-session.md",
        )],
    ),
    (
        "run",
        &[(
            "A sandbox per session",
            "../deploying/sandbox-per-session.md",
        )],
    ),
    (
        "devserver",
        &[
            ("The devserver", "../devserver/index.md"),
            ("Scenario format", "../devserver/scenarios.md"),
        ],
    ),
];

/// The sections: `envworker` (its global flags), then each command.
pub(super) fn sections(out: &mut String, root: &Command) {
    let worker: Vec<String> = crate::cli::WorkerArgs::augment_args(Command::new("worker"))
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect();
    let mut ctx = Sections {
        worker,
        worker_shown_in: None,
    };
    ctx.command(out, "envworker", root);
    for sub in root.get_subcommands() {
        ctx.walk(out, "envworker", sub);
    }
}

struct Sections {
    /// The ids of the worker's flags, shared by `serve`, `poll` and `run`.
    worker: Vec<String>,
    /// The first command whose section lists the worker's flags in full.
    worker_shown_in: Option<String>,
}

impl Sections {
    fn walk(&mut self, out: &mut String, parent: &str, cmd: &Command) {
        let path = format!("{parent} {}", cmd.get_name());
        if cmd.has_subcommands() {
            for sub in cmd.get_subcommands() {
                self.walk(out, &path, sub);
            }
        } else {
            self.command(out, &path, cmd);
        }
    }

    fn command(&mut self, out: &mut String, path: &str, cmd: &Command) {
        out.push_str(&format!("\n## `{path}`\n\n"));
        if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
            out.push_str(&format!("{}\n\n", plain(&sentence(&about.to_string()))));
        }
        let args: Vec<&Arg> = cmd
            .get_arguments()
            .filter(|a| !matches!(a.get_action(), ArgAction::Help | ArgAction::Version))
            .filter(|a| !a.is_hide_set())
            .filter(|a| path == "envworker" || !a.is_global_set())
            .collect();
        let has_worker = args.iter().any(|a| self.is_worker(a));
        let collapse = has_worker && self.worker_shown_in.is_some();
        let mut rows: Vec<Vec<String>> = args
            .iter()
            .filter(|a| !(collapse && self.is_worker(a)))
            .map(|a| row(a))
            .collect();
        if collapse {
            let shown = self.worker_shown_in.clone().unwrap_or_default();
            rows.push(vec![
                "the worker flags".into(),
                String::new(),
                String::new(),
                format!("as for [`{shown}`](#{})", shown.replace(' ', "-")),
            ]);
        }
        if rows.is_empty() {
            out.push_str("It takes no flags of its own.\n");
        } else {
            table(out, &["flag", "variable", "default", "what it sets"], &rows);
        }
        if has_worker && !collapse {
            let first = args
                .iter()
                .find(|a| self.is_worker(a))
                .and_then(|a| a.get_long());
            out.push_str(&format!(
                "\nThe flags from `--{}` down are the worker's, shared by `serve`, `poll` and `run`.\n",
                first.unwrap_or_default()
            ));
            self.worker_shown_in = Some(path.to_string());
        }
        if let Some((_, links)) = SEE_ALSO
            .iter()
            .find(|(name, _)| path == format!("envworker {name}"))
        {
            let links: Vec<String> = links
                .iter()
                .map(|(t, href)| format!("[{t}]({href})"))
                .collect();
            out.push_str(&format!("\nSee also: {}.\n", links.join(", ")));
        }
    }

    fn is_worker(&self, arg: &Arg) -> bool {
        self.worker.iter().any(|id| id == arg.get_id().as_str())
    }
}

/// One flag's row: flag, variable, default, what it sets.
fn row(arg: &Arg) -> Vec<String> {
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    let (help, stated_default) = split_default(&help);
    vec![
        flag(arg),
        variable(arg),
        default(arg, stated_default),
        what_it_sets(arg, &help),
    ]
}

/// The flag as it is typed: `--listen`, `--header NAME=VALUE` (the value's
/// name shown when it says more than the flag's), or `FILE` (an argument).
fn flag(arg: &Arg) -> String {
    let id = arg.get_id().as_str().to_uppercase();
    let named =
        arg.get_action().takes_values() && arg.get_num_args().is_none_or(|n| n.min_values() > 0);
    let value = arg.get_value_names().filter(|_| named).map(|names| {
        names
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    });
    let value = value.filter(|v| *v != id);
    match (arg.get_long(), value) {
        (Some(long), Some(value)) => format!("`--{long} {value}`"),
        (Some(long), None) => format!("`--{long}`"),
        (None, value) => format!("`{}` (argument)", value.unwrap_or(id)),
    }
}

fn variable(arg: &Arg) -> String {
    match arg.get_env() {
        Some(var) if arg.get_value_delimiter() == Some(',') => {
            format!("`{}` (comma-separated)", var.to_string_lossy())
        }
        Some(var) => format!("`{}`", var.to_string_lossy()),
        None => "—".into(),
    }
}

fn default(arg: &Arg, stated: Option<String>) -> String {
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if arg.is_required_set() {
        "— (required)".into()
    } else if matches!(arg.get_action(), ArgAction::SetTrue) || defaults == ["false"] {
        "off".into()
    } else if !defaults.is_empty() {
        defaults
            .iter()
            .map(|d| format!("`{d}`"))
            .collect::<Vec<_>>()
            .join(", ")
    } else {
        stated.map_or_else(|| "—".into(), |d| plain(&d))
    }
}

fn what_it_sets(arg: &Arg, help: &str) -> String {
    let mut text = plain(&sentence(help));
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| v.get_name().to_string())
        .collect();
    let takes_value = arg.get_action().takes_values();
    if takes_value && !values.is_empty() && !values.iter().all(|v| text.contains(v.as_str())) {
        let values: Vec<String> = values.iter().map(|v| format!("`{v}`")).collect();
        text.push_str(&format!(" One of {}.", values.join(", ")));
    }
    if arg.is_hide_env_values_set() {
        text.push_str(" **Secret.**");
    }
    text
}

/// `text` on one line, ending with a full stop (clap drops a one-line
/// help's own).
pub(super) fn sentence(text: &str) -> String {
    let mut text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if !text.is_empty() && !text.ends_with('.') {
        text.push('.');
    }
    text
}

/// The help without its `Default: …` sentence, and that sentence's
/// default: a default the code computes (clap has no value to show) is
/// written in the help that way, and the reference puts it in its column.
fn split_default(help: &str) -> (String, Option<String>) {
    let Some(start) = help.find("Default: ") else {
        return (help.to_string(), None);
    };
    let rest = &help[start + "Default: ".len()..];
    let end = sentence_end(rest);
    let default = rest[..end]
        .trim_end_matches('.')
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let without = format!("{}{}", &help[..start], rest[end..].trim_start_matches(' '));
    (without, Some(default))
}

/// Where the sentence `text` opens ends: a full stop before white space
/// and a capital, a backtick or the end of a paragraph.
fn sentence_end(text: &str) -> usize {
    let bytes = text.as_bytes();
    for (i, _) in text.match_indices('.') {
        let after = &text[i + 1..];
        let next = after.trim_start_matches([' ', '\n']);
        let paragraph_end = after.is_empty() || after.starts_with("\n\n") || next.is_empty();
        let sentence = after.starts_with([' ', '\n'])
            && next.starts_with(|c: char| c.is_ascii_uppercase() || c == '`');
        if paragraph_end || sentence {
            return i + 1;
        }
    }
    bytes.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stated_default_moves_to_its_column() {
        assert_eq!(
            split_default("Where it goes. Default: ~/.local/state, else /tmp.\n\nMore."),
            (
                "Where it goes. \n\nMore.".to_string(),
                Some("~/.local/state, else /tmp".into())
            )
        );
        assert_eq!(
            split_default("Sent on polls. Default: the host name. Then `x`."),
            (
                "Sent on polls. Then `x`.".to_string(),
                Some("the host name".into())
            )
        );
        assert_eq!(
            split_default("No default."),
            ("No default.".to_string(), None)
        );
    }
}
