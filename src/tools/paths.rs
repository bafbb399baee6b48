//! Where the file tools may go, and how they get there without leaving.
//!
//! The agent has a shell beside the tools: it can replace any directory with
//! a symlink (to `/proc/self`, to `/`) or exchange the two in a loop while a
//! tool runs. So nothing here trusts a path between a check and a use:
//!
//! - the workdir and every allowed and read-only root are opened **once**,
//!   when the session's toolset is built (before the agent's first call), as
//!   directory fds, and their (device, inode) remembered;
//! - a tool path is made absolute and normalised **lexically** (`.` and `..`
//!   collapsed, nothing on disk consulted), then matched component-wise to
//!   the longest root it lies under, as configured or as the root's
//!   canonical path at the start — `/mnt/memory/notes-old` is not inside
//!   `/mnt/memory/notes`;
//! - it is then opened *from that root's fd* with [`crate::fsx::open_beneath`]
//!   (`openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`
//!   or a per-component `O_NOFOLLOW` walk): a symlink anywhere below a root is
//!   refused, never followed, so no rename race can lead outside;
//! - before each use the root's path must still name the directory opened at
//!   the start; a root renamed away, removed or replaced (by a symlink or a
//!   new directory) answers "was replaced or removed during the session".
//!
//! `write` and `edit` also refuse anything in a read-only root: the root the
//! path matched, any directory they walk through, or the file itself having
//! the identity of a read-only root (so a read-only store moved elsewhere
//! under a writable root stays read-only). Error texts name the path as the
//! agent spelled it, never the absolute workdir.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use super::ToolError;
use crate::fsx;

/// Where directories the tools create get their mode.
const NEW_DIR_MODE: u32 = 0o755;

/// The workdir and the extra directories the file tools may reach, each
/// opened once.
#[derive(Debug, Clone)]
pub struct PathPolicy {
    inner: Arc<Roots>,
}

#[derive(Debug)]
struct Roots {
    workdir: PathBuf,
    /// Longest path first, so the first match is the most specific root.
    roots: Vec<Root>,
    /// (device, inode) of each read-only root, with its path as configured.
    read_only: Vec<((u64, u64), PathBuf)>,
}

/// One root, opened when the policy was built.
#[derive(Debug)]
struct Root {
    /// Absolute and lexically normalised, as configured.
    path: PathBuf,
    /// `path` and, when it differs, its canonical form at the start (the
    /// operator's symlinks above a root resolved once): a tool path under
    /// either spelling belongs to this root.
    spellings: Vec<PathBuf>,
    is_workdir: bool,
    /// What was opened, or why nothing could be.
    opened: Result<Opened, Errno>,
}

#[derive(Debug)]
struct Opened {
    /// The directory paths are resolved from: the root itself, or a
    /// single-file root's parent.
    base: OwnedFd,
    /// A single-file root's name in `base`.
    file: Option<String>,
    /// The path whose identity must still be `id`: the root, or a
    /// single-file root's parent.
    check: PathBuf,
    id: (u64, u64),
}

/// `path` absolute against the process's directory and normalised lexically.
fn absolute(path: &Path) -> PathBuf {
    normalize(&std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()))
}

/// The identity `path` names now (following symlinks: roots are the
/// operator's configuration, resolved as configured).
fn identity_of(path: &Path) -> Result<(u64, u64), Errno> {
    let st = rustix::fs::stat(path)?;
    Ok((st.st_dev, st.st_ino))
}

impl Root {
    fn open(path: PathBuf, is_workdir: bool) -> Root {
        let opened = Self::open_dir(&path).or_else(|e| match e {
            Errno::NOTDIR => Self::open_file(&path),
            e => Err(e),
        });
        let mut spellings = vec![path.clone()];
        if let Ok(real) = std::fs::canonicalize(&path)
            && real != path
        {
            spellings.push(real);
        }
        Root {
            path,
            spellings,
            is_workdir,
            opened,
        }
    }

    fn open_dir(path: &Path) -> Result<Opened, Errno> {
        let base = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .and_then(fsx::refuse_pseudo_fs)?;
        Ok(Opened {
            id: fsx::identity(&base)?,
            base,
            file: None,
            check: path.to_path_buf(),
        })
    }

    /// A root that names a single file grants that file only: its parent is
    /// opened, and only the file's own name is resolved from it.
    fn open_file(path: &Path) -> Result<Opened, Errno> {
        let real = std::fs::canonicalize(path)
            .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
        let (Some(parent), Some(name)) = (real.parent(), real.file_name()) else {
            return Err(Errno::NOTDIR);
        };
        let name = name.to_str().ok_or(Errno::INVAL)?.to_string();
        let mut opened = Self::open_dir(parent)?;
        opened.file = Some(name);
        Ok(opened)
    }

    /// How this root is named in errors.
    fn shown(&self) -> String {
        if self.is_workdir {
            "the working directory".into()
        } else {
            match &self.opened {
                Ok(Opened { file: Some(_), .. }) => format!("the file {}", self.path.display()),
                _ => format!("the directory {}", self.path.display()),
            }
        }
    }

    /// The root as opened, provided its path still names it.
    fn live(&self, op: &str) -> Result<&Opened, ToolError> {
        let gone = || {
            ToolError::new(format!(
                "{op}: {} was replaced or removed during the session",
                self.shown()
            ))
        };
        let opened = match &self.opened {
            Ok(o) => o,
            Err(e) => {
                return Err(ToolError::new(format!(
                    "{op}: {} could not be opened when the session started: {}",
                    self.shown(),
                    errno_reason(*e)
                )));
            }
        };
        match identity_of(&opened.check) {
            Ok(id) if id == opened.id => Ok(opened),
            _ => Err(gone()),
        }
    }
}

impl PathPolicy {
    /// Open the workdir and every root now; `allowed_roots` and
    /// `read_only_roots` may name files or directories; an empty entry
    /// grants (or protects) nothing. A root that cannot be opened grants
    /// nothing, and paths under it answer why.
    pub(crate) fn new(
        workdir: &Path,
        allowed_roots: Vec<PathBuf>,
        read_only_roots: Vec<PathBuf>,
    ) -> Self {
        let keep = |roots: Vec<PathBuf>| -> Vec<PathBuf> {
            roots
                .into_iter()
                .filter(|r| !r.as_os_str().is_empty())
                .map(|r| absolute(&r))
                .collect()
        };
        let workdir = absolute(workdir);
        let mut roots = vec![Root::open(workdir.clone(), true)];
        roots.extend(
            keep(allowed_roots)
                .into_iter()
                .map(|r| Root::open(r, false)),
        );
        let read_only = keep(read_only_roots)
            .into_iter()
            .filter_map(|r| Some((identity_of(&r).ok()?, r)))
            .collect();
        PathPolicy {
            inner: Arc::new(Roots {
                workdir,
                roots,
                read_only,
            }),
        }
    }

    /// The workdir: absolute, lexically normalised.
    pub fn workdir(&self) -> PathBuf {
        self.inner.workdir.clone()
    }

    /// Where `p` (relative to the workdir) lies: its root and the components
    /// below it, or a refusal when it lies under no root or its root was
    /// replaced.
    pub(crate) fn locate<'a>(&'a self, op: &str, p: &'a str) -> Result<Target<'a>, ToolError> {
        let candidate = Path::new(p);
        let full = if candidate.is_absolute() {
            normalize(candidate)
        } else {
            normalize(&self.inner.workdir.join(candidate))
        };
        // The most specific root: the longest spelling `full` lies under (the
        // workdir wins a tie: it is listed first).
        let mut best: Option<(&Root, &Path, usize)> = None;
        for root in &self.inner.roots {
            let single_file = matches!(&root.opened, Ok(Opened { file: Some(_), .. }));
            for spelling in &root.spellings {
                let Ok(rest) = full.strip_prefix(spelling) else {
                    continue;
                };
                if single_file && !rest.as_os_str().is_empty() {
                    continue;
                }
                let depth = spelling.components().count();
                if best.is_none_or(|(_, _, d)| depth > d) {
                    best = Some((root, rest, depth));
                }
            }
        }
        if let Some((root, rest, _)) = best {
            let mut comps = Vec::new();
            for c in rest.components() {
                match c.as_os_str().to_str() {
                    Some(s) => comps.push(s.to_string()),
                    // Tool inputs are JSON strings: always UTF-8.
                    None => return Err(ToolError::new(format!("{op}: path {p:?} is not UTF-8"))),
                }
            }
            let opened = root.live(op)?;
            if let Some(name) = &opened.file {
                comps.push(name.clone());
            }
            return Ok(Target {
                policy: self,
                opened,
                comps,
                shown: full,
                p,
            });
        }
        let others = if self.inner.roots.len() > 1 {
            " and its other permitted directories"
        } else {
            ""
        };
        Err(ToolError::new(format!(
            "{op}: path {p:?} is outside the session's working directory{others}"
        )))
    }

    /// The workdir itself, as a target (for `glob`/`grep` without a path).
    pub(crate) fn locate_workdir<'a>(&'a self, op: &str) -> Result<Target<'a>, ToolError> {
        let root = self
            .inner
            .roots
            .iter()
            .find(|r| r.is_workdir)
            .expect("the workdir is always a root");
        Ok(Target {
            policy: self,
            opened: root.live(op)?,
            comps: Vec::new(),
            shown: self.inner.workdir.clone(),
            p: ".",
        })
    }

    /// The configured path of the read-only root whose identity is `id`.
    fn read_only(&self, id: (u64, u64)) -> Option<&Path> {
        self.inner
            .read_only
            .iter()
            .find(|(ro, _)| *ro == id)
            .map(|(_, path)| path.as_path())
    }
}

/// A tool path matched to its root: opened only from the root's fd.
pub(crate) struct Target<'a> {
    policy: &'a PathPolicy,
    opened: &'a Opened,
    /// Below the root's fd (a single-file root's name included).
    comps: Vec<String>,
    shown: PathBuf,
    p: &'a str,
}

impl Target<'_> {
    /// The absolute, lexically normalised path (for output).
    pub(crate) fn shown(&self) -> &Path {
        &self.shown
    }

    /// Open the target with `flags` (`O_NOFOLLOW` added), beneath its root.
    pub(crate) fn open(&self, op: &str, flags: OFlags) -> Result<OwnedFd, ToolError> {
        self.open_errno(flags).map_err(|e| self.error(op, e))
    }

    /// [`Target::open`] with the OS error as it came.
    pub(crate) fn open_errno(&self, flags: OFlags) -> Result<OwnedFd, Errno> {
        let comps: Vec<&str> = self.comps.iter().map(String::as_str).collect();
        fsx::open_beneath(&self.opened.base, &comps, flags)
    }

    /// A refusal or failure about this path, in the tools' words.
    pub(crate) fn error(&self, op: &str, e: Errno) -> ToolError {
        path_error(op, self.p, e)
    }

    /// Refuse when the file `id` (already open) is a read-only root.
    pub(crate) fn check_writable_file(&self, op: &str, id: (u64, u64)) -> Result<(), ToolError> {
        self.refuse_read_only(op, id)
    }

    fn refuse_read_only(&self, op: &str, id: (u64, u64)) -> Result<(), ToolError> {
        match self.policy.read_only(id) {
            Some(root) => Err(ToolError::new(format!(
                "{op}: {} is inside read-only directory {}",
                self.p,
                root.display()
            ))),
            None => Ok(()),
        }
    }

    /// The directory that holds the target, opened by walking from the root
    /// without following symlinks (creating missing directories `0755` when
    /// `create`), and the target's name in it. Refuses when the root, or any
    /// directory on the way, is a read-only root.
    pub(crate) fn parent_for_write(
        &self,
        op: &str,
        create: bool,
    ) -> Result<(OwnedFd, String), ToolError> {
        let Some((leaf, dirs)) = self.comps.split_last() else {
            return Err(self.error(op, Errno::ISDIR));
        };
        let mut current = fsx::open_beneath(&self.opened.base, &[], fsx::DIR_FLAGS)
            .map_err(|e| self.error(op, e))?;
        self.refuse_read_only(op, self.opened.id)?;
        for dir in dirs {
            let next = match fsx::open_dir_at(&current, dir) {
                Err(Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(
                        &current,
                        dir.as_str(),
                        Mode::from_raw_mode(NEW_DIR_MODE),
                    ) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(self.error(op, e)),
                    }
                    fsx::open_dir_at(&current, dir)
                }
                other => other,
            }
            .map_err(|e| self.error(op, e))?;
            let id = fsx::identity(next.as_fd()).map_err(|e| self.error(op, e))?;
            self.refuse_read_only(op, id)?;
            current = next;
        }
        Ok((current, leaf.clone()))
    }
}

/// An open or walk failure as the agent reads it.
pub(crate) fn path_error(op: &str, p: &str, e: Errno) -> ToolError {
    match e {
        Errno::LOOP => ToolError::new(format!(
            "{op}: {p}: a symbolic link is in the way (the file tools never follow symbolic links)"
        )),
        // `refuse_pseudo_fs` (or `openat2` refusing to leave the root).
        Errno::XDEV => ToolError::new(format!(
            "{op}: {p}: lies in a kernel filesystem such as /proc, which the file tools never open"
        )),
        e => ToolError::new(format!("{op}: {p}: {}", errno_reason(e))),
    }
}

/// Collapse `.` and `..` without touching the filesystem (`..` at `/` stays `/`).
pub(crate) fn normalize(path: &Path) -> PathBuf {
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

fn errno_reason(e: Errno) -> String {
    fs_reason(&io::Error::from_raw_os_error(e.raw_os_error()))
}

/// A filesystem error as the same words everywhere, without host paths.
pub(crate) fn fs_reason(e: &io::Error) -> String {
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
        Errno::XDEV => "a kernel filesystem such as /proc, which the file tools never open".into(),
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

    #[test]
    fn the_longest_root_wins_and_siblings_sharing_a_prefix_are_outside() {
        let t = tempfile::tempdir().unwrap();
        for d in ["work/mem", "notes", "notes-old"] {
            std::fs::create_dir_all(t.path().join(d)).unwrap();
        }
        let policy = PathPolicy::new(
            &t.path().join("work"),
            vec![t.path().join("work/mem"), t.path().join("notes")],
            vec![t.path().join("work/mem")],
        );
        // Matched to the read-only store, not to the workdir around it.
        let target = policy.locate("write", "mem/a.md").unwrap();
        assert!(target.parent_for_write("write", true).is_err());
        let target = policy.locate("write", "other/a.md").unwrap();
        assert!(target.parent_for_write("write", true).is_ok());
        let outside = t.path().join("notes-old/a").display().to_string();
        assert!(policy.locate("read", &outside).is_err());
        // A root configured through a symlink answers to both spellings.
        std::os::unix::fs::symlink(t.path().join("work"), t.path().join("work-link")).unwrap();
        std::fs::write(t.path().join("work/f"), "f").unwrap();
        let aliased = PathPolicy::new(&t.path().join("work-link"), vec![], vec![]);
        for p in ["f", &t.path().join("work/f").display().to_string()] {
            assert!(
                aliased
                    .locate("read", p)
                    .unwrap()
                    .open("read", OFlags::RDONLY)
                    .is_ok()
            );
        }
        let up = "../notes/../notes/x";
        assert_eq!(
            policy.locate("read", up).unwrap().shown(),
            t.path().join("notes/x")
        );
    }
}
