//! TLS to real `redis-server --tls-port` processes, with a CA generated for each test
//! (`tests/tls/gen-certs.sh`): verified by default, wrong CA and wrong name rejected, mTLS,
//! the insecure opt-out, and every rejection a `connection` error that follows `on_error`.

#![cfg(feature = "tls")]

mod support;

use shardlimit::{Config, ErrorKind, Limiter, Source};
use support::{RedisServer, TestCerts};

const DEFAULT_SAN: &str = "DNS:localhost,IP:127.0.0.1";

/// Three policies over one rediss:// shard: `strict` returns backend errors, `open` and
/// `closed` fall back. `tls` is the shard's `tls` object (JSON), or "" for none.
fn config(server: &RedisServer, tls: &str) -> String {
    let tls = if tls.is_empty() {
        String::new()
    } else {
        format!(r#", "tls": {tls}"#)
    };
    format!(
        r#"{{"timeout_ms": 2000,
            "shards": [{{"name": "s0", "url": "{}"{tls}}}],
            "policies": {{
              "strict": {{"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "error"}},
              "open": {{"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "open"}},
              "closed": {{"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "closed"}}
            }}}}"#,
        server.tls_url("127.0.0.1")
    )
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Decides on Redis over TLS, on the blocking and the async path.
fn assert_decides_on_redis(limiter: &Limiter, server: &RedisServer) {
    let d = limiter
        .check_by_name_blocking("user:1", "strict", 1)
        .unwrap();
    assert!(d.allowed);
    assert_eq!(d.source, Source::Redis);
    assert_eq!(d.remaining, 4);
    let d = rt()
        .block_on(limiter.check_by_name("user:1", "strict", 1))
        .unwrap();
    assert_eq!((d.source, d.remaining), (Source::Redis, 3));
    // the state is in that server (read back over its plain port)
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*user:1*")
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
}

/// The connection is refused: a `connection` error whose message contains `why`, and
/// `on_error` decides for the policies that fall back, on both paths.
fn assert_rejected(limiter: &Limiter, why: &str) {
    let e = limiter
        .check_by_name_blocking("user:1", "strict", 1)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    assert!(e.to_string().contains(why), "expected {why:?} in: {e}");
    let e = rt()
        .block_on(limiter.check_by_name("user:1", "strict", 1))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    let d = limiter.check_by_name_blocking("user:1", "open", 1).unwrap();
    assert!(d.allowed);
    assert_eq!(d.source, Source::Fallback);
    let d = rt()
        .block_on(limiter.check_by_name("user:1", "closed", 1))
        .unwrap();
    assert!(!d.allowed);
    assert_eq!(d.source, Source::Fallback);
}

#[test]
fn verified_against_the_configured_ca() {
    let certs = TestCerts::generate(DEFAULT_SAN);
    let server = RedisServer::start_tls(&certs, false);
    let cfg = config(
        &server,
        &format!(r#"{{"ca_file": "{}"}}"#, certs.path("ca.crt")),
    );
    let limiter = Limiter::from_json(&cfg).unwrap();
    assert_decides_on_redis(&limiter, &server);
}

#[test]
fn the_top_level_tls_is_the_default_of_every_shard() {
    let certs = TestCerts::generate(DEFAULT_SAN);
    let server = RedisServer::start_tls(&certs, false);
    let cfg = config(&server, "").replacen(
        "{",
        &format!(r#"{{"tls": {{"ca_file": "{}"}},"#, certs.path("ca.crt")),
        1,
    );
    let parsed = Config::from_json(&cfg).unwrap();
    let shard = &parsed.shards.as_ref().unwrap()[0];
    assert!(
        shard.tls_mode().contains("verified against ca_file"),
        "{}",
        shard.tls_mode()
    );
    let limiter = Limiter::new(parsed).unwrap();
    assert_decides_on_redis(&limiter, &server);
}

#[test]
fn verification_is_on_by_default() {
    // no `tls` object: the built-in roots, which do not include the test CA
    let certs = TestCerts::generate(DEFAULT_SAN);
    let server = RedisServer::start_tls(&certs, false);
    let limiter = Limiter::from_json(&config(&server, "")).unwrap();
    assert_rejected(&limiter, "UnknownIssuer");
}

#[test]
fn a_wrong_ca_is_rejected() {
    let certs = TestCerts::generate(DEFAULT_SAN);
    let server = RedisServer::start_tls(&certs, false);
    let cfg = config(
        &server,
        &format!(r#"{{"ca_file": "{}"}}"#, certs.path("other-ca.crt")),
    );
    let limiter = Limiter::from_json(&cfg).unwrap();
    assert_rejected(&limiter, "UnknownIssuer");
}

/// OpenSSL's default self-signed certificate (`openssl req -x509`) is a CA certificate:
/// used as the server's own, TLS refuses it as `CaUsedAsEndEntity`. The error says what
/// that means and what to do.
#[test]
fn a_ca_certificate_as_the_server_certificate_is_explained() {
    let certs = TestCerts::generate(DEFAULT_SAN);
    let server = RedisServer::start_tls_with(
        &certs,
        false,
        &[
            "--tls-cert-file",
            &certs.path("ca.crt"),
            "--tls-key-file",
            &certs.path("ca.key"),
        ],
    );
    let cfg = config(
        &server,
        &format!(r#"{{"ca_file": "{}"}}"#, certs.path("ca.crt")),
    );
    let limiter = Limiter::from_json(&cfg).unwrap();
    let e = limiter
        .check_by_name_blocking("user:1", "strict", 1)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    let e = e.to_string();
    assert!(
        e.contains("CaUsedAsEndEntity")
            && e.contains("a CA certificate")
            && e.contains("openssl req -x509")
            && e.contains("leaf"),
        "{e}"
    );
}

#[test]
fn a_wrong_hostname_is_rejected() {
    // signed by the trusted CA, but for another name than the 127.0.0.1 of the URL
    let certs = TestCerts::generate("DNS:localhost");
    let server = RedisServer::start_tls(&certs, false);
    let cfg = config(
        &server,
        &format!(r#"{{"ca_file": "{}"}}"#, certs.path("ca.crt")),
    );
    let limiter = Limiter::from_json(&cfg).unwrap();
    assert_rejected(&limiter, "not valid for name");
}

#[test]
fn mtls_required_and_given() {
    let certs = TestCerts::generate(DEFAULT_SAN);
    let server = RedisServer::start_tls(&certs, true);
    let cfg = config(
        &server,
        &format!(
            r#"{{"ca_file": "{}", "cert_file": "{}", "key_file": "{}"}}"#,
            certs.path("ca.crt"),
            certs.path("client.crt"),
            certs.path("client.key")
        ),
    );
    let limiter = Limiter::from_json(&cfg).unwrap();
    assert_decides_on_redis(&limiter, &server);
}

#[test]
fn mtls_required_and_missing_is_rejected() {
    let certs = TestCerts::generate(DEFAULT_SAN);
    let server = RedisServer::start_tls(&certs, true);
    let cfg = config(
        &server,
        &format!(r#"{{"ca_file": "{}"}}"#, certs.path("ca.crt")),
    );
    let limiter = Limiter::from_json(&cfg).unwrap();
    // TLS 1.3: the server refuses after the client's part of the handshake, with an alert
    assert_rejected(&limiter, "CertificateRequired");
}

#[test]
fn insecure_skip_verify_accepts_a_wrong_ca_and_says_so() {
    let certs = TestCerts::generate("DNS:redis.invalid");
    let server = RedisServer::start_tls(&certs, false);
    let cfg = config(
        &server,
        &format!(
            r#"{{"ca_file": "{}", "insecure_skip_verify": true}}"#,
            certs.path("other-ca.crt")
        ),
    );
    let parsed = Config::from_json(&cfg).unwrap();
    let mode = parsed.shards.as_ref().unwrap()[0].tls_mode();
    assert!(mode.contains("INSECURE"), "{mode}");
    let limiter = Limiter::new(parsed).unwrap();
    assert_decides_on_redis(&limiter, &server);
}

#[test]
fn config_errors_name_the_tls_field() {
    let certs = TestCerts::generate(DEFAULT_SAN);
    let err = |tls: &str, url: &str| {
        let cfg = format!(
            r#"{{"shards": [{{"name": "a", "url": "redis://127.0.0.1:1"}},
                            {{"name": "b", "url": "{url}", "tls": {tls}}}]}}"#
        );
        Config::from_json(&cfg).unwrap_err().to_string()
    };
    let tls_url = "rediss://127.0.0.1:1";
    let e = err(r#"{"ca_file": "/nonexistent/ca.pem"}"#, tls_url);
    assert!(
        e.starts_with(r#"shards[1].tls.ca_file: cannot read "/nonexistent/ca.pem": No such file"#),
        "{e}"
    );
    let e = err(r#"{"verify": false}"#, tls_url);
    assert!(e.starts_with("shards[1].tls.verify: unknown field"), "{e}");
    let e = err(
        &format!(r#"{{"cert_file": "{}"}}"#, certs.path("client.crt")),
        tls_url,
    );
    assert!(
        e.starts_with("shards[1].tls.cert_file: needs key_file"),
        "{e}"
    );
    let e = err(
        &format!(r#"{{"key_file": "{}"}}"#, certs.path("client.key")),
        tls_url,
    );
    assert!(
        e.starts_with("shards[1].tls.key_file: needs cert_file"),
        "{e}"
    );
    let e = err(r#"{"insecure_skip_verify": "yes"}"#, tls_url);
    assert!(
        e.starts_with("shards[1].tls.insecure_skip_verify: expected true or false"),
        "{e}"
    );
    // a key file that is not a key, and a key that does not belong to the certificate
    let e = err(
        &format!(
            r#"{{"cert_file": "{}", "key_file": "{}"}}"#,
            certs.path("client.crt"),
            certs.path("client.crt")
        ),
        tls_url,
    );
    assert!(e.starts_with("shards[1].tls.key_file: "), "{e}");
    let e = err(
        &format!(
            r#"{{"cert_file": "{}", "key_file": "{}"}}"#,
            certs.path("client.crt"),
            certs.path("server.key")
        ),
        tls_url,
    );
    assert!(e.starts_with("shards[1].tls.key_file: "), "{e}");
    assert!(e.contains("does not fit"), "{e}");
    assert!(!e.contains("PRIVATE KEY"), "{e}");
    assert!(!e.contains("Some("), "{e}");
    // a CA file that holds no certificate
    let e = err(
        &format!(r#"{{"ca_file": "{}"}}"#, certs.path("client.key")),
        tls_url,
    );
    assert!(
        e.starts_with("shards[1].tls.ca_file: ") && e.contains("no PEM certificate"),
        "{e}"
    );
    // `tls` on a plain shard would silently not be used
    let e = err("{}", "redis://127.0.0.1:1");
    assert!(e.starts_with("shards[1].tls: the URL is redis://"), "{e}");
    // the insecure opt-out is only the named field, never a URL fragment
    let cfg = r#"{"shards": [{"name": "a", "url": "rediss://127.0.0.1:1/#insecure"}]}"#;
    let e = Config::from_json(cfg).unwrap_err().to_string();
    assert!(
        e.starts_with("shards[0].url: ") && e.contains("insecure_skip_verify"),
        "{e}"
    );
    let cfg = r#"{"shards": [{"name": "a", "url": "rediss://127.0.0.1:1", "sentinel_tls": {}}]}"#;
    let e = Config::from_json(cfg).unwrap_err().to_string();
    assert!(e.starts_with("shards[0].sentinel_tls: "), "{e}");
    let e = Config::from_json(r#"{"tls": {"ca": "x"}}"#)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("tls.ca: unknown field"), "{e}");
    let cfg = r#"{"cluster": {"nodes": ["redis://127.0.0.1:1"], "tls": {}}}"#;
    let e = Config::from_json(cfg).unwrap_err().to_string();
    assert!(e.starts_with("cluster.tls: the nodes are redis://"), "{e}");
    let cfg = r#"{"cluster": {"nodes": ["rediss://127.0.0.1:1", "redis://127.0.0.1:2"]}}"#;
    let e = Config::from_json(cfg).unwrap_err().to_string();
    assert!(e.starts_with("cluster.nodes[1]: every node"), "{e}");
}

#[test]
fn validate_describes_each_connection() {
    let certs = TestCerts::generate(DEFAULT_SAN);
    let cfg = format!(
        r#"{{"tls": {{"ca_file": "{ca}"}},
            "shards": [
              {{"name": "plain", "url": "redis://127.0.0.1:1"}},
              {{"name": "default", "url": "rediss://127.0.0.1:2"}},
              {{"name": "mtls", "url": "rediss://127.0.0.1:3",
                "tls": {{"cert_file": "{crt}", "key_file": "{key}"}}}},
              {{"name": "ha", "sentinel": {{"nodes": ["127.0.0.1:4"], "master": "m"}},
                "sentinel_tls": {{"insecure_skip_verify": true}}}}
            ]}}"#,
        ca = certs.path("ca.crt"),
        crt = certs.path("client.crt"),
        key = certs.path("client.key"),
    );
    let cfg = Config::from_json(&cfg).unwrap();
    let modes: Vec<String> = cfg
        .shards
        .as_ref()
        .unwrap()
        .iter()
        .map(|s| s.tls_mode())
        .collect();
    assert_eq!(modes[0], "plain TCP (no TLS)");
    assert!(
        modes[1].starts_with("TLS, verified against ca_file"),
        "{}",
        modes[1]
    );
    // a shard's own `tls` replaces the top-level one as a whole
    assert!(
        modes[2].starts_with("TLS, verified against the built-in roots")
            && modes[2].contains("client certificate"),
        "{}",
        modes[2]
    );
    assert!(
        modes[3].starts_with("primary: TLS, verified against ca_file")
            && modes[3].contains("sentinels: TLS, INSECURE"),
        "{}",
        modes[3]
    );
    // the key's contents never show in Debug output
    let shown = format!("{cfg:?}");
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    assert!(shown.contains("client.key"), "{shown}");
}

/// A Sentinel that listens on a plain port (for the test's readiness check) and on a TLS
/// port, and watches the primary on its TLS port (`tls-replication yes`).
struct TlsSentinel {
    child: std::process::Child,
    tls_port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for TlsSentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tls_sentinel(certs: &TestCerts, primary_tls_port: u16) -> TlsSentinel {
    let dir = tempfile::tempdir().unwrap();
    let (port, tls_port) = (support::free_port(), support::free_port());
    let conf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\ntls-port {tls_port}\n\
             tls-cert-file {crt}\ntls-key-file {key}\ntls-ca-cert-file {ca}\n\
             tls-auth-clients no\ntls-replication yes\n\
             sentinel monitor mymaster 127.0.0.1 {primary_tls_port} 1\n",
            dir = dir.path().display(),
            crt = certs.path("server.crt"),
            key = certs.path("server.key"),
            ca = certs.path("ca.crt"),
        ),
    )
    .unwrap();
    let child = std::process::Command::new("redis-server")
        .arg(&conf)
        .arg("--sentinel")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server --sentinel");
    let sentinel = TlsSentinel {
        child,
        tls_port,
        _dir: dir,
    };
    // readiness, not a race: it answers PING on its plain port (every listener is bound)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let pong = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .and_then(|c| c.get_connection())
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
        if pong.is_ok() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "sentinel did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    sentinel
}

#[test]
fn sentinel_over_tls_to_the_sentinels_and_the_primary() {
    let certs = TestCerts::generate(DEFAULT_SAN);
    let primary = RedisServer::start_tls(&certs, false);
    let sentinel = tls_sentinel(&certs, primary.tls_port.unwrap());
    let cfg = |primary_ca: &str, sentinel_ca: &str| {
        format!(
            r#"{{"timeout_ms": 2000,
                "shards": [{{"name": "ha",
                  "sentinel": {{"nodes": ["127.0.0.1:{}"], "master": "mymaster"}},
                  "tls": {{"ca_file": "{}"}}, "sentinel_tls": {{"ca_file": "{}"}}}}],
                "policies": {{
                  "strict": {{"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "error"}},
                  "open": {{"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "open"}},
                  "closed": {{"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "closed"}}}}}}"#,
            sentinel.tls_port,
            certs.path(primary_ca),
            certs.path(sentinel_ca)
        )
    };
    let parsed = Config::from_json(&cfg("ca.crt", "ca.crt")).unwrap();
    let mode = parsed.shards.as_ref().unwrap()[0].tls_mode();
    assert!(
        mode.starts_with("primary: TLS, verified") && mode.contains("sentinels: TLS, verified"),
        "{mode}"
    );
    let limiter = Limiter::new(parsed).unwrap();
    assert_decides_on_redis(&limiter, &primary);
    // either side untrusted: a connection error that follows on_error
    for (p, s) in [("other-ca.crt", "ca.crt"), ("ca.crt", "other-ca.crt")] {
        let limiter = Limiter::from_json(&cfg(p, s)).unwrap();
        assert_rejected(&limiter, "UnknownIssuer");
    }
}

#[test]
fn cluster_over_tls() {
    // a one-node cluster holding every slot; `tls-cluster yes` makes it announce its TLS
    // port in CLUSTER SLOTS, which the cluster client follows
    let certs = TestCerts::generate(DEFAULT_SAN);
    let node = RedisServer::start_tls_with(
        &certs,
        true,
        &[
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--tls-cluster",
            "yes",
        ],
    );
    redis::cmd("CLUSTER")
        .arg("ADDSLOTSRANGE")
        .arg(0)
        .arg(16383)
        .exec(&mut node.conn())
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut node.conn())
            .unwrap();
        if info.contains("cluster_state:ok") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "cluster not ok: {info}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let cfg = |tls: &str| {
        format!(
            r#"{{"timeout_ms": 2000,
                "cluster": {{"nodes": ["{}"], "tls": {tls}}},
                "policies": {{
                  "strict": {{"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "error"}},
                  "open": {{"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "open"}},
                  "closed": {{"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "closed"}}}}}}"#,
            node.tls_url("127.0.0.1")
        )
    };
    let mtls = cfg(&format!(
        r#"{{"ca_file": "{}", "cert_file": "{}", "key_file": "{}"}}"#,
        certs.path("ca.crt"),
        certs.path("client.crt"),
        certs.path("client.key")
    ));
    let parsed = Config::from_json(&mtls).unwrap();
    let mode = parsed.cluster_tls_mode().unwrap();
    assert!(mode.starts_with("TLS, verified against ca_file"), "{mode}");
    let limiter = Limiter::new(parsed).unwrap();
    let d = limiter
        .check_by_name_blocking("user:1", "strict", 1)
        .unwrap();
    assert_eq!((d.allowed, d.source, d.remaining), (true, Source::Redis, 4));
    let limiter = Limiter::from_json(&cfg(&format!(
        r#"{{"ca_file": "{}"}}"#,
        certs.path("other-ca.crt")
    )))
    .unwrap();
    let e = limiter
        .check_by_name_blocking("user:1", "strict", 1)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    assert!(e.to_string().contains("UnknownIssuer"), "{e}");
    let d = limiter
        .check_by_name_blocking("user:1", "closed", 1)
        .unwrap();
    assert_eq!((d.allowed, d.source), (false, Source::Fallback));
    // the insecure opt-out: an untrusted CA, and the client certificate still sent
    let limiter = Limiter::from_json(&cfg(&format!(
        r#"{{"ca_file": "{}", "cert_file": "{}", "key_file": "{}", "insecure_skip_verify": true}}"#,
        certs.path("other-ca.crt"),
        certs.path("client.crt"),
        certs.path("client.key")
    )))
    .unwrap();
    let d = limiter
        .check_by_name_blocking("user:1", "strict", 1)
        .unwrap();
    assert_eq!((d.allowed, d.source, d.remaining), (true, Source::Redis, 3));
}

#[test]
fn an_insecure_sentinel_primary_cannot_send_a_client_certificate() {
    let certs = TestCerts::generate(DEFAULT_SAN);
    let cfg = format!(
        r#"{{"shards": [{{"name": "ha", "sentinel": {{"nodes": ["127.0.0.1:1"], "master": "m"}},
            "tls": {{"insecure_skip_verify": true, "cert_file": "{}", "key_file": "{}"}}}}]}}"#,
        certs.path("client.crt"),
        certs.path("client.key")
    );
    let e = Config::from_json(&cfg).unwrap_err().to_string();
    assert!(
        e.starts_with("shards[0].tls.cert_file: shards[0] is a Sentinel shard"),
        "{e}"
    );
    // to the Sentinels the redis crate does send it
    let cfg = cfg.replace(r#""tls""#, r#""sentinel_tls""#);
    let mode = Config::from_json(&cfg).unwrap().shards.unwrap()[0].tls_mode();
    assert!(
        mode.starts_with("primary: plain TCP") && mode.contains("sentinels: TLS, INSECURE"),
        "{mode}"
    );
}

#[test]
fn a_reload_with_new_tls_settings_reconnects() {
    let certs = TestCerts::generate(DEFAULT_SAN);
    let server = RedisServer::start_tls(&certs, false);
    let wrong = config(
        &server,
        &format!(r#"{{"ca_file": "{}"}}"#, certs.path("other-ca.crt")),
    );
    let limiter = Limiter::from_json(&wrong).unwrap();
    assert_rejected(&limiter, "UnknownIssuer");
    // same URL, another CA: the connections are made again with it
    let right = Config::from_json(&config(
        &server,
        &format!(r#"{{"ca_file": "{}"}}"#, certs.path("ca.crt")),
    ))
    .unwrap();
    limiter.reload(right).unwrap();
    assert_decides_on_redis(&limiter, &server);
}

#[test]
fn overrides_over_tls_are_exact_on_the_next_check() {
    // TLS shards take the redis crate's connection (the Cluster's call path): the script's
    // override entry comes back through its parser
    let certs = TestCerts::generate(DEFAULT_SAN);
    let server = RedisServer::start_tls(&certs, false);
    let cfg = config(
        &server,
        &format!(r#"{{"ca_file": "{}"}}"#, certs.path("ca.crt")),
    )
    .replace(
        r#""on_error": "error"}"#,
        r#""on_error": "error", "overrides": true}"#,
    );
    let (a, b) = (
        Limiter::from_json(&cfg).unwrap(),
        Limiter::from_json(&cfg).unwrap(),
    );
    assert_eq!(b.check_by_name_blocking("t", "strict", 1).unwrap().limit, 5);
    a.set_override_blocking("t", "strict", "50/hour", None)
        .unwrap();
    let d = b.check_by_name_blocking("t", "strict", 1).unwrap();
    assert_eq!((d.source, d.limit, d.remaining), (Source::Redis, 50, 48));
    let d = rt().block_on(b.check_by_name("t", "strict", 1)).unwrap();
    assert_eq!((d.limit, d.remaining), (50, 47));
    assert!(a.delete_override_blocking("t", "strict").unwrap());
    let d = rt().block_on(b.check_by_name("t", "strict", 1)).unwrap();
    assert_eq!((d.limit, d.allowed), (5, true));
}
