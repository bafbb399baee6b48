//! What stands between a worker and the API in a corporate network, for real
//! over TCP: a TLS front signed by a private CA, and an HTTP proxy.
//!
//! The proxy is written here because no well-kept Rust crate ships a plain
//! forward proxy (the crates found are MITM toolkits or whole servers); it is
//! the least of one: `CONNECT host:port` tunnels, and absolute-form plain
//! HTTP requests forwarded one per connection, every request head recorded.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

/// A TLS endpoint at `https://localhost:PORT` in front of `upstream` (a
/// devserver), its certificate signed by a fresh CA written to `ca_pem`.
pub struct TlsFront {
    pub url: String,
    pub ca_pem: PathBuf,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl TlsFront {
    pub async fn start(upstream: SocketAddr) -> TlsFront {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "envworker test CA");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf_params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .unwrap();
        let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();

        let dir = tempfile::tempdir().unwrap();
        let ca_pem = dir.path().join("ca.pem");
        std::fs::write(&ca_pem, ca_cert.pem()).unwrap();

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
            )
            .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "https://localhost:{}",
            listener.local_addr().unwrap().port()
        );
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A client that refuses the certificate ends here.
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    if let Ok(mut up) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                    }
                });
            }
        });
        TlsFront {
            url,
            ca_pem,
            _dir: dir,
            task,
        }
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One request head the proxy saw.
#[derive(Debug, Clone)]
pub struct ProxiedRequest {
    pub method: String,
    /// `host:port` for CONNECT, the absolute URL otherwise.
    pub target: String,
    /// Names lower-cased.
    pub headers: Vec<(String, String)>,
}

impl ProxiedRequest {
    pub fn header(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// An HTTP proxy at `http://127.0.0.1:PORT`.
pub struct HttpProxy {
    pub url: String,
    seen: Arc<Mutex<Vec<ProxiedRequest>>>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpProxy {
    pub async fn start() -> HttpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(proxy_one(client, log.clone()));
            }
        });
        HttpProxy { url, seen, task }
    }

    /// Every request head seen so far.
    pub fn seen(&self) -> Vec<ProxiedRequest> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for HttpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn proxy_one(mut client: TcpStream, log: Arc<Mutex<Vec<ProxiedRequest>>>) {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        match client.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 64 * 1024 {
            return;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let (method, target) = (
        first.next().unwrap_or_default().to_string(),
        first.next().unwrap_or_default().to_string(),
    );
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    log.lock().unwrap().push(ProxiedRequest {
        method: method.clone(),
        target: target.clone(),
        headers: headers.clone(),
    });
    if method == "CONNECT" {
        let Ok(mut up) = TcpStream::connect(&target).await else {
            let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
            return;
        };
        if client
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
        let _ = up.write_all(&buf[head_end..]).await;
        let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
        return;
    }
    // Absolute form: forward this one request, asking the server to close
    // after it, so the client opens a new connection (and a new head is
    // recorded) for the next.
    let Ok(url) = url::Url::parse(&target) else {
        return;
    };
    let addr = format!(
        "{}:{}",
        url.host_str().unwrap_or_default(),
        url.port_or_known_default().unwrap_or(80)
    );
    let Ok(mut up) = TcpStream::connect(&addr).await else {
        let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
        return;
    };
    let mut forwarded = format!("{method} {target} HTTP/1.1\r\n");
    for (name, value) in &headers {
        if !matches!(
            name.as_str(),
            "connection" | "proxy-connection" | "keep-alive"
        ) {
            forwarded.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    forwarded.push_str("connection: close\r\n\r\n");
    if up.write_all(forwarded.as_bytes()).await.is_err()
        || up.write_all(&buf[head_end..]).await.is_err()
    {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
}
