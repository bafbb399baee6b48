//! Uploads: one file pushed to the server and what became of it — landed,
//! settled (a conflict lost, a refusal remembered), superseded by a newer
//! upload of ours, or worth another try — recorded as it lands.

use futures::{StreamExt, stream};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::api::types::Memory;
use crate::memory::remote::MemoryApi;
use crate::memory::state::Owner;

use super::marker::marks_store;
use super::work::PlannedUpload;
use super::{AttachedStore, blocking, sha256_hex};

/// Uploads in flight at once in one store's flush (and sync).
pub const UPLOAD_CONCURRENCY: usize = 32;

/// What became of one upload ([`AttachedStore::upload`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The server holds this hash at the path now: the upload landed (or
    /// the server already held these very bytes).
    Landed(String),
    /// Nothing landed, and trying again now changes nothing: the server
    /// won a conflict, refused the file, or the file is gone.
    Settled,
    /// A later upload of ours already landed newer content: this one has
    /// nothing left to do, and must not move the baseline.
    Superseded,
    /// A failure worth another try later (a `429`, a 5xx, no answer), with
    /// the wait the answer asked for, if any.
    Failed(Option<std::time::Duration>),
}

/// Whose bytes a memory holds after an update of ours was refused (409).
enum Whose {
    /// Exactly what this upload sends.
    Same(String),
    /// An earlier upload of ours: the newer edit goes over it.
    OlderOfOurs(String),
    /// A later upload of ours landed newer content.
    NewerOfOurs,
    /// Another writer's: the server wins.
    Theirs,
}

/// One upload as it was sent: what its answer is judged by.
struct Sent<'a> {
    rel: &'a str,
    /// The file's hash the upload was planned for (what a refusal remembers).
    local_sha: Option<&'a str>,
    /// The update (memory id, expected hash), or `None`: a create.
    update: Option<(String, String)>,
    /// The hash of the bytes sent.
    sha: String,
    /// The send's number (`State::next_send`).
    seq: u64,
}

impl AttachedStore {
    /// The pass's uploads, [`UPLOAD_CONCURRENCY`] at once, each recorded as
    /// it lands (or its fallback as it fails): how many landed.
    pub(super) async fn upload_all(
        &self,
        api: &dyn MemoryApi,
        uploads: Vec<PlannedUpload>,
    ) -> usize {
        stream::iter(uploads)
            .map(|planned| async move {
                let PlannedUpload {
                    rel,
                    local,
                    update,
                    fallback,
                } = planned;
                match self.upload(api, &rel, local.as_deref(), update).await {
                    Outcome::Landed(sha) => {
                        self.record(rel, Some(sha));
                        true
                    }
                    // A newer upload of ours moved the baseline already.
                    Outcome::Superseded => false,
                    Outcome::Settled | Outcome::Failed(_) => {
                        self.record(rel, fallback);
                        false
                    }
                }
            })
            .buffer_unordered(UPLOAD_CONCURRENCY)
            .filter(|ok| std::future::ready(*ok))
            .count()
            .await
    }

    /// Push one file: what became of it ([`Outcome`]; on anything but
    /// `Landed` the caller keeps its fallback). 404 on an update
    /// re-creates; 409 on an update loses the local edit to another
    /// writer's — unless the memory holds bytes of ours (see
    /// [`Self::whose`]); 400, 413 and content the folder refuses (not
    /// UTF-8) are remembered as refused until the file changes.
    pub(crate) fn upload<'a>(
        &'a self,
        api: &'a dyn MemoryApi,
        rel: &'a str,
        local_sha: Option<&'a str>,
        update: Option<(String, String)>,
    ) -> futures::future::BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let data = match self.read_to_send(rel, local_sha).await {
                Ok(data) => data,
                Err(outcome) => return outcome,
            };
            let sending = sha256_hex(&data);
            let seq = self.start_send(rel, &sending, update.as_ref());
            // The folder returns only UTF-8 for a memory store.
            let content = String::from_utf8_lossy(&data);
            let path = format!("/{rel}");
            let result = match &update {
                None => api.create(&self.id, &path, &content).await,
                Some((id, expected)) => api.update(&self.id, id, &content, expected).await,
            };
            let sent = Sent {
                rel,
                local_sha,
                update,
                sha: sending,
                seq,
            };
            let e = match result {
                Ok(memory) => return self.landed(&sent, memory),
                Err(e) => e,
            };
            // An answer settles the request; a transport failure, a timeout
            // or a gateway's answer (408, 502, 504: the backend may still
            // apply it) does not.
            if e.status().is_some_and(|s| !matches!(s, 408 | 502 | 504)) {
                self.state().answered(rel, &sent.sha, false);
            }
            self.after_refusal(api, sent, &e).await
        })
    }

    /// The file's bytes to send, or what became of the upload without a
    /// request. The marker is read again with the file: an upload can start
    /// long after its pass judged the folder (a push upload waiting for a
    /// slot, a re-send after a 404 or a 409), and a folder that stopped
    /// naming this store uploads nothing.
    async fn read_to_send(&self, rel: &str, local_sha: Option<&str>) -> Result<Vec<u8>, Outcome> {
        let folder = self.folder.clone();
        let r = rel.to_string();
        let id = self.id.clone();
        let read = move || {
            if !marks_store(&folder, &id) {
                return Ok(None);
            }
            folder.get(&r)
        };
        // A sync's uploads start together (up to UPLOAD_CONCURRENCY): a
        // blocking task each would start a thread each. A folder in memory
        // is read here, at memory speed.
        let outcome = if self.folder.in_memory() {
            Ok(read())
        } else {
            blocking(read).await
        };
        match outcome {
            Ok(Ok(Some(data))) => Ok(data),
            Ok(Ok(None)) => Err(Outcome::Settled),
            Ok(Err(e)) if e.is_refusal() => {
                self.refuse(rel, local_sha, &e.to_string());
                Err(Outcome::Settled)
            }
            Ok(Err(e)) => {
                warn!(memory_store.id = %self.id, memory.path = %rel, error = %e, "failed to upload memory");
                Err(Outcome::Failed(None))
            }
            Err(e) => {
                warn!(memory_store.id = %self.id, memory.path = %rel, error = %e, "failed to upload memory");
                Err(Outcome::Failed(None))
            }
        }
    }

    /// Record the send before it goes: its number, the sent hash, and the
    /// request in flight — which stays if this future is dropped
    /// mid-flight (a bound cut the pass off): the request may still land.
    fn start_send(&self, rel: &str, sending: &str, update: Option<&(String, String)>) -> u64 {
        let mut state = self.state();
        let seq = state.next_send();
        state.sent.insert(rel.to_string(), sending.to_string());
        let guard = update.map(|(_, expected)| expected.as_str());
        state.sending(rel, sending, guard, Instant::now(), seq);
        seq
    }

    /// The server took the upload: it holds `memory` now.
    fn landed(&self, sent: &Sent<'_>, memory: Memory) -> Outcome {
        crate::killpoint::hit("memory.upload.landed");
        let rel = sent.rel;
        // The baseline and the sent record change in one batch:
        // the journal never holds one without the other.
        let mut state = self.state();
        state.refused.remove(rel);
        if state.sent.get(rel) == Some(&sent.sha) {
            state.sent.remove(rel);
        }
        state.landed(rel, &memory.content_sha256, sent.seq);
        state
            .baseline
            .insert(rel.to_string(), memory.content_sha256.clone());
        state.ids.insert(rel.to_string(), memory.id);
        Outcome::Landed(memory.content_sha256)
    }

    /// What became of an upload the server answered with an error (or
    /// never answered): 404 on an update re-creates, 409 on an update asks
    /// whose bytes the memory holds ([`Self::whose`]), 400 and 413 are
    /// remembered as refused, the rest is worth another try.
    async fn after_refusal(
        &self,
        api: &dyn MemoryApi,
        mut sent: Sent<'_>,
        e: &crate::api::Error,
    ) -> Outcome {
        match (sent.update.take(), e.status()) {
            // Deleted since the listing: the file is now the only copy.
            (Some(_), Some(404)) => self.upload(api, sent.rel, sent.local_sha, None).await,
            (Some((id, _)), Some(409)) => self.after_conflict(api, &sent, id).await,
            (_, Some(400 | 413)) => {
                self.refuse(sent.rel, sent.local_sha, &e.to_string());
                Outcome::Settled
            }
            _ => {
                warn!(memory_store.id = %self.id, memory.path = %sent.rel, error = %e, "failed to upload memory");
                Outcome::Failed(e.api().and_then(|a| a.retry_after()))
            }
        }
    }

    /// An update of memory `id` refused (409): settled by whose bytes the
    /// memory holds now.
    async fn after_conflict(&self, api: &dyn MemoryApi, sent: &Sent<'_>, id: String) -> Outcome {
        let rel = sent.rel;
        match self.whose(api, sent, &id).await {
            Whose::Same(current) => {
                let mut state = self.state();
                if state.sent.get(rel).map(String::as_str) == Some(sent.sha.as_str()) {
                    state.sent.remove(rel);
                }
                state.baseline.insert(rel.to_string(), current.clone());
                Outcome::Landed(current)
            }
            Whose::OlderOfOurs(current) => {
                info!(
                    memory_store.id = %self.id,
                    memory.path = %rel,
                    "an upload of ours cut off in flight landed late; sending the newer edit over it"
                );
                self.upload(api, rel, sent.local_sha, Some((id, current)))
                    .await
            }
            Whose::NewerOfOurs => {
                debug!(memory_store.id = %self.id, memory.path = %rel, "a newer upload of ours landed first; this one has nothing left to do");
                Outcome::Superseded
            }
            Whose::Theirs => {
                // The sent hash stays: this may be a retry of an
                // attempt that landed; the next listing tells.
                self.state().lost_uploads += 1;
                warn!(
                    memory_store.id = %self.id,
                    memory.path = %rel,
                    "memory changed both locally and remotely; the upload was refused and the local edit loses"
                );
                Outcome::Settled
            }
        }
    }

    /// After `sent` (an update of memory `id`) was refused (409): whose
    /// bytes does the memory hold now? Asks the server only when one of our
    /// own uploads could explain it — one without an answer that may have
    /// landed late (cut off in flight, then committed after the listing this
    /// update was guarded by), or one that landed while this one was on its
    /// way (the push's and the flush's) — so a plain conflict costs nothing
    /// more. Bytes equal to ours are ours whoever wrote them; the send
    /// numbers tell an older upload of ours from a newer one
    /// (`State::owner_of`); the rest is another writer's.
    async fn whose(&self, api: &dyn MemoryApi, sent: &Sent<'_>, id: &str) -> Whose {
        let rel = sent.rel;
        let candidates = {
            let state = self.state();
            state.in_flight.contains_key(rel) || state.landed.contains_key(rel)
        };
        if !candidates {
            return Whose::Theirs;
        }
        let current = match api.retrieve(&self.id, id).await {
            Ok(memory) => memory.content_sha256,
            Err(e) => {
                debug!(memory_store.id = %self.id, memory.path = %rel, error = %e, "cannot read the memory an upload was refused for");
                return Whose::Theirs;
            }
        };
        if current == sent.sha {
            return Whose::Same(current);
        }
        match self.state().owner_of(rel, &current, sent.seq) {
            Owner::OlderSend => Whose::OlderOfOurs(current),
            Owner::NewerSend => Whose::NewerOfOurs,
            Owner::Other => Whose::Theirs,
        }
    }

    /// Remember the file's hash as refused until its content changes (an
    /// upload without one only warns).
    fn refuse(&self, rel: &str, local_sha: Option<&str>, rejection: &str) {
        if let Some(sha) = local_sha {
            let mut state = self.state();
            state.refused.insert(rel.to_string(), sha.to_string());
            state.new_refusals += 1;
            drop(state);
            warn!(
                memory_store.id = %self.id,
                memory.path = %rel,
                rejection = %rejection,
                "the server rejected this memory file, so it stays un-synced until its content changes"
            );
        } else {
            warn!(memory_store.id = %self.id, memory.path = %rel, error = %rejection, "failed to upload memory");
        }
    }
}
