//! `envworker completions SHELL`: the completion script clap_complete
//! derives from the same definitions that parse the command line, so it
//! never lists a flag the binary does not take.

use std::io::Write;

use clap::CommandFactory;

use crate::cli::{Cli, CompletionsArgs};

/// Writes the completion script for `shell` to `out`.
pub fn write(shell: clap_complete::Shell, out: &mut dyn Write) {
    let mut cmd = Cli::command();
    let name = cmd.get_name().to_string();
    clap_complete::generate(shell, &mut cmd, name, out);
}

pub fn run(args: CompletionsArgs) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    write(args.shell, &mut out);
    out.flush()?;
    Ok(())
}
