//! The session agent's skills, downloaded into `<workdir>/skills/<name>/`.
//!
//! For each `session.agent.skills[]` entry the version is resolved with
//! `GET /v1/skills/{id}/versions/{version}` (which also turns an alias such
//! as `latest` into a concrete id), the archive of that concrete version is
//! streamed to disk, unpacked beside its destination and renamed into place.
//! A skill that fails is logged and skipped: skills help the agent, they are
//! not a precondition of the session, and one broken bundle must not cost
//! the agent the others.
//!
//! Skills can be third-party, so an archive is treated as hostile (the rules
//! of the official Python SDK's `lib/tools/_skills.py`, plus size bounds):
//!
//! - every member name is screened before anything is written — one absolute
//!   name or `..` component refuses the whole archive (zip-slip / tar-slip);
//! - only regular files and directories are extracted; symlinks, hardlinks,
//!   devices, FIFOs and sockets are skipped, so nothing written can point
//!   outside the destination;
//! - a file's mode is collapsed to `0755` (any exec bit in the archive) or
//!   `0644`: scripts stay runnable, but setuid/setgid/sticky and group or
//!   world write never carry over;
//! - more than `MAX_ARCHIVE_ENTRIES` members, or more than
//!   `MAX_UNPACKED_BYTES` of content, refuses the archive (zip bombs);
//! - the skill's name becomes one path component, and a destination that
//!   would resolve outside `<workdir>/skills` is skipped.
//!
//! Bundles come wrapped in one directory named after the skill; that wrapper
//! is stripped so the files land directly in `<workdir>/skills/<name>/`.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use tracing::{info, warn};

use crate::api::types::Session;
use crate::api::{Client, DownloadError};

/// The directory under the workdir that holds the skills.
pub(crate) const SKILLS_DIR: &str = "skills";
/// Most members an archive may have (files, directories and skipped entries alike).
pub(crate) const MAX_ARCHIVE_ENTRIES: usize = 10_000;
/// Most bytes an archive may unpack to, summed over its members.
pub(crate) const MAX_UNPACKED_BYTES: u64 = 256 * 1024 * 1024;
/// Most bytes a download may have: the unpacked bound plus generous room for
/// per-member headers (a tar member takes up to 1 KiB of header and padding,
/// more with long-name or PAX records).
pub const MAX_DOWNLOAD_BYTES: u64 = Limits::DEFAULT.stream_bytes();

/// The version asked for when a skill reference names none.
const DEFAULT_VERSION: &str = "latest";
/// Skill directories hold downloaded, possibly third-party content: the skills
/// root and the staging directories are owner-only rather than whatever the
/// umask allows.
const PRIVATE_DIR_MODE: u32 = 0o700;
/// Header room allowed per member on top of the content, for the stream bound.
const MEMBER_OVERHEAD_BYTES: u64 = 4096;
/// Zip creator hosts whose `external_attr` high 16 bits are a Unix `st_mode`
/// (Unix, OS X).
const ZIP_UNIX_HOSTS: [u8; 2] = [3, 19];
const S_IFMT: u32 = 0o170_000;
const S_IFDIR: u32 = 0o040_000;
/// Symlink, character device, block device, FIFO, socket.
const SPECIAL_FILE_TYPES: [u32; 5] = [0o120_000, 0o020_000, 0o060_000, 0o010_000, 0o140_000];

/// Why one skill could not be installed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SkillError {
    #[error(transparent)]
    Api(#[from] crate::api::Error),
    #[error("cannot download the skill's files: {0}")]
    Download(#[from] DownloadError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("refusing archive member with absolute path {0:?}")]
    AbsoluteMember(String),
    #[error("refusing archive member with '..' component: {0:?}")]
    ParentMember(String),
    #[error("refusing to extract unsafe {format} member {name:?}")]
    UnsafeTarget { format: &'static str, name: String },
    #[error("refusing an archive of more than {limit} entries")]
    TooManyEntries { limit: usize },
    #[error("refusing an archive that unpacks to more than {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("not a readable skill archive: {0}")]
    Archive(String),
    #[error("the extraction task failed: {0}")]
    Task(String),
}

impl SkillError {
    fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> SkillError {
        let context = context.into();
        move |source| SkillError::Io { context, source }
    }
}

/// Bounds of one archive.
#[derive(Debug, Clone, Copy)]
struct Limits {
    entries: usize,
    bytes: u64,
}

impl Limits {
    const DEFAULT: Limits = Limits {
        entries: MAX_ARCHIVE_ENTRIES,
        bytes: MAX_UNPACKED_BYTES,
    };

    /// Most bytes of archive stream (a download, a decompressed tar) that
    /// members within both bounds can take.
    const fn stream_bytes(self) -> u64 {
        self.bytes + self.entries as u64 * MEMBER_OVERHEAD_BYTES + 64 * 1024
    }
}

/// Download the session agent's skills into `<workdir>/skills/<name>/`;
/// returns the directories it installed, for [`remove_skills`].
///
/// Each skill is fetched by the concrete version its reference resolves to,
/// and replaces whatever was at its destination only once it is unpacked
/// whole. A failing skill is logged (`failed to download skill`) and leaves
/// its destination as it was; the others still install. `<workdir>/skills`
/// is created (owner-only) only when the agent has skills.
pub async fn download_session_skills(
    client: &Client,
    session: &Session,
    workdir: &Path,
) -> Vec<PathBuf> {
    let skills = &session.agent.skills;
    if skills.is_empty() {
        return Vec::new();
    }
    let requested_root = workdir.join(SKILLS_DIR);
    // A `skills` symlink (left by an earlier session's agent) would send the
    // downloads, and their removal, wherever it points.
    if fs::symlink_metadata(&requested_root).is_ok_and(|m| m.file_type().is_symlink()) {
        warn!(
            workdir = %workdir.display(),
            "the skills directory is a symbolic link; no skills downloaded"
        );
        return Vec::new();
    }
    let root = match blocking(move || resolve(&requested_root)).await {
        Ok(root) => root,
        Err(e) => {
            warn!(
                workdir = %workdir.display(),
                error = %e,
                "cannot resolve the skills directory; no skills downloaded"
            );
            return Vec::new();
        }
    };
    let mut installed = Vec::new();
    for skill in skills {
        let requested = skill.version.as_deref().unwrap_or(DEFAULT_VERSION);
        match install(client, &skill.skill_id, requested, &root, Limits::DEFAULT).await {
            Ok(Some(dest)) => installed.push(dest),
            Ok(None) => {}
            Err(e) => warn!(
                skill_id = %skill.skill_id,
                skill.version = %requested,
                error = %e,
                "failed to download skill"
            ),
        }
    }
    installed
}

/// Remove the skill directories [`download_session_skills`] installed, and
/// nothing else: other content under `<workdir>/skills` is not ours. A
/// directory already gone is fine; any other failure is logged.
///
/// The agent had a shell in the workdir until now, so the removal goes by
/// fd: the workdir is opened by path, `skills` below it without following a
/// symlink, and the skill's tree removed from that fd
/// (`crate::fsx::remove_tree_at`). A `skills` directory the agent replaced
/// with a symlink (to a directory outside holding the same name) is left
/// alone rather than followed.
pub async fn remove_skills(dirs: &[PathBuf]) {
    for dir in dirs {
        let target = dir.clone();
        match blocking(move || remove_skill_dir(&target)).await {
            Ok(()) => {}
            Err(e) => warn!(dir = %dir.display(), error = %e, "skill cleanup failed"),
        }
    }
}

/// Remove `<workdir>/skills/<name>` by fd, never through a symlink.
fn remove_skill_dir(dir: &Path) -> Result<(), SkillError> {
    let fail = |e: rustix::io::Errno| {
        SkillError::io("cannot remove")(io::Error::from_raw_os_error(e.raw_os_error()))
    };
    let (Some(skills), Some(name)) = (dir.parent(), dir.file_name().and_then(|n| n.to_str()))
    else {
        return Ok(());
    };
    let (Some(workdir), Some(skills_name)) =
        (skills.parent(), skills.file_name().and_then(|n| n.to_str()))
    else {
        return Ok(());
    };
    let workdir = match rustix::fs::open(workdir, crate::fsx::DIR_FLAGS, rustix::fs::Mode::empty())
    {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(fail(e)),
    };
    let skills = match crate::fsx::open_dir_at(&workdir, skills_name) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(fail(e)),
    };
    crate::fsx::remove_tree_at(&skills, name).map_err(fail)
}

/// Install one skill; `Ok(None)` when it was skipped (already logged).
async fn install(
    client: &Client,
    skill_id: &str,
    requested: &str,
    root: &Path,
    limits: Limits,
) -> Result<Option<PathBuf>, SkillError> {
    let version = client
        .skills()
        .retrieve_version(skill_id, requested)
        .await?;
    let requested_dest = root.join(skill_dir_name(&version.name, skill_id));
    let dest = blocking(move || resolve(&requested_dest)).await?;
    if !dest.starts_with(root) || dest == root {
        warn!(
            skill_id,
            skill.version = %version.id,
            name = ?version.name,
            "skill name escapes the skills dir; skipping"
        );
        return Ok(None);
    }
    // The reference may be an alias (`latest`) that only the retrieve
    // endpoint resolves: download by the concrete id it answered.
    download_and_extract(client, skill_id, &version.id, &dest, limits).await?;
    info!(
        skill_id,
        skill.version = %version.id,
        dir = %dest.display(),
        "downloaded skill"
    );
    Ok(Some(dest))
}

/// The directory name of a skill: the last component of its trimmed name;
/// the skill id when that is empty, `.` or `..`.
fn skill_dir_name(name: &str, skill_id: &str) -> String {
    match name.trim().rsplit('/').next().unwrap_or_default() {
        "" | "." | ".." => skill_id.to_string(),
        base => base.to_string(),
    }
}

/// Download into an owner-only `.skill-*` directory beside `dest`, unpack
/// there, then swap the result into place. The staging directory goes in
/// every case (dropping the [`tempfile::TempDir`] removes it, even when this
/// future is cancelled).
async fn download_and_extract(
    client: &Client,
    skill_id: &str,
    version_id: &str,
    dest: &Path,
    limits: Limits,
) -> Result<(), SkillError> {
    let parent = dest
        .parent()
        .ok_or_else(|| SkillError::Archive("the destination has no parent".into()))?
        .to_path_buf();
    let work = blocking(move || {
        create_private_dir(&parent).map_err(SkillError::io(format!(
            "cannot create {}",
            parent.display()
        )))?;
        tempfile::Builder::new()
            .prefix(".skill-")
            .tempdir_in(&parent)
            .map_err(SkillError::io(format!(
                "cannot create a staging directory in {}",
                parent.display()
            )))
    })
    .await?;
    let archive = work.path().join("archive");
    let downloaded = client
        .skills()
        .download_version(skill_id, version_id, &archive, limits.stream_bytes())
        .await;
    let dest = dest.to_path_buf();
    blocking(move || {
        // Unpacking and the rename are blocking work: off the async threads.
        let result = downloaded.map_err(SkillError::from).and_then(|_| {
            let stage = work.path().join("stage");
            extract_archive(&archive, &stage, limits)?;
            swap_into_place(&stage, &dest, &work.path().join("replaced"))
        });
        drop(work);
        result
    })
    .await
}

/// Move `dest` aside (if it exists) and `stage` onto it; on failure put the
/// old `dest` back, so a failed skill leaves its previous copy in place.
fn swap_into_place(stage: &Path, dest: &Path, aside: &Path) -> Result<(), SkillError> {
    let had_previous = match fs::rename(dest, aside) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => {
            return Err(SkillError::io(format!("cannot replace {}", dest.display()))(e));
        }
    };
    fs::rename(stage, dest).map_err(|e| {
        if had_previous {
            let _ = fs::rename(aside, dest);
        }
        SkillError::io(format!("cannot move the skill into {}", dest.display()))(e)
    })
}

/// Run blocking file-system work on the blocking pool.
async fn blocking<T, F>(f: F) -> Result<T, SkillError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, SkillError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SkillError::Task(e.to_string()))?
}

/// `path` made absolute with every symlink of its existing part resolved; the
/// part that does not exist yet is appended as written (as Python's
/// non-strict `Path.resolve`).
fn resolve(path: &Path) -> Result<PathBuf, SkillError> {
    let fail = || SkillError::io(format!("cannot resolve {}", path.display()));
    let absolute = std::path::absolute(path).map_err(fail())?;
    let mut resolved = PathBuf::new();
    for component in absolute.components() {
        match component {
            Component::Prefix(_) | Component::RootDir => resolved.push(component),
            Component::CurDir => {}
            // `resolved` holds no symlink, so its parent is the lexical one.
            Component::ParentDir => {
                resolved.pop();
            }
            Component::Normal(name) => {
                let next = resolved.join(name);
                resolved = match fs::canonicalize(&next) {
                    Ok(real) => real,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => next,
                    Err(e) => return Err(fail()(e)),
                };
            }
        }
    }
    Ok(resolved)
}

/// Create `path` owner-only (its parents as the umask says), or accept it as
/// it is when it already exists.
fn create_private_dir(path: &Path) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    match fs::DirBuilder::new().mode(PRIVATE_DIR_MODE).create(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        other => other,
    }
}

// ---------------------------------------------------------------------------
// Archive screening and extraction (blocking).

/// What an archive member is, as far as extraction cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    /// A symlink, hardlink, device, FIFO, socket or metadata record: skipped.
    Other,
}

/// One member as listed before anything is extracted.
#[derive(Debug, Clone)]
struct Member {
    name: String,
    kind: Kind,
    /// The Unix mode recorded in the archive (0 when none).
    mode: u32,
}

/// `name` as a confined relative path (`/`-separated, `.` components
/// dropped), or an error for an absolute name or any `..` component — those
/// only appear in malicious archives. `""` for a member that names nothing
/// (`./`), which the caller skips.
fn safe_member_name(name: &str) -> Result<String, SkillError> {
    let normalized = name.replace('\\', "/");
    if normalized.starts_with('/') {
        return Err(SkillError::AbsoluteMember(name.to_string()));
    }
    let parts: Vec<&str> = normalized
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(SkillError::ParentMember(name.to_string()));
    }
    Ok(parts.join("/"))
}

/// The one top-level directory every extracted member lives under, or `""`
/// when they do not share one (or nothing is nested, e.g. a lone `SKILL.md`).
fn archive_top_dir<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let mut top: Option<&str> = None;
    let mut nested = false;
    for name in names.filter(|n| !n.is_empty()) {
        let (first, rest) = name.split_once('/').unwrap_or((name, ""));
        nested |= !rest.is_empty();
        match top {
            None => top = Some(first),
            Some(t) if t == first => {}
            Some(_) => return String::new(),
        }
    }
    match top {
        Some(t) if nested => t.to_string(),
        _ => String::new(),
    }
}

/// `safe` without its leading `top` component; `""` for the wrapper itself.
fn strip_top(safe: &str, top: &str) -> String {
    if top.is_empty() {
        return safe.to_string();
    }
    match safe.split_once('/') {
        Some((first, rest)) if first == top => rest.to_string(),
        None if safe == top => String::new(),
        _ => safe.to_string(),
    }
}

/// Screen every member name (extracted or not), then map each member to the
/// path it is extracted to under the destination, `None` for the skipped.
fn plan(members: &[Member]) -> Result<Vec<Option<String>>, SkillError> {
    let safe = members
        .iter()
        .map(|m| safe_member_name(&m.name))
        .collect::<Result<Vec<_>, _>>()?;
    let top = archive_top_dir(
        safe.iter()
            .zip(members)
            .filter(|(_, m)| m.kind != Kind::Other)
            .map(|(s, _)| s.as_str()),
    );
    Ok(safe
        .iter()
        .zip(members)
        .map(|(s, m)| match m.kind {
            Kind::Other => None,
            _ => Some(strip_top(s, &top)).filter(|t| !t.is_empty()),
        })
        .collect())
}

/// `0755` when the archive mode has any exec bit, else `0644`.
fn file_mode(archive_mode: u32) -> u32 {
    if archive_mode & 0o111 != 0 {
        0o755
    } else {
        0o644
    }
}

/// Unpack `archive` (zip, or tar: plain, gzip or bzip2) into `dest`, created
/// owner-only.
fn extract_archive(archive: &Path, dest: &Path, limits: Limits) -> Result<(), SkillError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR_MODE)
        .create(dest)
        .map_err(SkillError::io("cannot create the staging directory"))?;
    let root =
        fs::canonicalize(dest).map_err(SkillError::io("cannot resolve the staging directory"))?;
    let file = File::open(archive).map_err(SkillError::io("cannot open the download"))?;
    match zip::ZipArchive::new(BufReader::new(file)) {
        Ok(zip) => extract_zip(zip, &root, limits),
        Err(e) => {
            let mut magic = [0u8; 4];
            let n = File::open(archive)
                .and_then(|mut f| f.read(&mut magic))
                .map_err(SkillError::io("cannot read the download"))?;
            if magic[..n].starts_with(b"PK\x03\x04") || magic[..n].starts_with(b"PK\x05\x06") {
                return Err(SkillError::Archive(format!("bad zip archive: {e}")));
            }
            extract_tar(archive, &root, limits)
        }
    }
}

fn extract_zip(
    mut zip: zip::ZipArchive<BufReader<File>>,
    root: &Path,
    limits: Limits,
) -> Result<(), SkillError> {
    if zip.len() > limits.entries {
        return Err(SkillError::TooManyEntries {
            limit: limits.entries,
        });
    }
    let bad = |e: zip::result::ZipError| SkillError::Archive(format!("bad zip archive: {e}"));
    let mut members = Vec::with_capacity(zip.len());
    let mut declared: u64 = 0;
    for index in 0..zip.len() {
        let entry = zip.by_index_data(index).map_err(bad)?;
        declared = declared.saturating_add(entry.size());
        let name = entry.name().map_err(bad)?.into_owned();
        // The high 16 bits of `external_attr` hold the Unix mode; 0 for
        // archives made without Unix attributes, hence not executable.
        let mode = entry.external_attributes() >> 16;
        let unix = ZIP_UNIX_HOSTS.contains(&u8::from(entry.system()));
        let kind = if unix && SPECIAL_FILE_TYPES.contains(&(mode & S_IFMT)) {
            Kind::Other
        } else if name.ends_with('/') || (unix && mode & S_IFMT == S_IFDIR) {
            Kind::Dir
        } else {
            Kind::File
        };
        members.push(Member { name, kind, mode });
    }
    if declared > limits.bytes {
        return Err(SkillError::TooLarge {
            limit: limits.bytes,
        });
    }
    let targets = plan(&members)?;
    let mut budget = Budget::new(limits);
    for (index, (member, target)) in members.iter().zip(&targets).enumerate() {
        let Some(target) = target else { continue };
        match member.kind {
            Kind::Dir => make_dir(root, target, &member.name, "zip")?,
            Kind::File => {
                let mut src = zip.by_index(index).map_err(bad)?;
                write_file(root, target, &mut src, member, &mut budget, "zip")?;
            }
            Kind::Other => {}
        }
    }
    Ok(())
}

fn extract_tar(archive: &Path, root: &Path, limits: Limits) -> Result<(), SkillError> {
    let bad = |e: io::Error| SkillError::Archive(format!("bad tar archive: {e}"));
    // First pass: list and screen every member; nothing is written unless
    // the whole archive passes.
    let mut members = Vec::new();
    let mut declared: u64 = 0;
    let mut tar = open_tar(archive, limits)?;
    for entry in tar.entries().map_err(bad)? {
        let entry = entry.map_err(bad)?;
        if members.len() == limits.entries {
            return Err(SkillError::TooManyEntries {
                limit: limits.entries,
            });
        }
        declared = declared.saturating_add(entry.size());
        if declared > limits.bytes {
            return Err(SkillError::TooLarge {
                limit: limits.bytes,
            });
        }
        let kind = match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                Kind::File
            }
            tar::EntryType::Directory => Kind::Dir,
            _ => Kind::Other,
        };
        members.push(Member {
            name: String::from_utf8_lossy(&entry.path_bytes()).into_owned(),
            kind,
            mode: entry.header().mode().unwrap_or(0),
        });
    }
    let targets = plan(&members)?;
    // Second pass: extract. The stream is read again from the file, so a
    // compressed tar is never held in memory.
    let mut budget = Budget::new(limits);
    let mut tar = open_tar(archive, limits)?;
    for (entry, (member, target)) in tar
        .entries()
        .map_err(bad)?
        .zip(members.iter().zip(&targets))
    {
        let mut entry = entry.map_err(bad)?;
        let Some(target) = target else { continue };
        match member.kind {
            Kind::Dir => make_dir(root, target, &member.name, "tar")?,
            Kind::File => write_file(root, target, &mut entry, member, &mut budget, "tar")?,
            Kind::Other => {}
        }
    }
    Ok(())
}

/// A tar reader over `archive`, decompressing gzip or bzip2 by their magic
/// bytes, and refusing to read more than the limits allow.
fn open_tar(archive: &Path, limits: Limits) -> Result<tar::Archive<Box<dyn Read>>, SkillError> {
    let file = File::open(archive).map_err(SkillError::io("cannot open the download"))?;
    let mut file = BufReader::new(file);
    let head = file
        .fill_buf()
        .map_err(SkillError::io("cannot read the download"))?;
    let reader: Box<dyn Read> = if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::MultiGzDecoder::new(file))
    } else if head.starts_with(b"BZh") {
        Box::new(bzip2::read::MultiBzDecoder::new(file))
    } else if head.starts_with(b"\xfd7zXZ\0") {
        return Err(SkillError::Archive(
            "xz-compressed archives are not supported".into(),
        ));
    } else {
        Box::new(file)
    };
    Ok(tar::Archive::new(Box::new(Capped {
        inner: reader,
        left: limits.stream_bytes(),
    })))
}

/// A reader that fails once more than `left` bytes were asked of it: the
/// bound on a decompressed tar stream, whatever its headers claim.
struct Capped<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            // Probe one byte: the stream may end exactly at the bound.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(io::Error::other(
                    "the archive stream exceeds its size bound",
                )),
            };
        }
        let max = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..max])?;
        self.left -= n as u64;
        Ok(n)
    }
}

/// Fail unless `path` (existing) resolves inside `root`.
fn ensure_within(
    root: &Path,
    path: &Path,
    name: &str,
    format: &'static str,
) -> Result<(), SkillError> {
    let resolved = fs::canonicalize(path).map_err(SkillError::io(format!(
        "cannot resolve the extracted member {name:?}"
    )))?;
    if resolved.starts_with(root) {
        Ok(())
    } else {
        Err(SkillError::UnsafeTarget {
            format,
            name: name.to_string(),
        })
    }
}

fn make_dir(root: &Path, target: &str, name: &str, format: &'static str) -> Result<(), SkillError> {
    let path = root.join(target);
    fs::create_dir_all(&path).map_err(SkillError::io(format!("cannot create {target:?}")))?;
    ensure_within(root, &path, name, format)
}

/// What is left of the unpacked-bytes bound while extracting.
struct Budget {
    left: u64,
    limit: u64,
}

impl Budget {
    fn new(limits: Limits) -> Self {
        Budget {
            left: limits.bytes,
            limit: limits.bytes,
        }
    }
}

/// Write one file member, charging its bytes to `budget` (the members'
/// declared sizes were checked, but a zip entry may hold more than it
/// declares).
fn write_file(
    root: &Path,
    target: &str,
    src: &mut dyn Read,
    member: &Member,
    budget: &mut Budget,
    format: &'static str,
) -> Result<(), SkillError> {
    let path = root.join(target);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(SkillError::io(format!(
            "cannot create the parent of {target:?}"
        )))?;
        ensure_within(root, parent, &member.name, format)?;
    }
    let mut out = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        // Never write through a symlink, should one be there.
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&path)
        .map_err(SkillError::io(format!("cannot create {target:?}")))?;
    let copied = io::copy(&mut src.take(budget.left + 1), &mut out)
        .map_err(SkillError::io(format!("cannot extract {target:?}")))?;
    if copied > budget.left {
        return Err(SkillError::TooLarge {
            limit: budget.limit,
        });
    }
    budget.left -= copied;
    out.set_permissions(Permissions::from_mode(file_mode(member.mode)))
        .map_err(SkillError::io(format!("cannot set the mode of {target:?}")))?;
    ensure_within(root, &path, &member.name, format)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Cursor, Write};

    fn names(list: &[&str]) -> Vec<Member> {
        list.iter()
            .map(|n| Member {
                name: n.to_string(),
                kind: if n.ends_with('/') {
                    Kind::Dir
                } else {
                    Kind::File
                },
                mode: 0,
            })
            .collect()
    }

    #[test]
    fn member_names_are_screened() {
        assert_eq!(safe_member_name("a/./b//c").unwrap(), "a/b/c");
        assert_eq!(safe_member_name("./").unwrap(), "");
        assert_eq!(safe_member_name("a\\b").unwrap(), "a/b");
        assert!(matches!(
            safe_member_name("/etc/passwd"),
            Err(SkillError::AbsoluteMember(_))
        ));
        assert!(matches!(
            safe_member_name("\\x"),
            Err(SkillError::AbsoluteMember(_))
        ));
        assert!(matches!(
            safe_member_name("a/../../b"),
            Err(SkillError::ParentMember(_))
        ));
        assert!(matches!(
            safe_member_name("a\\..\\b"),
            Err(SkillError::ParentMember(_))
        ));
    }

    #[test]
    fn the_wrapper_is_stripped_only_when_shared_and_nested() {
        let plan_of = |list: &[&str]| plan(&names(list)).unwrap();
        assert_eq!(
            plan_of(&["pdf/", "pdf/SKILL.md", "pdf/scripts/run.sh"]),
            vec![None, Some("SKILL.md".into()), Some("scripts/run.sh".into())]
        );
        assert_eq!(
            plan_of(&["SKILL.md"]),
            vec![Some("SKILL.md".into())],
            "a lone file is not a wrapper"
        );
        assert_eq!(
            plan_of(&["a/x", "b/y"]),
            vec![Some("a/x".into()), Some("b/y".into())]
        );
        assert_eq!(plan_of(&["pdf/"]), vec![Some("pdf".into())]);
        // A skipped member does not count toward the wrapper, but is screened.
        let mut members = names(&["w/SKILL.md", "link"]);
        members[1].kind = Kind::Other;
        assert_eq!(plan(&members).unwrap(), vec![Some("SKILL.md".into()), None]);
        members[1].name = "../escape".into();
        assert!(plan(&members).is_err());
    }

    #[test]
    fn skill_names_reduce_to_one_component() {
        assert_eq!(skill_dir_name(" pdf ", "skill_1"), "pdf");
        assert_eq!(skill_dir_name("../../x", "skill_1"), "x");
        assert_eq!(skill_dir_name("a/", "skill_1"), "skill_1");
        assert_eq!(skill_dir_name(".", "skill_1"), "skill_1");
        assert_eq!(skill_dir_name("..", "skill_1"), "skill_1");
        assert_eq!(skill_dir_name("", "skill_1"), "skill_1");
    }

    #[test]
    fn modes_collapse_to_two_values() {
        assert_eq!(file_mode(0o100_755), 0o755);
        assert_eq!(
            file_mode(0o104_710),
            0o755,
            "setuid and group bits never carry"
        );
        assert_eq!(file_mode(0o100_666), 0o644);
        assert_eq!(file_mode(0), 0o644);
    }

    fn zip_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (name, content) in files {
            w.start_file(*name, options).unwrap();
            w.write_all(content).unwrap();
        }
        w.finish().unwrap().into_inner()
    }

    fn extract_bytes(bytes: &[u8], limits: Limits) -> (tempfile::TempDir, Result<(), SkillError>) {
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("archive");
        fs::write(&archive, bytes).unwrap();
        let result = extract_archive(&archive, &dir.path().join("stage"), limits);
        (dir, result)
    }

    #[test]
    fn the_unpacked_size_is_bounded_by_declared_and_actual_bytes() {
        let small = Limits {
            entries: 100,
            bytes: 1000,
        };
        let big = vec![0u8; 1001];
        let (_d, r) = extract_bytes(&zip_of(&[("a", &big)]), small);
        assert!(matches!(r, Err(SkillError::TooLarge { .. })), "{r:?}");
        let (_d, r) = extract_bytes(&zip_of(&[("a", &big[..600]), ("b", &big[..600])]), small);
        assert!(matches!(r, Err(SkillError::TooLarge { .. })), "{r:?}");
        let (d, r) = extract_bytes(&zip_of(&[("a", &big[..500]), ("b", &big[..500])]), small);
        r.unwrap();
        assert_eq!(fs::read(d.path().join("stage/b")).unwrap().len(), 500);

        // A member holding more than its header declares is still cut off.
        let mut budget = Budget::new(Limits {
            entries: 1,
            bytes: 10,
        });
        let dir = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(dir.path()).unwrap();
        let member = Member {
            name: "x".into(),
            kind: Kind::File,
            mode: 0,
        };
        let r = write_file(&root, "x", &mut &[7u8; 11][..], &member, &mut budget, "zip");
        assert!(matches!(r, Err(SkillError::TooLarge { .. })), "{r:?}");
    }

    #[test]
    fn a_tar_stream_is_bounded_whatever_its_headers_say() {
        let limits = Limits {
            entries: 10,
            bytes: 10,
        };
        let mut capped = Capped {
            inner: &[0u8; 100][..],
            left: 50,
        };
        let mut sink = Vec::new();
        assert!(capped.read_to_end(&mut sink).is_err());
        let mut exact = Capped {
            inner: &[0u8; 50][..],
            left: 50,
        };
        assert_eq!(exact.read_to_end(&mut sink).unwrap(), 50);
        // Many tar members over the entry bound.
        let mut b = tar::Builder::new(Vec::new());
        for i in 0..11 {
            let mut h = tar::Header::new_gnu();
            h.set_size(0);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, format!("f{i}"), &[][..]).unwrap();
        }
        let (_d, r) = extract_bytes(&b.into_inner().unwrap(), limits);
        assert!(matches!(r, Err(SkillError::TooManyEntries { .. })), "{r:?}");
    }

    #[test]
    fn garbage_is_not_an_archive() {
        let (_d, r) = extract_bytes(b"PK\x03\x04 not really a zip", Limits::DEFAULT);
        assert!(matches!(r, Err(SkillError::Archive(_))), "{r:?}");
        let (_d, r) = extract_bytes(&[0x55; 2048], Limits::DEFAULT);
        assert!(matches!(r, Err(SkillError::Archive(_))), "{r:?}");
    }

    #[test]
    fn resolve_follows_what_exists_and_appends_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let real = fs::canonicalize(dir.path()).unwrap();
        fs::create_dir(real.join("target")).unwrap();
        std::os::unix::fs::symlink(real.join("target"), real.join("link")).unwrap();
        assert_eq!(
            resolve(&real.join("link/new/deeper")).unwrap(),
            real.join("target/new/deeper")
        );
        assert_eq!(resolve(&real.join("missing/..")).unwrap(), real);
    }
}
