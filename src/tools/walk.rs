//! What the directory walks of `glob` and `grep` share: their bounds, the
//! directories they skip, and how a directory's entries are read.

use std::ffi::CString;
use std::os::fd::OwnedFd;

use rustix::fs::Stat;

/// Entries a walk examines at most.
pub(crate) const WALK_MAX_ENTRIES: usize = 50_000;

/// Directories no walk enters, as the reference skips them.
pub(crate) const SKIPPED_DIRS: [&[u8]; 2] = [b".git", b"node_modules"];

/// Deepest directory a walk enters, counted from the search root. The
/// agent can nest directories without limit; each level entered holds one
/// descriptor (shared by its pending subdirectories) and its path, so the
/// cap bounds both: at most this many descriptors and this many paths at
/// once. Deeper entries are skipped, as those past [`WALK_MAX_ENTRIES`] are.
pub(crate) const WALK_MAX_DEPTH: usize = 256;

/// A file's modification time in nanoseconds (`glob` sorts by it).
pub(crate) fn mtime_ns(st: &Stat) -> i128 {
    st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128
}

/// The names in the directory `fd`, `.` and `..` left out, sorted (a walk
/// answers in name order); `None` when it cannot be read.
pub(crate) fn sorted_names(fd: &OwnedFd) -> Option<Vec<CString>> {
    let entries = rustix::fs::Dir::read_from(fd).ok()?;
    let mut names: Vec<CString> = entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_owned())
        .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
        .collect();
    names.sort();
    Some(names)
}
