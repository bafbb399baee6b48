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
//! [`refuse_pseudo_fs`] checks what was opened, and every open here refuses
//! procfs, sysfs and their kin with `EXDEV`.
//!
//! Which of the two runs is a process-wide switch: cleared the first time
//! the kernel (or a seccomp filter) answers `ENOSYS`/`EPERM`, and settable
//! with [`use_openat2`] so tests exercise the walk on kernels that have
//! `openat2`.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
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

/// Remove `name` in `parent` and everything below it, by fd: each directory
/// opened `O_NOFOLLOW` from its parent, entries unlinked by name in that
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
    empty_dir(&dir, 0)?;
    match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Deepest directory nesting [`remove_tree_at`] descends (one fd per level).
const MAX_REMOVE_DEPTH: usize = 256;

fn empty_dir(dir: &OwnedFd, depth: usize) -> Result<(), Errno> {
    if depth > MAX_REMOVE_DEPTH {
        return Err(Errno::NAMETOOLONG);
    }
    let names: Vec<std::ffi::CString> = rustix::fs::Dir::read_from(dir)?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_owned())
        .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
        .collect();
    for name in names {
        match rustix::fs::unlinkat(dir, name.as_c_str(), AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => continue,
            Err(Errno::ISDIR) | Err(Errno::PERM) => {}
            Err(e) => return Err(e),
        }
        let sub = match rustix::fs::openat(dir, name.as_c_str(), DIR_FLAGS, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(e),
        };
        empty_dir(&sub, depth + 1)?;
        match rustix::fs::unlinkat(dir, name.as_c_str(), AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
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
