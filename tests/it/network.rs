//! The worker in a corporate network: whose TLS roots it trusts, which proxy
//! its API calls take, and the headers `ANTHROPIC_CUSTOM_HEADERS` adds.
//!
//! Each case runs the real binary — `envworker poll` with an `--on-work`
//! command that cannot run, so the poller claims the scenario's item, stops
//! it and exits: a poll, a claim and a stop, every one an API call — against
//! an in-process devserver reached over real TCP, directly, through a TLS
//! front signed by a private CA, or through an HTTP proxy
//! (`tests/common/network.rs`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::network::{HttpProxy, TlsFront};
use crate::common::{Started, TestServer};

/// The variables a developer's shell or CI may carry that would change
/// what these tests see.
const AMBIENT: &[&str] = &[
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "RUST_LOG",
    "ANTHROPIC_CUSTOM_HEADERS",
    "ANTHROPIC_LOG",
];

const CANNOT_RUN: &str = "the --on-work command \"/nonexistent/spawn.sh\" cannot be run";

/// How one poller run ended.
struct Run {
    /// `None`: still running at the deadline (killed).
    exited: Option<std::process::ExitStatus>,
    stderr: String,
}

/// Run `envworker poll` for `started`'s environment at `base_url`, with
/// `env` and `args`, until it exits or `until` appears on its stderr or
/// `within` passes.
async fn poll(
    base_url: &str,
    started: &Started,
    env: &[(&str, &str)],
    args: &[&str],
    until: &str,
    within: Duration,
) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr");
    let mut command = Command::new(env!("CARGO_BIN_EXE_envworker"));
    command
        .args(["poll", "--on-work", "/nonexistent/spawn.sh"])
        .args(args)
        .env("ANTHROPIC_BASE_URL", base_url)
        .env("ANTHROPIC_ENVIRONMENT_ID", &started.environment_id)
        .env("ANTHROPIC_ENVIRONMENT_KEY", &started.environment_key)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    for name in AMBIENT {
        command.env_remove(name);
    }
    command.envs(env.iter().copied());
    let mut child = command.spawn().unwrap();
    let start = Instant::now();
    let exited = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        let seen = std::fs::read_to_string(&log).unwrap_or_default();
        if (!until.is_empty() && seen.contains(until)) || start.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    Run {
        exited,
        stderr: std::fs::read_to_string(&log).unwrap_or_default(),
    }
}

/// Run the poller until it exits (at most 30 s), and check it served
/// (stopped) the item: its API calls all went through.
async fn serve_once(base_url: &str, started: &Started, env: &[(&str, &str)], args: &[&str]) -> Run {
    let run = poll(base_url, started, env, args, "", Duration::from_secs(30)).await;
    assert!(
        run.exited.is_some() && run.stderr.contains(CANNOT_RUN),
        "the poller did not claim and stop the item:\n{}",
        run.stderr
    );
    run
}

async fn state(server: &TestServer, item: &Started) -> String {
    server
        .work_state(&item.environment_id, &item.session_id)
        .await
}

async fn started(server: &TestServer) -> Started {
    server
        .start_scenario(&crate::common::scenario("notes-roundtrip"))
        .await
}

fn upstream(server: &TestServer) -> std::net::SocketAddr {
    server.url().trim_start_matches("http://").parse().unwrap()
}

/// The API behind a certificate from a private CA: trusted when
/// `SSL_CERT_FILE` names the CA (the system store as rustls-native-certs
/// reads it), refused with the machine's own store, and refused when the
/// store is unreadable (the bundled webpki roots, with a warning). A build
/// that trusted only the bundled roots fails the trusted case (checked:
/// "the poller did not claim and stop the item"). `ANTHROPIC_LOG=debug`
/// turns on the debug line naming the roots chosen.
#[tokio::test(flavor = "multi_thread")]
async fn the_worker_trusts_the_ca_that_ssl_cert_file_names_and_no_other() {
    let server = TestServer::start().await;
    let front = TlsFront::start(upstream(&server)).await;
    let item = started(&server).await;
    let ca = front.ca_pem.to_str().unwrap();

    let refused = poll(
        &front.url,
        &item,
        &[],
        &[],
        "UnknownIssuer",
        Duration::from_secs(20),
    )
    .await;
    assert!(
        refused.exited.is_none() && refused.stderr.contains("UnknownIssuer"),
        "the machine's store must not trust the test CA:\n{}",
        refused.stderr
    );

    let missing = [("SSL_CERT_FILE", "/nonexistent/ca.pem")];
    let fallback = poll(
        &front.url,
        &item,
        &missing,
        &[],
        "UnknownIssuer",
        Duration::from_secs(20),
    )
    .await;
    assert!(
        fallback.exited.is_none()
            && fallback
                .stderr
                .contains("trusting the bundled webpki roots")
            && fallback.stderr.contains("UnknownIssuer"),
        "an unreadable store falls back to the bundled roots, which do not trust the test CA:\n{}",
        fallback.stderr
    );
    assert_eq!(state(&server, &item).await, "queued");

    // ANTHROPIC_LOG=debug (RUST_LOG unset) shows the roots chosen: the one CA in the file.
    let env = [("SSL_CERT_FILE", ca), ("ANTHROPIC_LOG", "debug")];
    let trusted = serve_once(&front.url, &item, &env, &[]).await;
    assert!(
        !trusted.stderr.contains("UnknownIssuer")
            && trusted.stderr.contains("TLS roots: the system's store")
            && trusted.stderr.contains("tls.root_count=1"),
        "{}",
        trusted.stderr
    );
    assert!(
        !refused.stderr.contains("DEBUG"),
        "no debug lines without ANTHROPIC_LOG:\n{}",
        refused.stderr
    );
    assert_eq!(state(&server, &item).await, "stopped");
}

/// `HTTP_PROXY` carries every API call of a plain-HTTP base URL (the proxy
/// sees each request), with the headers of `ANTHROPIC_CUSTOM_HEADERS` and
/// `--header` on each, the flag winning for a name both give.
#[tokio::test(flavor = "multi_thread")]
async fn http_proxy_carries_the_api_calls_with_the_custom_headers() {
    let server = TestServer::start().await;
    let proxy = HttpProxy::start().await;
    let item = started(&server).await;
    let env = [
        ("HTTP_PROXY", proxy.url.as_str()),
        (
            "ANTHROPIC_CUSTOM_HEADERS",
            "X-Team: from-env\nX-Both: env\n",
        ),
    ];
    serve_once(&server.url(), &item, &env, &["--header", "X-Both=flag"]).await;
    let seen = proxy.seen();
    let api: Vec<_> = seen
        .iter()
        .filter(|r| r.target.starts_with(&format!("{}/v1/", server.url())))
        .collect();
    // At least the poll, the claim's ack and the stop.
    assert!(api.len() >= 3, "{seen:#?}");
    assert_eq!(api.len(), seen.len(), "{seen:#?}");
    for request in api {
        assert_eq!(request.header("x-team"), ["from-env"], "{request:#?}");
        assert_eq!(request.header("x-both"), ["flag"], "{request:#?}");
    }
}

/// `NO_PROXY` listing the loopback host: the same calls go straight to the
/// API and the proxy sees none — by IP (`127.0.0.1`) and by name
/// (`localhost`, over TLS, where the proxy would be `HTTPS_PROXY`'s).
#[tokio::test(flavor = "multi_thread")]
async fn no_proxy_hosts_bypass_the_proxy() {
    let server = TestServer::start().await;
    let proxy = HttpProxy::start().await;
    let front = TlsFront::start(upstream(&server)).await;
    let ca = front.ca_pem.to_str().unwrap();

    let item = started(&server).await;
    let env = [
        ("HTTP_PROXY", proxy.url.as_str()),
        ("NO_PROXY", "localhost,127.0.0.1"),
    ];
    serve_once(&server.url(), &item, &env, &[]).await;

    let item = started(&server).await;
    let env = [
        ("HTTPS_PROXY", proxy.url.as_str()),
        ("SSL_CERT_FILE", ca),
        ("no_proxy", "example.com, localhost"),
    ];
    serve_once(&front.url, &item, &env, &[]).await;
    assert!(proxy.seen().is_empty(), "{:#?}", proxy.seen());
}

/// `HTTPS_PROXY` (and `ALL_PROXY`) carry an HTTPS base URL through a
/// CONNECT tunnel: the proxy sees the tunnel to the API's host, the TLS
/// inside it ends at the API (verified against `SSL_CERT_FILE`'s CA).
#[tokio::test(flavor = "multi_thread")]
async fn https_proxy_tunnels_the_api_calls_with_connect() {
    let server = TestServer::start().await;
    let front = TlsFront::start(upstream(&server)).await;
    let ca = front.ca_pem.to_str().unwrap();
    let authority = front.url.trim_start_matches("https://").to_string();
    for variable in ["HTTPS_PROXY", "ALL_PROXY"] {
        let proxy = HttpProxy::start().await;
        let item = started(&server).await;
        let env = [(variable, proxy.url.as_str()), ("SSL_CERT_FILE", ca)];
        serve_once(&front.url, &item, &env, &[]).await;
        let seen = proxy.seen();
        assert!(!seen.is_empty(), "{variable}: the proxy saw nothing");
        for request in &seen {
            assert_eq!(request.method, "CONNECT", "{variable}: {request:#?}");
            assert_eq!(request.target, authority, "{variable}: {request:#?}");
        }
    }
}
