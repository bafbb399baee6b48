//! Pulls: each memory the server changed, fetched and written to the
//! folder, recorded as it lands.

use futures::{StreamExt, stream};
use tracing::warn;

use crate::memory::remote::MemoryApi;

use super::{AttachedStore, blocking};

/// Content fetches in flight at once in one store's pull pass.
const FETCH_CONCURRENCY: usize = 16;

impl AttachedStore {
    /// The content pass: fetch each pulled memory and write it,
    /// `FETCH_CONCURRENCY` at a time. Returns how many landed.
    pub(super) async fn pull_all(
        &self,
        api: &dyn MemoryApi,
        pulls: Vec<(String, String)>,
    ) -> usize {
        stream::iter(pulls)
            .map(|(rel, id)| self.pull(api, rel, id))
            .buffer_unordered(FETCH_CONCURRENCY)
            .filter(|ok| std::future::ready(*ok))
            .count()
            .await
    }

    /// Fetch memory `id` and write it at `rel`: whether it landed.
    async fn pull(&self, api: &dyn MemoryApi, rel: String, id: String) -> bool {
        let memory = match api.retrieve(&self.id, &id).await {
            Ok(m) => m,
            // Deleted after the listing: the next sync reconciles it.
            Err(e) if e.status() == Some(404) => return false,
            Err(e) => {
                warn!(memory_store.id = %self.id, memory.path = %rel, error = %e, "failed to fetch memory content");
                return false;
            }
        };
        let folder = self.folder.clone();
        let r = rel.clone();
        let content = memory.content.unwrap_or_default();
        match blocking(move || folder.put(&r, content.as_bytes())).await {
            Ok(Ok(())) => {
                crate::killpoint::hit("memory.pull.written");
                self.correct_index(&rel, &memory.id, &memory.content_sha256);
                let mut state = self.state();
                state.tentative.remove(&rel);
                state.baseline.insert(rel, memory.content_sha256);
                true
            }
            Ok(Err(e)) => {
                warn!(memory_store.id = %self.id, memory.path = %rel, error = %e, "failed to write memory");
                false
            }
            Err(e) => {
                warn!(memory_store.id = %self.id, memory.path = %rel, error = %e, "failed to write memory");
                false
            }
        }
    }
}
