//! Session endpoints the worker uses: retrieve, list events, send events.

use futures::Stream;
use reqwest::Method;

use super::client::{ApiFamily, Client, Query, paginate};
use super::error::Error;
use super::seg;
use super::types::*;

/// `/v1/sessions`.
pub struct Sessions<'a> {
    client: &'a Client,
}

impl Client {
    pub fn sessions(&self) -> Sessions<'_> {
        Sessions { client: self }
    }
}

impl Sessions<'_> {
    fn one(id: &str) -> String {
        format!("/v1/sessions/{}", seg(id))
    }

    pub async fn retrieve(&self, id: &str) -> Result<Session, Error> {
        let rb = self
            .client
            .request(Method::GET, ApiFamily::ManagedAgents, &Self::one(id));
        self.client.json(rb).await
    }

    pub async fn list_events(
        &self,
        id: &str,
        params: &ListEvents,
    ) -> Result<Page<SessionEvent>, Error> {
        let query = Query::default()
            .opt("limit", params.limit)
            .opt("page", params.page.as_deref())
            .opt("order", params.order.map(Order::as_str));
        let rb = self
            .client
            .request(
                Method::GET,
                ApiFamily::ManagedAgents,
                &format!("{}/events", Self::one(id)),
            )
            .query(query.pairs());
        self.client.json(rb).await
    }

    /// The session's whole event history, page after page.
    pub fn events(
        &self,
        id: &str,
        params: ListEvents,
    ) -> impl Stream<Item = Result<SessionEvent, Error>> + '_ {
        let id = id.to_string();
        paginate(move |page| {
            let params = ListEvents {
                page,
                ..params.clone()
            };
            let id = id.clone();
            async move { self.list_events(&id, &params).await }
        })
    }

    pub async fn send_events(
        &self,
        id: &str,
        events: Vec<SessionEvent>,
    ) -> Result<SentEvents, Error> {
        let rb = self
            .client
            .request(
                Method::POST,
                ApiFamily::ManagedAgents,
                &format!("{}/events", Self::one(id)),
            )
            .json(&SendEvents { events });
        self.client.json(rb).await
    }
}
