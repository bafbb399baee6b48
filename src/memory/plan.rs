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
//!
//! The delete budget of a pass is decided here too ([`DeleteBudget`]): in
//! `disabled` a local deletion is held (the plan of the path says so); in
//! `enabled` and `log_only` each corroborated deletion that passes its
//! re-check is sent, or only logged, until the pass's cap is spent, and
//! the rest are held for later passes.
//!
//! Before any path is planned, the folder as a whole is judged
//! ([`plan_folder`]): whether its marker lets it be synced, pushed from or
//! removed, and when a sync re-downloads it instead (a lost marker, a
//! wipe). The flush, push-only, has its own rules ([`flush_dirty`],
//! [`plan_flush`]). The executor only carries out the verdicts.

use std::time::Duration;

use tokio::time::Instant;

use super::options::DeleteMode;

/// How long a file must stay missing before its server delete goes out.
pub(crate) const DELETE_CORROBORATION: Duration = Duration::from_secs(30);

/// The memory as the server listed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Listed<'a> {
    pub id: &'a str,
    pub(crate) sha: &'a str,
}

/// Everything known about one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct PathFacts<'a> {
    /// The file's hash, if it is on disk.
    pub(crate) local: Option<&'a str>,
    /// The hash both sides held at the last sync.
    pub(crate) baseline: Option<&'a str>,
    /// The memory on the server.
    pub(crate) remote: Option<Listed<'a>>,
    /// A hash the server refused for this path.
    pub(crate) refused: Option<&'a str>,
    /// Since when the file has been seen missing (a pending delete).
    pub(crate) missing_since: Option<Instant>,
    /// The baseline is from before a re-download that did not re-establish
    /// it: good for telling a local edit from a conflict, never for deleting.
    pub(crate) tentative: bool,
    /// The scan could not read the path (or a directory above it): whatever
    /// is on disk there is unknown.
    pub(crate) unreadable: bool,
}

/// What holds for the whole store during this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PassFacts {
    pub(crate) read_only: bool,
    pub(crate) deletions: DeleteMode,
    /// The session's last sync: the delete window is waived.
    pub final_sync: bool,
    pub(crate) now: Instant,
}

/// What to do with one path. The baseline entry a decision leaves is the
/// one named in it, unless its I/O says otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
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
    /// carry out the pass's [`DeleteBudget`] verdict — delete on the server
    /// guarded by `base`, only log (`log_only`), or hold (cap reached).
    Delete { id: String, base: String },
    /// A local deletion that must wait (inside its window, or deletions off).
    HoldDelete { base: String },
}

/// What happens to the path's pending-delete record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pending {
    Unchanged,
    Clear,
    Since(Instant),
}

/// A condition the sync reports (the executor logs it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Note {
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
pub(crate) struct Plan {
    pub(crate) decision: Decision,
    pub(crate) pending: Pending,
    pub(crate) note: Option<Note>,
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

/// Do the file, the baseline and the memory all hold the same bytes? Such
/// a path is settled: unless a pending delete or a tentative baseline
/// concerns it, [`plan`] keeps it as it is (no I/O, no note, no new
/// baseline), so the executor skips it without building its facts — an idle
/// sync of a 2,000-memory store then costs a comparison per path, not a plan.
pub(crate) fn settled(local: Option<&str>, baseline: Option<&str>, remote: Option<&str>) -> bool {
    matches!((local, baseline, remote), (Some(l), Some(b), Some(r)) if l == b && b == r)
}

fn owned(s: Option<&str>) -> Option<String> {
    s.map(str::to_string)
}

/// Decide one path.
pub(crate) fn plan(f: PathFacts<'_>, pass: PassFacts) -> Plan {
    if f.unreadable && f.local.is_none() {
        return plan_unreadable(f);
    }
    let f = match with_tentative(f) {
        Ok(f) => f,
        Err(plan) => return plan,
    };
    if let Some(plan) = plan_local_delete(f, pass) {
        return plan;
    }
    // A file on disk is never a pending deletion.
    let present = if f.local.is_some() {
        Pending::Clear
    } else {
        Pending::Unchanged
    };
    match f.remote {
        None => plan_not_on_server(f, pass.read_only, present),
        Some(remote) => plan_on_server(f, remote, pass.read_only, present),
    }
}

/// Unknown, not gone: no delete, no pull over it, and its absence starts no
/// delete window.
fn plan_unreadable(f: PathFacts<'_>) -> Plan {
    let decision = match f.baseline {
        Some(base) if !f.tentative => Decision::Keep(base.into()),
        _ => Decision::Forget,
    };
    Plan::new(decision).pending(Pending::Clear)
}

/// A tentative baseline tells an edit from a conflict, never drives a
/// delete: the facts to plan from, or the plan it settles at once.
fn with_tentative(f: PathFacts<'_>) -> Result<PathFacts<'_>, Plan> {
    match (f.tentative, f.local, f.remote) {
        (false, ..) => Ok(f),
        // A missing file is restored, never deleted on the server.
        (true, None, Some(_)) => {
            Err(Plan::new(Decision::Pull { keep: None }).pending(Pending::Clear))
        }
        // Not on the server: the old baseline says nothing about this file.
        (true, _, None) => Ok(PathFacts {
            baseline: None,
            ..f
        }),
        (true, Some(_), Some(_)) => Ok(f),
    }
}

/// A local deletion of a memory the server still holds unchanged: held,
/// or sent once corroborated (or at the final sync).
fn plan_local_delete(f: PathFacts<'_>, pass: PassFacts) -> Option<Plan> {
    let (None, Some(base), Some(remote)) = (f.local, f.baseline, f.remote) else {
        return None;
    };
    if remote.sha != base || pass.read_only {
        return None;
    }
    if pass.deletions == DeleteMode::Disabled {
        return Some(
            Plan::new(Decision::HoldDelete { base: base.into() }).note(Note::DeleteSuppressed),
        );
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
    Some(Plan::new(decision).pending(Pending::Since(since)))
}

/// The server does not hold the path.
fn plan_not_on_server(f: PathFacts<'_>, ro: bool, present: Pending) -> Plan {
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
    match note {
        Some(n) => plan.note(n),
        None => plan,
    }
}

/// The server holds the path: the three-way merge.
fn plan_on_server(f: PathFacts<'_>, remote: Listed<'_>, ro: bool, present: Pending) -> Plan {
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
fn delete_cap(baseline_len: usize) -> usize {
    (baseline_len / 4).clamp(8, 50)
}

/// What one corroborated local deletion may do in this pass, once its
/// re-check (marker and file, read now) has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeleteVerdict {
    /// Delete the memory on the server.
    Send,
    /// `log_only`: log that the sync would delete it; the memory stays.
    LogOnly,
    /// The pass has spent its cap: hold the delete for a later pass.
    OverCap,
    /// `disabled`: nothing is sent or counted. The planner already holds
    /// such a deletion (with [`Note::DeleteSuppressed`]), so no delete
    /// reaches the budget in this mode; the budget refuses it all the same.
    Suppressed,
}

/// The delete budget of one pass, in all three modes: how many deletes
/// the pass may send given the cap ([`delete_cap`] of the baseline the
/// pass started from), and whether each is sent or only logged.
///
/// The deletes are counted in the order the executor confirms them; a
/// delete whose re-check fails takes no slot. In `log_only` a logged
/// delete takes a slot as a sent one would, so the log shows exactly what
/// `enabled` would send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeleteBudget {
    mode: DeleteMode,
    cap: usize,
    /// Deletes sent (or, in `log_only`, logged) so far.
    taken: usize,
    /// Deletes held over the cap so far.
    held: usize,
}

impl DeleteBudget {
    /// The budget of a pass over a store whose baseline holds
    /// `baseline_len` paths when the pass is planned.
    pub(crate) fn new(mode: DeleteMode, baseline_len: usize) -> DeleteBudget {
        DeleteBudget {
            mode,
            cap: delete_cap(baseline_len),
            taken: 0,
            held: 0,
        }
    }

    /// The verdict on the next confirmed delete, which takes its slot.
    pub(crate) fn take(&mut self) -> DeleteVerdict {
        if self.mode == DeleteMode::Disabled {
            return DeleteVerdict::Suppressed;
        }
        if self.taken >= self.cap {
            self.held += 1;
            return DeleteVerdict::OverCap;
        }
        self.taken += 1;
        match self.mode {
            DeleteMode::LogOnly => DeleteVerdict::LogOnly,
            _ => DeleteVerdict::Send,
        }
    }

    /// Deletes held over the cap in this pass.
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// Deletes only logged in this pass (`log_only`; zero otherwise).
    pub(crate) fn logged(&self) -> usize {
        if self.mode == DeleteMode::LogOnly {
            self.taken
        } else {
            0
        }
    }

    /// When the cap held deletes back: the verb for what the pass did with
    /// the deletes under the cap ("sent", or "would send" in `log_only`),
    /// how many those were, and how many were held.
    pub(crate) fn cap_reached(&self) -> Option<(&'static str, usize, usize)> {
        if self.held == 0 {
            return None;
        }
        let verb = if self.mode == DeleteMode::LogOnly {
            "would send"
        } else {
            "sent"
        };
        Some((verb, self.taken, self.held))
    }
}

/// Which operation asks whether to trust the store folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FolderOp {
    /// A sync pass.
    Sync,
    /// The push-only flush.
    Flush,
    /// The removal of the folder at the end of the session.
    Dispose,
}

/// What the scan (and, for a sync, the listing) says of the whole folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FolderFacts {
    pub(crate) op: FolderOp,
    /// The root itself could not be read.
    pub(crate) root_unreadable: bool,
    /// `None` when the marker names this store; otherwise why not, in words
    /// fit for the log.
    pub(crate) distrust: Option<&'static str>,
    /// Files the scan read (the marker not counted).
    pub(crate) files: usize,
    /// Paths the scan could not read.
    pub(crate) unreadable: usize,
    /// The baseline's size once the listing has settled the uploads whose
    /// answer never came; `None` before the store is listed.
    pub(crate) baseline: Option<usize>,
}

/// Why a sync re-downloads the folder instead of syncing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recovery {
    /// The marker is not ours and the folder holds no file.
    MarkerGone,
    /// Every file vanished at once from a baseline of more than one.
    Wipe,
}

impl Recovery {
    /// The reason, as the log says it.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Recovery::MarkerGone => "the folder or its marker is gone",
            Recovery::Wipe => "every memory file is gone at once",
        }
    }
}

/// What to do with the folder as a whole, before any path is planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FolderVerdict {
    /// Go on: plan the paths (a sync lists the store first and asks again
    /// with the baseline), push the edits, or remove the folder.
    Proceed,
    /// Nothing can be told: do nothing, and say nothing more (the scan
    /// warned once already).
    Skip,
    /// The folder is not ours (the reason says why): leave it as found —
    /// no sync, no push, no removal.
    LeaveAlone(&'static str),
    /// Re-download the store into the folder instead of syncing.
    Recover(Recovery),
}

/// Whether the folder as a whole can be trusted, and what to do if not.
///
/// - **Sync.** The root cannot be read → skip: nothing can be told, so
///   nothing is done, not even a recovery. The marker is not ours and
///   files are present → leave the folder as found and do not sync (the
///   server copy is intact; deleting the folder recovers). The marker is
///   not ours and the folder is empty → recover (re-download). Once
///   listed: no file left at all, none unreadable, and the baseline held
///   more than one entry → recover: every file gone at once is a wipe, not
///   a deletion — while a file the scan could not read is unknown, not gone.
/// - **Flush.** The marker is not ours → push nothing (whatever the folder
///   holds).
/// - **Dispose.** The marker is not ours and files are present → leave the
///   folder on disk; an empty folder is removed whatever its marker says.
pub(crate) fn plan_folder(f: FolderFacts) -> FolderVerdict {
    match f.op {
        FolderOp::Sync => {
            if f.root_unreadable {
                return FolderVerdict::Skip;
            }
            if let Some(reason) = f.distrust {
                if f.files > 0 {
                    return FolderVerdict::LeaveAlone(reason);
                }
                return FolderVerdict::Recover(Recovery::MarkerGone);
            }
            if f.files == 0 && f.unreadable == 0 && f.baseline.is_some_and(|n| n > 1) {
                return FolderVerdict::Recover(Recovery::Wipe);
            }
            FolderVerdict::Proceed
        }
        FolderOp::Flush => match f.distrust {
            Some(reason) => FolderVerdict::LeaveAlone(reason),
            None => FolderVerdict::Proceed,
        },
        FolderOp::Dispose => match f.distrust {
            Some(reason) if f.files > 0 => FolderVerdict::LeaveAlone(reason),
            _ => FolderVerdict::Proceed,
        },
    }
}

/// What the flush knows of one scanned file before it lists the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DirtyFacts<'a> {
    /// The file's hash on disk.
    pub(crate) local: &'a str,
    /// The confirmed baseline entry (not a tentative one).
    pub(crate) baseline: Option<&'a str>,
    /// An upload of this path whose answer never came.
    pub(crate) sent: bool,
    /// A hash the server refused for this path.
    pub(crate) refused: Option<&'a str>,
}

/// Is this scanned file one the flush must look at? It is when it differs
/// from its confirmed baseline, or an upload of it was never answered —
/// unless the server refused exactly these bytes already.
pub(crate) fn flush_dirty(f: DirtyFacts<'_>) -> bool {
    (f.baseline != Some(f.local) || f.sent) && f.refused != Some(f.local)
}

/// The store as the flush sees one dirty path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlushRemote<'a> {
    /// The store was listed: the memory at the path, if any.
    Listed(Option<Listed<'a>>),
    /// The store could not be listed: the memory id known from the last
    /// listing or upload, if any.
    Unlisted { known_id: Option<&'a str> },
}

/// Everything the flush knows of one dirty path once it tried to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlushFacts<'a> {
    /// The file's hash on disk.
    pub(crate) local: &'a str,
    /// The confirmed baseline entry (after the listing settled the sends).
    pub(crate) baseline: Option<&'a str>,
    /// The tentative entry a re-download left, if any.
    pub(crate) tentative: Option<&'a str>,
    pub(crate) remote: FlushRemote<'a>,
}

/// What the flush does with one dirty path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FlushDecision {
    /// Nothing to push: the file holds its base.
    Done,
    /// The server already holds the file's bytes: they enter the baseline.
    Adopt,
    /// Changed on both sides: the flush leaves the remote version (a
    /// warning, and a conflict counted).
    Conflict,
    /// Push the file: an update of `(id, expected hash)`, or a create.
    Upload { update: Option<(String, String)> },
}

/// The flush's rules for one dirty path (push-only: it never pulls or
/// deletes).
///
/// The base is the confirmed baseline, or else the tentative one a
/// re-download left, so an edit is never taken for a conflict. The memory
/// the edit is judged against is the listed one; when the store could not
/// be listed, it is the known id guarded by the base (the server refuses
/// the update with 409 only if another writer changed it since), and with
/// no id or no base the file is created.
///
/// - The file holds its base → done (an unsettled send that never landed,
///   or unchanged since the tentative baseline).
/// - The memory holds the file's bytes → adopt them into the baseline.
/// - The memory differs from the base → a conflict: leave the remote
///   version.
/// - Otherwise → upload: an update guarded by the memory's hash, or a
///   create when there is no memory.
pub(crate) fn plan_flush(f: FlushFacts<'_>) -> FlushDecision {
    let base = f.baseline.or(f.tentative);
    if base == Some(f.local) {
        return FlushDecision::Done;
    }
    let existing = match f.remote {
        FlushRemote::Listed(listed) => listed.map(|m| (m.id, m.sha)),
        FlushRemote::Unlisted { known_id } => base.and_then(|b| known_id.map(|id| (id, b))),
    };
    match existing {
        Some((_, sha)) if sha == f.local => FlushDecision::Adopt,
        Some((_, sha)) if Some(sha) != base => FlushDecision::Conflict,
        _ => FlushDecision::Upload {
            update: existing.map(|(id, sha)| (id.to_string(), sha.to_string())),
        },
    }
}

#[cfg(test)]
mod tests {
    //! The planner's rules as data: one row per case — the path's facts, the
    //! pass's options, the plan expected — and one test that runs every row
    //! and names each row that fails (in the style of Mutagen's reconcile
    //! tests). A row holds under every combination of the option values it
    //! lists, so "any access mode" is one row, not six.

    use super::*;
    use DeleteMode::{Disabled, Enabled, LogOnly};

    /// The executor's shortcut ([`settled`]) skips a path only where the
    /// planner would leave it exactly as it is: for every combination of
    /// facts and options, a settled path with no pending delete and no
    /// tentative baseline plans to keep its bytes, with no note and no new
    /// delete window.
    #[test]
    fn a_settled_path_is_one_the_planner_keeps() {
        let shas = [None, Some(V1), Some(V2)];
        let now = Instant::now();
        let (mut skipped, mut failures) = (0, Vec::new());
        for local in shas {
            for baseline in shas {
                for remote in shas {
                    if !settled(local, baseline, remote) {
                        continue;
                    }
                    for refused in shas {
                        for (read_only, deletions, final_sync) in
                            ANY_ACCESS.iter().flat_map(|&ro| {
                                ANY_MODE
                                    .iter()
                                    .flat_map(move |&m| ANY_SYNC.iter().map(move |&f| (ro, m, f)))
                            })
                        {
                            skipped += 1;
                            let facts = PathFacts {
                                local,
                                baseline,
                                remote: remote.map(|sha| Listed { id: ID, sha }),
                                refused,
                                missing_since: None,
                                tentative: false,
                                unreadable: false,
                            };
                            let pass = PassFacts {
                                read_only,
                                deletions,
                                final_sync,
                                now,
                            };
                            let got = plan(facts, pass);
                            let kept = got.decision == Decision::Keep(local.unwrap().into())
                                && got.note.is_none()
                                && !matches!(got.pending, Pending::Since(_));
                            if !kept {
                                failures.push(format!("{facts:?} {pass:?} → {got:?}"));
                            }
                        }
                    }
                }
            }
        }
        assert!(skipped > 0, "no settled case was checked");
        assert!(
            failures.is_empty(),
            "settled but not kept:\n{}",
            failures.join("\n")
        );
        // And nothing unsettled is called settled.
        assert!(!settled(Some(V1), Some(V1), Some(V2)));
        assert!(!settled(Some(V1), Some(V2), Some(V2)));
        assert!(!settled(None, Some(V1), Some(V1)));
        assert!(!settled(Some(V1), None, Some(V1)));
        assert!(!settled(Some(V1), Some(V1), None));
    }

    const V1: &str = "sha-v1";
    const V2: &str = "sha-v2";
    const V3: &str = "sha-v3";
    const ID: &str = "mem_1";

    // Times are offsets from the run's start: an `Instant` is no constant.
    const T0: Duration = Duration::ZERO;
    const WINDOW: Duration = DELETE_CORROBORATION;
    const JUST_BEFORE: Duration = DELETE_CORROBORATION.saturating_sub(Duration::from_millis(1));

    const ANY_ACCESS: &[bool] = &[false, true];
    const WRITABLE: &[bool] = &[false];
    const READ_ONLY: &[bool] = &[true];
    const ANY_MODE: &[DeleteMode] = &[Enabled, LogOnly, Disabled];
    /// The modes in which a corroborated deletion is planned (whether it is
    /// sent or only logged is the budget's verdict: see `BUDGET`).
    const DELETING: &[DeleteMode] = &[Enabled, LogOnly];
    const ANY_SYNC: &[bool] = &[false, true];
    const NOT_FINAL: &[bool] = &[false];
    const FINAL: &[bool] = &[true];
    /// The first pass and one a whole window later: the plan does not
    /// depend on the clock.
    const ANY_TIME: &[Duration] = &[T0, WINDOW];

    /// One run of a table: every row checked, every failure collected, so
    /// one run names every broken row (and a name used twice).
    struct Run {
        /// What the table's rows are, for the verdict ("planned", "budget").
        what: &'static str,
        names: std::collections::HashSet<&'static str>,
        failures: Vec<String>,
        checked: usize,
    }

    impl Run {
        fn new(what: &'static str) -> Run {
            Run {
                what,
                names: std::collections::HashSet::new(),
                failures: Vec::new(),
                checked: 0,
            }
        }

        /// A row begins: its name must be its own.
        fn row(&mut self, name: &'static str) {
            if !self.names.insert(name) {
                self.fail(format!("{name}: the name is used twice"));
            }
        }

        fn fail(&mut self, failure: String) {
            self.failures.push(failure);
        }

        /// One checked case, `label` naming the row (and its options).
        fn check<T: PartialEq + std::fmt::Debug>(
            &mut self,
            label: &dyn std::fmt::Display,
            got: T,
            want: T,
        ) {
            self.checked += 1;
            if got != want {
                self.fail(format!("{label}:\n    got  {got:?}\n    want {want:?}"));
            }
        }

        fn finish(self) {
            assert!(
                self.failures.is_empty(),
                "{} of {} {} cases failed:\n{}",
                self.failures.len(),
                self.checked,
                self.what,
                self.failures.join("\n")
            );
        }
    }

    /// The expected decision, with borrowed hashes so a row is a constant.
    #[derive(Debug, Clone, Copy)]
    enum Want {
        Forget,
        Keep(&'static str),
        /// Pull, keeping this baseline until the pull lands.
        Pull(Option<&'static str>),
        /// An update of memory `ID` guarded by this listed hash, which is
        /// also the baseline if the upload fails.
        Update(&'static str),
        Create,
        RemoveLocal(&'static str),
        /// Delete memory `ID` guarded by this baseline.
        Delete(&'static str),
        HoldDelete(&'static str),
    }

    impl Want {
        fn decision(self) -> Decision {
            match self {
                Want::Forget => Decision::Forget,
                Want::Keep(sha) => Decision::Keep(sha.into()),
                Want::Pull(keep) => Decision::Pull { keep: owned(keep) },
                Want::Update(sha) => Decision::Upload {
                    update: Some((ID.into(), sha.into())),
                    fallback: Some(sha.into()),
                },
                Want::Create => Decision::Upload {
                    update: None,
                    fallback: None,
                },
                Want::RemoveLocal(base) => Decision::RemoveLocal { base: base.into() },
                Want::Delete(base) => Decision::Delete {
                    id: ID.into(),
                    base: base.into(),
                },
                Want::HoldDelete(base) => Decision::HoldDelete { base: base.into() },
            }
        }
    }

    /// The expected pending-delete record.
    #[derive(Debug, Clone, Copy)]
    enum Pend {
        Unchanged,
        Clear,
        /// Missing since this offset from the start.
        Since(Duration),
    }

    impl Pend {
        fn at(self, start: Instant) -> Pending {
            match self {
                Pend::Unchanged => Pending::Unchanged,
                Pend::Clear => Pending::Clear,
                Pend::Since(offset) => Pending::Since(start + offset),
            }
        }
    }

    /// One case. Hashes are `None` where the side has nothing: `local` on
    /// disk, `baseline` at the last sync, `remote` on the server (memory `ID`).
    #[derive(Debug, Clone, Copy)]
    struct Case {
        name: &'static str,
        // The path's facts.
        local: Option<&'static str>,
        baseline: Option<&'static str>,
        remote: Option<&'static str>,
        refused: Option<&'static str>,
        missing_since: Option<Duration>,
        tentative: bool,
        unreadable: bool,
        // The pass's options: the row holds for every combination.
        read_only: &'static [bool],
        deletions: &'static [DeleteMode],
        final_sync: &'static [bool],
        now: &'static [Duration],
        // The plan.
        decision: Want,
        pending: Pend,
        note: Option<Note>,
    }

    /// What a row leaves out: nothing known, any options, forget.
    const CASE: Case = Case {
        name: "",
        local: None,
        baseline: None,
        remote: None,
        refused: None,
        missing_since: None,
        tentative: false,
        unreadable: false,
        read_only: ANY_ACCESS,
        deletions: ANY_MODE,
        final_sync: ANY_SYNC,
        now: ANY_TIME,
        decision: Want::Forget,
        pending: Pend::Unchanged,
        note: None,
    };

    /// The sync matrix: disk and server each unchanged, edited or deleted
    /// since a shared baseline `V1` (an edit on both sides differs: `V2`
    /// here, `V3` there).
    const MATRIX: &[Case] = &[
        Case {
            name: "unchanged both sides: keep",
            local: Some(V1),
            baseline: Some(V1),
            remote: Some(V1),
            decision: Want::Keep(V1),
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "edited here, unchanged there: upload guarded by the listed hash",
            local: Some(V2),
            baseline: Some(V1),
            remote: Some(V1),
            read_only: WRITABLE,
            decision: Want::Update(V1),
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "edited here, unchanged there, read-only: never uploaded",
            local: Some(V2),
            baseline: Some(V1),
            remote: Some(V1),
            read_only: READ_ONLY,
            decision: Want::Keep(V1),
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "unchanged here, edited there: pull",
            local: Some(V1),
            baseline: Some(V1),
            remote: Some(V2),
            decision: Want::Pull(Some(V1)),
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "edited both sides: pull, the server wins with a warning",
            local: Some(V2),
            baseline: Some(V1),
            remote: Some(V3),
            decision: Want::Pull(Some(V1)),
            pending: Pend::Clear,
            note: Some(Note::BothChanged),
            ..CASE
        },
        Case {
            name: "deleted here, unchanged there: the first miss starts the window",
            baseline: Some(V1),
            remote: Some(V1),
            read_only: WRITABLE,
            deletions: DELETING,
            final_sync: NOT_FINAL,
            now: &[T0],
            decision: Want::HoldDelete(V1),
            pending: Pend::Since(T0),
            ..CASE
        },
        Case {
            name: "deleted here, unchanged there: held inside the window, the first miss kept",
            baseline: Some(V1),
            remote: Some(V1),
            missing_since: Some(T0),
            read_only: WRITABLE,
            deletions: DELETING,
            final_sync: NOT_FINAL,
            now: &[T0, JUST_BEFORE],
            decision: Want::HoldDelete(V1),
            pending: Pend::Since(T0),
            ..CASE
        },
        Case {
            name: "deleted here, unchanged there: deleted on the server once the window passed",
            baseline: Some(V1),
            remote: Some(V1),
            missing_since: Some(T0),
            read_only: WRITABLE,
            deletions: DELETING,
            now: &[WINDOW],
            decision: Want::Delete(V1),
            pending: Pend::Since(T0),
            ..CASE
        },
        Case {
            name: "deleted here, unchanged there: the final sync waives the window",
            baseline: Some(V1),
            remote: Some(V1),
            read_only: WRITABLE,
            deletions: DELETING,
            final_sync: FINAL,
            now: &[T0],
            decision: Want::Delete(V1),
            pending: Pend::Since(T0),
            ..CASE
        },
        Case {
            name: "deleted here, unchanged there, deletions disabled: held with a note, even at the final sync",
            baseline: Some(V1),
            remote: Some(V1),
            read_only: WRITABLE,
            deletions: &[Disabled],
            decision: Want::HoldDelete(V1),
            pending: Pend::Unchanged,
            note: Some(Note::DeleteSuppressed),
            ..CASE
        },
        Case {
            name: "deleted here, unchanged there, read-only: neither deleted nor restored",
            baseline: Some(V1),
            remote: Some(V1),
            read_only: READ_ONLY,
            now: &[T0, JUST_BEFORE, WINDOW],
            decision: Want::Keep(V1),
            pending: Pend::Unchanged,
            ..CASE
        },
        Case {
            name: "unchanged here, deleted there: remove the file after a re-check",
            local: Some(V1),
            baseline: Some(V1),
            decision: Want::RemoveLocal(V1),
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "deleted both sides: forget",
            baseline: Some(V1),
            decision: Want::Forget,
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "deleted here, edited there: restore",
            baseline: Some(V1),
            remote: Some(V2),
            decision: Want::Pull(Some(V1)),
            pending: Pend::Clear,
            note: Some(Note::RestoredRemote),
            ..CASE
        },
        Case {
            name: "deleted here while a delete was pending, edited there: restore, the record cleared",
            baseline: Some(V1),
            remote: Some(V2),
            missing_since: Some(T0),
            decision: Want::Pull(Some(V1)),
            pending: Pend::Clear,
            note: Some(Note::RestoredRemote),
            ..CASE
        },
        Case {
            name: "edited here, deleted there: the only copy re-creates the memory",
            local: Some(V2),
            baseline: Some(V1),
            read_only: WRITABLE,
            decision: Want::Create,
            pending: Pend::Clear,
            note: Some(Note::Recreating),
            ..CASE
        },
        Case {
            name: "edited here, deleted there, read-only: the file is kept unsynced",
            local: Some(V2),
            baseline: Some(V1),
            read_only: READ_ONLY,
            decision: Want::Forget,
            pending: Pend::Clear,
            note: Some(Note::ReadOnlyKeepsEdit),
            ..CASE
        },
    ];

    /// New files and memories, adoption, and the server's refusals.
    const ADOPT_AND_REFUSE: &[Case] = &[
        Case {
            name: "the file already holds the server's new bytes: adopt, no fetch",
            local: Some(V2),
            baseline: Some(V1),
            remote: Some(V2),
            decision: Want::Keep(V2),
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "a new file: created",
            local: Some(V1),
            read_only: WRITABLE,
            decision: Want::Create,
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "a new file, read-only: ignored",
            local: Some(V1),
            read_only: READ_ONLY,
            decision: Want::Forget,
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "a refused new file: not offered again",
            local: Some(V1),
            refused: Some(V1),
            decision: Want::Forget,
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "a refused new file edited since: offered again",
            local: Some(V2),
            refused: Some(V1),
            read_only: WRITABLE,
            decision: Want::Create,
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "a refused edit: the listed hash is kept",
            local: Some(V2),
            baseline: Some(V1),
            remote: Some(V1),
            refused: Some(V2),
            decision: Want::Keep(V1),
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "a refused edit edited again: offered again",
            local: Some(V3),
            baseline: Some(V1),
            remote: Some(V1),
            refused: Some(V2),
            read_only: WRITABLE,
            decision: Want::Update(V1),
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "a refused edit, edited on the server: pull, the server wins",
            local: Some(V2),
            baseline: Some(V1),
            remote: Some(V3),
            refused: Some(V2),
            decision: Want::Pull(Some(V1)),
            pending: Pend::Clear,
            note: Some(Note::BothChanged),
            ..CASE
        },
        Case {
            name: "a refused edit the server deleted: not re-created, not announced",
            local: Some(V2),
            baseline: Some(V1),
            refused: Some(V2),
            read_only: WRITABLE,
            decision: Want::Forget,
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "a new memory: pulled, no baseline until it lands",
            remote: Some(V1),
            decision: Want::Pull(None),
            pending: Pend::Unchanged,
            ..CASE
        },
        Case {
            name: "a file back on disk clears its pending delete",
            local: Some(V1),
            baseline: Some(V1),
            remote: Some(V1),
            missing_since: Some(T0),
            decision: Want::Keep(V1),
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "gone everywhere with a pending delete: forgotten, the record cleared",
            missing_since: Some(T0),
            decision: Want::Forget,
            pending: Pend::Clear,
            ..CASE
        },
    ];

    /// A path the scan could not read is unknown, not missing.
    const UNREADABLE: &[Case] = &[
        Case {
            name: "unreadable, unchanged on the server: kept, never deleted, even past the window",
            baseline: Some(V1),
            remote: Some(V1),
            missing_since: Some(T0),
            unreadable: true,
            decision: Want::Keep(V1),
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "unreadable, edited on the server: not pulled over the unknown file",
            baseline: Some(V1),
            remote: Some(V2),
            missing_since: Some(T0),
            unreadable: true,
            decision: Want::Keep(V1),
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "unreadable, deleted on the server: nothing removed locally",
            baseline: Some(V1),
            missing_since: Some(T0),
            unreadable: true,
            decision: Want::Keep(V1),
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "unreadable: a new memory is not pulled into it",
            remote: Some(V1),
            unreadable: true,
            decision: Want::Forget,
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "unreadable: a tentative baseline is not made a real one",
            baseline: Some(V1),
            remote: Some(V1),
            missing_since: Some(T0),
            tentative: true,
            unreadable: true,
            decision: Want::Forget,
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "unreadable, but the scan read the file: planned as usual",
            local: Some(V2),
            baseline: Some(V1),
            remote: Some(V1),
            unreadable: true,
            read_only: WRITABLE,
            decision: Want::Update(V1),
            pending: Pend::Clear,
            ..CASE
        },
    ];

    /// A tentative baseline (from before a re-download that did not
    /// re-establish it) tells an edit from a conflict, never a deletion.
    const TENTATIVE: &[Case] = &[
        Case {
            name: "tentative, unchanged both sides: keep",
            local: Some(V1),
            baseline: Some(V1),
            remote: Some(V1),
            tentative: true,
            decision: Want::Keep(V1),
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "tentative, edited here, unchanged there: an upload, not a conflict",
            local: Some(V2),
            baseline: Some(V1),
            remote: Some(V1),
            tentative: true,
            read_only: WRITABLE,
            decision: Want::Update(V1),
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "tentative, unchanged here, edited there: pull",
            local: Some(V1),
            baseline: Some(V1),
            remote: Some(V2),
            tentative: true,
            decision: Want::Pull(Some(V1)),
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "tentative, edited both sides: pull, the server wins",
            local: Some(V2),
            baseline: Some(V1),
            remote: Some(V3),
            tentative: true,
            decision: Want::Pull(Some(V1)),
            pending: Pend::Clear,
            note: Some(Note::BothChanged),
            ..CASE
        },
        Case {
            name: "tentative, deleted here, unchanged there: restored, never a delete candidate",
            baseline: Some(V1),
            remote: Some(V1),
            tentative: true,
            decision: Want::Pull(None),
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "tentative, deleted here, edited there: restored",
            baseline: Some(V1),
            remote: Some(V2),
            tentative: true,
            decision: Want::Pull(None),
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "tentative, unchanged here, deleted there: a new file, never a local removal",
            local: Some(V1),
            baseline: Some(V1),
            tentative: true,
            read_only: WRITABLE,
            decision: Want::Create,
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "tentative, edited here, deleted there: a new file, no re-creation warning",
            local: Some(V2),
            baseline: Some(V1),
            tentative: true,
            read_only: WRITABLE,
            decision: Want::Create,
            pending: Pend::Clear,
            ..CASE
        },
        Case {
            name: "tentative, deleted both sides: forget",
            baseline: Some(V1),
            tentative: true,
            decision: Want::Forget,
            pending: Pend::Clear,
            ..CASE
        },
    ];

    const TABLES: &[&[Case]] = &[MATRIX, ADOPT_AND_REFUSE, UNREADABLE, TENTATIVE];

    /// Every row under every combination of its options; every failure is
    /// collected, so one run names every broken row.
    #[test]
    fn every_case_plans_as_the_table_says() {
        let start = Instant::now();
        let mut run = Run::new("planned");
        for case in TABLES.iter().flat_map(|t| t.iter()) {
            run.row(case.name);
            let want = Plan {
                decision: case.decision.decision(),
                pending: case.pending.at(start),
                note: case.note,
            };
            let mut combinations = 0;
            for &read_only in case.read_only {
                for &deletions in case.deletions {
                    for &final_sync in case.final_sync {
                        for &now in case.now {
                            let facts = PathFacts {
                                local: case.local,
                                baseline: case.baseline,
                                remote: case.remote.map(|sha| Listed { id: ID, sha }),
                                refused: case.refused,
                                missing_since: case.missing_since.map(|t| start + t),
                                tentative: case.tentative,
                                unreadable: case.unreadable,
                            };
                            let pass = PassFacts {
                                read_only,
                                deletions,
                                final_sync,
                                now: start + now,
                            };
                            combinations += 1;
                            run.check(
                                &format_args!(
                                    "{} (read_only={read_only} {deletions:?} \
                                     final_sync={final_sync} now=+{now:?})",
                                    case.name
                                ),
                                plan(facts, pass),
                                want.clone(),
                            );
                        }
                    }
                }
            }
            if combinations == 0 {
                run.fail(format!("{}: no combination of options", case.name));
            }
        }
        run.finish();
    }

    /// One pass's delete budget: the mode, the baseline the pass started
    /// from, how many deletes passed their re-check (in order), and what
    /// the budget says of each.
    #[derive(Debug, Clone, Copy)]
    struct BudgetCase {
        name: &'static str,
        mode: DeleteMode,
        baseline_len: usize,
        confirmed: usize,
        /// The verdicts in order, run-length encoded: (verdict, how many).
        verdicts: &'static [(DeleteVerdict, usize)],
        logged: usize,
        held: usize,
        /// The cap warning's verb and counts, if the cap held any back.
        cap_reached: Option<(&'static str, usize, usize)>,
    }

    const BUDGET: &[BudgetCase] = {
        use DeleteVerdict::{LogOnly as Logged, OverCap, Send, Suppressed};
        &[
            BudgetCase {
                name: "enabled, no delete: nothing to report",
                mode: Enabled,
                baseline_len: 4,
                confirmed: 0,
                verdicts: &[],
                logged: 0,
                held: 0,
                cap_reached: None,
            },
            BudgetCase {
                name: "enabled, under the cap: every delete is sent",
                mode: Enabled,
                baseline_len: 4,
                confirmed: 8,
                verdicts: &[(Send, 8)],
                logged: 0,
                held: 0,
                cap_reached: None,
            },
            BudgetCase {
                name: "enabled, cap reached (at least 8): the rest held for later passes",
                mode: Enabled,
                baseline_len: 4,
                confirmed: 11,
                verdicts: &[(Send, 8), (OverCap, 3)],
                logged: 0,
                held: 3,
                cap_reached: Some(("sent", 8, 3)),
            },
            BudgetCase {
                name: "enabled, cap reached (a quarter of the baseline)",
                mode: Enabled,
                baseline_len: 40,
                confirmed: 12,
                verdicts: &[(Send, 10), (OverCap, 2)],
                logged: 0,
                held: 2,
                cap_reached: Some(("sent", 10, 2)),
            },
            BudgetCase {
                name: "enabled, cap reached (at most 50)",
                mode: Enabled,
                baseline_len: 2_000,
                confirmed: 51,
                verdicts: &[(Send, 50), (OverCap, 1)],
                logged: 0,
                held: 1,
                cap_reached: Some(("sent", 50, 1)),
            },
            BudgetCase {
                name: "log_only, under the cap: every delete only logged",
                mode: LogOnly,
                baseline_len: 4,
                confirmed: 3,
                verdicts: &[(Logged, 3)],
                logged: 3,
                held: 0,
                cap_reached: None,
            },
            BudgetCase {
                name: "log_only, cap reached: the cap counts logged deletes as sent ones",
                mode: LogOnly,
                baseline_len: 4,
                confirmed: 10,
                verdicts: &[(Logged, 8), (OverCap, 2)],
                logged: 8,
                held: 2,
                cap_reached: Some(("would send", 8, 2)),
            },
            BudgetCase {
                name: "disabled: nothing sent, logged or held, whatever the count",
                mode: Disabled,
                baseline_len: 4,
                confirmed: 60,
                verdicts: &[(Suppressed, 60)],
                logged: 0,
                held: 0,
                cap_reached: None,
            },
        ]
    };

    /// Every budget row; every failure collected, each row named.
    #[test]
    fn every_budget_case_counts_as_the_table_says() {
        let mut run = Run::new("budget");
        for case in BUDGET {
            run.row(case.name);
            let want: Vec<DeleteVerdict> = case
                .verdicts
                .iter()
                .flat_map(|&(v, n)| std::iter::repeat_n(v, n))
                .collect();
            let mut budget = DeleteBudget::new(case.mode, case.baseline_len);
            let got: Vec<DeleteVerdict> = (0..case.confirmed).map(|_| budget.take()).collect();
            let got = (got, budget.logged(), budget.held(), budget.cap_reached());
            let want = (want, case.logged, case.held, case.cap_reached);
            run.check(&case.name, got, want);
        }
        run.finish();
    }

    /// One judgement of the whole folder: the operation(s) asking, what
    /// the scan (and for a sync the listing) says, and the verdict.
    #[derive(Debug, Clone, Copy)]
    struct FolderCase {
        name: &'static str,
        /// The row holds for each of these operations.
        ops: &'static [FolderOp],
        root_unreadable: bool,
        distrust: Option<&'static str>,
        files: usize,
        unreadable: usize,
        baseline: Option<usize>,
        want: FolderVerdict,
    }

    const GONE: &str = "the marker file is gone";
    const ALL_OPS: &[FolderOp] = &[FolderOp::Sync, FolderOp::Flush, FolderOp::Dispose];
    const SYNC: &[FolderOp] = &[FolderOp::Sync];
    const FLUSH: &[FolderOp] = &[FolderOp::Flush];
    const DISPOSE: &[FolderOp] = &[FolderOp::Dispose];

    /// What a folder row leaves out: a trusted, readable folder holding
    /// files, not yet listed.
    const FOLDER: FolderCase = FolderCase {
        name: "",
        ops: ALL_OPS,
        root_unreadable: false,
        distrust: None,
        files: 3,
        unreadable: 0,
        baseline: None,
        want: FolderVerdict::Proceed,
    };

    const FOLDERS: &[FolderCase] = {
        use FolderVerdict::{LeaveAlone, Proceed, Recover, Skip};
        &[
            FolderCase {
                name: "our marker, files present: proceed",
                baseline: Some(3),
                ..FOLDER
            },
            FolderCase {
                name: "sync, root unreadable: nothing done, not even a wipe recovery",
                ops: SYNC,
                root_unreadable: true,
                files: 0,
                baseline: Some(5),
                want: Skip,
                ..FOLDER
            },
            FolderCase {
                name: "sync, root unreadable and no marker: nothing done, not even a re-download",
                ops: SYNC,
                root_unreadable: true,
                distrust: Some(GONE),
                files: 0,
                want: Skip,
                ..FOLDER
            },
            FolderCase {
                name: "sync, not our marker, files present: left as found, not synced",
                ops: SYNC,
                distrust: Some(GONE),
                want: LeaveAlone(GONE),
                ..FOLDER
            },
            FolderCase {
                name: "sync, not our marker, folder empty: re-downloaded",
                ops: SYNC,
                distrust: Some(GONE),
                files: 0,
                want: Recover(Recovery::MarkerGone),
                ..FOLDER
            },
            FolderCase {
                name: "sync, not our marker, only unreadable entries: re-downloaded",
                ops: SYNC,
                distrust: Some(GONE),
                files: 0,
                unreadable: 2,
                want: Recover(Recovery::MarkerGone),
                ..FOLDER
            },
            FolderCase {
                name: "sync, every file gone from a baseline of two: a wipe, re-downloaded",
                ops: SYNC,
                files: 0,
                baseline: Some(2),
                want: Recover(Recovery::Wipe),
                ..FOLDER
            },
            FolderCase {
                name: "sync, the only file gone: a deletion, not a wipe",
                ops: SYNC,
                files: 0,
                baseline: Some(1),
                want: Proceed,
                ..FOLDER
            },
            FolderCase {
                name: "sync, empty store, empty folder: proceed",
                ops: SYNC,
                files: 0,
                baseline: Some(0),
                want: Proceed,
                ..FOLDER
            },
            FolderCase {
                name: "sync, every readable file gone but one entry unreadable: unknown, not a wipe",
                ops: SYNC,
                files: 0,
                unreadable: 1,
                baseline: Some(5),
                want: Proceed,
                ..FOLDER
            },
            FolderCase {
                name: "sync, every file gone, not yet listed: the wipe waits for the listing",
                ops: SYNC,
                files: 0,
                baseline: None,
                want: Proceed,
                ..FOLDER
            },
            FolderCase {
                name: "flush, not our marker, files present: nothing pushed",
                ops: FLUSH,
                distrust: Some(GONE),
                want: LeaveAlone(GONE),
                ..FOLDER
            },
            FolderCase {
                name: "flush, not our marker, folder empty: nothing pushed, no re-download",
                ops: FLUSH,
                distrust: Some(GONE),
                files: 0,
                want: LeaveAlone(GONE),
                ..FOLDER
            },
            FolderCase {
                name: "flush and dispose, every file gone: no wipe recovery",
                ops: &[FolderOp::Flush, FolderOp::Dispose],
                files: 0,
                baseline: Some(5),
                want: Proceed,
                ..FOLDER
            },
            FolderCase {
                name: "flush and dispose, root unreadable under our marker: proceed",
                ops: &[FolderOp::Flush, FolderOp::Dispose],
                root_unreadable: true,
                files: 0,
                want: Proceed,
                ..FOLDER
            },
            FolderCase {
                name: "dispose, not our marker, files present: left on disk",
                ops: DISPOSE,
                distrust: Some(GONE),
                want: LeaveAlone(GONE),
                ..FOLDER
            },
            FolderCase {
                name: "dispose, not our marker, folder empty: removed",
                ops: DISPOSE,
                distrust: Some(GONE),
                files: 0,
                want: Proceed,
                ..FOLDER
            },
        ]
    };

    /// Every folder row under each operation it lists; every failure named.
    #[test]
    fn every_folder_case_judges_as_the_table_says() {
        let mut run = Run::new("folder");
        for case in FOLDERS {
            run.row(case.name);
            if case.ops.is_empty() {
                run.fail(format!("{}: no operation", case.name));
            }
            for &op in case.ops {
                let got = plan_folder(FolderFacts {
                    op,
                    root_unreadable: case.root_unreadable,
                    distrust: case.distrust,
                    files: case.files,
                    unreadable: case.unreadable,
                    baseline: case.baseline,
                });
                run.check(&format_args!("{} ({op:?})", case.name), got, case.want);
            }
        }
        run.finish();
    }

    /// The store as a flush row sees it.
    #[derive(Debug, Clone, Copy)]
    enum Store {
        /// Listed: memory `ID` with this hash, or no memory at the path.
        Listed(Option<&'static str>),
        /// Not listable; whether the id of memory `ID` is known.
        Unlisted { id_known: bool },
    }

    /// The expected flush decision.
    #[derive(Debug, Clone, Copy)]
    enum Flush {
        /// Not dirty: the flush does not look at the file.
        Clean,
        Done,
        Adopt,
        Conflict,
        /// An update of memory `ID` guarded by this hash.
        Update(&'static str),
        Create,
    }

    impl Flush {
        fn decision(self) -> Option<FlushDecision> {
            Some(match self {
                Flush::Clean => return None,
                Flush::Done => FlushDecision::Done,
                Flush::Adopt => FlushDecision::Adopt,
                Flush::Conflict => FlushDecision::Conflict,
                Flush::Update(sha) => FlushDecision::Upload {
                    update: Some((ID.into(), sha.into())),
                },
                Flush::Create => FlushDecision::Upload { update: None },
            })
        }
    }

    /// One scanned file in a flush: its hash on disk, the sync state, the
    /// store, and what the flush does with it.
    #[derive(Debug, Clone, Copy)]
    struct FlushCase {
        name: &'static str,
        local: &'static str,
        baseline: Option<&'static str>,
        tentative: Option<&'static str>,
        sent: bool,
        refused: Option<&'static str>,
        store: Store,
        want: Flush,
    }

    /// What a flush row leaves out: an edit `V2` of a file synced at `V1`,
    /// the store listed and unchanged.
    const FLUSHED: FlushCase = FlushCase {
        name: "",
        local: V2,
        baseline: Some(V1),
        tentative: None,
        sent: false,
        refused: None,
        store: Store::Listed(Some(V1)),
        want: Flush::Update(V1),
    };

    const FLUSHES: &[FlushCase] = &[
        FlushCase {
            name: "unchanged since the sync: not looked at",
            local: V1,
            want: Flush::Clean,
            ..FLUSHED
        },
        FlushCase {
            name: "unchanged, but an upload was never answered: looked at, nothing to push",
            local: V1,
            sent: true,
            want: Flush::Done,
            ..FLUSHED
        },
        FlushCase {
            name: "the bytes the server refused: not looked at",
            refused: Some(V2),
            want: Flush::Clean,
            ..FLUSHED
        },
        FlushCase {
            name: "the bytes the server refused, sent unanswered: the refusal wins",
            refused: Some(V2),
            sent: true,
            want: Flush::Clean,
            ..FLUSHED
        },
        FlushCase {
            name: "a refused file edited again: pushed",
            local: V3,
            refused: Some(V2),
            want: Flush::Update(V1),
            ..FLUSHED
        },
        FlushCase {
            name: "edited here, unchanged there: update guarded by the listed hash",
            ..FLUSHED
        },
        FlushCase {
            name: "the server already holds the edit: adopted",
            store: Store::Listed(Some(V2)),
            want: Flush::Adopt,
            ..FLUSHED
        },
        FlushCase {
            name: "edited both sides: a conflict, the remote version left",
            store: Store::Listed(Some(V3)),
            want: Flush::Conflict,
            ..FLUSHED
        },
        FlushCase {
            name: "edited here, deleted there: re-created",
            store: Store::Listed(None),
            want: Flush::Create,
            ..FLUSHED
        },
        FlushCase {
            name: "a new file: created",
            baseline: None,
            store: Store::Listed(None),
            want: Flush::Create,
            ..FLUSHED
        },
        FlushCase {
            name: "a new file where another writer created a memory: a conflict",
            baseline: None,
            store: Store::Listed(Some(V3)),
            want: Flush::Conflict,
            ..FLUSHED
        },
        FlushCase {
            name: "a new file the server already holds: adopted",
            baseline: None,
            store: Store::Listed(Some(V2)),
            want: Flush::Adopt,
            ..FLUSHED
        },
        FlushCase {
            name: "unchanged since the tentative baseline: looked at, nothing to push",
            local: V1,
            baseline: None,
            tentative: Some(V1),
            want: Flush::Done,
            ..FLUSHED
        },
        FlushCase {
            name: "edited since the tentative baseline: an update, not a conflict",
            baseline: None,
            tentative: Some(V1),
            want: Flush::Update(V1),
            ..FLUSHED
        },
        FlushCase {
            name: "the confirmed baseline is the base, not the tentative one",
            tentative: Some(V3),
            store: Store::Listed(Some(V3)),
            want: Flush::Conflict,
            ..FLUSHED
        },
        FlushCase {
            name: "unlisted, the id known: update guarded by the last synced hash",
            store: Store::Unlisted { id_known: true },
            want: Flush::Update(V1),
            ..FLUSHED
        },
        FlushCase {
            name: "unlisted, guarded by the tentative baseline when there is no other",
            baseline: None,
            tentative: Some(V1),
            store: Store::Unlisted { id_known: true },
            want: Flush::Update(V1),
            ..FLUSHED
        },
        FlushCase {
            name: "unlisted, the id unknown: created",
            store: Store::Unlisted { id_known: false },
            want: Flush::Create,
            ..FLUSHED
        },
        FlushCase {
            name: "unlisted, never synced: created",
            baseline: None,
            store: Store::Unlisted { id_known: true },
            want: Flush::Create,
            ..FLUSHED
        },
        FlushCase {
            name: "unlisted, an unanswered send of the synced bytes: nothing to push",
            local: V1,
            sent: true,
            store: Store::Unlisted { id_known: true },
            want: Flush::Done,
            ..FLUSHED
        },
    ];

    /// Every flush row through both stages (dirty, then the decision);
    /// every failure named.
    #[test]
    fn every_flush_case_pushes_as_the_table_says() {
        let mut run = Run::new("flush");
        for case in FLUSHES {
            run.row(case.name);
            let dirty = flush_dirty(DirtyFacts {
                local: case.local,
                baseline: case.baseline,
                sent: case.sent,
                refused: case.refused,
            });
            let got = dirty.then(|| {
                plan_flush(FlushFacts {
                    local: case.local,
                    baseline: case.baseline,
                    tentative: case.tentative,
                    remote: match case.store {
                        Store::Listed(sha) => {
                            FlushRemote::Listed(sha.map(|sha| Listed { id: ID, sha }))
                        }
                        Store::Unlisted { id_known } => FlushRemote::Unlisted {
                            known_id: id_known.then_some(ID),
                        },
                    },
                })
            });
            run.check(&case.name, got, case.want.decision());
        }
        run.finish();
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
