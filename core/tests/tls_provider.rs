//! The crypto provider a host application installed is the one TLS connections use:
//! shardlimit installs ring as rustls' process default only when there is none. Its own
//! test binary, because the process default can be set once per process.

#![cfg(feature = "tls")]

mod support;

use shardlimit::{ErrorKind, Limiter, Source};
use support::{RedisServer, TestCerts};

fn limiter(server: &RedisServer, certs: &TestCerts) -> Limiter {
    Limiter::from_json(&format!(
        r#"{{"timeout_ms": 2000,
            "shards": [{{"name": "s0", "url": "{}", "tls": {{"ca_file": "{}"}}}}],
            "policies": {{"p": {{"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "error"}}}}}}"#,
        server.tls_url("127.0.0.1"),
        certs.path("ca.crt")
    ))
    .unwrap()
}

#[test]
fn a_host_provider_is_kept_and_used() {
    // the host's choice: ring restricted to one TLS 1.3 cipher suite
    let mut host = rustls::crypto::ring::default_provider();
    host.cipher_suites
        .retain(|s| s.suite() == rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256);
    assert_eq!(host.cipher_suites.len(), 1);
    host.install_default().unwrap();

    let certs = TestCerts::generate("DNS:localhost,IP:127.0.0.1");
    let chacha = RedisServer::start_tls_with(
        &certs,
        false,
        &["--tls-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256"],
    );
    let d = limiter(&chacha, &certs)
        .check_by_name_blocking("k", "p", 1)
        .unwrap();
    assert_eq!((d.allowed, d.source), (true, Source::Redis));
    // a server without that suite: refused, which shardlimit's own ring provider (all
    // suites) would not be, so the connection used the host's provider
    let aes = RedisServer::start_tls_with(
        &certs,
        false,
        &["--tls-ciphersuites", "TLS_AES_128_GCM_SHA256"],
    );
    let e = limiter(&aes, &certs)
        .check_by_name_blocking("k", "p", 1)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    let now = rustls::crypto::CryptoProvider::get_default().unwrap();
    assert_eq!(
        now.cipher_suites.len(),
        1,
        "the host's provider was replaced"
    );
}
