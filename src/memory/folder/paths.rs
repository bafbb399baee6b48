//! What a path may name. A store folder's own path must be absolute and
//! free of `..`; a path inside the folder (the server's, the agent's) is
//! split into components, `..` refused before any syscall; and the errors
//! of a no-follow open are read as the folder's refusals.

use rustix::io::Errno;

use super::FolderError;

/// `path` is usable verbatim as a folder: absolute, and no `..` component.
pub(crate) fn is_clean_absolute(path: &str) -> bool {
    path.starts_with('/') && !path.split('/').any(|c| c == "..")
}

/// The components of a relative path: backslashes are separators, leading
/// `/` and `.` components are dropped; `..` is refused.
pub(crate) fn components(rel: &str) -> Result<Vec<&str>, FolderError> {
    let mut out = Vec::new();
    for c in rel.split(['/', '\\']) {
        match c {
            "" | "." => {}
            ".." => return Err(FolderError::Escapes(rel.to_string())),
            other => out.push(other),
        }
    }
    Ok(out)
}

/// Map the errno of a no-follow open to the folder's refusals.
pub(super) fn open_error(rel: &str, errno: Errno) -> FolderError {
    match errno {
        // ELOOP: the leaf (or, with openat2, any component) is a symlink;
        // EXDEV: openat2 refused to leave the root.
        Errno::LOOP | Errno::MLINK => FolderError::Symlink(rel.to_string()),
        Errno::XDEV => FolderError::Escapes(rel.to_string()),
        Errno::NOTDIR => FolderError::NotADirectory(rel.to_string()),
        other => FolderError::io(rel, other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::folder::tests::folder;

    #[test]
    fn dot_dot_is_refused_before_any_syscall() {
        let (_t, f) = folder();
        for bad in ["../x", "a/../../x", "..", "a/..\\..\\x"] {
            assert!(
                matches!(f.put(bad, b"x"), Err(FolderError::Escapes(_))),
                "{bad}"
            );
            assert!(matches!(f.get(bad), Err(FolderError::Escapes(_))), "{bad}");
            assert!(
                matches!(f.hash_file(bad), Err(FolderError::Escapes(_))),
                "{bad}"
            );
            assert!(
                matches!(f.remove(bad), Err(FolderError::Escapes(_))),
                "{bad}"
            );
        }
        for not_a_file in ["", "/", "a/", "a/."] {
            assert!(
                matches!(f.put(not_a_file, b"x"), Err(FolderError::NotAFile(_))),
                "{not_a_file:?}"
            );
        }
    }

    #[test]
    fn clean_absolute_paths() {
        for ok in ["/mnt/memory/notes", "/a", "/a/./b"] {
            assert!(is_clean_absolute(ok), "{ok}");
        }
        for bad in [
            "relative/notes",
            "notes",
            "/mnt/../../etc/cron.d",
            "/a/..",
            "",
        ] {
            assert!(!is_clean_absolute(bad), "{bad}");
        }
    }
}
