//! TLS to Redis: the `tls` config object (on a shard, on `cluster`, at the top level, and
//! `sentinel_tls` for the Sentinels), and the crypto provider rustls uses.
//!
//! Verification is on by default: the server's certificate must chain to webpki-roots
//! (Mozilla's root program, compiled in: the same trust in a wheel, a container without
//! `/etc/ssl` and a static Go binary, and no file I/O at connect time), or, when `ca_file`
//! is set, to the certificates in that file only (private CAs: Redis Cloud, self-managed
//! servers). Its name must match the host in the URL. `cert_file` + `key_file` present a
//! client certificate (mTLS). `insecure_skip_verify: true` is the only way to turn
//! verification off, and `config validate` calls it INSECURE.

use crate::error::{Error, Result};
use serde_json::Value;

/// One `tls` object, with its files read and checked when the config was validated (so a
/// bad path or PEM is a config error naming the field, never a failure at connect time).
#[derive(Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct TlsConfig {
    /// PEM file of the CAs that are trusted instead of the built-in roots.
    pub ca_file: Option<String>,
    /// PEM file of the client certificate chain (mTLS); needs `key_file`.
    pub cert_file: Option<String>,
    /// PEM file of the client certificate's private key.
    pub key_file: Option<String>,
    /// Accept any server certificate, for any name. Insecure: anyone on the path can read
    /// and change the traffic.
    pub insecure_skip_verify: bool,
    ca_pem: Option<Vec<u8>>,
    cert_pem: Option<Vec<u8>>,
    /// Secret: never printed.
    key_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("insecure_skip_verify", &self.insecure_skip_verify)
            .finish()
    }
}

const FIELDS: &[&str] = &["ca_file", "cert_file", "key_file", "insecure_skip_verify"];

impl TlsConfig {
    /// Parses the `tls` object at `field` (e.g. `shards[1].tls`) and reads its files.
    pub(crate) fn from_json(field: &str, v: &Value) -> Result<TlsConfig> {
        let obj = v.as_object().ok_or_else(|| {
            Error::config(
                field,
                format!(
                    "expected {{\"ca_file\", \"cert_file\", \"key_file\", \"insecure_skip_verify\"}}, got {v}"
                ),
            )
        })?;
        for k in obj.keys() {
            if !FIELDS.contains(&k.as_str()) {
                return Err(Error::config(
                    format!("{field}.{k}"),
                    format!("unknown field; expected one of: {}", FIELDS.join(", ")),
                ));
            }
        }
        if !cfg!(feature = "tls") {
            return Err(Error::config(
                field,
                "this build has no TLS support (the `tls` feature is off)",
            ));
        }
        let path = |k: &str| -> Result<Option<String>> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
                Some(other) => Err(Error::config(
                    format!("{field}.{k}"),
                    format!("expected a file path, got {other}"),
                )),
            }
        };
        let mut tls = TlsConfig {
            ca_file: path("ca_file")?,
            cert_file: path("cert_file")?,
            key_file: path("key_file")?,
            ..TlsConfig::default()
        };
        match obj.get("insecure_skip_verify") {
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => tls.insecure_skip_verify = *b,
            Some(other) => {
                return Err(Error::config(
                    format!("{field}.insecure_skip_verify"),
                    format!("expected true or false, got {other}"),
                ))
            }
        }
        match (&tls.cert_file, &tls.key_file) {
            (Some(_), None) => {
                return Err(Error::config(
                    format!("{field}.cert_file"),
                    "needs key_file (the client certificate's private key)",
                ))
            }
            (None, Some(_)) => {
                return Err(Error::config(
                    format!("{field}.key_file"),
                    "needs cert_file (the client certificate it belongs to)",
                ))
            }
            _ => {}
        }
        let read = |k: &str, p: &Option<String>| -> Result<Option<Vec<u8>>> {
            p.as_ref()
                .map(|p| {
                    std::fs::read(p).map_err(|e| {
                        Error::config(format!("{field}.{k}"), format!("cannot read {p:?}: {e}"))
                    })
                })
                .transpose()
        };
        tls.ca_pem = read("ca_file", &tls.ca_file)?;
        tls.cert_pem = read("cert_file", &tls.cert_file)?;
        tls.key_pem = read("key_file", &tls.key_file)?;
        #[cfg(feature = "tls")]
        tls.check_pem(field)?;
        Ok(tls)
    }

    /// Checks that the files hold what they should: CA certificates rustls accepts as
    /// trust anchors, a certificate chain, and a private key that belongs to it.
    #[cfg(feature = "tls")]
    fn check_pem(&self, field: &str) -> Result<()> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = |k: &str, path: &Option<String>, pem: &[u8]| {
            let bad = |m: String| Error::config(format!("{field}.{k}"), format!("{path:?}: {m}"));
            let list = CertificateDer::pem_slice_iter(pem)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| bad(format!("not a PEM certificate file: {e}")))?;
            if list.is_empty() {
                return Err(bad("holds no PEM certificate".to_string()));
            }
            Ok(list)
        };
        if let Some(pem) = &self.ca_pem {
            let mut roots = rustls::RootCertStore::empty();
            for c in certs("ca_file", &self.ca_file, pem)? {
                roots.add(c).map_err(|e| {
                    Error::config(
                        format!("{field}.ca_file"),
                        format!(
                            "{:?}: not a usable CA certificate: {e}",
                            self.ca_file.as_deref().unwrap_or_default()
                        ),
                    )
                })?;
            }
        }
        if let (Some(cert), Some(key)) = (&self.cert_pem, &self.key_pem) {
            let chain = certs("cert_file", &self.cert_file, cert)?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| {
                Error::config(
                    format!("{field}.key_file"),
                    format!(
                        "{:?}: no PEM private key: {e}",
                        self.key_file.as_deref().unwrap_or_default()
                    ),
                )
            })?;
            // the same checks rustls makes when it connects: a supported key that matches
            // the certificate
            rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .and_then(|b| {
                    b.with_root_certificates(rustls::RootCertStore::empty())
                        .with_client_auth_cert(chain, key)
                })
                .map_err(|e| {
                    Error::config(
                        format!("{field}.key_file"),
                        format!(
                            "the private key {:?} does not fit the certificate {:?} (it is another certificate's key; give the key the certificate was issued for): {e}",
                            self.key_file.as_deref().unwrap_or_default(),
                            self.cert_file.as_deref().unwrap_or_default()
                        ),
                    )
                })?;
        }
        Ok(())
    }

    /// What `config validate` prints for a connection with these settings.
    pub fn describe(&self) -> String {
        let mut s = if self.insecure_skip_verify {
            "TLS, INSECURE: the server certificate is not verified (insecure_skip_verify)"
                .to_string()
        } else if let Some(ca) = &self.ca_file {
            format!("TLS, verified against ca_file {ca:?}")
        } else {
            "TLS, verified against the built-in roots (webpki-roots)".to_string()
        };
        if let Some(c) = &self.cert_file {
            s.push_str(&format!(", client certificate {c:?}"));
        }
        s
    }

    /// The CA and client certificate for the redis crate; `None` when neither is set.
    #[cfg(feature = "tls")]
    pub(crate) fn certificates(&self) -> Option<redis::TlsCertificates> {
        let client_tls = match (&self.cert_pem, &self.key_pem) {
            (Some(c), Some(k)) => Some(redis::ClientTlsConfig {
                client_cert: c.clone(),
                client_key: k.clone(),
            }),
            _ => None,
        };
        if client_tls.is_none() && self.ca_pem.is_none() {
            return None;
        }
        Some(redis::TlsCertificates {
            client_tls,
            root_cert: self.ca_pem.clone(),
        })
    }

    /// The redis crate's mode for these settings.
    #[cfg(feature = "tls")]
    pub(crate) fn mode(&self) -> redis::TlsMode {
        if self.insecure_skip_verify {
            redis::TlsMode::Insecure
        } else {
            redis::TlsMode::Secure
        }
    }
}

/// How the core's own connections to a `rediss://` shard speak TLS: the rustls client
/// settings built from the shard's `tls` object once, and the name the server's
/// certificate must hold (sent as SNI). The same settings the redis crate used for these
/// shards before: the CAs of `ca_file` only, or else webpki-roots; the client certificate
/// when set; `insecure_skip_verify` verifies nothing and sends no SNI (as the redis crate's
/// insecure mode); the process's crypto provider ([`ensure_crypto_provider`]).
#[cfg(feature = "tls")]
#[derive(Clone)]
pub(crate) struct TlsConnect {
    config: std::sync::Arc<rustls::ClientConfig>,
    name: rustls::pki_types::ServerName<'static>,
}

#[cfg(feature = "tls")]
impl std::fmt::Debug for TlsConnect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnect")
            .field("name", &self.name)
            .finish()
    }
}

#[cfg(feature = "tls")]
impl TlsConnect {
    /// The settings for a connection to `host` with `tls` (`None`: verified against the
    /// built-in roots); `insecure` also when the URL asked for it. `Err` says what is wrong.
    pub(crate) fn new(
        host: &str,
        tls: Option<&TlsConfig>,
        insecure: bool,
    ) -> std::result::Result<TlsConnect, String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
        ensure_crypto_provider();
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(provider);
        let none = TlsConfig::default();
        let t = tls.unwrap_or(&none);
        let insecure = insecure || t.insecure_skip_verify;
        let mut roots = rustls::RootCertStore::empty();
        match &t.ca_pem {
            Some(pem) => {
                for c in CertificateDer::pem_slice_iter(pem) {
                    let c = c.map_err(|e| format!("ca_file {:?}: {e}", t.ca_file))?;
                    roots
                        .add(c)
                        .map_err(|e| format!("ca_file {:?}: {e}", t.ca_file))?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("the crypto provider: {e}"))?
            .with_root_certificates(roots);
        let mut config = match (&t.cert_pem, &t.key_pem) {
            (Some(cert), Some(key)) => {
                let (cert_file, key_file) = (
                    t.cert_file.as_deref().unwrap_or_default(),
                    t.key_file.as_deref().unwrap_or_default(),
                );
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| format!("cert_file {cert_file:?}: {e}"))?;
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|e| format!("key_file {key_file:?}: no PEM private key: {e}"))?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    format!(
                        "the private key {key_file:?} does not fit the certificate {cert_file:?}: {e}"
                    )
                })?
            }
            _ => builder.with_no_client_auth(),
        };
        if insecure {
            config.enable_sni = false;
            config
                .dangerous()
                .set_certificate_verifier(std::sync::Arc::new(NoVerification(
                    provider.signature_verification_algorithms,
                )));
        }
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| format!("{host:?} is not a host name TLS can verify: {e}"))?;
        Ok(TlsConnect {
            config: std::sync::Arc::new(config),
            name,
        })
    }

    /// The TLS handshake over `tcp` (the caller bounds it in time). Its error says what
    /// failed (rustls' name for it, which [`crate::Error`] explains).
    pub(crate) async fn handshake(
        &self,
        tcp: tokio::net::TcpStream,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        tokio_rustls::TlsConnector::from(std::sync::Arc::clone(&self.config))
            .connect(self.name.clone(), tcp)
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("TLS handshake failed: {e}")))
    }
}

/// `insecure_skip_verify`: any certificate for any name, no signature checked (the redis
/// crate's insecure mode did the same).
#[cfg(feature = "tls")]
#[derive(Debug)]
struct NoVerification(rustls::crypto::WebPkiSupportedAlgorithms);

#[cfg(feature = "tls")]
impl rustls::client::danger::ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// What `config validate` prints for a connection with `tls` (the effective settings) that
/// is or is not encrypted.
pub fn describe(encrypted: bool, tls: Option<&TlsConfig>) -> String {
    match (encrypted, tls) {
        (false, _) => "plain TCP (no TLS)".to_string(),
        (true, Some(t)) => t.describe(),
        (true, None) => TlsConfig::default().describe(),
    }
}

/// The crypto provider: ring, chosen in `Cargo.toml` (it builds with a plain C compiler).
#[cfg(feature = "tls")]
fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes sure rustls has a process-level crypto provider before the redis crate builds a
/// TLS client config (it calls `rustls::ClientConfig::builder()`, which uses that default and
/// panics when there is none and the crate features do not name exactly one: in a program
/// whose other dependencies also enable aws-lc-rs, say). A provider the host application
/// installed is kept and used; otherwise ring is installed. The redis crate offers no way to
/// hand it a provider or a `ClientConfig` of our own, so this is the one process-wide effect
/// of the `tls` feature. A host that wants another provider installs it before the first
/// TLS connection. Cheap after the first call (one atomic load).
#[cfg(feature = "tls")]
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err: another thread installed one first, which is as good
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
