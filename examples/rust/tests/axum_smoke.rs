//! Smoke test of `shardlimit-example-axum`: the real binary, a real `redis-server` started
//! here on a free loopback port, and plain HTTP/1.1 requests over loopback.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One RESP command over a fresh connection; returns the raw reply.
fn redis_cmd(port: u16, args: &[&str]) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req += &format!("${}\r\n{a}\r\n", a.len());
    }
    s.write_all(req.as_bytes())?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    Ok(line)
}

fn start_redis(dir: &std::path::Path) -> (Proc, u16) {
    let port = free_port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server must be installed (scripts/test.sh installs it)");
    let proc = Proc(child);
    // bounded wait for the server to accept connections
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis_cmd(port, &["PING"])
        .map(|r| r.trim() != "+PONG")
        .unwrap_or(true)
    {
        assert!(
            Instant::now() < deadline,
            "redis-server did not start on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (proc, port)
}

struct HttpResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl HttpResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A minimal HTTP/1.1 client: one GET per connection, `Connection: close`.
fn get(port: u16, path: &str) -> HttpResponse {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .expect("a complete HTTP response");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    HttpResponse {
        status,
        headers,
        body: body.to_string(),
    }
}

#[test]
fn axum_example_on_redis_answers_200s_then_429s_with_headers_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let (_redis, redis_port) = start_redis(dir.path());
    // sliding_log is exact and has no window boundary for the test to straddle; the test
    // takes far less than the hour. on_error=closed: were Redis not answering, the first
    // request would already be denied.
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"timeout_ms": 2000,
                 "shards": [{{"name": "s0", "url": "redis://127.0.0.1:{redis_port}"}}],
                 "policies": {{"api": {{"algorithm": "sliding_log", "limit": 5, "window": "1h",
                                        "on_error": "closed"}}}}}}"#
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardlimit-example-axum"))
        .arg(&config)
        .args(["--port", "0", "--policy", "api"])
        .env_remove("SHARDLIMIT_CONFIG")
        .env_remove("PORT")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _service = Proc(child);
    // the service prints its address once it is listening (EOF if it exits instead)
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    assert!(line.contains("engine=redis"), "{line}");
    let port: u16 = line
        .split("http://127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));

    // unlimited route: no rate-limit headers, never denied
    let h = get(port, "/health");
    assert_eq!(h.status, 200);
    assert_eq!(h.header("x-ratelimit-limit"), None);

    for remaining in (0..5).rev() {
        let r = get(
            port,
            if remaining % 2 == 0 {
                "/"
            } else {
                "/hello/ada"
            },
        );
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.header("x-ratelimit-limit"), Some("5"));
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some(remaining.to_string().as_str())
        );
        assert_eq!(r.header("ratelimit-policy"), Some("\"api\";q=5;w=3600"));
        assert!(r
            .header("ratelimit")
            .unwrap()
            .starts_with(&format!("\"api\";r={remaining};t=")));
        assert_eq!(r.header("retry-after"), None);
    }
    assert_eq!(get(port, "/health").status, 200, "/health is never limited");

    for _ in 0..2 {
        let r = get(port, "/");
        assert_eq!(r.status, 429);
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
        let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!((3590..=3600).contains(&retry), "Retry-After {retry}");
        let b: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(b["error"], "rate_limited");
        assert_eq!(b["policy"], "api");
        assert_eq!(b["limit"], 5);
        assert_eq!(b["remaining"], 0);
        assert_eq!(b["retry_after"], retry);
        assert!(b["message"]
            .as_str()
            .unwrap()
            .contains("Rate limit exceeded"));
    }
    // the decisions were Redis's: the limiter's keys are on the server
    let keys = redis_cmd(redis_port, &["DBSIZE"]).unwrap();
    let n: u64 = keys.trim().trim_start_matches(':').parse().unwrap();
    assert!(n >= 1, "DBSIZE {keys:?}");
}
