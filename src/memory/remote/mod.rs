//! The memory store calls the sync makes, behind a trait so that tests can
//! inject a failure at an exact point; [`crate::api::Client`] is the
//! production implementation (`client`). The operations are listed once,
//! below: the trait, the calls and answers as values, and the forwarding
//! through a [`MemoryLayer`] are made from that list (`operations`).

mod client;
mod layer;
mod operations;

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::api::Error;
use crate::api::types::{Memory, MemoryIndexEntry, MemoryListItem, MemoryVersion, Page, View};

pub use self::layer::{Layered, MemoryLayer};
use self::operations::memory_operations;

/// A page of the version history and the `Date` header of its answer
/// (microseconds since the epoch), when there was one. The `Date` is what
/// the last hop (a proxy, a load balancer) stamped, not the server's record
/// clock: the feed never steers by it (see `super::feed`).
pub type VersionsPage = (Page<MemoryVersion>, Option<i64>);

memory_operations! {
    /// The memory endpoints the sync uses.
    pub trait MemoryApi: Send + Sync {
        operations {
            /// One page of a store's listing.
            List => fn list<'a>(
                &'a self,
                store_id: &'a str,
                view: View,
                limit: u32,
                page: Option<String>,
            ) -> BoxFuture<'a, Result<Page<MemoryListItem>, Error>>;

            /// One page of the listing of the memories under `prefix` (ending in
            /// `/`; the whole store when `None`), to `depth` (`Some(1)`: immediate
            /// children and `memory_prefix` rollups; `None`: recursive). The
            /// default serves only the whole store's recursive listing and refuses
            /// the rest, so a client without it mounts with one sequential listing.
            ListUnder => fn list_under<'a>(
                &'a self,
                store_id: &'a str,
                view: View,
                limit: u32,
                prefix: Option<&'a str>,
                depth: Option<u32>,
                page: Option<String>,
            ) -> BoxFuture<'a, Result<Page<MemoryListItem>, Error>> {
                if prefix.is_none() && depth.is_none() {
                    return self.list(store_id, view, limit, page);
                }
                Box::pin(async { Err(Error::Config("this client cannot list by prefix".into())) })
            }

            /// One page of a store's `basic` listing, as an index (id, path, hash).
            /// The default goes through [`MemoryApi::list`]; a client that can decode
            /// the index directly overrides it to skip the fields a sync never reads.
            ListIndex => fn list_index<'a>(
                &'a self,
                store_id: &'a str,
                limit: u32,
                page: Option<String>,
            ) -> BoxFuture<'a, Result<Page<MemoryIndexEntry>, Error>> {
                Box::pin(async move {
                    let got = self.list(store_id, View::Basic, limit, page).await?;
                    Ok(Page {
                        data: got.data.into_iter().map(MemoryIndexEntry::from).collect(),
                        next_page: got.next_page,
                    })
                })
            }

            /// One page of the store's version history (`basic` view), newest
            /// first, created at or after `since_micros` (microseconds since the
            /// epoch; no filter when `None`), with the answer's `Date` header (see
            /// [`VersionsPage`]). The default refuses,
            /// so a client without it always lists the whole store (see
            /// `super::feed`).
            Versions => fn versions<'a>(
                &'a self,
                store_id: &'a str,
                since_micros: Option<i64>,
                limit: u32,
                page: Option<String>,
            ) -> BoxFuture<'a, Result<VersionsPage, Error>> {
                let _ = (store_id, since_micros, limit, page);
                Box::pin(async {
                    Err(Error::Config(
                        "this client cannot read the memory version history".into(),
                    ))
                })
            }

            /// One memory with its content.
            Retrieve => fn retrieve<'a>(
                &'a self,
                store_id: &'a str,
                memory_id: &'a str,
            ) -> BoxFuture<'a, Result<Memory, Error>>;

            /// Create a memory at `path` (with its leading `/`).
            Create => fn create<'a>(
                &'a self,
                store_id: &'a str,
                path: &'a str,
                content: &'a str,
            ) -> BoxFuture<'a, Result<Memory, Error>>;

            /// Replace a memory's content if it still hashes to `expected_sha256`.
            Update => fn update<'a>(
                &'a self,
                store_id: &'a str,
                memory_id: &'a str,
                content: &'a str,
                expected_sha256: &'a str,
            ) -> BoxFuture<'a, Result<Memory, Error>>;

            /// Delete a memory if it still hashes to `expected_sha256`.
            Delete => fn delete<'a>(
                &'a self,
                store_id: &'a str,
                memory_id: &'a str,
                expected_sha256: &'a str,
            ) -> BoxFuture<'a, Result<(), Error>>;
        }

        /// The same endpoints, each request sent once (no retry of a transient
        /// failure): for the change-driven push, which must see every `429` and
        /// its `retry-after` to back off as a whole (`super::push`) rather than
        /// let the client wait inside one upload while the push sends others.
        /// `None`: this client cannot, and the push uses it as it is.
        fn single_attempt(&self) -> Option<Arc<dyn MemoryApi>> {
            None
        }
    }
}
