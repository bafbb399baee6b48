//! The typed API client: the headers it sends, how it reads empty and error
//! answers, and pagination — against a capturing server and the devserver.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use envworker::api::types::*;
use envworker::api::{Client, Credential, Error};
use futures::TryStreamExt;

/// One request as the capturing server saw it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    query: String,
    headers: HeaderMap,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// A server that records every request and answers from a fixed script.
async fn capture(answer: fn(&str) -> Response) -> (String, Log) {
    let log: Log = Arc::default();
    let app = Router::new()
        .fallback(move |State(log): State<Log>, req: Request| async move {
            let path = req.uri().path().to_string();
            log.lock().unwrap().push(Seen {
                path: path.clone(),
                query: req.uri().query().unwrap_or_default().to_string(),
                headers: req.headers().clone(),
            });
            answer(&path)
        })
        .with_state(log.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, log)
}

fn json(status: StatusCode, body: &'static str) -> Response {
    (status, [("content-type", "application/json")], body).into_response()
}

const SESSION: &str = r#"{"id":"sesn_1","type":"session","status":"idle","environment_id":"env_1",
  "agent":{"tools":[],"skills":[{"skill_id":"skill_1","version":"latest"}],"name":"a"},
  "resources":[{"type":"memory_store","memory_store_id":"memstore_1","access":"read_only",
                "mount_path":"/mnt/memory/prefs","name":"Prefs"},
               {"type":"file","file_id":"file_1"}],
  "metadata":{},"created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-01T00:00:00Z"}"#;

fn scripted(path: &str) -> Response {
    if path.ends_with("/work/poll") {
        json(StatusCode::OK, "null")
    } else if path.starts_with("/v1/sessions/") {
        json(StatusCode::OK, SESSION)
    } else {
        json(StatusCode::OK, r#"{"data":[],"next_page":null}"#)
    }
}

fn header<'a>(seen: &'a Seen, name: &str) -> Vec<&'a str> {
    seen.headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect()
}

#[tokio::test]
async fn each_family_sends_exactly_its_own_beta_and_the_version() {
    let (url, log) = capture(scripted).await;
    let client = Client::builder(Credential::api_key("org-key"))
        .base_url(&url)
        .build()
        .unwrap();
    client
        .memory_stores()
        .list(&ListMemoryStores::default())
        .await
        .unwrap();
    client
        .memories("memstore_1")
        .list(&ListMemories::default())
        .await
        .unwrap();
    client.sessions().retrieve("sesn_1").await.unwrap();
    client
        .work("env_1")
        .poll(&PollWork::default(), None)
        .await
        .unwrap();

    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), 4);
    for s in &seen {
        assert_eq!(
            header(s, "anthropic-version"),
            vec!["2023-06-01"],
            "{}",
            s.path
        );
        assert_eq!(header(s, "x-api-key"), vec!["org-key"]);
        assert!(header(s, "authorization").is_empty());
        assert!(
            s.query.split('&').any(|kv| kv == "beta=true"),
            "{}",
            s.query
        );
    }
    assert_eq!(
        header(&seen[0], "anthropic-beta"),
        vec!["agent-memory-2026-07-22"]
    );
    assert_eq!(
        header(&seen[1], "anthropic-beta"),
        vec!["agent-memory-2026-07-22"]
    );
    assert_eq!(
        header(&seen[2], "anthropic-beta"),
        vec!["managed-agents-2026-04-01"]
    );
    assert_eq!(
        header(&seen[3], "anthropic-beta"),
        vec!["managed-agents-2026-04-01"]
    );
}

#[tokio::test]
async fn worker_credentials_are_bearer_only_and_extra_headers_pass_through() {
    let (url, log) = capture(scripted).await;
    let org = Client::builder(Credential::api_key("org-key"))
        .base_url(&url)
        .extra_header("x-custom-trace", "abc")
        .unwrap()
        .extra_header("x-api-key", "must-not-leak")
        .unwrap()
        .build()
        .unwrap();
    let worker = org
        .with_credential(Credential::bearer("env-key-123"))
        .with_helper("environments-worker");
    let session = worker.sessions().retrieve("sesn_1").await.unwrap();
    worker
        .work("env_1")
        .poll(
            &PollWork {
                block_ms: Some(999),
                reclaim_older_than_ms: Some(2000),
            },
            Some("host-abc123"),
        )
        .await
        .unwrap();

    let seen = log.lock().unwrap().clone();
    for s in &seen {
        assert_eq!(header(s, "authorization"), vec!["Bearer env-key-123"]);
        assert!(
            header(s, "x-api-key").is_empty(),
            "a worker credential is never sent with x-api-key"
        );
        assert_eq!(header(s, "x-custom-trace"), vec!["abc"]);
        assert_eq!(header(s, "x-stainless-helper"), vec!["environments-worker"]);
    }
    assert_eq!(header(&seen[1], "anthropic-worker-id"), vec!["host-abc123"]);
    assert!(
        seen[1].query.contains("block_ms=999")
            && seen[1].query.contains("reclaim_older_than_ms=2000")
    );
    assert!(header(&seen[0], "anthropic-worker-id").is_empty());

    // The session decodes, its memory store resource typed and the file kept raw.
    assert_eq!(session.agent.skills[0].skill_id, "skill_1");
    let stores: Vec<_> = session.memory_stores().collect();
    assert_eq!(stores.len(), 1);
    assert_eq!(stores[0].access(), Access::ReadOnly);
    assert_eq!(stores[0].mount_path.as_deref(), Some("/mnt/memory/prefs"));
    assert!(matches!(&session.resources[1], SessionResource::Other(v) if v["type"] == "file"));
    assert_eq!(
        session.agent.rest["name"], "a",
        "unused agent fields are kept"
    );
}

#[tokio::test]
async fn an_empty_poll_is_none_in_every_form() {
    fn empty(path: &str) -> Response {
        match path {
            "/v1/environments/null/work/poll" => json(StatusCode::OK, "null"),
            "/v1/environments/nocontent/work/poll" => StatusCode::NO_CONTENT.into_response(),
            "/v1/environments/blank/work/poll" => (StatusCode::OK, "").into_response(),
            _ => json(
                StatusCode::OK,
                r#"{"id":"work_1","type":"work","environment_id":"env_1","data":{"type":"session","id":"sesn_1"},
                    "state":"queued","secret":"abc","metadata":{},"created_at":"2026-01-01T00:00:00Z"}"#,
            ),
        }
    }
    let (url, _) = capture(empty).await;
    let client = Client::builder(Credential::bearer("k"))
        .base_url(&url)
        .build()
        .unwrap();
    for env in ["null", "nocontent", "blank"] {
        assert!(
            client
                .work(env)
                .poll(&PollWork::default(), None)
                .await
                .unwrap()
                .is_none(),
            "{env}"
        );
    }
    let work = client
        .work("env_1")
        .poll(&PollWork::default(), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(work.data.id, "sesn_1");
    assert!(work.data.is_session());
    assert_eq!(work.state, WorkState::Queued);
}

#[tokio::test]
async fn errors_are_decoded_and_classified() {
    fn failing(path: &str) -> Response {
        let (status, kind) = match path.rsplit('/').next().unwrap() {
            "e404" => (404, "not_found_error"),
            "e409" => (409, "memory_precondition_failed_error"),
            "e412" => (412, "precondition_failed_error"),
            "e401" => (401, "authentication_error"),
            "e408" => (408, "timeout_error"),
            "e429" => (429, "rate_limit_error"),
            "e500" => (500, "api_error"),
            "e529" => (529, "overloaded_error"),
            _ => return (StatusCode::BAD_GATEWAY, "upstream exploded").into_response(),
        };
        let body = format!(
            r#"{{"type":"error","error":{{"type":"{kind}","message":"m","details":{{"current_state":{{"state":"active","lease_extended":false,"ttl_seconds":30,"last_heartbeat":null}}}}}},"request_id":"req_1"}}"#
        );
        (
            StatusCode::from_u16(status).unwrap(),
            [("content-type", "application/json")],
            body,
        )
            .into_response()
    }
    let (url, _) = capture(failing).await;
    let client = Client::builder(Credential::bearer("k"))
        .base_url(&url)
        .build()
        .unwrap();
    for (id, status, permanent) in [
        ("e404", 404, true),
        ("e409", 409, true),
        ("e412", 412, true),
        ("e401", 401, true),
        ("e408", 408, false),
        ("e429", 429, false),
        ("e500", 500, false),
        ("e529", 529, false),
        ("e502", 502, false),
    ] {
        let err = client.sessions().retrieve(id).await.unwrap_err();
        assert_eq!(err.status(), Some(status), "{id}");
        assert_eq!(err.is_permanent(), permanent, "{id}");
        if status == 412 {
            let details = err.api().unwrap().details.clone().unwrap();
            let lease: LeaseState =
                serde_json::from_value(details["current_state"].clone()).unwrap();
            assert_eq!(lease.state, WorkState::Active);
        }
        if status == 502 {
            assert_eq!(err.api().unwrap().message, "upstream exploded");
        }
    }

    // Nobody listening: a transport error, transient.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let dead = Client::builder(Credential::bearer("k"))
        .base_url(dead_url)
        .build()
        .unwrap();
    let err = dead.sessions().retrieve("sesn_1").await.unwrap_err();
    assert!(matches!(err, Error::Transport(_)), "{err:?}");
    assert!(err.is_transient());
}

#[tokio::test]
async fn a_bad_base_url_is_a_configuration_error() {
    for url in ["not a url", "ftp://example.com"] {
        let err = Client::builder(Credential::bearer("k"))
            .base_url(url)
            .build()
            .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{url}");
    }
}

#[tokio::test]
async fn typed_round_trip_and_pagination_stream_against_the_devserver() {
    let s = crate::common::TestServer::start().await;
    let client = Client::builder(Credential::api_key(crate::common::ADMIN_KEY))
        .base_url(s.url())
        .build()
        .unwrap();
    let store = client
        .memory_stores()
        .create(&CreateMemoryStore {
            name: "typed".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let memories = client.memories(&store.id);
    for i in 0..30 {
        memories
            .create(
                &CreateMemory {
                    path: format!("/p/{i:02}.md"),
                    content: Some(format!("c{i}")),
                },
                None,
            )
            .await
            .unwrap();
    }
    let listed: Vec<MemoryListItem> = memories
        .list_all(ListMemories {
            limit: Some(7),
            ..Default::default()
        })
        .try_collect()
        .await
        .unwrap();
    let paths: Vec<String> = listed
        .iter()
        .map(|i| i.as_memory().unwrap().path.clone())
        .collect();
    let want: Vec<String> = (0..30).map(|i| format!("/p/{i:02}.md")).collect();
    assert_eq!(paths, want);

    let full: Vec<MemoryListItem> = memories
        .list_all(ListMemories {
            view: Some(View::Full),
            ..Default::default()
        })
        .try_collect()
        .await
        .unwrap();
    assert_eq!(full[3].as_memory().unwrap().content.as_deref(), Some("c3"));

    let first = listed[0].as_memory().unwrap();
    let updated = memories
        .update(
            &first.id,
            &UpdateMemory {
                content: Some("new".into()),
                precondition: Some(Precondition::content_sha256(&first.content_sha256)),
                ..Default::default()
            },
            Some(View::Full),
        )
        .await
        .unwrap();
    assert_eq!(updated.content.as_deref(), Some("new"));
    let err = memories
        .update(
            &first.id,
            &UpdateMemory {
                content: Some("newer".into()),
                precondition: Some(Precondition::content_sha256(&first.content_sha256)),
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(409));
    assert_eq!(err.api().unwrap().kind, "memory_precondition_failed_error");
    assert!(err.is_permanent());

    let versions: Vec<MemoryVersion> = client
        .memory_versions(&store.id)
        .list_all(ListMemoryVersions {
            memory_id: Some(first.id.clone()),
            ..Default::default()
        })
        .try_collect()
        .await
        .unwrap();
    assert_eq!(versions.len(), 2);
    assert_eq!(versions[0].operation, MemoryOperation::Modified);
    let deleted = memories
        .delete(&first.id, Some(&updated.content_sha256))
        .await
        .unwrap();
    assert_eq!(deleted.id, first.id);
    let stores: Vec<MemoryStore> = client
        .memory_stores()
        .list_all(ListMemoryStores::default())
        .try_collect()
        .await
        .unwrap();
    assert_eq!(stores.len(), 1);
}
