//! The three-way merge of one path, as a pure function: no I/O, no clock
//! (the time is an input). Given the file's hash on disk, the memory as the
//! server lists it, and the baseline (the hash both sides held at the last
//! download or successful sync), it says what the sync must do.
//!
//! The rules (`spec/sdk-behaviour.md` §3.6–3.7):
//!
//! | disk | server | action |
//! |---|---|---|
//! | unchanged | unchanged | keep |
//! | edited | unchanged | upload (update guarded by the listed hash) — never from a read-only store |
//! | unchanged | edited | pull |
//! | edited | edited | pull: the server wins, with a warning |
//! | deleted | unchanged | delete on the server, only after the file stayed missing 30 s (the final sync waives the wait) |
//! | unchanged | deleted | remove the file (after a re-check) |
//! | deleted | deleted | forget |
//! | deleted | edited | restore (pull) |
//! | edited | deleted | keep the only copy: re-create it (writable), keep the file unsynced (read-only) |
//!
//! A file that already holds the server's bytes is adopted without a fetch;
//! a new file is created; a new memory is pulled; a file the server refused
//! is not offered again until its content changes. A path the scan could not
//! read (an unreadable file, or anything below an unreadable directory) is
//! unknown, not missing: it keeps its baseline, and nothing is deleted,
//! pulled over it or uploaded for it.

use std::time::Duration;

use tokio::time::Instant;

use super::options::DeleteMode;

/// How long a file must stay missing before its server delete goes out.
pub const DELETE_CORROBORATION: Duration = Duration::from_secs(30);

/// The memory as the server listed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed<'a> {
    pub id: &'a str,
    pub sha: &'a str,
}

/// Everything known about one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathFacts<'a> {
    /// The file's hash, if it is on disk.
    pub local: Option<&'a str>,
    /// The hash both sides held at the last sync.
    pub baseline: Option<&'a str>,
    /// The memory on the server.
    pub remote: Option<Listed<'a>>,
    /// A hash the server refused for this path.
    pub refused: Option<&'a str>,
    /// Since when the file has been seen missing (a pending delete).
    pub missing_since: Option<Instant>,
    /// The baseline is from before a re-download that did not re-establish
    /// it: good for telling a local edit from a conflict, never for deleting.
    pub tentative: bool,
    /// The scan could not read the path (or a directory above it): whatever
    /// is on disk there is unknown.
    pub unreadable: bool,
}

/// What holds for the whole store during this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassFacts {
    pub read_only: bool,
    pub deletions: DeleteMode,
    /// The session's last sync: the delete window is waived.
    pub final_sync: bool,
    pub now: Instant,
}

/// What to do with one path. The baseline entry a decision leaves is the
/// one named in it, unless its I/O says otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The path leaves the baseline.
    Forget,
    /// The new baseline entry; nothing to do.
    Keep(String),
    /// Write the server's version over the file; the baseline stays `keep`
    /// until the pull lands.
    Pull { keep: Option<String> },
    /// Push the file: an update guarded by the listed hash (`update`), or a
    /// create. If the upload fails the baseline becomes `fallback`.
    Upload {
        update: Option<(String, String)>,
        fallback: Option<String>,
    },
    /// The server deleted a memory the file still holds unchanged: re-hash
    /// the file and remove it if it still holds `base`; an edit made since
    /// the scan is planned again as an edit.
    RemoveLocal { base: String },
    /// A corroborated local deletion: re-check the marker and the file, then
    /// delete on the server guarded by `base` (or only log, in `log_only`).
    Delete { id: String, base: String },
    /// A local deletion that must wait (inside its window, or deletions off).
    HoldDelete { base: String },
}

/// What happens to the path's pending-delete record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pending {
    Unchanged,
    Clear,
    Since(Instant),
}

/// A condition the sync reports (the executor logs it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Note {
    /// Edited on both sides; the server's version is kept.
    BothChanged,
    /// Deleted here, edited on the server; the server's version comes back.
    RestoredRemote,
    /// Deleted on the server, edited here; the file re-creates the memory.
    Recreating,
    /// Deleted on the server, edited here, but the store is read-only.
    ReadOnlyKeepsEdit,
    /// A local deletion that deletions being disabled keeps on the server.
    DeleteSuppressed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub decision: Decision,
    pub pending: Pending,
    pub note: Option<Note>,
}

impl Plan {
    fn new(decision: Decision) -> Plan {
        Plan {
            decision,
            pending: Pending::Unchanged,
            note: None,
        }
    }

    fn pending(mut self, pending: Pending) -> Plan {
        self.pending = pending;
        self
    }

    fn note(mut self, note: Note) -> Plan {
        self.note = Some(note);
        self
    }
}

fn owned(s: Option<&str>) -> Option<String> {
    s.map(str::to_string)
}

/// Decide one path.
pub fn plan(f: PathFacts<'_>, pass: PassFacts) -> Plan {
    if f.unreadable && f.local.is_none() {
        // Unknown, not gone: no delete, no pull over it, and its absence
        // starts no delete window.
        let decision = match f.baseline {
            Some(base) if !f.tentative => Decision::Keep(base.into()),
            _ => Decision::Forget,
        };
        return Plan::new(decision).pending(Pending::Clear);
    }
    let f = match (f.tentative, f.local, f.remote) {
        (false, ..) => f,
        // A missing file is restored, never deleted on the server.
        (true, None, Some(_)) => {
            return Plan::new(Decision::Pull { keep: None }).pending(Pending::Clear);
        }
        // Not on the server: the old baseline says nothing about this file.
        (true, _, None) => PathFacts {
            baseline: None,
            ..f
        },
        (true, Some(_), Some(_)) => f,
    };
    let ro = pass.read_only;
    // A file on disk is never a pending deletion.
    let present = if f.local.is_some() {
        Pending::Clear
    } else {
        Pending::Unchanged
    };

    // A local deletion of a memory the server still holds unchanged.
    if let (None, Some(base), Some(remote)) = (f.local, f.baseline, f.remote)
        && remote.sha == base
        && !ro
    {
        if pass.deletions == DeleteMode::Disabled {
            return Plan::new(Decision::HoldDelete { base: base.into() })
                .note(Note::DeleteSuppressed);
        }
        let since = f.missing_since.unwrap_or(pass.now);
        let waited = pass.now.saturating_duration_since(since);
        let decision = if pass.final_sync || waited >= DELETE_CORROBORATION {
            Decision::Delete {
                id: remote.id.into(),
                base: base.into(),
            }
        } else {
            Decision::HoldDelete { base: base.into() }
        };
        return Plan::new(decision).pending(Pending::Since(since));
    }

    let Some(remote) = f.remote else {
        // Not on the server.
        let Some(local) = f.local else {
            return Plan::new(Decision::Forget).pending(Pending::Clear);
        };
        let mut note = None;
        if let Some(base) = f.baseline {
            if local == base {
                return Plan::new(Decision::RemoveLocal { base: base.into() }).pending(present);
            }
            // The file holds an un-pushed edit: it is the only copy.
            note = Some(if ro {
                Note::ReadOnlyKeepsEdit
            } else {
                Note::Recreating
            });
        }
        if ro || f.refused == Some(local) {
            let plan = Plan::new(Decision::Forget).pending(present);
            // A refused edit is not announced again as a re-creation.
            return match note {
                Some(Note::ReadOnlyKeepsEdit) => plan.note(Note::ReadOnlyKeepsEdit),
                _ => plan,
            };
        }
        let plan = Plan::new(Decision::Upload {
            update: None,
            fallback: None,
        })
        .pending(present);
        return match note {
            Some(n) => plan.note(n),
            None => plan,
        };
    };

    let remote_changed = Some(remote.sha) != f.baseline;
    let locally_edited = f
        .local
        .is_some_and(|l| Some(l) != f.baseline && l != remote.sha);
    let local_changed = locally_edited && !ro;

    if f.local.is_none() && f.baseline.is_some() {
        // Verifiably on disk once (only successful writes enter the
        // baseline) and gone now: a local deletion.
        if remote_changed {
            return Plan::new(Decision::Pull {
                keep: owned(f.baseline),
            })
            .pending(Pending::Clear)
            .note(Note::RestoredRemote);
        }
        return Plan::new(Decision::Keep(owned(f.baseline).unwrap_or_default()));
    }

    if remote_changed {
        if f.local == Some(remote.sha) {
            // The file already holds the server's bytes: adopt, no fetch.
            return Plan::new(Decision::Keep(remote.sha.into())).pending(present);
        }
        let plan = Plan::new(Decision::Pull {
            keep: owned(f.baseline),
        })
        .pending(present);
        return if locally_edited {
            plan.note(Note::BothChanged)
        } else {
            plan
        };
    }
    if local_changed {
        if f.refused == f.local {
            return Plan::new(Decision::Keep(remote.sha.into())).pending(present);
        }
        return Plan::new(Decision::Upload {
            update: Some((remote.id.into(), remote.sha.into())),
            fallback: Some(remote.sha.into()),
        })
        .pending(present);
    }
    Plan::new(Decision::Keep(remote.sha.into())).pending(present)
}

/// The most deletes one pass sends: a quarter of the baseline, at least 8
/// and at most 50.
pub fn delete_cap(baseline_len: usize) -> usize {
    (baseline_len / 4).clamp(8, 50)
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = "sha-v1";
    const V2: &str = "sha-v2";
    const V3: &str = "sha-v3";
    const ID: &str = "mem_1";

    /// One row of the sync matrix: disk and server relative to a shared v1.
    #[derive(Clone, Copy, Debug)]
    enum Side {
        Same,
        Edited,
        Deleted,
    }

    fn facts(local: Side, remote: Side) -> PathFacts<'static> {
        PathFacts {
            local: match local {
                Side::Same => Some(V1),
                Side::Edited => Some(V2),
                Side::Deleted => None,
            },
            baseline: Some(V1),
            remote: match remote {
                Side::Same => Some(Listed { id: ID, sha: V1 }),
                // Both edited: the server holds another edit than the disk.
                Side::Edited if matches!(local, Side::Edited) => Some(Listed { id: ID, sha: V3 }),
                Side::Edited => Some(Listed { id: ID, sha: V2 }),
                Side::Deleted => None,
            },
            refused: None,
            missing_since: None,
            tentative: false,
            unreadable: false,
        }
    }

    fn pass(read_only: bool, deletions: DeleteMode, now: Instant) -> PassFacts {
        PassFacts {
            read_only,
            deletions,
            final_sync: false,
            now,
        }
    }

    fn keep(s: &str) -> Decision {
        Decision::Keep(s.into())
    }

    fn pull() -> Decision {
        Decision::Pull {
            keep: Some(V1.into()),
        }
    }

    /// Every row of the matrix, for both access modes and all three delete
    /// modes: the decision of the first pass and of a pass after the window.
    #[test]
    fn the_sync_matrix() {
        use Side::*;
        let t0 = Instant::now();
        let later = t0 + DELETE_CORROBORATION;
        let update = Decision::Upload {
            update: Some((ID.into(), V1.into())),
            fallback: Some(V1.into()),
        };
        let create = Decision::Upload {
            update: None,
            fallback: None,
        };
        for read_only in [false, true] {
            for mode in [
                DeleteMode::Enabled,
                DeleteMode::LogOnly,
                DeleteMode::Disabled,
            ] {
                let rows: Vec<(Side, Side, Decision, Option<Note>)> = vec![
                    (Same, Same, keep(V1), None),
                    (
                        Edited,
                        Same,
                        if read_only { keep(V1) } else { update.clone() },
                        None,
                    ),
                    (Same, Edited, pull(), None),
                    (Edited, Edited, pull(), Some(Note::BothChanged)),
                    (
                        Same,
                        Deleted,
                        Decision::RemoveLocal { base: V1.into() },
                        None,
                    ),
                    (Deleted, Deleted, Decision::Forget, None),
                    (Deleted, Edited, pull(), Some(Note::RestoredRemote)),
                    (
                        Edited,
                        Deleted,
                        if read_only {
                            Decision::Forget
                        } else {
                            create.clone()
                        },
                        Some(if read_only {
                            Note::ReadOnlyKeepsEdit
                        } else {
                            Note::Recreating
                        }),
                    ),
                ];
                for (local, remote, want, note) in rows {
                    let got = plan(facts(local, remote), pass(read_only, mode, t0));
                    assert_eq!(
                        got.decision, want,
                        "{local:?}/{remote:?} ro={read_only} {mode:?}"
                    );
                    assert_eq!(
                        got.note, note,
                        "{local:?}/{remote:?} ro={read_only} {mode:?}"
                    );
                    // Nothing but a local deletion depends on the clock.
                    let again = plan(facts(local, remote), pass(read_only, mode, later));
                    assert_eq!(again.decision, want);
                }

                // The local deletion of an unchanged memory: the row that waits.
                let first = plan(facts(Deleted, Same), pass(read_only, mode, t0));
                let mut second_facts = facts(Deleted, Same);
                if let Pending::Since(since) = first.pending {
                    second_facts.missing_since = Some(since);
                }
                let just_before = plan(
                    second_facts,
                    pass(read_only, mode, later - Duration::from_millis(1)),
                );
                let after = plan(second_facts, pass(read_only, mode, later));
                match (read_only, mode) {
                    // A read-only store never deletes on the server, nor restores.
                    (true, _) => {
                        for p in [&first, &just_before, &after] {
                            assert_eq!(p.decision, keep(V1));
                            assert_eq!(p.pending, Pending::Unchanged);
                        }
                    }
                    (false, DeleteMode::Disabled) => {
                        for p in [&first, &after] {
                            assert_eq!(p.decision, Decision::HoldDelete { base: V1.into() });
                            assert_eq!(p.note, Some(Note::DeleteSuppressed));
                        }
                    }
                    (false, _) => {
                        assert_eq!(first.decision, Decision::HoldDelete { base: V1.into() });
                        assert_eq!(
                            first.pending,
                            Pending::Since(t0),
                            "the first miss is recorded"
                        );
                        assert_eq!(
                            just_before.decision,
                            Decision::HoldDelete { base: V1.into() }
                        );
                        assert_eq!(
                            just_before.pending,
                            Pending::Since(t0),
                            "the first sighting is kept"
                        );
                        assert_eq!(
                            after.decision,
                            Decision::Delete {
                                id: ID.into(),
                                base: V1.into()
                            }
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_final_sync_waives_the_window() {
        let t0 = Instant::now();
        let mut p = pass(false, DeleteMode::Enabled, t0);
        p.final_sync = true;
        assert_eq!(
            plan(facts(Side::Deleted, Side::Same), p).decision,
            Decision::Delete {
                id: ID.into(),
                base: V1.into()
            }
        );
    }

    #[test]
    fn adopt_new_files_new_memories_and_refusals() {
        let now = Instant::now();
        let rw = pass(false, DeleteMode::Enabled, now);
        let ro = pass(true, DeleteMode::Enabled, now);
        // The file already holds the server's new bytes: adopt, no fetch.
        let adopt = PathFacts {
            local: Some(V2),
            baseline: Some(V1),
            remote: Some(Listed { id: ID, sha: V2 }),
            ..Default::default()
        };
        assert_eq!(plan(adopt, rw).decision, keep(V2));
        assert_eq!(plan(adopt, ro).decision, keep(V2));
        // A new file: created (writable), ignored (read-only), not re-offered once refused.
        let new_file = PathFacts {
            local: Some(V1),
            ..Default::default()
        };
        assert_eq!(
            plan(new_file, rw).decision,
            Decision::Upload {
                update: None,
                fallback: None
            }
        );
        assert_eq!(plan(new_file, ro).decision, Decision::Forget);
        let refused = PathFacts {
            refused: Some(V1),
            ..new_file
        };
        assert_eq!(plan(refused, rw).decision, Decision::Forget);
        // A refused edit of an existing memory keeps the listed hash.
        let refused_edit = PathFacts {
            local: Some(V2),
            baseline: Some(V1),
            remote: Some(Listed { id: ID, sha: V1 }),
            refused: Some(V2),
            missing_since: None,
            tentative: false,
            unreadable: false,
        };
        assert_eq!(plan(refused_edit, rw).decision, keep(V1));
        // ...and a refused edit that survives a remote delete is not re-created.
        let refused_orphan = PathFacts {
            remote: None,
            ..refused_edit
        };
        let p = plan(refused_orphan, rw);
        assert_eq!((p.decision, p.note), (Decision::Forget, None));
        // A new memory: pulled, with no baseline until it lands.
        let new_memory = PathFacts {
            remote: Some(Listed { id: ID, sha: V1 }),
            ..Default::default()
        };
        assert_eq!(plan(new_memory, rw).decision, Decision::Pull { keep: None });
        // A file on disk clears a pending delete.
        let back = PathFacts {
            missing_since: Some(now),
            ..facts(Side::Same, Side::Same)
        };
        assert_eq!(plan(back, rw).pending, Pending::Clear);
    }

    #[test]
    fn an_unreadable_path_is_unknown_never_deleted_pulled_or_pushed() {
        let now = Instant::now();
        let unknown = |remote| PathFacts {
            unreadable: true,
            missing_since: Some(now),
            ..facts(Side::Deleted, remote)
        };
        use Side::*;
        for final_sync in [false, true] {
            let pass = PassFacts {
                final_sync,
                ..pass(false, DeleteMode::Enabled, now + DELETE_CORROBORATION)
            };
            // Unchanged on the server: kept (no delete, even past the window).
            let p = plan(unknown(Same), pass);
            assert_eq!((p.decision, p.pending), (keep(V1), Pending::Clear));
            // Edited on the server: not pulled over the unknown file.
            assert_eq!(plan(unknown(Edited), pass).decision, keep(V1));
            // Deleted on the server: nothing removed locally.
            assert_eq!(plan(unknown(Deleted), pass).decision, keep(V1));
        }
        // A new memory below an unreadable folder is not pulled into it.
        let new_memory = PathFacts {
            remote: Some(Listed { id: ID, sha: V1 }),
            unreadable: true,
            ..Default::default()
        };
        let rw = pass(false, DeleteMode::Enabled, now);
        assert_eq!(plan(new_memory, rw).decision, Decision::Forget);
        // A tentative baseline is never made a real one by an unknown path.
        let held = PathFacts {
            tentative: true,
            ..unknown(Same)
        };
        assert_eq!(plan(held, rw).decision, Decision::Forget);
        // A file the scan did read is planned as usual.
        let read = PathFacts {
            unreadable: true,
            ..facts(Side::Edited, Side::Same)
        };
        assert!(matches!(plan(read, rw).decision, Decision::Upload { .. }));
    }

    #[test]
    fn a_tentative_baseline_tells_edits_from_conflicts_but_never_deletes() {
        let rw = pass(false, DeleteMode::Enabled, Instant::now());
        let tentative = |local, remote| PathFacts {
            tentative: true,
            ..facts(local, remote)
        };
        use Side::*;
        // Missing: restored, never a delete candidate.
        assert_eq!(
            plan(tentative(Deleted, Same), rw).decision,
            Decision::Pull { keep: None }
        );
        // Edited against an unchanged server: an upload, not a conflict.
        assert!(matches!(
            plan(tentative(Edited, Same), rw).decision,
            Decision::Upload {
                update: Some(_),
                ..
            }
        ));
        // The file as it was and the server gone: a new file, never a local removal.
        assert_eq!(
            plan(tentative(Same, Deleted), rw).decision,
            Decision::Upload {
                update: None,
                fallback: None
            }
        );
    }

    #[test]
    fn delete_cap_bounds() {
        assert_eq!(delete_cap(0), 8);
        assert_eq!(delete_cap(14), 8);
        assert_eq!(delete_cap(40), 10);
        assert_eq!(delete_cap(200), 50);
        assert_eq!(delete_cap(2_000), 50);
    }
}
