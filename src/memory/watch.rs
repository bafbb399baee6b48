//! The kernel's account of what changed in a store folder (inotify), so a
//! sync examines only the paths reported since the last one instead of
//! stat-ing every file.
//!
//! Built on `rustix::fs::inotify` (rustix is already a dependency; the
//! `notify` crate brings a thread and a channel per watcher, and the
//! `inotify` crate's stream is not needed: a sync drains the non-blocking
//! descriptor in one go, on the blocking thread that examines the paths;
//! the push task sleeps on a duplicate of it, see `memory::push`).
//!
//! Watches are added by descriptor, never by path: each directory is opened
//! beneath the root with `O_NOFOLLOW | O_DIRECTORY` (the folder's confined
//! walk) and watched through `/proc/self/fd/N`, which names exactly that
//! directory — a symlink the agent swaps in can never redirect a watch. The
//! watch on a directory is added before the directory is listed, so a file
//! created after the listing is reported, and one created before it is
//! listed.
//!
//! Anything the event stream cannot answer exactly makes the next pass a
//! full scan, never a guess ([`Watch::full`]; the safety cadence is [`super::observe::FULL_SCAN_EVERY`]): the kernel's queue overflowed
//! (`IN_Q_OVERFLOW`), more paths changed than the watch keeps (the agent can
//! flood; [`DEFAULT_EVENT_BOUND`]), a watch could not be added (`ENOSPC`
//! under `max_user_watches`, `EACCES`), a watched directory was removed,
//! moved or replaced (`IN_DELETE_SELF`, `IN_MOVE_SELF`, `IN_IGNORED`), or a
//! directory was renamed into, out of or within the tree. A file renamed
//! reports both its names, each examined (the old one is then a local
//! delete, corroborated like any other).
//!
//! Nothing here waits (the descriptor is non-blocking), but reading events
//! costs what the agent makes it cost: callers run it on a blocking thread.
//! What a pass does with the reported paths is [`super::observe`]'s.

use std::collections::{BTreeSet, HashMap};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd};

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;

/// The most changed paths a watch keeps between two passes; past it the
/// next pass is a full scan (which costs what today's every pass costs).
pub(crate) const DEFAULT_EVENT_BOUND: usize = 4096;

/// What a directory watch reports: a name created, deleted, renamed,
/// written or re-permissioned below it, and the directory itself going.
const MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::CLOSE_WRITE)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::ONLYDIR);

/// One store folder's inotify instance: the watched directories and what
/// they reported since the last pass took it.
#[derive(Debug)]
pub(crate) struct Watch {
    fd: OwnedFd,
    /// Watch descriptor → the directory's path relative to the root.
    dirs: HashMap<i32, String>,
    /// Paths reported changed (a file, or a directory to walk again).
    dirty: BTreeSet<String>,
    /// Why the next pass must be a full scan, once anything said so.
    full: Option<&'static str>,
    bound: usize,
}

impl Watch {
    /// A new instance watching nothing yet; `bound`: the most changed paths
    /// kept before a full scan is due instead.
    pub(crate) fn new(bound: usize) -> Result<Watch, Errno> {
        Ok(Watch {
            fd: inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)?,
            dirs: HashMap::new(),
            dirty: BTreeSet::new(),
            full: None,
            bound: bound.max(1),
        })
    }

    /// Watch the directory open at `dir` (opened beneath the root without
    /// following symlinks), known as `rel`. A watch that cannot be added
    /// makes the next pass a full scan.
    pub(crate) fn add(&mut self, rel: &str, dir: &OwnedFd) {
        // The magic link names the opened directory itself, whatever its
        // path has become: no IN_DONT_FOLLOW, which would watch the link.
        let path = format!("/proc/self/fd/{}", dir.as_raw_fd());
        match inotify::add_watch(&self.fd, path.as_str(), MASK) {
            Ok(wd) => {
                self.dirs.insert(wd, rel.to_string());
            }
            Err(_) => self.fall_back("a directory of the folder cannot be watched"),
        }
    }

    /// Why the next pass must scan the whole folder, if it must.
    pub(crate) fn full(&self) -> Option<&'static str> {
        self.full
    }

    /// The paths reported since the last call (sorted), after reading every
    /// event queued now.
    pub(crate) fn take_dirty(&mut self) -> BTreeSet<String> {
        self.drain();
        std::mem::take(&mut self.dirty)
    }

    /// A second descriptor of this inotify instance: readable when the
    /// kernel queues an event.
    pub(crate) fn duplicate_fd(&self) -> Option<OwnedFd> {
        self.fd.try_clone().ok()
    }

    /// The most changed paths kept before a full scan is due instead.
    pub(crate) fn set_bound(&mut self, bound: usize) {
        self.bound = bound.max(1);
    }

    /// Report `paths` again (the next pass examines them once more); past
    /// the bound, the next pass scans whole instead.
    pub(crate) fn report_again(&mut self, paths: Vec<String>) {
        if self.full.is_some() {
            return;
        }
        self.dirty.extend(paths);
        if self.dirty.len() > self.bound {
            self.fall_back("more paths changed than the watch keeps");
        }
    }

    /// How many paths were reported and not yet taken (after reading the
    /// queued events); `None` when the next pass must scan whole.
    pub(crate) fn pending(&mut self) -> Option<usize> {
        self.drain();
        match self.full {
            Some(_) => None,
            None => Some(self.dirty.len()),
        }
    }

    /// Make the next pass a full scan, and say why.
    pub(crate) fn fall_back(&mut self, why: &'static str) {
        self.full.get_or_insert(why);
        self.dirty.clear();
    }

    /// Nothing reported and nothing queued: the kernel holds no event
    /// (`FIONREAD`), none is read. Cheap on any thread, whatever the agent
    /// floods the queue with.
    pub(crate) fn is_quiet(&self) -> bool {
        self.full.is_none()
            && self.dirty.is_empty()
            && rustix::io::ioctl_fionread(&self.fd).is_ok_and(|queued| queued == 0)
    }

    /// Read every queued event (the descriptor never blocks).
    pub(crate) fn drain(&mut self) {
        let mut buf = [MaybeUninit::<u8>::uninit(); 16 * 1024];
        let Watch {
            fd,
            dirs,
            dirty,
            full,
            bound,
        } = self;
        let mut reader = inotify::Reader::new(&*fd, &mut buf);
        let mut why = None;
        // The agent writes while this reads: a drain that cannot catch up
        // stops, and the next pass scans the whole folder instead.
        let mut budget = bound.saturating_mul(4).max(64 * 1024);
        loop {
            if budget == 0 {
                why = Some("more events came than the watch reads in a pass");
                break;
            }
            budget -= 1;
            let event = match reader.next() {
                Ok(event) => event,
                Err(Errno::AGAIN) => break,
                Err(Errno::INTR) => continue,
                Err(_) => {
                    why = Some("the folder's events cannot be read");
                    break;
                }
            };
            match report(dirs, &event) {
                Report::Nothing => {}
                Report::FullScan(reason) => why = Some(reason),
                Report::Directory(dir) => {
                    dirty.insert(dir);
                }
                Report::Path(rel) => {
                    if why.is_some() || full.is_some() {
                        continue;
                    }
                    dirty.insert(rel);
                    if dirty.len() > *bound {
                        why = Some("more paths changed than the watch keeps");
                    }
                }
            }
        }
        if let Some(why) = why {
            full.get_or_insert(why);
            dirty.clear();
        }
    }
}

/// What one event asks of the next pass.
enum Report {
    /// Nothing to examine (a name that is not UTF-8).
    Nothing,
    /// A watched directory itself changed (its mode): walk it again.
    Directory(String),
    /// A path below a watched directory changed: examine it.
    Path(String),
    /// Only a full scan can answer it, for this reason.
    FullScan(&'static str),
}

/// Read one event of the watches `dirs` (watch descriptor → directory).
fn report(dirs: &HashMap<i32, String>, event: &inotify::Event<'_>) -> Report {
    let flags = event.events();
    if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
        return Report::FullScan("the kernel's event queue overflowed");
    }
    if flags.intersects(
        ReadFlags::IGNORED | ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF | ReadFlags::UNMOUNT,
    ) {
        return Report::FullScan("a watched directory was removed, moved or replaced");
    }
    let Some(dir) = dirs.get(&event.wd()) else {
        return Report::FullScan("an event came from an unknown watch");
    };
    let Some(name) = event.file_name() else {
        // The directory itself changed (its mode): walk it again.
        return if dir.is_empty() {
            Report::FullScan("the folder's root changed")
        } else {
            Report::Directory(dir.clone())
        };
    };
    // A name that is not UTF-8 is never a memory (a full scan
    // reports it); nothing below it is either.
    let Ok(name) = name.to_str() else {
        return Report::Nothing;
    };
    if flags.contains(ReadFlags::ISDIR)
        && flags.intersects(ReadFlags::MOVED_FROM | ReadFlags::MOVED_TO)
    {
        return Report::FullScan("a directory was renamed");
    }
    Report::Path(if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    })
}

/// A number never handed out before in this process (never 0): the
/// revisions of the folder views and of the remote indexes (a sync compares
/// them with the last quiet pass's, `AttachedStore::try_sync`), and the
/// stat cache's walk marks.
pub(crate) fn next_revision() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
