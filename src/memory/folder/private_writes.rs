//! The mount's own writes, trusted into the stat cache. The mount writes
//! every file before the agent's first tool call: it keeps each file's stat
//! and hash, and once a probe file shows them older than the file system's
//! clock tick they are cached, so the first scan reads nothing back.

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use sha2::{Digest, Sha256};

use super::paths::components;
use super::stat::stat_key;
use super::{FILE_MODE, Folder, FolderError};

impl Folder {
    /// [`Folder::put`] by a writer that vouches nothing else writes below
    /// the root until it calls [`Folder::trust_private_writes`] — the mount,
    /// which runs before the agent's first tool call. The file's stat and
    /// hash are kept so the first scan need not read it back.
    pub(crate) fn put_private(&self, rel: &str, data: &[u8]) -> Result<(), FolderError> {
        let (dir, leaf) = self.write_atomic(rel, data)?;
        // Stat after the rename, which moves the file's ctime.
        if let Ok(st) = rustix::fs::statat(&dir, leaf.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            && FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
        {
            let key = components(rel)?.join("/");
            let sha = hex::encode(Sha256::digest(data));
            self.private_writes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, (st.st_dev, stat_key(&st), sha));
        }
        Ok(())
    }

    /// Move the private writes made so far into the stat cache — each one
    /// whose timestamps are older than a probe file created now on the same
    /// file system. A later write to such a file gets a timestamp at least
    /// the probe's, so it cannot keep the cached stat; a write in the probe's
    /// clock tick could, which is why files of that tick are left out (they
    /// are hashed by the next scan). Comparing with the file system's own
    /// clock holds for any timestamp granularity and any clock skew between
    /// this host and a network file system. Returns how many were trusted.
    pub(crate) fn trust_private_writes(&self) -> Result<usize, FolderError> {
        let writes = std::mem::take(
            &mut *self
                .private_writes
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        if writes.is_empty() {
            return Ok(0);
        }
        let root = self.require_root()?;
        let probe_name = format!(".fs-{}.probe", hex::encode(rand::random::<[u8; 8]>()));
        let probe = rustix::fs::openat(
            &root,
            probe_name.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(FILE_MODE),
        )
        .map_err(|e| FolderError::io(&probe_name, e))?;
        let probe_stat = rustix::fs::fstat(&probe);
        drop(probe);
        let _ = rustix::fs::unlinkat(&root, probe_name.as_str(), AtFlags::empty());
        let probe_stat = probe_stat.map_err(|e| FolderError::io(&probe_name, e))?;
        let probe_key = stat_key(&probe_stat);
        let now = probe_key.mtime_ns.min(probe_key.ctime_ns);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let mut trusted = 0;
        for (rel, (dev, key, sha)) in writes {
            if dev == probe_stat.st_dev && key.mtime_ns.max(key.ctime_ns) < now {
                cache.insert(rel, (key, sha, 0));
                trusted += 1;
            }
        }
        Ok(trusted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::folder::stat::now_ns;
    use crate::memory::folder::tests::folder;
    use std::time::Duration;

    #[test]
    fn private_writes_are_trusted_only_when_older_than_the_probe() {
        let (_t, f) = folder();
        f.put_private("d/a.md", b"v1").unwrap();
        f.put_private("b.md", b"b1").unwrap();
        f.put("plain.md", b"p").unwrap();
        // Pretend `b.md` was written in the probe's clock tick (or later):
        // its stat could survive a rewrite, so it must not be trusted.
        f.private_writes
            .lock()
            .unwrap()
            .get_mut("b.md")
            .unwrap()
            .1
            .ctime_ns = now_ns() + 60_000_000_000;
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(f.trust_private_writes().unwrap(), 1);
        {
            let cache = f.cache.lock().unwrap();
            assert_eq!(
                cache.get("d/a.md").map(|(_, sha, _)| sha.as_str()),
                Some(hex::encode(Sha256::digest(b"v1")).as_str())
            );
            assert!(!cache.contains_key("b.md"), "written in the probe's tick");
            assert!(
                !cache.contains_key("plain.md"),
                "a plain put vouches nothing"
            );
        }
        assert!(f.private_writes.lock().unwrap().is_empty());
        // The probe is gone; the scan sees exactly the three files.
        let scan = f.scan().unwrap();
        assert_eq!(
            scan.files.keys().collect::<Vec<_>>(),
            ["b.md", "d/a.md", "plain.md"]
        );
        // A same-size rewrite right after is seen: its timestamps are at
        // least the probe's, so the cached stat no longer matches.
        std::fs::write(f.root().join("d/a.md"), b"v2").unwrap();
        assert_eq!(
            f.scan().unwrap().files["d/a.md"],
            hex::encode(Sha256::digest(b"v2"))
        );
    }
}
