//! The devserver's environments and work queue over real HTTP: poll, ack,
//! heartbeat, stop, retrieve, update, list, stats, the lease, the work
//! secret and what each credential may touch.

use std::time::{Duration, Instant};

use crate::common::{TestServer, sha256};
use base64::Engine;
use envworker::devserver::DevserverConfig;
use reqwest::Method;
use serde_json::{Value, json};

/// An environment with its key, and a session in it with one read-write and
/// one read-only store.
struct Queue {
    s: TestServer,
    env: String,
    key: String,
    session: String,
    rw_store: String,
    ro_store: String,
}

async fn queue_with(config: DevserverConfig) -> Queue {
    let s = TestServer::start_with(config).await;
    let created = s
        .dev(
            Method::POST,
            "/dev/environments",
            Some(json!({"name": "queue"})),
        )
        .await
        .ok();
    let env = created["environment_id"].as_str().unwrap().to_string();
    let key = created["environment_key"].as_str().unwrap().to_string();
    let rw_store = s.create_store("Notes").await;
    let ro_store = s.create_store("Team KB").await;
    s.create_memory(&rw_store, "/a.md", "a").await;
    s.create_memory(&ro_store, "/kb.md", "kb").await;
    let session = s
        .agents(
            Method::POST,
            "/v1/sessions",
            Some(
                json!({"agent": "agent_1", "environment_id": env, "resources": [
                    {"type": "memory_store", "memory_store_id": rw_store},
                    {"type": "memory_store", "memory_store_id": ro_store, "access": "read_only"}
                ]}),
            ),
        )
        .await
        .ok();
    Queue {
        session: session["id"].as_str().unwrap().to_string(),
        s,
        env,
        key,
        rw_store,
        ro_store,
    }
}

async fn queue() -> Queue {
    queue_with(DevserverConfig::new(crate::common::ADMIN_KEY)).await
}

impl Queue {
    fn path(&self, rest: &str) -> String {
        format!("/v1/environments/{}/work{rest}", self.env)
    }

    async fn poll(&self, query: &str) -> Value {
        self.s
            .worker(
                &self.key,
                Method::GET,
                &self.path(&format!("/poll?{query}")),
                None,
            )
            .await
            .ok()
    }

    async fn claim_and_ack(&self) -> (String, String) {
        let work = self.poll("").await;
        let id = work["id"].as_str().unwrap().to_string();
        let token = sessions_token(work["secret"].as_str().unwrap());
        self.s
            .worker(
                &self.key,
                Method::POST,
                &self.path(&format!("/{id}/ack")),
                None,
            )
            .await
            .ok();
        (id, token)
    }

    async fn beat(&self, credential: &str, id: &str, expected: &str) -> crate::common::Answer {
        self.s
            .worker(
                credential,
                Method::POST,
                &self.path(&format!(
                    "/{id}/heartbeat?expected_last_heartbeat={}",
                    urlencode(expected)
                )),
                None,
            )
            .await
    }
}

fn urlencode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// The sessions token inside a work secret (URL-safe base64 JSON).
fn sessions_token(secret: &str) -> String {
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(secret.trim_end_matches('='))
        .expect("the secret is URL-safe base64");
    let payload: Value = serde_json::from_slice(&json).expect("the secret is JSON");
    payload["sessions_token"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn environments_crud_and_dev_keys() {
    let s = TestServer::start().await;
    let env = s
        .agents(
            Method::POST,
            "/v1/environments",
            Some(json!({"name": "prod", "config": {"type": "self_hosted"}, "metadata": {"team": "infra"}})),
        )
        .await
        .ok();
    let id = env["id"].as_str().unwrap();
    assert!(id.starts_with("env_"));
    assert_eq!(env["type"], "environment");
    assert_eq!(env["config"]["type"], "self_hosted");
    let got = s
        .agents(Method::GET, &format!("/v1/environments/{id}"), None)
        .await
        .ok();
    assert_eq!(got, env);
    let updated = s
        .agents(
            Method::POST,
            &format!("/v1/environments/{id}"),
            Some(json!({"name": "prod-2", "metadata": {"team": null}})),
        )
        .await
        .ok();
    assert_eq!(
        (updated["name"].as_str(), updated["metadata"].clone()),
        (Some("prod-2"), json!({}))
    );
    let (listed, _) = {
        let body = s
            .agents(Method::GET, "/v1/environments?limit=10", None)
            .await
            .ok();
        (body["data"].as_array().unwrap().clone(), ())
    };
    assert!(listed.iter().any(|e| e["id"] == id));
    let archived = s
        .agents(
            Method::POST,
            &format!("/v1/environments/{id}/archive"),
            None,
        )
        .await
        .ok();
    assert!(archived["archived_at"].is_string());
    // An archived environment takes no new session.
    s.agents(
        Method::POST,
        "/v1/sessions",
        Some(json!({"agent": "a", "environment_id": id})),
    )
    .await
    .expect_error(400, "invalid_request_error");
    let deleted = s
        .agents(Method::DELETE, &format!("/v1/environments/{id}"), None)
        .await
        .ok();
    assert_eq!(deleted, json!({"id": id, "type": "environment_deleted"}));
    s.agents(Method::GET, &format!("/v1/environments/{id}"), None)
        .await
        .expect_error(404, "not_found_error");

    for bad in [
        json!({"name": "", "config": {"type": "self_hosted"}}),
        json!({"name": "x", "config": {"type": "moon"}}),
        json!({"name": "x"}),
    ] {
        s.agents(Method::POST, "/v1/environments", Some(bad))
            .await
            .expect_error(400, "invalid_request_error");
    }

    // /dev/environments needs the admin key and answers an id and a key.
    let dev = s.dev(Method::POST, "/dev/environments", None).await.ok();
    let key = dev["environment_key"].as_str().unwrap();
    assert!(dev["environment_id"].as_str().unwrap().starts_with("env_"));
    s.send(Method::POST, "/dev/environments", None, &[])
        .await
        .expect_error(401, "authentication_error");
    s.send(
        Method::POST,
        "/dev/environments",
        None,
        &[("authorization", &format!("Bearer {key}"))],
    )
    .await
    .expect_error(403, "permission_error");
    // The key reads its own environment, and nothing else of the organisation.
    s.worker(
        key,
        Method::GET,
        &format!(
            "/v1/environments/{}",
            dev["environment_id"].as_str().unwrap()
        ),
        None,
    )
    .await
    .ok();
    s.worker(key, Method::GET, "/v1/environments", None)
        .await
        .expect_error(403, "permission_error");
}

#[tokio::test]
async fn a_session_queues_work_and_poll_claims_it_with_a_secret() {
    let q = queue().await;
    let stats =
        q.s.worker(&q.key, Method::GET, &q.path("/stats"), None)
            .await
            .ok();
    assert_eq!(
        (
            stats["type"].as_str(),
            stats["depth"].as_u64(),
            stats["pending"].as_u64()
        ),
        (Some("work_queue_stats"), Some(1), Some(0))
    );
    assert!(stats["oldest_queued_at"].is_string());

    let work = q.poll("block_ms=500").await;
    assert_eq!(work["type"], "work");
    assert_eq!(
        work["state"], "queued",
        "a poll claims but does not acknowledge"
    );
    assert_eq!(work["data"], json!({"type": "session", "id": q.session}));
    assert_eq!(work["environment_id"], q.env);
    let token = sessions_token(work["secret"].as_str().unwrap());
    assert!(!token.is_empty());

    let stats =
        q.s.worker(&q.key, Method::GET, &q.path("/stats"), None)
            .await
            .ok();
    assert_eq!(
        (stats["depth"].as_u64(), stats["pending"].as_u64()),
        (Some(0), Some(1))
    );

    // Claimed within the reclaim window: nobody else gets it; the empty answer is `200 null`.
    let empty =
        q.s.worker(&q.key, Method::GET, &q.path("/poll"), None)
            .await;
    assert_eq!(empty.status, 200);
    assert_eq!(empty.body, Value::Null);
    assert!(
        empty.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );

    // The secret shows only on the poll answer.
    let id = work["id"].as_str().unwrap();
    let got =
        q.s.worker(&q.key, Method::GET, &q.path(&format!("/{id}")), None)
            .await
            .ok();
    assert_eq!(got["secret"], Value::Null);
    let listed =
        q.s.worker(&q.key, Method::GET, &q.path(""), None)
            .await
            .ok();
    assert_eq!(listed["data"][0]["id"], id);
    assert_eq!(listed["data"][0]["secret"], Value::Null);

    // Unacknowledged claims are reclaimed after reclaim_older_than_ms, with a fresh secret.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let again = q.poll("reclaim_older_than_ms=10").await;
    assert_eq!(again["id"], id);
    assert_ne!(sessions_token(again["secret"].as_str().unwrap()), token);
}

#[tokio::test]
async fn poll_parameters_blocking_and_worker_counts() {
    let q = queue().await;
    for bad in [
        "block_ms=0",
        "block_ms=1000",
        "block_ms=x",
        "reclaim_older_than_ms=0",
    ] {
        q.s.worker(&q.key, Method::GET, &q.path(&format!("/poll?{bad}")), None)
            .await
            .expect_error(400, "invalid_request_error");
    }
    q.poll("").await; // take the one item

    // An empty blocking poll waits about block_ms; a non-blocking one does not.
    let t = Instant::now();
    assert_eq!(q.poll("block_ms=300").await, Value::Null);
    assert!(
        t.elapsed() >= Duration::from_millis(280),
        "{:?}",
        t.elapsed()
    );

    // A blocking poll wakes up for an item queued while it waits.
    let waiting = {
        let url = format!("{}{}", q.s.url(), q.path("/poll?block_ms=999"));
        let key = q.key.clone();
        tokio::spawn(async move {
            reqwest::Client::new()
                .get(url)
                .bearer_auth(key)
                .header("anthropic-version", "2023-06-01")
                .header("anthropic-beta", "managed-agents-2026-04-01")
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second =
        q.s.agents(
            Method::POST,
            "/v1/sessions",
            Some(json!({"agent": "a", "environment_id": q.env})),
        )
        .await
        .ok();
    let woke = waiting.await.unwrap();
    assert_eq!(woke["data"]["id"], second["id"]);

    // Distinct Anthropic-Worker-IDs count as workers polling.
    for worker in ["w-1", "w-2", "w-2"] {
        q.s.send(
            Method::GET,
            &q.path("/poll"),
            None,
            &[
                ("authorization", &format!("Bearer {}", q.key)),
                ("anthropic-version", "2023-06-01"),
                ("anthropic-beta", "managed-agents-2026-04-01"),
                ("anthropic-worker-id", worker),
            ],
        )
        .await;
    }
    let stats =
        q.s.worker(&q.key, Method::GET, &q.path("/stats"), None)
            .await
            .ok();
    assert_eq!(stats["workers_polling"], 2);
}

#[tokio::test]
async fn ack_heartbeat_and_the_stale_heartbeat_412() {
    let q = queue().await;
    let work = q.poll("").await;
    let id = work["id"].as_str().unwrap().to_string();
    // A heartbeat before the ack holds no lease.
    let early = q.beat(&q.key, &id, "NO_HEARTBEAT").await;
    early.expect_error(412, "precondition_failed_error");
    assert_eq!(
        early.body["error"]["details"]["current_state"]["state"],
        "queued"
    );

    let acked =
        q.s.worker(&q.key, Method::POST, &q.path(&format!("/{id}/ack")), None)
            .await
            .ok();
    assert_eq!(acked["state"], "starting");
    assert!(acked["acknowledged_at"].is_string());
    q.s.worker(&q.key, Method::POST, &q.path(&format!("/{id}/ack")), None)
        .await
        .expect_error(409, "conflict_error");

    let first = q.beat(&q.key, &id, "NO_HEARTBEAT").await.ok();
    assert_eq!(first["type"], "work_heartbeat");
    assert_eq!(first["state"], "active");
    assert_eq!(first["lease_extended"], true);
    assert_eq!(first["ttl_seconds"], 30);
    let last = first["last_heartbeat"].as_str().unwrap().to_string();
    let second = q.beat(&q.key, &id, &last).await.ok();
    assert_ne!(second["last_heartbeat"], first["last_heartbeat"]);

    // Echoing an old value, or claiming again with NO_HEARTBEAT: 412 with the server's lease.
    for stale in [last.as_str(), "NO_HEARTBEAT"] {
        let refused = q.beat(&q.key, &id, stale).await;
        refused.expect_error(412, "precondition_failed_error");
        let details = &refused.body["error"]["details"];
        assert_eq!(details["error_code"], "heartbeat_precondition_failed");
        assert_eq!(
            details["current_state"]["last_heartbeat"],
            second["last_heartbeat"]
        );
        assert_eq!(details["current_state"]["state"], "active");
        assert_eq!(details["current_state"]["lease_extended"], false);
    }

    // desired_ttl_seconds sets the lease.
    let longer =
        q.s.worker(
            &q.key,
            Method::POST,
            &q.path(&format!(
                "/{id}/heartbeat?expected_last_heartbeat={}&desired_ttl_seconds=90",
                urlencode(second["last_heartbeat"].as_str().unwrap())
            )),
            None,
        )
        .await
        .ok();
    assert_eq!(longer["ttl_seconds"], 90);
    q.s.worker(
        &q.key,
        Method::POST,
        &q.path(&format!("/{id}/heartbeat")),
        None,
    )
    .await
    .expect_error(400, "invalid_request_error");
    let w =
        q.s.worker(&q.key, Method::GET, &q.path(&format!("/{id}")), None)
            .await
            .ok();
    assert!(w["latest_heartbeat_at"].is_string() && w["started_at"].is_string());
}

#[tokio::test]
async fn stop_graceful_then_forced_and_twice_is_409() {
    let q = queue().await;
    let (id, token) = q.claim_and_ack().await;
    let beat = q.beat(&token, &id, "NO_HEARTBEAT").await.ok();

    let stop =
        q.s.worker(
            &q.key,
            Method::POST,
            &q.path(&format!("/{id}/stop")),
            Some(json!({})),
        )
        .await;
    assert_eq!(stop.status, 204);
    let w =
        q.s.worker(&q.key, Method::GET, &q.path(&format!("/{id}")), None)
            .await
            .ok();
    assert_eq!(w["state"], "stopping");
    assert!(w["stop_requested_at"].is_string());
    // The worker hears it on its next heartbeat (expectations are not compared any more).
    let told = q.beat(&token, &id, "whatever").await.ok();
    assert_eq!(told["state"], "stopping");
    assert_ne!(told["last_heartbeat"], beat["last_heartbeat"]);

    // The worker confirms with force (its sessions token may stop its own item).
    let forced =
        q.s.worker(
            &token,
            Method::POST,
            &q.path(&format!("/{id}/stop")),
            Some(json!({"force": true})),
        )
        .await;
    assert_eq!(forced.status, 204);
    let w =
        q.s.worker(&q.key, Method::GET, &q.path(&format!("/{id}")), None)
            .await
            .ok();
    assert_eq!(w["state"], "stopped");
    assert!(w["stopped_at"].is_string());

    q.s.worker(
        &q.key,
        Method::POST,
        &q.path(&format!("/{id}/stop")),
        Some(json!({"force": true})),
    )
    .await
    .expect_error(409, "conflict_error");
    // A heartbeat on a stopped item is told so, without a lease.
    let after = q.beat(&q.key, &id, "x").await.ok();
    assert_eq!(
        (after["state"].as_str(), after["lease_extended"].as_bool()),
        (Some("stopped"), Some(false))
    );
    // The sessions token died with the item.
    q.s.worker(
        &token,
        Method::GET,
        &format!("/v1/sessions/{}", q.session),
        None,
    )
    .await
    .expect_error(401, "authentication_error");
}

#[tokio::test]
async fn a_lease_not_renewed_in_its_ttl_returns_the_item_to_the_queue() {
    let q = queue_with(DevserverConfig::new(crate::common::ADMIN_KEY).lease_ttl_seconds(1)).await;
    let (id, token) = q.claim_and_ack().await;
    let beat = q.beat(&token, &id, "NO_HEARTBEAT").await.ok();
    assert_eq!(beat["ttl_seconds"], 1);
    tokio::time::sleep(Duration::from_millis(1600)).await;

    let w =
        q.s.worker(&q.key, Method::GET, &q.path(&format!("/{id}")), None)
            .await
            .ok();
    assert_eq!(w["state"], "queued", "{w:#}");
    // The old holder's next beat finds the lease gone.
    let lost = q
        .beat(&token, &id, beat["last_heartbeat"].as_str().unwrap())
        .await;
    lost.expect_error(412, "precondition_failed_error");
    assert_eq!(
        lost.body["error"]["details"]["current_state"]["state"],
        "queued"
    );
    // Another worker claims it and starts a fresh lease.
    let again = q.poll("").await;
    assert_eq!(again["id"], id);
    q.s.worker(&q.key, Method::POST, &q.path(&format!("/{id}/ack")), None)
        .await
        .ok();
    let fresh = q.beat(&q.key, &id, "NO_HEARTBEAT").await.ok();
    assert_eq!(fresh["state"], "active");
}

#[tokio::test]
async fn work_metadata_patch() {
    let q = queue().await;
    let work = q.poll("").await;
    let id = work["id"].as_str().unwrap();
    let patched =
        q.s.worker(
            &q.key,
            Method::POST,
            &q.path(&format!("/{id}")),
            Some(json!({"metadata": {"host": "h1", "gone": null}})),
        )
        .await
        .ok();
    assert_eq!(patched["metadata"], json!({"host": "h1"}));
    let cleared =
        q.s.worker(
            &q.key,
            Method::POST,
            &q.path(&format!("/{id}")),
            Some(json!({"metadata": {"host": null}})),
        )
        .await
        .ok();
    assert_eq!(cleared["metadata"], json!({}));
    q.s.worker(&q.key, Method::GET, &q.path("/work_nope"), None)
        .await
        .expect_error(404, "not_found_error");
}

#[tokio::test]
async fn what_each_credential_may_touch() {
    let q = queue().await;
    let (id, token) = q.claim_and_ack().await;
    let other = q.s.dev(Method::POST, "/dev/environments", None).await.ok();
    let other_key = other["environment_key"].as_str().unwrap();

    // Another environment's key cannot see this queue or this session.
    q.s.worker(other_key, Method::GET, &q.path("/poll"), None)
        .await
        .expect_error(403, "permission_error");
    q.s.worker(
        other_key,
        Method::GET,
        &format!("/v1/sessions/{}", q.session),
        None,
    )
    .await
    .expect_error(403, "permission_error");
    // The sessions token: its session and its work item, nothing else of the queue.
    q.s.worker(
        &token,
        Method::GET,
        &format!("/v1/sessions/{}", q.session),
        None,
    )
    .await
    .ok();
    q.s.worker(&token, Method::GET, &q.path(&format!("/{id}")), None)
        .await
        .ok();
    q.s.worker(&token, Method::GET, &q.path("/poll"), None)
        .await
        .expect_error(403, "permission_error");
    q.s.worker(&token, Method::GET, &q.path("/stats"), None)
        .await
        .expect_error(403, "permission_error");
    q.s.worker(
        &token,
        Method::POST,
        "/v1/sessions",
        Some(json!({"agent": "a", "environment_id": q.env})),
    )
    .await
    .expect_error(403, "permission_error");
    // The environment key is refused by the memory endpoints.
    let mem = |key: &str, method: Method, path: String, body: Option<Value>| {
        let auth = format!("Bearer {key}");
        let s = &q.s;
        async move {
            s.send(
                method,
                &path,
                body,
                &[
                    ("authorization", &auth),
                    ("anthropic-version", "2023-06-01"),
                    ("anthropic-beta", crate::common::MEMORY_BETA),
                ],
            )
            .await
        }
    };
    let m = mem(
        &q.key,
        Method::GET,
        format!("/v1/memory_stores/{}/memories", q.rw_store),
        None,
    )
    .await;
    let msg = m.expect_error(403, "permission_error");
    assert!(msg.contains("environment key"), "{msg}");
    // The sessions token reads and writes its read-write store, as the session.
    mem(
        &token,
        Method::GET,
        format!("/v1/memory_stores/{}/memories?view=full", q.rw_store),
        None,
    )
    .await
    .ok();
    let written = mem(
        &token,
        Method::POST,
        format!("/v1/memory_stores/{}/memories", q.rw_store),
        Some(json!({"path": "/from-session.md", "content": "s"})),
    )
    .await
    .ok();
    let versions =
        q.s.memory(
            Method::GET,
            &format!(
                "/v1/memory_stores/{}/memory_versions?memory_id={}",
                q.rw_store,
                written["id"].as_str().unwrap()
            ),
            None,
        )
        .await
        .ok();
    assert_eq!(
        versions["data"][0]["created_by"],
        json!({"type": "session_actor", "session_id": q.session})
    );
    let by_session =
        q.s.memory(
            Method::GET,
            &format!(
                "/v1/memory_stores/{}/memory_versions?session_id={}",
                q.rw_store, q.session
            ),
            None,
        )
        .await
        .ok();
    assert_eq!(by_session["data"].as_array().unwrap().len(), 1);

    // It reads the read-only store, and every write there is refused, changing nothing.
    mem(
        &token,
        Method::GET,
        format!("/v1/memory_stores/{}/memories", q.ro_store),
        None,
    )
    .await
    .ok();
    let kb =
        q.s.list_all(&format!("/v1/memory_stores/{}/memories", q.ro_store))
            .await
            .0;
    let kb_id = kb[0]["id"].as_str().unwrap().to_string();
    let before = q.s.snapshot().await;
    for (method, path, body) in [
        (
            Method::POST,
            format!("/v1/memory_stores/{}/memories", q.ro_store),
            Some(json!({"path": "/x.md", "content": "x"})),
        ),
        (
            Method::POST,
            format!("/v1/memory_stores/{}/memories/{kb_id}", q.ro_store),
            Some(json!({"content": "changed"})),
        ),
        (
            Method::DELETE,
            format!(
                "/v1/memory_stores/{}/memories/{kb_id}?expected_content_sha256={}",
                q.ro_store,
                sha256("kb")
            ),
            None,
        ),
    ] {
        let msg = mem(&token, method, path, body)
            .await
            .expect_error(403, "permission_error");
        assert!(msg.contains("read-only"), "{msg}");
    }
    assert_eq!(q.s.snapshot().await, before);

    // A store not attached to the session is out of reach; store-level endpoints are the organisation's.
    let stranger = q.s.create_store("Elsewhere").await;
    mem(
        &token,
        Method::GET,
        format!("/v1/memory_stores/{stranger}/memories"),
        None,
    )
    .await
    .expect_error(403, "permission_error");
    mem(&token, Method::GET, "/v1/memory_stores".into(), None)
        .await
        .expect_error(403, "permission_error");
    mem(
        &token,
        Method::POST,
        "/v1/memory_stores".into(),
        Some(json!({"name": "n"})),
    )
    .await
    .expect_error(403, "permission_error");
}
