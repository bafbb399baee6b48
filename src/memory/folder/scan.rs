//! A scan of the folder: the hash of every regular file below the root,
//! the names that can never be memories (not UTF-8), and the entries that
//! could not be read (what is at or below them is unknown, never deleted).
//! Whole ([`Folder::scan`]), or of just the paths the watch reported
//! ([`Folder::examine`]).

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;

use rustix::io::Errno;

use super::paths::{components, open_error};
use super::stat::now_ns;
use super::walk::Walk;
use super::{DIR_FLAGS, Folder, FolderError};
use crate::fsx::open_beneath;
use crate::memory::watch::Watch;

/// A scan of the folder: `rel → sha256` of every regular file (a stand-in
/// for a file over [`MAX_FILE_BYTES`](super::MAX_FILE_BYTES), see
/// [`is_oversized`](super::is_oversized)), the names it
/// could not represent (not UTF-8), which can never be memories, and the
/// entries it could not read.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Scan {
    pub(crate) files: BTreeMap<String, String>,
    pub(crate) unrepresentable: Vec<String>,
    /// Files and directories the scan could not read (`""`: the root). What
    /// is at or below such a path is unknown — never a deletion.
    pub(crate) unreadable: Vec<String>,
}

impl Scan {
    /// Is `rel` unknown to this scan: at or below an unreadable entry?
    pub(crate) fn is_unknown(&self, rel: &str) -> bool {
        self.unreadable.iter().any(|u| {
            u.is_empty()
                || rel
                    .strip_prefix(u.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
    }
}

impl Folder {
    /// Hash every regular file below the root. Symlinks (and what they point
    /// to), FIFOs and devices are skipped; an entry that cannot be read is
    /// listed in [`Scan::unreadable`] (so what is below it is unknown, never
    /// deleted). An absent root scans empty; a replaced one fails.
    pub(crate) fn scan(&self) -> Result<Scan, FolderError> {
        self.scan_watched(None).map(|(scan, _)| scan)
    }

    /// [`scan`](Self::scan), watching each directory before it is listed
    /// when `watch` is given; also says how many entries it stat-ed.
    pub(crate) fn scan_watched(
        &self,
        watch: Option<&mut Watch>,
    ) -> Result<(Scan, usize), FolderError> {
        let start = now_ns();
        let Some(root) = self.root_fd()? else {
            return Ok((Scan::default(), 0));
        };
        // The scan keeps of the cache only what it saw, so entries of files
        // that are gone drop out.
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let cached = std::mem::take(&mut *cache);
        let files = Vec::with_capacity(cached.len());
        let mut walk = Walk::new(start, watch, cached, files);
        walk.tree(&root);
        let seen = walk.walk;
        walk.cache.retain(|_, (_, _, by)| *by == seen);
        *cache = std::mem::take(&mut walk.cache);
        Ok(found(walk))
    }

    /// Examine only `paths` (each a file, a directory — walked whole, its
    /// directories watched — or nothing any more): a scan of just what is
    /// at or below them now, and how many entries it stat-ed. A path whose
    /// parent is gone, or is no directory, or is a symlink, holds nothing.
    /// `Ok(None)` when the root is gone; an error the caller answers with a
    /// full scan.
    pub(crate) fn examine(
        &self,
        paths: &BTreeSet<String>,
        watch: &mut Watch,
    ) -> Result<Option<(Scan, usize)>, FolderError> {
        let start = now_ns();
        let Some(root) = self.root_fd()? else {
            return Ok(None);
        };
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let cached = std::mem::take(&mut *cache);
        let mut walk = Walk::new(start, Some(watch), cached, Vec::new());
        let result = paths
            .iter()
            .try_for_each(|rel| examine_path(&mut walk, &root, rel));
        // Only the examined paths were looked at: every other entry stays.
        *cache = std::mem::take(&mut walk.cache);
        result?;
        Ok(Some(found(walk)))
    }
}

/// Examine one path below `root` into `walk`: the file there, or the
/// directory there walked whole; nothing when its parent is gone, is no
/// directory, or is a symlink.
fn examine_path(walk: &mut Walk<'_>, root: &OwnedFd, rel: &str) -> Result<(), FolderError> {
    let comps = components(rel)?;
    let Some((leaf, dirs)) = comps.split_last() else {
        return Ok(());
    };
    let parent = if dirs.is_empty() {
        None
    } else {
        match open_beneath(root, dirs, DIR_FLAGS) {
            Ok(fd) => Some(fd),
            Err(Errno::NOENT) | Err(Errno::NOTDIR) | Err(Errno::LOOP) => return Ok(()),
            Err(e) => return Err(open_error(rel, e)),
        }
    };
    let Ok(leaf) = std::ffi::CString::new(*leaf) else {
        return Ok(());
    };
    let prefix = dirs.join("/");
    let dir = parent.as_ref().unwrap_or(root);
    if let Some((sub, sub_rel)) = walk.entry(dir, &prefix, comps.len(), &leaf) {
        walk.subtree(root, sub, sub_rel, comps.len());
    }
    Ok(())
}

/// What a walk found, as a scan, and how many entries it stat-ed.
fn found(walk: Walk<'_>) -> (Scan, usize) {
    (
        Scan {
            files: BTreeMap::from_iter(walk.files),
            unrepresentable: walk.unrepresentable,
            unreadable: walk.unreadable,
        },
        walk.examined,
    )
}

#[cfg(test)]
mod tests {
    use crate::memory::folder::tests::folder;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn unreadable_entries_are_listed_and_the_rest_still_scans() {
        let (_t, f) = folder();
        f.put("ok.md", b"ok").unwrap();
        f.put("dir/in.md", b"in").unwrap();
        f.put("locked.md", b"l").unwrap();
        std::fs::set_permissions(f.root().join("dir"), std::fs::Permissions::from_mode(0o000))
            .unwrap();
        std::fs::set_permissions(
            f.root().join("locked.md"),
            std::fs::Permissions::from_mode(0o000),
        )
        .unwrap();
        let scan = f.scan().unwrap();
        if rustix::process::geteuid().is_root() {
            // Root reads everything: nothing is unreadable.
            assert!(scan.unreadable.is_empty());
        } else {
            assert_eq!(scan.files.keys().collect::<Vec<_>>(), ["ok.md"]);
            assert_eq!(scan.unreadable, ["dir", "locked.md"]);
            assert!(scan.is_unknown("dir/in.md") && scan.is_unknown("locked.md"));
            assert!(!scan.is_unknown("dirt.md") && !scan.is_unknown("ok.md"));
        }
        // Dispose removes it all anyway: the folder is the worker's own.
        f.dispose().unwrap();
        assert!(!f.root().exists());
    }
}
