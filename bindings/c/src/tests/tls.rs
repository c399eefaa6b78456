//! Decisions over TLS with client certificates, against a real redis-server.

use super::*;

/// A real redis-server that also listens for TLS and requires a client certificate, with a
/// CA made for the test by tests/tls/gen-certs.sh; stopped when dropped.
struct TlsRedis {
    child: std::process::Child,
    tls_port: u16,
    certs: tempfile::TempDir,
}

impl TlsRedis {
    fn start() -> TlsRedis {
        use std::process::{Command, Stdio};
        let free = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let certs = tempfile::tempdir().unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/tls/gen-certs.sh");
        let st = Command::new("sh")
            .arg(script)
            .arg(certs.path())
            .status()
            .unwrap();
        assert!(st.success(), "gen-certs.sh failed");
        let (port, tls_port) = (free(), free());
        let path = |n: &str| certs.path().join(n);
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(certs.path())
            .args([
                "--tls-port",
                &tls_port.to_string(),
                "--tls-auth-clients",
                "yes",
            ])
            .arg("--tls-cert-file")
            .arg(path("server.crt"))
            .arg("--tls-key-file")
            .arg(path("server.key"))
            .arg("--tls-ca-cert-file")
            .arg(path("ca.crt"))
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let server = TlsRedis {
            child,
            tls_port,
            certs,
        };
        // readiness, not a race: the TLS port accepts connections, for at most 10 s
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", tls_port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        server
    }

    fn config(&self, tls: &str) -> String {
        format!(
            r#"{{"timeout_ms": 2000,
                "shards": [{{"name": "s0", "url": "rediss://127.0.0.1:{}", "tls": {tls}}}],
                "policies": {{
                  "strict": {{"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "error"}},
                  "closed": {{"algorithm": "fixed_window", "limit": 5, "window": "1h", "on_error": "closed"}}}}}}"#,
            self.tls_port
        )
    }

    fn path(&self, name: &str) -> String {
        self.certs.path().join(name).display().to_string()
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn decisions_over_tls_with_mtls() {
    let redis = TlsRedis::start();
    let verified = redis.config(&format!(
        r#"{{"ca_file": "{}", "cert_file": "{}", "key_file": "{}"}}"#,
        redis.path("ca.crt"),
        redis.path("client.crt"),
        redis.path("client.key")
    ));
    let lim = limiter(&verified);
    let d = check_named(lim, "tls-user", "strict").unwrap();
    assert!(d.allowed);
    assert_eq!(d.source, SHARDLIMIT_SOURCE_REDIS as u32);
    assert_eq!(d.remaining, 4);
    unsafe { shardlimit_limiter_free(lim) };
    // a wrong CA, and no client certificate: SHARDLIMIT_ERR_CONNECTION, and on_error decides
    for tls in [
        format!(r#"{{"ca_file": "{}"}}"#, redis.path("other-ca.crt")),
        format!(r#"{{"ca_file": "{}"}}"#, redis.path("ca.crt")),
    ] {
        let lim = limiter(&redis.config(&tls));
        let (code, msg) = check_named(lim, "k", "strict").unwrap_err();
        assert_eq!(code, SHARDLIMIT_ERR_CONNECTION, "{msg}");
        assert!(msg.contains("shard `s0`"), "{msg}");
        let d = check_named(lim, "k", "closed").unwrap();
        assert!(!d.allowed);
        assert_eq!(d.source, SHARDLIMIT_SOURCE_FALLBACK as u32);
        unsafe { shardlimit_limiter_free(lim) };
    }
    // a bad tls field is a config error naming it, through the ABI
    let bad = redis.config(r#"{"ca_file": "/nonexistent/ca.pem"}"#);
    let (mut lim, mut e) = (null_mut(), null_mut());
    let r = unsafe {
        shardlimit_limiter_new_json(bad.as_ptr().cast(), bad.len(), null(), &mut lim, &mut e)
    };
    assert_eq!(r, SHARDLIMIT_ERR_CONFIG);
    assert!(lim.is_null());
    let (_, msg) = take_err(e);
    assert!(
        msg.contains(r#"shards[0].tls.ca_file: cannot read "/nonexistent/ca.pem""#),
        "{msg}"
    );
}
