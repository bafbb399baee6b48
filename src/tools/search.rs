//! `glob` and `grep`, both built in (no dependency on ripgrep being
//! installed) and both bounded: at most 50,000 entries walked and 256
//! levels entered ([`WALK_MAX_DEPTH`]), at most 100 MiB read of one file and
//! 2,000 bytes held of one line (a one-line sparse file of gigabytes costs
//! neither memory nor the call's deadline; see `lines.rs`), `.git` and
//! `node_modules` skipped, FIFOs and devices never opened, and the call's
//! deadline honoured.
//!
//! The search path is resolved as every tool path is, its symlinks followed
//! (see [`super::paths`]), and answers name files below its canonical path,
//! as the reference's do. Below it, as the reference: `grep`'s walk never
//! follows a symlink (not even to a file); `glob` follows one where Python's
//! `Path.glob` does (see [`super::glob_walk`]).
//!
//! The walk goes by directory fd, never by path: the search root is opened
//! from its root's fd, each subdirectory with `openat(O_NOFOLLOW |
//! O_DIRECTORY)` from its parent's fd, each entry classified with
//! `fstatat(AT_SYMLINK_NOFOLLOW)` and each file opened with
//! `openat(O_NOFOLLOW)` in its directory's fd. A directory exchanged for a
//! symlink mid-walk is skipped, never entered.

use std::ffi::{CStr, CString, OsStr};
use std::io::{BufReader, Read};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;
use serde::Deserialize;
use serde_json::Value;

use super::glob_walk::{Pattern, SearchRoot};
use super::lines;
use super::paths::{Failed, PathPolicy, Target};
use super::walk::{SKIPPED_DIRS, WALK_MAX_DEPTH, WALK_MAX_ENTRIES, sorted_names};
use super::{ToolError, ToolOutput};
use crate::fsx;

pub(crate) const GLOB_RESULT_LIMIT: usize = 200;
pub(crate) const GREP_OUTPUT_LIMIT: usize = 100 * 1024;
pub(crate) const GREP_MAX_LINE_LENGTH: usize = 2_000;
/// Most bytes grep reads of one file (100 MiB, a notice says where it
/// stopped): a sparse or huge file costs bounded time, not the whole call's
/// deadline, and the other files are still searched.
pub(crate) const GREP_MAX_FILE_BYTES: u64 = 100 * 1024 * 1024;

/// One non-directory entry met by a walk: its directory's fd, its name
/// there, its path below the search root, and what `fstatat` (no follow)
/// said of it.
struct Entry<'a> {
    dir: &'a OwnedFd,
    name: &'a CStr,
    rel: PathBuf,
    stat: Stat,
}

/// A directory being walked: its fd, its path below the search root and
/// its depth; shared by its pending subdirectories, so a path is held once
/// per level, not once per pending sibling.
struct Level {
    fd: OwnedFd,
    rel: PathBuf,
    depth: usize,
}

/// A directory still to walk: its parent and its name there.
struct Pending {
    parent: Rc<Level>,
    name: CString,
}

/// Walk the directory `root` depth-first in name order without following
/// symlinks, calling `visit` for every non-directory entry until it returns
/// `false`, the entry budget is spent or the deadline passes (`Err(())`).
/// Directories deeper than [`WALK_MAX_DEPTH`] are not entered.
fn walk(
    root: OwnedFd,
    deadline: Instant,
    mut visit: impl FnMut(Entry<'_>) -> bool,
) -> Result<(), ()> {
    let mut stack: Vec<Pending> = Vec::new();
    let mut seen = 0usize;
    let mut next = Some(Level {
        fd: root,
        rel: PathBuf::new(),
        depth: 0,
    });
    loop {
        let level = match next.take() {
            Some(level) => level,
            None => {
                let Some(p) = stack.pop() else { return Ok(()) };
                // A directory swapped for a symlink (or removed) since it was listed: skipped.
                // A mount of /proc or /sys below the root (a root of `/`) is skipped.
                match rustix::fs::openat(
                    &p.parent.fd,
                    p.name.as_c_str(),
                    fsx::DIR_FLAGS,
                    Mode::empty(),
                )
                .and_then(fsx::refuse_pseudo_fs)
                {
                    Ok(fd) => Level {
                        fd,
                        rel: p.parent.rel.join(OsStr::from_bytes(p.name.as_bytes())),
                        depth: p.parent.depth + 1,
                    },
                    Err(_) => continue,
                }
            }
        };
        let Some(names) = sorted_names(&level.fd) else {
            continue;
        };
        let level = Rc::new(level);
        // Depth-first in name order: push directories in reverse.
        let mut dirs = Vec::new();
        for name in names {
            seen += 1;
            if seen > WALK_MAX_ENTRIES {
                return Ok(());
            }
            if seen.is_multiple_of(256) && Instant::now() >= deadline {
                return Err(());
            }
            let Ok(stat) =
                rustix::fs::statat(&level.fd, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
            else {
                continue;
            };
            if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
                if !SKIPPED_DIRS.contains(&name.as_bytes()) && level.depth < WALK_MAX_DEPTH {
                    dirs.push(Pending {
                        parent: level.clone(),
                        name,
                    });
                }
                continue;
            }
            if !visit(Entry {
                dir: &level.fd,
                name: &name,
                rel: level.rel.join(OsStr::from_bytes(name.as_bytes())),
                stat,
            }) {
                return Ok(());
            }
        }
        stack.extend(dirs.into_iter().rev());
    }
}

/// The search path opened from its root's fd: a directory, a regular
/// file, or nothing to search (missing, or neither).
enum Opened {
    Dir(OwnedFd),
    File(OwnedFd),
    Other,
}

fn open_search_root(op: &str, target: &Target<'_>) -> Result<Opened, Failed> {
    let fd = match target.open_errno(OFlags::RDONLY | OFlags::NONBLOCK) {
        Ok(fd) => fd,
        // A search under a path that does not exist finds nothing.
        Err(Errno::NOENT | Errno::NOTDIR) => return Ok(Opened::Other),
        Err(e) => return Err(target.fail(op, e)),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| target.fail(op, e))?;
    Ok(match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => Opened::Dir(fd),
        FileType::RegularFile => Opened::File(fd),
        _ => Opened::Other,
    })
}

/// Resolve the search path (`None`: the workdir) and open it: its
/// canonical path (what answers name) and what it is.
fn search_path(
    op: &str,
    policy: &PathPolicy,
    path: Option<&str>,
    check: impl Fn() -> Result<(), ToolError>,
) -> Result<(PathBuf, Opened), ToolError> {
    policy.with_target(op, path.filter(|p| !p.is_empty()), |target| {
        check()?;
        Ok((target.shown().to_path_buf(), open_search_root(op, target)?))
    })
}

#[derive(Deserialize)]
struct GlobInput {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
}

pub(crate) fn glob(
    policy: &PathPolicy,
    input: Value,
    deadline: Instant,
) -> Result<ToolOutput, ToolError> {
    let input: GlobInput = super::parse_input("glob", input)?;
    let pattern = input.pattern.as_str();
    if pattern.starts_with('/') {
        return Err(ToolError::new(
            "glob: absolute pattern not permitted; pass a relative pattern (and optionally path)",
        ));
    }
    if pattern.split('/').any(|seg| seg == "..") {
        return Err(ToolError::new("glob: '..' is not permitted in the pattern"));
    }
    // The reference refuses an empty pattern once the path resolved
    // (`Path.glob("")`), in Python's words.
    let (shown, opened) = search_path("glob", policy, input.path.as_deref(), || {
        if pattern.is_empty() {
            return Err(ToolError::new("glob: Unacceptable pattern: ''"));
        }
        Ok(())
    })?;
    let matcher = Pattern::parse(pattern)?;
    // A pattern ending in `/` names directories only; glob lists files.
    let Opened::Dir(root) = opened else {
        return Ok(ToolOutput::Text("no matches".into()));
    };
    if pattern.ends_with('/') {
        return Ok(ToolOutput::Text("no matches".into()));
    }
    let mut matches: Vec<(i128, PathBuf)> = Vec::new();
    let walked = SearchRoot {
        fd: &root,
        canonical: &shown,
    }
    .walk(&matcher, deadline, |rel, mtime| {
        matches.push((mtime, shown.join(rel)));
    });
    if walked.is_err() {
        return Err(ToolError::new("glob: timed out"));
    }
    if matches.is_empty() {
        return Ok(ToolOutput::Text("no matches".into()));
    }
    matches.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let lines: Vec<String> = matches
        .iter()
        .take(GLOB_RESULT_LIMIT)
        .map(|(_, p)| p.display().to_string())
        .collect();
    Ok(ToolOutput::Text(lines.join("\n")))
}

#[derive(Deserialize)]
struct GrepInput {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
}

/// What `grep` looks for: a regex, or — when the pattern has no regex
/// metacharacter, so the regex would match exactly that text — the text
/// itself, found without building a regex (its compilation is most of a
/// small grep's CPU). The lines matched are the same.
enum GrepPattern {
    Literal(String),
    Regex(regex::Regex),
}

impl GrepPattern {
    fn new(pattern: &str) -> Result<GrepPattern, ToolError> {
        if regex::escape(pattern) == pattern {
            return Ok(GrepPattern::Literal(pattern.to_string()));
        }
        regex::RegexBuilder::new(pattern)
            .size_limit(10 * 1024 * 1024)
            .build()
            .map(GrepPattern::Regex)
            .map_err(|e| ToolError::new(format!("grep: invalid regex: {e}")))
    }

    fn is_match(&self, line: &str) -> bool {
        match self {
            GrepPattern::Literal(text) => line.contains(text.as_str()),
            GrepPattern::Regex(rx) => rx.is_match(line),
        }
    }
}

/// Collects `file:line:text` hits within the output budget.
struct Hits {
    lines: Vec<String>,
    budget: isize,
}

impl Hits {
    /// `false` once the budget is spent (the truncation notice is then added).
    fn push(&mut self, line: String) -> bool {
        self.budget -= line.len() as isize + 1;
        if self.budget < 0 {
            self.lines
                .push(format!("[output truncated at {GREP_OUTPUT_LIMIT} bytes]"));
            return false;
        }
        self.lines.push(line);
        true
    }
}

/// Search one regular file (`name` in `dir`, opened without following a
/// symlink); `false` when the output budget ran out or the deadline passed.
fn grep_at(
    rx: &GrepPattern,
    dir: &OwnedFd,
    name: &CStr,
    shown: &Path,
    hits: &mut Hits,
    deadline: Instant,
) -> bool {
    let Ok(fd) = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return true;
    };
    grep_fd(rx, fd, shown, hits, deadline)
}

/// Search an open file, if it is a regular one, streaming its lines: at
/// most [`GREP_MAX_LINE_LENGTH`] bytes of a line are held (a longer line is
/// skipped without being buffered), at most [`GREP_MAX_FILE_BYTES`] are
/// read, and the deadline is checked at every buffer-full. `false` when the
/// output budget ran out or the deadline passed.
fn grep_fd(rx: &GrepPattern, fd: OwnedFd, path: &Path, hits: &mut Hits, deadline: Instant) -> bool {
    if !rustix::fs::fstat(&fd)
        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile)
    {
        return true;
    }
    let mut file = std::fs::File::from(fd);
    // A NUL in the first 512 bytes marks a binary file: skipped.
    let mut head = [0u8; 512];
    let mut filled = 0;
    while filled < head.len() {
        match file.read(&mut head[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(_) => return true,
        }
    }
    if head[..filled].contains(&0) {
        return true;
    }
    let mut stream = BufReader::new(std::io::Cursor::new(&head[..filled]).chain(file));
    let mut number = 0usize;
    let mut full = false;
    let stop = lines::each_line(
        &mut stream,
        GREP_MAX_LINE_LENGTH,
        GREP_MAX_FILE_BYTES,
        deadline,
        |line| {
            number += 1;
            // Long lines are skipped, as the reference does (minified files, data blobs).
            if line.overlong {
                return true;
            }
            let text = String::from_utf8_lossy(line.bytes);
            let text = text.trim_end_matches('\r');
            if rx.is_match(text) && !hits.push(format!("{}:{number}:{text}", path.display())) {
                full = true;
                return false;
            }
            true
        },
    );
    match stop {
        Ok(lines::Stop::Budget) => hits.push(format!(
            "[{}: searched only the first {GREP_MAX_FILE_BYTES} bytes]",
            path.display()
        )),
        Ok(lines::Stop::Deadline) => false,
        Ok(lines::Stop::Visitor) => !full,
        Ok(lines::Stop::End) | Err(_) => true,
    }
}

pub(crate) fn grep(
    policy: &PathPolicy,
    input: Value,
    deadline: Instant,
) -> Result<ToolOutput, ToolError> {
    let input: GrepInput = super::parse_input("grep", input)?;
    let (shown, opened) = search_path("grep", policy, input.path.as_deref(), || Ok(()))?;
    let rx = GrepPattern::new(&input.pattern)?;
    let mut hits = Hits {
        lines: Vec::new(),
        budget: GREP_OUTPUT_LIMIT as isize,
    };
    match opened {
        Opened::File(fd) => {
            grep_fd(&rx, fd, &shown, &mut hits, deadline);
            if Instant::now() >= deadline {
                return Err(ToolError::new("grep: timed out"));
            }
        }
        Opened::Dir(root) => {
            let walked = walk(root, deadline, |entry| {
                if FileType::from_raw_mode(entry.stat.st_mode) != FileType::RegularFile {
                    return true; // symlinks, FIFOs, devices, sockets
                }
                if Instant::now() >= deadline {
                    return false;
                }
                let shown = shown.join(&entry.rel);
                grep_at(&rx, entry.dir, entry.name, &shown, &mut hits, deadline)
            });
            if walked.is_err() || Instant::now() >= deadline {
                return Err(ToolError::new("grep: timed out"));
            }
        }
        Opened::Other => {}
    }
    if hits.lines.is_empty() {
        return Ok(ToolOutput::Text("no matches".into()));
    }
    Ok(ToolOutput::Text(hits.lines.join("\n")))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_pattern_without_metacharacters_is_searched_as_text() {
        for (pattern, literal) in [
            ("gamma 3", true),
            ("", true),
            ("fn main()", false),
            ("a.b", false),
            ("x+", false),
            ("tag#1", false),
            ("ünïcode wörds", true),
            ("^start", false),
        ] {
            let p = GrepPattern::new(pattern).unwrap();
            assert_eq!(matches!(p, GrepPattern::Literal(_)), literal, "{pattern:?}");
        }
        assert!(GrepPattern::new("(unclosed").is_err());
    }

    proptest! {
        /// Whichever way a pattern is searched, it matches the lines the
        /// regex matches.
        #[test]
        fn the_literal_path_matches_what_the_regex_matches(
            pattern in "[ab .*()\\[\\]^$#é]{0,6}",
            line in "[ab .*()\\[\\]^$#é]{0,12}",
        ) {
            if let (Ok(p), Ok(rx)) = (GrepPattern::new(&pattern), regex::Regex::new(&pattern)) {
                prop_assert_eq!(p.is_match(&line), rx.is_match(&line));
            }
        }
    }
}
