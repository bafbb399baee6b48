//! The devserver's memory stores API over real HTTP: every endpoint of
//! `spec/protocol.md` §2.5, its shapes and its behaviour.

use crate::common::{TestServer, sha256};
use reqwest::Method;
use serde_json::{Value, json};

fn ids(items: &[Value], field: &str) -> Vec<String> {
    items
        .iter()
        .map(|i| i[field].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn store_create_retrieve_update_archive_delete() {
    let s = TestServer::start().await;
    let created = s
        .memory(
            Method::POST,
            "/v1/memory_stores",
            Some(json!({"name": "User Preferences", "metadata": {"owner": "ana"}})),
        )
        .await
        .ok();
    let id = created["id"].as_str().unwrap();
    assert!(id.starts_with("memstore_"));
    assert_eq!(created["type"], "memory_store");
    assert_eq!(
        created["description"], "",
        "an unset description is an empty string"
    );
    assert_eq!(created["metadata"], json!({"owner": "ana"}));
    assert_eq!(created["archived_at"], Value::Null);

    let got = s
        .memory(Method::GET, &format!("/v1/memory_stores/{id}"), None)
        .await
        .ok();
    assert_eq!(got, created);

    let updated = s
        .memory(
            Method::POST,
            &format!("/v1/memory_stores/{id}"),
            Some(
                json!({"name": "Prefs", "description": "what the user likes",
                        "metadata": {"owner": null, "team": "core"}}),
            ),
        )
        .await
        .ok();
    assert_eq!(updated["name"], "Prefs");
    assert_eq!(updated["description"], "what the user likes");
    assert_eq!(
        updated["metadata"],
        json!({"team": "core"}),
        "null removes a key, a string upserts"
    );
    assert_eq!(updated["created_at"], created["created_at"]);

    let cleared = s
        .memory(
            Method::POST,
            &format!("/v1/memory_stores/{id}"),
            Some(json!({"description": ""})),
        )
        .await
        .ok();
    assert_eq!(
        cleared["description"], "",
        "an empty string clears the description"
    );

    let archived = s
        .memory(
            Method::POST,
            &format!("/v1/memory_stores/{id}/archive"),
            None,
        )
        .await
        .ok();
    assert!(archived["archived_at"].is_string());
    let again = s
        .memory(
            Method::POST,
            &format!("/v1/memory_stores/{id}/archive"),
            None,
        )
        .await
        .ok();
    assert_eq!(
        again, archived,
        "archiving twice returns the store unchanged"
    );

    let deleted = s
        .memory(Method::DELETE, &format!("/v1/memory_stores/{id}"), None)
        .await
        .ok();
    assert_eq!(deleted, json!({"id": id, "type": "memory_store_deleted"}));
    s.memory(Method::GET, &format!("/v1/memory_stores/{id}"), None)
        .await
        .expect_error(404, "not_found_error");
    s.memory(
        Method::GET,
        &format!("/v1/memory_stores/{id}/memories"),
        None,
    )
    .await
    .expect_error(404, "not_found_error");
}

#[tokio::test]
async fn store_listing_is_newest_first_paginated_and_hides_archived() {
    let s = TestServer::start().await;
    let mut made = Vec::new();
    for i in 0..5 {
        made.push(s.create_store(&format!("store {i}")).await);
    }
    s.archive_store(&made[1]).await;

    let (all, pages) = s.list_all("/v1/memory_stores?limit=2").await;
    let mut expected: Vec<String> = made.iter().rev().cloned().collect();
    expected.retain(|id| id != &made[1]);
    assert_eq!(ids(&all, "id"), expected);
    assert_eq!(pages, 2);

    let (with_archived, _) = s
        .list_all("/v1/memory_stores?limit=2&include_archived=true")
        .await;
    assert_eq!(with_archived.len(), 5);

    // created_at filters are inclusive.
    let third = s
        .memory(Method::GET, &format!("/v1/memory_stores/{}", made[2]), None)
        .await
        .ok();
    let at = third["created_at"].as_str().unwrap();
    let (since, _) = s
        .list_all(&format!(
            "/v1/memory_stores?created_at[gte]={}",
            urlencode(at)
        ))
        .await;
    assert_eq!(
        ids(&since, "id"),
        vec![made[4].clone(), made[3].clone(), made[2].clone()]
    );
    let (until, _) = s
        .list_all(&format!(
            "/v1/memory_stores?created_at[lte]={}",
            urlencode(at)
        ))
        .await;
    assert_eq!(ids(&until, "id"), vec![made[2].clone(), made[0].clone()]);
}

fn urlencode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

#[tokio::test]
async fn memory_crud_views_and_hashes() {
    let s = TestServer::start().await;
    let store = s.create_store("notes").await;
    let base = format!("/v1/memory_stores/{store}/memories");

    // The hash is of the exact bytes: a decomposed é is not normalised.
    let content = "cafe\u{301} — notes\n";
    let created = s
        .memory(
            Method::POST,
            &base,
            Some(json!({"path": "/a/b.md", "content": content})),
        )
        .await
        .ok();
    assert_eq!(created["type"], "memory");
    assert_eq!(
        created["content"],
        Value::Null,
        "create answers in the basic view by default"
    );
    assert_eq!(created["content_sha256"], sha256(content));
    assert_eq!(created["content_size_bytes"], content.len());
    assert!(
        created["memory_version_id"]
            .as_str()
            .unwrap()
            .starts_with("memver_")
    );
    let id = created["id"].as_str().unwrap();

    let full = s
        .memory(Method::GET, &format!("{base}/{id}"), None)
        .await
        .ok();
    assert_eq!(
        full["content"], content,
        "retrieve answers in the full view by default"
    );
    let basic = s
        .memory(Method::GET, &format!("{base}/{id}?view=basic"), None)
        .await
        .ok();
    assert_eq!(basic["content"], Value::Null);
    assert_eq!(
        basic["content_sha256"],
        sha256(content),
        "the hash is there in every view"
    );

    let with_view = s
        .memory(
            Method::POST,
            &format!("{base}?view=full"),
            Some(json!({"path": "/c.md", "content": "c"})),
        )
        .await
        .ok();
    assert_eq!(with_view["content"], "c");

    let empty = s
        .memory(
            Method::POST,
            &base,
            Some(json!({"path": "/empty.md", "content": null})),
        )
        .await
        .ok();
    assert_eq!(
        empty["content_sha256"],
        sha256(""),
        "null content is an empty memory"
    );
    assert_eq!(empty["content_size_bytes"], 0);

    // Another store's memory is not found through this store.
    let other = s.create_store("other").await;
    s.memory(
        Method::GET,
        &format!("/v1/memory_stores/{other}/memories/{id}"),
        None,
    )
    .await
    .expect_error(404, "not_found_error");
}

#[tokio::test]
async fn update_with_precondition_rename_and_no_ops() {
    let s = TestServer::start().await;
    let store = s.create_store("notes").await;
    let base = format!("/v1/memory_stores/{store}/memories");
    let versions = format!("/v1/memory_stores/{store}/memory_versions");
    let m = s.create_memory(&store, "/todo.md", "v1").await;
    let id = m["id"].as_str().unwrap().to_string();
    let one = format!("{base}/{id}");

    // A matching precondition applies and appends a version.
    let v2 = s
        .memory(
            Method::POST,
            &one,
            Some(json!({"content": "v2", "precondition": {"type": "content_sha256", "content_sha256": sha256("v1")}})),
        )
        .await
        .ok();
    assert_eq!(v2["content_sha256"], sha256("v2"));
    assert_ne!(v2["memory_version_id"], m["memory_version_id"]);
    assert_eq!(s.list_all(&versions).await.0.len(), 2);

    // A stale precondition is refused with 409 and changes nothing.
    let before = s.snapshot().await;
    s.memory(
        Method::POST,
        &one,
        Some(json!({"content": "v3", "precondition": {"type": "content_sha256", "content_sha256": sha256("v1")}})),
    )
    .await
    .expect_error(409, "memory_precondition_failed_error");
    assert_eq!(s.snapshot().await, before);

    // ...unless the stored state already equals the request: 200, no version.
    let same = s
        .memory(
            Method::POST,
            &one,
            Some(json!({"content": "v2", "precondition": {"type": "content_sha256", "content_sha256": sha256("v1")}})),
        )
        .await
        .ok();
    assert_eq!(same["memory_version_id"], v2["memory_version_id"]);
    assert_eq!(s.snapshot().await, before, "a no-op writes no version");

    // A plain no-op update writes no version either.
    s.memory(
        Method::POST,
        &one,
        Some(json!({"content": "v2", "path": "/todo.md"})),
    )
    .await
    .ok();
    assert_eq!(s.snapshot().await, before);

    // Rename: the id stays, the path moves, one version.
    let renamed = s
        .memory(Method::POST, &one, Some(json!({"path": "/done/todo.md"})))
        .await
        .ok();
    assert_eq!(renamed["id"], id);
    assert_eq!(renamed["path"], "/done/todo.md");
    assert_eq!(renamed["content_sha256"], sha256("v2"));
    assert_eq!(s.list_all(&versions).await.0.len(), 3);
    s.memory(Method::GET, &format!("{base}/{id}"), None)
        .await
        .ok();

    // Rename onto an occupied path, or onto a folder/file of another memory: 409.
    s.create_memory(&store, "/other.md", "o").await;
    s.create_memory(&store, "/deep/x/y.md", "y").await;
    let before = s.snapshot().await;
    for target in ["/other.md", "/deep/x", "/other.md/inside.md"] {
        let a = s
            .memory(Method::POST, &one, Some(json!({"path": target})))
            .await;
        a.expect_error(409, "memory_path_conflict_error");
        assert!(a.body["error"]["details"]["conflicting_memory_id"].is_string());
    }
    assert_eq!(s.snapshot().await, before);

    // Renaming a memory below its own old path is fine: it does not conflict with itself.
    let nested = s
        .memory(
            Method::POST,
            &one,
            Some(json!({"path": "/done/todo.md/v2.md"})),
        )
        .await
        .ok();
    assert_eq!(nested["path"], "/done/todo.md/v2.md");
}

#[tokio::test]
async fn delete_with_expected_hash() {
    let s = TestServer::start().await;
    let store = s.create_store("notes").await;
    let m = s.create_memory(&store, "/gone.md", "bye").await;
    let id = m["id"].as_str().unwrap();
    let one = format!("/v1/memory_stores/{store}/memories/{id}");

    let before = s.snapshot().await;
    s.memory(
        Method::DELETE,
        &format!("{one}?expected_content_sha256={}", sha256("other")),
        None,
    )
    .await
    .expect_error(409, "memory_precondition_failed_error");
    assert_eq!(
        s.snapshot().await,
        before,
        "a refused delete deletes nothing"
    );

    let deleted = s
        .memory(
            Method::DELETE,
            &format!("{one}?expected_content_sha256={}", sha256("bye")),
            None,
        )
        .await
        .ok();
    assert_eq!(deleted, json!({"id": id, "type": "memory_deleted"}));
    s.memory(Method::GET, &one, None)
        .await
        .expect_error(404, "not_found_error");
    s.memory(Method::DELETE, &one, None)
        .await
        .expect_error(404, "not_found_error");

    // The versions survive, the deletion included; the path is free again.
    let (versions, _) = s
        .list_all(&format!(
            "/v1/memory_stores/{store}/memory_versions?memory_id={id}&view=full"
        ))
        .await;
    assert_eq!(ids(&versions, "operation"), vec!["deleted", "created"]);
    assert_eq!(versions[0]["path"], "/gone.md");
    assert_eq!(versions[0]["content"], Value::Null);
    assert_eq!(versions[0]["content_sha256"], Value::Null);
    assert_eq!(versions[1]["content"], "bye");
    s.create_memory(&store, "/gone.md", "back").await;

    // Unconditional delete.
    let m = s.create_memory(&store, "/plain.md", "p").await;
    s.memory(
        Method::DELETE,
        &format!(
            "/v1/memory_stores/{store}/memories/{}",
            m["id"].as_str().unwrap()
        ),
        None,
    )
    .await
    .ok();
}

#[tokio::test]
async fn listing_paginates_in_both_views_in_path_order() {
    let s = TestServer::start().await;
    let store = s.create_store("many").await;
    let mut paths: Vec<String> = (0..45).map(|i| format!("/n/{i:03}.md")).collect();
    for p in &paths {
        s.create_memory(&store, p, &format!("content of {p}")).await;
    }
    paths.sort();
    let base = format!("/v1/memory_stores/{store}/memories");

    let (basic, pages) = s.list_all(&format!("{base}?limit=10")).await;
    assert_eq!(pages, 5);
    assert_eq!(ids(&basic, "path"), paths);
    assert!(
        basic
            .iter()
            .all(|m| m["content"].is_null() && m["content_sha256"].is_string())
    );

    // full is capped at 20 a page whatever limit says.
    let first = s
        .memory(Method::GET, &format!("{base}?view=full&limit=100"), None)
        .await
        .ok();
    assert_eq!(first["data"].as_array().unwrap().len(), 20);
    let (full, pages) = s.list_all(&format!("{base}?view=full&limit=100")).await;
    assert_eq!(pages, 3);
    assert_eq!(ids(&full, "path"), paths);
    assert!(
        full.iter()
            .all(|m| m["content"].as_str().unwrap().starts_with("content of "))
    );

    // The default page is 20; the last page says there is no next one.
    let last = s
        .memory(Method::GET, &format!("{base}?limit=45"), None)
        .await
        .ok();
    assert_eq!(last["data"].as_array().unwrap().len(), 45);
    assert_eq!(last["next_page"], Value::Null);
}

#[tokio::test]
async fn path_prefix_is_segment_aligned_and_depth_one_rolls_up_folders() {
    let s = TestServer::start().await;
    let store = s.create_store("tree").await;
    for p in [
        "/notes/todo.md",
        "/notes/a/1.md",
        "/notes/a/2.md",
        "/notes/b.md",
        "/notes/b/deep/3.md",
        "/notes-archive/old.md",
        "/top.md",
        "/z/1.md",
    ] {
        s.create_memory(&store, p, "x").await;
    }
    let base = format!("/v1/memory_stores/{store}/memories");

    let (notes, _) = s.list_all(&format!("{base}?path_prefix=/notes/")).await;
    assert_eq!(
        ids(&notes, "path"),
        vec![
            "/notes/a/1.md",
            "/notes/a/2.md",
            "/notes/b.md",
            "/notes/b/deep/3.md",
            "/notes/todo.md"
        ]
    );

    // depth=1: direct children and one memory_prefix per folder, in path order.
    let expected_root = [
        ("memory_prefix", "/notes-archive/"),
        ("memory_prefix", "/notes/"),
        ("memory", "/top.md"),
        ("memory_prefix", "/z/"),
    ];
    let (root, _) = s.list_all(&format!("{base}?depth=1")).await;
    let got: Vec<(String, String)> = root
        .iter()
        .map(|i| {
            (
                i["type"].as_str().unwrap().into(),
                i["path"].as_str().unwrap().into(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = expected_root
        .iter()
        .map(|(t, p)| (t.to_string(), p.to_string()))
        .collect();
    assert_eq!(got, want);

    // Page size 1: every rollup counts toward the limit and none repeats across pages.
    let (paged, pages) = s
        .list_all(&format!("{base}?depth=1&limit=1&path_prefix=/notes/"))
        .await;
    let got: Vec<(String, String)> = paged
        .iter()
        .map(|i| {
            (
                i["type"].as_str().unwrap().into(),
                i["path"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("memory_prefix".into(), "/notes/a/".into()),
            ("memory".into(), "/notes/b.md".into()),
            ("memory_prefix".into(), "/notes/b/".into()),
            ("memory".into(), "/notes/todo.md".into()),
        ]
    );
    assert_eq!(pages, 4);
}

#[tokio::test]
async fn versions_history_filters_retrieve_and_redact() {
    let s = TestServer::start().await;
    let store = s.create_store("hist").await;
    let base = format!("/v1/memory_stores/{store}/memories");
    let vbase = format!("/v1/memory_stores/{store}/memory_versions");
    let a = s.create_memory(&store, "/a.md", "a1").await;
    let a_id = a["id"].as_str().unwrap();
    s.update_memory(&store, a_id, "a2").await;
    s.update_memory(&store, a_id, "a3").await;
    let b = s.create_memory(&store, "/b.md", "b1").await;

    let (all, _) = s.list_all(&format!("{vbase}?limit=2")).await;
    assert_eq!(
        ids(&all, "operation"),
        vec!["created", "modified", "modified", "created"]
    );
    assert_eq!(all[0]["memory_id"], b["id"], "newest first");
    assert!(
        all.iter().all(|v| v["content"].is_null()),
        "basic by default"
    );
    assert_eq!(all[1]["content_sha256"], sha256("a3"));
    assert_eq!(all[1]["created_by"]["type"], "api_actor");
    let key_id = all[1]["created_by"]["api_key_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(key_id.starts_with("apikey_") && !key_id.contains(crate::common::ADMIN_KEY));

    let (of_a, _) = s
        .list_all(&format!("{vbase}?memory_id={a_id}&view=full"))
        .await;
    assert_eq!(ids(&of_a, "content"), vec!["a3", "a2", "a1"]);
    let (created, _) = s.list_all(&format!("{vbase}?operation=created")).await;
    assert_eq!(created.len(), 2);
    let (by_key, _) = s.list_all(&format!("{vbase}?api_key_id={key_id}")).await;
    assert_eq!(by_key.len(), 4);
    let (by_other_key, _) = s
        .list_all(&format!("{vbase}?api_key_id=apikey_nobody"))
        .await;
    assert!(by_other_key.is_empty());
    let (by_session, _) = s.list_all(&format!("{vbase}?session_id=sesn_nobody")).await;
    assert!(by_session.is_empty());
    let newest_at = all[0]["created_at"].as_str().unwrap();
    let (since, _) = s
        .list_all(&format!("{vbase}?created_at[gte]={}", urlencode(newest_at)))
        .await;
    assert_eq!(since.len(), 1);

    // Retrieve is full by default.
    let oldest = &of_a[2];
    let vid = oldest["id"].as_str().unwrap();
    let got = s
        .memory(Method::GET, &format!("{vbase}/{vid}"), None)
        .await
        .ok();
    assert_eq!(got["content"], "a1");
    let got_basic = s
        .memory(Method::GET, &format!("{vbase}/{vid}?view=basic"), None)
        .await
        .ok();
    assert_eq!(got_basic["content"], Value::Null);

    // Redact an old version: content, path, hash and size go; who and when stay.
    let redacted = s
        .memory(Method::POST, &format!("{vbase}/{vid}/redact"), None)
        .await
        .ok();
    for gone in ["content", "path", "content_sha256", "content_size_bytes"] {
        assert_eq!(redacted[gone], Value::Null, "{gone}");
    }
    assert!(redacted["redacted_at"].is_string());
    assert_eq!(redacted["redacted_by"]["type"], "api_actor");
    assert_eq!(redacted["created_by"], oldest["created_by"]);
    let again = s
        .memory(Method::POST, &format!("{vbase}/{vid}/redact"), None)
        .await
        .ok();
    assert_eq!(again, redacted, "redacting twice changes nothing");
    let read_back = s
        .memory(Method::GET, &format!("{vbase}/{vid}"), None)
        .await
        .ok();
    assert_eq!(
        read_back, redacted,
        "a redacted version still reads with 200"
    );

    // The head version of a live memory cannot be redacted.
    let head = s
        .memory(Method::GET, &format!("{base}/{a_id}"), None)
        .await
        .ok();
    let before = s.snapshot().await;
    s.memory(
        Method::POST,
        &format!(
            "{vbase}/{}/redact",
            head["memory_version_id"].as_str().unwrap()
        ),
        None,
    )
    .await
    .expect_error(400, "invalid_request_error");
    assert_eq!(s.snapshot().await, before);

    s.memory(Method::GET, &format!("{vbase}/memver_nope"), None)
        .await
        .expect_error(404, "not_found_error");
}

#[tokio::test]
async fn archived_store_is_read_only_but_deletable() {
    let s = TestServer::start().await;
    let store = s.create_store("old").await;
    let m = s.create_memory(&store, "/keep.md", "k").await;
    let gone = s.create_memory(&store, "/gone.md", "g").await;
    let mid = m["id"].as_str().unwrap();
    s.update_memory(&store, mid, "k2").await;
    s.archive_store(&store).await;

    // Reads work.
    s.memory(
        Method::GET,
        &format!("/v1/memory_stores/{store}/memories/{mid}"),
        None,
    )
    .await
    .ok();
    s.list_all(&format!("/v1/memory_stores/{store}/memories"))
        .await;

    // Deletes and redaction work.
    s.memory(
        Method::DELETE,
        &format!(
            "/v1/memory_stores/{store}/memories/{}",
            gone["id"].as_str().unwrap()
        ),
        None,
    )
    .await
    .ok();
    let (versions, _) = s
        .list_all(&format!(
            "/v1/memory_stores/{store}/memory_versions?memory_id={mid}"
        ))
        .await;
    s.memory(
        Method::POST,
        &format!(
            "/v1/memory_stores/{store}/memory_versions/{}/redact",
            versions[1]["id"].as_str().unwrap()
        ),
        None,
    )
    .await
    .ok();
    s.memory(Method::DELETE, &format!("/v1/memory_stores/{store}"), None)
        .await
        .ok();
}

#[tokio::test]
async fn the_beta_query_flag_and_request_ids() {
    let s = TestServer::start().await;
    let a = s
        .memory(Method::GET, "/v1/memory_stores?beta=true", None)
        .await;
    assert!(a.status.is_success());
    assert!(
        a.headers["request-id"]
            .to_str()
            .unwrap()
            .starts_with("req_")
    );
    let e = s
        .memory(Method::GET, "/v1/memory_stores/memstore_x?beta=true", None)
        .await;
    e.expect_error(404, "not_found_error");
    assert_eq!(
        e.headers["request-id"].to_str().unwrap(),
        e.body["request_id"].as_str().unwrap()
    );
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_in_the_envelope() {
    let s = TestServer::start().await;
    s.memory(Method::GET, "/v1/nothing_here", None)
        .await
        .expect_error(404, "not_found_error");
    s.memory(Method::PUT, "/v1/memory_stores", None)
        .await
        .expect_error(405, "invalid_request_error");
}

#[tokio::test]
async fn the_data_dir_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        envworker::devserver::DevserverConfig::new(crate::common::ADMIN_KEY).data_dir(dir.path());
    let first = TestServer::start_with(config.clone()).await;
    let store = first.create_store("durable").await;
    first.create_memory(&store, "/kept.md", "still here").await;
    let before = first.snapshot().await;
    first.running.shutdown().await;

    let second = TestServer::start_with(config).await;
    assert_eq!(second.snapshot().await, before);
    let (memories, _) = second
        .list_all(&format!("/v1/memory_stores/{store}/memories?view=full"))
        .await;
    assert_eq!(memories[0]["content"], "still here");
}

#[tokio::test]
async fn without_a_data_dir_each_server_starts_empty() {
    let first = TestServer::start().await;
    first.create_store("ephemeral").await;
    let second = TestServer::start().await;
    assert_eq!(second.snapshot().await, json!([]));
}

#[tokio::test]
async fn the_app_answers_through_oneshot_without_a_listener() {
    use tower::ServiceExt;
    let server =
        envworker::devserver::Devserver::open(envworker::devserver::DevserverConfig::new("k"))
            .unwrap();
    let response = server
        .app()
        .oneshot(
            axum::http::Request::get("/v1/memory_stores")
                .header("x-api-key", "k")
                .header("anthropic-version", "2023-06-01")
                .header("anthropic-beta", crate::common::MEMORY_BETA)
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap(),
        json!({"data": [], "next_page": null})
    );
}
