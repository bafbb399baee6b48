//! The release kit, as an operator or a packager meets it: the completion
//! scripts and man pages the binary prints are generated from the same
//! definitions that parse its command line (so they name every subcommand and
//! are valid for their shell or `groff`), and the statically linked (musl)
//! build runs and needs no dynamic loader, with SQLite left out of a
//! `--no-default-features` build.
//!
//! The static build: `.ci/run` builds it in release mode and names it in
//! `ENVWORKER_STATIC_BINARY`; without that variable the test builds a debug
//! one itself into `target/static` (a few minutes the first time).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use clap::CommandFactory;
use envworker::cli::Cli;

const SHELLS: [&str; 5] = ["bash", "zsh", "fish", "elvish", "powershell"];
/// Flags every completion script must offer: a global one, and some of `serve`'s and `man`'s.
const FLAGS: [&str; 4] = ["--log-format", "--listen", "--environment-id", "--out"];
const MUSL: &str = "x86_64-unknown-linux-musl";

fn envworker() -> Command {
    Command::new(env!("CARGO_BIN_EXE_envworker"))
}

fn ok(output: Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what}: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap_or_else(|e| panic!("{what}: stdout is not UTF-8: {e}"))
}

/// The visible subcommands of this build (`dev` and `devserver` only with the feature).
fn subcommands() -> Vec<String> {
    Cli::command()
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| c.get_name().to_string())
        .collect()
}

#[test]
fn each_shells_completion_names_every_subcommand_and_the_main_flags() {
    let names = subcommands();
    assert_eq!(
        names.iter().any(|n| n == "devserver"),
        cfg!(feature = "devserver"),
        "the devserver subcommands follow the cargo feature: {names:?}"
    );
    for shell in SHELLS {
        let script = ok(
            envworker().args(["completions", shell]).output().unwrap(),
            shell,
        );
        for name in names.iter().map(String::as_str).chain(["sign"]) {
            assert!(script.contains(name), "{shell}: no subcommand {name}");
        }
        for flag in FLAGS {
            // fish spells a long flag `-l name`.
            let spelled = match shell {
                "fish" => format!("-l {}", &flag[2..]),
                _ => flag.to_string(),
            };
            assert!(script.contains(&spelled), "{shell}: no flag {spelled}");
        }
    }
    let refused = envworker().args(["completions", "tcsh"]).output().unwrap();
    assert!(!refused.status.success(), "an unknown shell is refused");
}

/// The scripts parse in the shells that are installed (bash always is).
#[test]
fn completion_scripts_parse_in_their_shell() {
    let dir = tempfile::tempdir().unwrap();
    for (shell, check) in [("bash", "-n"), ("zsh", "-n"), ("fish", "--no-execute")] {
        let installed = Command::new("sh")
            .args(["-c", &format!("command -v {shell}")])
            .output()
            .unwrap()
            .status
            .success();
        if !installed {
            assert_ne!(shell, "bash", "bash must be installed");
            continue;
        }
        let script = ok(
            envworker().args(["completions", shell]).output().unwrap(),
            shell,
        );
        let path = dir.path().join(format!("envworker.{shell}"));
        std::fs::write(&path, script).unwrap();
        ok(
            Command::new(shell).arg(check).arg(&path).output().unwrap(),
            &format!("{shell} {check}"),
        );
    }
    // Sourced into bash, the function completes the subcommands.
    let script = dir.path().join("envworker.bash");
    let words = ok(
        Command::new("bash")
            .arg("-c")
            .arg(format!(
                "source {}; COMP_WORDS=(envworker se); COMP_CWORD=1; COMP_LINE='envworker se'; \
                 COMP_POINT=${{#COMP_LINE}}; _envworker envworker se envworker; echo \"${{COMPREPLY[@]}}\"",
                script.display()
            ))
            .output()
            .unwrap(),
        "bash completion of `envworker se`",
    );
    assert_eq!(words.trim(), "serve", "bash completes `se` to serve");
}

/// `groff` renders `page` as `man` does (`-k`: the UTF-8 help text through
/// preconv); its warnings (`-ww`) fail the test.
fn render(page: &Path) -> String {
    let output = Command::new("groff")
        .args(["-k", "-man", "-Tutf8", "-ww"])
        .arg(page)
        .env("GROFF_NO_SGR", "1")
        .output()
        .expect("groff must be installed (.ci/run installs groff-base)");
    assert!(
        output.stderr.is_empty(),
        "{}: groff warns: {}",
        page.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    // Bold and underline are drawn with backspaces on a terminal.
    let text = ok(output, "groff");
    let mut plain = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\u{8}' {
            plain.pop();
        } else {
            plain.push(c);
        }
    }
    plain
}

#[test]
fn man_writes_a_page_per_subcommand_that_groff_renders() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("man1");
    let listed = ok(
        envworker()
            .args(["man", "--out"])
            .arg(&out)
            .output()
            .unwrap(),
        "envworker man",
    );
    let mut expected: Vec<PathBuf> = ["envworker".to_string(), "envworker-webhook-sign".into()]
        .into_iter()
        .chain(subcommands().iter().map(|n| format!("envworker-{n}")))
        .map(|stem| out.join(format!("{stem}.1")))
        .collect();
    for page in &expected {
        assert!(page.is_file(), "{} written", page.display());
        assert!(
            listed.lines().any(|l| Path::new(l) == page),
            "{} listed on stdout:\n{listed}",
            page.display()
        );
    }
    expected.sort();
    let mut found: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    found.sort();
    assert_eq!(found, expected, "exactly one page per (sub)command");

    let main = render(&out.join("envworker.1"));
    for name in subcommands() {
        assert!(
            main.contains(&format!("envworker-{name}(1)")),
            "envworker(1) refers to envworker-{name}(1):\n{main}"
        );
    }
    let serve = render(&out.join("envworker-serve.1"));
    for needle in [
        "--listen",
        "ANTHROPIC_ENVIRONMENT_ID",
        "ENVWORKER_STOP_GRACE",
    ] {
        assert!(
            serve.contains(needle),
            "envworker-serve(1) mentions {needle}"
        );
    }
    for page in &found {
        render(page);
    }
}

/// What the ELF program headers say about linking.
#[derive(Debug, PartialEq)]
struct Linking {
    /// A `PT_INTERP`: the kernel must start a dynamic loader first.
    interpreter: bool,
    /// `DT_NEEDED` entries: shared libraries the loader must find.
    needed: usize,
}

/// Reads the program headers of a little-endian ELF64 file.
fn linking(path: &Path) -> Linking {
    let elf = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&elf[..4], b"\x7fELF", "{} is ELF", path.display());
    assert_eq!((elf[4], elf[5]), (2, 1), "ELF64, little-endian");
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap()) as usize;
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    let mut result = Linking {
        interpreter: false,
        needed: 0,
    };
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        let p_type = u32::from_le_bytes(elf[ph..ph + 4].try_into().unwrap());
        let (offset, size) = (u64_at(ph + 8), u64_at(ph + 32));
        match p_type {
            3 => result.interpreter = true,
            2 => {
                // Static PIE keeps a dynamic section for its own relocations, but needs nothing.
                for entry in elf[offset..offset + size].chunks_exact(16) {
                    match u64::from_le_bytes(entry[..8].try_into().unwrap()) {
                        0 => break,
                        1 => result.needed += 1,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    result
}

/// The musl binary: `ENVWORKER_STATIC_BINARY`, or a debug build of the
/// production configuration (`--no-default-features`) made here.
fn static_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("ENVWORKER_STATIC_BINARY") {
        return PathBuf::from(path);
    }
    let target_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/static");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--locked",
            "--no-default-features",
            "--bin",
            "envworker",
        ])
        .args(["--target", MUSL, "--target-dir"])
        .arg(&target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap();
    assert!(
        status.success(),
        "the musl build failed: it needs `rustup target add {MUSL}` and musl-gcc (Debian: musl-tools)"
    );
    target_dir.join(MUSL).join("debug/envworker")
}

#[test]
fn the_static_build_runs_without_a_loader_and_leaves_sqlite_out() {
    // The checker itself: the ordinary (glibc) build needs a loader and libc.
    let ordinary = linking(Path::new(env!("CARGO_BIN_EXE_envworker")));
    assert!(
        ordinary.interpreter && ordinary.needed > 0,
        "glibc build: {ordinary:?}"
    );

    let binary = static_binary();
    assert_eq!(
        linking(&binary),
        Linking {
            interpreter: false,
            needed: 0
        },
        "{} is statically linked",
        binary.display()
    );
    let version = ok(
        Command::new(&binary).arg("--version").output().unwrap(),
        "static --version",
    );
    assert_eq!(
        version.trim(),
        format!("envworker {}", env!("CARGO_PKG_VERSION"))
    );
    // The production configuration: no devserver, no SQLite inside.
    let help = ok(
        Command::new(&binary).arg("--help").output().unwrap(),
        "static --help",
    );
    let commands: Vec<&str> = help
        .lines()
        .filter_map(|l| l.strip_prefix("  ")?.split_whitespace().next())
        .collect();
    assert!(
        commands.contains(&"serve")
            && !commands.contains(&"devserver")
            && !commands.contains(&"dev"),
        "{help}"
    );
    let bytes = std::fs::read(&binary).unwrap();
    // SQLite's file header, a string constant inside SQLite (it survives `strip`).
    let has_sqlite = |b: &[u8]| b.windows(15).any(|w| w == b"SQLite format 3");
    assert!(
        !has_sqlite(&bytes),
        "SQLite is left out of {}",
        binary.display()
    );
    let ordinary = std::fs::read(env!("CARGO_BIN_EXE_envworker")).unwrap();
    assert_eq!(
        has_sqlite(&ordinary),
        cfg!(feature = "devserver"),
        "the SQLite probe finds SQLite where it is"
    );
}
