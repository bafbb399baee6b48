//! One file hashed: opened without following a symlink and without
//! blocking on a FIFO, checked to be a regular file, read at most one byte
//! past [`MAX_FILE_BYTES`] through one buffer per thread (a file over it by
//! its stat is a stand-in, never read), and told whether its stat may be
//! cached.

use std::os::fd::OwnedFd;

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;
use sha2::{Digest, Sha256};

use super::size::{MAX_FILE_BYTES, stand_in};
use super::stat::{StatKey, TIMESTAMP_TRUST_MARGIN, stat_key};

thread_local! {
    /// One read buffer per (blocking) thread: hashing thousands of small
    /// files must not allocate and zero a buffer each time.
    static READ_BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; 64 * 1024]);
}

/// Hash an open regular file, reading at most [`MAX_FILE_BYTES`] + 1 bytes:
/// `None` when it holds more (it grew since its `fstat`).
fn hash_fd(fd: &OwnedFd) -> Result<Option<String>, Errno> {
    let mut hasher = Sha256::new();
    let within = READ_BUF.with_borrow_mut(|buf| {
        let mut total: u64 = 0;
        loop {
            let room = (MAX_FILE_BYTES + 1 - total).min(buf.len() as u64) as usize;
            let n = match rustix::io::read(fd, &mut buf[..room]) {
                Ok(n) => n,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Ok(true);
            }
            total += n as u64;
            if total > MAX_FILE_BYTES {
                return Ok(false);
            }
            hasher.update(&buf[..n]);
        }
    })?;
    Ok(within.then(|| hex::encode(hasher.finalize())))
}

/// Read and hash the regular file `name` in `dir`. Returns the hash and,
/// when the file may be cached, its stat: only a file whose newest timestamp
/// is older than the trust margin before `scan_start_ns`, so a coarse
/// timestamp cannot hide a rewrite. `Ok(None)` when it vanished or turned
/// into something else.
pub(super) fn hash_fresh(
    dir: &OwnedFd,
    name: &str,
    scan_start_ns: i128,
) -> Result<Option<(String, Option<StatKey>)>, Errno> {
    let fd = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) | Err(Errno::LOOP) => return Ok(None),
        Err(e) => return Err(e),
    };
    let fresh = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(fresh.st_mode) != FileType::RegularFile {
        return Ok(None);
    }
    // Too large by its stat: a stand-in, never a read.
    let (sha, exact) = if fresh.st_size as u64 > MAX_FILE_BYTES {
        (stand_in(&fresh), true)
    } else {
        match hash_fd(&fd)? {
            Some(sha) => (sha, true),
            // It grew past the limit while being read.
            None => (stand_in(&rustix::fs::fstat(&fd)?), false),
        }
    };
    let key = stat_key(&fresh);
    let newest = key.mtime_ns.max(key.ctime_ns);
    let trusted = exact && newest < scan_start_ns - TIMESTAMP_TRUST_MARGIN.as_nanos() as i128;
    Ok(Some((sha, trusted.then_some(key))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::folder::tests::folder;
    use std::io::Write;
    use std::time::Duration;

    #[test]
    fn the_stat_cache_skips_rereads_and_sees_rewrites() {
        let (_t, f) = folder();
        f.put("old.md", b"v1").unwrap();
        let path = f.root().join("old.md");
        // Only a file older than the trust margin (by mtime and ctime) is cached.
        f.scan().unwrap();
        assert!(
            !f.cache.lock().unwrap().contains_key("old.md"),
            "a fresh file is not cached"
        );
        std::thread::sleep(TIMESTAMP_TRUST_MARGIN + Duration::from_millis(100));
        let first = f.scan().unwrap();
        assert!(
            f.cache.lock().unwrap().contains_key("old.md"),
            "aged files are cached"
        );
        // A rewrite changes size or ctime, so it is re-hashed.
        std::fs::write(&path, "v2, longer").unwrap();
        let second = f.scan().unwrap();
        assert_ne!(first.files["old.md"], second.files["old.md"]);
        assert_eq!(
            second.files["old.md"],
            hex::encode(Sha256::digest(b"v2, longer"))
        );
        // A fresh file (inside the margin) is never cached.
        f.put("new.md", b"n").unwrap();
        f.scan().unwrap();
        assert!(!f.cache.lock().unwrap().contains_key("new.md"));
    }

    #[test]
    fn a_read_stops_one_byte_past_the_limit_whatever_the_file_grows_to() {
        let (_t, f) = folder();
        // A file that grew past the limit after its fstat: the reader stops
        // at limit + 1 bytes and says so.
        let fd = rustix::fs::open(
            f.root().join("g.md").as_path(),
            OFlags::RDWR | OFlags::CREATE,
            Mode::from_raw_mode(0o600),
        )
        .unwrap();
        std::fs::File::from(fd.try_clone().unwrap())
            .write_all(&vec![b'y'; MAX_FILE_BYTES as usize + 4096])
            .unwrap();
        rustix::fs::seek(&fd, rustix::fs::SeekFrom::Start(0)).unwrap();
        assert_eq!(hash_fd(&fd).unwrap(), None, "over the limit while read");
        rustix::fs::seek(&fd, rustix::fs::SeekFrom::Start(0)).unwrap();
        rustix::fs::ftruncate(&fd, 10).unwrap();
        assert!(hash_fd(&fd).unwrap().is_some());
    }
}
