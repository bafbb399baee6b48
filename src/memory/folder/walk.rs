//! The walk of the folder's tree behind a scan. An explicit stack, never
//! recursion (the agent decides the depth), at most [`MAX_SCAN_DEPTH`]
//! levels (deeper is unreadable: unknown, never deleted); each directory
//! watched before it is listed; each regular file hashed unless the stat
//! cache holds it at its very stat; an entry that cannot be read listed as
//! unreadable, and the walk goes on with the rest.

use std::ffi::CStr;
use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, Dir, FileType, Mode, Stat};
use rustix::io::Errno;

use super::DIR_FLAGS;
use super::hash::hash_fresh;
use super::stat::{StatCache, stat_key};
use crate::memory::watch::{Watch, next_revision};

/// One scan's walk: the stat cache it reads and marks.
pub(super) struct Walk<'w> {
    pub(super) start: i128,
    /// Each directory listed is watched first, when there is a watch.
    pub(super) watch: Option<&'w mut Watch>,
    /// Entries stat-ed (files and directories): what the walk cost.
    pub(super) examined: usize,
    pub(super) cache: StatCache,
    /// This walk's mark in the cache (a fresh [`next_revision`], never 0).
    pub(super) walk: u64,
    /// The files seen, in directory order; sorted into the scan at the end.
    pub(super) files: Vec<(String, String)>,
    pub(super) unrepresentable: Vec<String>,
    pub(super) unreadable: Vec<String>,
}

/// Deepest directory a scan enters, counted from the root (whose entries
/// are at depth 1). The agent can nest directories without limit; the scan
/// holds one descriptor and the remaining names per level it is inside, so
/// the cap bounds its descriptors (at most this many, well under the usual
/// 1,024) and, with the explicit stack, rules out any stack overflow. A
/// directory deeper than the cap is listed in
/// [`Scan::unreadable`](super::Scan::unreadable): what it holds is unknown
/// (warned once), never read as deleted.
pub(crate) const MAX_SCAN_DEPTH: usize = 128;

/// A directory a scan is inside: its fd (`None`: the root), its path and
/// depth, and the names still to visit in it.
struct Frame {
    fd: Option<OwnedFd>,
    prefix: String,
    depth: usize,
    names: std::vec::IntoIter<std::ffi::CString>,
}

impl<'w> Walk<'w> {
    /// A walk that reads and marks `cache` (a fresh mark), watching each
    /// directory it lists when `watch` is given; `files` is where the files
    /// it sees go.
    pub(super) fn new(
        start: i128,
        watch: Option<&'w mut Watch>,
        cache: StatCache,
        files: Vec<(String, String)>,
    ) -> Walk<'w> {
        Walk {
            start,
            watch,
            examined: 0,
            files,
            unrepresentable: Vec::new(),
            unreadable: Vec::new(),
            cache,
            walk: next_revision(),
        }
    }

    /// Walk the tree below `root` with an explicit stack (never recursion:
    /// the agent decides the depth). An entry that cannot be read is listed
    /// in `unreadable` and skipped; the walk goes on with the rest.
    pub(super) fn tree(&mut self, root: &OwnedFd) {
        let mut stack: Vec<Frame> = Vec::new();
        self.descend(&mut stack, root, None, String::new(), 0);
        self.run(root, stack);
    }

    /// Walk the tree below the directory `sub` (at `rel`, `depth` levels
    /// below `root`), as [`tree`](Self::tree) walks the root's.
    pub(super) fn subtree(&mut self, root: &OwnedFd, sub: OwnedFd, rel: String, depth: usize) {
        let mut stack: Vec<Frame> = Vec::new();
        self.descend(&mut stack, root, Some(sub), rel, depth);
        self.run(root, stack);
    }

    /// List the directory `fd` (`None`: the root) and stack it to be walked.
    fn descend(
        &mut self,
        stack: &mut Vec<Frame>,
        root: &OwnedFd,
        fd: Option<OwnedFd>,
        prefix: String,
        depth: usize,
    ) {
        if let Some(names) = self.list(fd.as_ref().unwrap_or(root), &prefix) {
            stack.push(Frame {
                fd,
                prefix,
                depth,
                names,
            });
        }
    }

    fn run(&mut self, root: &OwnedFd, mut stack: Vec<Frame>) {
        while let Some(frame) = stack.last_mut() {
            let Some(name) = frame.names.next() else {
                stack.pop();
                continue;
            };
            let depth = frame.depth + 1;
            let dir = frame.fd.as_ref().unwrap_or(root);
            let Some((sub, rel)) = self.entry(dir, &frame.prefix, depth, &name) else {
                continue;
            };
            self.descend(&mut stack, root, Some(sub), rel, depth);
        }
    }

    /// The names in `dir` (at `prefix`), its descriptor's duplicate closed
    /// again at once; `None` (and `prefix` unreadable) when it cannot be
    /// listed. A listing cut short by an error keeps what it read, and the
    /// directory is unreadable all the same.
    fn list(
        &mut self,
        dir: &OwnedFd,
        prefix: &str,
    ) -> Option<std::vec::IntoIter<std::ffi::CString>> {
        // Watched before it is listed: a name added after the listing is
        // reported, one added before it is listed.
        if let Some(watch) = self.watch.as_deref_mut() {
            watch.add(prefix, dir);
        }
        let Ok(entries) = Dir::read_from(dir) else {
            self.unreadable.push(prefix.to_string());
            return None;
        };
        let mut names = Vec::new();
        for entry in entries {
            let Ok(entry) = entry else {
                self.unreadable.push(prefix.to_string());
                break;
            };
            let bytes = entry.file_name().to_bytes();
            if bytes != b"." && bytes != b".." {
                names.push(entry.file_name().to_owned());
            }
        }
        Some(names.into_iter())
    }

    /// Visit the entry `raw` of `dir` (at `prefix`, the entry at `depth`):
    /// a file is hashed into the scan; a directory is opened and returned
    /// with its path, to be walked, unless it lies deeper than
    /// [`MAX_SCAN_DEPTH`] (then it is unreadable).
    pub(super) fn entry(
        &mut self,
        dir: &OwnedFd,
        prefix: &str,
        depth: usize,
        raw: &CStr,
    ) -> Option<(OwnedFd, String)> {
        let bytes = raw.to_bytes();
        let Ok(name) = std::str::from_utf8(bytes) else {
            self.unrepresentable
                .push(joined(prefix, &String::from_utf8_lossy(bytes)));
            return None;
        };
        let rel = joined(prefix, name);
        self.examined += 1;
        let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return None, // a scan is a snapshot, not a lock
            Err(_) => {
                self.unreadable.push(rel);
                return None;
            }
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => self.directory(dir, name, rel, depth),
            FileType::RegularFile => {
                self.file(dir, name, rel, &st);
                None
            }
            // Symlinks, FIFOs, sockets, devices: never opened, never synced.
            _ => None,
        }
    }

    /// The directory `name` of `dir` (at `rel`, `depth`), opened to be
    /// walked; `None` when it is gone, or too deep or unopenable (then it
    /// is unreadable).
    fn directory(
        &mut self,
        dir: &OwnedFd,
        name: &str,
        rel: String,
        depth: usize,
    ) -> Option<(OwnedFd, String)> {
        if depth > MAX_SCAN_DEPTH {
            self.unreadable.push(rel);
            return None;
        }
        // A mount of /proc or /sys below the root is never scanned.
        match rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty())
            .and_then(crate::fsx::refuse_pseudo_fs)
        {
            Ok(fd) => Some((fd, rel)),
            Err(Errno::NOENT) | Err(Errno::LOOP) | Err(Errno::NOTDIR) => None,
            Err(_) => {
                self.unreadable.push(rel);
                None
            }
        }
    }

    /// The regular file `name` of `dir` (at `rel`, stat-ed as `st`) into
    /// the scan: its hash from the cache when its stat is unchanged, else
    /// read (and cached when its stat may be trusted).
    fn file(&mut self, dir: &OwnedFd, name: &str, rel: String, st: &Stat) {
        crate::killpoint::hit("memory.scan.file");
        if let Some(sha) = self.cached(&rel, st) {
            self.files.push((rel, sha));
            return;
        }
        let hashed = match hash_fresh(dir, name, self.start) {
            Ok(hashed) => hashed,
            Err(_) => {
                self.unreadable.push(rel);
                return;
            }
        };
        if let Some((sha, cacheable)) = hashed {
            if let Some(stat) = cacheable {
                self.cache
                    .insert(rel.clone(), (stat, sha.clone(), self.walk));
            }
            self.files.push((rel, sha));
        }
    }

    /// The hash the cache holds for `rel` at the stat `st`, marked as seen
    /// by this walk; an entry of another stat is stale, and goes.
    fn cached(&mut self, rel: &str, st: &Stat) -> Option<String> {
        match self.cache.get_mut(rel) {
            Some((stat, sha, seen)) if *stat == stat_key(st) => {
                *seen = self.walk;
                Some(sha.clone())
            }
            Some(_) => {
                self.cache.remove(rel);
                None
            }
            None => None,
        }
    }
}

/// `name`'s path in the directory at `prefix` (`""`: the root).
fn joined(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        let mut rel = String::with_capacity(prefix.len() + 1 + name.len());
        rel.push_str(prefix);
        rel.push('/');
        rel.push_str(name);
        rel
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::folder::tests::folder;
    use rustix::fs::OFlags;

    #[test]
    fn names_that_are_not_utf8_are_reported_not_synced() {
        use std::os::unix::ffi::OsStrExt;
        let (_t, f) = folder();
        let name = std::ffi::OsStr::from_bytes(b"caf\xe9.md");
        std::fs::write(f.root().join(name), "x").unwrap();
        let scan = f.scan().unwrap();
        assert!(scan.files.is_empty());
        assert_eq!(scan.unrepresentable, vec!["caf\u{fffd}.md"]);
    }

    /// A chain past [`MAX_SCAN_DEPTH`] (with a file beside every level and
    /// a wide level in the middle): the scan stops at the cap and lists the
    /// deeper directory as unreadable (so nothing below it reads as
    /// deleted); dispose removes it all, bottom-up, holding one directory's
    /// descriptor at a time.
    #[test]
    fn a_chain_deeper_than_the_cap_is_unknown_and_still_removed() {
        let (_t, f) = folder();
        let depth = MAX_SCAN_DEPTH + 50;
        let mut dir = rustix::fs::open(f.root(), DIR_FLAGS, Mode::empty()).unwrap();
        for level in 0..depth {
            let file = rustix::fs::openat(
                &dir,
                "f.md",
                OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .unwrap();
            rustix::io::write(&file, b"f").unwrap();
            if level == 3 {
                for i in 0..20 {
                    rustix::fs::mkdirat(&dir, format!("w{i}"), Mode::from_raw_mode(0o700)).unwrap();
                }
            }
            rustix::fs::mkdirat(&dir, "d", Mode::from_raw_mode(0o700)).unwrap();
            dir = rustix::fs::openat(&dir, "d", DIR_FLAGS, Mode::empty()).unwrap();
        }
        drop(dir);
        let scan = f.scan().unwrap();
        let capped = vec!["d"; MAX_SCAN_DEPTH + 1].join("/");
        assert_eq!(scan.unreadable, std::slice::from_ref(&capped));
        assert_eq!(
            scan.files.len(),
            MAX_SCAN_DEPTH + 1,
            "f.md at every level walked"
        );
        assert!(scan.is_unknown(&format!("{capped}/f.md")));
        f.dispose().unwrap();
        assert!(!f.root().exists());
    }
}
