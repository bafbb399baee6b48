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
//! Why not `rustls-platform-verifier`: reqwest 0.12 has no feature for it
//! (only a preconfigured rustls config, which would drop reqwest's own
//! ALPN/HTTP/2 set-up), and on Linux, where the worker runs, it reads the
//! same files through the same crate.
//!
//! **Proxies.** reqwest's system proxy is left on (nothing here calls
//! `no_proxy()`): `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY`
//! (and their lower-case forms) apply, `NO_PROXY` matching exact IPs, CIDR
//! ranges, and domains with their subdomains. A loopback address is proxied
//! like any other unless `NO_PROXY` lists it, as curl does.

use std::sync::OnceLock;

use rustls::pki_types::CertificateDer;

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
    /// The system's certificates that parse as trust anchors (empty when bundled).
    certificates: Vec<reqwest::Certificate>,
    /// Why the system store was not used (bundled only).
    pub reason: Option<String>,
}

impl Roots {
    /// How many of the system's roots are trusted (0 when bundled).
    pub fn system_count(&self) -> usize {
        self.certificates.len()
    }

    /// A reqwest client builder trusting these roots and nothing else.
    pub fn builder(&self) -> reqwest::ClientBuilder {
        let builder = reqwest::Client::builder();
        match self.source {
            RootSource::System => self
                .certificates
                .iter()
                .fold(builder.tls_built_in_root_certs(false), |b, cert| {
                    b.add_root_certificate(cert.clone())
                }),
            RootSource::Bundled => builder.tls_built_in_root_certs(true),
        }
    }
}

/// Choose from the system store as `rustls-native-certs` read it (`certs`,
/// and the `errors` it met), keeping the certificates rustls accepts as
/// trust anchors (system stores often hold a few it does not). Pure: tests
/// feed it any load result.
pub fn choose(certs: Vec<CertificateDer<'static>>, errors: &[String]) -> Roots {
    let mut store = rustls::RootCertStore::empty();
    let mut usable: Vec<CertificateDer<'static>> = Vec::new();
    for der in certs {
        if store.add(der.clone()).is_ok() {
            usable.push(der);
        }
    }
    let certificates: Vec<reqwest::Certificate> = usable
        .iter()
        .filter_map(|der| reqwest::Certificate::from_der(der).ok())
        .collect();
    if !certificates.is_empty() {
        return Roots {
            source: RootSource::System,
            certificates,
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
        certificates: Vec::new(),
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

/// A reqwest client builder trusting [`roots`], with the system proxy on.
/// Every client in this crate starts here.
pub fn client_builder() -> reqwest::ClientBuilder {
    roots().builder()
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
        for roots in [choose(vec![ca_der()], &[]), choose(vec![], &[])] {
            roots.builder().build().expect("the client builds");
        }
    }
}
