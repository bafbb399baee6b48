//! The execution of a pass's plan: the decisions' baseline entries
//! recorded at once, then the I/O — local removals, pulls, uploads,
//! corroborated deletes — each recorded the moment it completes.

use tracing::{debug, warn};

use crate::memory::plan::{Note, PassFacts};
use crate::memory::remote::MemoryApi;
use crate::memory::report::SyncReport;

use super::AttachedStore;
use super::work::Work;

impl AttachedStore {
    /// Carry out a pass's plan. The decisions' own baseline entries are
    /// recorded at once; each I/O records its entry the moment it completes.
    pub(super) async fn execute(
        &self,
        api: &dyn MemoryApi,
        work: Work,
        pass: PassFacts,
        stats: &mut SyncReport,
    ) {
        let Work {
            changes,
            pulls,
            mut uploads,
            removals,
            deletes,
            notes,
            suppressed,
            mut budget,
        } = work;
        for (rel, note) in notes {
            if note == Note::BothChanged {
                stats.conflicts += 1;
            }
            self.report(&rel, note);
        }
        for (rel, sha) in changes {
            self.record(rel, sha);
        }
        uploads.extend(self.remove_all(removals, pass).await);
        // Pulls before uploads: a backlog of uploads (an agent writing
        // faster than the server takes it) never holds back the server's
        // changes. Each path has one decision, so the order changes nothing
        // else.
        stats.pulls = self.pull_all(api, pulls).await;
        stats.uploads = self.upload_all(api, uploads).await;
        {
            let mut state = self.state();
            stats.refused = std::mem::take(&mut state.new_refusals);
            stats.conflicts += std::mem::take(&mut state.lost_uploads);
        }
        for (rel, id, base) in deletes {
            let kept = self
                .confirm_delete(api, &rel, &id, &base, &mut budget)
                .await;
            if kept.is_none() {
                stats.deletes += 1;
            }
            self.record(rel, kept);
        }
        stats.deletes_logged = budget.logged();
        stats.deletes_held = budget.held();
        if suppressed > 0 {
            debug!(
                memory_store.id = %self.id,
                count = suppressed,
                "remote deletes are disabled; locally deleted memories stay on the server"
            );
        }
        if let Some((verb, attempted, capped)) = budget.cap_reached() {
            warn!(
                memory_store.id = %self.id,
                "delete cap reached: {verb} {attempted} deletes, held {capped} for later syncs"
            );
        }
    }
}
