//! One sync pass, wired: observe (scan the folder, list the store) → plan
//! (the folder's verdict, then each path's) → execute, each operation
//! committed to the baseline the moment it completes. A pass that would
//! plan from the very facts an idle one planned nothing from is skipped.

use std::sync::Arc;

use tokio::time::Instant;
use tracing::warn;

use crate::memory::options::DeleteMode;
use crate::memory::plan::{FolderFacts, FolderOp, FolderVerdict, PassFacts, plan_folder};
use crate::memory::remote::MemoryApi;
use crate::memory::report::SyncReport;

use super::index::RemoteMap;
use super::local::Marked;
use super::{AttachedStore, PassError};

impl AttachedStore {
    /// One pass: observe (scan the folder, list the store) → plan (the
    /// folder's verdict, then each path's) → execute, each operation
    /// committed to the baseline the moment it completes.
    pub(super) async fn try_sync(
        &self,
        api: &dyn MemoryApi,
        deletions: DeleteMode,
        final_sync: bool,
        stats: &mut SyncReport,
    ) -> Result<(), PassError> {
        let Some((scan, remote)) = self.observe(api, final_sync, stats).await? else {
            return Ok(());
        };

        // Nothing the plan reads has changed since a sync that planned
        // nothing at all (the same folder view, remote index and state, no
        // delete window running, no tentative baseline — the plan is a pure
        // function of those and the clock, which only a pending delete
        // reads): this one would plan nothing either. An idle sync of a
        // large store then costs no walk over its paths.
        // The paths the push's uploads carry are left to them (planned
        // again once they end).
        let flying = self.board.flying();
        let facts = self
            .plan_revisions(&scan, &remote)
            .filter(|_| flying.is_empty());
        if !final_sync && facts.is_some() && *self.quiet() == facts {
            return Ok(());
        }

        // Plan every path.
        let pass = PassFacts {
            read_only: self.read_only,
            deletions,
            final_sync,
            now: Instant::now(),
        };
        let work = self.plan_paths(&scan, &remote, pass, &flying);
        // Recorded only if the state did not move while planning.
        *self.quiet() = facts.filter(|f| work.is_empty() && self.state().revision == f.2);

        self.execute(api, work, pass, stats).await;

        // A tentative entry retires once the path has a real baseline, or
        // once the server no longer holds it.
        let mut guard = self.state();
        let state = &mut *guard;
        let baseline = &state.baseline;
        state
            .tentative
            .retain(|rel, _| !baseline.contains_key(rel) && remote.contains_key(rel));
        Ok(())
    }

    /// A sync's observation: the folder scanned and judged, then the store
    /// listed (or its index advanced) and the uploads without an answer
    /// settled against it, and the folder judged again with the baseline
    /// that settled. `None`: the folder's verdict ended the pass.
    async fn observe(
        &self,
        api: &dyn MemoryApi,
        final_sync: bool,
        stats: &mut SyncReport,
    ) -> Result<Option<(Marked, RemoteMap)>, PassError> {
        // The final sync scans whole, as every sync did before the watch.
        let scan = self.scan(final_sync).await?;
        stats.examined = scan.examined;
        stats.full_scans = usize::from(scan.full);
        let mut folder = scan.folder_facts(FolderOp::Sync);
        if !self.carry_out_folder_verdict(api, folder, stats).await? {
            return Ok(None);
        }
        // A file this scan saw is not missing, whatever happens to the rest of
        // the pass: a pass that fails after the scan still breaks a pending
        // delete's streak, so an absence is only corroborated by scans that
        // all saw it.
        self.state()
            .pending
            .retain(|rel, _| !scan.files.contains_key(rel));
        let remote = self.index(api, final_sync).await?;
        self.settle_sent(&remote, &scan.files);
        // Asked again with the baseline the listing settled: is this a wipe?
        folder.baseline = Some(self.state().baseline.len());
        if !self.carry_out_folder_verdict(api, folder, stats).await? {
            return Ok(None);
        }
        Ok(Some((scan, remote)))
    }

    /// Carry out a sync's verdict on the folder ([`plan_folder`]): `true`
    /// when the pass goes on.
    async fn carry_out_folder_verdict(
        &self,
        api: &dyn MemoryApi,
        facts: FolderFacts,
        stats: &mut SyncReport,
    ) -> Result<bool, PassError> {
        match plan_folder(facts) {
            FolderVerdict::Proceed => Ok(true),
            // The scan warned once already.
            FolderVerdict::Skip => Ok(false),
            FolderVerdict::LeaveAlone(reason) => {
                warn!(
                    memory_store.id = %self.id,
                    root = %self.folder.root().display(),
                    "{reason}; leaving the memory store folder as found and not syncing. Delete it to recover — the server copy is intact."
                );
                Ok(false)
            }
            FolderVerdict::Recover(why) => {
                stats.recovered = 1;
                self.recover(api, why.reason()).await?;
                Ok(false)
            }
        }
    }

    fn quiet(&self) -> std::sync::MutexGuard<'_, Option<(u64, u64, u64)>> {
        self.quiet.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next sync plans every path again, whatever it finds unchanged.
    pub(crate) fn forget_quiet(&self) {
        *self.quiet() = None;
    }

    /// What a sync plans from, as revisions: the folder view's, the remote
    /// index's (the feed's index this pass read), the state's. `None` when
    /// the plan also reads the clock (a delete window running) or a
    /// tentative baseline, or the remote map is not the feed's.
    fn plan_revisions(&self, scan: &Marked, remote: &RemoteMap) -> Option<(u64, u64, u64)> {
        let remote = self
            .remote_index()
            .as_ref()
            .filter(|index| Arc::ptr_eq(&index.map, remote))
            .map(|index| index.revision)?;
        let state = self.state();
        (state.pending.len() == 0 && state.tentative.len() == 0).then_some((
            scan.revision,
            remote,
            state.revision,
        ))
    }
}
