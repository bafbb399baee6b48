//! Following symbolic links as the reference does, without trusting a name
//! twice.
//!
//! The reference (`resolve_path` of the official SDK) accepts a path when,
//! `.` and `..` collapsed by text first and then every symlink followed (the
//! leaf and a dangling one included, more than 40 hops being a loop), the
//! canonical result lies inside one of the permitted roots; the tool then
//! works on that canonical path. Done by name, that is a check followed by a
//! use, and the agent's shell can swap a link in between. Here the same
//! answer is reached from directory descriptors:
//!
//! - the path (absolute, lexically normal) is matched to the *anchor* (a
//!   root opened at the start of the session) whose spelling is its longest
//!   prefix, and walked from that anchor's descriptor, one component at a
//!   time, with `O_PATH | O_NOFOLLOW` ([`fsx::lookup_at`]): nothing is ever
//!   followed by the kernel;
//! - a symlink met on the way is read from its own descriptor
//!   ([`fsx::link_target`]), its target joined (by text) to the canonical
//!   path of the directory holding it, with what is left of the path after
//!   it, normalised, and the resolution starts over from the anchor that
//!   new path lies under — so a relative link, an absolute one, one that
//!   climbs above its root into another root, all land on an anchor's
//!   descriptor and descend from there;
//! - a path that lies under no anchor is walked from `/` only to read the
//!   links on its way (a store mounted below a symlinked directory, a link
//!   leading out and back in); unless one of them leads into an anchor, it
//!   is outside. Kernel pseudo-filesystems are never entered on the way;
//! - each hop counts; past [`MAX_HOPS`] the answer is `ELOOP`.
//!
//! Whatever the agent renames meanwhile, every component the result names
//! was reached by descending from an anchor's descriptor, so a swap can
//! change which answer a call gets, never make it leave its roots.

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::fsx::{self, Kind};

/// Most symlinks one resolution follows (the kernel's own `MAXSYMLINKS`,
/// and the reference's `_MAX_SYMLINK_HOPS`); one more is a loop.
pub(crate) const MAX_HOPS: usize = 40;

/// A place paths may be resolved from: a root opened at the start.
pub(crate) struct Anchor<'a> {
    /// Absolute, lexically normal prefixes a path may start with to lie
    /// under this anchor (as configured, and canonical).
    pub(crate) spellings: &'a [PathBuf],
    /// Where the anchor really is (its symlinks resolved when it was opened).
    pub(crate) canonical: &'a Path,
    /// The directory opened at the start (a single-file anchor's parent);
    /// `None` when it could not be opened.
    pub(crate) fd: Option<BorrowedFd<'a>>,
    /// A single-file anchor's name in `fd`: it grants that name only.
    pub(crate) file: Option<&'a str>,
}

/// A path resolved under an anchor.
#[derive(Debug)]
pub(crate) struct Resolved {
    /// Index of the anchor it lies under.
    pub(crate) anchor: usize,
    /// The components below the anchor's descriptor, none a symlink when
    /// they were walked (a single-file anchor's own name included); the
    /// last `missing` do not exist (yet).
    pub(crate) comps: Vec<String>,
    pub(crate) missing: usize,
    /// The canonical path: the anchor's canonical path and `comps`.
    pub(crate) canonical: PathBuf,
    /// The last component, opened `O_PATH` when it exists (`None` for the
    /// anchor itself or a missing tail).
    pub(crate) leaf: Option<OwnedFd>,
}

/// Why a path did not resolve under any anchor.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unresolved {
    /// Its canonical path lies under no anchor.
    Outside,
    /// It lies under an anchor that could not be opened at the start.
    Unopened(usize),
    /// The walk failed: `ELOOP` past [`MAX_HOPS`], `EACCES`, `EXDEV` for a
    /// pseudo-filesystem below an anchor, `EILSEQ` for a link target that
    /// is not UTF-8.
    Os(Errno),
}

impl From<Errno> for Unresolved {
    fn from(e: Errno) -> Self {
        Unresolved::Os(e)
    }
}

/// The anchor `path` lies under by its spelling (the longest prefix; the
/// first anchor wins a tie), and the components below that prefix.
fn locate<'p>(anchors: &[Anchor<'_>], path: &'p Path) -> Option<(usize, &'p Path)> {
    let mut best: Option<(usize, &Path, usize)> = None;
    for (i, anchor) in anchors.iter().enumerate() {
        for spelling in anchor.spellings {
            let Ok(rest) = path.strip_prefix(spelling) else {
                continue;
            };
            if anchor.file.is_some() && !rest.as_os_str().is_empty() {
                continue;
            }
            let depth = spelling.components().count();
            if best.is_none_or(|(_, _, d)| depth > d) {
                best = Some((i, rest, depth));
            }
        }
    }
    best.map(|(i, rest, _)| (i, rest))
}

fn utf8(name: &std::ffi::OsStr) -> Result<String, Unresolved> {
    name.to_str()
        .map(str::to_string)
        .ok_or(Unresolved::Os(Errno::ILSEQ))
}

/// Where a walk starts: an anchor's descriptor, or `/` for a path under
/// none (walked only to read the links on its way).
struct Start<'a> {
    anchor: Option<usize>,
    fd: BorrowedFd<'a>,
    /// The canonical path of `fd`.
    path: PathBuf,
    comps: Vec<String>,
}

/// What one walk from a start came to.
enum Walked {
    Done(Resolved),
    /// A symlink: resolve this path instead.
    Restart(PathBuf),
}

/// Resolve `path` (absolute and lexically normal) under `anchors`,
/// following every symlink on the way, the leaf included; `hops` counts the
/// links followed (start it at 0, or at the links already followed).
pub(crate) fn resolve(
    anchors: &[Anchor<'_>],
    path: &Path,
    hops: &mut usize,
) -> Result<Resolved, Unresolved> {
    let mut slash: Option<OwnedFd> = None;
    let mut want = normalize(path);
    loop {
        let located = locate(anchors, &want);
        if located.is_none() && slash.is_none() {
            slash = Some(rustix::fs::open(
                "/",
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?);
        }
        let start = match located {
            Some((i, rest)) => {
                let anchor = &anchors[i];
                let fd = anchor.fd.ok_or(Unresolved::Unopened(i))?;
                let mut comps = rest.iter().map(utf8).collect::<Result<Vec<_>, _>>()?;
                let path = match anchor.file {
                    Some(name) => {
                        comps.push(name.to_string());
                        anchor.canonical.parent().unwrap_or(Path::new("/")).into()
                    }
                    None => anchor.canonical.to_path_buf(),
                };
                Start {
                    anchor: Some(i),
                    fd,
                    path,
                    comps,
                }
            }
            None => Start {
                anchor: None,
                fd: slash.as_ref().expect("opened above").as_fd(),
                path: PathBuf::from("/"),
                comps: want
                    .strip_prefix("/")
                    .unwrap_or(&want)
                    .iter()
                    .map(utf8)
                    .collect::<Result<Vec<_>, _>>()?,
            },
        };
        match walk(start, hops)? {
            Walked::Done(resolved) => return Ok(resolved),
            Walked::Restart(next) => want = next,
        }
    }
}

/// Walk `start.comps` from `start.fd`, one `O_PATH | O_NOFOLLOW` step at
/// a time, until the end, a missing component or a symlink.
fn walk(start: Start<'_>, hops: &mut usize) -> Result<Walked, Unresolved> {
    let Start {
        anchor,
        fd,
        mut path,
        comps,
    } = start;
    let mut current: Option<OwnedFd> = None;
    let mut leaf: Option<OwnedFd> = None;
    let mut missing = 0;
    for (i, name) in comps.iter().enumerate() {
        let parent = current.as_ref().map_or(fd, |f| f.as_fd());
        let (found, kind) = match fsx::lookup_at(parent, name) {
            Ok(found) => found,
            // The rest does not exist: kept as spelled (a file `write` creates).
            Err(Errno::NOENT | Errno::NOTDIR) => {
                missing = comps.len() - i;
                break;
            }
            // A pseudo-filesystem on the way outside every anchor: nothing
            // there is followed, so the path stays outside.
            Err(Errno::XDEV) if anchor.is_none() => return Err(Unresolved::Outside),
            Err(e) => return Err(e.into()),
        };
        let last = i + 1 == comps.len();
        match kind {
            Kind::Symlink => {
                *hops += 1;
                if *hops > MAX_HOPS {
                    return Err(Unresolved::Os(Errno::LOOP));
                }
                let target: OsString = fsx::link_target(&found)?;
                let mut next = path.join(target);
                next.extend(&comps[i + 1..]);
                return Ok(Walked::Restart(normalize(&next)));
            }
            Kind::Dir => {
                path.push(name);
                if last {
                    leaf = Some(found);
                } else {
                    current = Some(found);
                }
            }
            Kind::Other => {
                path.push(name);
                if last {
                    leaf = Some(found);
                } else {
                    // A file where a directory is needed: the rest cannot
                    // exist; the tool's own open says "not a directory".
                    missing = comps.len() - i - 1;
                    break;
                }
            }
        }
    }
    let Some(anchor) = anchor else {
        return Err(Unresolved::Outside);
    };
    for name in &comps[comps.len() - missing..] {
        path.push(name);
    }
    Ok(Walked::Done(Resolved {
        anchor,
        comps,
        missing,
        canonical: path,
        leaf,
    }))
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn dir_fd(path: &Path) -> OwnedFd {
        rustix::fs::open(path, fsx::DIR_FLAGS, Mode::empty()).unwrap()
    }

    /// Two roots, `a` and `b`, under a temporary directory, and `out` beside them.
    struct Tree {
        _t: tempfile::TempDir,
        base: PathBuf,
        spellings: Vec<Vec<PathBuf>>,
        fds: Vec<OwnedFd>,
    }

    impl Tree {
        fn new() -> Tree {
            let t = tempfile::tempdir().unwrap();
            let base = std::fs::canonicalize(t.path()).unwrap();
            for d in ["a", "b", "out"] {
                std::fs::create_dir(base.join(d)).unwrap();
            }
            let spellings = vec![vec![base.join("a")], vec![base.join("b")]];
            let fds = vec![dir_fd(&base.join("a")), dir_fd(&base.join("b"))];
            Tree {
                _t: t,
                base,
                spellings,
                fds,
            }
        }

        fn anchors(&self) -> Vec<Anchor<'_>> {
            self.spellings
                .iter()
                .zip(&self.fds)
                .map(|(s, fd)| Anchor {
                    spellings: s,
                    canonical: &s[0],
                    fd: Some(fd.as_fd()),
                    file: None,
                })
                .collect()
        }

        fn resolve(&self, rel: &str) -> Result<Resolved, Unresolved> {
            resolve(&self.anchors(), &self.base.join(rel), &mut 0)
        }
    }

    #[test]
    fn links_relative_absolute_and_across_roots_land_on_an_anchor() {
        let t = Tree::new();
        std::fs::write(t.base.join("b/f"), "f").unwrap();
        symlink("../b/f", t.base.join("a/rel")).unwrap();
        symlink(t.base.join("b"), t.base.join("a/abs")).unwrap();
        symlink("../out/../a/rel", t.base.join("a/climb")).unwrap();
        for (path, comps) in [
            ("a/rel", vec!["f"]),
            ("a/abs/f", vec!["f"]),
            ("a/climb", vec!["f"]),
        ] {
            let r = t.resolve(path).unwrap();
            assert_eq!(
                (r.anchor, r.comps.clone(), r.missing),
                (1, comps.iter().map(|s| s.to_string()).collect(), 0),
                "{path}"
            );
            assert_eq!(r.canonical, t.base.join("b/f"));
            assert!(r.leaf.is_some());
        }
        // A missing tail is kept as spelled, below the anchor it lands in.
        let r = t.resolve("a/abs/new/deeper").unwrap();
        assert_eq!((r.anchor, r.missing), (1, 2));
        assert_eq!(r.canonical, t.base.join("b/new/deeper"));
    }

    #[test]
    fn outside_stays_outside_unless_a_link_on_the_way_leads_back_in() {
        let t = Tree::new();
        std::fs::write(t.base.join("out/secret"), "s").unwrap();
        std::fs::write(t.base.join("a/f"), "f").unwrap();
        symlink(t.base.join("out"), t.base.join("a/leave")).unwrap();
        symlink("../a", t.base.join("out/back")).unwrap();
        assert_eq!(
            t.resolve("a/leave/secret").unwrap_err(),
            Unresolved::Outside
        );
        assert_eq!(t.resolve("out/secret").unwrap_err(), Unresolved::Outside);
        assert_eq!(t.resolve("out/missing/x").unwrap_err(), Unresolved::Outside);
        let r = t.resolve("a/leave/back/f").unwrap();
        assert_eq!((r.anchor, r.canonical.clone()), (0, t.base.join("a/f")));
        // /proc is never entered on the way.
        let r = resolve(&t.anchors(), Path::new("/proc/self/cwd"), &mut 0);
        assert_eq!(r.unwrap_err(), Unresolved::Outside);
    }

    #[test]
    fn forty_hops_resolve_and_the_forty_first_is_a_loop() {
        let t = Tree::new();
        for i in 0..40 {
            symlink(format!("l{}", i + 1), t.base.join(format!("a/l{i}"))).unwrap();
        }
        // l0 -> l1 -> ... -> l39 -> l40 (missing): 40 hops, dangling at the end.
        let r = t.resolve("a/l0").unwrap();
        assert_eq!((r.comps, r.missing), (vec!["l40".to_string()], 1));
        symlink("l41", t.base.join("a/l40")).unwrap();
        assert_eq!(t.resolve("a/l0").unwrap_err(), Unresolved::Os(Errno::LOOP));
        symlink("self", t.base.join("a/self")).unwrap();
        assert_eq!(
            t.resolve("a/self/x").unwrap_err(),
            Unresolved::Os(Errno::LOOP)
        );
    }
}
