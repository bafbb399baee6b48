//! What a journal holds and how it is written: lines `<crc32 hex> <json>\n`,
//! the first a header (the format's version, whose folder it is, whether
//! it is being removed), every later one a batch of records, each setting
//! or clearing one entry of one of the four maps of a [`Snapshot`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub(super) const VERSION: u32 = 1;

/// Which map of the state a record changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum MapKind {
    #[serde(rename = "b")]
    Baseline,
    #[serde(rename = "t")]
    Tentative,
    #[serde(rename = "s")]
    Sent,
    #[serde(rename = "p")]
    Pending,
}

/// One change: set (`Some`) or clear (`None`) `path` in `map`; a `None`
/// path clears the whole map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record(
    pub(super) MapKind,
    pub(super) Option<String>,
    pub(super) Option<String>,
);

/// Whose folder a journal describes: checked before a folder is recovered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Owner {
    pub(crate) store: String,
    /// The folder's path as the session gave it (after any remap).
    pub(crate) root: PathBuf,
    /// The session whose worker mounted it: only that session's next claim
    /// recovers its edits (another session's agent must not push them).
    pub(crate) session: String,
    /// The folder directory's device and inode: a path swapped for another
    /// directory (or a symlink) is not the folder. Both 0 until the folder
    /// exists (the journal is made first).
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    /// The kernel's boot id when the folder was made: after a machine crash
    /// the folder's own writes (never `fsync`'d) cannot be trusted, so a
    /// folder from an earlier boot is removed, never recovered.
    #[serde(default)]
    pub(crate) boot: String,
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`); empty when unknown.
pub(crate) fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Header {
    pub(super) journal: u32,
    #[serde(flatten)]
    pub(super) owner: Owner,
    /// The folder is being removed (the session is over): a folder found
    /// with such a journal is finished off, never recovered — files already
    /// removed must not read as deletions.
    #[serde(default)]
    pub(super) disposing: bool,
}

/// The journaled state of one store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub(crate) baseline: BTreeMap<String, String>,
    pub(crate) tentative: BTreeMap<String, String>,
    pub(crate) sent: BTreeMap<String, String>,
    /// Path → since when (milliseconds since the epoch).
    pub(crate) pending: BTreeMap<String, String>,
}

impl Snapshot {
    fn map(&mut self, kind: MapKind) -> &mut BTreeMap<String, String> {
        match kind {
            MapKind::Baseline => &mut self.baseline,
            MapKind::Tentative => &mut self.tentative,
            MapKind::Sent => &mut self.sent,
            MapKind::Pending => &mut self.pending,
        }
    }

    pub(super) fn apply(&mut self, Record(kind, path, value): Record) {
        let map = self.map(kind);
        match (path, value) {
            (None, _) => map.clear(),
            (Some(path), Some(value)) => {
                map.insert(path, value);
            }
            (Some(path), None) => {
                map.remove(&path);
            }
        }
    }

    pub(super) fn records(&self) -> impl Iterator<Item = Record> + '_ {
        let kinds = [
            (MapKind::Baseline, &self.baseline),
            (MapKind::Tentative, &self.tentative),
            (MapKind::Sent, &self.sent),
            (MapKind::Pending, &self.pending),
        ];
        kinds.into_iter().flat_map(|(kind, map)| {
            map.iter()
                .map(move |(p, v)| Record(kind, Some(p.clone()), Some(v.clone())))
        })
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.baseline.len() + self.tentative.len() + self.sent.len() + self.pending.len()
    }
}

pub(super) fn line(json: &[u8]) -> Vec<u8> {
    let mut out = format!("{:08x} ", crc32fast::hash(json)).into_bytes();
    out.extend_from_slice(json);
    out.push(b'\n');
    out
}

pub(super) fn decode_line<T: serde::de::DeserializeOwned>(line: &[u8]) -> Option<T> {
    let (crc, json) = (line.get(..8)?, line.get(9..)?);
    if line.get(8) != Some(&b' ') {
        return None;
    }
    let crc = u32::from_str_radix(std::str::from_utf8(crc).ok()?, 16).ok()?;
    if crc != crc32fast::hash(json) {
        return None;
    }
    serde_json::from_slice(json).ok()
}
