//! `read`, `write` and `edit`.
//!
//! The path is first resolved as the reference resolves it, its symlinks
//! followed (see [`super::paths`]); the canonical file is then reached from
//! its root's directory fd: `read` opens it with `openat2`/the no-follow
//! walk, `write` and `edit` walk to its directory fd (creating missing
//! directories with `mkdirat`) and work by name in that fd only. Nothing is
//! followed by name after the resolution: a link the agent's shell swaps in
//! meanwhile makes the call resolve again, never leads it outside.
//! A FIFO or a device is refused after `fstat` without ever blocking on it
//! (`O_NONBLOCK`), and reads are bounded: at most the cap + 1 bytes are read
//! whatever size the file has or grows to. Writes go to an `O_EXCL`
//! temporary file in the same directory fd, are flushed to disk and renamed
//! over the target (`renameat`), so a reader (or the memory sync) never sees
//! half a file.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rand::RngExt;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};

use super::paths::{PathPolicy, Target, fs_reason};
use super::{ToolError, ToolOutput};

/// Cap of a whole-file `read` and of `edit` (both load the whole file).
pub(crate) const DEFAULT_MAX_FILE_BYTES: u64 = 256 * 1024;
/// Cap on the base64 form of an image `read` returns as a content block.
pub(crate) const MAX_IMAGE_BASE64_BYTES: u64 = 5 * 1024 * 1024;
/// Cap on the raw size of a PDF `read` returns as a document block.
pub(crate) const MAX_PDF_BYTES: u64 = 20 * 1024 * 1024;

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

/// Whether `read` returns the file at `path` as a base64 block (by its name).
pub(crate) fn is_media_path(path: &str) -> bool {
    media_type(Path::new(path)).is_some()
}

fn fs_error(op: &str, p: &str, e: &io::Error) -> ToolError {
    ToolError::new(format!("{op}: {p}: {}", fs_reason(e)))
}

/// Refuse anything but a regular file; its size and identity.
fn regular(op: &str, p: &str, fd: OwnedFd) -> Result<(File, u64, (u64, u64)), ToolError> {
    let st = rustix::fs::fstat(&fd).map_err(|e| super::paths::path_error(op, p, e))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(ToolError::new(format!("{op}: {p}: not a regular file")));
    }
    Ok((File::from(fd), st.st_size as u64, (st.st_dev, st.st_ino)))
}

/// Resolve `p` and open it for reading from its root (no blocking open),
/// refusing anything but a regular file: its canonical path, the file and
/// its size. `check` runs once the path resolved, before anything is opened
/// (the reference validates its other inputs there).
fn open_regular(
    op: &str,
    policy: &PathPolicy,
    p: &str,
    check: impl Fn() -> Result<(), ToolError>,
) -> Result<(PathBuf, File, u64), ToolError> {
    policy.with_target(op, Some(p), |target| {
        check()?;
        let fd = target.open(op, OFlags::RDONLY | OFlags::NONBLOCK)?;
        let (file, size, _) = regular(op, p, fd)?;
        Ok((target.shown().to_path_buf(), file, size))
    })
}

/// Read at most `limit` bytes; `Err(read)` when the file held more (it may
/// have grown since `fstat`), having read only `limit + 1`.
fn read_capped(file: &mut File, size_hint: u64, limit: u64) -> io::Result<Result<Vec<u8>, u64>> {
    let mut bytes = Vec::with_capacity(size_hint.min(limit) as usize + 1);
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    let got = bytes.len() as u64;
    Ok(if got > limit {
        Err(got.max(size_hint))
    } else {
        Ok(bytes)
    })
}

#[derive(Deserialize)]
struct ReadInput {
    file_path: String,
    #[serde(default)]
    view_range: Option<Vec<i64>>,
}

pub(crate) fn read(
    policy: &PathPolicy,
    max_bytes: Option<u64>,
    input: Value,
    deadline: Instant,
) -> Result<ToolOutput, ToolError> {
    let input: ReadInput = super::parse_input("read", input)?;
    let p = input.file_path.as_str();
    let view_range = input.view_range.filter(|r| !r.is_empty());
    let range = match view_range.as_deref() {
        None | Some([_, _]) => Ok(view_range.as_deref().map(|r| (r[0], r[1]))),
        Some(_) => Err(ToolError::new(
            "read: view_range must be [start_line, end_line]",
        )),
    };
    let (shown, mut file, size) = open_regular("read", policy, p, || range.clone().map(|_| ()))?;
    let range = range?;
    if let Some(media) = media_type(&shown) {
        if range.is_some() {
            return Err(ToolError::new(
                "read: view_range is not supported for image/PDF files",
            ));
        }
        // Up to the media caps (megabytes), base64-encoded: not inline.
        return super::lane::long(|| read_media(file, p, size, media));
    }
    let too_large = |size: u64, limit: u64| {
        ToolError::new(format!(
            "read: {p} is {size} bytes, exceeds {limit}-byte limit. Use the view_range parameter to read specific line ranges, e.g. view_range: [1, 500]."
        ))
    };
    if let Some(limit) = max_bytes
        && size > limit
    {
        let Some((start, end)) = range else {
            return Err(too_large(size, limit));
        };
        return read_line_range(file, p, start, end, limit, deadline);
    }
    let bytes = match max_bytes {
        // Bounded even if the file grew since `fstat`.
        Some(limit) => {
            match read_capped(&mut file, size, limit).map_err(|e| fs_error("read", p, &e))? {
                Ok(bytes) => bytes,
                Err(grown) => {
                    let Some((start, end)) = range else {
                        return Err(too_large(grown, limit));
                    };
                    let (_, file, _) = open_regular("read", policy, p, || Ok(()))?;
                    return read_line_range(file, p, start, end, limit, deadline);
                }
            }
        }
        None => {
            let mut bytes = Vec::with_capacity(size as usize);
            file.read_to_end(&mut bytes)
                .map_err(|e| fs_error("read", p, &e))?;
            bytes
        }
    };
    let text = String::from_utf8(bytes).map_err(|_| {
        ToolError::new(format!(
            "read: {p}: not valid UTF-8 text (binary files are only supported for image/PDF extensions)"
        ))
    })?;
    Ok(ToolOutput::Text(match range {
        None => text,
        Some((start, end)) => line_range(&text, start, end),
    }))
}

/// An image or a PDF, whole, as one base64 block. The text cap does not
/// apply: the media caps (the API's own limits) do.
fn read_media(
    mut file: File,
    p: &str,
    size: u64,
    media: &'static str,
) -> Result<ToolOutput, ToolError> {
    let limit = if media == "application/pdf" {
        MAX_PDF_BYTES
    } else {
        MAX_IMAGE_BASE64_BYTES / 4 * 3
    };
    let too_large = |size: u64| {
        ToolError::new(format!(
            "read: {p} is {size} bytes, exceeds {limit}-byte limit for image/PDF files."
        ))
    };
    if size > limit {
        return Err(too_large(size));
    }
    let bytes = read_capped(&mut file, size, limit)
        .map_err(|e| fs_error("read", p, &e))?
        .map_err(too_large)?;
    let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
    let kind = if media == "application/pdf" {
        "document"
    } else {
        "image"
    };
    Ok(ToolOutput::Blocks(vec![json!({
        "type": kind,
        "source": {"type": "base64", "media_type": media, "data": data}
    })]))
}

/// Lines `start..=end` of `text` (1-based; `end` 0 or less: to the end).
fn line_range(text: &str, start: i64, end: i64) -> String {
    let lines: Vec<&str> = text.split('\n').collect();
    let from = (start.max(1) - 1) as usize;
    let to = if end > 0 {
        (end as usize).min(lines.len())
    } else {
        lines.len()
    };
    if from >= to {
        String::new()
    } else {
        lines[from..to].join("\n")
    }
}

/// Lines `[start, end]` of a file too large to load whole, streamed in
/// bounded memory (see [`super::lines`]): a skipped line is never held, a
/// selected one at most up to `limit`, and the deadline is checked at every
/// buffer-full, so a one-line sparse file of gigabytes costs neither memory
/// nor more than the call's time.
fn read_line_range(
    file: File,
    p: &str,
    start: i64,
    end: i64,
    limit: u64,
    deadline: Instant,
) -> Result<ToolOutput, ToolError> {
    let from = (start.max(1) - 1) as u64;
    let to = if end > 0 { end as u64 } else { u64::MAX };
    if to <= from {
        return Ok(ToolOutput::Text(String::new()));
    }
    let mut reader = io::BufReader::with_capacity(64 * 1024, file);
    let mut out: Vec<u8> = Vec::new();
    let mut index = 0u64;
    let mut too_large = false;
    // A skipped line needs none of its bytes; a selected one at most what
    // is left of the limit (one more marks it over-long).
    let keep = usize::try_from(limit).unwrap_or(usize::MAX);
    let stop = super::lines::each_line(&mut reader, keep, u64::MAX, deadline, |line| {
        if index >= from {
            if line.overlong || (out.len() + line.bytes.len()) as u64 > limit {
                too_large = true;
                return false;
            }
            out.extend_from_slice(line.bytes);
            if line.terminated && index + 1 < to {
                out.push(b'\n');
            }
            if out.len() as u64 > limit {
                too_large = true;
                return false;
            }
        }
        index += 1;
        index < to
    })
    .map_err(|e| fs_error("read", p, &e))?;
    if too_large {
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
    if stop == super::lines::Stop::Deadline {
        return Err(ToolError::new(format!("read: {p}: timed out")));
    }
    String::from_utf8(out).map(ToolOutput::Text).map_err(|_| {
        ToolError::new(format!(
            "read: {p}: not valid UTF-8 text (binary files are only supported for image/PDF extensions)"
        ))
    })
}

/// The name of [`write_atomic`]'s temporary file starts with this, then 16
/// hex digits. A worker killed between creating it and the rename leaves it
/// behind; it is debris, never the agent's edit (see [`is_write_tmp`]).
const WRITE_TMP_PREFIX: &str = ".envworker-write-";

/// Is `name` (a leaf) the temporary file of an atomic write that never
/// reached its rename? Memory store recovery removes such debris instead of
/// pushing it as a memory.
pub(crate) fn is_write_tmp(name: &str) -> bool {
    name.strip_prefix(WRITE_TMP_PREFIX)
        .is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Replace `leaf` in `dir` atomically with `content`: an `O_EXCL`
/// temporary file in the same directory fd, fsync, `renameat`. A new file
/// gets 0644; an existing one keeps its mode. A symlink or a directory at
/// `leaf` is refused, never followed or replaced.
fn write_atomic(dir: &OwnedFd, leaf: &str, content: &[u8]) -> Result<(), Errno> {
    let mode = match rustix::fs::statat(dir, leaf, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => return Err(Errno::ISDIR),
            FileType::Symlink => return Err(Errno::LOOP),
            FileType::RegularFile => st.st_mode & 0o7777,
            _ => 0o644,
        },
        Err(Errno::NOENT) => 0o644,
        Err(e) => return Err(e),
    };
    let (tmp, fd) = loop {
        let tmp = format!("{WRITE_TMP_PREFIX}{:016x}", rand::rng().random::<u64>());
        match rustix::fs::openat(
            dir,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        ) {
            Ok(fd) => break (tmp, fd),
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(e),
        }
    };
    let written = (|| {
        let mut file = File::from(fd);
        file.write_all(content)
            .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
        rustix::fs::fchmod(&file, Mode::from_raw_mode(mode))?;
        // The one step that may wait on the disk (see `lane`).
        super::lane::long_on_disk(&file, || rustix::fs::fsync(&file))?;
        rustix::fs::renameat(dir, tmp.as_str(), dir, leaf)
    })();
    if written.is_err() {
        let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
    }
    written
}

/// Refuse a regular file at `leaf` that is a read-only root itself.
fn check_leaf_writable(
    op: &str,
    target: &Target<'_>,
    dir: &OwnedFd,
    leaf: &str,
) -> Result<(), ToolError> {
    match rustix::fs::statat(dir, leaf, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => target.check_writable_file(op, (st.st_dev, st.st_ino)),
        Err(_) => Ok(()),
    }
}

#[derive(Deserialize)]
struct WriteInput {
    file_path: String,
    content: String,
}

pub(crate) fn write(policy: &PathPolicy, input: Value) -> Result<ToolOutput, ToolError> {
    let input: WriteInput = super::parse_input("write", input)?;
    let p = input.file_path.as_str();
    policy.with_target("write", Some(p), |target| {
        target.refuse_read_only("write")?;
        let (dir, leaf) = target.parent_for_write("write", true)?;
        check_leaf_writable("write", target, &dir, &leaf)?;
        write_atomic(&dir, &leaf, input.content.as_bytes()).map_err(|e| target.fail("write", e))
    })?;
    Ok(ToolOutput::Text(format!(
        "wrote {} bytes to {p}",
        input.content.len()
    )))
}

/// The whole of a file `edit` is about to change, as text, within the cap.
fn read_for_edit(
    file: &mut File,
    p: &str,
    size: u64,
    max_bytes: Option<u64>,
) -> Result<String, ToolError> {
    let too_large = |size: u64, limit: u64| {
        ToolError::new(format!(
            "edit: {p} is {size} bytes, exceeds {limit}-byte limit. The edit tool loads the whole file and cannot modify a file this large."
        ))
    };
    let bytes = match max_bytes {
        Some(limit) if size > limit => return Err(too_large(size, limit)),
        Some(limit) => read_capped(file, size, limit)
            .map_err(|e| fs_error("edit", p, &e))?
            .map_err(|grown| too_large(grown, limit))?,
        None => {
            let mut bytes = Vec::with_capacity(size as usize);
            file.read_to_end(&mut bytes)
                .map_err(|e| fs_error("edit", p, &e))?;
            bytes
        }
    };
    String::from_utf8(bytes).map_err(|_| {
        ToolError::new(format!(
            "edit: {p}: not valid UTF-8 text (cannot edit binary files)"
        ))
    })
}

#[derive(Deserialize)]
struct EditInput {
    file_path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: Option<bool>,
}

pub(crate) fn edit(
    policy: &PathPolicy,
    max_bytes: Option<u64>,
    input: Value,
) -> Result<ToolOutput, ToolError> {
    let input: EditInput = super::parse_input("edit", input)?;
    let p = input.file_path.as_str();
    if input.old_string.is_empty() {
        return Err(ToolError::new("edit: old_string must not be empty"));
    }
    let replace_all = input.replace_all.unwrap_or(false);
    let count = policy.with_target("edit", Some(p), |target| {
        target.refuse_read_only("edit")?;
        let (dir, leaf) = target.parent_for_write("edit", false)?;
        let fd = rustix::fs::openat(
            &dir,
            leaf.as_str(),
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| target.fail("edit", e))?;
        let (mut file, size, id) = regular("edit", p, fd)?;
        target.check_writable_file("edit", id)?;
        let text = read_for_edit(&mut file, p, size, max_bytes)?;
        drop(file);
        let count = text.matches(input.old_string.as_str()).count();
        if count == 0 {
            return Err(ToolError::new(format!("edit: old_string not found in {p}")).into());
        }
        if !replace_all && count > 1 {
            return Err(ToolError::new(format!(
                "edit: old_string appears {count} times in {p} (must be unique)"
            ))
            .into());
        }
        // Literal replacement: no `$&`-style expansion of `new_string`.
        let updated = if replace_all {
            text.replace(input.old_string.as_str(), &input.new_string)
        } else {
            text.replacen(input.old_string.as_str(), &input.new_string, 1)
        };
        write_atomic(&dir, &leaf, updated.as_bytes()).map_err(|e| target.fail("edit", e))?;
        Ok(count)
    })?;
    let replaced = if replace_all { count } else { 1 };
    Ok(ToolOutput::Text(format!(
        "edited {p} ({replaced} replacement(s))"
    )))
}
