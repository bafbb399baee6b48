//! `glob` and `grep`, both built in (no dependency on ripgrep being
//! installed) and both bounded: at most 50,000 entries walked, symlinked
//! directories never entered, `.git` and `node_modules` skipped, FIFOs and
//! devices never opened, and the call's deadline honoured.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use serde::Deserialize;
use serde_json::Value;

use super::paths::{PathPolicy, canonicalize};
use super::{ToolError, ToolOutput};

pub const GLOB_RESULT_LIMIT: usize = 200;
pub const WALK_MAX_ENTRIES: usize = 50_000;
pub const GREP_OUTPUT_LIMIT: usize = 100 * 1024;
pub const GREP_MAX_LINE_LENGTH: usize = 2_000;

const SKIPPED_DIRS: [&str; 2] = [".git", "node_modules"];

/// One file met by a walk: its path and what `lstat` said of it.
struct Entry {
    path: PathBuf,
    rel: PathBuf,
    meta: std::fs::Metadata,
}

/// Walk `root` depth-first without following symlinked directories, calling
/// `visit` for every non-directory entry until it returns `false`, the entry
/// budget is spent or the deadline passes (`Err(())`).
fn walk(root: &Path, deadline: Instant, mut visit: impl FnMut(Entry) -> bool) -> Result<(), ()> {
    let mut stack = vec![PathBuf::new()];
    let mut seen = 0usize;
    while let Some(rel_dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&rel_dir)) else {
            continue;
        };
        let mut names: Vec<_> = entries.flatten().collect();
        names.sort_by_key(|e| e.file_name());
        // Depth-first in name order: push directories in reverse.
        let mut dirs = Vec::new();
        for entry in names {
            seen += 1;
            if seen > WALK_MAX_ENTRIES {
                return Ok(());
            }
            if seen.is_multiple_of(256) && Instant::now() >= deadline {
                return Err(());
            }
            let Ok(meta) = entry.metadata() else { continue };
            let rel = rel_dir.join(entry.file_name());
            if meta.is_dir() {
                if !SKIPPED_DIRS.iter().any(|s| entry.file_name() == *s) {
                    dirs.push(rel);
                }
                continue;
            }
            if !visit(Entry {
                path: root.join(&rel),
                rel,
                meta,
            }) {
                return Ok(());
            }
        }
        stack.extend(dirs.into_iter().rev());
    }
    Ok(())
}

#[derive(Deserialize)]
struct GlobInput {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
}

pub fn glob(policy: &PathPolicy, input: Value, deadline: Instant) -> Result<ToolOutput, ToolError> {
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
    let root = match input.path.as_deref().filter(|p| !p.is_empty()) {
        Some(p) => policy.resolve("glob", p)?,
        None => policy.workdir(),
    };
    let matcher = globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map_err(|e| ToolError::new(format!("glob: {}", e.kind())))?
        .compile_matcher();
    let mut matches: Vec<(SystemTime, PathBuf)> = Vec::new();
    let walked = walk(&root, deadline, |entry| {
        if !matcher.is_match(&entry.rel) {
            return true;
        }
        let regular = if entry.meta.file_type().is_symlink() {
            // A symlink counts only when it leads to a regular file inside the search root.
            canonicalize(&entry.path)
                .ok()
                .filter(|real| real.starts_with(&root))
                .and_then(|real| std::fs::metadata(real).ok())
                .filter(|m| m.is_file())
        } else {
            Some(entry.meta).filter(|m| m.is_file())
        };
        if let Some(meta) = regular {
            let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            matches.push((mtime, entry.path));
        }
        true
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

/// Search one regular file; `false` when the output budget ran out.
fn grep_file(rx: &regex::Regex, path: &Path, hits: &mut Hits) -> bool {
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(path)
    else {
        return true;
    };
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return true;
    }
    let mut file = file;
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
    let mut stream = BufReader::new(std::io::Cursor::new(head[..filled].to_vec()).chain(file));
    let mut raw = Vec::new();
    let mut number = 0usize;
    loop {
        raw.clear();
        match stream.read_until(b'\n', &mut raw) {
            Ok(0) | Err(_) => return true,
            Ok(_) => {}
        }
        number += 1;
        // Long lines are skipped, as the reference does (minified files, data blobs).
        if raw.len() > GREP_MAX_LINE_LENGTH {
            continue;
        }
        let line = String::from_utf8_lossy(&raw);
        let line = line.trim_end_matches(['\r', '\n']);
        if rx.is_match(line) && !hits.push(format!("{}:{number}:{line}", path.display())) {
            return false;
        }
    }
}

pub fn grep(policy: &PathPolicy, input: Value, deadline: Instant) -> Result<ToolOutput, ToolError> {
    let input: GrepInput = super::parse_input("grep", input)?;
    let search = match input.path.as_deref().filter(|p| !p.is_empty()) {
        Some(p) => policy.resolve("grep", p)?,
        None => policy.workdir(),
    };
    let rx = regex::RegexBuilder::new(&input.pattern)
        .size_limit(10 * 1024 * 1024)
        .build()
        .map_err(|e| ToolError::new(format!("grep: invalid regex: {e}")))?;
    let mut hits = Hits {
        lines: Vec::new(),
        budget: GREP_OUTPUT_LIMIT as isize,
    };
    let is_file = std::fs::symlink_metadata(&search).is_ok_and(|m| m.is_file());
    if is_file {
        grep_file(&rx, &search, &mut hits);
    } else {
        let walked = walk(&search, deadline, |entry| {
            if !entry.meta.is_file() {
                return true; // symlinks, FIFOs, devices, sockets
            }
            if Instant::now() >= deadline {
                return false;
            }
            grep_file(&rx, &entry.path, &mut hits)
        });
        if walked.is_err() || Instant::now() >= deadline {
            return Err(ToolError::new("grep: timed out"));
        }
    }
    if hits.lines.is_empty() {
        return Ok(ToolOutput::Text("no matches".into()));
    }
    Ok(ToolOutput::Text(hits.lines.join("\n")))
}
