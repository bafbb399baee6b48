//! `read`, `write` and `edit`.
//!
//! Files are opened with `O_NOFOLLOW | O_NONBLOCK` after the path policy made
//! the path canonical: a symlink swapped in afterwards is refused, not
//! followed, and a FIFO or a device is refused after `fstat` without ever
//! blocking on it. Writes go to a temporary file in the same directory,
//! are flushed to disk and renamed over the target, so a reader (or the
//! memory sync) never sees half a file.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};

use super::paths::{PathPolicy, fs_reason};
use super::{ToolError, ToolOutput};

/// Cap of a whole-file `read` and of `edit` (both load the whole file).
pub const DEFAULT_MAX_FILE_BYTES: u64 = 256 * 1024;
/// Cap on the base64 form of an image `read` returns as a content block.
pub const MAX_IMAGE_BASE64_BYTES: u64 = 5 * 1024 * 1024;
/// Cap on the raw size of a PDF `read` returns as a document block.
pub const MAX_PDF_BYTES: u64 = 20 * 1024 * 1024;

/// Files `read` returns as base64 blocks rather than text.
fn media_type(path: &Path) -> Option<&'static str> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    Some(match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        _ => return None,
    })
}

fn fs_error(op: &str, p: &str, e: &io::Error) -> ToolError {
    ToolError::new(format!("{op}: {p}: {}", fs_reason(e)))
}

/// Open a canonical path for reading: no symlink leaf, no blocking open.
fn open_regular(op: &str, target: &Path, p: &str) -> Result<(File, u64), ToolError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(target)
        .map_err(|e| fs_error(op, p, &e))?;
    let meta = file.metadata().map_err(|e| fs_error(op, p, &e))?;
    if !meta.file_type().is_file() {
        return Err(ToolError::new(format!("{op}: {p}: not a regular file")));
    }
    Ok((file, meta.len()))
}

#[derive(Deserialize)]
struct ReadInput {
    file_path: String,
    #[serde(default)]
    view_range: Option<Vec<i64>>,
}

pub fn read(
    policy: &PathPolicy,
    max_bytes: Option<u64>,
    input: Value,
) -> Result<ToolOutput, ToolError> {
    let input: ReadInput = super::parse_input("read", input)?;
    let p = input.file_path.as_str();
    let target = policy.resolve("read", p)?;
    let view_range = input.view_range.filter(|r| !r.is_empty());
    let range = match view_range.as_deref() {
        None => None,
        Some([start, end]) => Some((*start, *end)),
        Some(_) => {
            return Err(ToolError::new(
                "read: view_range must be [start_line, end_line]",
            ));
        }
    };
    let (mut file, size) = open_regular("read", &target, p)?;
    if let Some(media) = media_type(&target) {
        if range.is_some() {
            return Err(ToolError::new(
                "read: view_range is not supported for image/PDF files",
            ));
        }
        // The text cap does not apply: the media caps (the API's own limits) do.
        let limit = if media == "application/pdf" {
            MAX_PDF_BYTES
        } else {
            MAX_IMAGE_BASE64_BYTES / 4 * 3
        };
        if size > limit {
            return Err(ToolError::new(format!(
                "read: {p} is {size} bytes, exceeds {limit}-byte limit for image/PDF files."
            )));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        file.read_to_end(&mut bytes)
            .map_err(|e| fs_error("read", p, &e))?;
        let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
        let kind = if media == "application/pdf" {
            "document"
        } else {
            "image"
        };
        return Ok(ToolOutput::Blocks(vec![json!({
            "type": kind,
            "source": {"type": "base64", "media_type": media, "data": data}
        })]));
    }
    if let Some(limit) = max_bytes
        && size > limit
    {
        let Some((start, end)) = range else {
            return Err(ToolError::new(format!(
                "read: {p} is {size} bytes, exceeds {limit}-byte limit. Use the view_range parameter to read specific line ranges, e.g. view_range: [1, 500]."
            )));
        };
        return read_line_range(file, p, start, end, limit);
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.read_to_end(&mut bytes)
        .map_err(|e| fs_error("read", p, &e))?;
    let text = String::from_utf8(bytes).map_err(|_| {
        ToolError::new(format!(
            "read: {p}: not valid UTF-8 text (binary files are only supported for image/PDF extensions)"
        ))
    })?;
    let Some((start, end)) = range else {
        return Ok(ToolOutput::Text(text));
    };
    let lines: Vec<&str> = text.split('\n').collect();
    let from = (start.max(1) - 1) as usize;
    let to = if end > 0 {
        (end as usize).min(lines.len())
    } else {
        lines.len()
    };
    Ok(ToolOutput::Text(if from >= to {
        String::new()
    } else {
        lines[from..to].join("\n")
    }))
}

/// Lines `[start, end]` of a file too large to load whole, streamed; the
/// selected bytes are capped at `limit`.
fn read_line_range(
    file: File,
    p: &str,
    start: i64,
    end: i64,
    limit: u64,
) -> Result<ToolOutput, ToolError> {
    use std::io::BufRead;
    let from = (start.max(1) - 1) as u64;
    let to = if end > 0 { end as u64 } else { u64::MAX };
    if to <= from {
        return Ok(ToolOutput::Text(String::new()));
    }
    let mut reader = io::BufReader::with_capacity(64 * 1024, file);
    let mut out: Vec<u8> = Vec::new();
    let mut line = Vec::new();
    let mut index = 0u64;
    while index < to {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| fs_error("read", p, &e))?;
        if n == 0 {
            break;
        }
        if index >= from {
            let terminated = line.last() == Some(&b'\n');
            if terminated {
                line.pop();
            }
            out.extend_from_slice(&line);
            if terminated && index + 1 < to {
                out.push(b'\n');
            }
            if out.len() as u64 > limit {
                return Err(ToolError::new(if to - from == 1 {
                    format!(
                        "read: line {} of {p} alone exceeds {limit}-byte limit. The read tool cannot return part of a line, so view_range cannot narrow this further.",
                        from + 1
                    )
                } else {
                    format!(
                        "read: view_range [{start}, {end}] of {p} exceeds {limit}-byte limit. Narrow the view_range to read a smaller portion."
                    )
                }));
            }
        }
        index += 1;
    }
    String::from_utf8(out).map(ToolOutput::Text).map_err(|_| {
        ToolError::new(format!(
            "read: {p}: not valid UTF-8 text (binary files are only supported for image/PDF extensions)"
        ))
    })
}

/// Replace `target` atomically with `content`: temporary file in the same
/// directory, fsync, rename. A new file gets 0644; an existing one keeps its mode.
fn write_atomic(target: &Path, content: &[u8]) -> io::Result<()> {
    let dir = target.parent().unwrap_or(Path::new("/"));
    let mode = match std::fs::symlink_metadata(target) {
        Ok(m) if m.file_type().is_dir() => {
            return Err(io::Error::from_raw_os_error(
                rustix::io::Errno::ISDIR.raw_os_error(),
            ));
        }
        Ok(m) if m.file_type().is_file() => m.permissions().mode() & 0o7777,
        _ => 0o644,
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".envworker-write-")
        .tempfile_in(dir)?;
    tmp.write_all(content)?;
    tmp.as_file().sync_all()?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))?;
    tmp.persist(target).map_err(|e| e.error)?;
    Ok(())
}

/// Create missing parents with 0755.
fn create_parents(target: &Path) -> io::Result<()> {
    let Some(parent) = target.parent() else {
        return Ok(());
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(parent)
}

#[derive(Deserialize)]
struct WriteInput {
    file_path: String,
    content: String,
}

pub fn write(policy: &PathPolicy, input: Value) -> Result<ToolOutput, ToolError> {
    let input: WriteInput = super::parse_input("write", input)?;
    let p = input.file_path.as_str();
    let target = policy.resolve("write", p)?;
    policy.check_writable("write", &target, p)?;
    create_parents(&target).map_err(|e| fs_error("write", p, &e))?;
    write_atomic(&target, input.content.as_bytes()).map_err(|e| fs_error("write", p, &e))?;
    Ok(ToolOutput::Text(format!(
        "wrote {} bytes to {p}",
        input.content.len()
    )))
}

#[derive(Deserialize)]
struct EditInput {
    file_path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: Option<bool>,
}

pub fn edit(
    policy: &PathPolicy,
    max_bytes: Option<u64>,
    input: Value,
) -> Result<ToolOutput, ToolError> {
    let input: EditInput = super::parse_input("edit", input)?;
    let p = input.file_path.as_str();
    if input.old_string.is_empty() {
        return Err(ToolError::new("edit: old_string must not be empty"));
    }
    let target = policy.resolve("edit", p)?;
    policy.check_writable("edit", &target, p)?;
    let (mut file, size) = open_regular("edit", &target, p)?;
    if let Some(limit) = max_bytes
        && size > limit
    {
        return Err(ToolError::new(format!(
            "edit: {p} is {size} bytes, exceeds {limit}-byte limit. The edit tool loads the whole file and cannot modify a file this large."
        )));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.read_to_end(&mut bytes)
        .map_err(|e| fs_error("edit", p, &e))?;
    drop(file);
    let text = String::from_utf8(bytes).map_err(|_| {
        ToolError::new(format!(
            "edit: {p}: not valid UTF-8 text (cannot edit binary files)"
        ))
    })?;
    let count = text.matches(input.old_string.as_str()).count();
    if count == 0 {
        return Err(ToolError::new(format!("edit: old_string not found in {p}")));
    }
    let replace_all = input.replace_all.unwrap_or(false);
    if !replace_all && count > 1 {
        return Err(ToolError::new(format!(
            "edit: old_string appears {count} times in {p} (must be unique)"
        )));
    }
    // Literal replacement: no `$&`-style expansion of `new_string`.
    let updated = if replace_all {
        text.replace(input.old_string.as_str(), &input.new_string)
    } else {
        text.replacen(input.old_string.as_str(), &input.new_string, 1)
    };
    write_atomic(&target, updated.as_bytes()).map_err(|e| fs_error("edit", p, &e))?;
    let replaced = if replace_all { count } else { 1 };
    Ok(ToolOutput::Text(format!(
        "edited {p} ({replaced} replacement(s))"
    )))
}
