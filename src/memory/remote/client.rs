//! The production [`MemoryApi`]: each operation as the API client's request.

use futures::future::BoxFuture;

use super::{MemoryApi, VersionsPage};
use crate::api::types::{
    CreateMemory, ListMemories, ListMemoryVersions, Memory, MemoryIndexEntry, MemoryListItem, Page,
    Precondition, UpdateMemory, View,
};
use crate::api::{Client, Error};

impl MemoryApi for Client {
    fn single_attempt(&self) -> Option<std::sync::Arc<dyn MemoryApi>> {
        Some(std::sync::Arc::new(
            self.with_memory_retry(crate::api::RetryPolicy::none()),
        ))
    }

    fn list<'a>(
        &'a self,
        store_id: &'a str,
        view: View,
        limit: u32,
        page: Option<String>,
    ) -> BoxFuture<'a, Result<Page<MemoryListItem>, Error>> {
        Box::pin(async move {
            self.memories(store_id)
                .list(&ListMemories {
                    view: Some(view),
                    limit: Some(limit),
                    page,
                    ..Default::default()
                })
                .await
        })
    }

    fn list_under<'a>(
        &'a self,
        store_id: &'a str,
        view: View,
        limit: u32,
        prefix: Option<&'a str>,
        depth: Option<u32>,
        page: Option<String>,
    ) -> BoxFuture<'a, Result<Page<MemoryListItem>, Error>> {
        Box::pin(async move {
            self.memories(store_id)
                .list(&ListMemories {
                    path_prefix: prefix.map(str::to_string),
                    depth,
                    view: Some(view),
                    limit: Some(limit),
                    page,
                })
                .await
        })
    }

    fn list_index<'a>(
        &'a self,
        store_id: &'a str,
        limit: u32,
        page: Option<String>,
    ) -> BoxFuture<'a, Result<Page<MemoryIndexEntry>, Error>> {
        Box::pin(async move {
            self.memories(store_id)
                .list_index(limit, page.as_deref())
                .await
        })
    }

    fn versions<'a>(
        &'a self,
        store_id: &'a str,
        since_micros: Option<i64>,
        limit: u32,
        page: Option<String>,
    ) -> BoxFuture<'a, Result<VersionsPage, Error>> {
        Box::pin(async move {
            let created_at_gte = match since_micros {
                None => None,
                Some(t) => {
                    Some(chrono::DateTime::from_timestamp_micros(t).ok_or_else(|| {
                        Error::Config(format!("{t} µs is not a representable time"))
                    })?)
                }
            };
            let (got, date) = self
                .memory_versions(store_id)
                .list_dated(&ListMemoryVersions {
                    created_at_gte,
                    view: Some(View::Basic),
                    limit: Some(limit),
                    page,
                    ..Default::default()
                })
                .await?;
            Ok((got, date.map(|d| d.timestamp_micros())))
        })
    }

    fn retrieve<'a>(
        &'a self,
        store_id: &'a str,
        memory_id: &'a str,
    ) -> BoxFuture<'a, Result<Memory, Error>> {
        Box::pin(async move {
            self.memories(store_id)
                .retrieve(memory_id, Some(View::Full))
                .await
        })
    }

    fn create<'a>(
        &'a self,
        store_id: &'a str,
        path: &'a str,
        content: &'a str,
    ) -> BoxFuture<'a, Result<Memory, Error>> {
        Box::pin(async move {
            self.memories(store_id)
                .create(
                    &CreateMemory {
                        path: path.to_string(),
                        content: Some(content.to_string()),
                    },
                    None,
                )
                .await
        })
    }

    fn update<'a>(
        &'a self,
        store_id: &'a str,
        memory_id: &'a str,
        content: &'a str,
        expected_sha256: &'a str,
    ) -> BoxFuture<'a, Result<Memory, Error>> {
        Box::pin(async move {
            self.memories(store_id)
                .update(
                    memory_id,
                    &UpdateMemory {
                        content: Some(content.to_string()),
                        path: None,
                        precondition: Some(Precondition::content_sha256(expected_sha256)),
                    },
                    None,
                )
                .await
        })
    }

    fn delete<'a>(
        &'a self,
        store_id: &'a str,
        memory_id: &'a str,
        expected_sha256: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            self.memories(store_id)
                .delete(memory_id, Some(expected_sha256))
                .await
                .map(|_| ())
        })
    }
}
