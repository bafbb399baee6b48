//! The folder's root, held by descriptor. [`Folder::create_root`] makes
//! (or [`Folder::attach_root`] finds) the root and opens it and its parent
//! once; every later operation starts from those descriptors, not from the
//! path, after checking that the root's name still leads to a directory: a
//! root swapped for a symlink or a file redirects neither a sync nor the
//! removal, and is reported as replaced. The root is removed by descriptor
//! too, and only when the folder is the worker's own.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use foldhash::{HashMap, HashMapExt};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::{DIR_FLAGS, DIR_MODE, Folder, FolderError};

/// The root and its parent, opened by `create_root`.
#[derive(Debug, Clone)]
pub(super) struct RootFds {
    parent: Arc<OwnedFd>,
    /// The root's name in `parent`.
    name: String,
    root: Arc<OwnedFd>,
    dev: u64,
    ino: u64,
    /// The identity of the directory `create_root` made (or found) there.
    original: (u64, u64),
}

impl Folder {
    /// Prepare the folder at `root` (absolute); creates nothing. Whatever is
    /// at the path now (a directory, a file, a symlink) makes it not ours.
    pub(crate) fn open(root: &Path, utf8_only: bool) -> std::io::Result<Folder> {
        let removed_on_dispose = match std::fs::symlink_metadata(root) {
            Ok(_) => false,
            // Nothing is there (or nothing can be, under a non-directory).
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                true
            }
            Err(e) => return Err(e),
        };
        Ok(Folder {
            configured: root.to_path_buf(),
            resolved: Mutex::new(root.to_path_buf()),
            removed_on_dispose,
            utf8_only,
            fds: Mutex::new(None),
            cache: Mutex::new(HashMap::new()),
            private_writes: Mutex::new(HashMap::new()),
        })
    }

    /// The folder's path with symlinks in its ancestors resolved.
    pub(crate) fn root(&self) -> PathBuf {
        self.resolved
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Take a folder that was already there as the worker's own: one a
    /// dead worker left, recovered (its marker and journal checked). It is
    /// removed on dispose like a folder the mount created.
    pub(crate) fn adopt(mut self) -> Folder {
        self.removed_on_dispose = true;
        self
    }

    /// Did `open` find nothing there (so the folder is ours to remove)?
    pub(crate) fn removed_on_dispose(&self) -> bool {
        self.removed_on_dispose
    }

    /// Create the root and any missing ancestors (`0700`); an existing
    /// directory is fine. Fixes the resolved path, and opens the root and
    /// its parent: every later operation starts from these descriptors.
    pub(crate) fn create_root(&self) -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(&self.configured)?;
        self.attach_root()
    }

    /// Open the root that is already there (creating nothing), as
    /// [`create_root`](Self::create_root) does after making it: a folder a
    /// dead worker left is taken as it is, or not at all. The root itself
    /// must be a directory, not a symlink to one.
    pub(crate) fn attach_root(&self) -> std::io::Result<()> {
        let resolved = std::fs::canonicalize(&self.configured)?;
        let (Some(parent), Some(name)) = (
            resolved.parent(),
            resolved.file_name().and_then(|n| n.to_str()),
        ) else {
            return Err(std::io::Error::other(format!(
                "{} cannot be a memory store folder",
                resolved.display()
            )));
        };
        let parent = rustix::fs::open(
            parent,
            DIR_FLAGS.difference(OFlags::NOFOLLOW),
            Mode::empty(),
        )?;
        // A store path that led into /proc (a symlink planted before the
        // mount) would sync the worker's own environment: refused.
        if std::fs::symlink_metadata(&self.configured)?
            .file_type()
            .is_symlink()
        {
            return Err(std::io::Error::other(format!(
                "{} is a symlink, not a memory store folder",
                self.configured.display()
            )));
        }
        let root = rustix::fs::openat(&parent, name, DIR_FLAGS, Mode::empty())
            .and_then(crate::fsx::refuse_pseudo_fs)?;
        let st = rustix::fs::fstat(&root)?;
        *self.fds.lock().unwrap_or_else(|e| e.into_inner()) = Some(RootFds {
            parent: Arc::new(parent),
            name: name.to_string(),
            root: Arc::new(root),
            dev: st.st_dev,
            ino: st.st_ino,
            original: (st.st_dev, st.st_ino),
        });
        *self.resolved.lock().unwrap_or_else(|e| e.into_inner()) = resolved;
        Ok(())
    }

    /// Whether the folder lies in a filesystem held in memory (tmpfs), where
    /// reading a memory never waits on a disk: such a read may run on the
    /// calling task instead of a blocking thread of its own.
    pub(crate) fn in_memory(&self) -> bool {
        matches!(self.root_fd(), Ok(Some(root)) if crate::fsx::memory_backed(&*root))
    }

    /// The root directory as opened by `create_root`, after checking that
    /// its name in the parent still leads to it. `Ok(None)` when nothing is
    /// there (or the root was never created). Another directory put in its
    /// place is taken as the folder (the marker check decides whether it is
    /// trusted); anything else there — a symlink, a file — is
    /// [`FolderError::Replaced`]: never followed, never removed.
    pub(super) fn root_fd(&self) -> Result<Option<Arc<OwnedFd>>, FolderError> {
        let mut fds = self.fds.lock().unwrap_or_else(|e| e.into_inner());
        let Some(held) = fds.as_mut() else {
            return Ok(None);
        };
        let shown = || self.root().display().to_string();
        let st = match rustix::fs::statat(
            &*held.parent,
            held.name.as_str(),
            AtFlags::SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(FolderError::io(&shown(), e)),
        };
        if (st.st_dev, st.st_ino) == (held.dev, held.ino) {
            return Ok(Some(held.root.clone()));
        }
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return Err(FolderError::Replaced(shown()));
        }
        let root =
            match rustix::fs::openat(&*held.parent, held.name.as_str(), DIR_FLAGS, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => return Ok(None),
                Err(Errno::LOOP) | Err(Errno::NOTDIR) => {
                    return Err(FolderError::Replaced(shown()));
                }
                Err(e) => return Err(FolderError::io(&shown(), e)),
            };
        let st = rustix::fs::fstat(&root).map_err(|e| FolderError::io(&shown(), e))?;
        held.root = Arc::new(root);
        (held.dev, held.ino) = (st.st_dev, st.st_ino);
        Ok(Some(held.root.clone()))
    }

    /// The device and inode of the directory `create_root` opened.
    pub(crate) fn identity(&self) -> Option<(u64, u64)> {
        self.fds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|h| h.original)
    }

    /// Is the root still the very directory `create_root` opened (not
    /// another one put in its place)?
    pub(crate) fn is_original_root(&self) -> bool {
        matches!(self.root_fd(), Ok(Some(_)))
            && self
                .fds
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_some_and(|h| (h.dev, h.ino) == h.original)
    }

    pub(super) fn require_root(&self) -> Result<Arc<OwnedFd>, FolderError> {
        self.root_fd()?.ok_or_else(|| FolderError::Io {
            path: self.root().display().to_string(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })
    }

    /// The device and inode of the directory the root's path leads to now
    /// (`None`: nothing there, or never created).
    pub(crate) fn current_identity(&self) -> Option<(u64, u64)> {
        self.root_fd().ok().flatten()?;
        self.fds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|h| (h.dev, h.ino))
    }

    /// Remove the root and everything below it — only if `open` found
    /// nothing there. Works from the descriptors opened at mount: symlinks
    /// inside are removed, never followed; a root replaced by something
    /// else is left alone and reported; permissions the agent took away are
    /// restored first (the folder is the worker's own).
    pub(crate) fn dispose(&self) -> Result<(), FolderError> {
        if !self.removed_on_dispose {
            return Ok(());
        }
        let Some(root) = self.root_fd()? else {
            return Ok(());
        };
        let shown = self.root().display().to_string();
        let held = self
            .fds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .expect("a root fd comes from the held descriptors");
        let st = rustix::fs::fstat(&*root).map_err(|e| FolderError::io(&shown, e))?;
        if st.st_mode & DIR_MODE != DIR_MODE {
            rustix::fs::fchmod(&*root, Mode::from_raw_mode(DIR_MODE))
                .map_err(|e| FolderError::io(&shown, e))?;
        }
        crate::fsx::remove_below(&root, &shown, DIR_MODE)
            .map_err(|(path, e)| FolderError::io(&path, e))?;
        match rustix::fs::unlinkat(&*held.parent, held.name.as_str(), AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(FolderError::io(&shown, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::folder::Scan;
    use crate::memory::folder::tests::folder;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_root_that_leads_into_proc_is_never_opened() {
        // `/mnt/memory` left as a symlink to /proc/self by an earlier agent,
        // and a store whose slug names a directory there: syncing it would
        // upload the worker's own process files (its environment among them).
        let f = Folder::open(Path::new("/proc/self/fdinfo"), true).unwrap();
        let err = f.create_root().unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(Errno::XDEV.raw_os_error()),
            "{err}"
        );
        assert!(
            f.scan().is_ok_and(|s| s.files.is_empty()),
            "nothing was opened"
        );
    }

    #[test]
    fn the_root_is_never_recreated_by_a_write() {
        let (_t, f) = folder();
        f.put("x.md", b"x").unwrap();
        std::fs::remove_dir_all(f.root()).unwrap();
        let err = f.put("y/z.md", b"z").unwrap_err();
        assert_eq!(err.io_kind(), Some(std::io::ErrorKind::NotFound));
        assert!(!f.root().exists());
        assert_eq!(
            f.scan().unwrap(),
            Scan::default(),
            "an absent root scans empty"
        );
        assert_eq!(f.get("x.md").unwrap(), None);
    }

    #[test]
    fn dispose_removes_only_a_folder_it_created() {
        let t = tempfile::tempdir().unwrap();
        let existing = t.path().join("preexisting");
        std::fs::create_dir(&existing).unwrap();
        let f = Folder::open(&existing, true).unwrap();
        assert!(!f.removed_on_dispose());
        f.dispose().unwrap();
        assert!(existing.exists());

        let (_t2, ours) = folder();
        ours.put("a/b.md", b"x").unwrap();
        ours.dispose().unwrap();
        assert!(!ours.root().exists());
        ours.dispose().unwrap();
    }

    #[test]
    fn a_root_swapped_for_a_symlink_is_reported_and_never_followed() {
        let (t, f) = folder();
        f.put("a.md", b"a").unwrap();
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("secret.md"), "secret").unwrap();
        std::fs::rename(f.root(), t.path().join("moved")).unwrap();
        symlink(&elsewhere, f.root()).unwrap();
        for err in [
            f.scan().unwrap_err(),
            f.get("secret.md").unwrap_err(),
            f.put("planted.md", b"x").unwrap_err(),
            f.dispose().unwrap_err(),
        ] {
            assert!(matches!(err, FolderError::Replaced(_)), "{err}");
            assert!(!err.is_refusal());
        }
        assert!(elsewhere.join("secret.md").exists());
        assert!(!elsewhere.join("planted.md").exists());
        assert!(f.root().is_symlink(), "left alone");
        // Another directory put in its place is taken as the folder (the
        // marker check decides whether it is trusted).
        std::fs::remove_file(f.root()).unwrap();
        std::fs::create_dir(f.root()).unwrap();
        std::fs::write(f.root().join("b.md"), "b").unwrap();
        assert_eq!(f.scan().unwrap().files.keys().collect::<Vec<_>>(), ["b.md"]);
        f.dispose().unwrap();
        assert!(!f.root().exists());
    }
}
