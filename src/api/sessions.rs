//! Session endpoints the worker uses: retrieve, list events, send events.

use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use reqwest::Method;

use super::client::{ApiFamily, Client, Query, paginate};
use super::error::{ApiError, Error};
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

    /// The session; a transient failure is retried twice, as the official
    /// SDK's client retries it (one 5xx must not fail the work item).
    pub async fn retrieve(&self, id: &str) -> Result<Session, Error> {
        let rb = self
            .client
            .request(Method::GET, ApiFamily::ManagedAgents, &Self::one(id));
        self.client.json_retrying(rb).await
    }

    pub(crate) async fn list_events(
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
    pub(crate) fn events(
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

    pub(crate) async fn send_events(
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

    /// Open `GET /v1/sessions/{id}/events/stream`. Connecting (and an error
    /// status) is reported here; the stream then yields every event from now
    /// on. Keep-alive `ping`s and events without an `event:` line are
    /// skipped, as the official SDKs do; a `data:` that is not an event, or
    /// a broken connection, ends the stream with an error (the caller
    /// reconnects and re-reads the history).
    pub(crate) async fn stream(
        &self,
        id: &str,
    ) -> Result<impl Stream<Item = Result<SessionEvent, Error>> + Send + 'static, Error> {
        let rb = self
            .client
            .unbounded_request(
                Method::GET,
                ApiFamily::ManagedAgents,
                &format!("{}/events/stream", Self::one(id)),
            )
            .header(reqwest::header::ACCEPT, "text/event-stream");
        let response = self.client.execute(rb).await?;
        let events = response
            .bytes_stream()
            .eventsource()
            .filter_map(|item| async move {
                match item {
                    Err(eventsource_stream::EventStreamError::Transport(e)) => {
                        Some(Err(Error::Transport(e)))
                    }
                    Err(e) => Some(Err(Error::Decode(format!("event stream: {e}")))),
                    Ok(event) => match event.event.as_str() {
                        // The default name: the stream gave no `event:` line.
                        "ping" | "message" | "" => None,
                        "error" => Some(Err(Error::Api(ApiError::from_parts(
                            500,
                            None,
                            event.data.as_bytes(),
                        )))),
                        _ => Some(
                            SessionEvent::from_json(&event.data)
                                .map_err(|e| Error::Decode(format!("event stream: {e}"))),
                        ),
                    },
                }
            });
        Ok(events)
    }
}
