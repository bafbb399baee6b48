//! Where an advertised mount path really lives, for hosts where it cannot.
//!
//! The server tells the agent its stores are at `/mnt/memory/<slug>`; on AWS
//! Lambda only `/tmp` is writable, so envworker mounts them under
//! `/tmp/mnt/memory/<slug>` instead and keeps the advertised paths working:
//! paths the agent gives to the tools (and paths inside its shell commands)
//! are moved to the real place, and paths in what the tools answer are moved
//! back, so the agent only ever sees `/mnt/memory`.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountRemap {
    /// What the agent and the server use, e.g. `/mnt/memory`.
    pub(crate) advertised: PathBuf,
    /// Where the files are, e.g. `/tmp/mnt/memory`.
    pub(crate) actual: PathBuf,
}

impl std::str::FromStr for MountRemap {
    type Err = String;

    /// `FROM=TO`, both absolute.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (from, to) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?} is not FROM=TO"))?;
        let (advertised, actual) = (PathBuf::from(from.trim()), PathBuf::from(to.trim()));
        if !advertised.is_absolute() || !actual.is_absolute() {
            return Err(format!("{s:?}: both paths must be absolute"));
        }
        Ok(MountRemap { advertised, actual })
    }
}

/// Replace each occurrence of `from` that is a whole path prefix (followed
/// by `/` or by a character that cannot continue a path component).
fn replace_prefix(text: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(from) {
        let after = &rest[at + from.len()..];
        let whole = after
            .chars()
            .next()
            .is_none_or(|c| c == '/' || !(c.is_alphanumeric() || "-_.".contains(c)));
        let starts_clean = at == 0
            || !rest[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || "-_./".contains(c));
        out.push_str(&rest[..at]);
        out.push_str(if whole && starts_clean { to } else { from });
        rest = after;
    }
    out.push_str(rest);
    out
}

impl MountRemap {
    /// A path as the agent gave it → where it really is.
    pub(crate) fn to_actual_path(&self, path: &Path) -> PathBuf {
        match path.strip_prefix(&self.advertised) {
            Ok(rest) => self.actual.join(rest),
            Err(_) => path.to_path_buf(),
        }
    }

    /// Paths in free text (a shell command) → where they really are.
    pub(crate) fn to_actual_text(&self, text: &str) -> String {
        replace_prefix(
            text,
            &self.advertised.display().to_string(),
            &self.actual.display().to_string(),
        )
    }

    /// Paths in a tool's answer → as the agent knows them.
    pub(crate) fn to_advertised_text(&self, text: &str) -> String {
        replace_prefix(
            text,
            &self.actual.display().to_string(),
            &self.advertised.display().to_string(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remap() -> MountRemap {
        "/mnt/memory=/tmp/mnt/memory".parse().unwrap()
    }

    #[test]
    fn paths_move_both_ways_only_at_whole_components() {
        let r = remap();
        assert_eq!(
            r.to_actual_path(Path::new("/mnt/memory/notes/a.md")),
            PathBuf::from("/tmp/mnt/memory/notes/a.md")
        );
        assert_eq!(
            r.to_actual_path(Path::new("/mnt/memoryx/a")),
            PathBuf::from("/mnt/memoryx/a")
        );
        assert_eq!(
            r.to_actual_path(Path::new("relative/a")),
            PathBuf::from("relative/a")
        );
        assert_eq!(
            r.to_actual_text(
                "cat /mnt/memory/notes/a.md && ls '/mnt/memory' /mnt/memoryx /x/mnt/memory"
            ),
            "cat /tmp/mnt/memory/notes/a.md && ls '/tmp/mnt/memory' /mnt/memoryx /x/mnt/memory"
        );
        assert_eq!(
            r.to_advertised_text("wrote 3 bytes to /tmp/mnt/memory/notes/a.md"),
            "wrote 3 bytes to /mnt/memory/notes/a.md"
        );
        assert!("relative=/x".parse::<MountRemap>().is_err());
        assert!("/a".parse::<MountRemap>().is_err());
    }
}
