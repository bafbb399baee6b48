//! `envworker man [--out DIR]`: man pages rendered by clap_mangen from the
//! command-line definitions, so the pages and `--help` never disagree.
//! Packagers run it at build time; operators of a static binary can run it
//! once and point `MANPATH` at the directory.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::CommandFactory;

use crate::cli::{Cli, ManArgs};

/// Writes `envworker.1` and one page per subcommand (`envworker-serve.1`,
/// `envworker-webhook-sign.1`, …) into `dir`; returns the paths written.
pub fn write_pages(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    fn walk(cmd: clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
            walk(sub, dir, written)?;
        }
        written.push(clap_mangen::Man::new(cmd).generate_to(dir)?);
        Ok(())
    }
    std::fs::create_dir_all(dir)?;
    // `build` names each subcommand `envworker-<name>`, which titles its page.
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut written = Vec::new();
    walk(cmd, dir, &mut written)?;
    written.reverse();
    Ok(written)
}

pub fn run(args: ManArgs) -> anyhow::Result<()> {
    let written = write_pages(&args.out)
        .with_context(|| format!("cannot write man pages into {}", args.out.display()))?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}
