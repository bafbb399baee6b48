//! The download: the marker stamped, then every memory of the store
//! written to the folder — at mount, before the agent runs, and again when
//! a sync finds a folder it must rebuild (`recover`).

use std::collections::BTreeMap;

use futures::{StreamExt, stream};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::api::types::{IndexKind, MemoryIndexEntry, MemoryListItem, MemoryVersion, Page, View};
use crate::memory::folder::{Folder, FolderError, MARKER_PATH};
use crate::memory::remote::MemoryApi;

use super::index::newest_versions;
use super::marker::marker_content;
use super::{AttachedStore, PassError, blocking};

/// Prefixes listed at once by the mount.
const LIST_CONCURRENCY: usize = 8;
const FULL_PAGE: u32 = 20;

/// A download's write: private while nothing else can write to the folder
/// (see [`Folder::put_private`]).
fn put(folder: &Folder, rel: &str, data: &[u8], private: bool) -> Result<(), FolderError> {
    if private {
        folder.put_private(rel, data)
    } else {
        folder.put(rel, data)
    }
}

/// The reads a download starts with, in their order: the newest versions
/// (the feed's high-water, read before the listing: see `index`), then the
/// first page of the listing. They only read, so a new store's mount makes
/// them while its journal and folder are being made
/// (`MemoryManager::download_one`): the folder's crash order is untouched
/// and the requests go out in the order they always do.
pub(crate) struct FirstReads {
    asked: Instant,
    newest: Option<Vec<MemoryVersion>>,
    first_page: Result<Page<MemoryListItem>, crate::api::Error>,
}

impl FirstReads {
    pub(crate) async fn read(api: &dyn MemoryApi, store_id: &str) -> FirstReads {
        let asked = Instant::now();
        let newest = newest_versions(api, store_id).await;
        let first_page = api
            .list_under(store_id, View::Full, FULL_PAGE, None, Some(1), None)
            .await;
        FirstReads {
            asked,
            newest,
            first_page,
        }
    }
}

/// What a mount's listing wrote, and every memory it listed.
#[derive(Default)]
struct Pulled {
    written: usize,
    listed: BTreeMap<String, MemoryIndexEntry>,
}

/// One memory of a listed page, to write.
struct PageMemory {
    rel: String,
    id: String,
    content: String,
    sha: String,
}

/// One memory of a page after its write (its content dropped).
struct WrittenMemory {
    rel: String,
    id: String,
    sha: String,
    result: Result<(), FolderError>,
}

impl AttachedStore {
    /// The first download, before the agent runs: nothing else writes to
    /// the folder meanwhile, so the hashes of what it writes go straight to
    /// the stat cache and the first sync need not read the files back.
    /// `server_clock`: a reading of the server's clock taken before the
    /// mount (microseconds; the session's stamp), which tells the version
    /// feed how much of the store's history the listing reflects
    /// (`RemoteIndex::witness`). `first`: the download's first reads,
    /// when the caller made them already.
    pub(crate) async fn mount(
        &self,
        api: &dyn MemoryApi,
        server_clock: Option<i64>,
        first: Option<FirstReads>,
    ) -> Result<usize, PassError> {
        let written = self.stamp_and_pull(api, true, server_clock, first).await?;
        let folder = self.folder.clone();
        blocking(move || folder.trust_private_writes()).await??;
        // The watch goes in before the agent gets the folder, with one full
        // scan under it: from here on a sync examines what changed. A scan
        // that fails here fails no mount: the first sync scans whole again.
        if let Err(e) = self.scan(true).await {
            debug!(memory_store.id = %self.id, error = %e, "cannot scan the memory store folder after the download");
        }
        Ok(written)
    }

    /// A folder the sync cannot trust, rebuilt from the server.
    pub(super) async fn recover(&self, api: &dyn MemoryApi, reason: &str) -> Result<(), PassError> {
        warn!(
            memory_store.id = %self.id,
            root = %self.folder.root().display(),
            "{reason}; re-downloading the memory store folder instead of syncing"
        );
        let folder = self.folder.clone();
        blocking(move || folder.create_root()).await??;
        // A rebuilt folder is scanned whole next time.
        self.observer().forget();
        self.stamp_and_pull(api, false, None, None).await?;
        Ok(())
    }

    /// Write the marker, then every memory of the store; the baseline is
    /// rebuilt from successful writes only, so a failed write is pulled
    /// again later, never read as a deletion. `private`: no one else writes
    /// to the folder until the caller says so (see [`Folder::put_private`]).
    /// `server_clock`, `first`: see [`Self::mount`].
    async fn stamp_and_pull(
        &self,
        api: &dyn MemoryApi,
        private: bool,
        server_clock: Option<i64>,
        first: Option<FirstReads>,
    ) -> Result<usize, PassError> {
        self.start_over();
        let folder = self.folder.clone();
        let marker = marker_content(&self.id);
        blocking(move || put(&folder, MARKER_PATH, marker.as_bytes(), private)).await??;
        let FirstReads {
            asked,
            newest,
            first_page,
        } = match first {
            Some(first) => first,
            None => FirstReads::read(api, &self.id).await,
        };
        let Pulled { written, listed } = self.pull_store(api, private, first_page).await?;
        // The whole store was listed: what it no longer holds is no concern.
        self.state()
            .tentative
            .retain(|rel, _| listed.contains_key(rel));
        let mut seeded = self.seed(listed.into(), newest, asked);
        if let (Some(index), Some(at)) = (seeded.as_mut(), server_clock) {
            index.witness(at);
        }
        *self.remote_index() = seeded;
        Ok(written)
    }

    /// The state as a download starts: the baseline becomes tentative (each
    /// write confirms its path again), and the records of earlier sends and
    /// absences mean nothing once the disk is rebuilt.
    fn start_over(&self) {
        let mut state = self.state();
        let old = state.baseline.take();
        state.tentative.extend(old);
        state.sent.clear();
        state.in_flight.clear();
        // The disk was just rebuilt: earlier absences mean nothing.
        state.pending.clear();
    }

    /// Every memory of the store listed and written: the top level with its
    /// prefixes rolled up, then each prefix listed on its own,
    /// `LIST_CONCURRENCY` at once: the cursor makes one listing's pages
    /// sequential, so under latency the mount costs the longest prefix's
    /// pages, not the whole store's. A server that refuses `depth` gets the
    /// one sequential listing. `first_page`: the top level's first page.
    async fn pull_store(
        &self,
        api: &dyn MemoryApi,
        private: bool,
        first_page: Result<Page<MemoryListItem>, crate::api::Error>,
    ) -> Result<Pulled, PassError> {
        let top = self.pull_pages(api, private, None, Some(1), Some(first_page));
        let (mut pulled, prefixes) = match top.await {
            Ok(got) => got,
            Err(PassError::Api(e))
                if matches!(e.status(), Some(400 | 404))
                    || matches!(e, crate::api::Error::Config(_)) =>
            {
                debug!(memory_store.id = %self.id, error = %e, "the memory store cannot be listed by prefix; listing it in one go");
                self.pull_pages(api, private, None, None, None).await?
            }
            Err(e) => return Err(e),
        };
        let parts: Vec<Result<(Pulled, Vec<String>), PassError>> = stream::iter(prefixes)
            .map(|prefix| self.pull_pages(api, private, Some(prefix), None, None))
            .buffer_unordered(LIST_CONCURRENCY)
            .collect()
            .await;
        for part in parts {
            let (part, _) = part?;
            pulled.written += part.written;
            pulled.listed.extend(part.listed);
        }
        Ok(pulled)
    }

    /// Every page of one listing (`view=full`; the whole store, or the
    /// memories under `prefix`, to `depth`), each written as it arrives.
    /// Returns what was listed and written, and the prefixes rolled up.
    /// `first_page`: the listing's first page, when it was read already.
    async fn pull_pages(
        &self,
        api: &dyn MemoryApi,
        private: bool,
        prefix: Option<String>,
        depth: Option<u32>,
        mut first_page: Option<Result<Page<MemoryListItem>, crate::api::Error>>,
    ) -> Result<(Pulled, Vec<String>), PassError> {
        let mut pulled = Pulled::default();
        let mut prefixes = Vec::new();
        // This listing's own cursor: never another prefix's.
        let mut page = None;
        loop {
            let got = match first_page.take() {
                Some(got) => got?,
                None => {
                    api.list_under(
                        &self.id,
                        View::Full,
                        FULL_PAGE,
                        prefix.as_deref(),
                        depth,
                        page.take(),
                    )
                    .await?
                }
            };
            let next = got.next_cursor().map(str::to_string);
            let memories = self.page_memories(got.data, depth, &mut prefixes);
            let written = self.write_page(memories, private).await?;
            crate::killpoint::hit("memory.pull.written");
            self.record_page(written, &mut pulled);
            match next {
                Some(n) => page = Some(n),
                None => return Ok((pulled, prefixes)),
            }
        }
    }

    /// A page's memories to write, the marker path skipped; its rollups
    /// go to `prefixes` where the listing asked for them (`depth` 1).
    fn page_memories(
        &self,
        items: Vec<MemoryListItem>,
        depth: Option<u32>,
        prefixes: &mut Vec<String>,
    ) -> Vec<PageMemory> {
        let mut memories = Vec::new();
        for item in items {
            let m = match item {
                // A rollup to list on its own only where this listing
                // asked for rollups; a recursive listing has none to
                // follow (and its memories are all here).
                MemoryListItem::Prefix(p) => {
                    if depth == Some(1) {
                        prefixes.push(p.path);
                    }
                    continue;
                }
                other => match other.into_memory() {
                    Some(m) => m,
                    None => continue,
                },
            };
            let rel = m.path.trim_start_matches('/').to_string();
            if rel == MARKER_PATH {
                warn!(memory_store.id = %self.id, memory.path = %m.path, "the server listed the reserved marker path; skipping");
                continue;
            }
            memories.push(PageMemory {
                rel,
                id: m.id,
                content: m.content.unwrap_or_default(),
                sha: m.content_sha256,
            });
        }
        memories
    }

    /// A page's memories written to the folder, in one blocking hop.
    async fn write_page(
        &self,
        memories: Vec<PageMemory>,
        private: bool,
    ) -> Result<Vec<WrittenMemory>, PassError> {
        let folder = self.folder.clone();
        blocking(move || {
            memories
                .into_iter()
                .map(
                    |PageMemory {
                         rel,
                         id,
                         content,
                         sha,
                     }| {
                        let result = put(&folder, &rel, content.as_bytes(), private);
                        WrittenMemory {
                            rel,
                            id,
                            sha,
                            result,
                        }
                    },
                )
                .collect::<Vec<_>>()
        })
        .await
    }

    /// A written page in the state: every memory listed (and its id), and
    /// each one written confirmed in the baseline.
    fn record_page(&self, written: Vec<WrittenMemory>, pulled: &mut Pulled) {
        let mut state = self.state();
        for WrittenMemory {
            rel,
            id,
            sha,
            result,
        } in written
        {
            pulled.listed.insert(
                rel.clone(),
                MemoryIndexEntry {
                    kind: IndexKind::Memory,
                    id: id.clone(),
                    path: String::new(),
                    content_sha256: sha.clone(),
                },
            );
            state.ids.insert(rel.clone(), id);
            match result {
                Ok(()) => {
                    state.tentative.remove(&rel);
                    state.baseline.insert(rel, sha);
                    pulled.written += 1;
                }
                Err(e) => {
                    warn!(memory_store.id = %self.id, memory.path = %rel, error = %e, "failed to write memory")
                }
            }
        }
    }
}
