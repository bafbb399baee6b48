//! The journaled maps of a store's state: each remembers every change made
//! to it since the last commit, so no mutation can skip the journal.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::format::{MapKind, Record};

/// Milliseconds since the epoch of an `Instant` in the past (a pending
/// deletion's start), for the journal.
pub(crate) fn wall_ms(at: Instant) -> String {
    let wall = SystemTime::now()
        .checked_sub(at.elapsed())
        .unwrap_or(UNIX_EPOCH);
    wall.duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis()
        .to_string()
}

/// How a journaled map's value is written in the journal.
pub(crate) trait JournalValue {
    fn journal_value(&self) -> String;
}

impl JournalValue for String {
    fn journal_value(&self) -> String {
        self.clone()
    }
}

impl JournalValue for Instant {
    fn journal_value(&self) -> String {
        wall_ms(*self)
    }
}

/// A journaled map of the store's state: a path-sorted map that remembers
/// each change made to it since the last commit. The store's state lock
/// takes the changes and appends them when it is released
/// (`super::super::state::StateGuard`), so no mutation can skip the journal.
#[derive(Debug)]
pub(crate) struct Tracked<V> {
    kind: MapKind,
    map: BTreeMap<String, V>,
    changes: Vec<Record>,
}

impl<V: JournalValue + PartialEq> Tracked<V> {
    pub(crate) fn new(kind: MapKind) -> Self {
        Tracked {
            kind,
            map: BTreeMap::new(),
            changes: Vec::new(),
        }
    }

    /// A map restored from a journal: nothing to record, it is there already.
    pub(crate) fn restored(kind: MapKind, map: BTreeMap<String, V>) -> Self {
        Tracked {
            kind,
            map,
            changes: Vec::new(),
        }
    }

    pub(crate) fn get(&self, path: &str) -> Option<&V> {
        self.map.get(path)
    }

    pub(crate) fn contains_key(&self, path: &str) -> bool {
        self.map.contains_key(path)
    }

    pub(crate) fn iter(&self) -> std::collections::btree_map::Iter<'_, String, V> {
        self.map.iter()
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn as_map(&self) -> &BTreeMap<String, V> {
        &self.map
    }

    /// Set `path` (recorded only when its value changes).
    pub(crate) fn insert(&mut self, path: String, value: V) -> Option<V> {
        if self.map.get(&path) == Some(&value) {
            return Some(value);
        }
        self.changes.push(Record(
            self.kind,
            Some(path.clone()),
            Some(value.journal_value()),
        ));
        self.map.insert(path, value)
    }

    /// Insert unless the path is there already (`entry().or_insert()`).
    pub(crate) fn insert_if_absent(&mut self, path: &str, value: V) {
        if !self.map.contains_key(path) {
            self.insert(path.to_string(), value);
        }
    }

    pub(crate) fn remove(&mut self, path: &str) -> Option<V> {
        let old = self.map.remove(path);
        if old.is_some() {
            self.changes
                .push(Record(self.kind, Some(path.to_string()), None));
        }
        old
    }

    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&String, &mut V) -> bool) {
        let (kind, changes) = (self.kind, &mut self.changes);
        self.map.retain(|path, value| {
            let kept = keep(path, value);
            if !kept {
                changes.push(Record(kind, Some(path.clone()), None));
            }
            kept
        });
    }

    pub(crate) fn clear(&mut self) {
        if !self.map.is_empty() {
            self.map.clear();
            self.changes.push(Record(self.kind, None, None));
        }
    }

    /// Empty the map, returning what it held.
    pub(crate) fn take(&mut self) -> BTreeMap<String, V> {
        let old = std::mem::take(&mut self.map);
        if !old.is_empty() {
            self.changes.push(Record(self.kind, None, None));
        }
        old
    }

    pub(crate) fn extend(&mut self, entries: impl IntoIterator<Item = (String, V)>) {
        for (path, value) in entries {
            self.insert(path, value);
        }
    }

    /// Move the changes since the last commit to `out`.
    pub(crate) fn drain_changes(&mut self, out: &mut Vec<Record>) {
        out.append(&mut self.changes);
    }

    /// The map as the journal writes it.
    pub(crate) fn journal_map(&self) -> BTreeMap<String, String> {
        self.map
            .iter()
            .map(|(p, v)| (p.clone(), v.journal_value()))
            .collect()
    }
}
