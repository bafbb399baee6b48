//! Opening files beneath a directory fd without ever following a symlink.
//!
//! The agent shares the filesystem with the worker and can rename, symlink
//! and exchange entries while the worker works, so a path checked and then
//! opened by name can lead anywhere. Everything the worker opens inside an
//! agent-reachable tree is therefore resolved *from a directory fd* opened
//! earlier: `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS` where the kernel has it (Linux 5.6+), else a walk
//! that opens each component with `openat(O_NOFOLLOW | O_DIRECTORY)` from its
//! parent's fd. Both refuse a symlink at any component with `ELOOP` and can
//! never climb above the starting directory (callers refuse `..` first).
//!
//! Neither can see a *mount point* on the way: a root that is itself in a
//! kernel pseudo-filesystem (a store folder replaced by a symlink to
//! `/proc/self` before the worker opened it), or a root such as `/` that has
//! `/proc` below it, would hand the worker's own `/proc/<pid>/environ` to the
//! agent: a process may always read its own, non-dumpable or not. So
//! `refuse_pseudo_fs` checks what was opened, and every open here refuses
//! procfs, sysfs and their kin with `EXDEV`.
//!
//! Which of the two runs is a process-wide switch: cleared the first time
//! the kernel (or a seccomp filter) answers `ENOSYS`/`EPERM`, and settable
//! with [`use_openat2`] so tests exercise the walk on kernels that have
//! `openat2`.

use std::ffi::CStr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Flags of a directory opened to walk through: never a symlink in its place.
pub(crate) const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Whether `openat2` is tried; cleared the first time the kernel says it
/// does not have it.
static OPENAT2: AtomicBool = AtomicBool::new(true);

/// How often an `openat2` that answered `EAGAIN` (a rename raced the
/// lookup) is retried before the walk is used for that call.
const OPENAT2_RETRIES: usize = 8;

/// Use `openat2` (`true`, the default) or the per-component walk (`false`)
/// from now on, process-wide. With `true` on a kernel without `openat2` the
/// first call falls back and clears the switch again.
pub fn use_openat2(on: bool) {
    OPENAT2.store(on, Ordering::Relaxed);
}

/// Whether opens currently go through `openat2` (probing the kernel once if
/// nothing has called it yet).
pub fn openat2_in_use() -> bool {
    if OPENAT2.load(Ordering::Relaxed) {
        let probe = rustix::fs::openat2(
            rustix::fs::CWD,
            ".",
            DIR_FLAGS,
            Mode::empty(),
            ResolveFlags::BENEATH,
        );
        if let Err(Errno::NOSYS | Errno::PERM) = probe {
            OPENAT2.store(false, Ordering::Relaxed);
        }
    }
    OPENAT2.load(Ordering::Relaxed)
}

/// Open `comps` (plain names: no `/`, no `..`, no empty or `.` entry) beneath
/// `dirfd` without following any symlink on the way or at the leaf. No
/// components opens `dirfd` itself again with `flags`. A symlink anywhere
/// answers `ELOOP`.
pub(crate) fn open_beneath<Fd: AsFd>(
    dirfd: Fd,
    comps: &[&str],
    flags: OFlags,
) -> Result<OwnedFd, Errno> {
    let dirfd = dirfd.as_fd();
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    if comps.is_empty() {
        return rustix::fs::openat(dirfd, ".", flags, Mode::empty()).and_then(refuse_pseudo_fs);
    }
    if comps
        .iter()
        .any(|c| c.is_empty() || *c == "." || *c == ".." || c.contains('/'))
    {
        return Err(Errno::INVAL);
    }
    beneath(dirfd, comps, flags).and_then(refuse_pseudo_fs)
}

fn beneath(
    dirfd: std::os::fd::BorrowedFd<'_>,
    comps: &[&str],
    flags: OFlags,
) -> Result<OwnedFd, Errno> {
    if OPENAT2.load(Ordering::Relaxed) {
        let joined = comps.join("/");
        for _ in 0..OPENAT2_RETRIES {
            match rustix::fs::openat2(
                dirfd,
                joined.as_str(),
                flags,
                Mode::empty(),
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
            ) {
                Err(Errno::AGAIN) => continue,
                Err(Errno::NOSYS) | Err(Errno::PERM) => {
                    OPENAT2.store(false, Ordering::Relaxed);
                    break;
                }
                other => return other,
            }
        }
    }
    walk(dirfd, comps, flags)
}

/// The fallback: each directory opened `O_NOFOLLOW | O_DIRECTORY` from its
/// parent's fd, then the leaf with `O_NOFOLLOW`.
fn walk(
    dirfd: std::os::fd::BorrowedFd<'_>,
    comps: &[&str],
    flags: OFlags,
) -> Result<OwnedFd, Errno> {
    let (last, dirs) = comps.split_last().ok_or(Errno::INVAL)?;
    let mut current: Option<OwnedFd> = None;
    for dir in dirs {
        let next = {
            let parent = current.as_ref().map_or(dirfd, |fd| fd.as_fd());
            open_dir_at(parent, dir)?
        };
        current = Some(next);
    }
    let parent = current.as_ref().map_or(dirfd, |fd| fd.as_fd());
    rustix::fs::openat(parent, *last, flags, Mode::empty())
        .map_err(|e| symlink_errno(parent, last, e))
}

/// Open the directory `name` in `parent`, never through a symlink: a
/// symlink answers `ELOOP` (whatever `O_DIRECTORY` said first), a directory
/// of a pseudo-filesystem `EXDEV`.
pub(crate) fn open_dir_at<Fd: AsFd>(parent: Fd, name: &str) -> Result<OwnedFd, Errno> {
    let parent = parent.as_fd();
    rustix::fs::openat(parent, name, DIR_FLAGS, Mode::empty())
        .map_err(|e| symlink_errno(parent, name, e))
        .and_then(refuse_pseudo_fs)
}

/// Filesystems whose files describe the kernel and its processes rather
/// than hold anyone's data (`statfs(2)`'s magic numbers): procfs, sysfs,
/// debugfs, tracefs, securityfs, bpffs, cgroup v1 and v2.
const PSEUDO_FS: [u64; 8] = [
    0x9fa0,      // PROC_SUPER_MAGIC
    0x6265_6572, // SYSFS_MAGIC
    0x6462_6720, // DEBUGFS_MAGIC
    0x7472_6163, // TRACEFS_MAGIC
    0x7363_6673, // SECURITYFS_MAGIC
    0xcafe_4a11, // BPF_FS_MAGIC
    0x0027_e0eb, // CGROUP_SUPER_MAGIC
    0x6367_7270, // CGROUP2_SUPER_MAGIC
];

/// Filesystems held in memory (`statfs(2)`'s magic numbers), where `fsync`
/// returns at once: tmpfs, ramfs.
const MEMORY_FS: [u64; 2] = [
    0x0102_1994, // TMPFS_MAGIC
    0x8584_58f6, // RAMFS_MAGIC
];

/// Whether `fd` lies in a filesystem held in memory ([`MEMORY_FS`]).
pub(crate) fn memory_backed<Fd: AsFd>(fd: Fd) -> bool {
    #[allow(clippy::unnecessary_cast)] // `f_type`'s width differs by target
    rustix::fs::fstatfs(fd).is_ok_and(|fs| MEMORY_FS.contains(&(fs.f_type as u64)))
}

/// `fd` itself, unless it lies in a kernel pseudo-filesystem ([`PSEUDO_FS`]):
/// then `EXDEV`. Nothing the worker syncs or the file tools serve lives
/// there, and `/proc/<worker pid>/` holds the worker's environment.
pub(crate) fn refuse_pseudo_fs(fd: OwnedFd) -> Result<OwnedFd, Errno> {
    let fs = rustix::fs::fstatfs(&fd)?;
    #[allow(clippy::unnecessary_cast)] // `f_type`'s width differs by target
    if PSEUDO_FS.contains(&(fs.f_type as u64)) {
        return Err(Errno::XDEV);
    }
    Ok(fd)
}

/// What a name in a directory is, as [`lookup_at`] found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Dir,
    Symlink,
    /// A regular file, a FIFO, a device, a socket.
    Other,
}

/// Open `name` in `parent` as an `O_PATH` descriptor that never follows it
/// (`O_PATH | O_NOFOLLOW`: a symlink yields the link itself, and nothing is
/// read, opened for I/O or blocked on), with what it is. A directory of a
/// kernel pseudo-filesystem answers `EXDEV` ([`refuse_pseudo_fs`]). The
/// building block of a resolution that follows symlinks by reading them
/// ([`link_target`]) and re-anchoring, never by letting the kernel follow
/// a name.
pub(crate) fn lookup_at<Fd: AsFd>(parent: Fd, name: &str) -> Result<(OwnedFd, Kind), Errno> {
    let fd = rustix::fs::openat(
        parent,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&fd)?;
    Ok(match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => (refuse_pseudo_fs(fd)?, Kind::Dir),
        FileType::Symlink => (fd, Kind::Symlink),
        _ => (fd, Kind::Other),
    })
}

/// The target of the symlink `link` (an `O_PATH | O_NOFOLLOW` descriptor
/// of the link itself, from [`lookup_at`]), read from that very inode:
/// `readlinkat(link, "")`, never by name.
pub(crate) fn link_target<Fd: AsFd>(link: Fd) -> Result<std::ffi::OsString, Errno> {
    use std::os::unix::ffi::OsStringExt;
    let target = rustix::fs::readlinkat(link, c"", Vec::new())?;
    Ok(std::ffi::OsString::from_vec(target.into_bytes()))
}

/// The directory an `O_PATH` descriptor names, opened for reading its
/// entries: `openat(dir, ".")`, the same inode whatever its name is now.
pub(crate) fn reopen_dir<Fd: AsFd>(dir: Fd) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(dir, c".", DIR_FLAGS, Mode::empty()).and_then(refuse_pseudo_fs)
}

/// `ENOTDIR` from a no-follow open of a symlink reads as `ELOOP`, so every
/// caller tells "a symlink is in the way" from "a file is in the way".
fn symlink_errno(parent: std::os::fd::BorrowedFd<'_>, name: &str, e: Errno) -> Errno {
    if e != Errno::NOTDIR {
        return e;
    }
    match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => Errno::LOOP,
        _ => e,
    }
}

/// The (device, inode) of an open fd: the identity a path is compared with.
pub(crate) fn identity<Fd: AsFd>(fd: Fd) -> Result<(u64, u64), Errno> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// Remove `name` in `parent` and everything below it, by fd, at any depth
/// ([`remove_below`]): each directory opened `O_NOFOLLOW` from its parent, entries unlinked by name in that
/// fd, symlinks removed (never followed). `Ok` when `name` is already gone.
pub(crate) fn remove_tree_at<Fd: AsFd>(parent: Fd, name: &str) -> Result<(), Errno> {
    let parent = parent.as_fd();
    match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => return Ok(()),
        Err(Errno::ISDIR) | Err(Errno::PERM) => {}
        Err(e) => return Err(e),
    }
    let dir = match open_dir_at(parent, name) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e),
    };
    remove_below(&dir, name, 0o700).map_err(|(_, e)| e)?;
    match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e),
    }
}

/// How many times [`remove_below`] starts over after the agent moved a
/// directory it was emptying (see [`remove_pass`]).
const REMOVE_RESTARTS: usize = 8;

/// Remove everything below the directory `dir`, depth first, by fd, with
/// an explicit stack (never recursion) and a bounded number of descriptors
/// whatever the depth (see [`remove_pass`]). A subdirectory the agent made
/// unreadable or unwritable gets `dir_mode` (owner `rwx`) back first, through an `O_PATH`
/// descriptor of that very directory (chmod via `/proc/self/fd`), so a
/// name swapped for a symlink meanwhile is never followed.
pub(crate) fn remove_below(
    dir: &OwnedFd,
    shown: &str,
    dir_mode: u32,
) -> Result<(), (String, Errno)> {
    for _ in 0..REMOVE_RESTARTS {
        // Done when a pass ran through and nothing was added (or renamed
        // past its listing) meanwhile.
        if remove_pass(dir, shown, dir_mode)?
            && names_in(dir).map_err(|e| (shown.to_string(), e))?.len() == 0
        {
            return Ok(());
        }
    }
    Err((shown.to_string(), Errno::BUSY))
}

/// A directory [`remove_pass`] is inside, below the root: its name in its
/// parent, the parent's identity, and the parent's names still to remove.
struct Emptying {
    name: std::ffi::CString,
    parent: (u64, u64),
    rest: std::vec::IntoIter<std::ffi::CString>,
}

fn names_in(dir: &OwnedFd) -> Result<std::vec::IntoIter<std::ffi::CString>, Errno> {
    let mut names = Vec::new();
    for entry in Dir::read_from(dir)? {
        let entry = entry?;
        let bytes = entry.file_name().to_bytes();
        if bytes != b"." && bytes != b".." {
            names.push(entry.file_name().to_owned());
        }
    }
    Ok(names.into_iter())
}

/// One removal pass. Only the current directory's descriptor is held (plus
/// the root's): going back up opens `..` from it and checks that it is the
/// very directory it was entered from (device and inode), so no chain,
/// however deep, takes one descriptor per level. `Ok(false)` when a
/// directory was moved meanwhile (its `..` is another): the caller starts
/// over from the root.
fn remove_pass(root: &OwnedFd, shown: &str, dir_mode: u32) -> Result<bool, (String, Errno)> {
    let mut stack: Vec<Emptying> = Vec::new();
    let path = |stack: &[Emptying], name: &CStr| {
        let mut rel = shown.to_string();
        for level in stack {
            rel.push('/');
            rel.push_str(&level.name.to_string_lossy());
        }
        rel.push('/');
        rel.push_str(&name.to_string_lossy());
        rel
    };
    let mut cur: Option<OwnedFd> = None;
    let mut names = names_in(root).map_err(|e| (shown.to_string(), e))?;
    loop {
        let dir = cur.as_ref().unwrap_or(root);
        if let Some(name) = names.next() {
            let st = match rustix::fs::statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err((path(&stack, &name), e)),
            };
            if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                match rustix::fs::unlinkat(dir, name.as_c_str(), AtFlags::empty()) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(e) => return Err((path(&stack, &name), e)),
                }
                continue;
            }
            let fail = |e| (path(&stack, &name), e);
            let sub = match open_for_removal(dir, &name, dir_mode) {
                Ok(sub) => sub,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(fail(e)),
            };
            let parent = identity(dir).map_err(fail)?;
            let inside = names_in(&sub).map_err(fail)?;
            let rest = std::mem::replace(&mut names, inside);
            stack.push(Emptying { name, parent, rest });
            cur = Some(sub);
            continue;
        }
        // `dir` is empty now: back up to its parent and remove it there.
        let Some(done) = stack.pop() else {
            return Ok(true);
        };
        let sub = cur.take().expect("a directory below the root is held");
        let parent = if stack.is_empty() {
            None
        } else {
            let up = rustix::fs::openat(&sub, c"..", DIR_FLAGS, Mode::empty())
                .map_err(|e| (path(&stack, &done.name), e))?;
            if identity(&up).map_err(|e| (path(&stack, &done.name), e))? != done.parent {
                return Ok(false);
            }
            Some(up)
        };
        drop(sub);
        let up = parent.as_ref().unwrap_or(root);
        match rustix::fs::unlinkat(up, done.name.as_c_str(), AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err((path(&stack, &done.name), e)),
        }
        cur = parent;
        names = done.rest;
    }
}

/// Open the subdirectory `name` of `dir` for reading and removing its
/// entries, restoring `0700` on it when the agent took its permissions away.
fn open_for_removal(dir: &OwnedFd, name: &CStr, dir_mode: u32) -> Result<OwnedFd, Errno> {
    let path = rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&path)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Err(Errno::NOTDIR);
    }
    if st.st_mode & dir_mode == dir_mode {
        return rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty());
    }
    let by_proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&path));
    rustix::fs::chmod(by_proc.as_str(), Mode::from_raw_mode(dir_mode))?;
    // Re-open that same directory (the magic link names the inode, not
    // the name), now with the permissions to read it.
    rustix::fs::open(
        by_proc.as_str(),
        DIR_FLAGS.difference(OFlags::NOFOLLOW),
        Mode::empty(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn root(dir: &std::path::Path) -> OwnedFd {
        rustix::fs::openat(rustix::fs::CWD, dir, DIR_FLAGS, Mode::empty()).unwrap()
    }

    #[test]
    fn symlinks_are_refused_at_every_component_by_both_paths() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("in/real")).unwrap();
        std::fs::write(t.path().join("in/real/f"), "f").unwrap();
        std::fs::create_dir(t.path().join("out")).unwrap();
        std::fs::write(t.path().join("out/s"), "s").unwrap();
        symlink(t.path().join("out"), t.path().join("in/link")).unwrap();
        symlink("real/f", t.path().join("in/leaf")).unwrap();
        symlink("/proc/self", t.path().join("in/proc")).unwrap();
        let fd = root(&t.path().join("in"));
        // The walk, forced, and the kernel's own resolution (when present).
        for comps in [
            &["link", "s"][..],
            &["leaf"],
            &["proc", "environ"],
            &["link"],
        ] {
            assert_eq!(
                walk(fd.as_fd(), comps, OFlags::RDONLY | OFlags::NOFOLLOW).unwrap_err(),
                Errno::LOOP,
                "walk {comps:?}"
            );
            assert_eq!(
                open_beneath(&fd, comps, OFlags::RDONLY).unwrap_err(),
                Errno::LOOP,
                "open_beneath {comps:?}"
            );
        }
        assert!(open_beneath(&fd, &["real", "f"], OFlags::RDONLY).is_ok());
        assert!(walk(fd.as_fd(), &["real", "f"], OFlags::RDONLY).is_ok());
        assert_eq!(
            open_beneath(&fd, &["..", "out", "s"], OFlags::RDONLY).unwrap_err(),
            Errno::INVAL
        );
    }

    #[test]
    fn lookup_at_never_follows_and_link_target_reads_the_link_it_was_given() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::fs::write(t.path().join("f"), "f").unwrap();
        symlink("d", t.path().join("to-d")).unwrap();
        symlink("/proc/self", t.path().join("proc")).unwrap();
        let fd = root(t.path());
        assert_eq!(lookup_at(&fd, "d").unwrap().1, Kind::Dir);
        assert_eq!(lookup_at(&fd, "f").unwrap().1, Kind::Other);
        assert_eq!(lookup_at(&fd, "missing").unwrap_err(), Errno::NOENT);
        let (link, kind) = lookup_at(&fd, "to-d").unwrap();
        assert_eq!(kind, Kind::Symlink);
        // The link is replaced after it was looked up: what was read is the
        // inode looked up, not whatever the name holds now.
        std::fs::remove_file(t.path().join("to-d")).unwrap();
        symlink("/etc", t.path().join("to-d")).unwrap();
        assert_eq!(link_target(&link).unwrap(), "d");
        // `/proc/self` is a link like any other; its target is only text.
        let (proc, kind) = lookup_at(&fd, "proc").unwrap();
        assert_eq!(kind, Kind::Symlink);
        assert_eq!(link_target(&proc).unwrap(), "/proc/self");
        let root_fd = rustix::fs::open("/", DIR_FLAGS, Mode::empty()).unwrap();
        assert_eq!(lookup_at(&root_fd, "proc").unwrap_err(), Errno::XDEV);
        let (d, _) = lookup_at(&fd, "d").unwrap();
        std::fs::write(t.path().join("d/inside"), "i").unwrap();
        let dir = reopen_dir(&d).unwrap();
        assert_eq!(names_in(&dir).unwrap().count(), 1);
    }

    #[test]
    fn remove_tree_at_removes_a_chain_deeper_than_any_fd_budget() {
        // Skills cleanup shares the memory folder's remover: no recursion and
        // one descriptor at a time, so depth is no limit (it was 256).
        let tmp = tempfile::tempdir().unwrap();
        let top = rustix::fs::open(tmp.path(), DIR_FLAGS, Mode::empty()).unwrap();
        rustix::fs::mkdirat(&top, "tree", Mode::from_raw_mode(0o700)).unwrap();
        let mut cur = open_dir_at(&top, "tree").unwrap();
        for _ in 0..1_000 {
            rustix::fs::mkdirat(&cur, "d", Mode::from_raw_mode(0o700)).unwrap();
            cur = open_dir_at(&cur, "d").unwrap();
        }
        drop(cur);
        remove_tree_at(&top, "tree").unwrap();
        assert!(!tmp.path().join("tree").exists());
    }

    #[test]
    fn remove_tree_at_never_follows_a_symlink() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("in/tree/a/b")).unwrap();
        std::fs::write(t.path().join("in/tree/a/b/f"), "f").unwrap();
        std::fs::create_dir(t.path().join("out")).unwrap();
        std::fs::write(t.path().join("out/keep"), "k").unwrap();
        symlink(t.path().join("out"), t.path().join("in/tree/a/link")).unwrap();
        symlink(t.path().join("out"), t.path().join("in/swapped")).unwrap();
        let fd = root(&t.path().join("in"));
        remove_tree_at(&fd, "tree").unwrap();
        assert!(!t.path().join("in/tree").exists());
        // A symlink where the tree was is removed, not followed.
        remove_tree_at(&fd, "swapped").unwrap();
        assert!(t.path().join("out/keep").exists());
        remove_tree_at(&fd, "gone").unwrap();
    }
}
