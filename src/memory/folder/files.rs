//! One file's operations, safe against a hostile agent: every path is
//! opened beneath the root without following a symlink; a write goes to a
//! temporary file (`0600`, in directories created `0700`) renamed over the
//! target, so a reader never sees half a file; a read or a hash opens no
//! FIFO or device and reads at most one byte past the size limit; a removal
//! unlinks by descriptor.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::hash::hash_fresh;
use super::paths::{components, open_error};
use super::size::MAX_FILE_BYTES;
use super::stat::{now_ns, stat_key};
use super::{DIR_FLAGS, DIR_MODE, FILE_MODE, Folder, FolderError};
use crate::fsx::open_beneath;

impl Folder {
    fn check_utf8(&self, rel: &str, data: &[u8]) -> Result<(), FolderError> {
        if self.utf8_only && std::str::from_utf8(data).is_err() {
            return Err(FolderError::NotUtf8(rel.to_string()));
        }
        Ok(())
    }

    /// The file's directory, created below the root when missing (`0700`),
    /// never the root itself.
    fn parent_dir(
        &self,
        root: &OwnedFd,
        rel: &str,
        dirs: &[&str],
        create: bool,
    ) -> Result<OwnedFd, FolderError> {
        match open_beneath(root, dirs, DIR_FLAGS) {
            Ok(fd) => return Ok(fd),
            Err(Errno::NOENT) if create => {}
            Err(e) => return Err(open_error(rel, e)),
        }
        let mut current = rustix::fs::openat(root, ".", DIR_FLAGS, Mode::empty())
            .map_err(|e| FolderError::io(rel, e))?;
        for dir in dirs {
            match rustix::fs::mkdirat(&current, *dir, Mode::from_raw_mode(DIR_MODE)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(FolderError::io(rel, e)),
            }
            current = rustix::fs::openat(&current, *dir, DIR_FLAGS, Mode::empty())
                .map_err(|e| open_error(rel, e))?;
        }
        Ok(current)
    }

    /// Write `data` at `rel` atomically (temporary file + rename).
    pub(crate) fn put(&self, rel: &str, data: &[u8]) -> Result<(), FolderError> {
        self.write_atomic(rel, data).map(drop)
    }

    /// The atomic write behind [`Folder::put`]; returns the file's directory
    /// and name.
    pub(super) fn write_atomic(
        &self,
        rel: &str,
        data: &[u8],
    ) -> Result<(OwnedFd, String), FolderError> {
        let comps = components(rel)?;
        let Some((leaf, dirs)) = comps.split_last() else {
            return Err(FolderError::NotAFile(rel.to_string()));
        };
        if rel.ends_with('/') || rel.ends_with('\\') || rel.ends_with("/.") {
            return Err(FolderError::NotAFile(rel.to_string()));
        }
        self.check_utf8(rel, data)?;
        let root = self.require_root()?;
        let dir = self.parent_dir(&root, rel, dirs, true)?;
        let mut nonce = [0u8; 8];
        rand::fill(&mut nonce[..]);
        let tmp = format!(".fs-{}.tmp", hex::encode(nonce));
        let fd = rustix::fs::openat(
            &dir,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(FILE_MODE),
        )
        .map_err(|e| FolderError::io(rel, e))?;
        let written = std::fs::File::from(fd).write_all(data);
        let renamed = written
            .map_err(|e| FolderError::Io {
                path: rel.to_string(),
                source: e,
            })
            .and_then(|()| {
                rustix::fs::renameat(&dir, tmp.as_str(), &dir, *leaf)
                    .map_err(|e| FolderError::io(rel, e))
            });
        if renamed.is_err() {
            let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
        }
        renamed?;
        Ok((dir, leaf.to_string()))
    }

    /// The file's bytes; `None` when absent. Symlinks and non-regular files
    /// are refused without being read (a FIFO never blocks the open).
    pub(crate) fn get(&self, rel: &str) -> Result<Option<Vec<u8>>, FolderError> {
        let comps = components(rel)?;
        if comps.is_empty() {
            return Err(FolderError::NotAFile(rel.to_string()));
        }
        let Some(root) = self.root_fd()? else {
            return Ok(None);
        };
        let fd = match open_beneath(&root, &comps, OFlags::RDONLY | OFlags::NONBLOCK) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(open_error(rel, e)),
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| FolderError::io(rel, e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(FolderError::NotAFile(rel.to_string()));
        }
        let too_large = |size: u64| FolderError::TooLarge {
            path: rel.to_string(),
            size,
        };
        if st.st_size as u64 > MAX_FILE_BYTES {
            return Err(too_large(st.st_size as u64));
        }
        // At most one byte past the limit, however much the file grows meanwhile.
        let mut data = Vec::with_capacity(st.st_size.max(0) as usize);
        std::fs::File::from(fd)
            .take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut data)
            .map_err(|e| FolderError::Io {
                path: rel.to_string(),
                source: e,
            })?;
        if data.len() as u64 > MAX_FILE_BYTES {
            return Err(too_large(data.len() as u64));
        }
        self.check_utf8(rel, &data)?;
        Ok(Some(data))
    }

    /// One file's SHA-256; `None` when absent. Shares the scan's cache.
    pub(crate) fn hash_file(&self, rel: &str) -> Result<Option<String>, FolderError> {
        let comps = components(rel)?;
        let Some((leaf, dirs)) = comps.split_last() else {
            return Err(FolderError::NotAFile(rel.to_string()));
        };
        let Some(root) = self.root_fd()? else {
            return Ok(None);
        };
        let dir = match open_beneath(&root, dirs, DIR_FLAGS) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(open_error(rel, e)),
        };
        let st = match rustix::fs::statat(&dir, *leaf, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(FolderError::io(rel, e)),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {}
            FileType::Symlink => return Err(FolderError::Symlink(rel.to_string())),
            _ => return Err(FolderError::NotAFile(rel.to_string())),
        }
        let key = comps.join("/");
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((stat, sha, _)) = cache.get(&key)
            && *stat == stat_key(&st)
        {
            return Ok(Some(sha.clone()));
        }
        let hashed = hash_fresh(&dir, leaf, now_ns()).map_err(|e| FolderError::io(rel, e))?;
        Ok(hashed.map(|(sha, cacheable)| {
            match cacheable {
                Some(stat) => {
                    cache.insert(key, (stat, sha.clone(), 0));
                }
                None => {
                    cache.remove(&key);
                }
            }
            sha
        }))
    }

    /// Delete the file at `rel`; an absent file is fine.
    pub(crate) fn remove(&self, rel: &str) -> Result<(), FolderError> {
        let comps = components(rel)?;
        let Some((leaf, dirs)) = comps.split_last() else {
            return Ok(());
        };
        let Some(root) = self.root_fd()? else {
            return Ok(());
        };
        let dir = match open_beneath(&root, dirs, DIR_FLAGS) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(open_error(rel, e)),
        };
        match rustix::fs::unlinkat(&dir, *leaf, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(FolderError::io(rel, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::folder::tests::folder;
    use std::os::unix::fs::{PermissionsExt, symlink};
    use std::path::Path;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn put_get_and_owner_only_modes() {
        let (_t, f) = folder();
        f.put("a/b/c.md", b"hello").unwrap();
        assert_eq!(f.get("a/b/c.md").unwrap().unwrap(), b"hello");
        assert_eq!(
            f.get("/a/b/c.md").unwrap().unwrap(),
            b"hello",
            "a leading / means the root"
        );
        assert_eq!(
            f.get("a\\b\\c.md").unwrap().unwrap(),
            b"hello",
            "backslashes are separators"
        );
        assert_eq!(f.get("missing.md").unwrap(), None);
        let root = f.root();
        assert_eq!(mode(&root.join("a")), 0o700);
        assert_eq!(mode(&root.join("a/b")), 0o700);
        assert_eq!(mode(&root.join("a/b/c.md")), 0o600);
        assert_eq!(mode(&root), 0o700);
        // Overwrite is atomic and leaves no temporary file behind.
        f.put("a/b/c.md", b"again").unwrap();
        let names: Vec<_> = std::fs::read_dir(root.join("a/b"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["c.md"]);
    }

    #[test]
    fn symlinks_are_refused_on_read_and_write_and_skipped_by_scans() {
        let (t, f) = folder();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret.txt"), "secret").unwrap();
        let root = f.root();
        symlink(outside.join("secret.txt"), root.join("leaf.md")).unwrap();
        symlink(&outside, root.join("dir")).unwrap();
        assert!(matches!(f.get("leaf.md"), Err(FolderError::Symlink(_))));
        assert!(matches!(
            f.hash_file("leaf.md"),
            Err(FolderError::Symlink(_))
        ));
        // A symlinked parent directory: neither read nor written through.
        assert!(f.get("dir/secret.txt").is_err());
        assert!(f.put("dir/planted.md", b"x").is_err());
        assert!(!outside.join("planted.md").exists());
        // Scans skip both and never look behind them.
        f.put("real.md", b"r").unwrap();
        let scan = f.scan().unwrap();
        assert_eq!(scan.files.keys().collect::<Vec<_>>(), vec!["real.md"]);
        // Removing through the link removes nothing outside.
        f.remove("dir/secret.txt").unwrap_err();
        assert!(outside.join("secret.txt").exists());
    }

    #[test]
    fn the_fallback_walk_refuses_symlinks_too() {
        let (t, f) = folder();
        let outside = t.path().join("elsewhere");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("s.md"), "s").unwrap();
        symlink(&outside, f.root().join("link")).unwrap();
        let root = f.require_root().unwrap();
        // Force the component walk regardless of the kernel.
        let walked = {
            let (last, dirs) = ["link", "s.md"]
                .split_last()
                .map(|(l, d)| (*l, d.to_vec()))
                .unwrap();
            let mut current: Option<OwnedFd> = None;
            let mut result = Ok(());
            for dir in &dirs {
                match rustix::fs::openat(
                    current.as_ref().unwrap_or(&root),
                    *dir,
                    DIR_FLAGS,
                    Mode::empty(),
                ) {
                    Ok(fd) => current = Some(fd),
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            result.and_then(|()| {
                rustix::fs::openat(
                    current.as_ref().unwrap_or(&root),
                    last,
                    OFlags::RDONLY | OFlags::NOFOLLOW,
                    Mode::empty(),
                )
                .map(|_| ())
            })
        };
        assert!(
            matches!(walked, Err(Errno::LOOP) | Err(Errno::NOTDIR)),
            "{walked:?}"
        );
    }

    #[test]
    fn fifos_and_devices_are_never_opened() {
        let (_t, f) = folder();
        let fifo = f.root().join("pipe.md");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        // A blocking open of a FIFO would hang here; the folder refuses instead.
        assert!(matches!(f.get("pipe.md"), Err(FolderError::NotAFile(_))));
        assert!(matches!(
            f.hash_file("pipe.md"),
            Err(FolderError::NotAFile(_))
        ));
        assert!(f.scan().unwrap().files.is_empty());
    }

    #[test]
    fn binary_content_is_refused_on_put_and_get() {
        let (_t, f) = folder();
        assert!(matches!(
            f.put("bin.md", &[0xff, 0xfe, 0x00]),
            Err(FolderError::NotUtf8(_))
        ));
        std::fs::write(f.root().join("bin.md"), [0xc3, 0x28]).unwrap();
        assert!(matches!(f.get("bin.md"), Err(FolderError::NotUtf8(_))));
        // ...but it is still scanned (so a sync can see and refuse it).
        assert!(f.scan().unwrap().files.contains_key("bin.md"));
    }
}
