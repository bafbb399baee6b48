//! What the stat cache keys on. A file is hashed again only when its stat
//! changes — (mtime, ctime, size, inode) — and its stat is trusted only
//! once its newest timestamp is older than a margin before the scan, so a
//! coarse timestamp cannot hide a rewrite.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use foldhash::HashMap;

/// A file younger than this (by mtime or ctime) is re-hashed on every scan.
pub(super) const TIMESTAMP_TRUST_MARGIN: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct StatKey {
    pub(super) mtime_ns: i128,
    pub(super) ctime_ns: i128,
    pub(super) size: i64,
    pub(super) ino: u64,
}

pub(super) fn stat_key(st: &rustix::fs::Stat) -> StatKey {
    StatKey {
        mtime_ns: st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128,
        ctime_ns: st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128,
        size: st.st_size,
        ino: st.st_ino,
    }
}

pub(super) fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or_default()
}

/// Path → (stat, hash, the number of the last scan that saw the file; 0:
/// none yet). Entries are marked where they are, not moved between maps:
/// a full scan then drops those it did not mark.
pub(super) type StatCache = HashMap<String, (StatKey, String, u64)>;
