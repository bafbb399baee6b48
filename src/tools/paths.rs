//! Where the file tools may go: every path is made canonical (each symlink
//! followed, the leaf included, even a dangling one) and must then lie inside
//! the workdir or one of the allowed roots; write and edit also refuse
//! anything under a read-only root.
//!
//! Containment compares path components, so `/mnt/memory/notes-old` is not
//! inside `/mnt/memory/notes`. Roots are made canonical at check time, so a
//! symlinked root protects (or grants) the same files under either name.
//! Error texts name the path as the agent spelled it, never the absolute
//! workdir.

use std::io;
use std::path::{Component, Path, PathBuf};

use super::ToolError;

/// Symlinks followed by hand (dangling ones) before a path counts as a loop.
const MAX_SYMLINK_HOPS: usize = 40;

/// The workdir and the extra directories the file tools may reach.
#[derive(Debug, Clone)]
pub struct PathPolicy {
    workdir: PathBuf,
    allowed_roots: Vec<PathBuf>,
    read_only_roots: Vec<PathBuf>,
}

impl PathPolicy {
    /// `allowed_roots` and `read_only_roots` may name files or directories; an
    /// empty entry grants (or protects) nothing.
    pub fn new(workdir: &Path, allowed_roots: Vec<PathBuf>, read_only_roots: Vec<PathBuf>) -> Self {
        let keep = |roots: Vec<PathBuf>| -> Vec<PathBuf> {
            roots
                .into_iter()
                .filter(|r| !r.as_os_str().is_empty())
                .collect()
        };
        PathPolicy {
            workdir: workdir.to_path_buf(),
            allowed_roots: keep(allowed_roots),
            read_only_roots: keep(read_only_roots),
        }
    }

    /// The workdir, canonical when it exists.
    pub fn workdir(&self) -> PathBuf {
        canonical_root(&self.workdir)
    }

    /// Resolve `p` (relative to the workdir) to the canonical path the tool
    /// must then use, or refuse it.
    pub fn resolve(&self, op: &str, p: &str) -> Result<PathBuf, ToolError> {
        let root = self.workdir();
        let candidate = Path::new(p);
        let joined = if candidate.is_absolute() {
            candidate.to_path_buf()
        } else {
            root.join(candidate)
        };
        let full = canonicalize(&joined)
            .map_err(|e| ToolError::new(format!("{op}: path {p:?}: {}", fs_reason(&e))))?;
        if full.starts_with(&root)
            || self
                .allowed_roots
                .iter()
                .any(|r| full.starts_with(canonical_root(r)))
        {
            return Ok(full);
        }
        let others = if self.allowed_roots.is_empty() {
            ""
        } else {
            " and its other permitted directories"
        };
        Err(ToolError::new(format!(
            "{op}: path {p:?} is outside the session's working directory{others}"
        )))
    }

    /// Refuse a canonical `target` under a read-only root.
    pub fn check_writable(&self, op: &str, target: &Path, p: &str) -> Result<(), ToolError> {
        for root in &self.read_only_roots {
            if target.starts_with(canonical_root(root)) {
                return Err(ToolError::new(format!(
                    "{op}: {p} is inside read-only directory {}",
                    root.display()
                )));
            }
        }
        Ok(())
    }
}

/// A root made canonical, or as spelled (lexically normalised) when it cannot be.
fn canonical_root(root: &Path) -> PathBuf {
    canonicalize(root).unwrap_or_else(|_| normalize(root))
}

/// Collapse `.` and `..` without touching the filesystem (`..` at `/` stays `/`).
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for comp in path.components() {
        match comp {
            Component::Prefix(_) | Component::RootDir => out.push(comp.as_os_str()),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() && !path.is_absolute() {
                    out.push("..");
                }
                if out.as_os_str().is_empty() && path.is_absolute() {
                    out.push("/");
                }
            }
            Component::Normal(name) => out.push(name),
        }
    }
    out
}

fn is_missing(e: &io::Error) -> bool {
    use rustix::io::Errno;
    matches!(
        e.raw_os_error().map(Errno::from_raw_os_error),
        Some(Errno::NOENT | Errno::NOTDIR)
    )
}

fn loop_error() -> io::Error {
    io::Error::from_raw_os_error(rustix::io::Errno::LOOP.raw_os_error())
}

/// `path` (absolute) with `.`/`..` collapsed and every symlink followed.
/// Trailing components that do not exist yet are kept as spelled, so a new
/// file under new directories still resolves; a dangling symlink on the way
/// is read and followed by hand, and more than 40 such hops is a loop.
pub fn canonicalize(path: &Path) -> io::Result<PathBuf> {
    let mut prefix = normalize(path);
    let mut missing: Vec<std::ffi::OsString> = Vec::new();
    let mut hops = 0;
    loop {
        let unresolved = match std::fs::canonicalize(&prefix) {
            Ok(real) => {
                let mut out = real;
                out.extend(missing.iter().rev());
                return Ok(out);
            }
            Err(e) if is_missing(&e) => e,
            Err(e) => return Err(e),
        };
        let meta = match std::fs::symlink_metadata(&prefix) {
            Ok(m) => m,
            Err(e) if is_missing(&e) => {
                let (Some(parent), Some(name)) = (prefix.parent(), prefix.file_name()) else {
                    return Err(e);
                };
                missing.push(name.to_os_string());
                prefix = parent.to_path_buf();
                continue;
            }
            Err(e) => return Err(e),
        };
        if !meta.file_type().is_symlink() {
            return Err(unresolved);
        }
        hops += 1;
        if hops > MAX_SYMLINK_HOPS {
            return Err(loop_error());
        }
        let parent = match prefix.parent() {
            Some(p) => std::fs::canonicalize(p)?,
            None => PathBuf::from("/"),
        };
        let target = std::fs::read_link(&prefix)?;
        let mut next = parent.join(target);
        next.extend(missing.drain(..).rev());
        prefix = normalize(&next);
    }
}

/// A filesystem error as the same words everywhere, without host paths.
pub fn fs_reason(e: &io::Error) -> String {
    use rustix::io::Errno;
    let Some(code) = e.raw_os_error() else {
        return match e.kind() {
            io::ErrorKind::NotFound => "no such file or directory".into(),
            io::ErrorKind::PermissionDenied => "permission denied".into(),
            io::ErrorKind::InvalidData => "not valid UTF-8 text".into(),
            _ => "i/o error".into(),
        };
    };
    let errno = Errno::from_raw_os_error(code);
    match errno {
        Errno::NOENT => "no such file or directory".into(),
        Errno::NOTDIR => "not a directory".into(),
        Errno::ISDIR => "is a directory".into(),
        Errno::ACCESS | Errno::PERM => "permission denied".into(),
        Errno::EXIST => "file already exists".into(),
        Errno::LOOP => "too many levels of symbolic links".into(),
        Errno::NOSPC => "no space left on device".into(),
        Errno::ROFS => "read-only file system".into(),
        Errno::NAMETOOLONG => "file name too long".into(),
        _ => format!("i/o error ({code})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_collapses_dots_lexically() {
        for (input, want) in [
            ("/a/./b/../c", "/a/c"),
            ("/../..", "/"),
            ("/a/b/../../..", "/"),
            ("/a//b/", "/a/b"),
        ] {
            assert_eq!(normalize(Path::new(input)), PathBuf::from(want), "{input}");
        }
    }
}
