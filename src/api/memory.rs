//! Memory store endpoints: stores, memories, memory versions.
//!
//! Every call but a store's creation retries a transient failure (5xx,
//! 408, 409 lock, 429, a dropped connection) with the client's memory retry
//! policy, as the official SDK's client does: see [`super::retry`].

use futures::Stream;
use reqwest::Method;

use super::client::{ApiFamily, Client, Query, paginate};
use super::error::Error;
use super::seg;
use super::types::*;

fn rfc3339(t: Timestamp) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// `/v1/memory_stores`.
pub struct MemoryStores<'a> {
    client: &'a Client,
}

/// `/v1/memory_stores/{id}/memories`.
pub struct Memories<'a> {
    client: &'a Client,
    store_id: String,
}

/// `/v1/memory_stores/{id}/memory_versions`.
pub struct MemoryVersions<'a> {
    client: &'a Client,
    store_id: String,
}

impl Client {
    pub fn memory_stores(&self) -> MemoryStores<'_> {
        MemoryStores { client: self }
    }

    pub fn memories(&self, store_id: &str) -> Memories<'_> {
        Memories {
            client: self,
            store_id: store_id.to_string(),
        }
    }

    pub fn memory_versions(&self, store_id: &str) -> MemoryVersions<'_> {
        MemoryVersions {
            client: self,
            store_id: store_id.to_string(),
        }
    }
}

impl MemoryStores<'_> {
    fn path(id: &str) -> String {
        format!("/v1/memory_stores/{}", seg(id))
    }

    /// Sent once: a retry after a lost answer would make a second store.
    pub async fn create(&self, params: &CreateMemoryStore) -> Result<MemoryStore, Error> {
        let rb = self
            .client
            .request(Method::POST, ApiFamily::Memory, "/v1/memory_stores")
            .json(params);
        self.client.json(rb).await
    }

    pub async fn retrieve(&self, id: &str) -> Result<MemoryStore, Error> {
        let rb = self
            .client
            .request(Method::GET, ApiFamily::Memory, &Self::path(id));
        self.client.memory_json(rb).await
    }

    pub async fn update(&self, id: &str, params: &UpdateMemoryStore) -> Result<MemoryStore, Error> {
        let rb = self
            .client
            .request(Method::POST, ApiFamily::Memory, &Self::path(id))
            .json(params);
        self.client.memory_json(rb).await
    }

    pub async fn archive(&self, id: &str) -> Result<MemoryStore, Error> {
        let path = format!("{}/archive", Self::path(id));
        let rb = self.client.request(Method::POST, ApiFamily::Memory, &path);
        self.client.memory_json(rb).await
    }

    pub async fn delete(&self, id: &str) -> Result<DeletedMemoryStore, Error> {
        let rb = self
            .client
            .request(Method::DELETE, ApiFamily::Memory, &Self::path(id));
        self.client.memory_json(rb).await
    }

    pub async fn list(&self, params: &ListMemoryStores) -> Result<Page<MemoryStore>, Error> {
        let query = Query::default()
            .opt("limit", params.limit)
            .opt("page", params.page.as_deref())
            .opt("include_archived", params.include_archived)
            .opt("created_at[gte]", params.created_at_gte.map(rfc3339))
            .opt("created_at[lte]", params.created_at_lte.map(rfc3339));
        let rb = self
            .client
            .request(Method::GET, ApiFamily::Memory, "/v1/memory_stores")
            .query(query.pairs());
        self.client.memory_json(rb).await
    }

    /// Every store matching `params`, page after page.
    pub fn list_all(
        &self,
        params: ListMemoryStores,
    ) -> impl Stream<Item = Result<MemoryStore, Error>> + '_ {
        paginate(move |page| {
            let params = ListMemoryStores {
                page,
                ..params.clone()
            };
            async move { self.list(&params).await }
        })
    }
}

impl Memories<'_> {
    fn base(&self) -> String {
        format!("/v1/memory_stores/{}/memories", seg(&self.store_id))
    }

    fn one(&self, id: &str) -> String {
        format!("{}/{}", self.base(), seg(id))
    }

    /// Create a memory. The response is in the `basic` view unless `view` says otherwise.
    pub async fn create(&self, params: &CreateMemory, view: Option<View>) -> Result<Memory, Error> {
        let query = Query::default().opt("view", view.map(View::as_str));
        let rb = self
            .client
            .request(Method::POST, ApiFamily::Memory, &self.base())
            .query(query.pairs())
            .json(params);
        self.client.memory_json(rb).await
    }

    /// Retrieve a memory, with content unless `view` is `basic`.
    pub(crate) async fn retrieve(&self, id: &str, view: Option<View>) -> Result<Memory, Error> {
        let query = Query::default().opt("view", view.map(View::as_str));
        let rb = self
            .client
            .request(Method::GET, ApiFamily::Memory, &self.one(id))
            .query(query.pairs());
        self.client.memory_json(rb).await
    }

    /// Update content and/or path, optionally guarded by a precondition.
    pub async fn update(
        &self,
        id: &str,
        params: &UpdateMemory,
        view: Option<View>,
    ) -> Result<Memory, Error> {
        let query = Query::default().opt("view", view.map(View::as_str));
        let rb = self
            .client
            .request(Method::POST, ApiFamily::Memory, &self.one(id))
            .query(query.pairs())
            .json(params);
        self.client.memory_json(rb).await
    }

    /// Delete a memory, only if its content still hashes to `expected_content_sha256`.
    pub async fn delete(
        &self,
        id: &str,
        expected_content_sha256: Option<&str>,
    ) -> Result<DeletedMemory, Error> {
        let query = Query::default().opt("expected_content_sha256", expected_content_sha256);
        let rb = self
            .client
            .request(Method::DELETE, ApiFamily::Memory, &self.one(id))
            .query(query.pairs());
        self.client.memory_json(rb).await
    }

    pub async fn list(&self, params: &ListMemories) -> Result<Page<MemoryListItem>, Error> {
        let query = Query::default()
            .opt("path_prefix", params.path_prefix.as_deref())
            .opt("depth", params.depth)
            .opt("view", params.view.map(View::as_str))
            .opt("limit", params.limit)
            .opt("page", params.page.as_deref());
        let rb = self
            .client
            .request(Method::GET, ApiFamily::Memory, &self.base())
            .query(query.pairs());
        self.client.memory_json(rb).await
    }

    /// One `basic` page decoded as an index (id, path, hash) — what a sync needs.
    pub async fn list_index(
        &self,
        limit: u32,
        page: Option<&str>,
    ) -> Result<Page<MemoryIndexEntry>, Error> {
        let query = Query::default()
            .opt("view", Some(View::Basic.as_str()))
            .opt("limit", Some(limit))
            .opt("page", page);
        let rb = self
            .client
            .request(Method::GET, ApiFamily::Memory, &self.base())
            .query(query.pairs());
        self.client.memory_json(rb).await
    }

    /// Every item of the listing, page after page.
    pub fn list_all(
        &self,
        params: ListMemories,
    ) -> impl Stream<Item = Result<MemoryListItem, Error>> + '_ {
        paginate(move |page| {
            let params = ListMemories {
                page,
                ..params.clone()
            };
            async move { self.list(&params).await }
        })
    }
}

impl MemoryVersions<'_> {
    fn base(&self) -> String {
        format!("/v1/memory_stores/{}/memory_versions", seg(&self.store_id))
    }

    pub async fn list(&self, params: &ListMemoryVersions) -> Result<Page<MemoryVersion>, Error> {
        Ok(self.list_dated(params).await?.0)
    }

    /// [`Self::list`] with the server's clock from the answer's `Date`.
    pub(crate) async fn list_dated(
        &self,
        params: &ListMemoryVersions,
    ) -> Result<(Page<MemoryVersion>, Option<Timestamp>), Error> {
        let query = Query::default()
            .opt("memory_id", params.memory_id.as_deref())
            .opt("session_id", params.session_id.as_deref())
            .opt("api_key_id", params.api_key_id.as_deref())
            .opt("service_account_id", params.service_account_id.as_deref())
            .opt("operation", params.operation.map(MemoryOperation::as_str))
            .opt("created_at[gte]", params.created_at_gte.map(rfc3339))
            .opt("created_at[lte]", params.created_at_lte.map(rfc3339))
            .opt("view", params.view.map(View::as_str))
            .opt("limit", params.limit)
            .opt("page", params.page.as_deref());
        let rb = self
            .client
            .request(Method::GET, ApiFamily::Memory, &self.base())
            .query(query.pairs());
        self.client.memory_json_dated(rb).await
    }

    /// Every version matching `params`, newest first, page after page.
    pub fn list_all(
        &self,
        params: ListMemoryVersions,
    ) -> impl Stream<Item = Result<MemoryVersion, Error>> + '_ {
        paginate(move |page| {
            let params = ListMemoryVersions {
                page,
                ..params.clone()
            };
            async move { self.list(&params).await }
        })
    }

    pub async fn retrieve(&self, id: &str, view: Option<View>) -> Result<MemoryVersion, Error> {
        let query = Query::default().opt("view", view.map(View::as_str));
        let path = format!("{}/{}", self.base(), seg(id));
        let rb = self
            .client
            .request(Method::GET, ApiFamily::Memory, &path)
            .query(query.pairs());
        self.client.memory_json(rb).await
    }

    pub async fn redact(&self, id: &str) -> Result<MemoryVersion, Error> {
        let path = format!("{}/{}/redact", self.base(), seg(id));
        let rb = self.client.request(Method::POST, ApiFamily::Memory, &path);
        self.client.memory_json(rb).await
    }
}
