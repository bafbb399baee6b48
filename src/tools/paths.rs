//! Where the file tools may go, and how they get there without leaving.
//!
//! The rule is the reference's (`resolve_path` of the official SDK): a tool
//! path, relative to the (canonical) workdir or absolute, has `.` and `..`
//! collapsed by text, then every symlink on it followed (the leaf and a
//! dangling one included, at most 40 hops); it is accepted when that
//! canonical path lies inside the workdir or an allowed root, and the tool
//! then works on the canonical path. So `current -> releases/42`,
//! `node_modules/.bin/tool`, a chain of links, a dangling link `write`
//! creates the target of, a workdir link into a store all work, and a link
//! leading out answers `path "<p>" is outside the session's working
//! directory` (` and its other permitted directories` when there are).
//!
//! The agent has a shell beside the tools: it can replace any directory with
//! a symlink (to `/proc/self`, to `/`) or exchange the two in a loop while a
//! tool runs. So nothing here trusts a path between a check and a use:
//!
//! - the workdir and every allowed and read-only root are opened **once**,
//!   when the session's toolset is built (before the agent's first call), as
//!   directory fds, and their (device, inode) and canonical path remembered;
//! - a tool path is resolved by `super::resolve` from those fds, one
//!   `O_PATH | O_NOFOLLOW` component at a time, each link read from its own
//!   descriptor and the walk restarted from the root its target lies under:
//!   the kernel never follows a name, and every component of the result was
//!   reached by descending from a root's fd;
//! - the tool then opens the canonical components from that root's fd with
//!   `crate::fsx::open_beneath` (`openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` or a per-component
//!   `O_NOFOLLOW` walk): a link swapped in since the resolution is refused
//!   there, never followed, and the call resolves again (a few times, then
//!   answers that the path kept changing);
//! - before each use the root's path must still name the directory opened at
//!   the start; a root renamed away, removed or replaced (by a symlink or a
//!   new directory) answers "was replaced or removed during the session".
//!
//! `write` and `edit` also refuse anything in a read-only root: when the
//! canonical target lies under a read-only root's canonical path (whichever
//! alias reached it, as the reference compares), when the root the path
//! resolved under or any directory they walk through has the identity of a
//! read-only root, or the file itself has (so a read-only store moved
//! elsewhere under a writable root stays read-only). Error texts name the
//! path as the agent spelled it, never the absolute workdir.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use super::ToolError;
use super::resolve::{self, Anchor, Unresolved, normalize};
use crate::fsx;

/// Where directories the tools create get their mode.
const NEW_DIR_MODE: u32 = 0o755;

/// How many times a call resolves its path again after meeting a symlink
/// where the resolution found none (the agent's shell swapping one in).
const RACE_RETRIES: usize = 8;

/// The workdir and the extra directories the file tools may reach, each
/// opened once.
#[derive(Debug, Clone)]
pub struct PathPolicy {
    inner: Arc<Roots>,
}

#[derive(Debug)]
struct Roots {
    workdir: PathBuf,
    /// The workdir's canonical path at the start: relative tool paths are
    /// joined to it (as the reference joins them to `workdir.resolve()`).
    workdir_canonical: PathBuf,
    /// The workdir first (it wins a tie between equal spellings).
    roots: Vec<Root>,
    read_only: Vec<ReadOnly>,
}

/// A read-only root: its identity and its spellings at the start.
#[derive(Debug)]
struct ReadOnly {
    id: Option<(u64, u64)>,
    /// As configured (absolute, normalised) and canonical.
    spellings: Vec<PathBuf>,
}

impl ReadOnly {
    /// How the refusal names it: as configured.
    fn shown(&self) -> &Path {
        &self.spellings[0]
    }
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
    /// Where it is: its canonical path at the start (`path` when that
    /// could not be found). Answers name paths below a root by it.
    canonical: PathBuf,
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

/// `path` and, when it differs, its canonical form now.
fn spellings_of(path: &Path) -> Vec<PathBuf> {
    let mut spellings = vec![path.to_path_buf()];
    if let Ok(real) = std::fs::canonicalize(path)
        && real != path
    {
        spellings.push(real);
    }
    spellings
}

impl Root {
    fn open(path: PathBuf, is_workdir: bool) -> Root {
        let opened = Self::open_dir(&path).or_else(|e| match e {
            Errno::NOTDIR => Self::open_file(&path),
            e => Err(e),
        });
        let spellings = spellings_of(&path);
        Root {
            canonical: spellings.last().cloned().unwrap_or_else(|| path.clone()),
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

    /// This root as a place [`resolve::resolve`] starts from.
    fn anchor(&self) -> Anchor<'_> {
        let opened = self.opened.as_ref().ok();
        Anchor {
            spellings: &self.spellings,
            canonical: &self.canonical,
            fd: opened.map(|o| o.base.as_fd()),
            file: opened.and_then(|o| o.file.as_deref()),
        }
    }
}

/// Why a call on a resolved path stopped: an answer for the agent, or a
/// symlink met where the resolution found none (resolve again).
#[derive(Debug)]
pub(crate) enum Failed {
    Tool(ToolError),
    Raced,
}

impl From<ToolError> for Failed {
    fn from(e: ToolError) -> Self {
        Failed::Tool(e)
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
            .map(|r| ReadOnly {
                id: identity_of(&r).ok(),
                spellings: spellings_of(&r),
            })
            .collect();
        PathPolicy {
            inner: Arc::new(Roots {
                workdir_canonical: roots[0].canonical.clone(),
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

    /// Run `f` on `p` (relative to the workdir; `None`: the workdir
    /// itself) resolved; when `f` meets a symlink the resolution did not
    /// see, resolve again, at most [`RACE_RETRIES`] times.
    pub(crate) fn with_target<T>(
        &self,
        op: &str,
        p: Option<&str>,
        mut f: impl FnMut(&Target<'_>) -> Result<T, Failed>,
    ) -> Result<T, ToolError> {
        for _ in 0..RACE_RETRIES {
            let target = match p {
                Some(p) => self.resolve(op, p)?,
                None => self.resolve_workdir(op)?,
            };
            match f(&target) {
                Ok(done) => return Ok(done),
                Err(Failed::Tool(e)) => return Err(e),
                Err(Failed::Raced) => continue,
            }
        }
        Err(ToolError::new(format!(
            "{op}: {}: the path kept changing while the tool opened it (a symbolic link was swapped in on its way); try again",
            p.unwrap_or(".")
        )))
    }

    /// Where `p` (relative to the workdir) leads: its root and canonical
    /// components, or a refusal when it leads under no root, loops, or its
    /// root was replaced.
    pub(crate) fn resolve<'a>(&'a self, op: &str, p: &'a str) -> Result<Target<'a>, ToolError> {
        let candidate = Path::new(p);
        let full = if candidate.is_absolute() {
            normalize(candidate)
        } else {
            normalize(&self.inner.workdir_canonical.join(candidate))
        };
        let anchors: Vec<Anchor<'_>> = self.inner.roots.iter().map(Root::anchor).collect();
        let resolved = match resolve::resolve(&anchors, &full, &mut 0) {
            Ok(resolved) => resolved,
            Err(Unresolved::Outside) => {
                let others = if self.inner.roots.len() > 1 {
                    " and its other permitted directories"
                } else {
                    ""
                };
                return Err(ToolError::new(format!(
                    "{op}: path {p:?} is outside the session's working directory{others}"
                )));
            }
            Err(Unresolved::Unopened(i)) => {
                return Err(self.inner.roots[i]
                    .live(op)
                    .err()
                    .unwrap_or_else(|| path_error(op, p, Errno::BADF)));
            }
            Err(Unresolved::Os(Errno::XDEV)) => return Err(path_error(op, p, Errno::XDEV)),
            Err(Unresolved::Os(e)) => {
                return Err(ToolError::new(format!(
                    "{op}: path {p:?}: {}",
                    errno_reason(e)
                )));
            }
        };
        let root = &self.inner.roots[resolved.anchor];
        Ok(Target {
            policy: self,
            opened: root.live(op)?,
            comps: resolved.comps,
            shown: resolved.canonical,
            p,
        })
    }

    /// The workdir itself, as a target (for `glob`/`grep` without a path).
    fn resolve_workdir<'a>(&'a self, op: &str) -> Result<Target<'a>, ToolError> {
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
            shown: root.canonical.clone(),
            p: ".",
        })
    }

    /// The read-only root whose identity is `id`.
    fn read_only_by_id(&self, id: (u64, u64)) -> Option<&ReadOnly> {
        self.inner.read_only.iter().find(|ro| ro.id == Some(id))
    }

    /// The read-only root the canonical `path` lies under.
    fn read_only_by_path(&self, path: &Path) -> Option<&ReadOnly> {
        self.inner
            .read_only
            .iter()
            .find(|ro| ro.spellings.iter().any(|s| path.starts_with(s)))
    }
}

/// A tool path resolved under its root: opened only from the root's fd.
pub(crate) struct Target<'a> {
    policy: &'a PathPolicy,
    opened: &'a Opened,
    /// Canonical, below the root's fd (a single-file root's name included).
    comps: Vec<String>,
    /// The canonical absolute path (what answers name).
    shown: PathBuf,
    p: &'a str,
}

impl Target<'_> {
    /// The canonical absolute path (for output).
    pub(crate) fn shown(&self) -> &Path {
        &self.shown
    }

    /// Open the target with `flags` (`O_NOFOLLOW` added), beneath its root.
    pub(crate) fn open(&self, op: &str, flags: OFlags) -> Result<OwnedFd, Failed> {
        self.open_errno(flags).map_err(|e| self.fail(op, e))
    }

    /// [`Target::open`] with the OS error as it came.
    pub(crate) fn open_errno(&self, flags: OFlags) -> Result<OwnedFd, Errno> {
        let comps: Vec<&str> = self.comps.iter().map(String::as_str).collect();
        fsx::open_beneath(&self.opened.base, &comps, flags)
    }

    /// A failure on the canonical path: a symlink there now (`ELOOP`) was
    /// swapped in since the resolution; anything else is the agent's answer.
    pub(crate) fn fail(&self, op: &str, e: Errno) -> Failed {
        match e {
            Errno::LOOP => Failed::Raced,
            e => Failed::Tool(self.error(op, e)),
        }
    }

    /// A refusal or failure about this path, in the tools' words.
    pub(crate) fn error(&self, op: &str, e: Errno) -> ToolError {
        path_error(op, self.p, e)
    }

    /// Refuse a target whose canonical path lies under a read-only root
    /// (the reference's check, whichever alias reached it).
    pub(crate) fn refuse_read_only(&self, op: &str) -> Result<(), ToolError> {
        match self.policy.read_only_by_path(&self.shown) {
            Some(ro) => Err(self.read_only_error(op, ro)),
            None => Ok(()),
        }
    }

    fn read_only_error(&self, op: &str, ro: &ReadOnly) -> ToolError {
        ToolError::new(format!(
            "{op}: {} is inside read-only directory {}",
            self.p,
            ro.shown().display()
        ))
    }

    /// Refuse when the file `id` (already open) is a read-only root.
    pub(crate) fn check_writable_file(&self, op: &str, id: (u64, u64)) -> Result<(), ToolError> {
        match self.policy.read_only_by_id(id) {
            Some(ro) => Err(self.read_only_error(op, ro)),
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
    ) -> Result<(OwnedFd, String), Failed> {
        let Some((leaf, dirs)) = self.comps.split_last() else {
            return Err(Failed::Tool(self.error(op, Errno::ISDIR)));
        };
        let mut current = fsx::open_beneath(&self.opened.base, &[], fsx::DIR_FLAGS)
            .map_err(|e| self.fail(op, e))?;
        self.check_writable_file(op, self.opened.id)?;
        for dir in dirs {
            let next = match fsx::open_dir_at(&current, dir) {
                Err(Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(
                        &current,
                        dir.as_str(),
                        Mode::from_raw_mode(NEW_DIR_MODE),
                    ) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(self.fail(op, e)),
                    }
                    fsx::open_dir_at(&current, dir)
                }
                other => other,
            }
            .map_err(|e| self.fail(op, e))?;
            let id = fsx::identity(next.as_fd()).map_err(|e| self.fail(op, e))?;
            self.check_writable_file(op, id)?;
            current = next;
        }
        Ok((current, leaf.clone()))
    }
}

/// An open or walk failure as the agent reads it.
pub(crate) fn path_error(op: &str, p: &str, e: Errno) -> ToolError {
    match e {
        // `refuse_pseudo_fs` (or `openat2` refusing to leave the root).
        Errno::XDEV => ToolError::new(format!(
            "{op}: {p}: lies in a kernel filesystem such as /proc, which the file tools never open"
        )),
        e => ToolError::new(format!("{op}: {p}: {}", errno_reason(e))),
    }
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
        let target = policy.resolve("write", "mem/a.md").unwrap();
        assert!(target.parent_for_write("write", true).is_err());
        let target = policy.resolve("write", "other/a.md").unwrap();
        assert!(target.parent_for_write("write", true).is_ok());
        let outside = t.path().join("notes-old/a").display().to_string();
        assert!(policy.resolve("read", &outside).is_err());
        // A root configured through a symlink answers to both spellings.
        std::os::unix::fs::symlink(t.path().join("work"), t.path().join("work-link")).unwrap();
        std::fs::write(t.path().join("work/f"), "f").unwrap();
        let aliased = PathPolicy::new(&t.path().join("work-link"), vec![], vec![]);
        for p in ["f", &t.path().join("work/f").display().to_string()] {
            assert!(
                aliased
                    .resolve("read", p)
                    .unwrap()
                    .open("read", OFlags::RDONLY)
                    .is_ok()
            );
        }
        let up = "../notes/../notes/x";
        assert_eq!(
            policy.resolve("read", up).unwrap().shown(),
            t.path().join("notes/x")
        );
    }
}
