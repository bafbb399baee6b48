//! Every validation rule of the memory stores API: the bad request goes over
//! HTTP, the answer carries the right status and error type, and the server's
//! whole state (stores, memories, versions) is unchanged afterwards.

use crate::common::{ADMIN_KEY, MEMORY_BETA, TestServer, sha256};
use reqwest::Method;
use serde_json::{Value, json};

struct World {
    s: TestServer,
    store: String,
    archived: String,
    memory: String,
    archived_memory: String,
    old_version: String,
}

async fn world() -> World {
    let s = TestServer::start().await;
    let store = s.create_store("live").await;
    let m = s.create_memory(&store, "/a/b.md", "v1").await;
    let memory = m["id"].as_str().unwrap().to_string();
    s.create_memory(&store, "/c.md", "c").await;
    s.update_memory(&store, &memory, "v2").await;
    let old_version = m["memory_version_id"].as_str().unwrap().to_string();
    let archived = s.create_store("old").await;
    let am = s.create_memory(&archived, "/x.md", "x").await;
    s.archive_store(&archived).await;
    World {
        archived_memory: am["id"].as_str().unwrap().to_string(),
        s,
        store,
        archived,
        memory,
        old_version,
    }
}

/// Send, check the error, check nothing changed.
async fn refused(
    w: &World,
    method: Method,
    path: &str,
    body: Option<Value>,
    status: u16,
    kind: &str,
) -> String {
    let before = w.s.snapshot().await;
    let message =
        w.s.memory(method.clone(), path, body.clone())
            .await
            .expect_error(status, kind);
    assert_eq!(
        w.s.snapshot().await,
        before,
        "{method} {path} {body:?} changed the server"
    );
    message
}

#[tokio::test]
async fn bad_paths_are_refused_on_create_and_rename() {
    let w = world().await;
    let create = format!("/v1/memory_stores/{}/memories", w.store);
    let update = format!("{create}/{}", w.memory);
    let too_long = format!("/{}", "a".repeat(1024));
    let too_deep = "/s".repeat(21);
    let cases: Vec<(&str, &str)> = vec![
        ("", "empty"),
        ("a.md", "no leading slash"),
        ("/", "no segment"),
        ("/a//b.md", "empty segment"),
        ("/a/", "trailing slash"),
        ("/./a.md", "dot segment"),
        ("/a/../b.md", "dot-dot segment"),
        ("/bell\u{7}.md", "control character"),
        ("/new\nline.md", "newline"),
        ("/zw\u{200b}sp.md", "format character"),
        ("/line\u{2028}.md", "line separator"),
        ("/para\u{2029}.md", "paragraph separator"),
        ("/cafe\u{301}.md", "not NFC"),
        (&too_long, "over 1,024 bytes"),
        (&too_deep, "over 20 segments"),
    ];
    for (path, why) in cases {
        let m = refused(
            &w,
            Method::POST,
            &create,
            Some(json!({"path": path, "content": "x"})),
            400,
            "invalid_request_error",
        )
        .await;
        assert!(m.contains("path"), "{why}: {m}");
        refused(
            &w,
            Method::POST,
            &update,
            Some(json!({"path": path})),
            400,
            "invalid_request_error",
        )
        .await;
    }
    // Case-sensitive: /A/B.md is another path than /a/b.md and may be created.
    w.s.create_memory(&w.store, "/A/B.md", "upper").await;
}

#[tokio::test]
async fn oversized_content_is_refused() {
    let w = world().await;
    let create = format!("/v1/memory_stores/{}/memories", w.store);
    let big = "a".repeat(102_401);
    refused(
        &w,
        Method::POST,
        &create,
        Some(json!({"path": "/big.md", "content": big})),
        400,
        "invalid_request_error",
    )
    .await;
    refused(
        &w,
        Method::POST,
        &format!("{create}/{}", w.memory),
        Some(json!({"content": big})),
        400,
        "invalid_request_error",
    )
    .await;
    // Exactly the limit is fine.
    w.s.create_memory(&w.store, "/max.md", &"a".repeat(102_400))
        .await;
}

#[tokio::test]
async fn a_body_over_the_transport_limit_is_413() {
    let w = world().await;
    let create = format!("/v1/memory_stores/{}/memories", w.store);
    let huge = "a".repeat(5 * 1024 * 1024);
    refused(
        &w,
        Method::POST,
        &create,
        Some(json!({"path": "/huge.md", "content": huge})),
        413,
        "request_too_large",
    )
    .await;
}

#[tokio::test]
async fn malformed_bodies_are_refused() {
    let w = world().await;
    let create = format!("/v1/memory_stores/{}/memories", w.store);
    for body in [
        json!({"content": "no path"}),
        json!({"path": "/p.md"}),
        json!({"path": 7, "content": "x"}),
        json!({"path": "/p.md", "content": "x", "surprise": true}),
        json!(["not", "an", "object"]),
    ] {
        refused(
            &w,
            Method::POST,
            &create,
            Some(body),
            400,
            "invalid_request_error",
        )
        .await;
    }
    // Not JSON at all, and a lone surrogate (not UTF-8 representable).
    for raw in [&b"{not json"[..], br#"{"path":"/s.md","content":"\ud800"}"#] {
        let before = w.s.snapshot().await;
        let r =
            w.s.http
                .post(format!("{}{create}", w.s.url()))
                .header("x-api-key", ADMIN_KEY)
                .header("anthropic-version", "2023-06-01")
                .header("anthropic-beta", MEMORY_BETA)
                .header("content-type", "application/json")
                .body(raw.to_vec())
                .send()
                .await
                .unwrap();
        assert_eq!(r.status(), 400);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(w.s.snapshot().await, before);
    }
}

#[tokio::test]
async fn create_on_an_occupied_path_or_a_folder_of_a_memory_conflicts() {
    let w = world().await;
    let create = format!("/v1/memory_stores/{}/memories", w.store);
    for (path, conflicting) in [
        ("/a/b.md", "/a/b.md"),
        ("/a", "/a/b.md"),
        ("/a/b.md/c.md", "/a/b.md"),
        ("/c.md/d/e.md", "/c.md"),
    ] {
        let before = w.s.snapshot().await;
        let a =
            w.s.memory(
                Method::POST,
                &create,
                Some(json!({"path": path, "content": "x"})),
            )
            .await;
        a.expect_error(409, "memory_path_conflict_error");
        assert_eq!(
            a.body["error"]["details"]["conflicting_path"], conflicting,
            "{path}"
        );
        assert_eq!(w.s.snapshot().await, before);
    }
}

#[tokio::test]
async fn preconditions_guard_updates_and_deletes() {
    let w = world().await;
    let one = format!("/v1/memory_stores/{}/memories/{}", w.store, w.memory);
    let stale = json!({"type": "content_sha256", "content_sha256": sha256("v1")});
    refused(
        &w,
        Method::POST,
        &one,
        Some(json!({"content": "v3", "precondition": stale})),
        409,
        "memory_precondition_failed_error",
    )
    .await;
    refused(
        &w,
        Method::POST,
        &one,
        Some(json!({"path": "/moved.md", "precondition": stale})),
        409,
        "memory_precondition_failed_error",
    )
    .await;
    refused(
        &w,
        Method::DELETE,
        &format!("{one}?expected_content_sha256={}", sha256("v1")),
        None,
        409,
        "memory_precondition_failed_error",
    )
    .await;
    // Malformed preconditions are 400s.
    for p in [
        json!({"type": "content_sha256", "content_sha256": "ABC"}),
        json!({"type": "content_sha256"}),
        json!({"type": "etag", "content_sha256": sha256("v2")}),
    ] {
        refused(
            &w,
            Method::POST,
            &one,
            Some(json!({"content": "v3", "precondition": p})),
            400,
            "invalid_request_error",
        )
        .await;
    }
    refused(
        &w,
        Method::DELETE,
        &format!("{one}?expected_content_sha256=xyz"),
        None,
        400,
        "invalid_request_error",
    )
    .await;
    // An update that changes nothing at all is a 400.
    refused(
        &w,
        Method::POST,
        &one,
        Some(json!({})),
        400,
        "invalid_request_error",
    )
    .await;
    refused(
        &w,
        Method::POST,
        &one,
        Some(json!({"precondition": {"type": "content_sha256", "content_sha256": sha256("v2")}})),
        400,
        "invalid_request_error",
    )
    .await;
}

#[tokio::test]
async fn a_store_holds_at_most_2000_memories() {
    let s = TestServer::start().await;
    let store = s.create_store("full").await;
    let client = envworker::api::Client::builder(envworker::api::Credential::api_key(ADMIN_KEY))
        .base_url(s.url())
        .build()
        .unwrap();
    // Fill it concurrently through the typed client.
    let memories = client.memories(&store);
    let creates = (0..2000).map(|i| {
        let memories = &memories;
        async move {
            memories
                .create(
                    &envworker::api::types::CreateMemory {
                        path: format!("/m/{i:04}.md"),
                        content: Some("x".into()),
                    },
                    None,
                )
                .await
                .unwrap()
        }
    });
    let created: Vec<_> = futures::stream::iter(creates)
        .buffer_unordered(16)
        .collect()
        .await;
    assert_eq!(created.len(), 2000);

    let w = World {
        s,
        store: store.clone(),
        archived: String::new(),
        memory: created[0].id.clone(),
        archived_memory: String::new(),
        old_version: String::new(),
    };
    let m = refused(
        &w,
        Method::POST,
        &format!("/v1/memory_stores/{store}/memories"),
        Some(json!({"path": "/one-too-many.md", "content": "x"})),
        400,
        "invalid_request_error",
    )
    .await;
    assert!(m.contains("2000"), "{m}");
    // Existing memories stay editable, and a delete makes room again.
    let one = format!("/v1/memory_stores/{store}/memories/{}", w.memory);
    w.s.memory(Method::POST, &one, Some(json!({"content": "edited"})))
        .await
        .ok();
    w.s.memory(Method::DELETE, &one, None).await.ok();
    w.s.create_memory(&store, "/one-more.md", "fits").await;
}

use futures::StreamExt;

#[tokio::test]
async fn archived_stores_are_read_only() {
    let w = world().await;
    let base = format!("/v1/memory_stores/{}", w.archived);
    refused(
        &w,
        Method::POST,
        &format!("{base}/memories"),
        Some(json!({"path": "/new.md", "content": "n"})),
        400,
        "invalid_request_error",
    )
    .await;
    refused(
        &w,
        Method::POST,
        &format!("{base}/memories/{}", w.archived_memory),
        Some(json!({"content": "n"})),
        400,
        "invalid_request_error",
    )
    .await;
    refused(
        &w,
        Method::POST,
        &base,
        Some(json!({"name": "renamed"})),
        400,
        "invalid_request_error",
    )
    .await;
}

#[tokio::test]
async fn store_fields_are_validated() {
    let w = world().await;
    let bad_bodies = vec![
        json!({}),
        json!({"name": ""}),
        json!({"name": "x".repeat(256)}),
        json!({"name": "tab\tname"}),
        json!({"name": "ok", "description": "d".repeat(1025)}),
        json!({"name": "ok", "metadata": (0..17).map(|i| (format!("k{i}"), json!("v"))).collect::<serde_json::Map<_, _>>()}),
        json!({"name": "ok", "metadata": {"": "v"}}),
        json!({"name": "ok", "metadata": {"k".repeat(65): "v"}}),
        json!({"name": "ok", "metadata": {"k": "v".repeat(513)}}),
        json!({"name": "ok", "metadata": {"k": 1}}),
    ];
    for body in bad_bodies {
        refused(
            &w,
            Method::POST,
            "/v1/memory_stores",
            Some(body),
            400,
            "invalid_request_error",
        )
        .await;
    }
    let one = format!("/v1/memory_stores/{}", w.store);
    for body in [
        json!({"name": ""}),
        json!({"description": "d".repeat(1025)}),
        json!({"metadata": (0..17).map(|i| (format!("k{i}"), json!("v"))).collect::<serde_json::Map<_, _>>()}),
    ] {
        refused(
            &w,
            Method::POST,
            &one,
            Some(body),
            400,
            "invalid_request_error",
        )
        .await;
    }
}

#[tokio::test]
async fn query_parameters_are_validated() {
    let w = world().await;
    let list = format!("/v1/memory_stores/{}/memories", w.store);
    for q in [
        "limit=0",
        "limit=101",
        "limit=ten",
        "depth=2",
        "depth=-1",
        "view=everything",
        "path_prefix=notes/",
        "path_prefix=/a",
        "path_prefix=/a//",
        "page=garbage",
    ] {
        refused(
            &w,
            Method::GET,
            &format!("{list}?{q}"),
            None,
            400,
            "invalid_request_error",
        )
        .await;
    }
    for q in [
        "include_archived=maybe",
        "created_at[gte]=yesterday",
        "limit=1000",
    ] {
        refused(
            &w,
            Method::GET,
            &format!("/v1/memory_stores?{q}"),
            None,
            400,
            "invalid_request_error",
        )
        .await;
    }
    let versions = format!("/v1/memory_stores/{}/memory_versions", w.store);
    for q in ["operation=renamed", "limit=0", "view=x"] {
        refused(
            &w,
            Method::GET,
            &format!("{versions}?{q}"),
            None,
            400,
            "invalid_request_error",
        )
        .await;
    }
    // The head version of a live memory cannot be redacted; an old one can.
    let head =
        w.s.memory(Method::GET, &format!("{list}/{}", w.memory), None)
            .await
            .ok();
    refused(
        &w,
        Method::POST,
        &format!(
            "{versions}/{}/redact",
            head["memory_version_id"].as_str().unwrap()
        ),
        None,
        400,
        "invalid_request_error",
    )
    .await;
    w.s.memory(
        Method::POST,
        &format!("{versions}/{}/redact", w.old_version),
        None,
    )
    .await
    .ok();
}

#[tokio::test]
async fn headers_and_credentials_are_checked_before_anything_happens() {
    let w = world().await;
    let create = "/v1/memory_stores";
    let body = json!({"name": "sneaky"});
    type Case<'a> = (Vec<(&'a str, &'a str)>, u16, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec![
                ("anthropic-version", "2023-06-01"),
                ("anthropic-beta", MEMORY_BETA),
            ],
            401,
            "authentication_error",
        ),
        (
            vec![
                ("x-api-key", "wrong"),
                ("anthropic-version", "2023-06-01"),
                ("anthropic-beta", MEMORY_BETA),
            ],
            401,
            "authentication_error",
        ),
        (
            vec![
                ("authorization", "Bearer nobody"),
                ("anthropic-version", "2023-06-01"),
                ("anthropic-beta", MEMORY_BETA),
            ],
            401,
            "authentication_error",
        ),
        (
            vec![("x-api-key", ADMIN_KEY), ("anthropic-beta", MEMORY_BETA)],
            400,
            "invalid_request_error",
        ),
        (
            vec![
                ("x-api-key", ADMIN_KEY),
                ("anthropic-version", "yesterday"),
                ("anthropic-beta", MEMORY_BETA),
            ],
            400,
            "invalid_request_error",
        ),
        (
            vec![
                ("x-api-key", ADMIN_KEY),
                ("anthropic-version", "2023-06-01"),
            ],
            400,
            "invalid_request_error",
        ),
        (
            vec![
                ("x-api-key", ADMIN_KEY),
                ("anthropic-version", "2023-06-01"),
                (
                    "anthropic-beta",
                    "managed-agents-2026-04-01,agent-memory-2026-07-22",
                ),
            ],
            400,
            "invalid_request_error",
        ),
    ];
    for (headers, status, kind) in cases {
        let before = w.s.snapshot().await;
        w.s.send(Method::POST, create, Some(body.clone()), &headers)
            .await
            .expect_error(status, kind);
        assert_eq!(w.s.snapshot().await, before, "{headers:?}");
    }
    // managed-agents alone is also accepted by the memory endpoints.
    let ok =
        w.s.send(
            Method::GET,
            create,
            None,
            &[
                ("x-api-key", ADMIN_KEY),
                ("anthropic-version", "2023-06-01"),
                ("anthropic-beta", "managed-agents-2026-04-01"),
            ],
        )
        .await;
    assert!(ok.status.is_success());
}

#[tokio::test]
async fn ids_of_nothing_are_404() {
    let w = world().await;
    let s = &w.store;
    for (method, path) in [
        (Method::GET, "/v1/memory_stores/memstore_nope".to_string()),
        (
            Method::POST,
            "/v1/memory_stores/memstore_nope/archive".to_string(),
        ),
        (
            Method::DELETE,
            "/v1/memory_stores/memstore_nope".to_string(),
        ),
        (
            Method::GET,
            format!("/v1/memory_stores/{s}/memories/mem_nope"),
        ),
        (
            Method::DELETE,
            format!("/v1/memory_stores/{s}/memories/mem_nope"),
        ),
        (
            Method::GET,
            format!("/v1/memory_stores/{s}/memory_versions/memver_nope"),
        ),
        (
            Method::POST,
            format!("/v1/memory_stores/{s}/memory_versions/memver_nope/redact"),
        ),
        // Another store's memory, through this store.
        (
            Method::GET,
            format!("/v1/memory_stores/{}/memories/{}", w.archived, w.memory),
        ),
    ] {
        refused(&w, method, &path, None, 404, "not_found_error").await;
    }
    refused(
        &w,
        Method::POST,
        &format!("/v1/memory_stores/{s}/memories/mem_nope"),
        Some(json!({"content": "x"})),
        404,
        "not_found_error",
    )
    .await;
    refused(
        &w,
        Method::POST,
        "/v1/memory_stores/memstore_nope/memories",
        Some(json!({"path": "/x.md", "content": "x"})),
        404,
        "not_found_error",
    )
    .await;
}
