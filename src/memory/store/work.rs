//! The plan of a sync pass: every path through the pure planner
//! (`memory::plan`), gathered into the work lists the executor carries out.

use std::collections::{BTreeMap, HashSet, btree_map};
use std::iter::Peekable;

use crate::api::types::MemoryIndexEntry;
use crate::memory::plan::{
    Decision, DeleteBudget, Listed, Note, PassFacts, PathFacts, Pending, Plan, plan, settled,
};
use crate::memory::state::State;

use super::AttachedStore;
use super::local::Marked;

/// An upload a pass plans.
pub(super) struct PlannedUpload {
    pub(super) rel: String,
    /// The file's hash, as planned.
    pub(super) local: Option<String>,
    /// The update (memory id, expected hash), or `None` to create.
    pub(super) update: Option<(String, String)>,
    /// The baseline entry if it fails.
    pub(super) fallback: Option<String>,
}

/// What a sync pass planned: the work lists the executor carries out.
pub(super) struct Work {
    /// The decisions' baseline entries (`None` takes the path out), applied
    /// right after the planning.
    pub(super) changes: Vec<(String, Option<String>)>,
    /// (path, memory id) to fetch and write.
    pub(super) pulls: Vec<(String, String)>,
    pub(super) uploads: Vec<PlannedUpload>,
    /// (path, base): remove the file if it still holds `base`.
    pub(super) removals: Vec<(String, String)>,
    /// (path, memory id, base): corroborated local deletions to re-check.
    pub(super) deletes: Vec<(String, String, String)>,
    /// The conditions to report, in path order.
    pub(super) notes: Vec<(String, Note)>,
    /// Local deletions kept on the server because deletions are disabled.
    pub(super) suppressed: usize,
    /// The pass's delete budget, from the baseline it was planned against.
    pub(super) budget: DeleteBudget,
}

impl Work {
    fn new(budget: DeleteBudget) -> Work {
        Work {
            changes: Vec::new(),
            pulls: Vec::new(),
            uploads: Vec::new(),
            removals: Vec::new(),
            deletes: Vec::new(),
            notes: Vec::new(),
            suppressed: 0,
            budget,
        }
    }

    /// One path's plan in the lists: its note, and its decision (the
    /// baseline entry now, or the I/O that settles it). `confirmed` is the
    /// path's baseline entry, `listed` its memory on the server, `local` the
    /// file's hash.
    fn take(
        &mut self,
        rel: &str,
        p: Plan,
        confirmed: Option<&String>,
        listed: Option<&MemoryIndexEntry>,
        local: Option<&str>,
    ) {
        match p.note {
            Some(Note::DeleteSuppressed) => self.suppressed += 1,
            Some(note) => self.notes.push((rel.to_string(), note)),
            None => {}
        }
        let mut keep = |sha: Option<String>| {
            if confirmed != sha.as_ref() {
                self.changes.push((rel.to_string(), sha));
            }
        };
        match p.decision {
            Decision::Forget => keep(None),
            Decision::Keep(sha) | Decision::HoldDelete { base: sha } => keep(Some(sha)),
            Decision::Pull { keep: k } => {
                keep(k);
                // The planner pulls only what the server listed.
                if let Some(m) = listed {
                    self.pulls.push((rel.to_string(), m.id.clone()));
                }
            }
            // These settle their baseline entry after their I/O.
            Decision::Upload { update, fallback } => self.uploads.push(PlannedUpload {
                rel: rel.to_string(),
                local: local.map(str::to_string),
                update,
                fallback,
            }),
            Decision::RemoveLocal { base } => self.removals.push((rel.to_string(), base)),
            Decision::Delete { id, base } => self.deletes.push((rel.to_string(), id, base)),
        }
    }

    /// Nothing to do, nothing to report.
    pub(super) fn is_empty(&self) -> bool {
        self.changes.is_empty()
            && self.pulls.is_empty()
            && self.uploads.is_empty()
            && self.removals.is_empty()
            && self.deletes.is_empty()
            && self.notes.is_empty()
            && self.suppressed == 0
    }
}

/// One path as the four maps a pass plans from hold it.
struct PathRow<'a> {
    rel: &'a String,
    /// Its memory on the server.
    listed: Option<&'a MemoryIndexEntry>,
    /// The file's hash.
    local: Option<&'a String>,
    /// Its baseline entry.
    confirmed: Option<&'a String>,
    /// Its tentative baseline entry.
    held: Option<&'a String>,
}

impl PathRow<'_> {
    /// Settled, and no tentative entry concerns it (`plan::settled`).
    fn settled(&self) -> bool {
        self.held.is_none()
            && settled(
                self.local.map(String::as_str),
                self.confirmed.map(String::as_str),
                self.listed.map(|m| m.content_sha256.as_str()),
            )
    }
}

/// The four maps, all sorted by path, walked in step: each path is visited
/// once and looked up nowhere.
struct InStep<'a, L: Iterator<Item = (&'a String, &'a String)>> {
    remote: Peekable<btree_map::Iter<'a, String, MemoryIndexEntry>>,
    local: Peekable<L>,
    baseline: Peekable<btree_map::Iter<'a, String, String>>,
    tentative: Peekable<btree_map::Iter<'a, String, String>>,
}

impl<'a, L: Iterator<Item = (&'a String, &'a String)>> Iterator for InStep<'a, L> {
    type Item = PathRow<'a>;

    fn next(&mut self) -> Option<PathRow<'a>> {
        let rel = [
            self.remote.peek().map(|e| e.0),
            self.local.peek().map(|e| e.0),
            self.baseline.peek().map(|e| e.0),
            self.tentative.peek().map(|e| e.0),
        ]
        .into_iter()
        .flatten()
        .min()?;
        Some(PathRow {
            rel,
            listed: self.remote.next_if(|e| e.0 == rel).map(|e| e.1),
            local: self.local.next_if(|e| e.0 == rel).map(|e| e.1),
            confirmed: self.baseline.next_if(|e| e.0 == rel).map(|e| e.1),
            held: self.tentative.next_if(|e| e.0 == rel).map(|e| e.1),
        })
    }
}

impl AttachedStore {
    /// Plan every path of the pass ([`plan`]) under one lock, reading the
    /// state in place, and say what is left to do. The pending-delete
    /// records move here, as the plans say; the baseline only changes
    /// where a decision (or its I/O) moves it, by the caller.
    pub(super) fn plan_paths(
        &self,
        scan: &Marked,
        remote: &BTreeMap<String, MemoryIndexEntry>,
        pass: PassFacts,
        flying: &HashSet<String>,
    ) -> Work {
        let mut guard = self.state();
        let State {
            baseline,
            tentative,
            refused,
            pending,
            ..
        } = &mut *guard;
        let mut work = Work::new(DeleteBudget::new(pass.deletions, baseline.len()));
        let paths = InStep {
            remote: remote.iter().peekable(),
            local: scan.files.iter().peekable(),
            baseline: baseline.iter().peekable(),
            tentative: tentative.iter().peekable(),
        };
        for row in paths {
            let rel = row.rel;
            // An upload of the push carries it: left as it is until it ends.
            if !flying.is_empty() && flying.contains(rel) {
                continue;
            }
            // Settled, and no record concerns it: the plan would keep it as
            // it is (`plan::settled`), so it is not planned.
            if row.settled() && !pending.contains_key(rel) {
                continue;
            }
            let facts = PathFacts {
                local: row.local.map(String::as_str),
                baseline: row.confirmed.or(row.held).map(String::as_str),
                remote: row.listed.map(|m| Listed {
                    id: &m.id,
                    sha: &m.content_sha256,
                }),
                refused: refused.get(rel).map(String::as_str),
                missing_since: pending.get(rel).copied(),
                tentative: row.confirmed.is_none() && row.held.is_some(),
                unreadable: row.local.is_none() && scan.files.is_unknown(rel),
            };
            let p = plan(facts, pass);
            match p.pending {
                Pending::Unchanged => {}
                Pending::Clear => {
                    pending.remove(rel);
                }
                Pending::Since(t) => pending.insert_if_absent(rel, t),
            }
            work.take(rel, p, row.confirmed, row.listed, facts.local);
        }
        work
    }
}
