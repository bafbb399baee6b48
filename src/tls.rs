//! The one place HTTP clients are built, so every request the binary makes
//! (the API, the devserver's webhooks, `dev`) trusts the same roots and
//! honours the same proxy variables.
//!
//! **Roots.** A corporate deployment trusts what its operating system
//! trusts: an internal CA, a TLS-inspecting proxy's CA. So the roots are the
//! system's, read once per process by `rustls-native-certs` — which honours
//! `SSL_CERT_FILE` and `SSL_CERT_DIR` the way OpenSSL does (when either is
//! set, only those are read). The bundled webpki (Mozilla) roots are the
//! fallback, used only when the system store is unreadable or holds no
//! usable certificate (a `FROM scratch` image): never both, so a pruned
//! system store stays pruned. One TLS stack, rustls; no OpenSSL.
//!
//! **Read when first needed.** Reading the system store is a file per
//! certificate (about 150 opens and 300 `stat`s, some 6 ms — the largest
//! part of a cold start). A worker whose API is plain HTTP (a sidecar, the
//! devserver) never needs it, and one on HTTPS needs it only at its first
//! handshake. So clients verify through [`LazyRoots`]: rustls's own WebPKI
//! verifier over these roots, built at the first certificate it is asked to
//! verify. Every certificate is still verified, against the same roots.
//!
//! Why not `rustls-platform-verifier`: reqwest 0.12 has no feature for it,
//! and on Linux, where the worker runs, it reads the same files through the
//! same crate. The client's rustls config is therefore ours (reqwest's
//! preconfigured-TLS path), with what reqwest's own would hold: the ring
//! provider, TLS 1.2 and 1.3, SNI, and ALPN offering HTTP/2 and HTTP/1.1.
//!
//! **Proxies.** reqwest's system proxy is left on (nothing here calls
//! `no_proxy()`): `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY`
//! (and their lower-case forms) apply, `NO_PROXY` matching exact IPs, CIDR
//! ranges, and domains with their subdomains. A loopback address is proxied
//! like any other unless `NO_PROXY` lists it, as curl does.

use std::sync::{Arc, OnceLock};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

/// Where the roots came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootSource {
    /// The operating system's store (or `SSL_CERT_FILE`/`SSL_CERT_DIR`).
    System,
    /// webpki-roots, bundled in the binary: the system store was empty or unreadable.
    Bundled,
}

/// The roots every client trusts, chosen once per process.
#[derive(Debug)]
pub struct Roots {
    pub source: RootSource,
    /// The trust anchors: the system's that rustls accepts, or the bundled ones.
    anchors: Arc<RootCertStore>,
    /// Why the system store was not used (bundled only).
    pub reason: Option<String>,
}

impl Roots {
    /// How many of the system's roots are trusted (0 when bundled).
    pub fn system_count(&self) -> usize {
        match self.source {
            RootSource::System => self.anchors.len(),
            RootSource::Bundled => 0,
        }
    }
}

/// Choose from the system store as `rustls-native-certs` read it (`certs`,
/// and the `errors` it met), keeping the certificates rustls accepts as
/// trust anchors (system stores often hold a few it does not). Pure: tests
/// feed it any load result.
pub fn choose(certs: Vec<CertificateDer<'static>>, errors: &[String]) -> Roots {
    let mut system = RootCertStore::empty();
    let (_added, _skipped) = system.add_parsable_certificates(certs);
    if !system.is_empty() {
        return Roots {
            source: RootSource::System,
            anchors: Arc::new(system),
            reason: None,
        };
    }
    let reason = if errors.is_empty() {
        "the system store holds no usable certificate".to_string()
    } else {
        errors.join("; ")
    };
    Roots {
        source: RootSource::Bundled,
        anchors: Arc::new(RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        }),
        reason: Some(reason),
    }
}

/// The process's roots: read and logged on first use.
pub fn roots() -> &'static Roots {
    static ROOTS: OnceLock<Roots> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let started = std::time::Instant::now();
        let loaded = rustls_native_certs::load_native_certs();
        let errors: Vec<String> = loaded.errors.iter().map(|e| e.to_string()).collect();
        let roots = choose(loaded.certs, &errors);
        let duration_ms = started.elapsed().as_millis() as u64;
        match roots.source {
            RootSource::System => tracing::debug!(
                tls.roots = "system",
                tls.root_count = roots.system_count(),
                duration_ms,
                "TLS roots: the system's store"
            ),
            RootSource::Bundled => tracing::warn!(
                tls.roots = "bundled",
                reason = roots.reason.as_deref().unwrap_or_default(),
                duration_ms,
                "TLS roots: the system store is empty or unreadable; trusting the bundled webpki roots"
            ),
        }
        roots
    })
}

/// A server certificate verifier that reads its roots at the first
/// certificate it verifies (see the module doc), then verifies as rustls's
/// WebPKI verifier does: chain to a root, validity, name. Signatures need
/// no roots and are checked with the provider's algorithms from the start.
#[derive(Debug)]
pub struct LazyRoots {
    provider: Arc<CryptoProvider>,
    /// Where the roots come from: [`roots`], or a test's stand-in.
    load: fn() -> &'static Roots,
    verifier: OnceLock<Result<Arc<WebPkiServerVerifier>, String>>,
}

impl LazyRoots {
    pub fn new(provider: Arc<CryptoProvider>, load: fn() -> &'static Roots) -> LazyRoots {
        LazyRoots {
            provider,
            load,
            verifier: OnceLock::new(),
        }
    }

    fn verifier(&self) -> Result<&Arc<WebPkiServerVerifier>, rustls::Error> {
        self.verifier
            .get_or_init(|| {
                let roots = (self.load)();
                WebPkiServerVerifier::builder_with_provider(
                    roots.anchors.clone(),
                    self.provider.clone(),
                )
                .build()
                .map_err(|e| format!("cannot verify with the TLS roots: {e}"))
            })
            .as_ref()
            .map_err(|e| rustls::Error::General(e.clone()))
    }
}

impl ServerCertVerifier for LazyRoots {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.verifier()?.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The rustls config of every client: reqwest's defaults (ring, TLS 1.2
/// and 1.3, SNI, ALPN h2 then http/1.1), verifying through [`LazyRoots`]
/// over `load`'s roots.
pub fn client_config(load: fn() -> &'static Roots) -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring offers TLS 1.2 and 1.3")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(LazyRoots::new(provider, load)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config
}

/// A reqwest client builder trusting [`roots`] (read at the first
/// handshake), with the system proxy on. Every client in this crate starts
/// here.
pub fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().use_preconfigured_tls(client_config(roots))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca_der() -> CertificateDer<'static> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn the_system_store_wins_when_it_has_a_usable_root() {
        let roots = choose(vec![ca_der()], &[]);
        assert_eq!(roots.source, RootSource::System);
        assert_eq!(roots.system_count(), 1);
    }

    #[test]
    fn an_unparsable_certificate_is_skipped_not_fatal() {
        let garbage = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x00]);
        let roots = choose(vec![garbage, ca_der()], &[]);
        assert_eq!(roots.source, RootSource::System);
        assert_eq!(roots.system_count(), 1);
    }

    #[test]
    fn an_empty_or_unreadable_store_falls_back_to_the_bundled_roots() {
        let empty = choose(vec![], &[]);
        assert_eq!(empty.source, RootSource::Bundled);
        assert_eq!(
            empty.reason.as_deref(),
            Some("the system store holds no usable certificate")
        );
        let garbage = CertificateDer::from(vec![0x01]);
        assert_eq!(choose(vec![garbage], &[]).source, RootSource::Bundled);
        let unreadable = choose(vec![], &["open /etc/ca.pem: not found".into()]);
        assert_eq!(unreadable.source, RootSource::Bundled);
        assert_eq!(
            unreadable.reason.as_deref(),
            Some("open /etc/ca.pem: not found")
        );
    }

    #[test]
    fn a_client_builds_with_either_source() {
        fn system() -> &'static Roots {
            static R: OnceLock<Roots> = OnceLock::new();
            R.get_or_init(|| choose(vec![ca_der()], &[]))
        }
        fn bundled() -> &'static Roots {
            static R: OnceLock<Roots> = OnceLock::new();
            R.get_or_init(|| choose(vec![], &[]))
        }
        for load in [system as fn() -> &'static Roots, bundled] {
            reqwest::Client::builder()
                .use_preconfigured_tls(client_config(load))
                .build()
                .expect("the client builds");
        }
        assert!(bundled().anchors.len() > 100, "webpki's roots");
    }

    /// A CA (its DER) and a TLS server on loopback whose certificate for
    /// `tls.test` it signed; each connection is answered `200 ok`.
    async fn tls_server() -> (CertificateDer<'static>, std::net::SocketAddr) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap().der().clone();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["tls.test".to_string()])
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut buf = [0u8; 1024];
                    let _ = tls.read(&mut buf).await;
                    let _ = tls
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                        )
                        .await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        (ca, addr)
    }

    /// A plain-HTTP server on loopback answering each connection `200 ok`.
    async fn http_server() -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = tcp.read(&mut buf).await;
                let _ = tcp
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    )
                    .await;
            }
        });
        addr
    }

    /// The cold-start rule: a plain-HTTP API never reads the trust store;
    /// an HTTPS one reads it at its first handshake, once, and still
    /// verifies every certificate against it (an unknown CA is refused).
    #[tokio::test]
    async fn the_roots_are_read_at_the_first_handshake_and_never_for_plain_http() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static LOADS: AtomicUsize = AtomicUsize::new(0);
        static TRUSTED: OnceLock<CertificateDer<'static>> = OnceLock::new();
        fn counting() -> &'static Roots {
            LOADS.fetch_add(1, Ordering::SeqCst);
            static R: OnceLock<Roots> = OnceLock::new();
            R.get_or_init(|| choose(vec![TRUSTED.get().unwrap().clone()], &[]))
        }
        let (trusted_ca, trusted) = tls_server().await;
        let (_other_ca, untrusted) = tls_server().await;
        TRUSTED.set(trusted_ca).unwrap();
        let plain = http_server().await;
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(client_config(counting))
            .no_proxy()
            .resolve("tls.test", trusted)
            .build()
            .unwrap();

        let answer = client.get(format!("http://{plain}/")).send().await.unwrap();
        assert_eq!(answer.text().await.unwrap(), "ok");
        assert_eq!(LOADS.load(Ordering::SeqCst), 0, "plain HTTP read no roots");

        let url = format!("https://tls.test:{}/", trusted.port());
        let answer = client
            .get(&url)
            .send()
            .await
            .expect("the CA's server is trusted");
        assert_eq!(answer.text().await.unwrap(), "ok");
        assert_eq!(
            LOADS.load(Ordering::SeqCst),
            1,
            "read at the first handshake"
        );

        // The other server's certificate names tls.test too, but its CA is
        // not a root: refused.
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(client_config(counting))
            .no_proxy()
            .resolve("tls.test", untrusted)
            .build()
            .unwrap();
        let refused = client
            .get(format!("https://tls.test:{}/", untrusted.port()))
            .send()
            .await;
        assert!(refused.is_err(), "an unknown CA's certificate is refused");
    }
}
